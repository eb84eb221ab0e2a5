//! What the harness writes into the kind cluster, rendered as text (pure): the kind config,
//! the controller's kustomize overlay, the harness's RBAC for the agent's daemon, the machine
//! entry of `kube-system/aks-flex-machines`, the bootstrap token Secret, MachineOperations, the
//! probe pod, kube-proxy's kubeconfig pointed at the control plane's address, and the
//! controller image's OCI index with the name the CRI looks images up by.
//!
//! Kubernetes objects are JSON (`kubectl apply -f -` takes it); the kind config and the
//! kustomization are YAML, as their tools document them.

use std::path::{Component, Path, PathBuf};

use flex_api::arm::ArmMachine;
use flex_api::arm::{ArmKubeletConfig, ArmKubernetesProfile, ArmMachineProperties, MACHINE_TYPE};
use flex_host::secret::Secret;
use serde_json::{Value, json};

use super::token::BootstrapToken;
use crate::registry::GUEST_HOST_ADDR;

/// The kind cluster's name (its node container is `aks-flex-control-plane`).
pub const CLUSTER_NAME: &str = "aks-flex";
/// The control plane node (and container) kind creates for [`CLUSTER_NAME`].
pub const CONTROL_PLANE: &str = "aks-flex-control-plane";
/// The port the API server listens on inside the control plane's container.
pub const CONTROL_PLANE_PORT: u16 = 6443;
/// Where the machine store lives.
pub const NAMESPACE: &str = "kube-system";
/// The controller's machine store (`controller/src/store.rs`).
pub const MACHINES_CONFIG_MAP: &str = "aks-flex-machines";
/// The group the controller's CSR approver requires of a bootstrap token
/// (`--bootstrap-group`), which `deploy/controller/rbac.yaml` lets reach the machine endpoint.
pub const AKS_FLEX_BOOTSTRAP_GROUP: &str = "system:bootstrappers:aks-flex-node";
/// The group kubeadm's RBAC lets bootstrap kubelets (`system:node-bootstrapper`) and whose
/// node client CSRs kube-controller-manager auto-approves for any node. The harness's token is
/// not in it: kubelet's certificate must come from the controller's approver, under the token's
/// binding, as on users' clusters (#29 item 1).
pub const KUBEADM_NODE_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";
/// kind's cluster DNS service address (service CIDR 10.96.0.0/16).
pub const DNS_SERVICE_IP: &str = "10.96.0.10";
/// The probe pod's image: one of Kubernetes' own e2e images, on registry.k8s.io.
pub const PROBE_IMAGE: &str = "registry.k8s.io/e2e-test-images/busybox:1.36.1-1";
/// What the probe pod prints, for `kubectl logs`.
pub const PROBE_MARKER: &str = "aks-flex-harness-probe-ok";
/// The label on everything the harness creates in the cluster.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "flex-harness");

/// The kind config: the API server listens on every host address at `api_port` (the guest
/// reaches the host's loopback as `10.0.2.2`), and its certificate names `10.0.2.2`. kind's
/// patches are merge patches, so the SAN list repeats kind's own (`0.0.0.0`, `127.0.0.1`,
/// `localhost`).
pub fn kind_config(api_port: u16) -> String {
    format!(
        "kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
name: {CLUSTER_NAME}
networking:
  apiServerAddress: \"0.0.0.0\"
  apiServerPort: {api_port}
kubeadmConfigPatches:
  - |
    kind: ClusterConfiguration
    apiServer:
      certSANs:
        - \"{GUEST_HOST_ADDR}\"
        - \"0.0.0.0\"
        - \"127.0.0.1\"
        - \"localhost\"
nodes:
  - role: control-plane
"
    )
}

