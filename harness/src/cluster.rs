//! The kind cluster of `cargo xtask up --cluster`, for the cluster check groups.
//!
//! [`up`] creates the kind cluster `aks-flex` (podman or docker; `KIND_EXPERIMENTAL_PROVIDER=
//! podman` for podman) with its API server on every host address at a known port and
//! `10.0.2.2` in its certificate, so the guest reaches it through QEMU's user network; loads
//! the controller's image (`cargo xtask image --controller`, its index renamed as the CRI looks
//! images up) with `kind load image-archive`; applies `deploy/crds` and `deploy/controller`
//! (through a kustomize overlay: the loaded image, the CSR approver on) and the harness's RBAC
//! for the agent's daemon; registers the VM in `kube-system/aks-flex-machines`; creates a
//! bootstrap token; and returns what the agent's bootstrap inputs need to join
//! ([`Join`], which the provision module renders into the bootstrap inputs).
//!
//! Two things make the VM's node a working node of a cluster it reaches only through QEMU's
//! user network: kube-proxy and kindnet, which run on every node, are pointed at the control
//! plane's address rather than its container name; and the API server reaches the VM's kubelet
//! (`10.0.2.15:10250`, for `kubectl logs`) through a DNAT rule in the control plane's container
//! to an SSH port forward into the guest ([`ensure_tunnel`], restarted by each cluster group,
//! since a reboot or a snapshot restore drops it).
//!
//! Where `up --cluster` cannot make a cluster (no `kind`, `kubectl`, podman or docker, or a
//! step failed), it deletes what it made and records why; the VM then boots offline and
//! `check` reports the cluster groups as skipped with that reason. What `up` decided is kept in
//! `state.json` under `cluster` ([`record`], [`load`]); [`down`] stops the port forward and
//! deletes the cluster.
//!
//! Every command goes through a [`Runner`]; `kubectl` is always the cluster's own kubeconfig's.
//! The bootstrap token goes to `kubectl` on stdin and never into an argument, a log or an error.

pub mod existing;
pub mod kube;
pub mod parse;
pub mod render;
pub mod token;

use std::path::{Path, PathBuf};
use std::time::Duration;

use flex_host::runner::{Cmd, Runner};
use serde::{Deserialize, Serialize};

use crate::ssh::Ssh;
use kube::{Kubectl, cluster_dir};
pub use render::{CLUSTER_NAME, CONTROL_PLANE};
use token::BootstrapToken;

/// The VM's address on QEMU's user network: its Node's InternalIP.
pub const GUEST_NODE_IP: &str = "10.0.2.15";
/// kubelet's port.
pub const KUBELET_PORT: u16 = 10250;
/// Why there is no cluster when `up` was not asked for one.
pub const NOT_REQUESTED: &str = "not requested: up --cluster";
/// The settings version `up` registers the machine with.
pub const FIRST_SETTINGS_VERSION: &str = "harness-1";
/// The `state.json` key.
pub const STATE_KEY: &str = "cluster";
/// How long `up` waits for the VM's Node to be Ready before its snapshot.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(600);
/// The kubelet forward's control socket, under `<work>/cluster`.
pub const TUNNEL_SOCKET: &str = "kubelet-forward.sock";

const CREATE_TIMEOUT: Duration = Duration::from_secs(900);
const LOAD_TIMEOUT: Duration = Duration::from_secs(600);
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(330);
const DELETE_TIMEOUT: Duration = Duration::from_secs(300);

/// The container engine kind runs its node on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// podman (root).
    Podman,
    /// docker.
    Docker,
}

impl Engine {
    /// Its CLI.
    pub fn program(self) -> &'static str {
        match self {
            Engine::Podman => "podman",
            Engine::Docker => "docker",
        }
    }

    /// The engine: `KIND_EXPERIMENTAL_PROVIDER` when set to one of them, else podman when it
    /// is on `PATH`, else docker; `Err` says why there is none.
    pub fn choose(r: &dyn Runner, provider: Option<&str>) -> Result<Engine, MissingTool> {
        let wanted = match provider.map(str::trim) {
            Some("podman") => Some(Engine::Podman),
            Some("docker") => Some(Engine::Docker),
            Some("") | None => None,
            Some(other) => return Err(MissingTool::UnknownProvider(other.to_string())),
        };
        if let Some(e) = wanted {
            return r
                .which(e.program())
                .map(|_| e)
                .ok_or(MissingTool::ProviderNotOnPath(e));
        }
        [Engine::Podman, Engine::Docker]
            .into_iter()
            .find(|e| r.which(e.program()).is_some())
            .ok_or(MissingTool::NoEngine)
    }

    fn kind(self, args: &[&str]) -> Cmd {
        let c = Cmd::new("kind").args(args.iter().copied());
        match self {
            Engine::Podman => c.env("KIND_EXPERIMENTAL_PROVIDER", "podman"),
            Engine::Docker => c,
        }
    }

    fn exec(self, args: &[&str]) -> Cmd {
        Cmd::new(self.program())
            .args(["exec", CONTROL_PLANE])
            .args(args.iter().copied())
    }
}

