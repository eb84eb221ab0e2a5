//! `up` and `down`: the VM's whole life.
//!
//! `up` replaces any VM an earlier `up` left, starts the registry and pushes the agent's image
//! (and, for the offline checks, the machine rootfs image and the component bundle), prepares
//! a fresh qcow2 overlay of the pristine OS image, renders the Ignition config, picks the
//! accelerator, boots QEMU (detached: it outlives `up`), waits for SSH and for the agent's
//! bootstrap, and saves a VM snapshot for `check`. What it started is recorded in
//! `target/harness/state.json`; if `up` fails or is interrupted it stops what it started, and
//! `down` stops everything and removes the VM's files.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use flex_host::runner::{Cmd, Runner};
use flex_oci::RegistryClient;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::kvm::{self, Probe};
use crate::qemu::{self, Accel, Boot, QemuSpec};
use crate::qmp::{Qmp, QmpClient};
use crate::registry::{self, Registry};
use crate::ssh::Ssh;
use crate::state::State;

/// The snapshot `up` saves once the host is bootstrapped.
pub const READY_SNAPSHOT: &str = "bootstrapped";

/// Which OS the VM runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OsImage {
    /// The embedded default: the dev host built from Debian packages (`Selinux`: the
    /// SELinux-enforcing variant of `up --selinux`).
    DevHost(crate::devhost::Variant),
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
    /// Real kubelet, kubectl and kube-proxy for the component bundle (`--k8s-bin-dir`); `None`:
    /// the bundle's stand-ins.
    pub kubernetes_bin: Option<PathBuf>,
    /// How the agent runs.
    pub mode: crate::hostmode::AgentMode,
    /// The agent's release binary, which host mode installs (`cargo xtask image` builds it).
    pub agent_binary: Option<PathBuf>,
    /// More kernel arguments for a dev host's boot, after the variant's (`up --kernel-arg`).
    pub kernel_args: Vec<String>,
}

impl Default for UpOptions {
    fn default() -> Self {
        Self {
            os: OsImage::DevHost(crate::devhost::Variant::Plain),
            try_kvm: true,
            cpus: 2,
            memory_mib: 3072,
            label_containerd: false,
            snapshot: true,
            boot_timeout: Duration::from_secs(600),
            bootstrap_timeout: Duration::from_secs(1500),
            kubernetes_bin: None,
            mode: crate::hostmode::AgentMode::Image,
            agent_binary: None,
            kernel_args: Vec::new(),
        }
    }
}

impl UpOptions {
    /// Whether the VM's config merges `image/label-containerd.bu`: when asked, and always on the
    /// SELinux dev host, whose policy has refpolicy's container module: it confines runc
    /// (`container_engine_t`), which may only read a bundle and run a container from
    /// containerd's directories when they carry container labels (docs/SELINUX.md). Pure.
    pub fn labels_containerd(&self) -> bool {
        self.label_containerd || self.os == OsImage::DevHost(crate::devhost::Variant::Selinux)
    }
}

/// What `up` and `check` are doing, on stderr, with the time since the command started.
///
/// Every line reads `[  12.3s] step`. A long step ([`Progress::begin`], [`Progress::wait`],
/// [`Progress::try_wait`]) shows, when stderr is a terminal, as an indicatif spinner with the
/// time and what is being waited on, ticking steadily; when stderr is not a terminal (CI logs,
/// pipes) its start is a plain line instead. Either way the finished step is printed as a line
/// (`…: done in 33.3s`, or `…: failed after 33.3s` when it ends in an error), with the same text.
pub struct Progress {
    clock: Clock,
    out: Out,
}

type Clock = Arc<dyn Fn() -> Duration + Send + Sync>;

enum Out {
    /// Plain lines into a writer (stderr, or a test's buffer).
    Plain(Mutex<Box<dyn Write + Send>>),
    /// A spinner on the terminal while a step runs; lines above it.
    Tty,
}

/// How often a long step's detail may be printed as a plain line.
const PLAIN_DETAIL_EVERY: Duration = Duration::from_secs(30);

