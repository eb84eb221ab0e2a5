//! Offline artifacts (`bootstrap.offlineArtifacts.source`): template expansion, the source
//! kinds, getting the bundle onto disk and finding each component's files in it.
//!
//! The source is a Go template with `{{ .KubernetesVersion }}` (`v1.35.0`, always with the
//! `v`) and `{{ .KubernetesVersionNoV }}` (`1.35.0`); spaces inside the braces are optional.
//! Expanded, it is one of:
//! - an absolute host path or a `file://` URL naming a directory that holds the bundle, or a
//!   `.tar.gz`/`.tgz` file that is extracted into a scratch directory first (host paths are
//!   read through the [`HostFs`] root);
//! - an `oci://` reference, fetched by an [`ArtifactFetcher`] ([`OciArtifactFetcher`] in
//!   production) into a scratch directory.
//!
//! The bundle layout is documented in `docs/offline-artifacts.md`: files named as the upstream
//! release assets at the bundle's root (or inside its single top-level directory),
//! `kubernetes/<bin>` and `kubernetes/<bin>.sha256`. A component's version is taken from the
//! file name when neither the config nor a download override gives one. Every component then
//! comes from the bundle; nothing is downloaded.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use async_trait::async_trait;

use super::archive;
use super::error::ComponentsError;
use super::spec::{
    Checksum, Component, ComponentSpec, KUBE_BINARIES, Location, cni_spec, containerd_spec,
    crictl_spec, kubernetes_spec, npd_asset, npd_spec, runc_spec,
};
use super::versions::{RequestedVersions, is_version, strip_v};
use crate::config::NpdConfig;
use flex_host::fs::HostFs;
use flex_host::secret::redact_url;
use flex_oci::{ImageSource, OciError, RegistryClient};

/// The config field the source comes from (every error about it names it).
pub const SOURCE_FIELD: &str = "bootstrap.offlineArtifacts.source";

/// Expands the source template. `kubernetes_version` may be given with or without its `v`.
/// Anything between `{{` and `}}` other than the two variables is an error, as is an
/// unclosed `{{`.
pub fn expand_source_template(
    template: &str,
    kubernetes_version: &str,
) -> Result<String, ComponentsError> {
    let no_v = strip_v(kubernetes_version);
    let with_v = format!("v{no_v}");
    let mut out = String::with_capacity(template.len() + 16);
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            return Err(ComponentsError::Offline(format!(
                "unclosed '{{{{' in template {template:?}"
            )));
        };
        match after[..end].trim() {
            ".KubernetesVersion" => out.push_str(&with_v),
            ".KubernetesVersionNoV" => out.push_str(no_v),
            other => {
                return Err(ComponentsError::Offline(format!(
                    "unknown template action {{{{ {other} }}}} (supported: \
                     {{{{ .KubernetesVersion }}}}, {{{{ .KubernetesVersionNoV }}}})"
                )));
            }
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// An expanded offline artifacts source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OfflineSource {
    /// A directory (host path) holding the bundle.
    Directory(PathBuf),
    /// A `.tar.gz`/`.tgz` file (host path) holding the bundle.
    Archive(PathBuf),
    /// An OCI artifact, the reference as written (`oci://registry/repo:tag`).
    Oci(String),
}

impl OfflineSource {
    /// Classifies an expanded source: absolute path or `file://` URL (a directory unless the
    /// name ends in `.tar.gz`/`.tgz`), or `oci://`. Anything else is an error naming
    /// [`SOURCE_FIELD`].
    pub fn parse(expanded: &str) -> Result<Self, ComponentsError> {
        let s = expanded.trim();
        let lower = s.to_ascii_lowercase();
        let path = if s.starts_with('/') {
            PathBuf::from(s)
        } else if lower.starts_with("file:") {
            let url = url::Url::parse(s).map_err(|e| {
                ComponentsError::Offline(format!("{s:?} is not a valid file:// URL: {e}"))
            })?;
            url.to_file_path().map_err(|()| {
                ComponentsError::Offline(format!(
                    "{s:?} must name an absolute local path (file:///path)"
                ))
            })?
        } else if lower.starts_with("oci://") {
            if s.len() <= "oci://".len() {
                return Err(ComponentsError::Offline(
                    "oci:// reference has no repository".into(),
                ));
            }
            return Ok(OfflineSource::Oci(s.to_string()));
        } else {
            return Err(ComponentsError::Offline(format!(
                "{:?} is not an absolute path, a file:// URL or an oci:// reference",
                redact_url(s)
            )));
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        Ok(if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
            OfflineSource::Archive(path)
        } else {
            OfflineSource::Directory(path)
        })
    }
}

