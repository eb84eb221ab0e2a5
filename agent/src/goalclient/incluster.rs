//! The in-cluster machine client (`client_incluster.go`): the machine endpoint of
//! `aks-flex-controller`, reached through the API server's service proxy at
//! `agent.machineClient.endpointUrl` (default [`DEFAULT_ENDPOINT_PATH`]).
//!
//! Transport: a [`kube::Client`]. It carries the cluster URL, the CA and the credentials (bearer
//! token, client certificate or exec plugin), and [`kube::Client::send`] reaches any API path,
//! the service proxy included, returning every status code as it is. `start` builds one from the
//! bootstrap credentials (`crate::kubeclient::bootstrap_config`, see [`super::select`]); the
//! daemon passes its own [`KubeClients`] ([`InClusterClient::over_clients`]), and every request
//! takes the current client, so a rotated client certificate is used from the next request on.
//! A client built with kube's defaults also retries 429/503/504 itself
//! (kube's `default_retry`); [`InClusterClient::from_kube_config`] turns that off so
//! [`Backoff`] alone decides.
//!
//! The status-code rules are upstream's:
//! - GET: non-2xx is an error; the body is ARM machine JSON; a missing `id` reads as the request
//!   path, a missing `name` as the node name.
//! - PUT (create): 403, 405 or 204, or a 2xx with an empty body, means "adopt": GET the machine
//!   and check its version; other non-2xx is an error. The machine returned or adopted must not
//!   carry a different non-empty Kubernetes version.
//! - PATCH status: any non-2xx (403 and 405 included) is an error.
//! - Errors read at most [`ERROR_BODY_LIMIT`] bytes of the body. A 404 whose body is a Kubernetes
//!   `Status` with reason `NotFound` (the service or its proxy is missing) is a plain error; any
//!   other 404 is [`MachineError::NotFound`]. Other statuses read `<op>: status <status>: <body>`.
//!
//! Transport errors, timeouts and the statuses in [`super::retry::retryable_status`] are retried
//! with backoff; each retry is logged with its cause.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;

use super::retry::{NoAnswer, Tried, parse_retry_after};
use super::{Machine, MachineClient, MachineError, MachineStatus};
use crate::kubeclient::KubeClients;
use flex_api::arm::{parse_arm_machine, put_body, status_patch_body};
use flex_api::goal::GoalState;
use flex_host::retry::Backoff;

pub use flex_api::arm::DEFAULT_ENDPOINT_PATH;
/// How much of an error response's body is read.
pub const ERROR_BODY_LIMIT: usize = 4096;
/// The largest machine document accepted.
pub const MACHINE_BODY_LIMIT: usize = 1 << 20;
/// Per-attempt timeout (request and body).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

fn other(e: impl Into<anyhow::Error>) -> MachineError {
    MachineError::Other(e.into())
}

/// Why `agent.machineClient.endpointUrl` is not an in-cluster endpoint.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EndpointPathError {
    /// A URL, a relative path or a network path instead of an absolute API path.
    #[error(
        "in-cluster machine endpoint {0:?} must be an absolute Kubernetes API path (starting with /, no scheme or host)"
    )]
    NotApiPath(String),
    /// A `#fragment`.
    #[error("in-cluster machine endpoint {0:?} must not contain a fragment")]
    Fragment(String),
}

/// `agent.machineClient.endpointUrl` parsed: a clean absolute API path and its query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The cleaned path (no trailing `/`).
    pub path: String,
    /// The query, kept as written (without `?`).
    pub query: Option<String>,
}

impl Endpoint {
    /// Parses an endpoint; empty means [`DEFAULT_ENDPOINT_PATH`]. It must be an absolute
    /// Kubernetes API path: starting with one `/`, no scheme or host, no fragment.
    pub fn parse(endpoint: &str) -> Result<Self, EndpointPathError> {
        let e = endpoint.trim();
        let e = if e.is_empty() {
            DEFAULT_ENDPOINT_PATH
        } else {
            e
        };
        if !e.starts_with('/') || e.starts_with("//") || e.contains("://") {
            return Err(EndpointPathError::NotApiPath(e.to_string()));
        }
        if e.contains('#') {
            return Err(EndpointPathError::Fragment(e.to_string()));
        }
        let (path, query) = match e.split_once('?') {
            Some((p, q)) => (p, (!q.is_empty()).then(|| q.to_string())),
            None => (e, None),
        };
        Ok(Self {
            path: clean_path(path),
            query,
        })
    }

    fn with_query(&self, path: String) -> String {
        match &self.query {
            Some(q) => format!("{path}?{q}"),
            None => path,
        }
    }

