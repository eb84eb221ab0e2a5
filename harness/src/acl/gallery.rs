//! An ACL image from the Azure compute gallery, exported with the Azure CLI to a local qcow2
//! and cached.
//!
//! The gallery publishes images only as Azure resources, so the export goes through a
//! temporary managed disk: `az disk create --gallery-image-reference <version id>`,
//! `az disk grant-access --access-level Read` for a SAS URL, a download of the disk's VHD
//! (fixed size, written sparse), `az disk revoke-access` and `az disk delete` (always, also
//! when a step failed), then `qemu-img convert -f vpc -O qcow2`. Every command goes through
//! the runner; the SAS URL is a secret and is never printed, logged or put in an error.
//!
//! The result is cached under `<cache>/acl/<gallery>/<image>/<version>.qcow2`: a version given
//! explicitly and already cached needs no `az` at all; "latest" asks the gallery which version
//! that is (the highest version not marked `excludeFromLatest`, as the gallery itself picks)
//! and then uses the cache if it has it.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use flex_host::runner::{Cmd, Output, Runner};
use serde_json::Value;

use super::download::{Fetch, SasUrl, gib};
use crate::vm::Progress;

/// The default gallery.
pub const DEFAULT_GALLERY: &str = "ACLDEVEL";
/// The default image definition in it.
pub const DEFAULT_IMAGE: &str = "acl-1es-eval-kvm";
/// The default version (`ACL_IMAGE_VERSION` unset).
pub const DEFAULT_VERSION: &str = "3.20261019.3";
/// How long the disk's SAS URL is valid.
pub const SAS_SECONDS: u64 = 4 * 3600;

/// Which gallery image `--acl-gallery` / `ACL_GALLERY` asks for: `GALLERY/IMAGE`, or a yes
/// (`1`, `true`, `yes`, `on`, or the flag alone, which clap gives as `""`) for the default
/// [`DEFAULT_GALLERY`]/[`DEFAULT_IMAGE`]; `0`, `false`, `no`, `off` or unset ask for nothing.
pub fn parse_request(value: Option<&str>) -> Result<Option<(String, String)>> {
    let Some(v) = value.map(str::trim) else {
        return Ok(None);
    };
    match v.to_ascii_lowercase().as_str() {
        "" | "1" | "true" | "yes" | "on" => {
            return Ok(Some((DEFAULT_GALLERY.into(), DEFAULT_IMAGE.into())));
        }
        "0" | "false" | "no" | "off" => return Ok(None),
        _ => {}
    }
    match v.split_once('/') {
        Some((g, i)) if !g.is_empty() && !i.is_empty() && !i.contains('/') => {
            Ok(Some((g.to_string(), i.to_string())))
        }
        _ => bail!(
            "ACL_GALLERY / --acl-gallery {v:?}: expected GALLERY/IMAGE (e.g. {DEFAULT_GALLERY}/{DEFAULT_IMAGE}) or 1"
        ),
    }
}

/// Which image version to export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionRequest {
    /// This version.
    Exact(String),
    /// The gallery's latest.
    Latest,
}

/// The version from `--acl-image-version` (wins) or `ACL_IMAGE_VERSION`: unset is
/// [`DEFAULT_VERSION`]; empty or `latest` is the gallery's latest.
pub fn version_request(flag: Option<&str>, env: Option<&str>) -> VersionRequest {
    match flag.or(env).map(str::trim) {
        None => VersionRequest::Exact(DEFAULT_VERSION.into()),
        Some("") | Some("latest") => VersionRequest::Latest,
        Some(v) => VersionRequest::Exact(v.to_string()),
    }
}

/// Everything the export needs.
#[derive(Clone, Debug)]
pub struct GalleryOptions {
    /// The gallery's name.
    pub gallery: String,
    /// The image definition.
    pub image: String,
    /// The version.
    pub version: VersionRequest,
    /// The subscription the temporary disk is made in (`ACL_SUBSCRIPTION`; unset: the Azure
    /// CLI's current one).
    pub subscription: Option<String>,
    /// The gallery's subscription (`ACL_GALLERY_SUBSCRIPTION`; unset: `subscription`).
    pub gallery_subscription: Option<String>,
    /// The gallery's resource group (`ACL_GALLERY_RESOURCE_GROUP`; unset: found by the
    /// gallery's name with `az sig list`).
    pub gallery_resource_group: Option<String>,
    /// The temporary disk's resource group (`ACL_RESOURCE_GROUP`; unset: the gallery's).
    pub resource_group: Option<String>,
    /// The disk's region (`ACL_LOCATION`; unset: the resource group's). The image version
    /// must be replicated there.
    pub location: Option<String>,
    /// The cache root (`~/.cache/aks-flex-node`).
    pub cache_root: PathBuf,
    /// The temporary disk's name (unset: `aks-flex-acl-<version>-<time>`).
    pub disk_name: Option<String>,
}

