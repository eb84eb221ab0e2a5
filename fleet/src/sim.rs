//! The fleet: N simulated nodes in one process, each running the daemon's own MachineOperation
//! code — [`ClusterOperations`] (its watch, [`watch_stream`](aks_flex_node::flows::operations::watch_stream),
//! with the field-selector probe and fallback, and its [`Reconciler`]: claim, the disruption
//! budget's slot, cordon and drain through [`KubeNodeDrain`], the handler, wait for Ready,
//! uncordon, free the slot, finish) fed through the daemon's own [`WorkQueue`] — as its own
//! identity (`system:node:<n>` impersonated, groups `system:nodes` and
//! `aks-flex-node-daemons`). What is not the daemon's: the host ([`SimHost`] records the
//! reboot instead of doing it, and plays kubelet coming back Ready), and, without a
//! kubeconfig, the API server ([`FakeApiServer`]).
//!
//! Time is compressed: the budget's looks ([`BudgetTimings`]), the drain's rounds and Ready
//! polls ([`DrainTimings`]), and the queue's requeue after a wait for a slot (the daemon's
//! [`SLOT_RECHECK`](aks_flex_node::flows::drain::budget::SLOT_RECHECK), 20 s) are capped at
//! [`FleetConfig::recheck`]. Per-minute rates are per minute of this compressed run.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use aks_flex_node::flows::daemon::operations::ClusterOperations;
use aks_flex_node::flows::daemon::queue::{Item, WorkQueue};
use aks_flex_node::flows::daemon::{OperationOutcome, Operations};
use aks_flex_node::flows::drain::budget::BudgetTimings;
use aks_flex_node::flows::drain::{
    CORDONED_BY, DrainApiFactory, DrainPolicy, DrainTimings, KubeNodeDrain, NodeDrainApi,
};
use aks_flex_node::flows::operations::{
    Action, Handlers, Ran, Reconciler, ReconcilerConfig, RecordStore,
};
use aks_flex_node::flows::upgrade::OperationRef;
use aks_flex_node::kubeclient::{KubeClients, client_from};
use aks_flex_node::machine::seams::SeamError;
use async_trait::async_trait;
use flex_api::machina::{MachineOperation, MachineOperationSpec, OperationKind};
use flex_host::fs::HostFs;
use flex_host::retry::{Backoff, wait_until};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::apiserver::FakeApiServer;
use crate::report::{Disruption, FleetReport, NodeCost, per_minute};

/// The groups the daemons authenticate with (their client certificates' organisations).
pub const DAEMON_GROUPS: [&str; 2] = ["system:nodes", "aks-flex-node-daemons"];

/// The label on everything the simulator creates.
pub const SIM_LABEL: &str = "flex-fleet/simulated";

/// A run's parameters.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// Simulated nodes (N).
    pub nodes: usize,
    /// NodeReboot operations in the burst (M), aimed at the nodes in turn.
    pub operations: usize,
    /// The budget's `maxUnavailable` (K).
    pub budget: u32,
    /// Whether the daemons may select their operations by `spec.machineRef` (the fake API
    /// server refuses the field otherwise, as a CRD without `selectableFields` does).
    pub selector: bool,
    /// A real API server's kubeconfig (its user must create Nodes, Pods, MachineOperations and
    /// the budget's ConfigMap, patch Nodes' status, and impersonate); `None`: the fake one.
    pub kubeconfig: Option<PathBuf>,
    /// Pods bound to each node, each evicted by its drain (use 0 against a real API server:
    /// without a kubelet an evicted pod never finishes terminating).
    pub pods_per_node: usize,
    /// How long a simulated reboot takes before kubelet reports Ready again.
    pub reboot_time: Duration,
    /// The compressed requeue of an operation waiting for a slot, and the budget's and the
    /// drain's waits.
    pub recheck: Duration,
    /// How long the burst may take.
    pub timeout: Duration,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            nodes: 6,
            operations: 6,
            budget: 1,
            selector: true,
            kubeconfig: None,
            pods_per_node: 1,
            reboot_time: Duration::from_millis(200),
            recheck: Duration::from_millis(200),
            timeout: Duration::from_secs(300),
        }
    }
}

/// The name of simulated node `i`.
pub fn node_name(i: usize) -> String {
    format!("flex-fleet-{i:04}")
}

