//! The `node-join` cluster group, against the cluster `up --cluster` made and the VM that joined
//! it: the Node is Ready; the daemon got its own client certificate (the controller's CSR
//! approver approved it); the active machine runs; the Node shows the agent Done; a probe pod
//! runs on the node and `kubectl logs` reaches it. It starts from a joined node and leaves one,
//! as the host groups do.

use std::time::Duration;

use crate::check::{Group, HostMode, Needs, check};
use crate::cluster::kube::{GUEST_TIMEOUT, Seen, poll};
use crate::kit::cluster::{
    DAEMON_STATE, Env, daemon_state, in_cluster, machine_prop, node_ready, node_shows_agent_done,
    probe_pod_runs,
};
use crate::report::{Checked, Outcome};

const CERT_TIMEOUT: Duration = Duration::from_secs(180);
/// The daemon's client certificate, once the CSR approver approved it.
pub const DAEMON_CERT: &str = "/etc/aks-flex-node/daemon-credentials/client-current.pem";

/// The `node-join` group.
pub const GROUP: Group = Group {
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use flex_host::runner::Output;
    use flex_testkit::FakeRunner;
    use serde_json::json;

    use super::*;
    use crate::cluster::render;
    use crate::kit::cluster::testing::{KC, env, guest, info, node_json, readable, ssh};

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
}
