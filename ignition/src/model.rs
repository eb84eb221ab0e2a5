//! The host-config model: files, directories, links, systemd units and users, independent of
//! Butane's YAML and Ignition's JSON spellings, plus the checks Ignition's validator applies to
//! a single entry ([`File::check`] and friends).
//!
//! File contents are kept as bytes; they become data URLs only when rendered, so two configs
//! that write the same bytes compare equal whatever encoding Butane would pick.

use std::fmt;

/// The largest mode Ignition accepts (`07777`; the special bits only draw a warning).
pub const MAX_MODE: u32 = 0o7777;

/// The owner of a file, directory or link: a numeric id or a name resolved on the host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A numeric uid or gid.
    Id(u32),
    /// A user or group name.
    Name(String),
}

/// A compression scheme Ignition can undo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compression {
    /// gzip (`"compression": "gzip"`).
    Gzip,
}

impl Compression {
    /// The Ignition spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
        }
    }
}

/// The contents of a file.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Contents {
    /// Bytes embedded in the config as a data URL (Butane's `inline` and `local`).
    Data {
        /// The bytes to write, as they are stored in the URL.
        data: Vec<u8>,
        /// `Some` when `data` is already compressed (Butane's explicit `compression: gzip`):
        /// written as-is with that compression. `None`: Butane's automatic choice, gzip when
        /// that makes the URL shorter.
        compression: Option<Compression>,
    },
    /// A URL Ignition fetches (Butane's `source`): `http`, `https`, `tftp`, `s3`, `gs` or
    /// `data`.
    Remote {
        /// The URL.
        source: String,
        /// The compression of the fetched data.
        compression: Option<Compression>,
        /// `sha512-<hex>` or `sha256-<hex>` of the (decompressed) data.
        verification: Option<String>,
    },
}

impl Contents {
    /// Text or bytes to embed, compressed by the renderer when that is shorter.
    pub fn data(data: impl Into<Vec<u8>>) -> Self {
        Contents::Data {
            data: data.into(),
            compression: None,
        }
    }

    /// A URL Ignition fetches, without compression or verification.
    pub fn remote(source: impl Into<String>) -> Self {
        Contents::Remote {
            source: source.into(),
            compression: None,
            verification: None,
        }
    }
}

/// A regular file (`storage.files[]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct File {
    /// Absolute, clean path.
    pub path: String,
    /// Replace an existing file (Ignition's default is `false`).
    pub overwrite: Option<bool>,
    /// Permission bits, `0..=0o7777` (Ignition's default is `0o644`).
    pub mode: Option<u32>,
    /// Owner.
    pub user: Option<Owner>,
    /// Group.
    pub group: Option<Owner>,
    /// Contents; `None` creates an empty file (or keeps an existing one).
    pub contents: Option<Contents>,
}

impl File {
    /// A file at `path` with no contents and Ignition's defaults.
    pub fn new(path: impl Into<String>) -> Self {
        File {
            path: path.into(),
            overwrite: None,
            mode: None,
            user: None,
            group: None,
            contents: None,
        }
    }

    /// Sets the contents to `data`, embedded (and compressed when shorter).
    #[must_use]
    pub fn with_data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.contents = Some(Contents::data(data));
        self
    }

    /// Sets the contents.
    #[must_use]
    pub fn with_contents(mut self, contents: Contents) -> Self {
        self.contents = Some(contents);
        self
    }

    /// Sets the mode, e.g. `0o644`.
    #[must_use]
    pub fn with_mode(mut self, mode: u32) -> Self {
        self.mode = Some(mode);
        self
    }

    /// Sets `overwrite`.
    #[must_use]
    pub fn with_overwrite(mut self, overwrite: bool) -> Self {
        self.overwrite = Some(overwrite);
        self
    }

    /// Sets the owner.
    #[must_use]
    pub fn with_user(mut self, user: Owner) -> Self {
        self.user = Some(user);
        self
    }

    /// Sets the group.
    #[must_use]
    pub fn with_group(mut self, group: Owner) -> Self {
        self.group = Some(group);
        self
    }

    /// Checks this entry alone, as Ignition's validator would.
    pub fn check(&self) -> Result<(), FieldError> {
        check_path("path", &self.path)?;
        check_mode(self.mode)?;
        check_owner("user", self.user.as_ref())?;
        check_owner("group", self.group.as_ref())?;
        if self.overwrite == Some(true) && self.contents.is_none() {
            return Err(FieldError::new(
                "overwrite",
                "overwrite needs contents (Ignition refuses overwrite without a source)",
            ));
        }
        if let Some(Contents::Remote {
            source,
            verification,
            ..
        }) = &self.contents
        {
            check_source(source)?;
            if let Some(hash) = verification {
                check_hash(hash)?;
            }
        }
        Ok(())
    }
}

