//! The decision layer: pure functions from an operation, this node's facts and the local record
//! to what to do (the table is in [`crate::operations`]), and parameter validation per kind.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;

use super::record::{Record, Stage};
use super::{
    INTERRUPTED, INVALID_PARAMETERS, OperationResult, UNKNOWN_KIND, UNSUPPORTED_OPERATION,
};
use crate::drain::DrainRequest;
use crate::image::ImageRef;
use crate::machina::{Handler, MachineOperation, OperationKind, OperationPhase};

/// What an operation's agent upgrade names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpgradeRequest {
    /// The agent's image (containerized agents): a fully qualified reference pinned by digest.
    Image(String),
    /// A release archive and its SHA-256 (agents installed on the host).
    Download {
        /// `downloadURL`.
        url: String,
        /// `sha256`, lowercase hex.
        sha256: String,
    },
}

/// A validated operation, ready for a handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Cordon and drain the node, then restart the active machine.
    NodeReboot(DrainRequest),
    /// Cordon and drain the node, reset it, then (after the status says so) stop the daemon.
    AgentReset(DrainRequest),
    /// Upgrade the agent.
    AgentUpgrade(UpgradeRequest),
}

impl Action {
    /// The operation kind.
    pub fn kind(&self) -> OperationKind {
        match self {
            Self::NodeReboot(_) => OperationKind::NodeReboot,
            Self::AgentReset(_) => OperationKind::AgentReset,
            Self::AgentUpgrade(_) => OperationKind::AgentUpgrade,
        }
    }

    /// The status message while it runs (upstream's wording).
    pub fn in_progress_message(&self) -> &'static str {
        match self {
            Self::NodeReboot(_) => "restarting active nspawn node",
            Self::AgentReset(_) => "resetting local nspawn node runtime",
            Self::AgentUpgrade(_) => "staging upgraded AKS Flex Node agent",
        }
    }
}

/// Why an operation is finished without running.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// `InvalidParameters`, `UnsupportedOperation` or `UnknownKind`.
    pub reason: &'static str,
    /// Names the cause.
    pub message: String,
}

impl Failure {
    fn invalid(message: impl Into<String>) -> Self {
        Self {
            reason: INVALID_PARAMETERS,
            message: message.into(),
        }
    }

    /// The `Failed` result the status records.
    pub fn into_result(self) -> OperationResult {
        OperationResult::failed(self.reason, self.message)
    }
}

/// Validates `kind` and its parameters (empty values count as absent). `containerized`: whether
/// the agent runs in its container image (AgentUpgrade takes `image` there, and `downloadURL` +
/// `sha256` on a host). Every kind is matched here by name, so a new one cannot be forgotten.
pub fn validate(
    kind: &OperationKind,
    params: &BTreeMap<String, String>,
    containerized: bool,
) -> Result<Action, Failure> {
    // Refuses a parameter `kind` does not take; `accepted` names the ones it takes.
    let takes_only =
        |known: &[&str], accepted: &str| match params.keys().find(|k| !known.contains(&k.as_str()))
        {
            Some(k) => Err(Failure::invalid(format!(
                "unknown parameter {k:?} for {kind} (it takes {accepted})"
            ))),
            None => Ok(()),
        };
    match kind {
        OperationKind::NodeReboot => {
            takes_only(DRAIN_PARAMS, DRAIN_PARAMS_TEXT)?;
            drain_request(params).map(Action::NodeReboot)
        }
        OperationKind::AgentReset => {
            takes_only(DRAIN_PARAMS, DRAIN_PARAMS_TEXT)?;
            drain_request(params).map(Action::AgentReset)
        }
        OperationKind::AgentUpgrade => {
            takes_only(
                &["image", "downloadURL", "sha256"],
                "image, or downloadURL and sha256",
            )?;
            validate_upgrade(params, containerized).map(Action::AgentUpgrade)
        }
        OperationKind::HostReboot
        | OperationKind::HostPowerOff
        | OperationKind::HostPowerOn
        | OperationKind::HostReplace
        | OperationKind::HostReimage => Err(Failure {
            reason: UNSUPPORTED_OPERATION,
            message: format!(
                "operation kind {kind} is carried out by machina's host controllers, not by the node agent"
            ),
        }),
        OperationKind::Unknown(k) if k.is_empty() => Err(Failure {
            reason: UNKNOWN_KIND,
            message: "the operation names no operationKind".into(),
        }),
        OperationKind::Unknown(k) => Err(Failure {
            reason: UNKNOWN_KIND,
            message: format!(
                "unknown operation kind {k:?} (the node agent handles {}, {} and {})",
                OperationKind::NodeReboot,
                OperationKind::AgentReset,
                OperationKind::AgentUpgrade
            ),
        }),
    }
}

