//! `start` (alias `bootstrap`): set up the host, provision and start `kube1`, save the daemon
//! state once kubelet is up, and install and start the agent's service — in upstream's order —
//! and, last, mark the bootstrap complete ([`crate::state::BOOTSTRAP_MARK_PATH`]).
//!
//! A `start` cut short after it saved the daemon state (kubelet runs, the agent's unit may be
//! missing) is finished by [`finish_bootstrap`], which `bootstrap-node` runs when it finds a
//! daemon state without the mark ([`bootstrap_progress`]): the units are installed (idempotently:
//! files rewritten only when they differ, the service enabled and started) and the mark written.
//! The machine, already running, is not provisioned again.
//!
//! `start` marks its beginning ([`crate::state::BOOTSTRAP_STARTED_PATH`]) before it changes
//! the host; that mark without a daemon state is a `start` cut short before its machine came
//! up, which `bootstrap-node` runs again without preflight (its own half-started machine would
//! fail the port checks). A `start` that returns an error removes the mark (only a kill leaves
//! it); `reset` removes both marks as its first step, so a reset cut short never leaves a node
//! without a machine that `bootstrap-node` takes for bootstrapped.
//!
//! The node-machine work (rootfs, configuration, lifecycle) sits behind [`NodeStarter`] and the
//! machine-goal registration behind [`MachineRegistry`], so this flow is tested with fakes and
//! the layers that implement them plug in without changing it.

use std::path::Path;

use async_trait::async_trait;

use crate::config::{Config, ValidationError};
use crate::state::{BootstrapMark, BootstrapMarkStore, DaemonState, KUBE1, StateStore};
use crate::systemd::{
    RECOVERY_UNIT_PATH, install_service, render_agent_unit_for, render_recovery_unit_for,
};
use crate::task::step;
use flex_host::context::Host;

pub use crate::machine::seams::{MachineRegistry, NodeStarter, RemoteMachine};
pub use flex_api::goal::GoalState;

/// `GoalStateFromConfig`, with its checks; a failure names the config field.
pub fn goal_from_config(c: &Config) -> Result<GoalState, ValidationError> {
    let invalid = |field: &str, message: String| ValidationError {
        field: field.to_string(),
        message,
    };
    let g = GoalState {
        kubernetes_version: c.components.kubernetes.trim().to_string(),
        settings_version: c.components.kubernetes.trim().to_string(),
        max_pods: c.node.max_pods,
        node_labels: c.node.labels.clone(),
        node_taints: c.node.taints.clone(),
        image_gc_high_threshold: c.node.kubelet.image_gc_high_threshold,
        image_gc_low_threshold: c.node.kubelet.image_gc_low_threshold,
    };
    if g.kubernetes_version.is_empty() {
        return Err(invalid(
            "components.kubernetes",
            "kubernetes version is required".into(),
        ));
    }
    if !(0..=i64::from(i32::MAX)).contains(&g.max_pods) {
        return Err(invalid(
            "node.maxPods",
            format!("{} is out of range", g.max_pods),
        ));
    }
    for (field, v) in [
        (
            "node.kubelet.imageGCHighThreshold",
            g.image_gc_high_threshold,
        ),
        ("node.kubelet.imageGCLowThreshold", g.image_gc_low_threshold),
    ] {
        if v < 0 {
            return Err(invalid(field, format!("{v} must not be negative")));
        }
    }
    Ok(g)
}

/// A [`MachineRegistry`] whose every call fails with why there is no machine client (one that
/// could not be built for the config).
pub struct NoRegistry(pub String);

/// The registry `start` registers the machine through: the machine client for `config`
/// ([`crate::goalclient::MachineClientRegistry::for_start`]: in-cluster with the bootstrap
/// credentials, the controller directly, or ARM). A client that cannot be built is a
/// [`NoRegistry`] saying why, so that [`ensure_machine`] fails the start only with
/// `agent.requireMachineRegistration`, as for any other registration failure.
pub async fn registry_for(config: &Config) -> Box<dyn MachineRegistry> {
    match crate::goalclient::MachineClientRegistry::for_start(config).await {
        Ok(r) => Box::new(r),
        Err(e) => Box::new(NoRegistry(format!("machine client: {e}"))),
    }
}

