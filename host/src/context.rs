//! [`Host`]: the bundle of host interfaces (commands, files, systemd, host facts) every flow
//! takes, so a flow can run against the real host or against the fakes of the `flex-testkit` crate.

use std::sync::Arc;

use crate::fs::HostFs;
use crate::hostinfo::{HostInfo, RealHostInfo};
use crate::runner::{ProcessRunner, Runner};
#[cfg(feature = "dbus")]
use crate::systemd::DbusManager;
use crate::systemd::{SystemctlManager, SystemdManager};

/// Environment variable choosing the systemd client: `systemctl` (default) or `dbus`.
pub const SYSTEMD_BACKEND_ENV: &str = "AKS_FLEX_NODE_SYSTEMD_BACKEND";

/// The host, as the flows see it.
#[derive(Clone)]
pub struct Host {
    /// External commands.
    pub runner: Arc<dyn Runner>,
    /// Files, under a root.
    pub fs: HostFs,
    /// systemd.
    pub systemd: Arc<dyn SystemdManager>,
    /// Read-only facts.
    pub info: Arc<dyn HostInfo>,
}

impl Host {
    /// The real host: processes on `PATH`, files under `/`, systemd through `systemctl` (or
    /// D-Bus when `AKS_FLEX_NODE_SYSTEMD_BACKEND=dbus`).
    pub async fn real() -> Result<Self, crate::systemd::SystemdError> {
        let info = RealHostInfo;
        let runner: Arc<dyn Runner> = Arc::new(if info.containerized() {
            ProcessRunner::containerized()
        } else {
            ProcessRunner::new()
        });
        let systemd: Arc<dyn SystemdManager> = match std::env::var(SYSTEMD_BACKEND_ENV).as_deref() {
            #[cfg(feature = "dbus")]
            Ok("dbus") => Arc::new(DbusManager::system().await?),
            _ => Arc::new(SystemctlManager::new(runner.clone())),
        };
        Ok(Self {
            runner,
            fs: HostFs::host(),
            systemd,
            info: Arc::new(info),
        })
    }

    /// Whether the agent runs in its container image.
    pub fn containerized(&self) -> bool {
        self.info.containerized()
    }
}
