//! The daemon's Kubernetes client, built from the config (upstream's `kubeauth` and unbounded's
//! `daemoncred`).
//!
//! - [`bootstrap_config`]: the API server URL (`Config::api_server_url`) and CA
//!   (`node.kubelet.caCertData`, base64 PEM) from the config; as credential the bootstrap token
//!   (a bearer token) or, for a service principal or managed identity, the exec credential
//!   plugin `aks-flex-node token kubelogin` with `crate::machine::nodegoal`'s environment.
//! - [`DaemonCredentials`]: with a bootstrap token, the daemon does not keep using the token: it
//!   asks for a client certificate of its own through a `CertificateSigningRequest` (CN
//!   `system:node:<node>`, O `system:nodes` and `aks-flex-node-daemons`, signer
//!   `kubernetes.io/kube-apiserver-client`), keeps it in `/etc/aks-flex-node/daemon-credentials`
//!   (0700; key and certificate together in `client-current.pem`, 0600, replaced atomically;
//!   a legacy `key.pem`/`cert.pem` pair is still read), reuses it across restarts and rotates
//!   it in the background once 80 % of its lifetime has passed.
//! - [`daemon_clients`]: the two together, as the daemon uses them; [`KubeClients`] hands out
//!   the current client (a rotation replaces it).
//! - [`discover`]: before a CSR, whether the cluster serves the Flex API
//!   (`unbounded-cloud.io/v1alpha3`, which `deploy/crds` installs with the controller). Where it
//!   does not, nothing would approve the request, so the daemon says so at once (`the cluster
//!   has no AKS Flex controller: …`) and retries with backoff, instead of waiting two minutes
//!   for a certificate (upstream's "wait for daemon controller certificate: context deadline
//!   exceeded").
//! - [`scratch`]: the same credential store on a scratch root only (`debug credential-store`,
//!   the `faults` group's window 4; `/` is refused).
//!
//! The private key is generated here, written only inside the credential directory and never
//! sent: the CSR carries the public key. The key is held as a [`Secret`] (redacted `Debug`) and
//! no log line carries it.
//!
//! The exec plugin, `aks-flex-node token kubelogin` (`crate::flows::token`), gets a Microsoft
//! Entra ID token for the service principal's client secret or from the managed identity's
//! IMDS endpoint (`crate::goalclient::azure`). When it fails, the daemon gets an exec error on
//! that API call, which it logs and retries with backoff.

mod credentials;
mod csr;
mod discovery;
#[cfg(test)]
pub(crate) mod mock;
pub mod scratch;
mod store;
pub use store::PairError;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use base64::Engine as _;
use kube::config::{AuthInfo, ExecConfig, ExecInteractiveMode};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use flex_host::fs::{FsError, HostFs};
use flex_host::secret::Secret;

pub use credentials::{CredentialTimings, DaemonCredentials};
pub use csr::{csr_name, csr_pem, csr_resource};
pub use discovery::{Discovery, NO_ADMISSION_POLICIES, admission_policies_served, discover};
pub use store::{Issued, Validity, needs_rotation, rotation_deadline};

