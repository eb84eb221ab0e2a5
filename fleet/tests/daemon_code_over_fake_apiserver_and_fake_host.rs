//! The fleet simulator's invariants, in the normal test suite. What is real: the daemon's own
//! MachineOperation watch (with its field-selector probe and fallback), work queue, reconcile,
//! disruption budget and drain, each simulated node as its own impersonated identity. What is
//! faked: the API server (`flex_fleet::apiserver`, in process, on loopback HTTP) and the host
//! (a reboot is recorded, and kubelet's Ready after it is played by the simulator).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::time::Duration;

use flex_fleet::report::FleetReport;
use flex_fleet::sim::{FleetConfig, node_name, operation_name, run};

fn config(nodes: usize, budget: u32, selector: bool) -> FleetConfig {
    FleetConfig {
        nodes,
        operations: nodes,
        budget,
        selector,
        kubeconfig: None,
        pods_per_node: 1,
        reboot_time: Duration::from_millis(150),
        recheck: Duration::from_millis(100),
        timeout: Duration::from_secs(120),
    }
}

async fn fleet(nodes: usize, budget: u32, selector: bool) -> FleetReport {
    let report = run(&config(nodes, budget, selector)).await.unwrap();
    eprintln!("{}", report.render());
    // Whatever the parameters: every operation finished well, each reboot ran on a node its
    // daemon had cordoned, and the fake API server served every request the daemons made.
    assert_eq!(
        report.phases.get("Complete").copied(),
        Some(report.operations),
        "{:?}",
        report.phases
    );
    assert_eq!(report.reboots, report.operations);
    assert_eq!(report.reboots_uncordoned, 0);
    assert_eq!(report.nodes_disrupted, nodes);
    assert!(report.unsupported.is_empty(), "{:?}", report.unsupported);
    report
}

/// The changes of the operations aimed at node `i` (the burst aims one at each node).
fn own_changes(r: &FleetReport, i: usize) -> u64 {
    r.operation_changes[&operation_name(i)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_budget_bounds_a_burst_of_reboots_to_k_nodes_at_once_over_the_fake_api_server() {
    for k in [1, 2] {
        let r = fleet(6, k, true).await;
        // A burst larger than K fills the budget and never exceeds it.
        assert_eq!(r.max_disrupted, k as usize, "K={k}");
        // The nodes that waited said so.
        assert!(
            r.event_reasons
                .get("WaitingForDisruptionSlot")
                .is_some_and(|n| *n > 0),
            "{:?}",
            r.event_reasons
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_watch_with_the_selector_gets_only_its_own_operations_whatever_the_fleet_size() {
    let mut means = Vec::new();
    for n in [3, 6] {
        // K = N: nobody waits, so each operation changes the same few times at any N.
        let r = fleet(n, n as u32, true).await;
        for i in 0..n {
            let c = &r.per_node[&node_name(i)];
            assert_eq!(
                c.operations_seen.iter().cloned().collect::<Vec<_>>(),
                vec![operation_name(i)],
                "N={n}: node {i} was sent another node's operation"
            );
            // Every change of its own operation, and nothing else.
            assert_eq!(
                c.operation_watch_events,
                own_changes(&r, i),
                "N={n} node {i}"
            );
        }
        means.push(r.spread(|c| c.operation_watch_events).mean);
    }
    // Twice the fleet, not twice the events per node.
    assert!(means[1] <= means[0] + 1.0, "{means:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_watch_without_the_selector_falls_back_to_every_operation_of_the_fleet() {
    let mut means = Vec::new();
    for n in [3, 6] {
        let r = fleet(n, n as u32, false).await;
        let all: u64 = r.operation_changes.values().sum();
        for i in 0..n {
            let c = &r.per_node[&node_name(i)];
            assert_eq!(c.operations_seen.len(), n, "N={n} node {i}");
            assert_eq!(c.operation_watch_events, all, "N={n} node {i}");
        }
        means.push(r.spread(|c| c.operation_watch_events).mean);
    }
    // The cost per node grows with the fleet.
    assert!(means[1] >= means[0] * 1.8, "{means:?}");
}

/// The `--kubeconfig` path (a real API server's), pointed at the fake one through a kubeconfig
/// file: each node impersonated, the budget held, and what the run created removed after it.
/// Not a real control plane: that run is still to be done (docs/drain.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_fleet_through_a_kubeconfig_impersonates_each_node_and_cleans_up_after_itself() {
    use flex_fleet::apiserver::FakeApiServer;
    use flex_fleet::sim::{SIM_LABEL, node_identity};

    let server = FakeApiServer::start(true).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\nusers:\n- name: admin\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: admin\ncurrent-context: fake\n",
            server.url()
        ),
    )
    .unwrap();
    let cfg = FleetConfig {
        kubeconfig: Some(path),
        pods_per_node: 0,
        ..config(4, 1, true)
    };
    let r = run(&cfg).await.unwrap();
    assert_eq!(r.phases.get("Complete").copied(), Some(4), "{:?}", r.phases);
    assert_eq!(r.max_disrupted, 1);
    assert_eq!(r.reboots_uncordoned, 0);
    // Only the fake API server's own report counts per node.
    assert!(r.per_node.is_empty());
    let counts = server.counts();
    for i in 0..4 {
        let c = &counts.by_identity[&node_identity(&node_name(i))];
        assert!(c.requests > 0 && c.operations_seen.contains(&operation_name(i)));
    }
    assert!(counts.unsupported.is_empty(), "{:?}", counts.unsupported);

    let admin =
        aks_flex_node::kubeclient::client_from(kube::Config::new(server.url().parse().unwrap()))
            .unwrap();
    let lp = kube::api::ListParams::default().labels(&format!("{SIM_LABEL}=true"));
    let nodes = kube::Api::<k8s_openapi::api::core::v1::Node>::all(admin.clone());
    let ops = kube::Api::<flex_api::machina::MachineOperation>::all(admin);
    assert!(nodes.list(&lp).await.unwrap().items.is_empty());
    assert!(ops.list(&lp).await.unwrap().items.is_empty());
}
