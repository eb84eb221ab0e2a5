//! Node reset, as upstream's `ResetNode`: stop both machines, remove them, remove the network
//! state the node left (interfaces, WireGuard keys, policy routes, legacy bridge CNI rules),
//! reload systemd, remove the agent's runtime directories and uninstall Azure Arc. The `reset`
//! command first uninstalls the agent's own service.
//!
//! Reset is idempotent: on a clean host it only inspects (lists machines, links, rules) and
//! changes nothing. A runtime directory that is a mount point (as in the agent's container) and
//! is empty after its contents are removed counts as removed.

use std::collections::BTreeSet;
use std::path::Path;

use crate::machine::nspawn::{self, MACHINES, Timings};
use crate::task::{StepError, step};
use flex_host::context::Host;
use flex_host::fs::Removed;
use flex_host::runner::Cmd;

/// Runtime directories reset removes (upstream removes the default log dir, not `agent.logDir`).
pub const RUNTIME_DIRS: &[&str] = &["/etc/aks-flex-node", "/var/log/aks-flex-node"];

/// Interfaces the node's networking may create.
pub const NODE_INTERFACES: &[&str] = &["geneve0", "vxlan0", "ipip0", "unbounded0", "cbr0"];

/// WireGuard key files.
pub const WIREGUARD_KEYS: &[&str] = &["/etc/wireguard/server.priv", "/etc/wireguard/server.pub"];

/// Policy-routing tables the node's networking uses.
pub const ROUTE_TABLES: std::ops::RangeInclusive<u32> = 51820..=51899;

/// Runs `ResetNode` (the daemon keeps running; the `reset` command uninstalls the service first).
///
/// Its first step removes the bootstrap marks (complete, then started): a reset cut short after
/// it removed a machine must not leave a node that `bootstrap-node` calls bootstrapped.
pub async fn reset_node(host: &Host, t: Timings) -> Result<(), StepError> {
    step("forget-bootstrap", async { forget_bootstrap(host) }).await?;
    for m in MACHINES {
        step(&format!("stop-node-{m}"), nspawn::stop_node(host, m, t)).await?;
    }
    for m in MACHINES {
        step(
            &format!("cleanup-machine-{m}"),
            nspawn::cleanup_machine(host, m, t),
        )
        .await?;
    }
    step("remove-network-interfaces", remove_network_interfaces(host)).await?;
    step("remove-wireguard-keys", remove_wireguard_keys(host)).await?;
    step("cleanup-routes", cleanup_routes(host)).await?;
    step("cleanup-legacy-cni", cleanup_legacy_cni(host)).await?;
    step(
        "remove-host-routing",
        crate::flows::setup_host::routing::remove(host),
    )
    .await?;
    step("reload-systemd", async {
        host.systemd.daemon_reload().await
    })
    .await?;
    step("remove-runtime-dirs", remove_runtime_dirs(host)).await?;
    step("uninstall-arc", uninstall_arc(host)).await?;
    Ok(())
}

/// `forget-bootstrap`: removes the "bootstrap complete" mark, then the "bootstrap started" one
/// (missing marks are fine).
pub fn forget_bootstrap(host: &Host) -> Result<(), crate::state::StateError> {
    crate::state::BootstrapMarkStore::new(host.fs.clone()).delete()?;
    crate::state::BootstrapMarkStore::started(host.fs.clone()).delete()
}

/// Interface names from `ip -o link show` (`2: eth0: <...>`, `5: veth0@if4: <...>`).
pub fn parse_link_names(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).trim().to_string())
        .filter(|n| !n.is_empty())
        .collect()
}

fn is_wireguard(name: &str) -> bool {
    name.strip_prefix("wg")
        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

/// `remove-network-interfaces`: deletes `wg<N>` and the node's overlay interfaces. Failures are
/// warnings.
pub async fn remove_network_interfaces(host: &Host) -> anyhow::Result<()> {
    let out = match host
        .runner
        .run(&Cmd::new("ip").args(["-o", "link", "show"]))
        .await
    {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list network interfaces");
            return Ok(());
        }
    };
    for name in parse_link_names(&out.stdout) {
        if (is_wireguard(&name) || NODE_INTERFACES.contains(&name.as_str()))
            && let Err(e) = host
                .runner
                .run(&Cmd::new("ip").args(["link", "delete", &name]))
                .await
        {
            tracing::warn!(interface = %name, error = %e, "failed to delete interface");
        }
    }
    Ok(())
}

/// `remove-wireguard-keys`.
pub async fn remove_wireguard_keys(host: &Host) -> anyhow::Result<()> {
    for k in WIREGUARD_KEYS {
        if let Err(e) = host.fs.remove_file(Path::new(k)) {
            tracing::warn!(error = %e, "failed to remove WireGuard key");
        }
    }
    Ok(())
}

/// Tables in [`ROUTE_TABLES`] referenced by `ip rule show` lines or `ip route show table all`
/// lines (`... table 51898 ...`).
pub fn tables_in_range(out: &str) -> BTreeSet<u32> {
    out.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            while let Some(w) = it.next() {
                if w == "table" || w == "lookup" {
                    return it.next().and_then(|t| t.parse::<u32>().ok());
                }
            }
            None
        })
        .filter(|t| ROUTE_TABLES.contains(t))
        .collect()
}

