//! `aks-flex-node status`: what the gatherer found on the node ([`Facts`]), the pure verdict
//! over it ([`assess`] → [`Report`]), and its two renderings ([`render_text`], [`render_json`]).
//! The JSON is a stable schema ([`SCHEMA`]; see `docs/status.md`): fields are only ever added.
//! Each record the gatherer reads is a [`Read`] (`Ok`, `Missing`, `Unreadable`, `Error`). The
//! harness parses the agent's JSON with this type (`flex_harness::node_status`).

use serde::{Deserialize, Serialize};

/// The JSON report's `schema`.
pub const SCHEMA: &str = "aks-flex-node.status/v1";

/// How one record file read: there, absent, there but untrustworthy (truncated, checksum
/// mismatch, does not decode), or not readable at all (the file system failed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "camelCase")]
pub enum Read<T> {
    /// The record, verified.
    Ok {
        /// Its content.
        value: T,
    },
    /// No such file.
    Missing,
    /// The file is there but cannot be trusted.
    Unreadable {
        /// Why.
        error: String,
    },
    /// Reading failed (permissions, I/O).
    Error {
        /// Why.
        error: String,
    },
}

impl<T> Default for Read<T> {
    /// [`Read::Missing`]: a report from an agent that did not gather the record.
    fn default() -> Self {
        Read::Missing
    }
}

impl<T> Read<T> {
    /// The value, when read.
    pub fn value(&self) -> Option<&T> {
        match self {
            Read::Ok { value } => Some(value),
            _ => None,
        }
    }

    /// The error, when there is one.
    pub fn error(&self) -> Option<&str> {
        match self {
            Read::Unreadable { error } | Read::Error { error } => Some(error),
            _ => None,
        }
    }
}

/// The daemon state, as status shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateView {
    /// `kube1` or `kube2` (as recorded; [`assess`] checks it).
    pub active_machine: String,
    /// The applied goal's settings version (its eTag).
    pub applied_settings_version: String,
    /// The applied goal's Kubernetes version.
    pub applied_kubernetes_version: String,
}

/// The running agent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentView {
    /// `binary` (a host's blue/green slots) or `image` (the agent's container).
    pub mode: String,
    /// This agent's version.
    pub version: String,
    /// What is selected to run: a slot (`blue`/`green`) or an image reference.
    pub current: Option<String>,
    /// What last proved itself (what recovery runs and rolls back to).
    pub last_good: Option<String>,
    /// The selected image's digest in containerd (image mode).
    pub image_digest: Option<String>,
}

/// The upgrade record, as status shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeView {
    /// `staged`, `switched` or `finished`.
    pub stage: String,
    /// What ran before.
    pub previous: String,
    /// What the upgrade switches to.
    pub candidate: String,
    /// When it started.
    pub started_at: String,
    /// The MachineOperation's name, when it came from the cluster.
    pub operation: Option<String>,
    /// Its result, once finished.
    pub result: Option<ResultView>,
}

/// The last step of the node's latest drain (the agent's record of the Event it recorded on
/// the Node: cordoned, evicted, blocked by a PodDisruptionBudget, waiting for a disruption
/// slot, drained, timed out, uncordoned).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainView {
    /// The Event's reason (`Cordoned`, `EvictionBlocked`, `WaitingForDisruptionSlot`, …).
    pub reason: String,
    /// The Event's note.
    pub note: String,
    /// Whether it was a warning.
    pub warning: bool,
    /// When (RFC 3339).
    pub at: String,
}

/// An operation's result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResultView {
    /// `Complete` or `Failed`.
    pub phase: String,
    /// Machine-readable reason.
    pub reason: String,
    /// For people.
    pub message: String,
}

/// One MachineOperation record (newest first in [`Facts::operations`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationView {
    /// The record file's name.
    pub file: String,
    /// The operation's name (empty when the record is unreadable).
    pub name: String,
    /// Its kind.
    pub kind: String,
    /// `claimed`, `executing`, `finished`, … (empty when unreadable).
    pub stage: String,
    /// When this agent claimed it.
    pub started_at: String,
    /// Its result, once finished.
    pub result: Option<ResultView>,
    /// Why the record cannot be read, when it cannot.
    pub error: Option<String>,
}

/// A systemd unit's state, or why it could not be asked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitView {
    /// The unit.
    pub name: String,
    /// `ActiveState` (empty when systemd could not be asked).
    pub active_state: String,
    /// `SubState`.
    pub sub_state: String,
    /// `Result`.
    pub result: String,
    /// Why systemd could not be asked.
    pub error: Option<String>,
}

