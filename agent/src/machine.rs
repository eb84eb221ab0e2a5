//! Stopping and removing the node's systemd-nspawn machines (`kube1`, `kube2`), as unbounded's
//! `StopNode`, `StopMachine` and `CleanupMachine` do. Provisioning and starting machines build on
//! this in the node-machines layer.
//!
//! Every command is upstream's argv through the [`crate::runner::Runner`], so the agent's
//! container can route `machinectl`, `systemd-run`, `mountpoint` and `umount` to `host-exec`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::context::Host;
use crate::runner::Cmd;

pub use crate::state::{KUBE1, KUBE2};

/// Both machine sides.
pub const MACHINES: [&str; 2] = [KUBE1, KUBE2];

/// Where machine root file systems live.
pub const MACHINES_DIR: &str = "/var/lib/machines";

/// The other side: `kube2` for `kube1` and `kube1` for anything else.
pub fn alternate(machine: &str) -> &'static str {
    if machine == KUBE1 { KUBE2 } else { KUBE1 }
}

/// The machine's root file system directory.
pub fn machine_dir(machine: &str) -> PathBuf {
    Path::new(MACHINES_DIR).join(machine)
}

/// The machine's `.nspawn` settings file.
pub fn nspawn_file(machine: &str) -> PathBuf {
    PathBuf::from(format!("/etc/systemd/nspawn/{machine}.nspawn"))
}

/// The machine's unit name.
pub fn nspawn_unit(machine: &str) -> String {
    format!("systemd-nspawn@{machine}.service")
}

/// The machine unit's drop-in directory.
pub fn dropin_dir(machine: &str) -> PathBuf {
    PathBuf::from(format!(
        "/etc/systemd/system/systemd-nspawn@{machine}.service.d"
    ))
}

/// The machine's bpffs mount point on the host.
pub fn bpffs_dir(machine: &str) -> PathBuf {
    PathBuf::from(format!("/run/bpffs/{machine}"))
}

/// Poll intervals and deadlines (tests shorten them).
#[derive(Clone, Copy, Debug)]
pub struct Timings {
    /// How often to re-check machine registration.
    pub poll: Duration,
    /// How long to wait for a stopped unit's machine to go.
    pub stop_wait: Duration,
    /// How long to wait after `machinectl terminate`.
    pub terminate_wait: Duration,
    /// Delay between `machinectl remove` attempts.
    pub remove_retry: Duration,
    /// How long to keep retrying `machinectl remove`.
    pub remove_wait: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(1),
            stop_wait: Duration::from_secs(30),
            terminate_wait: Duration::from_secs(15),
            remove_retry: Duration::from_secs(2),
            remove_wait: Duration::from_secs(60),
        }
    }
}

impl Timings {
    /// Instant polls, for tests with fakes.
    pub fn instant() -> Self {
        Self {
            poll: Duration::ZERO,
            stop_wait: Duration::from_millis(20),
            terminate_wait: Duration::from_millis(20),
            remove_retry: Duration::ZERO,
            remove_wait: Duration::from_millis(20),
        }
    }
}

/// A machine operation failed.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// Listing registered machines failed.
    #[error("inspect registered machines: {0}")]
    Inspect(#[source] crate::runner::CmdError),
    /// `machinectl disable` failed and the unit is still enabled.
    #[error("machine {machine}: disable: {message}")]
    Disable {
        /// Machine.
        machine: String,
        /// Why.
        message: String,
    },
    /// The machine stayed registered.
    #[error("machine {0} remains registered after termination")]
    StillRegistered(String),
    /// The machine directory could not be removed while the machine is registered.
    #[error("refusing to remove registered machine {0}")]
    RefuseRemove(String),
    /// Unmounting the machine's bpffs failed.
    #[error("machine {machine}: unmount {path}: {source}")]
    Unmount {
        /// Machine.
        machine: String,
        /// Mount point.
        path: String,
        /// The command error.
        #[source]
        source: crate::runner::CmdError,
    },
    /// A file operation failed.
    #[error("machine {machine}: {source}")]
    Fs {
        /// Machine.
        machine: String,
        /// The error.
        #[source]
        source: crate::fs::FsError,
    },
}

