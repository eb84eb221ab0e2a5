//! The harness's entry points, as `cargo xtask` calls them: [`up`], [`check`] and [`down`],
//! each given the [`Runner`] every command goes through (the binary's one `ProcessRunner`).
//! `up` is a list of named steps, each a function here.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flex_host::runner::Runner;

use crate::acl::{self, AclBoot};
use crate::check::Ctx;
use crate::cluster::Availability;
use crate::devhost::{self, Suite};
use crate::fixtures;
use crate::groups::{self, Needs};
use crate::hostmode::{self, AgentMode};
use crate::images;
use crate::provision::{self, Additions};
use crate::qemu::{Accel, Boot};
use crate::registry::{self, Registry};
use crate::report::{self, RunReport};
use crate::ssh::{self, Ssh};
use crate::state::State;
use crate::vm::{self, OsImage, Progress, UpOptions};

/// The hostname the harness gives the guest.
pub const HOSTNAME: &str = "flex-dev-node";

/// A self-signed CA certificate (base64 PEM) standing in for the cluster CA: offline there is
/// no cluster, but the config must still name a well-formed CA.
const OFFLINE_CA: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJ4ekNDQVcyZ0F3SUJBZ0lVVXhTQmRqeG8zUm9aQnB2ajkyd0FPdXZSQktFd0NnWUlLb1pJemowRUF3SXcKT0RFMk1EUUdBMVVFQXd3dFlXdHpMV1pzWlhndGJtOWtaU0J2Wm1ac2FXNWxJR2hoY201bGMzTWdRMEVnS0c1dgpJR05zZFhOMFpYSXBNQ0FYRFRJMk1USXdNakUyTWpFd04xb1lEekl4TWpZeE1UQTRNVFl5TVRBM1dqQTRNVFl3Ck5BWURWUVFEREMxaGEzTXRabXhsZUMxdWIyUmxJRzltWm14cGJtVWdhR0Z5Ym1WemN5QkRRU0FvYm04Z1kyeDEKYzNSbGNpa3dXVEFUQmdjcWhrak9QUUlCQmdncWhrak9QUU1CQndOQ0FBVHhQc2pNZWRkT3hZaFVyQmFHckU0SAphL0pNZG5PYzhGb042SUpKTll2UUNxbWNpaU9mZkV6YklmWHAwYjliUnFYUml6Njk4TWttQ2Q2QzdSc0FhbjJjCm8xTXdVVEFkQmdOVkhRNEVGZ1FVSGhLNVM3QlJBcGZHUmVRN1JjU1NqenlZY1RNd0h3WURWUjBqQkJnd0ZvQVUKSGhLNVM3QlJBcGZHUmVRN1JjU1NqenlZY1RNd0R3WURWUjBUQVFIL0JBVXdBd0VCL3pBS0JnZ3Foa2pPUFFRRApBZ05JQURCRkFpRUE2YnZsVm5xODJhYlU5N01mQVJScFJyZHlpa0hNUDVaVFhXWjYvUTFwTVVJQ0lBOU1ic2FXCkg1aGFTYVdzcU5KN05WQzQya21JL0dZYk01RDJwdGYvcnA3cgotLS0tLUVORCBDRVJUSUZJQ0FURS0tLS0tCg==";

/// The bootstrap inputs for an offline host.
pub fn offline_bootstrap_env(machine_image: &str, bundle: &str, kubernetes: &str) -> String {
    let loc = provision::hostile_location().replace('\'', "");
    [
        "# Written by cargo xtask up: an offline node (there is no cluster to join).".to_string(),
        "AKS_FLEX_NODE_CLUSTER_RESOURCE_ID=/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/offline/providers/Microsoft.ContainerService/managedClusters/offline".into(),
        format!("AKS_FLEX_NODE_LOCATION='{loc}'"),
        format!("AKS_FLEX_NODE_KUBERNETES_VERSION={kubernetes}"),
        "AKS_FLEX_NODE_API_SERVER=10.0.2.2:6443".into(),
        format!("AKS_FLEX_NODE_CA_CERT_DATA={OFFLINE_CA}"),
        "AKS_FLEX_NODE_BOOTSTRAP_TOKEN=abcdef.0123456789abcdef".into(),
        format!("AKS_FLEX_NODE_NODE_NAME={HOSTNAME}"),
        format!("AKS_FLEX_NODE_OCI_IMAGE={machine_image}"),
        format!("AKS_FLEX_NODE_OFFLINE_ARTIFACTS=oci://{bundle}"),
        format!(
            "AKS_FLEX_NODE_INSECURE_REGISTRIES={}",
            provision::registries_of(&[machine_image, bundle])
        ),
        "AKS_FLEX_NODE_LOG_LEVEL=debug".into(),
        "AKS_FLEX_NODE_PREFLIGHT_IGNORE=api-server-reachable,disk-space".into(),
        String::new(),
    ]
    .join("\n")
}

