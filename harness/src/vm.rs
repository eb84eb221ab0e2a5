//! `up` and `down`: the VM's whole life.
//!
//! `up` replaces any VM an earlier `up` left, starts the registry and pushes the agent's image
//! (and, for the offline checks, the machine rootfs image and the component bundle), prepares
//! a fresh qcow2 overlay of the pristine OS image, renders the Ignition config, picks the
//! accelerator, boots QEMU (detached: it outlives `up`), waits for SSH and for the agent's
//! bootstrap, and saves a VM snapshot for `check`. What it started is recorded in
//! `target/harness/state.json`; if `up` fails or is interrupted it stops what it started, and
//! `down` stops everything and removes the VM's files.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aks_flex_node::oci::RegistryClient;
use aks_flex_node::runner::{Cmd, ProcessRunner, Runner};
use serde::{Deserialize, Serialize};

use crate::kvm::{self, Probe};
use crate::qemu::{self, Accel, Boot, QemuSpec};
use crate::qmp::{Qmp, QmpClient};
use crate::registry::{self, Registry};
use crate::ssh::Ssh;

/// The snapshot `up` saves once the host is bootstrapped.
pub const READY_SNAPSHOT: &str = "bootstrapped";

/// Which OS the VM runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OsImage {
    /// The embedded default: the dev host built from Debian packages.
    DevHost,
    /// An Azure Container Linux QEMU image (qcow2 or raw) at a path, booted with UEFI.
    Acl {
        /// The pristine image.
        image: PathBuf,
        /// OVMF code.
        ovmf_code: PathBuf,
        /// OVMF variables template.
        ovmf_vars: PathBuf,
    },
}

/// `up`'s options.
#[derive(Clone, Debug)]
pub struct UpOptions {
    /// The OS.
    pub os: OsImage,
    /// Try KVM (after a probe boot).
    pub try_kvm: bool,
    /// vCPUs.
    pub cpus: u32,
    /// Memory (MiB).
    pub memory_mib: u32,
    /// Merge `image/label-containerd.bu`.
    pub label_containerd: bool,
    /// Save a snapshot when ready.
    pub snapshot: bool,
    /// How long the guest may take to answer SSH.
    pub boot_timeout: Duration,
    /// How long the bootstrap may take.
    pub bootstrap_timeout: Duration,
}

impl Default for UpOptions {
    fn default() -> Self {
        Self {
            os: OsImage::DevHost,
            try_kvm: true,
            cpus: 2,
            memory_mib: 3072,
            label_containerd: false,
            snapshot: true,
            boot_timeout: Duration::from_secs(600),
            bootstrap_timeout: Duration::from_secs(1500),
        }
    }
}

/// What `up` started, for `check` and `down`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct State {
    /// The work directory.
    pub work: PathBuf,
    /// QEMU's PID.
    pub qemu_pid: Option<u32>,
    /// The registry.
    pub registry: Option<Registry>,
    /// SSH access.
    pub ssh: Ssh,
    /// The accelerator and why.
    pub accel: String,
    /// Why that accelerator.
    pub accel_reason: String,
    /// The agent image (pinned, as the guest sees it).
    pub agent_image: String,
    /// The machine rootfs image (pinned).
    pub machine_image: Option<String>,
    /// The offline bundle (pinned `oci://` reference).
    pub bundle: Option<String>,
    /// The bootstrap inputs written to the host.
    pub bootstrap_env: Option<String>,
    /// The snapshot to restore before each group, if saved.
    pub snapshot: Option<String>,
    /// Seconds per `up` phase.
    pub timings: Vec<(String, f64)>,
}

impl State {
    /// The state file of `work`.
    pub fn path(work: &Path) -> PathBuf {
        work.join("state.json")
    }

