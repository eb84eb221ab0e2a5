//! An OCI distribution (registry v2) client: manifests, blobs, pushes; anonymous, or with credentials.
//!
//! - **Transport**: the agent's `reqwest::Client` ([`flex_host::http::client`]). HTTPS, except
//!   for a registry named in the client's opt-in list
//!   ([`RegistryClient::with_insecure_registries`], a [`flex_host::http::InsecureRegistries`]),
//!   which gets plain HTTP and a warning naming it once per pull or push
//!   ([`RegistryClient::warn_if_plain_http`]). The registry's address plays no part: a private
//!   or loopback registry that is not listed is HTTPS too.
//! - **Auth**: anonymous unless a `401` says otherwise. On a `401` the client's
//!   [`CredentialSource`] ([`RegistryClient::with_credentials`], see [`crate::auth`]) is asked
//!   for the registry's credential, then:
//!   - `WWW-Authenticate: Bearer realm=…,service=…,scope=…`: a token from the realm — `GET
//!     realm?service=…&scope=…`, anonymous or with the user name and password; or, with a refresh
//!     token, `POST realm` with `grant_type=refresh_token` (Docker's OAuth2 flow, ACR's
//!     `/oauth2/token`); a registry token is used as the bearer token itself;
//!   - `WWW-Authenticate: Basic …`: the user name and password, sent to the registry.
//!
//!   What worked is cached per registry and scope and the request is sent once more with it.
//!   A second `401`, a challenge of another scheme, or a challenge with no credential for it is
//!   an [`OciError::Auth`] error naming the registry and the status, never the credential.
//!   Authorization is never carried to another host by a redirect (`reqwest` drops it).
//! - **Manifests**: `Accept` lists OCI index/manifest and Docker list/manifest; Docker types are
//!   mapped to OCI ones ([`super::manifest`]). The bytes are hashed: against the digest asked
//!   for, the index entry's descriptor, and the `Docker-Content-Digest` header.
//! - **Blobs**: streamed to a temporary file next to the destination while hashed; never more
//!   than the descriptor's size is accepted, and the digest must match before the file is renamed
//!   into place. A blob already at the destination is re-hashed and reused when it matches.
//! - **Retries**: connection/DNS failures, resets and timeouts, and HTTP 429, 500, 502, 503, 504
//!   are retried ([`REGISTRY_RETRY`]: 5 attempts in all with a delay starting at 2 s and
//!   doubling). A digest mismatch is not retried.
//! - **Push**: monolithic blob upload (`POST /v2/<name>/blobs/uploads/`, then `PUT <location>?
//!   digest=…`), skipped when `HEAD` finds the blob; `PUT` of a manifest.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, CONTENT_TYPE, LOCATION, WWW_AUTHENTICATE};
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt;
use tracing::Instrument;

use super::OciError;
use super::ResolvedImage;
use super::auth::{CredentialSource, RegistryCredential, registry_key};
use super::digest::Digest;
use super::manifest::{
    Arch, Descriptor, ImageManifest, MAX_MANIFEST_BYTES, Manifest, media_type, parse_manifest,
    select_platform,
};
use super::reference::ImageRef;
use flex_host::http::InsecureRegistries;
use flex_host::retry::{Attempt, Backoff};

/// How registries retry transient failures by default: 5 attempts, 2 s doubling (2, 4, 8, 16 s), at most 30 s apart.
pub const REGISTRY_RETRY: Backoff =
    Backoff::new(5, Duration::from_secs(2), Duration::from_secs(30));

/// A manifest or index as fetched.
#[derive(Clone, Debug)]
pub struct FetchedManifest {
    /// The digest of `bytes`.
    pub digest: Digest,
    /// The response's `Content-Type`.
    pub content_type: Option<String>,
    /// The bytes as received.
    pub bytes: Vec<u8>,
    /// The parsed document (media types normalized to OCI).
    pub manifest: Manifest,
}

/// What a request carries once a registry has asked (cached per registry and scope).
#[derive(Clone)]
enum Authorization {
    Bearer(flex_host::secret::Secret),
    Basic {
        username: String,
        password: flex_host::secret::Secret,
    },
}

impl Authorization {
    fn apply(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self {
            Self::Bearer(t) => req.bearer_auth(t.expose()),
            Self::Basic { username, password } => req.basic_auth(username, Some(password.expose())),
        }
    }
}