/// The spinner of the step running now, shared by every [`Progress`] of the process (so that
/// [`progress_line`] prints above it).
static ACTIVE: Mutex<Option<ProgressBar>> = Mutex::new(None);

fn active() -> std::sync::MutexGuard<'static, Option<ProgressBar>> {
    ACTIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process's start, the zero of every [`Progress`] line.
fn process_start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// `[  12.3s] msg`.
fn timed(at: Duration, msg: &str) -> String {
    format!("[{:>6.1}s] {msg}", at.as_secs_f64())
}

/// Prints `line` on stderr, above the running step's spinner if there is one. For output that
/// does not go through a [`Progress`] while a step may be running.
pub fn progress_line(line: &str) {
    match active().as_ref() {
        Some(bar) => bar.println(line),
        None => eprintln!("{line}"),
    }
}

impl Progress {
    /// Progress on stderr: a spinner for long steps when stderr is a terminal (and `TERM` is
    /// not `dumb`), plain timed lines otherwise.
    pub fn new() -> Self {
        let start = process_start();
        let clock: Clock = Arc::new(move || start.elapsed());
        let tty =
            std::io::stderr().is_terminal() && std::env::var("TERM").map_or(true, |t| t != "dumb");
        if tty {
            Self {
                clock,
                out: Out::Tty,
            }
        } else {
            Self::plain(Box::new(std::io::stderr()), clock)
        }
    }

    /// Plain timed lines into `sink`, timed by `clock` (what CI sees; tests use a buffer and a
    /// fake clock).
    pub fn plain(
        sink: Box<dyn Write + Send>,
        clock: Arc<dyn Fn() -> Duration + Send + Sync>,
    ) -> Self {
        Self {
            clock,
            out: Out::Plain(Mutex::new(sink)),
        }
    }

    fn now(&self) -> Duration {
        (self.clock)()
    }

    fn line(&self, line: &str) {
        match &self.out {
            Out::Plain(sink) => {
                let mut w = sink.lock().unwrap_or_else(|e| e.into_inner());
                let _ = writeln!(w, "{line}");
                let _ = w.flush();
            }
            Out::Tty => progress_line(line),
        }
    }

    /// Prints a step that is already done (or instant).
    pub fn say(&self, msg: &str) {
        self.line(&timed(self.now(), msg));
    }

