//! Azure credential tests. Real: the credentials' HTTP client against a scripted HTTP server on
//! 127.0.0.1 (`flex_testkit::http`) that plays Microsoft Entra ID and IMDS; the form fields,
//! query strings and headers checked are what the credential sent over the socket. Scripted:
//! only the server's answers (tokens, error bodies, statuses). The pure parts (token
//! responses, endpoint rules, selection from a config or kubelogin's environment) are tables.

use std::net::TcpListener;

use super::*;
use crate::config::{ManagedIdentity, ServicePrincipal};
use crate::kubeclient::mock::LogCapture;
use flex_testkit::http::{Reply, ScriptedServer};

/// Characters a form encoder must escape, so the test sees the encoding too.
const SECRET: &str = "sp-s3cret+/=&value";
const TOKEN: &str = "eyJ0eXAiOiJKV1Qi.access.token";
const SERVER_ID: &str = "6dae42f8-4368-4678-94ff-3960e28e3630";

fn env(pairs: &[(&str, &str)]) -> Env {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn fast(attempts: u32) -> Backoff {
    Backoff::new(attempts, Duration::from_millis(1), Duration::from_millis(5))
}

fn form(body: &str) -> BTreeMap<String, String> {
    url::form_urlencoded::parse(body.as_bytes())
        .into_owned()
        .collect()
}

fn token_reply(extra: &str) -> Reply {
    Reply::json(
        200,
        &format!(r#"{{"token_type":"Bearer",{extra}"access_token":"{TOKEN}"}}"#),
    )
}

fn client_secret(server: &ScriptedServer) -> ClientSecretCredential {
    let host = Url::parse(&server.url("/aad/")).unwrap();
    ClientSecretCredential::new("tenant-1", "client-1", Secret::new(SECRET), &host)
        .unwrap()
        .with_backoff(fast(3))
}

#[test]
fn token_responses_table() {
    let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
    let ok = |body: &str| parse_token_response(body.as_bytes(), now).unwrap();
    let t = ok(r#"{"access_token":"abc","expires_in":3599}"#);
    assert_eq!(t.token.expose(), "abc");
    assert_eq!(t.expires_at, Some(now + Duration::from_secs(3599)));
    let t = ok(r#"{"access_token":"abc","expires_in":"60"}"#);
    assert_eq!(t.expires_at, Some(now + Duration::from_secs(60)));
    // IMDS: both, as strings; the absolute expiry wins.
    let t = ok(r#"{"access_token":"abc","expires_in":"86399","expires_on":"1900000000"}"#);
    assert_eq!(
        t.expires_at,
        Some(UNIX_EPOCH + Duration::from_secs(1_900_000_000))
    );
    let t = ok(r#"{"access_token":"abc","expires_on":1900000001}"#);
    assert_eq!(
        t.expires_at,
        Some(UNIX_EPOCH + Duration::from_secs(1_900_000_001))
    );

    for (body, want) in [
        (r#"{"expires_in":1}"#, "no access_token"),
        (
            r#"{"access_token":" ","expires_in":1}"#,
            "not a non-empty string",
        ),
        (
            r#"{"access_token":7,"expires_in":1}"#,
            "not a non-empty string",
        ),
        (
            r#"{"access_token":"tok-x1"}"#,
            "no expires_on or expires_in",
        ),
        (
            r#"{"access_token":"tok-x1","expires_in":"soon"}"#,
            "no expires_on or expires_in",
        ),
        (
            r#"{"access_token":"tok-x1","expires_in":-5}"#,
            "no expires_on or expires_in",
        ),
        (
            r#"{"access_token":"tok-x1","expires_on":18446744073709551615}"#,
            "out of range",
        ),
        ("[1]", "not a JSON object"),
        ("<html>tok-x1</html>", "not JSON"),
    ] {
        let e = parse_token_response(body.as_bytes(), now)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{body}: {e}");
        assert!(!e.contains("tok-x1"), "the error repeats the body: {e}");
    }
}

#[test]
fn status_errors_quote_entra_id_or_an_excerpt_without_the_secret() {
    let secret = Secret::new(SECRET);
    let err = |status: u16, body: &str| {
        status_error(
            "T",
            "https://e/t",
            reqwest::StatusCode::from_u16(status).unwrap(),
            body.as_bytes(),
            Some(&secret),
        )
        .to_string()
    };
    assert_eq!(
        err(
            400,
            r#"{"error":"invalid_grant","error_description":"AADSTS70000: x"}"#
        ),
        "T https://e/t: status 400 Bad Request: invalid_grant: AADSTS70000: x"
    );
    assert_eq!(
        err(403, r#"{"error":{"code":"Forbidden"}}"#),
        r#"T https://e/t: status 403 Forbidden: {"error":{"code":"Forbidden"}}"#,
        "another JSON shape is quoted"
    );
    assert_eq!(
        err(500, ""),
        "T https://e/t: status 500 Internal Server Error"
    );
    assert_eq!(
        err(400, &format!("echo {SECRET} echo")),
        "T https://e/t: status 400 Bad Request: echo ***REDACTED*** echo"
    );
    let long = err(502, &"x".repeat(5000));
    assert!(
        long.ends_with(&format!("{}…", "x".repeat(DETAIL_LIMIT))),
        "{long}"
    );
}

#[test]
fn resources_clouds_and_endpoint_rules() {
    assert_eq!(resource_of(&format!("{SERVER_ID}/.default")), SERVER_ID);
    assert_eq!(
        resource_of("https://management.core.windows.net//.default"),
        "https://management.core.windows.net/"
    );
    assert_eq!(resource_of("plain"), "plain");

    assert_eq!(
        cloud_of("https://MANAGEMENT.usgovcloudapi.net/").map(|c| c.authority_host),
        Some("https://login.microsoftonline.us/")
    );
    assert_eq!(
        cloud_of("https://management.chinacloudapi.cn").map(|c| c.authority_host),
        Some("https://login.chinacloudapi.cn/")
    );
    assert_eq!(cloud_of("https://arm.local:8443"), None);

    for ok in [
        "https://login.example",
        "http://127.0.0.1:8080/aad",
        "http://localhost/",
        "http://169.254.169.254/metadata/identity/oauth2/token",
        "http://10.0.0.4/token",
    ] {
        assert!(endpoint_url("X", ok).is_ok(), "{ok}");
    }
    for (bad, why) in [
        ("http://login.example/", "must be https"),
        ("ftp://127.0.0.1/", "must be an http or https URL"),
        ("login.example", "is not a URL"),
        ("file:///etc/passwd", "has no host"),
    ] {
        let e = endpoint_url("X", bad).unwrap_err().to_string();
        assert!(e.contains(why), "{bad}: {e}");
        assert!(e.starts_with(&format!("X {bad:?}")), "{e}");
    }
}

#[test]
fn kubelogin_environment_selects_the_credential() {
    let spn = [
        (LOGIN_METHOD_ENV, "spn"),
        (SP_CLIENT_ID_ENV, "client-1"),
        (SP_CLIENT_SECRET_ENV, SECRET),
        (TENANT_ID_ENV, "tenant-1"),
    ];
    let Credential::ClientSecret(c) = from_kubelogin_env(&env(&spn)).unwrap() else {
        panic!("spn is a client secret credential");
    };
    assert_eq!(
        c.token_url().as_str(),
        "https://login.microsoftonline.com/tenant-1/oauth2/v2.0/token"
    );
    let debug = format!("{c:?}");
    assert!(!debug.contains(SECRET), "{debug}");

    let mut with_host = spn.to_vec();
    with_host.push((AUTHORITY_HOST_ENV, "http://127.0.0.1:9/aad"));
    let Credential::ClientSecret(c) = from_kubelogin_env(&env(&with_host)).unwrap() else {
        panic!("spn");
    };
    assert_eq!(
        c.token_url().as_str(),
        "http://127.0.0.1:9/aad/tenant-1/oauth2/v2.0/token"
    );

    let Credential::ManagedIdentity(m) =
        from_kubelogin_env(&env(&[(LOGIN_METHOD_ENV, "msi")])).unwrap()
    else {
        panic!("msi is a managed identity credential");
    };
    assert_eq!(m.client_id(), None);
    assert_eq!(m.endpoint().as_str(), DEFAULT_IMDS_ENDPOINT);
    let Credential::ManagedIdentity(m) = from_kubelogin_env(&env(&[
        (LOGIN_METHOD_ENV, "msi"),
        (CLIENT_ID_ENV, "mi-client"),
        (IMDS_ENDPOINT_ENV, "http://127.0.0.1:9/imds"),
    ]))
    .unwrap() else {
        panic!("msi");
    };
    assert_eq!(m.client_id(), Some("mi-client"));
    assert_eq!(m.endpoint().as_str(), "http://127.0.0.1:9/imds");

    let missing_secret: Vec<_> = spn
        .iter()
        .copied()
        .filter(|(k, _)| *k != SP_CLIENT_SECRET_ENV)
        .collect();
    for (vars, want) in [
        (
            missing_secret,
            "AAD_SERVICE_PRINCIPAL_CLIENT_SECRET is required",
        ),
        (vec![], "AAD_LOGIN_METHOD is not set (supported: spn, msi)"),
        (
            vec![(LOGIN_METHOD_ENV, "devicecode")],
            "AAD_LOGIN_METHOD \"devicecode\" is not supported",
        ),
        (
            vec![
                (LOGIN_METHOD_ENV, "msi"),
                (IMDS_ENDPOINT_ENV, "http://imds.example/"),
            ],
            "AKS_FLEX_NODE_IMDS_ENDPOINT \"http://imds.example/\" must be https",
        ),
        (
            [
                spn.as_slice(),
                &[(AUTHORITY_HOST_ENV, "http://login.example/")],
            ]
            .concat(),
            "AZURE_AUTHORITY_HOST \"http://login.example/\" must be https",
        ),
        (
            [spn.as_slice(), &[(TENANT_ID_ENV, "../evil")]].concat(),
            "tenant \"../evil\" is not a tenant id or domain",
        ),
    ] {
        let e = from_kubelogin_env(&env(&vars)).unwrap_err().to_string();
        assert!(e.contains(want), "{vars:?}: {e}");
        assert!(!e.contains(SECRET), "{e}");
    }
}

#[test]
fn the_config_selects_the_credential() {
    let mut c = Config::default();
    assert!(from_config(&c, &Env::new()).unwrap().is_none(), "neither");

    c.azure.managed_identity = Some(ManagedIdentity {
        client_id: "mi-client".into(),
    });
    let Some(Credential::ManagedIdentity(m)) = from_config(&c, &Env::new()).unwrap() else {
        panic!("managed identity");
    };
    assert_eq!(m.client_id(), Some("mi-client"));

    c.azure.service_principal = Some(ServicePrincipal {
        tenant_id: "tenant-1".into(),
        client_id: "client-1".into(),
        client_secret: Secret::new(SECRET),
    });
    c.azure.resource_manager_endpoint = "https://management.usgovcloudapi.net".into();
    let Some(Credential::ClientSecret(s)) = from_config(&c, &Env::new()).unwrap() else {
        panic!("the service principal comes first");
    };
    assert_eq!(
        s.token_url().as_str(),
        "https://login.microsoftonline.us/tenant-1/oauth2/v2.0/token",
        "the ARM endpoint's cloud"
    );
    let overridden = env(&[(AUTHORITY_HOST_ENV, "https://login.sovereign.example")]);
    let Some(Credential::ClientSecret(s)) = from_config(&c, &overridden).unwrap() else {
        panic!("service principal");
    };
    assert_eq!(
        s.token_url().as_str(),
        "https://login.sovereign.example/tenant-1/oauth2/v2.0/token"
    );
    c.azure.resource_manager_endpoint = "https://arm.local:8443".into();
    let Some(Credential::ClientSecret(s)) = from_config(&c, &Env::new()).unwrap() else {
        panic!("service principal");
    };
    assert!(s.token_url().as_str().starts_with(DEFAULT_AUTHORITY_HOST));

    if let Some(sp) = c.azure.service_principal.as_mut() {
        sp.client_secret = Secret::new(" ");
    }
    let e = from_config(&c, &Env::new()).unwrap_err().to_string();
    assert_eq!(e, "service principal client secret is empty");
}

#[tokio::test]
async fn client_secret_posts_the_form_and_reads_the_token_from_a_real_server() {
    let server = ScriptedServer::start(vec![token_reply(r#""expires_in":3599,"#)]).unwrap();
    let c = client_secret(&server);
    let before = SystemTime::now();
    let t = c.token(&format!("{SERVER_ID}/.default")).await.unwrap();
    assert_eq!(t.token.expose(), TOKEN);
    let at = t.expires_at.unwrap();
    assert!(
        at >= before + Duration::from_secs(3599)
            && at <= SystemTime::now() + Duration::from_secs(3599)
    );

    let reqs = server.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].method, "POST");
    assert_eq!(reqs[0].target, "/aad/tenant-1/oauth2/v2.0/token");
    assert_eq!(
        reqs[0].header("content-type"),
        Some("application/x-www-form-urlencoded")
    );
    assert_eq!(
        form(&reqs[0].body_text()),
        BTreeMap::from([
            ("grant_type".to_string(), "client_credentials".to_string()),
            ("client_id".to_string(), "client-1".to_string()),
            ("client_secret".to_string(), SECRET.to_string()),
            ("scope".to_string(), format!("{SERVER_ID}/.default")),
        ])
    );

    // The token is reused while it is fresh; another scope is another request.
    c.token(&format!("{SERVER_ID}/.default")).await.unwrap();
    assert_eq!(server.requests().len(), 1);
    c.token("https://management.core.windows.net//.default")
        .await
        .unwrap();
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test(flavor = "current_thread")]
async fn an_entra_id_refusal_names_status_and_description_never_the_secret() {
    let logs = LogCapture::start();
    // The description echoes the secret, as a careless proxy might.
    let server = ScriptedServer::start(vec![Reply::json(
        400,
        &format!(
            r#"{{"error":"invalid_client","error_description":"AADSTS7000215: Invalid client secret provided: {SECRET}","error_codes":[7000215]}}"#
        ),
    )])
    .unwrap();
    let c = client_secret(&server);
    let e = c.token("api://x/.default").await.unwrap_err();
    let text = e.to_string();
    assert_eq!(
        text,
        format!(
            "Microsoft Entra ID token request to {}: status 400 Bad Request: invalid_client: AADSTS7000215: Invalid client secret provided: ***REDACTED***",
            server.url("/aad/tenant-1/oauth2/v2.0/token")
        )
    );
    assert!(matches!(e, AuthError::Status { status, .. } if status == 400));
    assert!(!format!("{e:?}").contains(SECRET));
    assert_eq!(server.requests().len(), 1, "a 400 is not asked again");
    assert!(!logs.text().contains(SECRET));
}

#[tokio::test(flavor = "current_thread")]
async fn busy_answers_are_retried_with_the_one_backoff() {
    let logs = LogCapture::start();
    let server = ScriptedServer::start(vec![
        Reply::json(503, r#"{"error":"temporarily_unavailable"}"#).header("Retry-After", "0"),
        Reply::json(429, "{}"),
        token_reply(r#""expires_in":"3599","#),
    ])
    .unwrap();
    let c = client_secret(&server);
    assert_eq!(c.token("s/.default").await.unwrap().token.expose(), TOKEN);
    assert_eq!(server.requests().len(), 3);
    let text = logs.text();
    assert!(
        text.contains("status 503 Service Unavailable: temporarily_unavailable"),
        "{text}"
    );
    assert!(!text.contains(SECRET) && !text.contains(TOKEN), "{text}");

    // Out of attempts: the last answer is the error; a body that is not JSON is quoted.
    let server = ScriptedServer::start(vec![Reply {
        status: 502,
        headers: vec![],
        body: b"<html>bad gateway</html>".to_vec(),
    }])
    .unwrap();
    let e = client_secret(&server)
        .token("s/.default")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with("status 502 Bad Gateway: <html>bad gateway</html>"),
        "{e}"
    );
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn a_dead_endpoint_is_a_transport_error_naming_it() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let endpoint = Url::parse(&format!("http://127.0.0.1:{port}/imds")).unwrap();
    let m = ManagedIdentityCredential::new(None, &endpoint)
        .unwrap()
        .with_backoff(fast(2));
    let e = m.token("s/.default").await.unwrap_err();
    assert!(matches!(e, AuthError::Transport { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.starts_with(&format!(
            "managed identity token request to http://127.0.0.1:{port}/imds: "
        )),
        "{text}"
    );
    assert!(!text.contains("api-version"), "no query in errors: {text}");
}

#[tokio::test]
async fn managed_identity_asks_imds_with_the_metadata_header() {
    let server = ScriptedServer::start(vec![token_reply(
        r#""expires_in":"86399","expires_on":"1900000000","resource":"x","#,
    )])
    .unwrap();
    let endpoint = Url::parse(&server.url("/metadata/identity/oauth2/token")).unwrap();
    let m = ManagedIdentityCredential::new(Some("mi-client"), &endpoint).unwrap();
    let t = m.token(&format!("{SERVER_ID}/.default")).await.unwrap();
    assert_eq!(t.token.expose(), TOKEN);
    assert_eq!(
        t.expires_at,
        Some(UNIX_EPOCH + Duration::from_secs(1_900_000_000))
    );
    let system = ManagedIdentityCredential::new(Some(" "), &endpoint).unwrap();
    system
        .token("https://management.core.windows.net//.default")
        .await
        .unwrap();

    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    let query = |i: usize| -> Vec<(String, String)> {
        url::form_urlencoded::parse(reqs[i].query().as_bytes())
            .into_owned()
            .collect()
    };
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    assert_eq!(reqs[0].method, "GET");
    assert_eq!(reqs[0].path(), "/metadata/identity/oauth2/token");
    assert_eq!(reqs[0].header("metadata"), Some("true"));
    assert_eq!(
        query(0),
        [
            pair("api-version", "2018-02-01"),
            pair("resource", SERVER_ID),
            pair("client_id", "mi-client"),
        ]
    );
    assert_eq!(reqs[1].header("metadata"), Some("true"));
    assert_eq!(
        query(1),
        [
            pair("api-version", "2018-02-01"),
            pair("resource", "https://management.core.windows.net/"),
        ],
        "a system-assigned identity sends no client_id"
    );
}

#[tokio::test]
async fn imds_retries_404_but_not_400() {
    let server = ScriptedServer::start(vec![
        Reply::json(404, r#"{"error":"not_found"}"#),
        token_reply(r#""expires_on":"1900000000","#),
    ])
    .unwrap();
    let endpoint = Url::parse(&server.url("/imds")).unwrap();
    let m = ManagedIdentityCredential::new(None, &endpoint)
        .unwrap()
        .with_backoff(fast(3));
    assert_eq!(m.token("s/.default").await.unwrap().token.expose(), TOKEN);
    assert_eq!(server.requests().len(), 2);

    let server = ScriptedServer::start(vec![Reply::json(
        400,
        r#"{"error":"invalid_request","error_description":"Identity not found"}"#,
    )])
    .unwrap();
    let endpoint = Url::parse(&server.url("/imds")).unwrap();
    let m = ManagedIdentityCredential::new(Some("nope"), &endpoint)
        .unwrap()
        .with_backoff(fast(3));
    let e = m.token("s/.default").await.unwrap_err().to_string();
    assert!(
        e.ends_with("status 400 Bad Request: invalid_request: Identity not found"),
        "{e}"
    );
    assert_eq!(server.requests().len(), 1);
}

/// The secret's file is read only when the secret itself is not in the environment; nothing
/// named, nothing read. Real files under a temporary root.
#[test]
fn the_secret_file_is_read_only_when_the_secret_is_unset() {
    let t = tempfile::tempdir().unwrap();
    let fs = flex_host::fs::HostFs::new(t.path());
    std::fs::create_dir_all(t.path().join("etc")).unwrap();
    std::fs::write(t.path().join("etc/secret"), "from-file\n").unwrap();
    let file = "AAD_SERVICE_PRINCIPAL_CLIENT_SECRET_FILE";
    let got = with_secret_file(env(&[(file, "/etc/secret")]), &fs).unwrap();
    assert_eq!(got.get(SP_CLIENT_SECRET_ENV).unwrap(), "from-file");
    let both = env(&[(file, "/etc/secret"), (SP_CLIENT_SECRET_ENV, SECRET)]);
    assert_eq!(with_secret_file(both.clone(), &fs).unwrap(), both);
    let neither = env(&[(LOGIN_METHOD_ENV, "spn")]);
    assert_eq!(with_secret_file(neither.clone(), &fs).unwrap(), neither);
    let e = with_secret_file(env(&[(file, "/etc/absent")]), &fs)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("AAD_SERVICE_PRINCIPAL_CLIENT_SECRET_FILE /etc/absent: no such file"),
        "{e}"
    );
}
