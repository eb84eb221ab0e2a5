//! `host-exec`: in the agent's container, the host's tools run on the host.
//!
//! The agent's image links each host tool name to its one binary. Invoked under such a name (or
//! as `host-exec <tool> args…`), the binary runs the host's program:
//!
//! - [`CHROOT_TOOLS`] (`systemctl`, `machinectl`, `systemd-run`, `ip`, `nft`, `ctr`, …) under
//!   `chroot /host`, found on the host's `PATH`, so they are the host's binaries with the
//!   host's libraries and configuration. The container shares the host's PID and network
//!   namespaces, so `systemctl` reaches PID 1 and `ip` sees the host's links.
//! - [`MOUNT_NS_TOOLS`] (`mount`, `umount`, `mountpoint`) in PID 1's mount namespace (`setns`,
//!   done while the process is still single-threaded, before `exec`), so an unmount reaches the
//!   host instead of the container's slave copy of the mount. They also run the host's binaries
//!   (from `/proc/1/root`, which is the host's root in that namespace).
//!
//! A chroot tool is looked up on the host's `PATH` under `/host`, its links followed as the host
//! sees them (an absolute link target is the host's path, so it is taken under `/host` again:
//! `follow_in_root`).
//!
//! The runner needs no special case: the image puts the links first on `PATH`, and
//! [`resolve`] additionally maps a bare tool name to the `host-exec` path when containerised,
//! so a changed `PATH` cannot silently run a container binary.
//!
//! The decisions (which tool, which mode, which argv) are pure functions tested here; the
//! executor is a few syscalls.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// Tools run under `chroot /host`.
pub const CHROOT_TOOLS: &[&str] = &[
    "systemctl",
    "machinectl",
    "systemd-run",
    "journalctl",
    "systemd-nspawn",
    "ip",
    "nft",
    "sysctl",
    "modprobe",
    "swapoff",
    "udevadm",
    "ctr",
    "iptables",
    "iptables-save",
    "busctl",
];

/// Tools run in PID 1's mount namespace.
pub const MOUNT_NS_TOOLS: &[&str] = &["mount", "umount", "mountpoint"];

/// Where the agent's image keeps its programs.
pub const IMAGE_BIN_DIR: &str = "/opt/aks-flex-node/bin";

/// The host's root inside the container.
pub const HOST_ROOT: &str = "/host";

/// The host `PATH` searched under the chroot.
pub const HOST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How a tool runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `chroot /host`.
    Chroot,
    /// PID 1's mount namespace.
    HostMountNs,
}

/// The mode for `tool`, or `None` when it is not a host tool.
pub fn mode_of(tool: &str) -> Option<Mode> {
    if CHROOT_TOOLS.contains(&tool) {
        Some(Mode::Chroot)
    } else if MOUNT_NS_TOOLS.contains(&tool) {
        Some(Mode::HostMountNs)
    } else {
        None
    }
}

/// What a multi-call invocation asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invocation {
    /// The host tool.
    pub tool: String,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// How to run it.
    pub mode: Mode,
}

/// Why a host-exec invocation is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostExecError {
    /// `host-exec` without a tool.
    #[error("usage: host-exec <tool> [args...]; tools: {}", all_tools().join(" "))]
    Usage,
    /// A name that is not a host tool.
    #[error("host-exec: {0:?} is not a host tool (known: {known})", known = all_tools().join(" "))]
    Unknown(String),
    /// `/host` is not there.
    #[error("host-exec: {0} is missing: the container must mount the host's root there")]
    NoHostRoot(String),
    /// The tool is not installed on the host.
    #[error("host-exec: {tool} is not installed on the host (searched {path})")]
    NotOnHost {
        /// The tool.
        tool: String,
        /// The host PATH searched.
        path: String,
    },
}

/// Why exec'ing a host tool failed (the invocation itself was valid).
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The invocation was refused.
    #[error(transparent)]
    Refused(#[from] HostExecError),
    /// Entering the host (chroot, namespace) failed.
    #[error("host-exec: {step}: {cause}")]
    Enter {
        /// What was being done.
        step: &'static str,
        /// The failure (in the message, not a `source()`: see [`crate::error`]).
        cause: std::io::Error,
    },
    /// exec(2) of the tool failed.
    #[error("host-exec: exec {}: {cause}", program.display())]
    Exec {
        /// The host path of the tool.
        program: PathBuf,
        /// The failure (in the message, not a `source()`: see [`crate::error`]).
        cause: std::io::Error,
    },
}

fn enter(step: &'static str) -> impl FnOnce(std::io::Error) -> ExecError {
    move |cause| ExecError::Enter { step, cause }
}

fn all_tools() -> Vec<&'static str> {
    CHROOT_TOOLS.iter().chain(MOUNT_NS_TOOLS).copied().collect()
}