/// Checks, with `r`, that what `up` needs is installed, naming the missing packages otherwise.
/// `cargo xtask up` installs them before it builds the harness (xtask/src/deps.rs: the one
/// place the project installs packages).
pub async fn ensure_tools(r: &dyn Runner, _progress: &Progress) -> anyhow::Result<()> {
    let wanted: &[(&str, &str)] = &[
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("qemu-img", "qemu-utils"),
        ("mmdebstrap", "mmdebstrap"),
        ("docker-registry", "docker-registry"),
        ("ssh", "openssh-client"),
        ("start-stop-daemon", "dpkg"),
        ("mkfs.ext4", "e2fsprogs"),
    ];
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|(bin, _)| r.which(bin).is_none())
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "missing packages: {} (`cargo xtask up` installs them as root on Debian; on Debian 12 qemu-system-x86 comes from bookworm-backports)",
        missing.join(" ")
    )
}

/// Stops what a failed `up` started, unless disarmed.
struct Cleanup<'a> {
    work: PathBuf,
    runner: &'a dyn Runner,
    armed: bool,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        eprintln!("up failed: stopping the VM, the registry and the kind cluster it started");
        let (work, r) = (&self.work, self.runner);
        // Drop cannot await: run `down` on a fresh single-threaded runtime in its own thread.
        std::thread::scope(|s| {
            let _ = s
                .spawn(move || {
                    if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        let _ = rt.block_on(down(r, work));
                    }
                })
                .join();
        });
    }
}

/// The time each of `up`'s phases took.
struct Laps {
    timings: Vec<(String, f64)>,
    phase: Instant,
}

impl Laps {
    fn new() -> Self {
        Self {
            timings: Vec::new(),
            phase: Instant::now(),
        }
    }

    /// Ends the phase `name`.
    fn lap(&mut self, name: &str) {
        self.timings
            .push((name.to_string(), self.phase.elapsed().as_secs_f64()));
        self.phase = Instant::now();
    }
}

/// `up`: boots the VM with the agent bootstrapped in its container (or, in host mode, installed
/// on the host by `scripts/bootstrap.sh`: [`hostmode`]), every command through `r`.
/// `agent_layout` is the agent's OCI image layout (`cargo xtask image`). With `cluster` (`up
/// --cluster`), the VM joins a kind cluster made first ([`crate::cluster`]); where none can be
/// made, it boots offline and the reason is recorded for `check`.
pub async fn up(
    r: &dyn Runner,
    repo: &Path,
    work: &Path,
    agent_layout: &Path,
    opts: &UpOptions,
    cluster: Option<&crate::cluster::Request>,
) -> anyhow::Result<State> {
    let p = Progress::new();
    let mut laps = Laps::new();
    ensure_tools(r, &p).await?;
    replace_earlier_up(r, &p, work).await?;
    let mut guard = Cleanup {
        work: work.to_path_buf(),
        runner: r,
        armed: true,
    };
    let cache = devhost::default_cache_root();
    let os = os_image(r, &p, work, &cache, opts).await?;
    laps.lap("os image");
    let pod_images = cluster.is_some_and(|c| c.existing.is_some());
    let images = push_images(
        r,
        &p,
        work,
        &cache,
        agent_layout,
        opts.kubernetes_bin.as_deref(),
        pod_images,
    )
    .await?;
    laps.lap("registry and images");
    let pubkey = ssh::ensure_key(r, &work.join("id_ed25519")).await?;
    let real_bundle = opts
        .kubernetes_bin
        .as_ref()
        .map(|_| provision::OfflineBundle {
            reference: images.bundle.clone(),
            kubernetes: images.kubernetes.clone(),
        });
    let node = JoiningNode {
        name: HOSTNAME,
        machine_image: &images.machine,
        bundle: real_bundle.as_ref(),
        mirror: images.pod_mirror.as_deref(),
    };
    let (availability, cluster_env) =
        cluster_step(&|m| p.say(m), r, repo, work, cluster, &node).await;
    if cluster.is_some() {
        laps.lap("kind cluster");
    }
    let mut env = cluster_env.unwrap_or_else(|| {
        offline_bootstrap_env(&images.machine, &images.bundle, &images.kubernetes)
    });
    if images.registry.auth.is_some() {
        env.push_str(&format!(
            "AKS_FLEX_NODE_REGISTRY_AUTH_FILE={}\n",
            registry::GUEST_AUTH_FILE
        ));
    }
    let served = match opts.mode {
        AgentMode::Image => None,
        AgentMode::Host => {
            let served = push_host_files(&p, &images.registry, opts).await?;
            env.push_str(&hostmode::install_env(&served.release));
            laps.lap("host mode files");
            Some(served)
        }
    };
    write_ignition(repo, work, opts, &os, &images, pubkey, &env)?;
    vm::create_overlay(r, &os.base, &work.join("disk.qcow2")).await?;
    let (accel, reason) = accelerator(r, &p, work, &os, opts).await;
    laps.lap("kvm probe");
    let later_append = os.later_append.clone();
    let (mut state, mut qspec) =
        first_boot(r, &p, work, opts, os, accel, reason, images, env).await?;
    state.served = served;
    state.save()?;
    laps.lap("first boot");
    wait_first_bootstrap(r, &p, &state, opts).await?;
    laps.lap("bootstrap");
    if let Some(append) = later_append {
        restart_for_later_boots(r, &p, &mut state, &mut qspec, append, opts).await?;
        laps.lap("restart (later boots' cmdline)");
    }
    if let Some(info) = availability.info() {
        crate::cluster::joined_step(&|m| p.say(m), r, &state.ssh, info).await;
        laps.lap("node joined");
    }
    if opts.snapshot {
        let secs = vm::save_snapshot(&mut state).await?;
        p.say(&format!(
            "snapshot {} saved in {secs:.2}s",
            vm::READY_SNAPSHOT
        ));
        laps.lap("savevm");
    }
    state.timings = laps.timings;
    state.save()?;
    crate::cluster::record(work, &availability)?;
    guard.armed = false;
    p.say(match opts.mode {
        AgentMode::Image => "up: the host is bootstrapped and the agent runs in its container",
        AgentMode::Host => {
            "up: the host is bootstrapped by bootstrap.sh and the agent runs as its host unit from the blue/green slots"
        }
    });
    for (n, s) in &state.timings {
        eprintln!("  {n:<22} {s:>7.1}s");
    }
    Ok(state)
}

