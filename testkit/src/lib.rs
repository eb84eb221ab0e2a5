//! The workspace's test kit: recording fakes for the host traits of `flex-host`. Only ever a
//! dev-dependency (`cargo xtask ci` fails otherwise).
//!
//! They sit exactly at the trait boundaries ([`Runner`], [`SystemdManager`], [`HostInfo`]):
//! everything above them is the real code. Files are never faked: tests give
//! [`flex_host::fs::HostFs`] a temporary root instead. HTTP peers are not faked either:
//! [`http::ScriptedServer`] is a real server on 127.0.0.1 with scripted answers.
//!
//! Besides the fakes ([`FakeRunner`], [`FakeSystemd`], [`FakeHostInfo`], and [`FakeHost`], the
//! bundle over a temporary root): [`tree_snapshot`] (a directory tree as text), [`layer_builder`]
//! (image layers with every entry kind the unpacker handles, and hostile ones), [`operations`]
//! (MachineOperation builders for the decision and reconciler tests), [`http`] and [`errors`]
//! ([`assert_cause_once`]: the workspace's error rule, checked per error type).
//!
//! The host crate's own tests that need a fake are integration tests (`host/tests/`), so the
//! fakes and the code they fake use one build of `flex-host`'s types.

pub mod errors;
pub mod http;
pub mod layer_builder;
pub mod operations;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use flex_host::context::Host;
use flex_host::fs::HostFs;

use flex_host::hostinfo::HostInfo;
use flex_host::runner::{Cmd, CmdError, Output, Runner};
use flex_host::systemd::{SystemdError, SystemdManager, TransientTimer};

pub use errors::{assert_cause_once, render_chain};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in another test thread poisons the lock; the data is still usable for assertions.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Rule {
    prefix: String,
    outputs: Vec<Output>,
}

/// A [`Runner`] that records every command and answers from scripted rules.
///
/// A rule matches when the command's display argv starts with its prefix; the most recently
/// added matching rule answers. A rule with several outputs answers them in turn and then keeps
/// answering the last. Unmatched commands succeed with empty output.
#[derive(Clone, Default)]
pub struct FakeRunner {
    inner: Arc<Mutex<FakeRunnerState>>,
}

#[derive(Default)]
struct FakeRunnerState {
    calls: Vec<String>,
    rules: Vec<Rule>,
    missing: BTreeSet<String>,
}

impl FakeRunner {
    /// A fake on which every program exists and every command succeeds silently.
    pub fn new() -> Self {
        Self::default()
    }

    /// Answers commands starting with `prefix` with `output`.
    pub fn on(&self, prefix: &str, output: Output) -> &Self {
        self.on_seq(prefix, vec![output])
    }

    /// Answers commands starting with `prefix` with `outputs` in turn (the last one repeats).
    pub fn on_seq(&self, prefix: &str, outputs: Vec<Output>) -> &Self {
        lock(&self.inner).rules.push(Rule {
            prefix: prefix.to_string(),
            outputs,
        });
        self
    }

    /// Makes `program` absent from `PATH` (for [`Runner::which`]).
    pub fn without(&self, program: &str) -> &Self {
        lock(&self.inner).missing.insert(program.to_string());
        self
    }

    /// Every command run so far, as `[ENV=V ]argv` lines with secrets redacted.
    pub fn calls(&self) -> Vec<String> {
        lock(&self.inner).calls.clone()
    }

    /// The recorded commands joined by newlines (for snapshots).
    pub fn transcript(&self) -> String {
        let mut s = self.calls().join("\n");
        s.push('\n');
        s
    }

    /// Forgets the recorded commands (keeps the rules).
    pub fn clear(&self) {
        lock(&self.inner).calls.clear();
    }
}

#[async_trait]
impl Runner for FakeRunner {
    async fn output(&self, cmd: &Cmd) -> Result<Output, CmdError> {
        let argv = cmd.display_argv();
        let mut line = String::new();
        for (k, v) in cmd.env_list() {
            line.push_str(&format!("{k}={v} "));
        }
        line.push_str(&argv);
        let mut st = lock(&self.inner);
        st.calls.push(line);
        if st.missing.contains(cmd.program()) {
            return Err(CmdError::Spawn {
                argv,
                cause: std::io::Error::from(std::io::ErrorKind::NotFound),
            });
        }
        let rule = st
            .rules
            .iter_mut()
            .rev()
            .find(|r| argv.starts_with(&r.prefix));
        Ok(match rule {
            Some(r) if r.outputs.len() > 1 => r.outputs.remove(0),
            Some(r) => r.outputs.first().cloned().unwrap_or_default(),
            None => Output::ok(""),
        })
    }

    fn which(&self, program: &str) -> Option<PathBuf> {
        let st = lock(&self.inner);
        (!st.missing.contains(program)).then(|| PathBuf::from("/usr/bin").join(program))
    }
}

