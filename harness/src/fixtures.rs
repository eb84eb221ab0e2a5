//! What the offline checks need besides the dev host, each built once and cached by recipe
//! hash under `<cache_root>/fixtures/` (built in a `.build-*` directory next to it and renamed
//! into place when complete):
//!
//! - [`machine_rootfs`]: the root file system tree of the nspawn machines,
//!   `mmdebstrap --variant=minbase` of [`MACHINE_PACKAGES`] (systemd, dbus, …; no kernel), enough
//!   for `machinectl shell` and `systemd-run --machine=…`. The harness packs it into the OCI
//!   image the agent pulls. Cached as `machine-<suite>-<hash[..16]>/rootfs`.
//! - [`offline_bundle`]: an offline component bundle in the layout of
//!   `docs/offline-artifacts.md`. containerd, ctr, the shims and runc are Debian's
//!   (`containerd`, `runc`), the CNI plugins are Debian's `containernetworking-plugins`; what
//!   Debian does not ship is a **test fixture**: `#!/bin/sh` stand-ins for kubelet, kubectl,
//!   kube-proxy and crictl (`--version` prints what the agent's skip rule expects; kubelet
//!   otherwise logs a line and sleeps), `containerd-stress`, and a `loopback` wrapper that
//!   answers `--version` (Debian's plugins say "version unknown") and runs Debian's plugin.
//!   The bundle's `README.md` says the same. [`BundleVersions`] are the versions the agent's
//!   config must name. Cached as `bundle-<hash[..16]>/bundle` (+ `versions.json` beside it).
//!
//! Both are built from [`FIXTURE_SUITE`] with mmdebstrap as root, like the dev host, from this
//! machine's Debian mirror ([`crate::devhost::host_archive`]) through its apt proxy, if any;
//! the mirror lines are part of each recipe hash.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use flex_host::apt::DebianArchive;
use flex_host::runner::{Cmd, Runner};

use crate::devhost::{
    DPKG_OPTIONS, RecipeHasher, Suite, archive_summary, build_dir, clean_stale_builds,
    discard_incomplete, ensure_tool, host_archive, lock, publish, remove_build_dir, require_root,
    run_logged, tree_size, with_apt_proxy, write_file,
};

/// The Debian release the fixtures come from (the machines' OS and the bundle's binaries).
pub const FIXTURE_SUITE: Suite = Suite::Bookworm;

/// The Kubernetes version of the stand-ins (`components.kubernetes`).
pub const KUBERNETES_VERSION: &str = "1.35.0";

/// The machine tree's packages on top of `minbase` (no kernel).
pub const MACHINE_PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "dbus",
    "iproute2",
    "kmod",
    "procps",
    "ca-certificates",
];

/// The Debian packages the bundle's real binaries come from.
pub const BUNDLE_PACKAGES: &[&str] = &["containerd", "runc", "containernetworking-plugins"];

/// mmdebstrap customize hooks of the machine tree: no `/etc/hostname` (the machine keeps the
/// name systemd-nspawn gives it), an empty `/etc/resolv.conf` (mmdebstrap copies both from the
/// build machine), and an `/etc/hosts` for localhost, as a distribution image has (minbase has
/// none; containerd copies the node's into every host-network pod and fails without it: found
/// joining a real control plane).
pub const MACHINE_HOOKS: &[&str] = &[
    r#"rm -f "$1/etc/hostname""#,
    r#": > "$1/etc/resolv.conf""#,
    r#"printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' > "$1/etc/hosts""#,
];

/// The architecture of the bundle's files.
pub const ARCH: &str = "amd64";

/// Bumped when the machine build changes in a way the hashed inputs do not show.
const MACHINE_RECIPE_VERSION: &str = "machine-rootfs-1";
/// Bumped when the bundle build changes in a way the hashed inputs do not show.
const BUNDLE_RECIPE_VERSION: &str = "offline-bundle-2";

