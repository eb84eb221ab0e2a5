//! Cordon and drain before a disruptive operation, and the uncordon after it.
//!
//! The decisions are `flex_api::drain`'s (which pods, what an eviction's answer means, whose
//! cordon it is); this module carries them out over [`NodeDrainApi`], the narrow seam to the
//! Kubernetes API (real: [`KubeNodeDrain`]; fake: `FakeNodeDrain`, test code only):
//!
//! - [`cordon_and_drain`]: marks the Node unschedulable with [`CORDONED_BY`] naming the
//!   operation (unless an administrator's cordon is already there), then evicts the node's pods
//!   through the Eviction API until none is left to evict or wait for, or the drain timeout
//!   passes. A PodDisruptionBudget's refusal (429) and an unreachable API server are tried again,
//!   with [`flex_host::retry::Backoff`]; a refusal for good (403) ends the drain.
//! - [`wait_ready`]: after a NodeReboot, waits for the Node's `Ready` condition with a heartbeat
//!   newer than the reboot.
//! - [`release`]: lifts the cordon only when [`CORDONED_BY`] names this agent's operation.
//! - [`progress`]: each step told to the Node is also kept on the host as the last drain step,
//!   which `aks-flex-node status` shows.
//!
//! The drain runs while the operation's record is `claiming` (before `executing`), so a daemon
//! that dies mid-drain drains again when it restarts: the cordon it finds is its own
//! (`Cordon::Ours`), the pods already evicted are terminating or gone.

pub mod budget;
#[cfg(test)]
pub(crate) mod fakes;
pub mod progress;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::flows::repave::{Journal, SwitchGuard};
use crate::kubeclient::{KubeClients, describe};
use crate::machine::seams::SeamError;
pub use flex_api::drain::{
    CORDONED_BY, Cordon, DrainPolicy, DrainRequest, Eviction, OnTimeout, PodRef, Release,
    classify_eviction, cordon_plan, plan, ready, release_plan,
};
use flex_host::retry::Backoff;

/// A failed call to the API server.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{action}: {cause}")]
pub struct DrainApiError {
    /// What was asked (`"get node n1"`).
    pub action: String,
    /// The answer, in one line.
    pub cause: String,
    /// Whether asking again cannot help (403, 400, 422): the drain ends.
    pub permanent: bool,
    /// A write refused because the object changed since it was read (409).
    pub conflict: bool,
}

impl DrainApiError {
    fn from_kube(action: String, e: &kube::Error) -> Self {
        let code = match e {
            kube::Error::Api(s) => Some(s.code),
            _ => None,
        };
        Self {
            action,
            cause: describe(e),
            permanent: matches!(code, Some(400 | 401 | 403 | 422)),
            conflict: code == Some(409),
        }
    }
}

/// The Kubernetes calls a drain makes, for one node.
#[async_trait]
pub trait NodeDrainApi: Send + Sync {
    /// The Node (`None` when it does not exist).
    async fn node(&self) -> Result<Option<Node>, DrainApiError>;
    /// Sets `spec.unschedulable` and the [`CORDONED_BY`] annotation (`None` removes it), as one
    /// merge patch that fails with a conflict if the Node changed since `resource_version`.
    async fn set_cordon(
        &self,
        resource_version: &str,
        unschedulable: bool,
        cordoned_by: Option<&str>,
    ) -> Result<(), DrainApiError>;
    /// The pods bound to the node (field selector `spec.nodeName`).
    async fn pods(&self) -> Result<Vec<Pod>, DrainApiError>;
    /// Asks the Eviction API to evict `pod` (its UID a precondition); the answer classified.
    async fn evict(&self, pod: &PodRef) -> Eviction;
    /// Records a Kubernetes Event about `regarding` (a `Warning` when `warning`); a failure is
    /// logged, never passed on: an Event is for people, the drain does not depend on it.
    async fn event(&self, regarding: &ObjectReference, warning: bool, reason: &str, note: &str);
    /// The disruption budget's ConfigMap ([`flex_api::budget`]): its `resourceVersion` and
    /// data; `None` when it does not exist.
    async fn budget(&self) -> Result<Option<(String, flex_api::budget::Data)>, DrainApiError>;
    /// Changes the budget's data (a merge patch of the keys given), failing with a conflict if
    /// the ConfigMap changed since `resource_version`.
    async fn set_budget(
        &self,
        resource_version: &str,
        changes: &flex_api::budget::Changes,
    ) -> Result<(), DrainApiError>;
}