/// The ARM machine document the controller serves for `node` (one line of JSON), with the
/// settings version `etag`, allowing bootstrap token `token_id` to bootstrap it (the tag the
/// controller's CSR approver checks).
pub fn machine_entry(
    node: &str,
    kubernetes_version: &str,
    etag: &str,
    token_id: &str,
) -> anyhow::Result<String> {
    let m = ArmMachine {
        id: Some(format!(
            "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/harness/providers/Microsoft.ContainerService/managedClusters/{CLUSTER_NAME}/agentPools/aksflexnodes/machines/{node}"
        )),
        name: Some(node.to_string()),
        type_: Some(MACHINE_TYPE.to_string()),
        zones: None,
        properties: Some(ArmMachineProperties {
            e_tag: Some(etag.to_string()),
            provisioning_state: Some("Succeeded".into()),
            tags: Some(
                [(
                    flex_api::arm::BOOTSTRAP_TOKEN_ID_TAG.to_string(),
                    Some(token_id.to_string()),
                )]
                .into_iter()
                .collect(),
            ),
            kubernetes: Some(ArmKubernetesProfile {
                orchestrator_version: Some(kubernetes_version.to_string()),
                max_pods: Some(110),
                node_labels: Some(
                    [(
                        "kubernetes.azure.com/managed".to_string(),
                        Some("false".to_string()),
                    )]
                    .into_iter()
                    .collect(),
                ),
                node_taints: Some(Vec::new()),
                kubelet_config: Some(ArmKubeletConfig {
                    image_gc_high_threshold: Some(85),
                    image_gc_low_threshold: Some(80),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    };
    Ok(serde_json::to_string(&m)?)
}

/// `kube-system/aks-flex-machines` with the one entry `<node>.json` (what `kubectl apply`
/// makes the whole ConfigMap).
pub fn machines_config_map(node: &str, entry: &str) -> String {
    pretty(&json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": MACHINES_CONFIG_MAP,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": "aks-flex-controller"},
        },
        "data": {format!("{node}.json"): entry},
    }))
}

/// The bootstrap token Secret (`kube-system/bootstrap-token-<id>`), as kubeadm writes one,
/// usable for authentication, in the groups kubelet's TLS bootstrap and the controller's CSR
/// approver need, without expiry (the cluster goes with `down`). It holds the token: it goes
/// to `kubectl` on stdin, never in an argument or a log.
pub fn token_secret(token: &BootstrapToken) -> Secret {
    Secret::new(pretty(&json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": format!("bootstrap-token-{}", token.id()),
            "namespace": NAMESPACE,
            "labels": {MANAGED_BY.0: MANAGED_BY.1},
        },
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "description": "aks-flex-node harness: the VM's agent joins with it",
            "token-id": token.id(),
            "token-secret": token.secret().expose(),
            "usage-bootstrap-authentication": "true",
            "auth-extra-groups": AKS_FLEX_BOOTSTRAP_GROUP,
        },
    })))
}

/// The kustomize overlay over `deploy/controller` (`base`, relative to the overlay): the image
/// `aks-flex-controller:<tag>` as `kind load` put it on the node (never pulled), and the CSR
/// approver on. The JSON patch tests the argument it replaces, so a changed Deployment fails
/// the apply instead of being patched blindly.
pub fn controller_kustomization(base: &str, tag: &str) -> String {
    format!(
        "# Written by cargo xtask up --cluster: deploy/controller with the image loaded into kind
# and the CSR approver enabled.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {base}
images:
  - name: aks-flex-controller
    newName: aks-flex-controller
    newTag: \"{tag}\"
patches:
  - target:
      kind: Deployment
      name: aks-flex-controller
    patch: |-
      - op: replace
        path: /spec/template/spec/containers/0/imagePullPolicy
        value: Never
      - op: test
        path: /spec/template/spec/containers/0/args/3
        value: --enable-csr-approver=false
      - op: replace
        path: /spec/template/spec/containers/0/args/3
        value: --enable-csr-approver=true
"
    )
}

