//! `aks-flex-node token kubelogin`: the Kubernetes exec credential plugin that kubelet (in the
//! machine, as `/usr/local/bin/aks-flex-node`) and the daemon run for a service principal or a
//! managed identity (upstream's `token kubelogin`, Azure/kubelogin's `get-token`).
//!
//! The request is `KUBERNETES_EXEC_INFO`: an `ExecCredential` of group
//! `client.authentication.k8s.io`, version `v1` or `v1beta1` (unset or empty: a `v1` one). The
//! token is for the scope `<server-id>/.default`, from the credential the environment selects
//! (`crate::goalclient::azure::from_kubelogin_env`). The answer, on stdout, is the request's
//! `ExecCredential` in its own API version with `status.token` and
//! `status.expirationTimestamp` (RFC 3339, UTC), as JSON indented by 2 spaces.
//!
//! Proof-of-possession tokens (`--pop-enabled`, `--pop-claims`) are refused with an error: they
//! need a signing key kept across calls and a PoP-aware API server, and nothing in this agent
//! asks for them (kubelet's and the daemon's exec configuration never pass the flags).

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::goalclient::azure::{AccessToken, AuthError, AzureCredential, Env};
use flex_host::secret::Secret;

/// The AKS Microsoft Entra ID server application: the default `--server-id`.
pub use crate::machine::nodegoal::AKS_AAD_SERVER_ID as DEFAULT_SERVER_ID;
/// The variable kubelet and client-go pass the request in.
pub const EXEC_INFO_ENV: &str = "KUBERNETES_EXEC_INFO";
/// The exec credential API group.
pub const GROUP: &str = "client.authentication.k8s.io";
/// The exec credential kind.
pub const KIND: &str = "ExecCredential";
/// The versions understood.
pub const VERSIONS: [&str; 2] = ["v1", "v1beta1"];

/// `token kubelogin`'s options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeloginOptions {
    /// The API server's Microsoft Entra ID application id (the token's audience).
    pub server_id: String,
    /// Whether a proof-of-possession token is asked for (refused).
    pub pop_enabled: bool,
    /// Proof-of-possession claims, `k=v,...` (refused).
    pub pop_claims: String,
}

impl Default for KubeloginOptions {
    fn default() -> Self {
        Self {
            server_id: DEFAULT_SERVER_ID.into(),
            pop_enabled: false,
            pop_claims: String::new(),
        }
    }
}

/// Why `token kubelogin` printed no credential.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// `--server-id` is empty.
    #[error("server-id is required")]
    NoServerId,
    /// `--pop-enabled` was given.
    #[error("--pop-enabled: proof-of-possession tokens are not supported by this agent")]
    PopUnsupported,
    /// `--pop-claims` without `--pop-enabled`.
    #[error("--pop-claims needs --pop-enabled")]
    PopClaimsWithoutPop,
    /// `KUBERNETES_EXEC_INFO` is not an object with an API version and kind.
    #[error("decode {EXEC_INFO_ENV}: {0}")]
    ExecInfo(String),
    /// Another group or kind than `ExecCredential.client.authentication.k8s.io`.
    #[error("invalid group/kind: wanted {KIND}.{GROUP}, got {0}")]
    GroupKind(String),
    /// Another version than `v1` or `v1beta1`.
    #[error("unsupported {KIND} version {0:?} (wanted v1 or v1beta1)")]
    Version(String),
    /// The credential gave no token.
    #[error("get a token for {scope}: {cause}")]
    Token {
        /// The scope asked for.
        scope: String,
        /// Why not.
        cause: AuthError,
    },
    /// The answer could not be written as JSON.
    #[error("encode {KIND}: {0}")]
    Encode(String),
}

/// An `ExecCredential`: the request as decoded and, once answered, its status.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExecCredential {
    /// `ExecCredential`.
    pub kind: String,
    /// `client.authentication.k8s.io/v1` or `.../v1beta1`, as requested.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// The request's spec, kept as given (`{"interactive": false}` when there was none).
    pub spec: serde_json::Value,
    /// The answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<ExecCredentialStatus>,
}

