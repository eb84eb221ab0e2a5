//! The `node-lifecycle` cluster group: the seed's checks of a node's life after it joined.
//!
//! 1. An AgentUpgrade MachineOperation naming the good candidate image (the `upgrade` group's,
//!    built and pushed on first use) finishes Complete, polled each second as the seed polls
//!    it, and the agent then runs that image.
//! 2. The deletion signal: the node's machine is removed from the controller's store and the
//!    Node gets the deletion taint (`kubernetes.azure.com/flex-node-deleting:NoSchedule`); the
//!    daemon resets the node and uninstalls itself, leaving no machine, bpffs mount, config,
//!    state, agent unit or link.
//! 3. The cluster's side of a re-join (the Node deleted, the machine registered again) and the
//!    bootstrap inputs with `agent-image.env` naming the good candidate: the agent runs that
//!    image and a new Node is Ready.
//! 4. `aks-flex-node reset` (the reset unit) leaves nothing either.
//! 5. After it, the bootstrap inputs alone (no `agent-image.env`) join the node again on the
//!    install's image, and a new Node is Ready.
//!
//! The group starts from a joined node and leaves one, on the install's image.

use std::time::{Duration, Instant};

use flex_host::secret::Secret;

use crate::check::{Group, HostMode, Needs, check, secs};
use crate::cluster::render;
use crate::kit::candidates;
use crate::kit::cluster::{
    Env, bootstrap_again, in_cluster, nothing_left, run_operation_with, wait_agent_running,
    wait_node_ready,
};
use crate::report::Checked;

const READY_TIMEOUT: Duration = Duration::from_secs(600);
const RESET_UNIT_TIMEOUT: Duration = Duration::from_secs(900);

/// The `node-lifecycle` group.
pub const GROUP: Group = Group {
    name: "node-lifecycle",
    description: "an AgentUpgrade MachineOperation switches the agent's image; the deletion signal and reset each leave nothing behind and are followed by a re-join, once with the image agent-image.env names",
    needs: Needs::Cluster,
    checks: &[
        check!(
            "an AgentUpgrade MachineOperation completes and the agent runs the new image",
            agent_upgrade,
            via in_cluster
        ),
        check!(
            "the deletion signal (machine removed, Node tainted) leaves no machine, mount, config, state, unit or link",
            deletion_signal,
            via in_cluster
        ),
        check!(
            "the node re-joins with the image agent-image.env names",
            rejoin_with_image,
            via in_cluster
        ),
        check!(
            "aks-flex-node reset leaves no machine, mount, config, state, unit or link",
            cli_reset,
            via in_cluster
        ),
        check!(
            "after reset the node joins again on the install's image and is Ready",
            rejoin_after_cli_reset,
            via in_cluster
        ),
    ],
    in_host_mode: HostMode::Same,
};

/// The good candidate image, built and pushed by the `upgrade` group's recipe if the registry
/// does not have it yet.
async fn good_candidate(e: &Env<'_>) -> anyhow::Result<String> {
    let reg = e
        .registry
        .ok_or_else(|| anyhow::anyhow!("up recorded no registry"))?;
    let client = crate::vm::registry_client(&reg.host_addr())?;
    let (rec, _) = candidates::ensure(
        &client,
        e.work,
        &reg.host_addr(),
        &reg.guest_addr(),
        e.agent_image,
    )
    .await?;
    Ok(rec.good)
}

async fn agent_upgrade(e: &Env<'_>) -> anyhow::Result<Checked> {
    wait_node_ready(e, None, READY_TIMEOUT).await?;
    let good = good_candidate(e).await?;
    let (op, took) = run_operation_with(
        e,
        flex_api::machina::OperationKind::AgentUpgrade.as_str(),
        &[("image", &good)],
    )
    .await?;
    wait_agent_running(e, Some(&good)).await?;
    wait_node_ready(e, None, READY_TIMEOUT).await?;
    Ok(Checked::passed_with(format!("{op} in {}", secs(took))))
}

