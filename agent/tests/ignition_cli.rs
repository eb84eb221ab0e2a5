//! `aks-flex-node ignition`, the real binary (assert_cmd) on real files in a temporary
//! directory, and its output checked by Debian's real `ignition-validate` (package `ignition`;
//! bookworm's 2.14 knows specs up to 3.3.0, so these render 3.3.0). A missing validator fails
//! the test: CI installs it (`.ci/run`, `cargo xtask deps`). Nothing is faked.
//!
//! Bad input (a base config that does not parse, a control character, an unknown flag, a flag
//! the command sets itself, an existing output): exit code 1, one error naming the problem,
//! never the token, and nothing written.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use assert_cmd::Command;

const TOKEN: &str = "abcdef.0123456789abcdef";
const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const CA: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJ4ekNDQVcyZ0F3SUJBZ0lVVXhTQmRqeG8zUm9aQnB2ajkyd0FPdXZSQktFd0NnWUlLb1pJemowRUF3SXcKT0RFMk1EUUdBMVVFQXd3dFlXdHpMV1pzWlhndGJtOWtaU0J2Wm1ac2FXNWxJR2hoY201bGMzTWdRMEVnS0c1dgpJR05zZFhOMFpYSXBNQ0FYRFRJMk1USXdNakUyTWpFd04xb1lEekl4TWpZeE1UQTRNVFl5TVRBM1dqQTRNVFl3Ck5BWURWUVFEREMxaGEzTXRabXhsZUMxdWIyUmxJRzltWm14cGJtVWdhR0Z5Ym1WemN5QkRRU0FvYm04Z1kyeDEKYzNSbGNpa3dXVEFUQmdjcWhrak9QUUlCQmdncWhrak9QUU1CQndOQ0FBVHhQc2pNZWRkT3hZaFVyQmFHckU0SAphL0pNZG5PYzhGb042SUpKTll2UUNxbWNpaU9mZkV6YklmWHAwYjliUnFYUml6Njk4TWttQ2Q2QzdSc0FhbjJjCm8xTXdVVEFkQmdOVkhRNEVGZ1FVSGhLNVM3QlJBcGZHUmVRN1JjU1NqenlZY1RNd0h3WURWUjBqQkJnd0ZvQVUKSGhLNVM3QlJBcGZHUmVRN1JjU1NqenlZY1RNd0R3WURWUjBUQVFIL0JBVXdBd0VCL3pBS0JnZ3Foa2pPUFFRRApBZ05JQURCRkFpRUE2YnZsVm5xODJhYlU5N01mQVJScFJyZHlpa0hNUDVaVFhXWjYvUTFwTVVJQ0lBOU1ic2FXCkg1aGFTYVdzcU5KN05WQzQya21JL0dZYk01RDJwdGYvcnA3cgotLS0tLUVORCBDRVJUSUZJQ0FURS0tLS0tCg==";

const BUTANE_BASE: &str = "variant: flatcar\nversion: 1.1.0\npasswd:\n  users:\n    - name: azureuser\n      groups: [sudo]\n      ssh_authorized_keys:\n        - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests user\nstorage:\n  files:\n    - path: /etc/hostname\n      mode: 0644\n      overwrite: true\n      contents:\n        inline: node1\n";

const IGNITION_BASE: &str = r#"{"ignition":{"version":"3.3.0"},"storage":{"files":[{"path":"/etc/hostname","mode":420,"overwrite":true,"contents":{"source":"data:,node1"}}]}}"#;

fn bootstrap_args() -> Vec<String> {
    vec![
        "AKS_FLEX_NODE_CLUSTER_RESOURCE_ID=/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/g/providers/Microsoft.ContainerService/managedClusters/c".into(),
        "AKS_FLEX_NODE_KUBERNETES_VERSION=1.34.0".into(),
        "AKS_FLEX_NODE_API_SERVER=https://10.0.2.2:6443".into(),
        format!("AKS_FLEX_NODE_CA_CERT_DATA={CA}"),
        format!("AKS_FLEX_NODE_BOOTSTRAP_TOKEN={TOKEN}"),
        "AKS_FLEX_NODE_LOCATION=$(touch /tmp/x)".into(),
    ]
}

