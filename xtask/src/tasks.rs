//! The task table of `cargo xtask`: which tasks there are, which of them run `flex-harness`
//! ([`HARNESS_TASKS`]) and the parsing of xtask's own tasks' flags, pure, in one place that the
//! dispatcher (`main.rs`) and the workflows test (`tests/tests/workflows.rs`) both use, so a
//! workflow cannot call a task or flag the dispatcher would refuse.

use crate::fuzz;

/// `cargo xtask --help`.
pub const USAGE: &str = "\
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
  backports [--write]           The apt source of <codename>-backports: this machine's own Debian
                                source (its URIs and keyring), the suite changed (--write adds
                                it to /etc/apt/sources.list.d unless one is configured)
  codegen [--check]             Regenerate the committed generated files (or fail if stale)
  image [FLAGS]                 Build the agent's (or --controller) container image, no engine
  up [FLAGS]                    Boot the dev host (or ACL) under QEMU with the agent bootstrapped
  check [FLAGS]                 Run the check groups against the VM `up` started
  down                          Remove the VM, its disks and the registry
  ssh [-- CMD...]               A root shell in the VM (or CMD, as root)
  console                       Follow the VM's serial console (Ctrl-C ends)
  journal [UNIT...] [FLAGS]     The VM's journal (the agent's units and machines by default)
  selinux repro|verify          Every kind of host operation the agent performs, from its
                                container, with results and AVC denials (up --selinux first;
                                verify fails on any; docs/SELINUX.md)
  bench [FLAGS]                 Measure image sizes, memory and recovery times as medians and
                                compare them with bench/baseline.json (docs/bench.md)
  fleet [--nodes N] [--operations M] [--budget K] [--no-selector] [--kubeconfig FILE] [--json]
                                N simulated nodes running the daemon's own operations, drain and
                                budget code, a burst of M NodeReboots: API cost per node, most
                                nodes disrupted at once, burst time (docs/drain.md)

Each task installs the Debian packages it needs first (as root on Debian; otherwise it names
them). `cargo xtask <TASK> --help` shows a task's flags.";

/// The tasks `cargo xtask` hands to the `flex-harness` binary, with their flags; the harness's
/// clap definitions (`flex_harness::cli`) parse those flags.
pub const HARNESS_TASKS: &[&str] = &[
    "up", "check", "down", "image", "ssh", "console", "journal", "selinux", "bench",
];

/// `cargo xtask codegen`'s flags (`flex-codegen` parses them again).
pub const CODEGEN_FLAGS: &[&str] = &["--check"];

/// A parsed `cargo xtask <TASK> [FLAGS]`.
#[derive(Debug, PartialEq, Eq)]
pub enum Task {
    /// `ci`.
    Ci {
        /// Install the Debian packages first.
        install: bool,
        /// Run each fuzz target briefly.
        fuzz: bool,
        /// Run the offline end-to-end check.
        e2e: bool,
    },
    /// `fuzz`.
    Fuzz(fuzz::Args),
    /// `layering`.
    Layering,
    /// `backports`: print the `-backports` apt source (and add it, with `write`).
    Backports {
        /// Add it to `/etc/apt/sources.list.d` unless one is configured.
        write: bool,
    },
    /// `codegen`, with its flags.
    Codegen(Vec<String>),
    /// `fleet`, with its flags (`flex-fleet` parses them).
    Fleet(Vec<String>),
    /// A [`HARNESS_TASKS`] task: `flex-harness`'s whole argument list (the task first).
    Harness(Vec<String>),
    /// `--help` of an own task: its usage text.
    Help(String),
}

