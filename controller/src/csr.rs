//! The optional CSR approver (`--enable-csr-approver`): approves the agent daemon's
//! client-certificate requests (signer `kubernetes.io/kube-apiserver-client`), as unbounded's
//! `daemoncred` approver with AKSFlexNode's `AuthorizeBootstrap` / `AuthorizeRenewal`, and
//! kubelet's client-certificate requests (signer `kubernetes.io/kube-apiserver-client-kubelet`)
//! under the same token binding: kube-controller-manager's own approver (`nodeclient`) would
//! approve any node's certificate for any token in a bound group, so `deploy/controller` no
//! longer binds it for the flex bootstrap group.
//!
//! A kubelet request ([`Credential::Kubelet`]) differs from the daemon's in its subject and
//! lifetime only: organizations exactly `system:nodes`, and no `expirationSeconds` needed
//! (kubelet never asks for one; the signer's `--cluster-signing-duration` applies, a year by
//! default); one asked for is capped like the daemon's. Its bootstrap checks are the daemon's,
//! its single-use record `<token-id>.kubelet`; its renewal comes from `system:node:<node>` in
//! `system:nodes` (kubelet with its own certificate, or the daemon for its kubelet).
//!
//! A request is ours when it is pending (no `Approved`/`Denied` condition, no certificate), is
//! for the signer above, and its PKCS#10 request (signature verified) asks for CN
//! `system:node:<node>`, organizations within {`system:nodes`, daemon group} including the
//! daemon group, no subject alternative names, and usages within {digital signature, key
//! encipherment, client auth} including client auth. With `--max-expiration-seconds` > 0 (30
//! days unless set) it must ask for a lifetime (`expirationSeconds`) of at most that. Then, by
//! requester:
//! - **bootstrap** (`system:bootstrap:<token-id>` in the bootstrap group): the Secret
//!   `kube-system/bootstrap-token-<token-id>` must exist, be of type
//!   `bootstrap.kubernetes.io/token`, have `token-id` = the id, a non-empty `token-secret`,
//!   `usage-bootstrap-authentication` = `true` (any case), the bootstrap group in
//!   `auth-extra-groups` (comma list, trimmed), and an `expiration` that is empty or an RFC 3339
//!   time in the future (unparseable = expired); the machine must exist and its entry must name
//!   this token id in its `aks-flex-bootstrap-token-id` tag (a token bootstraps one node, not
//!   any registered one); and the node must not already hold an unexpired daemon certificate
//!   issued through a request the API still has (a node renews with its certificate: a
//!   leaked token does not get a second certificate for a node that joined; after a reset an
//!   administrator re-admits the node by deleting that request, named in the log);
//! - **renewal** (`system:node:<node>` in the daemon group, the same node as requested): the
//!   machine must exist.
//!
//! Anything else is left alone (never denied: an administrator may still decide). A request
//! whose machine is not (yet) in the store, or whose checks hit an API error, is looked at
//! again after [`RETRY_AFTER`]. The decisions are pure functions ([`examine`],
//! [`authorize_bootstrap_token`]) with table tests; [`run`] drives them from a watch.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use flex_api::arm::{ArmMachine, BOOTSTRAP_TOKEN_ID_TAG};
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;

use crate::metrics::{ControllerMetrics, DecisionLabel, Why};
use crate::store::{MachineStore, StoreError};

/// The signer the daemon's certificates use.
pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client";
/// The signer of kubelet's client certificates (kube-controller-manager signs them; its own
/// approver approves only for groups bound to `certificatesigningrequests:nodeclient`, which
/// `deploy/controller` no longer binds for the flex bootstrap group).
pub const KUBELET_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// Bootstrap token users: `system:bootstrap:<token-id>`.
pub const BOOTSTRAP_USER_PREFIX: &str = "system:bootstrap:";
/// Node users and common names: `system:node:<node>`.
pub const NODE_USER_PREFIX: &str = "system:node:";
/// The nodes group.
pub const NODES_GROUP: &str = "system:nodes";
/// The bootstrap token Secret type.
pub const BOOTSTRAP_TOKEN_TYPE: &str = "bootstrap.kubernetes.io/token";
/// Where bootstrap token Secrets live.
pub const TOKEN_NAMESPACE: &str = "kube-system";
/// When a request that may become approvable is looked at again the first time; each look
/// that finds it still not approvable doubles the wait, up to [`RETRY_MAX`] ([`Retries`]).
pub const RETRY_AFTER: Duration = Duration::from_secs(15);
/// The longest wait between two looks at a request that is not approvable.
pub const RETRY_MAX: Duration = Duration::from_secs(15 * 60);
/// How the waits between looks at a request that is not approvable grow.
pub const RETRY_BACKOFF: flex_host::retry::Backoff =
    flex_host::retry::Backoff::new(u32::MAX, RETRY_AFTER, RETRY_MAX);

/// The requests the approver looks at again, by UID: how often each was found not approvable,
/// and why the last time, so each request's wait grows ([`RETRY_BACKOFF`]) and its reason is
/// logged when it changes, not at every look. A request approved, ignored or gone is forgotten;
/// one not looked at for a day (deleted meanwhile) is dropped at the next look at any.
#[derive(Debug, Default)]
pub struct Retries {
    seen: std::collections::HashMap<String, (u32, String, std::time::Instant)>,
}

/// What [`Retries::not_yet`] says about one more look that found a request not approvable.
#[derive(Debug, PartialEq, Eq)]
pub struct NextLook {
    /// When to look again.
    pub after: Duration,
    /// Whether the reason is new for this request (log it at info; else debug).
    pub new_reason: bool,
}