/// A MachineOperation of `kind` for the machine `node` (the agent's machine name is its node
/// name), with `parameters` (none: no `parameters` field).
pub fn machine_operation(
    name: &str,
    kind: &str,
    node: &str,
    parameters: &[(&str, &str)],
) -> String {
    let mut spec = json!({"machineRef": node, "operationKind": kind});
    if !parameters.is_empty() {
        let p: serde_json::Map<String, Value> = parameters
            .iter()
            .map(|(k, v)| ((*k).to_string(), Value::from(*v)))
            .collect();
        spec["parameters"] = Value::Object(p);
    }
    pretty(&json!({
        "apiVersion": format!("{}/{}", flex_api::machina::GROUP, flex_api::machina::VERSION),
        "kind": "MachineOperation",
        "metadata": {"name": name, "labels": {MANAGED_BY.0: MANAGED_BY.1}},
        "spec": spec,
    }))
}

/// The probe pod, bound to `node`: it prints [`PROBE_MARKER`] and idles, and, as PID 1 with a
/// trap, exits at once on SIGTERM (a shell without one ignores it and holds the node's shutdown
/// for the grace period).
pub fn probe_pod(name: &str, node: &str) -> String {
    pretty(&json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {MANAGED_BY.0: MANAGED_BY.1, "app.kubernetes.io/name": "aks-flex-harness-probe"},
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": "probe",
                "image": PROBE_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": [
                    "sh",
                    "-c",
                    format!("trap 'exit 0' TERM INT; echo {PROBE_MARKER}; while true; do sleep 1; done"),
                ],
            }],
        },
    }))
}

/// kube-proxy's ConfigMap (`kubectl get -o json`) with its kubeconfig's `server:` set to
/// `server`, reduced to what `kubectl replace` needs. kind points it at
/// `https://aks-flex-control-plane:6443`, a name only the cluster's containers resolve; the
/// control plane's address also works from the VM's node.
pub fn kube_proxy_config_map(current: &str, server: &str) -> anyhow::Result<String> {
    let v: Value = serde_json::from_str(current)?;
    let data = v
        .get("data")
        .and_then(Value::as_object)
        .ok_or_else(|| anyhow::anyhow!("kube-proxy's ConfigMap has no data"))?;
    let conf = data
        .get("kubeconfig.conf")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow::anyhow!("kube-proxy's ConfigMap has no kubeconfig.conf"))?;
    let mut replaced = false;
    let lines: Vec<String> = conf
        .lines()
        .map(|l| {
            let t = l.trim_start();
            if t.starts_with("server:") {
                replaced = true;
                format!("{}server: {server}", &l[..l.len() - t.len()])
            } else {
                l.to_string()
            }
        })
        .collect();
    if !replaced {
        anyhow::bail!("kube-proxy's kubeconfig.conf has no server: line");
    }
    let mut conf = lines.join("\n");
    if !conf.ends_with('\n') {
        conf.push('\n');
    }
    let mut data = data.clone();
    data.insert("kubeconfig.conf".into(), Value::String(conf));
    let mut meta = serde_json::Map::new();
    for k in [
        "name",
        "namespace",
        "labels",
        "annotations",
        "resourceVersion",
    ] {
        if let Some(x) = v.pointer(&format!("/metadata/{k}")) {
            meta.insert(k.into(), x.clone());
        }
    }
    Ok(pretty(&json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": data,
    })))
}

/// The name the CRI finds an image by: `ctr images import` stores an OCI archive's image
/// under its `io.containerd.image.name` as it is, while the CRI looks a pod's image up by its
/// normalized reference (`aks-flex-controller:1` → `docker.io/library/aks-flex-controller:1`).
pub fn normalized_reference(name: &str) -> String {
    let (first, _) = name.split_once('/').unwrap_or(("", name));
    if !name.contains('/') {
        format!("docker.io/library/{name}")
    } else if first.contains('.') || first.contains(':') || first == "localhost" {
        name.to_string()
    } else {
        format!("docker.io/{name}")
    }
}

