//! `daemon` (alias `agent`): the long-running agent under systemd (upstream's `daemon.Run`).
//!
//! At start it builds its Kubernetes clients ([`crate::kubeclient::daemon_clients`]: the daemon's
//! own client certificate with a bootstrap token, the exec credential otherwise; retried with
//! backoff while the cluster cannot be reached, a wrong config fails at once) and the machine
//! client over them, decides whether to run MachineOperations ([`operations::enabled`]:
//! `agent.machineOperationMode` and API discovery, retried like the client while the cluster
//! cannot be reached), resumes an interrupted repave ([`crate::flows::repave::resume_pending`];
//! [`run_with`] does that first, before the cluster is reached, so a node that cannot reach it
//! is not left half-repaved), queues a seed reconcile and tells systemd it is ready (`sd_notify READY=1`, a no-op outside a
//! `Type=notify` unit). Then one loop takes work from one [`WorkQueue`]: all host work runs one
//! item at a time. Work comes from
//!
//! - the seed, at start;
//! - the re-read timer: after each successful seed or interval reconcile, another after
//!   `agent.machineReconcileInterval` plus a jitter uniform in `[0, interval/10]`;
//! - the Node watch ([`watch`]): this node's `Node` only, every change → `node-change`;
//! - MachineOperations, through the [`Operations`] hook (its watch feeds the queue through a
//!   [`QueueSender`]; its `reconcile` runs on the queue); [`ClusterOperations`] is the real one.
//!
//! A repave item runs the decision table ([`flex_api::repave::decide`]) and its action (the private
//! `work` module): report `Succeeded`, apply the goal (blue/green through the machine layer),
//! or reset the node and uninstall the agent's service when the deletion taint is present and
//! the machine resource is gone — after which the daemon returns. A failed item is logged with
//! its cause and retried with exponential backoff; nothing is done to the host until the reads
//! it depends on succeeded. On SIGTERM/SIGINT the loop finishes the current item, stops the
//! watches and returns.
//!
//! Each item, and the resume at start, runs under the node's work lock
//! ([`crate::flows::worklock`]), which a node-local request (`aks-flex-node repave`) holds for
//! its whole run: the daemon waits for such a request to finish, and the request for the
//! daemon's item.
//!
//! The first item that succeeds proves the running agent ([`Proven`]): it reached the cluster
//! and did its work, so it becomes last-good and an upgrade that switched to it finishes
//! `Complete` (its MachineOperation is queued again to report it). Until then recovery rolls it
//! back should it fail.

pub mod node_state;
pub mod operations;
pub mod queue;
pub mod watch;
mod work;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use flex_host::retry::Backoff;

pub use flex_api::repave::{Action, Decision, MachineSnapshot, decide};
pub use node_state::{KubeNodeState, NodeStatePublisher, Reporter};
pub use operations::{ClusterOperations, Discovery, Guard};
pub use queue::{DAEMON_BACKOFF, Item, QueueSender, RepaveSource, WorkQueue, jitter, secure_unit};
pub use work::{FAILED, RECONCILING, SUCCEEDED};

use crate::config::Config;
use crate::flows::metrics::DaemonMetrics;
use crate::flows::repave::Stores;
use crate::flows::worklock::WorkLock;
use crate::goalclient::MachineClient;
use crate::kubeclient::KubeClients;
use crate::machine::nspawn::Timings;
use crate::machine::seams::{NodeOps, SeamError};
use flex_api::node_state::Event as NodeEvent;
use flex_host::context::Host;
use flex_host::retry::Attempt;
use work::{Ctx, Flow};

/// The default re-read interval (when the config has none).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(600);

/// What a MachineOperation reconcile asks of the daemon afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperationOutcome {
    /// Nothing more.
    Done,
    /// Reconcile the same operation again after this delay (a TTL that has not expired).
    RequeueAfter(Duration),
    /// Uninstall the agent's service and stop (after `AgentReset`).
    StopDaemon,
}

