//! The cluster-wide disruption budget: at most `maxUnavailable` nodes run a disruptive
//! MachineOperation (NodeReboot, AgentReset) at the same time.
//!
//! The slots live in one ConfigMap, `kube-system/aks-flex-node-disruption`, that the
//! administrator deploys (`deploy/controller/disruption.yaml`):
//!
//! - `data.maxUnavailable`: K (default 1; `0` pauses every disruptive operation);
//! - `data.leaseDuration`: how long a holder that stopped renewing keeps its slot (a Go
//!   duration, default `5m`);
//! - `data["holder.<node>"]`: a node's slot, JSON: the owner (the operation's UID), when it was
//!   taken, when it was last renewed, and whether the node is `stuck` (not Ready after the
//!   disruption: the slot then never expires and the rollout stops until the node is Ready
//!   again and its daemon frees it, or an administrator removes the key).
//!
//! Every write is an update carrying the ConfigMap's `resourceVersion`, so two nodes racing for
//! the last slot cannot both win: the API server takes one update and answers the other with
//! a conflict, and the loser reads again. A node writes only its own key (the admission policy
//! in `deploy/controller/disruption.yaml` refuses anything else); an expired holder is not
//! removed by others, only no longer counted.
//!
//! Why not Leases (one per slot, as some operators do): the daemons authenticate as
//! `system:node:<node>`, and the NodeRestriction admission plugin lets a node write only the
//! Lease named after it in `kube-node-lease`, whatever RBAC says.
//!
//! Pure: what to write given what was read and the time; the agent's `flows::budget` does the
//! I/O.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::duration::parse_go_duration;

/// The ConfigMap's name.
pub const CONFIGMAP: &str = "aks-flex-node-disruption";
/// Its namespace.
pub const NAMESPACE: &str = "kube-system";
/// The key of K.
pub const MAX_UNAVAILABLE: &str = "maxUnavailable";
/// The key of the lease duration.
pub const LEASE_DURATION: &str = "leaseDuration";
/// A node's slot is `holder.<node>`.
pub const HOLDER_PREFIX: &str = "holder.";
/// K when the ConfigMap does not say.
pub const DEFAULT_MAX_UNAVAILABLE: u32 = 1;
/// The lease when the ConfigMap does not say.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(300);

/// The ConfigMap's data, as the API returns it.
pub type Data = BTreeMap<String, String>;

/// What a write changes: a key's new value, or `None` to remove it (a JSON merge patch of
/// `data`, so the rest of the ConfigMap is left as the administrator wrote it).
pub type Changes = BTreeMap<String, Option<String>>;

/// A field of the ConfigMap that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("ConfigMap {NAMESPACE}/{CONFIGMAP}: data.{field}: {reason}")]
pub struct BudgetError {
    /// The key (`maxUnavailable`, `leaseDuration`).
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

/// One node's slot, as its key's value holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    /// What holds it: the operation's UID.
    pub owner: String,
    /// When it was taken (RFC 3339).
    pub acquired: String,
    /// When it was last renewed (RFC 3339).
    pub renewed: String,
    /// Not Ready after the disruption: the slot never expires.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stuck: bool,
}

/// The budget as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    /// K.
    pub max_unavailable: u32,
    /// How long a holder that stopped renewing keeps its slot.
    pub lease: Duration,
    /// The slots, by node; `None` for a value that does not parse (it holds nothing).
    pub holders: BTreeMap<String, Option<Holder>>,
}

/// Reads the ConfigMap's data. A bad `maxUnavailable` or `leaseDuration` is an error naming
/// the key: guessing K could take down more nodes than the administrator allows.
pub fn parse(data: &Data) -> Result<Budget, BudgetError> {
    let bad = |field: &str, reason: String| BudgetError {
        field: field.into(),
        reason,
    };
    let max_unavailable = match data.get(MAX_UNAVAILABLE) {
        None => DEFAULT_MAX_UNAVAILABLE,
        Some(v) => v.trim().parse::<u32>().map_err(|_| {
            bad(
                MAX_UNAVAILABLE,
                format!("{v:?} is not a whole number of nodes (0 or more)"),
            )
        })?,
    };
    let lease = match data.get(LEASE_DURATION) {
        None => DEFAULT_LEASE,
        Some(v) => {
            let d = parse_go_duration(v.trim()).map_err(|e| bad(LEASE_DURATION, e.to_string()))?;
            if d < Duration::from_secs(30) || d > Duration::from_secs(24 * 3600) {
                return Err(bad(LEASE_DURATION, format!("{v:?} is outside 30s to 24h")));
            }
            d
        }
    };
    let holders = data
        .iter()
        .filter_map(|(k, v)| {
            let node = k.strip_prefix(HOLDER_PREFIX)?;
            Some((node.to_string(), serde_json::from_str::<Holder>(v).ok()))
        })
        .collect();
    Ok(Budget {
        max_unavailable,
        lease,
        holders,
    })
}

