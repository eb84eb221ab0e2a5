//! Local OCI image layouts: a directory with an `oci-layout` file, an `index.json` and
//! `blobs/sha256/<hex>` (the OCI image-layout specification).
//!
//! [`OciLayout`] reads one as an image source, with the same platform selection and digest
//! verification as a registry: every manifest, index and config is hashed before it is parsed,
//! and every layer is hashed before it is unpacked ([`OciLayout::verify_blob`]). It also writes
//! one ([`OciLayout::create`], [`OciLayout::add_blob`], [`OciLayout::set_index`]): the puller
//! keeps its downloads in this format, and tests build images with it.

use std::path::{Path, PathBuf};

use super::OciError;
use super::ResolvedImage;
use super::digest::Digest;
use super::manifest::{
    ANNOTATION_REF_NAME, Arch, Descriptor, ImageIndex, MAX_MANIFEST_BYTES, Manifest,
    parse_manifest, select_platform,
};
use super::reference::LayoutTarget;

/// The `oci-layout` file's content.
pub const LAYOUT_FILE_CONTENT: &str = r#"{"imageLayoutVersion":"1.0.0"}"#;
/// Annotation containerd writes with the full image name.
const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";

/// An OCI image layout directory.
#[derive(Clone, Debug)]
pub struct OciLayout {
    dir: PathBuf,
    /// How the layout is named in errors (the image source).
    name: String,
}