    /// `<path>/machines/<node>[?query]`.
    pub fn machine_path(&self, node: &str) -> String {
        self.with_query(format!(
            "{}/machines/{}",
            self.path.trim_end_matches('/'),
            escape_segment(node)
        ))
    }

    /// `<path>/machines/<node>/status[?query]`.
    pub fn status_path(&self, node: &str) -> String {
        self.with_query(format!(
            "{}/machines/{}/status",
            self.path.trim_end_matches('/'),
            escape_segment(node)
        ))
    }
}

/// Go's `path.Clean` for absolute paths: `//` collapsed, `.` dropped, `..` resolved, no
/// trailing `/` (except for `/` itself).
pub fn clean_path(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Percent-encodes what is not an unreserved character or a sub-delimiter allowed in a path
/// segment (node names are DNS-1123, so this is a safety net).
fn escape_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:@!$&'()*+,;=".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One HTTP exchange's result.
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    body: Bytes,
    attempts: u32,
}

impl Reply {
    fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).trim().to_string()
    }
}

/// Reads at most `limit` bytes of `body`; `true` when there was more.
async fn read_limited(
    mut body: kube::client::Body,
    limit: usize,
) -> Result<(Bytes, bool), anyhow::Error> {
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| anyhow::anyhow!("read response body: {e}"))?;
        if let Ok(data) = frame.into_data() {
            let room = limit - buf.len();
            if data.len() > room {
                buf.extend_from_slice(&data[..room]);
                return Ok((buf.into(), true));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok((buf.into(), false))
}

/// Whether a 404 body is a Kubernetes `Status` with reason `NotFound` (the API server's own
/// answer: the service or the proxy path does not exist).
pub fn is_kubernetes_not_found_status(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| {
        v.get("kind").and_then(|k| k.as_str()) == Some("Status")
            && v.get("reason").and_then(|r| r.as_str()) == Some("NotFound")
    })
}

/// The in-cluster (service-proxy) machine client for one node.
#[derive(Clone)]
pub struct InClusterClient {
    clients: KubeClients,
    endpoint: Endpoint,
    node_name: String,
    server: String,
    retry: Backoff,
    timeout: Duration,
}

