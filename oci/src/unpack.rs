//! Applying image layers onto a root directory, as overlayfs would stack them, safely.
//!
//! Each layer is a tar stream, plain, gzip or zstd: the compression is taken from the blob's
//! magic bytes (`1f 8b` gzip, `28 b5 2f fd` zstd, else plain tar); the media type only says
//! whether a blob is a layer at all. While a layer is read, the sha256 of its *uncompressed*
//! stream is computed and compared with the config's `diff_id` when the caller gives one.
//!
//! # Semantics
//!
//! - Regular files, directories, symlinks, hard links, char/block devices and fifos are
//!   created. A device that may not be created (`EPERM`, e.g. in a user namespace) is skipped
//!   with a warning.
//! - An existing entry of another type is replaced (a directory replacing a file, a file
//!   replacing a whole directory tree); a directory entry over an existing directory merges.
//!   A file entry always unlinks first, so the other names of a lower hard link keep the old
//!   content.
//! - `.wh.<name>` deletes `<name>` of the lower layers; `.wh..wh..opq` deletes every lower
//!   child of its directory. Neither deletes what the same layer adds, whatever the order of the
//!   entries (the layer's additions are tracked by parent `(dev, ino)` and name). Other
//!   `.wh..wh.*` names (aufs metadata) are ignored. Whiteout files are never created.
//! - Ownership (`uid`/`gid`, PAX overrides included) is applied with `lchown` semantics when
//!   [`UnpackOptions::same_owner`] (the default for root). Modes, setuid/setgid/sticky included,
//!   are applied after the content and the owner (chown clears setuid bits). Mtimes (PAX
//!   sub-second ones included) are set without following symlinks. Directory modes and mtimes
//!   are applied after the whole layer, since creating children changes a directory's mtime and a
//!   read-only mode would stop them being created. Directories created implicitly for a parent
//!   path get 0755.
//! - Extended attributes come from PAX `SCHILY.xattr.<name>` records. `security.selinux` is
//!   **skipped**: an image's labels come from its build host's policy; the machine's files are
//!   labelled by the host (and nspawn) instead, and writing a label the loaded policy does not
//!   know fails. An xattr the file system refuses (`ENOTSUP`, `EPERM`, e.g. `user.*` on a
//!   symlink) is a warning, not an error.
//!
//! # Safety
//!
//! An entry whose name is absolute, contains a `..` component or a NUL byte, or whose parent
//! path resolves outside the root, and a hard link whose target does so, fail the **whole**
//! unpack with [`UnpackError::Unsafe`]; nothing is written for that entry. Parent paths are
//! resolved by `flex_host::confine`: component by component with `openat(O_NOFOLLOW)` on
//! directory fds, following symlinks already in the tree by reading them, absolute targets taken
//! relative to the root (as in a chroot: a link `/lib -> /usr/lib` works), `..` past the root an
//! error rather than clamped. The final component is always created with `*at` calls on the
//! parent's fd and `O_NOFOLLOW`/`O_EXCL`/`AT_SYMLINK_NOFOLLOW`, so a symlink already there is
//! replaced, never written through; a hard link is made with `linkat` without
//! `AT_SYMLINK_FOLLOW`, so linking to a symlink links the symlink itself.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Timespec, Timestamps, Uid};
use rustix::io::Errno;

use super::digest::{Digest, HashingReader};
use super::manifest::Compression;
use flex_host::confine::{self, DirHandle, ResolveError, Root};

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
const XATTR_PREFIX: &str = "SCHILY.xattr.";
const SKIPPED_XATTRS: &[&str] = &["security.selinux"];
const MAX_COMPONENTS: usize = 1024;
const COPY_BUFFER: usize = 256 << 10;
const MAX_WARNINGS_KEPT: usize = 32;

/// Why a layer could not be applied. Every variant names the layer; entry errors name the entry.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// The entry would write outside the root (or is otherwise refused); nothing was written
    /// for it and the unpack stopped.
    #[error("layer {layer}: entry {entry:?}: refused: {reason}")]
    Unsafe {
        /// The layer (digest or file name).
        layer: String,
        /// The entry's path as in the archive.
        entry: String,
        /// Why.
        reason: String,
    },
    /// A file-system operation for an entry failed.
    #[error("layer {layer}: entry {entry:?}: {op}: {cause}")]
    Entry {
        /// The layer.
        layer: String,
        /// The entry's path as in the archive.
        entry: String,
        /// What was being done.
        op: &'static str,
        /// The OS error (in the message, not a `source()`).
        cause: std::io::Error,
    },
    /// The layer could not be read or decompressed, or is not a valid tar stream.
    #[error("layer {layer}: {op}: {cause}")]
    Read {
        /// The layer.
        layer: String,
        /// What was being read.
        op: &'static str,
        /// The error (in the message, not a `source()`).
        cause: std::io::Error,
    },
    /// The uncompressed stream's digest is not the image config's `diff_id`.
    #[error(
        "layer {layer}: uncompressed content is {actual}, but the image config's diff_id is {expected}"
    )]
    DiffId {
        /// The layer.
        layer: String,
        /// The config's diff_id.
        expected: Digest,
        /// What the stream hashed to.
        actual: Digest,
    },
    /// The root directory could not be opened.
    #[error("unpack root {root}: {cause}")]
    Root {
        /// The root.
        root: PathBuf,
        /// The OS error (in the message, not a `source()`).
        cause: std::io::Error,
    },
}