impl OciLayout {
    /// Opens an existing layout: the `oci-layout` file must be there with version 1.x.
    pub fn open(dir: &Path) -> Result<Self, OciError> {
        let me = Self::unchecked(dir);
        let marker = dir.join("oci-layout");
        let text = std::fs::read_to_string(&marker).map_err(|e| me.io("read", &marker, e))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| me.invalid(format!("oci-layout file is not JSON: {e}")))?;
        match v.get("imageLayoutVersion").and_then(|v| v.as_str()) {
            Some(ver) if ver.starts_with("1.") => Ok(me),
            other => Err(me.invalid(format!(
                "unsupported imageLayoutVersion {other:?} (want 1.x)"
            ))),
        }
    }

    /// Creates (or reuses) a layout at `dir`: the directory, `oci-layout` and `blobs/sha256`.
    pub fn create(dir: &Path) -> Result<Self, OciError> {
        let me = Self::unchecked(dir);
        let blobs = dir.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).map_err(|e| me.io("create directory", &blobs, e))?;
        let marker = dir.join("oci-layout");
        if !marker.exists() {
            std::fs::write(&marker, LAYOUT_FILE_CONTENT).map_err(|e| me.io("write", &marker, e))?;
        }
        Ok(me)
    }

    fn unchecked(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            name: format!("{}{}", super::reference::LAYOUT_SCHEME, dir.display()),
        }
    }

    /// Uses `name` (the image source) in errors instead of the directory.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The layout directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn io(&self, op: &'static str, path: &Path, cause: std::io::Error) -> OciError {
        OciError::Io {
            reference: self.name.clone(),
            op,
            path: path.to_path_buf(),
            cause,
        }
    }

    fn invalid(&self, reason: String) -> OciError {
        OciError::Layout {
            reference: self.name.clone(),
            dir: self.dir.clone(),
            reason,
        }
    }

    /// Where the blob with `digest` is (or goes).
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.dir.join("blobs/sha256").join(digest.hex())
    }

    /// Reads `index.json`.
    pub fn index(&self) -> Result<ImageIndex, OciError> {
        let p = self.dir.join("index.json");
        let bytes = std::fs::read(&p).map_err(|e| self.io("read", &p, e))?;
        match parse_manifest(None, &bytes) {
            Ok(Manifest::Index(ix)) => Ok(ix),
            Ok(Manifest::Image(_)) => Err(self.invalid("index.json is not an index".into())),
            Err(e) => Err(self.invalid(format!("index.json: {e}"))),
        }
    }

    /// Writes `index.json` (atomically).
    pub fn set_index(&self, index: &ImageIndex) -> Result<(), OciError> {
        let p = self.dir.join("index.json");
        let tmp = self.dir.join(".index.json.tmp");
        let bytes = serde_json::to_vec_pretty(index)
            .map_err(|e| self.invalid(format!("serialize index: {e}")))?;
        std::fs::write(&tmp, bytes).map_err(|e| self.io("write", &tmp, e))?;
        std::fs::rename(&tmp, &p).map_err(|e| self.io("rename", &p, e))
    }

    /// Stores `bytes` as a blob and returns its descriptor with `media_type`.
    pub fn add_blob(&self, media_type: &str, bytes: &[u8]) -> Result<Descriptor, OciError> {
        let d = Descriptor::of(media_type, bytes);
        let p = self.blob_path(&d.digest);
        if !p.exists() {
            let tmp = p.with_extension("tmp");
            std::fs::write(&tmp, bytes).map_err(|e| self.io("write", &tmp, e))?;
            std::fs::rename(&tmp, &p).map_err(|e| self.io("rename", &p, e))?;
        }
        Ok(d)
    }

    /// Hashes the blob of `desc` and checks its digest and size. `what` names it in errors.
    pub fn verify_blob(&self, desc: &Descriptor, what: &'static str) -> Result<PathBuf, OciError> {
        let p = self.blob_path(&desc.digest);
        let size = std::fs::metadata(&p)
            .map_err(|e| self.io("stat", &p, e))?
            .len();
        if size != desc.size {
            return Err(OciError::SizeMismatch {
                reference: self.name.clone(),
                what,
                digest: desc.digest.clone(),
                expected: desc.size,
                actual: size,
            });
        }
        let actual = Digest::of_file(&p).map_err(|e| self.io("read", &p, e))?;
        if actual != desc.digest {
            return Err(OciError::DigestMismatch {
                reference: self.name.clone(),
                what,
                expected: desc.digest.clone(),
                actual,
            });
        }
        Ok(p)
    }

    /// Reads a small blob (manifest, index, config) and checks its digest and size.
    pub fn read_blob(&self, desc: &Descriptor, what: &'static str) -> Result<Vec<u8>, OciError> {
        if desc.size > MAX_MANIFEST_BYTES {
            return Err(self.invalid(format!(
                "{what} {} is {} bytes, more than the {MAX_MANIFEST_BYTES} allowed",
                desc.digest, desc.size
            )));
        }
        let p = self.blob_path(&desc.digest);
        let bytes = std::fs::read(&p).map_err(|e| self.io("read", &p, e))?;
        let actual = Digest::of(&bytes);
        if actual != desc.digest {
            return Err(OciError::DigestMismatch {
                reference: self.name.clone(),
                what,
                expected: desc.digest.clone(),
                actual,
            });
        }
        if bytes.len() as u64 != desc.size {
            return Err(OciError::SizeMismatch {
                reference: self.name.clone(),
                what,
                digest: desc.digest.clone(),
                expected: desc.size,
                actual: bytes.len() as u64,
            });
        }
        Ok(bytes)
    }

    /// The `index.json` entry for `target`.
    pub fn find(&self, target: &LayoutTarget) -> Result<Descriptor, OciError> {
        let index = self.index()?;
        let found = match target {
            LayoutTarget::Digest(d) => index.manifests.iter().find(|m| &m.digest == d).cloned(),
            LayoutTarget::Tag(t) => index
                .manifests
                .iter()
                .find(|m| m.annotation(ANNOTATION_REF_NAME) == Some(t.as_str()))
                .or_else(|| {
                    index.manifests.iter().find(|m| {
                        m.annotation(ANNOTATION_CONTAINERD_NAME)
                            .is_some_and(|n| n.ends_with(&format!(":{t}")))
                    })
                })
                .cloned(),
        };
        if let Some(d) = found {
            return Ok(d);
        }
        // A digest not listed in index.json may still be a blob of the layout (a child
        // manifest); its media type comes from its content.
        if let LayoutTarget::Digest(d) = target
            && self.blob_path(d).is_file()
        {
            let p = self.blob_path(d);
            let size = std::fs::metadata(&p)
                .map_err(|e| self.io("stat", &p, e))?
                .len();
            return Ok(Descriptor {
                media_type: String::new(),
                digest: d.clone(),
                size,
                urls: None,
                annotations: None,
                platform: None,
                artifact_type: None,
            });
        }
        let tags: Vec<&str> = index
            .manifests
            .iter()
            .filter_map(|m| m.annotation(ANNOTATION_REF_NAME))
            .collect();
        Err(self.invalid(match target {
            LayoutTarget::Tag(t) => format!(
                "no manifest tagged {t:?} in index.json (tags: {})",
                if tags.is_empty() {
                    "none".into()
                } else {
                    tags.join(", ")
                }
            ),
            LayoutTarget::Digest(d) => format!("no manifest {d} in the layout"),
        }))
    }

    /// Resolves `target` to the image manifest for `linux/<arch>`, verifying every document.
    pub fn resolve(&self, target: &LayoutTarget, arch: Arch) -> Result<ResolvedImage, OciError> {
        let mut desc = self.find(target)?;
        let mut index_digest = None;
        for _ in 0..super::MAX_INDEX_DEPTH {
            let bytes = self.read_blob(&desc, "manifest")?;
            let media = (!desc.media_type.is_empty()).then_some(desc.media_type.as_str());
            match parse_manifest(media, &bytes) {
                Ok(Manifest::Image(manifest)) => {
                    return Ok(ResolvedImage {
                        digest: desc.digest,
                        manifest,
                        bytes,
                        index_digest,
                    });
                }
                Ok(Manifest::Index(ix)) => {
                    let next = select_platform(&ix, arch)
                        .map_err(|available| OciError::NoPlatform {
                            reference: self.name.clone(),
                            wanted: format!("linux/{arch}"),
                            available: available.to_string(),
                        })?
                        .clone();
                    index_digest.get_or_insert(desc.digest.clone());
                    desc = next;
                }
                Err(reason) => {
                    return Err(OciError::Invalid {
                        reference: self.name.clone(),
                        what: "manifest",
                        digest: Some(desc.digest.clone()),
                        reason: reason.to_string(),
                    });
                }
            }
        }
        Err(self.invalid(format!(
            "indexes nested deeper than {}",
            super::MAX_INDEX_DEPTH
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{ImageManifest, Platform, media_type};

    fn image(layout: &OciLayout, arch: &str) -> Descriptor {
        let cfg = layout
            .add_blob(
                media_type::OCI_CONFIG,
                format!(r#"{{"architecture":"{arch}","os":"linux"}}"#).as_bytes(),
            )
            .unwrap();
        let layer = layout
            .add_blob(media_type::OCI_LAYER_TAR, arch.as_bytes())
            .unwrap();
        let m = ImageManifest::new(cfg, vec![layer]);
        layout
            .add_blob(media_type::OCI_MANIFEST, &serde_json::to_vec(&m).unwrap())
            .unwrap()
    }

    #[test]
    fn resolves_tags_digests_and_platforms() {
        let t = tempfile::tempdir().unwrap();
        let l = OciLayout::create(t.path()).unwrap();
        let amd = image(&l, "amd64").with_platform(Platform::linux(Arch::Amd64));
        let arm = image(&l, "arm64").with_platform(Platform::linux(Arch::Arm64));
        let ix = ImageIndex::new(vec![amd.clone(), arm.clone()]);
        let ixd = l
            .add_blob(media_type::OCI_INDEX, &serde_json::to_vec(&ix).unwrap())
            .unwrap()
            .with_annotation(ANNOTATION_REF_NAME, "multi");
        let single = image(&l, "amd64").with_annotation(ANNOTATION_REF_NAME, "single");
        l.set_index(&ImageIndex::new(vec![ixd.clone(), single.clone()]))
            .unwrap();

        let l = OciLayout::open(t.path()).unwrap();
        let r = l
            .resolve(&LayoutTarget::Tag("multi".into()), Arch::Arm64)
            .unwrap();
        assert_eq!(r.digest, arm.digest);
        assert_eq!(r.index_digest, Some(ixd.digest.clone()));
        let r = l
            .resolve(&LayoutTarget::Digest(ixd.digest.clone()), Arch::Amd64)
            .unwrap();
        assert_eq!(r.digest, amd.digest);
        let r = l
            .resolve(&LayoutTarget::Tag("single".into()), Arch::Arm64)
            .unwrap();
        assert_eq!(r.digest, single.digest);
        let r = l
            .resolve(&LayoutTarget::Digest(arm.digest.clone()), Arch::Amd64)
            .unwrap();
        assert_eq!(r.digest, arm.digest);

        let e = l
            .resolve(&LayoutTarget::Tag("nope".into()), Arch::Amd64)
            .unwrap_err();
        assert!(e.to_string().contains("multi, single"), "{e}");
    }

    #[test]
    fn corrupted_blobs_are_detected() {
        let t = tempfile::tempdir().unwrap();
        let l = OciLayout::create(t.path()).unwrap();
        let m = image(&l, "amd64").with_annotation(ANNOTATION_REF_NAME, "v1");
        l.set_index(&ImageIndex::new(vec![m.clone()])).unwrap();
        let r = l
            .resolve(&LayoutTarget::Tag("v1".into()), Arch::Amd64)
            .unwrap();
        let layer = &r.manifest.layers[0];
        l.verify_blob(layer, "layer").unwrap();
        std::fs::write(l.blob_path(&layer.digest), b"AMD64").unwrap();
        let e = l.verify_blob(layer, "layer").unwrap_err().to_string();
        assert!(
            e.contains("digest mismatch") && e.contains(layer.digest.as_str()),
            "{e}"
        );
        std::fs::write(l.blob_path(&m.digest), b"{}").unwrap();
        let e = l
            .resolve(&LayoutTarget::Tag("v1".into()), Arch::Amd64)
            .unwrap_err();
        assert!(e.to_string().contains(m.digest.as_str()), "{e}");
    }

    #[test]
    fn missing_or_bad_layout_file() {
        let t = tempfile::tempdir().unwrap();
        assert!(OciLayout::open(t.path()).is_err());
        std::fs::write(
            t.path().join("oci-layout"),
            r#"{"imageLayoutVersion":"2.0.0"}"#,
        )
        .unwrap();
        let e = OciLayout::open(t.path()).unwrap_err().to_string();
        assert!(e.contains("2.0.0"), "{e}");
    }
}