/// `cleanup-routes`: removes every policy rule pointing at a table in 51820–51899 and flushes
/// those tables. Upstream deletes and flushes all 80 tables blindly (160+ commands); this reads
/// the rules and routes once and touches only the tables in use, with the same end state.
pub async fn cleanup_routes(host: &Host) -> anyhow::Result<()> {
    let r = &host.runner;
    let rules = r
        .run(&Cmd::new("ip").args(["-4", "rule", "show"]))
        .await
        .map(|o| o.stdout)
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot list ip rules");
            String::new()
        });
    let routes = r
        .run(&Cmd::new("ip").args(["-4", "route", "show", "table", "all"]))
        .await
        .map(|o| o.stdout)
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot list routes");
            String::new()
        });
    let rule_tables = tables_in_range(&rules);
    for t in &rule_tables {
        let ts = t.to_string();
        // Repeat until no rule for the table is left (bounded by the number of rule lines).
        for _ in 0..=rules.lines().count() {
            let out = r
                .output(&Cmd::new("ip").args(["rule", "del", "table", &ts]))
                .await?;
            if !out.success() {
                break;
            }
        }
    }
    let mut tables = rule_tables;
    tables.extend(tables_in_range(&routes));
    for t in tables {
        if let Err(e) = r
            .run(&Cmd::new("ip").args(["route", "flush", "table", &t.to_string()]))
            .await
        {
            tracing::warn!(table = t, error = %e, "failed to flush route table");
        }
    }
    Ok(())
}

/// Chains created by the retired bridge CNI, from `iptables-save -t nat`: `-A` chains and `-j`
/// targets starting with `CNI-` on lines whose comment names the `bridge` network.
pub fn legacy_bridge_chains(iptables_save: &str) -> Vec<String> {
    let mut chains = BTreeSet::new();
    for line in iptables_save.lines() {
        if !(line.contains("name: \"bridge\"") || line.contains("name: \\\"bridge\\\"")) {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        for pair in words.windows(2) {
            if (pair[0] == "-A" || pair[0] == "-j") && pair[1].starts_with("CNI-") {
                chains.insert(pair[1].to_string());
            }
        }
    }
    chains.into_iter().collect()
}

/// POSTROUTING rule numbers whose target is one of `chains`, highest first, from
/// `iptables -t nat -L POSTROUTING --line-numbers -n`.
pub fn postrouting_rules_to_delete(listing: &str, chains: &[String]) -> Vec<u32> {
    let mut nums: Vec<u32> = listing
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let num = w.next()?.parse::<u32>().ok()?;
            let target = w.next()?;
            chains.iter().any(|c| c == target).then_some(num)
        })
        .collect();
    nums.sort_unstable_by(|a, b| b.cmp(a));
    nums
}

/// Rule handles in `nft -a list chain inet cni_plugins_masquerade masq_checks` output that
/// belong to the bridge network (`net: bridge,`).
pub fn legacy_nft_handles(listing: &str) -> Vec<u64> {
    listing
        .lines()
        .filter(|l| l.contains("net: bridge,"))
        .filter_map(|l| {
            let (_, h) = l.rsplit_once("# handle ")?;
            h.trim().parse().ok()
        })
        .collect()
}

