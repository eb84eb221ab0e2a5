//! Registry client tests against an in-process fake registry: a tokio `TcpListener` answering
//! hand-written HTTP/1.1, so the token flow, retries, Docker media types and digest checks can
//! be driven exactly (the real-registry tests are in `agent/tests/oci_registry.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::manifest::{ImageIndex, Platform};
use crate::{ImageSource, PullOptions, RootfsStatus, pull_rootfs};
use flex_testkit::layer_builder::{LayerBuilder, gzip};

struct Req {
    method: String,
    path: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    fn header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.into(), v.into()));
        self
    }
}

type Handler = Arc<dyn Fn(&Req) -> Resp + Send + Sync>;

/// A fake registry on 127.0.0.1; every request is logged as `METHOD path`.
struct Fake {
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read_request(sock: &mut tokio::net::TcpStream) -> Option<Req> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_string();
    let path = first.next()?.to_string();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Req {
        method,
        path,
        headers,
        body,
    })
}

impl Fake {
    async fn start(handler: impl Fn(&Req) -> Resp + Send + Sync + 'static) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler = Arc::new(handler);
        let log2 = log.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let (handler, log) = (handler.clone(), log2.clone());
                tokio::spawn(async move {
                    let Some(req) = read_request(&mut sock).await else {
                        return;
                    };
                    log.lock()
                        .unwrap()
                        .push(format!("{} {}", req.method, req.path));
                    let resp = handler(&req);
                    let mut out = format!(
                        "HTTP/1.1 {} X\r\nContent-Length: {}\r\nConnection: close\r\n",
                        resp.status,
                        resp.body.len()
                    );
                    for (k, v) in &resp.headers {
                        out.push_str(&format!("{k}: {v}\r\n"));
                    }
                    out.push_str("\r\n");
                    let _ = sock.write_all(out.as_bytes()).await;
                    if req.method != "HEAD" {
                        let _ = sock.write_all(&resp.body).await;
                    }
                    let _ = sock.shutdown().await;
                });
            }
        });
        Self { port, log, task }
    }

    fn image(&self, repo_tag: &str) -> ImageRef {
        ImageRef::parse(&format!("127.0.0.1:{}/{repo_tag}", self.port)).unwrap()
    }

    /// A client with this fake (and only it) opted in to plain HTTP.
    fn client(&self) -> RegistryClient {
        client_for(&format!("127.0.0.1:{}", self.port))
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    fn count(&self, prefix: &str) -> usize {
        self.log().iter().filter(|l| l.starts_with(prefix)).count()
    }
}

fn fast() -> Backoff {
    Backoff::new(5, Duration::from_millis(5), Duration::from_secs(1))
}

/// A client that opts in to plain HTTP for `registry` only (the fakes speak plain HTTP).
fn client_for(registry: &str) -> RegistryClient {
    RegistryClient::new(flex_host::http::client().unwrap())
        .with_retry(fast())
        .with_insecure_registries(InsecureRegistries::parse("test", registry).unwrap())
}

/// A one-layer image: blobs by digest, and the manifest.
struct TestImage {
    blobs: HashMap<String, Vec<u8>>,
    manifest: Vec<u8>,
    manifest_digest: Digest,
}

fn test_image(content: &[u8]) -> TestImage {
    let mut b = LayerBuilder::new();
    b.dir("etc", 0o755).unwrap();
    b.file("etc/hello", content, 0o644).unwrap();
    let tar = b.finish().unwrap();
    let layer = gzip(&tar).unwrap();
    let config = format!(
        r#"{{"architecture":"{}","os":"linux","rootfs":{{"type":"layers","diff_ids":["{}"]}}}}"#,
        Arch::host(),
        Digest::of(&tar)
    )
    .into_bytes();
    let cd = Descriptor::of(media_type::OCI_CONFIG, &config);
    let ld = Descriptor::of(media_type::OCI_LAYER_GZIP, &layer);
    let manifest = serde_json::to_vec(&ImageManifest::new(cd.clone(), vec![ld.clone()])).unwrap();
    let mut blobs = HashMap::new();
    blobs.insert(cd.digest.to_string(), config);
    blobs.insert(ld.digest.to_string(), layer);
    TestImage {
        blobs,
        manifest_digest: Digest::of(&manifest),
        manifest,
    }
}