/// An OCI layout's `index.json` with each image's `io.containerd.image.name` normalized; also
/// returns the first image's name as written (`aks-flex-controller:<version>`).
pub fn normalize_index(index: &[u8]) -> anyhow::Result<(Vec<u8>, String)> {
    let mut v: Value = serde_json::from_slice(index)?;
    let manifests = v
        .get_mut("manifests")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| anyhow::anyhow!("index.json has no manifests"))?;
    let mut first = None;
    for m in manifests.iter_mut() {
        let Some(ann) = m.get_mut("annotations").and_then(Value::as_object_mut) else {
            continue;
        };
        let name = ann
            .get(flex_image::oci::ANNOTATION_CONTAINERD_NAME)
            .or_else(|| ann.get(flex_image::oci::ANNOTATION_REF_NAME))
            .and_then(Value::as_str)
            .map(str::to_string);
        if let Some(name) = name {
            ann.insert(
                flex_image::oci::ANNOTATION_CONTAINERD_NAME.into(),
                Value::String(normalized_reference(&name)),
            );
            first.get_or_insert(name);
        }
    }
    let first = first.ok_or_else(|| anyhow::anyhow!("index.json names no image"))?;
    Ok((serde_json::to_vec(&v)?, first))
}

/// The tag of `name:tag` (`latest` without one).
pub fn tag_of(name: &str) -> &str {
    let last = name.rsplit('/').next().unwrap_or(name);
    last.split_once(':').map_or("latest", |(_, t)| t)
}

/// `to` relative to the directory `from` (both absolute, no `..`), as kustomize wants a base.
pub fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let f: Vec<Component<'_>> = from.components().collect();
    let t: Vec<Component<'_>> = to.components().collect();
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..f.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c.as_os_str());
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// The pod address range of the bridge network the harness gives a node of an existing cluster
/// that has no CNI of its own.
pub const BRIDGE_SUBNET: &str = "10.244.250.0/24";

/// The CNI network list the harness writes on such a node: a `bridge` (`cni0`, the name the
/// agent's reset removes) with `host-local` addresses from [`BRIDGE_SUBNET`], no masquerade (no
/// iptables in the machine), as the bundle's CNI plugins implement it.
pub fn bridge_conflist() -> String {
    pretty(&json!({
        "cniVersion": "1.0.0",
        "name": "aks-flex-harness",
        "plugins": [{
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": BRIDGE_SUBNET}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }],
    }))
}

/// The DaemonSet that gives the VM's node (`node`) a pod network on an existing cluster without
/// one: a host-network pod (which needs no CNI) of the probe image writes [`bridge_conflist`]
/// into the node's `/etc/cni/net.d` — the active machine's, since kubelet runs there, so a
/// repaved machine gets it again — unless a network config is there already, then idles.
pub fn bridge_cni_daemonset(node: &str) -> String {
    let script = format!(
        "trap 'exit 0' TERM INT; \
         found=; for f in /host/etc/cni/net.d/*.conf /host/etc/cni/net.d/*.conflist; do [ -e \"$f\" ] && found=1; done; \
         if [ -z \"$found\" ]; then \
         cat > /host/etc/cni/net.d/.10-aks-flex-harness.tmp <<'EOF'\n{}EOF\n\
         mv /host/etc/cni/net.d/.10-aks-flex-harness.tmp /host/etc/cni/net.d/10-aks-flex-harness.conflist; fi; \
         while true; do sleep 1; done",
        bridge_conflist()
    );
    pretty(&json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": "aks-flex-harness-cni",
            "namespace": NAMESPACE,
            "labels": {MANAGED_BY.0: MANAGED_BY.1},
        },
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "aks-flex-harness-cni"}},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "aks-flex-harness-cni"}},
                "spec": {
                    "hostNetwork": true,
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [{"operator": "Exists"}],
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "cni",
                        "image": PROBE_IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", script],
                        "volumeMounts": [{"name": "net-d", "mountPath": "/host/etc/cni/net.d"}],
                    }],
                    "volumes": [{
                        "name": "net-d",
                        "hostPath": {"path": "/etc/cni/net.d", "type": "DirectoryOrCreate"},
                    }],
                },
            },
        },
    }))
}

fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> BootstrapToken {
        BootstrapToken::from_parts("abcdef", "0123456789abcdef").unwrap()
    }

    #[test]
    fn kind_config_listens_everywhere_and_names_the_guests_host_address() {
        let c = kind_config(36443);
        assert!(c.contains("apiServerAddress: \"0.0.0.0\"\n  apiServerPort: 36443"));
        assert!(c.contains("- \"10.0.2.2\""));
        insta::assert_snapshot!(c);
    }

    #[test]
    fn machine_entry_is_what_the_controller_serves() {
        let e = machine_entry("flex-dev-node", "1.34.0", "harness-1", "abcdef").unwrap();
        assert!(!e.contains('\n'));
        let m = flex_api::arm::parse_arm_machine(e.as_bytes()).unwrap();
        assert_eq!(m.bootstrap_token_id(), Some("abcdef"));
        assert_eq!(m.etag(), "harness-1");
        assert_eq!(m.kubernetes_version(), "1.34.0");
        let cm = machines_config_map("flex-dev-node", &e);
        let v: Value = serde_json::from_str(&cm).unwrap();
        let data: std::collections::BTreeMap<String, String> =
            serde_json::from_value(v["data"].clone()).unwrap();
        let found = controller_lookup(&data, "flex-dev-node");
        assert_eq!(found.etag(), "harness-1");
        insta::assert_snapshot!(cm);
    }

    /// The controller's own lookup (`<node>.json`, then `<node>`), as `controller/src/store.rs`
    /// does it: the entry must parse the same way there.
    fn controller_lookup(
        data: &std::collections::BTreeMap<String, String>,
        node: &str,
    ) -> ArmMachine {
        let v = data
            .get(&format!("{node}.json"))
            .or_else(|| data.get(node))
            .unwrap();
        flex_api::arm::parse_arm_machine(v.trim().as_bytes()).unwrap()
    }

    #[test]
    fn token_secret_is_kubeadms_shape_in_the_flex_group_only() {
        let s = token_secret(&token());
        let v: Value = serde_json::from_str(s.expose()).unwrap();
        assert_eq!(v["metadata"]["name"], "bootstrap-token-abcdef");
        assert_eq!(v["type"], "bootstrap.kubernetes.io/token");
        let groups = v["stringData"]["auth-extra-groups"].as_str().unwrap();
        assert_eq!(groups, AKS_FLEX_BOOTSTRAP_GROUP);
        assert!(!groups.contains(KUBEADM_NODE_GROUP));
        assert!(format!("{s:?}").contains("REDACTED"));
        insta::assert_snapshot!(s.expose());
    }

    #[test]
    fn rbac_and_operation_and_probe() {
        insta::assert_snapshot!(
            "node_reboot",
            machine_operation("harness-nodereboot-1", "NodeReboot", "flex-dev-node", &[])
        );
        let up: Value = serde_json::from_str(&machine_operation(
            "harness-agentupgrade-1",
            "AgentUpgrade",
            "flex-dev-node",
            &[("image", "10.0.2.2:5000/aks-flex/agent@sha256:ab")],
        ))
        .unwrap();
        assert_eq!(
            up["spec"],
            json!({"machineRef": "flex-dev-node", "operationKind": "AgentUpgrade",
                   "parameters": {"image": "10.0.2.2:5000/aks-flex/agent@sha256:ab"}})
        );
        let pod = probe_pod("harness-probe-1", "flex-dev-node");
        let v: Value = serde_json::from_str(&pod).unwrap();
        assert_eq!(v["spec"]["terminationGracePeriodSeconds"], 1);
        assert!(
            v["spec"]["containers"][0]["command"][2]
                .as_str()
                .unwrap()
                .starts_with("trap 'exit 0' TERM")
        );
        insta::assert_snapshot!("probe_pod", pod);
    }

    #[test]
    fn controller_overlay() {
        insta::assert_snapshot!(controller_kustomization(
            "../../../deploy/controller",
            "0.1.0"
        ));
    }

    /// The overlay's JSON patch replaces the Deployment's fourth argument: it must be the CSR
    /// approver's flag (the patch's `test` op also refuses a changed Deployment at apply time).
    #[test]
    fn the_patched_argument_is_the_csr_approvers() {
        let d = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/controller/deployment.yaml"),
        )
        .unwrap();
        let args: Vec<&str> = d
            .lines()
            .skip_while(|l| l.trim() != "args:")
            .skip(1)
            .map_while(|l| l.trim().strip_prefix("- "))
            .collect();
        assert_eq!(
            args.get(3),
            Some(&"--enable-csr-approver=false"),
            "{args:?}"
        );
        assert!(controller_kustomization("b", "t").contains(
            "path: /spec/template/spec/containers/0/args/3\n        value: --enable-csr-approver=false"
        ));
    }

    #[test]
    fn kube_proxy_points_at_the_control_planes_address() {
        let cm = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kube-proxy", "namespace": "kube-system", "resourceVersion": "7", "uid": "u"},
            "data": {
                "config.conf": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n",
                "kubeconfig.conf": "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority: /var/lib/kube-proxy/ca.crt\n    server: https://aks-flex-control-plane:6443\n  name: default\n",
            },
        })
        .to_string();
        let out = kube_proxy_config_map(&cm, "https://10.89.0.2:6443").unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        let conf = v["data"]["kubeconfig.conf"].as_str().unwrap();
        assert!(
            conf.contains("\n    server: https://10.89.0.2:6443\n"),
            "{conf}"
        );
        assert!(!conf.contains("aks-flex-control-plane"));
        assert_eq!(v["metadata"]["resourceVersion"], "7");
        assert!(v["metadata"].get("uid").is_none());
        assert_eq!(
            v["data"]["config.conf"],
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
        );
        let none = json!({"data": {"kubeconfig.conf": "clusters: []\n"}}).to_string();
        assert!(kube_proxy_config_map(&none, "https://x").is_err());
    }

    #[test]
    fn image_names_are_normalized_as_the_cri_looks_them_up() {
        assert_eq!(
            normalized_reference("aks-flex-controller:0.1.0"),
            "docker.io/library/aks-flex-controller:0.1.0"
        );
        assert_eq!(normalized_reference("org/x:1"), "docker.io/org/x:1");
        assert_eq!(
            normalized_reference("registry.k8s.io/pause:3.10"),
            "registry.k8s.io/pause:3.10"
        );
        assert_eq!(normalized_reference("localhost/x:1"), "localhost/x:1");
        assert_eq!(
            normalized_reference("10.0.2.2:5000/x:1"),
            "10.0.2.2:5000/x:1"
        );
        let index = json!({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": "sha256:00", "size": 1,
            "annotations": {
                "io.containerd.image.name": "aks-flex-controller:0.1.0",
                "org.opencontainers.image.ref.name": "aks-flex-controller:0.1.0",
            },
        }]});
        let (out, name) = normalize_index(index.to_string().as_bytes()).unwrap();
        assert_eq!(name, "aks-flex-controller:0.1.0");
        assert_eq!(tag_of(&name), "0.1.0");
        assert_eq!(tag_of("10.0.2.2:5000/x"), "latest");
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v["manifests"][0]["annotations"]["io.containerd.image.name"],
            "docker.io/library/aks-flex-controller:0.1.0"
        );
        assert_eq!(
            v["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
            "aks-flex-controller:0.1.0"
        );
        assert!(normalize_index(br#"{"manifests": []}"#).is_err());
    }

    #[test]
    fn relative_paths_for_kustomize() {
        assert_eq!(
            relative_path(
                Path::new("/repo/target/harness/cluster/controller"),
                Path::new("/repo/deploy/controller")
            ),
            PathBuf::from("../../../../deploy/controller")
        );
        assert_eq!(
            relative_path(Path::new("/a/b"), Path::new("/a/b/c")),
            PathBuf::from("c")
        );
        assert_eq!(
            relative_path(Path::new("/a/b"), Path::new("/a/b")),
            PathBuf::from(".")
        );
    }
}
