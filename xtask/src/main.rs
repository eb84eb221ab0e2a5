//! `cargo xtask`: the project's automation. Deliberately light (the host crate's runner without
//! D-Bus or HTTP, anyhow, tokio): it compiles in about a minute on a bare machine, installs the
//! Debian packages the task needs (as root on Debian; otherwise it names them), and only then
//! builds and runs what needs them:
//!
//! - `ci`: format, clippy, the layering rules, every test, a short fuzzing run, then the
//!   offline end-to-end check;
//! - `fuzz`: the coverage-guided fuzz targets of `fuzz/` (built with stable cargo);
//! - `layering`: the layering rules alone (`ci` runs them too);
//! - `backports [--write]`: the `-backports` apt source from this machine's own Debian source
//!   (`.ci/run` adds it before installing QEMU from it);
//! - `codegen [--check]`: `flex-codegen` (committed generated files);
//! - `fleet [FLAGS]`: `flex-fleet`, the fleet simulator (docs/drain.md);
//! - `up`, `check`, `down`, `image`, `ssh`, `console`, `journal`, `selinux`, `bench`: the
//!   `flex-harness` binary (`harness/src/bin/flex-harness/`), with the task's flags.
//!
//! The task table and the parsing of the flags are the library's ([`xtask::tasks`]).

use std::process::ExitCode;

use flex_host::runner::run_inherited;
use xtask::tasks::{self, Task};
use xtask::{cargo_run, ci, deps, fuzz, project_root};

async fn run(task: &str, rest: &[String]) -> anyhow::Result<()> {
    match tasks::parse(task, rest)? {
        Task::Help(usage) => {
            println!("{usage}");
            Ok(())
        }
        Task::Ci { install, fuzz, e2e } => ci::run(install, fuzz, e2e).await,
        Task::Fuzz(args) => fuzz::run(&args).await,
        Task::Layering => xtask::layering::check(&flex_host::runner::ProcessRunner::new()).await,
        Task::Backports { write } => deps::backports_task(write),
        Task::Codegen(args) => Ok(run_inherited(&cargo_run("flex-codegen", &args)).await?),
        Task::Fleet(args) => Ok(run_inherited(&cargo_run("flex-fleet", &args)).await?),
        Task::Harness(args) => {
            let help = args.iter().any(|a| a == "--help" || a == "-h");
            if !help && task == "up" {
                deps::ensure(deps::VM_PACKAGES).await?;
            }
            Ok(run_inherited(&cargo_run("flex-harness", &args)).await?)
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((task, rest)) = args.split_first() else {
        eprintln!("{}", tasks::USAGE);
        return ExitCode::FAILURE;
    };
    if matches!(task.as_str(), "-h" | "--help" | "help") {
        println!("{}", tasks::USAGE);
        return ExitCode::SUCCESS;
    }
    // Every task runs from the workspace root, wherever `cargo xtask` was typed.
    if let Err(e) = std::env::set_current_dir(project_root()) {
        eprintln!("xtask: cannot enter the workspace root: {e}");
        return ExitCode::FAILURE;
    }
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
    match rt.block_on(run(task, rest)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}
