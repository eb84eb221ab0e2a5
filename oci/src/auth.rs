//! Registry credentials: what the registry client answers when a registry asks who it is.
//!
//! The client asks a [`CredentialSource`] only after a registry has answered `401` (see
//! [`crate::registry`]), so a registry that serves anonymously never sees a credential and an
//! Azure Container Registry exchange is never made for an image that needs none.
//!
//! - [`RegistryCredential`]: a user name and password ([`RegistryCredential::Basic`]: sent to a
//!   `Basic` challenge, or to a `Bearer` challenge's token realm); a refresh token
//!   ([`RegistryCredential::RefreshToken`]: Docker's `identitytoken`, ACR's refresh token),
//!   exchanged at the token realm with the OAuth2 `refresh_token` grant; or a registry token
//!   ([`RegistryCredential::Bearer`]: Docker's `registrytoken`), sent to the registry as is.
//! - [`DockerConfig`]: a Docker-config-style credentials file,
//!   `{"auths": {"<registry>": {…}}}`; an entry holds `identitytoken`, `registrytoken`, `auth`
//!   (base64 of `user:password`) or `username` and `password`, in that order of preference. Keys
//!   may be written as Docker writes them (`https://index.docker.io/v1/`): a scheme and a path
//!   are dropped, and Docker Hub's names are one registry ([`registry_key`]). `credsStore` and
//!   `credHelpers` run programs; they are refused, naming the field.
//! - [`AcrExchange`]: Azure Container Registry. The node's Microsoft Entra ID token
//!   ([`AadTokenSource`]) is exchanged at `https://<registry>/oauth2/exchange`
//!   (`grant_type=access_token`) for an ACR refresh token, which the client then exchanges at the
//!   registry's token realm (`/oauth2/token`) for an access token scoped to the repository. For
//!   `*.azurecr.io`, `*.azurecr.cn`, `*.azurecr.us` and the registries it is given. The refresh
//!   token is reused until 5 minutes before its `exp` (30 minutes when it does not say).
//! - [`CredentialChain`]: the first source that has a credential for the registry.
//!
//! Nothing secret reaches an error, a `Debug` output or a log line: secrets are
//! [`flex_host::secret::Secret`]s, and errors name the registry, the endpoint, the field and the
//! HTTP status, never a value or a response body.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine as _;
use flex_host::http::InsecureRegistries;
use flex_host::retry::{Attempt, Backoff};
use flex_host::secret::Secret;

/// How the ACR exchange retries: the registry client's policy ([`crate::REGISTRY_RETRY`]).
pub const ACR_EXCHANGE_RETRY: Backoff = crate::REGISTRY_RETRY;
/// The longest one ACR exchange request may take, connecting included.
pub const ACR_EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// An ACR refresh token is exchanged again this long before its `exp`.
const ACR_RENEW_BEFORE: Duration = Duration::from_secs(300);
/// How long an ACR refresh token without a readable `exp` is reused.
const ACR_REUSE_WITHOUT_EXP: Duration = Duration::from_secs(1800);
/// The registry names that are Azure Container Registries by their suffix.
pub const ACR_SUFFIXES: [&str; 3] = [".azurecr.io", ".azurecr.cn", ".azurecr.us"];

/// A credential for one registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryCredential {
    /// A user name and password.
    Basic {
        /// The user name (not secret; it may appear in errors).
        username: String,
        /// The password.
        password: Secret,
    },
    /// An OAuth2 refresh token for the token realm (`grant_type=refresh_token`).
    RefreshToken(Secret),
    /// A bearer token sent to the registry itself.
    Bearer(Secret),
}

impl RegistryCredential {
    /// What kind of credential this is, for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Basic { .. } => "user name and password",
            Self::RefreshToken(_) => "refresh token",
            Self::Bearer(_) => "registry token",
        }
    }
}

