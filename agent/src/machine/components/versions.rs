//! Component versions: what the config and the download overrides ask for
//! ([`RequestedVersions`]) and, for downloads, the versions after defaults ([`Versions`]).
//!
//! Versions are kept without a leading `v`. Precedence per component: the download override's
//! `version`, then the config (`components.kubernetes`, `components.containerd`,
//! `components.runc`, `networking.cniVersion`), then the default (containerd
//! [`DEFAULT_CONTAINERD_VERSION`], runc [`DEFAULT_RUNC_VERSION`], CNI [`DEFAULT_CNI_VERSION`],
//! crictl `<major>.<minor>.0` of Kubernetes). The config already defaults runc to `1.1.12`
//! (upstream AKS Flex Node) unless offline artifacts are configured, so with a validated online
//! config runc is `1.1.12`; `1.5.0` applies when the config leaves it empty. With offline
//! artifacts no default applies: a version nobody gave comes from the bundle's file name.

use super::error::ComponentsError;
use super::sources::Downloads;
use crate::config::Config;

pub use flex_api::versions::{
    DEFAULT_CNI_VERSION, DEFAULT_CONTAINERD_VERSION, DEFAULT_RUNC_VERSION, crictl_version_for,
    is_version, strip_v,
};

/// Versions the config and overrides ask for; `None` = not given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestedVersions {
    /// Kubernetes (kubelet, kubectl, kube-proxy); always given.
    pub kubernetes: String,
    /// containerd.
    pub containerd: Option<String>,
    /// runc.
    pub runc: Option<String>,
    /// CNI plugins.
    pub cni: Option<String>,
    /// crictl (only a download override gives one).
    pub crictl: Option<String>,
}

/// The version of every component, defaults applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versions {
    /// Kubernetes, without a leading `v`.
    pub kubernetes: String,
    /// containerd.
    pub containerd: String,
    /// runc.
    pub runc: String,
    /// CNI plugins.
    pub cni: String,
    /// crictl: `<major>.<minor>.0` of Kubernetes unless overridden.
    pub crictl: String,
}

impl Versions {
    /// Versions from the config and the overrides, defaults applied.
    pub fn resolve(config: &Config, downloads: &Downloads) -> Result<Self, ComponentsError> {
        Self::from_requested(RequestedVersions::resolve(config, downloads)?)
    }

    /// Applies the defaults to `req`.
    pub fn from_requested(req: RequestedVersions) -> Result<Self, ComponentsError> {
        let crictl = match req.crictl {
            Some(v) => v,
            None => crictl_version_for(&req.kubernetes)
                .map_err(|e| ComponentsError::config("components.kubernetes", e.to_string()))?,
        };
        Ok(Self {
            containerd: req
                .containerd
                .unwrap_or_else(|| DEFAULT_CONTAINERD_VERSION.into()),
            runc: req.runc.unwrap_or_else(|| DEFAULT_RUNC_VERSION.into()),
            cni: req.cni.unwrap_or_else(|| DEFAULT_CNI_VERSION.into()),
            kubernetes: req.kubernetes,
            crictl,
        })
    }
}

impl RequestedVersions {
    /// What the config and the overrides give, each checked to be a plain version string.
    pub fn resolve(config: &Config, downloads: &Downloads) -> Result<Self, ComponentsError> {
        let kubernetes = pick(
            &downloads.kubernetes.version,
            "downloads.kubernetes.version",
            &config.components.kubernetes,
            "components.kubernetes",
        )?
        .ok_or_else(|| ComponentsError::config("components.kubernetes", "is required"))?;
        crictl_version_for(&kubernetes)
            .map_err(|e| ComponentsError::config("components.kubernetes", e.to_string()))?;
        Ok(Self {
            kubernetes,
            containerd: pick(
                &downloads.containerd.version,
                "downloads.containerd.version",
                &config.components.containerd,
                "components.containerd",
            )?,
            runc: pick(
                &downloads.runc.version,
                "downloads.runc.version",
                &config.components.runc,
                "components.runc",
            )?,
            cni: pick(
                &downloads.cni.version,
                "downloads.cni.version",
                &config.networking.cni_version,
                "networking.cniVersion",
            )?,
            crictl: pick(
                &downloads.crictl.version,
                "downloads.crictl.version",
                "",
                "",
            )?,
        })
    }
}

/// The override if set, else the config value, without a leading `v`; `None` when both are
/// empty.
fn pick(
    over: &str,
    over_field: &str,
    config: &str,
    config_field: &str,
) -> Result<Option<String>, ComponentsError> {
    for (value, field) in [(over, over_field), (config, config_field)] {
        let v = strip_v(value);
        if v.is_empty() {
            continue;
        }
        if !is_version(v) {
            return Err(ComponentsError::config(
                field,
                format!("{value:?} is not a version (digits, letters, '.', '-', '+', '_')"),
            ));
        }
        return Ok(Some(v.to_string()));
    }
    Ok(None)
}
