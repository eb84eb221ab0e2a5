//! QEMU's command line, built from a [`QemuSpec`] by a pure function so every flag is
//! snapshot-tested.
//!
//! The VM boots either the kernel directly (the dev host, and ACL when its own add-ons would
//! select the Azure platform) or from UEFI firmware (ACL), on a qcow2 overlay with
//! `cache=unsafe` (the harness owns the disk and drops it with the VM; the host ignores the
//! guest's flushes). The Ignition config goes on fw_cfg. The guest's network is QEMU's user
//! network: it reaches the registry on the host's loopback as `10.0.2.2:<port>`, and the host
//! reaches the guest's SSH through a forwarded loopback port.

use std::path::PathBuf;

/// How QEMU runs guest code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualisation.
    Kvm,
    /// Software emulation (multi-threaded TCG).
    Tcg,
}

/// How the guest boots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Boot {
    /// `-kernel`/`-initrd`/`-append`.
    Kernel {
        /// Kernel image.
        kernel: PathBuf,
        /// Initial ramdisk, if the kernel has one apart (ACL's UKI does; a GRUB-booted image
        /// may not).
        initrd: Option<PathBuf>,
        /// Kernel command line.
        append: String,
    },
    /// UEFI firmware (OVMF) with its own variable store copy.
    Uefi {
        /// Read-only firmware code.
        code: PathBuf,
        /// Writable variables (a per-VM copy).
        vars: PathBuf,
    },
}

/// Everything that decides QEMU's argv.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QemuSpec {
    /// Acceleration.
    pub accel: Accel,
    /// vCPUs.
    pub cpus: u32,
    /// Memory in MiB.
    pub memory_mib: u32,
    /// The VM's disk (a qcow2 overlay).
    pub disk: PathBuf,
    /// Boot method.
    pub boot: Boot,
    /// fw_cfg key and file carrying the Ignition config.
    pub fw_cfg: Option<(String, PathBuf)>,
    /// Host loopback port forwarded to the guest's SSH port.
    pub ssh_port: u16,
    /// Serial console log.
    pub serial_log: PathBuf,
    /// QMP socket.
    pub qmp_socket: PathBuf,
    /// PID file.
    pub pidfile: PathBuf,
    /// Detach once started (`-daemonize`).
    pub daemonize: bool,
}

/// The fw_cfg key ACL and Flatcar read the Ignition config from.
pub const FWCFG_FLATCAR: &str = "opt/org.flatcar-linux/config";
/// The fw_cfg key upstream Ignition (and Debian's) reads.
pub const FWCFG_COREOS: &str = "opt/com.coreos/config";

/// The CPU TCG emulates: QEMU's baseline `qemu64` with the x86-64-v2 extensions (a
/// distribution built for v2 still runs), not `max`. Every feature `max` adds is one more to
/// emulate, and some cost on every memory access: with `max` the guest kernel turns on 5-level
/// paging (`la57`), so every TLB miss walks one level more. Measured on this kind of machine
/// (2 cores, the dev host, the median of two boots each): first boot to SSH 37 s against 41 s,
/// 200 fork+exec 2.4 s against 3.3 s, SHA-256 of 50 MB 1.5 s against 1.8 s, gzip of `/usr/bin`
/// 58 s against 64 s.
pub const TCG_CPU: &str = "qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16";

/// QEMU's argv (without the program name).
pub fn args(spec: &QemuSpec) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| (*s).to_string()));
    match spec.accel {
        Accel::Kvm => push(&["-accel", "kvm", "-cpu", "host"]),
        Accel::Tcg => push(&["-accel", "tcg,thread=multi", "-cpu", TCG_CPU]),
    }
    let smp = spec.cpus.to_string();
    let mem = spec.memory_mib.to_string();
    push(&[
        "-machine",
        "q35",
        "-smp",
        &smp,
        "-m",
        &mem,
        "-display",
        "none",
        "-nodefaults",
    ]);
    match &spec.boot {
        Boot::Kernel {
            kernel,
            initrd,
            append,
        } => {
            let k = kernel.display().to_string();
            push(&["-kernel", &k]);
            if let Some(initrd) = initrd {
                let i = initrd.display().to_string();
                push(&["-initrd", &i]);
            }
            push(&["-append", append]);
        }
        Boot::Uefi { code, vars } => {
            let c = format!(
                "if=pflash,format=raw,unit=0,readonly=on,file={}",
                code.display()
            );
            let v = format!("if=pflash,format=raw,unit=1,file={}", vars.display());
            push(&["-drive", &c, "-drive", &v]);
        }
    }
    let disk = format!(
        "file={},if=virtio,format=qcow2,cache=unsafe,discard=unmap",
        spec.disk.display()
    );
    push(&["-drive", &disk]);
    // The guest reaches the host's loopback registry at 10.0.2.2 (QEMU's user network maps it
    // to 127.0.0.1). Not `restrict=on` with a `guestfwd`: a `tcp:` guestfwd connects to the
    // host once and multiplexes every guest connection over it, which corrupts concurrent
    // blob downloads.
    let netdev = format!("user,id=n0,hostfwd=tcp:127.0.0.1:{}-:22", spec.ssh_port);
    push(&["-netdev", &netdev, "-device", "virtio-net-pci,netdev=n0"]);
    push(&["-device", "virtio-rng-pci"]);
    if let Some((key, file)) = &spec.fw_cfg {
        let f = format!("name={key},file={}", file.display());
        push(&["-fw_cfg", &f]);
    }
    let serial = format!("file:{}", spec.serial_log.display());
    let qmp = format!("unix:{},server=on,wait=off", spec.qmp_socket.display());
    let pid = spec.pidfile.display().to_string();
    push(&["-serial", &serial, "-qmp", &qmp, "-pidfile", &pid]);
    if spec.daemonize {
        push(&["-daemonize"]);
    }
    a
}

