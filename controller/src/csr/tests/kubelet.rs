//! kubelet's client certificates (signer `kubernetes.io/kube-apiserver-client-kubelet`): the
//! approver approves them under the same token binding as the daemon's, once per token, and
//! kubelet's own renewals for registered machines. Real PKCS#10 requests (rcgen); the API
//! server is the mock of the parent module, the machine store the in-memory one.

use super::*;

fn kubelet_request(node: &str) -> String {
    request(&format!("system:node:{node}"), &["system:nodes"], &[])
}

/// A request as kubelet's TLS bootstrap makes it: the kubelet signer, no lifetime asked for.
fn kubelet_csr(pem: &str, user: &str, groups: &[&str]) -> CertificateSigningRequest {
    let mut c = csr(pem, user, groups);
    c.metadata.name = Some("node-csr-kubelet-0123".into());
    c.spec.signer_name = KUBELET_SIGNER.into();
    c.spec.expiration_seconds = None;
    c
}

const BOOTSTRAPPER: [&str; 3] = [
    "system:bootstrappers",
    "system:bootstrappers:aks-flex-node",
    "system:authenticated",
];

fn kubelet_bootstrap_csr(node: &str) -> CertificateSigningRequest {
    kubelet_csr(
        &kubelet_request(node),
        "system:bootstrap:abcdef",
        &BOOTSTRAPPER,
    )
}

fn kubelet_renewal_csr(node: &str) -> CertificateSigningRequest {
    kubelet_csr(
        &kubelet_request(node),
        &format!("system:node:{node}"),
        &["system:nodes", "system:authenticated"],
    )
}

fn capped() -> ApproverConfig {
    ApproverConfig {
        max_expiration_seconds: DEFAULT_MAX_EXPIRATION_SECONDS,
        ..cfg()
    }
}

#[test]
fn examine_accepts_kubelets_bootstrap_and_renewal_without_a_lifetime() {
    assert_eq!(
        examine(&kubelet_bootstrap_csr("node1"), &capped()).unwrap(),
        Candidate {
            node: "node1".into(),
            requester: Requester::Bootstrap {
                token_id: "abcdef".into()
            },
            credential: Credential::Kubelet,
        }
    );
    assert_eq!(
        examine(&kubelet_renewal_csr("node1"), &capped()).unwrap(),
        Candidate {
            node: "node1".into(),
            requester: Requester::Renewal,
            credential: Credential::Kubelet,
        }
    );
    // With key encipherment too (kubelet asks so for an RSA key).
    let mut rsa = kubelet_bootstrap_csr("node1");
    rsa.spec.usages = Some(vec![
        "digital signature".into(),
        "key encipherment".into(),
        "client auth".into(),
    ]);
    assert!(examine(&rsa, &capped()).is_ok());
}

