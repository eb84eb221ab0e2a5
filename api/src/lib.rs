//! The node agent's API, as data and pure functions: what the cluster and the machine goal say,
//! shared by the agent, the controller and the harness.
//!
//! - [`machina`]: the Machina API (`MachineOperation`, `Machine`) as kube types and the CRDs;
//! - [`goal`]: the node's goal, the machine resource that carries it, and the daemon state
//!   (the goal applied, the active side);
//! - [`arm`]: the ARM machine model (the machine resource's JSON) and its parser;
//! - [`bootstrap_env`]: `bootstrap.env`'s grammar (data, never evaluated) and the input names;
//! - [`image`]: image references and digests (operation parameters, the goal's image);
//! - [`budget`]: the cluster-wide disruption budget's slots (one ConfigMap, pure decisions);
//! - [`duration`]: Go durations as the config and the controller's flags write them;
//! - [`operations`]: MachineOperation results and reasons, the local record's data and the
//!   decision layer (pure, table-tested);
//! - [`node_state`]: the agent's state as its Node shows it (a condition and annotations;
//!   Done, Working or Degraded);
//! - [`repave`]: the repave decision (what the daemon does given its Node, the machine
//!   resource and the daemon state);
//! - [`upgrade`]: the agent upgrade's and recovery's state machines and the upgrade record;
//! - [`versions`]: default component versions and the cri-tools release of a Kubernetes version;
//! - `kube_errors` (feature `client`): kube errors as one line, secrets redacted.
//!
//! It knows nothing of hosts: no processes, files, systemd, containerd or HTTP client (`cargo
//! xtask ci` checks its dependency tree).

pub mod arm;
pub mod bootstrap_env;
pub mod budget;
pub mod drain;
pub mod duration;
pub mod goal;
pub mod image;
#[cfg(feature = "client")]
pub mod kube_errors;
pub mod machina;
pub mod node_state;
pub mod operations;
pub mod repave;
pub mod status;
pub mod upgrade;
pub mod versions;
