//! The agent's image in a REAL containerd, against a fake host served by REAL components.
//!
//! Debian's `containerd` (1.6 on bookworm) runs with its own config (root, state and socket in a
//! temporary directory, CRI disabled), started by the test and killed when it ends. The image is
//! built by [`flex_image::build_agent_image`] from the workspace's `aks-flex-node` binary,
//! imported with `ctr images import` and run with `ctr run --privileged --net-host --with-ns
//! pid:… --mount …,dst=/host,…`, as the host's unit runs it. The fake host root is a temporary
//! directory with `/bin/sh` from `busybox-static`, a fake `systemctl` script, `os-release`, and
//! `run/dbus/system_bus_socket` served by a private `dbus-daemon` on which the test owns
//! `org.freedesktop.systemd1` (a zbus object whose `Manager.Version` is `257-fake`).
//!
//! The test shows: (a) the entrypoint mounts the host paths (it creates the missing ones on the
//! fake host), reaches "systemd" over D-Bus (its stderr names `257-fake`) and execs the command
//! (`aks-flex-node debug resolve localhost` → `127.0.0.1`); (b) a host tool name runs the host's
//! program under `chroot /host` (`systemctl is-active x` → the fake script's output); (c)
//! `umount` runs in the mount namespace of the container's PID 1 and removes a tmpfs the test
//! mounted on this machine; (d) the binary speaks TLS with the image's libraries
//! (`debug https-get` against a rustls server with an rcgen CA → `200`, by IP and by name);
//! (e) without the host mounted, the entrypoint exits non-zero naming `/host`; (f) the agent
//! unit's way of running the daemon: a detached task (`ctr run -d`, output to a FIFO held
//! read-write) and `aks-flex-node wait-task` started from the running container's image
//! (`/proc/<pid>/root/…`, where the test task's root holds a copy of the image's binary), with
//! the FIFO as stdin: the waiter exits with the task's status (3),
//! relays its stdout and stderr, rides out containerd killed and started again (the task exiting
//! with 5 while containerd is away; the task running on), and forwards SIGTERM (143).
//!
//! PID namespace: in production the container joins the host's (`pid:/proc/1/ns/pid`). Where
//! this machine's PID 1 refuses access to its namespaces (a sandbox's init) or lives in another
//! mount namespace, the test starts a stand-in init (`unshare --pid --fork sleep`), a process of
//! this machine's mount namespace that is PID 1 of a new PID namespace, and the container joins
//! that one: `/proc/1/ns/mnt` inside the container is then this machine's, as the host's would be.
//!
//! Needs root and the Debian packages `containerd runc dbus busybox-static` (CI installs them;
//! without them the test fails and says what to install). As non-root it prints "skipped".

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flex_host::hostinfo::{HostInfo, RealHostInfo};
use flex_host::runner::{Cmd, Output, ProcessRunner, Runner, run_inherited, which_on};
use flex_image::{AgentImageOptions, ImageInfo, build_agent_image};

use flex_tests::daemon::{Daemon, spawn_daemon, wait_for};

const PACKAGES: &str = "containerd runc dbus busybox-static";
const NAMESPACE: &str = "flex";

/// Fails (never passes silently) when a component is missing.
async fn require_packages() {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut missing: Vec<String> = ["containerd", "ctr", "runc", "dbus-daemon", "unshare"]
        .iter()
        .filter(|p| which_on(p, Some(&path)).is_none())
        .map(|p| p.to_string())
        .collect();
    let st = ProcessRunner::new()
        .output(&Cmd::new("dpkg-query").args([
            "--show",
            "--showformat=${db:Status-Status}",
            "busybox-static",
        ]))
        .await
        .map(|o| o.stdout)
        .unwrap_or_default();
    if st.trim() != "installed" || !Path::new("/bin/busybox").is_file() {
        missing.push("busybox (static)".into());
    }
    assert!(
        missing.is_empty(),
        "missing {missing:?}: run `apt-get install -y {PACKAGES}` (CI installs them)"
    );
}