    /// Starts a long step; it ends with [`Step::done`] (or, dropped unfinished, as failed).
    pub fn begin(&self, msg: &str) -> Step<'_> {
        let started = self.now();
        match &self.out {
            Out::Plain(_) => self.line(&timed(started, &format!("{msg} ..."))),
            Out::Tty => {
                let start = process_start();
                let style = ProgressStyle::with_template("{spinner} [{total}] {msg} ({step})")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner())
                    .with_key(
                        "total",
                        move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
                            let _ = write!(w, "{:>6.1}s", start.elapsed().as_secs_f64());
                        },
                    )
                    .with_key("step", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                        let _ = write!(w, "{:.0}s", s.elapsed().as_secs_f64());
                    });
                let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
                    .with_style(style)
                    .with_message(msg.to_string());
                bar.enable_steady_tick(Duration::from_millis(120));
                if let Some(old) = active().replace(bar) {
                    old.finish_and_clear();
                }
            }
        }
        Step {
            progress: self,
            msg: msg.to_string(),
            started,
            last_line: Mutex::new(started),
            finished: false,
        }
    }

    /// Runs `fut` as a long step named `msg`.
    pub async fn wait<F: Future>(&self, msg: &str, fut: F) -> F::Output {
        let step = self.begin(msg);
        let out = fut.await;
        step.done();
        out
    }

    /// Runs `fut` as a long step named `msg`; an error ends the step as failed.
    pub async fn try_wait<T, E, F>(&self, msg: &str, fut: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
    {
        let step = self.begin(msg);
        let out = fut.await;
        if out.is_ok() {
            step.done();
        }
        out
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

/// A long step that is running (see [`Progress::begin`]).
pub struct Step<'a> {
    progress: &'a Progress,
    msg: String,
    started: Duration,
    last_line: Mutex<Duration>,
    finished: bool,
}

impl Step<'_> {
    /// Says how far the step is (`3.1 GiB of 30.0 GiB`): the spinner shows it at once; as plain
    /// lines, at most one every 30 seconds.
    pub fn detail(&self, detail: &str) {
        match &self.progress.out {
            Out::Tty => {
                if let Some(bar) = active().as_ref() {
                    bar.set_message(format!("{}: {detail}", self.msg));
                }
            }
            Out::Plain(_) => {
                let now = self.progress.now();
                let mut last = self.last_line.lock().unwrap_or_else(|e| e.into_inner());
                if now.saturating_sub(*last) >= PLAIN_DETAIL_EVERY {
                    *last = now;
                    drop(last);
                    self.progress
                        .line(&timed(now, &format!("{}: {detail}", self.msg)));
                }
            }
        }
    }

    /// Ends the step: `msg: done in 12.3s`.
    pub fn done(self) {
        self.finish("done in");
    }

    fn finish(mut self, how: &str) {
        self.end(how);
    }

    fn end(&mut self, how: &str) {
        if self.finished {
            return;
        }
        self.finished = true;
        let now = self.progress.now();
        let line = timed(
            now,
            &format!(
                "{}: {how} {:.1}s",
                self.msg,
                now.saturating_sub(self.started).as_secs_f64()
            ),
        );
        if let Out::Tty = self.progress.out
            && let Some(bar) = active().take()
        {
            bar.finish_and_clear();
        }
        self.progress.line(&line);
    }
}

impl Drop for Step<'_> {
    fn drop(&mut self) {
        self.end("failed after");
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
    let exited = flex_host::retry::wait_until(
        "QEMU to exit on SIGTERM",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            if pid_alive(pid).await {
                Err(format!("QEMU {pid} runs"))
            } else {
                Ok(())
            }
        },
    )
    .await;
    if exited.is_err() {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
    }
}

/// `down`: stops QEMU and the registry (through `r`) and removes the VM's disk and runtime
/// files (the SSH key and the cached OS images stay). Nothing is left running.
pub async fn down(r: &dyn Runner, work: &Path) -> anyhow::Result<()> {
    if let Some(state) = State::load(work)? {
        state.ssh.close_shared(r).await;
        if let Some(pid) = state.qemu_pid {
            kill_qemu(pid).await;
        }
        if let Some(reg) = &state.registry {
            registry::stop(r, reg).await?;
        }
    }
    // A registry started by an `up` that failed before it saved its state has PID files only.
    let reg_dir = work.join("registry");
    if reg_dir.join("registry.pid").exists() || reg_dir.join("registry-auth.pid").exists() {
        registry::stop(
            r,
            &Registry {
                port: 0,
                dir: reg_dir,
                auth: None,
            },
        )
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
        crate::ssh::CONTROL_SOCKET,
    ] {
        let _ = std::fs::remove_file(work.join(f));
    }
    let _ = std::fs::remove_dir_all(work.join("registry"));
    Ok(())
}

/// Runs the short KVM probe boot of `kernel` through `r` and decides the accelerator.
pub async fn choose_accel(
    r: &dyn Runner,
    work: &Path,
    kernel: &Path,
    try_kvm: bool,
) -> (Accel, String) {
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
        match r.output(&cmd).await {
            Ok(out) => Probe::Exited {
                code: out.code,
                console: format!(
                    "{}{}",
                    std::fs::read_to_string(&console).unwrap_or_default(),
                    out.stderr
                ),
            },
            Err(flex_host::runner::CmdError::Timeout { .. }) => Probe::TimedOut {
                console: std::fs::read_to_string(&console).unwrap_or_default(),
            },
            Err(e) => Probe::NotRun(e.to_string()),
        }
    };
    kvm::decide(try_kvm, &probe)
}

