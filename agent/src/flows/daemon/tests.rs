//! The daemon loop against a fake API server (`tower_test`), a fake machine client and a fake
//! machine layer, scenario by scenario: seed, Node watch events, status update conflicts, an
//! API server answering 500, a restart in the middle of a repave, node deletion, MachineOperation
//! items, serialization and shutdown.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinHandle;

use super::*;
use crate::config::GoDuration;
use crate::flows::operations::{Reconciler, ReconcilerConfig, RecordStore, RecordingHandlers};
use crate::flows::repave::{JOURNAL_PATH, Journal, Phase};
use crate::flows::start::GoalState;
use crate::goalclient::{Machine, MachineError, MachineStatus};
use crate::kubeclient::mock::{Log, Reply, Seen, seen, serve};
use crate::machine::fakes::RecordingOps;
use crate::state::{DaemonState, JsonStore, StateStore};
use flex_api::repave::DELETION_TAINT_KEY;
use flex_host::runner::Output;
use flex_testkit::FakeHost;

const NODE: &str = "flex-node-1";

type Seq = Arc<Mutex<Vec<String>>>;

fn push(seq: &Seq, s: impl Into<String>) {
    seq.lock().unwrap().push(s.into());
}

fn node_json(tainted: bool) -> Value {
    let taints = if tainted {
        json!([{"key": DELETION_TAINT_KEY, "value": "true", "effect": "NoSchedule"}])
    } else {
        json!([{"key": "dedicated", "value": "flex", "effect": "NoSchedule"}])
    };
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "resourceVersion": "5"},
        "spec": {"taints": taints}
    })
}

/// The fake API server's view of the cluster.
struct Sim {
    node: Option<Value>,
    get_failures: usize,
    watch: Option<oneshot::Receiver<Vec<u8>>>,
    seq: Seq,
    /// MachineOperations by name.
    ops: BTreeMap<String, Value>,
    /// The first MachineOperation watch's events, once the test sends them.
    ops_watch: Option<oneshot::Receiver<Vec<u8>>>,
    /// GETs of a MachineOperation that answer 500 first.
    op_get_failures: usize,
}

const OPS_PATH: &str = "/apis/unbounded-cloud.io/v1alpha3/machineoperations";

/// A MachineOperation `name` of `kind` for this node, Pending.
fn machine_op(name: &str, kind: &str) -> Value {
    json!({
        "apiVersion": "unbounded-cloud.io/v1alpha3", "kind": "MachineOperation",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "1", "generation": 1},
        "spec": {"machineRef": NODE, "operationKind": kind}
    })
}

