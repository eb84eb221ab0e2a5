//! The reconciler against the fake API server, scenario by scenario: claim and run, handler
//! failure, other machines' operations, selectors, bad input, conflicts on status updates, a
//! restart mid-operation, TTL expiry, AgentReset's stop, and the watch.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{Value, json};

use super::super::reconcile::*;
use super::super::record::{Record, RecordStore, Stage};
use super::super::{Handlers, OperationResult, RecordingHandlers};
use super::api::FakeApi;
use super::*;
use crate::flows::drain::fakes::FakeNodeDrain;
use flex_host::fs::HostFs;

const ME: &str = "node1";
const OP: &str = "/apis/unbounded-cloud.io/v1alpha3/machineoperations/op";
const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

struct Rig {
    api: FakeApi,
    handlers: RecordingHandlers,
    root: tempfile::TempDir,
    /// The drain's seam (the Node and its pods), faked; the adapter over a kube client is
    /// tested on its own below.
    drain: FakeNodeDrain,
}

impl Rig {
    fn new() -> Self {
        Self {
            api: FakeApi::new(),
            handlers: RecordingHandlers::new(),
            root: tempfile::tempdir().unwrap(),
            drain: FakeNodeDrain::quiet(ME),
        }
    }

    fn records(&self) -> RecordStore {
        RecordStore::new(HostFs::new(self.root.path()))
    }

    fn reconciler_with(&self, handlers: Arc<dyn Handlers>, containerized: bool) -> Reconciler {
        Reconciler::new(
            ReconcilerConfig {
                machine_name: ME.into(),
                node_name: ME.into(),
                records: self.records(),
                containerized,
                drain: Default::default(),
            },
            handlers,
        )
        .with_clock(Arc::new(|| at(NOW)))
        .with_drain(self.drain.factory(), quick_ready())
    }

    fn reconciler(&self) -> Reconciler {
        self.reconciler_with(Arc::new(self.handlers.clone()), false)
    }

    async fn reconcile(&self, name: &str) -> Result<Outcome, ReconcileError> {
        self.reconcile_with(&self.reconciler(), name).await
    }

    async fn reconcile_with(&self, r: &Reconciler, name: &str) -> Result<Outcome, ReconcileError> {
        tokio::time::timeout(Duration::from_secs(5), r.reconcile(self.api.client(), name))
            .await
            .expect("reconcile timed out")
    }
}

/// Drain timings whose wait for Ready is short (the fake Node is Ready at once, or never).
fn quick_ready() -> crate::flows::drain::DrainTimings {
    crate::flows::drain::DrainTimings {
        ready_timeout: Duration::from_millis(300),
        ready_poll: Duration::from_millis(20),
        ..Default::default()
    }
}

fn get() -> String {
    format!("GET {OP}")
}
fn patch() -> String {
    format!("PATCH {OP}/status")
}

fn finished(o: &Outcome) -> &OperationResult {
    match &o.taken {
        Taken::Finished(r) => r,
        other => panic!("expected Finished, got {other:?}"),
    }
}

#[tokio::test]
async fn claim_and_reboot() {
    let rig = Rig::new();
    rig.api.put_op(&op("op", "NodeReboot", ME));
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(
        finished(&out),
        &OperationResult::complete("NodeReboot completed")
    );
    assert_eq!(out.requeue_after, None);
    assert_eq!(rig.handlers.calls(), ["node_reboot"]);
    assert_eq!(rig.api.lines(), [get(), patch(), patch()]);
    let p = rig.api.patches();
    assert_eq!(
        p[0],
        json!({
            "metadata": {"resourceVersion": "1"},
            "status": {
                "phase": "InProgress",
                "reason": "InProgress",
                "message": "restarting active nspawn node",
                "startedAt": "2027-01-15T08:00:00Z",
                "claimedBy": "node1",
                "conditions": [{
                    "lastTransitionTime": "2027-01-15T08:00:00Z",
                    "message": "restarting active nspawn node",
                    "observedGeneration": 1,
                    "reason": "InProgress",
                    "status": "False",
                    "type": "Completed",
                }],
            },
        })
    );
    assert_eq!(
        p[1],
        json!({
            "metadata": {"resourceVersion": "2"},
            "status": {
                "phase": "Complete",
                "reason": "Succeeded",
                "message": "NodeReboot completed",
                "startedAt": "2027-01-15T08:00:00Z",
                "completedAt": "2027-01-15T08:00:00Z",
                "claimedBy": "node1",
                "conditions": [{
                    "lastTransitionTime": "2027-01-15T08:00:00Z",
                    "message": "NodeReboot completed",
                    "observedGeneration": 1,
                    "reason": "Succeeded",
                    "status": "True",
                    "type": "Completed",
                }],
            },
        })
    );
    let stored = rig.api.op("op").unwrap();
    assert_eq!(stored["status"]["phase"], "Complete");
    // The record says it ran and how it ended.
    let rec = rig.records().load("uid-op").unwrap().unwrap();
    assert_eq!(rec.stage, Stage::Finished);
    assert_eq!(
        rec.result,
        Some(OperationResult::complete("NodeReboot completed"))
    );
    // A second reconcile (the watch's echo of the update) does nothing.
    let again = rig.reconcile("op").await.unwrap();
    assert_eq!(again.taken, Taken::Ignored("it is finished".into()));
    assert_eq!(rig.handlers.calls(), ["node_reboot"]);
}

#[tokio::test]
async fn handler_failure_is_execution_failed() {
    let rig = Rig::new();
    rig.api.put_op(&op("op", "NodeReboot", ME));
    rig.handlers
        .fail_on("node_reboot", "start kube1: kubelet did not become ready");
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(
        finished(&out),
        &OperationResult::failed(
            "ExecutionFailed",
            "start kube1: kubelet did not become ready; the node is uncordoned"
        )
    );
    let last = rig.api.patches().pop().unwrap();
    assert_eq!(last["status"]["phase"], "Failed");
    assert_eq!(last["status"]["reason"], "ExecutionFailed");
    assert_eq!(last["status"]["conditions"][0]["status"], "False");
    assert_eq!(last["status"]["conditions"][0]["reason"], "ExecutionFailed");
    // The condition was already False (InProgress): its transition time stays.
    assert_eq!(
        last["status"]["conditions"][0]["lastTransitionTime"],
        "2027-01-15T08:00:00Z"
    );
}

#[tokio::test]
async fn another_machines_operation_is_left_alone() {
    let rig = Rig::new();
    rig.api.put_op(&op("op", "NodeReboot", "node2"));
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(
        out.taken,
        Taken::Ignored("it targets machine \"node2\", not \"node1\"".into())
    );
    assert_eq!(rig.api.lines(), [get()]);
    assert!(rig.handlers.calls().is_empty());
    assert!(!rig.records().exists("uid-op"));
}

#[tokio::test]
async fn selector_matches_the_nodes_labels() {
    let rig = Rig::new();
    rig.api
        .put_node(ME, &[("node-restriction.kubernetes.io/pool", "flex")])
        .put_op(&with_selector(
            op("op", "NodeReboot", ""),
            &[("node-restriction.kubernetes.io/pool", "flex")],
        ));
    let out = rig.reconcile("op").await.unwrap();
    assert!(finished(&out).succeeded());
    assert_eq!(
        rig.api.lines(),
        [get(), "GET /api/v1/nodes/node1".into(), patch(), patch()]
    );
    assert_eq!(rig.handlers.calls(), ["node_reboot"]);
}

