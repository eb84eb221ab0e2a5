//! [`DaemonCredentials`]: the daemon's own client certificate, as unbounded's
//! `daemoncred.RESTConfigProvider` — reuse a stored one, or request one with the bootstrap
//! client and wait for it; then rotate it in the background once 80 % of its lifetime passed,
//! asking with the daemon's own certificate only. Once the daemon holds a certificate it no
//! longer uses the bootstrap token: the approver would not issue a node that holds a valid
//! certificate another one through a token anyway, and a token must not outlive its purpose.
//! When the API server refuses the certificate's request (the cluster lacks `rbac.yaml`'s CSR
//! grant), the rotation says so and retries while the current certificate stays in use; only
//! a daemon started without a usable certificate (never issued, or expired) asks with the
//! bootstrap token.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use kube::config::AuthInfo;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::csr::{self, Waits, generate_key, request_certificate};
use super::store::{self, CredentialStore, Issued, needs_rotation, rotation_deadline};
use super::{Discovery, ISSUE_TIMEOUT, KubeClientError, KubeClients, client_from, discover};
use flex_host::fs::HostFs;

/// Waits and retries of the credential flow (tests shorten them).
#[derive(Clone, Copy, Debug)]
pub struct CredentialTimings {
    /// How long one request waits for its certificate (2 minutes).
    pub wait: Duration,
    /// How often the CSR is read while waiting.
    pub poll: Duration,
    /// First delay between failed CSR creations.
    pub retry_base: Duration,
    /// Largest delay between failed CSR creations.
    pub retry_max: Duration,
    /// First delay after a failed rotation.
    pub rotation_retry_base: Duration,
    /// Largest delay after failed rotations.
    pub rotation_retry_max: Duration,
    /// Longest single sleep of the rotation task (it re-checks the deadline after it).
    pub max_sleep: Duration,
}

impl Default for CredentialTimings {
    fn default() -> Self {
        Self {
            wait: ISSUE_TIMEOUT,
            poll: Duration::from_secs(2),
            retry_base: Duration::from_secs(1),
            retry_max: Duration::from_secs(15),
            rotation_retry_base: Duration::from_secs(30),
            rotation_retry_max: Duration::from_secs(30 * 60),
            max_sleep: Duration::from_secs(24 * 3600),
        }
    }
}

type ClientFactory =
    Arc<dyn Fn(kube::Config) -> Result<kube::Client, KubeClientError> + Send + Sync>;

/// The daemon's client certificate for one node, kept in
/// [`CREDENTIAL_DIR`](super::CREDENTIAL_DIR).
pub struct DaemonCredentials {
    store: CredentialStore,
    node: String,
    base: kube::Config,
    timings: CredentialTimings,
    make_client: ClientFactory,
}

impl DaemonCredentials {
    /// Credentials for `node` under `fs`; `base` is the bootstrap REST config (server, CA).
    pub fn new(fs: HostFs, node: &str, base: kube::Config) -> Self {
        Self {
            store: CredentialStore::new(fs),
            node: node.to_string(),
            base,
            timings: CredentialTimings::default(),
            make_client: Arc::new(client_from),
        }
    }

    /// Overrides waits and retries.
    pub fn with_timings(mut self, timings: CredentialTimings) -> Self {
        self.timings = timings;
        self
    }

    /// Overrides how a REST config becomes a client (tests hand out a mock API server).
    pub fn with_client_factory(
        mut self,
        f: impl Fn(kube::Config) -> Result<kube::Client, KubeClientError> + Send + Sync + 'static,
    ) -> Self {
        self.make_client = Arc::new(f);
        self
    }

    fn waits(&self) -> Waits {
        Waits {
            wait: self.timings.wait,
            poll: self.timings.poll,
            retry_base: self.timings.retry_base,
            retry_max: self.timings.retry_max,
        }
    }

    /// The REST config for `issued`: the base config's server and CA, the client certificate
    /// as the only credential (the bearer token is dropped).
    pub fn client_config(&self, issued: &Issued) -> kube::Config {
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut c = self.base.clone();
        c.auth_info = AuthInfo {
            client_certificate_data: Some(b64.encode(issued.cert_pem.as_bytes())),
            client_key_data: Some(secrecy::SecretString::from(
                b64.encode(issued.key_pem.expose().as_bytes()),
            )),
            ..Default::default()
        };
        c
    }

    /// A usable stored certificate, or a new one requested with `client`.
    pub async fn obtain(&self, client: &kube::Client) -> Result<Issued, KubeClientError> {
        self.store.prepare()?;
        if let Some(issued) = self.store.load(&self.node, SystemTime::now()) {
            tracing::info!(
                file = super::CERT_FILE,
                valid_days = days_left(&issued),
                "reusing the stored daemon client certificate"
            );
            return Ok(issued);
        }
        self.request(client).await
    }

