//! The AKS Flex Node agent: turns a Linux host into a Kubernetes worker whose kubelet runs inside
//! systemd-nspawn machines (`kube1`/`kube2`).
//!
//! The binary (`src/main.rs`) only dispatches and calls [`cli::run`]. The library is layered so
//! that the layers show in the tree. They are numbered from the bottom, and a module uses only
//! modules of its own layer or of lower ones (`tests/tests/imports.rs`,
//! `the_agents_layers_only_look_down`, checks layers 2 to 6 on the sources; within a layer the
//! same file's `no_crate_has_an_import_cycle` keeps the imports acyclic):
//!
//! 1. the host seams and API types, used from their crates under their own names (never
//!    re-exported here): `flex_host` (runner, files, host-exec, host info, HTTP, the `Host`
//!    bundle, systemd, retry), `flex_api` (the Machina API, the goal, the decision tables),
//!    `flex_oci` (machine images); a few modules re-export the API types their callers name
//!    (`config::GoDuration`, `state::DaemonState`, `flows::start::GoalState`);
//! 2. adapters and stores: [`config`] (the JSON config, defaults, validation), [`state`] (the
//!    agent's record files), [`systemd`] (the agent's units and the systemd manager), [`task`]
//!    (named steps), [`logging`], [`version`];
//! 3. [`machine`]: the node's machinery: nspawn machines, their files and goal, the components
//!    and the containerd image store, and the seams the flows drive (`NodeStarter`, `NodeOps`,
//!    `MachineRegistry`, `RemoteProbe`);
//! 4. the clients: [`kubeclient`] (the daemon's Kubernetes client and certificate) and
//!    [`goalclient`] (where the machine goal comes from: in-cluster or ARM; it implements
//!    `machine::seams::MachineRegistry`);
//! 5. [`flows`]: what the commands do: start, bootstrap, daemon, repave, reboot, reset,
//!    MachineOperations, upgrade, preflight, host setup, status, `ignition`, `token kubelogin`;
//! 6. the edges: [`cli`] (the command line; it wires the real `Host`), [`entrypoint`] (the
//!    image's entrypoint), [`butane`] (the ACL host provisioning rendered from the agent's own
//!    units).
//!
//! Names kept apart: the repave *decision* is `flex_api::repave`, the repave *flow*
//! [`flows::repave`], NodeReboot [`flows::reboot`]; the daemon's `work` carries out queue items
//! while [`flows::operations::reconcile`] reconciles MachineOperations; [`butane`] renders the
//! ACL provisioning while the harness's `provision` renders the test VM's Ignition; `machina` is
//! the Machina API (`flex_api::machina`), [`machine`] the machinery on this host, [`goalclient`]
//! the client of the machine goal.
//!
//! The recording fakes of the host traits are `flex-testkit`'s (a dev-dependency only); the
//! agent's own fakes (`machine::fakes`, `flows::operations::fakes`, `machine::containerd`'s
//! `fake`) compile only under `cfg(test)`.
//!
//! Tests: unit tests beside the code (insta snapshots in `snapshots/`); `tests/` runs the real
//! binary (`cli.rs`; `ignition_cli.rs`, whose output Debian's `ignition-validate` checks), the
//! components' installer against a real HTTP server (`components_http.rs`), the in-cluster
//! machine client against the controller's server (`machine_client_controller.rs`), the real
//! bootstrap script (`bootstrap_script.rs`) and every error type's cause rule
//! (`error_causes.rs`).

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