/// The MachineOperation reconciler, as the daemon drives it.
#[async_trait]
pub trait Operations: Send + Sync {
    /// Watches this node's MachineOperations until `shutdown`, queueing each change with
    /// [`QueueSender::operation`]. Runs beside the queue; must not touch the host.
    async fn watch(&self, queue: QueueSender, shutdown: CancellationToken) -> anyhow::Result<()>;
    /// Reconciles the MachineOperation `name`. Runs on the queue, never at the same time as a
    /// repave or another operation. A [`SeamError::Transient`] is retried with backoff; a
    /// [`SeamError::Permanent`] waits for the operation to change.
    async fn reconcile(&self, name: &str) -> Result<OperationOutcome, SeamError>;
}

/// What the daemon does once it has proven itself, after its first successful reconcile.
pub trait Proven: Send + Sync {
    /// Called after each item that succeeded until it returns `Ok` (then never again): make
    /// the running agent last-good and finish the upgrade that switched to it
    /// ([`crate::flows::upgrade::Upgrader::prove`]). Returns the MachineOperation to
    /// reconcile again now (the AgentUpgrade it completed), if any.
    fn reconciled(&self) -> anyhow::Result<Option<String>>;
}

/// [`Proven`] for the real host: the upgrader and the agent this process is.
pub struct ProveUpgrade {
    /// The upgrader.
    pub upgrader: crate::flows::upgrade::Upgrader,
    /// What runs (a slot or an image; [`crate::flows::upgrade::Upgrader::running`]).
    pub running: Option<String>,
}

impl Proven for ProveUpgrade {
    fn reconciled(&self) -> anyhow::Result<Option<String>> {
        Ok(self
            .upgrader
            .prove(self.running.as_deref())?
            .and_then(|(result, op)| {
                tracing::info!(phase = %result.phase, reason = %result.reason, message = %result.message, "AgentUpgrade finished");
                op
            }))
    }
}

/// What happened to one queue item (for tests and diagnostics).
#[derive(Clone, Debug)]
pub struct Report {
    /// The item.
    pub item: Item,
    /// When it started.
    pub at: Instant,
    /// The repave decision, for repave items that got as far.
    pub decision: Option<Decision>,
    /// The error, when it failed.
    pub error: Option<String>,
    /// When it failed: the delay before it runs again (`None`: not before it changes).
    pub retry_in: Option<Duration>,
    /// When it failed: whether the failure is [`SeamError::Permanent`] (not retried with
    /// backoff).
    pub permanent: bool,
}

/// The daemon, assembled.
pub struct Daemon {
    ctx: Ctx,
    interval: Duration,
    backoff: Backoff,
    rng: Box<dyn FnMut() -> f64 + Send>,
    reports: Option<mpsc::UnboundedSender<Report>>,
    proven: Option<Arc<dyn Proven>>,
}

impl Daemon {
    /// The daemon for `config` on `host`, with its Kubernetes clients, machine client and
    /// machine layer.
    pub fn new(
        host: Host,
        config: &Config,
        kube: KubeClients,
        machines: Arc<dyn MachineClient>,
        ops: Arc<dyn NodeOps>,
    ) -> Self {
        let interval = match config.agent.machine_reconcile_interval.0 {
            d if d.is_zero() => DEFAULT_INTERVAL,
            d => d,
        };
        Self {
            ctx: Ctx {
                node_name: config.agent.node_name.clone(),
                stores: Stores::new(host.fs.clone()),
                host,
                kube: kube.clone(),
                machines,
                ops,
                timings: Timings::default(),
                operations: None,
                node_state: None,
                metrics: Arc::new(DaemonMetrics::default()),
                drain: Arc::new(crate::flows::drain::NodeDrain::new(
                    kube.clone(),
                    &config.agent.node_name,
                    config.agent.drain.policy(),
                )),
            },
            interval,
            backoff: DAEMON_BACKOFF,
            rng: Box::new(secure_unit),
            reports: None,
            proven: None,
        }
    }

    /// Drains through another seam (tests).
    pub fn with_drain(mut self, drain: crate::flows::drain::NodeDrain) -> Self {
        self.ctx.drain = Arc::new(drain);
        self
    }

    /// Plugs in the MachineOperation reconciler.
    pub fn with_operations(mut self, operations: Arc<dyn Operations>) -> Self {
        self.ctx.operations = Some(operations);
        self
    }

    /// Publishes the agent's state on its Node ([`node_state`]).
    pub fn with_node_state(mut self, reporter: Arc<Reporter>) -> Self {
        self.ctx.node_state = Some(reporter);
        self
    }

