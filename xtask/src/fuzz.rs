//! `cargo xtask fuzz [--list] [--seconds N] [TARGET...]`: the coverage-guided fuzz targets of
//! `fuzz/` (libFuzzer through `libfuzzer-sys`), built and run with stable cargo: no nightly, no
//! `cargo fuzz`. The targets are built in release with the sanitizer-coverage flags `cargo fuzz`
//! passes (for the host triple given explicitly, so build scripts and proc macros are not
//! instrumented), into `<target dir>/fuzz` (or `FUZZ_TARGET_DIR`). Each runs for N seconds
//! over a scratch corpus under that directory (where new inputs go) and the committed seeds in
//! `fuzz/corpus/<target>/` (read, never written); a crash's input is saved under
//! `<dir>/artifacts/<target>/`. The report gives each target's executions (libFuzzer's
//! `stat::number_of_executed_units`), corpus size and crashes; a crash fails the task.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flex_host::runner::{Cmd, ProcessRunner, Runner, run_inherited};

/// The targets (`fuzz/Cargo.toml`'s binaries) and what each checks beyond "no panic".
pub const TARGETS: &[(&str, &str)] = &[
    (
        "duration",
        "Go durations: parse, format, parse again gives the same; the JSON forms round-trip",
    ),
    (
        "bootstrap_env",
        "bootstrap.env: errors name a line of the file; values round-trip through both quotings; inputs render a config the agent loads",
    ),
    (
        "config",
        "the JSON config and its legacy adapter: a loaded config's serialization loads to the same",
    ),
    (
        "image_ref",
        "image references, layout sources and digests: Display parses back to the same value",
    ),
    (
        "butane",
        "Butane YAML: a parsed config renders valid, deterministic Ignition JSON (3.4.0, 3.3.0)",
    ),
    (
        "ignition_json",
        "Ignition JSON base configs: a parsed config's rendering (3.4.0, 3.3.0) reads back to the same bytes",
    ),
    (
        "bootstrap_args",
        "bootstrap arguments: accepted ones read back exactly through the bootstrap.env parser; errors echo no value",
    ),
    (
        "oci_manifest",
        "OCI manifests and indexes (with a Content-Type): a parsed document re-serializes to the same",
    ),
    (
        "registry_token",
        "registry Bearer challenges and token responses: a realm and a token are never empty",
    ),
    (
        "unpack",
        "the layer unpacker: nothing lands outside the root (sentinels beside it stay untouched)",
    ),
];

/// The flags `cargo fuzz build` gives rustc (sanitizer coverage for libFuzzer, `cfg(fuzzing)`,
/// debug assertions and overflow checks in release).
pub const RUSTFLAGS: &str = "-Cpasses=sancov-module \
-Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares \
--cfg fuzzing -Cdebug-assertions -Coverflow-checks";

/// Seconds per target when `--seconds` is not given.
pub const DEFAULT_SECONDS: u64 = 10;

/// What `cargo xtask fuzz` was asked to do.
#[derive(Debug, PartialEq, Eq)]
pub struct Args {
    /// Only list the targets.
    pub list: bool,
    /// Seconds per target.
    pub seconds: u64,
    /// The targets to run (all when empty).
    pub targets: Vec<String>,
}

/// Parses the task's arguments.
pub fn parse_args(args: &[String]) -> anyhow::Result<Args> {
    let mut out = Args {
        list: false,
        seconds: DEFAULT_SECONDS,
        targets: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--list" => out.list = true,
            "--seconds" => {
                let v = it
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("fuzz: --seconds needs a value"))?;
                out.seconds = v.parse().ok().filter(|s| *s > 0).ok_or_else(|| {
                    anyhow::anyhow!("fuzz: --seconds {v:?}: not a positive number")
                })?;
            }
            t if !t.starts_with('-') => {
                if !TARGETS.iter().any(|(n, _)| *n == t) {
                    anyhow::bail!("fuzz: unknown target {t:?} (cargo xtask fuzz --list)");
                }
                out.targets.push(t.to_string());
            }
            other => {
                anyhow::bail!("fuzz: unexpected argument {other:?} (see cargo xtask fuzz --help)")
            }
        }
    }
    Ok(out)
}

/// One target's run, read from libFuzzer's output.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// `stat::number_of_executed_units`.
    pub executions: Option<u64>,
    /// Inputs written as crashes (`Test unit written to <path>`).
    pub artifacts: Vec<String>,
}

/// Reads libFuzzer's stderr.
pub fn parse_output(stderr: &str) -> Report {
    let mut r = Report::default();
    for line in stderr.lines() {
        if let Some(v) = line.strip_prefix("stat::number_of_executed_units:") {
            r.executions = v.trim().parse().ok();
        }
        if let Some(i) = line.find("Test unit written to ") {
            r.artifacts
                .push(line[i + "Test unit written to ".len()..].trim().to_string());
        }
    }
    r
}

/// Where the instrumented build and the scratch corpora go.
fn fuzz_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FUZZ_TARGET_DIR") {
        return PathBuf::from(d);
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::project_root().join("target"))
        .join("fuzz")
}

async fn host_triple(r: &dyn Runner) -> anyhow::Result<String> {
    let out = r.run(&Cmd::new("rustc").arg("-vV")).await?;
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(|h| h.trim().to_string())
        .ok_or_else(|| anyhow::anyhow!("rustc -vV names no host triple"))
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |rd| rd.flatten().count())
}

