//! Machine root file systems from OCI images: pull, verify, unpack.
//!
//! [`pull_rootfs`] builds a machine's root file system from an image in a registry or a local
//! OCI layout ([`ImageSource`]); [`fetch_artifact`] extracts an OCI artifact's tar layers (offline
//! bundles); [`manifest_reachable`] is the preflight check.
//!
//! The steps of [`pull_rootfs`] for `dest = <parent>/<name>`:
//! 1. If `dest` exists and is not empty, nothing is pulled: its marker's [`ImageInfo`] is
//!    returned ([`RootfsStatus::AlreadyPresent`]), or, without a marker, an `ImageInfo` saying
//!    [`RootfsStatus::PreExisting`]. With [`PullOptions::rebuild_owned`] a tree that carries our
//!    marker is rebuilt instead; a tree without it is never touched.
//! 2. The manifest is resolved for `linux/<arch>` and every blob (manifest, config, layers) is
//!    fetched into `<parent>/.<name>.oci-tmp` (an OCI layout) and verified against its digest
//!    (a local layout's blobs are verified in place). A failed download leaves the verified
//!    blobs there, so a retry only fetches what is missing; success, or a failure to apply the
//!    layers, removes the directory.
//! 3. The layers are applied ([`unpack()`]) to `<parent>/.<name>.partial` (a leftover one is
//!    removed first), each layer's uncompressed digest checked against the config's `diff_ids`,
//!    and the marker `.aks-flex-node-rootfs` (JSON: reference, manifest digest, layer digests)
//!    is written into it; the file system is synced.
//! 4. The partial tree is renamed to `dest` (exchanged atomically with the old tree on a
//!    rebuild). A half-unpacked tree is therefore never at `dest`.
//!
//! Pulls of the same `dest` must not run concurrently (the caller serializes them).
//!
//! Modules: [`reference`](mod@reference) (image references), [`digest`], [`manifest`] (documents, media types,
//! platforms), [`registry`] (the registry client), [`auth`] (its credentials: Docker-config files, ACR's exchange), [`layout`] (local OCI layouts),
//! [`unpack`](mod@unpack) (applying layers, safely; path confinement in `flex_host::confine`, shared with the agent's writes into machine trees), [`error`].
//! The tests build their layers with `flex_testkit::layer_builder`; `tests/registry.rs` pulls
//! and pushes against a real registry (Debian's `docker-registry`), and `benches/unpack.rs`
//! times the unpacker against `tar -xzf`.

pub mod auth;
pub mod error;
pub mod layout;
pub mod manifest;
pub mod registry;
pub mod unpack;

use std::io::Read;
use std::path::{Path, PathBuf};

use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tracing::Instrument;

pub use flex_api::image::{digest, reference};

pub use auth::{
    AadTokenSource, AcrExchange, CredentialChain, CredentialError, CredentialSource, DockerConfig,
    DockerConfigError, RegistryCredential,
};
pub use digest::Digest;
pub use error::OciError;
pub use layout::OciLayout;
pub use manifest::{
    Arch, ArchError, Compression, Descriptor, ImageConfig, ImageIndex, ImageManifest,
};
pub use reference::{ImageRef, ImageSource, LayoutTarget, ReferenceError};
pub use registry::{REGISTRY_RETRY, RegistryClient};
pub use unpack::{LayerFile, LayerStats, UnpackError, UnpackOptions, unpack, unpack_layer};

/// The marker file written at the top of every root file system this module builds.
pub const MARKER_FILE: &str = ".aks-flex-node-rootfs";

/// Deepest nesting of indexes followed.
pub const MAX_INDEX_DEPTH: usize = 4;

/// An image manifest resolved for a platform.
#[derive(Clone, Debug)]
pub struct ResolvedImage {
    /// The manifest's digest.
    pub digest: Digest,
    /// The manifest (media types normalized to OCI).
    pub manifest: ImageManifest,
    /// The manifest's bytes as received.
    pub bytes: Vec<u8>,
    /// The index it was selected from, if any.
    pub index_digest: Option<Digest>,
}

