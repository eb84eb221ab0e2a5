//! The node-machine layer on a real host: [`NodeMachines`] provisions a machine (rootfs from its
//! OCI image, Kubernetes components, configuration, the agent binaries it needs) and starts,
//! stops and removes it. It implements the traits the flows use: [`NodeStarter`] for `start`,
//! [`NodeOps`] for repave and NodeReboot, and [`RemoteProbe`] for preflight.

use std::path::{Path, PathBuf};

use async_trait::async_trait;

use super::seams::{NodeOps, NodeStarter, ProbeError, RemoteProbe, SeamError};
use crate::config::Config;
use crate::machine::components::{self, ComponentPlan, Downloads};
use crate::machine::kubelet_credential;
use crate::machine::lifecycle;
use crate::machine::nodeconfig;
use crate::machine::nodegoal::{self, MachineGoal};
use crate::machine::nspawn::{self, Timings};
use crate::machine::pin;
use crate::task::step;
use flex_host::context::Host;
use flex_oci::{Arch, ImageSource, PullOptions, RegistryClient};

/// A provision's inputs, checked.
struct Inputs {
    goal: MachineGoal,
    source: ImageSource,
    arch: Arch,
    plan: ComponentPlan,
}

/// A config's Azure identity for ACR's token exchange, if it has one: given by the flows
/// (`crate::goalclient::acr`), which the machinery does not use itself.
pub type AcrIdentity = fn(&Config) -> Option<std::sync::Arc<dyn flex_oci::AadTokenSource>>;

/// Machines on this host, for one config.
pub struct NodeMachines {
    host: Host,
    config: Config,
    http: reqwest::Client,
    registry: RegistryClient,
    acr: AcrIdentity,
    exe: PathBuf,
    timings: Timings,
    downloads: Downloads,
}

