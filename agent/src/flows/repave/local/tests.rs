//! The local repave request: its decision table by table (pure), then the request through the
//! recording `NodeOps` fake (the machines are faked) over real daemon-state, journal and work-lock
//! files in a temporary root: a success, and each refusal leaving every file and machine as it
//! was.

use super::*;
use crate::flows::repave::Phase;
use crate::machine::fakes::RecordingOps;

fn state() -> DaemonState {
    DaemonState {
        applied_settings_version: "etag-1".into(),
        applied_kubernetes_version: "1.35.3".into(),
        active_machine: "kube1".into(),
        ..Default::default()
    }
}

fn journal() -> Journal {
    Journal {
        version: 1,
        source: "kube1".into(),
        target: "kube2".into(),
        settings_version: "etag-2".into(),
        kubernetes_version: "1.35.3".into(),
        phase: Phase::Switching,
        drain: false,
    }
}

#[test]
fn settings_version_format_table() {
    let long = "a".repeat(MAX_SETTINGS_VERSION + 1);
    let max = "a".repeat(MAX_SETTINGS_VERSION);
    for (v, ok) in [
        ("local-1", true),
        ("v2.0_rc:1", true),
        (max.as_str(), true),
        ("", false),
        (long.as_str(), false),
        ("has space", false),
        ("quote\"d", false),
        ("slash/", false),
        ("ünicode", false),
        ("line\nbreak", false),
    ] {
        let r = check_settings_version(v);
        assert_eq!(r.is_ok(), ok, "{v:?}: {r:?}");
        if let Err(e) = r {
            let m = e.to_string();
            assert!(
                m.contains("not a node-local settings version") && m.contains("nothing changed"),
                "{m}"
            );
        }
    }
}

#[test]
fn decision_table() {
    let no_machine = DaemonState {
        active_machine: String::new(),
        ..state()
    };
    let bad_machine = DaemonState {
        active_machine: "kube3".into(),
        ..state()
    };
    let no_k8s = DaemonState {
        applied_kubernetes_version: String::new(),
        ..state()
    };
    let st = state();
    let absent = JournalSeen::Absent;
    let present = JournalSeen::Present(journal());
    let unreadable = JournalSeen::Unreadable("checksum mismatch".into());
    // (state, journal, requested, Ok(settings version) or Err(words in the message))
    type Case<'a> = (
        Option<&'a DaemonState>,
        &'a JournalSeen,
        Option<&'a str>,
        Result<&'a str, &'a str>,
    );
    let cases: Vec<Case> = vec![
        (Some(&st), &absent, None, Ok("local-1700000000")),
        (Some(&st), &absent, Some("etag-2"), Ok("etag-2")),
        (
            Some(&st),
            &absent,
            Some("bad version"),
            Err("not a node-local settings version"),
        ),
        // The format is checked first, even on a node never bootstrapped.
        (None, &absent, Some(""), Err("it is empty")),
        (None, &absent, None, Err("never bootstrapped")),
        (
            Some(&no_machine),
            &absent,
            None,
            Err("missing active machine"),
        ),
        (
            Some(&bad_machine),
            &absent,
            None,
            Err("\"kube3\" is invalid"),
        ),
        (
            Some(&no_k8s),
            &absent,
            None,
            Err("no applied Kubernetes version"),
        ),
        (Some(&st), &present, None, Err("already in progress")),
        (
            Some(&st),
            &present,
            Some("etag-9"),
            Err("kube1 to kube2, settings version etag-2, phase switching"),
        ),
        (
            Some(&st),
            &unreadable,
            None,
            Err("unreadable: checksum mismatch"),
        ),
        (Some(&st), &absent, Some("etag-1"), Err("applied already")),
    ];
    for (i, (state, journal, requested, want)) in cases.into_iter().enumerate() {
        let got = decide(state, journal, requested, 1_700_000_000);
        match (got, want) {
            (Ok(goal), Ok(v)) => {
                assert_eq!(goal.settings_version, v, "case {i}");
                assert_eq!(goal.kubernetes_version, "1.35.3", "case {i}");
            }
            (Err(e), Err(words)) => {
                let m = e.to_string();
                assert!(m.contains(words), "case {i}: {m}");
                assert!(m.contains("nothing changed"), "case {i}: {m}");
            }
            (got, want) => panic!("case {i}: got {got:?}, want {want:?}"),
        }
    }
}