/// The name of the burst's operation `i` (aimed at node `i % nodes`).
pub fn operation_name(i: usize) -> String {
    format!("fleet-reboot-{i:05}")
}

/// The identity simulated node `node` acts as.
pub fn node_identity(node: &str) -> String {
    format!("system:node:{node}")
}

/// One recorded reboot.
#[derive(Clone, Debug)]
pub struct Reboot {
    /// The node.
    pub node: String,
    /// The operation.
    pub operation: String,
    /// Whether the Node was cordoned by the daemon when the reboot began.
    pub cordoned: bool,
}

/// The simulated host: [`Handlers`] that record a NodeReboot instead of doing it, then play
/// kubelet coming back: after the reboot time, the Node's `Ready` condition with a fresh
/// heartbeat (written with the simulator's own client, as kubelet's own writes are not the
/// daemon's cost). Other kinds fail: the burst is NodeReboots.
pub struct SimHost {
    node: String,
    admin: Client,
    reboot_time: Duration,
    reboots: Arc<Mutex<Vec<Reboot>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `node` is cordoned by the daemon (unschedulable with its [`CORDONED_BY`]
/// annotation): disrupted for an action.
pub fn disrupted(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
        && node
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(CORDONED_BY))
}

#[async_trait]
impl Handlers for SimHost {
    async fn run(&self, action: &Action, op: Option<OperationRef>) -> anyhow::Result<Ran> {
        let Action::NodeReboot(_) = action else {
            anyhow::bail!("the fleet simulator's host only reboots");
        };
        let nodes: Api<Node> = Api::all(self.admin.clone());
        let cordoned = nodes
            .get_opt(&self.node)
            .await?
            .is_some_and(|n| disrupted(&n));
        lock(&self.reboots).push(Reboot {
            node: self.node.clone(),
            operation: op.map(|o| o.name).unwrap_or_default(),
            cordoned,
        });
        // The machine's downtime: a timer, not a wait for a condition.
        tokio::time::sleep(self.reboot_time).await;
        nodes
            .patch_status(
                &self.node,
                &PatchParams::default(),
                &Patch::Merge(ready_status(Timestamp::now())),
            )
            .await?;
        Ok(Ran::Done(None))
    }

    async fn stop_daemon(&self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// A Node status merge patch: `Ready` with its heartbeat at `at`, as kubelet writes it.
fn ready_status(at: Timestamp) -> serde_json::Value {
    let t = serde_json::to_value(Time(at)).unwrap_or_default();
    json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "kubelet is posting ready status (simulated)",
        "lastHeartbeatTime": t, "lastTransitionTime": t,
    }]}})
}

/// A simulated daemon: its tasks end when its token is cancelled.
struct Daemon {
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    _records: tempfile::TempDir,
}

/// The drain's seam as the daemon's, without the host record of progress (which would write
/// `/etc/aks-flex-node/drain.json` of this machine).
fn drain_factory() -> DrainApiFactory {
    Arc::new(|client, node| Arc::new(KubeNodeDrain::new(client, node)) as Arc<dyn NodeDrainApi>)
}