    /// Loads it.
    pub fn load(work: &Path) -> anyhow::Result<Option<Self>> {
        match std::fs::read(Self::path(work)) {
            Ok(b) => Ok(Some(serde_json::from_slice(&b)?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Saves it.
    pub fn save(&self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.work)?;
        let tmp = self.work.join(".state.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(tmp, Self::path(&self.work))?;
        Ok(())
    }

    /// QMP socket.
    pub fn qmp_socket(&self) -> PathBuf {
        self.work.join("qmp.sock")
    }

    /// Serial console log.
    pub fn serial_log(&self) -> PathBuf {
        self.work.join("serial.log")
    }
}

/// Progress lines on stderr with the time since `up` started.
pub struct Progress {
    start: Instant,
}

impl Progress {
    /// Starts the clock.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
        }
    }

    /// Prints a step.
    pub fn say(&self, msg: &str) {
        eprintln!("[{:>6.1}s] {msg}", self.start.elapsed().as_secs_f64());
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

async fn pid_alive(pid: u32) -> bool {
    rustix::process::Pid::from_raw(pid as i32)
        .is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
}

/// Stops QEMU by PID: SIGTERM, then SIGKILL after 10 s.
pub async fn kill_qemu(pid: u32) {
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
        return;
    };
    let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
    for _ in 0..100 {
        if !pid_alive(pid).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
}

/// `down`: stops QEMU and the registry and removes the VM's disk and runtime files (the SSH
/// key and the cached OS images stay). Nothing is left running.
pub async fn down(work: &Path) -> anyhow::Result<()> {
    if let Some(state) = State::load(work)? {
        if let Some(pid) = state.qemu_pid {
            kill_qemu(pid).await;
        }
        if let Some(reg) = &state.registry {
            registry::stop(reg).await?;
        }
    }
    // A registry started by an `up` that failed before it saved its state has a PID file only.
    let reg_dir = work.join("registry");
    if reg_dir.join("registry.pid").exists() {
        registry::stop(&Registry {
            port: 0,
            dir: reg_dir,
        })
        .await?;
    }
    // A QEMU from a crashed `up` may have written its PID file only.
    if let Ok(pid) = std::fs::read_to_string(work.join("qemu.pid"))
        && let Ok(pid) = pid.trim().parse::<u32>()
    {
        kill_qemu(pid).await;
    }
    for f in [
        "state.json",
        "disk.qcow2",
        "qemu.pid",
        "qmp.sock",
        "config.ign",
        "OVMF_VARS.fd",
    ] {
        let _ = std::fs::remove_file(work.join(f));
    }
    let _ = std::fs::remove_dir_all(work.join("registry"));
    Ok(())
}

/// Runs the short KVM probe boot of `kernel` and decides the accelerator.
pub async fn choose_accel(work: &Path, kernel: &Path, try_kvm: bool) -> (Accel, String) {
    let probe = if !try_kvm {
        Probe::NotRun("not requested".into())
    } else if !Path::new("/dev/kvm").exists() {
        Probe::NotRun("/dev/kvm is missing".into())
    } else {
        let console = work.join("kvm-probe.log");
        let _ = std::fs::remove_file(&console);
        let cmd = Cmd::new("qemu-system-x86_64")
            .args([
                "-accel", "kvm", "-cpu", "host", "-machine", "q35", "-m", "512",
            ])
            .args(["-display", "none", "-nodefaults", "-no-reboot", "-kernel"])
            .arg(kernel.display().to_string())
            .args([
                "-append",
                "console=ttyS0 panic=-1 earlyprintk=ttyS0",
                "-serial",
            ])
            .arg(format!("file:{}", console.display()))
            .timeout(Duration::from_secs(25));
        match ProcessRunner::new().output(&cmd).await {
            Ok(out) => Probe::Exited {
                code: out.code,
                console: format!(
                    "{}{}",
                    std::fs::read_to_string(&console).unwrap_or_default(),
                    out.stderr
                ),
            },
            Err(aks_flex_node::runner::CmdError::Timeout { .. }) => Probe::TimedOut {
                console: std::fs::read_to_string(&console).unwrap_or_default(),
            },
            Err(e) => Probe::NotRun(e.to_string()),
        }
    };
    kvm::decide(try_kvm, &probe)
}

/// Waits until `ssh true` succeeds; on timeout, the last console lines are in the error.
pub async fn wait_ssh(
    ssh: &Ssh,
    serial: &Path,
    qemu_pid: u32,
    timeout: Duration,
) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        if let Ok(o) = ssh.output("true", Duration::from_secs(20)).await
            && o.success()
        {
            return Ok(());
        }
        if !pid_alive(qemu_pid).await {
            anyhow::bail!(
                "QEMU exited before the guest answered SSH; last console lines:\n{}",
                tail(serial, 30)
            );
        }
        if start.elapsed() > timeout {
            anyhow::bail!(
                "the guest did not answer SSH within {timeout:?}; last console lines:\n{}",
                tail(serial, 30)
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Creates a qcow2 overlay of `base`.
pub async fn create_overlay(base: &Path, overlay: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(overlay);
    let format = if base.extension().is_some_and(|e| e == "qcow2") {
        "qcow2"
    } else {
        "raw"
    };
    ProcessRunner::new()
        .run(
            &Cmd::new("qemu-img")
                .args(["create", "-q", "-f", "qcow2", "-F", format, "-b"])
                .arg(base.display().to_string())
                .arg(overlay.display().to_string()),
        )
        .await?;
    Ok(())
}

/// Boots QEMU detached and returns its PID.
pub async fn boot(spec: &QemuSpec) -> anyhow::Result<u32> {
    let _ = std::fs::remove_file(&spec.pidfile);
    let _ = std::fs::remove_file(&spec.serial_log);
    let _ = std::fs::remove_file(&spec.qmp_socket);
    ProcessRunner::new()
        .run(
            &Cmd::new("qemu-system-x86_64")
                .args(qemu::args(spec))
                .timeout(Duration::from_secs(60)),
        )
        .await?;
    let pid: u32 = std::fs::read_to_string(&spec.pidfile)?.trim().parse()?;
    Ok(pid)
}

/// Connects to the VM's QMP socket.
pub async fn qmp(state: &State) -> anyhow::Result<QmpClient> {
    Ok(QmpClient::connect(&state.qmp_socket(), Duration::from_secs(120)).await?)
}

/// Restores the ready snapshot, sets the guest's clock and waits for SSH.
pub async fn restore(state: &State) -> anyhow::Result<()> {
    let Some(name) = &state.snapshot else {
        anyhow::bail!("no snapshot was saved by up");
    };
    let q = qmp(state).await?;
    q.loadvm(name).await?;
    // The restored guest's clock is the snapshot's; set it to now.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let pid = state.qemu_pid.unwrap_or_default();
    wait_ssh(
        &state.ssh,
        &state.serial_log(),
        pid,
        Duration::from_secs(120),
    )
    .await?;
    state
        .ssh
        .run(
            &format!("date -s @{now} >/dev/null"),
            Duration::from_secs(30),
        )
        .await?;
    Ok(())
}

/// Saves the ready snapshot.
pub async fn save_snapshot(state: &mut State) -> anyhow::Result<f64> {
    let q = qmp(state).await?;
    let t = Instant::now();
    q.savevm(READY_SNAPSHOT).await?;
    state.snapshot = Some(READY_SNAPSHOT.into());
    Ok(t.elapsed().as_secs_f64())
}

/// The registry client for pushes from the host.
pub fn registry_client() -> anyhow::Result<RegistryClient> {
    Ok(RegistryClient::new(aks_flex_node::http::client()?))
}

/// Starts the registry under `work`.
pub async fn start_registry(work: &Path) -> anyhow::Result<Registry> {
    registry::start(&work.join("registry")).await
}

/// The QEMU spec for the state's VM.
pub fn qemu_spec(
    work: &Path,
    accel: Accel,
    opts: &UpOptions,
    boot: Boot,
    fw_cfg_key: &str,
    ssh_port: u16,
) -> QemuSpec {
    QemuSpec {
        accel,
        cpus: opts.cpus,
        memory_mib: opts.memory_mib,
        disk: work.join("disk.qcow2"),
        boot,
        fw_cfg: Some((fw_cfg_key.to_string(), work.join("config.ign"))),
        ssh_port,
        serial_log: work.join("serial.log"),
        qmp_socket: work.join("qmp.sock"),
        pidfile: work.join("qemu.pid"),
        daemonize: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_roundtrip() {
        let d = tempfile::tempdir().unwrap();
        let s = State {
            work: d.path().to_path_buf(),
            qemu_pid: Some(42),
            registry: None,
            ssh: Ssh {
                port: 2222,
                key: d.path().join("id"),
            },
            accel: "tcg".into(),
            accel_reason: "r".into(),
            agent_image: "10.0.2.100:5000/aks-flex/agent@sha256:1".into(),
            machine_image: None,
            bundle: None,
            bootstrap_env: None,
            snapshot: Some(READY_SNAPSHOT.into()),
            timings: vec![("boot".into(), 12.5)],
        };
        s.save().unwrap();
        let back = State::load(d.path()).unwrap().unwrap();
        assert_eq!(back.qemu_pid, Some(42));
        assert_eq!(back.snapshot.as_deref(), Some(READY_SNAPSHOT));
        assert!(State::load(&d.path().join("nope")).unwrap().is_none());
    }

    #[test]
    fn tail_lines() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        std::fs::write(&p, "a\nb\nc\n").unwrap();
        assert_eq!(tail(&p, 2), "b\nc");
        assert_eq!(tail(&d.path().join("missing"), 2), "");
    }

    /// A real registry started by an `up` that failed before saving its state is stopped by
    /// `down` through its PID file.
    #[tokio::test]
    async fn down_stops_a_registry_without_state() {
        let d = tempfile::tempdir().unwrap();
        let reg = registry::start(&d.path().join("registry")).await.unwrap();
        let addr = reg.host_addr();
        assert!(tokio::net::TcpStream::connect(&addr).await.is_ok());
        down(d.path()).await.unwrap();
        assert!(
            tokio::net::TcpStream::connect(&addr).await.is_err(),
            "registry still runs"
        );
    }

    #[tokio::test]
    async fn down_without_state_is_fine() {
        let d = tempfile::tempdir().unwrap();
        down(d.path()).await.unwrap();
    }
}
