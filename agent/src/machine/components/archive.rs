//! Gzip tar archives: member-name checks, member selection and streaming installs.
//!
//! Every member's name is checked: absolute names, `..` components, backslashes, NUL bytes and
//! names that are not UTF-8 are refused (the whole archive is then refused, before anything
//! is installed). `./` and `.` components are dropped (`./bridge` is `bridge`). Only regular
//! files are taken; directories, links and devices are ignored. Archives are read twice: once
//! to check every name and choose the members, once to stream the chosen ones into place.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;

use super::error::Failure;
use super::spec::Members;
use flex_host::fs::{ConfinedFs, HostFs};

/// Mode of installed binaries.
pub(crate) const BINARY_MODE: u32 = 0o755;

/// Why an archive member's name is refused (the name shown lossily decoded).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MemberNameError {
    /// A NUL byte.
    #[error("member name {0:?} contains a NUL byte")]
    Nul(String),
    /// Not UTF-8.
    #[error("member name {0:?} is not UTF-8")]
    NotUtf8(String),
    /// A `\\` (a Windows separator: refused rather than guessed).
    #[error("member name {0:?} contains a backslash")]
    Backslash(String),
    /// Starts with `/`.
    #[error("member name {0:?} is absolute")]
    Absolute(String),
    /// A `..` component.
    #[error("member name {0:?} contains '..'")]
    DotDot(String),
}

/// A member name with `.` components dropped, or why it is refused; `Ok(None)` for names that
/// are only `.`/`/`-free dots (the archive's root directory entry).
pub(crate) fn clean_member_name(raw: &[u8]) -> Result<Option<String>, MemberNameError> {
    let shown = || String::from_utf8_lossy(raw).into_owned();
    if raw.contains(&0) {
        return Err(MemberNameError::Nul(shown()));
    }
    let name = std::str::from_utf8(raw).map_err(|_| MemberNameError::NotUtf8(shown()))?;
    if name.contains('\\') {
        return Err(MemberNameError::Backslash(shown()));
    }
    if name.starts_with('/') {
        return Err(MemberNameError::Absolute(shown()));
    }
    let mut parts = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(MemberNameError::DotDot(shown())),
            p => parts.push(p),
        }
    }
    Ok((!parts.is_empty()).then(|| parts.join("/")))
}

type GzArchive = tar::Archive<GzDecoder<BufReader<File>>>;
type GzEntry<'a> = tar::Entry<'a, GzDecoder<BufReader<File>>>;

fn open(path: &Path) -> std::io::Result<GzArchive> {
    Ok(tar::Archive::new(GzDecoder::new(BufReader::new(
        File::open(path)?,
    ))))
}

fn read_err(e: std::io::Error) -> Failure {
    Failure::Archive(format!("cannot read archive: {e}"))
}

