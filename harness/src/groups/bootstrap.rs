//! The `bootstrap` host group: `bootstrap.env` is data (never evaluated), and `start` ran once
//! and saved the state (a second start finds the node bootstrapped). A second bootstrap with a
//! new config is the `reset` group's: it follows the reset that group checks, so the pass
//! resets and bootstraps once, not twice.

use std::time::Duration;

use crate::check::{Ctx, Group, HostMode, Needs, check, ensure};
use crate::kit::agent::{T, write_bootstrap_env};
use crate::provision::{PWNED_MARKER, hostile_location};
use crate::report::Outcome;

/// The `bootstrap` group.
pub const GROUP: Group = Group {
    name: "bootstrap",
    description: "bootstrap.env is data; start runs once and saves state",
    needs: Needs::Host,
    checks: &[
        check!("bootstrap.env is data", bootstrap_env_is_data),
        check!("start ran once and saved the state", start_ran_once),
    ],
    in_host_mode: HostMode::Same,
};

async fn bootstrap_env_is_data(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    let evaluated = c.output(&format!("test -e {PWNED_MARKER}"), T).await?;
    ensure(!evaluated.success(), || {
        format!("{PWNED_MARKER} exists: bootstrap.env was evaluated")
    })?;
    let cfg = c.agent_config().await?;
    let loc = cfg.azure.target_cluster.location;
    ensure(loc == hostile_location(), || {
        format!("location in config.json is {loc:?}")
    })?;
    Ok(Outcome::Passed)
}

async fn start_ran_once(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    // One file per record (its checksum inside, no `.sha256` sidecar), and the bootstrap
    // marked complete last.
    c.sh("test -s /etc/aks-flex-node/daemon-state.json && ! test -e /etc/aks-flex-node/daemon-state.json.sha256 && test -s /etc/aks-flex-node/bootstrap-complete.json")
        .await?;
    let count = || async {
        c.sh("journalctl -u aks-flex-node-bootstrap.service -o cat | grep -c 'AKS Flex Node agent service started successfully' || true")
            .await
    };
    let before: u32 = count().await?.parse().unwrap_or(0);
    ensure(before == 1, || {
        format!("start reported success {before} times")
    })?;
    // The first-boot unit removed the file that carried the token once the bootstrap succeeded
    // (the drop-in `aks-flex-node ignition` and the harness's config add).
    let kept = c
        .output("test -e /etc/aks-flex-node/bootstrap.env", T)
        .await?;
    ensure(!kept.success(), || {
        "/etc/aks-flex-node/bootstrap.env (it carries the token) is still there after the bootstrap"
            .into()
    })?;
    // Inputs again, so the unit runs (its condition) and must find the node bootstrapped.
    let env = c.state.bootstrap_env.clone().unwrap_or_default();
    write_bootstrap_env(c, &env).await?;
    c.sh_t(
        "systemctl restart aks-flex-node-bootstrap.service",
        Duration::from_secs(300),
    )
    .await?;
    let after: u32 = count().await?.parse().unwrap_or(0);
    ensure(after == 1, || {
        format!("a second bootstrap ran start again ({after} successes)")
    })?;
    Ok(Outcome::Passed)
}