async fn deletion_signal(e: &Env<'_>) -> anyhow::Result<Checked> {
    let node = e.node();
    wait_node_ready(e, None, READY_TIMEOUT).await?;
    let t = Instant::now();
    // The machine goes first: a taint with the machine still there only makes the daemon wait,
    // and the taint, a change of the Node, is what wakes it.
    crate::kit::cluster::remove_machine_entry(e, node).await?;
    e.kubectl
        .run([
            "taint",
            "node",
            node,
            &format!(
                "{}=true:{}",
                flex_api::repave::DELETION_TAINT_KEY,
                flex_api::repave::DELETION_TAINT_EFFECT
            ),
            "--overwrite",
        ])
        .await?;
    nothing_left(e, "the deletion signal").await?;
    Ok(Checked::passed_with(format!(
        "reset and uninstalled in {}",
        secs(t.elapsed())
    )))
}

/// The cluster's side of a node coming back: its Node deleted (a new Ready one then proves the
/// join), its machine registered again (under a new settings version, naming the same token)
/// and re-admitted ([`crate::kit::cluster::readmit`]). Returns the old Node's uid, if there was one.
async fn cluster_side_of_rejoin(e: &Env<'_>) -> anyhow::Result<Option<String>> {
    let node = e.node();
    let old =
        crate::cluster::parse::node(&e.kubectl.get_json(&["node", node]).await?)?.map(|n| n.uid);
    e.kubectl
        .run_t(
            [
                "delete",
                "node",
                node,
                "--ignore-not-found",
                "--wait=true",
                "--timeout=60s",
            ],
            Duration::from_secs(90),
        )
        .await?;
    let entry = render::machine_entry(
        node,
        &e.info.kubernetes_version,
        &format!("harness-rejoin-{}", e.stamp),
        &e.info.token_id,
    )?;
    e.kubectl
        .apply(&render::machines_config_map(node, &entry))
        .await?;
    crate::kit::cluster::readmit(e).await?;
    Ok(old)
}

/// A re-join after a reset: the cluster's side, then `up`'s bootstrap inputs, with `image` in
/// `agent-image.env` (the agent must run it) or without one (the agent must run the install's
/// image), and a new Ready Node.
async fn rejoin(e: &Env<'_>, image: Option<&str>) -> anyhow::Result<Checked> {
    if e.bootstrap_env.is_empty() {
        anyhow::bail!("up recorded no bootstrap inputs");
    }
    let old = cluster_side_of_rejoin(e).await?;
    let t = Instant::now();
    let runs = bootstrap_again(e, &Secret::new(e.bootstrap_env), image).await?;
    match image {
        Some(named) if runs != named => {
            anyhow::bail!("agent-image.env names {named}, but the agent runs {runs}")
        }
        None if runs != e.agent_image => anyhow::bail!(
            "without agent-image.env the agent should run the install's {}, but runs {runs}",
            e.agent_image
        ),
        _ => {}
    }
    let n = wait_node_ready(e, old.as_deref(), READY_TIMEOUT).await?;
    Ok(Checked::passed_with(format!(
        "{}Node Ready in {} (kubelet {})",
        if image.is_some() {
            "on the named image, "
        } else {
            ""
        },
        secs(t.elapsed()),
        n.kubelet_version
    )))
}

async fn rejoin_with_image(e: &Env<'_>) -> anyhow::Result<Checked> {
    if e.bootstrap_env.is_empty() {
        anyhow::bail!("up recorded no bootstrap inputs");
    }
    let good = good_candidate(e).await?;
    rejoin(e, Some(&good)).await
}

async fn cli_reset(e: &Env<'_>) -> anyhow::Result<Checked> {
    let t = Instant::now();
    e.guest
        .sh_t(
            "systemctl start aks-flex-node-reset.service",
            RESET_UNIT_TIMEOUT,
        )
        .await?;
    nothing_left(e, "aks-flex-node reset").await?;
    Ok(Checked::passed_with(format!("in {}", secs(t.elapsed()))))
}

async fn rejoin_after_cli_reset(e: &Env<'_>) -> anyhow::Result<Checked> {
    rejoin(e, None).await
}

#[cfg(test)]
mod tests {
    //! Real: the checks' command sequences and decisions. Faked: the guest and `kubectl` (a
    //! recording runner answering from scripts).

    use std::sync::Mutex;

    use flex_host::runner::Output;
    use flex_testkit::FakeRunner;

