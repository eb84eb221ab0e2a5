//! The repave planner table by table, and the executor through a recording `NodeOps` fake over
//! real state and journal files in a temporary root: success, rollback before the switch,
//! resume after it, and resuming an interrupted repave.

use super::*;
use crate::machine::fakes::RecordingOps;

fn journal(phase: Phase) -> Journal {
    Journal {
        version: 1,
        source: "kube1".into(),
        target: "kube2".into(),
        settings_version: "etag-2".into(),
        kubernetes_version: "1.35.3".into(),
        phase,
        drain: true,
    }
}

#[test]
fn plan_table() {
    use Phase::*;
    use Step::*;
    let k1 = || "kube1".to_string();
    let k2 = || "kube2".to_string();
    let cases = vec![
        (
            Preparing,
            vec![
                Record(Preparing),
                Provision(k2()),
                Record(Switching),
                Drain,
                Stop(k1()),
                Record(Starting),
                Start(k2()),
                Record(Saving),
                SaveState,
                Record(Cleaning),
                Cleanup(k1()),
                Finish,
            ],
        ),
        (
            Switching,
            vec![
                Record(Switching),
                Drain,
                Stop(k1()),
                Record(Starting),
                Start(k2()),
                Record(Saving),
                SaveState,
                Record(Cleaning),
                Cleanup(k1()),
                Finish,
            ],
        ),
        (
            Starting,
            vec![
                Record(Starting),
                Start(k2()),
                Record(Saving),
                SaveState,
                Record(Cleaning),
                Cleanup(k1()),
                Finish,
            ],
        ),
        (
            Saving,
            vec![
                Record(Saving),
                SaveState,
                Record(Cleaning),
                Cleanup(k1()),
                Finish,
            ],
        ),
        (Cleaning, vec![Record(Cleaning), Cleanup(k1()), Finish]),
    ];
    for (phase, want) in cases {
        assert_eq!(plan(&journal(phase)), want, "{phase:?}");
    }
    // A repave that does not drain (node-local, or journaled before drains existed).
    let local = Journal {
        drain: false,
        ..journal(Switching)
    };
    assert_eq!(&plan(&local)[..2], [Record(Switching), Stop(k1())]);
}

#[test]
fn failure_table() {
    assert_eq!(on_failure(Phase::Preparing), Recovery::Rollback);
    assert_eq!(on_failure(Phase::Switching), Recovery::Rollback);
    assert_eq!(on_failure(Phase::Starting), Recovery::Rollback);
    assert_eq!(on_failure(Phase::Saving), Recovery::Resume);
    assert_eq!(on_failure(Phase::Cleaning), Recovery::Resume);
}

#[test]
fn begin_and_next_state() {
    let st = DaemonState {
        applied_settings_version: "1.35.0".into(),
        applied_kubernetes_version: "1.35.0".into(),
        active_machine: "kube2".into(),
        ..Default::default()
    };
    let goal = GoalState {
        kubernetes_version: "1.35.3".into(),
        settings_version: "etag-9".into(),
        ..Default::default()
    };
    let j = begin(&st, &goal, false).unwrap();
    assert_eq!((j.source.as_str(), j.target.as_str()), ("kube2", "kube1"));
    assert_eq!(j.phase, Phase::Preparing);
    let n = next_state(&st, &j);
    assert_eq!(n.active_machine, "kube1");
    assert_eq!(n.previous_settings_version, "1.35.0");
    assert_eq!(n.applied_settings_version, "etag-9");
    let bad = DaemonState::default();
    assert!(begin(&bad, &goal, false).is_err());
}

fn setup() -> (tempfile::TempDir, Stores, DaemonState, GoalState) {
    let d = tempfile::tempdir().unwrap();
    let stores = Stores::new(HostFs::new(d.path()));
    let st = DaemonState {
        applied_settings_version: "1.35.0".into(),
        applied_kubernetes_version: "1.35.0".into(),
        active_machine: "kube1".into(),
        ..Default::default()
    };
    stores.state.save(&st).unwrap();
    let goal = GoalState {
        kubernetes_version: "1.35.3".into(),
        settings_version: "etag-2".into(),
        ..Default::default()
    };
    (d, stores, st, goal)
}