/// How layers are applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnpackOptions {
    /// Apply the archive's uid/gid (default: when running as root).
    pub same_owner: bool,
    /// Apply PAX `SCHILY.xattr.*` extended attributes (default: yes).
    pub xattrs: bool,
}

impl Default for UnpackOptions {
    fn default() -> Self {
        Self {
            same_owner: rustix::process::geteuid().is_root(),
            xattrs: true,
        }
    }
}

/// A layer blob on disk, for [`unpack`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerFile {
    /// The (compressed) blob.
    pub path: PathBuf,
    /// Its media type (informational: the compression is sniffed).
    pub media_type: String,
    /// A name for messages: the layer's digest.
    pub name: String,
    /// The config's `diff_id` for it, checked when given.
    pub diff_id: Option<Digest>,
}

/// What applying one layer did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LayerStats {
    /// Tar entries processed.
    pub entries: u64,
    /// Regular files written.
    pub files: u64,
    /// Content bytes written to regular files.
    pub file_bytes: u64,
    /// Whiteouts and opaque markers applied.
    pub whiteouts: u64,
    /// Compressed bytes read (the blob).
    pub compressed_bytes: u64,
    /// Uncompressed tar bytes read.
    pub tar_bytes: u64,
    /// sha256 of the uncompressed stream.
    pub diff_id: Option<Digest>,
    /// Number of warnings (skipped devices, refused xattrs, unknown entry types).
    pub warning_count: u64,
    /// The first warnings, for reports.
    pub warnings: Vec<String>,
}

/// Applies `layers` in order onto `root` (which must exist). Stops at the first error; the tree
/// is then partly written and should be discarded (the caller unpacks into a scratch directory).
pub fn unpack(
    root: &Path,
    layers: &[LayerFile],
    opts: &UnpackOptions,
) -> Result<Vec<LayerStats>, UnpackError> {
    let mut all = Vec::with_capacity(layers.len());
    for layer in layers {
        let file = File::open(&layer.path).map_err(|cause| UnpackError::Read {
            layer: layer.name.clone(),
            op: "open blob",
            cause,
        })?;
        let stats = unpack_layer(root, &layer.name, file, opts)?;
        if let (Some(expected), Some(actual)) = (&layer.diff_id, &stats.diff_id)
            && expected != actual
        {
            return Err(UnpackError::DiffId {
                layer: layer.name.clone(),
                expected: expected.clone(),
                actual: actual.clone(),
            });
        }
        all.push(stats);
    }
    Ok(all)
}

/// Applies one layer read from `blob` (compressed or not) onto `root`. `name` names the layer in
/// errors (its digest).
pub fn unpack_layer<R: Read>(
    root: &Path,
    name: &str,
    blob: R,
    opts: &UnpackOptions,
) -> Result<LayerStats, UnpackError> {
    let span = tracing::debug_span!("unpack_layer", layer = %name, root = %root.display());
    let _enter = span.enter();
    let root_dir = Root::open(root).map_err(|cause| UnpackError::Root {
        root: root.to_path_buf(),
        cause,
    })?;
    let read_err = |op: &'static str| {
        move |cause: std::io::Error| UnpackError::Read {
            layer: name.to_string(),
            op,
            cause,
        }
    };
    let mut counted = HashingReader::new(blob);
    let mut buffered = BufReader::with_capacity(1 << 20, &mut counted);
    let head = buffered.fill_buf().map_err(read_err("read"))?;
    let compression = Compression::sniff(head).unwrap_or(Compression::None);
    tracing::debug!(?compression, "layer compression");
    let decoder: Box<dyn Read + '_> = match compression {
        Compression::None => Box::new(buffered),
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(buffered)),
        Compression::Zstd => {
            Box::new(zstd::stream::read::Decoder::with_buffer(buffered).map_err(read_err("zstd"))?)
        }
    };
    let mut tar_hash = HashingReader::new(decoder);
    let mut applier = Applier {
        root: &root_dir,
        layer: name,
        opts,
        added: HashSet::new(),
        deferred: Vec::new(),
        cache: HashMap::new(),
        stats: LayerStats::default(),
        buf: vec![0u8; COPY_BUFFER],
        euid_root: rustix::process::geteuid().is_root(),
    };
    {
        let tar_reader = BufReader::with_capacity(256 << 10, &mut tar_hash);
        let mut archive = tar::Archive::new(tar_reader);
        let entries = archive.entries().map_err(read_err("read tar"))?;
        for entry in entries {
            let mut entry = entry.map_err(read_err("read tar"))?;
            applier.apply(&mut entry)?;
        }
        applier.finish_dirs()?;
        // Hash the rest of the stream (end-of-archive blocks, padding) so the digest covers it.
        let mut rest = archive.into_inner();
        std::io::copy(&mut rest, &mut std::io::sink()).map_err(read_err("read tar"))?;
    }
    let mut stats = std::mem::take(&mut applier.stats);
    stats.tar_bytes = tar_hash.count();
    stats.diff_id = Some(tar_hash.digest());
    drop(tar_hash);
    stats.compressed_bytes = counted.count();
    tracing::debug!(
        entries = stats.entries,
        files = stats.files,
        bytes = stats.file_bytes,
        warnings = stats.warning_count,
        "layer applied"
    );
    Ok(stats)
}