impl NodeMachines {
    /// Machines for `config` on `host`, provisioning with the running agent binary. `acr`
    /// gives a config's Azure identity for ACR's token exchange
    /// (`crate::goalclient::acr::identity_or_warn`; `|_| None` for none).
    pub fn new(host: Host, config: Config, acr: AcrIdentity) -> anyhow::Result<Self> {
        let http = flex_host::http::client()?;
        Ok(Self {
            registry: super::registry_auth::registry_client(
                &config,
                &host.fs,
                &http,
                acr(&config),
            )?,
            acr,
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

    /// What provisioning `machine` needs, checked before anything touches the host: its goal
    /// (the machine name and the configured values), its image reference and architecture and
    /// the component plan. A wrong value is [`SeamError::Permanent`], named with the step it
    /// belongs to; only reading the host's facts can fail transiently.
    fn inputs(&self, machine: &str, kubernetes_version: Option<&str>) -> Result<Inputs, SeamError> {
        fn invalid<E: Into<anyhow::Error>>(step: &'static str) -> impl FnOnce(E) -> SeamError {
            move |e| SeamError::permanent(e.into().context(step))
        }
        let config = self.config_for(kubernetes_version);
        let facts = lifecycle::host_facts(&self.host).map_err(SeamError::transient)?;
        let goal = nodegoal::resolve(&config, machine, &facts).map_err(SeamError::permanent)?;
        let source =
            ImageSource::parse(&goal.oci_image).map_err(invalid("ensure-nspawn-workspace"))?;
        let arch: Arch = goal
            .arch
            .parse()
            .map_err(invalid("ensure-nspawn-workspace"))?;
        let plan = ComponentPlan::resolve(&config, &goal.arch, self.downloads.clone())
            .map_err(invalid("install-components"))?;
        Ok(Inputs {
            goal,
            source,
            arch,
            plan,
        })
    }

    /// `rootfs.Provision` plus configuration: the machine's root file system from its image
    /// (kept when already built, unless `rebuild_owned`), the components, the files inside it
    /// and on the host, the agent binary inside it and the lifecycle helper on the host. Its
    /// inputs are checked first ([`SeamError::Permanent`] when one is wrong); a failure after
    /// that is [`SeamError::Transient`].
    pub async fn provision(
        &self,
        machine: &str,
        kubernetes_version: Option<&str>,
        rebuild_owned: bool,
    ) -> Result<(), SeamError> {
        let Inputs {
            goal,
            source,
            arch,
            plan,
        } = self.inputs(machine, kubernetes_version)?;
        let host = &self.host;
        step("ensure-nspawn-workspace", async {
            let dest = host.fs.path(&goal.machine_dir());
            let opts = PullOptions {
                arch,
                rebuild_owned,
                ..Default::default()
            };
            let info = pin::pull(&host.fs, &source, |s| async move {
                flex_oci::pull_rootfs(&self.registry, &s, &dest, &opts).await
            })
            .await?;
            tracing::info!(machine, image = %info.reference, status = ?info.status, "machine root file system ready");
            anyhow::Ok(())
        })
        .await
        .map_err(SeamError::transient)?;
        flex_host::fault::point(&format!("provision.after-rootfs:{machine}"));
        step("install-components", async {
            components::install_components(
                host,
                &self.http,
                &self.registry,
                &goal.machine_dir(),
                &plan,
            )
            .await
        })
        .await
        .map_err(SeamError::transient)?;
        step("configure-machine", async {
            let resolv = host
                .fs
                .read(Path::new("/etc/resolv.conf"))?
                .unwrap_or_default();
            let mut entries = nodeconfig::render_rootfs(&goal, &resolv)?;
            entries.extend(nodeconfig::render_host(&goal));
            // A bootstrap token serves kubelet's first join only: once kubelet holds its
            // credential (this machine's, or the other's carried over), it keeps it, and the
            // token is not written into the machine again.
            if matches!(goal.auth, nodegoal::KubeletAuth::BootstrapToken(_)) {
                let kept = kubelet_credential::keep(
                    &host.fs,
                    machine,
                    &goal.node_name,
                    std::time::SystemTime::now(),
                )?;
                match &kept {
                    kubelet_credential::Kept::Own => {
                        tracing::info!(machine, "kubelet keeps its client credential")
                    }
                    kubelet_credential::Kept::Carried { from } => {
                        tracing::info!(machine, from = %from, "kubelet's client credential carried over from the other machine")
                    }
                    kubelet_credential::Kept::Nothing(why) => {
                        tracing::info!(machine, why = %why, "kubelet has no client credential to keep; it bootstraps with the token")
                    }
                }
                if kept.holds() {
                    entries = nodeconfig::with_held_credential(entries, &goal);
                    nodeconfig::apply(&host.fs, machine, &entries)?;
                    kubelet_credential::scrub_token(
                        &host.fs,
                        machine,
                        &goal.node_name,
                        std::time::SystemTime::now(),
                    )?;
                    return anyhow::Ok(());
                }
            }
            nodeconfig::apply(&host.fs, machine, &entries)?;
            anyhow::Ok(())
        })
        .await
        .map_err(SeamError::transient)?;
        step("install-binary-in-rootfs", async {
            lifecycle::install_binary_in_rootfs(host, &self.exe, machine)?;
            lifecycle::install_helper(host, &self.exe)?;
            host.systemd.daemon_reload().await?;
            anyhow::Ok(())
        })
        .await
        .map_err(SeamError::transient)?;
        Ok(())
    }

    /// `StartNode` without provisioning: start the machine, containerd and kubelet, wait for
    /// kubelet, then start node-problem-detector when it is installed (`start-npd`).
    pub async fn start_machine(&self, machine: &str) -> Result<(), SeamError> {
        let t = self.timings;
        step(
            "start-nspawn-machine",
            nspawn::start_machine(&self.host, machine, t),
        )
        .await
        .map_err(SeamError::transient)?;
        step(
            "start-services",
            nspawn::start_services(&self.host, machine),
        )
        .await
        .map_err(SeamError::transient)?;
        step(
            "wait-for-kubelet",
            nspawn::wait_for_kubelet(&self.host, machine, t),
        )
        .await
        .map_err(SeamError::transient)?;
        // A machine whose kubelet holds its client credential (a restart after the first join)
        // needs the token no more: its bootstrap kubeconfig leaves the machine. On a first
        // join kubelet is active before its certificate is issued; the daemon's next reconcile
        // removes it then (`flows::daemon`).
        match kubelet_credential::scrub_token(
            &self.host.fs,
            machine,
            &self.config.agent.node_name,
            std::time::SystemTime::now(),
        ) {
            Ok(true) => {
                tracing::info!(
                    machine,
                    "removed the bootstrap token's kubeconfig: kubelet holds its client credential"
                )
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(machine, error = %e, "could not remove the bootstrap token's kubeconfig")
            }
        }
        nspawn::start_npd(&self.host, machine).await;
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
    ) -> Result<(), SeamError> {
        self.provision(machine, None, false).await?;
        self.start_machine(machine).await
    }
}

#[async_trait]
impl NodeOps for NodeMachines {
    async fn provision(&self, machine: &str, kubernetes_version: &str) -> Result<(), SeamError> {
        NodeMachines::provision(self, machine, Some(kubernetes_version), true).await
    }
    async fn start(&self, machine: &str) -> Result<(), SeamError> {
        self.start_machine(machine).await
    }
    async fn stop(&self, machine: &str) -> Result<(), SeamError> {
        nspawn::stop_node(&self.host, machine, self.timings)
            .await
            .map_err(SeamError::transient)
    }
    async fn cleanup(&self, machine: &str) -> Result<(), SeamError> {
        nspawn::cleanup_machine(&self.host, machine, self.timings)
            .await
            .map_err(SeamError::transient)
    }
    async fn is_enabled(&self, machine: &str) -> Result<bool, SeamError> {
        nspawn::is_enabled(&self.host, machine)
            .await
            .map_err(SeamError::transient)
    }
}

impl NodeMachines {
    /// A registry client with `config`'s insecure registries and credentials: a probe is asked about the config
    /// it is given, which is not always the one these machines were made for (`bootstrap-node`
    /// probes the config it has just rendered).
    fn registry_for(&self, config: &Config) -> Result<RegistryClient, ProbeError> {
        super::registry_auth::registry_client(config, &self.host.fs, &self.http, (self.acr)(config))
            .map_err(|e| ProbeError::Config(e.to_string()))
    }
}

#[async_trait]
impl RemoteProbe for NodeMachines {
    async fn image_reachable(
        &self,
        config: &Config,
        goal: &MachineGoal,
    ) -> Result<String, ProbeError> {
        let source =
            ImageSource::parse(&goal.oci_image).map_err(|e| ProbeError::Config(e.to_string()))?;
        let arch = goal
            .arch
            .parse()
            .map_err(|e| ProbeError::Config(format!("{e}")))?;
        flex_oci::manifest_reachable(&self.registry_for(config)?, &source, arch)
            .await
            .map(|d| d.to_string())
            .map_err(|e| ProbeError::Unreachable(format!("rootfs image is not reachable: {e}")))
    }

    async fn artifacts_reachable(
        &self,
        config: &Config,
        goal: &MachineGoal,
    ) -> Vec<(String, Result<(), ProbeError>)> {
        match ComponentPlan::resolve(config, &goal.arch, self.downloads.clone()) {
            Ok(plan) => match self.registry_for(config) {
                Ok(registry) => components::check_reachable(&self.http, &registry, &plan).await,
                Err(e) => vec![(components::CHECK_KUBERNETES.to_string(), Err(e))],
            },
            Err(e) => vec![(
                components::CHECK_KUBERNETES.to_string(),
                Err(ProbeError::Config(e.to_string())),
            )],
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic is a failure

    use super::*;
    use crate::machine::nodegoal::tests::config;
    use flex_testkit::FakeHost;

    /// The real provision over a fake host (recording runner and systemd, a temporary root),
    /// config from the token fixture: a wrong machine name, Kubernetes version or image
    /// reference fails [`SeamError::Permanent`] before anything runs or is written; an image
    /// that is not there yet (an OCI layout path that does not exist) fails transiently.
    #[tokio::test]
    async fn a_wrong_input_fails_permanently_before_the_host_is_touched() {
        type Mutate = fn(&mut serde_json::Value);
        let none: Mutate = |_| {};
        let bad_image: Mutate = |v| v["bootstrap"]["ociImage"] = "Not A Reference!".into();
        let missing_layout: Mutate =
            |v| v["bootstrap"]["ociImage"] = "oci-layout:///nonexistent/layout:v1".into();
        for (what, machine, version, mutate, permanent) in [
            ("machine name", "kube3", "1.35.0", none, true),
            ("kubernetes version", "kube1", "one.two", none, true),
            ("image reference", "kube1", "1.35.0", bad_image, true),
            (
                "missing image layout",
                "kube1",
                "1.35.0",
                missing_layout,
                false,
            ),
        ] {
            let fake = FakeHost::new().unwrap();
            let machines = NodeMachines::new(fake.host.clone(), config(mutate), |_| None)
                .unwrap()
                .with_exe("/nonexistent/aks-flex-node");
            let e = NodeOps::provision(&machines, machine, version)
                .await
                .unwrap_err();
            assert_eq!(e.is_permanent(), permanent, "{what}: {e:#}");
            assert!(fake.runner.calls().is_empty(), "{what}: ran commands");
            assert!(fake.systemd.calls().is_empty(), "{what}: touched systemd");
            assert!(
                !fake.root.path().join("var/lib/machines").exists(),
                "{what}: wrote a machine directory"
            );
        }
    }
}
