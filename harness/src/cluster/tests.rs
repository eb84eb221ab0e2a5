//! Tests of [`super`]: the engine choice, `up`'s command sequence and its reasons for having no
//! cluster, `down`, the state record, the kubelet forward and the controller's image archive,
//! over a recording fake runner and temporary directories.

use std::path::Path;

use flex_host::runner::Output;
use flex_testkit::FakeRunner;
use serde_json::json;

use super::*;

fn controller_layout(dir: &Path) -> PathBuf {
    let layout = dir.join("aks-flex-controller");
    let mut l = flex_image::Layer::new();
    l.file("/usr/local/bin/aks-flex-controller", 0o755, "#!/bin/true\n")
        .unwrap();
    let image = flex_image::Image {
        name: "aks-flex-controller:0.1.0".into(),
        config: flex_image::ImageConfig {
            architecture: "amd64".into(),
            os: "linux".into(),
            created: 1,
            ..Default::default()
        },
        layers: vec![l.build(1, 1).unwrap()],
        annotations: Default::default(),
    };
    flex_image::write_oci_layout(&layout, &[image]).unwrap();
    layout
}

/// A fake on which kind creates the cluster and every read answers as kind's would; `kc` is
/// the `kubectl --kubeconfig <path>` prefix.
fn kind_fake(kc: &str) -> FakeRunner {
    let r = FakeRunner::new();
    r.without("docker");
    r.on("kind get clusters", Output::ok(""));
    r.on(
        &format!("{kc} version"),
        Output::ok(json!({"serverVersion": {"gitVersion": "v1.34.0"}}).to_string()),
    );
    r.on(
        &format!("{kc} config view"),
        Output::ok(
            json!({"clusters": [{"cluster": {"certificate-authority-data": "Q0E="}}]}).to_string(),
        ),
    );
    r.on(
        &format!("{kc} get node aks-flex-control-plane"),
        Output::ok(
            json!({"metadata": {"uid": "cp"}, "status": {"addresses": [{"type": "InternalIP", "address": "10.89.0.2"}]}})
                .to_string(),
        ),
    );
    r.on(
        &format!("{kc} get -n kube-system configmap kube-proxy"),
        Output::ok(
            json!({"metadata": {"name": "kube-proxy", "namespace": "kube-system"},
                "data": {"kubeconfig.conf": "clusters:\n- cluster:\n    server: https://aks-flex-control-plane:6443\n"}})
            .to_string(),
        ),
    );
    r.on(
        &format!("{kc} get -n kube-system daemonset kindnet"),
        Output::ok(json!({"metadata": {"name": "kindnet"}}).to_string()),
    );
    r.on(
        "podman exec aks-flex-control-plane ip",
        Output::ok("default via 10.89.0.1 dev eth0 proto static metric 100\n"),
    );
    r
}

/// The cluster a test records.
pub(crate) fn info() -> ClusterInfo {
    ClusterInfo {
        name: "aks-flex".into(),
        provider: Provider::Kind {
            engine: Engine::Podman,
        },
        kubeconfig: "/w/cluster/kubeconfig".into(),
        api_port: 36443,
        kubernetes_version: "1.34.0".into(),
        node_name: "flex-dev-node".into(),
        settings_version: "harness-1".into(),
        token_id: "abcdef".into(),
        control_plane_ip: "10.89.0.2".into(),
        controller_image: "aks-flex-controller:0.1.0".into(),
        tunnel: Tunnel {
            socket: "/w/cluster/kubelet-forward.sock".into(),
            bind: "10.89.0.1".into(),
            port: 40250,
        },
    }
}

fn kc(work: &Path) -> String {
    format!("kubectl --kubeconfig {}/cluster/kubeconfig", work.display())
}

fn options<'a>(
    repo: &'a Path,
    work: &'a Path,
    layout: Option<&'a Path>,
    say: &'a dyn Fn(&str),
) -> Options<'a> {
    Options {
        repo,
        work,
        controller_layout: layout,
        existing: None,
        node_name: "flex-dev-node",
        api_port: 36443,
        tunnel_port: 40250,
        provider: None,
        say,
    }
}

