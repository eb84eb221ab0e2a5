//! setupHost through the fakes: the commands each task runs, the systemd calls and the files it
//! writes (real files under a temporary root), snapshot-tested.

use std::path::Path;

use super::*;
use flex_host::runner::Output;
use flex_testkit::FakeHost;
use flex_testkit::{FakeHostInfo, tree_snapshot};

fn config() -> Config {
    crate::config::parse(
        include_bytes!("../../../tests/fixtures/config-token.json"),
        &|| Ok("h".into()),
    )
    .unwrap()
    .config
}

#[tokio::test]
async fn setup_host_on_apt_host_installs_missing_and_writes_files() {
    let f = FakeHost::new().unwrap();
    f.runner.on(
        "dpkg-query --show --showformat=${db:Status-Status} curl",
        Output::ok("installed"),
    );
    f.runner.on(
        "dpkg-query --show --showformat=${db:Status-Status} util-linux",
        Output::ok("installed"),
    );
    f.runner.on(
        "dpkg-query --show --showformat=${db:Status-Status} nftables",
        Output::failed(1, "dpkg-query: no packages found matching nftables"),
    );
    std::fs::create_dir_all(f.root.path().join("etc")).unwrap();
    std::fs::write(
        f.root.path().join("etc/fstab"),
        "UUID=1 / ext4 defaults 0 1\n/swap.img none swap sw 0 0\n# old swap comment\n",
    )
    .unwrap();
    std::fs::create_dir_all(f.root.path().join("etc/docker")).unwrap();
    std::fs::write(
        f.root.path().join("etc/docker/daemon.json"),
        "{\"log-driver\": \"json-file\"}",
    )
    .unwrap();

    setup_host(&f.host, &config()).await.unwrap();

    insta::assert_snapshot!("setup_host_commands", f.runner.transcript());
    insta::assert_snapshot!("setup_host_systemd", f.systemd.calls().join("\n"));
    insta::assert_snapshot!("setup_host_files", tree_snapshot(f.root.path()));
}

#[tokio::test]
async fn setup_host_is_idempotent_on_files() {
    let f = FakeHost::new().unwrap();
    setup_host(&f.host, &config()).await.unwrap();
    let first = tree_snapshot(f.root.path());
    setup_host(&f.host, &config()).await.unwrap();
    assert_eq!(first, tree_snapshot(f.root.path()));
}

#[tokio::test]
async fn read_only_usr_checks_programs_and_lists_missing() {
    let f = FakeHost::with_info(FakeHostInfo {
        usr_read_only: true,
        ..Default::default()
    })
    .unwrap();
    f.runner.without("nft").without("mountpoint");
    let e = setup_host(&f.host, &config())
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "install-packages: host is missing required programs and packages cannot be installed here (/usr is read-only): nftables (provides nft), util-linux (provides mountpoint)"
    );
    assert!(
        f.runner.calls().is_empty(),
        "nothing run: {:?}",
        f.runner.calls()
    );
}

#[tokio::test]
async fn tdnf_host_uses_rpm_checks() {
    let f = FakeHost::new().unwrap();
    f.runner.without("apt-get");
    f.runner.on("rpm -q --quiet", Output::ok(""));
    f.runner
        .on("rpm -q --quiet nftables", Output::failed(1, ""));
    install_packages(&f.host, &config()).await.unwrap();
    insta::assert_snapshot!(f.runner.transcript(), @r"
    rpm -q --quiet systemd-container
    rpm -q --quiet curl
    rpm -q --quiet nftables
    rpm -q --quiet util-linux
    tdnf makecache
    tdnf install -y nftables
    ");
}

#[tokio::test]
async fn no_package_manager_falls_back_to_capabilities() {
    let f = FakeHost::new().unwrap();
    for pm in ["apt-get", "tdnf", "dnf", "curl"] {
        f.runner.without(pm);
    }
    let e = install_packages(&f.host, &config())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with("(no apt-get, tdnf or dnf on PATH): curl (provides curl)"),
        "{e}"
    );
}

