//! OCI manifests, indexes, descriptors and image configs; Docker v2 media types mapped to their
//! OCI equivalents; platform selection.
//!
//! Parsing is lenient about what it does not need (unknown fields are ignored) and strict about
//! what it does: every digest is validated ([`Digest`]), sizes are required, and the kind of a
//! document is taken from its `mediaType` field, else from the HTTP `Content-Type`, else from its
//! shape (`manifests` → index, `config` + `layers` → manifest). Docker schema 1 manifests are
//! refused. After parsing, every media type is the OCI one ([`normalize_media_type`]); digests
//! are always computed over the bytes as received, never over a re-serialization.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::digest::Digest;

/// OCI and Docker media types.
pub mod media_type {
    /// OCI image index.
    pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
    /// OCI image manifest.
    pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    /// OCI image config.
    pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
    /// OCI uncompressed layer.
    pub const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
    /// OCI gzip layer.
    pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    /// OCI zstd layer.
    pub const OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
    /// OCI non-distributable uncompressed layer (deprecated).
    pub const OCI_LAYER_ND_TAR: &str = "application/vnd.oci.image.layer.nondistributable.v1.tar";
    /// OCI non-distributable gzip layer (deprecated).
    pub const OCI_LAYER_ND_GZIP: &str =
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip";
    /// OCI non-distributable zstd layer (deprecated).
    pub const OCI_LAYER_ND_ZSTD: &str =
        "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd";
    /// OCI empty descriptor (artifacts).
    pub const OCI_EMPTY: &str = "application/vnd.oci.empty.v1+json";
    /// Docker manifest list.
    pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
    /// Docker image manifest (schema 2).
    pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
    /// Docker schema 1 manifest (unsupported).
    pub const DOCKER_MANIFEST_V1: &str = "application/vnd.docker.distribution.manifest.v1+json";
    /// Docker schema 1 signed manifest (unsupported).
    pub const DOCKER_MANIFEST_V1_SIGNED: &str =
        "application/vnd.docker.distribution.manifest.v1+prettyjws";
    /// Docker image config.
    pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
    /// Docker gzip layer.
    pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
    /// Docker foreign (non-distributable) gzip layer.
    pub const DOCKER_FOREIGN_LAYER_GZIP: &str =
        "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip";
    /// Docker uncompressed layer (seen in the wild).
    pub const DOCKER_LAYER_TAR: &str = "application/vnd.docker.image.rootfs.diff.tar";

    /// The `Accept` header for manifest requests: OCI and Docker, index and manifest.
    pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
        application/vnd.oci.image.manifest.v1+json, \
        application/vnd.docker.distribution.manifest.list.v2+json, \
        application/vnd.docker.distribution.manifest.v2+json";
}

/// Annotation naming a manifest's tag in an OCI layout's `index.json`.
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";
/// Annotation naming a file in an artifact.
pub const ANNOTATION_TITLE: &str = "org.opencontainers.image.title";

/// Most bytes a manifest, index or config may have (as containerd).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// The OCI equivalent of a Docker media type (others are returned unchanged).
pub fn normalize_media_type(mt: &str) -> &str {
    use media_type::*;
    match mt {
        DOCKER_LIST => OCI_INDEX,
        DOCKER_MANIFEST => OCI_MANIFEST,
        DOCKER_CONFIG => OCI_CONFIG,
        DOCKER_LAYER_GZIP => OCI_LAYER_GZIP,
        DOCKER_FOREIGN_LAYER_GZIP => OCI_LAYER_ND_GZIP,
        DOCKER_LAYER_TAR => OCI_LAYER_TAR,
        other => other,
    }
}

/// How a layer's tar stream is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar stream.
    None,
    /// gzip.
    Gzip,
    /// zstd.
    Zstd,
}