/// Parses a multi-call invocation: `argv0` is the name the binary was run as (`systemctl`, or
/// `host-exec` with the tool first in `args`).
pub fn parse(argv0: &OsStr, args: &[OsString]) -> Result<Invocation, HostExecError> {
    let name = Path::new(argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (tool, rest) = if name == "host-exec" {
        let (first, rest) = args.split_first().ok_or(HostExecError::Usage)?;
        (first.to_string_lossy().into_owned(), rest.to_vec())
    } else {
        (name, args.to_vec())
    };
    let mode = mode_of(&tool).ok_or_else(|| HostExecError::Unknown(tool.clone()))?;
    Ok(Invocation {
        tool,
        args: rest,
        mode,
    })
}

/// Finds `tool` on the host's `PATH` under `host_root`; returns the path as seen from inside
/// the host root (e.g. `/usr/bin/systemctl`).
pub fn find_on_host(host_root: &Path, tool: &str) -> Result<PathBuf, HostExecError> {
    for dir in HOST_PATH.split(':') {
        let inside = Path::new(dir).join(tool);
        let Some(outside) = follow_in_root(host_root, &inside) else {
            continue;
        };
        if crate::lookup::which_on(&outside.to_string_lossy(), None).is_some() {
            return Ok(inside);
        }
    }
    Err(HostExecError::NotOnHost {
        tool: tool.into(),
        path: HOST_PATH.into(),
    })
}

/// How many links [`follow_in_root`] follows before it gives up (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// `inside` (a path on the host) as seen from the container under `root`, its links followed
/// the way the host sees them: a link's absolute target is the host's path, so under `root`
/// again (Debian's `/usr/sbin/modprobe -> /bin/kmod`, the alternatives' `/usr/sbin/iptables ->
/// /etc/alternatives/iptables -> /usr/sbin/iptables-nft`), not the container's. `None` for a
/// loop or more than [`MAX_LINKS`] links. Links in the directories above the last component are
/// left to the kernel (merged /usr's `/bin -> usr/bin` is relative, so it stays under `root`).
fn follow_in_root(root: &Path, inside: &Path) -> Option<PathBuf> {
    let mut p = inside.to_path_buf();
    for _ in 0..MAX_LINKS {
        let outside = root.join(p.strip_prefix("/").unwrap_or(&p));
        let Ok(target) = std::fs::read_link(&outside) else {
            return Some(outside);
        };
        p = if target.is_absolute() {
            target
        } else {
            p.parent().unwrap_or(Path::new("/")).join(target)
        };
    }
    None
}

/// In the agent's container, the program the runner should start for `program`: the
/// `host-exec` link for a host tool, else `program` unchanged.
pub fn resolve(program: &str, containerized: bool) -> String {
    if containerized && !program.contains('/') && mode_of(program).is_some() {
        format!("{IMAGE_BIN_DIR}/{program}")
    } else {
        program.to_string()
    }
}

/// Runs the invocation: never returns on success (the process becomes the host's tool).
/// Must be called while the process is single-threaded (before any runtime starts).
pub fn exec(inv: &Invocation) -> Result<std::convert::Infallible, ExecError> {
    use std::os::unix::process::CommandExt;
    let host_root = Path::new(HOST_ROOT);
    match inv.mode {
        Mode::Chroot => {
            if !host_root.is_dir() {
                return Err(HostExecError::NoHostRoot(HOST_ROOT.into()).into());
            }
            let prog = find_on_host(host_root, &inv.tool)?;
            rustix::process::chroot(host_root).map_err(|e| ExecError::Enter {
                step: "chroot /host",
                cause: e.into(),
            })?;
            std::env::set_current_dir("/").map_err(enter("chdir /"))?;
            #[allow(clippy::disallowed_methods)] // host-exec replaces this process by exec(2)
            let err = std::process::Command::new(&prog)
                .arg0(&inv.tool)
                .args(&inv.args)
                .env("PATH", HOST_PATH)
                .exec();
            Err(ExecError::Exec {
                program: prog,
                cause: err,
            })
        }
        Mode::HostMountNs => {
            let ns = std::fs::File::open("/proc/1/ns/mnt").map_err(enter("open /proc/1/ns/mnt"))?;
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&ns),
                Some(rustix::thread::LinkNameSpaceType::Mount),
            )
            .map_err(|e| ExecError::Enter {
                step: "join PID 1's mount namespace",
                cause: e.into(),
            })?;
            // In PID 1's mount namespace, `/` is the host's root.
            let prog = find_on_host(Path::new("/"), &inv.tool)?;
            std::env::set_current_dir("/").map_err(enter("chdir /"))?;
            #[allow(clippy::disallowed_methods)] // host-exec replaces this process by exec(2)
            let err = std::process::Command::new(&prog)
                .arg0(&inv.tool)
                .args(&inv.args)
                .env("PATH", HOST_PATH)
                .exec();
            Err(ExecError::Exec {
                program: prog,
                cause: err,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    type Case<'a> = (
        &'a str,
        Vec<&'a str>,
        Result<(&'a str, Vec<&'a str>, Mode), HostExecError>,
    );

    #[test]
    fn parse_table() {
        let cases: Vec<Case<'_>> = vec![
            (
                "/opt/aks-flex-node/bin/systemctl",
                vec!["start", "x"],
                Ok(("systemctl", vec!["start", "x"], Mode::Chroot)),
            ),
            (
                "machinectl",
                vec![],
                Ok(("machinectl", vec![], Mode::Chroot)),
            ),
            (
                "host-exec",
                vec!["umount", "/run/bpffs/kube1"],
                Ok(("umount", vec!["/run/bpffs/kube1"], Mode::HostMountNs)),
            ),
            (
                "/x/mountpoint",
                vec!["-q", "/p"],
                Ok(("mountpoint", vec!["-q", "/p"], Mode::HostMountNs)),
            ),
            ("host-exec", vec![], Err(HostExecError::Usage)),
            (
                "host-exec",
                vec!["bash"],
                Err(HostExecError::Unknown("bash".into())),
            ),
            ("rm", vec!["-rf"], Err(HostExecError::Unknown("rm".into()))),
        ];
        for (argv0, args, want) in cases {
            let got = parse(OsStr::new(argv0), &os(&args));
            let want = want.map(|(t, a, m)| Invocation {
                tool: t.into(),
                args: os(&a),
                mode: m,
            });
            assert_eq!(got, want, "{argv0} {args:?}");
        }
    }

    #[test]
    fn every_tool_has_exactly_one_mode() {
        for t in CHROOT_TOOLS {
            assert!(!MOUNT_NS_TOOLS.contains(t), "{t}");
        }
        for t in [
            "systemctl",
            "machinectl",
            "systemd-run",
            "journalctl",
            "systemd-nspawn",
            "ip",
            "nft",
            "sysctl",
            "modprobe",
            "swapoff",
            "udevadm",
            "ctr",
        ] {
            assert_eq!(mode_of(t), Some(Mode::Chroot), "{t}");
        }
        for t in ["mount", "umount", "mountpoint"] {
            assert_eq!(mode_of(t), Some(Mode::HostMountNs), "{t}");
        }
    }

    #[test]
    fn resolve_only_in_container_and_only_bare_host_tools() {
        assert_eq!(
            resolve("systemctl", true),
            "/opt/aks-flex-node/bin/systemctl"
        );
        assert_eq!(resolve("umount", true), "/opt/aks-flex-node/bin/umount");
        assert_eq!(resolve("systemctl", false), "systemctl");
        assert_eq!(resolve("apt-get", true), "apt-get");
        assert_eq!(
            resolve("/var/lib/machines/kube1/usr/local/bin/kubelet", true),
            "/var/lib/machines/kube1/usr/local/bin/kubelet"
        );
    }

    #[test]
    fn find_on_host_searches_the_host_path() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let bin = d.path().join("usr/sbin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("nft"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(bin.join("nft"), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            find_on_host(d.path(), "nft").unwrap(),
            PathBuf::from("/usr/sbin/nft")
        );
        let e = find_on_host(d.path(), "ctr").unwrap_err();
        assert!(
            e.to_string().contains("ctr is not installed on the host"),
            "{e}"
        );
    }

    /// A host tool behind absolute links, as Debian installs modprobe and iptables, is found
    /// under the host root (the links' targets are the host's paths, not the container's); a
    /// link loop or a dangling link is "not installed". Real: files and links in a temporary
    /// root, under names the machine running the test does not have (so the links' targets
    /// cannot be found outside the root).
    #[test]
    fn find_on_host_follows_absolute_links_under_the_host_root() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        for dir in ["usr/bin", "usr/sbin", "etc/alternatives"] {
            std::fs::create_dir_all(r.join(dir)).unwrap();
        }
        symlink("usr/bin", r.join("bin")).unwrap();
        for exe in ["usr/bin/flexprobe-kmod", "usr/sbin/flexprobe-iptables-nft"] {
            std::fs::write(r.join(exe), "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(r.join(exe), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        symlink("/bin/flexprobe-kmod", r.join("usr/sbin/flexprobe-modprobe")).unwrap();
        symlink(
            "/etc/alternatives/flexprobe-iptables",
            r.join("usr/sbin/flexprobe-iptables"),
        )
        .unwrap();
        symlink(
            "/usr/sbin/flexprobe-iptables-nft",
            r.join("etc/alternatives/flexprobe-iptables"),
        )
        .unwrap();
        symlink("/usr/sbin/loop-b", r.join("usr/sbin/loop-a")).unwrap();
        symlink("/usr/sbin/loop-a", r.join("usr/sbin/loop-b")).unwrap();
        symlink("/usr/bin/missing", r.join("usr/sbin/dangling")).unwrap();
        assert_eq!(
            find_on_host(r, "flexprobe-modprobe").unwrap(),
            PathBuf::from("/usr/sbin/flexprobe-modprobe")
        );
        assert_eq!(
            find_on_host(r, "flexprobe-iptables").unwrap(),
            PathBuf::from("/usr/sbin/flexprobe-iptables")
        );
        for missing in ["loop-a", "dangling"] {
            let e = find_on_host(r, missing).unwrap_err();
            assert!(
                e.to_string().contains("is not installed on the host"),
                "{e}"
            );
        }
    }
}
