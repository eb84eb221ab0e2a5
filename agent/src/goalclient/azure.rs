//! Azure credentials: bearer tokens from Microsoft Entra ID for the ARM machine client and for
//! `aks-flex-node token kubelogin` (the exec credential plugin of kubelet and the daemon).
//!
//! - [`ClientSecretCredential`]: a service principal's client secret, exchanged with the
//!   client credentials grant at `<authority host>/<tenant>/oauth2/v2.0/token`.
//! - [`ManagedIdentityCredential`]: the instance metadata service (IMDS),
//!   `GET <endpoint>?api-version=2018-02-01&resource=<scope without /.default>[&client_id=<id>]`
//!   with `Metadata: true`.
//!
//! Which one: [`from_config`] (`azure.servicePrincipal`, else `azure.managedIdentity`), with
//! [`from_config_or_default`] the default Azure credential chain ([`chain`]) when a config names
//! neither, and
//! [`from_kubelogin_env`] (`AAD_LOGIN_METHOD=spn|msi` with the variables
//! `crate::machine::nodegoal` gives kubelet's exec credential).
//!
//! Endpoints: the authority host is `AZURE_AUTHORITY_HOST` when set (the Azure SDKs' variable);
//! otherwise, from a config, the cloud of `azure.resourceManagerEndpoint` (public, US
//! Government, China; any other endpoint gets the public cloud's, as upstream), and for kubelogin
//! the public cloud's. The IMDS token endpoint is `AKS_FLEX_NODE_IMDS_ENDPOINT` when set (this
//! agent's variable, a full URL: no Azure SDK has one for IMDS itself), otherwise
//! [`DEFAULT_IMDS_ENDPOINT`]. Plain `http` is accepted only for loopback, private and
//! link-local hosts (`flex_host::http::is_local_address`), so a client secret never crosses a
//! network unencrypted.
//!
//! Every request has a timeout ([`REQUEST_TIMEOUT`]) and goes through the workspace's one
//! backoff (`flex_host::retry`): transport errors and the statuses worth asking again
//! ([`super::retry::retryable_status`]; IMDS also 404 and 410, its answers while an identity is
//! being assigned or IMDS is updated) are retried, honouring `Retry-After`. A token is reused
//! until 5 minutes before it expires.
//!
//! Nothing secret reaches an error, a `Debug` output or a log line: the client secret and the
//! tokens are [`Secret`]s, and an error names the endpoint, the HTTP status and Entra ID's
//! `error` and `error_description` (with the client secret cut out, should a server echo it),
//! never a response body that may hold a token.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use flex_host::retry::{Attempt, Backoff, retry};
use url::Url;

use super::retry::{parse_retry_after, retryable_status};
use crate::config::Config;
use flex_host::secret::Secret;

pub mod chain;

/// The public cloud's authority host.
pub const DEFAULT_AUTHORITY_HOST: &str = "https://login.microsoftonline.com/";
/// Overrides the authority host (the Azure SDKs' variable).
pub const AUTHORITY_HOST_ENV: &str = "AZURE_AUTHORITY_HOST";
/// The IMDS managed identity token endpoint.
pub const DEFAULT_IMDS_ENDPOINT: &str = "http://169.254.169.254/metadata/identity/oauth2/token";
/// Overrides the IMDS token endpoint (a full URL; this agent's variable).
pub const IMDS_ENDPOINT_ENV: &str = "AKS_FLEX_NODE_IMDS_ENDPOINT";
/// The IMDS API version asked for.
pub const IMDS_API_VERSION: &str = "2018-02-01";
/// The longest one token request may take, connecting included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A cached token is renewed this long before it expires.
const RENEW_BEFORE: Duration = Duration::from_secs(300);
/// How much of an error answer an error repeats.
const DETAIL_LIMIT: usize = 400;

/// kubelogin's login method: `spn` or `msi`.
pub const LOGIN_METHOD_ENV: &str = "AAD_LOGIN_METHOD";
/// The service principal's client id (`spn`).
pub const SP_CLIENT_ID_ENV: &str = "AAD_SERVICE_PRINCIPAL_CLIENT_ID";
/// The service principal's client secret (`spn`).
pub use crate::machine::nodegoal::SP_CLIENT_SECRET_ENV;
/// The tenant (`spn`).
pub const TENANT_ID_ENV: &str = "AZURE_TENANT_ID";
/// A user-assigned identity's client id (`msi`; unset: the system-assigned identity).
pub const CLIENT_ID_ENV: &str = "AZURE_CLIENT_ID";

