//! The command line of `flex-harness` (`cargo xtask up | check | down | image | ssh | console |
//! journal | selinux | bench`): clap definitions only, in the library so that the workflows test
//! (`tests/tests/workflows.rs`) parses the commands a workflow runs with the same definitions the
//! binary does.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// `flex-harness`'s command line.
#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    about = "aks-flex-node harness: the dev host under QEMU, check groups, images"
)]
pub struct Cli {
    /// The task.
    #[command(subcommand)]
    pub command: Task,
}

/// The tasks.
#[derive(Debug, Subcommand)]
pub enum Task {
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
    Up(Box<UpArgs>),
    /// Run the check groups against the VM `up` started
    Check(CheckArgs),
    /// Remove the VM, its disks and the registry
    Down,
    /// A root shell in the VM `up` started, or CMD run there as root (`cargo xtask ssh --
    /// journalctl -b`)
    Ssh(SshArgs),
    /// Follow the VM's serial console (its last lines first; Ctrl-C ends)
    Console(ConsoleArgs),
    /// The VM's journal: the agent's units, the machines and containerd, or the UNITs named
    Journal(JournalArgs),
    /// SELinux: run every kind of host operation the agent performs from its container on the
    /// VM and list each with its result and AVC denials (`repro`), or fail on any (`verify`);
    /// docs/SELINUX.md
    #[command(subcommand)]
    Selinux(SelinuxTask),
    /// Measure the figures (image sizes, memory, recovery times) as medians of several tries
    /// and compare them with bench/baseline.json (docs/bench.md)
    Bench(BenchArgs),
}

/// `selinux`'s subcommands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Subcommand)]
pub enum SelinuxTask {
    /// List each host operation with its result and the AVC denials it caused (fails when
    /// SELinux is off on the VM)
    Repro,
    /// As repro, and fail when any operation failed or was denied
    Verify,
}

/// `bench`'s arguments.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct BenchArgs {
    /// Tries per figure
    #[arg(long, default_value_t = 3)]
    pub tries: usize,
    /// Only the host's figures (the VM's need `cargo xtask up` first)
    #[arg(long)]
    pub no_vm: bool,
    /// The baseline to compare with (default: <workspace>/bench/baseline.json)
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,
    /// Also write this run as the baseline
    #[arg(long)]
    pub write_baseline: bool,
}

/// `ssh`'s arguments.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct SshArgs {
    /// The command to run as root (its words joined with spaces, as ssh does, and run by `sh
    /// -c`); none: an interactive root shell
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub cmd: Vec<String>,
}

/// `console`'s flags.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ConsoleArgs {
    /// How many of the console's last lines to show before following it
    #[arg(long, short = 'n', default_value_t = 40)]
    pub lines: usize,
    /// Print the last lines and exit instead of following
    #[arg(long)]
    pub no_follow: bool,
}

/// `journal`'s arguments.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct JournalArgs {
    /// Units (globs allowed, as journalctl takes them); default: aks-flex-node-*,
    /// systemd-nspawn@* and containerd.service
    #[arg(value_name = "UNIT")]
    pub units: Vec<String>,
    /// How many of the last lines
    #[arg(long, short = 'n', default_value_t = 200)]
    pub lines: u32,
    /// Keep following (Ctrl-C ends)
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Every unit, not only the agent's
    #[arg(long, conflicts_with = "units")]
    pub all: bool,
}

