//! The ARM machine client (`client_armapi.go`, `client_armapi_proxy.go`): the machine resource
//! `<cluster>/agentPools/<pool>/machines/<node>` read and written through Azure Resource
//! Manager, authenticated by an [`AzureCredential`].
//!
//! The credential is the config's ([`super::azure::from_config_or_default`]): a service
//! principal's client secret or a managed identity, or with neither the default Azure credential
//! chain, as upstream. The dev-test proxy variant
//! (`agent.machineClient.endpointUrl` set in `arm` mode) uses upstream's static bearer token
//! ([`StaticToken`], `aks-flex-node-e2e`): every request goes to the proxy's scheme and host,
//! with the proxy's path prefixed and its query kept before the request's own.
//!
//! `create` is a PUT followed, while the resource's `provisioningState` is not terminal, by
//! polling GET on the resource (not the async-operation URL) until `Succeeded`, `Failed` or
//! `Canceled`. Both `get` and `create` check the returned id (case-insensitively) and name.
//! Status patches are a no-op with a warning: ARM machine status is read-only.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::azure::{AccessToken, AuthError, AzureCredential};
use super::retry::{NoAnswer, Tried, parse_retry_after};
use super::{Machine, MachineClient, MachineError, MachineStatus};
use crate::config::Config;
use flex_api::arm::{parse_arm_machine, put_body};
use flex_api::goal::GoalState;
use flex_host::retry::Backoff;
use flex_host::secret::Secret;

/// The API version of the machines API the agent speaks.
pub const API_VERSION: &str = "2026-01-02-preview";
/// The bearer token the dev-test proxy accepts.
pub const PROXY_TOKEN: &str = "aks-flex-node-e2e";
/// The ARM provider of managed clusters.
pub const PROVIDER: &str = "Microsoft.ContainerService";

fn other(e: impl Into<anyhow::Error>) -> MachineError {
    MachineError::Other(e.into())
}

/// Why a machine resource id cannot be built or parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResourceIdError {
    /// Config fields the id is built from are empty (named).
    #[error("incomplete AKS machine config: {} required", .0.join(", "))]
    Incomplete(Vec<&'static str>),
    /// The id is not a machine's.
    #[error("invalid AKS machine resource ID {id:?}: {problem}")]
    Invalid {
        /// The id as given.
        id: String,
        /// What is wrong with it.
        problem: IdProblem,
    },
}

/// What is wrong with a machine resource id.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdProblem {
    /// Not 12 `/`-separated segments.
    #[error("want 12 path segments (/subscriptions/…/machines/<name>), got {0}")]
    SegmentCount(usize),
    /// `//` somewhere.
    #[error("empty path segment")]
    EmptySegment,
    /// A keyword segment (`subscriptions`, `resourceGroups`, `providers`) is something else.
    #[error("segment {position} is {found:?}, want {want:?}")]
    Keyword {
        /// 1-based position.
        position: usize,
        /// What is there.
        found: String,
        /// The keyword.
        want: &'static str,
    },
    /// Not the container service provider.
    #[error("provider is {0:?}, want {PROVIDER}")]
    Provider(String),
    /// Not `managedClusters/agentPools/machines`.
    #[error("resource type is {0:?}, want managedClusters/agentPools/machines")]
    ResourceType(String),
}

/// A parsed machine resource id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineResourceId {
    /// Subscription.
    pub subscription: String,
    /// Resource group.
    pub resource_group: String,
    /// Managed cluster.
    pub cluster: String,
    /// Agent pool.
    pub agent_pool: String,
    /// Machine (node) name.
    pub machine: String,
}

