//! Defaults and validation, in the upstream order: defaults, node name, target cluster
//! derivation, Azure, agent, bootstrap, authentication, bootstrap-token specifics. The first
//! failing rule is reported, naming its field.

use std::sync::LazyLock;

use regex::Regex;

use super::{
    Config, DEFAULT_AGENT_POOL, DEFAULT_ARC_INSTALLER_URL, DEFAULT_LOG_DIR,
    DEFAULT_METRICS_ADDRESS, DEFAULT_NPD_BASE_URL, DEFAULT_NPD_VERSION, DEFAULT_RUNC_VERSION,
    GoDuration, MANAGED_LABEL,
};

/// A failed rule: the field (dotted JSON path) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    /// Dotted JSON path of the field (or a short rule name for cross-field rules).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn err(field: &str, message: impl std::fmt::Display) -> ValidationError {
    ValidationError {
        field: field.to_string(),
        message: message.to_string(),
    }
}

/// What is wrong with one value, whatever field it came from: the callers (this module, the
/// `bootstrap.env` renderer, the kubelet drop-in renderer) put it under the field's name.
/// Values are shown cut by [`shown`]; a label value is never echoed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// Not `[prefix/]name` as Kubernetes takes a label or taint key.
    #[error(
        "is not a valid label key ([prefix/]name: prefix a lowercase DNS-1123 subdomain, name 1-63 characters [A-Za-z0-9._-] starting and ending alphanumeric)"
    )]
    LabelKey,
    /// Not a label value (the value is not echoed).
    #[error(
        "the value is not a valid label value (empty, or at most 63 characters [A-Za-z0-9._-] starting and ending alphanumeric)"
    )]
    LabelValue,
    /// A taint without `:Effect`.
    #[error("{} is not key[=value]:Effect", shown(.0))]
    TaintForm(String),
    /// A taint whose effect is not one of [`TAINT_EFFECTS`].
    #[error("{} has effect {}, not one of {}", shown(.taint), shown(.effect), TAINT_EFFECTS.join(", "))]
    TaintEffect {
        /// The taint.
        taint: String,
        /// Its effect.
        effect: String,
    },
    /// A taint whose key or value is not a label's.
    #[error("{} does not have a valid key and value (as labels)", shown(.0))]
    TaintKeyValue(String),
    /// Not an IPv4 or IPv6 address.
    #[error("{} is not an IP address", shown(.0))]
    Ip(String),
    /// A registry mirror's registry is not a host name or address with an optional port.
    #[error("{0:?} is not a registry host (name or address, optional :port; no scheme or path)")]
    RegistryHost(String),
    /// A registry mirror's URL is not one a client may be pointed at.
    #[error("mirror {mirror:?} of {registry:?} {problem}")]
    Mirror {
        /// The registry mirrored.
        registry: String,
        /// The mirror's URL as given.
        mirror: String,
        /// What is wrong with it.
        problem: UrlProblem,
    },
}

/// What is wrong with a URL a field must hold; shown after the URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlProblem {
    /// It does not parse (the parser's message).
    #[error("is not a URL ({0})")]
    NotUrl(String),
    /// Not `http(s)://host…`.
    #[error("must be an absolute http or https URL")]
    NotHttp,
    /// Not `https://host…`.
    #[error("must be an absolute https URL")]
    NotHttps,
    /// `https://` with nothing after it.
    #[error("has no host")]
    NoHost,
    /// `user@host` or `user:password@host`.
    #[error("must not contain user info")]
    UserInfo,
    /// Credentials, a query or a fragment, where none may be.
    #[error("must not carry credentials, a query or a fragment")]
    CredentialsQueryOrFragment,
    /// White space, a control character, a quote or a backslash: the URL parser drops some of
    /// them without a word, and the value is written into files as it is given.
    #[error("must not contain white space, control characters, quotes or backslashes")]
    Characters,
    /// Credentials (controller endpoint).
    #[error("must not carry credentials")]
    Credentials,
    /// A query or a fragment (controller endpoint).
    #[error("must not have a query or fragment")]
    QueryOrFragment,
    /// A port, where none may be.
    #[error("must not contain a port")]
    Port,
    /// A port that is not a number from 0 to 65535.
    #[error("has an invalid port")]
    InvalidPort,
    /// A path, query or fragment, where none may be.
    #[error("must not contain a path, query or fragment")]
    PathQueryOrFragment,
    /// It does not parse, where a controller's endpoint is expected.
    #[error("is not a URL ({0}); controller mode needs http(s)://host:port")]
    NotControllerUrl(String),
    /// Not `http(s)://host…`, where a controller's endpoint is expected.
    #[error("must be an absolute http or https URL in controller mode")]
    NotHttpController,
    /// Cannot be a request URI (the parser's message).
    #[error("is not a request URI ({0})")]
    NotUri(String),
}

