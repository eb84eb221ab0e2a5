//! `cargo xtask bench`: measures, in one run, the figures users choose a node agent by, each as
//! the median of several tries with its spread ([`flex_harness::bench`]), writes
//! `target/bench/bench.json` and a table, and compares with the committed baseline
//! (`bench/baseline.json`) as ratios, naming regressions. It never fails on a figure: one it
//! cannot measure says why, and the others are still written.
//!
//! - On the host: the agent image (compressed and unpacked, against its budget), its release
//!   binary, the controller image, the image's assembly (binary already built), and our layer
//!   unpacker against `tar -x` of the same layer (the machine rootfs fixture), as a ratio.
//! - In the VM `cargo xtask up` started (none: those figures say so): the daemon's idle
//!   resident memory (budget 12 MB), the agent unit's restart to `daemon ready`, and dev host
//!   boot to SSH (from `up`'s own timing).
//! - From the last `cargo xtask check` ([`flex_harness::artefacts::LastRun`]): AgentUpgrade to
//!   the new agent running, a broken candidate's rollback, NodeReboot to the machine running
//!   again, and each group's snapshot restore.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use flex_harness::bench::{Bench, Figure, Unit, render_table};
use flex_harness::ssh::Guest;
use flex_host::runner::{Cmd, ProcessRunner, Runner};

/// The daemon's idle resident memory budget.
pub const DAEMON_RSS_BUDGET: f64 = 12e6;
/// The target for a broken candidate's rollback under TCG.
pub const ROLLBACK_TARGET_S: f64 = 30.0;

/// `bench`'s options.
pub struct BenchOptions {
    /// Tries per measured figure.
    pub tries: usize,
    /// Skip the VM's figures.
    pub no_vm: bool,
    /// The baseline to compare with.
    pub baseline: PathBuf,
    /// Write this run as the baseline too.
    pub write_baseline: bool,
}

/// Runs the bench.
pub async fn run(o: BenchOptions) -> anyhow::Result<()> {
    let root = crate::project_root();
    let r = ProcessRunner::new();
    let tries = o.tries.max(1);
    let mut figures = Vec::new();
    host_figures(&r, &root, tries, &mut figures).await;
    let work = crate::vm::work_dir();
    let state = if o.no_vm {
        Err("--no-vm".to_string())
    } else {
        match flex_harness::state::State::load(&work) {
            Ok(Some(s)) => Ok(s),
            Ok(None) => Err("no VM: run `cargo xtask up` first".to_string()),
            Err(e) => Err(format!("the VM's state is unreadable: {e:#}")),
        }
    };
    let accel = state.as_ref().ok().map(|s| s.accel.clone());
    vm_figures(&r, state.as_ref(), tries, &mut figures).await;
    check_figures(&work, &mut figures);

    let revision = r
        .output(
            &Cmd::new("git")
                .arg("-C")
                .arg(root.display().to_string())
                .args(["describe", "--always", "--dirty"])
                .timeout(Duration::from_secs(30)),
        )
        .await
        .map(|o| o.stdout.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let bench = Bench::new(&revision, accel, figures);
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
    let text = serde_json::to_string_pretty(&bench)?;
    write(&out.join("bench.json"), &text)?;
    let baseline = match std::fs::read_to_string(&o.baseline) {
        Ok(t) => match Bench::parse(&t) {
            Ok(b) => Some(b),
            Err(e) => {
                eprintln!("bench: {} ignored: {e:#}", o.baseline.display());
                None
            }
        },
        Err(e) => {
            eprintln!("bench: no baseline {}: {e}", o.baseline.display());
            None
        }
    };
    println!("{}", render_table(&bench, baseline.as_ref()));
    println!(
        "bench: {} (revision {}, {})",
        out.join("bench.json").display(),
        bench.revision,
        bench.accel.as_deref().unwrap_or("no VM")
    );
    if o.write_baseline {
        write(&o.baseline, &text)?;
        println!("bench: baseline written to {}", o.baseline.display());
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, format!("{text}\n"))
        .with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))?;
    Ok(())
}

