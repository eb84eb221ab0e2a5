//! Node-local runs (`aks-flex-node operation run`), result rendering, `--param` parsing, the
//! record store, and the real handlers over a fake host.

use std::path::Path;
use std::sync::Arc;

use super::super::fakes::RecordingHandlers;
use super::super::handlers::*;
use super::super::record::{Record, RecordStore, Stage};
use super::super::{OperationResult, execute};
use super::labels;
use crate::flows::operations::decide::Action;
use crate::machine::fakes::RecordingOps;
use crate::machine::nspawn::Timings;
use crate::state::{DaemonState, StateStore};
use flex_api::machina::{OperationKind, OperationPhase};
use flex_host::fs::HostFs;
use flex_testkit::FakeHost;

/// The finished result (panics on a handoff).
fn done(e: Executed) -> OperationResult {
    match e {
        Executed::Finished(r) => r,
        Executed::HandedOff(m) => panic!("handed off: {m}"),
    }
}

#[tokio::test]
async fn local_node_reboot_runs_the_handler() {
    let h = RecordingHandlers::new();
    let r = done(run_local(&OperationKind::parse("NodeReboot"), &labels(&[]), &h, false).await);
    assert_eq!(r, OperationResult::complete("NodeReboot completed"));
    assert_eq!(h.calls(), ["node_reboot"]);
    assert_eq!(
        render_result(&r),
        "phase: Complete\nreason: Succeeded\nmessage: NodeReboot completed\n"
    );
}

#[tokio::test]
async fn local_failure_is_execution_failed() {
    let h = RecordingHandlers::new();
    h.fail_on("node_reboot", "stop kube1: machinectl poweroff failed");
    let r = done(run_local(&OperationKind::parse("NodeReboot"), &labels(&[]), &h, false).await);
    assert_eq!(
        render_result(&r),
        "phase: Failed\nreason: ExecutionFailed\nmessage: \"stop kube1: machinectl poweroff failed\"\n"
    );
}

#[tokio::test]
async fn local_agent_reset_stops_the_daemon_after() {
    let h = RecordingHandlers::new();
    let r = done(run_local(&OperationKind::parse("AgentReset"), &labels(&[]), &h, false).await);
    assert!(r.succeeded());
    assert_eq!(h.calls(), ["agent_reset", "stop_daemon"]);
    // A failed reset does not stop the daemon.
    let h = RecordingHandlers::new();
    h.fail_on("agent_reset", "boom");
    let r = done(run_local(&OperationKind::parse("AgentReset"), &labels(&[]), &h, false).await);
    assert_eq!(r.phase, OperationPhase::Failed);
    assert_eq!(h.calls(), ["agent_reset"]);
    // Nor does a failure to stop it change the result.
    let h = RecordingHandlers::new();
    h.fail_on("stop_daemon", "systemctl failed");
    assert!(
        done(run_local(&OperationKind::parse("AgentReset"), &labels(&[]), &h, false).await)
            .succeeded()
    );
}

#[tokio::test]
async fn local_bad_input_runs_nothing() {
    let h = RecordingHandlers::new();
    for (kind, params, containerized, want) in [
        (
            "Reboot",
            labels(&[]),
            false,
            "phase: Failed\nreason: UnknownKind\nmessage: \"unknown operation kind \\\"Reboot\\\" (the node agent handles NodeReboot, AgentReset and AgentUpgrade)\"\n",
        ),
        (
            "HostReboot",
            labels(&[]),
            false,
            "phase: Failed\nreason: UnsupportedOperation\nmessage: \"operation kind HostReboot is carried out by machina's host controllers, not by the node agent\"\n",
        ),
        (
            "AgentReset",
            labels(&[("force", "true")]),
            false,
            "phase: Failed\nreason: InvalidParameters\nmessage: \"unknown parameter \\\"force\\\" for AgentReset (it takes drainTimeout and onDrainTimeout, both optional)\"\n",
        ),
        (
            "AgentUpgrade",
            labels(&[("image", "registry.example.com/aks/agent:v2")]),
            true,
            "phase: Failed\nreason: InvalidParameters\nmessage: \"parameter \\\"image\\\" must be pinned by digest (registry/repository@sha256:<digest>), and \\\"registry.example.com/aks/agent:v2\\\" names only a tag\"\n",
        ),
    ] {
        let r = done(run_local(&OperationKind::parse(kind), &params, &h, containerized).await);
        assert_eq!(render_result(&r), want, "{kind}");
    }
    assert!(h.calls().is_empty());
}

