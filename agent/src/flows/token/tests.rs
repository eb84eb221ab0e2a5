//! `token kubelogin` tests: the ExecCredential request and answer (pure), and the command's
//! logic with a recording stand-in credential (the credentials themselves are tested against a
//! real HTTP server in `goalclient::azure`, and the binary end to end in `agent/tests/cli.rs`).

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;

use super::*;

const TOKEN: &str = "eyJ0eXAiOiJKV1Qi.access.token";

/// A credential that records the scopes asked for and answers with `TOKEN` expiring at
/// 2030-01-01T00:00:00Z, or with `fail`.
#[derive(Default)]
struct Recording {
    scopes: Mutex<Vec<String>>,
    fail: Option<&'static str>,
}

#[async_trait]
impl AzureCredential for Recording {
    async fn token(&self, scope: &str) -> Result<AccessToken, AuthError> {
        self.scopes.lock().unwrap().push(scope.to_string());
        if let Some(why) = self.fail {
            return Err(AuthError::Setting(why.into()));
        }
        Ok(AccessToken {
            token: Secret::new(TOKEN),
            expires_at: Some(UNIX_EPOCH + Duration::from_secs(1_893_456_000)),
        })
    }
}

fn exec_env(info: &str) -> Env {
    Env::from([(EXEC_INFO_ENV.to_string(), info.to_string())])
}

#[test]
fn requests_decode_v1_v1beta1_and_empty() {
    let empty = ExecCredential::decode("").unwrap();
    assert_eq!(empty.api_version, "client.authentication.k8s.io/v1");
    assert_eq!(empty.kind, "ExecCredential");
    assert_eq!(empty.spec, serde_json::json!({"interactive": false}));
    assert_eq!(ExecCredential::decode("  \n").unwrap(), empty);

    let v1 = ExecCredential::decode(
        r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","spec":{"interactive":false,"cluster":{"server":"https://k:6443"}}}"#,
    )
    .unwrap();
    assert_eq!(v1.api_version, "client.authentication.k8s.io/v1");
    assert_eq!(v1.spec["cluster"]["server"], "https://k:6443", "spec kept");

    let beta = ExecCredential::decode(
        r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1beta1","spec":{}}"#,
    )
    .unwrap();
    assert_eq!(beta.api_version, "client.authentication.k8s.io/v1beta1");
    assert_eq!(beta.spec, serde_json::json!({}));
}

#[test]
fn bad_requests_are_refused_as_kubernetes_words_it() {
    for (info, want) in [
        (
            r#"{"kind":"Pod","apiVersion":"v1"}"#,
            "invalid group/kind: wanted ExecCredential.client.authentication.k8s.io, got Pod",
        ),
        (
            r#"{"kind":"ExecCredential","apiVersion":"example.com/v1"}"#,
            "invalid group/kind: wanted ExecCredential.client.authentication.k8s.io, got ExecCredential.example.com",
        ),
        (
            r#"{"kind":"Cluster","apiVersion":"client.authentication.k8s.io/v1"}"#,
            "invalid group/kind: wanted ExecCredential.client.authentication.k8s.io, got Cluster.client.authentication.k8s.io",
        ),
        (
            r#"{"apiVersion":"client.authentication.k8s.io/v1"}"#,
            "invalid group/kind: wanted ExecCredential.client.authentication.k8s.io, got .client.authentication.k8s.io",
        ),
        (
            r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1alpha1"}"#,
            "unsupported ExecCredential version \"v1alpha1\" (wanted v1 or v1beta1)",
        ),
        ("[]", "decode KUBERNETES_EXEC_INFO: not a JSON object"),
        ("{", "decode KUBERNETES_EXEC_INFO: EOF while parsing"),
    ] {
        let e = ExecCredential::decode(info).unwrap_err().to_string();
        assert!(e.starts_with(want), "{info}: {e}");
    }
}