/// Fetches OCI artifacts (the seam for `oci://` offline sources).
#[async_trait]
pub trait ArtifactFetcher: Send + Sync {
    /// Fetches `reference` (`oci://registry/repo:tag`) and leaves its files in `dest_dir`
    /// (created if missing). The error must not contain secrets.
    async fn fetch(&self, reference: &str, dest_dir: &Path) -> Result<(), OciError>;

    /// Checks that `reference`'s manifest can be resolved, without fetching its layers (for
    /// preflight).
    async fn check(&self, reference: &str) -> Result<(), OciError>;
}

/// The real [`ArtifactFetcher`]: [`flex_oci::fetch_artifact`] and
/// [`flex_oci::manifest_reachable`] through a [`RegistryClient`] over the agent's HTTP
/// client (anonymous, or with `bootstrap.registryAuth`'s credentials when a registry asks;
/// plain HTTP only for the registries the client lists as insecure; retries).
#[derive(Clone, Debug)]
pub struct OciArtifactFetcher {
    registry: RegistryClient,
}

impl OciArtifactFetcher {
    /// A fetcher through `registry` (the node's client, with `bootstrap.insecureRegistries` and
    /// `bootstrap.registryAuth`).
    pub fn new(registry: RegistryClient) -> Self {
        Self { registry }
    }
}

#[async_trait]
impl ArtifactFetcher for OciArtifactFetcher {
    async fn fetch(&self, reference: &str, dest_dir: &Path) -> Result<(), OciError> {
        let source = ImageSource::parse(reference)?;
        flex_oci::fetch_artifact(&self.registry, &source, dest_dir)
            .await
            .map(|_| ())
    }

    async fn check(&self, reference: &str) -> Result<(), OciError> {
        let source = ImageSource::parse(reference)?;
        flex_oci::manifest_reachable(&self.registry, &source, flex_oci::Arch::host())
            .await
            .map(|_| ())
    }
}

/// A bundle on disk; a scratch copy is removed on drop.
pub(crate) struct Bundle {
    /// The directory holding the bundle files (real path).
    pub root: PathBuf,
    _scratch: Option<tempfile::TempDir>,
}

/// Gets the bundle onto disk: a directory is used in place; an archive is extracted and an
/// OCI artifact fetched into a scratch directory under `staging` (a real path).
pub(crate) async fn materialize(
    fs: &HostFs,
    fetcher: &dyn ArtifactFetcher,
    source: &OfflineSource,
    staging: &Path,
) -> Result<Bundle, ComponentsError> {
    let scratch = || {
        tempfile::Builder::new()
            .prefix("bundle-")
            .tempdir_in(staging)
            .map_err(|e| ComponentsError::Staging(e.to_string()))
    };
    match source {
        OfflineSource::Directory(p) => {
            let real = fs.path(p);
            match std::fs::metadata(&real) {
                Ok(m) if m.is_dir() => Ok(Bundle {
                    root: real,
                    _scratch: None,
                }),
                Ok(_) => Err(ComponentsError::Offline(format!(
                    "{} is not a directory (an archive must end in .tar.gz or .tgz)",
                    p.display()
                ))),
                Err(e) => Err(ComponentsError::Offline(format!("{}: {e}", p.display()))),
            }
        }
        OfflineSource::Archive(p) => {
            let real = fs.path(p);
            let dir = scratch()?;
            let dest = dir.path().to_path_buf();
            let shown = p.display().to_string();
            tokio::task::spawn_blocking(move || archive::extract_all(&real, &dest))
                .await
                .map_err(|e| ComponentsError::Offline(format!("extract {shown}: {e}")))?
                .map_err(|e| ComponentsError::Offline(format!("extract {shown}: {e}")))?;
            Ok(Bundle {
                root: single_top_dir(dir.path()),
                _scratch: Some(dir),
            })
        }
        OfflineSource::Oci(reference) => {
            // Fetched one level down, so that the fetcher's own scratch files (next to the
            // destination) stay inside the scratch directory too.
            let dir = scratch()?;
            let dest = dir.path().join("bundle");
            std::fs::create_dir(&dest).map_err(|e| ComponentsError::Staging(e.to_string()))?;
            fetcher
                .fetch(reference, &dest)
                .await
                .map_err(|e| ComponentsError::Offline(format!("fetch {reference}: {e}")))?;
            Ok(Bundle {
                root: single_top_dir(&dest),
                _scratch: Some(dir),
            })
        }
    }
}

