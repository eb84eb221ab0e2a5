//! The kube side of MachineOperations: [`Reconciler::reconcile`] brings one operation forward
//! (GET, decide, claim, run, finish, delete after its TTL), and [`watch_stream`] names the
//! operations worth reconciling. The daemon calls both from one serialized work queue; both
//! take the client to use, so a rotated credential is picked up by the next call. After a
//! completed AgentReset the outcome asks the caller to stop the daemon
//! ([`Outcome::stop_daemon`]): the reconciler itself never stops it.
//!
//! Every status write is a JSON merge patch of `/status` that carries the `resourceVersion` it
//! was computed from, so the API server refuses it (409) if anything changed the operation in
//! between; the reconciler then reads it again and decides again, up to [`MAX_CONFLICTS`]
//! times in a row. Deletion after the TTL carries the UID and `resourceVersion` as
//! preconditions, so a replaced or edited operation is not deleted.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use super::decide::{
    Action, Decision, Facts, Resume, decide, format_time, interrupted, may_concern, may_target,
    needs_labels,
};
use super::handlers::{Executed, Handlers, execute, stops_daemon};
use super::record::{Record, RecordStore, Stage};
use super::{
    DISRUPTION_BUDGET_INVALID, DRAIN_FAILED, DRAIN_TIMED_OUT, IN_PROGRESS, NODE_NOT_READY,
    OperationResult,
};
use crate::flows::drain::budget::{self, BudgetTimings, Change, Keeper};
use crate::flows::drain::{
    DrainApiFactory, DrainError, DrainPolicy, DrainTimings, Drained, NodeDrainApi, Release,
    Subject, cordon_and_drain, kube_drain_api, ready, release, wait_ready,
};
use crate::flows::metrics::DaemonMetrics;
use crate::flows::upgrade::{OperationRef, Resumed};
use crate::kubeclient::describe;
use crate::state::StateError;
use flex_api::machina::{
    CONDITION_COMPLETED, Machine, MachineOperation, OperationKind, OperationPhase,
};
use flex_api::operations::WAITING_FOR_DISRUPTION_SLOT;

/// Conflicting writes in a row after which a reconcile gives up (the queue retries later).
pub const MAX_CONFLICTS: usize = 5;

/// The time source (injectable for tests).
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// Who this agent is, and where it keeps its records.
#[derive(Clone, Debug)]
pub struct ReconcilerConfig {
    /// The machine name operations target with `machineRef` (the node name on AKS Flex Node).
    pub machine_name: String,
    /// The Node whose labels `machineSelector` is matched against.
    pub node_name: String,
    /// The local records ([`RecordStore::new`] on a host).
    pub records: RecordStore,
    /// Whether the agent runs in its container image.
    pub containerized: bool,
    /// The node's drain before a NodeReboot or an AgentReset, when the operation names none
    /// (`agent.drain`).
    pub drain: DrainPolicy,
}

/// What one reconcile did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Taken {
    /// The operation does not exist (any local record of it was removed).
    Gone,
    /// Nothing, and why.
    Ignored(String),
    /// Refused: this agent held a record of it and it no longer names this machine (reported
    /// as a warning; the record is dropped).
    Refused(String),
    /// It is finished and waits for its TTL.
    Waiting,
    /// It was finished with this result (run now, resumed, or refused without running).
    Finished(OperationResult),
    /// It was deleted after its TTL.
    Deleted,
    /// An AgentUpgrade switched and handed over to the agent it restarts on, which finishes it.
    HandedOff(String),
}

/// How often a pending AgentUpgrade handoff is looked at again (the restart normally ends this
/// daemon within seconds).
pub const HANDOFF_RECHECK: Duration = Duration::from_secs(30);

/// What running an operation came to.
enum Ran {
    /// It ran (or was finished without running); its record says how. The operation as a
    /// status write during the run left it, if there was one.
    Done(Option<Box<MachineOperation>>),
    /// An AgentUpgrade handed over to the agent it restarts on.
    HandedOff(String),
    /// It waits for a slot of the disruption budget: nothing was done yet.
    Deferred(String),
}

/// `op`'s status reason, if it has one.
fn status_reason(op: &MachineOperation) -> Option<&str> {
    op.status.as_ref().map(|s| s.reason.as_str())
}

/// The result of a reconcile: what was done, and what the caller does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Requeue the name after this long (a TTL to wait out); `None`: only on the next event.
    pub requeue_after: Option<Duration>,
    /// What was done.
    pub taken: Taken,
    /// An AgentReset completed and its status says so: uninstall the agent's service and stop
    /// the daemon ([`super::Handlers::stop_daemon`] does the former).
    pub stop_daemon: bool,
}

impl Outcome {
    fn done(taken: Taken) -> Self {
        Self {
            requeue_after: None,
            taken,
            stop_daemon: false,
        }
    }
}

