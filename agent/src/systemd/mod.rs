//! systemd: the agent's own units (rendered in [`units`]), installing and uninstalling its
//! service; the manager is the host crate's ([`flex_host::systemd`]).

mod units;

use std::path::Path;

use flex_host::fs::HostFs;
use flex_host::systemd::{SystemdError, SystemdManager};

pub use units::{
    AGENT_IMAGE_ENV, AGENT_UNIT, AGENT_UNIT_PATH, BOOTSTRAP_UNIT, CONTAINER_SETTINGS,
    CTR_NAMESPACE, ContainerUnit, RECOVERY_UNIT, RECOVERY_UNIT_PATH, RESET_UNIT, render_agent_unit,
    render_agent_unit_for, render_container_recovery_unit, render_container_unit,
    render_recovery_unit, render_recovery_unit_for,
};

/// `InstallService`: writes the agent's unit (0644), enables it (which reloads the manager, so
/// the new unit file is loaded: one reload, not two, each about 3.5 s on a slow host) and
/// starts it.
pub async fn install_service(
    fs: &HostFs,
    systemd: &dyn SystemdManager,
    unit_contents: &str,
) -> Result<(), SystemdError> {
    fs.write_atomic(Path::new(AGENT_UNIT_PATH), unit_contents.as_bytes(), 0o644)?;
    systemd.enable(AGENT_UNIT).await?;
    systemd.start(AGENT_UNIT).await?;
    tracing::info!(unit = AGENT_UNIT, "systemd service installed and started");
    Ok(())
}

/// `UninstallService`: disable (a failure is a warning), remove the unit file (missing is fine),
/// reload, and stop the service last (a failure is a warning). The daemon uninstalls its own
/// service (node deletion, AgentReset): stopping comes last because it may end the caller, and
/// by then nothing is left to do. A failed reload is returned after the stop.
pub async fn uninstall_service(
    fs: &HostFs,
    systemd: &dyn SystemdManager,
) -> Result<(), SystemdError> {
    if let Err(e) = systemd.disable(AGENT_UNIT).await {
        tracing::warn!(unit = AGENT_UNIT, error = %e, "failed to disable service");
    }
    fs.remove_file(Path::new(AGENT_UNIT_PATH))?;
    // Its recovery unit goes with it (nothing of the agent runs after an uninstall).
    fs.remove_file(Path::new(RECOVERY_UNIT_PATH))?;
    let reloaded = systemd.daemon_reload().await;
    if reloaded.is_ok() {
        tracing::info!(
            unit = AGENT_UNIT,
            "systemd service uninstalled; stopping it"
        );
    }
    if let Err(e) = systemd.stop(AGENT_UNIT).await {
        tracing::warn!(unit = AGENT_UNIT, error = %e, "failed to stop service");
    }
    reloaded
}

#[cfg(test)]
mod tests {
    use super::*;
    use flex_testkit::FakeSystemd;

    #[tokio::test]
    async fn install_and_uninstall_service() {
        let d = tempfile::tempdir().unwrap();
        let fs = HostFs::new(d.path());
        let sd = FakeSystemd::new();
        install_service(&fs, &sd, &render_agent_unit())
            .await
            .unwrap();
        assert_eq!(fs.mode(Path::new(AGENT_UNIT_PATH)), Some(0o644));
        assert_eq!(
            fs.read_to_string(Path::new(AGENT_UNIT_PATH))
                .unwrap()
                .unwrap(),
            render_agent_unit()
        );
        sd.fail_on("stop aks-flex-node-agent.service");
        uninstall_service(&fs, &sd).await.unwrap();
        assert!(!fs.exists(Path::new(AGENT_UNIT_PATH)));
        // Idempotent: a second uninstall succeeds.
        uninstall_service(&fs, &sd).await.unwrap();
        // The stop comes last: when the daemon uninstalls itself, the stop may end it, and by
        // then the unit is disabled, removed and reloaded.
        insta::assert_snapshot!(sd.calls().join("\n"), @r"
        enable aks-flex-node-agent.service
        start aks-flex-node-agent.service
        disable aks-flex-node-agent.service
        daemon-reload
        stop aks-flex-node-agent.service
        disable aks-flex-node-agent.service
        daemon-reload
        stop aks-flex-node-agent.service
        ");
    }

    #[tokio::test]
    async fn uninstall_fails_when_reload_fails_but_still_stops_the_service() {
        let d = tempfile::tempdir().unwrap();
        let fs = HostFs::new(d.path());
        let sd = FakeSystemd::new();
        sd.fail_on("daemon-reload");
        assert!(uninstall_service(&fs, &sd).await.is_err());
        assert_eq!(
            sd.calls().last().map(String::as_str),
            Some("stop aks-flex-node-agent.service")
        );
    }
}