/// An endpoint field's URL and what is wrong with it (`"https://x:1/p" must not contain a path,
/// query or fragment`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// The field is empty where this mode needs it.
    #[error("is required in controller mode")]
    Missing,
    /// The URL and its problem.
    #[error("{url:?} {problem}")]
    Invalid {
        /// The URL as given.
        url: String,
        /// What is wrong.
        problem: UrlProblem,
    },
}

fn bad_url(url: &str, problem: UrlProblem) -> EndpointError {
    EndpointError::Invalid {
        url: url.to_string(),
        problem,
    }
}

// The patterns are literals checked by the tests below; compiling them cannot fail.
#[allow(clippy::expect_used)]
static RESOURCE_ID: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)^/subscriptions/([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})/resourcegroups/([A-Za-z0-9_.-]+)/providers/microsoft\.containerservice/managedclusters/([A-Za-z0-9_.-]+)$",
    )
    .expect("static regex")
});
#[allow(clippy::expect_used)]
static TOKEN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-z0-9]{6}\.[a-z0-9]{16}$").expect("static regex"));
#[allow(clippy::expect_used)]
static DNS1123_LABEL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$").expect("static regex"));
#[allow(clippy::expect_used)]
static DEVICE_GROUP: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(char|block)-[A-Za-z0-9_.*-]+$").expect("static regex"));

const DEFAULT_RECONCILE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(600);
/// The shortest `agent.machineReconcileInterval` accepted: each reconcile reads the goal over
/// the network, so a shorter interval is a busy loop against the API, not a setting. (The
/// longest is Go's `time.Duration` range, checked when the value is parsed.)
pub const MIN_RECONCILE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether `s` is a DNS-1123 subdomain (what Kubernetes requires of a node name).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.')
            .all(|l| l.len() <= 63 && DNS1123_LABEL.is_match(l))
}

/// `value` for an error message: quoted, and cut after [`SHOWN_CHARS`] characters with the
/// full length appended (`"aaaa…"…(10485760 bytes)`), so a huge value is not echoed whole.
pub fn shown(value: &str) -> String {
    match value.char_indices().nth(SHOWN_CHARS) {
        None => format!("{value:?}"),
        Some((cut, _)) => format!("{:?}…({} bytes)", &value[..cut], value.len()),
    }
}

/// How many characters of a value [`shown`] keeps.
pub const SHOWN_CHARS: usize = 100;

/// A Kubernetes qualified-name part: 1–63 of `[A-Za-z0-9._-]`, starting and ending
/// alphanumeric.
fn is_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Checks a label (or taint) key as Kubernetes does: `[prefix/]name`, the prefix a DNS-1123
/// subdomain (at most 253 characters), the name a qualified-name part.
pub fn check_label_key(key: &str) -> Result<(), ValueError> {
    let ok = match key.split_once('/') {
        Some((prefix, name)) => is_dns1123_subdomain(prefix) && is_name_part(name),
        None => is_name_part(key),
    };
    if ok {
        Ok(())
    } else {
        Err(ValueError::LabelKey)
    }
}

/// Checks a label (or taint) value as Kubernetes does: empty, or 1–63 of `[A-Za-z0-9._-]`
/// starting and ending alphanumeric. The value is not echoed.
pub fn check_label_value(value: &str) -> Result<(), ValueError> {
    if value.is_empty() || is_name_part(value) {
        Ok(())
    } else {
        Err(ValueError::LabelValue)
    }
}

/// Taint effects kubelet's `--register-with-taints` accepts.
pub const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// Checks a taint: `key[=value]:Effect`, the key and value as a label's, the effect one of
/// [`TAINT_EFFECTS`].
pub fn check_taint(taint: &str) -> Result<(), ValueError> {
    let Some((kv, effect)) = taint.rsplit_once(':') else {
        return Err(ValueError::TaintForm(taint.to_string()));
    };
    if !TAINT_EFFECTS.contains(&effect) {
        return Err(ValueError::TaintEffect {
            taint: taint.to_string(),
            effect: effect.to_string(),
        });
    }
    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
    if check_label_key(k).is_err() || check_label_value(v).is_err() {
        return Err(ValueError::TaintKeyValue(taint.to_string()));
    }
    Ok(())
}

