//! OCI documents (image config, manifest, index) serialized in a fixed field order, the OCI
//! image layout directory ([`write_oci_layout`]) and its tar archive ([`write_oci_archive`]).
//!
//! The documents are this module's own serde structs rather than the agent's reader types, so a
//! change in the agent's types can never change an image digest; the unit tests read the result
//! back with the agent's `oci::layout` reader.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::layer::{LayerBlob, sha256_digest};

/// Media type of an OCI image index.
pub const MEDIA_TYPE_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// Media type of an OCI image manifest.
pub const MEDIA_TYPE_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// Media type of an OCI image config.
pub const MEDIA_TYPE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub use crate::layer::MEDIA_TYPE_LAYER_GZIP;
/// The annotation naming an image in an index (`org.opencontainers.image.ref.name`).
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";
/// The annotation `ctr images import` names an image by without `--base-name`.
pub const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";

/// The OCI architecture name for the build machine (`amd64`, `arm64`, …).
pub fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

/// Formats seconds since the epoch as RFC 3339 UTC (`2024-01-02T03:04:05Z`).
pub fn rfc3339(secs: u64) -> String {
    let secs = i64::try_from(secs).unwrap_or(i64::MAX);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// What an image runs and says about itself (the config blob's content besides the layers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageConfig {
    /// OCI architecture (`amd64`).
    pub architecture: String,
    /// `linux`.
    pub os: String,
    /// Creation time, seconds since the epoch (SOURCE_DATE_EPOCH for reproducible images).
    pub created: u64,
    /// `KEY=value` environment.
    pub env: Vec<String>,
    /// Entrypoint argv.
    pub entrypoint: Vec<String>,
    /// Default arguments.
    pub cmd: Vec<String>,
    /// Working directory (empty: none).
    pub working_dir: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// A line for the history entry of each layer (`created_by`).
    pub created_by: String,
}

/// An image to write: its name in the index, config, layers and manifest annotations.
#[derive(Clone, Debug)]
pub struct Image {
    /// `name:tag`, written as both [`ANNOTATION_REF_NAME`] and [`ANNOTATION_CONTAINERD_NAME`]
    /// on the index entry.
    pub name: String,
    /// Config.
    pub config: ImageConfig,
    /// Layers, bottom first.
    pub layers: Vec<LayerBlob>,
    /// Manifest annotations.
    pub annotations: BTreeMap<String, String>,
}

/// An OCI content descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Media type.
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
    /// Platform (index entries only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    /// Annotations.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Descriptor {
    fn of(media_type: &str, bytes: &[u8]) -> Self {
        Self {
            media_type: media_type.to_string(),
            digest: sha256_digest(bytes),
            size: bytes.len() as u64,
            platform: None,
            annotations: BTreeMap::new(),
        }
    }
}

/// An OCI platform.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Platform {
    /// Architecture.
    pub architecture: String,
    /// OS.
    pub os: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ConfigDoc<'a> {
    created: String,
    architecture: &'a str,
    os: &'a str,
    config: RuntimeDoc<'a>,
    rootfs: RootFsDoc,
    history: Vec<HistoryDoc<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct RuntimeDoc<'a> {
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    env: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    entrypoint: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    cmd: &'a [String],
    #[serde(skip_serializing_if = "str::is_empty")]
    working_dir: &'a str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    labels: &'a BTreeMap<String, String>,
}

#[derive(Serialize)]
struct RootFsDoc {
    #[serde(rename = "type")]
    kind: &'static str,
    diff_ids: Vec<String>,
}

#[derive(Serialize)]
struct HistoryDoc<'a> {
    created: String,
    created_by: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ManifestDoc<'a> {
    schema_version: u32,
    media_type: &'static str,
    config: &'a Descriptor,
    layers: &'a [Descriptor],
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: &'a BTreeMap<String, String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct IndexDoc<'a> {
    schema_version: u32,
    media_type: &'static str,
    manifests: &'a [Descriptor],
}

/// The config blob's bytes for `config` over layers with these `diff_ids`.
pub fn config_json(config: &ImageConfig, diff_ids: &[String]) -> Result<Vec<u8>> {
    let created = rfc3339(config.created);
    let doc = ConfigDoc {
        created: created.clone(),
        architecture: &config.architecture,
        os: &config.os,
        config: RuntimeDoc {
            env: &config.env,
            entrypoint: &config.entrypoint,
            cmd: &config.cmd,
            working_dir: &config.working_dir,
            labels: &config.labels,
        },
        rootfs: RootFsDoc {
            kind: "layers",
            diff_ids: diff_ids.to_vec(),
        },
        history: diff_ids
            .iter()
            .map(|_| HistoryDoc {
                created: created.clone(),
                created_by: &config.created_by,
            })
            .collect(),
    };
    serde_json::to_vec(&doc).context("serialize image config")
}