/// `aks-flex-node ignition --base-config BASE -o OUT --image … --spec 3.3.0 -- ARGS`.
fn ignition(base: &Path, out: &Path, args: &[String]) -> Command {
    ignition_cmd(base, out, None, args)
}

/// [`ignition`], with `--args-file FILE` when `file` is given.
fn ignition_cmd(base: &Path, out: &Path, file: Option<&str>, args: &[String]) -> Command {
    let mut c = Command::cargo_bin("aks-flex-node").unwrap();
    c.env_remove("AKS_FLEX_NODE_IMAGE")
        .arg("ignition")
        .arg("--base-config")
        .arg(base)
        .arg("-o")
        .arg(out)
        .args([
            "--image",
            &format!("10.0.2.100:5000/aks-flex/agent@{DIGEST}"),
            "--plain-http",
            "--insecure-registry",
            "10.0.2.100:5000",
            "--spec",
            "3.3.0",
        ]);
    if let Some(f) = file {
        c.args(["--args-file", f]);
    }
    c.arg("--").args(args);
    c
}

async fn validate(path: &Path) -> flex_host::runner::Output {
    flex_testkit::ignition_validate(path).await
}

/// The files in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// From a Butane and from an Ignition base config: the output is 0600, passes the real
/// `ignition-validate` without a warning, writes bootstrap.env 0600 with the token, and has the
/// first-boot unit's drop-in that removes that file after a successful bootstrap.
#[tokio::test]
async fn output_passes_ignition_validate_from_butane_and_ignition_bases() {
    for (name, base_text) in [("base.bu", BUTANE_BASE), ("base.ign", IGNITION_BASE)] {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join(name);
        std::fs::write(&base, base_text).unwrap();
        let out = dir.path().join("node.ign");
        let run = ignition(&base, &out, &bootstrap_args()).assert().success();
        let o = run.get_output();
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!printed.contains(TOKEN), "{printed}");
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600, "{name}");
        assert_eq!(
            listing(dir.path()),
            [name, "node.ign"],
            "no temporary file left"
        );

        let v = validate(&out).await;
        assert!(
            v.success() && v.stdout.trim().is_empty() && v.stderr.trim().is_empty(),
            "{name}: ignition-validate: exit {:?}\nstdout: {}\nstderr: {}",
            v.code,
            v.stdout,
            v.stderr
        );

        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        assert_eq!(json["ignition"]["version"], "3.3.0");
        let files = json["storage"]["files"].as_array().unwrap();
        assert!(
            files.iter().any(|f| f["path"] == "/etc/hostname"),
            "{name}: the base's file"
        );
        let env = files
            .iter()
            .find(|f| f["path"] == "/etc/aks-flex-node/bootstrap.env")
            .unwrap();
        assert_eq!(env["mode"], 0o600);
        let units = json["systemd"]["units"].as_array().unwrap();
        let boot = units
            .iter()
            .find(|u| u["name"] == "aks-flex-node-bootstrap.service")
            .unwrap();
        assert_eq!(boot["enabled"], true);
        let dropin = boot["dropins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == "10-remove-bootstrap-env.conf")
            .unwrap();
        let text = dropin["contents"].as_str().unwrap();
        assert!(text.contains("[Service]\n"), "{text}");
        assert!(
            text.lines()
                .any(|l| l == "ExecStartPost=/bin/rm -f /etc/aks-flex-node/bootstrap.env"),
            "{text}"
        );
        // The base's user survives the merge (Butane base).
        if name == "base.bu" {
            assert_eq!(json["passwd"]["users"][0]["name"], "azureuser");
        }
    }
}

