//! Unpack tests on layers built in memory: overlay semantics (whiteouts, opaque directories,
//! replacements), metadata (modes, owners, mtimes, xattrs), compression, and every escape
//! attempt, each checked against a snapshot of everything around the root.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::*;
use flex_testkit::layer_builder::{LayerBuilder, gzip, zstd};

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn opts() -> UnpackOptions {
    UnpackOptions::default()
}

/// A root three levels inside a temporary directory (`<tmp>/l1/l2/root`), with a sentinel
/// directory beside it (`<tmp>/l1/l2/outside`): every `..` chain the tests use stays inside the
/// temporary directory, which is snapshotted whole.
struct Sandbox {
    outer: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Self {
        let outer = tempfile::tempdir().unwrap();
        let s = Self { outer };
        std::fs::create_dir_all(s.root()).unwrap();
        std::fs::create_dir_all(s.outside().join("etc")).unwrap();
        std::fs::write(s.outside().join("passwd"), b"sentinel").unwrap();
        s
    }

    fn base(&self) -> PathBuf {
        self.outer.path().join("l1/l2")
    }

    fn root(&self) -> PathBuf {
        self.base().join("root")
    }

    fn outside(&self) -> PathBuf {
        self.base().join("outside")
    }

    fn apply(&self, layers: &[Vec<u8>]) -> Result<Vec<LayerStats>, UnpackError> {
        layers
            .iter()
            .enumerate()
            .map(|(i, l)| unpack_layer(&self.root(), &format!("layer{i}"), &l[..], &opts()))
            .collect()
    }

    /// Everything in the temporary directory except the root's contents.
    fn surroundings(&self) -> BTreeMap<String, String> {
        let mut m = listing(self.outer.path());
        m.retain(|k, _| !k.starts_with("/l1/l2/root/"));
        m
    }

    fn tree(&self) -> BTreeMap<String, String> {
        listing(&self.root())
    }
}