/// Host mode: pushes the agent's release binary (as the release archive `bootstrap.sh`
/// installs, itself, and the upgrade group's candidates) to the registry, which serves them to
/// the guest ([`hostmode`]).
async fn push_host_files(
    p: &Progress,
    registry: &Registry,
    opts: &UpOptions,
) -> anyhow::Result<hostmode::Served> {
    let binary = opts.agent_binary.as_deref().ok_or_else(|| {
        anyhow::anyhow!("host mode needs the agent's release binary (cargo xtask image builds it)")
    })?;
    p.say(&format!(
        "host mode: serving the agent's release archive and upgrade candidates made from {}",
        binary.display()
    ));
    let client = vm::registry_client(&registry.host_addr())?;
    hostmode::push_all(
        &client,
        &registry.host_addr(),
        &registry.guest_addr(),
        binary,
    )
    .await
}

/// Stops the VM, registry and kind cluster of an earlier `up`, if any, and makes `work`.
async fn replace_earlier_up(r: &dyn Runner, p: &Progress, work: &Path) -> anyhow::Result<()> {
    if State::load(work)?.is_some() {
        p.say("replacing the VM of an earlier up");
    }
    let provider = crate::cluster::provider();
    if let Err(e) = crate::cluster::down(r, work, provider.as_deref()).await {
        p.say(&format!(
            "warning: the kind cluster of an earlier up stays: {e:#}"
        ));
    }
    if let Err(e) = crate::prometheus::down(r, work).await {
        p.say(&format!("warning: the checks' Prometheus stays: {e:#}"));
    }
    vm::down(r, work).await?;
    std::fs::create_dir_all(work)?;
    Ok(())
}

/// The OS image and how it boots.
struct OsBoot {
    /// The pristine disk the overlay is made of.
    base: PathBuf,
    /// How the first boot boots.
    boot: Boot,
    /// The fw_cfg key the Ignition config goes under.
    fw_key: &'static str,
    /// The Ignition spec the OS reads.
    spec: flex_ignition::SpecVersion,
    /// The kernel the KVM probe boots, if there is one.
    kernel_for_probe: Option<PathBuf>,
    /// A direct kernel boot of ACL runs Ignition on its first boot only; the later boots'
    /// command line (without `flatcar.first_boot`) replaces it once the host is bootstrapped.
    later_append: Option<String>,
}

