//! A directory tree confined to its root: path resolution with directory file descriptors that
//! never leaves the root, and removal that never follows a symlink.
//!
//! [`Root::resolve_dir`] walks a directory path one component at a time from an open fd of the
//! root, opening each component with `openat(…, O_DIRECTORY | O_NOFOLLOW)` relative to the fd
//! of the previous one, so the kernel never resolves more than one name at a time on our behalf
//! and never follows a symlink by itself. A component that is a symlink is read (`readlinkat`)
//! and its target spliced into the remaining walk: a relative target continues from the
//! symlink's directory, an absolute one restarts at the root (as inside a chroot). A `..` pops
//! the walk; popping past the root is an **escape** and fails the resolution instead of being
//! clamped. More than [`MAX_SYMLINKS`] symlinks is `ELOOP`; more than [`MAX_DEPTH`] levels is an
//! error too (each level holds an fd).
//!
//! The final component of a path is never resolved here: callers act on it with `*at` calls on
//! the parent's fd and `O_NOFOLLOW`/`AT_SYMLINK_NOFOLLOW`, so a symlink already at that name is
//! replaced, never written through. [`remove_tree_at`] removes with `unlinkat` and descends only
//! through directories opened with `O_NOFOLLOW`.
//!
//! **One policy for every machine tree.** This is the only resolver: the OCI layer unpacker
//! (`flex-oci`) builds machine trees with it, and every later write into one (the agent's units,
//! drop-ins, masks, kubeconfigs, component binaries, through [`crate::fs::ConfinedFs`]) goes
//! through it too. An absolute symlink in the tree is resolved relative to the tree's root, as
//! the machine itself sees it (as in a chroot); a symlink (or `..`) that climbs above the root is
//! refused ([`ResolveError::Escape`]), never clamped and never followed onto the host.
//!
//! Each step acts on exactly the directory fd that was checked, and `..` pops the walk's own
//! stack rather than asking the kernel for a parent, so even a tree changed concurrently (by
//! processes inside a running machine) can at worst redirect a write elsewhere inside the tree.

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Most symlinks followed while resolving one path (as Linux).
pub const MAX_SYMLINKS: u32 = 40;
/// Deepest directory nesting resolved.
pub const MAX_DEPTH: usize = 512;

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Why a directory path could not be resolved inside the root.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The path leaves the root (the message says how).
    #[error("path escapes the root: {0}")]
    Escape(String),
    /// A component exists but is not a directory (or a symlink to one).
    #[error("{0} is not a directory")]
    NotDir(String),
    /// A component does not exist (and creation was not asked for).
    #[error("{0} does not exist")]
    Missing(String),
    /// Too many symlinks or too deep.
    #[error("{0}")]
    Limit(String),
    /// A system call failed (the OS error is in the message, not a `source()`: see
    /// [`crate::error`]).
    #[error("{0} {1}: {2}")]
    Io(&'static str, String, std::io::Error),
}

/// An open directory inside the root, with its identity.
#[derive(Debug)]
pub struct DirHandle {
    /// The directory (opened `O_RDONLY | O_DIRECTORY | O_NOFOLLOW`).
    pub fd: OwnedFd,
    /// Its device.
    pub dev: u64,
    /// Its inode.
    pub ino: u64,
}

/// The root of a confined tree.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    dev: u64,
    ino: u64,
}

/// `(st_dev, st_ino)` as `u64` whatever the platform's field types.
#[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
pub fn dev_ino(st: &rustix::fs::Stat) -> (u64, u64) {
    (st.st_dev as u64, st.st_ino as u64)
}

/// Opens `name` in `dir` as a directory without following a symlink.
pub fn open_dir_at(dir: BorrowedFd<'_>, name: &[u8]) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty())
}

fn handle(fd: OwnedFd) -> Result<DirHandle, Errno> {
    let st = rustix::fs::fstat(&fd)?;
    let (dev, ino) = dev_ino(&st);
    Ok(DirHandle { fd, dev, ino })
}

