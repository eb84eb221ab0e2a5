//! The node-local operations tally: how many operations `aks-flex-node operation run` finished
//! on this node, by series ([`OperationSeries`]: kind, phase, reason), in one record file
//! ([`TALLY_PATH`], a [`JsonStore`] envelope with its checksum inside, written atomically).
//!
//! A node-local run is a process of its own, so its result never reaches the daemon's
//! in-memory counters. It adds itself here instead, and the daemon serves the file as
//! `aks_flex_node_local_operations_total` at each scrape: node_exporter's textfile pattern,
//! with a checksum and a closed label set (a key outside [`OperationSeries::parse`]'s sets is
//! ignored, so a damaged or hand-edited file cannot add series). An AgentUpgrade run locally
//! hands over to the restarted agent; the daemon that finishes it adds it
//! ([`crate::flows::daemon::upgrade_at_start`], [`crate::flows::daemon::ProveUpgrade`]).
//!
//! Counting is best effort and never an operation's failure: a tally that cannot be read
//! starts again from zero (Prometheus takes a counter that drops for a reset), a write that
//! fails is logged. A completed AgentReset is not counted: it removes `/etc/aks-flex-node`, the
//! tally with it, and writing it again would leave agent state behind on a reset host. Two
//! writers at the same instant (a local run while the daemon finishes a local upgrade) may
//! lose one count; they take no lock for it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::flows::metrics::OperationSeries;
use crate::state::{JsonStore, StateError};
use flex_api::machina::OperationKind;
use flex_api::operations::OperationResult;
use flex_host::fs::HostFs;

/// Where the tally lives (reset removes it with the rest of `/etc/aks-flex-node`).
pub const TALLY_PATH: &str = "/etc/aks-flex-node/operations-local.json";

/// The counts, by [`OperationSeries::key`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// `kind/phase/reason` → operations finished so.
    #[serde(default)]
    pub counts: BTreeMap<String, u64>,
}

impl Tally {
    /// One more operation of `series`.
    pub fn add(&mut self, series: OperationSeries) {
        let n = self.counts.entry(series.key()).or_insert(0);
        *n = n.saturating_add(1);
    }

    /// The counts of the keys that name a series; others are left out.
    pub fn series(&self) -> Vec<(OperationSeries, u64)> {
        self.counts
            .iter()
            .filter_map(|(k, n)| OperationSeries::parse(k).map(|s| (s, *n)))
            .collect()
    }
}

/// Whether a node-local run of `kind` that ended with `result` is counted: everything but a
/// completed AgentReset (see the module documentation).
pub fn counted(kind: &OperationKind, result: &OperationResult) -> bool {
    !(*kind == OperationKind::AgentReset && result.succeeded())
}

/// The tally's file.
#[derive(Clone, Debug)]
pub struct TallyStore {
    store: JsonStore<Tally>,
}

impl TallyStore {
    /// The tally at [`TALLY_PATH`].
    pub fn new(fs: HostFs) -> Self {
        Self::at(fs, TALLY_PATH)
    }

    /// The tally at `path` (a host path).
    pub fn at(fs: HostFs, path: &str) -> Self {
        Self {
            store: JsonStore::at(fs, path),
        }
    }

    /// The tally; an absent one is empty, an unreadable one is an error naming the file.
    pub fn load(&self) -> Result<Tally, StateError> {
        Ok(self.store.load()?.unwrap_or_default())
    }