/// What this machine lacks for a cluster ([`tools`], [`Engine::choose`]): `up --cluster` then
/// makes none and boots the VM offline, and the cluster groups are skipped with it as the
/// reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MissingTool {
    /// `kind` or `kubectl` is not on `PATH`.
    #[error("no {0} binary on PATH")]
    Binary(&'static str),
    /// `KIND_EXPERIMENTAL_PROVIDER` names neither podman nor docker.
    #[error("KIND_EXPERIMENTAL_PROVIDER={0:?} is neither podman nor docker")]
    UnknownProvider(String),
    /// The engine `KIND_EXPERIMENTAL_PROVIDER` names is not on `PATH`.
    #[error("no {} on PATH (KIND_EXPERIMENTAL_PROVIDER)", .0.program())]
    ProviderNotOnPath(Engine),
    /// Neither podman nor docker is on `PATH`.
    #[error("no container engine: neither podman nor docker is on PATH")]
    NoEngine,
}

/// Why `up --cluster` made (or joined) no cluster; what it made is deleted or stopped first.
/// Whatever the variant, `up` goes on without a cluster: the VM boots offline and the cluster
/// groups are reported skipped with this as the reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoCluster {
    /// This machine lacks a tool.
    #[error(transparent)]
    Tools(#[from] MissingTool),
    /// No controller image to load into kind.
    #[error("no controller image (cargo xtask up --cluster builds it)")]
    NoControllerImage,
    /// A step failed: which, and the line of its error that says why ([`summary`]).
    #[error("{step} failed: {cause}")]
    Step {
        /// The step, as `up` names it.
        step: &'static str,
        /// Why, in one line.
        cause: String,
    },
}

impl From<StepError> for NoCluster {
    fn from(e: StepError) -> Self {
        NoCluster::Step {
            step: e.step,
            cause: summary(&e.cause),
        }
    }
}

/// The SSH port forward that carries the API server's connections to the VM's kubelet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tunnel {
    /// The control socket of the forwarding `ssh` (a ControlMaster).
    pub socket: PathBuf,
    /// The host address it listens on: the gateway of the control plane's container.
    pub bind: String,
    /// The port.
    pub port: u16,
}

/// Who made the cluster, and what `up` runs beside it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Provider {
    /// A kind cluster `up` made, on `engine`.
    Kind {
        /// Its container engine.
        engine: Engine,
    },
    /// A cluster that was there (`--kubeconfig`), with the controller as a local process.
    Existing {
        /// The controller `up` started.
        controller: existing::LocalController,
    },
}

/// The cluster `up` made or joined.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterInfo {
    /// The kind cluster's name (`existing` for an existing cluster).
    pub name: String,
    /// Who made it.
    pub provider: Provider,
    /// Its kubeconfig (admin), under the work directory.
    pub kubeconfig: PathBuf,
    /// The kind API server's port on the host (`https://10.0.2.2:<port>` from the guest; 0 for
    /// an existing cluster).
    pub api_port: u16,
    /// The cluster's Kubernetes version, which the node runs too.
    pub kubernetes_version: String,
    /// The VM's node (and machine) name.
    pub node_name: String,
    /// The settings version `up` registered the machine with.
    pub settings_version: String,
    /// The bootstrap token's public id (the secret is in the bootstrap inputs only).
    pub token_id: String,
    /// The kind control plane's address (kube-proxy's and kindnet's endpoint; empty for an
    /// existing cluster).
    pub control_plane_ip: String,
    /// The controller's image as the Deployment names it (empty when it runs locally).
    pub controller_image: String,
    /// The kubelet port forward.
    pub tunnel: Tunnel,
}