#[tokio::test]
async fn selector_falls_back_to_the_machines_labels_or_ignores() {
    let rig = Rig::new();
    rig.api
        .put_machine(ME, &[("node-restriction.kubernetes.io/pool", "gpu")])
        .put_op(&with_selector(
            op("op", "NodeReboot", ""),
            &[("node-restriction.kubernetes.io/pool", "flex")],
        ));
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(
        out.taken,
        Taken::Ignored("its machineSelector does not match the labels of \"node1\"".into())
    );
    assert_eq!(
        rig.api.lines(),
        [
            get(),
            "GET /api/v1/nodes/node1".into(),
            "GET /apis/unbounded-cloud.io/v1alpha3/machines/node1".into(),
        ]
    );
    assert!(rig.handlers.calls().is_empty());
}

#[tokio::test]
async fn unknown_kind_fails_without_running() {
    let rig = Rig::new();
    rig.api.put_op(&op("op", "Defragment", ME));
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(finished(&out).reason, "UnknownKind");
    assert_eq!(rig.api.lines(), [get(), patch()]);
    let p = &rig.api.patches()[0];
    assert_eq!(p["status"]["phase"], "Failed");
    assert_eq!(
        p["status"]["message"],
        "unknown operation kind \"Defragment\" (the node agent handles NodeReboot, AgentReset and AgentUpgrade)"
    );
    assert_eq!(p["status"]["startedAt"], p["status"]["completedAt"]);
    assert!(rig.handlers.calls().is_empty());
    assert!(!rig.records().exists("uid-op"));
}

#[tokio::test]
async fn agent_upgrade_with_a_tag_alone_is_invalid() {
    let rig = Rig::new();
    rig.api.put_op(&with_params(
        op("op", "AgentUpgrade", ME),
        &[("image", "registry.example.com/aks/agent:v2")],
    ));
    let r = rig.reconciler_with(Arc::new(rig.handlers.clone()), true);
    let out = rig.reconcile_with(&r, "op").await.unwrap();
    assert_eq!(finished(&out).reason, "InvalidParameters");
    assert!(finished(&out).message.contains("names only a tag"));
    assert_eq!(rig.api.lines(), [get(), patch()]);
    assert!(rig.handlers.calls().is_empty());
}

#[tokio::test]
async fn agent_upgrade_hands_over_and_the_restarted_agent_finishes_it() {
    let rig = Rig::new();
    let image = format!("registry.example.com/aks/agent@{DIGEST}");
    rig.api.put_op(&with_params(
        op("op", "AgentUpgrade", ME),
        &[("image", &image)],
    ));
    let r = rig.reconciler_with(Arc::new(rig.handlers.clone()), true);
    let out = rig.reconcile_with(&r, "op").await.unwrap();
    assert_eq!(
        out.taken,
        Taken::HandedOff("restart scheduled".into()),
        "the status stays InProgress"
    );
    assert_eq!(
        rig.handlers.calls(),
        [format!("agent_upgrade image={image} op=op")]
    );
    assert_eq!(rig.api.lines(), [get(), patch()]);
    assert_eq!(rig.api.patches()[0]["status"]["phase"], "InProgress");
    assert_eq!(
        rig.records().load("uid-op").unwrap().unwrap().stage,
        Stage::Executing
    );
    // Seen again before the restart: the handoff is pending, nothing runs twice.
    rig.handlers.resume_pending();
    let out = rig.reconcile_with(&r, "op").await.unwrap();
    assert!(matches!(out.taken, Taken::Ignored(_)), "{out:?}");
    assert_eq!(
        out.requeue_after,
        Some(crate::flows::operations::reconcile::HANDOFF_RECHECK)
    );
    assert_eq!(rig.handlers.calls().len(), 1);
    // The restarted agent proved itself: the upgrade record has the result.
    rig.handlers.resume_with(OperationResult::complete(
        "AgentUpgrade completed: the agent runs x",
    ));
    let out = rig.reconcile_with(&r, "op").await.unwrap();
    assert_eq!(
        finished(&out),
        &OperationResult::complete("AgentUpgrade completed: the agent runs x")
    );
    assert_eq!(rig.handlers.calls().len(), 1);
    // On a host, the image parameter itself is the problem, and the message names it.
    let rig = Rig::new();
    rig.api.put_op(&with_params(
        op("op", "AgentUpgrade", ME),
        &[("image", &image)],
    ));
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(finished(&out).reason, "InvalidParameters");
    assert!(finished(&out).message.starts_with("parameter \"image\""));
}

#[tokio::test]
async fn conflict_on_the_claim_rereads_then_claims() {
    let rig = Rig::new();
    rig.api.put_op(&op("op", "NodeReboot", ME));
    // Another writer changes the operation just before the claim lands.
    rig.api.before(1, |st| st.touch("op"));
    let out = rig.reconcile("op").await.unwrap();
    assert!(finished(&out).succeeded());
    assert_eq!(rig.api.lines(), [get(), patch(), get(), patch(), patch()]);
    let p = rig.api.patches();
    assert_eq!(p[0]["metadata"]["resourceVersion"], "1");
    assert_eq!(p[1]["metadata"]["resourceVersion"], "2");
    assert_eq!(rig.handlers.calls(), ["node_reboot"]);
}

#[tokio::test]
async fn conflict_on_finish_reports_without_running_again() {
    let rig = Rig::new();
    rig.api.put_op(&op("op", "NodeReboot", ME));
    rig.api.before(2, |st| st.touch("op"));
    let out = rig.reconcile("op").await.unwrap();
    assert!(finished(&out).succeeded());
    assert_eq!(rig.api.lines(), [get(), patch(), patch(), get(), patch()]);
    assert_eq!(rig.handlers.calls(), ["node_reboot"], "never twice");
    assert_eq!(rig.api.op("op").unwrap()["status"]["phase"], "Complete");
}

#[tokio::test]
async fn a_lost_claim_is_not_taken_for_ours() {
    let rig = Rig::new();
    rig.api
        .put_node(ME, &[("node-restriction.kubernetes.io/pool", "flex")])
        .put_op(&with_selector(
            op("op", "NodeReboot", ""),
            &[("node-restriction.kubernetes.io/pool", "flex")],
        ));
    // Another agent claims it, in the same second, just before this one's claim lands.
    rig.api.before(2, |st| {
        st.touch("op");
        let o = st.ops.get_mut("op").unwrap();
        o["status"] = json!({"phase": "InProgress", "startedAt": "2027-01-15T08:00:00Z"});
    });
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(
        out.taken,
        Taken::Ignored("another agent claimed it (it is InProgress)".into())
    );
    assert_eq!(
        rig.api.lines(),
        [get(), "GET /api/v1/nodes/node1".into(), patch(), get()]
    );
    assert!(rig.handlers.calls().is_empty());
    assert!(!rig.records().exists("uid-op"));
}