/// RFC 7386 merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// The MachineOperation routes: list, watch, get, status merge patch (a new resourceVersion).
fn route_ops(sim: &mut Sim, s: &Seen) -> Reply {
    if s.method == "GET" && s.path() == OPS_PATH {
        if s.is_watch() {
            return match sim.ops_watch.take() {
                Some(rx) => Reply::Deferred(rx),
                None => Reply::Hold,
            };
        }
        let items: Vec<Value> = sim.ops.values().cloned().collect();
        return Reply::Json(
            200,
            json!({"apiVersion": "unbounded-cloud.io/v1alpha3", "kind": "MachineOperationList",
                   "metadata": {"resourceVersion": "10"}, "items": items}),
        );
    }
    let rest = s.path().strip_prefix(OPS_PATH).unwrap_or_default();
    let (name, sub) = match rest.trim_start_matches('/').split_once('/') {
        Some((n, sub)) => (n.to_string(), sub.to_string()),
        None => (rest.trim_start_matches('/').to_string(), String::new()),
    };
    let not_found = Reply::status(
        404,
        "NotFound",
        &format!("machineoperations {name:?} not found"),
    );
    match (s.method.as_str(), sub.as_str()) {
        ("GET", "") => {
            if sim.op_get_failures > 0 {
                sim.op_get_failures -= 1;
                return Reply::status(500, "InternalError", "etcdserver: request timed out");
            }
            sim.ops
                .get(&name)
                .map_or(not_found, |o| Reply::Json(200, o.clone()))
        }
        ("PATCH", "status") => {
            let Some(op) = sim.ops.get_mut(&name) else {
                return not_found;
            };
            let body: Value = serde_json::from_slice(&s.body).unwrap();
            merge(&mut op["status"], &body["status"]);
            let rv: u64 = op["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            op["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
            Reply::Json(200, op.clone())
        }
        _ => Reply::status(404, "NotFound", "no such route"),
    }
}

fn api(sim: Arc<Mutex<Sim>>) -> (kube::Client, Log, JoinHandle<()>) {
    serve(move |s| {
        let mut sim = sim.lock().unwrap();
        push(&sim.seq, format!("api {} {}", s.method, s.path()));
        if s.path().starts_with(OPS_PATH) {
            return route_ops(&mut sim, s);
        }
        if s.method == "GET" && s.path() == format!("/api/v1/nodes/{NODE}") {
            if sim.get_failures > 0 {
                sim.get_failures -= 1;
                return Reply::status(500, "InternalError", "etcdserver: request timed out");
            }
            return match &sim.node {
                Some(n) => Reply::Json(200, n.clone()),
                None => Reply::status(404, "NotFound", "nodes \"flex-node-1\" not found"),
            };
        }
        if s.method == "GET" && s.path() == "/api/v1/nodes" {
            if s.is_watch() {
                return match sim.watch.take() {
                    Some(rx) => Reply::Deferred(rx),
                    None => Reply::Hold,
                };
            }
            let items: Vec<Value> = sim.node.iter().cloned().collect();
            return Reply::Json(
                200,
                json!({"apiVersion": "v1", "kind": "NodeList",
                       "metadata": {"resourceVersion": "10"}, "items": items}),
            );
        }
        Reply::status(404, "NotFound", "no such route")
    })
}

#[derive(Default)]
struct MachinesState {
    machine: Option<Machine>,
    patch_failures: VecDeque<String>,
    patches: Vec<MachineStatus>,
}

struct FakeMachines {
    st: Arc<Mutex<MachinesState>>,
    seq: Seq,
}

#[async_trait]
impl MachineClient for FakeMachines {
    async fn get(&self) -> Result<Machine, MachineError> {
        match &self.st.lock().unwrap().machine {
            Some(m) => Ok(m.clone()),
            None => Err(MachineError::NotFound(NODE.into())),
        }
    }
    async fn create(&self, _goal: &GoalState) -> Result<Machine, MachineError> {
        Err(MachineError::Other(anyhow::anyhow!(
            "the daemon never creates"
        )))
    }
    async fn patch_status(&self, st: &MachineStatus) -> Result<(), MachineError> {
        push(
            &self.seq,
            format!(
                "patch {} {}",
                st.provisioning_state, st.observed_settings_version
            ),
        );
        let mut s = self.st.lock().unwrap();
        if let Some(f) = s.patch_failures.pop_front() {
            return Err(MachineError::Other(anyhow::anyhow!(f)));
        }
        s.patches.push(st.clone());
        Ok(())
    }
}

/// A machine layer that records calls and how many run at once.
#[derive(Clone, Default)]
struct Concurrency {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

impl Concurrency {
    async fn enter(&self) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

fn machine(settings: &str, kubernetes: &str) -> Machine {
    Machine {
        id: format!("/machines/{NODE}"),
        name: NODE.into(),
        goal: GoalState {
            kubernetes_version: kubernetes.into(),
            settings_version: settings.into(),
            max_pods: 110,
            ..Default::default()
        },
        status: MachineStatus::default(),
    }
}

fn state(settings: &str, active: &str) -> DaemonState {
    DaemonState {
        applied_settings_version: settings.into(),
        applied_kubernetes_version: "1.35.0".into(),
        active_machine: active.into(),
        ..Default::default()
    }
}

struct Setup {
    state: Option<DaemonState>,
    journal: Option<Journal>,
    machine: Option<Machine>,
    node: Option<Value>,
    get_failures: usize,
    patch_failures: Vec<String>,
    interval: Duration,
    operations: Option<Arc<dyn Operations>>,
    hold_watch: bool,
    files: Vec<(&'static str, Vec<u8>)>,
    conc: Concurrency,
    /// Real MachineOperations ([`ClusterOperations`] over the fake API server) with these
    /// handlers.
    handlers: Option<RecordingHandlers>,
    /// The MachineOperations the fake API server holds at start.
    machine_ops: Vec<Value>,
    /// Hold the first MachineOperation watch until the test releases it.
    hold_ops_watch: bool,
    /// Machine calls (as [`RecordingOps`] records them) that fail.
    failing_ops: Vec<&'static str>,
    /// Whether those failures are [`SeamError::Permanent`].
    ops_fail_permanently: bool,
    /// What proves the running agent after the first successful reconcile, built on the fake
    /// host.
    proven: Option<MakeProof>,
    /// Publish the agent's state on the Node through [`SeqPublisher`]; its first `n` writes fail.
    node_state: Option<usize>,
    /// Hold the node's work lock (a real `flock` on the fake host's root) before the daemon
    /// starts, as a node-local request would, until the test drops [`Harness::work_lock`].
    hold_work_lock: bool,
    /// The pods bound to the node, as the drain's fake seam shows them.
    pods: Vec<k8s_openapi::api::core::v1::Pod>,
    /// The Node is cordoned, by this agent for this owner (the drain's fake seam).
    cordoned_by: Option<&'static str>,
    /// The Node is not Ready (the drain's fake seam).
    not_ready: bool,
}

/// A [`NodeStatePublisher`] that logs each write into the sequence (`node <state> <reason>
/// <active machine> <goal version>`), failing its first writes as told.
struct SeqPublisher {
    seq: Seq,
    failures: Mutex<usize>,
}

#[async_trait]
impl NodeStatePublisher for SeqPublisher {
    async fn publish(
        &self,
        status: &flex_api::node_state::NodeAgentStatus,
        _transitioned_at: k8s_openapi::jiff::Timestamp,
    ) -> anyhow::Result<()> {
        let mut failures = self.failures.lock().unwrap();
        if *failures > 0 {
            *failures -= 1;
            push(
                &self.seq,
                format!("node-write-failed {}", status.state.as_str()),
            );
            anyhow::bail!("API server answered 503");
        }
        push(
            &self.seq,
            format!(
                "node {} {} {} {}",
                status.state.as_str(),
                status.reason,
                status.active_machine.as_deref().unwrap_or("-"),
                status.goal_version.as_deref().unwrap_or("-")
            ),
        );
        Ok(())
    }
}

/// Builds the proof on the fake host; it logs itself into the sequence.
type MakeProof = Box<dyn FnOnce(&FakeHost, Seq) -> Arc<dyn Proven>>;

/// A [`Proven`] that pushes `proof` into the sequence before it delegates.
struct Logged {
    seq: Seq,
    inner: Arc<dyn Proven>,
}

impl Proven for Logged {
    fn reconciled(&self) -> anyhow::Result<Option<String>> {
        push(&self.seq, "proof");
        self.inner.reconciled()
    }
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            state: Some(state("etag-1", "kube1")),
            journal: None,
            machine: Some(machine("etag-1", "1.35.0")),
            node: Some(node_json(false)),
            get_failures: 0,
            patch_failures: Vec::new(),
            interval: Duration::from_secs(3600),
            operations: None,
            hold_watch: false,
            files: Vec::new(),
            conc: Concurrency::default(),
            handlers: None,
            machine_ops: Vec::new(),
            hold_ops_watch: false,
            failing_ops: Vec::new(),
            ops_fail_permanently: false,
            proven: None,
            node_state: None,
            hold_work_lock: false,
            pods: Vec::new(),
            cordoned_by: None,
            not_ready: false,
        }
    }
}

struct Harness {
    /// The drain's seam, faked (a Ready node with no pods unless a test adds some).
    drain: crate::flows::drain::fakes::FakeNodeDrain,
    /// The daemon's metrics (real, rendered as the endpoint would).
    metrics: Arc<DaemonMetrics>,
    fake: FakeHost,
    sim: Arc<Mutex<Sim>>,
    machines: Arc<Mutex<MachinesState>>,
    ops: RecordingOps,
    conc: Concurrency,
    seq: Seq,
    log: Log,
    reports: mpsc::UnboundedReceiver<Report>,
    shutdown: CancellationToken,
    run: JoinHandle<anyhow::Result<()>>,
    release_watch: Option<oneshot::Sender<Vec<u8>>>,
    release_ops_watch: Option<oneshot::Sender<Vec<u8>>>,
    work_lock: Option<WorkLock>,
}

fn start(setup: Setup) -> Harness {
    let fake = FakeHost::new().unwrap();
    fake.runner.without("azcmagent");
    fake.runner.on("mountpoint", Output::failed(32, ""));
    fake.runner.on(
        "ip link show dev cni0",
        Output::failed(1, "Device \"cni0\" does not exist."),
    );
    let fs = fake.host.fs.clone();
    if let Some(s) = &setup.state {
        StateStore::new(fs.clone()).save(s).unwrap();
    }
    for (path, bytes) in &setup.files {
        fs.write_atomic(Path::new(path), bytes, 0o600).unwrap();
    }
    if let Some(j) = &setup.journal {
        JsonStore::<Journal>::at(fs.clone(), JOURNAL_PATH)
            .save(j)
            .unwrap();
    }
    let seq: Seq = Arc::default();
    let (release_tx, release_rx) = oneshot::channel();
    let (ops_release_tx, ops_release_rx) = oneshot::channel();
    let sim = Arc::new(Mutex::new(Sim {
        node: setup.node,
        get_failures: setup.get_failures,
        watch: setup.hold_watch.then_some(release_rx),
        seq: seq.clone(),
        ops: setup
            .machine_ops
            .iter()
            .map(|o| {
                (
                    o["metadata"]["name"].as_str().unwrap().to_string(),
                    o.clone(),
                )
            })
            .collect(),
        ops_watch: setup.hold_ops_watch.then_some(ops_release_rx),
        op_get_failures: 0,
    }));
    let (client, log, _server) = api(sim.clone());
    let machines = Arc::new(Mutex::new(MachinesState {
        machine: setup.machine,
        patch_failures: setup.patch_failures.into(),
        patches: Vec::new(),
    }));
    let conc = setup.conc.clone();
    let ops = {
        let (seq, conc) = (seq.clone(), conc.clone());
        let failing = RecordingOps::failing_each(&setup.failing_ops);
        let failing = if setup.ops_fail_permanently {
            failing.permanently()
        } else {
            failing
        };
        failing.observed(Arc::new(move |call| {
            let (seq, conc) = (seq.clone(), conc.clone());
            Box::pin(async move {
                conc.enter().await;
                push(&seq, format!("ops {call}"));
            })
        }))
    };
    let mut cfg = Config::default();
    cfg.agent.node_name = NODE.into();
    cfg.agent.machine_reconcile_interval = GoDuration(setup.interval);
    let (tx, reports) = mpsc::unbounded_channel();
    let metrics = Arc::new(DaemonMetrics::new("0.3.0"));
    let mut daemon = Daemon::new(
        fake.host.clone(),
        &cfg,
        KubeClients::fixed(client.clone()),
        Arc::new(FakeMachines {
            st: machines.clone(),
            seq: seq.clone(),
        }),
        Arc::new(ops.clone()),
    )
    .with_backoff(Backoff::new(
        u32::MAX,
        Duration::from_millis(20),
        Duration::from_millis(200),
    ))
    .with_timings(Timings::instant())
    .with_rng(|| 1.0)
    .with_reports(tx)
    .with_metrics(metrics.clone());
    // The drain's seam (the Node and its pods) is faked: a Ready node with no pods.
    let mut fake_node =
        crate::flows::drain::fakes::node(NODE, setup.cordoned_by.is_some(), setup.cordoned_by);
    if setup.not_ready {
        set_ready(&mut fake_node, false);
    }
    let drain = crate::flows::drain::fakes::FakeNodeDrain::new(fake_node, setup.pods.clone());
    daemon = daemon.with_drain(
        crate::flows::drain::NodeDrain::new(
            KubeClients::fixed(client.clone()),
            NODE,
            Default::default(),
        )
        .with_api(
            drain.factory(),
            crate::flows::drain::DrainTimings {
                ready_timeout: Duration::from_millis(200),
                ready_poll: Duration::from_millis(10),
                ..Default::default()
            },
        ),
    );
    if let Some(o) = setup.operations {
        daemon = daemon.with_operations(o);
    }
    if let Some(p) = setup.proven {
        daemon = daemon.with_proven(p(&fake, seq.clone()));
    }
    if let Some(failures) = setup.node_state {
        let publisher = SeqPublisher {
            seq: seq.clone(),
            failures: Mutex::new(failures),
        };
        daemon = daemon.with_node_state(Arc::new(Reporter::new(Arc::new(publisher), "0.3.0")));
    }
    if let Some(handlers) = setup.handlers {
        daemon = daemon.with_operations(Arc::new(cluster_operations(
            client.clone(),
            &fake,
            handlers,
            metrics.clone(),
        )));
    }
    let work_lock = setup
        .hold_work_lock
        .then(|| WorkLock::try_acquire(&fake.host.fs).unwrap().unwrap());
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(daemon.run(shutdown.clone()));
    Harness {
        drain,
        metrics,
        work_lock,
        fake,
        sim,
        machines,
        ops,
        conc,
        seq,
        log,
        reports,
        shutdown,
        run,
        release_watch: setup.hold_watch.then_some(release_tx),
        release_ops_watch: setup.hold_ops_watch.then_some(ops_release_tx),
    }
}

/// The real MachineOperation hook over `client`, for this node, with its records on `fake`'s
/// root and `handlers`.
fn cluster_operations(
    client: kube::Client,
    fake: &FakeHost,
    handlers: RecordingHandlers,
    metrics: Arc<DaemonMetrics>,
) -> ClusterOperations {
    let cfg = ReconcilerConfig {
        machine_name: NODE.into(),
        node_name: NODE.into(),
        records: RecordStore::new(fake.host.fs.clone()),
        containerized: false,
        drain: Default::default(),
    };
    ClusterOperations::with_reconciler(
        KubeClients::fixed(client),
        NODE,
        Reconciler::new(cfg, Arc::new(handlers))
            .with_metrics(metrics)
            .with_drain(
                crate::flows::drain::fakes::FakeNodeDrain::quiet(NODE).factory(),
                Default::default(),
            ),
    )
}

/// The samples of `metrics` whose line starts with `prefix`, sorted.
fn samples(metrics: &DaemonMetrics, prefix: &str) -> Vec<String> {
    flex_metrics::samples(&metrics.render(), prefix)
}

impl Harness {
    /// Reports until one matches `pred` (included).
    async fn until(&mut self, pred: impl Fn(&Report) -> bool) -> Vec<Report> {
        let mut out = Vec::new();
        let deadline = tokio::time::sleep(Duration::from_secs(20));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                r = self.reports.recv() => {
                    let r = r.expect("daemon stopped before the expected report");
                    let done = pred(&r);
                    out.push(r);
                    if done {
                        return out;
                    }
                }
                _ = &mut deadline => panic!("timed out; reports so far: {out:#?}"),
            }
        }
    }

    async fn stop(self) -> Self {
        self.shutdown.cancel();
        let r = tokio::time::timeout(Duration::from_secs(10), &mut { self.run })
            .await
            .expect("daemon stops on shutdown");
        r.unwrap().unwrap();
        Self {
            run: tokio::spawn(async { Ok(()) }),
            ..self
        }
    }

    fn patches(&self) -> Vec<(String, String, String)> {
        self.machines
            .lock()
            .unwrap()
            .patches
            .iter()
            .map(|p| {
                (
                    p.provisioning_state.clone(),
                    p.observed_settings_version.clone(),
                    p.message.clone(),
                )
            })
            .collect()
    }

    fn calls(&self) -> Vec<String> {
        self.ops.calls()
    }

    fn state(&self) -> Option<DaemonState> {
        StateStore::new(self.fake.host.fs.clone()).load().unwrap()
    }

    /// Nothing was done to the host: no machine operation, command or systemd call.
    fn assert_host_untouched(&self) {
        assert!(self.calls().is_empty(), "machine ops: {:?}", self.calls());
        assert!(
            self.fake.runner.calls().is_empty(),
            "{:?}",
            self.fake.runner.calls()
        );
        assert!(
            self.fake.systemd.calls().is_empty(),
            "{:?}",
            self.fake.systemd.calls()
        );
    }
}