/// Checks an IP address (v4 or v6).
pub fn check_ip(value: &str) -> Result<std::net::IpAddr, ValueError> {
    value.parse().map_err(|_| ValueError::Ip(value.to_string()))
}

/// The values the node's kubelet flags are made of (labels, taints, `dnsServiceIP`,
/// `nodeIP`) and the numbers `start` checks: the one validation for `config.json` and for
/// configs rendered from `bootstrap.env`, run at load. Rendering the kubelet drop-in runs the
/// value checks again ([`crate::machine::nodeconfig`]).
fn validate_node(c: &Config) -> Result<(), ValidationError> {
    for (k, v) in &c.node.labels {
        let field = format!("node.labels[{}]", shown(k));
        check_label_key(k).map_err(|m| err(&field, m))?;
        check_label_value(v).map_err(|m| err(&field, m))?;
    }
    for (i, t) in c.node.taints.iter().enumerate() {
        check_taint(t).map_err(|m| err(&format!("node.taints[{i}]"), m))?;
    }
    // `start` hands these to the machine goal; checked here so a config that loads can start.
    if !(1..=i64::from(i32::MAX)).contains(&c.node.max_pods) {
        return Err(err(
            "node.maxPods",
            format!("{} is out of range (1 to {})", c.node.max_pods, i32::MAX),
        ));
    }
    let k = &c.node.kubelet;
    for (field, v) in [
        (
            "node.kubelet.imageGCHighThreshold",
            k.image_gc_high_threshold,
        ),
        ("node.kubelet.imageGCLowThreshold", k.image_gc_low_threshold),
    ] {
        if !(0..=100).contains(&v) {
            return Err(err(field, format!("{v} is not a percentage (0 to 100)")));
        }
    }
    if k.image_gc_low_threshold > k.image_gc_high_threshold {
        return Err(err(
            "node.kubelet.imageGCLowThreshold",
            format!(
                "{} is above imageGCHighThreshold ({})",
                k.image_gc_low_threshold, k.image_gc_high_threshold
            ),
        ));
    }
    // Written into the machine's containerd config: an image reference, nothing else.
    let sandbox = c.components.sandbox_image.trim();
    if !sandbox.is_empty() {
        flex_api::image::ImageRef::parse(sandbox).map_err(|e| err("components.sandboxImage", e))?;
    }
    check_ip(&c.networking.dns_service_ip).map_err(|m| err("networking.dnsServiceIP", m))?;
    if !c.node.kubelet.node_ip.trim().is_empty() {
        check_ip(c.node.kubelet.node_ip.trim()).map_err(|m| err("node.kubelet.nodeIP", m))?;
    }
    Ok(())
}

/// The API server URL from `node.kubelet.clusterFQDN` (trimmed): a value with `://` is taken as
/// it is; `host:port` gets `https://`; a bare host gets `https://` and `:443`.
pub fn api_server_url(cluster_fqdn: &str) -> String {
    let v = cluster_fqdn.trim();
    if v.is_empty() {
        String::new()
    } else if v.contains("://") {
        v.to_string()
    } else if v.contains(':') {
        format!("https://{v}")
    } else {
        format!("https://{v}:443")
    }
}

