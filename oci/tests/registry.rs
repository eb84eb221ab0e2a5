//! The OCI puller against a REAL registry: Debian's `docker-registry` (distribution/registry
//! v2), started per test on 127.0.0.1 with filesystem storage in a temporary directory and no
//! auth (one test switches htpasswd auth on). Images are built here (layers from `LayerBuilder`), pushed with the agent's own
//! `RegistryClient`, pulled with `pull_rootfs`, and the unpacked tree is compared with a
//! hand-written expected listing (path, type, mode, owner, mtime, link target, content sha256).
//!
//! The registry is required: without `/usr/bin/docker-registry` every test here FAILS with a
//! message saying to `apt-get install docker-registry` (CI installs it).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use flex_host::retry::Backoff;
use flex_oci::manifest::{Platform, media_type};
use flex_oci::{
    Arch, Descriptor, Digest, DockerConfig, ImageIndex, ImageRef, ImageSource, MARKER_FILE,
    PullOptions, RegistryClient, fetch_artifact, manifest_reachable, pull_rootfs,
};
use flex_testkit::layer_builder::{LayerBuilder, gzip, zstd};

const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// A `docker-registry serve` child on a free loopback port, killed on drop.
struct Registry {
    child: std::process::Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The workspace bans `Command::new` outside the runner; this test needs the child's handle to
/// kill it on drop (the runner waits for commands to finish), so it opts out here only.
#[allow(clippy::disallowed_methods)]
fn spawn_registry(config: &Path, log: &Path) -> std::process::Child {
    let log = std::fs::File::create(log).unwrap();
    std::process::Command::new(REGISTRY_BIN)
        .arg("serve")
        .arg(config)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {REGISTRY_BIN}: {e}"))
}

impl Registry {
    async fn start() -> Self {
        Self::start_with(None).await
    }

    /// A registry that asks for `user`'s password (distribution's htpasswd auth: `Basic`
    /// challenges, bcrypt entries) when `htpasswd` is given.
    async fn start_with(htpasswd: Option<(&str, &str)>) -> Self {
        assert!(
            Path::new(REGISTRY_BIN).exists(),
            "{REGISTRY_BIN} is missing: these tests need a real registry; run \
             `apt-get install docker-registry` (CI installs it)"
        );
        let dir = tempfile::tempdir().unwrap();
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let config = dir.path().join("config.yml");
        let mut text = format!(
            "version: 0.1\n\
             log:\n  level: error\n  accesslog:\n    disabled: true\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("data").display()
        );
        if let Some((user, password)) = htpasswd {
            let file = dir.path().join("htpasswd");
            let hash = bcrypt::hash(password, 4).unwrap();
            std::fs::write(&file, format!("{user}:{hash}\n")).unwrap();
            text.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: flex-test\n    path: {}\n",
                file.display()
            ));
        }
        std::fs::write(&config, text).unwrap();
        let log = dir.path().join("registry.log");
        let mut child = spawn_registry(&config, &log);
        let http = flex_host::http::client().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "docker-registry exited ({status}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if let Ok(r) = http
                .get(format!("http://127.0.0.1:{port}/v2/"))
                .send()
                .await
                && (r.status().is_success()
                    || (htpasswd.is_some() && r.status() == reqwest::StatusCode::UNAUTHORIZED))
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not answer /v2/"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self { child, port, dir }
    }

    fn image(&self, name: &str) -> ImageRef {
        ImageRef::parse(&format!("127.0.0.1:{}/{name}", self.port)).unwrap()
    }

    /// Where the registry keeps a blob's bytes.
    fn blob_file(&self, d: &Digest) -> PathBuf {
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&d.hex()[..2])
            .join(d.hex())
            .join("data")
    }
}

/// A client with `reg` (and only it) opted in to plain HTTP.
fn client(reg: &Registry) -> RegistryClient {
    RegistryClient::new(flex_host::http::client().unwrap())
        .with_retry(Backoff::new(
            3,
            Duration::from_millis(20),
            Duration::from_secs(1),
        ))
        .with_insecure_registries(
            flex_host::http::InsecureRegistries::parse("test", &format!("127.0.0.1:{}", reg.port))
                .unwrap(),
        )
}

