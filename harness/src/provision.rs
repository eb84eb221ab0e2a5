//! The VM's Ignition config, made by `flex_ignition::node::node_config`, the function
//! `aks-flex-node ignition` makes a node's config with, so the two cannot drift: the harness's
//! base config (a harness user with the generated SSH key, the hostname, and
//! `image/label-containerd.bu` when asked), the agent's provisioning (`image/agent-container.bu`
//! with the agent image filled in) and the bootstrap inputs, checked as the command checks its
//! bootstrap arguments, in `/etc/aks-flex-node/bootstrap.env` (0600), which the first-boot unit
//! removes once the bootstrap succeeded. The `ignition` crate reports a conflict rather than
//! overwriting. With `up --cluster`, the bootstrap inputs join the kind cluster
//! ([`cluster_bootstrap_env`]).
//!
//! The harness calls the library rather than running the agent's binary: it never links the
//! agent (`cargo xtask layering`), and the function is the command's own; what the command adds
//! (rendering the inputs with the agent's renderer) the harness's tests do with the agent as a
//! dev-dependency (`cluster_env_renders_a_joining_config`, and
//! `renders_what_aks_flex_node_ignition_renders`, which compares the two outputs).

use std::path::Path;

use flex_ignition::node::{AgentImage, BootstrapArgs, node_config};
use flex_ignition::{SpecVersion, merge, parse_butane, to_ignition_json};

use crate::ssh::USER;

/// Marker of a hostile bootstrap input: if it exists on the host, bootstrap.env was evaluated.
pub const PWNED_MARKER: &str = "/tmp/aks-flex-node-bootstrap-env-evaluated";

/// The literal value the harness puts in `AKS_FLEX_NODE_LOCATION`.
pub fn hostile_location() -> String {
    format!("$(touch {PWNED_MARKER})`touch {PWNED_MARKER}`")
}

/// What the harness adds to the host's provisioning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Additions {
    /// The harness user's public key.
    pub ssh_public_key: String,
    /// The guest's hostname.
    pub hostname: String,
    /// The agent image (pinned by digest), pulled with `--plain-http` from the harness's
    /// registry, which is also the one registry the agent may pull from over plain HTTP.
    pub image: AgentImage,
    /// `/etc/aks-flex-node/bootstrap.env`, if the host should bootstrap at first boot.
    pub bootstrap_env: Option<String>,
    /// The credentials file for the harness's password-protected registry
    /// ([`crate::registry::GUEST_AUTH_FILE`], mode 0600), if it has one.
    pub registry_auth: Option<String>,
    /// Merge `image/label-containerd.bu`.
    pub label_containerd: bool,
}

fn yaml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The harness's base config as Butane YAML: its user, the hostname and, with a
/// password-protected registry, the credentials file for it.
pub fn additions_butane(a: &Additions) -> String {
    let mut y = format!(
        "variant: flatcar\nversion: 1.1.0\npasswd:\n  users:\n    - name: {USER}\n      groups: [sudo]\n      ssh_authorized_keys:\n        - {}\nstorage:\n  files:\n    - path: /etc/hostname\n      mode: 0644\n      overwrite: true\n      contents:\n        inline: {}\n",
        yaml_str(&a.ssh_public_key),
        yaml_str(&format!("{}\n", a.hostname)),
    );
    if let Some(creds) = &a.registry_auth {
        y.push_str(&format!(
            "    - path: {}\n      mode: 0600\n      overwrite: true\n      contents:\n        inline: {}\n",
            crate::registry::GUEST_AUTH_FILE,
            yaml_str(creds),
        ));
    }
    y
}

/// The bootstrap inputs of a `bootstrap.env` text as the bootstrap arguments
/// `aks-flex-node ignition` takes (`KEY=VALUE`), checked as the command checks them.
pub fn bootstrap_args(env: &str) -> anyhow::Result<BootstrapArgs> {
    let entries = flex_api::bootstrap_env::parse(env)
        .map_err(|e| anyhow::anyhow!("the harness's bootstrap.env: {e}"))?;
    let args: Vec<String> = entries
        .iter()
        .map(|e| format!("{}={}", e.key, e.value))
        .collect();
    BootstrapArgs::parse(&args).map_err(|e| anyhow::anyhow!("the harness's bootstrap inputs: {e}"))
}