#[tokio::test]
async fn endless_conflicts_give_up() {
    let rig = Rig::new();
    rig.api.put_op(&op("op", "NodeReboot", ME));
    for i in 0..40 {
        rig.api.before(i, |st| st.touch("op"));
    }
    let e = rig.reconcile("op").await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "MachineOperation op kept changing: 6 conflicting writes in a row"
    );
    assert!(rig.handlers.calls().is_empty());
}

fn seed(rig: &Rig, stage: Stage, started_at: &str, result: Option<OperationResult>) {
    rig.records()
        .save(&Record {
            version: 1,
            uid: "uid-op".into(),
            name: "op".into(),
            kind: "NodeReboot".into(),
            stage,
            started_at: started_at.into(),
            result,
        })
        .unwrap();
}

#[tokio::test]
async fn restart_mid_operation_is_interrupted_not_rerun() {
    let rig = Rig::new();
    rig.api.put_op(&with_status(
        op("op", "NodeReboot", ME),
        "InProgress",
        Some(NOW - 300),
        None,
    ));
    seed(&rig, Stage::Executing, "2027-01-15T07:55:00Z", None);
    let out = rig.reconcile("op").await.unwrap();
    let r = finished(&out);
    assert_eq!(r.reason, "Interrupted");
    assert_eq!(
        r.message,
        "the agent restarted while NodeReboot was running; it is not run again, and its effect is unknown"
    );
    assert!(rig.handlers.calls().is_empty(), "the handler is not called");
    assert_eq!(rig.api.lines(), [get(), patch()]);
    let p = &rig.api.patches()[0];
    assert_eq!(p["status"]["startedAt"], "2027-01-15T07:55:00Z");
    assert_eq!(p["status"]["completedAt"], "2027-01-15T08:00:00Z");
    assert_eq!(
        rig.records().load("uid-op").unwrap().unwrap().stage,
        Stage::Finished
    );
}

#[tokio::test]
async fn restart_mid_operation_asks_the_resume_hook() {
    let rig = Rig::new();
    rig.api.put_op(&with_status(
        op("op", "NodeReboot", ME),
        "InProgress",
        Some(NOW - 300),
        None,
    ));
    seed(&rig, Stage::Executing, "2027-01-15T07:55:00Z", None);
    rig.handlers
        .resume_with(OperationResult::complete("AgentUpgrade completed"));
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(
        finished(&out),
        &OperationResult::complete("AgentUpgrade completed")
    );
    assert!(rig.handlers.calls().is_empty());
}

#[tokio::test]
async fn restart_after_the_claim_runs_it_once() {
    let rig = Rig::new();
    rig.api.put_op(&with_status(
        op("op", "NodeReboot", ME),
        "InProgress",
        Some(NOW - 5),
        None,
    ));
    seed(&rig, Stage::Claiming, "2027-01-15T07:59:55Z", None);
    let out = rig.reconcile("op").await.unwrap();
    assert!(finished(&out).succeeded());
    assert_eq!(rig.handlers.calls(), ["node_reboot"]);
    assert_eq!(rig.api.lines(), [get(), patch()]);
}

#[tokio::test]
async fn restart_with_a_recorded_result_reports_it() {
    let rig = Rig::new();
    rig.api.put_op(&with_status(
        op("op", "NodeReboot", ME),
        "InProgress",
        Some(NOW - 5),
        None,
    ));
    let failed = OperationResult::failed("ExecutionFailed", "boom");
    seed(
        &rig,
        Stage::Finished,
        "2027-01-15T07:59:55Z",
        Some(failed.clone()),
    );
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(finished(&out), &failed);
    assert!(rig.handlers.calls().is_empty());
}

/// An operation this agent claimed that no longer names its machine (its machineRef changed to
/// another machine: a spec edit the CRD forbids, so tampering) is refused: not run, not
/// written, and its record dropped (before the fix it was only ignored, keeping the record).
#[tokio::test]
async fn a_claimed_operation_retargeted_elsewhere_is_refused() {
    let rig = Rig::new();
    rig.api.put_op(&with_status(
        op("op", "NodeReboot", "node2"),
        "InProgress",
        Some(NOW - 5),
        None,
    ));
    seed(&rig, Stage::Claiming, "2027-01-15T07:59:55Z", None);
    let out = rig.reconcile("op").await.unwrap();
    assert!(
        matches!(&out.taken, Taken::Refused(w) if w.contains("node2") && w.contains("claiming")),
        "{:?}",
        out.taken
    );
    assert!(rig.handlers.calls().is_empty());
    assert!(rig.api.patches().is_empty());
    assert!(!rig.records().exists("uid-op"));
}

#[tokio::test]
async fn in_progress_elsewhere_is_ignored_and_a_stale_claim_forgotten() {
    let rig = Rig::new();
    rig.api.put_op(&with_status(
        op("op", "NodeReboot", ME),
        "InProgress",
        Some(NOW - 5),
        None,
    ));
    let out = rig.reconcile("op").await.unwrap();
    assert!(matches!(out.taken, Taken::Ignored(_)));
    seed(&rig, Stage::Claiming, "2027-01-15T07:00:00Z", None);
    let out = rig.reconcile("op").await.unwrap();
    assert!(matches!(&out.taken, Taken::Ignored(w) if w.starts_with("another agent claimed it")));
    assert!(!rig.records().exists("uid-op"));
    assert!(rig.handlers.calls().is_empty());
    assert!(rig.api.patches().is_empty());
}

#[tokio::test]
async fn ttl_requeues_then_deletes() {
    let rig = Rig::new();
    let mut o = op("op", "NodeReboot", ME);
    o.spec.ttl_seconds_after_finished = Some(30);
    rig.api.put_op(&o);
    let out = rig.reconcile("op").await.unwrap();
    assert!(finished(&out).succeeded());
    assert_eq!(out.requeue_after, Some(Duration::from_secs(30)));

    // Finished 10 s ago: wait 20 s more.
    let rig = Rig::new();
    rig.api.put_op(&with_status(
        o.clone(),
        "Complete",
        Some(NOW - 20),
        Some(NOW - 10),
    ));
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(out.taken, Taken::Waiting);
    assert_eq!(out.requeue_after, Some(Duration::from_secs(20)));
    assert_eq!(rig.api.lines(), [get()]);

    // Finished 30 s ago: delete it, with preconditions, and its record.
    let rig = Rig::new();
    rig.api.put_op(&with_status(
        o.clone(),
        "Complete",
        Some(NOW - 40),
        Some(NOW - 30),
    ));
    seed(&rig, Stage::Finished, "2027-01-15T07:59:20Z", None);
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(out.taken, Taken::Deleted);
    assert_eq!(rig.api.lines(), [get(), format!("DELETE {OP}")]);
    let del = rig.api.state().seen[1].body.clone();
    assert_eq!(
        del["preconditions"],
        json!({"resourceVersion": "1", "uid": "uid-op"})
    );
    assert!(rig.api.op("op").is_none());
    assert!(!rig.records().exists("uid-op"));
    assert!(rig.handlers.calls().is_empty());
}

#[tokio::test]
async fn ttl_delete_conflict_rereads() {
    let rig = Rig::new();
    let mut o = with_status(op("op", "NodeReboot", ME), "Failed", None, Some(NOW - 100));
    o.spec.ttl_seconds_after_finished = Some(0);
    rig.api.put_op(&o);
    rig.api.before(1, |st| st.touch("op"));
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(out.taken, Taken::Deleted);
    assert_eq!(
        rig.api.lines(),
        [get(), format!("DELETE {OP}"), get(), format!("DELETE {OP}")]
    );
}

