//! The nspawn lifecycle helper and the agent binaries placed for machines.
//!
//! Host systemd runs the helper — a copy of the agent binary at
//! [`LIFECYCLE_HELPER`](crate::machine::nodeconfig::LIFECYCLE_HELPER) — around every machine start:
//! `nspawn-lifecycle pre-start <m>` re-renders the machine's host-side settings (`.nspawn` and the
//! unit drop-in) from the current config and host devices, so a machine started at boot or by
//! `Restart=` sees today's devices; `post-start <m>` has nothing to do for CPU nodes (GPU driver
//! reconciliation is not implemented) and succeeds. The helper is a copy rather than a link so
//! upgrading the agent never breaks units already written.

use std::path::{Path, PathBuf};

use crate::config;
use crate::context::Host;
use crate::machine::nodeconfig::{self, LIFECYCLE_HELPER};
use crate::machine::nodegoal::{self, HostFacts, OPTIONAL_DEVICES};
use crate::machine::nspawn::{self, MACHINES};

/// Where the agent binary goes inside a machine (kubelet's exec credential runs it there).
pub const AGENT_IN_MACHINE: &str = "usr/local/bin/aks-flex-node";

/// Copies the running agent binary to the lifecycle helper path (0755), if it differs.
pub fn install_helper(host: &Host, exe: &Path) -> anyhow::Result<bool> {
    let bytes = std::fs::read(exe)?;
    Ok(host
        .fs
        .write_if_changed(Path::new(LIFECYCLE_HELPER), &bytes, 0o755)?)
}

/// `install-binary-in-rootfs`: copies the agent binary into the machine (0750).
pub fn install_binary_in_rootfs(host: &Host, exe: &Path, machine: &str) -> anyhow::Result<()> {
    let bytes = std::fs::read(exe)?;
    let dest = nspawn::machine_dir(machine).join(AGENT_IN_MACHINE);
    host.fs.write_if_changed(&dest, &bytes, 0o750)?;
    Ok(())
}

/// The running executable.
pub fn current_exe() -> anyhow::Result<PathBuf> {
    Ok(std::env::current_exe()?)
}

/// Host facts for goal resolution, read from the host.
pub fn host_facts(host: &Host) -> anyhow::Result<HostFacts> {
    Ok(HostFacts {
        hostname: host.info.hostname()?,
        arch: host_arch()?.to_string(),
        present_devices: OPTIONAL_DEVICES
            .iter()
            .filter(|d| host.fs.exists(Path::new(d)))
            .map(|d| (*d).to_string())
            .collect(),
        oci_image_env: std::env::var(nodegoal::OCI_IMAGE_ENV).ok(),
    })
}

/// The host's architecture as OCI and Kubernetes name it.
pub fn host_arch() -> anyhow::Result<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => Ok("amd64"),
        "aarch64" => Ok("arm64"),
        other => anyhow::bail!("unsupported host architecture {other}"),
    }
}

fn check_machine(machine: &str) -> anyhow::Result<()> {
    if !MACHINES.contains(&machine) {
        anyhow::bail!("unknown nspawn machine {machine:?}");
    }
    Ok(())
}

/// `nspawn-lifecycle pre-start <m>`.
pub async fn pre_start(host: &Host, machine: &str, config_path: &Path) -> anyhow::Result<()> {
    check_machine(machine)?;
    let bytes = match host.fs.read(config_path)? {
        Some(b) => b,
        None => {
            tracing::info!(
                machine,
                "no agent config yet; keeping the provisioned settings"
            );
            return Ok(());
        }
    };
    let info = host.info.clone();
    let cfg = config::parse(&bytes, &|| info.hostname())?.config;
    let goal = nodegoal::resolve(&cfg, machine, &host_facts(host)?)?;
    let changed = nodeconfig::apply(&host.fs, machine, &nodeconfig::render_host(&goal))?;
    if changed > 0 {
        tracing::info!(machine, changed, "machine settings re-rendered");
        host.systemd.daemon_reload().await?;
    }
    Ok(())
}

/// `nspawn-lifecycle post-start <m>`.
pub async fn post_start(machine: &str) -> anyhow::Result<()> {
    check_machine(machine)?;
    tracing::debug!(machine, "post-start: nothing to reconcile on a CPU node");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flex_testkit::FakeHost;

    #[tokio::test]
    async fn pre_start_rerenders_and_reloads_only_on_change() {
        let f = FakeHost::new().unwrap();
        let cfg = Path::new("/etc/aks-flex-node/config.json");
        // No config: nothing to do.
        pre_start(&f.host, "kube1", cfg).await.unwrap();
        assert!(f.systemd.calls().is_empty());
        f.host
            .fs
            .write_atomic(
                cfg,
                include_bytes!("../../tests/fixtures/config-token.json"),
                0o600,
            )
            .unwrap();
        f.host
            .fs
            .write_atomic(Path::new("/dev/kvm"), b"", 0o600)
            .unwrap();
        pre_start(&f.host, "kube1", cfg).await.unwrap();
        assert_eq!(f.systemd.calls(), vec!["daemon-reload"]);
        let nspawn = f
            .host
            .fs
            .read_to_string(&nspawn::nspawn_file("kube1"))
            .unwrap()
            .unwrap();
        assert!(nspawn.contains("Bind=/dev/kvm\n"), "{nspawn}");
        pre_start(&f.host, "kube1", cfg).await.unwrap();
        assert_eq!(
            f.systemd.calls(),
            vec!["daemon-reload"],
            "unchanged: no reload"
        );
        assert!(pre_start(&f.host, "kube9", cfg).await.is_err());
        assert!(post_start("kube2").await.is_ok());
        assert!(post_start("x").await.is_err());
    }

    #[test]
    fn binaries_are_copied_with_modes() {
        let f = FakeHost::new().unwrap();
        let exe = f.root.path().join("agent-bin");
        std::fs::write(&exe, b"\x7fELF...").unwrap();
        assert!(install_helper(&f.host, &exe).unwrap());
        assert!(!install_helper(&f.host, &exe).unwrap());
        assert_eq!(f.host.fs.mode(Path::new(LIFECYCLE_HELPER)), Some(0o755));
        install_binary_in_rootfs(&f.host, &exe, "kube2").unwrap();
        assert_eq!(
            f.host.fs.mode(Path::new(
                "/var/lib/machines/kube2/usr/local/bin/aks-flex-node"
            )),
            Some(0o750)
        );
    }
}
