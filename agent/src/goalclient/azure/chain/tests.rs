//! The default credential chain: Entra ID and IMDS are scripted HTTP servers on loopback (real
//! client and sockets, scripted answers), the federated token a real file under a temporary
//! root, `az` the recording fake runner (the one fake, at the runner's boundary).

use std::collections::BTreeMap;

use flex_host::runner::Output;
use flex_testkit::FakeRunner;
use flex_testkit::http::{Reply, ScriptedServer};

use super::*;
use crate::goalclient::azure::{CLIENT_ID_ENV, TENANT_ID_ENV};

const SCOPE: &str = "https://management.core.windows.net//.default";
const TOKEN: &str = r#"{"access_token":"tok-SECRET","expires_in":3600,"token_type":"Bearer"}"#;

fn env(pairs: &[(&str, &str)]) -> Env {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A closed loopback port as IMDS: the probe's connection is refused at once.
fn closed_imds() -> Url {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://{}/metadata/identity/oauth2/token",
        l.local_addr().unwrap()
    );
    drop(l);
    Url::parse(&url).unwrap()
}

fn no_az() -> Arc<FakeRunner> {
    let r = FakeRunner::new();
    r.without("az");
    Arc::new(r)
}

fn chain(
    e: &Env,
    root: &std::path::Path,
    runner: Arc<FakeRunner>,
    authority: &Url,
    imds: &Url,
) -> DefaultAzureCredential {
    flex_host::http::install_crypto();
    DefaultAzureCredential::new(e, HostFs::new(root), runner, authority, imds).unwrap()
}

fn form(body: &[u8]) -> BTreeMap<String, String> {
    url::form_urlencoded::parse(body).into_owned().collect()
}

#[tokio::test]
async fn the_environments_client_secret_comes_first() {
    let entra = ScriptedServer::start(vec![Reply::json(200, TOKEN)]).unwrap();
    let imds = ScriptedServer::start(vec![Reply::json(200, TOKEN)]).unwrap();
    let t = tempfile::tempdir().unwrap();
    let e = env(&[
        (TENANT_ID_ENV, "tenant-1"),
        (CLIENT_ID_ENV, "client-1"),
        (CLIENT_SECRET_ENV, "secret-SECRET"),
    ]);
    let c = chain(
        &e,
        t.path(),
        no_az(),
        &Url::parse(&entra.url("/")).unwrap(),
        &Url::parse(&imds.url("/token")).unwrap(),
    );
    let tok = c.token(SCOPE).await.unwrap();
    assert_eq!(tok.token.expose(), "tok-SECRET");
    assert_eq!(c.chosen(), Some("environment"));
    let asked = entra.requests();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].path(), "/tenant-1/oauth2/v2.0/token");
    let f = form(&asked[0].body);
    assert_eq!(f["client_secret"], "secret-SECRET");
    assert_eq!(f["grant_type"], "client_credentials");
    assert!(
        imds.requests().is_empty(),
        "IMDS asked though the environment had a credential"
    );
}

#[tokio::test]
async fn a_federated_token_file_is_the_client_assertion() {
    let entra = ScriptedServer::start(vec![Reply::json(200, TOKEN)]).unwrap();
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("var/run/secrets")).unwrap();
    std::fs::write(t.path().join("var/run/secrets/token"), "federated-SECRET\n").unwrap();
    let e = env(&[
        (TENANT_ID_ENV, "tenant-1"),
        (CLIENT_ID_ENV, "client-1"),
        (FEDERATED_TOKEN_FILE_ENV, "/var/run/secrets/token"),
    ]);
    let c = chain(
        &e,
        t.path(),
        no_az(),
        &Url::parse(&entra.url("/")).unwrap(),
        &closed_imds(),
    );
    c.token(SCOPE).await.unwrap();
    assert_eq!(c.chosen(), Some("workload identity"));
    let f = form(&entra.requests()[0].body);
    assert_eq!(f["client_assertion"], "federated-SECRET");
    assert_eq!(f["client_assertion_type"], JWT_BEARER);
    assert_eq!(f["client_id"], "client-1");
    assert!(!f.contains_key("client_secret"));
}

