//! The `faults` check group (offline): each case starts from the bootstrapped snapshot, forces
//! one fault at its exact moment, and passes when the node ends with the agent and its machine
//! running, or with the fault reported clearly and nothing lost. See `docs/faults.md`.
//!
//! A fault point in the agent (`flex_host::fault`) is armed for one unit by a runtime drop-in,
//! `/run/systemd/system/<unit>.d/50-harness-fault.conf`, that adds
//! `EnvironmentFile=/run/aks-flex-faults/<unit>.env` with
//! `AKS_FLEX_NODE_CTR_RUN_ARGS=--env AKS_FLEX_NODE_FAULT=<point>:hang`: the unit's `ctr run`
//! passes it into the container, whose processes (the daemon and the `operation run` the
//! harness execs into it, or `start` in the bootstrap container) stop at the point and say so
//! on stderr. The harness waits for that line, removes the drop-in (a power cut also clears
//! `/run`), and then cuts: `kill -9` of every process of the unit's container
//! (`ctr tasks kill -a -s SIGKILL`), or a power cut (QMP `system_reset`, no shutdown). From the
//! cut it waits, bounded, for the node to be healthy ([`verdict`]) and reports how long that
//! took and what the agent logged meanwhile.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::check::{Ctx, Group, HostMode, IMAGE_MODE_ONLY, Needs, check, ensure, secs};
use crate::kit::candidates::{self, Kind};
use crate::kit::upgrade_status::{self as status, Probe, short};
use crate::report::{Checked, Outcome};
use crate::ssh::shell_quote;

pub use flex_api::status::{AGENT_UNIT, RECOVERY_UNIT};
/// The bootstrap unit (runs `start` through `aks-flex-node-bootstrap`).
pub const BOOTSTRAP_UNIT: &str = "aks-flex-node-bootstrap.service";
/// Where the arming env files live (cleared by a power cut).
pub const FAULT_DIR: &str = "/run/aks-flex-faults";
/// The drop-in's file name.
pub const DROPIN: &str = "50-harness-fault.conf";
/// Selects cases by id substring (comma-separated); the others are skipped, saying so.
pub const ONLY_ENV: &str = "AKS_FLEX_FAULTS_ONLY";

const T: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_secs(2);
/// How long a case waits for its fault point to be reached.
const REACH_TIMEOUT: Duration = Duration::from_secs(1200);
/// How long the node has, from the cut, to be healthy again.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(600);
/// How long unchanged problems, with none of the agent's units activating, end the wait.
const STUCK: Duration = Duration::from_secs(150);
const BOOT_TIMEOUT: Duration = Duration::from_secs(600);
const OPERATION_TIMEOUT: Duration = Duration::from_secs(600);

/// The unit whose container a fault is armed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// `aks-flex-node-agent.service` (the daemon, and `operation run` exec'd into it).
    Agent,
    /// `aks-flex-node-bootstrap.service` (`start`).
    Bootstrap,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Agent => AGENT_UNIT,
            Unit::Bootstrap => BOOTSTRAP_UNIT,
        }
    }

    fn container(self) -> &'static str {
        match self {
            Unit::Agent => "aks-flex-agent",
            Unit::Bootstrap => "aks-flex-bootstrap",
        }
    }
}

/// How the fault ends the process at the point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// `kill -9` of every process of the unit's container.
    Kill,
    /// A VM reset without shutdown.
    Power,
}

/// What a case does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Reset the node, then bootstrap it with the point armed in the bootstrap unit; after a
    /// kill, the bootstrap unit runs again as the next boot would run it.
    Start,
    /// An AgentUpgrade (`operation run` in the agent's container) to the candidate, the point
    /// armed in the agent's unit.
    Upgrade(Kind),
    /// `systemctl restart containerd` while the agent runs.
    ContainerdRestart,
    /// The registry unreachable from the guest while an AgentUpgrade pulls its candidate.
    RegistryDown,
    /// A small file system on `/var/lib/machines` while `start` unpacks the machine's rootfs.
    VarFull,
    /// A node-local repave (`aks-flex-node repave`, exec'd into the agent's container), the
    /// point armed in the agent's unit; the restarted daemon (after a kill) or the booted one
    /// (after a power cut) finishes it from its journal.
    Repave,
    /// The daemon's credential store saving a new key and certificate (the save a rotation
    /// runs), on a scratch root through `aks-flex-node debug credential-store` exec'd into the
    /// agent's container; afterwards the store must load the old pair or the new, whole.
    CertStore,
    /// Not run offline, for the reason given.
    Skip(&'static str),
}

/// One fault.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// Short id (for [`ONLY_ENV`]).
    pub id: &'static str,
    /// The fault point, if the case uses one.
    pub point: Option<&'static str>,
    /// Where it is armed.
    pub unit: Unit,
    /// How the process ends there.
    pub cut: Cut,
    /// What the case does.
    pub scenario: Scenario,
}

/// One row of the group's closing table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The case's id.
    pub id: String,
    /// What the agent did (journal lines and the final state).
    pub did: String,
    /// From the cut to healthy, if it got there.
    pub recovery: Option<Duration>,
    /// Survived, failed or skipped.
    pub outcome: Outcome,
}

static ROWS: Mutex<Vec<Row>> = Mutex::new(Vec::new());

fn push_row(row: Row) {
    if let Ok(mut rows) = ROWS.lock() {
        rows.retain(|r| r.id != row.id);
        rows.push(row);
    }
}

macro_rules! cases {
    ($($f:ident: $name:literal => $case:expr;)*) => {
        $(
            async fn $f(c: &Ctx<'_>) -> anyhow::Result<Checked> {
                run_case(c, &$case).await
            }
        )*
        /// Every case, in run order.
        pub const CASES: &[Case] = &[$($case),*];
        const CHECKS: &[crate::check::Check] = &[
            check!("the bootstrapped node is healthy before any fault", baseline),
            $(check!($name, $f),)*
            check!("faults survived", closing),
        ];
    };
}

const fn case(
    id: &'static str,
    point: &'static str,
    unit: Unit,
    cut: Cut,
    scenario: Scenario,
) -> Case {
    Case {
        id,
        point: Some(point),
        unit,
        cut,
        scenario,
    }
}

const fn plain(id: &'static str, scenario: Scenario) -> Case {
    Case {
        id,
        point: None,
        unit: Unit::Agent,
        cut: Cut::Kill,
        scenario,
    }
}

