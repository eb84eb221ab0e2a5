//! [`check`] over a fake [`PolicyApi`] (the objects as `deploy/controller` writes them, then
//! each way they can be missing or wrong), and [`Readiness`].

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde_json::json;

use super::*;

/// The API server, faked: which resources the group version serves (`None`: not at all) and
/// the objects by (kind, name); every read is recorded.
#[derive(Default)]
struct FakePolicyApi {
    served: Option<Vec<String>>,
    objects: BTreeMap<(&'static str, String), Value>,
    fail: Option<PolicyApiError>,
    /// The (user, groups, subresource) triples RBAC allows to create CSR subresources.
    allowed: Vec<(String, Vec<String>, String)>,
    /// The SubjectAccessReview's failure.
    review_fails: Option<PolicyApiError>,
    reads: Mutex<Vec<String>>,
}

#[async_trait]
impl PolicyApi for FakePolicyApi {
    async fn served(&self) -> Result<Option<Vec<String>>, PolicyApiError> {
        self.reads.lock().unwrap().push("served".into());
        Ok(self.served.clone())
    }

    async fn get(&self, kind: Kind, name: &str) -> Result<Option<Value>, PolicyApiError> {
        self.reads
            .lock()
            .unwrap()
            .push(format!("{} {name}", kind.plural()));
        if let Some(e) = &self.fail {
            return Err(e.clone());
        }
        Ok(self
            .objects
            .get(&(kind.plural(), name.to_string()))
            .cloned())
    }