/// An `ExecCredential`'s answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExecCredentialStatus {
    /// When the token expires (RFC 3339, UTC), if known.
    #[serde(
        rename = "expirationTimestamp",
        skip_serializing_if = "Option::is_none"
    )]
    pub expiration_timestamp: Option<String>,
    /// The bearer token (`Debug` redacted; written out only by [`ExecCredential::render`]).
    pub token: Secret,
}

impl ExecCredential {
    /// The request in `exec_info` (`KUBERNETES_EXEC_INFO`); empty: a `v1` request.
    pub fn decode(exec_info: &str) -> Result<Self, TokenError> {
        if exec_info.trim().is_empty() {
            return Ok(Self {
                kind: KIND.into(),
                api_version: format!("{GROUP}/v1"),
                spec: serde_json::json!({ "interactive": false }),
                status: None,
            });
        }
        let v: serde_json::Value =
            serde_json::from_str(exec_info).map_err(|e| TokenError::ExecInfo(e.to_string()))?;
        let Some(obj) = v.as_object() else {
            return Err(TokenError::ExecInfo("not a JSON object".into()));
        };
        let text = |k: &str| obj.get(k).and_then(|x| x.as_str()).unwrap_or_default();
        let (api_version, kind) = (text("apiVersion"), text("kind"));
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        if group != GROUP || kind != KIND {
            // As Kubernetes writes a group and kind: `Kind.group`, or `Kind` without a group.
            let got = if group.is_empty() {
                kind.to_string()
            } else {
                format!("{kind}.{group}")
            };
            return Err(TokenError::GroupKind(got));
        }
        if !VERSIONS.contains(&version) {
            return Err(TokenError::Version(version.into()));
        }
        Ok(Self {
            kind: KIND.into(),
            api_version: api_version.into(),
            spec: obj
                .get("spec")
                .filter(|s| s.is_object())
                .cloned()
                .unwrap_or_else(|| serde_json::json!({ "interactive": false })),
            status: None,
        })
    }

    /// The request answered with `token`.
    pub fn answered(mut self, token: &AccessToken) -> Self {
        self.status = Some(ExecCredentialStatus {
            expiration_timestamp: token.expires_at.map(rfc3339),
            token: token.token.clone(),
        });
        self
    }

    /// JSON indented by 2 spaces, with a final newline. Holds the token: stdout only.
    pub fn render(&self) -> Result<String, TokenError> {
        serde_json::to_string_pretty(self)
            .map(|s| s + "\n")
            .map_err(|e| TokenError::Encode(e.to_string()))
    }
}

/// `t` as RFC 3339 in UTC, to the second (as Kubernetes writes times).
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .unwrap_or(k8s_openapi::jiff::Timestamp::MAX)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The options' own checks: a server id, no proof-of-possession.
pub fn check_options(options: &KubeloginOptions) -> Result<(), TokenError> {
    if options.server_id.trim().is_empty() {
        return Err(TokenError::NoServerId);
    }
    if options.pop_enabled {
        return Err(TokenError::PopUnsupported);
    }
    if !options.pop_claims.trim().is_empty() {
        return Err(TokenError::PopClaimsWithoutPop);
    }
    Ok(())
}

/// The scope asked for: `<server-id>/.default`.
pub fn scope(options: &KubeloginOptions) -> String {
    format!(
        "{}/.default",
        options.server_id.trim().trim_end_matches('/')
    )
}

/// `token kubelogin`: checks the options, decodes the request from `env`'s
/// `KUBERNETES_EXEC_INFO`, asks `credential` for a token and returns the answer to print.
pub async fn kubelogin(
    options: &KubeloginOptions,
    env: &Env,
    credential: &dyn AzureCredential,
) -> Result<String, TokenError> {
    check_options(options)?;
    let request = ExecCredential::decode(env.get(EXEC_INFO_ENV).map_or("", String::as_str))?;
    let scope = scope(options);
    let token = credential
        .token(&scope)
        .await
        .map_err(|cause| TokenError::Token {
            scope: scope.clone(),
            cause,
        })?;
    request.answered(&token).render()
}

#[cfg(test)]
mod tests;
