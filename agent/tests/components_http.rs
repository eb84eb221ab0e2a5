//! `components::install_components` end to end: a REAL HTTP/1.1 server on 127.0.0.1 (written
//! here on a tokio `TcpListener`, counting every request) serves artifacts built by the tests —
//! `#!/bin/sh` kubelet/kubectl/kube-proxy with their `.sha256`, crictl and containerd tarballs,
//! a runc script, a CNI tgz — and the REAL `ProcessRunner` executes the installed scripts for
//! the `--version` skip probes. Files go into a `HostFs` rooted in a temporary directory.
//! Faked: only systemd and host facts (`FakeSystemd`, `FakeHostInfo`), which these flows never
//! touch.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aks_flex_node::config::{Config, OfflineArtifacts};
use aks_flex_node::machine::components::{
    CHECK_CNI, CHECK_CRI, CHECK_KUBERNETES, Component, ComponentPlan, ComponentsError, Downloads,
    Failure, InstallReport, Outcome, STAGING_PREFIX, Step, check_reachable_with,
    install_components,
};
use aks_flex_node::machine::seams::ProbeError;
use flex_host::context::Host;
use flex_host::fs::HostFs;
use flex_host::retry::Backoff;
use flex_host::runner::ProcessRunner;
use flex_testkit::{FakeHostInfo, FakeSystemd};
use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ROOTFS: &str = "/var/lib/machines/kube1";

// --- the HTTP server ---------------------------------------------------------------------------

#[derive(Clone)]
struct Reply {
    status: u16,
    body: Vec<u8>,
}

fn ok(body: impl Into<Vec<u8>>) -> Reply {
    Reply {
        status: 200,
        body: body.into(),
    }
}

fn status(code: u16) -> Reply {
    Reply {
        status: code,
        body: format!("status {code}\n").into_bytes(),
    }
}

#[derive(Default)]
struct ServerState {
    /// Path → replies in turn (the last one repeats). Unknown paths get 404.
    routes: HashMap<String, VecDeque<Reply>>,
    /// Every request as `METHOD /path`.
    log: Vec<String>,
    /// Answer every HEAD with 405 (a mirror that refuses HEAD).
    refuse_head: bool,
}

/// A minimal HTTP/1.1 server: one request per connection, `Connection: close`.
struct Server {
    addr: SocketAddr,
    state: Arc<Mutex<ServerState>>,
}

impl Server {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(ServerState::default()));
        let st = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(serve(sock, st.clone()));
            }
        });
        Self { addr, state }
    }

    fn route(&self, path: &str, replies: Vec<Reply>) {
        self.state
            .lock()
            .unwrap()
            .routes
            .insert(path.to_string(), replies.into());
    }

    fn unroute(&self, path: &str) {
        self.state.lock().unwrap().routes.remove(path);
    }

    fn refuse_head(&self) {
        self.state.lock().unwrap().refuse_head = true;
    }

    fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().log.clone()
    }

    fn count(&self, path: &str) -> usize {
        self.requests()
            .iter()
            .filter(|l| l.split_once(' ').is_some_and(|(_, p)| p == path))
            .count()
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

async fn serve(mut sock: tokio::net::TcpStream, state: Arc<Mutex<ServerState>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match sock.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf).to_string();
    let mut parts = head.lines().next().unwrap_or_default().split(' ');
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let reply = {
        let mut st = state.lock().unwrap();
        st.log.push(format!("{method} {path}"));
        if method == "HEAD" && st.refuse_head {
            status(405)
        } else {
            match st.routes.get_mut(&path) {
                Some(q) if q.len() > 1 => q.pop_front().unwrap(),
                Some(q) => q.front().cloned().unwrap_or_else(|| status(404)),
                None => status(404),
            }
        }
    };
    let ranged = reply.status == 200
        && method == "GET"
        && head.to_ascii_lowercase().contains("\r\nrange: bytes=0-0");
    let (code, body) = if ranged {
        (206, reply.body[..reply.body.len().min(1)].to_vec())
    } else {
        (reply.status, reply.body)
    };
    let reason = match code {
        200 => "OK",
        206 => "Partial Content",
        404 => "Not Found",
        405 => "Method Not Allowed",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        _ => "Status",
    };
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        out.extend_from_slice(&body);
    }
    let _ = sock.write_all(&out).await;
    let _ = sock.shutdown().await;
}