/// What a drain is for: the owner its cordon records ([`CORDONED_BY`]), the work in words for
/// Events and logs, and the object Events are also recorded on (the MachineOperation).
#[derive(Clone, Debug, PartialEq)]
pub struct Subject {
    /// The cordon's owner: the operation's UID, `repave/<settings version>`, `node-deletion`.
    pub owner: String,
    /// The work, in words (`MachineOperation reboot-1 (NodeReboot)`).
    pub what: String,
    /// Events about the drain are also recorded on this object.
    pub related: Option<ObjectReference>,
}

/// The reasons of the Events a drain records.
pub mod reasons {
    /// The Node was marked unschedulable.
    pub const CORDONED: &str = "Cordoned";
    /// The Node was already unschedulable, not by this agent: it stays so.
    pub const CORDON_KEPT: &str = "CordonKept";
    /// Every pod to evict is gone.
    pub const DRAINED: &str = "Drained";
    /// A PodDisruptionBudget refused an eviction (once per pod and drain).
    pub const EVICTION_BLOCKED: &str = "EvictionBlocked";
    /// The drain timed out.
    pub const DRAIN_TIMED_OUT: &str = "DrainTimedOut";
    /// The drain could not be carried out.
    pub const DRAIN_FAILED: &str = "DrainFailed";
    /// The cordon was lifted.
    pub const UNCORDONED: &str = "Uncordoned";
}

/// A Node by name alone, as Events name it when it could not be read.
fn named_node(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.into()),
        ..ObjectReference::default()
    }
}

/// The Node as Events name it.
fn node_ref(node: &Node) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: node.metadata.name.clone(),
        uid: node.metadata.uid.clone(),
        ..ObjectReference::default()
    }
}

/// Records an Event on the Node and on the subject's related object.
pub(crate) async fn tell(
    api: &dyn NodeDrainApi,
    node: &ObjectReference,
    subject: &Subject,
    warning: bool,
    reason: &str,
    note: &str,
) {
    api.event(node, warning, reason, note).await;
    if let Some(r) = &subject.related {
        api.event(r, warning, reason, note).await;
    }
}

/// [`NodeDrainApi`] over a kube client, for node `node`. With the daemon's identity
/// (`system:node:<node>`), the Node authorizer and NodeRestriction confine every call to this
/// node and the pods bound to it.
pub struct KubeNodeDrain {
    client: Client,
    node: String,
}

impl KubeNodeDrain {
    /// Calls for `node` through `client`.
    pub fn new(client: Client, node: &str) -> Self {
        Self {
            client,
            node: node.to_string(),
        }
    }
}

#[async_trait]
impl NodeDrainApi for KubeNodeDrain {
    async fn node(&self) -> Result<Option<Node>, DrainApiError> {
        Api::<Node>::all(self.client.clone())
            .get_opt(&self.node)
            .await
            .map_err(|e| DrainApiError::from_kube(format!("get node {}", self.node), &e))
    }

