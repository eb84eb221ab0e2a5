//! The disruption budget's decisions (`flex_api::budget`) as tables over ConfigMap data: who
//! holds a slot, expiry, renewal, K = 0, bad fields. Pure: nothing is faked.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::time::Duration;

use flex_api::budget::{
    Acquire, BudgetError, Data, Holder, acquire, live, owner, parse, release, renew,
};
use k8s_openapi::jiff::Timestamp;

fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

const NOW: &str = "2026-12-07T12:00:00Z";

fn holder(owner: &str, renewed: &str, stuck: bool) -> String {
    serde_json::to_string(&Holder {
        owner: owner.into(),
        acquired: "2026-12-07T11:00:00Z".into(),
        renewed: renewed.into(),
        stuck,
    })
    .unwrap()
}

fn data(entries: &[(&str, &str)]) -> Data {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `acquire` for node `me` at NOW: `Ok(new value of me's key)` or `Err(holders waited for)`.
fn try_acquire(d: &Data, me: &str, op: &str) -> Result<Holder, Vec<String>> {
    let b = parse(d).unwrap();
    match acquire(d, &b, me, op, t(NOW)) {
        Acquire::Write(out) => {
            // Only the node's own key changes.
            for (k, v) in &out {
                if k != &format!("holder.{me}") {
                    assert_eq!(d.get(k), Some(v), "{k} changed");
                }
            }
            assert_eq!(
                out.len(),
                d.len() + usize::from(!d.contains_key(&format!("holder.{me}")))
            );
            Ok(serde_json::from_str(&out[&format!("holder.{me}")]).unwrap())
        }
        Acquire::Wait { holders, max } => {
            assert_eq!(max, b.max_unavailable);
            Err(holders)
        }
    }
}

#[test]
fn acquire_table() {
    let fresh = holder("op-a", "2026-12-07T11:58:00Z", false); // 2 min ago
    let expired = holder("op-a", "2026-12-07T11:54:59Z", false); // over 5 min ago
    let stuck = holder("op-a", "2026-12-07T10:00:00Z", true);
    let ahead = holder("op-a", "2026-12-07T12:10:00Z", false); // a clock ahead
    type Case<'a> = (&'a str, Data, Result<(), Vec<&'a str>>);
    let cases: Vec<Case> = vec![
        ("empty: K defaults to 1", data(&[]), Ok(())),
        ("one free slot", data(&[("maxUnavailable", "1")]), Ok(())),
        (
            "the one slot held",
            data(&[("maxUnavailable", "1"), ("holder.n2", &fresh)]),
            Err(vec!["n2"]),
        ),
        (
            "held, but expired",
            data(&[("maxUnavailable", "1"), ("holder.n2", &expired)]),
            Ok(()),
        ),
        (
            "a stuck holder never expires",
            data(&[("maxUnavailable", "1"), ("holder.n2", &stuck)]),
            Err(vec!["n2"]),
        ),
        (
            "a renewal in the future counts as now",
            data(&[("maxUnavailable", "1"), ("holder.n2", &ahead)]),
            Err(vec!["n2"]),
        ),
        (
            "K = 2, one held",
            data(&[("maxUnavailable", "2"), ("holder.n2", &fresh)]),
            Ok(()),
        ),
        (
            "K = 2, both held",
            data(&[
                ("maxUnavailable", "2"),
                ("holder.n3", &fresh),
                ("holder.n2", &stuck),
            ]),
            Err(vec!["n2", "n3"]),
        ),
        (
            "K = 0 pauses everything",
            data(&[("maxUnavailable", "0")]),
            Err(vec![]),
        ),
        (
            "a damaged holder holds nothing",
            data(&[("maxUnavailable", "1"), ("holder.n2", "{not json")]),
            Ok(()),
        ),
        (
            "a longer lease keeps an old renewal",
            data(&[
                ("maxUnavailable", "1"),
                ("leaseDuration", "1h"),
                ("holder.n2", &expired),
            ]),
            Err(vec!["n2"]),
        ),
        (
            "the node's own slot is renewed even when every slot is held",
            data(&[("maxUnavailable", "1"), ("holder.n1", &fresh)]),
            Ok(()),
        ),
    ];
    for (name, d, want) in cases {
        let got = try_acquire(&d, "n1", "op-b").map(|_| ());
        let want = want.map_err(|v| v.into_iter().map(String::from).collect::<Vec<_>>());
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn a_slot_taken_over_by_the_next_operation_restarts_its_clock_the_same_one_keeps_it() {
    let fresh = holder("op-a", "2026-12-07T11:58:00Z", false);
    let d = data(&[("holder.n1", &fresh)]);
    let same = try_acquire(&d, "n1", "op-a").unwrap();
    assert_eq!(same.acquired, "2026-12-07T11:00:00Z");
    assert_eq!(same.renewed, NOW);
    let next = try_acquire(&d, "n1", "op-b").unwrap();
    assert_eq!((next.owner.as_str(), next.acquired.as_str()), ("op-b", NOW));
    // Its own slot, expired: taken afresh, if a slot is free.
    let expired = holder("op-a", "2026-12-07T11:00:00Z", false);
    let fresh2 = holder("op-x", "2026-12-07T11:59:00Z", false);
    let d = data(&[("holder.n1", &expired), ("holder.n2", &fresh2)]);
    assert_eq!(try_acquire(&d, "n1", "op-a"), Err(vec!["n2".to_string()]));
}

#[test]
fn renew_and_release_touch_only_the_nodes_key() {
    let other = holder("op-x", "2026-12-07T11:59:00Z", false);
    let mine = holder("op-a", "2026-12-07T11:58:00Z", false);
    let d = data(&[
        ("maxUnavailable", "2"),
        ("holder.n1", &mine),
        ("holder.n2", &other),
    ]);
    let b = parse(&d).unwrap();
    let r = renew(&d, &b, "n1", t(NOW), false).unwrap();
    let h: Holder = serde_json::from_str(&r["holder.n1"]).unwrap();
    assert_eq!(
        (h.owner.as_str(), h.renewed.as_str(), h.stuck),
        ("op-a", NOW, false)
    );
    assert_eq!(r["holder.n2"], other);
    let s = renew(&d, &b, "n1", t(NOW), true).unwrap();
    let h: Holder = serde_json::from_str(&s["holder.n1"]).unwrap();
    assert!(h.stuck);
    assert!(live(
        Some(&h),
        Duration::from_secs(30),
        t("2030-01-01T00:00:00Z")
    ));
    // Once stuck, a plain renewal does not unstick it: only a release does.
    let b2 = parse(&s).unwrap();
    let h: Holder =
        serde_json::from_str(&renew(&s, &b2, "n1", t(NOW), false).unwrap()["holder.n1"]).unwrap();
    assert!(h.stuck);
    assert_eq!(
        renew(&d, &b, "n3", t(NOW), false),
        None,
        "no slot: nothing to renew"
    );
    // A slot that lapsed (cut off for longer than the lease) is not brought back.
    let lapsed = holder("op-a", "2026-12-07T11:50:00Z", false);
    let d2 = data(&[("holder.n1", &lapsed)]);
    assert_eq!(renew(&d2, &parse(&d2).unwrap(), "n1", t(NOW), false), None);
    let gone = release(&d, "n1").unwrap();
    assert!(!gone.contains_key("holder.n1"));
    assert_eq!(gone.len(), 2);
    assert_eq!(release(&gone, "n1"), None);
    assert_eq!(owner(&b, "n1").as_deref(), Some("op-a"));
    assert_eq!(owner(&b, "n3"), None);
}

#[test]
fn bad_fields_are_named() {
    let e = |d: Data| parse(&d).unwrap_err();
    assert_eq!(
        e(data(&[("maxUnavailable", "-1")])),
        BudgetError {
            field: "maxUnavailable".into(),
            reason: "\"-1\" is not a whole number of nodes (0 or more)".into()
        }
    );
    assert_eq!(
        e(data(&[("maxUnavailable", "10%")])).to_string(),
        "ConfigMap kube-system/aks-flex-node-disruption: data.maxUnavailable: \"10%\" is not a \
         whole number of nodes (0 or more)"
    );
    assert_eq!(
        e(data(&[("leaseDuration", "5 minutes")])).field,
        "leaseDuration"
    );
    assert_eq!(
        e(data(&[("leaseDuration", "1s")])).reason,
        "\"1s\" is outside 30s to 24h"
    );
    let b = parse(&data(&[
        ("maxUnavailable", " 3 "),
        ("leaseDuration", "90s"),
    ]))
    .unwrap();
    assert_eq!((b.max_unavailable, b.lease), (3, Duration::from_secs(90)));
}