/// Whether `h` still holds its slot at `now`: stuck, or renewed within the lease. A value that
/// does not parse holds nothing (its writer is the only one who can fix it).
pub fn live(h: Option<&Holder>, lease: Duration, now: Timestamp) -> bool {
    let Some(h) = h else { return false };
    if h.stuck {
        return true;
    }
    let Ok(renewed) = h.renewed.parse::<Timestamp>() else {
        return false;
    };
    let lease = SignedDuration::try_from(lease).unwrap_or(SignedDuration::MAX);
    // A renewal in the future (a clock ahead) counts as now.
    now.duration_since(renewed) < lease
}

/// What acquiring a slot comes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// Write this data (the node's key added or renewed); the slot is the node's once the
    /// write is accepted.
    Write(Data),
    /// Every slot is held: wait. The holders (by node, sorted) and K.
    Wait {
        /// The nodes holding a slot, sorted.
        holders: Vec<String>,
        /// K.
        max: u32,
    },
}

fn key(node: &str) -> String {
    format!("{HOLDER_PREFIX}{node}")
}

fn stamp(now: Timestamp) -> String {
    now.to_string()
}

/// Acquires a slot for `node`, for work `owner`, at `now`: renews one the node holds already
/// (a restart in the middle of the work, or the next operation taking it over), takes a free
/// one, or waits. Only the node's own key changes.
pub fn acquire(data: &Data, budget: &Budget, node: &str, owner: &str, now: Timestamp) -> Acquire {
    let mine = budget.holders.get(node).cloned().flatten();
    let mut out = data.clone();
    if let Some(h) = mine.filter(|h| live(Some(h), budget.lease, now)) {
        let acquired = if h.owner == owner {
            h.acquired
        } else {
            stamp(now)
        };
        out.insert(key(node), holder_json(owner, &acquired, now, false));
        return Acquire::Write(out);
    }
    let held: Vec<String> = budget
        .holders
        .iter()
        .filter(|(n, h)| n.as_str() != node && live(h.as_ref(), budget.lease, now))
        .map(|(n, _)| n.clone())
        .collect();
    if u32::try_from(held.len()).unwrap_or(u32::MAX) >= budget.max_unavailable {
        return Acquire::Wait {
            holders: held,
            max: budget.max_unavailable,
        };
    }
    out.insert(key(node), holder_json(owner, &stamp(now), now, false));
    Acquire::Write(out)
}

fn holder_json(owner: &str, acquired: &str, now: Timestamp, stuck: bool) -> String {
    let h = Holder {
        owner: owner.into(),
        acquired: acquired.into(),
        renewed: stamp(now),
        stuck,
    };
    // A struct of strings and a bool always serializes.
    serde_json::to_string(&h).unwrap_or_default()
}

/// Renews `node`'s slot at `now` (`stuck`: marks it so); `None` when the node holds none (an
/// administrator removed it: the work goes on, the budget no longer counts it) or its slot
/// lapsed (the node was cut off from the API server for longer than the lease: another node
/// may hold the slot now, so renewing would count one node too many).
pub fn renew(
    data: &Data,
    budget: &Budget,
    node: &str,
    now: Timestamp,
    stuck: bool,
) -> Option<Data> {
    let h = budget.holders.get(node)?.as_ref()?;
    if !live(Some(h), budget.lease, now) {
        return None;
    }
    let mut out = data.clone();
    out.insert(
        key(node),
        holder_json(&h.owner, &h.acquired, now, stuck || h.stuck),
    );
    Some(out)
}

/// Frees `node`'s slot; `None` when it holds none.
pub fn release(data: &Data, node: &str) -> Option<Data> {
    let k = key(node);
    if !data.contains_key(&k) {
        return None;
    }
    let mut out = data.clone();
    out.remove(&k);
    Some(out)
}

/// The owner of `node`'s slot, when it has one (parsed or not: `Some("")` for a damaged one).
pub fn owner(budget: &Budget, node: &str) -> Option<String> {
    budget
        .holders
        .get(node)
        .map(|h| h.as_ref().map(|h| h.owner.clone()).unwrap_or_default())
}

/// The changes that turn `old` into `new`.
pub fn changes(old: &Data, new: &Data) -> Changes {
    let mut out: Changes = new
        .iter()
        .filter(|(k, v)| old.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect();
    for k in old.keys().filter(|k| !new.contains_key(*k)) {
        out.insert(k.clone(), None);
    }
    out
}