const T1: u64 = 1_700_000_001;
const T2: u64 = 1_700_000_002;
const T3: u64 = 1_700_000_003;
const T4: u64 = 1_700_000_004;
const T5: u64 = 1_700_000_005;

fn finish(b: LayerBuilder) -> Vec<u8> {
    b.finish().unwrap()
}

/// Layer 1: a base system.
fn layer1() -> Vec<u8> {
    let mut b = LayerBuilder::new();
    b.mtime(T1);
    b.dir("etc", 0o755).unwrap();
    b.file("etc/os-release", b"ID=flex\n", 0o644).unwrap();
    b.owner(0, 42);
    b.file("etc/shadow", b"root:*::0:::::\n", 0o640).unwrap();
    b.owner(0, 0);
    b.file("etc/remove-me", b"bye\n", 0o644).unwrap();
    b.dir("etc/conf.d", 0o755).unwrap();
    b.file("etc/conf.d/a", b"a=1\n", 0o644).unwrap();
    b.dir("usr", 0o755).unwrap();
    b.dir("usr/bin", 0o755).unwrap();
    b.file("usr/bin/tool", b"tool v1\n", 0o755).unwrap();
    b.hardlink("usr/bin/tool-alias", "usr/bin/tool").unwrap();
    b.file("usr/bin/su", b"su\n", 0o4755).unwrap();
    b.dir("usr/lib", 0o755).unwrap();
    b.file("usr/lib/libx.so.1", b"libx v1\n", 0o644).unwrap();
    b.symlink("usr/lib/libx.so", "libx.so.1").unwrap();
    b.symlink("lib", "usr/lib").unwrap();
    b.dir("opt", 0o755).unwrap();
    b.dir("opt/app", 0o755).unwrap();
    b.file("opt/app/old1", b"old1\n", 0o644).unwrap();
    b.dir("opt/app/sub", 0o755).unwrap();
    b.file("opt/app/sub/old2", b"old2\n", 0o644).unwrap();
    b.dir("tmp", 0o1777).unwrap();
    b.dir("var", 0o755).unwrap();
    b.dir("var/cache", 0o755).unwrap();
    b.dir("var/cache/stale", 0o755).unwrap();
    b.file("var/cache/stale/x", b"x\n", 0o644).unwrap();
    b.file("srv", b"srv was a file\n", 0o644).unwrap();
    b.dir("data", 0o755).unwrap();
    b.file("data/x", b"x\n", 0o644).unwrap();
    b.dir("home", 0o755).unwrap();
    b.owner(1000, 1000);
    b.dir("home/user", 0o700).unwrap();
    b.file("home/user/.profile", b"export A=1\n", 0o644)
        .unwrap();
    finish(b)
}

/// Layer 2: whiteouts, an opaque directory (marker after its sibling), replacements, a write
/// through a symlinked directory.
fn layer2() -> Vec<u8> {
    let mut b = LayerBuilder::new();
    b.mtime(T2);
    b.dir("etc", 0o755).unwrap();
    b.whiteout("etc/remove-me").unwrap();
    b.file("etc/os-release", b"ID=flex\nVERSION=2\n", 0o644)
        .unwrap();
    b.dir("var/cache", 0o755).unwrap();
    b.whiteout("var/cache/stale").unwrap();
    b.dir("opt/app", 0o750).unwrap();
    b.file("opt/app/new1", b"new1\n", 0o644).unwrap();
    b.opaque("opt/app").unwrap();
    b.dir("usr/lib", 0o755).unwrap();
    b.file("usr/lib/libx.so.2", b"libx v2\n", 0o644).unwrap();
    b.symlink("usr/lib/libx.so", "libx.so.2").unwrap();
    b.file("lib/libthrough.so", b"through\n", 0o644).unwrap();
    b.dir("usr/bin", 0o755).unwrap();
    b.file("usr/bin/tool", b"tool v2\n", 0o755).unwrap();
    finish(b)
}