/// Parses `task` and its flags `rest` as the dispatcher runs them. Harness tasks' flags are
/// passed on unparsed: `flex-harness` parses them.
pub fn parse(task: &str, rest: &[String]) -> anyhow::Result<Task> {
    let help = rest.iter().any(|a| a == "--help" || a == "-h");
    match task {
        "ci" if help => Ok(Task::Help(format!(
            "Usage: cargo xtask ci [--no-install] [--no-fuzz] [--no-e2e]\n\n  --no-install  Skip installing system packages\n  --no-fuzz     Skip the short fuzzing run (cargo xtask fuzz --seconds {})\n  --no-e2e      Skip the offline end-to-end check (up, check, down on the dev host)",
            crate::ci::FUZZ_SECONDS
        ))),
        "ci" => {
            let (mut install, mut fuzz, mut e2e) = (true, true, true);
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
            Ok(Task::Ci { install, fuzz, e2e })
        }
        "fuzz" if help => Ok(Task::Help(format!(
            "Usage: cargo xtask fuzz [--list] [--seconds N] [TARGET...]\n\n  --list       List the targets and what each checks\n  --seconds N  Run each target N seconds (default {})\n  TARGET       Only these targets\n\nBuilds with stable cargo (no nightly, no cargo-fuzz) into $CARGO_TARGET_DIR/fuzz or $FUZZ_TARGET_DIR. See docs/fuzzing.md.",
            fuzz::DEFAULT_SECONDS
        ))),
        "fuzz" => Ok(Task::Fuzz(fuzz::parse_args(rest)?)),
        "fleet" => Ok(Task::Fleet(rest.to_vec())),
        "layering" => match rest.first() {
            None => Ok(Task::Layering),
            Some(a) => anyhow::bail!("layering: unexpected argument {a:?}"),
        },
        "backports" if help => Ok(Task::Help(
            "Usage: cargo xtask backports [--write]\n\nPrints the apt source of <codename>-backports derived from this machine's own\nDebian source (its URIs and keyring; deb.debian.org only when it has none).\n\n  --write  Add it as /etc/apt/sources.list.d/<codename>-backports.sources unless a\n           source of that suite is configured (root)".to_string(),
        )),
        "backports" => match rest {
            [] => Ok(Task::Backports { write: false }),
            [w] if w == "--write" => Ok(Task::Backports { write: true }),
            _ => anyhow::bail!(
                "backports: unexpected arguments {rest:?} (usage: cargo xtask backports [--write])"
            ),
        },
        "codegen" => {
            if let Some(a) = rest
                .iter()
                .find(|a| !help && !CODEGEN_FLAGS.contains(&a.as_str()))
            {
                anyhow::bail!(
                    "codegen: unexpected argument {a:?} (usage: cargo xtask codegen [--check])"
                );
            }
            Ok(Task::Codegen(rest.to_vec()))
        }
        t if HARNESS_TASKS.contains(&t) => {
            let mut args = vec![t.to_string()];
            args.extend(rest.iter().cloned());
            Ok(Task::Harness(args))
        }
        other => anyhow::bail!("unknown task {other:?}\n\n{USAGE}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(argv: &[&str]) -> anyhow::Result<Task> {
        let rest: Vec<String> = argv[1..].iter().map(|s| s.to_string()).collect();
        parse(argv[0], &rest)
    }

    #[test]
    fn own_tasks_and_their_flags() {
        assert_eq!(
            p(&["ci", "--no-install", "--no-e2e"]).unwrap(),
            Task::Ci {
                install: false,
                fuzz: true,
                e2e: false
            }
        );
        assert!(p(&["ci", "--e2e"]).is_err());
        assert!(matches!(p(&["ci", "--help"]).unwrap(), Task::Help(_)));
        assert!(matches!(
            p(&["fuzz", "--seconds", "5"]).unwrap(),
            Task::Fuzz(a) if a.seconds == 5
        ));
        assert!(p(&["fuzz", "--seconds"]).is_err());
        assert_eq!(p(&["layering"]).unwrap(), Task::Layering);
        assert!(p(&["layering", "--x"]).is_err());
        assert_eq!(p(&["backports"]).unwrap(), Task::Backports { write: false });
        assert_eq!(
            p(&["backports", "--write"]).unwrap(),
            Task::Backports { write: true }
        );
        assert!(p(&["backports", "--write", "--write"]).is_err());
        assert!(p(&["backports", "bookworm"]).is_err());
        assert_eq!(
            p(&["codegen", "--check"]).unwrap(),
            Task::Codegen(vec!["--check".into()])
        );
        assert!(p(&["codegen", "--force"]).is_err());
        assert!(
            p(&["bogus"])
                .unwrap_err()
                .to_string()
                .contains("unknown task \"bogus\"")
        );
    }

    /// `fleet`'s flags go to `flex-fleet` as given (its clap parses them), `--help` too.
    #[test]
    fn fleet_passes_its_flags_on() {
        assert_eq!(
            p(&["fleet", "--nodes", "50", "--no-selector"]).unwrap(),
            Task::Fleet(vec!["--nodes".into(), "50".into(), "--no-selector".into()])
        );
        assert_eq!(
            p(&["fleet", "--help"]).unwrap(),
            Task::Fleet(vec!["--help".into()])
        );
        assert!(USAGE.contains("\n  fleet "));
    }

    /// Harness tasks go to `flex-harness` whole, the task first, `--` and all.
    #[test]
    fn harness_tasks_pass_their_flags_on() {
        assert_eq!(
            p(&["ssh", "--", "systemctl", "status"]).unwrap(),
            Task::Harness(vec![
                "ssh".into(),
                "--".into(),
                "systemctl".into(),
                "status".into()
            ])
        );
        assert_eq!(
            p(&["up", "--cluster"]).unwrap(),
            Task::Harness(vec!["up".into(), "--cluster".into()])
        );
        for t in HARNESS_TASKS {
            assert!(USAGE.contains(&format!("\n  {t} ")), "USAGE lists {t}");
        }
    }
}
