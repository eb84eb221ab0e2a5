//! The agent's state on its Node ([`flex_api::node_state`]): the daemon feeds a [`Reporter`]
//! what it does, and the reporter writes the Node's `AKSFlexNodeAgent` condition and
//! `aks-flex-node.azure.com/*` annotations through a [`NodeStatePublisher`] when what they
//! say changed. [`KubeNodeState`] is the real publisher: a strategic-merge patch of the Node's
//! status (merged by condition type, so kubelet's own conditions stay) and a merge patch of its
//! annotations — both allowed to the daemon's `system:node:<node>` identity on its own Node
//! only (the Node authorizer and NodeRestriction).
//!
//! Publishing is best effort: a failure is logged and retried at the next change or item; it
//! never fails the daemon's work.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};

use crate::kubeclient::{KubeClients, describe};
use crate::state::DaemonState;
use flex_api::node_state::{AgentState, CONDITION_TYPE, Event, NodeAgentStatus, Tracker};

/// Writes the agent's state to its Node.
#[async_trait]
pub trait NodeStatePublisher: Send + Sync {
    /// Writes `status`; `transitioned_at` is when its condition status last changed.
    async fn publish(
        &self,
        status: &NodeAgentStatus,
        transitioned_at: Timestamp,
    ) -> anyhow::Result<()>;
}

/// [`NodeStatePublisher`] over the daemon's Kubernetes client, for the Node `node`.
pub struct KubeNodeState {
    kube: KubeClients,
    node: String,
}

impl KubeNodeState {
    /// The publisher for `node`.
    pub fn new(kube: KubeClients, node: &str) -> Self {
        Self {
            kube,
            node: node.to_string(),
        }
    }
}

/// The condition `status` puts on the Node.
pub fn condition(
    status: &NodeAgentStatus,
    now: Timestamp,
    transitioned_at: Timestamp,
) -> NodeCondition {
    NodeCondition {
        type_: CONDITION_TYPE.to_string(),
        status: status.state.condition_status().to_string(),
        reason: Some(status.reason.to_string()),
        message: Some(status.message.clone()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(Time(transitioned_at)),
    }
}

#[async_trait]
impl NodeStatePublisher for KubeNodeState {
    async fn publish(
        &self,
        status: &NodeAgentStatus,
        transitioned_at: Timestamp,
    ) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(self.kube.current());
        let params = PatchParams::default();
        let cond = condition(status, Timestamp::now(), transitioned_at);
        let body = serde_json::json!({ "status": { "conditions": [cond] } });
        nodes
            .patch_status(&self.node, &params, &Patch::Strategic(body))
            .await
            .map_err(|e| anyhow::anyhow!("patch node {} status: {}", self.node, describe(&e)))?;
        let annotations: serde_json::Map<String, serde_json::Value> = status
            .annotations()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.map_or(serde_json::Value::Null, Into::into)))
            .collect();
        let body = serde_json::json!({ "metadata": { "annotations": annotations } });
        nodes
            .patch(&self.node, &params, &Patch::Merge(body))
            .await
            .map_err(|e| {
                anyhow::anyhow!("patch node {} annotations: {}", self.node, describe(&e))
            })?;
        Ok(())
    }
}

/// The daemon's side: a [`Tracker`] and a publisher.
pub struct Reporter {
    publisher: Arc<dyn NodeStatePublisher>,
    inner: Mutex<Inner>,
}

struct Inner {
    tracker: Tracker,
    /// The condition status last published, and since when.
    transition: Option<(AgentState, Timestamp)>,
    /// The uid of the Node last seen.
    node_uid: Option<String>,
}

impl Reporter {
    /// A reporter for the agent `agent_version` writing through `publisher`.
    pub fn new(publisher: Arc<dyn NodeStatePublisher>, agent_version: &str) -> Self {
        Self {
            publisher,
            inner: Mutex::new(Inner {
                tracker: Tracker::new(agent_version),
                transition: None,
                node_uid: None,
            }),
        }
    }

