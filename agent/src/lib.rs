//! The AKS Flex Node agent: turns a Linux host into a Kubernetes worker whose kubelet runs inside
//! systemd-nspawn machines (`kube1`/`kube2`).
//!
//! The binary (`src/main.rs`) only parses the command line and calls [`cli::run`]. Everything
//! else is here, one module per concept:
//!
//! - [`config`]: the JSON config, defaults and validation;
//! - [`runner`]: the one way to run external commands;
//! - [`fs`]: atomic host file writes under a configurable root;
//! - [`hostinfo`]: read-only host facts;
//! - [`systemd`]: the agent's unit and a systemd manager client;
//! - [`context`]: the bundle of host interfaces every flow takes;
//! - [`state`]: the daemon state file and its checksum;
//! - [`task`]: named steps with logging, as upstream's task model;
//! - [`host`]: host setup (`setupHost`);
//! - [`machine`]: stopping and removing nspawn machines;
//! - [`reset`]: node reset;
//! - [`preflight`]: preflight checks and their report;
//! - [`start`], [`daemon`]: the `start` and `daemon` commands;
//! - [`logging`]: tracing setup;
//! - [`testing`]: recording fakes for the traits above.

pub mod cli;
pub mod config;
pub mod context;
pub mod daemon;
pub mod fs;
pub mod host;
pub mod hostinfo;
pub mod logging;
pub mod machine;
pub mod preflight;
pub mod reset;
pub mod runner;
pub mod start;
pub mod state;
pub mod systemd;
pub mod task;
pub mod testing;
pub mod version;
