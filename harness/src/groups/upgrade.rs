//! The `upgrade` check group: AgentUpgrade by image, requested node-locally in the agent's
//! container (`aks-flex-node operation run AgentUpgrade --param image=<ref>`, through
//! `ctr tasks exec` as the machines group runs NodeReboot), against candidate images derived
//! from the install's agent image ([`candidates`]). It starts from a bootstrapped host and
//! leaves one, with the agent back on the install's image.
//!
//! The checks, in order: an image named by tag alone is refused and nothing restarts; a good
//! candidate is switched to, and the time from the operation's start to its agent running is
//! reported; a broken candidate (its daemon exits at once) rolls back to the previous image,
//! and its image is removed from the host; the upgrade back to the install's image, with a VM
//! reboot right after its switch, ends with the agent on the image its record names; and the
//! group leaves the agent on the install's image (upgrading back only if that upgrade rolled
//! back).
//!
//! Each wait polls every second with a timeout that names what it waited for, reading the
//! agent's unit, task and container image and the upgrade record ([`status`]). Before each
//! step that starts the agent's unit, the group waits, if it must, for earlier starts to age
//! out of the unit's start limit ([`startlimit`]). On a failure it prints the journal of the
//! agent's units, the recovery unit's included.

pub mod host;
pub mod startlimit;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::check::{CheckFn, Ctx, Group, HostMode, Laps, Needs, check, ensure, looks_note, secs};
use crate::kit::candidates::{self, Kind, Record};
use crate::kit::upgrade_status::{self as status, OpResult, Probe, UpgradeRecord, short};
use crate::report::{Checked, Outcome};
use crate::ssh::shell_quote;

pub use flex_api::status::{AGENT_UNIT, RECOVERY_UNIT, RESTART_UNIT_PREFIX};

/// Starts of the agent's unit the upgrade to the good candidate needs: the restart onto it.
pub const STARTS_GOOD: u32 = 1;
/// Starts the broken candidate needs: its failing start and recovery's restart of the previous
/// image. (Should the unit retry the candidate first, the limit runs out within the step, and a
/// start past it fails the unit, which recovery also takes for a failed upgrade.)
pub const STARTS_BROKEN: u32 = 2;
/// Starts before the reboot: the restart scheduled a second after the switch may come before
/// the reboot does. The reboot then resets the count.
pub const STARTS_REBOOT: u32 = 1;
/// Starts of the upgrade back to the install's image.
pub const STARTS_BACK: u32 = 1;

/// Between two looks of a wait: a quick probe takes about half a second under TCG, so a
/// change is seen about a second after it happens.
const POLL: Duration = Duration::from_millis(500);
const T: Duration = Duration::from_secs(120);
const OPERATION_TIMEOUT: Duration = Duration::from_secs(600);
const SETTLE_TIMEOUT: Duration = Duration::from_secs(600);
const REBOOT_TIMEOUT: Duration = Duration::from_secs(600);
const REMOVAL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the agent is watched after a refused upgrade: a restart would come
/// `RESTART_DELAY` (a second) after being scheduled, and its transient units are looked for
/// as well ([`unchanged_after_refusal`]).
const NO_RESTART_WATCH: Duration = Duration::from_secs(2);
/// The tag `up` pushes the agent's image with.
const AGENT_TAG: &str = "dev";

/// The `upgrade` group.
pub const GROUP: Group = Group {
    name: "upgrade",
    description: "AgentUpgrade through operation run: an image named by tag alone is rejected, a good candidate is switched to, a broken one rolls back and is removed, a reboot mid-upgrade settles, and the agent ends on the install's image",
    needs: Needs::Host,
    checks: &[
        check!(
            "candidate images (good, broken) are in the local registry",
            candidates_ready,
            via explained
        ),
        check!(
            "an image named by tag alone is rejected and nothing restarts",
            tag_alone_rejected,
            via explained
        ),
        check!(
            "upgrade to a good candidate completes and the agent runs it",
            good_upgrade,
            via explained
        ),
        check!(
            "a broken candidate rolls back to the previous image",
            broken_rolls_back,
            via explained
        ),
        check!(
            "the broken candidate's image is removed from the host",
            broken_image_removed,
            via explained
        ),
        check!(
            "a reboot during an upgrade ends with the agent on the image its record names",
            reboot_mid_upgrade,
            via explained
        ),
        check!(
            "the group leaves the agent on the install's image",
            back_to_install,
            via explained
        ),
    ],
    in_host_mode: HostMode::Variant(&host::GROUP),
};