/// The registry client. Cheap to clone (the HTTP client, credential source and token cache are
/// shared).
#[derive(Clone)]
pub struct RegistryClient {
    http: reqwest::Client,
    retry: Backoff,
    insecure: InsecureRegistries,
    credentials: Option<Arc<dyn CredentialSource>>,
    tokens: Arc<Mutex<HashMap<String, Authorization>>>,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Tokens are bearer credentials, even anonymous ones: never shown.
        f.debug_struct("RegistryClient")
            .field("retry", &self.retry)
            .field("insecure", &self.insecure)
            .field("credentials", &self.credentials.is_some())
            .finish_non_exhaustive()
    }
}

enum Failure {
    Transient(OciError),
    Permanent(OciError),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Transient(e) | Self::Permanent(e) => e.fmt(f),
        }
    }
}

type Build<'a> = &'a (dyn Fn(&reqwest::Client) -> reqwest::RequestBuilder + Send + Sync);

fn is_transient_status(s: StatusCode) -> bool {
    matches!(s.as_u16(), 429 | 500 | 502 | 503 | 504)
}

fn is_transient_error(e: &reqwest::Error) -> bool {
    !(e.is_builder() || e.is_redirect() || e.is_status() || e.is_decode())
}

/// A parsed `WWW-Authenticate: Bearer …` challenge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BearerChallenge {
    /// Token endpoint.
    pub realm: String,
    /// `service` parameter.
    pub service: Option<String>,
    /// `scope` parameter.
    pub scope: Option<String>,
}

/// Parses a Bearer challenge (`Bearer realm="…",service="…",scope="…"`); quoted values may hold
/// commas. `None` for other schemes or without a realm.
pub fn parse_bearer_challenge(header: &str) -> Option<BearerChallenge> {
    let header = header.trim();
    let (scheme, rest) = header.split_once(char::is_whitespace)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut params: HashMap<String, String> = HashMap::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars
            .by_ref()
            .take_while(|c| *c != '=')
            .collect::<String>()
            .trim()
            .to_ascii_lowercase();
        if key.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => {
                        if let Some(n) = chars.next() {
                            value.push(n);
                        }
                    }
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.peek().copied() {
                if c == ',' {
                    break;
                }
                value.push(c);
                chars.next();
            }
            value = value.trim().to_string();
        }
        params.insert(key, value);
    }
    Some(BearerChallenge {
        realm: params.remove("realm").filter(|r| !r.is_empty())?,
        service: params.remove("service"),
        scope: params.remove("scope"),
    })
}

/// Why a token endpoint's answer gave no token. Neither quotes the body (it may hold a token).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenResponseError {
    /// The body is not JSON.
    #[error("not JSON: {0}")]
    NotJson(String),
    /// No non-empty `token` or `access_token`.
    #[error("no token")]
    NoToken,
}

/// The token in a token endpoint's answer: `token`, else `access_token` (Docker's token
/// spec), a non-empty string.
pub fn parse_token_response(body: &[u8]) -> Result<String, TokenResponseError> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| TokenResponseError::NotJson(e.to_string()))?;
    v.get("token")
        .or_else(|| v.get("access_token"))
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .ok_or(TokenResponseError::NoToken)
}

fn scope(image: &ImageRef, push: bool) -> String {
    format!(
        "repository:{}:{}",
        image.repository,
        if push { "pull,push" } else { "pull" }
    )
}

async fn error_detail(resp: reqwest::Response) -> String {
    // Bounded: an error body is only quoted, never needed whole.
    let (bytes, _) = flex_host::http::read_limited(resp, flex_host::http::ERROR_BODY_LIMIT)
        .await
        .unwrap_or_default();
    if let Some(errors) = super::error::registry_errors(&bytes) {
        return errors;
    }
    String::from_utf8_lossy(&bytes)
        .trim()
        .chars()
        .take(300)
        .collect()
}

