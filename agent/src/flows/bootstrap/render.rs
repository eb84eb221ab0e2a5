//! Rendering: bootstrap [`Inputs`] → `config.json`, a pure function.
//!
//! The config is written in upstream's shape (bootstrap-token authentication, as
//! `aks-flex-config generate-node-config --bootstrap-token` writes it) with only the fields the
//! inputs give, in a fixed order, so the same inputs always give the same bytes; the agent's
//! defaults fill the rest when it loads the file. The node name is written explicitly (the
//! input, or the lowercased hostname), so a later hostname change does not rename the node.
//!
//! Inputs the config validation does not cover are checked here (IP addresses, the CA's
//! base64, labels and taints in Kubernetes syntax, booleans); then the rendered bytes go
//! through [`config::parse`], the agent's own validation, and a failure there is reported
//! against the input that set the field. Errors never include the bootstrap token.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::config::{self, Config};

use super::inputs::{self as names, Inputs, parse_bool};

/// The rendered config.
pub struct Rendered {
    /// The config as the agent loads it (defaults applied, validated).
    pub config: Config,
    json: Vec<u8>,
}

impl Rendered {
    /// The file's bytes (2-space-indented JSON, trailing newline). Contains the bootstrap token:
    /// never log them.
    pub fn bytes(&self) -> &[u8] {
        &self.json
    }
}

impl std::fmt::Debug for Rendered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `Config`'s secrets are redacted in its Debug; the bytes are not shown.
        f.debug_struct("Rendered")
            .field("config", &self.config)
            .field("bytes", &self.json.len())
            .finish()
    }
}

/// Why the inputs do not make a config. Every variant names the inputs at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// Required inputs are empty.
    #[error(
        "required inputs are not set: {} (or set AKS_FLEX_NODE_CONFIG to a complete config)",
        .0.join(", ")
    )]
    Missing(Vec<&'static str>),
    /// An input's value is not valid.
    #[error("{input}: {message}")]
    Invalid {
        /// The input's name.
        input: &'static str,
        /// What is wrong (never the token's value).
        message: String,
    },
    /// The rendered config fails a rule no input maps to (a bug in rendering).
    #[error("the rendered config is not valid: {0}")]
    Config(String),
}

fn invalid(input: &'static str, message: impl std::fmt::Display) -> RenderError {
    RenderError::Invalid {
        input,
        message: message.to_string(),
    }
}

/// The inputs rendering requires.
pub const REQUIRED: &[&str] = &[
    names::CLUSTER_RESOURCE_ID,
    names::KUBERNETES_VERSION,
    names::API_SERVER,
    names::CA_CERT_DATA,
    names::BOOTSTRAP_TOKEN,
];