/// Serves `img` at `/v2/<repo>/manifests/<any>` and its blobs.
fn serve(img: &TestImage, req: &Req, manifest_type: &str) -> Resp {
    if req.path.contains("/manifests/") {
        return Resp::new(200, img.manifest.clone()).header("Content-Type", manifest_type);
    }
    if let Some((_, d)) = req.path.split_once("/blobs/")
        && let Some(b) = img.blobs.get(d)
    {
        return Resp::new(200, b.clone());
    }
    Resp::new(
        404,
        r#"{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}"#,
    )
}

/// Pure URL building, nothing faked: a loopback or private registry is HTTPS unless listed.
#[test]
fn urls_are_https_unless_the_registry_is_listed() {
    let plain = RegistryClient::new(flex_host::http::client().unwrap());
    for r in [
        "localhost:5000/a/b",
        "127.0.0.1:5000/a/b",
        "10.0.2.2:5000/a/b",
    ] {
        let image = ImageRef::parse(r).unwrap();
        assert!(plain.url(&image, "blobs/x").starts_with("https://"), "{r}");
    }
    let hub = ImageRef::parse("debian:12").unwrap();
    assert_eq!(
        plain.url(&hub, "manifests/12"),
        "https://registry-1.docker.io/v2/library/debian/manifests/12"
    );
    let listed = plain
        .with_insecure_registries(InsecureRegistries::parse("test", "localhost:5000").unwrap());
    let local = ImageRef::parse("localhost:5000/a/b").unwrap();
    assert_eq!(
        listed.url(&local, "blobs/x"),
        "http://localhost:5000/v2/a/b/blobs/x"
    );
    let other_port = ImageRef::parse("localhost:5001/a/b").unwrap();
    assert!(listed.url(&other_port, "blobs/x").starts_with("https://"));
    assert_eq!(listed.insecure_registries().to_list(), "localhost:5000");
}

/// Log lines captured from `tracing` for the current thread.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// The process-wide log capture (a global subscriber: a thread-scoped one misses events while
/// other tests register callsites in parallel). Tests filter it by what is theirs.
fn captured_logs() -> Captured {
    static CAPTURED: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    CAPTURED
        .get_or_init(|| {
            let captured = Captured::default();
            let writer = captured.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_writer(move || writer.clone())
                .with_ansi(false)
                .finish();
            tracing::subscriber::set_global_default(subscriber).unwrap();
            captured
        })
        .clone()
}

/// The real client against a real plain-HTTP server on 127.0.0.1 (the in-process fake
/// registry): without an opt-in the client speaks HTTPS to it and fails (the fake never sees an
/// HTTP request); with `127.0.0.1:<port>` listed it pulls over HTTP and logs one warning naming
/// the registry.
#[tokio::test]
async fn loopback_registry_is_https_unless_listed_and_plain_http_warns() {
    let img = test_image(b"insecure");
    let fake = Fake::start(move |req| serve(&img, req, media_type::OCI_MANIFEST)).await;
    let image = fake.image("test/img:v1");
    let registry = format!("127.0.0.1:{}", fake.port);

    let captured = captured_logs();

    // The fake waits for an HTTP request head that a TLS handshake never sends: a short timeout.
    flex_host::http::install_crypto();
    let short = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let unlisted =
        RegistryClient::new(short).with_retry(Backoff::new(1, Duration::ZERO, Duration::ZERO));
    let e = unlisted
        .resolve(&image, Arch::host())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains(&format!("https://{registry}/")), "{e}");
    assert_eq!(fake.count("GET"), 0, "{:?}", fake.log());
    let mine = |logs: String| -> Vec<String> {
        logs.lines()
            .filter(|l| l.contains("plain HTTP") && l.contains(&registry))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(mine(captured.text()), Vec::<String>::new());

    let r = fake.client().resolve(&image, Arch::host()).await.unwrap();
    assert_eq!(fake.count("GET /v2/test/img/manifests/v1"), 1);
    assert!(!r.manifest.layers.is_empty());
    let warnings = mine(captured.text());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("WARN"), "{warnings:?}");
}

#[test]
fn default_retry_policy_is_five_attempts_from_two_seconds() {
    assert_eq!(
        REGISTRY_RETRY,
        Backoff::new(5, Duration::from_secs(2), Duration::from_secs(30))
    );
    let c = RegistryClient::new(flex_host::http::client().unwrap()).with_retry(Backoff::new(
        0,
        Duration::ZERO,
        Duration::ZERO,
    ));
    assert_eq!(c.retry_policy().attempts, 1);
    assert!(!format!("{c:?}").contains("tokens"));
}

