//! The default Azure credential chain, in azidentity's order (`DefaultAzureCredential`), for a
//! config that names neither `azure.servicePrincipal` nor `azure.managedIdentity`:
//!
//! 1. **environment**: `AZURE_TENANT_ID`, `AZURE_CLIENT_ID` and `AZURE_CLIENT_SECRET` (a
//!    [`ClientSecretCredential`]). `AZURE_CLIENT_CERTIFICATE_PATH` (a client certificate) is
//!    recognised and refused: this agent does not sign client assertions; the chain says so and
//!    goes on.
//! 2. **workload identity**: `AZURE_FEDERATED_TOKEN_FILE`, `AZURE_CLIENT_ID` and
//!    `AZURE_TENANT_ID` ([`WorkloadIdentityCredential`]: the file, read at every request since
//!    it rotates, is the client assertion of the client credentials grant).
//! 3. **managed identity**: IMDS ([`ManagedIdentityCredential`], `AZURE_CLIENT_ID` for a
//!    user-assigned identity). As azidentity does, the first request is a probe: one attempt,
//!    [`IMDS_PROBE_TIMEOUT`]; no answer, or IMDS's 400 (no identity assigned), means
//!    unavailable. Once IMDS has answered, later requests get the normal retries.
//! 4. **Azure CLI**: `az account get-access-token --output json --resource <resource>
//!    [--tenant <AZURE_TENANT_ID>]` through the runner ([`AZ_TIMEOUT`]); `az` missing, or not
//!    logged in, means unavailable.
//!
//! A source that is not configured or not available is skipped and its reason kept; a source
//! that is configured and fails (a wrong secret) ends the chain with its error, as azidentity's
//! chain does. The first source that gives a token is used from then on. When none is
//! available, one error lists what was tried and why each was not used.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use flex_host::fs::HostFs;
use flex_host::runner::{Cmd, Runner};
use flex_host::secret::Secret;
use url::Url;

use super::{
    AccessToken, AuthError, AzureCredential, ClientSecretCredential, Env,
    ManagedIdentityCredential, TokenEndpoint, entra_token_url, env_value, resource_of,
    retryable_status,
};

/// The client certificate's path (environment credential; recognised, not supported).
pub const CLIENT_CERTIFICATE_PATH_ENV: &str = "AZURE_CLIENT_CERTIFICATE_PATH";
/// The client secret (environment credential).
pub const CLIENT_SECRET_ENV: &str = "AZURE_CLIENT_SECRET";
/// The federated token file (workload identity).
pub const FEDERATED_TOKEN_FILE_ENV: &str = "AZURE_FEDERATED_TOKEN_FILE";
/// How long the first IMDS request may take before managed identity counts as unavailable.
pub const IMDS_PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest `az account get-access-token` may run.
pub const AZ_TIMEOUT: Duration = Duration::from_secs(30);
/// The client assertion type of a federated token.
const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// A workload identity: a federated token file as the client assertion.
#[derive(Debug)]
pub struct WorkloadIdentityCredential {
    client_id: String,
    token_file: PathBuf,
    fs: HostFs,
    endpoint: TokenEndpoint,
}

impl WorkloadIdentityCredential {
    /// The identity `client_id` in `tenant` whose federated token is `token_file` (read through
    /// `fs`), at `authority_host`.
    pub fn new(
        tenant: &str,
        client_id: &str,
        token_file: PathBuf,
        fs: HostFs,
        authority_host: &Url,
    ) -> Result<Self, AuthError> {
        Ok(Self {
            endpoint: TokenEndpoint::new(
                "Microsoft Entra ID token request to",
                entra_token_url(tenant, client_id, authority_host)?,
                retryable_status,
            )?,
            client_id: client_id.trim().to_string(),
            token_file,
            fs,
        })
    }

    /// Replaces the retry backoff.
    pub fn with_backoff(mut self, backoff: flex_host::retry::Backoff) -> Self {
        self.endpoint.backoff = backoff;
        self
    }
}

#[async_trait]
impl AzureCredential for WorkloadIdentityCredential {
    async fn token(&self, scope: &str) -> Result<AccessToken, AuthError> {
        if let Some(t) = self.endpoint.cache.get(scope) {
            return Ok(t);
        }
        let shown = self.token_file.display().to_string();
        let assertion = self
            .fs
            .read(&self.token_file)
            .map_err(|e| AuthError::Setting(format!("{FEDERATED_TOKEN_FILE_ENV} {shown}: {e}")))?
            .ok_or_else(|| {
                AuthError::Setting(format!("{FEDERATED_TOKEN_FILE_ENV} {shown} does not exist"))
            })?;
        let assertion = Secret::new(String::from_utf8_lossy(&assertion).trim());
        if assertion.is_blank() {
            return Err(AuthError::Setting(format!(
                "{FEDERATED_TOKEN_FILE_ENV} {shown} is empty"
            )));
        }
        self.endpoint
            .client_credentials(
                scope,
                &self.client_id,
                &[
                    ("client_assertion_type", JWT_BEARER),
                    ("client_assertion", assertion.expose()),
                ],
                &assertion,
            )
            .await
    }
}

