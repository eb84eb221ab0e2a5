//! `cargo xtask selinux repro | verify`: every kind of host operation the agent performs, run
//! from the agent's container on the VM `up` started, each with its result and the AVC
//! denials the kernel (and dbus-daemon) logged while it ran (docs/SELINUX.md).
//!
//! [`OPERATIONS`] is the list, pure data, in one place: each host tool through host-exec
//! (`flex_host::hostexec`'s `CHROOT_TOOLS` and `MOUNT_NS_TOOLS`), the mount operations, the
//! agent's own D-Bus call to systemd, machinectl, journal reads, and a write under each host
//! path the entrypoint mounts writable ([`aks_flex_node::entrypoint::MOUNTS`]). Its tests check
//! that none of those is left out. ACL has no auditd (AVCs go to the journal), and neither has
//! the SELinux dev host, so the denials are read from the journal: `journalctl
//! --after-cursor` of a cursor taken just before the operation, grepped for `avc:  denied`.

use std::fmt::Write as _;
use std::time::Duration;

use crate::hostmode::AgentMode;
use crate::kit::agent::agent_command;
use crate::ssh::Guest;

/// What kind of host operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A host tool run through host-exec (`chroot /host`).
    Tool,
    /// A mount operation (host-exec in PID 1's mount namespace).
    Mount,
    /// A D-Bus call to systemd from the agent's own process.
    Dbus,
    /// machinectl (D-Bus to systemd-machined).
    Machinectl,
    /// A journal read.
    Journal,
    /// A write under a host path the agent uses.
    Write,
}

impl Kind {
    /// The kind's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Tool => "tool",
            Kind::Mount => "mount",
            Kind::Dbus => "dbus",
            Kind::Machinectl => "machinectl",
            Kind::Journal => "journal",
            Kind::Write => "write",
        }
    }
}

/// One host operation: run in the agent's container (its words as `ctr tasks exec` takes
/// them; the container has no shell).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operation {
    /// Kind.
    pub kind: Kind,
    /// The host tool or host path it exercises (what the coverage tests look for).
    pub subject: &'static str,
    /// The command in the container.
    pub command: &'static str,
}

const fn op(kind: Kind, subject: &'static str, command: &'static str) -> Operation {
    Operation {
        kind,
        subject,
        command,
    }
}

/// Where the mount operations mount (a bpffs, as a machine's unit does under `/run/bpffs`).
pub const PROBE_MOUNT: &str = "/run/aks-flex-selinux-probe";

/// The network link and nft table the write operations add and remove.
pub const PROBE_NAME: &str = "aksflexprobe";