fn newest_mtime(dir: &Path) -> std::time::SystemTime {
    let mut newest = std::time::UNIX_EPOCH;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let t = if p.is_dir() {
            newest_mtime(&p)
        } else {
            std::fs::metadata(&p).unwrap().modified().unwrap()
        };
        newest = newest.max(t);
    }
    newest
}

/// The workspace's `aks-flex-node` binary: the newer of debug and release, built (debug) when
/// missing or older than the agent's sources.
async fn agent_binary() -> PathBuf {
    let root = flex_tests::workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| if t.is_absolute() { t } else { root.join(t) })
        .unwrap_or_else(|| root.join("target"));
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let sources =
        newest_mtime(&root.join("agent/src")).max(mtime(&root.join("agent/Cargo.toml")).unwrap());
    let candidates = [
        target.join("debug/aks-flex-node"),
        target.join("release/aks-flex-node"),
    ];
    let best = candidates
        .iter()
        .filter_map(|p| mtime(p).map(|t| (t, p.clone())))
        .max();
    match best {
        Some((t, p)) if t >= sources => p,
        _ => {
            eprintln!("building aks-flex-node (debug): missing or older than agent/src");
            run_inherited(
                &Cmd::new("cargo")
                    .args(["build", "-p", "aks-flex-node", "--manifest-path"])
                    .arg(root.join("Cargo.toml").to_string_lossy())
                    .timeout(Duration::from_secs(1800)),
            )
            .await
            .unwrap();
            candidates[0].clone()
        }
    }
}

/// Waits (60 s at most) until `ctr version` gets an answer from the containerd at `sock`.
async fn wait_for_containerd(what: &str, containerd: &Daemon, sock: &str) {
    let version_cmd = Cmd::new("ctr").args(["--address", sock, "version"]);
    wait_for(what, containerd, Duration::from_secs(60), async || {
        ProcessRunner::new()
            .output(&version_cmd)
            .await
            .is_ok_and(|o| o.success())
    })
    .await;
}

/// The stand-in `org.freedesktop.systemd1`.
struct FakeSystemd;

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl FakeSystemd {
    #[zbus(property)]
    fn version(&self) -> String {
        "257-fake".into()
    }
}

fn dbus_config(socket: &Path) -> String {
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"#,
        socket.display()
    )
}

fn containerd_config(dir: &Path) -> String {
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = "{d}/containerd.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
"#,
        d = dir.display()
    )
}

/// A TLS server on 127.0.0.1 answering every request with 200, for at most `max` connections.
fn https_server(cert_der: Vec<u8>, key_der: Vec<u8>, max: usize) -> u16 {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert_der)],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_der)),
        )
        .unwrap();
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(max) {
            let Ok(tcp) = stream else { continue };
            let _ = tcp.set_read_timeout(Some(Duration::from_secs(10)));
            let conn = rustls::ServerConnection::new(config.clone()).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match tls.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let _ = tls.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\nok\n",
            );
            let _ = tls.flush();
            tls.conn.send_close_notify();
            let _ = tls.flush();
        }
    });
    port
}

/// A tmpfs on this machine, unmounted on drop if a check left it mounted.
struct ProbeMount(PathBuf);

impl ProbeMount {
    fn mounted(&self) -> bool {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let target = self.0.to_string_lossy().into_owned();
        mountinfo
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(target.as_str()))
    }
}

