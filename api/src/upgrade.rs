//! The agent upgrade's and recovery's state machines: pure functions from the upgrade record
//! (the signal file), what runs now, and the agent unit's state to what to do. No I/O; the
//! table tests are in this file. The agent's `upgrade` module describes the flow they drive.

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
    /// This agent is the candidate and has started: it has proven itself. Make it last-good and
    /// finish `Complete`.
    Prove,
    /// The upgrade stopped before its switch (a kill or reboot while staging): `previous` runs
    /// and stays; finish with this result.
    Finish(OperationResult),
}

/// Decides what a daemon that starts running `running` (an image reference or a slot; `None`
/// when it cannot tell) does about `record`.
///
/// | record | running | action |
/// |---|---|---|
/// | none, or `finished` | any | nothing |
/// | `staged` | any | finish `Failed`/`Interrupted`: cut short before the switch, `previous` runs |
/// | `switched` | the candidate | prove it: last-good := candidate, finish `Complete` |
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
            Some(x) if x == r.candidate => StartAction::Prove,
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

/// What the recovery unit does (it runs when the agent's unit fails: `OnFailure=`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryAction {
    /// Nothing: the agent runs or is restarting by itself, and no candidate failed.
    Nothing,
    /// The agent's unit failed with no unproven candidate (e.g. it crashed past its start
    /// limit): reset its failed state (which resets the start limit) and restart it after
    /// [`super::RECOVERY_RESTART_DELAY`].
    Restart,
    /// The unproven candidate never started: the start limit refused it. Reset the failed
    /// state and restart on the candidate (once; a second time rolls back).
    RetryCandidate,
    /// The unproven candidate failed: switch back to `previous` (last-good), finish
    /// `Failed`/`DaemonFailed` with this message, remove the candidate when the record says so,
    /// reset the failed state and restart.
    RollBack {
        /// The operation's message.
        message: String,
    },
}

/// Decides what recovery does given the upgrade record and the agent unit's state.
///
/// | record | unit | action |
/// |---|---|---|
/// | `switched` | running, or activating (not auto-restart) | nothing (the candidate is starting) |
/// | `switched` | `start-limit-hit` with no automatic restart, first time | retry the candidate |
/// | `switched` | any other failure, or the retry already used | roll back |
/// | `switched` | inactive without failure (stopped on purpose) | nothing |
/// | none, `staged`, `finished` | failed (or auto-restart) | restart (resets the start limit) when `failed`; nothing while auto-restarting |
/// | none, `staged`, `finished` | running or stopped | nothing |
pub fn recovery(record: Option<&UpgradeRecord>, unit: &AgentUnit<'_>) -> RecoveryAction {
    match record {
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
        _ => {
            if unit.active_state == "failed" {
                RecoveryAction::Restart
            } else {
                RecoveryAction::Nothing
            }
        }
    }
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
                "prove",
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
                StartAction::Prove => "prove".to_string(),
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
            let got = match recovery(rec.as_ref(), &u) {
                RecoveryAction::Nothing => "nothing",
                RecoveryAction::Restart => "restart",
                RecoveryAction::RetryCandidate => "retry",
                RecoveryAction::RollBack { message } => {
                    assert!(message.contains("reg.example/agent@sha256:new"), "{name}");
                    assert!(message.contains(u.result), "{name}: {message}");
                    "roll back"
                }
            };
            assert_eq!(got, want, "{name}");
        }
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
