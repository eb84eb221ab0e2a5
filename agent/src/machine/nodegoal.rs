//! The resolved goal of one node machine (`ResolveMachine`): everything the machine layer needs
//! to provision, configure and start `kube1` or `kube2`, derived from the config and host facts
//! by a pure function so it can be table-tested.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::config::Config;
use crate::machine::nspawn;
use flex_host::secret::Secret;

/// Default node rootfs image (upstream's Ubuntu 24.04 agent image).
pub const DEFAULT_OCI_IMAGE: &str = "ghcr.io/azure/agent-ubuntu2404:v20260619";
pub use flex_api::versions::DEFAULT_SANDBOX_IMAGE;
/// Environment override for the rootfs image (after `bootstrap.ociImage`).
pub const OCI_IMAGE_ENV: &str = "AGENT_OCI_IMAGE";
/// The `token kubelogin` server id kubelet passes in exec-credential mode.
pub const AKS_AAD_SERVER_ID: &str = "6dae42f8-4368-4678-94ff-3960e28e3630";
/// Where the agent binary sits inside a machine (kubelet's exec credential runs it).
pub const AGENT_IN_ROOTFS: &str = "/usr/local/bin/aks-flex-node";

/// How kubelet authenticates to the API server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeletAuth {
    /// TLS bootstrap with a bootstrap token.
    BootstrapToken(Secret),
    /// An exec credential plugin (`aks-flex-node token kubelogin`) with this environment.
    ExecCredential {
        /// Environment for the plugin, sorted by name.
        env: BTreeMap<String, Secret>,
    },
}

/// What the machine layer needs to build and run one machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineGoal {
    /// `kube1` or `kube2`.
    pub machine: String,
    /// Kubernetes node name.
    pub node_name: String,
    /// The host's hostname (written as the machine's hostname: it shares the host's network).
    pub hostname: String,
    /// `amd64` or `arm64`.
    pub arch: String,
    /// Rootfs image reference.
    pub oci_image: String,
    /// Kubernetes version without a leading `v`.
    pub kubernetes_version: String,
    /// API server URL.
    pub api_server: String,
    /// Base64 PEM cluster CA.
    pub ca_cert_base64: String,
    /// Cluster DNS service IP.
    pub cluster_dns: String,
    /// kubelet credentials.
    pub auth: KubeletAuth,
    /// Node labels.
    pub labels: BTreeMap<String, String>,
    /// Taints to register with.
    pub taints: Vec<String>,
    /// Node IP override (may be empty).
    pub node_ip: String,
    /// Max pods.
    pub max_pods: i64,
    /// kubelet verbosity.
    pub verbosity: i64,
    /// Image GC thresholds (high, low).
    pub image_gc: (i64, i64),
    /// Pause image.
    pub sandbox_image: String,
    /// Registry host → mirror URL, for the machine's containerd (`hosts.toml`).
    pub registry_mirrors: BTreeMap<String, String>,
    /// Host devices bound into the machine (paths) and device-group specifiers (DeviceAllow only).
    pub devices: Devices,
    /// kubelet's image credential provider for ACR (`aks-flex-node token acr`), when the node
    /// has an Azure identity (a service principal or managed identity).
    pub acr_provider: Option<AcrProvider>,
}

/// kubelet's image credential provider for Azure Container Registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcrProvider {
    /// The plugin's environment: the exec credential's (`AAD_LOGIN_METHOD`, …), sorted by name.
    pub env: BTreeMap<String, Secret>,
    /// Registries beyond `*.azurecr.*` it serves (`bootstrap.registryAuth.acrRegistries`).
    pub registries: Vec<String>,
    /// The Resource Manager endpoint whose audience ACR's exchange gets.
    pub resource_manager_endpoint: String,
}

/// The service principal's secret variable of the exec credential environment.
pub const SP_CLIENT_SECRET_ENV: &str = "AAD_SERVICE_PRINCIPAL_CLIENT_SECRET";
/// The variable naming a file that holds the service principal's secret instead
/// (`token kubelogin` and `token acr` read it when [`SP_CLIENT_SECRET_ENV`] is unset).
pub const SP_CLIENT_SECRET_FILE_ENV: &str = "AAD_SERVICE_PRINCIPAL_CLIENT_SECRET_FILE";
/// Where a machine keeps the service principal's secret (0600, in a 0700 directory), so that
/// neither kubelet's kubeconfig nor its image credential provider config holds it: files under
/// `/var/lib/kubelet` and `/etc/kubernetes` are what node plugins commonly mount from the host.
pub const SP_SECRET_IN_ROOTFS: &str = "/etc/aks-flex-node/azure/client-secret";

