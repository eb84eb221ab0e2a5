//! Host mode (`up --mode host`): the agent runs on the dev host as upstream runs it on Ubuntu,
//! not in its container. `scripts/bootstrap.sh` installs it at the first boot from a release
//! archive it downloads and checks against its sha256, `bootstrap-node` installs the daemon as
//! the host unit (`aks-flex-node-agent.service` running the `current` slot) and the binaries sit
//! in the blue/green slots (docs/upgrade.md, docs/host-mode.md).
//!
//! The harness serves every file the guest downloads from the registry `up` already runs: each
//! is pushed as a blob of [`RELEASE_REPO`], and a registry serves a blob by its digest at
//! `/v2/<repository>/blobs/sha256:<hex>` over plain HTTP, so a blob's URL and its sha256 come
//! together ([`blob_url`]). No second server runs, and `down` stops this one with the registry.
//!
//! The files ([`Served`]): the release archive `bootstrap.sh` installs, and for the `upgrade`
//! group the install's binary itself, a good candidate (that binary with a marker appended
//! after its ELF contents, so its sha256 differs and it runs the same) and a broken candidate
//! (a release archive whose `aks-flex-node` answers `version` and exits 1 as a daemon, so it
//! passes the agent's check before the switch and fails only after it: recovery must roll it
//! back).

use std::path::Path;

use bytes::Bytes;
use flex_oci::{ImageRef, RegistryClient};
use sha2::Digest;

/// How the agent runs in the VM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentMode {
    /// In its container, from its image (the ACL way; what `up` did before host mode).
    #[default]
    Image,
    /// On the host, installed by `scripts/bootstrap.sh`, in the blue/green slots.
    Host,
}

impl AgentMode {
    /// `image` or `host`.
    pub fn name(self) -> &'static str {
        match self {
            AgentMode::Image => "image",
            AgentMode::Host => "host",
        }
    }

    /// Parses `image` or `host`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "image" => Some(AgentMode::Image),
            "host" => Some(AgentMode::Host),
            _ => None,
        }
    }
}

/// The repository of the registry whose blobs the guest downloads.
pub const RELEASE_REPO: &str = "aks-flex/agent-release";
/// Where the Ignition config puts `scripts/bootstrap.sh` in the guest.
pub const BOOTSTRAP_SH: &str = "/opt/aks-flex-node/bootstrap.sh";
/// The host bootstrap unit (the same name as the container variant's, so the harness waits
/// for and restarts either the same way).
pub const BOOTSTRAP_UNIT: &str = "aks-flex-node-bootstrap.service";
/// The agent as an operator runs it on the host (a link through the `current` slot).
pub const AGENT: &str = "/usr/local/bin/aks-flex-node";
/// The slots' directory.
pub const LIB_DIR: &str = "/usr/local/lib/aks-flex-node";
/// The marker the good candidate carries after its ELF contents.
pub const GOOD_MARKER: &[u8] = b"\naks-flex-node harness: good upgrade candidate (host mode)\n";

/// A file the guest downloads: its URL as the guest reaches it and its sha256 (hex).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Artifact {
    /// `http://10.0.2.2:<port>/v2/<RELEASE_REPO>/blobs/sha256:<hex>`.
    pub url: String,
    /// 64 hex digits.
    pub sha256: String,
}

/// What `up --mode host` serves, recorded in the VM's state.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Served {
    /// The release archive `bootstrap.sh` downloads (`aks-flex-node` in a `.tar.gz`).
    pub release: Artifact,
    /// The install's binary itself (ELF): the upgrade group goes back to it.
    pub install: Artifact,
    /// The good candidate (ELF): the install's binary with [`GOOD_MARKER`] appended.
    pub good: Artifact,
    /// The broken candidate (`.tar.gz`): its daemon exits 1 at once.
    pub broken: Artifact,
}

/// The sha256 of `data` in hex.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(data))
}

/// The URL of the blob `sha256` (hex) of [`RELEASE_REPO`] on the registry the guest reaches at
/// `guest_registry` (`10.0.2.2:<port>`).
pub fn blob_url(guest_registry: &str, sha256: &str) -> String {
    format!("http://{guest_registry}/v2/{RELEASE_REPO}/blobs/sha256:{sha256}")
}

/// A release archive (gzip tar, as upstream's `aks-flex-node-linux-<arch>.tar.gz`) holding
/// `binary` as `aks-flex-node` (0755); the same bytes give the same archive.
pub fn release_archive(binary: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut l = flex_image::Layer::new();
    l.file("aks-flex-node", 0o755, binary.to_vec())?;
    Ok(l.build(0, 6)?.data)
}

