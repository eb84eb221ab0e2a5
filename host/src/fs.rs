//! Host files, written atomically under a configurable root.
//!
//! [`HostFs`] maps a host path such as `/etc/aks-flex-node/config.json` to a real path under its
//! root: `/` on a host, a temporary directory in tests. Writes never leave a half-written file:
//! the content goes to a temporary file in the same directory, is synced, gets its mode (and the
//! SELinux label of the file it replaces, when there is one), and is renamed over the target.
//! Missing parent directories are created with mode 0750; existing ones are left alone.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// Mode for directories this module creates.
pub const DIR_MODE: u32 = 0o750;

/// Largest file [`HostFs::install`] accepts (as upstream's `InstallFile`).
pub const MAX_INSTALL_BYTES: u64 = 1 << 30;

const SELINUX_XATTR: &str = "security.selinux";

/// A file-system error naming the host path and what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct FsError {
    /// What was being done (`write`, `read`, `remove`, ...).
    pub op: &'static str,
    /// The host path (not the root-prefixed one).
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

impl FsError {
    /// An error of `op` on `path`.
    pub fn new(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self {
            op,
            path: path.to_path_buf(),
            source,
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

    /// Creates `p` and its missing parents; the directories it creates get `mode`.
    pub fn create_dir_all_mode(&self, p: &Path, mode: u32) -> Result<(), FsError> {
        let real = self.path(p);
        if real.is_dir() {
            return Ok(());
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(&real)
            .map_err(|e| FsError::new("create directory", p, e))?;
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
    /// [`MAX_INSTALL_BYTES`].
    pub fn install(
        &self,
        p: &Path,
        reader: &mut dyn std::io::Read,
        mode: u32,
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
            let copied = std::io::copy(
                &mut std::io::Read::take(&mut *reader, MAX_INSTALL_BYTES + 1),
                &mut file,
            )?;
            if copied > MAX_INSTALL_BYTES {
                return Err(std::io::Error::new(
                    ErrorKind::FileTooLarge,
                    format!("content exceeds {MAX_INSTALL_BYTES} bytes"),
                ));
            }
            file.flush()?;
            file.set_permissions(fs::Permissions::from_mode(mode))?;
            if let Some(label) = &label {
                // Keep the replaced file's SELinux label; best effort (the policy may refuse).
                let _ = rustix::fs::fsetxattr(
                    &file,
                    SELINUX_XATTR,
                    label,
                    rustix::fs::XattrFlags::empty(),
                );
            }
            file.sync_all()?;
            fs::rename(&tmp_path, &real)?;
            if let Ok(d) = File::open(&dir) {
                let _ = d.sync_all();
            }
            Ok(())
        })();
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp_path);
            return Err(FsError::new("write", p, e));
        }
        Ok(())
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
        Ok(true)
    }

    /// Removes a file (or symlink); returns whether something was there.
    pub fn remove_file(&self, p: &Path) -> Result<bool, FsError> {
        match fs::remove_file(self.path(p)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(FsError::new("remove", p, e)),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> (tempfile::TempDir, HostFs) {
        let d = tempfile::tempdir().unwrap();
        let fs = HostFs::new(d.path());
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

    #[test]
    fn read_missing_is_none_and_errors_name_the_host_path() {
        let (_d, fs) = tmp();
        assert!(fs.read(Path::new("/missing")).unwrap().is_none());
        fs.write_atomic(Path::new("/dir/f"), b"x", 0o644).unwrap();
        let err = fs.read(Path::new("/dir")).unwrap_err();
        assert!(err.to_string().starts_with("read /dir:"), "{err}");
    }
}