/// The Azure CLI's login: `az account get-access-token` through the runner.
pub struct AzureCliCredential {
    runner: Arc<dyn Runner>,
    tenant: Option<String>,
}

impl std::fmt::Debug for AzureCliCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureCliCredential")
            .field("tenant", &self.tenant)
            .finish_non_exhaustive()
    }
}

/// Reads `az account get-access-token --output json`: `accessToken`, and `expires_on` (epoch
/// seconds, Azure CLI 2.54 and later) when there. The error says what is wrong, never what the
/// output holds.
pub fn parse_az_token(stdout: &str) -> Result<AccessToken, &'static str> {
    let v: serde_json::Value =
        serde_json::from_str(stdout).map_err(|_| "its output is not JSON")?;
    let token = match v.get("accessToken") {
        Some(serde_json::Value::String(t)) if !t.trim().is_empty() => Secret::new(t.trim()),
        _ => return Err("its output has no accessToken"),
    };
    let expires_at = match v.get("expires_on") {
        Some(serde_json::Value::Number(n)) => n
            .as_u64()
            .and_then(|s| UNIX_EPOCH.checked_add(Duration::from_secs(s))),
        Some(serde_json::Value::String(s)) => s
            .trim()
            .parse()
            .ok()
            .and_then(|s| UNIX_EPOCH.checked_add(Duration::from_secs(s))),
        _ => None,
    };
    Ok(AccessToken { token, expires_at })
}

impl AzureCliCredential {
    /// The CLI's login, for `tenant` when given.
    pub fn new(runner: Arc<dyn Runner>, tenant: Option<&str>) -> Self {
        Self {
            runner,
            tenant: tenant
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_string),
        }
    }

    /// A token for `scope`; [`AuthError::Unavailable`] when `az` is not installed or not logged
    /// in.
    async fn get(&self, scope: &str) -> Result<AccessToken, AuthError> {
        if self.runner.which("az").is_none() {
            return Err(AuthError::Unavailable("az is not on PATH".into()));
        }
        let mut cmd = Cmd::new("az")
            .args([
                "account",
                "get-access-token",
                "--output",
                "json",
                "--resource",
            ])
            .arg(resource_of(scope))
            .timeout(AZ_TIMEOUT);
        if let Some(t) = &self.tenant {
            cmd = cmd.args(["--tenant", t]);
        }
        let out = self
            .runner
            .output(&cmd)
            .await
            .map_err(|e| AuthError::Unavailable(format!("az: {e}")))?;
        if !out.success() {
            let err = out.stderr.trim();
            let first = err.lines().next().unwrap_or_default();
            if err.contains("az login") || err.contains("az account set") {
                return Err(AuthError::Unavailable(format!("not logged in ({first})")));
            }
            return Err(AuthError::Setting(format!(
                "az account get-access-token failed: {first}"
            )));
        }
        parse_az_token(&out.stdout)
            .map_err(|why| AuthError::Setting(format!("az account get-access-token: {why}")))
    }
}

#[async_trait]
impl AzureCredential for AzureCliCredential {
    async fn token(&self, scope: &str) -> Result<AccessToken, AuthError> {
        self.get(scope).await
    }
}

/// One source of the chain: built, or why it is not configured.
enum Source {
    Ready(Box<dyn AzureCredential>),
    NotConfigured(String),
}

/// The default credential chain.
pub struct DefaultAzureCredential {
    sources: Vec<(&'static str, Source)>,
    /// The index of the source that gave a token (used from then on).
    chosen: Mutex<Option<usize>>,
    /// Whether IMDS has answered (after its probe, normal retries).
    imds_answered: Mutex<bool>,
    imds_probe: Option<ManagedIdentityCredential>,
}

impl std::fmt::Debug for DefaultAzureCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.sources.iter().map(|(n, _)| *n).collect();
        f.debug_struct("DefaultAzureCredential")
            .field("sources", &names)
            .finish_non_exhaustive()
    }
}

/// The names of the chain's sources, in order.
pub const SOURCES: [&str; 4] = [
    "environment",
    "workload identity",
    "managed identity",
    "Azure CLI",
];