/// Why a source could not give a credential. Never holds a secret.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The node's Microsoft Entra ID token could not be had.
    #[error("registry {registry}: no Microsoft Entra ID token for ACR's exchange: {reason}")]
    Aad {
        /// The registry.
        registry: String,
        /// Why (the Azure credential's own error, which holds no secret).
        reason: String,
    },
    /// The exchange endpoint refused the request.
    #[error("registry {registry}: {endpoint} answered {status}{}", detail_suffix(.detail))]
    Refused {
        /// The registry.
        registry: String,
        /// The endpoint.
        endpoint: String,
        /// The HTTP status.
        status: u16,
        /// The registry's error code and message, when it gave them as JSON.
        detail: String,
    },
    /// The exchange endpoint did not answer, after the retries.
    #[error("registry {registry}: {endpoint} did not answer after {attempts} attempt(s): {reason}")]
    Unreachable {
        /// The registry.
        registry: String,
        /// The endpoint.
        endpoint: String,
        /// Attempts made.
        attempts: u32,
        /// The last transport error or transient status.
        reason: String,
    },
    /// The answer is not what the protocol says.
    #[error("registry {registry}: {endpoint}: {reason}")]
    BadAnswer {
        /// The registry.
        registry: String,
        /// The endpoint.
        endpoint: String,
        /// What is wrong (never the content).
        reason: &'static str,
    },
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

/// Where the registry client gets credentials from.
#[async_trait]
pub trait CredentialSource: Send + Sync {
    /// The credential for `registry` (a [`registry_key`]), or `None` when this source has none.
    async fn credential(
        &self,
        registry: &str,
    ) -> Result<Option<RegistryCredential>, CredentialError>;
}

/// The name credentials are kept under for a registry written as `entry`: the scheme, any path
/// and a trailing `/` are dropped and the host is lower-cased; `index.docker.io`,
/// `registry-1.docker.io` and `registry.hub.docker.com` are `docker.io`. `None` for an empty
/// name.
pub fn registry_key(entry: &str) -> Option<String> {
    let s = entry.trim();
    let s = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .unwrap_or(s);
    let host = s.split('/').next().unwrap_or_default().to_ascii_lowercase();
    if host.is_empty() {
        return None;
    }
    Some(match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "docker.io".to_string()
        }
        _ => host,
    })
}

/// Why a Docker-config-style file was refused. Names the field, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DockerConfigError {
    /// Not JSON; where the parser stopped.
    #[error("{file}: not JSON (line {line}, column {column})")]
    NotJson {
        /// The file, as the caller names it.
        file: String,
        /// Line of the error.
        line: usize,
        /// Column of the error.
        column: usize,
    },
    /// A field is wrong.
    #[error("{file}: {field}: {reason}")]
    Field {
        /// The file, as the caller names it.
        file: String,
        /// The field, e.g. `auths["r.example"].auth`.
        field: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// Credentials from a Docker-config-style file, by [`registry_key`].
#[derive(Clone, Default, PartialEq, Eq)]
pub struct DockerConfig {
    entries: BTreeMap<String, RegistryCredential>,
}

impl std::fmt::Debug for DockerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The registries only: the credentials are redacted anyway, but their kinds say enough.
        f.debug_map()
            .entries(self.entries.iter().map(|(k, v)| (k, v.kind())))
            .finish()
    }
}

fn str_field<'a>(
    obj: &'a serde_json::Map<String, serde_json::Value>,
    name: &str,
    field: impl Fn(&str) -> String,
    file: &str,
) -> Result<Option<&'a str>, DockerConfigError> {
    match obj.get(name) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) if s.is_empty() => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(DockerConfigError::Field {
            file: file.to_string(),
            field: field(name),
            reason: "must be a string",
        }),
    }
}

