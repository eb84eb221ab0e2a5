//! Tests of the daemon's Kubernetes client: the REST config from the config, and the CSR flow
//! against a fake API server (`tower_test`) with certificates issued by a test CA (rcgen).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use x509_parser::prelude::FromDer as _;

use super::mock::{
    FLEX_API_PATH, LogCapture, Reply, Seen, flex_api_resources, seen as all_seen, serve,
};
use super::store::{CredentialStore, PairError, check, join_pair, split_pair};
use super::*;
use crate::config::ServicePrincipal;

const NODE: &str = "flex-node-1";
const CSR_PATH: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// A test cluster CA that signs CSRs.
struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

fn test_ca() -> TestCa {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(DnType::CommonName, "test-cluster-ca");
    let pem = p.self_signed(&key).unwrap().pem();
    TestCa {
        issuer: Issuer::new(p, key),
        pem,
    }
}

impl TestCa {
    /// Signs a PEM CSR for `[not_before, not_after]`.
    fn sign(&self, csr_pem: &str, not_before: SystemTime, not_after: SystemTime) -> String {
        let epoch = rcgen::date_time_ymd(1970, 1, 1);
        let mut csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem).unwrap();
        csr.params.not_before = epoch + not_before.duration_since(UNIX_EPOCH).unwrap();
        csr.params.not_after = epoch + not_after.duration_since(UNIX_EPOCH).unwrap();
        csr.signed_by(&self.issuer).unwrap().pem()
    }
}

/// A CSR API: creates, answers 409 for a second create of the same name, issues a certificate
/// from the `issue_on_get`-th read on.
struct FakeCsrApi {
    ca: Arc<TestCa>,
    created: Option<Value>,
    gets: usize,
    issue_on_get: usize,
    validity: (SystemTime, SystemTime),
    post_failure: Option<(u16, &'static str)>,
    deny: bool,
    no_flex_api: bool,
}

impl FakeCsrApi {
    fn new(ca: Arc<TestCa>) -> Self {
        let now = SystemTime::now();
        Self {
            ca,
            created: None,
            gets: 0,
            issue_on_get: 2,
            validity: (
                now - Duration::from_secs(60),
                now + Duration::from_secs(365 * 86_400),
            ),
            post_failure: None,
            deny: false,
            no_flex_api: false,
        }
    }

