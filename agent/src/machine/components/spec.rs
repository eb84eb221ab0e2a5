//! What one component is and where its files go: [`Component`], the artifact [`Location`]s, the
//! [`Payload`] and the [`SkipRule`] that says it is already installed, as a [`ComponentSpec`];
//! and the spec builders the online plan (`plan`) and offline bundles (`offline`) share. Data and
//! pure constructors only.

use std::fmt;
use std::path::{Path, PathBuf};

/// Preflight check for the Kubernetes binaries.
pub const CHECK_KUBERNETES: &str = "kubernetes-artifacts";
/// Preflight check for containerd, runc and crictl.
pub const CHECK_CRI: &str = "cri-artifacts";
/// Preflight check for the CNI plugins.
pub const CHECK_CNI: &str = "cni-artifacts";
/// Preflight check for node-problem-detector (upstream's name).
pub const CHECK_NPD: &str = "npd-artifact";
/// node-problem-detector's binary, relative to the rootfs.
pub const NPD_BIN: &str = "usr/local/bin/node-problem-detector";
/// Its unit inside a machine, relative to the rootfs (`nodeconfig` writes it).
pub const NPD_UNIT: &str = "etc/systemd/system/node-problem-detector.service";
/// Its kernel monitor configuration, relative to the rootfs.
pub const NPD_KERNEL_MONITOR: &str = "etc/node-problem-detector/kernel-monitor.json";
/// Where binaries go inside the rootfs.
pub(crate) const BIN_DIR: &str = "usr/local/bin";
/// Where CNI plugins go inside the rootfs.
pub(crate) const CNI_BIN_DIR: &str = "opt/cni/bin";
/// The Kubernetes binaries.
pub(crate) const KUBE_BINARIES: [&str; 3] = ["kubelet", "kubectl", "kube-proxy"];
/// The containerd binaries that must be executable for containerd to count as installed.
pub(crate) const CONTAINERD_BINARIES: [&str; 4] = [
    "ctr",
    "containerd",
    "containerd-shim-runc-v2",
    "containerd-stress",
];
/// The CNI plugins that must be executable for the plugins to count as installed.
pub(crate) const CNI_REQUIRED: [&str; 3] = ["bridge", "host-local", "loopback"];

/// A node component.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Component {
    /// kubelet, kubectl, kube-proxy.
    Kubernetes,
    /// crictl.
    Crictl,
    /// containerd and its shims.
    Containerd,
    /// runc.
    Runc,
    /// The CNI plugins.
    Cni,
    /// node-problem-detector: optional, not in [`Component::ALL`]; a failure to install it is a
    /// warning, never a failed provision.
    Npd,
}

impl Component {
    /// Every component, in install-report order.
    pub const ALL: [Component; 5] = [
        Component::Kubernetes,
        Component::Crictl,
        Component::Containerd,
        Component::Runc,
        Component::Cni,
    ];

    /// The name used in logs and errors.
    pub fn name(self) -> &'static str {
        match self {
            Component::Kubernetes => "kubernetes",
            Component::Crictl => "crictl",
            Component::Containerd => "containerd",
            Component::Runc => "runc",
            Component::Cni => "cni-plugins",
            Component::Npd => "node-problem-detector",
        }
    }

    /// The preflight check that covers this component.
    pub fn check(self) -> &'static str {
        match self {
            Component::Kubernetes => CHECK_KUBERNETES,
            Component::Crictl | Component::Containerd | Component::Runc => CHECK_CRI,
            Component::Cni => CHECK_CNI,
            Component::Npd => CHECK_NPD,
        }
    }
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where an artifact comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// An `http`/`https` URL.
    Url(String),
    /// A file of an offline bundle, as a real path on this machine (already under the
    /// [`HostFs`](flex_host::fs::HostFs) root).
    File(PathBuf),
}