/// A validated, split entry path: no empty, `.` or `..` components. (A private `String`: the
/// reason of the unsafe-entry error its caller builds, which names the entry.)
fn split_path(raw: &[u8]) -> Result<Vec<&[u8]>, String> {
    if raw.first() == Some(&b'/') {
        return Err("absolute path".into());
    }
    if raw.contains(&0) {
        return Err("NUL byte in path".into());
    }
    let comps: Vec<&[u8]> = raw
        .split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect();
    if comps.iter().any(|c| *c == b"..") {
        return Err("'..' component".into());
    }
    if comps.len() > MAX_COMPONENTS {
        return Err(format!("more than {MAX_COMPONENTS} components"));
    }
    Ok(comps)
}

/// Metadata of an entry, from its header and PAX records.
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    times: Timestamps,
    xattrs: Vec<(String, Vec<u8>)>,
}

struct DeferredDir {
    path: Vec<Vec<u8>>,
    /// `(dev, ino)` of the directory the entry made: a different directory found at the path
    /// at the end of the layer (the entry's was replaced) does not get its metadata.
    id: (u64, u64),
    entry: String,
    mode: u32,
    times: Timestamps,
}

type Key = (u64, u64, Vec<u8>);

struct Applier<'a> {
    root: &'a Root,
    layer: &'a str,
    opts: &'a UnpackOptions,
    /// What this layer created: (parent dev, parent ino, name).
    added: HashSet<Key>,
    deferred: Vec<DeferredDir>,
    /// Resolved parent directories by their path in the archive. Cleared whenever a directory
    /// or symlink is removed, the only changes that could make an entry stale.
    cache: HashMap<Vec<u8>, Rc<DirHandle>>,
    stats: LayerStats,
    buf: Vec<u8>,
    euid_root: bool,
}

fn parse_pax_time(v: &str) -> Option<Timespec> {
    let (secs, frac) = match v.split_once('.') {
        Some((s, f)) => (s, f),
        None => (v, ""),
    };
    let secs: i64 = secs.parse().ok()?;
    let mut nanos: i64 = 0;
    for (i, d) in frac.bytes().take(9).enumerate() {
        if !d.is_ascii_digit() {
            return None;
        }
        nanos += i64::from(d - b'0') * 10i64.pow(8 - i as u32);
    }
    // A negative time with a fraction counts down from the second.
    let (secs, nanos) = if secs < 0 && nanos > 0 {
        (secs - 1, 1_000_000_000 - nanos)
    } else {
        (secs, nanos)
    };
    Some(Timespec {
        tv_sec: secs,
        tv_nsec: nanos as _,
    })
}

