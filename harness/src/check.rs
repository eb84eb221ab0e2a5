//! What every check is made of, in one leaf module the check modules share: the context a
//! check runs against ([`Ctx`]: the VM, its SSH access, whether a cluster is there, and the
//! [`Runner`] every command goes through, so a check runs against a fake as well as against the
//! guest), a check ([`Check`]: a name and a [`CheckFn`], made with the one [`check!`] macro),
//! and a group ([`Group`]: name, description, what it needs, its checks and what it is in host
//! mode ([`HostMode`]), defined once beside its checks).

use std::time::{Duration, Instant};

use flex_host::runner::{Output, Runner};

use crate::report::{Checked, Step};
use crate::ssh::{Guest, Ssh};
use crate::state::State;

/// What a group needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// Only the VM (offline).
    Host,
    /// A cluster the node joins (kind with network access).
    Cluster,
}

/// What a group is when the agent runs on the host (`up --mode host`).
#[derive(Clone, Copy, Debug)]
pub enum HostMode {
    /// The group as it is: its checks choose by mode where the agent's tools run, or it needs a
    /// cluster, which host mode's offline VM does not have.
    Same,
    /// Its host variant runs instead, under the same name (so `--only` and the reports are the
    /// same).
    Variant(&'static Group),
    /// It is reported skipped with this reason.
    Skip(&'static str),
}

/// The skip reason of the groups whose checks only mean something with the agent in its
/// container.
pub const IMAGE_MODE_ONLY: &str =
    "the agent runs on the host (up --mode host): this group checks the agent's container";

/// A check group: everything about it, in one definition beside its checks.
#[derive(Clone, Copy, Debug)]
pub struct Group {
    /// Name used with `--only`.
    pub name: &'static str,
    /// What it checks.
    pub description: &'static str,
    /// What it needs.
    pub needs: Needs,
    /// Its checks, in order.
    pub checks: &'static [Check],
    /// What it is in host mode.
    pub in_host_mode: HostMode,
}

/// What checks can reach.
pub struct Ctx<'a> {
    /// The VM.
    pub state: &'a State,
    /// The guest.
    pub ssh: &'a Ssh,
    /// Whether a cluster is there.
    pub cluster: bool,
    /// Every command of a check (in the guest or on the host) goes through it.
    pub runner: &'a dyn Runner,
}

impl<'a> Ctx<'a> {
    /// The guest's root shell through this context's runner.
    pub fn guest(&self) -> Guest<'a> {
        Guest::new(self.runner, self.ssh)
    }

    /// Runs `script` as root in the guest; the output whatever the exit code.
    pub async fn output(&self, script: &str, timeout: Duration) -> anyhow::Result<Output> {
        self.ssh.output(self.runner, script, timeout).await
    }

    /// Runs `script` as root in the guest; its stdout, or an error unless it exits 0.
    pub async fn run(&self, script: &str, timeout: Duration) -> anyhow::Result<String> {
        self.ssh.run(self.runner, script, timeout).await
    }
}

/// A check: runs against the context, says how it ended (and, optionally, a detail).
pub type CheckFn =
    for<'a> fn(&'a Ctx<'a>) -> futures::future::BoxFuture<'a, anyhow::Result<Checked>>;

/// A named check of a group.
#[derive(Clone, Copy)]
pub struct Check {
    /// What it checks, as the report names it.
    pub name: &'static str,
    /// The check.
    pub run: CheckFn,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check").field("name", &self.name).finish()
    }
}

/// A [`Check`] named `$name` that runs the async fn `$f` (which returns
/// `anyhow::Result<impl Into<Checked>>`). `$f` takes `&Ctx`, or, with `via $via`, whatever
/// `$via` hands it: `$via(ctx, f)` is an async fn that runs `f` (a non-capturing fn over its
/// own view of the context, such as a cluster check's environment) and may add to its result
/// (such as the journal on a failure).
macro_rules! check {
    ($name:literal, $f:path) => {
        $crate::check::Check {
            name: $name,
            run: |c| {
                ::std::boxed::Box::pin(
                    async move { $f(c).await.map($crate::report::Checked::from) },
                )
            },
        }
    };
    ($name:literal, $f:path, via $via:path) => {
        $crate::check::Check {
            name: $name,
            run: |c| {
                ::std::boxed::Box::pin($via(c, |e| {
                    ::std::boxed::Box::pin(
                        async move { $f(e).await.map($crate::report::Checked::from) },
                    )
                }))
            },
        }
    };
}
pub(crate) use check;

