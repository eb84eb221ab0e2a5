//! The dev host: the embedded default OS of `cargo xtask up`, an ACL-like Debian guest built
//! offline from Debian packages with mmdebstrap, following the measured recipe in
//! `shared/spec/guest-host.md` (§3.1 image, §5.3 first boot).
//!
//! What it has, and why:
//! - systemd as PID 1, containerd + runc, systemd-nspawn/machinectl, dbus, nftables, the
//!   Debian cloud kernel (booted directly: [`DevHostImage::kernel`], [`DevHostImage::initrd`]);
//! - a read-only `/usr` (`usr-readonly.service`, a ro bind mount with a retry loop) and a
//!   writable `/usr/local` overlay whose upper/work live in `/var/lib/usr-local`, as on ACL;
//! - first-boot provisioning by Debian's real Ignition 2.14 from fw_cfg key
//!   [`FWCFG_IGNITION_KEY`] (spec ≤ [`IGNITION_SPEC_VERSION`]), run by the
//!   `init=/usr/local/sbin/firstboot-init` wrapper before systemd starts (with the `setfiles`
//!   shim, `SELINUXTYPE=none` and `systemctl preset` of the units Ignition enabled);
//! - systemd-networkd DHCP on `eth0` (`net.ifnames=0`), key-only sshd that also reads
//!   `~/.ssh/authorized_keys.d/ignition` (where this Ignition writes keys), passwordless sudo
//!   for the `sudo` group, no root password and no console autologin;
//! - [`BOOT_MARKER`] on ttyS0 once `multi-user.target` is reached.
//!
//! [`Variant::Selinux`] is the SELinux-enforcing dev host of `up --selinux`: Debian's reference
//! policy with refpolicy's container module built from Debian's policy source, the tree labelled
//! at build by `setfiles`, a local policy module (`devhost/flex-devhost.cil`) and one local file
//! context (`docs/SELINUX.md`).
//!
//! [`ensure`] builds it once per recipe: the image lives in
//! `<cache_root>/devhost/<suite>-<hash[..16]>/` (`rootfs.img`, an 8 GiB sparse raw ext4 file
//! system labelled `root`; `vmlinuz`; `initrd.img`; `image.json`), keyed by
//! [`recipe_hash`] over the package list, every asset's bytes and the build parameters. The
//! packages come from the build machine's own Debian mirror ([`flex_host::apt`]: the URIs and
//! keyring of its Debian source, deb.debian.org only when it has none) through its apt proxy,
//! if any ([`Suite::mirrors`]). A
//! build happens in `.build-*` next to it and is renamed into place when complete, so a
//! half-built image is never used; an image is never rebuilt in place (a qcow2 overlay may
//! point at it).

mod build;

pub use build::host_archive;
pub(crate) use build::{
    RecipeHasher, allocated_bytes, archive_summary, build_dir, clean_stale_builds, copy_tree,
    ensure_tool, lock, publish, remove_build_dir, require_root, run_logged, sh_quote, single_entry,
    with_apt_proxy, write_file,
};

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use flex_host::apt::DebianArchive;
use flex_host::runner::{Cmd, Runner};

/// The fw_cfg key the dev host's Ignition reads its config from (Debian's Ignition 2.14 reads
/// only this one).
pub const FWCFG_IGNITION_KEY: &str = crate::qemu::FWCFG_COREOS;

/// The newest Ignition config spec the dev host's Ignition (Debian 2.14) accepts; render this
/// version for the dev host.
pub const IGNITION_SPEC_VERSION: &str = "3.3.0";

/// Written to ttyS0 by `boot-marker.service` once `multi-user.target` is reached.
pub const BOOT_MARKER: &str = "=== MULTI-USER.TARGET REACHED ===";

/// Printed on the console by `firstboot-init` when Ignition fails (followed by `rc=<n> ===`).
pub const IGNITION_FAILED_MARKER: &str = "=== IGNITION FAILED";

/// The image's `/etc/hostname`. An Ignition config that sets the hostname must write
/// `/etc/hostname` with `overwrite: true` (the file exists).
pub const PLACEHOLDER_HOSTNAME: &str = "flex-devhost";

/// Size of `rootfs.img` (sparse; machines need room).
pub const IMAGE_SIZE_BYTES: u64 = 8 << 30;

/// Label of the root file system.
pub const ROOT_LABEL: &str = "root";

/// Bumped when the build steps change in a way the other hashed inputs do not show.
const RECIPE_VERSION: &str = "devhost-recipe-1";

/// The packages installed on top of mmdebstrap's `minbase` (which skips Recommends, so `udev`
/// is listed explicitly). Besides the recipe's list: `curl` (the agent's install-packages
/// checks for it), `iptables` (reset's legacy-CNI cleanup), `libpam-systemd` (logind sessions
/// for SSH logins) and `libnss-myhostname` (whatever hostname Ignition sets resolves).
pub const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "udev",
    "dbus",
    "systemd-container",
    "containerd",
    "runc",
    "iproute2",
    "nftables",
    "iptables",
    "util-linux",
    "mount",
    "kmod",
    "e2fsprogs",
    "procps",
    "linux-image-cloud-amd64",
    "ca-certificates",
    "ignition",
    "openssh-server",
    "libpam-systemd",
    "libnss-myhostname",
    "sudo",
    "busybox-static",
    "curl",
];

/// dpkg options of the build: no manuals, docs (except copyright), locales or info pages.
pub const DPKG_OPTIONS: &[&str] = &[
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*",
];

/// A file the build puts into the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asset {
    /// Path in the image, relative to `/`.
    pub path: &'static str,
    /// Mode.
    pub mode: u32,
    /// Contents.
    pub contents: &'static str,
}

/// Every file the build adds to the image (from `harness/src/devhost/`).
pub const ASSETS: &[Asset] = &[
    Asset {
        path: "usr/local/sbin/firstboot-init",
        mode: 0o755,
        contents: include_str!("devhost/firstboot-init"),
    },
    Asset {
        path: "usr/local/lib/ignition-shim/setfiles",
        mode: 0o755,
        contents: include_str!("devhost/setfiles"),
    },
    Asset {
        path: "etc/selinux/config",
        mode: 0o644,
        contents: include_str!("devhost/selinux-config"),
    },
    Asset {
        path: "etc/fstab",
        mode: 0o644,
        contents: include_str!("devhost/fstab"),
    },
    Asset {
        path: "etc/systemd/network/20-wired.network",
        mode: 0o644,
        contents: include_str!("devhost/20-wired.network"),
    },
    Asset {
        path: "usr/local/sbin/usr-readonly",
        mode: 0o755,
        contents: include_str!("devhost/usr-readonly"),
    },
    Asset {
        path: "etc/systemd/system/usr-readonly.service",
        mode: 0o644,
        contents: include_str!("devhost/usr-readonly.service"),
    },
    Asset {
        path: "etc/systemd/system/boot-marker.service",
        mode: 0o644,
        contents: include_str!("devhost/boot-marker.service"),
    },
    Asset {
        path: "etc/ssh/sshd_config.d/50-flex-devhost.conf",
        mode: 0o644,
        contents: include_str!("devhost/sshd.conf"),
    },
    Asset {
        path: "etc/sudoers.d/50-flex-devhost",
        mode: 0o440,
        contents: include_str!("devhost/sudoers"),
    },
    Asset {
        path: "etc/hostname",
        mode: 0o644,
        contents: include_str!("devhost/hostname"),
    },
    Asset {
        path: "etc/hosts",
        mode: 0o644,
        contents: include_str!("devhost/hosts"),
    },
    Asset {
        path: "etc/resolv.conf",
        mode: 0o644,
        contents: include_str!("devhost/resolv.conf"),
    },
];

