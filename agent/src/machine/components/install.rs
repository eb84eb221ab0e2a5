//! [`install_components`]: installs every component of a [`ComponentPlan`] into a rootfs.
//!
//! Components are independent and run concurrently; every failure is reported
//! ([`ComponentsError::Failed`]). For each component:
//! 1. its skip rule ([`SkipRule`]): the `--version` probe runs through the host's
//!    [`Runner`](flex_host::runner::Runner) as the binary's symlink-free host path inside the
//!    rootfs (`<rootfs>/usr/local/bin/kubelet --version`); a probe that cannot run counts as
//!    "not installed";
//! 2. otherwise its artifacts are fetched into a staging directory inside the rootfs
//!    (`<rootfs>/.aks-flex-node-staging-*`, removed afterwards) or read from the offline
//!    bundle; Kubernetes binaries are all checked against their `.sha256` before any is
//!    installed, so a mismatch leaves the installed binaries as they were;
//! 3. files are written through [`ConfinedFs::install`](flex_host::fs::ConfinedFs::install):
//!    temporary file, mode 0755, rename; missing directories are created 0755.
//!
//! The rootfs comes from an image, so everything done inside it — the skip rules' checks and
//! reads, the probe's path, every write — goes through
//! [`HostFs::confined`](flex_host::fs::HostFs::confined): the image's symlinks are resolved inside
//! the rootfs (an absolute one from the rootfs's root, as the machine sees it), one climbing out
//! of it fails the install step, and none is ever followed onto the host.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::future::join_all;

use super::archive::{self, BINARY_MODE, InstallMemberError};
use super::download;
use super::error::{ComponentError, ComponentsError, Failure, Step};
use super::offline::{self, ArtifactFetcher, BundleIndex, OciArtifactFetcher};
use super::plan::{ComponentPlan, PlanSource};
use super::spec::{
    Binary, Checksum, Component, ComponentSpec, Location, Members, Payload, SkipRule,
};
use flex_host::context::Host;
use flex_host::fs::ConfinedFs;
use flex_host::retry::Backoff;
use flex_host::runner::Cmd;

/// Name prefix of the staging directory created inside the rootfs.
pub const STAGING_PREFIX: &str = ".aks-flex-node-staging-";

/// Deadline of one `--version` probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// What happened to each component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstallReport {
    /// One entry per component, in plan order.
    pub components: Vec<ComponentReport>,
}

impl InstallReport {
    /// The entry of `component`.
    pub fn get(&self, component: Component) -> Option<&ComponentReport> {
        self.components.iter().find(|c| c.component == component)
    }

    /// Whether nothing was written.
    pub fn all_already_installed(&self) -> bool {
        self.components
            .iter()
            .all(|c| c.outcome == Outcome::AlreadyInstalled)
    }
}

/// One component's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentReport {
    /// The component.
    pub component: Component,
    /// Its version, when known.
    pub version: Option<String>,
    /// Skipped or installed.
    pub outcome: Outcome,
}

/// Whether a component was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Its skip rule held; nothing was fetched.
    AlreadyInstalled,
    /// These files (host paths) were written.
    Installed {
        /// Host paths, in install order.
        files: Vec<PathBuf>,
    },
}

/// Installs the plan's components into `rootfs` (a host path, e.g.
/// `/var/lib/machines/kube1`; it must exist, the image pull creates it), fetching `oci://` offline bundles with
/// [`OciArtifactFetcher`].
pub async fn install_components(
    host: &Host,
    http: &reqwest::Client,
    registry: &flex_oci::RegistryClient,
    rootfs: &Path,
    plan: &ComponentPlan,
) -> Result<InstallReport, ComponentsError> {
    let fetcher = OciArtifactFetcher::new(registry.clone());
    install_components_with(host, http, &fetcher, rootfs, plan).await
}

