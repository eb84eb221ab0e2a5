//! The cluster check groups, against the kind cluster `up --cluster` made and the VM that
//! joined it. Each starts from a joined node and leaves one, as the host groups do.
//!
//! - `node-join`: the Node is Ready; the daemon got its own client certificate (the
//!   controller's CSR approver approved it); the active machine runs; a probe pod runs on the
//!   node and `kubectl logs` reaches it.
//! - `repave`: the machine's settings version (its eTag) changes in the controller's store and
//!   the Node is deleted; the daemon starts the other machine with the new settings, a new Node
//!   is Ready, the old machine is removed with its bpffs mount, and a pod runs.
//! - `machine-operations`: a NodeReboot MachineOperation finishes Complete, the machine
//!   restarted and the node is Ready again, and again after a VM reboot (from the new boot); an
//!   AgentReset finishes Complete, after which no
//!   machine, bpffs mount, config, state or agent unit is left; the bootstrap unit with a fresh
//!   config joins the node again.
//!
//! Every wait looks each second and, on timeout, names what it waited for and what it saw
//! last ([`poll`]). The checks follow the active machine in the daemon's state rather than
//! assume `kube1`. Commands go through a [`Runner`] (tests drive them with a recording fake).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use flex_host::secret::Secret;
use futures::future::BoxFuture;

use crate::check::{Ctx, Group, HostMode, Needs, check, secs};
use crate::cluster::kube::{GUEST_TIMEOUT, Guest, Kubectl, Pace, Seen, poll};
use crate::cluster::{Availability, ClusterInfo, parse, render};
use crate::guest_json::{self, AgentConfig};
use crate::report::{Checked, Outcome};

const NODE_READY_TIMEOUT: Duration = Duration::from_secs(600);
const CERT_TIMEOUT: Duration = Duration::from_secs(180);
const POD_TIMEOUT: Duration = Duration::from_secs(600);
const LOGS_TIMEOUT: Duration = Duration::from_secs(120);
const GONE_TIMEOUT: Duration = Duration::from_secs(90);
const REPAVE_TIMEOUT: Duration = Duration::from_secs(1500);
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(300);
const OPERATION_TIMEOUT: Duration = Duration::from_secs(900);
const RESTART_TIMEOUT: Duration = Duration::from_secs(300);
const RESET_TIMEOUT: Duration = Duration::from_secs(300);
const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(1800);
const AGENT_TIMEOUT: Duration = Duration::from_secs(300);

/// The daemon's state on the host.
pub use crate::guest_json::DAEMON_STATE;
/// The daemon's client certificate, once the CSR approver approved it.
pub const DAEMON_CERT: &str = "/etc/aks-flex-node/daemon-credentials/client-current.pem";
/// The label the re-bootstrap after AgentReset adds to the bootstrap inputs (a fresh config).
pub const REJOIN_LABEL: &str = "harness/rejoined-after-agentreset=true";

/// What a repave's first check leaves for the later ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RepaveMemo {
    /// The machine that was active before.
    pub old_machine: String,
    /// The Node's uid before.
    pub old_uid: String,
    /// The new settings version.
    pub settings_version: String,
}

static REPAVE_MEMO: Mutex<Option<RepaveMemo>> = Mutex::new(None);

/// What the checks work with.
pub struct Env<'a> {
    /// The cluster's kubectl.
    pub kubectl: Kubectl<'a>,
    /// The VM.
    pub guest: Guest<'a>,
    /// The cluster.
    pub info: &'a ClusterInfo,
    /// The bootstrap inputs `up` wrote (they hold the token).
    pub bootstrap_env: &'a str,
    /// How the waits look.
    pub pace: Pace,
    /// Makes names unique (`aks-flex-probe-<stamp>`).
    pub stamp: u64,
    /// Between the repave's checks.
    pub memo: &'a Mutex<Option<RepaveMemo>>,
    /// The agent image `up` installed (pinned), as the guest pulls it.
    pub agent_image: &'a str,
    /// The local registry, if `up` started one.
    pub registry: Option<&'a crate::registry::Registry>,
    /// `up`'s work directory.
    pub work: &'a std::path::Path,
}

impl<'a> Env<'a> {
    /// The environment of a real run, for `info` (see [`cluster_of`]), through `c`'s runner.
    pub fn new(c: &'a Ctx<'a>, info: &'a ClusterInfo) -> Self {
        Self {
            kubectl: Kubectl::new(c.runner, &info.kubeconfig),
            guest: c.guest(),
            info,
            bootstrap_env: c.state.bootstrap_env.as_deref().unwrap_or_default(),
            pace: Pace::REAL,
            stamp: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default(),
            memo: &REPAVE_MEMO,
            agent_image: &c.state.agent_image,
            registry: c.state.registry.as_ref(),
            work: &c.state.work,
        }
    }

    pub(super) fn node(&self) -> &str {
        &self.info.node_name
    }

