//! The bootstrap flow through fakes: the config written 0600, preflight before start, start
//! once, nothing done on a bootstrapped node, hostile env-file values kept literal.

use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};

use super::*;
use crate::flows::bootstrap::inputs as names;
use crate::flows::bootstrap::render::tests::{full, minimal};
use crate::machine::nodegoal::MachineGoal;
use flex_testkit::FakeHost;
use flex_testkit::FakeHostInfo;

struct UpProbe;

#[async_trait]
impl RemoteProbe for UpProbe {
    async fn image_reachable(
        &self,
        _c: &Config,
        _g: &MachineGoal,
    ) -> Result<String, crate::machine::seams::ProbeError> {
        Ok("sha256:abc".into())
    }
    async fn artifacts_reachable(
        &self,
        _c: &Config,
        _g: &MachineGoal,
    ) -> Vec<(String, Result<(), crate::machine::seams::ProbeError>)> {
        ["kubernetes-artifacts", "cri-artifacts", "cni-artifacts"]
            .into_iter()
            .map(|n| (n.to_string(), Ok(())))
            .collect()
    }
}

/// Records each call with what it saw, and saves the daemon state and the mark as `start` does
/// (the mark alone for `finish`).
#[derive(Default)]
struct FakeStart {
    calls: Arc<Mutex<Vec<String>>>,
    fail: bool,
}

#[async_trait]
impl StartRunner for FakeStart {
    async fn start(&self, host: &Host, config: &Config) -> anyhow::Result<()> {
        let cfg = host.fs.path(Path::new(DEFAULT_CONFIG_PATH));
        let mode = std::fs::metadata(&cfg).map(|m| m.permissions().mode() & 0o777);
        self.calls.lock().unwrap().push(format!(
            "start node={} config_mode={:o}",
            config.agent.node_name,
            mode.unwrap_or(0)
        ));
        if self.fail {
            anyhow::bail!("bootstrap failed: start-node: kubelet never became active");
        }
        host.fs
            .write_atomic(Path::new(STATE_PATH), b"{}\n", 0o600)?;
        crate::state::BootstrapMarkStore::new(host.fs.clone())
            .save(&crate::state::BootstrapMark::now())?;
        Ok(())
    }
    async fn finish(&self, host: &Host) -> anyhow::Result<()> {
        self.calls.lock().unwrap().push("finish".into());
        crate::state::BootstrapMarkStore::new(host.fs.clone())
            .save(&crate::state::BootstrapMark::now())?;
        Ok(())
    }
}

