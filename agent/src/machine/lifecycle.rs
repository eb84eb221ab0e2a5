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
use crate::machine::nodeconfig::{self, LIFECYCLE_HELPER};
use crate::machine::nodegoal::{self, HostFacts, OPTIONAL_DEVICES};
use crate::machine::nspawn::{self, MACHINES};
use flex_host::context::Host;

/// Where the agent binary goes inside a machine (kubelet's exec credential runs it there).
pub const AGENT_IN_MACHINE: &str = "usr/local/bin/aks-flex-node";

/// Copies the running agent binary to the lifecycle helper path (0755), if it differs.
pub fn install_helper(host: &Host, exe: &Path) -> anyhow::Result<bool> {
    let bytes = std::fs::read(exe)?;
    Ok(host
        .fs
        .write_if_changed(Path::new(LIFECYCLE_HELPER), &bytes, 0o755)?)
}

/// `install-binary-in-rootfs`: copies the agent binary into the machine (0750), through the
/// machine's own directories: its symlinks are resolved inside it
/// ([`HostFs::confined`](flex_host::fs::HostFs::confined)), never onto the host.
pub fn install_binary_in_rootfs(host: &Host, exe: &Path, machine: &str) -> anyhow::Result<()> {
    let bytes = std::fs::read(exe)?;
    let rootfs = host.fs.confined(&nspawn::machine_dir(machine))?;
    rootfs.write_if_changed(Path::new(AGENT_IN_MACHINE), &bytes, 0o750)?;
    Ok(())
}

/// The running executable.
pub fn current_exe() -> anyhow::Result<PathBuf> {
    Ok(std::env::current_exe()?)
}

/// Host facts for goal resolution, read from the host.
pub fn host_facts(host: &Host) -> anyhow::Result<HostFacts> {
    host_facts_from(host.info.as_ref(), &host.fs)
}

/// [`host_facts`] from the host-info and file seams alone (reads only: `bootstrap-node
/// --dry-run` uses it without the rest of [`Host`]).
pub fn host_facts_from(
    info: &dyn flex_host::hostinfo::HostInfo,
    fs: &flex_host::fs::HostFs,
) -> anyhow::Result<HostFacts> {
    Ok(HostFacts {
        hostname: info.hostname()?,
        arch: host_arch()?.to_string(),
        present_devices: OPTIONAL_DEVICES
            .iter()
            .filter(|d| fs.exists(Path::new(d)))
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

    /// Real files under the fake host's temporary root (only the runner and systemd are
    /// faked, and unused here): the agent binary is copied into the machine through the
    /// machine's own `usr/local/bin`, even when the image made it an absolute symlink to a host
    /// directory; a relative link climbing out of the machine is refused.
    #[test]
    fn binary_in_rootfs_never_lands_outside_the_machine() {
        let f = FakeHost::new().unwrap();
        let exe = f.root.path().join("agent-bin");
        std::fs::write(&exe, b"\x7fELF...").unwrap();
        let machine = f.host.fs.path(&nspawn::machine_dir("kube1"));
        let outside = f.root.path().join("outside");
        std::fs::create_dir_all(machine.join("usr/local")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, machine.join("usr/local/bin")).unwrap();
        install_binary_in_rootfs(&f.host, &exe, "kube1").unwrap();
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "wrote onto the host"
        );
        let inside = machine.join(outside.strip_prefix("/").unwrap());
        assert_eq!(
            std::fs::read(inside.join("aks-flex-node")).unwrap(),
            b"\x7fELF..."
        );

        let machine = f.host.fs.path(&nspawn::machine_dir("kube2"));
        std::fs::create_dir_all(&machine).unwrap();
        // From <root>/var/lib/machines/kube2: up four levels is <root>.
        std::os::unix::fs::symlink("../../../../outside", machine.join("usr")).unwrap();
        assert!(machine.join("usr").is_dir(), "the link leads out");
        assert!(install_binary_in_rootfs(&f.host, &exe, "kube2").is_err());
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "wrote onto the host"
        );
    }

    #[test]
    fn binaries_are_copied_with_modes() {
        let f = FakeHost::new().unwrap();
        let exe = f.root.path().join("agent-bin");
        std::fs::write(&exe, b"\x7fELF...").unwrap();
        assert!(install_helper(&f.host, &exe).unwrap());
        assert!(!install_helper(&f.host, &exe).unwrap());
        assert_eq!(f.host.fs.mode(Path::new(LIFECYCLE_HELPER)), Some(0o755));
        // The machine's root comes from the image pull.
        assert!(install_binary_in_rootfs(&f.host, &exe, "kube2").is_err());
        f.host
            .fs
            .create_dir_all(&nspawn::machine_dir("kube2"))
            .unwrap();
        install_binary_in_rootfs(&f.host, &exe, "kube2").unwrap();
        assert_eq!(
            f.host.fs.mode(Path::new(
                "/var/lib/machines/kube2/usr/local/bin/aks-flex-node"
            )),
            Some(0o750)
        );
    }
}