impl MachineResourceId {
    /// Builds the id from the config: `<targetCluster.resourceId>/agentPools/<pool>/machines/<node>`.
    /// The cluster id, the pool, the node name and `components.kubernetes` are all required.
    pub fn from_config(c: &Config) -> Result<Self, ResourceIdError> {
        let cluster = c
            .azure
            .target_cluster
            .as_ref()
            .map(|t| t.resource_id.trim().trim_end_matches('/').to_string())
            .unwrap_or_default();
        let pool = c.azure.target_agent_pool_name.trim();
        let node = c.agent.node_name.trim();
        let missing: Vec<&str> = [
            ("azure.targetCluster.resourceId", cluster.is_empty()),
            ("azure.targetAgentPoolName", pool.is_empty()),
            ("agent.nodeName", node.is_empty()),
            (
                "components.kubernetes",
                c.components.kubernetes.trim().is_empty(),
            ),
        ]
        .iter()
        .filter(|(_, m)| *m)
        .map(|(n, _)| *n)
        .collect();
        if !missing.is_empty() {
            return Err(ResourceIdError::Incomplete(missing));
        }
        Self::parse(&format!("{cluster}/agentPools/{pool}/machines/{node}"))
    }

    /// Parses `/subscriptions/<s>/resourceGroups/<g>/providers/Microsoft.ContainerService/managedClusters/<c>/agentPools/<p>/machines/<m>`
    /// (keywords and the provider case-insensitively, as ARM does).
    pub fn parse(id: &str) -> Result<Self, ResourceIdError> {
        let bad = |problem| ResourceIdError::Invalid {
            id: id.to_string(),
            problem,
        };
        let segs: Vec<&str> = id.trim().trim_matches('/').split('/').collect();
        if segs.len() != 12 {
            return Err(bad(IdProblem::SegmentCount(segs.len())));
        }
        if segs.iter().any(|s| s.is_empty()) {
            return Err(bad(IdProblem::EmptySegment));
        }
        for (i, want) in [
            (0, "subscriptions"),
            (2, "resourceGroups"),
            (4, "providers"),
        ] {
            if !segs[i].eq_ignore_ascii_case(want) {
                return Err(bad(IdProblem::Keyword {
                    position: i + 1,
                    found: segs[i].to_string(),
                    want,
                }));
            }
        }
        if !segs[5].eq_ignore_ascii_case(PROVIDER) {
            return Err(bad(IdProblem::Provider(segs[5].to_string())));
        }
        let ty = format!("{}/{}/{}", segs[6], segs[8], segs[10]);
        if !ty.eq_ignore_ascii_case("managedClusters/agentPools/machines") {
            return Err(bad(IdProblem::ResourceType(ty)));
        }
        Ok(Self {
            subscription: segs[1].into(),
            resource_group: segs[3].into(),
            cluster: segs[7].into(),
            agent_pool: segs[9].into(),
            machine: segs[11].into(),
        })
    }
}

impl std::fmt::Display for MachineResourceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "/subscriptions/{}/resourceGroups/{}/providers/{PROVIDER}/managedClusters/{}/agentPools/{}/machines/{}",
            self.subscription, self.resource_group, self.cluster, self.agent_pool, self.machine
        )
    }
}

/// The token audience of an ARM endpoint: the public, US Government and China clouds map to
/// their management audiences; any other endpoint is its own audience.
pub fn arm_audience(endpoint: &str) -> String {
    match super::azure::cloud_of(endpoint) {
        Some(cloud) => cloud.audience.into(),
        None => format!("{}/", endpoint.trim().trim_end_matches('/')),
    }
}

/// The scope asked of a credential: the audience + `.default`.
pub fn arm_scope(endpoint: &str) -> String {
    format!("{}.default", arm_audience(endpoint))
}

/// A fixed bearer token (the dev-test proxy's `aks-flex-node-e2e`).
#[derive(Clone, Debug)]
pub struct StaticToken(pub Secret);

#[async_trait]
impl AzureCredential for StaticToken {
    async fn token(&self, _scope: &str) -> Result<AccessToken, AuthError> {
        Ok(AccessToken {
            token: self.0.clone(),
            expires_at: Some(std::time::SystemTime::now() + Duration::from_secs(3600)),
        })
    }
}

/// The ARM machine client for one node.
#[derive(Clone)]
pub struct ArmMachineClient {
    http: reqwest::Client,
    endpoint: url::Url,
    proxy: bool,
    id: MachineResourceId,
    credential: Arc<dyn AzureCredential>,
    scope: String,
    api_version: String,
    retry: Backoff,
    poll_interval: Duration,
    poll_timeout: Duration,
}