#[async_trait]
impl MachineRegistry for NoRegistry {
    async fn get(&self) -> anyhow::Result<Option<RemoteMachine>> {
        anyhow::bail!("{}", self.0)
    }
    async fn put(&self, _goal: &GoalState) -> anyhow::Result<RemoteMachine> {
        anyhow::bail!("{}", self.0)
    }
}

/// `ensure-machine`: adopt a registered machine's ETag when its Kubernetes version matches the
/// config, update it when not, create it when missing. Failures are fatal only with
/// `agent.requireMachineRegistration`.
pub async fn ensure_machine(
    registry: &dyn MachineRegistry,
    goal: &mut GoalState,
    require: bool,
) -> anyhow::Result<()> {
    let result: Result<(), (&str, anyhow::Error)> = async {
        match registry.get().await.map_err(|e| ("get machine", e))? {
            Some(m) if m.kubernetes_version == goal.kubernetes_version => {
                tracing::info!("machine already registered, skipping");
                if !m.etag.is_empty() {
                    goal.settings_version = m.etag;
                }
                Ok(())
            }
            Some(m) => {
                tracing::info!(
                    remote_kubernetes_version = %m.kubernetes_version,
                    local_kubernetes_version = %goal.kubernetes_version,
                    "updating registered machine from local bootstrap config"
                );
                let put = registry
                    .put(goal)
                    .await
                    .map_err(|e| ("update machine", e))?;
                adopt(goal, put).map_err(|e| ("update machine", e))
            }
            None => {
                let put = registry
                    .put(goal)
                    .await
                    .map_err(|e| ("create machine", e))?;
                adopt(goal, put).map_err(|e| ("create machine", e))
            }
        }
    }
    .await;
    match result {
        Ok(()) => Ok(()),
        Err((op, e)) if require => Err(anyhow::anyhow!("ensure-machine: {op}: {e:#}")),
        Err((op, e)) => {
            tracing::warn!(operation = op, error = %format!("{e:#}"), "skipping AKS machine registration after failure");
            Ok(())
        }
    }
}

fn adopt(goal: &mut GoalState, m: RemoteMachine) -> anyhow::Result<()> {
    if !m.kubernetes_version.is_empty() && m.kubernetes_version != goal.kubernetes_version {
        anyhow::bail!(
            "AKS machine Kubernetes version {:?} does not match local bootstrap version {:?}",
            m.kubernetes_version,
            goal.kubernetes_version
        );
    }
    if !m.etag.is_empty() {
        goal.settings_version = m.etag;
    }
    Ok(())
}

/// The seeded state `start` saves once kubelet is up.
pub fn seeded_state(goal: &GoalState) -> DaemonState {
    DaemonState {
        applied_settings_version: goal.settings_version.clone(),
        applied_kubernetes_version: goal.kubernetes_version.clone(),
        active_machine: KUBE1.into(),
        ..Default::default()
    }
}

/// How far a node's bootstrap got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootstrapProgress {
    /// No daemon state: bootstrap from the beginning.
    NotStarted,
    /// `start` began (its "started" mark is there) but was cut short before it saved the daemon
    /// state: run `start` again (it is idempotent), without preflight, which that run passed
    /// and which its own half-started machine would now fail (ports in use).
    Interrupted,
    /// The daemon state is saved (the node's machine came up) but the bootstrap is not marked
    /// complete: `start` was cut short before its last steps, or an agent that wrote no mark
    /// bootstrapped the node. Finish it: [`finish_bootstrap`].
    Unfinished,
    /// Marked complete: nothing to do.
    Complete,
}

/// Decides [`BootstrapProgress`] from whether the complete mark, the daemon state and the
/// started mark are there.
pub fn bootstrap_progress(marked: bool, state_saved: bool, started: bool) -> BootstrapProgress {
    match (marked, state_saved, started) {
        (true, _, _) => BootstrapProgress::Complete,
        (false, true, _) => BootstrapProgress::Unfinished,
        (false, false, true) => BootstrapProgress::Interrupted,
        (false, false, false) => BootstrapProgress::NotStarted,
    }
}