/// kubelet's health inside the active machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "camelCase")]
pub enum KubeletView {
    /// `kubelet.service` is active in the machine.
    Active {
        /// The machine.
        machine: String,
    },
    /// It is not.
    Inactive {
        /// The machine.
        machine: String,
        /// What the probe said.
        detail: String,
    },
    /// Not probed (no active machine, or the probe could not run).
    Unknown {
        /// Why.
        reason: String,
    },
}

/// What the gatherer found; [`assess`] judges it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Facts {
    /// The daemon state (`/etc/aks-flex-node/daemon-state.json`).
    pub state: Read<StateView>,
    /// The bootstrap-complete mark (its agent version).
    pub bootstrap_mark: Read<String>,
    /// The agent.
    pub agent: AgentView,
    /// The upgrade record.
    pub upgrade: Read<UpgradeView>,
    /// The last MachineOperation records, newest first.
    pub operations: Vec<OperationView>,
    /// The agent's and recovery units and both machines' units.
    pub units: Vec<UnitView>,
    /// kubelet.
    pub kubelet: KubeletView,
    /// Why containerd could not be asked (image mode), if it could not.
    pub containerd_error: Option<String>,
    /// The last step of the latest drain (`Missing` when the node never drained).
    #[serde(default)]
    pub drain: Read<DrainView>,
}

/// The agent's unit (what must be active). The one definition of the unit names: the harness
/// uses these.
pub const AGENT_UNIT: &str = "aks-flex-node-agent.service";
/// The recovery unit (must not be failed).
pub const RECOVERY_UNIT: &str = "aks-flex-node-recovery.service";
/// How the transient units of a scheduled restart of the agent are named: this, then a number
/// (`.timer` and `.service`). While one exists, a restart is on its way.
pub const RESTART_UNIT_PREFIX: &str = "aks-flex-node-restart-";

/// A machine's unit.
pub fn machine_unit(machine: &str) -> String {
    format!("systemd-nspawn@{machine}.service")
}

/// One reason the node is not healthy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// Stable, machine-readable: see [`codes`].
    pub code: String,
    /// For people.
    pub message: String,
}

/// The problem codes (stable; documented in `docs/status.md`).
pub mod codes {
    /// No daemon state and no bootstrap mark: this host was never bootstrapped.
    pub const NOT_BOOTSTRAPPED: &str = "NotBootstrapped";
    /// A daemon state but no bootstrap mark: the bootstrap did not finish.
    pub const BOOTSTRAP_UNFINISHED: &str = "BootstrapUnfinished";
    /// The daemon state is there but cannot be trusted (or read).
    pub const STATE_UNREADABLE: &str = "StateUnreadable";
    /// The daemon state names no valid active machine.
    pub const STATE_INVALID: &str = "StateInvalid";
    /// A record other than the daemon state (upgrade, operation, mark) cannot be read.
    pub const RECORD_UNREADABLE: &str = "RecordUnreadable";
    /// systemd could not be asked.
    pub const SYSTEMD_UNREACHABLE: &str = "SystemdUnreachable";
    /// containerd could not be asked (the agent's container).
    pub const CONTAINERD_UNREACHABLE: &str = "ContainerdUnreachable";
    /// The agent's unit is not active.
    pub const AGENT_NOT_ACTIVE: &str = "AgentNotActive";
    /// The recovery unit failed.
    pub const RECOVERY_FAILED: &str = "RecoveryFailed";
    /// The active machine's unit is not active.
    pub const MACHINE_NOT_RUNNING: &str = "MachineNotRunning";
    /// kubelet is not active in the active machine.
    pub const KUBELET_UNHEALTHY: &str = "KubeletUnhealthy";
    /// An upgrade is in flight or its agent has not proven itself (`current` ≠ `last-good`).
    pub const UPGRADE_UNPROVEN: &str = "UpgradeUnproven";
}

/// The verdict and what it is based on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// [`SCHEMA`].
    pub schema: String,
    /// No problems.
    pub healthy: bool,
    /// Why not, most fundamental first.
    pub problems: Vec<Problem>,
    /// What was found.
    #[serde(flatten)]
    pub facts: Facts,
}

fn unit<'a>(facts: &'a Facts, name: &str) -> Option<&'a UnitView> {
    facts.units.iter().find(|u| u.name == name)
}