cases! {
    w1_state: "window 1: kill -9 of start midway through saving daemon-state.json" =>
        case("w1-state", "store.save-midway:daemon-state.json", Unit::Bootstrap, Cut::Kill, Scenario::Start);
    w1_journal: "window 1: kill -9 of a repave midway through saving its Starting journal (repave-state.json)" =>
        case("w1-journal", "store.save-midway:repave-state.json#3", Unit::Agent, Cut::Kill, Scenario::Repave);
    w2_agent_unit: "window 2: kill -9 of start after the daemon state, before the agent's unit" =>
        case("w2-agent-unit", "start.before-agent-unit", Unit::Bootstrap, Cut::Kill, Scenario::Start);
    w3_switch: "window 3: kill -9 right after the switch to a broken candidate" =>
        case("w3-switch", "upgrade.after-switch", Unit::Agent, Cut::Kill, Scenario::Upgrade(Kind::Broken));
    w3_record: "window 3: kill -9 while the switched upgrade record saves (broken candidate)" =>
        case("w3-record", "store.save-midway:pending.json#2", Unit::Agent, Cut::Kill, Scenario::Upgrade(Kind::Broken));
    w4_cert: "window 4: kill -9 midway through saving a new key and certificate" =>
        case("w4-cert", "cert.save-midway", Unit::Agent, Cut::Kill, Scenario::CertStore);
    w5_last_good: "window 5: a new upgrade overwrites last-good; symlink swaps not fsynced" =>
        case("w5-last-good", "upgrade.after-switch", Unit::Agent, Cut::Power, Scenario::Skip("binary mode only (the current/last-good slots and their symlinks): the host-mode upgrade group forces it (`up --mode host`, `check --only upgrade`); here the agent runs as a container, whose switch is agent-image.env written atomically and whose previous image stays in the record"));
    upgrade_staged: "kill -9 of the agent at AgentUpgrade stage staged" =>
        case("upgrade-staged", "upgrade.phase:staged", Unit::Agent, Cut::Kill, Scenario::Upgrade(Kind::Good));
    upgrade_switched: "kill -9 of the agent at AgentUpgrade stage switched" =>
        case("upgrade-switched", "upgrade.phase:switched", Unit::Agent, Cut::Kill, Scenario::Upgrade(Kind::Good));
    upgrade_finished: "kill -9 of the restarted agent at AgentUpgrade stage finished" =>
        case("upgrade-finished", "upgrade.phase:finished", Unit::Agent, Cut::Kill, Scenario::Upgrade(Kind::Good));
    upgrade_power: "a power cut in the middle of an upgrade (after the switch)" =>
        case("upgrade-power", "upgrade.after-switch", Unit::Agent, Cut::Power, Scenario::Upgrade(Kind::Good));
    start_provisioning: "kill -9 of start while it provisions the machine" =>
        case("start-provisioning", "provision.after-rootfs:kube1", Unit::Bootstrap, Cut::Kill, Scenario::Start);
    repave_power_preparing: "a power cut at repave phase preparing" =>
        case("repave-power-preparing", "repave.phase:preparing", Unit::Agent, Cut::Power, Scenario::Repave);
    repave_power_switching: "a power cut at repave phase switching" =>
        case("repave-power-switching", "repave.phase:switching", Unit::Agent, Cut::Power, Scenario::Repave);
    repave_power_starting: "a power cut at repave phase starting" =>
        case("repave-power-starting", "repave.phase:starting", Unit::Agent, Cut::Power, Scenario::Repave);
    repave_power_saving: "a power cut at repave phase saving" =>
        case("repave-power-saving", "repave.phase:saving", Unit::Agent, Cut::Power, Scenario::Repave);
    repave_power_cleaning: "a power cut at repave phase cleaning" =>
        case("repave-power-cleaning", "repave.phase:cleaning", Unit::Agent, Cut::Power, Scenario::Repave);
    registry_down: "the registry down during an upgrade pull" =>
        plain("registry-down", Scenario::RegistryDown);
    containerd_restart: "containerd restarted while the agent runs" =>
        plain("containerd-restart", Scenario::ContainerdRestart);
    var_full: "/var full while a machine rootfs unpacks" =>
        plain("var-full", Scenario::VarFull);
}

/// The `faults` group.
pub const GROUP: Group = Group {
    name: "faults",
    description: "kill -9 and power cuts at the agent's fault points (start, AgentUpgrade, a node-local repave), containerd restarted, the registry down, /var full: each ends with the agent and its machine running, or the fault reported and nothing lost",
    needs: Needs::Host,
    checks: CHECKS,
    in_host_mode: HostMode::Skip(IMAGE_MODE_ONLY),
};

/// Whether `id` is selected by the [`ONLY_ENV`] value `only`.
pub fn selected(only: Option<&str>, id: &str) -> bool {
    match only.map(str::trim).filter(|s| !s.is_empty()) {
        None => true,
        Some(only) => only
            .split(',')
            .map(str::trim)
            .any(|w| !w.is_empty() && id.contains(w)),
    }
}

/// The `AKS_FLEX_NODE_FAULT` value for `point`: always `hang`; the harness does the cut.
pub fn fault_spec(point: &str) -> String {
    format!("{point}:hang")
}

/// The line the agent writes when it reaches `point` armed by [`fault_spec`].
pub fn reached_line(point: &str) -> String {
    let name = point.split_once('#').map_or(point, |(n, _)| n);
    format!("fault point reached: {name}:hang")
}

/// The script that arms `point` for `unit` (then `systemctl daemon-reload`).
pub fn arm_script(unit: Unit, point: &str) -> String {
    let u = unit.name();
    format!(
        "mkdir -p /run/systemd/system/{u}.d {FAULT_DIR} && \
         printf '%s\\n' {env} > {FAULT_DIR}/{u}.env && \
         printf '[Service]\\nEnvironmentFile={FAULT_DIR}/{u}.env\\n' > /run/systemd/system/{u}.d/{DROPIN} && \
         systemctl daemon-reload",
        env = shell_quote(&format!(
            "AKS_FLEX_NODE_CTR_RUN_ARGS=--env AKS_FLEX_NODE_FAULT={}",
            fault_spec(point)
        ))
    )
}

/// The script that disarms every unit.
pub fn disarm_script() -> String {
    format!(
        "rm -f /run/systemd/system/{AGENT_UNIT}.d/{DROPIN} /run/systemd/system/{BOOTSTRAP_UNIT}.d/{DROPIN}; rm -rf {FAULT_DIR}; systemctl daemon-reload"
    )
}

/// What the health probe saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// `systemctl is-active` of the agent's unit.
    pub agent: String,
    /// Whether the agent's unit file is installed.
    pub agent_unit_file: bool,
    /// The agent's task status.
    pub task: String,
    /// The daemon state's `activeMachine`.
    pub machine: String,
    /// `machinectl show -p State` of it.
    pub machine_state: String,
    /// `systemctl is-active kubelet.service` inside it.
    pub kubelet: String,
    /// `machinectl show -p State` of the other side (empty when it is not running).
    pub other_state: String,
    /// Each record that exists and `ok` or what is wrong with it.
    pub records: Vec<(String, String)>,
    /// `systemctl is-active` of the bootstrap unit.
    pub bootstrap: String,
    /// `systemctl is-active` of the recovery unit.
    pub recovery: String,
}

