//! One queue item, carried out: the repave reconcile (read the state, the machine and the Node;
//! [`decide`]; act) and MachineOperations (handed to the [`Operations`] hook).
//!
//! Nothing touches the host before every read has succeeded and, for a repave, before the
//! `Reconciling` status is accepted: an API server that is down or answers 409/410/500 makes the
//! item fail with an error naming the cause, and the queue retries it with backoff. An item
//! fails [`SeamError::Permanent`] only when a repave was rolled back because the goal itself is
//! wrong, or the API server rejected a MachineOperation write as invalid: the daemon does not
//! retry those until the item comes round again (the next interval, a Node or operation change).

use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use k8s_openapi::api::core::v1::Node;
use kube::Api;

use super::{OperationOutcome, Operations};
use crate::flows::repave::{NodeOps, Stores};
use crate::flows::start::GoalState;
use crate::goalclient::{MachineClient, MachineError, MachineStatus};
use crate::kubeclient::{KubeClients, describe};
use crate::machine::nspawn::Timings;
use crate::machine::seams::SeamError;
use crate::state::{DaemonState, StateError};
use flex_api::node_state::Event as NodeEvent;
use flex_api::repave::{Action, Decision, MachineSnapshot, decide};
use flex_host::context::Host;

/// `provisioningState` values the daemon reports.
pub const RECONCILING: &str = "Reconciling";
/// Succeeded.
pub const SUCCEEDED: &str = "Succeeded";
/// Failed.
pub const FAILED: &str = "Failed";

/// What the daemon works with.
pub(crate) struct Ctx {
    pub node_name: String,
    pub host: Host,
    pub kube: KubeClients,
    pub machines: Arc<dyn MachineClient>,
    pub ops: Arc<dyn NodeOps>,
    pub stores: Stores,
    pub timings: Timings,
    pub operations: Option<Arc<dyn Operations>>,
    pub node_state: Option<Arc<super::Reporter>>,
    pub metrics: Arc<crate::flows::metrics::DaemonMetrics>,
    /// Cordon and drain around the repave's switch and before the deletion's reset.
    pub drain: Arc<crate::flows::drain::NodeDrain>,
}

/// What happens after an item succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Nothing more.
    Done,
    /// Run the same item again after this delay.
    RequeueAfter(Duration),
    /// The daemon is done (its service is uninstalled).
    Stop(&'static str),
}

impl Ctx {
    /// Tells the Node what the daemon is doing ([`super::node_state`]), with the daemon state
    /// as it stands for the annotations.
    pub async fn report(&self, event: NodeEvent) {
        if let Some(r) = &self.node_state {
            let state = self.stores.state.load().ok().flatten();
            r.observe(event, state.as_ref()).await;
        }
    }

    /// Sets the active-machine gauge from the daemon state (left as it is when the state does
    /// not read: the next item tries again).
    pub fn observe_active_machine(&self) {
        if let Ok(state) = self.stores.state.load() {
            self.metrics
                .active_machine(state.as_ref().map_or("", |s| s.active_machine.as_str()));
        }
    }

