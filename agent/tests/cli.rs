//! The `aks-flex-node` binary, run for real (assert_cmd): help, version, preflight on good and
//! bad configs, exit codes, root checks, the daemon's clean SIGTERM path, and `token kubelogin`
//! end to end. Nothing in the agent is faked; `token kubelogin` talks to a scripted HTTP server
//! on 127.0.0.1 (`flex_testkit::http`) playing Microsoft Entra ID and IMDS, reached through
//! `AZURE_AUTHORITY_HOST` and `AKS_FLEX_NODE_IMDS_ENDPOINT`. No test here changes the machine
//! (start and reset are only run where they must refuse).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use flex_testkit::http::{Reply, ScriptedServer};
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
    let err = preflight_error(
        &TOKEN_FIXTURE.replace("\"logLevel\": \"debug\"", "\"logLevel\": \"loud\""),
    );
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
        vec!["repave", "--settings-version", "v2"],
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

// --- token kubelogin ---------------------------------------------------------------------------

const SP_SECRET: &str = "sp-s3cret+/=&value";
const AAD_TOKEN: &str = "eyJ0eXAiOiJKV1Qi.kubelogin.token";
const AKS_SERVER_ID: &str = "6dae42f8-4368-4678-94ff-3960e28e3630";

/// `token kubelogin` with only the given environment (so nothing on this host leaks in).
fn kubelogin(env: &[(&str, &str)]) -> Command {
    let mut c = bin();
    c.env_clear().args(["token", "kubelogin"]);
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

fn spn_env(authority: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AAD_LOGIN_METHOD", "spn".into()),
        ("AAD_SERVICE_PRINCIPAL_CLIENT_ID", "client-1".into()),
        ("AAD_SERVICE_PRINCIPAL_CLIENT_SECRET", SP_SECRET.into()),
        ("AZURE_TENANT_ID", "tenant-1".into()),
        ("AZURE_AUTHORITY_HOST", authority.into()),
    ]
}

fn as_refs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

fn form(body: &str) -> std::collections::BTreeMap<String, String> {
    url::form_urlencoded::parse(body.as_bytes())
        .into_owned()
        .collect()
}

#[test]
fn token_kubelogin_prints_an_exec_credential_from_entra_id() {
    let aad = ScriptedServer::start(vec![Reply::json(
        200,
        &format!(r#"{{"token_type":"Bearer","expires_in":3599,"access_token":"{AAD_TOKEN}"}}"#),
    )])
    .unwrap();
    let mut env = spn_env(&aad.url("/"));
    env.push((
        "KUBERNETES_EXEC_INFO",
        r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1beta1","spec":{"interactive":false}}"#.into(),
    ));
    let out = kubelogin(&as_refs(&env))
        .assert()
        .success()
        .stderr("")
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.starts_with("{\n  \"kind\": \"ExecCredential\",\n"),
        "{text}"
    );
    assert!(text.ends_with("}\n"), "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["apiVersion"], "client.authentication.k8s.io/v1beta1");
    assert_eq!(v["spec"], serde_json::json!({"interactive": false}));
    assert_eq!(v["status"]["token"], AAD_TOKEN);
    let expiry = v["status"]["expirationTimestamp"].as_str().unwrap();
    let expiry: k8s_openapi::jiff::Timestamp = expiry.parse().unwrap();
    let left = expiry.as_second() - k8s_openapi::jiff::Timestamp::now().as_second();
    assert!((3500..=3600).contains(&left), "{expiry} is {left}s away");

    let reqs = aad.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].method, "POST");
    assert_eq!(reqs[0].target, "/tenant-1/oauth2/v2.0/token");
    let f = form(&reqs[0].body_text());
    assert_eq!(f["grant_type"], "client_credentials");
    assert_eq!(f["client_id"], "client-1");
    assert_eq!(f["client_secret"], SP_SECRET);
    assert_eq!(f["scope"], format!("{AKS_SERVER_ID}/.default"));
}

