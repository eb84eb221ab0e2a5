//! The repave decision (upstream's `repave_reconciler.go` `decide`): what the daemon does given
//! its Node, the machine resource and the daemon state. Pure; tested row by row.
//!
//! Rows are tried in order; the first that matches decides:
//!
//! | # | Node | deletion taint | machine | goal applied | decision | reason |
//! |---|---|---|---|---|---|---|
//! | 1 | present | yes | 404 | – | `ResetDelete` | deletion signal present and machine resource is gone |
//! | 2 | present | yes | exists | – | `WaitForMachineDelete` | deletion signal present but machine resource still exists |
//! | 3 | any | no | 404 | – | `WaitForNodeSignal` | machine resource is gone without deletion signal |
//! | 4 | any | – | empty | – | `Noop` | machine snapshot is empty |
//! | 5 | absent | – | exists | yes | `ReportSucceeded` | node is absent but goal state is already applied |
//! | 6 | absent | – | exists | no | `ApplyGoalState` | node deletion observed and goal state is not applied |
//! | 7 | present | no | exists | yes | `ReportSucceeded` | goal state is applied |
//! | 8 | present | no | exists | no (or no state) | `WaitForNodeSignal` | goal state differs but node deletion trigger is absent |
//!
//! The deletion taint is key `kubernetes.azure.com/flex-node-deleting`, effect `NoSchedule`,
//! value `true` (trimmed, case-insensitive). The goal is applied when there is a state, the
//! goal's settings version (ETag) is not empty and equals the state's
//! `appliedSettingsVersion`; the Kubernetes version alone is not compared.

use k8s_openapi::api::core::v1::Node;

use crate::goal::{DaemonState, GoalState};

/// The taint that tells the agent its node is being deleted.
pub const DELETION_TAINT_KEY: &str = "kubernetes.azure.com/flex-node-deleting";
/// The taint's effect.
pub const DELETION_TAINT_EFFECT: &str = "NoSchedule";

/// The machine resource as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MachineSnapshot<'a> {
    /// The machine resource does not exist (404).
    NotFound,
    /// The client answered with a machine that carries no goal at all.
    Empty,
    /// The machine exists with this goal.
    Exists(&'a GoalState),
}

/// What the daemon does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing.
    Noop,
    /// Report `Succeeded` for the goal's settings version.
    ReportSucceeded,
    /// Repave to the goal (blue/green), reporting `Reconciling`, then `Succeeded` or `Failed`.
    ApplyGoalState,
    /// Reset the node, then uninstall the agent's own service.
    ResetDelete,
    /// Wait: the deletion taint is there but the machine resource is not gone yet.
    WaitForMachineDelete,
    /// Wait: no deletion signal on the Node.
    WaitForNodeSignal,
}

impl Action {
    /// The name in logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            Action::Noop => "Noop",
            Action::ReportSucceeded => "ReportSucceeded",
            Action::ApplyGoalState => "ApplyGoalState",
            Action::ResetDelete => "ResetDelete",
            Action::WaitForMachineDelete => "WaitForMachineDelete",
            Action::WaitForNodeSignal => "WaitForNodeSignal",
        }
    }
}

/// A decision and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// What to do.
    pub action: Action,
    /// Why (logged; the `ReportSucceeded` status message).
    pub reason: &'static str,
}

/// Whether `node` carries the deletion taint.
pub fn has_deletion_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
        .iter()
        .any(|t| {
            t.key == DELETION_TAINT_KEY
                && t.effect == DELETION_TAINT_EFFECT
                && t.value
                    .as_deref()
                    .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        })
}

/// Whether `goal` is what `state` says is applied.
pub fn goal_applied(state: Option<&DaemonState>, goal: &GoalState) -> bool {
    state.is_some_and(|s| {
        !goal.settings_version.is_empty() && s.applied_settings_version == goal.settings_version
    })
}

fn d(action: Action, reason: &'static str) -> Decision {
    Decision { action, reason }
}