/// Why a reconcile failed (the queue retries it with backoff).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// An API call failed.
    #[error("{action} MachineOperation {name}: {}", describe(cause))]
    Api {
        /// `get`, `mark in progress`, `finish`, `delete`.
        action: &'static str,
        /// The operation.
        name: String,
        /// The client's error, described with its causes (in the message, not a `source()`).
        cause: kube::Error,
    },
    /// Reading the labels a selector is matched against failed.
    #[error("read labels of {kind} {name}: {}", describe(cause))]
    Labels {
        /// `Node` or `Machine`.
        kind: &'static str,
        /// Its name.
        name: String,
        /// The client's error, described with its causes (in the message, not a `source()`).
        cause: kube::Error,
    },
    /// The local record could not be written (nothing runs without it).
    #[error("record MachineOperation {name}: {cause}")]
    Record {
        /// The operation.
        name: String,
        /// The file error (in the message, not a `source()`).
        cause: StateError,
    },
    /// The operation kept changing under the reconciler.
    #[error("MachineOperation {name} kept changing: {attempts} conflicting writes in a row")]
    Conflict {
        /// The operation.
        name: String,
        /// How many.
        attempts: usize,
    },
}

impl ReconcileError {
    /// Whether reconciling the same operation again cannot help: the API server rejected one of
    /// the reconciler's requests as malformed (400 BadRequest, 422 Invalid, as when a status
    /// breaks the CRD's schema). Transport errors, conflicts, 5xx, 401/403 (credentials and RBAC
    /// can change) and a record that could not be written may pass.
    pub fn is_permanent(&self) -> bool {
        match self {
            ReconcileError::Api {
                cause: kube::Error::Api(s),
                ..
            }
            | ReconcileError::Labels {
                cause: kube::Error::Api(s),
                ..
            } => matches!(s.code, 400 | 422),
            _ => false,
        }
    }
}

enum WriteError {
    Conflict,
    NotFound,
    Other(kube::Error),
}

fn classify(e: kube::Error) -> WriteError {
    match &e {
        kube::Error::Api(s) if s.is_conflict() => WriteError::Conflict,
        kube::Error::Api(s) if s.is_not_found() => WriteError::NotFound,
        _ => WriteError::Other(e),
    }
}

/// The APIs one reconcile uses.
struct Apis {
    ops: Api<MachineOperation>,
    nodes: Api<Node>,
    machines: Api<Machine>,
    drain: Arc<dyn NodeDrainApi>,
}

/// Reconciles MachineOperations for one machine.
pub struct Reconciler {
    cfg: ReconcilerConfig,
    handlers: Arc<dyn Handlers>,
    clock: Clock,
    /// Records by UID, mirroring the files, so a result survives its file's removal (AgentReset
    /// removes `/etc/aks-flex-node`) until the status says it.
    memory: Mutex<HashMap<String, Record>>,
    metrics: Arc<DaemonMetrics>,
    drain_api: DrainApiFactory,
    drain_timings: DrainTimings,
    budget_timings: BudgetTimings,
    /// The holders the last `WaitingForDisruptionSlot` Event named (one Event per change).
    slot_told: budget::Told,
}

impl Reconciler {
    /// A reconciler for `cfg`'s machine, running operations through `handlers`.
    pub fn new(cfg: ReconcilerConfig, handlers: Arc<dyn Handlers>) -> Self {
        Self {
            cfg,
            handlers,
            clock: Arc::new(Timestamp::now),
            memory: Mutex::new(HashMap::new()),
            metrics: Arc::new(DaemonMetrics::default()),
            drain_api: kube_drain_api(),
            drain_timings: DrainTimings::default(),
            budget_timings: BudgetTimings::default(),
            slot_told: budget::Told::default(),
        }
    }

    /// The same with another drain seam and timings (tests).
    pub fn with_drain(mut self, api: DrainApiFactory, timings: DrainTimings) -> Self {
        self.drain_api = api;
        self.drain_timings = timings;
        self
    }

    /// The same with other looks for a slot of the disruption budget (default:
    /// [`BudgetTimings::default`]). For drivers outside the daemon that compress time, as the
    /// fleet simulator (`cargo xtask fleet`) does; the daemon keeps the default.
    pub fn with_budget_timings(mut self, timings: BudgetTimings) -> Self {
        self.budget_timings = timings;
        self
    }