/// The machines machined knows (`machinectl list --no-legend --no-pager`, first column).
pub async fn registered_machines(host: &Host) -> Result<BTreeSet<String>, MachineError> {
    let out = host
        .runner
        .run(&Cmd::new("machinectl").args(["list", "--no-legend", "--no-pager"]))
        .await
        .map_err(MachineError::Inspect)?;
    Ok(out
        .stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

async fn is_registered(host: &Host, machine: &str) -> Result<bool, MachineError> {
    Ok(registered_machines(host).await?.contains(machine))
}

async fn wait_gone(
    host: &Host,
    machine: &str,
    poll: Duration,
    deadline: Duration,
) -> Result<bool, MachineError> {
    let start = tokio::time::Instant::now();
    loop {
        if !is_registered(host, machine).await? {
            return Ok(true);
        }
        if start.elapsed() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(poll).await;
    }
}

/// `StopNode`: stops kubelet and containerd inside the machine (failures are warnings), then
/// [`stop_machine`].
pub async fn stop_node(host: &Host, machine: &str, t: Timings) -> Result<(), MachineError> {
    if is_registered(host, machine).await? {
        for unit in ["kubelet.service", "containerd.service"] {
            let cmd = machine_run(machine, &["systemctl", "stop", unit]);
            if let Err(e) = host.runner.run(&cmd).await {
                tracing::warn!(machine, unit, error = %e, "failed to stop unit in machine");
            }
        }
    }
    stop_machine(host, machine, t).await
}

/// `systemd-run --machine=<m> --pipe --wait <argv>`: the only way the agent runs something inside
/// a machine.
pub fn machine_run(machine: &str, argv: &[&str]) -> Cmd {
    Cmd::new("systemd-run")
        .arg(format!("--machine={machine}"))
        .args(["--pipe", "--wait"])
        .args(argv.iter().copied())
}

/// Unit-file states in which a failed `machinectl disable` is harmless.
const DISABLED_STATES: &[&str] = &[
    "",
    "disabled",
    "not-found",
    "masked",
    "masked-runtime",
    "static",
    "indirect",
];

/// `StopMachine`: disables the machine, stops its unit, waits for machined to drop it, and
/// terminates it if it lingers.
pub async fn stop_machine(host: &Host, machine: &str, t: Timings) -> Result<(), MachineError> {
    if let Err(e) = host
        .runner
        .run(&Cmd::new("machinectl").args(["disable", machine]))
        .await
    {
        let unit = nspawn_unit(machine);
        let state = host
            .runner
            .run(&Cmd::new("systemctl").args([
                "show",
                &unit,
                "--property=UnitFileState",
                "--value",
            ]))
            .await
            .map(|o| o.stdout.trim().to_string())
            .map_err(|se| MachineError::Disable {
                machine: machine.into(),
                message: format!("{e}; {se}"),
            })?;
        if !DISABLED_STATES.contains(&state.as_str()) {
            return Err(MachineError::Disable {
                machine: machine.into(),
                message: format!("{e} (unit file state {state:?})"),
            });
        }
    }
    if !is_registered(host, machine).await? {
        return Ok(());
    }
    let unit = nspawn_unit(machine);
    match host.systemd.is_active(&unit).await {
        Ok(true) => {
            if let Err(e) = host.systemd.stop(&unit).await {
                tracing::warn!(machine, error = %e, "failed to stop machine unit");
            }
        }
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(machine, error = %e, "cannot tell whether the machine unit is active")
        }
    }
    if wait_gone(host, machine, t.poll, t.stop_wait).await? {
        return Ok(());
    }
    if let Err(e) = host
        .runner
        .run(&Cmd::new("machinectl").args(["terminate", machine]))
        .await
    {
        tracing::warn!(machine, error = %e, "machinectl terminate failed");
    }
    if wait_gone(host, machine, t.poll, t.terminate_wait).await? {
        return Ok(());
    }
    Err(MachineError::StillRegistered(machine.into()))
}

/// `CleanupMachine`: unmounts the machine's bpffs if it is a mount point, removes the machine
/// image (`machinectl remove`, retried while busy), then its directory, `.nspawn` file and unit
/// drop-ins.
pub async fn cleanup_machine(host: &Host, machine: &str, t: Timings) -> Result<(), MachineError> {
    let fs_err = |source| MachineError::Fs {
        machine: machine.into(),
        source,
    };
    let bpffs = bpffs_dir(machine);
    let bpffs_str = bpffs.display().to_string();
    let is_mount = host
        .runner
        .output(&Cmd::new("mountpoint").args(["-q", &bpffs_str]))
        .await
        .map(|o| o.success())
        .unwrap_or(false);
    if is_mount {
        host.runner
            .run(&Cmd::new("umount").arg(&bpffs_str))
            .await
            .map_err(|source| MachineError::Unmount {
                machine: machine.into(),
                path: bpffs_str.clone(),
                source,
            })?;
    }
    host.fs.remove_dir_all(&bpffs).map_err(fs_err)?;

    let dir = machine_dir(machine);
    if host.fs.exists(&dir) {
        let start = tokio::time::Instant::now();
        loop {
            let out = host
                .runner
                .output(&Cmd::new("machinectl").args(["remove", machine]))
                .await;
            if matches!(&out, Ok(o) if o.success()) || !host.fs.exists(&dir) {
                break;
            }
            if !is_registered(host, machine).await? || start.elapsed() >= t.remove_wait {
                break;
            }
            tokio::time::sleep(t.remove_retry).await;
        }
        if host.fs.exists(&dir) {
            if is_registered(host, machine).await? {
                return Err(MachineError::RefuseRemove(machine.into()));
            }
            host.fs.remove_dir_all(&dir).map_err(fs_err)?;
        }
    }
    host.fs.remove_file(&nspawn_file(machine)).map_err(fs_err)?;
    host.fs
        .remove_dir_all(&dropin_dir(machine))
        .map_err(fs_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::FakeHost;
    use crate::runner::Output;

    #[test]
    fn names_and_paths() {
        assert_eq!(alternate(KUBE1), KUBE2);
        assert_eq!(alternate(KUBE2), KUBE1);
        assert_eq!(nspawn_unit("kube1"), "systemd-nspawn@kube1.service");
        assert_eq!(
            machine_dir("kube2"),
            PathBuf::from("/var/lib/machines/kube2")
        );
    }

    #[tokio::test]
    async fn stop_node_of_a_running_machine() {
        let f = FakeHost::new().unwrap();
        f.systemd.set_active("systemd-nspawn@kube1.service");
        f.runner.on_seq(
            "machinectl list",
            vec![
                Output::ok("kube1 container systemd-nspawn debian 12 -\n"),
                Output::ok("kube1 container systemd-nspawn debian 12 -\n"),
                Output::ok("kube1 container systemd-nspawn debian 12 -\n"),
                Output::ok(""),
            ],
        );
        stop_node(&f.host, KUBE1, Timings::instant()).await.unwrap();
        insta::assert_snapshot!(f.runner.transcript(), @"
        machinectl list --no-legend --no-pager
        systemd-run --machine=kube1 --pipe --wait systemctl stop kubelet.service
        systemd-run --machine=kube1 --pipe --wait systemctl stop containerd.service
        machinectl disable kube1
        machinectl list --no-legend --no-pager
        machinectl list --no-legend --no-pager
        machinectl list --no-legend --no-pager
        ");
        assert_eq!(
            f.systemd.calls(),
            vec![
                "is-active systemd-nspawn@kube1.service",
                "stop systemd-nspawn@kube1.service"
            ]
        );
    }

    #[tokio::test]
    async fn lingering_machine_is_terminated_then_reported() {
        let f = FakeHost::new().unwrap();
        f.runner.on(
            "machinectl list",
            Output::ok("kube2 container systemd-nspawn\n"),
        );
        let e = stop_machine(&f.host, KUBE2, Timings::instant())
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "machine kube2 remains registered after termination"
        );
        assert!(
            f.runner
                .calls()
                .contains(&"machinectl terminate kube2".to_string())
        );
    }

    #[tokio::test]
    async fn failed_disable_of_an_enabled_unit_is_an_error() {
        let f = FakeHost::new().unwrap();
        f.runner
            .on("machinectl disable", Output::failed(1, "Access denied"));
        f.runner.on("systemctl show", Output::ok("enabled\n"));
        let e = stop_machine(&f.host, KUBE1, Timings::instant())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("unit file state \"enabled\""), "{e}");
        let f = FakeHost::new().unwrap();
        f.runner
            .on("machinectl disable", Output::failed(1, "No such machine"));
        f.runner.on("systemctl show", Output::ok("not-found\n"));
        stop_machine(&f.host, KUBE1, Timings::instant())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn cleanup_unmounts_bpffs_and_removes_everything() {
        let f = FakeHost::new().unwrap();
        let fs = &f.host.fs;
        fs.write_atomic(&machine_dir(KUBE1).join("etc/os-release"), b"x", 0o644)
            .unwrap();
        fs.write_atomic(&nspawn_file(KUBE1), b"[Exec]\n", 0o644)
            .unwrap();
        fs.write_atomic(
            &dropin_dir(KUBE1).join("override.conf"),
            b"[Service]\n",
            0o644,
        )
        .unwrap();
        fs.create_dir_all(&bpffs_dir(KUBE1)).unwrap();
        f.runner
            .on("mountpoint -q /run/bpffs/kube1", Output::ok(""));
        f.runner.on(
            "machinectl remove",
            Output::failed(1, "Image kube1 is busy"),
        );
        cleanup_machine(&f.host, KUBE1, Timings::instant())
            .await
            .unwrap();
        for p in [
            machine_dir(KUBE1),
            nspawn_file(KUBE1),
            dropin_dir(KUBE1),
            bpffs_dir(KUBE1),
        ] {
            assert!(!fs.exists(&p), "{} left behind", p.display());
        }
        let calls = f.runner.calls();
        assert_eq!(calls[0], "mountpoint -q /run/bpffs/kube1");
        assert_eq!(calls[1], "umount /run/bpffs/kube1");
        assert_eq!(calls[2], "machinectl remove kube1");
    }

    #[tokio::test]
    async fn cleanup_refuses_to_delete_a_registered_machine() {
        let f = FakeHost::new().unwrap();
        f.host.fs.create_dir_all(&machine_dir(KUBE1)).unwrap();
        f.runner.on("mountpoint", Output::failed(32, ""));
        f.runner.on("machinectl remove", Output::failed(1, "busy"));
        f.runner
            .on("machinectl list", Output::ok("kube1 container\n"));
        let e = cleanup_machine(&f.host, KUBE1, Timings::instant())
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), "refusing to remove registered machine kube1");
        assert!(f.host.fs.exists(&machine_dir(KUBE1)));
    }
}
