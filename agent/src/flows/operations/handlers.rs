//! The handlers operations run through, and node-local runs.
//!
//! [`Handlers`] is the seam between operations and the host: [`HostHandlers`] restarts the
//! active machine ([`crate::flows::reboot::restart_node`]), resets the node
//! ([`crate::flows::reset::reset_node`]), upgrades the agent ([`crate::flows::upgrade::Upgrader`]) and stops
//! the daemon ([`crate::systemd::uninstall_service`]);
//! [`execute`] maps an [`Action`] to handler
//! calls and a result; the reconciler and [`run_local`] (`aks-flex-node operation run`) both use
//! it, so a handler never depends on where an operation came from.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use super::decide::{Action, UpgradeRequest, admit};
use super::record::Record;
use super::{EXECUTION_FAILED, OperationResult};
use crate::flows::reboot::restart_node;
use crate::flows::upgrade::{OperationRef, Resumed, Started, Upgrader};
use crate::machine::nspawn::Timings;
use crate::machine::seams::NodeOps;
use crate::state::{STATE_PATH, StateStore};
use flex_api::machina::yaml_scalar;
use flex_api::machina::{OperationKind, OperationPhase};
use flex_host::context::Host;

/// How a handler's run of an action ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ran {
    /// Done; a detail for the result's message, if any (`AgentUpgrade completed: <detail>`).
    Done(Option<String>),
    /// Handed over to the agent it restarts on (AgentUpgrade), which finishes the operation.
    HandedOff(String),
}

/// What operations do to the node.
#[async_trait]
pub trait Handlers: Send + Sync {
    /// Carries out `action` for the MachineOperation `op` (`None` node-locally): one arm per
    /// kind, each a flow of its own (NodeReboot: stop and start the active machine; AgentReset:
    /// reset the node without stopping the daemon; AgentUpgrade: fetch, check and switch to the
    /// candidate and schedule the restart onto it, [`crate::flows::upgrade::Upgrader::start`]).
    async fn run(&self, action: &Action, op: Option<OperationRef>) -> anyhow::Result<Ran>;
    /// After a completed AgentReset: uninstall the agent's service, which stops the daemon for
    /// good (it may not return). [`run_local`] calls it; in the daemon the reconcile's
    /// [`super::Outcome::stop_daemon`] asks the daemon to do the same.
    async fn stop_daemon(&self) -> anyhow::Result<()>;
    /// How an operation whose run a daemon restart cut short ended (`record` is at
    /// [`super::Stage::Executing`]), when something on the node knows it (AgentUpgrade's
    /// upgrade record); [`Resumed::Unknown`] finishes it as `Interrupted`, [`Resumed::Pending`]
    /// leaves it `InProgress` (the handoff to the restarted agent is under way).
    fn resume_interrupted(&self, _record: &Record) -> Resumed {
        Resumed::Unknown
    }
}

/// How [`execute`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Executed {
    /// The operation is over: the status records this.
    Finished(OperationResult),
    /// An AgentUpgrade handed over to the agent it restarts on (the message is for people);
    /// the operation stays `InProgress` until that agent finishes it.
    HandedOff(String),
}

impl Executed {
    /// The result, when finished.
    pub fn result(&self) -> Option<&OperationResult> {
        match self {
            Executed::Finished(r) => Some(r),
            Executed::HandedOff(_) => None,
        }
    }
}

/// Runs `action` (for the MachineOperation `op`, `None` node-locally) through `handlers`; a
/// finished result is what the status records. Stopping the daemon after an AgentReset is the
/// caller's (after it has reported the result).
pub async fn execute(
    action: &Action,
    handlers: &dyn Handlers,
    op: Option<OperationRef>,
) -> Executed {
    let kind = action.kind();
    match handlers.run(action, op).await {
        Ok(Ran::HandedOff(m)) => Executed::HandedOff(m),
        Ok(Ran::Done(None)) => {
            Executed::Finished(OperationResult::complete(format!("{kind} completed")))
        }
        Ok(Ran::Done(Some(detail))) => Executed::Finished(OperationResult::complete(format!(
            "{kind} completed: {detail}"
        ))),
        Err(e) => Executed::Finished(OperationResult::failed(EXECUTION_FAILED, format!("{e:#}"))),
    }
}

/// What a handoff looks like as a status would record it while it runs (`operation run`).
pub fn handoff_result(message: &str) -> (OperationPhase, &'static str, String) {
    (
        OperationPhase::InProgress,
        crate::flows::upgrade::RESTART_SCHEDULED,
        message.to_string(),
    )
}

/// Whether a finished `kind` with `result` stops the daemon next (a completed AgentReset).
pub fn stops_daemon(kind: &OperationKind, result: &OperationResult) -> bool {
    *kind == OperationKind::AgentReset && result.succeeded()
}

