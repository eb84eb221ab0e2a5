//! Commands in the guest over SSH: the harness's own key, a forwarded loopback port, no host
//! key checking (the VM is new every `up`), batch mode, and a deadline per command. Commands
//! run as root through `sudo -n`, through the [`Runner`] the caller hands in ([`Guest`] bundles
//! the two), so tests drive them with a recording fake.
//!
//! The guest commands share one connection ([`Ssh::control_path`]: OpenSSH's `ControlMaster`,
//! the first command's `ssh` stays in the background as the master for
//! [`CONTROL_PERSIST_SECS`]). Under TCG a new connection costs the guest about 1.7 s of CPU
//! (key exchange, PAM, a logind session), a shared one about 0.06 s: 25 times less, and the
//! checks' polling was most of the guest's load (measured with the guest's `/proc/stat`
//! around five `ssh … sudo -n true`). A master whose guest went away (a reboot, a snapshot
//! restored, a power cut) ends when its connection does; a command that finds it gone makes
//! a connection of its own and becomes the next master, so a reboot looks as it did before.
//! The harness still closes it before it restores a snapshot or cuts the power
//! ([`Ssh::close_shared`]), so no command waits on a connection the guest has forgotten.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flex_host::runner::{Cmd, Output, Runner};
use flex_host::secret::Secret;

/// The harness user created by the Ignition config.
pub const USER: &str = "flexadm";

/// The guest kernel's boot id file.
const BOOT_ID: &str = "cat /proc/sys/kernel/random/boot_id";

/// How long one guest command may take, unless the caller says otherwise.
pub const GUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// The shared connection's socket, beside the key in the run's work directory.
pub const CONTROL_SOCKET: &str = "ssh-mux.sock";

/// How long the shared connection outlives its last command.
pub const CONTROL_PERSIST_SECS: u32 = 120;