/// A process environment, by name.
pub type Env = BTreeMap<String, String>;

/// This process's environment (variables whose name or value is not UTF-8 are left out).
pub fn process_env() -> Env {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

fn env_value<'a>(env: &'a Env, name: &str) -> Option<&'a str> {
    env.get(name).map(|v| v.trim()).filter(|v| !v.is_empty())
}

/// `env` with the service principal's secret read from the file
/// `AAD_SERVICE_PRINCIPAL_CLIENT_SECRET_FILE` names, when `AAD_SERVICE_PRINCIPAL_CLIENT_SECRET`
/// itself is unset: a machine's kubelet runs the exec credential and the image credential
/// provider so (their files name the secret's file, never the secret:
/// `crate::machine::nodegoal::SP_SECRET_IN_ROOTFS`). The error names the variable and the
/// path, never the content.
pub fn with_secret_file(mut env: Env, fs: &flex_host::fs::HostFs) -> Result<Env, AuthError> {
    use crate::machine::nodegoal::SP_CLIENT_SECRET_FILE_ENV;
    if env_value(&env, SP_CLIENT_SECRET_ENV).is_some() {
        return Ok(env);
    }
    let Some(path) = env_value(&env, SP_CLIENT_SECRET_FILE_ENV).map(std::path::PathBuf::from)
    else {
        return Ok(env);
    };
    let setting = |what: String| {
        AuthError::Setting(format!(
            "{SP_CLIENT_SECRET_FILE_ENV} {}: {what}",
            path.display()
        ))
    };
    let bytes = fs
        .read(&path)
        .map_err(|e| setting(e.to_string()))?
        .ok_or_else(|| setting("no such file".into()))?;
    let text = String::from_utf8(bytes).map_err(|_| setting("not UTF-8".into()))?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(setting("empty".into()));
    }
    env.insert(SP_CLIENT_SECRET_ENV.into(), secret.to_string());
    Ok(env)
}

/// An access token.
#[derive(Clone, Debug)]
pub struct AccessToken {
    /// The bearer token.
    pub token: Secret,
    /// When it expires, if known.
    pub expires_at: Option<SystemTime>,
}

/// Azure authentication: a bearer token for a scope.
#[async_trait]
pub trait AzureCredential: Send + Sync {
    /// A token for `scope` (e.g. `https://management.core.windows.net/.default`).
    async fn token(&self, scope: &str) -> Result<AccessToken, AuthError>;
}

/// Why no token was had.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// A setting (config or environment) is missing or wrong.
    #[error("{0}")]
    Setting(String),
    /// No credential is available for this configuration.
    #[error("{0}")]
    Unavailable(String),
    /// The request got no answer (connection, timeout, reading the body).
    #[error("{what} {endpoint}: {reason}")]
    Transport {
        /// Which request.
        what: &'static str,
        /// The endpoint, without its query.
        endpoint: String,
        /// The transport error and its causes.
        reason: String,
    },
    /// The endpoint answered with an error status.
    #[error("{what} {endpoint}: status {status}{}", detail(.error, .description))]
    Status {
        /// Which request.
        what: &'static str,
        /// The endpoint, without its query.
        endpoint: String,
        /// The status.
        status: reqwest::StatusCode,
        /// Entra ID's (or IMDS's) `error` code, or a short excerpt of a body that is not JSON.
        error: String,
        /// Its `error_description`.
        description: String,
    },
    /// The answer is not a token.
    #[error("{what} {endpoint}: {reason}")]
    Response {
        /// Which request.
        what: &'static str,
        /// The endpoint, without its query.
        endpoint: String,
        /// What is wrong with it (never its content).
        reason: TokenAnswerError,
    },
}

/// What is wrong with a token endpoint's answer; never its content (it may hold a token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenAnswerError {
    /// Not JSON; where the parser stopped.
    #[error("the answer is not JSON (line {line}, column {column})")]
    NotJson {
        /// Line of the error.
        line: usize,
        /// Column of the error.
        column: usize,
    },
    /// JSON, not an object.
    #[error("the answer is not a JSON object")]
    NotObject,
    /// `access_token` is there but empty or not a string.
    #[error("access_token is not a non-empty string")]
    BadToken,
    /// No `access_token`.
    #[error("the answer has no access_token")]
    NoToken,
    /// Neither expiry field holds seconds.
    #[error("the answer has no expires_on or expires_in in seconds")]
    NoExpiry,
    /// The expiry does not fit a time.
    #[error("the answer's expiry is out of range")]
    ExpiryOutOfRange,
}

