//! The agent upgrade's and recovery's state machines: pure functions from the upgrade record
//! (the signal file), what runs now, and the agent unit's state to what to do. No I/O; the
//! table tests are in this file. The agent's `upgrade` module describes the flow they drive.
//!
//! - [`UpgradeRecord`]: the record and its stages;
//! - [`on_start`]: what a starting daemon does with the record;
//! - [`on_prove_deadline`]: whether a candidate gives up at its proof deadline;
//! - [`recovery`]: what recovery does given the record, the selection and the agent unit's
//!   state ([`AgentUnit`], a view of systemd's properties; [`RecoveryAction::Wait`] while the
//!   unit is still stopping);
//! - [`may_upgrade`]: a new upgrade is refused while an unproven agent is selected;
//! - [`resume`]: an interrupted AgentUpgrade operation's outcome, from the record;
//! - [`START_LIMIT_RESET_LOG`]: the line recovery logs when it resets the unit, which the
//!   harness greps for.

use serde::{Deserialize, Serialize};

use crate::operations::OperationResult;

/// What recovery logs right after `systemctl reset-failed` of the agent's unit, which also
/// resets its start limit (the harness reads it from the journal: the starts before it no
/// longer count).
pub const START_LIMIT_RESET_LOG: &str = "agent unit reset: failed state and start limit cleared";

/// The agent unit's state as recovery reads it: systemd's properties of the same names (the
/// agent reads them with its systemd manager).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentUnit<'a> {
    /// `ActiveState`: `active`, `activating`, `failed`, `inactive`, …
    pub active_state: &'a str,
    /// `SubState`: `running`, `auto-restart`, `failed`, `dead`, …
    pub sub_state: &'a str,
    /// `Result`: `success`, `exit-code`, `start-limit-hit`, …
    pub result: &'a str,
    /// `NRestarts`: automatic restarts since the last manual start.
    pub n_restarts: u32,
    /// `ExecMainStatus`: the main process's exit status or signal number.
    pub exec_main_status: i32,
}

/// Reason of an upgrade whose candidate failed to start and was rolled back by recovery.
pub const DAEMON_FAILED: &str = "DaemonFailed";
/// Reason the handoff gives while the restart is pending (`operation run` prints it).
pub const RESTART_SCHEDULED: &str = "RestartScheduled";

/// How the agent is delivered, and so what an upgrade switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A binary on the host: the `current` link of the blue/green slots under `/usr/local`.
    Binary,
    /// The agent's container image: `AKS_FLEX_NODE_IMAGE` in `agent-image.env`.
    Image,
}

/// How far an upgrade got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// The candidate is being fetched, installed and checked; `previous` still runs and stays
    /// selected.
    Staged,
    /// The candidate is selected (`current`/`agent-image.env`) and a restart onto it is
    /// scheduled or under way; it has not proven itself yet.
    Switched,
    /// Over: [`UpgradeRecord::result`] says how.
    Finished,
}

/// The MachineOperation an upgrade runs for (none: `aks-flex-node operation run`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationRef {
    /// Its UID (the operation record's key).
    pub uid: String,
    /// Its name.
    pub name: String,
}

/// The upgrade record: `/etc/aks-flex-node/upgrade/pending.json`, the signal file through
/// which an upgrade hands over from the agent that started it to the agent it restarts on (and
/// to recovery).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeRecord {
    /// Format version (1).
    pub version: u32,
    /// The operation, when it came from the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<OperationRef>,
    /// Binary or image.
    pub mode: Mode,
    /// What runs before: an image reference, or a slot (`blue`/`green`).
    pub previous: String,
    /// What the upgrade switches to: an image reference, or a slot.
    pub candidate: String,
    /// The candidate's `version` line, when checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_version: Option<String>,
    /// How far it got.
    pub stage: Stage,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// How often recovery restarted the agent on the candidate without rolling back (a start
    /// refused by the unit's start limit, before the candidate ever ran).
    #[serde(default)]
    pub recovery_restarts: u32,
    /// Whether recovery removes the candidate after rolling back (an image this upgrade pulled;
    /// never the image the host was installed with).
    #[serde(default)]
    pub remove_candidate_on_rollback: bool,
    /// The result, once [`Stage::Finished`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<OperationResult>,
}

impl UpgradeRecord {
    /// Marks it finished with `result`.
    pub fn finish(&mut self, result: OperationResult) {
        self.stage = Stage::Finished;
        self.result = Some(result);
    }

    /// Whether a candidate is selected but has not proven itself.
    pub fn unproven(&self) -> bool {
        self.stage == Stage::Switched
    }
}

/// What a starting daemon does about the upgrade record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartAction {
    /// Nothing is in flight.
    Nothing,
    /// This agent is the candidate and has started; it has not proven itself yet. It becomes
    /// last-good, and the upgrade `Complete`, after its first successful reconcile
    /// ([`on_reconciled`]); until then recovery rolls it back if it fails.
    AwaitProof,
    /// The upgrade stopped before its switch (a kill or reboot while staging): `previous` runs
    /// and stays; finish with this result.
    Finish(OperationResult),
}

/// Decides what a daemon that starts running `running` (an image reference or a slot; `None`
/// when it cannot tell) does about `record` (`None`: missing or unreadable).
///
/// | record | running | action |
/// |---|---|---|
/// | none, or `finished` | any | nothing |
/// | `staged` | any | finish `Failed`/`Interrupted`: cut short before the switch, `previous` runs |
/// | `switched` | the candidate | await the proof: the first successful reconcile ([`on_reconciled`]) |
/// | `switched` | `previous` | finish `Failed`/`DaemonFailed`: switched back before the candidate proved itself |
/// | `switched` | something else, or unknown | finish `Failed`/`Interrupted`, naming what runs |
pub fn on_start(record: Option<&UpgradeRecord>, running: Option<&str>) -> StartAction {
    let Some(r) = record else {
        return StartAction::Nothing;
    };
    match r.stage {
        Stage::Finished => StartAction::Nothing,
        Stage::Staged => StartAction::Finish(OperationResult::failed(
            crate::operations::INTERRUPTED,
            format!(
                "the agent restarted before the upgrade switched to {}; it still runs {}",
                r.candidate, r.previous
            ),
        )),
        Stage::Switched => match running {
            Some(x) if x == r.candidate => StartAction::AwaitProof,
            Some(x) if x == r.previous => StartAction::Finish(OperationResult::failed(
                DAEMON_FAILED,
                format!(
                    "the agent runs {} again: the candidate {} did not prove itself",
                    r.previous, r.candidate
                ),
            )),
            other => StartAction::Finish(OperationResult::failed(
                crate::operations::INTERRUPTED,
                format!(
                    "after switching to {} the agent runs {}, neither the candidate nor {}",
                    r.candidate,
                    other.unwrap_or("an agent it cannot identify"),
                    r.previous
                ),
            )),
        },
    }
}