/// Why the token realm `realm`, named by a registry, is not asked: a scheme other than HTTP(S);
/// plain HTTP unless the realm's `host[:port]` or the registry that named it (`registry_listed`)
/// is in `insecure`; a link-local address (a cloud's metadata service) unless listed. `None`:
/// it is asked.
pub fn realm_refusal(
    realm: &url::Url,
    insecure: &InsecureRegistries,
    registry_listed: bool,
) -> Option<&'static str> {
    let host = realm.host_str().unwrap_or_default();
    let host_port = match realm.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    let listed = insecure.allows(&host_port);
    let link_local = match realm.host() {
        Some(url::Host::Ipv4(v4)) => v4.is_link_local(),
        Some(url::Host::Ipv6(v6)) => v6.is_unicast_link_local(),
        _ => false,
    };
    match realm.scheme() {
        "https" | "http" if link_local && !listed => Some("is a link-local address"),
        "https" => None,
        "http" if listed || registry_listed => None,
        "http" => Some(
            "is plain HTTP, and neither it nor the registry that named it is listed as insecure",
        ),
        _ => Some("is not an http(s) URL"),
    }
}

impl RegistryClient {
    /// A client over `http` (normally [`flex_host::http::client`]) with the default retry policy.
    pub fn new(http: reqwest::Client) -> Self {
        Self {
            http,
            retry: REGISTRY_RETRY,
            insecure: InsecureRegistries::none(),
            credentials: None,
            tokens: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The same client, answering registries that ask for credentials from `source`.
    pub fn with_credentials(mut self, source: Arc<dyn CredentialSource>) -> Self {
        self.credentials = Some(source);
        self
    }

    /// The same client, reaching the registries in `insecure` over plain HTTP (the explicit
    /// opt-in); every other registry stays HTTPS.
    pub fn with_insecure_registries(mut self, insecure: InsecureRegistries) -> Self {
        self.insecure = insecure;
        self
    }

    /// The registries this client reaches over plain HTTP.
    pub fn insecure_registries(&self) -> &InsecureRegistries {
        &self.insecure
    }

    /// Logs a warning naming `image`'s registry when this client reaches it over plain HTTP;
    /// `what` is the operation (`pull`, `push`). Called once per operation: by
    /// [`RegistryClient::resolve`] and [`RegistryClient::push_image`], and by callers that
    /// drive a pull from [`RegistryClient::fetch_manifest`] themselves.
    pub fn warn_if_plain_http(&self, image: &ImageRef, what: &str) {
        let registry = image.api_host();
        if self.insecure.allows(registry) {
            tracing::warn!(
                registry,
                image = %image,
                "{what} over plain HTTP: the registry is listed as insecure; its content is not \
                 protected in transit (digests are still verified)"
            );
        }
    }

    /// The same client with another retry policy.
    pub fn with_retry(mut self, retry: Backoff) -> Self {
        self.retry = Backoff {
            attempts: retry.max_attempts(),
            ..retry
        };
        self
    }

    /// The retry policy in force.
    pub fn retry_policy(&self) -> Backoff {
        self.retry
    }

    /// `<scheme>://<api host>/v2/<repository>/<path>`: `http` for a registry in the insecure
    /// list, `https` otherwise.
    pub fn url(&self, image: &ImageRef, path: &str) -> String {
        let host = image.api_host();
        format!(
            "{}://{host}/v2/{}/{path}",
            self.insecure.scheme_for(host),
            image.repository
        )
    }

    async fn retrying<T, F, Fut>(
        &self,
        image: &ImageRef,
        what: &str,
        mut f: F,
    ) -> Result<T, OciError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let attempts = self.retry.max_attempts();
        let label = format!("{what} ({image})");
        let outcome = flex_host::retry::retry(&label, self.retry, |_| {
            let next = f();
            async move {
                next.await.map_err(|e| match e {
                    Failure::Transient(_) => Attempt::retry(e),
                    Failure::Permanent(_) => Attempt::Fatal(e),
                })
            }
        })
        .await;
        match outcome {
            Ok(v) => Ok(v),
            Err(Failure::Permanent(e)) => Err(e),
            Err(Failure::Transient(e)) if attempts == 1 => Err(e),
            Err(Failure::Transient(e)) => Err(OciError::GaveUp {
                reference: image.to_string(),
                attempts,
                cause: Box::new(e),
            }),
        }
    }

    fn http_error(image: &ImageRef, method: &'static str, url: &str, e: reqwest::Error) -> Failure {
        let transient = is_transient_error(&e);
        let err = OciError::Http {
            reference: image.to_string(),
            method,
            url: url.to_string(),
            cause: e,
        };
        if transient {
            Failure::Transient(err)
        } else {
            Failure::Permanent(err)
        }
    }

    async fn status_error(
        image: &ImageRef,
        method: &'static str,
        url: &str,
        resp: reqwest::Response,
    ) -> Failure {
        let status = resp.status();
        let err = OciError::Status {
            reference: image.to_string(),
            method,
            url: url.to_string(),
            status: status.as_u16(),
            detail: error_detail(resp).await,
        };
        if is_transient_status(status) {
            Failure::Transient(err)
        } else {
            Failure::Permanent(err)
        }
    }

    async fn fetch_token(
        &self,
        image: &ImageRef,
        challenge: &BearerChallenge,
        fallback_scope: &str,
        credential: Option<&RegistryCredential>,
    ) -> Result<String, Failure> {
        let auth = |reason: String| {
            Failure::Permanent(OciError::Auth {
                reference: image.to_string(),
                reason,
            })
        };
        let mut url = url::Url::parse(&challenge.realm)
            .map_err(|e| auth(format!("bad token realm {:?}: {e}", challenge.realm)))?;
        realm_refusal(&url, &self.insecure, self.insecure.allows(image.api_host()))
            .map_or(Ok(()), |why| {
                Err(auth(format!("token realm {:?} {why}", challenge.realm)))
            })?;
        let scope = challenge.scope.as_deref().unwrap_or(fallback_scope);
        let shown = url.to_string();
        let req = match credential {
            // Docker's OAuth2 token flow: the refresh token in a form, never in the URL.
            Some(RegistryCredential::RefreshToken(t)) => {
                let mut form = vec![
                    ("grant_type", "refresh_token"),
                    ("scope", scope),
                    ("client_id", "aks-flex-node"),
                    ("refresh_token", t.expose()),
                ];
                if let Some(s) = &challenge.service {
                    form.push(("service", s));
                }
                tracing::debug!(realm = %challenge.realm, "fetching a token with a refresh token");
                self.http
                    .post(url)
                    .header(CONTENT_TYPE, super::auth::FORM)
                    .body(super::auth::form_body(&form))
            }
            other => {
                {
                    let mut q = url.query_pairs_mut();
                    if let Some(s) = &challenge.service {
                        q.append_pair("service", s);
                    }
                    q.append_pair("scope", scope);
                }
                let req = self.http.get(url);
                match other {
                    Some(RegistryCredential::Basic { username, password }) => {
                        tracing::debug!(realm = %challenge.realm, "fetching a token as {username}");
                        req.basic_auth(username, Some(password.expose()))
                    }
                    _ => {
                        tracing::debug!(realm = %challenge.realm, "fetching anonymous token");
                        req
                    }
                }
            }
        };
        let method = if matches!(credential, Some(RegistryCredential::RefreshToken(_))) {
            "POST"
        } else {
            "GET"
        };
        let resp = req
            .send()
            .await
            .map_err(|e| Self::http_error(image, method, &shown, e))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let failure = Self::status_error(image, method, &shown, resp).await;
            return Err(match failure {
                Failure::Transient(e) => Failure::Transient(e),
                Failure::Permanent(_) => auth(match credential {
                    Some(c) => format!(
                        "token endpoint {shown} answered {status} to the {} for {}",
                        c.kind(),
                        image.registry
                    ),
                    None => format!("token endpoint {shown} answered {status}"),
                }),
            });
        }
        // Bounded: the realm is whatever URL the registry named.
        let body = flex_host::http::read_capped(resp, flex_host::http::DOCUMENT_LIMIT)
            .await
            .map_err(|e| auth(format!("token endpoint {shown}: {e}")))?;
        parse_token_response(&body).map_err(|reason| match reason {
            TokenResponseError::NotJson(e) => {
                auth(format!("token endpoint {shown}: not JSON: {e}"))
            }
            TokenResponseError::NoToken => {
                auth(format!("token endpoint {shown} returned no token"))
            }
        })
    }

