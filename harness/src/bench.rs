//! `cargo xtask bench`, the pure part: figures as samples, their median and spread, the budget
//! each is held to, the comparison with a committed baseline (`bench/baseline.json`) as ratios,
//! and the table. Every figure is "lower is better" (bytes, seconds, a time ratio). A figure
//! that could not be measured says why and is still written beside the others. Nothing here
//! asserts a wall-clock limit: a regression is named, never failed on.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// The bench file's format tag.
pub const FORMAT: &str = "aks-flex-node.bench/v1";

/// A median more than this many times the baseline's is named a regression (noise on a loaded
/// two-core machine stays well under it).
pub const REGRESSION_RATIO: f64 = 1.25;
/// A median under this many times the baseline's is named an improvement.
pub const IMPROVEMENT_RATIO: f64 = 0.8;

/// What a figure counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// Bytes.
    Bytes,
    /// Seconds.
    Seconds,
    /// A ratio of two times (ours over the reference).
    Ratio,
}

/// One figure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// A stable id (`image.compressed`, `vm.daemon_rss`…), what the baseline is keyed on.
    pub id: String,
    /// What it is, for people.
    pub what: String,
    /// Its unit.
    pub unit: Unit,
    /// The samples (in the unit), in the order taken.
    #[serde(default)]
    pub samples: Vec<f64>,
    /// The budget (in the unit) the figure must stay within, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<f64>,
    /// Why it was not measured (no samples then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_measured: Option<String>,
    /// Where the samples came from, when not measured here (e.g. the last check run's report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

impl Figure {
    /// A measured figure.
    pub fn measured(id: &str, what: &str, unit: Unit, samples: Vec<f64>) -> Self {
        Self {
            id: id.into(),
            what: what.into(),
            unit,
            samples,
            budget: None,
            not_measured: None,
            source: None,
        }
    }

    /// A figure that could not be measured, and why.
    pub fn missing(id: &str, what: &str, unit: Unit, why: impl Into<String>) -> Self {
        Self {
            not_measured: Some(why.into()),
            ..Self::measured(id, what, unit, Vec::new())
        }
    }

    /// With a budget.
    pub fn with_budget(mut self, budget: f64) -> Self {
        self.budget = Some(budget);
        self
    }

    /// With the source of its samples.
    pub fn from_source(mut self, source: impl Into<String>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// The samples' summary; `None` without samples.
    pub fn summary(&self) -> Option<Summary> {
        Summary::of(&self.samples)
    }

    /// Whether the median is within the budget (`None`: no budget or no samples).
    pub fn within_budget(&self) -> Option<bool> {
        Some(self.summary()?.median <= self.budget?)
    }
}

/// Median and spread of samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// The median (the mean of the middle two for an even count).
    pub median: f64,
    /// The smallest sample.
    pub min: f64,
    /// The largest sample.
    pub max: f64,
    /// How many samples.
    pub n: usize,
}

impl Summary {
    /// The summary of `samples` (non-finite samples ignored); `None` when none is left.
    pub fn of(samples: &[f64]) -> Option<Self> {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Self {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        })
    }

    /// The spread as a fraction of the median ((max - min) / median; 0 for a zero median).
    pub fn spread(&self) -> f64 {
        if self.median == 0.0 {
            0.0
        } else {
            (self.max - self.min) / self.median
        }
    }
}

/// A bench run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bench {
    /// [`FORMAT`].
    pub format: String,
    /// The commit measured (`git describe --always --dirty`).
    pub revision: String,
    /// Whether the VM ran under KVM or TCG (`None`: no VM figures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accel: Option<String>,
    /// The figures, in the order measured.
    pub figures: Vec<Figure>,
}

impl Bench {
    /// A run of `revision` with `figures`.
    pub fn new(revision: &str, accel: Option<String>, figures: Vec<Figure>) -> Self {
        Self {
            format: FORMAT.into(),
            revision: revision.into(),
            accel,
            figures,
        }
    }

    /// Reads a bench file, checking its format.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let b: Bench = serde_json::from_str(text)
            .map_err(|e| anyhow::anyhow!("not a bench file ({FORMAT}): {e}"))?;
        if b.format != FORMAT {
            anyhow::bail!("bench file format {:?}, expected {FORMAT:?}", b.format);
        }
        Ok(b)
    }
}

