//! The agent's image, `aks-flex-node-agent:<version>`: one gzip layer with the multi-call
//! binary, its links, its shared libraries and the few files a scratch image needs
//! ([`agent_layer`]); the config that makes `entrypoint` the entrypoint ([`agent_config`]);
//! [`build_agent_image`] writes both as an OCI layout and an OCI archive.
//!
//! The result depends only on the binary's bytes, the shared libraries and CA bundle of the
//! build machine, and [`AgentImageOptions`] (version, revision, epoch): building twice gives the
//! same digest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use flex_host::hostexec::{CHROOT_TOOLS, IMAGE_BIN_DIR, MOUNT_NS_TOOLS};
use flex_host::runner::{Cmd, ProcessRunner, Runner};

use crate::layer::Layer;
use crate::oci::{Image, ImageConfig, WrittenImage, write_oci_archive, write_oci_layout};

/// The image's repository name.
pub const IMAGE_NAME: &str = "aks-flex-node-agent";
/// The binary's path in the image.
pub const BINARY_PATH: &str = "/opt/aks-flex-node/bin/aks-flex-node";
/// The entrypoint (a link to the binary).
pub const ENTRYPOINT: &str = "/opt/aks-flex-node/bin/entrypoint";
/// The default command.
pub const CMD: &[&str] = &[
    "aks-flex-node",
    "daemon",
    "--config",
    "/etc/aks-flex-node/config.json",
];
/// The CA bundle's path, on the build machine and in the image.
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The image's `PATH`: the links first, then the usual directories.
pub const PATH: &str =
    "/opt/aks-flex-node/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Links to the binary besides the host tools.
pub const EXTRA_LINKS: &[&str] = &["entrypoint", "host-exec", "aks-flex-node-bootstrap"];
/// Empty directories of the image, with their modes.
///
/// `/host` is deliberately not one of them: the entrypoint detects a container started without
/// the host's root by `/host` being absent (and says so), which an empty `/host` in the image
/// would defeat. runc creates the mount point when `/host` is mounted.
pub const EMPTY_DIRS: &[(&str, u32)] = &[
    ("/tmp", 0o1777),
    ("/etc/aks-flex-node", 0o755),
    ("/var/lib/machines", 0o755),
    ("/run", 0o755),
];
/// `/var/run → ../run`: zbus (and much else) looks for the system bus at
/// `/var/run/dbus/system_bus_socket`; the entrypoint mounts the host's `/run` at `/run`.
pub const VAR_RUN_LINK: (&str, &str) = ("/var/run", "../run");
/// `/etc/nsswitch.conf`: host names from `/etc/hosts`, then DNS (both built into glibc ≥ 2.34).
pub const NSSWITCH_CONF: &str = "passwd: files\ngroup: files\nhosts: files dns\n";
/// `/etc/passwd`.
pub const PASSWD: &str = "root:x:0:0:root:/:/sbin/nologin\n";
/// `/etc/group`.
pub const GROUP: &str = "root:x:0:\n";

/// The names linked to the binary in [`IMAGE_BIN_DIR`]: [`EXTRA_LINKS`], then every host tool.
pub fn link_names() -> Vec<&'static str> {
    EXTRA_LINKS
        .iter()
        .chain(CHROOT_TOOLS)
        .chain(MOUNT_NS_TOOLS)
        .copied()
        .collect()
}

/// The image's environment.
pub fn image_env() -> Vec<String> {
    vec![
        format!("PATH={PATH}"),
        "AKS_FLEX_NODE_CONTAINERIZED=true".into(),
        format!("SSL_CERT_FILE={CA_BUNDLE}"),
    ]
}

/// Where the shared libraries come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Libraries {
    /// Ask `ldd` about the binary.
    Ldd,
    /// These files (absolute paths on the build machine, stored at the same paths).
    Explicit(Vec<PathBuf>),
}

/// Inputs of [`build_agent_image`] besides the binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentImageOptions {
    /// The image tag and `org.opencontainers.image.version`.
    pub version: String,
    /// `org.opencontainers.image.revision` (the git commit), when known.
    pub revision: Option<String>,
    /// `created` and every mtime: the commit time for reproducible images.
    pub source_date_epoch: u64,
    /// The CA bundle to copy to [`CA_BUNDLE`].
    pub ca_bundle: PathBuf,
    /// The binary's shared libraries.
    pub libraries: Libraries,
    /// gzip level (0–9).
    pub compression_level: u32,
    /// OCI architecture; the build machine's when `None`.
    pub architecture: Option<String>,
}