/// [`install_components`] with the given fetcher for `oci://` offline bundles.
pub async fn install_components_with(
    host: &Host,
    http: &reqwest::Client,
    fetcher: &dyn ArtifactFetcher,
    rootfs: &Path,
    plan: &ComponentPlan,
) -> Result<InstallReport, ComponentsError> {
    if !host.fs.path(rootfs).is_dir() {
        // Not created here: a non-empty directory would stop the image pull that builds it.
        return Err(ComponentsError::RootfsMissing(rootfs.to_path_buf()));
    }
    let tree = host
        .fs
        .confined(rootfs)
        .map_err(|_| ComponentsError::RootfsMissing(rootfs.to_path_buf()))?;
    let staging = tempfile::Builder::new()
        .prefix(STAGING_PREFIX)
        .tempdir_in(host.fs.path(rootfs))
        .map_err(|e| ComponentsError::Staging(e.to_string()))?;
    let (specs, _bundle) = match &plan.source {
        PlanSource::Online { specs, .. } => (specs.clone(), None),
        PlanSource::Offline {
            source,
            versions,
            npd,
        } => {
            let bundle = offline::materialize(&host.fs, fetcher, source, staging.path()).await?;
            let index = BundleIndex::from_dir(&bundle.root)
                .map_err(|e| ComponentsError::Offline(format!("cannot list the bundle: {e}")))?;
            let mut specs = offline::bundle_specs(&index, &bundle.root, versions, &plan.arch)?;
            specs.extend(offline::bundle_npd(&index, &bundle.root, npd, &plan.arch));
            (specs, Some(bundle))
        }
    };
    let ctx = Ctx {
        host,
        http,
        rootfs,
        tree,
        staging: staging.path(),
        retry: &plan.retry,
    };
    let results = join_all(specs.iter().map(|s| install_one(&ctx, s))).await;
    let mut components = Vec::new();
    let mut failures = Vec::new();
    for r in results {
        match r {
            Ok(report) => components.push(report),
            // node-problem-detector watches the node; the node works without it.
            Err(errs) if errs.iter().all(|e| e.component == Component::Npd) => {
                for e in errs {
                    tracing::warn!(error = %e, "node-problem-detector is not installed; the node starts without it");
                }
            }
            Err(errs) => failures.extend(errs),
        }
    }
    if failures.is_empty() {
        Ok(InstallReport { components })
    } else {
        Err(ComponentsError::Failed(failures))
    }
}

struct Ctx<'a> {
    host: &'a Host,
    http: &'a reqwest::Client,
    /// The rootfs's host path (for reports).
    rootfs: &'a Path,
    /// The rootfs, confined: every access inside it.
    tree: ConfinedFs,
    staging: &'a Path,
    retry: &'a Backoff,
}

fn failure(
    component: Component,
    step: Step,
    location: &Location,
    failure: Failure,
) -> ComponentError {
    ComponentError {
        component,
        step,
        location: location.to_string(),
        failure,
    }
}

async fn install_one(
    ctx: &Ctx<'_>,
    spec: &ComponentSpec,
) -> Result<ComponentReport, Vec<ComponentError>> {
    let c = spec.component;
    let version = spec.version.as_deref().unwrap_or("from bundle");
    if already_installed(ctx, &spec.skip).await {
        tracing::info!(component = c.name(), version, "already installed");
        return Ok(ComponentReport {
            component: c,
            version: spec.version.clone(),
            outcome: Outcome::AlreadyInstalled,
        });
    }
    let started = Instant::now();
    let from = spec
        .payload
        .locations()
        .first()
        .map(|l| l.to_string())
        .unwrap_or_default();
    tracing::info!(component = c.name(), version, from, "installing");
    let files = match &spec.payload {
        Payload::Verified(bins) => install_verified(ctx, c, bins).await?,
        Payload::Archive {
            source,
            members,
            dest_dir,
            checksum,
        } => install_archive(ctx, c, source, members, dest_dir, checksum.as_ref())
            .await
            .map_err(|e| vec![e])?,
        Payload::File { source, dest } => {
            let staged = stage(ctx, c, source, "file").await.map_err(|e| vec![e])?;
            vec![
                install_from(ctx, c, source, &staged.0, dest)
                    .await
                    .map_err(|e| vec![e])?,
            ]
        }
    };
    tracing::info!(
        component = c.name(),
        version,
        files = files.len(),
        duration_ms = started.elapsed().as_millis() as u64,
        "installed"
    );
    Ok(ComponentReport {
        component: c,
        version: spec.version.clone(),
        outcome: Outcome::Installed { files },
    })
}