#[tokio::test]
async fn container_mode_skips_install_packages() {
    let f = FakeHost::with_info(FakeHostInfo {
        containerized: true,
        ..Default::default()
    })
    .unwrap();
    setup_host(&f.host, &config()).await.unwrap();
    assert!(
        !f.runner
            .calls()
            .iter()
            .any(|c| c.contains("dpkg-query") || c.contains("apt-get")),
        "{:?}",
        f.runner.calls()
    );
}

#[tokio::test]
async fn failures_name_the_task() {
    let f = FakeHost::new().unwrap();
    f.runner.on(
        "sysctl --system",
        Output::failed(255, "sysctl: permission denied on key"),
    );
    let e = setup_host(&f.host, &config())
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "configure-os: sysctl --system failed: exit status 255: sysctl: permission denied on key"
    );
    let f = FakeHost::new().unwrap();
    f.systemd.fail_on("mask docker.socket docker.service");
    let e = setup_host(&f.host, &config())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("disable-docker: systemd mask docker.socket docker.service"),
        "{e}"
    );
}

#[tokio::test]
async fn docker_daemon_json_already_false_is_untouched() {
    let f = FakeHost::new().unwrap();
    let p = Path::new(DOCKER_DAEMON_JSON);
    f.host
        .fs
        .write_atomic(p, b"{\"iptables\":false}", 0o600)
        .unwrap();
    disable_docker(&f.host).await.unwrap();
    assert_eq!(f.host.fs.read(p).unwrap().unwrap(), b"{\"iptables\":false}");
    f.host.fs.write_atomic(p, b"[1]", 0o644).unwrap();
    assert!(disable_docker(&f.host).await.is_err());
}

#[test]
fn swap_lines_table() {
    let cases: &[(&str, Option<&str>)] = &[
        ("", None),
        ("UUID=1 / ext4 defaults 0 1\n", None),
        (
            "/swapfile none swap sw 0 0\n",
            Some("# /swapfile none swap sw 0 0\n"),
        ),
        ("# /swapfile none swap sw\n\n", None),
        (
            "a\n/dev/sdb2 none swap\nb",
            Some("a\n# /dev/sdb2 none swap\nb"),
        ),
    ];
    for (input, want) in cases {
        assert_eq!(os::comment_out_swap(input).as_deref(), *want, "{input:?}");
    }
}

// Azure Arc. Real: the HTTP servers (`ScriptedServer`, local sockets), the download helper, the
// temporary files and their modes. Faked: the runner (`bash` and `azcmagent` are recorded, and
// answered from scripts) and the ARM credential (`StaticToken`).

const ARM_TOKEN: &str = "arm-token-do-not-log";
const KEY_FILE: &str = "/var/opt/azcmagent/tokens/abc.key";

fn arc_config(url: &str, sha: &str) -> (Config, crate::config::ArcConfig) {
    let mut c = config();
    let arc = crate::config::ArcConfig {
        enabled: true,
        machine_name: "m1".into(),
        resource_group: "rg-arc".into(),
        location: "westus2".into(),
        tags: [("team".to_string(), "flex".to_string())].into(),
        installer_url: url.into(),
        installer_sha256: sha.into(),
    };
    c.azure.arc = Some(arc.clone());
    (c, arc)
}