impl GalleryOptions {
    /// The default image at `version`, cached under `cache_root`, every Azure place unset.
    pub fn new(cache_root: PathBuf, version: VersionRequest) -> Self {
        Self {
            gallery: DEFAULT_GALLERY.into(),
            image: DEFAULT_IMAGE.into(),
            version,
            subscription: None,
            gallery_subscription: None,
            gallery_resource_group: None,
            resource_group: None,
            location: None,
            cache_root,
            disk_name: None,
        }
    }

    fn gallery_sub(&self) -> Option<&str> {
        self.gallery_subscription
            .as_deref()
            .or(self.subscription.as_deref())
    }
}

/// Where an exported version is cached.
pub fn cache_path(cache_root: &Path, gallery: &str, image: &str, version: &str) -> PathBuf {
    cache_root
        .join("acl")
        .join(gallery)
        .join(image)
        .join(format!("{version}.qcow2"))
}

/// What to do about the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheDecision {
    /// Use this file; nothing to ask Azure.
    Cached(PathBuf),
    /// Export the version into this file.
    Export(String, PathBuf),
    /// Ask the gallery for its latest version first.
    AskLatest,
}

/// The cache decision for `version` of `gallery`/`image` (pure but for `exists`).
pub fn cache_decision(
    cache_root: &Path,
    gallery: &str,
    image: &str,
    version: &VersionRequest,
    exists: &dyn Fn(&Path) -> bool,
) -> CacheDecision {
    match version {
        VersionRequest::Latest => CacheDecision::AskLatest,
        VersionRequest::Exact(v) => {
            let p = cache_path(cache_root, gallery, image, v);
            if exists(&p) {
                CacheDecision::Cached(p)
            } else {
                CacheDecision::Export(v.clone(), p)
            }
        }
    }
}

/// One image version as `az sig image-version list/show` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageVersion {
    /// The version (`3.20261019.3`).
    pub name: String,
    /// Its resource ID.
    pub id: String,
    /// `publishingProfile.excludeFromLatest`.
    pub exclude_from_latest: bool,
    /// `provisioningState`.
    pub state: String,
}

fn version_of(v: &Value) -> Option<ImageVersion> {
    Some(ImageVersion {
        name: v.get("name")?.as_str()?.to_string(),
        id: v.get("id")?.as_str()?.to_string(),
        exclude_from_latest: v
            .pointer("/publishingProfile/excludeFromLatest")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        state: v
            .get("provisioningState")
            .and_then(Value::as_str)
            .unwrap_or("Succeeded")
            .to_string(),
    })
}

/// Parses `az sig image-version list --output json`.
pub fn parse_versions(json: &str) -> Result<Vec<ImageVersion>> {
    let v: Value = serde_json::from_str(json).context("az sig image-version list: not JSON")?;
    let list = v
        .as_array()
        .context("az sig image-version list: not a JSON list")?;
    Ok(list.iter().filter_map(version_of).collect())
}

/// Compares gallery versions (`MAJOR.MINOR.PATCH`) by their numbers.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    let parts = |s: &str| -> Vec<u64> { s.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parts(a).cmp(&parts(b)).then_with(|| a.cmp(b))
}

/// The version the gallery calls latest: the highest that is not excluded from latest and
/// was provisioned (pure).
pub fn latest(versions: &[ImageVersion]) -> Option<&ImageVersion> {
    versions
        .iter()
        .filter(|v| !v.exclude_from_latest && v.state.eq_ignore_ascii_case("Succeeded"))
        .max_by(|a, b| compare_versions(&a.name, &b.name))
}

/// `--security-type TrustedLaunch` when the image definition requires Trusted Launch (a disk
/// made from such an image must say so; `TrustedLaunchSupported` needs nothing).
pub fn security_type(definition_json: &str) -> Option<String> {
    let v: Value = serde_json::from_str(definition_json).ok()?;
    v.get("features")?
        .as_array()?
        .iter()
        .find(|f| f.get("name").and_then(Value::as_str) == Some("SecurityType"))
        .and_then(|f| f.get("value").and_then(Value::as_str))
        .filter(|t| *t == "TrustedLaunch")
        .map(str::to_string)
}