fn detail(error: &str, description: &str) -> String {
    match (error.is_empty(), description.is_empty()) {
        (true, true) => String::new(),
        (false, true) => format!(": {error}"),
        (true, false) => format!(": {description}"),
        (false, false) => format!(": {error}: {description}"),
    }
}

/// A known Azure cloud: its ARM endpoint, ARM token audience and authority host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cloud {
    /// The Resource Manager endpoint (no trailing `/`).
    pub resource_manager: &'static str,
    /// The audience of Resource Manager tokens.
    pub audience: &'static str,
    /// The Microsoft Entra ID authority host.
    pub authority_host: &'static str,
}

/// The public, US Government and China clouds.
pub const CLOUDS: [Cloud; 3] = [
    Cloud {
        resource_manager: "https://management.azure.com",
        audience: "https://management.core.windows.net/",
        authority_host: DEFAULT_AUTHORITY_HOST,
    },
    Cloud {
        resource_manager: "https://management.usgovcloudapi.net",
        audience: "https://management.core.usgovcloudapi.net/",
        authority_host: "https://login.microsoftonline.us/",
    },
    Cloud {
        resource_manager: "https://management.chinacloudapi.cn",
        audience: "https://management.core.chinacloudapi.cn/",
        authority_host: "https://login.chinacloudapi.cn/",
    },
];

/// The cloud whose Resource Manager endpoint `endpoint` is (case-insensitively, a trailing `/`
/// ignored).
pub fn cloud_of(endpoint: &str) -> Option<&'static Cloud> {
    let e = endpoint.trim().trim_end_matches('/');
    CLOUDS
        .iter()
        .find(|c| c.resource_manager.eq_ignore_ascii_case(e))
}

/// `value` as an endpoint URL: absolute, `https`, or `http` to a loopback, private or
/// link-local host.
fn endpoint_url(what: &str, value: &str) -> Result<Url, AuthError> {
    let bad = |why: String| AuthError::Setting(format!("{what} {value:?} {why}"));
    let url = Url::parse(value.trim()).map_err(|e| bad(format!("is not a URL: {e}")))?;
    let host = url.host_str().unwrap_or_default();
    match url.scheme() {
        _ if host.is_empty() => Err(bad("has no host".into())),
        "https" => Ok(url),
        "http" if flex_host::http::is_local_address(host) => Ok(url),
        "http" => Err(bad(
            "must be https (plain http only to loopback, private or link-local hosts)".into(),
        )),
        _ => Err(bad("must be an http or https URL".into())),
    }
}

/// The authority host: `AZURE_AUTHORITY_HOST` when set, else `fallback`.
pub fn authority_host(env: &Env, fallback: &str) -> Result<Url, AuthError> {
    match env_value(env, AUTHORITY_HOST_ENV) {
        Some(v) => endpoint_url(AUTHORITY_HOST_ENV, v),
        None => endpoint_url("authority host", fallback),
    }
}

/// The IMDS token endpoint: `AKS_FLEX_NODE_IMDS_ENDPOINT` when set, else the default.
pub fn imds_endpoint(env: &Env) -> Result<Url, AuthError> {
    match env_value(env, IMDS_ENDPOINT_ENV) {
        Some(v) => endpoint_url(IMDS_ENDPOINT_ENV, v),
        None => endpoint_url("IMDS endpoint", DEFAULT_IMDS_ENDPOINT),
    }
}

/// The resource IMDS is asked for: the scope without its `/.default`.
pub fn resource_of(scope: &str) -> &str {
    scope.strip_suffix("/.default").unwrap_or(scope)
}

/// `url` as errors show it: without query and fragment.
fn shown(url: &Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.set_fragment(None);
    u.to_string()
}

