//! The Machina API (`unbounded-cloud.io/v1alpha3`) as far as the agent uses it: the
//! cluster-scoped [`MachineOperation`] (shortName `mop`), through which a cluster asks this node
//! to reboot its machine, reset, or upgrade the agent, and [`Machine`] (shortName `mach`), whose
//! labels stand in for the Node's when the Node is gone.
//!
//! The types are kube-rs custom resources; [`crd_yaml`] renders both CustomResourceDefinitions
//! as the YAML committed in `deploy/crds/machina.yaml` (written by `cargo xtask codegen`; a test
//! and `cargo xtask codegen --check` keep it current). Fields follow upstream's Go types:
//! values the API server may widen (an operation's kind and phase) decode whatever they say, so an
//! object written by a newer controller still decodes: the kind as [`OperationKind`], an unknown
//! one kept as written, the phase as a string; the decision layer ([`crate::operations`]) says
//! what an unknown value means. `status.reason` is this agent's
//! addition, the `Completed` condition's reason, for `kubectl get -o` and scripts; a cluster
//! with upstream's CRD prunes it, and the condition still carries it. [`GROUP`] is the API
//! group, [`DAEMON_GROUP`] the group every daemon certificate carries (the RBAC subject).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::CustomResource;
use kube::core::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod kind;
mod yaml;

pub use kind::{Handler, OperationKind};

/// The group every daemon certificate carries besides `system:nodes` (the RBAC subject of
/// `deploy/controller/rbac.yaml` and the controller's CSR approver).
pub const DAEMON_GROUP: &str = "aks-flex-node-daemons";

pub use yaml::{to_yaml, yaml_scalar};

/// The API group.
pub const GROUP: &str = "unbounded-cloud.io";
/// The API version.
pub const VERSION: &str = "v1alpha3";

/// The group version of the admission policies that confine a node's daemon to its own
/// operations and disruption slot (Kubernetes 1.30 or later serves it).
pub const ADMISSION_POLICY_API: &str = "admissionregistration.k8s.io/v1";
/// Those ValidatingAdmissionPolicies, each bound by a ValidatingAdmissionPolicyBinding of the
/// same name (`deploy/controller`: `admission.yaml`, `disruption.yaml`).
pub const DAEMON_POLICIES: &[&str] = &[
    "aks-flex-node-daemon-machineoperations",
    "aks-flex-node-daemon-disruption-budget",
];

/// The one condition type the agent writes on an operation.
pub const CONDITION_COMPLETED: &str = "Completed";

/// A MachineOperation's phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OperationPhase {
    /// Waiting for an agent (also an empty phase).
    Pending,
    /// Claimed: an agent is running it.
    InProgress,
    /// Finished successfully.
    Complete,
    /// Finished unsuccessfully.
    Failed,
}

impl OperationPhase {
    /// The phase as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::InProgress => "InProgress",
            Self::Complete => "Complete",
            Self::Failed => "Failed",
        }
    }

    /// Parses the API's spelling; `""` is `Pending`, anything unknown is `None`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "" | "Pending" => Some(Self::Pending),
            "InProgress" => Some(Self::InProgress),
            "Complete" => Some(Self::Complete),
            "Failed" => Some(Self::Failed),
            _ => None,
        }
    }

    /// `Complete` or `Failed`.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Complete | Self::Failed)
    }
}

impl std::fmt::Display for OperationPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The CRD rule that makes a MachineOperation's spec immutable once created (a transition
/// rule: it is checked on updates only).
pub const SPEC_IMMUTABLE_RULE: &str = "self == oldSelf";

/// The CRD rule that makes every MachineOperation name its target: a `machineRef`, or a
/// `machineSelector` with at least one requirement (an empty selector would match every
/// machine in Kubernetes' semantics; here it matches none, and the API server refuses it).
pub const SPEC_TARGET_RULE: &str = "(has(self.machineRef) && size(self.machineRef) > 0) || \
(has(self.machineSelector) && ((has(self.machineSelector.matchLabels) && \
size(self.machineSelector.matchLabels) > 0) || (has(self.machineSelector.matchExpressions) && \
size(self.machineSelector.matchExpressions) > 0)))";