/// `Ok` when `cond` holds, else the error `msg` describes.
pub fn ensure(cond: bool, msg: impl FnOnce() -> String) -> anyhow::Result<()> {
    if cond {
        Ok(())
    } else {
        Err(anyhow::anyhow!(msg()))
    }
}

/// A check's stopwatch: each [`Laps::lap`] ends a step, named for what it did or waited for,
/// and the steps go into the report with [`Checked::with_steps`] (the timing table lists them
/// under the check), so where a check spends its time is on record, run by run.
#[derive(Debug)]
pub struct Laps {
    last: Instant,
    steps: Vec<Step>,
}

impl Laps {
    /// Starts the first step now.
    pub fn start() -> Self {
        Self {
            last: Instant::now(),
            steps: Vec::new(),
        }
    }

    /// Ends the current step as `name` and starts the next; returns the step's time.
    pub fn lap(&mut self, name: impl Into<String>) -> Duration {
        self.lap_at(name, Instant::now())
    }

    /// Ends the current step as `name` at `at` (an instant a wait noted, such as when it first
    /// saw something; one before the step's start counts as its start) and starts the next
    /// there; returns the step's time.
    pub fn lap_at(&mut self, name: impl Into<String>, at: Instant) -> Duration {
        let at = at.max(self.last);
        let d = at.duration_since(self.last);
        self.last = at;
        self.steps.push(Step {
            name: name.into(),
            duration: d,
        });
        d
    }

    /// The steps so far.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The steps, for [`Checked::with_steps`].
    pub fn into_steps(self) -> Vec<Step> {
        self.steps
    }
}

/// How a polling wait went: `N looks, median X` (each look's own time, which is what a wait
/// spends beside its interval).
pub fn looks_note(looks: &[Duration]) -> String {
    let mut sorted = looks.to_vec();
    sorted.sort();
    match sorted.get(sorted.len() / 2) {
        Some(m) => format!(
            "{} look{}, median {}",
            sorted.len(),
            if sorted.len() == 1 { "" } else { "s" },
            secs(*m)
        ),
        None => "no look".into(),
    }
}

/// A duration as the checks' details show it: `12.3s`.
pub fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// The journal lines that explain a failure: the agent's units and the machines.
pub async fn failure_journal(r: &dyn Runner, ssh: &Ssh) -> String {
    ssh.output(
        r,
        "journalctl -b --no-pager -o short-monotonic -n 120 -u 'aks-flex-node-*' -u 'systemd-nspawn@*' -u containerd.service 2>&1 | tail -n 120",
        Duration::from_secs(120),
    )
    .await
    .map(|o| o.stdout)
    .unwrap_or_else(|e| format!("(journal unavailable: {e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_end_each_step_where_the_next_starts() {
        let mut l = Laps::start();
        let t0 = l.last;
        let first = l.lap_at("first", t0 + Duration::from_millis(1500));
        let second = l.lap_at("second", t0 + Duration::from_millis(4000));
        // An instant before the current step's start counts as its start: zero, not negative.
        let third = l.lap_at("third", t0);
        assert_eq!(first, Duration::from_millis(1500));
        assert_eq!(second, Duration::from_millis(2500));
        assert_eq!(third, Duration::ZERO);
        let names: Vec<&str> = l.steps().iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["first", "second", "third"]);
        assert_eq!(l.into_steps().len(), 3);
    }

    #[test]
    fn looks_are_counted_with_their_median() {
        let ms = Duration::from_millis;
        assert_eq!(looks_note(&[]), "no look");
        assert_eq!(looks_note(&[ms(900)]), "1 look, median 0.9s");
        assert_eq!(
            looks_note(&[ms(3000), ms(1000), ms(1200)]),
            "3 looks, median 1.2s"
        );
    }
}