impl Compression {
    /// The compression a (normalized or Docker) layer media type declares; `None` when the media
    /// type is not a tar layer at all.
    pub fn of_media_type(mt: &str) -> Option<Self> {
        use media_type::*;
        let mt = normalize_media_type(mt);
        match mt {
            OCI_LAYER_TAR | OCI_LAYER_ND_TAR => Some(Self::None),
            OCI_LAYER_GZIP | OCI_LAYER_ND_GZIP => Some(Self::Gzip),
            OCI_LAYER_ZSTD | OCI_LAYER_ND_ZSTD => Some(Self::Zstd),
            // Artifact layers with their own types: go by the suffix.
            _ if mt.ends_with(".tar+gzip")
                || mt.ends_with(".tar.gz")
                || mt.ends_with("tar+gzip") =>
            {
                Some(Self::Gzip)
            }
            _ if mt.ends_with(".tar+zstd")
                || mt.ends_with(".tar.zst")
                || mt.ends_with("tar+zstd") =>
            {
                Some(Self::Zstd)
            }
            _ if mt.ends_with(".tar") || mt == "application/x-tar" => Some(Self::None),
            _ => None,
        }
    }

    /// The compression the first bytes of a blob show (gzip `1f 8b`, zstd `28 b5 2f fd`).
    pub fn sniff(head: &[u8]) -> Option<Self> {
        if head.starts_with(&[0x1f, 0x8b]) {
            Some(Self::Gzip)
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Some(Self::Zstd)
        } else {
            None
        }
    }
}

/// The CPU architectures machines run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// x86-64.
    Amd64,
    /// 64-bit ARM.
    Arm64,
}

impl Arch {
    /// The architecture this binary was built for (`amd64` unless `aarch64`).
    pub fn host() -> Self {
        if cfg!(target_arch = "aarch64") {
            Self::Arm64
        } else {
            Self::Amd64
        }
    }

    /// `amd64` or `arm64`, as OCI platforms spell them.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Amd64 => "amd64",
            Self::Arm64 => "arm64",
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An architecture name that is not `amd64`/`x86_64` or `arm64`/`aarch64`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported architecture {0:?} (amd64 or arm64)")]
pub struct ArchError(pub String);

impl std::str::FromStr for Arch {
    type Err = ArchError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "amd64" | "x86_64" => Ok(Self::Amd64),
            "arm64" | "aarch64" => Ok(Self::Arm64),
            other => Err(ArchError(other.to_string())),
        }
    }
}

/// A platform in an index entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    /// CPU architecture (`amd64`, `arm64`, ...).
    pub architecture: String,
    /// Operating system (`linux`).
    pub os: String,
    /// CPU variant (`v8`), ignored for selection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// OS version (Windows).
    #[serde(
        rename = "os.version",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub os_version: Option<String>,
}

impl Platform {
    /// `linux/<arch>`.
    pub fn linux(arch: Arch) -> Self {
        Self {
            architecture: arch.as_str().into(),
            os: "linux".into(),
            variant: None,
            os_version: None,
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// A content descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Media type of the referenced content.
    pub media_type: String,
    /// Digest of the referenced content.
    pub digest: Digest,
    /// Size in bytes of the referenced content.
    pub size: u64,
    /// Alternative download locations (foreign layers); not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub urls: Option<Vec<String>>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Platform of an index entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    /// Artifact type of an index entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
}

impl Descriptor {
    /// A descriptor of `bytes` with `media_type`.
    pub fn of(media_type: &str, bytes: &[u8]) -> Self {
        Self {
            media_type: media_type.into(),
            digest: Digest::of(bytes),
            size: bytes.len() as u64,
            urls: None,
            annotations: None,
            platform: None,
            artifact_type: None,
        }
    }

    /// The same descriptor with a platform.
    pub fn with_platform(mut self, platform: Platform) -> Self {
        self.platform = Some(platform);
        self
    }

    /// The value of annotation `key`.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key).map(String::as_str)
    }

    /// The same descriptor with annotation `key=value` added.
    pub fn with_annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }

    fn normalize(&mut self) {
        self.media_type = normalize_media_type(&self.media_type).to_string();
    }
}

/// An image index (or Docker manifest list).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageIndex {
    /// Always 2.
    pub schema_version: u32,
    /// [`media_type::OCI_INDEX`] once parsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// Artifact type, for artifact indexes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// The entries.
    pub manifests: Vec<Descriptor>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

impl ImageIndex {
    /// An OCI index of `manifests`.
    pub fn new(manifests: Vec<Descriptor>) -> Self {
        Self {
            schema_version: 2,
            media_type: Some(media_type::OCI_INDEX.into()),
            artifact_type: None,
            manifests,
            annotations: None,
        }
    }
}

/// An image manifest (or Docker schema 2 manifest), also used for artifacts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    /// Always 2.
    pub schema_version: u32,
    /// [`media_type::OCI_MANIFEST`] once parsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// Artifact type, for artifacts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// The config blob.
    pub config: Descriptor,
    /// The layers, bottom first.
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

impl ImageManifest {
    /// An OCI image manifest of `config` and `layers`.
    pub fn new(config: Descriptor, layers: Vec<Descriptor>) -> Self {
        Self {
            schema_version: 2,
            media_type: Some(media_type::OCI_MANIFEST.into()),
            artifact_type: None,
            config,
            layers,
            annotations: None,
        }
    }

    /// The artifact type: `artifactType`, else the config's media type.
    pub fn effective_artifact_type(&self) -> &str {
        self.artifact_type
            .as_deref()
            .unwrap_or(&self.config.media_type)
    }
}

/// The parts of an image config the agent reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// CPU architecture.
    #[serde(default)]
    pub architecture: Option<String>,
    /// Operating system.
    #[serde(default)]
    pub os: Option<String>,
    /// The layers' uncompressed digests.
    #[serde(default)]
    pub rootfs: Option<RootFs>,
}

/// `rootfs` of an image config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootFs {
    /// Always `layers`.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// sha256 of each layer's uncompressed tar, bottom first.
    #[serde(default)]
    pub diff_ids: Vec<Digest>,
}

/// A parsed manifest document.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // short-lived, one at a time: boxing buys nothing
pub enum Manifest {
    /// An index or manifest list.
    Index(ImageIndex),
    /// An image manifest.
    Image(ImageManifest),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Probe {
    #[serde(default)]
    schema_version: Option<u32>,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    config: Option<serde::de::IgnoredAny>,
}

/// Parses a manifest or index. `content_type` is the HTTP `Content-Type` (if any). The error is
/// a human-readable reason.
pub fn parse_manifest(content_type: Option<&str>, bytes: &[u8]) -> Result<Manifest, ManifestError> {
    use media_type::*;
    let probe: Probe =
        serde_json::from_slice(bytes).map_err(|e| ManifestError::NotJson(e.to_string()))?;
    let declared = probe.media_type.as_deref().or_else(|| {
        content_type
            .map(|c| c.split(';').next().unwrap_or(c).trim())
            .filter(|c| !c.is_empty() && *c != "application/json" && *c != "text/plain")
    });
    if matches!(
        declared,
        Some(DOCKER_MANIFEST_V1 | DOCKER_MANIFEST_V1_SIGNED)
    ) || probe.schema_version == Some(1)
    {
        return Err(ManifestError::SchemaV1);
    }
    let kind = match declared.map(normalize_media_type) {
        Some(OCI_INDEX) => OCI_INDEX,
        Some(OCI_MANIFEST) => OCI_MANIFEST,
        Some(other) if probe.manifests.is_none() && probe.config.is_none() => {
            return Err(ManifestError::UnsupportedMediaType(other.to_string()));
        }
        _ if probe.manifests.is_some() => OCI_INDEX,
        _ if probe.config.is_some() => OCI_MANIFEST,
        _ => return Err(ManifestError::Neither),
    };
    if kind == OCI_INDEX {
        let mut ix: ImageIndex = serde_json::from_slice(bytes)
            .map_err(|e| ManifestError::InvalidIndex(e.to_string()))?;
        ix.media_type = Some(OCI_INDEX.into());
        ix.manifests.iter_mut().for_each(Descriptor::normalize);
        Ok(Manifest::Index(ix))
    } else {
        let mut m: ImageManifest = serde_json::from_slice(bytes)
            .map_err(|e| ManifestError::InvalidManifest(e.to_string()))?;
        m.media_type = Some(OCI_MANIFEST.into());
        m.config.normalize();
        m.layers.iter_mut().for_each(Descriptor::normalize);
        Ok(Manifest::Image(m))
    }
}

/// Why [`parse_manifest`] refused a document.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// Not JSON, or not the fields every manifest has.
    #[error("not a JSON manifest: {0}")]
    NotJson(String),
    /// Docker's schema 1, which has no content-addressed config.
    #[error("Docker schema 1 manifests are not supported")]
    SchemaV1,
    /// A media type that is neither an index nor an image manifest.
    #[error("unsupported manifest media type {0}")]
    UnsupportedMediaType(String),
    /// No media type, and neither `manifests` nor `config`.
    #[error("neither an index nor a manifest")]
    Neither,
    /// An index whose fields do not decode.
    #[error("invalid index: {0}")]
    InvalidIndex(String),
    /// An image manifest whose fields do not decode.
    #[error("invalid manifest: {0}")]
    InvalidManifest(String),
}