fn sha256(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

/// HIMDS: the challenge (401, realm = the key file), then a token.
fn himds(realm: &str) -> flex_testkit::http::ScriptedServer {
    use flex_testkit::http::{Reply, ScriptedServer};
    ScriptedServer::start(vec![
        Reply::json(401, "{}").header("WWW-Authenticate", &format!("Basic realm={realm}")),
        Reply::json(
            200,
            r#"{"access_token":"arc-identity-token","expires_in":3600}"#,
        ),
    ])
    .unwrap()
}

/// What the fake `bash` and `azcmagent connect` saw of their files while they ran.
#[derive(Default)]
struct Seen {
    installer: Option<(std::path::PathBuf, Vec<u8>)>,
    config: Option<(std::path::PathBuf, String, u32)>,
}

/// The fake runner, plus: `azcmagent` is on PATH once `bash` (the installer) ran, and the files
/// `bash` and `azcmagent connect` were given are read while they run.
struct ArcRunner {
    fake: flex_testkit::FakeRunner,
    installed: std::sync::atomic::AtomicBool,
    seen: std::sync::Mutex<Seen>,
}

#[async_trait::async_trait]
impl flex_host::runner::Runner for ArcRunner {
    async fn output(
        &self,
        cmd: &flex_host::runner::Cmd,
    ) -> Result<Output, flex_host::runner::CmdError> {
        use std::os::unix::fs::PermissionsExt;
        let args: Vec<&str> = cmd.arg_list().iter().map(|a| a.value()).collect();
        if cmd.program() == "bash" {
            let p = std::path::PathBuf::from(args[0]);
            self.seen.lock().unwrap().installer = Some((p.clone(), std::fs::read(&p).unwrap()));
            self.installed
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        if cmd.program() == "azcmagent" && args[0] == "connect" {
            let i = args.iter().position(|a| *a == "--config").unwrap();
            let p = std::path::PathBuf::from(args[i + 1]);
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            let text = std::fs::read_to_string(&p).unwrap();
            self.seen.lock().unwrap().config = Some((p, text, mode));
        }
        self.fake.output(cmd).await
    }

    fn which(&self, program: &str) -> Option<std::path::PathBuf> {
        let installed = self.installed.load(std::sync::atomic::Ordering::SeqCst);
        (program != "azcmagent" || installed).then(|| self.fake.which(program))?
    }
}

fn seams<'a>(
    credential: &'a crate::goalclient::arm::StaticToken,
    himds: &flex_testkit::http::ScriptedServer,
) -> ArcSeams<'a> {
    ArcSeams {
        credential,
        himds: himds.url(""),
        wait: (
            std::time::Duration::from_secs(5),
            std::time::Duration::from_millis(10),
        ),
        download: flex_host::retry::Backoff::none(),
    }
}

fn token() -> crate::goalclient::arm::StaticToken {
    crate::goalclient::arm::StaticToken(flex_host::secret::Secret::new(ARM_TOKEN))
}

fn arc_host(f: &FakeHost) -> (Host, std::sync::Arc<ArcRunner>) {
    let runner = std::sync::Arc::new(ArcRunner {
        fake: f.runner.clone(),
        installed: false.into(),
        seen: Default::default(),
    });
    let mut host = f.host.clone();
    host.runner = runner.clone();
    host.fs
        .write_atomic(Path::new(KEY_FILE), b"the-himds-key\n", 0o600)
        .unwrap();
    (host, runner)
}

#[tokio::test]
async fn arc_is_refused_in_the_agents_container() {
    let f = FakeHost::with_info(FakeHostInfo {
        containerized: true,
        ..Default::default()
    })
    .unwrap();
    let (c, _) = arc_config("http://127.0.0.1:1/x", &"0".repeat(64));
    let e = install_arc(&f.host, &c).await.unwrap_err().to_string();
    assert!(
        e.contains("azure.arc.enabled") && e.contains("needs host mode"),
        "{e}"
    );
    assert!(f.runner.calls().is_empty(), "{:?}", f.runner.calls());
}