/// `dir`, or its only entry when that is a directory and `dir` has no `kubernetes/`.
pub(crate) fn single_top_dir(dir: &Path) -> PathBuf {
    if dir.join("kubernetes").is_dir() {
        return dir.to_path_buf();
    }
    let entries: Vec<_> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(Result::ok).collect(),
        Err(_) => return dir.to_path_buf(),
    };
    match entries.as_slice() {
        [only] if only.path().is_dir() => only.path(),
        _ => dir.to_path_buf(),
    }
}

/// Deepest file looked at in a bundle directory (`kubernetes/v1.35.0/bin/linux/amd64/kubelet`).
const MAX_BUNDLE_DEPTH: usize = 6;

/// The files of a bundle, as `/`-separated names relative to its root.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct BundleIndex {
    files: BTreeSet<String>,
}

impl BundleIndex {
    /// The regular files (symlinks followed) under `root`, at most [`MAX_BUNDLE_DEPTH`] deep.
    pub(crate) fn from_dir(root: &Path) -> std::io::Result<Self> {
        fn walk(
            dir: &Path,
            prefix: &str,
            depth: usize,
            files: &mut BTreeSet<String>,
        ) -> std::io::Result<()> {
            for entry in std::fs::read_dir(dir)? {
                let entry = entry?;
                let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
                match std::fs::metadata(entry.path()) {
                    Ok(m) if m.is_file() => {
                        files.insert(name);
                    }
                    Ok(m) if m.is_dir() && depth < MAX_BUNDLE_DEPTH => {
                        walk(&entry.path(), &format!("{name}/"), depth + 1, files)?;
                    }
                    _ => {}
                }
            }
            Ok(())
        }
        let mut files = BTreeSet::new();
        walk(root, "", 1, &mut files)?;
        Ok(Self { files })
    }

    /// An index from an archive's member names, with a single top-level directory stripped
    /// as [`materialize`] does.
    pub(crate) fn from_archive_names(names: Vec<String>) -> Self {
        let has_kube = names.iter().any(|n| n.starts_with("kubernetes/"));
        let tops: BTreeSet<&str> = names
            .iter()
            .filter_map(|n| n.split_once('/').map(|(t, _)| t))
            .collect();
        let single_dir = !has_kube && tops.len() == 1 && names.iter().all(|n| n.contains('/'));
        let files = names
            .iter()
            .map(|n| match (single_dir, n.split_once('/')) {
                (true, Some((_, rest))) => rest.to_string(),
                _ => n.clone(),
            })
            .collect();
        Self { files }
    }

    fn has(&self, name: &str) -> bool {
        self.files.contains(name)
    }

