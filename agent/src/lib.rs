//! The AKS Flex Node agent: turns a Linux host into a Kubernetes worker whose kubelet runs inside
//! systemd-nspawn machines (`kube1`/`kube2`).
//!
//! The binary (`src/main.rs`) only dispatches and calls [`cli::run`]. The library is layered so
//! that the layers show in the tree; each layer uses only the ones below it:
//!
//! 1. the host seams and API types, used from their crates under their own names (never
//!    re-exported here): `flex_host` (runner, files, host-exec, host info, HTTP, the `Host`
//!    bundle, systemd, retry), `flex_api` (the Machina API, the goal, the decision tables),
//!    `flex_oci` (machine images);
//! 2. adapters and stores: [`config`] (the JSON config, defaults, validation), [`state`] (the
//!    daemon state file), [`systemd`] (the agent's units and the systemd manager),
//!    [`kubeclient`] (the daemon's Kubernetes client and certificate), [`goalclient`] (where the
//!    machine goal comes from: in-cluster or ARM), [`task`] (named steps), [`logging`],
//!    [`version`];
//! 3. [`machine`]: the node's machinery: nspawn machines, their files and goal, the components
//!    and the containerd image store, and the seams the flows drive (`NodeStarter`, `NodeOps`,
//!    `MachineRegistry`, `RemoteProbe`);
//! 4. [`flows`]: what the commands do: start, bootstrap, daemon, repave, reboot, reset,
//!    MachineOperations, upgrade, preflight, host setup;
//! 5. the edges: [`cli`] (the command line), [`entrypoint`] (the image's entrypoint),
//!    [`butane`] (the ACL host provisioning rendered from the agent's own units).
//!
//! The recording fakes of the host traits are `flex-testkit`'s (a dev-dependency only).

pub mod butane;
pub mod cli;
pub mod config;
pub mod entrypoint;
pub mod flows;
pub mod goalclient;
pub mod kubeclient;
pub mod logging;
pub mod machine;
pub mod state;
pub mod systemd;
pub mod task;
pub mod version;