    /// Once kubelet in `machine` holds its client credential, the bootstrap token's kubeconfig
    /// leaves the machine ([`crate::machine::kubelet_credential::scrub_token`]): at each
    /// reconcile that finds the node as it should be, so a first join does not leave the token
    /// there until the machine's next start. A failure is logged; the next reconcile tries again.
    fn scrub_token(&self, machine: &str) {
        if machine.is_empty() {
            return;
        }
        match crate::machine::kubelet_credential::scrub_token(
            &self.host.fs,
            machine,
            &self.node_name,
            std::time::SystemTime::now(),
        ) {
            Ok(true) => tracing::info!(
                machine,
                "removed the bootstrap token's kubeconfig: kubelet holds its client credential"
            ),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(machine, error = %e, "could not remove the bootstrap token's kubeconfig")
            }
        }
    }

    async fn patch(&self, state: &str, observed: &str, message: &str) -> Result<(), MachineError> {
        self.machines
            .patch_status(&MachineStatus {
                provisioning_state: state.into(),
                observed_settings_version: observed.into(),
                message: message.into(),
            })
            .await
    }

    /// The repave reconcile; returns the decision taken.
    pub async fn repave(&self, source: &str) -> Result<(Decision, Flow), SeamError> {
        let state = match self.stores.state.load() {
            Ok(s) => s,
            Err(e) => {
                let message = format!("load daemon state: {e}");
                if let Err(pe) = self.patch(FAILED, "", &message).await {
                    tracing::debug!(error = %pe, "report machine status Failed");
                }
                // A record that does not read (checksum, envelope, payload) fails the same way
                // until someone repairs or removes it; a read error of the disk may pass.
                return Err(match e {
                    StateError::Fs(_) => SeamError::transient(anyhow!(message)),
                    _ => SeamError::permanent(anyhow!(message)),
                });
            }
        };
        let machine = match self.machines.get().await {
            Ok(m) => Some(m),
            Err(MachineError::NotFound(_)) => None,
            Err(e) => return Err(SeamError::transient(anyhow!("get machine: {e}"))),
        };
        let nodes: Api<Node> = Api::all(self.kube.current());
        let node = nodes.get_opt(&self.node_name).await.map_err(|e| {
            SeamError::transient(anyhow!("get node {}: {}", self.node_name, describe(&e)))
        })?;
        if let Some(r) = &self.node_state {
            r.node_seen(node.as_ref().and_then(|n| n.metadata.uid.as_deref()));
        }
        let snapshot = match &machine {
            None => MachineSnapshot::NotFound,
            Some(m) if m.goal == GoalState::default() => MachineSnapshot::Empty,
            Some(m) => MachineSnapshot::Exists(&m.goal),
        };
        let decision = decide(node.as_ref(), snapshot, state.as_ref());
        tracing::info!(
            source,
            decision = decision.action.as_str(),
            reason = decision.reason,
            "daemon reconcile decision"
        );
        let flow = match (decision.action, snapshot) {
            (Action::ReportSucceeded, MachineSnapshot::Exists(goal)) => {
                self.patch(SUCCEEDED, &goal.settings_version, decision.reason)
                    .await
                    .map_err(|e| {
                        SeamError::transient(anyhow!("report machine status {SUCCEEDED}: {e}"))
                    })?;
                if let Some(s) = &state {
                    self.scrub_token(&s.active_machine);
                }
                Flow::Done
            }
            (Action::ApplyGoalState, MachineSnapshot::Exists(goal)) => {
                self.apply(state.unwrap_or_default(), goal).await?;
                Flow::Done
            }
            (Action::ResetDelete, _) => {
                self.reset_delete().await?;
                Flow::Stop("the node was reset after its deletion")
            }
            _ => Flow::Done,
        };
        Ok((decision, flow))
    }

    /// `ApplyGoalState`: `Reconciling` (its failure aborts before the host is touched), the
    /// blue/green repave, then `Succeeded` or `Failed`.
    async fn apply(&self, state: DaemonState, goal: &GoalState) -> Result<(), SeamError> {
        let old = state.applied_settings_version.clone();
        self.report(NodeEvent::ApplyingGoal {
            settings_version: goal.settings_version.clone(),
        })
        .await;
        self.patch(RECONCILING, &old, "applying machine goal state")
            .await
            .map_err(|e| {
                SeamError::transient(anyhow!("report machine status {RECONCILING}: {e}"))
            })?;
        let started = tokio::time::Instant::now();
        let applied = crate::flows::repave::apply_goal_state(
            self.ops.as_ref(),
            self.drain.as_ref(),
            &self.stores,
            &state,
            goal,
        )
        .await;
        self.metrics.repave_finished(&applied, started.elapsed());
        match applied {
            Ok(next) => {
                tracing::info!(
                    active_machine = %next.active_machine,
                    settings_version = %next.applied_settings_version,
                    "machine goal state applied"
                );
                self.patch(
                    SUCCEEDED,
                    &next.applied_settings_version,
                    "machine goal state applied",
                )
                .await
                .map_err(|e| {
                    SeamError::transient(anyhow!("report machine status {SUCCEEDED}: {e}"))
                })
            }
            Err(e) => {
                let message = e.to_string();
                if let Err(pe) = self.patch(FAILED, &old, &message).await {
                    tracing::warn!(error = %pe, "report machine status {FAILED}");
                }
                Err(if e.is_permanent() {
                    SeamError::permanent(anyhow!(message))
                } else {
                    SeamError::transient(anyhow!(message))
                })
            }
        }
    }

    /// `ResetDelete`: cordon and drain the node (a drain that does not complete fails the item,
    /// retried with backoff: nothing is reset), reset the node (stage 1), then uninstall the
    /// agent's own service (stage 2; under systemd this stops the daemon). The Node object is
    /// left, cordoned, to whoever deletes the machine.
    async fn reset_delete(&self) -> Result<(), SeamError> {
        self.drain.before_deletion_reset().await?;
        tracing::warn!(node = %self.node_name, "node deletion: resetting the node");
        crate::flows::reset::reset_node(&self.host, self.timings)
            .await
            .map_err(|e| SeamError::transient(anyhow!("reset node: {e}")))?;
        self.stop_daemon().await.map_err(SeamError::transient)
    }

    async fn stop_daemon(&self) -> anyhow::Result<()> {
        crate::systemd::uninstall_service(&self.host.fs, self.host.systemd.as_ref())
            .await
            .map_err(|e| anyhow!("uninstall the agent service: {e}"))
    }

    /// One MachineOperation.
    pub async fn operation(&self, name: &str) -> Result<Flow, SeamError> {
        let Some(ops) = &self.operations else {
            tracing::warn!(operation = name, "no MachineOperation reconciler; ignoring");
            return Ok(Flow::Done);
        };
        Ok(match ops.reconcile(name).await? {
            OperationOutcome::Done => Flow::Done,
            OperationOutcome::RequeueAfter(d) => Flow::RequeueAfter(d),
            OperationOutcome::StopDaemon => {
                self.stop_daemon().await.map_err(|e| {
                    SeamError::transient(anyhow!(
                        "stop daemon after MachineOperation {name}: {e:#}"
                    ))
                })?;
                Flow::Stop("a MachineOperation stopped the daemon")
            }
        })
    }
}
