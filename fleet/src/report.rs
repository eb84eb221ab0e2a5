//! The fleet run's arithmetic, pure and table-tested: how many nodes were disrupted at once
//! ([`Disruption`]), the per-node cost ([`Spread`], [`per_minute`]), and the report's table.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;

/// Tracks which nodes are disrupted (cordoned by the daemon for an action) from the Node
/// states as the API server serialised them, and the largest number at once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Disruption {
    now: BTreeSet<String>,
    max: usize,
    /// Nodes that were disrupted at some point.
    ever: BTreeSet<String>,
}

impl Disruption {
    /// Node `node` is now disrupted (`true`) or not.
    pub fn observe(&mut self, node: &str, disrupted: bool) {
        if disrupted {
            self.now.insert(node.to_string());
            self.ever.insert(node.to_string());
        } else {
            self.now.remove(node);
        }
        self.max = self.max.max(self.now.len());
    }

    /// The largest number of nodes disrupted at once so far.
    pub fn max(&self) -> usize {
        self.max
    }

    /// How many are disrupted now.
    pub fn current(&self) -> usize {
        self.now.len()
    }

    /// How many nodes were disrupted at some point.
    pub fn ever(&self) -> usize {
        self.ever.len()
    }
}

/// `count` per minute over `elapsed` (0 when no time passed).
pub fn per_minute(count: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    count as f64 * 60.0 / secs
}

/// The smallest, mean and largest of a per-node count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    /// Smallest.
    pub min: u64,
    /// Mean.
    pub mean: f64,
    /// Largest.
    pub max: u64,
}

impl Spread {
    /// The spread of `values` (all zero when empty).
    pub fn of(values: &[u64]) -> Self {
        let (Some(min), Some(max)) = (values.iter().min(), values.iter().max()) else {
            return Self::default();
        };
        let sum: u64 = values.iter().sum();
        Self {
            min: *min,
            mean: sum as f64 / values.len() as f64,
            max: *max,
        }
    }
}