fn is(action: Action) -> impl Fn(&Report) -> bool {
    move |r| r.decision.map(|d| d.action) == Some(action)
}

fn owned(v: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    v.iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect()
}

fn assert_all(patches: &[(String, String, String)], want: (&str, &str, &str)) {
    let want = owned(&[want]).remove(0);
    assert!(
        patches.iter().all(|p| *p == want),
        "{patches:#?}, want only {want:?}"
    );
}

/// A pair file as kubelet keeps it (key, then certificate) for this node, valid a year on.
fn kubelet_pair() -> Vec<u8> {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::CommonName, format!("system:node:{NODE}"));
    params.distinguished_name = dn;
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let day = Duration::from_secs(24 * 3600);
    params.not_before = epoch + (now - day);
    params.not_after = epoch + (now + 365 * day);
    let cert = params.self_signed(&key).unwrap().pem();
    format!("{}{cert}", key.serialize_pem()).into_bytes()
}

/// A reconcile that finds the node as it should be removes the bootstrap token's kubeconfig
/// from the active machine once kubelet holds its credential there (a first join does not leave
/// the token in the machine until its next start), and only then. Real files on the fake host's
/// file system.
#[tokio::test]
async fn a_reconcile_removes_the_tokens_kubeconfig_once_kubelet_holds_its_credential() {
    let bootstrap = "/var/lib/machines/kube1/var/lib/kubelet/bootstrap-kubeconfig";
    let current = "/var/lib/machines/kube1/var/lib/kubelet/pki/kubelet-client-current.pem";
    for joined in [false, true] {
        let mut files = vec![(bootstrap, b"token: abcdef.0123456789abcdef\n".to_vec())];
        if joined {
            files.push((current, kubelet_pair()));
        }
        let mut h = start(Setup {
            files,
            ..Setup::default()
        });
        h.until(is(Action::ReportSucceeded)).await;
        let fs = h.fake.host.fs.clone();
        let h = h.stop().await;
        assert_eq!(fs.exists(Path::new(bootstrap)), !joined, "joined: {joined}");
        drop(h);
    }
}

#[tokio::test]
async fn seed_reports_succeeded_and_watches_only_its_node() {
    let mut h = start(Setup::default());
    let reports = h.until(is(Action::ReportSucceeded)).await;
    assert_eq!(
        reports[0].item,
        Item::Repave {
            source: RepaveSource::Seed
        }
    );
    // The seed and the watch's first list each report it.
    assert_all(
        &h.patches(),
        ("Succeeded", "etag-1", "goal state is applied"),
    );
    h.assert_host_untouched();
    // The Node watch lists and watches this node only.
    let h = h.stop().await;
    let node_reads: Vec<_> = seen(&h.log)
        .into_iter()
        .filter(|r| r.path() == "/api/v1/nodes")
        .collect();
    assert!(!node_reads.is_empty());
    for r in node_reads {
        assert!(
            r.uri.contains("fieldSelector=metadata.name%3Dflex-node-1"),
            "{}",
            r.uri
        );
    }
}

