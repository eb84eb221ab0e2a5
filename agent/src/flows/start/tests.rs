//! The `start` flow through fakes: order of steps, state saved only after the node is up,
//! machine registration semantics.

use std::path::Path;
use std::sync::{Arc, Mutex};

use super::*;
use flex_testkit::FakeHost;

/// The token fixture, with machine registration best effort (the fixture requires it).
fn config() -> Config {
    let mut c = crate::config::parse(
        include_bytes!("../../../tests/fixtures/config-token.json"),
        &|| Ok("h".into()),
    )
    .unwrap()
    .config;
    c.agent.require_machine_registration = false;
    c
}

/// A node starter that records the call and checks no state was saved before it.
struct RecordingNode {
    calls: Arc<Mutex<Vec<String>>>,
    fail: bool,
}

#[async_trait]
impl NodeStarter for RecordingNode {
    async fn start_node(
        &self,
        host: &Host,
        _c: &Config,
        machine: &str,
    ) -> Result<(), crate::machine::seams::SeamError> {
        let saved = host.fs.exists(Path::new(crate::state::STATE_PATH));
        self.calls
            .lock()
            .unwrap()
            .push(format!("start_node {machine} state_saved_before={saved}"));
        if self.fail {
            return Err(crate::machine::seams::SeamError::transient(
                anyhow::anyhow!("kubelet never became active in kube1"),
            ));
        }
        Ok(())
    }
}

struct FakeRegistry {
    existing: Option<RemoteMachine>,
    put_result: RemoteMachine,
    puts: Mutex<usize>,
}

#[async_trait]
impl MachineRegistry for FakeRegistry {
    async fn get(&self) -> anyhow::Result<Option<RemoteMachine>> {
        Ok(self.existing.clone())
    }
    async fn put(&self, _g: &GoalState) -> anyhow::Result<RemoteMachine> {
        *self.puts.lock().unwrap() += 1;
        Ok(self.put_result.clone())
    }
}

#[tokio::test]
async fn start_runs_in_order_and_saves_state_after_the_node() {
    let f = FakeHost::new().unwrap();
    // What bootstrap.sh installed: start moves it into the blue/green layout.
    f.host
        .fs
        .write_atomic(Path::new("/usr/local/bin/aks-flex-node"), b"\x7fELF", 0o755)
        .unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let node = RecordingNode {
        calls: calls.clone(),
        fail: false,
    };
    run_start(
        &f.host,
        &config(),
        &NoRegistry("no machine client".into()),
        &node,
    )
    .await
    .unwrap();
    assert_eq!(
        *calls.lock().unwrap(),
        vec!["start_node kube1 state_saved_before=false"]
    );
    let st = StateStore::new(f.host.fs.clone()).load().unwrap().unwrap();
    assert_eq!(st, seeded_state(&goal_from_config(&config()).unwrap()));
    assert_eq!(st.active_machine, "kube1");
    assert_eq!(st.applied_settings_version, "1.35.0");
    assert_eq!(
        std::fs::read_link(f.host.fs.path(Path::new("/usr/local/bin/aks-flex-node"))).unwrap(),
        Path::new(crate::flows::upgrade::layout::CURRENT_EXEC)
    );
    assert!(
        f.host
            .fs
            .exists(Path::new(crate::systemd::RECOVERY_UNIT_PATH))
    );
    let sd = f.systemd.calls();
    // enable reloads the manager (the unit file written before it is loaded): no reload of its own.
    assert_eq!(
        &sd[sd.len() - 2..],
        &[
            "enable aks-flex-node-agent.service",
            "start aks-flex-node-agent.service"
        ]
    );
}