/// Renders `inputs` into a config and validates it. `hostname` names the node when
/// `AKS_FLEX_NODE_NODE_NAME` is empty.
pub fn render(
    inputs: &Inputs,
    hostname: &dyn Fn() -> std::io::Result<String>,
) -> Result<Rendered, RenderError> {
    let t = |s: &str| s.trim().to_string();
    let missing: Vec<&'static str> = [
        (
            names::CLUSTER_RESOURCE_ID,
            inputs.cluster_resource_id.as_str(),
        ),
        (names::KUBERNETES_VERSION, &inputs.kubernetes_version),
        (names::API_SERVER, &inputs.api_server),
        (names::CA_CERT_DATA, &inputs.ca_cert_data),
        (names::BOOTSTRAP_TOKEN, inputs.bootstrap_token.expose()),
    ]
    .into_iter()
    .filter(|(_, v)| v.trim().is_empty())
    .map(|(n, _)| n)
    .collect();
    if !missing.is_empty() {
        return Err(RenderError::Missing(missing));
    }

    let node_name = node_name(&inputs.node_name, hostname)?;
    check_ca(&inputs.ca_cert_data)?;
    let node_ip = ip(names::NODE_IP, &inputs.node_ip)?;
    let dns_ip = ip(names::DNS_SERVICE_IP, &inputs.dns_service_ip)?;
    let labels = labels(&inputs.labels)?;
    let taints = taints(&inputs.taints)?;
    let mirrors = registry_mirrors(&inputs.registry_mirrors)?;
    let insecure = flex_host::http::InsecureRegistries::parse(
        names::INSECURE_REGISTRIES,
        &inputs.insecure_registries,
    )
    .map_err(|e| {
        invalid(
            names::INSECURE_REGISTRIES,
            format!("{:?} {}", e.entry, e.problem),
        )
    })?;
    let require_registration = parse_bool(&inputs.require_machine_registration)
        .map_err(|m| invalid(names::REQUIRE_MACHINE_REGISTRATION, m))?;

    let mut target = Map::new();
    target.insert("resourceId".into(), t(&inputs.cluster_resource_id).into());
    put(&mut target, "location", &inputs.location);
    let mut azure = Map::new();
    azure.insert(
        "bootstrapToken".into(),
        Value::Object(Map::from_iter([(
            "token".to_string(),
            Value::from(inputs.bootstrap_token.expose().trim()),
        )])),
    );
    azure.insert("targetCluster".into(), Value::Object(target));

    let mut agent = Map::new();
    put(&mut agent, "logLevel", &inputs.log_level);
    agent.insert("nodeName".into(), node_name.into());
    let mut client = Map::new();
    put(&mut client, "mode", &inputs.machine_client_mode);
    put(
        &mut client,
        "endpointUrl",
        &inputs.machine_client_endpoint_url,
    );
    if !client.is_empty() {
        agent.insert("machineClient".into(), Value::Object(client));
    }
    if let Some(b) = require_registration {
        agent.insert("requireMachineRegistration".into(), b.into());
    }

    let mut bootstrap = Map::new();
    put(&mut bootstrap, "ociImage", &inputs.oci_image);
    if !inputs.offline_artifacts.trim().is_empty() {
        let mut oa = Map::new();
        put(&mut oa, "source", &inputs.offline_artifacts);
        bootstrap.insert("offlineArtifacts".into(), Value::Object(oa));
    }
    if !insecure.is_empty() {
        bootstrap.insert(
            "insecureRegistries".into(),
            insecure.iter().map(Value::from).collect::<Vec<_>>().into(),
        );
    }
    if !inputs.registry_auth_file.trim().is_empty() {
        let mut auth = Map::new();
        put(&mut auth, "configFile", &inputs.registry_auth_file);
        bootstrap.insert("registryAuth".into(), Value::Object(auth));
    }

    let mut kubelet = Map::new();
    put(&mut kubelet, "clusterFQDN", &inputs.api_server);
    put(&mut kubelet, "caCertData", &inputs.ca_cert_data);
    if let Some(ip) = node_ip {
        kubelet.insert("nodeIP".into(), ip.into());
    }
    let mut node = Map::new();
    if !labels.is_empty() {
        node.insert(
            "labels".into(),
            Value::Object(labels.into_iter().map(|(k, v)| (k, v.into())).collect()),
        );
    }
    if !taints.is_empty() {
        node.insert("taints".into(), taints.into());
    }
    if !mirrors.is_empty() {
        node.insert(
            "registryMirrors".into(),
            Value::Object(mirrors.into_iter().map(|(k, v)| (k, v.into())).collect()),
        );
    }
    node.insert("kubelet".into(), Value::Object(kubelet));

    let mut root = Map::new();
    root.insert("azure".into(), Value::Object(azure));
    root.insert("agent".into(), Value::Object(agent));
    root.insert(
        "components".into(),
        Value::Object(Map::from_iter([(
            "kubernetes".to_string(),
            Value::from(t(&inputs.kubernetes_version)),
        )])),
    );
    if !bootstrap.is_empty() {
        root.insert("bootstrap".into(), Value::Object(bootstrap));
    }
    if let Some(ip) = dns_ip {
        root.insert(
            "networking".into(),
            Value::Object(Map::from_iter([("dnsServiceIP".to_string(), ip.into())])),
        );
    }
    root.insert("node".into(), Value::Object(node));

    let mut json = serde_json::to_vec_pretty(&Value::Object(root))
        .map_err(|e| RenderError::Config(e.to_string()))?;
    json.push(b'\n');
    let loaded = config::parse(&json, hostname).map_err(map_config_error)?;
    Ok(Rendered {
        config: loaded.config,
        json,
    })
}

/// Inserts `key` with the trimmed `value` unless it is empty.
fn put(m: &mut Map<String, Value>, key: &str, value: &str) {
    let v = value.trim();
    if !v.is_empty() {
        m.insert(key.into(), v.into());
    }
}

/// The config field each rendering input sets, for reporting validation failures.
fn input_for_field(field: &str) -> Option<&'static str> {
    Some(match field {
        "azure.targetCluster" | "azure.targetCluster.resourceId" | "azure.subscriptionId" => {
            names::CLUSTER_RESOURCE_ID
        }
        "azure.bootstrapToken.token" => names::BOOTSTRAP_TOKEN,
        "node.kubelet.clusterFQDN" => names::API_SERVER,
        "node.kubelet.caCertData" => names::CA_CERT_DATA,
        "agent.nodeName" => names::NODE_NAME,
        "agent.logLevel" => names::LOG_LEVEL,
        "agent.machineClient.mode" => names::MACHINE_CLIENT_MODE,
        "agent.machineClient.endpointUrl" => names::MACHINE_CLIENT_ENDPOINT_URL,
        "node.kubelet.nodeIP" => names::NODE_IP,
        "networking.dnsServiceIP" => names::DNS_SERVICE_IP,
        f if f.starts_with("node.labels[") => names::LABELS,
        f if f.starts_with("node.taints[") => names::TAINTS,
        f if f.starts_with("bootstrap.insecureRegistries[") => names::INSECURE_REGISTRIES,
        "bootstrap.registryAuth.configFile" => names::REGISTRY_AUTH_FILE,
        _ => return None,
    })
}

