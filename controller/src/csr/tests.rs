//! Table tests of the CSR approver's decisions: [`examine`] over real PKCS#10 requests (made
//! with rcgen), [`authorize_bootstrap_token`] over Secrets, and [`decide`] with a mock API
//! server for the Secret and the in-memory machine store.

use super::*;
use crate::store::MemoryStore;
use http::{Request, Response};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequestSpec, CertificateSigningRequestStatus,
};
use kube::client::Body;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};

fn cfg() -> ApproverConfig {
    ApproverConfig {
        bootstrap_group: "system:bootstrappers:aks-flex-node".into(),
        daemon_group: "aks-flex-node-daemons".into(),
        max_expiration_seconds: 0,
    }
}

fn request(cn: &str, orgs: &[&str], sans: &[&str]) -> String {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    for (i, o) in orgs.iter().enumerate() {
        if i == 0 {
            dn.push(DnType::OrganizationName, *o);
        } else {
            dn.push(DnType::CustomDnType(vec![2, 5, 4, 10]), *o);
        }
    }
    params.distinguished_name = dn;
    params.subject_alt_names = sans
        .iter()
        .map(|s| SanType::DnsName(s.to_string().try_into().unwrap()))
        .collect();
    params.serialize_request(&key).unwrap().pem().unwrap()
}

fn daemon_request(node: &str) -> String {
    request(
        &format!("system:node:{node}"),
        &["system:nodes", "aks-flex-node-daemons"],
        &[],
    )
}