    async fn set_cordon(
        &self,
        resource_version: &str,
        unschedulable: bool,
        cordoned_by: Option<&str>,
    ) -> Result<(), DrainApiError> {
        let body = json!({
            "metadata": {
                "resourceVersion": resource_version,
                "annotations": {CORDONED_BY: cordoned_by},
            },
            "spec": {"unschedulable": unschedulable},
        });
        let what = if unschedulable { "cordon" } else { "uncordon" };
        Api::<Node>::all(self.client.clone())
            .patch(&self.node, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map(|_| ())
            .map_err(|e| DrainApiError::from_kube(format!("{what} node {}", self.node), &e))
    }

    async fn pods(&self) -> Result<Vec<Pod>, DrainApiError> {
        // Read as the drain's few fields rather than as `Pod`: the full type's deserializer
        // (every field of a PodSpec) is hundreds of kilobytes of the agent's image, which has a
        // size budget, for fields the drain never reads.
        let action = || format!("list pods on {}", self.node);
        let lp = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        let req = kube::core::Request::new("/api/v1/pods")
            .list(&lp)
            .map_err(|e| DrainApiError {
                action: action(),
                cause: e.to_string(),
                permanent: true,
                conflict: false,
            })?;
        self.client
            .request::<DrainPodList>(req)
            .await
            .map(|l| l.items.into_iter().map(DrainPod::into_pod).collect())
            .map_err(|e| DrainApiError::from_kube(action(), &e))
    }

    async fn evict(&self, pod: &PodRef) -> Eviction {
        // Built here rather than with `Api::evict`: kube 5 sends the delete options as
        // `delete_options`, which the API server ignores, so the UID precondition would be lost.
        let mut body = json!({
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
        });
        if !pod.uid.is_empty() {
            body["deleteOptions"] = json!({"preconditions": {"uid": pod.uid}});
        }
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}/eviction",
            pod.namespace, pod.name
        );
        let req = match serde_json::to_vec(&body)
            .map_err(|e| e.to_string())
            .and_then(|b| {
                http::Request::post(path)
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(b)
                    .map_err(|e| e.to_string())
            }) {
            Ok(r) => r,
            Err(e) => return Eviction::Refused(format!("eviction request for {pod}: {e}")),
        };
        match self.client.request::<kube::core::Status>(req).await {
            Ok(_) => Eviction::Accepted,
            Err(kube::Error::Api(s)) => {
                let causes: Vec<(String, String)> = s
                    .details
                    .as_ref()
                    .map(|d| {
                        d.causes
                            .iter()
                            .map(|c| (c.reason.clone(), c.message.clone()))
                            .collect()
                    })
                    .unwrap_or_default();
                classify_eviction(s.code, &s.message, &causes)
            }
            Err(e) => Eviction::Retry(describe(&e)),
        }
    }

    async fn event(&self, regarding: &ObjectReference, warning: bool, reason: &str, note: &str) {
        // A core/v1 Event, which a node may create (the Node authorizer's rules); the
        // events.k8s.io API would need a role of its own.
        let now = Timestamp::now();
        let base = regarding.name.as_deref().unwrap_or("aks-flex-node");
        let ns = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let ev = CoreEvent {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{base}.{:x}", now.as_nanosecond())),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            involved_object: regarding.clone(),
            reason: Some(reason.to_string()),
            message: Some(note.to_string()),
            type_: Some(if warning { "Warning" } else { "Normal" }.to_string()),
            source: Some(k8s_openapi::api::core::v1::EventSource {
                component: Some(EVENT_COMPONENT.into()),
                host: Some(self.node.clone()),
            }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            reporting_component: Some(EVENT_COMPONENT.into()),
            reporting_instance: Some(self.node.clone()),
            ..Default::default()
        };
        // Posted, its answer not read back as an `Event` (that type's deserializer would be
        // image size for nothing).
        let posted = serde_json::to_vec(&ev)
            .map_err(|e| e.to_string())
            .and_then(|body| {
                kube::core::Request::new(format!("/api/v1/namespaces/{ns}/events"))
                    .create(&PostParams::default(), body)
                    .map_err(|e| e.to_string())
            });
        let result = match posted {
            Ok(req) => self
                .client
                .request::<serde::de::IgnoredAny>(req)
                .await
                .map(|_| ())
                .map_err(|e| describe(&e)),
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            tracing::warn!(reason, error = %e, "could not record an Event");
        }
    }

    async fn budget(&self) -> Result<Option<(String, flex_api::budget::Data)>, DrainApiError> {
        use flex_api::budget::{CONFIGMAP, NAMESPACE};
        Api::<ConfigMap>::namespaced(self.client.clone(), NAMESPACE)
            .get_opt(CONFIGMAP)
            .await
            .map(|cm| {
                cm.map(|cm| {
                    (
                        cm.metadata.resource_version.unwrap_or_default(),
                        cm.data.unwrap_or_default(),
                    )
                })
            })
            .map_err(|e| {
                DrainApiError::from_kube(format!("get configmap {NAMESPACE}/{CONFIGMAP}"), &e)
            })
    }

    async fn set_budget(
        &self,
        resource_version: &str,
        changes: &flex_api::budget::Changes,
    ) -> Result<(), DrainApiError> {
        use flex_api::budget::{CONFIGMAP, NAMESPACE};
        let body = json!({
            "metadata": {"resourceVersion": resource_version},
            "data": changes,
        });
        Api::<ConfigMap>::namespaced(self.client.clone(), NAMESPACE)
            .patch(CONFIGMAP, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map(|_| ())
            .map_err(|e| {
                DrainApiError::from_kube(format!("patch configmap {NAMESPACE}/{CONFIGMAP}"), &e)
            })
    }
}

/// A pod list as the drain reads it.
#[derive(serde::Deserialize)]
struct DrainPodList {
    #[serde(default)]
    items: Vec<DrainPod>,
}

/// The fields of a pod the drain reads (`flex_api::drain::plan`): its metadata (name,
/// namespace, UID, owners, the mirror annotation, deletion) and its phase.
#[derive(serde::Deserialize)]
struct DrainPod {
    #[serde(default)]
    metadata: kube::api::ObjectMeta,
    #[serde(default)]
    status: Option<DrainPodStatus>,
}

#[derive(serde::Deserialize)]
struct DrainPodStatus {
    #[serde(default)]
    phase: Option<String>,
}

impl DrainPod {
    fn into_pod(self) -> Pod {
        Pod {
            metadata: self.metadata,
            status: self.status.map(|s| k8s_openapi::api::core::v1::PodStatus {
                phase: s.phase,
                ..Default::default()
            }),
            ..Pod::default()
        }
    }
}

/// The component Events name as their source.
pub const EVENT_COMPONENT: &str = "aks-flex-node";

/// How often a drain looks again, and how long a NodeReboot waits for the Node to be Ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainTimings {
    /// Waits between rounds (pods terminating, a budget refusing, the API unreachable):
    /// `initial` doubling to `max` while nothing moves, back to `initial` when something did.
    pub backoff: Backoff,
    /// How long a NodeReboot waits for `Ready` after the restart.
    pub ready_timeout: Duration,
    /// How often it looks.
    pub ready_poll: Duration,
}

