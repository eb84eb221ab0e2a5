//! [`ComponentPlan`]: for each component the exact artifact locations, the destinations inside
//! the rootfs and the rule that says it is already installed (unbounded §5.2).
//!
//! | Component | Artifact | Destination (rootfs-relative) | Already installed when |
//! |---|---|---|---|
//! | kubernetes | `kubelet`, `kubectl`, `kube-proxy`, each with `<artifact>.sha256` | `usr/local/bin/<bin>` | all three executable and `kubelet --version` is `Kubernetes v<ver>` |
//! | crictl | tar.gz member `crictl` | `usr/local/bin/crictl` | executable and the 3rd field of `crictl --version` is `v<cv>` |
//! | containerd | tar.gz members under `bin/` | `usr/local/bin/<name>` | `ctr`, `containerd`, `containerd-shim-runc-v2`, `containerd-stress` executable and `containerd --version` contains `<v>` |
//! | runc | one file | `usr/local/bin/runc` | executable and `runc --version` contains `<v>` |
//! | cni-plugins | every regular tgz member | `opt/cni/bin/<name>` | `bridge`, `host-local`, `loopback` executable and `loopback --version` contains `<v>` |
//! | node-problem-detector | tar.gz members `bin/node-problem-detector`, `config/kernel-monitor.json`, the archive checked against `npd.sha256` or its `.sha256` | `usr/local/bin/node-problem-detector`, `etc/node-problem-detector/kernel-monitor.json` (0644) | executable and `--version` contains `<v>` |
//!
//! With offline artifacts and no runc version anywhere (the bundle's `runc.<arch>` carries none),
//! runc counts as installed when the installed file is byte-identical to the bundle's.
//!
//! Resolution is pure: online plans carry every URL; offline plans carry the expanded source
//! and are turned into specs once the bundle is on disk (`offline`).

use super::download::DOWNLOAD_RETRY;
use super::error::ComponentsError;
use super::offline::{OfflineSource, expand_source_template};
use super::sources::{self, Downloads};
use super::spec::{
    Checksum, Component, ComponentSpec, KUBE_BINARIES, Location, cni_spec, containerd_spec,
    crictl_spec, kubernetes_spec, npd_asset, npd_spec, runc_spec,
};
use super::versions::{RequestedVersions, Versions};
use crate::config::{Config, NpdConfig};
use flex_host::retry::Backoff;

/// Where the components come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanSource {
    /// Downloads: the versions and every component's spec.
    Online {
        /// The versions.
        versions: Versions,
        /// One spec per component, in [`Component::ALL`] order.
        specs: Vec<ComponentSpec>,
    },
    /// An offline bundle; specs are made once it is on disk.
    Offline {
        /// The expanded source.
        source: OfflineSource,
        /// The versions given (the rest come from the bundle's file names).
        versions: RequestedVersions,
        /// node-problem-detector's version and pinned checksum, taken when the bundle has it.
        npd: NpdConfig,
    },
}

/// The resolved install plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentPlan {
    /// `amd64` or `arm64`.
    pub arch: String,
    /// Downloads or an offline bundle.
    pub source: PlanSource,
    /// Retries for failed downloads (3 with backoff by default; tests shorten it).
    pub retry: Backoff,
}

impl ComponentPlan {
    /// Resolves the plan: offline artifacts when `bootstrap.offlineArtifacts.source` is set,
    /// downloads otherwise. `arch` is `amd64` or `arm64` (see [`super::host_arch`]).
    /// With offline artifacts the `url`/`baseURL` overrides do not apply (everything comes from
    /// the bundle); their `version`s still do.
    pub fn resolve(
        config: &Config,
        arch: &str,
        downloads: Downloads,
    ) -> Result<Self, ComponentsError> {
        if !matches!(arch, "amd64" | "arm64") {
            return Err(ComponentsError::UnsupportedArch(arch.to_string()));
        }
        let requested = RequestedVersions::resolve(config, &downloads)?;
        let source = match config.bootstrap.offline_artifacts.as_ref() {
            Some(o) if !o.source.trim().is_empty() => {
                if downloads.has_url_overrides() {
                    tracing::warn!(
                        "download url/baseURL overrides do not apply to offline artifacts; \
                         every component comes from the bundle"
                    );
                }
                let expanded =
                    expand_source_template(o.source.trim(), &format!("v{}", requested.kubernetes))?;
                PlanSource::Offline {
                    source: OfflineSource::parse(&expanded)?,
                    versions: requested,
                    npd: config.npd.clone(),
                }
            }
            _ => {
                let versions = Versions::from_requested(requested)?;
                let mut specs = online_specs(&versions, arch, &downloads)?;
                if !config.npd.version.is_empty() {
                    specs.push(online_npd(&config.npd, arch));
                }
                PlanSource::Online { versions, specs }
            }
        };
        Ok(Self {
            arch: arch.to_string(),
            source,
            retry: DOWNLOAD_RETRY,
        })
    }

    /// The specs of an online plan (`None` for offline artifacts).
    pub fn specs(&self) -> Option<&[ComponentSpec]> {
        match &self.source {
            PlanSource::Online { specs, .. } => Some(specs),
            PlanSource::Offline { .. } => None,
        }
    }

    /// The spec of `component` in an online plan.
    pub fn spec(&self, component: Component) -> Option<&ComponentSpec> {
        self.specs()?.iter().find(|s| s.component == component)
    }

    /// Whether the components come from an offline bundle.
    pub fn is_offline(&self) -> bool {
        matches!(self.source, PlanSource::Offline { .. })
    }
}

/// node-problem-detector from `<npd.baseURL>/<version>/<asset>` (validated at load), checked
/// against `npd.sha256`, else against `<asset URL>.sha256`.
fn online_npd(npd: &NpdConfig, arch: &str) -> ComponentSpec {
    let url = format!(
        "{}/{}/{}",
        npd.base_url.trim_end_matches('/'),
        npd.version,
        npd_asset(&npd.version, arch)
    );
    let checksum = match npd.sha256.as_str() {
        "" => Checksum::File(Location::Url(format!("{url}.sha256"))),
        pinned => Checksum::Pinned(pinned.to_string()),
    };
    npd_spec(&npd.version, Location::Url(url), checksum)
}

fn online_specs(
    v: &Versions,
    arch: &str,
    d: &Downloads,
) -> Result<Vec<ComponentSpec>, ComponentsError> {
    let mut kube = Vec::new();
    for bin in KUBE_BINARIES {
        let url = sources::kubernetes_url(&d.kubernetes, &v.kubernetes, arch, bin)?;
        kube.push((
            bin,
            Location::Url(url.clone()),
            Location::Url(format!("{url}.sha256")),
        ));
    }
    Ok(vec![
        kubernetes_spec(&v.kubernetes, kube),
        crictl_spec(
            &v.crictl,
            Location::Url(sources::crictl_url(&d.crictl, &v.crictl, arch)?),
        ),
        containerd_spec(
            &v.containerd,
            Location::Url(sources::containerd_url(&d.containerd, &v.containerd, arch)?),
        ),
        runc_spec(
            Some(&v.runc),
            Location::Url(sources::runc_url(&d.runc, &v.runc, arch)?),
        ),
        cni_spec(
            &v.cni,
            Location::Url(sources::cni_url(&d.cni, &v.cni, arch)?),
        ),
    ])
}
