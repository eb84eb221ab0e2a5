//! The handlers operations run through, and node-local runs.
//!
//! [`Handlers`] is the seam between operations and the host: [`HostHandlers`] restarts the
//! active machine ([`crate::repave::restart_node`]), resets the node
//! ([`crate::reset::reset_node`]) and stops the daemon ([`crate::systemd::uninstall_service`]);
//! [`RecordingHandlers`] records calls for tests. [`execute`] maps an [`Action`] to handler
//! calls and a result; the reconciler and [`run_local`] (`aks-flex-node operation run`) both use
//! it, so a handler never depends on where an operation came from.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use super::decide::{Action, admit};
use super::record::Record;
use super::{EXECUTION_FAILED, OperationResult, UNSUPPORTED_OPERATION};
use crate::context::Host;
use crate::machina::yaml_scalar;
use crate::machine::Timings;
use crate::repave::{NodeOps, restart_node};
use crate::state::{STATE_PATH, StateStore};

/// What operations do to the node.
#[async_trait]
pub trait Handlers: Send + Sync {
    /// NodeReboot: stop and start the active machine (no reprovisioning, no state change).
    async fn node_reboot(&self) -> anyhow::Result<()>;
    /// AgentReset: reset the node without stopping the daemon.
    async fn agent_reset(&self) -> anyhow::Result<()>;
    /// After a completed AgentReset: uninstall the agent's service, which stops the daemon for
    /// good (it may not return). [`run_local`] calls it; in the daemon the reconcile's
    /// [`super::Outcome::stop_daemon`] asks the daemon to do the same.
    async fn stop_daemon(&self) -> anyhow::Result<()>;
    /// The result of an operation whose run a daemon restart cut short (`record` is at
    /// [`super::Stage::Executing`]), when something on the node knows it (the hook for
    /// AgentUpgrade's signal file); `None` finishes it as `Interrupted`.
    fn resume_interrupted(&self, _record: &Record) -> Option<OperationResult> {
        None
    }
}

/// Runs `action` through `handlers`; the result is what the status records. Stopping the daemon
/// after an AgentReset is the caller's (after it has reported the result).
pub async fn execute(action: &Action, handlers: &dyn Handlers) -> OperationResult {
    let kind = action.kind();
    let outcome = match action {
        Action::NodeReboot => handlers.node_reboot().await,
        Action::AgentReset => handlers.agent_reset().await,
        Action::AgentUpgrade(_) => {
            return OperationResult::failed(
                UNSUPPORTED_OPERATION,
                format!("operation kind {kind} is not supported by AKS FlexNode daemon yet"),
            );
        }
    };
    match outcome {
        Ok(()) => OperationResult::complete(format!("{kind} completed")),
        Err(e) => OperationResult::failed(EXECUTION_FAILED, format!("{e:#}")),
    }
}

/// Whether a finished `kind` with `result` stops the daemon next (a completed AgentReset).
pub fn stops_daemon(kind: &str, result: &OperationResult) -> bool {
    kind == crate::machina::AGENT_RESET && result.succeeded()
}

/// Runs one operation node-locally, without a cluster, through the same validation and
/// handlers as the daemon: `aks-flex-node operation run <kind> [--param k=v]...`. A completed
/// AgentReset stops the daemon afterwards, as in the daemon (a failure to stop it is logged; the
/// reset itself completed). Nothing runs for invalid input.
pub async fn run_local(
    kind: &str,
    params: &BTreeMap<String, String>,
    handlers: &dyn Handlers,
    containerized: bool,
) -> OperationResult {
    let action = match admit(kind, params, containerized) {
        Ok(a) => a,
        Err(f) => {
            tracing::warn!(kind, reason = f.reason, message = %f.message, "operation not run");
            return f.into_result();
        }
    };
    tracing::info!(
        kind,
        message = action.in_progress_message(),
        "running operation"
    );
    let result = execute(&action, handlers).await;
    if result.succeeded() {
        tracing::info!(kind, reason = %result.reason, message = %result.message, "operation completed");
    } else {
        tracing::error!(kind, reason = %result.reason, message = %result.message, "operation failed");
    }
    if stops_daemon(kind, &result)
        && let Err(e) = handlers.stop_daemon().await
    {
        tracing::error!(error = %format!("{e:#}"), "stop daemon after AgentReset");
    }
    result
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

/// Parses `--param k=v` arguments into parameters; `Err` names a malformed or repeated one.
pub fn parse_params<S: AsRef<str>>(args: &[S]) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for a in args {
        let a = a.as_ref();
        let Some((k, v)) = a.split_once('=').filter(|(k, _)| !k.trim().is_empty()) else {
            return Err(format!("parameter {a:?} is not key=value"));
        };
        if out.insert(k.trim().to_string(), v.to_string()).is_some() {
            return Err(format!("parameter {:?} is given twice", k.trim()));
        }
    }
    Ok(out)
}

