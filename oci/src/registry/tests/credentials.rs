//! The registry client with credentials, against in-process fakes on loopback (real client, real
//! HTTP; the servers are hand-written): a `Basic` registry, a `Bearer` registry whose realm wants
//! a user name and password, and a fake Azure Container Registry (`/oauth2/exchange`,
//! `/oauth2/token`). The real distribution registry with htpasswd is in
//! `tests/registry_auth.rs`.

use std::sync::OnceLock;

use base64::Engine as _;

use super::*;
use crate::auth::{AadTokenSource, AcrExchange, CredentialError, DockerConfig};
use flex_host::secret::Secret;

const PASSWORD: &str = "pa55-w0rd-SECRET";
const AAD: &str = "aad-token-SECRET";
const REFRESH: &str = "acr-refresh-SECRET";
const ACCESS: &str = "acr-access-SECRET";

fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

fn creds(registry: &str, user: &str, password: &str) -> Arc<DockerConfig> {
    let doc = serde_json::json!({"auths": {registry: {"username": user, "password": password}}});
    Arc::new(DockerConfig::parse("test", doc.to_string().as_bytes()).unwrap())
}

fn form(req: &Req) -> HashMap<String, String> {
    url::form_urlencoded::parse(&req.body)
        .into_owned()
        .collect()
}

fn no_secret(msg: &str) {
    for s in [PASSWORD, AAD, REFRESH, ACCESS] {
        assert!(!msg.contains(s), "a secret in {msg:?}");
    }
}

/// A `Basic` registry: the user name and password are sent after the first 401 and then on
/// every request (one challenge in all); a wrong password is an error naming the registry and
/// the status, without the password.
#[tokio::test]
async fn a_basic_registry_is_answered_with_the_configured_password() {
    let img = test_image(b"basic");
    let fake = Fake::start(move |req| {
        if req.headers.get("authorization") != Some(&basic("alice", PASSWORD)) {
            return Resp::new(401, "").header("WWW-Authenticate", r#"Basic realm="Registry""#);
        }
        serve(&img, req, media_type::OCI_MANIFEST)
    })
    .await;
    let registry = format!("127.0.0.1:{}", fake.port);
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("kube1");
    let client = fake
        .client()
        .with_credentials(creds(&registry, "alice", PASSWORD));
    pull_rootfs(
        &client,
        &ImageSource::Registry(fake.image("test/img:v1")),
        &dest,
        &PullOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(std::fs::read(dest.join("etc/hello")).unwrap(), b"basic");
    // manifest (401, then with the password), config, layer: one challenge.
    assert_eq!(fake.count("GET"), 4, "{:?}", fake.log());

    let wrong = fake
        .client()
        .with_credentials(creds(&registry, "alice", "not-it"));
    let e = wrong
        .resolve(&fake.image("test/img:v1"), Arch::host())
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "{registry} answered 401: the user name and password were refused"
        )),
        "{msg}"
    );
    assert!(!msg.contains("not-it"), "{msg}");
    no_secret(&msg);
}

/// A `Bearer` registry whose token realm wants the user name and password: the realm gets them
/// (and only the realm), the registry gets the token.
#[tokio::test]
async fn a_token_realm_gets_the_password_and_the_registry_the_token() {
    let img = test_image(b"bearer");
    let port = Arc::new(OnceLock::<u16>::new());
    let p2 = port.clone();
    let fake = Fake::start(move |req| {
        if req.path.starts_with("/token") {
            if req.headers.get("authorization") != Some(&basic("bob", PASSWORD)) {
                return Resp::new(401, "");
            }
            return Resp::new(200, r#"{"token":"tok123"}"#);
        }
        assert!(
            req.headers.get("authorization").map(String::as_str) != Some(&basic("bob", PASSWORD)),
            "the password reached the registry"
        );
        behind_bearer(req, p2.get().copied().unwrap_or(0), || {
            serve(&img, req, media_type::OCI_MANIFEST)
        })
    })
    .await;
    port.set(fake.port).unwrap();
    let registry = format!("127.0.0.1:{}", fake.port);
    let client = fake
        .client()
        .with_credentials(creds(&registry, "bob", PASSWORD));
    client
        .resolve(&fake.image("test/img:v1"), Arch::host())
        .await
        .unwrap();
    assert_eq!(fake.count("GET /token"), 1);

    // The realm refuses a wrong password: an error naming the realm, the status and the kind of
    // credential, never the password.
    let wrong = fake
        .client()
        .with_credentials(creds(&registry, "bob", "nope-x"));
    let msg = wrong
        .resolve(&fake.image("test/img:v1"), Arch::host())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("answered 401 Unauthorized to the user name and password for 127.0.0.1:"),
        "{msg}"
    );
    assert!(!msg.contains("nope-x"), "{msg}");
}

