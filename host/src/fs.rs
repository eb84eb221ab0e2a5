//! Host files, written atomically under a configurable root.
//!
//! [`HostFs`] maps a host path such as `/etc/aks-flex-node/config.json` to a real path under its
//! root: `/` on a host, a temporary directory in tests. Writes never leave a half-written file:
//! the content goes to a temporary file in the same directory, is synced, gets its mode (and the
//! SELinux label of the file it replaces, when there is one), and is renamed over the target.
//! Missing parent directories are created with mode 0750; existing ones are left alone.
//!
//! Durability: a rename, a new link or a removal is atomic at once but only survives a power
//! cut once its directory is synced. Every replacing write ([`HostFs::install`],
//! [`HostFs::write_atomic`]), link swap ([`HostFs::symlink`]) and removal of a file
//! ([`HostFs::remove_file`]) syncs the parent directory afterwards ([`sync_dir`]), in
//! [`ConfinedFs`] too; a failure to sync is an error (the change happened, but may not last).
//! [`HostFs`] also syncs each directory it creates (for a write's missing parents) into its
//! parent; [`ConfinedFs`] does not yet for the directories it creates.
//!
//! [`HostFs::remove_dir_all`] counts a directory that is a mount point as removed once its
//! contents are gone ([`Removed::EmptiedMountPoint`]: in the agent's container its host
//! directories are bind mounts).
//!
//! [`write_new`] is for a path the user named rather than a host path under a root (`aks-flex-node
//! ignition`'s output): a new file created `O_EXCL` with its mode from the start and linked into
//! place, never replacing anything.
//!
//! [`HostFs`] follows symlinks like any path-based call: right for the host's own files, wrong
//! inside a tree someone else built. A machine's root file system comes from an image, and an
//! image may hold `etc/systemd/system -> /etc/systemd/system`; writes into such a tree go
//! through [`ConfinedFs`] ([`HostFs::confined`]), which resolves every path with
//! [`crate::confine`] (directory fds, `O_NOFOLLOW`, absolute links taken from the tree's root as
//! in a chroot, links climbing above the root refused) and acts on the last component with `*at`
//! calls that never follow it.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::confine::{self, DirHandle, ResolveError, Root};

/// Mode for directories this module creates.
pub const DIR_MODE: u32 = 0o750;

/// Largest file [`HostFs::install`] accepts (as upstream's `InstallFile`).
pub const MAX_INSTALL_BYTES: u64 = 1 << 30;

const SELINUX_XATTR: &str = "security.selinux";

/// A file-system error naming the host path and what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {cause}")]
pub struct FsError {
    /// What was being done (`write`, `read`, `remove`, ...).
    pub op: &'static str,
    /// The host path (not the root-prefixed one).
    pub path: PathBuf,
    /// The OS error (in the message, not a `source()`: see [`crate::error`]).
    pub cause: std::io::Error,
}

impl FsError {
    /// An error of `op` on `path`.
    pub fn new(op: &'static str, path: &Path, cause: std::io::Error) -> Self {
        Self {
            op,
            path: path.to_path_buf(),
            cause,
        }
    }
}

/// What [`HostFs::remove_dir_all`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removed {
    /// The directory was there and is gone.
    Removed,
    /// The directory is a mount point: its contents are gone, the (now empty) directory stays.
    EmptiedMountPoint,
    /// Nothing was there.
    Absent,
}

/// The host's file system, seen through a root directory.
#[derive(Clone, Debug)]
pub struct HostFs {
    root: PathBuf,
}

impl HostFs {
    /// The real host: root `/`.
    pub fn host() -> Self {
        Self::new("/")
    }

    /// A view rooted at `root` (tests use a temporary directory).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The real path of host path `p`. Relative paths are taken from `/`; `..` components are
    /// dropped so nothing resolves above the root.
    pub fn path(&self, p: &Path) -> PathBuf {
        let mut out = self.root.clone();
        for c in p.components() {
            if let Component::Normal(n) = c {
                out.push(n);
            }
        }
        out
    }

    /// Whether host path `p` exists (without following a final symlink).
    pub fn exists(&self, p: &Path) -> bool {
        fs::symlink_metadata(self.path(p)).is_ok()
    }