#[tokio::test]
async fn repave_success() {
    let (_d, stores, st, goal) = setup();
    let ops = RecordingOps::default();
    let next = apply_goal_state(&ops, &Unguarded, &stores, &st, &goal)
        .await
        .unwrap();
    assert_eq!(
        ops.calls(),
        vec![
            "provision kube2 1.35.3",
            "stop kube1",
            "start kube2",
            "cleanup kube1"
        ]
    );
    assert_eq!(stores.state.load().unwrap(), Some(next.clone()));
    assert_eq!(next.active_machine, "kube2");
    assert_eq!(stores.journal.load().unwrap(), None);
}

#[tokio::test]
async fn failure_before_switch_rolls_back_and_keeps_state() {
    for (fail, want_calls) in [
        (
            "provision kube2 1.35.3",
            vec!["provision kube2 1.35.3", "stop kube2", "cleanup kube2"],
        ),
        (
            "stop kube1",
            vec![
                "provision kube2 1.35.3",
                "stop kube1",
                "stop kube2",
                "cleanup kube2",
                "start kube1",
            ],
        ),
        (
            "start kube2",
            vec![
                "provision kube2 1.35.3",
                "stop kube1",
                "start kube2",
                "stop kube2",
                "cleanup kube2",
                "start kube1",
            ],
        ),
    ] {
        let (_d, stores, st, goal) = setup();
        let ops = RecordingOps::failing(fail);
        let e = apply_goal_state(&ops, &Unguarded, &stores, &st, &goal)
            .await
            .unwrap_err();
        assert!(matches!(e, RepaveError::RolledBack { .. }), "{fail}: {e}");
        assert!(e.to_string().contains("rolled back to kube1"), "{e}");
        assert_eq!(ops.calls(), want_calls, "{fail}");
        assert_eq!(
            stores.state.load().unwrap(),
            Some(st.clone()),
            "{fail}: state changed"
        );
        assert_eq!(stores.journal.load().unwrap(), None);
    }
}

/// Which repave failures a retry cannot mend, over the recording machine fake: only a
/// permanent failure (a wrong input) that was rolled back.
#[tokio::test]
async fn only_a_rolled_back_permanent_failure_is_permanent() {
    for (fails, permanent, want) in [
        (&["provision kube2 1.35.3"][..], true, true),
        (&["provision kube2 1.35.3"][..], false, false),
        (&["start kube2"][..], true, true),
        // Rolling back failed too: the node is not where it was, keep trying.
        (&["start kube2", "start kube1"][..], true, false),
        // After the switch the journal resumes it, whatever the failure.
        (&["cleanup kube1"][..], true, false),
    ] {
        let (_d, stores, st, goal) = setup();
        let ops = RecordingOps::failing_each(fails);
        let ops = if permanent { ops.permanently() } else { ops };
        let e = apply_goal_state(&ops, &Unguarded, &stores, &st, &goal)
            .await
            .unwrap_err();
        assert_eq!(
            e.is_permanent(),
            want,
            "{fails:?} permanent={permanent}: {e}"
        );
    }
}

#[tokio::test]
async fn failed_rollback_is_reported() {
    let (_d, stores, st, goal) = setup();
    // The target does not start, and the rollback's restart of kube1 fails too.
    let ops = RecordingOps::failing_each(&["start kube2", "start kube1"]);
    let e = apply_goal_state(&ops, &Unguarded, &stores, &st, &goal)
        .await
        .unwrap_err();
    assert!(matches!(e, RepaveError::RollbackFailed { .. }), "{e}");
    assert_eq!(stores.state.load().unwrap(), Some(st));
}