/// Whether `check` has a cluster, and if not, why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Availability {
    /// `up` made one.
    Ready(Box<ClusterInfo>),
    /// There is none.
    Unavailable {
        /// Why (`not requested: up --cluster`, `no kind binary on PATH`, …).
        reason: String,
    },
}

impl Availability {
    /// No cluster, for `reason`.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Availability::Unavailable {
            reason: reason.into(),
        }
    }

    /// The cluster, if there is one.
    pub fn info(&self) -> Option<&ClusterInfo> {
        match self {
            Availability::Ready(i) => Some(i),
            Availability::Unavailable { .. } => None,
        }
    }

    /// What a skipped cluster check says: `no cluster (<reason>)`.
    pub fn skip_reason(&self) -> String {
        match self {
            Availability::Ready(_) => String::new(),
            Availability::Unavailable { reason } => format!("no cluster ({reason})"),
        }
    }
}

/// Records `a` in `<work>/state.json` under [`STATE_KEY`] (the file `up` writes; the key is
/// added beside the VM's state, which keeps its own fields).
pub fn record(work: &Path, a: &Availability) -> anyhow::Result<()> {
    let path = crate::state::State::path(work);
    let mut v: serde_json::Value = match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b)
            .map_err(|e| anyhow::anyhow!("{}: not JSON ({e})", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::json!({}),
        Err(e) => return Err(anyhow::anyhow!("read {}: {e}", path.display())),
    };
    let obj = v
        .as_object_mut()
        .ok_or_else(|| anyhow::anyhow!("{} is not a JSON object", path.display()))?;
    obj.insert(STATE_KEY.into(), serde_json::to_value(a)?);
    std::fs::create_dir_all(work)?;
    let tmp = work.join(".state.json.cluster.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&v)?)?;
    std::fs::rename(&tmp, &path)?;
    Ok(())
}

/// What `<work>/state.json` records; without a record (no `up`, or an `up` before clusters),
/// "not requested".
pub fn load(work: &Path) -> anyhow::Result<Availability> {
    let path = crate::state::State::path(work);
    let b = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Availability::unavailable(NOT_REQUESTED));
        }
        Err(e) => return Err(anyhow::anyhow!("read {}: {e}", path.display())),
    };
    let v: serde_json::Value = serde_json::from_slice(&b)
        .map_err(|e| anyhow::anyhow!("{}: not JSON ({e})", path.display()))?;
    match v.get(STATE_KEY) {
        None | Some(serde_json::Value::Null) => Ok(Availability::unavailable(NOT_REQUESTED)),
        Some(c) => Ok(serde_json::from_value(c.clone())
            .map_err(|e| anyhow::anyhow!("{}: {STATE_KEY}: {e}", path.display()))?),
    }
}

/// The skip reason of the cluster groups for the VM in `work`: `no cluster (<why>)`.
pub fn skip_reason(work: &Path) -> String {
    match load(work) {
        Ok(Availability::Ready(_)) => "no cluster (check runs without the one up made)".into(),
        Ok(a) => a.skip_reason(),
        Err(e) => format!("no cluster (its record in state.json is unreadable: {e:#})"),
    }
}

/// Before a cluster group: (re)starts the kubelet forward, which a VM reboot or a snapshot
/// restore drops.
pub async fn prepare_group(r: &dyn Runner, work: &Path, ssh: &Ssh) -> anyhow::Result<()> {
    let Availability::Ready(info) = load(work)? else {
        anyhow::bail!("{}", skip_reason(work));
    };
    ensure_tunnel(r, ssh, &info.tunnel).await?;
    Ok(())
}

/// Waits until the VM's Node is Ready (`up` waits so before its snapshot).
pub async fn wait_joined(
    r: &dyn Runner,
    info: &ClusterInfo,
    timeout: Duration,
) -> anyhow::Result<()> {
    let k = Kubectl::new(r, &info.kubeconfig);
    let node = info.node_name.as_str();
    kube::poll(
        &format!("Node {node} to be Ready"),
        timeout,
        kube::Pace::REAL,
        || async move {
            let json = k.get_json(&["node", node]).await?;
            Ok(match parse::node(&json)? {
                None => kube::Seen::Not("no Node".into()),
                Some(n) if n.ready => kube::Seen::Done(()),
                Some(n) => kube::Seen::Not(n.to_string()),
            })
        },
    )
    .await
}