/// The longest control path used: a Unix socket's path holds 107 bytes, and ssh binds a
/// temporary name (the path and 17 more bytes) before it renames it into place.
const MAX_CONTROL_PATH: usize = 88;

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

    /// A forwarding `ssh`: a ControlMaster on `socket` that backgrounds itself once
    /// `bind:port` on this host forwards to the guest's `127.0.0.1:remote_port` (`-L`, exiting
    /// should the forward fail). [`Ssh::control_cmd`] checks or ends it.
    pub fn forward_cmd(&self, socket: &Path, bind: &str, port: u16, remote_port: u16) -> Cmd {
        self.base()
            .args(["-o", "ExitOnForwardFailure=yes", "-M", "-S"])
            .arg(socket.display().to_string())
            .args(["-f", "-N", "-L"])
            .arg(format!("{bind}:{port}:127.0.0.1:{remote_port}"))
            .arg(format!("{USER}@127.0.0.1"))
            .timeout(Duration::from_secs(60))
    }

    /// Starts the forward of [`Ssh::forward_cmd`] through `r` unless its ControlMaster on
    /// `socket` answers `check`; returns whether it started it (a stale socket is removed first).
    pub async fn ensure_forward(
        &self,
        r: &dyn Runner,
        socket: &Path,
        bind: &str,
        port: u16,
        remote_port: u16,
    ) -> anyhow::Result<bool> {
        if r.output(&Self::control_cmd(socket, "check"))
            .await
            .is_ok_and(|o| o.success())
        {
            return Ok(false);
        }
        let _ = std::fs::remove_file(socket);
        r.run(&self.forward_cmd(socket, bind, port, remote_port))
            .await?;
        Ok(true)
    }

    /// `ssh -O <op>` (`check`, `exit`) to the ControlMaster on `socket`.
    pub fn control_cmd(socket: &Path, op: &str) -> Cmd {
        Cmd::new("ssh")
            .arg("-S")
            .arg(socket.display().to_string())
            .args(["-O", op])
            .arg(format!("{USER}@127.0.0.1"))
            .timeout(Duration::from_secs(20))
    }

    /// The shared connection's socket ([`CONTROL_SOCKET`] beside the key), or `None` when
    /// its path is too long for a Unix socket or holds what ssh would expand (`%`) or split
    /// (white space): then every command makes its own connection.
    pub fn control_path(&self) -> Option<PathBuf> {
        let p = self.key.with_file_name(CONTROL_SOCKET);
        let s = p.to_str()?;
        (s.len() <= MAX_CONTROL_PATH && !s.contains('%') && !s.contains(char::is_whitespace))
            .then_some(p)
    }

    /// The `ssh` command for `script` run as root, over the shared connection where there is
    /// one ([`Ssh::control_path`]).
    pub fn cmd(&self, script: &str, timeout: Duration) -> Cmd {
        let mut c = self.base();
        if let Some(p) = self.control_path() {
            c = c
                .args(["-o", "ControlMaster=auto", "-o"])
                .arg(format!("ControlPath={}", p.display()))
                .arg("-o")
                .arg(format!("ControlPersist={CONTROL_PERSIST_SECS}"));
        }
        c.arg(format!("{USER}@127.0.0.1"))
            .args(["--", "sudo", "-n", "sh", "-c"])
            .arg(shell_quote(script))
            .timeout(timeout)
    }

    /// Runs `script` as root in the guest through `r`; the output whatever the exit code.
    pub async fn output(
        &self,
        r: &dyn Runner,
        script: &str,
        timeout: Duration,
    ) -> anyhow::Result<Output> {
        Ok(r.output(&self.cmd(script, timeout)).await?)
    }

    /// Runs `script` through `r`; fails unless it exits 0.
    pub async fn run(
        &self,
        r: &dyn Runner,
        script: &str,
        timeout: Duration,
    ) -> anyhow::Result<String> {
        Ok(r.run(&self.cmd(script, timeout)).await?.stdout)
    }

    /// Ends the shared connection, if one runs (`ssh -O exit`), and removes its socket: before
    /// the guest is put back to a snapshot or reset, whose TCP state would no longer match
    /// it. Best effort: a master that is already gone is what this wants.
    pub async fn close_shared(&self, r: &dyn Runner) {
        let Some(p) = self.control_path() else {
            return;
        };
        if !p.exists() {
            return;
        }
        let _ = r
            .output(
                &Cmd::new("ssh")
                    .arg("-S")
                    .arg(p.display().to_string())
                    .args(["-O", "exit"])
                    .arg(format!("{USER}@127.0.0.1"))
                    .timeout(Duration::from_secs(10)),
            )
            .await;
        let _ = std::fs::remove_file(&p);
    }
}

/// A root shell in the VM, over the harness's SSH, through a [`Runner`].
#[derive(Clone, Copy)]
pub struct Guest<'a> {
    runner: &'a dyn Runner,
    ssh: &'a Ssh,
}

impl<'a> Guest<'a> {
    /// The guest `ssh` reaches.
    pub fn new(runner: &'a dyn Runner, ssh: &'a Ssh) -> Self {
        Self { runner, ssh }
    }

    /// Runs `script`; its output whatever the exit code.
    pub async fn output(&self, script: &str, timeout: Duration) -> anyhow::Result<Output> {
        self.ssh.output(self.runner, script, timeout).await
    }

    /// Runs `script` with a deadline; its stdout (untrimmed), or an error unless it exits 0.
    pub async fn run(&self, script: &str, timeout: Duration) -> anyhow::Result<String> {
        self.ssh.run(self.runner, script, timeout).await
    }

    /// The guest kernel's boot id (`/proc/sys/kernel/random/boot_id`).
    pub async fn boot_id(&self) -> anyhow::Result<String> {
        self.sh(BOOT_ID).await
    }

