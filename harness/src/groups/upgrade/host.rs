//! The `upgrade` group in host mode (`up --mode host`): AgentUpgrade by `downloadURL` +
//! `sha256`, requested node-locally on the host (`aks-flex-node operation run AgentUpgrade
//! --param downloadURL=… --param sha256=…`), against the files `up` pushed to the local
//! registry, which serves each as a blob ([`crate::hostmode::Served`]). Like the image-mode
//! group it starts from a bootstrapped host and leaves one, with the agent on the install's
//! binary.
//!
//! The checks, in order: the registry serves the candidates; a wrong checksum is refused and
//! nothing restarts; a good binary is switched to (the other slot, its bytes checked); a broken
//! binary (its daemon exits 1) is rolled back by the recovery unit; the agent goes back to the
//! install's binary; a VM reboot right after an upgrade's switch ends with the agent on the slot
//! the record names; and the agent goes back to the install's binary again.
//!
//! The record and the probe name slots (`blue`, `green`) where image mode names images: the
//! target of an upgrade is the slot opposite the running one. The waits, the start-limit wait
//! and the journal on a failure are the image-mode group's.

use std::time::Instant;

use super::{
    AGENT_UNIT, OPERATION_TIMEOUT, RECOVERY_UNIT, STARTS_BACK, STARTS_BROKEN, STARTS_GOOD,
    STARTS_REBOOT, T, expect_scheduled, explained, running_agent, unchanged_after_refusal,
    wait_new_boot, wait_settled, wait_start_limit, waited_note,
};
use crate::check::{Ctx, Group, HostMode, Needs, check, ensure, secs};
use crate::hostmode::{AGENT, Artifact, LIB_DIR, Served};
use crate::kit::upgrade_status::{self as status, Probe, UpgradeRecord};
use crate::report::{Checked, Outcome};
use crate::ssh::shell_quote;

/// The `upgrade` group in host mode.
pub const GROUP: Group = Group {
    name: "upgrade",
    description: "host mode: AgentUpgrade by downloadURL + sha256 through operation run, served by the local registry: a wrong checksum is refused, a good binary is switched to, a broken one is rolled back by the recovery unit, a reboot right after the switch settles, and the agent ends on the install's binary",
    needs: Needs::Host,
    checks: &[
        check!(
            "the candidate binaries (good, broken) are served to the guest",
            served_ready,
            via explained
        ),
        check!(
            "a wrong sha256 is refused and nothing restarts",
            wrong_checksum_refused,
            via explained
        ),
        check!(
            "upgrade to a good binary completes and the agent runs it from the other slot",
            good_upgrade,
            via explained
        ),
        check!(
            "a broken binary is rolled back to the previous slot by the recovery unit",
            broken_rolls_back,
            via explained
        ),
        check!(
            "upgrade back to the install's binary",
            back_to_install,
            via explained
        ),
        check!(
            "a reboot right after the switch ends with the agent on the slot its record names",
            reboot_after_switch,
            via explained
        ),
        check!(
            "window 5: held right after a switch, a second upgrade is refused and last-good stays; a power cut then ends on the switched slot",
            power_cut_after_switch,
            via explained
        ),
        check!(
            "the group leaves the agent on the install's binary",
            back_to_install,
            via explained
        ),
    ],
    in_host_mode: HostMode::Same,
};

fn served<'a>(c: &'a Ctx<'_>) -> anyhow::Result<&'a Served> {
    c.state.served.as_ref().ok_or_else(|| {
        anyhow::anyhow!("up recorded no served files: run `cargo xtask up --mode host`")
    })
}

/// The shell command that requests an AgentUpgrade to the file at `url` with `sha256`.
pub fn upgrade_command(url: &str, sha256: &str) -> String {
    format!(
        "{AGENT} operation run AgentUpgrade --param downloadURL={} --param sha256={}",
        shell_quote(url),
        shell_quote(sha256)
    )
}

/// The other slot.
pub fn other_slot(slot: &str) -> anyhow::Result<&'static str> {
    match slot {
        "blue" => Ok("green"),
        "green" => Ok("blue"),
        other => anyhow::bail!("the agent runs from {other:?}, not from a slot (blue or green)"),
    }
}