/// How [`pull_rootfs`] works.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullOptions {
    /// The platform to select from an index (`linux/<arch>`).
    pub arch: Arch,
    /// Rebuild a non-empty destination that carries our marker (otherwise it is kept).
    pub rebuild_owned: bool,
    /// How layers are applied.
    pub unpack: UnpackOptions,
    /// Blobs downloaded at once.
    pub concurrency: usize,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            arch: Arch::host(),
            rebuild_owned: false,
            unpack: UnpackOptions::default(),
            concurrency: 3,
        }
    }
}

/// What a destination holds after [`pull_rootfs`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RootfsStatus {
    /// Pulled and unpacked by this call.
    #[default]
    Unpacked,
    /// Already built by an earlier pull (its marker says from what); left alone.
    AlreadyPresent,
    /// A non-empty tree we did not build; left alone, nothing known about it.
    PreExisting,
}

/// What was (or is) unpacked at a destination; also the marker file's JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageInfo {
    /// The image source, as given.
    pub reference: String,
    /// The image manifest's digest (`None` for a pre-existing tree).
    pub manifest_digest: Option<Digest>,
    /// The index the manifest was selected from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_digest: Option<Digest>,
    /// The config's digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_digest: Option<Digest>,
    /// The layers' digests, bottom first.
    #[serde(default)]
    pub layers: Vec<Digest>,
    /// The platform the manifest was selected for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<Arch>,
    /// The artifact type (for [`fetch_artifact`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// How this call found or left the destination (not stored in the marker).
    #[serde(skip)]
    pub status: RootfsStatus,
}

impl ImageInfo {
    /// The info for a non-empty destination without our marker.
    pub fn pre_existing(reference: &str) -> Self {
        Self {
            reference: reference.to_string(),
            manifest_digest: None,
            index_digest: None,
            config_digest: None,
            layers: Vec::new(),
            architecture: None,
            artifact_type: None,
            status: RootfsStatus::PreExisting,
        }
    }
}

/// Reads the marker of the tree at `dest`: `None` without one; a marker that does not parse
/// still marks the tree as ours (with an `unknown` reference). Only a regular file counts: a
/// symlink (or FIFO, device…) at the marker's name is not followed and is no marker.
pub fn read_marker(dest: &Path) -> Option<ImageInfo> {
    let bytes = flex_host::fs::ConfinedFs::new(dest)
        .ok()?
        .read(Path::new(MARKER_FILE))
        .ok()??;
    Some(serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        tracing::warn!(dest = %dest.display(), error = %e, "unreadable rootfs marker");
        ImageInfo::pre_existing("unknown")
    }))
}

/// `<parent>/.<name><suffix>` for `dest = <parent>/<name>`.
fn sibling(dest: &Path, suffix: &str, reference: &str) -> Result<PathBuf, OciError> {
    let name = dest.file_name().ok_or_else(|| OciError::Destination {
        reference: reference.to_string(),
        path: dest.to_path_buf(),
        reason: "has no file name".into(),
    })?;
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut n = std::ffi::OsString::from(".");
    n.push(name);
    n.push(suffix);
    Ok(parent.join(n))
}

async fn blocking<T: Send + 'static>(
    reference: &str,
    what: &'static str,
    path: &Path,
    f: impl FnOnce() -> Result<T, OciError> + Send + 'static,
) -> Result<T, OciError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| OciError::Io {
            reference: reference.to_string(),
            op: what,
            path: path.to_path_buf(),
            cause: std::io::Error::other(e),
        })?
}

/// A source's manifest resolved and all its blobs present and verified on disk.
struct Fetched {
    resolved: ResolvedImage,
    config: Vec<u8>,
    layers: Vec<PathBuf>,
}

async fn resolve_source(
    client: &RegistryClient,
    source: &ImageSource,
    arch: Arch,
) -> Result<ResolvedImage, OciError> {
    match source {
        ImageSource::Registry(image) => client.resolve(image, arch).await,
        ImageSource::Layout { dir, tag_or_digest } => {
            let (dir, target, name) = (dir.clone(), tag_or_digest.clone(), source.to_string());
            let d2 = dir.clone();
            blocking(&source.to_string(), "read layout", &d2, move || {
                OciLayout::open(&dir)?.named(name).resolve(&target, arch)
            })
            .await
        }
    }
}