/// At most this many parameters (bounded so that the CRD's rules have a bounded cost).
pub const MAX_PARAMETERS: usize = 16;
/// A parameter value's maximum length.
pub const MAX_PARAMETER_LENGTH: usize = 4096;

/// A discrete operation on a machine, created by a CLI or a controller and carried out by the
/// agent it targets.
#[allow(clippy::duplicated_attributes)] // kube-derive repeats `type_` per printcolumn
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "unbounded-cloud.io",
    version = "v1alpha3",
    kind = "MachineOperation",
    status = "MachineOperationStatus",
    shortname = "mop",
    derive = "PartialEq",
    doc = "MachineOperation represents a discrete operation to be performed on a Machine. The in-VM agent handles NodeReboot, AgentUpgrade and AgentReset; machina's controllers handle the Host* operations.",
    printcolumn(name = "Machine", type_ = "string", json_path = ".spec.machineRef"),
    // A daemon watches only the operations aimed at its machine (and those aimed by selector,
    // which read as "") with a field selector on it (Kubernetes >= 1.31 by default).
    selectable = ".spec.machineRef",
    printcolumn(
        name = "Operation",
        type_ = "string",
        json_path = ".spec.operationKind"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": SPEC_IMMUTABLE_RULE,
        "message": "spec is immutable: delete the operation and create a new one"
    },
    {
        "rule": SPEC_TARGET_RULE,
        "message": "name the target: machineRef, or a machineSelector with at least one requirement (an empty selector matches no machine)"
    }
]))]
pub struct MachineOperationSpec {
    /// MachineRef is the name of the Machine this operation targets. Either machineRef or
    /// machineSelector must be set.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 253))]
    pub machine_ref: String,
    /// MachineSelector selects machines by labels (the agent matches it against its Node's
    /// labels). Either machineRef or machineSelector must be set; an empty selector matches
    /// no machine. Its keys must be under node-restriction.kubernetes.io/ (labels a node
    /// cannot set on itself): the agent ignores an operation whose selector has another key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "label_selector_schema")]
    pub machine_selector: Option<LabelSelector>,
    /// OperationKind is the operation to perform on the target machine.
    #[schemars(schema_with = "operation_kind_schema")]
    pub operation_kind: OperationKind,
    /// Parameters is an optional set of key-value pairs passed to the operation's handler,
    /// for example AgentUpgrade's `image`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "parameters_schema")]
    pub parameters: BTreeMap<String, String>,
    /// TTLSecondsAfterFinished limits the lifetime of a finished MachineOperation: the agent
    /// deletes it this many seconds after it reaches a terminal phase. If unset, it is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
}

/// The observed state of a MachineOperation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineOperationStatus {
    /// Phase is the current phase of the operation: Pending, InProgress, Complete or Failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
    /// Reason is the machine-readable reason of the last transition (the Completed
    /// condition's reason once finished).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Message is a human-readable description of the current state.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// StartedAt is when the agent began executing the operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub started_at: Option<Time>,
    /// CompletedAt is when the operation reached a terminal phase (Complete or Failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub completed_at: Option<Time>,
    /// ObservedMachineGeneration is the Machine's metadata.generation when the agent began
    /// executing the operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_machine_generation: Option<i64>,
    /// Conditions represent the latest available observations of the operation's state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// ClaimedBy is the node whose agent claimed (or finished) the operation. With the
    /// project's admission policy (`deploy/controller/admission.yaml`) only that node's daemon
    /// may write this status afterwards, and a daemon may set it only to its own node.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub claimed_by: String,
}

