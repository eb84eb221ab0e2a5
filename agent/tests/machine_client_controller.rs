//! The agent's in-cluster machine client against real HTTP servers on 127.0.0.1: the
//! controller (`aks-flex-controller`'s server over its in-memory store) for the happy paths —
//! get, the ETag as settings version, 404 → NotFound, status patches, PUT adopt, `start`'s
//! ensure-machine — and a scripted server for what the controller never answers: 409/410/500,
//! retries with backoff, the API server's own 404, bad JSON, a server that is down or hangs,
//! the endpoint's query and the bearer token.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aks_flex_controller::{Args, MemoryStore, Server};
use aks_flex_node::flows::start::{GoalState, MachineRegistry, ensure_machine};
use aks_flex_node::goalclient::{
    InClusterClient, MachineClient, MachineClientRegistry, MachineError, MachineStatus,
};
use clap::Parser;
use flex_host::retry::Backoff;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const NODE: &str = "node1";

fn machine_json(version: &str, etag: &str) -> String {
    serde_json::json!({
        "id": format!("/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c/agentPools/aksflexnodes/machines/{NODE}"),
        "name": NODE,
        "type": "Microsoft.ContainerService/managedClusters/agentPools/machines",
        "properties": {
            "eTag": etag,
            "provisioningState": "Succeeded",
            "kubernetes": {
                "orchestratorVersion": version,
                "maxPods": 110,
                "nodeLabels": {"kubernetes.azure.com/managed": "false", "team": "a"},
                "nodeTaints": ["dedicated=flex:NoSchedule"],
                "kubeletConfig": {"imageGcHighThreshold": 85, "imageGcLowThreshold": 80}
            }
        }
    })
    .to_string()
}

fn fast_retry(attempts: u32) -> Backoff {
    Backoff {
        attempts,
        initial: Duration::from_millis(10),
        max: Duration::from_millis(40),
    }
}

fn kube_config(base: &str) -> kube::Config {
    let mut kc = kube::Config::new(base.parse().unwrap());
    kc.auth_info.token = Some(secrecy::SecretString::from("bootstrap.token".to_string()));
    kc
}

fn client(base: &str, endpoint: &str) -> InClusterClient {
    InClusterClient::from_kube_config(kube_config(base), endpoint, NODE)
        .unwrap()
        .with_retry(fast_retry(3))
        .with_timeout(Duration::from_secs(5))
}

fn goal(version: &str) -> GoalState {
    GoalState {
        kubernetes_version: version.into(),
        settings_version: version.into(),
        max_pods: 110,
        ..Default::default()
    }
}