    /// Files named `name(version)`, at the root or as `<dir>/v<version>/name(version)`, with
    /// a version-like version; root files first.
    fn candidates(
        &self,
        dir: &str,
        name: impl Fn(&str) -> Option<String>,
    ) -> Vec<(String, String)> {
        let mut flat = Vec::new();
        let mut nested = Vec::new();
        for f in &self.files {
            match f.split_once('/') {
                None => {
                    // The version is whatever makes `name(version)` equal the file name.
                    if let Some(v) = version_in(f, &name) {
                        flat.push((f.clone(), v));
                    }
                }
                Some((top, rest)) if top == dir => {
                    let Some((v, file)) = rest.strip_prefix('v').and_then(|r| r.split_once('/'))
                    else {
                        continue;
                    };
                    if is_version(v) && name(v).as_deref() == Some(file) {
                        nested.push((f.clone(), v.to_string()));
                    }
                }
                Some(_) => {}
            }
        }
        flat.extend(nested);
        flat
    }
}

/// The version for which `name(version) == file`, for names of the form
/// `<prefix><version><suffix>` (found by asking `name` for a marker version).
fn version_in(file: &str, name: &impl Fn(&str) -> Option<String>) -> Option<String> {
    const MARK: &str = "\u{0}";
    let pattern = name(MARK)?;
    // A name without the version (`runc.<arch>`) has no marker: no version to find.
    let (prefix, suffix) = pattern.split_once(MARK)?;
    let v = file.strip_prefix(prefix)?.strip_suffix(suffix)?;
    (is_version(v) && name(v).as_deref() == Some(file)).then(|| v.to_string())
}