impl Default for DrainTimings {
    /// Rounds 1 s doubling to 10 s; Ready within 10 minutes, looked at every 5 s.
    fn default() -> Self {
        Self {
            backoff: Backoff::new(u32::MAX, Duration::from_secs(1), Duration::from_secs(10)),
            ready_timeout: Duration::from_secs(600),
            ready_poll: Duration::from_secs(5),
        }
    }
}

/// How a drain ended well.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Pods this drain evicted.
    pub evicted: usize,
    /// The cordon was an administrator's: it stays after the operation.
    pub cordon_theirs: bool,
    /// The timeout passed, and the policy said to proceed: what the timeout left, in words.
    pub timed_out: Option<String>,
}

impl Drained {
    /// A line for the operation's result (`None` when nothing was evicted or left).
    pub fn detail(&self) -> Option<String> {
        if let Some(t) = &self.timed_out {
            return Some(format!("{t}; proceeded as onDrainTimeout asks"));
        }
        (self.evicted > 0).then(|| format!("drained {} pod(s)", self.evicted))
    }
}

/// A drain's timeout in words: how long, what was left, the last refusal.
fn timed_out(timeout: Duration, left: Option<&[PodRef]>, blocked: Option<&str>) -> String {
    let mut s = match left {
        Some(l) => format!(
            "drain timed out after {timeout:?} with {} pod(s) left ({})",
            l.len(),
            names(l)
        ),
        None => format!("drain timed out after {timeout:?} before the node's pods could be listed"),
    };
    if let Some(b) = blocked {
        s.push_str("; last refusal: ");
        s.push_str(b);
    }
    s
}

fn names(pods: &[PodRef]) -> String {
    const SHOWN: usize = 5;
    let mut s: Vec<String> = pods.iter().take(SHOWN).map(ToString::to_string).collect();
    if pods.len() > SHOWN {
        s.push(format!("and {} more", pods.len() - SHOWN));
    }
    s.join(", ")
}

/// Why a drain did not complete. Nothing disruptive may follow.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DrainError {
    /// The timeout passed with pods left (`onDrainTimeout: Fail`).
    #[error("{}", timed_out(*timeout, left.as_deref(), blocked.as_deref()))]
    TimedOut {
        /// The drain timeout.
        timeout: Duration,
        /// The pods still there (`None`: they could never be listed).
        left: Option<Vec<PodRef>>,
        /// The last PodDisruptionBudget refusal (its message names the budget), or the last
        /// API error.
        blocked: Option<String>,
    },
    /// An eviction was refused for good.
    #[error("eviction of {pod} refused: {cause}")]
    Refused {
        /// The pod.
        pod: PodRef,
        /// The answer.
        cause: String,
    },
    /// The Node does not exist.
    #[error("node {0} does not exist")]
    NoNode(String),
    /// A call failed for good (403: the daemon's role does not allow it).
    #[error(transparent)]
    Api(DrainApiError),
}

