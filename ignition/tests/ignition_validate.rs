//! Runs Debian's real `ignition-validate` (package `ignition`; bookworm's 2.14 knows specs up
//! to 3.3.0) on the 3.3.0 rendering of every golden input and of the merged config. A missing
//! validator fails the test (CI installs the package); it never passes silently. One test feeds
//! the validator a config this crate would never emit, to show that it does reject things.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

mod common;

use std::path::Path;

use common::all_configs;
use flex_host::runner::Output;
use flex_ignition::{SpecVersion, to_ignition_json};

async fn validate(path: &Path) -> Output {
    flex_testkit::ignition_validate(path).await
}

#[tokio::test]
async fn every_golden_config_passes_ignition_validate_at_3_3_0() {
    let dir = tempfile::tempdir().unwrap();
    let configs = all_configs();
    assert!(configs.iter().any(|(name, _)| name == common::MERGED));
    let mut failures = Vec::new();
    for (name, config) in &configs {
        let path = dir.path().join(format!("{name}.3.3.0.ign"));
        std::fs::write(&path, to_ignition_json(config, SpecVersion::V3_3_0)).unwrap();
        let out = validate(&path).await;
        // Warnings (printed without failing) count too: the goldens should be clean.
        if !out.success() || !out.stdout.trim().is_empty() || !out.stderr.trim().is_empty() {
            failures.push(format!(
                "{name}: exit {:?}\nstdout: {}\nstderr: {}",
                out.code, out.stdout, out.stderr
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn ignition_validate_rejects_a_relative_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relative.ign");
    std::fs::write(
        &path,
        r#"{"ignition":{"version":"3.3.0"},"storage":{"files":[{"path":"etc/hostname","contents":{"source":"data:,x"}}]}}"#,
    )
    .unwrap();
    let out = validate(&path).await;
    assert!(!out.success(), "accepted a relative path: {out:?}");
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(text.contains("path not absolute"), "{text}");
}

#[tokio::test]
async fn ignition_validate_rejects_a_mode_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mode.ign");
    std::fs::write(
        &path,
        r#"{"ignition":{"version":"3.3.0"},"storage":{"directories":[{"path":"/d","mode":4096}]}}"#,
    )
    .unwrap();
    let out = validate(&path).await;
    assert!(!out.success(), "accepted mode 0o10000: {out:?}");
}