#[tokio::test]
async fn local_agent_upgrade_hands_over_and_prints_in_progress() {
    let h = RecordingHandlers::new();
    let image = "registry.example.com/aks/agent@sha256:0000000000000000000000000000000000000000000000000000000000000000";
    let e = run_local(
        &OperationKind::parse("AgentUpgrade"),
        &labels(&[("image", image)]),
        &h,
        true,
    )
    .await;
    assert_eq!(
        render_executed(&e),
        "phase: InProgress\nreason: RestartScheduled\nmessage: restart scheduled\n"
    );
    assert_eq!(h.calls(), [format!("agent_upgrade image={image} op=-")]);
    // A failed upgrade is ExecutionFailed; an up-to-date one completes without a restart.
    let h = RecordingHandlers::new();
    h.fail_on("agent_upgrade", "pull: not found");
    let r = done(
        execute(
            &Action::AgentUpgrade(crate::flows::operations::UpgradeRequest::Image(
                image.into(),
            )),
            &h,
            None,
        )
        .await,
    );
    assert_eq!(
        (r.reason.as_str(), r.message.as_str()),
        ("ExecutionFailed", "pull: not found")
    );
    let h = RecordingHandlers::new();
    h.upgrade_with(crate::flows::upgrade::Started::AlreadyCurrent(
        "the agent already runs x".into(),
    ));
    let r = done(
        execute(
            &Action::AgentUpgrade(crate::flows::operations::UpgradeRequest::Image(
                image.into(),
            )),
            &h,
            None,
        )
        .await,
    );
    assert_eq!(
        r,
        OperationResult::complete("AgentUpgrade completed: the agent already runs x")
    );
}

#[test]
fn params_parse() {
    assert_eq!(
        parse_params(&["image=r.example/a@sha256:x", "sha256="]).unwrap(),
        labels(&[("image", "r.example/a@sha256:x"), ("sha256", "")])
    );
    assert_eq!(
        parse_params(&["image"]).unwrap_err().to_string(),
        "parameter \"image\" is not key=value"
    );
    assert_eq!(
        parse_params(&["=x"]).unwrap_err(),
        ParamError::NotKeyValue("=x".into())
    );
    assert_eq!(
        parse_params(&["a=1", "a=2"]).unwrap_err().to_string(),
        "parameter \"a\" is given twice"
    );
}

fn rec(uid: &str, name: &str, stage: Stage) -> Record {
    Record {
        version: 1,
        uid: uid.into(),
        name: name.into(),
        kind: "NodeReboot".into(),
        stage,
        started_at: "2027-01-15T08:00:00Z".into(),
        result: None,
    }
}

