//! What the cluster steps and checks read, parsed (pure): `kubectl get -o json` answers for a
//! Node (readiness, uid, address, kubelet version), a MachineOperation (phase, reason,
//! message) and a Pod (phase, node, container state); `kubectl version -o json`;
//! `kubectl config view --raw -o json` (the cluster's CA); `kind get clusters`; the default
//! route in the control plane's container; and the daemon's state on the host.
//!
//! An empty answer (`--ignore-not-found`) reads as "not there" (`None`).

use serde_json::Value;

fn parse_opt(json: &str, what: &str) -> anyhow::Result<Option<Value>> {
    if json.trim().is_empty() {
        return Ok(None);
    }
    serde_json::from_str(json)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("{what}: not JSON ({e})"))
}

fn s(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// A Node as the checks see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    /// `metadata.uid` (a re-registered Node has a new one).
    pub uid: String,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// The `Ready` condition's status, reason and message, for errors (`Unknown: NodeStatusUnknown`).
    pub ready_detail: String,
    /// `status.addresses` of type `InternalIP`.
    pub internal_ip: Option<String>,
    /// `status.nodeInfo.kubeletVersion`.
    pub kubelet_version: String,
    /// `status.nodeInfo.bootID`: the boot id kubelet read, which is its machine's
    /// (systemd-nspawn gives each boot of a machine its own), not the VM's.
    pub boot_id: String,
    /// What the agent's daemon publishes on the Node ([`flex_api::node_state`]).
    pub agent: AgentOnNode,
}

/// The agent's condition and annotations on its Node (empty strings where absent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentOnNode {
    /// The condition's status (`True`: Done, `Unknown`: Working, `False`: Degraded).
    pub status: String,
    /// The condition's reason.
    pub reason: String,
    /// The condition's message.
    pub message: String,
    /// The state annotation (`Done`, `Working`, `Degraded`).
    pub state: String,
    /// The agent-version annotation.
    pub agent_version: String,
    /// The active-machine annotation.
    pub active_machine: String,
    /// The goal-version annotation.
    pub goal_version: String,
}

impl std::fmt::Display for AgentOnNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.status.is_empty() && self.state.is_empty() {
            return f.write_str("no agent condition or annotations");
        }
        write!(
            f,
            "{} ({} {}: {}), agent {}, machine {}, goal {}",
            self.state,
            self.status,
            self.reason,
            self.message,
            self.agent_version,
            self.active_machine,
            self.goal_version
        )
    }
}

impl std::fmt::Display for NodeView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (uid {}, Ready {})",
            if self.ready { "Ready" } else { "not Ready" },
            self.uid,
            self.ready_detail
        )
    }
}

/// Parses `kubectl get node <n> -o json --ignore-not-found`.
pub fn node(json: &str) -> anyhow::Result<Option<NodeView>> {
    let Some(v) = parse_opt(json, "Node")? else {
        return Ok(None);
    };
    let conditions = v
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ready = conditions
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"));
    let (is_ready, detail) = match ready {
        Some(c) => {
            let status = s(c, "/status");
            let mut d = status.clone();
            for k in ["/reason", "/message"] {
                let x = s(c, k);
                if !x.is_empty() {
                    d.push_str(": ");
                    d.push_str(&x);
                }
            }
            (status == "True", d)
        }
        None => (false, "no Ready condition yet".to_string()),
    };
    let internal_ip = v
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter()
                .find(|x| x.get("type").and_then(Value::as_str) == Some("InternalIP"))
        })
        .map(|x| s(x, "/address"))
        .filter(|a| !a.is_empty());
    use flex_api::node_state as ns;
    let annotation = |k: &str| {
        v.pointer("/metadata/annotations")
            .and_then(|a| a.get(k))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let cond = conditions
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(ns::CONDITION_TYPE));
    let agent = AgentOnNode {
        status: cond.map(|c| s(c, "/status")).unwrap_or_default(),
        reason: cond.map(|c| s(c, "/reason")).unwrap_or_default(),
        message: cond.map(|c| s(c, "/message")).unwrap_or_default(),
        state: annotation(ns::ANNOTATION_STATE),
        agent_version: annotation(ns::ANNOTATION_AGENT_VERSION),
        active_machine: annotation(ns::ANNOTATION_ACTIVE_MACHINE),
        goal_version: annotation(ns::ANNOTATION_GOAL_VERSION),
    };
    Ok(Some(NodeView {
        agent,
        uid: s(&v, "/metadata/uid"),
        ready: is_ready,
        ready_detail: detail,
        internal_ip,
        kubelet_version: s(&v, "/status/nodeInfo/kubeletVersion"),
        boot_id: s(&v, "/status/nodeInfo/bootID"),
    }))
}