impl Retries {
    /// Entries older than this are dropped.
    const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);

    /// Request `uid` was found not approvable, for `why`, at `now`.
    pub fn not_yet(&mut self, uid: &str, why: &str, now: std::time::Instant) -> NextLook {
        self.seen
            .retain(|_, (_, _, at)| now.saturating_duration_since(*at) < Self::FORGET_AFTER);
        let entry = self
            .seen
            .entry(uid.to_string())
            .or_insert_with(|| (0, String::new(), now));
        entry.0 = entry.0.saturating_add(1);
        entry.2 = now;
        let new_reason = entry.1 != why;
        if new_reason {
            entry.1 = why.to_string();
        }
        NextLook {
            after: RETRY_BACKOFF.delay(entry.0, None),
            new_reason,
        }
    }

    /// Request `uid` needs no more looks.
    pub fn forget(&mut self, uid: &str) {
        self.seen.remove(uid);
    }

    /// How many requests are being looked at again.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}
/// The default `--max-expiration-seconds`: 30 days (the agent asks for 30 days and rotates at
/// 80 % of that, six days before expiry).
pub const DEFAULT_MAX_EXPIRATION_SECONDS: i32 = 30 * 24 * 3600;

/// The approver's settings (the controller's flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApproverConfig {
    /// `--bootstrap-group`.
    pub bootstrap_group: String,
    /// `--daemon-group`.
    pub daemon_group: String,
    /// `--max-expiration-seconds` (0: no limit).
    pub max_expiration_seconds: i32,
}

/// Who asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requester {
    /// A bootstrap token.
    Bootstrap {
        /// The token id.
        token_id: String,
    },
    /// The node itself, with a certificate it holds: the daemon renewing its own, or (for
    /// kubelet's credential) kubelet renewing its own.
    Renewal,
}

/// Which credential a request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credential {
    /// The daemon's ([`SIGNER`]; organizations within {`system:nodes`, daemon group},
    /// including the daemon group).
    Daemon,
    /// kubelet's ([`KUBELET_SIGNER`]; organization exactly `system:nodes`).
    Kubelet,
}

impl Credential {
    /// The signer its requests name.
    pub fn signer(self) -> &'static str {
        match self {
            Credential::Daemon => SIGNER,
            Credential::Kubelet => KUBELET_SIGNER,
        }
    }

    /// How messages name it.
    pub fn noun(self) -> &'static str {
        match self {
            Credential::Daemon => "daemon",
            Credential::Kubelet => "kubelet client",
        }
    }

    /// The key of [`ISSUED_CONFIGMAP`] that records `token_id` used for this credential: the
    /// token id itself for the daemon's (as before kubelet's were approved here),
    /// `<token-id>.kubelet` for kubelet's.
    pub fn record_key(self, token_id: &str) -> String {
        match self {
            Credential::Daemon => token_id.to_string(),
            Credential::Kubelet => format!("{token_id}.kubelet"),
        }
    }

    /// The `Approved` condition's reason.
    pub fn approve_reason(self) -> &'static str {
        match self {
            Credential::Daemon => "AKSFlexNodeDaemonApprove",
            Credential::Kubelet => "AKSFlexNodeKubeletApprove",
        }
    }
}

/// A request that passed the checks that need no API call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The node the certificate is for.
    pub node: String,
    /// Who asks.
    pub requester: Requester,
    /// Which credential.
    pub credential: Credential,
}

/// What to do with a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Approve it (the message goes into the condition).
    Approve(String),
    /// Not ours or not approvable: leave it (the reason is logged).
    Ignore(String),
    /// Possibly approvable later: look again.
    Retry(String),
}

/// The subject and SANs of a PKCS#10 request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestSubject {
    /// Common names.
    pub common_names: Vec<String>,
    /// Organizations.
    pub organizations: Vec<String>,
    /// Whether any subject alternative name is requested.
    pub has_sans: bool,
}

/// Why a PEM `CERTIFICATE REQUEST` is not one to look at (the parsers' messages kept).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Not PEM.
    #[error("not PEM: {0}")]
    NotPem(String),
    /// A PEM block of another kind (its label).
    #[error("PEM block is {0:?}, want CERTIFICATE REQUEST")]
    Label(String),
    /// Not PKCS#10 DER.
    #[error("not a PKCS#10 request: {0}")]
    NotPkcs10(String),
    /// Its signature does not verify with its own key.
    #[error("request signature does not verify: {0}")]
    Signature(String),
    /// A subject attribute that is not a string.
    #[error("subject attribute: {0}")]
    Attribute(String),
}