fn show(walked: &[Vec<u8>], name: &[u8]) -> String {
    let mut s = String::new();
    for c in walked
        .iter()
        .map(Vec::as_slice)
        .chain(std::iter::once(name))
    {
        s.push('/');
        s.push_str(&String::from_utf8_lossy(c));
    }
    s
}

impl Root {
    /// Opens `path` (which must be a directory) as the root.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let h = handle(fd)?;
        Ok(Self {
            fd: h.fd,
            dev: h.dev,
            ino: h.ino,
        })
    }

    /// The root's fd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The root's `(dev, ino)`.
    pub fn id(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    /// A new handle on the root itself.
    pub fn handle(&self) -> Result<DirHandle, Errno> {
        Ok(DirHandle {
            fd: rustix::fs::openat(&self.fd, ".", DIR_FLAGS, Mode::empty())?,
            dev: self.dev,
            ino: self.ino,
        })
    }

    /// Resolves the directory `components` (relative to the root; `..` allowed only as far as
    /// the root) following symlinks confined to the root. With `create`, missing directories are
    /// created with mode 0755 and `on_create(parent_dev, parent_ino, name)` is told about each.
    pub fn resolve_dir(
        &self,
        components: &[&[u8]],
        create: bool,
        on_create: &mut dyn FnMut(u64, u64, &[u8]),
    ) -> Result<DirHandle, ResolveError> {
        self.resolve_dir_mode(components, create.then_some(0o755), on_create)
    }

    /// [`Root::resolve_dir`], creating missing directories with `create_mode` when it is given
    /// (exactly that mode: the umask does not narrow it).
    pub fn resolve_dir_mode(
        &self,
        components: &[&[u8]],
        create_mode: Option<u32>,
        on_create: &mut dyn FnMut(u64, u64, &[u8]),
    ) -> Result<DirHandle, ResolveError> {
        let mut stack: Vec<DirHandle> = Vec::new();
        let mut walked: Vec<Vec<u8>> = Vec::new();
        let mut queue: VecDeque<Vec<u8>> = components.iter().map(|c| c.to_vec()).collect();
        let mut links = 0u32;
        let mut via: Option<String> = None;
        while let Some(c) = queue.pop_front() {
            if c.is_empty() || c == b"." {
                continue;
            }
            if c == b".." {
                if stack.pop().is_none() {
                    let how = match &via {
                        Some(link) => format!("'..' above the root after following {link}"),
                        None => "'..' above the root".to_string(),
                    };
                    return Err(ResolveError::Escape(how));
                }
                walked.pop();
                continue;
            }
            if stack.len() >= MAX_DEPTH {
                return Err(ResolveError::Limit(format!(
                    "more than {MAX_DEPTH} nested directories"
                )));
            }
            let (cur, cur_id) = match stack.last() {
                Some(d) => (d.fd.as_fd(), (d.dev, d.ino)),
                None => (self.fd.as_fd(), (self.dev, self.ino)),
            };
            let io = |op, e: Errno| ResolveError::Io(op, show(&walked, &c), e.into());
            match open_dir_at(cur, &c) {
                Ok(fd) => {
                    stack.push(handle(fd).map_err(|e| io("stat", e))?);
                    walked.push(c);
                }
                Err(Errno::NOENT) if create_mode.is_some() => {
                    let mode = Mode::from_raw_mode(create_mode.unwrap_or(0o755));
                    match rustix::fs::mkdirat(cur, c.as_slice(), mode) {
                        Ok(()) => {
                            on_create(cur_id.0, cur_id.1, &c);
                        }
                        Err(Errno::EXIST) => {}
                        Err(e) => return Err(io("mkdir", e)),
                    }
                    let fd = open_dir_at(cur, &c).map_err(|e| io("open", e))?;
                    // The umask may have narrowed the mode.
                    rustix::fs::fchmod(&fd, mode).map_err(|e| io("chmod", e))?;
                    stack.push(handle(fd).map_err(|e| io("stat", e))?);
                    walked.push(c);
                }
                Err(Errno::NOENT) => return Err(ResolveError::Missing(show(&walked, &c))),
                Err(Errno::LOOP | Errno::NOTDIR) => {
                    let st = rustix::fs::statat(cur, c.as_slice(), AtFlags::SYMLINK_NOFOLLOW)
                        .map_err(|e| io("stat", e))?;
                    if FileType::from_raw_mode(st.st_mode) != FileType::Symlink {
                        return Err(ResolveError::NotDir(show(&walked, &c)));
                    }
                    links += 1;
                    if links > MAX_SYMLINKS {
                        return Err(ResolveError::Limit(format!(
                            "more than {MAX_SYMLINKS} symlinks at {}",
                            show(&walked, &c)
                        )));
                    }
                    let target = rustix::fs::readlinkat(cur, c.as_slice(), Vec::new())
                        .map_err(|e| io("readlink", e))?;
                    let target = target.as_bytes();
                    via = Some(format!(
                        "{} -> {}",
                        show(&walked, &c),
                        String::from_utf8_lossy(target)
                    ));
                    if target.starts_with(b"/") {
                        stack.clear();
                        walked.clear();
                    }
                    for part in target.split(|b| *b == b'/').rev() {
                        queue.push_front(part.to_vec());
                    }
                }
                Err(e) => return Err(io("open", e)),
            }
        }
        match stack.pop() {
            Some(h) => Ok(h),
            None => self
                .handle()
                .map_err(|e| ResolveError::Io("open", "/".into(), e.into())),
        }
    }
}

