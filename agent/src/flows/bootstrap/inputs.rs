//! The bootstrap's inputs: one set of `AKS_FLEX_NODE_*` names for `bootstrap.env`, the
//! environment of `scripts/bootstrap.sh` and of the agent, and (for the install inputs) the
//! script's flags. [`INPUTS`] is the list `docs/bootstrap.md` documents; a test keeps the two
//! in step.
//!
//! Sources and precedence: a non-empty value in the process environment wins over the env
//! file; an empty value is the same as an unset one. In the env file every key must be a known
//! input (a typo is an error naming its line); in the environment only known names are read,
//! since the agent's image sets other `AKS_FLEX_NODE_*` variables for itself.

use std::ffi::OsString;
use std::path::PathBuf;

use flex_host::secret::Secret;

use flex_api::bootstrap_env::{self, Entry};

/// What an input is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Chooses a complete config instead of rendering one.
    Config,
    /// Rendered into `config.json`.
    Render,
    /// Read by the bootstrap flow itself (not part of the config).
    Flow,
    /// Read only by `scripts/bootstrap.sh` (download and install of the agent).
    Install,
}

/// One input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputSpec {
    /// The `AKS_FLEX_NODE_*` name.
    pub name: &'static str,
    /// What it is for.
    pub kind: Kind,
    /// Whether the value is a secret (never logged or echoed).
    pub secret: bool,
}

const fn spec(name: &'static str, kind: Kind) -> InputSpec {
    InputSpec {
        name,
        kind,
        secret: false,
    }
}

pub use flex_api::bootstrap_env::keys::*;

/// Every input, in the order `docs/bootstrap.md` lists them.
pub const INPUTS: &[InputSpec] = &[
    spec(CONFIG, Kind::Config),
    spec(CLUSTER_RESOURCE_ID, Kind::Render),
    spec(LOCATION, Kind::Render),
    spec(KUBERNETES_VERSION, Kind::Render),
    spec(API_SERVER, Kind::Render),
    spec(CA_CERT_DATA, Kind::Render),
    InputSpec {
        name: BOOTSTRAP_TOKEN,
        kind: Kind::Render,
        secret: true,
    },
    spec(NODE_NAME, Kind::Render),
    spec(NODE_IP, Kind::Render),
    spec(LABELS, Kind::Render),
    spec(TAINTS, Kind::Render),
    spec(REGISTRY_MIRRORS, Kind::Render),
    spec(DNS_SERVICE_IP, Kind::Render),
    spec(MACHINE_CLIENT_MODE, Kind::Render),
    spec(MACHINE_CLIENT_ENDPOINT_URL, Kind::Render),
    spec(REQUIRE_MACHINE_REGISTRATION, Kind::Render),
    spec(OCI_IMAGE, Kind::Render),
    spec(OFFLINE_ARTIFACTS, Kind::Render),
    spec(INSECURE_REGISTRIES, Kind::Render),
    spec(REGISTRY_AUTH_FILE, Kind::Render),
    spec(LOG_LEVEL, Kind::Render),
    spec(PREFLIGHT_IGNORE, Kind::Flow),
    spec(VERSION, Kind::Install),
    spec(DOWNLOAD_URL, Kind::Install),
    spec(SHA256, Kind::Install),
    spec(INSTALL_DIR, Kind::Install),
    spec(USE_INSTALLED_AGENT, Kind::Install),
];

/// The spec of `name`, when it is an input.
pub fn lookup(name: &str) -> Option<&'static InputSpec> {
    INPUTS.iter().find(|s| s.name == name)
}

