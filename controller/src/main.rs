//! The `aks-flex-controller` binary: parse the flags, log JSON to stdout, run until SIGTERM or
//! SIGINT; on error print `Error: <err>` to stderr and exit 1.

use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGTERM or SIGINT.
fn shutdown_on_signals() -> std::io::Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let t = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "received signal; shutting down"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "received signal; shutting down"),
        }
        t.cancel();
    });
    Ok(token)
}

fn main() -> ExitCode {
    let args = aks_flex_controller::Args::parse();
    aks_flex_controller::logging::init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let shutdown = shutdown_on_signals()?;
        aks_flex_controller::run(args, shutdown).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