/// The parameters of the kinds that drain the node first.
const DRAIN_PARAMS: &[&str] = &[crate::drain::PARAM_TIMEOUT, crate::drain::PARAM_ON_TIMEOUT];
const DRAIN_PARAMS_TEXT: &str = "drainTimeout and onDrainTimeout, both optional";

fn drain_request(params: &BTreeMap<String, String>) -> Result<DrainRequest, Failure> {
    DrainRequest::from_params(params).map_err(|e| Failure::invalid(e.to_string()))
}

fn validate_upgrade(
    params: &BTreeMap<String, String>,
    containerized: bool,
) -> Result<UpgradeRequest, Failure> {
    // A value with leading or trailing whitespace is refused, as upstream refuses it
    // (InvalidParameters), rather than trimmed into something the operator did not write. A
    // blank value is a missing one.
    for k in ["image", "downloadURL", "sha256"] {
        if let Some(v) = params.get(k)
            && !v.trim().is_empty()
            && v.trim() != v
        {
            return Err(Failure::invalid(format!(
                "parameter {k:?} has leading or trailing whitespace"
            )));
        }
    }
    let get = |k: &str| params.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    match (get("image"), get("downloadURL"), get("sha256")) {
        (Some(_), Some(_), _) => Err(Failure::invalid(
            "parameters \"image\" and \"downloadURL\" are mutually exclusive: name one",
        )),
        (Some(image), None, sha) => {
            if !containerized {
                return Err(Failure::invalid(
                    "parameter \"image\" needs the agent to run in its container image, and this \
                     agent runs from a binary on the host: upgrade it with \"downloadURL\" and \"sha256\"",
                ));
            }
            if sha.is_some() {
                return Err(Failure::invalid(
                    "parameter \"sha256\" goes with \"downloadURL\"; an image is pinned by its digest",
                ));
            }
            validate_image(image)
                .map(UpgradeRequest::Image)
                .map_err(|e| Failure::invalid(e.to_string()))
        }
        (None, Some(url), sha) => {
            if containerized {
                return Err(Failure::invalid(
                    "parameter \"downloadURL\" upgrades an agent installed on the host, and this \
                     agent runs in its container image: name the new image with \"image\"",
                ));
            }
            let Some(sha) = sha else {
                return Err(Failure::invalid(
                    "missing required parameter \"sha256\" (the SHA-256 of the archive at \"downloadURL\")",
                ));
            };
            if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(Failure::invalid(format!(
                    "parameter \"sha256\" must be 64 hexadecimal digits, got {sha:?}"
                )));
            }
            match url::Url::parse(url) {
                Ok(u) if matches!(u.scheme(), "https" | "http") && u.host().is_some() => {
                    Ok(UpgradeRequest::Download {
                        url: url.to_string(),
                        sha256: sha.to_ascii_lowercase(),
                    })
                }
                Ok(_) => Err(Failure::invalid(format!(
                    "parameter \"downloadURL\" must be an http(s) URL, got {url:?}"
                ))),
                Err(e) => Err(Failure::invalid(format!(
                    "parameter \"downloadURL\" is not a URL ({e}): {url:?}"
                ))),
            }
        }
        (None, None, _) if containerized => Err(Failure::invalid(
            "missing required parameter \"image\" (the agent's image, pinned by digest)",
        )),
        (None, None, _) => Err(Failure::invalid(
            "missing required parameter \"downloadURL\"",
        )),
    }
}

