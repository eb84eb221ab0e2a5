//! Debian packages the tasks need, installed with apt-get when missing and running as root.

use aks_flex_node::runner::{Cmd, ProcessRunner, Runner, run_inherited};
use std::time::Duration;

/// Packages the test suite needs on a fresh Debian machine.
pub const TEST_PACKAGES: &[&str] = &[
    "util-linux",
    "git",
    "shellcheck",
    "curl",
    // tests/tests/containerd_image.rs: the agent's image in a real containerd against a fake
    // host (/bin/sh from busybox-static, a private dbus-daemon).
    "containerd",
    "runc",
    "dbus",
    "busybox-static",
    // agent/tests/oci_registry.rs and the harness: Debian's distribution registry.
    "docker-registry",
    // ignition/tests: Debian's ignition-validate.
    "ignition",
    // harness tests: ssh-keygen, start-stop-daemon, tar.
    "openssh-client",
    "dpkg",
    "tar",
    // The protobuf compiler some dependencies' build scripts need.
    "protobuf-compiler",
    // harness/src/acl tests: a synthetic GPT + FAT boot disk (sgdisk, mkfs.vfat, mcopy).
    "gdisk",
    "dosfstools",
    "mtools",
];

/// Installs the missing ones of `packages` (root only; otherwise reports them).
pub async fn ensure(packages: &[&str]) -> anyhow::Result<()> {
    let r = ProcessRunner::new();
    let mut missing = Vec::new();
    for p in packages {
        let out = r
            .output(&Cmd::new("dpkg-query").args(["--show", "--showformat=${db:Status-Status}", p]))
            .await?;
        if out.stdout.trim() != "installed" {
            missing.push(*p);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    if aks_flex_node::hostinfo::HostInfo::euid(&aks_flex_node::hostinfo::RealHostInfo) != 0 {
        anyhow::bail!(
            "missing Debian packages: {} (run as root, or `apt-get install {}`)",
            missing.join(" "),
            missing.join(" ")
        );
    }
    let long = Duration::from_secs(1800);
    run_inherited(
        &Cmd::new("apt-get")
            .arg("update")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .timeout(long),
    )
    .await?;
    run_inherited(
        &Cmd::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(missing.iter().copied())
            .env("DEBIAN_FRONTEND", "noninteractive")
            .timeout(long),
    )
    .await?;
    Ok(())
}
