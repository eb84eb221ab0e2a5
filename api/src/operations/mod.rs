//! MachineOperations as data and decisions: the reasons and results an operation's status
//! records, the local record's stages, and the decision layer (pure, table-tested) that the
//! agent's reconciler and `aks-flex-node operation run` both go through.
//!
//! - [`decide`]: which operations are this node's, parameter validation per kind, what to do
//!   given the operation and the local record (the table below);
//! - [`record`]: the local record's data ([`Record`], [`Stage`]); the agent stores it.
//!
//! The decision table's tests, row by row, are `api/tests/operations_decide.rs`.
//!
//! # Decisions
//!
//! [`decide::decide`] takes the operation, this node's facts (machine name, Node labels, whether
//! the agent is containerized, the time) and the local record of the operation (by UID):
//!
//! | operation | local record | decision |
//! |---|---|---|
//! | a `Host*` kind (machina's controllers') | any | ignore |
//! | `machineRef` names another machine, or the selector does not match the Node's labels (the Machine's when there is no Node), or the selector is empty (it matches no machine), or neither is set, or `status.claimedBy` names another node | none | ignore, naming the target |
//! | the same | any | refuse: drop the record and report it as a warning (the spec is immutable, so the target changed by tampering) |
//! | `Complete`/`Failed`, TTL set, `completedAt + ttl` reached | any | delete |
//! | `Complete`/`Failed`, TTL not reached | any | wait (requeue at expiry) |
//! | `Complete`/`Failed`, no TTL | any | ignore |
//! | `Pending`/empty, being deleted | none | ignore |
//! | `Pending`/empty | none, or `claiming` | parameters valid and kind supported: claim; else finish `Failed` without running (`UnknownKind`, `InvalidParameters`, `UnsupportedOperation`) |
//! | `Pending`/empty or `InProgress` | `executing` | resume: finish `Failed`/`Interrupted`, or what `Handlers::resume_interrupted` (the agent's) says (an AgentUpgrade's result from the upgrade record; while its handoff is pending, leave it `InProgress`) |
//! | `Pending`/empty or `InProgress` | `finished` | resume: finish with the recorded result |
//! | `InProgress` | `claiming` with this `startedAt` | resume: run it (the handler never started) |
//! | `InProgress` | `claiming` with another `startedAt` | forget the record (another agent claimed it) |
//! | `InProgress` | none | ignore (claimed by another agent) |
//! | unknown phase | any | ignore |

pub mod decide;
pub mod record;

use serde::{Deserialize, Serialize};

pub use decide::{Action, Decision, Facts, Failure, Resume, UpgradeRequest};
pub use record::{Record, Stage};

use crate::machina::OperationPhase;

/// Reason of a successful operation.
pub const SUCCEEDED: &str = "Succeeded";
/// Reason of a handler that failed.
pub const EXECUTION_FAILED: &str = "ExecutionFailed";
/// Reason of missing, unknown, malformed or conflicting parameters.
pub const INVALID_PARAMETERS: &str = "InvalidParameters";
/// Reason of a kind this agent knows but cannot carry out.
pub const UNSUPPORTED_OPERATION: &str = "UnsupportedOperation";
/// Reason of a kind nobody knows.
pub const UNKNOWN_KIND: &str = "UnknownKind";
/// Reason of an operation whose run the daemon's restart cut short (never run again).
pub const INTERRUPTED: &str = "Interrupted";
/// Reason of an operation whose drain timed out with pods left (`onDrainTimeout: Fail`); the
/// node is uncordoned and nothing was run.
pub const DRAIN_TIMED_OUT: &str = "DrainTimedOut";
/// Reason of an operation whose drain could not be carried out (the Node is missing, an
/// eviction or the cordon was refused); the node is uncordoned and nothing was run.
pub const DRAIN_FAILED: &str = "DrainFailed";
/// Reason of a NodeReboot after which the Node did not report Ready in time; it stays
/// cordoned.
pub const NODE_NOT_READY: &str = "NodeNotReady";
/// Reason of an operation not run because the cluster's disruption budget (`flex_api::budget`)
/// does not parse; the field is named.
pub const DISRUPTION_BUDGET_INVALID: &str = "DisruptionBudgetInvalid";
/// Reason of the `Completed` condition while an operation runs.
pub const IN_PROGRESS: &str = "InProgress";
/// Reason (status and `Completed` condition) of an operation claimed and waiting for a slot of
/// the cluster's disruption budget; its message names the holders. Back to [`IN_PROGRESS`]
/// once it has one.
pub const WAITING_FOR_DISRUPTION_SLOT: &str = "WaitingForDisruptionSlot";

/// How an operation ended, as its status records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationResult {
    /// `Complete` or `Failed`.
    pub phase: OperationPhase,
    /// Machine-readable reason (`Succeeded`, `ExecutionFailed`, …).
    pub reason: String,
    /// For people.
    pub message: String,
}

impl OperationResult {
    /// A `Complete`/`Succeeded` result.
    pub fn complete(message: impl Into<String>) -> Self {
        Self {
            phase: OperationPhase::Complete,
            reason: SUCCEEDED.into(),
            message: message.into(),
        }
    }

    /// A `Failed` result.
    pub fn failed(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            phase: OperationPhase::Failed,
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// Whether the operation completed.
    pub fn succeeded(&self) -> bool {
        self.phase == OperationPhase::Complete
    }
}