    /// Counts finished operations in `metrics` (by default in metrics of its own).
    pub fn with_metrics(mut self, metrics: Arc<DaemonMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The same with another clock.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    fn now(&self) -> Timestamp {
        let t = (self.clock)();
        Timestamp::from_second(t.as_second()).unwrap_or(t)
    }

    fn memory(&self) -> MutexGuard<'_, HashMap<String, Record>> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Brings the operation `name` forward through `client`; see [`crate::flows::operations`] for what
    /// that means.
    pub async fn reconcile(&self, client: Client, name: &str) -> Result<Outcome, ReconcileError> {
        let drain = (self.drain_api)(client.clone(), &self.cfg.node_name);
        let apis = Apis {
            ops: Api::all(client.clone()),
            nodes: Api::all(client.clone()),
            machines: Api::all(client),
            drain,
        };
        let mut current: Option<MachineOperation> = None;
        let mut conflicts = 0;
        // The labels a selector is matched against, read once per reconcile when needed.
        let mut labels: Option<Option<BTreeMap<String, String>>> = None;
        // Each pass either returns or moves the operation forward (claim → run → finish), or
        // re-reads it after a conflict; the bound only guards against a loop.
        for _ in 0..(MAX_CONFLICTS + 8) {
            if conflicts > MAX_CONFLICTS {
                break;
            }
            let op = match current.take() {
                Some(op) => op,
                None => match apis.ops.get_opt(name).await {
                    Ok(Some(op)) => op,
                    Ok(None) => {
                        self.forget_name(name);
                        return Ok(Outcome::done(Taken::Gone));
                    }
                    Err(cause) => {
                        return Err(ReconcileError::Api {
                            action: "get",
                            name: name.into(),
                            cause,
                        });
                    }
                },
            };
            let uid = op.metadata.uid.clone().unwrap_or_default();
            let kind = op.spec.operation_kind.clone();
            if labels.is_none() && needs_labels(&op) {
                labels = Some(self.labels(&apis).await?);
            }
            let record = self.load_record(&uid, name, &kind);
            let facts = Facts {
                machine_name: &self.cfg.machine_name,
                labels: labels.as_ref().and_then(Option::as_ref),
                containerized: self.cfg.containerized,
                now: self.now(),
            };
            let decision = decide(&op, &facts, record.as_ref());
            match decision {
                Decision::Ignore(why) => {
                    tracing::info!(operation = name, kind = %kind, reason = %why, "ignoring MachineOperation");
                    return Ok(Outcome::done(Taken::Ignored(why)));
                }
                Decision::Wait(left) => {
                    tracing::debug!(
                        operation = name,
                        seconds = left.as_secs(),
                        "MachineOperation finished; waiting for its TTL"
                    );
                    return Ok(Outcome {
                        requeue_after: Some(left),
                        taken: Taken::Waiting,
                        stop_daemon: false,
                    });
                }
                Decision::Forget(why) => {
                    tracing::info!(operation = name, reason = %why, "dropping the local record of a lost claim");
                    self.drop_record(&uid);
                    return Ok(Outcome::done(Taken::Ignored(why)));
                }
                Decision::Refuse(why) => {
                    tracing::warn!(operation = name, kind = %kind, reason = %why, "refusing MachineOperation: it does not name this machine");
                    self.drop_record(&uid);
                    return Ok(Outcome::done(Taken::Refused(why)));
                }
                Decision::Delete => match delete(&apis, &op).await {
                    Ok(()) => {
                        tracing::info!(operation = name, "deleted MachineOperation after its TTL");
                        self.drop_record(&uid);
                        return Ok(Outcome::done(Taken::Deleted));
                    }
                    Err(WriteError::NotFound) => {
                        self.drop_record(&uid);
                        return Ok(Outcome::done(Taken::Gone));
                    }
                    Err(WriteError::Conflict) => conflicts += 1,
                    Err(WriteError::Other(cause)) => {
                        return Err(ReconcileError::Api {
                            action: "delete",
                            name: name.into(),
                            cause,
                        });
                    }
                },
                Decision::Finish(result) => {
                    tracing::warn!(operation = name, kind = %kind, reason = %result.reason, message = %result.message, "refusing MachineOperation; nothing was run");
                    match self.finish(&apis, &op, &result).await? {
                        Some(done) => return Ok(done),
                        None => conflicts += 1,
                    }
                }
                Decision::Resume(Resume::Report(result)) => {
                    match self.finish(&apis, &op, &result).await? {
                        Some(mut done) => {
                            done.stop_daemon =
                                done.taken != Taken::Gone && stops_daemon(&kind, &result);
                            if done.stop_daemon {
                                tracing::info!(
                                    operation = name,
                                    "AgentReset complete; the daemon stops"
                                );
                            }
                            return Ok(done);
                        }
                        None => conflicts += 1,
                    }
                }
                Decision::Resume(Resume::Interrupted) => {
                    let mut rec = record.unwrap_or_else(|| new_record(&op, Stage::Executing, ""));
                    let result = match self.handlers.resume_interrupted(&rec) {
                        Resumed::Finished(r) => r,
                        Resumed::Unknown => interrupted(&kind),
                        Resumed::Pending => {
                            return Ok(Outcome {
                                requeue_after: Some(HANDOFF_RECHECK),
                                taken: Taken::Ignored(
                                    "the AgentUpgrade hands over to the restarted agent".into(),
                                ),
                                stop_daemon: false,
                            });
                        }
                    };
                    tracing::warn!(operation = name, kind = %kind, reason = %result.reason, "MachineOperation was cut short by a restart; not running it again");
                    if drains(&kind) {
                        self.release_when_ready(&apis, &uid).await;
                    }
                    rec.stage = Stage::Finished;
                    rec.result = Some(result);
                    self.save_record(&rec, self.cfg.records.exists(&uid))?;
                    current = Some(op);
                }
                Decision::Resume(Resume::Execute(action)) => {
                    let rec = record.unwrap_or_else(|| new_record(&op, Stage::Claiming, ""));
                    match self.run(&apis, &op, &rec, &action).await? {
                        Ran::Done(fresher) => current = Some(fresher.map_or(op, |o| *o)),
                        Ran::HandedOff(m) => return Ok(Outcome::done(Taken::HandedOff(m))),
                        Ran::Deferred(why) => return Ok(self.deferred(&apis, &op, why).await),
                    }
                }
                Decision::Claim(action) => {
                    let started = op
                        .status
                        .as_ref()
                        .and_then(|s| s.started_at.as_ref())
                        .map(|t| t.0)
                        .unwrap_or_else(|| self.now());
                    let rec = new_record(&op, Stage::Claiming, &format_time(&started));
                    self.save_record(&rec, true)?;
                    tracing::info!(operation = name, kind = %kind, "claiming MachineOperation");
                    let body = in_progress_patch(
                        &op,
                        &self.cfg.node_name,
                        action.in_progress_message(),
                        started,
                        self.now(),
                    );
                    match patch_status(&apis, &op, &body).await {
                        Ok(patched) => match self.run(&apis, &patched, &rec, &action).await? {
                            Ran::Done(fresher) => current = Some(fresher.map_or(patched, |o| *o)),
                            Ran::HandedOff(m) => {
                                return Ok(Outcome::done(Taken::HandedOff(m)));
                            }
                            Ran::Deferred(why) => {
                                return Ok(self.deferred(&apis, &patched, why).await);
                            }
                        },
                        Err(WriteError::Conflict) => {
                            // The claim was lost or raced: this agent did not claim it.
                            self.drop_record(&uid);
                            conflicts += 1;
                        }
                        Err(WriteError::NotFound) => {
                            self.drop_record(&uid);
                            return Ok(Outcome::done(Taken::Gone));
                        }
                        Err(WriteError::Other(cause)) => {
                            return Err(ReconcileError::Api {
                                action: "mark in progress",
                                name: name.into(),
                                cause,
                            });
                        }
                    }
                }
            }
        }
        Err(ReconcileError::Conflict {
            name: name.into(),
            attempts: conflicts,
        })
    }

    /// Drains the node first when the action disrupts it, then records `executing`, runs the
    /// handler, and records the result (in memory only when the handler removed the record, as
    /// AgentReset does). After a NodeReboot it waits for the Node to be Ready and lifts its
    /// cordon; after a failure it lifts it at once; after a completed AgentReset the node stays
    /// cordoned (it no longer runs kubelet).
    /// Returns the handoff message when an AgentUpgrade handed over to the agent it restarts
    /// on (the record stays `executing`; that agent finishes it).
    async fn run(
        &self,
        apis: &Apis,
        op: &MachineOperation,
        claim: &Record,
        action: &Action,
    ) -> Result<Ran, ReconcileError> {
        // The operation as the last status write left it, when this run wrote one.
        let mut fresher: Option<Box<MachineOperation>> = None;
        let mut rec = claim.clone();
        let kind = action.kind();
        let policy = match action {
            Action::NodeReboot(r) | Action::AgentReset(r) => Some(r.resolve(self.cfg.drain)),
            Action::AgentUpgrade(_) => None,
        };
        let mut drained = Drained::default();
        // Renews the budget's slot while the work runs; dropped when it is done.
        let mut keeper: Option<Keeper> = None;
        if let Some(policy) = policy {
            // The record stays `claiming` while the drain runs: a restart drains again.
            tracing::info!(operation = %rec.name, kind = %kind, timeout = ?policy.timeout, on_timeout = policy.on_timeout.as_str(), "cordoning and draining the node");
            let subject = Subject {
                owner: rec.uid.clone(),
                what: format!("MachineOperation {} ({kind})", rec.name),
                related: Some(ObjectReference {
                    api_version: Some(MachineOperation::api_version(&()).into_owned()),
                    kind: Some(MachineOperation::kind(&()).into_owned()),
                    name: Some(rec.name.clone()),
                    uid: Some(rec.uid.clone()),
                    ..ObjectReference::default()
                }),
            };
            // A slot of the cluster's disruption budget first (still `claiming`: a restart
            // asks again and finds the slot its own).
            let slot = match budget::acquire(
                apis.drain.as_ref(),
                &self.cfg.node_name,
                &subject,
                self.budget_timings,
                &self.slot_told,
            )
            .await
            {
                Ok(slot) => slot,
                Err(budget::AcquireError::Busy(why)) => {
                    // Back to the daemon; the record stays `claiming`, and the next reconcile
                    // (after SLOT_RECHECK, or the operation's next change) asks again.
                    tracing::info!(operation = %rec.name, kind = %kind, reason = %why, "waiting for a disruption slot");
                    return Ok(Ran::Deferred(why));
                }
                Err(e) => {
                    tracing::warn!(operation = %rec.name, kind = %kind, error = %e, "no disruption slot; the operation is not run");
                    let reason = match e {
                        budget::AcquireError::Invalid(_) => DISRUPTION_BUDGET_INVALID,
                        _ => DRAIN_FAILED,
                    };
                    rec.stage = Stage::Finished;
                    rec.result = Some(OperationResult::failed(
                        reason,
                        format!("{kind} not run: {e}"),
                    ));
                    self.save_record(&rec, true)?;
                    return Ok(Ran::Done(fresher));
                }
            };
            keeper = Some(Keeper::start(
                apis.drain.clone(),
                &self.cfg.node_name,
                &slot,
            ));
            if status_reason(op) == Some(WAITING_FOR_DISRUPTION_SLOT) {
                // It waited: its status says it runs again.
                fresher = self
                    .set_status(apis, op, IN_PROGRESS, action.in_progress_message())
                    .await
                    .map(Box::new);
            }
            match cordon_and_drain(
                apis.drain.as_ref(),
                &self.cfg.node_name,
                &subject,
                policy,
                self.drain_timings,
            )
            .await
            {
                Ok(d) => drained = d,
                Err(e) => {
                    let reason = match e {
                        DrainError::TimedOut { .. } => DRAIN_TIMED_OUT,
                        _ => DRAIN_FAILED,
                    };
                    let released = self.release(apis, &rec.uid).await;
                    drop(keeper.take());
                    self.slot(apis, &rec.uid, Change::Release).await;
                    tracing::warn!(operation = %rec.name, kind = %kind, error = %e, "drain did not complete; the operation is not run");
                    rec.stage = Stage::Finished;
                    rec.result = Some(OperationResult::failed(
                        reason,
                        format!("{kind} not run: {e}; {released}"),
                    ));
                    self.save_record(&rec, true)?;
                    return Ok(Ran::Done(fresher));
                }
            }
        }
        rec.stage = Stage::Executing;
        self.save_record(&rec, true)?;
        tracing::info!(operation = %rec.name, kind = %kind, message = action.in_progress_message(), "running MachineOperation");
        let op = OperationRef {
            uid: rec.uid.clone(),
            name: rec.name.clone(),
        };
        let since = self.now();
        let mut result = match execute(action, self.handlers.as_ref(), Some(op)).await {
            Executed::Finished(r) => r,
            Executed::HandedOff(m) => {
                tracing::info!(operation = %rec.name, message = %m, "MachineOperation handed over to the restarted agent");
                return Ok(Ran::HandedOff(m));
            }
        };
        if policy.is_some() {
            result = self
                .after_disruption(apis, &rec, &kind, result, since)
                .await;
            drop(keeper.take());
            // Not Ready after the disruption: the slot is kept for good and the rollout stops
            // until someone looks (or the node is Ready again and its daemon starts).
            let slot = if result.reason == NODE_NOT_READY {
                Change::Stuck
            } else {
                Change::Release
            };
            self.slot(apis, &rec.uid, slot).await;
            if result.succeeded()
                && let Some(d) = drained.detail()
            {
                result.message = format!("{}: {d}", result.message);
            }
        }
        let keep_file = self.cfg.records.exists(&rec.uid);
        if !keep_file {
            tracing::info!(operation = %rec.name, "the operation removed its record; keeping its result in memory");
        }
        rec.stage = Stage::Finished;
        rec.result = Some(result);
        if let Err(e) = self.save_record(&rec, keep_file) {
            // The result is in memory; the next pass reports it.
            tracing::warn!(error = %e, "could not record the result of a MachineOperation");
        }
        Ok(Ran::Done(fresher))
    }

    /// The cordon after a drained operation ran: a completed NodeReboot waits for the Node to
    /// be Ready, then lifts it (not Ready in time: the operation fails and the node stays
    /// cordoned); a failure lifts it; a completed AgentReset keeps it.
    async fn after_disruption(
        &self,
        apis: &Apis,
        rec: &Record,
        kind: &OperationKind,
        result: OperationResult,
        since: Timestamp,
    ) -> OperationResult {
        if !result.succeeded() {
            let released = self.release(apis, &rec.uid).await;
            return OperationResult {
                message: format!("{}; {released}", result.message),
                ..result
            };
        }
        if *kind != OperationKind::NodeReboot {
            tracing::info!(operation = %rec.name, "AgentReset complete; the node stays cordoned");
            return result;
        }
        match wait_ready(apis.drain.as_ref(), since, self.drain_timings).await {
            Ok(()) => {
                self.release(apis, &rec.uid).await;
                result
            }
            Err(e) => OperationResult::failed(
                NODE_NOT_READY,
                format!("the active machine restarted, but {e}; the node stays cordoned"),
            ),
        }
    }

    /// Lifts operation `uid`'s cordon; says in words what became of it (a failure is logged:
    /// the cordon stays, and the daemon's next start lifts it).
    async fn release(&self, apis: &Apis, uid: &str) -> &'static str {
        match release(apis.drain.as_ref(), &self.cfg.node_name, Some(uid)).await {
            Ok(Release::Uncordon | Release::ForgetAnnotation) => "the node is uncordoned",
            Ok(Release::Nothing) => "the node's cordon is not this agent's and stays",
            Err(e) => {
                tracing::warn!(error = %e, "could not uncordon the node");
                "the node could not be uncordoned (the daemon tries again when it starts)"
            }
        }
    }