/// Waits until `ssh true` succeeds; fails at once when QEMU exits, and on timeout, with the
/// last console lines in the error.
pub async fn wait_ssh(
    r: &dyn Runner,
    ssh: &Ssh,
    serial: &Path,
    qemu_pid: u32,
    timeout: Duration,
) -> anyhow::Result<()> {
    flex_host::retry::wait_until(
        "the guest to answer SSH",
        timeout,
        Duration::from_secs(2),
        || async {
            match ssh.output(r, "true", Duration::from_secs(20)).await {
                Ok(o) if o.success() => Ok(Ok(())),
                Ok(o) => {
                    if !pid_alive(qemu_pid).await {
                        return Ok(Err(()));
                    }
                    Err(format!("exit {:?}: {}", o.code, o.stderr.trim()))
                }
                Err(e) => {
                    if !pid_alive(qemu_pid).await {
                        return Ok(Err(()));
                    }
                    Err(format!("{e:#}"))
                }
            }
        },
    )
    .await
    .map_err(|t| {
        anyhow::anyhow!(
            "the guest did not answer SSH within {timeout:?} (last attempt: {}); last console lines:\n{}",
            t.last_seen,
            tail(serial, 30)
        )
    })?
    .map_err(|()| {
        anyhow::anyhow!(
            "QEMU exited before the guest answered SSH; last console lines:\n{}",
            tail(serial, 30)
        )
    })
}

/// Creates a qcow2 overlay of `base` with `r`.
pub async fn create_overlay(r: &dyn Runner, base: &Path, overlay: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(overlay);
    let format = if base.extension().is_some_and(|e| e == "qcow2") {
        "qcow2"
    } else {
        "raw"
    };
    r.run(
        &Cmd::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", format, "-b"])
            .arg(base.display().to_string())
            .arg(overlay.display().to_string()),
    )
    .await?;
    Ok(())
}