#[tokio::test]
async fn the_machine_is_reread_after_the_interval_plus_jitter() {
    let mut h = start(Setup {
        interval: Duration::from_millis(200),
        ..Default::default()
    });
    let first = h.until(is(Action::ReportSucceeded)).await;
    let seed_at = first.last().unwrap().at;
    let next = h
        .until(|r| {
            r.item
                == Item::Repave {
                    source: RepaveSource::Interval,
                }
        })
        .await;
    let elapsed = next.last().unwrap().at - seed_at;
    // rng() = 1.0: the full tenth of jitter.
    assert!(elapsed >= Duration::from_millis(220), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    assert_eq!(
        next.last().unwrap().decision.unwrap().action,
        Action::ReportSucceeded
    );
    h.stop().await;
}

#[tokio::test]
async fn node_deletion_with_goal_drift_applies_the_goal_state() {
    // The goal moved to etag-2 / 1.35.3; the Node is there, so the daemon waits.
    let mut h = start(Setup {
        machine: Some(machine("etag-2", "1.35.3")),
        hold_watch: true,
        ..Default::default()
    });
    h.until(is(Action::WaitForNodeSignal)).await;
    assert!(h.calls().is_empty());
    assert!(h.patches().is_empty());

    // The Node is deleted: the watch says so.
    h.sim.lock().unwrap().node = None;
    let bytes = match Reply::events(&[("DELETED", node_json(false))]) {
        Reply::Raw(b) => b,
        _ => unreachable!(),
    };
    h.release_watch.take().unwrap().send(bytes).unwrap();
    let reports = h.until(is(Action::ApplyGoalState)).await;
    assert_eq!(
        reports.last().unwrap().item,
        Item::Repave {
            source: RepaveSource::NodeChange
        }
    );
    assert_eq!(
        h.calls(),
        vec![
            "provision kube2 1.35.3",
            "stop kube1",
            "start kube2",
            "cleanup kube1"
        ]
    );
    assert_eq!(
        h.patches(),
        owned(&[
            ("Reconciling", "etag-1", "applying machine goal state"),
            ("Succeeded", "etag-2", "machine goal state applied"),
        ])
    );
    let st = h.state().unwrap();
    assert_eq!(st.active_machine, "kube2");
    assert_eq!(st.applied_settings_version, "etag-2");
    assert_eq!(st.previous_settings_version, "etag-1");
    assert!(!h.fake.host.fs.exists(Path::new(JOURNAL_PATH)));
    assert_eq!(h.conc.max.load(Ordering::SeqCst), 1);
    assert_eq!(
        samples(&h.metrics, "aks_flex_node_repaves_total"),
        ["aks_flex_node_repaves_total{result=\"Succeeded\",phase=\"done\"} 1"]
    );
    assert_eq!(
        samples(&h.metrics, "aks_flex_node_active_machine"),
        [
            "aks_flex_node_active_machine{machine=\"kube1\"} 0",
            "aks_flex_node_active_machine{machine=\"kube2\"} 1"
        ]
    );
    h.stop().await;
}

#[tokio::test]
async fn a_conflict_on_the_status_update_is_retried_before_the_host_is_touched() {
    let conflict = "patch machine status: API server answered 409 Conflict: the object has been modified; please apply your changes to the latest version";
    let mut h = start(Setup {
        machine: Some(machine("etag-2", "1.35.3")),
        node: None,
        patch_failures: vec![conflict.into()],
        ..Default::default()
    });
    let reports = h.until(|r| r.error.is_some()).await;
    let failed = reports.last().unwrap();
    let err = failed.error.clone().unwrap();
    assert!(
        err.starts_with("report machine status Reconciling: "),
        "{err}"
    );
    assert!(err.contains("409 Conflict"), "{err}");
    assert_eq!(failed.retry_in, Some(Duration::from_millis(20)));
    // The conflict stopped the apply before anything ran.
    assert!(h.calls().is_empty());

    h.until(is(Action::ApplyGoalState)).await;
    assert_eq!(h.calls().len(), 4);
    assert_eq!(
        h.patches()[..2].to_vec(),
        owned(&[
            ("Reconciling", "etag-1", "applying machine goal state"),
            ("Succeeded", "etag-2", "machine goal state applied"),
        ])
    );
    // Later reconciles find the goal applied.
    assert_all(
        &h.patches()[2..],
        (
            "Succeeded",
            "etag-2",
            "node is absent but goal state is already applied",
        ),
    );
    h.stop().await;
}

#[tokio::test]
async fn api_server_errors_back_off_and_do_nothing_to_the_host() {
    let mut h = start(Setup {
        machine: Some(machine("etag-2", "1.35.3")),
        get_failures: 3,
        ..Default::default()
    });
    let seed = Item::Repave {
        source: RepaveSource::Seed,
    };
    let mut attempts: Vec<Report> = Vec::new();
    while attempts.last().is_none_or(|r| r.error.is_some()) {
        let mut got = h.until(|r| r.item == seed).await;
        attempts.push(got.pop().unwrap());
    }
    let errors: Vec<&Report> = attempts.iter().filter(|r| r.error.is_some()).collect();
    assert!(!errors.is_empty());
    for r in &errors {
        assert_eq!(
            r.error.as_deref(),
            Some(
                "get node flex-node-1: API server answered 500 InternalError: etcdserver: request timed out"
            )
        );
    }
    // Exponential backoff between attempts of the same work.
    for (i, pair) in attempts.windows(2).enumerate() {
        let waited = pair[1].at - pair[0].at;
        let want = pair[0].retry_in.unwrap();
        assert_eq!(want, Duration::from_millis(20) * (1 << i));
        assert!(
            waited >= want,
            "attempt {i}: waited {waited:?}, backoff {want:?}"
        );
    }
    assert_eq!(
        attempts.last().unwrap().decision.unwrap().action,
        Action::WaitForNodeSignal
    );
    h.assert_host_untouched();
    assert!(h.patches().is_empty());
    h.stop().await;
}

/// The daemon over the recording machine fake, whose provision fails transiently or
/// permanently (as a wrong Kubernetes version or image reference would), and a fake API server:
/// a transient failure is retried with backoff, a permanent one waits for the next interval.
#[tokio::test]
async fn a_goal_that_cannot_be_provisioned_waits_for_the_next_interval_not_the_backoff() {
    for permanent in [false, true] {
        let mut h = start(Setup {
            machine: Some(machine("etag-2", "1.35.3")),
            node: None,
            failing_ops: vec!["provision kube2 1.35.3"],
            ops_fail_permanently: permanent,
            ..Default::default()
        });
        let seed = Item::Repave {
            source: RepaveSource::Seed,
        };
        let first = h.until(|r| r.item == seed).await.pop().unwrap();
        assert_eq!(first.permanent, permanent);
        assert_eq!(
            first.error.as_deref(),
            Some(
                "apply machine goal state: provision kube2 failed, rolled back to kube1: injected failure of provision kube2 1.35.3"
            )
        );
        assert!(
            h.patches().iter().any(|p| p.0 == "Failed"),
            "the machine status says so: {:?}",
            h.patches()
        );
        if permanent {
            // The interval (1 h in these tests) plus its jitter (rng 1.0: a tenth).
            assert_eq!(first.retry_in, Some(Duration::from_secs(3960)));
            tokio::time::sleep(Duration::from_millis(300)).await;
            // Only a Node change (the watch's first listing) runs it again.
            while let Ok(r) = h.reports.try_recv() {
                assert_eq!(
                    r.item,
                    Item::Repave {
                        source: RepaveSource::NodeChange
                    },
                    "no retry before the interval"
                );
            }
        } else {
            assert_eq!(first.retry_in, Some(Duration::from_millis(20)));
            let second = h.until(|r| r.item == seed).await.pop().unwrap();
            assert!(second.at - first.at >= Duration::from_millis(20));
            assert_eq!(second.retry_in, Some(Duration::from_millis(40)));
        }
        assert_eq!(h.state().unwrap().active_machine, "kube1");
        let class = if permanent { "permanent" } else { "transient" };
        let errors = samples(&h.metrics, "aks_flex_node_reconcile_errors_total");
        assert!(
            errors.iter().any(|l| l.starts_with(&format!(
                "aks_flex_node_reconcile_errors_total{{item=\"repave\",class=\"{class}\"}} "
            ))),
            "{errors:?}"
        );
        assert!(
            samples(&h.metrics, "aks_flex_node_repaves_total")
                .iter()
                .any(|l| l.starts_with(
                    "aks_flex_node_repaves_total{result=\"RolledBack\",phase=\"preparing\"} "
                )),
            "{}",
            h.metrics.render()
        );
        h.stop().await;
    }
}

#[tokio::test]
async fn a_restart_in_the_middle_of_a_repave_resumes_it_before_any_event() {
    // The daemon died after stopping kube1, while starting kube2.
    let mut h = start(Setup {
        state: Some(state("etag-1", "kube1")),
        journal: Some(Journal {
            version: 1,
            source: "kube1".into(),
            target: "kube2".into(),
            settings_version: "etag-2".into(),
            kubernetes_version: "1.35.3".into(),
            phase: Phase::Starting,
            drain: false,
        }),
        machine: Some(machine("etag-2", "1.35.3")),
        ..Default::default()
    });
    h.until(is(Action::ReportSucceeded)).await;
    assert_eq!(h.calls(), vec!["start kube2", "cleanup kube1"]);
    let seq = h.seq.lock().unwrap().clone();
    let first_api = seq.iter().position(|s| s.starts_with("api ")).unwrap();
    let last_op = seq.iter().rposition(|s| s.starts_with("ops ")).unwrap();
    assert!(last_op < first_api, "{seq:#?}");
    assert_all(
        &h.patches(),
        ("Succeeded", "etag-2", "goal state is applied"),
    );
    assert_eq!(h.state().unwrap().active_machine, "kube2");
    h.stop().await;
}

/// A daemon that cannot reach its cluster (nothing listens at its API server) still finishes an
/// interrupted repave at its start: real state and journal files on the fake host's root, the
/// machines faked, the cluster unreachable for real (a closed local port).
#[tokio::test]
async fn an_interrupted_repave_is_resumed_before_the_cluster_is_reached() {
    let fake = FakeHost::new().unwrap();
    let fs = fake.host.fs.clone();
    StateStore::new(fs.clone())
        .save(&state("etag-1", "kube1"))
        .unwrap();
    JsonStore::<Journal>::at(fs.clone(), JOURNAL_PATH)
        .save(&Journal {
            version: 1,
            source: "kube1".into(),
            target: "kube2".into(),
            settings_version: "local-2".into(),
            kubernetes_version: "1.35.0".into(),
            phase: Phase::Starting,
            drain: false,
        })
        .unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut cfg = Config::default();
    cfg.agent.node_name = NODE.into();
    cfg.node.kubelet.cluster_fqdn = format!("127.0.0.1:{port}");
    let ops = RecordingOps::default();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (host, ops, shutdown) = (fake.host.clone(), ops.clone(), shutdown.clone());
        async move {
            run_with_ops(
                host,
                &cfg,
                Arc::new(ops),
                |_, _, _| Ok(None),
                None,
                Arc::new(DaemonMetrics::default()),
                shutdown,
            )
            .await
        }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while ops.calls().len() < 2 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(20), run).await;
    assert_eq!(ops.calls(), vec!["start kube2", "cleanup kube1"]);
    let st = StateStore::new(fs.clone()).load().unwrap().unwrap();
    assert_eq!(st.active_machine, "kube2");
    assert_eq!(
        JsonStore::<Journal>::at(fs, JOURNAL_PATH).load().unwrap(),
        None
    );
}

