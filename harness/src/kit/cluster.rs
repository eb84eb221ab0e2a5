//! What the cluster groups share, against the cluster `up --cluster` made and the VM that
//! joined it: the environment a cluster check runs against ([`Env`], made by [`in_cluster`], the
//! `via` of every cluster check), the checks two groups run (the Node Ready, the agent Done on
//! the Node, a probe pod), and the steps more than one group takes (a MachineOperation run to
//! Complete, nothing left after a reset, the re-bootstrap, the controller's machine store, the
//! re-admission of a reset node).
//!
//! Every wait looks each second and, on timeout, names what it waited for and what it saw
//! last ([`poll`]). The checks follow the active machine in the daemon's state rather than
//! assume `kube1`. Commands go through a `Runner` (tests drive them with a recording fake).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use flex_host::secret::Secret;
use futures::future::BoxFuture;

use crate::check::{Ctx, secs};
use crate::cluster::kube::{GUEST_TIMEOUT, Guest, Kubectl, Pace, Seen, poll};
use crate::cluster::{Availability, ClusterInfo, parse, render};
use crate::report::{Checked, Outcome};

/// How long a Node may take to be Ready.
pub const NODE_READY_TIMEOUT: Duration = Duration::from_secs(600);
const POD_TIMEOUT: Duration = Duration::from_secs(600);
const LOGS_TIMEOUT: Duration = Duration::from_secs(120);
const GONE_TIMEOUT: Duration = Duration::from_secs(90);
const OPERATION_TIMEOUT: Duration = Duration::from_secs(900);
const RESET_TIMEOUT: Duration = Duration::from_secs(300);
const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(1800);
const AGENT_TIMEOUT: Duration = Duration::from_secs(300);