fn map_config_error(e: config::ConfigError) -> RenderError {
    match e {
        config::ConfigError::Invalid(v) => match input_for_field(&v.field) {
            Some(input) => invalid(input, format!("{} ({})", v.message, v.field)),
            None => RenderError::Config(v.to_string()),
        },
        other => RenderError::Config(other.to_string()),
    }
}

fn node_name(
    input: &str,
    hostname: &dyn Fn() -> std::io::Result<String>,
) -> Result<String, RenderError> {
    let set = input.trim();
    if !set.is_empty() {
        // `config::parse` checks it and the error names AKS_FLEX_NODE_NODE_NAME.
        return Ok(set.to_string());
    }
    let host = hostname()
        .map_err(|e| {
            invalid(
                names::NODE_NAME,
                format!("is not set and the hostname cannot be read: {e}"),
            )
        })?
        .trim()
        .to_lowercase();
    if !config::is_dns1123_subdomain(&host) {
        return Err(invalid(
            names::NODE_NAME,
            format!(
                "is not set and the hostname {host:?} is not a valid Kubernetes node name (a lowercase DNS-1123 subdomain); set it"
            ),
        ));
    }
    Ok(host)
}

fn check_ca(value: &str) -> Result<(), RenderError> {
    let pem = crate::machine::nodeconfig::decode_base64(value.trim()).map_err(|e| {
        invalid(
            names::CA_CERT_DATA,
            format!("is not valid base64 ({e}); give the base64 of the cluster CA's PEM, as kubeconfig's certificate-authority-data"),
        )
    })?;
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(invalid(
            names::CA_CERT_DATA,
            "does not decode to a PEM certificate; give the base64 of the cluster CA's PEM, as kubeconfig's certificate-authority-data",
        ));
    }
    Ok(())
}

fn ip(input: &'static str, value: &str) -> Result<Option<String>, RenderError> {
    let v = value.trim();
    if v.is_empty() {
        return Ok(None);
    }
    config::check_ip(v)
        .map(|ip| Some(ip.to_string()))
        .map_err(|m| invalid(input, m))
}

fn items(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

fn labels(value: &str) -> Result<BTreeMap<String, String>, RenderError> {
    let mut out = BTreeMap::new();
    for item in items(value) {
        let Some((k, v)) = item.split_once('=') else {
            return Err(invalid(
                names::LABELS,
                format!("{item:?} is not key=value (labels are key=value,key2=value2)"),
            ));
        };
        let (k, v) = (k.trim(), v.trim());
        // The config's own label checks (run again when the rendered config loads), with the
        // key named as in a bootstrap.env list.
        config::check_label_key(k)
            .map_err(|m| invalid(names::LABELS, format!("{} {m}", config::shown(k))))?;
        config::check_label_value(v).map_err(|_| {
            invalid(
                names::LABELS,
                format!(
                    "the value of {} is not a valid label value (at most 63 characters [A-Za-z0-9._-] starting and ending alphanumeric)",
                    config::shown(k)
                ),
            )
        })?;
        if out.insert(k.to_string(), v.to_string()).is_some() {
            return Err(invalid(
                names::LABELS,
                format!("label {k:?} is given twice"),
            ));
        }
    }
    Ok(out)
}

fn registry_mirrors(value: &str) -> Result<BTreeMap<String, String>, RenderError> {
    let mut out = BTreeMap::new();
    for item in items(value) {
        let Some((registry, mirror)) = item.split_once('=') else {
            return Err(invalid(
                names::REGISTRY_MIRRORS,
                format!("{item:?} is not registry=url (registry.k8s.io=http://10.0.2.2:5000,…)"),
            ));
        };
        let (registry, mirror) = (registry.trim(), mirror.trim());
        crate::config::check_registry_mirror(registry, mirror)
            .map_err(|m| invalid(names::REGISTRY_MIRRORS, m))?;
        if out
            .insert(registry.to_string(), mirror.to_string())
            .is_some()
        {
            return Err(invalid(
                names::REGISTRY_MIRRORS,
                format!("registry {registry:?} is given twice"),
            ));
        }
    }
    Ok(out)
}

fn taints(value: &str) -> Result<Vec<String>, RenderError> {
    items(value)
        .map(|item| {
            config::check_taint(item)
                .map(|()| item.to_string())
                .map_err(|m| invalid(names::TAINTS, m))
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests;