impl DockerConfig {
    /// Parses the file's bytes; `file` names it in errors.
    pub fn parse(file: &str, bytes: &[u8]) -> Result<Self, DockerConfigError> {
        let bad = |field: String, reason: &'static str| DockerConfigError::Field {
            file: file.to_string(),
            field,
            reason,
        };
        let doc: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| DockerConfigError::NotJson {
                file: file.to_string(),
                line: e.line(),
                column: e.column(),
            })?;
        let top = doc
            .as_object()
            .ok_or_else(|| bad("(top level)".into(), "must be a JSON object"))?;
        for helper in ["credsStore", "credHelpers"] {
            if top.get(helper).is_some_and(|v| !v.is_null()) {
                return Err(bad(
                    helper.into(),
                    "credential helpers run programs and are not supported: put the \
                     credentials under auths",
                ));
            }
        }
        let mut entries = BTreeMap::new();
        let Some(auths) = top.get("auths") else {
            return Ok(Self { entries });
        };
        let auths = auths
            .as_object()
            .ok_or_else(|| bad("auths".into(), "must be a JSON object"))?;
        for (name, entry) in auths {
            let at = |f: &str| format!("auths[{name:?}].{f}");
            let key = registry_key(name)
                .ok_or_else(|| bad(format!("auths[{name:?}]"), "names no registry"))?;
            let obj = entry
                .as_object()
                .ok_or_else(|| bad(format!("auths[{name:?}]"), "must be a JSON object"))?;
            let credential = if let Some(t) = str_field(obj, "identitytoken", at, file)? {
                RegistryCredential::RefreshToken(Secret::new(t))
            } else if let Some(t) = str_field(obj, "registrytoken", at, file)? {
                RegistryCredential::Bearer(Secret::new(t))
            } else if let Some(a) = str_field(obj, "auth", at, file)? {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(a.trim())
                    .map_err(|_| bad(at("auth"), "is not base64"))?;
                let decoded =
                    String::from_utf8(decoded).map_err(|_| bad(at("auth"), "is not UTF-8"))?;
                let (user, password) = decoded
                    .split_once(':')
                    .ok_or_else(|| bad(at("auth"), "is not base64 of user:password"))?;
                if user.is_empty() {
                    return Err(bad(at("auth"), "has an empty user name"));
                }
                RegistryCredential::Basic {
                    username: user.to_string(),
                    password: Secret::new(password),
                }
            } else {
                match (
                    str_field(obj, "username", at, file)?,
                    str_field(obj, "password", at, file)?,
                ) {
                    (Some(u), Some(p)) => RegistryCredential::Basic {
                        username: u.to_string(),
                        password: Secret::new(p),
                    },
                    (Some(_), None) => return Err(bad(at("password"), "is missing")),
                    (None, Some(_)) => return Err(bad(at("username"), "is missing")),
                    (None, None) => {
                        return Err(bad(
                            format!("auths[{name:?}]"),
                            "holds no identitytoken, registrytoken, auth, or username and \
                             password",
                        ));
                    }
                }
            };
            if entries.insert(key.clone(), credential).is_some() {
                return Err(bad(
                    format!("auths[{name:?}]"),
                    "names a registry another entry already names",
                ));
            }
        }
        Ok(Self { entries })
    }

    /// The registries this file has credentials for.
    pub fn registries(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// The credential for `registry`, looked up by its [`registry_key`].
    pub fn get(&self, registry: &str) -> Option<&RegistryCredential> {
        self.entries.get(&registry_key(registry)?)
    }
}

#[async_trait]
impl CredentialSource for DockerConfig {
    async fn credential(
        &self,
        registry: &str,
    ) -> Result<Option<RegistryCredential>, CredentialError> {
        Ok(self.get(registry).cloned())
    }
}

/// The first source with a credential for the registry; an error of a source ends the search.
#[derive(Clone, Default)]
pub struct CredentialChain(Vec<Arc<dyn CredentialSource>>);

impl CredentialChain {
    /// A chain of `sources`, asked in order.
    pub fn new(sources: Vec<Arc<dyn CredentialSource>>) -> Self {
        Self(sources)
    }