/// A [`SystemdManager`] that records calls as `verb unit` lines and can be told to fail some.
#[derive(Clone, Default)]
pub struct FakeSystemd {
    inner: Arc<Mutex<FakeSystemdState>>,
}

#[derive(Default)]
struct FakeSystemdState {
    calls: Vec<String>,
    fail: BTreeSet<String>,
    active: BTreeSet<String>,
    states: std::collections::BTreeMap<String, flex_host::systemd::UnitState>,
    queued: std::collections::BTreeMap<
        String,
        std::collections::VecDeque<flex_host::systemd::UnitState>,
    >,
}

impl FakeSystemd {
    /// A fake on which every call succeeds and no unit is active.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the call recorded as `line` (e.g. `stop docker.service`) fail.
    pub fn fail_on(&self, line: &str) -> &Self {
        lock(&self.inner).fail.insert(line.to_string());
        self
    }

    /// Marks `unit` active for [`SystemdManager::is_active`].
    pub fn set_active(&self, unit: &str) -> &Self {
        lock(&self.inner).active.insert(unit.to_string());
        self
    }

    /// Makes [`SystemdManager::unit_state`] answer `state` for `unit`.
    pub fn set_unit_state(&self, unit: &str, state: flex_host::systemd::UnitState) -> &Self {
        lock(&self.inner).states.insert(unit.to_string(), state);
        self
    }

    /// Makes [`SystemdManager::unit_state`] answer `states` for `unit`, one per call, before
    /// it answers what [`Self::set_unit_state`] set (a unit that changes while it is watched).
    pub fn queue_unit_states(
        &self,
        unit: &str,
        states: impl IntoIterator<Item = flex_host::systemd::UnitState>,
    ) -> &Self {
        lock(&self.inner)
            .queued
            .entry(unit.to_string())
            .or_default()
            .extend(states);
        self
    }

    /// The calls so far.
    pub fn calls(&self) -> Vec<String> {
        lock(&self.inner).calls.clone()
    }