/// The kernel command line of the dev host.
pub fn dev_host_append(extra: &[&str]) -> String {
    let mut v = vec![
        "root=/dev/vda",
        "rw",
        "console=ttyS0",
        "quiet",
        "systemd.show_status=false",
        "init=/usr/local/sbin/firstboot-init",
        "ignition.firstboot=ignition",
        "net.ifnames=0",
    ];
    // A `key=value` argument replaces any earlier one with the same key (the default `init=`,
    // or a variant's `enforcing=1` replaced by `up --kernel-arg enforcing=0`): the kernel takes
    // the last, but systemd's policy load reads the first `enforcing=`.
    for a in extra {
        if let Some((key, _)) = a.split_once('=') {
            let prefix = format!("{key}=");
            v.retain(|b| !b.starts_with(&prefix));
        }
        v.push(a);
    }
    v.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> QemuSpec {
        QemuSpec {
            accel: Accel::Tcg,
            cpus: 2,
            memory_mib: 2048,
            disk: "/w/vm/disk.qcow2".into(),
            boot: Boot::Kernel {
                kernel: "/c/vmlinuz".into(),
                initrd: Some("/c/initrd.img".into()),
                append: dev_host_append(&[]),
            },
            fw_cfg: Some((FWCFG_COREOS.into(), "/w/vm/config.ign".into())),
            ssh_port: 2222,
            serial_log: "/w/vm/serial.log".into(),
            qmp_socket: "/w/vm/qmp.sock".into(),
            pidfile: "/w/vm/qemu.pid".into(),
            daemonize: true,
        }
    }

    /// `up --kernel-arg enforcing=0` on the SELinux variant: one `enforcing=`, the last given
    /// (systemd's policy load would read the first), the variant's `init=` in place of the
    /// default's, arguments without a value kept as they come.
    #[test]
    fn a_later_kernel_argument_replaces_an_earlier_one_with_its_key() {
        let a = dev_host_append(&[
            "security=selinux",
            "enforcing=1",
            "init=/usr/local/sbin/firstboot-init-selinux",
            "enforcing=0",
            "quiet",
        ]);
        let words: Vec<&str> = a.split(' ').collect();
        let count = |p: &str| words.iter().filter(|w| w.starts_with(p)).count();
        assert_eq!(count("enforcing="), 1, "{a}");
        assert!(words.contains(&"enforcing=0"), "{a}");
        assert_eq!(count("init="), 1, "{a}");
        assert!(
            words.contains(&"init=/usr/local/sbin/firstboot-init-selinux"),
            "{a}"
        );
        assert_eq!(count("quiet"), 2, "{a}");
        assert_eq!(dev_host_append(&[]).split(' ').count(), 8);
    }

    #[test]
    fn dev_host_tcg_argv() {
        insta::assert_snapshot!(args(&spec()).join("\n"));
    }

    #[test]
    fn acl_uefi_kvm_argv() {
        let mut s = spec();
        s.accel = Accel::Kvm;
        s.boot = Boot::Uefi {
            code: "/usr/share/OVMF/OVMF_CODE_4M.fd".into(),
            vars: "/w/vm/OVMF_VARS.fd".into(),
        };
        s.fw_cfg = Some((FWCFG_FLATCAR.into(), "/w/vm/config.ign".into()));
        s.daemonize = false;
        let a = args(&s);
        insta::assert_snapshot!(a.join("\n"));
        assert!(a.iter().any(|x| x.contains("cache=unsafe")));
        assert!(!a.contains(&"-daemonize".to_string()));
    }

    /// ACL whose add-ons select Azure: its own kernel and initrd, its command line with the
    /// qemu platform, no firmware.
    #[test]
    fn acl_direct_kernel_argv() {
        let mut s = spec();
        s.boot = Boot::Kernel {
            kernel: "/w/vm/acl-boot/vmlinuz".into(),
            initrd: Some("/w/vm/acl-boot/initrd".into()),
            append: crate::acl::boot::qemu_append(
                &["root=LABEL=ROOT".into(), "flatcar.oem.id=azure".into()],
                true,
            ),
        };
        s.fw_cfg = Some((FWCFG_FLATCAR.into(), "/w/vm/config.ign".into()));
        let a = args(&s);
        insta::assert_snapshot!(a.join("\n"));
        assert!(!a.iter().any(|x| x.contains("pflash")));
        s.boot = Boot::Kernel {
            kernel: "/k".into(),
            initrd: None,
            append: "console=ttyS0".into(),
        };
        let a = args(&s);
        assert!(!a.contains(&"-initrd".to_string()), "{a:?}");
    }
}