/// Builds the targets instrumented; returns the directory holding the binaries.
pub async fn build(r: &dyn Runner) -> anyhow::Result<PathBuf> {
    let triple = host_triple(r).await?;
    let dir = fuzz_dir();
    let started = Instant::now();
    eprintln!(
        "xtask fuzz: building the targets (release, sanitizer coverage) into {}",
        dir.display()
    );
    run_inherited(
        &Cmd::new("cargo")
            .args([
                "build",
                "--release",
                "--locked",
                "--bins",
                "--manifest-path",
            ])
            .arg(
                crate::project_root()
                    .join("fuzz/Cargo.toml")
                    .to_string_lossy(),
            )
            .args(["--target", &triple])
            .env("CARGO_TARGET_DIR", dir.to_string_lossy())
            .env("RUSTFLAGS", RUSTFLAGS)
            .env("CARGO_TERM_COLOR", "never")
            .timeout(Duration::from_secs(3 * 3600)),
    )
    .await?;
    eprintln!(
        "xtask fuzz: built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(dir.join(triple).join("release"))
}

/// Builds and runs `targets` (all when empty) for `seconds` each; fails on a crash.
pub async fn run(args: &Args) -> anyhow::Result<()> {
    if args.list {
        for (name, what) in TARGETS {
            println!("{name:<15} {what}");
        }
        return Ok(());
    }
    let r = ProcessRunner::new();
    let bins = build(&r).await?;
    let dir = fuzz_dir();
    let targets: Vec<&str> = if args.targets.is_empty() {
        TARGETS.iter().map(|(n, _)| *n).collect()
    } else {
        args.targets.iter().map(String::as_str).collect()
    };
    let mut rows = Vec::new();
    let mut crashed = Vec::new();
    for t in targets {
        let seeds = crate::project_root().join("fuzz/corpus").join(t);
        let scratch = dir.join("corpus").join(t);
        let artifacts = dir.join("artifacts").join(t);
        std::fs::create_dir_all(&scratch)?;
        std::fs::create_dir_all(&artifacts)?;
        eprintln!("xtask fuzz: {t} for {} s", args.seconds);
        // New inputs go to the first corpus directory: the scratch one, never the seeds.
        let cmd = Cmd::new(bins.join(t).to_string_lossy())
            .arg(format!("-max_total_time={}", args.seconds))
            .arg("-print_final_stats=1")
            .arg("-timeout=10")
            .arg("-rss_limit_mb=2048")
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .arg(scratch.to_string_lossy())
            .arg(seeds.to_string_lossy())
            .timeout(Duration::from_secs(args.seconds + 300));
        let out = r.output(&cmd).await?;
        let report = parse_output(&out.stderr);
        let failed = !out.success() || !report.artifacts.is_empty();
        if failed {
            let tail: Vec<&str> = out.stderr.lines().rev().take(60).collect();
            eprintln!(
                "xtask fuzz: {t} failed ({:?}):\n{}",
                out.code,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
            crashed.push(format!(
                "{t} ({})",
                if report.artifacts.is_empty() {
                    "no artifact written".to_string()
                } else {
                    report.artifacts.join(", ")
                }
            ));
        }
        rows.push(format!(
            "{t:<15} {:>12} {:>8} {:>8}   {}",
            report
                .executions
                .map_or_else(|| "?".to_string(), |e| e.to_string()),
            count_files(&seeds),
            count_files(&scratch),
            if failed { "CRASH" } else { "ok" }
        ));
    }
    println!(
        "{:<15} {:>12} {:>8} {:>8}   result",
        "target", "executions", "seeds", "corpus"
    );
    for row in rows {
        println!("{row}");
    }
    if !crashed.is_empty() {
        anyhow::bail!(
            "fuzz: crashes in {} (run the target's binary in {} on the artifact to reproduce)",
            crashed.join("; "),
            bins.display()
        );
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a panic is a failure
mod tests {
    use super::*;

    #[test]
    fn parse_args_reads_list_seconds_and_targets() {
        let a = |v: &[&str]| parse_args(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            a(&[]).unwrap(),
            Args {
                list: false,
                seconds: DEFAULT_SECONDS,
                targets: vec![]
            }
        );
        assert_eq!(
            a(&["--seconds", "3", "unpack", "config"]).unwrap(),
            Args {
                list: false,
                seconds: 3,
                targets: vec!["unpack".into(), "config".into()]
            }
        );
        assert!(a(&["--list"]).unwrap().list);
        assert!(a(&["--seconds", "0"]).is_err());
        assert!(a(&["--seconds"]).is_err());
        assert!(a(&["nope"]).is_err());
        assert!(a(&["--bogus"]).is_err());
    }

    #[test]
    fn parse_output_reads_final_stats_and_artifacts() {
        let stderr = "INFO: Seed: 1\n#2\tINITED cov: 10\n==1== ERROR: libFuzzer: deadly signal\nartifact_prefix='/t/a/'; Test unit written to /t/a/crash-abc\nstat::number_of_executed_units: 12345\nstat::average_exec_per_sec:     1234\n";
        assert_eq!(
            parse_output(stderr),
            Report {
                executions: Some(12345),
                artifacts: vec!["/t/a/crash-abc".into()]
            }
        );
        assert_eq!(parse_output(""), Report::default());
    }

    #[test]
    fn every_target_is_a_binary_of_the_fuzz_crate_with_seeds() {
        let root = crate::project_root();
        let manifest = std::fs::read_to_string(root.join("fuzz/Cargo.toml")).unwrap_or_default();
        for (t, _) in TARGETS {
            assert!(
                manifest.contains(&format!("name = \"{t}\"")),
                "{t} is not a [[bin]] of fuzz/Cargo.toml"
            );
            assert!(
                count_files(&root.join("fuzz/corpus").join(t)) > 0,
                "{t} has no committed seeds"
            );
        }
    }
}