impl Health {
    /// Whether a unit of the agent is on its way (starting, in its restart delay, recovering).
    pub fn moving(&self) -> bool {
        [&self.agent, &self.bootstrap, &self.recovery]
            .iter()
            .any(|s| matches!(s.as_str(), "activating" | "deactivating" | "reloading"))
    }
}

/// The probe script [`parse_health`] reads.
pub fn health_script() -> String {
    "echo \"agent=$(systemctl is-active aks-flex-node-agent.service)\"; \
     test -e /etc/systemd/system/aks-flex-node-agent.service && echo unit_file=yes; \
     echo \"bootstrap=$(systemctl is-active aks-flex-node-bootstrap.service)\"; \
     echo \"recovery=$(systemctl is-active aks-flex-node-recovery.service)\"; \
     ctr -n aks-flex tasks ls 2>/dev/null | awk '$1==\"aks-flex-agent\"{print \"task=\" $3}'; \
     for p in /etc/aks-flex-node/daemon-state.json /etc/aks-flex-node/repave-state.json /etc/aks-flex-node/upgrade/pending.json; do \
       test -e $p || continue; \
       if test -e $p.sha256; then c=$(base64 -w0 < $p.sha256); else c=-; fi; \
       echo \"recordb64=$(basename $p):$(base64 -w0 < $p):$c\"; done; \
     m=$(sed -n 's/.*\"activeMachine\": *\"\\([^\"]*\\)\".*/\\1/p' /etc/aks-flex-node/daemon-state.json 2>/dev/null); \
     echo \"machine=$m\"; \
     if [ -n \"$m\" ]; then \
       echo \"machine_state=$(machinectl show $m -p State --value 2>/dev/null)\"; \
       echo \"kubelet=$(timeout 60 systemd-run --machine=$m --pipe --wait --quiet systemctl is-active kubelet.service 2>/dev/null)\"; \
       if [ \"$m\" = kube1 ]; then o=kube2; else o=kube1; fi; \
       echo \"other_state=$(machinectl show $o -p State --value 2>/dev/null)\"; \
     fi; true"
        .to_string()
}

/// `ok`, or what is wrong with the guest's record `name` (its bytes and its legacy sidecar's,
/// base64; the sidecar `-` when there is none), judged by the harness's own reading of the
/// format ([`crate::guest_json::record_integrity`]).
fn record_status(name: &str, file_b64: &str, sidecar_b64: &str) -> String {
    use base64::Engine as _;
    let decode = |b64: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    };
    let Ok(text) = decode(file_b64) else {
        return format!("{name}: the guest's copy did not decode");
    };
    let sidecar = match sidecar_b64.trim() {
        "-" => None,
        b64 => decode(b64).ok(),
    };
    match crate::guest_json::record_integrity(name, &text, sidecar.as_deref()) {
        Ok(()) => "ok".to_string(),
        Err(e) => e.to_string(),
    }
}

/// Parses [`health_script`]'s output.
pub fn parse_health(text: &str) -> Health {
    let mut h = Health::default();
    for line in text.lines() {
        let Some((k, v)) = line.trim().split_once('=') else {
            continue;
        };
        let v = v.trim().to_string();
        match k {
            "agent" => h.agent = v,
            "unit_file" => h.agent_unit_file = v == "yes",
            "bootstrap" => h.bootstrap = v,
            "recovery" => h.recovery = v,
            "task" => h.task = v,
            "machine" => h.machine = v,
            "machine_state" => h.machine_state = v,
            "kubelet" => h.kubelet = v,
            "other_state" => h.other_state = v,
            "recordb64" => {
                let mut parts = v.splitn(3, ':');
                if let (Some(name), Some(file), Some(sidecar)) =
                    (parts.next(), parts.next(), parts.next())
                {
                    h.records
                        .push((name.to_string(), record_status(name, file, sidecar)));
                }
            }
            _ => {}
        }
    }
    h
}

/// What is wrong with the node, empty when it is healthy: the agent's unit installed, active,
/// its task running; each record the probe reads (daemon state, repave journal, upgrade record)
/// intact (an envelope whose payload matches its sha256, or a legacy JSON matching its
/// `.sha256`); an active
/// machine in the daemon state, running, with kubelet active inside it.
pub fn verdict(h: &Health) -> Vec<String> {
    let mut bad = Vec::new();
    if !h.agent_unit_file {
        bad.push("no agent unit installed".to_string());
    }
    if h.agent != "active" {
        bad.push(format!("agent unit {}", or_none(&h.agent)));
    } else if h.task != "RUNNING" {
        bad.push(format!("agent task {}", or_none(&h.task)));
    }
    // Each status names its record (record_status's messages start with it).
    for (_, s) in &h.records {
        if s != "ok" {
            bad.push(format!("unreadable record: {s}"));
        }
    }
    if h.machine.is_empty() {
        bad.push("no active machine in daemon-state.json".to_string());
    } else {
        if h.machine_state != "running" {
            bad.push(format!(
                "machine {} {}",
                h.machine,
                or_none(&h.machine_state)
            ));
        }
        if h.kubelet != "active" {
            bad.push(format!("kubelet in {} {}", h.machine, or_none(&h.kubelet)));
        }
    }
    bad
}

/// What is wrong with a repave after a fault, empty when settled: its journal gone (the repave
/// finished, or rolled back) and only the active side running.
pub fn repave_verdict(h: &Health) -> Vec<String> {
    let mut bad = Vec::new();
    if h.records.iter().any(|(n, _)| n == "repave-state.json") {
        bad.push("repave journal still there: the repave neither finished nor rolled back".into());
    }
    if !h.other_state.is_empty() {
        bad.push(format!("the other machine side is {}", h.other_state));
    }
    bad
}

fn or_none(s: &str) -> &str {
    if s.is_empty() { "none" } else { s }
}

/// What is wrong with an upgrade after a fault, empty when settled: no record, or a finished
/// record whose image the agent runs.
pub fn upgrade_verdict(p: &Probe) -> Vec<String> {
    match &p.record {
        None => Vec::new(),
        Some(r) if !r.finished() => vec![format!("upgrade record unfinished: {r}")],
        Some(r) => match r.expected_image() {
            Some(i) if p.runs(i) => Vec::new(),
            Some(i) => vec![format!(
                "record {}/{} names {}, the agent runs {}",
                r.phase,
                r.reason,
                short(i),
                p.image.as_deref().map_or("none".into(), short)
            )],
            None => vec![format!("record finished without a result: {r}")],
        },
    }
}