#[test]
fn bearer_challenges() {
    let c = parse_bearer_challenge(
        r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/debian:pull,push""#,
    )
    .unwrap();
    assert_eq!(c.realm, "https://auth.docker.io/token");
    assert_eq!(c.service.as_deref(), Some("registry.docker.io"));
    assert_eq!(
        c.scope.as_deref(),
        Some("repository:library/debian:pull,push")
    );
    let c = parse_bearer_challenge("bearer realm=http://x/t, service=svc").unwrap();
    assert_eq!(
        (c.realm.as_str(), c.service.as_deref()),
        ("http://x/t", Some("svc"))
    );
    assert!(parse_bearer_challenge(r#"Basic realm="x""#).is_none());
    assert!(parse_bearer_challenge("Bearer service=x").is_none());
    assert!(parse_bearer_challenge("").is_none());
}

/// A registry behind anonymous bearer auth (token `tok123` from the realm `/token` on `port`):
/// a request without the token gets the 401 challenge, one with it what `serve` answers.
fn behind_bearer(req: &Req, port: u16, serve: impl FnOnce() -> Resp) -> Resp {
    if req.headers.get("authorization").map(String::as_str) != Some("Bearer tok123") {
        return Resp::new(401, "").header(
            "WWW-Authenticate",
            &format!(
                r#"Bearer realm="http://127.0.0.1:{port}/token",service="fake",scope="repository:test/img:pull""#
            ),
        );
    }
    serve()
}

#[tokio::test]
async fn fake_registry_anonymous_bearer_token_flow() {
    let img = test_image(b"hello");
    let tokens = Arc::new(AtomicUsize::new(0));
    let t2 = tokens.clone();
    let port_cell = Arc::new(std::sync::OnceLock::<u16>::new());
    let pc = port_cell.clone();
    let fake = Fake::start(move |req| {
        if req.path.starts_with("/token") {
            t2.fetch_add(1, Ordering::SeqCst);
            assert!(req.path.contains("service=fake"), "{}", req.path);
            assert!(
                req.path.contains("scope=repository%3Atest%2Fimg%3Apull"),
                "{}",
                req.path
            );
            assert!(!req.headers.contains_key("authorization"));
            return Resp::new(200, r#"{"token":"tok123"}"#);
        }
        behind_bearer(req, pc.get().copied().unwrap_or(0), || {
            serve(&img, req, media_type::OCI_MANIFEST)
        })
    })
    .await;
    port_cell.set(fake.port).unwrap();
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("kube1");
    let source = ImageSource::Registry(fake.image("test/img:v1"));
    let info = pull_rootfs(&fake.client(), &source, &dest, &PullOptions::default())
        .await
        .unwrap();
    assert_eq!(std::fs::read(dest.join("etc/hello")).unwrap(), b"hello");
    assert_eq!(
        info.manifest_digest,
        Some(test_image(b"hello").manifest_digest)
    );
    // One token, cached for every later request.
    assert_eq!(tokens.load(Ordering::SeqCst), 1, "{:?}", fake.log());
    assert_eq!(fake.count("GET /token"), 1);
    // The temporary download directory is gone, and nothing else is beside dest.
    let names: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(names, ["kube1"]);
}

/// The token realm a registry names is any URL: its answer is read only up to the document
/// limit. A realm that answers a valid token padded past 4 MiB is refused (before the bound,
/// the whole answer was buffered and the token used). Real client, fake registry and realm on
/// loopback.
#[tokio::test]
async fn a_token_realm_answer_past_the_limit_is_refused() {
    let img = test_image(b"hello");
    let port_cell = Arc::new(std::sync::OnceLock::<u16>::new());
    let pc = port_cell.clone();
    let fake = Fake::start(move |req| {
        if req.path.starts_with("/token") {
            let pad = "x".repeat(flex_host::http::DOCUMENT_LIMIT + 1);
            return Resp::new(200, format!(r#"{{"token":"tok123","pad":"{pad}"}}"#));
        }
        behind_bearer(req, pc.get().copied().unwrap_or(0), || {
            serve(&img, req, media_type::OCI_MANIFEST)
        })
    })
    .await;
    port_cell.set(fake.port).unwrap();
    let e = fake
        .client()
        .resolve(&fake.image("test/img:v1"), Arch::host())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("token endpoint") && e.contains("exceeds 4194304 bytes"),
        "{e}"
    );
    assert!(
        e.len() < 1_000,
        "the padding is not quoted: {} bytes",
        e.len()
    );
}

#[tokio::test]
async fn fake_registry_transient_statuses_are_retried() {
    let img = test_image(b"retry");
    let want = img.manifest_digest.clone();
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    let fake = Fake::start(move |req| {
        if req.path.contains("/manifests/") {
            match n2.fetch_add(1, Ordering::SeqCst) {
                0 => return Resp::new(503, "busy"),
                1 => return Resp::new(429, "slow down"),
                2 => return Resp::new(500, "oops"),
                _ => {}
            }
        }
        serve(&img, req, media_type::OCI_MANIFEST)
    })
    .await;
    let image = fake.image("test/img:v1");
    let r = fake.client().resolve(&image, Arch::host()).await.unwrap();
    assert_eq!(r.digest, want);
    assert_eq!(fake.count("GET /v2/test/img/manifests/v1"), 4);
}

#[tokio::test]
async fn fake_registry_retries_give_up_after_five_attempts() {
    let fake = Fake::start(|_| Resp::new(502, "bad gateway")).await;
    let image = fake.image("test/img:v1");
    let started = std::time::Instant::now();
    let e = fake
        .client()
        .resolve(&image, Arch::host())
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("giving up after 5 attempts"), "{msg}");
    assert!(msg.contains("HTTP 502"), "{msg}");
    assert_eq!(fake.count("GET"), 5);
    // 5 + 10 + 20 + 40 ms of delays.
    assert!(started.elapsed() >= Duration::from_millis(75));
    // Not-found is not retried.
    let fake = Fake::start(|_| {
        Resp::new(
            404,
            r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#,
        )
    })
    .await;
    let e = fake
        .client()
        .resolve(&fake.image("a/b:c"), Arch::host())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("MANIFEST_UNKNOWN"), "{e}");
    assert_eq!(fake.count("GET"), 1);
}

#[tokio::test]
async fn connection_refused_is_retried_then_reported() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let image = ImageRef::parse(&format!("127.0.0.1:{port}/x/y:z")).unwrap();
    let c = client_for(&format!("127.0.0.1:{port}")).with_retry(Backoff::new(
        3,
        Duration::from_millis(1),
        Duration::from_secs(1),
    ));
    let e = c.resolve(&image, Arch::host()).await.unwrap_err();
    assert!(e.to_string().contains("giving up after 3 attempts"), "{e}");
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
}

#[tokio::test]
async fn fake_registry_bad_blob_fails_digest_verification() {
    let img = test_image(b"good");
    let layer_digest = img
        .blobs
        .iter()
        .find(|(_, v)| v.starts_with(&[0x1f, 0x8b]))
        .map(|(k, _)| k.clone())
        .unwrap();
    let fake = Fake::start(move |req| {
        if req.path.ends_with(&layer_digest) {
            // Same size, different bytes.
            let mut bad = img.blobs[&layer_digest].clone();
            let last = bad.len() - 1;
            bad[last] ^= 0xff;
            return Resp::new(200, bad);
        }
        serve(&img, req, media_type::OCI_MANIFEST)
    })
    .await;
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("kube2");
    let source = ImageSource::Registry(fake.image("test/img:v1"));
    let e = pull_rootfs(&fake.client(), &source, &dest, &PullOptions::default())
        .await
        .unwrap_err();
    assert!(e.is_verification_failure(), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("layer digest mismatch"), "{msg}");
    let Some(expected) = msg.split("expected ").nth(1) else {
        panic!("{msg}")
    };
    assert!(expected.starts_with("sha256:"), "{msg}");
    assert!(msg.contains(", got sha256:"), "{msg}");
    // Not retried: a digest mismatch is not transient.
    assert_eq!(
        fake.count("GET /v2/test/img/blobs/sha256:"),
        2,
        "{:?}",
        fake.log()
    );
    assert!(!dest.exists());
    assert!(!t.path().join(".kube2.partial").exists());
    // No unverified blob is kept for a retry.
    let tmp = t.path().join(".kube2.oci-tmp/blobs/sha256");
    let kept: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(kept.len(), 2, "manifest and config only: {kept:?}");
}

#[tokio::test]
async fn fake_registry_docker_media_types_and_platform_selection() {
    let img = test_image(b"docker");
    // Rewrite the manifest with Docker media types.
    let docker_manifest = String::from_utf8(img.manifest.clone())
        .unwrap()
        .replace(media_type::OCI_MANIFEST, media_type::DOCKER_MANIFEST)
        .replace(media_type::OCI_CONFIG, media_type::DOCKER_CONFIG)
        .replace(media_type::OCI_LAYER_GZIP, media_type::DOCKER_LAYER_GZIP)
        .into_bytes();
    let md = Descriptor::of(media_type::DOCKER_MANIFEST, &docker_manifest);
    let other = Descriptor::of(media_type::DOCKER_MANIFEST, b"{}").with_platform(Platform {
        architecture: "s390x".into(),
        os: "linux".into(),
        variant: None,
        os_version: None,
    });
    let mut list = ImageIndex::new(vec![
        other.clone(),
        md.clone().with_platform(Platform::linux(Arch::host())),
    ]);
    list.media_type = Some(media_type::DOCKER_LIST.into());
    let list = serde_json::to_vec(&list).unwrap();
    let (md2, list2, dm2) = (md.clone(), list.clone(), docker_manifest.clone());
    let fake = Fake::start(move |req| {
        if req.path.ends_with("/manifests/multi") {
            assert!(req.headers["accept"].contains(media_type::DOCKER_LIST));
            return Resp::new(200, list2.clone())
                .header("Content-Type", media_type::DOCKER_LIST)
                .header("Docker-Content-Digest", Digest::of(&list2).as_str());
        }
        if req.path.ends_with(&format!("/manifests/{}", md2.digest)) {
            return Resp::new(200, dm2.clone()).header("Content-Type", media_type::DOCKER_MANIFEST);
        }
        if req.path.ends_with("/manifests/lying") {
            return Resp::new(200, dm2.clone())
                .header("Content-Type", media_type::DOCKER_MANIFEST)
                .header("Docker-Content-Digest", Digest::of(b"x").as_str());
        }
        if req.path.ends_with("/manifests/s390x-only") {
            let ix = ImageIndex::new(vec![other.clone()]);
            return Resp::new(200, serde_json::to_vec(&ix).unwrap());
        }
        serve(&img, req, media_type::OCI_MANIFEST)
    })
    .await;
    let c = fake.client();
    let r = c
        .resolve(&fake.image("test/img:multi"), Arch::host())
        .await
        .unwrap();
    assert_eq!(r.digest, md.digest);
    assert_eq!(r.index_digest, Some(Digest::of(&list)));
    assert_eq!(r.manifest.layers[0].media_type, media_type::OCI_LAYER_GZIP);
    assert_eq!(r.manifest.config.media_type, media_type::OCI_CONFIG);
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("m");
    let source = ImageSource::Registry(fake.image("test/img:multi"));
    pull_rootfs(&c, &source, &dest, &PullOptions::default())
        .await
        .unwrap();
    assert_eq!(std::fs::read(dest.join("etc/hello")).unwrap(), b"docker");

    let e = c
        .resolve(&fake.image("test/img:s390x-only"), Arch::Amd64)
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "127.0.0.1:{}/test/img:s390x-only: no manifest for platform linux/amd64; available: linux/s390x",
            fake.port
        )
    );
    let e = c
        .resolve(&fake.image("test/img:lying"), Arch::host())
        .await
        .unwrap_err();
    assert!(e.is_verification_failure(), "{e}");
}