/// kubelet in a machine runs `token kubelogin` with the secret's file named
/// (`AAD_SERVICE_PRINCIPAL_CLIENT_SECRET_FILE`, as its kubeconfig has it), not the secret: the
/// real binary reads the file and sends its content (trailing newline trimmed) to a scripted
/// Entra ID. A missing or empty file is an error naming the variable and the path, and no
/// request is sent.
#[test]
fn token_kubelogin_reads_the_secret_from_the_file_a_machine_names() {
    let aad = ScriptedServer::start(vec![Reply::json(
        200,
        &format!(r#"{{"token_type":"Bearer","expires_in":3599,"access_token":"{AAD_TOKEN}"}}"#),
    )])
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("client-secret");
    std::fs::write(&secret_file, format!("{SP_SECRET}\n")).unwrap();
    let file_env = |path: &std::path::Path| {
        let mut env: Vec<(&'static str, String)> = spn_env(&aad.url("/"))
            .into_iter()
            .filter(|(k, _)| *k != "AAD_SERVICE_PRINCIPAL_CLIENT_SECRET")
            .collect();
        env.push((
            "AAD_SERVICE_PRINCIPAL_CLIENT_SECRET_FILE",
            path.display().to_string(),
        ));
        env
    };
    let env = file_env(&secret_file);
    let out = kubelogin(&as_refs(&env))
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["status"]["token"], AAD_TOKEN);
    let reqs = aad.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(form(&reqs[0].body_text())["client_secret"], SP_SECRET);

    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    for (path, want) in [
        (dir.path().join("absent"), "no such file"),
        (empty, "empty"),
    ] {
        let env = file_env(&path);
        let err = kubelogin(&as_refs(&env))
            .assert()
            .failure()
            .get_output()
            .stderr
            .clone();
        let err = String::from_utf8(err).unwrap();
        assert!(
            err.contains(&format!(
                "AAD_SERVICE_PRINCIPAL_CLIENT_SECRET_FILE {}: {want}",
                path.display()
            )),
            "{err}"
        );
    }
    assert_eq!(aad.requests().len(), 1, "no request without a secret");
}

/// `token acr` run as kubelet runs an image credential provider: the request on stdin, the
/// node's identity from the exec credential's environment (a service principal against a
/// scripted Entra ID), ACR's `/oauth2/exchange` scripted on loopback (named with `--registry`,
/// plain HTTP through `AKS_FLEX_NODE_INSECURE_REGISTRIES`): the response carries the refresh
/// token for the registry; an image elsewhere gets an empty response and no exchange.
#[test]
fn token_acr_answers_kubelets_credential_provider_request() {
    let aad = ScriptedServer::start(vec![Reply::json(
        200,
        &format!(r#"{{"token_type":"Bearer","expires_in":3599,"access_token":"{AAD_TOKEN}"}}"#),
    )])
    .unwrap();
    let acr = ScriptedServer::start(vec![Reply::json(
        200,
        r#"{"refresh_token":"acr-refresh-token"}"#,
    )])
    .unwrap();
    let registry = acr.url("").trim_start_matches("http://").to_string();
    let mut env = spn_env(&aad.url("/"));
    env.push(("AKS_FLEX_NODE_INSECURE_REGISTRIES", registry.clone()));
    let run = |image: &str| {
        let mut c = bin();
        c.env_clear()
            .args(["token", "acr", "--registry", &registry])
            .write_stdin(format!(
                r#"{{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"{image}"}}"#
            ));
        for (k, v) in &env {
            c.env(k, v);
        }
        let out = c.assert().success().stderr("").get_output().stdout.clone();
        serde_json::from_slice::<serde_json::Value>(&out).unwrap()
    };
    let v = run(&format!("{registry}/team/app:1.0"));
    assert_eq!(v["kind"], "CredentialProviderResponse");
    assert_eq!(v["apiVersion"], "credentialprovider.kubelet.k8s.io/v1");
    assert_eq!(v["cacheKeyType"], "Registry");
    assert_eq!(v["cacheDuration"], "30m0s");
    assert_eq!(
        v["auth"][&registry],
        serde_json::json!({"username": "00000000-0000-0000-0000-000000000000", "password": "acr-refresh-token"})
    );
    let exchanged = acr.requests();
    assert_eq!(exchanged.len(), 1);
    assert_eq!(exchanged[0].target, "/oauth2/exchange");
    let f = form(&exchanged[0].body_text());
    assert_eq!(f["grant_type"], "access_token");
    assert_eq!(f["access_token"], AAD_TOKEN);
    assert_eq!(f["service"], registry);
    assert_eq!(f["tenant"], "tenant-1");
    assert_eq!(
        form(&aad.requests()[0].body_text())["scope"],
        "https://management.core.windows.net/.default"
    );

    let v = run("registry.k8s.io/pause:3.10");
    assert_eq!(v["auth"], serde_json::json!({}));
    assert_eq!(v["cacheDuration"], "0s");
    assert_eq!(acr.requests().len(), 1, "no exchange for another registry");
}

#[test]
fn token_kubelogin_with_a_managed_identity_asks_imds() {
    let imds = ScriptedServer::start(vec![Reply::json(
        200,
        &format!(r#"{{"access_token":"{AAD_TOKEN}","expires_in":"86399","expires_on":"1900000000","token_type":"Bearer"}}"#),
    )])
    .unwrap();
    let endpoint = imds.url("/metadata/identity/oauth2/token");
    let out = kubelogin(&[
        ("AAD_LOGIN_METHOD", "msi"),
        ("AZURE_CLIENT_ID", "mi-client"),
        ("AKS_FLEX_NODE_IMDS_ENDPOINT", &endpoint),
    ])
    .args(["--server-id", "api://custom"])
    .assert()
    .success()
    .get_output()
    .stdout
    .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        v["apiVersion"], "client.authentication.k8s.io/v1",
        "no KUBERNETES_EXEC_INFO"
    );
    assert_eq!(v["status"]["expirationTimestamp"], "2030-03-17T17:46:40Z");
    assert_eq!(v["status"]["token"], AAD_TOKEN);
    let reqs = imds.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].method, "GET");
    assert_eq!(reqs[0].path(), "/metadata/identity/oauth2/token");
    assert_eq!(reqs[0].header("metadata"), Some("true"));
    assert_eq!(
        form(reqs[0].query()),
        std::collections::BTreeMap::from([
            ("api-version".to_string(), "2018-02-01".to_string()),
            ("resource".to_string(), "api://custom".to_string()),
            ("client_id".to_string(), "mi-client".to_string()),
        ])
    );
}