#[tokio::test]
async fn node_failure_saves_no_state_and_installs_no_service() {
    let f = FakeHost::new().unwrap();
    let node = RecordingNode {
        calls: Default::default(),
        fail: true,
    };
    let e = run_start(&f.host, &config(), &NoRegistry("x".into()), &node)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "bootstrap failed: start-node: kubelet never became active in kube1"
    );
    assert!(!f.host.fs.exists(Path::new(crate::state::STATE_PATH)));
    assert!(!f.host.fs.exists(Path::new(crate::systemd::AGENT_UNIT_PATH)));
}

/// A `start` that returns an error removes its "started" mark (a kill, which is not an error,
/// leaves it): the next `bootstrap-node` starts afresh, with preflight. Real: files in a
/// temporary root. Faked: the node starter (fails), systemd.
#[tokio::test]
async fn a_start_that_fails_removes_its_started_mark() {
    let f = FakeHost::new().unwrap();
    let node = RecordingNode {
        calls: Default::default(),
        fail: true,
    };
    run_start(&f.host, &config(), &NoRegistry("x".into()), &node)
        .await
        .unwrap_err();
    assert!(
        !f.host
            .fs
            .exists(Path::new(crate::state::BOOTSTRAP_STARTED_PATH))
    );
    assert_eq!(progress_on(&f.host), BootstrapProgress::NotStarted);
}

#[tokio::test]
async fn required_registration_failure_is_fatal() {
    let f = FakeHost::new().unwrap();
    let mut c = config();
    c.agent.require_machine_registration = true;
    let node = RecordingNode {
        calls: Default::default(),
        fail: false,
    };
    let e = run_start(
        &f.host,
        &c,
        &NoRegistry("API server unreachable".into()),
        &node,
    )
    .await
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        "bootstrap failed: ensure-machine: get machine: API server unreachable"
    );
    assert!(f.runner.calls().is_empty(), "nothing ran on the host");
}

#[tokio::test]
async fn ensure_machine_table() {
    let goal = goal_from_config(&config()).unwrap();
    let m = |v: &str, e: &str| RemoteMachine {
        kubernetes_version: v.into(),
        etag: e.into(),
    };
    // (existing, put result, expected settings version, expected puts, error?)
    let cases = vec![
        (Some(m("1.35.0", "etag-1")), m("", ""), "etag-1", 0, false),
        (Some(m("1.35.0", "")), m("", ""), "1.35.0", 0, false),
        (
            Some(m("1.34.0", "old")),
            m("1.35.0", "etag-2"),
            "etag-2",
            1,
            false,
        ),
        (None, m("1.35.0", "etag-3"), "etag-3", 1, false),
        (None, m("", ""), "1.35.0", 1, false),
        (None, m("1.30.0", "x"), "1.35.0", 1, true),
    ];
    for (existing, put_result, want, puts, fails) in cases {
        let reg = FakeRegistry {
            existing: existing.clone(),
            put_result,
            puts: Mutex::new(0),
        };
        let mut g = goal.clone();
        let r = ensure_machine(&reg, &mut g, true).await;
        assert_eq!(r.is_err(), fails, "{existing:?}");
        assert_eq!(g.settings_version, want, "{existing:?}");
        assert_eq!(*reg.puts.lock().unwrap(), puts);
        // Not required: never an error.
        let mut g = goal.clone();
        assert!(ensure_machine(&reg, &mut g, false).await.is_ok());
    }
}

#[test]
fn goal_from_config_checks() {
    let mut c = config();
    assert_eq!(goal_from_config(&c).unwrap().max_pods, 110);
    c.components.kubernetes = " ".into();
    assert_eq!(
        goal_from_config(&c).unwrap_err().field,
        "components.kubernetes"
    );
    let mut c = config();
    c.node.max_pods = i64::from(i32::MAX) + 1;
    assert_eq!(goal_from_config(&c).unwrap_err().field, "node.maxPods");
    let mut c = config();
    c.node.kubelet.image_gc_low_threshold = -1;
    let e = goal_from_config(&c).unwrap_err();
    assert_eq!(e.field, "node.kubelet.imageGCLowThreshold");
    assert_eq!(
        e.to_string(),
        "node.kubelet.imageGCLowThreshold: -1 must not be negative"
    );
}