/// Replaces the temporary directories in a transcript.
fn tidy(t: &str, tmp: &Path) -> String {
    t.replace(&tmp.display().to_string(), "/tmp")
}

#[test]
fn the_engine_is_podman_then_docker_unless_kind_is_told() {
    let r = FakeRunner::new();
    assert_eq!(Engine::choose(&r, None), Ok(Engine::Podman));
    assert_eq!(Engine::choose(&r, Some("docker")), Ok(Engine::Docker));
    r.without("podman");
    assert_eq!(Engine::choose(&r, Some("")), Ok(Engine::Docker));
    assert_eq!(
        Engine::choose(&r, Some("podman")),
        Err(MissingTool::ProviderNotOnPath(Engine::Podman))
    );
    assert_eq!(
        Engine::choose(&r, Some("podman")).map_err(|e| e.to_string()),
        Err("no podman on PATH (KIND_EXPERIMENTAL_PROVIDER)".into())
    );
    assert!(
        Engine::choose(&r, Some("nerdctl"))
            .unwrap_err()
            .to_string()
            .contains("neither podman nor docker")
    );
    r.without("docker");
    assert_eq!(Engine::choose(&r, None), Err(MissingTool::NoEngine));
    assert_eq!(
        Engine::choose(&r, None).map_err(|e| e.to_string()),
        Err("no container engine: neither podman nor docker is on PATH".into())
    );
    assert_eq!(
        Engine::Podman
            .kind(&["get", "clusters"])
            .env_list()
            .to_vec(),
        vec![(
            "KIND_EXPERIMENTAL_PROVIDER".to_string(),
            "podman".to_string()
        )]
    );
    assert!(
        Engine::Docker
            .kind(&["get", "clusters"])
            .env_list()
            .is_empty()
    );
}

#[tokio::test]
async fn up_makes_the_cluster_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = controller_layout(tmp.path());
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let work_dir = tmp.path().join("w");
    let r = kind_fake(&kc(&work_dir));
    let lines = std::sync::Mutex::new(Vec::new());
    let say = |m: &str| lines.lock().unwrap().push(m.to_string());
    let created = up(&r, &options(&repo, &work_dir, Some(&layout), &say))
        .await
        .unwrap();
    assert_eq!(created.info.kubernetes_version, "1.34.0");
    assert_eq!(created.info.control_plane_ip, "10.89.0.2");
    assert_eq!(created.info.tunnel.bind, "10.89.0.1");
    assert_eq!(created.info.controller_image, "aks-flex-controller:0.1.0");
    assert_eq!(created.join.api_server, "https://10.0.2.2:36443");
    assert_eq!(created.join.ca_cert_data, "Q0E=");
    assert_eq!(created.join.node_ip, GUEST_NODE_IP);
    let secret = created.join.token.secret().expose().to_string();
    let transcript = r.transcript();
    assert!(
        !transcript.contains(&secret),
        "the token went into an argument"
    );
    // The overlay names the base relative to itself, and the image kind loaded.
    let overlay =
        std::fs::read_to_string(work_dir.join("cluster/controller/kustomization.yaml")).unwrap();
    assert!(overlay.contains("newTag: \"0.1.0\""), "{overlay}");
    let base = overlay
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("- ")
                .filter(|p| p.ends_with("deploy/controller"))
        })
        .unwrap();
    assert!(
        work_dir
            .join("cluster/controller")
            .join(base)
            .join("kustomization.yaml")
            .is_file(),
        "{base}"
    );
    // The archive kind loads names the image as the CRI looks it up.
    let archive = std::fs::File::open(work_dir.join("cluster/aks-flex-controller.tar")).unwrap();
    let mut ar = tar::Archive::new(archive);
    let index = ar
        .entries()
        .unwrap()
        .map(|e| e.unwrap())
        .find(|e| e.path().unwrap().to_string_lossy() == "index.json")
        .map(|mut e| {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut e, &mut s).unwrap();
            s
        })
        .unwrap();
    assert!(
        index.contains("docker.io/library/aks-flex-controller:0.1.0"),
        "{index}"
    );
    insta::assert_snapshot!(
        tidy(&transcript, tmp.path()).replace(&repo.display().to_string(), "<repo>")
    );
    assert!(
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("kind create cluster aks-flex (podman, API server on port 36443)"))
    );
}