/// Runs the check `f` and, should it fail, [`explain`]s (the `via` of every check of the
/// group).
async fn explained(c: &Ctx<'_>, f: CheckFn) -> anyhow::Result<Checked> {
    explain(c, f(c).await).await
}

/// On a failure, prints the journal lines that explain it: the harness's usual selection (the
/// agent's units, machines, containerd), then the recovery unit's own lines, which the agent's
/// debug output may push out of the former.
async fn explain(c: &Ctx<'_>, r: anyhow::Result<Checked>) -> anyhow::Result<Checked> {
    if r.is_err() {
        let journal = crate::check::failure_journal(c.runner, c.ssh).await;
        let recovery = c
            .output(
                &format!(
                    "journalctl -b --no-pager -o short-monotonic -n 60 -u {RECOVERY_UNIT} -u {AGENT_UNIT} 2>&1 | grep -v ' DEBUG ' | tail -n 60"
                ),
                T,
            )
            .await
            .map(|o| o.stdout)
            .unwrap_or_else(|e| format!("(journal unavailable: {e})"));
        crate::vm::progress_line(&format!(
            "  upgrade: journal of the agent's units:\n{journal}\n  upgrade: {AGENT_UNIT} and {RECOVERY_UNIT} without debug lines:\n{recovery}"
        ));
    }
    r
}

/// After a refused upgrade: no restart is scheduled (no transient unit of one, looked for at
/// once and after the watch), and the agent, watched [`NO_RESTART_WATCH`], is still the same
/// running invocation, process and image as `before`.
async fn unchanged_after_refusal(c: &Ctx<'_>, before: &Probe) -> anyhow::Result<()> {
    let scheduled = format!(
        "systemctl list-units --all --plain --no-legend '{RESTART_UNIT_PREFIX}*' | awk '{{print $1}}'"
    );
    for when in ["at once", "after the watch"] {
        let units = c.run(&scheduled, T).await?;
        ensure(units.trim().is_empty(), || {
            format!(
                "a restart is scheduled after a refused upgrade ({when}): {}",
                units.split_whitespace().collect::<Vec<_>>().join(", ")
            )
        })?;
        if when == "at once" {
            tokio::time::sleep(NO_RESTART_WATCH).await;
        }
    }
    let after = probe(c).await?;
    ensure(
        after.running()
            && after.invocation == before.invocation
            && after.pid == before.pid
            && after.image == before.image,
        || format!("the agent changed after a refused upgrade: before {before}; after {after}"),
    )
}

/// One look at the agent and its record (the record from the host's file: a quick probe, as
/// every wait of the group looks many times). [`status_agrees`] checks `operation status`
/// once a wait has ended.
async fn probe(c: &Ctx<'_>) -> anyhow::Result<Probe> {
    let o = c
        .output(&status::quick_probe_script_for(c.state.mode), T)
        .await?;
    Ok(status::parse_probe(&o.stdout))
}

/// `aks-flex-node operation status`, as an operator runs it in the agent's container, says what
/// the record the wait settled on says.
async fn status_agrees(c: &Ctx<'_>, settled: &UpgradeRecord) -> anyhow::Result<()> {
    let out = c
        .run(
            &crate::kit::agent::agent_command(c.state.mode, "aks-flex-node operation status"),
            T,
        )
        .await?;
    let said = status::parse_status(&out)?;
    ensure(&said == settled, || {
        format!("operation status says {said}, the upgrade record says {settled}")
    })
}

/// The candidates the first check ensured, for this agent image and registry.
fn record(c: &Ctx<'_>) -> anyhow::Result<Record> {
    let reg = c
        .state
        .registry
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("up recorded no registry"))?;
    let (_, digest) = candidates::agent_parts(&c.state.agent_image, &reg.guest_addr())?;
    match candidates::plan(
        Record::load(&c.state.work).as_ref(),
        digest,
        &reg.guest_addr(),
    ) {
        candidates::Plan::Reuse(r) => Ok(r),
        candidates::Plan::Build(why) => anyhow::bail!(
            "no candidate images for this agent image ({why}); the group's first check builds them"
        ),
    }
}

