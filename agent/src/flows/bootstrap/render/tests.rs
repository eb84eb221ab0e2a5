//! Rendering: a full input set (snapshot), the minimal set, determinism, and errors that name
//! the input at fault without showing the token.

use super::*;

const CA: &str =
    "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJ0ZXN0Ci0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K";
const TOKEN: &str = "abcdef.0123456789abcdef";
const RID: &str = "/subscriptions/12345678-1234-1234-1234-123456789012/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/aks1";

fn host() -> std::io::Result<String> {
    Ok("Flex-Node-1".into())
}

/// The required inputs only.
pub(crate) fn minimal() -> Inputs {
    let mut i = Inputs::default();
    for (k, v) in [
        (names::CLUSTER_RESOURCE_ID, RID),
        (names::KUBERNETES_VERSION, "1.35.0"),
        (names::API_SERVER, "aks1-dns-abc.hcp.westus2.azmk8s.io"),
        (names::CA_CERT_DATA, CA),
        (names::BOOTSTRAP_TOKEN, TOKEN),
    ] {
        assert!(i.set(k, v));
    }
    i
}

/// Every rendering input.
pub(crate) fn full() -> Inputs {
    let mut i = minimal();
    for (k, v) in [
        (names::LOCATION, "westus2"),
        (names::NODE_NAME, "edge-7"),
        (names::NODE_IP, " 10.225.0.5 "),
        (names::LABELS, "team=edge, example.com/tier=gold,empty="),
        (names::TAINTS, "dedicated=flex:NoSchedule,gpu:NoExecute"),
        (
            names::REGISTRY_MIRRORS,
            "registry.k8s.io=http://10.0.2.2:5000, mcr.microsoft.com=https://mirror.example:8443",
        ),
        (names::DNS_SERVICE_IP, "10.0.0.10"),
        (names::MACHINE_CLIENT_MODE, "in-cluster"),
        (
            names::MACHINE_CLIENT_ENDPOINT_URL,
            "/api/v1/namespaces/kube-system/services/http:aks-flex-controller:80/proxy",
        ),
        (names::REQUIRE_MACHINE_REGISTRATION, "TRUE"),
        (names::OCI_IMAGE, "ghcr.io/azure/agent-ubuntu2404:v20260619"),
        (names::OFFLINE_ARTIFACTS, "/var/lib/aks-flex-node/offline"),
        (names::INSECURE_REGISTRIES, " 10.0.2.2:5000 ,Registry.Local"),
        (
            names::REGISTRY_AUTH_FILE,
            "/etc/aks-flex-node/registry-auth.json",
        ),
        (names::LOG_LEVEL, "debug"),
        (names::PREFLIGHT_IGNORE, "disk-space"),
    ] {
        assert!(i.set(k, v));
    }
    i
}

fn text(r: &Rendered) -> String {
    String::from_utf8(r.bytes().to_vec()).unwrap()
}

#[test]
fn full_inputs_snapshot() {
    let r = render(&full(), &host).unwrap();
    insta::assert_snapshot!(text(&r));
    let c = &r.config;
    assert_eq!(c.agent.node_name, "edge-7");
    assert_eq!(c.node.labels["team"], "edge");
    assert_eq!(c.node.labels["example.com/tier"], "gold");
    assert_eq!(c.node.labels["empty"], "");
    assert_eq!(c.node.labels[crate::config::MANAGED_LABEL], "false");
    assert_eq!(
        c.node.taints,
        vec!["dedicated=flex:NoSchedule", "gpu:NoExecute"]
    );
    assert_eq!(
        c.node.registry_mirrors["registry.k8s.io"],
        "http://10.0.2.2:5000"
    );
    assert_eq!(
        c.node.registry_mirrors["mcr.microsoft.com"],
        "https://mirror.example:8443"
    );
    assert_eq!(
        c.bootstrap.insecure_registries,
        vec!["10.0.2.2:5000", "registry.local"]
    );
    assert_eq!(
        names::INSECURE_REGISTRIES,
        flex_host::http::INSECURE_REGISTRIES_ENV
    );
    assert_eq!(
        c.bootstrap.registry_auth.as_ref().unwrap().config_file,
        "/etc/aks-flex-node/registry-auth.json"
    );
    assert!(c.agent.require_machine_registration);
    assert!(c.offline());
    assert_eq!(c.azure.target_cluster.as_ref().unwrap().name, "aks1");
    assert_eq!(
        c.azure.subscription_id,
        "12345678-1234-1234-1234-123456789012"
    );
    // The file loads unchanged, with no unknown keys, and is what the agent reads.
    let loaded = crate::config::parse(r.bytes(), &|| Ok("other".into())).unwrap();
    assert!(loaded.unknown_keys.is_empty(), "{:?}", loaded.unknown_keys);
    assert_eq!(&loaded.config, c);
    // Debug shows neither the token nor the bytes.
    assert!(!format!("{r:?}").contains("0123456789abcdef"));
    assert!(!format!("{:?}", full()).contains("0123456789abcdef"));
}