/// A phase this API version does not define, as written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown phase {0:?}")]
pub struct UnknownPhase(pub String);

impl MachineOperation {
    /// The phase (`""` counts as `Pending`); `Err` carries an unknown phase as written.
    pub fn phase(&self) -> Result<OperationPhase, UnknownPhase> {
        let raw = self
            .status
            .as_ref()
            .map(|s| s.phase.as_str())
            .unwrap_or_default();
        OperationPhase::parse(raw).ok_or_else(|| UnknownPhase(raw.to_string()))
    }

    /// The `Completed` condition, if any.
    pub fn completed_condition(&self) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_COMPLETED)
    }
}

/// A machine that can be managed by machina.
#[allow(clippy::duplicated_attributes)] // kube-derive repeats `type_` per printcolumn
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "unbounded-cloud.io",
    version = "v1alpha3",
    kind = "Machine",
    status = "MachineStatus",
    shortname = "mach",
    derive = "PartialEq",
    doc = "Machine represents a machine that can be managed by machina.",
    printcolumn(name = "Host", type_ = "string", json_path = ".spec.ssh.host"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "K8s Version",
        type_ = "string",
        json_path = ".spec.kubernetes.version"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    /// SSH contains the SSH connection and credential details for the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<SshSpec>,
    /// PXE contains PXE boot configuration for the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pxe: Option<PxeSpec>,
    /// Kubernetes contains Kubernetes-specific configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesSpec>,
    /// Agent contains settings for the node agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentSpec>,
    /// Operations holds counter triggers: an operation is pending while the spec's counter is
    /// greater than the status's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operations: Option<OperationCounters>,
}

/// SSH connection details.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SshSpec {
    /// Host is the hostname or IP address of the machine, optionally with a port
    /// (`1.2.3.4:2222`); 22 when omitted.
    pub host: String,
    /// Username is the SSH username.
    #[serde(default = "default_ssh_user")]
    #[schemars(extend("default" = "azureuser"))]
    pub username: String,
    /// PrivateKeyRef references a secret containing the SSH private key.
    pub private_key_ref: SecretKeySelector,
    /// Bastion configures an optional SSH jump host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bastion: Option<BastionSpec>,
}

fn default_ssh_user() -> String {
    "azureuser".into()
}

/// SSH connection details of a bastion host.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BastionSpec {
    /// Host is the hostname or IP address of the bastion, optionally with a port.
    pub host: String,
    /// Username is the SSH username for the bastion.
    #[serde(default = "default_ssh_user")]
    #[schemars(extend("default" = "azureuser"))]
    pub username: String,
    /// PrivateKeyRef references a secret containing the bastion's SSH private key (the
    /// machine's when omitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key_ref: Option<SecretKeySelector>,
}

/// A key of a Secret.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeySelector {
    /// Name of the secret.
    pub name: String,
    /// Namespace of the secret.
    pub namespace: String,
    /// Key within the secret.
    #[serde(default = "default_ssh_key")]
    #[schemars(extend("default" = "ssh-privatekey"))]
    pub key: String,
}

fn default_ssh_key() -> String {
    "ssh-privatekey".into()
}

/// PXE boot configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PxeSpec {
    /// Image is an OCI reference of the netboot artifacts.
    pub image: String,
    /// DHCPLeases defines static IPv4 provisioning network settings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dhcp_leases: Vec<DhcpLease>,
    /// Redfish configures optional Redfish BMC access.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redfish: Option<RedfishSpec>,
    /// CloudInit contains optional cloud-init customization.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init: Option<CloudInitSpec>,
}

/// A static IPv4 lease.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DhcpLease {
    /// IPv4 is the address to assign.
    pub ipv4: String,
    /// MAC is the MAC address of the network interface.
    pub mac: String,
    /// SubnetMask is the subnet mask.
    pub subnet_mask: String,
    /// Gateway is the default gateway.
    pub gateway: String,
    /// DNS is a list of DNS server addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns: Vec<String>,
}

