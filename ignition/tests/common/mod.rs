//! Shared by the golden and `ignition-validate` tests: where the golden files live, how each
//! input is parsed, and the merged config (`host.bu` + `overlay.bu` + builder additions) that
//! both test files render.

#![allow(dead_code)] // each test crate uses a different part

use std::path::{Path, PathBuf};

use flex_ignition::{Config, Dropin, File, Owner, User, merge, parse_butane};

/// `ignition/tests/golden`.
pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// The files directory `local:` paths in the golden inputs are relative to.
pub fn files_dir() -> PathBuf {
    golden_dir().join("files")
}

/// Files in `dir` ending in `.<ext>`, sorted, as (stem, path).
pub fn files_with_ext(dir: &Path, ext: &str) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    out.sort();
    out
}

/// Parses a golden input with the golden files directory.
pub fn parse_file(path: &Path) -> Config {
    let yaml = std::fs::read_to_string(path).unwrap();
    parse_butane(&yaml, Some(&files_dir())).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The name of the merged config's golden outputs (`merged.<version>.ign`); no `merged.bu`.
pub const MERGED: &str = "merged";

/// `host.bu` merged with `overlay.bu`, plus what a harness adds through the builder.
pub fn merged() -> Config {
    let host = parse_file(&golden_dir().join("host.bu"));
    let overlay = parse_file(&golden_dir().join("overlay.bu"));
    let mut config = merge(&host, &overlay).unwrap();
    config
        .add_user(
            User::new("flexadmin")
                .with_ssh_key("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBuilderAddedKeyForGoldenFiles00000000000 builder@flex")
                .with_group("sudo")
                .with_group("systemd-journal"),
        )
        .unwrap()
        .add_file(
            File::new("/etc/flex-harness/ready.env")
                .with_data("READY=1\n")
                .with_mode(0o600)
                .with_user(Owner::Name("flexadmin".into())),
        )
        .unwrap()
        .add_dropin(
            "containerd.service",
            Dropin::new("10-harness.conf", "[Service]\nLimitNOFILE=1048576\n"),
        )
        .unwrap();
    config
}

/// Every config with golden outputs: each `*.bu` input, then the merged config.
pub fn all_configs() -> Vec<(String, Config)> {
    let mut out: Vec<(String, Config)> = files_with_ext(&golden_dir(), "bu")
        .into_iter()
        .map(|(stem, path)| (stem, parse_file(&path)))
        .collect();
    out.push((MERGED.to_string(), merged()));
    out
}
