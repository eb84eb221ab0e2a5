//! The `existing` cluster provider: `cargo xtask up --cluster --kubeconfig FILE` joins the VM to
//! a cluster that is already there, whose API server the guest can reach, instead of making a
//! kind cluster.
//!
//! [`up`] copies the kubeconfig (flattened, so it stands alone) under the work directory and
//! reads the cluster's version and CA through it (a kubeconfig that does not parse, or an API
//! server that does not answer, is the reason there is no cluster); applies `deploy/crds` and
//! `deploy/controller`'s ServiceAccount, ConfigMap and RBAC; runs `aks-flex-controller` as a
//! local process with that kubeconfig ([`LocalController`]: its machine endpoint on
//! `127.0.0.1`, which the guest reaches as `10.0.2.2`, and the CSR approver on), supervised by
//! `start-stop-daemon` and stopped by `down`; registers the VM and makes a bootstrap token. The
//! node's machine client then talks to that process directly (`controller` mode): the API
//! server's service proxy cannot reach a process on this host's loopback.
//!
//! An API server on this host's loopback is reached by the guest at `10.0.2.2`, so its serving
//! certificate must name `10.0.2.2` too. The API server reaches the node's kubelet at the VM's
//! address (`10.0.2.15:10250`), which only QEMU knows: `up` forwards `127.0.0.1:<port>` into the
//! guest's kubelet and says so; routing the API server's connections there is the cluster's
//! side (for a control plane in a network namespace, a DNAT rule in it).
//!
//! `down` stops the controller and the forward, and deletes the bootstrap token it made (a token
//! without expiry is not left in someone's cluster); the CRDs, RBAC and registration stay.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flex_host::runner::{Cmd, Runner};
use serde::{Deserialize, Serialize};

use super::kube::{Kubectl, cluster_dir};
use super::render;
use super::{ClusterInfo, Created, FIRST_SETTINGS_VERSION, GUEST_NODE_IP, Join, Provider};
use super::{
    MissingTool, NoCluster, Options, Step, StepError, TUNNEL_SOCKET, Tunnel, register_machine,
};
use crate::registry::GUEST_HOST_ADDR;

/// The name `up` records for an existing cluster.
pub const NAME: &str = "existing";
/// How long the local controller may take to answer `/readyz`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// `up --cluster --kubeconfig`: the cluster to join and the controller binary to run beside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExistingRequest {
    /// The kubeconfig as given (its current context is used).
    pub kubeconfig: PathBuf,
    /// `aks-flex-controller`, built for this host.
    pub controller_binary: PathBuf,
}

/// The `aks-flex-controller` process `up` runs for an existing cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalController {
    /// Its pid file (`start-stop-daemon`).
    pub pidfile: PathBuf,
    /// Its log.
    pub log: PathBuf,
    /// Its machine endpoint's port on `127.0.0.1`.
    pub port: u16,
}

impl LocalController {
    /// The controller under `dir` on `port`.
    pub fn at(dir: &Path, port: u16) -> Self {
        Self {
            pidfile: dir.join("controller.pid"),
            log: dir.join("controller.log"),
            port,
        }
    }

    /// The machine endpoint as the guest reaches it.
    pub fn guest_endpoint(&self) -> String {
        format!("http://{GUEST_HOST_ADDR}:{}", self.port)
    }

    /// `start-stop-daemon` starting `binary` with `kubeconfig`, listening on `127.0.0.1:<port>`,
    /// the CSR approver on.
    pub fn start_cmd(&self, binary: &Path, kubeconfig: &Path) -> Cmd {
        Cmd::new("start-stop-daemon")
            .args(["--start", "--background", "--make-pidfile", "--pidfile"])
            .arg(self.pidfile.display().to_string())
            .arg("--output")
            .arg(self.log.display().to_string())
            .arg("--exec")
            .arg(binary.display().to_string())
            .arg("--")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--listen-address=127.0.0.1:{}", self.port))
            .arg("--enable-csr-approver=true")
    }

    /// `start-stop-daemon` stopping it (TERM, then KILL).
    pub fn stop_cmd(&self) -> Cmd {
        crate::registry::stop_daemon_cmd(&self.pidfile)
    }
}