struct Controller {
    base: String,
    store: Arc<MemoryStore>,
    shutdown: CancellationToken,
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn controller() -> Controller {
    let store = Arc::new(MemoryStore::new());
    let server = Server::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", server.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let args = Args::try_parse_from(["aks-flex-controller", "--shutdown-timeout=1s"]).unwrap();
    let (s, t) = (store.clone(), shutdown.clone());
    tokio::spawn(async move {
        aks_flex_controller::run_with(&args, server, s, None, Default::default(), t).await
    });
    Controller {
        base,
        store,
        shutdown,
    }
}

#[tokio::test]
async fn get_reads_the_machine_and_its_etag() {
    let c = controller().await;
    c.store
        .insert("node1.json", &machine_json("1.35.0", "etag-7"));
    let m = client(&c.base, "/").get().await.unwrap();
    assert_eq!(m.name, NODE);
    assert!(
        m.id.ends_with("/agentPools/aksflexnodes/machines/node1"),
        "{}",
        m.id
    );
    assert_eq!(m.goal.kubernetes_version, "1.35.0");
    assert_eq!(m.goal.settings_version, "etag-7");
    assert_eq!(m.goal.max_pods, 110);
    assert_eq!(m.goal.node_labels["team"], "a");
    assert_eq!(m.goal.node_taints, ["dedicated=flex:NoSchedule"]);
    assert_eq!(
        (
            m.goal.image_gc_high_threshold,
            m.goal.image_gc_low_threshold
        ),
        (85, 80)
    );
    assert_eq!(m.status.provisioning_state, "Succeeded");

    // A changed entry is seen at once (the controller reads on every request); without an
    // eTag the settings version is the Kubernetes version, and a missing id is the URL.
    c.store.insert(
        "node1.json",
        r#"{"properties":{"kubernetes":{"orchestratorVersion":"1.36.1"}}}"#,
    );
    let m = client(&c.base, "/?trace=1").get().await.unwrap();
    assert_eq!(m.goal.settings_version, "1.36.1");
    assert_eq!(m.id, format!("{}/machines/node1?trace=1", c.base));
    assert_eq!(m.name, NODE);
}

#[tokio::test]
async fn a_missing_machine_is_not_found() {
    let c = controller().await;
    match client(&c.base, "/").get().await {
        Err(MachineError::NotFound(url)) => {
            assert_eq!(url, format!("{}/machines/node1", c.base));
        }
        other => panic!("{other:?}"),
    }
    // PUT on a missing machine: the controller answers 404 too.
    assert!(matches!(
        client(&c.base, "/").create(&goal("1.35.0")).await,
        Err(MachineError::NotFound(_))
    ));
}

#[tokio::test]
async fn status_patches_reach_the_controller() {
    let c = controller().await;
    let cl = client(&c.base, "/");
    cl.patch_status(&MachineStatus::reconciling("etag-7", "repaving to kube2"))
        .await
        .unwrap();
    cl.patch_status(&MachineStatus::succeeded("etag-7", ""))
        .await
        .unwrap();
    cl.patch_status(&MachineStatus::failed(
        "etag-8",
        "kubelet did not become ready",
    ))
    .await
    .unwrap();
    let got: Vec<serde_json::Value> = c
        .store
        .statuses()
        .into_iter()
        .map(|(n, b)| {
            assert_eq!(n, NODE);
            b
        })
        .collect();
    assert_eq!(
        got,
        vec![
            serde_json::json!({"properties":{"status":{"provisioningState":"Reconciling","observedSettingsVersion":"etag-7","message":"repaving to kube2"}}}),
            serde_json::json!({"properties":{"status":{"provisioningState":"Succeeded","observedSettingsVersion":"etag-7"}}}),
            serde_json::json!({"properties":{"status":{"provisioningState":"Failed","observedSettingsVersion":"etag-8","message":"kubelet did not become ready"}}}),
        ]
    );
}

#[tokio::test]
async fn put_returns_the_existing_machine_and_checks_its_version() {
    let c = controller().await;
    c.store.insert("node1", &machine_json("1.35.0", "etag-9"));
    let m = client(&c.base, "/").create(&goal("1.35.0")).await.unwrap();
    assert_eq!(m.goal.settings_version, "etag-9");
    let e = client(&c.base, "/")
        .create(&goal("1.36.0"))
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "pre-created machine Kubernetes version \"1.35.0\" does not match desired \"1.36.0\""
    );
}

#[tokio::test]
async fn start_registers_through_the_adapter() {
    let c = controller().await;
    let registry = MachineClientRegistry(Arc::new(client(&c.base, "/")));
    // Missing: ensure-machine PUTs, which the read-only controller answers 404.
    let mut g = goal("1.35.0");
    let e = ensure_machine(&registry, &mut g, true).await.unwrap_err();
    assert!(
        e.to_string()
            .starts_with("ensure-machine: create machine: machine resource"),
        "{e}"
    );
    assert_eq!(g.settings_version, "1.35.0");
    // Registered with the same version: the ETag is adopted, nothing is written.
    c.store
        .insert("node1.json", &machine_json("1.35.0", "etag-42"));
    assert_eq!(registry.get().await.unwrap().unwrap().etag, "etag-42");
    ensure_machine(&registry, &mut g, true).await.unwrap();
    assert_eq!(g.settings_version, "etag-42");
    // Registered with another version: PUT, and the controller's answer does not match.
    let mut g = goal("1.36.0");
    let e = ensure_machine(&registry, &mut g, true).await.unwrap_err();
    assert!(e.to_string().contains("does not match"), "{e}");
    // Not required: a warning and the config's version.
    ensure_machine(&registry, &mut g, false).await.unwrap();
    assert_eq!(g.settings_version, "1.36.0");
}

