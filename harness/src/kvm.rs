//! Choosing the accelerator. `/dev/kvm` may exist and still be unusable: here it is a
//! paravirtual nested KVM that hangs stock kernels. So KVM is chosen only after a short probe
//! boot of the guest's own kernel shows it gets as far as running a kernel; otherwise TCG, and
//! the harness says why.

use crate::qemu::Accel;

/// What the probe boot saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// Not run (no `/dev/kvm`, or not accessible).
    NotRun(String),
    /// QEMU exited within the deadline; the serial console's text.
    Exited {
        /// QEMU's exit code.
        code: Option<i32>,
        /// Serial console output.
        console: String,
    },
    /// Still running at the deadline (killed); the console so far.
    TimedOut {
        /// Serial console output.
        console: String,
    },
}

/// Console markers that show the kernel ran (it may then panic for want of a root file system,
/// which is fine: the probe boots without a disk).
const KERNEL_RAN: &[&str] = &[
    "Linux version",
    "Kernel panic",
    "VFS:",
    "Run /init",
    "Freeing unused",
];

/// The choice and why.
pub fn decide(kvm_requested: bool, probe: &Probe) -> (Accel, String) {
    if !kvm_requested {
        return (Accel::Tcg, "TCG requested".into());
    }
    match probe {
        Probe::NotRun(why) => (Accel::Tcg, format!("KVM not usable ({why}); using TCG")),
        Probe::Exited { console, .. } | Probe::TimedOut { console }
            if KERNEL_RAN.iter().filter(|m| console.contains(*m)).count() >= 2 =>
        {
            (
                Accel::Kvm,
                "KVM probe boot ran the kernel; using KVM".into(),
            )
        }
        Probe::Exited { code, .. } => (
            Accel::Tcg,
            format!("KVM probe boot failed (QEMU exit {code:?}, no kernel output); using TCG"),
        ),
        Probe::TimedOut { console } => (
            Accel::Tcg,
            format!(
                "KVM probe boot hung ({} bytes of console output before the deadline); /dev/kvm is not usable for this kernel, using TCG",
                console.len()
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_table() {
        let booted = "[    0.000000] Linux version 6.1.0\n...\n[    1.2] Kernel panic - not syncing: VFS: Unable to mount root fs\n";
        let cases = vec![
            (
                false,
                Probe::NotRun("x".into()),
                Accel::Tcg,
                "TCG requested",
            ),
            (
                true,
                Probe::NotRun("/dev/kvm missing".into()),
                Accel::Tcg,
                "KVM not usable (/dev/kvm missing)",
            ),
            (
                true,
                Probe::Exited {
                    code: Some(0),
                    console: booted.into(),
                },
                Accel::Kvm,
                "using KVM",
            ),
            (
                true,
                Probe::TimedOut {
                    console: booted.into(),
                },
                Accel::Kvm,
                "using KVM",
            ),
            (
                true,
                Probe::TimedOut {
                    console: String::new(),
                },
                Accel::Tcg,
                "hung",
            ),
            (
                true,
                Probe::TimedOut {
                    console: "SeaBIOS\n".into(),
                },
                Accel::Tcg,
                "hung",
            ),
            (
                true,
                Probe::Exited {
                    code: Some(1),
                    console: "qemu: failed to initialize kvm".into(),
                },
                Accel::Tcg,
                "failed",
            ),
        ];
        for (req, probe, accel, reason) in cases {
            let (a, r) = decide(req, &probe);
            assert_eq!(a, accel, "{probe:?}");
            assert!(r.contains(reason), "{r} vs {reason}");
        }
    }
}