/// A directory (`storage.directories[]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Directory {
    /// Absolute, clean path.
    pub path: String,
    /// Replace an existing non-directory at the path.
    pub overwrite: Option<bool>,
    /// Permission bits, `0..=0o7777` (Ignition's default is `0o755`).
    pub mode: Option<u32>,
    /// Owner.
    pub user: Option<Owner>,
    /// Group.
    pub group: Option<Owner>,
}

impl Directory {
    /// A directory at `path` with Ignition's defaults.
    pub fn new(path: impl Into<String>) -> Self {
        Directory {
            path: path.into(),
            overwrite: None,
            mode: None,
            user: None,
            group: None,
        }
    }

    /// Sets the mode, e.g. `0o750`.
    #[must_use]
    pub fn with_mode(mut self, mode: u32) -> Self {
        self.mode = Some(mode);
        self
    }

    /// Sets `overwrite`.
    #[must_use]
    pub fn with_overwrite(mut self, overwrite: bool) -> Self {
        self.overwrite = Some(overwrite);
        self
    }

    /// Sets the owner.
    #[must_use]
    pub fn with_user(mut self, user: Owner) -> Self {
        self.user = Some(user);
        self
    }

    /// Sets the group.
    #[must_use]
    pub fn with_group(mut self, group: Owner) -> Self {
        self.group = Some(group);
        self
    }

    /// Checks this entry alone, as Ignition's validator would.
    pub fn check(&self) -> Result<(), FieldError> {
        check_path("path", &self.path)?;
        check_mode(self.mode)?;
        check_owner("user", self.user.as_ref())?;
        check_owner("group", self.group.as_ref())
    }
}

/// A symbolic or hard link (`storage.links[]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Link {
    /// Absolute, clean path of the link itself.
    pub path: String,
    /// What it points at; a symlink target may be relative.
    pub target: String,
    /// A hard link instead of a symlink.
    pub hard: Option<bool>,
    /// Replace an existing file at the path.
    pub overwrite: Option<bool>,
    /// Owner.
    pub user: Option<Owner>,
    /// Group.
    pub group: Option<Owner>,
}

impl Link {
    /// A symlink at `path` pointing at `target`.
    pub fn new(path: impl Into<String>, target: impl Into<String>) -> Self {
        Link {
            path: path.into(),
            target: target.into(),
            hard: None,
            overwrite: None,
            user: None,
            group: None,
        }
    }

    /// Makes it a hard link (`true`) or says explicitly that it is a symlink (`false`).
    #[must_use]
    pub fn with_hard(mut self, hard: bool) -> Self {
        self.hard = Some(hard);
        self
    }

    /// Sets `overwrite`.
    #[must_use]
    pub fn with_overwrite(mut self, overwrite: bool) -> Self {
        self.overwrite = Some(overwrite);
        self
    }

    /// Whether this is a hard link.
    pub fn is_hard(&self) -> bool {
        self.hard == Some(true)
    }

    /// The absolute path a hard link's target resolves to (Ignition joins a relative target
    /// to the link's path).
    pub(crate) fn resolved_target(&self) -> String {
        if self.target.starts_with('/') {
            clean_path(&self.target)
        } else {
            clean_path(&format!("{}/{}", self.path, self.target))
        }
    }

    /// Checks this entry alone, as Ignition's validator would.
    pub fn check(&self) -> Result<(), FieldError> {
        check_path("path", &self.path)?;
        if self.target.is_empty() {
            return Err(FieldError::new("target", "a link needs a target"));
        }
        check_owner("user", self.user.as_ref())?;
        check_owner("group", self.group.as_ref())
    }
}