/// The real handlers, over the host and the node's machines.
pub struct HostHandlers {
    host: Host,
    node: Arc<dyn NodeOps>,
    timings: Timings,
}

impl HostHandlers {
    /// Handlers on `host`, with `node` (`crate::node::NodeMachines` on a real host) for
    /// restarts, and default machine timings.
    pub fn new(host: Host, node: Arc<dyn NodeOps>) -> Self {
        Self {
            host,
            node,
            timings: Timings::default(),
        }
    }

    /// The same, with other machine timings (tests).
    pub fn with_timings(mut self, timings: Timings) -> Self {
        self.timings = timings;
        self
    }
}

#[async_trait]
impl Handlers for HostHandlers {
    async fn node_reboot(&self) -> anyhow::Result<()> {
        let state = StateStore::new(self.host.fs.clone())
            .load()?
            .ok_or_else(|| {
                anyhow::anyhow!("no daemon state at {STATE_PATH}: this node has no active machine")
            })?;
        restart_node(self.node.as_ref(), &state).await
    }

    async fn agent_reset(&self) -> anyhow::Result<()> {
        crate::reset::reset_node(&self.host, self.timings).await?;
        Ok(())
    }

    async fn stop_daemon(&self) -> anyhow::Result<()> {
        crate::systemd::uninstall_service(&self.host.fs, self.host.systemd.as_ref()).await?;
        Ok(())
    }
}

/// Handlers that record their calls (`node_reboot`, `agent_reset`, `stop_daemon`) and fail the
/// ones they are told to, for tests here and elsewhere.
#[derive(Clone, Default)]
pub struct RecordingHandlers {
    inner: Arc<Mutex<Recorded>>,
}

#[derive(Default)]
struct Recorded {
    calls: Vec<String>,
    fail: BTreeMap<String, String>,
    resume: Option<OperationResult>,
}

impl RecordingHandlers {
    /// Handlers on which every call succeeds.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Recorded> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `call` (`node_reboot`, `agent_reset`, `stop_daemon`) fail with `message`.
    pub fn fail_on(&self, call: &str, message: &str) -> &Self {
        self.lock().fail.insert(call.into(), message.into());
        self
    }

    /// Makes [`Handlers::resume_interrupted`] answer `result`.
    pub fn resume_with(&self, result: OperationResult) -> &Self {
        self.lock().resume = Some(result);
        self
    }

    /// The calls so far.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    fn call(&self, name: &str) -> anyhow::Result<()> {
        let mut st = self.lock();
        st.calls.push(name.into());
        match st.fail.get(name) {
            Some(m) => Err(anyhow::anyhow!("{m}")),
            None => Ok(()),
        }
    }
}

#[async_trait]
impl Handlers for RecordingHandlers {
    async fn node_reboot(&self) -> anyhow::Result<()> {
        self.call("node_reboot")
    }
    async fn agent_reset(&self) -> anyhow::Result<()> {
        self.call("agent_reset")
    }
    async fn stop_daemon(&self) -> anyhow::Result<()> {
        self.call("stop_daemon")
    }
    fn resume_interrupted(&self, _record: &Record) -> Option<OperationResult> {
        self.lock().resume.clone()
    }
}
