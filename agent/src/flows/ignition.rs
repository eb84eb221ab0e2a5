//! `aks-flex-node ignition`: a node's Ignition config for the agent's image, from the user's
//! base config (Butane or Ignition) and the bootstrap arguments (`docs/ignition.md`).
//!
//! [`render`] is pure: it checks the bootstrap arguments ([`BootstrapArgs`]: the bootstrap's
//! own `bootstrap.env` parser reads them back), renders and validates the config they give with
//! the bootstrap's own renderer (as `bootstrap-node --dry-run` does; skipped when they name a
//! complete config with `AKS_FLEX_NODE_CONFIG`, a file on the node), then merges the base
//! config, the agent's provisioning and the inputs with `flex_ignition::node`, the function the
//! harness renders its VM's config with. The command writes the result with
//! `flex_host::fs::write_new` (0600, never replacing a file).

use std::path::Path;

use flex_ignition::node::{AgentImage, ArgError, BaseConfigError, BootstrapArgs, NodeError};
use flex_ignition::{SpecVersion, to_ignition_json};

use crate::flows::bootstrap::{Inputs, render::RenderError};
use flex_api::bootstrap_env;

/// The node name the renderer falls back to when the inputs name none: the node's hostname,
/// unknown here. Only used to validate the rest; nothing of it is written.
const PLACEHOLDER_HOSTNAME: &str = "node";

/// What the command was given, read.
#[derive(Debug)]
pub struct Request<'a> {
    /// The base config's text.
    pub base_config: &'a str,
    /// Butane's `--files-dir` for the base config's `local` contents.
    pub files_dir: Option<&'a Path>,
    /// The agent image.
    pub image: AgentImage,
    /// The bootstrap arguments (after `--`).
    pub bootstrap_args: &'a [String],
    /// The Ignition spec version to write.
    pub spec: SpecVersion,
}

/// Why no config was made. No message shows a bootstrap value.
#[derive(Debug, thiserror::Error)]
pub enum IgnitionCmdError {
    /// A bootstrap argument was refused.
    #[error("{0}")]
    Args(ArgError),
    /// The inputs do not render a valid config.
    #[error("the bootstrap arguments do not make a valid config: {0}")]
    Inputs(String),
    /// The base config does not parse.
    #[error("{0}")]
    Base(BaseConfigError),
    /// The base config and the provisioning do not merge, or the image is wrong.
    #[error("{0}")]
    Node(NodeError),
}

/// The node's Ignition JSON for `req`.
pub fn render(req: &Request<'_>) -> Result<String, IgnitionCmdError> {
    let args = BootstrapArgs::parse(req.bootstrap_args).map_err(IgnitionCmdError::Args)?;
    if args.get(bootstrap_env::keys::CONFIG).is_none() {
        validate_inputs(&args)?;
    }
    let base = flex_ignition::node::parse_base_config(req.base_config, req.files_dir)
        .map_err(IgnitionCmdError::Base)?;
    let config = flex_ignition::node::node_config(&base, &req.image, &args)
        .map_err(IgnitionCmdError::Node)?;
    Ok(to_ignition_json(&config, req.spec))
}

