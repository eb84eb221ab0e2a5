//! `daemon` (alias `agent`): the long-running agent under systemd. It tells systemd it is ready
//! (`sd_notify READY=1`, a no-op outside a `Type=notify` unit) and runs until SIGTERM or SIGINT,
//! then stops cleanly. The reconcilers (machine goal, Node watch, MachineOperations) plug into
//! [`run`] as they land.

use tokio_util::sync::CancellationToken;

use crate::config::Config;

/// Runs the daemon until `shutdown` is cancelled.
pub async fn run(config: &Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    tracing::info!(
        node = %config.agent.node_name,
        interval = %crate::config::format_go_duration(config.agent.machine_reconcile_interval.0),
        "daemon ready"
    );
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        tracing::warn!(error = %e, "sd_notify READY failed");
    }
    shutdown.cancelled().await;
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    tracing::info!("daemon shutting down");
    Ok(())
}

/// A token cancelled on the first SIGTERM or SIGINT.
pub fn shutdown_on_signals() -> std::io::Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let t = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "received signal"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "received signal"),
        }
        t.cancel();
    });
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn daemon_returns_when_cancelled() {
        let token = CancellationToken::new();
        let cfg = Config::default();
        let t = token.clone();
        let h = tokio::spawn(async move { run(&cfg, t).await });
        token.cancel();
        h.await.unwrap().unwrap();
    }
}
