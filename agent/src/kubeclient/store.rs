//! The daemon's credential files and what they hold: the key and certificate in
//! [`CREDENTIAL_DIR`](super::CREDENTIAL_DIR), checked on load (the certificate parses, belongs
//! to the key and to this node, and has not expired), and the rotation decision (pure).
//!
//! The pair lives in one file, [`PAIR_FILE`] (the key's PEM, then the certificate's), written
//! to a temporary file and renamed over the old one: a crash at any instant leaves the old pair
//! or the new one, both loadable. The legacy pair ([`KEY_FILE`], [`CERT_FILE`], written one
//! after the other by earlier versions) is still loaded when it is consistent, and removed once
//! a new pair is stored.

use std::path::Path;
use std::time::{Duration, SystemTime};

use rcgen::KeyPair;

use super::{CERT_FILE, CREDENTIAL_DIR, KEY_FILE, KubeClientError, PAIR_FILE, PENDING_KEY_FILE};
pub use crate::machine::pki::{PairError, Validity};
pub(crate) use crate::machine::pki::{cert_facts, join_pair, split_pair};
use flex_host::fs::HostFs;
use flex_host::secret::Secret;

/// When a certificate is due for rotation: once 80 % of its lifetime has passed.
pub fn rotation_deadline(v: &Validity) -> SystemTime {
    let lifetime = v
        .not_after
        .duration_since(v.not_before)
        .unwrap_or(Duration::ZERO);
    v.not_before + lifetime.mul_f64(0.8)
}

/// Whether a certificate valid for `v` should be replaced at `now` (80 % of its lifetime
/// passed, or expired, or not valid yet by more than its lifetime — a clock far off).
pub fn needs_rotation(v: &Validity, now: SystemTime) -> bool {
    now >= rotation_deadline(v)
}

/// A key and the certificate issued for it.
#[derive(Clone, Debug)]
pub struct Issued {
    /// The private key, PEM (PKCS#8). Never logged, never sent.
    pub key_pem: Secret,
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its validity.
    pub validity: Validity,
}

/// Checks that `cert_pem` is a certificate for `key` and `node`, valid at `now`.
pub(crate) fn check(
    key: &KeyPair,
    cert_pem: &str,
    node: &str,
    now: SystemTime,
) -> Result<Validity, PairError> {
    let facts = cert_facts(cert_pem)?;
    if facts.public_key != key.public_key_raw() {
        return Err(PairError::WrongKey);
    }
    let want = super::csr::common_name(node);
    if facts.common_name != want {
        return Err(PairError::WrongNode {
            found: facts.common_name,
            want,
        });
    }
    if now >= facts.validity.not_after {
        return Err(PairError::Expired);
    }
    Ok(facts.validity)
}

/// Parses a PEM private key.
pub(crate) fn parse_key(pem: &Secret) -> Result<KeyPair, PairError> {
    // rcgen's parse error does not echo the input.
    KeyPair::from_pem(pem.expose()).map_err(|e| PairError::BadKey(e.to_string()))
}

/// The credential files under a [`HostFs`].
#[derive(Clone, Debug)]
pub(crate) struct CredentialStore {
    fs: HostFs,
}

impl CredentialStore {
    pub fn new(fs: HostFs) -> Self {
        Self { fs }
    }

    /// Creates the directory (0700) and narrows an existing one to 0700; removes the temporary
    /// files that writes killed before their rename left there (`cert.save-midway` leaves the
    /// new private key in one), except this process's own (a write in flight).
    pub fn prepare(&self) -> Result<(), KubeClientError> {
        let dir = Path::new(CREDENTIAL_DIR);
        if let Some(parent) = dir.parent() {
            self.fs.create_dir_all(parent)?;
        }
        self.fs.create_dir_all_mode(dir, 0o700)?;
        if self.fs.mode(dir) != Some(0o700) {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(self.fs.path(dir), std::fs::Permissions::from_mode(0o700))
                .map_err(|cause| flex_host::fs::FsError {
                    op: "chmod",
                    path: dir.to_path_buf(),
                    cause,
                })?;
        }
        self.remove_stale_temps()
    }

    fn remove_stale_temps(&self) -> Result<(), KubeClientError> {
        let dir = Path::new(CREDENTIAL_DIR);
        let entries =
            std::fs::read_dir(self.fs.path(dir)).map_err(|cause| flex_host::fs::FsError {
                op: "list",
                path: dir.to_path_buf(),
                cause,
            })?;
        for entry in entries {
            let entry = entry.map_err(|cause| flex_host::fs::FsError {
                op: "list",
                path: dir.to_path_buf(),
                cause,
            })?;
            let name = entry.file_name();
            if let Some(name) = name.to_str()
                && is_stale_temp(name, std::process::id())
            {
                let path = dir.join(name);
                self.fs.remove_file(&path)?;
                tracing::info!(path = %path.display(), "removed a temporary file an interrupted write left");
            }
        }
        Ok(())
    }

