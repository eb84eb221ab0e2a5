//! Images derived from another by appending one layer: the base image's manifest and config
//! with the layer added ([`append_layer`]), and the same over OCI image layouts
//! ([`derive_layout`], e.g. from the layout [`crate::build_agent_image`] writes).
//!
//! Everything of the base is kept as it is (its layers, environment, entrypoint, labels, and
//! fields this crate does not know): the layer's descriptor is appended to the manifest's
//! `layers`, its `diff_id` to the config's `rootfs.diff_ids`, a `history` entry (the base's
//! `created`, the given `created_by`) to the config's history when it has one, and the
//! manifest gains the annotation [`ANNOTATION_BASE_DIGEST`] naming the base. The documents are
//! re-serialized with their keys in the base's order and new keys last, so the same base and
//! layer always give the same digest.
//!
//! Only OCI image manifests are derived: a Docker schema 2 manifest would need Docker media
//! types for the new layer, and nothing here builds those.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};

use crate::layer::{LayerBlob, sha256_digest};
use crate::oci::{
    ANNOTATION_CONTAINERD_NAME, ANNOTATION_REF_NAME, MEDIA_TYPE_CONFIG, MEDIA_TYPE_INDEX,
    MEDIA_TYPE_MANIFEST,
};

/// The OCI annotation naming the manifest an image was derived from.
pub const ANNOTATION_BASE_DIGEST: &str = "org.opencontainers.image.base.digest";

/// A derived image's documents (its layers are the base's plus the appended one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Derived {
    /// The manifest's bytes.
    pub manifest: Vec<u8>,
    /// `sha256:<hex>` of [`Self::manifest`]: the derived image's identity.
    pub manifest_digest: String,
    /// The manifest's media type (the base's).
    pub manifest_media_type: String,
    /// The config's bytes.
    pub config: Vec<u8>,
    /// `sha256:<hex>` of [`Self::config`].
    pub config_digest: String,
    /// The config's media type (the base's).
    pub config_media_type: String,
}

fn object<'a>(v: &'a mut Value, what: &str) -> Result<&'a mut Map<String, Value>> {
    v.as_object_mut()
        .with_context(|| format!("the base {what} is not a JSON object"))
}

/// Appends `layer` to the image whose manifest is `base_manifest` and config `base_config`
/// (the bytes as stored). The config must be the one the manifest names (its digest is
/// checked). `created_by` goes into the new history entry.
pub fn append_layer(
    base_manifest: &[u8],
    base_config: &[u8],
    layer: &LayerBlob,
    created_by: &str,
) -> Result<Derived> {
    let base_digest = sha256_digest(base_manifest);
    let mut manifest: Value =
        serde_json::from_slice(base_manifest).context("the base manifest is not JSON")?;
    let mut config: Value =
        serde_json::from_slice(base_config).context("the base config is not JSON")?;

    let m = object(&mut manifest, "manifest")?;
    let manifest_media_type = match m.get("mediaType").and_then(Value::as_str) {
        None | Some(MEDIA_TYPE_MANIFEST) => MEDIA_TYPE_MANIFEST.to_string(),
        Some(other) => bail!(
            "the base manifest {base_digest} is {other}; only OCI image manifests ({MEDIA_TYPE_MANIFEST}) are derived"
        ),
    };
    let config_desc = m
        .get_mut("config")
        .and_then(Value::as_object_mut)
        .with_context(|| format!("the base manifest {base_digest} has no config descriptor"))?;
    let named = config_desc
        .get("digest")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let given = sha256_digest(base_config);
    if named != given {
        bail!(
            "the base manifest {base_digest} names config {named:?}, not the config given ({given})"
        );
    }
    let config_media_type = config_desc
        .get("mediaType")
        .and_then(Value::as_str)
        .unwrap_or(MEDIA_TYPE_CONFIG)
        .to_string();

    let c = object(&mut config, "config")?;
    let created = c.get("created").cloned();
    let diff_ids = c
        .get_mut("rootfs")
        .and_then(Value::as_object_mut)
        .and_then(|r| r.get_mut("diff_ids"))
        .and_then(Value::as_array_mut)
        .context("the base config has no rootfs.diff_ids")?;
    diff_ids.push(Value::String(layer.diff_id.clone()));
    if let Some(history) = c.get_mut("history").and_then(Value::as_array_mut) {
        let mut entry = Map::new();
        if let Some(created) = created {
            entry.insert("created".into(), created);
        }
        entry.insert("created_by".into(), Value::String(created_by.to_string()));
        history.push(Value::Object(entry));
    }
    let config_bytes = serde_json::to_vec(&config).context("serialize the derived config")?;
    let config_digest = sha256_digest(&config_bytes);

    let m = object(&mut manifest, "manifest")?;
    if let Some(desc) = m.get_mut("config").and_then(Value::as_object_mut) {
        desc.insert("digest".into(), Value::String(config_digest.clone()));
        desc.insert("size".into(), json!(config_bytes.len() as u64));
    }
    m.get_mut("layers")
        .and_then(Value::as_array_mut)
        .with_context(|| format!("the base manifest {base_digest} has no layers"))?
        .push(json!({
            "mediaType": layer.media_type,
            "digest": layer.digest,
            "size": layer.size,
        }));
    let annotations = m
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .with_context(|| {
            format!("the base manifest {base_digest}'s annotations are not an object")
        })?;
    annotations.insert(ANNOTATION_BASE_DIGEST.into(), Value::String(base_digest));
    let manifest_bytes = serde_json::to_vec(&manifest).context("serialize the derived manifest")?;
    Ok(Derived {
        manifest_digest: sha256_digest(&manifest_bytes),
        manifest: manifest_bytes,
        manifest_media_type,
        config_digest,
        config: config_bytes,
        config_media_type,
    })
}