#[test]
fn minimal_inputs_name_the_node_after_the_lowercased_hostname() {
    let r = render(&minimal(), &host).unwrap();
    insta::assert_snapshot!(text(&r));
    assert_eq!(r.config.agent.node_name, "flex-node-1");
    assert_eq!(r.config.agent.log_level, "info");
    assert_eq!(r.config.networking.dns_service_ip, "10.0.0.10");
    assert!(crate::flows::start::goal_from_config(&r.config).is_ok());
}

#[test]
fn rendering_is_deterministic() {
    let a = render(&full(), &host).unwrap();
    let b = render(&full(), &host).unwrap();
    assert_eq!(a.bytes(), b.bytes());
}

#[test]
fn hostile_values_stay_literal_strings() {
    let mut i = minimal();
    i.set(names::LOCATION, "$(touch /tmp/x)");
    i.set(names::OCI_IMAGE, "`touch /tmp/x`;rm -rf / | sh");
    let r = render(&i, &host).unwrap();
    let v: serde_json::Value = serde_json::from_slice(r.bytes()).unwrap();
    assert_eq!(v["azure"]["targetCluster"]["location"], "$(touch /tmp/x)");
    assert_eq!(v["bootstrap"]["ociImage"], "`touch /tmp/x`;rm -rf / | sh");
}

fn err(f: impl FnOnce(&mut Inputs)) -> String {
    let mut i = minimal();
    f(&mut i);
    let e = render(&i, &host).unwrap_err().to_string();
    assert!(!e.contains("0123456789abcdef"), "{e}");
    e
}

