//! The ARM JSON shape of a machine (`Microsoft.ContainerService/managedClusters/agentPools/machines`,
//! as `armcontainerservice` v8.3.0-beta.2 has it), used by every client and by the in-cluster
//! controller: [`ArmMachine`] and its conversions to and from the agent's [`Machine`].
//!
//! What the agent reads (`machineFromARM`): `id`, `name`,
//! `properties.kubernetes.orchestratorVersion` (falling back to `currentOrchestratorVersion`),
//! `maxPods`, `nodeLabels`, `nodeTaints`, `kubeletConfig.imageGcHighThreshold` /
//! `imageGcLowThreshold` (lowercase `c`), `properties.eTag` (the settings version; the Kubernetes
//! version when empty) and `properties.provisioningState`. What it sends on PUT
//! ([`put_body`]): `orchestratorVersion`, `maxPods`, `nodeLabels`, `nodeTaints` — never the
//! kubelet thresholds. Fields the model does not know are dropped when a document goes through
//! it (the controller re-encodes every machine so). [`DEFAULT_ENDPOINT_PATH`] is the controller's
//! machine endpoint through the API server's service proxy.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::goal::{GoalState, Machine, MachineStatus};

/// The default endpoint: the controller's service through the API server's service proxy.
pub const DEFAULT_ENDPOINT_PATH: &str =
    "/api/v1/namespaces/kube-system/services/http:aks-flex-controller:80/proxy";

/// The ARM resource type of a machine.
pub const MACHINE_TYPE: &str = "Microsoft.ContainerService/managedClusters/agentPools/machines";

/// A machine as ARM (and the controller) serve it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArmMachine {
    /// Resource id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Machine name (the node name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Resource type.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Availability zones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zones: Option<Vec<String>>,
    /// Properties.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub properties: Option<ArmMachineProperties>,
}

/// `properties`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArmMachineProperties {
    /// The machine's ETag: the settings version.
    #[serde(default, rename = "eTag", skip_serializing_if = "Option::is_none")]
    pub e_tag: Option<String>,
    /// `Succeeded`, `Failed`, `Creating`, `Updating`, `Deleting`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_state: Option<String>,
    /// Node image version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_image_version: Option<String>,
    /// `System` or `User`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// `Regular` or `Spot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    /// Resource tags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<BTreeMap<String, Option<String>>>,
    /// The Kubernetes profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<ArmKubernetesProfile>,
}

/// `properties.kubernetes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArmKubernetesProfile {
    /// Desired Kubernetes version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orchestrator_version: Option<String>,
    /// Running Kubernetes version (read-only; the fallback when the desired one is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_orchestrator_version: Option<String>,
    /// Max pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pods: Option<i64>,
    /// Node labels (ARM allows `null` values; they read as empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_labels: Option<BTreeMap<String, Option<String>>>,
    /// Node taints (`key=value:Effect`; `null` entries are skipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_taints: Option<Vec<Option<String>>>,
    /// Taints removed once the node is initialised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_initialization_taints: Option<Vec<Option<String>>>,
    /// kubelet settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_config: Option<ArmKubeletConfig>,
}

/// `properties.kubernetes.kubeletConfig` (the fields the agent uses).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArmKubeletConfig {
    /// `imageGcHighThreshold`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_gc_high_threshold: Option<i64>,
    /// `imageGcLowThreshold`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_gc_low_threshold: Option<i64>,
}

/// A machine document that is not valid ARM machine JSON.
#[derive(Debug, thiserror::Error)]
#[error("invalid ARM machine JSON{}: {cause}", if path.is_empty() || path == "." { String::new() } else { format!(" at {path}") })]
pub struct ParseError {
    /// Where in the document (`properties.kubernetes.maxPods`), `.` for the whole.
    pub path: String,
    /// What serde said (in the message, not a `source()`: a chain printer would repeat it).
    pub cause: serde_json::Error,
}

