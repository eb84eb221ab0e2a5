//! The end of a check run: a table of how long each group and check took, a JUnit XML report
//! and an HTML page ([`render_html`]: a timeline, a table per group, and for each failure the
//! lines that explain it). All are pure renderings of [`RunReport`].

use std::fmt::Write as _;
use std::time::Duration;

mod html;
pub use html::render_html;

/// The journal excerpt's file in a group's directory (`<work>/<group>/`, kept by
/// [`crate::artefacts`]).
pub const GROUP_JOURNAL: &str = "journal.txt";
/// The console excerpt's file in a group's directory.
pub const GROUP_CONSOLE: &str = "console.txt";

/// How a check ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Passed.
    Passed,
    /// Failed, with the reason.
    Failed(String),
    /// Not run, with the reason (never counted as passed).
    Skipped(String),
}

/// What a check returns: its outcome and, optionally, a detail for the report (a measurement
/// such as how long an upgrade took, or what was reused).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    /// Outcome.
    pub outcome: Outcome,
    /// Shown after the result in the table and as `system-out` in JUnit.
    pub detail: Option<String>,
    /// Where the check's time went, step by step ([`crate::check::Laps`]); empty for a check
    /// that does not time its steps.
    pub steps: Vec<Step>,
}

impl Checked {
    /// Passed, with a detail.
    pub fn passed_with(detail: impl Into<String>) -> Self {
        Self {
            outcome: Outcome::Passed,
            detail: Some(detail.into()),
            steps: Vec::new(),
        }
    }

    /// The same, with the timed steps `steps`.
    #[must_use]
    pub fn with_steps(mut self, steps: Vec<Step>) -> Self {
        self.steps = steps;
        self
    }
}

impl From<Outcome> for Checked {
    fn from(outcome: Outcome) -> Self {
        Self {
            outcome,
            detail: None,
            steps: Vec::new(),
        }
    }
}

/// One timed step of a check: what it did or waited for, and how long that took.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// What the step did, as the table names it.
    pub name: String,
    /// How long it took.
    pub duration: Duration,
}

/// A check's steps on one line, as JUnit's `system-out` and the page's note give them:
/// `steps: a 1.2s · b 3.4s`; empty when there are none.
pub fn steps_line(steps: &[Step]) -> String {
    if steps.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = steps
        .iter()
        .map(|s| format!("{} {}", s.name, secs(s.duration)))
        .collect();
    format!("steps: {}", parts.join(" · "))
}

/// One check's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckReport {
    /// Check name.
    pub name: String,
    /// Outcome.
    pub outcome: Outcome,
    /// How long it took.
    pub duration: Duration,
    /// What the check reported beside its outcome, if anything.
    pub detail: Option<String>,
    /// Its timed steps, if it timed them.
    pub steps: Vec<Step>,
    /// For a failure, the guest's journal lines captured when it failed (console lines, when a
    /// check has them, are part of its failure message); `system-err` in JUnit.
    pub journal: Option<String>,
}

/// One group's results.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupReport {
    /// Group name.
    pub name: String,
    /// Checks in order.
    pub checks: Vec<CheckReport>,
    /// Wall time of the group, including its setup (snapshot restore).
    pub duration: Duration,
}

/// A whole run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunReport {
    /// Groups in run order.
    pub groups: Vec<GroupReport>,
    /// What kind of run it was, when not a plain one (`check --rerun-failed` says which groups
    /// it reran); the table's first line and the page's summary.
    pub note: Option<String>,
    /// The groups whose journal and console excerpts were kept under `<group>/`
    /// ([`crate::artefacts`]); the page links them.
    pub artefacts: std::collections::BTreeSet<String>,
}

