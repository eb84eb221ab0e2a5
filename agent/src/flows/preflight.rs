//! Preflight checks and their report, with upstream's check names, text lines and JSON report.
//!
//! Checks run concurrently; results keep the checks' order. `--ignore-preflight-errors` turns the
//! named checks' errors (or every check's, with `all`) into ignored warnings. In the agent's
//! container `host-packages` and `containerd-active` are left out: the container's packages are
//! not the host's, and the host's containerd is what runs the agent.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::config::Config;
use crate::machine::nodegoal::MachineGoal;
pub use crate::machine::seams::RemoteProbe;
use flex_host::context::Host;

/// How bad a result is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Fine.
    Ok,
    /// Worth knowing; does not fail preflight unless `--fail-on-warnings`.
    Warning,
    /// Fails preflight unless ignored.
    Error,
}

/// One check's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    /// Check name (`disk-space`).
    pub name: String,
    /// What was checked, for people (`host disk`).
    pub target: String,
    /// Severity after ignoring.
    pub severity: Severity,
    /// What was found. Never contains secrets or URLs.
    pub message: String,
    /// Whether an error was turned into a warning by `--ignore-preflight-errors`.
    pub ignored: bool,
}

impl CheckResult {
    fn new(name: &str, target: &str, severity: Severity, message: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            target: target.into(),
            severity,
            message: message.into(),
            ignored: false,
        }
    }
}

/// Counts by severity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// OK results.
    pub ok: usize,
    /// Warnings (including ignored errors).
    pub warnings: usize,
    /// Errors.
    pub errors: usize,
}

/// The whole report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// `ok` or `failed`.
    pub status: String,
    /// Results in check order.
    pub checks: Vec<CheckResult>,
    /// Counts.
    pub summary: Summary,
}

/// Output format of the `preflight` command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// Upstream's text lines.
    Text,
    /// The JSON report.
    Json,
}

/// An `--output` that is neither `text` nor `json`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported output format {0:?}")]
pub struct UnsupportedFormat(pub String);

impl OutputFormat {
    /// Parses `--output` (trimmed, lowercased; empty = text).
    pub fn parse(s: &str) -> Result<Self, UnsupportedFormat> {
        match s.trim().to_lowercase().as_str() {
            "" | "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(UnsupportedFormat(other.to_string())),
        }
    }
}

/// Free space `disk-space` requires under `/var/lib`.
pub const MIN_FREE_BYTES: u64 = 8 << 30;

/// Runs every check that applies to this host, in order: host checks, node-start checks, then
/// rootfs checks for `kube1`.
pub async fn run_checks(
    host: &Host,
    config: &Config,
    remote: &dyn RemoteProbe,
) -> Vec<CheckResult> {
    let containerized = host.containerized();
    let mut futs: Vec<
        std::pin::Pin<Box<dyn std::future::Future<Output = CheckResult> + Send + '_>>,
    > = vec![Box::pin(async { privileged_user(host) })];
    if !containerized {
        futs.push(Box::pin(host_packages(host, config)));
    }
    futs.push(Box::pin(async { host_os_configuration(host) }));
    futs.push(Box::pin(async { nspawn_runtime(host) }));
    futs.push(Box::pin(unit_not_active(
        host,
        "docker-active",
        "docker.service",
        "host docker",
        "docker is active; bootstrap stops and masks it",
    )));
    if !containerized {
        futs.push(Box::pin(unit_not_active(
            host,
            "containerd-active",
            "containerd.service",
            "host containerd",
            "the host's containerd is active; the node's containerd runs inside the machine, and two may contend for the same resources",
        )));
    }
    futs.push(Box::pin(async { swap_active(host) }));
    futs.push(Box::pin(async { disk_space(host) }));
    futs.push(Box::pin(async { cgroups(host) }));
    futs.push(Box::pin(async { kernel_features(host) }));
    futs.push(Box::pin(async {
        port_free(host, "kubelet-bind-address", "kubelet", 10250)
    }));
    futs.push(Box::pin(async {
        port_free(
            host,
            "containerd-metrics-bind-address",
            "containerd metrics",
            10257,
        )
    }));
    futs.push(Box::pin(async { api_server_reachable(host, config) }));
    let mut results = futures::future::join_all(futs).await;
    let goal = crate::machine::lifecycle::host_facts(host)
        .map_err(|e| e.to_string())
        .and_then(|f| {
            crate::machine::nodegoal::resolve(config, crate::state::KUBE1, &f)
                .map_err(|e| e.to_string())
        });
    match goal {
        Err(e) => results.push(CheckResult::new(
            "goal-state",
            "machine goal state",
            Severity::Error,
            e,
        )),
        Ok(goal) => {
            results.push(CheckResult::new(
                "goal-state",
                "machine goal state",
                Severity::Ok,
                format!("goal state for {} resolves", goal.machine),
            ));
            results.push(match remote.image_reachable(config, &goal).await {
                Ok(digest) => CheckResult::new(
                    "oci-image-reachable",
                    "node rootfs image",
                    Severity::Ok,
                    format!("rootfs image is reachable ({digest})"),
                ),
                Err(e) => CheckResult::new(
                    "oci-image-reachable",
                    "node rootfs image",
                    Severity::Error,
                    e.to_string(),
                ),
            });
            results.push(machine_provisioning(host, &goal));
            for (name, r) in remote.artifacts_reachable(config, &goal).await {
                let target = format!("{} download", name.trim_end_matches("-artifacts"));
                results.push(match r {
                    Ok(()) => {
                        CheckResult::new(&name, &target, Severity::Ok, "artifacts are reachable")
                    }
                    Err(e) => CheckResult::new(&name, &target, Severity::Error, e.to_string()),
                });
            }
        }
    }
    results
}

