//! Which machine client a config gets (`NewMachineClient`), and the adapter through which
//! `start` registers the machine ([`MachineClientRegistry`], a [`MachineRegistry`]).
//!
//! Selection, in upstream's order:
//! 1. `in-cluster` with Kubernetes clients (the daemon's) → [`InClusterClient`] over them (the
//!    current client per request, so a certificate rotation is picked up);
//! 2. `in-cluster` without one (`start`) → [`InClusterClient`] over the bootstrap credentials
//!    (`crate::kubeclient::bootstrap_config`: API server from `node.kubelet.clusterFQDN`, CA from
//!    `node.kubelet.caCertData`, bearer token from `azure.bootstrapToken`, else the exec
//!    credential plugin);
//! 3. `controller` → [`InClusterClient`] straight to an `aks-flex-controller`'s machine endpoint
//!    at `endpointUrl` ([`ControllerEndpoint`]: an `http`/`https` URL), with no credentials: for
//!    a controller that runs outside the cluster, which the API server's service proxy cannot
//!    reach (a development or test cluster; not upstream's);
//! 4. `arm` with `endpointUrl` → [`ArmMachineClient::proxy`] (the dev-test proxy, static token);
//! 5. `arm` → [`ArmMachineClient`] with the config's credential
//!    ([`super::azure::from_config_or_default`]: service principal or managed identity; with
//!    neither, the default Azure credential chain, as upstream's `DefaultAzureCredential`).
//!    Built in any case; when the chain finds nothing every call fails listing what it tried
//!    (so `start` fails only with `agent.requireMachineRegistration`, and the daemon keeps
//!    running and reports it).
//!
//! Building a Kubernetes client needs a Tokio runtime: call these from async code.

use std::sync::Arc;

use async_trait::async_trait;

use super::arm::ArmMachineClient;
use super::azure::{self, AzureCredential};
use super::incluster::InClusterClient;
use super::{Machine, MachineClient, MachineError};
use crate::config::{Config, ControllerEndpoint};
use crate::kubeclient::KubeClients;
use crate::machine::seams::{MachineRegistry, RemoteMachine};
use flex_api::goal::GoalState;

/// The ARM machine client for `config` with the credential [`azure::from_config_or_default`]
/// selects in `env`.
fn arm_client(config: &Config, env: &azure::Env) -> Result<Arc<dyn MachineClient>, MachineError> {
    let c =
        azure::from_config_or_default(config, env).map_err(|e| MachineError::Other(e.into()))?;
    tracing::info!(credential = c.kind(), "using the AKS machine API");
    let credential: Arc<dyn AzureCredential> = Arc::new(c);
    Ok(Arc::new(ArmMachineClient::new(config, credential)?))
}

/// The machine client for `config`; `kube` is the daemon's Kubernetes clients (`None` in
/// `start`, which uses the bootstrap credentials).
pub async fn machine_client(
    config: &Config,
    kube: Option<KubeClients>,
) -> Result<Arc<dyn MachineClient>, MachineError> {
    let mc = &config.agent.machine_client;
    let node = config.agent.node_name.as_str();
    match mc.mode.trim() {
        "in-cluster" => {
            let client = match kube {
                Some(k) => {
                    tracing::info!(
                        endpoint = %mc.endpoint_url,
                        "using Kubernetes service-proxy machine endpoint"
                    );
                    InClusterClient::over_clients(k, &mc.endpoint_url, node)?
                        .with_server(&config.api_server_url())
                }
                None => {
                    tracing::info!(
                        endpoint = %mc.endpoint_url,
                        "using Kubernetes service-proxy machine endpoint with bootstrap credentials"
                    );
                    let kc = crate::kubeclient::bootstrap_config(config)
                        .await
                        .map_err(|e| MachineError::Other(e.into()))?;
                    InClusterClient::from_kube_config(kc, &mc.endpoint_url, node)?
                }
            };
            Ok(Arc::new(client))
        }
        "controller" => {
            let endpoint = ControllerEndpoint::parse(&mc.endpoint_url)
                .map_err(|e| MachineError::Other(anyhow::anyhow!(e)))?;
            tracing::info!(
                endpoint = %endpoint.base,
                "using the aks-flex-controller machine endpoint directly (no credentials sent)"
            );
            Ok(Arc::new(InClusterClient::from_kube_config(
                kube::Config::new(endpoint.base.clone()),
                &endpoint.path,
                node,
            )?))
        }
        "arm" | "" if !mc.endpoint_url.trim().is_empty() => {
            tracing::warn!(
                endpoint = %mc.endpoint_url,
                "using the AKS machine API dev-test proxy (static token)"
            );
            Ok(Arc::new(ArmMachineClient::proxy(config, &mc.endpoint_url)?))
        }
        "arm" | "" => arm_client(config, &azure::process_env()),
        other => Err(MachineError::Other(anyhow::anyhow!(
            "agent.machineClient.mode {other:?} is not one of arm, in-cluster, controller"
        ))),
    }
}