/// mmdebstrap's customize hook (runs on the build machine; enables and masks units, checks
/// the sudoers and sshd files).
pub const CUSTOMIZE_HOOK: &str = include_str!("devhost/customize.sh");

/// Which dev host: the plain one (no SELinux) or the SELinux variant of `up --selinux`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// No SELinux (`SELINUXTYPE=none`, the no-op `setfiles` shim for Ignition).
    #[default]
    Plain,
    /// SELinux enforcing with Debian's reference policy (`selinux-policy-default`), the tree
    /// labelled at build time by [`SELINUX_HOOK`], Ignition's relabel real (the real
    /// `setfiles` before systemd loads the policy, from `firstboot-init-selinux`), the kernel
    /// booted with [`SELINUX_KERNEL_ARGS`]. docs/SELINUX.md.
    Selinux,
}

/// The packages the SELinux variant adds: the policy (refpolicy, MCS), `policycoreutils`
/// (setfiles, restorecon, semodule, load_policy) and `selinux-utils` (getenforce); and, to
/// build refpolicy's container module, which Debian's policy leaves out, its source and the
/// policy headers ([`SELINUX_BUILD_PACKAGES`], purged by the hook) and `zstd` (the source is a
/// `.tar.zst`). No auditd: as on ACL, the kernel's AVC records go to the journal.
pub const SELINUX_PACKAGES: &[&str] = &[
    "selinux-policy-default",
    "policycoreutils",
    "selinux-utils",
    "zstd",
    "selinux-policy-src",
    "selinux-policy-dev",
];

/// The packages of [`SELINUX_PACKAGES`] only the container module's build needs; the SELinux
/// hook purges them, with what only they pulled in (python3, make, the policy compiler).
pub const SELINUX_BUILD_PACKAGES: &[&str] = &["selinux-policy-src", "selinux-policy-dev"];

/// The SELinux variant's second customize hook: refpolicy's container module, the local policy
/// modules, then `setfiles` over the tree.
pub const SELINUX_HOOK: &str = include_str!("devhost/customize-selinux.sh");

/// Where the SELinux variant's `init=` wrapper lives.
pub const SELINUX_INIT: &str = "usr/local/sbin/firstboot-init-selinux";

/// The SELinux variant's extra kernel arguments (Debian's kernel defaults to AppArmor).
pub const SELINUX_KERNEL_ARGS: &[&str] = &[
    "security=selinux",
    "selinux=1",
    "enforcing=1",
    "init=/usr/local/sbin/firstboot-init-selinux",
];

/// The files the SELinux variant puts in place of, or beside, [`ASSETS`].
const SELINUX_ASSETS: &[Asset] = &[
    Asset {
        path: "etc/selinux/config",
        mode: 0o644,
        contents: include_str!("devhost/selinux-config-enforcing"),
    },
    Asset {
        path: SELINUX_INIT,
        mode: 0o755,
        contents: include_str!("devhost/firstboot-init-selinux"),
    },
    // Ignition's relabel runs the real setfiles, less the `-r /` setfiles refuses.
    Asset {
        path: "usr/local/lib/ignition-shim/setfiles",
        mode: 0o755,
        contents: include_str!("devhost/setfiles-selinux"),
    },
    // The local policy module the SELinux hook installs (docs/SELINUX.md, each rule's denials).
    Asset {
        path: "usr/local/share/flex-devhost/selinux/flex-devhost.cil",
        mode: 0o644,
        contents: include_str!("devhost/flex-devhost.cil"),
    },
];

impl Variant {
    /// The packages of the variant. Pure.
    pub fn packages(self) -> Vec<&'static str> {
        let mut v = PACKAGES.to_vec();
        if self == Variant::Selinux {
            v.extend_from_slice(SELINUX_PACKAGES);
        }
        v
    }

    /// The files of the variant: [`ASSETS`], with the SELinux variant's replacing those at the
    /// same path (the config, the setfiles shim) and its init wrapper added. Pure.
    pub fn assets(self) -> Vec<Asset> {
        match self {
            Variant::Plain => ASSETS.to_vec(),
            Variant::Selinux => {
                let mut v: Vec<Asset> = ASSETS
                    .iter()
                    .map(|a| {
                        SELINUX_ASSETS
                            .iter()
                            .find(|s| s.path == a.path)
                            .copied()
                            .unwrap_or(*a)
                    })
                    .collect();
                v.extend(
                    SELINUX_ASSETS
                        .iter()
                        .filter(|s| !ASSETS.iter().any(|a| a.path == s.path))
                        .copied(),
                );
                v
            }
        }
    }

    /// The customize hooks, in order. Pure.
    pub fn hooks(self) -> Vec<&'static str> {
        match self {
            Variant::Plain => vec![CUSTOMIZE_HOOK],
            Variant::Selinux => vec![CUSTOMIZE_HOOK, SELINUX_HOOK],
        }
    }

    /// The kernel arguments the variant adds to [`crate::qemu::dev_host_append`]'s. Pure.
    pub fn kernel_args(self) -> &'static [&'static str] {
        match self {
            Variant::Plain => &[],
            Variant::Selinux => SELINUX_KERNEL_ARGS,
        }
    }

    /// The part of the image's directory name after the suite (`-selinux`, or nothing).
    fn dir_suffix(self) -> &'static str {
        match self {
            Variant::Plain => "",
            Variant::Selinux => "-selinux",
        }
    }
}

/// The Debian release the image is built from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Suite {
    /// Debian 12: matches this project's build machines (keyring, archive).
    #[default]
    Bookworm,
    /// Debian 13: closer to ACL (systemd 257, containerd 1.7, kernel 6.12).
    Trixie,
}

impl Suite {
    /// Every suite.
    pub const ALL: [Suite; 2] = [Suite::Bookworm, Suite::Trixie];

    /// The suite's name (`bookworm`).
    pub fn name(self) -> &'static str {
        match self {
            Suite::Bookworm => "bookworm",
            Suite::Trixie => "trixie",
        }
    }

    /// The archive lines mmdebstrap uses, main, updates and security, from `archive` (the build
    /// machine's, [`host_archive`]): on a machine whose Debian source is deb.debian.org they are
    /// the lines this module always used, so the recipe hash (which covers them: a snapshot
    /// mirror serves other packages) and the cached images stay as they were.
    pub fn mirrors(self, archive: &DebianArchive) -> Vec<String> {
        archive.mmdebstrap_mirrors(self.name())
    }
}