/// [`select_platform`] found no entry for the platform: the platforms the index has (none when
/// it is empty), each as `os/architecture[/variant]` or `(no platform)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoPlatform {
    /// The index's platforms.
    pub available: Vec<String>,
}

impl std::fmt::Display for NoPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.available.is_empty() {
            f.write_str("the index is empty")
        } else {
            f.write_str(&self.available.join(", "))
        }
    }
}

impl std::error::Error for NoPlatform {}

/// Whether an index entry is an attestation or other non-image entry (`unknown/unknown`).
fn is_attestation(d: &Descriptor) -> bool {
    d.annotation("vnd.docker.reference.type") == Some("attestation-manifest")
}

/// Picks the entry of `index` for `linux/<arch>` (variant ignored). An index whose only entry has
/// no platform is accepted. `Err` lists the platforms available.
pub fn select_platform(index: &ImageIndex, arch: Arch) -> Result<&Descriptor, NoPlatform> {
    let candidates: Vec<&Descriptor> = index
        .manifests
        .iter()
        .filter(|d| !is_attestation(d))
        .collect();
    if let Some(d) = candidates.iter().find(|d| {
        d.platform
            .as_ref()
            .is_some_and(|p| p.os == "linux" && p.architecture == arch.as_str())
    }) {
        return Ok(d);
    }
    if let [only] = candidates.as_slice()
        && only.platform.is_none()
    {
        return Ok(only);
    }
    let available: Vec<String> = index
        .manifests
        .iter()
        .map(|d| match &d.platform {
            Some(p) => p.to_string(),
            None => "(no platform)".to_string(),
        })
        .collect();
    Err(NoPlatform { available })
}

