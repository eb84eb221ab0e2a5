//! [`Host`]: the bundle of host interfaces (commands, files, systemd, host facts) every flow
//! takes, so a flow can run against the real host or against the fakes in [`crate::testing`].

use std::sync::Arc;

use crate::fs::HostFs;
use crate::hostinfo::{HostInfo, RealHostInfo};
use crate::runner::{ProcessRunner, Runner};
use crate::systemd::{DbusManager, SystemctlManager, SystemdManager};
use crate::testing::{FakeHostInfo, FakeRunner, FakeSystemd};

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
