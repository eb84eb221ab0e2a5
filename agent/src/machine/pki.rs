//! Client certificate pairs as kubelet and the daemon keep them: one PEM file holding the
//! private key, then the certificate (kubelet's `kubelet-client-current.pem`, the daemon's
//! `client-current.pem`), and what a certificate says about itself. Pure: no I/O.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flex_host::secret::Secret;

/// A certificate's validity period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    /// Not valid before.
    pub not_before: SystemTime,
    /// Not valid after.
    pub not_after: SystemTime,
}

fn unix(ts: i64) -> SystemTime {
    if ts >= 0 {
        UNIX_EPOCH + Duration::from_secs(ts.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_secs(ts.unsigned_abs())
    }
}

/// What a certificate says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFacts {
    /// Its validity period.
    pub validity: Validity,
    /// The subject's first common name (empty when it has none).
    pub common_name: String,
    /// The subject public key's bits.
    pub public_key: Vec<u8>,
}

/// Why a stored or issued key and certificate cannot be used. Never holds the key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PairError {
    /// The certificate text is not PEM (the parser's message).
    #[error("not a PEM certificate: {0}")]
    NotPem(String),
    /// The PEM block is not an X.509 certificate (the parser's message).
    #[error("not an X.509 certificate: {0}")]
    NotX509(String),
    /// The certificate's public key is not the stored key's.
    #[error("the certificate is not for the stored key")]
    WrongKey,
    /// The certificate names another node.
    #[error("the certificate is for {found:?}, not {want:?}")]
    WrongNode {
        /// The common name it has.
        found: String,
        /// The one this node needs.
        want: String,
    },
    /// Past its `notAfter`.
    #[error("the certificate has expired")]
    Expired,
    /// The key does not parse (rcgen's message, which does not echo the key).
    #[error("not a usable private key: {0}")]
    BadKey(String),
    /// The pair file has no private key block.
    #[error("no private key in it")]
    NoKey,
    /// The pair file has no certificate block.
    #[error("no certificate in it")]
    NoCertificate,
}

/// Parses a PEM certificate (the first one).
pub fn cert_facts(cert_pem: &str) -> Result<CertFacts, PairError> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
        .map_err(|e| PairError::NotPem(e.to_string()))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| PairError::NotX509(e.to_string()))?;
    let v = cert.validity();
    let common_name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .unwrap_or_default()
        .to_string();
    Ok(CertFacts {
        validity: Validity {
            not_before: unix(v.not_before.timestamp()),
            not_after: unix(v.not_after.timestamp()),
        },
        common_name,
        public_key: cert.public_key().subject_public_key.data.to_vec(),
    })
}

/// The pair file's text: the key's PEM, then the certificate's.
pub fn join_pair(key_pem: &Secret, cert_pem: &str) -> Secret {
    let key = key_pem.expose();
    let sep = if key.ends_with('\n') { "" } else { "\n" };
    Secret::new(format!("{key}{sep}{cert_pem}"))
}

/// Splits a pair file into the key's PEM block and the certificate's (the first of each).
pub fn split_pair(text: &str) -> Result<(Secret, String), PairError> {
    let mut key = None;
    let mut cert = None;
    let mut block: Option<(String, String)> = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(label) = t
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
        {
            block = Some((label.to_string(), format!("{t}\n")));
            continue;
        }
        if let Some((label, body)) = block.as_mut() {
            body.push_str(t);
            body.push('\n');
            if t.starts_with("-----END ") {
                let (label, body) = (label.clone(), std::mem::take(body));
                block = None;
                if label.ends_with("PRIVATE KEY") {
                    key.get_or_insert(body);
                } else if label == "CERTIFICATE" {
                    cert.get_or_insert(body);
                }
            }
        }
    }
    match (key, cert) {
        (Some(k), Some(c)) => Ok((Secret::new(k), c)),
        (None, _) => Err(PairError::NoKey),
        (_, None) => Err(PairError::NoCertificate),
    }
}

/// Whether the private key `key_pem` (PKCS#8, SEC1 as kubelet writes it, or PKCS#1) is the one
/// whose public key is `cert_public_key` (a certificate's subject public key bits,
/// [`CertFacts::public_key`]). Errors never hold the key.
pub fn key_matches(key_pem: &Secret, cert_public_key: &[u8]) -> Result<(), PairError> {
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject as _;
    let der = PrivateKeyDer::from_pem_slice(key_pem.expose().as_bytes())
        .map_err(|e| PairError::BadKey(format!("not a PEM private key: {e:?}")))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&der)
        .map_err(|e| PairError::BadKey(e.to_string()))?;
    let spki = signer
        .public_key()
        .ok_or_else(|| PairError::BadKey("no public key derivable from it".into()))?;
    use x509_parser::prelude::FromDer as _;
    let (_, info) = x509_parser::x509::SubjectPublicKeyInfo::from_der(spki.as_ref())
        .map_err(|e| PairError::BadKey(format!("its public key does not parse: {e}")))?;
    if info.subject_public_key.data.as_ref() == cert_public_key {
        Ok(())
    } else {
        Err(PairError::WrongKey)
    }
}
