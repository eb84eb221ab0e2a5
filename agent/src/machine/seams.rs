//! The seams the flows drive the machinery through, implemented by [`super::node::NodeMachines`]
//! on a real host and faked in the flows' tests: starting a node ([`NodeStarter`]), the machine
//! operations of a repave and a reboot ([`NodeOps`]), the machine resource's registration
//! ([`MachineRegistry`], implemented by the goal clients) and the network checks of preflight
//! ([`RemoteProbe`]).
//!
//! The node seams fail with a [`SeamError`], which says whether the same call can succeed later
//! ([`SeamError::Transient`]: the host, a download or the cluster failed) or not until its input
//! changes ([`SeamError::Permanent`]: a machine name, a version, an image reference or a
//! configured value is wrong). Callers decide on the variant, never on the message.

use async_trait::async_trait;

use crate::config::Config;
use crate::machine::nodegoal::MachineGoal;
use flex_api::goal::GoalState;
use flex_host::context::Host;

/// Why a call across a seam failed, as far as its caller decides on it.
#[derive(Debug, thiserror::Error)]
pub enum SeamError {
    /// The host, the network or the cluster failed: the same call may succeed later.
    #[error(transparent)]
    Transient(anyhow::Error),
    /// What the call was given is wrong: it fails the same way until its input changes.
    #[error(transparent)]
    Permanent(anyhow::Error),
}

impl SeamError {
    /// A failure that trying again does not mend.
    pub fn permanent(e: impl Into<anyhow::Error>) -> Self {
        Self::Permanent(e.into())
    }

    /// A failure that may pass.
    pub fn transient(e: impl Into<anyhow::Error>) -> Self {
        Self::Transient(e.into())
    }

    /// Whether trying again without a new input is pointless.
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Permanent(_))
    }

    /// The same kind of failure, with `context` in front of its message.
    pub fn context(self, context: impl std::fmt::Display + Send + Sync + 'static) -> Self {
        match self {
            Self::Transient(e) => Self::Transient(e.context(context)),
            Self::Permanent(e) => Self::Permanent(e.context(context)),
        }
    }
}

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
    async fn start_node(
        &self,
        host: &Host,
        config: &Config,
        machine: &str,
    ) -> Result<(), SeamError>;
}

/// The machine operations a repave and a reboot need.
#[async_trait]
pub trait NodeOps: Send + Sync {
    /// Provisions `machine` for Kubernetes `kubernetes_version`, rebuilding a partial tree this
    /// agent owns.
    async fn provision(&self, machine: &str, kubernetes_version: &str) -> Result<(), SeamError>;
    /// Starts `machine` and waits for kubelet.
    async fn start(&self, machine: &str) -> Result<(), SeamError>;
    /// Stops `machine`.
    async fn stop(&self, machine: &str) -> Result<(), SeamError>;
    /// Removes `machine`.
    async fn cleanup(&self, machine: &str) -> Result<(), SeamError>;
    /// Whether `machine` is enabled (starts with the host): a start enables it first, a stop
    /// disables it first.
    async fn is_enabled(&self, machine: &str) -> Result<bool, SeamError>;
}

/// Why a network check of preflight failed. Its message names artifacts, registries' answers
/// and HTTP statuses, never URLs or paths (they may carry credentials).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// What the check was given cannot be probed (an image reference, an architecture or the
    /// insecure registries do not parse): the configuration must change.
    #[error("{0}")]
    Config(String),
    /// The image, a download or the offline bundle is not there or does not answer.
    #[error("{0}")]
    Unreachable(String),
}

/// Checks that reach the network: the rootfs image and the component downloads. The machine
/// layer implements it; tests fake it.
#[async_trait]
pub trait RemoteProbe: Send + Sync {
    /// Whether the rootfs image's manifest can be fetched: `Ok(digest)` or why not.
    async fn image_reachable(
        &self,
        config: &Config,
        goal: &MachineGoal,
    ) -> Result<String, ProbeError>;
    /// `(check name, result)` for `kubernetes-artifacts`, `cri-artifacts`, `cni-artifacts`.
    async fn artifacts_reachable(
        &self,
        config: &Config,
        goal: &MachineGoal,
    ) -> Vec<(String, Result<(), ProbeError>)>;
}
