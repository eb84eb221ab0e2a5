//! The layer unpacker (`flex_oci::unpack_layer`) with an oracle that nothing lands outside the
//! root. Each run makes a fresh parent directory holding the root, an empty sentinel directory
//! and a sentinel file beside it, applies the input's layers onto the root (stopping at the
//! first error, which is allowed), then checks that the parent still holds exactly those three,
//! the sentinel directory is empty, the sentinel file has its content, mode and single link
//! (nothing wrote through a link to it or hard-linked it into the tree), no file in the tree is
//! the sentinel file, and the root is still the same directory.
//!
//! The input's first byte picks the form: even, the rest is one raw layer (tar, gzip or zstd);
//! odd, the rest is read by `arbitrary` as up to four layers of tar entries built here with
//! hostile names and link targets (`..`, absolute paths to the sentinels, whiteouts, long GNU
//! names), so the fuzzer spends its time on the unpacker rather than on tar checksums.

#![no_main]

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use arbitrary::{Arbitrary, Unstructured};
use flex_oci::unpack::{UnpackOptions, unpack_layer};
use libfuzzer_sys::fuzz_target;

const SENTINEL_DIR: &str = "sentinel";
const SENTINEL_FILE: &str = "outside";
const SENTINEL_CONTENT: &[u8] = b"outside the root\n";

/// A path component; the absolute ones are filled in with the run's real paths.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Piece {
    A,
    B,
    C,
    Dot,
    DotDot,
    Empty,
    /// The sentinel directory's name (a sibling of the root).
    SentinelDir,
    /// The sentinel file's name (a sibling of the root).
    SentinelFile,
    /// The parent directory's absolute path.
    AbsParent,
    /// The root's absolute path.
    AbsRoot,
    /// `/`.
    Slash,
    /// `.wh.a`.
    WhiteoutA,
    /// `.wh..wh..opq`.
    Opaque,
    /// A 120-byte name (forces GNU long names).
    Long,
    Raw(u8),
}

#[derive(Arbitrary, Debug)]
enum Kind {
    File,
    Dir,
    Symlink,
    Hardlink,
    Fifo,
    /// Always 1:3 (the null device): the fuzzer must not make nodes of real disks.
    NullDevice,
}

#[derive(Arbitrary, Debug)]
struct Entry {
    kind: Kind,
    path: Vec<Piece>,
    link: Vec<Piece>,
    data: Vec<u8>,
    mode: u16,
    uid: u8,
    xattr: Option<(u8, Vec<u8>)>,
}

#[derive(Arbitrary, Debug)]
struct Layers(Vec<Vec<Entry>>);

struct Paths {
    parent: String,
    root: String,
}

fn join(pieces: &[Piece], p: &Paths) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, piece) in pieces.iter().take(12).enumerate() {
        if i > 0 {
            out.push(b'/');
        }
        let s: Vec<u8> = match piece {
            Piece::A => b"a".to_vec(),
            Piece::B => b"b".to_vec(),
            Piece::C => b"c".to_vec(),
            Piece::Dot => b".".to_vec(),
            Piece::DotDot => b"..".to_vec(),
            Piece::Empty => Vec::new(),
            Piece::SentinelDir => SENTINEL_DIR.into(),
            Piece::SentinelFile => SENTINEL_FILE.into(),
            Piece::AbsParent => p.parent.as_bytes().to_vec(),
            Piece::AbsRoot => p.root.as_bytes().to_vec(),
            Piece::Slash => b"/".to_vec(),
            Piece::WhiteoutA => b".wh.a".to_vec(),
            Piece::Opaque => b".wh..wh..opq".to_vec(),
            Piece::Long => vec![b'l'; 120],
            Piece::Raw(b) => vec![*b],
        };
        out.extend_from_slice(&s);
    }
    out
}

/// One header with `name` (and `link`) written raw, GNU long-name records first when they do
/// not fit, so `..` and absolute names reach the unpacker as they are.
fn append(
    b: &mut tar::Builder<Vec<u8>>,
    kind: tar::EntryType,
    name: &[u8],
    link: &[u8],
    e: &Entry,
) {
    let long = |b: &mut tar::Builder<Vec<u8>>, t: tar::EntryType, v: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
        h.set_entry_type(t);
        h.set_mode(0o644);
        let mut data = v.to_vec();
        data.push(0);
        h.set_size(data.len() as u64);
        h.set_cksum();
        let _ = b.append(&h, data.as_slice());
    };
    if name.len() > 100 {
        long(b, tar::EntryType::GNULongName, name);
    }
    if link.len() > 100 {
        long(b, tar::EntryType::GNULongLink, link);
    }
    if let Some((n, v)) = &e.xattr {
        let key = match n % 3 {
            0 => "user.fuzz",
            1 => "security.selinux",
            _ => "trusted.overlay.opaque",
        };
        let mut pax = tar::Builder::new(Vec::new());
        let _ = pax.append_pax_extensions([(format!("SCHILY.xattr.{key}").as_str(), v.as_slice())]);
        if let Ok(bytes) = pax.into_inner() {
            // The PAX record without the end-of-archive blocks.
            let cut = bytes.len().saturating_sub(1024);
            b.get_mut().extend_from_slice(&bytes[..cut]);
        }
    }
    let mut h = tar::Header::new_gnu();
    let n = name.len().min(100);
    h.as_old_mut().name[..n].copy_from_slice(&name[..n]);
    let l = link.len().min(100);
    h.as_old_mut().linkname[..l].copy_from_slice(&link[..l]);
    h.set_entry_type(kind);
    h.set_mode(u32::from(e.mode) & 0o7777);
    h.set_uid(u64::from(e.uid));
    h.set_gid(u64::from(e.uid));
    h.set_mtime(1_700_000_000);
    let data: &[u8] = if kind == tar::EntryType::Regular {
        &e.data[..e.data.len().min(64)]
    } else {
        &[]
    };
    if kind == tar::EntryType::Char {
        let _ = h.set_device_major(1);
        let _ = h.set_device_minor(3);
    }
    h.set_size(data.len() as u64);
    h.set_cksum();
    let _ = b.append(&h, data);
}