impl fmt::Display for Suite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Suite {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        Suite::ALL
            .into_iter()
            .find(|x| x.name().eq_ignore_ascii_case(s.trim()))
            .with_context(|| format!("unknown Debian suite {s:?} (bookworm or trixie)"))
    }
}

/// A built dev host image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevHostImage {
    /// The image's cache directory.
    pub dir: PathBuf,
    /// `rootfs.img`: raw ext4, label `root` (`root=/dev/vda`). Use it only as the backing file
    /// of a qcow2 overlay.
    pub disk: PathBuf,
    /// `vmlinuz`: the Debian cloud kernel.
    pub kernel: PathBuf,
    /// `initrd.img`: its initramfs-tools initrd.
    pub initrd: PathBuf,
    /// [`recipe_hash`] of the build.
    pub recipe_hash: String,
    /// The Debian suite.
    pub suite: Suite,
}

/// What `image.json` in the image directory records.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BuildInfo {
    /// The suite.
    pub suite: Suite,
    /// The full recipe hash.
    pub recipe_hash: String,
    /// Packages asked for.
    pub packages: Vec<String>,
    /// Seconds spent in mmdebstrap (including the customize hook).
    pub mmdebstrap_seconds: f64,
    /// Seconds spent in mkfs.ext4.
    pub mkfs_seconds: f64,
    /// Whole build, seconds.
    pub build_seconds: f64,
    /// Bytes of the root tree (apparent sizes).
    pub tree_bytes: u64,
    /// Bytes allocated for `rootfs.img`.
    pub disk_allocated_bytes: u64,
    /// Bytes of `vmlinuz`.
    pub kernel_bytes: u64,
    /// Bytes of `initrd.img`.
    pub initrd_bytes: u64,
}

/// File names inside the image directory.
pub const DISK_FILE: &str = "rootfs.img";
/// Kernel file name.
pub const KERNEL_FILE: &str = "vmlinuz";
/// Initrd file name.
pub const INITRD_FILE: &str = "initrd.img";
/// Build record file name.
pub const INFO_FILE: &str = "image.json";

/// SHA-256 (hex) over everything that decides the image: the package list, every asset's path,
/// mode and bytes, the customize hook and the build parameters (suite, archive lines from
/// `archive`, variant, architecture, dpkg options, image size and label). Pure.
pub fn recipe_hash(suite: Suite, archive: &DebianArchive) -> String {
    hash_recipe(suite, archive, PACKAGES, ASSETS, CUSTOMIZE_HOOK)
}

/// [`recipe_hash`] of a variant: the plain variant's is [`recipe_hash`]'s (its cached image
/// stays valid); the SELinux variant's also covers its packages, files, second hook and
/// kernel arguments. Pure.
pub fn variant_recipe_hash(suite: Suite, variant: Variant, archive: &DebianArchive) -> String {
    match variant {
        Variant::Plain => recipe_hash(suite, archive),
        Variant::Selinux => {
            let hooks = variant.hooks().join("\n");
            let base = hash_recipe(
                suite,
                archive,
                &variant.packages(),
                &variant.assets(),
                &hooks,
            );
            let mut h = RecipeHasher::default();
            h.part("base", base.as_bytes())
                .part("variant", b"selinux")
                .part("kernel", variant.kernel_args().join(" ").as_bytes())
                .part("skip", SELINUX_MMDEBSTRAP_SKIP.join("\n").as_bytes());
            h.finish()
        }
    }
}

fn hash_recipe(
    suite: Suite,
    archive: &DebianArchive,
    packages: &[&str],
    assets: &[Asset],
    hook: &str,
) -> String {
    let mut h = RecipeHasher::default();
    h.part("recipe", RECIPE_VERSION.as_bytes())
        .part("suite", suite.name().as_bytes())
        .part("mirrors", suite.mirrors(archive).join("\n").as_bytes())
        .part("variant", b"minbase")
        .part("arch", b"amd64")
        .part("packages", packages.join(",").as_bytes())
        .part("dpkgopt", DPKG_OPTIONS.join("\n").as_bytes())
        .part("size", IMAGE_SIZE_BYTES.to_string().as_bytes())
        .part("label", ROOT_LABEL.as_bytes())
        .part("hook", hook.as_bytes());
    for a in assets {
        h.part("asset", a.path.as_bytes())
            .part("mode", format!("{:o}", a.mode).as_bytes())
            .part("contents", a.contents.as_bytes());
    }
    h.finish()
}

/// `$XDG_CACHE_HOME/aks-flex-node`, else `~/.cache/aks-flex-node` (`/var/cache/aks-flex-node`
/// when there is no home).
pub fn default_cache_root() -> PathBuf {
    cache_root_from(
        std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from),
        std::env::var_os("HOME").map(PathBuf::from),
    )
}

fn cache_root_from(xdg: Option<PathBuf>, home: Option<PathBuf>) -> PathBuf {
    match (xdg, home) {
        (Some(x), _) if x.is_absolute() => x.join("aks-flex-node"),
        (_, Some(h)) if h.is_absolute() => h.join(".cache/aks-flex-node"),
        _ => PathBuf::from("/var/cache/aks-flex-node"),
    }
}

/// The directory the image of `suite`, from `archive`, has (or will have) under `cache_root`.
pub fn image_dir(cache_root: &Path, suite: Suite, archive: &DebianArchive) -> PathBuf {
    variant_image_dir(cache_root, suite, Variant::Plain, archive)
}

/// The directory the image of `suite` and `variant`, from `archive`, has (or will have) under
/// `cache_root` (`<suite>-selinux-<hash>` for the SELinux variant).
pub fn variant_image_dir(
    cache_root: &Path,
    suite: Suite,
    variant: Variant,
    archive: &DebianArchive,
) -> PathBuf {
    cache_root
        .join("devhost")
        .join(image_name(suite, variant, archive))
}

fn image_name(suite: Suite, variant: Variant, archive: &DebianArchive) -> String {
    let hash = variant_recipe_hash(suite, variant, archive);
    format!("{suite}{}-{}", variant.dir_suffix(), &hash[..16])
}

fn image_in(dir: PathBuf, suite: Suite, recipe_hash: String) -> DevHostImage {
    DevHostImage {
        disk: dir.join(DISK_FILE),
        kernel: dir.join(KERNEL_FILE),
        initrd: dir.join(INITRD_FILE),
        dir,
        recipe_hash,
        suite,
    }
}

fn complete(img: &DevHostImage) -> bool {
    [
        &img.disk,
        &img.kernel,
        &img.initrd,
        &img.dir.join(INFO_FILE),
    ]
    .iter()
    .all(|p| p.is_file())
}

/// mmdebstrap's argv (without the program name) for a build of `suite` from `archive` into
/// `tree`, with the customize hook at `hook` copying the files staged in `overlay`.
pub fn mmdebstrap_args(
    suite: Suite,
    archive: &DebianArchive,
    tree: &Path,
    hook: &Path,
    overlay: &Path,
) -> Vec<String> {
    variant_mmdebstrap_args(suite, Variant::Plain, archive, tree, &[hook], overlay)
}