    use super::*;
    use crate::kit::cluster::testing::{KC, env, guest, info, node_json, readable, ssh};

    #[tokio::test]
    async fn deletion_signal_removes_the_machine_then_taints_and_waits_for_nothing_left() {
        let r = FakeRunner::new();
        let (i, s, m) = (info(), ssh(), Mutex::new(None));
        let e = env(&r, &i, &s, &m);
        r.on(
            &format!("{KC} get node flex-dev-node"),
            node_json("u1", "True"),
        );
        r.on_seq(
            &guest("for p in"),
            vec![Output::ok("machine kube1\n"), Output::ok("")],
        );
        deletion_signal(&e).await.unwrap();
        let t = readable(&r.transcript());
        let patch = t
            .find(r#"patch configmap aks-flex-machines --type=json -p [{"op":"remove","path":"/data/flex-dev-node.json"}]"#)
            .unwrap_or_else(|| panic!("{t}"));
        let taint = t
            .find("taint node flex-dev-node kubernetes.azure.com/flex-node-deleting=true:NoSchedule --overwrite")
            .unwrap_or_else(|| panic!("{t}"));
        assert!(patch < taint, "the machine goes before the taint:\n{t}");
        assert_eq!(
            t.matches("'for p in").count(),
            2,
            "polled until nothing was left"
        );
    }

    #[tokio::test]
    async fn rejoin_after_reset_deletes_the_node_registers_and_wants_the_install_image() {
        let r = FakeRunner::new();
        let (i, s, m) = (info(), ssh(), Mutex::new(None));
        let e = env(&r, &i, &s, &m);
        r.on_seq(
            &format!("{KC} get node flex-dev-node"),
            vec![node_json("u1", "True"), node_json("u2", "True")],
        );
        let probe = |image: &str| {
            Output::ok(format!(
                "active=active\ntask=RUNNING\n---info\n{{\"ID\":\"aks-flex-agent\",\"Image\":\"{image}\"}}\n---status\n"
            ))
        };
        let probe_cmd = ssh()
            .cmd(&crate::kit::upgrade_status::probe_script(), Duration::ZERO)
            .display_argv();
        r.on(&probe_cmd, probe(e.agent_image));
        let d = rejoin_after_cli_reset(&e).await.unwrap().detail.unwrap();
        assert!(d.starts_with("Node Ready in "), "{d}");
        let t = readable(&r.transcript());
        assert!(
            !t.contains("0123456789abcdef"),
            "the token is in an argument:\n{t}"
        );
        assert!(!t.contains("agent-image.env"), "no image named:\n{t}");
        let delete = t.find(&format!("{KC} delete node flex-dev-node")).unwrap();
        let register = t.find(&format!("{KC} apply -f -")).unwrap();
        let bootstrap = t
            .find("systemctl restart aks-flex-node-bootstrap.service")
            .unwrap();
        assert!(delete < register && register < bootstrap, "{t}");

        // The agent on another image than the install's is a failure that names both.
        let r = FakeRunner::new();
        let e = env(&r, &i, &s, &m);
        r.on(
            &format!("{KC} get node flex-dev-node"),
            node_json("u3", "True"),
        );
        r.on(&probe_cmd, probe("10.0.2.2:5000/aks-flex/agent@sha256:2"));
        let err = rejoin_after_cli_reset(&e).await.unwrap_err().to_string();
        assert!(err.contains("should run the install's 10.0.2.2:5000/aks-flex/agent@sha256:1, but runs 10.0.2.2:5000/aks-flex/agent@sha256:2"), "{err}");
    }

    #[tokio::test]
    async fn the_upgrade_and_the_named_image_need_the_registry() {
        let r = FakeRunner::new();
        let (i, s, m) = (info(), ssh(), Mutex::new(None));
        let e = env(&r, &i, &s, &m);
        r.on(
            &format!("{KC} get node flex-dev-node"),
            node_json("u1", "True"),
        );
        let err = agent_upgrade(&e).await.unwrap_err().to_string();
        assert_eq!(err, "up recorded no registry");
        let err = rejoin_with_image(&e).await.unwrap_err().to_string();
        assert_eq!(err, "up recorded no registry");
    }
}