    /// Reads a file; `Ok(None)` when it does not exist.
    pub fn read(&self, p: &Path) -> Result<Option<Vec<u8>>, FsError> {
        match fs::read(self.path(p)) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(FsError::new("read", p, e)),
        }
    }

    /// Reads a UTF-8 file; `Ok(None)` when it does not exist.
    pub fn read_to_string(&self, p: &Path) -> Result<Option<String>, FsError> {
        match self.read(p)? {
            None => Ok(None),
            Some(b) => String::from_utf8(b).map(Some).map_err(|e| {
                FsError::new("read", p, std::io::Error::new(ErrorKind::InvalidData, e))
            }),
        }
    }

    /// Creates `p` and its missing parents with mode [`DIR_MODE`].
    pub fn create_dir_all(&self, p: &Path) -> Result<(), FsError> {
        self.create_dir_all_mode(p, DIR_MODE)
    }

    /// Creates `p` and its missing parents; the directories it creates get `mode`. Each
    /// directory created is synced into its parent ([`sync_dir`]), so a power cut cannot lose
    /// it (and the first file written into it with it).
    pub fn create_dir_all_mode(&self, p: &Path, mode: u32) -> Result<(), FsError> {
        let real = self.path(p);
        if real.is_dir() {
            return Ok(());
        }
        // The missing directories, from `p` up to the first one that exists.
        let mut missing = Vec::new();
        let mut cur = Some(p);
        while let Some(d) = cur
            && !self.path(d).is_dir()
        {
            missing.push(d);
            cur = d.parent();
        }
        for d in missing.into_iter().rev() {
            let r = self.path(d);
            match fs::DirBuilder::new().mode(mode).create(&r) {
                Ok(()) => self.sync_parent(d, &r)?,
                // Created meanwhile by someone else, who syncs it.
                Err(e) if e.kind() == ErrorKind::AlreadyExists && r.is_dir() => {}
                Err(e) => return Err(FsError::new("create directory", d, e)),
            }
        }
        // The umask may have narrowed the leaf's mode; set it exactly.
        fs::set_permissions(&real, fs::Permissions::from_mode(mode))
            .map_err(|e| FsError::new("chmod", p, e))
    }

    /// Writes `contents` to `p` atomically with `mode`.
    pub fn write_atomic(&self, p: &Path, contents: &[u8], mode: u32) -> Result<(), FsError> {
        self.install(p, &mut &contents[..], mode)
    }

    /// Writes `contents` to `p` unless it already holds exactly that (and `mode`); returns whether
    /// it wrote.
    pub fn write_if_changed(&self, p: &Path, contents: &[u8], mode: u32) -> Result<bool, FsError> {
        let real = self.path(p);
        if let Ok(existing) = fs::read(&real)
            && existing == contents
            && fs::metadata(&real)
                .map(|m| m.permissions().mode() & 0o7777)
                .ok()
                == Some(mode)
        {
            return Ok(false);
        }
        self.write_atomic(p, contents, mode)?;
        Ok(true)
    }

    /// Streams `reader` into `p` atomically with `mode`, refusing more than
    /// [`MAX_INSTALL_BYTES`]; then syncs `p`'s directory.
    pub fn install(
        &self,
        p: &Path,
        reader: &mut dyn std::io::Read,
        mode: u32,
    ) -> Result<(), FsError> {
        self.install_with(p, reader, mode, &mut || {})
    }

    /// [`Self::write_atomic`], calling `before_rename` once the new content is complete and
    /// synced in its temporary file, right before it replaces `p` (where a crash leaves `p`
    /// as it was; a fault point goes there).
    pub fn write_atomic_with(
        &self,
        p: &Path,
        contents: &[u8],
        mode: u32,
        before_rename: &mut dyn FnMut(),
    ) -> Result<(), FsError> {
        self.install_with(p, &mut &contents[..], mode, before_rename)
    }

    fn install_with(
        &self,
        p: &Path,
        reader: &mut dyn std::io::Read,
        mode: u32,
        before_rename: &mut dyn FnMut(),
    ) -> Result<(), FsError> {
        let real = self.path(p);
        let (dir, name) = match (real.parent(), real.file_name()) {
            (Some(d), Some(n)) => (d.to_path_buf(), n.to_string_lossy().into_owned()),
            _ => {
                return Err(FsError::new(
                    "write",
                    p,
                    std::io::Error::new(ErrorKind::InvalidInput, "path has no file name"),
                ));
            }
        };
        if let Some(parent) = p.parent() {
            self.create_dir_all(parent)?;
        }
        let label = read_selinux_label(&real);
        let mut tmp_path;
        let mut attempt = 0u32;
        let mut file = loop {
            tmp_path = dir.join(format!(".{name}.tmp-{}-{attempt}", std::process::id()));
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp_path)
            {
                Ok(f) => break f,
                Err(e) if e.kind() == ErrorKind::AlreadyExists && attempt < 100 => attempt += 1,
                Err(e) => return Err(FsError::new("write", p, e)),
            }
        };
        let result = (|| -> std::io::Result<()> {
            fill(&mut file, reader, mode, label.as_deref())?;
            before_rename();
            fs::rename(&tmp_path, &real)
        })();
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp_path);
            return Err(FsError::new("write", p, e));
        }
        sync_dir(&dir).map_err(|e| FsError::new("sync the directory of", p, e))
    }

    /// Makes `p` a symlink to `target`, replacing whatever file or link is there (atomically:
    /// a temporary link renamed over it). Returns whether it changed anything.
    pub fn symlink(&self, p: &Path, target: &Path) -> Result<bool, FsError> {
        let real = self.path(p);
        if fs::read_link(&real).is_ok_and(|t| t == target) {
            return Ok(false);
        }
        if let Some(parent) = p.parent() {
            self.create_dir_all(parent)?;
        }
        let name = real
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = real.with_file_name(format!(".{name}.link-{}", std::process::id()));
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp).map_err(|e| FsError::new("symlink", p, e))?;
        fs::rename(&tmp, &real).map_err(|e| {
            let _ = fs::remove_file(&tmp);
            FsError::new("symlink", p, e)
        })?;
        self.sync_parent(p, &real)?;
        Ok(true)
    }

    fn sync_parent(&self, p: &Path, real: &Path) -> Result<(), FsError> {
        match real.parent() {
            Some(dir) => sync_dir(dir).map_err(|e| FsError::new("sync the directory of", p, e)),
            None => Ok(()),
        }
    }

    /// Removes a file (or symlink) and syncs its directory; returns whether something was
    /// there.
    pub fn remove_file(&self, p: &Path) -> Result<bool, FsError> {
        let real = self.path(p);
        match fs::remove_file(&real) {
            Ok(()) => {
                self.sync_parent(p, &real)?;
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(FsError::new("remove", p, e)),
        }
    }

    /// Renames `from` over `to` (same directory, or at least the same file system), then syncs
    /// `to`'s directory so the rename survives a crash. For a caller that writes a complete file
    /// under a temporary name itself and has something to do before it takes its place.
    pub fn rename(&self, from: &Path, to: &Path) -> Result<(), FsError> {
        let real = self.path(to);
        fs::rename(self.path(from), &real).map_err(|e| FsError {
            op: "rename",
            path: to.to_path_buf(),
            cause: std::io::Error::new(e.kind(), format!("from {}: {e}", from.display())),
        })?;
        self.sync_parent(to, &real)
    }

    /// Removes a directory tree. A directory that cannot be removed because it is a mount point
    /// (`EBUSY` on the directory itself) but whose contents are gone counts as removed
    /// ([`Removed::EmptiedMountPoint`]): in the agent's container its host directories are bind
    /// mounts.
    pub fn remove_dir_all(&self, p: &Path) -> Result<Removed, FsError> {
        let real = self.path(p);
        match fs::symlink_metadata(&real) {
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Removed::Absent),
            Err(e) => return Err(FsError::new("remove", p, e)),
            Ok(m) if !m.is_dir() => {
                fs::remove_file(&real).map_err(|e| FsError::new("remove", p, e))?;
                return Ok(Removed::Removed);
            }
            Ok(_) => {}
        }
        match fs::remove_dir_all(&real) {
            Ok(()) => Ok(Removed::Removed),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(Removed::Absent),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) => {
                // The contents may be gone and only the directory itself is busy.
                self.empty_dir(&real)
                    .map_err(|e| FsError::new("remove", p, e))?;
                let empty = fs::read_dir(&real)
                    .map(|mut d| d.next().is_none())
                    .unwrap_or(false);
                if empty {
                    Ok(Removed::EmptiedMountPoint)
                } else {
                    Err(FsError::new("remove", p, e))
                }
            }
            Err(e) => Err(FsError::new("remove", p, e)),
        }
    }

    fn empty_dir(&self, real: &Path) -> std::io::Result<()> {
        for entry in fs::read_dir(real)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                fs::remove_dir_all(&path)?;
            } else {
                fs::remove_file(&path)?;
            }
        }
        Ok(())
    }

    /// The mode bits of `p`, if it exists.
    pub fn mode(&self, p: &Path) -> Option<u32> {
        fs::symlink_metadata(self.path(p))
            .ok()
            .map(|m| m.permissions().mode() & 0o7777)
    }
}