/// Redfish BMC access.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedfishSpec {
    /// URL is the Redfish endpoint URL.
    pub url: String,
    /// Username is the Redfish username.
    pub username: String,
    /// DeviceID is the Redfish system device ID.
    #[serde(default = "default_device_id", rename = "deviceID")]
    #[schemars(extend("default" = "1"))]
    pub device_id: String,
    /// PasswordRef references a secret containing the Redfish password.
    pub password_ref: SecretKeySelector,
}

fn default_device_id() -> String {
    "1".into()
}

/// cloud-init customization.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CloudInitSpec {
    /// UserDataConfigMapRef references a ConfigMap key holding cloud-init user-data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data_config_map_ref: Option<ConfigMapKeySelector>,
}

/// A key of a ConfigMap.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKeySelector {
    /// Name of the ConfigMap.
    pub name: String,
    /// Namespace of the ConfigMap.
    pub namespace: String,
    /// Key within the ConfigMap.
    #[serde(default = "default_user_data_key")]
    #[schemars(extend("default" = "user-data"))]
    pub key: String,
}

fn default_user_data_key() -> String {
    "user-data".into()
}

/// Kubernetes settings of a machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesSpec {
    /// Version is the Kubernetes version to install.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// NodeRef references the Node of this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ref: Option<LocalObjectReference>,
    /// NodeLabels are passed to kubelet's --node-labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    /// RegisterWithTaints are passed to kubelet's --register-with-taints (`key=value:Effect`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub register_with_taints: Vec<String>,
    /// BootstrapTokenRef references a bootstrap token Secret in kube-system.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_token_ref: Option<LocalObjectReference>,
}

/// A reference by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LocalObjectReference {
    /// Name of the referenced object.
    pub name: String,
}

/// Agent settings of a machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSpec {
    /// Image is the OCI reference used to provision the nspawn machine.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// Version pins the agent release.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// BaseURL overrides the base URL of the agent download.
    #[serde(default, skip_serializing_if = "String::is_empty", rename = "baseURL")]
    pub base_url: String,
    /// URL is a fully qualified agent download URL (overrides version and baseURL).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub url: String,
    /// Downloads overrides the sources of the binaries installed into the rootfs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downloads: Option<AgentDownloads>,
}

/// Download source overrides, per artifact.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentDownloads {
    /// kubelet, kubectl, kube-proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<DownloadSource>,
    /// containerd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containerd: Option<DownloadSource>,
    /// runc.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runc: Option<DownloadSource>,
    /// CNI plugins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni: Option<DownloadSource>,
    /// crictl.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crictl: Option<DownloadSource>,
}

/// One artifact's download source.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DownloadSource {
    /// BaseURL replaces the upstream host and path prefix.
    #[serde(default, skip_serializing_if = "String::is_empty", rename = "baseURL")]
    pub base_url: String,
    /// URL is a fully qualified download URL template (overrides baseURL).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub url: String,
    /// Version overrides the artifact's version.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
}

/// Counter triggers for reboot and repave.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationCounters {
    /// Reboot counter.
    #[serde(default)]
    pub reboot_counter: i64,
    /// Repave counter.
    #[serde(default)]
    pub repave_counter: i64,
}

/// The observed state of a Machine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// Phase: Pending, Rebooting, Provisioning, Joining, Ready or Failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
    /// Message provides additional status information.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// SSH holds observed SSH state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<SshStatus>,
    /// Redfish holds observed Redfish state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redfish: Option<RedfishStatus>,
    /// TPM holds observed TPM state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<TpmStatus>,
    /// Agent holds the applied agent settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentStatus>,
    /// Operations holds the counters acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operations: Option<OperationCounters>,
    /// Conditions represent the latest available observations of the machine's state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// Observed SSH state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SshStatus {
    /// The SSH host key fingerprint pinned on first connection.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fingerprint: String,
}

