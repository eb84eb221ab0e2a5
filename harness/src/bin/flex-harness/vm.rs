//! `cargo xtask up | check | down`: thin wrappers over `flex_harness::run`, which make the
//! one `ProcessRunner` every command of the harness goes through; and the debugging verbs `ssh`,
//! `console` and `journal` over `flex_harness::debug`, on the caller's terminal.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flex_harness::acl::gallery::{self, GalleryOptions};
pub use flex_harness::cli::{CheckArgs, ConsoleArgs, JournalArgs, SshArgs, UpArgs};
use flex_harness::hostmode::AgentMode;
use flex_harness::vm::{OsImage, Progress, UpOptions};
use flex_host::runner::{ProcessRunner, run_inherited};

/// The harness's work directory.
pub fn work_dir() -> PathBuf {
    crate::project_root().join("target/harness")
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
        None if a.selinux => OsImage::DevHost(flex_harness::devhost::Variant::Selinux),
        None => OsImage::DevHost(flex_harness::devhost::Variant::Plain),
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
        kernel_args: a.kernel_arg.clone(),
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
    let selection = if a.rerun_failed {
        flex_harness::run::Selection::RerunFailed
    } else {
        flex_harness::run::Selection::Only(a.only)
    };
    let ok = flex_harness::run::check(
        &ProcessRunner::new(),
        &work,
        selection,
        a.no_snapshot,
        &junit,
    )
    .await?;
    if !ok {
        anyhow::bail!("some checks failed");
    }
    Ok(())
}

/// The VM `up` started, or the error that says to start one.
fn running_vm() -> anyhow::Result<flex_harness::state::State> {
    flex_harness::state::State::load(&work_dir())?
        .ok_or_else(|| anyhow::anyhow!("no VM: run `cargo xtask up` first"))
}

/// `cargo xtask ssh [-- CMD]`: a root shell in the VM, or CMD run there as root, on this
/// terminal; CMD's failure is this command's.
pub async fn ssh(a: SshArgs) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let state = running_vm()?;
    let tty = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    run_inherited(&flex_harness::debug::ssh_cmd(&state.ssh, &a.cmd, tty)).await?;
    Ok(())
}

/// `cargo xtask selinux repro | verify`: every kind of host operation the agent performs, from
/// its container, with results and AVC denials; verify fails on any failure or denial. Both
/// fail when SELinux is off on the VM.
pub async fn selinux(t: flex_harness::cli::SelinuxTask) -> anyhow::Result<()> {
    use flex_harness::selinux;
    let state = running_vm()?;
    let runner = ProcessRunner::new();
    let guest = flex_harness::ssh::Guest::new(&runner, &state.ssh);
    let started = std::time::Instant::now();
    let (mode, results) = selinux::repro(&guest, state.mode, &|m| eprintln!("{m}")).await?;
    print!("{}", selinux::report(mode, &results));
    println!("({:.0} s)", started.elapsed().as_secs_f64());
    let (failed, denials) = selinux::totals(&results);
    if t == flex_harness::cli::SelinuxTask::Verify && (failed > 0 || denials > 0) {
        anyhow::bail!(
            "selinux verify: {failed} of {} operations failed and {denials} AVC denials",
            results.len()
        );
    }
    Ok(())
}

/// `cargo xtask journal [UNIT...]`: the guest's journal on this terminal.
pub async fn journal(a: JournalArgs) -> anyhow::Result<()> {
    let state = running_vm()?;
    use std::io::IsTerminal;
    let script = flex_harness::debug::journal_script(&a.units, a.lines, a.follow, a.all);
    // Followed from a terminal: a remote terminal, so that Ctrl-C ends journalctl in the guest.
    let tty = a.follow && std::io::stdin().is_terminal();
    run_inherited(&flex_harness::debug::ssh_cmd(&state.ssh, &[script], tty)).await?;
    Ok(())
}

/// `cargo xtask console`: the serial console's last lines, then what it prints, until Ctrl-C
/// (or at once with `--no-follow`).
pub async fn console(a: ConsoleArgs) -> anyhow::Result<()> {
    use std::io::Write;
    let state = running_vm()?;
    let log = state.serial_log();
    let mut tail = flex_harness::debug::ConsoleTail::new(&log, a.lines);
    let mut out = std::io::stdout();
    if !a.no_follow {
        eprintln!("following {} (Ctrl-C ends)", log.display());
    }
    loop {
        out.write_all(&tail.poll()?)?;
        out.flush()?;
        if a.no_follow {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
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
        let (s, n) = os_source(&args(&[]), None).unwrap();
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
        assert!(!args(&[]).cluster);
        assert!(args(&["--cluster"]).cluster);
        let a = args(&["--cluster", "--kubeconfig", "/k"]);
        assert_eq!(a.kubeconfig.as_deref(), Some(Path::new("/k")));
    }
}