/// Fetches (registry) or verifies (layout) the config and layers of `source`.
async fn fetch_blobs(
    client: &RegistryClient,
    source: &ImageSource,
    tmp: &Path,
    arch: Arch,
    concurrency: usize,
) -> Result<Fetched, OciError> {
    let reference = source.to_string();
    let resolved = resolve_source(client, source, arch).await?;
    let m = &resolved.manifest;
    if m.config.size > manifest::MAX_MANIFEST_BYTES {
        return Err(OciError::Invalid {
            reference,
            what: "config",
            digest: Some(m.config.digest.clone()),
            reason: format!("{} bytes is too large", m.config.size),
        });
    }
    match source {
        ImageSource::Registry(image) => {
            let store = OciLayout::create(tmp)?.named(reference.clone());
            store.add_blob(
                resolved
                    .manifest
                    .media_type
                    .as_deref()
                    .unwrap_or(manifest::media_type::OCI_MANIFEST),
                &resolved.bytes,
            )?;
            let cfg_path = store.blob_path(&m.config.digest);
            client
                .pull_blob(image, &m.config, &cfg_path, "config")
                .await?;
            let config = std::fs::read(&cfg_path).map_err(|e| OciError::Io {
                reference: reference.clone(),
                op: "read",
                path: cfg_path.clone(),
                cause: e,
            })?;
            let layers: Vec<PathBuf> = m
                .layers
                .iter()
                .map(|l| store.blob_path(&l.digest))
                .collect();
            // The futures are built before any await: a lazy `map` closure over borrowed items
            // would make this future's Send-ness depend on higher-ranked lifetimes.
            let pulls: Vec<_> = m
                .layers
                .iter()
                .zip(layers.iter())
                .map(|(desc, path)| client.pull_blob(image, desc, path, "layer"))
                .collect();
            futures::stream::iter(pulls)
                .buffer_unordered(concurrency.max(1))
                .try_collect::<Vec<()>>()
                .await?;
            Ok(Fetched {
                config,
                layers,
                resolved,
            })
        }
        ImageSource::Layout { dir, .. } => {
            let layout = OciLayout::open(dir)?.named(reference.clone());
            let config = layout.read_blob(&m.config, "config")?;
            let descs = m.layers.clone();
            let l2 = layout.clone();
            let layers = blocking(&reference, "verify layers", dir, move || {
                descs
                    .iter()
                    .map(|d| l2.verify_blob(d, "layer"))
                    .collect::<Result<Vec<_>, _>>()
            })
            .await?;
            Ok(Fetched {
                config,
                layers,
                resolved,
            })
        }
    }
}

fn io_err(reference: &str, op: &'static str, path: &Path, cause: std::io::Error) -> OciError {
    OciError::Io {
        reference: reference.to_string(),
        op,
        path: path.to_path_buf(),
        cause,
    }
}

fn remove_if_exists(reference: &str, path: &Path) -> Result<(), OciError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(reference, "stat", path, e)),
        Ok(m) if m.is_dir() => {
            std::fs::remove_dir_all(path).map_err(|e| io_err(reference, "remove", path, e))
        }
        Ok(_) => std::fs::remove_file(path).map_err(|e| io_err(reference, "remove", path, e)),
    }
}

fn is_empty_dir(path: &Path) -> std::io::Result<bool> {
    Ok(std::fs::read_dir(path)?.next().is_none())
}