impl AgentImageOptions {
    /// Options for `version` at `source_date_epoch`: the machine's CA bundle, `ldd`, level 9.
    pub fn new(version: impl Into<String>, source_date_epoch: u64) -> Self {
        Self {
            version: version.into(),
            revision: None,
            source_date_epoch,
            ca_bundle: PathBuf::from(CA_BUNDLE),
            libraries: Libraries::Ldd,
            compression_level: 9,
            architecture: None,
        }
    }

    /// `name:version`.
    pub fn reference(&self) -> String {
        format!("{IMAGE_NAME}:{}", self.version)
    }
}

/// A size budget for an image: the compressed layer and the unpacked layer (tar) in bytes
/// (decimal megabytes: 1 MB = 1 000 000 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeBudget {
    /// Most bytes the compressed layer may take.
    pub compressed: u64,
    /// Most bytes the unpacked layer may take.
    pub unpacked: u64,
}

/// The agent image's budget: 8 MB compressed, 20 MB unpacked (the Go agent's image is 180 MB).
pub const AGENT_BUDGET: SizeBudget = SizeBudget {
    compressed: 8_000_000,
    unpacked: 20_000_000,
};

impl SizeBudget {
    /// What is over the budget, one phrase per size (empty when within it).
    pub fn overruns(&self, compressed: u64, unpacked: u64) -> Vec<String> {
        let mut over = Vec::new();
        for (what, size, limit) in [
            ("compressed", compressed, self.compressed),
            ("unpacked", unpacked, self.unpacked),
        ] {
            if size > limit {
                over.push(format!(
                    "{what} {size} bytes is over the budget of {limit} bytes by {}",
                    size - limit
                ));
            }
        }
        over
    }

    /// One line for a report: `within 8 MB / 20 MB (91 % / 97 %)` or `OVER: …`.
    pub fn verdict(&self, compressed: u64, unpacked: u64) -> String {
        let pct = |size: u64, limit: u64| size.saturating_mul(100) / limit.max(1);
        let over = self.overruns(compressed, unpacked);
        if over.is_empty() {
            format!(
                "within {} MB / {} MB ({} % / {} %)",
                self.compressed / 1_000_000,
                self.unpacked / 1_000_000,
                pct(compressed, self.compressed),
                pct(unpacked, self.unpacked)
            )
        } else {
            format!("OVER: {}", over.join("; "))
        }
    }
}

/// What [`build_agent_image`] produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    /// `aks-flex-node-agent:<version>`.
    pub reference: String,
    /// The manifest's digest (`sha256:…`): the image's identity.
    pub manifest_digest: String,
    /// The config's digest (containerd's "image id").
    pub config_digest: String,
    /// The layer blob's digest.
    pub layer_digest: String,
    /// The uncompressed layer's digest.
    pub diff_id: String,
    /// Compressed layer size in bytes.
    pub compressed_size: u64,
    /// Uncompressed layer (tar) size in bytes.
    pub uncompressed_size: u64,
    /// The OCI layout directory (`<out>/aks-flex-node-agent`).
    pub layout_dir: PathBuf,
    /// The OCI archive (`<out>/aks-flex-node-agent.tar`).
    pub archive: PathBuf,
    /// The archive's size in bytes.
    pub archive_size: u64,
    /// The shared libraries copied, as image paths.
    pub libraries: Vec<PathBuf>,
    /// Every path in the layer, in archive order.
    pub paths: Vec<String>,
}

/// Parses `ldd` output into the absolute paths to copy: `name => /path (addr)` and the loader's
/// `/path (addr)`; the vDSO (no path) is skipped; a `not found` library is an error.
pub fn parse_ldd(output: &str) -> Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in output.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.contains("statically linked") {
            continue;
        }
        let target = match line.split_once("=>") {
            Some((name, rest)) => {
                let rest = rest.trim();
                if rest.starts_with("not found") {
                    bail!("ldd: {} not found", name.trim());
                }
                rest
            }
            None => line,
        };
        let path = target.split_whitespace().next().unwrap_or_default();
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    libs.sort();
    libs.dedup();
    Ok(libs)
}

