//! The agent image's entrypoint: mount the host paths the agent uses at their own paths, check
//! that the host's systemd answers over D-Bus, then `exec` the given command.
//!
//! The units that start the agent's containers give them only the host's root at `/host`; the
//! list of host paths ([`MOUNTS`]) ships with the agent, so a newer image that needs another path
//! gets it without reprovisioning the host. Each is bind-mounted recursively from `/host<path>`
//! to `<path>` and made a slave, so mounts the host makes later (a machine's bpffs under
//! `/run/bpffs`) appear in the container. The plan ([`plan`]) is data computed from what exists
//! under `/host`, tested on its own; [`execute`] is a few syscalls.

use std::path::{Path, PathBuf};

use flex_host::hostexec::HOST_ROOT;

/// What kind of host path an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A directory; created on the host first, with the mode `create` names, when that is set
    /// and it is missing.
    Dir {
        /// Create it on the host when missing, with this mode (whatever the umask; a directory
        /// that is there keeps its own).
        create: Option<u32>,
    },
    /// A file; mounted only when the host has it.
    File,
}

/// One host path the agent uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MountSpec {
    /// The path, the same on the host and in the container.
    pub path: &'static str,
    /// File or directory.
    pub kind: Kind,
    /// Mount read-only.
    pub read_only: bool,
}

const fn dir(path: &'static str, create: Option<u32>) -> MountSpec {
    MountSpec {
        path,
        kind: Kind::Dir { create },
        read_only: false,
    }
}

/// The host paths the agent reads and writes by name.
pub const MOUNTS: &[MountSpec] = &[
    // The agent's config and state: root's, its group may read (as the host install makes it).
    dir("/etc/aks-flex-node", Some(0o750)),
    dir("/etc/systemd", Some(0o755)),
    dir("/etc/sysctl.d", Some(0o755)),
    dir("/etc/unbounded", Some(0o755)),
    dir("/etc/docker", None),
    dir("/etc/wireguard", None),
    dir("/etc/sysconfig", None),
    MountSpec {
        path: "/etc/os-release",
        kind: Kind::File,
        read_only: true,
    },
    MountSpec {
        path: "/etc/hostname",
        kind: Kind::File,
        read_only: true,
    },
    MountSpec {
        path: "/etc/fstab",
        kind: Kind::File,
        read_only: false,
    },
    // Root's alone, as systemd makes it: the machines' root file systems hold their images'
    // setuid binaries, which a host user must not reach.
    dir("/var/lib/machines", Some(0o700)),
    dir("/var/lib/aks-flex-node", Some(0o700)),
    dir("/var/log/aks-flex-node", Some(0o750)),
    dir("/run", None),
    dir("/usr/local", None),
    dir("/lib/modules", None),
];

/// One step of the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Create a directory on the host (real path under `/host`) with this mode.
    CreateHostDir(PathBuf, u32),
    /// Bind `source` (under `/host`) at `target`, recursively, as a slave; optionally read-only.
    Bind {
        /// Host-side path.
        source: PathBuf,
        /// Container path.
        target: PathBuf,
        /// Whether it is a file.
        file: bool,
        /// Read-only.
        read_only: bool,
    },
    /// Skipped: the host does not have it.
    Skip(PathBuf),
}

/// Why the entrypoint stops.
#[derive(Debug, thiserror::Error)]
pub enum EntrypointError {
    /// No `/host`.
    #[error(
        "entrypoint: {0} is missing: run the container with the host's root bind-mounted at /host (--mount type=bind,src=/,dst=/host,options=rbind:rshared)"
    )]
    NoHost(String),
    /// No command to run.
    #[error("entrypoint: no command given; usage: entrypoint <command> [args...]")]
    NoCommand,
    /// A mount failed.
    #[error("entrypoint: mount {target}: {cause}")]
    Mount {
        /// The container path.
        target: String,
        /// The error (in the message, not a `source()`).
        cause: std::io::Error,
    },
    /// The host's systemd is not reachable over D-Bus.
    #[error("entrypoint: {0}")]
    Dbus(String),
}