/// The broken candidate's `aks-flex-node`: a script that answers `version` as the agent does
/// (so it passes the candidate check before the switch) and exits 1 for anything else (so its
/// daemon fails at once and recovery must roll it back).
pub fn broken_agent_script() -> String {
    "#!/bin/sh\n# aks-flex-node harness: broken upgrade candidate (host mode)\n\
     if [ \"$1\" = version ]; then echo 'Version: harness-broken-candidate'; exit 0; fi\n\
     echo 'harness broken candidate: exiting 1' >&2\nexit 1\n"
        .to_string()
}

/// The good candidate: `binary` with [`GOOD_MARKER`] appended (bytes past the ELF's segments
/// are never loaded, so it runs as `binary` does).
pub fn good_candidate(binary: &[u8]) -> Vec<u8> {
    let mut b = binary.to_vec();
    b.extend_from_slice(GOOD_MARKER);
    b
}

/// The install inputs of `bootstrap.sh` for `release`, appended to bootstrap.env (the agent
/// accepts them in the file and ignores them).
pub fn install_env(release: &Artifact) -> String {
    format!(
        "AKS_FLEX_NODE_DOWNLOAD_URL={}\nAKS_FLEX_NODE_SHA256={}\n",
        release.url, release.sha256
    )
}

/// The host bootstrap unit: `bootstrap.sh` on bootstrap.env, as an operator runs it. It
/// downloads the agent when none is installed (the first boot) and uses the installed one
/// otherwise (`--use-installed-agent`: a later boot, or a bootstrap after `reset`, which keeps
/// the slots), so a rerun never replaces an upgraded agent with the release; `bootstrap-node`
/// itself does nothing on a bootstrapped host. Once the bootstrap succeeded it removes
/// bootstrap.env, which carries the token, as the container's first-boot unit does (the unit's
/// condition then keeps it from running on later boots; the agent's own unit starts the agent).
pub fn bootstrap_unit() -> String {
    format!(
        "[Unit]\n\
         Description=AKS Flex Node bootstrap (host: scripts/bootstrap.sh)\n\
         After=network-online.target\n\
         Wants=network-online.target\n\
         ConditionPathExists=/etc/aks-flex-node/bootstrap.env\n\
         \n\
         [Service]\n\
         Type=oneshot\n\
         ExecStart=/bin/bash -c 'if [ -x {AGENT} ]; then exec /bin/bash {BOOTSTRAP_SH} --use-installed-agent --env-file /etc/aks-flex-node/bootstrap.env; else exec /bin/bash {BOOTSTRAP_SH} --env-file /etc/aks-flex-node/bootstrap.env; fi'\n\
         ExecStartPost=/bin/rm -f /etc/aks-flex-node/bootstrap.env\n\
         RemainAfterExit=yes\n\
         TimeoutStartSec=1800\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n"
    )
}

fn yaml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The host mode's provisioning (Butane): `bootstrap.sh` (the repository's `bootstrap_sh`) at
/// [`BOOTSTRAP_SH`] and the bootstrap unit, enabled. No container settings and no container
/// units: `bootstrap-node` installs the agent's host units.
pub fn butane(bootstrap_sh: &str) -> String {
    format!(
        "variant: flatcar\nversion: 1.1.0\nstorage:\n  directories:\n    - path: /etc/aks-flex-node\n      mode: 0750\n  files:\n    - path: {BOOTSTRAP_SH}\n      mode: 0755\n      contents:\n        inline: {}\nsystemd:\n  units:\n    - name: {BOOTSTRAP_UNIT}\n      enabled: true\n      contents: {}\n",
        yaml_str(bootstrap_sh),
        yaml_str(&bootstrap_unit()),
    )
}

/// Pushes `data` as a blob of [`RELEASE_REPO`] to the registry at `host_addr`; returns how the
/// guest downloads it (the registry at `guest_registry`).
pub async fn push(
    client: &RegistryClient,
    host_addr: &str,
    guest_registry: &str,
    data: Vec<u8>,
) -> anyhow::Result<Artifact> {
    let image = ImageRef::parse(&format!("{host_addr}/{RELEASE_REPO}:files"))?;
    let sha = sha256_hex(&data);
    let desc = client
        .push_blob(&image, "application/octet-stream", Bytes::from(data))
        .await?;
    if desc.digest.as_str() != format!("sha256:{sha}") {
        anyhow::bail!(
            "the registry recorded {} for a blob whose sha256 is {sha}",
            desc.digest
        );
    }
    Ok(Artifact {
        url: blob_url(guest_registry, &sha),
        sha256: sha,
    })
}