/// A systemd drop-in of a unit (`systemd.units[].dropins[]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Dropin {
    /// File name, ending in `.conf`.
    pub name: String,
    /// Contents of `/etc/systemd/system/<unit>.d/<name>`.
    pub contents: Option<String>,
}

impl Dropin {
    /// A drop-in called `name` with `contents`.
    pub fn new(name: impl Into<String>, contents: impl Into<String>) -> Self {
        Dropin {
            name: name.into(),
            contents: Some(contents.into()),
        }
    }

    /// Checks this drop-in alone, as Ignition's validator would.
    pub fn check(&self) -> Result<(), FieldError> {
        check_file_name("name", &self.name, "drop-in")?;
        if !self.name.ends_with(".conf") {
            return Err(FieldError::new(
                "name",
                format!("drop-in name {:?} must end in .conf", self.name),
            ));
        }
        Ok(())
    }
}

/// The unit types Ignition accepts as a unit name's suffix.
pub const UNIT_SUFFIXES: [&str; 12] = [
    ".service",
    ".socket",
    ".device",
    ".mount",
    ".automount",
    ".swap",
    ".target",
    ".path",
    ".timer",
    ".snapshot",
    ".slice",
    ".scope",
];

/// A systemd unit (`systemd.units[]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Unit {
    /// Unit name with its type suffix, e.g. `agent.service`.
    pub name: String,
    /// Enable (`true`) or disable (`false`) through the Ignition preset file.
    pub enabled: Option<bool>,
    /// Mask the unit (link it to `/dev/null`).
    pub mask: Option<bool>,
    /// Contents of `/etc/systemd/system/<name>`.
    pub contents: Option<String>,
    /// Drop-ins, unique by name.
    pub dropins: Vec<Dropin>,
}

impl Unit {
    /// A unit called `name` with nothing set.
    pub fn new(name: impl Into<String>) -> Self {
        Unit {
            name: name.into(),
            enabled: None,
            mask: None,
            contents: None,
            dropins: Vec::new(),
        }
    }

    /// Sets the contents.
    #[must_use]
    pub fn with_contents(mut self, contents: impl Into<String>) -> Self {
        self.contents = Some(contents.into());
        self
    }

    /// Sets `enabled`.
    #[must_use]
    pub fn with_enabled(mut self, enabled: bool) -> Self {
        self.enabled = Some(enabled);
        self
    }

    /// Sets `mask`.
    #[must_use]
    pub fn with_mask(mut self, mask: bool) -> Self {
        self.mask = Some(mask);
        self
    }

    /// Adds a drop-in.
    #[must_use]
    pub fn with_dropin(mut self, dropin: Dropin) -> Self {
        self.dropins.push(dropin);
        self
    }

    /// Checks this unit and its drop-ins, as Ignition's validator would, plus unique drop-in
    /// names. Drop-in errors name the field as `dropins[<i>].<field>`.
    pub fn check(&self) -> Result<(), FieldError> {
        if self.name.is_empty() {
            return Err(FieldError::new("name", "a unit needs a name"));
        }
        check_file_name("name", &self.name, "unit")?;
        if !UNIT_SUFFIXES.iter().any(|s| {
            self.name
                .strip_suffix(s)
                .is_some_and(|stem| !stem.is_empty())
        }) {
            return Err(FieldError::new(
                "name",
                format!(
                    "unit name {:?} must end in one of {}",
                    self.name,
                    UNIT_SUFFIXES.join(", ")
                ),
            ));
        }
        for (i, d) in self.dropins.iter().enumerate() {
            d.check().map_err(|e| e.within(&format!("dropins[{i}]")))?;
            if let Some(j) = self.dropins[..i].iter().position(|o| o.name == d.name) {
                return Err(FieldError::new(
                    format!("dropins[{i}].name"),
                    format!("duplicate drop-in {:?} (also dropins[{j}])", d.name),
                ));
            }
        }
        Ok(())
    }