/// Each bad input: exit code 1, `Command execution failed: ` and words naming the problem on
/// stderr, never the token, and the directory exactly as before (no output, no temporary file).
#[test]
fn bad_input_names_the_problem_and_writes_nothing() {
    let with = |extra: &str| {
        let mut a = bootstrap_args();
        a.push(extra.to_string());
        a
    };
    let cases: Vec<(&str, &str, Vec<String>, &[&str])> = vec![
        (
            "base config that does not parse",
            "variant: 'unterminated\n",
            bootstrap_args(),
            &["base.bu", "Butane base config", "invalid YAML"],
        ),
        (
            "Ignition base config with a field outside the subset",
            r#"{"ignition":{"version":"3.3.0"},"storage":{"disks":[]}}"#,
            bootstrap_args(),
            &["base.bu", "Ignition base config", "disks"],
        ),
        (
            "control character",
            BUTANE_BASE,
            with("AKS_FLEX_NODE_NODE_NAME=node1\nAKS_FLEX_NODE_CONFIG=/evil"),
            &[
                "bootstrap argument 7",
                "AKS_FLEX_NODE_NODE_NAME",
                "control character",
                "U+000A",
            ],
        ),
        (
            "unknown flag",
            BUTANE_BASE,
            with("--frobnicate"),
            &["bootstrap argument 7", "unknown flag --frobnicate"],
        ),
        (
            "flag the command sets itself",
            BUTANE_BASE,
            with("--env-file=/tmp/other.env"),
            &[
                "bootstrap argument 7",
                "--env-file",
                "set by `aks-flex-node ignition` itself",
            ],
        ),
        (
            "unknown input",
            BUTANE_BASE,
            with("AKS_FLEX_NODE_NODENAME=x"),
            &["AKS_FLEX_NODE_NODENAME is not a bootstrap input"],
        ),
        (
            "input the renderer refuses",
            BUTANE_BASE,
            with("AKS_FLEX_NODE_NODE_IP=10.0.0"),
            &["AKS_FLEX_NODE_NODE_IP"],
        ),
    ];
    for (what, base_text, args, words) in cases {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base.bu");
        std::fs::write(&base, base_text).unwrap();
        let out = dir.path().join("node.ign");
        let o = ignition(&base, &out, &args)
            .assert()
            .code(1)
            .get_output()
            .clone();
        let all = String::from_utf8_lossy(&o.stderr).into_owned();
        // The token on the command line is warned about first (it is, in these cases); then
        // one error.
        let stderr = all
            .strip_prefix(
                "warning: AKS_FLEX_NODE_BOOTSTRAP_TOKEN on the command line is visible to every user of this machine (the process list) and stays in the shell's history; give it in a file with --args-file FILE, or on standard input with --args-file -\n",
            )
            .unwrap_or(&all)
            .to_string();
        assert!(
            stderr.starts_with("Command execution failed: "),
            "{what}: {stderr}"
        );
        for w in words {
            assert!(stderr.contains(w), "{what}: {stderr:?} lacks {w:?}");
        }
        assert!(!stderr.contains(TOKEN), "{what}: {stderr}");
        assert_eq!(
            listing(dir.path()),
            ["base.bu"],
            "{what}: something was written"
        );
    }
}

/// An existing output is never replaced: exit 1, the error names it, its bytes stay, and
/// nothing else appears.
#[test]
fn existing_output_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.bu");
    std::fs::write(&base, BUTANE_BASE).unwrap();
    let out = dir.path().join("node.ign");
    std::fs::write(&out, "keep me").unwrap();
    let o = ignition(&base, &out, &bootstrap_args())
        .assert()
        .code(1)
        .get_output()
        .clone();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("node.ign"), "{stderr}");
    assert!(stderr.contains("exists"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep me");
    assert_eq!(listing(dir.path()), ["base.bu", "node.ign"]);
}

/// Bootstrap arguments come after `--`; without them clap refuses the command.
#[test]
fn bootstrap_arguments_are_required() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.bu");
    std::fs::write(&base, BUTANE_BASE).unwrap();
    let out = dir.path().join("node.ign");
    ignition(&base, &out, &[]).assert().code(1);
    assert_eq!(listing(dir.path()), ["base.bu"]);
}

