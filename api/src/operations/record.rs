//! The local record of an operation an agent claimed, as data: how far it got ([`Stage`]) and
//! the result once finished. The agent keeps one file per UID (`aks_flex_node::flows::operations::
//! RecordStore`); the decision layer reads it to keep an operation from running twice.

use serde::{Deserialize, Serialize};

use super::OperationResult;
use crate::machina::OperationKind;

/// How far this agent got with an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Written before the status says `InProgress`; the handler has not been called.
    Claiming,
    /// Written before the handler is called.
    Executing,
    /// Written with the result, before the status says it.
    Finished,
}

impl Stage {
    /// As the record writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Claiming => "claiming",
            Self::Executing => "executing",
            Self::Finished => "finished",
        }
    }
}

/// One operation's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// Format version (1).
    pub version: u32,
    /// The operation's UID.
    pub uid: String,
    /// The operation's name.
    pub name: String,
    /// Its kind.
    pub kind: OperationKind,
    /// How far this agent got.
    pub stage: Stage,
    /// The `startedAt` this agent's claim wrote (`%Y-%m-%dT%H:%M:%SZ`).
    pub started_at: String,
    /// The result, once [`Stage::Finished`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<OperationResult>,
}