/// The registry (`host[:port]`) of an image reference: the part before the first `/`. The
/// harness's images all live on its own registry (or its password-protected instance), so
/// these are the registries it opts in to plain HTTP.
pub fn registry_of(image: &str) -> &str {
    image.split_once('/').map_or(image, |(r, _)| r)
}

/// The distinct registries of `images`, in order, comma-separated (an
/// `AKS_FLEX_NODE_INSECURE_REGISTRIES` value).
pub fn registries_of(images: &[&str]) -> String {
    let mut out: Vec<&str> = Vec::new();
    for i in images {
        let r = registry_of(i);
        if !out.contains(&r) {
            out.push(r);
        }
    }
    out.join(",")
}

/// The bootstrap inputs that join the harness's kind cluster: its API server as the guest
/// reaches it, its CA and the bootstrap token, the cluster's Kubernetes version (downloaded by
/// the agent: the offline bundle's kubelet is a stand-in), the node's address on QEMU's user
/// network, kind's DNS service, the machine registered with the in-cluster controller (the
/// registration is required), and `location` as a literal (the bootstrap group checks it is
/// not evaluated). The text holds the token: it goes into the Ignition config and the VM's
/// state, never into a log.
pub fn cluster_bootstrap_env(
    join: &crate::cluster::Join,
    machine_image: &str,
    location: &str,
    bundle: Option<&OfflineBundle>,
    mirror: Option<&str>,
) -> String {
    let loc = location.replace('\'', "");
    let kubernetes = bundle.map_or(join.kubernetes_version.as_str(), |b| &b.kubernetes);
    let mut lines = vec![
        "# Written by cargo xtask up --cluster: joins the cluster up made or was given."
            .to_string(),
        format!(
            "AKS_FLEX_NODE_CLUSTER_RESOURCE_ID=/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/harness/providers/Microsoft.ContainerService/managedClusters/{}",
            crate::cluster::CLUSTER_NAME
        ),
        format!("AKS_FLEX_NODE_LOCATION='{loc}'"),
        format!("AKS_FLEX_NODE_KUBERNETES_VERSION={kubernetes}"),
        format!("AKS_FLEX_NODE_API_SERVER={}", join.api_server),
        format!("AKS_FLEX_NODE_CA_CERT_DATA={}", join.ca_cert_data),
        format!(
            "AKS_FLEX_NODE_BOOTSTRAP_TOKEN={}",
            join.token.token().expose()
        ),
        format!("AKS_FLEX_NODE_NODE_NAME={}", join.node_name),
        format!("AKS_FLEX_NODE_NODE_IP={}", join.node_ip),
        format!("AKS_FLEX_NODE_DNS_SERVICE_IP={}", join.dns_service_ip),
        match &join.machine_endpoint {
            Some(_) => "AKS_FLEX_NODE_MACHINE_CLIENT_MODE=controller".into(),
            None => "AKS_FLEX_NODE_MACHINE_CLIENT_MODE=in-cluster".into(),
        },
        format!(
            "AKS_FLEX_NODE_MACHINE_CLIENT_ENDPOINT_URL={}",
            join.machine_endpoint
                .as_deref()
                .unwrap_or(flex_api::arm::DEFAULT_ENDPOINT_PATH)
        ),
        "AKS_FLEX_NODE_REQUIRE_MACHINE_REGISTRATION=true".into(),
        format!("AKS_FLEX_NODE_OCI_IMAGE={machine_image}"),
        format!(
            "AKS_FLEX_NODE_INSECURE_REGISTRIES={}",
            registries_of(
                &[Some(machine_image), bundle.map(|b| b.reference.as_str())]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
            )
        ),
        "AKS_FLEX_NODE_LOG_LEVEL=debug".into(),
        "AKS_FLEX_NODE_PREFLIGHT_IGNORE=disk-space".into(),
    ];
    if let Some(b) = bundle {
        lines.push(format!(
            "AKS_FLEX_NODE_OFFLINE_ARTIFACTS=oci://{}",
            b.reference
        ));
    }
    if let Some(m) = mirror {
        let pairs: Vec<String> = MIRRORED_REGISTRIES
            .iter()
            .map(|r| format!("{r}={m}"))
            .collect();
        lines.push(format!(
            "AKS_FLEX_NODE_REGISTRY_MIRRORS={}",
            pairs.join(",")
        ));
    }
    lines.push(String::new());
    lines.join("\n")
}

