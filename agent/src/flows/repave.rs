//! Blue/green repave (`ApplyGoalState`); NodeReboot is [`crate::flows::reboot`].
//!
//! A repave moves the node from the active machine to the other side in phases, recorded in a
//! journal (`/etc/aks-flex-node/repave-state.json`, one record file) before each phase starts, so a
//! daemon that dies mid-repave resumes where it was:
//!
//! | phase | what runs | the old side |
//! |---|---|---|
//! | `preparing` | provision the target (rootfs, components, config) | still running |
//! | `switching` | cordon and drain the node ([`SwitchGuard`]), then stop the old side (they share the host's network and ports) | stopping |
//! | `starting` | start the target and wait for kubelet | stopped |
//! | `saving` | save the daemon state naming the target — the switch | stopped |
//! | `cleaning` | remove the old side | being removed |
//!
//! A failure before `saving` rolls back: the target is stopped and removed and the old side is
//! started again, so the old side ends running and the daemon state is unchanged. A drain that
//! does not complete is such a failure: nothing was stopped, and the node is uncordoned. After
//! a finished repave the guard lifts the cordon once the Node is Ready on the new side. A failure while
//! `cleaning` leaves the journal for the next start to finish. Which steps run and what a
//! failure means are decided by pure functions ([`plan`], [`on_failure`]) tested table by table;
//! [`apply_goal_state`] executes them through [`NodeOps`].
//!
//! A journal that cannot be read (a damaged file: see [`crate::state`]) never stops the node:
//! [`recover_unreadable_journal`] decides which side to keep. The daemon state is the switch —
//! before it names the target a repave rolls back to the side it names, after it a repave
//! finishes on the side it names — so the side the state names is kept: the other side is
//! stopped and removed, the kept side started (idempotent when it runs) and the journal
//! deleted. Only when the state cannot say either does enablement decide (a start enables a
//! machine first, a stop disables it first): exactly one enabled side is kept (the other is
//! stopped, not removed); with none or both enabled nothing is touched and the repave fails,
//! keeping the journal, for someone to look at.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::flows::start::GoalState;
use crate::machine::nspawn::alternate;
pub use crate::machine::seams::{NodeOps, SeamError};
use crate::state::{DaemonState, JsonStore, StateError, StateStore};
use flex_host::fs::HostFs;

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
    /// Whether the node is cordoned and drained before the old side stops: a repave the
    /// daemon runs for the cluster's goal. A node-local repave (`aks-flex-node repave`), and a
    /// journal written before drains existed, do not drain.
    #[serde(default)]
    pub drain: bool,
}

/// One step of a repave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Record the phase in the journal.
    Record(Phase),
    /// Cordon and drain the node before the old side stops ([`SwitchGuard::before_switch`]).
    Drain,
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
            if j.drain {
                vec![
                    Step::Record(Switching),
                    Step::Drain,
                    Step::Stop(j.source.clone()),
                ]
            } else {
                vec![Step::Record(Switching), Step::Stop(j.source.clone())]
            },
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

/// What to do about a journal that cannot be read (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JournalRecovery {
    /// Stop `other` (and remove it when `remove_other`), start `keep`, delete the journal.
    Keep {
        /// The side the node runs.
        keep: String,
        /// The other side.
        other: String,
        /// Whether the other side is removed (only when the daemon state says it is not the
        /// node's).
        remove_other: bool,
        /// Why (logged).
        reason: &'static str,
    },
    /// Nothing says which side is the node's: touch nothing, keep the journal.
    Undecidable(&'static str),
}

/// Decides what an unreadable journal leads to, from the active machine the daemon state
/// names (`None` when there is no readable state, or it names no valid machine) and whether
/// `kube1` and `kube2` are enabled (`None` when that could not be read).
pub fn recover_unreadable_journal(
    state_active: Option<&str>,
    kube1_enabled: Option<bool>,
    kube2_enabled: Option<bool>,
) -> JournalRecovery {
    use crate::state::{KUBE1, KUBE2};
    let keep = |keep: &str, remove_other: bool, reason| JournalRecovery::Keep {
        keep: keep.into(),
        other: alternate(keep).into(),
        remove_other,
        reason,
    };
    match (state_active, kube1_enabled, kube2_enabled) {
        (Some(m), _, _) if m == KUBE1 || m == KUBE2 => {
            keep(m, true, "the daemon state names the active machine")
        }
        (_, Some(true), Some(true)) => {
            JournalRecovery::Undecidable("no readable daemon state and both machines are enabled")
        }
        (_, Some(true), _) => keep(KUBE1, false, "no readable daemon state; kube1 is enabled"),
        (_, _, Some(true)) => keep(KUBE2, false, "no readable daemon state; kube2 is enabled"),
        _ => JournalRecovery::Undecidable(
            "no readable daemon state and no machine is known to be enabled",
        ),
    }
}