#[test]
fn token_kubelogin_failures_are_one_line_without_the_secret() {
    let aad = ScriptedServer::start(vec![Reply::json(
        401,
        r#"{"error":"invalid_client","error_description":"AADSTS7000215: Invalid client secret provided."}"#,
    )])
    .unwrap();
    let env = spn_env(&aad.url("/"));
    let out = kubelogin(&as_refs(&env))
        .assert()
        .code(1)
        .stdout("")
        .get_output()
        .stderr
        .clone();
    let stderr = String::from_utf8(out).unwrap();
    assert_eq!(
        stderr,
        format!(
            "Command execution failed: get a token for {AKS_SERVER_ID}/.default: Microsoft Entra ID token request to {}: status 401 Unauthorized: invalid_client: AADSTS7000215: Invalid client secret provided.\n",
            aad.url("/tenant-1/oauth2/v2.0/token")
        )
    );
    assert!(!stderr.contains(SP_SECRET));

    // Refused before any request.
    let env = as_refs(&env);
    for (args, extra, want) in [
        (vec!["--server-id", ""], None, "server-id is required"),
        (
            vec!["--pop-enabled", "--pop-claims", "u=https://k"],
            None,
            "--pop-enabled: proof-of-possession tokens are not supported by this agent",
        ),
        (
            vec![],
            Some(
                r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1alpha1"}"#,
            ),
            "unsupported ExecCredential version \"v1alpha1\" (wanted v1 or v1beta1)",
        ),
    ] {
        let mut c = kubelogin(&env);
        if let Some(info) = extra {
            c.env("KUBERNETES_EXEC_INFO", info);
        }
        c.args(&args)
            .assert()
            .code(1)
            .stdout("")
            .stderr(format!("Command execution failed: {want}\n"));
    }
    kubelogin(&[])
        .assert()
        .code(1)
        .stderr("Command execution failed: AAD_LOGIN_METHOD is not set (supported: spn, msi)\n");
    assert_eq!(aad.requests().len(), 1);
}