/// The SAS URL in `az disk grant-access --output json`'s output (`accessSas`, any case).
fn sas_of(stdout: &str) -> Option<SasUrl> {
    let v: Value = serde_json::from_str(stdout).ok()?;
    v.as_object()?
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("accessSas"))
        .and_then(|(_, v)| v.as_str())
        .filter(|s| s.starts_with("https://") || s.starts_with("http://"))
        .map(SasUrl::new)
}

fn az(args: &[&str]) -> Cmd {
    Cmd::new("az")
        .args(args.iter().copied())
        .arg("--only-show-errors")
}

fn with_sub(c: Cmd, sub: Option<&str>) -> Cmd {
    match sub {
        Some(s) => c.args(["--subscription", s]),
        None => c,
    }
}

/// What is not installed or not logged in, said plainly.
async fn check_az(runner: &dyn Runner, sub: Option<&str>) -> Result<String> {
    if runner.which("az").is_none() {
        bail!(
            "the Azure CLI (`az`) is not installed: exporting ACL from the compute gallery needs it \
             and a login (`az login`); install it, or give an image with ACL_IMAGE / --acl-image"
        );
    }
    let cmd = with_sub(az(&["account", "show", "--output", "json"]), sub);
    let out = runner
        .output(&cmd)
        .await
        .context("running `az account show`")?;
    if !out.success() {
        bail!(
            "the Azure CLI is not logged in (`az account show` failed: {}); run `az login` \
             (and `az account set --subscription …`, or set ACL_SUBSCRIPTION), or give an image \
             with ACL_IMAGE / --acl-image",
            out.stderr.trim()
        );
    }
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
    let name = v.get("name").and_then(Value::as_str).unwrap_or("?");
    let id = v.get("id").and_then(Value::as_str).unwrap_or("?");
    Ok(format!("subscription {name} ({id})"))
}

async fn json(runner: &dyn Runner, cmd: Cmd) -> Result<String> {
    Ok(runner.run(&cmd).await?.stdout)
}

/// Finds the gallery's resource group by its name.
async fn find_gallery_group(runner: &dyn Runner, opts: &GalleryOptions) -> Result<String> {
    let query = format!("[?name=='{}'].resourceGroup", opts.gallery);
    let out = json(
        runner,
        with_sub(
            az(&["sig", "list", "--query", &query, "--output", "json"]),
            opts.gallery_sub(),
        ),
    )
    .await?;
    let groups: Vec<String> = serde_json::from_str(&out).context("az sig list: not JSON")?;
    match groups.as_slice() {
        [g] => Ok(g.clone()),
        [] => bail!(
            "no gallery named {} in the subscription{}; set ACL_GALLERY_SUBSCRIPTION and \
             ACL_GALLERY_RESOURCE_GROUP to where it is",
            opts.gallery,
            opts.gallery_sub()
                .map(|s| format!(" {s}"))
                .unwrap_or_default()
        ),
        many => bail!(
            "galleries named {} in several resource groups ({}); set ACL_GALLERY_RESOURCE_GROUP",
            opts.gallery,
            many.join(", ")
        ),
    }
}

fn image_args<'a>(opts: &'a GalleryOptions, group: &'a str) -> Vec<&'a str> {
    vec![
        "--resource-group",
        group,
        "--gallery-name",
        &opts.gallery,
        "--gallery-image-definition",
        &opts.image,
    ]
}

