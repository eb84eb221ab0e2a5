//! `aks-flex-node token acr`: kubelet's image credential provider for Azure Container Registry
//! (the exec plugin of `--image-credential-provider-config`, in the same binary as
//! `token kubelogin`).
//!
//! kubelet writes a `CredentialProviderRequest` (`credentialprovider.kubelet.k8s.io`, `v1` or
//! `v1beta1`) on stdin: `{"apiVersion": …, "kind": "CredentialProviderRequest", "image": …}`.
//! For an image on a registry ACR's exchange serves (`*.azurecr.io`, `*.azurecr.cn`,
//! `*.azurecr.us`, and the `--registry` arguments), the answer on stdout is a
//! `CredentialProviderResponse` in the request's version with the registry's ACR refresh token
//! as the password of ACR's null user ([`ACR_USERNAME`], as `az acr login` does),
//! `cacheKeyType: Registry` and `cacheDuration` the time the refresh token is still reused.
//! For any other image the answer is the same response with no `auth` entry, which kubelet
//! takes as "no credentials" (and `cacheDuration: 0s`).
//!
//! The node's identity comes from the environment kubelet's exec credential uses
//! (`AAD_LOGIN_METHOD`, `crate::goalclient::azure::from_kubelogin_env`); registries listed in
//! `AKS_FLEX_NODE_INSECURE_REGISTRIES` are reached over plain HTTP (tests). Nothing secret is
//! logged or put in an error.

use std::sync::Arc;

use serde::Deserialize;

use flex_oci::{AcrExchange, CredentialError, ImageRef};

/// The credential provider API group.
pub const GROUP: &str = "credentialprovider.kubelet.k8s.io";
/// The request's kind.
pub const REQUEST_KIND: &str = "CredentialProviderRequest";
/// The response's kind.
pub const RESPONSE_KIND: &str = "CredentialProviderResponse";
/// The versions understood.
pub const VERSIONS: [&str; 2] = ["v1", "v1beta1"];
/// ACR's user name for a refresh token.
pub const ACR_USERNAME: &str = "00000000-0000-0000-0000-000000000000";
/// The largest request read from stdin.
pub const REQUEST_LIMIT: usize = 64 << 10;

/// Why `token acr` printed no response.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The request is not JSON of the expected shape.
    #[error("decode the {REQUEST_KIND}: {0}")]
    Decode(String),
    /// Another group, version or kind.
    #[error("unsupported request {0:?} (wanted {REQUEST_KIND} of {GROUP}/v1 or /v1beta1)")]
    Unsupported(String),
    /// The image is not a reference.
    #[error("image {image:?}: {reason}")]
    Image {
        /// The image as given.
        image: String,
        /// Why it does not parse.
        reason: String,
    },
    /// ACR's exchange failed (names the registry; never a token).
    #[error(transparent)]
    Exchange(#[from] CredentialError),
}

#[derive(Deserialize)]
struct Request {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    image: String,
}

/// The request's API version (`credentialprovider.kubelet.k8s.io/v1` or `/v1beta1`) and image.
pub fn decode(bytes: &[u8]) -> Result<(String, String), ProviderError> {
    let r: Request = serde_json::from_slice(bytes)
        .map_err(|e| ProviderError::Decode(format!("line {}, column {}", e.line(), e.column())))?;
    let version_ok = r
        .api_version
        .strip_prefix(GROUP)
        .and_then(|v| v.strip_prefix('/'))
        .is_some_and(|v| VERSIONS.contains(&v));
    if !version_ok || r.kind != REQUEST_KIND {
        return Err(ProviderError::Unsupported(format!(
            "{} {}",
            r.api_version, r.kind
        )));
    }
    if r.image.trim().is_empty() {
        return Err(ProviderError::Decode("image is empty".into()));
    }
    Ok((r.api_version, r.image))
}

/// The response for `api_version`, with `auth` for `registry` when given.
pub fn render(
    api_version: &str,
    auth: Option<(&str, &flex_host::secret::Secret, std::time::Duration)>,
) -> String {
    let (entries, cache) = match auth {
        Some((registry, password, for_how_long)) => (
            serde_json::json!({registry: {"username": ACR_USERNAME, "password": password.expose()}}),
            flex_api::duration::format_go_duration(for_how_long),
        ),
        None => (serde_json::json!({}), "0s".to_string()),
    };
    let v = serde_json::json!({
        "apiVersion": api_version,
        "kind": RESPONSE_KIND,
        "cacheKeyType": "Registry",
        "cacheDuration": cache,
        "auth": entries,
    });
    format!("{v}\n")
}

/// `token acr`: the response to the request `bytes`, from `exchange`.
pub async fn respond(bytes: &[u8], exchange: &Arc<AcrExchange>) -> Result<String, ProviderError> {
    let (api_version, image) = decode(bytes)?;
    let reference = ImageRef::parse(image.trim()).map_err(|e| ProviderError::Image {
        image: image.clone(),
        reason: e.to_string(),
    })?;
    let Some(registry) = flex_oci::auth::registry_key(&reference.registry) else {
        return Ok(render(&api_version, None));
    };
    match exchange.refresh_token(&registry).await? {
        Some((token, reuse)) => Ok(render(&api_version, Some((&registry, &token, reuse)))),
        None => Ok(render(&api_version, None)),
    }
}

#[cfg(test)]
mod tests;
