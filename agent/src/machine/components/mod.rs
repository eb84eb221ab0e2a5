//! The Kubernetes node components installed into a machine's root file system
//! (`/var/lib/machines/<m>`), as unbounded's rootfs phase does (`DownloadKubeBinaries`,
//! `DownloadCRIBinaries`, `DownloadCNIBinaries`): kubelet, kubectl, kube-proxy, crictl,
//! containerd, runc and the CNI plugins; and, optionally, node-problem-detector (upstream's
//! `download-npd`).
//!
//! One module per concept:
//! - `versions`: [`Versions`] — which version of each component (pure);
//! - `sources`: [`Downloads`] overrides and the default release URLs (pure);
//! - `plan`: [`ComponentPlan`] — per component the exact URLs or bundle files, the destination
//!   paths inside the rootfs and the "already installed" rule (pure, apart from listing an
//!   offline bundle once it is on disk);
//! - `offline`: `bootstrap.offlineArtifacts.source` — template expansion, the source kinds
//!   (directory, `.tar.gz`, `oci://`) and the bundle layout (`docs/offline-artifacts.md`);
//! - `download`: HTTP downloads with retries into a staging directory, SHA-256 while streaming;
//! - `archive`: gzip tar reading with member-name checks;
//! - `install`: [`install_components`] — skip probes through the [`Runner`](flex_host::runner),
//!   concurrent installs, atomic writes confined to the rootfs
//!   ([`ConfinedFs`](flex_host::fs::ConfinedFs));
//! - `reachability`: [`check_reachable`] for the `kubernetes-artifacts`, `cri-artifacts` and
//!   `cni-artifacts` preflight checks;
//! - `error`: [`ComponentsError`] and [`ComponentError`] (component, step, URL, cause).
//!
//! URLs are shown with their user info and query string redacted (a mirror URL may carry a
//! token); nothing here logs a secret.

mod archive;
mod download;
mod error;
mod install;
mod offline;
mod plan;
mod reachability;
mod sources;
mod spec;
mod versions;

#[cfg(test)]
mod tests;

pub(crate) use download::download_to_file;
pub use download::{DOWNLOAD_RETRY, MAX_DOWNLOAD_BYTES};
pub use error::{ComponentError, ComponentsError, Failure, Step};
pub use install::{
    ComponentReport, InstallReport, Outcome, STAGING_PREFIX, install_components,
    install_components_with,
};
pub use offline::{
    ArtifactFetcher, OciArtifactFetcher, OfflineSource, SOURCE_FIELD, expand_source_template,
};
pub use plan::{ComponentPlan, PlanSource};
pub use reachability::{
    CHECK_CNI, CHECK_CRI, CHECK_KUBERNETES, check_reachable, check_reachable_with,
};
pub use sources::{
    CNI_BASE_URL, CONTAINERD_BASE_URL, CRICTL_BASE_URL, DownloadSource, Downloads, FormatError,
    KUBERNETES_BASE_URL, RUNC_BASE_URL, go_format,
};
pub use spec::{
    Binary, CHECK_NPD, Checksum, Component, ComponentSpec, Location, Members, NPD_BIN,
    NPD_KERNEL_MONITOR, NPD_UNIT, Payload, SkipRule, VersionMatch,
};
pub use versions::{
    DEFAULT_CNI_VERSION, DEFAULT_CONTAINERD_VERSION, DEFAULT_RUNC_VERSION, RequestedVersions,
    Versions, crictl_version_for,
};

/// The machine architecture in release-asset spelling, from the architecture this binary was
/// built for: `x86_64` → `amd64`, `aarch64` → `arm64`; anything else is an error.
pub fn host_arch() -> Result<&'static str, ComponentsError> {
    arch_from_rust(std::env::consts::ARCH)
}

fn arch_from_rust(arch: &str) -> Result<&'static str, ComponentsError> {
    match arch {
        "x86_64" => Ok("amd64"),
        "aarch64" => Ok("arm64"),
        other => Err(ComponentsError::UnsupportedArch(other.to_string())),
    }
}