fn setup() -> (tempfile::TempDir, HostFs, Stores) {
    let d = tempfile::tempdir().unwrap();
    let fs = HostFs::new(d.path());
    let stores = Stores::new(fs.clone());
    (d, fs, stores)
}

fn req(v: Option<&str>) -> Request {
    Request {
        settings_version: v.map(Into::into),
        wait: Duration::from_millis(50),
        poll: Duration::from_millis(10),
    }
}

/// Every file under the root, with its bytes (the work lock's empty file left out).
fn files(d: &tempfile::TempDir) -> Vec<(String, Vec<u8>)> {
    fn walk(p: &std::path::Path, root: &std::path::Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(p).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, root, out);
            } else if !p.ends_with("work.lock") {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(d.path(), d.path(), &mut out);
    out.sort();
    out
}

#[tokio::test]
async fn a_request_repaves_to_the_other_side_through_the_daemons_repave() {
    let (_d, fs, stores) = setup();
    stores.state.save(&state()).unwrap();
    let ops = RecordingOps::default();
    let r = request(&ops, &stores, &fs, &req(Some("etag-2")), 1)
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
    let after = stores.state.load().unwrap().unwrap();
    assert_eq!(after, r.after);
    assert_eq!(after.active_machine, "kube2");
    assert_eq!(after.applied_settings_version, "etag-2");
    assert_eq!(after.previous_settings_version, "etag-1");
    assert_eq!(stores.journal.load().unwrap(), None, "journal finished");
    assert_eq!(
        render(&r),
        "repaved kube1 -> kube2: settings version etag-2 (was etag-1), Kubernetes 1.35.3\n"
    );
    // And back, with the default settings version.
    let ops = RecordingOps::default();
    let r = request(&ops, &stores, &fs, &req(None), 7).await.unwrap();
    assert_eq!(r.after.active_machine, "kube1");
    assert_eq!(r.after.applied_settings_version, "local-7");
    assert_eq!(ops.calls()[0], "provision kube1 1.35.3");
}

#[tokio::test]
async fn refused_requests_change_nothing() {
    type Prepare = fn(&Stores, &HostFs) -> Option<WorkLock>;
    let cases: Vec<(&str, Prepare, Option<&str>, &str)> = vec![
        (
            "never bootstrapped",
            |_, _| None,
            None,
            "never bootstrapped",
        ),
        (
            "bad version",
            |s, _| {
                s.state.save(&state()).unwrap();
                None
            },
            Some("a b"),
            "not a node-local settings version",
        ),
        (
            "in progress",
            |s, _| {
                s.state.save(&state()).unwrap();
                s.journal.save(&journal()).unwrap();
                None
            },
            None,
            "already in progress",
        ),
        (
            "busy",
            |s, fs| {
                s.state.save(&state()).unwrap();
                WorkLock::try_acquire(fs).unwrap()
            },
            None,
            "held /run/aks-flex-node/work.lock",
        ),
        (
            "same version",
            |s, _| {
                s.state.save(&state()).unwrap();
                None
            },
            Some("etag-1"),
            "applied already",
        ),
    ];
    for (name, prepare, v, words) in cases {
        let (d, fs, stores) = setup();
        let _held = prepare(&stores, &fs);
        let before = files(&d);
        let ops = RecordingOps::default();
        let e = request(&ops, &stores, &fs, &req(v), 1).await.unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains(words) && m.contains("nothing changed"),
            "{name}: {m}"
        );
        assert!(ops.calls().is_empty(), "{name}: {:?}", ops.calls());
        assert_eq!(files(&d), before, "{name}: files changed");
    }
}

#[tokio::test]
async fn an_unreadable_daemon_state_is_refused() {
    let (d, fs, stores) = setup();
    let p = d.path().join("etc/aks-flex-node");
    std::fs::create_dir_all(&p).unwrap();
    std::fs::write(p.join("daemon-state.json"), b"{ torn").unwrap();
    let ops = RecordingOps::default();
    let e = request(&ops, &stores, &fs, &req(None), 1)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cannot be read"), "{e}");
    assert!(ops.calls().is_empty());
}

#[tokio::test]
async fn a_failed_repave_rolls_back_and_says_so() {
    let (_d, fs, stores) = setup();
    stores.state.save(&state()).unwrap();
    let ops = RecordingOps::failing("start kube2");
    let e = request(&ops, &stores, &fs, &req(None), 1)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("rolled back to kube1"), "{e}");
    assert_eq!(stores.state.load().unwrap(), Some(state()));
    assert_eq!(stores.journal.load().unwrap(), None);
}