    /// The paths Ignition writes for this unit: the unit file when it has contents and each
    /// drop-in with contents (with the drop-in's name).
    pub(crate) fn written_paths(&self) -> Vec<(String, Option<&str>)> {
        let mut paths = Vec::new();
        if self.contents.as_deref().is_some_and(|c| !c.is_empty()) {
            paths.push((format!("/etc/systemd/system/{}", self.name), None));
        }
        for d in &self.dropins {
            if d.contents.as_deref().is_some_and(|c| !c.is_empty()) {
                paths.push((
                    format!("/etc/systemd/system/{}.d/{}", self.name, d.name),
                    Some(d.name.as_str()),
                ));
            }
        }
        paths
    }
}

/// A user account (`passwd.users[]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct User {
    /// Login name.
    pub name: String,
    /// Numeric uid.
    pub uid: Option<u32>,
    /// crypt(3) hash of the password.
    pub password_hash: Option<String>,
    /// Lines for `~/.ssh/authorized_keys.d/ignition`.
    pub ssh_authorized_keys: Vec<String>,
    /// Supplementary groups, e.g. `sudo`.
    pub groups: Vec<String>,
    /// Home directory.
    pub home_dir: Option<String>,
    /// Login shell.
    pub shell: Option<String>,
}

impl User {
    /// A user called `name` with nothing else set.
    pub fn new(name: impl Into<String>) -> Self {
        User {
            name: name.into(),
            uid: None,
            password_hash: None,
            ssh_authorized_keys: Vec::new(),
            groups: Vec::new(),
            home_dir: None,
            shell: None,
        }
    }

    /// Adds an SSH public key.
    #[must_use]
    pub fn with_ssh_key(mut self, key: impl Into<String>) -> Self {
        self.ssh_authorized_keys.push(key.into());
        self
    }

    /// Adds a supplementary group.
    #[must_use]
    pub fn with_group(mut self, group: impl Into<String>) -> Self {
        self.groups.push(group.into());
        self
    }

    /// Sets the uid.
    #[must_use]
    pub fn with_uid(mut self, uid: u32) -> Self {
        self.uid = Some(uid);
        self
    }

    /// Sets the password hash.
    #[must_use]
    pub fn with_password_hash(mut self, hash: impl Into<String>) -> Self {
        self.password_hash = Some(hash.into());
        self
    }

    /// Sets the home directory.
    #[must_use]
    pub fn with_home_dir(mut self, dir: impl Into<String>) -> Self {
        self.home_dir = Some(dir.into());
        self
    }

    /// Sets the login shell.
    #[must_use]
    pub fn with_shell(mut self, shell: impl Into<String>) -> Self {
        self.shell = Some(shell.into());
        self
    }

    /// Checks this entry alone.
    pub fn check(&self) -> Result<(), FieldError> {
        if self.name.is_empty() {
            return Err(FieldError::new("name", "a user needs a name"));
        }
        for (i, g) in self.groups.iter().enumerate() {
            if g.is_empty() {
                return Err(FieldError::new(format!("groups[{i}]"), "empty group name"));
            }
        }
        if let Some(home) = &self.home_dir {
            check_path("home_dir", home)?;
        }
        Ok(())
    }
}