/// Why an `image` parameter was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ImageParamError {
    /// Not an image reference (the reason is in the message, not a `source()`: a chain printer
    /// would repeat it).
    #[error("parameter \"image\": {0}")]
    Unparsable(crate::image::ReferenceError),
    /// A tag only, no digest.
    #[error(
        "parameter \"image\" must be pinned by digest (registry/repository@sha256:<digest>), \
         and {image:?} names only a tag"
    )]
    NotPinned {
        /// The parameter.
        image: String,
    },
    /// No registry named.
    #[error(
        "parameter \"image\" must be fully qualified, naming its registry (as {canonical:?}), got {image:?}"
    )]
    NotQualified {
        /// The parameter.
        image: String,
        /// How it reads fully qualified.
        canonical: String,
    },
    /// Not in canonical form.
    #[error(
        "parameter \"image\" must be fully qualified in canonical form: {canonical:?}, got {image:?}"
    )]
    NotCanonical {
        /// The parameter.
        image: String,
        /// Its canonical form.
        canonical: String,
    },
}

impl From<crate::image::ReferenceError> for ImageParamError {
    fn from(e: crate::image::ReferenceError) -> Self {
        Self::Unparsable(e)
    }
}

/// Checks an `image` parameter: a fully qualified reference (naming its registry, in canonical
/// form) pinned by digest, as `ctr` pulls and verifies it. Returns it unchanged.
pub fn validate_image(image: &str) -> Result<String, ImageParamError> {
    let parsed = ImageRef::parse(image)?;
    if parsed.digest.is_none() {
        return Err(ImageParamError::NotPinned {
            image: image.to_string(),
        });
    }
    let first = image.split('/').next().unwrap_or_default();
    let names_registry =
        image.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let canonical = parsed.to_string();
    if !names_registry {
        return Err(ImageParamError::NotQualified {
            image: image.to_string(),
            canonical,
        });
    }
    if canonical != image {
        return Err(ImageParamError::NotCanonical {
            image: image.to_string(),
            canonical,
        });
    }
    Ok(image.to_string())
}

/// Whether this agent can carry out a valid `action`: every kind it validates (kept as the
/// place where a kind this agent knows but cannot run would be refused with
/// `UnsupportedOperation`).
pub fn supported(action: &Action) -> Result<(), Failure> {
    match action {
        Action::AgentUpgrade(_) | Action::NodeReboot(_) | Action::AgentReset(_) => Ok(()),
    }
}

/// [`validate`], then [`supported`]: an action this agent will run, or why not.
pub fn admit(
    kind: &OperationKind,
    params: &BTreeMap<String, String>,
    containerized: bool,
) -> Result<Action, Failure> {
    let action = validate(kind, params, containerized)?;
    supported(&action)?;
    Ok(action)
}

/// A malformed label selector requirement.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("requirement on {key:?}: {problem}")]
pub struct SelectorError {
    /// The requirement's key.
    pub key: String,
    /// What is wrong with it.
    pub problem: String,
}

/// Whether `sel` selects `labels`, with Kubernetes' semantics (an empty selector selects
/// everything); `Err` names a malformed requirement.
pub fn selector_matches(
    sel: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let mut ok = true;
    for (k, v) in sel.match_labels.iter().flatten() {
        ok &= labels.get(k) == Some(v);
    }
    for r in sel.match_expressions.iter().flatten() {
        let values = r.values.as_deref().unwrap_or_default();
        let have = labels.get(&r.key);
        let m = match r.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(SelectorError {
                    key: r.key.clone(),
                    problem: format!("operator {} needs values", r.operator),
                });
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(SelectorError {
                    key: r.key.clone(),
                    problem: format!("operator {} takes no values", r.operator),
                });
            }
            "In" => have.is_some_and(|h| values.contains(h)),
            "NotIn" => !have.is_some_and(|h| values.contains(h)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            other => {
                return Err(SelectorError {
                    key: r.key.clone(),
                    problem: format!("unknown operator {other:?}"),
                });
            }
        };
        ok &= m;
    }
    Ok(ok)
}

/// Whether the operation's kind belongs to machina's host controllers.
fn host_kind(op: &MachineOperation) -> bool {
    op.spec.operation_kind.handler() == Handler::HostControllers
}

/// The label domain a node cannot set on its own Node: the API server's `NodeRestriction`
/// admission refuses a node's write of any label under it (or a subdomain of it). A selector
/// operation may match only such labels, so which nodes it reaches is the administrator's
/// choice, never a node's: a node can set most other labels on itself (`kubernetes.io/hostname`
/// included, to any value), and so capture an operation aimed at another node.
pub const NODE_RESTRICTED_DOMAIN: &str = "node-restriction.kubernetes.io";

