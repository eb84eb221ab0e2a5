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
            expiration_seconds: Some(365 * 24 * 3600),
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
            }
        }
    );
    assert_eq!(
        examine(&renewal_csr("node1"), &cfg()).unwrap(),
        Candidate {
            node: "node1".into(),
            requester: Requester::Renewal
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
        let e = examine(&c, &cfg()).unwrap_err();
        assert!(e.contains(want), "{name}: {e}");
    }
}

#[test]
fn examine_enforces_max_expiration() {
    let mut limited = cfg();
    limited.max_expiration_seconds = 3600;
    let mut c = bootstrap_csr("n");
    assert!(
        examine(&c, &limited)
            .unwrap_err()
            .contains("exceeds the maximum 3600")
    );
    c.spec.expiration_seconds = None;
    assert!(examine(&c, &limited).unwrap_err().contains("is unset"));
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
    assert!(e.contains("signature does not verify"), "{e}");
    let cert_label = pem.replace("CERTIFICATE REQUEST", "CERTIFICATE");
    assert!(
        parse_request(cert_label.as_bytes())
            .unwrap_err()
            .contains("want CERTIFICATE REQUEST")
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
            "system:bootstrappers:other , system:bootstrappers:aks-flex-node "
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
            Some(with(&[("expiration", "2026-05-31T23:59:59Z")])),
            "expired at",
        ),
        (
            Some(with(&[("expiration", "tomorrow")])),
            "treated as expired",
        ),
    ];
    for (secret, want) in cases {
        let e = authorize_bootstrap_token(secret.as_ref(), "abcdef", group, now).unwrap_err();
        assert!(e.contains(want), "{e} does not contain {want}");
    }
}

#[test]
fn approval_adds_the_condition() {
    let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
    let a = approved(&bootstrap_csr("n"), "ok", now);
    let c = &a.status.unwrap().conditions.unwrap()[0];
    assert_eq!((c.type_.as_str(), c.status.as_str()), ("Approved", "True"));
    assert_eq!(c.message.as_deref(), Some("ok"));
    assert_eq!(c.last_update_time, Some(Time(now)));
}

/// A Secrets API whose GETs are answered with `secret` (or 404), counting requests.
fn secrets_api(secret: Option<Secret>) -> Api<Secret> {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            assert_eq!(
                req.uri().path(),
                "/api/v1/namespaces/kube-system/secrets/bootstrap-token-abcdef"
            );
            let resp = match &secret {
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
            };
            send.send_response(resp);
        }
    });
    Api::namespaced(kube::Client::new(svc, "default"), TOKEN_NAMESPACE)
}

#[tokio::test]
async fn decide_checks_secret_then_machine() {
    let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
    let store = MemoryStore::new();
    let secrets = secrets_api(Some(with(&[])));
    let c = bootstrap_csr("node1");
    assert_eq!(
        decide(&c, &cfg(), &secrets, &store, now).await,
        Decision::Retry("machine \"node1\" is not registered".into())
    );
    store.insert("node1.json", r#"{"name":"node1"}"#);
    assert!(matches!(
        decide(&c, &cfg(), &secrets, &store, now).await,
        Decision::Approve(m) if m.contains("node node1 (bootstrap token abcdef)")
    ));
    store.fail_with(Some("config map gone"));
    assert!(matches!(
        decide(&c, &cfg(), &secrets, &store, now).await,
        Decision::Retry(m) if m.contains("config map gone")
    ));
    store.fail_with(None);
    // Renewal needs only the machine.
    assert!(matches!(
        decide(&renewal_csr("node1"), &cfg(), &secrets, &store, now).await,
        Decision::Approve(m) if m.contains("renewal of node node1")
    ));
    assert!(matches!(
        decide(&renewal_csr("node2"), &cfg(), &secrets, &store, now).await,
        Decision::Retry(_)
    ));
    // A missing secret is not approvable.
    let none = secrets_api(None);
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
