//! `deploy/controller/` agrees with the binary and the agent: every kustomization resource
//! parses, the Deployment's args are valid flags listening on the container port, the Service
//! is the one the agent's default endpoint names, the ConfigMap is the default store, and the
//! RBAC grants what the controller and the nodes use.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::path::PathBuf;

use aks_flex_controller::Args;
use clap::Parser;
use flex_api::arm::DEFAULT_ENDPOINT_PATH;
use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/controller")
}

fn objects() -> Vec<Value> {
    let k: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(dir().join("kustomization.yaml")).unwrap())
            .unwrap();
    let mut out = Vec::new();
    for r in k["resources"].as_array().unwrap() {
        let text = std::fs::read_to_string(dir().join(r.as_str().unwrap())).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        assert!(!docs.is_empty(), "{r}");
        out.extend(docs);
    }
    out
}

fn find<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objs.iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn every_object_is_named_and_placed() {
    let objs = objects();
    assert_eq!(objs.len(), 23);
    for o in &objs {
        let kind = o["kind"].as_str().unwrap();
        assert!(o["apiVersion"].is_string(), "{o}");
        assert_eq!(
            o["metadata"]["labels"]["app.kubernetes.io/name"], "aks-flex-controller",
            "{kind}"
        );
        if kind.starts_with("Cluster") || kind.starts_with("ValidatingAdmissionPolicy") {
            assert!(
                o["metadata"]["namespace"].is_null(),
                "{kind} is cluster-scoped"
            );
        } else {
            assert_eq!(o["metadata"]["namespace"], "kube-system", "{kind}");
        }
    }
}

#[test]
fn the_deployment_runs_valid_flags_on_its_port() {
    let objs = objects();
    let d = find(&objs, "Deployment", "aks-flex-controller");
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "aks-flex-controller");
    find(&objs, "ServiceAccount", "aks-flex-controller");
    assert_eq!(
        d["spec"]["selector"]["matchLabels"],
        d["spec"]["template"]["metadata"]["labels"]
    );
    // One approver at a time, also during an update.
    assert_eq!(d["spec"]["replicas"], 1);
    assert_eq!(d["spec"]["strategy"]["type"], "Recreate");
    let c = &pod["containers"][0];
    let mut argv = vec!["aks-flex-controller".to_string()];
    argv.extend(
        c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string()),
    );
    let args = Args::try_parse_from(&argv).unwrap();
    let port = c["ports"][0]["containerPort"].as_u64().unwrap();
    assert_eq!(args.listen_address, format!(":{port}"));
    assert_eq!(c["ports"][0]["name"], "http");
    assert_eq!(c["ports"][1]["name"], "metrics");
    let metrics_port = c["ports"][1]["containerPort"].as_u64().unwrap();
    assert_eq!(args.metrics_bind_address, format!(":{metrics_port}"));
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    // The ConfigMap the args name exists and starts empty.
    let cm = find(&objs, "ConfigMap", &args.machine_configmap_name);
    assert_eq!(
        cm["metadata"]["namespace"],
        args.machine_configmap_namespace.as_str()
    );
    assert_eq!(cm["data"], serde_json::json!({}));
    assert!(!args.enable_csr_approver);
    // Not pulled on every start (the harness loads it into the cluster), and placed on a
    // control-plane node where there is one, tolerating its taint.
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    let preferred =
        &pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(
        preferred["preference"]["matchExpressions"][0]["key"],
        "node-role.kubernetes.io/control-plane"
    );
    assert!(
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"].is_null(),
        "a cluster without control-plane nodes (AKS) still schedules it"
    );
    assert_eq!(
        pod["tolerations"][0]["key"],
        "node-role.kubernetes.io/control-plane"
    );
}

#[test]
fn the_service_is_the_agents_default_endpoint() {
    let objs = objects();
    let s = find(&objs, "Service", "aks-flex-controller");
    let p = &s["spec"]["ports"][0];
    assert_eq!(p["targetPort"], "http");
    let proxy = format!(
        "/api/v1/namespaces/{}/services/{}:{}:{}/proxy",
        s["metadata"]["namespace"].as_str().unwrap(),
        p["name"].as_str().unwrap(),
        s["metadata"]["name"].as_str().unwrap(),
        p["port"]
    );
    assert_eq!(proxy, DEFAULT_ENDPOINT_PATH);
    let m = &s["spec"]["ports"][1];
    assert_eq!(
        (&m["name"], &m["targetPort"]),
        (&"metrics".into(), &"metrics".into())
    );
}

