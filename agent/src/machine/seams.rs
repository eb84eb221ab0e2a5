//! The seams the flows drive the machinery through, implemented by [`super::node::NodeMachines`]
//! on a real host and faked in the flows' tests: starting a node ([`NodeStarter`]), the machine
//! operations of a repave and a reboot ([`NodeOps`]), the machine resource's registration
//! ([`MachineRegistry`], implemented by the goal clients) and the network checks of preflight
//! ([`RemoteProbe`]).

use async_trait::async_trait;

use crate::config::Config;
use crate::context::Host;
use crate::machine::nodegoal::MachineGoal;
use flex_api::goal::GoalState;

/// The machine resource, as far as `start` needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteMachine {
    /// Its Kubernetes version.
    pub kubernetes_version: String,
    /// Its ETag (may be empty).
    pub etag: String,
}

/// Registration of the node's machine resource (the machine-goal client implements it).
#[async_trait]
pub trait MachineRegistry: Send + Sync {
    /// Reads the machine; `Ok(None)` when it does not exist.
    async fn get(&self) -> anyhow::Result<Option<RemoteMachine>>;
    /// Creates or updates the machine with `goal`.
    async fn put(&self, goal: &GoalState) -> anyhow::Result<RemoteMachine>;
}

/// Provisions and starts a node machine and waits for kubelet (the node-machines layer
/// implements it).
#[async_trait]
pub trait NodeStarter: Send + Sync {
    /// Provisions `machine` from `config` and starts it; returns once kubelet is up.
    async fn start_node(&self, host: &Host, config: &Config, machine: &str) -> anyhow::Result<()>;
}

/// The machine operations a repave and a reboot need.
#[async_trait]
pub trait NodeOps: Send + Sync {
    /// Provisions `machine` for Kubernetes `kubernetes_version`, rebuilding a partial tree this
    /// agent owns.
    async fn provision(&self, machine: &str, kubernetes_version: &str) -> anyhow::Result<()>;
    /// Starts `machine` and waits for kubelet.
    async fn start(&self, machine: &str) -> anyhow::Result<()>;
    /// Stops `machine`.
    async fn stop(&self, machine: &str) -> anyhow::Result<()>;
    /// Removes `machine`.
    async fn cleanup(&self, machine: &str) -> anyhow::Result<()>;
}

/// Checks that reach the network: the rootfs image and the component downloads. The machine
/// layer implements it; tests fake it.
#[async_trait]
pub trait RemoteProbe: Send + Sync {
    /// Whether the rootfs image's manifest can be fetched: `Ok(digest)` or why not.
    async fn image_reachable(&self, goal: &MachineGoal) -> Result<String, String>;
    /// `(check name, result)` for `kubernetes-artifacts`, `cri-artifacts`, `cni-artifacts`.
    async fn artifacts_reachable(
        &self,
        config: &Config,
        goal: &MachineGoal,
    ) -> Vec<(String, Result<(), String>)>;
}