/// The daemon's Kubernetes client in service principal mode, end to end: the exec credential of
/// `kubeclient::bootstrap_config` runs this binary's `token kubelogin` (kube spawns it, with the
/// config's `AAD_*` environment), which gets its token from the scripted Entra ID, and the
/// scripted API server receives that token as the bearer. Changed from the config's: only the
/// plugin's path (this build's binary) and `AZURE_AUTHORITY_HOST`.
#[tokio::test]
async fn the_kube_client_sends_the_token_that_token_kubelogin_prints() {
    use base64::Engine as _;
    let aad = ScriptedServer::start(vec![Reply::json(
        200,
        &format!(r#"{{"token_type":"Bearer","expires_in":3599,"access_token":"{AAD_TOKEN}"}}"#),
    )])
    .unwrap();
    let api = ScriptedServer::start(vec![Reply::json(
        404,
        r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"nodes \"n1\" not found","reason":"NotFound","code":404}"#,
    )])
    .unwrap();
    let ca = rcgen::generate_simple_self_signed(vec!["cluster-ca".to_string()]).unwrap();
    let mut cfg = aks_flex_node::config::Config::default();
    cfg.components.kubernetes = "1.35.0".into();
    cfg.node.kubelet.cluster_fqdn = api.url("");
    cfg.node.kubelet.ca_cert_data =
        base64::engine::general_purpose::STANDARD.encode(ca.cert.pem().as_bytes());
    cfg.azure.service_principal = Some(aks_flex_node::config::ServicePrincipal {
        tenant_id: "tenant-1".into(),
        client_id: "client-1".into(),
        client_secret: flex_host::secret::Secret::new(SP_SECRET),
    });
    let mut kc = aks_flex_node::kubeclient::bootstrap_config(&cfg)
        .await
        .unwrap();
    let exec = kc.auth_info.exec.as_mut().unwrap();
    exec.command = Some(
        assert_cmd::cargo::cargo_bin("aks-flex-node")
            .display()
            .to_string(),
    );
    exec.env.get_or_insert_default().push(
        [
            ("name".to_string(), "AZURE_AUTHORITY_HOST".to_string()),
            ("value".to_string(), aad.url("/")),
        ]
        .into(),
    );
    let client = aks_flex_node::kubeclient::client_from(kc).unwrap();
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
    match nodes.get("n1").await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 404),
        other => panic!("want the API server's 404, got {other:?}"),
    }
    let sent = api.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].path(), "/api/v1/nodes/n1");
    assert_eq!(
        sent[0].header("authorization"),
        Some(format!("Bearer {AAD_TOKEN}").as_str())
    );
    // kube runs the plugin more than once while building the client (for a client certificate
    // in its TLS setup, then for the bearer token); each run is a new process and asks anew.
    let asked = aad.requests();
    assert!(!asked.is_empty());
    for r in &asked {
        let f = form(&r.body_text());
        assert_eq!(f["client_secret"], SP_SECRET);
        assert_eq!(f["scope"], format!("{AKS_SERVER_ID}/.default"));
    }
}