async fn sh(c: &Ctx<'_>, script: &str, t: Duration) -> anyhow::Result<String> {
    Ok(c.run(script, t).await?.trim().to_string())
}

async fn health(c: &Ctx<'_>) -> anyhow::Result<Health> {
    let o = c.output(&health_script(), T).await?;
    Ok(parse_health(&o.stdout))
}

/// What a case checks beyond the node's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Settle {
    /// The node's health alone.
    Node,
    /// And the upgrade finished ([`upgrade_verdict`]).
    Upgrade,
    /// And the repave finished or rolled back ([`repave_verdict`]).
    Repave,
}

/// The problems now (node, and the upgrade or the repave as `settle` says), and whether
/// anything is still moving (a unit of the agent activating).
async fn problems(c: &Ctx<'_>, settle: Settle) -> anyhow::Result<(Vec<String>, bool)> {
    let h = health(c).await?;
    let mut bad = verdict(&h);
    if settle == Settle::Repave && bad.is_empty() {
        bad.extend(repave_verdict(&h));
    }
    if settle == Settle::Upgrade && bad.is_empty() {
        let o = c.output(&status::probe_script(), T).await?;
        bad.extend(upgrade_verdict(&status::parse_probe(&o.stdout)));
    }
    Ok((bad, h.moving()))
}

/// Why the node was not healthy again after a fault ([`wait_healthy`]).
#[derive(Debug, thiserror::Error)]
enum NotRecovered {
    /// The same problems stayed for [`STUCK`] with none of the agent's units activating.
    #[error(
        "stuck for {} with nothing of the agent activating: {problems}",
        secs(STUCK)
    )]
    Stuck {
        /// The problems.
        problems: String,
    },
    /// [`RECOVERY_TIMEOUT`] passed.
    #[error("still after {}: {last_seen}", secs(RECOVERY_TIMEOUT))]
    TimedOut {
        /// The last problems seen (or the last answer).
        last_seen: String,
    },
}

/// Waits until the node is healthy; the time it took, or the last problems seen. It gives up
/// early when the same problems stay for [`STUCK`] with none of the agent's units activating:
/// nothing is left to repair them.
async fn wait_healthy(c: &Ctx<'_>, settle: Settle) -> Result<Duration, NotRecovered> {
    let t0 = Instant::now();
    let last = Mutex::new((String::new(), Instant::now()));
    let last = &last;
    let r = flex_host::retry::wait_until(
        "the node to be healthy",
        RECOVERY_TIMEOUT,
        POLL,
        || async move {
            match problems(c, settle).await {
                Ok((b, _)) if b.is_empty() => Ok(Ok(t0.elapsed())),
                Ok((b, moving)) => {
                    let s = b.join("; ");
                    let mut l = last.lock().unwrap_or_else(|e| e.into_inner());
                    if l.0 != s || moving {
                        *l = (s.clone(), Instant::now());
                    } else if l.1.elapsed() >= STUCK {
                        return Ok(Err(NotRecovered::Stuck { problems: s }));
                    }
                    Err(s)
                }
                Err(e) => Err(format!("no answer ({e:#})")),
            }
        },
    )
    .await;
    match r {
        Ok(r) => r,
        Err(e) => {
            let seen = last.lock().map(|l| l.0.clone()).unwrap_or_default();
            Err(NotRecovered::TimedOut {
                last_seen: if seen.is_empty() { e.last_seen } else { seen },
            })
        }
    }
}

/// The agent's notable journal lines since `since` (guest epoch seconds): warnings, errors,
/// recovery, rollback, the fault line; one line, shortened.
async fn agent_did(c: &Ctx<'_>, since: &str) -> String {
    let script = format!(
        "journalctl -b -o cat --no-pager --since @{since} -u {AGENT_UNIT} -u {RECOVERY_UNIT} -u {BOOTSTRAP_UNIT} -u 'harness-fault-*' 2>/dev/null \
         | grep -v ' DEBUG ' | grep -Ev 'HTTP\\{{|CertificateSigningRequest|kube client|discover|retrying' | grep -Ei 'WARN|ERROR|fail|roll|recover|resum|already bootstrapped|unreadable|no space|upgrade|fault point' \
         | sed -e 's/\\x1b\\[[0-9;]*m//g' | cut -c1-160 | tail -n 4"
    );
    match c.output(&script, T).await {
        Ok(o) if !o.stdout.trim().is_empty() => o
            .stdout
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" | "),
        Ok(_) => "nothing notable in the journal".into(),
        Err(e) => format!("(journal unavailable: {e:#})"),
    }
}

async fn guest_now(c: &Ctx<'_>) -> anyhow::Result<String> {
    sh(c, "date +%s", T).await
}

/// Waits for the agent's line for `point`, from the units' journals since `since`.
async fn wait_reached(c: &Ctx<'_>, point: &str, since: &str, unit: Unit) -> anyhow::Result<()> {
    let line = reached_line(point);
    let script = format!(
        "journalctl -b -o cat --no-pager --since @{since} -u {AGENT_UNIT} -u {BOOTSTRAP_UNIT} -u 'harness-fault-*' 2>/dev/null | grep -qF {}",
        shell_quote(&line)
    );
    let stop_on = format!("systemctl is-failed --quiet {}", unit.name());
    // The operation or repave the harness requested failed before the point: it will not be
    // reached (its unit is collected, so its journal says so).
    let op_failed = format!(
        "journalctl -b -o cat --no-pager --since @{since} -u 'harness-fault-*' 2>/dev/null | grep -m1 -F 'Command execution failed'"
    );
    flex_host::retry::wait_until(
        "the fault point to be reached",
        REACH_TIMEOUT,
        POLL,
        || async {
            match c.output(&script, T).await {
                Ok(o) if o.success() => Ok(Ok(())),
                _ => {
                    // The bootstrap unit failing before the point: it will not be reached.
                    if unit == Unit::Bootstrap
                        && c.output(&stop_on, T).await.is_ok_and(|o| o.success())
                    {
                        return Ok(Err(anyhow::anyhow!(
                            "{} failed before reaching {point}",
                            unit.name()
                        )));
                    }
                    if unit == Unit::Agent
                        && let Ok(o) = c.output(&op_failed, T).await
                        && !o.stdout.trim().is_empty()
                    {
                        return Ok(Err(anyhow::anyhow!(
                            "the requested command failed before reaching {point}: {}",
                            o.stdout.trim()
                        )));
                    }
                    Err(format!("no {line:?} yet"))
                }
            }
        },
    )
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "{point} was not reached within {}: {}",
            secs(REACH_TIMEOUT),
            e.last_seen
        )
    })?
}