#[tokio::test]
async fn without_tools_there_is_no_cluster_and_the_reason_says_why() {
    let work = Path::new("/nonexistent/w");
    let repo = Path::new("/nonexistent/repo");
    let say = |_: &str| {};
    let r = FakeRunner::new();
    r.without("kind");
    assert_eq!(
        up(&r, &options(repo, work, None, &say))
            .await
            .unwrap_err()
            .to_string(),
        "no kind binary on PATH"
    );
    let r = FakeRunner::new();
    r.without("kubectl");
    assert_eq!(
        up(&r, &options(repo, work, None, &say))
            .await
            .unwrap_err()
            .to_string(),
        "no kubectl binary on PATH"
    );
    let r = FakeRunner::new();
    r.without("podman").without("docker");
    assert_eq!(
        up(&r, &options(repo, work, None, &say))
            .await
            .unwrap_err()
            .to_string(),
        "no container engine: neither podman nor docker is on PATH"
    );
    let r = FakeRunner::new();
    assert_eq!(
        up(&r, &options(repo, work, None, &say))
            .await
            .unwrap_err()
            .to_string(),
        "no controller image (cargo xtask up --cluster builds it)"
    );
    assert!(r.calls().is_empty(), "{:?}", r.calls());
}

#[tokio::test]
async fn a_failed_create_is_the_reason_and_what_was_made_is_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = controller_layout(tmp.path());
    let work = tmp.path().join("w");
    let r = FakeRunner::new();
    r.on(
        "kind create cluster",
        Output::failed(
            1,
            "Creating cluster \"aks-flex\" ...\n ✗ Ensuring node image (kindest/node:v1.34.0) 🖼\nERROR: failed to create cluster: failed to pull image \"kindest/node:v1.34.0\": dial tcp: lookup registry-1.docker.io: no such host\n",
        ),
    );
    r.on_seq(
        "kind get clusters",
        vec![Output::ok(""), Output::ok("aks-flex\n")],
    );
    let say = |_: &str| {};
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let reason = up(&r, &options(&repo, &work, Some(&layout), &say))
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        reason,
        "kind create cluster failed: ERROR: failed to create cluster: failed to pull image \"kindest/node:v1.34.0\": dial tcp: lookup registry-1.docker.io: no such host"
    );
    let calls = r.calls();
    assert!(
        calls
            .last()
            .unwrap()
            .starts_with("KIND_EXPERIMENTAL_PROVIDER=podman kind delete cluster --name aks-flex"),
        "{calls:?}"
    );
}

#[tokio::test]
async fn a_failed_step_names_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = controller_layout(tmp.path());
    let work = tmp.path().join("w");
    let r = kind_fake(&kc(&work));
    r.on(
        &format!("{} -n kube-system rollout status", kc(&work)),
        Output::failed(1, "Waiting for deployment \"aks-flex-controller\" rollout to finish: 0 of 1 updated replicas are available...\nerror: timed out waiting for the condition\n"),
    );
    let say = |_: &str| {};
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let reason = up(&r, &options(&repo, &work, Some(&layout), &say))
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        reason,
        "wait for the controller failed: error: timed out waiting for the condition"
    );
}