#[tokio::test]
async fn cleanup_failure_after_switch_resumes_later() {
    let (_d, stores, st, goal) = setup();
    let ops = RecordingOps::failing("cleanup kube1");
    let e = apply_goal_state(&ops, &Unguarded, &stores, &st, &goal)
        .await
        .unwrap_err();
    assert!(matches!(e, RepaveError::AfterSwitch { .. }), "{e}");
    let saved = stores.state.load().unwrap().unwrap();
    assert_eq!(saved.active_machine, "kube2");
    assert_eq!(
        stores.journal.load().unwrap().unwrap().phase,
        Phase::Cleaning
    );
    // The next daemon start finishes the cleanup.
    let ops = RecordingOps::default();
    let resumed = resume_pending(&ops, &Unguarded, &stores)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ops.calls(), vec!["cleanup kube1"]);
    assert_eq!(resumed, saved);
    assert_eq!(stores.journal.load().unwrap(), None);
    assert_eq!(stores.state.load().unwrap(), Some(saved));
}

#[tokio::test]
async fn interrupted_repave_resumes_from_its_phase() {
    let (_d, stores, st, goal) = setup();
    let mut j = begin(&st, &goal, false).unwrap();
    j.phase = Phase::Starting; // the daemon died after stopping kube1
    stores.journal.save(&j).unwrap();
    let ops = RecordingOps::default();
    let next = resume_pending(&ops, &Unguarded, &stores)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ops.calls(), vec!["start kube2", "cleanup kube1"]);
    assert_eq!(next.active_machine, "kube2");
    assert_eq!(next.previous_settings_version, "1.35.0");
    assert_eq!(
        resume_pending(&ops, &Unguarded, &stores).await.unwrap(),
        None
    );
}

#[tokio::test]
async fn apply_resumes_a_journal_for_the_same_goal() {
    let (_d, stores, st, goal) = setup();
    let mut j = begin(&st, &goal, false).unwrap();
    j.phase = Phase::Switching;
    stores.journal.save(&j).unwrap();
    let ops = RecordingOps::default();
    apply_goal_state(&ops, &Unguarded, &stores, &st, &goal)
        .await
        .unwrap();
    assert_eq!(
        ops.calls(),
        vec!["stop kube1", "start kube2", "cleanup kube1"]
    );
}

/// Name, the state's active machine, kube1 and kube2 enabled, the decision.
type JournalRow = (
    &'static str,
    Option<&'static str>,
    Option<bool>,
    Option<bool>,
    JournalRecovery,
);

#[test]
fn unreadable_journal_table() {
    let keep = |keep: &str, remove_other: bool, reason| JournalRecovery::Keep {
        keep: keep.into(),
        other: alternate(keep).into(),
        remove_other,
        reason,
    };
    let by_state = "the daemon state names the active machine";
    let none = JournalRecovery::Undecidable(
        "no readable daemon state and no machine is known to be enabled",
    );
    let both =
        JournalRecovery::Undecidable("no readable daemon state and both machines are enabled");
    #[rustfmt::skip]
    let rows: Vec<JournalRow> = vec![
        // The state decides, whatever is enabled (mid-switch both may be off, or the target on).
        ("state kube1, none enabled (switching/starting)", Some("kube1"), Some(false), Some(false), keep("kube1", true, by_state)),
        ("state kube1, target enabled (starting/saving)", Some("kube1"), Some(false), Some(true), keep("kube1", true, by_state)),
        ("state kube1, kube1 enabled (preparing)", Some("kube1"), Some(true), Some(false), keep("kube1", true, by_state)),
        ("state kube2 (cleaning)", Some("kube2"), Some(true), Some(true), keep("kube2", true, by_state)),
        ("state kube2, enablement unknown", Some("kube2"), None, None, keep("kube2", true, by_state)),
        // No usable state: enablement decides.
        ("no state, kube1 enabled", None, Some(true), Some(false), keep("kube1", false, "no readable daemon state; kube1 is enabled")),
        ("no state, kube2 enabled", None, Some(false), Some(true), keep("kube2", false, "no readable daemon state; kube2 is enabled")),
        ("invalid state, kube2 enabled", Some("kube3"), Some(false), Some(true), keep("kube2", false, "no readable daemon state; kube2 is enabled")),
        ("no state, kube1 enabled, kube2 unknown", None, Some(true), None, keep("kube1", false, "no readable daemon state; kube1 is enabled")),
        ("no state, both enabled", None, Some(true), Some(true), both),
        ("no state, none enabled", None, Some(false), Some(false), none.clone()),
        ("no state, unknown", None, None, None, none.clone()),
        ("empty state name, none enabled", Some(""), Some(false), None, none),
    ];
    for (name, state, k1, k2, want) in rows {
        assert_eq!(recover_unreadable_journal(state, k1, k2), want, "{name}");
    }
}