    fn memo(&self) -> Option<RepaveMemo> {
        self.memo.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_memo(&self, m: RepaveMemo) {
        *self.memo.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
    }
}

/// The cluster `up` recorded beside the VM's state; an error (the skip reason) without one.
pub fn cluster_of(c: &Ctx<'_>) -> anyhow::Result<ClusterInfo> {
    match crate::cluster::load(&c.state.work)? {
        Availability::Ready(info) => Ok(*info),
        a => Err(anyhow::anyhow!("{}", a.skip_reason())),
    }
}

/// A cluster check: runs against the [`Env`] of a real run.
pub type EnvCheck = for<'e> fn(&'e Env<'e>) -> BoxFuture<'e, anyhow::Result<Checked>>;

/// Runs the cluster check `f` against the environment of `c`'s cluster (the `via` of every
/// cluster group's [`check!`]).
pub async fn in_cluster(c: &Ctx<'_>, f: EnvCheck) -> anyhow::Result<Checked> {
    let info = cluster_of(c)?;
    let env = Env::new(c, &info);
    f(&env).await
}

/// The `node-join` group.
pub const NODE_JOIN: Group = Group {
    name: "node-join",
    description: "the node joins the cluster and is Ready, the daemon's CSR is approved, the active machine runs, a pod runs on it and kubectl logs reaches it",
    needs: Needs::Cluster,
    checks: &[
        check!("the Node is Ready", node_ready, via in_cluster),
        check!(
            "the daemon got its client certificate (the controller's CSR approver)",
            daemon_certificate,
            via in_cluster
        ),
        check!(
            "the active machine runs",
            active_machine_runs,
            via in_cluster
        ),
        check!(
            "the Node shows the agent Done on the active machine (condition and annotations)",
            node_shows_agent_done,
            via in_cluster
        ),
        check!(
            "a probe pod runs on the node and kubectl logs reaches it",
            probe_pod_runs,
            via in_cluster
        ),
    ],
    in_host_mode: HostMode::Same,
};

/// The `repave` group.
pub const REPAVE: Group = Group {
    name: "repave",
    description: "a new settings version (eTag) and a deleted Node move the node to the other machine: a new Ready Node, the old machine and its bpffs mount removed, a pod runs",
    needs: Needs::Cluster,
    checks: &[
        check!(
            "a new settings version and a deleted Node start the other machine",
            repave_starts_other_machine,
            via in_cluster
        ),
        check!("a new Node is Ready", new_node_ready, via in_cluster),
        check!(
            "the new Node shows the agent Done on the new machine and goal",
            node_shows_agent_done,
            via in_cluster
        ),
        check!(
            "the old machine is removed with its bpffs mount",
            old_machine_removed,
            via in_cluster
        ),
        check!(
            "a pod runs on the repaved node",
            probe_pod_runs,
            via in_cluster
        ),
    ],
    in_host_mode: HostMode::Same,
};

/// The `machine-operations` group.
pub const MACHINE_OPERATIONS: Group = Group {
    name: "machine-operations",
    description: "NodeReboot and AgentReset MachineOperations through the API finish Complete; the node is Ready after the reboot and after a VM reboot, and joins again after the reset and a fresh bootstrap",
    needs: Needs::Cluster,
    checks: &[
        check!(
            "a NodeReboot MachineOperation completes and the machine restarts",
            node_reboot,
            via in_cluster
        ),
        check!("the node is Ready again", node_ready, via in_cluster),
        check!(
            "after a VM reboot the Node is Ready again, posted from the new boot",
            ready_after_vm_reboot,
            via in_cluster
        ),
        check!(
            "an AgentReset MachineOperation completes",
            agent_reset,
            via in_cluster
        ),
        check!(
            "AgentReset leaves no machine, bpffs mount, config, state or agent unit",
            agent_reset_leaves_nothing,
            via in_cluster
        ),
        check!(
            "the bootstrap unit with a fresh config joins the node again",
            rejoin_after_reset,
            via in_cluster
        ),
    ],
    in_host_mode: HostMode::Same,
};

/// Waits for the Node to be Ready (and, with `other_than`, to be a Node with another uid).
pub(super) async fn wait_node_ready(
    e: &Env<'_>,
    other_than: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<parse::NodeView> {
    let node = e.node();
    let what = match other_than {
        Some(uid) => format!("a new Node {node} (not uid {uid}) to be Ready"),
        None => format!("Node {node} to be Ready"),
    };
    poll(&what, timeout, e.pace, || async move {
        let json = e.kubectl.get_json(&["node", node]).await?;
        Ok(match parse::node(&json)? {
            None => Seen::Not("no Node".into()),
            Some(n) if other_than.is_some_and(|u| u == n.uid) => {
                Seen::Not(format!("the old Node: {n}"))
            }
            Some(n) if n.ready => Seen::Done(n),
            Some(n) => Seen::Not(n.to_string()),
        })
    })
    .await
}

async fn node_ready(e: &Env<'_>) -> anyhow::Result<Checked> {
    let t = Instant::now();
    let n = wait_node_ready(e, None, NODE_READY_TIMEOUT).await?;
    Ok(Checked::passed_with(format!(
        "kubelet {}, Ready after {}",
        n.kubelet_version,
        secs(t.elapsed())
    )))
}

async fn daemon_certificate(e: &Env<'_>) -> anyhow::Result<Checked> {
    let g = e.guest;
    poll(
        &format!("the daemon's client certificate {DAEMON_CERT}"),
        CERT_TIMEOUT,
        e.pace,
        || async move {
            let o = g
                .output(
                    &format!("test -s {DAEMON_CERT} && echo present"),
                    GUEST_TIMEOUT,
                )
                .await?;
            Ok(if o.stdout.contains("present") {
                Seen::Done(())
            } else {
                Seen::Not("not there".into())
            })
        },
    )
    .await?;
    Ok(Checked::from(Outcome::Passed))
}

async fn daemon_state(g: Guest<'_>) -> anyhow::Result<parse::DaemonStateView> {
    let text = g
        .sh(&format!("cat {DAEMON_STATE} 2>/dev/null; true"))
        .await?;
    parse::daemon_state(&text)?.ok_or_else(|| anyhow::anyhow!("no {DAEMON_STATE}"))
}

async fn machine_prop(g: Guest<'_>, m: &str, prop: &str) -> anyhow::Result<String> {
    g.sh(&format!(
        "machinectl show {m} -p {prop} --value 2>/dev/null; true"
    ))
    .await
}

async fn active_machine_runs(e: &Env<'_>) -> anyhow::Result<Checked> {
    let m = daemon_state(e.guest).await?.active_machine;
    if m.is_empty() {
        anyhow::bail!("no activeMachine in {DAEMON_STATE}");
    }
    let state = machine_prop(e.guest, &m, "State").await?;
    if state != "running" {
        anyhow::bail!("the active machine {m} is {state:?}, not running");
    }
    Ok(Checked::passed_with(m))
}

/// The daemon's state on its Node ([`flex_api::node_state`]): the condition `True`
/// (Done) and the annotations naming the active machine and goal version the daemon state
/// holds.
async fn node_shows_agent_done(e: &Env<'_>) -> anyhow::Result<Checked> {
    let want = daemon_state(e.guest).await?;
    let node = e.node();
    let want = &want;
    let a = poll(
        &format!(
            "the agent Done on Node {node} with machine {}",
            want.active_machine
        ),
        NODE_READY_TIMEOUT,
        e.pace,
        || async move {
            let json = e.kubectl.get_json(&["node", node]).await?;
            Ok(match parse::node(&json)? {
                None => Seen::Not("no Node".into()),
                Some(n)
                    if n.agent.status == "True"
                        && n.agent.state == "Done"
                        && n.agent.active_machine == want.active_machine
                        && n.agent.goal_version == want.applied_settings_version =>
                {
                    Seen::Done(n.agent)
                }
                Some(n) => Seen::Not(n.agent.to_string()),
            })
        },
    )
    .await?;
    Ok(Checked::passed_with(a.to_string()))
}

async fn probe_pod_runs(e: &Env<'_>) -> anyhow::Result<Checked> {
    let node = e.node();
    let name = format!("aks-flex-probe-{}", e.stamp);
    let k = e.kubectl;
    let t = Instant::now();
    k.apply(&render::probe_pod(&name, node)).await?;
    let pod = name.as_str();
    poll(
        &format!("pod {pod} to run on {node}"),
        POD_TIMEOUT,
        e.pace,
        || async move {
            let json = k.get_json(&["-n", "default", "pod", pod]).await?;
            Ok(match parse::pod(&json)? {
                None => Seen::Not("no pod".into()),
                Some(p) if p.phase == "Failed" || p.phase == "Succeeded" => {
                    Seen::Fail(format!("the pod ended: {p}"))
                }
                Some(p) if p.running && p.node == node => Seen::Done(()),
                Some(p) => Seen::Not(p.to_string()),
            })
        },
    )
    .await?;
    let running = t.elapsed();
    poll(
        &format!("kubectl logs to reach pod {pod}"),
        LOGS_TIMEOUT,
        e.pace,
        || async move {
            Ok(match k.run(["-n", "default", "logs", pod]).await {
                Ok(out) if out.contains(render::PROBE_MARKER) => Seen::Done(()),
                Ok(out) => Seen::Not(format!("logs {:?}", out.trim())),
                Err(err) => Seen::Not(crate::cluster::summary(&format!("{err:#}"))),
            })
        },
    )
    .await?;
    k.run_t(
        [
            "-n",
            "default",
            "delete",
            "pod",
            pod,
            "--ignore-not-found",
            "--wait=false",
        ],
        Duration::from_secs(60),
    )
    .await?;
    let deleting = Instant::now();
    poll(
        &format!("pod {pod} to be deleted"),
        GONE_TIMEOUT,
        e.pace,
        || async move {
            let json = k.get_json(&["-n", "default", "pod", pod]).await?;
            Ok(match parse::pod(&json)? {
                None => Seen::Done(()),
                Some(p) => Seen::Not(p.to_string()),
            })
        },
    )
    .await?;
    Ok(Checked::passed_with(format!(
        "running after {}, logs reached, deleted in {}",
        secs(running),
        secs(deleting.elapsed())
    )))
}

async fn repave_starts_other_machine(e: &Env<'_>) -> anyhow::Result<Checked> {
    let node = e.node();
    let before = wait_node_ready(e, None, NODE_READY_TIMEOUT).await?;
    let old = daemon_state(e.guest).await?;
    if old.active_machine.is_empty() {
        anyhow::bail!("no activeMachine in {DAEMON_STATE}");
    }
    let version = format!("harness-{}", e.stamp);
    let entry =
        render::machine_entry(node, &e.info.kubernetes_version, &version, &e.info.token_id)?;
    e.kubectl
        .apply(&render::machines_config_map(node, &entry))
        .await?;
    e.set_memo(RepaveMemo {
        old_machine: old.active_machine.clone(),
        old_uid: before.uid.clone(),
        settings_version: version.clone(),
    });
    e.kubectl
        .run_t(
            ["delete", "node", node, "--wait=true", "--timeout=60s"],
            Duration::from_secs(90),
        )
        .await?;
    let t = Instant::now();
    let g = e.guest;
    let (old_m, want) = (old.active_machine.as_str(), version.as_str());
    let new = poll(
        &format!(
            "the daemon to switch from {old_m} to the other machine with settings version {want}"
        ),
        REPAVE_TIMEOUT,
        e.pace,
        || async move {
            let s = daemon_state(g).await?;
            if s.active_machine == old_m || s.applied_settings_version != want {
                return Ok(Seen::Not(format!(
                    "active {} with settings version {:?}",
                    s.active_machine, s.applied_settings_version
                )));
            }
            let state = machine_prop(g, &s.active_machine, "State").await?;
            Ok(if state == "running" {
                Seen::Done(s.active_machine)
            } else {
                Seen::Not(format!("{} is {state:?}", s.active_machine))
            })
        },
    )
    .await?;
    Ok(Checked::passed_with(format!(
        "{old_m} → {new} with settings version {want} in {}",
        secs(t.elapsed())
    )))
}

fn other_machine(m: &str) -> &'static str {
    if m == "kube1" { "kube2" } else { "kube1" }
}

async fn repave_memo(e: &Env<'_>) -> anyhow::Result<RepaveMemo> {
    match e.memo() {
        Some(m) => Ok(m),
        None => {
            let active = daemon_state(e.guest).await?.active_machine;
            Ok(RepaveMemo {
                old_machine: other_machine(&active).into(),
                ..Default::default()
            })
        }
    }
}

async fn new_node_ready(e: &Env<'_>) -> anyhow::Result<Checked> {
    let memo = repave_memo(e).await?;
    let t = Instant::now();
    let old_uid = (!memo.old_uid.is_empty()).then_some(memo.old_uid.as_str());
    let n = wait_node_ready(e, old_uid, NODE_READY_TIMEOUT).await?;
    Ok(Checked::passed_with(format!(
        "uid {}, Ready after {}",
        n.uid,
        secs(t.elapsed())
    )))
}

/// The script that lists what is left of machine `m` on the host (nothing when it is gone).
pub fn machine_leftovers_script(m: &str) -> String {
    format!(
        "machinectl show {m} >/dev/null 2>&1 && echo 'machine {m} registered'; \
         test -e /var/lib/machines/{m} && echo '/var/lib/machines/{m}'; \
         grep -qs ' /run/bpffs/{m} ' /proc/mounts && echo 'bpffs mount /run/bpffs/{m}'; true"
    )
}

async fn old_machine_removed(e: &Env<'_>) -> anyhow::Result<Checked> {
    let memo = repave_memo(e).await?;
    let m = memo.old_machine.as_str();
    let g = e.guest;
    let script = machine_leftovers_script(m);
    let s = script.as_str();
    poll(
        &format!("the old machine {m} and its bpffs mount to be removed"),
        CLEANUP_TIMEOUT,
        e.pace,
        || async move {
            let left = g.sh(s).await?;
            Ok(if left.is_empty() {
                Seen::Done(())
            } else {
                Seen::Not(left.replace('\n', ", "))
            })
        },
    )
    .await?;
    Ok(Checked::passed_with(format!("{m} removed")))
}

/// Requests a MachineOperation of `kind` for the node and waits for it to finish Complete
/// (a Failed one fails at once with its reason); deletes it afterwards.
async fn run_operation(
    e: &Env<'_>,
    kind: &str,
) -> anyhow::Result<(parse::OperationView, Duration)> {
    run_operation_with(e, kind, &[]).await
}

/// Applies a MachineOperation of `kind` with `parameters` for this node, polls it each second
/// until it is `Complete` (a `Failed` one fails at once, with its reason), and deletes it.
pub(super) async fn run_operation_with(
    e: &Env<'_>,
    kind: &str,
    parameters: &[(&str, &str)],
) -> anyhow::Result<(parse::OperationView, Duration)> {
    let name = format!("harness-{}-{}", kind.to_ascii_lowercase(), e.stamp);
    let k = e.kubectl;
    k.apply(&render::machine_operation(
        &name,
        kind,
        e.node(),
        parameters,
    ))
    .await?;
    let t = Instant::now();
    let op = name.as_str();
    let done = poll(
        &format!("{kind} MachineOperation {op} to finish Complete"),
        OPERATION_TIMEOUT,
        e.pace,
        || async move {
            let json = k.get_json(&["machineoperation", op]).await?;
            Ok(match parse::operation(&json)? {
                None => Seen::Fail("it is gone".into()),
                Some(v) if v.phase == "Complete" => Seen::Done(v),
                Some(v) if v.phase == "Failed" => Seen::Fail(v.to_string()),
                Some(v) => Seen::Not(v.to_string()),
            })
        },
    )
    .await?;
    let took = t.elapsed();
    k.run([
        "delete",
        "machineoperation",
        op,
        "--ignore-not-found",
        "--wait=false",
    ])
    .await?;
    Ok((done, took))
}

async fn node_reboot(e: &Env<'_>) -> anyhow::Result<Checked> {
    wait_node_ready(e, None, NODE_READY_TIMEOUT).await?;
    let m = daemon_state(e.guest).await?.active_machine;
    if m.is_empty() {
        anyhow::bail!("no activeMachine in {DAEMON_STATE}");
    }
    let leader = machine_prop(e.guest, &m, "Leader").await?;
    let (op, took) = run_operation(e, flex_api::machina::NODE_REBOOT).await?;
    let g = e.guest;
    let (mm, before) = (m.as_str(), leader.as_str());
    poll(
        &format!("machine {mm} to run again with a new leader (was {before})"),
        RESTART_TIMEOUT,
        e.pace,
        || async move {
            let state = machine_prop(g, mm, "State").await?;
            let now = machine_prop(g, mm, "Leader").await?;
            Ok(if state == "running" && !now.is_empty() && now != before {
                Seen::Done(())
            } else {
                Seen::Not(format!("{state:?} with leader {now:?}"))
            })
        },
    )
    .await?;
    Ok(Checked::passed_with(format!("{op} in {}", secs(took))))
}

/// How long a rebooted VM may take to answer SSH again.
const REBOOT_TIMEOUT: Duration = Duration::from_secs(600);

/// Reboots the VM and waits for the Node to be Ready with another `nodeInfo.bootID` than before:
/// kubelet reports its machine's boot id (systemd-nspawn gives each machine boot its own), so a
/// new one shows that the machine started again after the VM reboot and its kubelet posted the
/// Ready; a Ready posted before the reboot does not count.
async fn ready_after_vm_reboot(e: &Env<'_>) -> anyhow::Result<Checked> {
    let before = wait_node_ready(e, None, NODE_READY_TIMEOUT).await?.boot_id;
    let g = e.guest;
    let old = g.boot_id().await?;
    let t = Instant::now();
    // Queued, so that the command returns before the connection goes.
    let _ = g
        .output("systemctl --no-block reboot", Duration::from_secs(20))
        .await;
    g.wait_new_boot(&old, REBOOT_TIMEOUT)
        .await
        .map_err(|w| anyhow::anyhow!("{w}"))?;
    let up = t.elapsed();
    let node = e.node();
    let before = before.as_str();
    let n = poll(
        &format!("Node {node} to be Ready from a boot other than {before}"),
        NODE_READY_TIMEOUT,
        e.pace,
        || async move {
            let json = e.kubectl.get_json(&["node", node]).await?;
            Ok(match parse::node(&json)? {
                None => Seen::Not("no Node".into()),
                Some(n) if n.ready && n.boot_id != before => Seen::Done(n),
                Some(n) => Seen::Not(format!("{n} from boot {}", n.boot_id)),
            })
        },
    )
    .await?;
    Ok(Checked::passed_with(format!(
        "VM back after {}, Node Ready after {} (kubelet {})",
        secs(up),
        secs(t.elapsed()),
        n.kubelet_version
    )))
}

async fn agent_reset(e: &Env<'_>) -> anyhow::Result<Checked> {
    wait_node_ready(e, None, NODE_READY_TIMEOUT).await?;
    let (op, took) = run_operation(e, flex_api::machina::AGENT_RESET).await?;
    Ok(Checked::passed_with(format!("{op} in {}", secs(took))))
}

/// The script that lists what an AgentReset must have removed (nothing when all is gone).
pub const RESET_LEFTOVERS: &str = "for p in /etc/systemd/system/aks-flex-node-agent.service \
      /etc/systemd/system/multi-user.target.wants/aks-flex-node-agent.service \
      /var/lib/machines/kube1 /var/lib/machines/kube2; do test -e $p && echo $p; done; \
    test -d /etc/aks-flex-node && ls -A /etc/aks-flex-node | sed 's|^|/etc/aks-flex-node/|'; \
    machinectl list --no-legend 2>/dev/null | awk '{print \"machine \" $1}'; \
    grep ' /run/bpffs/' /proc/mounts | awk '{print \"bpffs mount \" $2}'; \
    systemctl is-active --quiet aks-flex-node-agent.service && echo 'aks-flex-node-agent.service active'; true";

async fn agent_reset_leaves_nothing(e: &Env<'_>) -> anyhow::Result<Checked> {
    nothing_left(e, "AgentReset").await
}

/// Waits until `what` (a reset) left no machine, bpffs mount, config, state or agent unit.
pub(super) async fn nothing_left(e: &Env<'_>, what: &str) -> anyhow::Result<Checked> {
    let g = e.guest;
    poll(
        &format!("{what} to leave no machine, bpffs mount, config, state or agent unit"),
        RESET_TIMEOUT,
        e.pace,
        || async move {
            let left = g.sh(RESET_LEFTOVERS).await?;
            Ok(if left.is_empty() {
                Seen::Done(())
            } else {
                Seen::Not(left.replace('\n', ", "))
            })
        },
    )
    .await?;
    Ok(Checked::from(Outcome::Passed))
}

/// The bootstrap inputs of the re-bootstrap: `up`'s, plus [`REJOIN_LABEL`].
pub fn rejoin_env(env: &str) -> Secret {
    let mut s = env.to_string();
    if !s.is_empty() && !s.ends_with('\n') {
        s.push('\n');
    }
    s.push_str(&format!(
        "{}={REJOIN_LABEL}\n",
        flex_api::bootstrap_env::keys::LABELS
    ));
    Secret::new(s)
}

pub(super) fn token_in(env: &str) -> Option<String> {
    flex_api::bootstrap_env::parse(env)
        .ok()?
        .into_iter()
        .rev()
        .find(|e| e.key == flex_api::bootstrap_env::keys::BOOTSTRAP_TOKEN)
        .map(|e| e.value)
}

/// Patches the controller's machine store (`kube-system/aks-flex-machines`) with `patch` of
/// `kind` (`json` or `merge`).
pub(super) async fn patch_machine_store(
    e: &Env<'_>,
    kind: &str,
    patch: &str,
) -> anyhow::Result<()> {
    e.kubectl
        .run([
            "-n",
            render::NAMESPACE,
            "patch",
            "configmap",
            render::MACHINES_CONFIG_MAP,
            &format!("--type={kind}"),
            "-p",
            patch,
        ])
        .await?;
    Ok(())
}

/// Removes `node`'s entry from the controller's machine store.
pub(super) async fn remove_machine_entry(e: &Env<'_>, node: &str) -> anyhow::Result<()> {
    let patch = format!(r#"[{{"op":"remove","path":"/data/{node}.json"}}]"#);
    patch_machine_store(e, "json", &patch).await
}

/// The administrator's re-admission of a reset node: deletes the daemon's earlier
/// CertificateSigningRequests (label `app.kubernetes.io/managed-by=aks-flex-node`). The
/// controller's approver issues no certificate through a bootstrap token to a node that holds a
/// valid one, and a reset node's certificate went with its state; without this the re-joining
/// daemon would wait for an approval that never comes (as it should, for a leaked token).
pub(super) async fn readmit(e: &Env<'_>) -> anyhow::Result<()> {
    e.kubectl
        .run([
            "delete",
            "csr",
            "-l",
            "app.kubernetes.io/managed-by=aks-flex-node",
            "--ignore-not-found",
        ])
        .await?;
    Ok(())
}

/// Writes `env` as the bootstrap inputs (on stdin: they hold the token) and, with `image`,
/// `agent-image.env` naming it; restarts the bootstrap unit; and waits until the agent's unit
/// is active with its container running (the image it runs is returned).
pub(super) async fn bootstrap_again(
    e: &Env<'_>,
    env: &Secret,
    image: Option<&str>,
) -> anyhow::Result<String> {
    let token = token_in(env.expose()).unwrap_or_default();
    let hide: Vec<&str> = token.split('.').chain([token.as_str()]).collect();
    e.guest
        .sh_stdin(
            "mkdir -p /etc/aks-flex-node && umask 077 && cat > /etc/aks-flex-node/bootstrap.env",
            env,
            &hide,
        )
        .await?;
    if let Some(image) = image {
        e.guest
            .sh(&format!(
                "printf '%s=%s\\n' AKS_FLEX_NODE_IMAGE {} > /etc/aks-flex-node/agent-image.env",
                crate::ssh::shell_quote(image)
            ))
            .await?;
    }
    e.guest
        .sh_t(
            "systemctl reset-failed aks-flex-node-agent.service aks-flex-node-bootstrap.service 2>/dev/null; \
             systemctl restart aks-flex-node-bootstrap.service",
            BOOTSTRAP_TIMEOUT,
        )
        .await?;
    wait_agent_running(e, None).await
}

/// Waits until the agent's unit is active and its container runs (`want`: that image);
/// returns the image it runs.
pub(super) async fn wait_agent_running(e: &Env<'_>, want: Option<&str>) -> anyhow::Result<String> {
    let g = e.guest;
    let what = match want {
        Some(image) => format!("the agent to run {image}"),
        None => "aks-flex-node-agent.service active with its container running".into(),
    };
    poll(&what, AGENT_TIMEOUT, e.pace, || async move {
        let p = crate::kit::upgrade_status::parse_probe(
            &g.output(&crate::kit::upgrade_status::probe_script(), GUEST_TIMEOUT)
                .await?
                .stdout,
        );
        Ok(match p.image {
            Some(i) if p.running() && want.is_none_or(|w| w == i) => Seen::Done(i),
            i => Seen::Not(format!(
                "unit {}, task {:?}, image {}",
                p.active,
                p.task,
                i.as_deref().unwrap_or("none")
            )),
        })
    })
    .await
}

async fn rejoin_after_reset(e: &Env<'_>) -> anyhow::Result<Checked> {
    if e.bootstrap_env.is_empty() {
        anyhow::bail!("up recorded no bootstrap inputs");
    }
    readmit(e).await?;
    let t = Instant::now();
    bootstrap_again(e, &rejoin_env(e.bootstrap_env), None).await?;
    let config: AgentConfig = guest_json::parse(
        guest_json::CONFIG,
        &e.guest.sh(&format!("cat {}", guest_json::CONFIG)).await?,
    )?;
    let label = REJOIN_LABEL.split('=').next().unwrap_or_default();
    if !config.node.labels.contains_key(label) {
        anyhow::bail!(
            "the fresh config was not used: /etc/aks-flex-node/config.json lacks {label}"
        );
    }
    let n = wait_node_ready(e, None, NODE_READY_TIMEOUT).await?;
    Ok(Checked::passed_with(format!(
        "bootstrapped and Ready in {} (kubelet {})",
        secs(t.elapsed()),
        n.kubelet_version
    )))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::ssh::Ssh;
    use flex_host::runner::Output;
    use flex_testkit::FakeRunner;
    use serde_json::json;

    pub(in crate::cluster) fn info() -> ClusterInfo {
        crate::cluster::tests::info()
    }

    pub(in crate::cluster) fn ssh() -> Ssh {
        Ssh {
            port: 2222,
            key: "/w/id".into(),
        }
    }

    /// The argv prefix of a guest script starting with `start`.
    pub(in crate::cluster) fn guest(start: &str) -> String {
        let base = ssh().cmd("x", Duration::ZERO).display_argv();
        let base = base.strip_suffix(" 'x'").unwrap();
        format!("{base} \"'{start}")
    }

    pub(in crate::cluster) const KC: &str = "kubectl --kubeconfig /w/cluster/kubeconfig";

    pub(in crate::cluster) fn node_json(uid: &str, ready: &str) -> Output {
        Output::ok(
            json!({"metadata": {"uid": uid}, "status": {
                "conditions": [{"type": "Ready", "status": ready}],
                "nodeInfo": {"kubeletVersion": "v1.34.0"}}})
            .to_string(),
        )
    }

    pub(in crate::cluster) fn env<'a>(
        r: &'a FakeRunner,
        info: &'a ClusterInfo,
        ssh: &'a Ssh,
        memo: &'a Mutex<Option<RepaveMemo>>,
    ) -> Env<'a> {
        Env {
            kubectl: Kubectl::new(r, &info.kubeconfig),
            guest: Guest::new(r, ssh),
            info,
            bootstrap_env: "AKS_FLEX_NODE_BOOTSTRAP_TOKEN=abcdef.0123456789abcdef\n",
            pace: Pace {
                every: Duration::ZERO,
                scale: 1,
            },
            stamp: 7,
            memo,
            agent_image: "10.0.2.2:5000/aks-flex/agent@sha256:1",
            registry: None,
            work: std::path::Path::new("/w"),
        }
    }