fn privileged_user(host: &Host) -> CheckResult {
    let name = "is-privileged-user";
    if host.info.euid() == 0 {
        CheckResult::new(name, "host user", Severity::Ok, "running as root")
    } else {
        CheckResult::new(
            name,
            "host user",
            Severity::Error,
            format!("must run as root (euid {})", host.info.euid()),
        )
    }
}

async fn host_packages(host: &Host, config: &Config) -> CheckResult {
    let name = "host-packages";
    let missing = crate::flows::setup_host::check_capabilities(host);
    let pm = ["apt-get", "tdnf", "dnf"]
        .into_iter()
        .find(|p| host.runner.which(p).is_some());
    if missing.is_empty() {
        return CheckResult::new(
            name,
            "host packages",
            Severity::Ok,
            "required programs are installed",
        );
    }
    let read_only = host.info.is_read_only(Path::new("/usr")).unwrap_or(false);
    let can_install = pm.is_some() && !read_only;
    let severity = if !can_install || config.offline() {
        Severity::Error
    } else {
        Severity::Warning
    };
    let how = if can_install {
        format!("; bootstrap installs them with {}", pm.unwrap_or_default())
    } else {
        "; they cannot be installed on this host".to_string()
    };
    CheckResult::new(
        name,
        "host packages",
        severity,
        format!("missing {}{how}", missing.join(", ")),
    )
}

fn host_os_configuration(host: &Host) -> CheckResult {
    let name = "host-os-configuration";
    for dir in ["/etc/sysctl.d", "/etc/systemd/system"] {
        let probe = Path::new(dir).join(".aks-flex-node-preflight-probe");
        let res = host
            .fs
            .write_atomic(&probe, b"probe\n", 0o600)
            .and_then(|()| host.fs.remove_file(&probe).map(|_| ()));
        if let Err(e) = res {
            return CheckResult::new(
                name,
                "host OS configuration",
                Severity::Error,
                format!("{dir} is not writable: {}", e.cause),
            );
        }
    }
    CheckResult::new(
        name,
        "host OS configuration",
        Severity::Ok,
        "/etc/sysctl.d and /etc/systemd/system are writable",
    )
}

fn nspawn_runtime(host: &Host) -> CheckResult {
    let name = "nspawn-runtime";
    let mut missing: Vec<&str> = ["systemctl", "machinectl", "systemd-nspawn"]
        .into_iter()
        .filter(|p| host.runner.which(p).is_none())
        .collect();
    if !host.fs.exists(Path::new("/run/systemd/system")) {
        missing.push("/run/systemd/system (systemd is not the init system)");
    }
    if missing.is_empty() {
        CheckResult::new(
            name,
            "nspawn runtime",
            Severity::Ok,
            "systemd-nspawn runtime is available",
        )
    } else {
        CheckResult::new(
            name,
            "nspawn runtime",
            Severity::Warning,
            format!("missing {}", missing.join(", ")),
        )
    }
}