/// Calls `f(clean_name, is_regular_file, entry)` for every member, after checking its name.
fn for_each_member(
    path: &Path,
    mut f: impl FnMut(Option<String>, bool, &mut GzEntry<'_>) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let mut archive = open(path).map_err(Failure::Io)?;
    for entry in archive.entries().map_err(read_err)? {
        let mut entry = entry.map_err(read_err)?;
        let name =
            clean_member_name(&entry.path_bytes()).map_err(|e| Failure::Archive(e.to_string()))?;
        let regular = entry.header().entry_type().is_file();
        f(name, regular, &mut entry)?;
    }
    Ok(())
}

/// Pass 1: checks every member name and returns the chosen regular members with their
/// destinations relative to the component's directory and their modes. A [`Members::Named`]
/// or [`Members::Map`] member that is absent, or a selection that matches nothing, is
/// [`Failure::MissingMember`].
pub(crate) fn select_members(
    path: &Path,
    members: &Members,
) -> Result<BTreeMap<String, (PathBuf, u32)>, Failure> {
    let mut chosen = BTreeMap::new();
    for_each_member(path, |name, regular, _| {
        let Some(name) = name.filter(|_| regular) else {
            return Ok(());
        };
        let dest = match members {
            Members::Named(n) => (name == *n).then(|| PathBuf::from(n)),
            Members::Under(prefix) => name
                .strip_prefix(prefix.as_str())
                .filter(|rest| !rest.is_empty())
                .map(PathBuf::from),
            Members::AllRegular => Some(PathBuf::from(&name)),
            Members::Map(map) => {
                if let Some((_, dest, mode)) = map.iter().find(|(m, _, _)| *m == name) {
                    chosen.insert(name, (dest.clone(), *mode));
                }
                return Ok(());
            }
        };
        if let Some(dest) = dest {
            chosen.insert(name, (dest, BINARY_MODE));
        }
        Ok(())
    })?;
    if let Members::Map(map) = members
        && let Some((m, _, _)) = map.iter().find(|(m, _, _)| !chosen.contains_key(m))
    {
        return Err(Failure::MissingMember(format!(
            "archive has no member {m:?}"
        )));
    }
    if chosen.is_empty() {
        return Err(Failure::MissingMember(match members {
            Members::Named(n) => format!("archive has no member {n:?}"),
            Members::Under(p) => format!("archive has no regular files under {p:?}"),
            Members::AllRegular | Members::Map(_) => "archive has no regular files".into(),
        }));
    }
    Ok(chosen)
}

/// Pass 2: streams the chosen members into `dest_dir` (relative to the rootfs `fs`, resolved
/// inside it), each atomically with its mode. Returns the rootfs-relative paths written.
pub(crate) fn install_members(
    path: &Path,
    chosen: &BTreeMap<String, (PathBuf, u32)>,
    fs: &ConfinedFs,
    dest_dir: &Path,
) -> Result<Vec<PathBuf>, InstallMemberError> {
    let mut written = Vec::new();
    let mut archive = open(path).map_err(|e| InstallMemberError::Read(Failure::Io(e)))?;
    let entries = archive
        .entries()
        .map_err(|e| InstallMemberError::Read(read_err(e)))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| InstallMemberError::Read(read_err(e)))?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = clean_member_name(&entry.path_bytes())
            .map_err(|e| InstallMemberError::Read(Failure::Archive(e.to_string())))?;
        let Some((rel, mode)) = name.and_then(|n| chosen.get(&n)) else {
            continue;
        };
        let dest = dest_dir.join(rel);
        if let Some(parent) = dest.parent() {
            fs.create_dir_all_mode(parent, BINARY_MODE)
                .map_err(|e| InstallMemberError::Write(Failure::Fs(e)))?;
        }
        fs.install(&dest, &mut entry, *mode)
            .map_err(|e| InstallMemberError::Write(Failure::Fs(e)))?;
        if !written.contains(&dest) {
            written.push(dest);
        }
    }
    Ok(written)
}

/// A pass-2 failure: reading the archive or writing into the rootfs.
#[derive(Debug)]
pub(crate) enum InstallMemberError {
    /// Reading (the `extract` step).
    Read(Failure),
    /// Writing (the `install` step).
    Write(Failure),
}

/// Every regular member's checked name (for indexing an offline bundle archive).
pub(crate) fn list_regular(path: &Path) -> Result<Vec<String>, Failure> {
    let mut names = Vec::new();
    for_each_member(path, |name, regular, _| {
        if let (Some(n), true) = (name, regular) {
            names.push(n);
        }
        Ok(())
    })?;
    Ok(names)
}

/// Extracts every regular member under `dest` (a scratch directory, through a [`HostFs`]
/// rooted there), after checking every name.
pub(crate) fn extract_all(path: &Path, dest: &Path) -> Result<Vec<String>, Failure> {
    let names = list_regular(path)?;
    let scratch = HostFs::new(dest);
    for_each_member(path, |name, regular, entry| {
        if let (Some(n), true) = (name, regular) {
            scratch.install(Path::new(&n), entry, 0o600)?;
        }
        Ok(())
    })?;
    Ok(names)
}