/// Decides, at the candidate's own proof deadline, whether the daemon running `running` gives
/// up: `Some(message)` while `record` still waits for this agent's proof (`switched`, this agent
/// the candidate: [`on_start`] would still answer [`StartAction::AwaitProof`]). The daemon then
/// exits with a failure, and its unit's stop guard has recovery roll it back at once. A
/// candidate that hangs, or reaches its cluster but never reconciles successfully, is so never
/// left selected and unproven (the host keeps an agent: recovery restarts the last good one).
///
/// | record at the deadline | running | gives up |
/// |---|---|---|
/// | `switched` | the candidate | yes |
/// | `switched` | `previous`, something else, unknown | no (another path finishes it) |
/// | none, `staged`, `finished` (proven, or rolled back) | any | no |
pub fn on_prove_deadline(
    record: Option<&UpgradeRecord>,
    running: Option<&str>,
    after_s: u64,
) -> Option<String> {
    match (record, on_start(record, running)) {
        (Some(r), StartAction::AwaitProof) => Some(format!(
            "the upgraded agent {} did not prove itself within {after_s} s of its start (no successful reconcile, and its cluster was reachable); exiting so that recovery rolls it back to {}",
            r.candidate, r.previous
        )),
        _ => None,
    }
}

/// What is selected on the host: `current` (what the agent's unit runs: the `current` link's
/// slot, or `AKS_FLEX_NODE_IMAGE` in `agent-image.env`) and `last-good` (what recovery runs
/// and rolls back to: the `last-good` link's slot, or `AKS_FLEX_NODE_LAST_GOOD_IMAGE`).
/// `None`: it cannot be read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Selection<'a> {
    /// What the agent's unit runs.
    pub current: Option<&'a str>,
    /// The last agent that proved itself.
    pub last_good: Option<&'a str>,
}

impl<'a> Selection<'a> {
    /// `(current, last_good)` when both are known and differ: the selected agent has not
    /// proven itself (yet).
    pub fn unproven(&self) -> Option<(&'a str, &'a str)> {
        match (self.current, self.last_good) {
            (Some(c), Some(g)) if c != g => Some((c, g)),
            _ => None,
        }
    }
}

/// The upgrade record as read from its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded<'a> {
    /// There is none.
    Missing,
    /// There is one, but it cannot be read (torn by a crash midway through its save, or
    /// corrupted).
    Unreadable,
    /// It was read.
    Read(&'a UpgradeRecord),
}

impl<'a> Recorded<'a> {
    /// The record, when it was read.
    pub fn record(&self) -> Option<&'a UpgradeRecord> {
        match self {
            Recorded::Read(r) => Some(r),
            Recorded::Missing | Recorded::Unreadable => None,
        }
    }
}

/// Why a new upgrade may not start: the selected agent has not proven itself, so the slot (or
/// the image's place) the candidate would take holds the last good agent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the running agent has not proven itself yet: current={current}, last-good={last_good}; an upgrade now would replace the last good agent, so it waits until the running agent has reconciled once (or recovery rolled it back)"
)]
pub struct Unproven {
    /// What is selected.
    pub current: String,
    /// The last good agent.
    pub last_good: String,
}

/// Whether a new upgrade may start given `selection`: not while the selected agent is
/// unproven (`current` ≠ `last-good`). On a host the candidate goes into the slot opposite
/// `current`, which is then `last-good`'s; in the container the switch records the selected
/// image as last-good, dropping the real one. Either way the last good agent would be lost.
pub fn may_upgrade(selection: Selection<'_>) -> Result<(), Unproven> {
    match selection.unproven() {
        Some((current, last_good)) => Err(Unproven {
            current: current.into(),
            last_good: last_good.into(),
        }),
        None => Ok(()),
    }
}

/// One durable write of a hand-over, made in list order, each atomic by itself (a link or
/// file renamed into place, then its directory synced). A crash can fall between any two, or
/// tear a [`Write::Record`] (the record is then unreadable). The decisions below are built so
/// that every such prefix still ends with a runnable agent (the crash table in the tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Select this agent for the unit (the `current` link; `AKS_FLEX_NODE_IMAGE`).
    Current(String),
    /// Make this agent last-good (the `last-good` link; `AKS_FLEX_NODE_LAST_GOOD_IMAGE`).
    LastGood(String),
    /// Save the upgrade record.
    Record(UpgradeRecord),
}

/// What a daemon does after its first successful reconcile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Proof {
    /// The writes, in order (empty: nothing to do).
    pub writes: Vec<Write>,
    /// The upgrade's result, when this proves its candidate.
    pub result: Option<OperationResult>,
}