/// Finds or builds the OS image: the dev host (built once per recipe), or ACL (UEFI, or its
/// kernel booted directly).
async fn os_image(
    r: &dyn Runner,
    p: &Progress,
    work: &Path,
    cache: &Path,
    opts: &UpOptions,
) -> anyhow::Result<OsBoot> {
    match &opts.os {
        OsImage::DevHost(variant) => {
            let img = p
                .try_wait(
                    "dev host image (built once per recipe, cached)",
                    devhost::ensure_variant(r, cache, Suite::Bookworm, *variant, &|m| p.say(m)),
                )
                .await?;
            Ok(OsBoot {
                base: img.disk.clone(),
                boot: Boot::Kernel {
                    kernel: img.kernel.clone(),
                    initrd: Some(img.initrd.clone()),
                    append: {
                        let mut args = variant.kernel_args().to_vec();
                        args.extend(opts.kernel_args.iter().map(String::as_str));
                        crate::qemu::dev_host_append(&args)
                    },
                },
                fw_key: devhost::FWCFG_IGNITION_KEY,
                spec: flex_ignition::SpecVersion::V3_3_0,
                kernel_for_probe: Some(img.kernel.clone()),
                later_append: None,
            })
        }
        OsImage::Acl {
            image,
            ovmf_code,
            ovmf_vars,
        } => {
            if !image.is_file() {
                anyhow::bail!("ACL image {} does not exist", image.display());
            }
            let mode = acl::BootMode::from_env()?;
            let decided = p
                .try_wait(
                    "reading the ACL image's boot configuration",
                    acl::boot::prepare(r, image, &work.join("acl-boot"), mode),
                )
                .await?;
            match decided {
                AclBoot::Uefi { why } => {
                    p.say(&format!("ACL boots with UEFI: {why}"));
                    let vars = work.join("OVMF_VARS.fd");
                    std::fs::copy(ovmf_vars, &vars).map_err(|e| {
                        anyhow::anyhow!("copying the OVMF variables {}: {e}", ovmf_vars.display())
                    })?;
                    Ok(OsBoot {
                        base: image.clone(),
                        boot: Boot::Uefi {
                            code: ovmf_code.clone(),
                            vars,
                        },
                        fw_key: crate::qemu::FWCFG_FLATCAR,
                        spec: flex_ignition::SpecVersion::V3_4_0,
                        kernel_for_probe: None,
                        later_append: None,
                    })
                }
                AclBoot::Kernel {
                    kernel,
                    initrd,
                    first_boot_append,
                    append,
                    why,
                } => {
                    p.say(&format!("ACL boots its kernel directly: {why}"));
                    Ok(OsBoot {
                        base: image.clone(),
                        boot: Boot::Kernel {
                            kernel: kernel.clone(),
                            initrd,
                            append: first_boot_append,
                        },
                        fw_key: crate::qemu::FWCFG_FLATCAR,
                        spec: flex_ignition::SpecVersion::V3_4_0,
                        kernel_for_probe: Some(kernel),
                        later_append: Some(append),
                    })
                }
            }
        }
    }
}

/// What `up` pushed to the registry it started.
struct Pushed {
    /// The registry.
    registry: Registry,
    /// The agent's image, pinned, as the guest sees it.
    agent: String,
    /// The machine rootfs image, pinned.
    machine: String,
    /// The component bundle, pinned.
    bundle: String,
    /// The bundle's Kubernetes version.
    kubernetes: String,
    /// The registry as the guest reaches it (`http://10.0.2.2:<port>`), when it holds the pod
    /// images a node pulls through it ([`push_pod_images`]).
    pod_mirror: Option<String>,
}

/// Starts the registry and pushes the agent's image, the machine rootfs and the component
/// bundle (both fixtures, built once and cached).
async fn push_images(
    r: &dyn Runner,
    p: &Progress,
    work: &Path,
    cache: &Path,
    agent_layout: &Path,
    kubernetes_bin: Option<&Path>,
    pod_images: bool,
) -> anyhow::Result<Pushed> {
    p.say("starting the registry");
    let mut reg = vm::start_registry(r, work).await?;
    p.say("starting the registry's password-protected instance (the machine image's)");
    registry::start_auth(r, &mut reg).await?;
    let client = vm::registry_client(&reg.host_addr())?;
    let epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    p.say("pushing the agent image");
    let agent_digest = images::push_layout(
        &client,
        agent_layout,
        &format!("{}/aks-flex/agent:dev", reg.host_addr()),
    )
    .await?;
    let guest_registry = reg.guest_addr();
    let agent_image = images::pinned(&format!("{guest_registry}/aks-flex/agent"), &agent_digest);
    let tree = p
        .try_wait(
            "machine rootfs (fixture, built once and cached)",
            fixtures::machine_rootfs_with(r, cache, &|m| p.say(m)),
        )
        .await?;
    let tmp = tempfile::tempdir_in(work)?;
    let machine_digest = images::push_tree_image(
        r,
        &client,
        &tree,
        &format!("{}/aks-flex/machine:dev", reg.host_addr()),
        epoch,
        tmp.path(),
    )
    .await?;
    let (bundle_dir, versions) = p
        .try_wait(
            "component bundle (fixture, built once and cached)",
            fixtures::offline_bundle_with(r, cache, &|m| p.say(m)),
        )
        .await?;
    let (bundle_dir, versions) = match kubernetes_bin {
        None => (bundle_dir, versions),
        Some(bin) => {
            let out = r
                .run(
                    &flex_host::runner::Cmd::new(bin.join("kubelet").display().to_string())
                        .arg("--version"),
                )
                .await?;
            let version = fixtures::parse_kubelet_version(&out.stdout)?;
            p.say(&format!(
                "component bundle with the real Kubernetes {version} binaries of {}",
                bin.display()
            ));
            let dest = work.join("bundle-kubernetes");
            let v = fixtures::bundle_with_kubernetes(&bundle_dir, &versions, bin, &version, &dest)?;
            (dest, v)
        }
    };
    let tmp2 = tempfile::tempdir_in(work)?;
    let bundle_digest = images::push_tree_image(
        r,
        &client,
        &bundle_dir,
        &format!("{}/aks-flex/bundle:dev", reg.host_addr()),
        epoch,
        tmp2.path(),
    )
    .await?;
    // The guest pulls the machine image from the password-protected instance (same storage).
    let machine_registry = reg
        .guest_auth_addr()
        .unwrap_or_else(|| guest_registry.clone());
    Ok(Pushed {
        agent: agent_image,
        machine: images::pinned(
            &format!("{machine_registry}/aks-flex/machine"),
            &machine_digest,
        ),
        bundle: images::pinned(&format!("{guest_registry}/aks-flex/bundle"), &bundle_digest),
        kubernetes: versions.kubernetes,
        pod_mirror: if pod_images {
            p.say("pod images: the pause and probe images, for a node that pulls through the registry");
            push_pod_images(r, &client, &reg, &tree, epoch, work).await?;
            Some(format!("http://{guest_registry}"))
        } else {
            None
        },
        registry: reg,
    })
}