/// Where the daemon's client credentials live (mode 0700).
pub const CREDENTIAL_DIR: &str = "/etc/aks-flex-node/daemon-credentials";
/// The daemon's private key and client certificate in one file (0600; the key's PEM, then
/// the certificate's, as kubelet's `kubelet-client-current.pem`): replaced in one atomic
/// rename, so a crash leaves the old pair or the new one, never half of each.
pub const PAIR_FILE: &str = "/etc/aks-flex-node/daemon-credentials/client-current.pem";
/// The private key of the legacy two-file pair (0600): read when [`PAIR_FILE`] is not there
/// or not usable, never written; removed once a pair is stored in [`PAIR_FILE`].
pub const KEY_FILE: &str = "/etc/aks-flex-node/daemon-credentials/key.pem";
/// The client certificate of the legacy two-file pair (see [`KEY_FILE`]).
pub const CERT_FILE: &str = "/etc/aks-flex-node/daemon-credentials/cert.pem";
/// The key of a request not yet answered (0600): a daemon restarted while waiting asks again
/// with the same key, under the same CSR name.
pub const PENDING_KEY_FILE: &str = "/etc/aks-flex-node/daemon-credentials/pending-key.pem";
/// The CSR name prefix (upstream's provider name).
pub const DAEMON_NAME: &str = "aks-flex-node-daemon";
pub use flex_api::machina::DAEMON_GROUP;
/// The nodes group.
pub const NODES_GROUP: &str = "system:nodes";
/// The signer (not auto-approved: the aks-flex-controller CSR approver or an administrator
/// approves it).
pub const SIGNER_NAME: &str = "kubernetes.io/kube-apiserver-client";
/// The key usages requested.
pub const USAGES: [&str; 2] = ["digital signature", "client auth"];
/// The certificate lifetime requested (`expirationSeconds`, 30 days: the controller's CSR
/// approver approves at most that by default; rotation starts at 80 %, six days before expiry).
pub const CERT_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long startup waits for a certificate.
pub const ISSUE_TIMEOUT: Duration = Duration::from_secs(120);
/// The exec credential API version.
pub const EXEC_API_VERSION: &str = "client.authentication.k8s.io/v1";

/// Why a Kubernetes client could not be built or credentials obtained.
#[derive(Debug, thiserror::Error)]
pub enum KubeClientError {
    /// `node.kubelet.clusterFQDN` is empty.
    #[error("kubernetes API server URL is empty")]
    EmptyServer,
    /// The URL does not parse.
    #[error("kubernetes API server URL {url:?} is invalid: {reason}")]
    BadServer {
        /// The URL.
        url: String,
        /// The parser's message.
        reason: String,
    },
    /// `node.kubelet.caCertData` is empty.
    #[error("kubernetes CA certificate is empty (node.kubelet.caCertData)")]
    EmptyCa,
    /// `node.kubelet.caCertData` does not decode to PEM certificates.
    #[error("decode kubernetes CA certificate (node.kubelet.caCertData): {0}")]
    BadCa(String),
    /// Neither a bootstrap token nor an exec credential is configured.
    #[error("kubernetes client requires bootstrap token or exec credential")]
    NoCredential,
    /// The exec credential's environment could not be resolved.
    #[error("kubernetes exec credential: {0}")]
    Exec(String),
    /// kube refused the configuration.
    #[error("build kubernetes client: {0}")]
    Client(String),
    /// Reading or writing the credential files.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// A key or CSR could not be made.
    #[error("daemon credentials: {0}")]
    Crypto(String),
    /// Creating the CSR failed.
    #[error("create CertificateSigningRequest {name}: {reason}")]
    CreateCsr {
        /// The CSR.
        name: String,
        /// The API server's answer or the transport error.
        reason: String,
        /// Whether the API server refused the identity (401/403).
        refused: bool,
    },
    /// The CSR was denied.
    #[error("CertificateSigningRequest {name} was denied: {message}")]
    Denied {
        /// The CSR.
        name: String,
        /// The condition's reason and message.
        message: String,
    },
    /// The signer failed the CSR.
    #[error("CertificateSigningRequest {name} failed: {message}")]
    Failed {
        /// The CSR.
        name: String,
        /// The condition's reason and message.
        message: String,
    },
    /// Nothing was issued in time.
    #[error(
        "no daemon client certificate issued within {timeout}: CertificateSigningRequest {name} {state} (signer {SIGNER_NAME} is not auto-approved: the aks-flex-controller CSR approver or an administrator must approve it){last_error}"
    )]
    Timeout {
        /// The CSR.
        name: String,
        /// The wait, as a Go duration.
        timeout: String,
        /// `is not approved` or `is approved but has no certificate yet`, or `was not created`.
        state: &'static str,
        /// `; last error: ...` when the last attempt failed.
        last_error: String,
    },
    /// The cluster does not serve the AKS Flex API, so no controller is there to approve the
    /// daemon's request: failing at once beats a certificate wait that can only time out.
    #[error(
        "the cluster has no AKS Flex controller: unbounded-cloud.io/v1alpha3 machineoperations is not served, so nothing would approve the daemon's CertificateSigningRequest (signer {SIGNER_NAME}); apply deploy/crds and deploy/controller (with its CSR approver on) to the cluster"
    )]
    NoFlexController,
    /// The issued certificate is unusable.
    #[error("certificate issued for CertificateSigningRequest {name}: {reason}")]
    BadIssued {
        /// The CSR.
        name: String,
        /// What is wrong.
        reason: store::PairError,
    },
}