/// Seconds in a token response: a JSON number or a string of digits.
fn seconds(v: Option<&serde_json::Value>) -> Option<u64> {
    match v? {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Reads a token response: `access_token`, and `expires_on` (epoch seconds) or `expires_in`
/// (seconds from `now`). The error says what is wrong, never what the body holds.
pub fn parse_token_response(body: &[u8], now: SystemTime) -> Result<AccessToken, TokenAnswerError> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| TokenAnswerError::NotJson {
            line: e.line(),
            column: e.column(),
        })?;
    let Some(obj) = v.as_object() else {
        return Err(TokenAnswerError::NotObject);
    };
    let token = match obj.get("access_token") {
        Some(serde_json::Value::String(t)) if !t.trim().is_empty() => Secret::new(t.trim()),
        Some(_) => return Err(TokenAnswerError::BadToken),
        None => return Err(TokenAnswerError::NoToken),
    };
    let expires_at = if let Some(on) = seconds(obj.get("expires_on")) {
        UNIX_EPOCH.checked_add(Duration::from_secs(on))
    } else if let Some(secs) = seconds(obj.get("expires_in")) {
        now.checked_add(Duration::from_secs(secs))
    } else {
        return Err(TokenAnswerError::NoExpiry);
    };
    match expires_at {
        Some(at) => Ok(AccessToken {
            token,
            expires_at: Some(at),
        }),
        None => Err(TokenAnswerError::ExpiryOutOfRange),
    }
}

/// The error for a failed status: the JSON `error` and `error_description`, or else a short
/// excerpt of the body; `secret` cut out of either.
fn status_error(
    what: &'static str,
    endpoint: &str,
    status: reqwest::StatusCode,
    body: &[u8],
    secret: Option<&Secret>,
) -> AuthError {
    let field = |v: &serde_json::Value, k: &str| {
        v.get(k)
            .and_then(|x| x.as_str())
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let (error, description) = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) if !field(&v, "error").is_empty() || !field(&v, "error_description").is_empty() => {
            (field(&v, "error"), field(&v, "error_description"))
        }
        // Not Entra ID's shape: an excerpt of the body.
        _ => (
            String::from_utf8_lossy(body).trim().to_string(),
            String::new(),
        ),
    };
    let clean = |s: String| {
        let s = match secret.map(Secret::expose).filter(|s| !s.is_empty()) {
            Some(secret) => s.replace(secret, flex_host::runner::REDACTED),
            None => s,
        };
        match s.char_indices().nth(DETAIL_LIMIT) {
            Some((i, _)) => format!("{}…", &s[..i]),
            None => s,
        }
    };
    AuthError::Status {
        what,
        endpoint: endpoint.to_string(),
        status,
        error: clean(error),
        description: clean(description),
    }
}

/// The last token per scope, reused until [`RENEW_BEFORE`] its expiry.
#[derive(Debug, Default)]
struct TokenCache(Mutex<BTreeMap<String, AccessToken>>);

impl TokenCache {
    fn get(&self, scope: &str) -> Option<AccessToken> {
        let cache = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let t = cache.get(scope)?;
        let fresh = t
            .expires_at
            .is_some_and(|at| at > SystemTime::now() + RENEW_BEFORE);
        fresh.then(|| t.clone())
    }

    fn put(&self, scope: &str, token: &AccessToken) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(scope.to_string(), token.clone());
    }
}

/// What both credentials ask with: the HTTP client, the backoff and the token cache.
#[derive(Debug)]
struct TokenEndpoint {
    what: &'static str,
    url: Url,
    retry_status: fn(u16) -> bool,
    http: reqwest::Client,
    backoff: Backoff,
    timeout: Duration,
    cache: TokenCache,
}

impl TokenEndpoint {
    fn new(what: &'static str, url: Url, retry_status: fn(u16) -> bool) -> Result<Self, AuthError> {
        Ok(Self {
            what,
            url,
            retry_status,
            http: flex_host::http::client()
                .map_err(|e| AuthError::Setting(format!("build the token HTTP client: {e}")))?,
            backoff: Backoff::default(),
            timeout: REQUEST_TIMEOUT,
            cache: TokenCache::default(),
        })
    }