/// The old agent's torn write, as a kill between its two writes left it: the journal's JSON
/// (phase `starting`, written after kube1 was disabled and stopped) without its `.sha256`.
fn write_torn_legacy_journal(d: &tempfile::TempDir, j: &Journal) {
    let fs = HostFs::new(d.path());
    let mut json = serde_json::to_vec_pretty(j).unwrap();
    json.push(b'\n');
    fs.write_atomic(std::path::Path::new(JOURNAL_PATH), &json, 0o600)
        .unwrap();
}

#[tokio::test]
async fn resume_with_an_unreadable_journal_starts_the_machine_the_state_names() {
    // Real: the state and journal files (temporary root). Faked: the machines (recording ops;
    // kube1 was disabled and stopped by the interrupted repave, kube2 never enabled).
    let (d, stores, st, goal) = setup();
    let mut j = begin(&st, &goal, false).unwrap();
    j.phase = Phase::Starting;
    write_torn_legacy_journal(&d, &j);
    assert!(stores.journal.load().unwrap_err().is_unreadable());
    let ops = RecordingOps::default();
    assert_eq!(
        resume_pending(&ops, &Unguarded, &stores).await.unwrap(),
        None
    );
    assert_eq!(
        ops.calls(),
        vec!["stop kube2", "cleanup kube2", "start kube1"]
    );
    assert_eq!(ops.enabled_machines(), vec!["kube1"]);
    // The bad journal is gone, the state unchanged: the next goal apply starts afresh.
    assert!(!HostFs::new(d.path()).exists(stores.journal.path()));
    assert_eq!(stores.journal.load().unwrap(), None);
    assert_eq!(stores.state.load().unwrap(), Some(st.clone()));
    let ops = RecordingOps::default().with_enabled(&["kube1"]);
    let next = apply_goal_state(&ops, &Unguarded, &stores, &st, &goal)
        .await
        .unwrap();
    assert_eq!(next.active_machine, "kube2");
}

#[tokio::test]
async fn apply_with_a_corrupt_journal_recovers_then_repaves() {
    // Real: state and journal files, the journal with a flipped byte. Faked: the machines.
    let (d, stores, st, goal) = setup();
    let mut j = begin(&st, &goal, false).unwrap();
    j.phase = Phase::Saving;
    stores.journal.save(&j).unwrap();
    let real = HostFs::new(d.path()).path(std::path::Path::new(JOURNAL_PATH));
    let bytes = std::fs::read_to_string(&real)
        .unwrap()
        .replace("saving", "savinh");
    std::fs::write(&real, bytes).unwrap();
    let ops = RecordingOps::default().with_enabled(&["kube2"]);
    let next = apply_goal_state(&ops, &Unguarded, &stores, &st, &goal)
        .await
        .unwrap();
    assert_eq!(
        ops.calls(),
        vec![
            "stop kube2",
            "cleanup kube2",
            "start kube1",
            "provision kube2 1.35.3",
            "stop kube1",
            "start kube2",
            "cleanup kube1",
        ]
    );
    assert_eq!(next.active_machine, "kube2");
    assert_eq!(stores.journal.load().unwrap(), None);
}

#[tokio::test]
async fn unreadable_journal_and_state_start_the_enabled_machine() {
    // Real: both files damaged. Faked: the machines, kube2 enabled.
    let (d, stores, st, goal) = setup();
    let j = begin(&st, &goal, false).unwrap();
    write_torn_legacy_journal(&d, &j);
    let fs = HostFs::new(d.path());
    fs.write_atomic(
        std::path::Path::new(crate::state::STATE_PATH),
        b"{\"form",
        0o600,
    )
    .unwrap();
    let ops = RecordingOps::default().with_enabled(&["kube2"]);
    assert_eq!(
        resume_pending(&ops, &Unguarded, &stores).await.unwrap(),
        None
    );
    assert_eq!(
        ops.calls(),
        vec![
            "is-enabled kube1",
            "is-enabled kube2",
            "stop kube1",
            "start kube2"
        ]
    );
    assert_eq!(stores.journal.load().unwrap(), None);
}

