//! The node agent's API, as data and pure functions: what the cluster and the machine goal say,
//! shared by the agent, the controller and the harness.
//!
//! - [`machina`]: the Machina API (`MachineOperation`, `Machine`) as kube types and the CRDs;
//! - [`goal`]: the node's goal and the machine resource that carries it;
//! - [`arm`]: the ARM machine model (the machine resource's JSON) and its parser;
//! - [`duration`]: Go durations as the config and the controller's flags write them;
//! - `kube_errors` (feature `client`): kube errors as one line, secrets redacted.
//!
//! It knows nothing of hosts: no processes, files, systemd, containerd or HTTP client (`cargo
//! xtask ci` checks its dependency tree).

pub mod arm;
pub mod duration;
pub mod goal;
#[cfg(feature = "client")]
pub mod kube_errors;
pub mod machina;
