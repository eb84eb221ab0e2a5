//! The controller's Prometheus metrics (`docs/metrics.md`), served on `--metrics-bind-address`
//! by [`flex_metrics`]: requests by route and status, the CSR approver's decisions by reason,
//! and the machine store's latency ([`TimedStore`], a decorator of any [`MachineStore`]).
//!
//! Label values come from closed sets: a route is one of the server's routes (never the machine
//! name), a status one of the codes the server answers, a CSR reason one of [`Why`].

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use flex_api::arm::ArmMachine;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::store::{MachineStore, StoreError};

/// The prefix of every metric the controller serves.
pub const PREFIX: &str = "aks_flex_controller";

/// A route, as a label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum RouteLabel {
    /// `/healthz`, `/readyz`.
    health,
    /// `/machines`.
    machines_root,
    /// `/machines/<name>`.
    machine,
    /// `/machines/<name>/status`.
    status,
    /// `/machines/...` that is not one name.
    invalid_name,
    /// Anything else.
    unknown,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: RouteLabel,
    code: u16,
}

/// What the approver did with a request.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum DecisionLabel {
    /// Approved (and the approval was written).
    approved,
    /// Left alone: not the approver's to approve.
    ignored,
    /// Looked at again later.
    retry,
    /// Approvable, but writing the approval failed.
    approve_failed,
}

/// Why, closed: what the approver checked last.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Why {
    /// A daemon's first certificate, with its node's bootstrap token.
    bootstrap,
    /// A daemon's renewal with its own certificate.
    renewal,
    /// kubelet's first client certificate, with its node's bootstrap token.
    kubelet_bootstrap,
    /// kubelet's client certificate asked for by its node itself (kubelet renewing, or the
    /// daemon).
    kubelet_renewal,
    /// Not a daemon request, already decided, or asking for more than a daemon credential.
    not_a_daemon_request,
    /// The bootstrap token is not one the approver accepts (group, expiry, usage).
    token_refused,
    /// The bootstrap token's Secret could not be read.
    token_unreadable,
    /// The token is not bound to the machine the request names.
    token_not_bound,
    /// No machine of that name is registered.
    machine_not_registered,
    /// The machine store could not be read.
    store_unavailable,
    /// The node's other requests could not be listed.
    list_failed,
    /// The node already holds a valid daemon certificate.
    already_holds_certificate,
    /// The bootstrap token already got a daemon certificate (a token is used once), or the
    /// record of tokens used could not be read.
    token_used,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    decision: DecisionLabel,
    reason: Why,
}

/// A machine store read's outcome.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum StoreResult {
    /// Read.
    found,
    /// No such machine.
    not_found,
    /// The store could not be read.
    unavailable,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    result: StoreResult,
}

/// Store latency buckets, seconds: a ConfigMap GET through the API server.
const STORE_BUCKETS: [f64; 10] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

fn store_histogram() -> Histogram {
    Histogram::new(STORE_BUCKETS)
}

/// The controller's metrics.
pub struct ControllerMetrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    decisions: Family<DecisionLabels, Counter>,
    store_seconds: flex_metrics::HistogramFamily<StoreLabels>,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        Self::new(env!("CARGO_PKG_VERSION"))
    }
}

