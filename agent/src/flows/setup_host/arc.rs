//! `install-arc`: connect the host to Azure Arc (upstream's `arc` phase), in host mode only; the
//! agent's container refuses `azure.arc.enabled`.
//!
//! 1. `azcmagent` not on `PATH`: the installer script is downloaded from
//!    `azure.arc.installerUrl` into a private (0700) temporary directory, its SHA-256 checked
//!    against `azure.arc.installerSha256` (a mismatch runs nothing), run with `bash`, removed.
//! 2. `azcmagent show` not `Agent Status: Connected`: `azcmagent connect` with an ARM token of
//!    the config's credential (`from_config_or_default`). The token never is in argv: it goes in
//!    a 0600 `--config` JSON file of a private temporary directory, removed whatever happens.
//! 3. Then, and on every run, a wait until `azcmagent show` says Connected and the Arc identity
//!    answers at HIMDS: its challenge (401 with `WWW-Authenticate: Basic realm=<key file>`, a
//!    `*.key` file in `/var/opt/azcmagent/tokens/`), then the token request with the key.
//!
//! Upstream's ARM role assignments to the Arc identity are left to the administrator.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{Context, anyhow, bail};
use flex_host::context::Host;
use flex_host::error::Chain;
use flex_host::retry::{Backoff, wait_until};
use flex_host::runner::{Cmd, REDACTED};
use flex_host::secret::{Secret, redact_url};
use url::Url;

use crate::config::{ArcConfig, Config};
use crate::goalclient::arm::arm_scope;
use crate::goalclient::azure::{AzureCredential, cloud_of, parse_token_response, resource_of};
use crate::machine::components::download_to_file;

/// HIMDS, Arc's local identity endpoint.
pub const DEFAULT_HIMDS: &str = "http://localhost:40342";
/// Where HIMDS's challenge key files are.
const TOKENS_DIR: &str = "/var/opt/azcmagent/tokens";
/// How long the installer and `azcmagent connect` may take.
const SLOW: Duration = Duration::from_secs(600);

/// What [`ensure_arc`] talks to and how long it waits.
pub struct ArcSeams<'a> {
    /// The credential whose ARM token `azcmagent connect` gets.
    pub credential: &'a dyn AzureCredential,
    /// HIMDS's base URL.
    pub himds: String,
    /// How long to wait for Connected and HIMDS, and how often to look.
    pub wait: (Duration, Duration),
    /// The installer download's retries.
    pub download: Backoff,
}

/// `install-arc`: nothing unless `azure.arc.enabled`; refused in the agent's container.
pub async fn install_arc(host: &Host, config: &Config) -> anyhow::Result<()> {
    let Some(arc) = config.azure.arc.as_ref().filter(|a| a.enabled) else {
        tracing::info!("Arc is disabled, skipping installation");
        return Ok(());
    };
    if host.containerized() {
        bail!(
            "azure.arc.enabled is true, but Azure Arc needs host mode: the agent runs in its container here; install the agent on the host, or use a bootstrap token, service principal or managed identity"
        );
    }
    let env = crate::goalclient::azure::process_env();
    let credential = crate::goalclient::azure::from_config_or_default(config, &env)
        .context("Azure credential for azcmagent connect")?;
    let seams = ArcSeams {
        credential: &credential,
        himds: DEFAULT_HIMDS.into(),
        wait: (Duration::from_secs(300), Duration::from_secs(5)),
        download: crate::machine::components::DOWNLOAD_RETRY,
    };
    ensure_arc(host, config, arc, &seams).await
}

/// Installs, connects and verifies Arc (host mode; the caller checked).
pub async fn ensure_arc(
    host: &Host,
    config: &Config,
    arc: &ArcConfig,
    seams: &ArcSeams<'_>,
) -> anyhow::Result<()> {
    let http = flex_host::http::client().context("HTTP client")?;
    if host.runner.which("azcmagent").is_none() {
        install_agent(host, &http, arc, seams.download).await?;
    }
    if connected(host).await {
        tracing::info!("Azure Arc already connected");
    } else {
        connect(host, config, arc, seams.credential).await?;
    }
    tracing::info!(
        "Arc role assignments (upstream's Reader/Contributor/AKS RBAC roles for the Arc identity) are left to the administrator"
    );
    let resource = arm_scope(&config.azure.resource_manager_endpoint);
    let (timeout, poll) = seams.wait;
    wait_until(
        "Azure Arc connected, HIMDS answering",
        timeout,
        poll,
        || async {
            if !connected(host).await {
                return Err("azcmagent show: not Connected".to_string());
            }
            himds_token(host, &http, &seams.himds, resource_of(&resource))
                .await
                .map_err(|e| format!("{e:#}"))
        },
    )
    .await?;
    tracing::info!("Azure Arc connected; its identity answers at HIMDS");
    Ok(())
}

async fn install_agent(
    host: &Host,
    http: &reqwest::Client,
    arc: &ArcConfig,
    retry: Backoff,
) -> anyhow::Result<()> {
    let url = redact_url(&arc.installer_url);
    let dir = private_dir()?;
    let file = dir.path().join("install_linux_azcmagent.sh");
    let actual = download_to_file(http, &arc.installer_url, &file, &retry, "Arc installer")
        .await
        .map_err(|e| anyhow!("download the Arc installer from {url}: {e}"))?;
    if actual != arc.installer_sha256 {
        bail!(
            "the Arc installer from {url} does not match azure.arc.installerSha256 (expected {}, actual {actual}); not run",
            arc.installer_sha256
        );
    }
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("chmod {}", file.display()))?;
    tracing::info!(url, "installing azcmagent");
    let cmd = Cmd::new("bash").arg(file.to_string_lossy()).timeout(SLOW);
    host.runner.run(&cmd).await?;
    Ok(())
}