/// A test-fixture script of the bundle: its name and its template (`@VERSION@` is replaced).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StandIn {
    /// File name.
    pub name: &'static str,
    /// Template text.
    pub template: &'static str,
}

/// The bundle's test fixtures.
pub const STAND_INS: &[StandIn] = &[
    StandIn {
        name: "kubelet",
        template: include_str!("fixtures/kubelet"),
    },
    StandIn {
        name: "kubectl",
        template: include_str!("fixtures/kubectl"),
    },
    StandIn {
        name: "kube-proxy",
        template: include_str!("fixtures/kube-proxy"),
    },
    StandIn {
        name: "crictl",
        template: include_str!("fixtures/crictl"),
    },
    StandIn {
        name: "containerd-stress",
        template: include_str!("fixtures/containerd-stress"),
    },
    StandIn {
        name: "loopback",
        template: include_str!("fixtures/loopback"),
    },
    StandIn {
        name: "node-problem-detector",
        template: include_str!("fixtures/node-problem-detector"),
    },
];

/// The bundle's README template.
pub const README_TEMPLATE: &str = include_str!("fixtures/README.md");

/// The component versions of the bundle, without a leading `v`: write them into the agent's
/// config (`components.kubernetes`, `components.containerd`, `components.runc`,
/// `networking.cniVersion`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleVersions {
    /// kubelet, kubectl, kube-proxy (test fixtures).
    pub kubernetes: String,
    /// containerd (Debian's, upstream part of the package version).
    pub containerd: String,
    /// runc (Debian's).
    pub runc: String,
    /// CNI plugins (Debian's).
    pub cni: String,
}

impl BundleVersions {
    /// crictl's version, as the agent derives it: `<major>.<minor>.0` of Kubernetes.
    pub fn crictl(&self) -> Result<String> {
        flex_api::versions::crictl_version_for(&self.kubernetes).map_err(anyhow::Error::from)
    }
}

/// The Debian package versions the bundle's real binaries come from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DebianVersions {
    /// `containerd`.
    pub containerd: String,
    /// `runc`.
    pub runc: String,
    /// `containernetworking-plugins`.
    pub cni: String,
}

/// `versions.json` beside the bundle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleRecord {
    /// For the agent's config.
    pub versions: BundleVersions,
    /// Where they come from.
    pub debian: DebianVersions,
    /// The recipe hash.
    pub recipe_hash: String,
}

/// The upstream version inside a Debian package version: no epoch, cut at the first `~`, `+`
/// or `-` (`1.6.20~ds1-1+deb12u3` → `1.6.20`). It must look like a version.
pub fn debian_upstream_version(deb: &str) -> Result<String> {
    let no_epoch = deb.split_once(':').map_or(deb, |(_, v)| v).trim();
    let v = no_epoch.split(['~', '+', '-']).next().unwrap_or_default();
    let ok = v.starts_with(|c: char| c.is_ascii_digit())
        && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '.');
    if !ok {
        bail!("cannot take an upstream version from Debian version {deb:?}");
    }
    Ok(v.to_string())
}

/// A stand-in's text for `version`.
pub fn render_stand_in(s: &StandIn, version: &str) -> String {
    s.template.replace("@VERSION@", version)
}

fn stand_in(name: &str) -> Result<&'static StandIn> {
    STAND_INS
        .iter()
        .find(|s| s.name == name)
        .with_context(|| format!("no stand-in {name}"))
}

/// The bundle's `README.md`.
pub fn render_readme(v: &BundleVersions, deb: &DebianVersions) -> Result<String> {
    Ok(README_TEMPLATE
        .replace("@KUBERNETES@", &v.kubernetes)
        .replace("@CRICTL@", &v.crictl()?)
        .replace("@CONTAINERD_DEB@", &deb.containerd)
        .replace("@CONTAINERD@", &v.containerd)
        .replace("@RUNC_DEB@", &deb.runc)
        .replace("@RUNC@", &v.runc)
        .replace("@CNI_DEB@", &deb.cni)
        .replace("@CNI@", &v.cni))
}