#[tokio::test]
async fn unreadable_journal_with_nothing_to_decide_on_touches_nothing() {
    // Real: both files damaged. Faked: the machines, none enabled.
    let (d, stores, st, goal) = setup();
    write_torn_legacy_journal(&d, &begin(&st, &goal, false).unwrap());
    HostFs::new(d.path())
        .remove_file(std::path::Path::new(crate::state::STATE_PATH))
        .unwrap();
    let ops = RecordingOps::default();
    let e = resume_pending(&ops, &Unguarded, &stores).await.unwrap_err();
    assert!(matches!(e, RepaveError::UnreadableJournal { .. }), "{e}");
    assert!(
        e.to_string().starts_with(
            "repave journal /etc/aks-flex-node/repave-state.json is unreadable (read record checksum"
        ),
        "{e}"
    );
    assert!(!e.is_permanent());
    assert_eq!(ops.calls(), vec!["is-enabled kube1", "is-enabled kube2"]);
    assert!(stores.journal.load().is_err(), "the journal stays");
}

#[tokio::test]
async fn a_failed_recovery_start_keeps_the_journal_for_the_next_attempt() {
    let (d, stores, st, goal) = setup();
    write_torn_legacy_journal(&d, &begin(&st, &goal, false).unwrap());
    let ops = RecordingOps::failing("start kube1");
    let e = resume_pending(&ops, &Unguarded, &stores).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "repave journal is unreadable; starting kube1 failed: injected failure of start kube1"
    );
    assert!(stores.journal.load().is_err(), "the journal stays");
    let ops = RecordingOps::default();
    assert_eq!(
        resume_pending(&ops, &Unguarded, &stores).await.unwrap(),
        None
    );
    assert_eq!(stores.journal.load().unwrap(), None);
}

/// How a recovery test leaves one record file.
#[derive(Clone, Copy, Debug)]
enum Damage {
    /// As `setup` saved it.
    Intact,
    /// The old agent's torn write: JSON without its sidecar (an unreadable record).
    Torn,
    /// A directory where the file should be: reading it fails in the file system (EISDIR), as
    /// EIO or EACCES would; the content is not known to be bad.
    ReadFails,
}

/// A file-system error reading the journal (or, with an unreadable journal, the daemon state)
/// is passed up with nothing stopped, removed or deleted; only an unreadable journal is
/// recovered from. Real: the journal and state files in a temporary root (a directory in a
/// file's place makes the real read fail). Faked: the machines (recording ops).
#[tokio::test]
async fn only_an_unreadable_journal_is_recovered_from_not_a_read_error() {
    let rows: [(&str, Damage, Damage, Option<Vec<&str>>); 4] = [
        (
            "torn journal, state readable: recovered",
            Damage::Torn,
            Damage::Intact,
            Some(vec!["stop kube2", "cleanup kube2", "start kube1"]),
        ),
        (
            "torn journal, state torn: recovered by enablement",
            Damage::Torn,
            Damage::Torn,
            Some(vec![
                "is-enabled kube1",
                "is-enabled kube2",
                "stop kube2",
                "start kube1",
            ]),
        ),
        (
            "journal read fails: passed up",
            Damage::ReadFails,
            Damage::Intact,
            None,
        ),
        (
            "torn journal, state read fails: passed up",
            Damage::Torn,
            Damage::ReadFails,
            None,
        ),
    ];
    for (name, journal, state, want) in rows {
        let (d, stores, st, goal) = setup();
        let fs = HostFs::new(d.path());
        let mut j = begin(&st, &goal, false).unwrap();
        j.phase = Phase::Starting;
        for (damage, path) in [
            (journal, std::path::Path::new(JOURNAL_PATH)),
            (state, std::path::Path::new(crate::state::STATE_PATH)),
        ] {
            match damage {
                Damage::Intact => {}
                Damage::Torn => {
                    let mut json = serde_json::to_vec_pretty(&j).unwrap();
                    json.push(b'\n');
                    fs.write_atomic(path, &json, 0o600).unwrap();
                }
                Damage::ReadFails => {
                    fs.remove_file(path).unwrap();
                    fs.create_dir_all(path).unwrap();
                }
            }
        }
        let ops = RecordingOps::default().with_enabled(&["kube1"]);
        let got = resume_pending(&ops, &Unguarded, &stores).await;
        match want {
            Some(calls) => {
                assert_eq!(got.unwrap(), None, "{name}");
                assert_eq!(ops.calls(), calls, "{name}");
                assert!(!fs.exists(stores.journal.path()), "{name}: journal deleted");
            }
            None => {
                let e = got.unwrap_err();
                assert!(
                    matches!(&e, RepaveError::State(StateError::Fs(_))),
                    "{name}: {e}"
                );
                assert!(!e.is_permanent(), "{name}");
                assert!(ops.calls().is_empty(), "{name}: {:?}", ops.calls());
                assert!(fs.exists(stores.journal.path()), "{name}: journal kept");
            }
        }
    }
}

