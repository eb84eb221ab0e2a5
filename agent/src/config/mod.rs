//! The agent's JSON configuration (`/etc/aks-flex-node/config.json`), as the upstream agent reads
//! it: every field, its defaults, the validation rules in their order, and the legacy shape.
//!
//! Loading is split as parse (pure: `&[u8]` → [`Config`]) and load (read the file, then parse):
//! [`parse`] takes the bytes and the host's facts (for the node name), [`load`] reads the file.
//!
//! Key handling (decided here, see `docs/config.md`): like Go's `encoding/json`, object keys of
//! the schema match case-insensitively (`"NodeName"` fills `agent.nodeName`), and keys the
//! schema does not know are ignored; unlike Go, each ignored key is reported (the CLI logs them
//! as a warning) so a typo does not go unnoticed. Keys inside free-form maps (`node.labels`,
//! `azure.arc.tags`) are kept exactly as written.
//!
//! The serde types are here; `keys` holds the schema the keys are matched against (`SCHEMA`:
//! a field missing from it is dropped as an unknown key), `legacy` the adapter of the pre-RP
//! shape, and `validate` the defaults and the rules in upstream's order. Go durations are the
//! API crate's ([`GoDuration`]), secrets the host crate's `Secret`.

mod keys;
mod legacy;
pub mod routing;
mod validate;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use flex_host::secret::Secret;

pub use flex_api::duration::{GoDuration, format_go_duration, parse_go_duration};
pub use validate::{
    ControllerEndpoint, EndpointError, MIN_RECONCILE_INTERVAL, TAINT_EFFECTS, UrlProblem,
    ValidationError, ValueError, api_server_url, check_ip, check_label_key, check_label_value,
    check_registry_mirror, check_taint, is_dns1123_subdomain, shown,
};

/// Default config path used by the systemd unit.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/aks-flex-node/config.json";
/// Default `agent.logDir`.
pub const DEFAULT_LOG_DIR: &str = "/var/log/aks-flex-node";
/// The daemon's default metrics address (`agent.metricsAddress`): loopback only.
pub const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:9469";
/// Label always forced on the node.
pub const MANAGED_LABEL: &str = "kubernetes.azure.com/managed";
/// Default `azure.targetAgentPoolName`.
pub const DEFAULT_AGENT_POOL: &str = "aksflexnodes";
/// Default `azure.arc.installerUrl` (Microsoft's, a moving target: the digest is pinned in
/// `installerSha256`).
pub const DEFAULT_ARC_INSTALLER_URL: &str = "https://gbl.his.arc.azure.com/azcmagent-linux";
/// Default runc version when no offline artifacts are configured.
pub const DEFAULT_RUNC_VERSION: &str = "1.1.12";
/// Default node-problem-detector version.
pub const DEFAULT_NPD_VERSION: &str = flex_api::versions::DEFAULT_NPD_VERSION;
/// Where node-problem-detector's release archives are by default.
pub const DEFAULT_NPD_BASE_URL: &str =
    "https://github.com/kubernetes/node-problem-detector/releases/download";

/// The whole configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Config {
    /// Azure identity and target cluster.
    pub azure: AzureConfig,
    /// The agent process itself.
    pub agent: AgentConfig,
    /// Component versions.
    pub components: Components,
    /// How the node machine is provisioned.
    pub bootstrap: BootstrapConfig,
    /// Cluster networking.
    pub networking: Networking,
    /// The Kubernetes node.
    pub node: NodeConfig,
    /// node-problem-detector.
    pub npd: NpdConfig,
    /// Host routing (validated when its tasks run, not at load).
    pub host_routing: HostRouting,
}

/// `azure`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AzureConfig {
    /// Defaults from `targetCluster.resourceId`.
    pub subscription_id: String,
    /// Required only when Arc is enabled.
    pub tenant_id: String,
    /// Cloud name, used only to default `resourceManagerEndpoint`.
    pub cloud: String,
    /// ARM endpoint; trailing `/` trimmed.
    pub resource_manager_endpoint: String,
    /// Present = configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_principal: Option<ServicePrincipal>,
    /// Present (even `{}`) = configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub managed_identity: Option<ManagedIdentity>,
    /// Present = configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootstrap_token: Option<BootstrapToken>,
    /// Azure Arc.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arc: Option<ArcConfig>,
    /// The AKS cluster the node joins.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_cluster: Option<TargetCluster>,
    /// Agent pool name; default `aksflexnodes`.
    pub target_agent_pool_name: String,
}

/// `azure.servicePrincipal`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServicePrincipal {
    /// Tenant.
    pub tenant_id: String,
    /// Application (client) id.
    pub client_id: String,
    /// Client secret (never logged).
    pub client_secret: Secret,
}

/// `azure.managedIdentity`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ManagedIdentity {
    /// User-assigned identity client id; empty = system-assigned.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub client_id: String,
}

