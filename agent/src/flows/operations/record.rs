//! The local record of an operation this agent claimed, one file per UID under
//! [`RECORDS_DIR`] (one file with its checksum inside, as [`JsonStore`] writes it). It is what keeps an
//! operation from running twice across daemon restarts; see [`crate::flows::operations`].

use std::path::{Path, PathBuf};

use crate::state::{JsonStore, StateError, checksum};
use flex_host::fs::HostFs;

/// Where the records live (reset removes them with the rest of `/etc/aks-flex-node`).
pub const RECORDS_DIR: &str = "/etc/aks-flex-node/operations";

pub use flex_api::operations::record::{Record, Stage};

/// The records under a directory.
#[derive(Clone, Debug)]
pub struct RecordStore {
    fs: HostFs,
    dir: PathBuf,
}

impl RecordStore {
    /// The records under [`RECORDS_DIR`].
    pub fn new(fs: HostFs) -> Self {
        Self::at(fs, RECORDS_DIR)
    }

    /// The records under `dir` (a host path).
    pub fn at(fs: HostFs, dir: impl Into<PathBuf>) -> Self {
        Self {
            fs,
            dir: dir.into(),
        }
    }

    /// The directory (a host path).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The record file of `uid`: the UID itself when it is a plain name (Kubernetes UIDs are),
    /// else its SHA-256.
    pub fn path(&self, uid: &str) -> PathBuf {
        let plain = !uid.is_empty()
            && uid.len() <= 128
            && uid
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        let stem = if plain {
            uid.to_string()
        } else {
            checksum(uid.as_bytes())
        };
        self.dir.join(format!("{stem}.json"))
    }

    fn store(&self, uid: &str) -> JsonStore<Record> {
        JsonStore::at(self.fs.clone(), self.path(uid))
    }

    /// The record of `uid`; `Ok(None)` when there is none. A record that fails its checksum or
    /// does not decode is an error naming the file.
    pub fn load(&self, uid: &str) -> Result<Option<Record>, StateError> {
        self.store(uid).load()
    }

    /// Whether `uid` has a record file.
    pub fn exists(&self, uid: &str) -> bool {
        self.fs.exists(&self.path(uid))
    }

    /// Saves `record` (one file, atomically, 0600).
    pub fn save(&self, record: &Record) -> Result<(), StateError> {
        self.store(&record.uid).save(record)
    }

    /// Removes the record of `uid` (absent is fine).
    pub fn delete(&self, uid: &str) -> Result<(), StateError> {
        self.store(uid).delete()
    }

    /// Removes every record of operations named `name` (for an operation that is gone, whose
    /// UID is no longer known); returns how many. Unreadable records are left alone.
    pub fn delete_named(&self, name: &str) -> Result<usize, StateError> {
        let dir = self.fs.path(&self.dir);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => {
                return Err(StateError::Fs(flex_host::fs::FsError {
                    path: self.dir.clone(),
                    op: "read directory",
                    cause: e,
                }));
            }
        };
        let mut removed = 0;
        for entry in entries.filter_map(Result::ok) {
            let file = entry.file_name();
            let Some(file) = file.to_str().filter(|f| f.ends_with(".json")) else {
                continue;
            };
            let store: JsonStore<Record> = JsonStore::at(self.fs.clone(), self.dir.join(file));
            if let Ok(Some(r)) = store.load()
                && r.name == name
            {
                store.delete()?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}
