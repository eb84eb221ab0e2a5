//! The daemon's work queue: every piece of host work runs from here, one item at a time
//! (upstream's single controller with `MaxConcurrentReconciles=1`).
//!
//! Items come from the event sources through a [`QueueSender`] (unbounded, so a watch never
//! waits on a repave). An item already waiting is not queued twice (the same key: the machine
//! re-read — seed or interval —, the Node, or one MachineOperation by name). Items can be delayed
//! ([`WorkQueue::add_after`]); a failed item comes back after an exponential backoff
//! ([`WorkQueue::retry`]) until it succeeds ([`WorkQueue::forget`]).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use flex_host::retry::Backoff;

/// Why a repave reconcile runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RepaveSource {
    /// Once at start.
    Seed,
    /// The periodic re-read (`agent.machineReconcileInterval` plus jitter).
    Interval,
    /// The Node changed (watch event).
    NodeChange,
}

impl RepaveSource {
    /// The name in logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            RepaveSource::Seed => "seed",
            RepaveSource::Interval => "interval",
            RepaveSource::NodeChange => "node-change",
        }
    }
}

/// One piece of work.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Item {
    /// Reconcile the machine goal (the repave decision).
    Repave {
        /// What triggered it.
        source: RepaveSource,
    },
    /// Reconcile one MachineOperation.
    Operation {
        /// Its name.
        name: String,
    },
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Item::Repave { source } => write!(f, "repave ({})", source.as_str()),
            Item::Operation { name } => write!(f, "MachineOperation {name}"),
        }
    }
}

/// What makes two items the same work.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    Machine,
    Node,
    Operation(String),
}

impl Item {
    /// What the item is, as a metric label.
    pub(crate) fn metric_kind(&self) -> crate::flows::metrics::ItemKind {
        match self {
            Item::Repave { .. } => crate::flows::metrics::ItemKind::repave,
            Item::Operation { .. } => crate::flows::metrics::ItemKind::operation,
        }
    }

    pub(crate) fn key(&self) -> Key {
        match self {
            Item::Repave {
                source: RepaveSource::Seed | RepaveSource::Interval,
            } => Key::Machine,
            Item::Repave {
                source: RepaveSource::NodeChange,
            } => Key::Node,
            Item::Operation { name } => Key::Operation(name.clone()),
        }
    }
}

/// Feeds the queue; cheap to clone.
#[derive(Clone, Debug)]
pub struct QueueSender {
    tx: mpsc::UnboundedSender<Item>,
}

impl QueueSender {
    /// Queues `item`; `false` once the daemon has stopped.
    pub fn send(&self, item: Item) -> bool {
        self.tx.send(item).is_ok()
    }

    /// Queues the MachineOperation `name`.
    pub fn operation(&self, name: impl Into<String>) -> bool {
        self.send(Item::Operation { name: name.into() })
    }
}

/// Retry delays of failed work items: 1 s, doubling per consecutive failure, at most 5
/// minutes; no attempt limit (an item is retried until it succeeds or newer work replaces it).
pub const DAEMON_BACKOFF: Backoff =
    Backoff::new(u32::MAX, Duration::from_secs(1), Duration::from_secs(300));

/// The jitter added to the re-read interval: uniform in `[0, interval/10]` for `unit` uniform in
/// `[0, 1]`.
pub fn jitter(interval: Duration, unit: f64) -> Duration {
    let unit = if unit.is_finite() {
        unit.clamp(0.0, 1.0)
    } else {
        0.0
    };
    interval.mul_f64(unit / 10.0)
}

/// A uniform number in `[0, 1)` from the system's secure random source (as upstream's
/// crypto-random jitter); 0.5 if it fails.
pub fn secure_unit() -> f64 {
    let mut b = [0u8; 8];
    if rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut b)
        .is_err()
    {
        return 0.5;
    }
    (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
}

/// The queue (one consumer: the daemon loop).
pub struct WorkQueue {
    rx: mpsc::UnboundedReceiver<Item>,
    tx: mpsc::UnboundedSender<Item>,
    ready: VecDeque<Item>,
    delayed: Vec<(Instant, Item)>,
    failures: HashMap<Key, u32>,
    backoff: Backoff,
}