/// Renders the config the inputs give with the bootstrap's renderer, which validates it.
fn validate_inputs(args: &BootstrapArgs) -> Result<(), IgnitionCmdError> {
    let entries = bootstrap_env::parse(&args.env_file())
        .map_err(|e| IgnitionCmdError::Inputs(e.to_string()))?;
    let inputs = Inputs::from_sources(None, &entries, Vec::new())
        .map_err(|e| IgnitionCmdError::Inputs(e.to_string()))?;
    crate::flows::bootstrap::render::render(&inputs, &|| Ok(PLACEHOLDER_HOSTNAME.to_string()))
        .map(|_| ())
        .map_err(|e: RenderError| IgnitionCmdError::Inputs(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const TOKEN: &str = "abcdef.0123456789abcdef";
    const CA: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJ4ekNDQVcyZ0F3SUJBZ0lVVXhTQmRqeG8zUm9aQnB2ajkyd0FPdXZSQktFd0NnWUlLb1pJemowRUF3SXcKT0RFMk1EUUdBMVVFQXd3dFlXdHpMV1pzWlhndGJtOWtaU0J2Wm1ac2FXNWxJR2hoY201bGMzTWdRMEVnS0c1dgpJR05zZFhOMFpYSXBNQ0FYRFRJMk1USXdNakUyTWpFd04xb1lEekl4TWpZeE1UQTRNVFl5TVRBM1dqQTRNVFl3Ck5BWURWUVFEREMxaGEzTXRabXhsZUMxdWIyUmxJRzltWm14cGJtVWdhR0Z5Ym1WemN5QkRRU0FvYm04Z1kyeDEKYzNSbGNpa3dXVEFUQmdjcWhrak9QUUlCQmdncWhrak9QUU1CQndOQ0FBVHhQc2pNZWRkT3hZaFVyQmFHckU0SAphL0pNZG5PYzhGb042SUpKTll2UUNxbWNpaU9mZkV6YklmWHAwYjliUnFYUml6Njk4TWttQ2Q2QzdSc0FhbjJjCm8xTXdVVEFkQmdOVkhRNEVGZ1FVSGhLNVM3QlJBcGZHUmVRN1JjU1NqenlZY1RNd0h3WURWUjBqQkJnd0ZvQVUKSGhLNVM3QlJBcGZHUmVRN1JjU1NqenlZY1RNd0R3WURWUjBUQVFIL0JBVXdBd0VCL3pBS0JnZ3Foa2pPUFFRRApBZ05JQURCRkFpRUE2YnZsVm5xODJhYlU5N01mQVJScFJyZHlpa0hNUDVaVFhXWjYvUTFwTVVJQ0lBOU1ic2FXCkg1aGFTYVdzcU5KN05WQzQya21JL0dZYk01RDJwdGYvcnA3cgotLS0tLUVORCBDRVJUSUZJQ0FURS0tLS0tCg==";

    /// Complete bootstrap arguments for a test node.
    pub(crate) fn good_args() -> Vec<String> {
        vec![
            "AKS_FLEX_NODE_CLUSTER_RESOURCE_ID=/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/g/providers/Microsoft.ContainerService/managedClusters/c".into(),
            "AKS_FLEX_NODE_KUBERNETES_VERSION=1.34.0".into(),
            "AKS_FLEX_NODE_API_SERVER=https://10.0.2.2:6443".into(),
            format!("AKS_FLEX_NODE_CA_CERT_DATA={CA}"),
            format!("AKS_FLEX_NODE_BOOTSTRAP_TOKEN={TOKEN}"),
        ]
    }

    fn request<'a>(base: &'a str, args: &'a [String]) -> Request<'a> {
        Request {
            base_config: base,
            files_dir: None,
            image: AgentImage {
                reference: format!("mcr.microsoft.com/aks/flex-node@{DIGEST}"),
                plain_http: false,
                insecure_registries: Vec::new(),
            },
            bootstrap_args: args,
            spec: SpecVersion::V3_3_0,
        }
    }

    const BUTANE: &str = "variant: flatcar\nversion: 1.1.0\n";

    #[test]
    fn renders_with_the_inputs_file_and_its_removal() {
        let args = good_args();
        let json = render(&request(BUTANE, &args)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["ignition"]["version"], "3.3.0");
        assert!(json.contains("/etc/aks-flex-node/bootstrap.env"), "{json}");
        assert!(json.contains("10-remove-bootstrap-env.conf"), "{json}");
    }

    /// Each refused request (bootstrap arguments, inputs the renderer refuses, a base config
    /// that does not parse) and the words its error must contain; no error shows the token.
    #[test]
    fn refused_requests_table() {
        let with = |extra: &[&str]| -> Vec<String> {
            let mut a = good_args();
            a.extend(extra.iter().map(|s| s.to_string()));
            a
        };
        let missing: Vec<String> = good_args()[1..].to_vec();
        let cases: Vec<(&str, Vec<String>, &[&str])> = vec![
            (BUTANE, with(&["--env-file=/x"]), &["--env-file", "itself"]),
            (BUTANE, with(&["--verbose"]), &["unknown flag --verbose"]),
            (
                BUTANE,
                with(&["AKS_FLEX_NODE_NODE_NAME=a\nb"]),
                &["control character", "AKS_FLEX_NODE_NODE_NAME"],
            ),
            (
                BUTANE,
                with(&["AKS_FLEX_NODE_NODE_IP=10.0.0"]),
                &["valid config", "AKS_FLEX_NODE_NODE_IP"],
            ),
            (
                BUTANE,
                missing,
                &["valid config", "AKS_FLEX_NODE_CLUSTER_RESOURCE_ID"],
            ),
            (
                "variant: flatcar\nversion: 1.1.0\nstorage: [",
                good_args(),
                &["Butane base config", "storage"],
            ),
            (
                "variant: 'unterminated\n",
                good_args(),
                &["Butane base config", "invalid YAML"],
            ),
            (
                "{\"ignition\": {\"version\": \"3.4.0\"}, \"storage\": {\"disks\": []}}",
                good_args(),
                &["Ignition base config", "disks"],
            ),
        ];
        for (base, args, words) in cases {
            let msg = match render(&request(base, &args)) {
                Ok(_) => panic!("accepted {args:?} over {base:?}"),
                Err(e) => e.to_string(),
            };
            for w in words {
                assert!(msg.contains(w), "{msg:?} lacks {w:?}");
            }
            assert!(!msg.contains("0123456789abcdef"), "{msg}");
        }
    }

    /// A complete config on the node (`AKS_FLEX_NODE_CONFIG`) is not rendered here.
    #[test]
    fn a_config_file_input_skips_rendering() {
        let args = vec!["AKS_FLEX_NODE_CONFIG=/etc/aks-flex-node/given.json".to_string()];
        render(&request(BUTANE, &args)).unwrap();
    }
}
