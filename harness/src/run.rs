//! The harness's entry points, as `cargo xtask` calls them: [`up`], [`check`] and [`down`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flex_host::runner::{ProcessRunner, Runner};

use crate::acl::{self, AclBoot};
use crate::checks::{self, Ctx};
use crate::devhost::{self, Suite};
use crate::fixtures;
use crate::groups::{self, Needs};
use crate::images;
use crate::provision::{self, Additions};
use crate::qemu::{Accel, Boot};
use crate::registry;
use crate::report::{self, RunReport};
use crate::ssh::{self, Ssh};
use crate::vm::{self, OsImage, Progress, State, UpOptions};

/// The hostname the harness gives the guest.
pub const HOSTNAME: &str = "flex-dev-node";

/// A self-signed CA certificate (base64 PEM) standing in for the cluster CA: offline there is
/// no cluster, but the config must still name a well-formed CA.
const OFFLINE_CA: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJ4ekNDQVcyZ0F3SUJBZ0lVVXhTQmRqeG8zUm9aQnB2ajkyd0FPdXZSQktFd0NnWUlLb1pJemowRUF3SXcKT0RFMk1EUUdBMVVFQXd3dFlXdHpMV1pzWlhndGJtOWtaU0J2Wm1ac2FXNWxJR2hoY201bGMzTWdRMEVnS0c1dgpJR05zZFhOMFpYSXBNQ0FYRFRJMk1USXdNakUyTWpFd04xb1lEekl4TWpZeE1UQTRNVFl5TVRBM1dqQTRNVFl3Ck5BWURWUVFEREMxaGEzTXRabXhsZUMxdWIyUmxJRzltWm14cGJtVWdhR0Z5Ym1WemN5QkRRU0FvYm04Z1kyeDEKYzNSbGNpa3dXVEFUQmdjcWhrak9QUUlCQmdncWhrak9QUU1CQndOQ0FBVHhQc2pNZWRkT3hZaFVyQmFHckU0SAphL0pNZG5PYzhGb042SUpKTll2UUNxbWNpaU9mZkV6YklmWHAwYjliUnFYUml6Njk4TWttQ2Q2QzdSc0FhbjJjCm8xTXdVVEFkQmdOVkhRNEVGZ1FVSGhLNVM3QlJBcGZHUmVRN1JjU1NqenlZY1RNd0h3WURWUjBqQkJnd0ZvQVUKSGhLNVM3QlJBcGZHUmVRN1JjU1NqenlZY1RNd0R3WURWUjBUQVFIL0JBVXdBd0VCL3pBS0JnZ3Foa2pPUFFRRApBZ05JQURCRkFpRUE2YnZsVm5xODJhYlU5N01mQVJScFJyZHlpa0hNUDVaVFhXWjYvUTFwTVVJQ0lBOU1ic2FXCkg1aGFTYVdzcU5KN05WQzQya21JL0dZYk01RDJwdGYvcnA3cgotLS0tLUVORCBDRVJUSUZJQ0FURS0tLS0tCg==";

/// The bootstrap inputs for an offline host.
pub fn offline_bootstrap_env(machine_image: &str, bundle: &str, kubernetes: &str) -> String {
    let loc = checks::hostile_location().replace('\'', "");
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
        "AKS_FLEX_NODE_LOG_LEVEL=debug".into(),
        "AKS_FLEX_NODE_PREFLIGHT_IGNORE=api-server-reachable,disk-space".into(),
        String::new(),
    ]
    .join("\n")
}

/// Checks that what `up` needs is installed, naming the missing packages otherwise. `cargo
/// xtask up` installs them before it builds the harness (xtask/src/deps.rs: the one place the
/// project installs packages).
pub async fn ensure_tools(_progress: &Progress) -> anyhow::Result<()> {
    let r = ProcessRunner::new();
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
struct Cleanup {
    work: PathBuf,
    armed: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        eprintln!("up failed: stopping the VM, the registry and the kind cluster it started");
        let work = self.work.clone();
        // Drop cannot await: run `down` on a fresh single-threaded runtime in its own thread.
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                let _ = rt.block_on(async {
                    let provider = crate::cluster::provider();
                    let _ = crate::cluster::down(&ProcessRunner::new(), &work, provider.as_deref())
                        .await;
                    vm::down(&work).await
                });
            }
        })
        .join();
    }
}

