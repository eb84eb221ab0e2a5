//! A node's Ignition config for the agent's image (`aks-flex-node ignition`, and the harness's
//! VM config, which goes through the same function so the two cannot drift): the user's base
//! config, Butane or Ignition ([`parse_base_config`]), merged with the agent's provisioning
//! (`image/agent-container.bu`, [`AGENT_CONTAINER_BU`], with the agent image filled in) and
//! the bootstrap inputs ([`BootstrapArgs`], written to [`ENV_FILE`], mode 0600).
//!
//! The bootstrap inputs carry the bootstrap token. A drop-in of the first-boot unit
//! ([`BOOTSTRAP_UNIT`], [`REMOVE_ENV_DROPIN`]) removes the file once the bootstrap succeeded
//! with it (`ExecStartPost=` runs only after `ExecStart=` exited 0; a failed or interrupted
//! bootstrap keeps the file for the next try).
//!
//! A conflict between the base config and the provisioning (the base writing the same file or
//! unit differently) is an error naming the entry; nothing is overwritten.

use std::path::Path;

pub use flex_api::bootstrap_env::args::{ArgError, BootstrapArgs, ENV_FILE};
use flex_api::image::ImageRef;

use crate::butane::{ButaneError, parse_butane};
use crate::config::{Config, ConfigError, MergeError, merge};
use crate::ignition_json::{IgnitionError, parse_ignition};
use crate::model::{Dropin, File};

/// The agent's ACL provisioning, `image/agent-container.bu` (generated from the agent's own
/// units by `cargo xtask codegen`; a test in the agent keeps it current).
pub const AGENT_CONTAINER_BU: &str = include_str!("../../image/agent-container.bu");

/// The first-boot unit, which runs the bootstrap from [`ENV_FILE`].
pub const BOOTSTRAP_UNIT: &str = "aks-flex-node-bootstrap.service";

/// The drop-in of [`BOOTSTRAP_UNIT`] that removes [`ENV_FILE`] after a successful bootstrap.
pub const REMOVE_ENV_DROPIN: &str = "10-remove-bootstrap-env.conf";

/// The contents of [`REMOVE_ENV_DROPIN`].
pub fn remove_env_dropin() -> String {
    format!(
        "# {ENV_FILE} carries the bootstrap token: once the bootstrap succeeded with it, it goes.\n\
         # ExecStartPost= runs only after ExecStart= exited 0, so a failed bootstrap keeps it.\n\
         [Service]\n\
         ExecStartPost=/bin/rm -f {ENV_FILE}\n"
    )
}

/// The agent image a node runs, and how it is pulled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentImage {
    /// The image reference, pinned by digest.
    pub reference: String,
    /// Pull it over plain HTTP (`ctr images pull --plain-http`).
    pub plain_http: bool,
    /// The registries (`host[:port]`) the agent itself may pull from over plain HTTP
    /// (`AKS_FLEX_NODE_INSECURE_REGISTRIES` in the container settings).
    pub insecure_registries: Vec<String>,
}

/// Why a base config was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BaseConfigError {
    /// A Butane base config (anything not starting with `{`).
    #[error("Butane base config: {0}")]
    Butane(ButaneError),
    /// An Ignition base config (a JSON object).
    #[error("Ignition base config: {0}")]
    Ignition(IgnitionError),
}

/// Why a node config could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The agent image is not a reference pinned by digest.
    #[error("agent image: {cause}")]
    Image {
        /// What is wrong.
        cause: String,
    },
    /// An insecure registry is not `host[:port]`.
    #[error("insecure registry {entry:?}: not host[:port]")]
    InsecureRegistry {
        /// The entry.
        entry: String,
    },
    /// The provisioning does not parse (a bug: a test parses it).
    #[error("image/agent-container.bu: {cause}")]
    Provisioning {
        /// The parser's error.
        cause: ButaneError,
    },
    /// The bootstrap file or drop-in could not be added (a bug: tests add them).
    #[error("the bootstrap inputs: {cause}")]
    Bootstrap {
        /// The builder's error.
        cause: Box<ConfigError>,
    },
    /// The base config and the agent's provisioning define the same entry differently.
    #[error("the base config and the agent's provisioning: {cause}")]
    Conflict {
        /// The entry and how it differs.
        cause: Box<MergeError>,
    },
}

/// Reads a base config: Ignition JSON when the text starts with `{` (after blanks), Butane
/// otherwise. `files_dir` is Butane's `--files-dir` for `local` contents.
pub fn parse_base_config(text: &str, files_dir: Option<&Path>) -> Result<Config, BaseConfigError> {
    if text.trim_start().starts_with('{') {
        parse_ignition(text).map_err(BaseConfigError::Ignition)
    } else {
        parse_butane(text, files_dir).map_err(BaseConfigError::Butane)
    }
}

