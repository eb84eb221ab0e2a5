//! The node's machinery: everything that builds, configures and runs the nspawn machines
//! (`kube1`/`kube2`) on a host, below the flows that decide when.
//!
//! - [`nspawn`]: machine names and paths; start, services, wait for kubelet, stop, cleanup;
//! - [`node`]: `NodeMachines`, provisioning and running machines on a real host (implements the
//!   flows' seams);
//! - [`nodegoal`]: the resolved goal of one machine (pure);
//! - [`nodeconfig`]: the files written into a machine and for it on the host;
//! - [`lifecycle`]: the nspawn lifecycle helper and the binaries placed for machines;
//! - [`components`]: Kubernetes node components installed into a machine rootfs;
//! - [`seams`]: the traits the flows drive the machinery through;
//! - [`containerd`]: the agent's image store in containerd (AgentUpgrade in the container);
//! - [`registry_auth`]: the credentials of the agent's own registry pulls
//!   (`bootstrap.registryAuth`: a Docker-config file, ACR's token exchange);
//! - [`kubelet_credential`]: kubelet's client credential kept across provisions, so a
//!   bootstrap token serves the first join only;
//! - [`pki`]: client certificate pair files and what a certificate says (pure).

pub mod components;
pub mod containerd;
#[cfg(test)]
pub(crate) mod fakes;
pub mod kubelet_credential;
pub mod lifecycle;
pub mod node;
pub mod nodeconfig;
pub mod nodegoal;
pub mod nspawn;
pub mod pin;
pub mod pki;
pub mod registry_auth;
pub mod seams;

pub use seams::{MachineRegistry, NodeOps, NodeStarter, RemoteMachine, RemoteProbe};