    /// The credential for `image`'s registry from the client's source (`None` without one).
    async fn credential_for(
        &self,
        image: &ImageRef,
    ) -> Result<Option<RegistryCredential>, Failure> {
        let Some(source) = &self.credentials else {
            return Ok(None);
        };
        let Some(key) = registry_key(&image.registry) else {
            return Ok(None);
        };
        source.credential(&key).await.map_err(|e| {
            Failure::Permanent(OciError::Auth {
                reference: image.to_string(),
                reason: e.to_string(),
            })
        })
    }

    /// How to answer the challenge of a `401` (`header`, the `WWW-Authenticate` value).
    async fn answer_challenge(
        &self,
        image: &ImageRef,
        method: &'static str,
        url: &str,
        header: &str,
        scope: &str,
    ) -> Result<Authorization, Failure> {
        let refuse = |reason: String| {
            Failure::Permanent(OciError::Auth {
                reference: image.to_string(),
                reason,
            })
        };
        if header.is_empty() {
            return Err(refuse(format!("{method} {url}: 401 without a challenge")));
        }
        let credential = self.credential_for(image).await?;
        if let Some(challenge) = parse_bearer_challenge(header) {
            if let Some(RegistryCredential::Bearer(t)) = &credential {
                return Ok(Authorization::Bearer(t.clone()));
            }
            let token = self
                .fetch_token(image, &challenge, scope, credential.as_ref())
                .await?;
            return Ok(Authorization::Bearer(flex_host::secret::Secret::new(token)));
        }
        let scheme = header.split_whitespace().next().unwrap_or_default();
        match credential {
            Some(RegistryCredential::Basic { username, password })
                if scheme.eq_ignore_ascii_case("basic") =>
            {
                Ok(Authorization::Basic { username, password })
            }
            Some(c) => Err(refuse(format!(
                "{method} {url}: the registry asks for {scheme} authentication, which a {} \
                 cannot answer",
                c.kind()
            ))),
            None => Err(refuse(format!(
                "{method} {url}: the registry wants credentials ({scheme} authentication) and \
                 none are configured for {}",
                image.registry
            ))),
        }
    }

