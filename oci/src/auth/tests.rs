//! Credential parsing and lookup, pure: no network. The exchanges and the registry flows are
//! tested against fake servers in `registry/tests.rs` and a real registry in
//! `tests/registry_auth.rs`.

use super::*;

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

const SECRET: &str = "s3cr3t-VALUE";

#[test]
fn registry_keys_drop_scheme_and_path_and_fold_docker_hub() {
    for (entry, want) in [
        ("r.example", Some("r.example")),
        ("R.Example:5000", Some("r.example:5000")),
        ("https://index.docker.io/v1/", Some("docker.io")),
        ("registry-1.docker.io", Some("docker.io")),
        ("docker.io", Some("docker.io")),
        ("http://10.0.2.2:5000/", Some("10.0.2.2:5000")),
        ("myacr.azurecr.io/some/path", Some("myacr.azurecr.io")),
        ("  ", None),
        ("https://", None),
    ] {
        assert_eq!(registry_key(entry).as_deref(), want, "{entry:?}");
    }
}

#[test]
fn docker_config_reads_every_entry_form_in_order_of_preference() {
    let text = serde_json::json!({
        "auths": {
            "https://index.docker.io/v1/": {"auth": b64("hubuser:hub:pass")},
            "r.example:5000": {"username": "u", "password": SECRET},
            "id.example": {"identitytoken": "refresh", "auth": b64("ignored:x")},
            "tok.example": {"registrytoken": "bearer"},
        },
        "HttpHeaders": {"User-Agent": "x"}
    })
    .to_string();
    let c = DockerConfig::parse("creds.json", text.as_bytes()).unwrap();
    assert_eq!(
        c.get("docker.io"),
        Some(&RegistryCredential::Basic {
            username: "hubuser".into(),
            // Only the first ':' splits: a password may hold one.
            password: Secret::new("hub:pass"),
        })
    );
    assert_eq!(
        c.get("R.EXAMPLE:5000"),
        Some(&RegistryCredential::Basic {
            username: "u".into(),
            password: Secret::new(SECRET),
        })
    );
    assert_eq!(
        c.get("id.example"),
        Some(&RegistryCredential::RefreshToken(Secret::new("refresh")))
    );
    assert_eq!(
        c.get("tok.example"),
        Some(&RegistryCredential::Bearer(Secret::new("bearer")))
    );
    assert_eq!(c.get("other.example"), None);
    assert_eq!(
        c.registries().collect::<Vec<_>>(),
        ["docker.io", "id.example", "r.example:5000", "tok.example"]
    );
    // Debug names registries and kinds, never a value.
    let dbg = format!("{c:?}");
    assert!(!dbg.contains(SECRET) && !dbg.contains("refresh\""), "{dbg}");
    assert!(dbg.contains("r.example:5000"), "{dbg}");
}

#[test]
fn docker_config_without_auths_is_empty() {
    let c = DockerConfig::parse("f", b"{}").unwrap();
    assert_eq!(c.registries().count(), 0);
}

#[test]
fn bad_docker_configs_name_the_field_and_never_the_value() {
    let cases: Vec<(serde_json::Value, &str)> = vec![
        (
            serde_json::json!([]),
            "f: (top level): must be a JSON object",
        ),
        (
            serde_json::json!({"credsStore": "desktop"}),
            "f: credsStore: credential helpers run programs",
        ),
        (
            serde_json::json!({"credHelpers": {"r": "x"}}),
            "f: credHelpers: credential helpers",
        ),
        (
            serde_json::json!({"auths": []}),
            "f: auths: must be a JSON object",
        ),
        (
            serde_json::json!({"auths": {"r": "x"}}),
            "f: auths[\"r\"]: must be a JSON object",
        ),
        (
            serde_json::json!({"auths": {"r": {"auth": format!("{SECRET}!!")}}}),
            "f: auths[\"r\"].auth: is not base64",
        ),
        (
            serde_json::json!({"auths": {"r": {"auth": b64(SECRET)}}}),
            "f: auths[\"r\"].auth: is not base64 of user:password",
        ),
        (
            serde_json::json!({"auths": {"r": {"auth": b64(&format!(":{SECRET}"))}}}),
            "f: auths[\"r\"].auth: has an empty user name",
        ),
        (
            serde_json::json!({"auths": {"r": {"username": "u"}}}),
            "f: auths[\"r\"].password: is missing",
        ),
        (
            serde_json::json!({"auths": {"r": {"password": SECRET}}}),
            "f: auths[\"r\"].username: is missing",
        ),
        (
            serde_json::json!({"auths": {"r": {"password": 7}}}),
            "f: auths[\"r\"].password: must be a string",
        ),
        (
            serde_json::json!({"auths": {"r": {"email": "a@b"}}}),
            "f: auths[\"r\"]: holds no identitytoken",
        ),
        (
            serde_json::json!({"auths": {"https://": {"auth": b64("u:p")}}}),
            "f: auths[\"https://\"]: names no registry",
        ),
        (
            serde_json::json!({"auths": {
                "https://index.docker.io/v1/": {"auth": b64("u:p")},
                "docker.io": {"auth": b64("u:p")},
            }}),
            "names a registry another entry already names",
        ),
    ];
    for (doc, want) in cases {
        let err = DockerConfig::parse("f", doc.to_string().as_bytes())
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{doc}: {err}");
        assert!(!err.contains(SECRET), "{doc}: {err}");
    }
    let err = DockerConfig::parse("f", b"{\"auths\": ").unwrap_err();
    assert!(
        matches!(err, DockerConfigError::NotJson { line: 1, .. }),
        "{err}"
    );
}