/// Why a request is not one this approver approves ([`examine`]): not ours, already decided,
/// or asking for more than a daemon credential. The approver leaves such a request alone.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// It has an `Approved` or `Denied` condition (which).
    #[error("already {0}")]
    Decided(String),
    /// It has a certificate.
    #[error("already issued")]
    Issued,
    /// For another signer.
    #[error("signer {0:?} is neither {SIGNER} nor {KUBELET_SIGNER}")]
    Signer(String),
    /// The PKCS#10 request does not parse or verify.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// Not exactly one common name (how many).
    #[error("request has {0} common names, want one")]
    CommonNames(usize),
    /// The common name is not `system:node:<node>`.
    #[error("common name {0:?} is not {NODE_USER_PREFIX}<node>")]
    CommonName(String),
    /// The daemon group is not among the organizations.
    #[error("organizations {organizations:?} do not include the daemon group {group:?}")]
    NoDaemonGroup {
        /// The organizations asked for.
        organizations: Vec<String>,
        /// The daemon group.
        group: String,
    },
    /// An organization beyond the daemon group and `system:nodes`.
    #[error("organization {0:?} is not allowed")]
    Organization(String),
    /// A kubelet request whose usages are not exactly what kube-controller-manager's kubelet
    /// signer signs.
    #[error(
        "a kubelet client request's usages are {0:?}, want digital signature and client auth (and key encipherment)"
    )]
    KubeletUsages(Vec<String>),
    /// A kubelet request from the daemon's identity.
    #[error(
        "a kubelet client request from an identity in {0:?} (the daemon's): kubelet renews with its own certificate"
    )]
    DaemonForKubelet(String),
    /// A kubelet request whose organizations are not exactly `system:nodes` (what it has).
    #[error("a kubelet client request's organizations are {0:?}, want exactly [\"system:nodes\"]")]
    KubeletOrganizations(Vec<String>),
    /// Subject alternative names asked for.
    #[error("subject alternative names are not allowed")]
    Sans,
    /// `client auth` is not among the usages.
    #[error("usages {0:?} do not include client auth")]
    NoClientAuth(Vec<String>),
    /// A usage beyond a client certificate's.
    #[error("usage {0:?} is not allowed")]
    Usage(String),
    /// A lifetime over the maximum.
    #[error("expirationSeconds {asked} exceeds the maximum {max}")]
    LifetimeTooLong {
        /// Asked for.
        asked: i32,
        /// Allowed.
        max: i32,
    },
    /// No lifetime asked for, where a maximum is set.
    #[error("expirationSeconds is unset; at most {0} is allowed")]
    LifetimeUnset(i32),
    /// A bootstrap user outside the bootstrap group.
    #[error("bootstrap user {user:?} is not in the bootstrap group {group:?}")]
    NotBootstrapGroup {
        /// The requester.
        user: String,
        /// The bootstrap group.
        group: String,
    },
    /// `system:bootstrap:` with no token id.
    #[error("bootstrap user has no token id")]
    NoTokenId,
    /// Neither a bootstrap token nor the node itself renewing.
    #[error(
        "requester {user:?} is neither a bootstrap token in {bootstrap_group:?} nor {NODE_USER_PREFIX}{node} in {group:?}"
    )]
    Requester {
        /// The requester.
        user: String,
        /// The node asked for.
        node: String,
        /// The bootstrap group.
        bootstrap_group: String,
        /// The group a renewal's requester must be in: the daemon group for the daemon's
        /// credential, `system:nodes` for kubelet's.
        group: String,
    },
}

/// Why a bootstrap token's Secret (`kube-system/<name>`) does not authorize a request
/// ([`authorize_bootstrap_token`]). Never holds the token's secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefusal {
    /// There is no such Secret.
    #[error("secret {TOKEN_NAMESPACE}/{0} does not exist")]
    Missing(String),
    /// Not a bootstrap token Secret.
    #[error("secret {name} has type {found:?}, want {BOOTSTRAP_TOKEN_TYPE}")]
    Type {
        /// The Secret.
        name: String,
        /// Its type.
        found: String,
    },
    /// Its `token-id` is another.
    #[error("secret {name} token-id {found:?} does not match {want:?}")]
    TokenId {
        /// The Secret.
        name: String,
        /// Its `token-id`.
        found: String,
        /// The requester's.
        want: String,
    },
    /// No `token-secret`.
    #[error("secret {0} has an empty token-secret")]
    EmptySecret(String),
    /// `usage-bootstrap-authentication` is not `true`.
    #[error(
        "secret {name} is not usable for authentication (usage-bootstrap-authentication is {found:?})"
    )]
    NotForAuthentication {
        /// The Secret.
        name: String,
        /// The value.
        found: String,
    },
    /// The bootstrap group is not in `auth-extra-groups`.
    #[error("secret {name} auth-extra-groups {found:?} do not include {group:?}")]
    Groups {
        /// The Secret.
        name: String,
        /// `auth-extra-groups`.
        found: String,
        /// The bootstrap group.
        group: String,
    },
    /// It is in a group beside the bootstrap group.
    #[error(
        "secret {name} auth-extra-groups include {found:?} beside {group:?}: a flex bootstrap token is in the flex group only (another group may be bound to kube-controller-manager's nodeclient approval, which would approve a kubelet certificate for any node with it)"
    )]
    OtherGroup {
        /// The Secret.
        name: String,
        /// The other group.
        found: String,
        /// The bootstrap group.
        group: String,
    },
    /// Its `expiration` has passed.
    #[error("secret {name} expired at {at}")]
    Expired {
        /// The Secret.
        name: String,
        /// `expiration`.
        at: String,
    },
    /// Its `expiration` is not a time (taken as expired).
    #[error("secret {name} expiration {value:?} is not RFC 3339 (treated as expired)")]
    BadExpiration {
        /// The Secret.
        name: String,
        /// `expiration`.
        value: String,
    },
}

/// Why a machine's entry does not let a bootstrap token bootstrap its node
/// ([`authorize_token_for_machine`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BindingRefusal {
    /// The entry names another token.
    #[error("machine {node:?} may be bootstrapped only with bootstrap token {bound}, not {token}")]
    OtherToken {
        /// The node.
        node: String,
        /// The token id its entry names.
        bound: String,
        /// The requester's token id.
        token: String,
    },
    /// The entry names no token.
    #[error(
        "machine {0:?} names no bootstrap token (tag {BOOTSTRAP_TOKEN_ID_TAG} in its entry), so no bootstrap token may bootstrap it"
    )]
    Unbound(String),
}