/// `azure.bootstrapToken`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BootstrapToken {
    /// `<id>.<secret>` (never logged).
    pub token: Secret,
}

/// `azure.arc`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ArcConfig {
    /// Whether to connect the host to Azure Arc.
    pub enabled: bool,
    /// Arc machine name.
    pub machine_name: String,
    /// Tags for the Arc machine.
    pub tags: BTreeMap<String, String>,
    /// Arc resource group.
    pub resource_group: String,
    /// Arc location.
    pub location: String,
    /// Where the `azcmagent` installer script is downloaded from when `azcmagent` is missing.
    pub installer_url: String,
    /// The installer's SHA-256 (64 lowercase hex digits); required when enabled.
    pub installer_sha256: String,
}

/// `azure.targetCluster`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TargetCluster {
    /// ARM resource id of the managed cluster.
    pub resource_id: String,
    /// Cluster location.
    pub location: String,
    /// Derived from `resourceId` (not read from JSON).
    #[serde(skip)]
    pub name: String,
    /// Derived from `resourceId` (not read from JSON).
    #[serde(skip)]
    pub resource_group: String,
    /// Derived from `resourceId` (not read from JSON).
    #[serde(skip)]
    pub subscription_id: String,
}

/// `agent`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AgentConfig {
    /// `debug|info|warning|error`; default `info`.
    pub log_level: String,
    /// Default `/var/log/aks-flex-node`.
    pub log_dir: String,
    /// Kubernetes node name; default the lowercased hostname.
    pub node_name: String,
    /// Where the machine goal comes from.
    pub machine_client: MachineClientConfig,
    /// How often the daemon re-reads the machine goal; default 10m.
    pub machine_reconcile_interval: GoDuration,
    /// Whether `start` fails when machine registration fails.
    pub require_machine_registration: bool,
    /// `auto|disable`; default `auto`.
    pub machine_operation_mode: String,
    /// Where the daemon serves `/metrics`: `IP:PORT`, `:PORT` (every interface) or `0` (none);
    /// default `127.0.0.1:9469` (loopback only). See `docs/metrics.md`.
    pub metrics_address: String,
    /// The drain before a NodeReboot or an AgentReset, when the operation names none.
    pub drain: DrainConfig,
}

/// `agent.drain`: the node's default drain (an operation's `drainTimeout` and `onDrainTimeout`
/// parameters win). See `docs/operations.md#drain`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DrainConfig {
    /// How long evictions are tried and pods waited for: a Go duration from 1s to 24h;
    /// default 5m.
    pub timeout: GoDuration,
    /// `Fail` (default: the operation fails, the node is uncordoned, nothing is stopped) or
    /// `Proceed` (the operation runs with the pods left).
    pub on_timeout: String,
}

impl DrainConfig {
    /// The policy this config says (after validation; defaults where empty).
    pub fn policy(&self) -> flex_api::drain::DrainPolicy {
        let d = flex_api::drain::DrainPolicy::default();
        flex_api::drain::DrainPolicy {
            timeout: if self.timeout.0.is_zero() {
                d.timeout
            } else {
                self.timeout.0
            },
            on_timeout: flex_api::drain::OnTimeout::parse(&self.on_timeout).unwrap_or(d.on_timeout),
        }
    }
}

/// `agent.machineClient`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MachineClientConfig {
    /// `arm|in-cluster`; default `arm`.
    pub mode: String,
    /// For `in-cluster`: an API server path; for `arm`: an optional absolute URL.
    pub endpoint_url: String,
}

/// `components`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Components {
    /// Kubernetes version.
    pub kubernetes: String,
    /// containerd version.
    pub containerd: String,
    /// runc version.
    pub runc: String,
    /// Sandbox (pause) image.
    pub sandbox_image: String,
}

/// `bootstrap`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BootstrapConfig {
    /// OCI image the nspawn rootfs is made from; empty = default.
    pub oci_image: String,
    /// Offline artifacts bundle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offline_artifacts: Option<OfflineArtifacts>,
    /// Extra host devices for the machines: clean absolute `/dev/...` paths or systemd device
    /// group specifiers (`char-input`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub additional_host_devices: Vec<String>,
    /// Registries the agent may reach over plain HTTP (`host[:port]`, the explicit opt-in, as
    /// containerd's and Docker's insecure registries) when it pulls `ociImage` and `oci://`
    /// offline artifacts; every other registry is HTTPS. Not upstream's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub insecure_registries: Vec<String>,
    /// Credentials for the agent's own pulls (`ociImage`, `oci://` offline artifacts,
    /// AgentUpgrade images) from registries that ask for them. Not upstream's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registry_auth: Option<RegistryAuth>,
}

