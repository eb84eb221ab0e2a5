//! What `up` started, recorded in `target/harness/state.json` for `check`, `down` and the
//! debugging verbs ([`State`]). A leaf beside the VM's machinery, so that what the checks run
//! against ([`crate::check::Ctx`]) does not depend on how the VM is booted.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::registry::Registry;
use crate::ssh::Ssh;

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
    /// The kind cluster, as the cluster module's `record` writes it (kept as JSON so every
    /// save of the state keeps it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<serde_json::Value>,
    /// How the agent runs (`up --mode`; a state from before the flag is image mode).
    #[serde(default)]
    pub mode: crate::hostmode::AgentMode,
    /// In host mode, what the registry serves for the guest to download.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served: Option<crate::hostmode::Served>,
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
