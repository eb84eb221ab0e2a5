//! The `metrics` host group: a real Prometheus (Debian's, on this host's loopback,
//! [`crate::prometheus`]) scrapes the agent's daemon in the VM through an ssh forward of its
//! loopback-only metrics port, and its HTTP API shows the counters move after a NodeReboot and,
//! in image mode, an AgentUpgrade, both run node-locally (`aks-flex-node operation run`, where
//! the agent runs), as an operator's dashboard would see them. The counts of node-local runs
//! are the daemon's `aks_flex_node_local_operations_total`, kept on disk, so the AgentUpgrade's
//! check also shows the NodeReboot's count served again by the upgraded daemon.
//!
//! Real: Prometheus, ssh, the guest, the agent, its daemon's endpoint and its tally. The
//! controller has no process offline; its metrics are scraped by a real Prometheus in the
//! harness's own tests (`prometheus::tests`).

use std::time::{Duration, Instant};

use crate::check::{Check, Ctx, Group, HostMode, Needs, check, ensure, secs};
use crate::kit::agent::agent_command;
use crate::kit::candidates;
use crate::kit::upgrade_status::{self as status, short};
use crate::prometheus::{self, DaemonForward, Prometheus, Sample, Target};
use crate::report::Checked;
use crate::ssh::shell_quote;

/// How long the scrape has to show the daemon.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the guest command of an operation may take.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(600);
/// How long an upgrade has until its count shows: the restart, then the offline proof.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(600);
/// The scrape job of the daemon.
const JOB: &str = "daemon";

/// The checks both modes run.
const SCRAPED: Check = check!(
    "Prometheus scrapes the daemon's loopback endpoint through a forward",
    scraped
);
const NODE_REBOOT: Check = check!(
    "after operation run NodeReboot, Prometheus shows the count move",
    node_reboot_counted
);
const STOPPED: Check = check!("Prometheus and the forward stop", stopped);

/// The `metrics` group.
pub const GROUP: Group = Group {
    name: "metrics",
    description: "a real Prometheus scrapes the daemon through a forward; its API shows local_operations_total move after a NodeReboot and an AgentUpgrade run on the node",
    needs: Needs::Host,
    checks: &[
        SCRAPED,
        NODE_REBOOT,
        check!(
            "after operation run AgentUpgrade, Prometheus shows the upgraded daemon's count move, the NodeReboot's kept",
            upgrade_counted
        ),
        STOPPED,
    ],
    in_host_mode: HostMode::Variant(&HOST_GROUP),
};

/// The `metrics` group in host mode: the same scrape and NodeReboot. The AgentUpgrade check
/// is the image pass's: its count goes through the same tally and endpoint code in both modes,
/// and host mode's upgrade (by download URL) is the `upgrade` group's host variant.
pub const HOST_GROUP: Group = Group {
    name: "metrics",
    description: "host mode: a real Prometheus scrapes the daemon through a forward; its API shows local_operations_total move after a NodeReboot run on the node",
    needs: Needs::Host,
    checks: &[SCRAPED, NODE_REBOOT, STOPPED],
    in_host_mode: HostMode::Same,
};

/// The PromQL of one node-local series' count.
pub fn local_count_query(kind: &str, phase: &str, reason: &str) -> String {
    format!(
        "aks_flex_node_local_operations_total{{job={JOB:?},kind={kind:?},phase={phase:?},reason={reason:?}}}"
    )
}

/// The sum of the samples' values (0 for none: a series not there yet has counted nothing).
fn total(s: &[Sample]) -> f64 {
    // Folded from +0.0: an empty f64 sum is -0.0, which would print as "-0".
    s.iter().fold(0.0, |a, s| a + s.value)
}

/// The Prometheus the group's first check started, its forward made sure of.
async fn running(c: &Ctx<'_>) -> anyhow::Result<Prometheus> {
    let dir = prometheus::dir(&c.state.work);
    let p = Prometheus::load(&dir)?
        .ok_or_else(|| anyhow::anyhow!("no Prometheus: the group's first check starts it"))?;
    let port = p
        .targets
        .iter()
        .find(|t| t.job == JOB)
        .and_then(|t| t.address.rsplit_once(':'))
        .and_then(|(_, port)| port.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("the recorded Prometheus has no {JOB} target"))?;
    DaemonForward::new(&dir, port)
        .ensure(c.runner, c.ssh)
        .await?;
    Ok(p)
}

async fn scraped(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let dir = prometheus::dir(&c.state.work);
    std::fs::create_dir_all(&dir)?;
    let forward = DaemonForward::new(&dir, crate::registry::free_port()?);
    forward.stop(c.runner).await;
    forward.ensure(c.runner, c.ssh).await?;
    let p = prometheus::start(
        c.runner,
        &dir,
        vec![Target {
            job: JOB.into(),
            address: forward.address(),
        }],
    )
    .await?;
    let t0 = Instant::now();
    p.wait_for(
        "Prometheus to scrape the daemon",
        &format!("up{{job={JOB:?}}}"),
        SCRAPE_TIMEOUT,
        |s| total(s) == 1.0,
    )
    .await?;
    let build = p
        .wait_for(
            "the daemon's build info",
            &format!("aks_flex_node_build_info{{job={JOB:?}}}"),
            SCRAPE_TIMEOUT,
            |s| s.len() == 1,
        )
        .await?;
    let version = build[0].labels.get("version").cloned().unwrap_or_default();
    Ok(Checked::passed_with(format!(
        "{} scrapes 127.0.0.1:{} in the guest through {} every {}; up after {}; agent {version}",
        p.url(),
        prometheus::DAEMON_METRICS_PORT,
        forward.address(),
        secs(prometheus::SCRAPE_INTERVAL),
        secs(t0.elapsed())
    )))
}