/// Parses and verifies a PEM `CERTIFICATE REQUEST`.
pub fn parse_request(pem: &[u8]) -> Result<RequestSubject, RequestError> {
    use x509_parser::prelude::*;
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(pem).map_err(|e| RequestError::NotPem(e.to_string()))?;
    if pem.label != "CERTIFICATE REQUEST" {
        return Err(RequestError::Label(pem.label));
    }
    let (_, csr) = X509CertificationRequest::from_der(&pem.contents)
        .map_err(|e| RequestError::NotPkcs10(e.to_string()))?;
    csr.verify_signature()
        .map_err(|e| RequestError::Signature(e.to_string()))?;
    let subject = &csr.certification_request_info.subject;
    let strings = |it: &mut dyn Iterator<Item = &AttributeTypeAndValue<'_>>| {
        it.map(|a| {
            a.as_str()
                .map(str::to_string)
                .map_err(|e| RequestError::Attribute(e.to_string()))
        })
        .collect::<Result<Vec<String>, RequestError>>()
    };
    let common_names = strings(&mut subject.iter_common_name())?;
    let organizations = strings(&mut subject.iter_organization())?;
    let has_sans = csr.requested_extensions().is_some_and(|mut exts| {
        exts.any(|e| match e {
            ParsedExtension::SubjectAlternativeName(san) => !san.general_names.is_empty(),
            _ => false,
        })
    });
    Ok(RequestSubject {
        common_names,
        organizations,
        has_sans,
    })
}

fn has_condition(csr: &CertificateSigningRequest, kinds: &[&str]) -> Option<String> {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| kinds.contains(&c.type_.as_str())))
        .map(|c| c.type_.clone())
}

/// The checks that need no API call: state, signer, request contents, usages, lifetime and
/// requester. `Err` is why the request is not ours or not approvable.
pub fn examine(
    csr: &CertificateSigningRequest,
    cfg: &ApproverConfig,
) -> Result<Candidate, Refusal> {
    if let Some(c) = has_condition(csr, &["Approved", "Denied"]) {
        return Err(Refusal::Decided(c));
    }
    if csr
        .status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty())
    {
        return Err(Refusal::Issued);
    }
    let spec = &csr.spec;
    let credential = match spec.signer_name.as_str() {
        SIGNER => Credential::Daemon,
        KUBELET_SIGNER => Credential::Kubelet,
        other => return Err(Refusal::Signer(other.to_string())),
    };
    let subject = parse_request(&spec.request.0)?;
    let [cn] = subject.common_names.as_slice() else {
        return Err(Refusal::CommonNames(subject.common_names.len()));
    };
    let node = cn
        .strip_prefix(NODE_USER_PREFIX)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Refusal::CommonName(cn.clone()))?
        .to_string();
    match credential {
        Credential::Daemon => {
            if !subject.organizations.contains(&cfg.daemon_group) {
                return Err(Refusal::NoDaemonGroup {
                    organizations: subject.organizations,
                    group: cfg.daemon_group.clone(),
                });
            }
            if let Some(o) = subject
                .organizations
                .iter()
                .find(|o| **o != cfg.daemon_group && *o != NODES_GROUP)
            {
                return Err(Refusal::Organization(o.clone()));
            }
        }
        // As kube-controller-manager's kubelet signer and nodeclient recognizer require.
        Credential::Kubelet => {
            if subject.organizations != [NODES_GROUP] {
                return Err(Refusal::KubeletOrganizations(subject.organizations));
            }
        }
    }
    if subject.has_sans {
        return Err(Refusal::Sans);
    }
    let usages = spec.usages.clone().unwrap_or_default();
    if !usages.iter().any(|u| u == "client auth") {
        return Err(Refusal::NoClientAuth(usages));
    }
    if let Some(u) = usages.iter().find(|u| {
        !matches!(
            u.as_str(),
            "digital signature" | "key encipherment" | "client auth"
        )
    }) {
        return Err(Refusal::Usage(u.clone()));
    }
    // kube-controller-manager's kubelet signer fails any other set after the approval (and the
    // token's single use would be spent on a request that never gets its certificate).
    if credential == Credential::Kubelet {
        let mut set: Vec<&str> = usages.iter().map(String::as_str).collect();
        set.sort_unstable();
        set.dedup();
        let allowed: [&[&str]; 2] = [
            &["client auth", "digital signature"],
            &["client auth", "digital signature", "key encipherment"],
        ];
        if !allowed.contains(&set.as_slice()) {
            return Err(Refusal::KubeletUsages(usages));
        }
    }
    if cfg.max_expiration_seconds > 0 {
        match spec.expiration_seconds {
            Some(s) if s <= cfg.max_expiration_seconds => {}
            Some(s) => {
                return Err(Refusal::LifetimeTooLong {
                    asked: s,
                    max: cfg.max_expiration_seconds,
                });
            }
            // kubelet never asks for a lifetime: its certificate lives as long as
            // kube-controller-manager's --cluster-signing-duration (a year unless set).
            None if credential == Credential::Kubelet => {}
            None => return Err(Refusal::LifetimeUnset(cfg.max_expiration_seconds)),
        }
    }
    let username = spec.username.clone().unwrap_or_default();
    let groups = spec.groups.clone().unwrap_or_default();
    if let Some(id) = username.strip_prefix(BOOTSTRAP_USER_PREFIX) {
        if !groups.contains(&cfg.bootstrap_group) {
            return Err(Refusal::NotBootstrapGroup {
                user: username.clone(),
                group: cfg.bootstrap_group.clone(),
            });
        }
        if id.is_empty() {
            return Err(Refusal::NoTokenId);
        }
        return Ok(Candidate {
            node,
            requester: Requester::Bootstrap {
                token_id: id.to_string(),
            },
            credential,
        });
    }
    // The daemon renews with its daemon certificate; kubelet with its kubelet certificate
    // (and the daemon, whose certificate is also in system:nodes, may ask for its kubelet's).
    let renewal_group = match credential {
        Credential::Daemon => cfg.daemon_group.as_str(),
        Credential::Kubelet => NODES_GROUP,
    };
    if username == format!("{NODE_USER_PREFIX}{node}") && groups.iter().any(|g| g == renewal_group)
    {
        // kubelet renews with its own certificate. The daemon's (30 days) must not turn into
        // kubelet's, which lives as long as the signer allows (a year by default) and renews
        // itself: the agent never asks for one so.
        if credential == Credential::Kubelet && groups.contains(&cfg.daemon_group) {
            return Err(Refusal::DaemonForKubelet(cfg.daemon_group.clone()));
        }
        return Ok(Candidate {
            node,
            requester: Requester::Renewal,
            credential,
        });
    }
    Err(Refusal::Requester {
        user: username,
        node,
        bootstrap_group: cfg.bootstrap_group.clone(),
        group: renewal_group.to_string(),
    })
}