/// A node-local request (`aks-flex-node repave`) holding the work lock (a real `flock` on the
/// fake host's root; machines and API server faked) holds back the daemon's resume of an
/// interrupted repave and its queue items until it lets go.
#[tokio::test]
async fn the_daemon_waits_for_a_node_local_request_holding_the_work_lock() {
    let interrupted = Journal {
        version: 1,
        source: "kube1".into(),
        target: "kube2".into(),
        settings_version: "etag-2".into(),
        kubernetes_version: "1.35.3".into(),
        phase: Phase::Starting,
        drain: false,
    };
    for (journal, machine, want_calls) in [
        (None, machine("etag-1", "1.35.0"), vec![]),
        (
            Some(interrupted),
            machine("etag-2", "1.35.3"),
            vec!["start kube2", "cleanup kube1"],
        ),
    ] {
        let mut h = start(Setup {
            journal,
            machine: Some(machine),
            hold_work_lock: true,
            ..Default::default()
        });
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(h.calls().is_empty(), "{:?}", h.calls());
        assert!(h.reports.try_recv().is_err(), "an item ran under the lock");
        drop(h.work_lock.take());
        h.until(is(Action::ReportSucceeded)).await;
        assert_eq!(h.calls(), want_calls);
        h.stop().await;
    }
}

#[tokio::test]
async fn deletion_taint_and_machine_gone_reset_the_node_and_uninstall_the_service() {
    let mut h = start(Setup {
        machine: None,
        node: Some(node_json(true)),
        pods: vec![crate::flows::drain::fakes::pod("default", "web")],
        ..Default::default()
    });
    let fs = h.fake.host.fs.clone();
    fs.write_atomic(Path::new("/etc/aks-flex-node/config.json"), b"{}", 0o600)
        .unwrap();
    fs.write_atomic(
        Path::new(crate::systemd::AGENT_UNIT_PATH),
        b"[Unit]\n",
        0o644,
    )
    .unwrap();
    let reports = h.until(is(Action::ResetDelete)).await;
    assert!(reports.last().unwrap().error.is_none());
    // The daemon returns on its own.
    let run = std::mem::replace(&mut h.run, tokio::spawn(async { Ok(()) }));
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("daemon returns after the reset")
        .unwrap()
        .unwrap();
    let systemd = h.fake.systemd.calls();
    let unit = crate::systemd::AGENT_UNIT;
    let uninstall = systemd
        .iter()
        .position(|c| *c == format!("disable {unit}"))
        .unwrap();
    // The stop comes last: it may end the daemon itself.
    assert_eq!(
        systemd[uninstall..].to_vec(),
        vec![
            format!("disable {unit}"),
            "daemon-reload".to_string(),
            format!("stop {unit}"),
        ]
    );
    // Reset ran first: machines, runtime directories.
    assert!(systemd[..uninstall].contains(&"daemon-reload".to_string()));
    // Before it, the node was cordoned and drained; it stays cordoned (it leaves the cluster).
    assert!(h.drain.calls().contains(&"evict default/web".to_string()));
    assert_eq!(
        h.drain.cordon(),
        (true, Some(crate::flows::drain::DELETION_OWNER.into()))
    );
    assert!(!h.fake.runner.calls().is_empty());
    assert!(!fs.exists(Path::new("/etc/aks-flex-node")));
    assert!(!fs.exists(Path::new(crate::systemd::AGENT_UNIT_PATH)));
    // The Node is left alone and no status is reported; no repave either.
    assert!(seen(&h.log).iter().all(|r| r.method == "GET"));
    assert!(h.patches().is_empty());
    assert!(h.calls().is_empty());
}

fn set_ready(n: &mut k8s_openapi::api::core::v1::Node, ready: bool) {
    n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status =
        if ready { "True" } else { "False" }.into();
}

/// A node not Ready after an operation keeps its cordon and its (stuck) disruption slot; once
/// it is Ready, the next time the machine comes round lifts both, without a restart.
#[tokio::test]
async fn a_cordon_and_slot_kept_while_not_ready_are_lifted_when_the_machine_comes_round_ready() {
    let mut h = start(Setup {
        interval: Duration::from_millis(200),
        cordoned_by: Some("uid-of-a-reboot-not-ready"),
        not_ready: true,
        ..Default::default()
    });
    let holder = serde_json::to_string(&flex_api::budget::Holder {
        owner: "uid-of-a-reboot-not-ready".into(),
        acquired: "2000-01-01T00:00:00Z".into(),
        renewed: "2000-01-01T00:00:00Z".into(),
        stuck: true,
    })
    .unwrap();
    h.drain.state().budget = Some((1, [(format!("holder.{NODE}"), holder)].into()));
    h.until(is(Action::ReportSucceeded)).await;
    assert_eq!(
        h.drain.cordon(),
        (true, Some("uid-of-a-reboot-not-ready".into()))
    );
    assert!(h.drain.holder(NODE).is_some());
    set_ready(h.drain.state().node.as_mut().unwrap(), true);
    h.until(|r| {
        r.item
            == Item::Repave {
                source: RepaveSource::Interval,
            }
    })
    .await;
    assert_eq!(h.drain.cordon(), (false, None));
    assert!(h.drain.holder(NODE).is_none(), "the stuck slot is freed");
    h.stop().await;
}

#[tokio::test]
async fn the_daemon_lifts_a_cordon_of_work_that_no_longer_runs_before_its_first_reconcile() {
    let mut h = start(Setup {
        cordoned_by: Some("uid-of-an-operation-long-finished"),
        ..Default::default()
    });
    h.until(is(Action::ReportSucceeded)).await;
    assert_eq!(h.drain.cordon(), (false, None));
    assert_eq!(
        h.drain.calls()[..2],
        ["node".to_string(), "node".to_string()],
        "read, then read again by the release"
    );
    h.stop().await;
}

#[tokio::test]
async fn deletion_taint_with_the_machine_still_there_waits() {
    let mut h = start(Setup {
        node: Some(node_json(true)),
        ..Default::default()
    });
    h.until(is(Action::WaitForMachineDelete)).await;
    h.assert_host_untouched();
    h.stop().await;
}

/// A MachineOperation reconciler that feeds `names` and records runs.
struct FakeOperations {
    names: Vec<String>,
    runs: Arc<Mutex<Vec<String>>>,
    conc: Concurrency,
    gate: Arc<Notify>,
    gated: Option<String>,
    entered: Arc<AtomicUsize>,
    outcome: Mutex<VecDeque<(String, OperationOutcome)>>,
}

#[async_trait]
impl Operations for FakeOperations {
    async fn watch(&self, queue: QueueSender, shutdown: CancellationToken) -> anyhow::Result<()> {
        for n in &self.names {
            queue.operation(n.clone());
        }
        shutdown.cancelled().await;
        Ok(())
    }
    async fn reconcile(&self, name: &str) -> Result<OperationOutcome, SeamError> {
        if self.gated.as_deref() == Some(name) {
            self.entered.fetch_add(1, Ordering::SeqCst);
            self.gate.notified().await;
        }
        self.conc.enter().await;
        self.runs.lock().unwrap().push(name.to_string());
        let mut o = self.outcome.lock().unwrap();
        match o.front() {
            Some((n, out)) if n == name => {
                let out = *out;
                o.pop_front();
                Ok(out)
            }
            _ => Ok(OperationOutcome::Done),
        }
    }
}

#[tokio::test]
async fn operations_and_repaves_run_one_at_a_time() {
    let conc = Concurrency::default();
    let runs: Arc<Mutex<Vec<String>>> = Arc::default();
    let ops = Arc::new(FakeOperations {
        names: vec!["op-a".into(), "op-b".into(), "op-a".into(), "op-c".into()],
        runs: runs.clone(),
        conc: conc.clone(),
        gate: Arc::default(),
        gated: None,
        entered: Arc::default(),
        // op-b's TTL has not expired yet: reconcile it again later.
        outcome: Mutex::new(VecDeque::from([(
            "op-b".to_string(),
            OperationOutcome::RequeueAfter(Duration::from_millis(30)),
        )])),
    });
    // One concurrency counter for the machine layer and the operations.
    let mut h = start(Setup {
        machine: Some(machine("etag-2", "1.35.3")),
        node: None,
        operations: Some(ops),
        conc: conc.clone(),
        ..Default::default()
    });
    let op_b = Item::Operation {
        name: "op-b".into(),
    };
    let mut reports = h.until(|r| r.item == op_b).await;
    reports.extend(h.until(|r| r.item == op_b).await);
    if !reports.iter().any(is(Action::ApplyGoalState)) {
        reports.extend(h.until(is(Action::ApplyGoalState)).await);
    }
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.iter().filter(|n| *n == "op-b").count(), 2, "{runs:?}");
    assert_eq!(runs.iter().filter(|n| *n == "op-a").count(), 1, "{runs:?}");
    assert_eq!(runs.iter().filter(|n| *n == "op-c").count(), 1, "{runs:?}");
    assert_eq!(conc.max.load(Ordering::SeqCst), 1);
    let h = h.stop().await;
    assert_eq!(h.calls().len(), 4);
}