/// The cached qcow2 of the requested gallery image, exported first if the cache lacks it.
pub async fn ensure(
    runner: &dyn Runner,
    fetch: &dyn Fetch,
    opts: &GalleryOptions,
    p: &Progress,
) -> Result<PathBuf> {
    let exists = |path: &Path| path.is_file();
    let name = format!("{}/{}", opts.gallery, opts.image);
    if let CacheDecision::Cached(path) = cache_decision(
        &opts.cache_root,
        &opts.gallery,
        &opts.image,
        &opts.version,
        &exists,
    ) {
        p.say(&format!("ACL {name} from the cache: {}", path.display()));
        return Ok(path);
    }
    let account = check_az(runner, opts.subscription.as_deref()).await?;
    p.say(&format!("Azure CLI logged in: {account}"));
    let group = match &opts.gallery_resource_group {
        Some(g) => g.clone(),
        None => find_gallery_group(runner, opts).await?,
    };
    let sub = opts.gallery_sub();
    let version = match &opts.version {
        VersionRequest::Exact(v) => {
            let mut a = vec!["sig", "image-version", "show"];
            a.extend(image_args(opts, &group));
            a.extend(["--gallery-image-version", v, "--output", "json"]);
            let out = json(runner, with_sub(az(&a), sub)).await.with_context(|| {
                format!("ACL image {name} version {v} in resource group {group}")
            })?;
            let val: Value = serde_json::from_str(&out).context("az sig image-version show")?;
            version_of(&val).context("az sig image-version show: no name or id")?
        }
        VersionRequest::Latest => {
            let mut a = vec!["sig", "image-version", "list"];
            a.extend(image_args(opts, &group));
            a.extend(["--output", "json"]);
            let versions = parse_versions(&json(runner, with_sub(az(&a), sub)).await?)?;
            let v = latest(&versions).cloned().with_context(|| {
                format!(
                    "{name} has no version that can be the latest ({} versions, all excluded from latest or not provisioned)",
                    versions.len()
                )
            })?;
            p.say(&format!("the gallery's latest {name} is {}", v.name));
            v
        }
    };
    let dest = cache_path(&opts.cache_root, &opts.gallery, &opts.image, &version.name);
    if dest.is_file() {
        p.say(&format!(
            "ACL {name} {} from the cache: {}",
            version.name,
            dest.display()
        ));
        return Ok(dest);
    }
    let mut a = vec!["sig", "image-definition", "show"];
    a.extend(image_args(opts, &group));
    a.extend(["--output", "json"]);
    let security = security_type(&json(runner, with_sub(az(&a), sub)).await?);
    let dir = dest
        .parent()
        .context("the cache path has no directory")?
        .to_path_buf();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let vhd = dir.join(format!("{}.vhd.part", version.name));
    let disk_group = opts.resource_group.clone().unwrap_or(group);
    let disk = opts.disk_name.clone().unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        format!("aks-flex-acl-{}-{t}", version.name)
    });
    let exported = export_disk(
        runner,
        fetch,
        &Export {
            opts,
            version: &version,
            group: &disk_group,
            disk: &disk,
            security: security.as_deref(),
            vhd: &vhd,
        },
        p,
    )
    .await;
    if let Err(e) = exported {
        let _ = std::fs::remove_file(&vhd);
        return Err(e);
    }
    let part = dir.join(format!("{}.qcow2.part", version.name));
    let _ = std::fs::remove_file(&part);
    let convert = Cmd::new("qemu-img")
        .args(["convert", "-f", "vpc", "-O", "qcow2"])
        .arg(vhd.display().to_string())
        .arg(part.display().to_string())
        .timeout(Duration::from_secs(3 * 3600));
    let converted = p
        .try_wait("converting the VHD to qcow2 (qemu-img convert)", async {
            runner.run(&convert).await
        })
        .await;
    let _ = std::fs::remove_file(&vhd);
    converted?;
    std::fs::rename(&part, &dest)
        .with_context(|| format!("moving {} to {}", part.display(), dest.display()))?;
    p.say(&format!(
        "ACL {name} {} cached: {}",
        version.name,
        dest.display()
    ));
    Ok(dest)
}

/// [`ensure`] with `runner` and the real download: what `cargo xtask up --acl-gallery` runs.
pub async fn export(runner: &dyn Runner, opts: &GalleryOptions, p: &Progress) -> Result<PathBuf> {
    let fetch = super::download::HttpFetch::new()?;
    ensure(runner, &fetch, opts, p).await
}

struct Export<'a> {
    opts: &'a GalleryOptions,
    version: &'a ImageVersion,
    group: &'a str,
    disk: &'a str,
    security: Option<&'a str>,
    vhd: &'a Path,
}

fn disk_cmd(verb: &[&str], x: &Export<'_>) -> Cmd {
    let mut a: Vec<&str> = vec!["disk"];
    a.extend(verb);
    a.extend(["--resource-group", x.group, "--name", x.disk]);
    with_sub(az(&a), x.opts.subscription.as_deref())
}

