//! [`Layer`]: a file-system layer described in memory and written as a deterministic tar, then
//! gzip ([`Layer::build`] → [`LayerBlob`]).
//!
//! Determinism rules: entries sorted by path (parents before children; missing parent
//! directories added as `0755`), every entry owned by uid/gid 0 with empty user and group
//! names, every mtime the given epoch, GNU headers (long names through the GNU long-name
//! extension, as the `tar` crate writes them), and gzip with a fixed header (mtime 0, no file
//! name, OS byte 255) at a fixed level. The same entries and epoch always give the same bytes.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};
use sha2::{Digest as _, Sha256};

/// Media type of a gzip-compressed tar layer.
pub const MEDIA_TYPE_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// The content of a regular file in a layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// Bytes held in memory.
    Bytes(Vec<u8>),
    /// A file on the build machine, read (following symlinks) when the layer is written.
    Path(PathBuf),
}

/// One entry of a layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// A directory with its permission bits.
    Dir {
        /// Permission bits (e.g. `0o755`, `0o1777`).
        mode: u32,
    },
    /// A regular file.
    File {
        /// Permission bits.
        mode: u32,
        /// Its content.
        content: Content,
    },
    /// A symbolic link.
    Symlink {
        /// The link's target, stored as given.
        target: String,
    },
}

/// A layer being assembled: absolute image paths (stored without the leading `/`) to entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layer {
    entries: BTreeMap<String, Entry>,
}

/// Normalizes an image path: `/a/b` or `a/b` → `a/b`; rejects empty paths, `.`/`..` components
/// and empty components.
pub fn normalize_path(path: &str) -> Result<String> {
    let trimmed = path.trim_start_matches('/');
    if trimmed.is_empty() {
        bail!("invalid image path {path:?}: empty");
    }
    let mut parts = Vec::new();
    for c in Path::new(trimmed).components() {
        match c {
            Component::Normal(n) => parts.push(
                n.to_str()
                    .with_context(|| format!("invalid image path {path:?}: not UTF-8"))?,
            ),
            _ => bail!("invalid image path {path:?}: only plain components are allowed"),
        }
    }
    if trimmed.contains("//") || trimmed.split('/').any(|p| p == "." || p == "..") {
        bail!("invalid image path {path:?}: only plain components are allowed");
    }
    Ok(parts.join("/"))
}

impl Layer {
    /// An empty layer.
    pub fn new() -> Self {
        Self::default()
    }

    fn insert(&mut self, path: &str, entry: Entry) -> Result<&mut Self> {
        let p = normalize_path(path)?;
        if let Some(old) = self.entries.get(&p)
            && old != &entry
        {
            // A directory added twice with the same mode is fine; anything else is a conflict.
            bail!("image path /{p} added twice with different content ({old:?} vs {entry:?})");
        }
        self.entries.insert(p, entry);
        Ok(self)
    }

    /// Adds a directory.
    pub fn dir(&mut self, path: &str, mode: u32) -> Result<&mut Self> {
        self.insert(path, Entry::Dir { mode })
    }

    /// Adds a regular file with `data`.
    pub fn file(&mut self, path: &str, mode: u32, data: impl Into<Vec<u8>>) -> Result<&mut Self> {
        self.insert(
            path,
            Entry::File {
                mode,
                content: Content::Bytes(data.into()),
            },
        )
    }

    /// Adds a regular file whose content is `source` on the build machine (symlinks followed);
    /// `mode` defaults to the source's permission bits.
    pub fn file_from(&mut self, path: &str, mode: Option<u32>, source: &Path) -> Result<&mut Self> {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(source)
            .with_context(|| format!("layer file {path}: stat {}", source.display()))?;
        if !meta.is_file() {
            bail!(
                "layer file {path}: {} is not a regular file",
                source.display()
            );
        }
        let mode = mode.unwrap_or(meta.permissions().mode() & 0o7777);
        self.insert(
            path,
            Entry::File {
                mode,
                content: Content::Path(source.to_path_buf()),
            },
        )
    }

    /// Adds a symbolic link at `path` pointing to `target`.
    pub fn symlink(&mut self, path: &str, target: &str) -> Result<&mut Self> {
        if target.is_empty() {
            bail!("symlink {path}: empty target");
        }
        self.insert(
            path,
            Entry::Symlink {
                target: target.to_string(),
            },
        )
    }

    /// The entry at `path`, if any (parents added implicitly are not listed).
    pub fn get(&self, path: &str) -> Option<&Entry> {
        normalize_path(path).ok().and_then(|p| self.entries.get(&p))
    }

