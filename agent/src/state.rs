//! The agent's durable records: the daemon state (`/etc/aks-flex-node/daemon-state.json`), the
//! bootstrap mark ([`BOOTSTRAP_MARK_PATH`]), the repave journal, the operation records and the
//! upgrade record, each one file (0600) written by [`JsonStore`].
//!
//! # Format
//!
//! A record is one JSON file holding its own checksum, the *envelope*:
//!
//! ```text
//! {
//!   "format": "aks-flex-node.record/v1",
//!   "sha256": "<lowercase hex SHA-256 of the payload's bytes>",
//!   "payload": {
//!     ...the record, 2-space indented...
//!   }
//! }
//! ```
//!
//! The checksum covers the payload's bytes exactly as they stand in the file, from its opening
//! `{` to its closing `}`: the loader takes that slice from the file as it is (serde_json's
//! `RawValue`) and hashes it, never a re-serialization, so a changed byte anywhere in the
//! payload — even a space — fails the check, and no decoder's re-encoding can make a tampered
//! payload pass. The envelope's other keys are checked for what they are: an unknown `format`
//! is an error, a malformed `sha256` is a mismatch.
//!
//! # Writing
//!
//! [`JsonStore::save`] is one [`HostFs::write_atomic_with`]: the whole file written and synced
//! under a temporary name in the same directory, renamed over the record (which keeps the
//! replaced file's SELinux label), the directory synced: at any instant the record is the old
//! one or the new one, whole. The fault point `store.save-midway:<file name>` sits right before
//! the rename, the new file complete and synced, the old record still in place.
//!
//! # The legacy format
//!
//! Agents before this one wrote the JSON alone and its checksum in a sidecar `<path>.sha256`
//! (lowercase hex of the JSON's bytes, plus `\n`), in two writes. A file that is not an envelope
//! is read that way when its sidecar matches it (nodes bootstrapped by this project's own
//! earlier builds have such files; no agent of that format was released); the next save writes
//! the envelope and removes the sidecar. A sidecar left next to an envelope (a save
//! interrupted after its rename) is ignored.
//!
//! # Errors
//!
//! A missing record is `Ok(None)`. A record that is there but cannot be trusted (truncated,
//! not JSON, an unknown format, a checksum mismatch, a payload that does not decode, a legacy
//! file without its sidecar) is a [`StateError`] for which [`StateError::is_unreadable`] holds;
//! each caller decides what that means for it: an unreadable daemon state stops the reconcile
//! (reported `Failed`, nothing touched); an unreadable operation record counts as an operation
//! that started (never run twice); an unreadable upgrade record counts as none; an unreadable
//! repave journal keeps the side the daemon state names (else the one enabled machine),
//! stopping and removing the other, and is deleted (`crate::flows::repave`): never a node
//! without a machine.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use flex_host::fs::{FsError, HostFs};

/// Default location of the state file.
pub const STATE_PATH: &str = "/etc/aks-flex-node/daemon-state.json";

/// The envelope's `format`.
pub const FORMAT: &str = "aks-flex-node.record/v1";

pub use flex_api::goal::{ActiveMachineError, DaemonState, KUBE1, KUBE2};