/// The disk's life: create, grant, download, and always revoke and delete.
async fn export_disk(
    runner: &dyn Runner,
    fetch: &dyn Fetch,
    x: &Export<'_>,
    p: &Progress,
) -> Result<()> {
    let mut create = disk_cmd(&["create"], x)
        .args(["--gallery-image-reference", &x.version.id])
        .args(["--tags", "purpose=aks-flex-node-harness"]);
    if let Some(l) = &x.opts.location {
        create = create.args(["--location", l]);
    }
    if let Some(s) = x.security {
        create = create.args(["--security-type", s]);
    }
    let create = create
        .args(["--output", "none"])
        .timeout(Duration::from_secs(1800));
    let mut granted = false;
    let work = async {
        p.try_wait(
            &format!(
                "creating managed disk {} in {} from {} {} (az disk create)",
                x.disk, x.group, x.opts.image, x.version.name
            ),
            async { runner.run(&create).await },
        )
        .await?;
        granted = true;
        let grant = disk_cmd(&["grant-access"], x)
            .args(["--access-level", "Read", "--duration-in-seconds"])
            .arg(SAS_SECONDS.to_string())
            .args(["--output", "json"])
            .timeout(Duration::from_secs(600));
        let out: Output = runner.run(&grant).await?;
        let sas = sas_of(&out.stdout).with_context(|| {
            format!(
                "no SAS URL in the output of `{}` ({} bytes, not shown)",
                grant.display_argv(),
                out.stdout.len()
            )
        })?;
        let step = p.begin(&format!("downloading the VHD of {}", x.disk));
        let got = fetch
            .fetch(&sas, x.vhd, &|n, total| {
                step.detail(&match total {
                    Some(t) => format!("{} of {}", gib(n), gib(t)),
                    None => gib(n),
                })
            })
            .await
            .map_err(|e| anyhow::anyhow!("{}", sas.scrub(&format!("{e:#}"))))?;
        step.done();
        p.say(&format!("downloaded {} ({})", x.vhd.display(), gib(got)));
        Ok::<(), anyhow::Error>(())
    }
    .await;
    let mut cleanup = Vec::new();
    if granted {
        let revoke = disk_cmd(&["revoke-access"], x).timeout(Duration::from_secs(600));
        if let Err(e) = runner.run(&revoke).await {
            cleanup.push(format!("{e}"));
        }
    }
    let delete = disk_cmd(&["delete"], x)
        .args(["--yes"])
        .timeout(Duration::from_secs(1800));
    let deleted = p
        .try_wait(&format!("deleting managed disk {}", x.disk), async {
            runner.run(&delete).await
        })
        .await;
    if let Err(e) = deleted {
        cleanup.push(format!("{e}; delete it by hand: {}", delete.display_argv()));
    }
    match (work, cleanup.is_empty()) {
        (Ok(()), true) => Ok(()),
        (Ok(()), false) => {
            p.say(&format!(
                "warning: cleaning up the temporary disk failed: {}",
                cleanup.join("; ")
            ));
            Ok(())
        }
        (Err(e), true) => Err(e),
        (Err(e), false) => Err(e.context(format!(
            "(and cleaning up the temporary disk failed: {})",
            cleanup.join("; ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::download::OnProgress;
    use async_trait::async_trait;
    use flex_host::runner::CmdError;
    use flex_testkit::FakeRunner;
    use std::sync::{Arc, Mutex};

    const SAS: &str = "https://md-hdd-x.z1.blob.storage.example/abcd/abcd?sv=2018-03-28&sr=b&si=1&sig=T0pS3cr3t%3D";
    const ID: &str = "/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/acl-rg/providers/Microsoft.Compute/galleries/ACLDEVEL/images/acl-1es-eval-kvm/versions/3.20261019.3";

    /// The fake runner, plus `qemu-img convert` writing its output file.
    struct Rec(FakeRunner);

    #[async_trait]
    impl Runner for Rec {
        async fn output(&self, cmd: &Cmd) -> Result<Output, CmdError> {
            let args: Vec<&str> = cmd.arg_list().iter().map(|a| a.value()).collect();
            if cmd.program() == "qemu-img" && args.first() == Some(&"convert") {
                std::fs::write(args[args.len() - 1], b"QFI\xfb").unwrap();
            }
            self.0.output(cmd).await
        }

        fn which(&self, program: &str) -> Option<PathBuf> {
            self.0.which(program)
        }
    }

    struct FakeFetch {
        fail: bool,
        seen: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl Fetch for FakeFetch {
        async fn fetch(&self, url: &SasUrl, dest: &Path, progress: OnProgress<'_>) -> Result<u64> {
            self.seen.lock().unwrap().push(url.expose().to_string());
            if self.fail {
                // A careless error that names the whole URL: the caller must scrub it.
                bail!("GET {} failed: connection reset", url.expose());
            }
            std::fs::write(dest, b"conectix").unwrap();
            progress(8, Some(8));
            Ok(8)
        }
    }

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn progress() -> (Progress, Buf) {
        let b = Buf::default();
        (
            Progress::plain(Box::new(b.clone()), Arc::new(|| Duration::ZERO)),
            b,
        )
    }

    fn runner() -> Rec {
        let r = FakeRunner::new();
        r.on(
            "az account show",
            Output::ok(r#"{"id":"11111111-2222-3333-4444-555555555555","name":"dev","user":{"name":"me@example.com"}}"#),
        );
        r.on("az sig list", Output::ok(r#"["acl-rg"]"#));
        r.on(
            "az sig image-version show",
            Output::ok(format!(r#"{{"name":"3.20261019.3","id":"{ID}","provisioningState":"Succeeded","publishingProfile":{{"excludeFromLatest":false}}}}"#)),
        );
        r.on(
            "az sig image-definition show",
            Output::ok(r#"{"features":[{"name":"SecurityType","value":"TrustedLaunch"}],"hyperVGeneration":"V2"}"#),
        );
        r.on(
            "az disk grant-access",
            Output::ok(format!(
                r#"{{"accessSas":"{SAS}","securityDataAccessSas":null}}"#
            )),
        );
        Rec(r)
    }

    fn opts(cache: &Path) -> GalleryOptions {
        let mut o = GalleryOptions::new(
            cache.to_path_buf(),
            VersionRequest::Exact(DEFAULT_VERSION.into()),
        );
        o.disk_name = Some("aks-flex-acl-test".into());
        o
    }

    /// The whole argv sequence of an export, in order.
    #[tokio::test]
    async fn export_argv_sequence() {
        let d = tempfile::tempdir().unwrap();
        let r = runner();
        let f = FakeFetch {
            fail: false,
            seen: Mutex::default(),
        };
        let (p, out) = progress();
        let path = ensure(&r, &f, &opts(d.path()), &p).await.unwrap();
        assert_eq!(
            path,
            d.path()
                .join("acl/ACLDEVEL/acl-1es-eval-kvm/3.20261019.3.qcow2")
        );
        assert!(path.is_file());
        let vhd = d
            .path()
            .join("acl/ACLDEVEL/acl-1es-eval-kvm/3.20261019.3.vhd.part");
        assert!(!vhd.exists(), "the VHD is removed after the conversion");
        let calls = r.0.calls();
        let expected = vec![
            "az account show --output json --only-show-errors".to_string(),
            "az sig list --query [?name=='ACLDEVEL'].resourceGroup --output json --only-show-errors".into(),
            "az sig image-version show --resource-group acl-rg --gallery-name ACLDEVEL --gallery-image-definition acl-1es-eval-kvm --gallery-image-version 3.20261019.3 --output json --only-show-errors".into(),
            "az sig image-definition show --resource-group acl-rg --gallery-name ACLDEVEL --gallery-image-definition acl-1es-eval-kvm --output json --only-show-errors".into(),
            format!("az disk create --resource-group acl-rg --name aks-flex-acl-test --only-show-errors --gallery-image-reference {ID} --tags purpose=aks-flex-node-harness --security-type TrustedLaunch --output none"),
            "az disk grant-access --resource-group acl-rg --name aks-flex-acl-test --only-show-errors --access-level Read --duration-in-seconds 14400 --output json".into(),
            "az disk revoke-access --resource-group acl-rg --name aks-flex-acl-test --only-show-errors".into(),
            "az disk delete --resource-group acl-rg --name aks-flex-acl-test --only-show-errors --yes".into(),
            format!("qemu-img convert -f vpc -O qcow2 {} {}", vhd.display(), d.path().join("acl/ACLDEVEL/acl-1es-eval-kvm/3.20261019.3.qcow2.part").display()),
        ];
        assert_eq!(calls, expected);
        assert_eq!(*f.seen.lock().unwrap(), [SAS]);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert!(!text.contains("T0pS3cr3t"), "{text}");
        assert!(
            text.contains("downloading the VHD of aks-flex-acl-test: done in"),
            "{text}"
        );

        // A second run finds the cache and asks nothing.
        r.0.clear();
        let again = ensure(&r, &f, &opts(d.path()), &p).await.unwrap();
        assert_eq!(again, path);
        assert!(r.0.calls().is_empty(), "{:?}", r.0.calls());
    }

    /// A failed download still revokes the SAS and deletes the disk; the error names neither
    /// the SAS nor its signature.
    #[tokio::test]
    async fn cleanup_on_a_failed_download() {
        let d = tempfile::tempdir().unwrap();
        let r = runner();
        let f = FakeFetch {
            fail: true,
            seen: Mutex::default(),
        };
        let mut o = opts(d.path());
        o.gallery_resource_group = Some("acl-rg".into());
        o.resource_group = Some("scratch-rg".into());
        o.subscription = Some("sub-2".into());
        o.location = Some("westus3".into());
        let (p, out) = progress();
        let e = ensure(&r, &f, &o, &p).await.unwrap_err();
        let text = format!("{e:#} {e:?}");
        assert!(text.contains("connection reset"), "{text}");
        assert!(!text.contains("T0pS3cr3t"), "{text}");
        assert!(text.contains("?***REDACTED***"), "{text}");
        let calls = r.0.calls();
        let verbs: Vec<String> = calls
            .iter()
            .map(|c| c.split(" --").next().unwrap().to_string())
            .collect();
        assert_eq!(
            verbs,
            [
                "az account show",
                "az sig image-version show",
                "az sig image-definition show",
                "az disk create",
                "az disk grant-access",
                "az disk revoke-access",
                "az disk delete",
            ]
        );
        assert!(calls[0].contains("--subscription sub-2"), "{}", calls[0]);
        assert!(
            calls[3].contains("--resource-group scratch-rg"),
            "{}",
            calls[3]
        );
        assert!(calls[3].contains("--location westus3"), "{}", calls[3]);
        assert!(calls.iter().all(|c| !c.contains("sig=")), "{calls:?}");
        let log = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert!(
            log.contains("downloading the VHD of aks-flex-acl-test: failed after"),
            "{log}"
        );
        assert!(!log.contains("T0pS3cr3t"), "{log}");
        let dir = d.path().join("acl/ACLDEVEL/acl-1es-eval-kvm");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "partial files left"
        );
    }

    /// A failed `az disk create` still deletes (a create that timed out may have made the disk),
    /// but revokes nothing.
    #[tokio::test]
    async fn cleanup_on_a_failed_create() {
        let d = tempfile::tempdir().unwrap();
        let r = runner();
        r.0.on(
            "az disk create",
            Output::failed(1, "ERROR: (ResourceNotFound) region"),
        );
        r.0.on("az disk delete", Output::failed(1, "ERROR: throttled"));
        let f = FakeFetch {
            fail: false,
            seen: Mutex::default(),
        };
        let (p, _) = progress();
        let e = ensure(&r, &f, &opts(d.path()), &p).await.unwrap_err();
        let text = format!("{e:#}");
        assert!(text.contains("ResourceNotFound"), "{text}");
        assert!(text.contains("delete it by hand: az disk delete"), "{text}");
        let calls = r.0.calls();
        assert!(calls.iter().any(|c| c.starts_with("az disk delete")));
        assert!(!calls.iter().any(|c| c.starts_with("az disk grant-access")));
        assert!(!calls.iter().any(|c| c.starts_with("az disk revoke-access")));
        assert!(f.seen.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn az_missing_or_logged_out_is_said_plainly() {
        let d = tempfile::tempdir().unwrap();
        let f = FakeFetch {
            fail: false,
            seen: Mutex::default(),
        };
        let (p, _) = progress();
        let r = runner();
        r.0.without("az");
        let e = ensure(&r, &f, &opts(d.path()), &p).await.unwrap_err();
        assert!(format!("{e:#}").contains("`az`) is not installed"), "{e:#}");
        let r = runner();
        r.0.on(
            "az account show",
            Output::failed(1, "ERROR: Please run 'az login' to setup account."),
        );
        let e = ensure(&r, &f, &opts(d.path()), &p).await.unwrap_err();
        let text = format!("{e:#}");
        assert!(text.contains("not logged in"), "{text}");
        assert!(text.contains("az login"), "{text}");
        assert_eq!(r.0.calls().len(), 1);
    }

    #[tokio::test]
    async fn latest_asks_the_gallery_then_uses_the_cache() {
        let d = tempfile::tempdir().unwrap();
        let cached = cache_path(d.path(), "ACLDEVEL", "acl-1es-eval-kvm", "3.20261101.1");
        std::fs::create_dir_all(cached.parent().unwrap()).unwrap();
        std::fs::write(&cached, b"QFI\xfb").unwrap();
        let r = runner();
        r.0.on(
            "az sig image-version list",
            Output::ok(
                r#"[{"name":"3.20261019.3","id":"a","provisioningState":"Succeeded","publishingProfile":{"excludeFromLatest":false}},
                    {"name":"3.20261101.1","id":"b","provisioningState":"Succeeded","publishingProfile":{"excludeFromLatest":false}},
                    {"name":"3.20261201.1","id":"c","provisioningState":"Succeeded","publishingProfile":{"excludeFromLatest":true}}]"#,
            ),
        );
        let f = FakeFetch {
            fail: false,
            seen: Mutex::default(),
        };
        let mut o = opts(d.path());
        o.version = VersionRequest::Latest;
        let (p, out) = progress();
        assert_eq!(ensure(&r, &f, &o, &p).await.unwrap(), cached);
        let calls = r.0.calls();
        assert_eq!(calls.len(), 3, "{calls:?}");
        assert!(calls[2].starts_with("az sig image-version list"));
        let log = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert!(
            log.contains("latest ACLDEVEL/acl-1es-eval-kvm is 3.20261101.1"),
            "{log}"
        );
    }

    #[test]
    fn version_selection() {
        let v = |n: &str, ex: bool, st: &str| ImageVersion {
            name: n.into(),
            id: n.into(),
            exclude_from_latest: ex,
            state: st.into(),
        };
        let list = vec![
            v("3.20261019.3", false, "Succeeded"),
            v("3.20261019.10", false, "Succeeded"),
            v("4.0.0", true, "Succeeded"),
            v("3.30000000.0", false, "Failed"),
            v("3.9.0", false, "Succeeded"),
        ];
        assert_eq!(latest(&list).unwrap().name, "3.20261019.10");
        assert!(latest(&[v("1.0.0", true, "Succeeded")]).is_none());
        assert_eq!(compare_versions("3.9.0", "3.10.0"), Ordering::Less);
        let parsed = parse_versions(
            r#"[{"name":"1.2.3","id":"x","publishingProfile":{"excludeFromLatest":true}},{"id":"no-name"}]"#,
        )
        .unwrap();
        assert_eq!(parsed.len(), 1);
        assert_eq!(
            (parsed[0].name.as_str(), parsed[0].id.as_str()),
            ("1.2.3", "x")
        );
        assert!(parsed[0].exclude_from_latest);
    }

    #[test]
    fn requests_and_cache_decisions() {
        assert_eq!(parse_request(None).unwrap(), None);
        assert_eq!(parse_request(Some("0")).unwrap(), None);
        let default = Some((DEFAULT_GALLERY.to_string(), DEFAULT_IMAGE.to_string()));
        assert_eq!(parse_request(Some("")).unwrap(), default);
        assert_eq!(parse_request(Some("1")).unwrap(), default);
        assert_eq!(
            parse_request(Some("G/img")).unwrap(),
            Some(("G".into(), "img".into()))
        );
        assert!(parse_request(Some("just-a-name")).is_err());
        assert_eq!(
            version_request(None, None),
            VersionRequest::Exact(DEFAULT_VERSION.into())
        );
        assert_eq!(version_request(None, Some("")), VersionRequest::Latest);
        assert_eq!(
            version_request(Some("latest"), Some("1.0.0")),
            VersionRequest::Latest
        );
        assert_eq!(
            version_request(Some("2.0.0"), Some("")),
            VersionRequest::Exact("2.0.0".into())
        );
        let root = Path::new("/c");
        let p = cache_path(root, "G", "I", "1.0.0");
        assert_eq!(p, Path::new("/c/acl/G/I/1.0.0.qcow2"));
        let exact = VersionRequest::Exact("1.0.0".into());
        assert_eq!(
            cache_decision(root, "G", "I", &exact, &|_| true),
            CacheDecision::Cached(p.clone())
        );
        assert_eq!(
            cache_decision(root, "G", "I", &exact, &|_| false),
            CacheDecision::Export("1.0.0".into(), p)
        );
        assert_eq!(
            cache_decision(root, "G", "I", &VersionRequest::Latest, &|_| true),
            CacheDecision::AskLatest
        );
        assert_eq!(
            security_type(
                r#"{"features":[{"name":"SecurityType","value":"TrustedLaunchSupported"}]}"#
            ),
            None
        );
        assert_eq!(
            security_type(r#"{"features":[{"name":"SecurityType","value":"TrustedLaunch"}]}"#)
                .as_deref(),
            Some("TrustedLaunch")
        );
        assert!(sas_of(r#"{"accessSAS":"https://x/y?sig=1"}"#).is_some());
        assert!(sas_of("not json").is_none());
    }
}