/// `KIND_EXPERIMENTAL_PROVIDER` as the environment has it.
pub fn provider() -> Option<String> {
    std::env::var("KIND_EXPERIMENTAL_PROVIDER").ok()
}

/// A free TCP port on every host address (bound and released).
pub fn free_port_any() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("0.0.0.0:0")?
        .local_addr()?
        .port())
}

/// `up`'s step once the host bootstrapped (before the snapshot): starts the kubelet forward
/// and waits for the Node to be Ready. Failures are told, not fatal: `check`'s node-join group
/// reports them with what it saw.
pub async fn joined_step(say: &dyn Fn(&str), r: &dyn Runner, ssh: &Ssh, info: &ClusterInfo) {
    if let Err(e) = ensure_tunnel(r, ssh, &info.tunnel).await {
        say(&format!("warning: {e:#}"));
    }
    say(&format!("waiting for Node {} to be Ready", info.node_name));
    match wait_joined(r, info, JOIN_TIMEOUT).await {
        Ok(()) => say(&format!("Node {} is Ready", info.node_name)),
        Err(e) => say(&format!(
            "warning: {e:#} (check's node-join group will fail)"
        )),
    }
}

/// What `up` is asked for with `--cluster`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The controller's OCI layout (`cargo xtask image --controller`); `None` when it was not
    /// built because [`tools`] found something missing.
    pub controller_layout: Option<PathBuf>,
    /// `--kubeconfig`: join this existing cluster rather than make a kind cluster.
    pub existing: Option<existing::ExistingRequest>,
}

/// What `up --cluster` needs.
pub struct Options<'a> {
    /// The repository (for `deploy/`).
    pub repo: &'a Path,
    /// The harness's work directory.
    pub work: &'a Path,
    /// The controller's OCI layout (`cargo xtask image --controller`), if built.
    pub controller_layout: Option<&'a Path>,
    /// An existing cluster to join instead ([`existing`]).
    pub existing: Option<&'a existing::ExistingRequest>,
    /// The VM's node name.
    pub node_name: &'a str,
    /// A free host port: the kind API server's, or the local controller's for an existing
    /// cluster.
    pub api_port: u16,
    /// The kubelet forward's host port.
    pub tunnel_port: u16,
    /// `KIND_EXPERIMENTAL_PROVIDER` as the environment has it.
    pub provider: Option<&'a str>,
    /// Progress lines.
    pub say: &'a dyn Fn(&str),
}

/// What the agent's bootstrap inputs need to join the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Join {
    /// `https://10.0.2.2:<port>`.
    pub api_server: String,
    /// The cluster CA (base64 PEM).
    pub ca_cert_data: String,
    /// The bootstrap token.
    pub token: BootstrapToken,
    /// The Kubernetes version the node runs: the cluster's.
    pub kubernetes_version: String,
    /// The node's name.
    pub node_name: String,
    /// The node's address.
    pub node_ip: String,
    /// The cluster's DNS service address.
    pub dns_service_ip: String,
    /// The controller's machine endpoint when the node reaches it directly (`controller`
    /// mode); `None`: through the API server's service proxy (`in-cluster`).
    pub machine_endpoint: Option<String>,
}

/// A made cluster.
#[derive(Clone, Debug)]
pub struct Created {
    /// What is recorded.
    pub info: ClusterInfo,
    /// What the node joins with.
    pub join: Join,
}

/// A failed step: which, and why.
struct StepError {
    step: &'static str,
    cause: String,
}