/// The bundle's file names for `v` (release-asset names, `docs/offline-artifacts.md`).
pub fn bundle_file_names(v: &BundleVersions) -> Result<Vec<String>> {
    let crictl = v.crictl()?;
    let mut names: Vec<String> = ["kubelet", "kubectl", "kube-proxy"]
        .iter()
        .flat_map(|b| [format!("kubernetes/{b}"), format!("kubernetes/{b}.sha256")])
        .collect();
    names.extend([
        format!("crictl-v{crictl}-linux-{ARCH}.tar.gz"),
        format!("containerd-{}-linux-{ARCH}.tar.gz", v.containerd),
        format!("runc.{ARCH}"),
        format!("cni-plugins-linux-{ARCH}-v{}.tgz", v.cni),
        "README.md".to_string(),
    ]);
    Ok(names)
}

/// Recipe hash of the machine tree, built from `archive`. Pure.
pub fn machine_recipe_hash(archive: &DebianArchive) -> String {
    let mut h = RecipeHasher::default();
    h.part("recipe", MACHINE_RECIPE_VERSION.as_bytes())
        .part("suite", FIXTURE_SUITE.name().as_bytes())
        .part(
            "mirrors",
            FIXTURE_SUITE.mirrors(archive).join("\n").as_bytes(),
        )
        .part("variant", b"minbase")
        .part("arch", ARCH.as_bytes())
        .part("packages", MACHINE_PACKAGES.join(",").as_bytes())
        .part("dpkgopt", DPKG_OPTIONS.join("\n").as_bytes())
        .part("hooks", MACHINE_HOOKS.join("\n").as_bytes());
    h.finish()
}

/// Recipe hash of the offline bundle, built from `archive`. Pure.
pub fn bundle_recipe_hash(archive: &DebianArchive) -> String {
    hash_bundle_recipe(archive, STAND_INS, README_TEMPLATE)
}

fn hash_bundle_recipe(archive: &DebianArchive, stand_ins: &[StandIn], readme: &str) -> String {
    let mut h = RecipeHasher::default();
    h.part("recipe", BUNDLE_RECIPE_VERSION.as_bytes())
        .part("suite", FIXTURE_SUITE.name().as_bytes())
        .part(
            "mirrors",
            FIXTURE_SUITE.mirrors(archive).join("\n").as_bytes(),
        )
        .part("arch", ARCH.as_bytes())
        .part("packages", BUNDLE_PACKAGES.join(",").as_bytes())
        .part("kubernetes", KUBERNETES_VERSION.as_bytes())
        .part("readme", readme.as_bytes());
    for s in stand_ins {
        h.part("stand-in", s.name.as_bytes())
            .part("template", s.template.as_bytes());
    }
    h.finish()
}

/// Where the machine tree built from `archive` is (or will be) under `cache_root`.
pub fn machine_rootfs_dir(cache_root: &Path, archive: &DebianArchive) -> PathBuf {
    cache_root
        .join("fixtures")
        .join(format!(
            "machine-{FIXTURE_SUITE}-{}",
            &machine_recipe_hash(archive)[..16]
        ))
        .join("rootfs")
}

/// Where the bundle built from `archive` is (or will be) under `cache_root`.
pub fn bundle_dir(cache_root: &Path, archive: &DebianArchive) -> PathBuf {
    cache_root
        .join("fixtures")
        .join(format!("bundle-{}", &bundle_recipe_hash(archive)[..16]))
        .join("bundle")
}

fn mmdebstrap_base(variant: &str, include: &[&str]) -> Vec<String> {
    vec![
        "--mode=root".to_string(),
        format!("--variant={variant}"),
        format!("--architectures={ARCH}"),
        "--format=directory".to_string(),
        format!("--include={}", include.join(",")),
    ]
}