/// A record problem.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading or writing failed.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// A legacy record's checksum file is missing or unreadable.
    #[error("read record checksum {path}: {reason}")]
    ChecksumUnreadable {
        /// The checksum file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The checksum does not match the record.
    #[error("record checksum mismatch for {0}")]
    ChecksumMismatch(PathBuf),
    /// The file is not a record envelope this agent reads: truncated, not JSON, or an unknown
    /// format.
    #[error("read record {path}: {reason}")]
    Corrupt {
        /// The record file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The payload does not decode.
    #[error("decode state file {path}: {reason}")]
    Decode {
        /// The record file.
        path: PathBuf,
        /// The decoder's message.
        reason: String,
    },
    /// The value does not encode.
    #[error("encode record {path}: {reason}")]
    Encode {
        /// The record file.
        path: PathBuf,
        /// The encoder's message.
        reason: String,
    },
    /// The active machine is missing or not `kube1`/`kube2`.
    #[error(transparent)]
    ActiveMachine(#[from] ActiveMachineError),
}

impl StateError {
    /// Whether the record is there but its content cannot be trusted (as opposed to the file
    /// system failing): the caller decides what an unreadable record means for it.
    pub fn is_unreadable(&self) -> bool {
        matches!(
            self,
            StateError::ChecksumUnreadable { .. }
                | StateError::ChecksumMismatch(_)
                | StateError::Corrupt { .. }
                | StateError::Decode { .. }
        )
    }
}

/// One record file in the envelope format (see the module documentation), saved atomically
/// (0600) and verified on load. [`StateStore`] is the daemon state.
#[derive(Clone, Debug)]
pub struct JsonStore<T> {
    fs: HostFs,
    path: PathBuf,
    _t: std::marker::PhantomData<fn() -> T>,
}

/// The daemon state store.
pub type StateStore = JsonStore<DaemonState>;

impl StateStore {
    /// The store at the default path.
    pub fn new(fs: HostFs) -> Self {
        Self::at(fs, STATE_PATH)
    }
}

/// Where `start` marks the bootstrap complete, as its very last step (`reset` removes it as its
/// first).
pub const BOOTSTRAP_MARK_PATH: &str = "/etc/aks-flex-node/bootstrap-complete.json";

/// The "bootstrap complete" mark: written by `start` after the daemon state is saved and the
/// agent's and recovery units are installed and started, so its presence means nothing of the
/// bootstrap is left to do. A daemon state without it is a bootstrap that did not finish (or one
/// of an agent that wrote no mark): `bootstrap-node` finishes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapMark {
    /// Format version (1).
    pub version: u32,
    /// The agent version that wrote it.
    pub agent_version: String,
}

impl BootstrapMark {
    /// The mark this agent writes.
    pub fn now() -> Self {
        Self {
            version: 1,
            agent_version: env!("CARGO_PKG_VERSION").into(),
        }
    }
}

/// Where `start` marks that a bootstrap began, before it changes the host (same format as the
/// complete mark). With no daemon state beside it, a `start` was cut short before its machine
/// came up: its own machine may hold the ports preflight checks, so `bootstrap-node` runs
/// `start` again without preflight (which that earlier run passed). A `start` that returns an
/// error removes it (only a kill leaves it), and `reset` removes it first.
pub const BOOTSTRAP_STARTED_PATH: &str = "/etc/aks-flex-node/bootstrap-started.json";

/// The bootstrap mark's store.
pub type BootstrapMarkStore = JsonStore<BootstrapMark>;

impl BootstrapMarkStore {
    /// The mark at [`BOOTSTRAP_MARK_PATH`].
    pub fn new(fs: HostFs) -> Self {
        Self::at(fs, BOOTSTRAP_MARK_PATH)
    }

    /// The "bootstrap started" mark at [`BOOTSTRAP_STARTED_PATH`].
    pub fn started(fs: HostFs) -> Self {
        Self::at(fs, BOOTSTRAP_STARTED_PATH)
    }

    /// Whether the mark is there and readable (a damaged mark counts as none: the finishing
    /// it leads to is idempotent).
    pub fn is_marked(&self) -> bool {
        match self.load() {
            Ok(m) => m.is_some(),
            Err(e) => {
                tracing::warn!(error = %e, "bootstrap mark unreadable; taking the bootstrap as unfinished");
                false
            }
        }
    }
}

/// The envelope as read: the payload is the file's own bytes.
#[derive(Deserialize)]
struct Envelope<'a> {
    format: String,
    sha256: String,
    #[serde(borrow)]
    payload: &'a RawValue,
}

/// Just enough of a JSON object to tell an envelope from a legacy record: whether it has a
/// `format` key at all (whatever its value: a `null` or damaged one is a damaged envelope, not a
/// legacy record).
#[derive(Deserialize)]
struct Probe {
    #[serde(default, deserialize_with = "present")]
    format: bool,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(d).map(|_| true)
}

impl<T: Serialize + serde::de::DeserializeOwned> JsonStore<T> {
    /// A store at `path` (a host path).
    pub fn at(fs: HostFs, path: impl Into<PathBuf>) -> Self {
        Self {
            fs,
            path: path.into(),
            _t: std::marker::PhantomData,
        }
    }