fn start_daemon(
    cfg: &FleetConfig,
    node: &str,
    client: Client,
    host: Arc<SimHost>,
) -> anyhow::Result<Daemon> {
    let records = tempfile::tempdir()?;
    let rcfg = ReconcilerConfig {
        machine_name: node.into(),
        node_name: node.into(),
        records: RecordStore::new(HostFs::new(records.path())),
        containerized: false,
        drain: DrainPolicy::default(),
    };
    let quick = cfg.recheck.max(Duration::from_millis(10));
    let drain_timings = DrainTimings {
        backoff: Backoff::new(u32::MAX, quick / 10, quick),
        ready_timeout: cfg.reboot_time * 10 + Duration::from_secs(30),
        ready_poll: quick / 4,
    };
    let budget_timings = BudgetTimings {
        backoff: Backoff::new(4, quick / 10, quick / 2),
    };
    let reconciler = Reconciler::new(rcfg, host)
        .with_drain(drain_factory(), drain_timings)
        .with_budget_timings(budget_timings);
    let ops = Arc::new(ClusterOperations::with_reconciler(
        KubeClients::fixed(client),
        node,
        reconciler,
    ));
    let stop = CancellationToken::new();
    let mut queue = WorkQueue::new(Backoff::new(u32::MAX, quick / 4, quick * 4));
    let watch = {
        let (ops, sender, stop, node) =
            (ops.clone(), queue.sender(), stop.clone(), node.to_string());
        tokio::spawn(async move {
            if let Err(e) = ops.watch(sender, stop).await {
                tracing::warn!(node, error = %format!("{e:#}"), "MachineOperation watch ended");
            }
        })
    };
    let work = {
        let (stop, node) = (stop.clone(), node.to_string());
        tokio::spawn(async move {
            while let Some(item) = queue.next(&stop).await {
                let Item::Operation { name } = &item else {
                    continue;
                };
                // As the daemon's loop: done forgets, a requeue comes back (compressed), a
                // transient failure backs off, a permanent one waits for a change.
                match ops.reconcile(name).await {
                    Ok(OperationOutcome::RequeueAfter(d)) => {
                        queue.forget(&item);
                        queue.add_after(item, d.min(quick));
                    }
                    Ok(OperationOutcome::Done | OperationOutcome::StopDaemon) => {
                        queue.forget(&item)
                    }
                    Err(SeamError::Transient(e)) => {
                        tracing::warn!(node, operation = %name, error = %format!("{e:#}"), "reconcile failed; retrying");
                        queue.retry(&item);
                    }
                    Err(SeamError::Permanent(e)) => {
                        tracing::warn!(node, operation = %name, error = %format!("{e:#}"), "reconcile failed for good");
                        queue.forget(&item);
                    }
                }
            }
        })
    };
    Ok(Daemon {
        stop,
        tasks: vec![watch, work],
        _records: records,
    })
}

/// The API server a run talks to.
enum Target {
    Fake(FakeApiServer),
    Real(String),
}

async fn base_config(cfg: &FleetConfig) -> anyhow::Result<(kube::Config, Target)> {
    match &cfg.kubeconfig {
        None => {
            let server = FakeApiServer::start(cfg.selector).await?;
            let config = kube::Config::new(server.url().parse()?);
            Ok((config, Target::Fake(server)))
        }
        Some(path) => {
            if !cfg.selector {
                anyhow::bail!(
                    "--no-selector needs the fake API server: against a real one, install the CRD without selectableFields instead (the daemon falls back by itself)"
                );
            }
            let kc = kube::config::Kubeconfig::read_from(path)?;
            let config = kube::Config::from_custom_kubeconfig(
                kc,
                &kube::config::KubeConfigOptions::default(),
            )
            .await?;
            let url = config.cluster_url.to_string();
            Ok((config, Target::Real(url)))
        }
    }
}

fn impersonating(base: &kube::Config, node: &str) -> anyhow::Result<Client> {
    let mut c = base.clone();
    c.auth_info.impersonate = Some(node_identity(node));
    c.auth_info.impersonate_groups = Some(DAEMON_GROUPS.iter().map(|g| g.to_string()).collect());
    Ok(client_from(c)?)
}

fn labelled(name: &str) -> kube::api::ObjectMeta {
    kube::api::ObjectMeta {
        name: Some(name.into()),
        labels: Some(BTreeMap::from([(
            SIM_LABEL.to_string(),
            "true".to_string(),
        )])),
        ..Default::default()
    }
}

/// Creates (or replaces) what the daemons act on: the Nodes, Ready; their pods; the budget.
async fn seed(admin: &Client, cfg: &FleetConfig, nodes: &[String]) -> anyhow::Result<()> {
    let napi: Api<Node> = Api::all(admin.clone());
    for n in nodes {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": labelled(n),
        }))?;
        match napi.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        napi.patch_status(
            n,
            &PatchParams::default(),
            &Patch::Merge(ready_status(Timestamp::now())),
        )
        .await?;
        for p in 0..cfg.pods_per_node {
            let pod: Pod = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": format!("{n}-web-{p}"), "namespace": "default",
                    "labels": {SIM_LABEL: "true"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                        "name": "web", "uid": "fleet-web", "controller": true}],
                },
                "spec": {"nodeName": n, "containers": [{"name": "web", "image": "registry.k8s.io/pause:3.10"}]},
                "status": {"phase": "Running"},
            }))?;
            match Api::<Pod>::namespaced(admin.clone(), "default")
                .create(&PostParams::default(), &pod)
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    use flex_api::budget::{CONFIGMAP, LEASE_DURATION, MAX_UNAVAILABLE, NAMESPACE};
    let cm = ConfigMap {
        metadata: labelled(CONFIGMAP),
        data: Some(BTreeMap::from([
            (MAX_UNAVAILABLE.to_string(), cfg.budget.to_string()),
            (LEASE_DURATION.to_string(), "5m".to_string()),
        ])),
        ..Default::default()
    };
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
    match cms.get_opt(CONFIGMAP).await? {
        None => {
            cms.create(&PostParams::default(), &cm).await?;
        }
        Some(old) => {
            let mut cm = cm;
            cm.metadata.resource_version = old.metadata.resource_version;
            cms.replace(CONFIGMAP, &PostParams::default(), &cm).await?;
        }
    }
    Ok(())
}

