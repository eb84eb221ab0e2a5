//! The node's goal and the machine resource that carries it, as every machine client and the
//! controller see them: data only. [`GoalState`] (the goal), [`Machine`] and [`MachineStatus`]
//! (the resource that carries it), and [`DaemonState`] (the goal applied and the active side,
//! `kube1` or `kube2`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The node's goal, from the machine resource or, at bootstrap, from the config.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GoalState {
    /// Kubernetes version.
    pub kubernetes_version: String,
    /// Settings version (the machine's ETag; the Kubernetes version until one is known).
    pub settings_version: String,
    /// Max pods.
    pub max_pods: i64,
    /// Node labels.
    pub node_labels: BTreeMap<String, String>,
    /// Node taints.
    pub node_taints: Vec<String>,
    /// kubelet image GC high threshold.
    pub image_gc_high_threshold: i64,
    /// kubelet image GC low threshold.
    pub image_gc_low_threshold: i64,
}

/// A machine's provisioning state as the agent reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// `Reconciling`, `Succeeded`, `Failed` (also `Pending`, `Deleting`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provisioning_state: String,
    /// The settings version (ETag) the status is about.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub observed_settings_version: String,
    /// A message for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The machine resource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Machine {
    /// Resource id.
    pub id: String,
    /// Name (the node name).
    pub name: String,
    /// The goal; `settings_version` is the ETag (the Kubernetes version when there is none).
    pub goal: GoalState,
    /// Status as last reported.
    pub status: MachineStatus,
}

/// The two machine sides.
pub const KUBE1: &str = "kube1";
/// The second machine side.
pub const KUBE2: &str = "kube2";

/// What the daemon has applied and which machine side is active.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonState {
    /// Settings version (ETag) of the applied goal.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub applied_settings_version: String,
    /// Kubernetes version of the applied goal.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub applied_kubernetes_version: String,
    /// Settings version before the last repave.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub previous_settings_version: String,
    /// Kubernetes version before the last repave.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub previous_kubernetes_version: String,
    /// `kube1` or `kube2`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub active_machine: String,
}

impl DaemonState {
    /// The active machine, checked to be `kube1` or `kube2`.
    pub fn active(&self) -> Result<&str, ActiveMachineError> {
        match self.active_machine.as_str() {
            "" => Err(ActiveMachineError::Missing),
            m @ (KUBE1 | KUBE2) => Ok(m),
            other => Err(ActiveMachineError::Invalid(other.to_string())),
        }
    }
}

/// The daemon state's active machine is missing or not `kube1`/`kube2`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ActiveMachineError {
    /// No active machine recorded.
    #[error("daemon state is missing active machine")]
    Missing,
    /// An active machine other than kube1/kube2.
    #[error("daemon state active machine {0:?} is invalid")]
    Invalid(String),
}
