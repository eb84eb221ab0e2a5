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

use super::{DrainApiError, NodeDrainApi, Subject, named_node, tell};

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
    /// The API server refused the slot's write for good (403, 422): the work is not run.
    pub const SLOT_REFUSED: &str = "DisruptionSlotRefused";
}

/// How one [`acquire`] looks: a few times, briefly, then it gives the daemon back (the
/// reconcile is requeued after [`SLOT_RECHECK`]), so a long wait for a slot never holds up the
/// daemon's other work or its shutdown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetTimings {
    /// Looks while every slot is held or the API server is unreachable: `attempts` in all,
    /// `initial` doubling to `max` between them.
    pub backoff: Backoff,
}

impl Default for BudgetTimings {
    /// 4 looks, 2 s doubling to 8 s between them (14 s at most).
    fn default() -> Self {
        Self {
            backoff: Backoff::new(4, Duration::from_secs(2), Duration::from_secs(8)),
        }
    }
}

/// What a wait's note says when the budget allows no disruption at all.
pub const PAUSED: &str = "maxUnavailable is 0: disruptive operations are paused";

/// How long an operation waiting for a slot is left before the next [`acquire`].
pub const SLOT_RECHECK: Duration = Duration::from_secs(20);

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
/// answer (both looked at again with the backoff), or, final, the budget does not parse or
/// the write was refused for good.
#[derive(Debug)]
enum NotYet {
    Held(String),
    Api(DrainApiError),
    Invalid(BudgetError),
    Refused(DrainApiError),
}

impl std::fmt::Display for NotYet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Held(why) => f.write_str(why),
            Self::Api(e) | Self::Refused(e) => write!(f, "{e}"),
            Self::Invalid(e) => write!(f, "{e}"),
        }
    }
}

/// The holders a [`acquire`] last named in a `WaitingForDisruptionSlot` Event, kept by the
/// caller across its attempts: the Event is recorded when a wait begins and when it turns from
/// held to paused (`maxUnavailable: 0`) or back, not once per look nor once per change of the
/// holders. A burst larger than the budget changes the holders once per slot handed on: Events
/// per change would make each waiting node's API cost grow with the burst (the fleet
/// simulator measured it). Reset when a slot is taken.
pub type Told = std::sync::Mutex<Option<Vec<String>>>;

/// Whether a wait for `holders` is to be told, after `told` (pure): a wait begins, or turns
/// from held to paused or back.
pub fn tell_wait(told: Option<&[String]>, holders: &[String]) -> bool {
    told.is_none_or(|t| t.is_empty() != holders.is_empty())
}

/// Takes a slot for `node` and `subject`'s work. Each look is an attempt of
/// [`flex_host::retry::retry`] with `timings.backoff`; when every slot stays held (the holders
/// named in an Event each time they change, as `told` remembers) or the API server cannot be
/// reached, it ends [`AcquireError::Busy`] and the caller comes back later. A ConfigMap that
/// does not parse, and a write refused for good, are final.
pub async fn acquire(
    api: &dyn NodeDrainApi,
    node: &str,
    subject: &Subject,
    timings: BudgetTimings,
    told: &Told,
) -> Result<Slot, AcquireError> {
    let node_ref = named_node(node);
    let node_ref = &node_ref;
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
                    *told.lock().unwrap_or_else(|e| e.into_inner()) = None;
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
                Err(e) if e.permanent && !e.conflict => {
                    let note = format!(
                        "{} not run: the disruption slot could not be written: {e}",
                        subject.what
                    );
                    tell(api, node_ref, subject, true, reasons::SLOT_REFUSED, &note).await;
                    Err(Attempt::Fatal(NotYet::Refused(e)))
                }
                // Another node wrote first (a conflict), or the API server did not answer:
                // read again.
                Err(e) => Err(Attempt::retry(NotYet::Api(e))),
            },
            Acquire::Wait { holders, max } => {
                let by = if holders.is_empty() {
                    PAUSED.to_string()
                } else {
                    format!("held by {}", holders.join(", "))
                };
                let note = format!(
                    "{} waits for one of {max} disruption slot(s), {by}",
                    subject.what
                );
                let new_holders = {
                    let mut t = told.lock().unwrap_or_else(|e| e.into_inner());
                    let changed = tell_wait(t.as_deref(), &holders);
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
        Err(NotYet::Refused(e)) => Err(AcquireError::Refused(e)),
        Err(e @ (NotYet::Held(_) | NotYet::Api(_))) => Err(AcquireError::Busy(e.to_string())),
    }
}

/// Why no slot was taken.
#[derive(Debug, thiserror::Error)]
pub enum AcquireError {
    /// The budget does not parse; the field is named. Final.
    #[error(transparent)]
    Invalid(#[from] BudgetError),
    /// The API server refused the write for good (403, 422). Final.
    #[error("the disruption slot could not be written: {0}")]
    Refused(DrainApiError),
    /// Every slot is held, or the API server did not answer: ask again later.
    #[error("{0}")]
    Busy(String),
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
/// holds none, its slot lapsed, or the budget is gone). `owner`: change only a slot this work
/// holds. Returns the lease the budget says now (`None`: no budget, or one that does not
/// parse), so a renewal schedule follows an administrator's change of it.
pub async fn change(
    api: &dyn NodeDrainApi,
    node: &str,
    owner: Option<&str>,
    what: Change,
) -> Result<Option<Duration>, DrainApiError> {
    for _ in 0..5 {
        let Some((rv, data)) = api.budget().await? else {
            return Ok(None);
        };
        let Ok(b) = budget::parse(&data) else {
            // Only a release is still meaningful; the key is the node's own.
            if what != Change::Release {
                return Ok(None);
            }
            return write(api, &rv, &data, budget::release(&data, node))
                .await
                .map(|()| None);
        };
        if let Some(o) = owner
            && budget::owner(&b, node).is_some_and(|held| held != o)
        {
            return Ok(Some(b.lease));
        }
        let new = match what {
            Change::Renew => budget::renew(&data, &b, node, Timestamp::now(), false),
            Change::Stuck => budget::renew(&data, &b, node, Timestamp::now(), true),
            Change::Release => budget::release(&data, node),
        };
        match write(api, &rv, &data, new).await {
            Err(e) if e.conflict => continue,
            other => return other.map(|()| Some(b.lease)),
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
        let mut every = *lease / 3;
        let node = node.to_string();
        Self(Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match change(api.as_ref(), &node, None, Change::Renew).await {
                    // The lease as the budget says it now: an administrator may change it.
                    Ok(Some(lease)) => every = lease / 3,
                    Ok(None) => {}
                    Err(e) => tracing::warn!(error = %e, "could not renew the disruption slot"),
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