impl Drop for ProbeMount {
    fn drop(&mut self) {
        if self.mounted() {
            let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

/// Everything the scenario runs against.
struct Env {
    sock: String,
    snapshotter: String,
    pid_ns: String,
    host: PathBuf,
    image: ImageInfo,
    containerd: Daemon,
    containerd_config: PathBuf,
    dbus: Daemon,
    runs: std::cell::Cell<u32>,
}

impl Env {
    fn ctr(&self) -> Cmd {
        Cmd::new("ctr")
            .args(["--address", &self.sock, "-n", NAMESPACE])
            .timeout(Duration::from_secs(180))
    }

    /// `ctr run <mode…>` of the image as container `id`, as the host's units run it (privileged,
    /// host network, the PID namespace, the fake host at `/host` when `mount_host`), up to the
    /// image's entrypoint; the caller appends the command.
    fn ctr_run(&self, mode: &[&str], mount_host: bool, id: &str) -> Cmd {
        let mut cmd = self.ctr().arg("run").args(mode.iter().copied()).args([
            "--privileged",
            "--net-host",
            "--snapshotter",
            &self.snapshotter,
            "--with-ns",
            &format!("pid:{}", self.pid_ns),
        ]);
        if mount_host {
            cmd = cmd.args([
                "--mount",
                &format!(
                    "type=bind,src={},dst=/host,options=rbind:rshared",
                    self.host.display()
                ),
            ]);
        }
        cmd.args([
            self.image.reference.as_str(),
            id,
            flex_image::agent::ENTRYPOINT,
        ])
    }

    /// `ctr run` of the image with `/opt/aks-flex-node/bin/entrypoint args…` (ctr 1.6 replaces
    /// the image's entrypoint with the given argv, so it is named explicitly).
    async fn run(&self, mount_host: bool, args: &[&str]) -> Output {
        let n = self.runs.get() + 1;
        self.runs.set(n);
        let id = format!("flex-agent-{n}");
        let cmd = self
            .ctr_run(&["--rm"], mount_host, &id)
            .args(args.iter().copied());
        let out = ProcessRunner::new().output(&cmd).await.unwrap();
        eprintln!(
            "$ {}\n  exit {:?}\n  stdout: {}\n  stderr: {}",
            cmd.display_argv(),
            out.code,
            out.stdout.trim(),
            out.stderr.trim()
        );
        out
    }

    /// Kills containerd (SIGKILL: its shims and their tasks live on, as when containerd
    /// crashes) and starts it again; returns when it answers.
    async fn restart_containerd(&mut self, generation: u32) {
        let old = self.containerd.pid().to_string();
        // It may be dead already (the scenario killed it).
        let _ = ProcessRunner::new()
            .output(&Cmd::new("kill").args(["-KILL", &old]))
            .await;
        let log = self
            .containerd_config
            .with_file_name(format!("containerd-{generation}.log"));
        let fresh = spawn_daemon(
            "containerd",
            &["--config", &self.containerd_config.to_string_lossy()],
            &log,
        );
        // The old one is dead: dropping it only reaps it.
        drop(std::mem::replace(&mut self.containerd, fresh));
        wait_for_containerd("containerd (restarted)", &self.containerd, &self.sock).await;
    }

    /// Starts `systemctl flex-wait-test <tag>` as a detached task (`ctr run -d`) whose output
    /// goes to a FIFO this test holds read-write, as the agent's unit does, then the waiter
    /// from the running container's own image (`/proc/<pid>/root/…/aks-flex-node wait-task`)
    /// with the FIFO as its stdin, and `NOTIFY_SOCKET` naming the returned socket, on which the
    /// waiter's `READY=1` arrives as systemd would receive it for the `Type=notify` unit.
    // The waiter must be a child with the FIFO as its stdin that the test signals and waits
    // for, which the runner (one command to its end) does not offer.
    #[allow(clippy::disallowed_methods)]
    async fn start_detached(
        &self,
        dir: &Path,
        tag: &str,
    ) -> (String, tokio::process::Child, tokio::net::UnixDatagram) {
        let id = format!("flex-wait-{tag}");
        let notify_path = dir.join(format!("{tag}.notify"));
        let notify = tokio::net::UnixDatagram::bind(&notify_path).unwrap();
        let fifo = dir.join(format!("{tag}.out"));
        ProcessRunner::new()
            .run(
                &Cmd::new("mkfifo")
                    .args(["-m", "0600"])
                    .arg(fifo.to_string_lossy()),
            )
            .await
            .unwrap();
        let held = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .unwrap();
        let log_uri = format!("file://{}", fifo.display());
        let out = ProcessRunner::new()
            .output(
                &self
                    .ctr_run(&["-d", "--log-uri", &log_uri], true, &id)
                    .args(["systemctl", "flex-wait-test", tag]),
            )
            .await
            .unwrap();
        assert_eq!(out.code, Some(0), "ctr run -d: {out:?}\n{}", self.logs());
        let tasks = ProcessRunner::new()
            .run(&self.ctr().args(["tasks", "ls"]))
            .await
            .unwrap()
            .stdout;
        let pid = tasks
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.first() == Some(&id.as_str())).then(|| f[1].to_string())
            })
            .unwrap_or_else(|| panic!("no task {id} in {tasks}"));
        let waiter = format!("/proc/{pid}/root/opt/aks-flex-node/bin/aks-flex-node");
        let child = tokio::process::Command::new(&waiter)
            .args(["wait-task", "--address", &self.sock, "-n", NAMESPACE, &id])
            .env("NOTIFY_SOCKET", &notify_path)
            .stdin(std::process::Stdio::from(held))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{waiter}: {e}"));
        (id, child, notify)
    }

