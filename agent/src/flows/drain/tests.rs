//! The drain's orchestration over the recording `FakeNodeDrain` (the Kubernetes API faked at
//! the [`NodeDrainApi`] seam; tokio's clock paused, so timeouts pass without waiting). The
//! adapter over a real kube client is tested against the fake API server in
//! `flows::operations::tests::reconcile`.

use std::time::Duration;

use super::fakes::{FakeNodeDrain, daemonset_pod, fresh_holder, node, pod, transient};
use super::*;
use crate::flows::repave::Journal;
use k8s_openapi::api::core::v1::Node;

const N: &str = "node1";
const UID: &str = "op-uid-1";
const PDB: &str = "The disruption budget web-pdb needs 1 healthy pods and has 1 currently";

fn policy(secs: u64, on_timeout: OnTimeout) -> DrainPolicy {
    DrainPolicy {
        timeout: Duration::from_secs(secs),
        on_timeout,
    }
}

fn subject() -> Subject {
    Subject {
        owner: UID.into(),
        what: "MachineOperation op (NodeReboot)".into(),
        related: None,
    }
}

async fn drain(f: &FakeNodeDrain, p: DrainPolicy) -> Result<Drained, DrainError> {
    cordon_and_drain(f, N, &subject(), p, DrainTimings::default()).await
}

#[tokio::test(start_paused = true)]
async fn cordons_evicts_and_waits_for_the_pods_leaving_daemonset_pods() {
    let f = FakeNodeDrain::new(
        node(N, false, None),
        vec![pod("default", "web"), daemonset_pod("kube-system", "proxy")],
    );
    let d = drain(&f, DrainPolicy::default()).await.unwrap();
    assert_eq!(d.evicted, 1);
    assert!(!d.cordon_theirs);
    assert_eq!(d.detail().as_deref(), Some("drained 1 pod(s)"));
    assert_eq!(
        f.calls(),
        [
            "node",
            "set_cordon true op-uid-1",
            "pods",
            "evict default/web",
            // The evicted pod terminates (its grace period) …
            "pods",
            // … then it is gone; the DaemonSet's pod stays.
            "pods",
        ]
    );
    assert_eq!(f.cordon(), (true, Some(UID.into())));
    assert_eq!(
        f.events(),
        [
            "Node/node1 Normal Cordoned: cordoned by aks-flex-node for MachineOperation op (NodeReboot)",
            "Node/node1 Normal Drained: evicted 1 pod(s) for MachineOperation op (NodeReboot)",
        ]
    );
    assert_eq!(release(&f, N, Some(UID)).await.unwrap(), Release::Uncordon);
    assert_eq!(
        f.events().last().unwrap(),
        "Node/node1 Normal Uncordoned: uncordoned by aks-flex-node (its cordon for op-uid-1)"
    );
}

