//! `flex-fleet` (`cargo xtask fleet`): runs the fleet simulator and prints its report.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use flex_fleet::sim::{FleetConfig, run};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// N simulated nodes running the daemon's own MachineOperation, drain and disruption budget
/// code, a burst of NodeReboot operations, and the API cost per node (docs/drain.md).
#[derive(Parser, Debug)]
#[command(name = "cargo xtask fleet")]
struct Args {
    /// Simulated nodes.
    #[arg(long, default_value_t = 6)]
    nodes: usize,
    /// NodeReboot operations in the burst, aimed at the nodes in turn (default: one per node).
    #[arg(long)]
    operations: Option<usize>,
    /// The disruption budget's maxUnavailable (K).
    #[arg(long, default_value_t = 1)]
    budget: u32,
    /// A real API server's kubeconfig (default: the in-process fake API server).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The fake API server refuses field selectors on spec.machineRef (a CRD without
    /// selectableFields): the daemons fall back to watching every operation.
    #[arg(long)]
    no_selector: bool,
    /// Pods bound to each node, evicted by its drain (default 1; 0 with --kubeconfig).
    #[arg(long)]
    pods_per_node: Option<usize>,
    /// A simulated reboot's downtime, in milliseconds.
    #[arg(long, default_value_t = 200)]
    reboot_ms: u64,
    /// The compressed wait before an operation waiting for a slot looks again, in milliseconds
    /// (the daemon's is 20 s).
    #[arg(long, default_value_t = 200)]
    recheck_ms: u64,
    /// How long the burst may take, in seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// The report as JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    // Warnings and errors on stderr; a look for a busy budget slot is routine here.
    let filter = tracing_subscriber::filter::Targets::new()
        .with_default(tracing::Level::WARN)
        .with_target("flex_host::retry", tracing::Level::ERROR);
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(filter)
        .init();
    let cfg = FleetConfig {
        nodes: args.nodes,
        operations: args.operations.unwrap_or(args.nodes),
        budget: args.budget,
        selector: !args.no_selector,
        pods_per_node: args
            .pods_per_node
            .unwrap_or(if args.kubeconfig.is_some() { 0 } else { 1 }),
        kubeconfig: args.kubeconfig,
        reboot_time: Duration::from_millis(args.reboot_ms),
        recheck: Duration::from_millis(args.recheck_ms),
        timeout: Duration::from_secs(args.timeout),
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("flex-fleet: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(&cfg)) {
        Ok(report) => {
            if args.json {
                match serde_json::to_string_pretty(&report) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("flex-fleet: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                print!("{}", report.render());
            }
            let finished = report.phases.keys().all(|p| p == "Complete");
            let bounded = report.max_disrupted <= report.budget as usize;
            if finished && bounded && report.reboots_uncordoned == 0 {
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "flex-fleet: an invariant failed (operations not all Complete, more than K disrupted at once, or a reboot while uncordoned)"
                );
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("flex-fleet: {e:#}");
            ExitCode::FAILURE
        }
    }
}