/// `AuthorizeBootstrap`'s Secret checks: `secret` is `kube-system/bootstrap-token-<token_id>`
/// (`None`: it does not exist).
pub fn authorize_bootstrap_token(
    secret: Option<&Secret>,
    token_id: &str,
    bootstrap_group: &str,
    now: Timestamp,
) -> Result<(), TokenRefusal> {
    let name = format!("bootstrap-token-{token_id}");
    let Some(secret) = secret else {
        return Err(TokenRefusal::Missing(name));
    };
    if secret.type_.as_deref() != Some(BOOTSTRAP_TOKEN_TYPE) {
        return Err(TokenRefusal::Type {
            name,
            found: secret.type_.clone().unwrap_or_default(),
        });
    }
    let data: BTreeMap<&str, String> = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), String::from_utf8_lossy(&v.0).into_owned()))
        .collect();
    let get = |k: &str| data.get(k).map(String::as_str).unwrap_or_default();
    if get("token-id") != token_id {
        return Err(TokenRefusal::TokenId {
            found: get("token-id").to_string(),
            want: token_id.to_string(),
            name,
        });
    }
    if get("token-secret").is_empty() {
        return Err(TokenRefusal::EmptySecret(name));
    }
    if !get("usage-bootstrap-authentication").eq_ignore_ascii_case("true") {
        return Err(TokenRefusal::NotForAuthentication {
            found: get("usage-bootstrap-authentication").to_string(),
            name,
        });
    }
    if !get("auth-extra-groups")
        .split(',')
        .any(|g| g.trim() == bootstrap_group)
    {
        return Err(TokenRefusal::Groups {
            found: get("auth-extra-groups").to_string(),
            group: bootstrap_group.to_string(),
            name,
        });
    }
    // A group beside the flex one may be bound to kube-controller-manager's `nodeclient`
    // approval (kubeadm's token group is), which approves a kubelet certificate for any node
    // name with the token: the binding this approver checks would be moot.
    if let Some(other) = get("auth-extra-groups")
        .split(',')
        .map(str::trim)
        .find(|g| !g.is_empty() && *g != bootstrap_group)
    {
        return Err(TokenRefusal::OtherGroup {
            found: other.to_string(),
            group: bootstrap_group.to_string(),
            name,
        });
    }
    let expiration = get("expiration").trim();
    if !expiration.is_empty() {
        match expiration.parse::<Timestamp>() {
            Ok(t) if t > now => {}
            Ok(_) => {
                return Err(TokenRefusal::Expired {
                    name,
                    at: expiration.to_string(),
                });
            }
            Err(_) => {
                return Err(TokenRefusal::BadExpiration {
                    name,
                    value: expiration.to_string(),
                });
            }
        }
    }
    Ok(())
}

/// Whether `machine`'s entry lets bootstrap token `token_id` bootstrap `node`: its
/// [`BOOTSTRAP_TOKEN_ID_TAG`] tag names that token.
pub fn authorize_token_for_machine(
    machine: &ArmMachine,
    node: &str,
    token_id: &str,
) -> Result<(), BindingRefusal> {
    match machine.bootstrap_token_id() {
        Some(id) if id == token_id => Ok(()),
        Some(id) => Err(BindingRefusal::OtherToken {
            node: node.to_string(),
            bound: id.to_string(),
            token: token_id.to_string(),
        }),
        None => Err(BindingRefusal::Unbound(node.to_string())),
    }
}

/// An unexpired certificate of `signer` that `node` already holds: among `csrs`, those for
/// `signer` with an issued certificate whose subject is `system:node:<node>` and whose
/// `notAfter` is after `now`; the one that expires last, as (request name, `notAfter`).
pub fn held_certificate(
    node: &str,
    signer: &str,
    csrs: &[CertificateSigningRequest],
    now: Timestamp,
) -> Option<(String, Timestamp)> {
    let cn = format!("{NODE_USER_PREFIX}{node}");
    csrs.iter()
        .filter(|c| c.spec.signer_name == signer)
        .filter_map(|c| {
            let pem = c.status.as_ref()?.certificate.as_ref()?;
            let (subject_cn, not_after) = certificate_subject(&pem.0)?;
            (subject_cn == cn && not_after > now)
                .then(|| (c.metadata.name.clone().unwrap_or_default(), not_after))
        })
        .max_by_key(|(_, t)| *t)
}

/// Another request for `signer` and `system:node:<node>` that is approved (neither denied nor
/// failed) and has no certificate yet: one the signer is about to issue. It counts as held, so
/// two requests of one token are not both approved between an approval and its signature.
/// `self_name` is the request being decided.
pub fn approved_unsigned(
    node: &str,
    signer: &str,
    self_name: &str,
    csrs: &[CertificateSigningRequest],
) -> Option<String> {
    let cn = format!("{NODE_USER_PREFIX}{node}");
    csrs.iter()
        .filter(|c| c.spec.signer_name == signer)
        .filter(|c| c.metadata.name.as_deref() != Some(self_name))
        .filter(|c| {
            c.status
                .as_ref()
                .is_none_or(|s| s.certificate.as_ref().is_none_or(|b| b.0.is_empty()))
        })
        .filter(|c| {
            has_condition(c, &["Approved"]).is_some()
                && has_condition(c, &["Denied", "Failed"]).is_none()
        })
        .find(|c| parse_request(&c.spec.request.0).is_ok_and(|r| r.common_names.contains(&cn)))
        .map(|c| c.metadata.name.clone().unwrap_or_default())
}