#[tokio::test]
async fn the_controller_store_recovering_during_retries() {
    let c = controller().await;
    c.store.insert("node1.json", &machine_json("1.35.0", "e"));
    c.store
        .fail_with(Some("config map read: connection refused"));
    let e = client(&c.base, "/").get().await.unwrap_err().to_string();
    assert!(
        e.starts_with("get machine: status 503 Service Unavailable: {\"error\":{\"code\":\"MachineStoreUnavailable\""),
        "{e}"
    );
    assert!(e.ends_with("(gave up after 3 attempts)"), "{e}");
    // Heals while the client backs off.
    let store = c.store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        store.fail_with(None);
    });
    let m = client(&c.base, "/")
        .with_retry(Backoff {
            attempts: 20,
            initial: Duration::from_millis(10),
            max: Duration::from_millis(20),
        })
        .get()
        .await
        .unwrap();
    assert_eq!(m.goal.settings_version, "e");
}

// ---------------------------------------------------------------------------------------------
// A scripted server: answers each request with the next scripted response (the last repeats)
// and records what it got.

#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    authorization: String,
    content_type: String,
    body: String,
}

#[derive(Clone)]
struct Scripted {
    base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn scripted(responses: Vec<(u16, &'static str)>) -> Scripted {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        let mut n = 0;
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let (status, body) = responses[n.min(responses.len() - 1)];
            n += 1;
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let head_end = loop {
                let k = sock.read(&mut chunk).await.unwrap();
                if k == 0 {
                    break None;
                }
                buf.extend_from_slice(&chunk[..k]);
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break Some(i + 4);
                }
            };
            let Some(head_end) = head_end else { continue };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
            let header = |name: &str| {
                head.lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
                    })
                    .unwrap_or_default()
            };
            let len: usize = header("content-length").parse().unwrap_or(0);
            while buf.len() < head_end + len {
                let k = sock.read(&mut chunk).await.unwrap();
                if k == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..k]);
            }
            let mut first = head.lines().next().unwrap_or_default().split(' ');
            log.lock().unwrap().push(Seen {
                method: first.next().unwrap_or_default().to_string(),
                path: first.next().unwrap_or_default().to_string(),
                authorization: header("authorization"),
                content_type: header("content-type"),
                body: String::from_utf8_lossy(&buf[head_end..]).to_string(),
            });
            if status == 0 {
                // Hang: never answer.
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    drop(sock);
                });
                continue;
            }
            let reason = match status {
                200 => "OK",
                204 => "No Content",
                403 => "Forbidden",
                404 => "Not Found",
                405 => "Method Not Allowed",
                409 => "Conflict",
                410 => "Gone",
                500 => "Internal Server Error",
                _ => "Status",
            };
            let resp = format!(
                "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
            let _ = sock.shutdown().await;
        }
    });
    Scripted { base, seen }
}

impl Scripted {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

const PROXY: &str = "/api/v1/namespaces/kube-system/services/http:aks-flex-controller:80/proxy";

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

#[tokio::test]
async fn requests_use_the_proxy_path_query_and_bearer_token() {
    let ok = leak(machine_json("1.35.0", "e1"));
    let s = scripted(vec![(200, ok), (204, ""), (200, ok)]).await;
    let cl = client(&s.base, &format!("{PROXY}?x=1&y=2"));
    cl.get().await.unwrap();
    cl.patch_status(&MachineStatus::succeeded("e1", ""))
        .await
        .unwrap();
    let seen = s.seen();
    assert_eq!(seen[0].method, "GET");
    assert_eq!(seen[0].path, format!("{PROXY}/machines/node1?x=1&y=2"));
    assert_eq!(seen[0].authorization, "Bearer bootstrap.token");
    assert_eq!(seen[1].method, "PATCH");
    assert_eq!(
        seen[1].path,
        format!("{PROXY}/machines/node1/status?x=1&y=2")
    );
    assert_eq!(seen[1].content_type, "application/json");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&seen[1].body).unwrap(),
        serde_json::json!({"properties":{"status":{"provisioningState":"Succeeded","observedSettingsVersion":"e1"}}})
    );
}

#[tokio::test]
async fn conflicts_and_server_errors_are_retried_with_backoff() {
    let ok = leak(machine_json("1.35.0", "after-retries"));
    let s = scripted(vec![(409, "conflict"), (500, "boom"), (200, ok)]).await;
    let m = client(&s.base, PROXY).get().await.unwrap();
    assert_eq!(m.goal.settings_version, "after-retries");
    assert_eq!(s.seen().len(), 3);

    let s = scripted(vec![(500, "boom")]).await;
    let e = client(&s.base, PROXY).get().await.unwrap_err().to_string();
    assert_eq!(
        e,
        "get machine: status 500 Internal Server Error: boom (gave up after 3 attempts)"
    );
    assert_eq!(s.seen().len(), 3);

    // A status patch that conflicts once goes through on the retry.
    let s = scripted(vec![(409, "{}"), (204, "")]).await;
    client(&s.base, PROXY)
        .patch_status(&MachineStatus::reconciling("e", ""))
        .await
        .unwrap();
    assert_eq!(s.seen().len(), 2);
}