/// `f` timed `tries` times; the first error ends it.
async fn timed<F, Fut>(tries: usize, mut f: F) -> anyhow::Result<Vec<f64>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut v = Vec::with_capacity(tries);
    for _ in 0..tries {
        let t = Instant::now();
        f().await?;
        v.push(t.elapsed().as_secs_f64());
    }
    Ok(v)
}

async fn host_figures(r: &dyn Runner, root: &Path, tries: usize, figs: &mut Vec<Figure>) {
    use flex_image::agent::{AGENT_BUDGET, build_agent_image};
    let out = root.join("target/image");
    match crate::image::build(&out).await {
        Ok((info, binary, opts)) => {
            figs.push(
                Figure::measured(
                    "image.compressed",
                    "agent image, compressed",
                    Unit::Bytes,
                    vec![info.compressed_size as f64],
                )
                .with_budget(AGENT_BUDGET.compressed as f64),
            );
            figs.push(
                Figure::measured(
                    "image.unpacked",
                    "agent image, unpacked",
                    Unit::Bytes,
                    vec![info.uncompressed_size as f64],
                )
                .with_budget(AGENT_BUDGET.unpacked as f64),
            );
            let size = std::fs::metadata(&binary).map(|m| m.len() as f64);
            figs.push(match size {
                Ok(s) => {
                    Figure::measured("binary.size", "agent release binary", Unit::Bytes, vec![s])
                }
                Err(e) => Figure::missing(
                    "binary.size",
                    "agent release binary",
                    Unit::Bytes,
                    e.to_string(),
                ),
            });
            let assembly = timed(tries, || {
                let (binary, opts) = (binary.clone(), opts.clone());
                async move {
                    let tmp = tempfile::tempdir()?;
                    build_agent_image(&binary, tmp.path(), &opts).await?;
                    Ok(())
                }
            })
            .await;
            figs.push(match assembly {
                Ok(v) => Figure::measured(
                    "image.assembly",
                    "agent image assembly (binary built)",
                    Unit::Seconds,
                    v,
                ),
                Err(e) => Figure::missing(
                    "image.assembly",
                    "agent image assembly (binary built)",
                    Unit::Seconds,
                    format!("{e:#}"),
                ),
            });
        }
        Err(e) => {
            let why = format!("the agent image did not build: {e:#}");
            for (id, what, unit) in [
                ("image.compressed", "agent image, compressed", Unit::Bytes),
                ("image.unpacked", "agent image, unpacked", Unit::Bytes),
                ("binary.size", "agent release binary", Unit::Bytes),
                (
                    "image.assembly",
                    "agent image assembly (binary built)",
                    Unit::Seconds,
                ),
            ] {
                figs.push(Figure::missing(id, what, unit, why.clone()));
            }
        }
    }
    figs.push(match controller_image_size(&out).await {
        Ok(s) => Figure::measured(
            "controller.image",
            "controller image archive",
            Unit::Bytes,
            vec![s],
        ),
        Err(e) => Figure::missing(
            "controller.image",
            "controller image archive",
            Unit::Bytes,
            format!("{e:#}"),
        ),
    });
    figs.push(match unpack_ratio(r, tries).await {
        Ok(v) => Figure::measured(
            "unpack.ratio",
            "layer unpack, ours / tar -x (machine rootfs)",
            Unit::Ratio,
            v,
        ),
        Err(e) => Figure::missing(
            "unpack.ratio",
            "layer unpack, ours / tar -x (machine rootfs)",
            Unit::Ratio,
            format!("{e:#}"),
        ),
    });
}

async fn controller_image_size(out: &Path) -> anyhow::Result<f64> {
    let (binary, epoch, revision) = crate::image::controller_binary().await?;
    let libraries = flex_image::agent::shared_libraries(&binary).await?;
    let (_, _, archive) = crate::image::build_controller_image(
        &binary,
        &libraries,
        Path::new(flex_image::agent::CA_BUNDLE),
        out,
        epoch,
        Some(&revision),
    )?;
    Ok(std::fs::metadata(&archive)?.len() as f64)
}