/// The optional ServiceMonitor is a kustomize component outside the base (which must not need
/// the Prometheus operator's CRDs), and it scrapes the Service's metrics port.
#[test]
fn the_service_monitor_is_an_optional_component_scraping_the_metrics_port() {
    let objs = objects();
    assert!(
        objs.iter().all(|o| o["kind"] != "ServiceMonitor"),
        "the base has no ServiceMonitor"
    );
    let comp_dir = dir().join("components/servicemonitor");
    let k: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(comp_dir.join("kustomization.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(k["kind"], "Component");
    assert_eq!(k["apiVersion"], "kustomize.config.k8s.io/v1alpha1");
    let mut monitors = Vec::new();
    for r in k["resources"].as_array().unwrap() {
        let text = std::fs::read_to_string(comp_dir.join(r.as_str().unwrap())).unwrap();
        monitors.extend(serde_saphyr::from_multiple::<Value>(&text).unwrap());
    }
    assert_eq!(monitors.len(), 1);
    let sm = &monitors[0];
    assert_eq!(sm["kind"], "ServiceMonitor");
    let svc = find(&objs, "Service", "aks-flex-controller");
    assert_eq!(
        sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        svc["metadata"]["labels"]["app.kubernetes.io/name"]
    );
    assert_eq!(
        sm["spec"]["namespaceSelector"]["matchNames"][0],
        svc["metadata"]["namespace"]
    );
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
}

#[test]
fn rbac_grants_what_is_used() {
    let objs = objects();
    let defaults = Args::try_parse_from(["x"]).unwrap();
    let csr = find(&objs, "ClusterRole", "aks-flex-controller-csr-approver");
    let rules = csr["rules"].as_array().unwrap();
    // It asks whether kube-controller-manager would approve the flex tokens' kubelet
    // certificates (a SubjectAccessReview), and nothing more of authorization.k8s.io.
    let reviews: Vec<&Value> = rules
        .iter()
        .filter(|r| r["apiGroups"][0] == "authorization.k8s.io")
        .collect();
    assert_eq!(reviews.len(), 1);
    assert_eq!(
        reviews[0]["resources"],
        serde_json::json!(["subjectaccessreviews"])
    );
    assert_eq!(reviews[0]["verbs"], serde_json::json!(["create"]));
    // The approver approves the daemon's certificates and kubelet's client certificates.
    let signers = rules
        .iter()
        .find(|r| r["resources"][0] == "signers")
        .unwrap();
    assert_eq!(signers["verbs"], serde_json::json!(["approve"]));
    assert_eq!(
        signers["resourceNames"],
        serde_json::json!([
            aks_flex_controller::csr::SIGNER,
            aks_flex_controller::csr::KUBELET_SIGNER
        ])
    );
    assert!(rules.iter().any(
        |r| r["resources"][0] == "certificatesigningrequests/approval"
            && r["verbs"] == serde_json::json!(["update"])
    ));
    // The policy check reads exactly the policies and bindings it checks, and the manifests
    // define each of them.
    let policy = rules
        .iter()
        .find(|r| r["apiGroups"][0] == "admissionregistration.k8s.io")
        .unwrap();
    assert_eq!(policy["verbs"], serde_json::json!(["get"]));
    let names: Vec<&str> = policy["resourceNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(names, aks_flex_controller::policy::POLICIES);
    for name in aks_flex_controller::policy::POLICIES {
        find(&objs, "ValidatingAdmissionPolicy", name);
        let b = find(&objs, "ValidatingAdmissionPolicyBinding", name);
        assert_eq!(b["spec"]["policyName"], *name);
    }
    let cm = find(
        &objs,
        "Role",
        "aks-flex-controller-machine-configmap-reader",
    );
    assert_eq!(
        cm["rules"][0]["resourceNames"][0],
        defaults.machine_configmap_name.as_str()
    );
    assert_eq!(cm["rules"][0]["verbs"], serde_json::json!(["get"]));
    // The record of tokens used: the one ConfigMap the controller writes, shipped empty.
    assert_eq!(
        cm["rules"][1]["resourceNames"],
        serde_json::json!([aks_flex_controller::csr::ISSUED_CONFIGMAP])
    );
    assert_eq!(cm["rules"][1]["verbs"], serde_json::json!(["get", "patch"]));
    let issued = find(
        &objs,
        "ConfigMap",
        aks_flex_controller::csr::ISSUED_CONFIGMAP,
    );
    assert_eq!(issued["metadata"]["namespace"], "kube-system");
    assert_eq!(issued["data"], serde_json::json!({}));
    let proxy = find(&objs, "Role", "aks-flex-controller-service-proxy-reader");
    assert_eq!(
        proxy["rules"][0]["resourceNames"][0],
        "http:aks-flex-controller:80"
    );
    assert_eq!(
        proxy["rules"][0]["verbs"],
        serde_json::json!(["get", "update", "patch"])
    );
    let binding = find(
        &objs,
        "RoleBinding",
        "aks-flex-controller-service-proxy-bootstrap",
    );
    let groups: Vec<&str> = binding["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        groups,
        [
            defaults.bootstrap_group.as_str(),
            defaults.daemon_group.as_str()
        ]
    );
    // The daemons (their group is in the certificates the CSR approver signs) reconcile
    // MachineOperations: watch them, claim and finish them, delete them after their TTL.
    let daemon = find(&objs, "ClusterRole", "aks-flex-node-daemon");
    let rules = daemon["rules"].as_array().unwrap();
    let grants = |resource: &str, verb: &str| {
        rules.iter().any(|r| {
            let group = if resource.starts_with("certificatesigningrequests") {
                "certificates.k8s.io"
            } else {
                flex_api::machina::GROUP
            };
            r["apiGroups"][0] == group
                && r["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|x| x == resource)
                && r["verbs"].as_array().unwrap().iter().any(|x| x == verb)
        })
    };
    for verb in ["get", "list", "watch", "delete"] {
        assert!(
            grants("machineoperations", verb),
            "machineoperations {verb}"
        );
    }
    // No daemon creates an operation or edits its spec (one node could otherwise aim any
    // operation, an AgentUpgrade with its own binary among them, at every node).
    for verb in ["create", "update", "patch", "deletecollection", "*"] {
        assert!(
            !grants("machineoperations", verb),
            "machineoperations {verb} must not be granted"
        );
    }
    assert!(!grants("*", "get"));
    assert!(grants("machineoperations/status", "patch"));
    assert!(grants("machines", "get"));
    // Machines and the daemon's own CertificateSigningRequest are read by name: no list or
    // watch of every node's.
    for (resource, verb) in [
        ("machines", "list"),
        ("machines", "watch"),
        ("certificatesigningrequests", "list"),
        ("certificatesigningrequests", "watch"),
    ] {
        assert!(
            !grants(resource, verb),
            "{resource} {verb} must not be granted"
        );
    }
    // Renewal with the daemon's own certificate (not the bootstrap token): create, then get.
    for verb in ["create", "get"] {
        assert!(grants("certificatesigningrequests", verb), "{verb}");
    }
    let b = find(&objs, "ClusterRoleBinding", "aks-flex-node-daemon");
    assert_eq!(b["subjects"][0]["name"], defaults.daemon_group.as_str());
    assert_eq!(
        defaults.daemon_group.as_str(),
        flex_api::machina::DAEMON_GROUP
    );
    // kubelet's TLS bootstrap with the Flex bootstrap group: it may create its CSR, and the
    // controller's approver (not kube-controller-manager's) approves it, under the token's
    // binding to one node. Nothing binds the flex group to `nodeclient` or `selfnodeclient`:
    // kube-controller-manager would approve any node's certificate for any flex token.
    let b = find(&objs, "ClusterRoleBinding", "aks-flex-node-bootstrapper");
    assert_eq!(b["roleRef"]["name"], "system:node-bootstrapper");
    assert_eq!(b["subjects"][0]["kind"], "Group");
    assert_eq!(b["subjects"][0]["name"], defaults.bootstrap_group.as_str());
    for o in &objs {
        let role = o["roleRef"]["name"].as_str().unwrap_or_default();
        assert!(
            !role.starts_with("system:certificates.k8s.io:certificatesigningrequests:"),
            "{} binds {role}: kube-controller-manager's approver would approve without the token binding",
            o["metadata"]["name"]
        );
    }
    // Every binding names an existing role (or one Kubernetes ships: `system:`).
    for b in objs
        .iter()
        .filter(|o| o["kind"].as_str().unwrap().ends_with("RoleBinding"))
    {
        let role_kind = b["roleRef"]["kind"].as_str().unwrap();
        let role = b["roleRef"]["name"].as_str().unwrap();
        if !role.starts_with("system:") {
            find(&objs, role_kind, role);
        }
    }
}

/// The admission policy that confines what a node's daemon does to MachineOperations (the
/// API server evaluates it; `cargo xtask check --only node-join` shows it refusing another
/// node's identity against a real one): it applies to the daemon group only, denies, covers
/// creates, updates (the object and its status) and deletes, and names the node from the user.
#[test]
fn the_admission_policy_confines_daemons_to_their_operations() {
    let objs = objects();
    let name = "aks-flex-node-daemon-machineoperations";
    let p = find(&objs, "ValidatingAdmissionPolicy", name);
    let b = find(&objs, "ValidatingAdmissionPolicyBinding", name);
    assert_eq!(b["spec"]["policyName"], name);
    assert_eq!(b["spec"]["validationActions"], serde_json::json!(["Deny"]));
    let spec = &p["spec"];
    assert_eq!(spec["failurePolicy"], "Fail");
    let rule = &spec["matchConstraints"]["resourceRules"][0];
    assert_eq!(rule["apiGroups"][0], flex_api::machina::GROUP);
    assert_eq!(
        rule["operations"],
        serde_json::json!(["CREATE", "UPDATE", "DELETE"])
    );
    assert_eq!(
        rule["resources"],
        serde_json::json!(["machineoperations", "machineoperations/status"])
    );
    assert_eq!(
        spec["matchConditions"][0]["expression"],
        format!(
            "'{}' in request.userInfo.groups",
            flex_api::machina::DAEMON_GROUP
        )
    );
    let node = spec["variables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "node")
        .unwrap();
    let prefix = aks_flex_controller::csr::NODE_USER_PREFIX;
    assert!(
        node["expression"]
            .as_str()
            .unwrap()
            .contains(&format!("substring({})", prefix.len())),
        "the node is the user name after {prefix:?}"
    );
    let rules: Vec<&str> = spec["validations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["expression"].as_str().unwrap())
        .collect();
    assert_eq!(rules.len(), 5);
    assert!(
        rules
            .iter()
            .any(|r| r.contains("variables.ref == variables.node"))
    );
    assert!(
        rules
            .iter()
            .any(|r| r.contains("claimedBy") || r.contains("newClaimer"))
    );
}

/// `disruption.yaml` agrees with `flex_api::budget`: the ConfigMap the daemons read (its data
/// parses: K = 1, a 5-minute lease), the Role that lets them read and patch only it, and the
/// policy that matches only it. The policy's expressions are evaluated in
/// `admission_policy.rs`.
#[test]
fn the_disruption_budget_is_the_one_the_daemons_read() {
    use flex_api::budget;
    let objs = objects();
    let cm = find(&objs, "ConfigMap", budget::CONFIGMAP);
    assert_eq!(cm["metadata"]["namespace"], budget::NAMESPACE);
    let data: budget::Data = serde_json::from_value(cm["data"].clone()).unwrap();
    let b = budget::parse(&data).unwrap();
    assert_eq!((b.max_unavailable, b.lease.as_secs()), (1, 300));
    let role = find(&objs, "Role", "aks-flex-node-disruption-budget");
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["configmaps"],
            "resourceNames": [budget::CONFIGMAP], "verbs": ["get", "patch"]}])
    );
    let binding = find(&objs, "RoleBinding", "aks-flex-node-disruption-budget");
    assert_eq!(
        binding["subjects"][0]["name"],
        flex_api::machina::DAEMON_GROUP
    );
    let p = find(
        &objs,
        "ValidatingAdmissionPolicy",
        "aks-flex-node-daemon-disruption-budget",
    );
    let rule = &p["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(
        rule["resourceNames"],
        serde_json::json!([budget::CONFIGMAP])
    );
    assert_eq!(rule["resources"], serde_json::json!(["configmaps"]));
    assert_eq!(p["spec"]["failurePolicy"], "Fail");
    let b = find(
        &objs,
        "ValidatingAdmissionPolicyBinding",
        "aks-flex-node-daemon-disruption-budget",
    );
    assert_eq!(b["spec"]["validationActions"], serde_json::json!(["Deny"]));
}
