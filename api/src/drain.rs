//! Cordon and drain before a disruptive operation: the decisions, pure and table-tested.
//!
//! A NodeReboot or an AgentReset stops kubelet. Before it does, the daemon marks its Node
//! unschedulable and evicts the node's pods through the Eviction API, so PodDisruptionBudgets
//! and the pods' grace periods are respected ([`plan`] says which pods, [`classify_eviction`]
//! what an answer means). The cordon is recorded on the Node ([`CORDONED_BY`], the operation's
//! UID) so that only a cordon the daemon made itself is ever lifted ([`cordon_plan`],
//! [`release_plan`]): an administrator's cordon stays.
//!
//! The I/O (the Node, the pod list, evictions, waits) is the agent's (`flows::drain`).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::duration::parse_go_duration;

/// The Node annotation that records a cordon this agent made: the UID of the operation that
/// made it. Without it an unschedulable Node is an administrator's, and stays so.
pub const CORDONED_BY: &str = "aks-flex-node.azure.com/cordoned-by";

/// The operation parameter that bounds the drain (a Go duration, `"90s"`, `"10m"`).
pub const PARAM_TIMEOUT: &str = "drainTimeout";
/// The operation parameter that says what a drain that timed out leads to: `Fail` or `Proceed`.
pub const PARAM_ON_TIMEOUT: &str = "onDrainTimeout";

/// The drain timeout when neither the operation nor the config names one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// The shortest drain timeout accepted (a pod's own grace period is 30 s by default).
pub const MIN_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest drain timeout accepted.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// What a drain that timed out leads to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnTimeout {
    /// Fail the operation, uncordon, and never stop kubelet (the default: pods are not killed).
    #[default]
    Fail,
    /// Carry out the operation anyway; the pods left are stopped with kubelet.
    Proceed,
}

impl OnTimeout {
    /// The spelling in parameters and the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fail => "Fail",
            Self::Proceed => "Proceed",
        }
    }

    /// Parses `Fail` or `Proceed` (exactly).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Fail" => Some(Self::Fail),
            "Proceed" => Some(Self::Proceed),
            _ => None,
        }
    }
}

/// What an operation asks of the drain; `None` takes the node's default ([`DrainPolicy`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainRequest {
    /// `drainTimeout`.
    pub timeout: Option<Duration>,
    /// `onDrainTimeout`.
    pub on_timeout: Option<OnTimeout>,
}

/// A drain parameter that does not parse; names the parameter.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DrainParamError {
    /// `drainTimeout` is not a duration in range.
    #[error(
        "parameter \"drainTimeout\" must be a duration from 1s to 24h (e.g. \"90s\", \"10m\"), got {0:?}"
    )]
    Timeout(String),
    /// `onDrainTimeout` is neither `Fail` nor `Proceed`.
    #[error("parameter \"onDrainTimeout\" must be \"Fail\" or \"Proceed\", got {0:?}")]
    OnTimeout(String),
}

/// Parses a drain timeout: a Go duration from [`MIN_TIMEOUT`] to [`MAX_TIMEOUT`].
pub fn parse_timeout(s: &str) -> Option<Duration> {
    parse_go_duration(s)
        .ok()
        .filter(|d| (MIN_TIMEOUT..=MAX_TIMEOUT).contains(d))
}

impl DrainRequest {
    /// The drain parameters among `params` (others are the caller's to check).
    pub fn from_params(params: &BTreeMap<String, String>) -> Result<Self, DrainParamError> {
        let timeout = match params.get(PARAM_TIMEOUT) {
            None => None,
            Some(v) => Some(parse_timeout(v).ok_or_else(|| DrainParamError::Timeout(v.clone()))?),
        };
        let on_timeout = match params.get(PARAM_ON_TIMEOUT) {
            None => None,
            Some(v) => {
                Some(OnTimeout::parse(v).ok_or_else(|| DrainParamError::OnTimeout(v.clone()))?)
            }
        };
        Ok(Self {
            timeout,
            on_timeout,
        })
    }

    /// This request over the node's `default`.
    pub fn resolve(&self, default: DrainPolicy) -> DrainPolicy {
        DrainPolicy {
            timeout: self.timeout.unwrap_or(default.timeout),
            on_timeout: self.on_timeout.unwrap_or(default.on_timeout),
        }
    }
}

/// How a drain runs: its timeout, and what a timeout leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainPolicy {
    /// How long evictions are tried and pods waited for.
    pub timeout: Duration,
    /// What happens when the timeout passes with pods left.
    pub on_timeout: OnTimeout,
}

impl Default for DrainPolicy {
    /// 5 minutes, then fail.
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
            on_timeout: OnTimeout::Fail,
        }
    }
}

/// A pod, as the drain names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID (the eviction's precondition: a new pod of the same name is not evicted).
    pub uid: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why a pod on the node is left alone by the drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// Managed by a DaemonSet: its controller would put it back, and it tolerates the cordon.
    DaemonSet,
    /// A static pod's mirror: kubelet runs it from a file, the API cannot evict it.
    Mirror,
    /// Succeeded or Failed: nothing runs.
    Finished,
}

/// What the drain does with the pods on the node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Pods to evict.
    pub evict: Vec<PodRef>,
    /// Pods already terminating (evicted, or deleted by someone): waited for.
    pub terminating: Vec<PodRef>,
    /// Pods left, and why.
    pub skipped: Vec<(PodRef, Skip)>,
}