    /// The stored key and certificate, when they belong together, name `node` and have not
    /// expired at `now`: the pair file's, else the legacy pair's; otherwise `None` (why is
    /// logged, without the key).
    pub fn load(&self, node: &str, now: SystemTime) -> Option<Issued> {
        match self.fs.read_to_string(Path::new(PAIR_FILE)) {
            Ok(Some(text)) => {
                let text = Secret::new(text);
                let usable = split_pair(text.expose()).and_then(|(key, cert)| {
                    let validity = parse_key(&key).and_then(|k| check(&k, &cert, node, now))?;
                    Ok(Issued {
                        key_pem: key,
                        cert_pem: cert,
                        validity,
                    })
                });
                match usable {
                    Ok(issued) => return Some(issued),
                    Err(reason) => {
                        tracing::warn!(file = PAIR_FILE, reason = %reason, "stored daemon client certificate is not usable");
                    }
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "cannot read the stored daemon credentials"),
        }
        self.load_legacy(node, now)
    }

    /// The legacy two-file pair, when it is there and consistent.
    fn load_legacy(&self, node: &str, now: SystemTime) -> Option<Issued> {
        let key = self.fs.read_to_string(Path::new(KEY_FILE));
        let cert = self.fs.read_to_string(Path::new(CERT_FILE));
        let (key, cert) = match (key, cert) {
            (Ok(Some(k)), Ok(Some(c))) => (Secret::new(k), c),
            (Ok(None), _) | (_, Ok(None)) => {
                tracing::debug!(dir = CREDENTIAL_DIR, "no stored daemon client certificate");
                return None;
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "cannot read the stored daemon credentials; requesting new ones");
                return None;
            }
        };
        let result = parse_key(&key).and_then(|k| check(&k, &cert, node, now));
        match result {
            Ok(validity) => Some(Issued {
                key_pem: key,
                cert_pem: cert,
                validity,
            }),
            Err(reason) => {
                tracing::warn!(file = CERT_FILE, reason = %reason, "stored daemon client certificate is not usable; requesting a new one");
                None
            }
        }
    }

    /// The key of an unanswered request, if one is stored and parses. A pending key that is
    /// already the stored pair's (a crash after the pair was stored, before the pending key was
    /// dropped) is a finished request: it is dropped, so the next request uses a new key.
    pub fn pending_key(&self) -> Option<(Secret, KeyPair)> {
        let pem = Secret::new(
            self.fs
                .read_to_string(Path::new(PENDING_KEY_FILE))
                .ok()
                .flatten()?,
        );
        let stored = self
            .fs
            .read_to_string(Path::new(PAIR_FILE))
            .ok()
            .flatten()
            .and_then(|t| split_pair(&t).ok());
        if stored.is_some_and(|(k, _)| k.expose().trim() == pem.expose().trim()) {
            tracing::info!(
                file = PENDING_KEY_FILE,
                "the pending daemon key is the stored pair's; dropping it"
            );
            let _ = self.remove_pending();
            return None;
        }
        match parse_key(&pem) {
            Ok(k) => Some((pem, k)),
            Err(reason) => {
                tracing::warn!(file = PENDING_KEY_FILE, reason = %reason, "ignoring the pending daemon key");
                None
            }
        }
    }

    /// Stores a new request's key (0600).
    pub fn save_pending_key(&self, pem: &Secret) -> Result<(), KubeClientError> {
        self.fs
            .write_atomic(Path::new(PENDING_KEY_FILE), pem.expose().as_bytes(), 0o600)?;
        Ok(())
    }

    /// Drops the pending key (a request that cannot succeed).
    pub fn remove_pending(&self) -> Result<(), KubeClientError> {
        self.fs.remove_file(Path::new(PENDING_KEY_FILE))?;
        Ok(())
    }

    /// Stores an issued pair: key and certificate together in [`PAIR_FILE`] (0600), written
    /// to a temporary file and renamed over the old pair (fault point `cert.save-midway`: the
    /// new pair complete in its temporary file, the old one still in place); then removes the
    /// legacy pair and the pending key. A crash before the rename leaves the old pair, after it
    /// the new one; a pending key left behind is dropped by [`pending_key`].
    ///
    /// [`pending_key`]: Self::pending_key
    pub fn save(&self, issued: &Issued) -> Result<(), KubeClientError> {
        self.save_with(issued, &mut || flex_host::fault::point("cert.save-midway"))
    }

    /// [`Self::save`] with `before_rename` where the fault point goes (tests interrupt a real
    /// save there).
    pub(super) fn save_with(
        &self,
        issued: &Issued,
        before_rename: &mut dyn FnMut(),
    ) -> Result<(), KubeClientError> {
        let pair = join_pair(&issued.key_pem, &issued.cert_pem);
        self.fs.write_atomic_with(
            Path::new(PAIR_FILE),
            pair.expose().as_bytes(),
            0o600,
            before_rename,
        )?;
        for legacy in [CERT_FILE, KEY_FILE] {
            self.fs.remove_file(Path::new(legacy))?;
        }
        self.fs.remove_file(Path::new(PENDING_KEY_FILE))?;
        Ok(())
    }
}

/// Whether `name` is a temporary file of [`HostFs`]'s atomic writes (`.<file>.tmp-<pid>-<n>`)
/// left by another process than `own_pid` (one of this process's is a write in flight).
pub(crate) fn is_stale_temp(name: &str, own_pid: u32) -> bool {
    let Some((file, tail)) = name.strip_prefix('.').and_then(|n| n.rsplit_once(".tmp-")) else {
        return false;
    };
    let Some((pid, n)) = tail.split_once('-') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    !file.is_empty() && digits(pid) && digits(n) && pid.parse::<u32>().ok() != Some(own_pid)
}
