//! The `/metrics` endpoint the daemon and the controller serve: Prometheus' OpenMetrics text
//! format from a [`prometheus_client`] registry, over HTTP/1.1, bounded so a scrape flood
//! cannot hurt the process that serves it.
//!
//! | Path | Method | Response |
//! |---|---|---|
//! | `/metrics` | GET, HEAD | 200, the registry as OpenMetrics text ([`CONTENT_TYPE`]) |
//! | `/metrics` | other | 405, `Allow: GET, HEAD` |
//! | other | any | 404 |
//!
//! Bounds ([`Limits`]): at most `max_connections` connections at once (one more is closed as
//! soon as it is accepted, unread); a request's headers must arrive within
//! `header_read_timeout`; a connection lives at most `connection_timeout`, and serves one
//! request (no keep-alive: a scraper reconnects each scrape, which costs a loopback handshake
//! and bounds what one client holds). Request bodies are never read.
//!
//! The address ([`parse_address`]) follows Kubernetes' metrics bind addresses: `IP:PORT`,
//! `:PORT` for every interface, `0` for no endpoint. A name that would need DNS is refused, so
//! a config is judged when it is loaded, not when a resolver answers.
//!
//! Metric families are the caller's: label values must come from closed sets (enums deriving
//! [`prometheus_client::encoding::EncodeLabelValue`]), never from strings the cluster or a node
//! provides, so the number of series stays bounded.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

pub use prometheus_client;
use prometheus_client::registry::Registry;

/// The content type of the exposition (OpenMetrics 1.0 text, which Prometheus negotiates).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The path served.
pub const PATH: &str = "/metrics";

/// Where the endpoint listens, from a bind address ([`parse_address`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// `0`: no endpoint.
    Disabled,
    /// The addresses tried in order; the first that binds is used (`:PORT` is IPv6 and IPv4
    /// on every interface, else IPv4 only).
    At(Vec<SocketAddr>),
}

/// Why a bind address was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} {problem}")]
pub struct AddressError {
    /// The address as written (cut to 100 characters).
    pub value: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

/// Parses a metrics bind address: `IP:PORT` (`127.0.0.1:9469`, `[::1]:9469`), `:PORT` (every
/// interface) or `0` (disabled). Surrounding spaces are ignored.
pub fn parse_address(value: &str) -> Result<Listen, AddressError> {
    let v = value.trim();
    let refuse = |problem| AddressError {
        value: v.chars().take(100).collect(),
        problem,
    };
    if v == "0" {
        return Ok(Listen::Disabled);
    }
    if let Some(port) = v.strip_prefix(':') {
        let port: u16 = port
            .parse()
            .map_err(|_| refuse("is not :PORT with a port from 0 to 65535"))?;
        return Ok(Listen::At(vec![
            SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)),
            SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port)),
        ]));
    }
    v.parse::<SocketAddr>().map(|a| Listen::At(vec![a])).map_err(|_| {
        refuse("is not IP:PORT (127.0.0.1:9469, [::1]:9469), :PORT for every interface, or 0 to disable; names are not resolved")
    })
}

/// The endpoint's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; more are closed when accepted.
    pub max_connections: usize,
    /// How long a request's headers may take to arrive.
    pub header_read_timeout: Duration,
    /// How long one connection may live, request and response included.
    pub connection_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 8,
            header_read_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(15),
        }
    }
}

/// Encodes `registry` as OpenMetrics text (with its `# EOF`).
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing to a String does not fail; a metric whose encoding fails is left out whole.
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        tracing::warn!(error = %e, "encode metrics");
    }
    out
}

/// The sample lines of an exposition that start with `prefix`, sorted (series come in no set
/// order): what a test or a check compares.
pub fn samples(exposition: &str, prefix: &str) -> Vec<String> {
    let mut out: Vec<String> = exposition
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_string)
        .collect();
    out.sort();
    out
}

/// What renders the exposition for each scrape (refreshing gauges that are read, not pushed,
/// then [`encode`]).
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// A family of histograms, one per label set, each made by the same bucket constructor.
pub type HistogramFamily<L> = prometheus_client::metrics::family::Family<
    L,
    prometheus_client::metrics::histogram::Histogram,
    fn() -> prometheus_client::metrics::histogram::Histogram,