/// Per try, our unpacker's time over `tar -xzf`'s on the same gzip layer of the machine rootfs
/// fixture (packed once with `tar -czf`), each into a fresh directory.
async fn unpack_ratio(r: &dyn Runner, tries: usize) -> anyhow::Result<Vec<f64>> {
    let cache = flex_harness::devhost::default_cache_root();
    let tree =
        flex_harness::fixtures::machine_rootfs_dir(&cache, &flex_harness::devhost::host_archive()?);
    if !tree.is_dir() {
        anyhow::bail!(
            "no machine rootfs fixture at {} (`cargo xtask up` builds it)",
            tree.display()
        );
    }
    let scratch = tempfile::tempdir_in(crate::project_root().join("target"))?;
    let layer = scratch.path().join("layer.tar.gz");
    r.run(
        &Cmd::new("tar")
            .args(["--numeric-owner", "--xattrs", "-C"])
            .arg(tree.display().to_string())
            .args(["-czf"])
            .arg(layer.display().to_string())
            .arg(".")
            .timeout(Duration::from_secs(900)),
    )
    .await?;
    let mut ratios = Vec::with_capacity(tries);
    for i in 0..tries {
        let ours_dir = scratch.path().join(format!("ours-{i}"));
        let tar_dir = scratch.path().join(format!("tar-{i}"));
        std::fs::create_dir_all(&ours_dir)?;
        std::fs::create_dir_all(&tar_dir)?;
        let t = Instant::now();
        let blob = std::fs::File::open(&layer)?;
        flex_oci::unpack::unpack_layer(
            &ours_dir,
            "bench-layer",
            std::io::BufReader::new(blob),
            &flex_oci::unpack::UnpackOptions::default(),
        )?;
        let ours = t.elapsed().as_secs_f64();
        let t = Instant::now();
        r.run(
            &Cmd::new("tar")
                .args(["--numeric-owner", "--xattrs", "-C"])
                .arg(tar_dir.display().to_string())
                .args(["-xzf"])
                .arg(layer.display().to_string())
                .timeout(Duration::from_secs(900)),
        )
        .await?;
        let tar = t.elapsed().as_secs_f64();
        ratios.push(ours / tar);
        let _ = std::fs::remove_dir_all(&ours_dir);
        let _ = std::fs::remove_dir_all(&tar_dir);
    }
    Ok(ratios)
}

/// The awk condition of the daemon's line in `ps -o rss=,args=` output: the process whose
/// first argument ends in `aks-flex-node` and whose second is `daemon` or `agent`.
const DAEMON_LINE: &str = r#"$2 ~ /aks-flex-node$/ && ($3 == "daemon" || $3 == "agent")"#;

/// The guest script printing the daemon's resident set in KiB.
pub fn daemon_rss_script() -> String {
    format!("ps -eo rss=,args= | awk '{DAEMON_LINE} {{ print $1; exit }}'")
}

/// The awk program summing, in KiB, the `ps -o rss=,args=` lines that are not the daemon's.
pub fn beside_daemon_awk() -> String {
    format!("!({DAEMON_LINE}) {{ s += $1 }} END {{ print s + 0 }}")
}

/// The guest script's start: `$pids`, the processes of `aks-flex-node-agent.service`'s cgroup
/// (comma-separated; it prints 0 and exits when there are none).
const UNIT_PIDS: &str = r#"cg=$(systemctl show -p ControlGroup --value aks-flex-node-agent.service)
procs="/sys/fs/cgroup$cg/cgroup.procs"
[ -n "$cg" ] && [ -r "$procs" ] || { echo "no cgroup for aks-flex-node-agent.service" >&2; exit 1; }
pids=$(paste -sd, "$procs")
[ -n "$pids" ] || { echo 0; exit 0; }
"#;