/// `path -> "kind mode uid:gid detail"` for every entry under `root`.
fn listing(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let rel = format!("/{}", p.strip_prefix(root).unwrap().display());
            let m = std::fs::symlink_metadata(&p).unwrap();
            let ft = m.file_type();
            let mode = m.mode() & 0o7777;
            let own = format!("{}:{}", m.uid(), m.gid());
            let desc = if ft.is_symlink() {
                format!("l {own} -> {}", std::fs::read_link(&p).unwrap().display())
            } else if ft.is_dir() {
                format!("d {mode:04o} {own}")
            } else if ft.is_file() {
                let c = std::fs::read(&p).unwrap();
                format!("f {mode:04o} {own} {:?}", String::from_utf8_lossy(&c))
            } else if ft.is_fifo() {
                format!("p {mode:04o} {own}")
            } else if ft.is_char_device() {
                format!("c {mode:04o} {own} {}", m.rdev())
            } else {
                format!("? {mode:04o}")
            };
            out.insert(rel, desc);
            if ft.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn names(tree: &BTreeMap<String, String>) -> Vec<&str> {
    tree.keys().map(String::as_str).collect()
}

fn layer(f: impl FnOnce(&mut LayerBuilder) -> std::io::Result<()>) -> Vec<u8> {
    let mut b = LayerBuilder::new();
    f(&mut b).unwrap();
    b.finish().unwrap()
}

// ---- overlay semantics ----

#[test]
fn whiteouts_remove_lower_entries_only() {
    let s = Sandbox::new();
    let lower = layer(|b| {
        b.dir("etc", 0o755)?
            .file("etc/a", b"a", 0o644)?
            .file("etc/keep", b"k", 0o644)?
            .dir("etc/d", 0o755)?
            .file("etc/d/deep", b"x", 0o644)?
            .file("x", b"old", 0o644)?
            .file("y", b"old", 0o644)?;
        Ok(())
    });
    let upper = layer(|b| {
        b.whiteout("etc/a")?
            .whiteout("etc/d")?
            .whiteout("etc/never-existed")?
            .whiteout("nodir/x")?
            // Whiteout after this layer's own entry of the same name: the entry stays.
            .file("x", b"new", 0o644)?
            .whiteout("x")?
            // Whiteout before: the lower entry goes, this layer's stays.
            .whiteout("y")?
            .file("y", b"new", 0o644)?;
        Ok(())
    });
    let stats = s.apply(&[lower, upper]).unwrap();
    assert_eq!(stats[1].whiteouts, 6);
    let t = s.tree();
    assert_eq!(names(&t), ["/etc", "/etc/keep", "/x", "/y"], "{t:#?}");
    assert!(t["/x"].ends_with("\"new\""));
    assert!(t["/y"].ends_with("\"new\""));
}

fn opaque_case(upper: Vec<u8>) -> BTreeMap<String, String> {
    let s = Sandbox::new();
    let lower = layer(|b| {
        b.dir("d", 0o755)?
            .file("d/a", b"a", 0o644)?
            .dir("d/sub", 0o755)?
            .file("d/sub/lower", b"l", 0o644)?
            .file("other", b"o", 0o644)?;
        Ok(())
    });
    s.apply(&[lower, upper]).unwrap();
    s.tree()
}

#[test]
fn opaque_dirs_hide_lower_children_whatever_the_order() {
    let before = opaque_case(layer(|b| {
        b.dir("d", 0o755)?
            .opaque("d")?
            .file("d/new", b"n", 0o644)?
            .dir("d/sub", 0o755)?
            .file("d/sub/mine", b"m", 0o644)?;
        Ok(())
    }));
    let after = opaque_case(layer(|b| {
        b.dir("d", 0o755)?
            .file("d/new", b"n", 0o644)?
            .dir("d/sub", 0o755)?
            .file("d/sub/mine", b"m", 0o644)?
            .opaque("d")?;
        Ok(())
    }));
    assert_eq!(before, after);
    assert_eq!(
        names(&before),
        ["/d", "/d/new", "/d/sub", "/d/sub/mine", "/other"],
        "{before:#?}"
    );
    // Without a directory entry, the marker alone empties the directory.
    let alone = opaque_case(layer(|b| {
        b.opaque("d")?;
        Ok(())
    }));
    assert_eq!(names(&alone), ["/d", "/other"]);
}

#[test]
fn hard_links_share_inodes_and_keep_old_content_when_replaced() {
    let s = Sandbox::new();
    let l1 = layer(|b| {
        b.file("a", b"one", 0o640)?
            .hardlink("b", "a")?
            .hardlink("./c", "./a")?;
        Ok(())
    });
    s.apply(&[l1]).unwrap();
    let r = s.root();
    let ino = |p: &str| std::fs::metadata(r.join(p)).unwrap().ino();
    assert_eq!(ino("a"), ino("b"));
    assert_eq!(ino("a"), ino("c"));
    assert_eq!(std::fs::metadata(r.join("a")).unwrap().nlink(), 3);
    let l2 = layer(|b| {
        b.file("a", b"two", 0o644)?
            .hardlink("d", "b")?
            .dir("sub", 0o755)?
            .hardlink("sub/e", "a")?;
        Ok(())
    });
    s.apply(&[l2]).unwrap();
    assert_eq!(std::fs::read(r.join("a")).unwrap(), b"two");
    assert_eq!(std::fs::read(r.join("b")).unwrap(), b"one");
    assert_eq!(ino("b"), ino("d"));
    assert_eq!(ino("a"), ino("sub/e"));
    // A hard link to a symlink links the symlink itself.
    let l3 = layer(|b| {
        b.symlink("s", "/etc/passwd")?.hardlink("s2", "s")?;
        Ok(())
    });
    s.apply(&[l3]).unwrap();
    assert_eq!(
        std::fs::read_link(r.join("s2")).unwrap(),
        Path::new("/etc/passwd")
    );
    // Targets that do not exist or are directories are errors.
    let e = s
        .apply(&[layer(|b| {
            b.hardlink("z", "missing")?;
            Ok(())
        })])
        .unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    let e = s
        .apply(&[layer(|b| {
            b.hardlink("z", "sub")?;
            Ok(())
        })])
        .unwrap_err();
    assert!(e.to_string().contains("directory"), "{e}");
}

#[test]
fn symlinks_are_created_and_replaced_not_followed() {
    let s = Sandbox::new();
    let outside = s.outside();
    let l1 = layer(|b| {
        b.dir("usr/lib", 0o755)?
            .symlink("lib", "usr/lib")?
            .symlink("dangling", "/no/such")?
            .symlink("to-outside", outside.join("passwd").to_str().unwrap())?
            .symlink("dirlink", outside.to_str().unwrap())?;
        Ok(())
    });
    s.apply(&[l1]).unwrap();
    let before = s.surroundings();
    let l2 = layer(|b| {
        // Through a relative symlink to a directory inside: lands in usr/lib.
        b.file("lib/libc.so", b"elf", 0o755)?
            // The final component is a symlink: it is replaced, the target untouched.
            .file("to-outside", b"pwned", 0o644)?
            // A directory entry over a symlink to a directory replaces the symlink.
            .dir("dirlink", 0o755)?
            .file("dirlink/x", b"inside", 0o644)?;
        Ok(())
    });
    s.apply(&[l2]).unwrap();
    let t = s.tree();
    assert!(t["/usr/lib/libc.so"].starts_with("f 0755"), "{t:#?}");
    assert!(t["/to-outside"].starts_with("f 0644"));
    assert!(t["/dirlink"].starts_with("d 0755"));
    assert_eq!(t["/dangling"], format!("l {} -> /no/such", own0()));
    assert_eq!(std::fs::read(outside.join("passwd")).unwrap(), b"sentinel");
    assert_eq!(s.surroundings(), before);
}

fn own0() -> String {
    if is_root() {
        "0:0".into()
    } else {
        format!(
            "{}:{}",
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw()
        )
    }
}

#[test]
fn type_changes_replace_entries() {
    let s = Sandbox::new();
    let l1 = layer(|b| {
        b.file("f2d", b"file", 0o644)?
            .dir("d2f", 0o755)?
            .dir("d2f/sub", 0o755)?
            .file("d2f/sub/x", b"x", 0o644)?
            .dir("d2l", 0o755)?
            .file("d2l/y", b"y", 0o644)?
            .symlink("l2f", "f2d")?;
        Ok(())
    });
    let l2 = layer(|b| {
        b.dir("f2d", 0o750)?
            .file("f2d/inside", b"i", 0o600)?
            .file("d2f", b"now a file", 0o644)?
            .symlink("d2l", "f2d")?
            .file("l2f", b"plain", 0o644)?;
        Ok(())
    });
    s.apply(&[l1, l2]).unwrap();
    let t = s.tree();
    let o = own0();
    assert_eq!(t["/f2d"], format!("d 0750 {o}"));
    assert_eq!(t["/f2d/inside"], format!("f 0600 {o} \"i\""));
    assert_eq!(t["/d2f"], format!("f 0644 {o} \"now a file\""));
    assert_eq!(t["/d2l"], format!("l {o} -> f2d"));
    assert_eq!(t["/l2f"], format!("f 0644 {o} \"plain\""));
    assert_eq!(t.len(), 5, "{t:#?}");
}

#[test]
fn modes_mtimes_and_the_root_entry() {
    let s = Sandbox::new();
    let l = layer(|b| {
        b.mtime(1_234_567_890)
            .dir("./", 0o755)?
            .file("usr/bin/su", b"su", 0o4755)?
            .file("usr/bin/wall", b"w", 0o2755)?
            .dir("tmp", 0o1777)?
            .dir("ro", 0o500)?
            .file("ro/file", b"r", 0o444)?
            .mtime(1_000_000_000)
            .symlink("link", "ro/file")?;
        Ok(())
    });
    s.apply(&[l]).unwrap();
    let r = s.root();
    let meta = |p: &str| std::fs::symlink_metadata(r.join(p)).unwrap();
    assert_eq!(meta("usr/bin/su").mode() & 0o7777, 0o4755);
    assert_eq!(meta("usr/bin/wall").mode() & 0o7777, 0o2755);
    assert_eq!(meta("tmp").mode() & 0o7777, 0o1777);
    assert_eq!(meta("ro").mode() & 0o7777, 0o500);
    assert_eq!(meta("ro/file").mode() & 0o7777, 0o444);
    // Implied parents get 0755.
    assert_eq!(meta("usr").mode() & 0o7777, 0o755);
    assert_eq!(meta("usr/bin").mode() & 0o7777, 0o755);
    // Directory mtimes survive their children being created.
    assert_eq!(meta("ro").mtime(), 1_234_567_890);
    assert_eq!(meta("tmp").mtime(), 1_234_567_890);
    assert_eq!(meta("ro/file").mtime(), 1_234_567_890);
    assert_eq!(meta("link").mtime(), 1_000_000_000);
    // The root entry's metadata applies to the root.
    assert_eq!(meta("").mode() & 0o7777, 0o755);
    assert_eq!(meta("").mtime(), 1_234_567_890);
}

#[test]
fn pax_mtime_with_fraction_and_long_names() {
    let s = Sandbox::new();
    let long = format!("{}/file", "d".repeat(150));
    let mut b = LayerBuilder::new();
    let h = b.header(tar::EntryType::Regular, 1, 0o644);
    b.entry(h, b"precise", None, &[("mtime", b"1700000000.25")], b"p")
        .unwrap();
    b.file(&long, b"long", 0o644).unwrap();
    b.symlink("longlink", &long).unwrap();
    s.apply(&[b.finish().unwrap()]).unwrap();
    let m = std::fs::metadata(s.root().join("precise")).unwrap();
    assert_eq!((m.mtime(), m.mtime_nsec()), (1_700_000_000, 250_000_000));
    assert_eq!(std::fs::read(s.root().join(&long)).unwrap(), b"long");
    assert_eq!(
        std::fs::read_link(s.root().join("longlink")).unwrap(),
        Path::new(&long)
    );
}

#[test]
fn ownership_is_applied_when_root() {
    if !is_root() {
        eprintln!("skipped: chown to other users needs root");
        return;
    }
    let s = Sandbox::new();
    let l = layer(|b| {
        b.owner(1000, 1000)
            .dir("home/user", 0o700)?
            .file("home/user/suid", b"s", 0o4755)?
            .owner(1001, 1002)
            .symlink("home/user/link", "suid")?
            .fifo("home/user/fifo", 0o640)?;
        Ok(())
    });
    s.apply(&[l]).unwrap();
    let t = s.tree();
    assert_eq!(t["/home"], "d 0755 0:0");
    assert_eq!(t["/home/user"], "d 0700 1000:1000");
    // chown happens before chmod, so setuid survives.
    assert_eq!(t["/home/user/suid"], "f 4755 1000:1000 \"s\"");
    assert_eq!(t["/home/user/link"], "l 1001:1002 -> suid");
    assert_eq!(t["/home/user/fifo"], "p 0640 1001:1002");
}

#[test]
fn devices_are_created_or_skipped_with_a_warning() {
    let s = Sandbox::new();
    let l = layer(|b| {
        b.char_device("dev/null", 1, 3, 0o666)?
            .fifo("run/fifo", 0o600)?;
        Ok(())
    });
    let stats = s.apply(&[l]).unwrap();
    let m = std::fs::symlink_metadata(s.root().join("run/fifo")).unwrap();
    assert!(m.file_type().is_fifo());
    assert_eq!(m.mode() & 0o7777, 0o600);
    match std::fs::symlink_metadata(s.root().join("dev/null")) {
        Ok(m) => {
            assert!(m.file_type().is_char_device());
            assert_eq!(m.rdev(), rustix::fs::makedev(1, 3));
            assert_eq!(m.mode() & 0o7777, 0o666);
            assert_eq!(stats[0].warning_count, 0);
        }
        Err(_) => {
            eprintln!("mknod not permitted here: {:?}", stats[0].warnings);
            assert_eq!(stats[0].warning_count, 1);
            assert!(stats[0].warnings[0].contains("not permitted"));
        }
    }
}

#[test]
fn xattrs_from_pax_records() {
    let s = Sandbox::new();
    let l = layer(|b| {
        b.file_with_xattrs(
            "f",
            b"x",
            0o644,
            &[
                ("user.flex", b"value"),
                ("security.selinux", b"system_u:object_r:bogus_t:s0"),
            ],
        )?;
        Ok(())
    });
    let stats = s.apply(&[l]).unwrap();
    let p = s.root().join("f");
    let mut buf = [0u8; 64];
    match rustix::fs::lgetxattr(&p, "user.flex", &mut buf[..]) {
        Ok(n) => assert_eq!(&buf[..n], b"value"),
        Err(e) => {
            eprintln!(
                "skipped: the file system refuses user xattrs ({e}); warnings: {:?}",
                stats[0].warnings
            );
            assert!(stats[0].warning_count >= 1);
            return;
        }
    }
    // security.selinux is skipped by policy: either absent or the host's own label.
    let mut lbl = vec![0u8; 256];
    if let Ok(n) = rustix::fs::lgetxattr(&p, "security.selinux", &mut lbl[..]) {
        assert!(!lbl[..n].starts_with(b"system_u:object_r:bogus_t"));
    }
}

#[test]
fn gzip_zstd_and_plain_layers_give_the_same_tree() {
    let base = layer(|b| {
        b.dir("etc", 0o755)?
            .file("etc/os-release", b"ID=test\n", 0o644)?
            .file("big", &vec![7u8; 3 << 20], 0o600)?
            .symlink("etc/link", "os-release")?;
        Ok(())
    });
    let mut trees = Vec::new();
    for blob in [base.clone(), gzip(&base).unwrap(), zstd(&base).unwrap()] {
        let s = Sandbox::new();
        let stats = s.apply(std::slice::from_ref(&blob)).unwrap();
        assert_eq!(stats[0].diff_id, Some(Digest::of(&base)));
        assert_eq!(stats[0].compressed_bytes, blob.len() as u64);
        assert_eq!(stats[0].tar_bytes, base.len() as u64);
        trees.push(s.tree());
    }
    assert_eq!(trees[0], trees[1]);
    assert_eq!(trees[0], trees[2]);
}

#[test]
fn unpack_checks_diff_ids() {
    let t = tempfile::tempdir().unwrap();
    let tar = layer(|b| {
        b.file("a", b"a", 0o644)?;
        Ok(())
    });
    let blob = t.path().join("blob");
    std::fs::write(&blob, gzip(&tar).unwrap()).unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let lf = |diff_id| LayerFile {
        path: blob.clone(),
        media_type: crate::manifest::media_type::OCI_LAYER_GZIP.into(),
        name: "sha256:layer".into(),
        diff_id,
    };
    unpack(&root, &[lf(Some(Digest::of(&tar)))], &opts()).unwrap();
    let e = unpack(&root, &[lf(Some(Digest::of(b"other")))], &opts()).unwrap_err();
    assert!(matches!(e, UnpackError::DiffId { .. }), "{e}");
    assert!(e.to_string().contains("sha256:layer"), "{e}");
}

#[test]
fn garbage_is_a_read_error_naming_the_layer() {
    let s = Sandbox::new();
    let mut junk = gzip(&[1u8; 4096]).unwrap();
    junk.truncate(20);
    let e = unpack_layer(&s.root(), "sha256:junk", &junk[..], &opts()).unwrap_err();
    assert!(matches!(e, UnpackError::Read { .. }), "{e}");
    assert!(e.to_string().contains("sha256:junk"));
}

// ---- escapes ----

/// Applies `lower` then `evil` and checks the unpack fails as unsafe (naming `entry`) and that
/// nothing around the root changed.
fn refused(lower: Option<Vec<u8>>, evil: Vec<u8>, entry: &str) -> Sandbox {
    let s = Sandbox::new();
    if let Some(l) = lower {
        s.apply(&[l]).unwrap();
    }
    let before = s.surroundings();
    let host_passwd = std::fs::read("/etc/passwd").ok();
    let e = unpack_layer(&s.root(), "sha256:evil", &evil[..], &opts()).unwrap_err();
    assert!(matches!(e, UnpackError::Unsafe { .. }), "{entry}: {e}");
    let msg = e.to_string();
    assert!(msg.contains("sha256:evil") && msg.contains(entry), "{msg}");
    assert_eq!(
        s.surroundings(),
        before,
        "{entry}: something changed outside the root"
    );
    assert_eq!(std::fs::read("/etc/passwd").ok(), host_passwd);
    assert_eq!(
        std::fs::read(s.outside().join("passwd")).unwrap(),
        b"sentinel"
    );
    s
}

#[test]
fn escaping_names_are_refused() {
    for name in [
        "../x",
        "/abs",
        "a/../../x",
        "a/../b",
        "./../outside/passwd",
        "../outside/etc/x",
    ] {
        let evil = layer(|b| {
            b.file("ok", b"fine", 0o644)?
                .raw_file(name.as_bytes(), b"pwned")?;
            Ok(())
        });
        refused(None, evil, name);
    }
}

#[test]
fn escapes_through_symlinks_are_refused() {
    // evil -> ../../.. relative: climbs above the root.
    let lower = layer(|b| {
        b.symlink("evil", "../../..")?
            .dir("a/b", 0o755)?
            .symlink("a/b/up", "../../../outside")?;
        Ok(())
    });
    for name in ["evil/etc/passwd", "a/b/up/passwd", "evil/x"] {
        let evil = layer(|b| {
            b.raw_file(name.as_bytes(), b"pwned")?;
            Ok(())
        });
        refused(Some(lower.clone()), evil, name);
    }
    // The symlink and the write in the same layer.
    let same = layer(|b| {
        b.symlink("evil", "../outside")?
            .raw_file(b"evil/passwd", b"pwned")?;
        Ok(())
    });
    refused(None, same, "evil/passwd");
}

#[test]
fn absolute_symlinks_resolve_inside_the_root_like_a_chroot() {
    let s = Sandbox::new();
    let outside = s.outside();
    let lower = layer(|b| {
        b.symlink("evil", "/")?
            .symlink("host", outside.to_str().unwrap())?;
        Ok(())
    });
    s.apply(&[lower]).unwrap();
    let before = s.surroundings();
    let upper = layer(|b| {
        b.raw_file(b"evil/etc/passwd", b"root-relative")?
            .raw_file(b"host/passwd", b"also inside")?;
        Ok(())
    });
    s.apply(&[upper]).unwrap();
    assert_eq!(s.surroundings(), before);
    assert_eq!(
        std::fs::read(s.root().join("etc/passwd")).unwrap(),
        b"root-relative"
    );
    let inside = s
        .root()
        .join(outside.strip_prefix("/").unwrap())
        .join("passwd");
    assert_eq!(std::fs::read(inside).unwrap(), b"also inside");
}

#[test]
fn escaping_hard_links_are_refused() {
    for target in [
        "../../etc/passwd",
        "/etc/passwd",
        "../outside/passwd",
        "a/../../x",
    ] {
        let evil = layer(|b| {
            let h = b.header(tar::EntryType::Link, 0, 0o644);
            b.entry(h, b"link", Some(target.as_bytes()), &[], &[])?;
            Ok(())
        });
        let s = refused(None, evil, "link");
        assert!(!s.root().join("link").exists());
    }
    // Through a symlink climbing out of the root.
    let lower = layer(|b| {
        b.symlink("up", "../outside")?;
        Ok(())
    });
    let evil = layer(|b| {
        b.hardlink("link", "up/passwd")?;
        Ok(())
    });
    refused(Some(lower), evil, "link");
    // Through an absolute symlink: resolved in the root, where the target does not exist.
    let s = Sandbox::new();
    let outside = s.outside();
    let l = layer(|b| {
        b.symlink("host", outside.to_str().unwrap())?
            .hardlink("link", "host/passwd")?;
        Ok(())
    });
    let before = s.surroundings();
    let e = s.apply(&[l]).unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    assert_eq!(s.surroundings(), before);
    assert_eq!(
        std::fs::metadata(outside.join("passwd")).unwrap().nlink(),
        1
    );
}

#[test]
fn whiteouts_cannot_escape() {
    let lower = layer(|b| {
        b.symlink("up", "../outside")?;
        Ok(())
    });
    let evil = layer(|b| {
        b.whiteout("up/passwd")?;
        Ok(())
    });
    refused(Some(lower.clone()), evil, "up/.wh.passwd");
    let evil = layer(|b| {
        b.opaque("up")?;
        Ok(())
    });
    refused(Some(lower), evil, "up/.wh..wh..opq");
    let evil = layer(|b| {
        b.raw_file(b"../.wh.outside", b"")?;
        Ok(())
    });
    refused(None, evil, "../.wh.outside");
}

#[test]
fn the_root_cannot_be_replaced() {
    let evil = layer(|b| {
        b.raw_file(b"./", b"")?;
        Ok(())
    });
    refused(None, evil, "./");
}

#[test]
fn later_directory_entries_win() {
    let s = Sandbox::new();
    let l = layer(|b| {
        b.mtime(100)
            .dir("twice", 0o700)?
            .mtime(200)
            .dir("twice", 0o751)?
            .dir("swapped", 0o700)?
            .file("swapped", b"f", 0o644)?
            .mtime(300)
            .dir("swapped", 0o755)?
            .file("swapped/child", b"c", 0o644)?;
        Ok(())
    });
    s.apply(&[l]).unwrap();
    let m = |p: &str| std::fs::metadata(s.root().join(p)).unwrap();
    assert_eq!(
        (m("twice").mode() & 0o7777, m("twice").mtime()),
        (0o751, 200)
    );
    assert_eq!(
        (m("swapped").mode() & 0o7777, m("swapped").mtime()),
        (0o755, 300)
    );
}

/// Everything about each entry under `root`: kind, mode, owner, mtime, links, content, target,
/// `user.*` xattr.
fn full_listing(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for (path, desc) in listing(root) {
        let p = root.join(path.trim_start_matches('/'));
        let m = std::fs::symlink_metadata(&p).unwrap();
        let mut buf = [0u8; 256];
        let xattr = match rustix::fs::lgetxattr(&p, "user.flex", &mut buf[..]) {
            Ok(n) => String::from_utf8_lossy(&buf[..n]).to_string(),
            Err(_) => String::new(),
        };
        let mtime = m.mtime();
        out.push(format!(
            "{path} {desc} mtime={mtime} nlink={} xattr={xattr}",
            m.nlink()
        ));
    }
    out
}

#[tokio::test]
async fn gnu_tar_archives_unpack_like_gnu_tar() {
    use flex_host::runner::{Cmd, ProcessRunner, Runner};
    let r = ProcessRunner::new();
    if r.which("tar").is_none() {
        eprintln!("skipped: no tar");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let deep = format!("{}/{}", "long-directory-name-".repeat(6), "x".repeat(120));
    std::fs::create_dir_all(src.join(&deep)).unwrap();
    std::fs::write(src.join(&deep).join("file"), b"deep").unwrap();
    std::fs::create_dir_all(src.join("etc/ssl")).unwrap();
    std::fs::write(src.join("etc/ssl/cert.pem"), b"cert").unwrap();
    std::fs::hard_link(src.join("etc/ssl/cert.pem"), src.join("etc/ssl/hash.0")).unwrap();
    std::os::unix::fs::symlink("ssl/cert.pem", src.join("etc/cert")).unwrap();
    std::os::unix::fs::symlink(&deep, src.join("to-deep")).unwrap();
    std::fs::write(src.join("suid"), b"s").unwrap();
    std::fs::set_permissions(src.join("suid"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::fs::create_dir(src.join("sticky")).unwrap();
    std::fs::set_permissions(src.join("sticky"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    // A sparse file: 4 MiB with data at both ends.
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::File::create(src.join("sparse")).unwrap();
        f.write_all(b"head").unwrap();
        f.seek(SeekFrom::Start(4 << 20)).unwrap();
        f.write_all(b"tail").unwrap();
    }
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        src.join("fifo"),
        rustix::fs::Mode::from_raw_mode(0o640),
    )
    .unwrap();
    let has_xattr = rustix::fs::setxattr(
        src.join("etc/ssl/cert.pem"),
        "user.flex",
        b"x1",
        rustix::fs::XattrFlags::empty(),
    )
    .is_ok();
    if is_root() {
        rustix::fs::chown(
            src.join("suid"),
            Some(rustix::fs::Uid::from_raw(1000)),
            Some(rustix::fs::Gid::from_raw(1000)),
        )
        .unwrap();
        std::fs::set_permissions(src.join("suid"), std::fs::Permissions::from_mode(0o4755))
            .unwrap();
    }
    let s = |p: &Path| p.display().to_string();
    for (name, flags) in [
        ("gnu", vec!["--format=gnu", "-S"]),
        ("pax", vec!["--format=pax", "--xattrs"]),
    ] {
        let archive = t.path().join(format!("{name}.tar"));
        let mut c = Cmd::new("tar").args(flags.iter().copied());
        c = c.args(["-cpf", &s(&archive), "-C", &s(&src), "."]);
        r.run(&c).await.unwrap();
        let theirs = t.path().join(format!("{name}-tar"));
        let ours = t.path().join(format!("{name}-ours"));
        std::fs::create_dir(&theirs).unwrap();
        std::fs::create_dir(&ours).unwrap();
        r.run(&Cmd::new("tar").args([
            "--xattrs",
            "--xattrs-include=user.*",
            "-xpf",
            &s(&archive),
            "-C",
            &s(&theirs),
        ]))
        .await
        .unwrap();
        let blob = std::fs::read(&archive).unwrap();
        unpack_layer(&ours, name, &blob[..], &opts()).unwrap();
        let (a, b) = (full_listing(&theirs), full_listing(&ours));
        assert_eq!(a, b, "{name}: GNU tar vs ours");
        assert!(a.len() >= 12, "{a:#?}");
        if name == "pax" && has_xattr {
            assert!(b.iter().any(|l| l.ends_with("xattr=x1")), "{b:#?}");
        }
        assert_eq!(
            std::fs::read(ours.join("sparse")).unwrap().len(),
            (4 << 20) + 4
        );
    }
}