impl RunReport {
    /// (passed, failed, skipped) over all checks.
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut c = (0, 0, 0);
        for ch in self.groups.iter().flat_map(|g| &g.checks) {
            match ch.outcome {
                Outcome::Passed => c.0 += 1,
                Outcome::Failed(_) => c.1 += 1,
                Outcome::Skipped(_) => c.2 += 1,
            }
        }
        c
    }

    /// Whether nothing failed.
    pub fn success(&self) -> bool {
        self.counts().1 == 0
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// The timing table, ending with the plain `N passed, N failed, N skipped` line.
pub fn render_table(r: &RunReport) -> String {
    let width = r
        .groups
        .iter()
        .flat_map(|g| {
            std::iter::once(g.name.len()).chain(g.checks.iter().map(|c| c.name.len() + 2))
        })
        .max()
        .unwrap_or(10)
        .max(10);
    let mut s = String::new();
    if let Some(n) = &r.note {
        let _ = writeln!(s, "{n}");
    }
    let _ = writeln!(s, "{:<width$}  {:>8}  result", "group / check", "time");
    let total: Duration = r.groups.iter().map(|g| g.duration).sum();
    for g in &r.groups {
        let _ = writeln!(s, "{:<width$}  {:>8}", g.name, secs(g.duration));
        for c in &g.checks {
            let mut result = match &c.outcome {
                Outcome::Passed => "ok".to_string(),
                Outcome::Failed(e) => format!("FAILED: {}", e.lines().next().unwrap_or_default()),
                Outcome::Skipped(why) => format!("skipped: {why}"),
            };
            if let Some(d) = &c.detail {
                let _ = write!(result, " ({})", d.lines().next().unwrap_or_default());
            }
            let _ = writeln!(
                s,
                "  {:<w$}  {:>8}  {result}",
                c.name,
                secs(c.duration),
                w = width - 2
            );
            for st in &c.steps {
                let _ = writeln!(
                    s,
                    "    · {:<w$}  {:>8}",
                    st.name,
                    secs(st.duration),
                    w = width.saturating_sub(6)
                );
            }
        }
    }
    let _ = writeln!(s, "{:<width$}  {:>8}", "total", secs(total));
    let (p, f, k) = r.counts();
    let _ = writeln!(s, "{p} passed, {f} failed, {k} skipped");
    s
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// JUnit XML: one `testsuite` per group, one `testcase` per check.
pub fn render_junit(r: &RunReport) -> String {
    let (p, f, k) = r.counts();
    let total: Duration = r.groups.iter().map(|g| g.duration).sum();
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        s,
        "<testsuites name=\"aks-flex-node check\" tests=\"{}\" failures=\"{f}\" skipped=\"{k}\" time=\"{:.3}\">",
        p + f + k,
        total.as_secs_f64()
    );
    for g in &r.groups {
        let fails = g
            .checks
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Failed(_)))
            .count();
        let skips = g
            .checks
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Skipped(_)))
            .count();
        let _ = writeln!(
            s,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{fails}\" skipped=\"{skips}\" time=\"{:.3}\">",
            xml_escape(&g.name),
            g.checks.len(),
            g.duration.as_secs_f64()
        );
        for c in &g.checks {
            let open = format!(
                "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\"",
                xml_escape(&g.name),
                xml_escape(&c.name),
                c.duration.as_secs_f64()
            );
            let said: Vec<String> = c
                .detail
                .iter()
                .cloned()
                .chain(Some(steps_line(&c.steps)).filter(|l| !l.is_empty()))
                .collect();
            let mut out = if said.is_empty() {
                String::new()
            } else {
                format!(
                    "\n      <system-out>{}</system-out>",
                    xml_escape(&said.join("\n"))
                )
            };
            if let Some(j) = &c.journal {
                let _ = write!(out, "\n      <system-err>{}</system-err>", xml_escape(j));
            }
            match &c.outcome {
                Outcome::Passed if out.is_empty() => {
                    let _ = writeln!(s, "{open}/>");
                }
                Outcome::Passed => {
                    let _ = writeln!(s, "{open}>{out}\n    </testcase>");
                }
                Outcome::Failed(e) => {
                    let _ = writeln!(
                        s,
                        "{open}>\n      <failure message=\"{}\">{}</failure>{out}\n    </testcase>",
                        xml_escape(e.lines().next().unwrap_or_default()),
                        xml_escape(e)
                    );
                }
                Outcome::Skipped(why) => {
                    let _ = writeln!(
                        s,
                        "{open}>\n      <skipped message=\"{}\"/>{out}\n    </testcase>",
                        xml_escape(why)
                    );
                }
            }
        }
        s.push_str("  </testsuite>\n");
    }
    s.push_str("</testsuites>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn sample() -> RunReport {
        let ms = Duration::from_millis;
        RunReport {
            groups: vec![
                GroupReport {
                    name: "machines".into(),
                    duration: ms(61_234),
                    checks: vec![
                        CheckReport {
                            name: "machine in machine.slice".into(),
                            outcome: Outcome::Passed,
                            duration: ms(1_500),
                            detail: None,
                            steps: Vec::new(),
                            journal: None,
                        },
                        CheckReport {
                            name: "back after reboot".into(),
                            outcome: Outcome::Failed(
                                "kube1 not running; last console lines:\n[ 12.3] reboot: Restarting system".into(),
                            ),
                            duration: ms(45_000),
                            detail: None,
                            steps: Vec::new(),
                            journal: Some("systemd-nspawn@kube1.service: Failed with result 'exit-code' <&>".into()),
                        },
                    ],
                },
                GroupReport {
                    name: "node-join".into(),
                    duration: ms(0),
                    checks: vec![CheckReport {
                        name: "node Ready".into(),
                        outcome: Outcome::Skipped("no cluster".into()),
                        duration: ms(0),
                        detail: None,
                        steps: Vec::new(),
                        journal: None,
                    }],
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn table_and_counts() {
        let r = sample();
        assert_eq!(r.counts(), (1, 1, 1));
        assert!(!r.success());
        insta::assert_snapshot!(render_table(&r));
    }

    #[test]
    fn junit() {
        insta::assert_snapshot!(render_junit(&sample()));
    }

    #[test]
    fn details_follow_the_result() {
        let r = RunReport {
            groups: vec![GroupReport {
                name: "upgrade".into(),
                duration: Duration::from_secs(30),
                checks: vec![
                    CheckReport {
                        name: "upgrade to a good candidate".into(),
                        outcome: Outcome::Passed,
                        duration: Duration::from_secs(20),
                        detail: Some("new agent running 12.3s after the operation started".into()),
                        steps: Vec::new(),
                        journal: None,
                    },
                    CheckReport {
                        name: "back".into(),
                        outcome: Outcome::Skipped("already there".into()),
                        duration: Duration::ZERO,
                        detail: Some("a <b> & c".into()),
                        steps: Vec::new(),
                        journal: None,
                    },
                ],
            }],
            ..Default::default()
        };
        let table = render_table(&r);
        assert!(
            table.contains("ok (new agent running 12.3s after the operation started)"),
            "{table}"
        );
        assert!(
            table.contains("skipped: already there (a <b> & c)"),
            "{table}"
        );
        let junit = render_junit(&r);
        assert!(
            junit.contains("<system-out>new agent running 12.3s after the operation started</system-out>\n    </testcase>"),
            "{junit}"
        );
        assert!(
            junit.contains("<skipped message=\"already there\"/>\n      <system-out>a &lt;b&gt; &amp; c</system-out>"),
            "{junit}"
        );
        assert_eq!(
            Checked::from(Outcome::Passed),
            Checked {
                outcome: Outcome::Passed,
                detail: None,
                steps: Vec::new(),
            }
        );
        assert_eq!(Checked::passed_with("x").detail.as_deref(), Some("x"));
    }

    #[test]
    fn steps_follow_their_check_in_the_table_junit_and_page() {
        let step = |name: &str, ms: u64| Step {
            name: name.into(),
            duration: Duration::from_millis(ms),
        };
        let checked = Checked::passed_with("done").with_steps(vec![
            step("operation run", 2_100),
            step("until <settled>", 8_240),
        ]);
        let r = RunReport {
            groups: vec![GroupReport {
                name: "upgrade".into(),
                checks: vec![
                    CheckReport {
                        name: "timed".into(),
                        outcome: checked.outcome,
                        duration: Duration::from_millis(10_400),
                        detail: checked.detail,
                        steps: checked.steps,
                        journal: None,
                    },
                    CheckReport {
                        name: "untimed".into(),
                        outcome: Outcome::Passed,
                        duration: Duration::from_secs(1),
                        detail: None,
                        steps: Vec::new(),
                        journal: None,
                    },
                ],
                duration: Duration::from_secs(12),
            }],
            ..RunReport::default()
        };
        let table = render_table(&r);
        let lines: Vec<&str> = table.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.trim_start().starts_with("timed"))
            .expect("the check's row");
        assert!(
            lines[at + 1].trim_start().starts_with("· operation run"),
            "{table}"
        );
        assert!(lines[at + 1].trim_end().ends_with("2.1s"), "{table}");
        assert!(
            lines[at + 2].contains("until <settled>") && lines[at + 2].contains("8.2s"),
            "{table}"
        );
        assert!(lines[at + 3].trim_start().starts_with("untimed"), "{table}");
        let junit = render_junit(&r);
        assert!(
            junit.contains("<system-out>done\nsteps: operation run 2.1s · until &lt;settled&gt; 8.2s</system-out>"),
            "{junit}"
        );
        let page = render_html(&r);
        assert!(
            page.contains("done; steps: operation run 2.1s · until &lt;settled&gt; 8.2s"),
            "{page}"
        );
        assert_eq!(steps_line(&[]), "");
    }
}