fn blob_path(layout: &Path, digest: &str) -> Result<std::path::PathBuf> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .with_context(|| format!("unsupported digest {digest:?}"))?;
    Ok(layout.join("blobs/sha256").join(hex))
}

fn read_blob(layout: &Path, digest: &str) -> Result<Vec<u8>> {
    let p = blob_path(layout, digest)?;
    let bytes = std::fs::read(&p).with_context(|| format!("read {}", p.display()))?;
    let actual = sha256_digest(&bytes);
    if actual != digest {
        bail!("{} holds {actual}, not {digest}", p.display());
    }
    Ok(bytes)
}

fn write_blob(layout: &Path, digest: &str, bytes: &[u8]) -> Result<()> {
    let p = blob_path(layout, digest)?;
    std::fs::write(&p, bytes).with_context(|| format!("write {}", p.display()))
}

/// Writes, in the OCI layout `out` (created; its `index.json` replaced), the image of the
/// single-image layout `base` with `layer` appended, named `name` in the index as
/// [`crate::write_oci_layout`] names images. The base's blobs are copied. `base` and `out` may
/// not be the same directory.
pub fn derive_layout(
    base: &Path,
    out: &Path,
    name: &str,
    layer: &LayerBlob,
    created_by: &str,
) -> Result<Derived> {
    if name.is_empty() {
        bail!("an image in an OCI layout needs a name");
    }
    let index_path = base.join("index.json");
    let index: Value = serde_json::from_slice(
        &std::fs::read(&index_path).with_context(|| format!("read {}", index_path.display()))?,
    )
    .with_context(|| format!("{} is not JSON", index_path.display()))?;
    let entries = index
        .get("manifests")
        .and_then(Value::as_array)
        .with_context(|| format!("{} lists no manifests", index_path.display()))?;
    let [entry] = entries.as_slice() else {
        bail!(
            "{} lists {} manifests; derive_layout takes a layout of one image",
            index_path.display(),
            entries.len()
        );
    };
    let manifest_digest = entry
        .get("digest")
        .and_then(Value::as_str)
        .with_context(|| format!("{}: an entry without a digest", index_path.display()))?;
    let manifest_bytes = read_blob(base, manifest_digest)?;
    let manifest: Value = serde_json::from_slice(&manifest_bytes)
        .with_context(|| format!("manifest {manifest_digest} is not JSON"))?;
    let config_digest = manifest
        .pointer("/config/digest")
        .and_then(Value::as_str)
        .with_context(|| format!("manifest {manifest_digest} names no config"))?;
    let config_bytes = read_blob(base, config_digest)?;
    let derived = append_layer(&manifest_bytes, &config_bytes, layer, created_by)?;

    std::fs::create_dir_all(out.join("blobs/sha256"))
        .with_context(|| format!("create {}", out.display()))?;
    std::fs::write(out.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)
        .with_context(|| format!("write {}/oci-layout", out.display()))?;
    for l in manifest
        .get("layers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let d = l
            .get("digest")
            .and_then(Value::as_str)
            .with_context(|| format!("manifest {manifest_digest}: a layer without a digest"))?;
        let (from, to) = (blob_path(base, d)?, blob_path(out, d)?);
        std::fs::copy(&from, &to)
            .with_context(|| format!("copy {} to {}", from.display(), to.display()))?;
    }
    write_blob(out, &layer.digest, &layer.data)?;
    write_blob(out, &derived.config_digest, &derived.config)?;
    write_blob(out, &derived.manifest_digest, &derived.manifest)?;

    let mut desc = Map::new();
    desc.insert("mediaType".into(), json!(derived.manifest_media_type));
    desc.insert("digest".into(), json!(derived.manifest_digest));
    desc.insert("size".into(), json!(derived.manifest.len() as u64));
    if let Some(p) = entry.get("platform") {
        desc.insert("platform".into(), p.clone());
    }
    desc.insert(
        "annotations".into(),
        json!({ ANNOTATION_CONTAINERD_NAME: name, ANNOTATION_REF_NAME: name }),
    );
    let index_bytes = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_INDEX,
        "manifests": [Value::Object(desc)],
    }))
    .context("serialize index.json")?;
    std::fs::write(out.join("index.json"), index_bytes)
        .with_context(|| format!("write {}/index.json", out.display()))?;
    Ok(derived)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::Layer;
    use crate::oci::{Image, ImageConfig, host_architecture, write_oci_layout};
    use flex_oci::{Arch, LayerFile, LayoutTarget, OciLayout, UnpackOptions, unpack};
    use std::collections::BTreeMap;

    fn base(dir: &Path) -> crate::WrittenImage {
        let mut l = Layer::new();
        l.file("/opt/app/bin/app", 0o755, "app").unwrap();
        l.symlink("/opt/app/bin/entrypoint", "app").unwrap();
        let image = Image {
            name: "base:1".into(),
            config: ImageConfig {
                architecture: host_architecture().into(),
                os: "linux".into(),
                created: 1_700_000_000,
                env: vec!["A=b".into()],
                entrypoint: vec!["/opt/app/bin/entrypoint".into()],
                cmd: vec!["run".into()],
                working_dir: "/".into(),
                labels: BTreeMap::from([("k".into(), "v".into())]),
                created_by: "base".into(),
            },
            layers: vec![l.build(1_700_000_000, 6).unwrap()],
            annotations: BTreeMap::from([("org.opencontainers.image.version".into(), "1".into())]),
        };
        write_oci_layout(dir, &[image]).unwrap().remove(0)
    }

    fn extra() -> LayerBlob {
        let mut l = Layer::new();
        l.file("/opt/app/bin/entrypoint", 0o755, "replaced")
            .unwrap()
            .file("/opt/app/marker", 0o644, "extra\n")
            .unwrap();
        l.build(0, 9).unwrap()
    }

    #[test]
    fn a_derived_layout_keeps_the_base_and_appends_the_layer() {
        let d = tempfile::tempdir().unwrap();
        let written = base(&d.path().join("base"));
        let layer = extra();
        let out = d.path().join("derived");
        let derived = derive_layout(
            &d.path().join("base"),
            &out,
            "derived:1",
            &layer,
            "test layer",
        )
        .unwrap();
        assert_ne!(derived.manifest_digest, written.manifest.digest);

        // The agent's reader resolves it by name; layers are the base's, then the new one.
        let layout = OciLayout::open(&out).unwrap();
        let resolved = layout
            .resolve(&LayoutTarget::Tag("derived:1".into()), Arch::host())
            .unwrap();
        assert_eq!(resolved.digest.to_string(), derived.manifest_digest);
        let layers: Vec<String> = resolved
            .manifest
            .layers
            .iter()
            .map(|l| l.digest.to_string())
            .collect();
        assert_eq!(
            layers,
            [written.layers[0].digest.clone(), layer.digest.clone()]
        );
        assert_eq!(
            resolved.manifest.config.digest.to_string(),
            derived.config_digest
        );

        let m: Value = serde_json::from_slice(&derived.manifest).unwrap();
        assert_eq!(
            m["annotations"][ANNOTATION_BASE_DIGEST],
            written.manifest.digest.as_str()
        );
        assert_eq!(m["annotations"]["org.opencontainers.image.version"], "1");
        let c: Value = serde_json::from_slice(&derived.config).unwrap();
        assert_eq!(
            c["rootfs"]["diff_ids"],
            json!([written.diff_ids[0], layer.diff_id])
        );
        assert_eq!(c["history"][1]["created_by"], "test layer");
        assert_eq!(c["history"][1]["created"], c["created"]);
        assert_eq!(
            c["config"]["Entrypoint"],
            json!(["/opt/app/bin/entrypoint"])
        );
        assert_eq!(c["config"]["Labels"]["k"], "v");

        // Unpacked in order, the new layer's file replaces the base's link.
        let root = d.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let diff_ids = c["rootfs"]["diff_ids"].as_array().unwrap();
        let files: Vec<LayerFile> = resolved
            .manifest
            .layers
            .iter()
            .zip(diff_ids)
            .map(|(l, id)| LayerFile {
                path: layout.blob_path(&l.digest),
                media_type: l.media_type.clone(),
                name: l.digest.to_string(),
                diff_id: Some(id.as_str().unwrap().parse().unwrap()),
            })
            .collect();
        unpack(&root, &files, &UnpackOptions::default()).unwrap();
        let ep = root.join("opt/app/bin/entrypoint");
        assert!(!ep.symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(ep).unwrap(), "replaced");
        assert_eq!(
            std::fs::read_to_string(root.join("opt/app/bin/app")).unwrap(),
            "app"
        );
    }

    #[test]
    fn deriving_is_reproducible_and_depends_on_the_layer() {
        let d = tempfile::tempdir().unwrap();
        base(&d.path().join("base"));
        let a = derive_layout(
            &d.path().join("base"),
            &d.path().join("a"),
            "x:1",
            &extra(),
            "t",
        )
        .unwrap();
        let b = derive_layout(
            &d.path().join("base"),
            &d.path().join("b"),
            "x:1",
            &extra(),
            "t",
        )
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(
            std::fs::read(d.path().join("a/index.json")).unwrap(),
            std::fs::read(d.path().join("b/index.json")).unwrap()
        );
        let mut other = Layer::new();
        other.file("/opt/app/marker", 0o644, "other\n").unwrap();
        let c = derive_layout(
            &d.path().join("base"),
            &d.path().join("c"),
            "x:1",
            &other.build(0, 9).unwrap(),
            "t",
        )
        .unwrap();
        assert_ne!(a.manifest_digest, c.manifest_digest);
    }

    #[test]
    fn a_mismatched_config_or_docker_manifest_is_refused() {
        let layer = extra();
        let config = br#"{"rootfs":{"type":"layers","diff_ids":[]}}"#;
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"{MEDIA_TYPE_MANIFEST}","config":{{"mediaType":"{MEDIA_TYPE_CONFIG}","digest":"sha256:{}","size":2}},"layers":[]}}"#,
            "0".repeat(64)
        );
        let e = append_layer(manifest.as_bytes(), config, &layer, "t").unwrap_err();
        assert!(e.to_string().contains("not the config given"), "{e}");

        let docker = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json","config":{{"digest":"{}"}},"layers":[]}}"#,
            sha256_digest(config)
        );
        let e = append_layer(docker.as_bytes(), config, &layer, "t").unwrap_err();
        assert!(e.to_string().contains("only OCI image manifests"), "{e}");

        // Without a history, none is invented; the diff_id is still appended.
        let ok = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"{MEDIA_TYPE_CONFIG}","digest":"{}","size":{}}},"layers":[]}}"#,
            sha256_digest(config),
            config.len()
        );
        let derived = append_layer(ok.as_bytes(), config, &layer, "t").unwrap();
        let c: Value = serde_json::from_slice(&derived.config).unwrap();
        assert_eq!(c["rootfs"]["diff_ids"], json!([layer.diff_id]));
        assert!(c.get("history").is_none());
        assert_eq!(derived.manifest_media_type, MEDIA_TYPE_MANIFEST);
    }
}