/// How a figure compares with the baseline's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    /// Within the noise band.
    Same(f64),
    /// Lower (better) by more than the band: the ratio.
    Improved(f64),
    /// Higher (worse) by more than the band: the ratio.
    Regressed(f64),
    /// The baseline has no such figure, or it was not measured there.
    NoBaseline,
    /// Not measured in this run.
    NotMeasured,
}

/// The verdict for `figure` against `baseline` (looked up by id).
pub fn compare(figure: &Figure, baseline: Option<&Bench>) -> Verdict {
    let Some(now) = figure.summary() else {
        return Verdict::NotMeasured;
    };
    let Some(then) = baseline
        .and_then(|b| b.figures.iter().find(|f| f.id == figure.id))
        .and_then(Figure::summary)
    else {
        return Verdict::NoBaseline;
    };
    if then.median == 0.0 {
        return if now.median == 0.0 {
            Verdict::Same(1.0)
        } else {
            Verdict::NoBaseline
        };
    }
    let ratio = now.median / then.median;
    if ratio > REGRESSION_RATIO {
        Verdict::Regressed(ratio)
    } else if ratio < IMPROVEMENT_RATIO {
        Verdict::Improved(ratio)
    } else {
        Verdict::Same(ratio)
    }
}

/// The ids of the figures that regressed against `baseline`, with their ratios.
pub fn regressions(bench: &Bench, baseline: Option<&Bench>) -> Vec<(String, f64)> {
    bench
        .figures
        .iter()
        .filter_map(|f| match compare(f, baseline) {
            Verdict::Regressed(r) => Some((f.id.clone(), r)),
            _ => None,
        })
        .collect()
}

/// `v` in `unit`, for people.
pub fn human(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Bytes if v >= 1e6 => format!("{:.1} MB", v / 1e6),
        Unit::Bytes if v >= 1e3 => format!("{:.1} kB", v / 1e3),
        Unit::Bytes => format!("{v:.0} B"),
        Unit::Seconds => format!("{v:.1} s"),
        Unit::Ratio => format!("{v:.2}×"),
    }
}

/// The table: per figure its median, spread and count, its budget verdict and its comparison
/// with the baseline; then the regressions named (or none).
pub fn render_table(bench: &Bench, baseline: Option<&Bench>) -> String {
    let mut s = String::new();
    let width = bench
        .figures
        .iter()
        .map(|f| f.what.chars().count())
        .max()
        .unwrap_or(10)
        .max(10);
    let _ = writeln!(
        s,
        "{:<width$}  {:>10}  {:>7}  {:>3}  {:<16}  vs baseline",
        "figure", "median", "spread", "n", "budget"
    );
    for f in &bench.figures {
        let Some(sum) = f.summary() else {
            let _ = writeln!(
                s,
                "{:<width$}  not measured: {}",
                f.what,
                f.not_measured.as_deref().unwrap_or("no samples")
            );
            continue;
        };
        let budget = match (f.budget, f.within_budget()) {
            (Some(b), Some(true)) => format!("≤ {} ok", human(b, f.unit)),
            (Some(b), _) => format!("≤ {} OVER", human(b, f.unit)),
            (None, _) => "-".to_string(),
        };
        let vs = match compare(f, baseline) {
            Verdict::Same(r) => format!("{r:.2}×"),
            Verdict::Improved(r) => format!("{r:.2}× improved"),
            Verdict::Regressed(r) => format!("{r:.2}× REGRESSED"),
            Verdict::NoBaseline => "no baseline".to_string(),
            Verdict::NotMeasured => "-".to_string(),
        };
        let _ = writeln!(
            s,
            "{:<width$}  {:>10}  {:>6.0}%  {:>3}  {:<16}  {vs}",
            f.what,
            human(sum.median, f.unit),
            sum.spread() * 100.0,
            sum.n,
            budget,
        );
    }
    let regressed = regressions(bench, baseline);
    if regressed.is_empty() {
        let _ = writeln!(s, "regressions: none");
    } else {
        let names: Vec<String> = regressed
            .iter()
            .map(|(id, r)| format!("{id} ({r:.2}×)"))
            .collect();
        let _ = writeln!(s, "regressions: {}", names.join(", "));
    }
    let over: Vec<&str> = bench
        .figures
        .iter()
        .filter(|f| f.within_budget() == Some(false))
        .map(|f| f.id.as_str())
        .collect();
    if !over.is_empty() {
        let _ = writeln!(s, "over budget: {}", over.join(", "));
    }
    s
}