/// kill -9 of every process of `unit`'s container, or a power cut (waiting for the new boot).
async fn cut(c: &Ctx<'_>, unit: Unit, how: Cut) -> anyhow::Result<()> {
    match how {
        Cut::Kill => {
            sh(
                c,
                &format!(
                    "ctr -n aks-flex tasks kill -a -s SIGKILL {}",
                    unit.container()
                ),
                T,
            )
            .await?;
        }
        Cut::Power => {
            let boot = c.guest().boot_id().await?;
            crate::vm::power_cut(c.guest().runner(), c.state).await?;
            c.guest()
                .wait_new_boot(&boot, BOOT_TIMEOUT)
                .await
                .map_err(|e| anyhow::anyhow!("after the power cut: {e}"))?;
        }
    }
    Ok(())
}

async fn write_bootstrap_env(c: &Ctx<'_>) -> anyhow::Result<()> {
    let env = c.state.bootstrap_env.clone().unwrap_or_default();
    crate::kit::agent::write_bootstrap_env(c, &env).await
}

async fn reset_node(c: &Ctx<'_>) -> anyhow::Result<()> {
    sh(
        c,
        "systemctl start aks-flex-node-reset.service",
        Duration::from_secs(900),
    )
    .await?;
    write_bootstrap_env(c).await
}

const RESTART_BOOTSTRAP: &str = "systemctl reset-failed aks-flex-node-agent.service aks-flex-node-bootstrap.service 2>/dev/null; systemctl --no-block restart aks-flex-node-bootstrap.service";

fn upgrade_command(image: &str) -> String {
    format!(
        "ctr -n aks-flex tasks exec --exec-id fault-$$-$(date +%s%N) aks-flex-agent aks-flex-node operation run AgentUpgrade --param image={}",
        shell_quote(image)
    )
}

async fn candidate(c: &Ctx<'_>, kind: Kind) -> anyhow::Result<String> {
    let (rec, _) = candidates::in_registry(c).await?;
    Ok(rec.reference(kind).to_string())
}

/// How one case went before the verdict: the time of the cut, and a note.
struct Forced {
    since: String,
    note: String,
    settle: Settle,
    /// What must also hold once the node is healthy.
    after: Option<After>,
}

/// A case's own condition, checked once the node is healthy again.
enum After {
    /// The scratch credential store loads a whole pair: the one saved before the cut (its
    /// fingerprint), or the new one the cut interrupted (a fingerprint not known here).
    CertLoads { before: String },
}

/// The scratch root of the `w4-cert` case (the agent's container binds `/var/lib/aks-flex-node`).
pub const CERT_ROOT: &str = "/var/lib/aks-flex-node/fault-cert";
/// The node name the case's certificates name.
const CERT_NODE: &str = "fault-w4-node";

/// `aks-flex-node debug credential-store ACTION` on [`CERT_ROOT`], exec'd into the agent's
/// container.
pub fn cert_store_command(action: &str) -> String {
    format!(
        "ctr -n aks-flex tasks exec --exec-id fault-$$-$(date +%s%N) aks-flex-agent aks-flex-node debug credential-store {action} --root {CERT_ROOT} --node {CERT_NODE}"
    )
}

/// The fingerprint `credential-store save|load` printed (`saved <hex>` / `loaded <hex>`).
pub fn cert_fingerprint(stdout: &str) -> Option<String> {
    stdout.lines().find_map(|l| {
        let (_, fp) = l.trim().split_once(' ')?;
        (fp.len() == 64 && fp.bytes().all(|b| b.is_ascii_hexdigit())).then(|| fp.to_string())
    })
}

/// The verdict of [`After::CertLoads`] on what `load` printed: `None` when a whole pair loads.
pub fn cert_verdict(before: &str, load: &flex_host::runner::Output) -> Option<String> {
    match cert_fingerprint(&load.stdout) {
        Some(_) if load.success() => None,
        _ => Some(format!(
            "the credential store does not load a pair after the cut (the old one was {}): exit {:?}, {}",
            &before[..12.min(before.len())],
            load.code,
            load.stderr.trim()
        )),
    }
}

/// Restarts the agent's unit (to take the armed point) and waits for its task to run.
async fn restart_agent(c: &Ctx<'_>) -> anyhow::Result<()> {
    sh(
        c,
        &format!(
            "systemctl restart {AGENT_UNIT} && for i in $(seq 300); do ctr -n aks-flex tasks ls | grep -q '^aks-flex-agent .*RUNNING' && exit 0; sleep 1; done; echo 'the re-armed agent did not run within 300 s' >&2; exit 1"
        ),
        Duration::from_secs(300),
    )
    .await
    .map(drop)
}

/// Runs `cmd` (in the agent's container) in a transient unit `harness-fault-op-*`, whose
/// journal [`wait_reached`] reads.
async fn run_transient(c: &Ctx<'_>, cmd: &str) -> anyhow::Result<()> {
    sh(
        c,
        &format!(
            "systemd-run --quiet --collect --unit=harness-fault-op-$(date +%s) sh -c {}",
            shell_quote(cmd)
        ),
        T,
    )
    .await
    .map(drop)
}

/// The node-local repave the repave cases request, in the agent's container.
pub fn repave_command() -> String {
    "ctr -n aks-flex tasks exec --exec-id fault-$$-$(date +%s%N) aks-flex-agent aks-flex-node repave --settings-version harness-$(date +%s)".into()
}

/// Arms `point` in the agent's unit, restarts it, runs `cmd` in the agent's container (a
/// transient unit) until it reaches the point, disarms, and cuts as `how`; the guest time it
/// began (for the journal).
async fn hold_and_cut(c: &Ctx<'_>, point: &str, cmd: &str, how: Cut) -> anyhow::Result<String> {
    let since = guest_now(c).await?;
    sh(c, &arm_script(Unit::Agent, point), T).await?;
    restart_agent(c).await?;
    run_transient(c, cmd).await?;
    wait_reached(c, point, &since, Unit::Agent).await?;
    sh(c, &disarm_script(), T).await?;
    cut(c, Unit::Agent, how).await?;
    Ok(since)
}