#[tokio::test]
async fn a_deleted_operation_is_gone_with_its_records() {
    let rig = Rig::new();
    seed(&rig, Stage::Finished, "2027-01-15T07:59:20Z", None);
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(out.taken, Taken::Gone);
    assert!(!rig.records().exists("uid-op"));
}

/// Handlers whose reset removes the agent's state, records included, as the real one does.
struct ResettingHandlers {
    inner: RecordingHandlers,
    records: RecordStore,
}

#[async_trait]
impl Handlers for ResettingHandlers {
    async fn run(
        &self,
        action: &crate::flows::operations::Action,
        op: Option<crate::flows::upgrade::OperationRef>,
    ) -> anyhow::Result<crate::flows::operations::Ran> {
        let ran = self.inner.run(action, op).await?;
        if *action == crate::flows::operations::Action::AgentReset(Default::default()) {
            self.records.delete("uid-op")?;
        }
        Ok(ran)
    }
    async fn stop_daemon(&self) -> anyhow::Result<()> {
        self.inner.stop_daemon().await
    }
}

#[tokio::test]
async fn agent_reset_finishes_then_stops_the_daemon() {
    let rig = Rig::new();
    rig.api.put_op(&op("op", "AgentReset", ME));
    // The finish conflicts once: the result, held in memory, is reported without a second reset.
    rig.api.before(2, |st| st.touch("op"));
    let h = ResettingHandlers {
        inner: rig.handlers.clone(),
        records: rig.records(),
    };
    let r = rig.reconciler_with(Arc::new(h), false);
    let out = rig.reconcile_with(&r, "op").await.unwrap();
    assert_eq!(
        finished(&out),
        &OperationResult::complete("AgentReset completed")
    );
    assert!(
        out.stop_daemon,
        "the caller stops the daemon once the status says Complete"
    );
    assert_eq!(rig.handlers.calls(), ["agent_reset"]);
    assert_eq!(rig.api.lines(), [get(), patch(), patch(), get(), patch()]);
    assert_eq!(
        rig.api.patches()[0]["status"]["message"],
        "resetting local nspawn node runtime"
    );
    // The reset's removal of the records is not undone.
    assert!(!rig.records().exists("uid-op"));
}

#[tokio::test]
async fn a_failed_agent_reset_does_not_stop_the_daemon() {
    let rig = Rig::new();
    rig.api.put_op(&op("op", "AgentReset", ME));
    rig.handlers
        .fail_on("agent_reset", "remove-runtime-dirs: busy");
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(
        finished(&out),
        &OperationResult::failed(
            "ExecutionFailed",
            "remove-runtime-dirs: busy; the node is uncordoned"
        )
    );
    assert_eq!(rig.drain.cordon(), (false, None));
    assert!(!out.stop_daemon);
    // Other kinds never stop it.
    let rig = Rig::new();
    rig.api.put_op(&op("op", "NodeReboot", ME));
    assert!(!rig.reconcile("op").await.unwrap().stop_daemon);
}

#[tokio::test]
async fn api_errors_name_the_operation() {
    let rig = Rig::new();
    rig.api.put_op(&op("op", "NodeReboot", ME));
    rig.api.before(1, |st| {
        st.ops.remove("op");
    });
    // The operation vanished under the claim: nothing runs.
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(out.taken, Taken::Gone);
    assert!(rig.handlers.calls().is_empty());
    assert!(!rig.records().exists("uid-op"));
}

#[tokio::test]
async fn watch_names_the_operations_worth_reconciling() {
    let api = FakeApi::new();
    api.put_op(&op("a-mine", "NodeReboot", ME))
        .put_op(&op("b-other", "NodeReboot", "node2"))
        .put_op(&with_status(
            op("c-done", "NodeReboot", ME),
            "Complete",
            Some(NOW),
            Some(NOW),
        ))
        .put_op(&op("d-host", "HostReboot", ME));
    let added = serde_json::to_value(with_selector(
        op("e-selected", "AgentReset", ""),
        &[("node-restriction.kubernetes.io/pool", "flex")],
    ))
    .unwrap();
    let deleted = serde_json::to_value(op("f-deleted", "NodeReboot", ME)).unwrap();
    let other_deleted = serde_json::to_value(op("g-deleted", "NodeReboot", "node2")).unwrap();
    let events: Vec<Value> = vec![
        json!({"type": "ADDED", "object": added}),
        json!({"type": "DELETED", "object": other_deleted}),
        json!({"type": "DELETED", "object": deleted}),
    ];
    api.state().watch_events = events;
    let stream = watch_stream(api.client(), ME.into());
    let mut names: Vec<String> = tokio::time::timeout(
        Duration::from_secs(5),
        stream.take(3).map(|r| r.unwrap()).collect(),
    )
    .await
    .unwrap();
    // Two watches (by machineRef, by selector) are merged: their order is theirs.
    names.sort();
    assert_eq!(names, ["a-mine", "e-selected", "f-deleted"]);
}

/// Fake API server (the CRD's `selectableFields` served, or refused as by a CRD without
/// them): what a daemon's watch makes the server send, for fleets of different sizes. Scoped,
/// it is the same whatever the number of operations aimed at other machines; refused, the
/// daemon falls back to watching all of them, and still names only its own.
#[tokio::test]
async fn the_watch_costs_the_same_whatever_the_fleet_and_falls_back_when_the_field_is_refused() {
    // (operations aimed at other machines, field selectors served, operations the server sends)
    let cases = [
        (10, true, 3),
        (300, true, 3),
        (10, false, 12),
        (300, false, 302),
    ];
    for (others, served, want_sent) in cases {
        let api = FakeApi::new();
        for i in 0..others {
            api.put_op(&op(
                &format!("other-{i}"),
                "NodeReboot",
                &format!("node-{i}"),
            ));
        }
        api.put_op(&op("mine", "NodeReboot", ME))
            .put_op(&with_selector(
                op("selected", "AgentReset", ""),
                &[("node-restriction.kubernetes.io/pool", "flex")],
            ));
        api.state().refuse_field_selectors = !served;
        let stream = watch_stream(api.client(), ME.into());
        let mut names: Vec<String> = tokio::time::timeout(
            Duration::from_secs(5),
            stream.take(2).map(|r| r.unwrap()).collect(),
        )
        .await
        .unwrap();
        names.sort();
        let case = format!("{others} others, field selectors served: {served}");
        assert_eq!(names, ["mine", "selected"], "{case}");
        // The lists are done once both named; the watches that follow send nothing here.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(api.state().delivered, want_sent, "{case}");
        let selectors: BTreeSet<String> = api
            .state()
            .seen
            .iter()
            .filter_map(|s| {
                s.query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("fieldSelector="))
                    .map(str::to_string)
            })
            .collect();
        let want: BTreeSet<String> = [format!("spec.machineRef={ME}"), "spec.machineRef=".into()]
            .into_iter()
            .filter(|s| served || s.ends_with(ME))
            .collect();
        assert_eq!(selectors, want, "{case}: the field selectors asked");
    }
}