trait Step<T> {
    fn step(self, step: &'static str) -> Result<T, StepError>;
}

impl<T, E: std::fmt::Display> Step<T> for Result<T, E> {
    fn step(self, step: &'static str) -> Result<T, StepError> {
        self.map_err(|e| StepError {
            step,
            cause: format!("{e:#}"),
        })
    }
}

/// One line of a (long) error for a reason: the first line that starts with `error` (kind's
/// `ERROR: failed to create cluster: …`, kubectl's `Error from server …`), else the first line;
/// without the runner's `<argv> failed: exit status <n>: ` in front of the command's own words.
pub fn summary(s: &str) -> String {
    let lines: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    lines
        .iter()
        .find(|l| l.to_ascii_lowercase().starts_with("error"))
        .or_else(|| lines.first())
        .map(|l| without_runner_prefix(l).to_string())
        .unwrap_or_default()
}

fn without_runner_prefix(line: &str) -> &str {
    const MARK: &str = " failed: exit status ";
    line.find(MARK)
        .map(|i| &line[i + MARK.len()..])
        .and_then(|rest| rest.split_once(": ").map(|(_, words)| words))
        .filter(|w| !w.trim().is_empty())
        .unwrap_or(line)
}

/// Whether this machine has what a cluster needs: `kind`, `kubectl`, and podman or docker
/// ([`Engine::choose`]); `Err` says what is missing. `cargo xtask up --cluster` asks first, so
/// it builds the controller's image only where a cluster can be made.
pub fn tools(r: &dyn Runner, provider: Option<&str>) -> Result<Engine, MissingTool> {
    for tool in ["kind", "kubectl"] {
        if r.which(tool).is_none() {
            return Err(MissingTool::Binary(tool));
        }
    }
    Engine::choose(r, provider)
}

/// Makes the cluster. `Err` is why there is none (what was made is deleted first); it becomes
/// the skip reason of the cluster groups.
pub async fn up(r: &dyn Runner, o: &Options<'_>) -> Result<Created, NoCluster> {
    if let Some(req) = o.existing {
        return existing::up(r, o, req).await;
    }
    let engine = tools(r, o.provider)?;
    let Some(layout) = o.controller_layout else {
        return Err(NoCluster::NoControllerImage);
    };
    let dir = cluster_dir(o.work);
    let kubeconfig = dir.join("kubeconfig");
    match create(r, o, engine, layout, &dir, &kubeconfig).await {
        Ok(c) => Ok(c),
        Err(e) => {
            let reason = NoCluster::from(e);
            (o.say)(&format!("cluster: {reason}; deleting what was made"));
            if let Err(d) = delete_cluster(r, engine, &kubeconfig).await {
                (o.say)(&format!("cluster: could not delete it: {d:#}"));
            }
            Err(reason)
        }
    }
}

/// Makes the cluster, step by step; each step's error names the step.
async fn create(
    r: &dyn Runner,
    o: &Options<'_>,
    engine: Engine,
    layout: &Path,
    dir: &Path,
    kubeconfig: &Path,
) -> Result<Created, StepError> {
    let k = Kubectl::new(r, kubeconfig);
    start_kind(r, o, engine, dir, kubeconfig).await?;
    let (version, ca) = read_cluster(&k, o.api_port).await?;
    let image = load_controller(r, o, engine, layout, dir).await?;
    deploy_controller(&k, o, dir, &image).await?;
    let token = register_machine(&k, o, &version, true).await?;
    let (control_plane_ip, gateway) = route_to_the_node(r, &k, o, engine).await?;
    Ok(Created {
        info: ClusterInfo {
            name: CLUSTER_NAME.into(),
            provider: Provider::Kind { engine },
            kubeconfig: kubeconfig.to_path_buf(),
            api_port: o.api_port,
            kubernetes_version: version.clone(),
            node_name: o.node_name.into(),
            settings_version: FIRST_SETTINGS_VERSION.into(),
            token_id: token.id().into(),
            control_plane_ip,
            controller_image: image,
            tunnel: Tunnel {
                socket: dir.join(TUNNEL_SOCKET),
                bind: gateway,
                port: o.tunnel_port,
            },
        },
        join: Join {
            api_server: format!(
                "https://{}:{}",
                crate::registry::GUEST_HOST_ADDR,
                o.api_port
            ),
            ca_cert_data: ca,
            token,
            kubernetes_version: version,
            node_name: o.node_name.into(),
            node_ip: GUEST_NODE_IP.into(),
            dns_service_ip: render::DNS_SERVICE_IP.into(),
            machine_endpoint: None,
        },
    })
}

/// Deletes an earlier cluster and creates the kind cluster with its API server on
/// `o.api_port`, its kubeconfig at `kubeconfig`.
async fn start_kind(
    r: &dyn Runner,
    o: &Options<'_>,
    engine: Engine,
    dir: &Path,
    kubeconfig: &Path,
) -> Result<(), StepError> {
    std::fs::create_dir_all(dir).step("create the cluster directory")?;
    delete_cluster(r, engine, kubeconfig)
        .await
        .step("delete an earlier cluster")?;
    (o.say)(&format!(
        "cluster: kind create cluster {CLUSTER_NAME} ({}, API server on port {})",
        engine.program(),
        o.api_port
    ));
    let config = dir.join("kind.yaml");
    std::fs::write(&config, render::kind_config(o.api_port)).step("write the kind config")?;
    let kc = kubeconfig.display().to_string();
    r.run(
        &engine
            .kind(&["create", "cluster", "--name", CLUSTER_NAME, "--config"])
            .arg(config.display().to_string())
            .args(["--kubeconfig", &kc, "--wait", "5m"])
            .timeout(CREATE_TIMEOUT),
    )
    .await
    .step("kind create cluster")?;
    Ok(())
}

/// Points the kubeconfig at `127.0.0.1:<api_port>` and reads the cluster's version and CA.
async fn read_cluster(k: &Kubectl<'_>, api_port: u16) -> Result<(String, String), StepError> {
    k.run([
        "config",
        "set-cluster",
        &format!("kind-{CLUSTER_NAME}"),
        &format!("--server=https://127.0.0.1:{api_port}"),
    ])
    .await
    .step("point the kubeconfig at 127.0.0.1")?;
    let version = k
        .run(["version", "-o", "json"])
        .await
        .and_then(|out| parse::server_version(&out))
        .step("read the cluster's version")?;
    let ca = k
        .run(["config", "view", "--raw", "--minify", "-o", "json"])
        .await
        .and_then(|out| parse::kubeconfig_ca(&out))
        .step("read the cluster's CA")?;
    Ok((version, ca))
}

/// Loads the controller's image into the cluster; returns its name.
async fn load_controller(
    r: &dyn Runner,
    o: &Options<'_>,
    engine: Engine,
    layout: &Path,
    dir: &Path,
) -> Result<String, StepError> {
    (o.say)("cluster: loading the controller's image");
    let (archive, image) =
        controller_archive(layout, dir).step("prepare the controller's image archive")?;
    r.run(
        &engine
            .kind(&["load", "image-archive"])
            .arg(archive.display().to_string())
            .args(["--name", CLUSTER_NAME])
            .timeout(LOAD_TIMEOUT),
    )
    .await
    .step("kind load image-archive")?;
    Ok(image)
}

/// Applies `deploy/crds`, waits for them, and applies `deploy/controller` through an overlay
/// that names the loaded `image`.
async fn deploy_controller(
    k: &Kubectl<'_>,
    o: &Options<'_>,
    dir: &Path,
    image: &str,
) -> Result<(), StepError> {
    (o.say)("cluster: deploy/crds, deploy/controller (CSR approver on, the daemons' RBAC)");
    apply_crds(k, o.repo).await?;
    let overlay = dir.join("controller");
    std::fs::create_dir_all(&overlay).step("create the controller overlay")?;
    let base = render::relative_path(
        &absolute(&overlay),
        &absolute(&o.repo.join("deploy/controller")),
    );
    std::fs::write(
        overlay.join("kustomization.yaml"),
        render::controller_kustomization(&base.display().to_string(), render::tag_of(image)),
    )
    .step("write the controller overlay")?;
    k.run(["apply", "-k", &overlay.display().to_string()])
        .await
        .step("apply deploy/controller")?;
    Ok(())
}

/// Applies `deploy/crds` (server-side) and waits until the API server serves them.
async fn apply_crds(k: &Kubectl<'_>, repo: &Path) -> Result<(), StepError> {
    let crds = repo.join("deploy/crds/machina.yaml");
    k.run(["apply", "--server-side", "-f", &crds.display().to_string()])
        .await
        .step("apply deploy/crds")?;
    k.run([
        "wait",
        "--for=condition=established",
        "--timeout=60s",
        "crd/machineoperations.unbounded-cloud.io",
        "crd/machines.unbounded-cloud.io",
    ])
    .await
    .step("wait for the CRDs")?;
    Ok(())
}

/// Registers the VM's machine with the controller, creates a bootstrap token and, when
/// `rollout` (the controller is the Deployment), waits for the controller to roll out; returns
/// the token.
async fn register_machine(
    k: &Kubectl<'_>,
    o: &Options<'_>,
    version: &str,
    rollout: bool,
) -> Result<BootstrapToken, StepError> {
    (o.say)(&format!(
        "cluster: registering {} in {}/{} and creating a bootstrap token",
        o.node_name,
        render::NAMESPACE,
        render::MACHINES_CONFIG_MAP
    ));
    let token = BootstrapToken::generate().step("generate a bootstrap token")?;
    let entry = render::machine_entry(o.node_name, version, FIRST_SETTINGS_VERSION, token.id())
        .step("render the machine entry")?;
    k.apply(&render::machines_config_map(o.node_name, &entry))
        .await
        .step("register the machine")?;
    k.apply_secret(&render::token_secret(&token), &[token.secret().expose()])
        .await
        .step("create the bootstrap token")?;
    if !rollout {
        return Ok(token);
    }
    k.run_t(
        [
            "-n",
            render::NAMESPACE,
            "rollout",
            "status",
            "deployment/aks-flex-controller",
            "--timeout=300s",
        ],
        ROLLOUT_TIMEOUT,
    )
    .await
    .step("wait for the controller")?;
    Ok(token)
}

/// Points kube-proxy and kindnet at the control plane's address and routes the API server's
/// connections to the VM's kubelet to the forward's port; returns the control plane's address
/// and its container's gateway (where the forward listens).
async fn route_to_the_node(
    r: &dyn Runner,
    k: &Kubectl<'_>,
    o: &Options<'_>,
    engine: Engine,
) -> Result<(String, String), StepError> {
    (o.say)("cluster: kube-proxy and kindnet reach the control plane by address; kubelet forward");
    let cp_ip = k
        .get_json(&["node", CONTROL_PLANE])
        .await
        .and_then(|j| parse::node(&j))
        .and_then(|n| {
            n.and_then(|n| n.internal_ip)
                .ok_or_else(|| anyhow::anyhow!("node {CONTROL_PLANE} has no InternalIP"))
        })
        .step("read the control plane's address")?;
    let server = format!("https://{cp_ip}:{}", render::CONTROL_PLANE_PORT);
    let proxy = k
        .get_json(&["-n", render::NAMESPACE, "configmap", "kube-proxy"])
        .await
        .and_then(|j| render::kube_proxy_config_map(&j, &server))
        .step("read kube-proxy's ConfigMap")?;
    r.run(&k.cmd(["replace", "-f", "-"]).stdin(proxy.into_bytes()))
        .await
        .step("point kube-proxy at the control plane's address")?;
    k.run([
        "-n",
        render::NAMESPACE,
        "rollout",
        "restart",
        "daemonset/kube-proxy",
    ])
    .await
    .step("restart kube-proxy")?;
    let kindnet = k
        .get_json(&["-n", render::NAMESPACE, "daemonset", "kindnet"])
        .await
        .step("look for kindnet")?;
    if !kindnet.trim().is_empty() {
        k.run([
            "-n",
            render::NAMESPACE,
            "set",
            "env",
            "daemonset/kindnet",
            "-c",
            "kindnet-cni",
            &format!(
                "CONTROL_PLANE_ENDPOINT={cp_ip}:{}",
                render::CONTROL_PLANE_PORT
            ),
        ])
        .await
        .step("point kindnet at the control plane's address")?;
    }
    let gateway = r
        .run(&engine.exec(&["ip", "-4", "route", "show", "default"]))
        .await
        .map_err(anyhow::Error::from)
        .and_then(|o| {
            parse::default_gateway(&o.stdout).ok_or_else(|| {
                anyhow::anyhow!("no default route in {CONTROL_PLANE}: {:?}", o.stdout)
            })
        })
        .step("read the control plane's gateway")?;
    let rule = dnat_rule("-I", &gateway, o.tunnel_port);
    r.run(&engine.exec(&rule.iter().map(String::as_str).collect::<Vec<_>>()))
        .await
        .step("route the kubelet port to the forward")?;
    Ok((cp_ip, gateway))
}

/// The `iptables` rule (for `op` `-I` or `-D`) in the control plane's container that sends
/// the API server's connections to the VM's kubelet to the forward on the host.
pub fn dnat_rule(op: &str, gateway: &str, port: u16) -> Vec<String> {
    let mut v: Vec<String> = ["iptables", "-t", "nat", op, "OUTPUT"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if op == "-I" {
        v.push("1".into());
    }
    v.extend(
        [
            "-p",
            "tcp",
            "-d",
            GUEST_NODE_IP,
            "--dport",
            &KUBELET_PORT.to_string(),
            "-j",
            "DNAT",
            "--to-destination",
            &format!("{gateway}:{port}"),
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    v
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Copies the controller's OCI layout into `dir`, names its image as the CRI looks it up
/// ([`render::normalize_index`]) and writes the archive `kind load image-archive` takes;
/// returns the archive and the image's name (`aks-flex-controller:<version>`).
pub fn controller_archive(layout: &Path, dir: &Path) -> anyhow::Result<(PathBuf, String)> {
    let copy = dir.join("controller-image");
    if copy.exists() {
        std::fs::remove_dir_all(&copy)?;
    }
    crate::devhost::copy_tree(layout, &copy)?;
    let index = copy.join("index.json");
    let (renamed, name) = render::normalize_index(
        &std::fs::read(&index).map_err(|e| anyhow::anyhow!("read {}: {e}", index.display()))?,
    )?;
    std::fs::write(&index, renamed)?;
    let archive = dir.join("aks-flex-controller.tar");
    flex_image::write_oci_archive(&copy, &archive, 0)?;
    Ok((archive, name))
}

/// Deletes the kind cluster if kind lists it.
async fn delete_cluster(r: &dyn Runner, engine: Engine, kubeconfig: &Path) -> anyhow::Result<bool> {
    let listed = r.run(&engine.kind(&["get", "clusters"])).await?;
    if !parse::kind_clusters(&listed.stdout)
        .iter()
        .any(|c| c == CLUSTER_NAME)
    {
        return Ok(false);
    }
    r.run(
        &engine
            .kind(&["delete", "cluster", "--name", CLUSTER_NAME, "--kubeconfig"])
            .arg(kubeconfig.display().to_string())
            .timeout(DELETE_TIMEOUT),
    )
    .await?;
    Ok(true)
}

/// The forwarding `ssh`: a ControlMaster on `t.socket` that backgrounds itself once the
/// forward `t.bind:t.port` → the guest's `127.0.0.1:10250` listens (kubelet listens on every
/// address of the host's network, which the machines share).
pub fn tunnel_cmd(ssh: &Ssh, t: &Tunnel) -> Cmd {
    ssh.forward_cmd(&t.socket, &t.bind, t.port, KUBELET_PORT)
}

fn control_cmd(t: &Tunnel, op: &str) -> Cmd {
    Ssh::control_cmd(&t.socket, op)
}

/// Starts the kubelet forward unless it runs; returns whether it was started.
pub async fn ensure_tunnel(r: &dyn Runner, ssh: &Ssh, t: &Tunnel) -> anyhow::Result<bool> {
    ssh.ensure_forward(r, &t.socket, &t.bind, t.port, KUBELET_PORT)
        .await
        .map_err(|e| anyhow::anyhow!("the kubelet forward ({}:{}): {e}", t.bind, t.port))
}

/// `down`'s cluster part: stops the kubelet forward (the recorded one, or one whose socket is
/// in `<work>/cluster`), deletes the kind cluster `up` recorded
/// (or, without a record, one named [`CLUSTER_NAME`] that kind lists, as an interrupted `up`
/// may leave) and removes `<work>/cluster`. Nothing to do without kind.
pub async fn down(r: &dyn Runner, work: &Path, provider: Option<&str>) -> anyhow::Result<()> {
    let recorded = load(work).ok().and_then(|a| a.info().cloned());
    let dir = cluster_dir(work);
    // An `up` that failed before recording its cluster may have started the forward.
    let tunnel = match &recorded {
        Some(info) => Some(info.tunnel.clone()),
        None => dir.join(TUNNEL_SOCKET).exists().then(|| Tunnel {
            socket: dir.join(TUNNEL_SOCKET),
            bind: String::new(),
            port: 0,
        }),
    };
    if let Some(t) = &tunnel {
        let _ = r.output(&control_cmd(t, "exit")).await;
    }
    // An existing cluster's `up` that failed before recording may have started the controller.
    let pidfile = dir.join("controller.pid");
    if recorded.is_none() && pidfile.exists() {
        let _ = r
            .output(&existing::LocalController::at(&dir, 0).stop_cmd())
            .await;
    }
    if let Some(info) = &recorded
        && let Provider::Existing { controller } = &info.provider
    {
        existing::down(r, info, controller).await?;
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if r.which("kind").is_some() {
        let engine = match &recorded {
            Some(ClusterInfo {
                provider: Provider::Kind { engine },
                ..
            }) => Some(*engine),
            _ => Engine::choose(r, provider).ok(),
        };
        if let Some(engine) = engine {
            delete_cluster(r, engine, &dir.join("kubeconfig"))
                .await
                .map_err(|e| anyhow::anyhow!("delete the kind cluster {CLUSTER_NAME}: {e:#}"))?;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