/// One node's cost as the API server counted it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NodeCost {
    /// HTTP requests.
    pub requests: u64,
    /// Watch events sent to it (every kind it watched).
    pub watch_events: u64,
    /// Of those, about MachineOperations.
    pub operation_watch_events: u64,
    /// Objects its lists returned.
    pub listed: u64,
    /// MachineOperations it was sent, by name.
    pub operations_seen: BTreeSet<String>,
    /// `requests` per minute of the run.
    pub requests_per_minute: f64,
    /// `watch_events` per minute of the run.
    pub watch_events_per_minute: f64,
}

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct FleetReport {
    /// Simulated nodes.
    pub nodes: usize,
    /// NodeReboot operations in the burst.
    pub operations: usize,
    /// The budget's `maxUnavailable` (K).
    pub budget: u32,
    /// Whether the daemons could select their operations by `spec.machineRef`.
    pub selector: bool,
    /// Where it ran: `fake API server` or the kubeconfig's server.
    pub api_server: String,
    /// From the burst's creation until every operation finished.
    #[serde(serialize_with = "secs")]
    pub burst: Duration,
    /// From the daemons' start until the end (the per-minute rates' denominator).
    #[serde(serialize_with = "secs")]
    pub elapsed: Duration,
    /// Operations by final phase (`Succeeded`, `Failed`, or unfinished: `InProgress`…).
    pub phases: BTreeMap<String, usize>,
    /// The largest number of nodes cordoned for an action at once.
    pub max_disrupted: usize,
    /// Nodes cordoned for an action at some point.
    pub nodes_disrupted: usize,
    /// Reboots the simulated hosts recorded.
    pub reboots: usize,
    /// Reboots that ran while their node was not cordoned (must be 0).
    pub reboots_uncordoned: usize,
    /// Events created, by reason (fake API server only).
    pub event_reasons: BTreeMap<String, u64>,
    /// Per node, by name (fake API server only: empty against a real one).
    pub per_node: BTreeMap<String, NodeCost>,
    /// Requests the fake API server does not implement (must be empty).
    pub unsupported: Vec<String>,
    /// Changes of each MachineOperation (fake API server only): what a watch of it alone
    /// is sent.
    pub operation_changes: BTreeMap<String, u64>,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl FleetReport {
    /// The spread over nodes of `f`.
    pub fn spread(&self, f: impl Fn(&NodeCost) -> u64) -> Spread {
        Spread::of(&self.per_node.values().map(f).collect::<Vec<_>>())
    }

    /// The report as a table (markdown) and a few lines.
    pub fn render(&self) -> String {
        let mut out = format!(
            "fleet: {} node(s), {} NodeReboot operation(s), budget K={}, {} ({})\n",
            self.nodes,
            self.operations,
            self.budget,
            if self.selector {
                "watch selected by spec.machineRef"
            } else {
                "no field selector: every daemon watches every operation"
            },
            self.api_server,
        );
        let phases: Vec<String> = self
            .phases
            .iter()
            .map(|(p, n)| format!("{n} {p}"))
            .collect();
        out += &format!(
            "burst finished in {:.2} s: {}; max disrupted at once {} (K={}); {} node(s) disrupted; {} reboot(s) recorded, {} while uncordoned\n",
            self.burst.as_secs_f64(),
            phases.join(", "),
            self.max_disrupted,
            self.budget,
            self.nodes_disrupted,
            self.reboots,
            self.reboots_uncordoned,
        );
        if self.per_node.is_empty() {
            out += "per-node API cost: not counted (only the fake API server counts it; read apiserver_request_total by user on a real one)\n";
            return out;
        }
        let min = self.elapsed;
        out += &format!(
            "per node over {:.2} s (min / mean / max):\n\n| per node | total | per minute |\n|---|---|---|\n",
            min.as_secs_f64()
        );
        let rows: [(&str, Spread); 4] = [
            ("requests", self.spread(|c| c.requests)),
            ("watch events (all)", self.spread(|c| c.watch_events)),
            (
                "watch events (MachineOperations)",
                self.spread(|c| c.operation_watch_events),
            ),
            ("objects listed", self.spread(|c| c.listed)),
        ];
        for (what, s) in rows {
            out += &format!(
                "| {what} | {} / {:.1} / {} | {:.0} / {:.0} / {:.0} |\n",
                s.min,
                s.mean,
                s.max,
                per_minute(s.min, min),
                s.mean * 60.0 / min.as_secs_f64().max(f64::MIN_POSITIVE),
                per_minute(s.max, min),
            );
        }
        let seen = self.spread(|c| c.operations_seen.len() as u64);
        out += &format!(
            "\nMachineOperations each node was sent: {} / {:.1} / {}\n",
            seen.min, seen.mean, seen.max
        );
        if !self.unsupported.is_empty() {
            out += &format!(
                "requests the fake API server does not implement: {}\n",
                self.unsupported.join(", ")
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

    use super::*;

    #[test]
    fn disruption_counts_the_most_nodes_at_once() {
        // (transitions, max at once, disrupted now, ever)
        type Case = (Vec<(&'static str, bool)>, usize, usize, usize);
        let cases: Vec<Case> = vec![
            (vec![], 0, 0, 0),
            (
                vec![("a", true), ("a", false), ("b", true), ("b", false)],
                1,
                0,
                2,
            ),
            (
                vec![("a", true), ("b", true), ("a", false), ("b", false)],
                2,
                0,
                2,
            ),
            // The same node seen cordoned twice counts once.
            (vec![("a", true), ("a", true), ("b", true)], 2, 2, 2),
            // An uncordon of a node never seen cordoned changes nothing.
            (vec![("x", false), ("a", true)], 1, 1, 1),
            (
                vec![
                    ("a", true),
                    ("b", true),
                    ("c", true),
                    ("b", false),
                    ("d", true),
                ],
                3,
                3,
                4,
            ),
        ];
        for (steps, max, now, ever) in cases {
            let mut d = Disruption::default();
            for (n, on) in &steps {
                d.observe(n, *on);
            }
            assert_eq!(
                (d.max(), d.current(), d.ever()),
                (max, now, ever),
                "{steps:?}"
            );
        }
    }

    #[test]
    fn rates_per_minute() {
        let cases = [
            (0, Duration::from_secs(60), 0.0),
            (10, Duration::from_secs(60), 10.0),
            (10, Duration::from_secs(30), 20.0),
            (3, Duration::from_millis(500), 360.0),
            (5, Duration::ZERO, 0.0),
        ];
        for (n, d, want) in cases {
            assert!((per_minute(n, d) - want).abs() < 1e-9, "{n} over {d:?}");
        }
    }

    #[test]
    fn spreads() {
        let cases: [(&[u64], Spread); 3] = [
            (&[], Spread::default()),
            (
                &[4],
                Spread {
                    min: 4,
                    mean: 4.0,
                    max: 4,
                },
            ),
            (
                &[1, 2, 6],
                Spread {
                    min: 1,
                    mean: 3.0,
                    max: 6,
                },
            ),
        ];
        for (v, want) in cases {
            assert_eq!(Spread::of(v), want, "{v:?}");
        }
    }
}
