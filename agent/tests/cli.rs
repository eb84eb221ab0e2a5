//! The `aks-flex-node` binary, run for real (assert_cmd): help, version, preflight on good and
//! bad configs, exit codes, root checks, and the daemon's clean SIGTERM path. Nothing is faked;
//! no test here changes the machine (start and reset are only run where they must refuse).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::prelude::*;

const TOKEN_FIXTURE: &str = include_str!("fixtures/config-token.json");

fn bin() -> Command {
    Command::cargo_bin("aks-flex-node").unwrap()
}

fn write_config(dir: &Path, json: &str) -> PathBuf {
    let p = dir.join("config.json");
    std::fs::write(&p, json).unwrap();
    p
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[test]
fn help_lists_commands_and_aliases() {
    let out = bin()
        .arg("--help")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    insta::assert_snapshot!(String::from_utf8(out).unwrap());
}

#[test]
fn subcommand_help() {
    bin()
        .args(["start", "--help"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "Install the systemd unit, bootstrap the nspawn-based AKS worker node",
        ))
        .stdout(predicate::str::contains("--config <PATH>"));
    bin()
        .args(["preflight", "--help"])
        .assert()
        .success()
        .stdout(predicate::str::contains("--ignore-preflight-errors"))
        .stdout(predicate::str::contains("--fail-on-warnings"));
}

#[test]
fn version_prints_four_lines() {
    let out = bin()
        .arg("version")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert_eq!(lines[0], "AKS Flex Node Agent");
    assert!(lines[1].starts_with("Version: ") && lines[1].len() > 9);
    assert!(lines[2].starts_with("Git Commit: "));
    assert!(lines[3].starts_with("Build Time: "));
}

#[test]
fn usage_errors_exit_1() {
    bin().arg("frobnicate").assert().code(1);
    bin()
        .arg("preflight")
        .assert()
        .code(1)
        .stderr(predicate::str::contains("--config <PATH>"));
    bin().args(["start"]).assert().code(1);
}

#[test]
fn unknown_output_format_is_one_line_exit_1() {
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(d.path(), TOKEN_FIXTURE);
    bin()
        .args(["preflight", "--output", "yaml", "--config"])
        .arg(&cfg)
        .assert()
        .code(1)
        .stdout("")
        .stderr("Command execution failed: unsupported output format \"yaml\"\n");
}

#[test]
fn bad_configs_are_one_line_errors_naming_the_problem() {
    let d = tempfile::tempdir().unwrap();
    let missing = d.path().join("missing.json");
    bin()
        .args(["preflight", "--config"])
        .arg(&missing)
        .assert()
        .code(1)
        .stderr(predicate::str::starts_with(format!(
            "Command execution failed: failed to load config from {}: failed to read config file at {}",
            missing.display(),
            missing.display()
        )));
    let bad_json = write_config(d.path(), "{\"agent\": ");
    bin()
        .args(["preflight", "--config"])
        .arg(&bad_json)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("failed to parse config file"));
    let bad_field = write_config(
        d.path(),
        &TOKEN_FIXTURE.replace("\"logLevel\": \"debug\"", "\"logLevel\": \"loud\""),
    );
    let out = bin()
        .args(["preflight", "--config"])
        .arg(&bad_field)
        .assert()
        .code(1)
        .get_output()
        .stderr
        .clone();
    let err = String::from_utf8(out).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("config validation failed: agent.logLevel: \"loud\" is not one of debug, info, warning, error"),
        "{err}"
    );
}

/// preflight against this real machine: every check runs; with all errors ignored it passes and
/// the JSON report parses.
#[test]
fn preflight_json_on_this_host() {
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(d.path(), TOKEN_FIXTURE);
    let out = bin()
        .args([
            "preflight",
            "--output",
            "json",
            "--ignore-preflight-errors",
            "all",
            "--config",
        ])
        .arg(&cfg)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(report["status"], "ok");
    assert_eq!(report["summary"]["errors"], 0);
    let names: Vec<_> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names[0], "is-privileged-user");
    assert!(names.contains(&"disk-space".to_string()));
}