    /// Counts the daemon's work in `metrics` (by default in metrics of its own, served nowhere).
    pub fn with_metrics(mut self, metrics: Arc<DaemonMetrics>) -> Self {
        self.ctx.metrics = metrics;
        self
    }

    /// What to do after the first successful reconcile ([`Proven`]).
    pub fn with_proven(mut self, proven: Arc<dyn Proven>) -> Self {
        self.proven = Some(proven);
        self
    }

    /// Overrides the jitter's random source (uniform in `[0, 1]`).
    pub fn with_rng(mut self, rng: impl FnMut() -> f64 + Send + 'static) -> Self {
        self.rng = Box::new(rng);
        self
    }

    /// Overrides the retry backoff.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Overrides the machine timings used by reset.
    pub fn with_timings(mut self, timings: Timings) -> Self {
        self.ctx.timings = timings;
        self
    }

    /// Sends a [`Report`] per item handled.
    pub fn with_reports(mut self, tx: mpsc::UnboundedSender<Report>) -> Self {
        self.reports = Some(tx);
        self
    }

    /// Runs until `shutdown` is cancelled (after the current item) or the node was reset.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Daemon {
            ctx,
            interval,
            backoff,
            mut rng,
            reports,
            mut proven,
        } = self;
        tracing::info!(
            node = %ctx.node_name,
            interval = %crate::config::format_go_duration(interval),
            "daemon reconcilers starting"
        );
        if !resume_interrupted_repave(
            ctx.ops.as_ref(),
            ctx.drain.as_ref(),
            &ctx.stores,
            &ctx.host.fs,
            &shutdown,
            &ctx.metrics,
        )
        .await
        {
            tracing::info!("daemon shutting down before it was ready");
            return Ok(());
        }
        release_stale_cordon(&ctx, true).await;

        let mut queue = WorkQueue::new(backoff);
        let sender = queue.sender();
        sender.send(Item::Repave {
            source: RepaveSource::Seed,
        });
        if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
            tracing::warn!(error = %e, "sd_notify READY failed");
        }
        tracing::info!(node = %ctx.node_name, "daemon ready");

        let sources = shutdown.child_token();
        let mut tasks = vec![tokio::spawn(watch::watch_node(
            ctx.kube.clone(),
            ctx.node_name.clone(),
            sender.clone(),
            sources.clone(),
            ctx.metrics.clone(),
        ))];
        let clients = ctx.kube.clone();
        ctx.metrics.certificate_from(move || clients.not_after());
        ctx.observe_active_machine();
        if let Some(ops) = ctx.operations.clone() {
            let (tx, token) = (sender.clone(), sources.clone());
            tasks.push(tokio::spawn(async move {
                if let Err(e) = ops.watch(tx, token).await {
                    tracing::error!(error = %format!("{e:#}"), "MachineOperation watch stopped");
                }
            }));
        }
        drop(sender);

        while let Some(item) = queue.next(&shutdown).await {
            // Held to the end of the item: a node-local request never runs beside it.
            let Some(_lock) = work_lock(&ctx.host.fs, &shutdown).await else {
                break;
            };
            let at = Instant::now();
            let result = match &item {
                Item::Repave { source } => ctx
                    .repave(source.as_str())
                    .await
                    .map(|(d, flow)| (Some(d), flow)),
                Item::Operation { name } => {
                    ctx.report(NodeEvent::Operation { name: name.clone() })
                        .await;
                    ctx.operation(name).await.map(|flow| (None, flow))
                }
            };
            if matches!(item, Item::Repave { .. }) {
                // Each time the machine comes round (between items, under the work lock): a
                // cordon or disruption slot kept while the node was not Ready is lifted once
                // it is Ready again, without waiting for the daemon's next start.
                release_stale_cordon(&ctx, false).await;
            }
            let mut report = Report {
                item: item.clone(),
                at,
                decision: None,
                error: None,
                retry_in: None,
                permanent: false,
            };
            let mut stop = None;
            // After a success, and after a failure that retrying cannot mend: the machine is
            // read again after the interval; an operation waits for its next change.
            let mut come_round = |queue: &mut WorkQueue| {
                if item.key() == queue::Key::Machine {
                    let delay = interval + jitter(interval, rng());
                    queue.add_after(
                        Item::Repave {
                            source: RepaveSource::Interval,
                        },
                        delay,
                    );
                    Some(delay)
                } else {
                    None
                }
            };
            match result {
                Ok((decision, flow)) => {
                    report.decision = decision;
                    // After a reset the Node is on its way out: nothing more to say on it.
                    if !matches!(flow, Flow::Stop(_)) {
                        ctx.report(NodeEvent::Succeeded).await;
                    }
                    queue.forget(&item);
                    // The first success proves the running agent (once; retried after the next
                    // success should it fail). Not after a reset: the agent is on its way out.
                    if !matches!(flow, Flow::Stop(_))
                        && let Some(p) = proven.take()
                    {
                        match p.reconciled() {
                            Ok(Some(name)) if ctx.operations.is_some() => {
                                queue.add_after(Item::Operation { name }, Duration::ZERO)
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::error!(error = %format!("{e:#}"), "could not make the running agent last-good; retrying after the next successful reconcile");
                                proven = Some(p);
                            }
                        }
                    }
                    match flow {
                        Flow::Done => {
                            come_round(&mut queue);
                        }
                        Flow::RequeueAfter(d) => queue.add_after(item.clone(), d),
                        Flow::Stop(why) => stop = Some(why),
                    }
                }
                Err(e) if e.is_permanent() => {
                    ctx.metrics.reconcile_error(item.metric_kind(), true);
                    let message = format!("{e:#}");
                    ctx.report(NodeEvent::Failed {
                        permanent: true,
                        message: message.clone(),
                    })
                    .await;
                    queue.forget(&item);
                    let delay = come_round(&mut queue);
                    tracing::error!(
                        item = %item,
                        error = %message,
                        next = %delay.map_or("when it changes".into(), |d| format!("in {}", crate::config::format_go_duration(d))),
                        "daemon reconcile failed on its input; not retrying until it comes round again"
                    );
                    report.error = Some(message);
                    report.retry_in = delay;
                    report.permanent = true;
                }
                Err(e) => {
                    ctx.metrics.reconcile_error(item.metric_kind(), false);
                    let message = format!("{e:#}");
                    ctx.report(NodeEvent::Failed {
                        permanent: false,
                        message: message.clone(),
                    })
                    .await;
                    let delay = queue.retry(&item);
                    tracing::error!(
                        item = %item,
                        error = %message,
                        retry_in = %crate::config::format_go_duration(delay),
                        "daemon reconcile failed; retrying with backoff"
                    );
                    report.error = Some(message);
                    report.retry_in = Some(delay);
                }
            }
            ctx.observe_active_machine();
            if let Some(tx) = &reports {
                let _ = tx.send(report);
            }
            if let Some(why) = stop {
                tracing::info!(reason = why, "daemon stopping");
                break;
            }
        }

        sources.cancel();
        for t in tasks {
            let _ = t.await;
        }
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
        tracing::info!("daemon shutting down");
        Ok(())
    }
}