impl WorkQueue {
    /// An empty queue retrying with `backoff`.
    pub fn new(backoff: Backoff) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            rx,
            tx,
            ready: VecDeque::new(),
            delayed: Vec::new(),
            failures: HashMap::new(),
            backoff,
        }
    }

    /// A sender for event sources.
    pub fn sender(&self) -> QueueSender {
        QueueSender {
            tx: self.tx.clone(),
        }
    }

    fn push(&mut self, item: Item) {
        let key = item.key();
        if !self.ready.iter().any(|i| i.key() == key) {
            self.ready.push_back(item);
        }
    }

    /// Queues `item` after `delay` (an earlier pending delay of the same work wins).
    pub fn add_after(&mut self, item: Item, delay: Duration) {
        if delay.is_zero() {
            self.push(item);
            return;
        }
        let at = Instant::now() + delay;
        let key = item.key();
        match self.delayed.iter_mut().find(|(_, i)| i.key() == key) {
            Some(entry) if entry.0 <= at => {}
            Some(entry) => *entry = (at, item),
            None => self.delayed.push((at, item)),
        }
    }

    /// Counts a failure of `item` and queues it again after the backoff; returns the delay.
    pub fn retry(&mut self, item: &Item) -> Duration {
        let n = self.failures.entry(item.key()).or_insert(0);
        *n = n.saturating_add(1);
        let delay = self.backoff.delay(*n, None);
        self.add_after(item.clone(), delay);
        delay
    }

    /// Clears `item`'s failure count.
    pub fn forget(&mut self, item: &Item) {
        self.failures.remove(&item.key());
    }

    fn promote_due(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.delayed.len() {
            if self.delayed[i].0 <= now {
                let (_, item) = self.delayed.swap_remove(i);
                self.push(item);
            } else {
                i += 1;
            }
        }
    }

    /// The next item to run, waiting for one; `None` once `shutdown` is cancelled.
    pub async fn next(&mut self, shutdown: &CancellationToken) -> Option<Item> {
        loop {
            if shutdown.is_cancelled() {
                return None;
            }
            while let Ok(item) = self.rx.try_recv() {
                self.push(item);
            }
            self.promote_due(Instant::now());
            if let Some(item) = self.ready.pop_front() {
                return Some(item);
            }
            let next_due = self.delayed.iter().map(|(t, _)| *t).min();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return None,
                item = self.rx.recv() => {
                    if let Some(item) = item {
                        self.push(item);
                    }
                }
                _ = async {
                    match next_due {
                        Some(t) => tokio::time::sleep_until(t).await,
                        None => std::future::pending::<()>().await,
                    }
                } => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed() -> Item {
        Item::Repave {
            source: RepaveSource::Seed,
        }
    }

    #[test]
    fn backoff_doubles_to_its_cap() {
        let b = Backoff::new(u32::MAX, Duration::from_secs(1), Duration::from_secs(10));
        let d: Vec<u64> = (1..=6).map(|n| b.delay(n, None).as_secs()).collect();
        assert_eq!(d, vec![1, 2, 4, 8, 10, 10]);
        assert_eq!(b.delay(u32::MAX, None), Duration::from_secs(10));
    }

    #[test]
    fn jitter_is_at_most_a_tenth() {
        let i = Duration::from_secs(600);
        assert_eq!(jitter(i, 0.0), Duration::ZERO);
        assert_eq!(jitter(i, 1.0), Duration::from_secs(60));
        assert_eq!(jitter(i, 0.5), Duration::from_secs(30));
        assert_eq!(jitter(i, 7.0), Duration::from_secs(60));
        assert_eq!(jitter(i, -1.0), Duration::ZERO);
        assert_eq!(jitter(i, f64::NAN), Duration::ZERO);
        for _ in 0..100 {
            let u = secure_unit();
            assert!((0.0..1.0).contains(&u), "{u}");
        }
    }

    #[tokio::test]
    async fn same_work_is_queued_once_and_order_is_kept() {
        let mut q = WorkQueue::new(DAEMON_BACKOFF);
        let tx = q.sender();
        let token = CancellationToken::new();
        assert!(tx.send(seed()));
        assert!(tx.send(Item::Repave {
            source: RepaveSource::Interval
        }));
        assert!(tx.operation("op-1"));
        assert!(tx.operation("op-1"));
        assert!(tx.send(Item::Repave {
            source: RepaveSource::NodeChange
        }));
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(q.next(&token).await.unwrap().to_string());
        }
        assert_eq!(
            got,
            vec![
                "repave (seed)",
                "MachineOperation op-1",
                "repave (node-change)"
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retries_back_off_and_delays_fire_in_time() {
        let mut q = WorkQueue::new(Backoff::new(
            u32::MAX,
            Duration::from_millis(100),
            Duration::from_secs(1),
        ));
        let token = CancellationToken::new();
        let start = Instant::now();
        assert_eq!(q.retry(&seed()), Duration::from_millis(100));
        assert_eq!(q.next(&token).await, Some(seed()));
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        assert_eq!(q.retry(&seed()), Duration::from_millis(200));
        q.next(&token).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(300));
        q.forget(&seed());
        assert_eq!(q.retry(&seed()), Duration::from_millis(100));
        // An earlier delay of the same work wins; a later one does not move it.
        q.add_after(seed(), Duration::from_secs(5));
        q.next(&token).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(400));
    }

    #[tokio::test]
    async fn shutdown_ends_the_queue() {
        let mut q = WorkQueue::new(DAEMON_BACKOFF);
        let token = CancellationToken::new();
        q.sender().send(seed());
        token.cancel();
        assert_eq!(q.next(&token).await, None);
    }
}
