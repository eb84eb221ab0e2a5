//! The Machina types: decoding objects as the API server returns them, phases, and the
//! committed CRD file.

use kube::Resource;
use serde_json::json;

use super::*;

#[test]
fn committed_crds_are_current() {
    let committed = include_str!("../../../deploy/crds/machina.yaml");
    assert_eq!(
        committed,
        crd_yaml().unwrap(),
        "deploy/crds/machina.yaml is stale: run `cargo xtask codegen`"
    );
}

#[test]
fn crds_are_cluster_scoped_with_status_and_short_names() {
    for (crd, plural, short) in [
        (MachineOperation::crd(), "machineoperations", "mop"),
        (Machine::crd(), "machines", "mach"),
    ] {
        assert_eq!(crd.spec.group, GROUP);
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.names.plural, plural);
        assert_eq!(crd.spec.names.short_names, Some(vec![short.to_string()]));
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, VERSION);
        assert!(v.subresources.as_ref().unwrap().status.is_some());
    }
    assert_eq!(
        MachineOperation::api_version(&()),
        "unbounded-cloud.io/v1alpha3"
    );
    assert_eq!(MachineOperation::plural(&()), "machineoperations");
}

#[test]
fn operation_decodes_as_the_api_server_returns_it() {
    let v = json!({
        "apiVersion": "unbounded-cloud.io/v1alpha3",
        "kind": "MachineOperation",
        "metadata": {"name": "reboot-1", "uid": "u1", "resourceVersion": "7", "generation": 2},
        "spec": {
            "machineSelector": {"matchLabels": {"pool": "flex"}},
            "operationKind": "NodeReboot",
            "parameters": {"k": "v"},
            "ttlSecondsAfterFinished": 60,
        },
        "status": {
            "phase": "Failed",
            "message": "boom",
            "startedAt": "2027-01-15T08:00:00Z",
            "completedAt": "2027-01-15T08:01:00Z",
            "conditions": [{
                "type": "Completed", "status": "False", "reason": "ExecutionFailed",
                "message": "boom", "lastTransitionTime": "2027-01-15T08:01:00Z",
            }],
            "targets": [{"machineRef": "node1"}],
        },
    });
    let op: MachineOperation = serde_json::from_value(v).unwrap();
    assert_eq!(op.spec.operation_kind, OperationKind::NodeReboot);
    assert_eq!(op.spec.ttl_seconds_after_finished, Some(60));
    assert_eq!(op.phase(), Ok(OperationPhase::Failed));
    assert!(op.phase().unwrap().is_terminal());
    assert_eq!(op.completed_condition().unwrap().reason, "ExecutionFailed");
    // A kind the CRD does not know still decodes; the decision layer refuses it.
    let odd: MachineOperation = serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha3", "kind": "MachineOperation",
        "metadata": {"name": "x"}, "spec": {"operationKind": "Defragment"},
        "status": {"phase": "Paused"},
    }))
    .unwrap();
    assert_eq!(odd.phase(), Err(UnknownPhase("Paused".to_string())));
}

#[test]
fn phases() {
    assert_eq!(OperationPhase::parse(""), Some(OperationPhase::Pending));
    for p in [
        OperationPhase::Pending,
        OperationPhase::InProgress,
        OperationPhase::Complete,
        OperationPhase::Failed,
    ] {
        assert_eq!(OperationPhase::parse(p.as_str()), Some(p));
    }
    assert_eq!(OperationPhase::parse("pending"), None);
    let none = MachineOperation::new("x", MachineOperationSpec::default());
    assert_eq!(none.phase(), Ok(OperationPhase::Pending));
}

#[test]
fn machine_decodes_with_defaults() {
    let m: Machine = serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha3", "kind": "Machine",
        "metadata": {"name": "node1", "labels": {"pool": "flex"}},
        "spec": {
            "ssh": {"host": "10.0.0.4", "privateKeyRef": {"name": "k", "namespace": "ns"}},
            "kubernetes": {"version": "v1.35.3", "bootstrapTokenRef": {"name": "bootstrap-token-abc"}},
            "operations": {"rebootCounter": 2},
        },
        "status": {"phase": "Ready", "agent": {"image": "img"}},
    }))
    .unwrap();
    let ssh = m.spec.ssh.as_ref().unwrap();
    assert_eq!(ssh.username, "azureuser");
    assert_eq!(ssh.private_key_ref.key, "ssh-privatekey");
    assert_eq!(m.spec.operations.as_ref().unwrap().reboot_counter, 2);
    assert_eq!(m.status.as_ref().unwrap().phase, "Ready");
}