/// mmdebstrap's argv for the machine tree at `tree`, from `archive`.
pub fn machine_mmdebstrap_args(tree: &Path, archive: &DebianArchive) -> Vec<String> {
    let mut a = mmdebstrap_base("minbase", MACHINE_PACKAGES);
    a.extend(DPKG_OPTIONS.iter().map(|o| format!("--dpkgopt={o}")));
    a.extend(
        MACHINE_HOOKS
            .iter()
            .map(|h| format!("--customize-hook={h}")),
    );
    a.push(FIXTURE_SUITE.name().to_string());
    a.push(tree.display().to_string());
    a.extend(FIXTURE_SUITE.mirrors(archive));
    a
}

/// mmdebstrap's argv that downloads and extracts [`BUNDLE_PACKAGES`] (and their dependencies)
/// from `archive` into `dir`, keeping the `.deb` files in its `var/cache/apt/archives`.
pub fn bundle_mmdebstrap_args(dir: &Path, archive: &DebianArchive) -> Vec<String> {
    let mut a = mmdebstrap_base("extract", BUNDLE_PACKAGES);
    a.push("--skip=cleanup/apt/cache".to_string());
    a.push(FIXTURE_SUITE.name().to_string());
    a.push(dir.display().to_string());
    a.extend(FIXTURE_SUITE.mirrors(archive));
    a
}

async fn prepare(
    runner: &dyn Runner,
    cache_root: &Path,
    what: &str,
    progress: &dyn Fn(&str),
) -> Result<()> {
    if std::env::consts::ARCH != "x86_64" {
        bail!("the {what} is amd64; build it on an x86_64 machine");
    }
    require_root(&format!("building the {what}"))?;
    ensure_tool(runner, "mmdebstrap", "mmdebstrap", progress).await?;
    ensure_tool(runner, "dpkg-deb", "dpkg", progress).await?;
    std::fs::create_dir_all(cache_root.join("fixtures"))
        .with_context(|| format!("creating {}", cache_root.join("fixtures").display()))?;
    Ok(())
}

/// The nspawn machines' root file system tree (a directory), built on first use from this
/// machine's Debian mirror (about a minute; needs root and mmdebstrap).
pub async fn machine_rootfs(runner: &dyn Runner, cache_root: &Path) -> Result<PathBuf> {
    machine_rootfs_with(runner, cache_root, &|_| {}).await
}

/// [`machine_rootfs`] with progress lines.
pub async fn machine_rootfs_with(
    runner: &dyn Runner,
    cache_root: &Path,
    progress: &dyn Fn(&str),
) -> Result<PathBuf> {
    let archive = host_archive()?;
    let tree = machine_rootfs_dir(cache_root, &archive);
    let done = |t: &Path| {
        t.join("usr/lib/systemd/systemd").exists() || t.join("lib/systemd/systemd").exists()
    };
    if done(&tree) {
        return Ok(tree);
    }
    prepare(runner, cache_root, "machine root file system", progress).await?;
    let parent = cache_root.join("fixtures");
    let _lock = lock(&parent, progress).await?;
    if done(&tree) {
        return Ok(tree);
    }
    clean_stale_builds(&parent, progress);
    let final_dir = tree
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| parent.clone());
    let name = final_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "machine".into());
    discard_incomplete(&final_dir, progress)?;
    let work = build_dir(&parent, &name)?;
    let started = Instant::now();
    progress(&format!(
        "building the machine root file system ({FIXTURE_SUITE} minbase + {}) from {}",
        MACHINE_PACKAGES.join(","),
        archive_summary(&archive)
    ));
    let cmd = Cmd::new("mmdebstrap")
        .args(machine_mmdebstrap_args(&work.join("rootfs"), &archive))
        .timeout(Duration::from_secs(3600));
    let cmd = with_apt_proxy(runner, cmd, progress).await;
    run_logged(runner, &cmd, &work.join("build.log"))
        .await
        .with_context(|| {
            format!(
                "building the machine root file system in {}",
                work.display()
            )
        })?;
    let bytes = tree_size(&work.join("rootfs"));
    let info = serde_json::json!({
        "suite": FIXTURE_SUITE,
        "packages": MACHINE_PACKAGES,
        "recipe_hash": machine_recipe_hash(&archive),
        "build_seconds": started.elapsed().as_secs_f64(),
        "tree_bytes": bytes,
    });
    write_file(
        &work,
        "machine.json",
        serde_json::to_string_pretty(&info)?.as_bytes(),
        0o644,
    )?;
    publish(&work, &final_dir)?;
    progress(&format!(
        "machine root file system ready in {:.0} s: {} ({} MB)",
        started.elapsed().as_secs_f64(),
        tree.display(),
        bytes / 1_000_000
    ));
    Ok(tree)
}