/// Cordons the node for `subject` and evicts its pods, within `policy`'s timeout; each step is
/// an Event on the Node and on the subject's related object.
pub async fn cordon_and_drain(
    api: &dyn NodeDrainApi,
    node_name: &str,
    subject: &Subject,
    policy: DrainPolicy,
    timings: DrainTimings,
) -> Result<Drained, DrainError> {
    let start = tokio::time::Instant::now();
    let deadline = start + policy.timeout;
    let mut out = Drained::default();
    let mut attempt: u32 = 0;
    let mut last: Option<String> = None;
    // The cordon, first: until it is in place, the scheduler may put pods back.
    let node = loop {
        match cordon(api, node_name, &subject.owner).await {
            Ok((cordon, node)) => {
                out.cordon_theirs = cordon == Cordon::Theirs;
                let (reason, note) = match cordon {
                    Cordon::Theirs => (
                        reasons::CORDON_KEPT,
                        format!(
                            "already unschedulable, not by {EVENT_COMPONENT}: draining for {} without lifting it afterwards",
                            subject.what
                        ),
                    ),
                    Cordon::Ours => (
                        reasons::CORDONED,
                        format!(
                            "cordoned for {} (a drain resumed after a restart)",
                            subject.what
                        ),
                    ),
                    Cordon::Cordon | Cordon::TakeOver(_) => (
                        reasons::CORDONED,
                        format!("cordoned by {EVENT_COMPONENT} for {}", subject.what),
                    ),
                };
                tell(api, &node, subject, false, reason, &note).await;
                break node;
            }
            Err(DrainError::Api(e)) if !e.permanent => {
                tracing::warn!(node = node_name, error = %e, "cordon failed; trying again");
                last = Some(e.to_string());
            }
            Err(e) => {
                failed(api, &named_node(node_name), subject, &e).await;
                return Err(e);
            }
        }
        attempt += 1;
        if tokio::time::Instant::now() >= deadline {
            // Not even cordoned: nothing disruptive follows, whatever onDrainTimeout says.
            let e = DrainError::TimedOut {
                timeout: policy.timeout,
                left: None,
                blocked: last,
            };
            let note = format!("{e} (the Node could not be cordoned)");
            let node = named_node(node_name);
            tell(api, &node, subject, true, reasons::DRAIN_TIMED_OUT, &note).await;
            return Err(e);
        }
        sleep_until_or(deadline, timings.backoff.delay(attempt, None)).await;
    };
    attempt = 0;
    // The pods left at the last round that could list them.
    let mut left: Option<Vec<PodRef>> = None;
    let mut told_blocked: std::collections::BTreeSet<PodRef> = Default::default();
    loop {
        let moved = match round(api, &mut out, &mut last).await {
            Ok(Round::Drained) => {
                tracing::info!(node = node_name, evicted = out.evicted, "node drained");
                let note = format!("evicted {} pod(s) for {}", out.evicted, subject.what);
                tell(api, &node, subject, false, reasons::DRAINED, &note).await;
                return Ok(out);
            }
            Ok(Round::Left {
                moved,
                left: now_left,
                blocked,
            }) => {
                for (pod, why) in blocked {
                    if told_blocked.insert(pod.clone()) {
                        let note = format!("eviction of {pod} refused: {why}");
                        tell(api, &node, subject, true, reasons::EVICTION_BLOCKED, &note).await;
                    }
                }
                left = Some(now_left);
                moved
            }
            Err(DrainError::Api(e)) if !e.permanent => {
                tracing::warn!(node = node_name, error = %e, "drain: API call failed; trying again");
                last = Some(e.to_string());
                false
            }
            Err(e) => {
                failed(api, &node, subject, &e).await;
                return Err(e);
            }
        };
        if tokio::time::Instant::now() >= deadline {
            let words = timed_out(policy.timeout, left.as_deref(), last.as_deref());
            return match policy.on_timeout {
                OnTimeout::Fail => {
                    tell(api, &node, subject, true, reasons::DRAIN_TIMED_OUT, &words).await;
                    Err(DrainError::TimedOut {
                        timeout: policy.timeout,
                        left,
                        blocked: last,
                    })
                }
                OnTimeout::Proceed => {
                    tracing::warn!(node = node_name, drain = %words, "drain timed out; proceeding as onDrainTimeout asks");
                    let note = format!("{words}; proceeding as onDrainTimeout asks");
                    tell(api, &node, subject, true, reasons::DRAIN_TIMED_OUT, &note).await;
                    out.timed_out = Some(words);
                    Ok(out)
                }
            };
        }
        attempt = if moved { 1 } else { attempt + 1 };
        sleep_until_or(deadline, timings.backoff.delay(attempt, None)).await;
    }
}

async fn failed(api: &dyn NodeDrainApi, node: &ObjectReference, subject: &Subject, e: &DrainError) {
    let note = format!("drain for {} failed: {e}", subject.what);
    tell(api, node, subject, true, reasons::DRAIN_FAILED, &note).await;
}

async fn sleep_until_or(deadline: tokio::time::Instant, wait: Duration) {
    let until = (tokio::time::Instant::now() + wait).min(deadline);
    tokio::time::sleep_until(until).await;
}