impl Applier<'_> {
    fn warn(&mut self, entry: &str, msg: String) {
        tracing::warn!(layer = %self.layer, entry = %entry, "{msg}");
        self.stats.warning_count += 1;
        if self.stats.warnings.len() < MAX_WARNINGS_KEPT {
            self.stats.warnings.push(format!("{entry}: {msg}"));
        }
    }

    fn unsafe_entry(&self, entry: &str, reason: impl Into<String>) -> UnpackError {
        UnpackError::Unsafe {
            layer: self.layer.to_string(),
            entry: entry.to_string(),
            reason: reason.into(),
        }
    }

    fn io(&self, entry: &str, op: &'static str, e: impl Into<std::io::Error>) -> UnpackError {
        UnpackError::Entry {
            layer: self.layer.to_string(),
            entry: entry.to_string(),
            op,
            cause: e.into(),
        }
    }

    fn resolve_error(&self, entry: &str, e: ResolveError) -> UnpackError {
        match e {
            ResolveError::Escape(m) => self.unsafe_entry(entry, format!("parent {m}")),
            ResolveError::Io(op, p, source) => UnpackError::Entry {
                layer: self.layer.to_string(),
                entry: entry.to_string(),
                op,
                cause: std::io::Error::new(source.kind(), format!("{p}: {source}")),
            },
            other => self.io(
                entry,
                "resolve parent",
                std::io::Error::other(other.to_string()),
            ),
        }
    }

    /// The directory `comps` inside the root, from the cache or resolved (creating missing
    /// directories when `create`).
    fn dir(&mut self, comps: &[&[u8]], create: bool) -> Result<Rc<DirHandle>, ResolveError> {
        let key = comps.join(&b'/');
        if let Some(h) = self.cache.get(&key) {
            return Ok(h.clone());
        }
        let added = &mut self.added;
        let h = Rc::new(
            self.root
                .resolve_dir(comps, create, &mut |dev, ino, name| {
                    added.insert((dev, ino, name.to_vec()));
                })?,
        );
        if self.cache.len() >= 128 {
            self.cache.clear();
        }
        self.cache.insert(key, h.clone());
        Ok(h)
    }

    fn meta(
        &self,
        entry: &mut tar::Entry<'_, impl Read>,
        shown: &str,
    ) -> Result<Meta, UnpackError> {
        let bad = |what: &str, e: std::io::Error| UnpackError::Read {
            layer: self.layer.to_string(),
            op: "read tar header",
            cause: std::io::Error::new(e.kind(), format!("entry {shown:?}: {what}: {e}")),
        };
        let h = entry.header();
        let mode = h.mode().map_err(|e| bad("mode", e))? & 0o7777;
        let uid = h.uid().map_err(|e| bad("uid", e))?;
        let gid = h.gid().map_err(|e| bad("gid", e))?;
        let mtime = h.mtime().map_err(|e| bad("mtime", e))?;
        let too_big = |what: &str| {
            bad(
                what,
                std::io::Error::new(std::io::ErrorKind::InvalidData, "out of range"),
            )
        };
        let uid = u32::try_from(uid).map_err(|_| too_big("uid"))?;
        let gid = u32::try_from(gid).map_err(|_| too_big("gid"))?;
        let mut mtime = Timespec {
            tv_sec: i64::try_from(mtime).map_err(|_| too_big("mtime"))?,
            tv_nsec: 0,
        };
        let mut atime = None;
        let mut xattrs = Vec::new();
        if let Some(pax) = entry.pax_extensions().map_err(|e| bad("pax", e))? {
            for ext in pax {
                let ext = ext.map_err(|e| bad("pax", e))?;
                let Ok(key) = ext.key() else { continue };
                if let Some(name) = key.strip_prefix(XATTR_PREFIX) {
                    xattrs.push((name.to_string(), ext.value_bytes().to_vec()));
                } else if key == "mtime" {
                    if let Some(t) = ext.value().ok().and_then(parse_pax_time) {
                        mtime = t;
                    }
                } else if key == "atime"
                    && let Some(t) = ext.value().ok().and_then(parse_pax_time)
                {
                    atime = Some(t);
                }
            }
        }
        Ok(Meta {
            mode,
            uid,
            gid,
            times: Timestamps {
                last_access: atime.unwrap_or(mtime),
                last_modification: mtime,
            },
            xattrs,
        })
    }

    fn apply(&mut self, entry: &mut tar::Entry<'_, impl Read>) -> Result<(), UnpackError> {
        use tar::EntryType as T;
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            T::XGlobalHeader | T::XHeader | T::GNULongName | T::GNULongLink
        ) {
            return Ok(());
        }
        self.stats.entries += 1;
        let comps = split_path(&raw).map_err(|r| self.unsafe_entry(&shown, r))?;
        let Some((name, parent)) = comps.split_last() else {
            // The root itself ("./"): only its metadata can change.
            if kind != T::Directory {
                return Err(
                    self.unsafe_entry(&shown, "cannot replace the root with a non-directory")
                );
            }
            let meta = self.meta(entry, &shown)?;
            if self.opts.same_owner {
                rustix::fs::fchown(
                    self.root.fd(),
                    Some(Uid::from_raw(meta.uid)),
                    Some(Gid::from_raw(meta.gid)),
                )
                .map_err(|e| self.io(&shown, "chown", e))?;
            }
            self.deferred.push(DeferredDir {
                path: Vec::new(),
                id: self.root.id(),
                entry: shown,
                mode: meta.mode,
                times: meta.times,
            });
            return Ok(());
        };
        let name: &[u8] = name;
        if let Some(target) = name.strip_prefix(WHITEOUT_PREFIX) {
            self.stats.whiteouts += 1;
            if name == OPAQUE_MARKER {
                return self.opaque(parent, &shown);
            }
            if target.starts_with(WHITEOUT_PREFIX) {
                tracing::debug!(entry = %shown, "ignoring aufs metadata entry");
                return Ok(());
            }
            if target.is_empty() || target == b"." || target == b".." {
                return Err(self.unsafe_entry(&shown, "whiteout of an invalid name"));
            }
            return self.whiteout(parent, target, &shown);
        }
        let dir = self
            .dir(parent, true)
            .map_err(|e| self.resolve_error(&shown, e))?;
        match kind {
            T::Regular | T::Continuous | T::GNUSparse => {
                let meta = self.meta(entry, &shown)?;
                self.file(&dir, name, entry, &meta, &shown)?;
            }
            T::Directory => {
                let meta = self.meta(entry, &shown)?;
                self.directory(&dir, &comps, &meta, &shown)?;
            }
            T::Symlink => {
                let meta = self.meta(entry, &shown)?;
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .ok_or_else(|| self.unsafe_entry(&shown, "symlink without a target"))?;
                self.symlink(&dir, name, &target, &meta, &shown)?;
            }
            T::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .ok_or_else(|| self.unsafe_entry(&shown, "hard link without a target"))?;
                self.hardlink(&dir, name, &target, &shown)?;
            }
            T::Char | T::Block | T::Fifo => {
                let meta = self.meta(entry, &shown)?;
                let h = entry.header();
                let major = h.device_major().ok().flatten().unwrap_or(0);
                let minor = h.device_minor().ok().flatten().unwrap_or(0);
                let ft = match kind {
                    T::Char => FileType::CharacterDevice,
                    T::Block => FileType::BlockDevice,
                    _ => FileType::Fifo,
                };
                if !self.node(&dir, name, ft, major, minor, &meta, &shown)? {
                    return Ok(());
                }
            }
            other => {
                self.warn(
                    &shown,
                    format!("unsupported tar entry type {other:?}, skipped"),
                );
                return Ok(());
            }
        }
        self.added.insert((dir.dev, dir.ino, name.to_vec()));
        Ok(())
    }

    /// Makes room for a new entry at `name`: removes what is there unless it is a directory and
    /// a directory is wanted. Returns whether an existing directory was kept.
    fn clear_slot(
        &mut self,
        dir: &DirHandle,
        name: &[u8],
        want_dir: bool,
        shown: &str,
    ) -> Result<bool, UnpackError> {
        let Some(st) =
            confine::lstat_at(dir.fd.as_fd(), name).map_err(|e| self.io(shown, "stat", e))?
        else {
            return Ok(false);
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory if want_dir => Ok(true),
            FileType::Directory => {
                self.cache.clear();
                confine::remove_tree_at(dir.fd.as_fd(), name)
                    .map_err(|e| self.io(shown, "remove existing directory", e))?;
                Ok(false)
            }
            ft => {
                if ft == FileType::Symlink {
                    self.cache.clear();
                }
                rustix::fs::unlinkat(dir.fd.as_fd(), name, AtFlags::empty())
                    .map_err(|e| self.io(shown, "remove existing entry", e))?;
                Ok(false)
            }
        }
    }

    fn chown_fd(&self, fd: BorrowedFd<'_>, meta: &Meta, shown: &str) -> Result<(), UnpackError> {
        if self.opts.same_owner {
            rustix::fs::fchown(
                fd,
                Some(Uid::from_raw(meta.uid)),
                Some(Gid::from_raw(meta.gid)),
            )
            .map_err(|e| self.io(shown, "chown", e))?;
        }
        Ok(())
    }

    fn chown_at(
        &self,
        dir: &DirHandle,
        name: &[u8],
        meta: &Meta,
        shown: &str,
    ) -> Result<(), UnpackError> {
        if self.opts.same_owner {
            rustix::fs::chownat(
                dir.fd.as_fd(),
                name,
                Some(Uid::from_raw(meta.uid)),
                Some(Gid::from_raw(meta.gid)),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| self.io(shown, "chown", e))?;
        }
        Ok(())
    }

    /// Sets the entry's xattrs, through `fd` when there is one, else on `name` in `dir` without
    /// following it (via `/proc/self/fd/<dir>/<name>`).
    fn xattrs(
        &mut self,
        target: XattrTarget<'_>,
        meta: &Meta,
        shown: &str,
    ) -> Result<(), UnpackError> {
        if !self.opts.xattrs {
            return Ok(());
        }
        for (key, value) in &meta.xattrs {
            if SKIPPED_XATTRS.contains(&key.as_str()) {
                tracing::debug!(entry = %shown, xattr = %key, "xattr skipped by policy");
                continue;
            }
            let res = match target {
                XattrTarget::Fd(fd) => {
                    rustix::fs::fsetxattr(fd, key.as_str(), value, rustix::fs::XattrFlags::empty())
                }
                XattrTarget::At(dir, name) => {
                    let mut p = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
                    p.extend_from_slice(name);
                    rustix::fs::lsetxattr(
                        OsStr::from_bytes(&p),
                        key.as_str(),
                        value,
                        rustix::fs::XattrFlags::empty(),
                    )
                }
            };
            match res {
                Ok(()) => {}
                Err(e @ (Errno::NOTSUP | Errno::PERM | Errno::ACCESS)) => {
                    self.warn(shown, format!("xattr {key} not set: {e}"));
                }
                Err(e) => return Err(self.io(shown, "set xattr", e)),
            }
        }
        Ok(())
    }

    fn file(
        &mut self,
        dir: &DirHandle,
        name: &[u8],
        entry: &mut tar::Entry<'_, impl Read>,
        meta: &Meta,
        shown: &str,
    ) -> Result<(), UnpackError> {
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(dir.fd.as_fd(), name, flags, Mode::from_raw_mode(0o600)) {
            Ok(fd) => fd,
            Err(Errno::EXIST) => {
                self.clear_slot(dir, name, false, shown)?;
                rustix::fs::openat(dir.fd.as_fd(), name, flags, Mode::from_raw_mode(0o600))
                    .map_err(|e| self.io(shown, "create", e))?
            }
            Err(e) => return Err(self.io(shown, "create", e)),
        };
        let mut file = File::from(fd);
        let mut written = 0u64;
        loop {
            let n = match entry.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io(shown, "read content", e)),
            };
            file.write_all(&self.buf[..n])
                .map_err(|e| self.io(shown, "write", e))?;
            written += n as u64;
        }
        self.stats.files += 1;
        self.stats.file_bytes += written;
        self.chown_fd(file.as_fd(), meta, shown)?;
        rustix::fs::fchmod(&file, Mode::from_raw_mode(meta.mode))
            .map_err(|e| self.io(shown, "chmod", e))?;
        self.xattrs(XattrTarget::Fd(file.as_fd()), meta, shown)?;
        rustix::fs::futimens(&file, &meta.times).map_err(|e| self.io(shown, "set mtime", e))?;
        Ok(())
    }

    fn directory(
        &mut self,
        parent: &DirHandle,
        comps: &[&[u8]],
        meta: &Meta,
        shown: &str,
    ) -> Result<(), UnpackError> {
        let Some(name) = comps.last().copied() else {
            return Ok(());
        };
        let mode = Mode::from_raw_mode(0o700);
        match rustix::fs::mkdirat(parent.fd.as_fd(), name, mode) {
            Ok(()) => {}
            Err(Errno::EXIST) => {
                if !self.clear_slot(parent, name, true, shown)? {
                    rustix::fs::mkdirat(parent.fd.as_fd(), name, mode)
                        .map_err(|e| self.io(shown, "mkdir", e))?;
                }
            }
            Err(e) => return Err(self.io(shown, "mkdir", e)),
        }
        let fd = confine::open_dir_at(parent.fd.as_fd(), name)
            .map_err(|e| self.io(shown, "open directory", e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| self.io(shown, "stat", e))?;
        self.chown_fd(fd.as_fd(), meta, shown)?;
        self.xattrs(XattrTarget::Fd(fd.as_fd()), meta, shown)?;
        self.deferred.push(DeferredDir {
            path: comps.iter().map(|c| c.to_vec()).collect(),
            id: confine::dev_ino(&st),
            entry: shown.to_string(),
            mode: meta.mode,
            times: meta.times.clone(),
        });
        Ok(())
    }

    fn symlink(
        &mut self,
        dir: &DirHandle,
        name: &[u8],
        target: &[u8],
        meta: &Meta,
        shown: &str,
    ) -> Result<(), UnpackError> {
        if target.is_empty() || target.contains(&0) {
            return Err(self.unsafe_entry(shown, "invalid symlink target"));
        }
        match rustix::fs::symlinkat(target, dir.fd.as_fd(), name) {
            Ok(()) => {}
            Err(Errno::EXIST) => {
                self.clear_slot(dir, name, false, shown)?;
                rustix::fs::symlinkat(target, dir.fd.as_fd(), name)
                    .map_err(|e| self.io(shown, "symlink", e))?;
            }
            Err(e) => return Err(self.io(shown, "symlink", e)),
        }
        self.chown_at(dir, name, meta, shown)?;
        self.xattrs(XattrTarget::At(dir.fd.as_fd(), name), meta, shown)?;
        rustix::fs::utimensat(dir.fd.as_fd(), name, &meta.times, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| self.io(shown, "set mtime", e))?;
        Ok(())
    }

    fn hardlink(
        &mut self,
        dir: &DirHandle,
        name: &[u8],
        target: &[u8],
        shown: &str,
    ) -> Result<(), UnpackError> {
        let shown_target = String::from_utf8_lossy(target).into_owned();
        let comps = split_path(target).map_err(|r| {
            self.unsafe_entry(shown, format!("hard link target {shown_target:?}: {r}"))
        })?;
        let Some((tname, tparent)) = comps.split_last() else {
            return Err(self.unsafe_entry(shown, "hard link to the root"));
        };
        let tdir = self.dir(tparent, false).map_err(|e| match e {
            ResolveError::Escape(m) => {
                self.unsafe_entry(shown, format!("hard link target {shown_target:?}: {m}"))
            }
            other => self.io(
                shown,
                "hard link",
                std::io::Error::other(format!("target {shown_target:?}: {other}")),
            ),
        })?;
        let st = confine::lstat_at(tdir.fd.as_fd(), tname)
            .map_err(|e| self.io(shown, "stat hard link target", e))?
            .ok_or_else(|| {
                self.io(
                    shown,
                    "hard link",
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("target {shown_target:?} does not exist"),
                    ),
                )
            })?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            return Err(
                self.unsafe_entry(shown, format!("hard link to directory {shown_target:?}"))
            );
        }
        if (tdir.dev, tdir.ino) == (dir.dev, dir.ino) && *tname == name {
            return Ok(());
        }
        if let Some(existing) =
            confine::lstat_at(dir.fd.as_fd(), name).map_err(|e| self.io(shown, "stat", e))?
        {
            if confine::dev_ino(&existing) == confine::dev_ino(&st) {
                return Ok(()); // already this very inode
            }
            self.clear_slot(dir, name, false, shown)?;
        }
        rustix::fs::linkat(
            tdir.fd.as_fd(),
            *tname,
            dir.fd.as_fd(),
            name,
            AtFlags::empty(),
        )
        .map_err(|e| self.io(shown, "hard link", e))?;
        Ok(())
    }

    /// Creates a device or fifo; `Ok(false)` when it was skipped.
    #[allow(clippy::too_many_arguments)]
    fn node(
        &mut self,
        dir: &DirHandle,
        name: &[u8],
        ft: FileType,
        major: u32,
        minor: u32,
        meta: &Meta,
        shown: &str,
    ) -> Result<bool, UnpackError> {
        let dev = rustix::fs::makedev(major, minor);
        let perm = Mode::from_raw_mode(0o600);
        let mut res = rustix::fs::mknodat(dir.fd.as_fd(), name, ft, perm, dev);
        if res == Err(Errno::EXIST) {
            self.clear_slot(dir, name, false, shown)?;
            res = rustix::fs::mknodat(dir.fd.as_fd(), name, ft, perm, dev);
        }
        match res {
            Ok(()) => {}
            Err(Errno::PERM) if ft != FileType::Fifo || !self.euid_root => {
                self.warn(
                    shown,
                    format!("cannot create {ft:?} {major}:{minor} (not permitted), skipped"),
                );
                return Ok(false);
            }
            Err(e) => return Err(self.io(shown, "mknod", e)),
        }
        self.chown_at(dir, name, meta, shown)?;
        // chmodat follows symlinks; make sure the name is still the node just made.
        let st = confine::lstat_at(dir.fd.as_fd(), name).map_err(|e| self.io(shown, "stat", e))?;
        if st.is_some_and(|s| FileType::from_raw_mode(s.st_mode) == ft) {
            rustix::fs::chmodat(
                dir.fd.as_fd(),
                name,
                Mode::from_raw_mode(meta.mode),
                AtFlags::empty(),
            )
            .map_err(|e| self.io(shown, "chmod", e))?;
        }
        self.xattrs(XattrTarget::At(dir.fd.as_fd(), name), meta, shown)?;
        rustix::fs::utimensat(dir.fd.as_fd(), name, &meta.times, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| self.io(shown, "set mtime", e))?;
        Ok(true)
    }

    /// `.wh.<target>` in `parent`: removes the lower layers' `target` (keeps what this layer
    /// added, also below it).
    fn whiteout(
        &mut self,
        parent: &[&[u8]],
        target: &[u8],
        shown: &str,
    ) -> Result<(), UnpackError> {
        let dir = match self.dir(parent, false) {
            Ok(d) => d,
            Err(ResolveError::Missing(_) | ResolveError::NotDir(_)) => return Ok(()),
            Err(e) => return Err(self.resolve_error(shown, e)),
        };
        if self.added.contains(&(dir.dev, dir.ino, target.to_vec())) {
            return Ok(());
        }
        let Some(st) =
            confine::lstat_at(dir.fd.as_fd(), target).map_err(|e| self.io(shown, "stat", e))?
        else {
            return Ok(());
        };
        self.cache.clear();
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            let sub = confine::open_dir_at(dir.fd.as_fd(), target)
                .map_err(|e| self.io(shown, "open whiteout target", e))?;
            let (dev, ino) = confine::dev_ino(&st);
            self.prune(sub.as_fd(), dev, ino, shown)?;
            drop(sub);
            match rustix::fs::unlinkat(dir.fd.as_fd(), target, AtFlags::REMOVEDIR) {
                Ok(()) | Err(Errno::NOTEMPTY) => {}
                Err(e) => return Err(self.io(shown, "remove whiteout target", e)),
            }
        } else {
            rustix::fs::unlinkat(dir.fd.as_fd(), target, AtFlags::empty())
                .map_err(|e| self.io(shown, "remove whiteout target", e))?;
        }
        Ok(())
    }

    /// `.wh..wh..opq` in `parent`: removes every lower child of the directory.
    fn opaque(&mut self, parent: &[&[u8]], shown: &str) -> Result<(), UnpackError> {
        let dir = self
            .dir(parent, true)
            .map_err(|e| self.resolve_error(shown, e))?;
        self.cache.clear();
        self.prune(dir.fd.as_fd(), dir.dev, dir.ino, shown)
    }

    /// Removes every entry below `dir` that this layer did not add, descending into the
    /// directories it did add.
    fn prune(
        &mut self,
        dir: BorrowedFd<'_>,
        dev: u64,
        ino: u64,
        shown: &str,
    ) -> Result<(), UnpackError> {
        let names = confine::list_dir(dir).map_err(|e| self.io(shown, "list directory", e))?;
        for name in names {
            if self.added.contains(&(dev, ino, name.clone())) {
                let Some(st) =
                    confine::lstat_at(dir, &name).map_err(|e| self.io(shown, "stat", e))?
                else {
                    continue;
                };
                if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                    let sub = confine::open_dir_at(dir, &name)
                        .map_err(|e| self.io(shown, "open directory", e))?;
                    let (cdev, cino) = confine::dev_ino(&st);
                    self.prune(sub.as_fd(), cdev, cino, shown)?;
                }
            } else {
                confine::remove_tree_at(dir, &name)
                    .map_err(|e| self.io(shown, "remove lower entry", e))?;
            }
        }
        Ok(())
    }

    /// Applies the layer's directory modes and mtimes, in archive order (a later entry for the
    /// same directory wins).
    fn finish_dirs(&mut self) -> Result<(), UnpackError> {
        let deferred = std::mem::take(&mut self.deferred);
        for d in &deferred {
            let fd: OwnedFd = match d.path.split_last() {
                None => match self.root.handle() {
                    Ok(h) => h.fd,
                    Err(e) => return Err(self.io(&d.entry, "open root", e)),
                },
                Some((name, parent)) => {
                    let parent: Vec<&[u8]> = parent.iter().map(Vec::as_slice).collect();
                    let pd = match self.dir(&parent, false) {
                        Ok(h) => h,
                        Err(ResolveError::Missing(_) | ResolveError::NotDir(_)) => continue,
                        Err(e) => return Err(self.resolve_error(&d.entry, e)),
                    };
                    match confine::open_dir_at(pd.fd.as_fd(), name) {
                        Ok(fd) => fd,
                        // Removed or replaced later in the layer.
                        Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => continue,
                        Err(e) => return Err(self.io(&d.entry, "open directory", e)),
                    }
                }
            };
            let st = rustix::fs::fstat(&fd).map_err(|e| self.io(&d.entry, "stat", e))?;
            if confine::dev_ino(&st) != d.id {
                continue;
            }
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(d.mode))
                .map_err(|e| self.io(&d.entry, "chmod", e))?;
            rustix::fs::futimens(&fd, &d.times).map_err(|e| self.io(&d.entry, "set mtime", e))?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum XattrTarget<'a> {
    Fd(BorrowedFd<'a>),
    At(BorrowedFd<'a>, &'a [u8]),
}

#[cfg(test)]
mod tests;