pub(crate) fn apply_defaults(c: &mut Config) {
    let a = &mut c.azure;
    let rme = a.resource_manager_endpoint.trim();
    a.resource_manager_endpoint = if rme.is_empty() {
        match a.cloud.trim() {
            "AzureUSGovernment" | "AzureGovernmentCloud" => "https://management.usgovcloudapi.net",
            "AzureChinaCloud" => "https://management.chinacloudapi.cn",
            _ => "https://management.azure.com",
        }
        .to_string()
    } else {
        rme.trim_end_matches('/').to_string()
    };
    a.target_agent_pool_name = a.target_agent_pool_name.trim().to_string();
    if a.target_agent_pool_name.is_empty() {
        a.target_agent_pool_name = DEFAULT_AGENT_POOL.into();
    }
    if let Some(arc) = a.arc.as_mut()
        && arc.installer_url.trim().is_empty()
    {
        arc.installer_url = DEFAULT_ARC_INSTALLER_URL.into();
    }
    let g = &mut c.agent;
    if g.log_level.is_empty() {
        g.log_level = "info".into();
    }
    if g.log_dir.is_empty() {
        g.log_dir = DEFAULT_LOG_DIR.into();
    }
    if g.machine_client.mode.is_empty() {
        g.machine_client.mode = "arm".into();
    }
    if g.machine_reconcile_interval.0.is_zero() {
        g.machine_reconcile_interval = GoDuration(DEFAULT_RECONCILE_INTERVAL);
    }
    if g.machine_operation_mode.is_empty() {
        g.machine_operation_mode = "auto".into();
    }
    if g.metrics_address.trim().is_empty() {
        g.metrics_address = DEFAULT_METRICS_ADDRESS.into();
    }
    if g.drain.timeout.0.is_zero() {
        g.drain.timeout = GoDuration(flex_api::drain::DEFAULT_TIMEOUT);
    }
    if g.drain.on_timeout.is_empty() {
        g.drain.on_timeout = flex_api::drain::OnTimeout::default().as_str().into();
    }
    let n = &mut c.node;
    if n.max_pods == 0 {
        n.max_pods = 110;
    }
    // Always set: keeps cloud-controller-manager from deleting NotReady unmanaged nodes.
    n.labels.insert(MANAGED_LABEL.into(), "false".into());
    if n.kubelet.verbosity == 0 {
        n.kubelet.verbosity = 2;
    }
    if n.kubelet.image_gc_high_threshold == 0 {
        n.kubelet.image_gc_high_threshold = 85;
    }
    if n.kubelet.image_gc_low_threshold == 0 {
        n.kubelet.image_gc_low_threshold = 80;
    }
    if c.networking.dns_service_ip.is_empty() {
        c.networking.dns_service_ip = "10.0.0.10".into();
    }
    let offline = c
        .bootstrap
        .offline_artifacts
        .as_ref()
        .is_some_and(|o| !o.source.is_empty());
    if !offline && c.components.runc.is_empty() {
        c.components.runc = DEFAULT_RUNC_VERSION.into();
    }
    if c.npd.version.is_empty() {
        c.npd.version = DEFAULT_NPD_VERSION.into();
    }
    if c.npd.base_url.is_empty() {
        c.npd.base_url = DEFAULT_NPD_BASE_URL.into();
    }
}

/// `npd`: the version and base URL become a download URL and a file name; the checksum pins
/// the archive.
fn validate_npd(c: &Config) -> Result<(), ValidationError> {
    let n = &c.npd;
    let v = n.version.strip_prefix('v').unwrap_or(&n.version);
    if !v.starts_with(|ch: char| ch.is_ascii_digit())
        || !v
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '-' | '+'))
    {
        return Err(err(
            "npd.version",
            format!("{} is not a release version (v1.35.1)", shown(&n.version)),
        ));
    }
    match url::Url::parse(&n.base_url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => {}
        // Shown only when it parses, with its user info and query redacted.
        Ok(_) => {
            return Err(err(
                "npd.baseURL",
                format!(
                    "{} is not an absolute http(s) URL",
                    flex_host::secret::redact_url(&n.base_url)
                ),
            ));
        }
        Err(e) => return Err(err("npd.baseURL", format!("is not a URL: {e}"))),
    }
    if !n.sha256.is_empty()
        && (n.sha256.len() != 64 || !n.sha256.chars().all(|ch| ch.is_ascii_hexdigit()))
    {
        return Err(err("npd.sha256", "is not 64 hexadecimal digits"));
    }
    Ok(())
}

/// Applies defaults then checks every rule in order.
pub(crate) fn validate(
    c: &mut Config,
    hostname: &dyn Fn() -> std::io::Result<String>,
) -> Result<(), ValidationError> {
    apply_defaults(c);
    resolve_node_name(c, hostname)?;
    derive_target_cluster(c);
    validate_azure(c)?;
    validate_agent(c)?;
    validate_bootstrap(c)?;
    validate_node(c)?;
    for (registry, mirror) in &c.node.registry_mirrors {
        check_registry_mirror(registry, mirror)
            .map_err(|m| err(&format!("node.registryMirrors[{registry:?}]"), m))?;
    }
    validate_npd(c)?;
    super::routing::plan(&c.host_routing).map_err(|e| err(&e.field, e.message))?;
    validate_auth(c)?;
    if c.azure.bootstrap_token.is_some() {
        validate_bootstrap_token(c).map_err(|e| ValidationError {
            field: e.field,
            message: format!("invalid bootstrap token configuration: {}", e.message),
        })?;
    }
    Ok(())
}