/// Boots QEMU detached with `r` and returns its PID.
pub async fn boot(r: &dyn Runner, spec: &QemuSpec) -> anyhow::Result<u32> {
    let _ = std::fs::remove_file(&spec.pidfile);
    let _ = std::fs::remove_file(&spec.serial_log);
    let _ = std::fs::remove_file(&spec.qmp_socket);
    r.run(
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

/// Restores the ready snapshot, sets the guest's clock and waits for SSH (commands through
/// `r`).
pub async fn restore(r: &dyn Runner, state: &State) -> anyhow::Result<()> {
    let Some(name) = &state.snapshot else {
        anyhow::bail!("no snapshot was saved by up");
    };
    state.ssh.close_shared(r).await;
    let q = qmp(state).await?;
    q.loadvm(name).await?;
    // The restored guest's clock is the snapshot's; set it to now.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let pid = state.qemu_pid.unwrap_or_default();
    wait_ssh(
        r,
        &state.ssh,
        &state.serial_log(),
        pid,
        Duration::from_secs(120),
    )
    .await?;
    state
        .ssh
        .run(
            r,
            &format!("date -s @{now} >/dev/null"),
            Duration::from_secs(30),
        )
        .await?;
    Ok(())
}

/// Cuts the guest's power (QMP `system_reset`: no shutdown, the disk as it is), after closing
/// the shared SSH connection (commands through `r`).
pub async fn power_cut(r: &dyn Runner, state: &State) -> anyhow::Result<()> {
    state.ssh.close_shared(r).await;
    qmp(state).await?.reset().await?;
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

/// The registry client for pushes from the host to the harness's registry at `host_addr`
/// (`127.0.0.1:<port>`), the one registry it opts in to plain HTTP.
pub fn registry_client(host_addr: &str) -> anyhow::Result<RegistryClient> {
    let insecure = flex_host::http::InsecureRegistries::parse("the harness registry", host_addr)?;
    Ok(RegistryClient::new(flex_host::http::client()?).with_insecure_registries(insecure))
}

/// Starts the registry under `work`, with `r`.
pub async fn start_registry(r: &dyn Runner, work: &Path) -> anyhow::Result<Registry> {
    registry::start(r, &work.join("registry")).await
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

    /// The SELinux dev host always labels containerd's directories; the plain one and ACL only
    /// when asked.
    #[test]
    fn selinux_dev_host_labels_containerd() {
        use crate::devhost::Variant;
        let with = |os, asked| {
            UpOptions {
                os,
                label_containerd: asked,
                ..UpOptions::default()
            }
            .labels_containerd()
        };
        assert!(with(OsImage::DevHost(Variant::Selinux), false));
        assert!(!with(OsImage::DevHost(Variant::Plain), false));
        assert!(with(OsImage::DevHost(Variant::Plain), true));
    }

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
            cluster: None,
            mode: crate::hostmode::AgentMode::Host,
            served: None,
        };
        s.save().unwrap();
        let back = State::load(d.path()).unwrap().unwrap();
        assert_eq!(back.qemu_pid, Some(42));
        assert_eq!(
            back.mode,
            crate::hostmode::AgentMode::Host,
            "check knows the mode"
        );
        // A state saved before `--mode` existed is image mode.
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(State::path(d.path())).unwrap()).unwrap();
        v.as_object_mut().unwrap().remove("mode");
        std::fs::write(State::path(d.path()), v.to_string()).unwrap();
        let old = State::load(d.path()).unwrap().unwrap();
        assert_eq!(old.mode, crate::hostmode::AgentMode::Image);
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
        let r = flex_host::runner::ProcessRunner::new();
        let reg = registry::start(&r, &d.path().join("registry"))
            .await
            .unwrap();
        let addr = reg.host_addr();
        assert!(tokio::net::TcpStream::connect(&addr).await.is_ok());
        down(&r, d.path()).await.unwrap();
        assert!(
            tokio::net::TcpStream::connect(&addr).await.is_err(),
            "registry still runs"
        );
    }

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What CI sees: the plain lines, timed by a clock that here advances by hand.
    #[tokio::test]
    async fn progress_plain_lines() {
        let buf = Buf::default();
        let now = Arc::new(Mutex::new(Duration::ZERO));
        let clock = now.clone();
        let p = Progress::plain(
            Box::new(buf.clone()),
            Arc::new(move || *clock.lock().unwrap()),
        );
        let at = |s: f64| *now.lock().unwrap() = Duration::from_secs_f64(s);
        p.say("starting the registry");
        at(1.25);
        let step = p.begin("first boot: waiting for the guest to answer SSH");
        at(20.0);
        step.detail("not yet"); // less than 30 s since the step's line: not printed
        at(40.0);
        step.detail("still booting");
        p.say("a line in between");
        at(53.5);
        step.done();
        let failed: Result<(), &str> = p
            .try_wait("waiting for the agent's bootstrap", async { Err("boom") })
            .await;
        assert!(failed.is_err());
        let v = p.wait("group machines", async { 7 }).await;
        assert_eq!(v, 7);
        {
            let _dropped = p.begin("savevm");
            at(60.0);
        }
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text,
            "[   0.0s] starting the registry\n\
             [   1.2s] first boot: waiting for the guest to answer SSH ...\n\
             [  40.0s] first boot: waiting for the guest to answer SSH: still booting\n\
             [  40.0s] a line in between\n\
             [  53.5s] first boot: waiting for the guest to answer SSH: done in 52.2s\n\
             [  53.5s] waiting for the agent's bootstrap ...\n\
             [  53.5s] waiting for the agent's bootstrap: failed after 0.0s\n\
             [  53.5s] group machines ...\n\
             [  53.5s] group machines: done in 0.0s\n\
             [  53.5s] savevm ...\n\
             [  60.0s] savevm: failed after 6.5s\n"
        );
    }

    #[tokio::test]
    async fn down_without_state_is_fine() {
        let d = tempfile::tempdir().unwrap();
        down(&flex_host::runner::ProcessRunner::new(), d.path())
            .await
            .unwrap();
    }
}