/// Cordons for `owner` as [`cordon_plan`] says; returns what the plan was and the Node's
/// reference. A conflict (the Node changed since it was read) reads it again.
async fn cordon(
    api: &dyn NodeDrainApi,
    node_name: &str,
    owner: &str,
) -> Result<(Cordon, ObjectReference), DrainError> {
    for _ in 0..5 {
        let node = api
            .node()
            .await
            .map_err(DrainError::Api)?
            .ok_or_else(|| DrainError::NoNode(node_name.to_string()))?;
        let rv = node.metadata.resource_version.clone().unwrap_or_default();
        let plan = cordon_plan(&node, owner);
        match &plan {
            Cordon::Ours => {}
            Cordon::Theirs => {
                tracing::info!(
                    node = node_name,
                    "node already cordoned by someone else; it stays cordoned after the operation"
                );
            }
            Cordon::Cordon | Cordon::TakeOver(_) => {
                match api.set_cordon(&rv, true, Some(owner)).await {
                    Ok(()) => tracing::info!(node = node_name, owner, "node cordoned"),
                    Err(e) if e.conflict => continue,
                    Err(e) => return Err(DrainError::Api(e)),
                }
            }
        }
        return Ok((plan, node_ref(&node)));
    }
    Err(DrainError::Api(DrainApiError {
        action: format!("cordon node {node_name}"),
        cause: "the Node kept changing".into(),
        permanent: false,
        conflict: true,
    }))
}

/// How a round ended, when the drain goes on.
enum Round {
    /// Nothing is left to evict or wait for.
    Drained,
    /// Pods are left.
    Left {
        /// Whether a pod left since the last round (an eviction accepted, a pod gone).
        moved: bool,
        /// The pods left (to evict, or terminating).
        left: Vec<PodRef>,
        /// The evictions a budget refused this round, with its words.
        blocked: Vec<(PodRef, String)>,
    },
}

/// One round: lists the pods, evicts those to evict.
async fn round(
    api: &dyn NodeDrainApi,
    out: &mut Drained,
    last: &mut Option<String>,
) -> Result<Round, DrainError> {
    let pods = api.pods().await.map_err(DrainError::Api)?;
    let p = plan(&pods);
    if p.done() {
        return Ok(Round::Drained);
    }
    let mut moved = false;
    let mut blocked = Vec::new();
    for pod in &p.evict {
        match api.evict(pod).await {
            Eviction::Accepted => {
                tracing::info!(pod = %pod, "pod evicted");
                out.evicted += 1;
                moved = true;
            }
            Eviction::Gone => moved = true,
            Eviction::Blocked(why) => {
                tracing::info!(pod = %pod, reason = %why, "eviction refused by a disruption budget; trying again");
                blocked.push((pod.clone(), why.clone()));
                *last = Some(why);
            }
            Eviction::Retry(why) => {
                tracing::warn!(pod = %pod, error = %why, "eviction failed; trying again");
                *last = Some(why);
            }
            Eviction::Refused(cause) => {
                return Err(DrainError::Refused {
                    pod: pod.clone(),
                    cause,
                });
            }
        }
    }
    let mut left = p.evict;
    left.extend(p.terminating);
    left.sort();
    Ok(Round::Left {
        moved,
        left,
        blocked,
    })
}

/// Lifts operation `uid`'s cordon (`None`: any cordon this agent made), as [`release_plan`]
/// says; an administrator's cordon is never touched. Returns what was done.
pub async fn release(
    api: &dyn NodeDrainApi,
    node_name: &str,
    uid: Option<&str>,
) -> Result<Release, DrainApiError> {
    for _ in 0..5 {
        let Some(node) = api.node().await? else {
            return Ok(Release::Nothing);
        };
        let rv = node.metadata.resource_version.clone().unwrap_or_default();
        let what = release_plan(&node, uid);
        let res = match what {
            Release::Nothing => return Ok(Release::Nothing),
            Release::Uncordon => api.set_cordon(&rv, false, None).await,
            Release::ForgetAnnotation => api.set_cordon(&rv, false, None).await,
        };
        match res {
            Ok(()) => {
                tracing::info!(node = node_name, "node uncordoned");
                if what == Release::Uncordon {
                    let by = flex_api::drain::cordon_state(&node).1.unwrap_or_default();
                    let note = format!("uncordoned by {EVENT_COMPONENT} (its cordon for {by})");
                    api.event(&node_ref(&node), false, reasons::UNCORDONED, &note)
                        .await;
                }
                return Ok(what);
            }
            Err(e) if e.conflict => continue,
            Err(e) => return Err(e),
        }
    }
    Err(DrainApiError {
        action: format!("uncordon node {node_name}"),
        cause: "the Node kept changing".into(),
        permanent: false,
        conflict: true,
    })
}