    /// Every entry that will be written, parents included, in archive order, with absolute
    /// paths (`/opt`, `/opt/aks-flex-node`, …).
    pub fn entries(&self) -> Result<Vec<(String, Entry)>> {
        let mut all: BTreeMap<String, Entry> = BTreeMap::new();
        for (path, entry) in &self.entries {
            let mut prefix = String::new();
            let parts: Vec<&str> = path.split('/').collect();
            for part in &parts[..parts.len().saturating_sub(1)] {
                if !prefix.is_empty() {
                    prefix.push('/');
                }
                prefix.push_str(part);
                match self.entries.get(&prefix) {
                    Some(Entry::Dir { .. }) => {}
                    Some(other) => {
                        bail!("/{path} is below /{prefix}, which is not a directory ({other:?})")
                    }
                    None => {
                        all.entry(prefix.clone())
                            .or_insert(Entry::Dir { mode: 0o755 });
                    }
                }
            }
            all.insert(path.clone(), entry.clone());
        }
        // Sort by path components so that a directory's entries directly follow it (`a/b`
        // before `a-c`), as `tar` of a tree would.
        let mut out: Vec<(String, Entry)> = all.into_iter().collect();
        out.sort_by(|(a, _), (b, _)| a.split('/').cmp(b.split('/')));
        Ok(out.into_iter().map(|(p, e)| (format!("/{p}"), e)).collect())
    }

    /// Writes the layer as an uncompressed tar to `w`, every mtime `mtime`.
    pub fn write_tar<W: Write>(&self, w: W, mtime: u64) -> Result<W> {
        let mut b = tar::Builder::new(w);
        for (path, entry) in self.entries()? {
            let name = path.trim_start_matches('/');
            let mut h = tar::Header::new_gnu();
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(mtime);
            match &entry {
                Entry::Dir { mode } => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(*mode);
                    h.set_size(0);
                    b.append_data(&mut h, name, io::empty())
                        .with_context(|| format!("tar {path}"))?;
                }
                Entry::Symlink { target } => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_mode(0o777);
                    h.set_size(0);
                    b.append_link(&mut h, name, target)
                        .with_context(|| format!("tar {path}"))?;
                }
                Entry::File { mode, content } => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(*mode);
                    match content {
                        Content::Bytes(data) => {
                            h.set_size(data.len() as u64);
                            b.append_data(&mut h, name, data.as_slice())
                                .with_context(|| format!("tar {path}"))?;
                        }
                        Content::Path(src) => {
                            let f = std::fs::File::open(src)
                                .with_context(|| format!("tar {path}: open {}", src.display()))?;
                            let len = f
                                .metadata()
                                .with_context(|| format!("tar {path}: stat {}", src.display()))?
                                .len();
                            h.set_size(len);
                            b.append_data(&mut h, name, f.take(len))
                                .with_context(|| format!("tar {path}: copy {}", src.display()))?;
                        }
                    }
                }
            }
        }
        b.into_inner().context("finish tar")
    }

    /// Writes the layer as tar, gzip-compressed at `level` (0–9), and returns the blob with its
    /// digests and sizes.
    pub fn build(&self, mtime: u64, level: u32) -> Result<LayerBlob> {
        let gz = flate2::GzBuilder::new()
            .mtime(0)
            .operating_system(255)
            .write(
                HashWriter::new(Vec::new()),
                flate2::Compression::new(level.min(9)),
            );
        let tar_out = self.write_tar(HashWriter::new(gz), mtime)?;
        let (gz, diff_id, uncompressed_size) = tar_out.finish();
        let compressed = gz.finish().context("finish gzip")?;
        let (data, digest, size) = compressed.finish();
        Ok(LayerBlob {
            media_type: MEDIA_TYPE_LAYER_GZIP.to_string(),
            data,
            digest,
            size,
            diff_id,
            uncompressed_size,
        })
    }
}

/// A built layer: the compressed blob and what the manifest and config say about it.
#[derive(Clone, PartialEq, Eq)]
pub struct LayerBlob {
    /// The media type (`application/vnd.oci.image.layer.v1.tar+gzip`).
    pub media_type: String,
    /// The compressed bytes.
    pub data: Vec<u8>,
    /// `sha256:<hex>` of `data`.
    pub digest: String,
    /// Length of `data`.
    pub size: u64,
    /// `sha256:<hex>` of the uncompressed tar (the config's `diff_id`).
    pub diff_id: String,
    /// Length of the uncompressed tar.
    pub uncompressed_size: u64,
}

impl std::fmt::Debug for LayerBlob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerBlob")
            .field("media_type", &self.media_type)
            .field("digest", &self.digest)
            .field("size", &self.size)
            .field("diff_id", &self.diff_id)
            .field("uncompressed_size", &self.uncompressed_size)
            .finish_non_exhaustive()
    }
}

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// A writer that hashes and counts what passes through it.
struct HashWriter<W> {
    inner: W,
    hasher: Sha256,
    count: u64,
}