/// Observed Redfish state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedfishStatus {
    /// The Redfish endpoint's TLS certificate fingerprint.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cert_fingerprint: String,
}

/// Observed TPM state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TpmStatus {
    /// The TPM endorsement key's public key.
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        rename = "ekPublicKey"
    )]
    pub ek_public_key: String,
}

/// Applied agent settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// The image applied to the nspawn machine.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
}

fn schema(v: serde_json::Value) -> schemars::Schema {
    match v {
        serde_json::Value::Object(m) => schemars::Schema::from(m),
        _ => schemars::Schema::from(true),
    }
}

fn time_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schema(serde_json::json!({"type": "string", "format": "date-time"}))
}

fn parameters_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schema(serde_json::json!({
        "description": "Parameters is an optional set of key-value pairs passed to the operation's handler,\nfor example AgentUpgrade's `image`.",
        "type": "object",
        "maxProperties": MAX_PARAMETERS,
        "additionalProperties": {"type": "string", "maxLength": MAX_PARAMETER_LENGTH},
    }))
}

fn operation_kind_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schema(serde_json::json!({
        "description": "OperationKind is the operation to perform on the target machine.",
        "type": "string",
        "enum": OperationKind::KNOWN.iter().map(OperationKind::as_str).collect::<Vec<_>>(),
    }))
}

/// `metav1.LabelSelector`, as controller-gen renders it.
fn label_selector_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schema(serde_json::json!({
        "description": "MachineSelector selects machines by labels (the agent matches it against its Node's labels). Either machineRef or machineSelector must be set; an empty selector matches no machine.",
        "type": "object",
        "properties": {
            "matchExpressions": {
                "description": "matchExpressions is a list of label selector requirements. The requirements are ANDed.",
                "type": "array",
                "maxItems": 16,
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": {"type": "string", "maxLength": 317},
                        "operator": {"type": "string", "maxLength": 16},
                        "values": {
                            "type": "array",
                            "maxItems": 64,
                            "items": {"type": "string", "maxLength": 63},
                            "x-kubernetes-list-type": "atomic",
                        },
                    },
                },
                "x-kubernetes-list-type": "atomic",
            },
            "matchLabels": {
                "description": "matchLabels is a map of {key,value} pairs, each equivalent to a matchExpressions element with operator In and that value.",
                "type": "object",
                "maxProperties": 32,
                "additionalProperties": {"type": "string", "maxLength": 63},
            },
        },
        "x-kubernetes-map-type": "atomic",
    }))
}

/// A list of `metav1.Condition`, as controller-gen renders it.
fn conditions_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schema(serde_json::json!({
        "description": "Conditions represent the latest available observations of the object's state.",
        "type": "array",
        "items": {
            "type": "object",
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "properties": {
                "lastTransitionTime": {"type": "string", "format": "date-time"},
                "message": {"type": "string", "maxLength": 32768},
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                "reason": {
                    "type": "string",
                    "maxLength": 1024,
                    "minLength": 1,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
                },
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "type": {
                    "type": "string",
                    "maxLength": 316,
                    "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
                },
            },
        },
    }))
}

/// The header of `deploy/crds/machina.yaml`.
pub const CRD_HEADER: &str =
    "# Machina CustomResourceDefinitions (unbounded-cloud.io/v1alpha3) as the AKS Flex Node agent
# reads and writes them. Generated from agent/src/machina by `cargo xtask codegen`; do not edit.
";

/// `deploy/crds/machina.yaml`: both CRDs (`machineoperations`, then `machines`) as YAML
/// documents, rendered deterministically.
pub fn crd_yaml() -> Result<String, serde_json::Error> {
    let mut out = String::from(CRD_HEADER);
    for crd in [MachineOperation::crd(), Machine::crd()] {
        out.push_str("---\n");
        out.push_str(&to_yaml(&serde_json::to_value(&crd)?));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
