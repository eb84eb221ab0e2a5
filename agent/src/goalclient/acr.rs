//! The node's Azure identity as Azure Container Registry's token exchange wants it
//! ([`flex_oci::AadTokenSource`]): a Microsoft Entra ID token for the Resource Manager audience
//! of the config's cloud, from `azure.servicePrincipal` or `azure.managedIdentity`
//! ([`super::azure::from_config`]), with the service principal's tenant. The machinery's
//! registry client (`crate::machine::registry_auth`) is given it by the flows.

use std::sync::Arc;

use async_trait::async_trait;
use flex_host::secret::Secret;
use flex_oci::AadTokenSource;

use super::azure::{self, AuthError, AzureCredential, Credential, Env};
use crate::config::Config;

struct NodeIdentity {
    credential: Credential,
    scope: String,
    tenant: Option<String>,
}

#[async_trait]
impl AadTokenSource for NodeIdentity {
    async fn aad_token(&self) -> Result<Secret, flex_oci::auth::AadError> {
        Ok(self.credential.token(&self.scope).await?.token)
    }

    fn tenant(&self) -> Option<String> {
        self.tenant.clone()
    }
}

/// The Entra ID scope asked for ACR: the Resource Manager audience of `endpoint` (the config's,
/// filled at load), the public cloud's when it is blank (a config built in code).
pub fn scope(endpoint: &str) -> String {
    if endpoint.trim().is_empty() {
        format!("{}.default", azure::CLOUDS[0].audience)
    } else {
        super::arm::arm_scope(endpoint)
    }
}

/// The node's identity for ACR's exchange: the config's Azure credential, or the default
/// chain ([`azure::from_config_or_default`]; asked only when an ACR answers `401`).
pub fn identity(config: &Config, env: &Env) -> Result<Option<Arc<dyn AadTokenSource>>, AuthError> {
    let credential = azure::from_config_or_default(config, env)?;
    tracing::debug!(
        credential = credential.kind(),
        "ACR's token exchange uses the node's Azure credential"
    );
    Ok(Some(Arc::new(NodeIdentity {
        credential,
        scope: scope(&config.azure.resource_manager_endpoint),
        tenant: config
            .azure
            .service_principal
            .as_ref()
            .map(|sp| sp.tenant_id.clone())
            .or_else(|| env.get(azure::TENANT_ID_ENV).cloned())
            .filter(|t| !t.trim().is_empty()),
    })))
}

/// The identity kubelet's exec credential environment selects (`AAD_LOGIN_METHOD`,
/// [`azure::from_kubelogin_env`]), made when ACR's exchange first asks for a token: kubelet's
/// image credential provider (`aks-flex-node token acr`) runs with that environment.
struct KubeloginIdentity {
    env: Env,
    scope: String,
}

#[async_trait]
impl AadTokenSource for KubeloginIdentity {
    async fn aad_token(&self) -> Result<Secret, flex_oci::auth::AadError> {
        let credential = azure::from_kubelogin_env(&self.env)?;
        Ok(credential.token(&self.scope).await?.token)
    }

    fn tenant(&self) -> Option<String> {
        self.env
            .get(azure::TENANT_ID_ENV)
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
    }
}

/// [`KubeloginIdentity`] over `env`, for the Resource Manager audience of
/// `resource_manager_endpoint` (empty: the public cloud's).
pub fn kubelogin_identity(env: Env, resource_manager_endpoint: &str) -> Arc<dyn AadTokenSource> {
    Arc::new(KubeloginIdentity {
        env,
        scope: scope(resource_manager_endpoint),
    })
}

/// [`identity`] for the process's environment; a misconfigured credential is a warning and no
/// identity (the config's validation has already checked what it can; a pull from an ACR then
/// fails naming the registry).
pub fn identity_or_warn(config: &Config) -> Option<Arc<dyn AadTokenSource>> {
    match identity(config, &azure::process_env()) {
        Ok(i) => i,
        Err(e) => {
            tracing::warn!(error = %e, "no Azure identity for ACR's token exchange");
            None
        }
    }
}

#[cfg(test)]
mod tests;
