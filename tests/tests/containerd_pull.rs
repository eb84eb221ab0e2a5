//! The agent's image store ([`aks_flex_node::machine::containerd`]) against a REAL containerd, a REAL
//! registry and REAL runc.
//!
//! What is real: Debian's `containerd` (1.6 on bookworm), started per test with its own root,
//! state and socket in a temporary directory (CRI disabled) and killed when the test ends;
//! Debian's `docker-registry` (distribution) on 127.0.0.1 with storage in the same directory,
//! spoken to over plain HTTP; `runc` (through `ctr run`); the agent's registry client and the
//! real [`ProcessRunner`]. What is not: the image is a small test image, not the agent's (a
//! static busybox from `busybox-static` in one layer, a file in a second one, built with
//! `flex-image`'s deterministic layers and pushed with the agent's registry client, under an
//! index for `linux/<this arch>`); check containers run without `--runc-systemd-cgroup` (this
//! machine has no systemd; production checks run in their scope), and with the `native`
//! snapshotter where overlayfs does not work here (the snapshotter is a parameter of both
//! stores); the containerd namespace is `aks-flex` as in production.
//!
//! The gRPC test shows: a pull through containerd's API (content, leases, snapshots, diff,
//! images services) gives an image that `ctr images ls` lists and `ctr images check` finds
//! complete, whose layers are unpacked under their chain IDs, whose content survives a
//! synchronous garbage collection after the lease is gone (the GC labels hold it), and that
//! `ctr run` starts after the registry is stopped (nothing is pulled again); a reference with
//! a digest the registry does not have fails naming the reference; a check's output and a
//! failing check's error; `remove` makes `exists` false; and when containerd goes away,
//! [`HostImages`] falls back to `ctr` for a transport failure. The ctr test shows the same
//! store operations through `ctr` run by the real runner.
//!
//! Needs root and the Debian packages `containerd runc docker-registry busybox-static` (CI
//! installs them; without them the tests fail and say what to install). As non-root they
//! print "skipped".

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aks_flex_node::machine::containerd::{
    CtrImages, GrpcImages, HostImages, Images, PullOptions, grpc::chain_ids, host_images_at,
};
use bytes::Bytes;
use flex_host::hostinfo::{HostInfo, RealHostInfo};
use flex_host::retry::Backoff;
use flex_host::runner::{Cmd, Output, ProcessRunner, Runner, which_on};
use flex_oci::manifest::{Platform, media_type};
use flex_oci::{Arch, Descriptor, Digest, ImageIndex, ImageRef, RegistryClient};
use flex_testkit::FakeRunner;

use flex_tests::daemon::{Daemon, spawn_daemon};

const PACKAGES: &str = "containerd runc docker-registry busybox-static";
const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
const LAYER2_FILE: &str = "hello from layer 2\n";

/// Fails (never passes silently) when a component is missing.
fn require_packages() {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut missing: Vec<String> = ["containerd", "ctr", "runc"]
        .iter()
        .filter(|p| which_on(p, Some(&path)).is_none())
        .map(|p| p.to_string())
        .collect();
    for f in [REGISTRY_BIN, "/bin/busybox"] {
        if !Path::new(f).is_file() {
            missing.push(f.into());
        }
    }
    assert!(
        missing.is_empty(),
        "missing {missing:?}: run `apt-get install -y {PACKAGES}` (CI installs them)"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `docker-registry serve` on a free loopback port, ready.
async fn start_registry(dir: &Path) -> (Daemon, u16) {
    let port = free_port();
    let config = dir.join("registry.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\n\
             log:\n  level: error\n  accesslog:\n    disabled: true\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:{port}\n",
            dir.join("registry").display()
        ),
    )
    .unwrap();
    let registry = spawn_daemon(
        REGISTRY_BIN,
        &["serve", &config.to_string_lossy()],
        &dir.join("registry.log"),
    );
    let http = flex_host::http::client().unwrap();
    let start = Instant::now();
    loop {
        if let Ok(r) = http
            .get(format!("http://127.0.0.1:{port}/v2/"))
            .send()
            .await
            && r.status().is_success()
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "docker-registry did not answer: {}",
            registry.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (registry, port)
}

/// containerd with everything under `dir`, ready; and the snapshotter that works here.
async fn start_containerd(dir: &Path) -> (Daemon, String, String) {
    let cdir = dir.join("containerd");
    std::fs::create_dir_all(&cdir).unwrap();
    std::fs::write(
        cdir.join("config.toml"),
        format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = "{d}/containerd.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
"#,
            d = cdir.display()
        ),
    )
    .unwrap();
    let containerd = spawn_daemon(
        "containerd",
        &["--config", &cdir.join("config.toml").to_string_lossy()],
        &cdir.join("containerd.log"),
    );
    let sock = cdir.join("containerd.sock").to_string_lossy().into_owned();
    let version = Cmd::new("ctr").args(["--address", &sock, "version"]);
    let start = Instant::now();
    while !ProcessRunner::new()
        .output(&version)
        .await
        .is_ok_and(|o| o.success())
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "containerd not ready: {}",
            containerd.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let plugins = ProcessRunner::new()
        .run(&Cmd::new("ctr").args(["--address", &sock, "plugins", "ls"]))
        .await
        .unwrap()
        .stdout;
    let overlay_ok = plugins.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.first() == Some(&"io.containerd.snapshotter.v1")
            && f.get(1) == Some(&"overlayfs")
            && f.last() == Some(&"ok")
    });
    let snapshotter = if overlay_ok { "overlayfs" } else { "native" };
    eprintln!("containerd ready at {sock}; snapshotter {snapshotter}");
    (containerd, sock, snapshotter.to_string())
}

