//! [`GrpcImages`]: the image store through containerd's API (`containerd-client`, v1 services,
//! which containerd 1.6 serves) over its socket.
//!
//! Every request carries `containerd-namespace: aks-flex`. A pull, done client-side as `ctr`
//! does it on containerd 1.6 (which has no server-side pull):
//! 1. a lease (`Leases.Create`, expiring after an hour should the agent die) keeps what is
//!    written from containerd's garbage collector until the image record references it; every
//!    request of the pull carries `containerd-lease`, and the lease is deleted at the end,
//!    whatever the outcome (what a failed pull wrote is then collected);
//! 2. the reference is resolved with the agent's registry client: an index is followed to its
//!    `linux/<arch>` manifest ([`flex_oci::manifest::select_platform`]), each document
//!    verified against its digest;
//! 3. the config and each layer missing from the content store are downloaded (verified) into
//!    a staging directory and written with `Content.Write` (stat, writes from offset 0, commit
//!    with the expected digest and size, which containerd verifies), labelled as `ctr` labels
//!    them: `containerd.io/uncompressed` on layers, `containerd.io/distribution.source.<host>`
//!    on every blob, `containerd.io/gc.ref.content.config` and `…l.<i>` on the manifest,
//!    `…m.<i>` on an index; content already present only gets missing labels
//!    (`Content.Update`);
//! 4. the layers are unpacked into the snapshotter (overlayfs by default): for each layer whose
//!    chain ID has no snapshot, `Snapshots.Prepare` (key `extract-<unique> <chain ID>`, parent
//!    the previous chain ID), `Diff.Apply` (its result must be the config's `diff_id`),
//!    `Snapshots.Commit` to the chain ID; the config gets
//!    `containerd.io/gc.ref.snapshot.<snapshotter>=<top chain ID>`;
//! 5. the manifest, then the index, are written last, and the image record (name: the
//!    reference as given; target: the document the reference names) is created, or updated
//!    when it exists.
//!
//! `ctr run <ref>` then finds the image unpacked (it checks the top chain ID's snapshot) and
//! starts without pulling. [`Images::run_check`] is delegated to `ctr run` ([`CtrImages`]).
//!
//! The registry's scheme is [`PullOptions::plain_http_for`]'s: plain HTTP (with a warning naming
//! the registry) exactly for a registry listed in the pull's insecure registries, HTTPS for
//! every other, whatever its address. `plain_http` for a registry that is not listed is refused
//! with an error, rather than silently using HTTPS.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use containerd_api::services::content::v1::{
    Info as ContentInfo, InfoRequest, UpdateRequest as UpdateContentRequest, WriteAction,
    WriteContentRequest, WriteContentResponse, content_client::ContentClient,
};
use containerd_api::services::diff::v1::{ApplyRequest, diff_client::DiffClient};
use containerd_api::services::images::v1::{
    CreateImageRequest, DeleteImageRequest, GetImageRequest, Image as ImageRecord,
    UpdateImageRequest, images_client::ImagesClient,
};
use containerd_api::services::leases::v1::{
    CreateRequest as CreateLeaseRequest, DeleteRequest as DeleteLeaseRequest,
    leases_client::LeasesClient,
};
use containerd_api::services::snapshots::v1::{
    CommitSnapshotRequest, PrepareSnapshotRequest, RemoveSnapshotRequest, StatSnapshotRequest,
    snapshots_client::SnapshotsClient,
};
use containerd_api::services::version::v1::version_client::VersionClient;
use containerd_api::tonic::metadata::MetadataValue;
use containerd_api::tonic::transport::Channel;
use containerd_api::tonic::{Code, Request, Status, Streaming};
use containerd_api::types::Descriptor as CDescriptor;
use futures::{SinkExt, StreamExt, TryStreamExt};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::{CTR_NAMESPACE, ContainerdError, CtrImages, Images, PullOptions, PulledImage};
use flex_oci::manifest::{Manifest, media_type, select_platform};
use flex_oci::registry::FetchedManifest;
use flex_oci::{Arch, Descriptor, Digest, ImageConfig, ImageRef, RegistryClient};

/// Default deadline of a pull.
pub const PULL_TIMEOUT: Duration = Duration::from_secs(600);
/// Deadline of connecting and of the `Version` call that proves the socket answers.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline of one unary call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a pull's lease outlives an agent that died during the pull.
pub const LEASE_EXPIRY: Duration = Duration::from_secs(3600);
/// Bytes per `Content.Write` message.
pub const WRITE_CHUNK: usize = 1 << 20;
/// The snapshotter unpacked into by default.
pub const DEFAULT_SNAPSHOTTER: &str = "overlayfs";
/// Layers downloaded and written at once.
pub const CONCURRENCY: usize = 3;