    /// A token for `scope`: the cached one while fresh, else the answer to `request` (built
    /// over the HTTP client), sent again for every retried attempt. `secret` is cut out of
    /// error answers.
    async fn token(
        &self,
        scope: &str,
        request: impl FnOnce(&reqwest::Client) -> reqwest::RequestBuilder,
        secret: Option<&Secret>,
    ) -> Result<AccessToken, AuthError> {
        if let Some(t) = self.cache.get(scope) {
            return Ok(t);
        }
        let (what, endpoint) = (self.what, shown(&self.url));
        let request = request(&self.http)
            .header(reqwest::header::ACCEPT, "application/json")
            .timeout(self.timeout)
            .build()
            .map_err(|e| AuthError::Setting(format!("{what} {endpoint}: {e}")))?;
        let transport = |e: reqwest::Error| AuthError::Transport {
            what,
            endpoint: endpoint.clone(),
            reason: flex_api::kube_errors::error_chain(&e.without_url()),
        };
        let (http, endpoint, transport) = (&self.http, &endpoint, &transport);
        let token = retry(what, self.backoff, |_| {
            let attempt = request.try_clone();
            async move {
                let Some(req) = attempt else {
                    return Err(Attempt::Fatal(AuthError::Setting(format!(
                        "{what} {endpoint}: the request cannot be repeated"
                    ))));
                };
                let resp = http
                    .execute(req)
                    .await
                    .map_err(|e| Attempt::retry(transport(e)))?;
                let status = resp.status();
                let after = parse_retry_after(
                    resp.headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok()),
                );
                let body = match flex_host::http::read_capped(resp, flex_host::http::DOCUMENT_LIMIT)
                    .await
                {
                    Ok(b) => b,
                    Err(flex_host::http::BodyError::Read(e)) => {
                        return Err(Attempt::retry(transport(e)));
                    }
                    Err(e) => {
                        return Err(Attempt::Fatal(AuthError::Setting(format!(
                            "{what} {endpoint}: {e}"
                        ))));
                    }
                };
                if !status.is_success() {
                    let error = status_error(what, endpoint, status, &body, secret);
                    return Err(if (self.retry_status)(status.as_u16()) {
                        Attempt::Retry { error, after }
                    } else {
                        Attempt::Fatal(error)
                    });
                }
                parse_token_response(&body, SystemTime::now()).map_err(|reason| {
                    Attempt::Fatal(AuthError::Response {
                        what,
                        endpoint: endpoint.clone(),
                        reason,
                    })
                })
            }
        })
        .await?;
        self.cache.put(scope, &token);
        Ok(token)
    }
}

/// `<authority host>/<tenant>/oauth2/v2.0/token` for an application `client_id` of `tenant` (an
/// id or a domain): the token endpoint of the client credentials grant, whatever proves the
/// application (a secret, a federated token).
fn entra_token_url(tenant: &str, client_id: &str, authority_host: &Url) -> Result<Url, AuthError> {
    let tenant = tenant.trim();
    if tenant.is_empty()
        || !tenant
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        return Err(AuthError::Setting(format!(
            "service principal tenant {tenant:?} is not a tenant id or domain"
        )));
    }
    if client_id.trim().is_empty() {
        return Err(AuthError::Setting(
            "service principal client id is empty".into(),
        ));
    }
    let mut base = endpoint_url("authority host", authority_host.as_str())?;
    if !base.path().ends_with('/') {
        base.set_path(&format!("{}/", base.path()));
    }
    base.join(&format!("{tenant}/oauth2/v2.0/token"))
        .map_err(|e| AuthError::Setting(format!("authority host {base}: {e}")))
}

/// A service principal's client secret, exchanged at Microsoft Entra ID.
#[derive(Debug)]
pub struct ClientSecretCredential {
    tenant: String,
    client_id: String,
    secret: Secret,
    endpoint: TokenEndpoint,
}

impl ClientSecretCredential {
    /// The credential of `client_id` in `tenant` (an id or a domain), at `authority_host`.
    pub fn new(
        tenant: &str,
        client_id: &str,
        secret: Secret,
        authority_host: &Url,
    ) -> Result<Self, AuthError> {
        let token_url = entra_token_url(tenant, client_id, authority_host)?;
        if secret.is_blank() {
            return Err(AuthError::Setting(
                "service principal client secret is empty".into(),
            ));
        }
        let tenant = tenant.trim();
        Ok(Self {
            tenant: tenant.to_string(),
            client_id: client_id.trim().to_string(),
            secret,
            endpoint: TokenEndpoint::new(
                "Microsoft Entra ID token request to",
                token_url,
                retryable_status,
            )?,
        })
    }

    /// Replaces the retry backoff.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.endpoint.backoff = backoff;
        self
    }

    /// The tenant.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The token endpoint.
    pub fn token_url(&self) -> &Url {
        &self.endpoint.url
    }
}