/// Without credentials, a registry that asks for them gets a clear refusal naming it (real
/// client, fake registry); with them, see `credentials.rs`.
#[tokio::test]
async fn basic_auth_challenge_is_refused_clearly() {
    let fake =
        Fake::start(|_| Resp::new(401, "").header("WWW-Authenticate", r#"Basic realm="r""#)).await;
    let e = fake
        .client()
        .resolve(&fake.image("p/q:r"), Arch::host())
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "the registry wants credentials (Basic authentication) and none are configured for \
             127.0.0.1:{}",
            fake.port
        )),
        "{msg}"
    );
    assert_eq!(fake.count("GET"), 1);
}

#[tokio::test]
async fn pinned_digest_must_match_what_is_served() {
    let img = test_image(b"pinned");
    let fake = Fake::start(move |req| serve(&img, req, media_type::OCI_MANIFEST)).await;
    let wrong = Digest::of(b"something else");
    let image = fake.image("test/img").with_digest(wrong.clone());
    let e = fake
        .client()
        .resolve(&image, Arch::host())
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains(&format!("expected {wrong}")), "{msg}");
}

#[test]
fn futures_are_send() {
    fn send<T: Send>(_: &T) {}
    let c = RegistryClient::new(flex_host::http::client().unwrap());
    let src = ImageSource::parse("localhost:1/a:b").unwrap();
    let p = std::path::Path::new("/nonexistent");
    let opts = PullOptions::default();
    send(&crate::pull_rootfs(&c, &src, p, &opts));
    send(&crate::fetch_artifact(&c, &src, p));
    send(&crate::manifest_reachable(&c, &src, Arch::host()));
}

