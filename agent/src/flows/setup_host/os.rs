//! The host tasks that write files and flip units: `configure-os`, `configure-nftables`,
//! `disable-docker`, `disable-swap`, `harden-apt`. Paths and contents as unbounded writes them.

use std::path::Path;

use serde::Serialize;

use flex_host::context::Host;
use flex_host::runner::Cmd;

/// Kernel settings file.
pub const SYSCTL_PATH: &str = "/etc/sysctl.d/99-kubernetes.conf";
/// nft script that flushes the ruleset.
pub const NFT_CLEAR_PATH: &str = "/etc/unbounded/kube/nftables-clear.nft";
/// Unit that runs it before any nspawn machine starts.
pub const NFT_FLUSH_UNIT: &str = "nftables-flush.service";
/// Where that unit is written.
pub const NFT_FLUSH_UNIT_PATH: &str = "/etc/systemd/system/nftables-flush.service";
/// Docker's daemon config.
pub const DOCKER_DAEMON_JSON: &str = "/etc/docker/daemon.json";
/// unattended-upgrades blacklist.
pub const APT_UNATTENDED_PATH: &str = "/etc/apt/apt.conf.d/99-unbounded-no-restart-systemd";
/// needrestart config.
pub const APT_NEEDRESTART_PATH: &str = "/etc/needrestart/conf.d/99-unbounded.conf";

/// Settings kubelet expects with `--protect-kernel-defaults=true`; inside nspawn `/proc/sys` is
/// read-only, so the host sets them.
const SYSCTLS: &[(&str, &str)] = &[
    ("vm.overcommit_memory", "1"),
    ("vm.panic_on_oom", "0"),
    ("kernel.panic", "10"),
    ("kernel.panic_on_oops", "1"),
    ("kernel.keys.root_maxkeys", "1000000"),
    ("kernel.keys.root_maxbytes", "25000000"),
    ("net.bridge.bridge-nf-call-iptables", "1"),
    ("net.bridge.bridge-nf-call-ip6tables", "1"),
    ("net.ipv4.ip_forward", "1"),
    ("net.ipv4.conf.all.src_valid_mark", "1"),
    ("net.ipv4.conf.default.src_valid_mark", "1"),
    ("net.ipv4.conf.all.rp_filter", "0"),
    ("net.ipv4.conf.default.rp_filter", "0"),
];

/// The content of [`SYSCTL_PATH`].
pub fn render_sysctl() -> String {
    let mut s = String::from(
        "# Written by aks-flex-node: kernel settings for kubelet in nspawn machines.\n",
    );
    for (k, v) in SYSCTLS {
        s.push_str(&format!("{k} = {v}\n"));
    }
    s
}

/// `configure-os`: writes the sysctl file and applies it (`sysctl --system`; failure is fatal).
pub async fn configure_os(host: &Host) -> anyhow::Result<()> {
    host.fs
        .write_atomic(Path::new(SYSCTL_PATH), render_sysctl().as_bytes(), 0o644)?;
    host.runner.run(&Cmd::new("sysctl").arg("--system")).await?;
    Ok(())
}

const NFT_CLEAR: &str = "#!/usr/sbin/nft -f\n# Flush every nftables rule so nspawn machines start from a clean state.\nflush ruleset\n";

const NFT_FLUSH_UNIT_CONTENT: &str = "\
[Unit]
Description=Flush nftables rules to a clean state
Before=systemd-nspawn@.service
After=iptables.service ip6tables.service nftables.service

[Service]
Type=oneshot
ExecStart=/usr/sbin/nft -f /etc/unbounded/kube/nftables-clear.nft
RemainAfterExit=no

[Install]
RequiredBy=systemd-nspawn@.service
";

/// `configure-nftables`: the flush script (0600) and its unit, then enable (which reloads the
/// manager and so loads the new unit) and start it (each fatal).
pub async fn configure_nftables(host: &Host) -> anyhow::Result<()> {
    host.fs
        .write_atomic(Path::new(NFT_CLEAR_PATH), NFT_CLEAR.as_bytes(), 0o600)?;
    host.fs.write_atomic(
        Path::new(NFT_FLUSH_UNIT_PATH),
        NFT_FLUSH_UNIT_CONTENT.as_bytes(),
        0o644,
    )?;
    host.systemd.enable(NFT_FLUSH_UNIT).await?;
    host.systemd.start(NFT_FLUSH_UNIT).await?;
    Ok(())
}