async fn unit_not_active(
    host: &Host,
    name: &str,
    unit: &str,
    target: &str,
    active_message: &str,
) -> CheckResult {
    match host.systemd.is_active(unit).await {
        Ok(true) => CheckResult::new(name, target, Severity::Warning, active_message),
        Ok(false) => CheckResult::new(name, target, Severity::Ok, format!("{unit} is not active")),
        Err(e) => CheckResult::new(
            name,
            target,
            Severity::Warning,
            format!("cannot tell whether {unit} is active: {e}"),
        ),
    }
}

fn swap_active(host: &Host) -> CheckResult {
    let name = "swap-active";
    let swaps = host
        .fs
        .read_to_string(Path::new("/proc/swaps"))
        .ok()
        .flatten()
        .unwrap_or_default();
    let active = swaps
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .count();
    if active == 0 {
        CheckResult::new(name, "host swap", Severity::Ok, "no active swap")
    } else {
        CheckResult::new(
            name,
            "host swap",
            Severity::Warning,
            format!("{active} swap device(s) active; bootstrap turns swap off"),
        )
    }
}

fn disk_space(host: &Host) -> CheckResult {
    let name = "disk-space";
    let path = host.fs.path(Path::new("/var/lib"));
    let probe = if path.exists() {
        path
    } else {
        host.fs.root().to_path_buf()
    };
    match host.info.free_bytes(&probe) {
        Ok(free) if free >= MIN_FREE_BYTES => CheckResult::new(
            name,
            "host disk",
            Severity::Ok,
            format!("{} GiB free under /var/lib", free >> 30),
        ),
        Ok(free) => CheckResult::new(
            name,
            "host disk",
            Severity::Error,
            format!(
                "{:.1} GiB free under /var/lib; at least {} GiB are needed",
                free as f64 / (1u64 << 30) as f64,
                MIN_FREE_BYTES >> 30
            ),
        ),
        Err(e) => CheckResult::new(
            name,
            "host disk",
            Severity::Error,
            format!("cannot read free space under /var/lib: {e}"),
        ),
    }
}

fn cgroups(host: &Host) -> CheckResult {
    let name = "cgroups";
    // In the agent's container the host's cgroup file system is under /host (the container's
    // own /sys/fs/cgroup is its runtime's view).
    let base = if host.containerized() {
        "/host/sys/fs/cgroup"
    } else {
        "/sys/fs/cgroup"
    };
    if !host.fs.exists(Path::new(base)) {
        return CheckResult::new(
            name,
            "host cgroups",
            Severity::Error,
            format!("{base} is missing"),
        );
    }
    if host.fs.exists(&Path::new(base).join("cgroup.controllers")) {
        CheckResult::new(
            name,
            "host cgroups",
            Severity::Ok,
            "cgroup v2 (unified hierarchy) is mounted",
        )
    } else {
        CheckResult::new(
            name,
            "host cgroups",
            Severity::Error,
            "cgroup v2 is not mounted at /sys/fs/cgroup; the machines need the unified hierarchy",
        )
    }
}