    /// Whether the chain has no source.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[async_trait]
impl CredentialSource for CredentialChain {
    async fn credential(
        &self,
        registry: &str,
    ) -> Result<Option<RegistryCredential>, CredentialError> {
        for s in &self.0 {
            if let Some(c) = s.credential(registry).await? {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }
}

/// Why the node's Entra ID token could not be had (the identity's own error, which holds no
/// secret).
pub type AadError = Box<dyn std::error::Error + Send + Sync>;

/// The node's Microsoft Entra ID identity, for ACR's exchange.
#[async_trait]
pub trait AadTokenSource: Send + Sync {
    /// An access token ACR accepts (audience Resource Manager). The error holds no secret.
    async fn aad_token(&self) -> Result<Secret, AadError>;
    /// The tenant, when known (sent to the exchange).
    fn tenant(&self) -> Option<String>;
}

/// Azure Container Registry's exchange of the node's Entra ID token for a refresh token.
pub struct AcrExchange {
    http: reqwest::Client,
    aad: Arc<dyn AadTokenSource>,
    also: Vec<String>,
    insecure: InsecureRegistries,
    retry: Backoff,
    timeout: Duration,
    cache: Mutex<HashMap<String, (Secret, Instant)>>,
}

impl std::fmt::Debug for AcrExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcrExchange")
            .field("also", &self.also)
            .field("retry", &self.retry)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Seconds until a JWT's `exp`, read without verifying it (the registry verifies it; this only
/// decides when to ask again). `None` when it is not a JWT with a numeric `exp`.
fn jwt_expiry(token: &str) -> Option<std::time::SystemTime> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = v.get("exp")?.as_u64()?;
    std::time::UNIX_EPOCH.checked_add(Duration::from_secs(exp))
}

enum ExchangeFailure {
    Transient(String),
    Permanent(CredentialError),
}

impl std::fmt::Display for ExchangeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Transient(r) => f.write_str(r),
            Self::Permanent(e) => e.fmt(f),
        }
    }
}