/// The inputs the agent reads (the install inputs are the script's). Every value is as given;
/// empty means unset. `Debug` redacts the bootstrap token.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Inputs {
    /// `AKS_FLEX_NODE_CONFIG`: a complete config used as it is.
    pub config: Option<PathBuf>,
    /// `AKS_FLEX_NODE_CLUSTER_RESOURCE_ID`.
    pub cluster_resource_id: String,
    /// `AKS_FLEX_NODE_LOCATION`.
    pub location: String,
    /// `AKS_FLEX_NODE_KUBERNETES_VERSION`.
    pub kubernetes_version: String,
    /// `AKS_FLEX_NODE_API_SERVER`.
    pub api_server: String,
    /// `AKS_FLEX_NODE_CA_CERT_DATA`.
    pub ca_cert_data: String,
    /// `AKS_FLEX_NODE_BOOTSTRAP_TOKEN`.
    pub bootstrap_token: Secret,
    /// `AKS_FLEX_NODE_NODE_NAME`.
    pub node_name: String,
    /// `AKS_FLEX_NODE_NODE_IP`.
    pub node_ip: String,
    /// `AKS_FLEX_NODE_LABELS`.
    pub labels: String,
    /// `AKS_FLEX_NODE_TAINTS`.
    pub taints: String,
    /// `AKS_FLEX_NODE_REGISTRY_MIRRORS`.
    pub registry_mirrors: String,
    /// `AKS_FLEX_NODE_DNS_SERVICE_IP`.
    pub dns_service_ip: String,
    /// `AKS_FLEX_NODE_MACHINE_CLIENT_MODE`.
    pub machine_client_mode: String,
    /// `AKS_FLEX_NODE_MACHINE_CLIENT_ENDPOINT_URL`.
    pub machine_client_endpoint_url: String,
    /// `AKS_FLEX_NODE_REQUIRE_MACHINE_REGISTRATION`.
    pub require_machine_registration: String,
    /// `AKS_FLEX_NODE_OCI_IMAGE`.
    pub oci_image: String,
    /// `AKS_FLEX_NODE_OFFLINE_ARTIFACTS`.
    pub offline_artifacts: String,
    /// `AKS_FLEX_NODE_INSECURE_REGISTRIES`.
    pub insecure_registries: String,
    /// `AKS_FLEX_NODE_REGISTRY_AUTH_FILE`.
    pub registry_auth_file: String,
    /// `AKS_FLEX_NODE_LOG_LEVEL`.
    pub log_level: String,
    /// `AKS_FLEX_NODE_PREFLIGHT_IGNORE`.
    pub preflight_ignore: String,
}

/// Why the inputs could not be read. Messages include their cause, so no variant reports a
/// `source()` too (a chain printer would print the cause twice).
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The env file could not be read.
    #[error("read {path}: {cause}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error (in the message, not a `source()`).
        cause: std::io::Error,
    },
    /// The env file is not valid.
    #[error("{path} {cause}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The line and problem (in the message, not a `source()`).
        cause: bootstrap_env::EnvError,
    },
    /// An environment variable that is an input is not UTF-8.
    #[error("environment variable {0} is not valid UTF-8")]
    NotUtf8(String),
}

impl Inputs {
    /// Sets input `name` (the install inputs are accepted and ignored); `false` when `name` is
    /// not an input.
    pub fn set(&mut self, name: &str, value: &str) -> bool {
        let v = value.to_string();
        match name {
            CONFIG => self.config = (!v.is_empty()).then(|| PathBuf::from(v)),
            CLUSTER_RESOURCE_ID => self.cluster_resource_id = v,
            LOCATION => self.location = v,
            KUBERNETES_VERSION => self.kubernetes_version = v,
            API_SERVER => self.api_server = v,
            CA_CERT_DATA => self.ca_cert_data = v,
            BOOTSTRAP_TOKEN => self.bootstrap_token = Secret::new(v),
            NODE_NAME => self.node_name = v,
            NODE_IP => self.node_ip = v,
            LABELS => self.labels = v,
            TAINTS => self.taints = v,
            REGISTRY_MIRRORS => self.registry_mirrors = v,
            DNS_SERVICE_IP => self.dns_service_ip = v,
            MACHINE_CLIENT_MODE => self.machine_client_mode = v,
            MACHINE_CLIENT_ENDPOINT_URL => self.machine_client_endpoint_url = v,
            REQUIRE_MACHINE_REGISTRATION => self.require_machine_registration = v,
            OCI_IMAGE => self.oci_image = v,
            OFFLINE_ARTIFACTS => self.offline_artifacts = v,
            INSECURE_REGISTRIES => self.insecure_registries = v,
            REGISTRY_AUTH_FILE => self.registry_auth_file = v,
            LOG_LEVEL => self.log_level = v,
            PREFLIGHT_IGNORE => self.preflight_ignore = v,
            n => return lookup(n).is_some_and(|s| s.kind == Kind::Install),
        }
        true
    }