/// Fake API server: a scoped watch whose field selector becomes refused (the CRD replaced by
/// one without `selectableFields`) passes the error on and ends, so that the daemon's restart
/// probes again and watches everything.
#[tokio::test]
async fn a_scoped_watch_that_becomes_refused_ends_and_the_next_one_watches_all() {
    let api = FakeApi::new();
    api.put_op(&op("mine", "NodeReboot", ME));
    // Request 0 is the probe; from request 1 on the field is refused.
    api.before(1, |st| st.refuse_field_selectors = true);
    let seen: Vec<_> = tokio::time::timeout(
        Duration::from_secs(5),
        watch_stream(api.client(), ME.into()).collect::<Vec<_>>(),
    )
    .await
    .expect("the refused watch must end");
    assert_eq!(seen.len(), 1, "{seen:?}");
    let e = seen[0].as_ref().unwrap_err();
    assert!(watch_refuses_field_selector(e), "{e}");
    let names: Vec<String> = tokio::time::timeout(
        Duration::from_secs(5),
        watch_stream(api.client(), ME.into())
            .take(1)
            .map(|r| r.unwrap())
            .collect(),
    )
    .await
    .unwrap();
    assert_eq!(names, ["mine"]);
}

/// Which API answers mean the field selector is refused (pure: statuses built by hand).
#[test]
fn only_a_400_naming_the_field_label_is_a_refused_field_selector() {
    let status = |code: u16, message: &str| {
        kube::core::Status::failure(message, "BadRequest").with_code(code)
    };
    for (code, message, want) in [
        (400, "field label not supported: spec.machineRef", true),
        (400, "unable to parse requirement", false),
        (403, "field label not supported: spec.machineRef", false),
        (500, "internal error", false),
    ] {
        assert_eq!(
            refuses_field_selector(&status(code, message)),
            want,
            "{code} {message}"
        );
    }
    let refused = || Box::new(status(400, "field label not supported: spec.machineRef"));
    assert!(watch_refuses_field_selector(
        &kube::runtime::watcher::Error::InitialListFailed(kube::Error::Api(refused()))
    ));
    assert!(watch_refuses_field_selector(
        &kube::runtime::watcher::Error::WatchError(refused())
    ));
    assert!(!watch_refuses_field_selector(
        &kube::runtime::watcher::Error::NoResourceVersion
    ));
}

/// Which reconcile errors the daemon stops retrying (pure: errors built by hand): the API server
/// rejecting a request as malformed, nothing else.
#[test]
fn only_a_request_the_api_server_calls_malformed_is_permanent() {
    let api = |code: u16| {
        kube::Error::Api(
            kube::core::Status::failure("answer", "Reason")
                .with_code(code)
                .boxed(),
        )
    };
    for (code, want) in [
        (400, true),
        (422, true),
        (401, false),
        (403, false),
        (404, false),
        (409, false),
        (429, false),
        (500, false),
        (503, false),
    ] {
        let e = ReconcileError::Api {
            action: "finish",
            name: "op".into(),
            cause: api(code),
        };
        assert_eq!(e.is_permanent(), want, "status write answered {code}");
        let e = ReconcileError::Labels {
            kind: "Node",
            name: "n".into(),
            cause: api(code),
        };
        assert_eq!(e.is_permanent(), want, "labels read answered {code}");
    }
    let conflict = ReconcileError::Conflict {
        name: "op".into(),
        attempts: 5,
    };
    assert!(!conflict.is_permanent());
    let transport = ReconcileError::Api {
        action: "get",
        name: "op".into(),
        cause: kube::Error::LinesCodecMaxLineLengthExceeded,
    };
    assert!(!transport.is_permanent());
}

// ---- Cordon and drain (the API server faked for the operation, the drain's seam faked for
// the Node and its pods; the handlers record what ran) ----

use crate::flows::drain::fakes::{daemonset_pod, fresh_holder, node, pod};

/// Handlers that note, when the handler runs, whether the Node is cordoned and which pods are
/// still bound to it.
struct Observing {
    inner: RecordingHandlers,
    drain: FakeNodeDrain,
    seen: Arc<std::sync::Mutex<Vec<String>>>,
}

#[async_trait]
impl Handlers for Observing {
    async fn run(
        &self,
        action: &crate::flows::operations::Action,
        op: Option<crate::flows::upgrade::OperationRef>,
    ) -> anyhow::Result<crate::flows::operations::Ran> {
        let (cordoned, by) = self.drain.cordon();
        let pods: Vec<String> = self
            .drain
            .state()
            .pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        self.seen.lock().unwrap().push(format!(
            "{}: cordoned {cordoned} by {}, pods {pods:?}",
            action.kind(),
            by.unwrap_or_default()
        ));
        self.inner.run(action, op).await
    }
    async fn stop_daemon(&self) -> anyhow::Result<()> {
        self.inner.stop_daemon().await
    }
}

fn observing(rig: &Rig) -> (Reconciler, Arc<std::sync::Mutex<Vec<String>>>) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let h = Observing {
        inner: rig.handlers.clone(),
        drain: rig.drain.clone(),
        seen: seen.clone(),
    };
    (rig.reconciler_with(Arc::new(h), false), seen)
}

fn rig_with(
    node: k8s_openapi::api::core::v1::Node,
    pods: Vec<k8s_openapi::api::core::v1::Pod>,
) -> Rig {
    let mut rig = Rig::new();
    // The cluster's disruption budget as deployed: one slot, free.
    rig.drain = FakeNodeDrain::new(node, pods).with_budget(&[("maxUnavailable", "1")]);
    rig
}