impl std::fmt::Debug for ArmMachineClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArmMachineClient")
            .field("endpoint", &self.endpoint.as_str())
            .field("proxy", &self.proxy)
            .field("id", &self.id.to_string())
            .field("api_version", &self.api_version)
            .finish_non_exhaustive()
    }
}

impl ArmMachineClient {
    /// The real ARM client: `azure.resourceManagerEndpoint`, the machine id from the config.
    pub fn new(
        config: &Config,
        credential: Arc<dyn AzureCredential>,
    ) -> Result<Self, MachineError> {
        let endpoint = config.azure.resource_manager_endpoint.trim();
        let endpoint = if endpoint.is_empty() {
            "https://management.azure.com"
        } else {
            endpoint
        };
        Self::build(config, endpoint, false, credential)
    }

    /// The dev-test proxy variant: requests go to `proxy_url` with the static token.
    pub fn proxy(config: &Config, proxy_url: &str) -> Result<Self, MachineError> {
        Self::build(
            config,
            proxy_url,
            true,
            Arc::new(StaticToken(Secret::new(PROXY_TOKEN))),
        )
    }

    /// The proxy variant with another credential (tests).
    pub fn proxy_with_credential(
        config: &Config,
        proxy_url: &str,
        credential: Arc<dyn AzureCredential>,
    ) -> Result<Self, MachineError> {
        Self::build(config, proxy_url, true, credential)
    }