// --- artifacts ---------------------------------------------------------------------------------

fn script(lines: &str) -> Vec<u8> {
    format!("#!/bin/sh\n{lines}\n").into_bytes()
}

fn sha(b: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(b))
}

enum Member<'a> {
    File(&'a str, &'a [u8]),
    Dir(&'a str),
}

fn tgz(members: &[Member<'_>]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for m in members {
        let mut h = tar::Header::new_gnu();
        match m {
            Member::File(name, data) => {
                h.set_size(data.len() as u64);
                h.set_mode(0o755);
                h.set_entry_type(tar::EntryType::Regular);
                // Written raw so that names such as `../x` reach the archive unchanged.
                let bytes = name.as_bytes();
                h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
                h.set_cksum();
                b.append(&h, *data).unwrap();
            }
            Member::Dir(name) => {
                h.set_size(0);
                h.set_mode(0o755);
                h.set_entry_type(tar::EntryType::Directory);
                b.append_data(&mut h, name, &[][..]).unwrap();
            }
        }
    }
    b.into_inner().unwrap().finish().unwrap()
}

struct Artifacts {
    kube: Vec<(&'static str, Vec<u8>)>,
    crictl: Vec<u8>,
    containerd: Vec<u8>,
    runc: Vec<u8>,
    cni: Vec<u8>,
}

fn artifacts() -> Artifacts {
    let kube = vec![
        ("kubelet", script("echo \"Kubernetes v1.35.0\"")),
        (
            "kubectl",
            script("# kubectl\necho \"Client Version: v1.35.0\""),
        ),
        (
            "kube-proxy",
            script("# kube-proxy\necho \"Kubernetes v1.35.0\""),
        ),
    ];
    let crictl = tgz(&[Member::File(
        "crictl",
        &script("echo \"crictl version v1.35.0\""),
    )]);
    let containerd = tgz(&[
        Member::Dir("bin/"),
        Member::File(
            "bin/containerd",
            &script("echo \"containerd github.com/containerd/containerd/v2 v2.1.8 0123abc\""),
        ),
        Member::File("bin/ctr", &script("echo ctr")),
        Member::File("bin/containerd-shim-runc-v2", &script("echo shim")),
        Member::File("bin/containerd-stress", &script("echo stress")),
        Member::File("etc/not-a-binary", b"x"),
    ]);
    let runc = script("echo \"runc version 1.5.0\"\necho \"spec: 1.2.1\"");
    let cni = tgz(&[
        Member::Dir("./"),
        Member::File("./bridge", &script("echo bridge")),
        Member::File("./host-local", &script("echo host-local")),
        Member::File("./loopback", &script("echo \"CNI loopback plugin v1.5.1\"")),
        Member::File("./README.md", b"readme"),
    ]);
    Artifacts {
        kube,
        crictl,
        containerd,
        runc,
        cni,
    }
}

const K8S: &str = "/k8s/v1.35.0/bin/linux/amd64";
const CRICTL: &str = "/cri-tools/v1.35.0/crictl-v1.35.0-linux-amd64.tar.gz";
const CONTAINERD: &str = "/containerd/v2.1.8/containerd-2.1.8-linux-amd64.tar.gz";
const RUNC: &str = "/runc/v1.5.0/runc.amd64";
const CNI: &str = "/cni/v1.5.1/cni-plugins-linux-amd64-v1.5.1.tgz";

fn serve_all(server: &Server, a: &Artifacts) {
    for (bin, body) in &a.kube {
        server.route(&format!("{K8S}/{bin}"), vec![ok(body.clone())]);
        server.route(
            &format!("{K8S}/{bin}.sha256"),
            vec![ok(format!("{}  {bin}\n", sha(body)))],
        );
    }
    server.route(CRICTL, vec![ok(a.crictl.clone())]);
    server.route(CONTAINERD, vec![ok(a.containerd.clone())]);
    server.route(RUNC, vec![ok(a.runc.clone())]);
    server.route(CNI, vec![ok(a.cni.clone())]);
}

// --- host, config, plan ------------------------------------------------------------------------

/// Real processes and files under `root`; systemd and host facts are fakes (unused here).
fn real_host(root: &Path) -> Host {
    Host {
        runner: Arc::new(ProcessRunner::new()),
        fs: HostFs::new(root),
        systemd: Arc::new(FakeSystemd::new()),
        info: Arc::new(FakeHostInfo::default()),
    }
}

fn config() -> Config {
    let mut c = Config::default();
    c.components.kubernetes = "v1.35.0".into();
    c
}

fn fast_retry() -> Backoff {
    Backoff::new(4, Duration::from_millis(10), Duration::from_millis(40))
}

fn plan_for(server: &Server) -> ComponentPlan {
    let mut d = Downloads::default();
    d.kubernetes.base_url = server.url("/k8s/");
    d.crictl.base_url = server.url("/cri-tools");
    d.containerd.base_url = server.url("/containerd");
    d.runc.base_url = server.url("/runc");
    d.cni.base_url = server.url("/cni");
    let mut plan = ComponentPlan::resolve(&config(), "amd64", d).unwrap();
    plan.retry = fast_retry();
    plan
}

fn http() -> reqwest::Client {
    flex_host::http::client().unwrap()
}

async fn install(host: &Host, plan: &ComponentPlan) -> Result<InstallReport, ComponentsError> {
    // The machine image would have been unpacked here first.
    std::fs::create_dir_all(host.fs.path(Path::new(ROOTFS))).unwrap();
    let registry = flex_oci::RegistryClient::new(http());
    install_components(host, &http(), &registry, Path::new(ROOTFS), plan).await
}

fn real(host: &Host, rel: &str) -> PathBuf {
    host.fs.path(&Path::new(ROOTFS).join(rel))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// Every file of the rootfs, relative, sorted.
fn files(host: &Host) -> Vec<String> {
    let root = host.fs.path(Path::new(ROOTFS));
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(&root).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

fn assert_everything_installed(host: &Host, a: &Artifacts) {
    for (bin, body) in &a.kube {
        let p = real(host, &format!("usr/local/bin/{bin}"));
        assert_eq!(&std::fs::read(&p).unwrap(), body, "{bin}");
        assert_eq!(mode(&p), 0o755, "{bin}");
    }
    assert_eq!(
        std::fs::read(real(host, "usr/local/bin/runc")).unwrap(),
        a.runc
    );
    for rel in [
        "usr/local/bin/crictl",
        "usr/local/bin/containerd",
        "usr/local/bin/ctr",
        "usr/local/bin/containerd-shim-runc-v2",
        "usr/local/bin/containerd-stress",
        "usr/local/bin/runc",
        "opt/cni/bin/bridge",
        "opt/cni/bin/host-local",
        "opt/cni/bin/loopback",
        "opt/cni/bin/README.md",
    ] {
        assert_eq!(mode(&real(host, rel)), 0o755, "{rel}");
    }
    assert_eq!(mode(&real(host, "opt/cni/bin")), 0o755);
    assert!(
        std::fs::read_to_string(real(host, "usr/local/bin/crictl"))
            .unwrap()
            .contains("crictl version v1.35.0")
    );
}

// --- tests -------------------------------------------------------------------------------------

#[tokio::test]
async fn real_http_real_processes_install_everything_then_second_run_downloads_nothing() {
    let server = Server::start().await;
    let a = artifacts();
    serve_all(&server, &a);
    let tmp = tempfile::tempdir().unwrap();
    let host = real_host(tmp.path());
    let plan = plan_for(&server);

    let report = install(&host, &plan).await.unwrap();
    assert!(
        report
            .components
            .iter()
            .all(|c| matches!(c.outcome, Outcome::Installed { .. })),
        "{report:?}"
    );
    assert_everything_installed(&host, &a);
    assert_eq!(
        files(&host),
        vec![
            "opt/cni/bin/README.md",
            "opt/cni/bin/bridge",
            "opt/cni/bin/host-local",
            "opt/cni/bin/loopback",
            "usr/local/bin/containerd",
            "usr/local/bin/containerd-shim-runc-v2",
            "usr/local/bin/containerd-stress",
            "usr/local/bin/crictl",
            "usr/local/bin/ctr",
            "usr/local/bin/kube-proxy",
            "usr/local/bin/kubectl",
            "usr/local/bin/kubelet",
            "usr/local/bin/runc",
        ],
        "only bin/ members of containerd, no staging left behind"
    );
    let first = server.requests().len();
    assert_eq!(first, 10, "{:?}", server.requests());

    // The probes really run the installed scripts: everything is already there.
    let again = install(&host, &plan).await.unwrap();
    assert!(again.all_already_installed(), "{again:?}");
    assert_eq!(
        server.requests().len(),
        first,
        "no request on the second run"
    );
}

#[tokio::test]
async fn real_http_real_processes_newer_version_is_reinstalled() {
    let server = Server::start().await;
    let a = artifacts();
    serve_all(&server, &a);
    let tmp = tempfile::tempdir().unwrap();
    let host = real_host(tmp.path());
    install(&host, &plan_for(&server)).await.unwrap();
    // An old runc is in place: its real probe says 1.4.0.
    let old = script("echo \"runc version 1.4.0\"");
    std::fs::write(real(&host, "usr/local/bin/runc"), &old).unwrap();
    let before = server.requests().len();
    let report = install(&host, &plan_for(&server)).await.unwrap();
    assert!(matches!(
        report.get(Component::Runc).unwrap().outcome,
        Outcome::Installed { .. }
    ));
    assert_eq!(
        report
            .components
            .iter()
            .filter(|c| c.outcome == Outcome::AlreadyInstalled)
            .count(),
        4
    );
    assert_eq!(server.requests().len(), before + 1);
    assert_eq!(
        std::fs::read(real(&host, "usr/local/bin/runc")).unwrap(),
        a.runc
    );
}

#[tokio::test]
async fn real_http_checksum_mismatch_is_an_error_and_installs_no_kubernetes_binary() {
    let server = Server::start().await;
    let a = artifacts();
    serve_all(&server, &a);
    let wrong = sha(b"something else");
    server.route(
        &format!("{K8S}/kube-proxy.sha256"),
        vec![ok(format!("{wrong}  kube-proxy\n"))],
    );
    let tmp = tempfile::tempdir().unwrap();
    let host = real_host(tmp.path());
    let err = install(&host, &plan_for(&server)).await.unwrap_err();
    let failures = err.failures();
    assert_eq!(failures.len(), 1, "{err}");
    let f = &failures[0];
    assert_eq!((f.component, f.step), (Component::Kubernetes, Step::Verify));
    let actual = sha(&a.kube[2].1);
    match &f.failure {
        Failure::ChecksumMismatch {
            binary,
            expected,
            actual: got,
        } => {
            assert_eq!(binary, "kube-proxy");
            assert_eq!(expected, &wrong);
            assert_eq!(got, &actual);
        }
        other => panic!("{other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&format!(
            "SHA-256 mismatch for kube-proxy: expected {wrong}, got {actual}"
        )),
        "{msg}"
    );
    // No Kubernetes binary was written (all are verified before any is installed); the other
    // components were.
    for bin in ["kubelet", "kubectl", "kube-proxy"] {
        assert!(
            !real(&host, &format!("usr/local/bin/{bin}")).exists(),
            "{bin}"
        );
    }
    assert!(real(&host, "usr/local/bin/runc").exists());
    assert!(
        !files(&host)
            .iter()
            .any(|f| f.contains(STAGING_PREFIX) || f.contains(".tmp-"))
    );
}

#[tokio::test]
async fn real_http_500_then_429_then_200_is_retried() {
    let server = Server::start().await;
    let a = artifacts();
    serve_all(&server, &a);
    server.route(RUNC, vec![status(500), status(429), ok(a.runc.clone())]);
    server.route(
        &format!("{K8S}/kubelet.sha256"),
        vec![status(503), ok(format!("{}  kubelet\n", sha(&a.kube[0].1)))],
    );
    let tmp = tempfile::tempdir().unwrap();
    let host = real_host(tmp.path());
    install(&host, &plan_for(&server)).await.unwrap();
    assert_eq!(server.count(RUNC), 3);
    assert_eq!(server.count(&format!("{K8S}/kubelet.sha256")), 2);
    assert_everything_installed(&host, &a);
}

#[tokio::test]
async fn real_http_persistent_500_gives_up_after_three_retries() {
    let server = Server::start().await;
    let a = artifacts();
    serve_all(&server, &a);
    server.route(RUNC, vec![status(500)]);
    let tmp = tempfile::tempdir().unwrap();
    let host = real_host(tmp.path());
    let err = install(&host, &plan_for(&server)).await.unwrap_err();
    assert_eq!(server.count(RUNC), 4, "1 attempt + 3 retries");
    assert_eq!(err.failures().len(), 1);
    assert_eq!(err.failures()[0].failure.status(), Some(500));
}

#[tokio::test]
async fn real_http_404_fails_naming_the_component_without_retrying() {
    let server = Server::start().await;
    let a = artifacts();
    serve_all(&server, &a);
    server.unroute(CNI);
    let tmp = tempfile::tempdir().unwrap();
    let host = real_host(tmp.path());
    let err = install(&host, &plan_for(&server)).await.unwrap_err();
    assert_eq!(err.failures().len(), 1, "{err}");
    assert_eq!(err.failures()[0].component, Component::Cni);
    assert_eq!(
        err.to_string(),
        format!(
            "installing node components failed: cni-plugins: download {}: HTTP status 404",
            server.url(CNI)
        )
    );
    assert_eq!(server.count(CNI), 1);
    // The other components are installed.
    assert!(real(&host, "usr/local/bin/kubelet").exists());
    assert!(!real(&host, "opt/cni/bin").exists());
}

#[tokio::test]
async fn real_http_every_failure_is_reported() {
    let server = Server::start().await;
    let a = artifacts();
    serve_all(&server, &a);
    server.unroute(CNI);
    server.unroute(CRICTL);
    server.unroute(&format!("{K8S}/kubectl"));
    let tmp = tempfile::tempdir().unwrap();
    let host = real_host(tmp.path());
    let err = install(&host, &plan_for(&server)).await.unwrap_err();
    let failed: Vec<_> = err.failures().iter().map(|f| f.component).collect();
    assert_eq!(
        failed,
        vec![Component::Kubernetes, Component::Crictl, Component::Cni],
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("3 node component steps failed: "),
        "{err}"
    );
}

#[tokio::test]
async fn real_http_tar_with_dotdot_member_is_refused_and_nothing_of_it_installed() {
    let server = Server::start().await;
    let a = artifacts();
    serve_all(&server, &a);
    let evil = tgz(&[
        Member::File("bin/containerd", &script("echo containerd 2.1.8")),
        Member::File("bin/../../x", b"escape"),
    ]);
    server.route(CONTAINERD, vec![ok(evil)]);
    let tmp = tempfile::tempdir().unwrap();
    let host = real_host(tmp.path());
    let err = install(&host, &plan_for(&server)).await.unwrap_err();
    assert_eq!(err.failures().len(), 1, "{err}");
    let f = &err.failures()[0];
    assert_eq!(
        (f.component, f.step),
        (Component::Containerd, Step::Extract)
    );
    assert!(err.to_string().contains("contains '..'"), "{err}");
    assert!(!real(&host, "usr/local/bin/containerd").exists());
    assert!(!tmp.path().join("var/lib/machines/x").exists());
    assert!(!real(&host, "x").exists());
}

/// Builds a bundle directory at `dir` (a real path) with upstream asset names.
fn write_bundle(dir: &Path, a: &Artifacts) {
    std::fs::create_dir_all(dir.join("kubernetes")).unwrap();
    for (bin, body) in &a.kube {
        std::fs::write(dir.join("kubernetes").join(bin), body).unwrap();
        std::fs::write(
            dir.join("kubernetes").join(format!("{bin}.sha256")),
            format!("{}  {bin}\n", sha(body)),
        )
        .unwrap();
    }
    std::fs::write(dir.join("crictl-v1.35.0-linux-amd64.tar.gz"), &a.crictl).unwrap();
    std::fs::write(
        dir.join("containerd-2.1.8-linux-amd64.tar.gz"),
        &a.containerd,
    )
    .unwrap();
    std::fs::write(dir.join("runc.amd64"), &a.runc).unwrap();
    std::fs::write(dir.join("cni-plugins-linux-amd64-v1.5.1.tgz"), &a.cni).unwrap();
}

fn offline_plan(source: &str) -> ComponentPlan {
    let mut c = config();
    c.bootstrap.offline_artifacts = Some(OfflineArtifacts {
        source: source.into(),
    });
    ComponentPlan::resolve(&c, "amd64", Downloads::default()).unwrap()
}

#[tokio::test]
async fn offline_directory_real_processes_zero_http_requests() {
    let server = Server::start().await;
    let a = artifacts();
    serve_all(&server, &a);
    let tmp = tempfile::tempdir().unwrap();
    let host = real_host(tmp.path());
    write_bundle(&tmp.path().join("srv/bundles/v1.35.0"), &a);
    let plan = offline_plan("/srv/bundles/{{ .KubernetesVersion }}");

    let report = install(&host, &plan).await.unwrap();
    assert_eq!(
        report
            .get(Component::Containerd)
            .unwrap()
            .version
            .as_deref(),
        Some("2.1.8")
    );
    assert_everything_installed(&host, &a);
    let again = install(&host, &plan).await.unwrap();
    assert!(again.all_already_installed(), "{again:?}");
    assert!(server.requests().is_empty(), "{:?}", server.requests());
    // The preflight check lists the bundle.
    let checks = check_reachable_with(&host.fs, &NoRegistry, &http(), &plan).await;
    assert!(checks.iter().all(|(_, r)| r.is_ok()), "{checks:?}");
}

#[tokio::test]
async fn offline_unbounded_builder_layout_real_processes_zero_http_requests() {
    // `<component>/v<version>/<asset>`, as unbounded's agent-artifacts-builder lays bundles out.
    let server = Server::start().await;
    let a = artifacts();
    let tmp = tempfile::tempdir().unwrap();
    let host = real_host(tmp.path());
    let b = tmp.path().join("bundle");
    let put = |rel: &str, data: &[u8]| {
        let p = b.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    };
    put("manifest.json", b"{}");
    for (bin, body) in &a.kube {
        put(&format!("kubernetes/v1.35.0/bin/linux/amd64/{bin}"), body);
        put(
            &format!("kubernetes/v1.35.0/bin/linux/amd64/{bin}.sha256"),
            sha(body).as_bytes(),
        );
    }
    put(
        "crictl/v1.35.0/crictl-v1.35.0-linux-amd64.tar.gz",
        &a.crictl,
    );
    put(
        "containerd/v2.1.8/containerd-2.1.8-linux-amd64.tar.gz",
        &a.containerd,
    );
    put("runc/v1.5.0/runc.amd64", &a.runc);
    put("cni/v1.5.1/cni-plugins-linux-amd64-v1.5.1.tgz", &a.cni);
    let plan = offline_plan("file:///bundle");

    let report = install(&host, &plan).await.unwrap();
    assert_eq!(
        report.get(Component::Runc).unwrap().version.as_deref(),
        Some("1.5.0")
    );
    assert_everything_installed(&host, &a);
    let again = install(&host, &plan).await.unwrap();
    assert!(again.all_already_installed(), "{again:?}");
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn offline_file_url_tar_gz_real_processes_zero_http_requests() {
    let server = Server::start().await;
    let a = artifacts();
    serve_all(&server, &a);
    let tmp = tempfile::tempdir().unwrap();
    let host = real_host(tmp.path());
    // The archive holds one top-level directory, as `tar czf bundle.tar.gz bundle/` makes.
    let src = tempfile::tempdir().unwrap();
    write_bundle(&src.path().join("bundle"), &a);
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    b.append_dir_all("bundle", src.path().join("bundle"))
        .unwrap();
    let bytes = b.into_inner().unwrap().finish().unwrap();
    std::fs::create_dir_all(tmp.path().join("bundles")).unwrap();
    std::fs::write(tmp.path().join("bundles/bundle-1.35.0.tar.gz"), bytes).unwrap();
    let plan = offline_plan("file:///bundles/bundle-{{.KubernetesVersionNoV}}.tar.gz");

    install(&host, &plan).await.unwrap();
    assert_everything_installed(&host, &a);
    let again = install(&host, &plan).await.unwrap();
    assert!(again.all_already_installed(), "{again:?}");
    assert!(server.requests().is_empty(), "{:?}", server.requests());
    assert!(!files(&host).iter().any(|f| f.contains(STAGING_PREFIX)));
}

struct NoRegistry;

fn no_registry(reference: &str) -> flex_oci::OciError {
    flex_oci::OciError::Layout {
        reference: reference.into(),
        dir: "/nonexistent".into(),
        reason: "no registry in this test".into(),
    }
}

#[async_trait::async_trait]
impl aks_flex_node::machine::components::ArtifactFetcher for NoRegistry {
    async fn check(&self, r: &str) -> Result<(), flex_oci::OciError> {
        Err(no_registry(r))
    }

    async fn fetch(&self, r: &str, _: &Path) -> Result<(), flex_oci::OciError> {
        Err(no_registry(r))
    }
}

#[tokio::test]
async fn real_http_reachability_checks_fall_back_to_ranged_get_and_hide_urls() {
    let server = Server::start().await;
    let a = artifacts();
    serve_all(&server, &a);
    let plan = plan_for(&server);
    let fs = HostFs::new("/nonexistent");
    let results = check_reachable_with(&fs, &NoRegistry, &http(), &plan).await;
    assert_eq!(
        results,
        vec![
            (CHECK_KUBERNETES.to_string(), Ok(())),
            (CHECK_CRI.to_string(), Ok(())),
            (CHECK_CNI.to_string(), Ok(())),
        ]
    );
    assert!(server.requests().iter().all(|r| r.starts_with("HEAD ")));
    // A mirror that refuses HEAD is probed with a one-byte GET; no artifact is downloaded.
    server.refuse_head();
    server.unroute(CNI);
    server.unroute(&format!("{K8S}/kube-proxy"));
    let before = server.requests().len();
    let results = check_reachable_with(&fs, &NoRegistry, &http(), &plan).await;
    assert_eq!(results[1], (CHECK_CRI.to_string(), Ok(())));
    assert_eq!(
        results[0].1,
        Err(ProbeError::Unreachable(
            "one or more required Kubernetes artifact sources are not reachable: kube-proxy (HTTP 404)"
                .to_string()
        ))
    );
    assert_eq!(
        results[2].1,
        Err(ProbeError::Unreachable(
            "required CNI artifact source is not reachable: cni-plugins (HTTP 404)".to_string()
        ))
    );
    let gets = server.requests()[before..]
        .iter()
        .filter(|r| r.starts_with("GET "))
        .count();
    assert_eq!(gets, 7, "{:?}", server.requests());
    // A closed port: no URL in the message either.
    let mut d = Downloads::default();
    for s in [
        &mut d.kubernetes,
        &mut d.crictl,
        &mut d.containerd,
        &mut d.runc,
        &mut d.cni,
    ] {
        s.base_url = "http://user:secret@127.0.0.1:9/x".into();
    }
    let closed = ComponentPlan::resolve(&config(), "amd64", d).unwrap();
    let results = check_reachable_with(&fs, &NoRegistry, &http(), &closed).await;
    let cri = results[1].1.clone().unwrap_err().to_string();
    assert_eq!(
        cri,
        "one or more required CRI artifact sources are not reachable: crictl (connection failed), \
         containerd (connection failed), runc (connection failed)"
    );
    for (_, r) in results {
        let m = r.unwrap_err().to_string();
        assert!(!m.contains("127.0.0.1") && !m.contains("secret"), "{m}");
    }
}