/// `bootstrap.registryAuth`: where the agent's registry client gets credentials when a registry
/// answers `401` (see `crate::machine::registry_auth`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RegistryAuth {
    /// A Docker-config-style file (`{"auths": {...}}`), read when a registry asks; empty: none.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub config_file: String,
    /// Registries (`host[:port]`) that are Azure Container Registries under another name (a
    /// custom domain, a test double), served by ACR's token exchange with the node's Azure
    /// credential as `*.azurecr.io`, `*.azurecr.cn` and `*.azurecr.us` always are.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub acr_registries: Vec<String>,
}

impl BootstrapConfig {
    /// [`BootstrapConfig::insecure_registries`] checked (config validation checks it at load,
    /// so this fails only for a config built in code).
    pub fn insecure_registries(
        &self,
    ) -> Result<flex_host::http::InsecureRegistries, flex_host::http::InsecureRegistryError> {
        flex_host::http::InsecureRegistries::from_entries(
            "bootstrap.insecureRegistries",
            &self.insecure_registries,
        )
    }
}

/// `bootstrap.offlineArtifacts`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OfflineArtifacts {
    /// Template: absolute path, `file://` or `oci://`.
    pub source: String,
}

/// `networking`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Networking {
    /// Cluster DNS service IP; default `10.0.0.10`.
    #[serde(rename = "dnsServiceIP")]
    pub dns_service_ip: String,
    /// CNI plugins version.
    pub cni_version: String,
}

/// `node`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeConfig {
    /// Default 110.
    pub max_pods: i64,
    /// Node labels; `kubernetes.azure.com/managed=false` is always set.
    pub labels: BTreeMap<String, String>,
    /// `key=value:Effect` or `key:Effect`.
    pub taints: Vec<String>,
    /// kubelet settings.
    pub kubelet: KubeletConfig,
    /// Registry host (`registry.k8s.io`, `host:port`) → the mirror the machines' containerd
    /// pulls its images from first (`http://10.0.2.2:5000`; plain HTTP allowed), falling back
    /// to the registry itself.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub registry_mirrors: BTreeMap<String, String>,
}

/// `node.kubelet`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletConfig {
    /// Default 2.
    pub verbosity: i64,
    /// Default 85. The key is `imageGCHighThreshold`, as upstream and docs/config.md spell it
    /// (camelCase would make it `imageGcHighThreshold`, which the key canonicaliser never
    /// produces: the value was dropped).
    #[serde(rename = "imageGCHighThreshold")]
    pub image_gc_high_threshold: i64,
    /// Default 80 (`imageGCLowThreshold`).
    #[serde(rename = "imageGCLowThreshold")]
    pub image_gc_low_threshold: i64,
    /// API server host (`host`, `host:port` or a URL).
    #[serde(rename = "clusterFQDN")]
    pub cluster_fqdn: String,
    /// Base64 PEM of the cluster CA.
    pub ca_cert_data: String,
    /// Node IP override.
    #[serde(rename = "nodeIP")]
    pub node_ip: String,
}

/// `npd`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NpdConfig {
    /// Default `v1.35.1`.
    pub version: String,
    /// Where the release archives are (`<baseURL>/<version>/node-problem-detector-<version>-linux_<arch>.tar.gz`);
    /// default [`DEFAULT_NPD_BASE_URL`]. Not upstream's.
    #[serde(rename = "baseURL")]
    pub base_url: String,
    /// The archive's SHA-256 (64 hex digits); without it `<archive URL>.sha256` is fetched.
    /// Not upstream's.
    pub sha256: String,
}

/// `hostRouting`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HostRouting {
    /// Static routes.
    pub static_routes: StaticRoutes,
    /// Route overlap check.
    pub route_overlap: RouteOverlap,
}

/// `hostRouting.staticRoutes`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StaticRoutes {
    /// Whether the routes are applied.
    pub enabled: bool,
    /// The routes.
    pub routes: Vec<StaticRoute>,
}

/// One static route.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StaticRoute {
    /// IPv4 CIDR.
    pub destination: String,
    /// Gateway; empty = from the default route.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub gateway: String,
    /// Device; empty = from the default route.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub dev: String,
    /// Route metric.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric: Option<u32>,
}

/// `hostRouting.routeOverlap`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RouteOverlap {
    /// IPv4 CIDRs expected to route off the default interface.
    pub expected_cidrs: Vec<String>,
    /// `WARN` (default) or `STRICT`.
    pub mode: String,
}