/// The common name and `notAfter` of the first certificate in `pem`.
fn certificate_subject(pem: &[u8]) -> Option<(String, Timestamp)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    let not_after = Timestamp::from_second(cert.validity().not_after.timestamp()).ok()?;
    Some((cn, not_after))
}

async fn machine(store: &dyn MachineStore, node: &str) -> Result<ArmMachine, (Decision, Why)> {
    match store.get(node).await {
        Ok(m) => Ok(m),
        Err(StoreError::NotFound(_)) => Err((
            Decision::Retry(format!("machine {node:?} is not registered")),
            Why::machine_not_registered,
        )),
        Err(StoreError::Unavailable(e)) => Err((
            Decision::Retry(format!("machine store unavailable: {e}")),
            Why::store_unavailable,
        )),
    }
}

/// What [`decide`] reads from the API: bootstrap token Secrets, the daemon-signer requests and
/// the record of the tokens used ([`ISSUED_CONFIGMAP`]).
pub struct Apis {
    /// `kube-system` Secrets.
    pub secrets: Api<Secret>,
    /// All CertificateSigningRequests.
    pub csrs: Api<CertificateSigningRequest>,
    /// `kube-system` ConfigMaps (only [`ISSUED_CONFIGMAP`] is read and written).
    pub configmaps: Api<k8s_openapi::api::core::v1::ConfigMap>,
}

/// The ConfigMap (in [`TOKEN_NAMESPACE`], `deploy/controller/configmap.yaml`) that records each
/// bootstrap token that got a certificate: key [`Credential::record_key`] (the token id for the
/// daemon's, `<token-id>.kubelet` for kubelet's), value `{"node": …, "request": …}`
/// ([`IssuedToken`]). Written before the approval, so a token gets one certificate of each kind
/// for good, also after kube-controller-manager deletes the issued request an hour later.
pub const ISSUED_CONFIGMAP: &str = "aks-flex-issued-tokens";

/// One entry of [`ISSUED_CONFIGMAP`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IssuedToken {
    /// The node the certificate was for.
    pub node: String,
    /// The CertificateSigningRequest approved.
    pub request: String,
}

/// The merge patch that records `token_id` as used for `issued`, under `credential`'s key.
pub fn issued_patch(
    token_id: &str,
    credential: Credential,
    issued: &IssuedToken,
) -> serde_json::Value {
    serde_json::json!({
        "data": { credential.record_key(token_id): serde_json::to_string(issued).unwrap_or_default() }
    })
}

/// Why `token_id` may not bootstrap the request `request` for `credential`:
/// [`ISSUED_CONFIGMAP`]'s `data` (`None`: the ConfigMap is missing) records it used for another
/// request of that credential. The request it was recorded for may still be approved (its
/// approval failed after the record was written).
pub fn token_used(
    data: Option<&BTreeMap<String, String>>,
    token_id: &str,
    credential: Credential,
    request: &str,
) -> Option<String> {
    let key = credential.record_key(token_id);
    let noun = credential.noun();
    let Some(data) = data else {
        return Some(format!(
            "ConfigMap {TOKEN_NAMESPACE}/{ISSUED_CONFIGMAP}, the record of the bootstrap tokens used, is missing: apply deploy/controller"
        ));
    };
    let raw = data.get(&key)?;
    let entry: Option<IssuedToken> = serde_json::from_str(raw).ok();
    match entry {
        Some(e) if e.request == request => None,
        Some(e) => Some(format!(
            "bootstrap token {token_id} already got a {noun} certificate, for node {} (CertificateSigningRequest {}): a token is used once; give the node a new bootstrap token, or remove key {key} of ConfigMap {TOKEN_NAMESPACE}/{ISSUED_CONFIGMAP} to let it be used once more",
            e.node, e.request
        )),
        None => Some(format!(
            "key {key} of ConfigMap {TOKEN_NAMESPACE}/{ISSUED_CONFIGMAP} is not a record of a use; the token counts as used"
        )),
    }
}

/// The whole decision for one request: [`examine`], then (bootstrap) the Secret, the machine
/// and its token binding, and the certificates the node already holds; (renewal) the machine.
pub async fn decide(
    csr: &CertificateSigningRequest,
    cfg: &ApproverConfig,
    apis: &Apis,
    store: &dyn MachineStore,
    now: Timestamp,
) -> Decision {
    decide_why(csr, cfg, apis, store, now).await.0
}

