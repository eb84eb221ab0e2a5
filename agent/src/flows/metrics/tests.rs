//! The daemon's metrics as a scraper sees them: the real registry rendered to OpenMetrics text.
//! Nothing is faked.

use std::time::Duration;

use super::*;
use crate::machine::seams::SeamError;

fn lines(m: &DaemonMetrics, prefix: &str) -> Vec<String> {
    flex_metrics::samples(&m.render(), prefix)
}

#[test]
fn every_family_is_described_before_anything_happened() {
    let m = DaemonMetrics::new("1.2.3");
    let text = m.render();
    // The small closed sets start at zero; the others appear with their first sample (the
    // client library leaves out a family without one).
    for family in [
        "agent_upgrades",
        "reconcile_errors",
        "node_watch_restarts",
        "build",
    ] {
        assert!(
            text.contains(&format!("# HELP aks_flex_node_{family} ")),
            "{family} missing:\n{text}"
        );
    }
    assert_eq!(lines(&m, "aks_flex_node_reconcile_errors_total{").len(), 4);
    assert_eq!(
        lines(&m, "aks_flex_node_node_watch_restarts_total{").len(),
        3
    );
    assert_eq!(
        lines(&m, "aks_flex_node_agent_upgrades_total{")
            .iter()
            .filter(|l| l.ends_with(" 0"))
            .count(),
        3
    );
    for family in ["operations", "repaves", "active_machine"] {
        assert!(
            !text.contains(&format!("# HELP aks_flex_node_{family} ")),
            "{family} before anything happened:\n{text}"
        );
    }
    assert!(
        text.contains("aks_flex_node_build_info{version=\"1.2.3\"} 1\n"),
        "{text}"
    );
    // No certificate known: the family has no sample (an alert on it cannot fire on a 0).
    assert!(
        lines(
            &m,
            "aks_flex_node_client_certificate_expiration_timestamp_seconds{"
        )
        .is_empty()
    );
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn operations_are_counted_by_kind_phase_and_reason_from_closed_sets() {
    let m = DaemonMetrics::new("1");
    let cases = [
        (
            OperationKind::NodeReboot,
            OperationResult::complete("ok"),
            "kind=\"NodeReboot\",phase=\"Complete\",reason=\"Succeeded\"",
        ),
        (
            OperationKind::AgentReset,
            OperationResult::failed(flex_api::operations::EXECUTION_FAILED, "no"),
            "kind=\"AgentReset\",phase=\"Failed\",reason=\"ExecutionFailed\"",
        ),
        (
            OperationKind::Unknown("Evil\",x=\"1".into()),
            OperationResult::failed(flex_api::operations::UNKNOWN_KIND, "?"),
            "kind=\"Other\",phase=\"Failed\",reason=\"UnknownKind\"",
        ),
        (
            OperationKind::HostReboot,
            OperationResult::failed("Node\nprovided reason", "?"),
            "kind=\"Other\",phase=\"Failed\",reason=\"Other\"",
        ),
    ];
    for (kind, result, _) in &cases {
        m.operation_finished(kind, result, Some(Duration::from_secs(42)));
    }
    let got = lines(&m, "aks_flex_node_operations_total{");
    for (_, _, want) in &cases {
        assert!(
            got.contains(&format!("aks_flex_node_operations_total{{{want}}} 1")),
            "{want} not in {got:#?}"
        );
    }
    let text = m.render();
    assert!(
        !text.contains("Evil") && !text.contains("provided"),
        "{text}"
    );
    assert!(
        text.contains(
            "aks_flex_node_operation_duration_seconds_bucket{le=\"60.0\",kind=\"NodeReboot\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "aks_flex_node_operation_duration_seconds_bucket{le=\"30.0\",kind=\"NodeReboot\"} 0"
        ),
        "{text}"
    );
    // Not an upgrade: no upgrade counted.
    assert!(
        lines(&m, "aks_flex_node_agent_upgrades_total{")
            .iter()
            .all(|l| l.ends_with(" 0"))
    );
}

#[test]
fn an_upgrade_that_failed_because_its_candidate_was_rolled_back_says_so() {
    let m = DaemonMetrics::new("1");
    m.operation_finished(
        &OperationKind::AgentUpgrade,
        &OperationResult::complete("upgraded"),
        None,
    );
    m.operation_finished(
        &OperationKind::AgentUpgrade,
        &OperationResult::failed(flex_api::upgrade::DAEMON_FAILED, "exited 1"),
        None,
    );
    m.operation_finished(
        &OperationKind::AgentUpgrade,
        &OperationResult::failed(flex_api::operations::INVALID_PARAMETERS, "bad image"),
        None,
    );
    let got = lines(&m, "aks_flex_node_agent_upgrades_total{");
    assert_eq!(
        got,
        [
            "aks_flex_node_agent_upgrades_total{result=\"Complete\",rolled_back=\"false\"} 1",
            "aks_flex_node_agent_upgrades_total{result=\"Failed\",rolled_back=\"false\"} 1",
            "aks_flex_node_agent_upgrades_total{result=\"Failed\",rolled_back=\"true\"} 1",
        ]
    );
    // Without a start time there is no duration to observe.
    assert!(
        lines(&m, "aks_flex_node_operation_duration_seconds_count{").is_empty(),
        "{}",
        m.render()
    );
}

#[test]
fn repaves_are_counted_by_result_and_the_phase_they_ended_in() {
    let m = DaemonMetrics::new("1");
    let failure = || SeamError::transient(anyhow::anyhow!("x"));
    let cases: Vec<(Result<(), RepaveError>, &str)> = vec![
        (Ok(()), "result=\"Succeeded\",phase=\"done\""),
        (
            Err(RepaveError::RolledBack {
                step: "start kube2".into(),
                phase: Phase::Starting,
                source_machine: "kube1".into(),
                error: failure(),
            }),
            "result=\"RolledBack\",phase=\"starting\"",
        ),
        (
            Err(RepaveError::RollbackFailed {
                step: "stop kube1".into(),
                phase: Phase::Switching,
                source_machine: "kube1".into(),
                error: failure(),
                rollback: failure(),
            }),
            "result=\"RollbackFailed\",phase=\"switching\"",
        ),
        (
            Err(RepaveError::AfterSwitch {
                step: "cleanup kube1".into(),
                phase: Phase::Cleaning,
                target: "kube2".into(),
                error: failure(),
            }),
            "result=\"AfterSwitch\",phase=\"cleaning\"",
        ),
        (
            Err(RepaveError::JournalRecoveryFailed {
                keep: "kube1".into(),
                error: failure(),
            }),
            "result=\"Error\",phase=\"unknown\"",
        ),
    ];
    for (outcome, _) in &cases {
        m.repave_finished(outcome, Duration::from_secs(90));
    }
    let got = lines(&m, "aks_flex_node_repaves_total{");
    for (_, want) in &cases {
        assert!(
            got.contains(&format!("aks_flex_node_repaves_total{{{want}}} 1")),
            "{want} not in {got:#?}"
        );
    }
    assert!(
        m.render()
            .contains("aks_flex_node_repave_duration_seconds_sum{result=\"Succeeded\"} 90.0"),
        "{}",
        m.render()
    );
}

#[test]
fn gauges_follow_the_active_side_and_the_certificate_read_at_each_scrape() {
    let m = DaemonMetrics::new("1");
    m.active_machine("kube2");
    assert_eq!(
        lines(&m, "aks_flex_node_active_machine{"),
        [
            "aks_flex_node_active_machine{machine=\"kube1\"} 0",
            "aks_flex_node_active_machine{machine=\"kube2\"} 1"
        ]
    );
    m.active_machine("");
    assert_eq!(
        lines(&m, "aks_flex_node_active_machine{"),
        [
            "aks_flex_node_active_machine{machine=\"kube1\"} 0",
            "aks_flex_node_active_machine{machine=\"kube2\"} 0"
        ]
    );
    let not_after = Arc::new(std::sync::atomic::AtomicI64::new(1_800_000_000));
    let read = not_after.clone();
    m.certificate_from(move || Some(read.load(std::sync::atomic::Ordering::SeqCst)));
    let name = "aks_flex_node_client_certificate_expiration_timestamp_seconds";
    assert_eq!(
        lines(&m, &format!("{name}{{")),
        [format!("{name}{{certificate=\"daemon\"}} 1800000000")]
    );
    // A rotation moves it at the next scrape.
    not_after.store(1_802_592_000, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        lines(&m, &format!("{name}{{")),
        [format!("{name}{{certificate=\"daemon\"}} 1802592000")]
    );
}

#[test]
fn errors_and_watch_restarts_are_counted_by_class_and_reason() {
    let m = DaemonMetrics::new("1");
    m.reconcile_error(ItemKind::repave, false);
    m.reconcile_error(ItemKind::repave, false);
    m.reconcile_error(ItemKind::operation, true);
    m.node_watch_restarted(WatchRestart::credentials);
    let got = lines(&m, "aks_flex_node_reconcile_errors_total{");
    assert_eq!(
        got,
        [
            "aks_flex_node_reconcile_errors_total{item=\"operation\",class=\"permanent\"} 1",
            "aks_flex_node_reconcile_errors_total{item=\"operation\",class=\"transient\"} 0",
            "aks_flex_node_reconcile_errors_total{item=\"repave\",class=\"permanent\"} 0",
            "aks_flex_node_reconcile_errors_total{item=\"repave\",class=\"transient\"} 2",
        ]
    );
    let got = lines(&m, "aks_flex_node_node_watch_restarts_total{");
    assert_eq!(
        got,
        [
            "aks_flex_node_node_watch_restarts_total{reason=\"credentials\"} 1",
            "aks_flex_node_node_watch_restarts_total{reason=\"ended\"} 0",
            "aks_flex_node_node_watch_restarts_total{reason=\"error\"} 0",
        ]
    );
}

/// Real: the endpoint on a loopback port from the config, scraped over TCP.
#[tokio::test]
async fn the_daemon_serves_its_metrics_on_the_configured_address() {
    let mut config = crate::config::Config::default();
    config.agent.metrics_address = "127.0.0.1:0".into();
    let m = Arc::new(DaemonMetrics::new("9.9.9"));
    m.reconcile_error(ItemKind::repave, true);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let addr = serve(&config, &m, shutdown.clone()).await.expect("bound");
    assert!(addr.ip().is_loopback());
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = String::new();
    s.read_to_string(&mut got).await.unwrap();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(
        got.contains("aks_flex_node_build_info{version=\"9.9.9\"} 1"),
        "{got}"
    );
    assert!(
        got.contains("aks_flex_node_reconcile_errors_total{item=\"repave\",class=\"permanent\"} 1"),
        "{got}"
    );
    shutdown.cancel();

    config.agent.metrics_address = "0".into();
    assert_eq!(
        serve(&config, &m, tokio_util::sync::CancellationToken::new()).await,
        None
    );
}

/// `local_operations_total` is what its source says at each scrape (the tally file, read
/// anew), a counter family with the closed labels; without a source it has no series.
#[test]
fn local_operations_are_read_from_their_source_at_each_scrape() {
    let m = DaemonMetrics::new("1.2.3");
    assert!(lines(&m, "aks_flex_node_local_operations_total{").is_empty());
    assert!(
        m.render()
            .contains("# TYPE aks_flex_node_local_operations counter\n"),
        "{}",
        m.render()
    );
    let count = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let c = count.clone();
    m.local_operations_from(move || {
        vec![(
            OperationSeries {
                kind: Kind::NodeReboot,
                phase: Outcome::Complete,
                reason: Reason::Succeeded,
            },
            c.load(std::sync::atomic::Ordering::SeqCst),
        )]
    });
    assert_eq!(
        lines(&m, "aks_flex_node_local_operations_total{"),
        vec![
            "aks_flex_node_local_operations_total{kind=\"NodeReboot\",phase=\"Complete\",reason=\"Succeeded\"} 1"
        ]
    );
    count.store(3, std::sync::atomic::Ordering::SeqCst);
    assert!(
        lines(&m, "aks_flex_node_local_operations_total{")[0].ends_with(" 3"),
        "read again at the next scrape"
    );
}
