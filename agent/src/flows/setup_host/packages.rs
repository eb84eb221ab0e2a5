//! `install-packages`: make sure the host has what the machines need (`systemd-container`,
//! `curl`, `nftables`, `util-linux`), with apt-get, tdnf or dnf, whichever is on `PATH` first.
//! On an image-managed host (read-only `/usr`, as ACL) nothing is installed: the needed
//! programs are checked and the missing ones listed.

use crate::config::Config;
use flex_host::context::Host;
use flex_host::runner::Cmd;
use std::path::Path;
use std::time::Duration;

/// Each required package and the program that shows it is there.
pub const REQUIRED_PACKAGES: &[(&str, &str)] = &[
    ("systemd-container", "systemd-nspawn"),
    ("curl", "curl"),
    ("nftables", "nft"),
    ("util-linux", "mountpoint"),
];

const INSTALL_TIMEOUT: Duration = Duration::from_secs(900);

/// An `install-packages` failure.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    /// Programs are missing and cannot be installed here.
    #[error(
        "host is missing required programs and packages cannot be installed here{reason}: {missing}"
    )]
    Missing {
        /// `pkg (provides bin)` list.
        missing: String,
        /// Why nothing can be installed.
        reason: String,
    },
    /// A package manager command failed.
    #[error(transparent)]
    Command(#[from] flex_host::runner::CmdError),
}

/// The `pkg (provides bin)` entries whose program is not on `PATH`.
pub fn check_capabilities(host: &Host) -> Vec<String> {
    REQUIRED_PACKAGES
        .iter()
        .filter(|(_, bin)| host.runner.which(bin).is_none())
        .map(|(pkg, bin)| format!("{pkg} (provides {bin})"))
        .collect()
}

fn missing_error(missing: Vec<String>, reason: &str) -> Result<(), PackageError> {
    if missing.is_empty() {
        return Ok(());
    }
    Err(PackageError::Missing {
        missing: missing.join(", "),
        reason: reason.to_string(),
    })
}

/// Runs `install-packages`.
pub async fn install_packages(host: &Host, _config: &Config) -> Result<(), PackageError> {
    let read_only = host.info.is_read_only(Path::new("/usr")).unwrap_or(false);
    if read_only {
        tracing::info!("/usr is read-only; checking required programs instead of installing");
        return missing_error(check_capabilities(host), " (/usr is read-only)");
    }
    let r = &host.runner;
    if r.which("apt-get").is_some() {
        let mut missing = Vec::new();
        for (pkg, _) in REQUIRED_PACKAGES {
            let out = r
                .output(&Cmd::new("dpkg-query").args([
                    "--show",
                    "--showformat=${db:Status-Status}",
                    pkg,
                ]))
                .await?;
            if !(out.success() && out.stdout.trim() == "installed") {
                missing.push(*pkg);
            }
        }
        if missing.is_empty() {
            tracing::info!("required packages already installed");
            return Ok(());
        }
        let apt = |args: Vec<&str>| {
            Cmd::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .timeout(INSTALL_TIMEOUT)
        };
        r.run(&apt(vec!["update", "-y"])).await?;
        let mut args = vec!["install", "-y", "--no-install-recommends"];
        args.extend(missing.iter().copied());
        r.run(&apt(args)).await?;
        return Ok(());
    }
    for pm in ["tdnf", "dnf"] {
        if r.which(pm).is_none() {
            continue;
        }
        let mut missing = Vec::new();
        for (pkg, bin) in REQUIRED_PACKAGES {
            let present = if r.which("rpm").is_some() {
                r.output(&Cmd::new("rpm").args(["-q", "--quiet", pkg]))
                    .await?
                    .success()
            } else {
                r.which(bin).is_some()
            };
            if !present {
                missing.push(*pkg);
            }
        }
        if missing.is_empty() {
            tracing::info!("required packages already installed");
            return Ok(());
        }
        r.run(&Cmd::new(pm).arg("makecache").timeout(INSTALL_TIMEOUT))
            .await?;
        r.run(
            &Cmd::new(pm)
                .args(["install", "-y"])
                .args(missing.iter().copied())
                .timeout(INSTALL_TIMEOUT),
        )
        .await?;
        return Ok(());
    }
    missing_error(
        check_capabilities(host),
        " (no apt-get, tdnf or dnf on PATH)",
    )
}