/// [`decide`], with why as a closed set (the metrics' reason).
pub async fn decide_why(
    csr: &CertificateSigningRequest,
    cfg: &ApproverConfig,
    apis: &Apis,
    store: &dyn MachineStore,
    now: Timestamp,
) -> (Decision, Why) {
    let candidate = match examine(csr, cfg) {
        Ok(c) => c,
        Err(why) => {
            return (Decision::Ignore(why.to_string()), Why::not_a_daemon_request);
        }
    };
    let credential = candidate.credential;
    let noun = credential.noun();
    let signer = credential.signer();
    match &candidate.requester {
        Requester::Bootstrap { token_id } => {
            let secret = match apis
                .secrets
                .get_opt(&format!("bootstrap-token-{token_id}"))
                .await
            {
                Ok(s) => s,
                Err(e) => {
                    return (
                        Decision::Retry(format!(
                            "read bootstrap token secret: {}",
                            flex_api::kube_errors::describe(&e)
                        )),
                        Why::token_unreadable,
                    );
                }
            };
            if let Err(why) =
                authorize_bootstrap_token(secret.as_ref(), token_id, &cfg.bootstrap_group, now)
            {
                return (Decision::Ignore(why.to_string()), Why::token_refused);
            }
            let entry = match machine(store, &candidate.node).await {
                Ok(m) => m,
                Err(d) => return d,
            };
            if let Err(why) = authorize_token_for_machine(&entry, &candidate.node, token_id) {
                return (Decision::Retry(why.to_string()), Why::token_not_bound);
            }
            let this = csr.metadata.name.as_deref().unwrap_or_default();
            let issued = match apis.configmaps.get_opt(ISSUED_CONFIGMAP).await {
                Ok(cm) => cm,
                Err(e) => {
                    return (
                        Decision::Retry(format!(
                            "read ConfigMap {TOKEN_NAMESPACE}/{ISSUED_CONFIGMAP}: {}",
                            flex_api::kube_errors::describe(&e)
                        )),
                        Why::token_used,
                    );
                }
            };
            let data = issued.map(|cm| cm.data.unwrap_or_default());
            if let Some(why) = token_used(data.as_ref(), token_id, credential, this) {
                return (Decision::Retry(why), Why::token_used);
            }
            let lp = ListParams::default().fields(&format!("spec.signerName={signer}"));
            let others = match apis.csrs.list(&lp).await {
                Ok(l) => l.items,
                Err(e) => {
                    return (
                        Decision::Retry(format!(
                            "list CertificateSigningRequests: {}",
                            flex_api::kube_errors::describe(&e)
                        )),
                        Why::list_failed,
                    );
                }
            };
            if let Some(name) = approved_unsigned(&candidate.node, signer, this, &others) {
                return (
                    Decision::Retry(format!(
                        "node {} has another approved {noun} certificate request awaiting its \
                         certificate (CertificateSigningRequest {name}): a bootstrap token gets \
                         one certificate",
                        candidate.node
                    )),
                    Why::already_holds_certificate,
                );
            }
            if let Some((name, until)) = held_certificate(&candidate.node, signer, &others, now) {
                return (
                    Decision::Retry(format!(
                        "node {} already holds a {noun} certificate, valid until {until} \
                         (CertificateSigningRequest {name}): it renews with that certificate, and a \
                         bootstrap token does not get it another; to bootstrap it again (after a \
                         reset), delete CertificateSigningRequest {name}",
                        candidate.node
                    )),
                    Why::already_holds_certificate,
                );
            }
            (
                Decision::Approve(format!(
                    "aks-flex-controller approved the {noun} credential of node {} (bootstrap token {token_id})",
                    candidate.node
                )),
                match credential {
                    Credential::Daemon => Why::bootstrap,
                    Credential::Kubelet => Why::kubelet_bootstrap,
                },
            )
        }
        Requester::Renewal => {
            match machine(store, &candidate.node).await {
                Ok(_) => {}
                // Every node of the cluster renews kubelet's certificate so: one that is no
                // flex machine is not this approver's (kube-controller-manager's selfnodeclient
                // approval, where bound, is its approver).
                Err((_, Why::machine_not_registered)) if credential == Credential::Kubelet => {
                    return (
                        Decision::Ignore(format!(
                            "machine {:?} is not registered: its kubelet's renewal is not a flex machine's",
                            candidate.node
                        )),
                        Why::machine_not_registered,
                    );
                }
                Err(d) => return d,
            }
            (
                Decision::Approve(format!(
                    "aks-flex-controller approved the {noun} credential renewal of node {}",
                    candidate.node
                )),
                match credential {
                    Credential::Daemon => Why::renewal,
                    Credential::Kubelet => Why::kubelet_renewal,
                },
            )
        }
    }
}

/// Records `token_id` used for `issued` (the request about to be approved) in
/// [`ISSUED_CONFIGMAP`], read afresh and written under its `resourceVersion`: of two approvers
/// deciding at once (two controller pods during a rollout), one records and the other gets a
/// conflict and looks again, to find the token used. A token recorded for another request
/// meanwhile is refused. `Err` says why nothing was recorded (then nothing is approved).
pub async fn record_use(
    configmaps: &Api<k8s_openapi::api::core::v1::ConfigMap>,
    token_id: &str,
    credential: Credential,
    issued: &IssuedToken,
) -> Result<(), RecordError> {
    let cm = configmaps
        .get_opt(ISSUED_CONFIGMAP)
        .await
        .map_err(|e| RecordError::Api(flex_api::kube_errors::describe(&e)))?;
    let data = cm.as_ref().map(|cm| cm.data.clone().unwrap_or_default());
    if let Some(why) = token_used(data.as_ref(), token_id, credential, &issued.request) {
        return Err(RecordError::Used(why));
    }
    let rv = cm
        .and_then(|cm| cm.metadata.resource_version)
        .unwrap_or_default();
    let mut patch = issued_patch(token_id, credential, issued);
    patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
    configmaps
        .patch(
            ISSUED_CONFIGMAP,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
        .map_err(|e| match &e {
            kube::Error::Api(s) if s.code == 409 => {
                RecordError::Conflict(flex_api::kube_errors::describe(&e))
            }
            _ => RecordError::Api(flex_api::kube_errors::describe(&e)),
        })
}

/// Why [`record_use`] recorded nothing (then nothing is approved).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The token is recorded used for another request, or the record is missing or garbled
    /// ([`token_used`]'s reason).
    #[error("{0}")]
    Used(String),
    /// Another approver wrote the record meanwhile (409): look again.
    #[error("it changed meanwhile (another approver recorded a use): {0}")]
    Conflict(String),
    /// The API server's answer to the read or the write.
    #[error("{0}")]
    Api(String),
}