#[test]
fn bootstrap_progress_table() {
    use BootstrapProgress::*;
    for (marked, state, started, want) in [
        (false, false, false, NotStarted),
        // start cut short before its machine came up (the faults group's w1-state).
        (false, false, true, Interrupted),
        (false, true, false, Unfinished),
        (false, true, true, Unfinished),
        (true, true, true, Complete),
        // A mark without a state: the mark wins (reset removes the marks first, so an
        // interrupted reset does not leave this).
        (true, false, false, Complete),
        (true, false, true, Complete),
    ] {
        assert_eq!(
            bootstrap_progress(marked, state, started),
            want,
            "{marked} {state} {started}"
        );
    }
}

/// A fake host with the binary bootstrap.sh installs (start moves it into the layout).
fn host_with_agent() -> FakeHost {
    let f = FakeHost::new().unwrap();
    f.host
        .fs
        .write_atomic(Path::new("/usr/local/bin/aks-flex-node"), b"\x7fELF", 0o755)
        .unwrap();
    f
}

fn marked(f: &FakeHost) -> bool {
    crate::state::BootstrapMarkStore::new(f.host.fs.clone()).is_marked()
}

#[tokio::test]
async fn start_marks_the_bootstrap_complete_last() {
    // Real: files in a temporary root. Faked: systemd (recording), the node starter.
    let f = host_with_agent();
    assert_eq!(progress_on(&f.host), BootstrapProgress::NotStarted);
    let node = RecordingNode {
        calls: Default::default(),
        fail: false,
    };
    run_start(&f.host, &config(), &NoRegistry("x".into()), &node)
        .await
        .unwrap();
    assert!(marked(&f));
    assert_eq!(progress_on(&f.host), BootstrapProgress::Complete);
    // A service that does not start leaves the state saved and no mark.
    let f = host_with_agent();
    f.systemd.fail_on("start aks-flex-node-agent.service");
    let e = run_start(&f.host, &config(), &NoRegistry("x".into()), &node)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("bootstrap failed: install-service: "), "{e}");
    assert!(f.host.fs.exists(Path::new(crate::state::STATE_PATH)));
    assert!(!marked(&f));
    assert_eq!(progress_on(&f.host), BootstrapProgress::Unfinished);
}

#[tokio::test]
async fn finish_bootstrap_completes_a_start_cut_short_before_the_agent_unit() {
    // Real: files in a temporary root. Faked: systemd (recording). The disk as a `start`
    // killed at `start.before-agent-unit` leaves it: the daemon state, no units, no mark.
    let f = host_with_agent();
    StateStore::new(f.host.fs.clone())
        .save(&seeded_state(&goal_from_config(&config()).unwrap()))
        .unwrap();
    assert_eq!(progress_on(&f.host), BootstrapProgress::Unfinished);
    finish_bootstrap(&f.host).await.unwrap();
    for unit in [
        crate::systemd::AGENT_UNIT_PATH,
        crate::systemd::RECOVERY_UNIT_PATH,
    ] {
        assert!(f.host.fs.exists(Path::new(unit)), "{unit}");
    }
    let sd = f.systemd.calls();
    assert_eq!(
        &sd[sd.len() - 2..],
        &[
            "enable aks-flex-node-agent.service",
            "start aks-flex-node-agent.service"
        ]
    );
    assert!(marked(&f));
    assert_eq!(progress_on(&f.host), BootstrapProgress::Complete);
    // Idempotent: on a finished node (or one an older agent bootstrapped, units in place)
    // it only re-enables and re-starts the running service and rewrites the mark.
    let before = f.systemd.calls().len();
    finish_bootstrap(&f.host).await.unwrap();
    assert_eq!(
        f.systemd.calls()[before..],
        [
            "enable aks-flex-node-agent.service",
            "start aks-flex-node-agent.service"
        ]
    );
}
