//! Cross-crate tests live in `tests/tests/`; this library locates the workspace root and holds
//! what several of them share ([`daemon`]: long-running children such as containerd).

pub mod daemon;

use std::path::PathBuf;

/// The workspace root (the directory holding the top-level `Cargo.toml`).
pub fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}
