//! MachineOperation builders for tests of the decision layer, the reconciler and local runs.

#![allow(clippy::unwrap_used)] // test kit: a bad fixture is a test failure

use std::collections::BTreeMap;

use flex_api::machina::{MachineOperation, MachineOperationSpec, MachineOperationStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

/// The tests' "now": 2027-01-15T08:00:00Z.
pub const NOW: i64 = 1_800_000_000;

/// The timestamp `second` seconds after the epoch.
pub fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

/// A label map from pairs.
pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A Pending operation `name` (UID `uid-<name>`, resourceVersion 1) of `kind` for `machine`.
pub fn op(name: &str, kind: &str, machine: &str) -> MachineOperation {
    let mut o = MachineOperation::new(
        name,
        MachineOperationSpec {
            machine_ref: machine.into(),
            operation_kind: kind.into(),
            ..Default::default()
        },
    );
    o.metadata = ObjectMeta {
        name: Some(name.into()),
        uid: Some(format!("uid-{name}")),
        resource_version: Some("1".into()),
        generation: Some(1),
        ..Default::default()
    };
    o
}

/// `o` with these parameters.
pub fn with_params(mut o: MachineOperation, params: &[(&str, &str)]) -> MachineOperation {
    o.spec.parameters = labels(params);
    o
}

/// `o` aimed by a label selector instead of `machineRef`.
pub fn with_selector(mut o: MachineOperation, sel: &[(&str, &str)]) -> MachineOperation {
    o.spec.machine_ref = String::new();
    o.spec.machine_selector = Some(LabelSelector {
        match_labels: Some(labels(sel)),
        match_expressions: None,
    });
    o
}

/// `o` with a status: its phase and start/completion times (seconds since the epoch).
pub fn with_status(
    mut o: MachineOperation,
    phase: &str,
    started: Option<i64>,
    completed: Option<i64>,
) -> MachineOperation {
    o.status = Some(MachineOperationStatus {
        phase: phase.into(),
        started_at: started.map(|s| Time(at(s))),
        completed_at: completed.map(|s| Time(at(s))),
        ..Default::default()
    });
    o
}