/// Whether `rel` is an executable regular file inside the rootfs (a symlink there is not: the
/// install replaces it).
fn is_executable(tree: &ConfinedFs, rel: &Path) -> bool {
    matches!(
        tree.entry(rel),
        Ok(Some(e)) if e.kind == rustix::fs::FileType::RegularFile && e.mode & 0o111 != 0
    )
}

async fn already_installed(ctx: &Ctx<'_>, rule: &SkipRule) -> bool {
    match rule {
        SkipRule::Version {
            executables,
            probe,
            expect,
        } => {
            if !executables.iter().all(|p| is_executable(&ctx.tree, p)) {
                return false;
            }
            // The probe runs the binary the rootfs holds at `probe`, by its symlink-free host
            // path, never a host binary an image link points at.
            let Ok(Some(real)) = ctx.tree.resolved_host_path(probe) else {
                return false;
            };
            let cmd = Cmd::new(real.to_string_lossy())
                .arg("--version")
                .timeout(PROBE_TIMEOUT);
            match ctx.host.runner.output(&cmd).await {
                Ok(out) if out.success() => {
                    let ok = expect.matches(&out.stdout);
                    if !ok {
                        tracing::debug!(argv = %cmd, stdout = out.stdout_trimmed(), "installed version differs");
                    }
                    ok
                }
                Ok(out) => {
                    tracing::debug!(argv = %cmd, code = ?out.code, "version probe failed");
                    false
                }
                Err(e) => {
                    tracing::debug!(error = %e, "version probe could not run");
                    false
                }
            }
        }
        SkipRule::SameContent { installed, source } => {
            if !is_executable(&ctx.tree, installed) {
                return false;
            }
            let (tree, installed, source) = (ctx.tree.clone(), installed.clone(), source.clone());
            tokio::task::spawn_blocking(move || {
                let installed = match tree.open(&installed) {
                    Ok(Some(f)) => download::sha256_reader(f),
                    Ok(None) => return false,
                    Err(e) => Err(std::io::Error::other(e)),
                };
                match (installed, download::sha256_file(&source)) {
                    (Ok(a), Ok(b)) => a == b,
                    _ => false,
                }
            })
            .await
            .unwrap_or(false)
        }
    }
}

/// Fetches `source` into the staging directory (or uses the bundle file in place); returns the
/// real path and the SHA-256 of its bytes.
async fn stage(
    ctx: &Ctx<'_>,
    c: Component,
    source: &Location,
    name: &str,
) -> Result<(PathBuf, String), ComponentError> {
    match source {
        Location::Url(url) => {
            let dest = ctx.staging.join(format!("{}-{name}", c.name()));
            let sum = download::download_to_file(ctx.http, url, &dest, ctx.retry, c.name())
                .await
                .map_err(|f| failure(c, Step::Download, source, f))?;
            Ok((dest, sum))
        }
        Location::File(p) => {
            let path = p.clone();
            let sum = tokio::task::spawn_blocking(move || download::sha256_file(&path))
                .await
                .map_err(|e| {
                    failure(
                        c,
                        Step::Download,
                        source,
                        Failure::Io(std::io::Error::other(e)),
                    )
                })?
                .map_err(|e| failure(c, Step::Download, source, Failure::Io(e)))?;
            Ok((p.clone(), sum))
        }
    }
}

/// Writes the staged file `staged` to `dest` (rootfs-relative), mode 0755; returns the host
/// path.
async fn install_from(
    ctx: &Ctx<'_>,
    c: Component,
    source: &Location,
    staged: &Path,
    dest: &Path,
) -> Result<PathBuf, ComponentError> {
    let tree = ctx.tree.clone();
    let staged = staged.to_path_buf();
    let target = dest.to_path_buf();
    let dest = ctx.rootfs.join(dest);
    tokio::task::spawn_blocking(move || -> Result<(), Failure> {
        if let Some(parent) = target.parent() {
            tree.create_dir_all_mode(parent, BINARY_MODE)?;
        }
        let mut file = std::fs::File::open(&staged)?;
        tree.install(&target, &mut file, BINARY_MODE)?;
        Ok(())
    })
    .await
    .map_err(|e| Failure::Io(std::io::Error::other(e)))
    .and_then(|r| r)
    .map_err(|f| failure(c, Step::Install, source, f))?;
    Ok(dest)
}