/// Decides what a daemon running `running` does after its first successful reconcile (it
/// reached the cluster and did its work: it has proven itself).
///
/// | record | selection | action |
/// |---|---|---|
/// | `switched`, running the candidate (and `current` is not something else) | any | last-good := candidate (unless it already is), then finish the record `Complete` |
/// | anything else (none, unreadable, staged, finished, or `switched` not running the candidate) | running = `current` ≠ `last-good` | last-good := current (no record: it was lost, or the agent was switched by hand) |
/// | anything else | otherwise | nothing |
///
/// Idempotent: once made, the writes make it answer nothing.
pub fn on_reconciled(
    record: Option<&UpgradeRecord>,
    selection: Selection<'_>,
    running: Option<&str>,
) -> Proof {
    let Some(running) = running else {
        return Proof::default();
    };
    if selection.current.is_some_and(|c| c != running) {
        // Something else is selected (an upgrade this daemon just handed off, or a roll-back):
        // this agent is on its way out, it proves nothing.
        return Proof::default();
    }
    let mut writes = Vec::new();
    if selection.last_good != Some(running) {
        writes.push(Write::LastGood(running.into()));
    }
    match record {
        Some(r) if r.unproven() && r.candidate == running => {
            let result = OperationResult::complete(format!(
                "AgentUpgrade completed: the agent runs {}{}",
                r.candidate,
                r.candidate_version
                    .as_deref()
                    .map(|v| format!(" (version {v})"))
                    .unwrap_or_default()
            ));
            let mut done = r.clone();
            done.finish(result.clone());
            writes.push(Write::Record(done));
            Proof {
                writes,
                result: Some(result),
            }
        }
        _ if selection.current.is_some() => Proof {
            writes,
            result: None,
        },
        // `current` cannot be read: do not guess.
        _ => Proof::default(),
    }
}

/// Whether the unit is up or on its way up by itself (running, or starting but not waiting
/// for an automatic restart).
fn recovering_by_itself(u: &AgentUnit<'_>) -> bool {
    (matches!(u.active_state, "active" | "reloading") && u.sub_state != "exited")
        || (u.active_state == "activating" && u.sub_state != "auto-restart")
}

/// Whether the last start was refused by the start limit before anything ran.
fn refused_by_start_limit(u: &AgentUnit<'_>) -> bool {
    u.result == "start-limit-hit" && u.n_restarts == 0
}

/// Whether the unit failed (or is between failing and an automatic restart).
fn failed(u: &AgentUnit<'_>) -> bool {
    u.active_state == "failed"
        || u.sub_state == "auto-restart"
        || (!matches!(u.result, "" | "success") && u.active_state != "active")
}

/// The unit's failure in words, for the operation's message.
pub fn describe(u: &AgentUnit<'_>) -> String {
    let mut s = format!(
        "the agent's unit is {}/{} with result {}",
        u.active_state,
        u.sub_state,
        if u.result.is_empty() {
            "unknown"
        } else {
            u.result
        }
    );
    if u.exec_main_status != 0 {
        s.push_str(&format!(", status {}", u.exec_main_status));
    }
    if u.n_restarts > 0 {
        s.push_str(&format!(", after {} automatic restarts", u.n_restarts));
    }
    s
}

/// Whether the agent's unit is still stopping (`deactivating`: its `ExecStop=`/`ExecStopPost=`
/// run, among them the stop guard that starts recovery at once). Its state says nothing yet:
/// a stop on purpose (an upgrade's restart) and a failure both pass through it, and only the
/// state after it (`activating`, `auto-restart`, `failed`, `inactive`) tells them apart.
pub fn stopping(u: &AgentUnit<'_>) -> bool {
    u.active_state == "deactivating"
}

/// What the recovery unit does. It runs when the agent's unit fails: at once, started by the
/// agent unit's stop guard (`ExecStopPost=` when the service did not succeed), and by systemd
/// (`OnFailure=`), which on older systemd fires only once the unit's start limit is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryAction {
    /// Nothing: the agent runs or is restarting by itself, and no candidate failed.
    Nothing,
    /// The agent's unit is still stopping ([`stopping`]): look again once it has stopped (an
    /// unproven candidate that failed is then rolled back at once, without waiting out the
    /// unit's automatic restarts).
    Wait,
    /// The agent's unit failed with no unproven agent selected (e.g. it crashed past its
    /// start limit): reset its failed state (which resets the start limit) and restart it
    /// after [`super::RECOVERY_RESTART_DELAY`].
    Restart,
    /// The unproven candidate never started: the start limit refused it. Reset the failed
    /// state and restart on the candidate (once; a second time rolls back).
    RetryCandidate,
    /// The unproven candidate failed: make [`rollback_writes`] (switch back to `previous`,
    /// which is last-good; finish `Failed`/`DaemonFailed` with this message), remove the
    /// candidate when the record says so, reset the failed state and restart.
    RollBack {
        /// The operation's message.
        message: String,
    },
    /// The agent's unit failed while an unproven agent is selected (`current` ≠ `last-good`)
    /// and no readable record says which upgrade it came from (a crash tore the record's save,
    /// or it is gone, or it is over): switch `current` back to `last_good`, record that when
    /// there was no readable record (a new finished record, `Failed`/`DaemonFailed` with this
    /// message), reset the failed state and restart.
    RollBackToLastGood {
        /// The unproven agent that failed.
        from: String,
        /// The last good agent.
        to: String,
        /// What is logged and recorded.
        message: String,
        /// Whether to write a record (there was no readable one).
        record: bool,
    },
}

/// Decides what recovery does given the upgrade record, what is selected, and the agent
/// unit's state.
///
/// | record | selection | unit | action |
/// |---|---|---|---|
/// | any | any | `deactivating` (still stopping) | wait, and decide once it has stopped |
/// | `switched` | any | running, or activating (not auto-restart) | nothing (the candidate is starting) |
/// | `switched` | any | `start-limit-hit` with no automatic restart, first time | retry the candidate |
/// | `switched` | any | any other failure (among them auto-restart: at the candidate's first failure, not after its restarts), or the retry already used | roll back to `previous` |
/// | `switched` | any | inactive without failure (stopped on purpose) | nothing |
/// | missing, unreadable, `staged`, `finished` | `current` ≠ `last-good` | failed (or auto-restart) | roll back to last-good (writing a record when there was no readable one) |
/// | missing, unreadable, `staged`, `finished` | `current` = `last-good`, or unknown | failed | restart (resets the start limit) |
/// | missing, unreadable, `staged`, `finished` | any | running, stopped, or auto-restart without an unproven agent | nothing |
pub fn recovery(
    record: Recorded<'_>,
    selection: Selection<'_>,
    unit: &AgentUnit<'_>,
) -> RecoveryAction {
    if stopping(unit) {
        return RecoveryAction::Wait;
    }
    match record.record() {
        Some(r) if r.unproven() => {
            if recovering_by_itself(unit) {
                RecoveryAction::Nothing
            } else if refused_by_start_limit(unit) && r.recovery_restarts == 0 {
                RecoveryAction::RetryCandidate
            } else if failed(unit) {
                RecoveryAction::RollBack {
                    message: format!(
                        "the upgraded agent {} failed to start ({}); rolled back to {}",
                        r.candidate,
                        describe(unit),
                        r.previous
                    ),
                }
            } else {
                RecoveryAction::Nothing
            }
        }
        _ => match selection.unproven() {
            Some((from, to)) if failed(unit) && !recovering_by_itself(unit) => {
                let why = match record {
                    Recorded::Missing => "no upgrade record",
                    Recorded::Unreadable => "the upgrade record is unreadable",
                    Recorded::Read(r) if r.stage == Stage::Staged => {
                        "the upgrade record is still staging"
                    }
                    Recorded::Read(_) => "the upgrade record is finished",
                };
                RecoveryAction::RollBackToLastGood {
                    from: from.into(),
                    to: to.into(),
                    message: format!(
                        "the agent {from} had not proven itself and failed ({}); {why}; rolled back to the last good agent {to}",
                        describe(unit)
                    ),
                    record: record.record().is_none(),
                }
            }
            _ if unit.active_state == "failed" => RecoveryAction::Restart,
            _ => RecoveryAction::Nothing,
        },
    }
}