/// How long the daemon waits for the work lock before it says so again.
const WORK_LOCK_WAIT: Duration = Duration::from_secs(60);
/// How often it tries the lock meanwhile.
const WORK_LOCK_POLL: Duration = Duration::from_millis(500);

/// The node's work lock ([`crate::flows::worklock`]) for one piece of the daemon's host work,
/// waiting as long as a node-local request holds it. `None`: `shutdown` came first. A lock that
/// cannot be taken at all (its file cannot be created) is logged and the work goes on without
/// it: the daemon's own work is serialised by its queue, and the node must not stop for a lock.
pub(crate) async fn work_lock(
    fs: &flex_host::fs::HostFs,
    shutdown: &CancellationToken,
) -> Option<Option<WorkLock>> {
    loop {
        let taken = tokio::select! {
            r = WorkLock::acquire(fs, WORK_LOCK_WAIT, WORK_LOCK_POLL) => r,
            _ = shutdown.cancelled() => return None,
        };
        match taken {
            Ok(Some(l)) => return Some(Some(l)),
            Ok(None) => tracing::warn!(
                path = crate::flows::worklock::WORK_LOCK_PATH,
                waited_s = WORK_LOCK_WAIT.as_secs(),
                "a node-local request still holds the work lock; waiting on"
            ),
            Err(e) => {
                tracing::error!(error = %e, "could not take the work lock; working without it");
                return Some(None);
            }
        }
    }
}

