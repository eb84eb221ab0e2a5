//! The daemon's Prometheus metrics (`docs/metrics.md` lists them with their meaning), served
//! on `agent.metricsAddress` by [`flex_metrics`].
//!
//! Every label value comes from a closed set (the enums here): an operation's kind outside the
//! agent's three is `Other`, a reason outside the known ones `Other`. Nothing a node, an
//! operation or a goal names (node names, operation names, versions from the cluster) becomes a
//! label, so the number of series is fixed by this file. The one free string is the agent's
//! own build version, in the info metric.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flex_api::machina::{OperationKind, OperationPhase};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use super::repave::{Phase, RepaveError};
use flex_api::operations::OperationResult;

/// The prefix of every metric the daemon serves.
pub const PREFIX: &str = "aks_flex_node";

/// The daemon's default metrics address: loopback only.
pub const DEFAULT_ADDRESS: &str = crate::config::DEFAULT_METRICS_ADDRESS;

/// An operation's kind, as a label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelValue)]
pub enum Kind {
    /// `NodeReboot`.
    NodeReboot,
    /// `AgentUpgrade`.
    AgentUpgrade,
    /// `AgentReset`.
    AgentReset,
    /// Any other kind (the host controllers', unknown ones).
    Other,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 4] = [
        Kind::NodeReboot,
        Kind::AgentUpgrade,
        Kind::AgentReset,
        Kind::Other,
    ];
}

impl From<&OperationKind> for Kind {
    fn from(k: &OperationKind) -> Self {
        match k {
            OperationKind::NodeReboot => Kind::NodeReboot,
            OperationKind::AgentUpgrade => Kind::AgentUpgrade,
            OperationKind::AgentReset => Kind::AgentReset,
            _ => Kind::Other,
        }
    }
}

/// How an operation ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelValue)]
pub enum Outcome {
    /// `Complete`.
    Complete,
    /// `Failed`.
    Failed,
}

/// Why an operation ended (its status `reason`), closed.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelValue)]
pub enum Reason {
    /// `Succeeded`.
    Succeeded,
    /// `ExecutionFailed`.
    ExecutionFailed,
    /// `InvalidParameters`.
    InvalidParameters,
    /// `UnsupportedOperation`.
    UnsupportedOperation,
    /// `UnknownKind`.
    UnknownKind,
    /// `Interrupted`.
    Interrupted,
    /// `DaemonFailed` (an upgraded agent that failed and was rolled back).
    DaemonFailed,
    /// Any other reason.
    Other,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 8] = [
        Reason::Succeeded,
        Reason::ExecutionFailed,
        Reason::InvalidParameters,
        Reason::UnsupportedOperation,
        Reason::UnknownKind,
        Reason::Interrupted,
        Reason::DaemonFailed,
        Reason::Other,
    ];

    fn of(reason: &str) -> Self {
        use flex_api::operations as o;
        match reason {
            o::SUCCEEDED => Reason::Succeeded,
            o::EXECUTION_FAILED => Reason::ExecutionFailed,
            o::INVALID_PARAMETERS => Reason::InvalidParameters,
            o::UNSUPPORTED_OPERATION => Reason::UnsupportedOperation,
            o::UNKNOWN_KIND => Reason::UnknownKind,
            o::INTERRUPTED => Reason::Interrupted,
            flex_api::upgrade::DAEMON_FAILED => Reason::DaemonFailed,
            _ => Reason::Other,
        }
    }
}

/// One series of an operations counter: an operation's kind, how it ended and why, each from
/// its closed set. It is also the key of the node-local tally ([`Self::key`], [`Self::parse`]),
/// so a tally file can only ever name series of these sets.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct OperationSeries {
    /// The operation's kind.
    pub kind: Kind,
    /// Complete or Failed.
    pub phase: Outcome,
    /// The status reason.
    pub reason: Reason,
}

impl OperationSeries {
    /// The series of `kind` finished with `result`.
    pub fn of(kind: &OperationKind, result: &OperationResult) -> Self {
        Self {
            kind: Kind::from(kind),
            phase: match result.phase {
                OperationPhase::Complete => Outcome::Complete,
                _ => Outcome::Failed,
            },
            reason: Reason::of(&result.reason),
        }
    }

    /// `kind/phase/reason`, the label values joined.
    pub fn key(&self) -> String {
        format!("{:?}/{:?}/{:?}", self.kind, self.phase, self.reason)
    }