    /// The daemon read its Node (`None`: there is none): a Node with another uid than the last
    /// one seen is a new object (a repave's kubelet registered it) that has not seen the state,
    /// so the state is written again at the next event.
    pub fn node_seen(&self, uid: Option<&str>) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.node_uid.as_deref() != uid {
            inner.node_uid = uid.map(str::to_string);
            inner.tracker.republish();
        }
    }

    /// Takes `event` with the daemon state as it stands and publishes what changed.
    pub async fn observe(&self, event: Event, state: Option<&DaemonState>) {
        let active = state
            .map(|s| s.active_machine.as_str())
            .filter(|s| !s.is_empty());
        let goal = state
            .map(|s| s.applied_settings_version.as_str())
            .filter(|s| !s.is_empty());
        let next = {
            // A poisoned lock only means a panic elsewhere mid-update; the tracker's data is
            // still whole (each update is one assignment), so carry on with it.
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            inner.tracker.observe(&event, active, goal);
            inner.tracker.take_changed().map(|s| {
                let at = match inner.transition {
                    Some((state, at)) if state == s.state => at,
                    _ => Timestamp::now(),
                };
                inner.transition = Some((s.state, at));
                (s, at)
            })
        };
        let Some((status, at)) = next else {
            return;
        };
        match self.publisher.publish(&status, at).await {
            Ok(()) => tracing::info!(
                state = status.state.as_str(),
                reason = status.reason,
                "node agent state published"
            ),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), state = status.state.as_str(), "could not publish the agent's state on its Node; retrying at the next change");
                let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                inner.tracker.republish();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubeclient::mock::{Reply, seen, serve};
    use flex_api::node_state::{ANNOTATION_GOAL_VERSION, ANNOTATION_STATE, Event, Tracker};
    use serde_json::{Value, json};

    fn degraded() -> NodeAgentStatus {
        let mut t = Tracker::new("0.3.0");
        t.observe(
            &Event::Failed {
                permanent: true,
                message: "machine goal rejected: unknown Kubernetes version".into(),
            },
            Some("kube2"),
            None,
        );
        t.current().cloned().unwrap()
    }

    /// Real: the kube client and [`KubeNodeState`]. Faked: the API server (records each
    /// request). The condition goes to the Node's status subresource as a strategic-merge
    /// patch (merged by type: kubelet's own conditions stay), the annotations to the Node as a
    /// merge patch that removes what is unknown; only this node's object is written.
    #[tokio::test]
    async fn publishes_the_condition_to_status_and_the_annotations_to_the_node() {
        let (client, log, _server) = serve(|_| {
            Reply::Json(
                200,
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "flex-node-1"}}),
            )
        });
        let p = KubeNodeState::new(KubeClients::fixed(client), "flex-node-1");
        let since = Timestamp::from_second(1_700_000_000).unwrap();
        p.publish(&degraded(), since).await.unwrap();
        let seen = seen(&log);
        assert_eq!(seen.len(), 2, "{seen:?}");

        assert_eq!(
            (seen[0].method.as_str(), seen[0].path()),
            ("PATCH", "/api/v1/nodes/flex-node-1/status")
        );
        assert_eq!(
            seen[0].content_type,
            "application/strategic-merge-patch+json"
        );
        let body: Value = serde_json::from_slice(&seen[0].body).unwrap();
        let conds = body["status"]["conditions"].as_array().unwrap();
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0]["type"], "AKSFlexNodeAgent");
        assert_eq!(conds[0]["status"], "False");
        assert_eq!(conds[0]["reason"], "ReconcileFailed");
        assert!(
            conds[0]["message"].as_str().unwrap().starts_with(
                "Degraded: not retried until its input changes: machine goal rejected"
            ),
            "{}",
            conds[0]["message"]
        );
        assert_eq!(conds[0]["lastTransitionTime"], "2023-11-14T22:13:20Z");
        assert!(conds[0]["lastHeartbeatTime"].is_string());

        assert_eq!(
            (seen[1].method.as_str(), seen[1].path()),
            ("PATCH", "/api/v1/nodes/flex-node-1")
        );
        assert_eq!(seen[1].content_type, "application/merge-patch+json");
        let body: Value = serde_json::from_slice(&seen[1].body).unwrap();
        let ann = &body["metadata"]["annotations"];
        assert_eq!(ann[ANNOTATION_STATE], "Degraded");
        assert_eq!(ann["aks-flex-node.azure.com/active-machine"], "kube2");
        assert_eq!(ann["aks-flex-node.azure.com/agent-version"], "0.3.0");
        assert!(ann[ANNOTATION_GOAL_VERSION].is_null(), "removed: {ann}");
        assert_eq!(ann.as_object().unwrap().len(), 4, "{ann}");
    }

    /// Real: [`KubeNodeState`]. Faked: the API server, which refuses the status write (as
    /// NodeRestriction refuses another node's object). The error names the node and the answer.
    #[tokio::test]
    async fn a_refused_write_names_the_node_and_the_answer() {
        let (client, _log, _server) = serve(|_| {
            Reply::status(
                403,
                "Forbidden",
                "node \"flex-node-1\" is not allowed to modify node \"other\"",
            )
        });
        let p = KubeNodeState::new(KubeClients::fixed(client), "flex-node-1");
        let e = p.publish(&degraded(), Timestamp::now()).await.unwrap_err();
        let m = format!("{e:#}");
        assert!(m.contains("patch node flex-node-1 status"), "{m}");
        assert!(m.contains("403"), "{m}");
    }

    /// Records the states written.
    #[derive(Default)]
    struct Recorder(std::sync::Mutex<Vec<String>>);

    #[async_trait]
    impl NodeStatePublisher for Recorder {
        async fn publish(&self, s: &NodeAgentStatus, _at: Timestamp) -> anyhow::Result<()> {
            self.0.lock().unwrap().push(s.state.as_str().to_string());
            Ok(())
        }
    }

    /// Real: [`Reporter`] and its tracker. Faked: the Node writer (records). A Node with a new
    /// uid (a repave registered it) gets the state written again; the same Node does not.
    #[tokio::test]
    async fn a_new_node_object_gets_the_state_again() {
        let rec = Arc::new(Recorder::default());
        let r = Reporter::new(rec.clone(), "0.3.0");
        r.node_seen(Some("uid-1"));
        r.observe(Event::Succeeded, None).await;
        r.node_seen(Some("uid-1"));
        r.observe(Event::Succeeded, None).await;
        assert_eq!(*rec.0.lock().unwrap(), ["Done"]);
        r.node_seen(Some("uid-2"));
        r.observe(Event::Succeeded, None).await;
        assert_eq!(*rec.0.lock().unwrap(), ["Done", "Done"]);
    }
}
