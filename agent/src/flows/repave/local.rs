//! A node-local repave request (`aks-flex-node repave`): repaves the node to the other side with
//! the goal it has applied, at a new settings version, without a cluster.
//!
//! The goal is the applied one from the daemon state (its Kubernetes version) under a new
//! settings version, given or `local-<unix seconds>`; the repave is [`super::apply_goal_state`],
//! the daemon's own, so the journal, its phases and their fault points are exactly the
//! daemon's. The request holds the node's work lock ([`crate::flows::worklock`]) from before it
//! reads the daemon state to the end of the repave, as the daemon holds it around each piece of
//! its work: the two never run side by side.
//!
//! Nothing is changed unless every check passed ([`decide`], table-tested): a settings version
//! in the wrong format, a node never bootstrapped (no daemon state), a daemon state without an
//! active machine or a Kubernetes version, the applied settings version asked for again, or a
//! repave already in progress (a journal, readable or not: the daemon finishes or recovers it at
//! its start) each fail naming the problem.
//!
//! In a cluster the daemon's next reconcile sees an applied settings version that is not the
//! machine's and repaves back to the cluster's goal: the cluster's goal wins.

use std::time::Duration;

use crate::flows::start::GoalState;
use crate::flows::worklock::{LockError, WORK_LOCK_PATH, WorkLock};
use crate::state::{ActiveMachineError, DaemonState, STATE_PATH, StateError};
use flex_host::fs::HostFs;

use super::{JOURNAL_PATH, Journal, NodeOps, RepaveError, Stores};

/// The longest settings version a local request takes.
pub const MAX_SETTINGS_VERSION: usize = 64;

/// What the request found in the journal's place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JournalSeen {
    /// No journal: no repave in progress.
    Absent,
    /// A repave in progress.
    Present(Journal),
    /// A journal that cannot be read (why).
    Unreadable(String),
}

/// Why a node-local repave was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalRepaveError {
    /// The settings version asked for is not one a local request takes.
    #[error(
        "settings version {given:?} is not a node-local settings version: {why} (1 to {MAX_SETTINGS_VERSION} characters of A-Z a-z 0-9 . _ : -); nothing changed"
    )]
    BadSettingsVersion {
        /// What was given.
        given: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// No daemon state: the node was never bootstrapped.
    #[error(
        "no daemon state at {STATE_PATH}: this node was never bootstrapped (run `aks-flex-node start` first); nothing changed"
    )]
    NotBootstrapped,
    /// The daemon state could not be read.
    #[error("daemon state {STATE_PATH} cannot be read ({cause}); nothing changed")]
    StateUnreadable {
        /// Why (in the message, not a `source()`).
        cause: StateError,
    },
    /// The daemon state names no valid active machine.
    #[error("{cause} ({STATE_PATH}); nothing changed")]
    NoActiveMachine {
        /// What is wrong with it.
        cause: ActiveMachineError,
    },
    /// The daemon state has no applied Kubernetes version to provision the other side with.
    #[error(
        "daemon state {STATE_PATH} has no applied Kubernetes version to repave with; nothing changed"
    )]
    NoKubernetesVersion,
    /// The settings version asked for is the applied one.
    #[error(
        "settings version {0:?} is the one applied already: a repave needs a new one; nothing changed"
    )]
    SameSettingsVersion(String),
    /// A repave is in progress.
    #[error(
        "a repave is already in progress ({JOURNAL_PATH}: {what}): the agent's daemon finishes it at its start; nothing changed"
    )]
    InProgress {
        /// What the journal says.
        what: String,
    },
    /// Another process of the agent held the work lock for the whole wait.
    #[error(
        "the agent's daemon (or another request) is working on the node and held {WORK_LOCK_PATH} for {wait_s} s; try again later; nothing changed"
    )]
    Busy {
        /// How long the request waited.
        wait_s: u64,
    },
    /// The work lock could not be taken.
    #[error("{0}; nothing changed")]
    Lock(LockError),
    /// The repave itself failed (what it did is in the message).
    #[error(transparent)]
    Repave(RepaveError),
}

/// Checks a settings version a local request was given.
pub fn check_settings_version(v: &str) -> Result<(), LocalRepaveError> {
    let bad = |why| {
        Err(LocalRepaveError::BadSettingsVersion {
            given: v.into(),
            why,
        })
    };
    if v.is_empty() {
        return bad("it is empty");
    }
    if v.len() > MAX_SETTINGS_VERSION {
        return bad("it is too long");
    }
    if !v
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))
    {
        return bad("it has a character outside the allowed set");
    }
    Ok(())
}