    /// The series `key` names; `None` unless each part is one of its set's values.
    pub fn parse(key: &str) -> Option<Self> {
        fn one<T: Copy + std::fmt::Debug>(all: &[T], s: &str) -> Option<T> {
            all.iter().copied().find(|v| format!("{v:?}") == s)
        }
        let mut parts = key.split('/');
        let series = Self {
            kind: one(&Kind::ALL, parts.next()?)?,
            phase: one(&[Outcome::Complete, Outcome::Failed], parts.next()?)?,
            reason: one(&Reason::ALL, parts.next()?)?,
        };
        parts.next().is_none().then_some(series)
    }
}

type OperationLabels = OperationSeries;

/// Where the node-local tally is read from at each scrape.
type LocalSource = Box<dyn Fn() -> Vec<(OperationSeries, u64)> + Send + Sync>;

/// `local_operations_total`: the node-local tally, read at each scrape (its source is set once
/// the host is known, [`DaemonMetrics::local_operations_from`]).
#[derive(Default)]
struct LocalOperations {
    source: Mutex<Option<LocalSource>>,
}

impl std::fmt::Debug for LocalOperations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LocalOperations")
    }
}

impl prometheus_client::collector::Collector for LocalOperations {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        let mut series = match self.source.lock() {
            Ok(s) => s.as_ref().map(|f| f()).unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        series.sort();
        let mut family = encoder.encode_descriptor(
            "local_operations",
            "Node-local operations (aks-flex-node operation run) finished on this node, by kind, phase and reason; kept on disk across daemon restarts, cleared by a reset",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (labels, count) in &series {
            ConstCounter::new(*count).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: Kind,
}

/// How a repave ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum RepaveResult {
    /// The node runs the goal on the other side.
    Succeeded,
    /// A step failed before the switch; the old side runs again.
    RolledBack,
    /// A step failed before the switch and the rollback failed too.
    RollbackFailed,
    /// A step after the switch failed; the next attempt resumes it.
    AfterSwitch,
    /// The journal or the state could not be read or written; nothing was switched.
    Error,
}

/// A repave phase, as a label (`Done` for a repave that finished).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum RepavePhase {
    /// Provisioning the target.
    preparing,
    /// Stopping the old side.
    switching,
    /// Starting the target.
    starting,
    /// Saving the daemon state.
    saving,
    /// Removing the old side.
    cleaning,
    /// Finished.
    done,
    /// Not known (the journal could not be read).
    unknown,
}

impl From<Phase> for RepavePhase {
    fn from(p: Phase) -> Self {
        match p {
            Phase::Preparing => RepavePhase::preparing,
            Phase::Switching => RepavePhase::switching,
            Phase::Starting => RepavePhase::starting,
            Phase::Saving => RepavePhase::saving,
            Phase::Cleaning => RepavePhase::cleaning,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RepaveLabels {
    result: RepaveResult,
    phase: RepavePhase,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RepaveResultLabels {
    result: RepaveResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpgradeLabels {
    result: Outcome,
    rolled_back: bool,
}

/// What a failed queue item was.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ItemKind {
    /// A repave reconcile (the machine goal).
    repave,
    /// A MachineOperation reconcile.
    operation,
}

/// Whether retrying can mend a failure.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ErrorClass {
    /// Retried with backoff.
    transient,
    /// Not retried until the item changes or comes round.
    permanent,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    item: ItemKind,
    class: ErrorClass,
}

/// Why the Node watch restarted.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum WatchRestart {
    /// The watch failed (it is retried with backoff).
    error,
    /// The stream ended.
    ended,
    /// The daemon's client certificate rotated.
    credentials,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabels {
    reason: WatchRestart,
}

/// A machine side, as a label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Side {
    /// `kube1`.
    kube1,
    /// `kube2`.
    kube2,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SideLabels {
    machine: Side,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertLabels {
    certificate: CertName,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
enum CertName {
    daemon,
}

/// Buckets for operation and repave durations, in seconds: a reboot takes tens of seconds, a
/// repave minutes, an upgrade up to its proof deadline.
const DURATION_BUCKETS: [f64; 11] = [
    1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0,
];

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// What reads the certificate's `notAfter` at each scrape.
type NotAfter = Box<dyn Fn() -> Option<i64> + Send + Sync>;

/// The daemon's metrics. Cheap to share (`Arc`); every method only counts.
pub struct DaemonMetrics {
    registry: Registry,
    operations: Family<OperationLabels, Counter>,
    operation_seconds: flex_metrics::HistogramFamily<KindLabels>,
    repaves: Family<RepaveLabels, Counter>,
    repave_seconds: flex_metrics::HistogramFamily<RepaveResultLabels>,
    upgrades: Family<UpgradeLabels, Counter>,
    reconcile_errors: Family<ErrorLabels, Counter>,
    watch_restarts: Family<WatchLabels, Counter>,
    cert_not_after: Family<CertLabels, Gauge>,
    active_machine: Family<SideLabels, Gauge>,
    not_after: Mutex<Option<NotAfter>>,
    local: Arc<LocalOperations>,
}

impl Default for DaemonMetrics {
    fn default() -> Self {
        Self::new(crate::version::VERSION)
    }
}

impl DaemonMetrics {
    /// The daemon's metrics, registered, for the agent `version`.
    pub fn new(version: &str) -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let operations = Family::<OperationLabels, Counter>::default();
        registry.register(
            "operations",
            "MachineOperations this agent finished, by kind, phase (Complete, Failed) and reason",
            operations.clone(),
        );
        let operation_seconds = flex_metrics::histogram_family::<KindLabels>(duration_histogram);
        registry.register(
            "operation_duration_seconds",
            "Time from a MachineOperation's claim to its result, by kind",
            operation_seconds.clone(),
        );
        let repaves = Family::<RepaveLabels, Counter>::default();
        registry.register(
            "repaves",
            "Blue/green repaves (machine goal applies), by result and the phase they ended in",
            repaves.clone(),
        );
        let repave_seconds =
            flex_metrics::histogram_family::<RepaveResultLabels>(duration_histogram);
        registry.register(
            "repave_duration_seconds",
            "Time a repave took, by result",
            repave_seconds.clone(),
        );
        let upgrades = Family::<UpgradeLabels, Counter>::default();
        registry.register(
            "agent_upgrades",
            "AgentUpgrade operations this agent finished, by result and whether the candidate was rolled back",
            upgrades.clone(),
        );
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Failed daemon work items, by item (repave, operation) and class (transient: retried with backoff; permanent: not retried until it changes)",
            reconcile_errors.clone(),
        );
        let watch_restarts = Family::<WatchLabels, Counter>::default();
        registry.register(
            "node_watch_restarts",
            "Restarts of the daemon's watch of its own Node, by reason",
            watch_restarts.clone(),
        );
        let cert_not_after = Family::<CertLabels, Gauge>::default();
        registry.register(
            "client_certificate_expiration_timestamp_seconds",
            "notAfter of the daemon's own client certificate, Unix seconds (absent with the exec credential)",
            cert_not_after.clone(),
        );
        let local = Arc::new(LocalOperations::default());
        registry.register_collector(Box::new(local.clone()));
        let active_machine = Family::<SideLabels, Gauge>::default();
        registry.register(
            "active_machine",
            "1 for the machine side kubelet runs in, 0 for the other",
            active_machine.clone(),
        );
        registry.register(
            "build",
            "The running agent's version",
            Info::new(vec![("version".to_string(), version.to_string())]),
        );
        // The small closed sets start at zero, so a rate or an increase has a series from the
        // daemon's start (the client library leaves a family with no series out entirely).
        for item in [ItemKind::repave, ItemKind::operation] {
            for class in [ErrorClass::transient, ErrorClass::permanent] {
                drop(reconcile_errors.get_or_create(&ErrorLabels { item, class }));
            }
        }
        for reason in [
            WatchRestart::error,
            WatchRestart::ended,
            WatchRestart::credentials,
        ] {
            drop(watch_restarts.get_or_create(&WatchLabels { reason }));
        }
        for (result, rolled_back) in [
            (Outcome::Complete, false),
            (Outcome::Failed, false),
            (Outcome::Failed, true),
        ] {
            drop(upgrades.get_or_create(&UpgradeLabels {
                result,
                rolled_back,
            }));
        }
        Self {
            registry,
            operations,
            operation_seconds,
            repaves,
            repave_seconds,
            upgrades,
            reconcile_errors,
            watch_restarts,
            cert_not_after,
            active_machine,
            not_after: Mutex::new(None),
            local,
        }
    }

    /// A MachineOperation finished with `result` after `took` (when its start is known).
    pub fn operation_finished(
        &self,
        kind: &OperationKind,
        result: &OperationResult,
        took: Option<Duration>,
    ) {
        let series = OperationSeries::of(kind, result);
        let (kind, phase) = (series.kind, series.phase);
        self.operations.get_or_create(&series).inc();
        if let Some(t) = took {
            self.operation_seconds
                .get_or_create(&KindLabels { kind })
                .observe(t.as_secs_f64());
        }
        if kind == Kind::AgentUpgrade {
            self.upgrades
                .get_or_create(&UpgradeLabels {
                    result: phase,
                    rolled_back: result.reason == flex_api::upgrade::DAEMON_FAILED,
                })
                .inc();
        }
    }

    /// A repave ended (`Ok`: it finished) after `took`.
    pub fn repave_finished<T>(&self, outcome: &Result<T, RepaveError>, took: Duration) {
        let (result, phase) = match outcome {
            Ok(_) => (RepaveResult::Succeeded, RepavePhase::done),
            Err(RepaveError::RolledBack { phase, .. }) => {
                (RepaveResult::RolledBack, RepavePhase::from(*phase))
            }
            Err(RepaveError::RollbackFailed { phase, .. }) => {
                (RepaveResult::RollbackFailed, RepavePhase::from(*phase))
            }
            Err(RepaveError::AfterSwitch { phase, .. }) => {
                (RepaveResult::AfterSwitch, RepavePhase::from(*phase))
            }
            Err(_) => (RepaveResult::Error, RepavePhase::unknown),
        };
        self.repaves
            .get_or_create(&RepaveLabels { result, phase })
            .inc();
        self.repave_seconds
            .get_or_create(&RepaveResultLabels { result })
            .observe(took.as_secs_f64());
    }

    /// A daemon work item failed.
    pub fn reconcile_error(&self, item: ItemKind, permanent: bool) {
        let class = if permanent {
            ErrorClass::permanent
        } else {
            ErrorClass::transient
        };
        self.reconcile_errors
            .get_or_create(&ErrorLabels { item, class })
            .inc();
    }

    /// The Node watch restarted.
    pub fn node_watch_restarted(&self, reason: WatchRestart) {
        self.watch_restarts
            .get_or_create(&WatchLabels { reason })
            .inc();
    }

    /// The side kubelet runs in (`kube1`, `kube2`); anything else (no machine yet) sets both 0.
    pub fn active_machine(&self, name: &str) {
        for (side, label) in [
            (crate::state::KUBE1, Side::kube1),
            (crate::state::KUBE2, Side::kube2),
        ] {
            self.active_machine
                .get_or_create(&SideLabels { machine: label })
                .set(i64::from(name == side));
        }
    }

    /// Reads the daemon's certificate `notAfter` (Unix seconds) from `source` at each scrape.
    pub fn certificate_from(&self, source: impl Fn() -> Option<i64> + Send + Sync + 'static) {
        if let Ok(mut s) = self.not_after.lock() {
            *s = Some(Box::new(source));
        }
    }

    /// Reads the node-local operations tally from `source` at each scrape
    /// (`local_operations_total`; [`crate::flows::operations::tally`]).
    pub fn local_operations_from(
        &self,
        source: impl Fn() -> Vec<(OperationSeries, u64)> + Send + Sync + 'static,
    ) {
        if let Ok(mut s) = self.local.source.lock() {
            *s = Some(Box::new(source));
        }
    }

    /// The exposition, with the gauges that are read rather than pushed brought up to date.
    pub fn render(&self) -> String {
        let not_after = self
            .not_after
            .lock()
            .ok()
            .and_then(|s| s.as_ref().and_then(|f| f()));
        match not_after {
            Some(t) => {
                self.cert_not_after
                    .get_or_create(&CertLabels {
                        certificate: CertName::daemon,
                    })
                    .set(t);
            }
            None => self.cert_not_after.clear(),
        }
        flex_metrics::encode(&self.registry)
    }

    /// [`Self::render`] for the endpoint.
    pub fn renderer(self: &Arc<Self>) -> flex_metrics::Render {
        let me = self.clone();
        Arc::new(move || me.render())
    }
}

/// Serves `metrics` on `config`'s `agent.metricsAddress` until `shutdown` ([`flex_metrics::spawn`]:
/// an address that cannot be bound is a warning, never a failure). Returns the bound address.
pub async fn serve(
    config: &crate::config::Config,
    metrics: &Arc<DaemonMetrics>,
    shutdown: tokio_util::sync::CancellationToken,
) -> Option<std::net::SocketAddr> {
    let address = match config.agent.metrics_address.trim() {
        "" => DEFAULT_ADDRESS,
        a => a,
    };
    match flex_metrics::parse_address(address) {
        Ok(listen) => {
            flex_metrics::spawn(
                "daemon",
                &listen,
                metrics.renderer(),
                flex_metrics::Limits::default(),
                shutdown,
            )
            .await
        }
        Err(e) => {
            tracing::warn!(error = %format!("agent.metricsAddress: {e}"), "metrics endpoint not served");
            None
        }
    }
}

#[cfg(test)]
mod tests;