#[tokio::test]
async fn gone_and_forbidden_fail_at_once() {
    let s = scripted(vec![(410, "gone for good")]).await;
    let e = client(&s.base, PROXY).get().await.unwrap_err().to_string();
    assert_eq!(e, "get machine: status 410 Gone: gone for good");
    assert_eq!(s.seen().len(), 1, "410 is not retried");

    let s = scripted(vec![(403, "forbidden")]).await;
    let e = client(&s.base, PROXY)
        .patch_status(&MachineStatus::failed("e", "x"))
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(e, "patch machine status: status 403 Forbidden: forbidden");
}

#[tokio::test]
async fn the_api_servers_own_404_is_not_a_missing_machine() {
    let status = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"services \"aks-flex-controller\" not found","reason":"NotFound","details":{"name":"aks-flex-controller","kind":"services"},"code":404}"#;
    let s = scripted(vec![(404, status)]).await;
    match client(&s.base, PROXY).get().await {
        Err(MachineError::Other(e)) => {
            let e = e.to_string();
            assert!(
                e.starts_with("get machine: status 404 Not Found: {\"kind\":\"Status\""),
                "{e}"
            );
            assert!(e.contains("is aks-flex-controller deployed?"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let s = scripted(vec![(404, r#"{"error":{"code":"NotFound"}}"#)]).await;
    assert!(matches!(
        client(&s.base, PROXY).get().await,
        Err(MachineError::NotFound(u)) if u == format!("{}{PROXY}/machines/node1", s.base)
    ));
}

#[tokio::test]
async fn error_bodies_are_read_up_to_4096_bytes() {
    let big = leak("x".repeat(10_000));
    let s = scripted(vec![(410, big)]).await;
    let e = client(&s.base, PROXY).get().await.unwrap_err().to_string();
    assert_eq!(e.len(), "get machine: status 410 Gone: ".len() + 4096);
}

#[tokio::test]
async fn machine_json_that_does_not_parse_names_the_field() {
    let s = scripted(vec![(
        200,
        r#"{"properties":{"kubernetes":{"maxPods":"lots"}}}"#,
    )])
    .await;
    let e = client(&s.base, PROXY).get().await.unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "get machine: {}{PROXY}/machines/node1: invalid ARM machine JSON at properties.kubernetes.maxPods: invalid type: string \"lots\"",
            s.base
        )),
        "{e}"
    );
    assert_eq!(s.seen().len(), 1, "bad JSON is not retried");
    let s = scripted(vec![(200, "<html>proxy error</html>")]).await;
    let e = client(&s.base, PROXY).get().await.unwrap_err().to_string();
    assert!(
        e.contains("invalid ARM machine JSON: expected value"),
        "{e}"
    );
}

#[tokio::test]
async fn put_adopts_on_403_405_204_and_empty_bodies() {
    let ok = leak(machine_json("1.35.0", "adopted"));
    for first in [(403, "forbidden"), (405, "no"), (204, ""), (200, "  \n")] {
        let s = scripted(vec![first, (200, ok)]).await;
        let m = client(&s.base, PROXY)
            .create(&goal("1.35.0"))
            .await
            .unwrap();
        assert_eq!(m.goal.settings_version, "adopted", "{first:?}");
        let seen = s.seen();
        assert_eq!(
            (seen[0].method.as_str(), seen[1].method.as_str()),
            ("PUT", "GET"),
            "{first:?}"
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&seen[0].body).unwrap(),
            serde_json::json!({"properties":{"kubernetes":{"orchestratorVersion":"1.35.0","maxPods":110,"nodeLabels":{},"nodeTaints":[]}}})
        );
    }
    // The PUT's own answer is used when it has a body; its version is checked.
    let other = leak(machine_json("1.34.0", "x"));
    let s = scripted(vec![(201, other)]).await;
    let e = client(&s.base, PROXY)
        .create(&goal("1.35.0"))
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "pre-created machine Kubernetes version \"1.34.0\" does not match desired \"1.35.0\""
    );
    let s = scripted(vec![(500, "nope")]).await;
    let e = client(&s.base, PROXY)
        .with_retry(Backoff::none())
        .create(&goal("1.35.0"))
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(e, "create machine: status 500 Internal Server Error: nope");
}

#[tokio::test]
async fn an_api_server_that_is_down_or_hangs() {
    // Down: nothing listens on the port.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let base = format!("http://127.0.0.1:{port}");
    let started = std::time::Instant::now();
    let e = client(&base, PROXY).get().await.unwrap_err().to_string();
    assert!(
        e.starts_with(&format!("get machine: GET {base}{PROXY}/machines/node1: ")),
        "{e}"
    );
    assert!(e.to_lowercase().contains("connect"), "names the cause: {e}");
    assert!(e.ends_with("(gave up after 3 attempts)"), "{e}");
    assert!(started.elapsed() >= Duration::from_millis(20), "backed off");

    // Hangs: each attempt times out.
    let s = scripted(vec![(0, "")]).await;
    let e = client(&s.base, PROXY)
        .with_timeout(Duration::from_millis(200))
        .with_retry(fast_retry(2))
        .get()
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("no response within 200ms"), "{e}");
    assert_eq!(s.seen().len(), 2);
}

