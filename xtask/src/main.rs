//! `cargo xtask`: the project's automation. Deliberately light (the host crate's runner without
//! D-Bus or HTTP, anyhow, tokio): it compiles in about a minute on a bare machine, installs the
//! Debian packages the task needs (as root on Debian; otherwise it names them), and only then
//! builds and runs what needs them:
//!
//! - `ci`: format, clippy, the layering rules, every test, a short fuzzing run, then the
//!   offline end-to-end check;
//! - `fuzz`: the coverage-guided fuzz targets of `fuzz/` (built with stable cargo);
//! - `layering`: the layering rules alone (`ci` runs them too);
//! - `codegen [--check]`: `flex-codegen` (committed generated files);
//! - `up`, `check`, `down`, `image`: the `flex-harness` binary, with the task's flags.

mod ci;
mod deps;
mod fuzz;
mod layering;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use flex_host::runner::{Cmd, run_inherited};

const USAGE: &str = "\
aks-flex-node project automation

Usage: cargo xtask <TASK> [FLAGS]

Tasks:
  ci [--no-install] [--no-fuzz] [--no-e2e]
                                What CI runs: fmt, clippy -D warnings, the layering rules, every
                                test, each fuzz target briefly, then the offline end-to-end
                                check (up, check, down)
  fuzz [--list] [--seconds N] [TARGET...]
                                Build the fuzz targets (stable cargo, libFuzzer) and run each
                                for N seconds (default 10) over its committed seeds
  layering                      Check the workspace's layering rules on its dependency graph
  codegen [--check]             Regenerate the committed generated files (or fail if stale)
  image [FLAGS]                 Build the agent's (or --controller) container image, no engine
  up [FLAGS]                    Boot the dev host (or ACL) under QEMU with the agent bootstrapped
  check [FLAGS]                 Run the check groups against the VM `up` started
  down                          Remove the VM, its disks and the registry

Each task installs the Debian packages it needs first (as root on Debian; otherwise it names
them). `cargo xtask <TASK> --help` shows a task's flags.";

/// The workspace root.
pub fn project_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// `cargo run` of one of the workspace's binaries with `args`, from the workspace root, its
/// output on the terminal. Builds are long on two cores; the timeout only stops a hang.
pub fn cargo_run(package: &str, args: &[String]) -> Cmd {
    Cmd::new("cargo")
        .args(["run", "--quiet", "--package", package, "--"])
        .args(args.iter().map(String::as_str))
        .timeout(Duration::from_secs(6 * 3600))
}

async fn run(task: &str, rest: &[String]) -> anyhow::Result<()> {
    let help = rest.iter().any(|a| a == "--help" || a == "-h");
    match task {
        "ci" => {
            if help {
                println!(
                    "Usage: cargo xtask ci [--no-install] [--no-fuzz] [--no-e2e]\n\n  --no-install  Skip installing system packages\n  --no-fuzz     Skip the short fuzzing run (cargo xtask fuzz --seconds {})\n  --no-e2e      Skip the offline end-to-end check (up, check, down on the dev host)",
                    ci::FUZZ_SECONDS
                );
                return Ok(());
            }
            let mut install = true;
            let mut e2e = true;
            let mut fuzz = true;
            for a in rest {
                match a.as_str() {
                    "--no-install" => install = false,
                    "--no-fuzz" => fuzz = false,
                    "--no-e2e" => e2e = false,
                    other => anyhow::bail!(
                        "ci: unexpected argument {other:?} (see cargo xtask ci --help)"
                    ),
                }
            }
            ci::run(install, fuzz, e2e).await
        }
        "fuzz" => {
            if help {
                println!(
                    "Usage: cargo xtask fuzz [--list] [--seconds N] [TARGET...]\n\n  --list       List the targets and what each checks\n  --seconds N  Run each target N seconds (default {})\n  TARGET       Only these targets\n\nBuilds with stable cargo (no nightly, no cargo-fuzz) into $CARGO_TARGET_DIR/fuzz or $FUZZ_TARGET_DIR. See docs/fuzzing.md.",
                    fuzz::DEFAULT_SECONDS
                );
                return Ok(());
            }
            fuzz::run(&fuzz::parse_args(rest)?).await
        }
        "layering" => crate::layering::check(&flex_host::runner::ProcessRunner::new()).await,
        "codegen" => Ok(run_inherited(&cargo_run("flex-codegen", rest)).await?),
        "up" | "check" | "down" | "image" => {
            if !help && task == "up" {
                deps::ensure(deps::VM_PACKAGES).await?;
            }
            let mut args = vec![task.to_string()];
            args.extend(rest.iter().cloned());
            Ok(run_inherited(&cargo_run("flex-harness", &args)).await?)
        }
        other => anyhow::bail!("unknown task {other:?}\n\n{USAGE}"),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((task, rest)) = args.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::FAILURE;
    };
    if matches!(task.as_str(), "-h" | "--help" | "help") {
        println!("{USAGE}");
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