/// Parses an ARM machine document, naming the offending field on failure.
pub fn parse_arm_machine(bytes: &[u8]) -> Result<ArmMachine, ParseError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let value: ArmMachine = serde_path_to_error::deserialize(de).map_err(|e| ParseError {
        path: e.path().to_string(),
        cause: e.into_inner(),
    })?;
    Ok(value)
}

fn non_empty(s: Option<&String>) -> Option<&str> {
    s.map(|s| s.trim()).filter(|s| !s.is_empty())
}

/// The machine entry's tag that names the one bootstrap token (by its id, the public half)
/// allowed to bootstrap this machine's daemon certificate: the controller's CSR approver
/// approves a bootstrap request for `system:node:<machine>` only from that token.
pub const BOOTSTRAP_TOKEN_ID_TAG: &str = "aks-flex-bootstrap-token-id";

impl ArmMachine {
    /// The bootstrap token id the entry allows ([`BOOTSTRAP_TOKEN_ID_TAG`]), trimmed; `None`
    /// when the tag is absent or empty.
    pub fn bootstrap_token_id(&self) -> Option<&str> {
        self.properties
            .as_ref()?
            .tags
            .as_ref()?
            .get(BOOTSTRAP_TOKEN_ID_TAG)?
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
    }

    /// The Kubernetes version: `orchestratorVersion`, else `currentOrchestratorVersion`.
    pub fn kubernetes_version(&self) -> String {
        let k = self.properties.as_ref().and_then(|p| p.kubernetes.as_ref());
        k.and_then(|k| {
            non_empty(k.orchestrator_version.as_ref())
                .or_else(|| non_empty(k.current_orchestrator_version.as_ref()))
        })
        .unwrap_or_default()
        .to_string()
    }

    /// `properties.eTag` (empty when absent).
    pub fn etag(&self) -> String {
        self.properties
            .as_ref()
            .and_then(|p| non_empty(p.e_tag.as_ref()))
            .unwrap_or_default()
            .to_string()
    }

    /// The agent's view (`machineFromARM`); `fallback_id` and `fallback_name` fill a missing
    /// `id` / `name`.
    pub fn to_machine(&self, fallback_id: &str, fallback_name: &str) -> Machine {
        let props = self.properties.clone().unwrap_or_default();
        let k = props.kubernetes.clone().unwrap_or_default();
        let kubelet = k.kubelet_config.clone().unwrap_or_default();
        let kubernetes_version = self.kubernetes_version();
        let etag = self.etag();
        let settings_version = if etag.is_empty() {
            kubernetes_version.clone()
        } else {
            etag
        };
        Machine {
            id: non_empty(self.id.as_ref())
                .unwrap_or(fallback_id)
                .to_string(),
            name: non_empty(self.name.as_ref())
                .unwrap_or(fallback_name)
                .to_string(),
            goal: GoalState {
                kubernetes_version,
                settings_version,
                max_pods: k.max_pods.unwrap_or_default(),
                node_labels: k
                    .node_labels
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(key, v)| (key, v.unwrap_or_default()))
                    .collect(),
                node_taints: k
                    .node_taints
                    .unwrap_or_default()
                    .into_iter()
                    .flatten()
                    .collect(),
                image_gc_high_threshold: kubelet.image_gc_high_threshold.unwrap_or_default(),
                image_gc_low_threshold: kubelet.image_gc_low_threshold.unwrap_or_default(),
            },
            status: MachineStatus {
                provisioning_state: props.provisioning_state.unwrap_or_default(),
                ..Default::default()
            },
        }
    }
}

