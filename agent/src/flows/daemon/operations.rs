//! MachineOperations from the cluster, as the daemon runs them: [`ClusterOperations`] (the
//! [`Operations`] hook over [`crate::flows::operations::Reconciler`] and
//! [`crate::flows::operations::watch_stream`]) and the API discovery guard that decides, once at start,
//! whether the daemon has a MachineOperation reconciler at all (upstream's
//! `machineoperation_reconciler.go` construction).
//!
//! # The guard
//!
//! [`guard`] is the pure part, table-tested; [`enabled`] asks the API server and logs:
//!
//! | `agent.machineOperationMode` | discovery of `unbounded-cloud.io/v1alpha3` | decision |
//! |---|---|---|
//! | `disable` | not asked | no reconciler (debug log) |
//! | `auto` or empty | serves `machineoperations` | reconciler ("Machina MachineOperation API found; enabling machine operation reconciler") |
//! | `auto` or empty | 404, or the group version does not serve it | no reconciler ("Machina MachineOperation API not found; machine operations disabled") |
//! | `auto` or empty | the API server cannot be reached (transport, credential plugin) | retried with backoff, as the client build is |
//! | `auto` or empty | any other answer (403, 500, ...) | the daemon fails at start: `discover Machina MachineOperation API: <cause>` |
//! | anything else | not asked | the daemon fails at start (config validation refuses it first) |
//!
//! # The reconciler
//!
//! [`ClusterOperations::watch`] feeds the names [`crate::flows::operations::watch_stream`] yields into
//! the daemon's queue until shutdown; stream errors are logged and the stream goes on (it backs
//! off itself), and a certificate rotation restarts it with the new client.
//! [`ClusterOperations::reconcile`] takes [`KubeClients::current`] per call and maps the
//! reconciler's [`crate::flows::operations::Outcome`]: `stop_daemon` → [`OperationOutcome::StopDaemon`]
//! (the daemon then uninstalls its service), a requeue → [`OperationOutcome::RequeueAfter`], else
//! [`OperationOutcome::Done`]. Errors go back to the queue, which retries with backoff.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;

use super::watch::watch_error;
use super::{OperationOutcome, Operations, QueueSender, until_reachable};
use crate::config::Config;
use crate::flows::operations::{
    Handlers, HostHandlers, ReconcileError, Reconciler, ReconcilerConfig, RecordStore, watch_stream,
};
use crate::flows::repave::{NodeOps, SeamError};
use crate::kubeclient::KubeClients;
use flex_host::context::Host;
use flex_host::retry::Attempt;

/// Logged when the reconciler is enabled.
pub const API_FOUND: &str =
    "Machina MachineOperation API found; enabling machine operation reconciler";
/// Logged when the API is not served.
pub const API_NOT_FOUND: &str =
    "Machina MachineOperation API not found; machine operations disabled";
/// The prefix of a failed discovery.
pub const DISCOVER_FAILED: &str = "discover Machina MachineOperation API";

pub use crate::kubeclient::{Discovery, discover};

/// What the daemon does about MachineOperations at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Guard {
    /// `disable`: no reconciler, discovery not asked.
    Disabled,
    /// Ask the API server ([`discover`]), then decide again with its answer.
    Discover,
    /// The API is not served: no reconciler.
    Absent,
    /// The API is served: run the reconciler.
    Enable,
    /// The API server cannot be reached yet: ask again after a backoff.
    Retry(String),
    /// The daemon fails at start with this message.
    Fail(String),
}

/// The guard for `agent.machineOperationMode` `mode` and what discovery found (`None`: not
/// asked yet). Pure; see the module's table.
pub fn guard(mode: &str, found: Option<&Discovery>) -> Guard {
    match (mode.trim(), found) {
        ("disable", _) => Guard::Disabled,
        ("auto" | "", None) => Guard::Discover,
        ("auto" | "", Some(Discovery::Served)) => Guard::Enable,
        ("auto" | "", Some(Discovery::Absent)) => Guard::Absent,
        ("auto" | "", Some(Discovery::Unreachable(cause))) => {
            Guard::Retry(format!("{DISCOVER_FAILED}: {cause}"))
        }
        ("auto" | "", Some(Discovery::Failed(cause))) => {
            Guard::Fail(format!("{DISCOVER_FAILED}: {cause}"))
        }
        (other, _) => Guard::Fail(format!(
            "agent.machineOperationMode {other:?} is not one of auto, disable"
        )),
    }
}