/// The client `start` uses: [`machine_client`] without a Kubernetes client.
pub async fn client_for_start(config: &Config) -> Result<Arc<dyn MachineClient>, MachineError> {
    machine_client(config, None).await
}

/// The client the daemon uses, over its own Kubernetes clients (daemon credentials; the current
/// client per request, so a rotated certificate is used).
pub async fn client_for_daemon(
    config: &Config,
    kube: KubeClients,
) -> Result<Arc<dyn MachineClient>, MachineError> {
    machine_client(config, Some(kube)).await
}

/// A [`MachineRegistry`] over a [`MachineClient`]: `get` maps
/// [`MachineError::NotFound`] to `None`; `put` is `create`. The remote ETag is the machine's
/// settings version (the Kubernetes version when the machine has no ETag).
#[derive(Clone)]
pub struct MachineClientRegistry(pub Arc<dyn MachineClient>);

impl MachineClientRegistry {
    /// The registry `start` uses: [`client_for_start`] wrapped.
    pub async fn for_start(config: &Config) -> Result<Self, MachineError> {
        Ok(Self(client_for_start(config).await?))
    }
}

fn remote(m: &Machine) -> RemoteMachine {
    RemoteMachine {
        kubernetes_version: m.goal.kubernetes_version.clone(),
        etag: m.goal.settings_version.clone(),
    }
}

#[async_trait]
impl MachineRegistry for MachineClientRegistry {
    async fn get(&self) -> anyhow::Result<Option<RemoteMachine>> {
        match self.0.get().await {
            Ok(m) => Ok(Some(remote(&m))),
            Err(MachineError::NotFound(_)) => Ok(None),
            Err(MachineError::Other(e)) => Err(e),
        }
    }