/// Writes `contents` to a new file at `path` (a path the user named, not under a host root)
/// with `mode`, never replacing anything: an existing `path` (a dangling link included) is an
/// error, and a failure leaves nothing at `path` and no temporary file behind.
///
/// The data goes to a temporary file in the same directory, opened with `O_EXCL`
/// (`create_new`) and `mode` from the start (never readable by others, even for a moment, when
/// `mode` is 0600), synced, then hard-linked to `path`: `link(2)` fails with `EEXIST` rather
/// than replace a file that appeared meanwhile, so the check and the creation are one step.
/// The temporary name is removed and the directory synced.
pub fn write_new(path: &Path, contents: &[u8], mode: u32) -> Result<(), FsError> {
    let exists = || {
        std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "it exists; remove it or choose another path (it is never replaced)",
        )
    };
    if path.symlink_metadata().is_ok() {
        return Err(FsError::new("create", path, exists()));
    }
    let name = path
        .file_name()
        .ok_or_else(|| FsError::new("create", path, std::io::Error::other("not a file name")))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{nanos}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()
    })();
    if let Err(cause) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(FsError::new("write", path, cause));
    }
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => sync_dir(&dir).map_err(|cause| FsError::new("sync", &dir, cause)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Err(FsError::new("create", path, exists()))
        }
        Err(cause) => Err(FsError::new("create", path, cause)),
    }
}

/// Syncs the directory `dir`, making the renames, links and removals in it durable (a power
/// cut cannot revert them afterwards). A file system that cannot sync a directory (`EINVAL`,
/// `ENOTSUP`: it has nothing to make durable) counts as synced.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    let d = File::open(dir)?;
    sync_dir_fd(d.as_fd())
}

/// Syncs the open directory `fd` ([`sync_dir`] and [`ConfinedFs`] both end here; tests record
/// the directory's path in [`synced`]).
fn sync_dir_fd(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    match rustix::fs::fsync(fd) {
        Ok(()) | Err(Errno::INVAL) | Err(Errno::NOTSUP) => {}
        Err(e) => return Err(e.into()),
    }
    #[cfg(test)]
    {
        use std::os::fd::AsRawFd;
        if let Ok(path) = fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())) {
            synced::record(&path);
        }
    }
    Ok(())
}

/// The directories this thread synced (tests only: how the guarantee is checked).
#[cfg(test)]
pub(crate) mod synced {
    use std::cell::RefCell;
    use std::path::{Path, PathBuf};

    thread_local! {
        static SYNCED: RefCell<Vec<PathBuf>> = const { RefCell::new(Vec::new()) };
    }

    pub fn record(dir: &Path) {
        SYNCED.with(|s| s.borrow_mut().push(dir.to_path_buf()));
    }

    /// The directories synced since the last call.
    pub fn take() -> Vec<PathBuf> {
        SYNCED.with(|s| std::mem::take(&mut *s.borrow_mut()))
    }
}

/// Copies at most [`MAX_INSTALL_BYTES`] from `reader` into the new `file`, gives it `mode` (and
/// `label`, best effort) and syncs it.
fn fill(
    file: &mut File,
    reader: &mut dyn Read,
    mode: u32,
    label: Option<&[u8]>,
) -> std::io::Result<()> {
    let copied = std::io::copy(&mut reader.take(MAX_INSTALL_BYTES + 1), file)?;
    if copied > MAX_INSTALL_BYTES {
        return Err(std::io::Error::new(
            ErrorKind::FileTooLarge,
            format!("content exceeds {MAX_INSTALL_BYTES} bytes"),
        ));
    }
    file.flush()?;
    file.set_permissions(fs::Permissions::from_mode(mode))?;
    if let Some(label) = label {
        // Keep the replaced file's SELinux label; best effort (the policy may refuse).
        let _ = rustix::fs::fsetxattr(
            &*file,
            SELINUX_XATTR,
            label,
            rustix::fs::XattrFlags::empty(),
        );
    }
    file.sync_all()
}

fn read_selinux_label(real: &Path) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    match rustix::fs::getxattr(real, SELINUX_XATTR, &mut buf[..]) {
        Ok(n) if n > 0 => {
            buf.truncate(n);
            Some(buf)
        }
        _ => None,
    }
}

impl HostFs {
    /// The tree at host path `root` (an existing directory, e.g. a machine's root file system
    /// `/var/lib/machines/<m>`), with every path below it resolved inside it. `root` itself is a
    /// host path and resolved as such.
    pub fn confined(&self, root: &Path) -> Result<ConfinedFs, FsError> {
        ConfinedFs::open_as(&self.path(root), root)
    }
}

/// A directory tree written without ever leaving it: a machine's root file system.
///
/// Paths are taken relative to the tree's root (a leading `/` is the tree's root, as inside
/// the machine). Every directory on the way is resolved by [`crate::confine`], the resolver the
/// OCI unpacker builds the tree with, so both follow one policy:
///
/// - a symlink in a directory position is followed *inside* the tree: a relative target from the
///   link's directory, an absolute one from the tree's root, as the machine sees it (as in a
///   chroot) — `etc/systemd/system -> /etc/systemd/system` is the machine's own directory, never
///   the host's;
/// - a symlink or `..` that climbs above the root is refused (an error of kind
///   `PermissionDenied` saying "path escapes the root"), never clamped;
/// - the last component is never followed: writes replace a symlink there (temporary file or
///   link in the same directory, synced, `renameat` over it), reads and modes see the link
///   itself, removal unlinks it.
///
/// Errors name the host path (the tree's host path joined with the relative one).
#[derive(Clone, Debug)]
pub struct ConfinedFs {
    root: Arc<Root>,
    shown: PathBuf,
}

/// What a path inside a [`ConfinedFs`] holds, without following a final symlink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryInfo {
    /// Its type.
    pub kind: FileType,
    /// Its permission bits (`& 0o7777`).
    pub mode: u32,
}

fn resolve_io_error(e: ResolveError) -> std::io::Error {
    let kind = match &e {
        ResolveError::Escape(_) => ErrorKind::PermissionDenied,
        ResolveError::NotDir(_) => ErrorKind::NotADirectory,
        ResolveError::Missing(_) => ErrorKind::NotFound,
        ResolveError::Limit(_) => ErrorKind::Other,
        ResolveError::Io(_, _, source) => source.kind(),
    };
    std::io::Error::new(kind, e)
}