    async fn may_create_csr(
        &self,
        user: &str,
        groups: &[String],
        subresource: &str,
    ) -> Result<bool, PolicyApiError> {
        self.reads.lock().unwrap().push(format!(
            "review {user} {} create certificatesigningrequests/{subresource}",
            groups.join(",")
        ));
        if let Some(e) = &self.review_fails {
            return Err(e.clone());
        }
        Ok(self
            .allowed
            .iter()
            .any(|(u, g, s)| u == user && g == groups && s == subresource))
    }
}

/// What `deploy/controller` applies: both policies, failing closed, bound with Deny.
fn as_deployed() -> FakePolicyApi {
    let mut objects = BTreeMap::new();
    for name in POLICIES {
        objects.insert(
            (Kind::Policy.plural(), name.to_string()),
            json!({"spec": {"failurePolicy": "Fail"}}),
        );
        objects.insert(
            (Kind::Binding.plural(), name.to_string()),
            json!({"spec": {"policyName": name, "validationActions": ["Deny"]}}),
        );
    }
    FakePolicyApi {
        served: Some(vec![
            Kind::Policy.plural().into(),
            Kind::Binding.plural().into(),
        ]),
        objects,
        ..FakePolicyApi::default()
    }
}

fn set(api: &mut FakePolicyApi, kind: Kind, name: &str, v: Option<Value>) {
    let key = (kind.plural(), name.to_string());
    match v {
        Some(v) => {
            api.objects.insert(key, v);
        }
        None => {
            api.objects.remove(&key);
        }
    }
}

#[tokio::test]
async fn the_deployed_policies_make_the_controller_ready_and_each_gap_says_why() {
    let deployed = as_deployed();
    assert_eq!(check(&deployed).await, Ok(()));
    assert_eq!(
        deployed.reads.lock().unwrap().as_slice(),
        [
            "served",
            "validatingadmissionpolicies aks-flex-node-daemon-machineoperations",
            "validatingadmissionpolicybindings aks-flex-node-daemon-machineoperations",
            "validatingadmissionpolicies aks-flex-node-daemon-disruption-budget",
            "validatingadmissionpolicybindings aks-flex-node-daemon-disruption-budget",
        ]
    );
    let ops = POLICIES[0];
    let budget = POLICIES[1];
    type Change = Box<dyn Fn(&mut FakePolicyApi)>;
    let cases: Vec<(&str, Change, &str)> = vec![
        (
            "an API server older than 1.30",
            Box::new(|a| a.served = None),
            "serves no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes 1.30 or later is needed)",
        ),
        (
            "the group without the bindings",
            Box::new(|a| a.served = Some(vec![Kind::Policy.plural().into()])),
            "serves no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicyBinding",
        ),
        (
            "a partial apply: no budget policy",
            Box::new(move |a| set(a, Kind::Policy, budget, None)),
            "ValidatingAdmissionPolicy aks-flex-node-daemon-disruption-budget is not there: apply deploy/controller",
        ),
        (
            "a policy without its binding",
            Box::new(move |a| set(a, Kind::Binding, ops, None)),
            "ValidatingAdmissionPolicyBinding aks-flex-node-daemon-machineoperations is not there",
        ),
        (
            "a policy that fails open",
            Box::new(move |a| {
                set(
                    a,
                    Kind::Policy,
                    ops,
                    Some(json!({"spec": {"failurePolicy": "Ignore"}})),
                )
            }),
            "has failurePolicy Ignore, not Fail",
        ),
        (
            "a binding of another policy",
            Box::new(move |a| {
                set(
                    a,
                    Kind::Binding,
                    ops,
                    Some(json!({"spec": {"policyName": "other", "validationActions": ["Deny"]}})),
                )
            }),
            "binds policy \"other\", not aks-flex-node-daemon-machineoperations",
        ),
        (
            "a binding that only warns",
            Box::new(move |a| {
                set(
                    a,
                    Kind::Binding,
                    budget,
                    Some(
                        json!({"spec": {"policyName": budget, "validationActions": ["Warn", "Audit"]}}),
                    ),
                )
            }),
            "has no Deny among its validationActions",
        ),
        (
            "an API error",
            Box::new(|a| a.fail = Some(PolicyApiError("forbidden".into()))),
            "cannot read ValidatingAdmissionPolicy aks-flex-node-daemon-machineoperations: forbidden",
        ),
    ];
    for (name, change, want) in cases {
        let mut api = as_deployed();
        change(&mut api);
        let why = check(&api).await.unwrap_err().to_string();
        assert!(
            why.contains(want),
            "{name}: {why:?} does not contain {want:?}"
        );
    }
    // No failurePolicy is the API server's default, Fail.
    let mut api = as_deployed();
    set(&mut api, Kind::Policy, ops, Some(json!({"spec": {}})));
    assert_eq!(check(&api).await, Ok(()));
}

#[test]
fn readiness_reports_changes_only() {
    let r = Readiness::not_ready("checking the admission policies");
    assert_eq!(
        r.why_not().as_deref(),
        Some("checking the admission policies")
    );
    let gap = || PolicyGap::NoDeny { name: POLICIES[0] };
    assert!(r.set(Err(gap())));
    assert!(!r.set(Err(gap())), "the same reason is no change");
    assert!(r.set(Ok(())));
    assert_eq!(r.why_not(), None);
    assert!(!r.set(Ok(())));
    assert_eq!(Readiness::default().why_not(), None);
}

/// With the approver on, the controller is unready while kube-controller-manager would approve
/// the flex tokens' kubelet certificates (a SubjectAccessReview says the group may create
/// `nodeclient` requests, as the binding an earlier `deploy/controller` shipped granted); the
/// review is made as a token of the flex group; without the approver it is not asked.
#[tokio::test]
async fn a_nodeclient_grant_for_the_flex_group_keeps_the_controller_unready() {
    let group = "system:bootstrappers:aks-flex-node";
    let groups = vec![
        "system:bootstrappers".to_string(),
        group.to_string(),
        "system:authenticated".to_string(),
    ];
    let clean = as_deployed();
    assert_eq!(check_all(&clean, Some(group)).await, Ok(()));
    assert_eq!(
        clean.reads.lock().unwrap().last().unwrap(),
        "review system:bootstrap:probe0 system:bootstrappers,system:bootstrappers:aks-flex-node,system:authenticated create certificatesigningrequests/nodeclient"
    );
    let mut upgraded = as_deployed();
    upgraded.allowed = vec![(
        PROBE_TOKEN_USER.to_string(),
        groups.clone(),
        "nodeclient".to_string(),
    )];
    let why = check_all(&upgraded, Some(group))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        why.starts_with("bootstrap tokens in system:bootstrappers:aks-flex-node may create certificatesigningrequests/nodeclient")
            && why.contains("aks-flex-node-autoapprove-bootstrap"),
        "{why}"
    );
    // Without a group, nothing to ask.
    let reviews = |a: &FakePolicyApi| {
        a.reads
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.starts_with("review"))
            .count()
    };
    let before = reviews(&upgraded);
    assert_eq!(check_all(&upgraded, None).await, Ok(()));
    assert_eq!(reviews(&upgraded), before);
    let mut denied = as_deployed();
    denied.review_fails = Some(PolicyApiError("403 Forbidden".into()));
    assert_eq!(
        check_all(&denied, Some(group))
            .await
            .unwrap_err()
            .to_string(),
        "cannot ask whether system:bootstrappers:aks-flex-node may create certificatesigningrequests/nodeclient: 403 Forbidden"
    );
    // The policies are checked first.
    let mut old = as_deployed();
    old.served = None;
    old.allowed = upgraded.allowed.clone();
    assert!(matches!(
        check_all(&old, Some(group)).await,
        Err(PolicyGap::NotServed(_))
    ));
}
