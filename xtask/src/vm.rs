//! `cargo xtask up | check | down`: thin wrappers over `flex_harness::run`.

use std::path::PathBuf;
use std::time::Duration;

use flex_harness::vm::{OsImage, UpOptions};

/// The harness's work directory.
pub fn work_dir() -> PathBuf {
    crate::project_root().join("target/harness")
}

/// `up`'s flags.
#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Boot an Azure Container Linux QEMU image (qcow2 or raw) instead of the dev host
    #[arg(long, env = "ACL_IMAGE", value_name = "PATH")]
    pub acl_image: Option<PathBuf>,
    /// OVMF firmware code for ACL (UEFI)
    #[arg(long, default_value = "/usr/share/OVMF/OVMF_CODE_4M.fd")]
    pub ovmf_code: PathBuf,
    /// OVMF variables template for ACL
    #[arg(long, default_value = "/usr/share/OVMF/OVMF_VARS_4M.fd")]
    pub ovmf_vars: PathBuf,
    /// Never try KVM (software emulation only)
    #[arg(long)]
    pub tcg: bool,
    /// Label /var/lib/containerd for SELinux before containerd starts (image/label-containerd.bu)
    #[arg(long, env = "ACLC_LABEL_CONTAINERD")]
    pub label_containerd: bool,
    /// Do not save the bootstrapped snapshot (check then runs groups in sequence)
    #[arg(long)]
    pub no_snapshot: bool,
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
}

impl UpArgs {
    /// The defaults, as `cargo xtask up` with no flags.
    pub fn defaults() -> Self {
        Self {
            acl_image: None,
            ovmf_code: "/usr/share/OVMF/OVMF_CODE_4M.fd".into(),
            ovmf_vars: "/usr/share/OVMF/OVMF_VARS_4M.fd".into(),
            tcg: false,
            label_containerd: false,
            no_snapshot: false,
            cpus: 2,
            memory: 3072,
        }
    }
}

impl CheckArgs {
    /// The defaults, as `cargo xtask check` with no flags.
    pub fn defaults() -> Self {
        Self {
            only: None,
            list: false,
            no_snapshot: false,
            junit: None,
        }
    }
}

/// `cargo xtask up`.
pub async fn up(a: UpArgs) -> anyhow::Result<()> {
    let work = work_dir();
    eprintln!("xtask up: building the agent image");
    let (info, _, _) = crate::image::build(&crate::project_root().join("target/image")).await?;
    let os = match a.acl_image {
        Some(image) => OsImage::Acl {
            image,
            ovmf_code: a.ovmf_code,
            ovmf_vars: a.ovmf_vars,
        },
        None => OsImage::DevHost,
    };
    let opts = UpOptions {
        os,
        try_kvm: !a.tcg,
        cpus: a.cpus,
        memory_mib: a.memory,
        label_containerd: a.label_containerd,
        snapshot: !a.no_snapshot,
        boot_timeout: Duration::from_secs(900),
        bootstrap_timeout: Duration::from_secs(1800),
    };
    let state =
        flex_harness::run::up(&crate::project_root(), &work, &info.layout_dir, &opts).await?;
    println!(
        "VM up ({}: {}); ssh -i {} -p {} flexadm@127.0.0.1",
        state.accel,
        state.accel_reason,
        state.ssh.key.display(),
        state.ssh.port
    );
    Ok(())
}

/// `cargo xtask check`.
pub async fn check(a: CheckArgs) -> anyhow::Result<()> {
    if a.list {
        print!("{}", flex_harness::groups::render_list());
        return Ok(());
    }
    let work = work_dir();
    let junit = a.junit.unwrap_or_else(|| work.join("check-junit.xml"));
    let ok = flex_harness::run::check(&work, a.only.as_deref(), a.no_snapshot, &junit).await?;
    if !ok {
        anyhow::bail!("some checks failed");
    }
    Ok(())
}

/// `cargo xtask down`.
pub async fn down() -> anyhow::Result<()> {
    flex_harness::run::down(&work_dir()).await?;
    println!("VM and registry stopped; nothing of the harness runs");
    Ok(())
}
