//! `aks-flex-controller`: the AKS Flex in-cluster machine endpoint.
//!
//! The agent's in-cluster machine client reads its machine through the API server's service
//! proxy from this controller, which serves ARM-shaped machine JSON out of the
//! `kube-system/aks-flex-machines` ConfigMap (read-only: writes are ignored), and, when enabled,
//! approves the agent daemon's client-certificate requests.
//!
//! - [`store`]: the [`store::MachineStore`] trait, the ConfigMap store and an in-memory store;
//! - [`server`]: the HTTP API and the server with graceful shutdown;
//! - [`csr`]: the CSR approver (pure authorization decisions and the watch that applies them);
//! - [`metrics`]: the controller's Prometheus metrics (`--metrics-bind-address`) and the timed
//!   store;
//! - [`policy`]: whether the daemons' admission policies are enforced (`/readyz` stays 503
//!   until they are);
//! - [`cli`]: flags and the run that ties them together;
//! - [`logging`]: JSON logs on stdout.
//!
//! It uses the API crate for the machine model and the host crate for its HTTP setup only,
//! never the agent (`cargo xtask layering`). `deploy/controller/` holds its manifests,
//! `deploy/crds/` the CRDs; `cargo xtask image --controller` builds its image with the same
//! Rust image builder as the agent's.

pub mod cli;
pub mod csr;
pub mod logging;
pub mod metrics;
pub mod policy;
pub mod server;
pub mod store;

pub use cli::{Args, run, run_with};
pub use server::Server;
pub use store::{ConfigMapStore, MachineStore, MemoryStore, StoreError};