#[tokio::test]
async fn arc_installs_verifies_connects_with_the_token_in_a_file_and_waits_for_himds() {
    use flex_testkit::http::{Reply, ScriptedServer};
    let f = FakeHost::new().unwrap();
    let (host, runner) = arc_host(&f);
    let script = b"#!/bin/bash\necho installing azcmagent\n";
    let installer = ScriptedServer::start(vec![Reply {
        status: 200,
        headers: vec![],
        body: script.to_vec(),
    }])
    .unwrap();
    let himds = himds(KEY_FILE);
    f.runner.on_seq(
        "azcmagent show",
        vec![
            Output::ok("Agent Status            : Disconnected\n"),
            Output::ok("Resource Name : m1\nAgent Status            : Connected\n"),
        ],
    );
    let (c, arc) = arc_config(&installer.url("/azcmagent-linux"), &sha256(script));
    let cred = token();
    ensure_arc(&host, &c, &arc, &seams(&cred, &himds))
        .await
        .unwrap();

    let seen = runner.seen.lock().unwrap();
    let (script_path, ran) = seen.installer.clone().unwrap();
    assert_eq!(ran, script, "the verified download is what bash ran");
    assert!(!script_path.exists(), "installer removed");
    let (config_path, text, mode) = seen.config.clone().unwrap();
    assert_eq!(mode, 0o600);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&text).unwrap(),
        serde_json::json!({ "access-token": ARM_TOKEN })
    );
    assert!(!config_path.exists(), "--config file removed");
    let calls = f.runner.calls();
    assert!(calls.iter().all(|c| !c.contains(ARM_TOKEN)), "{calls:?}");
    assert_eq!(calls[0], format!("bash {}", script_path.display()));
    assert_eq!(
        calls[2],
        format!(
            "azcmagent connect --resource-group rg-arc --tenant-id 00000000-0000-0000-0000-000000000000 --location westus2 --subscription-id 12345678-1234-1234-1234-123456789012 --resource-name m1 --tags team=flex --config {}",
            config_path.display()
        )
    );
    let reqs = himds.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].path(), "/metadata/identity/oauth2/token");
    assert_eq!(
        reqs[0].query(),
        "api-version=2020-06-01&resource=https%3A%2F%2Fmanagement.core.windows.net"
    );
    assert_eq!(reqs[0].header("Metadata"), Some("true"));
    assert_eq!(reqs[0].header("Authorization"), None);
    assert_eq!(reqs[1].header("Authorization"), Some("Basic the-himds-key"));
}

#[tokio::test]
async fn arc_installer_with_another_digest_is_never_run() {
    use flex_testkit::http::{Reply, ScriptedServer};
    let f = FakeHost::new().unwrap();
    let (host, runner) = arc_host(&f);
    let installer = ScriptedServer::start(vec![Reply {
        status: 200,
        headers: vec![],
        body: b"echo tampered".to_vec(),
    }])
    .unwrap();
    let himds = himds(KEY_FILE);
    let (c, arc) = arc_config(&installer.url("/i"), &"a".repeat(64));
    let cred = token();
    let e = ensure_arc(&host, &c, &arc, &seams(&cred, &himds))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("expected {}", "a".repeat(64)))
            && e.contains(&format!("actual {}", sha256(b"echo tampered")))
            && e.contains("not run"),
        "{e}"
    );
    assert!(runner.seen.lock().unwrap().installer.is_none());
    assert!(f.runner.calls().is_empty(), "{:?}", f.runner.calls());
}

#[tokio::test]
async fn arc_already_connected_only_verifies() {
    let f = FakeHost::new().unwrap();
    let (host, runner) = arc_host(&f);
    runner
        .installed
        .store(true, std::sync::atomic::Ordering::SeqCst);
    f.runner
        .on("azcmagent show", Output::ok("Agent Status: Connected\n"));
    let (c, arc) = arc_config("http://127.0.0.1:1/never", &"0".repeat(64));
    let cred = token();
    for _ in 0..2 {
        let himds = himds(KEY_FILE);
        ensure_arc(&host, &c, &arc, &seams(&cred, &himds))
            .await
            .unwrap();
    }
    assert_eq!(
        f.runner.calls(),
        vec!["azcmagent show"; 4],
        "no install, no connect"
    );
}