/// GC label: content referenced by a manifest's config.
pub const LABEL_GC_CONFIG: &str = "containerd.io/gc.ref.content.config";
/// GC label prefix: a manifest's layers (`…l.<i>`).
pub const LABEL_GC_LAYER: &str = "containerd.io/gc.ref.content.l.";
/// GC label prefix: an index's manifests (`…m.<i>`).
pub const LABEL_GC_MANIFEST: &str = "containerd.io/gc.ref.content.m.";
/// GC label prefix: the config's unpacked snapshot (`…snapshot.<snapshotter>`).
pub const LABEL_GC_SNAPSHOT: &str = "containerd.io/gc.ref.snapshot.";
/// A layer's uncompressed digest.
pub const LABEL_UNCOMPRESSED: &str = "containerd.io/uncompressed";
/// Prefix of the distribution source label (`…source.<registry host>=<repository>`).
pub const LABEL_DISTRIBUTION_SOURCE: &str = "containerd.io/distribution.source.";
/// A lease's expiry (RFC 3339).
pub const LABEL_GC_EXPIRE: &str = "containerd.io/gc.expire";

/// The image store through containerd's API (see the [module docs](self)).
#[derive(Clone)]
pub struct GrpcImages {
    socket: PathBuf,
    channel: Channel,
    registry: RegistryClient,
    ctr: CtrImages,
    namespace: String,
    snapshotter: String,
    staging: PathBuf,
    arch: Arch,
    pull_timeout: Duration,
}

impl std::fmt::Debug for GrpcImages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcImages")
            .field("socket", &self.socket)
            .field("namespace", &self.namespace)
            .field("snapshotter", &self.snapshotter)
            .finish_non_exhaustive()
    }
}

/// The chain IDs of layers with these uncompressed digests: the first is its diff ID, each
/// next one `sha256(<previous chain ID> + " " + <diff ID>)`.
pub fn chain_ids(diff_ids: &[Digest]) -> Vec<Digest> {
    let mut out: Vec<Digest> = Vec::with_capacity(diff_ids.len());
    for d in diff_ids {
        let next = match out.last() {
            None => d.clone(),
            Some(prev) => Digest::of(format!("{prev} {d}").as_bytes()),
        };
        out.push(next);
    }
    out
}

/// RFC 3339 UTC time of `secs` since the epoch (`2024-01-02T03:04:05Z`).
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// A process-unique suffix for lease IDs and snapshot keys.
fn unique() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{nanos}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The media type a fetched document declares (`mediaType`, else its `Content-Type`), else the
/// OCI type of what it parsed as.
pub fn document_media_type(f: &FetchedManifest) -> String {
    #[derive(serde::Deserialize)]
    struct Probe {
        #[serde(rename = "mediaType", default)]
        media_type: Option<String>,
    }
    if let Ok(Probe {
        media_type: Some(mt),
    }) = serde_json::from_slice::<Probe>(&f.bytes)
        && !mt.is_empty()
    {
        return mt;
    }
    let known = [
        media_type::OCI_INDEX,
        media_type::OCI_MANIFEST,
        media_type::DOCKER_LIST,
        media_type::DOCKER_MANIFEST,
    ];
    if let Some(ct) = f
        .content_type
        .as_deref()
        .map(|c| c.split(';').next().unwrap_or(c).trim())
        && known.contains(&ct)
    {
        return ct.to_string();
    }
    match f.manifest {
        Manifest::Index(_) => media_type::OCI_INDEX.into(),
        Manifest::Image(_) => media_type::OCI_MANIFEST.into(),
    }
}

fn is_transport(status: &Status) -> bool {
    // A status decoded from containerd's answer has no source; one made from a connection or
    // HTTP/2 failure carries it.
    std::error::Error::source(status).is_some()
}

fn connect_err(socket: &Path, reason: impl std::fmt::Display) -> ContainerdError {
    ContainerdError::Connect {
        socket: socket.display().to_string(),
        reason: reason.to_string(),
    }
}

/// What a blob's bytes come from.
enum Source {
    Bytes(Vec<u8>),
    File(PathBuf),
}