/// A fixed Entra ID token, counted.
struct FixedAad(AtomicUsize);

#[async_trait::async_trait]
impl AadTokenSource for FixedAad {
    async fn aad_token(&self) -> Result<Secret, crate::auth::AadError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Secret::new(AAD))
    }
    fn tenant(&self) -> Option<String> {
        Some("tenant-1".into())
    }
}

/// A fake ACR on loopback: `/oauth2/exchange` turns the Entra ID token into a refresh token
/// (after `exchange_failures` 503s), `/oauth2/token` turns the refresh token into an access
/// token for the asked scope, and the registry serves `img` to that access token.
async fn fake_acr(img: TestImage, exchange_failures: usize) -> Fake {
    let port = Arc::new(OnceLock::<u16>::new());
    let p2 = port.clone();
    let failures = Arc::new(AtomicUsize::new(exchange_failures));
    let fake = Fake::start(move |req| {
        let me = format!("127.0.0.1:{}", p2.get().copied().unwrap_or(0));
        if req.path == "/oauth2/exchange" {
            assert_eq!(req.method, "POST");
            if failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Resp::new(503, "");
            }
            let f = form(req);
            if f.get("grant_type").map(String::as_str) != Some("access_token")
                || f.get("access_token").map(String::as_str) != Some(AAD)
                || f.get("service") != Some(&me)
                || f.get("tenant").map(String::as_str) != Some("tenant-1")
            {
                return Resp::new(
                    401,
                    r#"{"errors":[{"code":"UNAUTHORIZED","message":"bad exchange"}]}"#,
                );
            }
            return Resp::new(200, format!(r#"{{"refresh_token":"{REFRESH}"}}"#));
        }
        if req.path == "/oauth2/token" {
            let f = form(req);
            if req.method != "POST"
                || f.get("grant_type").map(String::as_str) != Some("refresh_token")
                || f.get("refresh_token").map(String::as_str) != Some(REFRESH)
                || f.get("scope").map(String::as_str) != Some("repository:test/img:pull")
                || f.get("service") != Some(&me)
            {
                return Resp::new(401, "");
            }
            return Resp::new(200, format!(r#"{{"access_token":"{ACCESS}"}}"#));
        }
        if req.headers.get("authorization") != Some(&format!("Bearer {ACCESS}")) {
            return Resp::new(401, "").header(
                "WWW-Authenticate",
                &format!(r#"Bearer realm="http://{me}/oauth2/token",service="{me}""#),
            );
        }
        serve(&img, req, media_type::OCI_MANIFEST)
    })
    .await;
    port.set(fake.port).unwrap();
    fake
}

fn exchange(fake: &Fake, aad: Arc<FixedAad>, retry: Backoff, timeout: Duration) -> AcrExchange {
    let registry = format!("127.0.0.1:{}", fake.port);
    AcrExchange::new(
        flex_host::http::client().unwrap(),
        aad,
        std::slice::from_ref(&registry),
        InsecureRegistries::parse("test", &registry).unwrap(),
    )
    .with_retry(retry, timeout)
}

/// ACR's flow end to end against the fake: Entra ID token → refresh token (after two 503s,
/// retried) → access token for the repository → the image. The refresh token is reused by a
/// second pull; no secret appears in the logs.
#[tokio::test]
async fn the_acr_exchange_pulls_with_the_nodes_entra_id_token() {
    let captured = captured_logs();
    let fake = fake_acr(test_image(b"acr"), 2).await;
    let aad = Arc::new(FixedAad(AtomicUsize::new(0)));
    let x = Arc::new(exchange(&fake, aad.clone(), fast(), Duration::from_secs(5)));
    let client = fake.client().with_credentials(x.clone());
    client
        .resolve(&fake.image("test/img:v1"), Arch::host())
        .await
        .unwrap();
    assert_eq!(fake.count("POST /oauth2/exchange"), 3, "{:?}", fake.log());
    assert_eq!(fake.count("POST /oauth2/token"), 1);
    // A second client (a later pull) with the same exchange: the refresh token is reused.
    fake.client()
        .with_credentials(x)
        .resolve(&fake.image("test/img:v1"), Arch::host())
        .await
        .unwrap();
    assert_eq!(fake.count("POST /oauth2/exchange"), 3);
    assert_eq!(aad.0.load(Ordering::SeqCst), 1);
    no_secret(&captured.text());
}

/// An exchange refused by ACR: an error naming the registry, the endpoint, the status and ACR's
/// code, never the token sent.
#[tokio::test]
async fn a_refused_exchange_names_the_registry_and_the_status() {
    let fake = fake_acr(test_image(b"acr"), 0).await;
    struct WrongAad;
    #[async_trait::async_trait]
    impl AadTokenSource for WrongAad {
        async fn aad_token(&self) -> Result<Secret, crate::auth::AadError> {
            Ok(Secret::new("wrong-aad-SECRET"))
        }
        fn tenant(&self) -> Option<String> {
            None
        }
    }
    let registry = format!("127.0.0.1:{}", fake.port);
    let x = AcrExchange::new(
        flex_host::http::client().unwrap(),
        Arc::new(WrongAad),
        std::slice::from_ref(&registry),
        InsecureRegistries::parse("test", &registry).unwrap(),
    )
    .with_retry(fast(), Duration::from_secs(5));
    let msg = fake
        .client()
        .with_credentials(Arc::new(x))
        .resolve(&fake.image("test/img:v1"), Arch::host())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(&format!(
            "registry {registry}: http://{registry}/oauth2/exchange answered 401: UNAUTHORIZED \
             bad exchange"
        )),
        "{msg}"
    );
    assert!(!msg.contains("wrong-aad-SECRET"), "{msg}");
    // Refused is final: asked once.
    assert_eq!(fake.count("POST /oauth2/exchange"), 1);
}

/// An exchange endpoint that accepts the connection and never answers: each attempt times out,
/// the one backoff retries, then a clear error naming the registry and the attempts.
#[tokio::test]
async fn an_exchange_that_times_out_is_retried_then_reported() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let a2 = accepted.clone();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            a2.fetch_add(1, Ordering::SeqCst);
            held.push(sock);
        }
    });
    let registry = format!("127.0.0.1:{port}");
    let x = AcrExchange::new(
        flex_host::http::client().unwrap(),
        Arc::new(FixedAad(AtomicUsize::new(0))),
        std::slice::from_ref(&registry),
        InsecureRegistries::parse("test", &registry).unwrap(),
    )
    .with_retry(
        Backoff::new(3, Duration::from_millis(10), Duration::from_millis(50)),
        Duration::from_millis(300),
    );
    let e = x.credential(&registry).await.unwrap_err();
    silent.abort();
    assert!(
        matches!(e, CredentialError::Unreachable { attempts: 3, .. }),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!(
            "registry {registry}: http://{registry}/oauth2/exchange did not answer after 3 \
             attempt(s):"
        )),
        "{msg}"
    );
    no_secret(&msg);
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}
