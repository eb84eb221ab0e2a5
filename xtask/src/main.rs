//! `cargo xtask`: the project's automation, in Rust. A thin CLI over small task modules.

mod ci;
mod codegen;
mod deps;
mod image;
mod vm;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "aks-flex-node project automation")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// What CI runs: format check, clippy -D warnings, every test, then the offline end-to-end
    /// check on the dev host (installs the Debian packages needed when run as root)
    Ci {
        /// Skip installing system packages
        #[arg(long)]
        no_install: bool,
        /// Skip the offline end-to-end check (up, check, down on the dev host)
        #[arg(long)]
        no_e2e: bool,
    },
    /// Regenerate committed generated files (image/agent-container.bu)
    Codegen {
        /// Fail if a generated file is stale instead of writing it
        #[arg(long)]
        check: bool,
    },
    /// Build the agent's container image (OCI layout + archive) without a container engine
    Image {
        /// Output directory (default: <workspace>/target/image)
        #[arg(long)]
        out: Option<PathBuf>,
        /// Build the image a second time (into a temporary directory, same binary) and fail
        /// unless the digests match
        #[arg(long)]
        check_reproducible: bool,
        /// Build the aks-flex-controller image instead of the agent's
        #[arg(long, conflicts_with = "check_reproducible")]
        controller: bool,
    },
    /// Boot the dev host (or ACL) under QEMU with the agent bootstrapped in its container
    Up(vm::UpArgs),
    /// Run the check groups against the VM `up` started
    Check(vm::CheckArgs),
    /// Remove the VM, its disks and the registry
    Down,
}

/// The workspace root.
pub fn project_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("xtask: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        match cli.command {
            Task::Ci { no_install, no_e2e } => ci::run(!no_install, !no_e2e).await,
            Task::Codegen { check } => codegen::run(check),
            Task::Image {
                out,
                controller: true,
                ..
            } => image::run_controller(out).await,
            Task::Image {
                out,
                check_reproducible,
                controller: false,
            } => image::run(out, check_reproducible).await,
            Task::Up(a) => vm::up(a).await,
            Task::Check(a) => vm::check(a).await,
            Task::Down => vm::down().await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}