/// `aks-flex-node ignition … --args-file FILE -- ARGS`.
fn ignition_with_file(base: &Path, out: &Path, file: &str, args: &[String]) -> Command {
    ignition_cmd(base, out, Some(file), args)
}

/// The bootstrap arguments from a file and from standard input (`--args-file`, bootstrap.env's
/// format, a comment and a quoted value included) give the same config, byte for byte, as on
/// the command line, with no warning; the token on the command line gets a warning that names
/// the key, never the value. A key both in the file and after `--` is refused, writing
/// nothing.
#[test]
fn bootstrap_arguments_from_a_file_or_stdin_keep_the_token_off_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.bu");
    std::fs::write(&base, BUTANE_BASE).unwrap();
    let args = bootstrap_args();
    let (token_arg, rest): (Vec<String>, Vec<String>) = args
        .iter()
        .cloned()
        .partition(|a| a.starts_with("AKS_FLEX_NODE_BOOTSTRAP_TOKEN="));
    let file = dir.path().join("secrets.env");
    std::fs::write(
        &file,
        format!("# the bootstrap token\nAKS_FLEX_NODE_BOOTSTRAP_TOKEN=\"{TOKEN}\"\n"),
    )
    .unwrap();

    // The file's assignments come first, as bootstrap.env keeps the order it was given.
    let token_first: Vec<String> = token_arg.iter().chain(&rest).cloned().collect();
    let argv_out = dir.path().join("argv.ign");
    let warned = ignition(&base, &argv_out, &token_first).assert().success();
    let stderr = String::from_utf8_lossy(&warned.get_output().stderr).into_owned();
    assert!(
        stderr.contains("warning: AKS_FLEX_NODE_BOOTSTRAP_TOKEN on the command line")
            && stderr.contains("--args-file"),
        "{stderr}"
    );
    assert!(!stderr.contains(TOKEN), "{stderr}");

    let file_out = dir.path().join("file.ign");
    let quiet = ignition_with_file(&base, &file_out, file.to_str().unwrap(), &rest)
        .assert()
        .success();
    assert!(
        !String::from_utf8_lossy(&quiet.get_output().stderr).contains("warning"),
        "no warning without the token on the command line"
    );

    let stdin_out = dir.path().join("stdin.ign");
    let all_lines: String = token_first
        .iter()
        .map(|a| {
            let (k, v) = a.split_once('=').unwrap();
            format!("{k}='{v}'\n")
        })
        .collect();
    ignition_with_file(&base, &stdin_out, "-", &[])
        .write_stdin(all_lines)
        .assert()
        .success();

    let argv_json = std::fs::read(&argv_out).unwrap();
    assert_eq!(std::fs::read(&file_out).unwrap(), argv_json, "file");
    assert_eq!(std::fs::read(&stdin_out).unwrap(), argv_json, "stdin");

    let dup_out = dir.path().join("dup.ign");
    let refused = ignition_with_file(&base, &dup_out, file.to_str().unwrap(), &args)
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&refused.get_output().stderr).into_owned();
    assert!(stderr.contains("AKS_FLEX_NODE_BOOTSTRAP_TOKEN"), "{stderr}");
    assert!(!stderr.contains(TOKEN), "{stderr}");
    assert!(!dup_out.exists());

    let missing = ignition_with_file(&base, &dup_out, "/nonexistent/args.env", &rest)
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&missing.get_output().stderr).into_owned();
    assert!(
        stderr.contains("--args-file: read /nonexistent/args.env"),
        "{stderr}"
    );
}
