//! Golden files: every `tests/golden/*.bu` (plus the merged config of `common::merged`) is
//! rendered for Ignition 3.4.0 and 3.3.0 and compared byte for byte with
//! `tests/golden/<name>.<version>.ign`; every `tests/golden/errors/*.bu` must fail with the
//! message in the `.err` file beside it.
//!
//! After an intended change, rewrite the expected files and review the diff:
//!
//! ```sh
//! UPDATE_GOLDEN=1 cargo test -p flex-ignition --test golden
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use base64::Engine as _;

use common::{MERGED, all_configs, files_dir, files_with_ext, golden_dir};
use flex_ignition::{SpecVersion, parse_butane, to_ignition_json};

fn updating() -> bool {
    std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1")
}

/// Compares `got` with the file at `path`, or rewrites it under `UPDATE_GOLDEN=1`. Returns a
/// description of the mismatch.
fn check(path: &Path, got: &str) -> Option<String> {
    if updating() {
        std::fs::write(path, got).unwrap();
        return None;
    }
    let name = path.file_name().unwrap().to_string_lossy();
    let Ok(want) = std::fs::read_to_string(path) else {
        return Some(format!("{name}: missing"));
    };
    if want == got {
        return None;
    }
    let line = want
        .lines()
        .zip(got.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| want.lines().count().min(got.lines().count()));
    Some(format!(
        "{name}: differs from line {}:\n  want: {}\n  got:  {}",
        line + 1,
        want.lines().nth(line).unwrap_or("<end of file>"),
        got.lines().nth(line).unwrap_or("<end of file>"),
    ))
}

fn fail_on(mismatches: &[String]) {
    assert!(
        mismatches.is_empty(),
        "{}\n\nIf the change is intended: UPDATE_GOLDEN=1 cargo test -p flex-ignition --test golden",
        mismatches.join("\n")
    );
}

#[test]
fn renderings_match_the_golden_files() {
    let configs = all_configs();
    assert!(configs.len() >= 5, "golden inputs are missing");
    let mut mismatches = Vec::new();
    for (name, config) in &configs {
        for version in SpecVersion::ALL {
            let path = golden_dir().join(format!("{name}.{version}.ign"));
            mismatches.extend(check(&path, &to_ignition_json(config, version)));
        }
    }
    fail_on(&mismatches);
}

#[test]
fn every_golden_output_has_an_input() {
    let mut expected: BTreeSet<String> = BTreeSet::new();
    for (name, _) in files_with_ext(&golden_dir(), "bu")
        .into_iter()
        .chain([(MERGED.to_string(), golden_dir())])
    {
        for version in SpecVersion::ALL {
            expected.insert(format!("{name}.{version}"));
        }
    }
    let found: BTreeSet<String> = files_with_ext(&golden_dir(), "ign")
        .into_iter()
        .map(|(stem, _)| stem)
        .collect();
    let stale: Vec<_> = found.difference(&expected).collect();
    assert!(
        stale.is_empty(),
        "golden outputs without an input: {stale:?}"
    );
}

#[test]
fn error_inputs_fail_with_the_golden_message() {
    let dir = golden_dir().join("errors");
    let inputs = files_with_ext(&dir, "bu");
    assert!(inputs.len() >= 5, "error inputs are missing");
    let mut mismatches = Vec::new();
    for (name, path) in inputs {
        let yaml = std::fs::read_to_string(&path).unwrap();
        let got = match parse_butane(&yaml, Some(&files_dir())) {
            Ok(_) => "parsed without error\n".to_string(),
            // The files directory's absolute path depends on the checkout.
            Err(e) => format!("{e}\n").replace(&files_dir().display().to_string(), "<files-dir>"),
        };
        mismatches.extend(check(&dir.join(format!("{name}.err")), &got));
    }
    fail_on(&mismatches);
}

#[test]
fn parsing_and_rendering_twice_give_the_same_bytes() {
    let first = all_configs();
    let second = all_configs();
    for ((name, a), (_, b)) in first.iter().zip(&second) {
        assert_eq!(a, b, "{name}");
        for version in SpecVersion::ALL {
            assert_eq!(
                to_ignition_json(a, version),
                to_ignition_json(b, version),
                "{name} {version}"
            );
        }
    }
}

#[test]
fn renderings_differ_only_in_the_version() {
    for (name, config) in all_configs() {
        let v33 = to_ignition_json(&config, SpecVersion::V3_3_0);
        let v34 = to_ignition_json(&config, SpecVersion::V3_4_0);
        assert_eq!(
            v33.replacen("\"version\": \"3.3.0\"", "\"version\": \"3.4.0\"", 1),
            v34,
            "{name}"
        );
    }
}

/// The host golden is what the brief asks for; check its shape so that accepting a golden
/// rewrite cannot silently lose a feature.
#[test]
fn host_golden_has_every_feature() {
    let path = golden_dir().join("host.3.4.0.ign");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(v["ignition"]["version"], "3.4.0");
    let files = v["storage"]["files"].as_array().unwrap();
    let file = |p: &str| files.iter().find(|f| f["path"] == p).unwrap();
    let hostname = file("/etc/hostname");
    assert_eq!(hostname["mode"], 420);
    assert_eq!(hostname["overwrite"], true);
    assert_eq!(hostname["contents"]["source"], "data:,flex-node-1");
    // Quotes, spaces and newlines make percent-encoding longer than base64 here.
    let hosts = file("/etc/containerd/certs.d/10.0.2.2:5000/hosts.toml");
    assert_eq!(hosts["contents"]["compression"], "");
    let b64 = hosts["contents"]["source"]
        .as_str()
        .unwrap()
        .strip_prefix("data:;base64,")
        .unwrap();
    let text = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    assert!(text.starts_with(b"server = \"http://10.0.2.2:5000\"\n"));
    let cfg = file("/etc/aks-flex-node/config.json");
    assert_eq!(cfg["mode"], 384);
    assert_eq!(cfg["contents"]["compression"], "gzip");
    assert!(
        cfg["contents"]["source"]
            .as_str()
            .unwrap()
            .starts_with("data:;base64,H4sI")
    );
    assert_eq!(cfg["user"]["id"], 0);
    assert_eq!(cfg["group"]["name"], "root");
    assert_eq!(v["storage"]["directories"][0]["mode"], 488);
    assert_eq!(
        v["storage"]["links"][0],
        serde_json::json!({"overwrite": true, "path": "/etc/localtime", "target": "../usr/share/zoneinfo/UTC"})
    );
    let units = v["systemd"]["units"].as_array().unwrap();
    assert_eq!(units[0]["name"], "aks-flex-node.service");
    assert_eq!(units[0]["enabled"], true);
    assert_eq!(units[0]["dropins"][0]["name"], "10-environment.conf");
    assert_eq!(
        units[1],
        serde_json::json!({"mask": true, "name": "update-engine.service"})
    );
    let user = &v["passwd"]["users"][0];
    assert_eq!(user["name"], "azureuser");
    assert_eq!(user["groups"], serde_json::json!(["sudo"]));
    assert!(
        user["sshAuthorizedKeys"][0]
            .as_str()
            .unwrap()
            .starts_with("ssh-ed25519 ")
    );
    assert!(
        !std::fs::read_to_string(golden_dir().join("host.3.4.0.ign"))
            .unwrap()
            .contains("null")
    );
}