/// Every host operation, in the order `repro` runs them (the mount operations in mount,
/// check, unmount order; each add before its delete).
pub const OPERATIONS: &[Operation] = &[
    op(Kind::Tool, "systemctl", "systemctl show --property=Version"),
    op(
        Kind::Tool,
        "systemctl",
        "systemctl is-enabled containerd.service",
    ),
    op(Kind::Tool, "systemctl", "systemctl daemon-reload"),
    op(
        Kind::Tool,
        "systemd-run",
        "systemd-run --wait --quiet --collect /bin/true",
    ),
    op(Kind::Tool, "systemd-nspawn", "systemd-nspawn --version"),
    op(Kind::Tool, "ip", "ip -br link"),
    op(Kind::Tool, "ip", "ip link add aksflexprobe type dummy"),
    op(Kind::Tool, "ip", "ip link del aksflexprobe"),
    op(Kind::Tool, "nft", "nft list tables"),
    op(Kind::Tool, "nft", "nft add table inet aksflexprobe"),
    op(Kind::Tool, "nft", "nft delete table inet aksflexprobe"),
    op(Kind::Tool, "sysctl", "sysctl -n net.ipv4.ip_forward"),
    op(Kind::Tool, "sysctl", "sysctl -w net.ipv4.ip_forward=1"),
    op(Kind::Tool, "modprobe", "modprobe br_netfilter"),
    op(Kind::Tool, "swapoff", "swapoff -a"),
    op(Kind::Tool, "udevadm", "udevadm settle --timeout=10"),
    op(Kind::Tool, "ctr", "ctr -n aks-flex containers ls -q"),
    op(Kind::Tool, "iptables", "iptables -S"),
    op(Kind::Tool, "iptables-save", "iptables-save"),
    op(
        Kind::Tool,
        "busctl",
        "busctl call org.freedesktop.systemd1 /org/freedesktop/systemd1 org.freedesktop.DBus.Peer Ping",
    ),
    // The directory as a machine's unit makes it (its ExecStartPre's mkdir, in the unit's
    // domain), then the mount from the container.
    op(
        Kind::Mount,
        "mkdir",
        "systemd-run --wait --quiet --collect /usr/bin/mkdir -p /run/aks-flex-selinux-probe",
    ),
    op(
        Kind::Mount,
        "mount",
        "mount -t bpf bpffs /run/aks-flex-selinux-probe",
    ),
    op(
        Kind::Mount,
        "mountpoint",
        "mountpoint /run/aks-flex-selinux-probe",
    ),
    op(Kind::Mount, "umount", "umount /run/aks-flex-selinux-probe"),
    op(
        Kind::Mount,
        "rmdir",
        "systemd-run --wait --quiet --collect /usr/bin/rmdir /run/aks-flex-selinux-probe",
    ),
    op(Kind::Dbus, "systemd", "aks-flex-node debug dbus-systemd"),
    op(Kind::Machinectl, "machinectl", "machinectl list --no-pager"),
    op(
        Kind::Machinectl,
        "machinectl",
        "machinectl list-images --no-pager",
    ),
    op(
        Kind::Journal,
        "journalctl",
        "journalctl -q -n 3 --no-pager -u containerd.service",
    ),
    op(
        Kind::Journal,
        "journalctl",
        "journalctl -q -b -n 3 --no-pager -o cat",
    ),
    op(
        Kind::Write,
        "/etc/aks-flex-node",
        "aks-flex-node debug write-probe /etc/aks-flex-node",
    ),
    op(
        Kind::Write,
        "/etc/systemd",
        "aks-flex-node debug write-probe /etc/systemd",
    ),
    op(
        Kind::Write,
        "/etc/sysctl.d",
        "aks-flex-node debug write-probe /etc/sysctl.d",
    ),
    op(
        Kind::Write,
        "/etc/unbounded",
        "aks-flex-node debug write-probe /etc/unbounded",
    ),
    op(
        Kind::Write,
        "/etc/fstab",
        "aks-flex-node debug write-probe /etc/fstab",
    ),
    op(
        Kind::Write,
        "/var/lib/machines",
        "aks-flex-node debug write-probe /var/lib/machines",
    ),
    op(
        Kind::Write,
        "/var/lib/aks-flex-node",
        "aks-flex-node debug write-probe /var/lib/aks-flex-node",
    ),
    op(
        Kind::Write,
        "/var/log/aks-flex-node",
        "aks-flex-node debug write-probe /var/log/aks-flex-node",
    ),
    op(Kind::Write, "/run", "aks-flex-node debug write-probe /run"),
    op(
        Kind::Write,
        "/usr/local",
        "aks-flex-node debug write-probe /usr/local",
    ),
];

/// The host paths the entrypoint mounts writable that `repro` leaves out, and why: those that
/// exist on a host only with the features that use them.
pub const WRITE_EXEMPT: &[(&str, &str)] = &[
    (
        "/etc/docker",
        "created by the agent only with Docker's settings",
    ),
    ("/etc/wireguard", "created only with WireGuard"),
    ("/etc/sysconfig", "ACL's; the dev host has none"),
    (
        "/lib/modules",
        "read for modprobe (its operation above); the agent writes nothing there",
    ),
];

/// The host tools [`OPERATIONS`] runs: every one host-exec knows. Pure.
pub fn tools_covered() -> Vec<&'static str> {
    let mut v: Vec<&str> = OPERATIONS
        .iter()
        .filter(|o| {
            matches!(
                o.kind,
                Kind::Tool | Kind::Mount | Kind::Machinectl | Kind::Journal
            )
        })
        .map(|o| o.command.split_whitespace().next().unwrap_or_default())
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// What the VM's SELinux is, from `/sys/fs/selinux/enforce` (`None`: no such file, SELinux
/// off). Pure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Enforcing.
    Enforcing,
    /// Permissive: denials are logged, not enforced.
    Permissive,
}

