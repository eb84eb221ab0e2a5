//! The machine endpoint's HTTP API (`pkg/flexcontroller/server.go`), a read-only bridge over a
//! [`MachineStore`] serving ARM-shaped JSON:
//!
//! | Path | Method | Response |
//! |---|---|---|
//! | `/healthz` | any | 200 `ok\n` |
//! | `/readyz` | any | 200 `ok\n`; 503 `not ready: <why>\n` while the daemons' admission policies are not enforced ([`crate::policy`]) |
//! | `/machines/<name>` | GET | 200 the machine, re-encoded through the ARM model |
//! | `/machines/<name>` | HEAD | 200, no body, after a successful read |
//! | `/machines/<name>` | PUT, POST | body ignored; 200 the existing machine |
//! | `/machines/<name>` | other | 405 `MethodNotAllowed` |
//! | `/machines/<name>/status` | PATCH | 204 (handed to [`MachineStore::record_status`]; no existence check) |
//! | `/machines/<name>/status` | other | 405 `MethodNotAllowed` |
//! | `/machines/` or more segments | any | 400 `InvalidMachineName` |
//!
//! A missing machine is 404 `NotFound`; any other store failure is logged ("machine config map
//! read failed") and answered 503 `MachineStoreUnavailable`. JSON bodies end with a newline and
//! carry `Content-Type: application/json`. Other paths get Go's `404 page not found`, and
//! `/machines` redirects to `/machines/` as Go's `ServeMux` does.
//!
//! [`Server`] serves HTTP/1.1 within [`LIMITS`]: at most 256 connections at once (more are
//! closed when accepted), a request's headers within 10 s, a connection (keep-alive included)
//! at most 60 s; and stops gracefully: on shutdown it stops accepting, lets requests in flight
//! finish within the shutdown timeout, then closes what is left. So a flood of callers costs a
//! bounded number of tasks.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::{ControllerMetrics, RouteLabel};
use crate::policy::Readiness;
use crate::store::{MachineStore, StoreError};

/// `ReadHeaderTimeout`.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest status PATCH body read.
pub const STATUS_BODY_LIMIT: usize = 1 << 20;

type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Reply {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

fn json(status: StatusCode, value: &impl serde::Serialize) -> Reply {
    match serde_json::to_vec(value) {
        Ok(mut body) => {
            body.push(b'\n');
            reply(status, "application/json", body)
        }
        Err(e) => {
            tracing::error!(error = %e, "encode response");
            reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain; charset=utf-8",
                "internal error\n",
            )
        }
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Reply {
    json(
        status,
        &serde_json::json!({"error": {"code": code, "message": message}}),
    )
}

/// Decodes `%XX` escapes (as Go's `URL.Path` is decoded); invalid escapes stay as written.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push(h * 16 + l);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

/// Which machine route a path is.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// `/healthz`.
    Health,
    /// `/readyz`.
    Ready,
    /// `/machines` (redirected).
    MachinesRoot,
    /// `/machines/<name>`.
    Machine(String),
    /// `/machines/<name>/status`.
    Status(String),
    /// `/machines/...` that is not a single name (optionally with `/status`).
    InvalidName,
    /// Anything else.
    Unknown,
}

/// The route as a metric label (never the machine name).
impl From<&Route> for RouteLabel {
    fn from(r: &Route) -> Self {
        match r {
            Route::Health | Route::Ready => RouteLabel::health,
            Route::MachinesRoot => RouteLabel::machines_root,
            Route::Machine(_) => RouteLabel::machine,
            Route::Status(_) => RouteLabel::status,
            Route::InvalidName => RouteLabel::invalid_name,
            Route::Unknown => RouteLabel::unknown,
        }
    }
}

/// Routes a request path: strip `/machines/`, trim `/` on both sides, split on `/`.
pub fn route(path: &str) -> Route {
    match path {
        "/healthz" => return Route::Health,
        "/readyz" => return Route::Ready,
        "/machines" => return Route::MachinesRoot,
        _ => {}
    }
    let Some(rest) = path.strip_prefix("/machines/") else {
        return Route::Unknown;
    };
    let decoded = percent_decode(rest);
    let parts: Vec<&str> = decoded.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        [name] if !name.is_empty() => Route::Machine(name.to_string()),
        [name, "status"] if !name.is_empty() => Route::Status(name.to_string()),
        _ => Route::InvalidName,
    }
}

