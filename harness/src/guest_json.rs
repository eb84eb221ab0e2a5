//! The JSON files the checks read from the guest, as typed views (serde): the daemon's state
//! (`/etc/aks-flex-node/daemon-state.json`) and the agent's config
//! (`/etc/aks-flex-node/config.json`). Each view names only the fields the checks look at;
//! others are ignored, and a missing field reads as empty.

use std::collections::BTreeMap;

use serde::Deserialize;

/// The daemon's state on the host.
pub const DAEMON_STATE: &str = "/etc/aks-flex-node/daemon-state.json";
/// The agent's config on the host.
pub const CONFIG: &str = "/etc/aks-flex-node/config.json";

/// What the checks read of the daemon's state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DaemonState {
    /// The machine that runs the node (`kube1` or `kube2`).
    pub active_machine: String,
    /// The settings version (eTag) the daemon applied.
    pub applied_settings_version: String,
}

/// What the checks read of the agent's config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct AgentConfig {
    /// `agent`.
    pub agent: Agent,
    /// `azure`.
    pub azure: Azure,
    /// `node`.
    pub node: Node,
    /// `bootstrap`.
    pub bootstrap: Bootstrap,
}

/// `agent` of the agent's config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Agent {
    /// `agent.nodeName`.
    pub node_name: String,
}

/// `bootstrap` of the agent's config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Bootstrap {
    /// `bootstrap.registryAuth`.
    pub registry_auth: Option<RegistryAuth>,
}

/// `bootstrap.registryAuth` of the agent's config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RegistryAuth {
    /// The credentials file.
    pub config_file: String,
}

/// `azure` of the agent's config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Azure {
    /// `azure.targetCluster`.
    pub target_cluster: TargetCluster,
}

/// `azure.targetCluster` of the agent's config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct TargetCluster {
    /// The cluster's location, as the bootstrap inputs gave it.
    pub location: String,
}

/// `node` of the agent's config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Node {
    /// The node's labels.
    pub labels: BTreeMap<String, String>,
}

/// Parses `text`, the content of the guest's `file`, as `T`; the error names the file.
pub fn parse<T: serde::de::DeserializeOwned>(file: &str, text: &str) -> anyhow::Result<T> {
    serde_json::from_str(text).map_err(|e| anyhow::anyhow!("{file} is not what it should be ({e})"))
}

/// Parses `text`, the content of the guest's agent record `file` (the daemon state), as `T`:
/// the payload of the agent's record envelope (`{"format": "aks-flex-node.record/v1",
/// "sha256": ..., "payload": {...}}`), or the whole text for a record in the legacy format
/// (plain JSON). The checksum is the agent's to verify; the checks only read.
pub fn parse_record<T: serde::de::DeserializeOwned>(file: &str, text: &str) -> anyhow::Result<T> {
    let mut v: serde_json::Value = parse(file, text)?;
    let payload = match v.as_object_mut() {
        Some(o) if o.contains_key("format") => o.remove("payload").ok_or_else(|| {
            anyhow::anyhow!("{file} is not what it should be (a record without a payload)")
        })?,
        _ => v,
    };
    serde_json::from_value(payload)
        .map_err(|e| anyhow::anyhow!("{file} is not what it should be ({e})"))
}

/// What is wrong with a guest's agent record ([`record_integrity`]): each variant names the file
/// and is one way the agent's loader would refuse it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordFault {
    /// Not JSON at all.
    #[error("{file} is not JSON ({reason})")]
    NotJson {
        /// The record.
        file: String,
        /// The parser's words.
        reason: String,
    },
    /// JSON with a `format`, but not an envelope.
    #[error("{file}: not a record ({reason})")]
    NotARecord {
        /// The record.
        file: String,
        /// The parser's words.
        reason: String,
    },
    /// An envelope of another format.
    #[error("{file}: unknown record format {format:?}")]
    UnknownFormat {
        /// The record.
        file: String,
        /// Its `format`.
        format: String,
    },
    /// An envelope whose payload's bytes do not hash to its `sha256`.
    #[error("{file}: its payload does not match its sha256")]
    PayloadMismatch {
        /// The record.
        file: String,
    },
    /// A legacy plain JSON record without its `.sha256` sidecar.
    #[error("{file}: a legacy record without its .sha256")]
    LegacyWithoutSidecar {
        /// The record.
        file: String,
    },
    /// A legacy record whose sidecar holds another hash.
    #[error("{file}: a legacy record that does not match its .sha256")]
    LegacyMismatch {
        /// The record.
        file: String,
    },
}