const FILE_READ_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::CLOEXEC);

impl ConfinedFs {
    /// The tree at the real path `root` (an existing directory).
    pub fn new(root: &Path) -> Result<Self, FsError> {
        Self::open_as(root, root)
    }

    /// The tree at real path `real`, named `shown` in errors.
    fn open_as(real: &Path, shown: &Path) -> Result<Self, FsError> {
        let r = Root::open(real).map_err(|e| FsError::new("open", shown, e))?;
        Ok(Self {
            root: Arc::new(r),
            shown: shown.to_path_buf(),
        })
    }

    /// The tree's host path.
    pub fn root(&self) -> &Path {
        &self.shown
    }

    /// The host path of `p` (for messages and reports; never opened by path).
    pub fn host_path(&self, p: &Path) -> PathBuf {
        let mut out = self.shown.clone();
        for c in p.components() {
            match c {
                Component::Normal(n) => out.push(n),
                Component::ParentDir => out.push(".."),
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
        out
    }

    fn err(&self, op: &'static str, p: &Path, e: impl Into<std::io::Error>) -> FsError {
        FsError::new(op, &self.host_path(p), e.into())
    }

    /// `p` as components, `..` kept (the resolver refuses climbing above the root).
    fn components(p: &Path) -> Vec<&[u8]> {
        p.components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.as_bytes()),
                Component::ParentDir => Some(&b".."[..]),
                Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
            })
            .collect()
    }

    /// `p`'s parent components and file name.
    fn split<'p>(
        &self,
        op: &'static str,
        p: &'p Path,
    ) -> Result<(Vec<&'p [u8]>, &'p [u8]), FsError> {
        let mut comps = Self::components(p);
        match comps.pop() {
            Some(name) if name != b".." => Ok((comps, name)),
            _ => Err(self.err(
                op,
                p,
                std::io::Error::new(ErrorKind::InvalidInput, "path has no file name"),
            )),
        }
    }

    /// The directory holding `p`'s last component, created (mode `create`) when missing and
    /// `create` is given; `Ok(None)` when it is missing (or not a directory) otherwise.
    fn parent<'p>(
        &self,
        op: &'static str,
        p: &'p Path,
        create: Option<u32>,
    ) -> Result<Option<(DirHandle, &'p [u8])>, FsError> {
        let (dir, name) = self.split(op, p)?;
        match self.root.resolve_dir_mode(&dir, create, &mut |_, _, _| {}) {
            Ok(h) => Ok(Some((h, name))),
            Err(ResolveError::Missing(_) | ResolveError::NotDir(_)) if create.is_none() => Ok(None),
            Err(e) => Err(self.err(op, p, resolve_io_error(e))),
        }
    }

    /// What is at `p` (a final symlink is not followed); `Ok(None)` when nothing is.
    pub fn entry(&self, p: &Path) -> Result<Option<EntryInfo>, FsError> {
        let Some((dir, name)) = self.parent("stat", p, None)? else {
            return Ok(None);
        };
        let st = confine::lstat_at(dir.fd.as_fd(), name).map_err(|e| self.err("stat", p, e))?;
        Ok(st.map(|st| EntryInfo {
            kind: FileType::from_raw_mode(st.st_mode),
            mode: st.st_mode & 0o7777,
        }))
    }

    /// Whether something is at `p` (a final symlink is not followed). A path that cannot be
    /// resolved inside the tree does not exist.
    pub fn exists(&self, p: &Path) -> bool {
        matches!(self.entry(p), Ok(Some(_)))
    }

    /// The mode bits of `p` (of a final symlink itself), if it exists.
    pub fn mode(&self, p: &Path) -> Option<u32> {
        self.entry(p).ok().flatten().map(|e| e.mode)
    }

    /// Opens the regular file `p` for reading; `Ok(None)` when nothing is there. A symlink (or
    /// any other non-regular file) at `p` is an error: it is never followed.
    pub fn open(&self, p: &Path) -> Result<Option<File>, FsError> {
        let Some((dir, name)) = self.parent("read", p, None)? else {
            return Ok(None);
        };
        let fd = match rustix::fs::openat(dir.fd.as_fd(), name, FILE_READ_FLAGS, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(Errno::LOOP) => {
                return Err(self.err(
                    "read",
                    p,
                    std::io::Error::new(ErrorKind::InvalidInput, "a symlink (not followed)"),
                ));
            }
            Err(e) => return Err(self.err("read", p, e)),
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| self.err("read", p, e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(self.err(
                "read",
                p,
                std::io::Error::new(ErrorKind::InvalidInput, "not a regular file"),
            ));
        }
        let file = File::from(fd);
        // Back to blocking reads (O_NONBLOCK only kept a FIFO from blocking the open).
        rustix::fs::fcntl_setfl(&file, OFlags::RDONLY).map_err(|e| self.err("read", p, e))?;
        Ok(Some(file))
    }

    /// Reads the regular file `p`; `Ok(None)` when it does not exist.
    pub fn read(&self, p: &Path) -> Result<Option<Vec<u8>>, FsError> {
        let Some(mut f) = self.open(p)? else {
            return Ok(None);
        };
        let mut out = Vec::new();
        f.read_to_end(&mut out)
            .map_err(|e| self.err("read", p, e))?;
        Ok(Some(out))
    }

    /// Creates directory `p` and its missing parents with mode [`DIR_MODE`].
    pub fn create_dir_all(&self, p: &Path) -> Result<(), FsError> {
        self.create_dir_all_mode(p, DIR_MODE)
    }

    /// Creates directory `p` and its missing parents; the directories it creates get `mode`,
    /// existing ones are left alone.
    pub fn create_dir_all_mode(&self, p: &Path, mode: u32) -> Result<(), FsError> {
        self.root
            .resolve_dir_mode(&Self::components(p), Some(mode), &mut |_, _, _| {})
            .map(drop)
            .map_err(|e| self.err("create directory", p, resolve_io_error(e)))
    }

    /// Writes `contents` to `p` atomically with `mode`.
    pub fn write_atomic(&self, p: &Path, contents: &[u8], mode: u32) -> Result<(), FsError> {
        self.install(p, &mut &contents[..], mode)
    }

    /// Writes `contents` to `p` unless it is already a regular file holding exactly that with
    /// `mode`; returns whether it wrote. A symlink at `p` is replaced, never read through.
    pub fn write_if_changed(&self, p: &Path, contents: &[u8], mode: u32) -> Result<bool, FsError> {
        if self.mode_if_regular(p) == Some(mode)
            && matches!(self.read(p), Ok(Some(existing)) if existing == contents)
        {
            return Ok(false);
        }
        self.write_atomic(p, contents, mode)?;
        Ok(true)
    }

    fn mode_if_regular(&self, p: &Path) -> Option<u32> {
        match self.entry(p) {
            Ok(Some(EntryInfo {
                kind: FileType::RegularFile,
                mode,
            })) => Some(mode),
            _ => None,
        }
    }

    /// Streams `reader` into `p` atomically with `mode` (at most [`MAX_INSTALL_BYTES`]): a
    /// temporary file created `O_EXCL | O_NOFOLLOW` in `p`'s directory, synced, renamed over
    /// `p`. Missing parents are created with mode [`DIR_MODE`].
    pub fn install(&self, p: &Path, reader: &mut dyn Read, mode: u32) -> Result<(), FsError> {
        let Some((dir, name)) = self.parent("write", p, Some(DIR_MODE))? else {
            return Err(self.err("write", p, Errno::NOENT));
        };
        let dfd = dir.fd.as_fd();
        let label = match confine::lstat_at(dfd, name) {
            Ok(Some(st)) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
                read_selinux_label_at(dfd, name)
            }
            _ => None,
        };
        let shown_name = String::from_utf8_lossy(name);
        let mut attempt = 0u32;
        let (tmp, fd) = loop {
            let tmp = format!(".{shown_name}.tmp-{}-{attempt}", std::process::id());
            match rustix::fs::openat(
                dfd,
                tmp.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            ) {
                Ok(fd) => break (tmp, fd),
                Err(Errno::EXIST) if attempt < 100 => attempt += 1,
                Err(e) => return Err(self.err("write", p, e)),
            }
        };
        let mut file = File::from(fd);
        let result = fill(&mut file, reader, mode, label.as_deref()).and_then(|()| {
            rustix::fs::renameat(dfd, tmp.as_str(), dfd, OsStr::from_bytes(name))?;
            Ok(())
        });
        if let Err(e) = result {
            let _ = rustix::fs::unlinkat(dfd, tmp.as_str(), AtFlags::empty());
            return Err(self.err("write", p, e));
        }
        sync_dir_fd(dfd).map_err(|e| self.err("sync the directory of", p, e))
    }

    /// Makes `p` a symlink to `target` (stored as given: an absolute target is read by the
    /// machine inside its own root), replacing whatever file or link is there (a temporary link
    /// renamed over it). Returns whether it changed anything.
    pub fn symlink(&self, p: &Path, target: &Path) -> Result<bool, FsError> {
        let Some((dir, name)) = self.parent("symlink", p, Some(DIR_MODE))? else {
            return Err(self.err("symlink", p, Errno::NOENT));
        };
        let dfd = dir.fd.as_fd();
        if rustix::fs::readlinkat(dfd, name, Vec::new())
            .is_ok_and(|t| t.as_bytes() == target.as_os_str().as_bytes())
        {
            return Ok(false);
        }
        let tmp = format!(
            ".{}.link-{}",
            String::from_utf8_lossy(name),
            std::process::id()
        );
        let _ = rustix::fs::unlinkat(dfd, tmp.as_str(), AtFlags::empty());
        rustix::fs::symlinkat(target, dfd, tmp.as_str()).map_err(|e| self.err("symlink", p, e))?;
        rustix::fs::renameat(dfd, tmp.as_str(), dfd, OsStr::from_bytes(name)).map_err(|e| {
            let _ = rustix::fs::unlinkat(dfd, tmp.as_str(), AtFlags::empty());
            self.err("symlink", p, e)
        })?;
        sync_dir_fd(dfd).map_err(|e| self.err("sync the directory of", p, e))?;
        Ok(true)
    }

    /// The target of the symlink `p`, as stored (never followed); `Ok(None)` when nothing or
    /// something other than a symlink is there.
    pub fn read_link(&self, p: &Path) -> Result<Option<PathBuf>, FsError> {
        let Some((dir, name)) = self.parent("readlink", p, None)? else {
            return Ok(None);
        };
        match rustix::fs::readlinkat(dir.fd.as_fd(), name, Vec::new()) {
            Ok(t) => Ok(Some(PathBuf::from(OsStr::from_bytes(t.as_bytes())))),
            Err(Errno::NOENT | Errno::INVAL) => Ok(None),
            Err(e) => Err(self.err("readlink", p, e)),
        }
    }

    /// Removes a file or symlink (never what it points to) and syncs its directory; returns
    /// whether something was there.
    pub fn remove_file(&self, p: &Path) -> Result<bool, FsError> {
        let Some((dir, name)) = self.parent("remove", p, None)? else {
            return Ok(false);
        };
        match rustix::fs::unlinkat(dir.fd.as_fd(), name, AtFlags::empty()) {
            Ok(()) => {
                sync_dir_fd(dir.fd.as_fd()).map_err(|e| self.err("sync the directory of", p, e))?;
                Ok(true)
            }
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(self.err("remove", p, e)),
        }
    }

    /// Removes `p` and, if it is a directory, everything below it, never following a symlink;
    /// returns whether something was there.
    pub fn remove_all(&self, p: &Path) -> Result<bool, FsError> {
        let Some((dir, name)) = self.parent("remove", p, None)? else {
            return Ok(false);
        };
        let dfd = dir.fd.as_fd();
        let there = confine::lstat_at(dfd, name)
            .map_err(|e| self.err("remove", p, e))?
            .is_some();
        confine::remove_tree_at(dfd, name).map_err(|e| self.err("remove", p, e))?;
        Ok(there)
    }

    /// The host path the regular file `p` resolves to inside the tree, free of symlinks (for
    /// handing to a command, e.g. a `--version` probe); `Ok(None)` when there is no regular file
    /// there. A final symlink is not followed (`Ok(None)`).
    pub fn resolved_host_path(&self, p: &Path) -> Result<Option<PathBuf>, FsError> {
        let Some((dir, name)) = self.parent("resolve", p, None)? else {
            return Ok(None);
        };
        match confine::lstat_at(dir.fd.as_fd(), name).map_err(|e| self.err("resolve", p, e))? {
            Some(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {}
            _ => return Ok(None),
        }
        let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&dir.fd));
        let real = fs::read_link(&proc).map_err(|e| self.err("resolve", p, e))?;
        Ok(Some(real.join(OsStr::from_bytes(name))))
    }
}