>;

/// A histogram family whose histograms have the buckets `buckets` makes.
pub fn histogram_family<L>(
    buckets: fn() -> prometheus_client::metrics::histogram::Histogram,
) -> HistogramFamily<L>
where
    L: Clone + std::hash::Hash + Eq,
{
    HistogramFamily::new_with_constructor(buckets)
}

/// The endpoint, bound.
pub struct Endpoint {
    listener: TcpListener,
}

/// Why the endpoint could not bind.
#[derive(Debug, thiserror::Error)]
#[error("listen on {address}: {source}")]
pub struct BindError {
    /// The last address tried.
    pub address: SocketAddr,
    /// Why.
    pub source: std::io::Error,
}

impl Endpoint {
    /// Binds the first of `addresses` that binds. `None` when `addresses` is empty.
    pub async fn bind(addresses: &[SocketAddr]) -> Option<Result<Self, BindError>> {
        let mut last = None;
        for &address in addresses {
            match TcpListener::bind(address).await {
                Ok(listener) => return Some(Ok(Self { listener })),
                Err(source) => last = Some(Err(BindError { address, source })),
            }
        }
        last
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` is cancelled. Connections still open then end within their
    /// `connection_timeout`.
    pub async fn serve(self, render: Render, limits: Limits, shutdown: CancellationToken) {
        let slots = Arc::new(Semaphore::new(limits.max_connections));
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .keep_alive(false);
        loop {
            let (stream, peer) = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = self.listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // EMFILE and the like: wait rather than spin.
                        tracing::warn!(error = %e, "metrics endpoint: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::debug!(peer = %peer, limit = limits.max_connections, "metrics endpoint: connection limit reached; closing");
                drop(stream);
                continue;
            };
            let render = render.clone();
            let svc = service_fn(move |req: Request<Incoming>| {
                let render = render.clone();
                async move { Ok::<_, Infallible>(respond(&req, render.as_ref())) }
            });
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            tokio::spawn(async move {
                match tokio::time::timeout(limits.connection_timeout, conn).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(peer = %peer, error = %e, "metrics connection ended with an error")
                    }
                    Err(_) => tracing::debug!(peer = %peer, "metrics connection timed out; closed"),
                }
                drop(slot);
            });
        }
    }
}

/// The answer to `req` (the routes in the crate's doc).
pub fn respond<B>(
    req: &Request<B>,
    render: &(dyn Fn() -> String + Send + Sync),
) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    if req.uri().path() != PATH {
        return text(StatusCode::NOT_FOUND, "404 page not found\n");
    }
    let head = req.method() == Method::HEAD;
    if req.method() != Method::GET && !head {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let body = render();
    let mut r = Response::new(Full::new(if head {
        Bytes::new()
    } else {
        Bytes::from(body)
    }));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(CONTENT_TYPE),
    );
    r
}

/// Binds `listen` and serves `render` until `shutdown`, in a task. A disabled address, or one
/// that cannot be bound (taken, not this host's), is logged — a warning for the latter — and
/// nothing is served: metrics never stop the process that offers them. Returns the bound
/// address.
pub async fn spawn(
    what: &'static str,
    listen: &Listen,
    render: Render,
    limits: Limits,
    shutdown: CancellationToken,
) -> Option<SocketAddr> {
    let Listen::At(addresses) = listen else {
        tracing::info!(what, "metrics endpoint disabled (address 0)");
        return None;
    };
    match Endpoint::bind(addresses).await? {
        Ok(endpoint) => {
            let address = endpoint.local_addr().ok();
            tracing::info!(what, address = ?address, path = PATH, "metrics endpoint serving");
            tokio::spawn(endpoint.serve(render, limits, shutdown));
            address
        }
        Err(e) => {
            tracing::warn!(what, error = %e, "metrics endpoint not served; running on without it");
            None
        }
    }
}

#[cfg(test)]
mod tests;