    /// Waits until the guest answers with a boot id other than `old`: it went down and came
    /// back. Looks every 2 s; on timeout the error names the last answer.
    pub async fn wait_new_boot(
        &self,
        old: &str,
        timeout: Duration,
    ) -> Result<(), flex_host::retry::WaitTimeout> {
        flex_host::retry::wait_until(
            "the guest to come back from the reboot with a new boot id",
            timeout,
            Duration::from_secs(2),
            || async move {
                match self.output(BOOT_ID, Duration::from_secs(20)).await {
                    Ok(o)
                        if o.success() && !o.stdout.trim().is_empty() && o.stdout.trim() != old =>
                    {
                        Ok(())
                    }
                    Ok(o) => Err(format!("boot id {:?}", o.stdout.trim())),
                    Err(e) => Err(format!("{e:#}")),
                }
            },
        )
        .await
    }

    /// Runs `script`; its trimmed stdout, or an error unless it exits 0.
    pub async fn sh(&self, script: &str) -> anyhow::Result<String> {
        self.sh_t(script, GUEST_TIMEOUT).await
    }

    /// [`Guest::sh`] with a deadline.
    pub async fn sh_t(&self, script: &str, timeout: Duration) -> anyhow::Result<String> {
        Ok(self.run(script, timeout).await?.trim().to_string())
    }

    /// Runs `script` with `data` on its stdin (for content that must not be in an argument,
    /// such as a bootstrap.env with a token); an error unless it exits 0, with each of `hide`
    /// replaced by `***REDACTED***`.
    pub async fn sh_stdin(
        &self,
        script: &str,
        data: &Secret,
        hide: &[&str],
    ) -> anyhow::Result<String> {
        let cmd = self
            .ssh
            .cmd(script, GUEST_TIMEOUT)
            .stdin(data.expose().as_bytes().to_vec());
        match self.runner.run(&cmd).await {
            Ok(o) => Ok(o.stdout.trim().to_string()),
            Err(e) => {
                let mut text = e.to_string();
                for h in hide.iter().filter(|h| !h.is_empty()) {
                    text = text.replace(h, flex_host::runner::REDACTED);
                }
                Err(anyhow::anyhow!(text))
            }
        }
    }

    /// The SSH access.
    pub fn ssh(&self) -> &Ssh {
        self.ssh
    }

    /// The runner its commands go through.
    pub fn runner(&self) -> &'a dyn Runner {
        self.runner
    }
}

/// Quotes for the remote shell (ssh joins its arguments with spaces).
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Generates an ed25519 key pair at `path` (and `path.pub`) unless it exists, with `r`;
/// returns the public key line.
pub async fn ensure_key(r: &dyn Runner, path: &Path) -> anyhow::Result<String> {
    if !path.exists() {
        r.run(
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

    /// A work directory whose socket path would not fit, or that ssh would expand, gets no
    /// shared connection (and the plain argv).
    #[test]
    fn control_path_only_where_it_fits() {
        let ok = Ssh {
            port: 1,
            key: "/check/work/main/target/harness/id_ed25519".into(),
        };
        assert_eq!(
            ok.control_path(),
            Some(PathBuf::from(
                "/check/work/main/target/harness/ssh-mux.sock"
            ))
        );
        for key in [
            format!("/{}/id", "d".repeat(90)),
            "/w/100%/id".to_string(),
            "/w/a b/id".to_string(),
        ] {
            let s = Ssh {
                port: 1,
                key: key.clone().into(),
            };
            assert_eq!(s.control_path(), None, "{key}");
            assert!(
                !s.cmd("true", Duration::from_secs(1))
                    .display_argv()
                    .contains("ControlMaster"),
                "{key}"
            );
        }
    }

    /// Real ssh-keygen.
    #[tokio::test]
    async fn key_generation() {
        let d = tempfile::tempdir().unwrap();
        let k = d.path().join("id");
        let r = flex_host::runner::ProcessRunner::new();
        let pubkey = ensure_key(&r, &k).await.unwrap();
        assert!(pubkey.starts_with("ssh-ed25519 "), "{pubkey}");
        assert_eq!(
            ensure_key(&r, &k).await.unwrap(),
            pubkey,
            "kept, not regenerated"
        );
    }
}
