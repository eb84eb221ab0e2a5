//! What `check` keeps of each group under `target/harness/<group>/`: `journal.txt`, the guest's
//! journal of the agent's units, the machines and containerd over the group's time span, and
//! `console.txt`, what the serial console printed meanwhile; and `last-run.json`, which groups
//! failed, for `check --rerun-failed`. The excerpts are pure functions of their inputs
//! ([`journal_script`], [`console_excerpt`], [`LastRun`]); [`begin`] and [`collect`] do the I/O.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flex_host::runner::Runner;
use serde::{Deserialize, Serialize};

use crate::report::{Outcome, RunReport};
use crate::ssh::Ssh;

/// The journal and console excerpts' files in a group's directory (the report links them).
pub use crate::report::{GROUP_CONSOLE as CONSOLE, GROUP_JOURNAL as JOURNAL};
/// The last run's results, in the harness's work directory.
pub const LAST_RUN: &str = "last-run.json";

/// The units a group's journal excerpt (and `cargo xtask journal` by default) shows: the
/// agent's, the machines' and containerd.
pub const AGENT_UNITS: &[&str] = &["aks-flex-node-*", "systemd-nspawn@*", "containerd.service"];

/// At most this many journal lines are kept per group.
const MAX_JOURNAL_LINES: u32 = 20_000;

/// A group's directory.
pub fn group_dir(work: &Path, group: &str) -> PathBuf {
    work.join(group)
}

/// Where a group started: the wall clock (the guest's clock is set to the host's after each
/// snapshot restore) and how long the console log was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Seconds since the epoch when the group started.
    pub since: u64,
    /// The console log's length then.
    pub console_offset: u64,
}

/// Now, and the console log's length.
pub fn begin(serial_log: &Path) -> Span {
    Span {
        since: epoch_now(),
        console_offset: std::fs::metadata(serial_log).map_or(0, |m| m.len()),
    }
}

fn epoch_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The guest script for the journal of the agent's units between `since` and `until` (epoch
/// seconds; a second of slack before `since`), across boots.
pub fn journal_script(since: u64, until: u64) -> String {
    let units: String = AGENT_UNITS
        .iter()
        .map(|u| format!(" -u {}", crate::ssh::shell_quote(u)))
        .collect();
    format!(
        "journalctl --no-pager -o short-iso-precise --since @{} --until @{}{units} 2>&1 | tail -n {MAX_JOURNAL_LINES}",
        since.saturating_sub(1),
        until
    )
}

/// What the console printed since `offset`: the bytes after it, or all of them when the log is
/// shorter than `offset` (QEMU restarted and began a new one).
pub fn console_excerpt(log: &[u8], offset: u64) -> &[u8] {
    usize::try_from(offset)
        .ok()
        .and_then(|o| log.get(o..))
        .unwrap_or(log)
}

/// Writes the group's journal and console excerpts into its directory (replacing an earlier
/// run's); the journal through `r`. A journal that cannot be read is written as the reason.
pub async fn collect(
    r: &dyn Runner,
    ssh: &Ssh,
    work: &Path,
    serial_log: &Path,
    group: &str,
    span: Span,
) -> anyhow::Result<PathBuf> {
    let dir = group_dir(work, group);
    std::fs::create_dir_all(&dir)?;
    let journal = match ssh
        .output(
            r,
            &journal_script(span.since, epoch_now() + 1),
            Duration::from_secs(120),
        )
        .await
    {
        Ok(o) => o.stdout,
        Err(e) => format!("(journal unavailable: {e:#})\n"),
    };
    std::fs::write(dir.join(JOURNAL), journal)?;
    let log = std::fs::read(serial_log).unwrap_or_default();
    std::fs::write(
        dir.join(CONSOLE),
        console_excerpt(&log, span.console_offset),
    )?;
    Ok(dir)
}

/// One group of the last run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LastGroup {
    /// The group.
    pub name: String,
    /// Whether a check of it failed.
    pub failed: bool,
    /// Its wall time in seconds, setup included (for `cargo xtask bench`).
    #[serde(default)]
    pub seconds: f64,
    /// Its checks: name, seconds, whether it passed.
    #[serde(default)]
    pub checks: Vec<(String, f64, bool)>,
}

impl LastGroup {
    /// Its times, as the bench reads them.
    pub fn times(&self) -> crate::bench::GroupTimes {
        crate::bench::GroupTimes {
            name: self.name.clone(),
            seconds: self.seconds,
            checks: self.checks.clone(),
        }
    }
}

/// `last-run.json`: the groups of the last `check`, whether each failed and how long each
/// and its checks took.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LastRun {
    /// The groups, in run order.
    pub groups: Vec<LastGroup>,
}