/// The journal for a new repave from `state` to `goal`; `drain` when it drains the node
/// before the switch ([`SwitchGuard::drains`]).
pub fn begin(state: &DaemonState, goal: &GoalState, drain: bool) -> Result<Journal, StateError> {
    let source = state.active()?.to_string();
    Ok(Journal {
        version: 1,
        target: alternate(&source).to_string(),
        source,
        settings_version: goal.settings_version.clone(),
        kubernetes_version: goal.kubernetes_version.clone(),
        phase: Phase::Preparing,
        drain,
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
        /// The phase it failed in.
        phase: Phase,
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
        /// The phase it failed in.
        phase: Phase,
        /// The side that should run.
        source_machine: String,
        /// The failure.
        error: SeamError,
        /// The rollback failure.
        rollback: SeamError,
    },
    /// The journal could not be read and nothing says which side to keep; nothing was touched.
    #[error("repave journal {path} is unreadable ({cause}) and {why}: leaving the node as it is")]
    UnreadableJournal {
        /// The journal file.
        path: String,
        /// Why it could not be read (in the message, not a `source()`).
        cause: StateError,
        /// Why no side could be chosen.
        why: &'static str,
    },
    /// The journal could not be read and starting the side to keep failed; the journal stays
    /// so the next attempt recovers again.
    #[error("repave journal is unreadable; starting {keep} failed: {error:#}")]
    JournalRecoveryFailed {
        /// The side to keep.
        keep: String,
        /// The failure.
        error: SeamError,
    },
    /// A step after the switch failed; the journal stays for the next attempt.
    #[error(
        "apply machine goal state: {step} failed after the switch to {target} (will resume): {error:#}"
    )]
    AfterSwitch {
        /// The failed step.
        step: String,
        /// The phase it failed in.
        phase: Phase,
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
        Step::Drain => "drain".into(),
        Step::Provision(m) => format!("provision {m}"),
        Step::Stop(m) => format!("stop {m}"),
        Step::Start(m) => format!("start {m}"),
        Step::SaveState => "save-daemon-state".into(),
        Step::Cleanup(m) => format!("cleanup {m}"),
        Step::Finish => "finish".into(),
    }
}

/// What a repave asks of the cluster around its switch. The daemon's guard
/// (`crate::flows::drain::DrainGuard`) cordons and drains the node before the old side stops
/// and lifts the cordon once the node is back; [`Unguarded`] asks nothing (no cluster).
#[async_trait]
pub trait SwitchGuard: Send + Sync {
    /// Whether repaves begun under this guard drain the node (recorded in the journal, so a
    /// resumed repave drains as it began).
    fn drains(&self) -> bool;
    /// Before the old side stops (phase `switching`; again when a repave cut short there
    /// resumes). An error rolls the repave back: nothing was stopped.
    async fn before_switch(&self, journal: &Journal) -> Result<(), SeamError>;
    /// After a repave that reached `switching` ended: `finished` on the target, or rolled back
    /// onto the source. Not called when the node is left half-switched (the journal stays).
    /// Failures are the guard's to log.
    async fn after(&self, journal: &Journal, finished: bool);
}

/// A guard that asks nothing of a cluster: the node-local repave (`aks-flex-node repave`),
/// which has none, and tests of the machine steps.
pub struct Unguarded;

#[async_trait]
impl SwitchGuard for Unguarded {
    fn drains(&self) -> bool {
        false
    }
    async fn before_switch(&self, _journal: &Journal) -> Result<(), SeamError> {
        Ok(())
    }
    async fn after(&self, _journal: &Journal, _finished: bool) {}
}

/// The guard of a repave the daemon resumes before it has reached the cluster: a repave that
/// drains and was cut short before its old side stopped is rolled back (its drain needs the
/// cluster; the daemon repaves again once it has reached it); one past the switch finishes,
/// and its cordon is lifted by the daemon's start ([`crate::flows::drain::NodeDrain::release_stale`]).
pub struct NoClusterYet;

#[async_trait]
impl SwitchGuard for NoClusterYet {
    fn drains(&self) -> bool {
        true
    }
    async fn before_switch(&self, _journal: &Journal) -> Result<(), SeamError> {
        Err(SeamError::transient(anyhow::anyhow!(
            "the node must be drained before its old side stops, and the cluster is not reached yet"
        )))
    }
    async fn after(&self, _journal: &Journal, _finished: bool) {}
}

/// Runs the repave in `journal` from its phase; returns the new daemon state.
pub async fn run(
    ops: &dyn NodeOps,
    guard: &dyn SwitchGuard,
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
            Step::Drain => guard.before_switch(&journal).await,
            Step::Provision(m) => ops.provision(m, &journal.kubernetes_version).await,
            Step::Stop(m) => ops.stop(m).await,
            Step::Start(m) => ops.start(m).await,
            Step::SaveState => stores.state.save(&next).map_err(SeamError::transient),
            Step::Cleanup(m) => ops.cleanup(m).await,
            Step::Finish => stores.journal.delete().map_err(SeamError::transient),
        };
        let Err(error) = result else { continue };
        let phase = journal.phase;
        return Err(match on_failure(phase) {
            Recovery::Resume => RepaveError::AfterSwitch {
                step: name,
                phase,
                target: journal.target.clone(),
                error,
            },
            Recovery::Rollback => match rollback(ops, stores, &journal).await {
                Ok(()) => {
                    if phase != Phase::Preparing {
                        guard.after(&journal, false).await;
                    }
                    RepaveError::RolledBack {
                        step: name,
                        phase,
                        source_machine: journal.source.clone(),
                        error,
                    }
                }
                Err(rb) => RepaveError::RollbackFailed {
                    step: name,
                    phase,
                    source_machine: journal.source.clone(),
                    error,
                    rollback: rb,
                },
            },
        });
    }
    guard.after(&journal, true).await;
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