/// A document (manifest or index) to write into the content store, with its labels.
struct Doc {
    desc: CDescriptor,
    bytes: Vec<u8>,
    labels: HashMap<String, String>,
    what: &'static str,
}

/// One pull's context: the image, its lease, its staging directory.
struct Pull<'a> {
    store: &'a GrpcImages,
    /// The store's registry client with this pull's insecure registries.
    registry: RegistryClient,
    reference: &'a str,
    image: ImageRef,
    lease: String,
    staging: PathBuf,
}

impl GrpcImages {
    /// Connects to containerd at `socket` and checks that it answers (`Version`); `registry`
    /// fetches images; `ctr` runs the checks.
    pub async fn connect(
        socket: &Path,
        registry: RegistryClient,
        ctr: CtrImages,
    ) -> Result<Self, ContainerdError> {
        if !socket.exists() {
            return Err(connect_err(socket, "no such socket"));
        }
        let channel = tokio::time::timeout(CONNECT_TIMEOUT, containerd_api::connect(socket))
            .await
            .map_err(|_| {
                connect_err(
                    socket,
                    format!("connect timed out after {CONNECT_TIMEOUT:?}"),
                )
            })?
            .map_err(|e| connect_err(socket, format!("connect: {e}")))?;
        let store = Self {
            socket: socket.to_path_buf(),
            channel,
            registry,
            ctr,
            namespace: CTR_NAMESPACE.to_string(),
            snapshotter: DEFAULT_SNAPSHOTTER.to_string(),
            staging: std::env::temp_dir(),
            arch: Arch::host(),
            pull_timeout: PULL_TIMEOUT,
        };
        let version = store.version().await?;
        tracing::debug!(socket = %socket.display(), version, "containerd answers");
        Ok(store)
    }

    /// Uses another containerd namespace (the checks' `ctr` keeps its own).
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Unpacks into snapshotter `name` instead of overlayfs.
    pub fn with_snapshotter(mut self, name: impl Into<String>) -> Self {
        self.snapshotter = name.into();
        self
    }

    /// Downloads blobs into a temporary directory under `dir` (default: the system's).
    pub fn with_staging_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.staging = dir.into();
        self
    }

    /// Sets the pull's deadline.
    pub fn with_pull_timeout(mut self, timeout: Duration) -> Self {
        self.pull_timeout = timeout;
        self
    }

    /// containerd's version (`Version.Version`).
    pub async fn version(&self) -> Result<String, ContainerdError> {
        let mut req = Request::new(());
        req.set_timeout(CONNECT_TIMEOUT);
        let resp = tokio::time::timeout(
            CONNECT_TIMEOUT,
            VersionClient::new(self.channel.clone()).version(req),
        )
        .await
        .map_err(|_| connect_err(&self.socket, "Version timed out"))?
        .map_err(|s| connect_err(&self.socket, format!("Version: {}", s.message())))?;
        Ok(resp.into_inner().version)
    }

    /// A request in our namespace, under `lease` when given, with a deadline unless a stream.
    fn request<T>(&self, msg: T, lease: Option<&str>, timeout: Option<Duration>) -> Request<T> {
        let mut req = containerd_api::namespaced(msg, &self.namespace);
        if let Some(l) = lease
            && let Ok(v) = MetadataValue::try_from(l)
        {
            req.metadata_mut().insert("containerd-lease", v);
        }
        if let Some(t) = timeout {
            req.set_timeout(t);
        }
        req
    }

    fn api_err(
        image: &str,
        step: impl Into<String>,
        call: &'static str,
    ) -> impl FnOnce(Status) -> ContainerdError {
        let (image, step) = (image.to_string(), step.into());
        move |status| ContainerdError::Api {
            image,
            step,
            call,
            code: format!("{:?}", status.code()),
            message: status.message().to_string(),
            transport: is_transport(&status),
        }
    }

    async fn pull_in_lease(
        &self,
        reference: &str,
        image: ImageRef,
        registry: RegistryClient,
        lease: String,
    ) -> Result<PulledImage, ContainerdError> {
        let staging = tempfile::Builder::new()
            .prefix(".aks-flex-pull-")
            .tempdir_in(&self.staging)
            .map_err(|e| ContainerdError::Failed {
                image: reference.to_string(),
                step: "create staging directory".into(),
                reason: format!("{}: {e}", self.staging.display()),
            })?;
        let pull = Pull {
            store: self,
            registry,
            reference,
            image,
            lease,
            staging: staging.path().to_path_buf(),
        };
        pull.run().await
    }
}

