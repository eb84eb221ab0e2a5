//! The drain's progress on the node, for `aks-flex-node status`: [`Recorded`] wraps a
//! [`NodeDrainApi`] and, each time a drain step is told to the Node as an Event (cordoned,
//! evictions refused by a PodDisruptionBudget, waiting for a disruption slot, drained, timed out,
//! uncordoned), also saves it as the node's last drain step in [`PROGRESS_PATH`] (one atomic
//! file with its checksum inside, as every record). A save that fails is logged: progress is
//! for people, the drain does not depend on it.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;

use super::{DrainApiError, Eviction, NodeDrainApi, PodRef};
use crate::state::JsonStore;
use flex_api::status::DrainView;
use flex_host::fs::HostFs;

/// Where the last drain step is kept (reset removes it with the rest of `/etc/aks-flex-node`).
pub const PROGRESS_PATH: &str = "/etc/aks-flex-node/drain.json";

/// The store of the last drain step under `fs`.
pub fn store(fs: HostFs) -> JsonStore<DrainView> {
    JsonStore::at(fs, PROGRESS_PATH)
}

/// A [`NodeDrainApi`] that also records each step told to the Node.
pub struct Recorded {
    inner: Arc<dyn NodeDrainApi>,
    store: JsonStore<DrainView>,
}

impl Recorded {
    /// `inner`, recording into [`PROGRESS_PATH`] under `fs`.
    pub fn new(inner: Arc<dyn NodeDrainApi>, fs: HostFs) -> Self {
        Self {
            inner,
            store: store(fs),
        }
    }
}

#[async_trait]
impl NodeDrainApi for Recorded {
    async fn node(&self) -> Result<Option<Node>, DrainApiError> {
        self.inner.node().await
    }

    async fn set_cordon(
        &self,
        resource_version: &str,
        unschedulable: bool,
        cordoned_by: Option<&str>,
    ) -> Result<(), DrainApiError> {
        self.inner
            .set_cordon(resource_version, unschedulable, cordoned_by)
            .await
    }

    async fn pods(&self) -> Result<Vec<Pod>, DrainApiError> {
        self.inner.pods().await
    }

    async fn evict(&self, pod: &PodRef) -> Eviction {
        self.inner.evict(pod).await
    }

    async fn event(&self, regarding: &ObjectReference, warning: bool, reason: &str, note: &str) {
        self.inner.event(regarding, warning, reason, note).await;
        // Each step is told to the Node and again to the operation: kept once.
        if regarding.kind.as_deref() != Some("Node") {
            return;
        }
        let step = DrainView {
            reason: reason.to_string(),
            note: note.to_string(),
            warning,
            at: Timestamp::now().to_string(),
        };
        if let Err(e) = self.store.save(&step) {
            tracing::warn!(error = %e, "could not record the drain's progress for status");
        }
    }

    async fn budget(&self) -> Result<Option<(String, flex_api::budget::Data)>, DrainApiError> {
        self.inner.budget().await
    }

    async fn set_budget(
        &self,
        resource_version: &str,
        changes: &flex_api::budget::Changes,
    ) -> Result<(), DrainApiError> {
        self.inner.set_budget(resource_version, changes).await
    }
}