    async fn put(&self, goal: &GoalState) -> anyhow::Result<RemoteMachine> {
        match self.0.create(goal).await {
            Ok(m) => Ok(remote(&m)),
            Err(e @ MachineError::NotFound(_)) => Err(anyhow::anyhow!(e)),
            Err(MachineError::Other(e)) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TargetCluster;
    use crate::goalclient::MachineStatus;
    use std::sync::Mutex;

    struct Scripted {
        get: Mutex<Vec<Result<Machine, MachineError>>>,
        created: Mutex<Vec<GoalState>>,
    }

    #[async_trait]
    impl MachineClient for Scripted {
        async fn get(&self) -> Result<Machine, MachineError> {
            self.get.lock().unwrap().remove(0)
        }
        async fn create(&self, goal: &GoalState) -> Result<Machine, MachineError> {
            self.created.lock().unwrap().push(goal.clone());
            Ok(Machine {
                goal: GoalState {
                    kubernetes_version: goal.kubernetes_version.clone(),
                    settings_version: "etag-after-put".into(),
                    ..Default::default()
                },
                ..Default::default()
            })
        }
        async fn patch_status(&self, _: &MachineStatus) -> Result<(), MachineError> {
            Ok(())
        }
    }

    fn machine(version: &str, settings: &str) -> Machine {
        Machine {
            goal: GoalState {
                kubernetes_version: version.into(),
                settings_version: settings.into(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn the_registry_maps_not_found_to_none_and_put_to_create() {
        let s = Arc::new(Scripted {
            get: Mutex::new(vec![
                Ok(machine("1.35.0", "e1")),
                Err(MachineError::NotFound("x".into())),
                Err(MachineError::Other(anyhow::anyhow!(
                    "get machine: status 500"
                ))),
            ]),
            created: Mutex::new(vec![]),
        });
        let r = MachineClientRegistry(s.clone());
        assert_eq!(
            r.get().await.unwrap(),
            Some(RemoteMachine {
                kubernetes_version: "1.35.0".into(),
                etag: "e1".into()
            })
        );
        assert_eq!(r.get().await.unwrap(), None);
        assert_eq!(
            r.get().await.unwrap_err().to_string(),
            "get machine: status 500"
        );
        let goal = GoalState {
            kubernetes_version: "1.35.0".into(),
            ..Default::default()
        };
        let put = r.put(&goal).await.unwrap();
        assert_eq!(put.etag, "etag-after-put");
        assert_eq!(s.created.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn ensure_machine_through_the_adapter_adopts_the_etag() {
        let s = Arc::new(Scripted {
            get: Mutex::new(vec![Err(MachineError::NotFound("x".into()))]),
            created: Mutex::new(vec![]),
        });
        let mut goal = GoalState {
            kubernetes_version: "1.35.0".into(),
            settings_version: "1.35.0".into(),
            ..Default::default()
        };
        crate::flows::start::ensure_machine(&MachineClientRegistry(s), &mut goal, true)
            .await
            .unwrap();
        assert_eq!(goal.settings_version, "etag-after-put");
    }

    fn arm_config() -> Config {
        let mut c = Config::default();
        c.azure.target_cluster = Some(TargetCluster {
            resource_id: "/subscriptions/s/resourceGroups/g/providers/Microsoft.ContainerService/managedClusters/c".into(),
            ..Default::default()
        });
        c.azure.target_agent_pool_name = "aksflexnodes".into();
        c.agent.node_name = "n1".into();
        c.components.kubernetes = "1.35.0".into();
        c.agent.machine_client.mode = "arm".into();
        c
    }

    /// No credential in the config and none the default chain finds: the environment holds
    /// nothing, IMDS is a closed loopback port (real socket: the probe's connection is
    /// refused), `az` is not on this machine's PATH (CI installs no Azure CLI; the chain's own
    /// tests drive a fake `az`).
    #[tokio::test]
    async fn arm_without_credential_builds_and_fails_on_use() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let imds = format!(
            "http://{}/metadata/identity/oauth2/token",
            closed.local_addr().unwrap()
        );
        drop(closed);
        let env = azure::Env::from([(azure::IMDS_ENDPOINT_ENV.to_string(), imds)]);
        let c = arm_client(&arm_config(), &env).unwrap();
        let e = c.get().await.unwrap_err().to_string();
        assert!(
            e.contains(
                "the default Azure credential chain found no credential; tried environment:"
            ),
            "{e}"
        );
        for source in azure::chain::SOURCES {
            assert!(e.contains(&format!("{source}: ")), "{source}: {e}");
        }
        // `start` with requireMachineRegistration=false warns and goes on.
        let mut goal = GoalState {
            kubernetes_version: "1.35.0".into(),
            settings_version: "1.35.0".into(),
            ..Default::default()
        };
        crate::flows::start::ensure_machine(&MachineClientRegistry(c.clone()), &mut goal, false)
            .await
            .unwrap();
        assert_eq!(goal.settings_version, "1.35.0");
        let e = crate::flows::start::ensure_machine(&MachineClientRegistry(c), &mut goal, true)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("ensure-machine: get machine: get AKS machine: get an Azure token: the default Azure credential chain found no credential"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn arm_with_a_service_principal_or_managed_identity_gets_a_credential() {
        // Built only: asking for a token would reach Entra ID or IMDS (tested against a local
        // server in `goalclient::azure` and, wired to this client, in `goalclient::arm`).
        let mut c = arm_config();
        c.azure.managed_identity = Some(Default::default());
        assert!(client_for_start(&c).await.is_ok());
        c.azure.service_principal = Some(crate::config::ServicePrincipal {
            tenant_id: "t".into(),
            client_id: "c".into(),
            client_secret: flex_host::secret::Secret::new("s"),
        });
        assert!(client_for_start(&c).await.is_ok());
        if let Some(sp) = c.azure.service_principal.as_mut() {
            sp.tenant_id = "not/a/tenant".into();
        }
        let e = client_for_start(&c).await.err().unwrap().to_string();
        assert!(e.contains("is not a tenant id or domain"), "{e}");
    }

    #[test]
    fn controller_endpoints() {
        let e = ControllerEndpoint::parse(" http://10.0.2.2:18080 ").unwrap();
        assert_eq!(e.base.to_string(), "http://10.0.2.2:18080/");
        assert_eq!(e.path, "/");
        let e = ControllerEndpoint::parse("https://ctl.example:8443/flex").unwrap();
        assert_eq!(e.path, "/flex");
        for (bad, why) in [
            ("", "is required"),
            (
                "/api/v1/namespaces/kube-system/services/x/proxy",
                "is not a URL",
            ),
            ("ftp://h/", "absolute http or https"),
            ("http://u:p@h:1/", "credentials"),
            ("http://h:1/?a=b", "query or fragment"),
            ("http://h:1/#x", "query or fragment"),
        ] {
            let e = ControllerEndpoint::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[tokio::test]
    async fn controller_mode_needs_a_url_and_no_credentials() {
        let mut c = arm_config();
        c.agent.machine_client.mode = "controller".into();
        c.agent.machine_client.endpoint_url = "http://127.0.0.1:9".into();
        assert!(client_for_start(&c).await.is_ok());
        c.agent.machine_client.endpoint_url = "/proxy".into();
        let e = client_for_start(&c).await.err().unwrap().to_string();
        assert!(e.contains("is not a URL"), "{e}");
    }

    #[tokio::test]
    async fn in_cluster_for_start_needs_bootstrap_credentials() {
        let mut c = arm_config();
        c.agent.machine_client.mode = "in-cluster".into();
        c.agent.machine_client.endpoint_url =
            "/api/v1/namespaces/kube-system/services/http:aks-flex-controller:80/proxy".into();
        let e = client_for_start(&c).await.err().unwrap().to_string();
        assert!(e.contains("kubernetes API server URL is empty"), "{e}");
        let mut c = arm_config();
        c.agent.machine_client.mode = "mystery".into();
        assert!(client_for_start(&c).await.is_err());
    }
}
