//! What the agent's commands do, over the machinery ([`crate::machine`]) and the host seams.
//!
//! - [`start`]: the `start` command (goal, machine registration, first machine);
//! - [`bootstrap`]: `bootstrap.sh`'s and `aks-flex-node-bootstrap`'s flow (inputs, config,
//!   preflight, start once);
//! - [`daemon`]: the daemon's work queue (goal applies, the Node watch, MachineOperations);
//! - [`repave`]: blue/green repave (`ApplyGoalState`) in journaled phases, and its node-local
//!   request ([`repave::local`], `aks-flex-node repave`);
//! - [`metrics`]: the daemon's Prometheus metrics and their endpoint (`agent.metricsAddress`);
//! - [`worklock`]: the host-wide lock the daemon and node-local requests serialise on;
//! - [`reboot`]: NodeReboot (stop and start the active machine);
//! - [`reset`]: node reset;
//! - [`operations`]: MachineOperations: records, handlers, the reconciler, local runs;
//! - [`upgrade`]: AgentUpgrade and recovery;
//! - [`task_wait`]: `wait-task`, the agent container unit's waiter on its detached task;
//! - [`preflight`]: preflight checks and their report;
//! - [`setup_host`]: host setup (`setupHost`: packages, OS configuration);
//! - [`token`]: `token kubelogin`, the exec credential plugin (an Entra ID token as an
//!   `ExecCredential`);
//! - [`credential_provider`]: `token acr`, kubelet's image credential provider for Azure
//!   Container Registry (ACR's refresh token as a `CredentialProviderResponse`).

pub mod bootstrap;
pub mod credential_provider;
pub mod daemon;
pub mod drain;
pub mod ignition;
pub mod metrics;
pub mod operations;
pub mod preflight;
pub mod reboot;
pub mod repave;
pub mod reset;
pub mod setup_host;
pub mod start;
pub mod status;
pub mod task_wait;
pub mod token;
pub mod upgrade;
pub mod worklock;