/// The shell command that requests an AgentUpgrade to `image` in the agent's container.
fn upgrade_command(image: &str) -> String {
    format!(
        "ctr -n aks-flex tasks exec --exec-id upgrade-$$-$(date +%s%N) aks-flex-agent aks-flex-node operation run AgentUpgrade --param image={}",
        shell_quote(image)
    )
}

/// Checks that `operation run` scheduled the restart (exit 0, InProgress/RestartScheduled).
fn expect_scheduled(
    code: Option<i32>,
    stdout: &str,
    stderr: &str,
    image: &str,
) -> anyhow::Result<OpResult> {
    let r = status::parse_op_result(stdout);
    match &r {
        Some(r) if code == Some(0) && r.phase == "InProgress" && r.reason == "RestartScheduled" => {
            Ok(r.clone())
        }
        _ => anyhow::bail!(
            "AgentUpgrade to {} did not schedule the restart (exit {code:?}): {}{}",
            short(image),
            r.map_or_else(|| format!("stdout {stdout:?}"), |r| r.to_string()),
            if stderr.trim().is_empty() {
                String::new()
            } else {
                format!("; stderr: {}", stderr.trim())
            }
        ),
    }
}

/// Waits, if it must, so that `needed` starts of the agent's unit stay within its start limit;
/// returns the wait.
async fn wait_start_limit(c: &Ctx<'_>, needed: u32, step: &str) -> anyhow::Result<Duration> {
    let text = c.run(&startlimit::snapshot_script(AGENT_UNIT), T).await?;
    let (limit, starts, now) = startlimit::parse_snapshot(&text, AGENT_UNIT)?;
    let wait = startlimit::wait_needed(limit, &starts, needed, now)
        .map_err(|e| anyhow::anyhow!("{step}: {e}"))?;
    if !wait.is_zero() {
        let recent = limit.interval.map_or(starts.len(), |i| {
            starts.iter().filter(|s| **s + i >= now).count()
        });
        crate::vm::progress_line(&format!(
            "  upgrade: waiting {} before {step}: it needs {needed} start(s) of {AGENT_UNIT}, whose start limit is {limit}, and {recent} of this boot's starts are within it",
            secs(wait)
        ));
        tokio::time::sleep(wait).await;
    }
    Ok(wait)
}

fn waited_note(wait: Duration) -> String {
    if wait.is_zero() {
        String::new()
    } else {
        format!("; waited {} for the start limit first", secs(wait))
    }
}

/// Follows one upgrade's record: it is settled when the record for `target` is finished and the
/// agent runs the image it names. A finished record equal to the one seen before the
/// operation is the previous upgrade's, unless this one was seen unfinished first.
#[derive(Clone, Debug)]
pub struct Tracker {
    target: String,
    before: Option<UpgradeRecord>,
    seen_unfinished: bool,
}

impl Tracker {
    /// Follows the upgrade to `target`; `before` is the record before the operation.
    pub fn new(target: &str, before: Option<UpgradeRecord>) -> Self {
        Self {
            target: target.to_string(),
            before,
            seen_unfinished: false,
        }
    }

    /// The settled record, once `p` shows it.
    pub fn observe(&mut self, p: &Probe) -> Option<UpgradeRecord> {
        let r = p.record.as_ref().filter(|r| r.candidate == self.target)?;
        if !r.finished() {
            self.seen_unfinished = true;
            return None;
        }
        let fresh = self.seen_unfinished || self.before.as_ref() != Some(r);
        (fresh && r.expected_image().is_some_and(|i| p.runs(i))).then(|| r.clone())
    }
}

/// A settled upgrade.
struct Settled {
    record: UpgradeRecord,
    probe: Probe,
    /// When the agent was first seen running the candidate, from the operation's start.
    candidate_running: Option<Duration>,
    /// The same instant, for the check's [`Laps`].
    candidate_running_at: Option<Instant>,
    /// When it settled, from the operation's start.
    at: Duration,
    /// The same instant.
    settled_at: Instant,
    /// Each probe's own time.
    looks: Vec<Duration>,
}

impl Settled {
    /// Ends the wait's steps in `laps`: until the agent ran the candidate (when it was seen
    /// to), then until the upgrade settled, with the probes it took.
    fn laps(&self, laps: &mut Laps, candidate: &str, settled: &str) {
        if let Some(at) = self.candidate_running_at {
            laps.lap_at(format!("until the agent runs {candidate}"), at);
        }
        laps.lap_at(
            format!("until {settled} ({})", looks_note(&self.looks)),
            self.settled_at,
        );
    }
}

