//! The credential store on a scratch root, for the `faults` group's window 4
//! (`aks-flex-node debug credential-store`): offline the daemon never gets a client
//! certificate, so nothing rotates; this writes a pair through the very
//! [`CredentialStore::save`](super::store::CredentialStore::save) a rotation runs (its
//! `cert.save-midway` fault point included) and loads it back the way the daemon does, under a
//! root of its own. It never touches the daemon's own credentials: the root `/` is refused.
//!
//! The pair is self-signed (a key and a certificate for `system:node:<node>`, valid a day):
//! what the store checks on load (the certificate parses, is for the key and the node, has not
//! expired) holds for it as for a cluster-issued one. Output is the certificate's SHA-256
//! fingerprint, never the key.

use std::path::Path;
use std::time::{Duration, SystemTime};

use rcgen::{CertificateParams, DistinguishedName, DnType};
use sha2::{Digest, Sha256};

use super::KubeClientError;
use super::store::{CredentialStore, Issued, cert_facts};
use flex_host::fs::HostFs;

/// Why the scratch store refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ScratchError {
    /// The root is the host's `/` (or empty): the daemon's own credentials live there.
    #[error(
        "credential-store --root {0:?}: a scratch directory is required, never the host's root (the daemon's own credentials live there)"
    )]
    HostRoot(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] KubeClientError),
}

/// Whether `root` names a scratch root: at least one normal component and no `..` (so
/// `/etc/..` is refused), and, when it exists, not the host's `/` once symlinks are resolved.
pub fn is_scratch_root(root: &Path) -> bool {
    use std::path::Component;
    let named = root.components().any(|c| matches!(c, Component::Normal(_)));
    let climbs = root.components().any(|c| matches!(c, Component::ParentDir));
    let resolves_to_root = std::fs::canonicalize(root).is_ok_and(|p| p == Path::new("/"));
    named && !climbs && !resolves_to_root
}

/// The SHA-256 fingerprint of a PEM certificate's DER, hex.
pub fn fingerprint(cert_pem: &str) -> String {
    let der: Vec<u8> = pem_der(cert_pem);
    hex::encode(Sha256::digest(&der))
}

fn pem_der(cert_pem: &str) -> Vec<u8> {
    use base64::Engine as _;
    let body: String = cert_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body.trim())
        .unwrap_or_else(|_| cert_pem.as_bytes().to_vec())
}

fn store(root: &Path) -> Result<CredentialStore, ScratchError> {
    if !is_scratch_root(root) {
        return Err(ScratchError::HostRoot(root.display().to_string()));
    }
    Ok(CredentialStore::new(HostFs::new(root)))
}

/// A new self-signed pair for `node`, saved through the store under `root`; its fingerprint.
pub fn save(root: &Path, node: &str) -> Result<String, ScratchError> {
    let store = store(root)?;
    store.prepare()?;
    let (key_pem, key) = super::csr::generate_key()?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, super::csr::common_name(node));
    params.distinguished_name = dn;
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    params.not_before = (now - day).into();
    params.not_after = (now + day).into();
    let cert_pem = params
        .self_signed(&key)
        .map_err(|e| KubeClientError::Crypto(format!("self-sign: {e}")))?
        .pem();
    let validity = cert_facts(&cert_pem)
        .map_err(|e| KubeClientError::Crypto(e.to_string()))?
        .validity;
    store.save(&Issued {
        key_pem,
        cert_pem: cert_pem.clone(),
        validity,
    })?;
    Ok(fingerprint(&cert_pem))
}

/// The fingerprint of the pair the store under `root` loads for `node`, as the daemon loads
/// it; `None` when none is usable. Reads only.
pub fn load(root: &Path, node: &str) -> Result<Option<String>, ScratchError> {
    Ok(store(root)?
        .load(node, SystemTime::now())
        .map(|i| fingerprint(&i.cert_pem)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_scratch_root_is_accepted() {
        let tmp = tempfile::tempdir().unwrap();
        let link = tmp.path().join("to-root");
        std::os::unix::fs::symlink("/", &link).unwrap();
        let link = link.to_string_lossy().into_owned();
        for bad in [
            "/",
            "",
            "//",
            "/./",
            "/etc/..",
            "scratch/../..",
            link.as_str(),
        ] {
            assert!(!is_scratch_root(Path::new(bad)), "{bad:?}");
            let e = save(Path::new(bad), "n").unwrap_err().to_string();
            assert!(e.contains("never the host's root"), "{e}");
        }
        assert!(is_scratch_root(Path::new(
            "/var/lib/aks-flex-node/fault-cert"
        )));
        assert!(is_scratch_root(Path::new("scratch")));
    }

    /// Real files under a temporary root: a saved pair loads back with the same fingerprint,
    /// not for another node; a second save replaces it; nothing is printed of the key.
    #[test]
    fn a_saved_pair_loads_back_for_its_node_only() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(load(root.path(), "node-a").unwrap(), None);
        let a = save(root.path(), "node-a").unwrap();
        assert_eq!(a.len(), 64);
        assert_eq!(
            load(root.path(), "node-a").unwrap().as_deref(),
            Some(a.as_str())
        );
        assert_eq!(load(root.path(), "node-b").unwrap(), None);
        let b = save(root.path(), "node-a").unwrap();
        assert_ne!(a, b);
        assert_eq!(
            load(root.path(), "node-a").unwrap().as_deref(),
            Some(b.as_str())
        );
        assert!(
            root.path()
                .join(super::super::PAIR_FILE.trim_start_matches('/'))
                .exists()
        );
    }
}
