//! Whether the API server enforces the daemons' admission policies: RBAC lets a node's daemon
//! write any operation's status and delete any finished operation, and patch the disruption
//! budget's ConfigMap; only the ValidatingAdmissionPolicies of `deploy/controller`
//! (`admission.yaml`, `disruption.yaml`) narrow that to the node's own. They need Kubernetes
//! 1.30 or later and can be missing after a partial apply, and then nothing else says so.
//!
//! So the controller checks them ([`check`]: each policy there, failing closed, and bound with
//! `Deny`) at start and every [`RECHECK`], and stays unready until they are: `/readyz` answers
//! 503 with the reason ([`Readiness`]), which the log also gives when it changes. The check
//! reads through [`PolicyApi`] (the API server in production, a fake in tests).
//!
//! The same check asks the API server (a SubjectAccessReview) whether
//! a flex bootstrap token may create `certificatesigningrequests/nodeclient`: then
//! kube-controller-manager approves kubelet certificates for any node with any flex token, the
//! approver's token binding is moot, and the controller stays unready until the binding that
//! grants it goes ([`check_kubelet_approval`]; an upgrade from an older `deploy/controller`
//! leaves its `aks-flex-node-autoapprove-bootstrap`, since `kubectl apply` deletes nothing).

use std::sync::RwLock;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

/// The API group and version of the policies.
pub const API_VERSION: &str = flex_api::machina::ADMISSION_POLICY_API;
/// The policies (each bound by a binding of the same name), as `deploy/controller` names them.
pub const POLICIES: &[&str] = flex_api::machina::DAEMON_POLICIES;
/// How often the policies are checked again.
pub const RECHECK: Duration = Duration::from_secs(60);

/// The two kinds read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `validatingadmissionpolicies`.
    Policy,
    /// `validatingadmissionpolicybindings`.
    Binding,
}

impl Kind {
    /// The resource's plural name.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Policy => "validatingadmissionpolicies",
            Kind::Binding => "validatingadmissionpolicybindings",
        }
    }

    /// The kind's name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Policy => "ValidatingAdmissionPolicy",
            Kind::Binding => "ValidatingAdmissionPolicyBinding",
        }
    }
}

/// An API server's answer that is an error (its description).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyApiError(pub String);

/// What the check reads from the API server.
#[async_trait]
pub trait PolicyApi: Send + Sync {
    /// The resources [`API_VERSION`] serves (plural names); `Ok(None)` when the API server
    /// does not serve that group version at all.
    async fn served(&self) -> Result<Option<Vec<String>>, PolicyApiError>;
    /// The object `name` of `kind`, as JSON; `Ok(None)` when there is none.
    async fn get(&self, kind: Kind, name: &str) -> Result<Option<Value>, PolicyApiError>;
    /// Whether `user` in `groups` may `create` `certificatesigningrequests/<subresource>` (a
    /// SubjectAccessReview).
    async fn may_create_csr(
        &self,
        user: &str,
        groups: &[String],
        subresource: &str,
    ) -> Result<bool, PolicyApiError>;
}

/// The user a bootstrap token of the flex group is asked about as (any token id reads the
/// same to RBAC: bindings name groups).
pub const PROBE_TOKEN_USER: &str = "system:bootstrap:probe0";