    fn route(&mut self, s: &Seen) -> Reply {
        if s.method == "GET" && s.path() == FLEX_API_PATH {
            return if self.no_flex_api {
                Reply::status(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                )
            } else {
                Reply::Json(200, flex_api_resources(&["machineoperations"]))
            };
        }
        if s.method == "POST" && s.path() == CSR_PATH {
            if let Some((code, reason)) = self.post_failure {
                return Reply::status(code, reason, "injected failure");
            }
            if self.created.is_some() {
                return Reply::status(
                    409,
                    "AlreadyExists",
                    "certificatesigningrequests already exists",
                );
            }
            let mut obj: Value = serde_json::from_slice(&s.body).unwrap();
            obj["metadata"]["uid"] = json!("uid-1");
            obj["metadata"]["resourceVersion"] = json!("1");
            self.created = Some(obj.clone());
            return Reply::Json(201, obj);
        }
        if s.method == "GET" && s.path().starts_with(&format!("{CSR_PATH}/")) {
            self.gets += 1;
            let Some(obj) = self.created.as_mut() else {
                return Reply::status(404, "NotFound", "not found");
            };
            if self.deny {
                obj["status"] = json!({"conditions": [{"type": "Denied", "status": "True", "reason": "NotAllowed", "message": "no daemons here"}]});
            } else if self.gets >= self.issue_on_get {
                let request = b64()
                    .decode(obj["spec"]["request"].as_str().unwrap())
                    .unwrap();
                let cert = self.ca.sign(
                    std::str::from_utf8(&request).unwrap(),
                    self.validity.0,
                    self.validity.1,
                );
                obj["status"] = json!({
                    "conditions": [{"type": "Approved", "status": "True", "reason": "AutoApproved"}],
                    "certificate": b64().encode(cert.as_bytes()),
                });
            } else if self.gets + 1 == self.issue_on_get {
                obj["status"] = json!({"conditions": [{"type": "Approved", "status": "True"}]});
            }
            return Reply::Json(200, obj.clone());
        }
        Reply::status(404, "NotFound", "no such route")
    }
}

fn fast() -> CredentialTimings {
    CredentialTimings {
        wait: Duration::from_secs(5),
        poll: Duration::from_millis(5),
        retry_base: Duration::from_millis(5),
        retry_max: Duration::from_millis(20),
        rotation_retry_base: Duration::from_millis(10),
        rotation_retry_max: Duration::from_millis(50),
        max_sleep: Duration::from_secs(1),
    }
}

fn base_config() -> kube::Config {
    let mut c = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
    c.auth_info.token = Some(secrecy::SecretString::from("abcdef.0123456789abcdef"));
    c
}

fn config_with_ca(ca: &TestCa) -> Config {
    let mut v: Value =
        serde_json::from_str(include_str!("../../tests/fixtures/config-token.json")).unwrap();
    v["node"]["kubelet"]["caCertData"] = json!(b64().encode(ca.pem.as_bytes()));
    crate::config::parse(v.to_string().as_bytes(), &|| Ok("h".into()))
        .unwrap()
        .config
}

/// The PEM body lines that carry private key bytes (the first two of a PKCS#8 P-256 key: the
/// later ones hold the public key, which the CSR carries too).
fn key_body_lines(key_pem: &str) -> Vec<String> {
    key_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .take(2)
        .map(str::to_string)
        .collect()
}

/// The private scalar of a PKCS#8 P-256 key (`ECPrivateKey`: `02 01 01 04 20 <32 bytes>`).
fn private_scalar(key_pem: &str) -> Vec<u8> {
    let (_, p) = x509_parser::pem::parse_x509_pem(key_pem.as_bytes()).unwrap();
    let der = p.contents;
    let at = der
        .windows(5)
        .position(|w| w == [0x02, 0x01, 0x01, 0x04, 0x20])
        .unwrap();
    der[at + 5..at + 37].to_vec()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Asserts that no request carried the private key: not its PEM, not its scalar in the body
/// nor inside the CSR it sent.
fn assert_key_never_sent(requests: &[Seen], key_pem: &str) {
    let scalar = private_scalar(key_pem);
    let lines = key_body_lines(key_pem);
    for r in requests {
        let body = String::from_utf8_lossy(&r.body);
        assert!(!body.contains("PRIVATE KEY"), "{} {}", r.method, r.uri);
        for l in &lines {
            assert!(
                !body.contains(l.as_str()),
                "key material in {} {}",
                r.method,
                r.uri
            );
        }
        assert!(!contains(&r.body, &scalar));
        assert!(!body.contains(&hex::encode(&scalar)));
        if let Ok(v) = serde_json::from_slice::<Value>(&r.body)
            && let Some(req) = v["spec"]["request"].as_str()
        {
            let pem = String::from_utf8(b64().decode(req).unwrap()).unwrap();
            assert!(pem.starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
            assert!(!pem.contains("PRIVATE KEY"));
            let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
            assert!(
                !contains(&p.contents, &scalar),
                "private key inside the CSR"
            );
        }
    }
}

#[tokio::test]
async fn bootstrap_config_has_server_ca_and_a_redacted_token() {
    let ca = test_ca();
    let cfg = config_with_ca(&ca);
    let kc = bootstrap_config(&cfg).await.unwrap();
    assert_eq!(
        kc.cluster_url.to_string(),
        "https://aks1-dns-abc.hcp.westus2.azmk8s.io:443/"
    );
    let roots = kc.root_cert.clone().unwrap();
    assert_eq!(roots.len(), 1);
    let (_, pem) = x509_parser::pem::parse_x509_pem(ca.pem.as_bytes()).unwrap();
    assert_eq!(roots[0], pem.contents);
    use secrecy::ExposeSecret;
    assert_eq!(
        kc.auth_info.token.as_ref().unwrap().expose_secret(),
        "abcdef.0123456789abcdef"
    );
    assert!(kc.auth_info.exec.is_none());
    assert!(!format!("{kc:?}").contains("0123456789abcdef"));
}

#[tokio::test]
async fn bootstrap_config_errors_name_the_problem() {
    let ca = test_ca();
    let good = config_with_ca(&ca);

    let mut c = good.clone();
    c.node.kubelet.cluster_fqdn = " ".into();
    let e = bootstrap_config(&c).await.unwrap_err().to_string();
    assert_eq!(e, "kubernetes API server URL is empty");

    let mut c = good.clone();
    c.node.kubelet.ca_cert_data = String::new();
    let e = bootstrap_config(&c).await.unwrap_err().to_string();
    assert_eq!(
        e,
        "kubernetes CA certificate is empty (node.kubelet.caCertData)"
    );

    let mut c = good.clone();
    c.node.kubelet.ca_cert_data = "%%%".into();
    let e = bootstrap_config(&c).await.unwrap_err().to_string();
    assert!(
        e.starts_with("decode kubernetes CA certificate (node.kubelet.caCertData): not base64"),
        "{e}"
    );

    let mut c = good.clone();
    c.node.kubelet.ca_cert_data = b64().encode("hello");
    let e = bootstrap_config(&c).await.unwrap_err().to_string();
    assert!(e.ends_with("no PEM certificate found"), "{e}");

    let mut c = good.clone();
    c.node.kubelet.ca_cert_data =
        b64().encode("-----BEGIN CERTIFICATE-----\nMIIBtest\n-----END CERTIFICATE-----\n");
    let e = bootstrap_config(&c).await.unwrap_err().to_string();
    assert!(
        e.starts_with(
            "decode kubernetes CA certificate (node.kubelet.caCertData): certificate 1 is not X.509"
        ),
        "{e}"
    );

    let mut c = good.clone();
    c.azure.bootstrap_token = None;
    let e = bootstrap_config(&c).await.unwrap_err().to_string();
    assert_eq!(
        e,
        "kubernetes client requires bootstrap token or exec credential"
    );
}

#[tokio::test]
async fn exec_credential_for_a_service_principal() {
    let ca = test_ca();
    let mut c = config_with_ca(&ca);
    c.azure.bootstrap_token = None;
    c.azure.service_principal = Some(ServicePrincipal {
        tenant_id: "t".into(),
        client_id: "c".into(),
        client_secret: Secret::new("sp-secret"),
    });
    let kc = bootstrap_config(&c).await.unwrap();
    assert!(kc.auth_info.token.is_none());
    let exec = kc.auth_info.exec.unwrap();
    assert_eq!(exec.api_version.as_deref(), Some(EXEC_API_VERSION));
    assert!(exec.command.unwrap().len() > 1);
    assert_eq!(
        exec.args.unwrap(),
        vec![
            "token",
            "kubelogin",
            "--server-id",
            crate::machine::nodegoal::AKS_AAD_SERVER_ID
        ]
    );
    let env = exec.env.unwrap();
    let names: Vec<&str> = env.iter().map(|m| m["name"].as_str()).collect();
    assert_eq!(
        names,
        vec![
            "AAD_LOGIN_METHOD",
            "AAD_SERVICE_PRINCIPAL_CLIENT_ID",
            "AAD_SERVICE_PRINCIPAL_CLIENT_SECRET",
            "AZURE_TENANT_ID"
        ]
    );
    assert_eq!(env[0]["value"], "spn");
    assert!(matches!(
        exec.interactive_mode,
        Some(kube::config::ExecInteractiveMode::Never)
    ));
}

#[test]
fn csr_subject_usages_signer_lifetime_and_name() {
    let key = KeyPair::generate().unwrap();
    let pem = csr_pem(&key, NODE).unwrap();
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    let (_, req) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&p.contents)
            .unwrap();
    let subject = &req.certification_request_info.subject;
    let cn: Vec<_> = subject
        .iter_common_name()
        .map(|a| a.as_str().unwrap())
        .collect();
    let orgs: Vec<_> = subject
        .iter_organization()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(cn, vec!["system:node:flex-node-1"]);
    assert_eq!(orgs, vec!["system:nodes", "aks-flex-node-daemons"]);
    assert_eq!(
        req.certification_request_info
            .subject_pki
            .subject_public_key
            .data
            .as_ref(),
        key.public_key_raw()
    );

    let name = csr_name(&key, NODE);
    assert!(
        name.starts_with("aks-flex-node-daemon-") && name.len() == 37,
        "{name}"
    );
    assert_eq!(name, csr_name(&key, NODE));
    assert_ne!(name, csr_name(&key, "other"));
    assert_ne!(name, csr_name(&KeyPair::generate().unwrap(), NODE));

    let r = csr_resource(&name, &pem);
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(
        v["spec"]["signerName"],
        "kubernetes.io/kube-apiserver-client"
    );
    assert_eq!(
        v["spec"]["usages"],
        json!(["digital signature", "client auth"])
    );
    assert_eq!(v["spec"]["expirationSeconds"], 2_592_000, "30 days");
    assert_eq!(v["metadata"]["name"], json!(name));
}

#[test]
fn rotation_decision_table() {
    let t0 = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let v = Validity {
        not_before: t0,
        not_after: t0 + Duration::from_secs(1000),
    };
    assert_eq!(rotation_deadline(&v), t0 + Duration::from_secs(800));
    for (offset, due) in [
        (0, false),
        (500, false),
        (799, false),
        (800, true),
        (999, true),
        (1000, true),
        (5000, true),
    ] {
        assert_eq!(
            needs_rotation(&v, t0 + Duration::from_secs(offset)),
            due,
            "at {offset}s of 1000s"
        );
    }
    // A 30-day certificate rotates after 24 days, six days before it expires.
    let y = Validity {
        not_before: t0,
        not_after: t0 + CERT_LIFETIME,
    };
    assert!(!needs_rotation(
        &y,
        t0 + Duration::from_secs(24 * 86_400 - 1)
    ));
    assert!(needs_rotation(&y, t0 + Duration::from_secs(24 * 86_400)));
    // A degenerate period (not_after before not_before) is due at once.
    let bad = Validity {
        not_before: t0,
        not_after: t0 - Duration::from_secs(1),
    };
    assert!(needs_rotation(&bad, t0));
}

#[test]
fn stored_certificate_checks() {
    let ca = test_ca();
    let key = KeyPair::generate().unwrap();
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    let good = ca.sign(&csr_pem(&key, NODE).unwrap(), now - day, now + day);
    assert!(check(&key, &good, NODE, now).is_ok());
    let other_key = KeyPair::generate().unwrap();
    assert_eq!(
        check(&other_key, &good, NODE, now).unwrap_err(),
        PairError::WrongKey
    );
    assert_eq!(
        check(&key, &good, "other-node", now)
            .unwrap_err()
            .to_string(),
        "the certificate is for \"system:node:flex-node-1\", not \"system:node:other-node\""
    );
    assert_eq!(
        check(&key, &good, NODE, now + 2 * day).unwrap_err(),
        PairError::Expired
    );
    assert!(matches!(
        check(&key, "garbage", NODE, now).unwrap_err(),
        PairError::NotPem(_)
    ));
}

#[tokio::test]
async fn csr_flow_issues_stores_and_never_sends_or_logs_the_key() {
    let logs = LogCapture::start();
    let ca = Arc::new(test_ca());
    let mut api = FakeCsrApi::new(ca.clone());
    api.issue_on_get = 3;
    let (client, log, _t) = serve(move |s| api.route(s));
    let root = tempfile::tempdir().unwrap();
    let fs = HostFs::new(root.path());
    let creds = DaemonCredentials::new(fs.clone(), NODE, base_config()).with_timings(fast());

    let issued = creds.obtain(&client).await.unwrap();

    // Files, modes, and no pending key left.
    assert_eq!(fs.mode(Path::new(CREDENTIAL_DIR)), Some(0o700));
    assert_eq!(
        fs.mode(Path::new("/etc/aks-flex-node")),
        Some(flex_host::fs::DIR_MODE)
    );
    assert_eq!(fs.mode(Path::new(PAIR_FILE)), Some(0o600));
    assert!(!fs.exists(Path::new(KEY_FILE)) && !fs.exists(Path::new(CERT_FILE)));
    assert!(!fs.exists(Path::new(PENDING_KEY_FILE)));
    let (key_pem, cert_pem) = stored_pair(&fs);
    let key_pem = key_pem.expose().to_string();
    assert_eq!(key_pem, issued.key_pem.expose());
    assert!(key_pem.contains("PRIVATE KEY"));
    assert_eq!(cert_pem, issued.cert_pem);

    // Requests: the Flex API discovery, one create, then reads until issued.
    assert_eq!(
        all_seen(&log)[0].path(),
        FLEX_API_PATH,
        "discovery comes first"
    );
    let reqs = seen(&log);
    let methods: Vec<_> = reqs.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(methods, vec!["POST", "GET", "GET", "GET"]);
    let body: Value = serde_json::from_slice(&reqs[0].body).unwrap();
    assert_eq!(body["kind"], "CertificateSigningRequest");
    assert_eq!(body["spec"]["signerName"], SIGNER_NAME);
    assert_eq!(body["spec"]["usages"], json!(USAGES));
    assert_eq!(body["spec"]["expirationSeconds"], 2_592_000, "30 days");
    let name = body["metadata"]["name"].as_str().unwrap();
    assert_eq!(reqs[1].path(), format!("{CSR_PATH}/{name}"));
    assert_key_never_sent(&reqs, &key_pem);

    // The client config carries the certificate, not the bootstrap token.
    let kc = creds.client_config(&issued);
    assert!(kc.auth_info.token.is_none());
    assert_eq!(
        kc.auth_info.client_certificate_data.as_deref(),
        Some(b64().encode(issued.cert_pem.as_bytes()).as_str())
    );
    assert!(!format!("{kc:?}").contains(&key_body_lines(&key_pem)[0]));
    assert!(!format!("{issued:?}").contains("PRIVATE KEY"));

    // No log line carries the key.
    let text = logs.text();
    assert!(text.contains("daemon client certificate stored"), "{text}");
    assert!(!text.contains("PRIVATE KEY"));
    assert!(!text.contains(&hex::encode(private_scalar(&key_pem))));
    for l in key_body_lines(&key_pem) {
        assert!(!text.contains(&l));
    }
}

#[tokio::test]
async fn a_valid_stored_certificate_is_reused_without_any_request() {
    let ca = Arc::new(test_ca());
    let mut api = FakeCsrApi::new(ca.clone());
    let (client, log, _t) = serve(move |s| api.route(s));
    let root = tempfile::tempdir().unwrap();
    let fs = HostFs::new(root.path());
    let creds = DaemonCredentials::new(fs.clone(), NODE, base_config()).with_timings(fast());
    let first = creds.obtain(&client).await.unwrap();
    let n = seen(&log).len();

    let again = creds.obtain(&client).await.unwrap();
    assert_eq!(again.cert_pem, first.cert_pem);
    assert_eq!(seen(&log).len(), n, "a stored certificate needs no request");

    // A certificate for another node, or a key that does not match, is not reused.
    let other =
        DaemonCredentials::new(fs.clone(), "other-node", base_config()).with_timings(fast());
    assert!(
        CredentialStore::new(fs.clone())
            .load("other-node", SystemTime::now())
            .is_none()
    );
    let mut api2 = FakeCsrApi::new(ca.clone());
    let (client2, log2, _t2) = serve(move |s| api2.route(s));
    let fresh = other.obtain(&client2).await.unwrap();
    assert_ne!(fresh.cert_pem, first.cert_pem);
    assert_eq!(seen(&log2)[0].method, "POST");
    let (_, cert) = stored_pair(&fs);
    fs.write_atomic(
        Path::new(PAIR_FILE),
        join_pair(
            &Secret::new(KeyPair::generate().unwrap().serialize_pem()),
            &cert,
        )
        .expose()
        .as_bytes(),
        0o600,
    )
    .unwrap();
    assert!(
        CredentialStore::new(fs)
            .load("other-node", SystemTime::now())
            .is_none()
    );
}

#[tokio::test]
async fn restart_while_waiting_resumes_the_same_request() {
    let ca = Arc::new(test_ca());
    let root = tempfile::tempdir().unwrap();
    let fs = HostFs::new(root.path());
    let mut t = fast();
    t.wait = Duration::from_millis(60);

    // First daemon: the request is never approved; it gives up after its wait.
    let mut api = FakeCsrApi::new(ca.clone());
    api.issue_on_get = usize::MAX;
    let shared = Arc::new(Mutex::new(api));
    let s1 = shared.clone();
    let (client, log, _t) = serve(move |s| s1.lock().unwrap().route(s));
    let creds = DaemonCredentials::new(fs.clone(), NODE, base_config()).with_timings(t);
    let e = creds.obtain(&client).await.unwrap_err().to_string();
    assert!(
        e.starts_with("no daemon client certificate issued within 60ms: CertificateSigningRequest aks-flex-node-daemon-"),
        "{e}"
    );
    assert!(
        e.contains(
            "is not approved (signer kubernetes.io/kube-apiserver-client is not auto-approved"
        ),
        "{e}"
    );
    assert!(fs.exists(Path::new(PENDING_KEY_FILE)));
    assert!(!fs.exists(Path::new(PAIR_FILE)));
    let first_name =
        serde_json::from_slice::<Value>(&seen(&log)[0].body).unwrap()["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string();

    // The approver gets to it; the restarted daemon asks again with the same key and name,
    // gets 409 AlreadyExists and picks up the issued certificate.
    shared.lock().unwrap().issue_on_get = 0;
    let n = seen(&log).len();
    let creds = DaemonCredentials::new(fs.clone(), NODE, base_config()).with_timings(fast());
    let issued = creds.obtain(&client).await.unwrap();
    let after = &seen(&log)[n..];
    assert_eq!(after[0].method, "POST");
    let second_name = serde_json::from_slice::<Value>(&after[0].body).unwrap()["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(first_name, second_name);
    assert_eq!(after[1].method, "GET");
    assert!(!fs.exists(Path::new(PENDING_KEY_FILE)));
    assert_eq!(stored_pair(&fs).1, issued.cert_pem);
}

#[tokio::test]
async fn denied_request_fails_and_the_next_one_uses_a_new_key() {
    let ca = Arc::new(test_ca());
    let mut api = FakeCsrApi::new(ca);
    api.deny = true;
    let (client, _log, _t) = serve(move |s| api.route(s));
    let root = tempfile::tempdir().unwrap();
    let fs = HostFs::new(root.path());
    let creds = DaemonCredentials::new(fs.clone(), NODE, base_config()).with_timings(fast());
    let e = creds.obtain(&client).await.unwrap_err().to_string();
    assert!(
        e.ends_with("was denied: NotAllowed: no daemons here"),
        "{e}"
    );
    assert!(!fs.exists(Path::new(PENDING_KEY_FILE)));
}

#[tokio::test]
async fn api_server_down_is_retried_then_named_in_the_error() {
    let ca = Arc::new(test_ca());
    let mut api = FakeCsrApi::new(ca);
    api.post_failure = Some((500, "InternalError"));
    let (client, log, _t) = serve(move |s| api.route(s));
    let root = tempfile::tempdir().unwrap();
    let fs = HostFs::new(root.path());
    let mut t = fast();
    t.wait = Duration::from_millis(300);
    let creds = DaemonCredentials::new(fs.clone(), NODE, base_config()).with_timings(t);
    let e = creds.obtain(&client).await.unwrap_err().to_string();
    assert!(e.contains("was not created"), "{e}");
    assert!(
        e.ends_with("; last error: API server answered 500 InternalError: injected failure"),
        "{e}"
    );
    let posts = seen(&log).iter().filter(|r| r.method == "POST").count();
    assert!(posts >= 3, "retried with backoff: {posts} attempts");
    assert!(!fs.exists(Path::new(PAIR_FILE)));

    // 403 is not retried.
    let mut api = FakeCsrApi::new(Arc::new(test_ca()));
    api.post_failure = Some((403, "Forbidden"));
    let (client, log, _t) = serve(move |s| api.route(s));
    let e = creds.obtain(&client).await.unwrap_err();
    assert!(
        matches!(e, KubeClientError::CreateCsr { refused: true, .. }),
        "{e}"
    );
    assert_eq!(seen(&log).len(), 1);
}

/// The stored pair file's key and certificate.
fn stored_pair(fs: &HostFs) -> (Secret, String) {
    split_pair(&fs.read_to_string(Path::new(PAIR_FILE)).unwrap().unwrap()).unwrap()
}

/// Stores a certificate for the pending key with the given validity, as an earlier run would.
fn store_certificate(fs: &HostFs, ca: &TestCa, not_before: SystemTime, not_after: SystemTime) {
    let key = KeyPair::generate().unwrap();
    let cert = ca.sign(&csr_pem(&key, NODE).unwrap(), not_before, not_after);
    let store = CredentialStore::new(fs.clone());
    store.prepare().unwrap();
    store
        .save(&Issued {
            key_pem: Secret::new(key.serialize_pem()),
            cert_pem: cert,
            validity: Validity {
                not_before,
                not_after,
            },
        })
        .unwrap();
}

#[tokio::test]
async fn certificate_near_expiry_is_rotated_in_the_background() {
    let ca = Arc::new(test_ca());
    let root = tempfile::tempdir().unwrap();
    let fs = HostFs::new(root.path());
    let now = SystemTime::now();
    // 90 % of its lifetime is gone: still valid, due for rotation.
    store_certificate(
        &fs,
        &ca,
        now - Duration::from_secs(90),
        now + Duration::from_secs(10),
    );
    let old_cert = stored_pair(&fs).1;

    // The daemon's own identity may create CSRs.
    let mut own_api = FakeCsrApi::new(ca.clone());
    let (own, own_log, _t1) = serve(move |s| own_api.route(s));
    let (bootstrap, boot_log, _t2) = serve(|_| Reply::status(500, "InternalError", "unused"));
    let configs: Arc<Mutex<Vec<kube::Config>>> = Arc::default();
    let c2 = configs.clone();
    let creds = DaemonCredentials::new(fs.clone(), NODE, base_config())
        .with_timings(fast())
        .with_client_factory(move |kc| {
            c2.lock().unwrap().push(kc);
            Ok(own.clone())
        });
    let shutdown = CancellationToken::new();
    let mut clients = creds.start(bootstrap, shutdown.clone()).await.unwrap();
    // The stored certificate was reused at start: nothing asked of the bootstrap client.
    assert!(seen(&boot_log).is_empty());
    let unix = |t: SystemTime| {
        i64::try_from(t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()).unwrap()
    };
    let old_not_after = super::store::cert_facts(&old_cert)
        .unwrap()
        .validity
        .not_after;
    assert_eq!(clients.not_after(), Some(unix(old_not_after)));

    tokio::time::timeout(Duration::from_secs(10), clients.changed())
        .await
        .expect("rotated");
    let new_cert = stored_pair(&fs).1;
    assert_ne!(new_cert, old_cert);
    let v = super::store::cert_facts(&new_cert).unwrap().validity;
    assert!(!needs_rotation(&v, SystemTime::now()));
    // The metrics' expiry follows the rotated certificate.
    assert_eq!(clients.not_after(), Some(unix(v.not_after)));
    assert_eq!(seen(&own_log)[0].method, "POST");
    assert!(seen(&boot_log).is_empty());
    let configs = configs.lock().unwrap();
    assert_eq!(configs.len(), 2, "initial client and rotated client");
    for kc in configs.iter() {
        assert!(kc.auth_info.token.is_none());
        assert!(kc.auth_info.client_key_data.is_some());
    }
    shutdown.cancel();
}

/// Once the daemon holds a certificate the bootstrap token is not used again: when the API
/// server refuses the certificate's own request (faked: a 403 from a fake CSR API), rotation
/// retries with the certificate and never asks with the token (before the fix it fell back to
/// the token).
#[tokio::test]
async fn rotation_never_falls_back_to_the_bootstrap_token() {
    let ca = Arc::new(test_ca());
    let root = tempfile::tempdir().unwrap();
    let fs = HostFs::new(root.path());
    let now = SystemTime::now();
    store_certificate(
        &fs,
        &ca,
        now - Duration::from_secs(95),
        now + Duration::from_secs(5),
    );

    let mut own_api = FakeCsrApi::new(ca.clone());
    own_api.post_failure = Some((403, "Forbidden"));
    let (own, own_log, _t1) = serve(move |s| own_api.route(s));
    let mut boot_api = FakeCsrApi::new(ca.clone());
    let (bootstrap, boot_log, _t2) = serve(move |s| boot_api.route(s));
    let creds = DaemonCredentials::new(fs.clone(), NODE, base_config())
        .with_timings(fast())
        .with_client_factory(move |_| Ok(own.clone()));
    let shutdown = CancellationToken::new();
    let mut clients = creds.start(bootstrap, shutdown.clone()).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_secs(2), clients.changed())
            .await
            .is_err(),
        "nothing was rotated"
    );
    assert!(
        seen(&own_log).iter().filter(|r| r.method == "POST").count() >= 2,
        "the refused request was retried with the certificate: {:?}",
        seen(&own_log)
    );
    assert!(
        seen(&boot_log).is_empty(),
        "the bootstrap token was not used"
    );
    shutdown.cancel();
}

#[test]
fn exec_plugin_errors_do_not_carry_secrets() {
    let text = r#"auth exec command 'AAD_LOGIN_METHOD="spn" AAD_SERVICE_PRINCIPAL_CLIENT_ID="c" AAD_SERVICE_PRINCIPAL_CLIENT_SECRET="s3cr\"et" AZURE_TENANT_ID="t" BOOTSTRAP_TOKEN=abc.def "/usr/local/bin/aks-flex-node" "token"' failed"#;
    assert_eq!(
        redact_env(text),
        r#"auth exec command 'AAD_LOGIN_METHOD="spn" AAD_SERVICE_PRINCIPAL_CLIENT_ID="c" AAD_SERVICE_PRINCIPAL_CLIENT_SECRET="***REDACTED***" AZURE_TENANT_ID="t" BOOTSTRAP_TOKEN="***REDACTED***" "/usr/local/bin/aks-flex-node" "token"' failed"#
    );
    assert!(KubeClientError::NoCredential.is_permanent());
    assert!(!KubeClientError::Client("x".into()).is_permanent());
    // The controller may be installed after the node: retried with backoff, each attempt named.
    assert!(!KubeClientError::NoFlexController.is_permanent());
}

#[tokio::test]
async fn a_failing_exec_plugin_is_reported_without_its_secret() {
    let ca = test_ca();
    let mut c = config_with_ca(&ca);
    c.azure.bootstrap_token = None;
    c.azure.service_principal = Some(ServicePrincipal {
        tenant_id: "t".into(),
        client_id: "c".into(),
        client_secret: Secret::new("sp-client-secret-value"),
    });
    let mut kc = bootstrap_config(&c).await.unwrap();
    // A plugin that fails, as `token kubelogin` does when Entra ID refuses the secret.
    if let Some(exec) = kc.auth_info.exec.as_mut() {
        exec.command = Some("false".into());
    }
    let logs = LogCapture::start();
    match client_from(kc) {
        Ok(client) => {
            let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
            let e = api.get("n").await.unwrap_err();
            assert!(
                !describe(&e).contains("sp-client-secret-value"),
                "{}",
                describe(&e)
            );
        }
        Err(e) => {
            let text = e.to_string();
            assert!(!text.contains("sp-client-secret-value"), "{text}");
            assert!(
                text.contains("AAD_SERVICE_PRINCIPAL_CLIENT_SECRET=\"***REDACTED***\""),
                "{text}"
            );
        }
    }
    assert!(!logs.text().contains("sp-client-secret-value"));
}

#[test]
fn describe_names_status_code_reason_and_message() {
    let e = kube::Error::Api(
        kube::core::Status::failure("etcd is down", "InternalError")
            .with_code(500)
            .boxed(),
    );
    assert_eq!(
        describe(&e),
        "API server answered 500 InternalError: etcd is down"
    );
    assert!(!is_refused(&e));
    let e = kube::Error::Api(
        kube::core::Status::failure("no", "Forbidden")
            .with_code(403)
            .boxed(),
    );
    assert!(is_refused(&e));
}

/// What the fake API server saw, without the Flex API discovery that precedes every request.
fn seen(log: &super::mock::Log) -> Vec<Seen> {
    all_seen(log)
        .into_iter()
        .filter(|r| r.path() != FLEX_API_PATH)
        .collect()
}

/// Real: the certificate flow and discovery. Faked: the API server, without the Flex API.
/// A cluster without the controller's API fails at once with an error that names what is
/// missing, and no CertificateSigningRequest is created.
#[tokio::test]
async fn a_cluster_without_the_flex_controller_is_named_at_once() {
    let mut api = FakeCsrApi::new(Arc::new(test_ca()));
    api.no_flex_api = true;
    let (client, log, _t) = serve(move |s| api.route(s));
    let root = tempfile::tempdir().unwrap();
    let fs = HostFs::new(root.path());
    let creds = DaemonCredentials::new(fs.clone(), NODE, base_config()).with_timings(fast());
    let e = creds.obtain(&client).await.unwrap_err();
    assert!(matches!(e, KubeClientError::NoFlexController), "{e}");
    let text = e.to_string();
    assert!(
        text.starts_with("the cluster has no AKS Flex controller: unbounded-cloud.io/v1alpha3"),
        "{text}"
    );
    assert!(text.contains("deploy/crds and deploy/controller"), "{text}");
    let all = all_seen(&log);
    assert_eq!(all.len(), 1, "only the discovery: {all:?}");
    assert_eq!(
        (all[0].method.as_str(), all[0].path()),
        ("GET", FLEX_API_PATH)
    );
}

// --- the pair file and crashes ------------------------------------------------------------------

/// A key and a certificate for it (valid a day either side of now), PEM.
fn pair(ca: &TestCa) -> (Secret, String) {
    let key = KeyPair::generate().unwrap();
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    let cert = ca.sign(&csr_pem(&key, NODE).unwrap(), now - day, now + day);
    (Secret::new(key.serialize_pem()), cert)
}

fn issued(key: &Secret, cert: &str) -> Issued {
    Issued {
        key_pem: key.clone(),
        cert_pem: cert.to_string(),
        validity: super::store::cert_facts(cert).unwrap().validity,
    }
}

fn write_legacy(fs: &HostFs, key: &Secret, cert: &str) {
    fs.write_atomic(Path::new(KEY_FILE), key.expose().as_bytes(), 0o600)
        .unwrap();
    fs.write_atomic(Path::new(CERT_FILE), cert.as_bytes(), 0o644)
        .unwrap();
}

#[test]
fn the_pair_file_roundtrips_key_and_certificate() {
    let ca = test_ca();
    let (key, cert) = pair(&ca);
    let text = join_pair(&key, &cert);
    let (k, c) = split_pair(text.expose()).unwrap();
    assert_eq!((k.expose(), c.as_str()), (key.expose(), cert.as_str()));
    // A key without its final newline still gives two blocks.
    let trimmed = Secret::new(key.expose().trim_end());
    let (k, c) = split_pair(join_pair(&trimmed, &cert).expose()).unwrap();
    assert_eq!(
        (k.expose().trim_end(), c.as_str()),
        (trimmed.expose(), cert.as_str())
    );
    assert_eq!(
        split_pair(&cert).unwrap_err(),
        PairError::NoKey,
        "a certificate alone"
    );
    assert_eq!(
        split_pair(key.expose()).unwrap_err().to_string(),
        "no certificate in it"
    );

    let root = tempfile::tempdir().unwrap();
    let fs = HostFs::new(root.path());
    let store = CredentialStore::new(fs.clone());
    store.prepare().unwrap();
    store.save(&issued(&key, &cert)).unwrap();
    let loaded = store.load(NODE, SystemTime::now()).unwrap();
    assert_eq!(
        (loaded.key_pem.expose(), loaded.cert_pem.as_str()),
        (key.expose(), cert.as_str())
    );
    assert_eq!(fs.mode(Path::new(PAIR_FILE)), Some(0o600));
}

/// Real files. An install from before the pair file has a consistent `key.pem`/`cert.pem`:
/// it loads; the next save writes the pair file and removes the legacy files.
#[test]
fn a_consistent_legacy_pair_loads_and_the_next_save_replaces_it() {
    let ca = test_ca();
    let root = tempfile::tempdir().unwrap();
    let fs = HostFs::new(root.path());
    let store = CredentialStore::new(fs.clone());
    store.prepare().unwrap();
    let (k1, c1) = pair(&ca);
    write_legacy(&fs, &k1, &c1);
    assert_eq!(store.load(NODE, SystemTime::now()).unwrap().cert_pem, c1);
    let (k2, c2) = pair(&ca);
    store.save(&issued(&k2, &c2)).unwrap();
    assert!(!fs.exists(Path::new(KEY_FILE)) && !fs.exists(Path::new(CERT_FILE)));
    assert_eq!(store.load(NODE, SystemTime::now()).unwrap().cert_pem, c2);
}

/// A real save interrupted where `cert.save-midway` sits: the hook panics, which (like a kill)
/// leaves the new pair in its temporary file and skips the rename. Real: the files in a
/// temporary root and the save itself; only the interruption is the test's. The old pair, in
/// the pair file or in the legacy files, still loads, and the pending key is still there; the
/// next `prepare` removes the leftover temporary file (the new private key). (With the old
/// two-file save the same instant left the new key beside the old certificate, which did not
/// load.)
#[test]
fn a_kill_midway_through_a_rotation_leaves_the_old_pair_loadable() {
    let ca = test_ca();
    for old_in_legacy_files in [false, true] {
        let root = tempfile::tempdir().unwrap();
        let fs = HostFs::new(root.path());
        let store = CredentialStore::new(fs.clone());
        store.prepare().unwrap();
        let (k1, c1) = pair(&ca);
        if old_in_legacy_files {
            write_legacy(&fs, &k1, &c1);
        } else {
            store.save(&issued(&k1, &c1)).unwrap();
        }
        let (k2, c2) = pair(&ca);
        store.save_pending_key(&k2).unwrap();
        let files = || -> Vec<(String, Vec<u8>)> {
            let mut v: Vec<_> = std::fs::read_dir(fs.path(Path::new(CREDENTIAL_DIR)))
                .unwrap()
                .map(|e| {
                    let e = e.unwrap();
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        std::fs::read(e.path()).unwrap(),
                    )
                })
                .collect();
            v.sort();
            v
        };
        let before = files();
        let mut kill = || panic!("killed at cert.save-midway");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            store.save_with(&issued(&k2, &c2), &mut kill)
        }));
        assert!(r.is_err(), "the hook was not reached");
        // Every file there before is unchanged; the only new one is the temporary file.
        let after = files();
        let new: Vec<_> = after.iter().filter(|f| !before.contains(f)).collect();
        assert_eq!(new.len(), 1, "legacy={old_in_legacy_files}: {new:?}");
        assert!(
            new[0].0.starts_with(".client-current.pem.tmp-"),
            "{}",
            new[0].0
        );

        let loaded = store.load(NODE, SystemTime::now()).unwrap();
        assert_eq!(loaded.cert_pem, c1, "legacy={old_in_legacy_files}");
        assert_eq!(loaded.key_pem.expose(), k1.expose());
        // The interrupted request resumes with its key.
        assert_eq!(store.pending_key().unwrap().0.expose(), k2.expose());
    }
}