/// Watches the simulated Nodes and tracks how many are disrupted at once.
fn track(admin: Client, tracker: Arc<Mutex<Disruption>>, ready: Arc<AtomicBool>) -> JoinHandle<()> {
    let api: Api<Node> = Api::all(admin);
    tokio::spawn(async move {
        let stream = watcher::watcher(
            api,
            watcher::Config::default().labels(&format!("{SIM_LABEL}=true")),
        );
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                    lock(&tracker).observe(&n.name_any(), disrupted(&n));
                }
                Ok(watcher::Event::InitDone) => ready.store(true, Ordering::SeqCst),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "the simulator's Node watch failed; it retries")
                }
            }
        }
    })
}

/// Runs the fleet: seeds the cluster, starts the daemons, creates the burst, waits until
/// every operation finished, and reports.
pub async fn run(cfg: &FleetConfig) -> anyhow::Result<FleetReport> {
    anyhow::ensure!(cfg.nodes > 0, "--nodes must be at least 1");
    let (base, target) = base_config(cfg).await?;
    let admin = client_from(base.clone())?;
    let nodes: Vec<String> = (0..cfg.nodes).map(node_name).collect();
    seed(&admin, cfg, &nodes).await?;

    let tracker = Arc::new(Mutex::new(Disruption::default()));
    let tracking = Arc::new(AtomicBool::new(false));
    let tracker_task = track(admin.clone(), tracker.clone(), tracking.clone());

    let started = Instant::now();
    let reboots = Arc::new(Mutex::new(Vec::new()));
    let mut daemons = Vec::new();
    for n in &nodes {
        let host = Arc::new(SimHost {
            node: n.clone(),
            admin: admin.clone(),
            reboot_time: cfg.reboot_time,
            reboots: reboots.clone(),
        });
        daemons.push(start_daemon(cfg, n, impersonating(&base, n)?, host)?);
    }

    // Every daemon watching (the fake server counts open watches) and the tracker listening,
    // so the burst arrives as watch events, as in a running fleet.
    let want_watches = if cfg.selector { 2 } else { 1 };
    wait_until(
        "the daemons' watches and the Node tracker",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || async {
            if !tracking.load(Ordering::SeqCst) {
                return Err("the Node tracker has not listed yet".to_string());
            }
            let Target::Fake(server) = &target else {
                return Ok(());
            };
            let counts = server.counts();
            let waiting = nodes
                .iter()
                .filter(|n| {
                    counts
                        .by_identity
                        .get(&node_identity(n))
                        .is_none_or(|c| c.open_operation_watches < want_watches)
                })
                .count();
            if waiting == 0 {
                Ok(())
            } else {
                Err(format!("{waiting} daemon(s) not watching yet"))
            }
        },
    )
    .await?;

    let ops: Api<MachineOperation> = Api::all(admin.clone());
    let burst_start = Instant::now();
    for i in 0..cfg.operations {
        let mut op = MachineOperation::new(
            &operation_name(i),
            MachineOperationSpec {
                machine_ref: nodes[i % nodes.len()].clone(),
                operation_kind: OperationKind::NodeReboot,
                ..Default::default()
            },
        );
        op.metadata.labels = labelled("").labels;
        ops.create(&PostParams::default(), &op).await?;
    }
    let lp = ListParams::default().labels(&format!("{SIM_LABEL}=true"));
    let finished = wait_until(
        "the burst to finish",
        cfg.timeout,
        Duration::from_millis(50),
        || async {
            let list = ops.list(&lp).await.map_err(|e| e.to_string())?;
            let open = list.items.iter().filter(|o| !is_finished(o)).count();
            if open == 0 {
                Ok(list.items)
            } else {
                Err(format!("{open} operation(s) not finished"))
            }
        },
    )
    .await;
    let burst = burst_start.elapsed();
    let elapsed = started.elapsed();
    if let Target::Fake(server) = &target {
        // Counted once every watch has been sent every change.
        wait_until(
            "the watches to be sent every change",
            Duration::from_secs(10),
            Duration::from_millis(10),
            || async {
                if server.watches_caught_up() {
                    Ok(())
                } else {
                    Err("watches behind".to_string())
                }
            },
        )
        .await?;
    }
    for d in &daemons {
        d.stop.cancel();
    }
    for d in daemons {
        for t in d.tasks {
            t.abort();
        }
    }
    tracker_task.abort();
    let items = match finished {
        Ok(items) => items,
        Err(e) => {
            tracing::warn!(error = %e, "the burst did not finish in time");
            ops.list(&lp).await?.items
        }
    };
    let mut phases = BTreeMap::new();
    for o in &items {
        let p = o
            .status
            .as_ref()
            .map(|s| s.phase.clone())
            .filter(|p| !p.is_empty());
        *phases
            .entry(p.unwrap_or_else(|| "Pending".into()))
            .or_insert(0) += 1;
    }
    let reboots = lock(&reboots).clone();
    let disruption = lock(&tracker).clone();
    let (api_server, per_node, event_reasons, unsupported, operation_changes) = match &target {
        Target::Fake(server) => {
            let counts = server.counts();
            let per_node = nodes
                .iter()
                .map(|n| {
                    let c = counts
                        .by_identity
                        .get(&node_identity(n))
                        .cloned()
                        .unwrap_or_default();
                    (
                        n.clone(),
                        NodeCost {
                            requests: c.requests,
                            watch_events: c.watch_events,
                            operation_watch_events: c.operation_watch_events,
                            listed: c.listed,
                            operations_seen: c.operations_seen,
                            requests_per_minute: per_minute(c.requests, elapsed),
                            watch_events_per_minute: per_minute(c.watch_events, elapsed),
                        },
                    )
                })
                .collect();
            (
                "fake API server".to_string(),
                per_node,
                counts.event_reasons,
                counts.unsupported,
                counts.operation_changes,
            )
        }
        Target::Real(url) => {
            cleanup(&admin, &nodes).await;
            (
                url.clone(),
                BTreeMap::new(),
                BTreeMap::new(),
                Vec::new(),
                BTreeMap::new(),
            )
        }
    };
    Ok(FleetReport {
        nodes: cfg.nodes,
        operations: cfg.operations,
        budget: cfg.budget,
        selector: cfg.selector,
        api_server,
        burst,
        elapsed,
        phases,
        max_disrupted: disruption.max(),
        nodes_disrupted: disruption.ever(),
        reboots: reboots.len(),
        reboots_uncordoned: reboots.iter().filter(|r| !r.cordoned).count(),
        event_reasons,
        per_node,
        unsupported,
        operation_changes,
    })
}

fn is_finished(o: &MachineOperation) -> bool {
    o.status
        .as_ref()
        .is_some_and(|s| matches!(s.phase.as_str(), "Complete" | "Failed"))
}

/// Removes what the run created on a real API server (failures logged).
async fn cleanup(admin: &Client, nodes: &[String]) {
    let dp = DeleteParams::default();
    let lp = ListParams::default().labels(&format!("{SIM_LABEL}=true"));
    let ops: Api<MachineOperation> = Api::all(admin.clone());
    if let Err(e) = ops.delete_collection(&dp, &lp).await {
        tracing::warn!(error = %e, "could not delete the burst's MachineOperations");
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    if let Err(e) = pods.delete_collection(&dp, &lp).await {
        tracing::warn!(error = %e, "could not delete the simulated pods");
    }
    let napi: Api<Node> = Api::all(admin.clone());
    for n in nodes {
        if let Err(e) = napi.delete(n, &dp).await {
            tracing::warn!(node = %n, error = %e, "could not delete a simulated Node");
        }
    }
}