async fn force(c: &Ctx<'_>, case: &Case) -> anyhow::Result<Forced> {
    let point = case.point.unwrap_or_default();
    match case.scenario {
        Scenario::Start => {
            reset_node(c).await?;
            let since = guest_now(c).await?;
            sh(c, &arm_script(Unit::Bootstrap, point), T).await?;
            sh(c, RESTART_BOOTSTRAP, T).await?;
            wait_reached(c, point, &since, Unit::Bootstrap).await?;
            sh(c, &disarm_script(), T).await?;
            cut(c, Unit::Bootstrap, case.cut).await?;
            let note = if case.cut == Cut::Kill {
                // The next boot would run the bootstrap unit again; so does the harness.
                sh(c, RESTART_BOOTSTRAP, T).await?;
                "start killed at the point; bootstrap run again as the next boot runs it"
            } else {
                "power cut at the point; the boot runs the bootstrap unit"
            };
            Ok(Forced {
                since,
                note: note.into(),
                settle: Settle::Node,
                after: None,
            })
        }
        Scenario::Upgrade(kind) => {
            let target = candidate(c, kind).await?;
            let since = hold_and_cut(c, point, &upgrade_command(&target), case.cut).await?;
            Ok(Forced {
                since,
                note: format!(
                    "AgentUpgrade to the {} candidate {} at the point",
                    kind.name(),
                    if case.cut == Cut::Kill {
                        "killed -9"
                    } else {
                        "power-cut"
                    }
                ),
                settle: Settle::Upgrade,
                after: None,
            })
        }
        Scenario::Repave => {
            let before = health(c).await?.machine;
            let since = hold_and_cut(c, point, &repave_command(), case.cut).await?;
            Ok(Forced {
                since,
                note: format!(
                    "repave from {} {} at the point; {}",
                    or_none(&before),
                    if case.cut == Cut::Kill {
                        "killed -9"
                    } else {
                        "power-cut"
                    },
                    if case.cut == Cut::Kill {
                        "systemd restarts the agent, whose daemon finishes the journal"
                    } else {
                        "the boot starts the agent, whose daemon finishes the journal"
                    }
                ),
                settle: Settle::Repave,
                after: None,
            })
        }
        Scenario::ContainerdRestart => {
            let since = guest_now(c).await?;
            sh(
                c,
                "systemctl restart containerd.service",
                Duration::from_secs(300),
            )
            .await?;
            Ok(Forced {
                since,
                note: "containerd restarted".into(),
                settle: Settle::Node,
                after: None,
            })
        }
        Scenario::RegistryDown => {
            let target = candidate(c, Kind::Good).await?;
            let reg = c
                .state
                .registry
                .as_ref()
                .ok_or_else(|| anyhow::anyhow!("up recorded no registry"))?;
            let port = reg
                .guest_addr()
                .rsplit(':')
                .next()
                .unwrap_or_default()
                .to_string();
            let since = guest_now(c).await?;
            sh(
                c,
                &format!(
                    "nft add table inet harness_faults && nft add chain inet harness_faults out '{{ type filter hook output priority 0; }}' && nft add rule inet harness_faults out ip daddr 10.0.2.2 tcp dport {port} reject"
                ),
                T,
            )
            .await?;
            let out = c.output(&upgrade_command(&target), OPERATION_TIMEOUT).await;
            sh(c, "nft delete table inet harness_faults", T).await?;
            let out = out?;
            let r = status::parse_op_result(&out.stdout);
            ensure(
                out.code == Some(1) && r.as_ref().is_some_and(|r| r.phase == "Failed"),
                || {
                    format!(
                        "the upgrade with the registry down was not reported failed (exit {:?}): {}; stderr: {}",
                        out.code,
                        r.as_ref()
                            .map_or_else(|| out.stdout.clone(), |r| r.to_string()),
                        out.stderr.trim()
                    )
                },
            )?;
            Ok(Forced {
                since,
                note: format!(
                    "registry blocked; operation {}",
                    r.map(|r| r.to_string().chars().take(160).collect::<String>())
                        .unwrap_or_default()
                ),
                settle: Settle::Upgrade,
                after: None,
            })
        }
        Scenario::VarFull => {
            reset_node(c).await?;
            let since = guest_now(c).await?;
            sh(
                c,
                "mkdir -p /var/lib/machines && mount -t tmpfs -o size=8m harness-var-full /var/lib/machines",
                T,
            )
            .await?;
            sh(c, RESTART_BOOTSTRAP, T).await?;
            let failed = flex_host::retry::wait_until(
                "the bootstrap to fail on the full file system",
                REACH_TIMEOUT,
                POLL,
                || async {
                    match c
                        .output(&format!("systemctl is-failed --quiet {BOOTSTRAP_UNIT}"), T)
                        .await
                    {
                        Ok(o) if o.success() => Ok(()),
                        _ => Err("not failed yet".to_string()),
                    }
                },
            )
            .await;
            let said = c
                .output(
                    &format!(
                        "journalctl -b -o cat --no-pager --since @{since} -u {BOOTSTRAP_UNIT} | grep -Ei -m1 'no space left|os error 28'"
                    ),
                    T,
                )
                .await;
            sh(
                c,
                "umount /var/lib/machines; systemctl stop aks-flex-node-reset.service 2>/dev/null; true",
                T,
            )
            .await?;
            failed.map_err(|e| anyhow::anyhow!("{e}"))?;
            let said = said
                .map(|o| o.stdout.trim().to_string())
                .unwrap_or_default();
            ensure(!said.is_empty(), || {
                "the bootstrap failed without saying the file system is full".into()
            })?;
            // Space back: the next boot's bootstrap, as the harness runs it now.
            sh(c, RESTART_BOOTSTRAP, T).await?;
            Ok(Forced {
                since,
                note: format!(
                    "bootstrap failed: {}",
                    said.chars().take(120).collect::<String>()
                ),
                settle: Settle::Node,
                after: None,
            })
        }
        Scenario::CertStore => {
            let saved = sh(
                c,
                &format!("rm -rf {CERT_ROOT} && {}", cert_store_command("save")),
                T,
            )
            .await?;
            let before = cert_fingerprint(&saved)
                .ok_or_else(|| anyhow::anyhow!("credential-store save printed {saved:?}"))?;
            let since = hold_and_cut(c, point, &cert_store_command("save"), case.cut).await?;
            Ok(Forced {
                since,
                note: format!(
                    "a new key and certificate saved over pair {} killed -9 at the point",
                    &before[..12]
                ),
                settle: Settle::Node,
                after: Some(After::CertLoads { before }),
            })
        }
        Scenario::Skip(_) => anyhow::bail!("a skipped case is not forced"),
    }
}