    async fn remove_task(&self, id: &str) {
        for args in [
            ["tasks", "delete", "-f", id],
            ["containers", "delete", id, ""],
        ] {
            let args: Vec<&str> = args.into_iter().filter(|a| !a.is_empty()).collect();
            let _ = ProcessRunner::new().output(&self.ctr().args(args)).await;
        }
    }

    fn logs(&self) -> String {
        format!(
            "--- containerd log (tail) ---\n{}\n--- dbus-daemon log ---\n{}",
            tail(&self.containerd.log(), 30),
            self.dbus.log()
        )
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn copy_exec(src: &Path, dst: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
    std::fs::copy(src, dst).unwrap();
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The fake host root: busybox-static as `/bin/sh` and a few tools, a fake `systemctl`,
/// `os-release`, the D-Bus socket's directory, and the test CA.
fn fake_host(host: &Path, ca_pem: &str) {
    copy_exec(Path::new("/bin/busybox"), &host.join("bin/busybox"));
    for tool in ["sh", "echo", "cat", "true", "ls", "sleep"] {
        std::os::unix::fs::symlink("busybox", host.join("bin").join(tool)).unwrap();
    }
    let systemctl = host.join("usr/bin/systemctl");
    std::fs::create_dir_all(systemctl.parent().unwrap()).unwrap();
    // `systemctl flex-wait-test <tag>`: the detached task of (f), which prints to stdout and
    // stderr, then runs until /release-<tag> exists and exits with the number in it.
    std::fs::write(
        &systemctl,
        "#!/bin/sh\nif [ \"$1\" = flex-wait-test ]; then\n  echo \"out $2\"; echo \"err $2\" >&2\n  while [ ! -s /release-$2 ]; do sleep 0.1; done\n  exit $(cat /release-$2)\nfi\necho \"fake-host-systemctl $*\"\n",
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&systemctl, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::create_dir_all(host.join("etc")).unwrap();
    std::fs::write(
        host.join("etc/os-release"),
        "ID=fakehost\nNAME=\"Fake host\"\nVERSION_ID=1\n",
    )
    .unwrap();
    std::fs::create_dir_all(host.join("run/dbus")).unwrap();
    std::fs::write(host.join("ca.pem"), ca_pem).unwrap();
}

/// A CA and a server certificate for 127.0.0.1 and localhost: (CA PEM, cert DER, key DER).
fn test_pki() -> (String, Vec<u8>, Vec<u8>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "flex test CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    (ca.pem(), cert.der().to_vec(), key.serialize_der())
}

/// The namespace the containers join as their PID namespace (see the module doc).
fn pid_namespace(dir: &Path) -> (String, Option<Daemon>) {
    let mnt_ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).ok();
    if std::fs::File::open("/proc/1/ns/pid").is_ok() && mnt_ns("1") == mnt_ns("self") {
        return ("/proc/1/ns/pid".into(), None);
    }
    eprintln!(
        "PID 1's namespaces are not accessible here, or PID 1 is in another mount namespace: \
         using a stand-in init"
    );
    let init = spawn_daemon(
        "unshare",
        &["--pid", "--fork", "--kill-child", "sleep", "3600"],
        &dir.join("init.log"),
    );
    let children = format!("/proc/{0}/task/{0}/children", init.pid());
    let start = Instant::now();
    let pid = loop {
        let text = std::fs::read_to_string(&children).unwrap_or_default();
        if let Some(p) = text.split_whitespace().next() {
            break p.to_string();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "unshare started no child: {}",
            init.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        mnt_ns(&pid),
        mnt_ns("self"),
        "the stand-in init must share this machine's mount namespace"
    );
    (format!("/proc/{pid}/ns/pid"), Some(init))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_containerd_runs_the_agent_image_against_a_fake_host_with_real_dbus() {
    if RealHostInfo.euid() != 0 {
        println!("skipped: needs root");
        return;
    }
    require_packages().await;
    let tmp = tempfile::Builder::new()
        .prefix("flex-ctr")
        .tempdir()
        .unwrap();
    let dir = tmp.path().to_path_buf();

    // The image, from the workspace's binary.
    let binary = agent_binary().await;
    let mut opts = AgentImageOptions::new("0.0.0-test", 1_700_000_000);
    opts.compression_level = 1;
    let image = build_agent_image(&binary, &dir.join("image"), &opts)
        .await
        .unwrap();
    eprintln!(
        "image {} {} from {} ({} bytes compressed)",
        image.reference,
        image.manifest_digest,
        binary.display(),
        image.compressed_size
    );

    // The fake host, its D-Bus and "systemd".
    let host = dir.join("host");
    let (ca_pem, cert_der, key_der) = test_pki();
    fake_host(&host, &ca_pem);
    let bus_socket = host.join("run/dbus/system_bus_socket");
    std::fs::write(dir.join("bus.conf"), dbus_config(&bus_socket)).unwrap();
    let dbus = spawn_daemon(
        "dbus-daemon",
        &[
            &format!("--config-file={}", dir.join("bus.conf").display()),
            "--nofork",
            "--nopidfile",
        ],
        &dir.join("dbus.log"),
    );
    wait_for("dbus-daemon", &dbus, Duration::from_secs(20), async || {
        bus_socket.exists()
    })
    .await;
    let _systemd =
        zbus::connection::Builder::address(format!("unix:path={}", bus_socket.display()).as_str())
            .serve_at("/org/freedesktop/systemd1", FakeSystemd)
            .name("org.freedesktop.systemd1")
            .build()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "fake systemd on {}: {e}\n{}",
                    bus_socket.display(),
                    dbus.log()
                )
            });

    // containerd, with everything under the temporary directory.
    let cdir = dir.join("containerd");
    std::fs::create_dir_all(&cdir).unwrap();
    std::fs::write(cdir.join("config.toml"), containerd_config(&cdir)).unwrap();
    let containerd = spawn_daemon(
        "containerd",
        &["--config", &cdir.join("config.toml").to_string_lossy()],
        &cdir.join("containerd.log"),
    );
    let sock = cdir.join("containerd.sock").to_string_lossy().into_owned();
    wait_for_containerd("containerd", &containerd, &sock).await;
    let plugins = ProcessRunner::new()
        .run(&Cmd::new("ctr").args(["--address", &sock, "plugins", "ls"]))
        .await
        .unwrap()
        .stdout;
    let overlay_ok = plugins.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.first() == Some(&"io.containerd.snapshotter.v1")
            && f.get(1) == Some(&"overlayfs")
            && f.last() == Some(&"ok")
    });
    let snapshotter = if overlay_ok { "overlayfs" } else { "native" };
    let (pid_ns, _init) = pid_namespace(&dir);