    /// Drops the ssh options from a transcript, for readable snapshots.
    pub(in crate::cluster) fn readable(t: &str) -> String {
        let base = ssh().cmd("x", Duration::ZERO).display_argv();
        let base = base.strip_suffix(" 'x'").unwrap();
        t.replace(base, "guest:")
    }

    #[tokio::test]
    async fn node_join_sequence() {
        let r = FakeRunner::new();
        let (i, s, m) = (info(), ssh(), Mutex::new(None));
        let e = env(&r, &i, &s, &m);
        r.on_seq(
            &format!("{KC} get node flex-dev-node"),
            vec![
                Output::ok(""),
                node_json("u1", "False"),
                node_json("u1", "True"),
            ],
        );
        r.on(&guest("test -s"), Output::ok("present\n"));
        r.on(
            &guest("cat /etc/aks-flex-node/daemon-state.json"),
            Output::ok(r#"{"activeMachine":"kube1"}"#),
        );
        r.on(
            &guest("machinectl show kube1 -p State"),
            Output::ok("running\n"),
        );
        let pod = |phase: &str, state: serde_json::Value| {
            Output::ok(
                json!({"spec": {"nodeName": "flex-dev-node"}, "status": {"phase": phase,
                "containerStatuses": [{"state": state}]}})
                .to_string(),
            )
        };
        r.on_seq(
            &format!("{KC} get -n default pod aks-flex-probe-7"),
            vec![
                pod(
                    "Pending",
                    json!({"waiting": {"reason": "ContainerCreating"}}),
                ),
                pod("Running", json!({"running": {}})),
                pod("Running", json!({"terminated": {"reason": "Completed"}})),
                Output::ok(""),
            ],
        );
        r.on_seq(
            &format!("{KC} -n default logs aks-flex-probe-7"),
            vec![
                Output::failed(
                    1,
                    "Error from server: Get \"https://10.0.2.15:10250/...\": dial tcp: i/o timeout",
                ),
                Output::ok(format!("{}\n", render::PROBE_MARKER)),
            ],
        );
        assert!(
            node_ready(&e)
                .await
                .unwrap()
                .detail
                .unwrap()
                .starts_with("kubelet v1.34.0")
        );
        daemon_certificate(&e).await.unwrap();
        assert_eq!(
            active_machine_runs(&e).await.unwrap().detail.as_deref(),
            Some("kube1")
        );
        probe_pod_runs(&e).await.unwrap();
        insta::assert_snapshot!(readable(&r.transcript()));
    }

    #[tokio::test]
    async fn an_unscheduled_pod_times_out_naming_what_it_saw() {
        let r = FakeRunner::new();
        let (i, s, m) = (info(), ssh(), Mutex::new(None));
        let mut e = env(&r, &i, &s, &m);
        e.pace = Pace::INSTANT;
        r.on(
            &format!("{KC} get -n default pod aks-flex-probe-7"),
            Output::ok(json!({"spec": {"nodeName": "flex-dev-node"}, "status": {"phase": "Pending",
                "containerStatuses": [{"state": {"waiting": {"reason": "ErrImagePull", "message": "dial tcp: no route"}}}]}}).to_string()),
        );
        let err = probe_pod_runs(&e).await.unwrap_err().to_string();
        assert_eq!(
            err,
            "timed out after 0s (1 looks) waiting for pod aks-flex-probe-7 to run on flex-dev-node; last seen: phase Pending on flex-dev-node (waiting ErrImagePull: dial tcp: no route)"
        );
    }

    #[tokio::test]
    async fn repave_sequence() {
        let r = FakeRunner::new();
        let (i, s, m) = (info(), ssh(), Mutex::new(None));
        let e = env(&r, &i, &s, &m);
        r.on_seq(
            &format!("{KC} get node flex-dev-node"),
            vec![
                node_json("u1", "True"),
                node_json("u1", "True"),
                Output::ok(""),
                node_json("u2", "False"),
                node_json("u2", "True"),
            ],
        );
        r.on_seq(
            &guest("cat /etc/aks-flex-node/daemon-state.json"),
            vec![
                Output::ok(r#"{"activeMachine":"kube1","appliedSettingsVersion":"harness-1"}"#),
                Output::ok(r#"{"activeMachine":"kube1","appliedSettingsVersion":"harness-1"}"#),
                Output::ok(r#"{"activeMachine":"kube2","appliedSettingsVersion":"harness-7"}"#),
            ],
        );
        r.on_seq(
            &guest("machinectl show kube2 -p State"),
            vec![Output::ok("starting\n"), Output::ok("running\n")],
        );
        r.on_seq(
            &guest("machinectl show kube1 >/dev/null"),
            vec![
                Output::ok("/var/lib/machines/kube1\nbpffs mount /run/bpffs/kube1\n"),
                Output::ok(""),
            ],
        );
        let d = repave_starts_other_machine(&e)
            .await
            .unwrap()
            .detail
            .unwrap();
        assert!(
            d.starts_with("kube1 → kube2 with settings version harness-7"),
            "{d}"
        );
        assert_eq!(
            e.memo(),
            Some(RepaveMemo {
                old_machine: "kube1".into(),
                old_uid: "u1".into(),
                settings_version: "harness-7".into()
            })
        );
        assert!(
            new_node_ready(&e)
                .await
                .unwrap()
                .detail
                .unwrap()
                .starts_with("uid u2")
        );
        old_machine_removed(&e).await.unwrap();
        let t = readable(&r.transcript());
        // The eTag changes before the Node goes: the other order would reset the node.
        let apply = t.find(&format!("{KC} apply -f -")).unwrap();
        let delete = t.find(&format!("{KC} delete node flex-dev-node")).unwrap();
        assert!(apply < delete, "{t}");
        insta::assert_snapshot!(t);
    }

    #[tokio::test]
    async fn operations_sequence_and_a_failed_operation() {
        let r = FakeRunner::new();
        let (i, s, m) = (info(), ssh(), Mutex::new(None));
        let e = env(&r, &i, &s, &m);
        r.on(
            &format!("{KC} get node flex-dev-node"),
            node_json("u1", "True"),
        );
        r.on(
            &guest("cat /etc/aks-flex-node/daemon-state.json"),
            Output::ok(r#"{"activeMachine":"kube2"}"#),
        );
        r.on(
            &guest("machinectl show kube2 -p State"),
            Output::ok("running\n"),
        );
        r.on_seq(
            &guest("machinectl show kube2 -p Leader"),
            vec![
                Output::ok("100\n"),
                Output::ok("100\n"),
                Output::ok("200\n"),
            ],
        );
        let op = |status: serde_json::Value| Output::ok(json!({"status": status}).to_string());
        r.on_seq(
            &format!("{KC} get machineoperation harness-nodereboot-7"),
            vec![
                op(json!({})),
                op(json!({"phase": "InProgress"})),
                op(json!({"phase": "Complete", "reason": "Succeeded"})),
            ],
        );
        let d = node_reboot(&e).await.unwrap().detail.unwrap();
        assert!(d.starts_with("phase Complete, reason Succeeded in "), "{d}");

        r.on(
            &format!("{KC} get machineoperation harness-agentreset-7"),
            op(json!({"phase": "Complete", "reason": "Succeeded"})),
        );
        agent_reset(&e).await.unwrap();
        r.on_seq(
            &guest("for p in"),
            vec![
                Output::ok("/etc/aks-flex-node/config.json\nmachine kube2\n"),
                Output::ok("\n"),
            ],
        );
        agent_reset_leaves_nothing(&e).await.unwrap();
        r.on(
            &ssh()
                .cmd(&crate::kit::upgrade_status::probe_script(), Duration::ZERO)
                .display_argv(),
            Output::ok(
                "active=active\ntask=RUNNING\n---info\n{\"ID\":\"aks-flex-agent\",\"Image\":\"10.0.2.2:5000/aks-flex/agent@sha256:1\"}\n---status\n",
            ),
        );
        r.on(
            &guest("cat /etc/aks-flex-node/config.json"),
            Output::ok(r#"{"node":{"labels":{"harness/rejoined-after-agentreset":"true"}}}"#),
        );
        rejoin_after_reset(&e).await.unwrap();
        let t = readable(&r.transcript());
        assert!(
            !t.contains("0123456789abcdef"),
            "the token went into an argument:\n{t}"
        );
        insta::assert_snapshot!(t);

        r.on(
            &format!("{KC} get machineoperation harness-nodereboot-7"),
            op(json!({"phase": "Failed", "reason": "HandlerFailed", "message": "machinectl poweroff: timeout"})),
        );
        let err = node_reboot(&e).await.unwrap_err().to_string();
        assert_eq!(
            err,
            "NodeReboot MachineOperation harness-nodereboot-7 to finish Complete: phase Failed, reason HandlerFailed: machinectl poweroff: timeout"
        );
    }

    #[test]
    fn the_rejoin_env_adds_a_label_to_ups_inputs() {
        let env = rejoin_env("AKS_FLEX_NODE_NODE_NAME=n");
        let entries = flex_api::bootstrap_env::parse(env.expose()).unwrap();
        assert_eq!(entries.last().unwrap().value, REJOIN_LABEL);
        assert_eq!(
            token_in("AKS_FLEX_NODE_BOOTSTRAP_TOKEN='abcdef.0123456789abcdef'\n").as_deref(),
            Some("abcdef.0123456789abcdef")
        );
    }

    #[test]
    fn every_cluster_group_needs_the_cluster() {
        for g in [NODE_JOIN, REPAVE, MACHINE_OPERATIONS] {
            assert_eq!(g.needs, Needs::Cluster, "{}", g.name);
            assert!(!g.checks.is_empty(), "{}", g.name);
        }
    }
}