    /// The outcome of operation `op` waiting for a disruption slot (looked at again after
    /// [`budget::SLOT_RECHECK`]); its status says so, written only when what it says changes
    /// (not at each look).
    async fn deferred(&self, apis: &Apis, op: &MachineOperation, why: String) -> Outcome {
        let said = op.status.as_ref().map(|s| s.message.as_str());
        // Written when the wait begins and when it turns from held to paused or back, not at
        // each change of the holders (each would be a watch event for every watcher of the
        // operation, and their number grows with the burst): the holders it names are those
        // of when it began; the Node's Events and the daemon's log say more.
        if status_reason(op) != Some(WAITING_FOR_DISRUPTION_SLOT)
            || said.is_none_or(|s| wait_is_paused(s) != wait_is_paused(&why))
        {
            self.set_status(apis, op, WAITING_FOR_DISRUPTION_SLOT, &why)
                .await;
        }
        Outcome {
            requeue_after: Some(budget::SLOT_RECHECK),
            taken: Taken::Ignored(format!("waiting for a disruption slot: {why}")),
            stop_daemon: false,
        }
    }

    /// Sets the status reason and message of `op` in progress (and its `Completed`
    /// condition's), under its resourceVersion; returns the operation as written. A failure is
    /// logged: the status is for people, the next write puts it right.
    async fn set_status(
        &self,
        apis: &Apis,
        op: &MachineOperation,
        reason: &str,
        message: &str,
    ) -> Option<MachineOperation> {
        let body = json!({
            "metadata": precondition(op),
            "status": {
                "reason": reason,
                "message": message,
                "conditions": with_completed(op, "False", reason, message, self.now()),
            },
        });
        let error = match patch_status(apis, op, &body).await {
            Ok(written) => return Some(written),
            Err(WriteError::Conflict) => "it changed meanwhile".to_string(),
            Err(WriteError::NotFound) => "it is gone".to_string(),
            Err(WriteError::Other(e)) => describe(&e),
        };
        tracing::warn!(operation = %op.name_any(), reason, error = %error, "could not write the operation's status");
        None
    }