/// Why a config could not be loaded.
///
/// Each message includes its cause, so no variant reports a `source()` as well: a chain
/// printer (`{:#}`) would print the cause a second time.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// No path was given.
    #[error("config file path is required")]
    NoPath,
    /// The file could not be read.
    #[error("failed to read config file at {path}: {cause}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The OS error (in the message, not a `source()`).
        cause: std::io::Error,
    },
    /// The file is larger than [`MAX_CONFIG_BYTES`].
    #[error(
        "config file at {path} is larger than 1 MiB ({MAX_CONFIG_BYTES} bytes); is it the right file?"
    )]
    TooLarge {
        /// The path.
        path: PathBuf,
    },
    /// The bytes are not valid JSON for the schema.
    #[error("failed to parse config file: {0}")]
    Parse(String),
    /// A field failed validation.
    #[error("config validation failed: {0}")]
    Invalid(ValidationError),
}

impl From<ValidationError> for ConfigError {
    fn from(e: ValidationError) -> Self {
        Self::Invalid(e)
    }
}

/// The largest config file read: 1 MiB, far above any real config, so that a wrong path
/// (`/dev/zero`, a log file) fails at once instead of being read until memory runs out.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// A parsed, defaulted and validated config plus what parsing noticed.
#[derive(Clone, Debug, PartialEq)]
pub struct Loaded {
    /// The config.
    pub config: Config,
    /// Keys the schema does not know, as dotted paths (ignored, as Go ignores them).
    pub unknown_keys: Vec<String>,
}

/// Parses, adapts legacy fields, applies defaults and validates. `hostname` supplies the node
/// name when `agent.nodeName` is empty.
pub fn parse(
    bytes: &[u8],
    hostname: &dyn Fn() -> std::io::Result<String>,
) -> Result<Loaded, ConfigError> {
    let raw: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| ConfigError::Parse(e.to_string()))?;
    if !raw.is_object() {
        return Err(ConfigError::Parse("top level must be a JSON object".into()));
    }
    let (canonical, unknown_keys) = keys::canonicalize(&raw);
    let mut config: Config = serde_path_to_error(canonical)?;
    legacy::apply(&mut config, &raw);
    validate::validate(&mut config, hostname)?;
    Ok(Loaded {
        config,
        unknown_keys,
    })
}

fn serde_path_to_error(v: serde_json::Value) -> Result<Config, ConfigError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        ConfigError::Parse(format!(
            "{path}: {}",
            redact_serde_message(&e.inner().to_string())
        ))
    })
}

// The pattern is a literal checked by the tests; compiling it cannot fail.
#[allow(clippy::expect_used)]
static UNEXPECTED_VALUE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
    regex::Regex::new(
        r#"^(invalid (?:type|value|length)): ([a-z ]+?)(?: `[^`]*`| "(?:[^"\\]|\\.)*"| '[^']*')?, expected (.*)$"#,
    )
    .expect("static regex")
});

/// serde's "invalid type/value" messages without the value they quote (`invalid type: integer
/// `123456`, expected a string` → `invalid type: integer, expected a string`): the value may be
/// a secret put in the wrong place. Other messages (from the schema's own parsers) are cut to
/// a bounded length.
fn redact_serde_message(m: &str) -> String {
    if let Some(c) = UNEXPECTED_VALUE.captures(m) {
        return format!("{}: {}, expected {}", &c[1], &c[2], &c[3]);
    }
    if m.starts_with("invalid type: ") || m.starts_with("invalid value: ") {
        // An unexpected shape of the message: keep the kind, drop the rest.
        return m.split(':').next().unwrap_or("invalid value").to_string();
    }
    if m.len() > 300 {
        let cut = m.char_indices().nth(300).map_or(m.len(), |(i, _)| i);
        return format!("{}…({} bytes)", &m[..cut], m.len());
    }
    m.to_string()
}

/// Reads `path` and [`parse`]s it. At most [`MAX_CONFIG_BYTES`] are read.
pub fn load(
    path: &Path,
    hostname: &dyn Fn() -> std::io::Result<String>,
) -> Result<Loaded, ConfigError> {
    use std::io::Read as _;
    if path.as_os_str().is_empty() {
        return Err(ConfigError::NoPath);
    }
    let read_err = |cause| ConfigError::Read {
        path: path.to_path_buf(),
        cause,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(read_err)?
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    parse(&bytes, hostname)
}

impl Config {
    /// The API server URL derived from `node.kubelet.clusterFQDN` (see [`api_server_url`]).
    pub fn api_server_url(&self) -> String {
        api_server_url(&self.node.kubelet.cluster_fqdn)
    }

    /// Whether a bootstrap token is configured.
    pub fn has_bootstrap_token(&self) -> bool {
        self.azure.bootstrap_token.is_some()
    }

    /// Whether offline artifacts are configured.
    pub fn offline(&self) -> bool {
        self.bootstrap
            .offline_artifacts
            .as_ref()
            .is_some_and(|o| !o.source.trim().is_empty())
    }

    /// Serialises as the agent writes configs: JSON, 2-space indent, trailing newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_else(|_| "{}".into());
        s.push('\n');
        s
    }
}

#[cfg(test)]
mod tests;