/// Whether the guest's agent record `file` (its bytes `text`, and the legacy sidecar's content
/// `sidecar` when the guest has one) is one the agent can load: an envelope whose `sha256` is
/// the hash of its payload's bytes as they stand in the file, or a legacy plain JSON whose
/// sidecar holds its hash. The harness's own reading of the format (documented in the agent's
/// `state` module), an oracle independent of the agent's loader. `Err` says what is wrong.
pub fn record_integrity(file: &str, text: &str, sidecar: Option<&str>) -> Result<(), RecordFault> {
    use sha2::{Digest, Sha256};
    #[derive(serde::Deserialize)]
    struct Envelope<'a> {
        format: String,
        sha256: String,
        #[serde(borrow)]
        payload: &'a serde_json::value::RawValue,
    }
    let sum = |bytes: &[u8]| hex::encode(Sha256::digest(bytes));
    let file = file.to_string();
    let looks_enveloped = serde_json::from_str::<serde_json::Value>(text)
        .map_err(|e| RecordFault::NotJson {
            file: file.clone(),
            reason: e.to_string(),
        })?
        .get("format")
        .is_some();
    if looks_enveloped {
        let env: Envelope<'_> =
            serde_json::from_str(text).map_err(|e| RecordFault::NotARecord {
                file: file.clone(),
                reason: e.to_string(),
            })?;
        if env.format != "aks-flex-node.record/v1" {
            return Err(RecordFault::UnknownFormat {
                file,
                format: env.format,
            });
        }
        if sum(env.payload.get().as_bytes()) != env.sha256 {
            return Err(RecordFault::PayloadMismatch { file });
        }
        return Ok(());
    }
    match sidecar {
        None => Err(RecordFault::LegacyWithoutSidecar { file }),
        Some(s) if s.trim() == sum(text.as_bytes()) => Ok(()),
        Some(_) => Err(RecordFault::LegacyMismatch { file }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_integrity_checks_envelopes_and_legacy_pairs() {
        use sha2::{Digest, Sha256};
        let payload = "{\n    \"activeMachine\": \"kube2\"\n  }";
        let sum = hex::encode(Sha256::digest(payload.as_bytes()));
        let good = format!(
            "{{\n  \"format\": \"aks-flex-node.record/v1\",\n  \"sha256\": \"{sum}\",\n  \"payload\": {payload}\n}}\n"
        );
        assert_eq!(record_integrity("s", &good, None), Ok(()));
        // One space more in the payload: the sum no longer matches.
        let spaced = good.replacen("\"kube2\"", "\"kube2\" ", 1);
        assert!(
            record_integrity("s", &spaced, None)
                .unwrap_err()
                .to_string()
                .contains("does not match")
        );
        let other = good.replacen("record/v1", "record/v9", 1);
        assert!(
            record_integrity("s", &other, None)
                .unwrap_err()
                .to_string()
                .contains("unknown record format")
        );
        assert!(
            record_integrity("s", "{\"format\"", None)
                .unwrap_err()
                .to_string()
                .contains("not JSON")
        );
        let legacy = "{\"activeMachine\": \"kube1\"}\n";
        let lsum = format!("{}\n", hex::encode(Sha256::digest(legacy.as_bytes())));
        assert_eq!(record_integrity("s", legacy, Some(&lsum)), Ok(()));
        assert!(
            record_integrity("s", legacy, None)
                .unwrap_err()
                .to_string()
                .contains("without its .sha256")
        );
        assert!(
            record_integrity("s", legacy, Some("00"))
                .unwrap_err()
                .to_string()
                .contains("does not match")
        );
    }

    #[test]
    fn views_read_their_fields_and_ignore_the_rest() {
        let s: DaemonState = parse(
            DAEMON_STATE,
            r#"{"activeMachine": "kube2", "appliedSettingsVersion": "harness-2", "x": 1}"#,
        )
        .unwrap();
        assert_eq!(s.active_machine, "kube2");
        assert_eq!(s.applied_settings_version, "harness-2");
        let empty: DaemonState = parse(DAEMON_STATE, "{}").unwrap();
        assert_eq!(empty, DaemonState::default());
        // The agent's record envelope (as it writes the state) and the legacy plain JSON.
        let enveloped = "{\n  \"format\": \"aks-flex-node.record/v1\",\n  \"sha256\": \"00\",\n  \"payload\": {\n    \"activeMachine\": \"kube2\"\n  }\n}\n";
        let s: DaemonState = parse_record(DAEMON_STATE, enveloped).unwrap();
        assert_eq!(s.active_machine, "kube2");
        let s: DaemonState = parse_record(DAEMON_STATE, r#"{"activeMachine": "kube1"}"#).unwrap();
        assert_eq!(s.active_machine, "kube1");
        let e = parse_record::<DaemonState>(DAEMON_STATE, r#"{"format": "x"}"#).unwrap_err();
        assert!(e.to_string().contains("without a payload"), "{e}");
        let empty: DaemonState = parse(DAEMON_STATE, "{}").unwrap();
        assert_eq!(empty, DaemonState::default());

        let c: AgentConfig = parse(
            CONFIG,
            r#"{"azure": {"targetCluster": {"location": "x$(y)", "resourceId": "/s"}},
                "node": {"labels": {"harness/a": "true"}}, "agent": {},
                "bootstrap": {"registryAuth": {"configFile": "/etc/f.json"}}}"#,
        )
        .unwrap();
        assert_eq!(c.azure.target_cluster.location, "x$(y)");
        assert!(c.node.labels.contains_key("harness/a"));
        assert_eq!(
            c.bootstrap.registry_auth.unwrap().config_file,
            "/etc/f.json"
        );
        let e = parse::<AgentConfig>(CONFIG, "not json").unwrap_err();
        assert!(e.to_string().starts_with(CONFIG), "{e}");
    }
}