#[tokio::test]
async fn himds_realm_outside_the_tokens_dir_is_refused_and_no_key_sent() {
    let f = FakeHost::new().unwrap();
    let (host, _) = arc_host(&f);
    let http = flex_host::http::client().unwrap();
    for realm in [
        "/etc/shadow",
        "/var/opt/azcmagent/tokens/../../../etc/x.key",
        "/var/opt/azcmagent/tokens/abc.txt",
    ] {
        let server = himds(realm);
        let e = himds_token(
            &host,
            &http,
            &server.url(""),
            "https://management.core.windows.net/",
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(e.contains("refused"), "{realm}: {e}");
        assert_eq!(server.requests().len(), 1, "{realm}: the key is never sent");
    }
    let server = himds(KEY_FILE);
    himds_token(&host, &http, &server.url("/"), "r")
        .await
        .unwrap();
}

#[test]
fn agent_status_is_read_from_azcmagent_show() {
    assert_eq!(
        agent_status("Resource Name: x\nAgent Status            : Connected\n"),
        Some("Connected")
    );
    assert_eq!(agent_status("Agent Version : 1.0\n"), None);
}

/// Real processes: the real `ProcessRunner`, except that `azcmagent` resolves only in `dir`.
struct PathRunner {
    dir: std::path::PathBuf,
    real: flex_host::runner::ProcessRunner,
}

#[async_trait::async_trait]
impl flex_host::runner::Runner for PathRunner {
    async fn output(
        &self,
        cmd: &flex_host::runner::Cmd,
    ) -> Result<Output, flex_host::runner::CmdError> {
        use flex_host::runner::Cmd;
        let Some(p) = self
            .which(cmd.program())
            .filter(|_| cmd.program() == "azcmagent")
        else {
            return self.real.output(cmd).await;
        };
        let args = cmd.arg_list().iter().map(|a| a.value().to_string());
        self.real
            .output(&Cmd::new(p.to_string_lossy()).args(args))
            .await
    }

    fn which(&self, program: &str) -> Option<std::path::PathBuf> {
        if program == "azcmagent" {
            let p = self.dir.join(program);
            return p.exists().then_some(p);
        }
        self.real.which(program)
    }
}

/// End to end with real processes: the downloaded installer is run by the real `bash` and
/// writes a fake `azcmagent` script, which records its argv and the `--config` file's mode and
/// content as it sees them, and says Connected once connected. HIMDS is a `ScriptedServer`.
#[tokio::test]
async fn arc_with_a_real_installer_and_a_fake_azcmagent_script() {
    use flex_testkit::http::{Reply, ScriptedServer};
    let f = FakeHost::new().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let d = bin.path().display();
    let script = format!(
        r#"#!/bin/bash
set -eu
cat > {d}/azcmagent <<'END'
#!/bin/bash
log={d}/azcmagent.log
echo "argv: $*" >> "$log"
case "$1" in
  show) if [ -e {d}/connected ]; then echo "Agent Status : Connected"; else echo "Agent Status : Disconnected"; fi ;;
  connect)
    while [ $# -gt 0 ]; do
      if [ "$1" = --config ]; then echo "mode: $(stat -c %a "$2")" >> "$log"; echo "config: $(cat "$2")" >> "$log"; fi
      shift
    done
    touch {d}/connected ;;
esac
END
chmod 755 {d}/azcmagent
"#
    );
    let installer = ScriptedServer::start(vec![Reply {
        status: 200,
        headers: vec![],
        body: script.clone().into_bytes(),
    }])
    .unwrap();
    let mut host = f.host.clone();
    host.runner = std::sync::Arc::new(PathRunner {
        dir: bin.path().to_path_buf(),
        real: flex_host::runner::ProcessRunner::new(),
    });
    host.fs
        .write_atomic(Path::new(KEY_FILE), b"k", 0o600)
        .unwrap();
    let himds = himds(KEY_FILE);
    let (c, arc) = arc_config(&installer.url("/i"), &sha256(script.as_bytes()));
    let cred = token();
    ensure_arc(&host, &c, &arc, &seams(&cred, &himds))
        .await
        .unwrap();
    let log = std::fs::read_to_string(bin.path().join("azcmagent.log")).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines[0], "argv: show");
    assert!(
        lines[1].starts_with("argv: connect --resource-group rg-arc ")
            && lines[1].contains(" --tags team=flex --config /"),
        "{log}"
    );
    assert_eq!(lines[2], "mode: 600");
    assert_eq!(
        lines[3],
        format!(r#"config: {{"access-token":"{ARM_TOKEN}"}}"#)
    );
    assert_eq!(lines[4], "argv: show");
    assert_eq!(log.matches(ARM_TOKEN).count(), 1, "only in the file: {log}");
}