impl TokenEndpoint {
    /// The client credentials grant for `client_id` at this endpoint, the application proven by
    /// `proof` (`client_secret`, or a `client_assertion` with its type), whose `secret` is cut
    /// out of error answers.
    async fn client_credentials(
        &self,
        scope: &str,
        client_id: &str,
        proof: &[(&str, &str)],
        secret: &Secret,
    ) -> Result<AccessToken, AuthError> {
        let body = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "client_credentials")
            .append_pair("client_id", client_id)
            .extend_pairs(proof)
            .append_pair("scope", scope)
            .finish();
        let url = self.url.clone();
        let request = |http: &reqwest::Client| {
            http.post(url)
                .header(
                    reqwest::header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded",
                )
                .body(body)
        };
        self.token(scope, request, Some(secret)).await
    }
}

#[async_trait]
impl AzureCredential for ClientSecretCredential {
    async fn token(&self, scope: &str) -> Result<AccessToken, AuthError> {
        self.endpoint
            .client_credentials(
                scope,
                &self.client_id,
                &[("client_secret", self.secret.expose())],
                &self.secret,
            )
            .await
    }
}

/// IMDS answers 404 while an identity is being assigned and 410 while it is updated.
fn imds_retryable(code: u16) -> bool {
    retryable_status(code) || code == 404 || code == 410
}

/// A managed identity's token from the instance metadata service.
#[derive(Debug)]
pub struct ManagedIdentityCredential {
    client_id: Option<String>,
    endpoint: TokenEndpoint,
}

impl ManagedIdentityCredential {
    /// The identity `client_id` (`None` or empty: the system-assigned one) at `endpoint`.
    pub fn new(client_id: Option<&str>, endpoint: &Url) -> Result<Self, AuthError> {
        Ok(Self {
            client_id: client_id
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string),
            endpoint: TokenEndpoint::new(
                "managed identity token request to",
                endpoint_url("IMDS endpoint", endpoint.as_str())?,
                imds_retryable,
            )?,
        })
    }

    /// Replaces the retry backoff.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.endpoint.backoff = backoff;
        self
    }

    /// Replaces the request timeout (the default chain's probe of IMDS).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.endpoint.timeout = timeout;
        self
    }

    /// The user-assigned identity's client id (`None`: system-assigned).
    pub fn client_id(&self) -> Option<&str> {
        self.client_id.as_deref()
    }

    /// The token endpoint.
    pub fn endpoint(&self) -> &Url {
        &self.endpoint.url
    }
}

#[async_trait]
impl AzureCredential for ManagedIdentityCredential {
    async fn token(&self, scope: &str) -> Result<AccessToken, AuthError> {
        let mut url = self.endpoint.url.clone();
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("api-version", IMDS_API_VERSION)
                .append_pair("resource", resource_of(scope));
            if let Some(id) = &self.client_id {
                q.append_pair("client_id", id);
            }
        }
        let request = |http: &reqwest::Client| http.get(url).header("Metadata", "true");
        self.endpoint.token(scope, request, None).await
    }
}

/// The credential a config or kubelogin's environment selects.
#[derive(Debug)]
pub enum Credential {
    /// A service principal's client secret.
    ClientSecret(ClientSecretCredential),
    /// A managed identity.
    ManagedIdentity(ManagedIdentityCredential),
    /// The default credential chain ([`chain`]), for a config that names neither.
    Default(Box<chain::DefaultAzureCredential>),
}

impl Credential {
    /// `service principal`, `managed identity` or `default credential chain`, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Credential::ClientSecret(_) => "service principal",
            Credential::ManagedIdentity(_) => "managed identity",
            Credential::Default(_) => "default credential chain",
        }
    }

    /// Replaces the retry backoff (the default chain keeps its sources' own).
    pub fn with_backoff(self, backoff: Backoff) -> Self {
        match self {
            Credential::ClientSecret(c) => Credential::ClientSecret(c.with_backoff(backoff)),
            Credential::ManagedIdentity(c) => Credential::ManagedIdentity(c.with_backoff(backoff)),
            d @ Credential::Default(_) => d,
        }
    }
}

