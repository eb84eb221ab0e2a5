//! Blue/green repave (`ApplyGoalState`); NodeReboot is [`crate::flows::reboot`].
//!
//! A repave moves the node from the active machine to the other side in phases, recorded in a
//! journal (`/etc/aks-flex-node/repave-state.json` + `.sha256`) before each phase starts, so a
//! daemon that dies mid-repave resumes where it was:
//!
//! | phase | what runs | the old side |
//! |---|---|---|
//! | `preparing` | provision the target (rootfs, components, config) | still running |
//! | `switching` | stop the old side (they share the host's network and ports) | stopping |
//! | `starting` | start the target and wait for kubelet | stopped |
//! | `saving` | save the daemon state naming the target — the switch | stopped |
//! | `cleaning` | remove the old side | being removed |
//!
//! A failure before `saving` rolls back: the target is stopped and removed and the old side is
//! started again, so the old side ends running and the daemon state is unchanged. A failure while
//! `cleaning` leaves the journal for the next start to finish. Which steps run and what a
//! failure means are decided by pure functions ([`plan`], [`on_failure`]) tested table by table;
//! [`apply_goal_state`] executes them through [`NodeOps`].

use serde::{Deserialize, Serialize};

use crate::flows::start::GoalState;
use crate::fs::HostFs;
use crate::machine::nspawn::alternate;
pub use crate::machine::seams::{NodeOps, SeamError};
use crate::state::{DaemonState, JsonStore, StateError, StateStore};

/// Where the repave journal lives.
pub const JOURNAL_PATH: &str = "/etc/aks-flex-node/repave-state.json";

/// A repave's phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Provisioning the target.
    Preparing,
    /// Stopping the old side.
    Switching,
    /// Starting the target.
    Starting,
    /// Saving the daemon state.
    Saving,
    /// Removing the old side.
    Cleaning,
}

/// The durable record of a repave in progress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Journal {
    /// Format version (1).
    pub version: u32,
    /// The side being left.
    pub source: String,
    /// The side being built.
    pub target: String,
    /// The goal's settings version.
    pub settings_version: String,
    /// The goal's Kubernetes version.
    pub kubernetes_version: String,
    /// The phase about to run (or running).
    pub phase: Phase,
}

/// One step of a repave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Record the phase in the journal.
    Record(Phase),
    /// Provision the machine (rebuilding a tree this agent owns).
    Provision(String),
    /// Stop the machine.
    Stop(String),
    /// Start the machine and wait for kubelet.
    Start(String),
    /// Save the daemon state naming the target.
    SaveState,
    /// Remove the machine.
    Cleanup(String),
    /// Delete the journal.
    Finish,
}

/// What to do when a step of `phase` fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// Stop and remove the target, start the old side, delete the journal.
    Rollback,
    /// Keep the journal: the next attempt resumes the phase (the switch already happened).
    Resume,
}

/// The steps that remain from `phase` (inclusive).
pub fn plan(j: &Journal) -> Vec<Step> {
    use Phase::*;
    let all = [
        (
            Preparing,
            vec![Step::Record(Preparing), Step::Provision(j.target.clone())],
        ),
        (
            Switching,
            vec![Step::Record(Switching), Step::Stop(j.source.clone())],
        ),
        (
            Starting,
            vec![Step::Record(Starting), Step::Start(j.target.clone())],
        ),
        (Saving, vec![Step::Record(Saving), Step::SaveState]),
        (
            Cleaning,
            vec![Step::Record(Cleaning), Step::Cleanup(j.source.clone())],
        ),
    ];
    let mut out: Vec<Step> = all
        .into_iter()
        .skip_while(|(p, _)| *p != j.phase)
        .flat_map(|(_, steps)| steps)
        .collect();
    out.push(Step::Finish);
    out
}

/// What a failure in `phase` means.
pub fn on_failure(phase: Phase) -> Recovery {
    match phase {
        Phase::Preparing | Phase::Switching | Phase::Starting => Recovery::Rollback,
        Phase::Saving | Phase::Cleaning => Recovery::Resume,
    }
}