/// The shared libraries of `binary` (plus the dynamic loader) according to `ldd`; empty for a
/// static binary.
pub async fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let cmd = Cmd::new("ldd").arg(binary.to_string_lossy());
    let out = ProcessRunner::new()
        .output(&cmd)
        .await
        .context("run ldd (Debian package libc-bin)")?;
    let text = format!("{}{}", out.stdout, out.stderr);
    if !out.success() {
        if text.contains("not a dynamic executable") || text.contains("statically linked") {
            return Ok(Vec::new());
        }
        bail!("ldd {} failed: {}", binary.display(), text.trim());
    }
    parse_ldd(&out.stdout)
}

/// The agent image's single layer: binary, links, libraries, CA bundle and the small `/etc`
/// files, plus the empty directories.
pub fn agent_layer(binary: &Path, libraries: &[PathBuf], ca_bundle: &Path) -> Result<Layer> {
    let mut l = Layer::new();
    l.file_from(BINARY_PATH, Some(0o755), binary)
        .with_context(|| format!("the agent binary {}", binary.display()))?;
    for name in link_names() {
        l.symlink(&format!("{IMAGE_BIN_DIR}/{name}"), "aks-flex-node")?;
    }
    for lib in libraries {
        let path = lib
            .to_str()
            .filter(|p| p.starts_with('/'))
            .with_context(|| format!("library path {} is not absolute UTF-8", lib.display()))?;
        // Following symlinks: the file is stored at the path the loader asks for.
        l.file_from(path, None, lib)?;
    }
    l.file_from(CA_BUNDLE, Some(0o644), ca_bundle)
        .with_context(|| {
            format!(
                "the CA bundle {} (Debian package ca-certificates)",
                ca_bundle.display()
            )
        })?;
    l.file("/etc/nsswitch.conf", 0o644, NSSWITCH_CONF)?;
    l.file("/etc/passwd", 0o644, PASSWD)?;
    l.file("/etc/group", 0o644, GROUP)?;
    for (dir, mode) in EMPTY_DIRS {
        l.dir(dir, *mode)?;
    }
    l.symlink(VAR_RUN_LINK.0, VAR_RUN_LINK.1)?;
    Ok(l)
}

/// The agent image's config.
pub fn agent_config(opts: &AgentImageOptions) -> ImageConfig {
    let mut labels = BTreeMap::from([
        (
            "org.opencontainers.image.title".to_string(),
            IMAGE_NAME.to_string(),
        ),
        (
            "org.opencontainers.image.description".to_string(),
            "AKS Flex Node agent (runs privileged with the host's root at /host)".to_string(),
        ),
        (
            "org.opencontainers.image.version".to_string(),
            opts.version.clone(),
        ),
        (
            "org.opencontainers.image.created".to_string(),
            crate::oci::rfc3339(opts.source_date_epoch),
        ),
    ]);
    if let Some(rev) = &opts.revision {
        labels.insert("org.opencontainers.image.revision".into(), rev.clone());
    }
    ImageConfig {
        architecture: opts
            .architecture
            .clone()
            .unwrap_or_else(|| crate::oci::host_architecture().to_string()),
        os: "linux".into(),
        created: opts.source_date_epoch,
        env: image_env(),
        entrypoint: vec![ENTRYPOINT.into()],
        cmd: CMD.iter().map(|s| s.to_string()).collect(),
        working_dir: "/".into(),
        labels,
        created_by: "cargo xtask image (flex_image::build_agent_image)".into(),
    }
}

