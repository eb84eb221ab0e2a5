//! `cargo xtask up | check | down`: thin wrappers over `flex_harness::run`, which make the
//! one `ProcessRunner` every command of the harness goes through.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flex_harness::acl::gallery::{self, GalleryOptions};
use flex_harness::hostmode::AgentMode;
use flex_harness::vm::{OsImage, Progress, UpOptions};
use flex_host::runner::ProcessRunner;

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
    /// Label /var/lib/containerd for SELinux before containerd starts (image/label-containerd.bu)
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
    pub mode: AgentMode,
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

#[cfg(test)]
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
            label_containerd: false,
            no_snapshot: false,
            cluster: false,
            kubeconfig: None,
            k8s_bin_dir: None,
            mode: AgentMode::Image,
            cpus: 2,
            memory: 3072,
        }
    }
}

fn parse_mode(s: &str) -> Result<AgentMode, String> {
    AgentMode::parse(s).ok_or_else(|| format!("{s:?} is not a mode: image or host"))
}

/// Host mode runs on the dev host, offline: ACL has no bash for bootstrap.sh and its agent
/// runs in the container, and the cluster groups run the agent's tools in its container.
fn check_mode(a: &UpArgs, source: &OsSource) -> anyhow::Result<()> {
    if a.mode == AgentMode::Host {
        if !matches!(source, OsSource::DevHost) {
            anyhow::bail!("--mode host runs on the dev host only (not with ACL)");
        }
        if a.cluster {
            anyhow::bail!("--mode host runs offline only (not with --cluster)");
        }
    }
    Ok(())
}

/// Where the OS image comes from.
#[derive(Debug)]
enum OsSource {
    DevHost,
    Image(PathBuf),
    Gallery(Box<GalleryOptions>),
}

/// `--acl-image`/`ACL_IMAGE` first, then `--acl-gallery`/`ACL_GALLERY` (with the version from
/// `--acl-image-version` or `version_env`, `ACL_IMAGE_VERSION`), else the dev host.
fn os_source(a: &UpArgs, version_env: Option<&str>) -> anyhow::Result<(OsSource, Option<String>)> {
    let gallery = gallery::parse_request(a.acl_gallery.as_deref())?;
    if let Some(image) = &a.acl_image {
        let note = gallery.map(|_| {
            "ACL_IMAGE / --acl-image is set: booting it, the gallery is not asked".to_string()
        });
        return Ok((OsSource::Image(image.clone()), note));
    }
    let Some((name, image)) = gallery else {
        return Ok((OsSource::DevHost, None));
    };
    let mut g = GalleryOptions::new(
        flex_harness::devhost::default_cache_root(),
        gallery::version_request(a.acl_image_version.as_deref(), version_env),
    );
    g.gallery = name;
    g.image = image;
    g.subscription = a.acl_subscription.clone();
    g.gallery_subscription = a.acl_gallery_subscription.clone();
    g.gallery_resource_group = a.acl_gallery_resource_group.clone();
    g.resource_group = a.acl_resource_group.clone();
    g.location = a.acl_location.clone();
    Ok((OsSource::Gallery(Box::new(g)), None))
}

/// `cargo xtask up`.
pub async fn up(a: UpArgs) -> anyhow::Result<()> {
    let work = work_dir();
    let (source, note) = os_source(&a, std::env::var("ACL_IMAGE_VERSION").ok().as_deref())?;
    check_mode(&a, &source)?;
    let runner = ProcessRunner::new();
    let progress = Progress::new();
    if let Some(n) = note {
        progress.say(&n);
    }
    // The gallery export comes first: a missing `az` or login fails before the image build.
    let acl_image = match source {
        OsSource::DevHost => None,
        OsSource::Image(p) => Some(p),
        OsSource::Gallery(g) => Some(gallery::export(&runner, &g, &progress).await?),
    };
    let (info, binary, _) = progress
        .try_wait(
            "xtask up: building the agent image",
            crate::image::build(&crate::project_root().join("target/image")),
        )
        .await?;
    let cluster = if a.cluster {
        Some(cluster_request(&runner, &progress, a.kubeconfig.as_deref()).await?)
    } else {
        None
    };
    let os = match acl_image {
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
        kubernetes_bin: a.k8s_bin_dir.clone(),
        mode: a.mode,
        agent_binary: Some(binary),
    };
    let state = flex_harness::run::up(
        &runner,
        &crate::project_root(),
        &work,
        &info.layout_dir,
        &opts,
        cluster.as_ref(),
    )
    .await?;
    println!(
        "VM up ({} mode, {}: {}); ssh -i {} -p {} flexadm@127.0.0.1",
        state.mode.name(),
        state.accel,
        state.accel_reason,
        state.ssh.key.display(),
        state.ssh.port
    );
    Ok(())
}

