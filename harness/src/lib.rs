//! The QEMU harness behind `cargo xtask up`, `check` and `down`: it builds or finds the OS
//! image (ACL, or the embedded default dev host built from Debian packages), renders the
//! Ignition config, starts a local registry with the agent's image, boots the VM on a fresh
//! `cache=unsafe` overlay (KVM when a probe boot shows it is usable, else TCG), and runs timed
//! check groups. `xtask` is a thin CLI over this library.
//!
//! Modules: [`cli`] (the binary's command line), [`run`] (`up` as named steps, `check`,
//! `down`), [`vm`] (boot, snapshot, `Progress`), [`state`] (what `up` started), [`debug`]
//! (`ssh`, `console`, `journal`: the debugging verbs), [`artefacts`] (each group's journal and
//! console excerpt), [`acl`] (ACL from the compute gallery, and how it boots), [`devhost`]
//! (the Debian dev host image), [`fixtures`], [`qemu`] (QEMU's argv), [`qmp`] (the control
//! socket), [`kvm`] (accelerator choice), [`registry`] (the local registry), [`images`],
//! [`provision`] (the VM's Ignition config), [`hostmode`] (`up --mode host`: the agent
//! installed on the host by `scripts/bootstrap.sh`, and what the registry serves it),
//! [`cluster`] (the kind cluster of `up --cluster`, or an existing one), [`ssh`] (commands in
//! the guest), [`guest_json`] and [`node_status`] (what the guest prints, typed), [`report`]
//! (timing table, JUnit, HTML), [`bench`](mod@bench), [`selinux`].
//!
//! The checks: [`check`] (what a check and a group are, the context they run against, and a
//! group's host-mode variant as data), [`groups`] (every group in run order, selection, running
//! a group; each group in its own module `groups::<name>`), and [`kit`] (what more than one
//! group uses: where the agent runs, the cluster groups' environment and steps, the upgrade
//! candidates and status). A group imports the kit and the helper modules, never another
//! group (`tests/tests/imports.rs` checks it, and that the import chain stays at most six
//! modules deep).

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
pub mod prometheus;
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