async fn wait_settled(
    c: &Ctx<'_>,
    target: &str,
    before: Option<UpgradeRecord>,
    t0: Instant,
) -> anyhow::Result<Settled> {
    // The probe's future outlives each call of the closure: the tracker is shared with it.
    let tracker = Mutex::new((Tracker::new(target, before), None::<Instant>, Vec::new()));
    let tracker = &tracker;
    flex_host::retry::wait_until(
        "the upgrade to finish with the agent running the image its record names",
        SETTLE_TIMEOUT,
        POLL,
        || async move {
            let asked = Instant::now();
            let p = probe(c).await;
            let mut t = tracker.lock().unwrap_or_else(|e| e.into_inner());
            let (tracker, candidate_running, looks) = &mut *t;
            looks.push(asked.elapsed());
            let p = p.map_err(|e| format!("no answer ({e:#})"))?;
            if candidate_running.is_none() && p.runs(target) {
                *candidate_running = Some(Instant::now());
            }
            match tracker.observe(&p) {
                Some(record) => Ok(Settled {
                    record,
                    probe: p,
                    candidate_running: candidate_running.map(|i| i.duration_since(t0)),
                    candidate_running_at: *candidate_running,
                    at: t0.elapsed(),
                    settled_at: Instant::now(),
                    looks: looks.clone(),
                }),
                None => Err(p.to_string()),
            }
        },
    )
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "timed out after {} waiting for the upgrade to {} to finish with the agent running the image its record names; last seen: {}",
            secs(SETTLE_TIMEOUT),
            short(target),
            e.last_seen
        )
    })
}

/// The agent's state before a step: it must run. An agent still starting (after an earlier
/// group's reboot, or a restart) is waited for, as long as [`Ctx::wait_agent_active`] allows.
async fn running_agent(c: &Ctx<'_>) -> anyhow::Result<Probe> {
    c.wait_agent_active().await?;
    let p = probe(c).await?;
    ensure(p.running() && p.image.is_some(), || {
        format!("the agent does not run before the step: {p}")
    })?;
    Ok(p)
}

async fn candidates_ready(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let (rec, why) = candidates::in_registry(c).await?;
    Ok(Checked::passed_with(format!(
        "{why}; good {}, broken {}",
        short(&rec.good),
        short(&rec.broken)
    )))
}

async fn tag_alone_rejected(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let reg = c
        .state
        .registry
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("up recorded no registry"))?;
    let (repo, _) = candidates::agent_parts(&c.state.agent_image, &reg.guest_addr())?;
    let tagged = format!("{}/{repo}:{AGENT_TAG}", reg.guest_addr());
    let mut laps = Laps::start();
    let before = running_agent(c).await?;
    laps.lap("the agent runs");
    let out = c
        .output(&upgrade_command(&tagged), OPERATION_TIMEOUT)
        .await?;
    laps.lap("operation run, refused");
    let r = status::parse_op_result(&out.stdout);
    let refused = r
        .as_ref()
        .is_some_and(|r| r.phase == "Failed" && r.reason == "InvalidParameters");
    ensure(out.code == Some(1) && refused, || {
        format!(
            "AgentUpgrade to {tagged} was not refused as InvalidParameters with exit 1 (exit {:?}): {}; stderr: {}",
            out.code,
            r.as_ref()
                .map_or_else(|| format!("stdout {:?}", out.stdout), |r| r.to_string()),
            out.stderr.trim()
        )
    })?;
    unchanged_after_refusal(c, &before).await?;
    laps.lap("no restart, watched");
    Ok(Checked::passed_with(format!(
        "refused: {}",
        r.map(|r| r.message).unwrap_or_default()
    ))
    .with_steps(laps.into_steps()))
}