#[tokio::test(start_paused = true)]
async fn a_node_reboot_waits_for_the_slot_another_node_holds_then_proceeds() {
    let rig = rig_with(node(ME, false, None), vec![pod("default", "web")]);
    rig.drain
        .state()
        .budget
        .as_mut()
        .unwrap()
        .1
        .insert("holder.node2".into(), fresh_holder("op-2"));
    rig.api.put_op(&op("op", "NodeReboot", ME));
    let r = rig.reconciler();
    // Longer than `reconcile`'s own 5 s limit: the looks take 14 s (tokio's clock paused).
    let run = || tokio::time::timeout(Duration::from_secs(60), r.reconcile(rig.api.client(), "op"));
    // node2 holds the only slot: the daemon gets the reconcile back, to come again later.
    let out = run().await.unwrap().unwrap();
    assert_eq!(
        out.requeue_after,
        Some(crate::flows::drain::budget::SLOT_RECHECK)
    );
    assert_eq!(
        out.taken,
        Taken::Ignored(
            "waiting for a disruption slot: MachineOperation op (NodeReboot) waits for one of 1 \
             disruption slot(s), held by node2"
                .into()
        )
    );
    assert!(rig.drain.calls().is_empty(), "neither cordoned nor drained");
    assert!(rig.handlers.calls().is_empty());
    assert_eq!(
        rig.records().load("uid-op").unwrap().unwrap().stage,
        Stage::Claiming
    );
    // Its status says why it waits (the Completed condition too).
    let status = rig.api.state().ops["op"]["status"].clone();
    assert_eq!(status["phase"], "InProgress");
    assert_eq!(status["reason"], "WaitingForDisruptionSlot");
    assert_eq!(
        status["message"],
        "MachineOperation op (NodeReboot) waits for one of 1 disruption slot(s), held by node2"
    );
    assert_eq!(
        status["conditions"][0]["reason"],
        "WaitingForDisruptionSlot"
    );
    let status_writes = || {
        rig.api
            .lines()
            .iter()
            .filter(|l| l.starts_with("PATCH") && l.ends_with("/status"))
            .count()
    };
    let writes = status_writes();
    // Still held at the next look: no second Event, and no status write (it says the same).
    run().await.unwrap().unwrap();
    assert_eq!(status_writes(), writes);
    let budget = |edit: &dyn Fn(&mut std::collections::BTreeMap<String, String>)| {
        edit(&mut rig.drain.state().budget.as_mut().unwrap().1)
    };
    // node2's slot handed on to node3: still a wait for a held slot. Neither a status write
    // nor an Event: in a burst larger than the budget the holders change once per slot handed
    // on, and a write for each would make every waiting node's cost grow with the burst.
    budget(&|b| {
        b.remove("holder.node2");
        b.insert("holder.node3".into(), fresh_holder("op-3"));
    });
    let told = rig.drain.events().len();
    run().await.unwrap().unwrap();
    assert_eq!(
        status_writes(),
        writes,
        "the holders changed: no status write"
    );
    assert_eq!(
        rig.drain.events().len(),
        told,
        "the holders changed: no Event"
    );
    // node3 done, and the budget paused by the administrator (maxUnavailable 0): that is news,
    // said once each way.
    budget(&|b| {
        b.remove("holder.node3");
        b.insert("maxUnavailable".into(), "0".into());
    });
    run().await.unwrap().unwrap();
    assert_eq!(status_writes(), writes + 1);
    assert!(
        rig.api.state().ops["op"]["status"]["message"]
            .as_str()
            .unwrap()
            .ends_with("maxUnavailable is 0: disruptive operations are paused")
    );
    assert_eq!(
        rig.drain.events().len(),
        told + 2,
        "the Node's and the operation's"
    );
    run().await.unwrap().unwrap();
    assert_eq!(status_writes(), writes + 1, "still paused: said already");
    // Resumed and freed: the next reconcile takes the slot and runs the operation.
    budget(&|b| {
        b.insert("maxUnavailable".into(), "1".into());
    });
    let out = run().await.unwrap().unwrap();
    assert!(finished(&out).succeeded(), "{:?}", finished(&out));
    assert_eq!(rig.handlers.calls(), ["node_reboot"]);
    // Back to InProgress when it got the slot, then finished.
    assert_eq!(status_writes(), writes + 3, "no conflict on the way");
    assert_eq!(rig.api.state().ops["op"]["status"]["phase"], "Complete");
    let events = rig.drain.events();
    assert_eq!(
        events[1],
        "MachineOperation/op Normal WaitingForDisruptionSlot: MachineOperation op (NodeReboot) \
         waits for one of 1 disruption slot(s), held by node2"
    );
    assert!(
        events[told + 3].starts_with("MachineOperation/op Normal DisruptionSlotAcquired"),
        "{events:?}"
    );
    assert!(rig.drain.holder(ME).is_none(), "freed after the uncordon");
}

#[tokio::test(start_paused = true)]
async fn a_slot_write_refused_for_good_fails_the_operation_with_an_event() {
    let rig = rig_with(node(ME, false, None), vec![]);
    rig.drain.state().failures.insert(
        "set_budget",
        [crate::flows::drain::DrainApiError {
            action: "patch configmap".into(),
            cause: "403: node1 may change only its own slot".into(),
            permanent: true,
            conflict: false,
        }]
        .into(),
    );
    rig.api.put_op(&op("op", "NodeReboot", ME));
    let out = rig.reconcile("op").await.unwrap();
    let r = finished(&out);
    assert_eq!(r.reason, "DrainFailed");
    assert!(
        r.message
            .contains("the disruption slot could not be written"),
        "{}",
        r.message
    );
    assert!(rig.handlers.calls().is_empty());
    assert!(
        rig.drain.events()[0].starts_with("Node/node1 Warning DisruptionSlotRefused"),
        "{:?}",
        rig.drain.events()
    );
}

#[tokio::test(start_paused = true)]
async fn a_disruption_budget_that_does_not_parse_fails_the_operation_naming_the_field() {
    let rig = rig_with(node(ME, false, None), vec![pod("default", "web")]);
    rig.drain.state().budget = Some((
        1,
        [("maxUnavailable".to_string(), "all".to_string())].into(),
    ));
    rig.api.put_op(&op("op", "NodeReboot", ME));
    let out = rig.reconcile("op").await.unwrap();
    let r = finished(&out);
    assert_eq!(r.reason, "DisruptionBudgetInvalid");
    assert_eq!(
        r.message,
        "NodeReboot not run: ConfigMap kube-system/aks-flex-node-disruption: \
         data.maxUnavailable: \"all\" is not a whole number of nodes (0 or more)"
    );
    assert!(rig.handlers.calls().is_empty());
    assert!(rig.drain.calls().is_empty(), "neither cordoned nor drained");
}