/// Runs `preflight` on the config file `cfg` (the real binary), which must fail; returns its
/// stderr.
fn preflight_stderr(cfg: &Path) -> String {
    let out = bin()
        .args(["preflight", "--config"])
        .arg(cfg)
        .timeout(std::time::Duration::from_secs(30))
        .assert()
        .code(1)
        .get_output()
        .stderr
        .clone();
    String::from_utf8(out).unwrap()
}

/// Runs `preflight` on `json` (the real binary, a real file); returns its one-line stderr.
fn preflight_error(json: &str) -> String {
    let d = tempfile::tempdir().unwrap();
    let err = preflight_stderr(&write_config(d.path(), json));
    assert_eq!(err.lines().count(), 1, "{err}");
    err
}

/// Each cause is printed once: the I/O error of a missing file and a validation message
/// appear once in the line, not again as the chain's source.
#[test]
fn config_errors_print_each_cause_once() {
    let d = tempfile::tempdir().unwrap();
    let err = preflight_stderr(&d.path().join("missing.json"));
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    let err = preflight_error(
        &TOKEN_FIXTURE.replace("\"logLevel\": \"debug\"", "\"logLevel\": \"loud\""),
    );
    assert_eq!(err.matches("agent.logLevel").count(), 1, "{err}");
    assert_eq!(err.matches("is not one of").count(), 1, "{err}");
}

/// A huge value is cut in the message (at 100 characters, with its length), not echoed whole
/// (here 500 000 bytes, twice before).
#[test]
fn long_values_are_cut_in_error_messages() {
    let mut v: serde_json::Value = serde_json::from_str(TOKEN_FIXTURE).unwrap();
    v["agent"]["nodeName"] = serde_json::json!("A".repeat(500_000));
    let err = preflight_error(&v.to_string());
    assert!(err.len() < 1_000, "{} bytes: {}", err.len(), &err[..300]);
    assert!(err.contains("agent.nodeName"), "{err}");
    assert!(err.contains("…(500000 bytes)"), "{err}");
}

/// `maxPods` out of range fails when the config is loaded (it used to pass preflight and fail
/// only in `start`).
#[test]
fn max_pods_out_of_range_fails_at_load() {
    for bad in [-5i64, 1 << 40] {
        let mut v: serde_json::Value = serde_json::from_str(TOKEN_FIXTURE).unwrap();
        v["node"]["maxPods"] = serde_json::json!(bad);
        let err = preflight_error(&v.to_string());
        assert!(
            err.contains("config validation failed: node.maxPods:"),
            "{bad}: {err}"
        );
    }
}

/// A value of the wrong type is not echoed (it may be a secret): the message names the field
/// and the types only.
#[test]
fn type_errors_do_not_echo_the_value() {
    let mut v: serde_json::Value = serde_json::from_str(TOKEN_FIXTURE).unwrap();
    v["azure"]["bootstrapToken"]["token"] = serde_json::json!(987_654_321);
    let err = preflight_error(&v.to_string());
    assert!(err.contains("azure.bootstrapToken.token"), "{err}");
    assert!(err.contains("invalid type: integer, expected"), "{err}");
    assert!(!err.contains("987654321"), "{err}");
    v["azure"]["bootstrapToken"]["token"] = serde_json::json!(["abcdef.0123456789abcdef"]);
    let err = preflight_error(&v.to_string());
    assert!(!err.contains("0123456789abcdef"), "{err}");
}