impl DefaultAzureCredential {
    /// The chain for `env`: files (the federated token) read through `fs`, `az` run by
    /// `runner`, the authority host `authority_host` and IMDS at `imds`.
    pub fn new(
        env: &Env,
        fs: HostFs,
        runner: Arc<dyn Runner>,
        authority_host: &Url,
        imds: &Url,
    ) -> Result<Self, AuthError> {
        let tenant = env_value(env, super::TENANT_ID_ENV);
        let client = env_value(env, super::CLIENT_ID_ENV);
        let environment =
            match (
                tenant,
                client,
                env_value(env, CLIENT_SECRET_ENV),
                env_value(env, CLIENT_CERTIFICATE_PATH_ENV),
            ) {
                (Some(t), Some(c), Some(s), _) => Source::Ready(Box::new(
                    ClientSecretCredential::new(t, c, Secret::new(s), authority_host)?,
                )),
                (_, _, None, Some(_)) => Source::NotConfigured(format!(
                    "{CLIENT_CERTIFICATE_PATH_ENV} is set, and client certificates are not \
                 supported (use {CLIENT_SECRET_ENV} or workload identity)"
                )),
                _ => Source::NotConfigured(format!(
                    "{}, {} and {CLIENT_SECRET_ENV} are not all set",
                    super::TENANT_ID_ENV,
                    super::CLIENT_ID_ENV
                )),
            };
        let workload = match (tenant, client, env_value(env, FEDERATED_TOKEN_FILE_ENV)) {
            (Some(t), Some(c), Some(f)) => Source::Ready(Box::new(
                WorkloadIdentityCredential::new(t, c, PathBuf::from(f), fs, authority_host)?,
            )),
            _ => Source::NotConfigured(format!(
                "{FEDERATED_TOKEN_FILE_ENV}, {} and {} are not all set",
                super::TENANT_ID_ENV,
                super::CLIENT_ID_ENV
            )),
        };
        let managed = ManagedIdentityCredential::new(client, imds)?;
        let probe = ManagedIdentityCredential::new(client, imds)?
            .with_backoff(flex_host::retry::Backoff::new(
                1,
                Duration::ZERO,
                Duration::ZERO,
            ))
            .with_timeout(IMDS_PROBE_TIMEOUT);
        Ok(Self {
            sources: vec![
                (SOURCES[0], environment),
                (SOURCES[1], workload),
                (SOURCES[2], Source::Ready(Box::new(managed))),
                (
                    SOURCES[3],
                    Source::Ready(Box::new(AzureCliCredential::new(runner, tenant))),
                ),
            ],
            chosen: Mutex::new(None),
            imds_answered: Mutex::new(false),
            imds_probe: Some(probe),
        })
    }

    /// The source in use, once one has given a token.
    pub fn chosen(&self) -> Option<&'static str> {
        let i = (*self.chosen.lock().unwrap_or_else(|e| e.into_inner()))?;
        self.sources.get(i).map(|(n, _)| *n)
    }

    /// Asks source `i` (IMDS through its probe until it has answered once).
    async fn ask(&self, i: usize, scope: &str) -> Result<AccessToken, AuthError> {
        let (name, source) = &self.sources[i];
        let Source::Ready(c) = source else {
            return Err(AuthError::Unavailable("not configured".into()));
        };
        if *name != SOURCES[2] {
            return c.token(scope).await;
        }
        let answered = *self.imds_answered.lock().unwrap_or_else(|e| e.into_inner());
        let result = match (&self.imds_probe, answered) {
            (Some(probe), false) => probe.token(scope).await,
            _ => c.token(scope).await,
        };
        match result {
            Ok(t) => {
                *self.imds_answered.lock().unwrap_or_else(|e| e.into_inner()) = true;
                Ok(t)
            }
            // No answer in time, or no identity assigned: not available on this host.
            Err(AuthError::Transport { reason, .. }) if !answered => Err(AuthError::Unavailable(
                format!("IMDS did not answer within {IMDS_PROBE_TIMEOUT:?} ({reason})"),
            )),
            Err(AuthError::Status { status, .. })
                if !answered && status == reqwest::StatusCode::BAD_REQUEST =>
            {
                Err(AuthError::Unavailable(
                    "IMDS answered 400: no identity is assigned to this host".into(),
                ))
            }
            Err(e) => Err(e),
        }
    }
}

#[async_trait]
impl AzureCredential for DefaultAzureCredential {
    async fn token(&self, scope: &str) -> Result<AccessToken, AuthError> {
        let chosen = *self.chosen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = chosen {
            return self.ask(i, scope).await;
        }
        let mut tried = Vec::new();
        for (i, (name, source)) in self.sources.iter().enumerate() {
            if let Source::NotConfigured(why) = source {
                tried.push(format!("{name}: {why}"));
                continue;
            }
            match self.ask(i, scope).await {
                Ok(t) => {
                    tracing::info!(
                        credential = name,
                        "the default Azure credential chain uses it"
                    );
                    *self.chosen.lock().unwrap_or_else(|e| e.into_inner()) = Some(i);
                    return Ok(t);
                }
                Err(AuthError::Unavailable(why)) => tried.push(format!("{name}: {why}")),
                Err(e) => {
                    return Err(AuthError::Setting(format!(
                        "default Azure credential chain: {name}: {e}"
                    )));
                }
            }
        }
        Err(AuthError::Unavailable(format!(
            "the default Azure credential chain found no credential; tried {}",
            tried.join("; ")
        )))
    }
}

#[cfg(test)]
mod tests;