/// Builds the agent's image from `binary` into `out`: the OCI layout `out/aks-flex-node-agent/`
/// (replaced if present) and the archive `out/aks-flex-node-agent.tar`.
pub async fn build_agent_image(
    binary: &Path,
    out: &Path,
    opts: &AgentImageOptions,
) -> Result<ImageInfo> {
    let libraries = match &opts.libraries {
        Libraries::Ldd => shared_libraries(binary).await?,
        Libraries::Explicit(v) => v.clone(),
    };
    let layer = agent_layer(binary, &libraries, &opts.ca_bundle)?;
    let paths = layer.entries()?.into_iter().map(|(p, _)| p).collect();
    let blob = layer.build(opts.source_date_epoch, opts.compression_level)?;
    let mut annotations = BTreeMap::new();
    annotations.insert(
        "org.opencontainers.image.version".to_string(),
        opts.version.clone(),
    );
    if let Some(rev) = &opts.revision {
        annotations.insert("org.opencontainers.image.revision".into(), rev.clone());
    }
    let image = Image {
        name: opts.reference(),
        config: agent_config(opts),
        layers: vec![blob],
        annotations,
    };
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let layout_dir = out.join(IMAGE_NAME);
    if layout_dir.exists() {
        std::fs::remove_dir_all(&layout_dir)
            .with_context(|| format!("remove the old layout {}", layout_dir.display()))?;
    }
    let written: Vec<WrittenImage> = write_oci_layout(&layout_dir, std::slice::from_ref(&image))?;
    let w = written
        .into_iter()
        .next()
        .context("the layout holds no image")?;
    let archive = out.join(format!("{IMAGE_NAME}.tar"));
    let archive_size = write_oci_archive(&layout_dir, &archive, opts.source_date_epoch)?;
    let layer = image.layers.first().context("no layer")?;
    Ok(ImageInfo {
        reference: w.name.clone(),
        manifest_digest: w.manifest.digest.clone(),
        config_digest: w.config.digest.clone(),
        layer_digest: layer.digest.clone(),
        diff_id: layer.diff_id.clone(),
        compressed_size: layer.size,
        uncompressed_size: layer.uncompressed_size,
        layout_dir,
        archive,
        archive_size,
        libraries,
        paths,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_names_each_size_over_it() {
        let b = AGENT_BUDGET;
        assert_eq!(b.overruns(8_000_000, 20_000_000), Vec::<String>::new());
        assert_eq!(
            b.overruns(8_686_737, 19_569_152),
            vec!["compressed 8686737 bytes is over the budget of 8000000 bytes by 686737"]
        );
        assert_eq!(b.overruns(1, 30_200_000).len(), 1);
        assert_eq!(b.overruns(11_000_000, 30_200_000).len(), 2);
        assert_eq!(
            b.verdict(6_000_000, 15_000_000),
            "within 8 MB / 20 MB (75 % / 75 %)"
        );
        assert!(
            b.verdict(8_000_001, 1)
                .starts_with("OVER: compressed 8000001 bytes")
        );
    }
    use crate::layer::Entry;
    use flex_oci::{Arch, LayerFile, LayoutTarget, OciLayout, UnpackOptions, unpack};

    #[test]
    fn ldd_output_is_parsed() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x1)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x2)\n\t/lib64/ld-linux-x86-64.so.2 (0x3)\n";
        assert_eq!(
            parse_ldd(out).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert!(parse_ldd("\tstatically linked\n").unwrap().is_empty());
        let e = parse_ldd("\tlibfoo.so.1 => not found\n").unwrap_err();
        assert_eq!(e.to_string(), "ldd: libfoo.so.1 not found");
    }

    #[tokio::test]
    async fn ldd_finds_libc_and_the_loader_of_a_real_binary() {
        let libs = shared_libraries(Path::new("/bin/ls")).await.unwrap();
        assert!(
            libs.iter().any(|l| l
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("libc.so")),
            "{libs:?}"
        );
        assert!(
            libs.iter()
                .any(|l| l.to_string_lossy().contains("ld-linux")),
            "{libs:?}"
        );
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("text"), "not elf").unwrap();
        assert!(
            shared_libraries(&d.path().join("text"))
                .await
                .unwrap()
                .is_empty()
        );
    }

    struct Fixture {
        dir: tempfile::TempDir,
        binary: PathBuf,
        opts: AgentImageOptions,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("aks-flex-node");
        std::fs::write(&binary, b"\x7fELF fake agent binary").unwrap();
        let lib_dir = dir.path().join("lib");
        std::fs::create_dir_all(&lib_dir).unwrap();
        std::fs::write(lib_dir.join("libc.so.6.real"), b"fake libc").unwrap();
        std::os::unix::fs::symlink("libc.so.6.real", lib_dir.join("libc.so.6")).unwrap();
        let ca = dir.path().join("ca.crt");
        std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\nfake\n").unwrap();
        let mut opts = AgentImageOptions::new("1.2.3", 1_700_000_000);
        opts.revision = Some("0123abcd".into());
        opts.ca_bundle = ca;
        opts.libraries = Libraries::Explicit(vec![lib_dir.join("libc.so.6")]);
        opts.compression_level = 6;
        Fixture { dir, binary, opts }
    }

    #[tokio::test]
    async fn the_same_binary_and_epoch_give_the_same_digest() {
        let f = fixture();
        let a = build_agent_image(&f.binary, &f.dir.path().join("a"), &f.opts)
            .await
            .unwrap();
        let b = build_agent_image(&f.binary, &f.dir.path().join("b"), &f.opts)
            .await
            .unwrap();
        assert_eq!(a.manifest_digest, b.manifest_digest);
        assert_eq!(a.layer_digest, b.layer_digest);
        assert_eq!(
            std::fs::read(&a.archive).unwrap(),
            std::fs::read(&b.archive).unwrap()
        );
        // Rebuilding into the same directory replaces the layout without stale blobs.
        let again = build_agent_image(&f.binary, &f.dir.path().join("a"), &f.opts)
            .await
            .unwrap();
        assert_eq!(again, a);
        assert_eq!(
            std::fs::read_dir(a.layout_dir.join("blobs/sha256"))
                .unwrap()
                .count(),
            3
        );
        // Another epoch or binary is another image.
        let mut other = f.opts.clone();
        other.source_date_epoch += 1;
        let c = build_agent_image(&f.binary, &f.dir.path().join("c"), &other)
            .await
            .unwrap();
        assert_ne!(c.manifest_digest, a.manifest_digest);
        std::fs::write(&f.binary, b"\x7fELF another binary").unwrap();
        let d = build_agent_image(&f.binary, &f.dir.path().join("d"), &f.opts)
            .await
            .unwrap();
        assert_ne!(d.layer_digest, a.layer_digest);
    }

    #[tokio::test]
    async fn the_image_holds_exactly_the_agent_files_and_config() {
        let f = fixture();
        let info = build_agent_image(&f.binary, &f.dir.path().join("out"), &f.opts)
            .await
            .unwrap();
        assert_eq!(info.reference, "aks-flex-node-agent:1.2.3");
        assert_eq!(
            info.layout_dir,
            f.dir.path().join("out/aks-flex-node-agent")
        );
        assert_eq!(
            info.archive,
            f.dir.path().join("out/aks-flex-node-agent.tar")
        );

        // The agent's own OCI reader resolves the tag and unpacks the layer.
        let layout = OciLayout::open(&info.layout_dir).unwrap();
        let r = layout
            .resolve(
                &LayoutTarget::Tag("aks-flex-node-agent:1.2.3".into()),
                Arch::host(),
            )
            .unwrap();
        assert_eq!(r.digest.to_string(), info.manifest_digest);
        let layer = &r.manifest.layers[0];
        let root = f.dir.path().join("rootfs");
        std::fs::create_dir(&root).unwrap();
        unpack(
            &root,
            &[LayerFile {
                path: layout.blob_path(&layer.digest),
                media_type: layer.media_type.clone(),
                name: layer.digest.to_string(),
                diff_id: Some(info.diff_id.parse().unwrap()),
            }],
            &UnpackOptions::default(),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        let bin = root.join("opt/aks-flex-node/bin");
        assert_eq!(
            std::fs::read(bin.join("aks-flex-node")).unwrap(),
            b"\x7fELF fake agent binary"
        );
        assert_eq!(
            std::fs::metadata(bin.join("aks-flex-node"))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777,
            0o755
        );
        for name in [
            "entrypoint",
            "host-exec",
            "aks-flex-node-bootstrap",
            "systemctl",
            "umount",
            "busctl",
        ] {
            assert_eq!(
                std::fs::read_link(bin.join(name)).unwrap(),
                PathBuf::from("aks-flex-node"),
                "{name}"
            );
        }
        // The library is stored (dereferenced) at the path the loader asks for.
        let lib_in_image = root.join(
            f.dir
                .path()
                .join("lib/libc.so.6")
                .strip_prefix("/")
                .unwrap(),
        );
        assert_eq!(std::fs::read(&lib_in_image).unwrap(), b"fake libc");
        assert!(!lib_in_image.is_symlink());
        assert_eq!(
            std::fs::read_to_string(root.join("etc/nsswitch.conf")).unwrap(),
            NSSWITCH_CONF
        );
        assert!(
            std::fs::read_to_string(root.join("etc/passwd"))
                .unwrap()
                .starts_with("root:x:0:0:")
        );
        assert!(
            std::fs::read_to_string(root.join("etc/group"))
                .unwrap()
                .starts_with("root:x:0:")
        );
        assert!(root.join("etc/ssl/certs/ca-certificates.crt").is_file());
        assert_eq!(
            std::fs::metadata(root.join("tmp"))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777,
            0o1777
        );
        for d in ["etc/aks-flex-node", "var/lib/machines", "run"] {
            assert!(root.join(d).is_dir(), "{d}");
            assert_eq!(std::fs::read_dir(root.join(d)).unwrap().count(), 0, "{d}");
        }
        // No shell, no package manager.
        // No shell, no package manager; no /host (the entrypoint's "not mounted" check).
        for absent in [
            "bin/sh",
            "usr/bin/sh",
            "usr/bin/apt-get",
            "bin/busybox",
            "host",
        ] {
            assert!(!root.join(absent).exists(), "{absent}");
        }

        // Exactly these paths, nothing else.
        let lib_parts: Vec<String> = {
            let mut v = Vec::new();
            let mut p = PathBuf::from("/");
            for c in f.dir.path().join("lib/libc.so.6").components().skip(1) {
                p.push(c);
                v.push(p.display().to_string());
            }
            v
        };
        let mut expected: Vec<String> = [
            "/etc",
            "/etc/aks-flex-node",
            "/etc/group",
            "/etc/nsswitch.conf",
            "/etc/passwd",
            "/etc/ssl",
            "/etc/ssl/certs",
            "/etc/ssl/certs/ca-certificates.crt",
            "/opt",
            "/opt/aks-flex-node",
            "/opt/aks-flex-node/bin",
            "/opt/aks-flex-node/bin/aks-flex-node",
            "/run",
            "/tmp",
            "/var",
            "/var/lib",
            "/var/lib/machines",
            "/var/run",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(
            link_names()
                .iter()
                .map(|n| format!("/opt/aks-flex-node/bin/{n}")),
        )
        .chain(lib_parts)
        .collect();
        expected.sort();
        expected.dedup();
        let mut got = info.paths.clone();
        got.sort();
        assert_eq!(got, expected);

        // The config.
        let cfg_blob = std::fs::read(layout.blob_path(&r.manifest.config.digest));
        let cfg: serde_json::Value = serde_json::from_slice(&cfg_blob.unwrap()).unwrap();
        assert_eq!(cfg["created"], "2023-11-14T22:13:20Z");
        assert_eq!(
            cfg["config"]["Entrypoint"],
            serde_json::json!(["/opt/aks-flex-node/bin/entrypoint"])
        );
        assert_eq!(
            cfg["config"]["Cmd"],
            serde_json::json!([
                "aks-flex-node",
                "daemon",
                "--config",
                "/etc/aks-flex-node/config.json"
            ])
        );
        assert_eq!(
            cfg["config"]["Env"],
            serde_json::json!([
                "PATH=/opt/aks-flex-node/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "AKS_FLEX_NODE_CONTAINERIZED=true",
                "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"
            ])
        );
        assert_eq!(
            cfg["config"]["Labels"]["org.opencontainers.image.version"],
            "1.2.3"
        );
        assert_eq!(
            cfg["config"]["Labels"]["org.opencontainers.image.revision"],
            "0123abcd"
        );
        assert_eq!(cfg["rootfs"]["diff_ids"], serde_json::json!([info.diff_id]));

        // Every tar entry: uid/gid 0, mtime = epoch.
        let gz = std::fs::read(layout.blob_path(&layer.digest)).unwrap();
        let mut a = tar::Archive::new(flate2::read::GzDecoder::new(gz.as_slice()));
        for e in a.entries().unwrap() {
            let e = e.unwrap();
            let h = e.header();
            assert_eq!(
                (h.uid().unwrap(), h.gid().unwrap(), h.mtime().unwrap()),
                (0, 0, 1_700_000_000)
            );
        }
        // The layout's entries in the layer match what Layer::entries lists.
        let l = agent_layer(&f.binary, &[], &f.opts.ca_bundle).unwrap();
        assert!(matches!(l.get("/tmp"), Some(Entry::Dir { mode: 0o1777 })));
    }

    #[tokio::test]
    async fn a_missing_ca_bundle_names_the_package() {
        let mut f = fixture();
        f.opts.ca_bundle = f.dir.path().join("missing.crt");
        let e = build_agent_image(&f.binary, &f.dir.path().join("o"), &f.opts)
            .await
            .unwrap_err();
        assert!(format!("{e:#}").contains("ca-certificates"), "{e:#}");
    }
}