/// Resumes an interrupted repave ([`crate::flows::repave::resume_pending`]) under the work
/// lock; a failure is logged (the next goal-state apply, or the next start, retries it).
/// `false`: `shutdown` came first.
pub(crate) async fn resume_interrupted_repave(
    ops: &dyn NodeOps,
    guard: &dyn crate::flows::repave::SwitchGuard,
    stores: &Stores,
    fs: &flex_host::fs::HostFs,
    shutdown: &CancellationToken,
    metrics: &DaemonMetrics,
) -> bool {
    let Some(_lock) = work_lock(fs, shutdown).await else {
        return false;
    };
    let started = Instant::now();
    let resumed = crate::flows::repave::resume_pending(ops, guard, stores).await;
    // Counted when there was a repave to resume (or a journal to recover from that failed).
    if !matches!(resumed, Ok(None)) {
        metrics.repave_finished(&resumed, started.elapsed());
    }
    match resumed {
        Ok(Some(s)) => tracing::info!(
            active_machine = %s.active_machine,
            settings_version = %s.applied_settings_version,
            "resumed an interrupted repave"
        ),
        Ok(None) => {}
        Err(e) => tracing::error!(
            error = %e,
            "resuming an interrupted repave failed; the next goal-state apply retries it"
        ),
    }
    true
}

/// Lifts a cordon this agent made, and frees its disruption slot, for work that no longer runs
/// ([`crate::flows::drain::NodeDrain::release_stale`]): a MachineOperation without a record at
/// `claiming` or `executing` (a drain cut short resumes with its reconcile and keeps its
/// cordon), a repave without a journal, and, `at_start` only, the deletion's reset of a node
/// that joined again (while the daemon runs on, that cordon is the reset's and stays).
async fn release_stale_cordon(ctx: &Ctx, at_start: bool) {
    use crate::flows::operations::{RecordStore, Stage};
    let records = RecordStore::new(ctx.host.fs.clone());
    let journal = !matches!(ctx.stores.journal.load(), Ok(None));
    let running = move |owner: &str| {
        if owner.starts_with("repave/") {
            return journal;
        }
        if owner == crate::flows::drain::DELETION_OWNER {
            return !at_start;
        }
        matches!(
            records.load(owner),
            Ok(Some(crate::flows::operations::Record {
                stage: Stage::Claiming | Stage::Executing,
                ..
            })) | Err(_)
        )
    };
    ctx.drain.release_stale(&running).await;
}

/// Runs the daemon for `config` on the real host until `shutdown`: [`run_with`] with the
/// cluster's MachineOperations ([`ClusterOperations`] with the host's handlers over the same
/// machine layer), when the API discovery guard enables them.
pub async fn run(config: &Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let metrics = Arc::new(DaemonMetrics::default());
    crate::flows::metrics::serve(config, &metrics, shutdown.clone()).await;
    let host = Host::real().await?;
    let tally = crate::flows::operations::tally::TallyStore::new(host.fs.clone());
    metrics.local_operations_from(move || tally.series());
    let upgrader = crate::flows::upgrade::Upgrader::for_host(host.clone(), Some(config)).await;
    upgrade_at_start(&upgrader).await;
    watch_proof_deadline(
        upgrader.clone(),
        upgrader.running(),
        PROVE_DEADLINE,
        |message| {
            tracing::error!("{message}");
            std::process::exit(PROOF_OVERDUE_EXIT)
        },
    );
    let proven = Arc::new(ProveUpgrade {
        upgrader: upgrader.clone(),
        running: upgrader.running(),
    });
    run_with(
        host,
        config,
        |kube, host, node| {
            let ops = ClusterOperations::for_host(
                kube.clone(),
                config,
                host,
                node,
                upgrader,
                metrics.clone(),
            )?;
            Ok(Some(Arc::new(ops) as Arc<dyn Operations>))
        },
        Some(proven),
        metrics.clone(),
        shutdown,
    )
    .await
}