/// The test image in the registry.
struct Pushed {
    /// `127.0.0.1:<port>/flex/busybox@<index digest>`.
    by_index: String,
    /// `127.0.0.1:<port>/flex/busybox@<manifest digest>`.
    by_manifest: String,
    index_digest: String,
    /// The top layer's chain ID.
    top_chain: Digest,
    /// A digest the registry does not have, in the same repository.
    missing: String,
}

/// The opt-in for the test registry (and only it): plain HTTP to `127.0.0.1:<port>`.
fn listed(port: u16) -> flex_host::http::InsecureRegistries {
    flex_host::http::InsecureRegistries::parse("test", &format!("127.0.0.1:{port}")).unwrap()
}

/// Builds the busybox image with `flex-image` and pushes it (manifest, then an index over it)
/// with the agent's registry client.
async fn push_test_image(port: u16) -> Pushed {
    let mut base = flex_image::Layer::new();
    base.dir("bin", 0o755).unwrap();
    base.file_from("bin/busybox", Some(0o755), Path::new("/bin/busybox"))
        .unwrap();
    for tool in ["sh", "cat", "echo", "true", "sleep"] {
        base.symlink(&format!("bin/{tool}"), "busybox").unwrap();
    }
    base.dir("etc", 0o755).unwrap();
    base.dir("tmp", 0o1777).unwrap();
    let mut top = flex_image::Layer::new();
    top.dir("etc", 0o755).unwrap();
    top.file("etc/flex-test", 0o644, LAYER2_FILE).unwrap();
    let layers = [
        base.build(1_700_000_000, 1).unwrap(),
        top.build(1_700_000_000, 1).unwrap(),
    ];
    let diff_ids: Vec<String> = layers.iter().map(|l| l.diff_id.clone()).collect();
    let config = flex_image::oci::config_json(
        &flex_image::ImageConfig {
            architecture: flex_image::oci::host_architecture().into(),
            os: "linux".into(),
            created: 1_700_000_000,
            env: vec!["PATH=/bin".into()],
            entrypoint: vec![],
            cmd: vec!["/bin/sh".into()],
            working_dir: "/".into(),
            labels: Default::default(),
            created_by: "flex-tests containerd_pull".into(),
        },
        &diff_ids,
    )
    .unwrap();
    let client = RegistryClient::new(flex_host::http::client().unwrap())
        .with_retry(Backoff::new(
            3,
            Duration::from_millis(50),
            Duration::from_secs(1),
        ))
        .with_insecure_registries(listed(port));
    let repo = format!("127.0.0.1:{port}/flex/busybox");
    let image = ImageRef::parse(&format!("{repo}:manifest")).unwrap();
    let manifest = client
        .push_image(
            &image,
            Bytes::from(config),
            layers
                .iter()
                .map(|l| (l.media_type.clone(), Bytes::from(l.data.clone())))
                .collect(),
        )
        .await
        .unwrap();
    let mut entry: Descriptor = manifest.clone();
    entry.platform = Some(Platform::linux(Arch::host()));
    let index = serde_json::to_vec(&ImageIndex::new(vec![entry])).unwrap();
    let index_digest = client
        .push_manifest(
            &ImageRef::parse(&format!("{repo}:index")).unwrap(),
            "index",
            media_type::OCI_INDEX,
            Bytes::from(index),
        )
        .await
        .unwrap();
    let diff_ids: Vec<Digest> = diff_ids.iter().map(|d| Digest::parse(d).unwrap()).collect();
    Pushed {
        by_index: format!("{repo}@{index_digest}"),
        by_manifest: format!("{repo}@{}", manifest.digest),
        index_digest: index_digest.to_string(),
        top_chain: chain_ids(&diff_ids).pop().unwrap(),
        missing: format!("{repo}@sha256:{}", "e".repeat(64)),
    }
}