impl ControllerMetrics {
    /// The controller's metrics, registered, for the controller `version`.
    pub fn new(version: &str) -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "Machine endpoint requests, by route and HTTP status code",
            requests.clone(),
        );
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "csr_decisions",
            "The CSR approver's decisions (one per look at a request), by decision and reason",
            decisions.clone(),
        );
        let store_seconds = flex_metrics::histogram_family::<StoreLabels>(store_histogram);
        registry.register(
            "machine_store_duration_seconds",
            "Time to read a machine from the store, by result",
            store_seconds.clone(),
        );
        registry.register(
            "build",
            "The running controller's version",
            Info::new(vec![("version".to_string(), version.to_string())]),
        );
        Self {
            registry,
            requests,
            decisions,
            store_seconds,
        }
    }

    /// A request to `route` was answered `code`.
    pub fn request(&self, route: RouteLabel, code: u16) {
        self.requests
            .get_or_create(&RequestLabels { route, code })
            .inc();
    }

    /// The approver decided.
    pub fn decision(&self, decision: DecisionLabel, reason: Why) {
        self.decisions
            .get_or_create(&DecisionLabels { decision, reason })
            .inc();
    }

    /// A store read ended with `result` after `seconds`.
    pub fn store_read(&self, result: StoreResult, seconds: f64) {
        self.store_seconds
            .get_or_create(&StoreLabels { result })
            .observe(seconds);
    }

    /// The exposition.
    pub fn render(&self) -> String {
        flex_metrics::encode(&self.registry)
    }

    /// [`Self::render`] for the endpoint.
    pub fn renderer(self: &Arc<Self>) -> flex_metrics::Render {
        let me = self.clone();
        Arc::new(move || me.render())
    }
}

/// A [`MachineStore`] whose reads are timed into [`ControllerMetrics`].
pub struct TimedStore {
    inner: Arc<dyn MachineStore>,
    metrics: Arc<ControllerMetrics>,
}

impl TimedStore {
    /// `inner`, timed into `metrics`.
    pub fn new(inner: Arc<dyn MachineStore>, metrics: Arc<ControllerMetrics>) -> Self {
        Self { inner, metrics }
    }
}

#[async_trait]
impl MachineStore for TimedStore {
    async fn get(&self, name: &str) -> Result<ArmMachine, StoreError> {
        let started = Instant::now();
        let got = self.inner.get(name).await;
        let result = match &got {
            Ok(_) => StoreResult::found,
            Err(StoreError::NotFound(_)) => StoreResult::not_found,
            Err(StoreError::Unavailable(_)) => StoreResult::unavailable,
        };
        self.metrics
            .store_read(result, started.elapsed().as_secs_f64());
        got
    }

    async fn record_status(&self, name: &str, body: &[u8]) {
        self.inner.record_status(name, body).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn lines(m: &ControllerMetrics, prefix: &str) -> Vec<String> {
        flex_metrics::samples(&m.render(), prefix)
    }

    #[test]
    fn requests_are_counted_by_route_and_code() {
        let m = ControllerMetrics::new("1");
        m.request(RouteLabel::machine, 200);
        m.request(RouteLabel::machine, 200);
        m.request(RouteLabel::status, 204);
        m.request(RouteLabel::unknown, 404);
        assert_eq!(
            lines(&m, "aks_flex_controller_http_requests_total{"),
            [
                "aks_flex_controller_http_requests_total{route=\"machine\",code=\"200\"} 2",
                "aks_flex_controller_http_requests_total{route=\"status\",code=\"204\"} 1",
                "aks_flex_controller_http_requests_total{route=\"unknown\",code=\"404\"} 1",
            ]
        );
        assert!(
            m.render()
                .contains("aks_flex_controller_build_info{version=\"1\"} 1")
        );
    }

    /// Real: [`TimedStore`] over the in-memory store (the store is the trait boundary).
    #[tokio::test]
    async fn store_reads_are_timed_by_result() {
        let m = Arc::new(ControllerMetrics::new("1"));
        let memory = Arc::new(MemoryStore::default());
        let store = TimedStore::new(memory.clone(), m.clone());
        assert!(store.get("missing").await.is_err());
        memory.fail_with(Some("config map gone"));
        assert!(store.get("any").await.is_err());
        let got = lines(
            &m,
            "aks_flex_controller_machine_store_duration_seconds_count{",
        );
        assert_eq!(
            got,
            [
                "aks_flex_controller_machine_store_duration_seconds_count{result=\"not_found\"} 1",
                "aks_flex_controller_machine_store_duration_seconds_count{result=\"unavailable\"} 1",
            ]
        );
    }
}