#[test]
fn token_realms_are_https_unless_listed_and_never_link_local() {
    let listed = InsecureRegistries::parse("t", "10.0.2.2:5000,169.254.1.1").unwrap();
    let u = |s: &str| url::Url::parse(s).unwrap();
    for (realm, registry_listed, want) in [
        ("https://auth.r.io/token", false, None),
        ("https://auth.r.io/token", true, None),
        // Plain HTTP: only for a listed realm, or a listed registry's own realm.
        ("http://10.0.2.2:5000/token", false, None),
        ("http://10.0.2.3:5000/token", true, None),
        (
            "http://auth.r.io/token",
            false,
            Some(
                "is plain HTTP, and neither it nor the registry that named it is listed as insecure",
            ),
        ),
        // A cloud's metadata service, whatever the scheme, unless listed.
        (
            "http://169.254.169.254/metadata",
            true,
            Some("is a link-local address"),
        ),
        (
            "https://169.254.169.254/metadata",
            false,
            Some("is a link-local address"),
        ),
        ("http://[fe80::1]/t", true, Some("is a link-local address")),
        ("http://169.254.1.1/t", false, None),
        ("ftp://auth.r.io/token", true, Some("is not an http(s) URL")),
    ] {
        assert_eq!(
            realm_refusal(&u(realm), &listed, registry_listed),
            want,
            "{realm} (registry listed: {registry_listed})"
        );
    }
}

