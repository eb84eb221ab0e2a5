//! The controller's HTTP API end to end: the real server on 127.0.0.1 (ephemeral port) over the
//! in-memory store, every route, method, status and body; then graceful shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::sync::Arc;
use std::time::Duration;

use aks_flex_controller::metrics::ControllerMetrics;
use aks_flex_controller::{Args, MemoryStore, Server};
use clap::Parser;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const MACHINE: &str = r#"
{
  "id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c/agentPools/aksflexnodes/machines/node1",
  "name": "node1",
  "type": "Microsoft.ContainerService/managedClusters/agentPools/machines",
  "unknownTopLevel": true,
  "properties": {
    "eTag": "etag-1",
    "provisioningState": "Succeeded",
    "unknownProperty": {"x": 1},
    "kubernetes": {
      "orchestratorVersion": "1.35.0",
      "maxPods": 110,
      "nodeLabels": {"kubernetes.azure.com/managed": "false"},
      "nodeTaints": [],
      "kubeletConfig": {"imageGcHighThreshold": 85, "imageGcLowThreshold": 80}
    }
  }
}
"#;

struct Running {
    base: String,
    store: Arc<MemoryStore>,
    /// The controller's metrics (real, rendered as its endpoint would).
    metrics: Arc<ControllerMetrics>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    http: reqwest::Client,
}

async fn start() -> Running {
    let store = Arc::new(MemoryStore::new());
    store.insert("node1.json", MACHINE);
    let server = Server::bind("127.0.0.1:0").await.unwrap();
    let addr = server.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let args = Args::try_parse_from(["aks-flex-controller", "--shutdown-timeout=2s"]).unwrap();
    let metrics = Arc::new(ControllerMetrics::new("test"));
    let task = {
        let store = store.clone();
        let shutdown = shutdown.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            aks_flex_controller::run_with(&args, server, store, None, metrics, shutdown).await
        })
    };
    flex_host::http::install_crypto();
    Running {
        base: format!("http://{addr}"),
        store,
        metrics,
        shutdown,
        task,
        http: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
    }
}

impl Running {
    async fn call(&self, method: Method, path: &str, body: &str) -> (StatusCode, String, String) {
        let r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = r.status();
        let ct = r
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        (status, ct, r.text().await.unwrap())
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("server stops within the shutdown timeout")
            .unwrap()
            .unwrap();
    }
}

fn expected_machine() -> Value {
    let mut v: Value = serde_json::from_str(MACHINE).unwrap();
    v.as_object_mut().unwrap().remove("unknownTopLevel");
    v["properties"]
        .as_object_mut()
        .unwrap()
        .remove("unknownProperty");
    v
}

fn err(code: &str, message: &str) -> String {
    format!("{}\n", json!({"error": {"code": code, "message": message}}))
}

#[tokio::test]
async fn health_endpoints_answer_any_method() {
    let s = start().await;
    for path in ["/healthz", "/readyz"] {
        for m in [Method::GET, Method::POST, Method::DELETE] {
            let (status, _, body) = s.call(m.clone(), path, "").await;
            assert_eq!(
                (status, body.as_str()),
                (StatusCode::OK, "ok\n"),
                "{m} {path}"
            );
        }
    }
    s.stop().await;
}

