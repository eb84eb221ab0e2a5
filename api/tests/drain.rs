//! The drain's pure decisions (`flex_api::drain`), table by table: which pods are evicted, what
//! an eviction's answer means, whose cordon a Node carries and what releasing it does, and the
//! operation parameters. Nothing is faked: the inputs are Kubernetes objects as JSON.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::collections::BTreeMap;
use std::time::Duration;

use flex_api::drain::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

fn pod(name: &str, extra: Value) -> Pod {
    let mut v = json!({"metadata": {"namespace": "ns", "name": name, "uid": format!("u-{name}")},
                       "status": {"phase": "Running"}});
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn owner(kind: &str, controller: bool) -> Value {
    json!({"metadata": {"ownerReferences": [
        {"apiVersion": "apps/v1", "kind": kind, "name": "x", "uid": "x", "controller": controller}]}})
}

#[test]
fn which_pods_a_drain_evicts() {
    let cases: Vec<(&str, Pod, &str)> = vec![
        (
            "a ReplicaSet's pod",
            pod("a", owner("ReplicaSet", true)),
            "evict",
        ),
        (
            "a bare pod (kubelet is about to stop it anyway)",
            pod("b", json!({})),
            "evict",
        ),
        (
            "a StatefulSet's pod",
            pod("c", owner("StatefulSet", true)),
            "evict",
        ),
        (
            "a DaemonSet's pod",
            pod("d", owner("DaemonSet", true)),
            "DaemonSet",
        ),
        (
            "a DaemonSet owner that is not the controller",
            pod("e", owner("DaemonSet", false)),
            "evict",
        ),
        (
            "a static pod's mirror",
            pod(
                "f",
                json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "abc"}}}),
            ),
            "Mirror",
        ),
        (
            "a finished Job pod",
            pod("g", json!({"status": {"phase": "Succeeded"}})),
            "Finished",
        ),
        (
            "a failed pod",
            pod("h", json!({"status": {"phase": "Failed"}})),
            "Finished",
        ),
        (
            "a pod already terminating",
            pod(
                "i",
                json!({"metadata": {"deletionTimestamp": "2026-12-07T00:00:00Z"}}),
            ),
            "terminating",
        ),
    ];
    for (what, p, want) in cases {
        let got = plan(std::slice::from_ref(&p));
        let is = if !got.evict.is_empty() {
            "evict".to_string()
        } else if !got.terminating.is_empty() {
            "terminating".to_string()
        } else {
            format!("{:?}", got.skipped[0].1)
        };
        assert_eq!(is, want, "{what}");
        assert_eq!(
            got.done(),
            want != "evict" && want != "terminating",
            "{what}"
        );
    }
}

#[test]
fn what_an_eviction_answer_means() {
    let pdb = (
        "DisruptionBudget".to_string(),
        "The disruption budget web-pdb needs 2 healthy pods and has 2 currently".to_string(),
    );
    type Case<'a> = (u16, &'a str, Vec<(String, String)>, Eviction);
    let cases: Vec<Case> = vec![
        (201, "", vec![], Eviction::Accepted),
        (200, "", vec![], Eviction::Accepted),
        (404, "pods \"web\" not found", vec![], Eviction::Gone),
        (
            409,
            "Precondition failed: UID in precondition",
            vec![],
            Eviction::Gone,
        ),
        (
            429,
            "Cannot evict pod as it would violate the pod's disruption budget.",
            vec![pdb.clone()],
            Eviction::Blocked(pdb.1.clone()),
        ),
        (
            429,
            "Cannot evict pod as it would violate the pod's disruption budget.",
            vec![],
            Eviction::Blocked(
                "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            ),
        ),
        (
            429,
            "too many requests",
            vec![],
            Eviction::Retry("429: too many requests".into()),
        ),
        (
            503,
            "unavailable",
            vec![],
            Eviction::Retry("503: unavailable".into()),
        ),
        (
            403,
            "forbidden",
            vec![],
            Eviction::Refused("403: forbidden".into()),
        ),
        (400, "bad", vec![], Eviction::Refused("400: bad".into())),
    ];
    for (code, message, causes, want) in cases {
        assert_eq!(
            classify_eviction(code, message, &causes),
            want,
            "{code} {message}"
        );
    }
}