/// The plan for a host root at `host_root` (normally `/host`).
pub fn plan(host_root: &Path) -> Result<Vec<Op>, EntrypointError> {
    if !host_root.is_dir() {
        return Err(EntrypointError::NoHost(host_root.display().to_string()));
    }
    let mut ops = Vec::new();
    for m in MOUNTS {
        let source = host_root.join(m.path.trim_start_matches('/'));
        let target = PathBuf::from(m.path);
        match m.kind {
            Kind::Dir { create } => {
                if !source.is_dir() {
                    if let Some(mode) = create {
                        ops.push(Op::CreateHostDir(source.clone(), mode));
                    } else {
                        ops.push(Op::Skip(target));
                        continue;
                    }
                }
                ops.push(Op::Bind {
                    source,
                    target,
                    file: false,
                    read_only: m.read_only,
                });
            }
            Kind::File => {
                if source.is_file() {
                    ops.push(Op::Bind {
                        source,
                        target,
                        file: true,
                        read_only: m.read_only,
                    });
                } else {
                    ops.push(Op::Skip(target));
                }
            }
        }
    }
    Ok(ops)
}

/// Creates the host directory `p` with exactly `mode`, whatever the umask (its parents, standard
/// directories such as `/var/lib`, are made as `mkdir -p` would when missing).
pub fn create_host_dir(p: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(mode).create(p) {
        Ok(()) => std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)),
        // Made meanwhile (another start): its mode is whoever made it's.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && p.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Carries out the plan (needs `CAP_SYS_ADMIN`, i.e. a privileged container).
pub fn execute(ops: &[Op]) -> Result<(), EntrypointError> {
    use rustix::mount::{
        MountFlags, MountPropagationFlags, mount_bind_recursive, mount_change, mount_remount,
    };
    for op in ops {
        match op {
            Op::CreateHostDir(p, mode) => {
                create_host_dir(p, *mode).map_err(|cause| EntrypointError::Mount {
                    target: p.display().to_string(),
                    cause,
                })?
            }
            Op::Skip(_) => {}
            Op::Bind {
                source,
                target,
                file,
                read_only,
            } => {
                let err = |e: std::io::Error| EntrypointError::Mount {
                    target: target.display().to_string(),
                    cause: e,
                };
                if *file {
                    if let Some(parent) = target.parent() {
                        std::fs::create_dir_all(parent).map_err(err)?;
                    }
                    if !target.exists() {
                        std::fs::write(target, b"").map_err(err)?;
                    }
                } else {
                    std::fs::create_dir_all(target).map_err(err)?;
                }
                mount_bind_recursive(source, target).map_err(|e| err(e.into()))?;
                mount_change(
                    target,
                    MountPropagationFlags::DOWNSTREAM | MountPropagationFlags::REC,
                )
                .map_err(|e| err(e.into()))?;
                if *read_only {
                    mount_remount(target, MountFlags::BIND | MountFlags::RDONLY, "")
                        .map_err(|e| err(e.into()))?;
                }
            }
        }
    }
    Ok(())
}

/// The rule ACL's policy needs for a privileged container to talk to systemd.
pub const SELINUX_RULE: &str = "allow spc_t kernel_t:dbus send_msg;";

/// Turns a D-Bus failure into the entrypoint's one-line message, with the SELinux hint when
/// the bus says access was denied.
pub fn dbus_failure_message(error: &str) -> String {
    let lower = error.to_lowercase();
    if lower.contains("accessdenied")
        || lower.contains("access denied")
        || lower.contains("selinux")
    {
        format!(
            "the host's systemd refused this container's D-Bus message ({}); on SELinux hosts the policy needs `{SELINUX_RULE}`",
            error.trim()
        )
    } else {
        format!(
            "the host's systemd does not answer over D-Bus: {}",
            error.trim()
        )
    }
}

/// Asks the host's systemd for its version over the system bus (the socket is under the
/// mounted `/run`).
pub async fn check_dbus() -> Result<String, EntrypointError> {
    let conn = zbus::connection::Builder::system()
        .build()
        .await
        .map_err(|e| EntrypointError::Dbus(dbus_failure_message(&e.to_string())))?;
    let reply = conn
        .call_method(
            Some("org.freedesktop.systemd1"),
            "/org/freedesktop/systemd1",
            Some("org.freedesktop.DBus.Properties"),
            "Get",
            &("org.freedesktop.systemd1.Manager", "Version"),
        )
        .await
        .map_err(|e| EntrypointError::Dbus(dbus_failure_message(&e.to_string())))?;
    let v: zbus::OwnedVariant = reply
        .body()
        .deserialize()
        .map_err(|e| EntrypointError::Dbus(dbus_failure_message(&e.to_string())))?;
    Ok(String::try_from(v).unwrap_or_default())
}