/// `cleanup-legacy-cni`: removes what the retired `99-bridge.conf` CNI left (the `cni0` bridge,
/// its iptables NAT chains and nftables masquerade rules). Best effort: never fails.
pub async fn cleanup_legacy_cni(host: &Host) -> anyhow::Result<()> {
    let r = &host.runner;
    if r.output(&Cmd::new("ip").args(["link", "show", "dev", "cni0"]))
        .await
        .is_ok_and(|o| o.success())
        && let Err(e) = r
            .run(&Cmd::new("ip").args(["link", "delete", "cni0"]))
            .await
    {
        tracing::warn!(error = %e, "failed to delete cni0");
    }
    if r.which("iptables-save").is_some() && r.which("iptables").is_some() {
        match r.run(&Cmd::new("iptables-save").args(["-t", "nat"])).await {
            Ok(save) => {
                let chains = legacy_bridge_chains(&save.stdout);
                if !chains.is_empty() {
                    let ipt = |args: &[&str]| {
                        Cmd::new("iptables")
                            .args(["--wait", "-t", "nat"])
                            .args(args.iter().copied())
                    };
                    if let Ok(list) = r
                        .run(&ipt(&["-L", "POSTROUTING", "--line-numbers", "-n"]))
                        .await
                    {
                        for n in postrouting_rules_to_delete(&list.stdout, &chains) {
                            if let Err(e) =
                                r.run(&ipt(&["-D", "POSTROUTING", &n.to_string()])).await
                            {
                                tracing::warn!(error = %e, "failed to delete POSTROUTING rule");
                            }
                        }
                    }
                    for c in &chains {
                        for op in ["-F", "-X"] {
                            if let Err(e) = r.run(&ipt(&[op, c])).await {
                                tracing::warn!(chain = %c, error = %e, "failed to clean chain");
                            }
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "iptables-save unavailable; skipping"),
        }
    } else {
        tracing::debug!("iptables not installed; skipping legacy CNI rules");
    }
    if r.which("nft").is_some() {
        let list = r
            .output(&Cmd::new("nft").args([
                "-a",
                "list",
                "chain",
                "inet",
                "cni_plugins_masquerade",
                "masq_checks",
            ]))
            .await;
        if let Some(list) = list.ok().filter(|o| o.success()) {
            for h in legacy_nft_handles(&list.stdout) {
                let cmd = Cmd::new("nft").args([
                    "delete",
                    "rule",
                    "inet",
                    "cni_plugins_masquerade",
                    "masq_checks",
                    "handle",
                    &h.to_string(),
                ]);
                if let Err(e) = r.run(&cmd).await {
                    tracing::warn!(error = %e, "failed to delete nft rule");
                }
            }
        }
    }
    Ok(())
}

/// `remove-runtime-dirs`: removes `/etc/aks-flex-node` and `/var/log/aks-flex-node`. A
/// directory that is a mount point (the agent's container) counts as removed once emptied, and
/// in the container the host's directory itself goes through `/host`.
pub async fn remove_runtime_dirs(host: &Host) -> anyhow::Result<()> {
    for d in RUNTIME_DIRS {
        match host.fs.remove_dir_all(Path::new(d))? {
            Removed::Removed => tracing::info!(path = d, "removed runtime directory"),
            Removed::EmptiedMountPoint => {
                // In the agent's container the directory is a bind mount of the host's: its
                // contents are gone, and the host's (now empty) directory is removed through
                // the host's root, which is not a mount point here.
                let on_host =
                    Path::new(flex_host::hostexec::HOST_ROOT).join(d.trim_start_matches('/'));
                if host.containerized() && host.fs.exists(&on_host) {
                    host.fs.remove_dir_all(&on_host)?;
                }
                tracing::info!(path = d, "removed runtime directory (it was a mount point)")
            }
            Removed::Absent => {}
        }
    }
    Ok(())
}

const ARC_SERVICES: &[&str] = &["himdsd.service", "gcarcservice.service", "extd.service"];
const ARC_FILES: &[&str] = &[
    "/usr/bin/azcmagent",
    "/usr/local/bin/azcmagent",
    "/opt/azcmagent/bin/azcmagent",
    "/lib/systemd/system/himdsd.service",
    "/lib/systemd/system/gcarcservice.service",
    "/etc/systemd/system/himdsd.service",
    "/etc/systemd/system/gcarcservice.service",
];
const ARC_DIRS: &[&str] = &[
    "/var/opt/azcmagent",
    "/opt/azcmagent",
    "/etc/opt/azcmagent",
    "/var/log/azcmagent",
    "/var/log/himds",
    "/var/lib/GuestConfig",
];

async fn arc_detected(host: &Host) -> bool {
    if host.runner.which("azcmagent").is_some() {
        return true;
    }
    for s in ARC_SERVICES {
        if host.systemd.is_active(s).await.unwrap_or(false) {
            return true;
        }
    }
    ARC_FILES
        .iter()
        .chain(ARC_DIRS)
        .any(|p| host.fs.exists(Path::new(p)))
}

/// `uninstall-arc`: if Azure Arc is detected, disconnect locally, purge the `azcmagent` package
/// (where dpkg exists), stop and disable its services and remove its files. Best effort: problems are warnings.
pub async fn uninstall_arc(host: &Host) -> anyhow::Result<()> {
    if !arc_detected(host).await {
        tracing::debug!("Azure Arc not detected");
        return Ok(());
    }
    if host.runner.which("azcmagent").is_some()
        && let Err(e) = host
            .runner
            .run(&Cmd::new("azcmagent").args(["disconnect", "--force-local-only"]))
            .await
    {
        tracing::warn!(error = %e, "azcmagent disconnect failed");
    }
    // The package too, where dpkg installed it (the installer uses the host's package manager).
    if host.runner.which("dpkg").is_some()
        && let Err(e) = host
            .runner
            .run(&Cmd::new("dpkg").args(["--purge", "azcmagent"]))
            .await
    {
        tracing::warn!(error = %e, "dpkg --purge azcmagent failed");
    }
    for s in ARC_SERVICES {
        let _ = host.systemd.stop(s).await;
        let _ = host.systemd.disable(s).await;
    }
    for p in ARC_FILES {
        if let Err(e) = host.fs.remove_file(Path::new(p)) {
            tracing::warn!(error = %e, "failed to remove Arc file");
        }
    }
    for d in ARC_DIRS {
        if let Err(e) = host.fs.remove_dir_all(Path::new(d)) {
            tracing::warn!(error = %e, "failed to remove Arc directory");
        }
    }
    if let Err(e) = host.systemd.daemon_reload().await {
        tracing::warn!(error = %e, "daemon-reload after Arc removal failed");
    }
    if arc_detected(host).await {
        tracing::warn!("Azure Arc still detected after uninstall");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