/// The journal, or `None` when there is none or an unreadable one was dealt with
/// ([`recover_unreadable_journal`]). Only a journal whose content cannot be trusted
/// ([`StateError::is_unreadable`]) is recovered from; a file-system error reading the journal or
/// the daemon state (EIO, EACCES) is returned as it is, nothing stopped, removed or deleted: the
/// caller retries.
async fn load_journal(ops: &dyn NodeOps, stores: &Stores) -> Result<Option<Journal>, RepaveError> {
    let cause = match stores.journal.load() {
        Ok(j) => return Ok(j),
        Err(e) if e.is_unreadable() => e,
        Err(e) => return Err(e.into()),
    };
    tracing::error!(error = %cause, path = JOURNAL_PATH, "repave journal is unreadable; recovering");
    let state_active = match stores.state.load() {
        Ok(s) => s.and_then(|s| s.active().ok().map(str::to_string)),
        Err(e) if e.is_unreadable() => {
            tracing::warn!(error = %e, "daemon state is unreadable too");
            None
        }
        Err(e) => return Err(e.into()),
    };
    let mut enabled = [None, None];
    if state_active.is_none() {
        for (slot, m) in enabled
            .iter_mut()
            .zip([crate::state::KUBE1, crate::state::KUBE2])
        {
            *slot = match ops.is_enabled(m).await {
                Ok(e) => Some(e),
                Err(e) => {
                    tracing::warn!(machine = m, error = %format!("{e:#}"), "could not read whether the machine is enabled");
                    None
                }
            };
        }
    }
    match recover_unreadable_journal(state_active.as_deref(), enabled[0], enabled[1]) {
        JournalRecovery::Undecidable(why) => Err(RepaveError::UnreadableJournal {
            path: JOURNAL_PATH.into(),
            cause,
            why,
        }),
        JournalRecovery::Keep {
            keep,
            other,
            remove_other,
            reason,
        } => {
            tracing::warn!(keep = %keep, other = %other, remove_other, reason, "unreadable repave journal: keeping one machine");
            if let Err(e) = ops.stop(&other).await {
                tracing::warn!(machine = %other, error = %format!("{e:#}"), "stopping the other machine failed");
            }
            if remove_other && let Err(e) = ops.cleanup(&other).await {
                tracing::warn!(machine = %other, error = %format!("{e:#}"), "removing the other machine failed");
            }
            ops.start(&keep)
                .await
                .map_err(|error| RepaveError::JournalRecoveryFailed {
                    keep: keep.clone(),
                    error,
                })?;
            stores.journal.delete()?;
            Ok(None)
        }
    }
}

/// `ApplyGoalState`: resumes a journaled repave for the same goal, or starts a new one (an
/// unreadable journal is recovered from first).
pub async fn apply_goal_state(
    ops: &dyn NodeOps,
    guard: &dyn SwitchGuard,
    stores: &Stores,
    state: &DaemonState,
    goal: &GoalState,
) -> Result<DaemonState, RepaveError> {
    let journal = match load_journal(ops, stores).await? {
        Some(j)
            if j.settings_version == goal.settings_version && j.source == state.active_machine =>
        {
            j
        }
        Some(j) => {
            // A repave to another goal was interrupted: finish or undo it first.
            tracing::warn!(pending_settings = %j.settings_version, "resuming an interrupted repave to another goal first");
            let st = match run(ops, guard, stores, state, j).await {
                Ok(s) => s,
                Err(RepaveError::RolledBack { .. }) => state.clone(),
                Err(e) => return Err(e),
            };
            return Box::pin(apply_goal_state(ops, guard, stores, &st, goal)).await;
        }
        None => begin(state, goal, guard.drains())?,
    };
    run(ops, guard, stores, state, journal).await
}

/// Resumes a journaled repave at daemon start, if there is one; returns the resulting state.
/// An unreadable journal is recovered from ([`recover_unreadable_journal`]); that returns
/// `Ok(None)` (no repave was resumed).
pub async fn resume_pending(
    ops: &dyn NodeOps,
    guard: &dyn SwitchGuard,
    stores: &Stores,
) -> Result<Option<DaemonState>, RepaveError> {
    let Some(j) = load_journal(ops, stores).await? else {
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
    run(ops, guard, stores, &base, j).await.map(Some)
}

pub mod local;

#[cfg(test)]
mod tests;
