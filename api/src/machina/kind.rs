//! [`OperationKind`]: what a MachineOperation asks for, parsed once where the object is decoded.
//!
//! The API server accepts only the kinds of the CRD's enum (this type's [`OperationKind::KNOWN`]),
//! but an object written under a newer CRD, or read from a cluster with upstream's CRD, may
//! name a kind this agent does not know: it decodes as [`OperationKind::Unknown`], kept as
//! written, so the decision layer can fail the operation with a clear reason instead of the
//! whole watch failing to decode. On the wire it is the plain string, both ways.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a MachineOperation asks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OperationKind {
    /// `NodeReboot`: restart the active nspawn machine (the in-VM agent's).
    NodeReboot,
    /// `AgentUpgrade`: replace the agent (the in-VM agent's).
    AgentUpgrade,
    /// `AgentReset`: reset the node and stop the agent (the in-VM agent's).
    AgentReset,
    /// `HostReboot`: machina's host controllers'.
    HostReboot,
    /// `HostPowerOff`: machina's host controllers'.
    HostPowerOff,
    /// `HostPowerOn`: machina's host controllers'.
    HostPowerOn,
    /// `HostReplace`: machina's host controllers'.
    HostReplace,
    /// `HostReimage`: retired upstream, still accepted by the CRD; machina's host controllers'.
    HostReimage,
    /// A kind this agent does not know, as written (empty when the operation names none).
    Unknown(String),
}

/// Who carries out a kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handler {
    /// The node agent.
    Agent,
    /// machina's host, cloud and PXE controllers: the agent leaves the operation alone.
    HostControllers,
    /// Nobody this agent knows of.
    Unknown,
}

impl OperationKind {
    /// Every kind the CRD accepts, in its enum's order (upstream's latest enum, plus the retired
    /// `HostReimage`).
    pub const KNOWN: [OperationKind; 8] = [
        Self::NodeReboot,
        Self::AgentUpgrade,
        Self::AgentReset,
        Self::HostReboot,
        Self::HostPowerOff,
        Self::HostPowerOn,
        Self::HostReplace,
        Self::HostReimage,
    ];

    /// The kind `s` names, exactly as written (names are case-sensitive, as the CRD's enum);
    /// anything else is [`OperationKind::Unknown`].
    pub fn parse(s: &str) -> Self {
        Self::KNOWN
            .into_iter()
            .find(|k| k.as_str() == s)
            .unwrap_or_else(|| Self::Unknown(s.to_string()))
    }

    /// The kind as the API writes it.
    pub fn as_str(&self) -> &str {
        match self {
            Self::NodeReboot => "NodeReboot",
            Self::AgentUpgrade => "AgentUpgrade",
            Self::AgentReset => "AgentReset",
            Self::HostReboot => "HostReboot",
            Self::HostPowerOff => "HostPowerOff",
            Self::HostPowerOn => "HostPowerOn",
            Self::HostReplace => "HostReplace",
            Self::HostReimage => "HostReimage",
            Self::Unknown(s) => s,
        }
    }

    /// Who carries it out.
    pub fn handler(&self) -> Handler {
        match self {
            Self::NodeReboot | Self::AgentUpgrade | Self::AgentReset => Handler::Agent,
            Self::HostReboot
            | Self::HostPowerOff
            | Self::HostPowerOn
            | Self::HostReplace
            | Self::HostReimage => Handler::HostControllers,
            Self::Unknown(_) => Handler::Unknown,
        }
    }
}

impl Default for OperationKind {
    /// No kind named (an object that omits the field).
    fn default() -> Self {
        Self::Unknown(String::new())
    }
}

impl fmt::Display for OperationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&str> for OperationKind {
    fn from(s: &str) -> Self {
        Self::parse(s)
    }
}

impl PartialEq<str> for OperationKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for OperationKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for OperationKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for OperationKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(|s| Self::parse(&s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_kind_round_trips_and_others_are_kept_as_written() {
        for k in OperationKind::KNOWN {
            assert_eq!(OperationKind::parse(k.as_str()), k);
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{k}\""));
            assert_eq!(serde_json::from_str::<OperationKind>(&json).unwrap(), k);
        }
        for raw in ["", "nodereboot", "NodeReboot ", "NodeRestart"] {
            let k = OperationKind::parse(raw);
            assert_eq!(k, OperationKind::Unknown(raw.to_string()), "{raw:?}");
            assert_eq!(k.as_str(), raw);
            assert_eq!(k.handler(), Handler::Unknown);
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(serde_json::from_str::<OperationKind>(&json).unwrap(), k);
        }
        assert_eq!(OperationKind::default(), OperationKind::parse(""));
    }

    #[test]
    fn who_carries_out_each_kind() {
        let agent: Vec<&str> = OperationKind::KNOWN
            .iter()
            .filter(|k| k.handler() == Handler::Agent)
            .map(OperationKind::as_str)
            .collect();
        assert_eq!(agent, ["NodeReboot", "AgentUpgrade", "AgentReset"]);
        let host: Vec<&str> = OperationKind::KNOWN
            .iter()
            .filter(|k| k.handler() == Handler::HostControllers)
            .map(OperationKind::as_str)
            .collect();
        assert_eq!(
            host,
            [
                "HostReboot",
                "HostPowerOff",
                "HostPowerOn",
                "HostReplace",
                "HostReimage"
            ]
        );
    }
}