#[test]
fn examine_refuses_kubelet_requests_table() {
    type Edit = fn(&mut CertificateSigningRequest);
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "the daemon group as a second organization",
            |c| {
                c.spec.request = ByteString(
                    request(
                        "system:node:node1",
                        &["system:nodes", "aks-flex-node-daemons"],
                        &[],
                    )
                    .into_bytes(),
                )
            },
            "want exactly [\"system:nodes\"]",
        ),
        (
            "system:masters",
            |c| {
                c.spec.request =
                    ByteString(request("system:node:node1", &["system:masters"], &[]).into_bytes())
            },
            "want exactly [\"system:nodes\"]",
        ),
        (
            "no organization",
            |c| c.spec.request = ByteString(request("system:node:node1", &[], &[]).into_bytes()),
            "organizations are []",
        ),
        (
            "a user's common name",
            |c| c.spec.request = ByteString(request("admin", &["system:nodes"], &[]).into_bytes()),
            "common name \"admin\"",
        ),
        (
            "subject alternative names",
            |c| {
                c.spec.request = ByteString(
                    request("system:node:node1", &["system:nodes"], &["evil.example"]).into_bytes(),
                )
            },
            "subject alternative names are not allowed",
        ),
        (
            "server auth",
            |c| c.spec.usages = Some(vec!["client auth".into(), "server auth".into()]),
            "usage \"server auth\" is not allowed",
        ),
        (
            "client auth alone, which the kubelet signer fails after the approval",
            |c| c.spec.usages = Some(vec!["client auth".into()]),
            "usages are [\"client auth\"], want digital signature and client auth",
        ),
        (
            "client auth and key encipherment, without digital signature",
            |c| c.spec.usages = Some(vec!["key encipherment".into(), "client auth".into()]),
            "want digital signature and client auth",
        ),
        (
            "the daemon's identity asking for kubelet's certificate (a year, renewed by itself)",
            |c| {
                c.spec.username = Some("system:node:node1".into());
                c.spec.groups = Some(vec!["system:nodes".into(), "aks-flex-node-daemons".into()]);
            },
            "from an identity in \"aks-flex-node-daemons\" (the daemon's)",
        ),
        (
            "a year asked for, over the cap",
            |c| c.spec.expiration_seconds = Some(365 * 24 * 3600),
            "exceeds the maximum",
        ),
        (
            "another node renewing for node1",
            |c| {
                c.spec.username = Some("system:node:node2".into());
                c.spec.groups = Some(vec!["system:nodes".into()]);
            },
            "nor system:node:node1 in \"system:nodes\"",
        ),
        (
            "node1's name without system:nodes",
            |c| {
                c.spec.username = Some("system:node:node1".into());
                c.spec.groups = Some(vec!["system:authenticated".into()]);
            },
            "nor system:node:node1 in \"system:nodes\"",
        ),
        (
            "a token outside the flex bootstrap group",
            |c| {
                c.spec.groups = Some(vec![
                    "system:bootstrappers".into(),
                    "system:bootstrappers:kubeadm:default-node-token".into(),
                ])
            },
            "is not in the bootstrap group",
        ),
    ];
    for (name, edit, want) in cases {
        let mut c = kubelet_bootstrap_csr("node1");
        edit(&mut c);
        let e = examine(&c, &capped()).unwrap_err().to_string();
        assert!(e.contains(want), "{name}: {e} does not contain {want}");
    }
}

/// The hole of #29 item 1: before, kube-controller-manager approved any kubelet request from a
/// flex token (`nodeclient`); now the approver checks the token's binding, as for the daemon.
#[tokio::test]
async fn a_token_bound_to_node1_gets_no_kubelet_certificate_for_node2() {
    let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
    let store = MemoryStore::new();
    store.insert("node1.json", BOUND);
    store.insert(
        "node2.json",
        r#"{"name":"node2","properties":{"tags":{"aks-flex-bootstrap-token-id":"zzzzzz"}}}"#,
    );
    let a = apis(Some(with(&[])), vec![]);
    let (d, why) = decide_why(&kubelet_bootstrap_csr("node2"), &cfg(), &a, &store, now).await;
    assert!(
        matches!(&d, Decision::Retry(m) if m.contains("machine \"node2\" may be bootstrapped only with bootstrap token zzzzzz, not abcdef")),
        "{d:?}"
    );
    assert_eq!(why, Why::token_not_bound);
    let (d, why) = decide_why(&kubelet_bootstrap_csr("node1"), &cfg(), &a, &store, now).await;
    assert!(
        matches!(&d, Decision::Approve(m) if m == "aks-flex-controller approved the kubelet client credential of node node1 (bootstrap token abcdef)"),
        "{d:?}"
    );
    assert_eq!(why, Why::kubelet_bootstrap);
    // `node1.json` is not node1: lookups are by exact key.
    let (d, _) = decide_why(
        &kubelet_bootstrap_csr("node1.json"),
        &cfg(),
        &a,
        &store,
        now,
    )
    .await;
    assert!(
        matches!(&d, Decision::Retry(m) if m.contains("is not registered")),
        "{d:?}"
    );
}