/// A check run's times, as the bench reads them (the last `cargo xtask check`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupTimes {
    /// The group.
    pub name: String,
    /// The group's wall time, its setup (snapshot restore) included.
    pub seconds: f64,
    /// Its checks: name, seconds, whether it passed.
    pub checks: Vec<(String, f64, bool)>,
}

/// Figures taken from a check run: (id, what, group, check name).
pub const FROM_CHECKS: &[(&str, &str, &str, &str)] = &[
    (
        "vm.upgrade",
        "AgentUpgrade to the new agent running",
        "upgrade",
        "upgrade to a good candidate completes and the agent runs it",
    ),
    (
        "vm.rollback",
        "a broken candidate rolled back",
        "upgrade",
        "a broken candidate rolls back to the previous image",
    ),
    (
        "vm.node_reboot",
        "NodeReboot to the machine running again",
        "machines",
        "operation run NodeReboot restarts it from the agent's container",
    ),
];

/// The figures a check run gives: the checks of [`FROM_CHECKS`] (a failed or absent check is
/// not measured, and says so), and each group's setup (its wall time less its checks': the
/// snapshot restore). The offline repave is the bench's own VM figure (`vm.repave_offline`).
pub fn figures_from_checks(groups: Option<&[GroupTimes]>, source: &str) -> Vec<Figure> {
    let mut out = Vec::new();
    let Some(groups) = groups else {
        for (id, what, _, _) in FROM_CHECKS {
            out.push(Figure::missing(
                id,
                what,
                Unit::Seconds,
                "no check run recorded: run `cargo xtask check` first",
            ));
        }
        return out;
    };
    for (id, what, group, check) in FROM_CHECKS {
        let found = groups
            .iter()
            .filter(|g| g.name == *group)
            .flat_map(|g| &g.checks)
            .find(|(name, _, _)| name == check);
        out.push(match found {
            Some((_, secs, true)) => {
                Figure::measured(id, what, Unit::Seconds, vec![*secs]).from_source(source)
            }
            Some((_, _, false)) => Figure::missing(
                id,
                what,
                Unit::Seconds,
                format!("the check {check:?} did not pass in the last run"),
            ),
            None => Figure::missing(
                id,
                what,
                Unit::Seconds,
                format!("the last run did not run {group}: {check:?}"),
            ),
        });
    }
    for g in groups {
        let checks: f64 = g.checks.iter().map(|(_, s, _)| s).sum();
        out.push(
            Figure::measured(
                &format!("vm.setup.{}", g.name),
                &format!("{} group setup (snapshot restore)", g.name),
                Unit::Seconds,
                vec![(g.seconds - checks).max(0.0)],
            )
            .from_source(source),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Median, min, max, count.
    type Want = Option<(f64, f64, f64, usize)>;

    #[test]
    fn medians_and_spreads() {
        let cases: &[(&[f64], Want)] = &[
            (&[], None),
            (&[f64::NAN], None),
            (&[3.0], Some((3.0, 3.0, 3.0, 1))),
            (&[5.0, 1.0, 3.0], Some((3.0, 1.0, 5.0, 3))),
            (&[4.0, 1.0, 3.0, 2.0], Some((2.5, 1.0, 4.0, 4))),
            (&[2.0, f64::INFINITY, 4.0], Some((3.0, 2.0, 4.0, 2))),
        ];
        for (samples, want) in cases {
            let got = Summary::of(samples).map(|s| (s.median, s.min, s.max, s.n));
            assert_eq!(got, *want, "{samples:?}");
        }
        assert_eq!(Summary::of(&[1.0, 2.0, 3.0]).unwrap().spread(), 1.0);
        assert_eq!(Summary::of(&[0.0, 0.0]).unwrap().spread(), 0.0);
    }

    fn bench(figs: Vec<Figure>) -> Bench {
        Bench::new("abc", Some("tcg".into()), figs)
    }

    #[test]
    fn verdicts_against_the_baseline() {
        let base = bench(vec![
            Figure::measured("a", "A", Unit::Seconds, vec![10.0]),
            Figure::measured("z", "Z", Unit::Seconds, vec![0.0]),
            Figure::missing("m", "M", Unit::Seconds, "no VM"),
        ]);
        let cases = [
            (
                Figure::measured("a", "A", Unit::Seconds, vec![10.5]),
                "same",
            ),
            (
                Figure::measured("a", "A", Unit::Seconds, vec![13.0]),
                "regressed",
            ),
            (
                Figure::measured("a", "A", Unit::Seconds, vec![7.0]),
                "improved",
            ),
            (Figure::measured("b", "B", Unit::Seconds, vec![1.0]), "none"),
            (Figure::measured("m", "M", Unit::Seconds, vec![1.0]), "none"),
            (Figure::measured("z", "Z", Unit::Seconds, vec![0.0]), "same"),
            (
                Figure::missing("a", "A", Unit::Seconds, "why"),
                "not measured",
            ),
        ];
        for (f, want) in cases {
            let got = match compare(&f, Some(&base)) {
                Verdict::Same(_) => "same",
                Verdict::Regressed(_) => "regressed",
                Verdict::Improved(_) => "improved",
                Verdict::NoBaseline => "none",
                Verdict::NotMeasured => "not measured",
            };
            assert_eq!(got, want, "{f:?}");
        }
        assert_eq!(
            compare(&Figure::measured("a", "A", Unit::Seconds, vec![1.0]), None),
            Verdict::NoBaseline
        );
    }

    #[test]
    fn the_table_names_regressions_budgets_and_what_was_not_measured() {
        let base = bench(vec![Figure::measured(
            "image.compressed",
            "agent image, compressed",
            Unit::Bytes,
            vec![7_000_000.0],
        )]);
        let now = bench(vec![
            Figure::measured(
                "image.compressed",
                "agent image, compressed",
                Unit::Bytes,
                vec![9_000_000.0],
            )
            .with_budget(8_000_000.0),
            Figure::missing(
                "vm.controller_rss",
                "controller idle RSS",
                Unit::Bytes,
                "no controller runs offline",
            ),
        ]);
        let t = render_table(&now, Some(&base));
        assert!(t.contains("9.0 MB"), "{t}");
        assert!(t.contains("≤ 8.0 MB OVER"), "{t}");
        assert!(t.contains("1.29× REGRESSED"), "{t}");
        assert!(
            t.contains("not measured: no controller runs offline"),
            "{t}"
        );
        assert!(t.contains("regressions: image.compressed (1.29×)"), "{t}");
        assert!(t.contains("over budget: image.compressed"), "{t}");
        let clean = render_table(&base, Some(&base));
        assert!(clean.contains("regressions: none"), "{clean}");
        assert!(!clean.contains("over budget"), "{clean}");
    }

    #[test]
    fn figures_from_a_check_run() {
        let groups = vec![
            GroupTimes {
                name: "upgrade".into(),
                seconds: 100.0,
                checks: vec![
                    (FROM_CHECKS[0].3.into(), 40.0, true),
                    (FROM_CHECKS[1].3.into(), 25.0, false),
                ],
            },
            GroupTimes {
                name: "mounts".into(),
                seconds: 10.0,
                checks: vec![("x".into(), 12.0, true)],
            },
        ];
        let figs = figures_from_checks(Some(&groups), "check at abc");
        let get = |id: &str| figs.iter().find(|f| f.id == id).unwrap();
        assert_eq!(get("vm.upgrade").samples, [40.0]);
        assert_eq!(get("vm.upgrade").source.as_deref(), Some("check at abc"));
        assert!(
            get("vm.rollback")
                .not_measured
                .as_deref()
                .unwrap()
                .contains("did not pass")
        );
        assert!(
            get("vm.node_reboot")
                .not_measured
                .as_deref()
                .unwrap()
                .contains("did not run machines")
        );
        assert_eq!(get("vm.setup.upgrade").samples, [35.0]);
        assert_eq!(get("vm.setup.mounts").samples, [0.0], "never negative");
        assert!(
            figs.iter().all(|f| f.id != "vm.repave_offline"),
            "the bench measures the offline repave itself"
        );
        let none = figures_from_checks(None, "");
        assert!(none.iter().all(|f| f.not_measured.is_some()), "{none:?}");
    }

    #[test]
    fn bench_files_round_trip_and_refuse_other_formats() {
        let b = bench(vec![
            Figure::measured("a", "A", Unit::Ratio, vec![0.5, 0.6]).from_source("here"),
            Figure::missing("b", "B", Unit::Bytes, "no VM"),
        ]);
        let text = serde_json::to_string_pretty(&b).unwrap();
        assert_eq!(Bench::parse(&text).unwrap(), b);
        let other = text.replace(FORMAT, "something/v9");
        assert!(
            Bench::parse(&other)
                .unwrap_err()
                .to_string()
                .contains("something/v9")
        );
        assert!(Bench::parse("{").unwrap_err().to_string().contains(FORMAT));
    }
}