    fn record(&self, line: String) -> Result<(), SystemdError> {
        let mut st = lock(&self.inner);
        st.calls.push(line.clone());
        if st.fail.contains(&line) {
            return Err(SystemdError::Call {
                call: line,
                message: "injected failure".into(),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl SystemdManager for FakeSystemd {
    async fn daemon_reload(&self) -> Result<(), SystemdError> {
        self.record("daemon-reload".into())
    }
    async fn enable(&self, unit: &str) -> Result<(), SystemdError> {
        self.record(format!("enable {unit}"))
    }
    async fn disable(&self, unit: &str) -> Result<(), SystemdError> {
        self.record(format!("disable {unit}"))
    }
    async fn mask(&self, units: &[&str]) -> Result<(), SystemdError> {
        self.record(format!("mask {}", units.join(" ")))
    }
    async fn start(&self, unit: &str) -> Result<(), SystemdError> {
        self.record(format!("start {unit}"))?;
        lock(&self.inner).active.insert(unit.to_string());
        Ok(())
    }
    async fn stop(&self, unit: &str) -> Result<(), SystemdError> {
        self.record(format!("stop {unit}"))?;
        lock(&self.inner).active.remove(unit);
        Ok(())
    }
    async fn restart(&self, unit: &str) -> Result<(), SystemdError> {
        self.record(format!("restart {unit}"))
    }
    async fn reset_failed(&self, unit: &str) -> Result<(), SystemdError> {
        self.record(format!("reset-failed {unit}"))
    }
    async fn is_active(&self, unit: &str) -> Result<bool, SystemdError> {
        self.record(format!("is-active {unit}"))?;
        Ok(lock(&self.inner).active.contains(unit))
    }
    async fn start_transient_timer(&self, timer: &TransientTimer) -> Result<(), SystemdError> {
        self.record(format!(
            "transient-timer {} on-active={}ms accuracy={}ms command={}",
            timer.name,
            timer.on_active.as_millis(),
            timer.accuracy.as_millis(),
            timer.command.join(" ")
        ))
    }
    async fn unit_state(&self, unit: &str) -> Result<flex_host::systemd::UnitState, SystemdError> {
        self.record(format!("show {unit}"))?;
        let mut st = lock(&self.inner);
        if let Some(u) = st.queued.get_mut(unit).and_then(|q| q.pop_front()) {
            return Ok(u);
        }
        if let Some(u) = st.states.get(unit) {
            return Ok(u.clone());
        }
        let active = st.active.contains(unit);
        Ok(flex_host::systemd::UnitState {
            active_state: if active { "active" } else { "inactive" }.into(),
            sub_state: if active { "running" } else { "dead" }.into(),
            result: "success".into(),
            ..Default::default()
        })
    }
}

/// A [`HostInfo`] with fixed answers.
#[derive(Clone, Debug)]
pub struct FakeHostInfo {
    /// Effective uid.
    pub euid: u32,
    /// Hostname as the kernel reports it.
    pub hostname: String,
    /// Whether `/usr` is mounted read-only.
    pub usr_read_only: bool,
    /// Free bytes under `/var/lib`.
    pub var_lib_free: u64,
    /// Whether the agent runs in its container image.
    pub containerized: bool,
    /// `uname -r`.
    pub kernel_release: String,
    /// Ports that are taken.
    pub busy_ports: Vec<u16>,
    /// Whether TCP connections succeed.
    pub network_up: bool,
}

impl Default for FakeHostInfo {
    fn default() -> Self {
        Self {
            euid: 0,
            hostname: "flex-node-1".into(),
            usr_read_only: false,
            var_lib_free: 64 << 30,
            containerized: false,
            kernel_release: "6.1.0-test".into(),
            busy_ports: Vec::new(),
            network_up: true,
        }
    }
}

impl HostInfo for FakeHostInfo {
    fn euid(&self) -> u32 {
        self.euid
    }
    fn hostname(&self) -> std::io::Result<String> {
        Ok(self.hostname.clone())
    }
    fn is_read_only(&self, path: &std::path::Path) -> std::io::Result<bool> {
        Ok(path == std::path::Path::new("/usr") && self.usr_read_only)
    }
    fn free_bytes(&self, _path: &std::path::Path) -> std::io::Result<u64> {
        Ok(self.var_lib_free)
    }
    fn containerized(&self) -> bool {
        self.containerized
    }
    fn kernel_release(&self) -> String {
        self.kernel_release.clone()
    }
    fn port_bindable(&self, addr: std::net::SocketAddr) -> bool {
        !self.busy_ports.contains(&addr.port())
    }
    fn tcp_connect(
        &self,
        _host: &str,
        _port: u16,
        _t: std::time::Duration,
    ) -> Result<(), flex_host::hostinfo::ConnectError> {
        if self.network_up {
            Ok(())
        } else {
            Err(flex_host::hostinfo::ConnectError::Connect {
                cause: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
            })
        }
    }
}

/// Every file, directory and link under `root`, one per line with its mode, and each file's
/// content indented below it (for snapshots of what a flow wrote).
pub fn tree_snapshot(root: &std::path::Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    fn walk(root: &std::path::Path, dir: &std::path::Path, out: &mut Vec<String>) {
        let mut entries: Vec<_> = match std::fs::read_dir(dir) {
            Ok(rd) => rd.filter_map(Result::ok).collect(),
            Err(_) => return,
        };
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap_or(&p).display().to_string();
            let Ok(meta) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            let mode = meta.permissions().mode() & 0o7777;
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&p).unwrap_or_default();
                out.push(format!("/{rel} -> {}", target.display()));
            } else if meta.is_dir() {
                out.push(format!("/{rel}/ {mode:04o}"));
                walk(root, &p, out);
            } else {
                out.push(format!("/{rel} {mode:04o}"));
                let content = std::fs::read(&p).unwrap_or_default();
                for line in String::from_utf8_lossy(&content).lines() {
                    out.push(format!("    | {line}"));
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.join("\n") + "\n"
}

/// A host made of fakes over a temporary root, for tests.
pub struct FakeHost {
    /// The host to hand to flows.
    pub host: Host,
    /// The recording runner.
    pub runner: FakeRunner,
    /// The recording systemd.
    pub systemd: FakeSystemd,
    /// The temporary root (removed on drop).
    pub root: tempfile::TempDir,
}

impl FakeHost {
    /// Fakes with default answers ([`FakeHostInfo::default`]).
    pub fn new() -> std::io::Result<Self> {
        Self::with_info(FakeHostInfo::default())
    }

    /// Fakes with the given host facts.
    pub fn with_info(info: FakeHostInfo) -> std::io::Result<Self> {
        let root = tempfile::tempdir()?;
        let runner = FakeRunner::new();
        let systemd = FakeSystemd::new();
        let host = Host {
            runner: Arc::new(runner.clone()),
            fs: HostFs::new(root.path()),
            systemd: Arc::new(systemd.clone()),
            info: Arc::new(info),
        };
        Ok(Self {
            host,
            runner,
            systemd,
            root,
        })
    }
}

/// Runs Debian's real `ignition-validate` (package `ignition`) on `path` and returns its output
/// (the caller judges it). A missing validator panics, naming the package: a test that needs it
/// never passes silently (CI installs it).
pub async fn ignition_validate(path: &std::path::Path) -> Output {
    const VALIDATOR: &str = "ignition-validate";
    let runner = flex_host::runner::ProcessRunner::new();
    assert!(
        runner.which(VALIDATOR).is_some(),
        "{VALIDATOR} is not on PATH: apt-get install ignition (Debian's package ships it; CI \
         installs it)"
    );
    match runner
        .output(&Cmd::new(VALIDATOR).arg(path.display().to_string()))
        .await
    {
        Ok(out) => out,
        Err(e) => panic!("{VALIDATOR} {}: {e}", path.display()),
    }
}