/// `up`: boots the VM with the agent bootstrapped in its container. `agent_layout` is the
/// agent's OCI image layout (`cargo xtask image`). With `cluster` (`up --cluster`), the VM
/// joins a kind cluster made first ([`crate::cluster`]); where none can be made, it boots
/// offline and the reason is recorded for `check`.
pub async fn up(
    repo: &Path,
    work: &Path,
    agent_layout: &Path,
    opts: &UpOptions,
    cluster: Option<&crate::cluster::Request>,
) -> anyhow::Result<State> {
    let p = Progress::new();
    let mut timings: Vec<(String, f64)> = Vec::new();
    let mut phase = Instant::now();
    let mut lap = |name: &str, timings: &mut Vec<(String, f64)>| {
        timings.push((name.to_string(), phase.elapsed().as_secs_f64()));
        phase = Instant::now();
    };
    ensure_tools(&p).await?;
    if vm::State::load(work)?.is_some() {
        p.say("replacing the VM of an earlier up");
    }
    let provider = crate::cluster::provider();
    if let Err(e) = crate::cluster::down(&ProcessRunner::new(), work, provider.as_deref()).await {
        p.say(&format!(
            "warning: the kind cluster of an earlier up stays: {e:#}"
        ));
    }
    vm::down(work).await?;
    std::fs::create_dir_all(work)?;
    let mut guard = Cleanup {
        work: work.to_path_buf(),
        armed: true,
    };
    let cache = devhost::default_cache_root();

    // A direct kernel boot of ACL runs Ignition on its first boot only; the later boots'
    // command line (without `flatcar.first_boot`) replaces it once the host is bootstrapped.
    let mut later_append: Option<String> = None;
    let (base, boot, fw_key, spec, kernel_for_probe) = match &opts.os {
        OsImage::DevHost => {
            let img = p
                .try_wait(
                    "dev host image (built once per recipe, cached)",
                    devhost::ensure(&cache, Suite::Bookworm, &|m| p.say(m)),
                )
                .await?;
            let boot = Boot::Kernel {
                kernel: img.kernel.clone(),
                initrd: Some(img.initrd.clone()),
                append: crate::qemu::dev_host_append(&[]),
            };
            (
                img.disk.clone(),
                boot,
                devhost::FWCFG_IGNITION_KEY,
                flex_ignition::SpecVersion::V3_3_0,
                Some(img.kernel.clone()),
            )
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
                    acl::boot::prepare(&ProcessRunner::new(), image, &work.join("acl-boot"), mode),
                )
                .await?;
            match decided {
                AclBoot::Uefi { why } => {
                    p.say(&format!("ACL boots with UEFI: {why}"));
                    let vars = work.join("OVMF_VARS.fd");
                    std::fs::copy(ovmf_vars, &vars).map_err(|e| {
                        anyhow::anyhow!("copying the OVMF variables {}: {e}", ovmf_vars.display())
                    })?;
                    (
                        image.clone(),
                        Boot::Uefi {
                            code: ovmf_code.clone(),
                            vars,
                        },
                        crate::qemu::FWCFG_FLATCAR,
                        flex_ignition::SpecVersion::V3_4_0,
                        None,
                    )
                }
                AclBoot::Kernel {
                    kernel,
                    initrd,
                    first_boot_append,
                    append,
                    why,
                } => {
                    p.say(&format!("ACL boots its kernel directly: {why}"));
                    later_append = Some(append);
                    (
                        image.clone(),
                        Boot::Kernel {
                            kernel: kernel.clone(),
                            initrd,
                            append: first_boot_append,
                        },
                        crate::qemu::FWCFG_FLATCAR,
                        flex_ignition::SpecVersion::V3_4_0,
                        Some(kernel),
                    )
                }
            }
        }
    };
    lap("os image", &mut timings);

    p.say("starting the registry");
    let reg = vm::start_registry(work).await?;
    let client = vm::registry_client()?;
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
            fixtures::machine_rootfs_with(&cache, &|m| p.say(m)),
        )
        .await?;
    let tmp = tempfile::tempdir_in(work)?;
    let machine_digest = images::push_tree_image(
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
            fixtures::offline_bundle_with(&cache, &|m| p.say(m)),
        )
        .await?;
    let tmp2 = tempfile::tempdir_in(work)?;
    let bundle_digest = images::push_tree_image(
        &client,
        &bundle_dir,
        &format!("{}/aks-flex/bundle:dev", reg.host_addr()),
        epoch,
        tmp2.path(),
    )
    .await?;
    let machine_image = images::pinned(
        &format!("{guest_registry}/aks-flex/machine"),
        &machine_digest,
    );
    let bundle = images::pinned(&format!("{guest_registry}/aks-flex/bundle"), &bundle_digest);
    lap("registry and images", &mut timings);

    let key = work.join("id_ed25519");
    let pubkey = ssh::ensure_key(&key).await?;
    let (availability, cluster_env) =
        crate::cluster::up_step(&|m| p.say(m), repo, work, cluster, HOSTNAME, &machine_image).await;
    if cluster.is_some() {
        lap("kind cluster", &mut timings);
    }
    let env = cluster_env
        .unwrap_or_else(|| offline_bootstrap_env(&machine_image, &bundle, &versions.kubernetes));
    let json = provision::render(
        repo,
        &Additions {
            ssh_public_key: pubkey,
            hostname: HOSTNAME.into(),
            agent_image: agent_image.clone(),
            pull_args: "--plain-http".into(),
            bootstrap_env: Some(env.clone()),
            label_containerd: opts.label_containerd,
        },
        spec,
    )?;
    std::fs::write(work.join("config.ign"), json)?;
    vm::create_overlay(&base, &work.join("disk.qcow2")).await?;

    let (accel, reason) = match &kernel_for_probe {
        Some(k) => {
            p.wait("KVM probe boot", vm::choose_accel(work, k, opts.try_kvm))
                .await
        }
        None if opts.try_kvm => (Accel::Kvm, "ACL boots with UEFI; KVM asked for".into()),
        None => (Accel::Tcg, "TCG requested".into()),
    };
    p.say(&reason);
    lap("kvm probe", &mut timings);

    let ssh_port = registry::free_port()?;
    let mut qspec = vm::qemu_spec(work, accel, opts, boot, fw_key, ssh_port);
    p.say(&format!(
        "booting ({})",
        if accel == Accel::Kvm { "kvm" } else { "tcg" }
    ));
    let pid = vm::boot(&qspec).await?;
    let ssh = Ssh {
        port: ssh_port,
        key,
    };
    let mut state = State {
        work: work.to_path_buf(),
        qemu_pid: Some(pid),
        registry: Some(reg),
        ssh: ssh.clone(),
        accel: if accel == Accel::Kvm { "kvm" } else { "tcg" }.into(),
        accel_reason: reason,
        agent_image,
        machine_image: Some(machine_image),
        bundle: Some(bundle),
        bootstrap_env: Some(env),
        snapshot: None,
        timings: Vec::new(),
        cluster: None,
    };
    state.save()?;
    p.try_wait(
        "first boot: waiting for the guest to answer SSH",
        vm::wait_ssh(&ssh, &state.serial_log(), pid, opts.boot_timeout),
    )
    .await?;
    lap("first boot", &mut timings);

    let ctx = Ctx {
        state: &state,
        ssh: &ssh,
        cluster: false,
    };
    let waited = p
        .try_wait(
            "waiting for the agent's bootstrap (pull, machine, kubelet stand-in)",
            wait_bootstrapped(&ctx, opts.bootstrap_timeout),
        )
        .await;
    if let Err(e) = waited {
        let journal = ssh
            .output("journalctl -b --no-pager -n 150 -u aks-flex-node-bootstrap.service -u aks-flex-node-agent.service", Duration::from_secs(60))
            .await
            .map(|o| o.stdout)
            .unwrap_or_default();
        anyhow::bail!("{e:#}\njournal:\n{journal}");
    }
    lap("bootstrap", &mut timings);
    if let Some(append) = later_append {
        restart_for_later_boots(&p, &mut state, &mut qspec, append, opts).await?;
        lap("restart (later boots' cmdline)", &mut timings);
    }
    if let Some(info) = availability.info() {
        crate::cluster::joined_step(&|m| p.say(m), &state.ssh, info).await;
        lap("node joined", &mut timings);
    }
    if opts.snapshot {
        let secs = vm::save_snapshot(&mut state).await?;
        p.say(&format!(
            "snapshot {} saved in {secs:.2}s",
            vm::READY_SNAPSHOT
        ));
        lap("savevm", &mut timings);
    }
    state.timings = timings;
    state.save()?;
    crate::cluster::record(work, &availability)?;
    guard.armed = false;
    p.say("up: the host is bootstrapped and the agent runs in its container");
    for (n, s) in &state.timings {
        eprintln!("  {n:<22} {s:>7.1}s");
    }
    Ok(state)
}

