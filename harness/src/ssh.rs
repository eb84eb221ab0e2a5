//! Commands in the guest over SSH: the harness's own key, a forwarded loopback port, no host
//! key checking (the VM is new every `up`), batch mode, and a deadline per command. Commands
//! run as root through `sudo -n`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flex_host::runner::{Cmd, Output, ProcessRunner, Runner};

/// The harness user created by the Ignition config.
pub const USER: &str = "flexadm";

/// How to reach the guest.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ssh {
    /// Loopback port forwarded to the guest's port 22.
    pub port: u16,
    /// Private key.
    pub key: PathBuf,
}

impl Ssh {
    /// `ssh` with this VM's key and port and the harness's options (no host key checks, batch
    /// mode, keepalives), before the destination.
    pub fn base(&self) -> Cmd {
        Cmd::new("ssh")
            .args(["-i"])
            .arg(self.key.display().to_string())
            .args(["-p"])
            .arg(self.port.to_string())
            .args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=10",
                "-o",
                "ServerAliveInterval=5",
                "-o",
                "ServerAliveCountMax=3",
                "-o",
                "LogLevel=ERROR",
            ])
    }

    /// The `ssh` command for `script` run as root.
    pub fn cmd(&self, script: &str, timeout: Duration) -> Cmd {
        self.base()
            .arg(format!("{USER}@127.0.0.1"))
            .args(["--", "sudo", "-n", "sh", "-c"])
            .arg(shell_quote(script))
            .timeout(timeout)
    }

    /// Runs `script` as root in the guest; the output whatever the exit code.
    pub async fn output(&self, script: &str, timeout: Duration) -> anyhow::Result<Output> {
        Ok(ProcessRunner::new()
            .output(&self.cmd(script, timeout))
            .await?)
    }

    /// Runs `script`; fails unless it exits 0.
    pub async fn run(&self, script: &str, timeout: Duration) -> anyhow::Result<String> {
        Ok(ProcessRunner::new()
            .run(&self.cmd(script, timeout))
            .await?
            .stdout)
    }
}

/// Quotes for the remote shell (ssh joins its arguments with spaces).
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Generates an ed25519 key pair at `path` (and `path.pub`) unless it exists; returns the
/// public key line.
pub async fn ensure_key(path: &Path) -> anyhow::Result<String> {
    if !path.exists() {
        ProcessRunner::new()
            .run(
                &Cmd::new("ssh-keygen")
                    .args([
                        "-q",
                        "-t",
                        "ed25519",
                        "-N",
                        "",
                        "-C",
                        "aks-flex-node-harness",
                        "-f",
                    ])
                    .arg(path.display().to_string()),
            )
            .await?;
    }
    let mut pubp = path.as_os_str().to_owned();
    pubp.push(".pub");
    Ok(std::fs::read_to_string(PathBuf::from(pubp))?
        .trim()
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(shell_quote("echo 'a' b"), "'echo '\\''a'\\'' b'");
    }

    #[test]
    fn ssh_argv() {
        let s = Ssh {
            port: 2222,
            key: "/w/id".into(),
        };
        insta::assert_snapshot!(
            s.cmd("systemctl is-active x", Duration::from_secs(5))
                .display_argv()
        );
    }

    /// Real ssh-keygen.
    #[tokio::test]
    async fn key_generation() {
        let d = tempfile::tempdir().unwrap();
        let k = d.path().join("id");
        let pubkey = ensure_key(&k).await.unwrap();
        assert!(pubkey.starts_with("ssh-ed25519 "), "{pubkey}");
        assert_eq!(
            ensure_key(&k).await.unwrap(),
            pubkey,
            "kept, not regenerated"
        );
    }
}