/// `disable-docker`: stop (failure ignored) `docker.socket` and `docker.service`, then mask
/// both in one call (one reload; failure fatal), then make sure Docker's daemon config has
/// `"iptables": false`.
pub async fn disable_docker(host: &Host) -> anyhow::Result<()> {
    const UNITS: [&str; 2] = ["docker.socket", "docker.service"];
    for unit in UNITS {
        if let Err(e) = host.systemd.stop(unit).await {
            tracing::debug!(unit, error = %e, "stop failed (ignored)");
        }
    }
    host.systemd.mask(&UNITS).await?;
    let path = Path::new(DOCKER_DAEMON_JSON);
    let mut obj = match host.fs.read(path)? {
        None => serde_json::Map::new(),
        Some(b) if b.iter().all(u8::is_ascii_whitespace) => serde_json::Map::new(),
        Some(b) => match serde_json::from_slice::<serde_json::Value>(&b) {
            Ok(serde_json::Value::Object(m)) => m,
            Ok(_) => anyhow::bail!("{DOCKER_DAEMON_JSON} is not a JSON object"),
            Err(e) => anyhow::bail!("parse {DOCKER_DAEMON_JSON}: {e}"),
        },
    };
    if obj.get("iptables") == Some(&serde_json::Value::Bool(false)) {
        return Ok(());
    }
    obj.insert("iptables".into(), serde_json::Value::Bool(false));
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    serde_json::Value::Object(obj).serialize(&mut ser)?;
    buf.push(b'\n');
    host.fs.write_atomic(path, &buf, 0o644)?;
    Ok(())
}

/// Comments out swap entries: `# ` before every non-empty, non-comment line mentioning `swap`.
/// Returns `None` when nothing changes.
pub fn comment_out_swap(fstab: &str) -> Option<String> {
    let mut changed = false;
    let mut out = String::with_capacity(fstab.len() + 16);
    for line in fstab.split_inclusive('\n') {
        let t = line.trim();
        if !t.is_empty() && !t.starts_with('#') && line.contains("swap") {
            out.push_str("# ");
            changed = true;
        }
        out.push_str(line);
    }
    changed.then_some(out)
}

/// `disable-swap`: `swapoff -a` (fatal), then comment out swap lines in `/etc/fstab`, keeping
/// the original as `/etc/fstab.bak` (0644).
pub async fn disable_swap(host: &Host) -> anyhow::Result<()> {
    host.runner.run(&Cmd::new("swapoff").arg("-a")).await?;
    let fstab = Path::new("/etc/fstab");
    let Some(orig) = host.fs.read_to_string(fstab)? else {
        return Ok(());
    };
    if let Some(new) = comment_out_swap(&orig) {
        host.fs
            .write_atomic(Path::new("/etc/fstab.bak"), orig.as_bytes(), 0o644)?;
        let mode = host.fs.mode(fstab).unwrap_or(0o644);
        host.fs.write_atomic(fstab, new.as_bytes(), mode)?;
    }
    Ok(())
}

const APT_UNATTENDED: &str = "Unattended-Upgrade::Package-Blacklist { \"systemd\"; \"systemd-container\"; \"systemd-sysv\"; \"libsystemd0\"; \"libcap2\"; \"libcap2-bin\"; \"libpam-cap\"; };\n";
const APT_NEEDRESTART: &str = "$nrconf{restart} = 'l';\n";

/// `harden-apt`: keep unattended-upgrades and needrestart from restarting systemd-machined
/// (which would kill the machines).
pub async fn harden_apt(host: &Host) -> anyhow::Result<()> {
    host.fs.write_atomic(
        Path::new(APT_UNATTENDED_PATH),
        APT_UNATTENDED.as_bytes(),
        0o644,
    )?;
    host.fs.write_atomic(
        Path::new(APT_NEEDRESTART_PATH),
        APT_NEEDRESTART.as_bytes(),
        0o644,
    )?;
    Ok(())
}