#[cfg(test)]
mod tests {
    use super::*;

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    #[test]
    fn docker_manifest_list_is_converted_to_an_oci_index() {
        let json = format!(
            r#"{{"schemaVersion":2,"mediaType":"{}","manifests":[
                {{"mediaType":"{}","digest":"{D1}","size":10,"platform":{{"architecture":"amd64","os":"linux"}}}},
                {{"mediaType":"{}","digest":"{D2}","size":11,"platform":{{"architecture":"arm64","os":"linux","variant":"v8"}}}}]}}"#,
            media_type::DOCKER_LIST,
            media_type::DOCKER_MANIFEST,
            media_type::DOCKER_MANIFEST
        );
        let Manifest::Index(ix) = parse_manifest(None, json.as_bytes()).unwrap() else {
            panic!("not an index")
        };
        assert_eq!(ix.media_type.as_deref(), Some(media_type::OCI_INDEX));
        assert!(
            ix.manifests
                .iter()
                .all(|d| d.media_type == media_type::OCI_MANIFEST)
        );
        assert_eq!(
            select_platform(&ix, Arch::Amd64).unwrap().digest.as_str(),
            D1
        );
        assert_eq!(
            select_platform(&ix, Arch::Arm64).unwrap().digest.as_str(),
            D2
        );
    }

    #[test]
    fn docker_manifest_by_content_type_is_converted() {
        let json = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"{}","digest":"{D1}","size":3}},
               "layers":[{{"mediaType":"{}","digest":"{D2}","size":4}}]}}"#,
            media_type::DOCKER_CONFIG,
            media_type::DOCKER_LAYER_GZIP
        );
        let m = parse_manifest(Some(media_type::DOCKER_MANIFEST), json.as_bytes()).unwrap();
        let Manifest::Image(m) = m else { panic!() };
        assert_eq!(m.config.media_type, media_type::OCI_CONFIG);
        assert_eq!(m.layers[0].media_type, media_type::OCI_LAYER_GZIP);
    }

    #[test]
    fn bad_documents_are_refused() {
        assert!(parse_manifest(None, b"{").is_err());
        assert_eq!(
            parse_manifest(None, br#"{"schemaVersion":1,"fsLayers":[]}"#).unwrap_err(),
            ManifestError::SchemaV1
        );
        assert!(parse_manifest(Some("application/x-foo"), br#"{"schemaVersion":2}"#).is_err());
        let bad_digest = br#"{"schemaVersion":2,"config":{"mediaType":"x","digest":"sha256:../../x","size":1},"layers":[]}"#;
        assert!(parse_manifest(None, bad_digest).is_err());
    }

    #[test]
    fn platform_selection_lists_what_is_available() {
        let d = |a: &str, os: &str| {
            Descriptor::of(media_type::OCI_MANIFEST, a.as_bytes()).with_platform(Platform {
                architecture: a.into(),
                os: os.into(),
                variant: None,
                os_version: None,
            })
        };
        let ix = ImageIndex::new(vec![d("s390x", "linux"), d("amd64", "windows")]);
        let e = select_platform(&ix, Arch::Amd64).unwrap_err();
        assert_eq!(e.available, ["linux/s390x", "windows/amd64"]);
        assert_eq!(e.to_string(), "linux/s390x, windows/amd64");
        let single = ImageIndex::new(vec![Descriptor::of(media_type::OCI_MANIFEST, b"x")]);
        assert!(select_platform(&single, Arch::Arm64).is_ok());
        assert_eq!(
            select_platform(&ImageIndex::new(vec![]), Arch::Arm64)
                .unwrap_err()
                .to_string(),
            "the index is empty"
        );
    }

    #[test]
    fn layer_compression_from_media_type_and_magic() {
        use media_type::*;
        assert_eq!(
            Compression::of_media_type(DOCKER_LAYER_GZIP),
            Some(Compression::Gzip)
        );
        assert_eq!(
            Compression::of_media_type(OCI_LAYER_ZSTD),
            Some(Compression::Zstd)
        );
        assert_eq!(
            Compression::of_media_type(OCI_LAYER_TAR),
            Some(Compression::None)
        );
        assert_eq!(
            Compression::of_media_type("application/vnd.example.bundle.tar+gzip"),
            Some(Compression::Gzip)
        );
        assert_eq!(Compression::of_media_type("application/json"), None);
        assert_eq!(
            Compression::sniff(&[0x1f, 0x8b, 8]),
            Some(Compression::Gzip)
        );
        assert_eq!(
            Compression::sniff(&[0x28, 0xb5, 0x2f, 0xfd]),
            Some(Compression::Zstd)
        );
        assert_eq!(Compression::sniff(b"etc/"), None);
    }
}