#[tokio::test]
async fn down_stops_the_forward_and_deletes_the_cluster() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path();
    std::fs::write(work.join("state.json"), r#"{"qemu_pid": 1}"#).unwrap();
    let info = info();
    record(work, &Availability::Ready(Box::new(info.clone()))).unwrap();
    std::fs::create_dir_all(work.join("cluster")).unwrap();
    let r = FakeRunner::new();
    r.on("kind get clusters", Output::ok("aks-flex\nother\n"));
    down(&r, work, None).await.unwrap();
    insta::assert_snapshot!(tidy(&r.transcript(), tmp.path()));
    assert!(!work.join("cluster").exists());

    // No record (an interrupted up): kind's own list decides.
    let r = FakeRunner::new();
    r.on("kind get clusters", Output::ok("other\n"));
    std::fs::remove_file(work.join("state.json")).unwrap();
    down(&r, work, None).await.unwrap();
    assert_eq!(
        r.calls(),
        vec!["KIND_EXPERIMENTAL_PROVIDER=podman kind get clusters"]
    );

    // An up that failed before recording may have left the forward: its socket says so.
    std::fs::create_dir_all(work.join("cluster")).unwrap();
    std::fs::write(work.join("cluster").join(TUNNEL_SOCKET), "").unwrap();
    let r = FakeRunner::new();
    r.on("kind get clusters", Output::ok(""));
    down(&r, work, None).await.unwrap();
    assert_eq!(
        tidy(&r.calls()[0], tmp.path()),
        "ssh -S /tmp/cluster/kubelet-forward.sock -O exit flexadm@127.0.0.1"
    );
    assert!(!work.join("cluster").exists());

    // Without kind there is nothing to delete.
    let r = FakeRunner::new();
    r.without("kind");
    down(&r, work, None).await.unwrap();
    assert!(r.calls().is_empty());

    // A delete that fails is an error: down must not leave a cluster silently.
    let r = FakeRunner::new();
    r.on("kind get clusters", Output::ok("aks-flex\n"));
    r.on(
        "kind delete",
        Output::failed(1, "ERROR: podman: permission denied"),
    );
    let e = down(&r, work, None).await.unwrap_err().to_string();
    assert!(e.starts_with("delete the kind cluster aks-flex: "), "{e}");

    // An existing cluster's up that failed before recording may have left its controller.
    std::fs::create_dir_all(work.join("cluster")).unwrap();
    std::fs::write(work.join("cluster/controller.pid"), "1\n").unwrap();
    let r = FakeRunner::new();
    r.without("kind");
    down(&r, work, None).await.unwrap();
    assert_eq!(
        r.calls()
            .iter()
            .map(|c| tidy(c, tmp.path()))
            .collect::<Vec<_>>(),
        vec![
            "start-stop-daemon --stop --retry TERM/10/KILL/5 --remove-pidfile --pidfile /tmp/cluster/controller.pid"
        ]
    );
}

#[test]
fn the_record_sits_beside_the_vms_state() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path();
    assert_eq!(
        load(work).unwrap(),
        Availability::unavailable(NOT_REQUESTED)
    );
    std::fs::write(
        work.join("state.json"),
        r#"{"qemu_pid": 42, "accel": "tcg"}"#,
    )
    .unwrap();
    assert_eq!(
        load(work).unwrap(),
        Availability::unavailable(NOT_REQUESTED)
    );
    assert_eq!(
        skip_reason(work),
        "no cluster (not requested: up --cluster)"
    );
    let none = Availability::unavailable("no kind binary on PATH");
    record(work, &none).unwrap();
    assert_eq!(load(work).unwrap(), none);
    assert_eq!(none.skip_reason(), "no cluster (no kind binary on PATH)");
    assert_eq!(skip_reason(work), "no cluster (no kind binary on PATH)");
    let ready = Availability::Ready(Box::new(info()));
    record(work, &ready).unwrap();
    assert_eq!(load(work).unwrap(), ready);
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(work.join("state.json")).unwrap()).unwrap();
    assert_eq!(v["qemu_pid"], 42, "the VM's fields stay");
    assert_eq!(v["cluster"]["status"], "ready");
    assert_eq!(v["cluster"]["kubeconfig"], "/w/cluster/kubeconfig");
}

#[test]
fn the_kubelet_forward() {
    let ssh = Ssh {
        port: 2222,
        key: "/w/id".into(),
    };
    let t = Tunnel {
        socket: "/w/cluster/kubelet-forward.sock".into(),
        bind: "10.89.0.1".into(),
        port: 40250,
    };
    insta::assert_snapshot!(tunnel_cmd(&ssh, &t).display_argv());
    assert_eq!(
        dnat_rule("-I", "10.89.0.1", 40250).join(" "),
        "iptables -t nat -I OUTPUT 1 -p tcp -d 10.0.2.15 --dport 10250 -j DNAT --to-destination 10.89.0.1:40250"
    );
}