/// [`mmdebstrap_args`] of a variant: its packages, and one customize hook per script in
/// `hooks` (each gets the new root and `overlay`), in order.
pub fn variant_mmdebstrap_args(
    suite: Suite,
    variant: Variant,
    archive: &DebianArchive,
    tree: &Path,
    hooks: &[&Path],
    overlay: &Path,
) -> Vec<String> {
    let mut a = vec![
        "--mode=root".to_string(),
        "--variant=minbase".to_string(),
        "--architectures=amd64".to_string(),
        "--format=directory".to_string(),
        format!("--include={}", variant.packages().join(",")),
    ];
    a.extend(DPKG_OPTIONS.iter().map(|o| format!("--dpkgopt={o}")));
    if variant == Variant::Selinux {
        a.extend(
            SELINUX_MMDEBSTRAP_SKIP
                .iter()
                .map(|s| format!("--skip={s}")),
        );
    }
    for hook in hooks {
        a.push(format!(
            "--customize-hook=sh {} \"$1\" {}",
            sh_quote(&hook.display().to_string()),
            sh_quote(&overlay.display().to_string())
        ));
    }
    a.push(suite.name().to_string());
    a.push(tree.display().to_string());
    a.extend(suite.mirrors(archive));
    a
}

/// The dev host image of `suite`, built under `cache_root` when its recipe hash has no image
/// yet (a few minutes; needs root and mmdebstrap, which is installed with apt-get on a Debian
/// host), from this machine's Debian mirror ([`host_archive`]). `progress` gets one line per
/// step.
pub async fn ensure(
    runner: &dyn Runner,
    cache_root: &Path,
    suite: Suite,
    progress: &dyn Fn(&str),
) -> Result<DevHostImage> {
    ensure_variant(runner, cache_root, suite, Variant::Plain, progress).await
}

/// [`ensure`] for a variant (each has its own recipe hash and directory).
pub async fn ensure_variant(
    runner: &dyn Runner,
    cache_root: &Path,
    suite: Suite,
    variant: Variant,
    progress: &dyn Fn(&str),
) -> Result<DevHostImage> {
    let archive = host_archive()?;
    let hash = variant_recipe_hash(suite, variant, &archive);
    let dir = variant_image_dir(cache_root, suite, variant, &archive);
    let img = image_in(dir.clone(), suite, hash.clone());
    if complete(&img) {
        return Ok(img);
    }
    if std::env::consts::ARCH != "x86_64" {
        bail!(
            "the dev host image is amd64 (booted with qemu-system-x86_64); build it on an \
             x86_64 machine"
        );
    }
    require_root("building the dev host image")?;
    ensure_tool(runner, "mmdebstrap", "mmdebstrap", progress).await?;
    ensure_tool(runner, "mkfs.ext4", "e2fsprogs", progress).await?;
    let parent = cache_root.join("devhost");
    let _lock = lock(&parent, progress).await?;
    if complete(&img) {
        return Ok(img);
    }
    clean_stale_builds(&parent, progress);
    discard_incomplete(&dir, progress)?;
    let name = image_name(suite, variant, &archive);
    let work = build_dir(&parent, &name)?;
    progress(&format!(
        "building the {suite}{} dev host image in {} (mmdebstrap, a few minutes)",
        variant.dir_suffix(),
        work.display()
    ));
    let info = build_into(runner, &work, suite, variant, &archive, &hash, progress)
        .await
        .with_context(|| {
            format!(
                "building the {suite} dev host image (the unfinished build is in {})",
                work.display()
            )
        })?;
    publish(&work, &dir)?;
    progress(&format!(
        "dev host image ready in {:.0} s: {} ({} MiB allocated of {} GiB), kernel {:.1} MB, \
         initrd {:.1} MB",
        info.build_seconds,
        dir.display(),
        info.disk_allocated_bytes >> 20,
        IMAGE_SIZE_BYTES >> 30,
        info.kernel_bytes as f64 / 1e6,
        info.initrd_bytes as f64 / 1e6,
    ));
    Ok(img)
}

/// Removes `dir` when it exists although the caller found it incomplete (files deleted by
/// hand), so that a new build can take its name. Call with the lock held.
pub(crate) fn discard_incomplete(dir: &Path, progress: &dyn Fn(&str)) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    progress(&format!("removing the incomplete {}", dir.display()));
    if !remove_build_dir(dir)? {
        bail!(
            "{} is incomplete and has mounts inside; unmount them first",
            dir.display()
        );
    }
    Ok(())
}

/// Builds the image into `work`: tree, disk, kernel, initrd, `image.json`; the tree is
/// removed at the end.
async fn build_into(
    runner: &dyn Runner,
    work: &Path,
    suite: Suite,
    variant: Variant,
    archive: &DebianArchive,
    hash: &str,
    progress: &dyn Fn(&str),
) -> Result<BuildInfo> {
    let started = Instant::now();
    let log = work.join("build.log");
    let overlay = work.join("overlay");
    for a in variant.assets() {
        write_file(&overlay, a.path, a.contents.as_bytes(), a.mode)?;
    }
    let mut hooks = Vec::new();
    for (i, text) in variant.hooks().into_iter().enumerate() {
        let name = format!("customize-{i}.sh");
        write_file(work, &name, text.as_bytes(), 0o755)?;
        hooks.push(work.join(name));
    }
    let hook_refs: Vec<&Path> = hooks.iter().map(PathBuf::as_path).collect();
    let tree = work.join("tree");
    let packages = variant.packages();

    progress(&format!(
        "mmdebstrap {suite}: {} packages from {}",
        packages.len(),
        archive_summary(archive)
    ));
    let t = Instant::now();
    let cmd = Cmd::new("mmdebstrap")
        .args(variant_mmdebstrap_args(
            suite, variant, archive, &tree, &hook_refs, &overlay,
        ))
        .timeout(Duration::from_secs(3600));
    let cmd = with_apt_proxy(runner, cmd, progress).await;
    run_logged(runner, &cmd, &log).await?;
    let mmdebstrap_seconds = t.elapsed().as_secs_f64();
    let tree_bytes = tree_size(&tree);
    progress(&format!(
        "mmdebstrap done in {mmdebstrap_seconds:.0} s ({} MB tree)",
        tree_bytes / 1_000_000
    ));

    let boot = tree.join("boot");
    let kernel = work.join(KERNEL_FILE);
    let initrd = work.join(INITRD_FILE);
    for (prefix, dest) in [("vmlinuz-", &kernel), ("initrd.img-", &initrd)] {
        let src = single_entry(&boot, prefix)?;
        std::fs::copy(&src, dest)
            .with_context(|| format!("copying {} to {}", src.display(), dest.display()))?;
        // Debian installs the kernel 0600; QEMU may run as another user.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o644))?;
    }

    let disk = work.join(DISK_FILE);
    {
        let f =
            std::fs::File::create(&disk).with_context(|| format!("creating {}", disk.display()))?;
        f.set_len(IMAGE_SIZE_BYTES)
            .with_context(|| format!("sizing {}", disk.display()))?;
    }
    progress(&format!(
        "mkfs.ext4 -d into a {} GiB sparse {DISK_FILE}",
        IMAGE_SIZE_BYTES >> 30
    ));
    let t = Instant::now();
    let mkfs = Cmd::new("mkfs.ext4")
        .args(["-q", "-L", ROOT_LABEL, "-d"])
        .arg(tree.display().to_string())
        .arg(disk.display().to_string())
        .timeout(Duration::from_secs(1800));
    run_logged(runner, &mkfs, &log).await?;
    let mkfs_seconds = t.elapsed().as_secs_f64();
    if variant == Variant::Selinux {
        check_labels(runner, &disk, &log).await?;
    }

    if !remove_build_dir(&tree)? {
        bail!("{} still has mounts inside", tree.display());
    }
    std::fs::remove_dir_all(&overlay).with_context(|| format!("removing {}", overlay.display()))?;
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let info = BuildInfo {
        suite,
        recipe_hash: hash.to_string(),
        packages: packages.iter().map(|p| p.to_string()).collect(),
        mmdebstrap_seconds,
        mkfs_seconds,
        build_seconds: started.elapsed().as_secs_f64(),
        tree_bytes,
        disk_allocated_bytes: allocated_bytes(&disk),
        kernel_bytes: len(&kernel),
        initrd_bytes: len(&initrd),
    };
    let json = serde_json::to_vec_pretty(&info)?;
    write_file(work, INFO_FILE, &json, 0o644)?;
    Ok(info)
}