/// Chooses one of `found` (`(file, version)`, root files first): the one with the `wanted`
/// version, or the only version there is.
fn choose(
    component: Component,
    found: Vec<(String, String)>,
    wanted: Option<&str>,
    missing: String,
) -> Result<(String, String), ComponentsError> {
    let missing = || ComponentsError::MissingBundleFile {
        component,
        file: missing.clone(),
    };
    if let Some(v) = wanted {
        return found
            .into_iter()
            .find(|(_, fv)| fv == v)
            .ok_or_else(missing);
    }
    let versions: BTreeSet<&str> = found.iter().map(|(_, v)| v.as_str()).collect();
    match versions.len() {
        0 => Err(missing()),
        1 => Ok(found[0].clone()),
        _ => Err(ComponentsError::Offline(format!(
            "{component}: several versions in the bundle ({}); set the version in the config",
            versions.into_iter().collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// The spec of `component` from a bundle whose files are listed in `index` and live under
/// `root` (a real path). Each file is looked up by its release-asset name at the bundle's
/// root, then under `<component dir>/v<version>/` (the layout of unbounded's
/// agent-artifacts-builder: `kubernetes/v<ver>/bin/linux/<arch>/<bin>`, `crictl/v<ver>/…`,
/// `containerd/v<ver>/…`, `runc/v<ver>/runc.<arch>`, `cni/v<ver>/…`).
pub(crate) fn bundle_spec(
    component: Component,
    index: &BundleIndex,
    root: &Path,
    versions: &RequestedVersions,
    arch: &str,
) -> Result<ComponentSpec, ComponentsError> {
    let file = |name: &str| Location::File(root.join(name));
    let missing = |name: String| ComponentsError::MissingBundleFile {
        component,
        file: name,
    };
    Ok(match component {
        // Optional: `bundle_npd` looks for it.
        Component::Npd => return Err(missing(npd_asset("v*", arch))),
        Component::Kubernetes => {
            let v = &versions.kubernetes;
            let mut bins = Vec::new();
            for bin in KUBE_BINARIES {
                let flat = format!("kubernetes/{bin}");
                let nested = format!("kubernetes/v{v}/bin/linux/{arch}/{bin}");
                let pick = [&flat, &nested]
                    .into_iter()
                    .find(|p| index.has(p))
                    .ok_or_else(|| missing(flat.clone()))?;
                let sum = format!("{pick}.sha256");
                if !index.has(&sum) {
                    return Err(missing(if pick == &flat {
                        format!("{flat}.sha256")
                    } else {
                        sum
                    }));
                }
                bins.push((bin, file(pick), file(&sum)));
            }
            kubernetes_spec(v, bins)
        }
        Component::Crictl => {
            let name = |v: &str| Some(format!("crictl-v{v}-linux-{arch}.tar.gz"));
            let (f, v) = choose(
                component,
                index.candidates("crictl", name),
                versions.crictl.as_deref(),
                asset_name(versions.crictl.as_deref(), name),
            )?;
            crictl_spec(&v, file(&f))
        }
        Component::Containerd => {
            let name = |v: &str| Some(format!("containerd-{v}-linux-{arch}.tar.gz"));
            let (f, v) = choose(
                component,
                index.candidates("containerd", name),
                versions.containerd.as_deref(),
                asset_name(versions.containerd.as_deref(), name),
            )?;
            containerd_spec(&v, file(&f))
        }
        Component::Cni => {
            let name = |v: &str| Some(format!("cni-plugins-linux-{arch}-v{v}.tgz"));
            let (f, v) = choose(
                component,
                index.candidates("cni", name),
                versions.cni.as_deref(),
                asset_name(versions.cni.as_deref(), name),
            )?;
            cni_spec(&v, file(&f))
        }
        Component::Runc => {
            let flat = format!("runc.{arch}");
            let wanted = versions.runc.as_deref();
            if index.has(&flat) {
                runc_spec(wanted, file(&flat))
            } else {
                let nested: Vec<(String, String)> = index
                    .candidates("runc", |_| Some(flat.clone()))
                    .into_iter()
                    .filter(|(f, _)| f.contains('/'))
                    .collect();
                let (f, v) = choose(component, nested, wanted, flat.clone())?;
                runc_spec(Some(&v), file(&f))
            }
        }
    })
}

/// node-problem-detector from a bundle: its release asset for `npd.version` at the bundle's
/// root or under `npd/<version>/`, checked against `npd.sha256`, else the asset's `.sha256`
/// beside it. `None`, with the reason logged, when the bundle has neither (upstream disables
/// node-problem-detector in offline mode; a bundle that carries it turns it on).
pub(crate) fn bundle_npd(
    index: &BundleIndex,
    root: &Path,
    npd: &NpdConfig,
    arch: &str,
) -> Option<ComponentSpec> {
    let asset = npd_asset(&npd.version, arch);
    let nested = format!("npd/{}/{asset}", npd.version);
    let Some(found) = [&asset, &nested].into_iter().find(|p| index.has(p)) else {
        tracing::info!(
            file = %asset,
            "node-problem-detector is disabled in offline mode: the bundle does not carry it"
        );
        return None;
    };
    let sidecar = format!("{found}.sha256");
    let checksum = if !npd.sha256.is_empty() {
        Checksum::Pinned(npd.sha256.clone())
    } else if index.has(&sidecar) {
        Checksum::File(Location::File(root.join(&sidecar)))
    } else {
        tracing::warn!(
            file = %sidecar,
            "node-problem-detector is disabled: the bundle has no checksum for it and npd.sha256 is not set"
        );
        return None;
    };
    Some(npd_spec(
        &npd.version,
        Location::File(root.join(found)),
        checksum,
    ))
}

/// The asset name for a missing-file error: with the wanted version, or with `*`.
fn asset_name(wanted: Option<&str>, name: impl Fn(&str) -> Option<String>) -> String {
    name(wanted.unwrap_or("*")).unwrap_or_default()
}

/// Every component's spec from a bundle, or every problem found.
pub(crate) fn bundle_specs(
    index: &BundleIndex,
    root: &Path,
    versions: &RequestedVersions,
    arch: &str,
) -> Result<Vec<ComponentSpec>, ComponentsError> {
    let mut specs = Vec::new();
    let mut errors = Vec::new();
    for c in Component::ALL {
        match bundle_spec(c, index, root, versions, arch) {
            Ok(s) => specs.push(s),
            Err(e) => errors.push(e),
        }
    }
    match errors.len() {
        0 => Ok(specs),
        1 => Err(errors.remove(0)),
        _ => Err(ComponentsError::Several(errors)),
    }
}