    fn build(
        config: &Config,
        endpoint: &str,
        proxy: bool,
        credential: Arc<dyn AzureCredential>,
    ) -> Result<Self, MachineError> {
        let id = MachineResourceId::from_config(config).map_err(other)?;
        let endpoint = url::Url::parse(endpoint.trim()).map_err(|e| {
            other(anyhow::anyhow!(
                "ARM endpoint {endpoint:?} is not a URL: {e}"
            ))
        })?;
        if !matches!(endpoint.scheme(), "http" | "https") || !endpoint.has_host() {
            return Err(other(anyhow::anyhow!(
                "ARM endpoint {endpoint} must be an absolute http or https URL"
            )));
        }
        flex_host::http::install_crypto();
        let http = reqwest::Client::builder()
            .user_agent(concat!("aks-flex-node/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(30))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| other(anyhow::anyhow!("build ARM HTTP client: {e}")))?;
        Ok(Self {
            http,
            scope: arm_scope(config.azure.resource_manager_endpoint.trim()),
            endpoint,
            proxy,
            id,
            credential,
            api_version: API_VERSION.into(),
            retry: Backoff::default(),
            poll_interval: Duration::from_secs(5),
            poll_timeout: Duration::from_secs(600),
        })
    }

    /// Replaces the retry policy.
    pub fn with_retry(mut self, retry: Backoff) -> Self {
        self.retry = retry;
        self
    }

    /// Replaces the provisioning poll interval and timeout.
    pub fn with_polling(mut self, interval: Duration, timeout: Duration) -> Self {
        self.poll_interval = interval;
        self.poll_timeout = timeout;
        self
    }

    /// The machine's resource id.
    pub fn resource_id(&self) -> &MachineResourceId {
        &self.id
    }

    /// The request URL: `<endpoint><id>?api-version=…`; through the proxy, the proxy's path
    /// prefixed and its query first.
    pub fn machine_url(&self) -> String {
        let mut u = self.endpoint.clone();
        let base = if self.proxy {
            u.path().trim_end_matches('/').to_string()
        } else {
            String::new()
        };
        u.set_path(&format!("{base}{}", self.id));
        let own = format!("api-version={}", self.api_version);
        let query = match self
            .endpoint
            .query()
            .filter(|q| !q.is_empty() && self.proxy)
        {
            Some(q) => format!("{q}&{own}"),
            None => own,
        };
        u.set_query(Some(&query));
        u.set_fragment(None);
        u.to_string()
    }

    async fn send(
        &self,
        op: &str,
        method: reqwest::Method,
        body: Option<&[u8]>,
    ) -> Result<(reqwest::StatusCode, Vec<u8>), MachineError> {
        let token = self.credential.token(&self.scope).await.map_err(|e| {
            other(anyhow::Error::new(e).context(format!("{op}: get an Azure token")))
        })?;
        let url = self.machine_url();
        let what = format!("{op}: {method} {url}");
        let sent = super::retry::exchange(&what, self.retry, |_| {
            let mut req = self
                .http
                .request(method.clone(), &url)
                .bearer_auth(token.token.expose())
                .header(reqwest::header::ACCEPT, "application/json");
            if let Some(b) = body {
                req = req
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(b.to_vec());
            }
            async move {
                let resp = match req.send().await {
                    Ok(resp) => resp,
                    Err(e) => return Tried::Transport(e.to_string()),
                };
                let status = resp.status();
                let retry_after = parse_retry_after(
                    resp.headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok()),
                );
                match flex_host::http::read_capped(resp, flex_host::http::DOCUMENT_LIMIT).await {
                    Ok(bytes) => Tried::Answer {
                        status: status.as_u16(),
                        retry_after,
                        summary: format!("status {status}: {}", snippet(&bytes)),
                        reply: Ok((status, bytes.to_vec())),
                    },
                    Err(e) => Tried::Final(Err(other(anyhow::anyhow!("{op}: {e}")))),
                }
            }
        })
        .await;
        match sent {
            Ok(reply) => reply,
            Err(NoAnswer { cause, attempts }) => Err(other(anyhow::anyhow!(
                "{what}: {cause}{}",
                if attempts > 1 {
                    format!(" (gave up after {attempts} attempts)")
                } else {
                    String::new()
                }
            ))),
        }
    }

    fn decode(&self, op: &str, body: &[u8]) -> Result<Machine, MachineError> {
        let arm = parse_arm_machine(body).map_err(|e| other(anyhow::anyhow!("{op}: {e}")))?;
        let m = arm.to_machine("", "");
        let want = self.id.to_string();
        if !m.id.eq_ignore_ascii_case(&want) {
            return Err(other(anyhow::anyhow!(
                "{op}: AKS machine ID mismatch: got {:?}, want {want:?}",
                m.id
            )));
        }
        if m.name != self.id.machine {
            return Err(other(anyhow::anyhow!(
                "{op}: AKS machine name mismatch: got {:?}, want {:?}",
                m.name,
                self.id.machine
            )));
        }
        Ok(m)
    }

    fn status_error(&self, op: &str, status: reqwest::StatusCode, body: &[u8]) -> MachineError {
        if status == reqwest::StatusCode::NOT_FOUND {
            return MachineError::NotFound(self.id.to_string());
        }
        other(anyhow::anyhow!("{op}: status {status}: {}", snippet(body)))
    }
}

fn snippet(body: &[u8]) -> String {
    let end = body.len().min(super::incluster::ERROR_BODY_LIMIT);
    String::from_utf8_lossy(&body[..end]).trim().to_string()
}

fn terminal(state: &str) -> bool {
    matches!(
        state.to_ascii_lowercase().as_str(),
        "" | "succeeded" | "failed" | "canceled"
    )
}

#[async_trait]
impl MachineClient for ArmMachineClient {
    async fn get(&self) -> Result<Machine, MachineError> {
        const OP: &str = "get AKS machine";
        let (status, body) = self.send(OP, reqwest::Method::GET, None).await?;
        if !status.is_success() {
            return Err(self.status_error(OP, status, &body));
        }
        self.decode(OP, &body)
    }

    async fn create(&self, goal: &GoalState) -> Result<Machine, MachineError> {
        const OP: &str = "create AKS machine";
        let body = serde_json::to_vec(&put_body(goal)).map_err(other)?;
        let (status, resp) = self.send(OP, reqwest::Method::PUT, Some(&body)).await?;
        if !status.is_success() {
            return Err(self.status_error(OP, status, &resp));
        }
        let mut m = if resp.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            Some(self.decode(OP, &resp)?)
        };
        let started = tokio::time::Instant::now();
        loop {
            if let Some(done) = m
                .as_ref()
                .filter(|m| terminal(&m.status.provisioning_state))
            {
                let state = done.status.provisioning_state.to_ascii_lowercase();
                if state == "failed" || state == "canceled" {
                    return Err(other(anyhow::anyhow!(
                        "{OP}: provisioning ended {:?}",
                        done.status.provisioning_state
                    )));
                }
                return m.ok_or_else(|| other(anyhow::anyhow!("{OP}: no machine")));
            }
            if started.elapsed() >= self.poll_timeout {
                return Err(other(anyhow::anyhow!(
                    "{OP}: still {:?} after {:?}",
                    m.map(|m| m.status.provisioning_state).unwrap_or_default(),
                    self.poll_timeout
                )));
            }
            tokio::time::sleep(self.poll_interval).await;
            m = Some(self.get().await?);
        }
    }