/// The writes of [`RecoveryAction::RollBack`]: `current` back to `previous` first, then the
/// record finished `Failed`/`DaemonFailed` with `message` (a crash between them leaves the
/// record `switched` with `previous` selected, which the next start finishes the same way).
pub fn rollback_writes(record: &UpgradeRecord, message: &str) -> Vec<Write> {
    let mut done = record.clone();
    done.finish(OperationResult::failed(DAEMON_FAILED, message));
    vec![Write::Current(record.previous.clone()), Write::Record(done)]
}

/// The writes of [`RecoveryAction::RetryCandidate`]: the record with the retry counted.
pub fn retry_writes(record: &UpgradeRecord) -> Vec<Write> {
    let mut r = record.clone();
    r.recovery_restarts = r.recovery_restarts.saturating_add(1);
    vec![Write::Record(r)]
}

/// The writes of [`RecoveryAction::RollBackToLastGood`]: `current` back to `to` first, then
/// (when `record`) a finished record saying so: mode `mode`, `previous` = `to`, `candidate` =
/// `from`, started and finished `at`.
pub fn rollback_to_last_good_writes(action: &RecoveryAction, mode: Mode, at: &str) -> Vec<Write> {
    let RecoveryAction::RollBackToLastGood {
        from,
        to,
        message,
        record,
    } = action
    else {
        return Vec::new();
    };
    let mut writes = vec![Write::Current(to.clone())];
    if *record {
        writes.push(Write::Record(UpgradeRecord {
            version: 1,
            operation: None,
            mode,
            previous: to.clone(),
            candidate: from.clone(),
            candidate_version: None,
            stage: Stage::Finished,
            started_at: at.into(),
            recovery_restarts: 0,
            remove_candidate_on_rollback: false,
            result: Some(OperationResult::failed(DAEMON_FAILED, message.clone())),
        }));
    }
    writes
}

/// The answer to "how did the operation this record belongs to end?", for a daemon that finds
/// the operation's own record at `executing` (its run was cut short by the restart).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resumed {
    /// The upgrade is over: report this.
    Finished(OperationResult),
    /// The handoff is under way (the restart has not happened yet): leave it `InProgress`.
    Pending,
    /// The record knows nothing of it.
    Unknown,
}

