//! `token acr`'s request and response, and its answer through ACR's exchange against a scripted
//! `/oauth2/exchange` on loopback (real client and socket, scripted answer; the identity is a
//! fixed token, the one fake, at the trait boundary).

use std::time::Duration;

use async_trait::async_trait;
use flex_host::http::InsecureRegistries;
use flex_host::secret::Secret;
use flex_oci::AadTokenSource;
use flex_testkit::http::{Reply, ScriptedServer};

use super::*;

fn request(version: &str, image: &str) -> Vec<u8> {
    serde_json::json!({"apiVersion": format!("{GROUP}/{version}"), "kind": REQUEST_KIND, "image": image})
        .to_string()
        .into_bytes()
}

#[test]
fn requests_of_both_versions_decode_and_others_are_refused() {
    for v in VERSIONS {
        let (api, image) = decode(&request(v, "a.azurecr.io/x:1")).unwrap();
        assert_eq!(api, format!("{GROUP}/{v}"));
        assert_eq!(image, "a.azurecr.io/x:1");
    }
    for (bytes, want) in [
        (b"nope".to_vec(), "decode the CredentialProviderRequest: line 1, column 2"),
        (
            request("v1alpha1", "x"),
            "unsupported request \"credentialprovider.kubelet.k8s.io/v1alpha1 CredentialProviderRequest\"",
        ),
        (
            br#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"ExecCredential","image":"x"}"#.to_vec(),
            "unsupported request",
        ),
        (request("v1", " "), "image is empty"),
    ] {
        let e = decode(&bytes).unwrap_err().to_string();
        assert!(e.contains(want), "{want}: {e}");
    }
}

#[test]
fn a_response_names_the_registry_and_its_cache_time_and_an_empty_one_nothing() {
    let v: serde_json::Value = serde_json::from_str(&render(
        "credentialprovider.kubelet.k8s.io/v1beta1",
        Some((
            "a.azurecr.io",
            &Secret::new("r"),
            Duration::from_secs(3 * 3600 - 300),
        )),
    ))
    .unwrap();
    assert_eq!(
        v,
        serde_json::json!({
            "apiVersion": "credentialprovider.kubelet.k8s.io/v1beta1",
            "kind": "CredentialProviderResponse",
            "cacheKeyType": "Registry",
            "cacheDuration": "2h55m0s",
            "auth": {"a.azurecr.io": {"username": ACR_USERNAME, "password": "r"}}
        })
    );
    let v: serde_json::Value =
        serde_json::from_str(&render("credentialprovider.kubelet.k8s.io/v1", None)).unwrap();
    assert_eq!(v["auth"], serde_json::json!({}));
    assert_eq!(v["cacheDuration"], "0s");
    assert_eq!(v["cacheKeyType"], "Registry");
}

struct Fixed;

#[async_trait]
impl AadTokenSource for Fixed {
    async fn aad_token(&self) -> Result<Secret, flex_oci::auth::AadError> {
        Ok(Secret::new("aad-SECRET"))
    }
    fn tenant(&self) -> Option<String> {
        None
    }
}

#[tokio::test]
async fn an_acr_image_gets_the_refresh_token_and_another_image_nothing() {
    let acr = ScriptedServer::start(vec![Reply::json(
        200,
        r#"{"refresh_token":"refresh-SECRET"}"#,
    )])
    .unwrap();
    let host = acr.url("").trim_start_matches("http://").to_string();
    flex_host::http::install_crypto();
    let exchange = Arc::new(AcrExchange::new(
        flex_host::http::client().unwrap(),
        Arc::new(Fixed),
        std::slice::from_ref(&host),
        InsecureRegistries::parse("test", &host).unwrap(),
    ));
    let out = respond(&request("v1", &format!("{host}/app:1")), &exchange)
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["auth"][&host]["password"], "refresh-SECRET");
    assert_eq!(v["auth"][&host]["username"], ACR_USERNAME);
    assert_eq!(v["cacheDuration"], "30m0s");
    assert_eq!(acr.requests().len(), 1);

    // Not an ACR: an empty response, and no exchange.
    let out = respond(&request("v1", "docker.io/library/busybox:1"), &exchange)
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["auth"], serde_json::json!({}));
    assert_eq!(acr.requests().len(), 1);
}
