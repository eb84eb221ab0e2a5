//! Debian packages the tasks need, installed with apt-get when missing and running as root on
//! Debian (QEMU from bookworm-backports, whose apt source is added when missing); otherwise the
//! missing packages are named. This is the one place the project installs packages; the
//! harness only checks for its tools and names the package.

use std::path::Path;
use std::time::Duration;

use flex_host::hostinfo::{HostInfo, RealHostInfo};
use flex_host::runner::{Cmd, ProcessRunner, Runner, run_inherited};

/// Packages the test suite needs on a fresh Debian machine (`.ci/run` installs the same).
pub const TEST_PACKAGES: &[&str] = &[
    "util-linux",
    "git",
    "ca-certificates",
    "shellcheck",
    "curl",
    // tests/tests/containerd_image.rs: the agent's image in a real containerd against a fake
    // host (/bin/sh from busybox-static, a private dbus-daemon).
    "containerd",
    "runc",
    "dbus",
    "busybox-static",
    // oci/tests/registry.rs and the harness: Debian's distribution registry.
    "docker-registry",
    // ignition/tests: Debian's ignition-validate.
    "ignition",
    // harness tests: ssh-keygen, start-stop-daemon, tar.
    "openssh-client",
    "dpkg",
    "tar",
    // harness/src/fixtures tests: a real machine rootfs and component bundle from Debian's
    // packages.
    "mmdebstrap",
    // harness/src/acl tests: a synthetic GPT + FAT boot disk (sgdisk, mkfs.vfat, mcopy).
    "gdisk",
    "dosfstools",
    "mtools",
    // cargo xtask fuzz (ci runs it): libfuzzer-sys builds libFuzzer with the C++ compiler.
    "g++",
    // harness/tests/report_chromium.rs: the HTML check report in headless Chromium.
    "chromium",
];

/// Packages `up` needs: QEMU (from bookworm-backports on Debian 12), the dev host image build
/// (mmdebstrap, mkfs.ext4, dpkg-deb), the local registry and ssh.
pub const VM_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "qemu-utils",
    "mmdebstrap",
    "e2fsprogs",
    "docker-registry",
    "openssh-client",
    "dpkg",
];

/// The package installed from bookworm-backports on Debian 12 (bookworm's own QEMU conflicts
/// with the machine's qemu-utils).
const BACKPORTS_PACKAGE: &str = "qemu-system-x86";
const BACKPORTS_SOURCE: &str = "/etc/apt/sources.list.d/bookworm-backports.sources";

/// The apt source of bookworm-backports, as deb822.
fn backports_source() -> &'static str {
    "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
}

/// The ones of `packages` dpkg does not list as installed.
async fn missing(r: &dyn Runner, packages: &[&'static str]) -> anyhow::Result<Vec<&'static str>> {
    let mut missing = Vec::new();
    for p in packages {
        let out = r
            .output(&Cmd::new("dpkg-query").args(["--show", "--showformat=${db:Status-Status}", p]))
            .await?;
        if out.stdout.trim() != "installed" {
            missing.push(*p);
        }
    }
    Ok(missing)
}

/// The apt-get calls that install `missing` on a system whose os-release is `os_release`:
/// the backports package with `-t bookworm-backports` on bookworm, the rest in one call.
pub fn install_plan(missing: &[&str], os_release: &str) -> Vec<Vec<String>> {
    let bookworm = os_release.contains("bookworm");
    let base = ["install", "-y", "-q", "--no-install-recommends"];
    let (backports, plain): (Vec<&str>, Vec<&str>) = missing
        .iter()
        .partition(|p| bookworm && **p == BACKPORTS_PACKAGE);
    let mut calls = vec![vec!["update".to_string(), "-q".to_string()]];
    if !plain.is_empty() {
        calls.push(
            base.iter()
                .chain(plain.iter())
                .map(|s| s.to_string())
                .collect(),
        );
    }
    if !backports.is_empty() {
        calls.push(
            base.iter()
                .chain(["-t", "bookworm-backports"].iter())
                .chain(backports.iter())
                .map(|s| s.to_string())
                .collect(),
        );
    }
    calls
}

/// Installs the missing ones of `packages` (root on Debian only; otherwise names them).
pub async fn ensure(packages: &[&'static str]) -> anyhow::Result<()> {
    let r = ProcessRunner::new();
    if r.which("dpkg-query").is_none() {
        anyhow::bail!(
            "not a Debian system (no dpkg-query): install these packages yourself: {}",
            packages.join(" ")
        );
    }
    let missing = missing(&r, packages).await?;
    if missing.is_empty() {
        return Ok(());
    }
    if RealHostInfo.euid() != 0 {
        anyhow::bail!(
            "missing Debian packages: {} (run as root, or install them: on Debian 12 {} comes from bookworm-backports)",
            missing.join(" "),
            BACKPORTS_PACKAGE
        );
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    if os.contains("bookworm")
        && missing.contains(&BACKPORTS_PACKAGE)
        && !Path::new(BACKPORTS_SOURCE).exists()
    {
        std::fs::write(BACKPORTS_SOURCE, backports_source())?;
    }
    for args in install_plan(&missing, &os) {
        run_inherited(
            &Cmd::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .timeout(Duration::from_secs(1800)),
        )
        .await?;
    }
    let still = self::missing(&r, &missing).await?;
    if !still.is_empty() {
        anyhow::bail!("still missing after apt-get: {}", still.join(" "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `.ci/run` installs every package of [`TEST_PACKAGES`] (it runs `ci --no-install`).
    #[test]
    fn ci_run_installs_the_test_packages() {
        let ci = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/run"),
        )
        .unwrap();
        let words: Vec<&str> = ci
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .flat_map(|l| l.split_whitespace())
            .collect();
        for p in TEST_PACKAGES {
            assert!(words.contains(p), ".ci/run does not install {p}");
        }
    }

    #[test]
    fn qemu_comes_from_backports_on_bookworm_only() {
        let bookworm =
            "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_CODENAME=bookworm\n";
        assert_eq!(
            install_plan(&["qemu-system-x86", "mmdebstrap"], bookworm),
            vec![
                vec!["update", "-q"],
                vec![
                    "install",
                    "-y",
                    "-q",
                    "--no-install-recommends",
                    "mmdebstrap"
                ],
                vec![
                    "install",
                    "-y",
                    "-q",
                    "--no-install-recommends",
                    "-t",
                    "bookworm-backports",
                    "qemu-system-x86"
                ],
            ]
        );
        assert_eq!(
            install_plan(&["qemu-system-x86"], "VERSION_CODENAME=trixie\n"),
            vec![
                vec!["update", "-q"],
                vec![
                    "install",
                    "-y",
                    "-q",
                    "--no-install-recommends",
                    "qemu-system-x86"
                ],
            ]
        );
    }
}