fn resolve_node_name(
    c: &mut Config,
    hostname: &dyn Fn() -> std::io::Result<String>,
) -> Result<(), ValidationError> {
    let set = c.agent.node_name.trim().to_string();
    if !set.is_empty() {
        if !is_dns1123_subdomain(&set) {
            return Err(err(
                "agent.nodeName",
                format!(
                    "{} is not a valid Kubernetes node name (a lowercase DNS-1123 subdomain)",
                    shown(&set)
                ),
            ));
        }
        c.agent.node_name = set;
        return Ok(());
    }
    let host = hostname()
        .map_err(|e| err("agent.nodeName", format!("cannot read the hostname: {e}")))?
        .trim()
        .to_lowercase();
    if host.is_empty() || !is_dns1123_subdomain(&host) {
        return Err(err(
            "agent.nodeName",
            format!(
                "hostname {} is not a valid Kubernetes node name; set agent.nodeName to a valid lowercase Kubernetes node name",
                shown(&host)
            ),
        ));
    }
    c.agent.node_name = host;
    Ok(())
}

fn derive_target_cluster(c: &mut Config) {
    let Some(tc) = c.azure.target_cluster.as_mut() else {
        return;
    };
    if let Some(m) = RESOURCE_ID.captures(tc.resource_id.trim()) {
        tc.subscription_id = m[1].to_string();
        tc.resource_group = m[2].to_string();
        tc.name = m[3].to_string();
        if c.azure.subscription_id.is_empty() {
            c.azure.subscription_id = tc.subscription_id.clone();
        }
    }
}

fn validate_azure(c: &Config) -> Result<(), ValidationError> {
    let a = &c.azure;
    let arc_enabled = a.arc.as_ref().is_some_and(|x| x.enabled);
    if arc_enabled && a.tenant_id.trim().is_empty() {
        return Err(err(
            "azure.tenantId",
            "is required when azure.arc.enabled is true",
        ));
    }
    let Some(tc) = &a.target_cluster else {
        return Err(err("azure.targetCluster", "is required"));
    };
    if tc.resource_id.trim().is_empty() {
        return Err(err("azure.targetCluster.resourceId", "is required"));
    }
    if !RESOURCE_ID.is_match(tc.resource_id.trim()) {
        return Err(err(
            "azure.targetCluster.resourceId",
            format!(
                "{:?} is not a managed cluster resource ID (/subscriptions/<guid>/resourceGroups/<group>/providers/Microsoft.ContainerService/managedClusters/<name>)",
                tc.resource_id
            ),
        ));
    }
    if a.target_agent_pool_name.is_empty() {
        return Err(err("azure.targetAgentPoolName", "is required"));
    }
    if a.subscription_id.trim().is_empty() {
        return Err(err("azure.subscriptionId", "is required"));
    }
    check_https_endpoint(&a.resource_manager_endpoint, false)
        .map_err(|m| err("azure.resourceManagerEndpoint", m))?;
    if let Some(sp) = &a.service_principal {
        if sp.tenant_id.trim().is_empty() {
            return Err(err("azure.servicePrincipal.tenantId", "is required"));
        }
        if sp.client_id.trim().is_empty() {
            return Err(err("azure.servicePrincipal.clientId", "is required"));
        }
        if sp.client_secret.is_blank() {
            return Err(err("azure.servicePrincipal.clientSecret", "is required"));
        }
    }
    if let Some(bt) = &a.bootstrap_token
        && !TOKEN.is_match(bt.token.expose())
    {
        return Err(err(
            "azure.bootstrapToken.token",
            "must match [a-z0-9]{6}.[a-z0-9]{16}",
        ));
    }
    if let Some(arc) = a.arc.as_ref().filter(|x| x.enabled) {
        for (field, v) in [
            ("azure.arc.machineName", &arc.machine_name),
            ("azure.arc.resourceGroup", &arc.resource_group),
            ("azure.arc.location", &arc.location),
        ] {
            if v.trim().is_empty() {
                return Err(err(field, "is required when azure.arc.enabled is true"));
            }
        }
        let h = &arc.installer_sha256;
        if h.len() != 64 || !h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(err(
                "azure.arc.installerSha256",
                "is required when azure.arc.enabled is true: the SHA-256 of the installer at installerUrl, 64 lowercase hex digits",
            ));
        }
        if !arc.installer_url.starts_with("https://") && !arc.installer_url.starts_with("http://") {
            return Err(err("azure.arc.installerUrl", "must be an http(s) URL"));
        }
    }
    Ok(())
}