/// What was written for one image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenImage {
    /// The image's name.
    pub name: String,
    /// The manifest's descriptor (as listed in `index.json`).
    pub manifest: Descriptor,
    /// The config's descriptor.
    pub config: Descriptor,
    /// The layers' descriptors.
    pub layers: Vec<Descriptor>,
    /// The layers' `diff_id`s.
    pub diff_ids: Vec<String>,
    /// Sum of the uncompressed layer sizes.
    pub uncompressed_size: u64,
}

impl WrittenImage {
    /// Sum of the compressed layer sizes.
    pub fn compressed_size(&self) -> u64 {
        self.layers.iter().map(|l| l.size).sum()
    }
}

fn write_blob(dir: &Path, digest: &str, bytes: &[u8]) -> Result<()> {
    let hex = digest
        .strip_prefix("sha256:")
        .with_context(|| format!("unsupported digest {digest}"))?;
    let path = dir.join("blobs/sha256").join(hex);
    std::fs::write(&path, bytes).with_context(|| format!("write {}", path.display()))
}

/// Writes `images` as an OCI image layout in `dir` (created if missing): `oci-layout`,
/// `index.json` (one entry per image, in the given order, annotated with its name) and
/// `blobs/sha256/…`. Other blobs already there are kept; `index.json` is replaced.
pub fn write_oci_layout(dir: &Path, images: &[Image]) -> Result<Vec<WrittenImage>> {
    std::fs::create_dir_all(dir.join("blobs/sha256"))
        .with_context(|| format!("create {}", dir.display()))?;
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)
        .with_context(|| format!("write {}/oci-layout", dir.display()))?;
    let mut written = Vec::new();
    let mut index = Vec::new();
    for image in images {
        if image.name.is_empty() {
            bail!("an image in an OCI layout needs a name");
        }
        let mut layers = Vec::new();
        let mut diff_ids = Vec::new();
        for l in &image.layers {
            write_blob(dir, &l.digest, &l.data)?;
            layers.push(Descriptor {
                media_type: l.media_type.clone(),
                digest: l.digest.clone(),
                size: l.size,
                platform: None,
                annotations: BTreeMap::new(),
            });
            diff_ids.push(l.diff_id.clone());
        }
        let config_bytes = config_json(&image.config, &diff_ids)?;
        let config = Descriptor::of(MEDIA_TYPE_CONFIG, &config_bytes);
        write_blob(dir, &config.digest, &config_bytes)?;
        let manifest_bytes = serde_json::to_vec(&ManifestDoc {
            schema_version: 2,
            media_type: MEDIA_TYPE_MANIFEST,
            config: &config,
            layers: &layers,
            annotations: &image.annotations,
        })
        .context("serialize manifest")?;
        let mut manifest = Descriptor::of(MEDIA_TYPE_MANIFEST, &manifest_bytes);
        write_blob(dir, &manifest.digest, &manifest_bytes)?;
        manifest.platform = Some(Platform {
            architecture: image.config.architecture.clone(),
            os: image.config.os.clone(),
        });
        manifest
            .annotations
            .insert(ANNOTATION_CONTAINERD_NAME.into(), image.name.clone());
        manifest
            .annotations
            .insert(ANNOTATION_REF_NAME.into(), image.name.clone());
        index.push(manifest.clone());
        written.push(WrittenImage {
            name: image.name.clone(),
            manifest,
            config,
            layers,
            diff_ids,
            uncompressed_size: image.layers.iter().map(|l| l.uncompressed_size).sum(),
        });
    }
    let index_bytes = serde_json::to_vec(&IndexDoc {
        schema_version: 2,
        media_type: MEDIA_TYPE_INDEX,
        manifests: &index,
    })
    .context("serialize index.json")?;
    std::fs::write(dir.join("index.json"), index_bytes)
        .with_context(|| format!("write {}/index.json", dir.display()))?;
    Ok(written)
}

fn layout_files(dir: &Path, rel: &Path, out: &mut Vec<(PathBuf, bool)>) -> Result<()> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir.join(rel)).with_context(|| format!("read {}", dir.display()))? {
        names.push(
            e.with_context(|| format!("read {}", dir.display()))?
                .file_name(),
        );
    }
    names.sort();
    for n in names {
        let r = rel.join(&n);
        let meta = std::fs::symlink_metadata(dir.join(&r))
            .with_context(|| format!("stat {}", dir.join(&r).display()))?;
        if meta.is_dir() {
            out.push((r.clone(), true));
            layout_files(dir, &r, out)?;
        } else if meta.is_file() {
            out.push((r, false));
        } else {
            bail!("{}: not a file or directory", dir.join(&r).display());
        }
    }
    Ok(())
}