/// Where the guest reaches the API server at `server` (the kubeconfig's URL): an address on
/// this host's loopback becomes [`GUEST_HOST_ADDR`] (QEMU's user network maps it to the host's
/// loopback); any other address is the guest's to reach as it is.
pub fn guest_server(server: &str) -> anyhow::Result<String> {
    let url = url::Url::parse(server.trim())
        .map_err(|e| anyhow::anyhow!("the kubeconfig's server {server:?} is not a URL: {e}"))?;
    if url.scheme() != "https" {
        anyhow::bail!("the kubeconfig's server {server:?} is not https");
    }
    let host = url
        .host()
        .ok_or_else(|| anyhow::anyhow!("the kubeconfig's server {server:?} has no host"))?;
    let port = url.port_or_known_default().unwrap_or(443);
    let loopback = match &host {
        url::Host::Domain(d) => d.eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(a) => a.is_loopback(),
        url::Host::Ipv6(a) => a.is_loopback(),
    };
    Ok(if loopback {
        format!("https://{GUEST_HOST_ADDR}:{port}")
    } else {
        match host {
            url::Host::Ipv6(a) => format!("https://[{a}]:{port}"),
            h => format!("https://{h}:{port}"),
        }
    })
}

/// Joins the existing cluster of `req`. `Err` is why there is none (the controller it started
/// is stopped first); it becomes the cluster groups' skip reason.
pub async fn up(
    r: &dyn Runner,
    o: &Options<'_>,
    req: &ExistingRequest,
) -> Result<Created, NoCluster> {
    if r.which("kubectl").is_none() {
        return Err(MissingTool::Binary("kubectl").into());
    }
    let dir = cluster_dir(o.work);
    let controller = LocalController::at(&dir, o.api_port);
    match create(r, o, req, &dir, &controller).await {
        Ok(c) => Ok(c),
        Err(e) => {
            let reason = NoCluster::from(e);
            (o.say)(&format!("cluster: {reason}; stopping what was started"));
            let _ = r.output(&controller.stop_cmd()).await;
            Err(reason)
        }
    }
}

async fn create(
    r: &dyn Runner,
    o: &Options<'_>,
    req: &ExistingRequest,
    dir: &Path,
    controller: &LocalController,
) -> Result<Created, StepError> {
    std::fs::create_dir_all(dir).step("create the cluster directory")?;
    let kubeconfig = dir.join("kubeconfig");
    let flat = Kubectl::new(r, &req.kubeconfig)
        .flattened_config()
        .await
        .step("read the kubeconfig")?;
    let server = super::parse::kubeconfig_server(&flat).step("read the kubeconfig")?;
    let ca = super::parse::kubeconfig_ca(&flat).step("read the kubeconfig")?;
    let api_server = guest_server(&server).step("read the kubeconfig")?;
    write_private(&kubeconfig, flat.as_bytes()).step("copy the kubeconfig")?;
    let k = Kubectl::new(r, &kubeconfig);
    (o.say)(&format!("cluster: existing cluster at {server}"));
    let version = k
        .run(["version", "-o", "json"])
        .await
        .and_then(|out| super::parse::server_version(&out))
        .step("reach the API server")?;
    (o.say)("cluster: deploy/crds, the controller's ServiceAccount, ConfigMap and RBAC");
    apply_manifests(&k, o.repo).await?;
    (o.say)(&format!(
        "cluster: aks-flex-controller as a local process on 127.0.0.1:{} (CSR approver on)",
        controller.port
    ));
    let _ = r.output(&controller.stop_cmd()).await;
    r.run(&controller.start_cmd(&req.controller_binary, &kubeconfig))
        .await
        .step("start the controller")?;
    wait_ready(controller, READY_TIMEOUT)
        .await
        .step("wait for the controller")?;
    let token = register_machine(&k, o, &version, false).await?;
    (o.say)(
        "cluster: a bridge pod network for the VM's node, unless it has one (DaemonSet aks-flex-harness-cni)",
    );
    k.apply(&render::bridge_cni_daemonset(o.node_name))
        .await
        .step("apply the bridge CNI DaemonSet")?;
    let dns_service_ip = dns_service_ip(&k).await;
    let tunnel = Tunnel {
        socket: dir.join(TUNNEL_SOCKET),
        bind: forward_address(r, &server).await,
        port: o.tunnel_port,
    };
    (o.say)(&format!(
        "cluster: the API server reaches the node's kubelet at {GUEST_NODE_IP}:{}; up forwards {}:{} to it: route the API server's connections there (kubectl logs and exec need it)",
        super::KUBELET_PORT,
        tunnel.bind,
        tunnel.port
    ));
    Ok(Created {
        info: ClusterInfo {
            name: NAME.into(),
            provider: Provider::Existing {
                controller: controller.clone(),
            },
            kubeconfig: kubeconfig.clone(),
            api_port: 0,
            kubernetes_version: version.clone(),
            node_name: o.node_name.into(),
            settings_version: FIRST_SETTINGS_VERSION.into(),
            token_id: token.id().into(),
            control_plane_ip: String::new(),
            controller_image: String::new(),
            tunnel,
        },
        join: Join {
            api_server,
            ca_cert_data: ca,
            token,
            kubernetes_version: version,
            node_name: o.node_name.into(),
            node_ip: GUEST_NODE_IP.into(),
            dns_service_ip,
            machine_endpoint: Some(controller.guest_endpoint()),
        },
    })
}