// ---------------------------------------------------------------------------------------------
// The ARM client through the dev-test proxy (static token), against the scripted server.

const CLUSTER: &str =
    "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c";

fn arm_config() -> aks_flex_node::config::Config {
    let mut c = aks_flex_node::config::Config::default();
    c.azure.target_cluster = Some(aks_flex_node::config::TargetCluster {
        resource_id: CLUSTER.into(),
        ..Default::default()
    });
    c.azure.target_agent_pool_name = "aksflexnodes".into();
    c.azure.resource_manager_endpoint = "https://management.azure.com".into();
    c.agent.node_name = NODE.into();
    c.components.kubernetes = "1.35.0".into();
    c
}

fn arm_json(state: &str) -> &'static str {
    let mut v: serde_json::Value =
        serde_json::from_str(&machine_json("1.35.0", "arm-etag")).unwrap();
    v["id"] = serde_json::json!(
        format!("{CLUSTER}/agentPools/aksflexnodes/machines/{NODE}").to_lowercase()
    );
    v["properties"]["provisioningState"] = serde_json::json!(state);
    leak(v.to_string())
}

fn arm_client(base: &str) -> aks_flex_node::goalclient::ArmMachineClient {
    aks_flex_node::goalclient::ArmMachineClient::proxy(
        &arm_config(),
        &format!("{base}/proxy?tenant=t"),
    )
    .unwrap()
    .with_retry(fast_retry(3))
    .with_polling(Duration::from_millis(10), Duration::from_secs(5))
}

#[tokio::test]
async fn arm_proxy_get_and_create_poll_until_terminal() {
    let s = scripted(vec![(200, arm_json("Succeeded"))]).await;
    let m = arm_client(&s.base).get().await.unwrap();
    assert_eq!(m.goal.settings_version, "arm-etag");
    let seen = s.seen();
    assert_eq!(
        seen[0].path,
        format!(
            "/proxy{CLUSTER}/agentPools/aksflexnodes/machines/{NODE}?tenant=t&api-version={}",
            aks_flex_node::goalclient::arm::API_VERSION
        )
    );
    assert_eq!(seen[0].authorization, "Bearer aks-flex-node-e2e");

    let s = scripted(vec![
        (201, arm_json("Creating")),
        (200, arm_json("Updating")),
        (200, arm_json("Succeeded")),
    ])
    .await;
    let m = arm_client(&s.base).create(&goal("1.35.0")).await.unwrap();
    assert_eq!(m.status.provisioning_state, "Succeeded");
    let methods: Vec<String> = s.seen().into_iter().map(|x| x.method).collect();
    assert_eq!(methods, ["PUT", "GET", "GET"]);

    let s = scripted(vec![(201, arm_json("Creating")), (200, arm_json("Failed"))]).await;
    let e = arm_client(&s.base)
        .create(&goal("1.35.0"))
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(e, "create AKS machine: provisioning ended \"Failed\"");
}