/// Checks an absolute `https` URL with no user info, path, query or fragment. `allow_port`
/// decides whether a port may be given.
fn check_https_endpoint(raw: &str, allow_port: bool) -> Result<(), EndpointError> {
    let Some(rest) = raw.strip_prefix("https://") else {
        return Err(bad_url(raw, UrlProblem::NotHttps));
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if authority.is_empty() {
        return Err(bad_url(raw, UrlProblem::NoHost));
    }
    if authority.contains('@') {
        return Err(bad_url(raw, UrlProblem::UserInfo));
    }
    let host_port = authority;
    let port_part = match host_port.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map(|(_, p)| p).unwrap_or(""),
        None => host_port.split_once(':').map(|(_, p)| p).map_or("", |p| p),
    };
    let has_port = host_port.starts_with('[') && port_part.starts_with(':')
        || !host_port.starts_with('[') && host_port.contains(':');
    if has_port && !allow_port {
        return Err(bad_url(raw, UrlProblem::Port));
    }
    if has_port {
        let p = port_part.trim_start_matches(':');
        if p.parse::<u16>().is_err() {
            return Err(bad_url(raw, UrlProblem::InvalidPort));
        }
    }
    if !tail.is_empty() && tail != "/" {
        return Err(bad_url(raw, UrlProblem::PathQueryOrFragment));
    }
    if let Err(e) = url::Url::parse(raw) {
        return Err(bad_url(raw, UrlProblem::NotUrl(e.to_string())));
    }
    Ok(())
}

fn validate_agent(c: &Config) -> Result<(), ValidationError> {
    let g = &c.agent;
    if crate::logging::parse_level(&g.log_level).is_none() {
        return Err(err(
            "agent.logLevel",
            format!(
                "{:?} is not one of debug, info, warning, error",
                g.log_level
            ),
        ));
    }
    if g.machine_reconcile_interval.0 < MIN_RECONCILE_INTERVAL {
        return Err(err(
            "agent.machineReconcileInterval",
            format!(
                "{} is below the minimum of {}",
                super::format_go_duration(g.machine_reconcile_interval.0),
                super::format_go_duration(MIN_RECONCILE_INTERVAL)
            ),
        ));
    }
    let mode = g.machine_client.mode.trim();
    let endpoint = g.machine_client.endpoint_url.trim();
    match mode {
        "arm" => {
            if !endpoint.is_empty() {
                match url::Url::parse(endpoint) {
                    Ok(u) if (u.scheme() == "http" || u.scheme() == "https") && u.has_host() => {}
                    _ => {
                        return Err(err(
                            "agent.machineClient.endpointUrl",
                            format!(
                                "{endpoint:?} must be an absolute http or https URL in arm mode"
                            ),
                        ));
                    }
                }
            }
        }
        "in-cluster" => {
            if endpoint.is_empty() {
                return Err(err(
                    "agent.machineClient.endpointUrl",
                    "is required in in-cluster mode",
                ));
            }
            if endpoint.contains("://") || endpoint.starts_with("//") || !endpoint.starts_with('/')
            {
                return Err(err(
                    "agent.machineClient.endpointUrl",
                    format!(
                        "{endpoint:?} must be a Kubernetes API path starting with / (no scheme or host) in in-cluster mode"
                    ),
                ));
            }
            if endpoint.contains('#') {
                return Err(err(
                    "agent.machineClient.endpointUrl",
                    format!("{endpoint:?} must not contain a fragment"),
                ));
            }
        }
        "controller" => {
            ControllerEndpoint::parse(endpoint)
                .map_err(|e| err("agent.machineClient.endpointUrl", e))?;
        }
        other => {
            return Err(err(
                "agent.machineClient.mode",
                format!("{other:?} is not one of arm, in-cluster, controller"),
            ));
        }
    }
    match g.machine_operation_mode.trim() {
        "auto" | "disable" => {}
        other => {
            return Err(err(
                "agent.machineOperationMode",
                format!("{other:?} is not one of auto, disable"),
            ));
        }
    }
    let t = g.drain.timeout.0;
    if !(flex_api::drain::MIN_TIMEOUT..=flex_api::drain::MAX_TIMEOUT).contains(&t) {
        return Err(err(
            "agent.drain.timeout",
            format!("{} is not from 1s to 24h", super::format_go_duration(t)),
        ));
    }
    if flex_api::drain::OnTimeout::parse(&g.drain.on_timeout).is_none() {
        return Err(err(
            "agent.drain.onTimeout",
            format!("{:?} is not one of Fail, Proceed", g.drain.on_timeout),
        ));
    }
    flex_metrics::parse_address(&g.metrics_address)
        .map(drop)
        .map_err(|e| err("agent.metricsAddress", e.to_string()))
}