#[tokio::test(start_paused = true)]
async fn a_node_reboot_drains_before_the_restart_and_uncordons_once_ready() {
    let rig = rig_with(
        node(ME, false, None),
        vec![pod("default", "web"), daemonset_pod("kube-system", "proxy")],
    );
    rig.api.put_op(&op("op", "NodeReboot", ME));
    let (r, seen) = observing(&rig);
    let out = rig.reconcile_with(&r, "op").await.unwrap();
    assert_eq!(
        finished(&out),
        &OperationResult::complete("NodeReboot completed: drained 1 pod(s)")
    );
    // Cordoned by this operation, the Deployment's pod evicted (the DaemonSet's left) before
    // the machine restarted.
    assert_eq!(
        *seen.lock().unwrap(),
        ["NodeReboot: cordoned true by uid-op, pods [\"proxy\"]"]
    );
    // Schedulable again once Ready, the annotation gone.
    assert_eq!(rig.drain.cordon(), (false, None));
    assert!(rig.drain.calls().contains(&"evict default/web".to_string()));
    // Each step is an Event on the Node and on the MachineOperation (`kubectl describe`).
    assert!(rig.drain.holder(ME).is_none(), "the slot is freed");
    assert_eq!(
        rig.drain.events(),
        [
            "Node/node1 Normal DisruptionSlotAcquired: took one of 1 disruption slot(s) for MachineOperation op (NodeReboot)",
            "MachineOperation/op Normal DisruptionSlotAcquired: took one of 1 disruption slot(s) for MachineOperation op (NodeReboot)",
            "Node/node1 Normal Cordoned: cordoned by aks-flex-node for MachineOperation op (NodeReboot)",
            "MachineOperation/op Normal Cordoned: cordoned by aks-flex-node for MachineOperation op (NodeReboot)",
            "Node/node1 Normal Drained: evicted 1 pod(s) for MachineOperation op (NodeReboot)",
            "MachineOperation/op Normal Drained: evicted 1 pod(s) for MachineOperation op (NodeReboot)",
            "Node/node1 Normal Uncordoned: uncordoned by aks-flex-node (its cordon for uid-op)",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_budget_that_allows_no_disruption_fails_the_operation_and_nothing_restarts() {
    let rig = rig_with(node(ME, false, None), vec![pod("default", "web")]);
    rig.drain.state().blocked.insert(
        "web".into(),
        "The disruption budget web-pdb needs 1 healthy pods and has 1 currently".into(),
    );
    rig.api.put_op(&with_params(
        op("op", "NodeReboot", ME),
        &[("drainTimeout", "3s")],
    ));
    let out = rig.reconcile("op").await.unwrap();
    let r = finished(&out);
    assert_eq!(r.reason, "DrainTimedOut");
    assert_eq!(
        r.message,
        "NodeReboot not run: drain timed out after 3s with 1 pod(s) left (default/web); last \
         refusal: The disruption budget web-pdb needs 1 healthy pods and has 1 currently; the \
         node is uncordoned"
    );
    assert!(rig.handlers.calls().is_empty(), "never rebooted");
    assert_eq!(rig.drain.cordon(), (false, None));
    assert!(rig.drain.holder(ME).is_none(), "the slot is freed");
    assert_eq!(
        rig.records().load("uid-op").unwrap().unwrap().stage,
        Stage::Finished
    );
}

#[tokio::test(start_paused = true)]
async fn an_administrators_cordon_survives_the_operation() {
    let rig = rig_with(node(ME, true, None), vec![pod("default", "web")]);
    rig.api.put_op(&op("op", "NodeReboot", ME));
    let (r, seen) = observing(&rig);
    let out = rig.reconcile_with(&r, "op").await.unwrap();
    assert!(finished(&out).succeeded());
    assert_eq!(
        *seen.lock().unwrap(),
        ["NodeReboot: cordoned true by , pods []"]
    );
    assert_eq!(rig.drain.cordon(), (true, None));
    assert!(
        !rig.drain
            .calls()
            .iter()
            .any(|c| c.starts_with("set_cordon"))
    );
}

// Real time: the wait for Ready polls with `flex_host::retry::wait_until` (300 ms here).
#[tokio::test]
async fn a_node_not_ready_after_the_reboot_stays_cordoned_and_the_operation_says_so() {
    let mut n = node(ME, false, None);
    n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
    let rig = rig_with(n, vec![]);
    rig.api.put_op(&op("op", "NodeReboot", ME));
    let out = rig.reconcile("op").await.unwrap();
    let r = finished(&out);
    assert_eq!(r.reason, "NodeNotReady");
    assert!(
        r.message.starts_with("the active machine restarted, but the Node to report Ready after the reboot: not reached"),
        "{}",
        r.message
    );
    assert!(
        r.message.ends_with("the node stays cordoned"),
        "{}",
        r.message
    );
    assert_eq!(rig.handlers.calls(), ["node_reboot"]);
    assert_eq!(rig.drain.cordon(), (true, Some("uid-op".into())));
    // Its slot is kept for good: the rollout stops here until someone looks.
    assert!(rig.drain.holder(ME).unwrap().stuck);
}

#[tokio::test(start_paused = true)]
async fn a_completed_agent_reset_leaves_the_node_cordoned() {
    let rig = rig_with(node(ME, false, None), vec![pod("default", "web")]);
    rig.api.put_op(&op("op", "AgentReset", ME));
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(
        finished(&out),
        &OperationResult::complete("AgentReset completed: drained 1 pod(s)")
    );
    assert!(out.stop_daemon);
    assert_eq!(rig.drain.cordon(), (true, Some("uid-op".into())));
}

#[tokio::test(start_paused = true)]
async fn a_drain_cut_short_by_a_restart_drains_again_then_runs() {
    // The daemon died mid-drain: the record is still `claiming`, the cordon is this
    // operation's, one pod is left.
    let rig = rig_with(node(ME, true, Some("uid-op")), vec![pod("default", "db")]);
    rig.api.put_op(&with_status(
        op("op", "NodeReboot", ME),
        "InProgress",
        Some(NOW - 30),
        None,
    ));
    seed(&rig, Stage::Claiming, "2027-01-15T07:59:30Z", None);
    let (r, seen) = observing(&rig);
    let out = rig.reconcile_with(&r, "op").await.unwrap();
    assert!(finished(&out).succeeded());
    assert_eq!(
        *seen.lock().unwrap(),
        ["NodeReboot: cordoned true by uid-op, pods []"]
    );
    assert!(
        !rig.drain
            .calls()
            .iter()
            .any(|c| c.starts_with("set_cordon true"))
    );
    assert_eq!(rig.drain.cordon(), (false, None));
}

#[tokio::test(start_paused = true)]
async fn a_reboot_cut_short_by_a_restart_is_interrupted_and_its_cordon_lifted_once_ready() {
    let rig = rig_with(node(ME, true, Some("uid-op")), vec![]);
    rig.api.put_op(&with_status(
        op("op", "NodeReboot", ME),
        "InProgress",
        Some(NOW - 300),
        None,
    ));
    seed(&rig, Stage::Executing, "2027-01-15T07:55:00Z", None);
    rig.drain
        .state()
        .budget
        .as_mut()
        .unwrap()
        .1
        .insert(format!("holder.{ME}"), fresh_holder("uid-op"));
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(finished(&out).reason, "Interrupted");
    assert!(rig.handlers.calls().is_empty());
    assert_eq!(rig.drain.cordon(), (false, None));
    assert!(rig.drain.holder(ME).is_none(), "its slot freed too");
}

#[tokio::test(start_paused = true)]
async fn a_reboot_cut_short_on_a_node_not_ready_keeps_its_cordon_and_its_slot() {
    let mut n = node(ME, true, Some("uid-op"));
    n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
    let rig = rig_with(n, vec![]);
    rig.api.put_op(&with_status(
        op("op", "NodeReboot", ME),
        "InProgress",
        Some(NOW - 300),
        None,
    ));
    seed(&rig, Stage::Executing, "2027-01-15T07:55:00Z", None);
    rig.drain
        .state()
        .budget
        .as_mut()
        .unwrap()
        .1
        .insert(format!("holder.{ME}"), fresh_holder("uid-op"));
    let out = rig.reconcile("op").await.unwrap();
    assert_eq!(finished(&out).reason, "Interrupted");
    assert_eq!(rig.drain.cordon(), (true, Some("uid-op".into())));
    assert!(
        rig.drain.holder(ME).unwrap().stuck,
        "kept for good, not left to lapse"
    );
}

#[tokio::test]
async fn an_agent_upgrade_neither_cordons_nor_drains() {
    let rig = rig_with(node(ME, false, None), vec![pod("default", "web")]);
    rig.api.put_op(&with_params(
        op("op", "AgentUpgrade", ME),
        &[
            ("downloadURL", "https://example.com/agent.tar.gz"),
            ("sha256", &"a".repeat(64)),
        ],
    ));
    rig.reconcile("op").await.unwrap();
    assert!(rig.drain.calls().is_empty());
}

/// The budget's half of the drain's adapter over a kube client
/// ([`crate::flows::drain::KubeNodeDrain`]) against the fake API server: the ConfigMap read, a
/// merge patch of the keys alone under its resourceVersion, a stale one answered 409.
#[tokio::test]
async fn the_kube_adapter_reads_and_patches_the_disruption_budget_under_its_resource_version() {
    use crate::flows::drain::{KubeNodeDrain, NodeDrainApi};
    let api = FakeApi::new();
    let k = KubeNodeDrain::new(api.client(), ME);
    // Absent: None (the operation then runs without a budget).
    assert_eq!(k.budget().await.unwrap(), None);
    api.state().configmaps.insert(
        "kube-system/aks-flex-node-disruption".into(),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "aks-flex-node-disruption", "namespace": "kube-system",
                            "resourceVersion": "7", "labels": {"app": "x"}},
               "data": {"maxUnavailable": "1", "holder.node2": "{}"}}),
    );
    let (rv, data) = k.budget().await.unwrap().unwrap();
    assert_eq!(rv, "7");
    assert_eq!(data["maxUnavailable"], "1");
    let set: flex_api::budget::Changes = [
        (
            format!("holder.{ME}"),
            Some("{\"owner\":\"op\"}".to_string()),
        ),
        ("holder.node2".to_string(), None),
    ]
    .into();
    k.set_budget("7", &set).await.unwrap();
    let seen = api.state().seen.last().unwrap().clone();
    assert_eq!(seen.method, http::Method::PATCH);
    assert_eq!(
        seen.path,
        "/api/v1/namespaces/kube-system/configmaps/aks-flex-node-disruption"
    );
    // A merge patch of the keys alone, with the precondition; null removes a key.
    assert_eq!(
        seen.body,
        json!({"metadata": {"resourceVersion": "7"},
               "data": {format!("holder.{ME}"): "{\"owner\":\"op\"}", "holder.node2": null}})
    );
    let cm = api.state().configmaps["kube-system/aks-flex-node-disruption"].clone();
    assert_eq!(
        cm["data"],
        json!({"maxUnavailable": "1", format!("holder.{ME}"): "{\"owner\":\"op\"}"})
    );
    assert_eq!(
        cm["metadata"]["labels"]["app"], "x",
        "the rest is left alone"
    );
    // The same resourceVersion again: 409, read as a conflict.
    let e = k.set_budget("7", &set).await.unwrap_err();
    assert!(e.conflict && !e.permanent, "{e:?}");
}