    /// Renews as stuck or frees operation `uid`'s slot of the disruption budget; a failure is
    /// logged (a slot not freed lapses after its lease; the daemon frees it when it starts).
    async fn slot(&self, apis: &Apis, uid: &str, what: Change) {
        if let Err(e) =
            budget::change(apis.drain.as_ref(), &self.cfg.node_name, Some(uid), what).await
        {
            tracing::warn!(error = %e, change = ?what, "could not change the disruption slot");
        }
    }

    /// Lifts operation `uid`'s cordon and frees its slot if the Node is Ready (an operation a
    /// restart cut short).
    async fn release_when_ready(&self, apis: &Apis, uid: &str) {
        match apis.drain.node().await {
            Ok(Some(n)) if ready(&n).is_some_and(|(r, _)| r) => {
                self.release(apis, uid).await;
                self.slot(apis, uid, Change::Release).await;
            }
            Ok(_) => {
                // Kept, as after a NodeReboot not Ready in time: the rollout stops here.
                tracing::warn!(
                    operation = uid,
                    "the node is not Ready; its cordon and disruption slot stay"
                );
                self.slot(apis, uid, Change::Stuck).await;
            }
            Err(e) => tracing::warn!(error = %e, "could not read the node; its cordon stays"),
        }
    }

    /// Finishes `op` with `result`: `Some(outcome)` when written (or the operation is gone),
    /// `None` on a conflict.
    async fn finish(
        &self,
        apis: &Apis,
        op: &MachineOperation,
        result: &OperationResult,
    ) -> Result<Option<Outcome>, ReconcileError> {
        let name = op.name_any();
        let now = self.now();
        let body = finish_patch(op, &self.cfg.node_name, result, now);
        match patch_status(apis, op, &body).await {
            Ok(_) => {
                let took = op
                    .status
                    .as_ref()
                    .and_then(|s| s.started_at.as_ref())
                    .and_then(|t| u64::try_from(now.as_millisecond() - t.0.as_millisecond()).ok())
                    .map(Duration::from_millis);
                self.metrics
                    .operation_finished(&op.spec.operation_kind, result, took);
                if result.succeeded() {
                    tracing::info!(operation = %name, kind = %op.spec.operation_kind, reason = %result.reason, message = %result.message, "MachineOperation complete");
                } else {
                    tracing::warn!(operation = %name, kind = %op.spec.operation_kind, reason = %result.reason, message = %result.message, "MachineOperation failed");
                }
                let ttl = op.spec.ttl_seconds_after_finished;
                Ok(Some(Outcome {
                    requeue_after: ttl.map(|t| Duration::from_secs(u64::try_from(t).unwrap_or(0))),
                    taken: Taken::Finished(result.clone()),
                    stop_daemon: false,
                }))
            }
            Err(WriteError::Conflict) => Ok(None),
            Err(WriteError::NotFound) => {
                if let Some(uid) = &op.metadata.uid {
                    self.drop_record(uid);
                }
                Ok(Some(Outcome::done(Taken::Gone)))
            }
            Err(WriteError::Other(cause)) => Err(ReconcileError::Api {
                action: "finish",
                name,
                cause,
            }),
        }
    }

