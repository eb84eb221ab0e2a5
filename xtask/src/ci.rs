//! `cargo xtask ci`: what CI runs. `cargo fmt --check`, `cargo clippy --all-targets -D
//! warnings`, then every test in the workspace (nextest when installed, else `cargo test`).

use std::time::Duration;

use aks_flex_node::runner::{Cmd, ProcessRunner, Runner, run_inherited};

const LONG: Duration = Duration::from_secs(3600);

fn cargo(args: &[&str]) -> Cmd {
    Cmd::new("cargo")
        .args(args.iter().copied())
        .env("CARGO_TERM_COLOR", "never")
        .timeout(LONG)
}

/// Runs the CI task: static checks and tests, then (unless `e2e` is off) the offline
/// end-to-end check: `up` on the dev host, `check`, `down`. Everything is compiled before the VM
/// boots (`up` builds the agent image first), so no build competes with the guest.
pub async fn run(install: bool, e2e: bool) -> anyhow::Result<()> {
    unit(install).await?;
    if !e2e {
        return Ok(());
    }
    eprintln!("xtask ci: end-to-end: cargo xtask up (dev host, offline)");
    crate::vm::up(crate::vm::UpArgs::defaults()).await?;
    eprintln!("xtask ci: end-to-end: cargo xtask check");
    let checked = crate::vm::check(crate::vm::CheckArgs::defaults()).await;
    let downed = crate::vm::down().await;
    checked?;
    downed
}

async fn unit(install: bool) -> anyhow::Result<()> {
    if install {
        crate::deps::ensure(crate::deps::TEST_PACKAGES).await?;
    }
    let root = crate::project_root();
    std::env::set_current_dir(&root)?;
    eprintln!("xtask ci: cargo fmt --check");
    run_inherited(&cargo(&["fmt", "--all", "--", "--check"])).await?;
    eprintln!("xtask ci: cargo clippy");
    run_inherited(&cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ]))
    .await?;
    let nextest = ProcessRunner::new()
        .output(&Cmd::new("cargo").args(["nextest", "--version"]))
        .await
        .is_ok_and(|o| o.success());
    if nextest {
        eprintln!("xtask ci: cargo nextest run");
        run_inherited(&cargo(&[
            "nextest",
            "run",
            "--workspace",
            "--locked",
            "--no-fail-fast",
        ]))
        .await?;
    } else {
        eprintln!("xtask ci: cargo test");
        run_inherited(&cargo(&[
            "test",
            "--workspace",
            "--locked",
            "--no-fail-fast",
        ]))
        .await?;
    }
    Ok(())
}