fn validate_bootstrap(c: &Config) -> Result<(), ValidationError> {
    for (i, d) in c.bootstrap.additional_host_devices.iter().enumerate() {
        let field = format!("bootstrap.additionalHostDevices[{i}]");
        if DEVICE_GROUP.is_match(d) {
            continue;
        }
        if !d.starts_with("/dev/") {
            return Err(err(
                &field,
                format!(
                    "{d:?} must be an absolute path under /dev or a device group such as char-input"
                ),
            ));
        }
        let clean = d.split('/').all(|seg| seg != "." && seg != "..")
            && !d.contains("//")
            && !d.ends_with('/');
        if !clean || d.chars().any(|ch| ch.is_whitespace() || ch == ':') {
            return Err(err(&field, format!("{d:?} must be a clean path")));
        }
    }
    for (i, r) in c.bootstrap.insecure_registries.iter().enumerate() {
        let field = format!("bootstrap.insecureRegistries[{i}]");
        if r.trim().is_empty() {
            return Err(err(&field, "must be host[:port], not empty"));
        }
        flex_host::http::InsecureRegistries::from_entries(&field, [r])
            .map_err(|e| err(&e.field, format!("{:?} {}", e.entry, e.problem)))?;
    }
    if let Some(a) = &c.bootstrap.registry_auth {
        validate_registry_auth(a)?;
    }
    Ok(())
}

fn validate_registry_auth(a: &super::RegistryAuth) -> Result<(), ValidationError> {
    let f = &a.config_file;
    if !f.is_empty() {
        let field = "bootstrap.registryAuth.configFile";
        let clean = f.starts_with('/')
            && !f.ends_with('/')
            && !f.contains("//")
            && f.split('/').all(|seg| seg != "." && seg != "..");
        if !clean || f.chars().any(|ch| ch.is_whitespace() || ch.is_control()) {
            return Err(err(field, format!("{f:?} must be a clean absolute path")));
        }
    }
    for (i, r) in a.acr_registries.iter().enumerate() {
        let field = format!("bootstrap.registryAuth.acrRegistries[{i}]");
        if r.trim().is_empty() {
            return Err(err(&field, "must be host[:port], not empty"));
        }
        flex_host::http::InsecureRegistries::from_entries(&field, [r])
            .map_err(|e| err(&e.field, format!("{:?} {}", e.entry, e.problem)))?;
    }
    Ok(())
}

fn validate_auth(c: &Config) -> Result<(), ValidationError> {
    let a = &c.azure;
    let arm_methods = usize::from(a.arc.as_ref().is_some_and(|x| x.enabled))
        + usize::from(a.service_principal.is_some())
        + usize::from(a.managed_identity.is_some());
    if arm_methods == 0 && a.bootstrap_token.is_none() {
        return Err(err(
            "azure",
            "at least one authentication method must be configured: Arc, Service Principal, Managed Identity, or Bootstrap Token",
        ));
    }
    if arm_methods > 1 {
        return Err(err(
            "azure",
            "only one Azure authentication method can be enabled at a time (Arc, Service Principal or Managed Identity); a bootstrap token may be combined with one of them",
        ));
    }
    Ok(())
}