impl FakeStart {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

/// A host on which every preflight check passes.
fn healthy_with(info: FakeHostInfo) -> FakeHost {
    let f = FakeHost::with_info(info).unwrap();
    let fs = &f.host.fs;
    for d in [
        "/run/systemd/system",
        "/sys/fs/cgroup",
        "/var/lib",
        "/proc/sys/net/bridge",
    ] {
        fs.create_dir_all(Path::new(d)).unwrap();
    }
    for (p, c) in [
        ("/sys/fs/cgroup/cgroup.controllers", "cpu memory\n"),
        ("/proc/filesystems", "nodev\tsysfs\nnodev\tbpf\n\text4\n"),
        (
            "/lib/modules/6.1.0-test/modules.dep",
            "kernel/fs/overlayfs/overlay.ko.xz:\nkernel/net/bridge/br_netfilter.ko.xz:\n",
        ),
        ("/proc/swaps", "Filename Type Size Used Priority\n"),
    ] {
        fs.write_atomic(Path::new(p), c.as_bytes(), 0o444).unwrap();
    }
    f
}

fn healthy() -> FakeHost {
    healthy_with(FakeHostInfo::default())
}

async fn go(f: &FakeHost, inputs: &Inputs, start: &FakeStart) -> (anyhow::Result<Outcome>, String) {
    let mut out = Vec::new();
    let r = run(&f.host, inputs, &UpProbe, start, &mut out).await;
    (r, String::from_utf8(out).unwrap())
}

fn config_file(f: &FakeHost) -> std::path::PathBuf {
    f.host.fs.path(Path::new(DEFAULT_CONFIG_PATH))
}

#[tokio::test]
async fn writes_the_config_0600_runs_preflight_then_start_once() {
    let f = healthy();
    let start = FakeStart::default();
    let (r, out) = go(&f, &full(), &start).await;
    assert_eq!(r.unwrap(), Outcome::Started, "{out}");
    assert_eq!(start.calls(), vec!["start node=edge-7 config_mode=600"]);
    let written = std::fs::read(config_file(&f)).unwrap();
    assert_eq!(
        written,
        render(&full(), &|| Ok("flex-node-1".into()))
            .unwrap()
            .bytes()
    );
    let mode = std::fs::metadata(config_file(&f))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let wrote = out
        .find("[bootstrap] wrote /etc/aks-flex-node/config.json from the bootstrap inputs")
        .unwrap();
    let pre = out
        .find("[preflight] Running AKS Flex Node preflight checks")
        .unwrap();
    let started = out.find("[bootstrap] running start").unwrap();
    assert!(wrote < pre && pre < started, "{out}");
    assert!(out.ends_with(crate::flows::start::START_SUCCESS), "{out}");
    assert!(!out.contains("0123456789abcdef"), "{out}");
}

#[tokio::test]
async fn a_second_run_on_a_bootstrapped_node_changes_nothing() {
    let f = healthy();
    let start = FakeStart::default();
    assert_eq!(
        go(&f, &minimal(), &start).await.0.unwrap(),
        Outcome::Started
    );
    let before = std::fs::read(config_file(&f)).unwrap();
    f.runner.clear();
    let mut changed = full();
    changed.set(names::NODE_NAME, "another");
    let (r, out) = go(&f, &changed, &start).await;
    assert_eq!(r.unwrap(), Outcome::AlreadyBootstrapped);
    assert_eq!(start.calls().len(), 1, "start ran again");
    assert_eq!(std::fs::read(config_file(&f)).unwrap(), before);
    assert!(f.runner.calls().is_empty(), "{:?}", f.runner.calls());
    assert_eq!(
        out,
        "[bootstrap] this node is already bootstrapped (/etc/aks-flex-node/bootstrap-complete.json exists): not writing the config, running preflight or start again (run `aks-flex-node reset` first to bootstrap it anew)\n"
    );
}

#[tokio::test]
async fn a_state_without_the_complete_mark_is_finished_not_started_again() {
    // Real: the files (temporary root). Faked: start (records `finish`), the host's runner.
    // The disk as a `start` killed at `start.before-agent-unit` left it (or an older agent
    // that wrote no mark): the daemon state, no mark.
    let f = healthy();
    f.host
        .fs
        .write_atomic(Path::new(STATE_PATH), b"{}\n", 0o600)
        .unwrap();
    let start = FakeStart::default();
    let (r, out) = go(&f, &full(), &start).await;
    assert_eq!(r.unwrap(), Outcome::Finished, "{out}");
    assert_eq!(start.calls(), vec!["finish"]);
    assert!(!config_file(&f).exists(), "the config is not rewritten");
    assert!(
        f.runner.calls().is_empty(),
        "no preflight: {:?}",
        f.runner.calls()
    );
    assert!(
        out.starts_with(
            "[bootstrap] /etc/aks-flex-node/daemon-state.json exists but the bootstrap is not marked complete: finishing it"
        ),
        "{out}"
    );
    assert!(out.contains("started successfully"), "{out}");
    // Finished means complete: the next run does nothing.
    let (r, _) = go(&f, &full(), &start).await;
    assert_eq!(r.unwrap(), Outcome::AlreadyBootstrapped);
    assert_eq!(start.calls(), vec!["finish"]);
}

#[tokio::test]
async fn a_start_cut_short_before_its_state_runs_again_without_preflight() {
    // Real: the files (temporary root). Faked: start (records `start`), the host's runner.
    // The disk as a `start` killed before it saved the daemon state leaves it: the started
    // mark, no state, no complete mark (its machine may hold the ports preflight checks).
    let f = healthy();
    crate::state::BootstrapMarkStore::started(f.host.fs.clone())
        .save(&crate::state::BootstrapMark::now())
        .unwrap();
    let start = FakeStart::default();
    let (r, out) = go(&f, &full(), &start).await;
    assert_eq!(r.unwrap(), Outcome::Started, "{out}");
    let calls = start.calls();
    assert!(
        calls.len() == 1 && calls[0].starts_with("start "),
        "{calls:?}"
    );
    assert!(config_file(&f).exists(), "the config is written again");
    assert!(
        f.runner.calls().is_empty(),
        "no preflight: {:?}",
        f.runner.calls()
    );
    assert!(out.contains("without preflight"), "{out}");
    assert!(!out.contains("[preflight]"), "{out}");
}

#[tokio::test]
async fn a_preflight_error_stops_before_start_unless_ignored() {
    let small = FakeHostInfo {
        var_lib_free: 1 << 30,
        ..Default::default()
    };
    let f = healthy_with(small.clone());
    let start = FakeStart::default();
    let (r, out) = go(&f, &minimal(), &start).await;
    assert_eq!(r.unwrap_err().to_string(), "preflight checks failed");
    assert!(start.calls().is_empty());
    assert!(out.contains("[ERROR disk-space]"), "{out}");
    assert!(!out.contains("running start"), "{out}");

    let f = healthy_with(small);
    let mut i = minimal();
    i.set(names::PREFLIGHT_IGNORE, "cgroups, DISK-SPACE");
    let (r, out) = go(&f, &i, &start).await;
    assert_eq!(r.unwrap(), Outcome::Started, "{out}");
    assert!(out.contains("[WARNING disk-space]"), "{out}");
    assert_eq!(start.calls().len(), 1);
}

#[tokio::test]
async fn a_failing_start_is_reported_as_is() {
    let f = healthy();
    let start = FakeStart {
        fail: true,
        ..Default::default()
    };
    let (r, _) = go(&f, &minimal(), &start).await;
    assert_eq!(
        r.unwrap_err().to_string(),
        "bootstrap failed: start-node: kubelet never became active"
    );
    assert_eq!(start.calls().len(), 1);
}

#[tokio::test]
async fn bad_inputs_and_non_root_write_nothing() {
    let f = healthy();
    let start = FakeStart::default();
    let mut i = minimal();
    i.set(names::NODE_IP, "nope");
    let (r, out) = go(&f, &i, &start).await;
    assert_eq!(
        format!("{:#}", r.unwrap_err()),
        "render the config: AKS_FLEX_NODE_NODE_IP: \"nope\" is not an IP address"
    );
    assert!(out.is_empty());
    assert!(!config_file(&f).exists());

    let f = healthy_with(FakeHostInfo {
        euid: 1000,
        ..Default::default()
    });
    let (r, _) = go(&f, &minimal(), &start).await;
    assert_eq!(
        r.unwrap_err().to_string(),
        "aks-flex-node bootstrap must run as root (running as uid 1000)"
    );
    assert!(!config_file(&f).exists());
    assert!(start.calls().is_empty());
}

#[tokio::test]
async fn a_given_config_is_copied_byte_for_byte() {
    let f = healthy();
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("my-config.json");
    let fixture = include_bytes!("../../../../tests/fixtures/config-token.json");
    std::fs::write(&p, fixture).unwrap();
    let i = Inputs {
        config: Some(p.clone()),
        preflight_ignore: "all".into(),
        ..Default::default()
    };
    let start = FakeStart::default();
    let (r, out) = go(&f, &i, &start).await;
    assert_eq!(r.unwrap(), Outcome::Started, "{out}");
    assert_eq!(std::fs::read(config_file(&f)).unwrap(), fixture);
    assert!(
        out.contains(&format!("from AKS_FLEX_NODE_CONFIG ({})", p.display())),
        "{out}"
    );
    assert_eq!(
        start.calls(),
        vec!["start node=flex-node-1 config_mode=600"]
    );

    // Rendering inputs beside it would be silently ignored: refused.
    let f = healthy();
    let mut both = i.clone();
    both.set(names::NODE_NAME, "x");
    both.set(names::LABELS, "a=b");
    let (r, _) = go(&f, &both, &start).await;
    assert_eq!(
        r.unwrap_err().to_string(),
        "AKS_FLEX_NODE_CONFIG is set, so the config is not rendered and these inputs would be ignored: AKS_FLEX_NODE_NODE_NAME, AKS_FLEX_NODE_LABELS; unset them or AKS_FLEX_NODE_CONFIG"
    );

    // An invalid or missing file is reported against the input.
    std::fs::write(&p, b"{\"azure\":{}}").unwrap();
    let (r, _) = go(&f, &i, &start).await;
    let e = format!("{:#}", r.unwrap_err());
    assert!(
        e.starts_with(&format!(
            "AKS_FLEX_NODE_CONFIG: {}: config validation failed",
            p.display()
        )),
        "{e}"
    );
    let missing = Inputs {
        config: Some(d.path().join("nope.json")),
        ..Default::default()
    };
    let (r, _) = go(&f, &missing, &start).await;
    let e = format!("{:#}", r.unwrap_err());
    assert!(e.starts_with("AKS_FLEX_NODE_CONFIG: read "), "{e}");
    assert!(!config_file(&f).exists());
}

#[tokio::test]
async fn hostile_env_file_values_end_up_literally_in_the_config() {
    let f = healthy();
    let d = tempfile::tempdir().unwrap();
    let marker = d.path().join("pwned");
    let m = marker.display();
    let env_file = d.path().join("bootstrap.env");
    let body = format!(
        "# hostile values\n\
         AKS_FLEX_NODE_CLUSTER_RESOURCE_ID=/subscriptions/12345678-1234-1234-1234-123456789012/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/aks1\n\
         AKS_FLEX_NODE_KUBERNETES_VERSION=1.35.0\n\
         AKS_FLEX_NODE_API_SERVER=aks1.example.com\n\
         AKS_FLEX_NODE_CA_CERT_DATA=LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJ0ZXN0Ci0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K\n\
         export AKS_FLEX_NODE_BOOTSTRAP_TOKEN='abcdef.0123456789abcdef'\n\
         AKS_FLEX_NODE_LOCATION=$(touch {m})\n\
         AKS_FLEX_NODE_OCI_IMAGE=\"`touch {m}`;rm -rf / | sh\"\n\
         AKS_FLEX_NODE_OFFLINE_ARTIFACTS='$(touch {m}) ${{HOME}} ~'\n"
    );
    std::fs::write(&env_file, body).unwrap();
    let inputs = Inputs::load(Some(&env_file), Vec::new()).unwrap();
    let start = FakeStart::default();
    let (r, out) = go(&f, &inputs, &start).await;
    assert_eq!(r.unwrap(), Outcome::Started, "{out}");
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(config_file(&f)).unwrap()).unwrap();
    assert_eq!(
        v["azure"]["targetCluster"]["location"],
        format!("$(touch {m})")
    );
    assert_eq!(
        v["bootstrap"]["ociImage"],
        format!("`touch {m}`;rm -rf / | sh")
    );
    assert_eq!(
        v["bootstrap"]["offlineArtifacts"]["source"],
        format!("$(touch {m}) ${{HOME}} ~")
    );
    assert!(!marker.exists(), "a value was evaluated");
}

