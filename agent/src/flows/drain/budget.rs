//! The cluster-wide disruption budget, carried out: a slot taken before the cordon, renewed
//! while the work runs, freed after the uncordon, kept (`stuck`) when the node is not Ready
//! again. The decisions are `flex_api::budget`'s; the calls go through [`NodeDrainApi`]'s
//! `budget`/`set_budget`, each write preconditioned on the ConfigMap's `resourceVersion`.

use std::sync::Arc;
use std::time::Duration;

use flex_api::budget::{self, Acquire, BudgetError, changes};
use flex_host::retry::{Attempt, Backoff, retry};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;

use super::{DrainApiError, NodeDrainApi, Subject, tell};

/// The reasons of the Events the budget records.
pub mod reasons {
    /// A slot was taken.
    pub const SLOT_ACQUIRED: &str = "DisruptionSlotAcquired";
    /// Every slot is held: the work waits (the holders named).
    pub const WAITING_FOR_SLOT: &str = "WaitingForDisruptionSlot";
    /// No budget could be read: the work goes on without one.
    pub const NO_BUDGET: &str = "NoDisruptionBudget";
    /// The budget's ConfigMap does not parse: the work is not run.
    pub const BUDGET_INVALID: &str = "DisruptionBudgetInvalid";
}

/// How often a wait for a slot looks again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetTimings {
    /// Waits while every slot is held or the API server is unreachable: `initial` doubling to
    /// `max`.
    pub backoff: Backoff,
}

impl Default for BudgetTimings {
    /// 2 s doubling to 30 s.
    fn default() -> Self {
        Self {
            backoff: Backoff::new(u32::MAX, Duration::from_secs(2), Duration::from_secs(30)),
        }
    }
}

/// What [`acquire`] came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The node holds a slot; renew it within `lease`.
    Held {
        /// How long the slot lasts unrenewed.
        lease: Duration,
    },
    /// No budget to ask (the ConfigMap is absent, or this node may not read it): the work goes
    /// on, and the Event says why.
    NoBudget(String),
}

/// Why an attempt to take a slot did not: every slot is held, or the API server did not
/// answer (both looked at again with the backoff), or the budget does not parse (final).
#[derive(Debug)]
enum NotYet {
    Held(String),
    Api(DrainApiError),
    Invalid(BudgetError),
}

impl std::fmt::Display for NotYet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Held(why) => f.write_str(why),
            Self::Api(e) => write!(f, "{e}"),
            Self::Invalid(e) => write!(f, "{e}"),
        }
    }
}

/// Takes a slot for `node` and `subject`'s work, waiting as long as every slot is held (the
/// holders named in an Event each time they change) or the API server cannot be reached: each
/// look is an attempt of [`flex_host::retry::retry`] with `timings.backoff`. A ConfigMap that
/// does not parse is an error naming the field.
pub async fn acquire(
    api: &dyn NodeDrainApi,
    node: &str,
    subject: &Subject,
    timings: BudgetTimings,
) -> Result<Slot, AcquireError> {
    let node_ref = node_ref(node);
    let told: std::sync::Mutex<Option<Vec<String>>> = std::sync::Mutex::new(None);
    let (node_ref, told) = (&node_ref, &told);
    let attempt = |_| async move {
        let (rv, data) = match api.budget().await {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(no_budget(api, node_ref, subject, "it does not exist").await),
            Err(e) if e.permanent => {
                return Ok(no_budget(api, node_ref, subject, &e.to_string()).await);
            }
            Err(e) => return Err(Attempt::retry(NotYet::Api(e))),
        };
        let b = match budget::parse(&data) {
            Ok(b) => b,
            Err(e) => {
                let note = format!("{} not run: {e}", subject.what);
                tell(api, node_ref, subject, true, reasons::BUDGET_INVALID, &note).await;
                return Err(Attempt::Fatal(NotYet::Invalid(e)));
            }
        };
        match budget::acquire(&data, &b, node, &subject.owner, Timestamp::now()) {
            Acquire::Write(new) => match api.set_budget(&rv, &changes(&data, &new)).await {
                Ok(()) => {
                    let note = format!(
                        "took one of {} disruption slot(s) for {}",
                        b.max_unavailable, subject.what
                    );
                    tracing::info!(
                        node,
                        max_unavailable = b.max_unavailable,
                        "disruption slot taken"
                    );
                    tell(api, node_ref, subject, false, reasons::SLOT_ACQUIRED, &note).await;
                    Ok(Slot::Held { lease: b.lease })
                }
                // Another node wrote first (a conflict), or the API server did not answer:
                // read again.
                Err(e) => Err(Attempt::retry(NotYet::Api(e))),
            },
            Acquire::Wait { holders, max } => {
                let by = if holders.is_empty() {
                    "maxUnavailable is 0: disruptive operations are paused".to_string()
                } else {
                    format!("held by {}", holders.join(", "))
                };
                let note = format!(
                    "{} waits for one of {max} disruption slot(s), {by}",
                    subject.what
                );
                let new_holders = {
                    let mut t = told.lock().unwrap_or_else(|e| e.into_inner());
                    let changed = t.as_ref() != Some(&holders);
                    *t = Some(holders);
                    changed
                };
                if new_holders {
                    tell(
                        api,
                        node_ref,
                        subject,
                        false,
                        reasons::WAITING_FOR_SLOT,
                        &note,
                    )
                    .await;
                }
                Err(Attempt::retry(NotYet::Held(note)))
            }
        }
    };
    match retry("take a disruption slot", timings.backoff, attempt).await {
        Ok(slot) => Ok(slot),
        Err(NotYet::Invalid(e)) => Err(AcquireError::Invalid(e)),
        Err(e) => Err(AcquireError::GaveUp(e.to_string())),
    }
}

