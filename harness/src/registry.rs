//! The local registry: Debian's `docker-registry` (distribution) on `127.0.0.1`, with the
//! harness's own config and storage, started in the background with `start-stop-daemon` (it
//! outlives `up`; `down` stops it) and reached by the guest through QEMU's user network.
//!
//! Beside it, [`start_auth`] starts a second instance over the same storage that asks for a
//! password (htpasswd: `Basic` challenges; user [`AUTH_USER`], a random password made per
//! `up`): the guest pulls the machine image from it with the credentials file `up` writes into
//! the Ignition config (`bootstrap.registryAuth`), so every bootstrap pulls with credentials.

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
    /// The instance over the same storage that asks for a password ([`start_auth`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthRegistry>,
}

/// The user of the password-protected registry.
pub const AUTH_USER: &str = "flex";

/// Where the guest's credentials file for the password-protected registry is written (by the
/// Ignition config; `bootstrap.registryAuth.configFile`).
pub const GUEST_AUTH_FILE: &str = "/etc/aks-flex-node/registry-auth.json";

/// The password-protected instance of the harness's registry.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AuthRegistry {
    /// Loopback port.
    pub port: u16,
    /// [`AUTH_USER`]'s password (random per `up`; in the state file, which is the harness
    /// user's, never in a log).
    pub password: String,
}

impl std::fmt::Debug for AuthRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthRegistry")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
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

    fn auth_pidfile(&self) -> PathBuf {
        self.dir.join("registry-auth.pid")
    }

    /// The password-protected instance's log file.
    pub fn auth_log(&self) -> PathBuf {
        self.dir.join("registry-auth.log")
    }

    /// The password-protected instance as the guest reaches it: `10.0.2.2:<port>`.
    pub fn guest_auth_addr(&self) -> Option<String> {
        self.auth
            .as_ref()
            .map(|a| format!("{GUEST_HOST_ADDR}:{}", a.port))
    }

    /// The guest's credentials file for the password-protected instance (Docker's format), or
    /// `None` without one.
    pub fn guest_credentials(&self) -> Option<String> {
        use base64::Engine as _;
        let a = self.auth.as_ref()?;
        let auth =
            base64::engine::general_purpose::STANDARD.encode(format!("{AUTH_USER}:{}", a.password));
        Some(
            serde_json::json!({"auths": {format!("{GUEST_HOST_ADDR}:{}", a.port): {"auth": auth}}})
                .to_string(),
        )
    }
}

/// The registry's config.
pub fn render_config(data_dir: &Path, port: u16) -> String {
    format!(
        "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
        data_dir.display()
    )
}

/// The password-protected instance's config: the same storage as `data_dir`'s registry, on
/// `port`, asking for the passwords of `htpasswd`.
pub fn render_auth_config(data_dir: &Path, port: u16, htpasswd: &Path) -> String {
    format!(
        "{}auth:\n  htpasswd:\n    realm: aks-flex-harness\n    path: {}\n",
        render_config(data_dir, port),
        htpasswd.display()
    )
}

/// A random password: 16 bytes from the kernel's generator, hex.
fn random_password() -> std::io::Result<String> {
    use std::io::Read as _;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(hex::encode(b))
}

/// Starts, with `r`, the password-protected instance over `reg`'s storage (a new random
/// password for [`AUTH_USER`]) and waits until it listens; records it in `reg`.
pub async fn start_auth(r: &dyn Runner, reg: &mut Registry) -> anyhow::Result<()> {
    let port = free_port()?;
    let password = random_password()?;
    // Cost 6: the registry checks the hash on every request; this is a test password.
    let hash = bcrypt::hash(&password, 6)?;
    let htpasswd = reg.dir.join("htpasswd");
    std::fs::write(&htpasswd, format!("{AUTH_USER}:{hash}\n"))?;
    let config = reg.dir.join("config-auth.yml");
    std::fs::write(
        &config,
        render_auth_config(&reg.dir.join("data"), port, &htpasswd),
    )?;
    reg.auth = Some(AuthRegistry { port, password });
    run_daemon(r, &reg.auth_pidfile(), &reg.auth_log(), &config, port).await
}

/// Starts `docker-registry serve config` in the background (`pidfile`, `log`) and waits until
/// it listens on `port`; stops it again when it does not.
async fn run_daemon(
    r: &dyn Runner,
    pidfile: &Path,
    log: &Path,
    config: &Path,
    port: u16,
) -> anyhow::Result<()> {
    r.run(
        &Cmd::new("start-stop-daemon")
            .args(["--start", "--background", "--make-pidfile", "--pidfile"])
            .arg(pidfile.display().to_string())
            .arg("--output")
            .arg(log.display().to_string())
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
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let _ = r.output(&stop_daemon_cmd(pidfile)).await;
        anyhow::bail!("registry did not listen on 127.0.0.1:{port} within 30s; its log:\n{text}");
    }
    Ok(())
}