#[tokio::test]
async fn main_entry_reads_the_file_and_lets_the_environment_win() {
    let f = healthy();
    let d = tempfile::tempdir().unwrap();
    let env_file = d.path().join("bootstrap.env");
    let mut body = String::new();
    for (k, v) in [
        (
            names::CLUSTER_RESOURCE_ID,
            "/subscriptions/12345678-1234-1234-1234-123456789012/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/aks1",
        ),
        (names::KUBERNETES_VERSION, "1.35.0"),
        (names::API_SERVER, "aks1.example.com:6443"),
        (
            names::CA_CERT_DATA,
            "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJ0ZXN0Ci0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K",
        ),
        (names::BOOTSTRAP_TOKEN, "abcdef.0123456789abcdef"),
        (names::NODE_NAME, "from-file"),
        (names::VERSION, "v0.1.0"),
        (names::USE_INSTALLED_AGENT, "true"),
    ] {
        body.push_str(&format!("{k}=\"{v}\"\n"));
    }
    std::fs::write(&env_file, body).unwrap();
    let start = FakeStart::default();
    let environ = vec![
        (OsString::from(names::NODE_NAME), OsString::from("from-env")),
        (
            OsString::from("AKS_FLEX_NODE_CONTAINERIZED"),
            OsString::from("true"),
        ),
    ];
    let outcome = main_entry(Some(&env_file), environ, &f.host, &UpProbe, &start)
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Started);
    assert_eq!(start.calls(), vec!["start node=from-env config_mode=600"]);

    std::fs::write(
        &env_file,
        "AKS_FLEX_NODE_NODE_NAME=a\nAKS_FLEX_NODE_NODENAME=b\n",
    )
    .unwrap();
    let e = main_entry(Some(&env_file), Vec::new(), &f.host, &UpProbe, &start)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.ends_with("bootstrap.env line 2: AKS_FLEX_NODE_NODENAME is not a bootstrap input (see docs/bootstrap.md)"), "{e}");
}
