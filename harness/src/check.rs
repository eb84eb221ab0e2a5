//! What every check is made of, in one leaf module the check modules share: the context a
//! check runs against ([`Ctx`]: the VM, its SSH access, whether a cluster is there, and the
//! [`Runner`] every command goes through, so a check runs against a fake as well as against the
//! guest), a check ([`Check`]: a name and a [`CheckFn`], made with the one [`check!`] macro),
//! and a group ([`Group`]: name, description, what it needs, its checks and what it is in host
//! mode ([`HostMode`]), defined once beside its checks).

use std::time::Duration;

use flex_host::runner::{Output, Runner};

use crate::report::Checked;
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
