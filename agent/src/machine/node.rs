//! The node-machine layer on a real host: [`NodeMachines`] provisions a machine (rootfs from its
//! OCI image, Kubernetes components, configuration, the agent binaries it needs) and starts,
//! stops and removes it. It implements the traits the flows use: [`NodeStarter`] for `start`,
//! [`NodeOps`] for repave and NodeReboot, and [`RemoteProbe`] for preflight.

use std::path::{Path, PathBuf};

use async_trait::async_trait;

use super::seams::{NodeOps, NodeStarter, RemoteProbe};
use crate::config::Config;
use crate::context::Host;
use crate::machine::components::{self, ComponentPlan, Downloads};
use crate::machine::lifecycle;
use crate::machine::nodeconfig;
use crate::machine::nodegoal::{self, MachineGoal};
use crate::machine::nspawn::{self, Timings};
use crate::oci::{self, ImageSource, PullOptions, RegistryClient};
use crate::task::step;

/// Machines on this host, for one config.
pub struct NodeMachines {
    host: Host,
    config: Config,
    http: reqwest::Client,
    registry: RegistryClient,
    exe: PathBuf,
    timings: Timings,
    downloads: Downloads,
}

impl NodeMachines {
    /// Machines for `config` on `host`, provisioning with the running agent binary.
    pub fn new(host: Host, config: Config) -> anyhow::Result<Self> {
        let http = crate::http::client()?;
        Ok(Self {
            registry: RegistryClient::new(http.clone()),
            http,
            exe: lifecycle::current_exe()?,
            host,
            config,
            timings: Timings::default(),
            downloads: Downloads::default(),
        })
    }

    /// Overrides poll intervals and deadlines (tests).
    pub fn with_timings(mut self, timings: Timings) -> Self {
        self.timings = timings;
        self
    }

    /// Overrides component download sources (tests, mirrors).
    pub fn with_downloads(mut self, downloads: Downloads) -> Self {
        self.downloads = downloads;
        self
    }

    /// Uses `exe` as the agent binary copied into machines and as the lifecycle helper.
    pub fn with_exe(mut self, exe: impl Into<PathBuf>) -> Self {
        self.exe = exe.into();
        self
    }

    fn config_for(&self, kubernetes_version: Option<&str>) -> Config {
        let mut c = self.config.clone();
        if let Some(v) = kubernetes_version.filter(|v| !v.is_empty()) {
            c.components.kubernetes = v.to_string();
        }
        c
    }

    fn goal(&self, config: &Config, machine: &str) -> anyhow::Result<MachineGoal> {
        let facts = lifecycle::host_facts(&self.host)?;
        Ok(nodegoal::resolve(config, machine, &facts)?)
    }

    /// `rootfs.Provision` plus configuration: the machine's root file system from its image
    /// (kept when already built, unless `rebuild_owned`), the components, the files inside it
    /// and on the host, the agent binary inside it and the lifecycle helper on the host.
    pub async fn provision(
        &self,
        machine: &str,
        kubernetes_version: Option<&str>,
        rebuild_owned: bool,
    ) -> anyhow::Result<()> {
        let config = self.config_for(kubernetes_version);
        let goal = self.goal(&config, machine)?;
        let host = &self.host;
        step("ensure-nspawn-workspace", async {
            let source = ImageSource::parse(&goal.oci_image)?;
            let dest = host.fs.path(&goal.machine_dir());
            let opts = PullOptions {
                arch: goal.arch.parse()?,
                rebuild_owned,
                ..Default::default()
            };
            let info = oci::pull_rootfs(&self.registry, &source, &dest, &opts).await?;
            tracing::info!(machine, image = %info.reference, status = ?info.status, "machine root file system ready");
            anyhow::Ok(())
        })
        .await?;
        step("install-components", async {
            let plan = ComponentPlan::resolve(&config, &goal.arch, self.downloads.clone())?;
            components::install_components(host, &self.http, &goal.machine_dir(), &plan).await?;
            anyhow::Ok(())
        })
        .await?;
        step("configure-machine", async {
            let resolv = host
                .fs
                .read(Path::new("/etc/resolv.conf"))?
                .unwrap_or_default();
            let mut entries = nodeconfig::render_rootfs(&goal, &resolv)?;
            entries.extend(nodeconfig::render_host(&goal));
            nodeconfig::apply(&host.fs, machine, &entries)?;
            anyhow::Ok(())
        })
        .await?;
        step("install-binary-in-rootfs", async {
            lifecycle::install_binary_in_rootfs(host, &self.exe, machine)?;
            lifecycle::install_helper(host, &self.exe)?;
            host.systemd.daemon_reload().await?;
            anyhow::Ok(())
        })
        .await?;
        Ok(())
    }

    /// `StartNode` without provisioning: start the machine, containerd and kubelet, and wait
    /// for kubelet.
    pub async fn start_machine(&self, machine: &str) -> anyhow::Result<()> {
        let t = self.timings;
        step(
            "start-nspawn-machine",
            nspawn::start_machine(&self.host, machine, t),
        )
        .await?;
        step(
            "start-services",
            nspawn::start_services(&self.host, machine),
        )
        .await?;
        step(
            "wait-for-kubelet",
            nspawn::wait_for_kubelet(&self.host, machine, t),
        )
        .await?;
        Ok(())
    }
}

#[async_trait]
impl NodeStarter for NodeMachines {
    async fn start_node(
        &self,
        _host: &Host,
        _config: &Config,
        machine: &str,
    ) -> anyhow::Result<()> {
        self.provision(machine, None, false).await?;
        self.start_machine(machine).await
    }
}

#[async_trait]
impl NodeOps for NodeMachines {
    async fn provision(&self, machine: &str, kubernetes_version: &str) -> anyhow::Result<()> {
        NodeMachines::provision(self, machine, Some(kubernetes_version), true).await
    }
    async fn start(&self, machine: &str) -> anyhow::Result<()> {
        self.start_machine(machine).await
    }
    async fn stop(&self, machine: &str) -> anyhow::Result<()> {
        Ok(nspawn::stop_node(&self.host, machine, self.timings).await?)
    }
    async fn cleanup(&self, machine: &str) -> anyhow::Result<()> {
        Ok(nspawn::cleanup_machine(&self.host, machine, self.timings).await?)
    }
}

#[async_trait]
impl RemoteProbe for NodeMachines {
    async fn image_reachable(&self, goal: &MachineGoal) -> Result<String, String> {
        let source = ImageSource::parse(&goal.oci_image).map_err(|e| e.to_string())?;
        let arch = goal.arch.parse().map_err(|e| format!("{e}"))?;
        oci::manifest_reachable(&self.registry, &source, arch)
            .await
            .map(|d| d.to_string())
            .map_err(|e| format!("rootfs image is not reachable: {e}"))
    }

    async fn artifacts_reachable(
        &self,
        config: &Config,
        goal: &MachineGoal,
    ) -> Vec<(String, Result<(), String>)> {
        match ComponentPlan::resolve(config, &goal.arch, self.downloads.clone()) {
            Ok(plan) => components::check_reachable(&self.http, &plan).await,
            Err(e) => vec![(components::CHECK_KUBERNETES.to_string(), Err(e.to_string()))],
        }
    }
}
