//! The AKS Flex Node agent: turns a Linux host into a Kubernetes worker whose kubelet runs inside
//! systemd-nspawn machines (`kube1`/`kube2`).
//!
//! The binary (`src/main.rs`) only parses the command line and calls [`cli::run`]. Everything
//! else is here, one module per concept:
//!
//! - [`config`]: the JSON config, defaults and validation;
//! - [`runner`]: the one way to run external commands;
//! - [`fs`]: atomic host file writes under a configurable root;
//! - [`hostexec`]: running the host's tools from the agent's container;
//! - [`entrypoint`]: the agent image's entrypoint (host mounts, D-Bus check);
//! - [`hostinfo`]: read-only host facts;
//! - [`http`]: the download client and the plain-HTTP rule;
//! - [`kubeclient`]: the daemon's Kubernetes client (config, daemon client certificate);
//! - [`oci`]: `flex-oci`, machine root file systems from OCI images (pull, verify, unpack);
//! - [`systemd`]: the agent's unit and a systemd manager client;
//! - [`context`]: the bundle of host interfaces every flow takes;
//! - [`state`]: the daemon state file and its checksum;
//! - [`task`]: named steps with logging, as upstream's task model;
//! - [`host`]: host setup (`setupHost`);
//! - [`components`]: Kubernetes node components installed into a machine rootfs;
//! - [`machine`]: starting, stopping and removing nspawn machines;
//! - [`machineclient`]: the machine goal model and client;
//! - [`machina`]: the Machina API (`MachineOperation`, `Machine`) and its CRDs;
//! - [`operations`]: MachineOperations: the decision layer, handlers, reconciler, local runs;
//! - [`node`]: provisioning and running machines on a real host;
//! - [`nodegoal`]: the resolved goal of one machine;
//! - [`nodeconfig`]: the files written into a machine and for it on the host;
//! - [`repave`]: blue/green repave and NodeReboot;
//! - [`reset`]: node reset;
//! - [`preflight`]: preflight checks and their report;
//! - [`provisioning`]: the ACL host provisioning (`image/agent-container.bu`);
//! - [`start`], [`daemon`]: the `start` and `daemon` commands;
//! - [`bootstrap`]: `bootstrap.sh`'s and `aks-flex-node-bootstrap`'s flow (inputs, config,
//!   preflight, start once);
//! - [`lifecycle`]: the nspawn lifecycle helper and binaries placed for machines;
//! - [`logging`]: tracing setup;
//!
//! The recording fakes of the host traits are `flex-testkit`'s (a dev-dependency only).

pub use flex_api::machina;
pub use flex_host::{context, fs, hostexec, hostinfo, http, runner};
pub use flex_oci as oci;

pub mod bootstrap;
pub mod cli;
pub mod components;
pub mod config;
pub mod containerd;
pub mod daemon;
pub mod entrypoint;
pub mod host;
pub mod kubeclient;
pub mod lifecycle;
pub mod logging;
pub mod machine;
pub mod machineclient;
pub mod node;
pub mod nodeconfig;
pub mod nodegoal;
pub mod operations;
pub mod preflight;
pub mod provisioning;
pub mod repave;
pub mod reset;
pub mod start;
pub mod state;
pub mod systemd;
pub mod task;
pub mod upgrade;
pub mod version;