async fn node_reboot_counted(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let p = running(c).await?;
    let q = local_count_query("NodeReboot", "Complete", "Succeeded");
    let before = total(&p.query(&q).await?);
    let out = c
        .run(
            &agent_command(c.state.mode, "aks-flex-node operation run NodeReboot"),
            OPERATION_TIMEOUT,
        )
        .await?;
    ensure(out.contains("phase: Complete"), || {
        format!("NodeReboot printed {out:?}")
    })?;
    let t0 = Instant::now();
    p.wait_for(
        "Prometheus to show the NodeReboot",
        &q,
        SCRAPE_TIMEOUT,
        |s| total(s) == before + 1.0,
    )
    .await?;
    Ok(Checked::passed_with(format!(
        "local_operations_total NodeReboot/Complete/Succeeded {before} → {} in Prometheus {} after the operation",
        before + 1.0,
        secs(t0.elapsed())
    )))
}

async fn upgrade_counted(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let p = running(c).await?;
    let reboots = total(
        &p.query(&local_count_query("NodeReboot", "Complete", "Succeeded"))
            .await?,
    );
    ensure(reboots >= 1.0, || {
        "no NodeReboot counted before the upgrade: the NodeReboot check comes first".into()
    })?;
    let (rec, _) = candidates::in_registry(c).await?;
    let target = rec.reference(candidates::Kind::Good).to_string();
    let q = local_count_query("AgentUpgrade", "Complete", "Succeeded");
    let before = total(&p.query(&q).await?);
    let t0 = Instant::now();
    let out = c
        .output(
            &agent_command(
                c.state.mode,
                &format!(
                    "aks-flex-node operation run AgentUpgrade --param image={}",
                    shell_quote(&target)
                ),
            ),
            OPERATION_TIMEOUT,
        )
        .await?;
    let r = status::parse_op_result(&out.stdout);
    ensure(
        out.code == Some(0)
            && r.as_ref()
                .is_some_and(|r| r.phase == "InProgress" && r.reason == "RestartScheduled"),
        || {
            format!(
                "AgentUpgrade to {} did not schedule the restart (exit {:?}): stdout {:?}; stderr {}",
                short(&target),
                out.code,
                out.stdout,
                out.stderr.trim()
            )
        },
    )?;
    p.wait_for(
        "Prometheus to show the upgrade complete",
        &q,
        UPGRADE_TIMEOUT,
        |s| total(s) == before + 1.0,
    )
    .await?;
    let counted = t0.elapsed();
    let kept = total(
        &p.query(&local_count_query("NodeReboot", "Complete", "Succeeded"))
            .await?,
    );
    ensure(kept == reboots, || {
        format!("the upgraded daemon serves {kept} NodeReboots, the previous one served {reboots}")
    })?;
    let o = c
        .output(
            &status::probe_script_for(c.state.mode),
            crate::kit::agent::T,
        )
        .await?;
    let agent = status::parse_probe(&o.stdout);
    ensure(agent.runs(&target), || {
        format!("after the upgrade: {agent}")
    })?;
    Ok(Checked::passed_with(format!(
        "AgentUpgrade/Complete/Succeeded {before} → {} in Prometheus {} after the operation started; NodeReboot count {kept} kept across the restart; the agent runs {}",
        before + 1.0,
        secs(counted),
        short(&target)
    )))
}

async fn stopped(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let dir = prometheus::dir(&c.state.work);
    let p = Prometheus::load(&dir)?;
    prometheus::down(c.runner, &c.state.work).await?;
    if let Some(p) = p {
        let still = reqwest::get(format!("{}/-/ready", p.url())).await.is_ok();
        ensure(!still, || {
            format!("{} still answers after the stop", p.url())
        })?;
    }
    ensure(!dir.exists(), || {
        format!("{} is still there", dir.display())
    })?;
    Ok(Checked::from(crate::report::Outcome::Passed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_query_names_the_daemon_job_and_the_series() {
        assert_eq!(
            local_count_query("NodeReboot", "Complete", "Succeeded"),
            "aks_flex_node_local_operations_total{job=\"daemon\",kind=\"NodeReboot\",phase=\"Complete\",reason=\"Succeeded\"}"
        );
    }

    #[test]
    fn no_sample_totals_a_plain_zero() {
        assert_eq!(format!("{}", total(&[])), "0");
    }

    #[test]
    fn the_group_is_registered_in_both_modes() {
        let g = crate::groups::select(Some("metrics")).unwrap();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].checks.len(), 4);
        let host = crate::groups::for_mode(&g[0], crate::hostmode::AgentMode::Host).unwrap();
        assert_eq!(host.checks.len(), 3);
        assert!(host.checks.iter().all(|c| !c.name.contains("AgentUpgrade")));
    }
}