/// The entrypoint's main: plan and mount (single-threaded), check D-Bus, exec the command.
/// Returns only on failure.
pub fn main(args: Vec<std::ffi::OsString>) -> Result<std::convert::Infallible, anyhow::Error> {
    use std::os::unix::process::CommandExt;
    let (cmd, rest) = args.split_first().ok_or(EntrypointError::NoCommand)?;
    let ops = plan(Path::new(HOST_ROOT))?;
    execute(&ops)?;
    if std::env::var_os("AKS_FLEX_NODE_SKIP_DBUS_CHECK").is_none() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let version = rt.block_on(check_dbus())?;
        eprintln!("entrypoint: host paths mounted; host systemd {version} answers over D-Bus");
        drop(rt);
    }
    #[allow(clippy::disallowed_methods)] // the entrypoint replaces itself by exec(2)
    let err = std::process::Command::new(cmd).args(rest).exec();
    Err(anyhow::anyhow!(
        "entrypoint: exec {}: {err}",
        cmd.to_string_lossy()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_host_is_an_error() {
        let e = plan(Path::new("/nonexistent-host-root")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("entrypoint: /nonexistent-host-root is missing"),
            "{e}"
        );
    }

    /// Real directories: a missing host directory is made with its mode exactly, under a
    /// permissive umask as under a strict one; one that is there keeps its own.
    #[test]
    fn host_directories_get_their_mode_whatever_the_umask() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        for (umask, want) in [(0o000, 0o700), (0o077, 0o755), (0o022, 0o750)] {
            let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(umask));
            let p = d.path().join(format!("host-{umask:o}/var/lib/machines"));
            let made = create_host_dir(&p, want);
            rustix::process::umask(old);
            made.unwrap();
            assert_eq!(mode(&p), want, "umask {umask:04o}");
        }
        let there = d.path().join("there");
        std::fs::create_dir(&there).unwrap();
        std::fs::set_permissions(&there, std::fs::Permissions::from_mode(0o711)).unwrap();
        create_host_dir(&there, 0o700).unwrap();
        assert_eq!(mode(&there), 0o711, "an existing directory keeps its mode");
    }

    #[test]
    fn plan_for_a_minimal_host() {
        let d = tempfile::tempdir().unwrap();
        let h = d.path();
        for p in ["etc/systemd", "run", "usr/local", "var/lib/machines"] {
            std::fs::create_dir_all(h.join(p)).unwrap();
        }
        std::fs::write(h.join("etc/os-release"), "ID=acl\n").unwrap();
        let ops = plan(h).unwrap();
        let text: Vec<String> = ops
            .iter()
            .map(|op| match op {
                Op::CreateHostDir(p, mode) => {
                    format!("create {} {mode:04o}", p.strip_prefix(h).unwrap().display())
                }
                Op::Bind {
                    target,
                    file,
                    read_only,
                    ..
                } => format!(
                    "bind {}{}{}",
                    target.display(),
                    if *file { " (file)" } else { "" },
                    if *read_only { " ro" } else { "" }
                ),
                Op::Skip(p) => format!("skip {}", p.display()),
            })
            .collect();
        insta::assert_snapshot!(text.join("\n"), @"
        create etc/aks-flex-node 0750
        bind /etc/aks-flex-node
        bind /etc/systemd
        create etc/sysctl.d 0755
        bind /etc/sysctl.d
        create etc/unbounded 0755
        bind /etc/unbounded
        skip /etc/docker
        skip /etc/wireguard
        skip /etc/sysconfig
        bind /etc/os-release (file) ro
        skip /etc/hostname
        skip /etc/fstab
        bind /var/lib/machines
        create var/lib/aks-flex-node 0700
        bind /var/lib/aks-flex-node
        create var/log/aks-flex-node 0750
        bind /var/log/aks-flex-node
        bind /run
        bind /usr/local
        skip /lib/modules
        ");
    }

    #[test]
    fn selinux_denial_gets_the_rule() {
        let m = dbus_failure_message(
            "org.freedesktop.DBus.Error.AccessDenied: An SELinux policy prevents this sender from sending this message to this recipient",
        );
        assert!(m.contains(SELINUX_RULE), "{m}");
        assert_eq!(m.lines().count(), 1);
        let m = dbus_failure_message("Connection refused");
        assert!(!m.contains("spc_t"));
        assert!(m.contains("does not answer"));
    }
}