/// A MachineOperation's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationView {
    /// `status.phase` (`Pending` when empty).
    pub phase: String,
    /// `status.reason`, else the `Completed` condition's reason.
    pub reason: String,
    /// `status.message`, else the `Completed` condition's message.
    pub message: String,
}

impl OperationView {
    /// `Complete` or `Failed`.
    pub fn finished(&self) -> bool {
        self.phase == "Complete" || self.phase == "Failed"
    }
}

impl std::fmt::Display for OperationView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "phase {}", self.phase)?;
        if !self.reason.is_empty() {
            write!(f, ", reason {}", self.reason)?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

/// Parses `kubectl get machineoperation <n> -o json --ignore-not-found`.
pub fn operation(json: &str) -> anyhow::Result<Option<OperationView>> {
    let Some(v) = parse_opt(json, "MachineOperation")? else {
        return Ok(None);
    };
    let completed = v
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter().find(|c| {
                c.get("type").and_then(Value::as_str)
                    == Some(flex_api::machina::CONDITION_COMPLETED)
            })
        })
        .cloned()
        .unwrap_or(Value::Null);
    let or = |a: String, b: String| if a.is_empty() { b } else { a };
    let phase = s(&v, "/status/phase");
    Ok(Some(OperationView {
        phase: if phase.is_empty() {
            "Pending".into()
        } else {
            phase
        },
        reason: or(s(&v, "/status/reason"), s(&completed, "/reason")),
        message: or(s(&v, "/status/message"), s(&completed, "/message")),
    }))
}

/// A Pod's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    /// `status.phase`.
    pub phase: String,
    /// `spec.nodeName`.
    pub node: String,
    /// The first container is running.
    pub running: bool,
    /// Why the first container waits or ended (`ErrImagePull: …`), if it does.
    pub container_detail: String,
}

impl std::fmt::Display for PodView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "phase {} on {}", self.phase, self.node)?;
        if !self.container_detail.is_empty() {
            write!(f, " ({})", self.container_detail)?;
        }
        Ok(())
    }
}

/// Parses `kubectl get pod <n> -o json --ignore-not-found`.
pub fn pod(json: &str) -> anyhow::Result<Option<PodView>> {
    let Some(v) = parse_opt(json, "Pod")? else {
        return Ok(None);
    };
    let st = v
        .pointer("/status/containerStatuses/0/state")
        .cloned()
        .unwrap_or(Value::Null);
    let running = st.get("running").is_some();
    let detail = ["waiting", "terminated"]
        .iter()
        .find_map(|k| st.get(*k).map(|w| (k, w)))
        .map(|(k, w)| {
            let reason = s(w, "/reason");
            let msg = s(w, "/message");
            let mut d = k.to_string();
            if !reason.is_empty() {
                d = format!("{d} {reason}");
            }
            if !msg.is_empty() {
                d = format!("{d}: {msg}");
            }
            d
        })
        .unwrap_or_default();
    Ok(Some(PodView {
        phase: s(&v, "/status/phase"),
        node: s(&v, "/spec/nodeName"),
        running,
        container_detail: detail,
    }))
}

/// The server's version (`1.34.0`) from `kubectl version -o json`: `serverVersion.gitVersion`
/// without its `v` and any pre-release or build suffix.
pub fn server_version(json: &str) -> anyhow::Result<String> {
    let v: Value = serde_json::from_str(json)
        .map_err(|e| anyhow::anyhow!("kubectl version -o json: not JSON ({e})"))?;
    let git = s(&v, "/serverVersion/gitVersion");
    let plain = git.trim_start_matches('v');
    let plain = plain.split(['-', '+']).next().unwrap_or_default();
    let parts: Vec<&str> = plain.split('.').collect();
    if parts.len() != 3 || parts.iter().any(|p| p.parse::<u32>().is_err()) {
        anyhow::bail!("kubectl version -o json: serverVersion.gitVersion {git:?} is not vX.Y.Z");
    }
    Ok(plain.to_string())
}

/// The CA (`certificate-authority-data`, base64 PEM) of the current context's cluster from
/// `kubectl config view --raw --minify -o json`.
pub fn kubeconfig_ca(json: &str) -> anyhow::Result<String> {
    let v: Value = serde_json::from_str(json)
        .map_err(|e| anyhow::anyhow!("kubectl config view: not JSON ({e})"))?;
    let ca = s(&v, "/clusters/0/cluster/certificate-authority-data");
    if ca.is_empty() {
        anyhow::bail!("the kubeconfig has no certificate-authority-data for its cluster");
    }
    Ok(ca)
}