/// Layer 3: an opaque directory (marker before its sibling), type changes, a hard link to a
/// lower layer's file, a fifo.
fn layer3() -> Vec<u8> {
    let mut b = LayerBuilder::new();
    b.mtime(T3);
    b.dir("etc", 0o755).unwrap();
    b.dir("etc/conf.d", 0o755).unwrap();
    b.opaque("etc/conf.d").unwrap();
    b.file("etc/conf.d/b", b"b=2\n", 0o644).unwrap();
    b.dir("srv", 0o755).unwrap();
    b.file("srv/data", b"served\n", 0o644).unwrap();
    b.file("data", b"data is a file now\n", 0o600).unwrap();
    b.dir("usr/bin", 0o755).unwrap();
    b.hardlink("usr/bin/su-link", "usr/bin/su").unwrap();
    b.dir("run", 0o755).unwrap();
    b.fifo("run/ctl", 0o600).unwrap();
    finish(b)
}

/// Layer 4 (zstd).
fn layer4() -> Vec<u8> {
    let mut b = LayerBuilder::new();
    b.mtime(T4);
    b.dir("etc", 0o755).unwrap();
    b.file("etc/zstd-layer", b"from zstd\n", 0o444).unwrap();
    b.owner(1000, 1000);
    b.dir("home/user", 0o700).unwrap();
    b.whiteout("home/user/.profile").unwrap();
    b.file("home/user/.bashrc", b"alias ll='ls -l'\n", 0o600)
        .unwrap();
    finish(b)
}

fn arch_layer(arch: &str) -> Vec<u8> {
    let mut b = LayerBuilder::new();
    b.mtime(T5);
    b.dir("etc", 0o755).unwrap();
    b.file("etc/arch", format!("{arch}\n").as_bytes(), 0o644)
        .unwrap();
    finish(b)
}

/// `(tar, media type, blob)` for the four layers of the test image.
fn layers() -> Vec<(Vec<u8>, &'static str, Vec<u8>)> {
    let mut v = Vec::new();
    for l in [layer1(), layer2(), layer3()] {
        let blob = gzip(&l).unwrap();
        v.push((l, media_type::OCI_LAYER_GZIP, blob));
    }
    let l4 = layer4();
    let blob = zstd(&l4).unwrap();
    v.push((l4, media_type::OCI_LAYER_ZSTD, blob));
    v
}

fn config(arch: &str, tars: &[&[u8]]) -> Bytes {
    let diff_ids: Vec<String> = tars.iter().map(|t| Digest::of(t).to_string()).collect();
    Bytes::from(
        serde_json::to_vec(&serde_json::json!({
            "architecture": arch, "os": "linux",
            "config": {"Env": ["PATH=/usr/bin"]},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }))
        .unwrap(),
    )
}

async fn push(
    c: &RegistryClient,
    image: &ImageRef,
    arch: &str,
    layers: &[(Vec<u8>, &str, Vec<u8>)],
) -> Descriptor {
    let tars: Vec<&[u8]> = layers.iter().map(|(t, _, _)| t.as_slice()).collect();
    let blobs = layers
        .iter()
        .map(|(_, mt, b)| (mt.to_string(), Bytes::from(b.clone())))
        .collect();
    c.push_image(image, config(arch, &tars), blobs)
        .await
        .unwrap()
}

fn sha(bytes: &[u8]) -> String {
    Digest::of(bytes).hex()[..16].to_string()
}

fn owner(uid: u32, gid: u32) -> String {
    if rustix::process::geteuid().is_root() {
        format!("{uid}:{gid}")
    } else {
        format!(
            "{}:{}",
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw()
        )
    }
}