/// Waits until the Node reports `Ready` with a heartbeat at or after `since` (kubelet's first
/// status after the restart), for at most `timeout`. API errors count as not ready yet.
pub async fn wait_ready(
    api: &dyn NodeDrainApi,
    since: Timestamp,
    timings: DrainTimings,
) -> Result<(), flex_host::retry::WaitTimeout> {
    flex_host::retry::wait_until(
        "the Node to report Ready after the reboot",
        timings.ready_timeout,
        timings.ready_poll,
        || async {
            match api.node().await {
                Ok(Some(n)) => match ready(&n) {
                    Some((true, Some(beat))) if beat >= since => Ok(()),
                    Some((true, beat)) => Err(format!(
                        "Ready, last heartbeat {} (before the reboot)",
                        beat.map(|b| b.to_string())
                            .unwrap_or_else(|| "unknown".into())
                    )),
                    Some((false, _)) => Err("not Ready".into()),
                    None => Err("no Ready condition".into()),
                },
                Ok(None) => Err("no Node".into()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await
}

/// Makes the drain's seam from a client and the node's name (real: [`KubeNodeDrain`]).
pub type DrainApiFactory = Arc<dyn Fn(Client, &str) -> Arc<dyn NodeDrainApi> + Send + Sync>;

/// The real factory: [`KubeNodeDrain`] over the client, each step also recorded on the host
/// for `status` ([`progress`]).
pub fn kube_drain_api() -> DrainApiFactory {
    Arc::new(|client, node| {
        Arc::new(progress::Recorded::new(
            Arc::new(KubeNodeDrain::new(client, node)),
            flex_host::fs::HostFs::host(),
        ))
    })
}

/// The cordon owner of a repave (the [`CORDONED_BY`] value): its goal's settings version.
pub fn repave_owner(settings_version: &str) -> String {
    format!("repave/{settings_version}")
}

/// The cordon owner of the reset that follows the node's deletion.
pub const DELETION_OWNER: &str = "node-deletion";

/// The drain as the daemon's own flows use it (the repave's switch, the reset after the node's
/// deletion, the sweep at start), with the daemon's current client, the node's policy
/// (`agent.drain`) and timings. MachineOperations drain through their reconciler, which adds
/// their parameters.
pub struct NodeDrain {
    api: DrainApiFactory,
    kube: KubeClients,
    node: String,
    policy: DrainPolicy,
    timings: DrainTimings,
    /// When the last drain of a repave began (the heartbeat after the switch must be newer).
    switch_began: Mutex<Option<Timestamp>>,
}

impl NodeDrain {
    /// The drain of `node` through `kube`, with `policy`.
    pub fn new(kube: KubeClients, node: &str, policy: DrainPolicy) -> Self {
        Self {
            api: kube_drain_api(),
            kube,
            node: node.to_string(),
            policy,
            timings: DrainTimings::default(),
            switch_began: Mutex::new(None),
        }
    }

    /// The same with another seam and timings (tests).
    pub fn with_api(mut self, api: DrainApiFactory, timings: DrainTimings) -> Self {
        self.api = api;
        self.timings = timings;
        self
    }

    fn api(&self) -> Arc<dyn NodeDrainApi> {
        (self.api)(self.kube.current(), &self.node)
    }

    async fn drain(&self, owner: &str, what: &str) -> Result<Drained, SeamError> {
        tracing::info!(node = %self.node, owner, timeout = ?self.policy.timeout, "cordoning and draining the node");
        let subject = Subject {
            owner: owner.to_string(),
            what: what.to_string(),
            related: None,
        };
        cordon_and_drain(
            self.api().as_ref(),
            &self.node,
            &subject,
            self.policy,
            self.timings,
        )
        .await
        .map_err(|e| {
            let permanent = matches!(&e, DrainError::Refused { .. })
                || matches!(&e, DrainError::Api(a) if a.permanent);
            let e = anyhow::anyhow!("drain: {e}");
            if permanent {
                SeamError::permanent(e)
            } else {
                SeamError::transient(e)
            }
        })
    }

    async fn release_logged(&self, api: &dyn NodeDrainApi, owner: &str) {
        if let Err(e) = release(api, &self.node, Some(owner)).await {
            tracing::warn!(error = %e, owner, "could not uncordon the node; the daemon tries again when it starts");
        }
    }

    /// Before the reset that follows the node's deletion: cordon and drain. The cordon stays
    /// (the node leaves the cluster).
    pub async fn before_deletion_reset(&self) -> Result<(), SeamError> {
        self.drain(DELETION_OWNER, "the reset after the node's deletion")
            .await
            .map(drop)
    }

    /// At the daemon's start, before any work: lifts a cordon this agent made whose owner no
    /// longer runs (`running(owner)` false: no MachineOperation record at `claiming` or
    /// `executing`, no repave journal), when the Node is Ready. A cordon a restart cut short
    /// the release of, or one left on a node that was reset and joined again. An
    /// administrator's cordon is never touched. Failures are logged.
    pub async fn release_stale(&self, running: &(dyn Fn(&str) -> bool + Sync)) {
        let api = self.api();
        let node = match api.node().await {
            Ok(Some(n)) => n,
            Ok(None) => {
                self.free_stale_slot(api.as_ref(), running, true).await;
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not read the node for a stale cordon");
                return;
            }
        };
        let is_ready = ready(&node).is_some_and(|(r, _)| r);
        self.free_stale_slot(api.as_ref(), running, is_ready).await;
        let (_, Some(owner)) = flex_api::drain::cordon_state(&node) else {
            return;
        };
        if running(&owner) {
            return;
        }
        if !is_ready {
            tracing::warn!(owner = %owner, "the node is not Ready; the cordon of work that no longer runs stays");
            return;
        }
        tracing::info!(owner = %owner, "lifting the cordon of work that no longer runs");
        self.release_logged(api.as_ref(), &owner).await;
    }

    /// Frees this node's slot of the disruption budget when the work that took it no longer
    /// runs and the node is Ready (or gone): a release a restart cut short, or a `stuck` slot
    /// whose node is Ready again.
    async fn free_stale_slot(
        &self,
        api: &dyn NodeDrainApi,
        running: &(dyn Fn(&str) -> bool + Sync),
        is_ready: bool,
    ) {
        let data = match api.budget().await {
            Ok(Some((_, d))) => d,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the disruption budget for a stale slot");
                return;
            }
        };
        let owner = match flex_api::budget::parse(&data) {
            Ok(b) => flex_api::budget::owner(&b, &self.node),
            Err(_) => None,
        };
        let Some(owner) = owner else { return };
        if running(&owner) {
            return;
        }
        if !is_ready {
            tracing::warn!(owner = %owner, "the node is not Ready; its disruption slot stays");
            return;
        }
        tracing::info!(owner = %owner, "freeing the disruption slot of work that no longer runs");
        if let Err(e) = budget::change(api, &self.node, Some(&owner), budget::Change::Release).await
        {
            tracing::warn!(error = %e, "could not free the disruption slot");
        }
    }
}

#[async_trait]
impl SwitchGuard for NodeDrain {
    fn drains(&self) -> bool {
        true
    }

    async fn before_switch(&self, journal: &Journal) -> Result<(), SeamError> {
        *self.switch_began.lock().unwrap_or_else(|e| e.into_inner()) = Some(Timestamp::now());
        // The daemon repaves after its Node was deleted (the repave's trigger, as upstream's):
        // there is nothing to cordon, and the pods bound to the deleted Node are the pod
        // garbage collector's. A Node that exists again is cordoned and drained.
        match self.api().node().await {
            Ok(None) => {
                tracing::info!(node = %self.node, "the Node is gone (the repave's trigger): nothing to cordon or drain");
                return Ok(());
            }
            Ok(Some(_)) => {}
            Err(e) => {
                return Err(SeamError::transient(anyhow::anyhow!("drain: {e}")));
            }
        }
        let what = format!(
            "the repave to settings version {} ({} to {})",
            journal.settings_version, journal.source, journal.target
        );
        self.drain(&repave_owner(&journal.settings_version), &what)
            .await
            .map(drop)
    }

    async fn after(&self, journal: &Journal, finished: bool) {
        let owner = repave_owner(&journal.settings_version);
        let api = self.api();
        if finished {
            // A repave resumed after a restart did not see its drain begin: any heartbeat then.
            let since = self
                .switch_began
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .unwrap_or(Timestamp::UNIX_EPOCH);
            if let Err(e) = wait_ready(api.as_ref(), since, self.timings).await {
                tracing::warn!(error = %e, "the node is not Ready after the repave; it stays cordoned");
                return;
            }
        }
        self.release_logged(api.as_ref(), &owner).await;
    }
}