/// Why no slot was taken.
#[derive(Debug, thiserror::Error)]
pub enum AcquireError {
    /// The budget does not parse; the field is named.
    #[error(transparent)]
    Invalid(#[from] BudgetError),
    /// The backoff's attempts ran out (the default's never do: it waits as long as it takes).
    #[error("no disruption slot after every attempt: {0}")]
    GaveUp(String),
}

async fn no_budget(
    api: &dyn NodeDrainApi,
    node_ref: &ObjectReference,
    subject: &Subject,
    why: &str,
) -> Slot {
    let why = format!(
        "no disruption budget (ConfigMap {}/{}: {why}): {} runs without one",
        budget::NAMESPACE,
        budget::CONFIGMAP,
        subject.what
    );
    tracing::warn!(reason = %why, "no disruption budget");
    tell(api, node_ref, subject, true, reasons::NO_BUDGET, &why).await;
    Slot::NoBudget(why)
}

fn node_ref(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.into()),
        ..ObjectReference::default()
    }
}

/// What a write of the node's key does to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Renewed (the work goes on).
    Renew,
    /// Renewed and marked `stuck`: the node is not Ready after the disruption; the slot never
    /// expires, and the rollout stops until someone looks.
    Stuck,
    /// Freed.
    Release,
}

/// Renews, marks or frees `node`'s slot (a conflict reads again; nothing to do when the node
/// holds none, or the budget is gone). `owner`: free only a slot this work holds.
pub async fn change(
    api: &dyn NodeDrainApi,
    node: &str,
    owner: Option<&str>,
    what: Change,
) -> Result<(), DrainApiError> {
    for _ in 0..5 {
        let Some((rv, data)) = api.budget().await? else {
            return Ok(());
        };
        let Ok(b) = budget::parse(&data) else {
            // Only a release is still meaningful; the key is the node's own.
            if what != Change::Release {
                return Ok(());
            }
            return write(api, &rv, &data, budget::release(&data, node)).await;
        };
        if let Some(o) = owner
            && budget::owner(&b, node).is_some_and(|held| held != o)
        {
            return Ok(());
        }
        let new = match what {
            Change::Renew => budget::renew(&data, &b, node, Timestamp::now(), false),
            Change::Stuck => budget::renew(&data, &b, node, Timestamp::now(), true),
            Change::Release => budget::release(&data, node),
        };
        match write(api, &rv, &data, new).await {
            Err(e) if e.conflict => continue,
            other => return other,
        }
    }
    Err(DrainApiError {
        action: format!("change node {node}'s disruption slot"),
        cause: "the budget kept changing".into(),
        permanent: false,
        conflict: true,
    })
}

async fn write(
    api: &dyn NodeDrainApi,
    rv: &str,
    old: &budget::Data,
    new: Option<budget::Data>,
) -> Result<(), DrainApiError> {
    match new {
        Some(new) => api.set_budget(rv, &changes(old, &new)).await,
        None => Ok(()),
    }
}

/// Renews a held slot every third of its lease until dropped; a renewal that fails is logged
/// (the next one may succeed; a slot that lapses is no longer counted, which the budget allows
/// for a holder that died).
pub struct Keeper(Option<tokio::task::JoinHandle<()>>);

impl Keeper {
    /// Starts renewing when `slot` is held.
    pub fn start(api: Arc<dyn NodeDrainApi>, node: &str, slot: &Slot) -> Self {
        let Slot::Held { lease } = slot else {
            return Self(None);
        };
        let every = *lease / 3;
        let node = node.to_string();
        Self(Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = change(api.as_ref(), &node, None, Change::Renew).await {
                    tracing::warn!(error = %e, "could not renew the disruption slot");
                }
            }
        })))
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.abort();
        }
    }
}