/// The pause stand-in's command. As the real pause does, it waits for ever and exits on SIGTERM
/// or SIGINT: a sandbox's process is PID 1 of its PID namespace, where a signal without a
/// handler is ignored, so a bare `sleep infinity` would hold the machine's shutdown until the
/// stop timeout (found by the NodeReboot check against a real kubelet).
pub const PAUSE_CMD: &[&str] = &[
    "/bin/sh",
    "-c",
    "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done",
];

/// Pushes the images a node's pods need, built from the machine rootfs fixture `tree` (it has
/// a shell and coreutils): the agent's default pause image ([`PAUSE_CMD`]) and the cluster
/// checks' probe image, each under the path its registry would serve it at, so that a node
/// whose containerd mirrors [`provision::MIRRORED_REGISTRIES`] here finds them offline.
async fn push_pod_images(
    r: &dyn Runner,
    client: &flex_oci::RegistryClient,
    reg: &Registry,
    tree: &Path,
    epoch: u64,
    work: &Path,
) -> anyhow::Result<()> {
    for (reference, cmd) in [
        (flex_api::versions::DEFAULT_SANDBOX_IMAGE, PAUSE_CMD),
        (crate::cluster::render::PROBE_IMAGE, &["/bin/sh"][..]),
    ] {
        let tmp = tempfile::tempdir_in(work)?;
        let image = images::TreeImage {
            cmd,
            created_by: "cargo xtask up: pod image from the machine rootfs fixture",
            for_pods: true,
        };
        images::push_tree_image_with(
            r,
            client,
            tree,
            &format!("{}/{}", reg.host_addr(), provision::mirror_path(reference)),
            epoch,
            tmp.path(),
            &image,
        )
        .await?;
    }
    Ok(())
}

/// The node a cluster step joins: its name, its machine image and, with `--k8s-bin-dir`, the
/// bundle with real Kubernetes binaries it installs from.
#[derive(Clone, Copy)]
pub struct JoiningNode<'a> {
    /// The node (and machine) name.
    pub name: &'a str,
    /// The machine rootfs image, pinned.
    pub machine_image: &'a str,
    /// The bundle with real Kubernetes binaries.
    pub bundle: Option<&'a provision::OfflineBundle>,
    /// The registry mirror (`http://10.0.2.2:<port>`) holding the pod images, for a node that
    /// pulls them offline.
    pub mirror: Option<&'a str>,
}

/// `up`'s cluster step, before the Ignition config is rendered: without a request, "not
/// requested"; else [`crate::cluster::up`], and with a cluster the bootstrap inputs that join it
/// ([`crate::provision::cluster_bootstrap_env`]). Without one, `say` tells why and the VM boots
/// offline.
pub async fn cluster_step(
    say: &dyn Fn(&str),
    r: &dyn Runner,
    repo: &Path,
    work: &Path,
    request: Option<&crate::cluster::Request>,
    node: &JoiningNode<'_>,
) -> (Availability, Option<String>) {
    let JoiningNode {
        name: node_name,
        machine_image,
        bundle,
        mirror,
    } = *node;
    let Some(request) = request else {
        return (
            Availability::unavailable(crate::cluster::NOT_REQUESTED),
            None,
        );
    };
    let (api_port, tunnel_port) = match (registry::free_port(), crate::cluster::free_port_any()) {
        (Ok(a), Ok(t)) => (a, t),
        (Err(e), _) | (_, Err(e)) => {
            let reason = format!("no free port for the API server or the kubelet forward: {e}");
            say(&format!("no cluster: {reason}"));
            return (Availability::unavailable(reason), None);
        }
    };
    let provider = crate::cluster::provider();
    let o = crate::cluster::Options {
        repo,
        work,
        controller_layout: request.controller_layout.as_deref(),
        existing: request.existing.as_ref(),
        node_name,
        api_port,
        tunnel_port,
        provider: provider.as_deref(),
        say,
    };
    match crate::cluster::up(r, &o).await {
        Ok(c) => {
            say(&format!(
                "cluster {} ready (Kubernetes {}); the VM joins it at {}",
                c.info.name, c.info.kubernetes_version, c.join.api_server
            ));
            if let Some(b) = bundle
                && b.kubernetes != c.join.kubernetes_version
            {
                say(&format!(
                    "warning: the node runs the bundle's Kubernetes {} against a {} control plane",
                    b.kubernetes, c.join.kubernetes_version
                ));
            }
            let env = crate::provision::cluster_bootstrap_env(
                &c.join,
                machine_image,
                &provision::hostile_location(),
                bundle,
                mirror,
            );
            (Availability::Ready(Box::new(c.info)), Some(env))
        }
        Err(reason) => {
            say(&format!(
                "no cluster: {reason}; the VM boots offline and check reports the cluster groups skipped"
            ));
            (Availability::unavailable(reason.to_string()), None)
        }
    }
}