    /// Adds one operation of `kind` that ended with `result`, when it [`counted`]. An
    /// unreadable tally starts again from zero (logged).
    pub fn count(&self, kind: &OperationKind, result: &OperationResult) -> Result<(), StateError> {
        if !counted(kind, result) {
            return Ok(());
        }
        let mut tally = self.load().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the node-local operations tally is unreadable; counting from zero");
            Tally::default()
        });
        tally.add(OperationSeries::of(kind, result));
        self.store.save(&tally)
    }

    /// [`Self::count`], a failure logged rather than returned (an operation never fails for
    /// its count).
    pub fn count_logged(&self, kind: &OperationKind, result: &OperationResult) {
        if let Err(e) = self.count(kind, result) {
            tracing::warn!(error = %e, kind = kind.as_str(), "could not count the node-local operation");
        }
    }

    /// The series to serve: empty when there is no tally or it cannot be read (logged).
    pub fn series(&self) -> Vec<(OperationSeries, u64)> {
        match self.load() {
            Ok(t) => t.series(),
            Err(e) => {
                tracing::warn!(error = %e, "the node-local operations tally is unreadable; not served");
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flows::metrics::{Kind, Outcome, Reason};
    use flex_api::machina::OperationPhase;

    fn result(phase: OperationPhase, reason: &str) -> OperationResult {
        OperationResult {
            phase,
            reason: reason.into(),
            message: "m".into(),
        }
    }

    /// A tally at [`TALLY_PATH`] under a temporary root, and its real file.
    fn store() -> (tempfile::TempDir, TallyStore, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("etc/aks-flex-node/operations-local.json");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        let s = TallyStore::new(HostFs::new(d.path()));
        (d, s, file)
    }

    /// Real files in a temporary directory (no fakes): counts add up by series, across loads.
    #[test]
    fn counts_add_up_by_series_across_loads() {
        let (_d, s, file) = store();
        assert!(s.series().is_empty(), "no file: nothing served");
        assert!(!file.exists());
        let ok = result(OperationPhase::Complete, flex_api::operations::SUCCEEDED);
        let failed = result(
            OperationPhase::Failed,
            flex_api::operations::EXECUTION_FAILED,
        );
        s.count(&OperationKind::NodeReboot, &ok).unwrap();
        s.count(&OperationKind::NodeReboot, &ok).unwrap();
        s.count(&OperationKind::AgentUpgrade, &failed).unwrap();
        s.count(&OperationKind::parse("Frobnicate"), &failed)
            .unwrap();
        let mut got = s.series();
        got.sort();
        assert_eq!(
            got,
            vec![
                (
                    OperationSeries {
                        kind: Kind::NodeReboot,
                        phase: Outcome::Complete,
                        reason: Reason::Succeeded
                    },
                    2
                ),
                (
                    OperationSeries {
                        kind: Kind::AgentUpgrade,
                        phase: Outcome::Failed,
                        reason: Reason::ExecutionFailed
                    },
                    1
                ),
                (
                    OperationSeries {
                        kind: Kind::Other,
                        phase: Outcome::Failed,
                        reason: Reason::ExecutionFailed
                    },
                    1
                ),
            ]
        );
    }

    /// A completed AgentReset removed the agent's state: writing the tally would put some back.
    #[test]
    fn a_completed_reset_is_not_counted_a_failed_one_is() {
        let (_d, s, file) = store();
        let ok = result(OperationPhase::Complete, flex_api::operations::SUCCEEDED);
        s.count(&OperationKind::AgentReset, &ok).unwrap();
        assert!(!file.exists(), "nothing written after a reset");
        let failed = result(
            OperationPhase::Failed,
            flex_api::operations::EXECUTION_FAILED,
        );
        s.count(&OperationKind::AgentReset, &failed).unwrap();
        assert_eq!(s.series().len(), 1);
    }

    /// Keys outside the closed sets (a hand-edited or foreign file) add no series.
    #[test]
    fn keys_outside_the_closed_sets_are_ignored() {
        let mut t = Tally::default();
        for k in [
            "NodeReboot/Complete/Succeeded",
            "node-a/Complete/Succeeded",
            "NodeReboot/Complete",
            "NodeReboot/Complete/Succeeded/x",
            "NodeReboot/Running/Succeeded",
            "",
        ] {
            t.counts.insert(k.into(), 3);
        }
        assert_eq!(t.series().len(), 1, "{:?}", t.series());
        for s in [
            OperationSeries {
                kind: Kind::Other,
                phase: Outcome::Failed,
                reason: Reason::DaemonFailed,
            },
            OperationSeries {
                kind: Kind::AgentReset,
                phase: Outcome::Complete,
                reason: Reason::Other,
            },
        ] {
            assert_eq!(OperationSeries::parse(&s.key()), Some(s), "{}", s.key());
        }
    }

    /// A damaged tally (its checksum fails) is not served and the next count starts over.
    #[test]
    fn a_damaged_tally_starts_over() {
        let (_d, s, file) = store();
        let ok = result(OperationPhase::Complete, flex_api::operations::SUCCEEDED);
        s.count(&OperationKind::NodeReboot, &ok).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        std::fs::write(&file, text.replace("Succeeded\": 1", "Succeeded\": 9")).unwrap();
        assert!(s.load().is_err(), "the checksum catches the edit");
        assert!(s.series().is_empty());
        s.count(&OperationKind::NodeReboot, &ok).unwrap();
        assert_eq!(s.series()[0].1, 1);
    }
}
