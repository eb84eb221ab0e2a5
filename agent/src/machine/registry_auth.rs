//! The agent's registry credentials (`bootstrap.registryAuth`), for its own pulls: the machine
//! rootfs image (`bootstrap.ociImage`), `oci://` offline artifacts, and AgentUpgrade images in
//! the container.
//!
//! [`credential_source`] builds the [`flex_oci::CredentialSource`] the registry client asks after
//! a `401`:
//! 1. the Docker-config-style file `bootstrap.registryAuth.configFile`, read from the host when
//!    the source is built (a file that is missing or does not parse is an error naming the field;
//!    one readable by group or others is a warning, as ssh warns about keys);
//! 2. ACR's token exchange with the node's Azure identity, given by the caller (an
//!    [`AadTokenSource`]: `crate::goalclient::acr::identity` makes it from `azure.servicePrincipal`
//!    or `azure.managedIdentity`; the machinery does not use the clients itself) for
//!    `*.azurecr.io`, `*.azurecr.cn`, `*.azurecr.us` and `bootstrap.registryAuth.acrRegistries`.
//!
//! Neither: `None`, and the client stays anonymous. The file's entries win over the exchange.

use std::path::Path;
use std::sync::Arc;

use flex_host::fs::HostFs;
use flex_host::http::InsecureRegistries;
use flex_oci::{AadTokenSource, AcrExchange, CredentialChain, CredentialSource, DockerConfig};

use crate::config::Config;

/// The config field that names the credentials file.
pub const CONFIG_FILE_FIELD: &str = "bootstrap.registryAuth.configFile";

/// Why the credentials could not be set up. Names the field; never holds a secret.
#[derive(Debug, thiserror::Error)]
pub enum RegistryAuthError {
    /// The credentials file is missing or unreadable.
    #[error("{CONFIG_FILE_FIELD}: {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The credentials file does not parse.
    #[error("{CONFIG_FILE_FIELD}: {cause}")]
    Parse {
        /// What is wrong with it (names the file and the field).
        cause: flex_oci::DockerConfigError,
    },
}

/// The credential source for `config` on the host whose files are `fs`, or `None` when the
/// config gives no credentials file and there is no Azure identity (`aad`). `http` and
/// `insecure` are the registry client's (ACR's exchange goes to the registry itself).
pub fn credential_source(
    config: &Config,
    fs: &HostFs,
    http: &reqwest::Client,
    insecure: &InsecureRegistries,
    aad: Option<Arc<dyn AadTokenSource>>,
) -> Result<Option<Arc<dyn CredentialSource>>, RegistryAuthError> {
    let auth = config.bootstrap.registry_auth.clone().unwrap_or_default();
    let mut sources: Vec<Arc<dyn CredentialSource>> = Vec::new();
    if !auth.config_file.is_empty() {
        let path = Path::new(&auth.config_file);
        let bytes = fs
            .read(path)
            .map_err(|e| RegistryAuthError::File {
                path: auth.config_file.clone(),
                reason: e.to_string(),
            })?
            .ok_or_else(|| RegistryAuthError::File {
                path: auth.config_file.clone(),
                reason: "does not exist".into(),
            })?;
        if fs.mode(path).is_some_and(|m| m & 0o077 != 0) {
            tracing::warn!(
                file = %auth.config_file,
                "the registry credentials file is readable by group or others; chmod 0600 it"
            );
        }
        let file = DockerConfig::parse(&auth.config_file, &bytes)
            .map_err(|cause| RegistryAuthError::Parse { cause })?;
        tracing::info!(
            file = %auth.config_file,
            registries = ?file.registries().collect::<Vec<_>>(),
            "registry credentials"
        );
        sources.push(Arc::new(file));
    }
    if let Some(aad) = aad {
        sources.push(Arc::new(AcrExchange::new(
            http.clone(),
            aad,
            &auth.acr_registries,
            insecure.clone(),
        )));
    }
    Ok(match sources.len() {
        0 => None,
        1 => sources.pop(),
        _ => Some(Arc::new(CredentialChain::new(sources))),
    })
}

/// Why the agent's registry client could not be built: a config field, named.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `bootstrap.insecureRegistries` is wrong.
    #[error(transparent)]
    Insecure(#[from] flex_host::http::InsecureRegistryError),
    /// `bootstrap.registryAuth` is wrong.
    #[error(transparent)]
    Auth(#[from] RegistryAuthError),
}

/// The agent's registry client for `config`: its insecure registries and its credentials
/// ([`credential_source`]).
pub fn registry_client(
    config: &Config,
    fs: &HostFs,
    http: &reqwest::Client,
    aad: Option<Arc<dyn AadTokenSource>>,
) -> Result<flex_oci::RegistryClient, ClientError> {
    let insecure = config.bootstrap.insecure_registries()?;
    let client =
        flex_oci::RegistryClient::new(http.clone()).with_insecure_registries(insecure.clone());
    Ok(match credential_source(config, fs, http, &insecure, aad)? {
        Some(source) => client.with_credentials(source),
        None => client,
    })
}

#[cfg(test)]
mod tests;