/// Kernel features the machines need: overlayfs and bridge netfilter (loaded inside the machine
/// from the host's modules, so built in or available as modules), and the bpf file system.
fn kernel_features(host: &Host) -> CheckResult {
    let name = "kernel-features";
    let read = |p: &str| {
        host.fs
            .read_to_string(Path::new(p))
            .ok()
            .flatten()
            .unwrap_or_default()
    };
    let filesystems = read("/proc/filesystems");
    let rel = host.info.kernel_release();
    let modules = format!(
        "{}\n{}",
        read(&format!("/lib/modules/{rel}/modules.dep")),
        read(&format!("/lib/modules/{rel}/modules.builtin"))
    );
    let has_module = |m: &str| {
        modules.lines().any(|l| {
            l.split(':').next().is_some_and(|p| {
                p.ends_with(&format!("/{m}.ko")) || p.contains(&format!("/{m}.ko."))
            })
        })
    };
    let fs_has = |f: &str| {
        filesystems
            .lines()
            .any(|l| l.split_whitespace().last() == Some(f))
    };
    let mut missing = Vec::new();
    if !fs_has("overlay") && !has_module("overlay") {
        missing.push("overlay");
    }
    if !host.fs.exists(Path::new("/proc/sys/net/bridge")) && !has_module("br_netfilter") {
        missing.push("br_netfilter");
    }
    if !fs_has("bpf") {
        missing.push("bpf file system");
    }
    if missing.is_empty() {
        CheckResult::new(
            name,
            "host kernel",
            Severity::Ok,
            "overlay, br_netfilter and bpf are available",
        )
    } else {
        CheckResult::new(
            name,
            "host kernel",
            Severity::Error,
            format!("kernel {rel} lacks {}", missing.join(", ")),
        )
    }
}

fn port_free(host: &Host, name: &str, what: &str, port: u16) -> CheckResult {
    let addr = std::net::SocketAddr::from(([0, 0, 0, 0], port));
    if host.info.port_bindable(addr) {
        CheckResult::new(
            name,
            &format!("{what} address"),
            Severity::Ok,
            format!("0.0.0.0:{port} is free"),
        )
    } else {
        CheckResult::new(
            name,
            &format!("{what} address"),
            Severity::Error,
            format!("0.0.0.0:{port} is in use by another process"),
        )
    }
}

fn api_server_reachable(host: &Host, config: &Config) -> CheckResult {
    let name = "api-server-reachable";
    let target = "API server";
    let url = config.api_server_url();
    if url.is_empty() {
        return CheckResult::new(
            name,
            target,
            Severity::Warning,
            "no API server configured (node.kubelet.clusterFQDN)",
        );
    }
    let ca = config.node.kubelet.ca_cert_data.trim();
    if !ca.is_empty() && crate::machine::nodeconfig::decode_base64(ca).is_err() {
        return CheckResult::new(
            name,
            target,
            Severity::Error,
            "node.kubelet.caCertData is not valid base64",
        );
    }
    let Ok(u) = url::Url::parse(&url) else {
        return CheckResult::new(
            name,
            target,
            Severity::Error,
            "the API server URL does not parse",
        );
    };
    let (Some(h), Some(port)) = (u.host_str(), u.port_or_known_default()) else {
        return CheckResult::new(
            name,
            target,
            Severity::Error,
            "the API server URL has no host",
        );
    };
    match host.info.tcp_connect(
        h.trim_matches(['[', ']']),
        port,
        std::time::Duration::from_secs(5),
    ) {
        Ok(()) => CheckResult::new(name, target, Severity::Ok, "API server is reachable"),
        // The endpoint is not named: it may identify the cluster.
        Err(e) => CheckResult::new(
            name,
            target,
            Severity::Error,
            format!("API server is not reachable: {e}"),
        ),
    }
}

fn machine_provisioning(host: &Host, goal: &MachineGoal) -> CheckResult {
    let name = "nspawn-machine-provisioning";
    let target = "nspawn machine";
    let dir = goal.machine_dir();
    if host.fs.exists(&dir) && !host.fs.path(&dir).is_dir() {
        return CheckResult::new(
            name,
            target,
            Severity::Error,
            format!("{} exists and is not a directory", dir.display()),
        );
    }
    for p in [
        Path::new(crate::machine::nspawn::MACHINES_DIR).to_path_buf(),
        crate::machine::nspawn::nspawn_file(&goal.machine)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
        crate::machine::nspawn::dropin_dir(&goal.machine),
    ] {
        let mut existing = p.clone();
        while !host.fs.exists(&existing) {
            match existing.parent() {
                Some(parent) => existing = parent.to_path_buf(),
                None => break,
            }
        }
        let real = host.fs.path(&existing);
        if !real.is_dir() || host.info.is_read_only(&real).unwrap_or(false) {
            return CheckResult::new(
                name,
                target,
                Severity::Error,
                format!(
                    "{} cannot be created ({} is not a writable directory)",
                    p.display(),
                    existing.display()
                ),
            );
        }
    }
    CheckResult::new(
        name,
        target,
        Severity::Ok,
        format!("{} can be provisioned", goal.machine),
    )
}