    /// The rendering inputs that have a value, by name (they conflict with
    /// `AKS_FLEX_NODE_CONFIG`).
    pub fn render_inputs_set(&self) -> Vec<&'static str> {
        [
            (CLUSTER_RESOURCE_ID, self.cluster_resource_id.as_str()),
            (LOCATION, &self.location),
            (KUBERNETES_VERSION, &self.kubernetes_version),
            (API_SERVER, &self.api_server),
            (CA_CERT_DATA, &self.ca_cert_data),
            (BOOTSTRAP_TOKEN, self.bootstrap_token.expose()),
            (NODE_NAME, &self.node_name),
            (NODE_IP, &self.node_ip),
            (LABELS, &self.labels),
            (TAINTS, &self.taints),
            (REGISTRY_MIRRORS, &self.registry_mirrors),
            (DNS_SERVICE_IP, &self.dns_service_ip),
            (MACHINE_CLIENT_MODE, &self.machine_client_mode),
            (
                MACHINE_CLIENT_ENDPOINT_URL,
                &self.machine_client_endpoint_url,
            ),
            (
                REQUIRE_MACHINE_REGISTRATION,
                &self.require_machine_registration,
            ),
            (OCI_IMAGE, &self.oci_image),
            (OFFLINE_ARTIFACTS, &self.offline_artifacts),
            (INSECURE_REGISTRIES, &self.insecure_registries),
            (REGISTRY_AUTH_FILE, &self.registry_auth_file),
            (LOG_LEVEL, &self.log_level),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(n, _)| n)
        .collect()
    }

    /// The inputs from the env file's `entries` (already parsed; `path` names the file in
    /// errors) and then the process environment `environ`, whose non-empty values win.
    pub fn from_sources(
        path: Option<&std::path::Path>,
        entries: &[Entry],
        environ: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Result<Self, InputError> {
        let mut inputs = Self::default();
        for e in bootstrap_env::to_map(entries).values() {
            if !inputs.set(&e.key, &e.value) {
                return Err(InputError::Syntax {
                    path: path.map_or_else(|| PathBuf::from("bootstrap.env"), PathBuf::from),
                    cause: bootstrap_env::EnvError {
                        line: e.line,
                        message: format!(
                            "{} is not a bootstrap input (see docs/bootstrap.md)",
                            e.key
                        ),
                    },
                });
            }
        }
        for (k, v) in environ {
            let Some(spec) = k.to_str().and_then(lookup) else {
                continue;
            };
            let v = v
                .into_string()
                .map_err(|_| InputError::NotUtf8(spec.name.to_string()))?;
            if !v.is_empty() {
                inputs.set(spec.name, &v);
            }
        }
        Ok(inputs)
    }

    /// Reads `env_file` (when given) as data with [`bootstrap_env::parse`], then the environment.
    pub fn load(
        env_file: Option<&std::path::Path>,
        environ: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Result<Self, InputError> {
        let entries = match env_file {
            None => Vec::new(),
            Some(p) => {
                use std::io::Read as _;
                let read_err = |cause| InputError::Read {
                    path: p.to_path_buf(),
                    cause,
                };
                // Bounded like the config file: a wrong path must not be read until memory
                // runs out.
                let mut bytes = Vec::new();
                std::fs::File::open(p)
                    .map_err(read_err)?
                    .take(crate::config::MAX_CONFIG_BYTES + 1)
                    .read_to_end(&mut bytes)
                    .map_err(read_err)?;
                if bytes.len() as u64 > crate::config::MAX_CONFIG_BYTES {
                    return Err(read_err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "the file is larger than 1 MiB",
                    )));
                }
                let text = String::from_utf8(bytes).map_err(|_| {
                    read_err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "the file is not valid UTF-8",
                    ))
                })?;
                bootstrap_env::parse(&text).map_err(|cause| InputError::Syntax {
                    path: p.to_path_buf(),
                    cause,
                })?
            }
        };
        Self::from_sources(env_file, &entries, environ)
    }
}

/// A boolean input that is not one (the caller names the input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not true, false, 1 or 0")]
pub struct NotBool(pub String);