/// Parses `cat /sys/fs/selinux/enforce`'s output (`None`: SELinux is off). Pure.
pub fn parse_mode(enforce: Option<&str>) -> Option<Mode> {
    match enforce.map(str::trim) {
        Some("1") => Some(Mode::Enforcing),
        Some("0") => Some(Mode::Permissive),
        _ => None,
    }
}

/// The guest script that runs `op` in the agent's container and prints, in lines that
/// [`parse_outcome`] reads: `rc=<exit code>`, `out: <line>` (the output's last lines), and
/// `avc: <record>` for each AVC denial journald recorded after the operation started.
pub fn probe_script(mode: AgentMode, op: &Operation) -> String {
    let run = agent_command(mode, op.command);
    format!(
        "c=$(journalctl -q -n 0 --show-cursor | sed -n 's/^-- cursor: //p')\n\
         out=$({run} 2>&1); rc=$?\n\
         sleep 1\n\
         echo \"rc=$rc\"\n\
         printf '%s\\n' \"$out\" | tail -n 3 | sed 's/^/out: /'\n\
         journalctl -q --no-pager -o cat --after-cursor=\"$c\" -g 'avc:  denied' | sed 's/^/avc: /'\n"
    )
}

/// What one operation did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Exit code (`None`: none reported).
    pub code: Option<i32>,
    /// The output's last lines.
    pub output: Vec<String>,
    /// The AVC denials logged while it ran.
    pub denials: Vec<String>,
}

impl Outcome {
    /// Whether it exited 0.
    pub fn succeeded(&self) -> bool {
        self.code == Some(0)
    }
}

/// Reads [`probe_script`]'s output. Pure.
pub fn parse_outcome(text: &str) -> Outcome {
    let mut o = Outcome {
        code: None,
        output: Vec::new(),
        denials: Vec::new(),
    };
    for line in text.lines() {
        if let Some(rc) = line.strip_prefix("rc=") {
            o.code = rc.trim().parse().ok();
        } else if let Some(out) = line.strip_prefix("out: ") {
            o.output.push(out.to_string());
        } else if let Some(avc) = line.strip_prefix("avc: ") {
            o.denials.push(avc.to_string());
        }
    }
    o
}

/// The short form of a denial for the table: the permission, source and target types and
/// class (`{ send_msg } spc_t -> kernel_t:dbus`), or the record itself. Pure.
pub fn summarize_denial(record: &str) -> String {
    let perm = record
        .split_once("denied")
        .and_then(|(_, r)| r.split_once('}'))
        .map(|(p, _)| format!("{} }}", p.trim()));
    let field = |name: &str| {
        record
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .map(|v| v.split(':').nth(2).unwrap_or(v).to_string())
    };
    let class = record
        .split_whitespace()
        .find_map(|w| w.strip_prefix("tclass="))
        .map(|c| c.trim_end_matches(['\'', '"']).to_string());
    match (perm, field("scontext="), field("tcontext="), class) {
        (Some(p), Some(s), Some(t), Some(c)) => format!("{p} {s} -> {t}:{c}"),
        _ => record.to_string(),
    }
}

/// The report: one line per operation (number, kind, result, denials, command), then the
/// totals. Pure.
pub fn report(mode: Mode, results: &[(Operation, Outcome)]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "SELinux {}; {} host operations from the agent's container\n",
        match mode {
            Mode::Enforcing => "enforcing",
            Mode::Permissive => "permissive (denials are logged, not enforced)",
        },
        results.len()
    );
    let _ = writeln!(
        s,
        "{:>3}  {:<10}  {:<7}  {:<7}  command",
        "#", "kind", "result", "denials"
    );
    for (i, (op, o)) in results.iter().enumerate() {
        let result = if o.succeeded() {
            "ok".to_string()
        } else {
            match o.code {
                Some(c) => format!("exit {c}"),
                None => "no exit".into(),
            }
        };
        let _ = writeln!(
            s,
            "{:>3}  {:<10}  {:<7}  {:<7}  {}",
            i + 1,
            op.kind.name(),
            result,
            o.denials.len(),
            op.command
        );
        if !o.succeeded() {
            for l in &o.output {
                let _ = writeln!(s, "{:>32}| {l}", "");
            }
        }
        for d in &o.denials {
            let _ = writeln!(s, "{:>32}denied: {}", "", summarize_denial(d));
        }
    }
    let (failed, denials) = totals(results);
    let _ = writeln!(
        s,
        "\n{failed} of {} operations failed; {denials} AVC denials",
        results.len()
    );
    s
}

