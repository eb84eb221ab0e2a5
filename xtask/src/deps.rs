//! Debian packages the tasks need, installed with apt-get when missing and running as root on
//! Debian (QEMU from bookworm-backports, whose apt source is added when missing: the machine's
//! own Debian source with the suite changed, [`backports`]); otherwise the missing packages are
//! named. This is the one place the project installs packages; the harness only checks for its
//! tools and names the package.

use std::path::{Path, PathBuf};
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
    // agent/tests/host_routing.rs: the host routing scripts run with the real `ip` in a network
    // namespace of their own.
    "iproute2",
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
    // harness/src/prometheus tests and the metrics group: Debian's Prometheus scrapes the
    // daemon's and the controller's endpoints.
    "prometheus",
];

/// Packages `up` needs: QEMU (from bookworm-backports on Debian 12), the dev host image build
/// (mmdebstrap, mkfs.ext4, dpkg-deb), the local registry and ssh; and Prometheus, which the
/// `metrics` group of the `check` after it runs.
pub const VM_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "qemu-utils",
    "mmdebstrap",
    "e2fsprogs",
    "docker-registry",
    "openssh-client",
    "dpkg",
    "prometheus",
];

/// The package installed from bookworm-backports on Debian 12 (bookworm's own QEMU conflicts
/// with the machine's qemu-utils).
const BACKPORTS_PACKAGE: &str = "qemu-system-x86";

/// The `-backports` apt source of a Debian system, derived from its own configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backports {
    /// `<codename>-backports`.
    pub suite: String,
    /// Where it is written: `<root>/etc/apt/sources.list.d/<codename>-backports.sources`.
    pub path: PathBuf,
    /// The deb822 source: the URIs and keyring of the system's own Debian source
    /// ([`flex_host::apt::DebianArchive::find`]), the suite changed to `-backports`.
    pub text: String,
    /// Whether the system already has an enabled source of the suite (or the file exists).
    pub configured: bool,
    /// What fell back to deb.debian.org, for the user to see.
    pub notes: Vec<String>,
}

/// The `-backports` source of the Debian system under `root` (`/`): its codename from
/// `etc/os-release`, its sources from `etc/apt`. Fails on a system that is not Debian.
pub fn backports(root: &Path) -> anyhow::Result<Backports> {
    let os = root.join("etc/os-release");
    let text = std::fs::read_to_string(&os)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", os.display()))?;
    let Some(codename) = flex_host::apt::debian_codename(&text) else {
        anyhow::bail!(
            "{} names no Debian release: no -backports source to add",
            os.display()
        );
    };
    let sources = flex_host::apt::read_sources(&root.join("etc/apt"))?;
    let archive = flex_host::apt::DebianArchive::find(&sources, &codename);
    let suite = format!("{codename}-backports");
    let path = root.join(format!("etc/apt/sources.list.d/{suite}.sources"));
    Ok(Backports {
        configured: flex_host::apt::serves(&sources, &suite) || path.exists(),
        text: archive.backports_source(&codename),
        notes: archive.notes,
        suite,
        path,
    })
}

/// Writes [`backports`]'s source under `root` unless the suite is configured already; returns
/// it with `configured` as it was before. Each note goes to stderr.
pub fn add_backports(root: &Path) -> anyhow::Result<Backports> {
    let b = backports(root)?;
    for n in &b.notes {
        eprintln!("xtask: {n}");
    }
    if !b.configured {
        std::fs::write(&b.path, &b.text)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", b.path.display()))?;
        eprintln!(
            "xtask: added the apt source {} ({})",
            b.suite,
            b.path.display()
        );
    }
    Ok(b)
}

