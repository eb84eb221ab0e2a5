//! The recording fake of [`NodeOps`] every flow's tests share (test code only): it records each
//! call as `provision <machine> <version>`, `start <machine>`, `stop <machine>` or
//! `cleanup <machine>` and `is-enabled <machine>`, models enablement as the real machines do (a
//! start enables, a stop or a cleanup disables; [`RecordingOps::with_enabled`] sets the start
//! point), fails the calls it is told to (transiently, or permanently as a
//! wrong input would), and can hand each call to an observer
//! first (the daemon's tests use it for their event order and concurrency checks).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::future::BoxFuture;

use super::seams::{NodeOps, SeamError};

/// Sees each call before it is recorded.
pub type Observer = Arc<dyn Fn(String) -> BoxFuture<'static, ()> + Send + Sync>;

/// A recording [`NodeOps`].
#[derive(Clone, Default)]
pub struct RecordingOps {
    calls: Arc<Mutex<Vec<String>>>,
    enabled: Arc<Mutex<BTreeSet<String>>>,
    fail: Vec<String>,
    permanent: bool,
    observer: Option<Observer>,
}

impl RecordingOps {
    /// A fake whose call `call` (as recorded) fails with `injected failure of <call>`.
    pub fn failing(call: &str) -> Self {
        Self::failing_each(&[call])
    }

    /// A fake whose calls `calls` (as recorded) each fail with `injected failure of <call>`.
    pub fn failing_each(calls: &[&str]) -> Self {
        Self {
            fail: calls.iter().map(|c| c.to_string()).collect(),
            ..Self::default()
        }
    }

    /// This fake, with its injected failures [`SeamError::Permanent`] (as a wrong machine name,
    /// version or image reference fails).
    pub fn permanently(mut self) -> Self {
        self.permanent = true;
        self
    }

    /// This fake, with `machines` enabled to begin with.
    pub fn with_enabled(self, machines: &[&str]) -> Self {
        self.enabled()
            .extend(machines.iter().map(|m| m.to_string()));
        self
    }

    fn enabled(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.enabled.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The machines enabled now.
    pub fn enabled_machines(&self) -> Vec<String> {
        self.enabled().iter().cloned().collect()
    }

    /// This fake, with `observer` called (and awaited) before each call is recorded.
    pub fn observed(mut self, observer: Observer) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The calls so far.
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    async fn record(&self, call: String) -> Result<(), SeamError> {
        if let Some(o) = &self.observer {
            o(call.clone()).await;
        }
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(call.clone());
        if self.fail.contains(&call) {
            let e = anyhow::anyhow!("injected failure of {call}");
            return Err(if self.permanent {
                SeamError::permanent(e)
            } else {
                SeamError::transient(e)
            });
        }
        Ok(())
    }
}

#[async_trait]
impl NodeOps for RecordingOps {
    async fn provision(&self, machine: &str, kubernetes_version: &str) -> Result<(), SeamError> {
        self.record(format!("provision {machine} {kubernetes_version}"))
            .await
    }
    async fn start(&self, machine: &str) -> Result<(), SeamError> {
        self.enabled().insert(machine.into());
        self.record(format!("start {machine}")).await
    }
    async fn stop(&self, machine: &str) -> Result<(), SeamError> {
        self.enabled().remove(machine);
        self.record(format!("stop {machine}")).await
    }
    async fn cleanup(&self, machine: &str) -> Result<(), SeamError> {
        self.enabled().remove(machine);
        self.record(format!("cleanup {machine}")).await
    }
    async fn is_enabled(&self, machine: &str) -> Result<bool, SeamError> {
        self.record(format!("is-enabled {machine}")).await?;
        Ok(self.enabled().contains(machine))
    }
}