    let mut env = Env {
        sock,
        snapshotter: snapshotter.into(),
        pid_ns,
        host: host.clone(),
        image,
        containerd,
        containerd_config: cdir.join("config.toml"),
        dbus,
        runs: std::cell::Cell::new(0),
    };

    // Import the archive.
    let import = ProcessRunner::new()
        .run(
            &env.ctr()
                .args(["images", "import", "--snapshotter", snapshotter])
                .arg(env.image.archive.to_string_lossy()),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", env.logs()));
    assert!(
        import.stdout.contains(&env.image.reference),
        "{}",
        import.stdout
    );
    let listed = ProcessRunner::new()
        .run(&env.ctr().args(["images", "ls", "-q"]))
        .await
        .unwrap();
    assert!(
        listed.stdout.lines().any(|l| l == env.image.reference),
        "{}",
        listed.stdout
    );

    // (a) The entrypoint mounts the host paths, asks "systemd" over D-Bus, execs the command.
    let out = env
        .run(true, &["aks-flex-node", "debug", "resolve", "localhost"])
        .await;
    assert_eq!(out.code, Some(0), "{out:?}\n{}", env.logs());
    assert!(out.stdout.lines().any(|l| l == "127.0.0.1"), "{out:?}");
    assert!(out.stderr.contains("257-fake"), "{out:?}");
    for created in [
        "etc/aks-flex-node",
        "var/lib/aks-flex-node",
        "var/log/aks-flex-node",
        "var/lib/machines",
    ] {
        assert!(
            host.join(created).is_dir(),
            "the entrypoint did not create /{created} on the host"
        );
    }

    // (b) A host tool runs the host's program under chroot /host.
    let out = env.run(true, &["systemctl", "is-active", "x"]).await;
    assert_eq!(out.code, Some(0), "{out:?}\n{}", env.logs());
    assert_eq!(out.stdout, "fake-host-systemctl is-active x\n", "{out:?}");

    // (c) umount runs in PID 1's mount namespace: this machine's mount goes away.
    let probe = ProbeMount(dir.join("probe"));
    std::fs::create_dir_all(&probe.0).unwrap();
    ProcessRunner::new()
        .run(
            &Cmd::new("mount")
                .args(["-t", "tmpfs", "flex-probe"])
                .arg(probe.0.to_string_lossy()),
        )
        .await
        .unwrap();
    assert!(probe.mounted(), "the probe tmpfs was not mounted");
    let out = env.run(true, &["umount", &probe.0.to_string_lossy()]).await;
    assert_eq!(out.code, Some(0), "{out:?}\n{}", env.logs());
    assert!(
        !probe.mounted(),
        "umount in the container did not reach this machine's mount namespace"
    );

    // (d) TLS and name resolution with the image's libraries.
    let port = https_server(cert_der, key_der, 8);
    for url in [
        format!("https://127.0.0.1:{port}/"),
        format!("https://localhost:{port}/"),
    ] {
        let out = env
            .run(
                true,
                &[
                    "aks-flex-node",
                    "debug",
                    "https-get",
                    &url,
                    "--ca",
                    "/host/ca.pem",
                ],
            )
            .await;
        assert_eq!(out.code, Some(0), "{url}: {out:?}\n{}", env.logs());
        assert_eq!(out.stdout.trim(), "200", "{url}: {out:?}");
    }

    // (e) Without the host's root the entrypoint refuses, naming /host.
    let out = env
        .run(false, &["aks-flex-node", "debug", "resolve", "localhost"])
        .await;
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("/host"), "{out:?}");
    assert!(out.stdout.is_empty(), "the command must not run: {out:?}");