pub use flex_api::kube_errors::{describe, error_chain, is_refused, redact_env};

impl KubeClientError {
    /// Whether retrying cannot help: the config is wrong (server, CA, credential), not the
    /// cluster's answer.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            KubeClientError::EmptyServer
                | KubeClientError::BadServer { .. }
                | KubeClientError::EmptyCa
                | KubeClientError::BadCa(_)
                | KubeClientError::NoCredential
                | KubeClientError::Exec(_)
        )
    }
}

/// The cluster's CA certificates (DER) from `node.kubelet.caCertData` (base64 of PEM).
pub fn decode_ca(ca_cert_data: &str) -> Result<Vec<Vec<u8>>, KubeClientError> {
    let compact: String = ca_cert_data
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    if compact.is_empty() {
        return Err(KubeClientError::EmptyCa);
    }
    let pem = base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .map_err(|e| KubeClientError::BadCa(format!("not base64: {e}")))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .map(|c| c.map(|c| c.as_ref().to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| KubeClientError::BadCa(format!("not PEM: {e}")))?;
    if certs.is_empty() {
        return Err(KubeClientError::BadCa("no PEM certificate found".into()));
    }
    for (i, der) in certs.iter().enumerate() {
        x509_parser::parse_x509_certificate(der).map_err(|e| {
            KubeClientError::BadCa(format!("certificate {} is not X.509: {e}", i + 1))
        })?;
    }
    Ok(certs)
}

/// The exec credential plugin config: `<command> token kubelogin --server-id <AKS AAD server>`
/// with `env` (`AAD_LOGIN_METHOD`, ...), never interactive. The values are secrets (a service
/// principal's client secret): the returned config must not be logged.
pub fn exec_config(command: &str, env: &BTreeMap<String, Secret>) -> ExecConfig {
    ExecConfig {
        api_version: Some(EXEC_API_VERSION.into()),
        command: Some(command.into()),
        args: Some(vec![
            "token".into(),
            "kubelogin".into(),
            "--server-id".into(),
            crate::machine::nodegoal::AKS_AAD_SERVER_ID.into(),
        ]),
        env: Some(
            env.iter()
                .map(|(k, v)| {
                    std::collections::HashMap::from([
                        ("name".to_string(), k.clone()),
                        ("value".to_string(), v.expose().to_string()),
                    ])
                })
                .collect(),
        ),
        interactive_mode: Some(ExecInteractiveMode::Never),
        ..Default::default()
    }
}

/// The exec plugin's environment, as kubelet's (`crate::machine::nodegoal`).
fn exec_env(cfg: &Config) -> Result<BTreeMap<String, Secret>, KubeClientError> {
    if cfg.azure.service_principal.is_none() && cfg.azure.managed_identity.is_none() {
        return Err(KubeClientError::NoCredential);
    }
    let facts = crate::machine::nodegoal::HostFacts::default();
    match crate::machine::nodegoal::resolve(cfg, crate::state::KUBE1, &facts) {
        Ok(g) => match g.auth {
            crate::machine::nodegoal::KubeletAuth::ExecCredential { env } => Ok(env),
            crate::machine::nodegoal::KubeletAuth::BootstrapToken(_) => {
                Err(KubeClientError::NoCredential)
            }
        },
        Err(e) => Err(KubeClientError::Exec(e.message)),
    }
}

/// The configured bootstrap token, if not blank.
fn bootstrap_token(cfg: &Config) -> Option<&Secret> {
    cfg.azure
        .bootstrap_token
        .as_ref()
        .map(|b| &b.token)
        .filter(|t| !t.is_blank())
}

/// The base REST config: server and CA from the config; the bootstrap token as bearer token
/// (a [`Secret`], never logged) or the exec credential plugin (the running binary's
/// `token kubelogin`).
pub async fn bootstrap_config(cfg: &Config) -> Result<kube::Config, KubeClientError> {
    let url = cfg.api_server_url();
    if url.trim().is_empty() {
        return Err(KubeClientError::EmptyServer);
    }
    let uri: http::Uri =
        url.parse()
            .map_err(|e: http::uri::InvalidUri| KubeClientError::BadServer {
                url: url.clone(),
                reason: e.to_string(),
            })?;
    let ca = decode_ca(&cfg.node.kubelet.ca_cert_data)?;
    let auth_info = if let Some(token) = bootstrap_token(cfg) {
        AuthInfo {
            token: Some(secrecy::SecretString::from(token.expose().trim())),
            ..Default::default()
        }
    } else {
        let env = exec_env(cfg)?;
        let command = crate::machine::lifecycle::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "aks-flex-node".into());
        AuthInfo {
            exec: Some(exec_config(&command, &env)),
            ..Default::default()
        }
    };
    let mut kc = kube::Config::new(uri);
    kc.root_cert = Some(ca);
    kc.auth_info = auth_info;
    Ok(kc)
}