/// `up`'s flags.
#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Boot an Azure Container Linux QEMU image (qcow2 or raw) instead of the dev host
    #[arg(long, env = "ACL_IMAGE", value_name = "PATH")]
    pub acl_image: Option<PathBuf>,
    /// Boot ACL exported from the Azure compute gallery with `az` (cached; default image
    /// ACLDEVEL/acl-1es-eval-kvm); ACL_IMAGE wins when set
    #[arg(long, env = "ACL_GALLERY", value_name = "GALLERY/IMAGE", num_args = 0..=1, default_missing_value = "1")]
    pub acl_gallery: Option<String>,
    /// The gallery image's version (default 3.20261019.3; "latest" or empty: the gallery's
    /// latest); env ACL_IMAGE_VERSION
    #[arg(long, value_name = "VERSION")]
    pub acl_image_version: Option<String>,
    /// Subscription for the temporary disk of the gallery export (default: az's current one)
    #[arg(long, env = "ACL_SUBSCRIPTION", value_name = "ID")]
    pub acl_subscription: Option<String>,
    /// The gallery's subscription (default: --acl-subscription)
    #[arg(long, env = "ACL_GALLERY_SUBSCRIPTION", value_name = "ID")]
    pub acl_gallery_subscription: Option<String>,
    /// The gallery's resource group (default: found by the gallery's name)
    #[arg(long, env = "ACL_GALLERY_RESOURCE_GROUP", value_name = "GROUP")]
    pub acl_gallery_resource_group: Option<String>,
    /// Resource group for the temporary disk (default: the gallery's)
    #[arg(long, env = "ACL_RESOURCE_GROUP", value_name = "GROUP")]
    pub acl_resource_group: Option<String>,
    /// Region of the temporary disk (default: its resource group's)
    #[arg(long, env = "ACL_LOCATION", value_name = "REGION")]
    pub acl_location: Option<String>,
    /// OVMF firmware code for ACL (UEFI)
    #[arg(long, default_value = "/usr/share/OVMF/OVMF_CODE_4M.fd")]
    pub ovmf_code: PathBuf,
    /// OVMF variables template for ACL
    #[arg(long, default_value = "/usr/share/OVMF/OVMF_VARS_4M.fd")]
    pub ovmf_vars: PathBuf,
    /// Never try KVM (software emulation only)
    #[arg(long)]
    pub tcg: bool,
    /// Boot the dev host's SELinux variant: Debian's reference policy, enforcing, labelled at
    /// image build (its own cached image; docs/SELINUX.md)
    #[arg(long, env = "ACLC_SELINUX", conflicts_with_all = ["acl_image", "acl_gallery"])]
    pub selinux: bool,
    /// Debugging: one more kernel argument for the dev host's boot, after the variant's own
    /// (repeatable; a later `enforcing=` or `loglevel=` wins), for example `--kernel-arg
    /// enforcing=0` to boot the SELinux variant permissive and read every denial. The image and
    /// its cache entry are unchanged. Not for ACL, whose kernel command line is its own.
    #[arg(long, value_name = "ARG", conflicts_with_all = ["acl_image", "acl_gallery"])]
    pub kernel_arg: Vec<String>,
    /// Label /var/lib/containerd and /run/containerd for SELinux before containerd starts
    /// (image/label-containerd.bu); always on with --selinux, whose policy confines runc
    #[arg(long, env = "ACLC_LABEL_CONTAINERD")]
    pub label_containerd: bool,
    /// Do not save the bootstrapped snapshot (check then runs groups in sequence)
    #[arg(long)]
    pub no_snapshot: bool,
    /// Create a kind cluster (podman or docker; needs network) running aks-flex-controller and
    /// join the VM to it, for the cluster check groups; without kind, kubectl or an engine the
    /// VM boots offline and check reports those groups skipped with the reason
    #[arg(long, env = "ACLC_CLUSTER")]
    pub cluster: bool,
    /// With --cluster: join the cluster of this kubeconfig's current context instead of making
    /// a kind cluster (its API server must be reachable from the guest; aks-flex-controller runs
    /// as a local process beside it)
    #[arg(
        long,
        env = "ACLC_KUBECONFIG",
        value_name = "FILE",
        requires = "cluster"
    )]
    pub kubeconfig: Option<PathBuf>,
    /// A directory with real kubelet, kubectl and kube-proxy binaries: the component bundle
    /// carries them instead of its stand-ins (with --cluster the node then joins without
    /// downloading Kubernetes)
    #[arg(long, env = "ACLC_K8S_BIN_DIR", value_name = "DIR")]
    pub k8s_bin_dir: Option<PathBuf>,
    /// How the agent runs: `image` (in its container, pulled from the local registry) or
    /// `host` (installed on the dev host by scripts/bootstrap.sh from a release archive the
    /// local registry serves, the daemon as the host unit, binaries in the blue/green slots;
    /// docs/host-mode.md)
    #[arg(long, value_name = "image|host", default_value = "image", value_parser = parse_mode)]
    pub mode: crate::hostmode::AgentMode,
    /// vCPUs
    #[arg(long, default_value_t = 2)]
    pub cpus: u32,
    /// Memory in MiB
    #[arg(long, default_value_t = 3072)]
    pub memory: u32,
}