/// Renders the Ignition config (the harness's additions with `env` as the bootstrap inputs)
/// into `<work>/config.ign`.
fn write_ignition(
    repo: &Path,
    work: &Path,
    opts: &UpOptions,
    os: &OsBoot,
    images: &Pushed,
    ssh_public_key: String,
    env: &str,
) -> anyhow::Result<()> {
    let render = match opts.mode {
        AgentMode::Image => provision::render,
        AgentMode::Host => provision::render_host,
    };
    let json = render(
        repo,
        &Additions {
            ssh_public_key,
            hostname: HOSTNAME.into(),
            image: flex_ignition::node::AgentImage {
                reference: images.agent.clone(),
                plain_http: true,
                insecure_registries: vec![images.registry.guest_addr()],
            },
            bootstrap_env: Some(env.to_string()),
            registry_auth: images.registry.guest_credentials(),
            label_containerd: opts.labels_containerd(),
        },
        os.spec,
    )?;
    std::fs::write(work.join("config.ign"), json)?;
    Ok(())
}

/// KVM when a probe boot of the OS's kernel shows it works (and it was asked for), else TCG;
/// and why.
async fn accelerator(
    r: &dyn Runner,
    p: &Progress,
    work: &Path,
    os: &OsBoot,
    opts: &UpOptions,
) -> (Accel, String) {
    let (accel, reason) = match &os.kernel_for_probe {
        Some(k) => {
            p.wait("KVM probe boot", vm::choose_accel(r, work, k, opts.try_kvm))
                .await
        }
        None if opts.try_kvm => (Accel::Kvm, "ACL boots with UEFI; KVM asked for".into()),
        None => (Accel::Tcg, "TCG requested".into()),
    };
    p.say(&reason);
    (accel, reason)
}

/// Boots QEMU, records the VM's state and waits for the guest to answer SSH.
#[allow(clippy::too_many_arguments)]
async fn first_boot(
    r: &dyn Runner,
    p: &Progress,
    work: &Path,
    opts: &UpOptions,
    os: OsBoot,
    accel: Accel,
    accel_reason: String,
    images: Pushed,
    env: String,
) -> anyhow::Result<(State, crate::qemu::QemuSpec)> {
    let ssh_port = registry::free_port()?;
    let qspec = vm::qemu_spec(work, accel, opts, os.boot, os.fw_key, ssh_port);
    p.say(&format!(
        "booting ({})",
        if accel == Accel::Kvm { "kvm" } else { "tcg" }
    ));
    let pid = vm::boot(r, &qspec).await?;
    let ssh = Ssh {
        port: ssh_port,
        key: work.join("id_ed25519"),
    };
    let state = State {
        work: work.to_path_buf(),
        qemu_pid: Some(pid),
        registry: Some(images.registry),
        ssh: ssh.clone(),
        accel: if accel == Accel::Kvm { "kvm" } else { "tcg" }.into(),
        accel_reason,
        agent_image: images.agent,
        machine_image: Some(images.machine),
        bundle: Some(images.bundle),
        bootstrap_env: Some(env),
        snapshot: None,
        timings: Vec::new(),
        cluster: None,
        mode: opts.mode,
        served: None,
    };
    state.save()?;
    p.try_wait(
        "first boot: waiting for the guest to answer SSH",
        vm::wait_ssh(r, &ssh, &state.serial_log(), pid, opts.boot_timeout),
    )
    .await?;
    Ok((state, qspec))
}

/// Waits for the agent's bootstrap after the first boot; a failure carries the bootstrap's and
/// the agent's journal.
async fn wait_first_bootstrap(
    r: &dyn Runner,
    p: &Progress,
    state: &State,
    opts: &UpOptions,
) -> anyhow::Result<()> {
    let waited = p
        .try_wait(
            "waiting for the agent's bootstrap (pull, machine, kubelet stand-in)",
            wait_bootstrapped(r, &state.ssh, opts.bootstrap_timeout),
        )
        .await;
    if let Err(e) = waited {
        let journal = state
            .ssh
            .output(r, "journalctl -b --no-pager -n 150 -u aks-flex-node-bootstrap.service -u aks-flex-node-agent.service", Duration::from_secs(60))
            .await
            .map(|o| o.stdout)
            .unwrap_or_default();
        anyhow::bail!("{e:#}\njournal:\n{journal}");
    }
    Ok(())
}

