//! The `host-routing` group (on request: `check --only host-routing`): `hostRouting` through a
//! complete config (`AKS_FLEX_NODE_CONFIG`, the install's config with a route and an expected
//! network added), as an operator sets it. A static route from the config is in place after the
//! bootstrap, with `static-routes.service` and `check-route-overlap.service` active and the
//! overlap it makes recorded (WARN); it is back after a VM reboot; `reset` takes the route, the
//! units and the machines' drop-in away; in STRICT mode the overlap fails the unit and the
//! bootstrap, and the machine does not start. The group ends with the host bootstrapped again
//! from the install's `bootstrap.env`.
//!
//! It resets and bootstraps three times and reboots once (about 8 minutes under TCG), so CI's
//! offline pass does not run it; that pass runs the overlap check in each bootstrap, with no
//! expected network.

use serde_json::{Value, json};

use crate::check::{Ctx, Group, HostMode, Needs, check, ensure};
use crate::kit::agent::{
    BOOTSTRAP_TIMEOUT, RESTART_BOOTSTRAP, bootstrap_and_wait, run_reset, write_bootstrap_env,
};
use crate::report::Outcome;

/// The route the config adds: through the default route's gateway and interface, so the
/// expected network it names overlaps.
pub const ROUTE: &str = "10.77.0.0/16";
/// Where the group puts the config it bootstraps from (the host's, read by the bootstrap;
/// `reset` removes it with the directory).
pub const CONFIG_INPUT: &str = "/etc/aks-flex-node/harness-host-routing.json";
/// The install's config, kept by the first check for the others (a reset removes
/// `/etc/aks-flex-node`); the last check removes it.
pub const BASE_CONFIG: &str = "/root/harness-host-routing-base.json";
const UNITS: &str = "static-routes.service check-route-overlap.service";
const DROPIN: &str =
    "/etc/systemd/system/systemd-nspawn@.service.d/50-aks-flex-node-host-routing.conf";
const DETECTED: &str = "/run/aks-flex-node/route-overlap.detected";

/// The `host-routing` group.
pub const GROUP: Group = Group {
    name: "host-routing",
    description: "hostRouting from a config: a static route after bootstrap and after a reboot, the overlap it makes recorded (WARN) or fatal (STRICT), and reset takes route, units and drop-in away",
    needs: Needs::Host,
    checks: &[
        check!(
            "a static route from the config is in place after bootstrap, its overlap recorded (WARN)",
            route_after_bootstrap
        ),
        check!("the route is back after a VM reboot", route_after_reboot),
        check!(
            "reset takes the route, the units and the machines' drop-in away",
            reset_takes_it_away
        ),
        check!(
            "in STRICT mode the overlap fails the unit and the bootstrap, and no machine starts",
            strict_overlap_fails
        ),
        check!(
            "the host bootstraps again from the install's bootstrap.env",
            bootstrap_again
        ),
    ],
    in_host_mode: HostMode::Same,
};

/// The install's config with `hostRouting` set: [`ROUTE`] from the default route, and the same
/// network expected off the default route's interface, in `mode`.
pub fn with_routing(config: &Value, mode: &str) -> anyhow::Result<Value> {
    let mut c = config.clone();
    let obj = c
        .as_object_mut()
        .ok_or_else(|| anyhow::anyhow!("config.json is not a JSON object"))?;
    obj.insert(
        "hostRouting".into(),
        json!({
            "staticRoutes": {"enabled": true, "routes": [{"destination": ROUTE}]},
            "routeOverlap": {"expectedCidrs": [ROUTE], "mode": mode},
        }),
    );
    Ok(c)
}

/// The `bootstrap.env` that names [`CONFIG_INPUT`]: no rendering input may be beside it, so of
/// the install's inputs only those that are not the config's (preflight's ignore list) stay.
pub fn config_env(install_env: &str) -> String {
    let mut env = format!("AKS_FLEX_NODE_CONFIG={CONFIG_INPUT}\n");
    for line in install_env.lines() {
        if line.starts_with("AKS_FLEX_NODE_PREFLIGHT_IGNORE=") {
            env.push_str(line);
            env.push('\n');
        }
    }
    env
}

/// Resets the host, writes the install's config ([`BASE_CONFIG`]) with routing in `mode` to [`CONFIG_INPUT`] and
/// a `bootstrap.env` naming it, and starts the bootstrap; its result as `systemctl` gives it.
async fn bootstrap_with_routing(
    c: &Ctx<'_>,
    mode: &str,
) -> anyhow::Result<flex_host::runner::Output> {
    let text = c
        .sh(&format!(
            "test -e {BASE_CONFIG} || (umask 077 && cp /etc/aks-flex-node/config.json {BASE_CONFIG}) && cat {BASE_CONFIG}"
        ))
        .await?;
    let config: Value = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("config.json does not parse: {e}"))?;
    let routed = serde_json::to_string_pretty(&with_routing(&config, mode)?)?;
    run_reset(c).await?;
    // The config holds the bootstrap token: on stdin, never in an argument.
    c.guest()
        .sh_stdin(
            &format!("mkdir -p /etc/aks-flex-node && umask 077 && cat > {CONFIG_INPUT}"),
            &flex_host::secret::Secret::new(&routed),
            &[],
        )
        .await?;
    let install_env = c.state.bootstrap_env.clone().unwrap_or_default();
    write_bootstrap_env(c, &config_env(&install_env)).await?;
    c.output(RESTART_BOOTSTRAP, BOOTSTRAP_TIMEOUT).await
}

