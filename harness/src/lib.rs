//! The QEMU harness behind `cargo xtask up`, `check` and `down`: it builds or finds the OS
//! image (ACL, or the embedded default dev host built from Debian packages), renders the
//! Ignition config, starts a local registry with the agent's image, boots the VM on a fresh
//! `cache=unsafe` overlay (KVM when a probe boot shows it is usable, else TCG), and runs timed
//! check groups. `xtask` is a thin CLI over this library.
//!
//! Modules: [`cli`] (the binary's command line), [`debug`] (`ssh`, `console`, `journal`: the
//! debugging verbs), [`artefacts`] (each group's journal and console excerpt), [`acl`] (ACL from the compute gallery, and how it boots), [`qemu`] (QEMU's argv),
//! [`qmp`] (the control socket), [`kvm`] (accelerator choice), [`check`] (what a check and a
//! group are, and the context they run against), [`checks`] (the host groups), [`groups`]
//! (every group in run order, selection, running a group), [`guest_json`] (the guest's JSON
//! files, typed), [`report`] (timing table, JUnit), [`registry`] (the local registry), [`ssh`]
//! (commands in the guest), [`upgrade`] (the AgentUpgrade group, its candidate images and the
//! start-limit wait), [`hostmode`] (`up --mode host`: the agent installed on the host by
//! `scripts/bootstrap.sh`, and what the registry serves it), [`cluster`] (the kind cluster of `up --cluster` and the cluster groups).

pub mod acl;
pub mod artefacts;
pub mod bench;
pub mod check;
pub mod cli;
pub mod cluster;
pub mod debug;
pub mod devhost;
pub mod fixtures;
pub mod groups;
pub mod guest_json;
pub mod hostmode;
pub mod images;
pub mod kit;
pub mod kvm;
pub mod node_status;
pub mod provision;
pub mod qemu;
pub mod qmp;
pub mod registry;
pub mod report;
pub mod run;
pub mod selinux;
pub mod ssh;
pub mod state;
pub mod vm;