/// Failed operations and denials in all. Pure.
pub fn totals(results: &[(Operation, Outcome)]) -> (usize, usize) {
    (
        results.iter().filter(|(_, o)| !o.succeeded()).count(),
        results.iter().map(|(_, o)| o.denials.len()).sum(),
    )
}

/// Why `repro` stops before running anything on a VM without SELinux.
pub const SELINUX_OFF: &str = "SELinux is off on this VM (no /sys/fs/selinux/enforce): there is \
nothing to reproduce, and no denials would mean nothing; boot the SELinux dev host with `cargo \
xtask up --selinux`";

/// Runs [`OPERATIONS`] on the guest, in order; fails without running any when SELinux is off.
pub async fn repro(
    guest: &Guest<'_>,
    mode: AgentMode,
    progress: &dyn Fn(&str),
) -> anyhow::Result<(Mode, Vec<(Operation, Outcome)>)> {
    let enforce = guest
        .output("cat /sys/fs/selinux/enforce", Duration::from_secs(60))
        .await?;
    let selinux = parse_mode(enforce.success().then_some(enforce.stdout.as_str()))
        .ok_or_else(|| anyhow::anyhow!("{SELINUX_OFF}"))?;
    let mut results = Vec::new();
    for (i, op) in OPERATIONS.iter().enumerate() {
        progress(&format!("[{}/{}] {}", i + 1, OPERATIONS.len(), op.command));
        let out = guest
            .output(&probe_script(mode, op), Duration::from_secs(180))
            .await?;
        results.push((*op, parse_outcome(&out.stdout)));
    }
    // The mount operations leave their directory; nothing else is left behind.
    let _ = guest
        .output(
            &format!("rmdir {PROBE_MOUNT} 2>/dev/null; true"),
            Duration::from_secs(60),
        )
        .await;
    Ok((selinux, results))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aks_flex_node::entrypoint::MOUNTS;
    use flex_host::hostexec::{CHROOT_TOOLS, MOUNT_NS_TOOLS};

    #[test]
    fn every_host_exec_tool_is_exercised() {
        let covered = tools_covered();
        for t in CHROOT_TOOLS.iter().chain(MOUNT_NS_TOOLS) {
            assert!(covered.contains(t), "{t} has no operation");
        }
        // And nothing runs that host-exec would not run on the host (besides the agent's own
        // commands).
        for o in OPERATIONS {
            let first = o.command.split_whitespace().next().unwrap();
            assert!(
                first == "aks-flex-node"
                    || CHROOT_TOOLS.contains(&first)
                    || MOUNT_NS_TOOLS.contains(&first),
                "{}",
                o.command
            );
        }
    }

    #[test]
    fn every_writable_host_path_is_written_or_exempt() {
        for m in MOUNTS.iter().filter(|m| !m.read_only) {
            let written = OPERATIONS.iter().any(|o| {
                o.kind == Kind::Write && o.subject == m.path && o.command.ends_with(m.path)
            });
            let exempt = WRITE_EXEMPT.iter().any(|(p, _)| *p == m.path);
            assert!(
                written ^ exempt,
                "{}: written {written}, exempt {exempt}",
                m.path
            );
        }
    }

    #[test]
    fn every_kind_is_there_and_the_mounts_are_in_order() {
        for k in [
            Kind::Tool,
            Kind::Mount,
            Kind::Dbus,
            Kind::Machinectl,
            Kind::Journal,
            Kind::Write,
        ] {
            assert!(OPERATIONS.iter().any(|o| o.kind == k), "{k:?}");
        }
        let pos = |c: &str| {
            OPERATIONS
                .iter()
                .position(|o| o.command.starts_with(c))
                .unwrap()
        };
        assert!(pos("mount ") < pos("mountpoint ") && pos("mountpoint ") < pos("umount "));
        let (mkdir, rmdir) = (
            pos("systemd-run --wait --quiet --collect /usr/bin/mkdir"),
            pos("systemd-run --wait --quiet --collect /usr/bin/rmdir"),
        );
        assert!(mkdir < pos("mount ") && pos("umount ") < rmdir);
        assert!(pos("ip link add") < pos("ip link del"));
        assert!(pos("nft add") < pos("nft delete"));
        for o in OPERATIONS.iter().filter(|o| o.kind == Kind::Mount) {
            assert!(o.command.contains(PROBE_MOUNT), "{}", o.command);
        }
        for o in OPERATIONS.iter().filter(|o| o.command.contains("aksflex")) {
            assert!(o.command.contains(PROBE_NAME), "{}", o.command);
        }
    }

    #[test]
    fn selinux_mode_from_the_enforce_file() {
        assert_eq!(parse_mode(Some("1\n")), Some(Mode::Enforcing));
        assert_eq!(parse_mode(Some("0")), Some(Mode::Permissive));
        assert_eq!(parse_mode(None), None);
        assert_eq!(parse_mode(Some("")), None);
    }

    #[test]
    fn probe_script_runs_in_the_container_and_reads_denials_after_a_cursor() {
        let s = probe_script(AgentMode::Image, &OPERATIONS[0]);
        assert!(s.contains("ctr -n aks-flex tasks exec"), "{s}");
        assert!(
            s.contains("aks-flex-agent systemctl show --property=Version"),
            "{s}"
        );
        assert!(s.contains("--show-cursor"));
        assert!(s.find("--show-cursor").unwrap() < s.find("aks-flex-agent").unwrap());
        assert!(s.contains("--after-cursor=\"$c\" -g 'avc:  denied'"));
    }

    #[test]
    fn outcomes_parse() {
        let o = parse_outcome(
            "rc=1\nout: Failed to list machines: Access denied\navc: audit: type=1107 audit(1.2:3): pid=1 uid=0 msg='avc:  denied  { send_msg } for msgtype=method_call scontext=system_u:system_r:spc_t:s0 tcontext=system_u:system_r:kernel_t:s0 tclass=dbus permissive=0'\n",
        );
        assert!(!o.succeeded());
        assert_eq!(o.code, Some(1));
        assert_eq!(o.output, ["Failed to list machines: Access denied"]);
        assert_eq!(o.denials.len(), 1);
        assert_eq!(
            summarize_denial(&o.denials[0]),
            "{ send_msg } spc_t -> kernel_t:dbus"
        );
        assert_eq!(summarize_denial("garbage"), "garbage");
        let ok = parse_outcome("rc=0\nout: Version=252\n");
        assert!(ok.succeeded() && ok.denials.is_empty());
        assert!(!parse_outcome("").succeeded());
    }

    #[test]
    fn report_lists_each_operation_with_result_and_denials() {
        let ok = parse_outcome("rc=0\n");
        let bad = parse_outcome(
            "rc=1\nout: Access denied\navc: avc:  denied  { write } for pid=9 comm=\"x\" scontext=system_u:system_r:spc_t:s0 tcontext=system_u:object_r:etc_t:s0 tclass=dir permissive=0\n",
        );
        let r = report(
            Mode::Enforcing,
            &[(OPERATIONS[0], ok), (OPERATIONS[1], bad.clone())],
        );
        assert!(r.starts_with("SELinux enforcing; 2 host operations"), "{r}");
        assert!(
            r.contains("  1  tool        ok       0        systemctl show"),
            "{r}"
        );
        assert!(r.contains("exit 1"), "{r}");
        assert!(r.contains("| Access denied"), "{r}");
        assert!(r.contains("denied: { write } spc_t -> etc_t:dir"), "{r}");
        assert!(
            r.trim_end()
                .ends_with("1 of 2 operations failed; 1 AVC denials"),
            "{r}"
        );
        assert_eq!(totals(&[(OPERATIONS[1], bad)]), (1, 1));
    }
}
