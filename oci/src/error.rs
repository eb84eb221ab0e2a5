//! [`OciError`]: every way pulling or unpacking an image can fail. Each variant names the image
//! reference, and the digest, URL or path involved.

use std::path::PathBuf;

use super::digest::Digest;
use super::reference::ReferenceError;
use super::unpack::UnpackError;

/// An OCI pull, verification or unpack failure.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The image reference is invalid.
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    /// An HTTP request could not be made or its response not read.
    #[error("{reference}: {method} {url}: {}", flex_host::error::Chain(cause))]
    Http {
        /// The image.
        reference: String,
        /// HTTP method.
        method: &'static str,
        /// Request URL.
        url: String,
        /// The client error, with its causes (in the message, not a `source()`).
        cause: reqwest::Error,
    },
    /// The registry answered with an unexpected status.
    #[error("{reference}: {method} {url}: HTTP {status}{}", detail_suffix(detail))]
    Status {
        /// The image.
        reference: String,
        /// HTTP method.
        method: &'static str,
        /// Request URL.
        url: String,
        /// The status code.
        status: u16,
        /// The registry's error text (trimmed), if any.
        detail: String,
    },
    /// Anonymous access was refused or the token flow failed.
    #[error("{reference}: authentication: {reason}")]
    Auth {
        /// The image.
        reference: String,
        /// What went wrong.
        reason: String,
    },
    /// A transient failure persisted through every retry.
    #[error("{reference}: giving up after {attempts} attempts: {cause}")]
    GaveUp {
        /// The image.
        reference: String,
        /// How many attempts were made.
        attempts: u32,
        /// The last failure (in the message, not a `source()`).
        cause: Box<OciError>,
    },
    /// Content does not hash to its digest.
    #[error("{reference}: {what} digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch {
        /// The image.
        reference: String,
        /// `manifest`, `config`, `layer`, ...
        what: &'static str,
        /// The digest the content should have.
        expected: Digest,
        /// The digest it has.
        actual: Digest,
    },
    /// Content does not have its descriptor's size.
    #[error("{reference}: {what} {digest}: size mismatch: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        /// The image.
        reference: String,
        /// `manifest`, `config`, `layer`, ...
        what: &'static str,
        /// The content's digest.
        digest: Digest,
        /// The descriptor's size.
        expected: u64,
        /// What arrived (or more than expected, when cut short).
        actual: u64,
    },
    /// No index entry for the wanted platform.
    #[error("{reference}: no manifest for platform {wanted}; available: {available}")]
    NoPlatform {
        /// The image.
        reference: String,
        /// `linux/<arch>`.
        wanted: String,
        /// The platforms the index lists.
        available: String,
    },
    /// A manifest, index or config is malformed or unsupported.
    #[error("{reference}: invalid {what}{}: {reason}", digest_suffix(digest))]
    Invalid {
        /// The image.
        reference: String,
        /// `manifest`, `config`, ...
        what: &'static str,
        /// Its digest, when known.
        digest: Option<Digest>,
        /// What is wrong.
        reason: String,
    },
    /// A blob's media type cannot be used.
    #[error("{reference}: {what} {digest}: unsupported media type {media_type:?}")]
    UnsupportedMediaType {
        /// The image.
        reference: String,
        /// `layer`, ...
        what: &'static str,
        /// The blob.
        digest: Digest,
        /// Its media type.
        media_type: String,
    },
    /// A local OCI layout is unusable.
    #[error("{reference}: OCI layout {}: {reason}", dir.display())]
    Layout {
        /// The image source.
        reference: String,
        /// The layout directory.
        dir: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file-system operation failed.
    #[error("{reference}: {op} {}: {cause}", path.display())]
    Io {
        /// The image.
        reference: String,
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error (in the message, not a `source()`).
        cause: std::io::Error,
    },
    /// Applying a layer failed (the error names the layer and entry).
    #[error("{reference}: {cause}")]
    Unpack {
        /// The image.
        reference: String,
        /// The unpack failure (in the message, not a `source()`).
        cause: UnpackError,
    },
    /// The destination cannot be used.
    #[error("{reference}: destination {}: {reason}", path.display())]
    Destination {
        /// The image.
        reference: String,
        /// The destination.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

fn digest_suffix(d: &Option<Digest>) -> String {
    d.as_ref().map(|d| format!(" {d}")).unwrap_or_default()
}

impl OciError {
    /// Whether the error means the content did not verify (digest or size).
    pub fn is_verification_failure(&self) -> bool {
        match self {
            Self::DigestMismatch { .. } | Self::SizeMismatch { .. } => true,
            Self::Unpack {
                cause: UnpackError::DiffId { .. },
                ..
            } => true,
            Self::GaveUp { cause, .. } => cause.is_verification_failure(),
            _ => false,
        }
    }
}

/// A registry's error answer, `{"errors":[{"code":…,"message":…}]}`, as `code message; …`;
/// `None` for anything else.
pub(crate) fn registry_errors(bytes: &[u8]) -> Option<String> {
    let v = serde_json::from_slice::<serde_json::Value>(bytes).ok()?;
    let errs = v.get("errors")?.as_array()?;
    let parts: Vec<String> = errs
        .iter()
        .map(|e| {
            let code = e.get("code").and_then(|c| c.as_str()).unwrap_or("");
            let msg = e.get("message").and_then(|c| c.as_str()).unwrap_or("");
            format!("{code} {msg}").trim().to_string()
        })
        .collect();
    Some(parts.join("; "))
}