/// The registries whose images a node of an offline cluster pulls through the harness's
/// registry (`node.registryMirrors`): the pause image's and the probe pod's.
pub const MIRRORED_REGISTRIES: &[&str] = &["mcr.microsoft.com", "registry.k8s.io"];

/// Where an image reference's repository and tag sit in a mirror: the reference without its
/// registry host (`registry.k8s.io/e2e-test-images/busybox:1.36.1-1` →
/// `e2e-test-images/busybox:1.36.1-1`).
pub fn mirror_path(reference: &str) -> &str {
    reference
        .split_once('/')
        .map_or(reference, |(_, rest)| rest)
}

/// A component bundle with real Kubernetes binaries (`up --k8s-bin-dir`), for a node that joins
/// a cluster without downloading them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfflineBundle {
    /// The bundle's pinned reference as the guest pulls it.
    pub reference: String,
    /// Its Kubernetes version (the node runs it).
    pub kubernetes: String,
}

/// Renders the Ignition JSON for the VM.
pub fn render(repo: &Path, a: &Additions, spec: SpecVersion) -> anyhow::Result<String> {
    let mut base = parse_butane(&additions_butane(a), None)
        .map_err(|e| anyhow::anyhow!("harness additions: {e}"))?;
    if a.label_containerd {
        let p = repo.join("image").join("label-containerd.bu");
        let text = std::fs::read_to_string(&p)
            .map_err(|e| anyhow::anyhow!("read {}: {e}", p.display()))?;
        let label = parse_butane(&text, None)
            .map_err(|e| anyhow::anyhow!("image/label-containerd.bu: {e}"))?;
        base = merge(&base, &label)?;
    }
    let args = match &a.bootstrap_env {
        Some(env) => bootstrap_args(env)?,
        None => BootstrapArgs::default(),
    };
    let config = node_config(&base, &a.image, &args)?;
    Ok(to_ignition_json(&config, spec))
}