/// The offline component bundle directory and its versions, built on first use from this
/// machine's Debian mirror (seconds after the download; needs root and mmdebstrap).
pub async fn offline_bundle(
    runner: &dyn Runner,
    cache_root: &Path,
) -> Result<(PathBuf, BundleVersions)> {
    offline_bundle_with(runner, cache_root, &|_| {}).await
}

/// [`offline_bundle`] with progress lines.
pub async fn offline_bundle_with(
    runner: &dyn Runner,
    cache_root: &Path,
    progress: &dyn Fn(&str),
) -> Result<(PathBuf, BundleVersions)> {
    let archive = host_archive()?;
    let bundle = bundle_dir(cache_root, &archive);
    let final_dir = bundle
        .parent()
        .map(Path::to_path_buf)
        .context("bundle directory has no parent")?;
    if let Some(v) = read_record(&final_dir) {
        return Ok((bundle, v.versions));
    }
    prepare(runner, cache_root, "offline component bundle", progress).await?;
    let parent = cache_root.join("fixtures");
    let _lock = lock(&parent, progress).await?;
    if let Some(v) = read_record(&final_dir) {
        return Ok((bundle, v.versions));
    }
    clean_stale_builds(&parent, progress);
    let name = final_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "bundle".into());
    discard_incomplete(&final_dir, progress)?;
    let work = build_dir(&parent, &name)?;
    let started = Instant::now();
    progress(&format!(
        "building the offline component bundle from Debian {FIXTURE_SUITE} ({}) from {}",
        BUNDLE_PACKAGES.join(", "),
        archive_summary(&archive)
    ));
    let record = build_bundle(runner, &work, &archive, progress)
        .await
        .with_context(|| format!("building the offline bundle in {}", work.display()))?;
    publish(&work, &final_dir)?;
    progress(&format!(
        "offline bundle ready in {:.0} s: {} (kubernetes {}, containerd {}, runc {}, cni {})",
        started.elapsed().as_secs_f64(),
        bundle.display(),
        record.versions.kubernetes,
        record.versions.containerd,
        record.versions.runc,
        record.versions.cni
    ));
    Ok((bundle, record.versions))
}

fn read_record(dir: &Path) -> Option<BundleRecord> {
    let bytes = std::fs::read(dir.join("versions.json")).ok()?;
    let r: BundleRecord = serde_json::from_slice(&bytes).ok()?;
    dir.join("bundle").is_dir().then_some(r)
}

/// The real binaries that go into the bundle.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BundleInputs {
    /// containerd's binaries: `(name, file)`, installed as `bin/<name>`.
    pub containerd: Vec<(String, PathBuf)>,
    /// runc.
    pub runc: PathBuf,
    /// CNI plugins: `(name, file)`; `loopback` is renamed `loopback.debian` behind the wrapper.
    pub cni: Vec<(String, PathBuf)>,
}