/// The labels the SELinux variant must have in the finished image (mkfs.ext4 -d copies the
/// `security.selinux` attributes setfiles wrote in the tree): path, and the type its label
/// must name.
pub const SELINUX_LABEL_CHECKS: &[(&str, &str)] = &[
    // Or PID 1 stays kernel_t, as on ACL.
    ("/usr/lib/systemd/systemd", "init_exec_t"),
    ("/etc/ssh/sshd_config", "etc_t"),
    ("/usr/local/sbin/firstboot-init", "bin_t"),
    // Rewritten by mmdebstrap after the hooks unless skipped ([`SELINUX_MMDEBSTRAP_SKIP`]);
    // unlabelled, every
    // confined reader of it (journald, networkd, tmpfiles) is refused and journald never starts.
    ("/etc/machine-id", "etc_t"),
    // Unconfined, as on ACL (customize-selinux.sh, file_contexts.local).
    ("/usr/bin/systemd-nspawn", "bin_t"),
    // refpolicy's container module is in the policy (built by customize-selinux.sh): runc is
    // the container engine that moves the agent's container to spc_t.
    ("/usr/sbin/runc", "container_engine_exec_t"),
];

/// mmdebstrap steps the SELinux variant skips. Its `cleanup/reproducible` runs after the
/// customize hooks, so after the hook's `setfiles`, and empties `/etc/machine-id` by creating
/// the file anew, without a label; the variant's hook does the same clean-up itself, before it
/// labels the tree (`customize-selinux.sh`).
pub const SELINUX_MMDEBSTRAP_SKIP: &[&str] = &["cleanup/reproducible"];

/// Whether debugfs's `ea_get` output for `path` shows the label type `ty`. Pure.
pub fn label_has_type(ea_get_output: &str, ty: &str) -> bool {
    ea_get_output.contains(&format!(":{ty}:"))
}

/// Reads the labels of [`SELINUX_LABEL_CHECKS`] from `disk` with debugfs and fails naming any
/// that is missing or wrong.
async fn check_labels(runner: &dyn Runner, disk: &Path, log: &Path) -> Result<()> {
    let mut wrong = Vec::new();
    for (path, ty) in SELINUX_LABEL_CHECKS {
        let cmd = Cmd::new("debugfs")
            .arg("-R")
            .arg(format!("ea_get {path} security.selinux"))
            .arg(disk.display().to_string())
            .timeout(Duration::from_secs(60));
        let out = runner.output(&cmd).await?;
        let text = format!("{}{}", out.stdout, out.stderr);
        let line = format!("{path}: {}\n", text.trim());
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(log)?;
        std::io::Write::write_all(&mut f, line.as_bytes())?;
        if !label_has_type(&text, ty) {
            wrong.push(format!("{path} ({}; want {ty})", text.trim()));
        }
    }
    if !wrong.is_empty() {
        bail!("the image's SELinux labels are wrong: {}", wrong.join(", "));
    }
    Ok(())
}

/// Sum of the apparent sizes of the regular files under `dir` (not following links, staying
/// on its file system).
pub(crate) fn tree_size(dir: &Path) -> u64 {
    fn walk(p: &Path, dev: u64, total: &mut u64) {
        use std::os::unix::fs::MetadataExt;
        let Ok(rd) = std::fs::read_dir(p) else {
            return;
        };
        for e in rd.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.is_file() {
                *total += m.len();
            } else if m.is_dir() && m.dev() == dev {
                walk(&e.path(), dev, total);
            }
        }
    }
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    if let Ok(m) = dir.metadata() {
        walk(dir, m.dev(), &mut total);
    }
    total
}