#[tokio::test]
async fn managed_identity_when_imds_answers_and_the_cli_when_it_has_no_identity() {
    let t = tempfile::tempdir().unwrap();
    let imds = ScriptedServer::start(vec![Reply::json(
        200,
        r#"{"access_token":"mi-SECRET","expires_on":"4102444800"}"#,
    )])
    .unwrap();
    let c = chain(
        &Env::new(),
        t.path(),
        no_az(),
        &closed_imds(),
        &Url::parse(&imds.url("/token")).unwrap(),
    );
    assert_eq!(c.token(SCOPE).await.unwrap().token.expose(), "mi-SECRET");
    assert_eq!(c.chosen(), Some("managed identity"));

    // IMDS answers 400 (no identity assigned): the CLI's login is used.
    let imds = ScriptedServer::start(vec![Reply::json(
        400,
        r#"{"error":"invalid_request","error_description":"Identity not found"}"#,
    )])
    .unwrap();
    let az = FakeRunner::new();
    az.on(
        "az account get-access-token",
        Output::ok(r#"{"accessToken":"cli-SECRET","expiresOn":"2099-01-01 00:00:00.000000","expires_on":4070908800,"tokenType":"Bearer"}"#),
    );
    let az = Arc::new(az);
    let e = env(&[(TENANT_ID_ENV, "tenant-1")]);
    let c = chain(
        &e,
        t.path(),
        az.clone(),
        &closed_imds(),
        &Url::parse(&imds.url("/token")).unwrap(),
    );
    let tok = c.token(SCOPE).await.unwrap();
    assert_eq!(tok.token.expose(), "cli-SECRET");
    assert_eq!(
        tok.expires_at,
        Some(UNIX_EPOCH + Duration::from_secs(4_070_908_800))
    );
    assert_eq!(c.chosen(), Some("Azure CLI"));
    assert_eq!(
        az.calls(),
        [
            "az account get-access-token --output json --resource https://management.core.windows.net/ --tenant tenant-1"
        ]
    );
    // One probe of IMDS, no retries.
    assert_eq!(imds.requests().len(), 1);
}

#[tokio::test]
async fn nothing_available_is_one_error_listing_what_was_tried() {
    let t = tempfile::tempdir().unwrap();
    let e = env(&[(CLIENT_CERTIFICATE_PATH_ENV, "/etc/cert.pem")]);
    let c = chain(&e, t.path(), no_az(), &closed_imds(), &closed_imds());
    let msg = c.token(SCOPE).await.unwrap_err().to_string();
    assert!(
        msg.starts_with("the default Azure credential chain found no credential; tried environment: AZURE_CLIENT_CERTIFICATE_PATH is set, and client certificates are not supported"),
        "{msg}"
    );
    for s in [
        "; workload identity: AZURE_FEDERATED_TOKEN_FILE, AZURE_TENANT_ID and AZURE_CLIENT_ID are not all set",
        "; managed identity: IMDS did not answer within 1s",
        "; Azure CLI: az is not on PATH",
    ] {
        assert!(msg.contains(s), "{s}: {msg}");
    }

    // az installed but not logged in: unavailable, with its own words.
    let az = FakeRunner::new();
    az.on(
        "az account get-access-token",
        Output {
            code: Some(1),
            stdout: String::new(),
            stderr: "ERROR: Please run 'az login' to setup account.\n".into(),
        },
    );
    let c = chain(
        &Env::new(),
        t.path(),
        Arc::new(az),
        &closed_imds(),
        &closed_imds(),
    );
    let msg = c.token(SCOPE).await.unwrap_err().to_string();
    assert!(
        msg.ends_with("Azure CLI: not logged in (ERROR: Please run 'az login' to setup account.)"),
        "{msg}"
    );
}

/// A configured source that fails ends the chain (azidentity's rule): a refused secret does not
/// fall through to IMDS, and the error names the source, never the secret.
#[tokio::test]
async fn a_configured_source_that_fails_ends_the_chain() {
    let entra = ScriptedServer::start(vec![Reply::json(
        401,
        r#"{"error":"invalid_client","error_description":"bad secret-SECRET"}"#,
    )])
    .unwrap();
    let imds = ScriptedServer::start(vec![Reply::json(200, TOKEN)]).unwrap();
    let t = tempfile::tempdir().unwrap();
    let e = env(&[
        (TENANT_ID_ENV, "tenant-1"),
        (CLIENT_ID_ENV, "client-1"),
        (CLIENT_SECRET_ENV, "secret-SECRET"),
    ]);
    let c = chain(
        &e,
        t.path(),
        no_az(),
        &Url::parse(&entra.url("/")).unwrap(),
        &Url::parse(&imds.url("/token")).unwrap(),
    );
    let msg = c.token(SCOPE).await.unwrap_err().to_string();
    assert!(
        msg.starts_with("default Azure credential chain: environment: "),
        "{msg}"
    );
    assert!(msg.contains("invalid_client"), "{msg}");
    assert!(!msg.contains("secret-SECRET"), "{msg}");
    assert!(imds.requests().is_empty());
    assert_eq!(c.chosen(), None);
}

#[test]
fn az_output_is_read_without_quoting_it() {
    let t = parse_az_token(r#"{"accessToken":"a","expires_on":"1700000000"}"#).unwrap();
    assert_eq!(
        t.expires_at,
        Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
    );
    // Before Azure CLI 2.54: no epoch expiry, so not reused.
    assert_eq!(
        parse_az_token(r#"{"accessToken":"a"}"#).unwrap().expires_at,
        None
    );
    assert_eq!(
        parse_az_token("nope").unwrap_err(),
        "its output is not JSON"
    );
    assert_eq!(
        parse_az_token(r#"{"token":"x"}"#).unwrap_err(),
        "its output has no accessToken"
    );
}