/// Renders the Ignition JSON for a VM in host mode (`up --mode host`): the harness's additions
/// merged with [`crate::hostmode::butane`] (`scripts/bootstrap.sh` and the host bootstrap
/// unit) instead of `image/agent-container.bu`: no container settings, no container units.
pub fn render_host(repo: &Path, a: &Additions, spec: SpecVersion) -> anyhow::Result<String> {
    let p = repo.join("scripts/bootstrap.sh");
    let script =
        std::fs::read_to_string(&p).map_err(|e| anyhow::anyhow!("read {}: {e}", p.display()))?;
    let base = parse_butane(&crate::hostmode::butane(&script), None)
        .map_err(|e| anyhow::anyhow!("host mode provisioning: {e}"))?;
    let mut config = merge(
        &base,
        &parse_butane(&additions_butane(a), None)
            .map_err(|e| anyhow::anyhow!("harness additions: {e}"))?,
    )?;
    // bootstrap.sh's inputs include the install's (download URL, sha256), which `aks-flex-node
    // ignition` refuses (it provisions the container): the file is written as given.
    if let Some(env) = &a.bootstrap_env {
        config
            .add_file(
                flex_ignition::File::new(flex_ignition::node::ENV_FILE)
                    .with_mode(0o600)
                    .with_data(env.as_bytes().to_vec()),
            )
            .map_err(|e| anyhow::anyhow!("host mode bootstrap.env: {e}"))?;
    }
    Ok(to_ignition_json(&config, spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_location_has_no_newline_and_names_the_marker() {
        let l = hostile_location();
        assert!(!l.contains('\n'));
        assert!(l.contains(PWNED_MARKER));
    }

    fn repo() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn additions() -> Additions {
        Additions {
            ssh_public_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests harness".into(),
            hostname: "flex-dev-node".into(),
            image: AgentImage {
                reference: format!("10.0.2.100:5000/aks-flex/agent@{DIGEST}"),
                plain_http: true,
                insecure_registries: vec!["10.0.2.100:5000".into()],
            },
            bootstrap_env: Some("AKS_FLEX_NODE_NODE_NAME=\"$(touch /tmp/x)\"\n".into()),
            registry_auth: None,
            label_containerd: true,
        }
    }

    #[test]
    fn renders_merged_config() {
        let json = render(&repo(), &additions(), SpecVersion::V3_3_0).unwrap();
        assert!(
            !json.contains("@AKS_FLEX_NODE_"),
            "a placeholder is left: {json}"
        );
        // The container settings opt the harness's registry (only) in to plain HTTP. (Read
        // back through the parser: with a full digest the file is gzipped in the data URL.)
        let config = flex_ignition::parse_ignition(&json).unwrap();
        let Some(flex_ignition::Contents::Data { data, compression }) = &config
            .file("/etc/sysconfig/aks-flex-node-container")
            .unwrap()
            .contents
        else {
            panic!("not embedded")
        };
        let data = match compression {
            Some(_) => {
                use std::io::Read as _;
                let mut out = Vec::new();
                flate2::read::GzDecoder::new(&data[..])
                    .read_to_end(&mut out)
                    .unwrap();
                out
            }
            None => data.clone(),
        };
        let settings = String::from_utf8(data).unwrap();
        assert!(
            settings.contains("\nAKS_FLEX_NODE_INSECURE_REGISTRIES=10.0.2.100:5000\n")
                && settings.contains("\nAKS_FLEX_NODE_PULL_ARGS=--plain-http\n"),
            "{settings}"
        );
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["ignition"]["version"], "3.3.0");
        let units: Vec<&str> = v["systemd"]["units"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["name"].as_str().unwrap())
            .collect();
        for u in [
            "usr-local-overlay.service",
            "aks-flex-node-bootstrap.service",
            "aks-flex-node-reset.service",
            "label-containerd.service",
        ] {
            assert!(units.contains(&u), "{u} missing from {units:?}");
        }
        assert!(!json.contains("@AKS_FLEX_NODE_IMAGE@"));
        assert_eq!(v["passwd"]["users"][0]["name"], USER);
    }

    /// A self-signed CA (base64 PEM) for rendering tests.
    const TEST_CA: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJ4ekNDQVcyZ0F3SUJBZ0lVVXhTQmRqeG8zUm9aQnB2ajkyd0FPdXZSQktFd0NnWUlLb1pJemowRUF3SXcKT0RFMk1EUUdBMVVFQXd3dFlXdHpMV1pzWlhndGJtOWtaU0J2Wm1ac2FXNWxJR2hoY201bGMzTWdRMEVnS0c1dgpJR05zZFhOMFpYSXBNQ0FYRFRJMk1USXdNakUyTWpFd04xb1lEekl4TWpZeE1UQTRNVFl5TVRBM1dqQTRNVFl3Ck5BWURWUVFEREMxaGEzTXRabXhsZUMxdWIyUmxJRzltWm14cGJtVWdhR0Z5Ym1WemN5QkRRU0FvYm04Z1kyeDEKYzNSbGNpa3dXVEFUQmdjcWhrak9QUUlCQmdncWhrak9QUU1CQndOQ0FBVHhQc2pNZWRkT3hZaFVyQmFHckU0SAphL0pNZG5PYzhGb042SUpKTll2UUNxbWNpaU9mZkV6YklmWHAwYjliUnFYUml6Njk4TWttQ2Q2QzdSc0FhbjJjCm8xTXdVVEFkQmdOVkhRNEVGZ1FVSGhLNVM3QlJBcGZHUmVRN1JjU1NqenlZY1RNd0h3WURWUjBqQkJnd0ZvQVUKSGhLNVM3QlJBcGZHUmVRN1JjU1NqenlZY1RNd0R3WURWUjBUQVFIL0JBVXdBd0VCL3pBS0JnZ3Foa2pPUFFRRApBZ05JQURCRkFpRUE2YnZsVm5xODJhYlU5N01mQVJScFJyZHlpa0hNUDVaVFhXWjYvUTFwTVVJQ0lBOU1ic2FXCkg1aGFTYVdzcU5KN05WQzQya21JL0dZYk01RDJwdGYvcnA3cgotLS0tLUVORCBDRVJUSUZJQ0FURS0tLS0tCg==";

    fn join() -> crate::cluster::Join {
        crate::cluster::Join {
            api_server: "https://10.0.2.2:36443".into(),
            ca_cert_data: TEST_CA.into(),
            token: crate::cluster::token::BootstrapToken::from_parts("abcdef", "0123456789abcdef")
                .unwrap(),
            kubernetes_version: "1.34.0".into(),
            node_name: "flex-dev-node".into(),
            node_ip: "10.0.2.15".into(),
            dns_service_ip: "10.96.0.10".into(),
            machine_endpoint: None,
        }
    }

    /// The cluster inputs are valid bootstrap inputs: the agent's own parser and renderer
    /// accept them, and the config joins the cluster with the token through the in-cluster
    /// machine client.
    #[test]
    fn cluster_env_renders_a_joining_config() {
        use aks_flex_node::flows::bootstrap::{inputs::Inputs, render};
        let text = cluster_bootstrap_env(
            &join(),
            "10.0.2.2:5000/aks-flex/machine@sha256:00",
            &hostile_location(),
            None,
            None,
        );
        let entries = flex_api::bootstrap_env::parse(&text).unwrap();
        let inputs = Inputs::from_sources(None, &entries, Vec::new()).unwrap();
        let rendered = render::render(&inputs, &|| Ok("flex-dev-node".to_string())).unwrap();
        let c = &rendered.config;
        assert_eq!(
            c.azure.bootstrap_token.as_ref().unwrap().token.expose(),
            "abcdef.0123456789abcdef"
        );
        assert_eq!(c.agent.node_name, "flex-dev-node");
        assert_eq!(
            c.azure.target_cluster.as_ref().unwrap().location,
            hostile_location()
        );
        let json: serde_json::Value = serde_json::from_slice(rendered.bytes()).unwrap();
        assert_eq!(
            json["node"]["kubelet"]["clusterFQDN"],
            "https://10.0.2.2:36443"
        );
        assert_eq!(json["agent"]["machineClient"]["mode"], "in-cluster");
        assert!(text.lines().all(|l| !l.contains("OFFLINE_ARTIFACTS")));
        insta::assert_snapshot!(text.replace(TEST_CA, "<ca>"));
    }

    /// An existing cluster's local controller: the agent's own renderer takes the `controller`
    /// mode and its URL.
    #[test]
    fn cluster_env_with_a_local_controller_uses_controller_mode() {
        use aks_flex_node::flows::bootstrap::{inputs::Inputs, render};
        let mut j = join();
        j.machine_endpoint = Some("http://10.0.2.2:18080".into());
        let bundle = OfflineBundle {
            reference: "10.0.2.2:5000/aks-flex/bundle@sha256:11".into(),
            kubernetes: "1.36.2".into(),
        };
        let text = cluster_bootstrap_env(
            &j,
            "10.0.2.2:5000/m@sha256:00",
            "westus2",
            Some(&bundle),
            Some("http://10.0.2.2:5000"),
        );
        assert!(
            text.contains(
                "AKS_FLEX_NODE_OFFLINE_ARTIFACTS=oci://10.0.2.2:5000/aks-flex/bundle@sha256:11\n"
            ),
            "{text}"
        );
        let entries = flex_api::bootstrap_env::parse(&text).unwrap();
        let inputs = Inputs::from_sources(None, &entries, Vec::new()).unwrap();
        let rendered = render::render(&inputs, &|| Ok("flex-dev-node".to_string())).unwrap();
        let json: serde_json::Value = serde_json::from_slice(rendered.bytes()).unwrap();
        assert_eq!(json["agent"]["machineClient"]["mode"], "controller");
        assert_eq!(
            json["agent"]["machineClient"]["endpointUrl"],
            "http://10.0.2.2:18080"
        );
        assert_eq!(
            json["components"]["kubernetes"], "1.36.2",
            "the bundle's version"
        );
        assert_eq!(
            json["node"]["registryMirrors"],
            serde_json::json!({"mcr.microsoft.com": "http://10.0.2.2:5000", "registry.k8s.io": "http://10.0.2.2:5000"})
        );
    }

    /// The bootstrap inputs go to bootstrap.env (0600), which the bootstrap's own parser reads
    /// back as the harness wrote them (the hostile value literal), and the first-boot unit has
    /// the drop-in that removes the file after a successful bootstrap.
    /// The password-protected registry's credentials file is written 0600 where
    /// `AKS_FLEX_NODE_REGISTRY_AUTH_FILE` points, as given, in both modes' Ignition configs
    /// (parsed back by the project's Ignition parser).
    #[test]
    fn the_registry_credentials_file_is_written_0600_in_both_modes() {
        let reg = crate::registry::Registry {
            port: 5000,
            dir: "/w/registry".into(),
            auth: Some(crate::registry::AuthRegistry {
                port: 5001,
                password: "pw-0123".into(),
            }),
        };
        let creds = reg.guest_credentials().unwrap();
        let doc = flex_oci::DockerConfig::parse("test", creds.as_bytes()).unwrap();
        assert_eq!(
            doc.get("10.0.2.2:5001"),
            Some(&flex_oci::RegistryCredential::Basic {
                username: crate::registry::AUTH_USER.into(),
                password: flex_host::secret::Secret::new("pw-0123"),
            })
        );
        assert_eq!(reg.guest_auth_addr().as_deref(), Some("10.0.2.2:5001"));
        let a = Additions {
            registry_auth: Some(creds.clone()),
            ..additions()
        };
        for json in [
            render(&repo(), &a, SpecVersion::V3_3_0).unwrap(),
            render_host(&repo(), &a, SpecVersion::V3_3_0).unwrap(),
        ] {
            let v: serde_json::Value = serde_json::from_str(&json).unwrap();
            let file = v["storage"]["files"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["path"] == crate::registry::GUEST_AUTH_FILE)
                .unwrap();
            assert_eq!(file["mode"], 0o600);
            let config = flex_ignition::parse_ignition(&json).unwrap();
            let Some(flex_ignition::Contents::Data { data, .. }) = &config
                .file(crate::registry::GUEST_AUTH_FILE)
                .unwrap()
                .contents
            else {
                panic!("not embedded")
            };
            assert_eq!(std::str::from_utf8(data).unwrap(), creds);
        }
        // Without one, no file.
        let json = render(&repo(), &additions(), SpecVersion::V3_3_0).unwrap();
        assert!(!json.contains(crate::registry::GUEST_AUTH_FILE));
    }

    #[test]
    fn bootstrap_env_is_written_0600_and_removed_after_a_successful_bootstrap() {
        let env = "# comment\nAKS_FLEX_NODE_NODE_NAME=\"$(touch /tmp/x)\"\nAKS_FLEX_NODE_BOOTSTRAP_TOKEN=abcdef.0123456789abcdef\n";
        let a = Additions {
            bootstrap_env: Some(env.into()),
            ..additions()
        };
        let json = render(&repo(), &a, SpecVersion::V3_3_0).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let file = v["storage"]["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == "/etc/aks-flex-node/bootstrap.env")
            .unwrap();
        assert_eq!(file["mode"], 0o600);
        let config = flex_ignition::parse_ignition(&json).unwrap();
        let Some(flex_ignition::Contents::Data { data, .. }) = &config
            .file("/etc/aks-flex-node/bootstrap.env")
            .unwrap()
            .contents
        else {
            panic!("not embedded")
        };
        let written = flex_api::bootstrap_env::parse(std::str::from_utf8(data).unwrap()).unwrap();
        let given = flex_api::bootstrap_env::parse(env).unwrap();
        let pairs = |e: &[flex_api::bootstrap_env::Entry]| -> Vec<(String, String)> {
            e.iter().map(|e| (e.key.clone(), e.value.clone())).collect()
        };
        assert_eq!(pairs(&written), pairs(&given));
        let unit = config.unit("aks-flex-node-bootstrap.service").unwrap();
        assert_eq!(unit.dropins.len(), 1);
        assert!(
            unit.dropins[0]
                .contents
                .as_deref()
                .unwrap()
                .contains("\nExecStartPost=/bin/rm -f /etc/aks-flex-node/bootstrap.env\n")
        );
    }

    /// A bootstrap input the command would refuse (a flag the command sets itself) fails the
    /// harness's render too: the two check alike.
    #[test]
    fn inputs_the_command_refuses_fail_the_render() {
        let a = Additions {
            bootstrap_env: Some("AKS_FLEX_NODE_USE_INSTALLED_AGENT=true\n".into()),
            ..additions()
        };
        let e = render(&repo(), &a, SpecVersion::V3_4_0).unwrap_err();
        assert!(
            e.to_string().contains("AKS_FLEX_NODE_USE_INSTALLED_AGENT"),
            "{e}"
        );
    }

    /// The harness's config is byte for byte what `aks-flex-node ignition` (its library
    /// function, the real one, from the agent as a dev-dependency) writes for the same base
    /// config, image and bootstrap inputs.
    #[test]
    fn renders_what_aks_flex_node_ignition_renders() {
        let env = cluster_bootstrap_env(
            &join(),
            "10.0.2.2:5000/aks-flex/machine@sha256:00",
            &hostile_location(),
            None,
            None,
        );
        let a = Additions {
            bootstrap_env: Some(env.clone()),
            registry_auth: None,
            label_containerd: false,
            ..additions()
        };
        let harness = render(&repo(), &a, SpecVersion::V3_4_0).unwrap();
        let args: Vec<String> = flex_api::bootstrap_env::parse(&env)
            .unwrap()
            .iter()
            .map(|e| format!("{}={}", e.key, e.value))
            .collect();
        let command =
            aks_flex_node::flows::ignition::render(&aks_flex_node::flows::ignition::Request {
                base_config: &additions_butane(&a),
                files_dir: None,
                image: a.image.clone(),
                bootstrap_args: &args,
                spec: SpecVersion::V3_4_0,
            })
            .unwrap();
        assert_eq!(harness, command);
    }

    /// Real: the ignition crate's Butane parser and merge, the repository's bootstrap.sh.
    /// Host mode provisions bootstrap.sh and the host bootstrap unit, and nothing of the
    /// container (no container settings, no container units, no /usr/local overlay unit).
    #[test]
    fn host_mode_provisions_bootstrap_sh_and_no_container() {
        let json = render_host(&repo(), &additions(), SpecVersion::V3_3_0).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let units: Vec<&str> = v["systemd"]["units"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["name"].as_str().unwrap())
            .collect();
        assert_eq!(units, ["aks-flex-node-bootstrap.service"]);
        assert!(
            v["systemd"]["units"][0]["contents"]
                .as_str()
                .unwrap()
                .contains(crate::hostmode::BOOTSTRAP_SH)
        );
        let files: Vec<&str> = v["storage"]["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap())
            .collect();
        assert!(files.contains(&crate::hostmode::BOOTSTRAP_SH), "{files:?}");
        assert!(
            files.contains(&"/etc/aks-flex-node/bootstrap.env"),
            "{files:?}"
        );
        assert!(
            !files.contains(&"/etc/sysconfig/aks-flex-node-container"),
            "{files:?}"
        );
        assert!(!json.contains("ctr "), "no container command: {json}");
    }

    #[test]
    fn without_label_containerd_and_bootstrap() {
        let mut a = additions();
        a.label_containerd = false;
        a.bootstrap_env = None;
        let json = render(&repo(), &a, SpecVersion::V3_4_0).unwrap();
        assert!(!json.contains("label-containerd"));
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let paths: Vec<&str> = v["storage"]["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap())
            .collect();
        assert!(
            !paths.contains(&"/etc/aks-flex-node/bootstrap.env"),
            "{paths:?}"
        );
    }
}