/// Expected listing lines, built by hand from the layers above.
fn expected_tree(arch: Option<&str>) -> String {
    let o = owner(0, 0);
    let d = |p: &str, mode: u32, own: &str, t: u64| format!("{p} d {mode:04o} {own} mtime={t}");
    let f = |p: &str, mode: u32, own: &str, t: u64, nlink: u64, c: &[u8]| {
        format!(
            "{p} f {mode:04o} {own} mtime={t} nlink={nlink} size={} sha256={}",
            c.len(),
            sha(c)
        )
    };
    let l = |p: &str, t: u64, target: &str| format!("{p} l {o} mtime={t} -> {target}");
    let etc_t = if arch.is_some() { T5 } else { T4 };
    let mut v = vec![
        f("/data", 0o600, &o, T3, 1, b"data is a file now\n"),
        d("/etc", 0o755, &o, etc_t),
        d("/etc/conf.d", 0o755, &o, T3),
        f("/etc/conf.d/b", 0o644, &o, T3, 1, b"b=2\n"),
        f("/etc/os-release", 0o644, &o, T2, 1, b"ID=flex\nVERSION=2\n"),
        f(
            "/etc/shadow",
            0o640,
            &owner(0, 42),
            T1,
            1,
            b"root:*::0:::::\n",
        ),
        f("/etc/zstd-layer", 0o444, &o, T4, 1, b"from zstd\n"),
        d("/home", 0o755, &o, T1),
        d("/home/user", 0o700, &owner(1000, 1000), T4),
        f(
            "/home/user/.bashrc",
            0o600,
            &owner(1000, 1000),
            T4,
            1,
            b"alias ll='ls -l'\n",
        ),
        l("/lib", T1, "usr/lib"),
        d("/opt", 0o755, &o, T1),
        d("/opt/app", 0o750, &o, T2),
        f("/opt/app/new1", 0o644, &o, T2, 1, b"new1\n"),
        d("/run", 0o755, &o, T3),
        format!("/run/ctl p 0600 {o} mtime={T3}"),
        d("/srv", 0o755, &o, T3),
        f("/srv/data", 0o644, &o, T3, 1, b"served\n"),
        d("/tmp", 0o1777, &o, T1),
        d("/usr", 0o755, &o, T1),
        d("/usr/bin", 0o755, &o, T3),
        f("/usr/bin/su", 0o4755, &o, T1, 2, b"su\n"),
        f("/usr/bin/su-link", 0o4755, &o, T1, 2, b"su\n"),
        f("/usr/bin/tool", 0o755, &o, T2, 1, b"tool v2\n"),
        f("/usr/bin/tool-alias", 0o755, &o, T1, 1, b"tool v1\n"),
        d("/usr/lib", 0o755, &o, T2),
        f("/usr/lib/libthrough.so", 0o644, &o, T2, 1, b"through\n"),
        l("/usr/lib/libx.so", T2, "libx.so.2"),
        f("/usr/lib/libx.so.1", 0o644, &o, T1, 1, b"libx v1\n"),
        f("/usr/lib/libx.so.2", 0o644, &o, T2, 1, b"libx v2\n"),
        d("/var", 0o755, &o, T1),
        d("/var/cache", 0o755, &o, T2),
    ];
    if let Some(a) = arch {
        v.push(f(
            "/etc/arch",
            0o644,
            &o,
            T5,
            1,
            format!("{a}\n").as_bytes(),
        ));
    }
    v.sort();
    v.join("\n") + "\n"
}

