//! The `repave` cluster group: the machine's settings version (its eTag) changes in the
//! controller's store and the Node is deleted; the daemon starts the other machine with the new
//! settings, a new Node is Ready, the old machine is removed with its bpffs mount, and a pod
//! runs. It starts from a joined node and leaves one.

use std::time::{Duration, Instant};

use crate::check::{Group, HostMode, Needs, check, secs};
use crate::cluster::kube::{Seen, poll};
use crate::cluster::render;
use crate::kit::cluster::{
    DAEMON_STATE, Env, NODE_READY_TIMEOUT, RepaveMemo, daemon_state, in_cluster, machine_prop,
    node_shows_agent_done, probe_pod_runs, wait_node_ready,
};
use crate::report::Checked;

const REPAVE_TIMEOUT: Duration = Duration::from_secs(1500);

const CLEANUP_TIMEOUT: Duration = Duration::from_secs(300);

/// The `repave` group.
pub const GROUP: Group = Group {
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use flex_host::runner::Output;
    use flex_testkit::FakeRunner;

    use super::*;
    use crate::kit::cluster::testing::{KC, env, guest, info, node_json, readable, ssh};

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
}
