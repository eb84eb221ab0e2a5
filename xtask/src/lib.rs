//! The library of `cargo xtask` (the binary is `main.rs`): its tasks ([`ci`], [`fuzz`],
//! [`layering`]), the Debian packages they install ([`deps`]) and the task table with the
//! parsing of their flags ([`tasks`]), which the workflows test shares with the dispatcher.

pub mod ci;
pub mod deps;
pub mod fuzz;
pub mod layering;
pub mod tasks;

use std::path::PathBuf;
use std::time::Duration;

use flex_host::runner::Cmd;

/// The workspace root.
pub fn project_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// `cargo run` of one of the workspace's binaries with `args`, from the workspace root, its
/// output on the terminal. Builds are long on two cores; the timeout only stops a hang.
pub fn cargo_run(package: &str, args: &[String]) -> Cmd {
    Cmd::new("cargo")
        .args(["run", "--quiet", "--package", package, "--"])
        .args(args.iter().map(String::as_str))
        .timeout(Duration::from_secs(6 * 3600))
}