async fn run_case(c: &Ctx<'_>, case: &Case) -> anyhow::Result<Checked> {
    let only = std::env::var(ONLY_ENV).ok();
    if let Scenario::Skip(why) = case.scenario {
        push_row(Row {
            id: case.id.into(),
            did: String::new(),
            recovery: None,
            outcome: Outcome::Skipped(why.into()),
        });
        return Ok(Outcome::Skipped(why.into()).into());
    }
    if !selected(only.as_deref(), case.id) {
        let why = format!("not selected by {ONLY_ENV}");
        return Ok(Outcome::Skipped(why).into());
    }
    if c.state.snapshot.is_some() {
        crate::vm::restore(c.runner, c.state).await?;
    }
    let (outcome, did, recovery) = match force(c, case).await {
        Err(e) => {
            let did = agent_did(c, "0").await;
            (
                Outcome::Failed(format!("the fault could not be forced: {e:#}")),
                did,
                None,
            )
        }
        Ok(f) => {
            let r = wait_healthy(c, f.settle).await;
            let mut did = format!("{}; {}", f.note, agent_did(c, &f.since).await);
            match (r, f.after) {
                (Err(last), _) => (Outcome::Failed(format!("not recovered: {last}")), did, None),
                (Ok(d), None) => (Outcome::Passed, did, Some(d)),
                (Ok(d), Some(After::CertLoads { before })) => {
                    let load = c.output(&cert_store_command("load"), T).await;
                    let _ = c.output(&format!("rm -rf {CERT_ROOT}"), T).await;
                    let verdict = match &load {
                        Ok(o) => cert_verdict(&before, o),
                        Err(e) => Some(format!("credential-store load: {e:#}")),
                    };
                    match verdict {
                        Some(bad) => (Outcome::Failed(bad), did, None),
                        None => {
                            let fp = load
                                .ok()
                                .and_then(|o| cert_fingerprint(&o.stdout))
                                .unwrap_or_default();
                            let which = if fp == before {
                                "the old pair"
                            } else {
                                "a new whole pair"
                            };
                            did = format!(
                                "{did}; the store loads {which} ({})",
                                &fp[..12.min(fp.len())]
                            );
                            (Outcome::Passed, did, Some(d))
                        }
                    }
                }
            }
        }
    };
    // Leave nothing armed whatever happened.
    let _ = c.output(&disarm_script(), T).await;
    if matches!(outcome, Outcome::Failed(_)) {
        let journal = crate::check::failure_journal(c.runner, c.ssh).await;
        crate::vm::progress_line(&format!("  faults / {}: journal:\n{journal}", case.id));
    }
    push_row(Row {
        id: case.id.into(),
        did: did.clone(),
        recovery,
        outcome: outcome.clone(),
    });
    let detail = match recovery {
        Some(d) => format!("recovered in {}; {did}", secs(d)),
        None => did,
    };
    Ok(Checked {
        outcome,
        detail: Some(detail),
        steps: Vec::new(),
    })
}

async fn baseline(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    if let Ok(mut rows) = ROWS.lock() {
        rows.clear();
    }
    let _ = c.output(&disarm_script(), T).await;
    let (bad, _) = problems(c, Settle::Node).await?;
    ensure(bad.is_empty(), || {
        format!(
            "the node is not healthy before any fault: {}",
            bad.join("; ")
        )
    })?;
    Ok(Outcome::Passed.into())
}

/// The closing table and note, from the rows.
pub fn render_rows(rows: &[Row]) -> (String, usize, usize) {
    let ran: Vec<&Row> = rows
        .iter()
        .filter(|r| !matches!(r.outcome, Outcome::Skipped(_)))
        .collect();
    let survived = ran.iter().filter(|r| r.outcome == Outcome::Passed).count();
    let mut s = String::from("fault | what the agent did | recovery\n");
    for r in rows {
        let rec = match (&r.outcome, r.recovery) {
            (Outcome::Skipped(why), _) => format!("skipped: {why}"),
            (_, Some(d)) => secs(d),
            (Outcome::Failed(e), None) => {
                format!("FAILED: {}", e.lines().next().unwrap_or_default())
            }
            (Outcome::Passed, None) => "-".into(),
        };
        s.push_str(&format!("{} | {} | {rec}\n", r.id, or_none(&r.did)));
    }
    s.push_str(&format!("faults survived: {survived} of {}\n", ran.len()));
    (s, survived, ran.len())
}