/// Builds a root file system at `dest` from `source`, as described in the [module docs](self).
pub async fn pull_rootfs(
    client: &RegistryClient,
    source: &ImageSource,
    dest: &Path,
    opts: &PullOptions,
) -> Result<ImageInfo, OciError> {
    let reference = source.to_string();
    let span = tracing::info_span!("pull_rootfs", image = %reference, dest = %dest.display());
    async move {
        let dest_err = |reason: String| OciError::Destination {
            reference: reference.clone(),
            path: dest.to_path_buf(),
            reason,
        };
        let mut rebuild = false;
        match std::fs::symlink_metadata(dest) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&reference, "stat", dest, e)),
            Ok(m) if !m.is_dir() => return Err(dest_err("exists and is not a directory".into())),
            Ok(_) => {
                let empty = is_empty_dir(dest).map_err(|e| io_err(&reference, "read", dest, e))?;
                if !empty {
                    match read_marker(dest) {
                        Some(_) if opts.rebuild_owned => {
                            tracing::info!("rebuilding our root file system");
                            rebuild = true;
                        }
                        Some(mut info) => {
                            // The same image, by digest, when the tree was pulled by a tag that
                            // resolved to it (a machine image pinned after its first pull).
                            let pinned = match source {
                                ImageSource::Registry(r) => r.digest.as_ref().is_some_and(|d| {
                                    info.index_digest.as_ref() == Some(d)
                                        || info.manifest_digest.as_ref() == Some(d)
                                }),
                                ImageSource::Layout { .. } => false,
                            };
                            if info.reference != reference && !pinned {
                                tracing::warn!(
                                    existing = %info.reference,
                                    "destination already holds another image; keeping it"
                                );
                            }
                            info.status = RootfsStatus::AlreadyPresent;
                            return Ok(info);
                        }
                        None => {
                            tracing::info!("destination is not empty and not ours; keeping it");
                            return Ok(ImageInfo::pre_existing(&reference));
                        }
                    }
                }
            }
        }
        let tmp = sibling(dest, ".oci-tmp", &reference)?;
        let partial = sibling(dest, ".partial", &reference)?;
        let fetched = fetch_blobs(client, source, &tmp, opts.arch, opts.concurrency).await?;
        let m = &fetched.resolved.manifest;
        let config = parse_config(&reference, m, &fetched.config)?;
        if let Some(a) = config.architecture.as_deref()
            && !a.is_empty()
            && a != opts.arch.as_str()
        {
            tracing::warn!(image_arch = a, wanted = %opts.arch, "image architecture differs");
        }
        let diff_ids = config.rootfs.map(|r| r.diff_ids).unwrap_or_default();
        if !diff_ids.is_empty() && diff_ids.len() != m.layers.len() {
            return Err(OciError::Invalid {
                reference,
                what: "config",
                digest: Some(m.config.digest.clone()),
                reason: format!(
                    "{} diff_ids for {} layers",
                    diff_ids.len(),
                    m.layers.len()
                ),
            });
        }
        let mut layer_files = Vec::with_capacity(m.layers.len());
        for (i, (desc, path)) in m.layers.iter().zip(&fetched.layers).enumerate() {
            if Compression::of_media_type(&desc.media_type).is_none() {
                return Err(OciError::UnsupportedMediaType {
                    reference,
                    what: "layer",
                    digest: desc.digest.clone(),
                    media_type: desc.media_type.clone(),
                });
            }
            layer_files.push(LayerFile {
                path: path.clone(),
                media_type: desc.media_type.clone(),
                name: desc.digest.to_string(),
                diff_id: diff_ids.get(i).cloned(),
            });
        }
        let info = ImageInfo {
            reference: reference.clone(),
            manifest_digest: Some(fetched.resolved.digest.clone()),
            index_digest: fetched.resolved.index_digest.clone(),
            config_digest: Some(m.config.digest.clone()),
            layers: m.layers.iter().map(|l| l.digest.clone()).collect(),
            architecture: Some(opts.arch),
            artifact_type: None,
            status: RootfsStatus::Unpacked,
        };
        let marker = serde_json::to_vec_pretty(&info).map_err(|e| dest_err(e.to_string()))?;
        let (r2, partial2, dest2, uopts) = (
            reference.clone(),
            partial.clone(),
            dest.to_path_buf(),
            opts.unpack.clone(),
        );
        let built = blocking(&reference, "unpack", &partial, move || {
            build_and_install(&r2, &partial2, &dest2, &layer_files, &uopts, &marker, rebuild)
        })
        .await;
        // Downloads are kept for a retry only when downloading failed: an image whose
        // (verified) layers cannot be applied will not apply next time either.
        let (t2, r3) = (tmp.clone(), reference.clone());
        let removed =
            blocking(&reference, "remove", &tmp, move || remove_if_exists(&r3, &t2)).await;
        built?;
        removed?;
        tracing::info!(manifest = %fetched.resolved.digest, layers = info.layers.len(), "root file system ready");
        Ok(info)
    }
    .instrument(span)
    .await
}

