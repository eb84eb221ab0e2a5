//! Tests of MachineOperations: records, handlers and local runs, and the reconciler against a
//! fake API server (kube's `tower_test` mock). The decision table's tests are
//! `flex-api`'s (`api/tests/operations_decide.rs`).

mod api;
mod local;
mod reconcile;

pub(super) use flex_testkit::operations::{
    NOW, at, labels, op, with_params, with_selector, with_status,
};
