//! [`RecordingHandlers`]: the recording fake of [`Handlers`] the flows' tests share (test code only).

#![allow(unused_imports)]

use super::decide::{Action, UpgradeRequest, admit};
use super::handlers::{Handlers, Ran};
use super::record::Record;
use super::{EXECUTION_FAILED, OperationResult};
use crate::flows::reboot::restart_node;
use crate::flows::upgrade::{OperationRef, Resumed, Started, Upgrader};
use crate::machine::nspawn::Timings;
use crate::machine::seams::NodeOps;
use crate::state::{STATE_PATH, StateStore};
use async_trait::async_trait;
use flex_api::machina::OperationPhase;
use flex_api::machina::yaml_scalar;
use flex_host::context::Host;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

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
    resume: Option<Resumed>,
    upgrade: Option<Started>,
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
        self.lock().resume = Some(Resumed::Finished(result));
        self
    }

    /// Makes [`Handlers::resume_interrupted`] answer [`Resumed::Pending`].
    pub fn resume_pending(&self) -> &Self {
        self.lock().resume = Some(Resumed::Pending);
        self
    }

    /// Makes an AgentUpgrade's [`Handlers::run`] answer `started` (default: a handoff).
    pub fn upgrade_with(&self, started: Started) -> &Self {
        self.lock().upgrade = Some(started);
        self
    }

    /// The calls so far.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    fn call(&self, name: &str) -> anyhow::Result<()> {
        let mut st = self.lock();
        st.calls.push(name.into());
        let first = name.split(' ').next().unwrap_or(name);
        match st.fail.get(name).or_else(|| st.fail.get(first)) {
            Some(m) => Err(anyhow::anyhow!("{m}")),
            None => Ok(()),
        }
    }
}

#[async_trait]
impl Handlers for RecordingHandlers {
    /// Records `node_reboot`, `agent_reset`, or `agent_upgrade image=…|downloadURL=… op=…`.
    async fn run(&self, action: &Action, op: Option<OperationRef>) -> anyhow::Result<Ran> {
        match action {
            Action::NodeReboot(_) => self.call("node_reboot").map(|()| Ran::Done(None)),
            Action::AgentReset(_) => self.call("agent_reset").map(|()| Ran::Done(None)),
            Action::AgentUpgrade(request) => {
                let what = match request {
                    UpgradeRequest::Image(i) => format!("image={i}"),
                    UpgradeRequest::Download { url, .. } => format!("downloadURL={url}"),
                };
                let op = op.map(|o| o.name).unwrap_or_else(|| "-".into());
                self.call(&format!("agent_upgrade {what} op={op}"))?;
                Ok(
                    match self
                        .lock()
                        .upgrade
                        .clone()
                        .unwrap_or_else(|| Started::HandedOff("restart scheduled".into()))
                    {
                        Started::HandedOff(m) => Ran::HandedOff(m),
                        Started::AlreadyCurrent(m) => Ran::Done(Some(m)),
                    },
                )
            }
        }
    }
    async fn stop_daemon(&self) -> anyhow::Result<()> {
        self.call("stop_daemon")
    }
    fn resume_interrupted(&self, _record: &Record) -> Resumed {
        self.lock().resume.clone().unwrap_or(Resumed::Unknown)
    }
}