/// Judges `facts`. Problems that follow from an earlier one are left out (a host never
/// bootstrapped has no agent unit to be inactive; a stopped machine has no kubelet to ask).
pub fn assess(facts: Facts) -> Report {
    let mut problems = Vec::new();
    let mut p = |code: &str, message: String| {
        problems.push(Problem {
            code: code.into(),
            message: one_line(&message),
        })
    };
    let systemd_errors: Vec<&UnitView> = facts.units.iter().filter(|u| u.error.is_some()).collect();
    if let Some(u) = systemd_errors.first() {
        p(
            codes::SYSTEMD_UNREACHABLE,
            format!(
                "systemd unreachable: {}",
                u.error.as_deref().unwrap_or_default()
            ),
        );
    }
    if let Some(e) = &facts.containerd_error {
        p(
            codes::CONTAINERD_UNREACHABLE,
            format!("containerd unreachable: {e}"),
        );
    }
    let mut active: Option<&str> = None;
    let bootstrapped = match (&facts.state, &facts.bootstrap_mark) {
        (Read::Missing, Read::Missing) => {
            p(
                codes::NOT_BOOTSTRAPPED,
                "never bootstrapped: no daemon state and no bootstrap mark".into(),
            );
            false
        }
        (Read::Missing, Read::Ok { .. }) => {
            p(
                codes::STATE_UNREADABLE,
                "no daemon state, though the bootstrap is marked complete".into(),
            );
            true
        }
        (Read::Missing, Read::Unreadable { error } | Read::Error { error }) => {
            p(
                codes::STATE_UNREADABLE,
                format!("no daemon state, and the bootstrap mark is unreadable: {error}"),
            );
            true
        }
        (Read::Unreadable { error } | Read::Error { error }, _) => {
            p(
                codes::STATE_UNREADABLE,
                format!("daemon state unreadable: {error}"),
            );
            true
        }
        (Read::Ok { value }, mark) => {
            match value.active_machine.as_str() {
                m @ ("kube1" | "kube2") => active = Some(m),
                "" => p(
                    codes::STATE_INVALID,
                    "daemon state names no active machine".into(),
                ),
                other => p(
                    codes::STATE_INVALID,
                    format!("daemon state's active machine {other:?} is not kube1 or kube2"),
                ),
            }
            match mark {
                Read::Ok { .. } => {}
                Read::Missing => p(
                    codes::BOOTSTRAP_UNFINISHED,
                    "bootstrap not marked complete (bootstrap-node finishes it)".into(),
                ),
                Read::Unreadable { error } | Read::Error { error } => p(
                    codes::BOOTSTRAP_UNFINISHED,
                    format!("bootstrap mark unreadable: {error}"),
                ),
            }
            true
        }
    };
    if let Some(e) = facts.upgrade.error() {
        p(
            codes::RECORD_UNREADABLE,
            format!("upgrade record unreadable: {e}"),
        );
    }
    for o in &facts.operations {
        if let Some(e) = &o.error {
            p(
                codes::RECORD_UNREADABLE,
                format!("operation record {} unreadable: {e}", o.file),
            );
        }
    }
    if bootstrapped {
        let known = |name: &str| unit(&facts, name).filter(|u| u.error.is_none());
        if let Some(u) = known(AGENT_UNIT)
            && u.active_state != "active"
        {
            p(
                codes::AGENT_NOT_ACTIVE,
                format!(
                    "{AGENT_UNIT} is {}/{} (result {})",
                    u.active_state, u.sub_state, u.result
                ),
            );
        }
        if let Some(u) = known(RECOVERY_UNIT)
            && u.active_state == "failed"
        {
            p(
                codes::RECOVERY_FAILED,
                format!("{RECOVERY_UNIT} failed (result {})", u.result),
            );
        }
        let mut machine_up = false;
        if let Some(m) = active {
            let name = machine_unit(m);
            match known(&name) {
                Some(u) if u.active_state == "active" => machine_up = true,
                Some(u) => p(
                    codes::MACHINE_NOT_RUNNING,
                    format!(
                        "active machine {m}: {name} is {}/{}",
                        u.active_state, u.sub_state
                    ),
                ),
                None => {}
            }
        }
        if machine_up {
            match &facts.kubelet {
                KubeletView::Active { .. } => {}
                KubeletView::Inactive { machine, detail } => p(
                    codes::KUBELET_UNHEALTHY,
                    format!("kubelet.service in {machine} is not active: {detail}"),
                ),
                KubeletView::Unknown { reason } => p(
                    codes::KUBELET_UNHEALTHY,
                    format!("kubelet's health unknown: {reason}"),
                ),
            }
        }
        let in_flight = facts
            .upgrade
            .value()
            .filter(|u| u.stage != "finished")
            .map(|u| {
                format!(
                    "upgrade from {} to {} in flight (stage {})",
                    u.previous, u.candidate, u.stage
                )
            });
        let unproven = match (&facts.agent.current, &facts.agent.last_good) {
            (Some(c), Some(g)) if c != g => Some(format!(
                "selected agent {c} has not proven itself (last good: {g})"
            )),
            _ => None,
        };
        if let Some(m) = in_flight.or(unproven) {
            p(codes::UPGRADE_UNPROVEN, m);
        }
    }
    Report {
        schema: SCHEMA.into(),
        healthy: problems.is_empty(),
        problems,
        facts,
    }
}