/// First thing at every start, before the cluster is reached: on a host, converge the
/// blue/green binary layout and the agent's and recovery units (installs that predate them get
/// them; skipped in the container); then finish an upgrade a restart cut short
/// ([`crate::flows::upgrade`]). A candidate is proven later, after the daemon's first successful
/// reconcile ([`Proven`]). Failures are logged: the daemon runs on.
pub async fn upgrade_at_start(upgrader: &crate::flows::upgrade::Upgrader) {
    let exe = crate::machine::lifecycle::current_exe().ok();
    if let Err(e) = upgrader.converge_host(exe.as_deref()).await {
        tracing::error!(error = %format!("{e:#}"), "could not converge the agent's binary layout and units");
    }
    let running = upgrader.running();
    if let Some(r) = upgrader.on_daemon_start(running.as_deref()) {
        tracing::info!(phase = %r.phase, reason = %r.reason, message = %r.message, "AgentUpgrade finished");
    }
}

/// How long an upgraded agent has to prove itself from its start (a successful reconcile, or
/// [`PROVE_UNREACHABLE_AFTER`] up without its cluster) before it gives up: the candidate's own
/// deadline ([`watch_proof_deadline`]), as long as the unit's `TimeoutStartSec=`.
pub const PROVE_DEADLINE: Duration = Duration::from_secs(300);
/// The exit status of a candidate that gave up at [`PROVE_DEADLINE`] (a failure: its unit's stop
/// guard starts recovery, which rolls it back).
pub const PROOF_OVERDUE_EXIT: i32 = 75;

/// Arms the candidate's own deadline when the daemon running `running` is an upgrade's
/// unproven candidate ([`crate::flows::upgrade::Upgrader::awaits_proof`]): a plain thread (it
/// fires even if the async runtime hangs) that sleeps `deadline`, then calls `give_up` with the
/// reason when the record still waits for this agent's proof
/// ([`crate::flows::upgrade::Upgrader::proof_overdue`]). The real `give_up` exits the process
/// with [`PROOF_OVERDUE_EXIT`]. Returns the thread, when armed.
pub fn watch_proof_deadline(
    upgrader: crate::flows::upgrade::Upgrader,
    running: Option<String>,
    deadline: Duration,
    give_up: impl FnOnce(String) + Send + 'static,
) -> Option<std::thread::JoinHandle<()>> {
    if !upgrader.awaits_proof(running.as_deref()) {
        return None;
    }
    tracing::info!(
        deadline_s = deadline.as_secs(),
        "the upgraded agent must prove itself within its deadline, or it exits and is rolled back"
    );
    let spawned = std::thread::Builder::new()
        .name("proof-deadline".into())
        .spawn(move || {
            std::thread::sleep(deadline);
            if let Some(message) = upgrader.proof_overdue(running.as_deref(), deadline) {
                give_up(message);
            }
        });
    match spawned {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(error = %e, "could not arm the upgraded agent's proof deadline");
            None
        }
    }
}

/// How long a daemon that cannot reach its cluster must stay up to prove the running agent.
///
/// Twice [`START_RETRY_BASE`]: by then a disconnected daemon has done everything it can do
/// without its cluster (loaded its config and state, finished an interrupted repave, converged
/// its units, built its client, tried the API server and retried: its retries start at
/// [`START_RETRY_BASE`] or sooner), and staying up longer only repeats the same attempt. A
/// candidate that fails does so on that path (the harness's broken one exits at once). Online
/// the proof is the first successful reconcile, which comes as soon (docs/upgrade.md).
pub const PROVE_UNREACHABLE_AFTER: Duration = Duration::from_secs(2 * START_RETRY_BASE.as_secs());

