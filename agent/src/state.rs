//! The daemon state file, `/etc/aks-flex-node/daemon-state.json` (0600), and its checksum
//! sidecar `<path>.sha256` (0600): the lowercase hex SHA-256 of the exact JSON bytes plus `\n`.
//!
//! Load: a missing state file is "no state"; a present state file with an unreadable or
//! mismatching checksum, or JSON that does not decode, is an error naming the file. Save writes
//! the JSON, then the checksum, each atomically. Delete removes both.

use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::fs::{FsError, HostFs};

/// Default location of the state file.
pub const STATE_PATH: &str = "/etc/aks-flex-node/daemon-state.json";

pub use flex_api::goal::{ActiveMachineError, DaemonState, KUBE1, KUBE2};

/// A state file problem.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading or writing failed.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// The checksum file is missing or unreadable.
    #[error("read daemon state checksum {path}: {reason}")]
    ChecksumUnreadable {
        /// The checksum file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The checksum does not match the state file.
    #[error("daemon state checksum mismatch for {0}")]
    ChecksumMismatch(PathBuf),
    /// The JSON does not decode.
    #[error("decode state file {path}: {reason}")]
    Decode {
        /// The state file.
        path: PathBuf,
        /// The decoder's message.
        reason: String,
    },
    /// The active machine is missing or not `kube1`/`kube2`.
    #[error(transparent)]
    ActiveMachine(#[from] ActiveMachineError),
}

/// A JSON file with a `.sha256` sidecar, saved atomically (JSON first, checksum second, both
/// 0600) and verified on load. [`StateStore`] is the daemon state; the repave journal uses the
/// same format.
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

    fn checksum_path(&self) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(".sha256");
        PathBuf::from(p)
    }

    /// Loads the value; `Ok(None)` when there is no file.
    pub fn load(&self) -> Result<Option<T>, StateError> {
        let Some(bytes) = self.fs.read(&self.path)? else {
            return Ok(None);
        };
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
        if sum.trim() != checksum(&bytes) {
            return Err(StateError::ChecksumMismatch(self.path.clone()));
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| StateError::Decode {
                path: self.path.clone(),
                reason: e.to_string(),
            })
    }

    /// Saves the value: the JSON (2-space indent, trailing newline), then its checksum, each
    /// atomically with mode 0600.
    pub fn save(&self, value: &T) -> Result<(), StateError> {
        let mut bytes = serde_json::to_vec_pretty(value).map_err(|e| StateError::Decode {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        bytes.push(b'\n');
        self.fs.write_atomic(&self.path, &bytes, 0o600)?;
        flex_host::fault::point(&format!(
            "store.save-midway:{}",
            self.path.file_name().unwrap_or_default().to_string_lossy()
        ));
        let sum = format!("{}\n", checksum(&bytes));
        self.fs
            .write_atomic(&self.checksum_path(), sum.as_bytes(), 0o600)?;
        Ok(())
    }

    /// Removes the file and its checksum (missing files are fine).
    pub fn delete(&self) -> Result<(), StateError> {
        self.fs.remove_file(&self.path)?;
        self.fs.remove_file(&self.checksum_path())?;
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
        let real = d.path().join("etc/aks-flex-node/daemon-state.json");
        let json = std::fs::read_to_string(&real).unwrap();
        insta::assert_snapshot!(json, @r#"
        {
          "appliedSettingsVersion": "repave-token-1783000000",
          "appliedKubernetesVersion": "1.35.3",
          "previousSettingsVersion": "1.35.0",
          "previousKubernetesVersion": "1.35.0",
          "activeMachine": "kube2"
        }
        "#);
        let sum = std::fs::read_to_string(real.with_extension("json.sha256")).unwrap();
        assert_eq!(sum, format!("{}\n", checksum(json.as_bytes())));
        let fs = HostFs::new(d.path());
        assert_eq!(fs.mode(Path::new(STATE_PATH)), Some(0o600));
        assert_eq!(
            fs.mode(Path::new("/etc/aks-flex-node/daemon-state.json.sha256")),
            Some(0o600)
        );
    }

    #[test]
    fn tampered_state_is_a_mismatch_naming_the_file() {
        let (d, s) = store();
        s.save(&sample()).unwrap();
        let real = d.path().join("etc/aks-flex-node/daemon-state.json");
        let tampered = std::fs::read_to_string(&real)
            .unwrap()
            .replace("kube2", "kube1");
        std::fs::write(&real, tampered).unwrap();
        let e = s.load().unwrap_err().to_string();
        assert_eq!(
            e,
            "daemon state checksum mismatch for /etc/aks-flex-node/daemon-state.json"
        );
    }

    #[test]
    fn missing_checksum_and_bad_json_are_errors() {
        let (d, s) = store();
        let fs = HostFs::new(d.path());
        fs.write_atomic(Path::new(STATE_PATH), b"{}", 0o600)
            .unwrap();
        let e = s.load().unwrap_err().to_string();
        assert!(e.contains("daemon-state.json.sha256"), "{e}");
        let bad = b"not json";
        fs.write_atomic(Path::new(STATE_PATH), bad, 0o600).unwrap();
        fs.write_atomic(
            Path::new("/etc/aks-flex-node/daemon-state.json.sha256"),
            format!("{}\n", checksum(bad)).as_bytes(),
            0o600,
        )
        .unwrap();
        let e = s.load().unwrap_err().to_string();
        assert!(
            e.starts_with("decode state file /etc/aks-flex-node/daemon-state.json"),
            "{e}"
        );
    }

    #[test]
    fn delete_removes_both_and_is_idempotent() {
        let (_d, s) = store();
        s.save(&sample()).unwrap();
        s.delete().unwrap();
        assert_eq!(s.load().unwrap(), None);
        s.delete().unwrap();
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