#[test]
fn answers_keep_the_request_and_indent_by_two() {
    let token = AccessToken {
        token: Secret::new(TOKEN),
        expires_at: Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
    };
    let beta = ExecCredential::decode(
        r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1beta1","spec":{"interactive":false}}"#,
    )
    .unwrap()
    .answered(&token);
    assert!(!format!("{beta:?}").contains(TOKEN), "Debug is redacted");
    assert_eq!(
        beta.render().unwrap(),
        format!(
            r#"{{
  "kind": "ExecCredential",
  "apiVersion": "client.authentication.k8s.io/v1beta1",
  "spec": {{
    "interactive": false
  }},
  "status": {{
    "expirationTimestamp": "2023-11-14T22:13:20Z",
    "token": "{TOKEN}"
  }}
}}
"#
        )
    );
    let no_expiry = AccessToken {
        expires_at: None,
        ..token
    };
    let v: serde_json::Value = serde_json::from_str(
        &ExecCredential::decode("")
            .unwrap()
            .answered(&no_expiry)
            .render()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(v["status"], serde_json::json!({ "token": TOKEN }));
}

#[test]
fn times_are_rfc3339_utc_seconds() {
    assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
    assert_eq!(
        rfc3339(UNIX_EPOCH + Duration::from_millis(951_782_400_999)),
        "2000-02-29T00:00:00Z"
    );
}

#[tokio::test]
async fn kubelogin_asks_for_the_server_scope_and_prints_the_credential() {
    let cred = Recording::default();
    let out = kubelogin(&KubeloginOptions::default(), &Env::new(), &cred)
        .await
        .unwrap();
    assert_eq!(
        *cred.scopes.lock().unwrap(),
        ["6dae42f8-4368-4678-94ff-3960e28e3630/.default"]
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["apiVersion"], "client.authentication.k8s.io/v1");
    assert_eq!(v["status"]["token"], TOKEN);
    assert_eq!(v["status"]["expirationTimestamp"], "2030-01-01T00:00:00Z");

    let opts = KubeloginOptions {
        server_id: "api://my-server/".into(),
        ..Default::default()
    };
    let beta = exec_env(
        r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1beta1","spec":{"interactive":false}}"#,
    );
    let out = kubelogin(&opts, &beta, &cred).await.unwrap();
    assert!(out.contains("\"apiVersion\": \"client.authentication.k8s.io/v1beta1\""));
    assert_eq!(cred.scopes.lock().unwrap()[1], "api://my-server/.default");
}

#[tokio::test]
async fn kubelogin_refusals_ask_no_token() {
    let pop = |enabled: bool, claims: &str| KubeloginOptions {
        pop_enabled: enabled,
        pop_claims: claims.into(),
        ..Default::default()
    };
    let cases = [
        (
            KubeloginOptions {
                server_id: " ".into(),
                ..Default::default()
            },
            Env::new(),
            "server-id is required",
        ),
        (
            pop(true, "u=https://k"),
            Env::new(),
            "--pop-enabled: proof-of-possession tokens are not supported",
        ),
        (
            pop(false, "u=https://k"),
            Env::new(),
            "--pop-claims needs --pop-enabled",
        ),
        (
            KubeloginOptions::default(),
            exec_env(r#"{"kind":"Pod","apiVersion":"v1"}"#),
            "invalid group/kind",
        ),
    ];
    for (opts, env, want) in cases {
        let cred = Recording::default();
        let e = kubelogin(&opts, &env, &cred).await.unwrap_err().to_string();
        assert!(e.starts_with(want), "{opts:?}: {e}");
        assert!(cred.scopes.lock().unwrap().is_empty());
    }

    let failing = Recording {
        fail: Some("AAD_LOGIN_METHOD is not set"),
        ..Default::default()
    };
    let e = kubelogin(&KubeloginOptions::default(), &Env::new(), &failing)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "get a token for 6dae42f8-4368-4678-94ff-3960e28e3630/.default: AAD_LOGIN_METHOD is not set"
    );
}