fn valid_registry(entry: &str) -> bool {
    !entry.is_empty()
        && entry
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
}

/// The agent's provisioning with `image` filled in.
pub fn agent_provisioning(image: &AgentImage) -> Result<Config, NodeError> {
    let reference = ImageRef::parse(&image.reference).map_err(|e| NodeError::Image {
        cause: e.to_string(),
    })?;
    if reference.digest.is_none() {
        return Err(NodeError::Image {
            cause: format!("{} is not pinned by digest (@sha256:…)", image.reference),
        });
    }
    if let Some(bad) = image
        .insecure_registries
        .iter()
        .find(|r| !valid_registry(r))
    {
        return Err(NodeError::InsecureRegistry { entry: bad.clone() });
    }
    let text = AGENT_CONTAINER_BU
        .replace("@AKS_FLEX_NODE_IMAGE@", &image.reference)
        .replace(
            "@AKS_FLEX_NODE_PULL_ARGS@",
            if image.plain_http { "--plain-http" } else { "" },
        )
        .replace(
            "@AKS_FLEX_NODE_INSECURE_REGISTRIES@",
            &image.insecure_registries.join(","),
        );
    parse_butane(&text, None).map_err(|cause| NodeError::Provisioning { cause })
}

/// The node's config: `base`, then the agent's provisioning for `image`, then (unless
/// `bootstrap` is empty) [`ENV_FILE`] (0600) with the bootstrap inputs and the drop-in that
/// removes it after a successful bootstrap.
pub fn node_config(
    base: &Config,
    image: &AgentImage,
    bootstrap: &BootstrapArgs,
) -> Result<Config, NodeError> {
    let mut provisioning = agent_provisioning(image)?;
    if !bootstrap.is_empty() {
        provisioning
            .add_file(
                File::new(ENV_FILE)
                    .with_mode(0o600)
                    .with_data(bootstrap.env_file()),
            )
            .and_then(|c| {
                c.add_dropin(
                    BOOTSTRAP_UNIT,
                    Dropin::new(REMOVE_ENV_DROPIN, remove_env_dropin()),
                )
            })
            .map_err(|cause| NodeError::Bootstrap {
                cause: Box::new(cause),
            })?;
    }
    merge(base, &provisioning).map_err(|cause| NodeError::Conflict {
        cause: Box::new(cause),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SpecVersion, to_ignition_json};

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn image() -> AgentImage {
        AgentImage {
            reference: format!("10.0.2.100:5000/aks-flex/agent@{DIGEST}"),
            plain_http: true,
            insecure_registries: vec!["10.0.2.100:5000".into()],
        }
    }

    fn args() -> BootstrapArgs {
        BootstrapArgs::parse([
            "AKS_FLEX_NODE_BOOTSTRAP_TOKEN=abcdef.0123456789abcdef",
            "AKS_FLEX_NODE_LOCATION=$(touch /tmp/x)",
        ])
        .unwrap()
    }

    fn base() -> Config {
        parse_base_config(
            "variant: flatcar\nversion: 1.1.0\nstorage:\n  files:\n    - path: /etc/hostname\n      mode: 0644\n      overwrite: true\n      contents:\n        inline: node1\n",
            None,
        )
        .unwrap()
    }

    /// The merged config has the base's entries, the provisioning's units with the image
    /// filled in, the bootstrap inputs in a 0600 file that reads back through the bootstrap's
    /// parser, and the drop-in that removes that file after a successful bootstrap.
    #[test]
    fn merges_base_provisioning_and_bootstrap_inputs() {
        let c = node_config(&base(), &image(), &args()).unwrap();
        assert!(c.file("/etc/hostname").is_some());
        let sysconfig = c.file("/etc/sysconfig/aks-flex-node-container").unwrap();
        let Some(crate::Contents::Data { data, .. }) = &sysconfig.contents else {
            panic!("{sysconfig:?}")
        };
        let text = String::from_utf8(data.clone()).unwrap();
        assert!(
            text.contains(&format!(
                "AKS_FLEX_NODE_IMAGE=10.0.2.100:5000/aks-flex/agent@{DIGEST}\n"
            )),
            "{text}"
        );
        assert!(
            text.contains("AKS_FLEX_NODE_PULL_ARGS=--plain-http\n"),
            "{text}"
        );
        assert!(
            text.contains("AKS_FLEX_NODE_INSECURE_REGISTRIES=10.0.2.100:5000\n"),
            "{text}"
        );
        let env = c.file(ENV_FILE).unwrap();
        assert_eq!(env.mode, Some(0o600));
        let Some(crate::Contents::Data { data, .. }) = &env.contents else {
            panic!("{env:?}")
        };
        let read = flex_api::bootstrap_env::parse(std::str::from_utf8(data).unwrap()).unwrap();
        assert_eq!(read[1].value, "$(touch /tmp/x)");
        let unit = c.unit(BOOTSTRAP_UNIT).unwrap();
        assert!(
            unit.contents
                .as_deref()
                .unwrap()
                .contains("ConditionPathExists=/etc/aks-flex-node/bootstrap.env")
        );
        let dropin = unit
            .dropins
            .iter()
            .find(|d| d.name == REMOVE_ENV_DROPIN)
            .unwrap();
        assert_eq!(
            dropin
                .contents
                .as_deref()
                .unwrap()
                .lines()
                .filter(|l| l.starts_with("Exec"))
                .collect::<Vec<_>>(),
            ["ExecStartPost=/bin/rm -f /etc/aks-flex-node/bootstrap.env"]
        );
    }

    /// Without bootstrap inputs there is neither the file nor the drop-in.
    #[test]
    fn without_bootstrap_inputs_no_file_and_no_dropin() {
        let c = node_config(&base(), &image(), &BootstrapArgs::default()).unwrap();
        assert!(c.file(ENV_FILE).is_none());
        assert!(c.unit(BOOTSTRAP_UNIT).unwrap().dropins.is_empty());
    }

    /// Each refused input and the words its error must contain.
    #[test]
    fn refused_inputs_table() {
        let tagged = AgentImage {
            reference: "mcr.microsoft.com/aks/agent:v1".into(),
            ..image()
        };
        let spaced = AgentImage {
            reference: "a b".into(),
            ..image()
        };
        let registry = AgentImage {
            insecure_registries: vec!["http://r:5000".into()],
            ..image()
        };
        let clash = parse_base_config(
            "{\"ignition\":{\"version\":\"3.4.0\"},\"storage\":{\"files\":[{\"path\":\"/etc/aks-flex-node/bootstrap.env\",\"contents\":{\"source\":\"data:,x\"}}]}}",
            None,
        )
        .unwrap();
        let unit_clash = parse_base_config(
            "variant: flatcar\nversion: 1.1.0\nsystemd:\n  units:\n    - name: aks-flex-node-bootstrap.service\n      contents: \"[Service]\\nExecStart=/bin/false\\n\"\n",
            None,
        )
        .unwrap();
        let cases: Vec<(Config, AgentImage, &[&str])> = vec![
            (base(), tagged, &["agent image", "not pinned by digest"]),
            (base(), spaced, &["agent image", "whitespace"]),
            (base(), registry, &["insecure registry", "http://r:5000"]),
            (
                clash,
                image(),
                &[
                    "base config and the agent's provisioning",
                    "file /etc/aks-flex-node/bootstrap.env",
                ],
            ),
            (
                unit_clash,
                image(),
                &["unit aks-flex-node-bootstrap.service", "contents"],
            ),
        ];
        for (base, image, words) in cases {
            let msg = match node_config(&base, &image, &args()) {
                Ok(_) => panic!("accepted {image:?}"),
                Err(e) => e.to_string(),
            };
            for w in words {
                assert!(msg.contains(w), "{msg:?} lacks {w:?}");
            }
            assert!(!msg.contains("0123456789abcdef."), "{msg}");
        }
    }

    #[test]
    fn base_config_kind_is_chosen_by_its_first_character() {
        let e = parse_base_config("  {\"ignition\": 1}", None).unwrap_err();
        assert!(e.to_string().starts_with("Ignition base config: "), "{e}");
        let e = parse_base_config("variant: fcos\nversion: 1.0.0\n", None).unwrap_err();
        assert!(e.to_string().starts_with("Butane base config: "), "{e}");
        let e = parse_base_config("variant: 'unterminated\n", None).unwrap_err();
        assert!(e.to_string().contains("invalid YAML"), "{e}");
    }

    /// The committed provisioning parses with every placeholder filled.
    #[test]
    fn every_placeholder_is_filled() {
        let c = agent_provisioning(&image()).unwrap();
        let json = to_ignition_json(&c, SpecVersion::V3_4_0);
        assert!(
            !json.contains("%40AKS_FLEX_NODE") && !json.contains("@AKS_FLEX_NODE"),
            "{json}"
        );
        assert!(
            !AGENT_CONTAINER_BU
                .replace("@AKS_FLEX_NODE_IMAGE@", "")
                .replace("@AKS_FLEX_NODE_PULL_ARGS@", "")
                .replace("@AKS_FLEX_NODE_INSECURE_REGISTRIES@", "")
                .contains("@AKS_FLEX_NODE_")
        );
    }
}