/// The exec credential environment of the config's Azure identity: `AAD_LOGIN_METHOD=spn` with
/// the service principal's variables, or `msi` with `AZURE_CLIENT_ID` for a user-assigned
/// identity; `None` without either.
pub fn azure_identity_env(config: &Config) -> Option<BTreeMap<String, Secret>> {
    let mut env = BTreeMap::new();
    if let Some(sp) = &config.azure.service_principal {
        env.insert("AAD_LOGIN_METHOD".into(), Secret::new("spn"));
        env.insert(
            "AAD_SERVICE_PRINCIPAL_CLIENT_ID".into(),
            Secret::new(&sp.client_id),
        );
        env.insert(SP_CLIENT_SECRET_ENV.into(), sp.client_secret.clone());
        env.insert("AZURE_TENANT_ID".into(), Secret::new(&sp.tenant_id));
        return Some(env);
    }
    if let Some(mi) = &config.azure.managed_identity {
        env.insert("AAD_LOGIN_METHOD".into(), Secret::new("msi"));
        if !mi.client_id.is_empty() {
            env.insert("AZURE_CLIENT_ID".into(), Secret::new(&mi.client_id));
        }
        return Some(env);
    }
    None
}

/// Devices the machine gets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Devices {
    /// Device paths bound into the machine and allowed (`/dev/kvm`).
    pub paths: Vec<String>,
    /// systemd device-group specifiers allowed but not bound (`char-input`).
    pub groups: Vec<String>,
}

/// Host facts goal resolution needs.
#[derive(Clone, Debug, Default)]
pub struct HostFacts {
    /// The hostname.
    pub hostname: String,
    /// `amd64` or `arm64`.
    pub arch: String,
    /// Which of the optional host devices exist (`/dev/kvm`, `/dev/net/tun`, `/dev/vhost-net`).
    pub present_devices: Vec<String>,
    /// `AGENT_OCI_IMAGE`, if set.
    pub oci_image_env: Option<String>,
}

/// Optional devices bound when the host has them.
pub const OPTIONAL_DEVICES: &[&str] = &["/dev/kvm", "/dev/net/tun", "/dev/vhost-net"];

/// Why a goal could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("resolve goal state for {machine}: {message}")]
pub struct GoalError {
    /// The machine.
    pub machine: String,
    /// What is missing or wrong.
    pub message: String,
}

/// Resolves the goal of `machine` from a validated config and host facts.
pub fn resolve(config: &Config, machine: &str, host: &HostFacts) -> Result<MachineGoal, GoalError> {
    let err = |message: String| GoalError {
        machine: machine.to_string(),
        message,
    };
    if !nspawn::MACHINES.contains(&machine) {
        return Err(err(format!("unknown nspawn machine {machine:?}")));
    }
    let kubernetes_version = config
        .components
        .kubernetes
        .trim()
        .trim_start_matches('v')
        .to_string();
    if kubernetes_version.is_empty() {
        return Err(err("components.kubernetes is required".into()));
    }
    let api_server = config.api_server_url();
    if api_server.is_empty() {
        return Err(err("node.kubelet.clusterFQDN is required".into()));
    }
    let identity = azure_identity_env(config);
    let auth = if let Some(bt) = &config.azure.bootstrap_token {
        KubeletAuth::BootstrapToken(bt.token.clone())
    } else if let Some(env) = identity.clone() {
        KubeletAuth::ExecCredential { env }
    } else {
        return Err(err(
            "no kubelet auth method configured (a bootstrap token, service principal or managed identity is needed)".into(),
        ));
    };
    let oci_image = [
        Some(config.bootstrap.oci_image.trim().to_string()),
        host.oci_image_env.as_ref().map(|s| s.trim().to_string()),
    ]
    .into_iter()
    .flatten()
    .find(|s| !s.is_empty())
    .unwrap_or_else(|| DEFAULT_OCI_IMAGE.to_string());
    let mut devices = Devices::default();
    for d in OPTIONAL_DEVICES {
        if host.present_devices.iter().any(|p| p == d) {
            devices.paths.push((*d).to_string());
        }
    }
    for d in &config.bootstrap.additional_host_devices {
        let list = if d.starts_with('/') {
            &mut devices.paths
        } else {
            &mut devices.groups
        };
        if !list.contains(d) {
            list.push(d.clone());
        }
    }
    let mut taints = config.node.taints.clone();
    taints.sort();
    let sandbox_image = if config.components.sandbox_image.trim().is_empty() {
        DEFAULT_SANDBOX_IMAGE.to_string()
    } else {
        config.components.sandbox_image.trim().to_string()
    };
    Ok(MachineGoal {
        machine: machine.to_string(),
        node_name: config.agent.node_name.clone(),
        hostname: host.hostname.trim().to_string(),
        arch: host.arch.clone(),
        oci_image,
        kubernetes_version,
        api_server,
        ca_cert_base64: config.node.kubelet.ca_cert_data.trim().to_string(),
        cluster_dns: config.networking.dns_service_ip.clone(),
        auth,
        labels: config.node.labels.clone(),
        taints,
        node_ip: config.node.kubelet.node_ip.trim().to_string(),
        max_pods: config.node.max_pods,
        verbosity: config.node.kubelet.verbosity,
        image_gc: (
            config.node.kubelet.image_gc_high_threshold,
            config.node.kubelet.image_gc_low_threshold,
        ),
        sandbox_image,
        registry_mirrors: config.node.registry_mirrors.clone(),
        devices,
        acr_provider: identity.map(|env| AcrProvider {
            env,
            registries: config
                .bootstrap
                .registry_auth
                .as_ref()
                .map(|a| a.acr_registries.clone())
                .unwrap_or_default(),
            resource_manager_endpoint: config.azure.resource_manager_endpoint.trim().to_string(),
        }),
    })
}