struct Fixed(Option<RegistryCredential>, &'static str);

#[async_trait]
impl CredentialSource for Fixed {
    async fn credential(
        &self,
        registry: &str,
    ) -> Result<Option<RegistryCredential>, CredentialError> {
        Ok(if registry == self.1 {
            self.0.clone()
        } else {
            None
        })
    }
}

#[tokio::test]
async fn a_chain_answers_with_the_first_source_that_has_the_registry() {
    let first = Fixed(
        Some(RegistryCredential::Bearer(Secret::new("a"))),
        "a.example",
    );
    let second = Fixed(
        Some(RegistryCredential::Bearer(Secret::new("b"))),
        "b.example",
    );
    let shadowed = Fixed(
        Some(RegistryCredential::Bearer(Secret::new("c"))),
        "a.example",
    );
    let chain = CredentialChain::new(vec![Arc::new(first), Arc::new(second), Arc::new(shadowed)]);
    assert_eq!(
        chain.credential("a.example").await.unwrap(),
        Some(RegistryCredential::Bearer(Secret::new("a")))
    );
    assert_eq!(
        chain.credential("b.example").await.unwrap(),
        Some(RegistryCredential::Bearer(Secret::new("b")))
    );
    assert_eq!(chain.credential("z.example").await.unwrap(), None);
    assert!(CredentialChain::default().is_empty());
}

struct NoAad;

#[async_trait]
impl AadTokenSource for NoAad {
    async fn aad_token(&self) -> Result<Secret, crate::auth::AadError> {
        Err("no identity here".into())
    }
    fn tenant(&self) -> Option<String> {
        None
    }
}

#[tokio::test]
async fn the_acr_exchange_serves_acr_names_and_the_listed_registries_only() {
    let x = AcrExchange::new(
        flex_host::http::client().unwrap(),
        Arc::new(NoAad),
        &["Mirror.Example:5000".into()],
        InsecureRegistries::none(),
    );
    for (r, want) in [
        ("myacr.azurecr.io", true),
        ("MyAcr.AzureCR.io", true),
        ("myacr.azurecr.cn", true),
        ("myacr.azurecr.us", true),
        ("azurecr.io", false),
        (".azurecr.io", false),
        ("myacr.azurecr.io.evil.example", false),
        ("mirror.example:5000", true),
        ("mirror.example", false),
        ("docker.io", false),
    ] {
        assert_eq!(x.serves(r), want, "{r}");
    }
    // A registry it does not serve: no credential, and the Entra ID token is not even asked.
    assert_eq!(x.credential("docker.io").await.unwrap(), None);
    // One it serves, without an identity: an error naming the registry and the reason.
    let err = x.credential("myacr.azurecr.io").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "registry myacr.azurecr.io: no Microsoft Entra ID token for ACR's exchange: no identity \
         here"
    );
}

#[test]
fn jwt_expiry_reads_exp_without_verifying_and_ignores_anything_else() {
    let enc = |v: serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let jwt = format!(
        "{}.{}.sig",
        enc(serde_json::json!({"alg": "RS256"})),
        enc(serde_json::json!({"exp": 2_000_000_000u64}))
    );
    assert_eq!(
        jwt_expiry(&jwt),
        Some(std::time::UNIX_EPOCH + Duration::from_secs(2_000_000_000))
    );
    assert_eq!(jwt_expiry("opaque-refresh-token"), None);
    assert_eq!(jwt_expiry("a.!!!.c"), None);
    let no_exp = format!("x.{}.y", enc(serde_json::json!({"sub": "n"})));
    assert_eq!(jwt_expiry(&no_exp), None);
}

#[test]
fn acr_error_details_keep_codes_and_messages_only() {
    assert_eq!(
        acr_error_detail(
            br#"{"errors":[{"code":"UNAUTHORIZED","message":"bad token","detail":{"x":1}}]}"#
        ),
        "UNAUTHORIZED bad token"
    );
    assert_eq!(
        acr_error_detail(br#"{"error":"invalid_grant"}"#),
        "invalid_grant"
    );
    assert_eq!(acr_error_detail(b"<html>oops</html>"), "");
}