async fn build_bundle(
    runner: &dyn Runner,
    work: &Path,
    archive: &DebianArchive,
    progress: &dyn Fn(&str),
) -> Result<BundleRecord> {
    let log = work.join("build.log");
    let debs = work.join("debs");
    let cmd = Cmd::new("mmdebstrap")
        .args(bundle_mmdebstrap_args(&debs, archive))
        .timeout(Duration::from_secs(1800));
    let cmd = with_apt_proxy(runner, cmd, progress).await;
    run_logged(runner, &cmd, &log).await?;
    let archives = debs.join("var/cache/apt/archives");
    let deb_version = |pkg: &str| {
        let archives = archives.clone();
        let pkg = pkg.to_string();
        async move {
            let deb = crate::devhost::single_entry(&archives, &format!("{pkg}_"))?;
            let out = runner
                .run(
                    &Cmd::new("dpkg-deb")
                        .args(["--field"])
                        .arg(deb.display().to_string())
                        .arg("Version"),
                )
                .await?;
            anyhow::Ok(out.stdout.trim().to_string())
        }
    };
    let debian = DebianVersions {
        containerd: deb_version("containerd").await?,
        runc: deb_version("runc").await?,
        cni: deb_version("containernetworking-plugins").await?,
    };
    let versions = BundleVersions {
        kubernetes: KUBERNETES_VERSION.to_string(),
        containerd: debian_upstream_version(&debian.containerd)?,
        runc: debian_upstream_version(&debian.runc)?,
        cni: debian_upstream_version(&debian.cni)?,
    };
    progress(&format!(
        "Debian packages: containerd {}, runc {}, containernetworking-plugins {}",
        debian.containerd, debian.runc, debian.cni
    ));

    let mut inputs = BundleInputs::default();
    let bin = debs.join("usr/bin");
    for e in std::fs::read_dir(&bin).with_context(|| format!("listing {}", bin.display()))? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if (name.starts_with("containerd") || name == "ctr") && e.path().is_file() {
            inputs.containerd.push((name, e.path()));
        }
    }
    inputs.containerd.sort();
    inputs.runc = ["usr/sbin/runc", "usr/bin/runc"]
        .iter()
        .map(|p| debs.join(p))
        .find(|p| p.is_file())
        .context("the runc package has no usr/sbin/runc or usr/bin/runc")?;
    let cni = debs.join("usr/lib/cni");
    for e in std::fs::read_dir(&cni).with_context(|| format!("listing {}", cni.display()))? {
        let e = e?;
        if e.path().is_file() {
            inputs
                .cni
                .push((e.file_name().to_string_lossy().into_owned(), e.path()));
        }
    }
    inputs.cni.sort();

    // The versions the agent checks must be what Debian's binaries print.
    let containerd = debs.join("usr/bin/containerd");
    for (probe, want) in [
        (&containerd, &versions.containerd),
        (&inputs.runc, &versions.runc),
    ] {
        match runner
            .output(&Cmd::new(probe.display().to_string()).arg("--version"))
            .await
        {
            Ok(out) if out.success() => {
                if !out.stdout.contains(want.as_str()) {
                    bail!(
                        "{} --version prints {:?}, which does not contain {want}",
                        probe.display(),
                        out.stdout.trim()
                    );
                }
            }
            Ok(out) => progress(&format!(
                "could not check {} --version (exit {:?}): {}",
                probe.display(),
                out.code,
                out.stderr.trim()
            )),
            Err(e) => progress(&format!("could not check the version: {e}")),
        }
    }

    write_bundle(&work.join("bundle"), &inputs, &versions, &debian)?;
    if !remove_build_dir(&debs)? {
        bail!("{} still has mounts inside", debs.display());
    }
    let record = BundleRecord {
        versions,
        debian,
        recipe_hash: bundle_recipe_hash(archive),
    };
    write_file(
        work,
        "versions.json",
        serde_json::to_string_pretty(&record)?.as_bytes(),
        0o644,
    )?;
    Ok(record)
}