    // (f) The detached task and its waiter (the agent unit's `wait-task`), real containerd.
    // The task here is the fake host's script, which runs under `chroot /host`, so its
    // `/proc/<pid>/root` is the fake host: the image's binary is put there too, at the image's
    // path, for the waiter to be found the unit's way. (The daemon is no host tool: in the unit
    // `/proc/<pid>/root` is the container's own root.)
    copy_exec(&binary, &host.join("opt/aks-flex-node/bin/aks-flex-node"));
    let release =
        |tag: &str, code: &str| std::fs::write(host.join(format!("release-{tag}")), code).unwrap();
    let finish = async |child: tokio::process::Child, what: &str| {
        let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("{what}: the waiter did not end"))
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        eprintln!(
            "{what}: exit {:?}\n  stdout: {stdout}\n  stderr: {stderr}",
            out.status.code()
        );
        (out.status.code(), stdout, stderr)
    };
    // The waiter's readiness: READY=1 on the notify socket, as the Type=notify unit needs.
    let ready = async |sock: &tokio::net::UnixDatagram, what: &str| {
        let mut buf = [0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(60), sock.recv(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{what}: no READY=1 from the waiter within 60 s"))
            .unwrap();
        let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert!(msg.lines().any(|l| l == "READY=1"), "{what}: {msg:?}");
    };
    // 1. The waiter says READY=1 once the task runs; the task's exit status is the waiter's,
    //    and its stdout and stderr are relayed.
    let (id, child, notify) = env.start_detached(&dir, "a").await;
    ready(&notify, "exit 3").await;
    release("a", "3");
    let (code, stdout, stderr) = finish(child, "exit 3").await;
    assert_eq!(code, Some(3), "{stderr}\n{}", env.logs());
    assert!(
        stdout.contains("out a\n") && stdout.contains("err a\n"),
        "{stdout}"
    );
    env.remove_task(&id).await;
    // 2. containerd is killed while the task runs, the task exits while containerd is away,
    //    and containerd comes back: the waiter reconnects and reads the exit from the stopped
    //    task's state.
    let (id, child, notify) = env.start_detached(&dir, "b").await;
    ready(&notify, "exit 5").await;
    let old = env.containerd.pid().to_string();
    ProcessRunner::new()
        .run(&Cmd::new("kill").args(["-KILL", &old]))
        .await
        .unwrap();
    release("b", "5");
    tokio::time::sleep(Duration::from_secs(2)).await;
    env.restart_containerd(2).await;
    let (code, stdout, stderr) = finish(child, "exit 5 across a containerd restart").await;
    assert_eq!(code, Some(5), "{stderr}\n{}", env.logs());
    assert!(stdout.contains("out b\n"), "{stdout}");
    env.remove_task(&id).await;
    // 3. containerd restarts while the task runs on; then SIGTERM to the waiter reaches the
    //    task through containerd (`sh` dies of it: 128 + 15), and the waiter ends with that.
    let (id, child, notify) = env.start_detached(&dir, "c").await;
    ready(&notify, "SIGTERM").await;
    env.restart_containerd(3).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let waiter_pid = child.id().unwrap().to_string();
    ProcessRunner::new()
        .run(&Cmd::new("kill").args(["-TERM", &waiter_pid]))
        .await
        .unwrap();
    let (code, _, stderr) = finish(child, "SIGTERM forwarded").await;
    assert_eq!(code, Some(143), "{stderr}\n{}", env.logs());
    assert!(stderr.contains("forwarding a signal"), "{stderr}");
    env.remove_task(&id).await;

    // No container is left behind.
    let left = ProcessRunner::new()
        .run(&env.ctr().args(["containers", "ls", "-q"]))
        .await
        .unwrap();
    assert_eq!(left.stdout.trim(), "", "containers left: {}", left.stdout);
    drop(env);
}