/// Makes and pushes everything host mode serves, from the agent's release `binary`.
pub async fn push_all(
    client: &RegistryClient,
    host_addr: &str,
    guest_registry: &str,
    binary: &Path,
) -> anyhow::Result<Served> {
    let bin = std::fs::read(binary)
        .map_err(|e| anyhow::anyhow!("read the agent binary {}: {e}", binary.display()))?;
    let release = release_archive(&bin)?;
    let broken = release_archive(broken_agent_script().as_bytes())?;
    let good = good_candidate(&bin);
    Ok(Served {
        release: push(client, host_addr, guest_registry, release).await?,
        good: push(client, host_addr, guest_registry, good).await?,
        broken: push(client, host_addr, guest_registry, broken).await?,
        install: push(client, host_addr, guest_registry, bin).await?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real: the agent's own artifact reader (`open_agent_binary`, what AgentUpgrade and, for
    /// the name, `bootstrap.sh` read) on the archives made here. Nothing is faked.
    #[test]
    fn the_agent_reads_the_archives_and_the_good_candidate() {
        let d = tempfile::tempdir().unwrap();
        let elf = b"\x7fELF-pretend-agent".to_vec();
        for (name, bytes, want) in [
            ("release", release_archive(&elf).unwrap(), elf.clone()),
            (
                "broken",
                release_archive(broken_agent_script().as_bytes()).unwrap(),
                broken_agent_script().into_bytes(),
            ),
            ("good", good_candidate(&elf), good_candidate(&elf)),
        ] {
            let p = d.path().join(name);
            std::fs::write(&p, &bytes).unwrap();
            let mut r = aks_flex_node::flows::upgrade::flow::open_agent_binary(&p).unwrap();
            let mut got = Vec::new();
            std::io::Read::read_to_end(&mut r, &mut got).unwrap();
            assert_eq!(got, want, "{name}");
        }
        assert_eq!(
            release_archive(&elf).unwrap(),
            release_archive(&elf).unwrap()
        );
        assert_ne!(sha256_hex(&good_candidate(&elf)), sha256_hex(&elf));
        assert!(good_candidate(&elf).starts_with(b"\x7fELF"));
    }

    /// Real: `sh` running the broken candidate's script (through the runner), and the
    /// agent's own version parser on its answer.
    #[tokio::test]
    async fn the_broken_candidate_answers_version_and_fails_as_a_daemon() {
        use flex_host::runner::{Cmd, ProcessRunner, Runner};
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("aks-flex-node");
        std::fs::write(&p, broken_agent_script()).unwrap();
        let r = ProcessRunner::new();
        let cmd = |arg: &str| Cmd::new("sh").arg(p.display().to_string()).arg(arg);
        let v = r.output(&cmd("version")).await.unwrap();
        assert!(v.success());
        assert_eq!(
            aks_flex_node::flows::upgrade::flow::parse_version(&v.stdout).as_deref(),
            Some("harness-broken-candidate")
        );
        assert_eq!(r.output(&cmd("agent")).await.unwrap().code, Some(1));
    }

    #[test]
    fn urls_units_and_install_inputs() {
        let sha = "ab".repeat(32);
        let url = blob_url("10.0.2.2:5000", &sha);
        assert_eq!(
            url,
            format!("http://10.0.2.2:5000/v2/aks-flex/agent-release/blobs/sha256:{sha}")
        );
        let env = install_env(&Artifact {
            url: url.clone(),
            sha256: sha.clone(),
        });
        let entries = flex_api::bootstrap_env::parse(&env).unwrap();
        assert_eq!(entries[0].value, url);
        assert_eq!(entries[1].value, sha);
        let unit = bootstrap_unit();
        assert!(unit.contains("--use-installed-agent"), "{unit}");
        assert!(unit.contains(&format!("if [ -x {AGENT} ]")), "{unit}");
        // The token file goes once the bootstrap succeeded (ExecStartPost runs only then).
        assert!(
            unit.contains("\nExecStartPost=/bin/rm -f /etc/aks-flex-node/bootstrap.env\n"),
            "{unit}"
        );
        assert_eq!(AgentMode::parse("host"), Some(AgentMode::Host));
        assert_eq!(AgentMode::default(), AgentMode::Image);
        assert_eq!(serde_json::to_string(&AgentMode::Host).unwrap(), "\"host\"");
    }
}