/// The config file is read up to 1 MiB: a larger one is refused with a clear error (it was
/// read whole; `--config /dev/zero` read until memory ran out). Here: a valid config padded
/// with blanks past the limit.
#[test]
fn config_file_size_is_capped() {
    let padded = format!("{TOKEN_FIXTURE}{}", " ".repeat(2 << 20));
    let err = preflight_error(&padded);
    assert!(err.contains("is larger than 1 MiB"), "{err}");
    let err = preflight_stderr(Path::new("/dev/zero"));
    assert!(
        err.contains("config file at /dev/zero is larger than 1 MiB"),
        "{err}"
    );
}

const DRY_RUN_TOKEN: &str = "abcdef.0123456789abcdef";

/// A complete `bootstrap.env` for `bootstrap-node --dry-run`, plus `extra` lines.
fn bootstrap_env(dir: &Path, extra: &str) -> PathBuf {
    let p = dir.join("bootstrap.env");
    std::fs::write(
        &p,
        format!(
            "# test inputs\n\
             AKS_FLEX_NODE_CLUSTER_RESOURCE_ID=/subscriptions/12345678-1234-1234-1234-123456789012/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/aks1\n\
             AKS_FLEX_NODE_KUBERNETES_VERSION=1.35.0\n\
             AKS_FLEX_NODE_API_SERVER=aks1-dns-abc.hcp.westus2.azmk8s.io\n\
             AKS_FLEX_NODE_CA_CERT_DATA=LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJ0ZXN0Ci0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K\n\
             AKS_FLEX_NODE_BOOTSTRAP_TOKEN='{DRY_RUN_TOKEN}'\n\
             AKS_FLEX_NODE_NODE_NAME=edge-7\n{extra}"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    p
}

/// The host paths a bootstrap writes first, as they are now (existence, length, mtime).
fn bootstrap_host_paths() -> Vec<(String, Option<(u64, std::time::SystemTime)>)> {
    [
        "/etc/aks-flex-node/config.json",
        "/etc/systemd/system/aks-flex-node-agent.service",
        "/etc/systemd/system/aks-flex-node-recovery.service",
        "/etc/systemd/nspawn/kube1.nspawn",
        "/var/lib/machines/kube1",
    ]
    .into_iter()
    .map(|p| {
        let m = std::fs::symlink_metadata(p)
            .ok()
            .map(|m| (m.len(), m.modified().unwrap()));
        (p.to_string(), m)
    })
    .collect()
}

/// The real binary, `bootstrap-node --dry-run` on a good env file, run unprivileged (as
/// `nobody` when the tests run as root): it needs no root, exits 0, shows the config and units
/// with the token redacted, and changes none of the bootstrap's host paths.
#[test]
fn bootstrap_dry_run_renders_a_good_env_file_without_touching_the_host() {
    let d = tempfile::tempdir().unwrap();
    let env = bootstrap_env(d.path(), "");
    let (prog, prefix) = as_unprivileged(d.path());
    let before = bootstrap_host_paths();
    let out = Command::new(&prog)
        .args(&prefix)
        .args(["bootstrap-node", "--dry-run", "--env-file"])
        .arg(&env)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap())
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let out = String::from_utf8(out).unwrap();
    assert!(out.contains("nothing on this host was changed"), "{out}");
    assert!(
        out.contains("==> /etc/aks-flex-node/config.json (0600) <=="),
        "{out}"
    );
    assert!(
        out.contains("==> /etc/systemd/system/aks-flex-node-agent.service (0644) <=="),
        "{out}"
    );
    assert!(out.contains("\"nodeName\": \"edge-7\""), "{out}");
    assert!(!out.contains(DRY_RUN_TOKEN), "the token is shown: {out}");
    assert_eq!(bootstrap_host_paths(), before, "a host path changed");
}

/// The real binary with `--output-dir`: the files land under the directory (the config with
/// its token, 0600), and none of the bootstrap's host paths changes.
#[test]
fn bootstrap_dry_run_writes_under_the_output_dir_only() {
    let d = tempfile::tempdir().unwrap();
    let env = bootstrap_env(d.path(), "");
    let outdir = d.path().join("out");
    let before = bootstrap_host_paths();
    bin()
        .args(["bootstrap-node", "--dry-run", "--env-file"])
        .arg(&env)
        .arg("--output-dir")
        .arg(&outdir)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap())
        .assert()
        .success()
        .stdout(predicate::str::contains(outdir.display().to_string()));
    let cfg = std::fs::read_to_string(outdir.join("etc/aks-flex-node/config.json")).unwrap();
    assert!(cfg.contains(DRY_RUN_TOKEN));
    assert!(
        outdir
            .join("etc/systemd/system/aks-flex-node-agent.service")
            .is_file()
    );
    assert_eq!(bootstrap_host_paths(), before, "a host path changed");
}