/// After the first boot of a direct-kernel ACL: powers the guest off and starts QEMU again
/// with the later boots' command line (no `flatcar.first_boot`), so that a reboot in the guest
/// (QEMU keeps `-append` across resets) does not run Ignition again; then waits for SSH and
/// the agent as after the first boot. The first boot's console log is kept beside the new one.
async fn restart_for_later_boots(
    r: &dyn Runner,
    p: &Progress,
    state: &mut State,
    qspec: &mut crate::qemu::QemuSpec,
    append: String,
    opts: &UpOptions,
) -> anyhow::Result<()> {
    if let Boot::Kernel { append: a, .. } = &mut qspec.boot {
        *a = append;
    }
    let old = state.qemu_pid.unwrap_or_default();
    p.try_wait(
        "restarting QEMU with the later boots' command line (Ignition ran once)",
        async {
            let _ = state
                .ssh
                .output(r, "systemctl poweroff", Duration::from_secs(20))
                .await;
            // Still running after the wait: killed below.
            let _ = flex_host::retry::wait_until(
                "QEMU to exit after the poweroff",
                Duration::from_secs(180),
                Duration::from_secs(1),
                || async {
                    if Path::new(&format!("/proc/{old}")).exists() {
                        Err(format!("QEMU {old} runs"))
                    } else {
                        Ok(())
                    }
                },
            )
            .await;
            vm::kill_qemu(old).await;
            let serial = state.serial_log();
            let _ = std::fs::rename(&serial, state.work.join("serial-first-boot.log"));
            let pid = vm::boot(r, qspec).await?;
            state.qemu_pid = Some(pid);
            state.save()?;
            let state: &State = state;
            vm::wait_ssh(r, &state.ssh, &serial, pid, opts.boot_timeout).await?;
            wait_bootstrapped(r, &state.ssh, opts.bootstrap_timeout).await
        },
    )
    .await
}

/// Waits until the host bootstrapped (the daemon's state saved, the agent's unit active),
/// looking every 5 s; fails at once when the bootstrap unit failed or the guest cannot be
/// asked.
async fn wait_bootstrapped(r: &dyn Runner, ssh: &Ssh, timeout: Duration) -> anyhow::Result<()> {
    flex_host::retry::wait_until(
        "the host to bootstrap",
        timeout,
        Duration::from_secs(5),
        || async {
            // `Ok(Err(…))` ends the wait with that error.
            let o = match ssh
                .output(
                    r,
                    "systemctl is-failed --quiet aks-flex-node-bootstrap.service && echo FAILED; \
                     test -s /etc/aks-flex-node/daemon-state.json && systemctl is-active --quiet aks-flex-node-agent.service && echo READY; true",
                    Duration::from_secs(60),
                )
                .await
            {
                Ok(o) => o,
                Err(e) => return Ok(Err(e)),
            };
            if o.stdout.contains("READY") {
                return Ok(Ok(()));
            }
            if o.stdout.contains("FAILED") {
                return Ok(Err(anyhow::anyhow!(
                    "aks-flex-node-bootstrap.service failed"
                )));
            }
            Err(o.stdout.trim().to_string())
        },
    )
    .await
    .map_err(|_| anyhow::anyhow!("the host did not bootstrap within {timeout:?}"))?
}

/// Which groups `check` runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// `--only a,b`, or every group but those run only on request (`None`).
    Only(Option<String>),
    /// `--rerun-failed`: the groups that failed in the last run (`last-run.json`).
    RerunFailed,
}

