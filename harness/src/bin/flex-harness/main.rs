//! `flex-harness`: the harness's own commands, which `cargo xtask` runs once it has installed
//! the Debian packages a task needs (`cargo xtask up` is `flex-harness up`). A thin CLI over the
//! `flex_harness` library; run it directly with `cargo run -p flex-harness -- …` when the
//! packages are there.

mod image;
mod vm;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "aks-flex-node harness: the dev host under QEMU, check groups, images"
)]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
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
    Up(Box<vm::UpArgs>),
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
            Task::Up(a) => vm::up(*a).await,
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
