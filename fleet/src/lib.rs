//! The fleet simulator behind `cargo xtask fleet` (issue #28 item 5): N simulated nodes in one
//! process, each running the daemon's own MachineOperation watch, reconcile, drain and
//! disruption budget code as its own identity, against an in-process fake API server (or a
//! real one, with a kubeconfig); a burst of NodeReboot operations; and a report of the API
//! cost per node, the most nodes disrupted at once, and the burst's duration.
//!
//! Modules: [`apiserver`] (the fake API server: the subset the daemon uses, with field and
//! label selectors, watches, resourceVersion conflicts, and counts per identity), [`sim`]
//! (the simulated nodes and the run), [`report`] (the arithmetic and the table, pure).
//! A test tool: nothing here is shipped, and the agent does not depend on it.

pub mod apiserver;
pub mod report;
pub mod sim;