async fn checksum_of(ctx: &Ctx<'_>, c: Component, b: &Binary) -> Result<String, ComponentError> {
    checksum_at(ctx, c, &b.checksum, &b.name).await
}

/// The hex SHA-256 that the `.sha256` file at `at` gives for `name`.
async fn checksum_at(
    ctx: &Ctx<'_>,
    c: Component,
    at: &Location,
    name: &str,
) -> Result<String, ComponentError> {
    let err = |f| failure(c, Step::DownloadChecksum, at, f);
    match at {
        Location::Url(url) => download::fetch_checksum(ctx.http, url, ctx.retry, name)
            .await
            .map_err(err),
        Location::File(p) => {
            let bytes = std::fs::read(p).map_err(|e| err(Failure::Io(e)))?;
            download::parse_checksum(&bytes).map_err(err)
        }
    }
}

/// Fetches and verifies every binary, then installs them all.
async fn install_verified(
    ctx: &Ctx<'_>,
    c: Component,
    bins: &[Binary],
) -> Result<Vec<PathBuf>, Vec<ComponentError>> {
    let staged = join_all(bins.iter().map(|b| async move {
        let expected = checksum_of(ctx, c, b).await?;
        let (path, actual) = stage(ctx, c, &b.source, &b.name).await?;
        if actual != expected {
            return Err(failure(
                c,
                Step::Verify,
                &b.source,
                Failure::ChecksumMismatch {
                    binary: b.name.clone(),
                    expected,
                    actual,
                },
            ));
        }
        Ok((b, path))
    }))
    .await;
    let (ok, errors): (Vec<_>, Vec<_>) = staged.into_iter().partition(Result::is_ok);
    let errors: Vec<ComponentError> = errors.into_iter().filter_map(Result::err).collect();
    if !errors.is_empty() {
        return Err(errors);
    }
    let mut files = Vec::new();
    for (b, path) in ok.into_iter().filter_map(Result::ok) {
        files.push(
            install_from(ctx, c, &b.source, &path, &b.dest)
                .await
                .map_err(|e| vec![e])?,
        );
    }
    Ok(files)
}

async fn install_archive(
    ctx: &Ctx<'_>,
    c: Component,
    source: &Location,
    members: &Members,
    dest_dir: &Path,
    checksum: Option<&Checksum>,
) -> Result<Vec<PathBuf>, ComponentError> {
    let expected = match checksum {
        None => None,
        Some(Checksum::Pinned(hex)) => Some(hex.to_ascii_lowercase()),
        Some(Checksum::File(at)) => Some(checksum_at(ctx, c, at, "archive").await?),
    };
    let (path, actual) = stage(ctx, c, source, "archive").await?;
    if let Some(expected) = expected.filter(|e| *e != actual) {
        return Err(failure(
            c,
            Step::Verify,
            source,
            Failure::ChecksumMismatch {
                binary: "archive".into(),
                expected,
                actual,
            },
        ));
    }
    let tree = ctx.tree.clone();
    let rootfs = ctx.rootfs.to_path_buf();
    let dest_dir = dest_dir.to_path_buf();
    let members = members.clone();
    tokio::task::spawn_blocking(move || {
        let chosen = archive::select_members(&path, &members).map_err(|f| (Step::Extract, f))?;
        if !dest_dir.as_os_str().is_empty() {
            tree.create_dir_all_mode(&dest_dir, BINARY_MODE)
                .map_err(|e| (Step::Install, Failure::Fs(e)))?;
        }
        archive::install_members(&path, &chosen, &tree, &dest_dir)
            .map(|written| written.iter().map(|rel| rootfs.join(rel)).collect())
            .map_err(|e| match e {
                InstallMemberError::Read(f) => (Step::Extract, f),
                InstallMemberError::Write(f) => (Step::Install, f),
            })
    })
    .await
    .map_err(|e| (Step::Install, Failure::Io(std::io::Error::other(e))))
    .and_then(|r| r)
    .map_err(|(step, f)| failure(c, step, source, f))
}