#[tokio::test]
async fn the_forward_is_started_only_when_it_is_not_running() {
    let ssh = Ssh {
        port: 2222,
        key: "/w/id".into(),
    };
    let t = Tunnel {
        socket: "/nonexistent/kubelet-forward.sock".into(),
        bind: "10.89.0.1".into(),
        port: 40250,
    };
    let r = FakeRunner::new();
    assert!(!ensure_tunnel(&r, &ssh, &t).await.unwrap());
    assert_eq!(r.calls().len(), 1);
    let r = FakeRunner::new();
    r.on(
        "ssh -S",
        Output::failed(255, "Control socket connect: No such file or directory"),
    );
    assert!(ensure_tunnel(&r, &ssh, &t).await.unwrap());
    assert!(r.calls()[1].contains("-L 10.89.0.1:40250:127.0.0.1:10250"));
    r.on(
        "ssh -i",
        Output::failed(255, "bind [10.89.0.1]:40250: Address already in use"),
    );
    let e = ensure_tunnel(&r, &ssh, &t).await.unwrap_err().to_string();
    assert!(
        e.starts_with("the kubelet forward (10.89.0.1:40250): "),
        "{e}"
    );
}

#[test]
fn summaries_pick_the_error_line() {
    assert_eq!(
        summary(
            "kubectl apply -k x failed: exit status 1: # warning\nerror: accumulating resources: x\n"
        ),
        "error: accumulating resources: x"
    );
    assert_eq!(summary("plain\nsecond"), "plain");
    assert_eq!(
        summary(
            "kubectl --kubeconfig /k version failed: exit status 1: The connection to the server 10.99.0.2:6443 was refused\n"
        ),
        "The connection to the server 10.99.0.2:6443 was refused"
    );
    assert_eq!(summary(""), "");
}

// --- the existing-cluster provider ---

#[test]
fn route_sources() {
    assert_eq!(
        parse::route_source("10.99.0.2 dev veth-k8s src 10.99.0.1 uid 0 \n    cache \n"),
        Some("10.99.0.1".into())
    );
    assert_eq!(
        parse::route_source("local 127.0.0.1 dev lo table local"),
        None
    );
    assert_eq!(parse::route_source("x src notanaddress"), None);
}

#[test]
fn the_guest_reaches_a_loopback_api_server_at_the_hosts_address() {
    for (server, want) in [
        ("https://127.0.0.1:6443", "https://10.0.2.2:6443"),
        ("https://localhost:6443/", "https://10.0.2.2:6443"),
        ("https://[::1]:7443", "https://10.0.2.2:7443"),
        ("https://127.0.0.1", "https://10.0.2.2:443"),
        ("https://10.99.0.2:6443", "https://10.99.0.2:6443"),
        ("https://api.example.test", "https://api.example.test:443"),
    ] {
        assert_eq!(existing::guest_server(server).unwrap(), want, "{server}");
    }
    for (bad, why) in [
        ("http://127.0.0.1:8080", "is not https"),
        ("127.0.0.1:6443", "is not a URL"),
        ("", "is not a URL"),
    ] {
        let e = existing::guest_server(bad).unwrap_err().to_string();
        assert!(e.contains(why), "{bad:?}: {e}");
    }
}

/// A real HTTP server on 127.0.0.1 that answers every request `200 ok` (the local
/// controller's `/readyz`, as the harness waits for it); returns its port.
async fn ready_server() -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = [0u8; 512];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
                .await;
        }
    });
    port
}

/// A fake on which the kubeconfig names a loopback API server that answers.
fn existing_fake(kc: &str) -> FakeRunner {
    let r = FakeRunner::new();
    r.on(
        "kubectl --kubeconfig /given/kubeconfig config view",
        Output::ok(
            json!({"clusters": [{"cluster": {"server": "https://127.0.0.1:6443", "certificate-authority-data": "Q0E="}}]})
                .to_string(),
        ),
    );
    r.on(
        &format!("{kc} version"),
        Output::ok(json!({"serverVersion": {"gitVersion": "v1.36.2"}}).to_string()),
    );
    r.on(
        &format!("{kc} -n kube-system get service kube-dns"),
        Output::ok("10.0.0.10"),
    );
    r
}