impl<W: Write> HashWriter<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    fn finish(self) -> (W, String, u64) {
        (
            self.inner,
            format!("sha256:{}", hex::encode(self.hasher.finalize())),
            self.count,
        )
    }
}

impl<W: Write> Write for HashWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(tar: &[u8]) -> Vec<String> {
        let mut a = tar::Archive::new(tar);
        a.entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                format!(
                    "{} {:?} {:o} {}:{} {} {}",
                    e.path().unwrap().display(),
                    h.entry_type(),
                    h.mode().unwrap(),
                    h.uid().unwrap(),
                    h.gid().unwrap(),
                    h.mtime().unwrap(),
                    e.link_name()
                        .unwrap()
                        .map(|l| l.display().to_string())
                        .unwrap_or_default()
                )
            })
            .collect()
    }

    #[test]
    fn paths_are_normalized_and_checked() {
        assert_eq!(normalize_path("/a/b").unwrap(), "a/b");
        assert_eq!(normalize_path("a/b").unwrap(), "a/b");
        for bad in ["", "/", "a/../b", "./a", "a//b", "a/."] {
            assert!(normalize_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn entries_are_sorted_with_parents_and_fixed_metadata() {
        let mut l = Layer::new();
        l.file("/etc/passwd", 0o644, "root:x:0:0::/:/x\n").unwrap();
        l.dir("/tmp", 0o1777).unwrap();
        l.symlink("/opt/x/bin/link", "tool").unwrap();
        l.file("/opt/x/bin/tool", 0o755, "bin").unwrap();
        l.file("/etc-extra", 0o600, "").unwrap();
        let tar = l.write_tar(Vec::new(), 1_700_000_000).unwrap();
        assert_eq!(
            listing(&tar),
            [
                "etc Directory 755 0:0 1700000000 ",
                "etc/passwd Regular 644 0:0 1700000000 ",
                "etc-extra Regular 600 0:0 1700000000 ",
                "opt Directory 755 0:0 1700000000 ",
                "opt/x Directory 755 0:0 1700000000 ",
                "opt/x/bin Directory 755 0:0 1700000000 ",
                "opt/x/bin/link Symlink 777 0:0 1700000000 tool",
                "opt/x/bin/tool Regular 755 0:0 1700000000 ",
                "tmp Directory 1777 0:0 1700000000 ",
            ]
        );
    }

    #[test]
    fn conflicting_entries_are_refused() {
        let mut l = Layer::new();
        l.file("/a", 0o644, "x").unwrap();
        l.dir("/d", 0o755).unwrap();
        l.dir("/d", 0o755).unwrap();
        assert!(l.file("/a", 0o644, "y").is_err());
        l.file("/a/below", 0o644, "z").unwrap();
        let e = l.entries().unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
    }

    #[test]
    fn long_names_and_targets_survive() {
        let long = format!("/{}/{}", "d".repeat(120), "f".repeat(90));
        let target = "t".repeat(150);
        let mut l = Layer::new();
        l.symlink(&long, &target).unwrap();
        let tar = l.write_tar(Vec::new(), 0).unwrap();
        let mut a = tar::Archive::new(tar.as_slice());
        let names: Vec<(String, Option<String>)> = a
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().display().to_string(),
                    e.link_name().unwrap().map(|l| l.display().to_string()),
                )
            })
            .collect();
        assert_eq!(
            names[1],
            (long.trim_start_matches('/').to_string(), Some(target))
        );
    }

    #[test]
    fn build_is_deterministic_and_digests_match() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::write(&src, vec![7u8; 100_000]).unwrap();
        let make = || {
            let mut l = Layer::new();
            l.file_from("/bin/x", Some(0o755), &src).unwrap();
            l.file("/etc/y", 0o644, "y").unwrap();
            l.build(1_600_000_000, 9).unwrap()
        };
        let a = make();
        let b = make();
        assert_eq!(a, b);
        assert_eq!(a.digest, sha256_digest(&a.data));
        assert_eq!(a.size, a.data.len() as u64);
        // gzip header: magic, deflate, no flags, mtime 0, XFL 2 (best), OS 255.
        assert_eq!(&a.data[..10], &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 2, 255]);
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(a.data.as_slice())
            .read_to_end(&mut tar)
            .unwrap();
        assert_eq!(a.diff_id, sha256_digest(&tar));
        assert_eq!(a.uncompressed_size, tar.len() as u64);
        // A different epoch is a different layer.
        let mut l = Layer::new();
        l.file("/etc/y", 0o644, "y").unwrap();
        assert_ne!(l.build(1, 9).unwrap().digest, l.build(2, 9).unwrap().digest);
    }
}