/// `ctr --address <sock> -n aks-flex …`, through the real runner.
async fn ctr(sock: &str, args: &[&str]) -> Output {
    let cmd = Cmd::new("ctr")
        .args(["--address", sock, "-n", "aks-flex"])
        .args(args.iter().copied())
        .timeout(Duration::from_secs(120));
    let out = ProcessRunner::new().output(&cmd).await.unwrap();
    eprintln!(
        "$ {}\n  exit {:?}\n  stdout: {}\n  stderr: {}",
        cmd.display_argv(),
        out.code,
        out.stdout.trim(),
        out.stderr.trim()
    );
    out
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

fn real_ctr(sock: &str, snapshotter: &str) -> CtrImages {
    CtrImages::new(Arc::new(ProcessRunner::new()))
        .with_address(sock)
        .with_snapshotter(snapshotter)
        .without_systemd_cgroup()
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("flex-pull")
        .tempdir()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_pull_into_real_containerd_from_real_registry_then_real_ctr_runs_it() {
    if RealHostInfo.euid() != 0 {
        println!("skipped: needs root");
        return;
    }
    require_packages();
    let tmp = tempdir();
    let dir = tmp.path();
    let (registry, port) = start_registry(dir).await;
    let (containerd, sock, snapshotter) = start_containerd(dir).await;
    let pushed = push_test_image(port).await;
    let registry_client = RegistryClient::new(flex_host::http::client().unwrap());
    let grpc = GrpcImages::connect(
        Path::new(&sock),
        registry_client,
        real_ctr(&sock, &snapshotter),
    )
    .await
    .unwrap()
    .with_snapshotter(&snapshotter)
    .with_staging_dir(dir);
    let plain = PullOptions {
        plain_http: true,
        insecure_registries: listed(port),
    };

    // A digest the registry does not have: an error naming the reference and the step.
    let e = grpc.pull(&pushed.missing, &plain).await.unwrap_err();
    let text = e.to_string();
    eprintln!("wrong digest: {text}");
    assert!(
        text.starts_with(&format!("image {}: resolve: ", pushed.missing)),
        "{text}"
    );
    assert!(!grpc.exists(&pushed.missing).await.unwrap());

    // The pull through the API.
    assert!(!grpc.exists(&pushed.by_index).await.unwrap());
    let started = Instant::now();
    let pulled = grpc.pull(&pushed.by_index, &plain).await.unwrap();
    let grpc_time = started.elapsed();
    eprintln!("gRPC pull (2 layers, busybox): {grpc_time:?}");
    assert_eq!(pulled.name, pushed.by_index);
    assert_eq!(pulled.digest, pushed.index_digest);
    assert!(grpc.exists(&pushed.by_index).await.unwrap());
    // Again: everything is there, only the record is updated.
    let started = Instant::now();
    grpc.pull(&pushed.by_index, &plain).await.unwrap();
    eprintln!("gRPC pull again (content present): {:?}", started.elapsed());
    // The same manifest by its own digest: content reused, a second record.
    let by_manifest = grpc.pull(&pushed.by_manifest, &plain).await.unwrap();
    assert_eq!(
        Some(by_manifest.digest.as_str()),
        pushed.by_manifest.rsplit_once('@').map(|(_, d)| d)
    );

    // What ctr sees: listed, complete, unpacked, no lease left.
    let listed = ctr(&sock, &["images", "ls", "-q"]).await;
    assert!(
        listed.stdout.lines().any(|l| l == pushed.by_index),
        "{listed:?}"
    );
    let leases = ctr(&sock, &["leases", "ls", "-q"]).await;
    assert_eq!(leases.stdout.trim(), "", "a pull's lease was left behind");
    let snapshots_have_top = async || {
        ctr(&sock, &["snapshots", "--snapshotter", &snapshotter, "ls"])
            .await
            .stdout
            .lines()
            .any(|l| l.split_whitespace().next() == Some(pushed.top_chain.as_str()))
    };
    assert!(
        snapshots_have_top().await,
        "the top chain ID is not unpacked"
    );
    let content = ctr(&sock, &["content", "ls"]).await.stdout;
    for label in [
        format!(
            "containerd.io/gc.ref.snapshot.{snapshotter}={}",
            pushed.top_chain
        ),
        "containerd.io/gc.ref.content.config=".to_string(),
        "containerd.io/gc.ref.content.l.1=".to_string(),
        "containerd.io/gc.ref.content.m.0=".to_string(),
        "containerd.io/uncompressed=".to_string(),
    ] {
        assert!(content.contains(&label), "no {label} in:\n{content}");
    }

    // A synchronous garbage collection keeps it all: only the GC labels hold it now.
    assert!(
        ctr(&sock, &["images", "rm", "--sync", &pushed.by_manifest])
            .await
            .success()
    );
    let check = ctr(&sock, &["images", "check"]).await;
    let row = check
        .stdout
        .lines()
        .find(|l| l.starts_with(&pushed.by_index))
        .unwrap_or_else(|| panic!("{check:?}"));
    assert!(row.contains("complete"), "{row}");
    assert!(snapshots_have_top().await, "GC removed the unpacked layers");

    // ctr runs it with the registry gone: nothing is pulled again.
    drop(registry);
    let out = ctr(
        &sock,
        &[
            "run",
            "--rm",
            "--snapshotter",
            &snapshotter,
            &pushed.by_index,
            "flex-pull-run",
            "/bin/cat",
            "/etc/flex-test",
        ],
    )
    .await;
    assert_eq!(out.code, Some(0), "{out:?}\n{}", containerd.log());
    assert_eq!(out.stdout, LAYER2_FILE);

    // run_check (delegated to ctr run): output, and a failing check's error.
    let out = grpc
        .run_check(
            &pushed.by_index,
            1,
            &strings(&["/bin/sh", "-c", "echo check-ok; cat /etc/flex-test"]),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(out, format!("check-ok\n{LAYER2_FILE}"));
    let e = grpc
        .run_check(
            &pushed.by_index,
            2,
            &strings(&["/bin/sh", "-c", "echo broken >&2; exit 3"]),
            Duration::from_secs(60),
        )
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "image {}: check `/bin/sh -c \"echo broken >&2; exit 3\"` failed: exit status 3: broken",
            pushed.by_index
        )
    );
    let e = grpc
        .run_check(
            &pushed.by_index,
            3,
            &strings(&["/bin/sleep", "60"]),
            Duration::from_secs(2),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("timed out after 2s"), "{e}");
    let left = ctr(&sock, &["containers", "ls", "-q"]).await;
    assert_eq!(left.stdout.trim(), "", "check containers left behind");

    // remove: gone; removing again is fine.
    grpc.remove(&pushed.by_index).await.unwrap();
    assert!(!grpc.exists(&pushed.by_index).await.unwrap());
    grpc.remove(&pushed.by_index).await.unwrap();

    // host_images picks the API when the socket answers (an image store that works either way).
    let store = host_images_at(Arc::new(ProcessRunner::new()), Path::new(&sock), None).await;
    assert!(!store.exists(&pushed.by_index).await.unwrap());

    // containerd goes away: a transport failure falls back to ctr (recorded here).
    let fallback = FakeRunner::new();
    fallback.on(
        "ctr --address",
        Output::ok(format!("{}\n", pushed.by_index)),
    );
    let host = HostImages::new(
        grpc.clone(),
        CtrImages::new(Arc::new(fallback.clone())).with_address(&sock),
    );
    drop(containerd);
    let direct = grpc.exists(&pushed.by_index).await.unwrap_err();
    eprintln!("containerd gone: {direct}");
    assert!(direct.is_transport(), "{direct:?}");
    assert!(host.exists(&pushed.by_index).await.unwrap());
    assert_eq!(
        fallback.calls(),
        [format!(
            "ctr --address {sock} -n aks-flex images ls -q name=={}",
            pushed.by_index
        )]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctr_store_with_real_runner_real_containerd_and_real_registry() {
    if RealHostInfo.euid() != 0 {
        println!("skipped: needs root");
        return;
    }
    require_packages();
    let tmp = tempdir();
    let dir = tmp.path();
    let (_registry, port) = start_registry(dir).await;
    let (containerd, sock, snapshotter) = start_containerd(dir).await;
    let pushed = push_test_image(port).await;
    let store = real_ctr(&sock, &snapshotter);
    let plain = PullOptions {
        plain_http: true,
        insecure_registries: listed(port),
    };

    let e = store.pull(&pushed.missing, &plain).await.unwrap_err();
    let text = e.to_string();
    eprintln!("wrong digest: {text}");
    assert!(
        text.starts_with(&format!("image {}: pull: ", pushed.missing)),
        "{text}"
    );
    assert!(!store.exists(&pushed.missing).await.unwrap());

    assert!(!store.exists(&pushed.by_index).await.unwrap());
    let started = Instant::now();
    let pulled = store
        .pull(&pushed.by_index, &plain)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", containerd.log()));
    eprintln!("ctr pull (2 layers, busybox): {:?}", started.elapsed());
    assert_eq!(pulled.name, pushed.by_index);
    assert_eq!(pulled.digest, pushed.index_digest);
    assert!(store.exists(&pushed.by_index).await.unwrap());

    let out = store
        .run_check(
            &pushed.by_index,
            1,
            &strings(&["/bin/cat", "/etc/flex-test"]),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(out, LAYER2_FILE);

    store.remove(&pushed.by_index).await.unwrap();
    assert!(!store.exists(&pushed.by_index).await.unwrap());
    store.remove(&pushed.by_index).await.unwrap();
}
