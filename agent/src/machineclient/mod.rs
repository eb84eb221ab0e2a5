//! The machine goal: the node's desired state held by AKS (ARM) or by the in-cluster
//! controller (`aks-flex-controller`), and the client the agent reads it and reports status
//! with. This file holds the shared model and the [`MachineClient`] trait; the implementations
//! live in the submodules.

use async_trait::async_trait;

use crate::start::GoalState;

pub mod arm;
pub mod armmodel;
pub mod incluster;
pub mod retry;
pub mod select;

pub use arm::{ArmMachineClient, AzureCredential, MachineResourceId, NoAzureCredential};
pub use armmodel::{ArmMachine, parse_arm_machine};
pub use incluster::{Endpoint, InClusterClient};
pub use retry::RetryPolicy;
pub use select::{MachineClientRegistry, client_for_daemon, client_for_start, machine_client};

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

/// A machine client failure.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// The machine resource does not exist.
    #[error("machine resource {0:?} not found")]
    NotFound(String),
    /// Anything else (transport, status code, bad JSON), with what was being done.
    #[error("{0:#}")]
    Other(anyhow::Error),
}

/// Reads and updates this node's machine resource (the node name is bound at construction).
#[async_trait]
pub trait MachineClient: Send + Sync {
    /// GET the machine.
    async fn get(&self) -> Result<Machine, MachineError>;
    /// Create or update the machine with `goal` (PUT).
    async fn create(&self, goal: &GoalState) -> Result<Machine, MachineError>;
    /// Report status (PATCH of the status only; never changes the ETag).
    async fn patch_status(&self, status: &MachineStatus) -> Result<(), MachineError>;
}
