//! Cross-crate tests live in `tests/tests/`; this library locates the workspace root and holds
//! what several of them share ([`daemon`]: long-running children such as containerd).
//!
//! The tests: the repository's own checks (`tidy.rs`: module docs, the README's commands,
//! ARCHITECTURE.md names every crate and the main modules; `docs_paths.rs`: every repository
//! path the docs name exists; `imports.rs`: no crate's modules import each other in a circle,
//! the agent's layers only look down, the harness's groups never import each other;
//! `workflows.rs`: the GitHub workflows parse, keep least privilege, and run only tasks and
//! flags xtask and the harness accept), and the agent's image under a real containerd
//! (`containerd_image.rs`, `containerd_pull.rs`).

pub mod daemon;

use std::path::PathBuf;

/// The workspace root (the directory holding the top-level `Cargo.toml`).
pub fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}

/// The workspace's members, as its `Cargo.toml` lists them (empty if it cannot be read).
pub fn workspace_members() -> Vec<String> {
    let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap_or_default();
    let list = manifest
        .split("members = [")
        .nth(1)
        .and_then(|m| m.split(']').next())
        .unwrap_or_default();
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect()
}

/// The production Rust files under `dirs` (relative to the workspace root): no `tests/`,
/// `snapshots/` or `generated/` directory, no `tests.rs` or `*_tests.rs` file. For the source
/// rules in `tests/tests/` (waits, errors).
pub fn production_rust_files(dirs: &[&str]) -> Vec<PathBuf> {
    fn walk(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for p in entries.flatten().map(|e| e.path()) {
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            if p.is_dir() {
                if !matches!(name.as_str(), "tests" | "snapshots" | "generated") {
                    walk(&p, out);
                }
            } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
                out.push(p);
            }
        }
    }
    let root = workspace_root();
    let mut out = Vec::new();
    for d in dirs {
        walk(&root.join(d), &mut out);
    }
    out
}

/// The production part of a source file: everything before its `#[cfg(test)] mod tests`.
pub fn production(text: &str) -> &str {
    match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    }
}