/// After the first boot of a direct-kernel ACL: powers the guest off and starts QEMU again
/// with the later boots' command line (no `flatcar.first_boot`), so that a reboot in the guest
/// (QEMU keeps `-append` across resets) does not run Ignition again; then waits for SSH and
/// the agent as after the first boot. The first boot's console log is kept beside the new one.
async fn restart_for_later_boots(
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
                .output("systemctl poweroff", Duration::from_secs(20))
                .await;
            let deadline = Instant::now() + Duration::from_secs(180);
            while Path::new(&format!("/proc/{old}")).exists() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            vm::kill_qemu(old).await;
            let serial = state.serial_log();
            let _ = std::fs::rename(&serial, state.work.join("serial-first-boot.log"));
            let pid = vm::boot(qspec).await?;
            state.qemu_pid = Some(pid);
            state.save()?;
            let state: &State = state;
            vm::wait_ssh(&state.ssh, &serial, pid, opts.boot_timeout).await?;
            let ctx = Ctx {
                state,
                ssh: &state.ssh,
                cluster: false,
            };
            wait_bootstrapped(&ctx, opts.bootstrap_timeout).await
        },
    )
    .await
}

async fn wait_bootstrapped(ctx: &Ctx<'_>, timeout: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let o = ctx
            .ssh
            .output(
                "systemctl is-failed --quiet aks-flex-node-bootstrap.service && echo FAILED; \
                 test -s /etc/aks-flex-node/daemon-state.json && systemctl is-active --quiet aks-flex-node-agent.service && echo READY; true",
                Duration::from_secs(60),
            )
            .await?;
        if o.stdout.contains("READY") {
            return Ok(());
        }
        if o.stdout.contains("FAILED") {
            anyhow::bail!("aks-flex-node-bootstrap.service failed");
        }
        if start.elapsed() > timeout {
            anyhow::bail!("the host did not bootstrap within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// `check`: runs the selected groups, prints the timing table, writes JUnit, and on failure
/// prints the journal lines that explain it. Returns whether everything passed.
pub async fn check(
    work: &Path,
    only: Option<&str>,
    no_snapshot: bool,
    junit: &Path,
) -> anyhow::Result<bool> {
    let selected = groups::select(only)?;
    let state =
        State::load(work)?.ok_or_else(|| anyhow::anyhow!("no VM: run `cargo xtask up` first"))?;
    // An unreadable record is no cluster; the groups' skip reason says why.
    let cluster = crate::cluster::load(work).is_ok_and(|a| a.info().is_some());
    let ctx = Ctx {
        state: &state,
        ssh: &state.ssh,
        cluster,
    };
    let use_snapshot = !no_snapshot && state.snapshot.is_some();
    let p = Progress::new();
    let mut run = RunReport::default();
    for g in &selected {
        let restore = use_snapshot && g.needs == Needs::Host;
        let report = p
            .wait(
                &format!("group {}", g.name),
                checks::run_group(&ctx, g, restore),
            )
            .await;
        run.groups.push(report);
    }
    let table = report::render_table(&run);
    std::fs::write(junit, report::render_junit(&run))?;
    if !run.success() {
        eprintln!(
            "journal of the agent's units:\n{}",
            checks::failure_journal(&state.ssh).await
        );
    }
    print!("{table}");
    eprintln!("JUnit report: {}", junit.display());
    Ok(run.success())
}

/// `down`: deletes the kind cluster of `up --cluster` (and stops its kubelet forward), then
/// stops the VM and the registry; a cluster that could not be deleted is an error, after the
/// VM is down.
pub async fn down(work: &Path) -> anyhow::Result<()> {
    let provider = crate::cluster::provider();
    let cluster = crate::cluster::down(&ProcessRunner::new(), work, provider.as_deref()).await;
    vm::down(work).await?;
    cluster
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offline_env_is_valid_bootstrap_input() {
        let env = offline_bootstrap_env(
            "10.0.2.100:5000/aks-flex/machine@sha256:00",
            "10.0.2.100:5000/aks-flex/bundle@sha256:11",
            "1.35.0",
        );
        let vars = aks_flex_node::bootstrap::env::parse(&env).unwrap();
        let loc = vars
            .iter()
            .find(|e| e.key == "AKS_FLEX_NODE_LOCATION")
            .map(|e| e.value.clone())
            .unwrap();
        assert_eq!(loc, checks::hostile_location());
    }
}