/// Writes the bundle into `dest` (created): the stand-ins with their `.sha256` files, the
/// crictl, containerd and CNI archives, `runc.<arch>` and `README.md`.
pub fn write_bundle(
    dest: &Path,
    inputs: &BundleInputs,
    v: &BundleVersions,
    deb: &DebianVersions,
) -> Result<()> {
    std::fs::create_dir_all(dest.join("kubernetes"))
        .with_context(|| format!("creating {}", dest.display()))?;
    for b in KUBERNETES_BINARIES {
        let text = render_stand_in(stand_in(b)?, &v.kubernetes);
        write_kubernetes_binary(dest, b, text.as_bytes())?;
    }
    write_crictl(dest, &v.crictl()?)?;
    let mut members: Vec<(String, Member)> = inputs
        .containerd
        .iter()
        .map(|(n, p)| (format!("bin/{n}"), Member::File(p.clone())))
        .collect();
    if !inputs
        .containerd
        .iter()
        .any(|(n, _)| n == "containerd-stress")
    {
        let text = render_stand_in(stand_in("containerd-stress")?, &v.containerd);
        members.push(("bin/containerd-stress".into(), Member::Text(text)));
    }
    members.sort_by(|a, b| a.0.cmp(&b.0));
    write_tgz(
        &dest.join(format!("containerd-{}-linux-{ARCH}.tar.gz", v.containerd)),
        members,
    )?;
    let runc = dest.join(format!("runc.{ARCH}"));
    std::fs::copy(&inputs.runc, &runc)
        .with_context(|| format!("copying {} to {}", inputs.runc.display(), runc.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&runc, std::fs::Permissions::from_mode(0o755))?;
    }
    let mut members: Vec<(String, Member)> = Vec::new();
    for (n, p) in &inputs.cni {
        if n == "loopback" {
            members.push(("loopback.debian".into(), Member::File(p.clone())));
            let text = render_stand_in(stand_in("loopback")?, &v.cni);
            members.push(("loopback".into(), Member::Text(text)));
        } else {
            members.push((n.clone(), Member::File(p.clone())));
        }
    }
    members.sort_by(|a, b| a.0.cmp(&b.0));
    write_tgz(
        &dest.join(format!("cni-plugins-linux-{ARCH}-v{}.tgz", v.cni)),
        members,
    )?;
    write_npd(dest)?;
    write_file(dest, "README.md", render_readme(v, deb)?.as_bytes(), 0o644)?;
    Ok(())
}

/// node-problem-detector's release archive at the agent's default version, its stand-in as
/// `bin/node-problem-detector` and a kernel monitor configuration, with the `.sha256` the
/// agent checks it against (upstream's releases have none: a mirror or the bundle provides it).
fn write_npd(dest: &Path) -> Result<()> {
    let v = flex_api::versions::DEFAULT_NPD_VERSION;
    let name = format!("node-problem-detector-{v}-linux_{ARCH}.tar.gz");
    let archive = dest.join(&name);
    write_tgz(
        &archive,
        vec![
            (
                "bin/node-problem-detector".into(),
                Member::Text(render_stand_in(stand_in("node-problem-detector")?, v)),
            ),
            (
                "config/kernel-monitor.json".into(),
                Member::Text(NPD_KERNEL_MONITOR.into()),
            ),
        ],
    )?;
    let bytes =
        std::fs::read(&archive).with_context(|| format!("reading {}", archive.display()))?;
    let sum = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
    write_file(
        dest,
        &format!("{name}.sha256"),
        format!("{sum}  {name}\n").as_bytes(),
        0o644,
    )
}

/// The bundle's kernel monitor configuration for node-problem-detector (the stand-in does not
/// read it; the agent installs it where the real one would).
const NPD_KERNEL_MONITOR: &str =
    "{\"plugin\": \"kmsg\", \"source\": \"kernel-monitor\", \"rules\": []}\n";

/// The Kubernetes binaries a bundle can take from a directory (`up --k8s-bin-dir`).
pub const KUBERNETES_BINARIES: &[&str] = &["kubelet", "kubectl", "kube-proxy"];

/// The version `kubelet --version` prints (`Kubernetes v1.36.2`), without its `v`.
pub fn parse_kubelet_version(out: &str) -> Result<String> {
    let v = out
        .split_whitespace()
        .find_map(|w| w.strip_prefix('v'))
        .filter(|v| flex_api::versions::is_version(v))
        .with_context(|| format!("kubelet --version printed no version: {:?}", out.trim()))?;
    Ok(v.to_string())
}