/// The daemon's state on the host.
pub use crate::guest_json::DAEMON_STATE;

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

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.info.node_name
    }

    /// What the repave's first check left, if it ran.
    pub fn memo(&self) -> Option<RepaveMemo> {
        self.memo.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Leaves `m` for the repave's later checks.
    pub fn set_memo(&self, m: RepaveMemo) {
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
/// cluster group's `check!`).
pub async fn in_cluster(c: &Ctx<'_>, f: EnvCheck) -> anyhow::Result<Checked> {
    let info = cluster_of(c)?;
    let env = Env::new(c, &info);
    f(&env).await
}

/// Waits for the Node to be Ready (and, with `other_than`, to be a Node with another uid).
pub async fn wait_node_ready(
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

/// The Node is Ready: the kubelet's version and how long it took.
pub async fn node_ready(e: &Env<'_>) -> anyhow::Result<Checked> {
    let t = Instant::now();
    let n = wait_node_ready(e, None, NODE_READY_TIMEOUT).await?;
    Ok(Checked::passed_with(format!(
        "kubelet {}, Ready after {}",
        n.kubelet_version,
        secs(t.elapsed())
    )))
}

/// The daemon's state on the host, as the guest shows it.
pub async fn daemon_state(g: Guest<'_>) -> anyhow::Result<parse::DaemonStateView> {
    let text = g
        .sh(&format!("cat {DAEMON_STATE} 2>/dev/null; true"))
        .await?;
    parse::daemon_state(&text)?.ok_or_else(|| anyhow::anyhow!("no {DAEMON_STATE}"))
}

/// Property `prop` of machine `m` (`machinectl show`; empty when there is no such machine).
pub async fn machine_prop(g: Guest<'_>, m: &str, prop: &str) -> anyhow::Result<String> {
    g.sh(&format!(
        "machinectl show {m} -p {prop} --value 2>/dev/null; true"
    ))
    .await
}

/// The daemon's state on its Node ([`flex_api::node_state`]): the condition `True`
/// (Done) and the annotations naming the active machine and goal version the daemon state
/// holds.
pub async fn node_shows_agent_done(e: &Env<'_>) -> anyhow::Result<Checked> {
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

/// A probe pod runs on the node, `kubectl logs` reaches it, and it is deleted.
pub async fn probe_pod_runs(e: &Env<'_>) -> anyhow::Result<Checked> {
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

/// Applies a MachineOperation of `kind` with `parameters` for this node, polls it each second
/// until it is `Complete` (a `Failed` one fails at once, with its reason), and deletes it.
pub async fn run_operation_with(
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

/// The script that lists what an AgentReset must have removed (nothing when all is gone).
pub const RESET_LEFTOVERS: &str = "for p in /etc/systemd/system/aks-flex-node-agent.service \
      /etc/systemd/system/multi-user.target.wants/aks-flex-node-agent.service \
      /var/lib/machines/kube1 /var/lib/machines/kube2; do test -e $p && echo $p; done; \
    test -d /etc/aks-flex-node && ls -A /etc/aks-flex-node | sed 's|^|/etc/aks-flex-node/|'; \
    machinectl list --no-legend 2>/dev/null | awk '{print \"machine \" $1}'; \
    grep ' /run/bpffs/' /proc/mounts | awk '{print \"bpffs mount \" $2}'; \
    systemctl is-active --quiet aks-flex-node-agent.service && echo 'aks-flex-node-agent.service active'; true";

/// Waits until `what` (a reset) left no machine, bpffs mount, config, state or agent unit.
pub async fn nothing_left(e: &Env<'_>, what: &str) -> anyhow::Result<Checked> {
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

/// The bootstrap token in the bootstrap inputs `env`, if any.
pub fn token_in(env: &str) -> Option<String> {
    flex_api::bootstrap_env::parse(env)
        .ok()?
        .into_iter()
        .rev()
        .find(|e| e.key == flex_api::bootstrap_env::keys::BOOTSTRAP_TOKEN)
        .map(|e| e.value)
}

/// Patches the controller's machine store (`kube-system/aks-flex-machines`) with `patch` of
/// `kind` (`json` or `merge`).
pub async fn patch_machine_store(e: &Env<'_>, kind: &str, patch: &str) -> anyhow::Result<()> {
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
pub async fn remove_machine_entry(e: &Env<'_>, node: &str) -> anyhow::Result<()> {
    let patch = format!(r#"[{{"op":"remove","path":"/data/{node}.json"}}]"#);
    patch_machine_store(e, "json", &patch).await
}

/// The administrator's re-admission of a reset node that bootstraps again with its token:
/// deletes the daemon's earlier CertificateSigningRequests (label
/// `app.kubernetes.io/managed-by=aks-flex-node`) and empties the approver's record of the
/// tokens used (`kube-system/aks-flex-issued-tokens`; the harness's cluster has one node). The
/// approver issues no certificate through a bootstrap token to a node that holds a valid one, nor
/// through a token used before, and a reset node's certificate went with its state; without
/// this the re-joining daemon would wait for an approval that never comes (as it should, for a
/// leaked token).
pub async fn readmit(e: &Env<'_>) -> anyhow::Result<()> {
    e.kubectl
        .run([
            "delete",
            "csr",
            "-l",
            "app.kubernetes.io/managed-by=aks-flex-node",
            "--ignore-not-found",
        ])
        .await?;
    e.kubectl
        .run([
            "-n",
            "kube-system",
            "patch",
            "configmap",
            "aks-flex-issued-tokens",
            "--type",
            "merge",
            "-p",
            r#"{"data":null}"#,
        ])
        .await?;
    Ok(())
}

/// Writes `env` as the bootstrap inputs (on stdin: they hold the token) and, with `image`,
/// `agent-image.env` naming it; restarts the bootstrap unit; and waits until the agent's unit
/// is active with its container running (the image it runs is returned).
pub async fn bootstrap_again(
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
    super::agent::write_registry_credentials(&e.guest, e.registry).await?;
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
pub async fn wait_agent_running(e: &Env<'_>, want: Option<&str>) -> anyhow::Result<String> {
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

#[cfg(test)]
pub(crate) mod testing {
    //! The cluster checks' fakes: a cluster, the guest's ssh, an [`Env`] over a recording
    //! runner, and the transcript made readable.

    use super::*;
    use crate::ssh::Ssh;
    use flex_host::runner::Output;
    use flex_testkit::FakeRunner;
    use serde_json::json;

    pub(crate) fn info() -> ClusterInfo {
        crate::cluster::tests::info()
    }

    pub(crate) fn ssh() -> Ssh {
        Ssh {
            port: 2222,
            key: "/w/id".into(),
        }
    }

    /// The argv prefix of a guest script starting with `start`.
    pub(crate) fn guest(start: &str) -> String {
        let base = ssh().cmd("x", Duration::ZERO).display_argv();
        let base = base.strip_suffix(" 'x'").unwrap();
        format!("{base} \"'{start}")
    }

    pub(crate) const KC: &str = "kubectl --kubeconfig /w/cluster/kubeconfig";

    pub(crate) fn node_json(uid: &str, ready: &str) -> Output {
        Output::ok(
            json!({"metadata": {"uid": uid}, "status": {
                "conditions": [{"type": "Ready", "status": ready}],
                "nodeInfo": {"kubeletVersion": "v1.34.0"}}})
            .to_string(),
        )
    }

    pub(crate) fn env<'a>(
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
    pub(crate) fn readable(t: &str) -> String {
        let base = ssh().cmd("x", Duration::ZERO).display_argv();
        let base = base.strip_suffix(" 'x'").unwrap();
        t.replace(base, "guest:")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use flex_host::runner::Output;
    use flex_testkit::FakeRunner;
    use serde_json::json;

    use super::testing::{KC, env, info, ssh};
    use super::*;

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
}