/// Why the daemons' policies are not enforced.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyGap {
    /// Discovery failed.
    #[error("cannot list the resources of {API_VERSION}: {0}")]
    Discovery(PolicyApiError),
    /// The API server does not serve the kind (older than 1.30, or the API turned off).
    #[error(
        "the API server serves no {API_VERSION} {0} (Kubernetes 1.30 or later is needed): nothing stops a node's daemon from finishing, claiming or deleting another node's MachineOperations"
    )]
    NotServed(&'static str),
    /// An object could not be read.
    #[error("cannot read {kind} {name}: {cause}")]
    Unreadable {
        /// The kind.
        kind: &'static str,
        /// The name.
        name: &'static str,
        /// The API server's answer.
        cause: PolicyApiError,
    },
    /// An object is not there.
    #[error(
        "{kind} {name} is not there: apply deploy/controller (admission.yaml, disruption.yaml)"
    )]
    Missing {
        /// The kind.
        kind: &'static str,
        /// The name.
        name: &'static str,
    },
    /// A policy lets requests through when it cannot be evaluated.
    #[error(
        "ValidatingAdmissionPolicy {name} has failurePolicy {found}, not Fail: a policy that cannot be evaluated lets the request through"
    )]
    FailsOpen {
        /// The policy.
        name: &'static str,
        /// Its failurePolicy.
        found: String,
    },
    /// A binding binds another policy.
    #[error("ValidatingAdmissionPolicyBinding {name} binds policy {found:?}, not {name}")]
    BindsOther {
        /// The binding.
        name: &'static str,
        /// The policy it binds.
        found: String,
    },
    /// kube-controller-manager would approve kubelet certificates for the flex bootstrap group
    /// without the token's binding.
    #[error(
        "bootstrap tokens in {group} may create certificatesigningrequests/nodeclient, so kube-controller-manager approves a kubelet certificate for any node name with any such token (a token bound to one node gets another's): delete the ClusterRoleBinding that grants it (aks-flex-node-autoapprove-bootstrap from an earlier deploy/controller, or one binding system:certificates.k8s.io:certificatesigningrequests:nodeclient to {group} or system:bootstrappers); the controller approves kubelet's requests itself"
    )]
    KubeletAutoApproval {
        /// The bootstrap group.
        group: String,
    },
    /// The SubjectAccessReview could not be made.
    #[error("cannot ask whether {group} may create certificatesigningrequests/nodeclient: {cause}")]
    AccessUnknown {
        /// The bootstrap group.
        group: String,
        /// The API server's answer.
        cause: PolicyApiError,
    },
    /// A binding does not deny.
    #[error(
        "ValidatingAdmissionPolicyBinding {name} has no Deny among its validationActions: the policy only warns or audits"
    )]
    NoDeny {
        /// The binding.
        name: &'static str,
    },
}

/// Why the policies are not enforced, or `Ok` when each is there, fails closed and is bound
/// with `Deny`.
pub async fn check(api: &dyn PolicyApi) -> Result<(), PolicyGap> {
    let served = api.served().await.map_err(PolicyGap::Discovery)?;
    let served = served.unwrap_or_default();
    for kind in [Kind::Policy, Kind::Binding] {
        if !served.iter().any(|r| r == kind.plural()) {
            return Err(PolicyGap::NotServed(kind.name()));
        }
    }
    for name in POLICIES {
        let read = |kind: Kind| async move {
            api.get(kind, name)
                .await
                .map_err(|cause| PolicyGap::Unreadable {
                    kind: kind.name(),
                    name,
                    cause,
                })?
                .ok_or(PolicyGap::Missing {
                    kind: kind.name(),
                    name,
                })
        };
        let policy = read(Kind::Policy).await?;
        let failure = policy["spec"]["failurePolicy"].as_str().unwrap_or("Fail");
        if failure != "Fail" {
            return Err(PolicyGap::FailsOpen {
                name,
                found: failure.to_string(),
            });
        }
        let binding = read(Kind::Binding).await?;
        let bound = binding["spec"]["policyName"].as_str().unwrap_or_default();
        if bound != *name {
            return Err(PolicyGap::BindsOther {
                name,
                found: bound.to_string(),
            });
        }
        let deny = binding["spec"]["validationActions"]
            .as_array()
            .is_some_and(|a| a.iter().any(|v| v == "Deny"));
        if !deny {
            return Err(PolicyGap::NoDeny { name });
        }
    }
    Ok(())
}

/// Whether kube-controller-manager's own approver would approve kubelet client certificates
/// for bootstrap tokens in `group` (`nodeclient`), which ties no certificate to the token: the
/// hole the controller's approver closes only when nothing else approves. `Ok` when it would not.
pub async fn check_kubelet_approval(api: &dyn PolicyApi, group: &str) -> Result<(), PolicyGap> {
    let groups = [
        "system:bootstrappers".to_string(),
        group.to_string(),
        "system:authenticated".to_string(),
    ];
    match api
        .may_create_csr(PROBE_TOKEN_USER, &groups, "nodeclient")
        .await
    {
        Ok(false) => Ok(()),
        Ok(true) => Err(PolicyGap::KubeletAutoApproval {
            group: group.to_string(),
        }),
        Err(cause) => Err(PolicyGap::AccessUnknown {
            group: group.to_string(),
            cause,
        }),
    }
}

