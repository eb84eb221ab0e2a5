//! The daemon's certificate request: a fresh key pair (ECDSA P-256), a PKCS#10 request for
//! `system:node:<node>` in `system:nodes` and `aks-flex-node-daemons`, the
//! `certificates.k8s.io/v1` `CertificateSigningRequest` that carries it, and the wait for its
//! approval and certificate. Only the request (public key, subject, self-signature) is sent.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::api::{Api, ObjectMeta, PostParams};
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
use sha2::{Digest, Sha256};

use super::{
    CERT_LIFETIME, DAEMON_GROUP, DAEMON_NAME, KubeClientError, NODES_GROUP, SIGNER_NAME, USAGES,
    describe, is_refused,
};
use crate::config::format_go_duration;
use flex_host::retry::{Attempt, Backoff, retry, wait_until};
use flex_host::secret::Secret;

/// The certificate's common name for `node`.
pub fn common_name(node: &str) -> String {
    format!("system:node:{node}")
}

/// A new key pair and its PEM (PKCS#8).
pub(crate) fn generate_key() -> Result<(Secret, KeyPair), KubeClientError> {
    let key =
        KeyPair::generate().map_err(|e| KubeClientError::Crypto(format!("generate key: {e}")))?;
    Ok((Secret::new(key.serialize_pem()), key))
}

/// The PKCS#10 request (PEM) for `node`, signed with `key`: CN `system:node:<node>`, O
/// `system:nodes` and O `aks-flex-node-daemons`.
pub fn csr_pem(key: &KeyPair, node: &str) -> Result<String, KubeClientError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name(node));
    dn.push(DnType::OrganizationName, NODES_GROUP);
    // rcgen keeps one value per attribute type; the same OID (2.5.4.10, organizationName) as a
    // custom type gives the second O.
    dn.push(DnType::CustomDnType(vec![2, 5, 4, 10]), DAEMON_GROUP);
    params.distinguished_name = dn;
    params
        .serialize_request(key)
        .and_then(|r| r.pem())
        .map_err(|e| KubeClientError::Crypto(format!("build certificate request: {e}")))
}

/// The CSR's name: `aks-flex-node-daemon-<16 hex of sha256(node, public key)>`, the same for
/// the same key (a restarted daemon finds its earlier request) and new for a new key.
pub fn csr_name(key: &KeyPair, node: &str) -> String {
    let mut h = Sha256::new();
    h.update(node.as_bytes());
    h.update([0]);
    h.update(key.public_key_raw());
    let digest = hex::encode(h.finalize());
    format!("{DAEMON_NAME}-{}", &digest[..16])
}

/// The `CertificateSigningRequest` for `request_pem`: signer
/// `kubernetes.io/kube-apiserver-client`, usages digital signature and client auth,
/// `expirationSeconds` 30 days ([`CERT_LIFETIME`]).
pub fn csr_resource(name: &str, request_pem: &str) -> CertificateSigningRequest {
    CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "aks-flex-node".to_string(),
            )])),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request_pem.as_bytes().to_vec()),
            signer_name: SIGNER_NAME.to_string(),
            usages: Some(USAGES.iter().map(|u| u.to_string()).collect()),
            expiration_seconds: i32::try_from(CERT_LIFETIME.as_secs()).ok(),
            ..Default::default()
        },
        status: None,
    }
}

/// Where a CSR stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CsrState {
    /// The certificate (PEM).
    Issued(String),
    /// Denied, with the condition's reason and message.
    Denied(String),
    /// Failed, with the condition's reason and message.
    Failed(String),
    /// Waiting; whether it is approved already.
    Pending { approved: bool },
}