/// The route's line in the main table, empty when there is none.
async fn route(c: &Ctx<'_>) -> anyhow::Result<String> {
    c.sh(&format!("ip -4 route show {ROUTE}")).await
}

/// The route, both units active, and the overlap recorded.
async fn route_in_place(c: &Ctx<'_>) -> anyhow::Result<()> {
    let r = route(c).await?;
    ensure(!r.is_empty(), || format!("no route to {ROUTE}"))?;
    let active = c
        .output(
            &format!("systemctl is-active {UNITS}"),
            crate::kit::agent::T,
        )
        .await?;
    ensure(active.success(), || {
        format!("{UNITS}: {}", active.stdout.replace('\n', " "))
    })?;
    let detected = c.sh(&format!("cat {DETECTED} 2>/dev/null; true")).await?;
    ensure(detected.contains(ROUTE), || {
        format!("{DETECTED} does not name {ROUTE}: {detected:?}")
    })?;
    Ok(())
}

async fn route_after_bootstrap(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    let out = bootstrap_with_routing(c, "WARN").await?;
    ensure(out.success(), || {
        format!("the bootstrap failed: {}", out.stderr.trim())
    })?;
    c.wait_agent_active().await?;
    route_in_place(c).await?;
    c.ensure_active_machine_running().await?;
    Ok(Outcome::Passed)
}

async fn route_after_reboot(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    let m = c.active_machine().await?;
    c.reboot_and_wait(&m).await?;
    route_in_place(c).await?;
    Ok(Outcome::Passed)
}

async fn reset_takes_it_away(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    run_reset(c).await?;
    let r = route(c).await?;
    ensure(r.is_empty(), || format!("the route is still there: {r}"))?;
    let left = c
        .sh(&format!(
            "for p in /etc/systemd/system/static-routes.service /etc/systemd/system/check-route-overlap.service {DROPIN} {DETECTED}; do test -e $p && echo $p; done; \
             for u in {UNITS}; do systemctl is-enabled --quiet $u 2>/dev/null && echo \"$u enabled\"; done; true"
        ))
        .await?;
    ensure(left.is_empty(), || format!("left behind:\n{left}"))?;
    Ok(Outcome::Passed)
}

async fn strict_overlap_fails(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    let out = bootstrap_with_routing(c, "STRICT").await?;
    ensure(!out.success(), || {
        "the bootstrap succeeded with a STRICT overlap".into()
    })?;
    let failed = c
        .output(
            "systemctl is-failed check-route-overlap.service",
            crate::kit::agent::T,
        )
        .await?;
    ensure(failed.stdout.trim() == "failed", || {
        format!("check-route-overlap.service is {:?}", failed.stdout.trim())
    })?;
    let said = c
        .sh("journalctl -q --no-pager -o cat -u aks-flex-node-bootstrap.service -b | grep -F 'check-route-overlap.service failed' | tail -n 1; true")
        .await?;
    ensure(said.contains(ROUTE), || {
        format!("the bootstrap's error does not name the overlap: {said:?}")
    })?;
    let machines = c
        .sh("machinectl list --no-legend | awk '{print $1}' | grep -E '^kube[12]$'; true")
        .await?;
    ensure(machines.is_empty(), || {
        format!("a machine runs: {machines}")
    })?;
    Ok(Outcome::Passed)
}

async fn bootstrap_again(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    run_reset(c).await?;
    let env = c.state.bootstrap_env.clone().unwrap_or_default();
    write_bootstrap_env(c, &env).await?;
    bootstrap_and_wait(c).await?;
    let r = route(c).await?;
    ensure(r.is_empty(), || {
        format!("a route from the group is left: {r}")
    })?;
    Ok(Outcome::Passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_gets_its_routing_and_the_env_names_only_it() {
        let config = json!({"agent": {"nodeName": "n"}, "hostRouting": {"staticRoutes": {"enabled": false}}});
        let c = with_routing(&config, "STRICT").unwrap();
        assert_eq!(c["agent"]["nodeName"], "n");
        assert_eq!(
            c["hostRouting"]["staticRoutes"]["routes"][0]["destination"],
            ROUTE
        );
        assert_eq!(c["hostRouting"]["routeOverlap"]["mode"], "STRICT");
        assert!(with_routing(&json!([1]), "WARN").is_err());
        let env = config_env(
            "AKS_FLEX_NODE_NODE_NAME=n\nAKS_FLEX_NODE_PREFLIGHT_IGNORE=disk-space\nAKS_FLEX_NODE_BOOTSTRAP_TOKEN=abcdef.0123456789abcdef\n",
        );
        assert_eq!(
            env,
            format!(
                "AKS_FLEX_NODE_CONFIG={CONFIG_INPUT}\nAKS_FLEX_NODE_PREFLIGHT_IGNORE=disk-space\n"
            )
        );
    }
}