/// `base` (a bundle [`write_bundle`] wrote for `v`) copied into `dest` (replaced) with the real
/// Kubernetes binaries of `bin_dir` in place of the stand-ins ([`KUBERNETES_BINARIES`], each
/// with its `.sha256`), at `version` (what its kubelet says), and crictl's stand-in at the
/// version the agent derives from it; returns the bundle's versions. For a node that joins a
/// real cluster offline.
pub fn bundle_with_kubernetes(
    base: &Path,
    v: &BundleVersions,
    bin_dir: &Path,
    version: &str,
    dest: &Path,
) -> Result<BundleVersions> {
    for b in KUBERNETES_BINARIES {
        let f = bin_dir.join(b);
        if !f.is_file() {
            bail!("{} is not in {} (--k8s-bin-dir)", b, bin_dir.display());
        }
    }
    if dest.exists() {
        std::fs::remove_dir_all(dest).with_context(|| format!("removing {}", dest.display()))?;
    }
    crate::devhost::copy_tree(base, dest)?;
    for b in KUBERNETES_BINARIES {
        let bytes = std::fs::read(bin_dir.join(b))
            .with_context(|| format!("reading {}", bin_dir.join(b).display()))?;
        write_kubernetes_binary(dest, b, &bytes)?;
    }
    let old = dest.join(format!("crictl-v{}-linux-{ARCH}.tar.gz", v.crictl()?));
    std::fs::remove_file(&old).with_context(|| format!("removing {}", old.display()))?;
    let out = BundleVersions {
        kubernetes: version.to_string(),
        ..v.clone()
    };
    write_crictl(dest, &out.crictl()?)?;
    let readme = dest.join("README.md");
    let mut text = std::fs::read_to_string(&readme).unwrap_or_default();
    text.push_str(&format!(
        "\nkubelet, kubectl and kube-proxy in this copy are real binaries (Kubernetes {version}) from {}, not stand-ins.\n",
        bin_dir.display()
    ));
    write_file(dest, "README.md", text.as_bytes(), 0o644)?;
    Ok(out)
}

/// `kubernetes/<name>` (0755) and its `.sha256` as dl.k8s.io publishes it: the hex digest alone.
fn write_kubernetes_binary(dest: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    write_file(dest, &format!("kubernetes/{name}"), bytes, 0o755)?;
    let sum = hex::encode(Sha256::digest(bytes));
    write_file(
        dest,
        &format!("kubernetes/{name}.sha256"),
        sum.as_bytes(),
        0o644,
    )
}

/// The crictl stand-in's archive for version `crictl`, as cri-tools names it.
fn write_crictl(dest: &Path, crictl: &str) -> Result<()> {
    write_tgz(
        &dest.join(format!("crictl-v{crictl}-linux-{ARCH}.tar.gz")),
        vec![(
            "crictl".into(),
            Member::Text(render_stand_in(stand_in("crictl")?, crictl)),
        )],
    )
}

/// One member of a generated archive.
enum Member {
    /// A file's bytes.
    File(PathBuf),
    /// Text.
    Text(String),
}

/// A gzip tar of regular 0755 members owned by root with mtime 0 (reproducible).
fn write_tgz(path: &Path, members: Vec<(String, Member)>) -> Result<()> {
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (name, m) in members {
        let bytes = match m {
            Member::File(p) => {
                let mut b = Vec::new();
                std::fs::File::open(&p)
                    .and_then(|mut f| f.read_to_end(&mut b))
                    .with_context(|| format!("reading {}", p.display()))?;
                b
            }
            Member::Text(t) => t.into_bytes(),
        };
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(bytes.len() as u64);
        h.set_mode(0o755);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        tar.append_data(&mut h, &name, bytes.as_slice())
            .with_context(|| format!("adding {name} to {}", path.display()))?;
    }
    tar.into_inner()
        .and_then(|gz| gz.finish())
        .with_context(|| format!("finishing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests;