#[test]
fn record_store_roundtrip_and_prune() {
    let d = tempfile::tempdir().unwrap();
    let s = RecordStore::new(HostFs::new(d.path()));
    let uid = "3f1c2a7e-0000-4000-8000-000000000001";
    assert_eq!(s.load(uid).unwrap(), None);
    let mut r = rec(uid, "reboot-1", Stage::Executing);
    s.save(&r).unwrap();
    assert!(s.exists(uid));
    assert_eq!(s.load(uid).unwrap(), Some(r.clone()));
    let file = d
        .path()
        .join("etc/aks-flex-node/operations")
        .join(format!("{uid}.json"));
    let json = std::fs::read_to_string(&file).unwrap();
    insta::assert_snapshot!(json, @r#"
    {
      "format": "aks-flex-node.record/v1",
      "sha256": "8ed705b2058e67eb53fa18903d6872928a8be94a9f4079350ea2c5e3ff3e14c8",
      "payload": {
        "version": 1,
        "uid": "3f1c2a7e-0000-4000-8000-000000000001",
        "name": "reboot-1",
        "kind": "NodeReboot",
        "stage": "executing",
        "startedAt": "2027-01-15T08:00:00Z"
      }
    }
    "#);
    let fs = HostFs::new(d.path());
    assert_eq!(
        fs.mode(Path::new(&format!(
            "/etc/aks-flex-node/operations/{uid}.json"
        ))),
        Some(0o600)
    );
    r.stage = Stage::Finished;
    r.result = Some(OperationResult::complete("NodeReboot completed"));
    s.save(&r).unwrap();
    assert_eq!(s.load(uid).unwrap(), Some(r));
    // A tampered record is an error naming the file.
    std::fs::write(&file, "{}").unwrap();
    assert!(s.load(uid).unwrap_err().to_string().contains(uid));
    // Odd UIDs get a hashed file name, inside the directory.
    let odd = "../../etc/passwd";
    assert!(s.path(odd).starts_with("/etc/aks-flex-node/operations/"));
    assert!(!s.path(odd).to_string_lossy().contains(".."));
    // Pruning by name.
    s.save(&rec("u1", "gone", Stage::Finished)).unwrap();
    s.save(&rec("u2", "gone", Stage::Claiming)).unwrap();
    s.save(&rec("u3", "kept", Stage::Claiming)).unwrap();
    assert_eq!(s.delete_named("gone").unwrap(), 2);
    assert!(!s.exists("u1") && !s.exists("u2") && s.exists("u3"));
    s.delete("u3").unwrap();
    s.delete("u3").unwrap();
    let empty = RecordStore::at(HostFs::new(d.path()), "/nowhere");
    assert_eq!(empty.delete_named("x").unwrap(), 0);
}

#[tokio::test]
async fn host_handlers_reboot_the_active_machine() {
    let f = FakeHost::new().unwrap();
    let ops = Arc::new(RecordingOps::default());
    let h = HostHandlers::new(f.host.clone(), ops.clone()).with_timings(Timings::instant());
    let e = h
        .run(&Action::NodeReboot(Default::default()), None)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "no daemon state at /etc/aks-flex-node/daemon-state.json: this node has no active machine"
    );
    StateStore::new(f.host.fs.clone())
        .save(&DaemonState {
            active_machine: "kube2".into(),
            ..Default::default()
        })
        .unwrap();
    h.run(&Action::NodeReboot(Default::default()), None)
        .await
        .unwrap();
    assert_eq!(ops.calls(), ["stop kube2", "start kube2"]);
}

#[tokio::test]
async fn host_handlers_reset_and_stop_the_daemon() {
    let f = FakeHost::new().unwrap();
    let h = HostHandlers::new(f.host.clone(), Arc::new(RecordingOps::default()))
        .with_timings(Timings::instant());
    let store = RecordStore::new(f.host.fs.clone());
    store.save(&rec("u1", "reset", Stage::Executing)).unwrap();
    h.run(&Action::AgentReset(Default::default()), None)
        .await
        .unwrap();
    // Reset removes /etc/aks-flex-node, records included.
    assert!(!f.host.fs.exists(Path::new("/etc/aks-flex-node")));
    assert!(!store.exists("u1"));
    assert!(f.systemd.calls().contains(&"daemon-reload".to_string()));
    h.stop_daemon().await.unwrap();
    let calls = f.systemd.calls();
    assert!(
        calls.ends_with(&[
            "disable aks-flex-node-agent.service".to_string(),
            "daemon-reload".to_string(),
            "stop aks-flex-node-agent.service".to_string(),
        ]),
        "{calls:?}"
    );
}