#[test]
fn errors_name_the_input() {
    assert_eq!(
        render(&Inputs::default(), &host).unwrap_err().to_string(),
        "required inputs are not set: AKS_FLEX_NODE_CLUSTER_RESOURCE_ID, AKS_FLEX_NODE_KUBERNETES_VERSION, AKS_FLEX_NODE_API_SERVER, AKS_FLEX_NODE_CA_CERT_DATA, AKS_FLEX_NODE_BOOTSTRAP_TOKEN (or set AKS_FLEX_NODE_CONFIG to a complete config)"
    );
    assert_eq!(
        err(|i| {
            i.set(names::BOOTSTRAP_TOKEN, "  ");
        }),
        "required inputs are not set: AKS_FLEX_NODE_BOOTSTRAP_TOKEN (or set AKS_FLEX_NODE_CONFIG to a complete config)"
    );
    let cases: Vec<(&str, &str, &str)> = vec![
        (
            names::CLUSTER_RESOURCE_ID,
            "/subscriptions/x",
            "is not a managed cluster resource ID",
        ),
        (
            names::BOOTSTRAP_TOKEN,
            "ABCDEF.0123456789abcdef",
            "must match [a-z0-9]{6}.[a-z0-9]{16}",
        ),
        (
            names::API_SERVER,
            "http://aks1:443",
            "must be an absolute https URL",
        ),
        (names::CA_CERT_DATA, "not base64!", "is not valid base64"),
        (
            names::CA_CERT_DATA,
            "aGVsbG8=",
            "does not decode to a PEM certificate",
        ),
        (
            names::NODE_NAME,
            "Edge_7",
            "is not a valid Kubernetes node name",
        ),
        (names::NODE_IP, "10.0.0", "\"10.0.0\" is not an IP address"),
        (names::DNS_SERVICE_IP, "dns", "\"dns\" is not an IP address"),
        (names::LABELS, "team", "\"team\" is not key=value"),
        (names::LABELS, "-bad=x", "\"-bad\" is not a valid label key"),
        (
            names::LABELS,
            "a=$(touch /tmp/x)",
            "the value of \"a\" is not a valid label value",
        ),
        (names::LABELS, "a=1,a=2", "label \"a\" is given twice"),
        (names::TAINTS, "dedicated=flex", "is not key[=value]:Effect"),
        (names::TAINTS, "a=b:Sometimes", "effect \"Sometimes\""),
        (
            names::TAINTS,
            "=b:NoSchedule",
            "does not have a valid key and value",
        ),
        (
            names::REGISTRY_MIRRORS,
            "registry.k8s.io",
            "is not registry=url",
        ),
        (
            names::REGISTRY_MIRRORS,
            "https://registry.k8s.io=http://m:5000",
            "is not a registry host",
        ),
        (
            names::REGISTRY_MIRRORS,
            "registry.k8s.io=m:5000",
            "must be an absolute http or https URL",
        ),
        (
            names::REGISTRY_MIRRORS,
            "registry.k8s.io=http://u:p@m:5000",
            "must not carry credentials",
        ),
        (
            names::REGISTRY_MIRRORS,
            "r.io=http://a,r.io=http://b",
            "registry \"r.io\" is given twice",
        ),
        (
            names::INSECURE_REGISTRIES,
            "10.0.2.2:5000,http://10.0.2.2:5000",
            "\"http://10.0.2.2:5000\" must be host[:port], without a scheme",
        ),
        (
            names::INSECURE_REGISTRIES,
            "10.0.2.2:5000/v2",
            "without a path",
        ),
        (
            names::REGISTRY_AUTH_FILE,
            "registry-auth.json",
            "\"registry-auth.json\" must be a clean absolute path (bootstrap.registryAuth.configFile)",
        ),
        (
            names::MACHINE_CLIENT_MODE,
            "grpc",
            "\"grpc\" is not one of arm, in-cluster",
        ),
        (
            names::MACHINE_CLIENT_ENDPOINT_URL,
            "api/v1",
            "must be an absolute http or https URL",
        ),
        (
            names::REQUIRE_MACHINE_REGISTRATION,
            "yes",
            "\"yes\" is not true, false, 1 or 0",
        ),
        (
            names::LOG_LEVEL,
            "verbose",
            "\"verbose\" is not one of debug, info, warning, error",
        ),
    ];
    for (name, value, want) in cases {
        let e = err(|i| {
            assert!(i.set(name, value));
        });
        assert!(e.starts_with(&format!("{name}: ")), "{name}={value}: {e}");
        assert!(e.contains(want), "{name}={value}: {e}");
    }
    // in-cluster mode needs an endpoint path.
    let e = err(|i| {
        i.set(names::MACHINE_CLIENT_MODE, "in-cluster");
    });
    assert_eq!(
        e,
        "AKS_FLEX_NODE_MACHINE_CLIENT_ENDPOINT_URL: is required in in-cluster mode (agent.machineClient.endpointUrl)"
    );
}

#[test]
fn hostname_problems_point_at_node_name() {
    let bad_host = || Ok::<_, std::io::Error>("host_with_underscore".to_string());
    let e = render(&minimal(), &bad_host).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "AKS_FLEX_NODE_NODE_NAME: is not set and the hostname \"host_with_underscore\""
        ),
        "{e}"
    );
    let no_host = || Err::<String, _>(std::io::Error::other("no uts"));
    let e = render(&minimal(), &no_host).unwrap_err().to_string();
    assert_eq!(
        e,
        "AKS_FLEX_NODE_NODE_NAME: is not set and the hostname cannot be read: no uts"
    );
    // An explicit name does not consult the hostname.
    let mut i = minimal();
    i.set(names::NODE_NAME, "edge-1");
    assert_eq!(
        render(&i, &no_host).unwrap().config.agent.node_name,
        "edge-1"
    );
}