fn node(unschedulable: bool, by: Option<&str>) -> Node {
    let mut a = BTreeMap::new();
    if let Some(b) = by {
        a.insert(CORDONED_BY, b);
    }
    serde_json::from_value(json!({"metadata": {"name": "n", "annotations": a},
                                  "spec": {"unschedulable": unschedulable}}))
    .unwrap()
}

#[test]
fn whose_cordon_it_is() {
    let cases = [
        (
            "schedulable",
            node(false, None),
            Cordon::Cordon,
            Release::Nothing,
            Release::Nothing,
        ),
        (
            "an administrator's cordon",
            node(true, None),
            Cordon::Theirs,
            Release::Nothing,
            Release::Nothing,
        ),
        (
            "this operation's",
            node(true, Some("u1")),
            Cordon::Ours,
            Release::Uncordon,
            Release::Uncordon,
        ),
        (
            "another operation's (a release cut short)",
            node(true, Some("u0")),
            Cordon::TakeOver("u0".into()),
            Release::Nothing,
            Release::Uncordon,
        ),
        (
            "ours, uncordoned since by an administrator",
            node(false, Some("u1")),
            Cordon::Cordon,
            Release::ForgetAnnotation,
            Release::ForgetAnnotation,
        ),
    ];
    for (what, n, cordon, release_u1, release_any) in cases {
        assert_eq!(cordon_plan(&n, "u1"), cordon, "{what}");
        assert_eq!(release_plan(&n, Some("u1")), release_u1, "{what}");
        assert_eq!(release_plan(&n, None), release_any, "{what}");
    }
}

#[test]
fn drain_parameters_and_the_node_default() {
    let p = |pairs: &[(&str, &str)]| {
        DrainRequest::from_params(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    };
    let node_default = DrainPolicy {
        timeout: Duration::from_secs(120),
        on_timeout: OnTimeout::Proceed,
    };
    assert_eq!(p(&[]).unwrap().resolve(node_default), node_default);
    assert_eq!(
        p(&[("drainTimeout", "1m30s"), ("onDrainTimeout", "Fail")])
            .unwrap()
            .resolve(node_default),
        DrainPolicy {
            timeout: Duration::from_secs(90),
            on_timeout: OnTimeout::Fail
        }
    );
    assert_eq!(
        p(&[("drainTimeout", "24h")]).unwrap().timeout,
        Some(Duration::from_secs(86400))
    );
    for bad in ["0s", "500ms", "24h1s", "-1m", "", "5"] {
        assert_eq!(
            p(&[("drainTimeout", bad)]),
            Err(DrainParamError::Timeout(bad.into())),
            "{bad:?}"
        );
    }
    for bad in ["fail", "proceed", "Force", ""] {
        assert_eq!(
            p(&[("onDrainTimeout", bad)]),
            Err(DrainParamError::OnTimeout(bad.into())),
            "{bad:?}"
        );
    }
    assert_eq!(DrainPolicy::default().timeout, Duration::from_secs(300));
    assert_eq!(DrainPolicy::default().on_timeout, OnTimeout::Fail);
}

#[test]
fn ready_reads_the_condition_and_its_heartbeat() {
    let n: Node =
        serde_json::from_value(json!({"metadata": {"name": "n"}, "status": {"conditions": [
        {"type": "MemoryPressure", "status": "False"},
        {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-12-07T10:00:00Z"}]}}))
        .unwrap();
    let (r, beat) = ready(&n).unwrap();
    assert!(r);
    assert_eq!(beat.unwrap().to_string(), "2026-12-07T10:00:00Z");
    assert_eq!(ready(&node(false, None)), None);
}