fn read_selinux_label_at(dir: std::os::fd::BorrowedFd<'_>, name: &[u8]) -> Option<Vec<u8>> {
    let fd = rustix::fs::openat(dir, name, FILE_READ_FLAGS, Mode::empty()).ok()?;
    let mut buf = vec![0u8; 256];
    match rustix::fs::fgetxattr(&fd, SELINUX_XATTR, &mut buf[..]) {
        Ok(n) if n > 0 => {
            buf.truncate(n);
            Some(buf)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> (tempfile::TempDir, HostFs) {
        let d = tempfile::tempdir().unwrap();
        // Canonical: the synced directories are recorded as the kernel names them.
        let fs = HostFs::new(d.path().canonicalize().unwrap());
        (d, fs)
    }

    #[test]
    fn paths_stay_under_the_root() {
        let fs = HostFs::new("/r");
        assert_eq!(fs.path(Path::new("/etc/x")), PathBuf::from("/r/etc/x"));
        assert_eq!(
            fs.path(Path::new("/../../etc/x")),
            PathBuf::from("/r/etc/x")
        );
        assert_eq!(fs.path(Path::new("etc/./x")), PathBuf::from("/r/etc/x"));
    }

    #[test]
    fn atomic_write_creates_parents_0750_and_sets_mode() {
        let (_d, fs) = tmp();
        let p = Path::new("/etc/aks-flex-node/state.json");
        fs.write_atomic(p, b"{}", 0o600).unwrap();
        assert_eq!(fs.read(p).unwrap().unwrap(), b"{}");
        assert_eq!(fs.mode(p), Some(0o600));
        assert_eq!(fs.mode(Path::new("/etc/aks-flex-node")), Some(0o750));
        assert_eq!(fs.mode(Path::new("/etc")), Some(0o750));
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(fs.path(Path::new("/etc/aks-flex-node")))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn existing_parent_modes_are_untouched() {
        let (_d, fs) = tmp();
        std::fs::create_dir_all(fs.path(Path::new("/etc"))).unwrap();
        std::fs::set_permissions(
            fs.path(Path::new("/etc")),
            fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        fs.write_atomic(Path::new("/etc/x"), b"1", 0o644).unwrap();
        assert_eq!(fs.mode(Path::new("/etc")), Some(0o755));
    }

    #[test]
    fn failed_write_leaves_old_content() {
        let (_d, fs) = tmp();
        let p = Path::new("/f");
        fs.write_atomic(p, b"old", 0o644).unwrap();
        let mut r = std::io::Read::take(std::io::repeat(b'x'), MAX_INSTALL_BYTES + 10);
        let err = fs.install(p, &mut r, 0o644).unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
        assert_eq!(fs.read(p).unwrap().unwrap(), b"old");
        assert_eq!(std::fs::read_dir(fs.root()).unwrap().count(), 1);
    }

    /// Real files in a temporary directory. What is recorded: which directories [`sync_dir`]
    /// synced (a power cut cannot be simulated here; the guarantee is that the sync follows
    /// each change, and that it works on the test's file system).
    #[test]
    fn writes_link_swaps_and_removals_sync_their_directory() {
        let (_d, fs) = tmp();
        let dir = fs.path(Path::new("/usr/local/lib/aks-flex-node"));
        let p = Path::new("/usr/local/lib/aks-flex-node/current");
        fs.create_dir_all(Path::new("/usr/local/lib/aks-flex-node"))
            .unwrap();
        synced::take();
        fs.write_atomic(Path::new("/usr/local/lib/aks-flex-node/blue"), b"x", 0o644)
            .unwrap();
        assert_eq!(synced::take(), vec![dir.clone()], "write_atomic");
        assert!(fs.symlink(p, Path::new("blue")).unwrap());
        assert_eq!(synced::take(), vec![dir.clone()], "symlink");
        assert!(!fs.symlink(p, Path::new("blue")).unwrap());
        assert_eq!(
            synced::take(),
            Vec::<PathBuf>::new(),
            "nothing changed, nothing to sync"
        );
        assert!(fs.remove_file(p).unwrap());
        assert_eq!(synced::take(), vec![dir.clone()], "remove_file");
        assert!(!fs.remove_file(p).unwrap());
        assert_eq!(synced::take(), Vec::<PathBuf>::new());
    }

    /// Real files in a temporary directory; recorded: the directories synced. A first write
    /// into missing directories syncs each created directory into its parent, then the file's
    /// own directory.
    #[test]
    fn directories_a_write_creates_are_synced_into_their_parents() {
        let (_d, fs) = tmp();
        fs.create_dir_all(Path::new("/etc")).unwrap();
        synced::take();
        fs.write_atomic(
            Path::new("/etc/aks-flex-node/upgrade/pending.json"),
            b"{}",
            0o600,
        )
        .unwrap();
        let p = |s: &str| fs.path(Path::new(s));
        assert_eq!(
            synced::take(),
            vec![
                p("/etc"),
                p("/etc/aks-flex-node"),
                p("/etc/aks-flex-node/upgrade")
            ]
        );
        // Nothing created, nothing but the file's directory synced.
        fs.write_atomic(
            Path::new("/etc/aks-flex-node/upgrade/pending.json"),
            b"{}",
            0o600,
        )
        .unwrap();
        assert_eq!(synced::take(), vec![p("/etc/aks-flex-node/upgrade")]);
        assert_eq!(fs.mode(Path::new("/etc/aks-flex-node")), Some(DIR_MODE));
    }

    /// Real files; recorded: the directories synced. `rename` replaces the target, syncs its
    /// directory, and its error names both paths.
    #[test]
    fn rename_replaces_syncs_and_names_both_paths() {
        let (_d, fs) = tmp();
        let (from, to) = (Path::new("/etc/.a.new"), Path::new("/etc/a"));
        fs.write_atomic(to, b"old", 0o600).unwrap();
        fs.write_atomic(from, b"new", 0o600).unwrap();
        synced::take();
        fs.rename(from, to).unwrap();
        assert_eq!(fs.read(to).unwrap().unwrap(), b"new");
        assert!(!fs.exists(from));
        assert_eq!(synced::take(), vec![fs.path(Path::new("/etc"))]);
        let e = fs.rename(from, to).unwrap_err();
        assert_eq!(e.cause.kind(), ErrorKind::NotFound);
        let msg = e.to_string();
        assert!(
            msg.starts_with("rename /etc/a: from /etc/.a.new: "),
            "{msg}"
        );
        assert_eq!(synced::take(), Vec::<PathBuf>::new());
    }

    /// Real files in a tree under a temporary directory; recorded: the directories synced.
    /// [`ConfinedFs`] syncs the directory of each write, link swap and removal too.
    #[test]
    fn confined_writes_link_swaps_and_removals_sync_their_directory() {
        let (_d, fs) = tmp();
        fs.create_dir_all(Path::new("/m/etc")).unwrap();
        let c = fs.confined(Path::new("/m")).unwrap();
        let dir = fs.path(Path::new("/m/etc"));
        synced::take();
        c.write_atomic(Path::new("/etc/hostname"), b"n\n", 0o644)
            .unwrap();
        assert_eq!(synced::take(), vec![dir.clone()], "write_atomic");
        assert!(
            c.symlink(Path::new("/etc/l"), Path::new("hostname"))
                .unwrap()
        );
        assert_eq!(synced::take(), vec![dir.clone()], "symlink");
        assert!(c.remove_file(Path::new("/etc/l")).unwrap());
        assert_eq!(synced::take(), vec![dir.clone()], "remove_file");
    }

    #[test]
    fn sync_dir_works_on_a_directory_and_names_a_missing_one() {
        let (d, _fs) = tmp();
        sync_dir(d.path()).unwrap();
        let e = sync_dir(&d.path().join("missing")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        synced::take();
    }

    /// Real files: the hook runs when the new content is complete in its temporary file and
    /// the old one is still in place.
    #[test]
    fn write_atomic_with_calls_its_hook_right_before_the_rename() {
        let (_d, fs) = tmp();
        let p = Path::new("/etc/pair.pem");
        fs.write_atomic(p, b"old", 0o600).unwrap();
        let mut seen = Vec::new();
        fs.write_atomic_with(p, b"new", 0o600, &mut || {
            let dir = fs.path(Path::new("/etc"));
            let mut names: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            let tmp = names
                .iter()
                .find(|n| n.starts_with(".pair.pem.tmp-"))
                .unwrap();
            seen.push((
                fs.read(p).unwrap().unwrap(),
                std::fs::read(dir.join(tmp)).unwrap(),
            ));
        })
        .unwrap();
        assert_eq!(seen, vec![(b"old".to_vec(), b"new".to_vec())]);
        assert_eq!(fs.read(p).unwrap().unwrap(), b"new");
    }

    #[test]
    fn write_if_changed_reports_changes() {
        let (_d, fs) = tmp();
        let p = Path::new("/u");
        assert!(fs.write_if_changed(p, b"a", 0o644).unwrap());
        assert!(!fs.write_if_changed(p, b"a", 0o644).unwrap());
        assert!(fs.write_if_changed(p, b"a", 0o600).unwrap());
        assert!(fs.write_if_changed(p, b"b", 0o600).unwrap());
    }

    #[test]
    fn remove_dir_all_outcomes() {
        let (_d, fs) = tmp();
        let p = Path::new("/var/log/aks-flex-node");
        assert_eq!(fs.remove_dir_all(p).unwrap(), Removed::Absent);
        fs.write_atomic(&p.join("a/b"), b"x", 0o600).unwrap();
        assert_eq!(fs.remove_dir_all(p).unwrap(), Removed::Removed);
        assert!(!fs.exists(p));
        assert!(!fs.remove_file(Path::new("/nope")).unwrap());
    }

    /// A real tmpfs mount (root only; skipped with a message otherwise): removing a directory
    /// that is a mount point empties it and reports [`Removed::EmptiedMountPoint`], as the
    /// agent's runtime directories are bind mounts in its container.
    #[tokio::test]
    async fn mount_point_is_emptied_and_counts_as_removed() {
        use crate::runner::{Cmd, ProcessRunner, Runner};
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: mounting a tmpfs needs root");
            return;
        }
        let (_d, fs) = tmp();
        let dir = Path::new("/etc/aks-flex-node");
        fs.create_dir_all(dir).unwrap();
        let real = fs.path(dir).display().to_string();
        let r = ProcessRunner::new();
        r.run(&Cmd::new("mount").args(["-t", "tmpfs", "tmpfs", &real]))
            .await
            .unwrap();
        fs.write_atomic(&dir.join("config.json"), b"{}", 0o600)
            .unwrap();
        fs.write_atomic(&dir.join("sub/x"), b"x", 0o600).unwrap();
        let outcome = fs.remove_dir_all(dir);
        r.run(&Cmd::new("umount").arg(&real)).await.unwrap();
        assert_eq!(outcome.unwrap(), Removed::EmptiedMountPoint);
        assert!(std::fs::read_dir(fs.path(dir)).unwrap().next().is_none());
    }

    /// A machine-like tree under a temporary host root (real files, nothing faked) whose
    /// image links point out of it: `etc/systemd/system` absolute to `<tmp>/outside`, `var/lib`
    /// relative past the root, `etc/hostname` a final link to a host file.
    fn hostile_tree() -> (tempfile::TempDir, HostFs, PathBuf, PathBuf) {
        let (d, fs) = tmp();
        let m = fs.path(Path::new("/var/lib/machines/kube1"));
        let outside = d.path().join("outside");
        std::fs::create_dir_all(m.join("etc/systemd")).unwrap();
        std::fs::create_dir_all(m.join("var")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), b"host").unwrap();
        std::os::unix::fs::symlink(&outside, m.join("etc/systemd/system")).unwrap();
        // From <tmp>/var/lib/machines/kube1/var: up five levels is <tmp>.
        std::os::unix::fs::symlink("../../../../../outside", m.join("var/lib")).unwrap();
        std::os::unix::fs::symlink(outside.join("secret"), m.join("etc/hostname")).unwrap();
        assert!(m.join("var/lib").is_dir(), "the link leads out");
        (d, fs, m, outside)
    }

    fn outside_untouched(outside: &Path) {
        let names: Vec<_> = std::fs::read_dir(outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["secret"], "something was written outside");
        assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"host");
    }

    #[test]
    fn confined_writes_resolve_absolute_links_inside_the_tree() {
        let (_d, fs, m, outside) = hostile_tree();
        let c = fs.confined(Path::new("/var/lib/machines/kube1")).unwrap();
        let unit = Path::new("/etc/systemd/system/kubelet.service");
        assert!(c.write_if_changed(unit, b"[Unit]\n", 0o644).unwrap());
        assert!(!c.write_if_changed(unit, b"[Unit]\n", 0o644).unwrap());
        let mask = Path::new("etc/systemd/system/systemd-resolved.service");
        assert!(c.symlink(mask, Path::new("/dev/null")).unwrap());
        assert!(!c.symlink(mask, Path::new("/dev/null")).unwrap());
        c.create_dir_all_mode(Path::new("etc/systemd/system/kubelet.service.d"), 0o700)
            .unwrap();
        outside_untouched(&outside);
        let inside = m.join(outside.strip_prefix("/").unwrap());
        assert_eq!(
            std::fs::read(inside.join("kubelet.service")).unwrap(),
            b"[Unit]\n"
        );
        assert_eq!(
            std::fs::read_link(inside.join("systemd-resolved.service")).unwrap(),
            PathBuf::from("/dev/null")
        );
        assert_eq!(
            c.mode(Path::new("etc/systemd/system/kubelet.service.d")),
            Some(0o700)
        );
        assert_eq!(c.read(unit).unwrap().unwrap(), b"[Unit]\n");
        assert_eq!(
            c.resolved_host_path(unit).unwrap().unwrap(),
            inside.join("kubelet.service")
        );
        assert!(c.remove_file(mask).unwrap());
        assert!(!inside.join("systemd-resolved.service").exists());
        // The image's link itself is left as it was.
        assert_eq!(
            std::fs::read_link(m.join("etc/systemd/system")).unwrap(),
            outside
        );
    }

    #[test]
    fn confined_refuses_links_that_climb_out_and_never_follows_a_final_link() {
        let (_d, fs, m, outside) = hostile_tree();
        let c = fs.confined(Path::new("/var/lib/machines/kube1")).unwrap();
        let kubeconfig = Path::new("/var/lib/kubelet/kubeconfig");
        let e = c.write_atomic(kubeconfig, b"x", 0o600).unwrap_err();
        assert_eq!(e.cause.kind(), ErrorKind::PermissionDenied, "{e}");
        let shown = e.to_string();
        assert!(
            shown.starts_with(
                "write /var/lib/machines/kube1/var/lib/kubelet/kubeconfig: path escapes the root"
            ),
            "{shown}"
        );
        assert!(
            c.symlink(Path::new("var/lib/x"), Path::new("/dev/null"))
                .is_err()
        );
        assert!(c.create_dir_all(Path::new("var/lib/kubelet")).is_err());
        assert!(c.write_atomic(Path::new("../escape"), b"x", 0o600).is_err());
        assert!(c.remove_all(Path::new("var/lib/secret")).is_err());
        assert!(!c.exists(Path::new("var/lib/secret")));
        assert!(c.resolved_host_path(Path::new("var/lib/secret")).is_err());
        // A final symlink is neither read through nor written through: it is replaced. Its
        // target can be read as stored.
        let hostname = Path::new("etc/hostname");
        assert!(c.read(hostname).is_err());
        let stored = std::fs::read_link(m.join("etc/hostname")).unwrap();
        assert_eq!(c.read_link(hostname).unwrap(), Some(stored));
        assert_eq!(c.read_link(Path::new("etc/absent")).unwrap(), None);
        assert!(
            c.read_link(Path::new("var/lib/secret")).is_err(),
            "below a link out"
        );
        assert_eq!(c.resolved_host_path(hostname).unwrap(), None);
        assert!(c.write_if_changed(hostname, b"node\n", 0o644).unwrap());
        outside_untouched(&outside);
        assert_eq!(std::fs::read(m.join("etc/hostname")).unwrap(), b"node\n");
        // Removing a tree removes links, not what they point to.
        assert!(c.remove_all(Path::new("etc")).unwrap());
        outside_untouched(&outside);
        assert!(!m.join("etc").exists());
    }

    #[test]
    fn confined_needs_an_existing_root_and_creates_parents_0750() {
        let (_d, fs) = tmp();
        let e = fs
            .confined(Path::new("/var/lib/machines/kube9"))
            .unwrap_err();
        assert!(
            e.to_string().starts_with("open /var/lib/machines/kube9:"),
            "{e}"
        );
        fs.create_dir_all(Path::new("/m")).unwrap();
        let c = fs.confined(Path::new("/m")).unwrap();
        c.write_atomic(Path::new("a/b/f"), b"1", 0o640).unwrap();
        assert_eq!(fs.mode(Path::new("/m/a")), Some(DIR_MODE));
        assert_eq!(fs.mode(Path::new("/m/a/b/f")), Some(0o640));
        assert_eq!(
            std::fs::read_dir(fs.path(Path::new("/m/a/b")))
                .unwrap()
                .count(),
            1
        );
        let mut big = std::io::Read::take(std::io::repeat(b'x'), MAX_INSTALL_BYTES + 10);
        assert!(c.install(Path::new("a/b/f"), &mut big, 0o644).is_err());
        assert_eq!(c.read(Path::new("a/b/f")).unwrap().unwrap(), b"1");
        assert_eq!(
            std::fs::read_dir(fs.path(Path::new("/m/a/b")))
                .unwrap()
                .count(),
            1
        );
        assert!(c.read(Path::new("nope/f")).unwrap().is_none());
        assert!(!c.remove_file(Path::new("nope/f")).unwrap());
    }

    #[test]
    fn read_missing_is_none_and_errors_name_the_host_path() {
        let (_d, fs) = tmp();
        assert!(fs.read(Path::new("/missing")).unwrap().is_none());
        fs.write_atomic(Path::new("/dir/f"), b"x", 0o644).unwrap();
        let err = fs.read(Path::new("/dir")).unwrap_err();
        assert!(err.to_string().starts_with("read /dir:"), "{err}");
    }

    /// Real files in a temporary directory: the new file has the mode and the bytes, nothing
    /// else is left in the directory, and the directory was synced.
    #[test]
    fn write_new_creates_the_file_with_its_mode_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.ign");
        let _ = synced::take();
        write_new(&path, b"{}", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
        assert_eq!(
            std::os::unix::fs::MetadataExt::nlink(&meta),
            1,
            "the temporary name is gone"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(synced::take().contains(&dir.path().to_path_buf()));
    }

    /// An existing file, or a dangling link, is never replaced: the error says it exists and
    /// the old bytes (or link) stay; no temporary file is left.
    #[test]
    fn write_new_never_replaces_an_existing_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.ign");
        std::fs::write(&path, b"old").unwrap();
        let e = write_new(&path, b"new", 0o600).unwrap_err();
        assert!(e.to_string().contains("exists"), "{e}");
        assert!(e.to_string().contains("node.ign"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        let link = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &link).unwrap();
        assert!(write_new(&link, b"new", 0o600).is_err());
        assert!(!dir.path().join("nowhere").exists(), "followed the link");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    /// A directory that does not exist: an error naming the path, nothing created.
    #[test]
    fn write_new_in_a_missing_directory_fails_and_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("node.ign");
        let e = write_new(&path, b"x", 0o600).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
