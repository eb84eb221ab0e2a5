//! Errors: [`ComponentsError`] for the whole install (resolution, offline source, every failed
//! component) and [`ComponentError`] for one component, naming the component, the step, the
//! URL (redacted) or bundle file, and the cause.

use std::fmt;

use super::spec::Component;
use flex_host::fs::FsError;

/// What was being done when a component failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Fetching an artifact (HTTP GET or opening a bundle file).
    Download,
    /// Fetching a `.sha256` file.
    DownloadChecksum,
    /// Comparing a binary with its `.sha256`.
    Verify,
    /// Reading a tar archive.
    Extract,
    /// Writing into the rootfs.
    Install,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Download => "download",
            Step::DownloadChecksum => "download checksum",
            Step::Verify => "verify",
            Step::Extract => "extract",
            Step::Install => "install",
        })
    }
}

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The server answered with a status other than 200 (after the retries, for retryable ones).
    #[error("HTTP status {0}")]
    Status(u16),
    /// The request failed (connect error, timeout, body cut off); the message has no URL.
    #[error("request failed: {0}")]
    Transport(String),
    /// More than [`super::MAX_DOWNLOAD_BYTES`] arrived.
    #[error("more than {0} bytes")]
    TooLarge(u64),
    /// A `.sha256` file is not a SHA-256 hex digest.
    #[error("invalid checksum file: {0}")]
    InvalidChecksum(String),
    /// The binary's digest differs from its `.sha256`.
    #[error("SHA-256 mismatch for {binary}: expected {expected}, got {actual}")]
    ChecksumMismatch {
        /// The binary (`kubelet`).
        binary: String,
        /// From the `.sha256` file.
        expected: String,
        /// Of the downloaded bytes.
        actual: String,
    },
    /// The archive is unreadable or holds a member name that is refused.
    #[error("{0}")]
    Archive(String),
    /// The archive lacks the member(s) the component needs.
    #[error("{0}")]
    MissingMember(String),
    /// A local read or write failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Writing into the rootfs failed.
    #[error(transparent)]
    Fs(#[from] FsError),
}

impl Failure {
    /// The HTTP status, for [`Failure::Status`].
    pub fn status(&self) -> Option<u16> {
        match self {
            Failure::Status(s) => Some(*s),
            _ => None,
        }
    }
}

/// One component's failure: `<component>: <step> <url or file>: <cause>`.
#[derive(Debug, thiserror::Error)]
#[error("{component}: {step} {location}: {failure}")]
pub struct ComponentError {
    /// The component.
    pub component: Component,
    /// The step.
    pub step: Step,
    /// The URL (user info and query redacted) or the bundle file.
    pub location: String,
    /// The cause (in the message, not a `source()`: see `flex_host::error`).
    pub failure: Failure,
}

/// Why [`super::install_components`] or [`super::ComponentPlan::resolve`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ComponentsError {
    /// A config or download-override value is missing or unusable.
    #[error("{field}: {message}")]
    Config {
        /// Dotted path of the field (`components.kubernetes`, `downloads.runc.url`).
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The architecture is neither amd64 nor arm64.
    #[error("unsupported architecture {0:?} (supported: amd64, arm64)")]
    UnsupportedArch(String),
    /// The offline artifacts source cannot be used (bad template, scheme, unreadable bundle).
    #[error("bootstrap.offlineArtifacts.source: {0}")]
    Offline(String),
    /// A file the bundle layout requires is not in the offline bundle.
    #[error("offline artifact bundle: {component}: required file {file} is missing")]
    MissingBundleFile {
        /// The component that needs it.
        component: Component,
        /// The file (a pattern with `*` when the version comes from the name).
        file: String,
    },
    /// Several of the above (every missing bundle file, for instance).
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Several(Vec<ComponentsError>),
    /// The rootfs directory does not exist (the machine image is unpacked first).
    #[error("machine root file system {} does not exist", .0.display())]
    RootfsMissing(std::path::PathBuf),
    /// The staging directory could not be prepared.
    #[error("prepare staging directory: {0}")]
    Staging(String),
    /// One or more components failed; every failure is listed.
    #[error("{}", failed_message(.0))]
    Failed(Vec<ComponentError>),
}

fn failed_message(errors: &[ComponentError]) -> String {
    let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
    match list.len() {
        1 => format!("installing node components failed: {}", list[0]),
        n => format!("{n} node component steps failed: {}", list.join("; ")),
    }
}

impl ComponentsError {
    /// The component failures, for [`ComponentsError::Failed`].
    pub fn failures(&self) -> &[ComponentError] {
        match self {
            ComponentsError::Failed(v) => v,
            _ => &[],
        }
    }

    pub(crate) fn config(field: impl Into<String>, message: impl Into<String>) -> Self {
        ComponentsError::Config {
            field: field.into(),
            message: message.into(),
        }
    }
}