    async fn patch_status(&self, _status: &MachineStatus) -> Result<(), MachineError> {
        tracing::warn!("skipping AKS machine status update; ARM Machine status is read-only");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// What every call of an ARM client over [`NoAzureCredential`] fails with.
    const NO_CREDENTIAL: &str = "no Azure credential (test)";

    /// A credential that never gives a token (fake, test code).
    #[derive(Clone, Copy, Debug, Default)]
    struct NoAzureCredential;

    #[async_trait]
    impl AzureCredential for NoAzureCredential {
        async fn token(&self, _scope: &str) -> Result<AccessToken, AuthError> {
            Err(AuthError::Unavailable(NO_CREDENTIAL.into()))
        }
    }

    use super::*;
    use crate::config::TargetCluster;

    const CLUSTER: &str = "/subscriptions/0000-11/resourceGroups/rg1/providers/Microsoft.ContainerService/managedClusters/c1";

    fn config() -> Config {
        let mut c = Config::default();
        c.azure.target_cluster = Some(TargetCluster {
            resource_id: format!("{CLUSTER}/"),
            ..Default::default()
        });
        c.azure.target_agent_pool_name = "aksflexnodes".into();
        c.azure.resource_manager_endpoint = "https://management.azure.com".into();
        c.agent.node_name = "node1".into();
        c.components.kubernetes = "1.35.0".into();
        c
    }

    #[test]
    fn resource_id_from_config() {
        let id = MachineResourceId::from_config(&config()).unwrap();
        assert_eq!(
            id.to_string(),
            format!("{CLUSTER}/agentPools/aksflexnodes/machines/node1")
        );
        assert_eq!(id.subscription, "0000-11");
        assert_eq!(id.resource_group, "rg1");
        assert_eq!(id.cluster, "c1");
        assert_eq!(id.agent_pool, "aksflexnodes");
        assert_eq!(id.machine, "node1");
        let mut c = config();
        c.azure.target_cluster = None;
        c.agent.node_name.clear();
        let e = MachineResourceId::from_config(&c).unwrap_err();
        assert_eq!(
            e,
            ResourceIdError::Incomplete(vec!["azure.targetCluster.resourceId", "agent.nodeName"])
        );
        assert_eq!(
            e.to_string(),
            "incomplete AKS machine config: azure.targetCluster.resourceId, agent.nodeName required"
        );
        let mut c = config();
        c.components.kubernetes = " ".into();
        assert_eq!(
            MachineResourceId::from_config(&c).unwrap_err(),
            ResourceIdError::Incomplete(vec!["components.kubernetes"])
        );
    }

    #[test]
    fn resource_id_parse_table() {
        let good = format!("{CLUSTER}/agentPools/p/machines/m");
        assert!(MachineResourceId::parse(&good).is_ok());
        let lower = good
            .replace("Microsoft.ContainerService", "microsoft.containerservice")
            .replace("managedClusters", "MANAGEDCLUSTERS");
        assert_eq!(
            MachineResourceId::parse(&lower).unwrap().cluster,
            "c1",
            "keywords are case-insensitive"
        );
        let cases = [
            (format!("{CLUSTER}/agentPools/p"), "want 12 path segments"),
            (
                good.replace("Microsoft.ContainerService", "Microsoft.Compute"),
                "provider is \"Microsoft.Compute\"",
            ),
            (
                good.replace("agentPools", "nodePools"),
                "resource type is \"managedClusters/nodePools/machines\"",
            ),
            (
                good.replace("resourceGroups", "groups"),
                "segment 3 is \"groups\"",
            ),
            (good.replace("/rg1/", "//"), "empty path segment"),
            (
                format!("{CLUSTER}/agentPools//machines/m/x"),
                "want 12 path segments",
            ),
        ];
        for (id, want) in cases {
            let e = MachineResourceId::parse(&id).unwrap_err();
            assert!(matches!(e, ResourceIdError::Invalid { .. }), "{e:?}");
            let e = e.to_string();
            assert!(e.contains(want), "{id}: {e}");
            assert!(e.starts_with("invalid AKS machine resource ID"), "{e}");
        }
    }

    #[test]
    fn audiences_and_scopes() {
        assert_eq!(
            arm_scope("https://management.azure.com/"),
            "https://management.core.windows.net/.default"
        );
        assert_eq!(
            arm_audience("https://management.usgovcloudapi.net"),
            "https://management.core.usgovcloudapi.net/"
        );
        assert_eq!(
            arm_audience("https://management.chinacloudapi.cn"),
            "https://management.core.chinacloudapi.cn/"
        );
        assert_eq!(
            arm_audience("https://arm.local:8443"),
            "https://arm.local:8443/"
        );
    }

    #[test]
    fn urls_direct_and_through_the_proxy() {
        let c = ArmMachineClient::new(&config(), Arc::new(NoAzureCredential)).unwrap();
        assert_eq!(
            c.machine_url(),
            format!(
                "https://management.azure.com{CLUSTER}/agentPools/aksflexnodes/machines/node1?api-version={API_VERSION}"
            )
        );
        let p = ArmMachineClient::proxy(&config(), "http://127.0.0.1:9000/arm/?x=1").unwrap();
        assert_eq!(
            p.machine_url(),
            format!(
                "http://127.0.0.1:9000/arm{CLUSTER}/agentPools/aksflexnodes/machines/node1?x=1&api-version={API_VERSION}"
            )
        );
    }

    #[tokio::test]
    async fn without_a_credential_every_call_says_so() {
        let c = ArmMachineClient::new(&config(), Arc::new(NoAzureCredential)).unwrap();
        let e = c.get().await.unwrap_err().to_string();
        assert!(e.contains(NO_CREDENTIAL), "{e}");
        let e = c
            .create(&GoalState::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains(NO_CREDENTIAL), "{e}");
        // Status is read-only in ARM: a no-op.
        c.patch_status(&MachineStatus::succeeded("v", ""))
            .await
            .unwrap();
    }

    /// The ARM client with a real client secret credential: Entra ID and the ARM endpoint
    /// (through the proxy variant, which only moves scheme and host) are scripted HTTP servers
    /// on 127.0.0.1.
    #[tokio::test]
    async fn the_bearer_token_comes_from_the_credential_and_is_reused() {
        use flex_testkit::http::{Reply, ScriptedServer};
        let aad = ScriptedServer::start(vec![Reply::json(
            200,
            r#"{"access_token":"arm-token-1","expires_in":3599}"#,
        )])
        .unwrap();
        let arm = ScriptedServer::start(vec![Reply::json(404, r#"{"error":{"code":"NotFound"}}"#)])
            .unwrap();
        let host = url::Url::parse(&aad.url("/")).unwrap();
        let cred =
            super::super::azure::ClientSecretCredential::new("t1", "c1", Secret::new("s1"), &host)
                .unwrap();
        let c = ArmMachineClient::proxy_with_credential(&config(), &arm.url("/"), Arc::new(cred))
            .unwrap();
        assert!(matches!(c.get().await, Err(MachineError::NotFound(_))));
        assert!(matches!(c.get().await, Err(MachineError::NotFound(_))));
        let asked = aad.requests();
        assert_eq!(asked.len(), 1, "the token is reused");
        assert!(
            asked[0]
                .body_text()
                .contains("scope=https%3A%2F%2Fmanagement.core.windows.net%2F.default"),
            "{}",
            asked[0].body_text()
        );
        let sent = arm.requests();
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[0].header("authorization"), Some("Bearer arm-token-1"));
    }

    #[test]
    fn terminal_states() {
        for s in ["Succeeded", "failed", "Canceled", ""] {
            assert!(terminal(s), "{s}");
        }
        for s in ["Creating", "Updating", "Accepted"] {
            assert!(!terminal(s), "{s}");
        }
    }
}