/// Real files: the temporary files killed writes left in the credentials directory (one holds
/// a private key) are removed by `prepare`, except this process's own (a write in flight) and
/// files that only look alike.
#[test]
fn prepare_removes_temporary_files_interrupted_writes_left() {
    let ca = test_ca();
    let root = tempfile::tempdir().unwrap();
    let fs = HostFs::new(root.path());
    let store = CredentialStore::new(fs.clone());
    store.prepare().unwrap();
    let (k, c) = pair(&ca);
    store.save(&issued(&k, &c)).unwrap();
    let own = format!(".client-current.pem.tmp-{}-0", std::process::id());
    let dir = fs.path(Path::new(CREDENTIAL_DIR));
    let stale = [
        ".client-current.pem.tmp-4242-0",
        ".pending-key.pem.tmp-17-3",
    ];
    let kept = [
        own.as_str(),
        "client-current.pem",
        "notes.tmp-1-2",
        ".x.tmp-1",
    ];
    for name in stale.iter().chain(&kept[..1]).chain(&kept[2..]) {
        std::fs::write(dir.join(name), k.expose()).unwrap();
    }
    store.prepare().unwrap();
    for name in stale {
        assert!(!dir.join(name).exists(), "{name} is left");
    }
    for name in kept {
        assert!(dir.join(name).exists(), "{name} was removed");
    }
    assert_eq!(store.load(NODE, SystemTime::now()).unwrap().cert_pem, c);
}

