//! The node's systemd-nspawn machines (`kube1`, `kube2`) by name: their paths; starting one
//! (enable, start with a stale registration cleared once, wait until it answers), its services
//! and the wait for kubelet; stopping (`machinectl poweroff`, retried, then `terminate` if it
//! lingers) and removing one (bpffs, `machinectl remove`, files), as unbounded's `StopNode`,
//! `StopMachine` and `CleanupMachine` do. Provisioning builds on this in [`super::node`].
//!
//! Every command is upstream's argv through the [`flex_host::runner::Runner`], so the agent's
//! container can route `machinectl`, `systemd-run`, `mountpoint` and `umount` to `host-exec`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use flex_host::context::Host;
use flex_host::retry::{Attempt, Backoff, retry, wait_until};
use flex_host::runner::Cmd;

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
    /// `machinectl poweroff` attempts before giving up on a clean shutdown.
    pub poweroff_attempts: u32,
    /// How often to probe a starting machine (`systemd-run /bin/true`).
    pub ready_poll: Duration,
    /// How long a started machine may take to answer.
    pub ready_wait: Duration,
    /// How long a stale registration may take to clear after `machinectl terminate`.
    pub stale_wait: Duration,
    /// How often to ask whether kubelet is active.
    pub kubelet_poll: Duration,
    /// How long kubelet may take to become active.
    pub kubelet_wait: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(1),
            stop_wait: Duration::from_secs(30),
            terminate_wait: Duration::from_secs(15),
            remove_retry: Duration::from_secs(2),
            remove_wait: Duration::from_secs(60),
            poweroff_attempts: 3,
            ready_poll: Duration::from_millis(500),
            ready_wait: Duration::from_secs(30),
            stale_wait: Duration::from_secs(15),
            kubelet_poll: Duration::from_secs(2),
            kubelet_wait: Duration::from_secs(60),
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
            poweroff_attempts: 3,
            ready_poll: Duration::ZERO,
            ready_wait: Duration::from_millis(20),
            stale_wait: Duration::from_millis(20),
            kubelet_poll: Duration::ZERO,
            kubelet_wait: Duration::from_millis(20),
        }
    }
}