    /// The Node's labels, else the Machine's; `None` when neither exists.
    async fn labels(
        &self,
        apis: &Apis,
    ) -> Result<Option<BTreeMap<String, String>>, ReconcileError> {
        let node = &self.cfg.node_name;
        match apis.nodes.get_opt(node).await {
            Ok(Some(n)) => return Ok(Some(n.metadata.labels.unwrap_or_default())),
            Ok(None) => {}
            Err(cause) => {
                return Err(ReconcileError::Labels {
                    kind: "Node",
                    name: node.clone(),
                    cause,
                });
            }
        }
        let machine = &self.cfg.machine_name;
        match apis.machines.get_opt(machine).await {
            Ok(m) => Ok(m.map(|m| m.metadata.labels.unwrap_or_default())),
            Err(cause) => Err(ReconcileError::Labels {
                kind: "Machine",
                name: machine.clone(),
                cause,
            }),
        }
    }

    /// The record of `uid`: its file, else the in-memory copy. A record that cannot be read is
    /// taken for a run that started (never run twice).
    fn load_record(&self, uid: &str, name: &str, kind: &OperationKind) -> Option<Record> {
        if uid.is_empty() {
            return None;
        }
        match self.cfg.records.load(uid) {
            Ok(Some(r)) => Some(r),
            Ok(None) => self.memory().get(uid).cloned(),
            Err(e) => {
                tracing::warn!(operation = name, error = %e, "unreadable MachineOperation record; treating the operation as started");
                Some(Record {
                    version: 1,
                    uid: uid.into(),
                    name: name.into(),
                    kind: kind.clone(),
                    stage: Stage::Executing,
                    started_at: String::new(),
                    result: None,
                })
            }
        }
    }