#[async_trait]
impl AzureCredential for Credential {
    async fn token(&self, scope: &str) -> Result<AccessToken, AuthError> {
        match self {
            Credential::ClientSecret(c) => c.token(scope).await,
            Credential::ManagedIdentity(c) => c.token(scope).await,
            Credential::Default(c) => c.token(scope).await,
        }
    }
}

/// The credential `config` selects: `azure.servicePrincipal` (authority host from
/// `AZURE_AUTHORITY_HOST`, else from `azure.resourceManagerEndpoint`'s cloud), else
/// `azure.managedIdentity` (IMDS endpoint from `AKS_FLEX_NODE_IMDS_ENDPOINT`, else the
/// default); `None` when the config has neither (the default credential chain).
pub fn from_config(config: &Config, env: &Env) -> Result<Option<Credential>, AuthError> {
    if let Some(sp) = &config.azure.service_principal {
        let cloud_host = cloud_of(&config.azure.resource_manager_endpoint)
            .map_or(DEFAULT_AUTHORITY_HOST, |c| c.authority_host);
        let host = authority_host(env, cloud_host)?;
        return ClientSecretCredential::new(
            &sp.tenant_id,
            &sp.client_id,
            sp.client_secret.clone(),
            &host,
        )
        .map(|c| Some(Credential::ClientSecret(c)));
    }
    if let Some(mi) = &config.azure.managed_identity {
        return ManagedIdentityCredential::new(Some(&mi.client_id), &imds_endpoint(env)?)
            .map(|c| Some(Credential::ManagedIdentity(c)));
    }
    Ok(None)
}

/// [`from_config`], and without either the default credential chain ([`chain`], upstream's
/// `DefaultAzureCredential`) over `env`, the host's files and processes, the config's cloud's
/// authority host (or `AZURE_AUTHORITY_HOST`) and the IMDS endpoint.
pub fn from_config_or_default(config: &Config, env: &Env) -> Result<Credential, AuthError> {
    if let Some(c) = from_config(config, env)? {
        return Ok(c);
    }
    let cloud_host = cloud_of(&config.azure.resource_manager_endpoint)
        .map_or(DEFAULT_AUTHORITY_HOST, |c| c.authority_host);
    chain::DefaultAzureCredential::new(
        env,
        flex_host::fs::HostFs::host(),
        std::sync::Arc::new(flex_host::runner::ProcessRunner::new()),
        &authority_host(env, cloud_host)?,
        &imds_endpoint(env)?,
    )
    .map(|c| Credential::Default(Box::new(c)))
}

/// The credential kubelogin's environment selects: `AAD_LOGIN_METHOD=spn` with
/// `AAD_SERVICE_PRINCIPAL_CLIENT_ID`, `AAD_SERVICE_PRINCIPAL_CLIENT_SECRET` and
/// `AZURE_TENANT_ID` (authority host from `AZURE_AUTHORITY_HOST`, else the public cloud's), or
/// `AAD_LOGIN_METHOD=msi` with `AZURE_CLIENT_ID` for a user-assigned identity. kubelogin's other
/// login methods are not supported.
pub fn from_kubelogin_env(env: &Env) -> Result<Credential, AuthError> {
    let need = |name: &str| {
        env_value(env, name).ok_or_else(|| {
            AuthError::Setting(format!(
                "{name} is required with {LOGIN_METHOD_ENV}=spn but is not set"
            ))
        })
    };
    match env_value(env, LOGIN_METHOD_ENV) {
        Some("spn") => {
            let client_id = need(SP_CLIENT_ID_ENV)?;
            let secret = Secret::new(need(SP_CLIENT_SECRET_ENV)?);
            let tenant = need(TENANT_ID_ENV)?;
            let host = authority_host(env, DEFAULT_AUTHORITY_HOST)?;
            ClientSecretCredential::new(tenant, client_id, secret, &host)
                .map(Credential::ClientSecret)
        }
        Some("msi") => {
            ManagedIdentityCredential::new(env_value(env, CLIENT_ID_ENV), &imds_endpoint(env)?)
                .map(Credential::ManagedIdentity)
        }
        Some(other) => Err(AuthError::Setting(format!(
            "{LOGIN_METHOD_ENV} {other:?} is not supported by this agent (supported: spn, msi)"
        ))),
        None => Err(AuthError::Setting(format!(
            "{LOGIN_METHOD_ENV} is not set (supported: spn, msi)"
        ))),
    }
}

#[cfg(test)]
mod tests;