impl Pull<'_> {
    fn failed(&self, step: impl Into<String>, reason: impl Into<String>) -> ContainerdError {
        ContainerdError::Failed {
            image: self.reference.to_string(),
            step: step.into(),
            reason: reason.into(),
        }
    }

    fn api(
        &self,
        step: impl Into<String>,
        call: &'static str,
    ) -> impl FnOnce(Status) -> ContainerdError {
        GrpcImages::api_err(self.reference, step, call)
    }

    fn registry(&self, step: &'static str) -> impl FnOnce(flex_oci::OciError) -> ContainerdError {
        let image = self.reference.to_string();
        move |cause| ContainerdError::Registry { image, step, cause }
    }

    fn request<T>(&self, msg: T, timeout: Option<Duration>) -> Request<T> {
        self.store.request(msg, Some(&self.lease), timeout)
    }

    fn source_labels(&self) -> HashMap<String, String> {
        HashMap::from([(
            format!("{LABEL_DISTRIBUTION_SOURCE}{}", self.image.registry),
            self.image.repository.clone(),
        )])
    }

    async fn run(&self) -> Result<PulledImage, ContainerdError> {
        let reg = &self.registry;
        // Resolve: the document the reference names, indexes down to this platform's manifest.
        let mut fetched = reg
            .fetch_manifest(&self.image, &self.image.reference(), None)
            .await
            .map_err(self.registry("resolve"))?;
        let root = CDescriptor {
            media_type: document_media_type(&fetched),
            digest: fetched.digest.to_string(),
            size: fetched.bytes.len() as i64,
            annotations: HashMap::new(),
        };
        let mut indexes: Vec<Doc> = Vec::new();
        let manifest = loop {
            let desc = CDescriptor {
                media_type: document_media_type(&fetched),
                digest: fetched.digest.to_string(),
                size: fetched.bytes.len() as i64,
                annotations: HashMap::new(),
            };
            match fetched.manifest {
                Manifest::Image(m) => {
                    break (
                        m,
                        Doc {
                            desc,
                            bytes: fetched.bytes,
                            labels: self.source_labels(),
                            what: "manifest",
                        },
                    );
                }
                Manifest::Index(ix) => {
                    if indexes.len() >= flex_oci::MAX_INDEX_DEPTH {
                        return Err(self.failed("resolve", "indexes nested too deep"));
                    }
                    let arch = self.store.arch;
                    let child = select_platform(&ix, arch)
                        .map_err(|available| {
                            self.failed(
                                "resolve",
                                format!("no manifest for linux/{arch}; available: {available}"),
                            )
                        })?
                        .clone();
                    let pos = ix
                        .manifests
                        .iter()
                        .position(|d| d.digest == child.digest)
                        .unwrap_or(0);
                    let mut labels = self.source_labels();
                    labels.insert(
                        format!("{LABEL_GC_MANIFEST}{pos}"),
                        child.digest.to_string(),
                    );
                    indexes.push(Doc {
                        desc,
                        bytes: fetched.bytes,
                        labels,
                        what: "index",
                    });
                    fetched = reg
                        .fetch_manifest(&self.image, child.digest.as_str(), Some(&child))
                        .await
                        .map_err(self.registry("resolve"))?;
                }
            }
        };
        let (m, mut manifest_doc) = manifest;
        tracing::info!(
            image = self.reference,
            manifest = %manifest_doc.desc.digest,
            layers = m.layers.len(),
            "pulling through containerd's API"
        );

        // The config: its diff IDs drive the unpack.
        let cfg_path = self.staging.join("config");
        reg.pull_blob(&self.image, &m.config, &cfg_path, "config")
            .await
            .map_err(self.registry("download config"))?;
        let cfg_bytes = tokio::fs::read(&cfg_path)
            .await
            .map_err(|e| self.failed("read config", format!("{}: {e}", cfg_path.display())))?;
        let config: ImageConfig = serde_json::from_slice(&cfg_bytes)
            .map_err(|e| self.failed(format!("parse config {}", m.config.digest), e.to_string()))?;
        let diff_ids = config.rootfs.map(|r| r.diff_ids).unwrap_or_default();
        if diff_ids.len() != m.layers.len() {
            return Err(self.failed(
                format!("config {}", m.config.digest),
                format!("{} diff_ids for {} layers", diff_ids.len(), m.layers.len()),
            ));
        }

        // The layers, then their unpacking.
        // Each blob once: two writers of the same ref would lock each other out.
        let mut seen = std::collections::HashSet::new();
        let writes: Vec<_> = m
            .layers
            .iter()
            .zip(diff_ids.iter())
            .filter(|(layer, _)| seen.insert(layer.digest.clone()))
            .map(|(layer, diff_id)| self.ensure_layer(layer, diff_id))
            .collect();
        futures::stream::iter(writes)
            .buffer_unordered(CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;
        let chains = chain_ids(&diff_ids);
        for (i, layer) in m.layers.iter().enumerate() {
            let parent = if i == 0 { None } else { chains.get(i - 1) };
            self.unpack_layer(layer, &diff_ids[i], &chains[i], parent)
                .await?;
        }

        // The config (with its snapshot), the manifest, the indexes, the record.
        let mut cfg_labels = self.source_labels();
        if let Some(top) = chains.last() {
            cfg_labels.insert(
                format!("{LABEL_GC_SNAPSHOT}{}", self.store.snapshotter),
                top.to_string(),
            );
        }
        self.ensure_content(&m.config, "config", Source::Bytes(cfg_bytes), cfg_labels)
            .await?;
        manifest_doc
            .labels
            .insert(LABEL_GC_CONFIG.into(), m.config.digest.to_string());
        for (i, l) in m.layers.iter().enumerate() {
            manifest_doc
                .labels
                .insert(format!("{LABEL_GC_LAYER}{i}"), l.digest.to_string());
        }
        for doc in std::iter::once(manifest_doc).chain(indexes.into_iter().rev()) {
            let digest = Digest::parse(&doc.desc.digest)
                .map_err(|e| self.failed(format!("write {}", doc.what), e.to_string()))?;
            let desc = Descriptor {
                media_type: doc.desc.media_type.clone(),
                digest,
                size: doc.bytes.len() as u64,
                urls: None,
                annotations: None,
                platform: None,
                artifact_type: None,
            };
            self.ensure_content(&desc, doc.what, Source::Bytes(doc.bytes), doc.labels)
                .await?;
        }
        self.put_image_record(&root).await?;
        Ok(PulledImage {
            name: self.reference.to_string(),
            digest: root.digest,
        })
    }

    /// `Content.Info`: the blob's labels when containerd has it.
    async fn content_labels(
        &self,
        digest: &Digest,
        what: &str,
    ) -> Result<Option<HashMap<String, String>>, ContainerdError> {
        let mut client = ContentClient::new(self.store.channel.clone());
        match client
            .info(self.request(
                InfoRequest {
                    digest: digest.to_string(),
                },
                Some(CALL_TIMEOUT),
            ))
            .await
        {
            Ok(r) => Ok(Some(
                r.into_inner().info.map(|i| i.labels).unwrap_or_default(),
            )),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(self.api(format!("stat {what} {digest}"), "content.Info")(s)),
        }
    }

    /// Sets the `wanted` labels the blob lacks (`Content.Update` with a mask of those labels).
    async fn update_labels(
        &self,
        digest: &Digest,
        what: &str,
        have: &HashMap<String, String>,
        wanted: HashMap<String, String>,
    ) -> Result<(), ContainerdError> {
        let missing: HashMap<String, String> = wanted
            .into_iter()
            .filter(|(k, v)| have.get(k) != Some(v))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let paths = missing.keys().map(|k| format!("labels.{k}")).collect();
        let mut client = ContentClient::new(self.store.channel.clone());
        client
            .update(self.request(
                UpdateContentRequest {
                    info: Some(ContentInfo {
                        digest: digest.to_string(),
                        labels: missing,
                        ..Default::default()
                    }),
                    update_mask: Some(prost_types::FieldMask { paths }),
                },
                Some(CALL_TIMEOUT),
            ))
            .await
            .map_err(self.api(format!("label {what} {digest}"), "content.Update"))?;
        Ok(())
    }

    /// A layer in the content store: downloaded and written unless containerd has it.
    async fn ensure_layer(
        &self,
        layer: &Descriptor,
        diff_id: &Digest,
    ) -> Result<(), ContainerdError> {
        let mut labels = self.source_labels();
        labels.insert(LABEL_UNCOMPRESSED.into(), diff_id.to_string());
        if let Some(have) = self.content_labels(&layer.digest, "layer").await? {
            tracing::debug!(digest = %layer.digest, "layer already in containerd");
            return self
                .update_labels(&layer.digest, "layer", &have, labels)
                .await;
        }
        let path = self.staging.join(layer.digest.hex());
        // This pull's client (with its insecure registries), not the store's.
        self.registry
            .pull_blob(&self.image, layer, &path, "layer")
            .await
            .map_err(self.registry("download layer"))?;
        let r = self
            .ensure_content(layer, "layer", Source::File(path.clone()), labels)
            .await;
        let _ = tokio::fs::remove_file(&path).await;
        r
    }

    /// The blob `desc` in the content store with `labels`: written from `source` unless present.
    async fn ensure_content(
        &self,
        desc: &Descriptor,
        what: &'static str,
        source: Source,
        labels: HashMap<String, String>,
    ) -> Result<(), ContainerdError> {
        if let Some(have) = self.content_labels(&desc.digest, what).await? {
            return self.update_labels(&desc.digest, what, &have, labels).await;
        }
        let step = format!("write {what} {}", desc.digest);
        let written = match source {
            Source::Bytes(b) => {
                self.write(desc, std::io::Cursor::new(b), labels.clone())
                    .await
            }
            Source::File(p) => {
                let f = tokio::fs::File::open(&p)
                    .await
                    .map_err(|e| self.failed(step.clone(), format!("{}: {e}", p.display())))?;
                self.write(desc, f, labels.clone()).await
            }
        };
        match written {
            Ok(()) => Ok(()),
            // Written meanwhile (another pull): only the labels are ours to add.
            Err(s) if s.code() == Code::AlreadyExists => {
                let have = self
                    .content_labels(&desc.digest, what)
                    .await?
                    .unwrap_or_default();
                self.update_labels(&desc.digest, what, &have, labels).await
            }
            Err(s) => Err(self.api(step, "content.Write")(s)),
        }
    }

    /// One `Content.Write` stream: stat, writes from offset 0 (which also truncates a stale
    /// ingest of the same ref), commit with the expected size and digest.
    async fn write(
        &self,
        desc: &Descriptor,
        mut data: impl AsyncRead + Unpin + Send,
        labels: HashMap<String, String>,
    ) -> Result<(), Status> {
        let (mut tx, rx) = futures::channel::mpsc::channel::<WriteContentRequest>(2);
        let base = WriteContentRequest {
            r#ref: format!("aks-flex-{}", desc.digest),
            total: desc.size as i64,
            expected: desc.digest.to_string(),
            ..Default::default()
        };
        send(
            &mut tx,
            None,
            WriteContentRequest {
                action: WriteAction::Stat as i32,
                ..base.clone()
            },
        )
        .await?;
        let mut client = ContentClient::new(self.store.channel.clone());
        let mut responses = client.write(self.request(rx, None)).await?.into_inner();
        recv(&mut responses).await?;
        let mut offset = 0i64;
        loop {
            let mut buf = vec![0u8; WRITE_CHUNK];
            let n = read_full(&mut data, &mut buf)
                .await
                .map_err(|e| Status::aborted(format!("reading the blob: {e}")))?;
            if n == 0 {
                break;
            }
            buf.truncate(n);
            send(
                &mut tx,
                Some(&mut responses),
                WriteContentRequest {
                    action: WriteAction::Write as i32,
                    offset,
                    data: buf,
                    ..base.clone()
                },
            )
            .await?;
            recv(&mut responses).await?;
            offset += n as i64;
        }
        send(
            &mut tx,
            Some(&mut responses),
            WriteContentRequest {
                action: WriteAction::Commit as i32,
                offset,
                labels,
                ..base
            },
        )
        .await?;
        recv(&mut responses).await?;
        drop(tx);
        Ok(())
    }

    async fn snapshot_exists(&self, key: &str) -> Result<bool, ContainerdError> {
        let mut client = SnapshotsClient::new(self.store.channel.clone());
        match client
            .stat(self.request(
                StatSnapshotRequest {
                    snapshotter: self.store.snapshotter.clone(),
                    key: key.to_string(),
                },
                Some(CALL_TIMEOUT),
            ))
            .await
        {
            Ok(_) => Ok(true),
            Err(s) if s.code() == Code::NotFound => Ok(false),
            Err(s) => Err(self
                .api(format!("unpack: stat snapshot {key}"), "snapshots.Stat")(
                s
            )),
        }
    }

    /// Unpacks `layer` onto `parent` as snapshot `chain`, unless it exists.
    async fn unpack_layer(
        &self,
        layer: &Descriptor,
        diff_id: &Digest,
        chain: &Digest,
        parent: Option<&Digest>,
    ) -> Result<(), ContainerdError> {
        if self.snapshot_exists(chain.as_str()).await? {
            tracing::debug!(chain = %chain, "layer already unpacked");
            return Ok(());
        }
        let step = format!("unpack layer {}", layer.digest);
        let key = format!("extract-{} {chain}", unique());
        let snapshotter = self.store.snapshotter.clone();
        let mut snapshots = SnapshotsClient::new(self.store.channel.clone());
        let mounts = snapshots
            .prepare(self.request(
                PrepareSnapshotRequest {
                    snapshotter: snapshotter.clone(),
                    key: key.clone(),
                    parent: parent.map(Digest::to_string).unwrap_or_default(),
                    labels: HashMap::new(),
                },
                Some(CALL_TIMEOUT),
            ))
            .await
            .map_err(self.api(step.clone(), "snapshots.Prepare"))?
            .into_inner()
            .mounts;
        let applied = self
            .apply_and_commit(layer, diff_id, chain, &key, mounts, &step)
            .await;
        if applied.is_err() {
            // Best effort: the active snapshot is in the lease anyway.
            let _ = snapshots
                .remove(self.request(
                    RemoveSnapshotRequest {
                        snapshotter,
                        key: key.clone(),
                    },
                    Some(CALL_TIMEOUT),
                ))
                .await;
        }
        applied
    }

    async fn apply_and_commit(
        &self,
        layer: &Descriptor,
        diff_id: &Digest,
        chain: &Digest,
        key: &str,
        mounts: Vec<containerd_api::types::Mount>,
        step: &str,
    ) -> Result<(), ContainerdError> {
        let mut diff = DiffClient::new(self.store.channel.clone());
        let applied = diff
            .apply(self.request(
                ApplyRequest {
                    diff: Some(CDescriptor {
                        media_type: layer.media_type.clone(),
                        digest: layer.digest.to_string(),
                        size: layer.size as i64,
                        annotations: HashMap::new(),
                    }),
                    mounts,
                    ..Default::default()
                },
                None,
            ))
            .await
            .map_err(self.api(step, "diff.Apply"))?
            .into_inner()
            .applied
            .map(|d| d.digest)
            .unwrap_or_default();
        if applied != diff_id.as_str() {
            return Err(self.failed(
                step,
                format!("the layer unpacked to {applied}, the config says {diff_id}"),
            ));
        }
        let mut snapshots = SnapshotsClient::new(self.store.channel.clone());
        match snapshots
            .commit(self.request(
                CommitSnapshotRequest {
                    snapshotter: self.store.snapshotter.clone(),
                    name: chain.to_string(),
                    key: key.to_string(),
                    labels: HashMap::new(),
                },
                Some(CALL_TIMEOUT),
            ))
            .await
        {
            Ok(_) => Ok(()),
            // Unpacked meanwhile by someone else: theirs is as good (the caller removes ours).
            Err(s) if s.code() == Code::AlreadyExists => Err(ContainerdError::Failed {
                image: self.reference.to_string(),
                step: step.to_string(),
                reason: format!("snapshot {chain} appeared during the unpack; pull again"),
            }),
            Err(s) => Err(self.api(step, "snapshots.Commit")(s)),
        }
    }

    /// Creates the image record, or points an existing one at `target`.
    async fn put_image_record(&self, target: &CDescriptor) -> Result<(), ContainerdError> {
        let record = ImageRecord {
            name: self.reference.to_string(),
            labels: HashMap::new(),
            target: Some(target.clone()),
            created_at: None,
            updated_at: None,
        };
        let mut images = ImagesClient::new(self.store.channel.clone());
        match images
            .create(self.request(
                CreateImageRequest {
                    image: Some(record.clone()),
                    source_date_epoch: None,
                },
                Some(CALL_TIMEOUT),
            ))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::AlreadyExists => {
                images
                    .update(self.request(
                        UpdateImageRequest {
                            image: Some(record),
                            update_mask: Some(prost_types::FieldMask {
                                paths: vec!["target".into()],
                            }),
                            source_date_epoch: None,
                        },
                        Some(CALL_TIMEOUT),
                    ))
                    .await
                    .map_err(self.api("update image record", "images.Update"))?;
                Ok(())
            }
            Err(s) => Err(self.api("create image record", "images.Create")(s)),
        }
    }
}