    fn save_record(&self, rec: &Record, to_file: bool) -> Result<(), ReconcileError> {
        self.memory().insert(rec.uid.clone(), rec.clone());
        if to_file {
            self.cfg
                .records
                .save(rec)
                .map_err(|cause| ReconcileError::Record {
                    name: rec.name.clone(),
                    cause,
                })?;
        }
        Ok(())
    }

    fn drop_record(&self, uid: &str) {
        if uid.is_empty() {
            return;
        }
        self.memory().remove(uid);
        if let Err(e) = self.cfg.records.delete(uid) {
            tracing::warn!(error = %e, "could not remove a MachineOperation record");
        }
    }

    fn forget_name(&self, name: &str) {
        self.memory().retain(|_, r| r.name != name);
        if let Err(e) = self.cfg.records.delete_named(name) {
            tracing::warn!(error = %e, "could not remove MachineOperation records");
        }
    }
}

async fn patch_status(
    apis: &Apis,
    op: &MachineOperation,
    body: &serde_json::Value,
) -> Result<MachineOperation, WriteError> {
    apis.ops
        .patch_status(&op.name_any(), &PatchParams::default(), &Patch::Merge(body))
        .await
        .map_err(classify)
}

async fn delete(apis: &Apis, op: &MachineOperation) -> Result<(), WriteError> {
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: op.metadata.uid.clone(),
            resource_version: op.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    apis.ops
        .delete(&op.name_any(), &dp)
        .await
        .map(|_| ())
        .map_err(classify)
}

fn new_record(op: &MachineOperation, stage: Stage, started_at: &str) -> Record {
    Record {
        version: 1,
        uid: op.metadata.uid.clone().unwrap_or_default(),
        name: op.name_any(),
        kind: op.spec.operation_kind.clone(),
        stage,
        started_at: started_at.into(),
        result: None,
    }
}

/// The `Completed` condition list after setting it to `status`/`reason`/`message` (its
/// `lastTransitionTime` moves only when its status changes).
fn with_completed(
    op: &MachineOperation,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Vec<Condition> {
    let mut conditions = op
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let previous = conditions
        .iter()
        .position(|c| c.type_ == CONDITION_COMPLETED);
    let last_transition_time = match previous.map(|i| &conditions[i]) {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Time(now),
    };
    let c = Condition {
        type_: CONDITION_COMPLETED.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time,
        observed_generation: op.metadata.generation,
    };
    match previous {
        Some(i) => conditions[i] = c,
        None => conditions.push(c),
    }
    conditions
}

fn precondition(op: &MachineOperation) -> serde_json::Value {
    match &op.metadata.resource_version {
        Some(rv) => json!({ "resourceVersion": rv }),
        None => json!({}),
    }
}

/// The merge patch that claims `op` for `node`: `InProgress`, `message`, `startedAt`,
/// `claimedBy`, `Completed`=False (`InProgress`), with `op`'s `resourceVersion` as the
/// precondition.
pub fn in_progress_patch(
    op: &MachineOperation,
    node: &str,
    message: &str,
    started: Timestamp,
    now: Timestamp,
) -> serde_json::Value {
    json!({
        "metadata": precondition(op),
        "status": {
            "phase": OperationPhase::InProgress.as_str(),
            "reason": IN_PROGRESS,
            "message": message,
            "startedAt": format_time(&started),
            "claimedBy": node,
            "conditions": with_completed(op, "False", IN_PROGRESS, message, now),
        },
    })
}

/// The merge patch with which `node` finishes `op` with `result`: phase, reason, message,
/// `startedAt` (kept, or now), `completedAt`, `claimedBy`, and `Completed` (True, or False when
/// `Failed`, with the result's reason), with `op`'s `resourceVersion` as the precondition.
pub fn finish_patch(
    op: &MachineOperation,
    node: &str,
    result: &OperationResult,
    now: Timestamp,
) -> serde_json::Value {
    let started = op
        .status
        .as_ref()
        .and_then(|s| s.started_at.as_ref())
        .map(|t| t.0)
        .unwrap_or(now);
    let status = if result.succeeded() { "True" } else { "False" };
    json!({
        "metadata": precondition(op),
        "status": {
            "phase": result.phase.as_str(),
            "reason": result.reason,
            "message": result.message,
            "startedAt": format_time(&started),
            "completedAt": format_time(&now),
            "claimedBy": node,
            "conditions": with_completed(op, status, &result.reason, &result.message, now),
        },
    })
}

/// The field a daemon selects MachineOperations by: `spec.machineRef`, a `selectableFields`
/// entry of the CRD (`deploy/crds/machina.yaml`; served by default from Kubernetes 1.31, GA in
/// 1.32). An operation without the field (aimed by selector) reads as `""`.
pub const MACHINE_REF_FIELD: &str = "spec.machineRef";

/// What a daemon's MachineOperation watch covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchScope {
    /// Two field-selected watches ([`field_selectors`]): the operations whose `machineRef`
    /// names this machine, and those with no `machineRef` (aimed by selector, which the daemon
    /// matches itself). What the API server lists and sends does not grow with the fleet's
    /// operations aimed at other machines.
    Machine,
    /// Every operation: the API server does not select by [`MACHINE_REF_FIELD`] (a CRD
    /// installed without `selectableFields`, or a Kubernetes before 1.31). The filter is the
    /// daemon's own ([`may_concern`]), and the cost grows with the fleet.
    All,
}