impl fmt::Display for Location {
    /// URLs are redacted ([`flex_host::secret::redact_url`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Url(u) => f.write_str(&flex_host::secret::redact_url(u)),
            Location::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A binary verified against a `.sha256` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binary {
    /// Its name (`kubelet`).
    pub name: String,
    /// The binary.
    pub source: Location,
    /// Its checksum file: the first whitespace-separated field is the hex SHA-256.
    pub checksum: Location,
    /// Destination, relative to the rootfs.
    pub dest: PathBuf,
}

/// Which tar members a component installs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Members {
    /// The one member with this name (required).
    Named(String),
    /// Every regular member under this directory prefix (`bin/`), installed without it.
    Under(String),
    /// Every regular member.
    AllRegular,
    /// Each named member (all required) to its own path under the destination, with its mode.
    Map(Vec<(String, PathBuf, u32)>),
}

/// What an archive's SHA-256 must be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checksum {
    /// Given in the config (64 hex digits).
    Pinned(String),
    /// A `.sha256` file: the first whitespace-separated field is the hex SHA-256.
    File(Location),
}

/// What a component downloads and where it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// Binaries each verified against a `.sha256`; all are verified before any is installed.
    Verified(Vec<Binary>),
    /// A gzip tar archive whose selected regular members go under `dest_dir` (rootfs-relative).
    Archive {
        /// The archive.
        source: Location,
        /// The members taken.
        members: Members,
        /// Destination directory, relative to the rootfs.
        dest_dir: PathBuf,
        /// Verified before any member is installed, when given.
        checksum: Option<Checksum>,
    },
    /// One file.
    File {
        /// The file.
        source: Location,
        /// Destination, relative to the rootfs.
        dest: PathBuf,
    },
}

impl Payload {
    /// Every artifact location, binaries before their checksums.
    pub fn locations(&self) -> Vec<&Location> {
        match self {
            Payload::Verified(bins) => bins.iter().flat_map(|b| [&b.source, &b.checksum]).collect(),
            Payload::Archive { source, .. } | Payload::File { source, .. } => vec![source],
        }
    }
}

/// How a `--version` output must look for the installed version to match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionMatch {
    /// Exactly two fields, the second `v<ver>` or `<ver>` (`Kubernetes v1.35.0`).
    Kubernetes(String),
    /// Exactly three fields, the third equal to this (`crictl version v1.35.0`).
    ThirdField(String),
    /// The output contains this.
    Contains(String),
}

impl VersionMatch {
    /// Whether `stdout` of `--version` matches.
    /// An empty expected version never matches.
    pub fn matches(&self, stdout: &str) -> bool {
        let (VersionMatch::Kubernetes(v) | VersionMatch::ThirdField(v) | VersionMatch::Contains(v)) =
            self;
        if v.is_empty() {
            return false;
        }
        let fields: Vec<&str> = stdout.split_whitespace().collect();
        match self {
            VersionMatch::Kubernetes(v) => {
                fields.len() == 2 && fields[1].strip_prefix('v').unwrap_or(fields[1]) == v
            }
            VersionMatch::ThirdField(v) => fields.len() == 3 && fields[2] == v,
            VersionMatch::Contains(v) => stdout.contains(v.as_str()),
        }
    }
}

/// When a component counts as already installed (nothing is downloaded then).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipRule {
    /// Every file of `executables` is an executable regular file and `<probe> --version`,
    /// run through the runner by its real path, exits 0 with matching output.
    Version {
        /// Rootfs-relative files that must be executable.
        executables: Vec<PathBuf>,
        /// Rootfs-relative binary to run with `--version`.
        probe: PathBuf,
        /// What its output must look like.
        expect: VersionMatch,
    },
    /// The installed file (rootfs-relative) is executable and has the same bytes as `source`
    /// (a bundle file); for runc from an offline bundle when no version is known.
    SameContent {
        /// Rootfs-relative installed file.
        installed: PathBuf,
        /// The bundle file (real path).
        source: PathBuf,
    },
}

/// Everything needed to install one component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentSpec {
    /// The component.
    pub component: Component,
    /// Its version (`None` only for runc from a bundle when nobody gave one).
    pub version: Option<String>,
    /// What to fetch and where it goes.
    pub payload: Payload,
    /// When to skip it.
    pub skip: SkipRule,
}

fn bin(name: &str) -> PathBuf {
    Path::new(BIN_DIR).join(name)
}