/// Applies `--ignore-preflight-errors` and builds the report.
pub fn build_report(mut results: Vec<CheckResult>, ignore: &[String]) -> Report {
    let ignore: Vec<String> = ignore
        .iter()
        .flat_map(|s| s.split(','))
        .map(|s| s.trim().to_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    let all = ignore.iter().any(|s| s == "all");
    let mut summary = Summary::default();
    for r in &mut results {
        if r.severity == Severity::Error && (all || ignore.contains(&r.name.to_lowercase())) {
            r.severity = Severity::Warning;
            r.ignored = true;
        }
        match r.severity {
            Severity::Ok => summary.ok += 1,
            Severity::Warning => summary.warnings += 1,
            Severity::Error => summary.errors += 1,
        }
    }
    Report {
        status: if summary.errors == 0 { "ok" } else { "failed" }.into(),
        checks: results,
        summary,
    }
}

fn line(kind: &str, r: &CheckResult) -> String {
    let mut s = format!("\t[{kind} {}]: {}", r.name, r.message);
    if !r.target.is_empty() {
        let _ = write!(s, " (target: {})", r.target);
    }
    s
}

/// Renders upstream's text output.
pub fn render_text(report: &Report) -> String {
    let mut out = String::from("[preflight] Running AKS Flex Node preflight checks\n");
    for r in &report.checks {
        match r.severity {
            Severity::Ok => out.push_str(&(line("OK", r) + "\n")),
            Severity::Warning => out.push_str(&(line("WARNING", r) + "\n")),
            Severity::Error => {}
        }
    }
    if report.summary.errors > 0 {
        out.push_str("[preflight] Some fatal errors occurred:\n");
        for r in report
            .checks
            .iter()
            .filter(|r| r.severity == Severity::Error)
        {
            out.push_str(&(line("ERROR", r) + "\n"));
        }
        out.push_str("[preflight] If you know what you are doing, you can make a check non-fatal with `--ignore-preflight-errors=...`\n");
    }
    out
}

/// Renders the JSON report (2-space indent, trailing newline).
pub fn render_json(report: &Report) -> String {
    let mut s = serde_json::to_string_pretty(report).unwrap_or_else(|_| "{}".into());
    s.push('\n');
    s
}

/// Why the `preflight` command fails after printing its report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Verdict {
    /// At least one check failed.
    #[error("preflight checks failed")]
    Failed,
    /// No check failed, some warned, and warnings count as failures.
    #[error("preflight checks returned warnings")]
    Warnings,
}