    /// The file's host path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn sibling(&self, prefix: &str, suffix: &str) -> PathBuf {
        let name = self.path.file_name().unwrap_or_default().to_string_lossy();
        self.path.with_file_name(format!("{prefix}{name}{suffix}"))
    }

    /// The legacy checksum sidecar.
    fn checksum_path(&self) -> PathBuf {
        self.sibling("", ".sha256")
    }

    /// Where saves of this project's earlier builds wrote the new file before renaming it over
    /// the record (a kill could leave it; [`Self::delete`] removes it).
    fn temp_path(&self) -> PathBuf {
        self.sibling(".", ".new")
    }

    fn corrupt(&self, reason: impl Into<String>) -> StateError {
        StateError::Corrupt {
            path: self.path.clone(),
            reason: reason.into(),
        }
    }

    /// Loads the value; `Ok(None)` when there is no file.
    pub fn load(&self) -> Result<Option<T>, StateError> {
        let Some(bytes) = self.fs.read(&self.path)? else {
            return Ok(None);
        };
        let payload: &[u8] = match serde_json::from_slice::<Probe>(&bytes) {
            Ok(Probe { format: true }) => self.open_envelope(&bytes)?,
            Ok(Probe { format: false }) => self.check_legacy(&bytes)?,
            // Not a JSON object at all: a legacy file with a matching sidecar would say so (and
            // fail to decode); anything else is a damaged record.
            Err(e) if self.fs.exists(&self.checksum_path()) => {
                self.check_legacy(&bytes)?;
                return Err(StateError::Decode {
                    path: self.path.clone(),
                    reason: e.to_string(),
                });
            }
            Err(e) => return Err(self.corrupt(format!("not a record: {e}"))),
        };
        serde_json::from_slice(payload)
            .map(Some)
            .map_err(|e| StateError::Decode {
                path: self.path.clone(),
                reason: e.to_string(),
            })
    }

    /// The verified payload bytes of an envelope.
    fn open_envelope<'a>(&self, bytes: &'a [u8]) -> Result<&'a [u8], StateError> {
        let env: Envelope<'a> = serde_json::from_slice(bytes)
            .map_err(|e| self.corrupt(format!("not a record envelope: {e}")))?;
        if env.format != FORMAT {
            return Err(self.corrupt(format!(
                "unknown record format {:?} (this agent reads {FORMAT:?})",
                env.format
            )));
        }
        let payload = env.payload.get().as_bytes();
        if env.sha256 != checksum(payload) {
            return Err(StateError::ChecksumMismatch(self.path.clone()));
        }
        Ok(payload)
    }

    /// `bytes` when the legacy sidecar matches them.
    fn check_legacy<'a>(&self, bytes: &'a [u8]) -> Result<&'a [u8], StateError> {
        let sum_path = self.checksum_path();
        let sum = match self.fs.read_to_string(&sum_path) {
            Ok(Some(s)) => s,
            Ok(None) => {
                return Err(StateError::ChecksumUnreadable {
                    path: sum_path,
                    reason: "file does not exist".into(),
                });
            }
            Err(e) => {
                return Err(StateError::ChecksumUnreadable {
                    path: sum_path,
                    reason: e.cause.to_string(),
                });
            }
        };
        if sum.trim() != checksum(bytes) {
            return Err(StateError::ChecksumMismatch(self.path.clone()));
        }
        Ok(bytes)
    }

    /// The file [`Self::save`] writes for `value`.
    pub fn encode(&self, value: &T) -> Result<Vec<u8>, StateError> {
        let pretty = serde_json::to_string_pretty(value).map_err(|e| StateError::Encode {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        // Nested one level: JSON strings hold no raw newline, so this only moves whitespace
        // between tokens. The checksum is of these bytes, as they stand in the file.
        let payload = pretty.replace('\n', "\n  ");
        let sum = checksum(payload.as_bytes());
        Ok(format!(
            "{{\n  \"format\": \"{FORMAT}\",\n  \"sha256\": \"{sum}\",\n  \"payload\": {payload}\n}}\n"
        )
        .into_bytes())
    }

    /// Saves the value: the envelope, complete and synced under a temporary name, renamed over
    /// the record (mode 0600); then the legacy sidecar, if any, is removed.
    pub fn save(&self, value: &T) -> Result<(), StateError> {
        let point = format!(
            "store.save-midway:{}",
            self.path.file_name().unwrap_or_default().to_string_lossy()
        );
        self.save_with(value, &mut || flex_host::fault::point(&point))
    }

    /// [`Self::save`] with `before_rename` where the fault point goes (tests interrupt a real
    /// save there).
    fn save_with(&self, value: &T, before_rename: &mut dyn FnMut()) -> Result<(), StateError> {
        let bytes = self.encode(value)?;
        self.fs
            .write_atomic_with(&self.path, &bytes, 0o600, before_rename)?;
        self.fs.remove_file(&self.checksum_path())?;
        Ok(())
    }

    /// Removes the record (with a legacy sidecar and an earlier build's unfinished save's
    /// temporary file; missing files are fine).
    pub fn delete(&self) -> Result<(), StateError> {
        self.fs.remove_file(&self.path)?;
        self.fs.remove_file(&self.checksum_path())?;
        self.fs.remove_file(&self.temp_path())?;
        Ok(())
    }
}

/// Lowercase hex SHA-256.
pub fn checksum(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    // All tests: a real HostFs on a temporary directory; nothing is faked.

    fn store() -> (tempfile::TempDir, StateStore) {
        let d = tempfile::tempdir().unwrap();
        let s = StateStore::new(HostFs::new(d.path()));
        (d, s)
    }

    fn sample() -> DaemonState {
        DaemonState {
            applied_settings_version: "repave-token-1783000000".into(),
            applied_kubernetes_version: "1.35.3".into(),
            previous_settings_version: "1.35.0".into(),
            previous_kubernetes_version: "1.35.0".into(),
            active_machine: "kube2".into(),
        }
    }

    fn real(d: &tempfile::TempDir, p: &str) -> PathBuf {
        d.path().join(p.trim_start_matches('/'))
    }

    const SIDECAR: &str = "/etc/aks-flex-node/daemon-state.json.sha256";
    const TEMP: &str = "/etc/aks-flex-node/.daemon-state.json.new";

    /// The legacy two-file format, as the previous agent wrote it.
    fn write_legacy(d: &tempfile::TempDir, value: &DaemonState) -> Vec<u8> {
        let fs = HostFs::new(d.path());
        let mut json = serde_json::to_vec_pretty(value).unwrap();
        json.push(b'\n');
        fs.write_atomic(Path::new(STATE_PATH), &json, 0o600)
            .unwrap();
        fs.write_atomic(
            Path::new(SIDECAR),
            format!("{}\n", checksum(&json)).as_bytes(),
            0o600,
        )
        .unwrap();
        json
    }

    #[test]
    fn missing_state_is_none() {
        let (_d, s) = store();
        assert_eq!(s.load().unwrap(), None);
    }

    #[test]
    fn save_load_roundtrip_and_exact_format() {
        let (d, s) = store();
        s.save(&sample()).unwrap();
        assert_eq!(s.load().unwrap(), Some(sample()));
        let json = std::fs::read_to_string(real(&d, STATE_PATH)).unwrap();
        insta::assert_snapshot!(json, @r#"
        {
          "format": "aks-flex-node.record/v1",
          "sha256": "912cb26b6ccaa2097d591e1e37a60f1a2a3b498324a98a0a6ee9487c03ee12b6",
          "payload": {
            "appliedSettingsVersion": "repave-token-1783000000",
            "appliedKubernetesVersion": "1.35.3",
            "previousSettingsVersion": "1.35.0",
            "previousKubernetesVersion": "1.35.0",
            "activeMachine": "kube2"
          }
        }
        "#);
        // The checksum is of the payload's bytes as they stand in the file.
        let start = json.find("\"payload\": ").unwrap() + "\"payload\": ".len();
        let payload = &json[start..json.len() - "\n}\n".len()];
        assert!(json.contains(&checksum(payload.as_bytes())));
        let fs = HostFs::new(d.path());
        assert_eq!(fs.mode(Path::new(STATE_PATH)), Some(0o600));
        // One file: no sidecar, no temporary left behind.
        let names: Vec<_> = std::fs::read_dir(d.path().join("etc/aks-flex-node"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["daemon-state.json"]);
    }

    #[test]
    fn a_flipped_byte_anywhere_in_the_payload_is_a_typed_error() {
        let (d, s) = store();
        s.save(&sample()).unwrap();
        let path = real(&d, STATE_PATH);
        let good = std::fs::read(&path).unwrap();
        let start = good.windows(10).position(|w| w == b"\"payload\":").unwrap();
        for i in start + 11..good.len() - 2 {
            let mut bad = good.clone();
            bad[i] ^= 0x01;
            std::fs::write(&path, &bad).unwrap();
            let e = s.load().unwrap_err();
            assert!(e.is_unreadable(), "byte {i}: {e}");
        }
        // Whitespace only, still valid JSON decoding to the same value: still a mismatch (the
        // check is of the bytes, not of a re-serialization).
        let spaced = String::from_utf8(good.clone())
            .unwrap()
            .replace("\"activeMachine\": ", "\"activeMachine\":  ");
        std::fs::write(&path, spaced).unwrap();
        assert!(matches!(
            s.load().unwrap_err(),
            StateError::ChecksumMismatch(_)
        ));
        // A tampered value with the sidecar-era trick (no sidecar involved now) is caught too.
        let tampered = String::from_utf8(good).unwrap().replace("kube2", "kube1");
        std::fs::write(&path, tampered).unwrap();
        assert_eq!(
            s.load().unwrap_err().to_string(),
            "record checksum mismatch for /etc/aks-flex-node/daemon-state.json"
        );
    }

    #[test]
    fn a_truncated_file_is_a_typed_error_naming_the_file() {
        let (d, s) = store();
        s.save(&sample()).unwrap();
        let path = real(&d, STATE_PATH);
        let good = std::fs::read(&path).unwrap();
        for len in [0, 1, good.len() / 2, good.len() - 3] {
            std::fs::write(&path, &good[..len]).unwrap();
            let e = s.load().unwrap_err();
            assert!(e.is_unreadable(), "{len}: {e}");
            assert!(
                e.to_string()
                    .starts_with("read record /etc/aks-flex-node/daemon-state.json: "),
                "{e}"
            );
        }
    }

    #[test]
    fn unknown_format_and_bad_payload_are_typed_errors() {
        let (d, s) = store();
        let path = real(&d, STATE_PATH);
        let payload = "{\"activeMachine\": 7}";
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(
            &path,
            format!(
                "{{\"format\": \"{FORMAT}\", \"sha256\": \"{}\", \"payload\": {payload}}}",
                checksum(payload.as_bytes())
            ),
        )
        .unwrap();
        let e = s.load().unwrap_err();
        assert!(matches!(e, StateError::Decode { .. }), "{e}");
        assert!(e.is_unreadable());
        std::fs::write(
            &path,
            "{\"format\": \"aks-flex-node.record/v9\", \"sha256\": \"\", \"payload\": {}}",
        )
        .unwrap();
        let e = s.load().unwrap_err();
        assert!(e.to_string().contains("unknown record format"), "{e}");
        assert!(e.is_unreadable());
        // A damaged envelope (its format null or not a string) is reported as one, not as a
        // legacy record missing its sidecar.
        for format in ["null", "7", "{}"] {
            std::fs::write(
                &path,
                format!("{{\"format\": {format}, \"sha256\": \"\", \"payload\": {{}}}}"),
            )
            .unwrap();
            let e = s.load().unwrap_err();
            assert!(matches!(e, StateError::Corrupt { .. }), "{format}: {e}");
            assert!(
                e.to_string().contains("not a record envelope"),
                "{format}: {e}"
            );
            assert!(!e.to_string().contains(".sha256"), "{format}: {e}");
        }
    }

    #[test]
    fn legacy_two_file_record_loads_and_the_next_save_migrates_it() {
        let (d, s) = store();
        write_legacy(&d, &sample());
        assert_eq!(s.load().unwrap(), Some(sample()));
        let mut next = sample();
        next.active_machine = "kube1".into();
        s.save(&next).unwrap();
        let fs = HostFs::new(d.path());
        assert!(!fs.exists(Path::new(SIDECAR)), "the sidecar is removed");
        let json = std::fs::read_to_string(real(&d, STATE_PATH)).unwrap();
        assert!(json.starts_with("{\n  \"format\": \"aks-flex-node.record/v1\""));
        assert_eq!(s.load().unwrap(), Some(next));
    }

    #[test]
    fn legacy_record_that_does_not_match_its_sidecar_or_lacks_it_is_a_typed_error() {
        let (d, s) = store();
        let json = write_legacy(&d, &sample());
        let path = real(&d, STATE_PATH);
        let tampered = String::from_utf8(json.clone())
            .unwrap()
            .replace("kube2", "kube1");
        std::fs::write(&path, tampered).unwrap();
        let e = s.load().unwrap_err();
        assert!(matches!(e, StateError::ChecksumMismatch(_)), "{e}");
        // The old agent's torn write: the JSON without its checksum.
        std::fs::remove_file(real(&d, SIDECAR)).unwrap();
        std::fs::write(&path, &json).unwrap();
        let e = s.load().unwrap_err();
        assert!(e.is_unreadable());
        assert!(e.to_string().contains("daemon-state.json.sha256"), "{e}");
        // Legacy bytes that are not JSON, with a matching sidecar: a decode error.
        let fs = HostFs::new(d.path());
        fs.write_atomic(Path::new(STATE_PATH), b"not json", 0o600)
            .unwrap();
        fs.write_atomic(
            Path::new(SIDECAR),
            format!("{}\n", checksum(b"not json")).as_bytes(),
            0o600,
        )
        .unwrap();
        let e = s.load().unwrap_err();
        assert!(
            e.to_string()
                .starts_with("decode state file /etc/aks-flex-node/daemon-state.json"),
            "{e}"
        );
    }

    #[test]
    fn a_stale_sidecar_next_to_an_envelope_is_ignored() {
        // A migrating save killed after its rename, before it removed the sidecar.
        let (d, s) = store();
        write_legacy(&d, &sample());
        let mut next = sample();
        next.active_machine = "kube1".into();
        let bytes = s.encode(&next).unwrap();
        HostFs::new(d.path())
            .write_atomic(Path::new(STATE_PATH), &bytes, 0o600)
            .unwrap();
        assert_eq!(s.load().unwrap(), Some(next));
    }

    /// A real save interrupted where `store.save-midway` sits: the hook panics, which (like a
    /// kill) leaves the save's temporary file and skips the rename. Real: the files in a
    /// temporary root and the save itself; only the interruption is the test's.
    #[test]
    fn a_save_killed_between_temp_write_and_rename_leaves_the_old_record_loadable() {
        fn interrupted_save(s: &StateStore, value: &DaemonState) {
            let mut kill = || panic!("killed at store.save-midway");
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                s.save_with(value, &mut kill)
            }));
            assert!(r.is_err(), "the hook was not reached");
        }
        let mut next = sample();
        next.active_machine = "kube1".into();
        for legacy in [false, true] {
            let (d, s) = store();
            if legacy {
                write_legacy(&d, &sample());
            } else {
                s.save(&sample()).unwrap();
            }
            let before = std::fs::read(d.path().join(STATE_PATH.trim_start_matches('/'))).unwrap();
            interrupted_save(&s, &next);
            let after = std::fs::read(d.path().join(STATE_PATH.trim_start_matches('/'))).unwrap();
            assert_eq!(
                before, after,
                "legacy={legacy}: the record was written in place"
            );
            assert_eq!(s.load().unwrap(), Some(sample()), "legacy={legacy}");
            // The next save completes.
            s.save(&next).unwrap();
            assert_eq!(s.load().unwrap(), Some(next.clone()), "legacy={legacy}");
        }
    }

    #[test]
    fn delete_removes_record_sidecar_and_temp_and_is_idempotent() {
        let (d, s) = store();
        write_legacy(&d, &sample());
        let fs = HostFs::new(d.path());
        fs.write_atomic(Path::new(TEMP), b"x", 0o600).unwrap();
        s.delete().unwrap();
        assert_eq!(s.load().unwrap(), None);
        for p in [STATE_PATH, SIDECAR, TEMP] {
            assert!(!fs.exists(Path::new(p)), "{p}");
        }
        s.save(&sample()).unwrap();
        s.delete().unwrap();
        s.delete().unwrap();
        assert_eq!(s.load().unwrap(), None);
    }

    #[test]
    fn active_machine_validation() {
        let mut st = sample();
        assert_eq!(st.active().unwrap(), "kube2");
        st.active_machine = String::new();
        assert_eq!(
            st.active().unwrap_err().to_string(),
            "daemon state is missing active machine"
        );
        st.active_machine = "kube3".into();
        assert_eq!(
            st.active().unwrap_err().to_string(),
            "daemon state active machine \"kube3\" is invalid"
        );
    }
}