/// Builds a client from a REST config (kube's rustls with the ring provider).
pub fn client_from(config: kube::Config) -> Result<kube::Client, KubeClientError> {
    flex_host::http::install_crypto();
    kube::Client::try_from(config).map_err(|e| KubeClientError::Client(describe(&e)))
}

/// The daemon's current Kubernetes client. A certificate rotation replaces it: take
/// [`current`](Self::current) for each piece of work, and restart long watches on
/// [`changed`](Self::changed).
#[derive(Clone)]
pub struct KubeClients {
    rx: watch::Receiver<kube::Client>,
    /// The `notAfter` of the client certificate in use, Unix seconds; 0 when the client has
    /// none of the daemon's own (the exec credential).
    not_after: Arc<AtomicI64>,
}

impl KubeClients {
    /// A client that never changes (exec credential, tests).
    pub fn fixed(client: kube::Client) -> Self {
        let (_tx, rx) = watch::channel(client);
        Self::from_receiver(rx)
    }

    /// Clients published through `rx`.
    pub fn from_receiver(rx: watch::Receiver<kube::Client>) -> Self {
        Self {
            rx,
            not_after: Arc::new(AtomicI64::new(0)),
        }
    }

    /// Records the `notAfter` of the certificate the current client uses (the daemon's
    /// credentials call it at each issue and rotation).
    pub fn set_not_after(&self, not_after: std::time::SystemTime) {
        let secs = not_after
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        self.not_after.store(secs, Ordering::Relaxed);
    }

    /// The `notAfter` of the client certificate in use (Unix seconds), when the client has one
    /// of the daemon's own.
    pub fn not_after(&self) -> Option<i64> {
        match self.not_after.load(Ordering::Relaxed) {
            0 => None,
            s => Some(s),
        }
    }

    /// The current client.
    pub fn current(&self) -> kube::Client {
        self.rx.borrow().clone()
    }

    /// Waits until the client is replaced (forever for a fixed client).
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The daemon's clients for `cfg`: with a bootstrap token, a client certificate of its own
/// (reused from `fs`'s credential directory or requested, waiting up to 2 minutes), rotated in
/// the background until `shutdown`; otherwise the exec credential client.
pub async fn daemon_clients(
    fs: &HostFs,
    cfg: &Config,
    shutdown: CancellationToken,
) -> Result<KubeClients, KubeClientError> {
    let base = bootstrap_config(cfg).await?;
    if bootstrap_token(cfg).is_none() {
        tracing::info!("kubernetes client uses the exec credential plugin");
        return Ok(KubeClients::fixed(client_from(base)?));
    }
    let bootstrap = client_from(base.clone())?;
    DaemonCredentials::new(fs.clone(), &cfg.agent.node_name, base)
        .start(bootstrap, shutdown)
        .await
}

#[cfg(test)]
mod tests;