/// The decision table (see the module documentation).
pub fn decide(
    node: Option<&Node>,
    machine: MachineSnapshot<'_>,
    state: Option<&DaemonState>,
) -> Decision {
    let tainted = node.is_some_and(has_deletion_taint);
    match (node.is_some(), tainted, machine) {
        (true, true, MachineSnapshot::NotFound) => d(
            Action::ResetDelete,
            "deletion signal present and machine resource is gone",
        ),
        (true, true, MachineSnapshot::Exists(_)) => d(
            Action::WaitForMachineDelete,
            "deletion signal present but machine resource still exists",
        ),
        (_, _, MachineSnapshot::NotFound) => d(
            Action::WaitForNodeSignal,
            "machine resource is gone without deletion signal",
        ),
        (_, _, MachineSnapshot::Empty) => d(Action::Noop, "machine snapshot is empty"),
        (false, _, MachineSnapshot::Exists(goal)) if goal_applied(state, goal) => d(
            Action::ReportSucceeded,
            "node is absent but goal state is already applied",
        ),
        (false, _, MachineSnapshot::Exists(_)) => d(
            Action::ApplyGoalState,
            "node deletion observed and goal state is not applied",
        ),
        (true, _, MachineSnapshot::Exists(goal)) if goal_applied(state, goal) => {
            d(Action::ReportSucceeded, "goal state is applied")
        }
        (true, _, MachineSnapshot::Exists(_)) => d(
            Action::WaitForNodeSignal,
            "goal state differs but node deletion trigger is absent",
        ),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeSpec, Taint};

    use super::*;

    fn node(taints: &[(&str, Option<&str>, &str)]) -> Node {
        Node {
            spec: Some(NodeSpec {
                taints: Some(
                    taints
                        .iter()
                        .map(|(k, v, e)| Taint {
                            key: k.to_string(),
                            value: v.map(str::to_string),
                            effect: e.to_string(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn tainted() -> Node {
        node(&[(DELETION_TAINT_KEY, Some("true"), "NoSchedule")])
    }

    fn goal(v: &str) -> GoalState {
        GoalState {
            kubernetes_version: "1.35.3".into(),
            settings_version: v.into(),
            ..Default::default()
        }
    }

    fn state(v: &str) -> DaemonState {
        DaemonState {
            applied_settings_version: v.into(),
            active_machine: "kube1".into(),
            ..Default::default()
        }
    }

    type Row<'a> = (
        &'static str,
        Option<&'a Node>,
        MachineSnapshot<'a>,
        Option<&'a DaemonState>,
        Action,
        &'static str,
    );

    #[test]
    fn decision_table_row_by_row() {
        use Action::*;
        let plain = node(&[("dedicated", Some("flex"), "NoSchedule")]);
        let del = tainted();
        let g1 = goal("etag-1");
        let s1 = state("etag-1");
        let s0 = state("etag-0");
        #[rustfmt::skip]
        let rows: Vec<Row> = vec![
            ("1 taint + 404", Some(&del), MachineSnapshot::NotFound, Some(&s1), ResetDelete, "deletion signal present and machine resource is gone"),
            ("1 taint + 404, no state", Some(&del), MachineSnapshot::NotFound, None, ResetDelete, "deletion signal present and machine resource is gone"),
            ("2 taint + exists", Some(&del), MachineSnapshot::Exists(&g1), Some(&s1), WaitForMachineDelete, "deletion signal present but machine resource still exists"),
            ("2 taint + exists, drift", Some(&del), MachineSnapshot::Exists(&g1), Some(&s0), WaitForMachineDelete, "deletion signal present but machine resource still exists"),
            ("3 present, no taint, 404", Some(&plain), MachineSnapshot::NotFound, Some(&s1), WaitForNodeSignal, "machine resource is gone without deletion signal"),
            ("3 absent, 404", None, MachineSnapshot::NotFound, Some(&s1), WaitForNodeSignal, "machine resource is gone without deletion signal"),
            ("4 present, empty", Some(&plain), MachineSnapshot::Empty, Some(&s1), Noop, "machine snapshot is empty"),
            ("4 absent, empty", None, MachineSnapshot::Empty, None, Noop, "machine snapshot is empty"),
            ("4 taint, empty", Some(&del), MachineSnapshot::Empty, Some(&s1), Noop, "machine snapshot is empty"),
            ("5 absent, applied", None, MachineSnapshot::Exists(&g1), Some(&s1), ReportSucceeded, "node is absent but goal state is already applied"),
            ("6 absent, drift", None, MachineSnapshot::Exists(&g1), Some(&s0), ApplyGoalState, "node deletion observed and goal state is not applied"),
            ("6 absent, no state", None, MachineSnapshot::Exists(&g1), None, ApplyGoalState, "node deletion observed and goal state is not applied"),
            ("7 present, applied", Some(&plain), MachineSnapshot::Exists(&g1), Some(&s1), ReportSucceeded, "goal state is applied"),
            ("8 present, drift", Some(&plain), MachineSnapshot::Exists(&g1), Some(&s0), WaitForNodeSignal, "goal state differs but node deletion trigger is absent"),
            ("8 present, no state", Some(&plain), MachineSnapshot::Exists(&g1), None, WaitForNodeSignal, "goal state differs but node deletion trigger is absent"),
        ];
        for (name, n, m, s, action, reason) in rows {
            assert_eq!(decide(n, m, s), Decision { action, reason }, "row {name}");
        }
    }

    #[test]
    fn empty_settings_version_is_never_applied() {
        let g = goal("");
        let s = state("");
        assert!(!goal_applied(Some(&s), &g));
        assert_eq!(
            decide(None, MachineSnapshot::Exists(&g), Some(&s)).action,
            Action::ApplyGoalState
        );
        // Only the ETag counts, not the Kubernetes version.
        let mut s = state("etag-1");
        s.applied_kubernetes_version = "1.30.0".into();
        assert!(goal_applied(Some(&s), &goal("etag-1")));
    }

    #[test]
    fn deletion_taint_matching() {
        for (taint, want) in [
            ((DELETION_TAINT_KEY, Some("true"), "NoSchedule"), true),
            ((DELETION_TAINT_KEY, Some(" TRUE "), "NoSchedule"), true),
            ((DELETION_TAINT_KEY, Some("True"), "NoSchedule"), true),
            ((DELETION_TAINT_KEY, Some("false"), "NoSchedule"), false),
            ((DELETION_TAINT_KEY, Some(""), "NoSchedule"), false),
            ((DELETION_TAINT_KEY, None, "NoSchedule"), false),
            ((DELETION_TAINT_KEY, Some("true"), "NoExecute"), false),
            (
                (DELETION_TAINT_KEY, Some("true"), "PreferNoSchedule"),
                false,
            ),
            (
                ("kubernetes.azure.com/other", Some("true"), "NoSchedule"),
                false,
            ),
        ] {
            assert_eq!(has_deletion_taint(&node(&[taint])), want, "{taint:?}");
        }
        assert!(!has_deletion_taint(&Node::default()));
        // Among other taints.
        assert!(has_deletion_taint(&node(&[
            ("a", None, "NoExecute"),
            (DELETION_TAINT_KEY, Some("true"), "NoSchedule"),
        ])));
    }
}
