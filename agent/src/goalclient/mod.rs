//! The machine goal: the node's desired state held by AKS (ARM) or by the in-cluster
//! controller (`aks-flex-controller`), and the client the agent reads it and reports status
//! with. This file holds the shared model and the [`MachineClient`] trait; the implementations
//! live in the submodules, with the Azure credentials of the ARM client ([`azure`], which
//! `aks-flex-node token kubelogin` and ACR's token exchange ([`acr`]) use too).

use async_trait::async_trait;

use flex_api::goal::GoalState;

pub mod acr;
pub mod arm;
pub mod azure;
pub mod incluster;
pub mod retry;
pub mod select;

pub use arm::{ArmMachineClient, MachineResourceId};
pub use azure::{AccessToken, AuthError, AzureCredential};
pub use flex_api::arm::{ArmMachine, parse_arm_machine};
pub use incluster::{Endpoint, InClusterClient};
pub use select::{MachineClientRegistry, client_for_daemon, client_for_start, machine_client};

pub use flex_api::goal::{Machine, MachineStatus};

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