/// A machine operation failed.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// Listing registered machines failed.
    #[error("inspect registered machines: {0}")]
    Inspect(flex_host::runner::CmdError),
    /// Reading the machine unit's unit-file state failed.
    #[error("machine {machine}: read unit-file state: {cause}")]
    UnitState {
        /// Machine.
        machine: String,
        /// The command error (in the message, not a `source()`).
        cause: flex_host::runner::CmdError,
    },
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
    /// A step of starting the machine failed.
    #[error("machine {machine}: {step}: {message}")]
    Start {
        /// Machine.
        machine: String,
        /// The step (`enable`, `start`, `start containerd.service`, ...).
        step: &'static str,
        /// What happened.
        message: String,
    },
    /// The machine directory could not be removed while the machine is registered.
    #[error("refusing to remove registered machine {0}")]
    RefuseRemove(String),
    /// Unmounting the machine's bpffs failed.
    #[error("machine {machine}: unmount {path}: {cause}")]
    Unmount {
        /// Machine.
        machine: String,
        /// Mount point.
        path: String,
        /// The command error (in the message, not a `source()`).
        cause: flex_host::runner::CmdError,
    },
    /// A file operation failed.
    #[error("machine {machine}: {cause}")]
    Fs {
        /// Machine.
        machine: String,
        /// The error (in the message, not a `source()`).
        cause: flex_host::fs::FsError,
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

/// Whether `machine`'s unit (`systemd-nspawn@<machine>.service`) is enabled: its unit-file state
/// (`systemctl show --property=UnitFileState --value`) is `enabled` or `enabled-runtime`. A
/// start enables the machine first and a stop disables it first, so the enabled side is the one
/// the node is meant to run.
pub async fn is_enabled(host: &Host, machine: &str) -> Result<bool, MachineError> {
    let state = host
        .runner
        .run(&Cmd::new("systemctl").args([
            "show",
            &nspawn_unit(machine),
            "--property=UnitFileState",
            "--value",
        ]))
        .await
        .map_err(|cause| MachineError::UnitState {
            machine: machine.into(),
            cause,
        })?;
    Ok(matches!(state.stdout.trim(), "enabled" | "enabled-runtime"))
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
    let gone = wait_until("the machine to unregister", deadline, poll, || async {
        match is_registered(host, machine).await {
            Ok(true) => Err("still registered".to_string()),
            Ok(false) => Ok(Ok(())),
            Err(e) => Ok(Err(e)),
        }
    })
    .await;
    match gone {
        Ok(done) => done.map(|()| true),
        Err(_) => Ok(false),
    }
}

/// What asking the machine to power off came to.
enum Poweroff {
    /// `machinectl poweroff` succeeded.
    Asked,
    /// The machine unregistered while the requests failed.
    Gone,
    /// Whether it is registered could not be read.
    Failed(MachineError),
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

/// `StopMachine`: disables the machine, powers it off (`machinectl poweroff`, retried), waits
/// for machined to drop it, terminates it if it lingers, and at last kills every process in it
/// (`machinectl kill --kill-whom=all --signal=SIGKILL`).
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
    // Ask the machine's init to shut down cleanly, retrying a failed request (every `t.poll`);
    // a machine that unregistered meanwhile is stopped.
    let asked = retry(
        "machinectl poweroff",
        Backoff::new(t.poweroff_attempts, t.poll, t.poll),
        |_| async {
            let Err(e) = host
                .runner
                .run(&Cmd::new("machinectl").args(["poweroff", machine]))
                .await
            else {
                return Ok(Poweroff::Asked);
            };
            match is_registered(host, machine).await {
                Ok(true) => Err(Attempt::retry(e.to_string())),
                Ok(false) => Ok(Poweroff::Gone),
                Err(e) => Ok(Poweroff::Failed(e)),
            }
        },
    )
    .await;
    match asked {
        Ok(Poweroff::Gone) => return Ok(()),
        Ok(Poweroff::Failed(e)) => return Err(e),
        // Still registered after the last failed request: the wait and terminate below.
        Ok(Poweroff::Asked) | Err(_) => {}
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
    // `terminate` only asks systemd to stop the machine's unit, which waits for the machine's
    // own shutdown: a pod whose process ignores SIGTERM (a container's PID 1 without a
    // handler) holds it until the inner stop timeout. The machine is going away either way, so
    // the last step kills every process in it.
    if let Err(e) = host
        .runner
        .run(&Cmd::new("machinectl").args(["kill", "--kill-whom=all", "--signal=SIGKILL", machine]))
        .await
    {
        tracing::warn!(machine, error = %e, "machinectl kill failed");
    }
    if wait_gone(host, machine, t.poll, t.terminate_wait).await? {
        tracing::warn!(
            machine,
            "machine stopped only after SIGKILL to all its processes"
        );
        return Ok(());
    }
    Err(MachineError::StillRegistered(machine.into()))
}

fn start_err(machine: &str, step: &'static str, message: impl Into<String>) -> MachineError {
    MachineError::Start {
        machine: machine.into(),
        step,
        message: message.into(),
    }
}

/// `start-nspawn-machine`: `machinectl enable` and `machinectl start`, clearing a stale
/// registration once if the start fails because of one, then waits until the machine answers
/// `systemd-run --machine=<m> --pipe --wait /bin/true`.
pub async fn start_machine(host: &Host, machine: &str, t: Timings) -> Result<(), MachineError> {
    let r = &host.runner;
    r.run(&Cmd::new("machinectl").args(["enable", machine]))
        .await
        .map_err(|e| start_err(machine, "enable", e.to_string()))?;
    if let Err(first) = r
        .run(&Cmd::new("machinectl").args(["start", machine]))
        .await
    {
        let text = first.to_string().to_lowercase();
        let registered = r
            .output(&Cmd::new("machinectl").args(["show", machine]))
            .await
            .is_ok_and(|o| o.success());
        if !(registered || text.contains("already exists") || text.contains("file exists")) {
            return Err(start_err(machine, "start", first.to_string()));
        }
        tracing::warn!(machine, error = %first, "stale machine registration; terminating it and retrying");
        let _ = host.systemd.reset_failed(&nspawn_unit(machine)).await;
        let _ = r
            .run(&Cmd::new("machinectl").args(["terminate", machine]))
            .await;
        wait_until(
            "the stale registration to clear",
            t.stale_wait,
            t.ready_poll,
            || async {
                let shown = r
                    .output(&Cmd::new("machinectl").args(["show", machine]))
                    .await
                    .is_ok_and(|o| o.success());
                if shown {
                    Err("still registered".to_string())
                } else {
                    Ok(())
                }
            },
        )
        .await
        .map_err(|_| {
            start_err(
                machine,
                "start",
                format!(
                    "stale registration did not clear after terminate (initial error: {first})"
                ),
            )
        })?;
        r.run(&Cmd::new("machinectl").args(["start", machine]))
            .await
            .map_err(|e| start_err(machine, "start", format!("after recovery: {e}")))?;
    }
    wait_until(
        "the machine to answer",
        t.ready_wait,
        t.ready_poll,
        || async {
            r.run(&machine_run(machine, &["/bin/true"]))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    )
    .await
    .map_err(|_| {
        start_err(
            machine,
            "wait for machine",
            format!("not responsive after {:?}", t.ready_wait),
        )
    })
}

/// `start-containerd` and `start-kubelet`: `systemctl enable --now` inside the machine.
pub async fn start_services(host: &Host, machine: &str) -> Result<(), MachineError> {
    for (step, unit) in [
        ("start containerd.service", "containerd.service"),
        ("start kubelet.service", "kubelet.service"),
    ] {
        host.runner
            .run(&machine_run(
                machine,
                &["systemctl", "enable", "--now", unit],
            ))
            .await
            .map_err(|e| start_err(machine, step, e.to_string()))?;
    }
    Ok(())
}

/// `start-npd`: enables and starts node-problem-detector inside the machine when its binary
/// and unit are there (looked up inside the rootfs, as the machine sees it). Not installed
/// (offline without it in the bundle, or its install failed) or failing to start: a warning,
/// the node works without it. Returns whether it was started.
pub async fn start_npd(host: &Host, machine: &str) -> bool {
    use crate::machine::components::{NPD_BIN, NPD_UNIT};
    let installed = host.fs.confined(&machine_dir(machine)).is_ok_and(|tree| {
        [NPD_BIN, NPD_UNIT]
            .iter()
            .all(|p| tree.exists(Path::new(p)))
    });
    if !installed {
        tracing::info!(
            machine,
            "node-problem-detector is not installed; not started"
        );
        return false;
    }
    let unit = "node-problem-detector.service";
    match host
        .runner
        .run(&machine_run(
            machine,
            &["systemctl", "enable", "--now", unit],
        ))
        .await
    {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(machine, error = %e, "node-problem-detector did not start; the node runs without it");
            false
        }
    }
}

/// `wait-for-kubelet`: polls `systemctl is-active kubelet.service` inside the machine until it
/// prints `active`.
pub async fn wait_for_kubelet(host: &Host, machine: &str, t: Timings) -> Result<(), MachineError> {
    wait_until(
        "kubelet.service to be active",
        t.kubelet_wait,
        t.kubelet_poll,
        || async {
            match host
                .runner
                .output(&machine_run(
                    machine,
                    &["systemctl", "is-active", "kubelet.service"],
                ))
                .await
            {
                Ok(o) if o.success() && o.stdout.trim() == "active" => Ok(()),
                Ok(o) => Err(format!("{} {}", o.stdout.trim(), o.stderr.trim())
                    .trim()
                    .to_string()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await
    .map_err(|w| {
        start_err(
            machine,
            "wait for kubelet",
            format!(
                "kubelet.service not active after {:?} (last: {})",
                t.kubelet_wait, w.last_seen
            ),
        )
    })
}

/// `CleanupMachine`: unmounts the machine's bpffs if it is a mount point, removes the machine
/// image (`machinectl remove`, retried while busy), then its directory, `.nspawn` file and unit
/// drop-ins.
pub async fn cleanup_machine(host: &Host, machine: &str, t: Timings) -> Result<(), MachineError> {
    let fs_err = |cause| MachineError::Fs {
        machine: machine.into(),
        cause,
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
            .map_err(|cause| MachineError::Unmount {
                machine: machine.into(),
                path: bpffs_str.clone(),
                cause,
            })?;
    }
    host.fs.remove_dir_all(&bpffs).map_err(fs_err)?;

    let dir = machine_dir(machine);
    if host.fs.exists(&dir) {
        // Retried while the machine is registered and busy; what is left afterwards is
        // decided below.
        let removed = wait_until(
            "machinectl remove",
            t.remove_wait,
            t.remove_retry,
            || async {
                let out = host
                    .runner
                    .output(&Cmd::new("machinectl").args(["remove", machine]))
                    .await;
                if matches!(&out, Ok(o) if o.success()) || !host.fs.exists(&dir) {
                    return Ok(Ok(()));
                }
                match is_registered(host, machine).await {
                    Ok(true) => Err("busy".to_string()),
                    Ok(false) => Ok(Ok(())),
                    Err(e) => Ok(Err(e)),
                }
            },
        )
        .await;
        if let Ok(Err(e)) = removed {
            return Err(e);
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
    use flex_host::runner::{CmdError, Output, Runner};
    use flex_testkit::{FakeHost, FakeRunner};

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
        machinectl poweroff kube1
        machinectl list --no-legend --no-pager
        machinectl list --no-legend --no-pager
        ");
        assert!(f.systemd.calls().is_empty());
    }

    #[tokio::test]
    async fn start_machine_services_and_kubelet() {
        let f = FakeHost::new().unwrap();
        f.runner.on_seq(
            "systemd-run --machine=kube2 --pipe --wait /bin/true",
            vec![
                Output::failed(1, "Failed to connect to bus"),
                Output::ok(""),
            ],
        );
        f.runner.on_seq(
            "systemd-run --machine=kube2 --pipe --wait systemctl is-active kubelet.service",
            vec![Output::failed(3, "activating"), Output::ok("active\n")],
        );
        start_machine(&f.host, KUBE2, Timings::instant())
            .await
            .unwrap();
        start_services(&f.host, KUBE2).await.unwrap();
        wait_for_kubelet(&f.host, KUBE2, Timings::instant())
            .await
            .unwrap();
        insta::assert_snapshot!(f.runner.transcript(), @"
        machinectl enable kube2
        machinectl start kube2
        systemd-run --machine=kube2 --pipe --wait /bin/true
        systemd-run --machine=kube2 --pipe --wait /bin/true
        systemd-run --machine=kube2 --pipe --wait systemctl enable --now containerd.service
        systemd-run --machine=kube2 --pipe --wait systemctl enable --now kubelet.service
        systemd-run --machine=kube2 --pipe --wait systemctl is-active kubelet.service
        systemd-run --machine=kube2 --pipe --wait systemctl is-active kubelet.service
        ");
    }

    /// Recording runner, real files under the fake host's root: node-problem-detector starts
    /// only when its binary and unit are in the rootfs; a unit that fails is a warning.
    #[tokio::test]
    async fn npd_starts_only_when_installed_and_a_failure_does_not_fail_the_start() {
        let f = FakeHost::new().unwrap();
        assert!(!start_npd(&f.host, KUBE1).await);
        assert!(f.runner.calls().is_empty());
        let root = f.host.fs.path(&machine_dir(KUBE1));
        for p in [
            crate::machine::components::NPD_BIN,
            crate::machine::components::NPD_UNIT,
        ] {
            std::fs::create_dir_all(root.join(p).parent().unwrap()).unwrap();
            std::fs::write(root.join(p), "x").unwrap();
        }
        let cmd = "systemd-run --machine=kube1 --pipe --wait systemctl enable --now node-problem-detector.service";
        f.runner
            .on_seq(cmd, vec![Output::ok(""), Output::failed(1, "Job failed")]);
        assert!(start_npd(&f.host, KUBE1).await);
        assert!(!start_npd(&f.host, KUBE1).await);
        assert_eq!(f.runner.calls(), vec![cmd.to_string(), cmd.to_string()]);
    }

    #[tokio::test]
    async fn stale_registration_is_cleared_once() {
        let f = FakeHost::new().unwrap();
        f.runner.on_seq(
            "machinectl start kube1",
            vec![
                Output::failed(1, "Failed to start machine: File exists"),
                Output::ok(""),
            ],
        );
        f.runner.on_seq(
            "machinectl show kube1",
            vec![
                Output::ok("Name=kube1\n"),
                Output::ok("Name=kube1\n"),
                Output::failed(1, ""),
            ],
        );
        start_machine(&f.host, KUBE1, Timings::instant())
            .await
            .unwrap();
        let calls = f.runner.calls();
        assert!(
            calls.contains(&"machinectl terminate kube1".to_string()),
            "{calls:?}"
        );
        assert_eq!(
            calls
                .iter()
                .filter(|c| *c == "machinectl start kube1")
                .count(),
            2
        );
        assert_eq!(
            f.systemd.calls(),
            vec!["reset-failed systemd-nspawn@kube1.service"]
        );
    }

    #[tokio::test]
    async fn start_failures_name_machine_and_step() {
        let f = FakeHost::new().unwrap();
        f.runner
            .on("machinectl start kube1", Output::failed(1, "No such image"));
        f.runner.on("machinectl show kube1", Output::failed(1, ""));
        let e = start_machine(&f.host, KUBE1, Timings::instant())
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "machine kube1: start: machinectl start kube1 failed: exit status 1: No such image"
        );
        let f = FakeHost::new().unwrap();
        f.runner.on(
            "systemd-run --machine=kube1 --pipe --wait /bin/true",
            Output::failed(1, "no bus"),
        );
        let e = start_machine(&f.host, KUBE1, Timings::instant())
            .await
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("machine kube1: wait for machine: not responsive after"),
            "{e}"
        );
        let f = FakeHost::new().unwrap();
        f.runner.on(
            "systemd-run --machine=kube1 --pipe --wait systemctl is-active",
            Output::failed(3, "failed"),
        );
        let e = wait_for_kubelet(&f.host, KUBE1, Timings::instant())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("kubelet.service not active"), "{e}");
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
        let calls = f.runner.calls();
        let at = |c: &str| calls.iter().position(|x| x == c);
        let terminate = at("machinectl terminate kube2").unwrap();
        let kill = at("machinectl kill --kill-whom=all --signal=SIGKILL kube2").unwrap();
        assert!(terminate < kill, "SIGKILL only after terminate: {calls:?}");
    }

    /// Real: the stop ladder. Faked: the host (machinectl answers). A machine held by a process
    /// that ignores SIGTERM lingers through poweroff and terminate and goes after SIGKILL.
    #[tokio::test]
    async fn a_machine_held_by_a_sigterm_ignoring_pod_is_killed() {
        /// machined's view: the machine stays listed until SIGKILL reached its processes.
        struct HeldUntilKilled(FakeRunner);
        #[async_trait::async_trait]
        impl Runner for HeldUntilKilled {
            async fn output(&self, cmd: &Cmd) -> Result<Output, CmdError> {
                let killed = self
                    .0
                    .calls()
                    .iter()
                    .any(|c| c.starts_with("machinectl kill"));
                let out = self.0.output(cmd).await?;
                Ok(
                    if cmd.display_argv().starts_with("machinectl list") && !killed {
                        Output::ok("kube1 container systemd-nspawn debian 12 -\n")
                    } else {
                        out
                    },
                )
            }
            fn which(&self, program: &str) -> Option<std::path::PathBuf> {
                self.0.which(program)
            }
        }
        let f = FakeHost::new().unwrap();
        let mut host = f.host.clone();
        host.runner = std::sync::Arc::new(HeldUntilKilled(f.runner.clone()));
        stop_machine(&host, KUBE1, Timings::instant())
            .await
            .unwrap();
        let calls: Vec<String> = f
            .runner
            .calls()
            .into_iter()
            .filter(|c| !c.starts_with("machinectl list"))
            .collect();
        assert_eq!(
            calls,
            [
                "machinectl disable kube1",
                "machinectl poweroff kube1",
                "machinectl terminate kube1",
                "machinectl kill --kill-whom=all --signal=SIGKILL kube1",
            ]
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
    async fn enablement_is_the_unit_file_state() {
        // Faked: the runner (systemctl's answers).
        for (answer, want) in [
            ("enabled\n", true),
            ("enabled-runtime\n", true),
            ("disabled\n", false),
            ("linked\n", false),
            ("\n", false),
        ] {
            let f = FakeHost::new().unwrap();
            f.runner.on("systemctl show", Output::ok(answer));
            assert_eq!(
                is_enabled(&f.host, KUBE2).await.unwrap(),
                want,
                "{answer:?}"
            );
            assert_eq!(
                f.runner.calls(),
                ["systemctl show systemd-nspawn@kube2.service --property=UnitFileState --value"]
            );
        }
        let f = FakeHost::new().unwrap();
        f.runner.on(
            "systemctl show",
            Output::failed(1, "Failed to connect to bus"),
        );
        let e = is_enabled(&f.host, KUBE1).await.unwrap_err().to_string();
        assert!(
            e.starts_with("machine kube1: read unit-file state: "),
            "{e}"
        );
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