/// The field selectors of [`WatchScope::Machine`]: operations aimed at `machine`, and operations
/// aimed by selector. (Machine names are DNS names, which need no escaping in a selector.)
pub fn field_selectors(machine: &str) -> [String; 2] {
    [
        format!("{MACHINE_REF_FIELD}={machine}"),
        format!("{MACHINE_REF_FIELD}="),
    ]
}

/// Whether the API server refused a field selector on [`MACHINE_REF_FIELD`]: a 400 that says
/// the field label is not supported (the answer for a field the CRD does not declare
/// selectable).
pub fn refuses_field_selector(status: &kube::core::Status) -> bool {
    status.code == 400 && status.message.contains("field label not supported")
}

/// [`refuses_field_selector`] for a watch's error, whichever call failed.
pub fn watch_refuses_field_selector(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(k)
        | watcher::Error::WatchStartFailed(k)
        | watcher::Error::WatchFailed(k) => {
            matches!(k, kube::Error::Api(s) if refuses_field_selector(s))
        }
        watcher::Error::WatchError(s) => refuses_field_selector(s),
        watcher::Error::NoResourceVersion => false,
    }
}

/// The scope to watch with, from a one-item list with the first of [`field_selectors`]: a
/// refusal of the field falls back to [`WatchScope::All`] (logged); anything else (an answer,
/// or a failure the watch itself will retry) keeps [`WatchScope::Machine`].
pub async fn probe_scope(api: &Api<MachineOperation>, machine_name: &str) -> WatchScope {
    let [mine, _] = field_selectors(machine_name);
    match api
        .list(&kube::api::ListParams::default().fields(&mine).limit(1))
        .await
    {
        Err(kube::Error::Api(s)) if refuses_field_selector(&s) => {
            tracing::warn!(
                machine = machine_name,
                field = MACHINE_REF_FIELD,
                answer = %s.message,
                "the API server cannot select MachineOperations by spec.machineRef (CRD without selectableFields, or Kubernetes before 1.31); watching all of them"
            );
            WatchScope::All
        }
        _ => WatchScope::Machine,
    }
}

type OpEvents =
    futures::stream::BoxStream<'static, Result<Event<MachineOperation>, watcher::Error>>;

/// The watch events of `scope` (each watch restarted with backoff). A [`WatchScope::Machine`]
/// stream whose field selector the API server refuses (the CRD was replaced meanwhile) passes
/// the error on and ends, so that the caller's restart probes again.
pub fn scope_events(api: Api<MachineOperation>, scope: WatchScope, machine_name: &str) -> OpEvents {
    match scope {
        WatchScope::All => watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed(),
        WatchScope::Machine => {
            let [mine, by_selector] = field_selectors(machine_name);
            let watch = |fields: String| {
                watcher::watcher(api.clone(), watcher::Config::default().fields(&fields))
                    .default_backoff()
            };
            futures::stream::select(watch(mine), watch(by_selector))
                .flat_map(|ev| {
                    let refused = matches!(&ev, Err(e) if watch_refuses_field_selector(e));
                    futures::stream::iter(std::iter::once(Some(ev)).chain(refused.then_some(None)))
                })
                .take_while(|ev| futures::future::ready(ev.is_some()))
                .filter_map(futures::future::ready)
                .boxed()
        }
    }
}

/// Names of MachineOperations worth reconciling for `machine_name`, from a watch scoped to it
/// ([`probe_scope`], [`scope_events`]; restarted with backoff; errors are passed on for
/// logging): added or changed ones that [`may_concern`] this machine, and deleted ones that may
/// have targeted it (so their records go). The initial list names every such operation, which
/// is how an operation interrupted by a restart is found again. The stream ends when a scoped
/// watch is refused; the caller starts it again.
pub fn watch_stream(
    client: Client,
    machine_name: String,
) -> impl Stream<Item = Result<String, watcher::Error>> + Send + 'static {
    let api: Api<MachineOperation> = Api::all(client);
    let probe = {
        let (api, machine) = (api.clone(), machine_name.clone());
        async move { probe_scope(&api, &machine).await }
    };
    futures::stream::once(probe)
        .flat_map({
            let machine = machine_name.clone();
            move |scope| scope_events(api.clone(), scope, &machine)
        })
        .filter_map(move |ev| {
            let out = match ev {
                Ok(Event::Apply(op) | Event::InitApply(op)) => {
                    may_concern(&op, &machine_name).then(|| Ok(op.name_any()))
                }
                Ok(Event::Delete(op)) => may_target(&op, &machine_name).then(|| Ok(op.name_any())),
                Ok(Event::Init | Event::InitDone) => None,
                Err(e) => Some(Err(e)),
            };
            futures::future::ready(out)
        })
}

/// Whether operations of `kind` cordon and drain the node first.
fn drains(kind: &OperationKind) -> bool {
    matches!(kind, OperationKind::NodeReboot | OperationKind::AgentReset)
}

/// Whether a wait's message says the budget is paused (`maxUnavailable: 0`) rather than held.
fn wait_is_paused(message: &str) -> bool {
    message.contains(budget::PAUSED)
}
