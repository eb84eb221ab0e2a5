//! systemd: a manager client behind a narrow trait, over `systemctl` or D-Bus.
//!
//! [`SystemdManager`] is the narrow interface every flow uses. Two implementations:
//! [`SystemctlManager`] runs `systemctl`/`systemd-run` through the [`Runner`] (what upstream
//! does, and what the container mode routes through `host-exec`), and [`DbusManager`] talks to
//! `org.freedesktop.systemd1` over D-Bus with zbus (feature `dbus`; a job verb waits for its job
//! to finish, as `systemctl` does). The recording fake is `FakeSystemd` in the flex-testkit
//! crate.

#[cfg(feature = "dbus")]
mod dbus;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::runner::{Cmd, Runner};

#[cfg(feature = "dbus")]
pub use dbus::DbusManager;

/// A systemd call that failed.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// The call failed; `call` is what was asked (`start foo.service`).
    #[error("systemd {call}: {message}")]
    Call {
        /// What was asked.
        call: String,
        /// Why it failed.
        message: String,
    },
    /// Writing or removing a unit file failed.
    #[error(transparent)]
    Fs(#[from] crate::fs::FsError),
}

/// A transient timer that runs a command once, `on_active` after it is started, with the given
/// accuracy (systemd's default accuracy of one minute would make it fire up to a minute late).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransientTimer {
    /// Unit base name: `<name>.timer` and `<name>.service` are created.
    pub name: String,
    /// Description of both units.
    pub description: String,
    /// Delay after the timer starts.
    pub on_active: Duration,
    /// `AccuracySec=`.
    pub accuracy: Duration,
    /// Absolute program path followed by its arguments.
    pub command: Vec<String>,
}

/// The systemd operations the agent needs.
#[async_trait]
pub trait SystemdManager: Send + Sync {
    /// `systemctl daemon-reload`.
    async fn daemon_reload(&self) -> Result<(), SystemdError>;
    /// `systemctl enable <unit>`: links the unit file as its `[Install]` section says, then
    /// reloads the manager (as `systemctl` does without `--no-reload`), so a unit file written
    /// just before is loaded by that reload: the caller needs no `daemon_reload` of its own.
    async fn enable(&self, unit: &str) -> Result<(), SystemdError>;
    /// `systemctl disable <unit>`, then a reload (as [`Self::enable`]).
    async fn disable(&self, unit: &str) -> Result<(), SystemdError>;
    /// `systemctl mask <unit>…`: every unit in one call, then one reload (as [`Self::enable`]).
    async fn mask(&self, units: &[&str]) -> Result<(), SystemdError>;
    /// `systemctl start <unit>` (waits for the job).
    async fn start(&self, unit: &str) -> Result<(), SystemdError>;
    /// `systemctl stop <unit>` (waits for the job).
    async fn stop(&self, unit: &str) -> Result<(), SystemdError>;
    /// `systemctl restart <unit>` (waits for the job).
    async fn restart(&self, unit: &str) -> Result<(), SystemdError>;
    /// `systemctl reset-failed <unit>`.
    async fn reset_failed(&self, unit: &str) -> Result<(), SystemdError>;
    /// Whether the unit is active (`systemctl is-active --quiet`).
    async fn is_active(&self, unit: &str) -> Result<bool, SystemdError>;
    /// Starts a transient timer and its service.
    async fn start_transient_timer(&self, timer: &TransientTimer) -> Result<(), SystemdError>;
    /// The unit's state (`systemctl show`): active and sub state, result, automatic restarts,
    /// main exit status. A unit systemd does not know is `inactive`/`dead`.
    async fn unit_state(&self, unit: &str) -> Result<UnitState, SystemdError>;
}

/// A unit's state, as `systemctl show -p ActiveState,SubState,Result,NRestarts,ExecMainStatus`
/// gives it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnitState {
    /// `ActiveState`: `active`, `activating`, `failed`, `inactive`, …
    pub active_state: String,
    /// `SubState`: `running`, `auto-restart`, `failed`, `dead`, …
    pub sub_state: String,
    /// `Result`: `success`, `exit-code`, `signal`, `core-dump`, `timeout`, `start-limit-hit`, …
    pub result: String,
    /// `NRestarts`: automatic restarts since the last manual start.
    pub n_restarts: u32,
    /// `ExecMainStatus`: the main process's exit status or signal number.
    pub exec_main_status: i32,
}