fn build(entries: &[Entry], p: &Paths) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries.iter().take(24) {
        let name = join(&e.path, p);
        let link = join(&e.link, p);
        let kind = match e.kind {
            Kind::File => tar::EntryType::Regular,
            Kind::Dir => tar::EntryType::Directory,
            Kind::Symlink => tar::EntryType::Symlink,
            Kind::Hardlink => tar::EntryType::Link,
            Kind::Fifo => tar::EntryType::Fifo,
            Kind::NullDevice => tar::EntryType::Char,
        };
        append(&mut b, kind, &name, &link, e);
    }
    b.into_inner().unwrap_or_default()
}

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

/// Every regular file under `dir`, without following links: none may be `forbidden`.
fn walk(dir: &Path, forbidden: (u64, u64), depth: usize) {
    if depth > 64 {
        return;
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let path = e.path();
        let Ok(md) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        assert_ne!(
            (md.dev(), md.ino()),
            forbidden,
            "{} is the sentinel file (hard-linked from outside the root)",
            path.display()
        );
        if md.is_dir() {
            walk(&path, forbidden, depth + 1);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((mode, rest)) = data.split_first() else {
        return;
    };
    // On tmpfs when there is one: thousands of trees a second are made and removed.
    let shm = Path::new("/dev/shm");
    let parent = if shm.is_dir() {
        tempfile::Builder::new()
            .prefix("fuzz-unpack")
            .tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .expect("tempdir");
    let root = parent.path().join("root");
    std::fs::create_dir(&root).expect("root");
    std::fs::create_dir(parent.path().join(SENTINEL_DIR)).expect("sentinel dir");
    let sentinel_file = parent.path().join(SENTINEL_FILE);
    std::fs::write(&sentinel_file, SENTINEL_CONTENT).expect("sentinel file");
    let before = std::fs::symlink_metadata(&sentinel_file).expect("stat");
    let root_before = std::fs::symlink_metadata(&root).expect("stat root");
    let paths = Paths {
        parent: parent.path().to_string_lossy().into_owned(),
        root: root.to_string_lossy().into_owned(),
    };
    let layers: Vec<Vec<u8>> = if mode % 2 == 0 {
        vec![rest.to_vec()]
    } else {
        let Ok(Layers(layers)) = Layers::arbitrary_take_rest(Unstructured::new(rest)) else {
            return;
        };
        layers.iter().take(4).map(|l| build(l, &paths)).collect()
    };
    let opts = UnpackOptions::default();
    for (i, layer) in layers.iter().enumerate() {
        if unpack_layer(&root, &format!("layer{i}"), layer.as_slice(), &opts).is_err() {
            break;
        }
    }

    let expected: BTreeSet<String> = ["root", SENTINEL_DIR, SENTINEL_FILE]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(
        names(parent.path()),
        expected,
        "something landed beside the root"
    );
    assert!(
        names(&parent.path().join(SENTINEL_DIR)).is_empty(),
        "something landed in the sentinel directory"
    );
    let after = std::fs::symlink_metadata(&sentinel_file).expect("stat");
    assert!(after.is_file(), "the sentinel file was replaced");
    assert_eq!(
        std::fs::read(&sentinel_file).expect("read"),
        SENTINEL_CONTENT,
        "written through"
    );
    assert_eq!(after.mode(), before.mode(), "sentinel file mode changed");
    assert_eq!(
        (after.uid(), after.gid()),
        (before.uid(), before.gid()),
        "sentinel chowned"
    );
    assert_eq!(after.nlink(), 1, "the sentinel file was hard-linked");
    let root_after = std::fs::symlink_metadata(&root).expect("stat root");
    assert!(root_after.is_dir(), "the root was replaced");
    assert_eq!(root_after.ino(), root_before.ino(), "the root was replaced");
    walk(&root, (before.dev(), before.ino()), 0);
    // The tree is removable (a fuzzer left running must not fill the disk).
    drop(parent);
});