async fn closing(_c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let rows = ROWS.lock().map(|r| r.clone()).unwrap_or_default();
    let (table, survived, ran) = render_rows(&rows);
    crate::vm::progress_line(&format!("  faults:\n{table}"));
    let note = format!("faults survived: {survived} of {ran}");
    Ok(Checked {
        outcome: if survived == ran {
            Outcome::Passed
        } else {
            Outcome::Failed(note.clone())
        },
        detail: Some(note),
        steps: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arming_passes_the_fault_through_ctr_run_args() {
        let s = arm_script(Unit::Agent, "store.save-midway:pending.json#2");
        assert!(
            s.contains("/run/systemd/system/aks-flex-node-agent.service.d/50-harness-fault.conf"),
            "{s}"
        );
        assert!(s.contains("'AKS_FLEX_NODE_CTR_RUN_ARGS=--env AKS_FLEX_NODE_FAULT=store.save-midway:pending.json#2:hang'"), "{s}");
        assert!(s.ends_with("systemctl daemon-reload"));
        assert_eq!(
            reached_line("store.save-midway:pending.json#2"),
            "fault point reached: store.save-midway:pending.json:hang"
        );
        assert!(disarm_script().contains("rm -rf /run/aks-flex-faults"));
    }

    #[test]
    fn the_spec_parses_as_the_agent_parses_it() {
        for c in CASES {
            if let Some(p) = c.point {
                let (armed, bad) = flex_host::fault::parse(&fault_spec(p));
                assert!(bad.is_empty(), "{p}");
                assert_eq!(armed.len(), 1);
                assert_eq!(armed[0].action, flex_host::fault::Action::Hang);
            }
        }
    }

    #[test]
    fn selection() {
        assert!(selected(None, "w1-state"));
        assert!(selected(Some(""), "w1-state"));
        assert!(selected(Some("w1,w2"), "w2-agent-unit"));
        assert!(!selected(Some("upgrade"), "w2-agent-unit"));
    }

    /// The probe's output on a healthy node: the daemon state an intact envelope, as the
    /// probe emits it (`recordb64=`).
    fn healthy() -> Health {
        use sha2::Digest as _;
        let payload = "{\"activeMachine\": \"kube1\"}";
        let sum = hex::encode(sha2::Sha256::digest(payload.as_bytes()));
        let record = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            format!(
                "{{\"format\": \"aks-flex-node.record/v1\", \"sha256\": \"{sum}\", \"payload\": {payload}}}\n"
            ),
        );
        let h = parse_health(&format!(
            "agent=active\nunit_file=yes\nbootstrap=active\ntask=RUNNING\nrecordb64=daemon-state.json:{record}:-\nmachine=kube1\nmachine_state=running\nkubelet=active\n"
        ));
        assert_eq!(h.records, [("daemon-state.json".into(), "ok".into())]);
        h
    }

    #[test]
    fn verdict_table() {
        assert_eq!(verdict(&healthy()), Vec::<String>::new());
        type Change = dyn Fn(&mut Health);
        let cases: &[(&Change, &str)] = &[
            (&|h| h.agent_unit_file = false, "no agent unit installed"),
            (&|h| h.agent = "inactive".into(), "agent unit inactive"),
            (&|h| h.task = String::new(), "agent task none"),
            (
                &|h| {
                    let legacy = base64::Engine::encode(
                        &base64::engine::general_purpose::STANDARD,
                        "{\"activeMachine\": \"kube1\"}\n",
                    );
                    *h = parse_health(&format!(
                        "agent=active\nunit_file=yes\ntask=RUNNING\nmachine=kube1\nmachine_state=running\nkubelet=active\nrecordb64=daemon-state.json:{legacy}:-\n"
                    ));
                },
                "unreadable record: daemon-state.json: a legacy record without its .sha256",
            ),
            (
                &|h| {
                    h.records = vec![(
                        "pending.json".into(),
                        "pending.json: its payload does not match its sha256".into(),
                    )]
                },
                "unreadable record: pending.json: its payload does not match its sha256",
            ),
            (
                &|h| h.machine = String::new(),
                "no active machine in daemon-state.json",
            ),
            (
                &|h| h.machine_state = "closing".into(),
                "machine kube1 closing",
            ),
            (
                &|h| h.kubelet = "activating".into(),
                "kubelet in kube1 activating",
            ),
        ];
        for (change, want) in cases {
            let mut h = healthy();
            change(&mut h);
            assert_eq!(verdict(&h), vec![want.to_string()]);
        }
    }

    #[test]
    fn upgrade_verdict_needs_a_finished_record_and_its_image() {
        let rec = |stage: &str, phase: &str| status::UpgradeRecord {
            stage: stage.into(),
            phase: phase.into(),
            candidate: "r/a@sha256:bb".into(),
            previous: "r/a@sha256:aa".into(),
            ..Default::default()
        };
        let probe = |img: &str, r| Probe {
            active: "active".into(),
            task: "RUNNING".into(),
            image: Some(img.into()),
            record: r,
            ..Default::default()
        };
        assert!(upgrade_verdict(&probe("r/a@sha256:aa", None)).is_empty());
        assert!(
            upgrade_verdict(&probe("r/a@sha256:aa", Some(rec("finished", "Failed")))).is_empty()
        );
        assert!(
            upgrade_verdict(&probe("r/a@sha256:bb", Some(rec("finished", "Complete")))).is_empty()
        );
        assert_eq!(
            upgrade_verdict(&probe("r/a@sha256:bb", Some(rec("switched", "InProgress")))).len(),
            1
        );
        assert_eq!(
            upgrade_verdict(&probe("r/a@sha256:bb", Some(rec("finished", "Failed")))).len(),
            1
        );
    }

    #[test]
    fn repave_verdict_needs_the_journal_gone_and_only_the_active_side_running() {
        let mut h = healthy();
        assert!(repave_verdict(&h).is_empty());
        let h2 = parse_health("machine=kube2\nother_state=running\n");
        assert_eq!(h2.other_state, "running");
        assert_eq!(
            repave_verdict(&h2),
            vec!["the other machine side is running".to_string()]
        );
        h.records.push(("repave-state.json".into(), "ok".into()));
        assert_eq!(
            repave_verdict(&h),
            vec![
                "repave journal still there: the repave neither finished nor rolled back"
                    .to_string()
            ]
        );
    }

    /// Every journaled repave phase has its power-cut case, and the window-1 case cuts the
    /// Starting journal's save (the third: preparing, switching, starting); none is skipped.
    #[test]
    fn the_repave_cases_cover_each_phase_and_run_offline() {
        let repave: Vec<&Case> = CASES
            .iter()
            .filter(|c| c.scenario == Scenario::Repave)
            .collect();
        let points: Vec<&str> = repave.iter().filter_map(|c| c.point).collect();
        assert_eq!(
            points,
            [
                "store.save-midway:repave-state.json#3",
                "repave.phase:preparing",
                "repave.phase:switching",
                "repave.phase:starting",
                "repave.phase:saving",
                "repave.phase:cleaning",
            ]
        );
        for c in &repave[1..] {
            assert_eq!(c.cut, Cut::Power, "{}", c.id);
            assert!(selected(Some("repave-power"), c.id), "{}", c.id);
        }
        assert_eq!(repave[0].id, "w1-journal");
        assert_eq!(repave[0].cut, Cut::Kill);
        assert!(repave_command().contains("aks-flex-node repave --settings-version"));
    }

    #[test]
    fn closing_note_counts_only_cases_that_ran() {
        let row = |id: &str, outcome| Row {
            id: id.into(),
            did: "x".into(),
            recovery: Some(Duration::from_secs(3)),
            outcome,
        };
        let (s, n, of) = render_rows(&[
            row("a", Outcome::Passed),
            row("b", Outcome::Failed("no agent unit installed".into())),
            row("c", Outcome::Skipped("needs a cluster".into())),
        ]);
        assert_eq!((n, of), (1, 2));
        assert!(s.ends_with("faults survived: 1 of 2\n"), "{s}");
        assert!(s.contains("c | x | skipped: needs a cluster"), "{s}");
    }

    #[test]
    fn the_group_is_registered() {
        let g = crate::groups::select(Some("faults")).unwrap();
        assert_eq!(g[0].checks.len(), CASES.len() + 2);
    }

    /// Window 4's verdict: a whole pair must load after the cut (the old one, or the new one if
    /// the rename had happened); no pair, or a load that fails, is a failed case.
    #[test]
    fn the_cert_case_needs_a_whole_pair_after_the_cut() {
        let old = "ab".repeat(32);
        assert_eq!(
            cert_fingerprint(&format!("saved {old}\n")),
            Some(old.clone())
        );
        assert_eq!(cert_fingerprint("saved xyz\n"), None);
        assert_eq!(cert_fingerprint(""), None);
        let out = |code: i32, stdout: &str, stderr: &str| flex_host::runner::Output {
            code: Some(code),
            stdout: stdout.into(),
            stderr: stderr.into(),
        };
        assert_eq!(
            cert_verdict(&old, &out(0, &format!("loaded {old}\n"), "")),
            None
        );
        let new = "cd".repeat(32);
        assert_eq!(
            cert_verdict(&old, &out(0, &format!("loaded {new}\n"), "")),
            None
        );
        let torn = cert_verdict(
            &old,
            &out(
                1,
                "",
                "Command execution failed: no usable key and certificate",
            ),
        )
        .unwrap();
        assert!(
            torn.contains("does not load a pair") && torn.contains("ababababab"),
            "{torn}"
        );
        assert!(cert_verdict(&old, &out(0, "", "")).is_some());
        let cmd = cert_store_command("load");
        assert!(
            cmd.contains(&format!("credential-store load --root {CERT_ROOT} ")),
            "{cmd}"
        );
        assert!(
            CASES
                .iter()
                .any(|c| c.id == "w4-cert" && c.scenario == Scenario::CertStore)
        );
    }
}