/// Where the kubelet forward listens: this host's address toward the API server at `server`
/// (`ip -4 route get`: the address its packets to us come to, as for a control plane in a
/// network namespace or on a bridge), else `127.0.0.1`.
async fn forward_address(r: &dyn Runner, server: &str) -> String {
    let host = url::Url::parse(server).ok().and_then(|u| match u.host() {
        Some(url::Host::Ipv4(a)) if !a.is_loopback() => Some(a.to_string()),
        _ => None,
    });
    let Some(host) = host else {
        return "127.0.0.1".into();
    };
    match r
        .output(&Cmd::new("ip").args(["-4", "route", "get", &host]))
        .await
    {
        Ok(o) if o.success() => {
            super::parse::route_source(&o.stdout).unwrap_or_else(|| "127.0.0.1".into())
        }
        _ => "127.0.0.1".into(),
    }
}

/// Writes `bytes` to `path` readable by root only (it holds the cluster's credentials).
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// `deploy/crds` (server-side, waited for), then the controller's ServiceAccount, ConfigMap and
/// RBAC from `deploy/controller` (not its Deployment or Service: the controller runs locally).
async fn apply_manifests(k: &Kubectl<'_>, repo: &Path) -> Result<(), StepError> {
    super::apply_crds(k, repo).await?;
    for f in LOCAL_CONTROLLER_MANIFESTS {
        let path = repo.join("deploy/controller").join(f);
        k.run(["apply", "-f", &path.display().to_string()])
            .await
            .step("apply deploy/controller")?;
    }
    Ok(())
}

/// What of `deploy/controller` a local controller needs.
pub const LOCAL_CONTROLLER_MANIFESTS: &[&str] = &[
    "service-account.yaml",
    "configmap.yaml",
    "rbac.yaml",
    "admission.yaml",
    // The controller is unready until both policies are there (controller/src/policy.rs).
    "disruption.yaml",
];

/// Waits up to `timeout` for the controller to answer `/readyz`; the error holds its log.
pub async fn wait_ready(c: &LocalController, timeout: Duration) -> anyhow::Result<()> {
    let port = c.port;
    flex_host::retry::wait_until(
        "the local controller to answer /readyz",
        timeout,
        Duration::from_millis(200),
        || async move { readyz(port).await.map_err(|e| e.to_string()) },
    )
    .await
    .map_err(|t| {
        anyhow::anyhow!(
            "{t}; its log:\n{}",
            std::fs::read_to_string(&c.log).unwrap_or_default()
        )
    })
}

/// Why one `GET /readyz` did not say ready (the wait's last observation).
#[derive(Debug, thiserror::Error)]
enum NotReady {
    /// No connection, or it broke.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Another status line than `200`.
    #[error("answered {0:?}")]
    Status(String),
}

/// One `GET /readyz` on `127.0.0.1:<port>`: `Ok` on `200`.
async fn readyz(port: u16) -> Result<(), NotReady> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(b"GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await?;
    let mut head = Vec::new();
    s.read_to_end(&mut head).await?;
    let text = String::from_utf8_lossy(&head);
    let status = text.lines().next().unwrap_or_default().to_string();
    if status.split(' ').nth(1) == Some("200") {
        Ok(())
    } else {
        Err(NotReady::Status(status))
    }
}

/// The cluster's DNS service address (`kube-system/kube-dns`), else kind's default.
async fn dns_service_ip(k: &Kubectl<'_>) -> String {
    k.run([
        "-n",
        render::NAMESPACE,
        "get",
        "service",
        "kube-dns",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])
    .await
    .ok()
    .map(|s| s.trim().to_string())
    .filter(|s| s.parse::<std::net::IpAddr>().is_ok())
    .unwrap_or_else(|| render::DNS_SERVICE_IP.to_string())
}

/// `down` for an existing cluster: stop the controller and delete the bootstrap token `up`
/// made (the cluster itself stays).
pub async fn down(
    r: &dyn Runner,
    info: &ClusterInfo,
    controller: &LocalController,
) -> anyhow::Result<()> {
    let _ = r.output(&controller.stop_cmd()).await;
    let k = Kubectl::new(r, &info.kubeconfig);
    if info.kubeconfig.exists() {
        k.run([
            "-n",
            render::NAMESPACE,
            "delete",
            "secret",
            &format!("bootstrap-token-{}", info.token_id),
            "--ignore-not-found",
        ])
        .await
        .map_err(|e| anyhow::anyhow!("delete the bootstrap token {}: {e:#}", info.token_id))?;
    }
    Ok(())
}