/// A token gets one kubelet certificate and one daemon certificate, each recorded under its
/// own key: the daemon's record does not use up kubelet's, and kubelet's second request is
/// refused, also once the first is gone.
#[tokio::test]
async fn a_token_gets_one_kubelet_certificate_for_good() {
    let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
    let store = MemoryStore::new();
    store.insert("node1.json", BOUND);
    let record = |key: &str, request: &str| {
        let mut m = BTreeMap::new();
        m.insert(
            key.to_string(),
            serde_json::to_string(&IssuedToken {
                node: "node1".into(),
                request: request.into(),
            })
            .unwrap(),
        );
        Some(m)
    };
    let daemon_used = apis_with_issued(Some(with(&[])), vec![], record("abcdef", "daemon-req"));
    assert!(matches!(
        decide(
            &kubelet_bootstrap_csr("node1"),
            &cfg(),
            &daemon_used,
            &store,
            now
        )
        .await,
        Decision::Approve(_)
    ));
    let kubelet_used = apis_with_issued(
        Some(with(&[])),
        vec![],
        record("abcdef.kubelet", "node-csr-first"),
    );
    let (d, why) = decide_why(
        &kubelet_bootstrap_csr("node1"),
        &cfg(),
        &kubelet_used,
        &store,
        now,
    )
    .await;
    assert!(
        matches!(&d, Decision::Retry(m) if m.contains("bootstrap token abcdef already got a kubelet client certificate, for node node1 (CertificateSigningRequest node-csr-first)") && m.contains("remove key abcdef.kubelet")),
        "{d:?}"
    );
    assert_eq!(why, Why::token_used);
    // …and the daemon's first certificate is not refused by kubelet's record.
    assert!(matches!(
        decide(&bootstrap_csr("node1"), &cfg(), &kubelet_used, &store, now).await,
        Decision::Approve(_)
    ));
    assert_eq!(
        issued_patch(
            "abcdef",
            Credential::Kubelet,
            &IssuedToken {
                node: "n".into(),
                request: "r".into()
            }
        ),
        serde_json::json!({"data": {"abcdef.kubelet": "{\"node\":\"n\",\"request\":\"r\"}"}})
    );
}

/// Two kubelet requests with one token: one approved and awaiting its certificate counts as
/// held (the kubelet signer's requests, not the daemon's, are counted).
#[tokio::test]
async fn an_approved_kubelet_request_awaiting_its_certificate_counts_as_held() {
    let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
    let store = MemoryStore::new();
    store.insert("node1.json", BOUND);
    let first = with_conditions(kubelet_bootstrap_csr("node1"), "first", &["Approved"]);
    let a = apis(Some(with(&[])), vec![first.clone()]);
    let d = decide(&kubelet_bootstrap_csr("node1"), &cfg(), &a, &store, now).await;
    assert!(
        matches!(&d, Decision::Retry(m) if m.contains("another approved kubelet client certificate request awaiting its certificate (CertificateSigningRequest first)")),
        "{d:?}"
    );
    // A daemon request approved and unsigned does not hold kubelet's up, nor the reverse.
    let daemon_first = with_conditions(bootstrap_csr("node1"), "first", &["Approved"]);
    let a = apis(Some(with(&[])), vec![daemon_first]);
    assert!(matches!(
        decide(&kubelet_bootstrap_csr("node1"), &cfg(), &a, &store, now).await,
        Decision::Approve(_)
    ));
    let a = apis(Some(with(&[])), vec![first]);
    assert!(matches!(
        decide(&bootstrap_csr("node1"), &cfg(), &a, &store, now).await,
        Decision::Approve(_)
    ));
}