#[tokio::test]
async fn machine_get_head_put_post_and_other_methods() {
    let s = start().await;
    let (status, ct, body) = s.call(Method::GET, "/machines/node1", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ct, "application/json");
    assert!(body.ends_with("}\n"), "trailing newline: {body:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        expected_machine(),
        "re-encoded through the model: unknown fields dropped"
    );
    // HEAD: 200, no body.
    let (status, _, body) = s.call(Method::HEAD, "/machines/node1", "").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    // PUT and POST: body ignored, the existing machine.
    for m in [Method::PUT, Method::POST] {
        let (status, _, body) = s
            .call(
                m.clone(),
                "/machines/node1",
                r#"{"properties":{"kubernetes":{"orchestratorVersion":"9.9.9"}}}"#,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{m}");
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap(),
            expected_machine()
        );
    }
    // The bare key works too.
    s.store.insert("node2", r#"{"name":"node2"}"#);
    let (status, _, body) = s.call(Method::GET, "/machines/node2/", "").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "{\"name\":\"node2\"}\n")
    );
    for m in [Method::DELETE, Method::PATCH, Method::OPTIONS] {
        let (status, ct, body) = s.call(m.clone(), "/machines/node1", "").await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{m}");
        assert_eq!(ct, "application/json");
        assert_eq!(
            body,
            err(
                "MethodNotAllowed",
                "only GET, HEAD, PUT, and POST are supported"
            )
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn not_found_and_store_failures() {
    let s = start().await;
    for m in [Method::GET, Method::PUT, Method::POST] {
        let (status, _, body) = s.call(m, "/machines/ghost", "").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body, err("NotFound", "machine \"ghost\" not found"));
    }
    let (status, _, body) = s.call(Method::HEAD, "/machines/ghost", "").await;
    assert_eq!((status, body.as_str()), (StatusCode::NOT_FOUND, ""));
    let unavailable = err(
        "MachineStoreUnavailable",
        "failed to read machine data source",
    );
    // Bad JSON in the ConfigMap.
    s.store.insert("broken.json", "{not json");
    let (status, _, body) = s.call(Method::GET, "/machines/broken", "").await;
    assert_eq!(
        (status, body.clone()),
        (StatusCode::SERVICE_UNAVAILABLE, unavailable.clone())
    );
    // The API server failing.
    s.store.fail_with(Some("connection refused"));
    let (status, _, body) = s.call(Method::GET, "/machines/node1", "").await;
    assert_eq!(
        (status, body),
        (StatusCode::SERVICE_UNAVAILABLE, unavailable.clone())
    );
    s.store.fail_with(None);
    // The ConfigMap missing.
    s.store.delete_config_map();
    let (status, _, body) = s.call(Method::GET, "/machines/node1", "").await;
    assert_eq!(
        (status, body),
        (StatusCode::SERVICE_UNAVAILABLE, unavailable)
    );
    // The metrics saw each answer by route and code, and each store read by result; never a
    // machine's name.
    let text = s.metrics.render();
    for want in [
        "aks_flex_controller_http_requests_total{route=\"machine\",code=\"404\"} 4",
        "aks_flex_controller_http_requests_total{route=\"machine\",code=\"503\"} 3",
        "aks_flex_controller_machine_store_duration_seconds_count{result=\"not_found\"} 4",
        "aks_flex_controller_machine_store_duration_seconds_count{result=\"unavailable\"} 3",
    ] {
        assert!(text.contains(want), "{want} not in\n{text}");
    }
    assert!(
        !text.contains("ghost") && !text.contains("broken"),
        "{text}"
    );
    s.stop().await;
}

#[tokio::test]
async fn status_patch_is_accepted_without_existence_check() {
    let s = start().await;
    let patch = r#"{"properties":{"status":{"provisioningState":"Succeeded","observedSettingsVersion":"etag-1"}}}"#;
    let (status, _, body) = s.call(Method::PATCH, "/machines/ghost/status", patch).await;
    assert_eq!((status, body.as_str()), (StatusCode::NO_CONTENT, ""));
    assert_eq!(
        s.store.statuses(),
        vec![(
            "ghost".to_string(),
            serde_json::from_str::<Value>(patch).unwrap()
        )]
    );
    for m in [Method::GET, Method::PUT, Method::POST, Method::DELETE] {
        let (status, _, body) = s.call(m.clone(), "/machines/node1/status", "").await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{m}");
        assert_eq!(
            body,
            err(
                "MethodNotAllowed",
                "only PATCH is supported for machine status"
            )
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn invalid_names_and_unknown_paths() {
    let s = start().await;
    let invalid = err(
        "InvalidMachineName",
        "machine name must be a single path segment",
    );
    for path in [
        "/machines/",
        "/machines/a/b",
        "/machines/a/b/c",
        "/machines/a/status/x",
    ] {
        for m in [Method::GET, Method::PATCH] {
            let (status, ct, body) = s.call(m.clone(), path, "").await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{m} {path}");
            assert_eq!(ct, "application/json");
            assert_eq!(body, invalid, "{m} {path}");
        }
    }
    let (status, _, body) = s.call(Method::GET, "/nothing", "").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::NOT_FOUND, "404 page not found\n")
    );
    let r = s
        .http
        .get(format!("{}/machines", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::MOVED_PERMANENTLY);
    assert_eq!(r.headers()["location"], "/machines/");
    s.stop().await;
}

#[tokio::test]
async fn shutdown_is_graceful_and_bounded() {
    let s = start().await;
    // A kept-alive idle connection does not hold shutdown up.
    let (status, _, _) = s.call(Method::GET, "/healthz", "").await;
    assert_eq!(status, StatusCode::OK);
    let base = s.base.clone();
    let started = std::time::Instant::now();
    s.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // The port is closed afterwards.
    let e = reqwest::get(format!("{base}/healthz")).await;
    assert!(e.is_err());
}

#[tokio::test]
async fn the_approver_without_a_client_is_an_error_that_stops_the_server() {
    let store = Arc::new(MemoryStore::new());
    let server = Server::bind("127.0.0.1:0").await.unwrap();
    let args =
        Args::try_parse_from(["x", "--enable-csr-approver", "--shutdown-timeout=1s"]).unwrap();
    let e = tokio::time::timeout(
        Duration::from_secs(5),
        aks_flex_controller::run_with(
            &args,
            server,
            store,
            None,
            Arc::new(ControllerMetrics::default()),
            CancellationToken::new(),
        ),
    )
    .await
    .expect("the server stops when the approver ends")
    .unwrap_err();
    assert_eq!(e.to_string(), "the CSR approver needs a Kubernetes client");
}

/// Runs `server` over `store` (no cluster): its address, its shutdown and its task.
fn serve_store(
    server: Server,
    store: &Arc<MemoryStore>,
) -> (
    std::net::SocketAddr,
    CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let addr = server.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let args = Args::try_parse_from(["x", "--shutdown-timeout=1s"]).unwrap();
    let task = {
        let (store, shutdown) = (store.clone(), shutdown.clone());
        tokio::spawn(async move {
            aks_flex_controller::run_with(&args, server, store, None, Default::default(), shutdown)
                .await
        })
    };
    (addr, shutdown, task)
}

/// Real server and sockets: connections over the limit are closed when accepted, an idle one
/// is closed at the header timeout (freeing its slot), a connection lives at most its time
/// limit, and machines are served all along; then a flood of 500 concurrent requests against
/// the shipped limits is answered (200) or closed, never left hanging, and the endpoint
/// answers afterwards.
#[tokio::test]
async fn connections_are_capped_idle_ones_closed_and_a_flood_leaves_it_serving() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let store = Arc::new(MemoryStore::new());
    store.insert("node1.json", MACHINE);
    let limits = flex_metrics::Limits {
        max_connections: 2,
        header_read_timeout: Duration::from_millis(300),
        connection_timeout: Duration::from_secs(2),
    };
    let server = Server::bind("127.0.0.1:0")
        .await
        .unwrap()
        .with_limits(limits);
    let (addr, shutdown, task) = serve_store(server, &store);
    let _first = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut second = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut over = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(2), over.read(&mut buf))
        .await
        .expect("the third connection is closed at once")
        .unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    // Both idle ones are closed at the header timeout: the slots are free again.
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), second.read_to_end(&mut rest))
        .await
        .expect("the idle connection is closed at the header timeout");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut ok = tokio::net::TcpStream::connect(addr).await.unwrap();
    ok.write_all(b"GET /machines/node1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(2), ok.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    shutdown.cancel();
    task.await.unwrap().unwrap();

    // The shipped limits under a flood.
    let server = Server::bind("127.0.0.1:0").await.unwrap();
    let (addr, shutdown, task) = serve_store(server, &store);
    flex_host::http::install_crypto();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let flood: Vec<_> = (0..500)
        .map(|_| {
            let http = http.clone();
            tokio::spawn(async move {
                http.get(format!("http://{addr}/machines/node1"))
                    .send()
                    .await
                    .map(|r| r.status())
            })
        })
        .collect();
    let (mut served, mut closed) = (0, 0);
    for f in flood {
        match f.await.unwrap() {
            Ok(s) if s == StatusCode::OK => served += 1,
            Ok(s) => panic!("answered {s}"),
            Err(e) => {
                assert!(!e.is_timeout(), "a request was left hanging: {e}");
                closed += 1;
            }
        }
    }
    assert_eq!(served + closed, 500);
    assert!(served > 0, "{served} served, {closed} closed");
    let r = http
        .get(format!("http://{addr}/machines/node1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    eprintln!(
        "flood: {served} served, {closed} closed over the limit, in {:?}",
        started.elapsed()
    );
    shutdown.cancel();
    task.await.unwrap().unwrap();
}