/// Maps the upgrade record to the operation `uid`'s outcome.
pub fn resume(record: Option<&UpgradeRecord>, uid: &str) -> Resumed {
    match record {
        Some(r) if r.operation.as_ref().is_some_and(|o| o.uid == uid) => {
            match (&r.stage, &r.result) {
                (Stage::Finished, Some(res)) => Resumed::Finished(res.clone()),
                (Stage::Finished, None) => Resumed::Unknown,
                (Stage::Staged | Stage::Switched, _) => Resumed::Pending,
            }
        }
        _ => Resumed::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machina::OperationPhase;

    fn record(stage: Stage) -> UpgradeRecord {
        UpgradeRecord {
            version: 1,
            operation: Some(OperationRef {
                uid: "u1".into(),
                name: "up".into(),
            }),
            mode: Mode::Image,
            previous: "reg.example/agent@sha256:old".into(),
            candidate: "reg.example/agent@sha256:new".into(),
            candidate_version: None,
            stage,
            started_at: "2026-12-02T10:00:00Z".into(),
            recovery_restarts: 0,
            remove_candidate_on_rollback: true,
            result: None,
        }
    }

    fn unit(
        active: &'static str,
        sub: &'static str,
        result: &'static str,
        restarts: u32,
    ) -> AgentUnit<'static> {
        AgentUnit {
            active_state: active,
            sub_state: sub,
            result,
            n_restarts: restarts,
            exec_main_status: 1,
        }
    }

    #[test]
    fn on_start_table() {
        let old = "reg.example/agent@sha256:old";
        let new = "reg.example/agent@sha256:new";
        let mut finished = record(Stage::Finished);
        finished.result = Some(OperationResult::complete("done"));
        type Case<'a> = (&'a str, Option<UpgradeRecord>, Option<&'a str>, &'a str);
        let cases: Vec<Case> = vec![
            ("no record", None, Some(old), "nothing"),
            ("finished", Some(finished), Some(new), "nothing"),
            (
                "staged, killed before switch",
                Some(record(Stage::Staged)),
                Some(old),
                "Failed/Interrupted",
            ),
            (
                "switched, candidate runs",
                Some(record(Stage::Switched)),
                Some(new),
                "await proof",
            ),
            (
                "switched, previous runs again",
                Some(record(Stage::Switched)),
                Some(old),
                "Failed/DaemonFailed",
            ),
            (
                "switched, a third image",
                Some(record(Stage::Switched)),
                Some("reg.example/agent@sha256:other"),
                "Failed/Interrupted",
            ),
            (
                "switched, unknown",
                Some(record(Stage::Switched)),
                None,
                "Failed/Interrupted",
            ),
        ];
        for (name, rec, running, want) in cases {
            let got = match on_start(rec.as_ref(), running) {
                StartAction::Nothing => "nothing".to_string(),
                StartAction::AwaitProof => "await proof".to_string(),
                StartAction::Finish(r) => {
                    assert_eq!(r.phase, OperationPhase::Failed, "{name}");
                    assert!(!r.message.is_empty(), "{name}");
                    format!("Failed/{}", r.reason)
                }
            };
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn on_prove_deadline_table() {
        let old = "reg.example/agent@sha256:old";
        let new = "reg.example/agent@sha256:new";
        let mut complete = record(Stage::Finished);
        complete.result = Some(OperationResult::complete("done"));
        type Case<'a> = (&'a str, Option<UpgradeRecord>, Option<&'a str>, bool);
        let cases: Vec<Case> = vec![
            ("no record", None, Some(new), false),
            ("proven in time", Some(complete), Some(new), false),
            ("staged", Some(record(Stage::Staged)), Some(new), false),
            (
                "still switched, the candidate runs",
                Some(record(Stage::Switched)),
                Some(new),
                true,
            ),
            (
                "switched, the previous agent runs",
                Some(record(Stage::Switched)),
                Some(old),
                false,
            ),
            (
                "switched, running unknown",
                Some(record(Stage::Switched)),
                None,
                false,
            ),
        ];
        for (name, rec, running, want) in cases {
            let got = on_prove_deadline(rec.as_ref(), running, 300);
            assert_eq!(got.is_some(), want, "{name}: {got:?}");
            if let Some(m) = got {
                assert!(
                    m.contains(new) && m.contains(old) && m.contains("300 s"),
                    "{m}"
                );
            }
        }
    }

    #[test]
    fn recovery_table() {
        let mut retried = record(Stage::Switched);
        retried.recovery_restarts = 1;
        type Case<'a> = (&'a str, Option<UpgradeRecord>, AgentUnit<'a>, &'a str);
        let cases: Vec<Case> = vec![
            (
                "candidate exits at start, systemd will restart it",
                Some(record(Stage::Switched)),
                unit("activating", "auto-restart", "exit-code", 0),
                "roll back",
            ),
            (
                "candidate exited, its stop guard started recovery before the stop finished",
                Some(record(Stage::Switched)),
                unit("deactivating", "stop-post", "exit-code", 0),
                "wait",
            ),
            (
                "previous agent stopping for the handoff's restart (on purpose)",
                Some(record(Stage::Switched)),
                unit("deactivating", "stop-sigterm", "success", 0),
                "wait",
            ),
            (
                "handoff restart: the candidate's start under way",
                Some(record(Stage::Switched)),
                unit("activating", "start-pre", "success", 0),
                "nothing",
            ),
            (
                "no upgrade, a proven agent failed and is stopping",
                None,
                unit("deactivating", "stop-post", "exit-code", 0),
                "wait",
            ),
            (
                "candidate exhausted the start limit after restarts",
                Some(record(Stage::Switched)),
                unit("failed", "failed", "start-limit-hit", 4),
                "roll back",
            ),
            (
                "candidate killed by a signal",
                Some(record(Stage::Switched)),
                unit("failed", "failed", "signal", 0),
                "roll back",
            ),
            (
                "start refused by the limit before the candidate ran",
                Some(record(Stage::Switched)),
                unit("failed", "failed", "start-limit-hit", 0),
                "retry",
            ),
            (
                "refused again after one retry",
                Some(retried),
                unit("failed", "failed", "start-limit-hit", 0),
                "roll back",
            ),
            (
                "candidate running (not proven yet)",
                Some(record(Stage::Switched)),
                unit("active", "running", "success", 0),
                "nothing",
            ),
            (
                "candidate stopped on purpose",
                Some(record(Stage::Switched)),
                unit("inactive", "dead", "success", 0),
                "nothing",
            ),
            (
                "no upgrade, unit failed past its limit",
                None,
                unit("failed", "failed", "start-limit-hit", 4),
                "restart",
            ),
            (
                "no upgrade, unit auto-restarting",
                None,
                unit("activating", "auto-restart", "exit-code", 1),
                "nothing",
            ),
            (
                "staged upgrade, old agent failed",
                Some(record(Stage::Staged)),
                unit("failed", "failed", "exit-code", 0),
                "restart",
            ),
            (
                "finished upgrade, unit running",
                Some(record(Stage::Finished)),
                unit("active", "running", "success", 0),
                "nothing",
            ),
        ];
        for (name, rec, u, want) in cases {
            let recorded = rec.as_ref().map_or(Recorded::Missing, Recorded::Read);
            // The layout agrees with the record: an unproven candidate is selected only while
            // the record is `switched`.
            let sel = if rec.as_ref().is_some_and(|r| r.unproven()) {
                Selection {
                    current: Some("reg.example/agent@sha256:new"),
                    last_good: Some("reg.example/agent@sha256:old"),
                }
            } else {
                Selection {
                    current: Some("reg.example/agent@sha256:old"),
                    last_good: Some("reg.example/agent@sha256:old"),
                }
            };
            let got = match recovery(recorded, sel, &u) {
                RecoveryAction::Nothing => "nothing",
                RecoveryAction::Wait => "wait",
                RecoveryAction::Restart => "restart",
                RecoveryAction::RetryCandidate => "retry",
                RecoveryAction::RollBack { message } => {
                    assert!(message.contains("reg.example/agent@sha256:new"), "{name}");
                    assert!(message.contains(u.result), "{name}: {message}");
                    "roll back"
                }
                RecoveryAction::RollBackToLastGood { .. } => "roll back to last-good",
            };
            assert_eq!(got, want, "{name}");
        }
    }

    const BLUE: &str = "blue";
    const GREEN: &str = "green";

    fn sel<'a>(current: &'a str, last_good: &'a str) -> Selection<'a> {
        Selection {
            current: Some(current),
            last_good: Some(last_good),
        }
    }

    fn binary(stage: Stage) -> UpgradeRecord {
        let mut r = record(stage);
        r.mode = Mode::Binary;
        r.previous = BLUE.into();
        r.candidate = GREEN.into();
        r.remove_candidate_on_rollback = false;
        r
    }

    #[test]
    fn recovery_without_an_unproven_record_table() {
        let mut finished = binary(Stage::Finished);
        finished.result = Some(OperationResult::complete("done"));
        let staged = binary(Stage::Staged);
        let failed = unit("failed", "failed", "exit-code", 2);
        let auto = unit("activating", "auto-restart", "exit-code", 1);
        let running = unit("active", "running", "success", 0);
        let records: Vec<(&str, Recorded)> = vec![
            ("missing", Recorded::Missing),
            ("unreadable", Recorded::Unreadable),
            ("staged", Recorded::Read(&staged)),
            ("finished", Recorded::Read(&finished)),
        ];
        for (rname, rec) in records {
            let writes_record = rname == "missing" || rname == "unreadable";
            type Case<'a> = (&'a str, Selection<'a>, AgentUnit<'a>, &'a str);
            let cases: Vec<Case> = vec![
                (
                    "unproven, failed",
                    sel(GREEN, BLUE),
                    failed,
                    "roll back to last-good",
                ),
                (
                    "unproven, auto-restart",
                    sel(GREEN, BLUE),
                    auto,
                    "roll back to last-good",
                ),
                ("unproven, running", sel(GREEN, BLUE), running, "nothing"),
                ("proven, failed", sel(BLUE, BLUE), failed, "restart"),
                ("proven, auto-restart", sel(BLUE, BLUE), auto, "nothing"),
                ("proven, running", sel(BLUE, BLUE), running, "nothing"),
                (
                    "last-good unknown, failed",
                    Selection {
                        current: Some(GREEN),
                        last_good: None,
                    },
                    failed,
                    "restart",
                ),
                (
                    "nothing known, failed",
                    Selection::default(),
                    failed,
                    "restart",
                ),
            ];
            for (name, s, u, want) in cases {
                let got = match recovery(rec, s, &u) {
                    RecoveryAction::Nothing => "nothing",
                    RecoveryAction::Wait => "wait",
                    RecoveryAction::Restart => "restart",
                    RecoveryAction::RetryCandidate => "retry",
                    RecoveryAction::RollBack { .. } => "roll back",
                    RecoveryAction::RollBackToLastGood {
                        from,
                        to,
                        message,
                        record,
                    } => {
                        assert_eq!(
                            (from.as_str(), to.as_str()),
                            (GREEN, BLUE),
                            "{rname}/{name}"
                        );
                        assert!(
                            message.contains("had not proven itself")
                                && message.contains("rolled back to the last good agent blue"),
                            "{rname}/{name}: {message}"
                        );
                        assert_eq!(record, writes_record, "{rname}/{name}");
                        "roll back to last-good"
                    }
                };
                assert_eq!(got, want, "{rname}/{name}");
            }
        }
    }

    #[test]
    fn rollback_to_last_good_switches_first_and_records_only_without_a_readable_record() {
        let a = recovery(
            Recorded::Unreadable,
            sel(GREEN, BLUE),
            &unit("failed", "failed", "exit-code", 0),
        );
        let w = rollback_to_last_good_writes(&a, Mode::Binary, "2026-12-02T10:00:00Z");
        assert_eq!(w[0], Write::Current(BLUE.into()));
        let Write::Record(r) = &w[1] else {
            panic!("{w:?}")
        };
        assert_eq!(
            (r.stage, r.previous.as_str(), r.candidate.as_str()),
            (Stage::Finished, BLUE, GREEN)
        );
        let res = r.result.as_ref().unwrap();
        assert_eq!(res.reason, DAEMON_FAILED);
        assert!(
            res.message.contains("the upgrade record is unreadable"),
            "{}",
            res.message
        );
        let mut finished = binary(Stage::Finished);
        finished.result = Some(OperationResult::complete("done"));
        let a = recovery(
            Recorded::Read(&finished),
            sel(GREEN, BLUE),
            &unit("failed", "failed", "exit-code", 0),
        );
        assert_eq!(
            rollback_to_last_good_writes(&a, Mode::Binary, "x"),
            vec![Write::Current(BLUE.into())],
            "a readable record (another operation's result) is left alone"
        );
    }

    #[test]
    fn on_reconciled_table() {
        let switched = binary(Stage::Switched);
        let mut finished = binary(Stage::Finished);
        finished.result = Some(OperationResult::complete("done"));
        type Case<'a> = (
            &'a str,
            Option<&'a UpgradeRecord>,
            Selection<'a>,
            Option<&'a str>,
            &'a str,
        );
        let cases: Vec<Case> = vec![
            (
                "candidate reconciled",
                Some(&switched),
                sel(GREEN, BLUE),
                Some(GREEN),
                "last-good=green, record Complete",
            ),
            (
                "candidate reconciled, last-good already made (crash before the record)",
                Some(&switched),
                sel(GREEN, GREEN),
                Some(GREEN),
                "record Complete",
            ),
            (
                "candidate reconciled, current unreadable",
                Some(&switched),
                Selection {
                    current: None,
                    last_good: Some(BLUE),
                },
                Some(GREEN),
                "last-good=green, record Complete",
            ),
            (
                "previous reconciled right after handing off",
                Some(&switched),
                sel(GREEN, BLUE),
                Some(BLUE),
                "nothing",
            ),
            (
                "no record, unproven current reconciled",
                None,
                sel(GREEN, BLUE),
                Some(GREEN),
                "last-good=green",
            ),
            (
                "finished record, unproven current reconciled",
                Some(&finished),
                sel(GREEN, BLUE),
                Some(GREEN),
                "last-good=green",
            ),
            (
                "proven",
                Some(&finished),
                sel(GREEN, GREEN),
                Some(GREEN),
                "nothing",
            ),
            (
                "no record, proven",
                None,
                sel(BLUE, BLUE),
                Some(BLUE),
                "nothing",
            ),
            (
                "running unknown",
                Some(&switched),
                sel(GREEN, BLUE),
                None,
                "nothing",
            ),
            (
                "no record, current unknown",
                None,
                Selection {
                    current: None,
                    last_good: Some(BLUE),
                },
                Some(GREEN),
                "nothing",
            ),
        ];
        for (name, rec, s, running, want) in cases {
            let p = on_reconciled(rec, s, running);
            let got: Vec<String> = p
                .writes
                .iter()
                .map(|w| match w {
                    Write::Current(x) => format!("current={x}"),
                    Write::LastGood(x) => format!("last-good={x}"),
                    Write::Record(r) => {
                        format!("record {}", r.result.as_ref().unwrap().phase)
                    }
                })
                .collect();
            let got = if got.is_empty() {
                "nothing".to_string()
            } else {
                got.join(", ")
            };
            assert_eq!(got, want, "{name}");
            assert_eq!(p.result.is_some(), want.contains("Complete"), "{name}");
        }
    }

    #[test]
    fn a_new_upgrade_is_refused_while_the_selected_agent_is_unproven() {
        let e = may_upgrade(sel(GREEN, BLUE)).unwrap_err();
        assert_eq!((e.current.as_str(), e.last_good.as_str()), (GREEN, BLUE));
        let m = e.to_string();
        assert!(
            m.starts_with(
                "the running agent has not proven itself yet: current=green, last-good=blue"
            ),
            "{m}"
        );
        assert!(may_upgrade(sel(BLUE, BLUE)).is_ok());
        assert!(may_upgrade(Selection::default()).is_ok(), "nothing to lose");
    }

    // --- crash after step k -----------------------------------------------------------------

    /// The record as a crash leaves it.
    #[derive(Clone, Debug)]
    enum Rec {
        Missing,
        Torn,
        Read(Box<UpgradeRecord>),
    }

    /// A model of the host's durable state: what is selected, what is last-good, the record,
    /// and which agent fails to start (before its first reconcile). Writes are applied as the
    /// agent applies them: each one atomic, in order.
    #[derive(Clone, Debug)]
    struct World {
        current: String,
        last_good: String,
        record: Rec,
        broken: Option<&'static str>,
    }

    impl World {
        fn recorded(&self) -> Recorded<'_> {
            match &self.record {
                Rec::Missing => Recorded::Missing,
                Rec::Torn => Recorded::Unreadable,
                Rec::Read(r) => Recorded::Read(r),
            }
        }

        fn selection(&self) -> Selection<'_> {
            sel(&self.current, &self.last_good)
        }

        fn apply(&mut self, w: &Write) {
            match w {
                Write::Current(x) => self.current = x.clone(),
                Write::LastGood(x) => self.last_good = x.clone(),
                Write::Record(r) => self.record = Rec::Read(Box::new(r.clone())),
            }
        }

        /// What recovery writes after the unit failed (`result`, automatic restarts).
        fn recover(&self, result: &'static str, restarts: u32) -> Result<Vec<Write>, String> {
            self.recover_unit(unit("failed", "failed", result, restarts))
        }

        /// What recovery writes when it finds the agent's unit in state `u`.
        fn recover_unit(&self, u: AgentUnit<'_>) -> Result<Vec<Write>, String> {
            let a = recovery(self.recorded(), self.selection(), &u);
            Ok(match &a {
                RecoveryAction::RollBack { message } => {
                    rollback_writes(self.recorded().record().ok_or("no record")?, message)
                }
                RecoveryAction::RetryCandidate => {
                    retry_writes(self.recorded().record().ok_or("no record")?)
                }
                RecoveryAction::RollBackToLastGood { .. } => {
                    rollback_to_last_good_writes(&a, Mode::Binary, "t")
                }
                RecoveryAction::Restart => Vec::new(),
                RecoveryAction::Nothing => return Err("recovery does nothing".into()),
                RecoveryAction::Wait => return Err("recovery waits".into()),
            })
        }

        /// The daemon that starts on `current` and reconciles once: its writes.
        fn start_and_reconcile(&mut self) {
            let running = self.current.clone();
            if let StartAction::Finish(res) = on_start(self.recorded().record(), Some(&running))
                && let Some(mut r) = self.recorded().record().cloned()
            {
                r.finish(res);
                self.apply(&Write::Record(r));
            }
            let p = on_reconciled(self.recorded().record(), self.selection(), Some(&running));
            for w in &p.writes {
                self.apply(w);
            }
        }

        /// After a crash (and a reboot): the unit starts `current`; a broken agent fails and
        /// recovery runs in full; a working one starts and reconciles. Returns the end state,
        /// or why it never settles.
        fn settle(mut self) -> Result<World, String> {
            for _ in 0..6 {
                if self.broken == Some(self.current.as_str()) {
                    for w in self.recover("exit-code", 2)? {
                        self.apply(&w);
                    }
                } else {
                    self.start_and_reconcile();
                    return Ok(self);
                }
            }
            Err(format!(
                "still restarting the broken agent {}",
                self.current
            ))
        }
    }

    /// Applies writes until its budget of completed writes is spent; then the next write
    /// does not happen, or (`torn`) a record write is left torn.
    struct Run {
        w: World,
        left: usize,
        torn: bool,
        crashed: bool,
    }

    impl Run {
        fn write(&mut self, writes: Vec<Write>) -> bool {
            for x in writes {
                if self.left == 0 {
                    if self.torn && matches!(x, Write::Record(_)) {
                        self.w.record = Rec::Torn;
                    }
                    self.crashed = true;
                    return false;
                }
                self.w.apply(&x);
                self.left -= 1;
            }
            true
        }
    }

    #[derive(Clone, Copy, Debug)]
    enum Candidate {
        /// Starts and reconciles.
        Works,
        /// Fails at start.
        Broken,
        /// Fails at start, and its unit's stop guard starts recovery at once: recovery finds
        /// the unit still stopping (and waits), then waiting for its automatic restart (and
        /// rolls back there, without waiting out the restarts).
        BrokenCaughtByStopGuard,
        /// Starts, then fails before its first reconcile (cannot reach the cluster, crashes).
        DiesBeforeReconciling,
        /// The start limit refuses it once; then it works.
        RefusedOnceThenWorks,
        /// The start limit refuses it once; then it fails.
        RefusedOnceThenBroken,
    }

    /// An upgrade from blue to green, as the agent writes it: the upgrade's own writes
    /// (`staged`, `switched`, the switch), then the hand-over for `c`.
    fn script(run: &mut Run, c: Candidate) -> Result<(), String> {
        let mut rec = binary(Stage::Staged);
        if !run.write(vec![Write::Record(rec.clone())]) {
            return Ok(());
        }
        rec.stage = Stage::Switched;
        if !run.write(vec![
            Write::Record(rec.clone()),
            Write::Current(GREEN.into()),
        ]) {
            return Ok(());
        }
        let proof = |w: &mut World| {
            assert_eq!(
                on_start(w.recorded().record(), Some(GREEN)),
                StartAction::AwaitProof
            );
            on_reconciled(w.recorded().record(), w.selection(), Some(GREEN)).writes
        };
        match c {
            Candidate::Works => {
                let ws = proof(&mut run.w);
                run.write(ws);
            }
            Candidate::Broken => {
                let ws = run.w.recover("exit-code", 0)?;
                run.write(ws);
            }
            Candidate::BrokenCaughtByStopGuard => {
                assert_eq!(
                    run.w
                        .recover_unit(unit("deactivating", "stop-post", "exit-code", 0)),
                    Err("recovery waits".to_string())
                );
                let ws = run
                    .w
                    .recover_unit(unit("activating", "auto-restart", "exit-code", 0))?;
                run.write(ws);
            }
            Candidate::DiesBeforeReconciling => {
                assert_eq!(
                    on_start(run.w.recorded().record(), Some(GREEN)),
                    StartAction::AwaitProof,
                    "nothing is written at start"
                );
                let ws = run.w.recover("exit-code", 3)?;
                run.write(ws);
            }
            Candidate::RefusedOnceThenWorks | Candidate::RefusedOnceThenBroken => {
                let ws = run.w.recover("start-limit-hit", 0)?;
                if !run.write(ws) {
                    return Ok(());
                }
                if matches!(c, Candidate::RefusedOnceThenWorks) {
                    let ws = proof(&mut run.w);
                    run.write(ws);
                } else {
                    let ws = run.w.recover("exit-code", 0)?;
                    run.write(ws);
                }
            }
        }
        Ok(())
    }

    /// Every crash point of an upgrade's writes (after each of them, and midway through each
    /// record save) × every kind of candidate × with and without an older record: after the
    /// crash and a reboot, the host settles on a working agent that is last-good, with no
    /// upgrade left hanging. A pure model: the writes and decisions are the agent's; the
    /// host's files, units and restarts are modelled by [`World`].
    #[test]
    fn crash_after_step_k_always_ends_with_a_runnable_proven_agent() {
        let mut old = binary(Stage::Finished);
        old.candidate = BLUE.into();
        old.previous = GREEN.into();
        old.result = Some(OperationResult::complete("an older upgrade"));
        let mut checked = 0;
        for c in [
            Candidate::Works,
            Candidate::Broken,
            Candidate::BrokenCaughtByStopGuard,
            Candidate::DiesBeforeReconciling,
            Candidate::RefusedOnceThenWorks,
            Candidate::RefusedOnceThenBroken,
        ] {
            let broken = match c {
                Candidate::Works | Candidate::RefusedOnceThenWorks => None,
                _ => Some(GREEN),
            };
            for initial in [Rec::Missing, Rec::Read(Box::new(old.clone()))] {
                let start = World {
                    current: BLUE.into(),
                    last_good: BLUE.into(),
                    record: initial,
                    broken,
                };
                // The number of writes of the uninterrupted run.
                let mut full = Run {
                    w: start.clone(),
                    left: usize::MAX,
                    torn: false,
                    crashed: false,
                };
                script(&mut full, c).unwrap();
                let total = usize::MAX - full.left;
                for k in 0..=total {
                    for torn in [false, true] {
                        let mut run = Run {
                            w: start.clone(),
                            left: k,
                            torn,
                            crashed: false,
                        };
                        script(&mut run, c).unwrap();
                        let name = format!("{c:?}, crash after write {k}/{total}, torn={torn}");
                        let end = run.w.clone().settle().unwrap_or_else(|e| {
                            panic!("{name}: {e}; after the crash: {:?}", run.w)
                        });
                        assert_ne!(
                            end.broken,
                            Some(end.current.as_str()),
                            "{name}: runs a broken agent"
                        );
                        assert_eq!(
                            end.current, end.last_good,
                            "{name}: the running agent is last-good"
                        );
                        assert!(
                            !matches!(&end.record, Rec::Read(r) if r.stage != Stage::Finished),
                            "{name}: an upgrade is left hanging: {:?}",
                            end.record
                        );
                        if let Rec::Read(r) = &end.record
                            && r.result.as_ref().is_some_and(|x| {
                                x.phase == crate::machina::OperationPhase::Complete
                            })
                            && r.candidate == GREEN
                        {
                            assert_eq!(
                                end.current, GREEN,
                                "{name}: Complete, but green does not run"
                            );
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 50, "{checked}");
    }

    #[test]
    fn resume_table() {
        let mut done = record(Stage::Finished);
        done.result = Some(OperationResult::failed(DAEMON_FAILED, "x"));
        let mut local = record(Stage::Finished);
        local.operation = None;
        local.result = Some(OperationResult::complete("y"));
        assert_eq!(
            resume(Some(&done), "u1"),
            Resumed::Finished(OperationResult::failed(DAEMON_FAILED, "x"))
        );
        assert_eq!(resume(Some(&done), "other"), Resumed::Unknown);
        assert_eq!(resume(Some(&local), "u1"), Resumed::Unknown);
        assert_eq!(
            resume(Some(&record(Stage::Switched)), "u1"),
            Resumed::Pending
        );
        assert_eq!(resume(Some(&record(Stage::Staged)), "u1"), Resumed::Pending);
        assert_eq!(resume(None, "u1"), Resumed::Unknown);
    }

    #[test]
    fn record_json_shape_is_stable() {
        let mut r = record(Stage::Finished);
        r.result = Some(OperationResult::complete("AgentUpgrade completed"));
        insta::assert_json_snapshot!(r);
    }
}
