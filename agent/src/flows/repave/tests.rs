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
    let j = begin(&st, &goal).unwrap();
    assert_eq!((j.source.as_str(), j.target.as_str()), ("kube2", "kube1"));
    assert_eq!(j.phase, Phase::Preparing);
    let n = next_state(&st, &j);
    assert_eq!(n.active_machine, "kube1");
    assert_eq!(n.previous_settings_version, "1.35.0");
    assert_eq!(n.applied_settings_version, "etag-9");
    let bad = DaemonState::default();
    assert!(begin(&bad, &goal).is_err());
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
    let next = apply_goal_state(&ops, &stores, &st, &goal).await.unwrap();
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
        let e = apply_goal_state(&ops, &stores, &st, &goal)
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
        let e = apply_goal_state(&ops, &stores, &st, &goal)
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
    let e = apply_goal_state(&ops, &stores, &st, &goal)
        .await
        .unwrap_err();
    assert!(matches!(e, RepaveError::RollbackFailed { .. }), "{e}");
    assert_eq!(stores.state.load().unwrap(), Some(st));
}

#[tokio::test]
async fn cleanup_failure_after_switch_resumes_later() {
    let (_d, stores, st, goal) = setup();
    let ops = RecordingOps::failing("cleanup kube1");
    let e = apply_goal_state(&ops, &stores, &st, &goal)
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
    let resumed = resume_pending(&ops, &stores).await.unwrap().unwrap();
    assert_eq!(ops.calls(), vec!["cleanup kube1"]);
    assert_eq!(resumed, saved);
    assert_eq!(stores.journal.load().unwrap(), None);
    assert_eq!(stores.state.load().unwrap(), Some(saved));
}

#[tokio::test]
async fn interrupted_repave_resumes_from_its_phase() {
    let (_d, stores, st, goal) = setup();
    let mut j = begin(&st, &goal).unwrap();
    j.phase = Phase::Starting; // the daemon died after stopping kube1
    stores.journal.save(&j).unwrap();
    let ops = RecordingOps::default();
    let next = resume_pending(&ops, &stores).await.unwrap().unwrap();
    assert_eq!(ops.calls(), vec!["start kube2", "cleanup kube1"]);
    assert_eq!(next.active_machine, "kube2");
    assert_eq!(next.previous_settings_version, "1.35.0");
    assert_eq!(resume_pending(&ops, &stores).await.unwrap(), None);
}

#[tokio::test]
async fn apply_resumes_a_journal_for_the_same_goal() {
    let (_d, stores, st, goal) = setup();
    let mut j = begin(&st, &goal).unwrap();
    j.phase = Phase::Switching;
    stores.journal.save(&j).unwrap();
    let ops = RecordingOps::default();
    apply_goal_state(&ops, &stores, &st, &goal).await.unwrap();
    assert_eq!(
        ops.calls(),
        vec!["stop kube1", "start kube2", "cleanup kube1"]
    );
}