/// Real client, real files, the in-process fake registry: a tree pulled by a tag counts as the
/// image of the digest that tag resolved to. Pulled again by that digest (a machine image
/// pinned after its first pull, `machine::pin` in the agent), it is kept without the warning
/// that the destination holds another image; by another digest, it is kept with it.
#[tokio::test]
async fn a_tree_pulled_by_tag_is_the_pinned_digests_image() {
    let img = test_image(b"pinned");
    let digest = img.manifest_digest.clone();
    let fake = Fake::start(move |req| serve(&img, req, media_type::OCI_MANIFEST)).await;
    let captured = captured_logs();
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("kube1-pinned-test");
    let tag = ImageSource::Registry(fake.image("test/img:v1"));
    let client = fake.client();
    let first = pull_rootfs(&client, &tag, &dest, &PullOptions::default())
        .await
        .unwrap();
    assert_eq!(first.status, RootfsStatus::Unpacked);
    assert_eq!(first.manifest_digest.as_ref(), Some(&digest));
    let mine = || -> Vec<String> {
        captured
            .text()
            .lines()
            .filter(|l| {
                l.contains("kube1-pinned-test") && l.contains("already holds another image")
            })
            .map(str::to_string)
            .collect()
    };
    let by_digest = ImageSource::Registry(fake.image("test/img:v1").with_digest(digest));
    let again = pull_rootfs(&client, &by_digest, &dest, &PullOptions::default())
        .await
        .unwrap();
    assert_eq!(again.status, RootfsStatus::AlreadyPresent);
    assert_eq!(mine(), Vec::<String>::new());
    let other = ImageSource::Registry(
        fake.image("test/img:v1")
            .with_digest(Digest::of(b"another image's manifest")),
    );
    let kept = pull_rootfs(&client, &other, &dest, &PullOptions::default())
        .await
        .unwrap();
    assert_eq!(kept.status, RootfsStatus::AlreadyPresent);
    assert_eq!(mine().len(), 1, "{:?}", mine());
}

mod credentials;
