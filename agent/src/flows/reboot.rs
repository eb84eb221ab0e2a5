//! NodeReboot (`RestartNode`): stop and start the active machine again, without reprovisioning
//! and without changing the daemon state.

use crate::machine::seams::NodeOps;
use crate::state::DaemonState;

/// `RestartNode` (NodeReboot): stop and start the active machine again, without reprovisioning
/// and without changing the state.
pub async fn restart_node(ops: &dyn NodeOps, state: &DaemonState) -> anyhow::Result<()> {
    let active = state.active()?;
    ops.stop(active).await?;
    Ok(ops.start(active).await?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic is a failure

    use super::*;
    use crate::machine::fakes::RecordingOps;

    /// The real flow over the recording `NodeOps` fake.
    #[tokio::test]
    async fn restart_node_restarts_the_active_side() {
        let st = DaemonState {
            active_machine: "kube1".into(),
            ..Default::default()
        };
        let ops = RecordingOps::default();
        restart_node(&ops, &st).await.unwrap();
        assert_eq!(ops.calls(), vec!["stop kube1", "start kube1"]);
        let e = restart_node(&ops, &DaemonState::default())
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), "daemon state is missing active machine");
        let failing = RecordingOps::failing("stop kube1");
        assert!(restart_node(&failing, &st).await.is_err());
        assert_eq!(
            failing.calls(),
            vec!["stop kube1"],
            "no start after a failed stop"
        );
    }
}