/// Reads a CSR's status (pure).
pub(crate) fn csr_state(csr: &CertificateSigningRequest) -> CsrState {
    let status = csr.status.as_ref();
    let conditions = status
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let find = |ty: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == ty && !c.status.eq_ignore_ascii_case("false"))
            .map(|c| {
                let reason = c.reason.clone().unwrap_or_default();
                let message = c.message.clone().unwrap_or_default();
                match (reason.is_empty(), message.is_empty()) {
                    (true, true) => "no reason given".to_string(),
                    (false, true) => reason,
                    (true, false) => message,
                    (false, false) => format!("{reason}: {message}"),
                }
            })
    };
    if let Some(m) = find("Denied") {
        return CsrState::Denied(m);
    }
    if let Some(m) = find("Failed") {
        return CsrState::Failed(m);
    }
    if let Some(cert) = status
        .and_then(|s| s.certificate.as_ref())
        .filter(|c| !c.0.is_empty())
    {
        return CsrState::Issued(String::from_utf8_lossy(&cert.0).into_owned());
    }
    CsrState::Pending {
        approved: find("Approved").is_some(),
    }
}

/// How long the CSR flow waits and polls.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Waits {
    pub wait: Duration,
    pub poll: Duration,
    pub retry_base: Duration,
    pub retry_max: Duration,
}

/// Creates the CSR `name` (an existing one of that name is the same request from before a
/// restart) and waits up to `w.wait` for its certificate. Transient create failures are retried
/// with backoff inside the wait; 401/403 return at once.
pub(crate) async fn request_certificate(
    client: &kube::Client,
    name: &str,
    request_pem: &str,
    w: Waits,
) -> Result<String, KubeClientError> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + w.wait;
    let timeout = format_go_duration(w.wait);
    let resource = csr_resource(name, request_pem);
    // Creation: transient failures retried with backoff until the deadline (the wait after the
    // last failure may pass it by at most `w.retry_max`).
    let backoff = Backoff::new(u32::MAX, w.retry_base, w.retry_max);
    retry("create CertificateSigningRequest", backoff, |_| async {
        match api.create(&PostParams::default(), &resource).await {
            Ok(_) => {
                tracing::info!(
                    csr = name,
                    signer = SIGNER_NAME,
                    "requested daemon client certificate"
                );
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.is_already_exists() || s.code == 409 => {
                tracing::info!(
                    csr = name,
                    "daemon certificate request already exists; waiting for it"
                );
                Ok(())
            }
            Err(e) if is_refused(&e) => Err(Attempt::Fatal(KubeClientError::CreateCsr {
                name: name.to_string(),
                reason: describe(&e),
                refused: true,
            })),
            Err(e) => {
                let last_error = format!("; last error: {}", describe(&e));
                let timed_out = KubeClientError::Timeout {
                    name: name.to_string(),
                    timeout: timeout.clone(),
                    state: "was not created",
                    last_error,
                };
                if tokio::time::Instant::now() >= deadline {
                    Err(Attempt::Fatal(timed_out))
                } else {
                    Err(Attempt::retry(timed_out))
                }
            }
        }
    })
    .await?;
    // Then its state, polled every `w.poll` until issued, denied, failed or the deadline.
    let approved = AtomicBool::new(false);
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    let polled = wait_until("the daemon certificate", left, w.poll, || async {
        match api.get_opt(name).await {
            Ok(Some(csr)) => match csr_state(&csr) {
                CsrState::Issued(cert) => {
                    tracing::info!(csr = name, "daemon client certificate issued");
                    Ok(Ok(cert))
                }
                CsrState::Denied(message) => Ok(Err(KubeClientError::Denied {
                    name: name.to_string(),
                    message,
                })),
                CsrState::Failed(message) => Ok(Err(KubeClientError::Failed {
                    name: name.to_string(),
                    message,
                })),
                CsrState::Pending { approved: a } => {
                    approved.store(a, Ordering::Relaxed);
                    Err(String::new())
                }
            },
            Ok(None) => Err("; last error: the CertificateSigningRequest is gone".into()),
            Err(e) => {
                let reason = describe(&e);
                tracing::debug!(csr = name, error = %reason, "read CertificateSigningRequest failed");
                Err(format!("; last error: {reason}"))
            }
        }
    })
    .await;
    match polled {
        Ok(done) => done,
        Err(w) => Err(KubeClientError::Timeout {
            name: name.to_string(),
            timeout,
            state: if approved.load(Ordering::Relaxed) {
                "is approved but has no certificate yet"
            } else {
                "is not approved"
            },
            last_error: w.last_seen,
        }),
    }
}