/// Runs one operation node-locally, without a cluster, through the same validation and
/// handlers as the daemon: `aks-flex-node operation run <kind> [--param k=v]...`. A completed
/// AgentReset stops the daemon afterwards, as in the daemon (a failure to stop it is logged; the
/// reset itself completed). An AgentUpgrade hands over to the restarted agent, which finishes it
/// in the upgrade record (`aks-flex-node operation status`). Nothing runs for invalid input.
pub async fn run_local(
    kind: &OperationKind,
    params: &BTreeMap<String, String>,
    handlers: &dyn Handlers,
    containerized: bool,
) -> Executed {
    let kind_name = kind.as_str();
    let action = match admit(kind, params, containerized) {
        Ok(a) => a,
        Err(f) => {
            tracing::warn!(kind = kind_name, reason = f.reason, message = %f.message, "operation not run");
            return Executed::Finished(f.into_result());
        }
    };
    tracing::info!(
        kind = kind_name,
        message = action.in_progress_message(),
        "running operation"
    );
    let executed = execute(&action, handlers, None).await;
    let result = match &executed {
        Executed::HandedOff(m) => {
            tracing::info!(kind = kind_name, message = %m, "operation handed over to the restarted agent");
            return executed;
        }
        Executed::Finished(r) => r,
    };
    if result.succeeded() {
        tracing::info!(kind = kind_name, reason = %result.reason, message = %result.message, "operation completed");
    } else {
        tracing::error!(kind = kind_name, reason = %result.reason, message = %result.message, "operation failed");
    }
    if stops_daemon(kind, result)
        && let Err(e) = handlers.stop_daemon().await
    {
        tracing::error!(error = %format!("{e:#}"), "stop daemon after AgentReset");
    }
    executed
}

/// An [`Executed`] as the status would record it: `phase`, `reason` and `message` lines (YAML;
/// a handoff is `InProgress`/`RestartScheduled`).
pub fn render_executed(executed: &Executed) -> String {
    match executed {
        Executed::Finished(r) => render_result(r),
        Executed::HandedOff(m) => {
            let (phase, reason, message) = handoff_result(m);
            format!(
                "phase: {phase}\nreason: {}\nmessage: {}\n",
                yaml_scalar(reason),
                yaml_scalar(&message)
            )
        }
    }
}

/// The result as the status would record it: `phase`, `reason` and `message` lines (YAML).
pub fn render_result(result: &OperationResult) -> String {
    format!(
        "phase: {}\nreason: {}\nmessage: {}\n",
        result.phase,
        yaml_scalar(&result.reason),
        yaml_scalar(&result.message)
    )
}

/// A `--param` argument that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    /// Not `key=value`, or an empty key.
    #[error("parameter {0:?} is not key=value")]
    NotKeyValue(String),
    /// The same key twice.
    #[error("parameter {0:?} is given twice")]
    Repeated(String),
}

/// Parses `--param k=v` arguments into parameters; `Err` names a malformed or repeated one.
pub fn parse_params<S: AsRef<str>>(args: &[S]) -> Result<BTreeMap<String, String>, ParamError> {
    let mut out = BTreeMap::new();
    for a in args {
        let a = a.as_ref();
        let Some((k, v)) = a.split_once('=').filter(|(k, _)| !k.trim().is_empty()) else {
            return Err(ParamError::NotKeyValue(a.to_string()));
        };
        if out.insert(k.trim().to_string(), v.to_string()).is_some() {
            return Err(ParamError::Repeated(k.trim().to_string()));
        }
    }
    Ok(out)
}

/// The real handlers, over the host and the node's machines.
pub struct HostHandlers {
    host: Host,
    node: Arc<dyn NodeOps>,
    timings: Timings,
    upgrader: Upgrader,
}

impl HostHandlers {
    /// Handlers on `host`, with `node` (`crate::machine::node::NodeMachines` on a real host) for
    /// restarts, default machine timings, and an upgrader without an image store (give one
    /// with [`Self::with_upgrader`] in the container).
    pub fn new(host: Host, node: Arc<dyn NodeOps>) -> Self {
        Self {
            upgrader: Upgrader::new(host.clone()),
            host,
            node,
            timings: Timings::default(),
        }
    }

    /// The same with another upgrader.
    pub fn with_upgrader(mut self, upgrader: Upgrader) -> Self {
        self.upgrader = upgrader;
        self
    }

    /// The same, with other machine timings (tests).
    pub fn with_timings(mut self, timings: Timings) -> Self {
        self.timings = timings;
        self
    }
}

impl HostHandlers {
    async fn node_reboot(&self) -> anyhow::Result<()> {
        let state = StateStore::new(self.host.fs.clone())
            .load()?
            .ok_or_else(|| {
                anyhow::anyhow!("no daemon state at {STATE_PATH}: this node has no active machine")
            })?;
        restart_node(self.node.as_ref(), &state).await
    }

    async fn agent_reset(&self) -> anyhow::Result<()> {
        crate::flows::reset::reset_node(&self.host, self.timings).await?;
        Ok(())
    }

    async fn agent_upgrade(
        &self,
        request: &UpgradeRequest,
        op: Option<OperationRef>,
    ) -> anyhow::Result<Ran> {
        Ok(match self.upgrader.start(request, op).await? {
            Started::HandedOff(m) => Ran::HandedOff(m),
            Started::AlreadyCurrent(m) => Ran::Done(Some(m)),
        })
    }
}

#[async_trait]
impl Handlers for HostHandlers {
    async fn run(&self, action: &Action, op: Option<OperationRef>) -> anyhow::Result<Ran> {
        match action {
            Action::NodeReboot(_) => self.node_reboot().await.map(|()| Ran::Done(None)),
            Action::AgentReset(_) => self.agent_reset().await.map(|()| Ran::Done(None)),
            Action::AgentUpgrade(request) => self.agent_upgrade(request, op).await,
        }
    }

    async fn stop_daemon(&self) -> anyhow::Result<()> {
        crate::systemd::uninstall_service(&self.host.fs, self.host.systemd.as_ref()).await?;
        Ok(())
    }

    fn resume_interrupted(&self, record: &Record) -> Resumed {
        self.upgrader.resume(&record.uid)
    }
}