#[tokio::test]
async fn arm_proxy_errors() {
    let s = scripted(vec![(404, r#"{"error":{"code":"NotFound"}}"#)]).await;
    assert!(matches!(
        arm_client(&s.base).get().await,
        Err(MachineError::NotFound(id)) if id.ends_with("/machines/node1")
    ));
    let wrong = leak(machine_json("1.35.0", "e").replace("/machines/node1", "/machines/other"));
    let s = scripted(vec![(200, wrong)]).await;
    let e = arm_client(&s.base).get().await.unwrap_err().to_string();
    assert!(
        e.starts_with("get AKS machine: AKS machine ID mismatch"),
        "{e}"
    );
    let s = scripted(vec![(500, "busy")]).await;
    let e = arm_client(&s.base).get().await.unwrap_err().to_string();
    assert_eq!(e, "get AKS machine: status 500 Internal Server Error: busy");
    assert_eq!(s.seen().len(), 3, "retried");
    // Status is read-only in ARM: nothing is sent.
    arm_client(&s.base)
        .patch_status(&MachineStatus::succeeded("e", ""))
        .await
        .unwrap();
    assert_eq!(s.seen().len(), 3);
}

fn controller_config(endpoint: &str) -> aks_flex_node::config::Config {
    let mut c = arm_config();
    c.agent.machine_client.mode = "controller".into();
    c.agent.machine_client.endpoint_url = endpoint.into();
    c
}

/// `controller` mode as `machine_client` builds it from a config, against the real controller
/// on 127.0.0.1: the daemon's and `start`'s client both read the machine and report status
/// straight to the controller's endpoint.
#[tokio::test]
async fn controller_mode_reaches_the_controller_directly() {
    let c = controller().await;
    c.store
        .insert("node1.json", &machine_json("1.35.0", "etag-9"));
    let client = aks_flex_node::goalclient::client_for_start(&controller_config(&c.base))
        .await
        .unwrap();
    let m = client.get().await.unwrap();
    assert_eq!(m.goal.settings_version, "etag-9");
    client
        .patch_status(&MachineStatus::succeeded("etag-9", ""))
        .await
        .unwrap();
    let mut goal = goal("1.35.0");
    ensure_machine(&MachineClientRegistry(client), &mut goal, true)
        .await
        .unwrap();
    assert_eq!(goal.settings_version, "etag-9");
}

/// `controller` mode against a scripted server: the machine's path under the URL's path, and
/// no credentials of any kind.
#[tokio::test]
async fn controller_mode_sends_no_credentials() {
    let ok = leak(machine_json("1.35.0", "e1"));
    let s = scripted(vec![(200, ok), (204, "")]).await;
    let client = aks_flex_node::goalclient::client_for_start(&controller_config(&format!(
        "{}/flex",
        s.base
    )))
    .await
    .unwrap();
    client.get().await.unwrap();
    client
        .patch_status(&MachineStatus::succeeded("e1", ""))
        .await
        .unwrap();
    let seen = s.seen();
    assert_eq!(seen[0].path, "/flex/machines/node1");
    assert_eq!(seen[1].path, "/flex/machines/node1/status");
    assert!(seen.iter().all(|s| s.authorization.is_empty()), "{seen:?}");
}

/// What `start` and the bootstrap register through (`registry_for`), from a config: the real
/// controller on 127.0.0.1 in `controller` mode; and a client that cannot be built (in-cluster
/// without credentials) fails the registration only when it is required, naming why.
#[tokio::test]
async fn start_registers_through_the_configs_machine_client() {
    use aks_flex_node::flows::start::registry_for;
    let c = controller().await;
    c.store
        .insert("node1.json", &machine_json("1.35.0", "etag-3"));
    let registry = registry_for(&controller_config(&c.base)).await;
    let mut g = goal("1.35.0");
    ensure_machine(registry.as_ref(), &mut g, true)
        .await
        .unwrap();
    assert_eq!(
        g.settings_version, "etag-3",
        "adopted the registered machine"
    );

    let mut broken = controller_config(&c.base);
    broken.agent.machine_client.mode = "in-cluster".into();
    broken.agent.machine_client.endpoint_url = PROXY.into();
    let registry = registry_for(&broken).await;
    let mut g = goal("1.35.0");
    ensure_machine(registry.as_ref(), &mut g, false)
        .await
        .unwrap();
    let e = ensure_machine(registry.as_ref(), &mut g, true)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("machine client: "), "{e}");
}