/// The journal for a new repave from `state` to `goal`.
pub fn begin(state: &DaemonState, goal: &GoalState) -> Result<Journal, StateError> {
    let source = state.active()?.to_string();
    Ok(Journal {
        version: 1,
        target: alternate(&source).to_string(),
        source,
        settings_version: goal.settings_version.clone(),
        kubernetes_version: goal.kubernetes_version.clone(),
        phase: Phase::Preparing,
    })
}

/// The daemon state after a repave described by `j` (`previous*` from `state`).
pub fn next_state(state: &DaemonState, j: &Journal) -> DaemonState {
    DaemonState {
        applied_settings_version: j.settings_version.clone(),
        applied_kubernetes_version: j.kubernetes_version.clone(),
        previous_settings_version: state.applied_settings_version.clone(),
        previous_kubernetes_version: state.applied_kubernetes_version.clone(),
        active_machine: j.target.clone(),
    }
}

/// Why a repave failed.
#[derive(Debug, thiserror::Error)]
pub enum RepaveError {
    /// State or journal I/O.
    #[error(transparent)]
    State(#[from] StateError),
    /// A step failed and the node was rolled back to the old side.
    #[error("apply machine goal state: {step} failed, rolled back to {source_machine}: {error:#}")]
    RolledBack {
        /// The failed step.
        step: String,
        /// The side running again.
        source_machine: String,
        /// The failure.
        error: SeamError,
    },
    /// A step failed and rolling back failed too.
    #[error(
        "apply machine goal state: {step} failed: {error:#}; rollback to {source_machine} failed: {rollback:#}"
    )]
    RollbackFailed {
        /// The failed step.
        step: String,
        /// The side that should run.
        source_machine: String,
        /// The failure.
        error: SeamError,
        /// The rollback failure.
        rollback: SeamError,
    },
    /// A step after the switch failed; the journal stays for the next attempt.
    #[error(
        "apply machine goal state: {step} failed after the switch to {target} (will resume): {error:#}"
    )]
    AfterSwitch {
        /// The failed step.
        step: String,
        /// The active side.
        target: String,
        /// The failure.
        error: SeamError,
    },
}

impl RepaveError {
    /// Whether the same goal would fail the same way again: the node was rolled back because a
    /// step was given something wrong ([`SeamError::Permanent`]), so a retry waits for a new
    /// goal. A node left half-switched, or a rollback that failed, is always retried.
    pub fn is_permanent(&self) -> bool {
        matches!(self, RepaveError::RolledBack { error, .. } if error.is_permanent())
    }
}

/// Files the repave uses.
pub struct Stores {
    /// The daemon state.
    pub state: StateStore,
    /// The journal.
    pub journal: JsonStore<Journal>,
}

impl Stores {
    /// The default paths under `fs`.
    pub fn new(fs: HostFs) -> Self {
        Self {
            state: StateStore::new(fs.clone()),
            journal: JsonStore::at(fs, JOURNAL_PATH),
        }
    }
}

fn step_name(s: &Step) -> String {
    match s {
        Step::Record(p) => format!("record {p:?}").to_lowercase(),
        Step::Provision(m) => format!("provision {m}"),
        Step::Stop(m) => format!("stop {m}"),
        Step::Start(m) => format!("start {m}"),
        Step::SaveState => "save-daemon-state".into(),
        Step::Cleanup(m) => format!("cleanup {m}"),
        Step::Finish => "finish".into(),
    }
}