/// kubelet's renewals need the machine registered, nothing else (one of another node is left
/// alone); they are approved with their own condition reason.
#[tokio::test]
async fn kubelets_renewal_needs_its_machine_registered() {
    let now: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
    let store = MemoryStore::new();
    let a = apis(Some(with(&[])), vec![]);
    // Every node of the cluster renews so: one that is no flex machine is not ours, and is
    // not looked at again.
    let (d, why) = decide_why(&kubelet_renewal_csr("node1"), &cfg(), &a, &store, now).await;
    assert_eq!(
        d,
        Decision::Ignore(
            "machine \"node1\" is not registered: its kubelet's renewal is not a flex machine's"
                .into()
        )
    );
    assert_eq!(why, Why::machine_not_registered);
    // The daemon's renewal of an unregistered machine is looked at again (its entry may come).
    assert!(matches!(
        decide(&renewal_csr("node1"), &cfg(), &a, &store, now).await,
        Decision::Retry(_)
    ));
    store.insert("node1.json", BOUND);
    let (d, why) = decide_why(&kubelet_renewal_csr("node1"), &cfg(), &a, &store, now).await;
    assert_eq!(
        d,
        Decision::Approve(
            "aks-flex-controller approved the kubelet client credential renewal of node node1"
                .into()
        )
    );
    assert_eq!(why, Why::kubelet_renewal);
    assert_eq!(
        Credential::Kubelet.approve_reason(),
        "AKSFlexNodeKubeletApprove"
    );
    let c = approved(
        &kubelet_renewal_csr("node1"),
        Credential::Kubelet.approve_reason(),
        "ok",
        now,
    );
    assert_eq!(
        c.status.unwrap().conditions.unwrap()[0].reason.as_deref(),
        Some("AKSFlexNodeKubeletApprove")
    );
}

/// The use is recorded under the record's resourceVersion: a write raced by another approver
/// (409) records nothing and says so; a token recorded for another request meanwhile is not
/// written at all. A mock API server answers the GET and the PATCH, and keeps the PATCH body.
#[tokio::test]
async fn a_use_is_recorded_under_the_records_resource_version() {
    use std::sync::{Arc, Mutex};
    let run = |patch_status: u16, existing: Option<(&'static str, String)>| async move {
        let bodies: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
        let seen = bodies.clone();
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let method = req.method().clone();
                let cm = serde_json::json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": ISSUED_CONFIGMAP, "namespace": "kube-system", "resourceVersion": "7"},
                    "data": existing.iter().map(|(k, v)| (k.to_string(), v.clone())).collect::<BTreeMap<_, _>>(),
                });
                let resp = if method == http::Method::GET {
                    Response::builder()
                        .status(200)
                        .body(Body::from(serde_json::to_vec(&cm).unwrap()))
                } else {
                    let body = http_body_util::BodyExt::collect(req.into_body())
                        .await
                        .unwrap()
                        .to_bytes();
                    seen.lock()
                        .unwrap()
                        .push(serde_json::from_slice(&body).unwrap());
                    if patch_status == 200 {
                        Response::builder()
                            .status(200)
                            .body(Body::from(serde_json::to_vec(&cm).unwrap()))
                    } else {
                        Response::builder().status(patch_status).body(Body::from(
                            br#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Conflict","code":409,"message":"the object has been modified"}"#.to_vec(),
                        ))
                    }
                };
                send.send_response(resp.unwrap());
            }
        });
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(kube::Client::new(svc, "default"), TOKEN_NAMESPACE);
        let issued = IssuedToken {
            node: "node1".into(),
            request: "node-csr-1".into(),
        };
        let r = record_use(&api, "abcdef", Credential::Kubelet, &issued).await;
        let bodies = bodies.lock().unwrap().clone();
        (r, bodies)
    };
    let (r, bodies) = run(200, None).await;
    assert_eq!(r, Ok(()));
    assert_eq!(
        bodies,
        [serde_json::json!({
            "metadata": {"resourceVersion": "7"},
            "data": {"abcdef.kubelet": "{\"node\":\"node1\",\"request\":\"node-csr-1\"}"}
        })]
    );
    let (r, _) = run(409, None).await;
    assert!(
        matches!(&r, Err(e @ RecordError::Conflict(_))
            if e.to_string().starts_with("it changed meanwhile (another approver recorded a use)")),
        "{r:?}"
    );
    let other = serde_json::to_string(&IssuedToken {
        node: "node1".into(),
        request: "node-csr-0".into(),
    })
    .unwrap();
    let (r, bodies) = run(200, Some(("abcdef.kubelet", other))).await;
    assert!(
        matches!(&r, Err(RecordError::Used(why)) if why.contains("already got a kubelet client certificate")),
        "{r:?}"
    );
    assert!(bodies.is_empty(), "nothing written");
}