impl LastRun {
    /// The run's summary.
    pub fn of(run: &RunReport) -> Self {
        Self {
            groups: run
                .groups
                .iter()
                .map(|g| LastGroup {
                    name: g.name.clone(),
                    failed: g
                        .checks
                        .iter()
                        .any(|c| matches!(c.outcome, Outcome::Failed(_))),
                    seconds: g.duration.as_secs_f64(),
                    checks: g
                        .checks
                        .iter()
                        .map(|c| {
                            (
                                c.name.clone(),
                                c.duration.as_secs_f64(),
                                c.outcome == Outcome::Passed,
                            )
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// The groups that failed.
    pub fn failed(&self) -> Vec<&str> {
        self.groups
            .iter()
            .filter(|g| g.failed)
            .map(|g| g.name.as_str())
            .collect()
    }

    /// Reads `<work>/last-run.json`; `None` when there is none.
    pub fn load(work: &Path) -> anyhow::Result<Option<Self>> {
        let path = work.join(LAST_RUN);
        match std::fs::read(&path) {
            Ok(b) => Ok(Some(serde_json::from_slice(&b).map_err(|e| {
                anyhow::anyhow!("{} is not a harness run record: {e}", path.display())
            })?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(anyhow::anyhow!("reading {}: {e}", path.display())),
        }
    }

    /// Writes `<work>/last-run.json`.
    pub fn save(&self, work: &Path) -> anyhow::Result<()> {
        std::fs::write(work.join(LAST_RUN), serde_json::to_vec_pretty(self)?)?;
        Ok(())
    }
}

/// What `check --rerun-failed` runs, from the last run: the `--only` selection of its failed
/// groups, `Ok(None)` when none failed, and an error when no run was recorded.
pub fn rerun_selection(last: Option<&LastRun>) -> anyhow::Result<Option<String>> {
    let Some(last) = last else {
        anyhow::bail!(
            "check --rerun-failed: no earlier run recorded ({LAST_RUN}): run `cargo xtask check` first"
        );
    };
    let failed = last.failed();
    Ok((!failed.is_empty()).then(|| failed.join(",")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{CheckReport, GroupReport};

    #[test]
    fn console_excerpt_is_what_came_after_the_offset() {
        assert_eq!(console_excerpt(b"old\nnew\n", 4), b"new\n");
        assert_eq!(console_excerpt(b"old\n", 4), b"");
        // A new QEMU began a new log: all of it.
        assert_eq!(console_excerpt(b"new\n", 100), b"new\n");
    }

    #[test]
    fn journal_script_spans_the_group_across_boots() {
        let s = journal_script(1000, 1100);
        assert!(s.starts_with("journalctl --no-pager"), "{s}");
        assert!(s.contains(" --since @999 --until @1100"), "{s}");
        assert!(!s.contains(" -b"), "every boot of the span: {s}");
        for u in AGENT_UNITS {
            assert!(s.contains(&format!("-u '{u}'")), "{s}");
        }
    }

    fn group(name: &str, outcome: Outcome) -> GroupReport {
        GroupReport {
            name: name.into(),
            duration: Duration::from_secs(1),
            checks: vec![CheckReport {
                name: "c".into(),
                outcome,
                duration: Duration::from_secs(1),
                detail: None,
                steps: Vec::new(),
                journal: None,
            }],
        }
    }

    /// The record round-trips through a real file, and only failed groups are rerun (a
    /// skipped one is not a failure).
    #[test]
    fn last_run_selects_the_failed_groups() {
        let run = RunReport {
            groups: vec![
                group("machines", Outcome::Failed("x".into())),
                group("mounts", Outcome::Passed),
                group("node-join", Outcome::Skipped("no cluster".into())),
                group("reset", Outcome::Failed("y".into())),
            ],
            ..Default::default()
        };
        let d = tempfile::tempdir().unwrap();
        assert_eq!(LastRun::load(d.path()).unwrap(), None);
        assert!(
            rerun_selection(None)
                .unwrap_err()
                .to_string()
                .contains("no earlier run")
        );
        LastRun::of(&run).save(d.path()).unwrap();
        let last = LastRun::load(d.path()).unwrap().unwrap();
        assert_eq!(
            rerun_selection(Some(&last)).unwrap().as_deref(),
            Some("machines,reset")
        );
        let clean = LastRun::of(&RunReport {
            groups: vec![group("mounts", Outcome::Passed)],
            ..Default::default()
        });
        assert_eq!(rerun_selection(Some(&clean)).unwrap(), None);
        std::fs::write(d.path().join(LAST_RUN), "junk").unwrap();
        assert!(LastRun::load(d.path()).is_err());
    }

    /// `collect` against a recording fake runner (the guest's journal is scripted) and a real
    /// serial log in a temporary directory: the journal lands in `journal.txt`, the console's
    /// lines after the group's start in `console.txt`, and the guest was asked for the group's
    /// span of the agent's units.
    #[tokio::test]
    async fn collect_writes_the_groups_excerpts() {
        let d = tempfile::tempdir().unwrap();
        let serial = d.path().join("serial.log");
        std::fs::write(&serial, "before the group\n").unwrap();
        let span = begin(&serial);
        {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&serial)
                .unwrap();
            f.write_all(b"[ 12.3] reboot: Restarting system\n").unwrap();
        }
        let ssh = Ssh {
            port: 2222,
            key: "/w/id".into(),
        };
        let r = flex_testkit::FakeRunner::new();
        let base = ssh.cmd("x", Duration::ZERO).display_argv();
        let base = base.strip_suffix(" 'x'").unwrap().to_string();
        r.on(
            &format!("{base} \"'journalctl"),
            flex_host::runner::Output::ok("Dec 04 kube1 systemd-nspawn[1]: started\n"),
        );
        let dir = collect(&r, &ssh, d.path(), &serial, "machines", span)
            .await
            .unwrap();
        assert_eq!(dir, d.path().join("machines"));
        assert_eq!(
            std::fs::read_to_string(dir.join(JOURNAL)).unwrap(),
            "Dec 04 kube1 systemd-nspawn[1]: started\n"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join(CONSOLE)).unwrap(),
            "[ 12.3] reboot: Restarting system\n"
        );
        let calls = r.calls();
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert!(
            calls[0].contains(&format!("--since @{}", span.since - 1)),
            "{calls:?}"
        );
        for unit in AGENT_UNITS {
            assert!(calls[0].contains(unit), "{calls:?}");
        }
    }
}
