//! `setupHost`: prepare the host for nspawn machines, as upstream's host phase does.
//!
//! Serial: `install-packages`, then (upstream runs these in parallel; they touch disjoint files
//! and units) `configure-os`, `configure-nftables`, `disable-docker`, `disable-swap`,
//! `harden-apt`, `install-arc` (module `arc`); then host routing, `configure-static-routes` and
//! `check-route-overlap` ([`routing`]). In the agent's container `install-packages` is left
//! out: the container's `PATH` is the image's, and a package manager there would install into
//! the container.

mod arc;
mod os;
mod packages;
pub mod routing;

use crate::config::Config;
use crate::task::{StepError, step};
use flex_host::context::Host;

pub use arc::{ArcSeams, DEFAULT_HIMDS, agent_status, ensure_arc, himds_token, install_arc};
pub use os::{
    APT_NEEDRESTART_PATH, APT_UNATTENDED_PATH, DOCKER_DAEMON_JSON, NFT_CLEAR_PATH, NFT_FLUSH_UNIT,
    NFT_FLUSH_UNIT_PATH, SYSCTL_PATH, configure_nftables, configure_os, disable_docker,
    disable_swap, harden_apt, render_sysctl,
};
pub use packages::{PackageError, REQUIRED_PACKAGES, check_capabilities, install_packages};

/// Runs `setupHost`.
pub async fn setup_host(host: &Host, config: &Config) -> Result<(), StepError> {
    if host.containerized() {
        tracing::info!(
            task = "install-packages",
            "skipped in the agent's container"
        );
    } else {
        step("install-packages", install_packages(host, config)).await?;
    }
    step("configure-os", configure_os(host)).await?;
    step("configure-nftables", configure_nftables(host)).await?;
    step("disable-docker", disable_docker(host)).await?;
    step("disable-swap", disable_swap(host)).await?;
    step("harden-apt", harden_apt(host)).await?;
    step("install-arc", install_arc(host, config)).await?;
    // Validated when the config loaded; a config that was not (a test's) fails here.
    let plan = crate::config::routing::plan(&config.host_routing).map_err(|e| StepError {
        name: "configure-static-routes".into(),
        cause: anyhow::anyhow!("{e}"),
    })?;
    step(
        "configure-static-routes",
        routing::configure_static_routes(host, &plan),
    )
    .await?;
    step(
        "check-route-overlap",
        routing::check_route_overlap(host, &plan),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests;