/// The server URL of the current context's cluster from `kubectl config view --raw --minify
/// -o json`.
pub fn kubeconfig_server(json: &str) -> anyhow::Result<String> {
    let v: Value = serde_json::from_str(json)
        .map_err(|e| anyhow::anyhow!("kubectl config view: not JSON ({e})"))?;
    let server = s(&v, "/clusters/0/cluster/server");
    if server.is_empty() {
        anyhow::bail!("the kubeconfig's current context names no cluster with a server");
    }
    Ok(server)
}

/// The source address of `ip -4 route get <addr>` (`10.99.0.2 dev veth0 src 10.99.0.1 uid 0`).
pub fn route_source(text: &str) -> Option<String> {
    let mut words = text.split_whitespace();
    while let Some(w) = words.next() {
        if w == "src" {
            return words
                .next()
                .filter(|a| a.parse::<std::net::Ipv4Addr>().is_ok())
                .map(str::to_string);
        }
    }
    None
}

/// The clusters `kind get clusters` lists (it says "No kind clusters found." on stderr).
pub fn kind_clusters(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.contains(' '))
        .map(str::to_string)
        .collect()
}

/// The gateway of `ip -4 route show default` (`default via 10.89.0.1 dev eth0 …`): the host as
/// the control plane's container reaches it.
pub fn default_gateway(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next() == Some("default") && w.next() == Some("via"))
            .then(|| w.next().map(str::to_string))
            .flatten()
    })
}

/// The daemon's state file (`/etc/aks-flex-node/daemon-state.json`), as the checks read it.
pub use crate::guest_json::DaemonState as DaemonStateView;