/// The sha256 of the binary in `slot`.
async fn slot_sha256(c: &Ctx<'_>, slot: &str) -> anyhow::Result<String> {
    let out = c
        .run(&format!("sha256sum {LIB_DIR}/{slot}/aks-flex-node"), T)
        .await?;
    Ok(out
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// The running agent before a step and the slot it runs from.
async fn running_slot(c: &Ctx<'_>) -> anyhow::Result<(Probe, String)> {
    let before = running_agent(c).await?;
    let slot = before.image.clone().unwrap_or_default();
    other_slot(&slot)?;
    Ok((before, slot))
}

/// A settled upgrade to `a` and what ran before it.
struct Upgraded {
    before_slot: String,
    target: String,
    record: UpgradeRecord,
    probe: Probe,
    running_after: std::time::Duration,
    at: std::time::Duration,
    waited: std::time::Duration,
}

/// Requests the upgrade to `a` (after the start-limit wait for `starts`) and waits until it
/// settles.
async fn upgrade_to(
    c: &Ctx<'_>,
    a: &Artifact,
    starts: u32,
    step: &str,
) -> anyhow::Result<Upgraded> {
    let waited = wait_start_limit(c, starts, step).await?;
    let (before, before_slot) = running_slot(c).await?;
    let target = other_slot(&before_slot)?.to_string();
    let t0 = Instant::now();
    let out = c
        .output(&upgrade_command(&a.url, &a.sha256), OPERATION_TIMEOUT)
        .await?;
    expect_scheduled(out.code, &out.stdout, &out.stderr, &target)?;
    let s = wait_settled(c, &target, before.record.clone(), t0).await?;
    Ok(Upgraded {
        before_slot,
        target,
        record: s.record,
        probe: s.probe,
        running_after: s.candidate_running.unwrap_or(s.at),
        at: s.at,
        waited,
    })
}

async fn served_ready(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let s = served(c)?;
    for (name, a) in [("good", &s.good), ("broken", &s.broken)] {
        // What the agent downloads, fetched and hashed in the guest.
        let got = c
            .run(&format!("curl -fsS {} | sha256sum", shell_quote(&a.url)), T)
            .await?;
        ensure(
            got.split_whitespace().next() == Some(a.sha256.as_str()),
            || {
                format!(
                    "the {name} candidate at {} hashes to {got:?}, not {}",
                    a.url, a.sha256
                )
            },
        )?;
    }
    Ok(Checked::passed_with(format!(
        "good sha256 {}…, broken sha256 {}…",
        &s.good.sha256[..12],
        &s.broken.sha256[..12]
    )))
}

async fn wrong_checksum_refused(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let s = served(c)?;
    let (before, slot) = running_slot(c).await?;
    let other = other_slot(&slot)?;
    let other_before = slot_sha256(c, other).await.unwrap_or_default();
    // The good candidate's URL with the install's checksum: a real digest, of another file.
    let out = c
        .output(
            &upgrade_command(&s.good.url, &s.install.sha256),
            OPERATION_TIMEOUT,
        )
        .await?;
    let r = status::parse_op_result(&out.stdout);
    let refused = r
        .as_ref()
        .is_some_and(|r| r.phase == "Failed" && r.message.contains("SHA-256"));
    ensure(out.code != Some(0) && refused, || {
        format!(
            "AgentUpgrade with a wrong sha256 was not refused as Failed naming the SHA-256 with a non-zero exit (exit {:?}): {}; stderr: {}",
            out.code,
            r.as_ref()
                .map_or_else(|| format!("stdout {:?}", out.stdout), |r| r.to_string()),
            out.stderr.trim()
        )
    })?;
    unchanged_after_refusal(c, &before).await?;
    let other_after = slot_sha256(c, other).await.unwrap_or_default();
    ensure(
        other_after == other_before && other_after != s.good.sha256,
        || {
            format!(
                "slot {other} changed after a refused upgrade ({other_before:?} → {other_after:?})"
            )
        },
    )?;
    Ok(Checked::passed_with(format!(
        "refused: {}",
        r.map(|r| r.message).unwrap_or_default()
    )))
}

async fn good_upgrade(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let s = served(c)?;
    let u = upgrade_to(c, &s.good, STARTS_GOOD, "the upgrade to the good binary").await?;
    ensure(
        u.record.phase == "Complete" && u.record.reason == "Succeeded",
        || format!("the upgrade to the good binary finished {}", u.record),
    )?;
    ensure(
        u.probe.runs(&u.target) && u.record.previous == u.before_slot,
        || format!("after the upgrade from slot {}: {}", u.before_slot, u.probe),
    )?;
    let sha = slot_sha256(c, &u.target).await?;
    ensure(sha == s.good.sha256, || {
        format!(
            "slot {} holds {sha}, not the good binary {}",
            u.target, s.good.sha256
        )
    })?;
    let links = c
        .run(
            &format!("readlink {LIB_DIR}/current; readlink {LIB_DIR}/last-good"),
            T,
        )
        .await?;
    let links: Vec<&str> = links.lines().map(str::trim).collect();
    ensure(links == [u.target.as_str(), u.target.as_str()], || {
        format!(
            "after the upgrade current and last-good are {links:?}, not both {}",
            u.target
        )
    })?;
    Ok(Checked::passed_with(format!(
        "slot {} → {}: new agent running {} after the operation started; record Complete after {}{}",
        u.before_slot,
        u.target,
        secs(u.running_after),
        secs(u.at),
        waited_note(u.waited)
    )))
}

async fn broken_rolls_back(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let s = served(c)?;
    let since = c.run("date +%s", T).await?.trim().to_string();
    let u = upgrade_to(
        c,
        &s.broken,
        STARTS_BROKEN,
        "the upgrade to the broken binary",
    )
    .await?;
    ensure(
        u.record.phase == "Failed" && u.record.reason == "DaemonFailed",
        || {
            format!(
                "the upgrade to the broken binary finished {}, not Failed/DaemonFailed",
                u.record
            )
        },
    )?;
    ensure(
        u.record.previous == u.before_slot && u.probe.runs(&u.before_slot),
        || {
            format!(
                "after the rollback the agent should run the previous slot {}: {}",
                u.before_slot, u.probe
            )
        },
    )?;
    let recovery_ran = c
        .run(
            &format!(
                "journalctl -b -q --since @{since} -u {RECOVERY_UNIT} -o cat | grep -c . || true"
            ),
            T,
        )
        .await?;
    ensure(recovery_ran.trim().parse::<u32>().unwrap_or(0) > 0, || {
        format!("{RECOVERY_UNIT} logged nothing since the upgrade started")
    })?;
    let current = c.run(&format!("readlink {LIB_DIR}/current"), T).await?;
    ensure(current.trim() == u.before_slot, || {
        format!(
            "current is {:?} after the rollback, not {}",
            current.trim(),
            u.before_slot
        )
    })?;
    Ok(Checked::passed_with(format!(
        "back on slot {} {} after the operation started ({}){}",
        u.before_slot,
        secs(u.at),
        u.record.message,
        waited_note(u.waited)
    )))
}

async fn back_to_install(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let s = served(c)?;
    let (_, slot) = running_slot(c).await?;
    if slot_sha256(c, &slot).await? == s.install.sha256 {
        return Ok(Outcome::Skipped("the agent already runs the install's binary".into()).into());
    }
    let u = upgrade_to(
        c,
        &s.install,
        STARTS_BACK,
        "the upgrade back to the install's binary",
    )
    .await?;
    ensure(
        u.record.phase == "Complete" && u.probe.runs(&u.target),
        || {
            format!(
                "the upgrade back to the install's binary finished {}: {}",
                u.record, u.probe
            )
        },
    )?;
    let sha = slot_sha256(c, &u.target).await?;
    ensure(sha == s.install.sha256, || {
        format!("slot {} holds {sha}, not the install's binary", u.target)
    })?;
    Ok(Checked::passed_with(format!(
        "agent on the install's binary in slot {} {} after the operation started{}",
        u.target,
        secs(u.at),
        waited_note(u.waited)
    )))
}

async fn reboot_after_switch(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let s = served(c)?;
    let waited = wait_start_limit(c, STARTS_REBOOT, "the upgrade interrupted by a reboot").await?;
    let (before, before_slot) = running_slot(c).await?;
    let target = other_slot(&before_slot)?.to_string();
    let boot = c.guest().boot_id().await?;
    let t0 = Instant::now();
    // One command: the upgrade, then at once the reboot (queued, so the command returns).
    let script = format!(
        "{}; echo harness-rc=$?; systemctl --no-block reboot",
        upgrade_command(&s.good.url, &s.good.sha256)
    );
    let out = c.output(&script, OPERATION_TIMEOUT).await;
    wait_new_boot(c, &boot).await?;
    let rebooted = t0.elapsed();
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
    let st = wait_settled(c, &target, before.record.clone(), t0).await?;
    let on = if st.record.phase == "Complete" {
        let sha = slot_sha256(c, &target).await?;
        ensure(sha == s.good.sha256, || {
            format!("slot {target} holds {sha}, not the good binary")
        })?;
        format!("the good binary in slot {target}")
    } else {
        format!("the previous slot {before_slot}")
    };
    let unit = c
        .run(&format!("systemctl is-active {AGENT_UNIT} || true"), T)
        .await?;
    ensure(unit.trim() == "active", || {
        format!("{AGENT_UNIT} is {:?} after the reboot", unit.trim())
    })?;
    Ok(Checked::passed_with(format!(
        "record {}/{}; agent on {on} {} after the operation started (back from the reboot after {}){}",
        st.record.phase,
        st.record.reason,
        secs(st.at),
        secs(rebooted),
        waited_note(waited)
    )))
}

/// The fault point window 5's check holds the upgrade at: after the switch of `current`, before
/// the restart is scheduled.
pub const AFTER_SWITCH: &str = "upgrade.after-switch";

/// The transient unit the held upgrade runs in (its stderr, with the fault line, in the journal).
const HELD_UNIT: &str = "harness-w5-upgrade";

/// The command that runs the upgrade to `url`/`sha256` in the background, held at
/// [`AFTER_SWITCH`] (`AKS_FLEX_NODE_FAULT` in its environment only).
pub fn held_upgrade_command(url: &str, sha256: &str) -> String {
    format!(
        "systemctl reset-failed {HELD_UNIT} 2>/dev/null; systemd-run --quiet --collect --unit={HELD_UNIT} --setenv=AKS_FLEX_NODE_FAULT={AFTER_SWITCH}:hang sh -c {}",
        shell_quote(&upgrade_command(url, sha256))
    )
}

/// What a slot link names (`blue`/`green`), or empty.
async fn link(c: &Ctx<'_>, name: &str) -> anyhow::Result<String> {
    Ok(c.run(&format!("readlink {LIB_DIR}/{name} || true"), T)
        .await?
        .trim()
        .to_string())
}

/// Window 5 of #14 on a host: an upgrade to the good binary is held right after its switch
/// (`current` names the candidate's slot, `last-good` still the previous one, the candidate
/// unproven). A second upgrade then must not go into the slot opposite `current`, which is
/// last-good's: it is refused and last-good's link and binary stay. Then a power cut (QMP
/// reset, no shutdown, no sync): the switch must have reached the disk (the links are synced
/// into their directory), so the boot starts the candidate and the upgrade completes on the
/// switched slot; a `current` that reverted would end it Failed on the previous slot.
async fn power_cut_after_switch(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let s = served(c)?;
    let waited = wait_start_limit(c, STARTS_REBOOT, "the upgrade held after its switch").await?;
    let (before, before_slot) = running_slot(c).await?;
    let target = other_slot(&before_slot)?.to_string();
    let last_good = link(c, "last-good").await?;
    let last_good_sha = slot_sha256(c, &last_good).await?;
    let since = c.run("date +%s", T).await?.trim().to_string();
    let t0 = Instant::now();
    c.run(&held_upgrade_command(&s.good.url, &s.good.sha256), T)
        .await?;
    let line = format!("fault point reached: {AFTER_SWITCH}:hang");
    let reached = format!(
        "journalctl -b -o cat --no-pager --since @{since} -u {HELD_UNIT} | grep -qF {}",
        shell_quote(&line)
    );
    flex_host::retry::wait_until(
        "the upgrade to reach its switch",
        OPERATION_TIMEOUT,
        std::time::Duration::from_secs(1),
        || async {
            match c.output(&reached, T).await {
                Ok(o) if o.success() => Ok(()),
                _ => Err(format!("no {line:?} from {HELD_UNIT} yet")),
            }
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let (current, held_last_good) = (link(c, "current").await?, link(c, "last-good").await?);
    ensure(current == target && held_last_good == last_good, || {
        format!(
            "held after the switch, current is {current:?} (want {target:?}) and last-good {held_last_good:?} (want {last_good:?})"
        )
    })?;

    let second = c
        .output(
            &upgrade_command(&s.good.url, &s.good.sha256),
            OPERATION_TIMEOUT,
        )
        .await?;
    let r = status::parse_op_result(&second.stdout);
    ensure(
        second.code != Some(0) && r.as_ref().is_some_and(|r| r.phase == "Failed"),
        || {
            format!(
                "a second upgrade while the first is held after its switch was not refused (exit {:?}): {}; stderr: {}",
                second.code,
                r.as_ref()
                    .map_or_else(|| format!("stdout {:?}", second.stdout), |r| r.to_string()),
                second.stderr.trim()
            )
        },
    )?;
    let (lg_after, lg_sha_after) = (
        link(c, "last-good").await?,
        slot_sha256(c, &last_good).await?,
    );
    ensure(
        lg_after == last_good && lg_sha_after == last_good_sha,
        || {
            format!(
                "the refused upgrade touched last-good: {last_good} ({last_good_sha}) became {lg_after} ({lg_sha_after})"
            )
        },
    )?;

    let boot = c.guest().boot_id().await?;
    crate::vm::power_cut(c.guest().runner(), c.state).await?;
    wait_new_boot(c, &boot).await?;
    let st = wait_settled(c, &target, before.record.clone(), t0).await?;
    ensure(
        st.record.phase == "Complete" && st.probe.runs(&target),
        || {
            format!(
                "after the power cut the upgrade ended {}/{} with the agent on {:?}: the switch to {target} did not survive",
                st.record.phase, st.record.reason, st.probe.image
            )
        },
    )?;
    let sha = slot_sha256(c, &target).await?;
    ensure(sha == s.good.sha256, || {
        format!("slot {target} holds {sha}, not the good binary")
    })?;
    Ok(Checked::passed_with(format!(
        "second upgrade refused ({}); last-good {last_good} kept; after the power cut the agent runs slot {target}, record {}/{} {} after the first operation started{}",
        r.map(|r| r.message.chars().take(100).collect::<String>())
            .unwrap_or_default(),
        st.record.phase,
        st.record.reason,
        secs(st.at),
        waited_note(waited)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upgrade_command_quotes_its_parameters() {
        let url = "http://10.0.2.2:5000/v2/aks-flex/agent-release/blobs/sha256:ab";
        let c = upgrade_command(url, "ab");
        assert_eq!(
            c,
            format!(
                "/usr/local/bin/aks-flex-node operation run AgentUpgrade --param downloadURL='{url}' --param sha256='ab'"
            )
        );
        assert!(!c.contains("ctr "));
    }

    #[test]
    fn the_held_upgrade_arms_only_its_own_process() {
        let c = held_upgrade_command("http://h/x", "ab");
        assert!(
            c.contains(&format!(
                "--unit={HELD_UNIT} --setenv=AKS_FLEX_NODE_FAULT=upgrade.after-switch:hang sh -c "
            )),
            "{c}"
        );
        assert!(c.contains("operation run AgentUpgrade"), "{c}");
        assert!(
            !c.contains("/run/systemd/system"),
            "no drop-in: the daemon is not armed"
        );
    }

    #[test]
    fn slots() {
        assert_eq!(other_slot("blue").unwrap(), "green");
        assert_eq!(other_slot("green").unwrap(), "blue");
        assert!(other_slot("").is_err());
        assert!(other_slot("10.0.2.2:5000/aks-flex/agent@sha256:aa").is_err());
    }

    #[test]
    fn the_group_is_the_host_variant_of_upgrade() {
        assert_eq!(GROUP.name, super::super::GROUP.name);
        let names: Vec<&str> = GROUP.checks.iter().map(|c| c.name).collect();
        assert!(names.iter().any(|n| n.contains("wrong sha256")));
        assert!(names.iter().any(|n| n.contains("recovery unit")));
        assert!(
            names
                .iter()
                .any(|n| n.contains("reboot right after the switch"))
        );
    }
}
