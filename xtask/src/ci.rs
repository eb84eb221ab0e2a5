//! `cargo xtask ci`: what CI runs. The packages first, then `cargo fmt --check`, clippy with
//! `-D warnings`, the layering rules ([`crate::layering`]), the generated files (`codegen
//! --check`), every test in the workspace (nextest when installed, else `cargo test`), each fuzz
//! target for [`FUZZ_SECONDS`] ([`crate::fuzz`]), and the offline end-to-end check: `up` on the
//! dev host, `check`, `down` (through the harness).

use std::time::Duration;

use flex_host::runner::{Cmd, ProcessRunner, Runner, run_inherited};

const LONG: Duration = Duration::from_secs(3600);

/// Seconds each fuzz target runs in CI: enough to replay the seeds and catch a shallow
/// regression, short enough for CI's budget (docs/fuzzing.md has the figures).
pub const FUZZ_SECONDS: u64 = 5;

fn cargo(args: &[&str]) -> Cmd {
    Cmd::new("cargo")
        .args(args.iter().copied())
        .env("CARGO_TERM_COLOR", "never")
        .timeout(LONG)
}

/// The harness binary the workspace build made. `cargo run -p flex-harness` would resolve
/// features for the harness alone and compile much of the dependency graph again; building
/// the workspace's binaries reuses what the test build compiled.
fn harness(task: &str) -> Cmd {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| crate::project_root().join("target"));
    Cmd::new(target.join("debug/flex-harness").to_string_lossy())
        .arg(task)
        .timeout(LONG.saturating_mul(3))
}

/// Runs the CI task. Everything is compiled before the VM boots (`up` builds the agent image
/// first), so no build competes with the guest.
pub async fn run(install: bool, fuzz: bool, e2e: bool) -> anyhow::Result<()> {
    if install {
        crate::deps::ensure(crate::deps::TEST_PACKAGES).await?;
        if e2e {
            crate::deps::ensure(crate::deps::VM_PACKAGES).await?;
        }
    }
    unit().await?;
    if fuzz {
        eprintln!("xtask ci: cargo xtask fuzz --seconds {FUZZ_SECONDS}");
        crate::fuzz::run(&crate::fuzz::Args {
            list: false,
            seconds: FUZZ_SECONDS,
            targets: Vec::new(),
        })
        .await?;
    }
    if !e2e {
        return Ok(());
    }
    eprintln!("xtask ci: cargo build --workspace --bins (the harness, with the tests' features)");
    run_inherited(&cargo(&["build", "--workspace", "--bins", "--locked"])).await?;
    for pass in E2E_PASSES {
        end_to_end(pass).await?;
    }
    Ok(())
}

/// One end-to-end pass of CI: a dev host `up` with these arguments, then `check` (the offline
/// groups of that mode) and `down`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pass {
    /// Its name: where its reports are kept (`target/harness/ci-<name>/`).
    pub name: &'static str,
    /// `up`'s arguments.
    pub up: &'static [&'static str],
    /// `check`'s arguments.
    pub check: &'static [&'static str],
    /// Harness tasks run after `check`, before `down` (each a task and its arguments).
    pub then: &'static [&'static [&'static str]],
}

/// CI's end-to-end passes, in order: the agent as a container of its image (the ACL way), then
/// the agent on the host from its blue/green slots, installed by `scripts/bootstrap.sh`
/// (upstream's Ubuntu way; docs/host-mode.md), then the agent's container on the SELinux dev
/// host. All three fit CI's limit (README has the figures).
pub const E2E_PASSES: &[Pass] = &[
    Pass {
        name: "image",
        up: &[],
        check: &[],
        then: &[],
    },
    // The groups whose host mode differs: the host variants of machines and upgrade, and reset
    // (the host's units and links, then a bootstrap again by the install's binary). mounts,
    // container and bootstrap check what does not depend on the mode and run in the image
    // pass; CI's 90 minutes no longer hold them twice under this machine's TCG
    // (docs/host-mode.md). `check` alone in host mode still runs them all.
    Pass {
        name: "host",
        up: &["--mode", "host"],
        check: &["--only", "machines,upgrade,reset"],
        then: &[],
    },
    // The SELinux dev host, enforcing (docs/SELINUX.md): the container group (its SELinux check
    // runs, no skip) and machines (the nspawn machine, machinectl and systemd-run from the
    // agent's container, NodeReboot, a VM reboot), then every kind of host operation the agent
    // performs, failing on any AVC denial.
    Pass {
        name: "selinux",
        up: &["--selinux"],
        check: &["--only", "container,machines"],
        then: &[&["selinux", "verify"]],
    },
];

/// The reports a `check` leaves in `target/harness/`, kept per pass (the next pass's `check`
/// writes over them).
const REPORTS: &[&str] = &["report.html", "check-junit.xml", "last-run.json"];

async fn end_to_end(pass: &Pass) -> anyhow::Result<()> {
    let up = pass.up.join(" ");
    eprintln!("xtask ci: end-to-end ({}): cargo xtask up {up}", pass.name);
    let mut cmd = harness("up");
    for a in pass.up {
        cmd = cmd.arg(*a);
    }
    let upped = run_inherited(&cmd).await;
    if upped.is_err() {
        let _ = run_inherited(&harness("down")).await;
        return Ok(upped?);
    }
    eprintln!(
        "xtask ci: end-to-end ({}): cargo xtask check {}",
        pass.name,
        pass.check.join(" ")
    );
    let mut cmd = harness("check");
    for a in pass.check {
        cmd = cmd.arg(*a);
    }
    let mut checked = run_inherited(&cmd).await;
    keep_reports(pass.name);
    for task in pass.then {
        eprintln!(
            "xtask ci: end-to-end ({}): cargo xtask {}",
            pass.name,
            task.join(" ")
        );
        let Some((name, args)) = task.split_first() else {
            continue;
        };
        let mut cmd = harness(name);
        for a in args {
            cmd = cmd.arg(*a);
        }
        let done = run_inherited(&cmd).await;
        if checked.is_ok() {
            checked = done;
        }
    }
    let downed = run_inherited(&harness("down")).await;
    checked?;
    Ok(downed?)
}

/// Copies the check's reports to `target/harness/ci-<name>/`; a report that is missing is
/// skipped (the check's own exit status says what went wrong).
fn keep_reports(name: &str) {
    let work = crate::project_root().join("target/harness");
    let dir = work.join(format!("ci-{name}"));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!(
            "xtask ci: cannot keep the reports in {}: {e}",
            dir.display()
        );
        return;
    }
    for f in REPORTS {
        if let Err(e) = std::fs::copy(work.join(f), dir.join(f)) {
            eprintln!("xtask ci: {f} not kept: {e}");
        }
    }
}

async fn unit() -> anyhow::Result<()> {
    eprintln!("xtask ci: cargo fmt --check");
    run_inherited(&cargo(&["fmt", "--all", "--", "--check"])).await?;
    // fuzz/ is its own workspace, outside `--all`.
    run_inherited(&cargo(&[
        "fmt",
        "--manifest-path",
        "fuzz/Cargo.toml",
        "--",
        "--check",
    ]))
    .await?;
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
    eprintln!("xtask ci: layering");
    crate::layering::check(&ProcessRunner::new()).await?;
    eprintln!("xtask ci: cargo xtask codegen --check");
    run_inherited(&crate::cargo_run("flex-codegen", &["--check".to_string()])).await?;
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