/// How long the reachability probe of the early proof waits for a TCP connection.
pub const REACHABILITY_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether the API server at `url` (`https://host[:port]`, port 443 by default) accepts a TCP
/// connection within `timeout`. A URL that does not parse counts as not accepting (the
/// daemon's client fails on it for good anyway).
pub async fn api_server_accepts(url: &str, timeout: Duration) -> bool {
    let Ok(uri) = url.trim().parse::<http::Uri>() else {
        return false;
    };
    let Some(host) = uri.host() else {
        return false;
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(443);
    matches!(
        tokio::time::timeout(
            timeout,
            tokio::net::TcpStream::connect((host.as_str(), port))
        )
        .await,
        Ok(Ok(_))
    )
}

/// Arms the early proof of a daemon that cannot reach its cluster: after `after` (the daemon
/// passes [`PROVE_UNREACHABLE_AFTER`]), unless `shutdown` came first, the API server at `url`
/// is probed ([`api_server_accepts`]); when it does not accept a connection, `proven` makes the
/// running agent last-good. When it does, the proof is left to the first successful reconcile.
/// The daemon aborts the task once it has reached its cluster.
pub fn early_proof(
    proven: Arc<dyn Proven>,
    url: String,
    after: Duration,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(after) => {
                if api_server_accepts(&url, REACHABILITY_TIMEOUT).await {
                    tracing::info!(after_s = after.as_secs(), "the API server accepts connections but the daemon has not reached it yet: the running agent is proven by its first successful reconcile");
                } else {
                    match proven.reconciled() {
                        Ok(_) => tracing::info!(after_s = after.as_secs(), "the running agent stayed up while its cluster cannot be reached: proven"),
                        Err(e) => tracing::error!(error = %format!("{e:#}"), "could not make the running agent last-good"),
                    }
                }
            }
            () = shutdown.cancelled() => {}
        }
    })
}

/// The first delay between start attempts that could not reach the cluster.
pub const START_RETRY_BASE: Duration = Duration::from_secs(5);
/// The largest delay between start attempts.
pub const START_RETRY_MAX: Duration = Duration::from_secs(300);

/// Runs `attempt` until it is done (`Ok`) or fails for good ([`Attempt::Fatal`]: a wrong config
/// does not get better by waiting), waiting [`START_RETRY_BASE`] doubling up to
/// [`START_RETRY_MAX`] after each [`Attempt::Retry`] (the cluster cannot be reached yet; logged
/// with its cause). `Ok(None)`: `shutdown` came first.
pub(crate) async fn until_reachable<T, F, Fut>(
    shutdown: &CancellationToken,
    mut attempt: F,
) -> anyhow::Result<Option<T>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Attempt<anyhow::Error>>>,
{
    let backoff = Backoff::new(u32::MAX, START_RETRY_BASE, START_RETRY_MAX);
    let mut failures = 0u32;
    loop {
        let result = tokio::select! {
            r = attempt() => r,
            _ = shutdown.cancelled() => return Ok(None),
        };
        match result {
            Ok(v) => return Ok(Some(v)),
            Err(Attempt::Fatal(e)) => return Err(e),
            Err(Attempt::Retry { error: e, after }) => {
                failures = failures.saturating_add(1);
                let delay = backoff.delay(failures, after);
                tracing::warn!(error = %format!("{e:#}"), retry_in_s = delay.as_secs(), "cannot reach the cluster yet; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.cancelled() => return Ok(None),
                }
            }
        }
    }
}

/// Runs the daemon for `config` on `host` until `shutdown`: its Kubernetes clients
/// ([`crate::kubeclient::daemon_clients`]), the machine client over them
/// ([`crate::goalclient::client_for_daemon`]), the machine layer
/// ([`crate::machine::node::NodeMachines`]), and, when the API discovery guard enables it
/// ([`operations::enabled`]: `agent.machineOperationMode` and whether the API server serves
/// MachineOperations), the MachineOperation reconciler `operations` builds from the Kubernetes
/// clients, the host and the machine layer (`None`: none), and what proves the running agent
/// after the first successful reconcile (`proven`). Building the clients and discovery are
/// retried with backoff while the cluster cannot be reached.
pub async fn run_with(
    host: Host,
    config: &Config,
    operations: impl FnOnce(
        &KubeClients,
        &Host,
        Arc<dyn NodeOps>,
    ) -> anyhow::Result<Option<Arc<dyn Operations>>>,
    proven: Option<Arc<dyn Proven>>,
    metrics: Arc<DaemonMetrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    tracing::info!(node = %config.agent.node_name, "daemon starting");
    let ops: Arc<dyn NodeOps> = Arc::new(crate::machine::node::NodeMachines::new(
        host.clone(),
        config.clone(),
        crate::goalclient::acr::identity_or_warn,
    )?);
    run_with_ops(host, config, ops, operations, proven, metrics, shutdown).await
}