fn csr(pem: &str, user: &str, groups: &[&str]) -> CertificateSigningRequest {
    CertificateSigningRequest {
        metadata: kube::api::ObjectMeta {
            name: Some("aks-flex-node-daemon-0123".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(pem.as_bytes().to_vec()),
            signer_name: SIGNER.into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            username: Some(user.into()),
            groups: Some(groups.iter().map(|g| g.to_string()).collect()),
            expiration_seconds: Some(30 * 24 * 3600),
            ..Default::default()
        },
        status: None,
    }
}

fn bootstrap_csr(node: &str) -> CertificateSigningRequest {
    csr(
        &daemon_request(node),
        "system:bootstrap:abcdef",
        &[
            "system:bootstrappers",
            "system:bootstrappers:aks-flex-node",
            "system:authenticated",
        ],
    )
}

fn renewal_csr(node: &str) -> CertificateSigningRequest {
    csr(
        &daemon_request(node),
        &format!("system:node:{node}"),
        &[
            "system:nodes",
            "aks-flex-node-daemons",
            "system:authenticated",
        ],
    )
}

#[test]
fn examine_accepts_bootstrap_and_renewal() {
    assert_eq!(
        examine(&bootstrap_csr("node1"), &cfg()).unwrap(),
        Candidate {
            node: "node1".into(),
            requester: Requester::Bootstrap {
                token_id: "abcdef".into()
            },
            credential: Credential::Daemon,
        }
    );
    assert_eq!(
        examine(&renewal_csr("node1"), &cfg()).unwrap(),
        Candidate {
            node: "node1".into(),
            requester: Requester::Renewal,
            credential: Credential::Daemon,
        }
    );
    // The daemon group alone is enough.
    let only_daemon = csr(
        &request("system:node:n", &["aks-flex-node-daemons"], &[]),
        "system:bootstrap:abcdef",
        &["system:bootstrappers:aks-flex-node"],
    );
    assert!(examine(&only_daemon, &cfg()).is_ok());
}

#[test]
fn examine_rejects_table() {
    type Edit = fn(&mut CertificateSigningRequest);
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "other signer",
            |c| c.spec.signer_name = "kubernetes.io/kubelet-serving".into(),
            "signer \"kubernetes.io/kubelet-serving\"",
        ),
        (
            "approved",
            |c| {
                c.status = Some(CertificateSigningRequestStatus {
                    conditions: Some(vec![CertificateSigningRequestCondition {
                        type_: "Approved".into(),
                        status: "True".into(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                })
            },
            "already Approved",
        ),
        (
            "denied",
            |c| {
                c.status = Some(CertificateSigningRequestStatus {
                    conditions: Some(vec![CertificateSigningRequestCondition {
                        type_: "Denied".into(),
                        status: "True".into(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                })
            },
            "already Denied",
        ),
        (
            "issued",
            |c| {
                c.status = Some(CertificateSigningRequestStatus {
                    certificate: Some(ByteString(b"cert".to_vec())),
                    ..Default::default()
                })
            },
            "already issued",
        ),
        (
            "garbage request",
            |c| c.spec.request = ByteString(b"hello".to_vec()),
            "not PEM",
        ),
        (
            "wrong common name",
            |c| {
                c.spec.request =
                    ByteString(request("admin", &["aks-flex-node-daemons"], &[]).into_bytes())
            },
            "common name \"admin\"",
        ),
        (
            "empty node",
            |c| {
                c.spec.request = ByteString(
                    request("system:node:", &["aks-flex-node-daemons"], &[]).into_bytes(),
                )
            },
            "is not system:node:<node>",
        ),
        (
            "no daemon group",
            |c| {
                c.spec.request =
                    ByteString(request("system:node:n", &["system:nodes"], &[]).into_bytes())
            },
            "do not include the daemon group",
        ),
        (
            "extra group",
            |c| {
                c.spec.request = ByteString(
                    request(
                        "system:node:n",
                        &["aks-flex-node-daemons", "system:masters"],
                        &[],
                    )
                    .into_bytes(),
                )
            },
            "organization \"system:masters\" is not allowed",
        ),
        (
            "sans",
            |c| {
                c.spec.request = ByteString(
                    request(
                        "system:node:n",
                        &["aks-flex-node-daemons"],
                        &["evil.example"],
                    )
                    .into_bytes(),
                )
            },
            "subject alternative names",
        ),
        (
            "no client auth",
            |c| c.spec.usages = Some(vec!["digital signature".into()]),
            "do not include client auth",
        ),
        (
            "server auth",
            |c| c.spec.usages = Some(vec!["client auth".into(), "server auth".into()]),
            "usage \"server auth\" is not allowed",
        ),
        (
            "bootstrap user outside the group",
            |c| c.spec.groups = Some(vec!["system:bootstrappers".into()]),
            "is not in the bootstrap group",
        ),
        (
            "empty token id",
            |c| c.spec.username = Some("system:bootstrap:".into()),
            "no token id",
        ),
        (
            "other user",
            |c| c.spec.username = Some("alice".into()),
            "requester \"alice\"",
        ),
        (
            "renewal for another node",
            |c| {
                c.spec.username = Some("system:node:other".into());
                c.spec.groups = Some(vec!["aks-flex-node-daemons".into()]);
            },
            "requester \"system:node:other\"",
        ),
        (
            "node user without the daemon group",
            |c| {
                c.spec.username = Some("system:node:node1".into());
                c.spec.groups = Some(vec!["system:nodes".into()]);
            },
            "neither a bootstrap token",
        ),
    ];
    for (name, edit, want) in cases {
        let mut c = bootstrap_csr("node1");
        edit(&mut c);
        let e = examine(&c, &cfg()).unwrap_err().to_string();
        assert!(e.contains(want), "{name}: {e}");
    }
}

#[test]
fn examine_enforces_max_expiration() {
    let mut limited = cfg();
    limited.max_expiration_seconds = 3600;
    let mut c = bootstrap_csr("n");
    assert!(matches!(
        examine(&c, &limited).unwrap_err(),
        Refusal::LifetimeTooLong { max: 3600, .. }
    ));
    c.spec.expiration_seconds = None;
    assert_eq!(
        examine(&c, &limited).unwrap_err(),
        Refusal::LifetimeUnset(3600)
    );
    assert!(
        Refusal::LifetimeUnset(3600)
            .to_string()
            .contains("is unset")
    );
    c.spec.expiration_seconds = Some(3600);
    assert!(examine(&c, &limited).is_ok());
    c.spec.expiration_seconds = None;
    assert!(examine(&c, &cfg()).is_ok(), "0 = no limit");
}

#[test]
fn a_tampered_request_does_not_verify() {
    let pem = daemon_request("n");
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    let mut der = p.contents.clone();
    let last = der.len() - 1;
    der[last] ^= 0xff;
    let body = aks_b64(&der);
    let tampered =
        format!("-----BEGIN CERTIFICATE REQUEST-----\n{body}\n-----END CERTIFICATE REQUEST-----\n");
    let e = parse_request(tampered.as_bytes()).unwrap_err();
    assert!(matches!(e, RequestError::Signature(_)), "{e}");
    assert!(e.to_string().contains("signature does not verify"), "{e}");
    let cert_label = pem.replace("CERTIFICATE REQUEST", "CERTIFICATE");
    assert_eq!(
        parse_request(cert_label.as_bytes()).unwrap_err(),
        RequestError::Label("CERTIFICATE".into())
    );
}

fn aks_b64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn token_secret(pairs: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("bootstrap-token-abcdef".into()),
            namespace: Some("kube-system".into()),
            ..Default::default()
        },
        type_: Some(BOOTSTRAP_TOKEN_TYPE.into()),
        data: Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

fn good_token() -> Vec<(&'static str, &'static str)> {
    vec![
        ("token-id", "abcdef"),
        ("token-secret", "0123456789abcdef"),
        ("usage-bootstrap-authentication", "true"),
        ("auth-extra-groups", "system:bootstrappers:aks-flex-node"),
        ("expiration", "2030-01-01T00:00:00Z"),
    ]
}

fn with(edit: &[(&'static str, &'static str)]) -> Secret {
    let mut pairs = good_token();
    for (k, v) in edit {
        pairs.retain(|(pk, _)| pk != k);
        if !v.is_empty() || *k == "expiration" {
            pairs.push((k, v));
        }
    }
    token_secret(&pairs)
}

#[test]
fn bootstrap_token_secret_table() {
    let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
    let group = "system:bootstrappers:aks-flex-node";
    let ok = |s: Secret| authorize_bootstrap_token(Some(&s), "abcdef", group, now);
    assert_eq!(ok(with(&[])), Ok(()));
    assert_eq!(
        ok(with(&[("usage-bootstrap-authentication", "TRUE")])),
        Ok(())
    );
    assert_eq!(
        ok(with(&[(
            "auth-extra-groups",
            " system:bootstrappers:aks-flex-node ,"
        )])),
        Ok(())
    );
    assert_eq!(ok(with(&[("expiration", "")])), Ok(()), "no expiration");
    let mut wrong_type = with(&[]);
    wrong_type.type_ = Some("Opaque".into());
    let cases: Vec<(Option<Secret>, &str)> = vec![
        (
            None,
            "secret kube-system/bootstrap-token-abcdef does not exist",
        ),
        (Some(wrong_type), "has type \"Opaque\""),
        (
            Some(with(&[("token-id", "zzzzzz")])),
            "token-id \"zzzzzz\" does not match",
        ),
        (Some(with(&[("token-secret", "")])), "empty token-secret"),
        (
            Some(with(&[("usage-bootstrap-authentication", "false")])),
            "not usable for authentication",
        ),
        (
            Some(with(&[("usage-bootstrap-authentication", "")])),
            "not usable for authentication",
        ),
        (
            Some(with(&[(
                "auth-extra-groups",
                "system:bootstrappers:kubeadm:default-node-token",
            )])),
            "do not include",
        ),
        (
            Some(with(&[(
                "auth-extra-groups",
                "system:bootstrappers:kubeadm:default-node-token,system:bootstrappers:aks-flex-node",
            )])),
            "include \"system:bootstrappers:kubeadm:default-node-token\" beside \"system:bootstrappers:aks-flex-node\": a flex bootstrap token is in the flex group only",
        ),
        (
            Some(with(&[(
                "auth-extra-groups",
                "system:bootstrappers:aks-flex-node,system:bootstrappers:other",
            )])),
            "include \"system:bootstrappers:other\" beside",
        ),
        (
            Some(with(&[("expiration", "2026-05-31T23:59:59Z")])),
            "expired at",
        ),
        (
            Some(with(&[("expiration", "tomorrow")])),
            "treated as expired",
        ),
    ];
    for (secret, want) in cases {
        let e = authorize_bootstrap_token(secret.as_ref(), "abcdef", group, now)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e} does not contain {want}");
    }
}

#[test]
fn approval_adds_the_condition() {
    let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
    let a = approved(&bootstrap_csr("n"), "AKSFlexNodeDaemonApprove", "ok", now);
    let c = &a.status.unwrap().conditions.unwrap()[0];
    assert_eq!((c.type_.as_str(), c.status.as_str()), ("Approved", "True"));
    assert_eq!(c.message.as_deref(), Some("ok"));
    assert_eq!(c.last_update_time, Some(Time(now)));
}

/// An issued request: `csr` with a certificate for CN `cn` valid until `not_after` (a real
/// certificate, self-signed with rcgen; the approver reads only its subject and validity).
fn issued(
    mut c: CertificateSigningRequest,
    name: &str,
    cn: &str,
    not_after: (i32, u8, u8),
) -> CertificateSigningRequest {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    params.distinguished_name = dn;
    params.not_before = rcgen::date_time_ymd(2026, 1, 1);
    params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
    let cert = params.self_signed(&key).unwrap().pem();
    c.metadata.name = Some(name.into());
    c.status = Some(CertificateSigningRequestStatus {
        certificate: Some(ByteString(cert.into_bytes())),
        ..Default::default()
    });
    c
}

/// The API [`decide`] reads, faked by a mock server: GETs of
/// `kube-system/bootstrap-token-abcdef` answered with `secret` (or 404), LISTs of
/// CertificateSigningRequests (with the signer field selector) answered with `csrs`, and GETs of
/// the record of tokens used, empty.
fn apis(secret: Option<Secret>, csrs: Vec<CertificateSigningRequest>) -> Apis {
    apis_with_issued(secret, csrs, Some(BTreeMap::new()))
}

/// [`apis`], with the record of tokens used holding `issued` (`None`: no ConfigMap).
fn apis_with_issued(
    secret: Option<Secret>,
    csrs: Vec<CertificateSigningRequest>,
    issued: Option<BTreeMap<String, String>>,
) -> Apis {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let path = req.uri().path().to_string();
            let not_found = || {
                Response::builder()
                    .status(404)
                    .body(Body::from(
                        br#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#.to_vec(),
                    ))
                    .unwrap()
            };
            let resp = if path
                == format!("/api/v1/namespaces/kube-system/configmaps/{ISSUED_CONFIGMAP}")
            {
                match &issued {
                    Some(data) => Response::builder()
                        .status(200)
                        .body(Body::from(
                            serde_json::to_vec(&serde_json::json!({
                                "apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": ISSUED_CONFIGMAP, "namespace": "kube-system"},
                                "data": data,
                            }))
                            .unwrap(),
                        ))
                        .unwrap(),
                    None => not_found(),
                }
            } else if path == "/apis/certificates.k8s.io/v1/certificatesigningrequests" {
                let query = req.uri().query().unwrap_or_default();
                assert!(
                    [
                        "&fieldSelector=spec.signerName%3Dkubernetes.io%2Fkube-apiserver-client",
                        "&fieldSelector=spec.signerName%3Dkubernetes.io%2Fkube-apiserver-client-kubelet",
                    ]
                    .contains(&query),
                    "{query}"
                );
                let list = serde_json::json!({
                    "apiVersion": "certificates.k8s.io/v1",
                    "kind": "CertificateSigningRequestList",
                    "metadata": {"resourceVersion": "1"},
                    "items": csrs,
                });
                Response::builder()
                    .status(200)
                    .body(Body::from(serde_json::to_vec(&list).unwrap()))
                    .unwrap()
            } else {
                assert_eq!(
                    path,
                    "/api/v1/namespaces/kube-system/secrets/bootstrap-token-abcdef"
                );
                match &secret {
                    Some(s) => Response::builder()
                        .status(200)
                        .body(Body::from(serde_json::to_vec(s).unwrap()))
                        .unwrap(),
                    None => Response::builder()
                        .status(404)
                        .body(Body::from(
                            br#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#.to_vec(),
                        ))
                        .unwrap(),
                }
            };
            send.send_response(resp);
        }
    });
    let client = kube::Client::new(svc, "default");
    Apis {
        secrets: Api::namespaced(client.clone(), TOKEN_NAMESPACE),
        csrs: Api::all(client.clone()),
        configmaps: Api::namespaced(client, TOKEN_NAMESPACE),
    }
}

/// The machine entry of `node` allowing bootstrap token `abcdef`.
const BOUND: &str =
    r#"{"name":"node1","properties":{"tags":{"aks-flex-bootstrap-token-id":"abcdef"}}}"#;

#[tokio::test]
async fn decide_checks_secret_then_machine() {
    let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
    let store = MemoryStore::new();
    let apis_ok = apis(Some(with(&[])), vec![]);
    let c = bootstrap_csr("node1");
    assert_eq!(
        decide(&c, &cfg(), &apis_ok, &store, now).await,
        Decision::Retry("machine \"node1\" is not registered".into())
    );
    store.insert("node1.json", BOUND);
    assert!(matches!(
        decide(&c, &cfg(), &apis_ok, &store, now).await,
        Decision::Approve(m) if m.contains("node node1 (bootstrap token abcdef)")
    ));
    store.fail_with(Some("config map gone"));
    assert!(matches!(
        decide(&c, &cfg(), &apis_ok, &store, now).await,
        Decision::Retry(m) if m.contains("config map gone")
    ));
    store.fail_with(None);
    // Renewal needs only the machine.
    assert!(matches!(
        decide(&renewal_csr("node1"), &cfg(), &apis_ok, &store, now).await,
        Decision::Approve(m) if m.contains("renewal of node node1")
    ));
    assert!(matches!(
        decide(&renewal_csr("node2"), &cfg(), &apis_ok, &store, now).await,
        Decision::Retry(_)
    ));
    // A missing secret is not approvable.
    let none = apis(None, vec![]);
    assert!(matches!(
        decide(&c, &cfg(), &none, &store, now).await,
        Decision::Ignore(m) if m.contains("does not exist")
    ));
    // Not ours.
    let mut other = c.clone();
    other.spec.signer_name = "example.com/x".into();
    assert!(matches!(
        decide(&other, &cfg(), &none, &store, now).await,
        Decision::Ignore(_)
    ));
}

/// Each decision's reason for the metrics, from the closed set: the same fakes as above.
#[tokio::test]
async fn every_decision_names_its_reason_from_a_closed_set() {
    use crate::metrics::Why;
    let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
    let store = MemoryStore::new();
    let ok = apis(Some(with(&[])), vec![]);
    let none = apis(None, vec![]);
    let c = bootstrap_csr("node1");
    let why = |d: (Decision, Why)| d.1;
    assert_eq!(
        why(decide_why(&c, &cfg(), &ok, &store, now).await),
        Why::machine_not_registered
    );
    store.insert("node1.json", BOUND);
    assert_eq!(
        why(decide_why(&c, &cfg(), &ok, &store, now).await),
        Why::bootstrap
    );
    assert_eq!(
        why(decide_why(&renewal_csr("node1"), &cfg(), &ok, &store, now).await),
        Why::renewal
    );
    assert_eq!(
        why(decide_why(&c, &cfg(), &none, &store, now).await),
        Why::token_refused
    );
    let mut other = c.clone();
    other.spec.signer_name = "example.com/x".into();
    assert_eq!(
        why(decide_why(&other, &cfg(), &ok, &store, now).await),
        Why::not_a_daemon_request
    );
    store.insert(
        "node1.json",
        r#"{"name":"node1","properties":{"tags":{"aks-flex-bootstrap-token-id":"zzzzzz"}}}"#,
    );
    assert_eq!(
        why(decide_why(&c, &cfg(), &ok, &store, now).await),
        Why::token_not_bound
    );
    store.fail_with(Some("config map gone"));
    assert_eq!(
        why(decide_why(&c, &cfg(), &ok, &store, now).await),
        Why::store_unavailable
    );
}

/// A bootstrap token bootstraps only the node whose machine entry names it: the token that
/// got node1's certificate gets none for node2 (reproduced against a real API server before
/// the fix: both were approved), and an entry that names no token admits no bootstrap.
#[tokio::test]
async fn a_token_bootstraps_only_the_node_that_names_it() {
    let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
    let store = MemoryStore::new();
    let a = apis(Some(with(&[])), vec![]);
    store.insert("node1.json", BOUND);
    store.insert(
        "node2.json",
        r#"{"name":"node2","properties":{"tags":{"aks-flex-bootstrap-token-id":"zzzzzz"}}}"#,
    );
    store.insert("node3.json", r#"{"name":"node3"}"#);
    assert!(matches!(
        decide(&bootstrap_csr("node1"), &cfg(), &a, &store, now).await,
        Decision::Approve(_)
    ));
    assert_eq!(
        decide(&bootstrap_csr("node2"), &cfg(), &a, &store, now).await,
        Decision::Retry(
            "machine \"node2\" may be bootstrapped only with bootstrap token zzzzzz, not abcdef"
                .into()
        )
    );
    assert!(matches!(
        decide(&bootstrap_csr("node3"), &cfg(), &a, &store, now).await,
        Decision::Retry(m) if m.contains("names no bootstrap token")
    ));
    // node1's key is no machine `node1.json`: node1's token gets no certificate for that name.
    assert_eq!(
        decide(&bootstrap_csr("node1.json"), &cfg(), &a, &store, now).await,
        Decision::Retry("machine \"node1.json\" is not registered".into())
    );
}

/// A node that holds an unexpired daemon certificate is not issued another through a
/// bootstrap token (renewal with the certificate still works); an expired one, another node's
/// or another signer's does not count.
#[tokio::test]
async fn a_credentialed_node_gets_no_second_certificate_by_token() {
    let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
    let store = MemoryStore::new();
    store.insert("node1.json", BOUND);
    let held = issued(
        bootstrap_csr("node1"),
        "first",
        "system:node:node1",
        (2026, 6, 30),
    );
    let a = apis(Some(with(&[])), vec![held.clone()]);
    assert!(matches!(
        decide(&bootstrap_csr("node1"), &cfg(), &a, &store, now).await,
        Decision::Retry(m) if m.contains("already holds") && m.contains("delete CertificateSigningRequest first")
    ));
    assert!(matches!(
        decide(&renewal_csr("node1"), &cfg(), &a, &store, now).await,
        Decision::Approve(_)
    ));
    let expired = issued(
        bootstrap_csr("node1"),
        "old",
        "system:node:node1",
        (2026, 5, 1),
    );
    let other_node = issued(
        bootstrap_csr("node2"),
        "n2",
        "system:node:node2",
        (2027, 1, 1),
    );
    let mut other_signer = held.clone();
    other_signer.spec.signer_name = "kubernetes.io/kube-apiserver-client-kubelet".into();
    let a = apis(
        Some(with(&[])),
        vec![expired.clone(), other_node.clone(), other_signer],
    );
    assert!(matches!(
        decide(&bootstrap_csr("node1"), &cfg(), &a, &store, now).await,
        Decision::Approve(_)
    ));
    assert_eq!(
        held_certificate("node1", SIGNER, &[expired, held.clone(), other_node], now)
            .map(|(n, t)| (n, t.to_string())),
        Some(("first".into(), "2026-06-30T00:00:00Z".into()))
    );
    assert_eq!(held_certificate("node2", SIGNER, &[held], now), None);
}

/// A request that is not approvable is looked at again after 15 s, then 30 s, 60 s, … up to
/// 15 minutes, its reason logged only when it changes; another request has its own count, and a
/// request forgotten (approved, ignored) or not seen for a day starts again.
#[test]
fn a_request_not_approvable_is_looked_at_less_and_less_often() {
    let t0 = std::time::Instant::now();
    let mut r = Retries::default();
    let secs = |n: &NextLook| n.after.as_secs();
    let first = r.not_yet("a", "machine \"n\" is not registered", t0);
    assert_eq!((secs(&first), first.new_reason), (15, true));
    let waits: Vec<u64> = (0..8)
        .map(|_| secs(&r.not_yet("a", "machine \"n\" is not registered", t0)))
        .collect();
    assert_eq!(waits, [30, 60, 120, 240, 480, 900, 900, 900]);
    let changed = r.not_yet("a", "token not bound", t0);
    assert!(changed.new_reason);
    assert_eq!(secs(&changed), 900, "a new reason does not reset the wait");
    assert!(!r.not_yet("a", "token not bound", t0).new_reason);
    assert_eq!(secs(&r.not_yet("b", "x", t0)), 15, "each request its own");
    r.forget("a");
    assert_eq!(secs(&r.not_yet("a", "x", t0)), 15);
    assert_eq!(r.len(), 2);
    let later = t0 + Duration::from_secs(25 * 3600);
    r.not_yet("c", "x", later);
    assert_eq!(r.len(), 1, "a and b, not seen for a day, are dropped");
    assert!(!r.is_empty());
}

/// `req` named `name`, with conditions of these types and no certificate.
fn with_conditions(
    mut req: CertificateSigningRequest,
    name: &str,
    types: &[&str],
) -> CertificateSigningRequest {
    req.metadata.name = Some(name.into());
    req.status = Some(CertificateSigningRequestStatus {
        conditions: Some(
            types
                .iter()
                .map(
                    |t| k8s_openapi::api::certificates::v1::CertificateSigningRequestCondition {
                        type_: t.to_string(),
                        status: "True".into(),
                        ..Default::default()
                    },
                )
                .collect(),
        ),
        ..Default::default()
    });
    req
}

/// Two requests of one token, the first approved but not yet signed: the second is not
/// approved (it would be, were only issued certificates counted). A denied or failed first
/// request, another node's, or the request itself does not count.
#[tokio::test]
async fn an_approved_request_awaiting_its_certificate_counts_as_held() {
    let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
    let store = MemoryStore::new();
    store.insert("node1.json", BOUND);
    let approved = with_conditions(bootstrap_csr("node1"), "first", &["Approved"]);
    let a = apis(Some(with(&[])), vec![approved.clone()]);
    let second = decide(&bootstrap_csr("node1"), &cfg(), &a, &store, now).await;
    assert!(
        matches!(&second, Decision::Retry(m) if m.contains("CertificateSigningRequest first") && m.contains("awaiting its certificate")),
        "{second:?}"
    );
    assert_eq!(
        approved_unsigned("node1", SIGNER, "first", std::slice::from_ref(&approved)),
        None,
        "the request itself"
    );
    assert_eq!(
        approved_unsigned("node2", SIGNER, "x", std::slice::from_ref(&approved)),
        None
    );
    for settled in [
        with_conditions(bootstrap_csr("node1"), "first", &["Approved", "Failed"]),
        with_conditions(bootstrap_csr("node1"), "first", &["Denied"]),
        with_conditions(bootstrap_csr("node1"), "first", &[]),
    ] {
        let a = apis(Some(with(&[])), vec![settled]);
        assert!(matches!(
            decide(&bootstrap_csr("node1"), &cfg(), &a, &store, now).await,
            Decision::Approve(_)
        ));
    }
}

/// A token is used once: the record of tokens used (written before each bootstrap approval)
/// refuses a second request with it, for the same node or another, also once the first request
/// is gone; the request it was recorded for may still be approved (its approval failed after
/// the record). Without the record's ConfigMap nothing is approved (fail closed).
#[tokio::test]
async fn a_bootstrap_token_gets_one_daemon_certificate_for_good() {
    let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
    let store = MemoryStore::new();
    store.insert("node1.json", BOUND);
    let used = |request: &str| {
        let mut m = BTreeMap::new();
        m.insert(
            "abcdef".to_string(),
            serde_json::to_string(&IssuedToken {
                node: "node1".into(),
                request: request.into(),
            })
            .unwrap(),
        );
        Some(m)
    };
    let a = apis_with_issued(Some(with(&[])), vec![], used("first-request"));
    let (d, why) = decide_why(&bootstrap_csr("node1"), &cfg(), &a, &store, now).await;
    assert!(
        matches!(&d, Decision::Retry(m) if m.contains("bootstrap token abcdef already got a daemon certificate, for node node1 (CertificateSigningRequest first-request): a token is used once")),
        "{d:?}"
    );
    assert_eq!(why, Why::token_used);
    // The request the token was recorded for.
    let this = bootstrap_csr("node1").metadata.name.unwrap();
    let a = apis_with_issued(Some(with(&[])), vec![], used(&this));
    assert!(matches!(
        decide(&bootstrap_csr("node1"), &cfg(), &a, &store, now).await,
        Decision::Approve(_)
    ));
    // A renewal never reads the record.
    let a = apis_with_issued(Some(with(&[])), vec![], used("first-request"));
    assert!(matches!(
        decide(&renewal_csr("node1"), &cfg(), &a, &store, now).await,
        Decision::Approve(_)
    ));
    let a = apis_with_issued(Some(with(&[])), vec![], None);
    assert!(matches!(
        decide(&bootstrap_csr("node1"), &cfg(), &a, &store, now).await,
        Decision::Retry(m) if m.contains("is missing: apply deploy/controller")
    ));
    let mut garbled = BTreeMap::new();
    garbled.insert("abcdef".to_string(), "not json".to_string());
    assert!(
        token_used(Some(&garbled), "abcdef", Credential::Daemon, "x")
            .unwrap()
            .contains("counts as used")
    );
    assert_eq!(
        issued_patch(
            "abcdef",
            Credential::Daemon,
            &IssuedToken {
                node: "n".into(),
                request: "r".into()
            }
        ),
        serde_json::json!({"data": {"abcdef": "{\"node\":\"n\",\"request\":\"r\"}"}})
    );
}

mod kubelet;