    /// One request with the token flow; classifies failures. 2xx/3xx and non-transient 4xx
    /// responses are returned for the caller to judge.
    async fn send(
        &self,
        image: &ImageRef,
        push: bool,
        method: &'static str,
        url: &str,
        build: Build<'_>,
    ) -> Result<reqwest::Response, Failure> {
        let scope = scope(image, push);
        let key = format!("{}|{scope}", image.api_host());
        let cached = self
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let mut req = build(&self.http);
        if let Some(a) = &cached {
            req = a.apply(req);
        }
        let mut resp = req
            .send()
            .await
            .map_err(|e| Self::http_error(image, method, url, e))?;
        if resp.status() == StatusCode::UNAUTHORIZED {
            let header = resp
                .headers()
                .get(WWW_AUTHENTICATE)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("")
                .to_string();
            let authorization = self
                .answer_challenge(image, method, url, &header, &scope)
                .await?;
            self.tokens
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key.clone(), authorization.clone());
            resp = authorization
                .apply(build(&self.http))
                .send()
                .await
                .map_err(|e| Self::http_error(image, method, url, e))?;
            if resp.status() == StatusCode::UNAUTHORIZED {
                self.tokens
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&key);
                let what = match &authorization {
                    Authorization::Basic { .. } => "the user name and password were refused",
                    Authorization::Bearer(_) if self.credentials.is_some() => {
                        "the token was refused"
                    }
                    Authorization::Bearer(_) => "anonymous token refused",
                };
                return Err(Failure::Permanent(OciError::Auth {
                    reference: image.to_string(),
                    reason: format!("{method} {url}: {} answered 401: {what}", image.registry),
                }));
            }
        }
        if is_transient_status(resp.status()) {
            return Err(Self::status_error(image, method, url, resp).await);
        }
        Ok(resp)
    }

    /// Fetches the manifest or index `reference` (tag or digest) of `image`. With `expected`,
    /// its digest and size must match that descriptor.
    pub async fn fetch_manifest(
        &self,
        image: &ImageRef,
        reference: &str,
        expected: Option<&Descriptor>,
    ) -> Result<FetchedManifest, OciError> {
        let url = self.url(image, &format!("manifests/{reference}"));
        let span = tracing::debug_span!("fetch_manifest", image = %image, reference);
        let this = self;
        let url_ref = url.as_str();
        let build: Build<'_> =
            &move |c: &reqwest::Client| c.get(url_ref).header(ACCEPT, media_type::MANIFEST_ACCEPT);
        let (bytes, content_type, header_digest) = self
            .retrying(image, "fetch manifest", || async move {
                let mut resp = this.send(image, false, "GET", url_ref, build).await?;
                if resp.status() != StatusCode::OK {
                    return Err(Self::status_error(image, "GET", url_ref, resp).await);
                }
                if resp
                    .content_length()
                    .is_some_and(|l| l > MAX_MANIFEST_BYTES)
                {
                    return Err(Failure::Permanent(OciError::Invalid {
                        reference: image.to_string(),
                        what: "manifest",
                        digest: None,
                        reason: format!("larger than {MAX_MANIFEST_BYTES} bytes"),
                    }));
                }
                let content_type = resp
                    .headers()
                    .get(CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let header_digest = resp
                    .headers()
                    .get("docker-content-digest")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| Digest::parse(v.trim()).ok());
                let mut body = Vec::new();
                while let Some(chunk) = resp
                    .chunk()
                    .await
                    .map_err(|e| Self::http_error(image, "GET", url_ref, e))?
                {
                    body.extend_from_slice(&chunk);
                    if body.len() as u64 > MAX_MANIFEST_BYTES {
                        return Err(Failure::Permanent(OciError::Invalid {
                            reference: image.to_string(),
                            what: "manifest",
                            digest: None,
                            reason: format!("larger than {MAX_MANIFEST_BYTES} bytes"),
                        }));
                    }
                }
                Ok((body, content_type, header_digest))
            })
            .instrument(span)
            .await?;
        let digest = Digest::of(&bytes);
        let mismatch = |expected: &Digest| OciError::DigestMismatch {
            reference: image.to_string(),
            what: "manifest",
            expected: expected.clone(),
            actual: digest.clone(),
        };
        if let Ok(asked) = Digest::parse(reference)
            && asked != digest
        {
            return Err(mismatch(&asked));
        }
        if let Some(d) = expected {
            if d.digest != digest {
                return Err(mismatch(&d.digest));
            }
            if d.size != bytes.len() as u64 {
                return Err(OciError::SizeMismatch {
                    reference: image.to_string(),
                    what: "manifest",
                    digest: digest.clone(),
                    expected: d.size,
                    actual: bytes.len() as u64,
                });
            }
        }
        if let Some(h) = &header_digest
            && *h != digest
        {
            return Err(mismatch(h));
        }
        let manifest = parse_manifest(content_type.as_deref(), &bytes).map_err(|reason| {
            OciError::Invalid {
                reference: image.to_string(),
                what: "manifest",
                digest: Some(digest.clone()),
                reason: reason.to_string(),
            }
        })?;
        Ok(FetchedManifest {
            digest,
            content_type,
            bytes,
            manifest,
        })
    }

    /// Resolves `image` to its image manifest for `linux/<arch>`, following an index (a single
    /// manifest is accepted as it is).
    pub async fn resolve(&self, image: &ImageRef, arch: Arch) -> Result<ResolvedImage, OciError> {
        self.warn_if_plain_http(image, "pull");
        let mut fetched = self.fetch_manifest(image, &image.reference(), None).await?;
        let mut index_digest = None;
        for _ in 0..super::MAX_INDEX_DEPTH {
            match fetched.manifest {
                Manifest::Image(manifest) => {
                    return Ok(ResolvedImage {
                        digest: fetched.digest,
                        manifest,
                        bytes: fetched.bytes,
                        index_digest,
                    });
                }
                Manifest::Index(ix) => {
                    let desc = select_platform(&ix, arch)
                        .map_err(|available| OciError::NoPlatform {
                            reference: image.to_string(),
                            wanted: format!("linux/{arch}"),
                            available: available.to_string(),
                        })?
                        .clone();
                    index_digest.get_or_insert(fetched.digest.clone());
                    fetched = self
                        .fetch_manifest(image, desc.digest.as_str(), Some(&desc))
                        .await?;
                }
            }
        }
        Err(OciError::Invalid {
            reference: image.to_string(),
            what: "index",
            digest: index_digest,
            reason: format!("indexes nested deeper than {}", super::MAX_INDEX_DEPTH),
        })
    }

    /// Downloads the blob `desc` of `image` to `dest`, verifying size and digest; `what` names
    /// it in errors (`layer`, `config`). A file already at `dest` with the right digest is kept.
    pub async fn pull_blob(
        &self,
        image: &ImageRef,
        desc: &Descriptor,
        dest: &Path,
        what: &'static str,
    ) -> Result<(), OciError> {
        let io = |op: &'static str, path: &Path, cause: std::io::Error| OciError::Io {
            reference: image.to_string(),
            op,
            path: path.to_path_buf(),
            cause,
        };
        if dest.exists() {
            let p = dest.to_path_buf();
            let have = tokio::task::spawn_blocking(move || Digest::of_file(&p))
                .await
                .map_err(|e| io("hash", dest, std::io::Error::other(e)))?;
            if have.as_ref().ok() == Some(&desc.digest) {
                tracing::debug!(digest = %desc.digest, "blob already downloaded");
                return Ok(());
            }
            tokio::fs::remove_file(dest)
                .await
                .map_err(|e| io("remove", dest, e))?;
        }
        let url = self.url(image, &format!("blobs/{}", desc.digest));
        let tmp = dest.with_extension("download");
        let span = tracing::info_span!("pull_blob", image = %image, digest = %desc.digest, size = desc.size, what);
        let this = self;
        let (url_ref, tmp_ref) = (url.as_str(), tmp.as_path());
        let build: Build<'_> = &move |c: &reqwest::Client| c.get(url_ref);
        self.retrying(image, "pull blob", || async move {
            let mut resp = this.send(image, false, "GET", url_ref, build).await?;
            if resp.status() != StatusCode::OK {
                return Err(Self::status_error(image, "GET", url_ref, resp).await);
            }
            let file = tokio::fs::File::create(tmp_ref)
                .await
                .map_err(|e| Failure::Permanent(io("create", tmp_ref, e)))?;
            let mut out = tokio::io::BufWriter::with_capacity(1 << 20, file);
            let mut hasher = Sha256::new();
            let mut got = 0u64;
            while let Some(chunk) = resp
                .chunk()
                .await
                .map_err(|e| Self::http_error(image, "GET", url_ref, e))?
            {
                got += chunk.len() as u64;
                if got > desc.size {
                    return Err(Failure::Permanent(OciError::SizeMismatch {
                        reference: image.to_string(),
                        what,
                        digest: desc.digest.clone(),
                        expected: desc.size,
                        actual: got,
                    }));
                }
                hasher.update(&chunk);
                out.write_all(&chunk)
                    .await
                    .map_err(|e| Failure::Permanent(io("write", tmp_ref, e)))?;
            }
            out.flush()
                .await
                .map_err(|e| Failure::Permanent(io("write", tmp_ref, e)))?;
            if got < desc.size {
                // Cut short: worth another try.
                return Err(Failure::Transient(OciError::SizeMismatch {
                    reference: image.to_string(),
                    what,
                    digest: desc.digest.clone(),
                    expected: desc.size,
                    actual: got,
                }));
            }
            let actual = Digest::from_hasher(hasher);
            if actual != desc.digest {
                return Err(Failure::Permanent(OciError::DigestMismatch {
                    reference: image.to_string(),
                    what,
                    expected: desc.digest.clone(),
                    actual,
                }));
            }
            Ok(())
        })
        .instrument(span)
        .await
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        tokio::fs::rename(&tmp, dest)
            .await
            .map_err(|e| io("rename", dest, e))
    }

    /// Whether the registry has blob `digest` in `image`'s repository.
    pub async fn blob_exists(&self, image: &ImageRef, digest: &Digest) -> Result<bool, OciError> {
        let url = self.url(image, &format!("blobs/{digest}"));
        let this = self;
        let url_ref = url.as_str();
        let build: Build<'_> = &move |c: &reqwest::Client| c.head(url_ref);
        self.retrying(image, "check blob", || async move {
            let resp = this.send(image, true, "HEAD", url_ref, build).await?;
            match resp.status() {
                StatusCode::OK => Ok(true),
                StatusCode::NOT_FOUND => Ok(false),
                _ => Err(Self::status_error(image, "HEAD", url_ref, resp).await),
            }
        })
        .await
    }

    /// Uploads `data` as a blob of `image`'s repository (monolithic), unless it is there.
    pub async fn push_blob(
        &self,
        image: &ImageRef,
        media_type: &str,
        data: Bytes,
    ) -> Result<Descriptor, OciError> {
        let desc = Descriptor::of(media_type, &data);
        if self.blob_exists(image, &desc.digest).await? {
            return Ok(desc);
        }
        let span = tracing::debug_span!("push_blob", image = %image, digest = %desc.digest);
        let start = self.url(image, "blobs/uploads/");
        let this = self;
        let start_ref = start.as_str();
        let digest = desc.digest.clone();
        let (data_ref, digest_ref) = (&data, &digest);
        self.retrying(image, "push blob", || async move {
            let post = move |c: &reqwest::Client| c.post(start_ref).body(Vec::new());
            let resp = this.send(image, true, "POST", start_ref, &post).await?;
            if resp.status() != StatusCode::ACCEPTED {
                return Err(Self::status_error(image, "POST", start_ref, resp).await);
            }
            let location = resp
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let bad = |reason: String| {
                Failure::Permanent(OciError::Invalid {
                    reference: image.to_string(),
                    what: "upload location",
                    digest: Some(digest_ref.clone()),
                    reason,
                })
            };
            let base = url::Url::parse(start_ref).map_err(|e| bad(e.to_string()))?;
            let mut put_url = base
                .join(&location)
                .map_err(|e| bad(format!("{location:?}: {e}")))?;
            put_url
                .query_pairs_mut()
                .append_pair("digest", digest_ref.as_str());
            let put_str = put_url.to_string();
            let put_ref = put_str.as_str();
            let put = move |c: &reqwest::Client| {
                c.put(put_ref)
                    .header(CONTENT_TYPE, "application/octet-stream")
                    .body(data_ref.clone())
            };
            let resp = this.send(image, true, "PUT", put_ref, &put).await?;
            if resp.status() != StatusCode::CREATED {
                return Err(Self::status_error(image, "PUT", put_ref, resp).await);
            }
            Ok(())
        })
        .instrument(span)
        .await?;
        Ok(desc)
    }

    /// Uploads a manifest or index as `reference` (a tag, or its digest); returns its digest.
    pub async fn push_manifest(
        &self,
        image: &ImageRef,
        reference: &str,
        media_type: &str,
        body: Bytes,
    ) -> Result<Digest, OciError> {
        let digest = Digest::of(&body);
        let url = self.url(image, &format!("manifests/{reference}"));
        let this = self;
        let (url_ref, body_ref) = (url.as_str(), &body);
        let mt = media_type.to_string();
        let mt_ref = mt.as_str();
        let build: Build<'_> = &move |c: &reqwest::Client| {
            c.put(url_ref)
                .header(CONTENT_TYPE, mt_ref)
                .body(body_ref.clone())
        };
        self.retrying(image, "push manifest", || async move {
            let resp = this.send(image, true, "PUT", url_ref, build).await?;
            if resp.status() != StatusCode::CREATED {
                return Err(Self::status_error(image, "PUT", url_ref, resp).await);
            }
            Ok(())
        })
        .await?;
        Ok(digest)
    }

    /// Pushes an image: its config and layers (`(media type, bytes)`), then an OCI manifest
    /// tagged with `image`'s tag (or by digest). Returns the manifest's descriptor.
    pub async fn push_image(
        &self,
        image: &ImageRef,
        config: Bytes,
        layers: Vec<(String, Bytes)>,
    ) -> Result<Descriptor, OciError> {
        self.warn_if_plain_http(image, "push");
        let config = self
            .push_blob(image, media_type::OCI_CONFIG, config)
            .await?;
        let mut descs = Vec::with_capacity(layers.len());
        for (mt, data) in layers {
            descs.push(self.push_blob(image, &mt, data).await?);
        }
        let manifest = ImageManifest::new(config, descs);
        let body = serde_json::to_vec(&manifest).map_err(|e| OciError::Invalid {
            reference: image.to_string(),
            what: "manifest",
            digest: None,
            reason: e.to_string(),
        })?;
        let desc = Descriptor::of(media_type::OCI_MANIFEST, &body);
        let reference = image.tag.clone().unwrap_or_else(|| desc.digest.to_string());
        self.push_manifest(
            image,
            &reference,
            media_type::OCI_MANIFEST,
            Bytes::from(body),
        )
        .await?;
        Ok(desc)
    }
}

#[cfg(test)]
mod tests;