/// The report as pretty JSON (the stable schema), with a final newline.
pub fn render_json(r: &Report) -> String {
    let mut s = serde_json::to_string_pretty(r).unwrap_or_else(|e| {
        serde_json::json!({"schema": SCHEMA, "healthy": false, "error": e.to_string()}).to_string()
    });
    s.push('\n');
    s
}

/// `s` on one line (a command's stderr often spans several).
fn one_line(s: &str) -> String {
    s.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}

fn or_dash(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("-")
}

fn read_line<T>(r: &Read<T>, show: impl Fn(&T) -> String) -> String {
    match r {
        Read::Ok { value } => show(value),
        Read::Missing => "none".into(),
        Read::Unreadable { error } => format!("UNREADABLE ({error})"),
        Read::Error { error } => format!("ERROR ({error})"),
    }
}

fn result_line(r: &Option<ResultView>) -> String {
    match r {
        Some(r) => format!("{} {}: {}", r.phase, r.reason, r.message),
        None => "in progress".into(),
    }
}

/// The report for people: the verdict first, then each fact on its own line.
pub fn render_text(r: &Report) -> String {
    let f = &r.facts;
    let mut s = String::new();
    if r.healthy {
        s.push_str("healthy\n");
    } else {
        s.push_str("NOT HEALTHY\n");
        for p in &r.problems {
            s.push_str(&format!("  - {}: {}\n", p.code, p.message));
        }
    }
    s.push_str(&format!(
        "state:          {}\n",
        read_line(&f.state, |v| format!(
            "active machine {}, goal {} (eTag {})",
            if v.active_machine.is_empty() {
                "-"
            } else {
                &v.active_machine
            },
            if v.applied_kubernetes_version.is_empty() {
                "-"
            } else {
                &v.applied_kubernetes_version
            },
            if v.applied_settings_version.is_empty() {
                "-"
            } else {
                &v.applied_settings_version
            },
        ))
    ));
    s.push_str(&format!(
        "bootstrap mark: {}\n",
        read_line(&f.bootstrap_mark, |v| format!("complete (agent {v})"))
    ));
    s.push_str(&format!(
        "agent:          {} {} (mode {}; current {}, last good {}",
        "version",
        f.agent.version,
        f.agent.mode,
        or_dash(&f.agent.current),
        or_dash(&f.agent.last_good),
    ));
    if let Some(d) = &f.agent.image_digest {
        s.push_str(&format!(", digest {d}"));
    }
    s.push_str(")\n");
    s.push_str(&format!(
        "upgrade:        {}\n",
        read_line(&f.upgrade, |u| format!(
            "{} -> {} ({}, started {}{}): {}",
            u.previous,
            u.candidate,
            u.stage,
            u.started_at,
            u.operation
                .as_deref()
                .map(|o| format!(", operation {o}"))
                .unwrap_or_default(),
            result_line(&u.result)
        ))
    ));
    if f.operations.is_empty() {
        s.push_str("operations:     none\n");
    } else {
        s.push_str("operations:\n");
        for o in &f.operations {
            match &o.error {
                Some(e) => s.push_str(&format!("  {}: UNREADABLE ({e})\n", o.file)),
                None => s.push_str(&format!(
                    "  {} {} ({}, started {}): {}\n",
                    o.kind,
                    o.name,
                    o.stage,
                    o.started_at,
                    result_line(&o.result)
                )),
            }
        }
    }
    s.push_str(&format!(
        "drain:          {}\n",
        read_line(&f.drain, |d| format!(
            "{}{} at {}: {}",
            d.reason,
            if d.warning { " (warning)" } else { "" },
            d.at,
            one_line(&d.note)
        ))
    ));
    s.push_str("units:\n");
    for u in &f.units {
        match &u.error {
            Some(e) => s.push_str(&format!("  {}: UNKNOWN ({})\n", u.name, one_line(e))),
            None => s.push_str(&format!(
                "  {}: {}/{} (result {})\n",
                u.name, u.active_state, u.sub_state, u.result
            )),
        }
    }
    s.push_str(&format!(
        "kubelet:        {}\n",
        match &f.kubelet {
            KubeletView::Active { machine } => format!("active in {machine}"),
            KubeletView::Inactive { machine, detail } =>
                format!("NOT ACTIVE in {machine} ({detail})"),
            KubeletView::Unknown { reason } => format!("unknown ({reason})"),
        }
    ));
    if let Some(e) = &f.containerd_error {
        s.push_str(&format!("containerd:     UNREACHABLE ({e})\n"));
    }
    s
}

#[cfg(test)]
mod tests;