/// kubelet, kubectl, kube-proxy from `(name, binary, checksum)` triples.
pub(crate) fn kubernetes_spec(
    version: &str,
    binaries: Vec<(&str, Location, Location)>,
) -> ComponentSpec {
    ComponentSpec {
        component: Component::Kubernetes,
        version: Some(version.to_string()),
        payload: Payload::Verified(
            binaries
                .into_iter()
                .map(|(name, source, checksum)| Binary {
                    name: name.to_string(),
                    source,
                    checksum,
                    dest: bin(name),
                })
                .collect(),
        ),
        skip: SkipRule::Version {
            executables: KUBE_BINARIES.iter().map(|b| bin(b)).collect(),
            probe: bin("kubelet"),
            expect: VersionMatch::Kubernetes(version.to_string()),
        },
    }
}

pub(crate) fn crictl_spec(version: &str, source: Location) -> ComponentSpec {
    ComponentSpec {
        component: Component::Crictl,
        version: Some(version.to_string()),
        payload: Payload::Archive {
            source,
            members: Members::Named("crictl".into()),
            dest_dir: PathBuf::from(BIN_DIR),
            checksum: None,
        },
        skip: SkipRule::Version {
            executables: vec![bin("crictl")],
            probe: bin("crictl"),
            expect: VersionMatch::ThirdField(format!("v{version}")),
        },
    }
}

pub(crate) fn containerd_spec(version: &str, source: Location) -> ComponentSpec {
    ComponentSpec {
        component: Component::Containerd,
        version: Some(version.to_string()),
        payload: Payload::Archive {
            source,
            members: Members::Under("bin/".into()),
            dest_dir: PathBuf::from(BIN_DIR),
            checksum: None,
        },
        skip: SkipRule::Version {
            executables: CONTAINERD_BINARIES.iter().map(|b| bin(b)).collect(),
            probe: bin("containerd"),
            expect: VersionMatch::Contains(version.to_string()),
        },
    }
}

pub(crate) fn runc_spec(version: Option<&str>, source: Location) -> ComponentSpec {
    let skip = match (version, &source) {
        (None, Location::File(p)) => SkipRule::SameContent {
            installed: bin("runc"),
            source: p.clone(),
        },
        _ => SkipRule::Version {
            executables: vec![bin("runc")],
            probe: bin("runc"),
            expect: VersionMatch::Contains(version.unwrap_or_default().to_string()),
        },
    };
    ComponentSpec {
        component: Component::Runc,
        version: version.map(str::to_string),
        payload: Payload::File {
            source,
            dest: bin("runc"),
        },
        skip,
    }
}

pub(crate) fn cni_spec(version: &str, source: Location) -> ComponentSpec {
    let dir = Path::new(CNI_BIN_DIR);
    ComponentSpec {
        component: Component::Cni,
        version: Some(version.to_string()),
        payload: Payload::Archive {
            source,
            members: Members::AllRegular,
            dest_dir: dir.to_path_buf(),
            checksum: None,
        },
        skip: SkipRule::Version {
            executables: CNI_REQUIRED.iter().map(|p| dir.join(p)).collect(),
            probe: dir.join("loopback"),
            expect: VersionMatch::Contains(version.to_string()),
        },
    }
}

/// node-problem-detector's release asset for `version` (`v1.35.1`) and `arch`.
pub(crate) fn npd_asset(version: &str, arch: &str) -> String {
    format!("node-problem-detector-{version}-linux_{arch}.tar.gz")
}

/// node-problem-detector from its release archive (`bin/node-problem-detector`,
/// `config/kernel-monitor.json`), verified against `checksum`.
pub(crate) fn npd_spec(version: &str, source: Location, checksum: Checksum) -> ComponentSpec {
    ComponentSpec {
        component: Component::Npd,
        version: Some(version.to_string()),
        payload: Payload::Archive {
            source,
            members: Members::Map(vec![
                ("bin/node-problem-detector".into(), NPD_BIN.into(), 0o755),
                (
                    "config/kernel-monitor.json".into(),
                    NPD_KERNEL_MONITOR.into(),
                    0o644,
                ),
            ]),
            dest_dir: PathBuf::new(),
            checksum: Some(checksum),
        },
        skip: SkipRule::Version {
            executables: vec![NPD_BIN.into()],
            probe: NPD_BIN.into(),
            expect: VersionMatch::Contains(version.to_string()),
        },
    }
}
