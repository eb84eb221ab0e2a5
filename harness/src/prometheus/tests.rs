//! The Prometheus module's tests: its config and API answers (pure), and a real Debian
//! Prometheus scraping the daemon's and the controller's real endpoints.

use super::*;

#[test]
fn the_config_scrapes_each_target_every_second() {
    let c = render_config(&[
        Target {
            job: "daemon".into(),
            address: "127.0.0.1:40001".into(),
        },
        Target {
            job: "controller".into(),
            address: "127.0.0.1:40002".into(),
        },
    ]);
    assert_eq!(
        c,
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: \"daemon\"\n    static_configs:\n      - targets: [\"127.0.0.1:40001\"]\n  - job_name: \"controller\"\n    static_configs:\n      - targets: [\"127.0.0.1:40002\"]\n"
    );
}

#[test]
fn an_instant_vector_parses_and_an_error_names_prometheus_words() {
    let s = parse_query(
        r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"up","job":"daemon"},"value":[1765000000.123,"1"]}]}}"#,
    )
    .unwrap();
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].labels["job"], "daemon");
    assert_eq!(s[0].value, 1.0);
    assert_eq!(render_samples(&s), "{job=\"daemon\"} 1");
    let e =
        parse_query(r#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#)
            .unwrap_err()
            .to_string();
    assert!(e.contains("parse error at char 3"), "{e}");
    assert!(parse_query("<html>").is_err());
    let e = parse_query(r#"{"status":"success","data":{"resultType":"scalar","result":[]}}"#);
    assert!(e.is_err());
}

/// A store with no machines (the one fake here, at the controller's store trait).
struct NoMachines;

#[async_trait::async_trait]
impl aks_flex_controller::store::MachineStore for NoMachines {
    async fn get(
        &self,
        name: &str,
    ) -> Result<flex_api::arm::ArmMachine, aks_flex_controller::store::StoreError> {
        Err(aks_flex_controller::store::StoreError::NotFound(
            name.into(),
        ))
    }
}

fn value(s: &[Sample]) -> f64 {
    s.iter().fold(0.0, |a, s| a + s.value)
}

/// Real: Debian's `prometheus` (started and stopped as the checks do), the daemon's metrics
/// registry and the controller's, each on its own `flex-metrics` endpoint on loopback as the
/// daemon and the controller serve them, and the controller's HTTP server answering real
/// requests. Faked: the controller's machine store (no machines). The daemon's counters are
/// moved by calling its metrics (its flows' tests show who calls them). Prometheus must parse
/// both expositions and its API must show the counters moving.
#[tokio::test]
async fn real_prometheus_scrapes_the_daemon_and_the_controller() {
    use aks_flex_node::flows::metrics::{DaemonMetrics, Kind, OperationSeries, Outcome, Reason};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let r = flex_host::runner::ProcessRunner::new();
    if r.which("prometheus").is_none() {
        panic!("prometheus is not installed (CI installs it: apt-get install prometheus)");
    }
    let shutdown = tokio_util::sync::CancellationToken::new();
    // The daemon's registry with a node-local tally that grows.
    let daemon = Arc::new(DaemonMetrics::new("9.9.9-test"));
    let reboots = Arc::new(AtomicU64::new(0));
    let seen = reboots.clone();
    daemon.local_operations_from(move || {
        vec![(
            OperationSeries {
                kind: Kind::NodeReboot,
                phase: Outcome::Complete,
                reason: Reason::Succeeded,
            },
            seen.load(Ordering::SeqCst),
        )]
    });
    let listen = flex_metrics::parse_address("127.0.0.1:0").unwrap();
    let daemon_at = flex_metrics::spawn(
        "daemon",
        &listen,
        daemon.renderer(),
        flex_metrics::Limits::default(),
        shutdown.clone(),
    )
    .await
    .unwrap();
    // The controller: its server over an empty store, its metrics on their own endpoint.
    let metrics = Arc::new(aks_flex_controller::metrics::ControllerMetrics::default());
    let controller_at = flex_metrics::spawn(
        "controller",
        &listen,
        metrics.renderer(),
        flex_metrics::Limits::default(),
        shutdown.clone(),
    )
    .await
    .unwrap();
    let server = aks_flex_controller::server::Server::bind("127.0.0.1:0")
        .await
        .unwrap();
    let api = server.local_addr().unwrap();
    let args = <aks_flex_controller::cli::Args as clap::Parser>::try_parse_from([
        "aks-flex-controller",
        "--enable-csr-approver=false",
    ])
    .unwrap();
    let store: Arc<dyn aks_flex_controller::store::MachineStore> = Arc::new(NoMachines);
    let stop = shutdown.clone();
    let m = metrics.clone();
    let controller = tokio::spawn(async move {
        aks_flex_controller::cli::run_with(&args, server, store, None, m, stop).await
    });

    let d = tempfile::tempdir().unwrap();
    let p = start(
        &r,
        d.path(),
        vec![
            Target {
                job: "daemon".into(),
                address: daemon_at.to_string(),
            },
            Target {
                job: "controller".into(),
                address: controller_at.to_string(),
            },
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(Prometheus::load(d.path()).unwrap().as_ref(), Some(&p));
    let t = Duration::from_secs(60);
    let result = async {
        p.wait_for("both targets up", "up == 1", t, |s| s.len() == 2)
            .await?;
        p.wait_for(
            "the daemon's build info",
            "aks_flex_node_build_info{version=\"9.9.9-test\"}",
            t,
            |s| value(s) == 1.0,
        )
        .await?;
        let q = "aks_flex_node_local_operations_total{kind=\"NodeReboot\",phase=\"Complete\"}";
        p.wait_for("the tally at 0", q, t, |s| value(s) == 0.0)
            .await?;
        reboots.store(2, Ordering::SeqCst);
        p.wait_for("the tally at 2", q, t, |s| value(s) == 2.0)
            .await?;
        // Two requests for a machine the store does not have: 404s, counted by route.
        for _ in 0..2 {
            let a = reqwest::get(format!("http://{api}/machines/node-a"))
                .await?
                .status();
            anyhow::ensure!(a.as_u16() == 404, "GET /machines/node-a: {a}");
        }
        p.wait_for(
            "the controller's 404s",
            "aks_flex_controller_http_requests_total{route=\"machine\",code=\"404\"}",
            t,
            |s| value(s) == 2.0,
        )
        .await?;
        anyhow::Ok(())
    }
    .await;
    let log = crate::vm::tail(&p.log(), 30);
    stop_dir(&r, d.path()).await.unwrap();
    assert!(Prometheus::load(d.path()).unwrap().is_none());
    shutdown.cancel();
    let _ = controller.await;
    if let Err(e) = result {
        panic!("{e:#}\nPrometheus' log:\n{log}");
    }
}
