//! MachineOperations: what a cluster asks of this node (`NodeReboot`, `AgentReset`,
//! `AgentUpgrade`), decided by pure functions, carried out by [`Handlers`], and reported in the
//! operation's status.
//!
//! - [`decide`]: the decision layer (pure, table-tested; it lives in `flex_api::operations`
//!   with the reasons and [`OperationResult`]): which operations are this node's, parameter
//!   validation per kind, what to do given the operation and the local record;
//! - [`record`]: the local record that keeps an operation from running twice, and its store;
//! - [`tally`]: the count of node-local runs the daemon serves as a metric;
//! - [`handlers`]: the [`Handlers`] seam (real: [`HostHandlers`]; fake: `RecordingHandlers`, test code only),
//!   [`execute`], and node-local runs ([`run_local`], [`render_result`]);
//! - [`reconcile`]: the kube side: [`Reconciler::reconcile`] (GET, status PATCH with
//!   optimistic concurrency, DELETE after the TTL) and [`watch_stream`].
//!
//! Handlers never see where an operation came from: the reconciler and `aks-flex-node operation
//! run` both go through [`decide::admit`] and [`execute`].
//!
//! # Decisions
//!
//! The decision table is documented with [`decide::decide`] in `flex_api::operations`.
//!
//! # Never twice
//!
//! The record (`/etc/aks-flex-node/operations/<uid>.json`) moves `claiming` (before the status
//! says `InProgress`) → `executing` (before the handler is called) → `finished` with the result
//! (before the status says it). A daemon that dies at any point therefore finds, on restart,
//! either a claim whose handler never ran (safe to run), a run that may have done anything (never
//! run again: finished as `Interrupted`), or a result to report. A lost claim (409 on the
//! `InProgress` update) drops the record before re-reading, so another agent's claim is never
//! taken for this one's. AgentReset removes `/etc/aks-flex-node`, records included: its result
//! is kept in memory until the status says it, and the record is not written again.

#[cfg(test)]
pub(crate) mod fakes;
pub mod handlers;
pub mod reconcile;
pub mod record;
pub mod tally;

pub use flex_api::operations::{
    DISRUPTION_BUDGET_INVALID, DRAIN_FAILED, DRAIN_TIMED_OUT, EXECUTION_FAILED, IN_PROGRESS,
    INTERRUPTED, INVALID_PARAMETERS, NODE_NOT_READY, OperationResult, SUCCEEDED, UNKNOWN_KIND,
    UNSUPPORTED_OPERATION, decide,
};

pub use crate::flows::drain::DrainApiFactory;
pub use decide::{Action, Decision, Facts, Failure, Resume, UpgradeRequest};
#[cfg(test)]
pub(crate) use fakes::RecordingHandlers;
pub use handlers::{
    Executed, Handlers, HostHandlers, ParamError, Ran, execute, parse_params, render_executed,
    render_result, run_local,
};
pub use reconcile::{
    MACHINE_REF_FIELD, Outcome, ReconcileError, Reconciler, ReconcilerConfig, Taken, WatchScope,
    field_selectors, watch_stream,
};
pub use record::{RECORDS_DIR, Record, RecordStore, Stage};

#[cfg(test)]
mod tests;