/// `check`'s flags.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Run only these groups (comma-separated), in their usual order
    #[arg(long, value_name = "GROUPS")]
    pub only: Option<String>,
    /// List the groups and exit
    #[arg(long)]
    pub list: bool,
    /// Run the groups in sequence on one host instead of restoring the snapshot before each
    #[arg(long)]
    pub no_snapshot: bool,
    /// Where to write the JUnit report
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Run only the groups that failed in the last run (target/harness/last-run.json); the
    /// report says so
    #[arg(long, conflicts_with_all = ["only", "list"])]
    pub rerun_failed: bool,
}

// A clap value parser (private): clap shows its `String` as the argument's error, so a typed
// error would only be turned back into this text.
fn parse_mode(s: &str) -> Result<crate::hostmode::AgentMode, String> {
    crate::hostmode::AgentMode::parse(s)
        .ok_or_else(|| format!("{s:?} is not a mode: image or host"))
}

impl UpArgs {
    /// The defaults, as `cargo xtask up` with no flags.
    pub fn defaults() -> Self {
        Self {
            acl_image: None,
            acl_gallery: None,
            acl_image_version: None,
            acl_subscription: None,
            acl_gallery_subscription: None,
            acl_gallery_resource_group: None,
            acl_resource_group: None,
            acl_location: None,
            ovmf_code: "/usr/share/OVMF/OVMF_CODE_4M.fd".into(),
            ovmf_vars: "/usr/share/OVMF/OVMF_VARS_4M.fd".into(),
            tcg: false,
            selinux: false,
            kernel_arg: Vec::new(),
            label_containerd: false,
            no_snapshot: false,
            cluster: false,
            kubeconfig: None,
            k8s_bin_dir: None,
            mode: crate::hostmode::AgentMode::Image,
            cpus: 2,
            memory: 3072,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(argv: &[&str]) -> Result<Task, clap::Error> {
        let mut v = vec!["cargo xtask"];
        v.extend_from_slice(argv);
        Cli::try_parse_from(v).map(|c| c.command)
    }

    #[test]
    fn ssh_takes_a_command_after_the_separator_or_none() {
        let Task::Ssh(a) = parse(&["ssh", "--", "journalctl", "-u", "x", "-n", "5"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(a.cmd, ["journalctl", "-u", "x", "-n", "5"]);
        let Task::Ssh(a) = parse(&["ssh", "systemctl", "--failed"]).unwrap() else {
            panic!()
        };
        assert_eq!(a.cmd, ["systemctl", "--failed"]);
        let Task::Ssh(a) = parse(&["ssh"]).unwrap() else {
            panic!()
        };
        assert!(a.cmd.is_empty());
    }

    #[test]
    fn console_and_journal_flags() {
        let Task::Console(c) = parse(&["console"]).unwrap() else {
            panic!()
        };
        assert_eq!((c.lines, c.no_follow), (40, false));
        let Task::Console(c) = parse(&["console", "-n", "5", "--no-follow"]).unwrap() else {
            panic!()
        };
        assert_eq!((c.lines, c.no_follow), (5, true));
        let Task::Journal(j) = parse(&["journal"]).unwrap() else {
            panic!()
        };
        assert_eq!(
            (j.units.len(), j.lines, j.follow, j.all),
            (0, 200, false, false)
        );
        let Task::Journal(j) = parse(&[
            "journal",
            "kubelet.service",
            "containerd.service",
            "-f",
            "-n",
            "10",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!(j.units, ["kubelet.service", "containerd.service"]);
        assert_eq!((j.lines, j.follow), (10, true));
        assert!(parse(&["journal", "x.service", "--all"]).is_err());
        assert!(parse(&["journal", "--lines", "many"]).is_err());
    }

    #[test]
    fn rerun_failed_excludes_a_selection() {
        let Task::Check(c) = parse(&["check", "--rerun-failed"]).unwrap() else {
            panic!()
        };
        assert!(c.rerun_failed && c.only.is_none());
        assert!(parse(&["check", "--rerun-failed", "--only", "mounts"]).is_err());
        assert!(parse(&["check", "--rerun-failed", "--list"]).is_err());
        assert!(parse(&["check", "--no-such-flag"]).is_err());
    }
}