/// `--cluster`: builds the controller's image (`cargo xtask image --controller`) where a
/// cluster can be made (kind, kubectl, podman or docker); elsewhere nothing is built, and `up`
/// records what is missing and boots the VM offline.
async fn cluster_request(
    runner: &ProcessRunner,
    progress: &Progress,
    kubeconfig: Option<&Path>,
) -> anyhow::Result<flex_harness::cluster::Request> {
    if let Some(kubeconfig) = kubeconfig {
        progress.say(&format!(
            "xtask up --cluster --kubeconfig {}: building aks-flex-controller to run beside it",
            kubeconfig.display()
        ));
        let (binary, _, _) = crate::image::controller_binary().await?;
        return Ok(flex_harness::cluster::Request {
            controller_layout: None,
            existing: Some(flex_harness::cluster::existing::ExistingRequest {
                kubeconfig: kubeconfig.to_path_buf(),
                controller_binary: binary,
            }),
        });
    }
    let provider = flex_harness::cluster::provider();
    match flex_harness::cluster::tools(runner, provider.as_deref()) {
        Ok(engine) => {
            let out = crate::project_root().join("target/image");
            progress.say(&format!(
                "xtask up --cluster: building the controller's image (kind on {})",
                engine.program()
            ));
            crate::image::run_controller(Some(out.clone())).await?;
            Ok(flex_harness::cluster::Request {
                controller_layout: Some(out.join(crate::image::CONTROLLER_IMAGE)),
                existing: None,
            })
        }
        Err(why) => {
            progress.say(&format!(
                "xtask up --cluster: no cluster on this machine: {why}"
            ));
            Ok(flex_harness::cluster::Request {
                controller_layout: None,
                existing: None,
            })
        }
    }
}

/// `cargo xtask check`.
pub async fn check(a: CheckArgs) -> anyhow::Result<()> {
    if a.list {
        print!("{}", flex_harness::groups::render_list());
        return Ok(());
    }
    let work = work_dir();
    let junit = a.junit.unwrap_or_else(|| work.join("check-junit.xml"));
    let ok = flex_harness::run::check(
        &ProcessRunner::new(),
        &work,
        a.only.as_deref(),
        a.no_snapshot,
        &junit,
    )
    .await?;
    if !ok {
        anyhow::bail!("some checks failed");
    }
    Ok(())
}

/// `cargo xtask down`.
pub async fn down() -> anyhow::Result<()> {
    flex_harness::run::down(&ProcessRunner::new(), &work_dir()).await?;
    println!("VM, registry and kind cluster stopped; nothing of the harness runs");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        up: UpArgs,
    }

    fn args(argv: &[&str]) -> UpArgs {
        let mut v = vec!["up"];
        v.extend_from_slice(argv);
        Cli::try_parse_from(v).unwrap().up
    }

    #[test]
    fn os_selection() {
        let (s, n) = os_source(&UpArgs::defaults(), None).unwrap();
        assert!(matches!(s, OsSource::DevHost) && n.is_none(), "{s:?}");

        let (s, _) = os_source(&args(&["--acl-gallery", "--tcg"]), None).unwrap();
        let OsSource::Gallery(g) = s else {
            panic!("{s:?}")
        };
        assert_eq!(
            (g.gallery.as_str(), g.image.as_str()),
            (gallery::DEFAULT_GALLERY, gallery::DEFAULT_IMAGE)
        );
        assert_eq!(
            g.version,
            gallery::VersionRequest::Exact(gallery::DEFAULT_VERSION.into())
        );

        let a = args(&[
            "--acl-gallery=G/img",
            "--acl-resource-group",
            "scratch",
            "--acl-location",
            "westus3",
        ]);
        let (s, _) = os_source(&a, Some("")).unwrap();
        let OsSource::Gallery(g) = s else {
            panic!("{s:?}")
        };
        assert_eq!((g.gallery.as_str(), g.image.as_str()), ("G", "img"));
        assert_eq!(g.version, gallery::VersionRequest::Latest);
        assert_eq!(g.resource_group.as_deref(), Some("scratch"));
        assert_eq!(g.location.as_deref(), Some("westus3"));

        let a = args(&["--acl-gallery", "--acl-image-version", "3.1.2"]);
        let (s, _) = os_source(&a, Some("")).unwrap();
        let OsSource::Gallery(g) = s else {
            panic!("{s:?}")
        };
        assert_eq!(g.version, gallery::VersionRequest::Exact("3.1.2".into()));

        let a = args(&["--acl-image", "/x/acl.qcow2", "--acl-gallery"]);
        let (s, n) = os_source(&a, None).unwrap();
        assert!(
            matches!(s, OsSource::Image(ref p) if p == Path::new("/x/acl.qcow2")),
            "{s:?}"
        );
        assert!(n.unwrap().contains("ACL_IMAGE"));

        assert!(os_source(&args(&["--acl-gallery=nonsense"]), None).is_err());
    }

    #[test]
    fn mode_flag() {
        assert_eq!(UpArgs::defaults().mode, AgentMode::Image);
        assert_eq!(args(&[]).mode, AgentMode::Image, "image mode by default");
        assert_eq!(args(&["--mode", "host"]).mode, AgentMode::Host);
        assert_eq!(args(&["--mode=image"]).mode, AgentMode::Image);
        let mut v = vec!["up", "--mode", "ubuntu"];
        assert!(Cli::try_parse_from(&v).is_err());
        v.truncate(1);
        let host = args(&["--mode", "host"]);
        assert!(check_mode(&host, &OsSource::DevHost).is_ok());
        assert!(check_mode(&host, &OsSource::Image("/x".into())).is_err());
        assert!(check_mode(&args(&["--mode", "host", "--cluster"]), &OsSource::DevHost).is_err());
        assert!(check_mode(&args(&["--cluster"]), &OsSource::DevHost).is_ok());
    }

    #[test]
    fn cluster_flag() {
        assert!(!UpArgs::defaults().cluster);
        assert!(args(&["--cluster"]).cluster);
        let a = args(&["--cluster", "--kubeconfig", "/k"]);
        assert_eq!(a.kubeconfig.as_deref(), Some(Path::new("/k")));
    }
}