/// The properties [`UnitState`] reads, for `systemctl show -p`.
pub const UNIT_STATE_PROPERTIES: &str = "ActiveState,SubState,Result,NRestarts,ExecMainStatus";

impl UnitState {
    /// Parses `systemctl show` output (`Key=value` lines; unknown keys ignored).
    pub fn parse_show(text: &str) -> Self {
        let mut u = UnitState::default();
        for line in text.lines() {
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            match k.trim() {
                "ActiveState" => u.active_state = v.trim().into(),
                "SubState" => u.sub_state = v.trim().into(),
                "Result" => u.result = v.trim().into(),
                "NRestarts" => u.n_restarts = v.trim().parse().unwrap_or(0),
                "ExecMainStatus" => u.exec_main_status = v.trim().parse().unwrap_or(0),
                _ => {}
            }
        }
        u
    }
}

/// Formats a duration for a systemd time span (`100ms`, `1s`).
pub fn systemd_timespan(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// [`SystemdManager`] over the `systemctl` and `systemd-run` commands.
#[derive(Clone)]
pub struct SystemctlManager {
    runner: Arc<dyn Runner>,
}

impl SystemctlManager {
    /// A manager that runs commands through `runner`.
    pub fn new(runner: Arc<dyn Runner>) -> Self {
        Self { runner }
    }

    async fn systemctl(&self, args: &[&str]) -> Result<(), SystemdError> {
        let cmd = Cmd::new("systemctl").args(args.iter().copied());
        self.runner
            .run(&cmd)
            .await
            .map(|_| ())
            .map_err(|e| SystemdError::Call {
                call: args.join(" "),
                message: e.to_string(),
            })
    }
}

#[async_trait]
impl SystemdManager for SystemctlManager {
    async fn daemon_reload(&self) -> Result<(), SystemdError> {
        self.systemctl(&["daemon-reload"]).await
    }
    async fn enable(&self, unit: &str) -> Result<(), SystemdError> {
        self.systemctl(&["enable", unit]).await
    }
    async fn disable(&self, unit: &str) -> Result<(), SystemdError> {
        self.systemctl(&["disable", unit]).await
    }
    async fn mask(&self, units: &[&str]) -> Result<(), SystemdError> {
        let mut args = vec!["mask"];
        args.extend_from_slice(units);
        self.systemctl(&args).await
    }
    async fn start(&self, unit: &str) -> Result<(), SystemdError> {
        self.systemctl(&["start", unit]).await
    }
    async fn stop(&self, unit: &str) -> Result<(), SystemdError> {
        self.systemctl(&["stop", unit]).await
    }
    async fn restart(&self, unit: &str) -> Result<(), SystemdError> {
        self.systemctl(&["restart", unit]).await
    }
    async fn reset_failed(&self, unit: &str) -> Result<(), SystemdError> {
        self.systemctl(&["reset-failed", unit]).await
    }
    async fn is_active(&self, unit: &str) -> Result<bool, SystemdError> {
        let cmd = Cmd::new("systemctl").args(["is-active", "--quiet", unit]);
        let out = self
            .runner
            .output(&cmd)
            .await
            .map_err(|e| SystemdError::Call {
                call: format!("is-active {unit}"),
                message: e.to_string(),
            })?;
        Ok(out.success())
    }
    async fn unit_state(&self, unit: &str) -> Result<UnitState, SystemdError> {
        let cmd = Cmd::new("systemctl").args(["show", "-p", UNIT_STATE_PROPERTIES, unit]);
        let out = self
            .runner
            .run(&cmd)
            .await
            .map_err(|e| SystemdError::Call {
                call: format!("show {unit}"),
                message: e.to_string(),
            })?;
        Ok(UnitState::parse_show(&out.stdout))
    }
    async fn start_transient_timer(&self, t: &TransientTimer) -> Result<(), SystemdError> {
        let cmd = Cmd::new("systemd-run")
            .arg(format!("--unit={}", t.name))
            .arg(format!("--description={}", t.description))
            .arg(format!("--on-active={}", systemd_timespan(t.on_active)))
            .arg(format!(
                "--timer-property=AccuracySec={}",
                systemd_timespan(t.accuracy)
            ))
            .arg("--")
            .args(t.command.iter().cloned());
        self.runner
            .run(&cmd)
            .await
            .map(|_| ())
            .map_err(|e| SystemdError::Call {
                call: format!("start transient timer {}", t.name),
                message: e.to_string(),
            })
    }
}