async fn read_machine(store: &dyn MachineStore, name: &str, head: bool) -> Reply {
    match store.get(name).await {
        Ok(_) if head => reply(StatusCode::OK, "application/json", Bytes::new()),
        Ok(m) => json(StatusCode::OK, &m),
        Err(StoreError::NotFound(_)) => error(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("machine {name:?} not found"),
        ),
        Err(StoreError::Unavailable(e)) => {
            tracing::error!(machine = name, error = %e, "machine config map read failed");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "MachineStoreUnavailable",
                "failed to read machine data source",
            )
        }
    }
}

/// Answers one request; `/readyz` as `ready` says.
pub async fn handle<B>(store: &dyn MachineStore, ready: &Readiness, req: Request<B>) -> Reply
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let method = req.method().clone();
    match route(req.uri().path()) {
        Route::Health => reply(StatusCode::OK, "text/plain; charset=utf-8", "ok\n"),
        Route::Ready => match ready.why_not() {
            None => reply(StatusCode::OK, "text/plain; charset=utf-8", "ok\n"),
            Some(why) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain; charset=utf-8",
                format!("not ready: {why}\n"),
            ),
        },
        Route::MachinesRoot => {
            let mut r = reply(
                StatusCode::MOVED_PERMANENTLY,
                "text/html; charset=utf-8",
                "<a href=\"/machines/\">Moved Permanently</a>.\n\n",
            );
            r.headers_mut().insert(
                header::LOCATION,
                header::HeaderValue::from_static("/machines/"),
            );
            r
        }
        Route::Unknown => reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "404 page not found\n",
        ),
        Route::InvalidName => error(
            StatusCode::BAD_REQUEST,
            "InvalidMachineName",
            "machine name must be a single path segment",
        ),
        Route::Machine(name) => match method {
            Method::GET => read_machine(store, &name, false).await,
            Method::HEAD => read_machine(store, &name, true).await,
            Method::PUT | Method::POST => {
                tracing::debug!(machine = %name, method = %method, "ignoring read-only machine mutation");
                read_machine(store, &name, false).await
            }
            _ => error(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "only GET, HEAD, PUT, and POST are supported",
            ),
        },
        Route::Status(name) => {
            if method != Method::PATCH {
                return error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    "only PATCH is supported for machine status",
                );
            }
            match Limited::new(req.into_body(), STATUS_BODY_LIMIT)
                .collect()
                .await
            {
                Ok(body) => store.record_status(&name, &body.to_bytes()).await,
                Err(e) => tracing::debug!(machine = %name, error = %e, "status body not read"),
            }
            tracing::debug!(machine = %name, "ignoring machine status update");
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = StatusCode::NO_CONTENT;
            r
        }
    }
}

/// The machine endpoint's limits: the metrics endpoint's kind ([`flex_metrics::Limits`]), set
/// for the API server's service proxy, which may keep a connection for several requests.
pub const LIMITS: flex_metrics::Limits = flex_metrics::Limits {
    max_connections: 256,
    header_read_timeout: HEADER_READ_TIMEOUT,
    connection_timeout: Duration::from_secs(60),
};

/// The HTTP server, bound.
pub struct Server {
    listener: TcpListener,
    limits: flex_metrics::Limits,
}

/// The addresses tried for a Go-style listen address: `:8080` means every interface (IPv6 and
/// IPv4, else IPv4 only); anything else is taken as written.
pub fn listen_candidates(address: &str) -> Vec<String> {
    match address.strip_prefix(':') {
        Some(port) => vec![format!("[::]:{port}"), format!("0.0.0.0:{port}")],
        None => vec![address.to_string()],
    }
}

impl Server {
    /// Binds `address` (`:8080`, `127.0.0.1:0`, `host:port`).
    pub async fn bind(address: &str) -> anyhow::Result<Self> {
        let mut last = None;
        for candidate in listen_candidates(address) {
            match TcpListener::bind(&candidate).await {
                Ok(listener) => {
                    return Ok(Self {
                        listener,
                        limits: LIMITS,
                    });
                }
                Err(e) => last = Some(anyhow::anyhow!("listen on {candidate}: {e}")),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("listen on {address:?}: no address")))
    }