/// Whether the daemon runs a MachineOperation reconciler: [`guard`] for `mode`, asking the API
/// server through `kube`'s current client when it says so (retried with backoff while the API
/// server cannot be reached), with the decision logged. `Ok(None)`: `shutdown` came first.
pub async fn enabled(
    mode: &str,
    kube: &KubeClients,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<bool>> {
    let decided = match guard(mode, None) {
        Guard::Discover => {
            let attempt = || {
                let client = kube.current();
                async move {
                    match guard(mode, Some(&discover(&client).await)) {
                        Guard::Retry(why) => Err(Attempt::Retry {
                            error: anyhow::anyhow!(why),
                            after: None,
                        }),
                        g => Ok(g),
                    }
                }
            };
            match until_reachable(shutdown, attempt).await? {
                Some(g) => g,
                None => return Ok(None),
            }
        }
        g => g,
    };
    match decided {
        Guard::Disabled => {
            tracing::debug!("machine operations disabled (agent.machineOperationMode=disable)");
            Ok(Some(false))
        }
        Guard::Absent => {
            tracing::info!("{API_NOT_FOUND}");
            Ok(Some(false))
        }
        Guard::Enable => {
            tracing::info!("{API_FOUND}");
            // Once per start: whether anything but RBAC confines the daemons.
            if crate::kubeclient::admission_policies_served(&kube.current()).await == Some(false) {
                tracing::warn!("{}", crate::kubeclient::NO_ADMISSION_POLICIES);
            }
            Ok(Some(true))
        }
        Guard::Fail(why) | Guard::Retry(why) => Err(anyhow::anyhow!(why)),
        Guard::Discover => Err(anyhow::anyhow!("{DISCOVER_FAILED}: no answer")),
    }
}

/// The [`Operations`] hook over the cluster's MachineOperations.
pub struct ClusterOperations {
    kube: KubeClients,
    machine_name: String,
    reconciler: Reconciler,
}

impl ClusterOperations {
    /// Operations for `cfg`'s machine over `kube`, run through `handlers`.
    pub fn new(kube: KubeClients, cfg: ReconcilerConfig, handlers: Arc<dyn Handlers>) -> Self {
        Self {
            kube,
            machine_name: cfg.machine_name.clone(),
            reconciler: Reconciler::new(cfg, handlers),
        }
    }

    /// The same with a reconciler built by the caller (another clock, in tests).
    pub fn with_reconciler(kube: KubeClients, machine_name: &str, reconciler: Reconciler) -> Self {
        Self {
            kube,
            machine_name: machine_name.into(),
            reconciler,
        }
    }

    /// The daemon's operations on `host`: the machine is `agent.nodeName` (as upstream, the AKS
    /// machine name is the node name), the records live on `host`, and the handlers
    /// ([`HostHandlers`]) restart through `node` (the daemon's machine layer).
    pub fn for_host(
        kube: KubeClients,
        config: &Config,
        host: &Host,
        node: Arc<dyn NodeOps>,
        upgrader: crate::flows::upgrade::Upgrader,
        metrics: Arc<crate::flows::metrics::DaemonMetrics>,
    ) -> anyhow::Result<Self> {
        let name = config.agent.node_name.trim();
        if name.is_empty() {
            anyhow::bail!("machine operation reconciler: node name is empty (agent.nodeName)");
        }
        let cfg = ReconcilerConfig {
            machine_name: name.into(),
            node_name: name.into(),
            records: RecordStore::new(host.fs.clone()),
            containerized: host.containerized(),
            drain: config.agent.drain.policy(),
        };
        let handlers = Arc::new(HostHandlers::new(host.clone(), node).with_upgrader(upgrader));
        Ok(Self::with_reconciler(
            kube,
            name,
            Reconciler::new(cfg, handlers).with_metrics(metrics),
        ))
    }
}

/// A reconcile error in one line, the API server's answer named (its message uses
/// [`crate::kubeclient::describe`]).
fn reconcile_error(e: &ReconcileError) -> String {
    e.to_string()
}

#[async_trait]
impl Operations for ClusterOperations {
    async fn watch(&self, queue: QueueSender, shutdown: CancellationToken) -> anyhow::Result<()> {
        let mut clients = self.kube.clone();
        let machine = &self.machine_name;
        loop {
            let stream = watch_stream(clients.current(), machine.clone());
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = clients.changed() => {
                        tracing::info!("daemon client credentials changed; restarting the MachineOperation watch");
                        break;
                    }
                    next = stream.next() => match next {
                        Some(Ok(name)) => {
                            if !queue.operation(name) {
                                return Ok(());
                            }
                        }
                        Some(Err(e)) => tracing::warn!(
                            machine = %machine,
                            error = %watch_error(&e),
                            "MachineOperation watch failed; retrying with backoff"
                        ),
                        None => {
                            tracing::warn!(machine = %machine, "MachineOperation watch ended; restarting it");
                            break;
                        }
                    }
                }
            }
        }
    }

    async fn reconcile(&self, name: &str) -> Result<OperationOutcome, SeamError> {
        let out = self
            .reconciler
            .reconcile(self.kube.current(), name)
            .await
            .map_err(|e| {
                let message = anyhow::anyhow!("{}", reconcile_error(&e));
                if e.is_permanent() {
                    SeamError::permanent(message)
                } else {
                    SeamError::transient(message)
                }
            })?;
        Ok(if out.stop_daemon {
            OperationOutcome::StopDaemon
        } else if let Some(d) = out.requeue_after {
            OperationOutcome::RequeueAfter(d)
        } else {
            OperationOutcome::Done
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::{Value, json};

    use super::*;
    use crate::flows::daemon::queue::{DAEMON_BACKOFF, Item, WorkQueue};
    use crate::kubeclient::mock::{
        LogCapture, Reply, Seen, flex_api_resources as resources, seen, serve,
    };

    #[test]
    fn guard_table() {
        let served = Discovery::Served;
        let absent = Discovery::Absent;
        let down = Discovery::Unreachable("connection refused".into());
        let failed = Discovery::Failed("API server answered 500".into());
        let cases: Vec<(&str, Option<&Discovery>, Guard)> = vec![
            ("disable", None, Guard::Disabled),
            ("disable", Some(&served), Guard::Disabled),
            (" disable ", Some(&failed), Guard::Disabled),
            ("auto", None, Guard::Discover),
            ("", None, Guard::Discover),
            ("auto", Some(&served), Guard::Enable),
            ("", Some(&served), Guard::Enable),
            ("auto", Some(&absent), Guard::Absent),
            (
                "auto",
                Some(&down),
                Guard::Retry("discover Machina MachineOperation API: connection refused".into()),
            ),
            (
                "auto",
                Some(&failed),
                Guard::Fail(
                    "discover Machina MachineOperation API: API server answered 500".into(),
                ),
            ),
            (
                "manual",
                Some(&served),
                Guard::Fail(
                    "agent.machineOperationMode \"manual\" is not one of auto, disable".into(),
                ),
            ),
        ];
        for (mode, found, want) in cases {
            assert_eq!(guard(mode, found), want, "{mode:?} {found:?}");
        }
    }

    async fn enabled_with(
        mode: &str,
        reply: fn(&Seen) -> Reply,
    ) -> (anyhow::Result<Option<bool>>, usize, String) {
        let logs = LogCapture::start();
        let (client, log, _server) = serve(reply);
        let r = enabled(mode, &KubeClients::fixed(client), &CancellationToken::new()).await;
        (r, seen(&log).len(), logs.text())
    }

    /// Real: the guard, discovery and the decision's log lines. Faked: the API server.
    #[tokio::test]
    async fn the_guard_enables_skips_or_fails_the_daemon() {
        // The API found; the admission policies' API not served (an older cluster): a
        // warning, once.
        let (r, n, text) = enabled_with("auto", |s| {
            if s.path() == "/apis/admissionregistration.k8s.io/v1" {
                Reply::status(404, "NotFound", "not found")
            } else {
                Reply::Json(200, resources(&["machineoperations"]))
            }
        })
        .await;
        assert_eq!(r.unwrap(), Some(true));
        assert_eq!(n, 2, "the Flex API, then the admission API");
        assert!(text.contains(API_FOUND), "{text}");
        assert_eq!(
            text.matches(crate::kubeclient::NO_ADMISSION_POLICIES)
                .count(),
            1,
            "{text}"
        );
        // Both served: no warning.
        let (r, _, text) = enabled_with("auto", |_| {
            Reply::Json(
                200,
                resources(&["machineoperations", "validatingadmissionpolicies"]),
            )
        })
        .await;
        assert_eq!(r.unwrap(), Some(true));
        assert!(
            !text.contains(crate::kubeclient::NO_ADMISSION_POLICIES),
            "{text}"
        );

        let (r, _, text) = enabled_with("", |_| Reply::status(404, "NotFound", "not found")).await;
        assert_eq!(r.unwrap(), Some(false));
        assert!(text.contains(API_NOT_FOUND), "{text}");

        let (r, n, _) = enabled_with("auto", |_| {
            Reply::status(500, "InternalError", "etcdserver: request timed out")
        })
        .await;
        assert_eq!(
            r.unwrap_err().to_string(),
            "discover Machina MachineOperation API: API server answered 500 InternalError: etcdserver: request timed out"
        );
        assert_eq!(n, 1, "a 500 is not retried");

        let (r, n, text) = enabled_with("disable", |_| Reply::Hold).await;
        assert_eq!(r.unwrap(), Some(false));
        assert_eq!(n, 0, "disable never asks the API server");
        assert!(
            !text.contains(API_FOUND) && !text.contains(API_NOT_FOUND),
            "{text}"
        );
    }

    /// Real: the guard and its retry. Faked: an API server whose first connection fails, and the
    /// clock (paused).
    #[tokio::test(start_paused = true)]
    async fn an_unreachable_api_server_is_asked_again_after_a_backoff() {
        let logs = LogCapture::start();
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(async move {
            let mut times = Vec::new();
            for i in 0..2 {
                let Some((_req, send)) = handle.next_request().await else {
                    break;
                };
                times.push(tokio::time::Instant::now());
                if i == 0 {
                    send.send_error(std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        "connection refused",
                    ));
                } else {
                    let body = resources(&["machineoperations"]).to_string();
                    send.send_response(Response::new(Body::from(body.into_bytes())));
                }
            }
            times
        });
        let kube = KubeClients::fixed(kube::Client::new(svc, "default"));
        let r = enabled("auto", &kube, &CancellationToken::new()).await;
        assert_eq!(r.unwrap(), Some(true));
        let times = server.await.unwrap();
        assert!(times[1] - times[0] >= crate::flows::daemon::START_RETRY_BASE);
        let text = logs.text();
        assert!(
            text.contains("cannot reach the cluster yet; retrying"),
            "{text}"
        );
        assert!(text.contains("connection refused"), "{text}");

        // Shutdown ends the wait.
        let (client, _log, _server) = serve(|_| Reply::Hold);
        let token = CancellationToken::new();
        token.cancel();
        let r = enabled("auto", &KubeClients::fixed(client), &token).await;
        assert_eq!(r.unwrap(), None);
    }

    fn op_json(name: &str, machine: &str) -> Value {
        json!({
            "apiVersion": "unbounded-cloud.io/v1alpha3", "kind": "MachineOperation",
            "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "1"},
            "spec": {"machineRef": machine, "operationKind": "NodeReboot"}
        })
    }

    /// Real: the watch and `watch_stream`'s filter, feeding the daemon's queue. Faked: the API
    /// server (a list, then one watch event) and the rotation.
    #[tokio::test]
    async fn the_watch_queues_this_machines_operations_and_follows_a_rotation() {
        // The old server's first watch says one thing; every other watch has nothing to say.
        let route = |version: &'static str| {
            let mut watched = false;
            move |s: &Seen| {
                if s.path() != "/apis/unbounded-cloud.io/v1alpha3/machineoperations" {
                    return Reply::status(404, "NotFound", "no such route");
                }
                if s.is_watch() {
                    return if version == "old" && !std::mem::replace(&mut watched, true) {
                        Reply::events(&[("ADDED", op_json("op-added", "n1"))])
                    } else {
                        Reply::Hold
                    };
                }
                let items = if version == "old" {
                    vec![op_json("op-listed", "n1"), op_json("op-other", "n2")]
                } else {
                    vec![op_json("op-after-rotation", "n1")]
                };
                Reply::Json(
                    200,
                    json!({"apiVersion": "unbounded-cloud.io/v1alpha3", "kind": "MachineOperationList", "metadata": {"resourceVersion": "5"}, "items": items}),
                )
            }
        };
        let (old, _old_log, _s1) = serve(route("old"));
        let (new, new_log, _s2) = serve(route("new"));
        let (tx, rx) = tokio::sync::watch::channel(old);
        let cfg = ReconcilerConfig {
            machine_name: "n1".into(),
            node_name: "n1".into(),
            records: RecordStore::new(flex_host::fs::HostFs::new(std::path::Path::new(
                "/nonexistent",
            ))),
            containerized: false,
            drain: Default::default(),
        };
        let ops = Arc::new(ClusterOperations::with_reconciler(
            KubeClients::from_receiver(rx),
            "n1",
            Reconciler::new(
                cfg,
                Arc::new(crate::flows::operations::RecordingHandlers::new()),
            )
            .with_drain(
                crate::flows::drain::fakes::FakeNodeDrain::quiet("n1").factory(),
                Default::default(),
            ),
        ));
        let mut queue = WorkQueue::new(DAEMON_BACKOFF);
        let shutdown = CancellationToken::new();
        let watch = {
            let (ops, sender, token) = (ops.clone(), queue.sender(), shutdown.clone());
            tokio::spawn(async move { ops.watch(sender, token).await })
        };
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(10), queue.next(&shutdown))
                .await
                .expect("an item")
                .expect("not shut down")
        };
        assert_eq!(
            next().await,
            Item::Operation {
                name: "op-listed".into()
            }
        );
        assert_eq!(
            next().await,
            Item::Operation {
                name: "op-added".into()
            }
        );
        tx.send(new).unwrap();
        assert_eq!(
            next().await,
            Item::Operation {
                name: "op-after-rotation".into()
            }
        );
        assert!(!seen(&new_log).is_empty());
        shutdown.cancel();
        watch.await.unwrap().unwrap();
    }
}