/// `check`: runs the selected groups, keeps each group's journal and console excerpt under
/// `<work>/<group>/` ([`crate::artefacts`]), prints the timing table, writes JUnit and, next to
/// it, `report.html` (whatever the outcome), records which groups failed (`last-run.json`, for
/// `--rerun-failed`), and on failure prints the journal lines that explain it. Returns whether
/// everything passed.
pub async fn check(
    r: &dyn Runner,
    work: &Path,
    selection: Selection,
    no_snapshot: bool,
    junit: &Path,
) -> anyhow::Result<bool> {
    let (only, note) = match selection {
        Selection::Only(only) => (only, None),
        Selection::RerunFailed => {
            let last = crate::artefacts::LastRun::load(work)?;
            match crate::artefacts::rerun_selection(last.as_ref())? {
                Some(failed) => {
                    let note = format!("rerun of the groups that failed in the last run: {failed}");
                    (Some(failed), Some(note))
                }
                None => {
                    println!(
                        "check --rerun-failed: no group failed in the last run; nothing to rerun"
                    );
                    return Ok(true);
                }
            }
        }
    };
    let selected = groups::select(only.as_deref())?;
    let state =
        State::load(work)?.ok_or_else(|| anyhow::anyhow!("no VM: run `cargo xtask up` first"))?;
    // An unreadable record is no cluster; the groups' skip reason says why.
    let cluster = crate::cluster::load(work).is_ok_and(|a| a.info().is_some());
    let ctx = Ctx {
        state: &state,
        ssh: &state.ssh,
        cluster,
        runner: r,
    };
    let use_snapshot = !no_snapshot && state.snapshot.is_some();
    let p = Progress::new();
    if let Some(n) = &note {
        p.say(n);
    }
    let mut run = RunReport {
        note,
        ..RunReport::default()
    };
    for g in &selected {
        let restore = use_snapshot && g.needs == Needs::Host;
        let span = crate::artefacts::begin(&state.serial_log());
        let report = p
            .wait(
                &format!("group {}", g.name),
                groups::run_group(&ctx, g, restore),
            )
            .await;
        // A group skipped for want of a cluster ran nothing in the guest: nothing to keep.
        let ran = !report
            .checks
            .iter()
            .all(|c| matches!(c.outcome, report::Outcome::Skipped(_)));
        if ran {
            match crate::artefacts::collect(r, &state.ssh, work, &state.serial_log(), g.name, span)
                .await
            {
                Ok(_) => {
                    run.artefacts.insert(g.name.to_string());
                }
                Err(e) => p.say(&format!(
                    "warning: {}'s journal and console not kept: {e:#}",
                    g.name
                )),
            }
        }
        run.groups.push(report);
    }
    let table = report::render_table(&run);
    std::fs::write(junit, report::render_junit(&run))?;
    let html = junit.with_file_name("report.html");
    std::fs::write(&html, report::render_html(&run))?;
    crate::artefacts::LastRun::of(&run).save(work)?;
    if !run.success() {
        eprintln!(
            "journal of the agent's units:\n{}",
            crate::check::failure_journal(r, &state.ssh).await
        );
    }
    print!("{table}");
    eprintln!("JUnit report: {}", junit.display());
    eprintln!("HTML report: {}", html.display());
    if !run.artefacts.is_empty() {
        eprintln!(
            "each group's journal and console: {}/<group>/{{{},{}}}",
            work.display(),
            crate::artefacts::JOURNAL,
            crate::artefacts::CONSOLE
        );
    }
    Ok(run.success())
}

/// `down`: deletes the kind cluster of `up --cluster` (and stops its kubelet forward), stops
/// the checks' Prometheus and its forward, then stops the VM and the registry, every command through `r`; a cluster that could not be
/// deleted is an error, after the VM is down.
pub async fn down(r: &dyn Runner, work: &Path) -> anyhow::Result<()> {
    let provider = crate::cluster::provider();
    let cluster = crate::cluster::down(r, work, provider.as_deref()).await;
    let prometheus = crate::prometheus::down(r, work).await;
    vm::down(r, work).await?;
    cluster?;
    prometheus
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pod images sit in the mirror where containerd asks for them: the repository path
    /// without the registry host, for the pause image the agent configures and the probe's.
    #[test]
    fn mirror_paths() {
        assert_eq!(
            provision::mirror_path(flex_api::versions::DEFAULT_SANDBOX_IMAGE),
            "oss/v2/kubernetes/pause:3.9"
        );
        assert_eq!(
            provision::mirror_path(crate::cluster::render::PROBE_IMAGE),
            "e2e-test-images/busybox:1.36.1-1"
        );
        for image in [
            flex_api::versions::DEFAULT_SANDBOX_IMAGE,
            crate::cluster::render::PROBE_IMAGE,
        ] {
            let registry = image.split('/').next().unwrap();
            assert!(
                provision::MIRRORED_REGISTRIES.contains(&registry),
                "{image}"
            );
        }
    }

    #[test]
    fn offline_env_is_valid_bootstrap_input() {
        let env = offline_bootstrap_env(
            "10.0.2.100:5001/aks-flex/machine@sha256:00",
            "10.0.2.100:5000/aks-flex/bundle@sha256:11",
            "1.35.0",
        );
        let vars = flex_api::bootstrap_env::parse(&env).unwrap();
        let loc = vars
            .iter()
            .find(|e| e.key == "AKS_FLEX_NODE_LOCATION")
            .map(|e| e.value.clone())
            .unwrap();
        assert_eq!(loc, provision::hostile_location());
        // The harness's registries (the machine image's password-protected instance and the
        // bundle's), and only they, are opted in to plain HTTP.
        let insecure: Vec<&str> = vars
            .iter()
            .filter(|e| e.key == "AKS_FLEX_NODE_INSECURE_REGISTRIES")
            .map(|e| e.value.as_str())
            .collect();
        assert_eq!(insecure, ["10.0.2.100:5001,10.0.2.100:5000"]);
    }
}
