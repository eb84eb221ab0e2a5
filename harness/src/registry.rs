//! The local registry: Debian's `docker-registry` (distribution) on `127.0.0.1`, with the
//! harness's own config and storage, started in the background with `start-stop-daemon` (it
//! outlives `up`; `down` stops it) and reached by the guest through QEMU's user network.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flex_host::runner::{Cmd, Runner};

/// The host as QEMU's user network shows it to the guest.
pub const GUEST_HOST_ADDR: &str = "10.0.2.2";

/// A registry started by the harness.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Registry {
    /// Loopback port.
    pub port: u16,
    /// Its directory (config, data, log, pid file).
    pub dir: PathBuf,
}

impl Registry {
    /// `127.0.0.1:<port>`.
    pub fn host_addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The registry as the guest reaches it: `10.0.2.2:<port>`.
    pub fn guest_addr(&self) -> String {
        format!("{GUEST_HOST_ADDR}:{}", self.port)
    }

    fn pidfile(&self) -> PathBuf {
        self.dir.join("registry.pid")
    }

    /// The log file.
    pub fn log(&self) -> PathBuf {
        self.dir.join("registry.log")
    }
}

/// The registry's config.
pub fn render_config(data_dir: &Path, port: u16) -> String {
    format!(
        "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
        data_dir.display()
    )
}

/// A free loopback TCP port (bound and released; a race is possible but unlikely, and start
/// fails loudly if it is lost).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Starts a registry in `dir` (data starts empty) with `r` and waits until it listens.
pub async fn start(r: &dyn Runner, dir: &Path) -> anyhow::Result<Registry> {
    if r.which("docker-registry").is_none() {
        anyhow::bail!("docker-registry is not installed: apt-get install docker-registry");
    }
    std::fs::create_dir_all(dir.join("data"))?;
    let port = free_port()?;
    let reg = Registry {
        port,
        dir: dir.to_path_buf(),
    };
    let config = dir.join("config.yml");
    std::fs::write(&config, render_config(&dir.join("data"), port))?;
    r.run(
        &Cmd::new("start-stop-daemon")
            .args(["--start", "--background", "--make-pidfile", "--pidfile"])
            .arg(reg.pidfile().display().to_string())
            .arg("--output")
            .arg(reg.log().display().to_string())
            .args(["--exec", "/usr/bin/docker-registry", "--", "serve"])
            .arg(config.display().to_string()),
    )
    .await?;
    let listening = flex_host::retry::wait_until(
        "the registry to listen",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        },
    )
    .await;
    if listening.is_err() {
        let log = std::fs::read_to_string(reg.log()).unwrap_or_default();
        let _ = stop(r, &reg).await;
        anyhow::bail!("registry did not listen on 127.0.0.1:{port} within 30s; its log:\n{log}");
    }
    Ok(reg)
}

/// `start-stop-daemon` stopping the daemon of `pidfile`: TERM, then KILL; exit 1 when nothing
/// runs. The registry and an existing cluster's local controller stop through it.
pub fn stop_daemon_cmd(pidfile: &Path) -> Cmd {
    Cmd::new("start-stop-daemon")
        .args([
            "--stop",
            "--retry",
            "TERM/10/KILL/5",
            "--remove-pidfile",
            "--pidfile",
        ])
        .arg(pidfile.display().to_string())
}

/// Stops the registry with `r` (no error when it is not running).
pub async fn stop(r: &dyn Runner, reg: &Registry) -> anyhow::Result<()> {
    let out = r.output(&stop_daemon_cmd(&reg.pidfile())).await?;
    // Exit 1: nothing was running.
    if !(out.success() || out.code == Some(1)) {
        anyhow::bail!("stop registry: {}", out.stderr.trim());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_listens_on_loopback_only() {
        let c = render_config(Path::new("/w/registry/data"), 35000);
        assert!(c.contains("addr: 127.0.0.1:35000"));
        assert!(c.contains("rootdirectory: /w/registry/data"));
        assert!(!c.contains("htpasswd"));
    }

    /// The real registry binary (Debian's docker-registry), started and stopped.
    #[tokio::test]
    async fn real_registry_starts_and_stops() {
        let d = tempfile::tempdir().unwrap();
        let r = flex_host::runner::ProcessRunner::new();
        let reg = match start(&r, d.path()).await {
            Ok(r) => r,
            Err(e) if e.to_string().contains("not installed") => {
                panic!("{e} (CI installs it)")
            }
            Err(e) => panic!("{e:#}"),
        };
        let addr = reg.host_addr();
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        s.write_all(b"GET /v2/ HTTP/1.0\r\n\r\n").await.unwrap();
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.unwrap();
        assert!(
            buf.starts_with("HTTP/1.0 200") || buf.starts_with("HTTP/1.1 200"),
            "{buf}"
        );
        stop(&r, &reg).await.unwrap();
        assert!(tokio::net::TcpStream::connect(&addr).await.is_err());
        stop(&r, &reg).await.unwrap();
    }
}