async fn connect(
    host: &Host,
    config: &Config,
    arc: &ArcConfig,
    credential: &dyn AzureCredential,
) -> anyhow::Result<()> {
    let a = &config.azure;
    let token = credential
        .token(&arm_scope(&a.resource_manager_endpoint))
        .await
        .context("ARM token for azcmagent connect")?
        .token;
    let dir = private_dir()?;
    let file = dir.path().join("connect.json");
    let body = serde_json::json!({ "access-token": token.expose() }).to_string();
    flex_host::fs::write_new(&file, body.as_bytes(), 0o600)?;
    let mut cmd = Cmd::new("azcmagent").timeout(SLOW).args([
        "connect",
        "--resource-group",
        &arc.resource_group,
        "--tenant-id",
        &a.tenant_id,
        "--location",
        &arc.location,
        "--subscription-id",
        &a.subscription_id,
        "--resource-name",
        &arc.machine_name,
    ]);
    match cloud_of(&a.resource_manager_endpoint).map(|c| c.resource_manager) {
        Some("https://management.usgovcloudapi.net") => {
            cmd = cmd.args(["--cloud", "AzureUSGovernment"])
        }
        Some("https://management.chinacloudapi.cn") => {
            cmd = cmd.args(["--cloud", "AzureChinaCloud"])
        }
        _ => {}
    }
    if !arc.tags.is_empty() {
        let tags: Vec<String> = arc.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
        cmd = cmd.args(["--tags".to_string(), tags.join(",")]);
    }
    cmd = cmd.args(["--config".to_string(), file.to_string_lossy().into_owned()]);
    tracing::info!(machine = %arc.machine_name, "connecting to Azure Arc");
    let result = host.runner.run(&cmd).await;
    drop(dir);
    result.map_err(|e| anyhow!("{}", e.to_string().replace(token.expose(), REDACTED)))?;
    Ok(())
}

/// A 0700 directory under the temporary directory, removed when dropped.
fn private_dir() -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("aks-flex-node-arc-")
        .tempdir()
        .context("create a private temporary directory")
}

/// Whether `azcmagent show` says `Agent Status: Connected` (a failure is not connected).
async fn connected(host: &Host) -> bool {
    let Ok(out) = host.runner.output(&Cmd::new("azcmagent").arg("show")).await else {
        return false;
    };
    out.success() && agent_status(&out.stdout).is_some_and(|s| s.eq_ignore_ascii_case("Connected"))
}

/// The `Agent Status` value of `azcmagent show`'s output.
pub fn agent_status(show: &str) -> Option<&str> {
    show.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "Agent Status").then(|| v.trim())
    })
}

/// HIMDS's challenge flow: the token request answered 401 with the key file's path as its
/// realm, then again with `Authorization: Basic <key>`; Ok when a token comes back.
pub async fn himds_token(
    host: &Host,
    http: &reqwest::Client,
    himds: &str,
    resource: &str,
) -> anyhow::Result<()> {
    let mut url = Url::parse(&format!(
        "{}/metadata/identity/oauth2/token",
        himds.trim_end_matches('/')
    ))
    .context("HIMDS URL")?;
    url.query_pairs_mut()
        .append_pair("api-version", "2020-06-01")
        .append_pair("resource", resource);
    let get = || {
        let r = http.get(url.clone()).timeout(Duration::from_secs(10));
        r.header("Metadata", "true")
    };
    let send = |r: reqwest::RequestBuilder| async move {
        r.send()
            .await
            .map_err(|e| anyhow!("HIMDS {himds}: {}", Chain(&e)))
    };
    let challenge = send(get()).await?;
    if challenge.status() != reqwest::StatusCode::UNAUTHORIZED {
        bail!(
            "HIMDS {himds}: status {} to the challenge request, expected 401",
            challenge.status()
        );
    }
    let realm = challenge
        .headers()
        .get(reqwest::header::WWW_AUTHENTICATE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once("realm="))
        .map(|(_, r)| r.trim().trim_matches('"').to_string())
        .context("HIMDS's 401 has no WWW-Authenticate realm")?;
    let key_path = Path::new(&realm);
    if key_path.parent() != Some(Path::new(TOKENS_DIR))
        || key_path.extension().is_none_or(|e| e != "key")
    {
        bail!("HIMDS's realm {realm:?} is not a .key file in {TOKENS_DIR}/; refused");
    }
    let key = host
        .fs
        .read(key_path)?
        .with_context(|| format!("HIMDS key file {realm} is missing"))?;
    let key = Secret::new(String::from_utf8_lossy(&key).trim());
    let answer = send(get().header("Authorization", format!("Basic {}", key.expose()))).await?;
    let status = answer.status();
    let body = flex_host::http::read_capped(answer, 64 * 1024)
        .await
        .map_err(|e| anyhow!("HIMDS {himds}: {e}"))?;
    if status != reqwest::StatusCode::OK {
        bail!("HIMDS {himds}: status {status} to the token request");
    }
    parse_token_response(&body, SystemTime::now()).map_err(|e| anyhow!("HIMDS {himds}: {e}"))?;
    Ok(())
}