/// Whether a node cannot set label `key` on its own Node: its prefix is
/// [`NODE_RESTRICTED_DOMAIN`] or a subdomain of it.
pub fn node_cannot_set(key: &str) -> bool {
    key.split_once('/').is_some_and(|(domain, name)| {
        !name.is_empty()
            && (domain == NODE_RESTRICTED_DOMAIN
                || domain
                    .strip_suffix(NODE_RESTRICTED_DOMAIN)
                    .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')))
    })
}

/// The first key of `sel` a node could set on itself ([`node_cannot_set`]), if any.
pub fn node_settable_key(sel: &LabelSelector) -> Option<&str> {
    sel.match_labels
        .iter()
        .flatten()
        .map(|(k, _)| k.as_str())
        .chain(
            sel.match_expressions
                .iter()
                .flatten()
                .map(|r| r.key.as_str()),
        )
        .find(|k| !node_cannot_set(k))
}

/// Whether `sel` has a requirement a label must be there to meet (`matchLabels`, `In`,
/// `Exists`). A node cannot add a `node-restriction.kubernetes.io/` label to itself, but one that
/// re-registers its Node loses them, and then meets `NotIn` and `DoesNotExist`: those may narrow
/// a selector, never make one alone.
pub fn has_positive_requirement(sel: &LabelSelector) -> bool {
    sel.match_labels.as_ref().is_some_and(|m| !m.is_empty())
        || sel
            .match_expressions
            .iter()
            .flatten()
            .any(|r| matches!(r.operator.as_str(), "In" | "Exists"))
}

/// Whether `sel` has no requirement. Kubernetes' empty selector selects everything; an
/// operation's empty selector selects nothing (an operation aimed at every machine must say so
/// with a requirement, such as `node-restriction.kubernetes.io/aks-flex Exists`), so that a selector emptied by
/// mistake or by an attacker never reaches every node.
pub fn selector_is_empty(sel: &LabelSelector) -> bool {
    sel.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
        && sel.match_expressions.as_ref().is_none_or(Vec::is_empty)
}

/// `op`'s selector, when it is aimed by one with at least one requirement.
fn aiming_selector(op: &MachineOperation) -> Option<&LabelSelector> {
    op.spec
        .machine_selector
        .as_ref()
        .filter(|s| !selector_is_empty(s))
}

/// Whether deciding on `op` needs this node's labels (it is aimed by selector).
pub fn needs_labels(op: &MachineOperation) -> bool {
    !host_kind(op) && op.spec.machine_ref.is_empty() && aiming_selector(op).is_some()
}

/// Whether `op` may target `machine_name` (its `machineRef` names it, or it has a non-empty
/// selector and no other node claimed it), without looking at labels.
pub fn may_target(op: &MachineOperation, machine_name: &str) -> bool {
    !host_kind(op)
        && claimed_by_other(op, machine_name).is_none()
        && if op.spec.machine_ref.is_empty() {
            aiming_selector(op).is_some()
        } else {
            op.spec.machine_ref == machine_name
        }
}

/// The node that claimed `op`, when it is not `machine_name`.
pub fn claimed_by_other<'a>(op: &'a MachineOperation, machine_name: &str) -> Option<&'a str> {
    op.status
        .as_ref()
        .map(|s| s.claimed_by.as_str())
        .filter(|c| !c.is_empty() && *c != machine_name)
}

/// A cheap filter for watch events: whether `op` may concern `machine_name` now (it may target
/// this machine, and it is waiting, running, or finished with a TTL). The reconciler decides.
pub fn may_concern(op: &MachineOperation, machine_name: &str) -> bool {
    may_target(op, machine_name)
        && match op.phase() {
            Ok(p) if p.is_terminal() => op.spec.ttl_seconds_after_finished.is_some(),
            Ok(_) => true,
            Err(_) => false,
        }
}