/// The drain's adapter over a kube client ([`crate::flows::drain::KubeNodeDrain`]) against the
/// fake API server: the requests it makes (a field-selected pod list, evictions with the pod's
/// UID as precondition, a merge patch of the Node carrying its resourceVersion) and how it reads
/// the answers (a PodDisruptionBudget's 429 with its cause, a 403, a 404).
#[tokio::test(start_paused = true)]
async fn the_kube_adapter_drains_through_the_eviction_api() {
    use crate::flows::drain::{
        CORDONED_BY, DrainPolicy, DrainTimings, Eviction, KubeNodeDrain, NodeDrainApi, PodRef,
        cordon_and_drain, release,
    };
    let api = FakeApi::new();
    api.put_node(ME, &[]);
    api.state().nodes.get_mut(ME).unwrap()["metadata"]["resourceVersion"] = json!("1");
    let pod = |name: &str, node: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"namespace": "default", "name": name, "uid": format!("uid-{name}")},
               "spec": {"nodeName": node, "containers": []}, "status": {"phase": "Running"}})
    };
    api.state().pods = vec![pod("web", ME), pod("elsewhere", "node2")];
    let pdb = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "reason": "TooManyRequests", "code": 429,
        "details": {"causes": [{"reason": "DisruptionBudget",
            "message": "The disruption budget web-pdb needs 1 healthy pods and has 1 currently"}]}});
    api.state().evictions.insert(
        "web".into(),
        vec![(http::StatusCode::TOO_MANY_REQUESTS, pdb)],
    );
    let k = KubeNodeDrain::new(api.client(), ME);

    // One budget refusal, then the eviction goes through; the other node's pod is not touched.
    let subject = crate::flows::drain::Subject {
        owner: "uid-op".into(),
        what: "MachineOperation op (NodeReboot)".into(),
        related: None,
    };
    let d = cordon_and_drain(
        &k,
        ME,
        &subject,
        DrainPolicy::default(),
        DrainTimings::default(),
    )
    .await
    .unwrap();
    assert_eq!(d.evicted, 1);
    let lines = api.lines();
    let events = "POST /api/v1/namespaces/default/events".to_string();
    assert_eq!(
        lines,
        [
            format!("GET /api/v1/nodes/{ME}"),
            format!("PATCH /api/v1/nodes/{ME}"),
            events.clone(),
            "GET /api/v1/pods".into(),
            "POST /api/v1/namespaces/default/pods/web/eviction".into(),
            events.clone(),
            "GET /api/v1/pods".into(),
            "POST /api/v1/namespaces/default/pods/web/eviction".into(),
            "GET /api/v1/pods".into(),
            events.clone(),
        ]
    );
    let seen = api.state().seen.clone();
    // core/v1 Events on the Node, as `kubectl describe node` lists them.
    let reasons: Vec<(String, String, String)> = api
        .state()
        .events
        .iter()
        .map(|e| {
            (
                e["involvedObject"]["kind"].as_str().unwrap().to_string(),
                e["type"].as_str().unwrap().to_string(),
                e["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        [
            ("Node".into(), "Normal".into(), "Cordoned".into()),
            ("Node".into(), "Warning".into(), "EvictionBlocked".into()),
            ("Node".into(), "Normal".into(), "Drained".into()),
        ]
    );
    assert_eq!(
        api.state().events[0]["source"]["component"],
        "aks-flex-node"
    );
    assert_eq!(api.state().events[0]["involvedObject"]["name"], ME);
    assert_eq!(seen[1].body["spec"]["unschedulable"], true);
    assert_eq!(
        seen[1].body["metadata"]["annotations"][CORDONED_BY],
        "uid-op"
    );
    assert_eq!(seen[1].body["metadata"]["resourceVersion"], "1");
    assert!(
        seen[3]
            .query
            .split('&')
            .any(|kv| kv == format!("fieldSelector=spec.nodeName={ME}"))
    );
    assert_eq!(seen[4].body["kind"], "Eviction");
    assert_eq!(
        seen[4].body["deleteOptions"]["preconditions"]["uid"],
        "uid-web"
    );
    assert_eq!(api.state().pods.len(), 1, "the other node's pod stays");

    // Release: unschedulable false, the annotation removed (null in the merge patch).
    release(&k, ME, Some("uid-op")).await.unwrap();
    let node = api.state().nodes[ME].clone();
    assert_eq!(node["spec"]["unschedulable"], false);
    assert!(node["metadata"]["annotations"].get(CORDONED_BY).is_none());
    assert_eq!(
        api.state().events.last().unwrap()["reason"],
        "Uncordoned",
        "the release is recorded too"
    );

    // Answers read: a PDB's 429 names the budget, 403 is for good, 404 is gone.
    let web = PodRef {
        namespace: "default".into(),
        name: "web".into(),
        uid: "uid-web".into(),
    };
    let forbidden = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "pods \"web\" is forbidden", "reason": "Forbidden", "code": 403});
    api.state()
        .evictions
        .insert("web".into(), vec![(http::StatusCode::FORBIDDEN, forbidden)]);
    assert_eq!(
        k.evict(&web).await,
        Eviction::Refused("403: pods \"web\" is forbidden".into())
    );
    assert_eq!(k.evict(&web).await, Eviction::Gone);
}