/// The node's [`BootstrapProgress`] on `host`.
pub fn progress_on(host: &Host) -> BootstrapProgress {
    progress_in(&host.fs)
}

/// The [`BootstrapProgress`] of the node whose files `fs` holds (read-only).
pub fn progress_in(fs: &flex_host::fs::HostFs) -> BootstrapProgress {
    bootstrap_progress(
        BootstrapMarkStore::new(fs.clone()).is_marked(),
        fs.exists(Path::new(crate::state::STATE_PATH)),
        fs.exists(Path::new(crate::state::BOOTSTRAP_STARTED_PATH)),
    )
}

/// The last steps of `start`, after the daemon state is saved: install and start the agent's
/// service (with the binary layout on a host and the recovery unit), then mark the bootstrap
/// complete. Idempotent: it also finishes a `start` that was cut short.
pub async fn finish_bootstrap(host: &Host) -> Result<(), crate::task::StepError> {
    step("install-service", async {
        // On a host: the blue/green binary layout the unit runs through, and the units.
        let running = crate::machine::lifecycle::current_exe().ok();
        crate::flows::upgrade::Upgrader::new(host.clone())
            .converge_host(running.as_deref())
            .await?;
        // Both variants: the recovery unit the agent's unit names in OnFailure=.
        host.fs.write_atomic(
            Path::new(RECOVERY_UNIT_PATH),
            render_recovery_unit_for(host.containerized()).as_bytes(),
            0o644,
        )?;
        install_service(
            &host.fs,
            host.systemd.as_ref(),
            &render_agent_unit_for(host.containerized()),
        )
        .await?;
        Ok::<(), anyhow::Error>(())
    })
    .await?;
    step("mark-bootstrap-complete", async {
        BootstrapMarkStore::new(host.fs.clone()).save(&BootstrapMark::now())
    })
    .await?;
    Ok(())
}

/// Runs the `start` flow.
pub async fn run_start(
    host: &Host,
    config: &Config,
    registry: &dyn MachineRegistry,
    node: &dyn NodeStarter,
) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let mut goal = goal_from_config(config)
        .map_err(|e| anyhow::anyhow!("build goal state from config: {e}"))?;
    ensure_machine(
        registry,
        &mut goal,
        config.agent.require_machine_registration,
    )
    .await
    .map_err(|e| anyhow::anyhow!("bootstrap failed: {e:#}"))?;
    let state = seeded_state(&goal);
    let store = StateStore::new(host.fs.clone());
    let flow = async {
        step("mark-bootstrap-started", async {
            BootstrapMarkStore::started(host.fs.clone()).save(&BootstrapMark::now())
        })
        .await?;
        step(
            "setup-host",
            crate::flows::setup_host::setup_host(host, config),
        )
        .await?;
        step("start-node", node.start_node(host, config, KUBE1)).await?;
        step("save-daemon-state", async { store.save(&state) }).await?;
        flex_host::fault::point("start.before-agent-unit");
        finish_bootstrap(host).await
    };
    if let Err(e) = flow.await {
        // A start that returned an error (not one killed) leaves no "started" mark: the next
        // `bootstrap-node` runs preflight again, on inputs that may have changed.
        if let Err(rm) = BootstrapMarkStore::started(host.fs.clone()).delete() {
            tracing::warn!(error = %rm, "could not remove the bootstrap-started mark");
        }
        anyhow::bail!("bootstrap failed: {e}");
    }
    tracing::info!(
        operation = "bootstrap",
        duration_ms = started.elapsed().as_millis() as u64,
        "operation completed successfully"
    );
    Ok(())
}

/// What `start` prints on success.
pub const START_SUCCESS: &str = "
AKS Flex Node agent service started successfully.

Next steps:
  Check service status:  systemctl status aks-flex-node-agent
  View service logs:     journalctl -u aks-flex-node-agent -f
  Stop agent:            systemctl stop aks-flex-node-agent
";

#[cfg(test)]
mod tests;