/// [`check`], then, for the flex tokens' `bootstrap_group`, [`check_kubelet_approval`].
pub async fn check_all(
    api: &dyn PolicyApi,
    bootstrap_group: Option<&str>,
) -> Result<(), PolicyGap> {
    check(api).await?;
    match bootstrap_group {
        Some(g) => check_kubelet_approval(api, g).await,
        None => Ok(()),
    }
}

/// Whether the controller is ready (`/readyz`), and why not.
#[derive(Debug, Default)]
pub struct Readiness(RwLock<Option<String>>);

impl Readiness {
    /// Not ready, for `why`.
    pub fn not_ready(why: &str) -> Self {
        Self(RwLock::new(Some(why.to_string())))
    }

    /// Why it is not ready; `None` when it is.
    pub fn why_not(&self) -> Option<String> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sets the state from a check; returns whether it changed.
    pub fn set(&self, checked: Result<(), PolicyGap>) -> bool {
        let new = checked.err().map(|g| g.to_string());
        let mut cur = self.0.write().unwrap_or_else(|e| e.into_inner());
        let changed = *cur != new;
        *cur = new;
        changed
    }
}

/// [`PolicyApi`] over the API server.
pub struct KubePolicyApi(pub kube::Client);

#[async_trait]
impl PolicyApi for KubePolicyApi {
    async fn served(&self) -> Result<Option<Vec<String>>, PolicyApiError> {
        match self.0.list_api_group_resources(API_VERSION).await {
            Ok(list) => Ok(Some(list.resources.into_iter().map(|r| r.name).collect())),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(PolicyApiError(flex_api::kube_errors::describe(&e))),
        }
    }

    async fn get(&self, kind: Kind, name: &str) -> Result<Option<Value>, PolicyApiError> {
        let (group, version) = API_VERSION.split_once('/').unwrap_or(("", API_VERSION));
        let resource = kube::api::ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: API_VERSION.into(),
            kind: kind.name().into(),
            plural: kind.plural().into(),
        };
        let api: kube::Api<kube::api::DynamicObject> =
            kube::Api::all_with(self.0.clone(), &resource);
        match api.get_opt(name).await {
            Ok(o) => Ok(o.map(|o| o.data)),
            Err(e) => Err(PolicyApiError(flex_api::kube_errors::describe(&e))),
        }
    }

    async fn may_create_csr(
        &self,
        user: &str,
        groups: &[String],
        subresource: &str,
    ) -> Result<bool, PolicyApiError> {
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
        };
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.to_string()),
                groups: Some(groups.to_vec()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some("certificates.k8s.io".into()),
                    resource: Some("certificatesigningrequests".into()),
                    subresource: Some(subresource.into()),
                    verb: Some("create".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(self.0.clone());
        match api.create(&kube::api::PostParams::default(), &review).await {
            Ok(r) => Ok(r.status.is_some_and(|s| s.allowed)),
            Err(e) => Err(PolicyApiError(flex_api::kube_errors::describe(&e))),
        }
    }
}

/// Checks the policies at once and every [`RECHECK`] until `stop`, keeping `ready` up to date
/// and logging each change.
/// With `bootstrap_group`, it also checks that kube-controller-manager does not approve kubelet
/// certificates for that group ([`check_kubelet_approval`]).
pub async fn watch(
    api: &dyn PolicyApi,
    ready: &Readiness,
    bootstrap_group: Option<&str>,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        let checked = check_all(api, bootstrap_group).await;
        let why = checked.as_ref().err().map(ToString::to_string);
        if ready.set(checked) {
            match why {
                Some(why) => {
                    tracing::error!(reason = %why, "not ready: a node's boundary is not enforced")
                }
                None => {
                    tracing::info!(policies = ?POLICIES, kubelet_approval_checked = bootstrap_group.is_some(), "ready: the daemons' admission policies are enforced, and only the controller approves the flex tokens' kubelet certificates")
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(RECHECK) => {}
            () = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests;
