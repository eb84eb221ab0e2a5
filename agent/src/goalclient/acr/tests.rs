//! The node's identity for ACR's exchange, end to end through the machinery's credential
//! source: two scripted HTTP servers on loopback play IMDS and the registry's
//! `/oauth2/exchange` (real client and sockets, scripted answers; the credentials file is a
//! real file under a temporary root).

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine as _;
use flex_host::fs::HostFs;
use flex_host::http::InsecureRegistries;
use flex_oci::RegistryCredential;
use flex_testkit::http::{Reply, ScriptedServer};

use super::*;
use crate::config::{ManagedIdentity, RegistryAuth};
use crate::machine::registry_auth::credential_source;

fn write_creds(root: &Path) {
    let dir = root.join("etc/aks-flex-node");
    std::fs::create_dir_all(&dir).unwrap();
    let doc = serde_json::json!({"auths": {"r.example:5000": {
        "auth": base64::engine::general_purpose::STANDARD.encode("u:pw")
    }}});
    std::fs::write(dir.join("registry-auth.json"), doc.to_string()).unwrap();
}

/// A config with no Azure credential gets the default chain; nothing is asked until an ACR
/// answers `401` (building it reaches no endpoint).
#[test]
fn no_azure_credential_in_the_config_means_the_default_chain() {
    assert!(identity(&Config::default(), &Env::new()).unwrap().is_some());
}

#[test]
fn the_scope_is_the_configs_resource_manager_audience() {
    assert_eq!(scope(""), "https://management.core.windows.net/.default");
    assert_eq!(
        scope("https://management.usgovcloudapi.net"),
        "https://management.core.usgovcloudapi.net/.default"
    );
}

/// A managed identity (IMDS scripted on loopback) and an ACR named in `acrRegistries`
/// (`/oauth2/exchange` scripted on loopback, listed as insecure): the registry's credential is
/// the refresh token ACR gave for the IMDS token; a registry in the file is answered from the
/// file without asking IMDS.
#[tokio::test]
async fn the_nodes_managed_identity_is_exchanged_at_the_listed_acr() {
    let imds = ScriptedServer::start(vec![Reply::json(
        200,
        r#"{"access_token":"imds-SECRET-token","expires_on":"4102444800"}"#,
    )])
    .unwrap();
    let acr = ScriptedServer::start(vec![Reply::json(
        200,
        r#"{"refresh_token":"acr-refresh-SECRET"}"#,
    )])
    .unwrap();
    let acr_host = acr.url("").trim_start_matches("http://").to_string();
    let t = tempfile::tempdir().unwrap();
    write_creds(t.path());
    let fs = HostFs::new(t.path());
    let mut c = Config::default();
    c.bootstrap.registry_auth = Some(RegistryAuth {
        config_file: "/etc/aks-flex-node/registry-auth.json".into(),
        acr_registries: vec![acr_host.clone()],
    });
    c.azure.managed_identity = Some(ManagedIdentity {
        client_id: "mi-client".into(),
    });
    let env: Env = BTreeMap::from([(
        super::azure::IMDS_ENDPOINT_ENV.to_string(),
        imds.url("/metadata/identity/oauth2/token"),
    )]);
    flex_host::http::install_crypto();
    let source = credential_source(
        &c,
        &fs,
        &flex_host::http::client().unwrap(),
        &InsecureRegistries::parse("test", &acr_host).unwrap(),
        identity(&c, &env).unwrap(),
    )
    .unwrap()
    .unwrap();

    // The file first: no IMDS request.
    assert!(matches!(
        source.credential("r.example:5000").await.unwrap(),
        Some(RegistryCredential::Basic { .. })
    ));
    assert!(imds.requests().is_empty());
    // Not an ACR: nothing.
    assert_eq!(source.credential("quay.example").await.unwrap(), None);
    assert!(imds.requests().is_empty());

    assert_eq!(
        source.credential(&acr_host).await.unwrap(),
        Some(RegistryCredential::RefreshToken(
            flex_host::secret::Secret::new("acr-refresh-SECRET")
        ))
    );
    let asked = imds.requests();
    assert_eq!(asked.len(), 1);
    assert!(
        asked[0]
            .query()
            .contains("resource=https%3A%2F%2Fmanagement.core.windows.net"),
        "{}",
        asked[0].target
    );
    assert!(asked[0].query().contains("client_id=mi-client"));
    let exchanged = acr.requests();
    assert_eq!(exchanged.len(), 1);
    assert_eq!(exchanged[0].method, "POST");
    assert_eq!(exchanged[0].path(), "/oauth2/exchange");
    let form: BTreeMap<String, String> = url::form_urlencoded::parse(&exchanged[0].body)
        .into_owned()
        .collect();
    assert_eq!(form["grant_type"], "access_token");
    assert_eq!(form["access_token"], "imds-SECRET-token");
    assert_eq!(form["service"], acr_host);
    assert!(
        !form.contains_key("tenant"),
        "a managed identity names no tenant"
    );
}