/// Why an operation does not concern this machine (each reads after "it no longer targets
/// this machine (…)" and in the logs).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotTargeted {
    /// `machineRef` names another machine.
    #[error("it targets machine {other:?}, not {this:?}")]
    OtherMachine {
        /// The machine it names.
        other: String,
        /// This machine.
        this: String,
    },
    /// Neither `machineRef` nor `machineSelector`.
    #[error("it names no machine (neither machineRef nor machineSelector)")]
    NoTarget,
    /// An empty selector, which matches no machine.
    #[error(
        "its machineSelector is empty, and an empty selector matches no machine (name the \
         machine with machineRef, or the machines with a label requirement)"
    )]
    EmptySelector,
    /// A selector, and no labels to match it against (neither Node nor Machine exists).
    #[error("its machineSelector needs labels, and neither Node nor Machine {0:?} exists")]
    NoLabels(String),
    /// The selector does not match this machine's labels.
    #[error("its machineSelector does not match the labels of {0:?}")]
    NoMatch(String),
    /// The selector does not parse.
    #[error("its machineSelector is invalid: {0}")]
    InvalidSelector(SelectorError),
    /// The selector has only requirements a label's absence meets.
    #[error(
        "its machineSelector has only NotIn or DoesNotExist requirements, which a node that lost its labels (re-registering its Node) meets: add a matchLabels entry, or an In or Exists requirement"
    )]
    NoPositiveRequirement,
    /// The selector matches a label a node may set on itself.
    #[error(
        "its machineSelector matches label {0:?}, which a node may set on itself: a selector \
         matches only labels under {NODE_RESTRICTED_DOMAIN}/, which only an administrator sets"
    )]
    NodeSettableLabel(String),
    /// Another node's agent claimed it.
    #[error("node {0:?} claimed it")]
    ClaimedByOther(String),
}

/// Whether `op` targets this machine; `Err` says why not.
pub fn targets(
    op: &MachineOperation,
    machine_name: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> Result<(), NotTargeted> {
    if !op.spec.machine_ref.is_empty() {
        return if op.spec.machine_ref == machine_name {
            Ok(())
        } else {
            Err(NotTargeted::OtherMachine {
                other: op.spec.machine_ref.clone(),
                this: machine_name.to_string(),
            })
        };
    }
    let Some(sel) = &op.spec.machine_selector else {
        return Err(NotTargeted::NoTarget);
    };
    if selector_is_empty(sel) {
        return Err(NotTargeted::EmptySelector);
    }
    if let Some(key) = node_settable_key(sel) {
        return Err(NotTargeted::NodeSettableLabel(key.to_string()));
    }
    // A malformed selector says so first, whatever else it lacks.
    if let Err(e) = selector_matches(sel, &BTreeMap::new()) {
        return Err(NotTargeted::InvalidSelector(e));
    }
    if !has_positive_requirement(sel) {
        return Err(NotTargeted::NoPositiveRequirement);
    }
    let Some(labels) = labels else {
        return Err(NotTargeted::NoLabels(machine_name.to_string()));
    };
    match selector_matches(sel, labels) {
        Ok(true) => Ok(()),
        Ok(false) => Err(NotTargeted::NoMatch(machine_name.to_string())),
        Err(e) => Err(NotTargeted::InvalidSelector(e)),
    }
}

/// This node, as decisions see it.
#[derive(Clone, Debug)]
pub struct Facts<'a> {
    /// The machine name operations target with `machineRef`.
    pub machine_name: &'a str,
    /// The Node's labels (the Machine's when there is no Node); `None` when neither exists or
    /// they were not needed.
    pub labels: Option<&'a BTreeMap<String, String>>,
    /// Whether the agent runs in its container image.
    pub containerized: bool,
    /// Now.
    pub now: Timestamp,
}

/// How to pick up an operation this agent already claimed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resume {
    /// The claim is recorded but the handler never started: run it now (the first time).
    Execute(Action),
    /// The handler started and the daemon stopped before its result was recorded: never run it
    /// again; finish it as `Interrupted` (unless the agent's `Handlers::resume_interrupted` knows
    /// better).
    Interrupted,
    /// The result is recorded: report it.
    Report(OperationResult),
}