#[tokio::test]
async fn shutdown_finishes_the_current_item_then_stops() {
    let gate = Arc::new(Notify::new());
    let entered: Arc<AtomicUsize> = Arc::default();
    let runs: Arc<Mutex<Vec<String>>> = Arc::default();
    let ops = Arc::new(FakeOperations {
        names: vec!["slow".into(), "after".into()],
        runs: runs.clone(),
        conc: Concurrency::default(),
        gate: gate.clone(),
        gated: Some("slow".into()),
        entered: entered.clone(),
        outcome: Mutex::new(VecDeque::new()),
    });
    let mut h = start(Setup {
        operations: Some(ops),
        ..Default::default()
    });
    // "slow" is running (waiting on the gate); SIGTERM arrives.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while entered.load(Ordering::SeqCst) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "slow never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    h.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!h.run.is_finished(), "the current item is not cut short");
    gate.notify_one();
    let run = std::mem::replace(&mut h.run, tokio::spawn(async { Ok(()) }));
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("stops")
        .unwrap()
        .unwrap();
    assert_eq!(runs.lock().unwrap().clone(), vec!["slow"]);
}

#[tokio::test]
async fn an_operation_that_stops_the_daemon_uninstalls_the_service() {
    let ops = Arc::new(FakeOperations {
        names: vec!["reset-1".into()],
        runs: Arc::default(),
        conc: Concurrency::default(),
        gate: Arc::default(),
        gated: None,
        entered: Arc::default(),
        outcome: Mutex::new(VecDeque::from([(
            "reset-1".to_string(),
            OperationOutcome::StopDaemon,
        )])),
    });
    let mut h = start(Setup {
        operations: Some(ops),
        ..Default::default()
    });
    h.until(|r| {
        r.item
            == Item::Operation {
                name: "reset-1".into(),
            }
    })
    .await;
    let run = std::mem::replace(&mut h.run, tokio::spawn(async { Ok(()) }));
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("stops")
        .unwrap()
        .unwrap();
    let unit = crate::systemd::AGENT_UNIT;
    assert_eq!(
        h.fake.systemd.calls(),
        vec![
            format!("disable {unit}"),
            "daemon-reload".to_string(),
            format!("stop {unit}"),
        ]
    );
}

#[tokio::test]
async fn an_unreadable_state_reports_failed_as_permanent_and_comes_round_again() {
    // A state file without its checksum: reading it again fails the same way, so the failure is
    // permanent (no backoff storm); the reconcile still comes round on its period.
    let mut h = start(Setup {
        state: None,
        files: vec![(crate::state::STATE_PATH, b"{}\n".to_vec())],
        ..Default::default()
    });
    let reports = h.until(|r| r.error.is_some()).await;
    let failed = reports.last().unwrap();
    let err = failed.error.clone().unwrap();
    assert!(
        err.starts_with(
            "load daemon state: read record checksum /etc/aks-flex-node/daemon-state.json.sha256"
        ),
        "{err}"
    );
    assert!(failed.permanent, "{failed:?}");
    assert!(failed.retry_in.is_some());
    let patches = h.patches();
    assert_eq!(patches[0].0, "Failed");
    assert_eq!(patches[0].1, "");
    assert_eq!(patches[0].2, err);
    h.assert_host_untouched();
    h.stop().await;
}

#[tokio::test]
async fn an_expired_watch_410_is_logged_and_relisted_with_nothing_done_to_the_host() {
    let logs = crate::kubeclient::mock::LogCapture::start();
    let mut h = start(Setup {
        hold_watch: true,
        ..Default::default()
    });
    h.until(is(Action::ReportSucceeded)).await;
    let lists = |h: &Harness| {
        seen(&h.log)
            .iter()
            .filter(|r| r.path() == "/api/v1/nodes" && !r.is_watch())
            .count()
    };
    assert_eq!(lists(&h), 1);
    let bytes = match Reply::events(&[(
        "ERROR",
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "message": "too old resource version: 10 (20)", "reason": "Expired", "code": 410}),
    )]) {
        Reply::Raw(b) => b,
        _ => unreachable!(),
    };
    h.release_watch.take().unwrap().send(bytes).unwrap();
    // The watcher relists after its backoff; the relist queues a node-change reconcile.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while lists(&h) < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no relist");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.until(|r| {
        r.item
            == Item::Repave {
                source: RepaveSource::NodeChange,
            }
    })
    .await;
    let text = logs.text();
    assert!(
        text.contains("node watch failed; retrying with backoff"),
        "{text}"
    );
    assert!(
        text.contains("API server answered 410 Expired: too old resource version: 10 (20)"),
        "{text}"
    );
    h.assert_host_untouched();
    h.stop().await;
}

fn op_item(name: &str) -> Item {
    Item::Operation { name: name.into() }
}

/// Real: the daemon loop and queue, the MachineOperation watch and reconciler
/// ([`ClusterOperations`]), the decision table, the records on a temporary root. Faked: the API
/// server, the machine client, the machine layer and the operation handlers.
#[tokio::test]
async fn a_watched_machine_operation_is_reconciled_through_the_queue() {
    let handlers = RecordingHandlers::new();
    let mut h = start(Setup {
        handlers: Some(handlers.clone()),
        hold_ops_watch: true,
        ..Default::default()
    });
    h.until(is(Action::ReportSucceeded)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !seen(&h.log)
        .iter()
        .any(|r| r.path() == OPS_PATH && !r.is_watch())
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no MachineOperation list"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(handlers.calls().is_empty());
    // An operation for this node appears after the list: the watch says so.
    let op = machine_op("reboot-1", "NodeReboot");
    h.sim
        .lock()
        .unwrap()
        .ops
        .insert("reboot-1".into(), op.clone());
    let bytes = match Reply::events(&[("ADDED", op)]) {
        Reply::Raw(b) => b,
        _ => unreachable!(),
    };
    h.release_ops_watch.take().unwrap().send(bytes).unwrap();
    let reports = h.until(|r| r.item == op_item("reboot-1")).await;
    assert_eq!(reports.last().unwrap().error, None);
    assert_eq!(handlers.calls(), vec!["node_reboot"]);
    let stored = h.sim.lock().unwrap().ops["reboot-1"].clone();
    assert_eq!(stored["status"]["phase"], "Complete", "{stored:#}");
    assert_eq!(stored["status"]["reason"], "Succeeded");
    assert_eq!(stored["status"]["message"], "NodeReboot completed");
    // Claimed (InProgress), then finished: two status patches.
    let patches: Vec<String> = seen(&h.log)
        .iter()
        .filter(|r| r.method == "PATCH")
        .map(|r| r.path().to_string())
        .collect();
    assert_eq!(patches, vec![format!("{OPS_PATH}/reboot-1/status"); 2]);
    assert_eq!(
        samples(&h.metrics, "aks_flex_node_operations_total"),
        [
            "aks_flex_node_operations_total{kind=\"NodeReboot\",phase=\"Complete\",reason=\"Succeeded\"} 1"
        ]
    );
    assert!(
        samples(&h.metrics, "aks_flex_node_operation_duration_seconds_count").contains(
            &"aks_flex_node_operation_duration_seconds_count{kind=\"NodeReboot\"} 1".to_string()
        ),
        "{}",
        h.metrics.render()
    );
    // Nothing else ran on the host; the machine goal is untouched.
    h.assert_host_untouched();
    h.stop().await;
}

/// Real: the daemon loop, [`ClusterOperations`] and the reconciler's AgentReset outcome, the
/// service uninstall. Faked: the API server, the handlers (the reset itself), systemd.
#[tokio::test]
async fn a_completed_agent_reset_stops_the_daemon_and_uninstalls_its_service() {
    let handlers = RecordingHandlers::new();
    let mut h = start(Setup {
        handlers: Some(handlers.clone()),
        machine_ops: vec![machine_op("reset-1", "AgentReset")],
        ..Default::default()
    });
    let reports = h.until(|r| r.item == op_item("reset-1")).await;
    assert_eq!(reports.last().unwrap().error, None);
    let run = std::mem::replace(&mut h.run, tokio::spawn(async { Ok(()) }));
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the daemon stops after the AgentReset")
        .unwrap()
        .unwrap();
    assert_eq!(handlers.calls(), vec!["agent_reset"]);
    let stored = h.sim.lock().unwrap().ops["reset-1"].clone();
    assert_eq!(stored["status"]["phase"], "Complete", "{stored:#}");
    let unit = crate::systemd::AGENT_UNIT;
    assert_eq!(
        h.fake.systemd.calls(),
        vec![
            format!("disable {unit}"),
            "daemon-reload".to_string(),
            format!("stop {unit}"),
        ]
    );
}

/// Real: [`ClusterOperations::reconcile`] and the reconciler. Faked: the API server and the
/// handlers.
#[tokio::test]
async fn reconcile_maps_a_ttl_to_a_requeue_and_names_api_errors() {
    let fake = FakeHost::new().unwrap();
    let mut op = machine_op("ttl-1", "NodeReboot");
    op["spec"]["ttlSecondsAfterFinished"] = json!(60);
    let sim = Arc::new(Mutex::new(Sim {
        node: Some(node_json(false)),
        get_failures: 0,
        watch: None,
        seq: Seq::default(),
        ops: BTreeMap::from([("ttl-1".to_string(), op)]),
        ops_watch: None,
        op_get_failures: 0,
    }));
    let (client, _log, _server) = api(sim.clone());
    let handlers = RecordingHandlers::new();
    let ops = cluster_operations(
        client,
        &fake,
        handlers.clone(),
        Arc::new(DaemonMetrics::default()),
    );
    assert_eq!(
        ops.reconcile("ttl-1").await.unwrap(),
        OperationOutcome::RequeueAfter(Duration::from_secs(60))
    );
    assert_eq!(handlers.calls(), vec!["node_reboot"]);
    // A gone operation: nothing more.
    assert_eq!(ops.reconcile("gone").await.unwrap(), OperationOutcome::Done);
    // An API error goes back to the queue, naming the operation and the answer.
    sim.lock().unwrap().op_get_failures = 1;
    let e = ops.reconcile("ttl-1").await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "get MachineOperation ttl-1: API server answered 500 InternalError: etcdserver: request timed out"
    );
    assert!(!e.is_permanent(), "a 500 is retried with backoff");
}