/// `csr` with an `Approved` condition added (`reason`: [`Credential::approve_reason`]).
pub fn approved(
    csr: &CertificateSigningRequest,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> CertificateSigningRequest {
    let mut out = csr.clone();
    let status = out.status.get_or_insert_with(Default::default);
    status
        .conditions
        .get_or_insert_with(Vec::new)
        .push(CertificateSigningRequestCondition {
            type_: "Approved".into(),
            status: "True".into(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            last_update_time: Some(Time(now)),
            last_transition_time: Some(Time(now)),
        });
    out
}

struct Context {
    apis: Apis,
    store: Arc<dyn MachineStore>,
    cfg: ApproverConfig,
    metrics: Arc<ControllerMetrics>,
    retries: std::sync::Mutex<Retries>,
    /// Held from a decision to its approval: the controller reconciles requests concurrently,
    /// and a decision counts the approvals made before it ([`approved_unsigned`]).
    approving: tokio::sync::Mutex<()>,
}

/// A failure to record an approval.
#[derive(Debug, thiserror::Error)]
#[error("approve CertificateSigningRequest {name}: {reason}")]
pub struct ApproveError {
    name: String,
    reason: String,
}

async fn reconcile(
    csr: Arc<CertificateSigningRequest>,
    ctx: Arc<Context>,
) -> Result<Action, ApproveError> {
    let name = csr.metadata.name.clone().unwrap_or_default();
    let uid = csr.metadata.uid.clone().unwrap_or_else(|| name.clone());
    let _one_at_a_time = ctx.approving.lock().await;
    let (decision, reason) = decide_why(
        &csr,
        &ctx.cfg,
        &ctx.apis,
        ctx.store.as_ref(),
        Timestamp::now(),
    )
    .await;
    if !matches!(decision, Decision::Retry(_)) {
        ctx.retries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget(&uid);
    }
    match decision {
        Decision::Approve(message) => {
            // A bootstrap: the token is recorded used before the approval (a crash between
            // the two leaves it used without a certificate, never the other way round).
            let examined = examine(&csr, &ctx.cfg);
            let credential = examined
                .as_ref()
                .map_or(Credential::Daemon, |c| c.credential);
            if let Ok(Candidate {
                requester: Requester::Bootstrap { token_id },
                node,
                credential,
            }) = examined
            {
                let issued = IssuedToken {
                    node,
                    request: name.clone(),
                };
                record_use(&ctx.apis.configmaps, &token_id, credential, &issued)
                    .await
                    .map_err(|why| {
                        ctx.metrics.decision(DecisionLabel::approve_failed, reason);
                        ApproveError {
                            name: name.clone(),
                            reason: format!(
                                "record bootstrap token {token_id} used for a {} certificate in ConfigMap {TOKEN_NAMESPACE}/{ISSUED_CONFIGMAP}: {why}",
                                credential.noun(),
                            ),
                        }
                    })?;
            }
            let body = approved(
                &csr,
                credential.approve_reason(),
                &message,
                Timestamp::now(),
            );
            ctx.apis
                .csrs
                .replace_subresource("approval", &name, &PostParams::default(), &body)
                .await
                .map_err(|e| {
                    ctx.metrics.decision(DecisionLabel::approve_failed, reason);
                    ApproveError {
                        name: name.clone(),
                        reason: flex_api::kube_errors::describe(&e),
                    }
                })?;
            ctx.metrics.decision(DecisionLabel::approved, reason);
            tracing::info!(csr = %name, message = %message, "approved CertificateSigningRequest");
            Ok(Action::await_change())
        }
        Decision::Ignore(why) => {
            ctx.metrics.decision(DecisionLabel::ignored, reason);
            tracing::debug!(csr = %name, reason = %why, "not approving CertificateSigningRequest");
            Ok(Action::await_change())
        }
        Decision::Retry(why) => {
            ctx.metrics.decision(DecisionLabel::retry, reason);
            let next = ctx
                .retries
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .not_yet(&uid, &why, std::time::Instant::now());
            if next.new_reason {
                tracing::info!(csr = %name, reason = %why, retry_in_s = next.after.as_secs(), "CertificateSigningRequest not approvable yet; looked at again less often each time, and logged again only when the reason changes");
            } else {
                tracing::debug!(csr = %name, reason = %why, retry_in_s = next.after.as_secs(), "CertificateSigningRequest still not approvable");
            }
            Ok(Action::requeue(next.after))
        }
    }
}

fn error_policy(
    _csr: Arc<CertificateSigningRequest>,
    e: &ApproveError,
    _ctx: Arc<Context>,
) -> Action {
    tracing::warn!(error = %e, retry_in_s = 10, "CSR approval failed; retrying");
    Action::requeue(Duration::from_secs(10))
}

/// Watches CertificateSigningRequests and approves the daemon's until `shutdown`.
pub async fn run(
    client: kube::Client,
    store: Arc<dyn MachineStore>,
    cfg: ApproverConfig,
    metrics: Arc<ControllerMetrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    tracing::info!(bootstrap_group = %cfg.bootstrap_group, daemon_group = %cfg.daemon_group, "starting daemon CSR approver");
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let ctx = Arc::new(Context {
        apis: Apis {
            csrs: csrs.clone(),
            secrets: Api::namespaced(client.clone(), TOKEN_NAMESPACE),
            configmaps: Api::namespaced(client, TOKEN_NAMESPACE),
        },
        store,
        cfg,
        metrics,
        retries: std::sync::Mutex::new(Retries::default()),
        approving: tokio::sync::Mutex::new(()),
    });
    Controller::new(csrs, watcher::Config::default())
        .graceful_shutdown_on(async move { shutdown.cancelled_owned().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "CSR approver reconcile");
            }
        })
        .await;
    tracing::info!("daemon CSR approver stopped");
    Ok(())
}

#[cfg(test)]
mod tests;