#[test]
fn preflight_text_on_this_host() {
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(d.path(), TOKEN_FIXTURE);
    bin()
        .args(["preflight", "--ignore-preflight-errors=all", "--config"])
        .arg(&cfg)
        .assert()
        .success()
        .stdout(predicate::str::starts_with(
            "[preflight] Running AKS Flex Node preflight checks\n",
        ))
        .stdout(predicate::str::contains("cgroups]: "));
}

/// A copy of the binary that an unprivileged user can execute, and the argv prefix that runs it
/// as `nobody` (when the tests run as root) or as the current non-root user.
fn as_unprivileged(d: &Path) -> (PathBuf, Vec<String>) {
    use std::os::unix::fs::PermissionsExt;
    let exe = d.join("aks-flex-node");
    std::fs::copy(assert_cmd::cargo::cargo_bin("aks-flex-node"), &exe).unwrap();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    if is_root() {
        (
            PathBuf::from("setpriv"),
            vec![
                "--reuid=65534".into(),
                "--regid=65534".into(),
                "--clear-groups".into(),
                exe.display().to_string(),
            ],
        )
    } else {
        (exe, vec![])
    }
}

#[test]
fn root_commands_refuse_other_users_and_write_nothing() {
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(
        d.path(),
        &TOKEN_FIXTURE.replace(
            "/var/log/aks-flex-node",
            &d.path().join("logs").display().to_string(),
        ),
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (prog, prefix) = as_unprivileged(d.path());
    for args in [
        vec!["start", "--config", cfg.to_str().unwrap()],
        vec!["daemon", "--config", cfg.to_str().unwrap()],
        vec!["reset"],
    ] {
        let before: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        let out = Command::new(&prog)
            .args(&prefix)
            .args(&args)
            .assert()
            .code(1)
            .get_output()
            .stderr
            .clone();
        let err = String::from_utf8(out).unwrap();
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with(&format!(
                "Command execution failed: aks-flex-node {} must run as root",
                args[0]
            )),
            "{err}"
        );
        let after: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(before, after, "{args:?} wrote into its directory");
    }
}

/// The daemon for real (as root): loads the config, logs that it is ready, and exits 0 on
/// SIGTERM. Its log file must not contain the config's secrets.
#[test]
fn daemon_stops_cleanly_on_sigterm_and_logs_no_secrets() {
    if !is_root() {
        eprintln!("skipped: the daemon needs root");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let logs = d.path().join("logs");
    let mut v: serde_json::Value = serde_json::from_str(TOKEN_FIXTURE).unwrap();
    v["agent"]["logDir"] = serde_json::json!(logs.display().to_string());
    v["agent"]["logLevel"] = serde_json::json!("debug");
    v["azure"]["servicePrincipal"] = serde_json::json!({
        "tenantId": "t", "clientId": "c", "clientSecret": "sp-client-secret-value"
    });
    let cfg = write_config(d.path(), &v.to_string());
    #[allow(clippy::disallowed_methods)] // the test needs the child's pid to signal it
    let child = std::process::Command::new(assert_cmd::cargo::cargo_bin("aks-flex-node"))
        .args(["daemon", "--config"])
        .arg(&cfg)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let log_file = logs.join("aks-flex-node.log");
    let start = std::time::Instant::now();
    while !std::fs::read_to_string(&log_file)
        .unwrap_or_default()
        .contains("daemon starting")
    {
        assert!(
            start.elapsed().as_secs() < 30,
            "daemon never logged that it started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let log = std::fs::read_to_string(&log_file).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    for text in [&log, &stderr.to_string()] {
        assert!(
            text.contains("loaded config"),
            "debug config line missing: {text}"
        );
        assert!(text.contains("daemon shutting down"));
        for secret in ["0123456789abcdef", "sp-client-secret-value"] {
            assert!(!text.contains(secret), "secret {secret} logged:\n{text}");
        }
        assert!(text.contains("***REDACTED***"));
    }
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&log_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
}