impl AcrExchange {
    /// An exchange for the ACR-named registries and `also` (keys as [`registry_key`] makes
    /// them), over `http`, reaching a registry in `insecure` over plain HTTP.
    pub fn new(
        http: reqwest::Client,
        aad: Arc<dyn AadTokenSource>,
        also: &[String],
        insecure: InsecureRegistries,
    ) -> Self {
        Self {
            http,
            aad,
            also: also.iter().filter_map(|r| registry_key(r)).collect(),
            insecure,
            retry: ACR_EXCHANGE_RETRY,
            timeout: ACR_EXCHANGE_TIMEOUT,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The same exchange with another retry policy and request timeout (tests).
    pub fn with_retry(mut self, retry: Backoff, timeout: Duration) -> Self {
        self.retry = retry;
        self.timeout = timeout;
        self
    }

    /// Whether `registry` is one this exchange serves.
    pub fn serves(&self, registry: &str) -> bool {
        let Some(key) = registry_key(registry) else {
            return false;
        };
        let host = key.split(':').next().unwrap_or_default();
        ACR_SUFFIXES
            .iter()
            .any(|s| host.ends_with(s) && host.len() > s.len())
            || self.also.contains(&key)
    }

    async fn exchange_once(
        &self,
        registry: &str,
        endpoint: &str,
        form: &[(&str, &str)],
    ) -> Result<Secret, ExchangeFailure> {
        let resp = self
            .http
            .post(endpoint)
            .timeout(self.timeout)
            .header(reqwest::header::CONTENT_TYPE, FORM)
            .body(form_body(form))
            .send()
            .await
            .map_err(|e| {
                ExchangeFailure::Transient(flex_host::error::Chain(&e.without_url()).to_string())
            })?;
        let status = resp.status();
        if !status.is_success() {
            if matches!(status.as_u16(), 408 | 429 | 500 | 502 | 503 | 504) {
                return Err(ExchangeFailure::Transient(format!("status {status}")));
            }
            let (bytes, _) = flex_host::http::read_limited(resp, flex_host::http::ERROR_BODY_LIMIT)
                .await
                .unwrap_or_default();
            return Err(ExchangeFailure::Permanent(CredentialError::Refused {
                registry: registry.to_string(),
                endpoint: endpoint.to_string(),
                status: status.as_u16(),
                detail: acr_error_detail(&bytes),
            }));
        }
        let body = flex_host::http::read_capped(resp, flex_host::http::DOCUMENT_LIMIT)
            .await
            .map_err(|e| ExchangeFailure::Transient(e.to_string()))?;
        let bad = |reason| {
            ExchangeFailure::Permanent(CredentialError::BadAnswer {
                registry: registry.to_string(),
                endpoint: endpoint.to_string(),
                reason,
            })
        };
        let v: serde_json::Value =
            serde_json::from_slice(&body).map_err(|_| bad("the answer is not JSON"))?;
        match v.get("refresh_token").and_then(|t| t.as_str()) {
            Some(t) if !t.is_empty() => Ok(Secret::new(t)),
            _ => Err(bad("the answer has no refresh_token")),
        }
    }
}

/// The media type of an OAuth2 form.
pub(crate) const FORM: &str = "application/x-www-form-urlencoded";

/// `pairs` as an OAuth2 form body.
pub(crate) fn form_body(pairs: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// ACR's error answer: a registry's (`{"errors":[…]}`, the registry client's reading) or
/// OAuth2's `{"error":…}`; codes and messages only, bounded.
fn acr_error_detail(bytes: &[u8]) -> String {
    let text = crate::error::registry_errors(bytes).or_else(|| {
        let v = serde_json::from_slice::<serde_json::Value>(bytes).ok()?;
        v.get("error")?.as_str().map(str::to_string)
    });
    text.unwrap_or_default().chars().take(300).collect()
}

#[async_trait]
impl CredentialSource for AcrExchange {
    async fn credential(
        &self,
        registry: &str,
    ) -> Result<Option<RegistryCredential>, CredentialError> {
        Ok(self
            .refresh_token(registry)
            .await?
            .map(|(t, _)| RegistryCredential::RefreshToken(t)))
    }
}

impl AcrExchange {
    /// ACR's refresh token for `registry` and how long it is reused (until 5 minutes before it
    /// expires); `None` for a registry this exchange does not serve. Kubelet's credential
    /// provider (`aks-flex-node token acr`) answers with it.
    pub async fn refresh_token(
        &self,
        registry: &str,
    ) -> Result<Option<(Secret, Duration)>, CredentialError> {
        if !self.serves(registry) {
            return Ok(None);
        }
        let Some(key) = registry_key(registry) else {
            return Ok(None);
        };
        if let Some((t, until)) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            let left = until.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                return Ok(Some((t.clone(), left)));
            }
        }
        let aad = self
            .aad
            .aad_token()
            .await
            .map_err(|e| CredentialError::Aad {
                registry: key.clone(),
                reason: flex_host::error::Chain(&*e).to_string(),
            })?;
        let endpoint = format!("{}://{key}/oauth2/exchange", self.insecure.scheme_for(&key));
        let tenant = self.aad.tenant();
        let mut form = vec![
            ("grant_type", "access_token"),
            ("service", key.as_str()),
            ("access_token", aad.expose()),
        ];
        if let Some(t) = tenant.as_deref() {
            form.push(("tenant", t));
        }
        tracing::debug!(registry = %key, "exchanging the node's Entra ID token at ACR");
        let outcome = flex_host::retry::retry("ACR token exchange", self.retry, |_| {
            let next = self.exchange_once(&key, &endpoint, &form);
            async move {
                next.await.map_err(|e| match e {
                    ExchangeFailure::Transient(r) => Attempt::retry(ExchangeFailure::Transient(r)),
                    ExchangeFailure::Permanent(_) => Attempt::Fatal(e),
                })
            }
        })
        .await;
        let token = match outcome {
            Ok(t) => t,
            Err(ExchangeFailure::Permanent(e)) => return Err(e),
            Err(ExchangeFailure::Transient(reason)) => {
                return Err(CredentialError::Unreachable {
                    registry: key,
                    endpoint,
                    attempts: self.retry.max_attempts(),
                    reason,
                });
            }
        };
        let reuse = jwt_expiry(token.expose())
            .and_then(|exp| exp.duration_since(std::time::SystemTime::now()).ok())
            .map_or(ACR_REUSE_WITHOUT_EXP, |d| {
                d.saturating_sub(ACR_RENEW_BEFORE)
            });
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, (token.clone(), Instant::now() + reuse));
        Ok(Some((token, reuse)))
    }
}

#[cfg(test)]
mod tests;
