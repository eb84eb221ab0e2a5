//! [`LayerBuilder`]: writes image layers (tar streams) in memory, with every entry kind the
//! unpacker handles — whiteouts, opaque markers, hard links, devices, PAX xattrs — and, for
//! tests of the unpacker's safety, entries with names no honest tool writes (`../x`, `/abs`).
//! The tests and the unpack bench build their layers with it (test kit: a dev-dependency only);
//! [`gzip()`] and [`zstd()`] compress.
//!
//! Names and link targets are written into the header as given (no normalization), so an
//! archive says exactly what a test means; names longer than 100 bytes go into a PAX `path`
//! (`linkpath`) record.

use std::io::Write;

use tar::{EntryType, Header};

/// The mtime entries get unless one is given.
pub const DEFAULT_MTIME: u64 = 1_700_000_000;

/// Builds one tar layer in memory.
pub struct LayerBuilder {
    builder: tar::Builder<Vec<u8>>,
    mtime: u64,
    owner: (u64, u64),
}

impl Default for LayerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl LayerBuilder {
    /// An empty layer; entries owned by 0:0 with mtime [`DEFAULT_MTIME`].
    pub fn new() -> Self {
        Self {
            builder: tar::Builder::new(Vec::new()),
            mtime: DEFAULT_MTIME,
            owner: (0, 0),
        }
    }

    /// Owner of the entries added from now on.
    pub fn owner(&mut self, uid: u64, gid: u64) -> &mut Self {
        self.owner = (uid, gid);
        self
    }

    /// Mtime of the entries added from now on.
    pub fn mtime(&mut self, mtime: u64) -> &mut Self {
        self.mtime = mtime;
        self
    }

    /// A header of `kind` with the builder's owner and mtime, for [`LayerBuilder::entry`].
    pub fn header(&self, kind: EntryType, size: u64, mode: u32) -> Header {
        let mut h = Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        h.set_uid(self.owner.0);
        h.set_gid(self.owner.1);
        h.set_mtime(self.mtime);
        h
    }

    /// Appends an entry with raw `name` and optional raw link target, plus PAX records.
    pub fn entry(
        &mut self,
        mut header: Header,
        name: &[u8],
        link: Option<&[u8]>,
        pax: &[(&str, &[u8])],
        data: &[u8],
    ) -> std::io::Result<&mut Self> {
        let mut records: Vec<(&str, &[u8])> = pax.to_vec();
        if name.len() > 100 {
            records.push(("path", name));
        }
        if let Some(l) = link
            && l.len() > 100
        {
            records.push(("linkpath", l));
        }
        if !records.is_empty() {
            self.builder.append_pax_extensions(records)?;
        }
        let old = header.as_old_mut();
        old.name = [0; 100];
        let n = name.len().min(100);
        old.name[..n].copy_from_slice(&name[..n]);
        if let Some(l) = link {
            old.linkname = [0; 100];
            let n = l.len().min(100);
            old.linkname[..n].copy_from_slice(&l[..n]);
        }
        header.set_cksum();
        self.builder.append(&header, data)?;
        Ok(self)
    }

    /// A directory.
    pub fn dir(&mut self, path: &str, mode: u32) -> std::io::Result<&mut Self> {
        let h = self.header(EntryType::Directory, 0, mode);
        self.entry(h, path.as_bytes(), None, &[], &[])
    }

    /// A regular file.
    pub fn file(&mut self, path: &str, content: &[u8], mode: u32) -> std::io::Result<&mut Self> {
        let h = self.header(EntryType::Regular, content.len() as u64, mode);
        self.entry(h, path.as_bytes(), None, &[], content)
    }

    /// A regular file with PAX `SCHILY.xattr.<name>` records.
    pub fn file_with_xattrs(
        &mut self,
        path: &str,
        content: &[u8],
        mode: u32,
        xattrs: &[(&str, &[u8])],
    ) -> std::io::Result<&mut Self> {
        let keys: Vec<String> = xattrs
            .iter()
            .map(|(k, _)| format!("SCHILY.xattr.{k}"))
            .collect();
        let pax: Vec<(&str, &[u8])> = keys
            .iter()
            .zip(xattrs)
            .map(|(k, (_, v))| (k.as_str(), *v))
            .collect();
        let h = self.header(EntryType::Regular, content.len() as u64, mode);
        self.entry(h, path.as_bytes(), None, &pax, content)
    }

    /// A symlink `path -> target`.
    pub fn symlink(&mut self, path: &str, target: &str) -> std::io::Result<&mut Self> {
        let h = self.header(EntryType::Symlink, 0, 0o777);
        self.entry(h, path.as_bytes(), Some(target.as_bytes()), &[], &[])
    }

    /// A hard link `path` to the archive path `target`.
    pub fn hardlink(&mut self, path: &str, target: &str) -> std::io::Result<&mut Self> {
        let h = self.header(EntryType::Link, 0, 0o644);
        self.entry(h, path.as_bytes(), Some(target.as_bytes()), &[], &[])
    }

    /// A whiteout of `path` (`<dir>/.wh.<name>`).
    pub fn whiteout(&mut self, path: &str) -> std::io::Result<&mut Self> {
        let (dir, name) = match path.rsplit_once('/') {
            Some((d, n)) => (format!("{d}/"), n),
            None => (String::new(), path),
        };
        self.file(&format!("{dir}.wh.{name}"), b"", 0o644)
    }

    /// The opaque marker of directory `dir` (`<dir>/.wh..wh..opq`).
    pub fn opaque(&mut self, dir: &str) -> std::io::Result<&mut Self> {
        self.file(
            &format!("{}/.wh..wh..opq", dir.trim_end_matches('/')),
            b"",
            0o644,
        )
    }

    /// A fifo.
    pub fn fifo(&mut self, path: &str, mode: u32) -> std::io::Result<&mut Self> {
        let h = self.header(EntryType::Fifo, 0, mode);
        self.entry(h, path.as_bytes(), None, &[], &[])
    }

    /// A character device.
    pub fn char_device(
        &mut self,
        path: &str,
        major: u32,
        minor: u32,
        mode: u32,
    ) -> std::io::Result<&mut Self> {
        let mut h = self.header(EntryType::Char, 0, mode);
        h.set_device_major(major)?;
        h.set_device_minor(minor)?;
        self.entry(h, path.as_bytes(), None, &[], &[])
    }

    /// A regular file whose name is written as given, however unsafe (for tests).
    pub fn raw_file(&mut self, name: &[u8], content: &[u8]) -> std::io::Result<&mut Self> {
        let h = self.header(EntryType::Regular, content.len() as u64, 0o644);
        self.entry(h, name, None, &[], content)
    }

    /// The finished (uncompressed) tar stream.
    pub fn finish(self) -> std::io::Result<Vec<u8>> {
        self.builder.into_inner()
    }
}

/// gzip-compresses `data`.
pub fn gzip(data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data)?;
    e.finish()
}

/// zstd-compresses `data` (level 3).
pub fn zstd(data: &[u8]) -> std::io::Result<Vec<u8>> {
    zstd::stream::encode_all(data, 3)
}