/// How many requests under `uri_prefix` the password-protected instance's log `log` shows it
/// let through (`msg="authorized request"`: the password was given and right, since it refuses
/// anonymous requests). The registry's logger quotes a value with a `:` in it (a digest), so
/// the URI is matched quoted or not.
pub fn authorized_requests(log: &str, uri_prefix: &str) -> usize {
    let bare = format!("http.request.uri={uri_prefix}");
    let quoted = format!("http.request.uri=\"{uri_prefix}");
    log.lines()
        .filter(|l| {
            l.contains("msg=\"authorized request\"") && (l.contains(&bare) || l.contains(&quoted))
        })
        .count()
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
        auth: None,
    };
    let config = dir.join("config.yml");
    std::fs::write(&config, render_config(&dir.join("data"), port))?;
    run_daemon(r, &reg.pidfile(), &reg.log(), &config, port).await?;
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

/// Stops the registry and its password-protected instance with `r` (no error when they are not
/// running).
pub async fn stop(r: &dyn Runner, reg: &Registry) -> anyhow::Result<()> {
    for pidfile in [reg.pidfile(), reg.auth_pidfile()] {
        let out = r.output(&stop_daemon_cmd(&pidfile)).await?;
        // Exit 1: nothing was running.
        if !(out.success() || out.code == Some(1)) {
            anyhow::bail!("stop registry: {}", out.stderr.trim());
        }
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

    /// The real registry and its password-protected instance over the same storage: an image
    /// pushed to the first is refused anonymously by the second, and served to the harness's
    /// user with the password (the agent's own registry client, with the guest's credentials
    /// file re-keyed to the loopback address); `stop` stops both.
    #[tokio::test]
    async fn real_password_protected_instance_serves_the_same_storage() {
        use flex_oci::{Arch, ImageRef, RegistryClient};
        let d = tempfile::tempdir().unwrap();
        let r = flex_host::runner::ProcessRunner::new();
        let mut reg = start(&r, d.path()).await.unwrap();
        start_auth(&r, &mut reg).await.unwrap();
        let auth = reg.auth.clone().unwrap();
        let open_addr = reg.host_addr();
        let auth_addr = format!("127.0.0.1:{}", auth.port);
        let http = flex_host::http::client().unwrap();
        let insecure =
            flex_host::http::InsecureRegistries::parse("test", &format!("{open_addr},{auth_addr}"))
                .unwrap();
        let plain = RegistryClient::new(http.clone()).with_insecure_registries(insecure.clone());
        let image = ImageRef::parse(&format!("{open_addr}/aks-flex/tiny:v1")).unwrap();
        let config = bytes::Bytes::from(format!(
            r#"{{"architecture":"{}","os":"linux","rootfs":{{"type":"layers","diff_ids":[]}}}}"#,
            Arch::host()
        ));
        let pushed = plain.push_image(&image, config, Vec::new()).await.unwrap();
        let behind = ImageRef::parse(&format!("{auth_addr}/aks-flex/tiny:v1")).unwrap();
        let refused = plain.resolve(&behind, Arch::host()).await.unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("the registry wants credentials"),
            "{refused}"
        );
        let creds = reg
            .guest_credentials()
            .unwrap()
            .replace(&reg.guest_auth_addr().unwrap(), &auth_addr);
        let creds = flex_oci::DockerConfig::parse("test", creds.as_bytes()).unwrap();
        let with = plain.with_credentials(std::sync::Arc::new(creds));
        let resolved = with.resolve(&behind, Arch::host()).await.unwrap();
        assert_eq!(resolved.digest, pushed.digest);
        // By digest too, as the guest pulls (the logger quotes a URI with a `:`).
        let pinned = behind.with_digest(pushed.digest.clone());
        with.resolve(&pinned, Arch::host()).await.unwrap();
        let log = std::fs::read_to_string(reg.auth_log()).unwrap();
        assert!(
            authorized_requests(&log, "/v2/aks-flex/tiny/manifests/") >= 2,
            "{log}"
        );
        assert!(
            authorized_requests(&log, "/v2/aks-flex/tiny/manifests/sha256:") >= 1,
            "{log}"
        );
        assert_eq!(authorized_requests(&log, "/v2/aks-flex/other/"), 0);
        assert!(!log.contains(&auth.password));
        stop(&r, &reg).await.unwrap();
        for a in [&open_addr, &auth_addr] {
            assert!(tokio::net::TcpStream::connect(a).await.is_err(), "{a}");
        }
    }
}