/// Whether the `preflight` command fails after printing its report.
pub fn verdict(report: &Report, fail_on_warnings: bool) -> Result<(), Verdict> {
    if report.summary.errors > 0 {
        Err(Verdict::Failed)
    } else if fail_on_warnings && report.summary.warnings > 0 {
        Err(Verdict::Warnings)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::seams::ProbeError;
    use flex_testkit::FakeHost;
    use flex_testkit::FakeHostInfo;

    fn config() -> Config {
        crate::config::parse(
            include_bytes!("../../tests/fixtures/config-token.json"),
            &|| Ok("h".into()),
        )
        .unwrap()
        .config
    }

    struct FakeRemote {
        up: bool,
    }

    #[async_trait::async_trait]
    impl RemoteProbe for FakeRemote {
        async fn image_reachable(
            &self,
            _c: &Config,
            _g: &MachineGoal,
        ) -> Result<String, ProbeError> {
            if self.up {
                Ok("sha256:abc".into())
            } else {
                Err(ProbeError::Unreachable(
                    "rootfs image is not reachable: connection refused".into(),
                ))
            }
        }
        async fn artifacts_reachable(
            &self,
            _c: &Config,
            _g: &MachineGoal,
        ) -> Vec<(String, Result<(), ProbeError>)> {
            ["kubernetes-artifacts", "cri-artifacts", "cni-artifacts"]
                .into_iter()
                .map(|n| {
                    (
                        n.to_string(),
                        if self.up {
                            Ok(())
                        } else {
                            Err(ProbeError::Unreachable("not reachable".to_string()))
                        },
                    )
                })
                .collect()
        }
    }

    const UP: FakeRemote = FakeRemote { up: true };
    const DOWN: FakeRemote = FakeRemote { up: false };

    fn healthy() -> FakeHost {
        let f = FakeHost::new().unwrap();
        for d in [
            "/run/systemd/system",
            "/sys/fs/cgroup",
            "/var/lib",
            "/proc/sys/net/bridge",
        ] {
            f.host.fs.create_dir_all(Path::new(d)).unwrap();
        }
        let fs = &f.host.fs;
        fs.write_atomic(
            Path::new("/sys/fs/cgroup/cgroup.controllers"),
            b"cpu memory\n",
            0o444,
        )
        .unwrap();
        fs.write_atomic(
            Path::new("/proc/filesystems"),
            b"nodev\tsysfs\nnodev\tbpf\n\text4\n",
            0o444,
        )
        .unwrap();
        fs.write_atomic(
            Path::new("/lib/modules/6.1.0-test/modules.dep"),
            b"kernel/fs/overlayfs/overlay.ko.xz:\nkernel/net/bridge/br_netfilter.ko.xz: kernel/net/bridge/bridge.ko.xz\n",
            0o644,
        )
        .unwrap();
        f.host
            .fs
            .write_atomic(
                Path::new("/proc/swaps"),
                b"Filename Type Size Used Priority\n",
                0o444,
            )
            .unwrap();
        f
    }

    #[tokio::test]
    async fn healthy_host_text_and_json() {
        let f = healthy();
        let report = build_report(run_checks(&f.host, &config(), &UP).await, &[]);
        assert_eq!(verdict(&report, true), Ok(()));
        insta::assert_snapshot!(render_text(&report));
        insta::assert_snapshot!(render_json(&report));
    }

    #[tokio::test]
    async fn problems_and_ignoring() {
        let f = FakeHost::with_info(FakeHostInfo {
            euid: 1000,
            var_lib_free: 1 << 30,
            ..Default::default()
        })
        .unwrap();
        f.systemd.set_active("docker.service");
        f.runner.without("machinectl");
        let results = run_checks(&f.host, &config(), &DOWN).await;
        let report = build_report(results.clone(), &[]);
        insta::assert_snapshot!("problems_text", render_text(&report));
        assert_eq!(verdict(&report, false), Err(Verdict::Failed));
        assert_eq!(Verdict::Failed.to_string(), "preflight checks failed");

        let ignore: Vec<String> = vec![
            "IS-PRIVILEGED-USER, disk-space".into(),
            "cgroups,kernel-features".into(),
            "oci-image-reachable,kubernetes-artifacts,cri-artifacts,cni-artifacts".into(),
        ];
        let report = build_report(results.clone(), &ignore);
        assert_eq!(report.summary.errors, 0, "{}", render_text(&report));
        assert_eq!(report.checks.iter().filter(|c| c.ignored).count(), 8);
        assert_eq!(verdict(&report, false), Ok(()));
        assert_eq!(verdict(&report, true), Err(Verdict::Warnings));
        assert_eq!(
            Verdict::Warnings.to_string(),
            "preflight checks returned warnings"
        );
        let report = build_report(results, &["all".into()]);
        assert_eq!(report.status, "ok");
    }

    #[tokio::test]
    async fn container_mode_skips_host_packages_and_containerd() {
        let f = FakeHost::with_info(FakeHostInfo {
            containerized: true,
            ..Default::default()
        })
        .unwrap();
        let names: Vec<_> = run_checks(&f.host, &config(), &UP)
            .await
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert!(!names.contains(&"host-packages".to_string()));
        assert!(!names.contains(&"containerd-active".to_string()));
        assert!(names.contains(&"docker-active".to_string()));
    }

    #[test]
    fn output_format_parsing() {
        assert_eq!(OutputFormat::parse(" JSON "), Ok(OutputFormat::Json));
        assert_eq!(OutputFormat::parse(""), Ok(OutputFormat::Text));
        let e = OutputFormat::parse("yaml").unwrap_err();
        assert_eq!(e, UnsupportedFormat("yaml".into()));
        assert_eq!(e.to_string(), "unsupported output format \"yaml\"");
    }
}