/// What to do with an operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing (why, for the log).
    Ignore(String),
    /// Finished; look again when its TTL expires.
    Wait(Duration),
    /// Claim it and run `Action`.
    Claim(Action),
    /// Already claimed by this agent.
    Resume(Resume),
    /// Finish it without running anything (bad input or unsupported).
    Finish(OperationResult),
    /// Drop the local record: another agent claimed the operation (why, for the log).
    Forget(String),
    /// This agent holds a record of the operation, and the operation no longer names this
    /// machine (its target changed, or another node claimed it): refuse it, drop the record and
    /// report why (a warning; the spec is immutable in a cluster with the project's CRD, so
    /// this means tampering or a foreign writer).
    Refuse(String),
    /// Its TTL expired: delete it.
    Delete,
}

/// Decides what to do with `op` (see the table in [`crate::operations`]). `record` is the local
/// record of this UID.
pub fn decide(op: &MachineOperation, facts: &Facts<'_>, record: Option<&Record>) -> Decision {
    if host_kind(op) {
        return Decision::Ignore(format!(
            "operation kind {} is for machina's host controllers",
            op.spec.operation_kind
        ));
    }
    let target =
        targets(op, facts.machine_name, facts.labels).and_then(|()| {
            match claimed_by_other(op, facts.machine_name) {
                Some(other) => Err(NotTargeted::ClaimedByOther(other.to_string())),
                None => Ok(()),
            }
        });
    if let Err(why) = target {
        return match record {
            Some(r) => Decision::Refuse(format!(
                "it no longer targets this machine ({why}), and this agent recorded it as {}",
                r.stage.as_str()
            )),
            None => Decision::Ignore(why.to_string()),
        };
    }
    let phase = match op.phase() {
        Ok(p) => p,
        Err(unknown) => return Decision::Ignore(unknown.to_string()),
    };
    if phase.is_terminal() {
        return after_finish(op, facts.now);
    }
    match (phase, record.map(|r| (r.stage, r))) {
        (_, Some((Stage::Finished, r))) => Decision::Resume(Resume::Report(
            r.result.clone().unwrap_or_else(|| interrupted(&r.kind)),
        )),
        (_, Some((Stage::Executing, _))) => Decision::Resume(Resume::Interrupted),
        (OperationPhase::Pending, _) if op.metadata.deletion_timestamp.is_some() => {
            Decision::Ignore("it is being deleted".into())
        }
        (OperationPhase::Pending, _) => {
            let spec = &op.spec;
            match admit(&spec.operation_kind, &spec.parameters, facts.containerized) {
                Ok(a) => Decision::Claim(a),
                Err(f) => Decision::Finish(f.into_result()),
            }
        }
        (_, Some((Stage::Claiming, r))) => {
            let started = op
                .status
                .as_ref()
                .and_then(|s| s.started_at.as_ref())
                .map(|t| format_time(&t.0));
            if started.as_deref() == Some(r.started_at.as_str()) {
                let spec = &op.spec;
                match admit(&spec.operation_kind, &spec.parameters, facts.containerized) {
                    Ok(a) => Decision::Resume(Resume::Execute(a)),
                    Err(f) => Decision::Finish(f.into_result()),
                }
            } else {
                Decision::Forget(format!(
                    "another agent claimed it (started at {}, this agent's claim was {})",
                    started.as_deref().unwrap_or("an unknown time"),
                    r.started_at
                ))
            }
        }
        (_, None) => Decision::Ignore("another agent claimed it (it is InProgress)".into()),
    }
}

fn after_finish(op: &MachineOperation, now: Timestamp) -> Decision {
    let Some(ttl) = op.spec.ttl_seconds_after_finished else {
        return Decision::Ignore("it is finished".into());
    };
    let Some(done) = op.status.as_ref().and_then(|s| s.completed_at.as_ref()) else {
        return Decision::Ignore("it is finished without completedAt; its TTL cannot apply".into());
    };
    let expiry = done.0.as_second().saturating_add(i64::from(ttl.max(0)));
    let left = expiry.saturating_sub(now.as_second());
    if left <= 0 {
        Decision::Delete
    } else {
        Decision::Wait(Duration::from_secs(left.unsigned_abs()))
    }
}

/// The result of an operation whose run was cut short.
pub fn interrupted(kind: &OperationKind) -> OperationResult {
    OperationResult::failed(
        INTERRUPTED,
        format!(
            "the agent restarted while {kind} was running; it is not run again, and its effect is unknown"
        ),
    )
}

/// A timestamp as the API writes it (`%Y-%m-%dT%H:%M:%SZ`, whole seconds).
pub fn format_time(t: &Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}