/// The real binary on bad env files: exit 1 with `Command execution failed:` naming the input
/// (or the line) at fault, never the token; nothing on the host changes.
#[test]
fn bootstrap_dry_run_rejects_bad_env_files_naming_the_field() {
    let before = bootstrap_host_paths();
    for (extra, expect) in [
        (
            "AKS_FLEX_NODE_NODE_IP=10.0.0.300\n",
            "AKS_FLEX_NODE_NODE_IP",
        ),
        ("AKS_FLEX_NODE_LABELS=bad label=x\n", "AKS_FLEX_NODE_LABELS"),
        (
            "AKS_FLEX_NODE_KUBERNETES_VERSION=\n",
            "AKS_FLEX_NODE_KUBERNETES_VERSION",
        ),
        ("PATH=/tmp\n", "line 8"),
        (
            "AKS_FLEX_NODE_NOT_AN_INPUT=1\n",
            "AKS_FLEX_NODE_NOT_AN_INPUT",
        ),
        (
            "AKS_FLEX_NODE_TAINTS=\"unterminated\n",
            "line 8: unterminated double quote",
        ),
    ] {
        let d = tempfile::tempdir().unwrap();
        let env = bootstrap_env(d.path(), extra);
        let out = bin()
            .args(["bootstrap-node", "--dry-run", "--env-file"])
            .arg(&env)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap())
            .assert()
            .code(1)
            .get_output()
            .clone();
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(
            err.starts_with("Command execution failed: "),
            "{extra}: {err}"
        );
        assert!(err.contains(expect), "{extra}: {err}");
        assert!(!err.contains(DRY_RUN_TOKEN), "{extra}: {err}");
        assert!(out.stdout.is_empty(), "{extra}: printed a plan");
    }
    assert_eq!(bootstrap_host_paths(), before, "a host path changed");
}

/// `status` through the real binary on a node that was never bootstrapped: the files are an
/// empty temporary root (`--root`, the test-only override); systemd is the real one of the
/// machine running the tests (only asked `systemctl show`), so an unreachable systemd may be
/// reported too. Exit code 1 and the reason in both outputs; the root stays empty.
#[test]
fn status_on_a_never_bootstrapped_node_says_so_in_both_outputs() {
    let root = tempfile::tempdir().unwrap();
    for (format, needle) in [("text", "NotBootstrapped"), ("json", "\"NotBootstrapped\"")] {
        let out = bin()
            .args(["status", "--output", format, "--root"])
            .arg(root.path())
            .env_remove("AKS_FLEX_NODE_SYSTEMD_BACKEND")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{format}: {stdout}\n{stderr}");
        assert!(stdout.contains(needle), "{format} stdout: {stdout}");
        assert!(
            stderr.contains("node not healthy") && stderr.contains("never bootstrapped"),
            "{format} stderr: {stderr}"
        );
        if format == "json" {
            let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
            assert_eq!(v["schema"], "aks-flex-node.status/v1");
            assert_eq!(v["healthy"], false);
            assert_eq!(v["state"]["status"], "missing");
        }
    }
    assert_eq!(
        std::fs::read_dir(root.path()).unwrap().count(),
        0,
        "status wrote nothing"
    );
}