#[test]
fn stale_temp_names_table() {
    for (name, want) in [
        (".client-current.pem.tmp-4242-0", true),
        (".pending-key.pem.tmp-1-99", true),
        (".client-current.pem.tmp-7-0", false), // this process's (own pid 7)
        ("client-current.pem.tmp-4242-0", false), // no leading dot
        (".tmp-4242-0", false),                 // no file name
        (".client-current.pem.tmp-4242", false), // no attempt number
        (".client-current.pem.tmp-x-0", false),
        (".client-current.pem.tmp-1-", false),
        (".client-current.pem", false),
    ] {
        assert_eq!(super::store::is_stale_temp(name, 7), want, "{name}");
    }
}

/// Real files. A crash after the pair was stored but before the pending key was dropped: the
/// pending key is the stored pair's, so it is dropped rather than reused for the next rotation
/// (which would only fetch the same certificate again).
#[test]
fn a_pending_key_that_is_already_the_stored_pairs_is_dropped() {
    let ca = test_ca();
    let root = tempfile::tempdir().unwrap();
    let fs = HostFs::new(root.path());
    let store = CredentialStore::new(fs.clone());
    store.prepare().unwrap();
    let (k, c) = pair(&ca);
    store.save(&issued(&k, &c)).unwrap();
    store.save_pending_key(&k).unwrap();
    assert!(store.pending_key().is_none());
    assert!(!fs.exists(Path::new(PENDING_KEY_FILE)));
    let (other, _) = pair(&ca);
    store.save_pending_key(&other).unwrap();
    assert_eq!(store.pending_key().unwrap().0.expose(), other.expose());
}

