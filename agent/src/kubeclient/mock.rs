//! A fake API server for tests: a `kube::Client` over a `tower_test` mock service, answered by a
//! routing function, with every request recorded (method, path and query, body). A route may
//! hold a request open (a watch that has nothing more to say).

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::client::Body;
use tokio::task::JoinHandle;

/// A request the fake server saw.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Path and query.
    pub uri: String,
    /// The body.
    pub body: Vec<u8>,
    /// The `Content-Type` header (empty when absent).
    pub content_type: String,
}

impl Seen {
    /// The path without the query.
    pub fn path(&self) -> &str {
        self.uri.split('?').next().unwrap_or_default()
    }

    /// Whether the query has `watch=true`.
    pub fn is_watch(&self) -> bool {
        self.uri.contains("watch=true")
    }
}

/// What the fake server answers.
pub(crate) enum Reply {
    /// A JSON body with a status code.
    Json(u16, serde_json::Value),
    /// Raw bytes (watch event lines) with 200.
    Raw(Vec<u8>),
    /// No answer yet: the request stays open.
    Hold,
    /// Raw bytes (watch event lines) with 200, once the test sends them.
    Deferred(tokio::sync::oneshot::Receiver<Vec<u8>>),
}

impl Reply {
    /// A Kubernetes `Status` failure.
    pub fn status(code: u16, reason: &str, message: &str) -> Self {
        Reply::Json(
            code,
            serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "message": message, "reason": reason, "code": code
            }),
        )
    }

    /// Watch event lines (`{"type":..,"object":..}` per line).
    pub fn events(events: &[(&str, serde_json::Value)]) -> Self {
        let mut out = Vec::new();
        for (ty, obj) in events {
            out.extend_from_slice(
                serde_json::json!({ "type": ty, "object": obj })
                    .to_string()
                    .as_bytes(),
            );
            out.push(b'\n');
        }
        Reply::Raw(out)
    }
}

/// The requests seen so far.
pub(crate) type Log = Arc<Mutex<Vec<Seen>>>;

/// A client whose requests `route` answers; returns the client, the request log and the
/// server task.
pub(crate) fn serve(
    mut route: impl FnMut(&Seen) -> Reply + Send + 'static,
) -> (kube::Client, Log, JoinHandle<()>) {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let log: Log = Arc::default();
    let seen_log = log.clone();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let body = body
                .collect_bytes()
                .await
                .map(|b| b.to_vec())
                .unwrap_or_default();
            let seen = Seen {
                method: parts.method.to_string(),
                uri: parts
                    .uri
                    .path_and_query()
                    .map(|p| p.to_string())
                    .unwrap_or_default(),
                body,
                content_type: parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string(),
            };
            if let Ok(mut l) = seen_log.lock() {
                l.push(seen.clone());
            }
            match route(&seen) {
                Reply::Json(code, v) => {
                    let resp = Response::builder()
                        .status(code)
                        .header("content-type", "application/json")
                        .body(Body::from(v.to_string().into_bytes()));
                    if let Ok(r) = resp {
                        send.send_response(r);
                    }
                }
                Reply::Raw(bytes) => {
                    if let Ok(r) = Response::builder().status(200).body(Body::from(bytes)) {
                        send.send_response(r);
                    }
                }
                Reply::Hold => held.push(send),
                Reply::Deferred(rx) => {
                    tokio::spawn(async move {
                        let bytes = rx.await.unwrap_or_default();
                        if let Ok(r) = Response::builder().status(200).body(Body::from(bytes)) {
                            send.send_response(r);
                        }
                    });
                }
            }
        }
    });
    (kube::Client::new(svc, "default"), log, task)
}

/// The requests in `log` (a copy).
pub(crate) fn seen(log: &Log) -> Vec<Seen> {
    log.lock().map(|l| l.clone()).unwrap_or_default()
}

/// Everything logged on this thread (every level) while the guard lives.
pub(crate) struct LogCapture {
    buf: Arc<Mutex<Vec<u8>>>,
    _guard: tracing::subscriber::DefaultGuard,
}

#[derive(Clone)]
struct CaptureWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for CaptureWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut v) = self.0.lock() {
            v.extend_from_slice(b);
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogCapture {
    /// Starts capturing (a current-thread runtime keeps spawned tasks on this thread).
    pub fn start() -> Self {
        let buf: Arc<Mutex<Vec<u8>>> = Arc::default();
        let w = CaptureWriter(buf.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || w.clone())
            .finish();
        Self {
            buf,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    /// What was logged so far.
    pub fn text(&self) -> String {
        self.buf
            .lock()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
}

/// The discovery path of the AKS Flex API.
pub(crate) const FLEX_API_PATH: &str = "/apis/unbounded-cloud.io/v1alpha3";

/// An `APIResourceList` of `unbounded-cloud.io/v1alpha3` with these resources.
pub(crate) fn flex_api_resources(names: &[&str]) -> serde_json::Value {
    let list: Vec<serde_json::Value> = names
        .iter()
        .map(|n| serde_json::json!({"name": n, "singularName": "", "namespaced": false, "kind": "K", "verbs": ["get"]}))
        .collect();
    serde_json::json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "unbounded-cloud.io/v1alpha3", "resources": list})
}