async fn good_upgrade(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let target = record(c)?.reference(Kind::Good).to_string();
    let mut laps = Laps::start();
    let waited = wait_start_limit(c, STARTS_GOOD, "the upgrade to the good candidate").await?;
    laps.lap("start limit");
    let before = running_agent(c).await?;
    laps.lap("the agent runs");
    ensure(before.image.as_deref() != Some(target.as_str()), || {
        format!(
            "the agent already runs the good candidate {}; the group starts from the install's image",
            short(&target)
        )
    })?;
    let t0 = Instant::now();
    let out = c
        .output(&upgrade_command(&target), OPERATION_TIMEOUT)
        .await?;
    expect_scheduled(out.code, &out.stdout, &out.stderr, &target)?;
    laps.lap("operation run, restart scheduled");
    let s = wait_settled(c, &target, before.record.clone(), t0).await?;
    s.laps(&mut laps, "the candidate", "the record is finished");
    status_agrees(c, &s.record).await?;
    laps.lap("operation status agrees");
    ensure(
        s.record.phase == "Complete" && s.record.reason == "Succeeded",
        || format!("the upgrade to the good candidate finished {}", s.record),
    )?;
    ensure(s.probe.runs(&target), || {
        format!("after the upgrade: {}", s.probe)
    })?;
    ensure(
        before.image.as_deref() == Some(s.record.previous.as_str()),
        || {
            format!(
                "the record's previous image is {}, the agent ran {} before",
                short(&s.record.previous),
                before.image.as_deref().map_or("none".into(), short)
            )
        },
    )?;
    let running = s.candidate_running.unwrap_or(s.at);
    Ok(Checked::passed_with(format!(
        "new agent running {} after the operation started; record Complete after {}{}",
        secs(running),
        secs(s.at),
        waited_note(waited)
    ))
    .with_steps(laps.into_steps()))
}

async fn broken_rolls_back(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let target = record(c)?.reference(Kind::Broken).to_string();
    let mut laps = Laps::start();
    let waited = wait_start_limit(c, STARTS_BROKEN, "the upgrade to the broken candidate").await?;
    laps.lap("start limit");
    let before = running_agent(c).await?;
    laps.lap("the agent runs");
    let previous = before.image.clone().unwrap_or_default();
    let t0 = Instant::now();
    let out = c
        .output(&upgrade_command(&target), OPERATION_TIMEOUT)
        .await?;
    expect_scheduled(out.code, &out.stdout, &out.stderr, &target)?;
    laps.lap("operation run, restart scheduled");
    let s = wait_settled(c, &target, before.record.clone(), t0).await?;
    s.laps(&mut laps, "the candidate", "rolled back");
    status_agrees(c, &s.record).await?;
    laps.lap("operation status agrees");
    ensure(
        s.record.phase == "Failed" && s.record.reason == "DaemonFailed",
        || {
            format!(
                "the upgrade to the broken candidate finished {}, not Failed/DaemonFailed",
                s.record
            )
        },
    )?;
    ensure(
        s.record.previous == previous && s.probe.runs(&previous),
        || {
            format!(
                "after the rollback the agent should run the previous image {}: {}",
                short(&previous),
                s.probe
            )
        },
    )?;
    Ok(Checked::passed_with(format!(
        "back on the previous image {} after the operation started ({}){}",
        secs(s.at),
        s.record.message,
        waited_note(waited)
    ))
    .with_steps(laps.into_steps()))
}

async fn broken_image_removed(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let broken = record(c)?.reference(Kind::Broken).to_string();
    let b = broken.as_str();
    // A failed listing ends the wait at once (`Ok(Err(…))`); a listing with the image goes on.
    flex_host::retry::wait_until(
        "the broken candidate to leave the host's images",
        REMOVAL_TIMEOUT,
        POLL,
        || async move {
            match c.run("ctr -n aks-flex images ls -q", T).await {
                Ok(list) if status::images_list_has(&list, b) => Err(list.trim().to_string()),
                Ok(_) => Ok(Ok(Outcome::Passed.into())),
                Err(e) => Ok(Err(e)),
            }
        },
    )
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "timed out after {} waiting for the broken candidate {} to leave `ctr -n aks-flex images ls -q`:\n{}",
            secs(REMOVAL_TIMEOUT),
            short(&broken),
            e.last_seen
        )
    })?
}

async fn wait_new_boot(c: &Ctx<'_>, old: &str) -> anyhow::Result<()> {
    c.guest()
        .wait_new_boot(old, REBOOT_TIMEOUT)
        .await
        .map_err(|_| {
        anyhow::anyhow!(
            "timed out after {} waiting for the guest to come back from the reboot with a new boot id; last console lines:\n{}",
            secs(REBOOT_TIMEOUT),
            crate::vm::tail(&c.state.serial_log(), 20)
        )
    })
}