/// A [`Proven`] that counts its calls and fails the first `fail` of them.
#[derive(Default)]
struct CountingProof {
    calls: AtomicUsize,
    fail: usize,
}

impl Proven for CountingProof {
    fn reconciled(&self) -> anyhow::Result<Option<String>> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n < self.fail {
            anyhow::bail!("injected: cannot write last-good");
        }
        Ok(None)
    }
}

fn counting(fail: usize) -> (Arc<CountingProof>, MakeProof) {
    let p = Arc::new(CountingProof {
        calls: AtomicUsize::new(0),
        fail,
    });
    let q = p.clone();
    (
        p,
        Box::new(move |_, seq| Arc::new(Logged { seq, inner: q }) as Arc<dyn Proven>),
    )
}

/// The sequence up to the first proof: the Node reads and status patches before it.
fn before_proof(h: &Harness) -> Vec<String> {
    let seq = h.seq.lock().unwrap().clone();
    let i = seq
        .iter()
        .position(|s| s == "proof")
        .expect("a proof in the sequence");
    assert_eq!(
        seq.iter().filter(|s| *s == "proof").count(),
        1,
        "one proof: {seq:#?}"
    );
    seq[..i]
        .iter()
        .filter(|s| s.starts_with("patch") || s.contains(&format!("/nodes/{NODE}")))
        .cloned()
        .collect()
}

/// Real: the daemon loop and queue. Faked: the API server (its first two Node reads answer
/// 500), the machine client and layer, and the proof (a counter). The running agent is proven
/// after the first item that succeeded, not before (the failed seeds) and only once.
#[tokio::test]
async fn the_agent_is_proven_once_after_its_first_successful_reconcile() {
    let (proof, proven) = counting(0);
    let mut h = start(Setup {
        get_failures: 2,
        proven: Some(proven),
        ..Default::default()
    });
    h.until(is(Action::ReportSucceeded)).await;
    assert_eq!(
        proof.calls.load(Ordering::SeqCst),
        1,
        "after the first success"
    );
    // Not after the failed seeds (their Node reads answered 500): after the first success.
    assert_eq!(
        before_proof(&h),
        vec![
            "api GET /api/v1/nodes/flex-node-1",
            "api GET /api/v1/nodes/flex-node-1",
            "api GET /api/v1/nodes/flex-node-1",
            "patch Succeeded etag-1",
        ]
    );
    // The Node watch's first listing is another successful reconcile: no second proof.
    h.until(|r| {
        r.item
            == Item::Repave {
                source: RepaveSource::NodeChange,
            }
            && r.error.is_none()
    })
    .await;
    assert_eq!(proof.calls.load(Ordering::SeqCst), 1, "only once");
    h.stop().await;
}

/// As above, with a proof that fails once (last-good cannot be written): it is tried again
/// after the next successful reconcile, then never again.
#[tokio::test]
async fn a_proof_that_fails_is_retried_after_the_next_success() {
    let (proof, proven) = counting(1);
    let mut h = start(Setup {
        proven: Some(proven),
        interval: Duration::from_millis(100),
        ..Default::default()
    });
    let successes = AtomicUsize::new(0);
    h.until(|r| {
        if r.error.is_none() && r.decision.is_some() {
            successes.fetch_add(1, Ordering::SeqCst);
        }
        successes.load(Ordering::SeqCst) >= 3
    })
    .await;
    assert_eq!(proof.calls.load(Ordering::SeqCst), 2);
    h.stop().await;
}

/// Real: the daemon loop, the [`crate::flows::upgrade::Upgrader`] and its files (the blue/green
/// links and the upgrade record on a temporary root). Faked: the API server (the first Node
/// read answers 500), the machine client and layer. A candidate that has started (green) is
/// not last-good until the daemon's first successful reconcile; then it is, the upgrade is
/// `Complete`, and its MachineOperation is queued to report it.
#[tokio::test]
async fn the_upgraded_agent_becomes_last_good_after_its_first_successful_reconcile() {
    use crate::flows::upgrade::layout::{Layout, Slot};
    use crate::flows::upgrade::{OperationRef, RECORD_PATH, Stage, UpgradeRecord, Upgrader};
    let proven: MakeProof = Box::new(|f: &FakeHost, seq: Seq| {
        let fs = f.host.fs.clone();
        for slot in ["blue", "green"] {
            fs.write_atomic(
                &Path::new(crate::flows::upgrade::layout::LIB_DIR)
                    .join(slot)
                    .join("aks-flex-node"),
                slot.as_bytes(),
                0o755,
            )
            .unwrap();
        }
        let layout = Layout::new(fs.clone());
        layout.switch(Slot::Green).unwrap();
        layout.mark_good(Slot::Blue).unwrap();
        JsonStore::<UpgradeRecord>::at(fs.clone(), RECORD_PATH)
            .save(&UpgradeRecord {
                version: 1,
                operation: Some(OperationRef {
                    uid: "uid-up".into(),
                    name: "upgrade-1".into(),
                }),
                mode: crate::flows::upgrade::Mode::Binary,
                previous: "blue".into(),
                candidate: "green".into(),
                candidate_version: Some("v2".into()),
                stage: Stage::Switched,
                started_at: "2026-12-02T10:00:00Z".into(),
                recovery_restarts: 0,
                remove_candidate_on_rollback: false,
                result: None,
            })
            .unwrap();
        let upgrader = Upgrader::new(f.host.clone());
        assert_eq!(
            upgrader.on_daemon_start(Some("green")),
            None,
            "not at start"
        );
        assert_eq!(layout.last_good().unwrap(), Some(Slot::Blue));
        Arc::new(Logged {
            seq,
            inner: Arc::new(ProveUpgrade {
                upgrader,
                running: Some("green".into()),
            }),
        })
    });
    let mut h = start(Setup {
        get_failures: 1,
        proven: Some(proven),
        handlers: Some(RecordingHandlers::new()),
        ..Default::default()
    });
    let layout = Layout::new(h.fake.host.fs.clone());
    let upgrader = Upgrader::new(h.fake.host.clone());
    h.until(is(Action::ReportSucceeded)).await;
    // Proven after the first success, not after the failed seed.
    assert_eq!(
        before_proof(&h),
        vec![
            "api GET /api/v1/nodes/flex-node-1",
            "api GET /api/v1/nodes/flex-node-1",
            "patch Succeeded etag-1",
        ]
    );
    assert_eq!(layout.last_good().unwrap(), Some(Slot::Green));
    let rec = upgrader.record().unwrap();
    assert_eq!(rec.stage, Stage::Finished);
    let result = rec.result.unwrap();
    assert_eq!(result.phase, flex_api::machina::OperationPhase::Complete);
    assert!(
        result.message.contains("green (version v2)"),
        "{}",
        result.message
    );
    // The operation is queued to report it.
    h.until(|r| r.item == op_item("upgrade-1")).await;
    h.stop().await;
}