/// The PUT body for `goal` (`buildK8sProfile`): the Kubernetes version, max pods, labels and
/// taints. The kubelet thresholds are deliberately not sent.
pub fn put_body(goal: &GoalState) -> ArmMachine {
    ArmMachine {
        properties: Some(ArmMachineProperties {
            kubernetes: Some(ArmKubernetesProfile {
                orchestrator_version: Some(goal.kubernetes_version.clone()),
                max_pods: Some(goal.max_pods),
                node_labels: Some(
                    goal.node_labels
                        .iter()
                        .map(|(k, v)| (k.clone(), Some(v.clone())))
                        .collect(),
                ),
                node_taints: Some(goal.node_taints.iter().cloned().map(Some).collect()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The status PATCH body: `{"properties":{"status":{…}}}` (empty fields omitted).
pub fn status_patch_body(status: &MachineStatus) -> serde_json::Value {
    serde_json::json!({ "properties": { "status": status } })
}

/// Status constructors for the states the daemon reports.
impl MachineStatus {
    /// `Reconciling` towards `settings_version`.
    pub fn reconciling(settings_version: &str, message: impl Into<String>) -> Self {
        Self::with_state(PROVISIONING_RECONCILING, settings_version, message)
    }

    /// `Succeeded` at `settings_version`.
    pub fn succeeded(settings_version: &str, message: impl Into<String>) -> Self {
        Self::with_state(PROVISIONING_SUCCEEDED, settings_version, message)
    }

    /// `Failed` at `settings_version`, with what failed.
    pub fn failed(settings_version: &str, message: impl Into<String>) -> Self {
        Self::with_state(PROVISIONING_FAILED, settings_version, message)
    }

    fn with_state(state: &str, settings_version: &str, message: impl Into<String>) -> Self {
        Self {
            provisioning_state: state.into(),
            observed_settings_version: settings_version.into(),
            message: message.into(),
        }
    }
}

/// `Reconciling`.
pub const PROVISIONING_RECONCILING: &str = "Reconciling";
/// `Succeeded`.
pub const PROVISIONING_SUCCEEDED: &str = "Succeeded";
/// `Failed`.
pub const PROVISIONING_FAILED: &str = "Failed";
/// `Pending`.
pub const PROVISIONING_PENDING: &str = "Pending";
/// `Deleting`.
pub const PROVISIONING_DELETING: &str = "Deleting";

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canonical() -> serde_json::Value {
        json!({
          "id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c/agentPools/aksflexnodes/machines/node1",
          "name": "node1",
          "type": MACHINE_TYPE,
          "properties": {
            "eTag": "v7",
            "provisioningState": "Succeeded",
            "kubernetes": {
              "orchestratorVersion": "1.35.0",
              "maxPods": 110,
              "nodeLabels": {"kubernetes.azure.com/managed": "false", "nulled": null},
              "nodeTaints": ["a=b:NoSchedule", null],
              "kubeletConfig": {"imageGcHighThreshold": 85, "imageGcLowThreshold": 80}
            }
          }
        })
    }

    #[test]
    fn the_canonical_entry_reads_as_upstream() {
        let arm = parse_arm_machine(canonical().to_string().as_bytes()).unwrap();
        let m = arm.to_machine("fallback-id", "fallback-name");
        assert_eq!(
            m.id,
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c/agentPools/aksflexnodes/machines/node1"
        );
        assert_eq!(m.name, "node1");
        assert_eq!(m.goal.kubernetes_version, "1.35.0");
        assert_eq!(m.goal.settings_version, "v7");
        assert_eq!(m.goal.max_pods, 110);
        assert_eq!(
            m.goal.node_labels,
            BTreeMap::from([
                (
                    "kubernetes.azure.com/managed".to_string(),
                    "false".to_string()
                ),
                ("nulled".to_string(), String::new()),
            ])
        );
        assert_eq!(m.goal.node_taints, ["a=b:NoSchedule"]);
        assert_eq!(m.goal.image_gc_high_threshold, 85);
        assert_eq!(m.goal.image_gc_low_threshold, 80);
        assert_eq!(m.status.provisioning_state, "Succeeded");
    }

    #[test]
    fn fallbacks_version_etag_id_and_name() {
        let arm = parse_arm_machine(
            br#"{"properties":{"kubernetes":{"orchestratorVersion":"  ","currentOrchestratorVersion":"1.34.2"}}}"#,
        )
        .unwrap();
        let m = arm.to_machine("/api/x/machines/n", "n");
        assert_eq!(m.goal.kubernetes_version, "1.34.2");
        assert_eq!(m.goal.settings_version, "1.34.2", "no eTag: the version");
        assert_eq!(m.id, "/api/x/machines/n");
        assert_eq!(m.name, "n");
        assert_eq!(m.goal.max_pods, 0);
        // Nothing at all.
        let m = parse_arm_machine(b"{}").unwrap().to_machine("i", "n");
        assert_eq!(m.goal, GoalState::default());
    }

    #[test]
    fn the_lowercase_c_is_the_one_read() {
        let arm = parse_arm_machine(
            br#"{"properties":{"kubernetes":{"kubeletConfig":{"imageGCHighThreshold":1,"imageGcHighThreshold":90}}}}"#,
        )
        .unwrap();
        assert_eq!(arm.to_machine("", "").goal.image_gc_high_threshold, 90);
    }

    #[test]
    fn bad_json_names_the_field() {
        let e =
            parse_arm_machine(br#"{"properties":{"kubernetes":{"maxPods":"many"}}}"#).unwrap_err();
        assert_eq!(e.path, "properties.kubernetes.maxPods");
        assert!(
            e.to_string().starts_with(
                "invalid ARM machine JSON at properties.kubernetes.maxPods: invalid type"
            ),
            "{e}"
        );
        let e = parse_arm_machine(b"not json").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid ARM machine JSON: expected"),
            "{e}"
        );
        let e = parse_arm_machine(b"[1]").unwrap_err();
        assert!(e.to_string().contains("invalid type"), "{e}");
    }

    #[test]
    fn unknown_fields_are_dropped_on_reencode() {
        let mut doc = canonical();
        doc["properties"]["surprise"] = json!(1);
        doc["extra"] = json!({"x": 1});
        let arm = parse_arm_machine(doc.to_string().as_bytes()).unwrap();
        let back = serde_json::to_value(&arm).unwrap();
        assert_eq!(back, canonical());
    }

    #[test]
    fn put_body_sends_only_the_kubernetes_profile() {
        let goal = GoalState {
            kubernetes_version: "1.35.0".into(),
            settings_version: "ignored".into(),
            max_pods: 30,
            node_labels: BTreeMap::from([("a".to_string(), "b".to_string())]),
            node_taints: vec!["k=v:NoExecute".into()],
            image_gc_high_threshold: 85,
            image_gc_low_threshold: 80,
        };
        assert_eq!(
            serde_json::to_value(put_body(&goal)).unwrap(),
            json!({"properties":{"kubernetes":{
                "orchestratorVersion":"1.35.0","maxPods":30,
                "nodeLabels":{"a":"b"},"nodeTaints":["k=v:NoExecute"]}}})
        );
        assert_eq!(
            serde_json::to_value(put_body(&GoalState::default())).unwrap(),
            json!({"properties":{"kubernetes":{
                "orchestratorVersion":"","maxPods":0,"nodeLabels":{},"nodeTaints":[]}}})
        );
    }

    #[test]
    fn status_patch_shapes() {
        assert_eq!(
            status_patch_body(&MachineStatus::reconciling("v2", "")),
            json!({"properties":{"status":{"provisioningState":"Reconciling","observedSettingsVersion":"v2"}}})
        );
        assert_eq!(
            status_patch_body(&MachineStatus::failed("v2", "repave: kubelet not ready")),
            json!({"properties":{"status":{"provisioningState":"Failed","observedSettingsVersion":"v2","message":"repave: kubelet not ready"}}})
        );
        assert_eq!(
            MachineStatus::succeeded("v3", "ok").provisioning_state,
            PROVISIONING_SUCCEEDED
        );
    }
}