/// Real: the files, the credential flow. Faked: the CSR API. A legacy pair torn by the old
/// two-file save (the new key beside the old certificate, the new key still pending) does not
/// load, and the request resumes with the pending key, as before. But when a valid pair file
/// exists beside it, that is used and nothing is asked of the (bootstrap) client.
#[tokio::test]
async fn a_mismatched_legacy_pair_resumes_the_pending_key_unless_a_valid_pair_exists() {
    let ca = Arc::new(test_ca());
    let (_, c_old) = pair(&ca);
    let (k_new, _) = pair(&ca);
    let torn = |fs: &HostFs| {
        write_legacy(fs, &k_new, &c_old);
        fs.write_atomic(
            Path::new(PENDING_KEY_FILE),
            k_new.expose().as_bytes(),
            0o600,
        )
        .unwrap();
    };

    let root = tempfile::tempdir().unwrap();
    let fs = HostFs::new(root.path());
    CredentialStore::new(fs.clone()).prepare().unwrap();
    torn(&fs);
    assert!(
        CredentialStore::new(fs.clone())
            .load(NODE, SystemTime::now())
            .is_none()
    );
    let mut api = FakeCsrApi::new(ca.clone());
    let (client, log, _t) = serve(move |s| api.route(s));
    let creds = DaemonCredentials::new(fs.clone(), NODE, base_config()).with_timings(fast());
    let got = creds.obtain(&client).await.unwrap();
    let post = &seen(&log)[0];
    let name = serde_json::from_slice::<Value>(&post.body).unwrap()["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let pending = KeyPair::from_pem(k_new.expose()).unwrap();
    assert_eq!(name, csr_name(&pending, NODE), "the pending key's request");
    assert_eq!(got.key_pem.expose(), k_new.expose());

    let root = tempfile::tempdir().unwrap();
    let fs = HostFs::new(root.path());
    let store = CredentialStore::new(fs.clone());
    store.prepare().unwrap();
    let (k_pair, c_pair) = pair(&ca);
    store.save(&issued(&k_pair, &c_pair)).unwrap();
    torn(&fs);
    let (bootstrap, boot_log, _t2) = serve(|_| Reply::status(500, "InternalError", "unused"));
    let creds = DaemonCredentials::new(fs.clone(), NODE, base_config()).with_timings(fast());
    let got = creds.obtain(&bootstrap).await.unwrap();
    assert_eq!(got.cert_pem, c_pair);
    assert!(
        all_seen(&boot_log).is_empty(),
        "the bootstrap client is not used"
    );
}
