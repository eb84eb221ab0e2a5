//! The agent's assembly of registry credentials from a config: the file read through a
//! `HostFs` rooted in a temporary directory (real files). With the node's Azure identity and
//! ACR's exchange: `crate::goalclient::acr`'s tests.

use base64::Engine as _;
use flex_oci::RegistryCredential;

use super::*;
use flex_host::secret::Secret;

use crate::config::RegistryAuth;

const PASSWORD: &str = "file-SECRET-pw";

fn config(auth: Option<RegistryAuth>) -> Config {
    let mut c = Config::default();
    c.bootstrap.registry_auth = auth;
    c
}

fn file_auth(path: &str) -> Option<RegistryAuth> {
    Some(RegistryAuth {
        config_file: path.into(),
        acr_registries: Vec::new(),
    })
}

fn write_creds(root: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let dir = root.join("etc/aks-flex-node");
    std::fs::create_dir_all(&dir).unwrap();
    let doc = serde_json::json!({"auths": {"r.example:5000": {
        "auth": base64::engine::general_purpose::STANDARD.encode(format!("u:{PASSWORD}"))
    }}});
    let f = dir.join("registry-auth.json");
    std::fs::write(&f, doc.to_string()).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn build(c: &Config, fs: &HostFs) -> Result<Option<Arc<dyn CredentialSource>>, RegistryAuthError> {
    flex_host::http::install_crypto();
    credential_source(
        c,
        fs,
        &flex_host::http::client().unwrap(),
        &InsecureRegistries::none(),
        None,
    )
}

#[tokio::test]
async fn nothing_configured_means_an_anonymous_client() {
    let t = tempfile::tempdir().unwrap();
    let fs = HostFs::new(t.path());
    assert!(build(&config(None), &fs).unwrap().is_none());
    assert!(
        build(&config(Some(RegistryAuth::default())), &fs)
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn the_credentials_file_is_read_from_the_host_and_served_by_registry() {
    let t = tempfile::tempdir().unwrap();
    write_creds(t.path(), 0o600);
    let fs = HostFs::new(t.path());
    let c = config(file_auth("/etc/aks-flex-node/registry-auth.json"));
    let source = build(&c, &fs).unwrap().unwrap();
    assert_eq!(
        source.credential("r.example:5000").await.unwrap(),
        Some(RegistryCredential::Basic {
            username: "u".into(),
            password: Secret::new(PASSWORD),
        })
    );
    assert_eq!(source.credential("other.example").await.unwrap(), None);
}

#[tokio::test]
async fn a_missing_or_broken_file_is_an_error_naming_the_field_and_never_a_secret() {
    let t = tempfile::tempdir().unwrap();
    let fs = HostFs::new(t.path());
    let c = config(file_auth("/etc/aks-flex-node/registry-auth.json"));
    let err = build(&c, &fs).err().unwrap().to_string();
    assert_eq!(
        err,
        "bootstrap.registryAuth.configFile: /etc/aks-flex-node/registry-auth.json: does not exist"
    );
    std::fs::create_dir_all(t.path().join("etc/aks-flex-node")).unwrap();
    std::fs::write(
        t.path().join("etc/aks-flex-node/registry-auth.json"),
        format!(r#"{{"auths": {{"r": {{"auth": "{PASSWORD}"}}}}}}"#),
    )
    .unwrap();
    let err = build(&c, &fs).err().unwrap().to_string();
    assert_eq!(
        err,
        "bootstrap.registryAuth.configFile: /etc/aks-flex-node/registry-auth.json: \
         auths[\"r\"].auth: is not base64"
    );
}