/// A recording [`SwitchGuard`] (test code): what the machine steps had done when the drain
/// was asked for, and how each repave ended for it; `fail` makes the drain fail.
#[derive(Default)]
struct RecordingGuard {
    ops: Option<RecordingOps>,
    fail: bool,
    log: std::sync::Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl SwitchGuard for RecordingGuard {
    fn drains(&self) -> bool {
        true
    }
    async fn before_switch(&self, j: &Journal) -> Result<(), SeamError> {
        let done = self.ops.as_ref().map(|o| o.calls()).unwrap_or_default();
        self.log
            .lock()
            .unwrap()
            .push(format!("drain {} after {done:?}", j.settings_version));
        if self.fail {
            return Err(SeamError::transient(anyhow::anyhow!(
                "drain timed out after 5m0s with 1 pod(s) left (default/web)"
            )));
        }
        Ok(())
    }
    async fn after(&self, j: &Journal, finished: bool) {
        self.log
            .lock()
            .unwrap()
            .push(format!("after {} finished={finished}", j.settings_version));
    }
}

#[tokio::test]
async fn the_node_is_drained_after_the_target_is_provisioned_and_before_the_old_side_stops() {
    let (_d, stores, st, goal) = setup();
    let ops = RecordingOps::default();
    let guard = RecordingGuard {
        ops: Some(ops.clone()),
        ..Default::default()
    };
    apply_goal_state(&ops, &guard, &stores, &st, &goal)
        .await
        .unwrap();
    assert_eq!(
        *guard.log.lock().unwrap(),
        [
            "drain etag-2 after [\"provision kube2 1.35.3\"]",
            "after etag-2 finished=true"
        ]
    );
}

#[tokio::test]
async fn a_drain_that_does_not_complete_rolls_back_without_stopping_anything() {
    let (_d, stores, st, goal) = setup();
    let ops = RecordingOps::default();
    let guard = RecordingGuard {
        ops: Some(ops.clone()),
        fail: true,
        ..Default::default()
    };
    let e = apply_goal_state(&ops, &guard, &stores, &st, &goal)
        .await
        .unwrap_err();
    assert!(
        e.to_string().starts_with(
            "apply machine goal state: drain failed, rolled back to kube1: drain timed out"
        ),
        "{e}"
    );
    // The old side never stopped (its start in the rollback finds it running).
    assert_eq!(
        ops.calls(),
        [
            "provision kube2 1.35.3",
            "stop kube2",
            "cleanup kube2",
            "start kube1"
        ]
    );
    assert_eq!(
        guard.log.lock().unwrap().last().unwrap(),
        "after etag-2 finished=false"
    );
    assert_eq!(stores.state.load().unwrap(), Some(st));
}

#[tokio::test]
async fn a_repave_that_fails_before_the_switch_phase_asks_nothing_of_the_guard() {
    let (_d, stores, st, goal) = setup();
    let ops = RecordingOps::failing("provision kube2 1.35.3");
    let guard = RecordingGuard::default();
    apply_goal_state(&ops, &guard, &stores, &st, &goal)
        .await
        .unwrap_err();
    assert!(guard.log.lock().unwrap().is_empty());
}