/// The upgrade back to the install's image (from the good candidate the broken one's rollback
/// left), with the reboot right after its switch: one upgrade serves as the way back and as the
/// interrupted one.
async fn reboot_mid_upgrade(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let target = c.state.agent_image.clone();
    let mut laps = Laps::start();
    let waited = wait_start_limit(c, STARTS_REBOOT, "the upgrade interrupted by a reboot").await?;
    laps.lap("start limit");
    let before = running_agent(c).await?;
    laps.lap("the agent runs");
    ensure(before.image.as_deref() != Some(target.as_str()), || {
        format!(
            "the agent already runs the install's image {}: nothing to interrupt",
            short(&target)
        )
    })?;
    let boot = c.guest().boot_id().await?;
    laps.lap("boot id");
    let t0 = Instant::now();
    // One command: the upgrade, then at once the reboot (queued, so the command returns).
    let script = format!(
        "{}; echo harness-rc=$?; systemctl --no-block reboot",
        upgrade_command(&target)
    );
    let out = c.output(&script, OPERATION_TIMEOUT).await;
    laps.lap("operation run, reboot queued");
    wait_new_boot(c, &boot).await?;
    laps.lap("until the guest answers from a new boot");
    let rebooted = t0.elapsed();
    // The operation's result, if its output arrived before the connection went.
    if let Ok(o) = &out {
        let code = o
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("harness-rc="))
            .and_then(|c| c.trim().parse::<i32>().ok());
        if code.is_some() {
            expect_scheduled(code, &o.stdout, &o.stderr, &target)?;
        }
    }
    let s = wait_settled(c, &target, before.record.clone(), t0).await?;
    s.laps(&mut laps, "the install's image", "the record is finished");
    status_agrees(c, &s.record).await?;
    laps.lap("operation status agrees");
    let on = if s.record.phase == "Complete" {
        "the install's image"
    } else {
        "the previous image"
    };
    Ok(Checked::passed_with(format!(
        "record {}/{}; agent on {on} {} after the operation started (back from the reboot after {}){}",
        s.record.phase,
        s.record.reason,
        secs(s.at),
        secs(rebooted),
        waited_note(waited)
    ))
    .with_steps(laps.into_steps()))
}

