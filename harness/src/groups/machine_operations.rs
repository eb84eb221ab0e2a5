//! The `machine-operations` cluster group: a NodeReboot MachineOperation finishes Complete, the
//! machine restarted and the node is Ready again, and again after a VM reboot (from the new
//! boot); an AgentReset finishes Complete, after which no machine, bpffs mount, config, state or
//! agent unit is left; the bootstrap unit with a fresh config joins the node again. It starts
//! from a joined node and leaves one.

use std::time::{Duration, Instant};

use crate::check::{Group, HostMode, Needs, check, secs};
use crate::cluster::kube::{Seen, poll};
use crate::cluster::parse;
use crate::guest_json::{self, AgentConfig};
use crate::kit::cluster::{
    DAEMON_STATE, Env, NODE_READY_TIMEOUT, bootstrap_again, daemon_state, in_cluster, machine_prop,
    node_ready, nothing_left, readmit, run_operation_with, wait_node_ready,
};
use crate::report::Checked;
use flex_host::secret::Secret;

const RESTART_TIMEOUT: Duration = Duration::from_secs(300);

/// The label the re-bootstrap after AgentReset adds to the bootstrap inputs (a fresh config).
pub const REJOIN_LABEL: &str = "harness/rejoined-after-agentreset=true";

/// The `machine-operations` group.
pub const GROUP: Group = Group {
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

/// Requests a MachineOperation of `kind` for the node and waits for it to finish Complete
/// (a Failed one fails at once with its reason); deletes it afterwards.
async fn run_operation(
    e: &Env<'_>,
    kind: &str,
) -> anyhow::Result<(parse::OperationView, Duration)> {
    run_operation_with(e, kind, &[]).await
}

async fn node_reboot(e: &Env<'_>) -> anyhow::Result<Checked> {
    wait_node_ready(e, None, NODE_READY_TIMEOUT).await?;
    let m = daemon_state(e.guest).await?.active_machine;
    if m.is_empty() {
        anyhow::bail!("no activeMachine in {DAEMON_STATE}");
    }
    let leader = machine_prop(e.guest, &m, "Leader").await?;
    let (op, took) =
        run_operation(e, flex_api::machina::OperationKind::NodeReboot.as_str()).await?;
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
    let (op, took) =
        run_operation(e, flex_api::machina::OperationKind::AgentReset.as_str()).await?;
    Ok(Checked::passed_with(format!("{op} in {}", secs(took))))
}

async fn agent_reset_leaves_nothing(e: &Env<'_>) -> anyhow::Result<Checked> {
    nothing_left(e, "AgentReset").await
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
mod tests {
    use std::sync::Mutex;

    use flex_host::runner::Output;
    use flex_testkit::FakeRunner;
    use serde_json::json;

    use super::*;
    use crate::kit::cluster::testing::{KC, env, guest, info, node_json, readable, ssh};
    use crate::kit::cluster::token_in;

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
}