/// [`run_with`] over the machine layer `ops` (tests give a fake).
pub async fn run_with_ops(
    host: Host,
    config: &Config,
    ops: Arc<dyn NodeOps>,
    operations: impl FnOnce(
        &KubeClients,
        &Host,
        Arc<dyn NodeOps>,
    ) -> anyhow::Result<Option<Arc<dyn Operations>>>,
    proven: Option<Arc<dyn Proven>>,
    metrics: Arc<DaemonMetrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // An interrupted repave is finished (or rolled back) before the cluster is reached: it
    // needs only the node, and a node that cannot reach its cluster (a disconnected site, the
    // offline harness) must not stay half-repaved meanwhile.
    let stores = Stores::new(host.fs.clone());
    if !resume_interrupted_repave(
        ops.as_ref(),
        &crate::flows::repave::NoClusterYet,
        &stores,
        &host.fs,
        &shutdown,
        &metrics,
    )
    .await
    {
        tracing::info!("daemon shutting down before it was ready");
        return Ok(());
    }
    // Obtaining credentials may wait (up to 2 minutes for a certificate per attempt). An API
    // server that cannot be reached (a disconnected site, a cluster not there yet) is retried
    // with backoff while the daemon stays up, rather than crash-looping the unit into its start
    // limit; SIGTERM ends the wait.
    // A daemon that cannot reach its cluster (a disconnected site, the offline harness) proves
    // itself by staying up PROVE_UNREACHABLE_AFTER instead: otherwise an upgrade there would
    // never finish and every later one would be refused. Reaching the cluster first cancels it.
    // Only a cluster that cannot be reached at all counts: an API server that accepts
    // connections (a certificate still waiting for approval, a TLS or credential failure) leaves
    // the proof to the first successful reconcile, or to the candidate's deadline.
    let proof_timer = proven.clone().map(|p| {
        early_proof(
            p,
            config.api_server_url(),
            PROVE_UNREACHABLE_AFTER,
            shutdown.clone(),
        )
    });
    let fs = &host.fs;
    let clients = until_reachable(&shutdown, || {
        let token = shutdown.clone();
        async move {
            match crate::kubeclient::daemon_clients(fs, config, token).await {
                Ok(k) => Ok(k),
                // A wrong config (server, CA, credential) does not get better by waiting.
                Err(e) if e.is_permanent() => Err(Attempt::Fatal(
                    anyhow::Error::new(e).context("daemon kubernetes client"),
                )),
                Err(e) => Err(Attempt::Retry {
                    error: anyhow::Error::new(e).context("daemon kubernetes client"),
                    after: None,
                }),
            }
        }
    })
    .await?;
    if let Some(h) = proof_timer {
        h.abort();
    }
    let Some(kube) = clients else {
        tracing::info!("daemon shutting down before it was ready");
        return Ok(());
    };
    let machines = crate::goalclient::client_for_daemon(config, kube.clone())
        .await
        .map_err(|e| anyhow::anyhow!("machine client: {e}"))?;
    let Some(enabled) =
        operations::enabled(&config.agent.machine_operation_mode, &kube, &shutdown).await?
    else {
        tracing::info!("daemon shutting down before it was ready");
        return Ok(());
    };
    let operations = if enabled {
        operations(&kube, &host, ops.clone())?
    } else {
        None
    };
    let reporter = Reporter::new(
        Arc::new(KubeNodeState::new(kube.clone(), &config.agent.node_name)),
        crate::version::VERSION,
    );
    let mut daemon = Daemon::new(host, config, kube, machines, ops)
        .with_node_state(Arc::new(reporter))
        .with_metrics(metrics);
    if let Some(o) = operations {
        daemon = daemon.with_operations(o);
    }
    if let Some(p) = proven {
        daemon = daemon.with_proven(p);
    }
    daemon.run(shutdown).await
}

/// A token cancelled on the first SIGTERM or SIGINT.
pub fn shutdown_on_signals() -> std::io::Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let t = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "received signal"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "received signal"),
        }
        t.cancel();
    });
    Ok(token)
}

#[cfg(test)]
mod tests;