    /// Requests a new certificate with `client` (reusing the key of an unanswered request),
    /// waits for it and stores it.
    pub async fn request(&self, client: &kube::Client) -> Result<Issued, KubeClientError> {
        self.store.prepare()?;
        // Only the Flex controller approves this signer for daemons; without its API there is
        // nothing to wait for. Any other answer (unreachable, 403) goes on to the request, whose
        // own errors and retries name it.
        if discover(client).await == Discovery::Absent {
            return Err(KubeClientError::NoFlexController);
        }
        let (key_pem, key) = match self.store.pending_key() {
            Some(p) => {
                tracing::info!("resuming the pending daemon certificate request");
                p
            }
            None => {
                let (pem, key) = generate_key()?;
                self.store.save_pending_key(&pem)?;
                (pem, key)
            }
        };
        let name = csr::csr_name(&key, &self.node);
        let request = csr::csr_pem(&key, &self.node)?;
        let result = request_certificate(client, &name, &request, self.waits())
            .await
            .and_then(|cert| {
                store::check(&key, &cert, &self.node, SystemTime::now())
                    .map(|validity| Issued {
                        key_pem,
                        cert_pem: cert,
                        validity,
                    })
                    .map_err(|reason| KubeClientError::BadIssued {
                        name: name.clone(),
                        reason,
                    })
            });
        match result {
            Ok(issued) => {
                self.store.save(&issued)?;
                tracing::info!(
                    csr = %name,
                    dir = super::CREDENTIAL_DIR,
                    valid_days = days_left(&issued),
                    "daemon client certificate stored"
                );
                Ok(issued)
            }
            Err(
                e @ (KubeClientError::Denied { .. }
                | KubeClientError::Failed { .. }
                | KubeClientError::BadIssued { .. }),
            ) => {
                // This request cannot succeed: the next one starts with a new key and name.
                let _ = self
                    .fs_remove_pending()
                    .map_err(|r| tracing::warn!(error = %r, "remove the pending daemon key"));
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    fn fs_remove_pending(&self) -> Result<(), KubeClientError> {
        self.store.remove_pending()
    }

    /// Obtains the certificate (with `bootstrap`), builds the daemon's client and starts the
    /// rotation task (until `shutdown`). Fails when no certificate is issued within the wait.
    pub async fn start(
        self,
        bootstrap: kube::Client,
        shutdown: CancellationToken,
    ) -> Result<KubeClients, KubeClientError> {
        let issued = self.obtain(&bootstrap).await?;
        let client = (self.make_client)(self.client_config(&issued))?;
        let (tx, rx) = watch::channel(client);
        let clients = KubeClients::from_receiver(rx);
        clients.set_not_after(issued.validity.not_after);
        tokio::spawn(Arc::new(self).rotate(issued, tx, clients.clone(), shutdown));
        Ok(clients)
    }

    async fn rotate(
        self: Arc<Self>,
        mut current: Issued,
        tx: watch::Sender<kube::Client>,
        clients: KubeClients,
        shutdown: CancellationToken,
    ) {
        let t = self.timings;
        let mut failures: u32 = 0;
        loop {
            let now = SystemTime::now();
            let wait = if failures > 0 {
                retry_delay(t.rotation_retry_base, t.rotation_retry_max, failures)
            } else {
                rotation_deadline(&current.validity)
                    .duration_since(now)
                    .unwrap_or(Duration::ZERO)
            };
            if !wait.is_zero() {
                tracing::debug!(in_secs = wait.as_secs(), "next daemon certificate check");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(wait.min(t.max_sleep)) => {}
                }
            }
            if shutdown.is_cancelled() {
                return;
            }
            if failures == 0 && !needs_rotation(&current.validity, SystemTime::now()) {
                continue;
            }
            tracing::info!("rotating the daemon client certificate");
            let own = tx.borrow().clone();
            let requested = self.request(&own).await;
            if let Err(KubeClientError::CreateCsr { refused: true, .. }) = &requested {
                tracing::warn!(
                    "the API server refuses the daemon's certificate a CertificateSigningRequest; \
                     grant group {} create on certificatesigningrequests (deploy/controller/rbac.yaml). \
                     The bootstrap token is not used again once the daemon holds a certificate",
                    super::DAEMON_GROUP
                );
            }
            let built = requested.and_then(|issued| {
                (self.make_client)(self.client_config(&issued)).map(|c| (c, issued))
            });
            match built {
                Ok((client, issued)) => {
                    // The expiry first: whoever wakes on the new client reads its own.
                    clients.set_not_after(issued.validity.not_after);
                    tx.send_replace(client);
                    current = issued;
                    failures = 0;
                    tracing::info!(
                        valid_days = days_left(&current),
                        "daemon client certificate rotated"
                    );
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    tracing::warn!(
                        error = %e,
                        retry_in_secs = retry_delay(t.rotation_retry_base, t.rotation_retry_max, failures).as_secs(),
                        "rotate the daemon client certificate failed; the current one stays in use"
                    );
                }
            }
        }
    }
}

/// The wait after `failures` failed rotations: the workspace's one backoff, never giving up.
fn retry_delay(base: Duration, max: Duration, failures: u32) -> Duration {
    flex_host::retry::Backoff::new(u32::MAX, base, max).delay(failures, None)
}

fn days_left(issued: &Issued) -> u64 {
    issued
        .validity
        .not_after
        .duration_since(SystemTime::now())
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0)
}