/// The guest script printing, in KiB, the resident memory the agent's unit keeps beside the
/// daemon: every process in `aks-flex-node-agent.service`'s cgroup but the daemon. In image
/// mode that is the unit's main process, `wait-task` (before #33 item 4: the `ctr run` client
/// attached to the container for its whole life); the daemon itself runs in the container's
/// scope, `aks-flex-agent.scope`. In host mode the daemon is the unit's one process, so 0.
/// RSS counts the pages of the binary `wait-task` shares with the daemon (the same file of the
/// same image) in full: [`unit_private_script`] is what the process alone holds.
pub fn unit_rss_script() -> String {
    format!(
        "{UNIT_PIDS}ps -o rss=,args= -p \"$pids\" | awk '{}'",
        beside_daemon_awk()
    )
}

/// The guest script printing, in KiB, the anonymous resident memory (`RssAnon`) of the same
/// processes as [`unit_rss_script`]: memory no other process shares, which stopping them would
/// free.
pub fn unit_private_script() -> String {
    format!(
        "{UNIT_PIDS}for p in $(ps -o pid=,args= -p \"$pids\" | awk '!({DAEMON_LINE}) {{ print $1 }}'); do awk '/^RssAnon:/ {{ print $2 }}' /proc/$p/status; done | awk '{{ s += $1 }} END {{ print s + 0 }}'"
    )
}

/// The guest script that restarts the agent's unit and prints the seconds from the restart to
/// the daemon's `daemon starting` line (journal timestamps), or nothing after 300 s. Offline the
/// daemon never logs `daemon ready` (that needs the cluster), so its start is what is timed.
pub const AGENT_READY_SCRIPT: &str = r#"t0=$(date +%s.%N)
systemctl restart aks-flex-node-agent.service
for i in $(seq 1 300); do
  t1=$(journalctl -u aks-flex-node-agent.service --since "@${t0%.*}" -o short-unix --no-pager | grep -m1 'daemon starting' | cut -d' ' -f1)
  if [ -n "$t1" ]; then echo "$t0 $t1"; exit 0; fi
  sleep 1
done
exit 1"#;

/// The guest script that requests a node-local repave where the agent runs (`cmd`, from
/// [`flex_harness::kit::agent::agent_command`]) and prints the Unix times of the request and of the
/// command's return (the new side's kubelet active, the old side removed: the repave's `start`
/// waits for kubelet and its `cleaning` removes the old side before the command returns); it
/// then checks both and fails saying which did not hold.
pub fn repave_script(cmd: &str) -> String {
    format!(
        r#"t0=$(date +%s.%N)
{cmd} >&2 || {{ echo "the repave failed" >&2; exit 1; }}
t1=$(date +%s.%N)
m=$(sed -n 's/.*"activeMachine": *"\([^"]*\)".*/\1/p' /etc/aks-flex-node/daemon-state.json)
if [ "$m" = kube1 ]; then o=kube2; else o=kube1; fi
k=$(timeout 60 systemd-run --machine="$m" --pipe --wait --quiet systemctl is-active kubelet.service 2>/dev/null)
[ "$k" = active ] || {{ echo "kubelet in $m is ${{k:-unknown}} after the repave" >&2; exit 2; }}
[ -z "$(machinectl show "$o" -p State --value 2>/dev/null)" ] || {{ echo "the old side $o still runs after the repave" >&2; exit 2; }}
test ! -e "/var/lib/machines/$o" || {{ echo "the old side's tree /var/lib/machines/$o is still there" >&2; exit 2; }}
echo "$t0 $t1""#
    )
}

/// Seconds from `t0 t1` (two Unix times) as the ready script prints them.
pub fn parse_span(out: &str) -> Option<f64> {
    let mut it = out.split_whitespace();
    let t0: f64 = it.next()?.parse().ok()?;
    let t1: f64 = it.next()?.parse().ok()?;
    (t1 >= t0).then_some(t1 - t0)
}