fn parse_config(reference: &str, m: &ImageManifest, bytes: &[u8]) -> Result<ImageConfig, OciError> {
    if m.config.media_type != manifest::media_type::OCI_CONFIG {
        return Err(OciError::UnsupportedMediaType {
            reference: reference.to_string(),
            what: "config",
            digest: m.config.digest.clone(),
            media_type: m.config.media_type.clone(),
        });
    }
    serde_json::from_slice(bytes).map_err(|e| OciError::Invalid {
        reference: reference.to_string(),
        what: "config",
        digest: Some(m.config.digest.clone()),
        reason: e.to_string(),
    })
}

/// Unpacks into `partial`, writes the marker, syncs, and moves the tree to `dest`.
fn build_and_install(
    reference: &str,
    partial: &Path,
    dest: &Path,
    layers: &[LayerFile],
    opts: &UnpackOptions,
    marker: &[u8],
    rebuild: bool,
) -> Result<(), OciError> {
    use std::os::unix::fs::DirBuilderExt;
    remove_if_exists(reference, partial)?;
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(partial)
        .map_err(|e| io_err(reference, "create directory", partial, e))?;
    let result = (|| {
        unpack(partial, layers, opts).map_err(|cause| OciError::Unpack {
            reference: reference.to_string(),
            cause,
        })?;
        let marker_path = partial.join(MARKER_FILE);
        // A layer may have put anything at the marker's name; replace it.
        remove_if_exists(reference, &marker_path)?;
        std::fs::write(&marker_path, marker)
            .map_err(|e| io_err(reference, "write", &marker_path, e))?;
        let dir =
            std::fs::File::open(partial).map_err(|e| io_err(reference, "open", partial, e))?;
        rustix::fs::syncfs(&dir).map_err(|e| io_err(reference, "sync", partial, e.into()))?;
        install(reference, partial, dest, rebuild)
    })();
    if result.is_err() {
        // Never leave a half-built tree behind; the error is what matters.
        let _ = remove_if_exists(reference, partial);
    }
    result
}