/// Parses a boolean input: `true`/`false` (any case), `1`/`0`; empty is `None`.
pub fn parse_bool(value: &str) -> Result<Option<bool>, NotBool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "" => Ok(None),
        "true" | "1" => Ok(Some(true)),
        "false" | "0" => Ok(Some(false)),
        _ => Err(NotBool(value.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    #[test]
    fn every_input_is_settable_and_names_are_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for s in INPUTS {
            assert!(seen.insert(s.name), "duplicate {}", s.name);
            assert!(s.name.starts_with(bootstrap_env::KEY_PREFIX));
            let mut i = Inputs::default();
            assert!(i.set(s.name, "x"), "{}", s.name);
            let rendered = i.render_inputs_set().contains(&s.name);
            assert_eq!(rendered, s.kind == Kind::Render, "{}", s.name);
        }
        assert!(!Inputs::default().set("AKS_FLEX_NODE_NODENAME", "x"));
        assert!(!Inputs::default().set("AKS_FLEX_NODE_CONTAINERIZED", "true"));
    }

    #[test]
    fn environment_wins_unless_empty_and_unknown_env_names_are_ignored() {
        let entries = bootstrap_env::parse(
            "AKS_FLEX_NODE_NODE_NAME=from-file\nAKS_FLEX_NODE_LOCATION=westus2\nAKS_FLEX_NODE_VERSION=v1\n",
        )
        .unwrap();
        let i = Inputs::from_sources(
            None,
            &entries,
            os(&[
                ("AKS_FLEX_NODE_NODE_NAME", "from-env"),
                ("AKS_FLEX_NODE_LOCATION", ""),
                ("AKS_FLEX_NODE_CONTAINERIZED", "true"),
                ("AKS_FLEX_NODE_SYSTEMD_BACKEND", "dbus"),
                ("PATH", "/bin"),
            ]),
        )
        .unwrap();
        assert_eq!(i.node_name, "from-env");
        assert_eq!(i.location, "westus2");
    }

    #[test]
    fn unknown_file_keys_name_the_line() {
        let entries = bootstrap_env::parse("# c\nAKS_FLEX_NODE_NODENAME=x\n").unwrap();
        let e = Inputs::from_sources(
            Some(std::path::Path::new("/etc/aks-flex-node/bootstrap.env")),
            &entries,
            Vec::new(),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/aks-flex-node/bootstrap.env line 2: AKS_FLEX_NODE_NODENAME is not a bootstrap input (see docs/bootstrap.md)"
        );
    }

    #[test]
    fn load_reads_the_file_as_data() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("bootstrap.env");
        let marker = d.path().join("pwned");
        std::fs::write(
            &p,
            format!(
                "AKS_FLEX_NODE_LOCATION=$(touch {m})\nAKS_FLEX_NODE_OCI_IMAGE=\"`touch {m}`\"\nexport AKS_FLEX_NODE_BOOTSTRAP_TOKEN='abcdef.0123456789abcdef'\n",
                m = marker.display()
            ),
        )
        .unwrap();
        let i = Inputs::load(Some(&p), Vec::new()).unwrap();
        assert_eq!(i.location, format!("$(touch {})", marker.display()));
        assert_eq!(i.oci_image, format!("`touch {}`", marker.display()));
        assert_eq!(i.bootstrap_token.expose(), "abcdef.0123456789abcdef");
        assert!(!format!("{i:?}").contains("0123456789abcdef"));
        assert!(!marker.exists());

        std::fs::write(&p, "AKS_FLEX_NODE_LOCATION='unterminated\n").unwrap();
        let e = Inputs::load(Some(&p), Vec::new()).unwrap_err().to_string();
        assert!(
            e.ends_with("bootstrap.env line 1: unterminated single quote"),
            "{e}"
        );
        let e = Inputs::load(Some(&d.path().join("missing.env")), Vec::new())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("read ") && e.contains("missing.env"), "{e}");
    }

    #[test]
    fn docs_table_lists_every_input_in_order_and_the_script_reads_the_install_inputs() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let doc = std::fs::read_to_string(root.join("docs/bootstrap.md")).unwrap();
        let rows: Vec<&str> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("| `AKS_FLEX_NODE_"))
            .filter_map(|l| l.split('`').next())
            .collect();
        let want: Vec<String> = INPUTS
            .iter()
            .map(|s| {
                s.name
                    .trim_start_matches(bootstrap_env::KEY_PREFIX)
                    .to_string()
            })
            .collect();
        assert_eq!(rows, want, "docs/bootstrap.md's inputs table");
        let script = std::fs::read_to_string(root.join("scripts/bootstrap.sh")).unwrap();
        for s in INPUTS.iter().filter(|s| s.kind == Kind::Install) {
            assert!(
                script.contains(s.name),
                "bootstrap.sh does not read {}",
                s.name
            );
        }
    }

    /// The API crate's key lists (which `aks-flex-node ignition` and the harness validate
    /// bootstrap arguments with) are this table's names and install inputs.
    #[test]
    fn api_key_lists_match_the_input_table() {
        let names: Vec<&str> = INPUTS.iter().map(|s| s.name).collect();
        assert_eq!(names, flex_api::bootstrap_env::keys::ALL);
        let install: Vec<&str> = INPUTS
            .iter()
            .filter(|s| s.kind == Kind::Install)
            .map(|s| s.name)
            .collect();
        assert_eq!(install, flex_api::bootstrap_env::keys::INSTALL);
    }

    #[test]
    fn bools() {
        assert_eq!(parse_bool("TRUE"), Ok(Some(true)));
        assert_eq!(parse_bool("0"), Ok(Some(false)));
        assert_eq!(parse_bool(""), Ok(None));
        assert_eq!(parse_bool("yes"), Err(NotBool("yes".into())));
        assert_eq!(
            NotBool("yes".into()).to_string(),
            "\"yes\" is not true, false, 1 or 0"
        );
    }
}