/// A memory figure from `script` (a number of KiB) run `tries.max(5)` times, 2 s apart; the
/// figure is missing with `absent` (and what the guest printed) when the first answer is not a
/// number.
async fn kib_figure(
    g: &Guest<'_>,
    script: &str,
    tries: usize,
    (id, what): (&str, &str),
    absent: &str,
) -> Figure {
    let mut kib = Vec::new();
    let mut err = None;
    for _ in 0..tries.max(5) {
        match g.sh(script).await {
            Ok(out) => match out.trim().parse::<f64>() {
                Ok(v) => kib.push(v * 1024.0),
                Err(_) => {
                    err = Some(format!("{absent} ({out:?})"));
                    break;
                }
            },
            Err(e) => {
                err = Some(format!("{e:#}"));
                break;
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    match err {
        Some(why) if kib.is_empty() => Figure::missing(id, what, Unit::Bytes, why),
        _ => Figure::measured(id, what, Unit::Bytes, kib),
    }
}

async fn vm_figures(
    r: &dyn Runner,
    state: Result<&flex_harness::state::State, &String>,
    tries: usize,
    figs: &mut Vec<Figure>,
) {
    const RSS: (&str, &str) = ("vm.daemon_rss", "daemon idle RSS");
    const UNIT_RSS: (&str, &str) = (
        "vm.unit_rss",
        "the agent unit's resident memory beside the daemon",
    );
    const UNIT_PRIVATE: (&str, &str) = (
        "vm.unit_private",
        "the agent unit's anonymous memory beside the daemon",
    );
    const READY: (&str, &str) = ("vm.agent_start", "agent unit restart to daemon started");
    const BOOT: (&str, &str) = ("vm.boot_ssh", "dev host first boot to SSH");
    const REPAVE: (&str, &str) = (
        "vm.repave_offline",
        "offline repave (request to the new side's kubelet active, the old side removed)",
    );
    let s = match state {
        Ok(s) => s,
        Err(why) => {
            figs.push(
                Figure::missing(RSS.0, RSS.1, Unit::Bytes, why.clone())
                    .with_budget(DAEMON_RSS_BUDGET),
            );
            figs.push(Figure::missing(
                UNIT_RSS.0,
                UNIT_RSS.1,
                Unit::Bytes,
                why.clone(),
            ));
            figs.push(Figure::missing(
                UNIT_PRIVATE.0,
                UNIT_PRIVATE.1,
                Unit::Bytes,
                why.clone(),
            ));
            figs.push(Figure::missing(
                READY.0,
                READY.1,
                Unit::Seconds,
                why.clone(),
            ));
            figs.push(Figure::missing(BOOT.0, BOOT.1, Unit::Seconds, why.clone()));
            figs.push(Figure::missing(
                REPAVE.0,
                REPAVE.1,
                Unit::Seconds,
                why.clone(),
            ));
            return;
        }
    };
    let g = Guest::new(r, &s.ssh);
    // Ready first: the RSS is sampled once the restarted daemon has settled.
    let mut ready = Vec::new();
    let mut ready_err = None;
    for _ in 0..tries {
        match g.output(AGENT_READY_SCRIPT, Duration::from_secs(420)).await {
            Ok(o) => match parse_span(&o.stdout) {
                Some(v) => ready.push(v),
                None => {
                    ready_err = Some(format!(
                        "no `daemon starting` within 300 s of the restart (exit {:?}, {})",
                        o.code,
                        o.stderr.trim()
                    ));
                    break;
                }
            },
            Err(e) => {
                ready_err = Some(format!("{e:#}"));
                break;
            }
        }
    }
    figs.push(match ready_err {
        Some(why) if ready.is_empty() => Figure::missing(READY.0, READY.1, Unit::Seconds, why),
        _ => Figure::measured(READY.0, READY.1, Unit::Seconds, ready),
    });
    tokio::time::sleep(Duration::from_secs(30)).await;
    figs.push(
        kib_figure(
            &g,
            &daemon_rss_script(),
            tries,
            RSS,
            "no daemon process in the guest",
        )
        .await
        .with_budget(DAEMON_RSS_BUDGET),
    );
    figs.push(kib_figure(&g, &unit_rss_script(), tries, UNIT_RSS, "no unit cgroup").await);
    figs.push(
        kib_figure(
            &g,
            &unit_private_script(),
            tries,
            UNIT_PRIVATE,
            "no unit cgroup",
        )
        .await,
    );
    // One sample: a repave provisions a whole machine side (minutes under TCG). The node is
    // left on the other side, as a repave leaves it.
    let cmd = flex_harness::kit::agent::agent_command(
        s.mode,
        "aks-flex-node repave --settings-version bench-$(date +%s)",
    );
    figs.push(
        match g
            .output(&repave_script(&cmd), Duration::from_secs(1200))
            .await
        {
            Ok(o) => match parse_span(&o.stdout) {
                Some(v) if o.success() => {
                    Figure::measured(REPAVE.0, REPAVE.1, Unit::Seconds, vec![v])
                }
                _ => Figure::missing(
                    REPAVE.0,
                    REPAVE.1,
                    Unit::Seconds,
                    format!(
                        "the repave did not complete (exit {:?}): {}",
                        o.code,
                        o.stderr.trim().lines().last().unwrap_or_default()
                    ),
                ),
            },
            Err(e) => Figure::missing(REPAVE.0, REPAVE.1, Unit::Seconds, format!("{e:#}")),
        },
    );
    figs.push(
        match s.timings.iter().find(|(n, _)| n == "first boot") {
            Some((_, secs)) => Figure::measured(BOOT.0, BOOT.1, Unit::Seconds, vec![*secs]),
            None => Figure::missing(
                BOOT.0,
                BOOT.1,
                Unit::Seconds,
                "`up` recorded no first-boot time",
            ),
        }
        .from_source(format!("cargo xtask up ({})", s.accel)),
    );
}

/// The figures of the last `check` ([`flex_harness::artefacts::LastRun`]); the rollback is
/// held to its target.
fn check_figures(work: &Path, figs: &mut Vec<Figure>) {
    let last = flex_harness::artefacts::LastRun::load(work);
    let groups: Option<Vec<_>> = match &last {
        Ok(Some(l)) => Some(l.groups.iter().map(|g| g.times()).collect()),
        _ => None,
    };
    if let Err(e) = &last {
        eprintln!("bench: the last check run is unreadable: {e:#}");
    }
    let source = format!(
        "the last cargo xtask check ({})",
        work.join(flex_harness::artefacts::LAST_RUN).display()
    );
    for f in flex_harness::bench::figures_from_checks(groups.as_deref(), &source) {
        figs.push(if f.id == "vm.rollback" {
            f.with_budget(ROLLBACK_TARGET_S)
        } else {
            f
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_span_is_read_from_two_unix_times() {
        assert_eq!(parse_span("1700000000.25 1700000003.75\n"), Some(3.5));
        assert_eq!(parse_span(""), None);
        assert_eq!(parse_span("1700000003 1700000000"), None);
        assert_eq!(parse_span("x y"), None);
    }

    /// The repave script for real in `sh` (no guest: the repave command is `false`).
    #[tokio::test]
    async fn the_repave_script_parses_and_times_nothing_when_the_repave_fails() {
        let run = |script: String| async move {
            ProcessRunner::new()
                .output(
                    &Cmd::new("sh")
                        .args(["-c", &script])
                        .timeout(Duration::from_secs(10)),
                )
                .await
                .unwrap()
        };
        let script = repave_script("aks-flex-node repave --settings-version v2");
        assert!(script.contains("\naks-flex-node repave --settings-version v2 >&2"));
        // The active machine is read from the daemon state's record (the first bench run on
        // the VM read nothing: a control character stood where the sed's `\1` belongs).
        let line = script
            .lines()
            .find(|l| l.starts_with("m=$(sed"))
            .unwrap()
            .replace("/etc/aks-flex-node/daemon-state.json", "\"$f\"");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("state.json");
        std::fs::write(
            &f,
            "{\n  \"format\": \"aks-flex-node.record/v1\",\n  \"payload\": {\n    \"activeMachine\": \"kube2\"\n  }\n}\n",
        )
        .unwrap();
        let probe = run(format!("f={}; {line}; echo \"$m\"", f.display())).await;
        assert_eq!(probe.stdout.trim(), "kube2", "{probe:?}");
        let parsed = ProcessRunner::new()
            .output(
                &Cmd::new("sh")
                    .arg("-n")
                    .stdin(script.as_str())
                    .timeout(Duration::from_secs(10)),
            )
            .await
            .unwrap();
        assert!(parsed.success(), "{}", parsed.stderr);
        let failed = run(repave_script("false")).await;
        assert_eq!(failed.code, Some(1));
        assert!(
            failed.stderr.contains("the repave failed"),
            "{}",
            failed.stderr
        );
        assert_eq!(parse_span(&failed.stdout), None);
    }

    /// Real: `awk` on this machine (ps's output given on stdin). The unit's memory beside the
    /// daemon sums every line but the daemon's: the `ctr run` client in image mode, nothing in
    /// host mode (the daemon is the unit's one process).
    #[tokio::test]
    async fn the_unit_script_sums_what_is_beside_the_daemon() {
        let awk = |ps: &'static str| {
            let program = beside_daemon_awk();
            async move {
                ProcessRunner::new()
                    .run(
                        &Cmd::new("awk")
                            .arg(program)
                            .stdin(ps)
                            .timeout(Duration::from_secs(10)),
                    )
                    .await
                    .unwrap()
                    .stdout
                    .trim()
                    .to_string()
            }
        };
        let before = "24380 /usr/bin/ctr -n aks-flex run --rm --privileged aks-flex-agent /opt/aks-flex-node/bin/entrypoint aks-flex-node agent --config /etc/aks-flex-node/config.json\n";
        assert_eq!(awk(before).await, "24380");
        let image = "6996 /proc/808/root/opt/aks-flex-node/bin/aks-flex-node wait-task -n aks-flex aks-flex-agent\n";
        assert_eq!(awk(image).await, "6996");
        let host = "11780 /usr/local/lib/aks-flex-node/current/aks-flex-node agent --config /etc/aks-flex-node/config.json\n";
        assert_eq!(awk(host).await, "0");
        assert_eq!(awk("").await, "0");
        assert!(unit_rss_script().contains(&beside_daemon_awk()));
    }

    /// Real: `sh`, `ps` and `awk` on this machine, the cgroup lookup replaced by this test's
    /// own PID: the private-memory script reads `RssAnon` of the processes beside the daemon
    /// (here the test process itself, which is no daemon), and parses as shell.
    #[tokio::test]
    async fn the_private_memory_script_reads_rss_anon() {
        let me = std::process::id();
        let script = unit_private_script().replace(UNIT_PIDS, &format!("pids={me}\n"));
        let out = ProcessRunner::new()
            .run(
                &Cmd::new("sh")
                    .args(["-c", &script])
                    .timeout(Duration::from_secs(10)),
            )
            .await
            .unwrap();
        let want = std::fs::read_to_string(format!("/proc/{me}/status"))
            .unwrap()
            .lines()
            .find_map(|l| {
                l.strip_prefix("RssAnon:").map(|v| {
                    v.trim()
                        .trim_end_matches(" kB")
                        .trim()
                        .parse::<f64>()
                        .unwrap()
                })
            })
            .unwrap();
        let got: f64 = out.stdout.trim().parse().unwrap();
        assert!(got > 0.0, "{out:?}");
        // The process's anonymous memory moves a little between the two reads.
        assert!((got - want).abs() / want < 0.5, "{got} vs {want}");
    }

    /// Real: `sh` and `awk` on this machine (ps's output given on stdin). The RSS script picks
    /// the daemon's line, not another aks-flex-node process.
    #[tokio::test]
    async fn the_rss_script_picks_the_daemon() {
        let ps = "  812 /usr/bin/ctr -n aks-flex run aks-flex-agent\n 9000 /usr/local/bin/aks-flex-node operation run NodeReboot\n 6100 /usr/local/bin/aks-flex-node daemon --config /etc/aks-flex-node/config.json\n";
        let script = daemon_rss_script().replace("ps -eo rss=,args=", "cat");
        let out = ProcessRunner::new()
            .run(
                &Cmd::new("sh")
                    .args(["-c", &script])
                    .stdin(ps)
                    .timeout(Duration::from_secs(10)),
            )
            .await
            .unwrap();
        assert_eq!(out.stdout.trim(), "6100");
    }
}