/// Runs the repave in `journal` from its phase; returns the new daemon state.
pub async fn run(
    ops: &dyn NodeOps,
    stores: &Stores,
    state: &DaemonState,
    mut journal: Journal,
) -> Result<DaemonState, RepaveError> {
    let next = next_state(state, &journal);
    tracing::info!(
        old_machine = %journal.source,
        new_machine = %journal.target,
        settings_version = %journal.settings_version,
        kubernetes_version = %journal.kubernetes_version,
        phase = ?journal.phase,
        "starting nspawn machine goal-state apply"
    );
    for step in plan(&journal) {
        let name = step_name(&step);
        let result: Result<(), SeamError> = match &step {
            Step::Record(p) => {
                journal.phase = *p;
                let saved = stores.journal.save(&journal).map_err(SeamError::transient);
                if saved.is_ok() {
                    flex_host::fault::point(&format!("repave.phase:{p:?}").to_lowercase());
                }
                saved
            }
            Step::Provision(m) => ops.provision(m, &journal.kubernetes_version).await,
            Step::Stop(m) => ops.stop(m).await,
            Step::Start(m) => ops.start(m).await,
            Step::SaveState => stores.state.save(&next).map_err(SeamError::transient),
            Step::Cleanup(m) => ops.cleanup(m).await,
            Step::Finish => stores.journal.delete().map_err(SeamError::transient),
        };
        let Err(error) = result else { continue };
        return Err(match on_failure(journal.phase) {
            Recovery::Resume => RepaveError::AfterSwitch {
                step: name,
                target: journal.target.clone(),
                error,
            },
            Recovery::Rollback => match rollback(ops, stores, &journal).await {
                Ok(()) => RepaveError::RolledBack {
                    step: name,
                    source_machine: journal.source.clone(),
                    error,
                },
                Err(rb) => RepaveError::RollbackFailed {
                    step: name,
                    source_machine: journal.source.clone(),
                    error,
                    rollback: rb,
                },
            },
        });
    }
    Ok(next)
}

async fn rollback(ops: &dyn NodeOps, stores: &Stores, j: &Journal) -> Result<(), SeamError> {
    tracing::warn!(target_machine = %j.target, source = %j.source, "rolling back repave");
    if let Err(e) = ops.stop(&j.target).await {
        tracing::warn!(error = %format!("{e:#}"), "stopping the target during rollback failed");
    }
    if let Err(e) = ops.cleanup(&j.target).await {
        tracing::warn!(error = %format!("{e:#}"), "removing the target during rollback failed");
    }
    if j.phase != Phase::Preparing {
        ops.start(&j.source).await?;
    }
    stores.journal.delete().map_err(SeamError::transient)
}

/// `ApplyGoalState`: resumes a journaled repave for the same goal, or starts a new one.
pub async fn apply_goal_state(
    ops: &dyn NodeOps,
    stores: &Stores,
    state: &DaemonState,
    goal: &GoalState,
) -> Result<DaemonState, RepaveError> {
    let journal = match stores.journal.load()? {
        Some(j)
            if j.settings_version == goal.settings_version && j.source == state.active_machine =>
        {
            j
        }
        Some(j) => {
            // A repave to another goal was interrupted: finish or undo it first.
            tracing::warn!(pending_settings = %j.settings_version, "resuming an interrupted repave to another goal first");
            let st = match run(ops, stores, state, j).await {
                Ok(s) => s,
                Err(RepaveError::RolledBack { .. }) => state.clone(),
                Err(e) => return Err(e),
            };
            return Box::pin(apply_goal_state(ops, stores, &st, goal)).await;
        }
        None => begin(state, goal)?,
    };
    run(ops, stores, state, journal).await
}

/// Resumes a journaled repave at daemon start, if there is one; returns the resulting state.
pub async fn resume_pending(
    ops: &dyn NodeOps,
    stores: &Stores,
) -> Result<Option<DaemonState>, RepaveError> {
    let Some(j) = stores.journal.load()? else {
        return Ok(None);
    };
    let state = stores.state.load()?.unwrap_or_default();
    // After the switch the saved state already names the target.
    let base = if state.active_machine == j.target {
        DaemonState {
            applied_settings_version: state.previous_settings_version.clone(),
            applied_kubernetes_version: state.previous_kubernetes_version.clone(),
            active_machine: j.source.clone(),
            ..Default::default()
        }
    } else {
        state
    };
    run(ops, stores, &base, j).await.map(Some)
}

#[cfg(test)]
mod tests;