/// Reads `image.json` of an image.
pub fn build_info(img: &DevHostImage) -> Result<BuildInfo> {
    let p = img.dir.join(INFO_FILE);
    let bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Snapshots live in `devhost/snapshots/`, beside the assets.
    macro_rules! snap {
        ($name:expr, $value:expr) => {{
            let mut settings = insta::Settings::clone_current();
            settings.set_snapshot_path("devhost/snapshots");
            settings.bind(|| insta::assert_snapshot!($name, $value));
        }};
    }

    /// Debian's own servers: what a machine whose source is deb.debian.org gives.
    fn deb() -> DebianArchive {
        DebianArchive::fallback()
    }

    fn asset(path: &str) -> &'static Asset {
        ASSETS.iter().find(|a| a.path == path).unwrap()
    }

    #[test]
    fn recipe_hash_is_stable_and_per_suite() {
        let b = recipe_hash(Suite::Bookworm, &deb());
        assert_eq!(b, recipe_hash(Suite::Bookworm, &deb()));
        assert_eq!(b.len(), 64);
        assert!(b.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(b, recipe_hash(Suite::Trixie, &deb()));
    }

    /// The mirror is part of the recipe (a snapshot mirror serves other packages): on a
    /// machine whose Debian source is deb.debian.org (this one's deb822 file) the hash is the
    /// one the hard-coded lines gave, so its cached images stay valid; another mirror, or
    /// another keyring, is another image.
    #[test]
    fn the_machines_mirror_is_part_of_the_recipe() {
        let debian_sources = "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n";
        let machine = DebianArchive::find(
            &flex_host::apt::parse_deb822(debian_sources, "debian.sources").unwrap(),
            "bookworm",
        );
        assert!(machine.notes.is_empty());
        for suite in Suite::ALL {
            assert_eq!(recipe_hash(suite, &machine), recipe_hash(suite, &deb()));
            assert_eq!(
                suite.mirrors(&machine),
                [
                    format!("deb http://deb.debian.org/debian {suite} main"),
                    format!("deb http://deb.debian.org/debian {suite}-updates main"),
                    format!("deb http://deb.debian.org/debian-security {suite}-security main"),
                ]
            );
        }
        let mirror = |list: &str| {
            DebianArchive::find(
                &flex_host::apt::parse_list(list, "sources.list").unwrap(),
                "bookworm",
            )
        };
        let corp = mirror(
            "deb http://mirror.corp/debian bookworm main\ndeb http://mirror.corp/debian-security bookworm-security main\n",
        );
        assert_ne!(
            recipe_hash(Suite::Bookworm, &corp),
            recipe_hash(Suite::Bookworm, &deb())
        );
        let keyed = mirror(
            "deb [signed-by=/etc/apt/keyrings/corp.gpg] http://mirror.corp/debian bookworm main\ndeb http://mirror.corp/debian-security bookworm-security main\n",
        );
        assert_ne!(
            recipe_hash(Suite::Bookworm, &keyed),
            recipe_hash(Suite::Bookworm, &corp)
        );
        let argv = mmdebstrap_args(
            Suite::Trixie,
            &keyed,
            Path::new("/t"),
            Path::new("/h"),
            Path::new("/o"),
        );
        assert_eq!(
            argv[argv.len() - 3..],
            [
                "deb [signed-by=/etc/apt/keyrings/corp.gpg] http://mirror.corp/debian trixie main",
                "deb [signed-by=/etc/apt/keyrings/corp.gpg] http://mirror.corp/debian trixie-updates main",
                "deb http://mirror.corp/debian-security trixie-security main",
            ]
        );
        assert_ne!(
            image_dir(Path::new("/c"), Suite::Bookworm, &corp),
            image_dir(Path::new("/c"), Suite::Bookworm, &deb())
        );
    }

    #[test]
    fn any_asset_change_changes_the_hash() {
        let base = hash_recipe(Suite::Bookworm, &deb(), PACKAGES, ASSETS, CUSTOMIZE_HOOK);
        assert_eq!(base, recipe_hash(Suite::Bookworm, &deb()));
        for i in 0..ASSETS.len() {
            let mut changed = ASSETS.to_vec();
            let text: &'static str = Box::leak(format!("{} ", ASSETS[i].contents).into_boxed_str());
            changed[i].contents = text;
            assert_ne!(
                hash_recipe(Suite::Bookworm, &deb(), PACKAGES, &changed, CUSTOMIZE_HOOK),
                base,
                "{}",
                ASSETS[i].path
            );
            let mut moded = ASSETS.to_vec();
            moded[i].mode ^= 0o001;
            assert_ne!(
                hash_recipe(Suite::Bookworm, &deb(), PACKAGES, &moded, CUSTOMIZE_HOOK),
                base
            );
            let mut moved = ASSETS.to_vec();
            moved[i].path = "etc/elsewhere";
            assert_ne!(
                hash_recipe(Suite::Bookworm, &deb(), PACKAGES, &moved, CUSTOMIZE_HOOK),
                base
            );
        }
        let hook = format!("{CUSTOMIZE_HOOK}\n");
        assert_ne!(
            hash_recipe(Suite::Bookworm, &deb(), PACKAGES, ASSETS, &hook),
            base
        );
        let mut pk = PACKAGES.to_vec();
        pk.push("jq");
        assert_ne!(
            hash_recipe(Suite::Bookworm, &deb(), &pk, ASSETS, CUSTOMIZE_HOOK),
            base
        );
        pk.pop();
        pk.swap(0, 1);
        assert_ne!(
            hash_recipe(Suite::Bookworm, &deb(), &pk, ASSETS, CUSTOMIZE_HOOK),
            base
        );
    }

    /// The plain variant's recipe is the one it always was (its cached image stays valid); the
    /// SELinux variant's has its own hash and directory.
    #[test]
    fn variants_have_their_own_recipe_hash_and_directory() {
        for suite in Suite::ALL {
            assert_eq!(
                variant_recipe_hash(suite, Variant::Plain, &deb()),
                recipe_hash(suite, &deb())
            );
            assert_eq!(
                variant_image_dir(Path::new("/c"), suite, Variant::Plain, &deb()),
                image_dir(Path::new("/c"), suite, &deb())
            );
            let se = variant_recipe_hash(suite, Variant::Selinux, &deb());
            assert_ne!(se, recipe_hash(suite, &deb()));
            let dir = variant_image_dir(Path::new("/c"), suite, Variant::Selinux, &deb());
            assert_eq!(
                dir,
                Path::new("/c/devhost").join(format!("{suite}-selinux-{}", &se[..16]))
            );
        }
        assert_eq!(Variant::default(), Variant::Plain);
        assert_eq!(Variant::Plain.packages(), PACKAGES);
        assert_eq!(Variant::Plain.assets(), ASSETS);
        assert_eq!(Variant::Plain.hooks(), [CUSTOMIZE_HOOK]);
        assert!(Variant::Plain.kernel_args().is_empty());
    }

    /// What the SELinux variant changes: the policy packages, enforcing config, no setfiles
    /// shim, the policy-loading init wrapper, the labelling hook after the plain one, and the
    /// kernel arguments that select SELinux and that wrapper.
    #[test]
    fn selinux_variant_recipe() {
        let v = Variant::Selinux;
        let pk = v.packages();
        assert_eq!(&pk[..PACKAGES.len()], PACKAGES);
        for p in ["selinux-policy-default", "policycoreutils", "selinux-utils"] {
            assert!(pk.contains(&p), "{p}");
        }
        assert!(
            !pk.contains(&"auditd"),
            "ACL has no auditd; AVCs go to the journal"
        );
        // The container module's build packages are installed, and purged by the hook.
        let purge: String = SELINUX_HOOK
            .split("apt-get purge")
            .nth(1)
            .unwrap_or_default()
            .lines()
            .take(3)
            .collect();
        for p in SELINUX_BUILD_PACKAGES {
            assert!(pk.contains(p), "{p}");
            assert!(purge.contains(p), "the hook purges {p}");
        }
        assert!(SELINUX_HOOK.contains("semodule -i \"$B/container.pp\""));
        assert!(
            SELINUX_LABEL_CHECKS.contains(&("/usr/sbin/runc", "container_engine_exec_t")),
            "the build checks the module's labels"
        );
        let assets = v.assets();
        let find = |path: &str| assets.iter().find(|a| a.path == path);
        let shim = find("usr/local/lib/ignition-shim/setfiles")
            .unwrap()
            .contents;
        assert!(
            shim.contains("exec /usr/sbin/setfiles \"$@\""),
            "the relabel is real"
        );
        assert!(!shim.contains("exit 0"));
        let cfg = find("etc/selinux/config").unwrap().contents;
        assert!(cfg.lines().any(|l| l == "SELINUX=enforcing"));
        assert!(cfg.lines().any(|l| l == "SELINUXTYPE=default"));
        let init = find(SELINUX_INIT).unwrap();
        assert_eq!(init.mode, 0o755);
        let pos = |needle: &str| init.contents.find(needle).unwrap();
        // No policy loaded before systemd (it would leave PID 1 kernel_t); what the script
        // creates after Ignition's relabel is labelled before systemd starts.
        assert!(!init.contents.contains("load_policy"));
        assert!(pos("PATH=/usr/local/lib/ignition-shim:") < pos("-stage=fetch-offline"));
        assert!(pos("-stage=files") < pos("systemctl preset"));
        assert!(pos("systemctl preset") < pos("touch \"$DONE\""));
        assert!(pos("touch \"$DONE\"") < pos("setfiles -F \"$FC\" /etc/systemd/system \"$DONE\""));
        assert!(
            init.contents
                .trim_end()
                .ends_with("exec /lib/systemd/systemd \"$@\"")
        );
        assert!(init.contents.contains(IGNITION_FAILED_MARKER));
        // Every other plain file is there unchanged, each path once.
        for a in ASSETS {
            if a.path != "etc/selinux/config" && a.path != "usr/local/lib/ignition-shim/setfiles" {
                assert_eq!(find(a.path), Some(a), "{}", a.path);
            }
        }
        let mut paths: Vec<_> = assets.iter().map(|a| a.path).collect();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), assets.len());
        assert_eq!(v.hooks(), [CUSTOMIZE_HOOK, SELINUX_HOOK]);
        assert!(SELINUX_HOOK.contains("setfiles -F -e /proc -e /sys -e /dev /etc/selinux/default/contexts/files/file_contexts /"));
        assert!(SELINUX_HOOK.contains("CONFIG_SECURITY_SELINUX=y"));
        let append = crate::qemu::dev_host_append(v.kernel_args());
        for arg in ["security=selinux", "selinux=1", "enforcing=1"] {
            assert!(append.split(' ').any(|a| a == arg), "{append}");
        }
        let inits: Vec<_> = append
            .split(' ')
            .filter(|a| a.starts_with("init="))
            .collect();
        assert_eq!(inits, [format!("init=/{SELINUX_INIT}")]);
        let argv = variant_mmdebstrap_args(
            Suite::Bookworm,
            v,
            &deb(),
            Path::new("/t"),
            &[Path::new("/h0.sh"), Path::new("/h1.sh")],
            Path::new("/o"),
        );
        let hooks: Vec<_> = argv
            .iter()
            .filter(|a| a.starts_with("--customize-hook="))
            .collect();
        assert_eq!(hooks.len(), 2);
        assert!(hooks[0].contains("/h0.sh") && hooks[1].contains("/h1.sh"));
        assert!(
            argv.iter()
                .any(|a| a.starts_with("--include=") && a.ends_with(",selinux-policy-dev"))
        );
        // mmdebstrap's clean-up would recreate /etc/machine-id unlabelled after the hooks: the
        // variant skips it and its hook empties the file in place before setfiles.
        assert!(argv.contains(&"--skip=cleanup/reproducible".to_string()));
        let plain = mmdebstrap_args(
            Suite::Bookworm,
            &deb(),
            Path::new("/t"),
            Path::new("/h"),
            Path::new("/o"),
        );
        assert!(!plain.iter().any(|a| a.starts_with("--skip=")));
        let (empty, label) = (
            SELINUX_HOOK.find(": > \"$R\"/etc/machine-id").unwrap(),
            SELINUX_HOOK.find("setfiles -F").unwrap(),
        );
        assert!(empty < label);
        assert!(SELINUX_LABEL_CHECKS.contains(&("/etc/machine-id", "etc_t")));
    }

    #[test]
    fn labels_are_read_from_debugfs_output() {
        let out = "security.selinux (33) = \"system_u:object_r:init_exec_t:s0\\000\"\n";
        assert!(label_has_type(out, "init_exec_t"));
        assert!(!label_has_type(out, "bin_t"));
        assert!(!label_has_type(
            "ea_get: Extended attribute key not found",
            "init_exec_t"
        ));
        assert!(
            SELINUX_LABEL_CHECKS
                .iter()
                .any(|(p, t)| *p == "/usr/lib/systemd/systemd" && *t == "init_exec_t")
        );
    }

    #[test]
    fn suites_parse_and_name() {
        assert_eq!("bookworm".parse::<Suite>().unwrap(), Suite::Bookworm);
        assert_eq!(" Trixie ".parse::<Suite>().unwrap(), Suite::Trixie);
        assert!(
            "sid"
                .parse::<Suite>()
                .unwrap_err()
                .to_string()
                .contains("bookworm or trixie")
        );
        assert_eq!(Suite::default(), Suite::Bookworm);
        assert_eq!(
            Suite::Trixie.mirrors(&deb())[2],
            "deb http://deb.debian.org/debian-security trixie-security main"
        );
    }

    #[test]
    fn cache_layout() {
        let dir = image_dir(Path::new("/c"), Suite::Bookworm, &deb());
        let hash = recipe_hash(Suite::Bookworm, &deb());
        assert_eq!(
            dir,
            Path::new("/c/devhost").join(format!("bookworm-{}", &hash[..16]))
        );
        let img = image_in(dir.clone(), Suite::Bookworm, hash);
        assert_eq!(img.disk, dir.join("rootfs.img"));
        assert_eq!(img.kernel, dir.join("vmlinuz"));
        assert_eq!(img.initrd, dir.join("initrd.img"));
        assert_eq!(
            cache_root_from(Some("/x".into()), Some("/root".into())),
            Path::new("/x/aks-flex-node")
        );
        assert_eq!(
            cache_root_from(Some("rel".into()), Some("/home/u".into())),
            Path::new("/home/u/.cache/aks-flex-node")
        );
        assert_eq!(
            cache_root_from(None, None),
            Path::new("/var/cache/aks-flex-node")
        );
    }

    #[test]
    fn fw_cfg_key_and_markers() {
        assert_eq!(FWCFG_IGNITION_KEY, "opt/com.coreos/config");
        let boot = asset("etc/systemd/system/boot-marker.service").contents;
        assert!(boot.contains(BOOT_MARKER) && boot.contains("/dev/ttyS0"));
        let init = asset("usr/local/sbin/firstboot-init").contents;
        assert!(init.contains(IGNITION_FAILED_MARKER));
        assert_eq!(asset("etc/hostname").contents.trim(), PLACEHOLDER_HOSTNAME);
        assert!(asset("etc/hosts").contents.contains(PLACEHOLDER_HOSTNAME));
        // The kernel command line the harness uses points at the wrapper and names eth0.
        let append = crate::qemu::dev_host_append(&[]);
        assert!(append.contains(&format!("init=/{}", "usr/local/sbin/firstboot-init")));
        assert!(append.contains("net.ifnames=0"));
        assert!(
            asset("etc/systemd/network/20-wired.network")
                .contents
                .contains("Name=eth0")
        );
    }

    #[test]
    fn firstboot_init_runs_debians_ignition_in_order() {
        let s = asset("usr/local/sbin/firstboot-init").contents;
        let pos = |needle: &str| s.find(needle).unwrap_or_else(|| panic!("{needle}"));
        assert!(s.starts_with("#!/bin/sh\n"));
        let ign = "/usr/lib/dracut/modules.d/30ignition/ignition";
        assert!(s.contains(ign));
        assert!(pos("modprobe qemu_fw_cfg") < pos("-stage=fetch-offline"));
        assert!(pos("PATH=/usr/local/lib/ignition-shim:") < pos("-stage=fetch-offline"));
        assert!(pos("-stage=fetch-offline") < pos("-stage=files"));
        assert!(pos("-stage=files") < pos("systemctl preset"));
        assert!(pos("systemctl preset") < pos("touch \"$DONE\""));
        assert!(s.contains("-root=/ -platform=qemu"));
        assert!(s.contains("20-ignition.preset"));
        assert!(s.trim_end().ends_with("exec /lib/systemd/systemd \"$@\""));
        snap!("firstboot_init", s);
    }

    #[test]
    fn fstab_and_units() {
        let fstab = asset("etc/fstab").contents;
        assert!(fstab.contains("/dev/vda  /  ext4"));
        assert!(
            fstab.contains("upperdir=/var/lib/usr-local/upper,workdir=/var/lib/usr-local/work")
        );
        snap!("fstab", fstab);
        snap!(
            "usr_readonly_service",
            asset("etc/systemd/system/usr-readonly.service").contents
        );
        snap!(
            "usr_readonly",
            asset("usr/local/sbin/usr-readonly").contents
        );
        snap!(
            "boot_marker_service",
            asset("etc/systemd/system/boot-marker.service").contents
        );
        snap!(
            "wired_network",
            asset("etc/systemd/network/20-wired.network").contents
        );
        snap!("customize_hook", CUSTOMIZE_HOOK);
        let ro = asset("etc/systemd/system/usr-readonly.service").contents;
        for line in [
            "DefaultDependencies=no",
            "After=systemd-remount-fs.service",
            "Before=local-fs-pre.target usr-local.mount",
            "Type=oneshot",
            "RemainAfterExit=yes",
            "StandardOutput=journal+console",
            "WantedBy=local-fs.target",
        ] {
            assert!(ro.lines().any(|l| l == line), "{line}");
        }
        let script = asset("usr/local/sbin/usr-readonly").contents;
        assert!(script.contains("mountpoint -q /usr || mount --bind /usr /usr"));
        assert!(script.contains("mount -o remount,bind,ro /usr"));
        assert!(script.contains("-ge 5"));
    }

    #[test]
    fn login_settings() {
        let sshd = asset("etc/ssh/sshd_config.d/50-flex-devhost.conf").contents;
        assert!(sshd.lines().any(
            |l| l == "AuthorizedKeysFile .ssh/authorized_keys .ssh/authorized_keys.d/ignition"
        ));
        assert!(sshd.lines().any(|l| l == "PasswordAuthentication no"));
        let sudo = asset("etc/sudoers.d/50-flex-devhost");
        assert_eq!(sudo.mode, 0o440);
        assert!(
            sudo.contents
                .lines()
                .any(|l| l == "%sudo ALL=(ALL) NOPASSWD: ALL")
        );
        // sudo ignores drop-ins whose names contain a dot.
        assert!(!sudo.path.rsplit('/').next().unwrap().contains('.'));
        assert!(!CUSTOMIZE_HOOK.contains("passwd -d"));
        assert!(!ASSETS.iter().any(|a| a.path.contains("getty")));
        let selinux = asset("etc/selinux/config").contents;
        assert!(selinux.lines().any(|l| l == "SELINUXTYPE=none"));
        for a in ASSETS {
            let first = a.contents.lines().next().unwrap();
            assert!(
                first.starts_with("#!/bin/sh")
                    || first.starts_with('#')
                    || a.path.starts_with("etc/host"),
                "{}",
                a.path
            );
        }
    }

    /// Builds the image for real (root, network, a few minutes; cached in the default cache
    /// root). Run with `cargo test -p flex-harness devhost -- --ignored --nocapture`.
    #[tokio::test]
    #[ignore = "builds the 8 GiB dev host image with mmdebstrap (root, network, minutes)"]
    async fn real_devhost_image() {
        if !rustix::process::geteuid().is_root() {
            println!("skipped: building the dev host image needs root");
            return;
        }
        let progress = |s: &str| println!("{s}");
        let img = ensure(
            &flex_host::runner::ProcessRunner::new(),
            &default_cache_root(),
            Suite::Bookworm,
            &progress,
        )
        .await
        .unwrap();
        let info = build_info(&img).unwrap();
        println!("{img:#?}\n{info:#?}");
        assert_eq!(
            std::fs::metadata(&img.disk).unwrap().len(),
            IMAGE_SIZE_BYTES
        );
        assert!(
            info.disk_allocated_bytes < IMAGE_SIZE_BYTES / 4,
            "not sparse"
        );
        let kernel = std::fs::read(&img.kernel).unwrap();
        assert_eq!(&kernel[0x202..0x206], b"HdrS", "bzImage header");
        assert!(std::fs::metadata(&img.initrd).unwrap().len() > 1_000_000);
        // A second call finds it.
        assert_eq!(
            ensure(
                &flex_host::runner::ProcessRunner::new(),
                &default_cache_root(),
                Suite::Bookworm,
                &|_| {}
            )
            .await
            .unwrap(),
            img
        );
    }

    /// Builds the SELinux variant for real (root, network, minutes; cached in the default
    /// cache root), including the build's own debugfs check of the image's labels. Run with
    /// `cargo test -p flex-harness real_selinux -- --ignored --nocapture`.
    #[tokio::test]
    #[ignore = "builds the 8 GiB SELinux dev host image with mmdebstrap (root, network, minutes)"]
    async fn real_selinux_devhost_image() {
        if !rustix::process::geteuid().is_root() {
            println!("skipped: building the dev host image needs root");
            return;
        }
        let progress = |s: &str| println!("{s}");
        let img = ensure_variant(
            &flex_host::runner::ProcessRunner::new(),
            &default_cache_root(),
            Suite::Bookworm,
            Variant::Selinux,
            &progress,
        )
        .await
        .unwrap();
        let info = build_info(&img).unwrap();
        println!("{img:#?}\n{info:#?}");
        assert!(info.packages.iter().any(|p| p == "selinux-policy-default"));
        assert!(img.dir.to_string_lossy().contains("bookworm-selinux-"));
    }

    #[test]
    fn mmdebstrap_argv() {
        let a = mmdebstrap_args(
            Suite::Bookworm,
            &deb(),
            Path::new("/c/devhost/.build-x/tree"),
            Path::new("/c/devhost/.build-x/customize.sh"),
            Path::new("/c/it's/overlay"),
        );
        snap!("mmdebstrap_argv", a.join("\n"));
        assert!(a.contains(&"--include=systemd,systemd-sysv,udev,dbus,systemd-container,containerd,runc,iproute2,nftables,iptables,util-linux,mount,kmod,e2fsprogs,procps,linux-image-cloud-amd64,ca-certificates,ignition,openssh-server,libpam-systemd,libnss-myhostname,sudo,busybox-static,curl".to_string()));
        assert!(!PACKAGES.contains(&"jq"));
    }
}