/// `lstat` of `name` in `dir`; `None` when it does not exist.
pub fn lstat_at(dir: BorrowedFd<'_>, name: &[u8]) -> Result<Option<rustix::fs::Stat>, Errno> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The names in directory `dir` (without `.` and `..`).
pub fn list_dir(dir: BorrowedFd<'_>) -> Result<Vec<Vec<u8>>, Errno> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    }
    Ok(names)
}

/// How many directories deep [`remove_tree_at`] goes before it gives up. A root file system
/// nests a few dozen levels; a tree this deep was made to be deep.
pub const REMOVE_DEPTH_CAP: usize = 1 << 16;

/// Why [`remove_tree_at`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum RemoveTreeError {
    /// A system call failed.
    #[error("{0}")]
    Io(#[from] Errno),
    /// The tree is deeper than [`REMOVE_DEPTH_CAP`].
    #[error("the tree is more than {cap} directories deep; nothing above that depth was removed")]
    TooDeep {
        /// The cap.
        cap: usize,
    },
    /// Back up from a directory, `..` was not the directory the walk came from (the
    /// directory was moved during the removal).
    #[error("a directory {depth} levels down was moved during the removal; stopped there")]
    Moved {
        /// How deep it was.
        depth: usize,
    },
}

impl From<RemoveTreeError> for std::io::Error {
    fn from(e: RemoveTreeError) -> Self {
        match e {
            RemoveTreeError::Io(errno) => errno.into(),
            other => std::io::Error::other(other.to_string()),
        }
    }
}

/// Removes `name` in `dir` and, if it is a directory, everything below it, never following a
/// symlink. A missing `name` is not an error.
///
/// The walk holds one directory open whatever the depth (a tree deeper than the process's
/// descriptor limit, made inside a machine, is removed too): it goes down by name and back up
/// through `..`, which must be the directory it came from (its device and inode, remembered on
/// the way down), and stops at [`REMOVE_DEPTH_CAP`] levels with an error that says so.
pub fn remove_tree_at(dir: BorrowedFd<'_>, name: &[u8]) -> Result<(), RemoveTreeError> {
    remove_tree_capped(dir, name, REMOVE_DEPTH_CAP)
}

fn remove_tree_capped(dir: BorrowedFd<'_>, name: &[u8], cap: usize) -> Result<(), RemoveTreeError> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => return Ok(()),
        Err(Errno::ISDIR | Errno::PERM) => {}
        Err(e) => return Err(e.into()),
    }
    let mut cur = match open_dir_at(dir, name) {
        Ok(fd) => handle(fd)?,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    // From `name` down to `cur`: each directory's name in its parent and its identity.
    let mut path: Vec<(Vec<u8>, (u64, u64))> = vec![(name.to_vec(), (cur.dev, cur.ino))];
    loop {
        let mut below = None;
        for child in list_dir(cur.fd.as_fd())? {
            match rustix::fs::unlinkat(&cur.fd, child.as_slice(), AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(Errno::ISDIR | Errno::PERM) => {
                    below = Some(child);
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(child) = below {
            if path.len() >= cap {
                return Err(RemoveTreeError::TooDeep { cap });
            }
            match open_dir_at(cur.fd.as_fd(), &child) {
                Ok(fd) => {
                    cur = handle(fd)?;
                    path.push((child, (cur.dev, cur.ino)));
                }
                // Gone meanwhile: the next listing shows what is left.
                Err(Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
            continue;
        }
        // `cur` is empty: remove it from its parent and go on there.
        let Some((done, _)) = path.pop() else {
            return Ok(());
        };
        let Some((_, parent_id)) = path.last() else {
            drop(cur);
            return match rustix::fs::unlinkat(dir, done.as_slice(), AtFlags::REMOVEDIR) {
                Ok(()) | Err(Errno::NOENT) => Ok(()),
                Err(e) => Err(e.into()),
            };
        };
        let parent = handle(rustix::fs::openat(&cur.fd, "..", DIR_FLAGS, Mode::empty())?)?;
        if (parent.dev, parent.ino) != *parent_id {
            return Err(RemoveTreeError::Moved {
                depth: path.len() + 1,
            });
        }
        cur = parent;
        match rustix::fs::unlinkat(&cur.fd, done.as_slice(), AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comps(p: &str) -> Vec<&[u8]> {
        p.split('/').map(str::as_bytes).collect()
    }

    fn resolve(root: &Root, p: &str, create: bool) -> Result<DirHandle, ResolveError> {
        root.resolve_dir(&comps(p), create, &mut |_, _, _| {})
    }

    #[test]
    fn resolution_stays_inside_and_follows_links_like_a_chroot() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path().join("root");
        std::fs::create_dir_all(r.join("usr/lib")).unwrap();
        std::os::unix::fs::symlink("usr/lib", r.join("lib")).unwrap();
        std::os::unix::fs::symlink("/usr", r.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../..", r.join("usr/up")).unwrap();
        std::os::unix::fs::symlink("/", r.join("slash")).unwrap();
        std::os::unix::fs::symlink("loop", r.join("loop")).unwrap();
        std::fs::write(r.join("file"), b"").unwrap();
        let root = Root::open(&r).unwrap();
        let ulib = std::fs::metadata(r.join("usr/lib")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(resolve(&root, "lib", false).unwrap().ino, ulib.ino());
        assert_eq!(resolve(&root, "abs/lib", false).unwrap().ino, ulib.ino());
        assert_eq!(
            resolve(&root, "slash/usr/lib", false).unwrap().ino,
            ulib.ino()
        );
        assert_eq!(resolve(&root, "slash", false).unwrap().ino, root.id().1);
        assert!(matches!(
            resolve(&root, "usr/up", false),
            Err(ResolveError::Escape(_))
        ));
        assert!(matches!(
            resolve(&root, "..", false),
            Err(ResolveError::Escape(_))
        ));
        assert!(matches!(
            resolve(&root, "loop", false),
            Err(ResolveError::Limit(_))
        ));
        assert!(matches!(
            resolve(&root, "file", false),
            Err(ResolveError::NotDir(_))
        ));
        assert!(matches!(
            resolve(&root, "nope/x", false),
            Err(ResolveError::Missing(_))
        ));
        let mut created = Vec::new();
        let h = root
            .resolve_dir(&comps("lib/new/deeper"), true, &mut |_, _, n| {
                created.push(String::from_utf8_lossy(n).to_string())
            })
            .unwrap();
        assert_eq!(created, ["new", "deeper"]);
        assert!(r.join("usr/lib/new/deeper").is_dir());
        assert_eq!(
            h.ino,
            std::fs::metadata(r.join("usr/lib/new/deeper"))
                .unwrap()
                .ino()
        );
        // Nothing appeared next to the root.
        let names: Vec<_> = std::fs::read_dir(t.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn remove_tree_does_not_follow_symlinks() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"x").unwrap();
        let r = t.path().join("root");
        std::fs::create_dir_all(r.join("d/e")).unwrap();
        std::os::unix::fs::symlink(&outside, r.join("d/link")).unwrap();
        std::os::unix::fs::symlink(&outside, r.join("d/e/link2")).unwrap();
        let root = Root::open(&r).unwrap();
        remove_tree_at(root.fd(), b"d").unwrap();
        assert!(!r.join("d").exists());
        assert!(outside.join("keep").exists());
        remove_tree_at(root.fd(), b"missing").unwrap();
    }

    /// Real: a tree far deeper than the descriptor limit this test sets for itself (64), with
    /// files, symlinks out of the tree and wide directories along the way, is removed with one
    /// directory open at a time; what the links point at stays.
    #[test]
    fn remove_tree_goes_deeper_than_the_descriptor_limit() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"x").unwrap();
        let r = t.path().join("root");
        std::fs::create_dir(&r).unwrap();
        let root = Root::open(&r).unwrap();
        // Build 3000 levels with *at calls (a path that long is past PATH_MAX).
        let mut cur = open_dir_at(root.fd(), b".").unwrap();
        for level in 0..3000 {
            rustix::fs::mkdirat(&cur, "d", Mode::from_raw_mode(0o755)).unwrap();
            if level % 500 == 0 {
                for i in 0..20 {
                    rustix::fs::mkdirat(&cur, format!("w{i}"), Mode::from_raw_mode(0o755)).unwrap();
                }
                let f = rustix::fs::openat(
                    &cur,
                    "f",
                    OFlags::CREATE | OFlags::WRONLY,
                    Mode::from_raw_mode(0o644),
                )
                .unwrap();
                drop(f);
                rustix::fs::symlinkat(outside.as_os_str(), &cur, "link").unwrap();
            }
            cur = open_dir_at(cur.as_fd(), b"d").unwrap();
        }
        drop(cur);
        // The test's own limit, far below the depth (restored after).
        let old = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: Some(64),
                maximum: old.maximum,
            },
        )
        .unwrap();
        let removed = remove_tree_at(root.fd(), b"d");
        rustix::process::setrlimit(rustix::process::Resource::Nofile, old).unwrap();
        removed.unwrap();
        assert!(!r.join("d").exists());
        assert!(outside.join("keep").exists());
        assert!(r.exists());
    }

    #[test]
    fn remove_tree_stops_at_its_depth_cap_and_says_so() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path().join("root");
        std::fs::create_dir_all(r.join("d/d/d/d/d")).unwrap();
        let root = Root::open(&r).unwrap();
        let e = remove_tree_capped(root.fd(), b"d", 3).unwrap_err();
        assert!(matches!(e, RemoveTreeError::TooDeep { cap: 3 }), "{e}");
        // Five levels fit a cap of five.
        remove_tree_capped(root.fd(), b"d", 5).unwrap();
        assert!(!r.join("d").exists());
    }

    #[test]
    fn remove_tree_errors_say_what_stopped_it() {
        let deep = RemoveTreeError::TooDeep {
            cap: REMOVE_DEPTH_CAP,
        };
        assert!(
            deep.to_string().contains("65536 directories deep"),
            "{deep}"
        );
        let io: std::io::Error = deep.into();
        assert!(io.to_string().contains("directories deep"));
        let io: std::io::Error = RemoveTreeError::Io(Errno::ACCESS).into();
        assert_eq!(io.raw_os_error(), Some(Errno::ACCESS.raw_os_error()));
        let moved = RemoveTreeError::Moved { depth: 3 };
        assert!(
            moved.to_string().contains("3 levels down was moved"),
            "{moved}"
        );
    }
}