fn validate_bootstrap_token(c: &Config) -> Result<(), ValidationError> {
    if let Some(bt) = &c.azure.bootstrap_token
        && !TOKEN.is_match(bt.token.expose())
    {
        return Err(err(
            "azure.bootstrapToken.token",
            "must match [a-z0-9]{6}.[a-z0-9]{16}",
        ));
    }
    let url = c.api_server_url();
    if url.is_empty() {
        return Err(err(
            "node.kubelet.clusterFQDN",
            "node.kubelet.clusterFQDN is required when using bootstrap token authentication",
        ));
    }
    check_https_endpoint(&url, true)
        .map_err(|m| err("node.kubelet.clusterFQDN", format!("API server URL {m}")))?;
    if c.node.kubelet.ca_cert_data.trim().is_empty() {
        return Err(err(
            "node.kubelet.caCertData",
            "is required when using bootstrap token authentication",
        ));
    }
    Ok(())
}

/// Checks one registry mirror: `registry` a host name or address with an optional port (no
/// scheme or path), `mirror` an absolute `http` or `https` URL with a host and no credentials,
/// query or fragment.
pub fn check_registry_mirror(registry: &str, mirror: &str) -> Result<(), ValueError> {
    let host_ok = !registry.is_empty()
        && registry
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'))
        && !registry.starts_with(['.', '-', ':']);
    if !host_ok {
        return Err(ValueError::RegistryHost(registry.to_string()));
    }
    let bad = |problem| ValueError::Mirror {
        registry: registry.to_string(),
        mirror: mirror.to_string(),
        problem,
    };
    if mirror
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '\'' | '\\'))
    {
        return Err(bad(UrlProblem::Characters));
    }
    let url = url::Url::parse(mirror).map_err(|e| bad(UrlProblem::NotUrl(e.to_string())))?;
    if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
        return Err(bad(UrlProblem::NotHttp));
    }
    if !url.username().is_empty()
        || url.password().is_some()
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(bad(UrlProblem::CredentialsQueryOrFragment));
    }
    Ok(())
}

/// A controller's machine endpoint reached directly (`controller` mode): the server's URL and
/// the path the machines are under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerEndpoint {
    /// `scheme://host[:port]`.
    pub base: http::Uri,
    /// The path below it (`/` when the URL has none).
    pub path: String,
}

impl ControllerEndpoint {
    /// Parses `agent.machineClient.endpointUrl` for `controller` mode: an absolute `http` or
    /// `https` URL with a host, no credentials, query or fragment.
    pub fn parse(raw: &str) -> Result<Self, EndpointError> {
        let raw = raw.trim();
        if raw.is_empty() {
            return Err(EndpointError::Missing);
        }
        let url = url::Url::parse(raw)
            .map_err(|e| bad_url(raw, UrlProblem::NotControllerUrl(e.to_string())))?;
        if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
            return Err(bad_url(raw, UrlProblem::NotHttpController));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(bad_url(raw, UrlProblem::Credentials));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(bad_url(raw, UrlProblem::QueryOrFragment));
        }
        let base: http::Uri = url[..url::Position::BeforePath]
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad_url(raw, UrlProblem::NotUri(e.to_string())))?;
        Ok(Self {
            base,
            path: url.path().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_server_url_forms() {
        assert_eq!(api_server_url(" a.b "), "https://a.b:443");
        assert_eq!(api_server_url("a.b:6443"), "https://a.b:6443");
        assert_eq!(api_server_url("https://a.b:443"), "https://a.b:443");
        assert_eq!(api_server_url(""), "");
    }

    #[test]
    fn https_endpoint_rules() {
        assert!(check_https_endpoint("https://management.azure.com", false).is_ok());
        assert!(check_https_endpoint("https://management.azure.com/", false).is_ok());
        for bad in [
            "http://x",
            "https://x:443",
            "https://u@x",
            "https://x/path",
            "https://x?q=1",
            "https://x#f",
            "https://",
            "management.azure.com",
        ] {
            assert!(check_https_endpoint(bad, false).is_err(), "{bad}");
        }
        assert!(check_https_endpoint("https://x:6443", true).is_ok());
        assert!(check_https_endpoint("https://[::1]:6443", true).is_ok());
        assert!(check_https_endpoint("https://x:99999", true).is_err());
    }

    #[test]
    fn dns1123() {
        assert!(is_dns1123_subdomain("flex-node-1"));
        assert!(is_dns1123_subdomain("a.b-c.d"));
        for bad in ["", "Upper", "-a", "a-", "a_b", "a..b", &"x".repeat(64)] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
    }
}