/// Writes the layout in `layout` as a tar at `archive` (an "OCI archive", importable with
/// `ctr images import` and `podman load`): entries sorted, directories 0755, files 0644, uid/gid
/// 0, every mtime `mtime`. Returns the archive's size.
pub fn write_oci_archive(layout: &Path, archive: &Path, mtime: u64) -> Result<u64> {
    let mut files = Vec::new();
    layout_files(layout, Path::new(""), &mut files)?;
    if !files.iter().any(|(p, _)| p == Path::new("index.json")) {
        bail!("{} is not an OCI layout: no index.json", layout.display());
    }
    let tmp = archive.with_extension("tar.partial");
    let f = std::fs::File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    let mut b = tar::Builder::new(std::io::BufWriter::new(f));
    for (rel, is_dir) in &files {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(mtime);
        if *is_dir {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            b.append_data(&mut h, rel, std::io::empty())
                .with_context(|| format!("archive {}", rel.display()))?;
        } else {
            let src = layout.join(rel);
            let f = std::fs::File::open(&src).with_context(|| format!("open {}", src.display()))?;
            let len = f
                .metadata()
                .with_context(|| format!("stat {}", src.display()))?
                .len();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(len);
            b.append_data(&mut h, rel, std::io::Read::take(f, len))
                .with_context(|| format!("archive {}", rel.display()))?;
        }
    }
    let w = b.into_inner().context("finish archive")?;
    let f = w
        .into_inner()
        .map_err(|e| e.into_error())
        .context("flush archive")?;
    f.sync_all().context("sync archive")?;
    drop(f);
    std::fs::rename(&tmp, archive)
        .with_context(|| format!("rename {} to {}", tmp.display(), archive.display()))?;
    Ok(std::fs::metadata(archive)
        .with_context(|| format!("stat {}", archive.display()))?
        .len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::Layer;
    use flex_oci::{Arch, LayoutTarget, OciLayout};

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    fn sample() -> Image {
        let mut l = Layer::new();
        l.file("/hello", 0o644, "hi").unwrap();
        Image {
            name: "sample:1".into(),
            config: ImageConfig {
                architecture: host_architecture().into(),
                os: "linux".into(),
                created: 1_700_000_000,
                env: vec!["A=b".into()],
                entrypoint: vec!["/hello".into()],
                cmd: vec![],
                working_dir: "/".into(),
                labels: BTreeMap::from([("k".into(), "v".into())]),
                created_by: "test".into(),
            },
            layers: vec![l.build(1_700_000_000, 6).unwrap()],
            annotations: BTreeMap::new(),
        }
    }

    #[test]
    fn config_has_a_fixed_shape() {
        let img = sample();
        let json =
            String::from_utf8(config_json(&img.config, &["sha256:ab".into()]).unwrap()).unwrap();
        assert_eq!(
            json,
            format!(
                r#"{{"created":"2023-11-14T22:13:20Z","architecture":"{}","os":"linux","config":{{"Env":["A=b"],"Entrypoint":["/hello"],"WorkingDir":"/","Labels":{{"k":"v"}}}},"rootfs":{{"type":"layers","diff_ids":["sha256:ab"]}},"history":[{{"created":"2023-11-14T22:13:20Z","created_by":"test"}}]}}"#,
                host_architecture()
            )
        );
    }

    #[test]
    fn layout_is_readable_by_the_agents_oci_reader_and_archive_is_stable() {
        let d = tempfile::tempdir().unwrap();
        let img = sample();
        let w = write_oci_layout(&d.path().join("l"), std::slice::from_ref(&img)).unwrap();
        let layout = OciLayout::open(&d.path().join("l")).unwrap();
        let resolved = layout
            .resolve(&LayoutTarget::Tag("sample:1".into()), Arch::host())
            .unwrap();
        assert_eq!(resolved.digest.to_string(), w[0].manifest.digest);
        assert_eq!(resolved.manifest.layers.len(), 1);
        let index = std::fs::read_to_string(d.path().join("l/index.json")).unwrap();
        assert!(
            index.contains(r#""org.opencontainers.image.ref.name":"sample:1""#),
            "{index}"
        );
        assert!(
            index.contains(r#""io.containerd.image.name":"sample:1""#),
            "{index}"
        );

        let a = d.path().join("a.tar");
        let size = write_oci_archive(&d.path().join("l"), &a, 5).unwrap();
        assert_eq!(size, std::fs::metadata(&a).unwrap().len());
        let first = std::fs::read(&a).unwrap();
        // A second layout of the same image gives the same archive bytes.
        write_oci_layout(&d.path().join("m"), &[img]).unwrap();
        write_oci_archive(&d.path().join("m"), &a, 5).unwrap();
        assert_eq!(first, std::fs::read(&a).unwrap());
        let names: Vec<String> = tar::Archive::new(first.as_slice())
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names.len(), 2 + 3 + 2, "{names:?}");
        assert_eq!(&names[..3], ["blobs", "blobs/sha256", names[2].as_str()]);
        assert!(names.contains(&"index.json".to_string()));
        assert!(names.contains(&"oci-layout".to_string()));
    }

    #[test]
    fn archive_refuses_a_directory_that_is_not_a_layout() {
        let d = tempfile::tempdir().unwrap();
        let e = write_oci_archive(d.path(), &d.path().join("x.tar"), 0).unwrap_err();
        assert!(e.to_string().contains("no index.json"), "{e}");
    }
}