impl std::fmt::Debug for InClusterClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InClusterClient")
            .field("endpoint", &self.endpoint)
            .field("node_name", &self.node_name)
            .field("server", &self.server)
            .field("retry", &self.retry)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl InClusterClient {
    /// A client for `node_name` over `client`, at `endpoint_url` (empty: the default path).
    pub fn new(
        client: kube::Client,
        endpoint_url: &str,
        node_name: &str,
    ) -> Result<Self, MachineError> {
        Self::over_clients(KubeClients::fixed(client), endpoint_url, node_name)
    }

    /// A client for `node_name` over the daemon's `clients`, at `endpoint_url` (empty: the
    /// default path): each request takes [`KubeClients::current`], so a rotated credential is
    /// used from the next request on.
    pub fn over_clients(
        clients: KubeClients,
        endpoint_url: &str,
        node_name: &str,
    ) -> Result<Self, MachineError> {
        let endpoint = Endpoint::parse(endpoint_url).map_err(other)?;
        let node_name = node_name.trim();
        if node_name.is_empty() {
            return Err(other(anyhow::anyhow!(
                "in-cluster machine client needs a node name (agent.nodeName)"
            )));
        }
        Ok(Self {
            clients,
            endpoint,
            node_name: node_name.to_string(),
            server: String::new(),
            retry: Backoff::default(),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// A client over a new [`kube::Client`] built from `config` with kube's own retry off (its
    /// cluster URL names the server in messages and fallback ids).
    pub fn from_kube_config(
        mut config: kube::Config,
        endpoint_url: &str,
        node_name: &str,
    ) -> Result<Self, MachineError> {
        config.default_retry = false;
        let server = config.cluster_url.to_string();
        let client = crate::kubeclient::client_from(config).map_err(other)?;
        Ok(Self::new(client, endpoint_url, node_name)?.with_server(&server))
    }

    /// The API server URL, used only in messages and as the fallback machine id.
    pub fn with_server(mut self, server: &str) -> Self {
        self.server = server.trim_end_matches('/').to_string();
        self
    }

    /// Replaces the retry policy.
    pub fn with_retry(mut self, retry: Backoff) -> Self {
        self.retry = retry;
        self
    }

    /// Replaces the per-attempt timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The node name.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The machine's path (with the endpoint's query).
    pub fn machine_path(&self) -> String {
        self.endpoint.machine_path(&self.node_name)
    }

    /// The status path (with the endpoint's query).
    pub fn status_path(&self) -> String {
        self.endpoint.status_path(&self.node_name)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server)
    }

    async fn send_once(
        &self,
        method: &Method,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<(StatusCode, Bytes, Option<Duration>), anyhow::Error> {
        let mut req = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(header::ACCEPT, "application/json");
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(kube::client::Body::from(body.unwrap_or_default().to_vec()))
            .map_err(|e| anyhow::anyhow!("build request: {e}"))?;
        let client = self.clients.current();
        let exchange = async {
            let resp = client
                .send(req)
                .await
                .map_err(|e| anyhow::anyhow!(crate::kubeclient::describe(&e)))?;
            let status = resp.status();
            let retry_after = parse_retry_after(
                resp.headers()
                    .get(header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok()),
            );
            let limit = if status.is_success() {
                MACHINE_BODY_LIMIT
            } else {
                ERROR_BODY_LIMIT
            };
            let (bytes, more) = read_limited(resp.into_body(), limit).await?;
            if more && status.is_success() {
                anyhow::bail!("response body exceeds {MACHINE_BODY_LIMIT} bytes");
            }
            Ok((status, bytes, retry_after))
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(r) => r,
            Err(_) => anyhow::bail!("no response within {:?}", self.timeout),
        }
    }

    /// Sends with retries; returns the last reply, or the last transport error.
    async fn exchange(
        &self,
        op: &str,
        method: Method,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Reply, MachineError> {
        let what = format!("{op}: {method} {}", self.url(path));
        let sent = super::retry::exchange(&what, self.retry, |attempt| {
            let once = self.send_once(&method, path, body);
            async move {
                match once.await {
                    Ok((status, body, retry_after)) => {
                        let reply = Reply {
                            status,
                            body,
                            attempts: attempt,
                        };
                        Tried::Answer {
                            status: status.as_u16(),
                            retry_after,
                            summary: format!("status {status}: {}", reply.body_text()),
                            reply,
                        }
                    }
                    Err(e) => Tried::Transport(format!("{e:#}")),
                }
            }
        })
        .await;
        sent.map_err(|NoAnswer { cause, attempts }| {
            other(anyhow::anyhow!(
                "{what}: {cause}{}",
                attempts_note(attempts)
            ))
        })
    }

    fn status_error(&self, op: &str, path: &str, reply: &Reply) -> MachineError {
        if reply.status == StatusCode::NOT_FOUND {
            if is_kubernetes_not_found_status(&reply.body) {
                return other(anyhow::anyhow!(
                    "{op}: status {}: {} (the API server has no such service or proxy path: is aks-flex-controller deployed?)",
                    reply.status,
                    reply.body_text()
                ));
            }
            return MachineError::NotFound(self.url(path));
        }
        other(anyhow::anyhow!(
            "{op}: status {}: {}{}",
            reply.status,
            reply.body_text(),
            attempts_note(reply.attempts)
        ))
    }

    fn decode(&self, op: &str, path: &str, body: &[u8]) -> Result<Machine, MachineError> {
        let arm = parse_arm_machine(body)
            .map_err(|e| other(anyhow::anyhow!("{op}: {}: {e}", self.url(path))))?;
        Ok(arm.to_machine(&self.url(path), &self.node_name))
    }

    async fn adopt(&self, goal: &GoalState) -> Result<Machine, MachineError> {
        let m = self.get().await?;
        check_version(&m, goal)?;
        Ok(m)
    }
}

fn attempts_note(attempts: u32) -> String {
    if attempts > 1 {
        format!(" (gave up after {attempts} attempts)")
    } else {
        String::new()
    }
}

fn check_version(m: &Machine, goal: &GoalState) -> Result<(), MachineError> {
    let got = &m.goal.kubernetes_version;
    if !got.is_empty() && *got != goal.kubernetes_version {
        return Err(other(anyhow::anyhow!(
            "pre-created machine Kubernetes version {got:?} does not match desired {:?}",
            goal.kubernetes_version
        )));
    }
    Ok(())
}

#[async_trait]
impl MachineClient for InClusterClient {
    async fn get(&self) -> Result<Machine, MachineError> {
        const OP: &str = "get machine";
        let path = self.machine_path();
        let reply = self.exchange(OP, Method::GET, &path, None).await?;
        if !reply.status.is_success() {
            return Err(self.status_error(OP, &path, &reply));
        }
        self.decode(OP, &path, &reply.body)
    }

    async fn create(&self, goal: &GoalState) -> Result<Machine, MachineError> {
        const OP: &str = "create machine";
        let path = self.machine_path();
        let body = serde_json::to_vec(&put_body(goal)).map_err(other)?;
        let reply = self.exchange(OP, Method::PUT, &path, Some(&body)).await?;
        match reply.status {
            StatusCode::FORBIDDEN | StatusCode::METHOD_NOT_ALLOWED | StatusCode::NO_CONTENT => {
                tracing::info!(
                    status = %reply.status,
                    "machine endpoint does not accept writes; adopting the existing machine"
                );
                return self.adopt(goal).await;
            }
            s if !s.is_success() => return Err(self.status_error(OP, &path, &reply)),
            _ => {}
        }
        if reply.body.iter().all(u8::is_ascii_whitespace) {
            return self.adopt(goal).await;
        }
        let m = self.decode(OP, &path, &reply.body)?;
        check_version(&m, goal)?;
        Ok(m)
    }

    async fn patch_status(&self, status: &MachineStatus) -> Result<(), MachineError> {
        const OP: &str = "patch machine status";
        let path = self.status_path();
        let body = serde_json::to_vec(&status_patch_body(status)).map_err(other)?;
        let reply = self.exchange(OP, Method::PATCH, &path, Some(&body)).await?;
        if !reply.status.is_success() {
            return Err(self.status_error(OP, &path, &reply));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_paths_keep_the_query_and_clean_the_path() {
        let e = Endpoint::parse("").unwrap();
        assert_eq!(
            e.machine_path("node1"),
            "/api/v1/namespaces/kube-system/services/http:aks-flex-controller:80/proxy/machines/node1"
        );
        let e = Endpoint::parse("/api/v1//namespaces/x/./services/s/proxy/?a=1&b=2").unwrap();
        assert_eq!(e.path, "/api/v1/namespaces/x/services/s/proxy");
        assert_eq!(
            e.machine_path("n"),
            "/api/v1/namespaces/x/services/s/proxy/machines/n?a=1&b=2"
        );
        assert_eq!(
            e.status_path("n"),
            "/api/v1/namespaces/x/services/s/proxy/machines/n/status?a=1&b=2"
        );
        assert_eq!(
            Endpoint::parse("/a/../b?").unwrap(),
            Endpoint {
                path: "/b".into(),
                query: None
            }
        );
        assert_eq!(
            Endpoint::parse("/").unwrap().machine_path("n"),
            "/machines/n"
        );
        assert_eq!(
            Endpoint::parse("/p").unwrap().machine_path("a b/c"),
            "/p/machines/a%20b%2Fc"
        );
        for bad in ["https://x/api", "//x/api", "api/v1", "/api#x"] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
    }

    fn machine_json(etag: &str) -> serde_json::Value {
        serde_json::json!({
            "id": "/machines/n1",
            "name": "n1",
            "properties": {"eTag": etag, "kubernetes": {"orchestratorVersion": "1.35.0"}}
        })
    }

    /// Real: the client, its request paths and parsing. Faked: two API servers (kube's
    /// `tower_test` mock), and the rotation (a new client published as `KubeClients` does).
    #[tokio::test]
    async fn a_request_after_a_certificate_rotation_uses_the_new_client() {
        use crate::kubeclient::mock::{Reply, seen, serve};
        let (old, old_log, _old_server) = serve(|_| Reply::Json(200, machine_json("etag-old")));
        let (new, new_log, _new_server) = serve(|_| Reply::Json(200, machine_json("etag-new")));
        let (tx, rx) = tokio::sync::watch::channel(old);
        let c = InClusterClient::over_clients(KubeClients::from_receiver(rx), "", "n1").unwrap();
        assert_eq!(c.get().await.unwrap().goal.settings_version, "etag-old");
        // The daemon's credentials rotate: the next request goes through the new client.
        tx.send(new).unwrap();
        assert_eq!(c.get().await.unwrap().goal.settings_version, "etag-new");
        c.patch_status(&MachineStatus::default()).await.unwrap();
        let path = c.machine_path();
        assert_eq!(
            seen(&old_log)
                .iter()
                .map(|r| (r.method.clone(), r.uri.clone()))
                .collect::<Vec<_>>(),
            vec![("GET".to_string(), path.clone())]
        );
        assert_eq!(
            seen(&new_log)
                .iter()
                .map(|r| (r.method.clone(), r.uri.clone()))
                .collect::<Vec<_>>(),
            vec![
                ("GET".to_string(), path),
                ("PATCH".to_string(), c.status_path())
            ]
        );
    }

    #[test]
    fn kubernetes_status_not_found_is_recognised() {
        assert!(is_kubernetes_not_found_status(
            br#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#
        ));
        assert!(!is_kubernetes_not_found_status(
            br#"{"error":{"code":"NotFound","message":"machine \"n\" not found"}}"#
        ));
        assert!(!is_kubernetes_not_found_status(b"404 page not found"));
    }
}