/// Parses the daemon's state file; an empty text is "no state".
pub fn daemon_state(text: &str) -> anyhow::Result<Option<DaemonStateView>> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    crate::guest_json::parse_record("daemon-state.json", text).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The agent's condition and annotations as the daemon writes them (the names from
    /// flex_api, the values as a real daemon published them on a by-hand cluster).
    #[test]
    fn the_agent_state_on_the_node() {
        let n = json!({
            "metadata": {"name": "flex-dev-node", "uid": "u1", "annotations": {
                "aks-flex-node.azure.com/state": "Done",
                "aks-flex-node.azure.com/agent-version": "0.3.0",
                "aks-flex-node.azure.com/active-machine": "kube2",
                "aks-flex-node.azure.com/goal-version": "etag-2",
                "node.alpha.kubernetes.io/ttl": "0"
            }},
            "status": {"conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "AKSFlexNodeAgent", "status": "True", "reason": "Reconciled", "message": "Done: machine goal settings version etag-2 applied"}
            ]}
        });
        let a = node(&n.to_string()).unwrap().unwrap().agent;
        assert_eq!(
            (a.status.as_str(), a.reason.as_str(), a.state.as_str()),
            ("True", "Reconciled", "Done")
        );
        assert_eq!(
            (
                a.agent_version.as_str(),
                a.active_machine.as_str(),
                a.goal_version.as_str()
            ),
            ("0.3.0", "kube2", "etag-2")
        );
        assert!(
            a.to_string()
                .starts_with("Done (True Reconciled: Done: machine goal"),
            "{a}"
        );
    }

    #[test]
    fn node_readiness() {
        let ready = json!({
            "metadata": {"name": "flex-dev-node", "uid": "u1"},
            "status": {
                "conditions": [
                    {"type": "MemoryPressure", "status": "False"},
                    {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"},
                ],
                "addresses": [{"type": "Hostname", "address": "flex-dev-node"}, {"type": "InternalIP", "address": "10.0.2.15"}],
                "nodeInfo": {"kubeletVersion": "v1.34.0", "bootID": "b-1"},
            },
        });
        let n = node(&ready.to_string()).unwrap().unwrap();
        assert_eq!(n.agent, AgentOnNode::default(), "no agent condition yet");
        assert!(n.ready);
        assert_eq!(n.uid, "u1");
        assert_eq!(n.internal_ip.as_deref(), Some("10.0.2.15"));
        assert_eq!(n.kubelet_version, "v1.34.0");
        assert_eq!(n.boot_id, "b-1");
        assert_eq!(
            n.to_string(),
            "Ready (uid u1, Ready True: KubeletReady: kubelet is posting ready status)"
        );

        let unknown = json!({"metadata": {"uid": "u2"}, "status": {"conditions": [
            {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown", "message": "Kubelet stopped posting node status."}]}});
        let n = node(&unknown.to_string()).unwrap().unwrap();
        assert!(!n.ready);
        assert_eq!(
            n.ready_detail,
            "Unknown: NodeStatusUnknown: Kubelet stopped posting node status."
        );
        assert!(n.internal_ip.is_none());

        let new = json!({"metadata": {"uid": "u3"}});
        let n = node(&new.to_string()).unwrap().unwrap();
        assert!(!n.ready);
        assert_eq!(n.ready_detail, "no Ready condition yet");

        assert_eq!(node("").unwrap(), None);
        assert_eq!(node("\n").unwrap(), None);
        assert!(node("Error from server").is_err());
    }

    #[test]
    fn operation_phase() {
        let op = |status: Value| {
            json!({"spec": {"operationKind": "NodeReboot"}, "status": status}).to_string()
        };
        let p = operation(&op(json!({}))).unwrap().unwrap();
        assert_eq!(p.phase, "Pending");
        assert!(!p.finished());
        let p = operation(&op(json!({"phase": "InProgress", "reason": "Rebooting"})))
            .unwrap()
            .unwrap();
        assert_eq!(p.to_string(), "phase InProgress, reason Rebooting");
        let p = operation(&op(json!({"phase": "Complete", "conditions": [
            {"type": "Completed", "status": "True", "reason": "Succeeded", "message": "machine kube1 restarted"}]})))
        .unwrap()
        .unwrap();
        assert!(p.finished());
        assert_eq!(
            p.to_string(),
            "phase Complete, reason Succeeded: machine kube1 restarted"
        );
        let p = operation(&op(
            json!({"phase": "Failed", "reason": "HandlerFailed", "message": "boom"}),
        ))
        .unwrap()
        .unwrap();
        assert!(p.finished());
        assert_eq!(p.message, "boom");
        assert_eq!(operation("").unwrap(), None);
    }

    #[test]
    fn pod_state() {
        let running = json!({"spec": {"nodeName": "flex-dev-node"}, "status": {"phase": "Running",
            "containerStatuses": [{"name": "probe", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}});
        let p = pod(&running.to_string()).unwrap().unwrap();
        assert!(p.running && p.phase == "Running" && p.node == "flex-dev-node");
        let waiting = json!({"spec": {"nodeName": "flex-dev-node"}, "status": {"phase": "Pending",
            "containerStatuses": [{"name": "probe", "state": {"waiting": {"reason": "ErrImagePull", "message": "no network"}}}]}});
        let p = pod(&waiting.to_string()).unwrap().unwrap();
        assert!(!p.running);
        assert_eq!(
            p.to_string(),
            "phase Pending on flex-dev-node (waiting ErrImagePull: no network)"
        );
        let fresh = json!({"spec": {"nodeName": "n"}, "status": {"phase": "Pending"}});
        assert_eq!(
            pod(&fresh.to_string()).unwrap().unwrap().container_detail,
            ""
        );
        assert_eq!(pod("").unwrap(), None);
    }

    #[test]
    fn versions_and_kubeconfig() {
        let v = json!({"clientVersion": {"gitVersion": "v1.35.0"}, "serverVersion": {"gitVersion": "v1.34.0"}});
        assert_eq!(server_version(&v.to_string()).unwrap(), "1.34.0");
        let v = json!({"serverVersion": {"gitVersion": "v1.33.4-rc.1+abc"}});
        assert_eq!(server_version(&v.to_string()).unwrap(), "1.33.4");
        assert!(server_version(&json!({"clientVersion": {}}).to_string()).is_err());
        let kc = json!({"clusters": [{"name": "kind-aks-flex", "cluster": {"server": "https://127.0.0.1:1", "certificate-authority-data": "TFMwdA=="}}]});
        assert_eq!(kubeconfig_ca(&kc.to_string()).unwrap(), "TFMwdA==");
        assert!(kubeconfig_ca(&json!({"clusters": []}).to_string()).is_err());
    }

    #[test]
    fn kind_and_routes() {
        assert_eq!(kind_clusters("aks-flex\nkind\n"), vec!["aks-flex", "kind"]);
        assert!(kind_clusters("No kind clusters found.\n").is_empty());
        assert_eq!(
            default_gateway("default via 10.89.0.1 dev eth0 proto static\n").as_deref(),
            Some("10.89.0.1")
        );
        assert_eq!(default_gateway("10.89.0.0/24 dev eth0\n"), None);
    }

    #[test]
    fn daemon_state_fields() {
        let d = daemon_state(
            r#"{"activeMachine": "kube2", "appliedSettingsVersion": "harness-2", "x": 1}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(d.active_machine, "kube2");
        assert_eq!(d.applied_settings_version, "harness-2");
        assert_eq!(daemon_state("").unwrap(), None);
    }
}