/// What is wrong with one field of one entry: `field` is relative to the entry (`mode`,
/// `contents.source`, `dropins[1].name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field, relative to the entry.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl FieldError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }

    /// Prefixes the field with `parent` (`dropins[0]` + `name` → `dropins[0].name`).
    fn within(self, parent: &str) -> Self {
        FieldError {
            field: format!("{parent}.{}", self.field),
            message: self.message,
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for FieldError {}

/// Checks a node path as Ignition does: not empty, absolute, and already clean (no `//`, `.`,
/// `..` or trailing `/`).
fn check_path(field: &str, path: &str) -> Result<(), FieldError> {
    if path.is_empty() {
        return Err(FieldError::new(field, "path is empty"));
    }
    if !path.starts_with('/') {
        return Err(FieldError::new(
            field,
            format!("path {path:?} is relative; it must be absolute"),
        ));
    }
    let clean = clean_path(path);
    if clean != path {
        return Err(FieldError::new(
            field,
            format!("path {path:?} is not clean; write it as {clean:?}"),
        ));
    }
    Ok(())
}

fn check_mode(mode: Option<u32>) -> Result<(), FieldError> {
    match mode {
        Some(m) if m > MAX_MODE => Err(FieldError::new(
            "mode",
            format!("mode {m:#o} is out of range (0 to 0o7777)"),
        )),
        _ => Ok(()),
    }
}

fn check_owner(field: &str, owner: Option<&Owner>) -> Result<(), FieldError> {
    match owner {
        Some(Owner::Name(n)) if n.is_empty() => Err(FieldError::new(
            format!("{field}.name"),
            "empty name (leave the field out or give an id)",
        )),
        _ => Ok(()),
    }
}

/// A unit or drop-in name becomes a file name under `/etc/systemd/system`.
fn check_file_name(field: &str, name: &str, what: &str) -> Result<(), FieldError> {
    if name.is_empty() {
        return Err(FieldError::new(field, format!("a {what} needs a name")));
    }
    if name.contains('/') || name == "." || name == ".." {
        return Err(FieldError::new(
            field,
            format!("{what} name {name:?} must be a plain file name"),
        ));
    }
    Ok(())
}

/// The URL schemes Ignition fetches in spec 3.3 and 3.4 (3.4's `arn:` is left out so that a
/// config renders for both).
pub const SOURCE_SCHEMES: [&str; 6] = ["http", "https", "tftp", "s3", "gs", "data"];

fn check_source(source: &str) -> Result<(), FieldError> {
    let scheme = source.split_once(':').map(|(s, _)| s);
    match scheme {
        Some(s) if SOURCE_SCHEMES.contains(&s) => {
            if s == "data" && !source.contains(',') {
                return Err(FieldError::new(
                    "contents.source",
                    "a data URL needs a ',' before its data",
                ));
            }
            Ok(())
        }
        _ => Err(FieldError::new(
            "contents.source",
            format!(
                "unsupported URL {source:?} (schemes: {})",
                SOURCE_SCHEMES.join(", ")
            ),
        )),
    }
}

fn check_hash(hash: &str) -> Result<(), FieldError> {
    let is_hex = |h: &str| h.bytes().all(|b| b.is_ascii_hexdigit());
    let ok = match hash.split_once('-') {
        Some(("sha512", hex)) => hex.len() == 128 && is_hex(hex),
        Some(("sha256", hex)) => hex.len() == 64 && is_hex(hex),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(FieldError::new(
            "contents.verification.hash",
            format!("hash {hash:?} is not sha512-<128 hex digits> or sha256-<64 hex digits>"),
        ))
    }
}

/// Lexically cleans an absolute path like Go's `path.Clean`.
pub(crate) fn clean_path(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_must_be_absolute_and_clean() {
        assert!(File::new("/etc/hostname").check().is_ok());
        assert!(File::new("/").check().is_ok());
        for (p, want) in [
            ("", "path is empty"),
            ("etc/hostname", "relative"),
            ("/etc//hostname", "not clean"),
            ("/etc/./hostname", "not clean"),
            ("/etc/../hostname", "not clean"),
            ("/etc/", "not clean"),
        ] {
            let e = File::new(p).check().unwrap_err();
            assert_eq!(e.field, "path");
            assert!(e.message.contains(want), "{p}: {e}");
        }
    }

    #[test]
    fn clean_path_matches_go() {
        assert_eq!(clean_path("/a/b/../c/./d/"), "/a/c/d");
        assert_eq!(clean_path("/../a"), "/a");
        assert_eq!(clean_path("/"), "/");
    }

    #[test]
    fn modes_up_to_07777() {
        assert!(File::new("/a").with_mode(0o7777).check().is_ok());
        assert!(Directory::new("/a").with_mode(0).check().is_ok());
        let e = File::new("/a").with_mode(0o10000).check().unwrap_err();
        assert_eq!(
            e.to_string(),
            "mode: mode 0o10000 is out of range (0 to 0o7777)"
        );
        assert!(Directory::new("/a").with_mode(0o17777).check().is_err());
    }

    #[test]
    fn overwrite_needs_contents() {
        let e = File::new("/a").with_overwrite(true).check().unwrap_err();
        assert_eq!(e.field, "overwrite");
        assert!(
            File::new("/a")
                .with_overwrite(true)
                .with_data("x")
                .check()
                .is_ok()
        );
        assert!(File::new("/a").with_overwrite(false).check().is_ok());
    }

    #[test]
    fn remote_sources_and_hashes() {
        let ok = File::new("/a").with_contents(Contents::Remote {
            source: "https://example.com/a".into(),
            compression: Some(Compression::Gzip),
            verification: Some(format!("sha256-{}", "ab".repeat(32))),
        });
        assert!(ok.check().is_ok());
        let e = File::new("/a")
            .with_contents(Contents::remote("ftp://x/y"))
            .check()
            .unwrap_err();
        assert_eq!(e.field, "contents.source");
        let e = File::new("/a")
            .with_contents(Contents::Remote {
                source: "https://x/y".into(),
                compression: None,
                verification: Some("md5-abc".into()),
            })
            .check()
            .unwrap_err();
        assert_eq!(e.field, "contents.verification.hash");
        let e = File::new("/a")
            .with_contents(Contents::remote("data:text"))
            .check()
            .unwrap_err();
        assert!(e.message.contains("','"), "{e}");
    }

    #[test]
    fn owners_need_a_name_or_id() {
        assert!(File::new("/a").with_user(Owner::Id(0)).check().is_ok());
        let e = File::new("/a")
            .with_group(Owner::Name(String::new()))
            .check()
            .unwrap_err();
        assert_eq!(e.field, "group.name");
    }

    #[test]
    fn links_need_a_target() {
        assert!(Link::new("/a", "b").check().is_ok());
        assert_eq!(Link::new("/a", "").check().unwrap_err().field, "target");
        assert_eq!(Link::new("/x/a", "../b").resolved_target(), "/x/b");
        assert_eq!(Link::new("/x/a", "/y//b").resolved_target(), "/y/b");
    }

    #[test]
    fn unit_names_and_dropins() {
        assert!(Unit::new("agent.service").check().is_ok());
        assert!(Unit::new("var-lib.mount").check().is_ok());
        for (name, want) in [
            ("", "a unit needs a name"),
            ("agent", "must end in one of"),
            (".service", "must end in one of"),
            ("a/b.service", "plain file name"),
        ] {
            let e = Unit::new(name).check().unwrap_err();
            assert_eq!(e.field, "name");
            assert!(e.message.contains(want), "{name}: {e}");
        }
        let e = Unit::new("a.service")
            .with_dropin(Dropin::new("10-x.conf", "[Service]\n"))
            .with_dropin(Dropin::new("10-x", "[Service]\n"))
            .check()
            .unwrap_err();
        assert_eq!(e.field, "dropins[1].name");
        assert!(e.message.contains(".conf"));
        let e = Unit::new("a.service")
            .with_dropin(Dropin::new("10-x.conf", "a"))
            .with_dropin(Dropin::new("10-x.conf", "b"))
            .check()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "dropins[1].name: duplicate drop-in \"10-x.conf\" (also dropins[0])"
        );
    }

    #[test]
    fn written_paths_of_a_unit() {
        let u = Unit::new("a.service")
            .with_contents("[Unit]\n")
            .with_dropin(Dropin::new("10-x.conf", "[Service]\n"))
            .with_dropin(Dropin {
                name: "20-empty.conf".into(),
                contents: None,
            });
        assert_eq!(
            u.written_paths(),
            [
                ("/etc/systemd/system/a.service".to_string(), None),
                (
                    "/etc/systemd/system/a.service.d/10-x.conf".to_string(),
                    Some("10-x.conf")
                )
            ]
        );
        assert!(
            Unit::new("b.service")
                .with_mask(true)
                .written_paths()
                .is_empty()
        );
    }

    #[test]
    fn users_need_a_name() {
        assert!(User::new("core").with_group("sudo").check().is_ok());
        assert_eq!(User::new("").check().unwrap_err().field, "name");
        assert_eq!(
            User::new("u").with_group("").check().unwrap_err().field,
            "groups[0]"
        );
        assert_eq!(
            User::new("u")
                .with_home_dir("home/u")
                .check()
                .unwrap_err()
                .field,
            "home_dir"
        );
    }
}