#[tokio::test(start_paused = true)]
async fn events_are_recorded_on_the_related_object_too() {
    let f = FakeNodeDrain::new(node(N, false, None), vec![]);
    let s = Subject {
        related: Some(ObjectReference {
            kind: Some("MachineOperation".into()),
            name: Some("op".into()),
            namespace: Some("default".into()),
            ..ObjectReference::default()
        }),
        ..subject()
    };
    cordon_and_drain(&f, N, &s, DrainPolicy::default(), DrainTimings::default())
        .await
        .unwrap();
    let on = |prefix: &str| {
        f.events()
            .iter()
            .filter(|e| e.starts_with(prefix))
            .map(|e| e.split_once(' ').unwrap().1.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(on("Node/node1 ").len(), 2, "{:?}", f.events());
    assert_eq!(on("Node/node1 "), on("MachineOperation/op "));
}

#[tokio::test(start_paused = true)]
async fn a_budget_that_never_allows_fails_the_drain_naming_it() {
    let f = FakeNodeDrain::new(node(N, false, None), vec![pod("default", "web")]);
    f.state().blocked.insert("web".into(), PDB.into());
    let started = tokio::time::Instant::now();
    let e = drain(&f, policy(60, OnTimeout::Fail)).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(60));
    let text = e.to_string();
    assert!(
        text.contains("drain timed out after 60s with 1 pod(s) left (default/web)"),
        "{text}"
    );
    assert!(text.contains("web-pdb"), "{text}");
    // Tried again with backoff (1 s doubling to 10 s), not once and not in a busy loop.
    let evictions = f.calls().iter().filter(|c| c.starts_with("evict")).count();
    assert!((6..=12).contains(&evictions), "{evictions} evictions");
    // One Warning per blocked pod, not one per refused attempt; then the timeout's.
    let events = f.events();
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(
        events[1],
        format!("Node/node1 Warning EvictionBlocked: eviction of default/web refused: {PDB}")
    );
    assert!(
        events[2].starts_with(
            "Node/node1 Warning DrainTimedOut: drain timed out after 60s with 1 pod(s) left"
        ),
        "{events:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn proceed_after_the_timeout_when_asked_and_say_so() {
    let f = FakeNodeDrain::new(
        node(N, false, None),
        vec![pod("default", "web"), pod("default", "db")],
    );
    f.state().blocked.insert("web".into(), PDB.into());
    let d = drain(&f, policy(30, OnTimeout::Proceed)).await.unwrap();
    assert_eq!(d.evicted, 1);
    assert_eq!(
        d.detail().unwrap(),
        format!(
            "drain timed out after 30s with 1 pod(s) left (default/web); last refusal: {PDB}; \
             proceeded as onDrainTimeout asks"
        )
    );
    assert!(
        f.events()
            .last()
            .unwrap()
            .ends_with("; proceeding as onDrainTimeout asks"),
        "{:?}",
        f.events()
    );
}

#[tokio::test(start_paused = true)]
async fn an_administrators_cordon_is_neither_recorded_nor_lifted() {
    let f = FakeNodeDrain::new(node(N, true, None), vec![pod("default", "web")]);
    let d = drain(&f, DrainPolicy::default()).await.unwrap();
    assert!(d.cordon_theirs);
    assert!(!f.calls().iter().any(|c| c.starts_with("set_cordon")));
    assert_eq!(release(&f, N, Some(UID)).await.unwrap(), Release::Nothing);
    assert_eq!(release(&f, N, None).await.unwrap(), Release::Nothing);
    assert_eq!(f.cordon(), (true, None));
    let events = f.events();
    assert!(
        events[0].starts_with("Node/node1 Normal CordonKept: already unschedulable"),
        "{events:?}"
    );
    assert!(
        !events.iter().any(|e| e.contains("Uncordoned")),
        "{events:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_drain_resumed_after_a_crash_keeps_its_own_cordon() {
    // The daemon died after cordoning and evicting one pod; the other is still there.
    let f = FakeNodeDrain::new(node(N, true, Some(UID)), vec![pod("default", "db")]);
    let d = drain(&f, DrainPolicy::default()).await.unwrap();
    assert_eq!(d.evicted, 1);
    assert!(!f.calls().iter().any(|c| c.starts_with("set_cordon")));
    assert_eq!(release(&f, N, Some(UID)).await.unwrap(), Release::Uncordon);
    assert_eq!(f.cordon(), (false, None));
}

#[tokio::test(start_paused = true)]
async fn a_cordon_left_by_another_finished_operation_is_taken_over() {
    let f = FakeNodeDrain::new(node(N, true, Some("old-op")), vec![]);
    drain(&f, DrainPolicy::default()).await.unwrap();
    assert_eq!(f.cordon(), (true, Some(UID.into())));
    // The old operation's release no longer lifts this one's cordon.
    assert_eq!(
        release(&f, N, Some("old-op")).await.unwrap(),
        Release::Nothing
    );
    assert_eq!(f.cordon(), (true, Some(UID.into())));
}

#[tokio::test(start_paused = true)]
async fn an_api_server_unreachable_mid_drain_is_waited_for() {
    let f = FakeNodeDrain::new(node(N, false, None), vec![pod("default", "web")]);
    f.state()
        .failures
        .insert("pods", (0..3).map(|_| transient("list pods")).collect());
    let d = drain(&f, DrainPolicy::default()).await.unwrap();
    assert_eq!(d.evicted, 1);
    let lists = f.calls().iter().filter(|c| *c == "pods").count();
    assert_eq!(
        lists,
        3 + 3,
        "three failed lists, then evict, terminating, gone"
    );
}

#[tokio::test(start_paused = true)]
async fn an_api_server_unreachable_until_the_timeout_fails_the_drain_unless_told_to_proceed() {
    let f = FakeNodeDrain::new(node(N, false, None), vec![pod("default", "web")]);
    f.state()
        .failures
        .insert("pods", (0..1000).map(|_| transient("list pods")).collect());
    let e = drain(&f, policy(20, OnTimeout::Fail)).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "drain timed out after 20s before the node's pods could be listed; \
         last refusal: list pods: connection refused"
    );
    let d = drain(&f, policy(20, OnTimeout::Proceed)).await.unwrap();
    assert_eq!(d.evicted, 0);
    assert!(
        d.detail()
            .unwrap()
            .ends_with("proceeded as onDrainTimeout asks")
    );
}

#[tokio::test(start_paused = true)]
async fn a_cordon_that_cannot_be_made_fails_even_when_told_to_proceed() {
    let f = FakeNodeDrain::new(node(N, false, None), vec![]);
    f.state()
        .failures
        .insert("node", (0..1000).map(|_| transient("get node")).collect());
    let e = drain(&f, policy(20, OnTimeout::Proceed)).await.unwrap_err();
    assert!(
        e.to_string().starts_with("drain timed out after 20s"),
        "{e}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_eviction_refused_for_good_ends_the_drain() {
    let f = FakeNodeDrain::new(node(N, false, None), vec![pod("default", "web")]);
    f.state().answers.insert(
        "web".into(),
        [Eviction::Refused("403: pods \"web\" is forbidden".into())].into(),
    );
    let e = drain(&f, DrainPolicy::default()).await.unwrap_err();
    assert!(matches!(e, DrainError::Refused { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("eviction of default/web refused: 403"),
        "{e}"
    );
    assert!(
        f.events().last().unwrap().starts_with(
            "Node/node1 Warning DrainFailed: drain for MachineOperation op (NodeReboot) failed"
        ),
        "{:?}",
        f.events()
    );
}

#[tokio::test(start_paused = true)]
async fn a_cordon_that_races_another_writer_reads_the_node_again() {
    let f = FakeNodeDrain::new(node(N, false, None), vec![]);
    f.state().failures.insert(
        "set_cordon",
        [DrainApiError {
            action: "cordon".into(),
            cause: "409".into(),
            permanent: false,
            conflict: true,
        }]
        .into(),
    );
    drain(&f, DrainPolicy::default()).await.unwrap();
    assert_eq!(
        f.calls(),
        [
            "node",
            "set_cordon true op-uid-1",
            "node",
            "set_cordon true op-uid-1",
            "pods"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_missing_node_fails_the_drain() {
    let f = FakeNodeDrain::default();
    let e = drain(&f, DrainPolicy::default()).await.unwrap_err();
    assert_eq!(e.to_string(), "node node1 does not exist");
}

#[tokio::test]
async fn ready_means_a_heartbeat_after_the_reboot() {
    let f = FakeNodeDrain::new(node(N, true, Some(UID)), vec![]);
    let t = DrainTimings {
        ready_timeout: Duration::from_millis(50),
        ready_poll: Duration::from_millis(10),
        ..DrainTimings::default()
    };
    let before: Timestamp = "2029-12-31T00:00:00Z".parse().unwrap();
    let after: Timestamp = "2030-01-02T00:00:00Z".parse().unwrap();
    wait_ready(&f, before, t).await.unwrap();
    let e = wait_ready(&f, after, t).await.unwrap_err();
    assert!(e.to_string().contains("before the reboot"), "{e}");
}

/// The daemon's drain over the fake seam (its client is never used: the factory hands out the
/// fake).
fn node_drain(f: &FakeNodeDrain) -> NodeDrain {
    let (service, _handle) = tower_test::mock::pair::<
        http::Request<kube::client::Body>,
        http::Response<kube::client::Body>,
    >();
    let client = kube::Client::new(service, "default");
    NodeDrain::new(KubeClients::fixed(client), N, policy(30, OnTimeout::Fail)).with_api(
        f.factory(),
        DrainTimings {
            ready_timeout: Duration::from_millis(100),
            ready_poll: Duration::from_millis(10),
            ..DrainTimings::default()
        },
    )
}

#[tokio::test]
async fn the_daemon_lifts_at_start_only_a_stale_cordon_of_its_own() {
    let nothing_runs = |_: &str| false;
    // A cordon of work that no longer runs here: lifted.
    let f = FakeNodeDrain::new(node(N, true, Some("gone-op")), vec![]);
    node_drain(&f).release_stale(&nothing_runs).await;
    assert_eq!(f.cordon(), (false, None));
    // One whose work still runs (a drain cut short, resumed by its reconcile): kept.
    let f = FakeNodeDrain::new(node(N, true, Some("uid-op")), vec![]);
    node_drain(&f).release_stale(&|o: &str| o == "uid-op").await;
    assert_eq!(f.cordon(), (true, Some("uid-op".into())));
    // An administrator's: kept, not even asked about.
    let f = FakeNodeDrain::new(node(N, true, None), vec![]);
    node_drain(&f)
        .release_stale(&|_: &str| panic!("an administrator's cordon has no owner to ask about"))
        .await;
    assert_eq!(f.cordon(), (true, None));
    // Ours, but the node is not Ready: kept.
    let mut n = node(N, true, Some("gone-op"));
    n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
    let f = FakeNodeDrain::new(n, vec![]);
    node_drain(&f).release_stale(&nothing_runs).await;
    assert_eq!(f.cordon(), (true, Some("gone-op".into())));
}

fn repave_journal() -> Journal {
    Journal {
        version: 1,
        source: "kube1".into(),
        target: "kube2".into(),
        settings_version: "v2".into(),
        kubernetes_version: "1.33.0".into(),
        phase: crate::flows::repave::Phase::Switching,
        drain: true,
    }
}

#[tokio::test]
async fn a_repave_drains_under_its_own_name_and_uncordons_once_ready() {
    let f = FakeNodeDrain::new(node(N, false, None), vec![pod("default", "web")]);
    let d = node_drain(&f);
    d.before_switch(&repave_journal()).await.unwrap();
    assert_eq!(f.cordon(), (true, Some("repave/v2".into())));
    assert!(f.state().pods.is_empty());
    d.after(&repave_journal(), true).await;
    assert_eq!(f.cordon(), (false, None));
}

#[tokio::test]
async fn a_repave_whose_node_is_not_ready_after_the_switch_stays_cordoned() {
    let mut n = node(N, false, None);
    n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
    let f = FakeNodeDrain::new(n, vec![]);
    let d = node_drain(&f);
    d.before_switch(&repave_journal()).await.unwrap();
    d.after(&repave_journal(), true).await;
    assert_eq!(f.cordon(), (true, Some("repave/v2".into())));
    // Rolled back instead: lifted at once, Ready or not.
    d.after(&repave_journal(), false).await;
    assert_eq!(f.cordon(), (false, None));
}

#[tokio::test]
async fn a_repave_drain_that_times_out_is_a_transient_failure_a_refusal_a_permanent_one() {
    let f = FakeNodeDrain::new(node(N, false, None), vec![pod("default", "web")]);
    f.state()
        .blocked
        .insert("web".into(), "The disruption budget web-pdb".into());
    let d = NodeDrain {
        policy: policy(1, OnTimeout::Fail),
        ..node_drain(&f)
    };
    let e = d.before_switch(&repave_journal()).await.unwrap_err();
    assert!(!e.is_permanent());
    assert!(e.to_string().contains("web-pdb"), "{e}");
    let f = FakeNodeDrain::new(node(N, false, None), vec![pod("default", "web")]);
    f.state().answers.insert(
        "web".into(),
        [Eviction::Refused("403: forbidden".into())].into(),
    );
    let e = node_drain(&f).before_deletion_reset().await.unwrap_err();
    assert!(e.is_permanent(), "{e}");
    assert_eq!(f.cordon(), (true, Some(DELETION_OWNER.into())));
}

#[tokio::test]
async fn a_repave_after_the_nodes_deletion_has_nothing_to_drain() {
    let f = FakeNodeDrain::default();
    let d = node_drain(&f);
    d.before_switch(&repave_journal()).await.unwrap();
    assert_eq!(f.calls(), ["node"]);
}

// ---- The disruption budget (`budget`), over the same fake: its ConfigMap in `State.budget`.

async fn take(f: &FakeNodeDrain, node: &str) -> Result<budget::Slot, budget::AcquireError> {
    take_with(f, node, &budget::Told::default()).await
}

async fn take_with(
    f: &FakeNodeDrain,
    node: &str,
    told: &budget::Told,
) -> Result<budget::Slot, budget::AcquireError> {
    budget::acquire(f, node, &subject(), budget::BudgetTimings::default(), told).await
}

#[tokio::test(start_paused = true)]
async fn a_free_slot_is_taken_with_an_event_and_only_the_nodes_key_written() {
    let f =
        FakeNodeDrain::new(node(N, false, None), vec![]).with_budget(&[("maxUnavailable", "2")]);
    let slot = take(&f, N).await.unwrap();
    assert_eq!(
        slot,
        budget::Slot::Held {
            lease: Duration::from_secs(300)
        }
    );
    assert_eq!(f.holder(N).unwrap().owner, UID);
    assert_eq!(
        f.state().budget_calls,
        ["budget", "set_budget holder.node1=set"]
    );
    assert_eq!(
        f.events(),
        [
            "Node/node1 Normal DisruptionSlotAcquired: took one of 2 disruption slot(s) for MachineOperation op (NodeReboot)"
        ]
    );
    // Freed by its owner only.
    budget::change(&f, N, Some("another-op"), budget::Change::Release)
        .await
        .unwrap();
    assert!(f.holder(N).is_some());
    budget::change(&f, N, Some(UID), budget::Change::Release)
        .await
        .unwrap();
    assert!(f.holder(N).is_none());
    assert_eq!(f.budget_data().unwrap().len(), 1, "maxUnavailable stays");
}

#[tokio::test(start_paused = true)]
async fn a_held_slot_is_asked_for_briefly_then_again_later_with_one_event_until_it_is_freed() {
    let f = FakeNodeDrain::new(node(N, false, None), vec![]).with_budget(&[
        ("maxUnavailable", "1"),
        ("holder.node2", &fresh_holder("op-2")),
    ]);
    let told = budget::Told::default();
    let started = tokio::time::Instant::now();
    // One acquire gives the daemon back after a few looks (2, 4, 8 s apart) ...
    let e = take_with(&f, N, &told).await.unwrap_err();
    assert!(matches!(e, budget::AcquireError::Busy(_)), "{e}");
    assert_eq!(started.elapsed(), Duration::from_secs(14));
    assert_eq!(f.state().budget_calls, ["budget"; 4]);
    assert!(f.calls().is_empty(), "nothing cordoned");
    // ... and the daemon asks again (after SLOT_RECHECK) until node2 frees the slot.
    tokio::time::sleep(budget::SLOT_RECHECK).await;
    assert!(take_with(&f, N, &told).await.is_err());
    budget::change(&f, "node2", None, budget::Change::Release)
        .await
        .unwrap();
    tokio::time::sleep(budget::SLOT_RECHECK).await;
    take_with(&f, N, &told).await.unwrap();
    // One Event while the holders stayed the same, not one per look or per acquire.
    assert_eq!(
        f.events(),
        [
            "Node/node1 Normal WaitingForDisruptionSlot: MachineOperation op (NodeReboot) waits for one of 1 disruption slot(s), held by node2",
            "Node/node1 Normal DisruptionSlotAcquired: took one of 1 disruption slot(s) for MachineOperation op (NodeReboot)",
        ]
    );
}

/// When a wait is told: when it begins, and when it turns from held to paused or back; not at
/// each change of the holders.
#[test]
fn a_wait_is_told_when_it_begins_or_turns_paused_or_back() {
    let h = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    for (told, holders, want) in [
        (None, h(&["node2"]), true),
        (None, h(&[]), true),
        (Some(h(&["node2"])), h(&["node2"]), false),
        (Some(h(&["node2"])), h(&["node3"]), false),
        (Some(h(&["node2"])), h(&["node2", "node3"]), false),
        (Some(h(&["node2"])), h(&[]), true),
        (Some(h(&[])), h(&["node2"]), true),
        (Some(h(&[])), h(&[]), false),
    ] {
        assert_eq!(
            budget::tell_wait(told.as_deref(), &holders),
            want,
            "{told:?} -> {holders:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_holder_that_stopped_renewing_frees_its_slot_after_the_lease() {
    let stale = serde_json::to_string(&flex_api::budget::Holder {
        owner: "op-2".into(),
        acquired: "2000-01-01T00:00:00Z".into(),
        renewed: "2000-01-01T00:00:00Z".into(),
        stuck: false,
    })
    .unwrap();
    let f =
        FakeNodeDrain::new(node(N, false, None), vec![]).with_budget(&[("holder.node2", &stale)]);
    take(&f, N).await.unwrap();
    // The dead holder's key is left alone (a node writes only its own), just not counted.
    assert_eq!(f.budget_data().unwrap()["holder.node2"], stale);
    assert!(f.holder(N).is_some());
}

#[tokio::test(start_paused = true)]
async fn two_nodes_racing_for_the_last_slot_one_wins_the_other_waits() {
    let f =
        FakeNodeDrain::new(node(N, false, None), vec![]).with_budget(&[("maxUnavailable", "1")]);
    // Both read the free slot before either writes (the fake yields after each read): the
    // second write carries a stale resourceVersion and conflicts; its node reads again.
    f.state().yield_after_read = true;
    let racer = f.clone();
    let a = tokio::spawn({
        let f = f.clone();
        async move { take(&f, N).await }
    });
    let b = tokio::spawn(async move { take(&racer, "node2").await });
    // Whichever wrote first holds the slot; the other read again, found it held, and gave
    // the daemon back (Busy).
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!(u8::from(a.is_ok()) + u8::from(b.is_ok()), 1, "{a:?} {b:?}");
    assert!(
        matches!(a, Err(budget::AcquireError::Busy(_)))
            || matches!(b, Err(budget::AcquireError::Busy(_)))
    );
    let holders: Vec<String> = f
        .budget_data()
        .unwrap()
        .keys()
        .filter(|k| k.starts_with("holder."))
        .cloned()
        .collect();
    assert_eq!(holders.len(), 1, "{holders:?}");
    let calls = f.state().budget_calls.clone();
    let mut writes = calls[2..4].to_vec();
    writes.sort();
    assert_eq!(
        calls[..2],
        ["budget", "budget"],
        "both read first: {calls:?}"
    );
    assert_eq!(
        writes,
        ["set_budget holder.node1=set", "set_budget holder.node2=set"],
        "then both wrote: {calls:?}"
    );
    assert_eq!(
        f.state().budget.as_ref().unwrap().0,
        2,
        "one write accepted"
    );
}

#[tokio::test(start_paused = true)]
async fn a_write_conflict_reads_again_and_takes_the_slot_if_it_is_still_free() {
    let f =
        FakeNodeDrain::new(node(N, false, None), vec![]).with_budget(&[("maxUnavailable", "2")]);
    f.state().failures.insert(
        "set_budget",
        [DrainApiError {
            action: "set_budget".into(),
            cause: "409 Conflict".into(),
            permanent: false,
            conflict: true,
        }]
        .into(),
    );
    take(&f, N).await.unwrap();
    assert_eq!(
        f.state().budget_calls,
        [
            "budget",
            "set_budget holder.node1=set",
            "budget",
            "set_budget holder.node1=set"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn no_budget_goes_on_with_a_warning_a_bad_one_stops_naming_the_field() {
    let f = FakeNodeDrain::new(node(N, false, None), vec![]);
    let slot = take(&f, N).await.unwrap();
    assert!(matches!(slot, budget::Slot::NoBudget(_)), "{slot:?}");
    assert!(
        f.events()[0].starts_with(
            "Node/node1 Warning NoDisruptionBudget: no disruption budget (ConfigMap kube-system/aks-flex-node-disruption: it does not exist)"
        ),
        "{:?}",
        f.events()
    );
    let f =
        FakeNodeDrain::new(node(N, false, None), vec![]).with_budget(&[("maxUnavailable", "one")]);
    let e = take(&f, N).await.unwrap_err();
    let budget::AcquireError::Invalid(e) = e else {
        panic!("{e}")
    };
    assert_eq!(e.field, "maxUnavailable");
    assert!(
        f.events()[0].contains("DisruptionBudgetInvalid"),
        "{:?}",
        f.events()
    );
    assert!(f.holder(N).is_none());
}

#[tokio::test(start_paused = true)]
async fn the_keeper_renews_every_third_of_the_lease_until_dropped() {
    let f =
        FakeNodeDrain::new(node(N, false, None), vec![]).with_budget(&[("leaseDuration", "90s")]);
    let slot = take(&f, N).await.unwrap();
    let first = f.holder(N).unwrap();
    let keeper = budget::Keeper::start(std::sync::Arc::new(f.clone()), N, &slot);
    tokio::time::sleep(Duration::from_secs(95)).await;
    let writes = |f: &FakeNodeDrain| {
        f.state()
            .budget_calls
            .iter()
            .filter(|c| c.starts_with("set_budget"))
            .count()
    };
    assert_eq!(writes(&f), 1 + 3, "taken, then renewed at 30, 60 and 90 s");
    assert_eq!(f.holder(N).unwrap().acquired, first.acquired);
    drop(keeper);
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert_eq!(writes(&f), 4, "no renewal after the drop");
    // Stuck: kept for good.
    budget::change(&f, N, Some(UID), budget::Change::Stuck)
        .await
        .unwrap();
    assert!(f.holder(N).unwrap().stuck);
}

#[tokio::test]
async fn the_daemon_frees_at_start_only_a_stale_slot_of_its_own_on_a_ready_node() {
    let nothing_runs = |_: &str| false;
    let budget = |owner: &str| [("holder.node1".to_string(), fresh_holder(owner))];
    let with = |n: Node, owner: &str| {
        let f = FakeNodeDrain::new(n, vec![]);
        f.state().budget = Some((1, budget(owner).into_iter().collect()));
        f
    };
    let f = with(node(N, false, None), "gone-op");
    node_drain(&f).release_stale(&nothing_runs).await;
    assert!(f.holder(N).is_none(), "freed");
    let f = with(node(N, false, None), "uid-op");
    node_drain(&f).release_stale(&|o: &str| o == "uid-op").await;
    assert!(f.holder(N).is_some(), "its work still runs");
    let mut n = node(N, false, None);
    n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
    let f = with(n, "gone-op");
    node_drain(&f).release_stale(&nothing_runs).await;
    assert!(f.holder(N).is_some(), "not Ready: kept");
}

/// The progress recorder over the recording fake, writing real files under a temporary root:
/// the last step told to the Node is kept (once, though it is told to the operation too), and
/// status reads it back through its checksum.
#[tokio::test(start_paused = true)]
async fn each_step_told_to_the_node_is_kept_as_the_last_drain_step() {
    let root = tempfile::tempdir().unwrap();
    let fs = flex_host::fs::HostFs::new(root.path());
    let fake = std::sync::Arc::new(FakeNodeDrain::new(
        node(N, false, None),
        vec![pod("default", "web")],
    ));
    let recorded = progress::Recorded::new(fake.clone(), fs.clone());
    let store = progress::store(fs.clone());
    assert_eq!(store.load().unwrap(), None);
    let s = Subject {
        related: Some(ObjectReference {
            kind: Some("MachineOperation".into()),
            name: Some("op".into()),
            ..ObjectReference::default()
        }),
        ..subject()
    };
    cordon_and_drain(
        &recorded,
        N,
        &s,
        DrainPolicy::default(),
        DrainTimings::default(),
    )
    .await
    .unwrap();
    let last = store.load().unwrap().unwrap();
    assert_eq!(last.reason, reasons::DRAINED);
    assert!(!last.warning);
    assert!(last.note.contains("evicted 1 pod(s)"), "{last:?}");
    assert!(last.at.ends_with('Z'), "{last:?}");
    assert_eq!(
        fs.mode(std::path::Path::new(progress::PROGRESS_PATH)),
        Some(0o600)
    );
    // Only the operation's copy of an Event: nothing recorded.
    recorded
        .event(
            s.related.as_ref().unwrap(),
            true,
            "Other",
            "told to the operation only",
        )
        .await;
    assert_eq!(store.load().unwrap().unwrap().reason, reasons::DRAINED);
    release(&recorded, N, Some(UID)).await.unwrap();
    assert_eq!(store.load().unwrap().unwrap().reason, reasons::UNCORDONED);
}
