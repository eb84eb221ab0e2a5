//! The VM's Ignition config: `image/agent-container.bu` (with the agent image filled in) plus
//! the harness's additions — a harness user with the generated SSH key, the hostname, the
//! bootstrap inputs, and `image/label-containerd.bu` when asked — merged by the `ignition`
//! crate, which reports a conflict rather than overwriting.

use std::path::Path;

use flex_ignition::{SpecVersion, merge, parse_butane, to_ignition_json};

use crate::ssh::USER;

/// What the harness adds to the host's provisioning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Additions {
    /// The harness user's public key.
    pub ssh_public_key: String,
    /// The guest's hostname.
    pub hostname: String,
    /// The agent image, pinned by digest.
    pub agent_image: String,
    /// Extra `ctr images pull` flags (`--plain-http` for the local registry).
    pub pull_args: String,
    /// `/etc/aks-flex-node/bootstrap.env`, if the host should bootstrap at first boot.
    pub bootstrap_env: Option<String>,
    /// Merge `image/label-containerd.bu`.
    pub label_containerd: bool,
}

fn yaml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The harness's additions as Butane YAML.
pub fn additions_butane(a: &Additions) -> String {
    let mut s = format!(
        "variant: flatcar\nversion: 1.1.0\npasswd:\n  users:\n    - name: {USER}\n      groups: [sudo]\n      ssh_authorized_keys:\n        - {}\nstorage:\n  files:\n    - path: /etc/hostname\n      mode: 0644\n      overwrite: true\n      contents:\n        inline: {}\n",
        yaml_str(&a.ssh_public_key),
        yaml_str(&format!("{}\n", a.hostname)),
    );
    if let Some(env) = &a.bootstrap_env {
        s.push_str(&format!(
            "    - path: /etc/aks-flex-node/bootstrap.env\n      mode: 0600\n      contents:\n        inline: {}\n",
            yaml_str(env)
        ));
    }
    s
}

/// Fills the placeholders of `image/agent-container.bu`.
pub fn fill_agent_container(template: &str, agent_image: &str, pull_args: &str) -> String {
    template
        .replace("@AKS_FLEX_NODE_IMAGE@", agent_image)
        .replace("@AKS_FLEX_NODE_PULL_ARGS@", pull_args)
}

/// Renders the Ignition JSON for the VM.
pub fn render(repo: &Path, a: &Additions, spec: SpecVersion) -> anyhow::Result<String> {
    let read = |name: &str| -> anyhow::Result<String> {
        let p = repo.join("image").join(name);
        std::fs::read_to_string(&p).map_err(|e| anyhow::anyhow!("read {}: {e}", p.display()))
    };
    let base = parse_butane(
        &fill_agent_container(&read("agent-container.bu")?, &a.agent_image, &a.pull_args),
        None,
    )
    .map_err(|e| anyhow::anyhow!("image/agent-container.bu: {e}"))?;
    let mut config = merge(
        &base,
        &parse_butane(&additions_butane(a), None)
            .map_err(|e| anyhow::anyhow!("harness additions: {e}"))?,
    )?;
    if a.label_containerd {
        let label = parse_butane(&read("label-containerd.bu")?, None)
            .map_err(|e| anyhow::anyhow!("image/label-containerd.bu: {e}"))?;
        config = merge(&config, &label)?;
    }
    Ok(to_ignition_json(&config, spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    fn additions() -> Additions {
        Additions {
            ssh_public_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests harness".into(),
            hostname: "flex-dev-node".into(),
            agent_image: "10.0.2.100:5000/aks-flex/agent@sha256:0123".into(),
            pull_args: "--plain-http".into(),
            bootstrap_env: Some("AKS_FLEX_NODE_NODE_NAME=\"$(touch /tmp/x)\"\n".into()),
            label_containerd: true,
        }
    }

    #[test]
    fn renders_merged_config() {
        let json = render(&repo(), &additions(), SpecVersion::V3_3_0).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["ignition"]["version"], "3.3.0");
        let units: Vec<&str> = v["systemd"]["units"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["name"].as_str().unwrap())
            .collect();
        for u in [
            "usr-local-overlay.service",
            "aks-flex-node-bootstrap.service",
            "aks-flex-node-reset.service",
            "label-containerd.service",
        ] {
            assert!(units.contains(&u), "{u} missing from {units:?}");
        }
        assert!(!json.contains("@AKS_FLEX_NODE_IMAGE@"));
        assert_eq!(v["passwd"]["users"][0]["name"], USER);
    }

    #[test]
    fn without_label_containerd_and_bootstrap() {
        let mut a = additions();
        a.label_containerd = false;
        a.bootstrap_env = None;
        let json = render(&repo(), &a, SpecVersion::V3_4_0).unwrap();
        assert!(!json.contains("label-containerd"));
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let paths: Vec<&str> = v["storage"]["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap())
            .collect();
        assert!(
            !paths.contains(&"/etc/aks-flex-node/bootstrap.env"),
            "{paths:?}"
        );
    }
}