/// The unpacked tree as listing lines (the root itself and the marker file excluded).
fn actual_tree(root: &Path) -> String {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = format!("/{}", p.strip_prefix(root).unwrap().display());
            if rel == format!("/{MARKER_FILE}") {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            let ft = m.file_type();
            let own = format!("{}:{}", m.uid(), m.gid());
            let mode = m.mode() & 0o7777;
            let t = m.mtime();
            let line = if ft.is_symlink() {
                format!(
                    "{rel} l {own} mtime={t} -> {}",
                    std::fs::read_link(&p).unwrap().display()
                )
            } else if ft.is_dir() {
                format!("{rel} d {mode:04o} {own} mtime={t}")
            } else if ft.is_file() {
                let c = std::fs::read(&p).unwrap();
                format!(
                    "{rel} f {mode:04o} {own} mtime={t} nlink={} size={} sha256={}",
                    m.nlink(),
                    c.len(),
                    sha(&c)
                )
            } else if ft.is_fifo() {
                format!("{rel} p {mode:04o} {own} mtime={t}")
            } else {
                format!("{rel} ? {mode:04o}")
            };
            out.insert(line.clone(), line);
            if ft.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out.into_keys().collect::<Vec<_>>().join("\n") + "\n"
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn real_registry_pull_by_tag_and_by_digest_matches_expected_tree() {
    let reg = Registry::start().await;
    let c = client(&reg);
    let image = reg.image("flex/node:v1");
    let arch = Arch::host().as_str();
    let desc = push(&c, &image, arch, &layers()).await;

    let work = tempfile::tempdir().unwrap();
    let by_tag = work.path().join("kube1");
    let info = pull_rootfs(
        &c,
        &ImageSource::Registry(image.clone()),
        &by_tag,
        &PullOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(info.manifest_digest.as_ref(), Some(&desc.digest));
    assert_eq!(info.layers.len(), 4);
    assert_eq!(actual_tree(&by_tag), expected_tree(None));
    let ino = |p: &str| std::fs::metadata(by_tag.join(p)).unwrap().ino();
    assert_eq!(ino("usr/bin/su"), ino("usr/bin/su-link"));
    assert_ne!(ino("usr/bin/tool"), ino("usr/bin/tool-alias"));
    assert!(
        std::fs::symlink_metadata(by_tag.join("run/ctl"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
    let marker: serde_json::Value =
        serde_json::from_slice(&std::fs::read(by_tag.join(MARKER_FILE)).unwrap()).unwrap();
    assert_eq!(marker["reference"], image.to_string());
    assert_eq!(marker["manifestDigest"], desc.digest.to_string());

    let pinned = image.with_digest(desc.digest.clone());
    let by_digest = work.path().join("kube2");
    let info = pull_rootfs(
        &c,
        &ImageSource::Registry(pinned.clone()),
        &by_digest,
        &PullOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(info.manifest_digest.as_ref(), Some(&desc.digest));
    assert_eq!(actual_tree(&by_digest), expected_tree(None));
    // Nothing but the two trees beside them (downloads cleaned up).
    assert_eq!(names(work.path()), ["kube1", "kube2"]);
    // The preflight check resolves the same manifest.
    let d = manifest_reachable(&c, &ImageSource::Registry(pinned), Arch::host())
        .await
        .unwrap();
    assert_eq!(d, desc.digest);
}

#[tokio::test]
async fn real_registry_index_selects_the_host_platform() {
    let reg = Registry::start().await;
    let c = client(&reg);
    let base = layers();
    let mut per_arch = Vec::new();
    for arch in [Arch::Amd64, Arch::Arm64] {
        let mut l = base.clone();
        let a = arch_layer(arch.as_str());
        let blob = gzip(&a).unwrap();
        l.push((a, media_type::OCI_LAYER_GZIP, blob));
        let image = reg.image(&format!("flex/multi:{arch}"));
        let desc = push(&c, &image, arch.as_str(), &l).await;
        per_arch.push((arch, desc.with_platform(Platform::linux(arch))));
    }
    let index = ImageIndex::new(per_arch.iter().map(|(_, d)| d.clone()).collect());
    let body = serde_json::to_vec(&index).unwrap();
    let index_image = reg.image("flex/multi:v1");
    let index_digest = c
        .push_manifest(&index_image, "v1", media_type::OCI_INDEX, Bytes::from(body))
        .await
        .unwrap();

    for (arch, desc) in &per_arch {
        let d = manifest_reachable(&c, &ImageSource::Registry(index_image.clone()), *arch)
            .await
            .unwrap();
        assert_eq!(&d, &desc.digest, "{arch}");
    }
    let work = tempfile::tempdir().unwrap();
    for (name, image) in [
        ("by-tag", index_image.clone()),
        ("by-digest", index_image.with_digest(index_digest.clone())),
    ] {
        let dest = work.path().join(name);
        let info = pull_rootfs(
            &c,
            &ImageSource::Registry(image),
            &dest,
            &PullOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(info.index_digest.as_ref(), Some(&index_digest));
        let host = per_arch.iter().find(|(a, _)| *a == Arch::host()).unwrap();
        assert_eq!(info.manifest_digest.as_ref(), Some(&host.1.digest));
        assert_eq!(
            actual_tree(&dest),
            expected_tree(Some(Arch::host().as_str())),
            "{name}"
        );
    }
    // An index without the wanted platform names what it has.
    let only_arm = ImageIndex::new(vec![per_arch[1].1.clone()]);
    let img = reg.image("flex/multi:arm-only");
    c.push_manifest(
        &img,
        "arm-only",
        media_type::OCI_INDEX,
        Bytes::from(serde_json::to_vec(&only_arm).unwrap()),
    )
    .await
    .unwrap();
    let e = manifest_reachable(&c, &ImageSource::Registry(img), Arch::Amd64)
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .ends_with("no manifest for platform linux/amd64; available: linux/arm64"),
        "{e}"
    );
}

#[tokio::test]
async fn real_registry_malicious_layer_is_refused_and_leaves_nothing() {
    let reg = Registry::start().await;
    let c = client(&reg);
    let mut b = LayerBuilder::new();
    b.file("innocent", b"hello", 0o644).unwrap();
    b.raw_file(b"../escape", b"pwned").unwrap();
    let evil = b.finish().unwrap();
    let mut b = LayerBuilder::new();
    b.symlink("up", "../../..").unwrap();
    b.raw_file(b"up/escape2", b"pwned").unwrap();
    let evil2 = b.finish().unwrap();
    let work = tempfile::tempdir().unwrap();
    let machines = work.path().join("machines");
    std::fs::create_dir(&machines).unwrap();
    for (tag, tar, entry) in [("v1", evil, "../escape"), ("v2", evil2, "up/escape2")] {
        let image = reg.image(&format!("flex/evil:{tag}"));
        let blob = gzip(&tar).unwrap();
        push(
            &c,
            &image,
            Arch::host().as_str(),
            &[(tar, media_type::OCI_LAYER_GZIP, blob)],
        )
        .await;
        let dest = machines.join("kube1");
        let e = pull_rootfs(
            &c,
            &ImageSource::Registry(image),
            &dest,
            &PullOptions::default(),
        )
        .await
        .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("refused") && msg.contains(entry), "{msg}");
        assert!(!dest.exists());
        assert_eq!(names(&machines), Vec::<String>::new(), "{tag}");
        assert_eq!(names(work.path()), ["machines"], "{tag}");
    }
}

#[tokio::test]
async fn real_registry_corrupted_blob_fails_digest_verification() {
    let reg = Registry::start().await;
    let c = client(&reg);
    // The registry itself refuses an upload whose bytes do not match the digest.
    let image = reg.image("flex/corrupt:v1");
    let http = flex_host::http::client().unwrap();
    let start = http
        .post(format!(
            "http://127.0.0.1:{}/v2/flex/corrupt/blobs/uploads/",
            reg.port
        ))
        .body(Vec::new())
        .send()
        .await
        .unwrap();
    assert_eq!(start.status(), 202);
    let loc = start.headers()["location"].to_str().unwrap().to_string();
    let sep = if loc.contains('?') { '&' } else { '?' };
    let put = http
        .put(format!("{loc}{sep}digest={}", Digest::of(b"claimed")))
        .body(b"actual".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 400, "{}", put.text().await.unwrap());

    // So corrupt a stored blob on the registry's disk instead: same size, one byte flipped.
    let mut b = LayerBuilder::new();
    b.file("etc/data", &vec![b'z'; 100_000], 0o644).unwrap();
    let tar = b.finish().unwrap();
    let blob = gzip(&tar).unwrap();
    let layer_digest = Digest::of(&blob);
    push(
        &c,
        &image,
        Arch::host().as_str(),
        &[(tar, media_type::OCI_LAYER_GZIP, blob)],
    )
    .await;
    let stored = reg.blob_file(&layer_digest);
    let mut bytes = std::fs::read(&stored).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&stored, &bytes).unwrap();
    let actual = Digest::of(&bytes);

    let work = tempfile::tempdir().unwrap();
    let dest = work.path().join("kube1");
    let e = pull_rootfs(
        &c,
        &ImageSource::Registry(image),
        &dest,
        &PullOptions::default(),
    )
    .await
    .unwrap_err();
    assert!(e.is_verification_failure(), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "layer digest mismatch: expected {layer_digest}, got {actual}"
        )),
        "{msg}"
    );
    assert!(!dest.exists());
    assert!(!work.path().join(".kube1.partial").exists());
}

#[tokio::test]
async fn real_registry_fetch_artifact_extracts_a_bundle() {
    let reg = Registry::start().await;
    let c = client(&reg);
    let image = reg.image("flex/bundle:v1");
    let mut b = LayerBuilder::new();
    b.dir("bin", 0o755).unwrap();
    b.file("bin/kubelet", b"\x7fELF kubelet", 0o755).unwrap();
    let tar = b.finish().unwrap();
    let layer = c
        .push_blob(
            &image,
            media_type::OCI_LAYER_GZIP,
            Bytes::from(gzip(&tar).unwrap()),
        )
        .await
        .unwrap();
    let notes = c
        .push_blob(
            &image,
            "text/plain",
            Bytes::from_static(b"offline bundle\n"),
        )
        .await
        .unwrap()
        .with_annotation("org.opencontainers.image.title", "NOTES.txt");
    let config = c
        .push_blob(
            &image,
            "application/vnd.example.bundle.config.v1+json",
            Bytes::from_static(b"{}"),
        )
        .await
        .unwrap();
    let manifest = flex_oci::ImageManifest::new(config, vec![layer, notes]);
    let body = serde_json::to_vec(&manifest).unwrap();
    let digest = c
        .push_manifest(&image, "v1", media_type::OCI_MANIFEST, Bytes::from(body))
        .await
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let dest = work.path().join("bundle");
    let source = ImageSource::parse(&format!("oci://{image}")).unwrap();
    let info = fetch_artifact(&c, &source, &dest).await.unwrap();
    assert_eq!(info.manifest_digest, Some(digest));
    assert_eq!(
        info.artifact_type.as_deref(),
        Some("application/vnd.example.bundle.config.v1+json")
    );
    assert_eq!(
        std::fs::read(dest.join("bin/kubelet")).unwrap(),
        b"\x7fELF kubelet"
    );
    assert_eq!(
        std::fs::read(dest.join("NOTES.txt")).unwrap(),
        b"offline bundle\n"
    );
    assert_eq!(names(work.path()), ["bundle"]);
}

const PASSWORD: &str = "htpasswd-SECRET-9";

/// A client for `reg` with `user`/`password` from a Docker-config file's text.
fn client_with_password(reg: &Registry, user: &str, password: &str) -> RegistryClient {
    let doc = serde_json::json!({"auths": {
        format!("http://127.0.0.1:{}/", reg.port): {
            "auth": base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        }
    }});
    let creds = DockerConfig::parse("registry-auth.json", doc.to_string().as_bytes()).unwrap();
    client(reg).with_credentials(std::sync::Arc::new(creds))
}

/// The REAL registry with htpasswd auth switched on: the agent's client pushes and pulls with the
/// password from a Docker-config file; without it, or with a wrong one, the error names the
/// registry and the status and never the password.
#[tokio::test]
async fn real_registry_with_htpasswd_pushes_and_pulls_with_the_password() {
    let reg = Registry::start_with(Some(("flex", PASSWORD))).await;
    let image = reg.image("flex/private:v1");
    let arch = Arch::host().as_str();
    let with = client_with_password(&reg, "flex", PASSWORD);
    let desc = push(&with, &image, arch, &layers()).await;

    let work = tempfile::tempdir().unwrap();
    let dest = work.path().join("kube1");
    let info = pull_rootfs(
        &with,
        &ImageSource::Registry(image.clone()),
        &dest,
        &PullOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(info.manifest_digest.as_ref(), Some(&desc.digest));
    assert_eq!(actual_tree(&dest), expected_tree(None));

    let registry = format!("127.0.0.1:{}", reg.port);
    let anonymous = manifest_reachable(
        &client(&reg),
        &ImageSource::Registry(image.clone()),
        Arch::host(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        anonymous.contains(&format!(
            "the registry wants credentials (Basic authentication) and none are configured for \
             {registry}"
        )),
        "{anonymous}"
    );
    let wrong = manifest_reachable(
        &client_with_password(&reg, "flex", "wrong-SECRET-1"),
        &ImageSource::Registry(image),
        Arch::host(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        wrong.contains(&format!(
            "{registry} answered 401: the user name and password were refused"
        )),
        "{wrong}"
    );
    for msg in [&anonymous, &wrong] {
        assert!(
            !msg.contains(PASSWORD) && !msg.contains("wrong-SECRET-1"),
            "{msg}"
        );
    }
}