    /// The bound address.
    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// The same server within `limits` instead of [`LIMITS`].
    #[must_use]
    pub fn with_limits(mut self, limits: flex_metrics::Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Serves until `shutdown` is cancelled, then drains connections for at most
    /// `shutdown_timeout`.
    pub async fn run(
        self,
        store: Arc<dyn MachineStore>,
        metrics: Arc<ControllerMetrics>,
        ready: Arc<Readiness>,
        shutdown: CancellationToken,
        shutdown_timeout: Duration,
    ) -> anyhow::Result<()> {
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let limits = self.limits;
        let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout);
        loop {
            tokio::select! {
                accepted = self.listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        tracing::debug!(peer = %peer, limit = limits.max_connections, "connection limit reached; closing");
                        drop(stream);
                        continue;
                    };
                    let (store, metrics, ready) = (store.clone(), metrics.clone(), ready.clone());
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (store, metrics, ready) = (store.clone(), metrics.clone(), ready.clone());
                        async move {
                            let route = route(req.uri().path());
                            let reply = handle(store.as_ref(), &ready, req).await;
                            metrics.request(RouteLabel::from(&route), reply.status().as_u16());
                            Ok::<_, Infallible>(reply)
                        }
                    });
                    let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), svc));
                    tokio::spawn(async move {
                        match tokio::time::timeout(limits.connection_timeout, conn).await {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => tracing::debug!(peer = %peer, error = %e, "connection ended with an error"),
                            Err(_) => tracing::debug!(peer = %peer, "connection reached its time limit; closed"),
                        }
                        drop(slot);
                    });
                }
                () = shutdown.cancelled() => break,
            }
        }
        drop(self.listener);
        tracing::info!(
            timeout_ms = shutdown_timeout.as_millis() as u64,
            "http server shutting down"
        );
        if tokio::time::timeout(shutdown_timeout, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("http server shutdown timed out; closing open connections");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_table() {
        let cases = [
            ("/healthz", Route::Health),
            ("/readyz", Route::Ready),
            ("/machines", Route::MachinesRoot),
            ("/machines/", Route::InvalidName),
            ("/machines///", Route::InvalidName),
            ("/machines/n1", Route::Machine("n1".into())),
            ("/machines/n1/", Route::Machine("n1".into())),
            ("/machines//n1//", Route::Machine("n1".into())),
            ("/machines/n1/status", Route::Status("n1".into())),
            ("/machines/n1/status/", Route::Status("n1".into())),
            ("/machines/n1/other", Route::InvalidName),
            ("/machines/a/b/c", Route::InvalidName),
            ("/machines/a%2Fb", Route::InvalidName),
            ("/machines/a%20b", Route::Machine("a b".into())),
            ("/machines/bad%zz", Route::Machine("bad%zz".into())),
            ("/", Route::Unknown),
            ("/machinesx", Route::Unknown),
            ("/api/machines/n", Route::Unknown),
        ];
        for (path, want) in cases {
            assert_eq!(route(path), want, "{path}");
        }
    }

    /// `/readyz` says why the controller is not ready (503) until it is; `/healthz` is 200
    /// either way (the process is alive).
    #[tokio::test]
    async fn readyz_follows_the_readiness_and_healthz_does_not() {
        let store = crate::store::MemoryStore::new();
        let ready = Readiness::not_ready("ValidatingAdmissionPolicy x is not there");
        let get = |path: &str| {
            Request::get(path)
                .body(http_body_util::Empty::<Bytes>::new())
                .unwrap()
        };
        let body = |r: Reply| async move {
            String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
        };
        let r = handle(&store, &ready, get("/readyz")).await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body(r).await,
            "not ready: ValidatingAdmissionPolicy x is not there\n"
        );
        let r = handle(&store, &ready, get("/healthz")).await;
        assert_eq!(r.status(), StatusCode::OK);
        ready.set(Ok(()));
        let r = handle(&store, &ready, get("/readyz")).await;
        assert_eq!(
            (r.status(), body(r).await.as_str()),
            (StatusCode::OK, "ok\n")
        );
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(listen_candidates(":8080"), ["[::]:8080", "0.0.0.0:8080"]);
        assert_eq!(listen_candidates("127.0.0.1:0"), ["127.0.0.1:0"]);
    }
}