/// The settings version of a request that names none.
pub fn default_settings_version(now_unix: u64) -> String {
    format!("local-{now_unix}")
}

/// The goal of a local repave, from what the request found (pure: every refusal is decided
/// here, before anything is changed).
pub fn decide(
    state: Option<&DaemonState>,
    journal: &JournalSeen,
    requested: Option<&str>,
    now_unix: u64,
) -> Result<GoalState, LocalRepaveError> {
    if let Some(v) = requested {
        check_settings_version(v)?;
    }
    let state = state.ok_or(LocalRepaveError::NotBootstrapped)?;
    state
        .active()
        .map_err(|cause| LocalRepaveError::NoActiveMachine { cause })?;
    if state.applied_kubernetes_version.is_empty() {
        return Err(LocalRepaveError::NoKubernetesVersion);
    }
    match journal {
        JournalSeen::Absent => {}
        JournalSeen::Present(j) => {
            return Err(LocalRepaveError::InProgress {
                what: format!(
                    "{} to {}, settings version {}, phase {:?}",
                    j.source, j.target, j.settings_version, j.phase
                )
                .to_lowercase(),
            });
        }
        JournalSeen::Unreadable(why) => {
            return Err(LocalRepaveError::InProgress {
                what: format!("unreadable: {why}"),
            });
        }
    }
    let settings_version = requested.map_or_else(|| default_settings_version(now_unix), Into::into);
    if settings_version == state.applied_settings_version {
        return Err(LocalRepaveError::SameSettingsVersion(settings_version));
    }
    Ok(GoalState {
        kubernetes_version: state.applied_kubernetes_version.clone(),
        settings_version,
        ..Default::default()
    })
}

/// A node-local repave request.
#[derive(Clone, Debug)]
pub struct Request {
    /// The settings version to apply (`None`: [`default_settings_version`]).
    pub settings_version: Option<String>,
    /// How long to wait for the work lock.
    pub wait: Duration,
    /// How often to try the lock while waiting.
    pub poll: Duration,
}

/// What a request did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repaved {
    /// The daemon state before.
    pub before: DaemonState,
    /// The daemon state after.
    pub after: DaemonState,
}

/// One line for people.
pub fn render(r: &Repaved) -> String {
    format!(
        "repaved {} -> {}: settings version {} (was {}), Kubernetes {}\n",
        r.before.active_machine,
        r.after.active_machine,
        r.after.applied_settings_version,
        r.before.applied_settings_version,
        r.after.applied_kubernetes_version
    )
}

/// Runs a request: the work lock, the reads, [`decide`], then the daemon's repave.
pub async fn request(
    ops: &dyn NodeOps,
    stores: &Stores,
    fs: &HostFs,
    req: &Request,
    now_unix: u64,
) -> Result<Repaved, LocalRepaveError> {
    // Bad input fails before waiting for anything.
    if let Some(v) = &req.settings_version {
        check_settings_version(v)?;
    }
    let Some(_lock) = WorkLock::acquire(fs, req.wait, req.poll)
        .await
        .map_err(LocalRepaveError::Lock)?
    else {
        return Err(LocalRepaveError::Busy {
            wait_s: req.wait.as_secs(),
        });
    };
    let state = stores
        .state
        .load()
        .map_err(|cause| LocalRepaveError::StateUnreadable { cause })?;
    let journal = match stores.journal.load() {
        Ok(None) => JournalSeen::Absent,
        Ok(Some(j)) => JournalSeen::Present(j),
        Err(e) => JournalSeen::Unreadable(e.to_string()),
    };
    let goal = decide(
        state.as_ref(),
        &journal,
        req.settings_version.as_deref(),
        now_unix,
    )?;
    let before = state.unwrap_or_default();
    tracing::info!(
        active_machine = %before.active_machine,
        settings_version = %goal.settings_version,
        kubernetes_version = %goal.kubernetes_version,
        "node-local repave requested"
    );
    // No cluster to drain through: a node-local repave is the operator's, as a reboot is.
    let after = super::apply_goal_state(ops, &super::Unguarded, stores, &before, &goal)
        .await
        .map_err(LocalRepaveError::Repave)?;
    Ok(Repaved { before, after })
}

#[cfg(test)]
mod tests;