/// Leaves the agent on the install's image: it is there when the interrupted upgrade
/// completed; after a rollback it is upgraded back.
async fn back_to_install(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let target = c.state.agent_image.clone();
    let before = running_agent(c).await?;
    if before.runs(&target) {
        return Ok(Checked::passed_with(format!(
            "the agent runs the install's image {} (the upgrade the reboot interrupted completed)",
            short(&target)
        )));
    }
    let mut laps = Laps::start();
    let waited =
        wait_start_limit(c, STARTS_BACK, "the upgrade back to the install's image").await?;
    laps.lap("start limit");
    let t0 = Instant::now();
    let out = c
        .output(&upgrade_command(&target), OPERATION_TIMEOUT)
        .await?;
    expect_scheduled(out.code, &out.stdout, &out.stderr, &target)?;
    laps.lap("operation run, restart scheduled");
    let s = wait_settled(c, &target, before.record.clone(), t0).await?;
    s.laps(&mut laps, "the install's image", "the record is finished");
    status_agrees(c, &s.record).await?;
    laps.lap("operation status agrees");
    ensure(
        s.record.phase == "Complete" && s.probe.runs(&target),
        || {
            format!(
                "the upgrade back to the install's image finished {}: {}",
                s.record, s.probe
            )
        },
    )?;
    Ok(Checked::passed_with(format!(
        "agent on the install's image {} after the operation started{}",
        secs(s.at),
        waited_note(waited)
    ))
    .with_steps(laps.into_steps()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "10.0.2.2:5000/aks-flex/agent@sha256:aaaa";
    const B: &str = "10.0.2.2:5000/aks-flex/agent@sha256:bbbb";

    fn rec(stage: &str, phase: &str, candidate: &str, previous: &str) -> UpgradeRecord {
        UpgradeRecord {
            stage: stage.into(),
            phase: phase.into(),
            reason: String::new(),
            message: String::new(),
            candidate: candidate.into(),
            previous: previous.into(),
            started_at: String::new(),
        }
    }

    fn probe(image: Option<&str>, running: bool, record: Option<UpgradeRecord>) -> Probe {
        Probe {
            active: if running { "active" } else { "activating" }.into(),
            invocation: "i".into(),
            pid: "1".into(),
            task: if running { "RUNNING" } else { "" }.into(),
            image: image.map(str::to_string),
            record,
        }
    }

    #[test]
    fn tracker_settles_when_the_agent_runs_what_the_record_says() {
        let mut t = Tracker::new(B, None);
        // The old agent, the record switched: not yet.
        assert_eq!(
            t.observe(&probe(
                Some(A),
                true,
                Some(rec("switched", "InProgress", B, A))
            )),
            None
        );
        // Finished Complete, but the new agent is still starting.
        let done = rec("finished", "Complete", B, A);
        assert_eq!(t.observe(&probe(Some(B), false, Some(done.clone()))), None);
        // Complete and running the candidate.
        assert_eq!(
            t.observe(&probe(Some(B), true, Some(done.clone()))),
            Some(done)
        );
        // Failed: settled only on the previous image.
        let mut t = Tracker::new(B, None);
        let failed = rec("finished", "Failed", B, A);
        assert_eq!(t.observe(&probe(Some(B), true, Some(failed.clone()))), None);
        assert_eq!(
            t.observe(&probe(Some(A), true, Some(failed.clone()))),
            Some(failed)
        );
        // Another candidate's record never settles it.
        let mut t = Tracker::new(B, None);
        assert_eq!(
            t.observe(&probe(
                Some(A),
                true,
                Some(rec("finished", "Complete", A, B))
            )),
            None
        );
        assert_eq!(t.observe(&probe(Some(A), true, None)), None);
    }

    #[test]
    fn tracker_ignores_the_previous_upgrades_identical_record_until_this_one_shows() {
        let old = rec("finished", "Failed", A, B);
        let mut t = Tracker::new(A, Some(old.clone()));
        assert_eq!(t.observe(&probe(Some(B), true, Some(old.clone()))), None);
        assert_eq!(
            t.observe(&probe(
                Some(B),
                true,
                Some(rec("switched", "InProgress", A, B))
            )),
            None
        );
        // Now the same-looking record is this upgrade's.
        assert_eq!(
            t.observe(&probe(Some(B), true, Some(old.clone()))),
            Some(old.clone())
        );
        // A finished record that differs from the old one is this upgrade's too: here by its
        // start time alone.
        let mut t = Tracker::new(A, Some(old.clone()));
        let later = UpgradeRecord {
            started_at: "2026-01-02T03:04:05Z".into(),
            ..old.clone()
        };
        assert_eq!(
            t.observe(&probe(Some(B), true, Some(later.clone()))),
            Some(later)
        );
        let mut t = Tracker::new(A, Some(old));
        let new = rec("finished", "Complete", A, B);
        assert_eq!(
            t.observe(&probe(Some(A), true, Some(new.clone()))),
            Some(new)
        );
    }

    #[test]
    fn scheduled_or_not() {
        let ok = "phase: InProgress\nreason: RestartScheduled\nmessage: restarting\n";
        assert_eq!(
            expect_scheduled(Some(0), ok, "", A).unwrap().reason,
            "RestartScheduled"
        );
        let e = expect_scheduled(Some(1), ok, "boom", A).unwrap_err();
        assert!(e.to_string().contains("exit Some(1)"), "{e}");
        assert!(e.to_string().contains("stderr: boom"), "{e}");
        let failed = "phase: Failed\nreason: ExecutionFailed\nmessage: pull failed\n";
        let e = expect_scheduled(Some(1), failed, "", A).unwrap_err();
        assert!(
            e.to_string()
                .contains("Failed/ExecutionFailed: pull failed"),
            "{e}"
        );
        assert!(expect_scheduled(Some(0), "", "", A).is_err());
    }

    #[test]
    fn upgrade_command_quotes_the_image() {
        assert!(
            upgrade_command(A)
                .ends_with(&format!("operation run AgentUpgrade --param image='{A}'"))
        );
        assert!(upgrade_command(A).starts_with("ctr -n aks-flex tasks exec --exec-id upgrade-"));
    }

    #[test]
    fn the_group_is_registered_with_its_checks() {
        let names: Vec<&str> = GROUP.checks.iter().map(|c| c.name).collect();
        assert_eq!(names.len(), 7);
        let registered = crate::groups::select(Some("upgrade")).unwrap();
        assert_eq!(registered[0].checks.len(), names.len());
        assert!(names.iter().any(|n| n.contains("tag alone")));
        assert!(names.iter().any(|n| n.contains("reboot")));
    }
}