impl MachineGoal {
    /// The machine's root file system (host path).
    pub fn machine_dir(&self) -> PathBuf {
        nspawn::machine_dir(&self.machine)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The token fixture's config with `mutate` applied (the node-machine tests use it too).
    pub(crate) fn config(mutate: impl FnOnce(&mut serde_json::Value)) -> Config {
        let mut v: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/fixtures/config-token.json")).unwrap();
        mutate(&mut v);
        crate::config::parse(v.to_string().as_bytes(), &|| Ok("h".into()))
            .unwrap()
            .config
    }

    fn facts() -> HostFacts {
        HostFacts {
            hostname: "vm-1\n".into(),
            arch: "amd64".into(),
            present_devices: vec!["/dev/kvm".into()],
            oci_image_env: None,
        }
    }

    #[test]
    fn token_config_resolves() {
        let g = resolve(&config(|_| {}), "kube1", &facts()).unwrap();
        assert_eq!(g.machine_dir(), PathBuf::from("/var/lib/machines/kube1"));
        assert_eq!(g.kubernetes_version, "1.35.0");
        assert_eq!(
            g.api_server,
            "https://aks1-dns-abc.hcp.westus2.azmk8s.io:443"
        );
        assert_eq!(g.hostname, "vm-1");
        assert_eq!(g.oci_image, DEFAULT_OCI_IMAGE);
        assert_eq!(g.devices.paths, vec!["/dev/kvm"]);
        assert!(matches!(g.auth, KubeletAuth::BootstrapToken(_)));
        assert_eq!(g.sandbox_image, DEFAULT_SANDBOX_IMAGE);
    }

    #[test]
    fn image_precedence_devices_and_exec_credential() {
        let mut f = facts();
        f.oci_image_env = Some("registry.local/img:1".into());
        let c = config(|v| {
            v["azure"].as_object_mut().unwrap().remove("bootstrapToken");
            v["azure"]["managedIdentity"] = serde_json::json!({"clientId": "mi-1"});
            v["bootstrap"] = serde_json::json!({"additionalHostDevices": ["char-input", "/dev/fuse", "/dev/kvm"]});
            v["components"]["kubernetes"] = serde_json::json!("v1.35.2");
        });
        let g = resolve(&c, "kube2", &f).unwrap();
        assert_eq!(g.oci_image, "registry.local/img:1");
        assert_eq!(g.kubernetes_version, "1.35.2");
        assert_eq!(g.devices.paths, vec!["/dev/kvm", "/dev/fuse"]);
        assert_eq!(g.devices.groups, vec!["char-input"]);
        let KubeletAuth::ExecCredential { env } = &g.auth else {
            panic!("exec credential expected")
        };
        assert_eq!(
            env.keys().collect::<Vec<_>>(),
            vec!["AAD_LOGIN_METHOD", "AZURE_CLIENT_ID"]
        );
        let c = config(|v| v["bootstrap"] = serde_json::json!({"ociImage": "cfg/img:2"}));
        assert_eq!(resolve(&c, "kube1", &f).unwrap().oci_image, "cfg/img:2");
    }

    #[test]
    fn bad_machine_is_an_error() {
        let e = resolve(&config(|_| {}), "kube3", &facts()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "resolve goal state for kube3: unknown nspawn machine \"kube3\""
        );
    }
}