/// Sends one write message; when the stream is closed, the call's status says why.
async fn send(
    tx: &mut futures::channel::mpsc::Sender<WriteContentRequest>,
    responses: Option<&mut Streaming<WriteContentResponse>>,
    msg: WriteContentRequest,
) -> Result<(), Status> {
    if tx.send(msg).await.is_ok() {
        return Ok(());
    }
    match responses {
        Some(r) => match r.message().await {
            Err(s) => Err(s),
            Ok(_) => Err(Status::aborted("containerd closed the write stream")),
        },
        None => Err(Status::aborted("the write stream closed before it started")),
    }
}

async fn recv(
    responses: &mut Streaming<WriteContentResponse>,
) -> Result<WriteContentResponse, Status> {
    responses
        .message()
        .await?
        .ok_or_else(|| Status::aborted("containerd ended the write stream early"))
}

/// Reads until `buf` is full or the input ends; the count read.
async fn read_full(r: &mut (impl AsyncRead + Unpin), buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]).await? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[async_trait]
impl Images for GrpcImages {
    async fn pull(
        &self,
        reference: &str,
        opts: &PullOptions,
    ) -> Result<PulledImage, ContainerdError> {
        let image = ImageRef::parse(reference).map_err(|e| ContainerdError::Failed {
            image: reference.to_string(),
            step: "parse reference".into(),
            reason: e.to_string(),
        })?;
        let plain_http = opts
            .plain_http_for(&image)
            .map_err(|reason| ContainerdError::Failed {
                image: reference.to_string(),
                step: "pull".into(),
                reason: reason.to_string(),
            })?;
        let registry = self
            .registry
            .clone()
            .with_insecure_registries(if plain_http {
                opts.insecure_registries.clone()
            } else {
                flex_host::http::InsecureRegistries::none()
            });
        let lease = format!("aks-flex-pull-{}", unique());
        let expiry = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            + LEASE_EXPIRY.as_secs();
        LeasesClient::new(self.channel.clone())
            .create(self.request(
                CreateLeaseRequest {
                    id: lease.clone(),
                    labels: HashMap::from([(LABEL_GC_EXPIRE.to_string(), rfc3339(expiry))]),
                },
                None,
                Some(CALL_TIMEOUT),
            ))
            .await
            .map_err(Self::api_err(reference, "create lease", "leases.Create"))?;
        let started = std::time::Instant::now();
        let result = match tokio::time::timeout(
            self.pull_timeout,
            self.pull_in_lease(reference, image, registry, lease.clone()),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(ContainerdError::Failed {
                image: reference.to_string(),
                step: "pull".into(),
                reason: format!("timed out after {:?}", self.pull_timeout),
            }),
        };
        let deleted = LeasesClient::new(self.channel.clone())
            .delete(self.request(
                DeleteLeaseRequest {
                    id: lease.clone(),
                    sync: false,
                },
                None,
                Some(CALL_TIMEOUT),
            ))
            .await;
        if let Err(s) = deleted {
            tracing::warn!(lease, error = %s.message(), "could not delete the pull's lease; it expires by itself");
        }
        if let Ok(p) = &result {
            tracing::info!(
                image = reference,
                digest = %p.digest,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "pulled through containerd's API"
            );
        }
        result
    }

    async fn exists(&self, reference: &str) -> Result<bool, ContainerdError> {
        match ImagesClient::new(self.channel.clone())
            .get(self.request(
                GetImageRequest {
                    name: reference.to_string(),
                },
                None,
                Some(CALL_TIMEOUT),
            ))
            .await
        {
            Ok(_) => Ok(true),
            Err(s) if s.code() == Code::NotFound => Ok(false),
            Err(s) => Err(Self::api_err(reference, "exists", "images.Get")(s)),
        }
    }

    async fn remove(&self, reference: &str) -> Result<(), ContainerdError> {
        match ImagesClient::new(self.channel.clone())
            .delete(self.request(
                DeleteImageRequest {
                    name: reference.to_string(),
                    sync: false,
                    target: None,
                },
                None,
                Some(CALL_TIMEOUT),
            ))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(Self::api_err(reference, "remove", "images.Delete")(s)),
        }
    }

    async fn run_check(
        &self,
        reference: &str,
        n: u32,
        args: &[String],
        timeout: Duration,
    ) -> Result<String, ContainerdError> {
        self.ctr.run_check(reference, n, args, timeout).await
    }
}
