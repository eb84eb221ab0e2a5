//! The Node watch: this node's `Node` only (field selector `metadata.name=<node>`); every
//! change, deletion and completed (re)list queues a `node-change` repave. Watch failures are
//! logged with their cause and retried with kube's backoff; a certificate rotation restarts
//! the watch with the new client.

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use tokio_util::sync::CancellationToken;

use super::queue::{Item, QueueSender, RepaveSource};
use crate::flows::metrics::{DaemonMetrics, WatchRestart};
use crate::kubeclient::{KubeClients, describe};

/// The field selector for `node`.
pub fn node_selector(node: &str) -> String {
    format!("metadata.name={node}")
}

/// A watch failure, naming the API server's answer.
pub fn watch_error(e: &watcher::Error) -> String {
    match e {
        watcher::Error::InitialListFailed(k) => format!("list: {}", describe(k)),
        watcher::Error::WatchStartFailed(k) => format!("start watch: {}", describe(k)),
        watcher::Error::WatchFailed(k) => format!("watch: {}", describe(k)),
        watcher::Error::WatchError(s) => format!(
            "watch: API server answered {} {}: {}",
            s.code, s.reason, s.message
        ),
        other => other.to_string(),
    }
}

/// Watches `node` until `shutdown`, queueing `node-change` repaves.
pub async fn watch_node(
    mut clients: KubeClients,
    node: String,
    queue: QueueSender,
    shutdown: CancellationToken,
    metrics: std::sync::Arc<DaemonMetrics>,
) {
    let config = watcher::Config::default().fields(&node_selector(&node));
    loop {
        let api: Api<Node> = Api::all(clients.current());
        let stream = watcher::watcher(api, config.clone()).default_backoff();
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = clients.changed() => {
                    tracing::info!(node = %node, "daemon client credentials changed; restarting the node watch");
                    metrics.node_watch_restarted(WatchRestart::credentials);
                    break;
                }
                event = stream.next() => match event {
                    Some(Ok(Event::Apply(_) | Event::Delete(_) | Event::InitDone)) => {
                        if !queue.send(Item::Repave { source: RepaveSource::NodeChange }) {
                            return;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        metrics.node_watch_restarted(WatchRestart::error);
                        tracing::warn!(
                            node = %node,
                            error = %watch_error(&e),
                            "node watch failed; retrying with backoff"
                        );
                    }
                    None => {
                        tracing::warn!(node = %node, "node watch ended; restarting it");
                        metrics.node_watch_restarted(WatchRestart::ended);
                        break;
                    }
                }
            }
        }
    }
}
