//! `flex-harness`: the harness's own commands, which `cargo xtask` runs once it has installed
//! the Debian packages a task needs (`cargo xtask up` is `flex-harness up`). A thin CLI over the
//! `flex_harness` library (its command line is `flex_harness::cli`); run it directly with `cargo run -p flex-harness -- …` when the
//! packages are there.

mod bench;
mod image;
mod vm;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use flex_harness::cli::{Cli, Task};

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
            Task::Ssh(a) => vm::ssh(a).await,
            Task::Console(a) => vm::console(a).await,
            Task::Journal(a) => vm::journal(a).await,
            Task::Selinux(t) => vm::selinux(t).await,
            Task::Bench(a) => {
                bench::run(bench::BenchOptions {
                    tries: a.tries,
                    no_vm: a.no_vm,
                    baseline: a
                        .baseline
                        .unwrap_or_else(|| project_root().join("bench/baseline.json")),
                    write_baseline: a.write_baseline,
                })
                .await
            }
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