fn existing_request() -> existing::ExistingRequest {
    existing::ExistingRequest {
        kubeconfig: "/given/kubeconfig".into(),
        controller_binary: "/build/aks-flex-controller".into(),
    }
}

/// `up` against an existing cluster, over the recording fake runner (kubectl and
/// start-stop-daemon faked) with a real HTTP server standing in for the local controller's
/// `/readyz`.
#[tokio::test]
async fn up_joins_an_existing_cluster_with_a_local_controller() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("w");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let r = existing_fake(&kc(&work));
    let port = ready_server().await;
    let req = existing_request();
    let say = |_: &str| {};
    let mut o = options(&repo, &work, None, &say);
    o.existing = Some(&req);
    o.api_port = port;
    let created = up(&r, &o).await.unwrap();
    assert_eq!(created.join.api_server, "https://10.0.2.2:6443");
    assert_eq!(created.join.ca_cert_data, "Q0E=");
    assert_eq!(created.join.kubernetes_version, "1.36.2");
    assert_eq!(created.join.dns_service_ip, "10.0.0.10");
    assert_eq!(
        created.join.machine_endpoint.as_deref(),
        Some(format!("http://10.0.2.2:{port}").as_str())
    );
    assert_eq!(created.info.name, "existing");
    assert!(matches!(
        created.info.provider,
        Provider::Existing { ref controller } if controller.port == port
    ));
    assert_eq!(created.info.tunnel.bind, "127.0.0.1");
    // The copy of the kubeconfig holds credentials: root only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(work.join("cluster/kubeconfig"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let transcript = r.transcript();
    assert!(!transcript.contains(created.join.token.secret().expose()));
    assert!(
        !transcript.contains("kind "),
        "no kind for an existing cluster"
    );
    assert!(
        !transcript.contains("deployment.yaml") && !transcript.contains("rollout"),
        "the controller runs locally, not as the Deployment"
    );
    insta::assert_snapshot!(
        tidy(&transcript, tmp.path())
            .replace(&repo.display().to_string(), "<repo>")
            .replace(&port.to_string(), "<port>")
    );
}

#[tokio::test]
async fn an_existing_cluster_that_cannot_be_used_is_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("w");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let req = existing_request();
    let say = |_: &str| {};
    let mut o = options(&repo, &work, None, &say);
    o.existing = Some(&req);

    let r = FakeRunner::new();
    r.without("kubectl");
    assert_eq!(
        up(&r, &o).await.unwrap_err(),
        NoCluster::Tools(MissingTool::Binary("kubectl"))
    );
    assert_eq!(
        up(&r, &o).await.unwrap_err().to_string(),
        "no kubectl binary on PATH"
    );

    // A kubeconfig that does not parse: kubectl says why; nothing is left running.
    let r = FakeRunner::new();
    r.on(
        "kubectl --kubeconfig /given/kubeconfig config view",
        Output::failed(
            1,
            "error: error loading config file \"/given/kubeconfig\": yaml: line 3: mapping values are not allowed in this context\n",
        ),
    );
    let reason = up(&r, &o).await.unwrap_err().to_string();
    assert_eq!(
        reason,
        "read the kubeconfig failed: error: error loading config file \"/given/kubeconfig\": yaml: line 3: mapping values are not allowed in this context"
    );
    assert!(
        r.calls()
            .last()
            .unwrap()
            .starts_with("start-stop-daemon --stop")
    );

    // An API server that does not answer.
    let r = existing_fake(&kc(&work));
    r.on(
        &format!("{} version", kc(&work)),
        Output::failed(1, "The connection to the server 127.0.0.1:6443 was refused - did you specify the right host or port?\n"),
    );
    let reason = up(&r, &o).await.unwrap_err().to_string();
    assert_eq!(
        reason,
        "reach the API server failed: The connection to the server 127.0.0.1:6443 was refused - did you specify the right host or port?"
    );

    // A cluster without the CRDs' API group, or RBAC that refuses: the apply says which.
    let r = existing_fake(&kc(&work));
    r.on(
        &format!("{} apply --server-side", kc(&work)),
        Output::failed(1, "Error from server (Forbidden): customresourcedefinitions.apiextensions.k8s.io is forbidden: User \"dev\" cannot patch resource\n"),
    );
    let reason = up(&r, &o).await.unwrap_err().to_string();
    assert!(
        reason.starts_with("apply deploy/crds failed: Error from server (Forbidden)"),
        "{reason}"
    );

    // A controller that never answers (nothing listens on its port): the wait names what it
    // saw last and the controller's log.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tmp.path().join("ctl");
    std::fs::create_dir_all(&dir).unwrap();
    let c = existing::LocalController::at(&dir, free);
    std::fs::write(&c.log, "error: no Kubernetes config\n").unwrap();
    let e = existing::wait_ready(&c, std::time::Duration::from_millis(300))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("the local controller to answer /readyz"), "{e}");
    assert!(e.contains("Connection refused"), "{e}");
    assert!(
        e.ends_with("its log:\nerror: no Kubernetes config\n"),
        "{e}"
    );
}