/// `cargo xtask backports [--write]`: prints the `-backports` source of this machine; with
/// `write`, adds it to `/etc/apt/sources.list.d` unless one is configured (`.ci/run` does, as
/// root, before it installs QEMU from it).
pub fn backports_task(write: bool) -> anyhow::Result<()> {
    let root = Path::new("/");
    let b = if write {
        add_backports(root)?
    } else {
        let b = backports(root)?;
        for n in &b.notes {
            eprintln!("xtask: {n}");
        }
        b
    };
    if b.configured {
        eprintln!("xtask: {} is configured already", b.suite);
    }
    print!("{}", b.text);
    Ok(())
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
    if os.contains("bookworm") && missing.contains(&BACKPORTS_PACKAGE) {
        add_backports(Path::new("/"))?;
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

    fn root_with(os_release: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "xtask-backports-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("etc/apt/sources.list.d")).unwrap();
        std::fs::write(d.join("etc/os-release"), os_release).unwrap();
        for (path, text) in files {
            std::fs::write(d.join("etc/apt").join(path), text).unwrap();
        }
        d
    }

    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    const BOOKWORM: &str = "ID=debian\nVERSION_CODENAME=bookworm\n";

    /// The source xtask adds is the machine's own Debian source with the suite changed: the
    /// text written before on a deb.debian.org machine, the mirror and keyring elsewhere;
    /// nothing is written when the suite is there already.
    #[test]
    fn backports_come_from_the_machines_own_debian_source() {
        /// (what, files under etc/apt, the source, configured already).
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str, bool);
        let cases: &[Case] = &[
            (
                "Debian 12's own deb822 file",
                &[(
                    "sources.list.d/debian.sources",
                    "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
                )],
                "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
                false,
            ),
            (
                "a one-line mirror with its own keyring",
                &[(
                    "sources.list",
                    "deb [signed-by=/etc/apt/keyrings/m.gpg] http://mirror.corp/debian bookworm main\n",
                )],
                "Types: deb\nURIs: http://mirror.corp/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /etc/apt/keyrings/m.gpg\n",
                false,
            ),
            (
                "backports already in sources.list",
                &[(
                    "sources.list",
                    "deb http://mirror.corp/debian bookworm main\ndeb http://mirror.corp/debian bookworm-backports main\n",
                )],
                "Types: deb\nURIs: http://mirror.corp/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
                true,
            ),
        ];
        for (name, files, text, configured) in cases {
            let root = root_with(BOOKWORM, files);
            let b = backports(&root).unwrap();
            assert_eq!(b.text, *text, "{name}");
            assert_eq!(b.configured, *configured, "{name}");
            assert_eq!(b.suite, "bookworm-backports");
            let path = root.join("etc/apt/sources.list.d/bookworm-backports.sources");
            assert_eq!(b.path, path);
            add_backports(&root).unwrap();
            assert_eq!(path.exists(), !configured, "{name}");
            if !configured {
                assert_eq!(std::fs::read_to_string(&path).unwrap(), *text);
                // Written once: the second call finds it.
                assert!(add_backports(&root).unwrap().configured);
            }
            std::fs::remove_dir_all(&root).unwrap();
        }
        let ubuntu = root_with("ID=ubuntu\nVERSION_CODENAME=noble\n", &[]);
        let e = backports(&ubuntu).unwrap_err().to_string();
        assert!(e.contains("names no Debian release"), "{e}");
        std::fs::remove_dir_all(&ubuntu).unwrap();
    }

    /// `.ci/run` writes no mirror address: it has xtask add the backports source (the rule
    /// above) before `apt-get update` and the install from it.
    #[test]
    fn ci_run_takes_the_backports_source_from_xtask() {
        let ci = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/run"),
        )
        .unwrap();
        assert!(
            !ci.contains("deb.debian.org") && !ci.contains("URIs:"),
            "{ci}"
        );
        let pos = |needle: &str| ci.find(needle).unwrap_or_else(|| panic!("{needle}"));
        assert!(pos("cargo xtask backports --write") < pos("apt-get update"));
        assert!(pos("apt-get update") < pos("-t bookworm-backports qemu-system-x86"));
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