/// The sequence's Node writes (and failed writes), in order.
fn node_writes(h: &Harness) -> Vec<String> {
    h.seq
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("node"))
        .cloned()
        .collect()
}

/// Real: the daemon loop, the state tracker, the state store on a temporary root. Faked: the
/// API server, the machine client and layer, the Node writer (recorded). A goal applied after
/// the Node signal shows Working while the machines change, then Done with the new side and
/// goal version in the annotations; each state is written once (the reconciles the writes
/// cause write nothing more).
#[tokio::test]
async fn the_node_shows_working_while_a_goal_is_applied_then_done() {
    let mut h = start(Setup {
        machine: Some(machine("etag-2", "1.35.3")),
        hold_watch: true,
        node_state: Some(0),
        ..Default::default()
    });
    h.until(is(Action::WaitForNodeSignal)).await;
    assert_eq!(node_writes(&h), vec!["node Done Reconciled kube1 etag-1"]);

    h.sim.lock().unwrap().node = None;
    let bytes = match Reply::events(&[("DELETED", node_json(false))]) {
        Reply::Raw(b) => b,
        _ => unreachable!(),
    };
    h.release_watch.take().unwrap().send(bytes).unwrap();
    h.until(is(Action::ApplyGoalState)).await;
    assert_eq!(
        node_writes(&h),
        vec![
            "node Done Reconciled kube1 etag-1",
            "node Working ApplyingGoal kube1 etag-1",
            "node Done Reconciled kube2 etag-2",
        ]
    );
    // Working was written before the host was touched, Done after.
    let seq = h.seq.lock().unwrap().clone();
    let at = |p: &str| seq.iter().position(|l| l.starts_with(p)).unwrap();
    assert!(at("node Working") < at("ops provision kube2"), "{seq:?}");
    assert!(
        at("node Done Reconciled kube2") > at("ops cleanup kube1"),
        "{seq:?}"
    );
    h.stop().await;
}

/// Real: the daemon loop and its backoff, the state tracker. Faked: the API server (its Node
/// GET answers 500 three times), the Node writer (recorded). Failures show Working (retrying),
/// then Degraded at the third in a row, then Done once the reconcile succeeds.
#[tokio::test]
async fn failures_in_a_row_degrade_the_node_and_a_success_clears_it() {
    let mut h = start(Setup {
        get_failures: 3,
        node_state: Some(0),
        ..Default::default()
    });
    h.until(|r| r.error.is_none()).await;
    assert_eq!(
        node_writes(&h),
        vec![
            "node Working Retrying kube1 etag-1",
            "node Degraded ReconcileFailing kube1 etag-1",
            "node Done Reconciled kube1 etag-1",
        ]
    );
    h.stop().await;
}

/// Real: the daemon loop, the state tracker. Faked: the Node writer, whose first write fails.
/// A failed write never fails the daemon's work, and the state is written at the next chance.
#[tokio::test]
async fn a_failed_node_write_is_retried_and_does_not_fail_the_reconcile() {
    let mut h = start(Setup {
        node_state: Some(1),
        ..Default::default()
    });
    let first = h.until(|_| true).await;
    assert_eq!(first[0].error, None);
    h.until(|_| true).await;
    assert_eq!(
        node_writes(&h),
        vec![
            "node-write-failed Done",
            "node Done Reconciled kube1 etag-1"
        ]
    );
    h.stop().await;
}

/// Real: the proof-deadline thread and the [`crate::flows::upgrade::Upgrader`] reading the
/// upgrade record on a temporary root. Faked: the process exit (a channel takes the message
/// instead) and the deadline (a few milliseconds instead of PROVE_DEADLINE). A candidate whose
/// record is still `switched` at its deadline gives up, naming itself and the agent recovery
/// returns to; one that proved itself meanwhile, or is not the candidate, does not.
#[test]
fn an_upgraded_agent_unproven_at_its_deadline_gives_up() {
    use crate::flows::upgrade::{Mode, RECORD_PATH, Stage, UpgradeRecord, Upgrader};
    let f = FakeHost::new().unwrap();
    let store = JsonStore::<UpgradeRecord>::at(f.host.fs.clone(), RECORD_PATH);
    let switched = UpgradeRecord {
        version: 1,
        operation: None,
        mode: Mode::Binary,
        previous: "blue".into(),
        candidate: "green".into(),
        candidate_version: None,
        stage: Stage::Switched,
        started_at: "2026-12-02T10:00:00Z".into(),
        recovery_restarts: 0,
        remove_candidate_on_rollback: false,
        result: None,
    };
    store.save(&switched).unwrap();
    let upgrader = Upgrader::new(f.host.clone());
    let watch = |running: &str, deadline: Duration| {
        let (tx, rx) = std::sync::mpsc::channel();
        let h = watch_proof_deadline(upgrader.clone(), Some(running.into()), deadline, move |m| {
            let _ = tx.send(m);
        });
        (h, rx)
    };

    // Still unproven at the deadline: gives up.
    let (h, rx) = watch("green", Duration::from_millis(20));
    h.expect("armed for the candidate").join().unwrap();
    let m = rx.try_recv().expect("gave up");
    assert!(m.contains("green") && m.contains("blue"), "{m}");

    // Not the candidate: not armed.
    let (h, _) = watch("blue", Duration::from_millis(20));
    assert!(h.is_none());

    // Proven before the deadline (a second away; the save takes microseconds): armed, but
    // does not give up.
    let (h, rx) = watch("green", Duration::from_secs(1));
    let mut done = switched.clone();
    done.finish(flex_api::operations::OperationResult::complete("proven"));
    store.save(&done).unwrap();
    h.expect("armed").join().unwrap();
    assert!(rx.try_recv().is_err(), "a proven agent keeps running");
}

/// Real: TCP on loopback. The early proof's probe: a listening API server accepts (the agent
/// then waits for a real reconcile to be proven), a closed port and a URL without a host do
/// not (the cluster cannot be reached: staying up proves the agent).
#[tokio::test]
async fn the_early_proof_probe_tells_a_listening_api_server_from_an_unreachable_one() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let open = listener.local_addr().unwrap().port();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let t = Duration::from_secs(2);
    assert!(api_server_accepts(&format!("https://127.0.0.1:{open}"), t).await);
    assert!(api_server_accepts(&format!(" https://[::ffff:127.0.0.1]:{open}/ "), t).await);
    assert!(!api_server_accepts(&format!("https://127.0.0.1:{closed}"), t).await);
    assert!(!api_server_accepts("not a url", t).await);
    assert!(!api_server_accepts("", t).await);
}

/// Real: TCP on loopback (a closed port, a listening one), the early-proof task. Faked: the
/// clock (paused; the sleep is `PROVE_UNREACHABLE_AFTER` itself) and the proof (it counts).
/// A daemon whose cluster cannot be reached proves the running agent at
/// `PROVE_UNREACHABLE_AFTER` and not before; an API server that accepts connections leaves the
/// proof to a reconcile; a shutdown first proves nothing.
#[tokio::test(start_paused = true)]
async fn the_early_proof_comes_at_its_wait_only_while_the_cluster_cannot_be_reached() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("https://127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let open = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    let counting = || {
        let p = Arc::new(CountingProof {
            calls: AtomicUsize::new(0),
            fail: 0,
        });
        (p.clone(), p as Arc<dyn Proven>)
    };
    let almost = PROVE_UNREACHABLE_AFTER - Duration::from_millis(100);

    // Unreachable: nothing before the wait, proven at it.
    let (count, p) = counting();
    let h = early_proof(
        p,
        closed.clone(),
        PROVE_UNREACHABLE_AFTER,
        CancellationToken::new(),
    );
    tokio::time::sleep(almost).await;
    assert_eq!(
        count.calls.load(Ordering::SeqCst),
        0,
        "proven before its wait"
    );
    h.await.unwrap();
    assert_eq!(count.calls.load(Ordering::SeqCst), 1);

    // Listening: the wait passes, no proof.
    let (count, p) = counting();
    early_proof(p, open, PROVE_UNREACHABLE_AFTER, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(count.calls.load(Ordering::SeqCst), 0);

    // Shut down before the wait: no proof.
    let (count, p) = counting();
    let token = CancellationToken::new();
    let h = early_proof(p, closed, PROVE_UNREACHABLE_AFTER, token.clone());
    tokio::time::sleep(almost).await;
    token.cancel();
    h.await.unwrap();
    assert_eq!(count.calls.load(Ordering::SeqCst), 0);
}