#[tokio::test]
async fn down_for_an_existing_cluster_stops_the_controller_and_deletes_the_token() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path();
    std::fs::write(work.join("state.json"), r#"{"qemu_pid": 1}"#).unwrap();
    std::fs::create_dir_all(work.join("cluster")).unwrap();
    std::fs::write(work.join("cluster/kubeconfig"), "{}").unwrap();
    let mut info = info();
    info.name = "existing".into();
    info.kubeconfig = work.join("cluster/kubeconfig");
    info.provider = Provider::Existing {
        controller: existing::LocalController::at(&work.join("cluster"), 18080),
    };
    record(work, &Availability::Ready(Box::new(info))).unwrap();
    let r = FakeRunner::new();
    down(&r, work, None).await.unwrap();
    let calls: Vec<String> = r.calls().iter().map(|c| tidy(c, tmp.path())).collect();
    assert_eq!(
        calls,
        vec![
            "ssh -S /w/cluster/kubelet-forward.sock -O exit flexadm@127.0.0.1",
            "start-stop-daemon --stop --retry TERM/10/KILL/5 --remove-pidfile --pidfile /tmp/cluster/controller.pid",
            "kubectl --kubeconfig /tmp/cluster/kubeconfig -n kube-system delete secret bootstrap-token-abcdef --ignore-not-found",
        ]
    );
    assert!(!work.join("cluster").exists());
}

/// The bridge CNI DaemonSet's script, run for real by `sh` (through the harness's runner)
/// against a temporary directory in place of the node's `/etc/cni/net.d`, its idle loop cut
/// short: it writes the network list (valid JSON, the bridge `cni0`) and leaves a node's own
/// network config alone.
#[tokio::test]
async fn the_bridge_cni_script_writes_a_network_unless_there_is_one() {
    let ds: serde_json::Value =
        serde_json::from_str(&render::bridge_cni_daemonset("flex-dev-node")).unwrap();
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"], true, "it runs before any pod network");
    assert_eq!(
        spec["nodeSelector"]["kubernetes.io/hostname"],
        "flex-dev-node"
    );
    let script = spec["containers"][0]["command"][2].as_str().unwrap();
    let idle = "while true; do sleep 1; done";
    assert!(script.ends_with(idle), "{script}");
    assert!(script.starts_with("trap 'exit 0' TERM INT;"), "{script}");
    let r = flex_host::runner::ProcessRunner::new();
    for own in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let netd = d.path().join("etc/cni/net.d");
        std::fs::create_dir_all(&netd).unwrap();
        if own {
            std::fs::write(netd.join("05-own.conflist"), "{}").unwrap();
        }
        let once = script
            .replace("/host", &d.path().display().to_string())
            .replace(idle, "true");
        r.run(&Cmd::new("sh").arg("-c").arg(once)).await.unwrap();
        let written = netd.join("10-aks-flex-harness.conflist");
        if own {
            assert!(!written.exists(), "a node's own network stays alone");
        } else {
            let v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&written).unwrap()).unwrap();
            assert_eq!(v["plugins"][0]["bridge"], "cni0");
            assert_eq!(
                v["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
                render::BRIDGE_SUBNET
            );
            assert!(!netd.join(".10-aks-flex-harness.tmp").exists());
        }
    }
}