impl Plan {
    /// Whether the drain is complete: nothing to evict or wait for.
    pub fn done(&self) -> bool {
        self.evict.is_empty() && self.terminating.is_empty()
    }
}

/// The annotation kubelet puts on a static pod's mirror.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

fn pod_ref(p: &Pod) -> PodRef {
    PodRef {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
        uid: p.metadata.uid.clone().unwrap_or_default(),
    }
}

/// Why `pod` is left alone, if it is.
pub fn skip(pod: &Pod) -> Option<Skip> {
    let m = &pod.metadata;
    if m.annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
    {
        return Some(Skip::Mirror);
    }
    if m.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "DaemonSet")
    {
        return Some(Skip::DaemonSet);
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return Some(Skip::Finished);
    }
    None
}

/// Sorts the pods bound to the node into those to evict, those terminating and those left
/// alone ([`skip`]). Pods without a controller are evicted too: kubelet is about to stop, and a
/// pod left running would be stopped without its PodDisruptionBudget or the API's grace period.
pub fn plan(pods: &[Pod]) -> Plan {
    let mut out = Plan::default();
    for p in pods {
        let r = pod_ref(p);
        if let Some(why) = skip(p) {
            out.skipped.push((r, why));
        } else if p.metadata.deletion_timestamp.is_some() {
            out.terminating.push(r);
        } else {
            out.evict.push(r);
        }
    }
    out.evict.sort();
    out.terminating.sort();
    out
}

/// What an answer to an eviction means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// Accepted (201/200): the pod terminates with its grace period.
    Accepted,
    /// The pod is gone, or another pod now has its name (404, 409 on the UID precondition).
    Gone,
    /// A PodDisruptionBudget forbids it now (429); the budget's own words, naming it. Tried again.
    Blocked(String),
    /// The API server is busy or unreachable (5xx, or a 429 that names no budget). Tried again.
    Retry(String),
    /// Refused for good (403, 400, 422 …): the drain cannot complete.
    Refused(String),
}

/// The cause type the Eviction API gives a 429 that a PodDisruptionBudget caused.
pub const DISRUPTION_BUDGET_CAUSE: &str = "DisruptionBudget";

/// Classifies an eviction's answer: the HTTP `code`, the status `message`, and the status
/// details' causes (`(type, message)`).
pub fn classify_eviction(code: u16, message: &str, causes: &[(String, String)]) -> Eviction {
    match code {
        200..=299 => Eviction::Accepted,
        404 | 409 => Eviction::Gone,
        429 => {
            let budget = causes
                .iter()
                .find(|(t, _)| t == DISRUPTION_BUDGET_CAUSE)
                .map(|(_, m)| m.clone());
            match budget {
                Some(m) => Eviction::Blocked(m),
                None if message.contains("disruption budget") => {
                    Eviction::Blocked(message.to_string())
                }
                None => Eviction::Retry(format!("{code}: {message}")),
            }
        }
        500..=599 => Eviction::Retry(format!("{code}: {message}")),
        _ => Eviction::Refused(format!("{code}: {message}")),
    }
}

/// What the daemon does about the cordon before it drains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cordon {
    /// Mark the Node unschedulable and record this operation's UID.
    Cordon,
    /// This operation's cordon is already in place (a drain resumed after a restart).
    Ours,
    /// Unschedulable already, not by this agent (an administrator, or another tool): drain
    /// without touching it, and never lift it.
    Theirs,
    /// Unschedulable by this agent for another operation (a finished one whose release was
    /// cut short): take it over for this one.
    TakeOver(String),
}

/// Whether the Node is unschedulable, and the operation UID recorded in [`CORDONED_BY`].
pub fn cordon_state(node: &Node) -> (bool, Option<String>) {
    let unschedulable = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let by = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CORDONED_BY))
        .cloned();
    (unschedulable, by)
}

/// What to do about the cordon of `node` before operation `uid` drains it.
pub fn cordon_plan(node: &Node, uid: &str) -> Cordon {
    match cordon_state(node) {
        (false, _) => Cordon::Cordon,
        (true, Some(by)) if by == uid => Cordon::Ours,
        (true, Some(by)) => Cordon::TakeOver(by),
        (true, None) => Cordon::Theirs,
    }
}

/// What to do about the cordon once an operation is over (or was never run).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    /// Mark the Node schedulable and remove [`CORDONED_BY`].
    Uncordon,
    /// The annotation is left without a cordon (an administrator uncordoned): remove it only.
    ForgetAnnotation,
    /// Nothing of ours to lift (an administrator's cordon, or none).
    Nothing,
}

/// What releasing operation `uid`'s cordon of `node` means; `uid` `None` releases any cordon
/// this agent made (the sweep at the daemon's start, when no operation of this node runs).
pub fn release_plan(node: &Node, uid: Option<&str>) -> Release {
    match cordon_state(node) {
        (_, None) => Release::Nothing,
        (_, Some(by)) if uid.is_some_and(|u| u != by) => Release::Nothing,
        (true, Some(_)) => Release::Uncordon,
        (false, Some(_)) => Release::ForgetAnnotation,
    }
}

/// The Node's `Ready` condition: whether it is `True`, and its last heartbeat (RFC 3339 as
/// the API gives it, compared as a timestamp by the caller).
pub fn ready(node: &Node) -> Option<(bool, Option<k8s_openapi::jiff::Timestamp>)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| {
            (
                c.status == "True",
                c.last_heartbeat_time.as_ref().map(|t| t.0),
            )
        })
}