/// Moves the finished `partial` tree to `dest`.
fn install(reference: &str, partial: &Path, dest: &Path, rebuild: bool) -> Result<(), OciError> {
    if rebuild {
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            partial,
            rustix::fs::CWD,
            dest,
            rustix::fs::RenameFlags::EXCHANGE,
        )
        .map_err(|e| io_err(reference, "exchange", dest, e.into()))?;
        // `partial` now holds the old tree.
        remove_if_exists(reference, partial)?;
    } else {
        // Replaces an empty directory at dest, or creates it.
        std::fs::rename(partial, dest).map_err(|e| io_err(reference, "rename", dest, e))?;
    }
    if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty())
        && let Ok(d) = std::fs::File::open(parent)
    {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Resolves `source` for `linux/<arch>` and verifies its manifest (and index): the preflight
/// check that an image can be pulled. Returns the image manifest's digest.
pub async fn manifest_reachable(
    client: &RegistryClient,
    source: &ImageSource,
    arch: Arch,
) -> Result<Digest, OciError> {
    let span = tracing::info_span!("manifest_reachable", image = %source);
    async move { Ok(resolve_source(client, source, arch).await?.digest) }
        .instrument(span)
        .await
}

/// Pulls an OCI artifact or image (any artifact type) and extracts each of its tar, tar+gzip or
/// tar+zstd layers into `dest_dir` (created if missing) with [`unpack()`]'s safety rules. A layer
/// that is not a tar (by media type or magic bytes) but has an `org.opencontainers.image.title`
/// annotation is written as the file of that name (a single path component). Blobs are
/// fetched and verified in `<parent>/.<name>.oci-tmp` first. An index is resolved for the host's
/// architecture (an index with a single entry without platform is accepted).
pub async fn fetch_artifact(
    client: &RegistryClient,
    source: &ImageSource,
    dest_dir: &Path,
) -> Result<ImageInfo, OciError> {
    let reference = source.to_string();
    let span =
        tracing::info_span!("fetch_artifact", image = %reference, dest = %dest_dir.display());
    async move {
        let tmp = sibling(dest_dir, ".oci-tmp", &reference)?;
        let arch = Arch::host();
        let fetched = fetch_blobs(client, source, &tmp, arch, 3).await?;
        let m = fetched.resolved.manifest.clone();
        std::fs::create_dir_all(dest_dir)
            .map_err(|e| io_err(&reference, "create directory", dest_dir, e))?;
        let (r2, d2, layers) = (
            reference.clone(),
            dest_dir.to_path_buf(),
            fetched.layers.clone(),
        );
        let m2 = m.clone();
        let extracted = blocking(&reference, "extract", dest_dir, move || {
            extract_artifact(&r2, &m2, &layers, &d2)
        })
        .await;
        let (t2, r3) = (tmp.clone(), reference.clone());
        let removed = blocking(&reference, "remove", &tmp, move || {
            remove_if_exists(&r3, &t2)
        })
        .await;
        extracted?;
        removed?;
        Ok(ImageInfo {
            reference: reference.clone(),
            manifest_digest: Some(fetched.resolved.digest.clone()),
            index_digest: fetched.resolved.index_digest.clone(),
            config_digest: Some(m.config.digest.clone()),
            layers: m.layers.iter().map(|l| l.digest.clone()).collect(),
            architecture: None,
            artifact_type: Some(m.effective_artifact_type().to_string()),
            status: RootfsStatus::Unpacked,
        })
    }
    .instrument(span)
    .await
}

fn looks_like_tar(path: &Path) -> std::io::Result<bool> {
    let mut head = [0u8; 512];
    let mut f = std::fs::File::open(path)?;
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(Compression::sniff(&head[..n]).is_some() || (n >= 262 && &head[257..262] == b"ustar"))
}

fn extract_artifact(
    reference: &str,
    m: &ImageManifest,
    layers: &[PathBuf],
    dest: &Path,
) -> Result<(), OciError> {
    let opts = UnpackOptions::default();
    for (desc, path) in m.layers.iter().zip(layers) {
        let title = desc.annotation(manifest::ANNOTATION_TITLE);
        let tarish = match Compression::of_media_type(&desc.media_type) {
            Some(_) => true,
            None if title.is_some() => false,
            None => looks_like_tar(path).map_err(|e| io_err(reference, "read", path, e))?,
        };
        if tarish {
            let f = std::fs::File::open(path).map_err(|e| io_err(reference, "open", path, e))?;
            unpack_layer(dest, desc.digest.as_str(), f, &opts).map_err(|cause| {
                OciError::Unpack {
                    reference: reference.to_string(),
                    cause,
                }
            })?;
            continue;
        }
        let Some(title) = title else {
            return Err(OciError::UnsupportedMediaType {
                reference: reference.to_string(),
                what: "layer (not a tar and no title annotation)",
                digest: desc.digest.clone(),
                media_type: desc.media_type.clone(),
            });
        };
        if title.is_empty()
            || title.contains('/')
            || title == "."
            || title == ".."
            || title.contains('\0')
        {
            return Err(OciError::Unpack {
                reference: reference.to_string(),
                cause: UnpackError::Unsafe {
                    layer: desc.digest.to_string(),
                    entry: title.to_string(),
                    reason: "a file layer's title must be a single file name".into(),
                },
            });
        }
        let target = dest.join(title);
        let tmp = dest.join(format!(".{title}.tmp"));
        remove_if_exists(reference, &tmp)?;
        std::fs::copy(path, &tmp).map_err(|e| io_err(reference, "copy", &tmp, e))?;
        // rename replaces a symlink at `target` rather than following it.
        std::fs::rename(&tmp, &target).map_err(|e| io_err(reference, "rename", &target, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
