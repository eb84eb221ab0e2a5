//! [`Config`]: the entries of one host config, kept consistent as they are added or merged.
//!
//! Every way into a `Config` (Butane parsing, the `add_*` builder methods, [`merge`]) checks each
//! entry ([`File::check`] …) and the whole tree (one entry per path, nothing below a link,
//! no hard link to a directory, no file where Ignition writes a unit), so rendering cannot fail.
//!
//! Merging: a path, unit name or user name present on both sides is fine when both define the
//! same thing. Files, directories and links must be identical. Units and users merge field by
//! field: a field set on one side only is taken, a field set on both sides must be equal, and a
//! unit's drop-ins merge by name under the same rule. Anything else is a [`MergeError`] naming
//! the entry (and the field).

use std::fmt;

use crate::model::{Directory, Dropin, FieldError, File, Link, Unit, User};

/// One entry of a config, as errors name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Entry {
    /// `storage.files[]` by path.
    File(String),
    /// `storage.directories[]` by path.
    Directory(String),
    /// `storage.links[]` by path.
    Link(String),
    /// `systemd.units[]` by name.
    Unit(String),
    /// A drop-in of a unit.
    Dropin {
        /// The unit's name.
        unit: String,
        /// The drop-in's name.
        name: String,
    },
    /// `passwd.users[]` by name.
    User(String),
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn key(k: &str) -> &str {
            if k.is_empty() { "(unnamed)" } else { k }
        }
        match self {
            Entry::File(p) => write!(f, "file {}", key(p)),
            Entry::Directory(p) => write!(f, "directory {}", key(p)),
            Entry::Link(p) => write!(f, "link {}", key(p)),
            Entry::Unit(n) => write!(f, "unit {}", key(n)),
            Entry::Dropin { unit, name } => {
                write!(f, "drop-in {} of unit {}", key(name), key(unit))
            }
            Entry::User(n) => write!(f, "user {}", key(n)),
        }
    }
}

/// Why two configs (or a config and a new entry) cannot be combined.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MergeError {
    /// The same path, unit, drop-in or user is defined twice with different content.
    #[error("conflicting definitions of {entry}{}", differs(*field))]
    Conflict {
        /// The entry defined twice.
        entry: Entry,
        /// The field that differs, for units and users (merged field by field).
        field: Option<&'static str>,
    },
    /// Two entries of different kinds (file, directory, link) have the same path.
    #[error("{entry} has the same path as {other}")]
    PathClash {
        /// The entry added last.
        entry: Entry,
        /// The entry already there.
        other: Entry,
    },
    /// An entry lies below a link's path (Ignition refuses to write through links it creates).
    #[error("{entry} is below {link}")]
    BelowLink {
        /// The entry below the link.
        entry: Entry,
        /// The link.
        link: Entry,
    },
    /// A hard link points at a directory of the config.
    #[error("{entry} is a hard link to {directory}; hard links to directories are not allowed")]
    HardLinkToDirectory {
        /// The hard link.
        entry: Entry,
        /// The directory.
        directory: Entry,
    },
    /// A file, directory or link has the path Ignition writes a unit or drop-in to.
    #[error("{entry} has the path Ignition writes {unit} to")]
    SystemdPath {
        /// The file, directory or link.
        entry: Entry,
        /// The unit or drop-in.
        unit: Entry,
    },
}

fn differs(field: Option<&'static str>) -> String {
    field.map(|f| format!(" ({f} differs)")).unwrap_or_default()
}

impl MergeError {
    /// The entry the error is about (the one added last).
    pub fn entry(&self) -> &Entry {
        match self {
            MergeError::Conflict { entry, .. }
            | MergeError::PathClash { entry, .. }
            | MergeError::BelowLink { entry, .. }
            | MergeError::HardLinkToDirectory { entry, .. }
            | MergeError::SystemdPath { entry, .. } => entry,
        }
    }
}

/// Why the builder refused an entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The entry itself is invalid (relative path, mode out of range, unit without a name …).
    #[error("{entry}: {error}")]
    Invalid {
        /// The entry.
        entry: Entry,
        /// The field and what is wrong with it.
        error: FieldError,
    },
    /// The entry does not fit with what the config already has.
    #[error(transparent)]
    Merge(#[from] MergeError),
}

/// A host config: files, directories, links, systemd units and users, in the order they were
/// added. Build one with [`crate::parse_butane`], the `add_*` methods or [`merge`]; render it
/// with [`crate::to_ignition_json`].
///
/// ```
/// use flex_ignition::{Config, File, SpecVersion, Unit, User, to_ignition_json};
///
/// let mut config = Config::new();
/// config
///     .add_file(File::new("/etc/hostname").with_data("node1\n").with_mode(0o644).with_overwrite(true))?
///     .add_user(User::new("azureuser").with_ssh_key("ssh-ed25519 AAAA test").with_group("sudo"))?
///     .add_unit(Unit::new("agent.service").with_enabled(true).with_contents("[Install]\nWantedBy=multi-user.target\n"))?;
/// let json = to_ignition_json(&config, SpecVersion::V3_4_0);
/// assert!(json.contains("\"source\": \"data:,node1%0A\""));
/// # Ok::<(), flex_ignition::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    files: Vec<File>,
    directories: Vec<Directory>,
    links: Vec<Link>,
    units: Vec<Unit>,
    users: Vec<User>,
}

impl Config {
    /// An empty config.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether nothing has been added.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
            && self.directories.is_empty()
            && self.links.is_empty()
            && self.units.is_empty()
            && self.users.is_empty()
    }

    /// The files, in order.
    pub fn files(&self) -> &[File] {
        &self.files
    }

    /// The directories, in order.
    pub fn directories(&self) -> &[Directory] {
        &self.directories
    }

    /// The links, in order.
    pub fn links(&self) -> &[Link] {
        &self.links
    }

    /// The systemd units, in order.
    pub fn units(&self) -> &[Unit] {
        &self.units
    }

    /// The users, in order.
    pub fn users(&self) -> &[User] {
        &self.users
    }

    /// The unit called `name`.
    pub fn unit(&self, name: &str) -> Option<&Unit> {
        self.units.iter().find(|u| u.name == name)
    }

    /// The user called `name`.
    pub fn user(&self, name: &str) -> Option<&User> {
        self.users.iter().find(|u| u.name == name)
    }

    /// The file at `path`.
    pub fn file(&self, path: &str) -> Option<&File> {
        self.files.iter().find(|f| f.path == path)
    }

    /// Adds a file. An identical file at the same path is accepted; anything else at that path
    /// is an error, and the config is left unchanged.
    pub fn add_file(&mut self, file: File) -> Result<&mut Self, ConfigError> {
        file.check().map_err(|error| ConfigError::Invalid {
            entry: Entry::File(file.path.clone()),
            error,
        })?;
        self.transaction(|c| c.insert_file(file))
    }

    /// Adds a directory, like [`Config::add_file`].
    pub fn add_directory(&mut self, directory: Directory) -> Result<&mut Self, ConfigError> {
        directory.check().map_err(|error| ConfigError::Invalid {
            entry: Entry::Directory(directory.path.clone()),
            error,
        })?;
        self.transaction(|c| c.insert_directory(directory))
    }

    /// Adds a link, like [`Config::add_file`].
    pub fn add_link(&mut self, link: Link) -> Result<&mut Self, ConfigError> {
        link.check().map_err(|error| ConfigError::Invalid {
            entry: Entry::Link(link.path.clone()),
            error,
        })?;
        self.transaction(|c| c.insert_link(link))
    }

    /// Adds a unit, or merges it into the unit of the same name (field by field, drop-ins by
    /// name).
    pub fn add_unit(&mut self, unit: Unit) -> Result<&mut Self, ConfigError> {
        unit.check().map_err(|error| ConfigError::Invalid {
            entry: Entry::Unit(unit.name.clone()),
            error,
        })?;
        self.transaction(|c| c.insert_unit(unit))
    }

    /// Adds a drop-in to the unit `unit` (which need not have contents of its own).
    pub fn add_dropin(&mut self, unit: &str, dropin: Dropin) -> Result<&mut Self, ConfigError> {
        self.add_unit(Unit::new(unit).with_dropin(dropin))
    }

    /// Adds a user, or merges it into the user of the same name (field by field).
    pub fn add_user(&mut self, user: User) -> Result<&mut Self, ConfigError> {
        user.check().map_err(|error| ConfigError::Invalid {
            entry: Entry::User(user.name.clone()),
            error,
        })?;
        self.transaction(|c| c.insert_user(user))
    }

    /// Merges `other` into this config; on error this config is unchanged. See [`merge`].
    pub fn merge_from(&mut self, other: &Config) -> Result<&mut Self, MergeError> {
        let merged = merge(self, other)?;
        *self = merged;
        Ok(self)
    }

    /// Applies `change` to a copy and keeps it only if it and the tree checks succeed.
    fn transaction(
        &mut self,
        change: impl FnOnce(&mut Config) -> Result<(), MergeError>,
    ) -> Result<&mut Self, ConfigError> {
        let mut next = self.clone();
        change(&mut next)?;
        next.check_tree()?;
        *self = next;
        Ok(self)
    }

    /// The file, directory or link at `path`.
    fn node_at(&self, path: &str) -> Option<Entry> {
        if self.files.iter().any(|f| f.path == path) {
            Some(Entry::File(path.to_string()))
        } else if self.directories.iter().any(|d| d.path == path) {
            Some(Entry::Directory(path.to_string()))
        } else if self.links.iter().any(|l| l.path == path) {
            Some(Entry::Link(path.to_string()))
        } else {
            None
        }
    }

    /// Inserts an already checked file: no-op if an identical one is there.
    pub(crate) fn insert_file(&mut self, file: File) -> Result<(), MergeError> {
        let entry = Entry::File(file.path.clone());
        match self.node_at(&file.path) {
            None => {
                self.files.push(file);
                Ok(())
            }
            Some(Entry::File(_)) if self.files.contains(&file) => Ok(()),
            Some(Entry::File(_)) => Err(MergeError::Conflict { entry, field: None }),
            Some(other) => Err(MergeError::PathClash { entry, other }),
        }
    }

    /// Inserts an already checked directory.
    pub(crate) fn insert_directory(&mut self, dir: Directory) -> Result<(), MergeError> {
        let entry = Entry::Directory(dir.path.clone());
        match self.node_at(&dir.path) {
            None => {
                self.directories.push(dir);
                Ok(())
            }
            Some(Entry::Directory(_)) if self.directories.contains(&dir) => Ok(()),
            Some(Entry::Directory(_)) => Err(MergeError::Conflict { entry, field: None }),
            Some(other) => Err(MergeError::PathClash { entry, other }),
        }
    }

    /// Inserts an already checked link.
    pub(crate) fn insert_link(&mut self, link: Link) -> Result<(), MergeError> {
        let entry = Entry::Link(link.path.clone());
        match self.node_at(&link.path) {
            None => {
                self.links.push(link);
                Ok(())
            }
            Some(Entry::Link(_)) if self.links.contains(&link) => Ok(()),
            Some(Entry::Link(_)) => Err(MergeError::Conflict { entry, field: None }),
            Some(other) => Err(MergeError::PathClash { entry, other }),
        }
    }

    /// Inserts an already checked unit, merging it into one of the same name.
    pub(crate) fn insert_unit(&mut self, unit: Unit) -> Result<(), MergeError> {
        let Some(existing) = self.units.iter_mut().find(|u| u.name == unit.name) else {
            self.units.push(unit);
            return Ok(());
        };
        let entry = Entry::Unit(unit.name.clone());
        merge_field(&mut existing.contents, unit.contents, &entry, "contents")?;
        merge_field(&mut existing.enabled, unit.enabled, &entry, "enabled")?;
        merge_field(&mut existing.mask, unit.mask, &entry, "mask")?;
        for dropin in unit.dropins {
            match existing.dropins.iter().find(|d| d.name == dropin.name) {
                None => existing.dropins.push(dropin),
                Some(d) if *d == dropin => {}
                Some(_) => {
                    return Err(MergeError::Conflict {
                        entry: Entry::Dropin {
                            unit: unit.name,
                            name: dropin.name,
                        },
                        field: None,
                    });
                }
            }
        }
        Ok(())
    }

    /// Inserts an already checked user, merging it into one of the same name.
    pub(crate) fn insert_user(&mut self, user: User) -> Result<(), MergeError> {
        let Some(existing) = self.users.iter_mut().find(|u| u.name == user.name) else {
            self.users.push(user);
            return Ok(());
        };
        let entry = Entry::User(user.name.clone());
        merge_field(&mut existing.uid, user.uid, &entry, "uid")?;
        merge_field(
            &mut existing.password_hash,
            user.password_hash,
            &entry,
            "password_hash",
        )?;
        merge_list(
            &mut existing.ssh_authorized_keys,
            user.ssh_authorized_keys,
            &entry,
            "ssh_authorized_keys",
        )?;
        merge_list(&mut existing.groups, user.groups, &entry, "groups")?;
        merge_field(&mut existing.home_dir, user.home_dir, &entry, "home_dir")?;
        merge_field(&mut existing.shell, user.shell, &entry, "shell")?;
        Ok(())
    }

    /// The checks across entries: nothing below a link, no hard link to a directory, no file,
    /// directory or link where Ignition writes a unit or drop-in.
    pub(crate) fn check_tree(&self) -> Result<(), MergeError> {
        let nodes = || {
            self.files
                .iter()
                .map(|f| Entry::File(f.path.clone()))
                .chain(
                    self.directories
                        .iter()
                        .map(|d| Entry::Directory(d.path.clone())),
                )
                .chain(self.links.iter().map(|l| Entry::Link(l.path.clone())))
        };
        for node in nodes() {
            let path = node_path(&node);
            if let Some(link) = self
                .links
                .iter()
                .find(|l| path.starts_with(&format!("{}/", l.path)))
            {
                return Err(MergeError::BelowLink {
                    entry: node.clone(),
                    link: Entry::Link(link.path.clone()),
                });
            }
        }
        for link in self.links.iter().filter(|l| l.is_hard()) {
            let target = link.resolved_target();
            if self.directories.iter().any(|d| d.path == target) {
                return Err(MergeError::HardLinkToDirectory {
                    entry: Entry::Link(link.path.clone()),
                    directory: Entry::Directory(target),
                });
            }
        }
        for unit in &self.units {
            for (written, dropin) in unit.written_paths() {
                if let Some(node) = nodes().find(|n| node_path(n) == written) {
                    let owner = match dropin {
                        Some(name) => Entry::Dropin {
                            unit: unit.name.clone(),
                            name: name.to_string(),
                        },
                        None => Entry::Unit(unit.name.clone()),
                    };
                    return Err(MergeError::SystemdPath {
                        entry: node,
                        unit: owner,
                    });
                }
            }
        }
        Ok(())
    }
}

fn node_path(entry: &Entry) -> &str {
    match entry {
        Entry::File(p) | Entry::Directory(p) | Entry::Link(p) => p,
        Entry::Unit(n) | Entry::User(n) | Entry::Dropin { name: n, .. } => n,
    }
}

/// Takes `new` when `current` is unset; equal values are fine; different ones conflict.
fn merge_field<T: PartialEq>(
    current: &mut Option<T>,
    new: Option<T>,
    entry: &Entry,
    field: &'static str,
) -> Result<(), MergeError> {
    match (current.as_ref(), new) {
        (_, None) => Ok(()),
        (None, Some(v)) => {
            *current = Some(v);
            Ok(())
        }
        (Some(a), Some(b)) if *a == b => Ok(()),
        (Some(_), Some(_)) => Err(MergeError::Conflict {
            entry: entry.clone(),
            field: Some(field),
        }),
    }
}

/// Lists merge like fields: an empty list is unset.
fn merge_list(
    current: &mut Vec<String>,
    new: Vec<String>,
    entry: &Entry,
    field: &'static str,
) -> Result<(), MergeError> {
    if new.is_empty() || *current == new {
        Ok(())
    } else if current.is_empty() {
        *current = new;
        Ok(())
    } else {
        Err(MergeError::Conflict {
            entry: entry.clone(),
            field: Some(field),
        })
    }
}

/// Combines `base` and `addition`: `base`'s entries in order, then `addition`'s new ones.
///
/// The same path, unit or user name on both sides is fine when both define the same thing;
/// units and users merge field by field (a field set on one side is taken) and a unit's
/// drop-ins merge by name. Different content for the same entry or field is a
/// [`MergeError::Conflict`] naming it; the tree checks of [`Config`] apply to the result.
pub fn merge(base: &Config, addition: &Config) -> Result<Config, MergeError> {
    let mut out = base.clone();
    for f in &addition.files {
        out.insert_file(f.clone())?;
    }
    for d in &addition.directories {
        out.insert_directory(d.clone())?;
    }
    for l in &addition.links {
        out.insert_link(l.clone())?;
    }
    for u in &addition.units {
        out.insert_unit(u.clone())?;
    }
    for u in &addition.users {
        out.insert_user(u.clone())?;
    }
    out.check_tree()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Contents, Owner};

    fn base() -> Config {
        let mut c = Config::new();
        c.add_file(File::new("/etc/a").with_data("a\n").with_mode(0o644))
            .unwrap()
            .add_directory(Directory::new("/var/lib/agent").with_mode(0o700))
            .unwrap()
            .add_link(Link::new("/etc/l", "/etc/a"))
            .unwrap()
            .add_unit(
                Unit::new("agent.service")
                    .with_contents("[Service]\nExecStart=/bin/true\n")
                    .with_dropin(Dropin::new("10-a.conf", "[Service]\nNice=1\n")),
            )
            .unwrap()
            .add_user(User::new("azureuser").with_group("sudo"))
            .unwrap();
        c
    }

    #[test]
    fn identical_duplicates_merge_to_the_same_config() {
        let b = base();
        assert_eq!(merge(&b, &b).unwrap(), b);
        assert_eq!(merge(&b, &Config::new()).unwrap(), b);
        assert_eq!(merge(&Config::new(), &b).unwrap(), b);
    }

    #[test]
    fn new_entries_are_appended_in_order() {
        let mut add = Config::new();
        add.add_file(File::new("/etc/b").with_data("b"))
            .unwrap()
            .add_file(File::new("/etc/a").with_data("a\n").with_mode(0o644))
            .unwrap()
            .add_file(File::new("/etc/c"))
            .unwrap();
        let m = merge(&base(), &add).unwrap();
        let paths: Vec<_> = m.files().iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["/etc/a", "/etc/b", "/etc/c"]);
    }

    #[test]
    fn different_file_is_a_conflict_naming_it() {
        let mut add = Config::new();
        add.add_file(File::new("/etc/a").with_data("other\n").with_mode(0o644))
            .unwrap();
        let e = merge(&base(), &add).unwrap_err();
        assert_eq!(
            e,
            MergeError::Conflict {
                entry: Entry::File("/etc/a".into()),
                field: None
            }
        );
        assert_eq!(e.to_string(), "conflicting definitions of file /etc/a");
        // A different mode alone conflicts too.
        let mut add = Config::new();
        add.add_file(File::new("/etc/a").with_data("a\n").with_mode(0o600))
            .unwrap();
        assert!(matches!(
            merge(&base(), &add),
            Err(MergeError::Conflict { .. })
        ));
    }

    #[test]
    fn directory_and_link_conflicts() {
        let mut add = Config::new();
        add.add_directory(Directory::new("/var/lib/agent").with_mode(0o755))
            .unwrap();
        assert_eq!(
            merge(&base(), &add).unwrap_err().to_string(),
            "conflicting definitions of directory /var/lib/agent"
        );
        let mut add = Config::new();
        add.add_link(Link::new("/etc/l", "/etc/b")).unwrap();
        assert_eq!(
            merge(&base(), &add).unwrap_err().to_string(),
            "conflicting definitions of link /etc/l"
        );
    }

    #[test]
    fn same_path_different_kinds_clash() {
        let mut add = Config::new();
        add.add_directory(Directory::new("/etc/a")).unwrap();
        assert_eq!(
            merge(&base(), &add).unwrap_err().to_string(),
            "directory /etc/a has the same path as file /etc/a"
        );
        let mut add = Config::new();
        add.add_file(File::new("/var/lib/agent")).unwrap();
        assert_eq!(
            merge(&base(), &add).unwrap_err(),
            MergeError::PathClash {
                entry: Entry::File("/var/lib/agent".into()),
                other: Entry::Directory("/var/lib/agent".into())
            }
        );
    }

    #[test]
    fn units_merge_field_by_field_and_dropins_by_name() {
        let mut add = Config::new();
        add.add_unit(
            Unit::new("agent.service")
                .with_enabled(true)
                .with_dropin(Dropin::new("10-a.conf", "[Service]\nNice=1\n"))
                .with_dropin(Dropin::new("20-b.conf", "[Service]\nNice=2\n")),
        )
        .unwrap();
        let m = merge(&base(), &add).unwrap();
        let u = m.unit("agent.service").unwrap();
        assert_eq!(u.enabled, Some(true));
        assert_eq!(
            u.contents.as_deref(),
            Some("[Service]\nExecStart=/bin/true\n")
        );
        let names: Vec<_> = u.dropins.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["10-a.conf", "20-b.conf"]);
    }

    #[test]
    fn unit_and_dropin_conflicts() {
        let mut add = Config::new();
        add.add_unit(Unit::new("agent.service").with_contents("[Service]\nExecStart=/bin/false\n"))
            .unwrap();
        let e = merge(&base(), &add).unwrap_err();
        assert_eq!(
            e.to_string(),
            "conflicting definitions of unit agent.service (contents differs)"
        );
        let mut add = Config::new();
        add.add_dropin(
            "agent.service",
            Dropin::new("10-a.conf", "[Service]\nNice=5\n"),
        )
        .unwrap();
        let e = merge(&base(), &add).unwrap_err();
        assert_eq!(
            e,
            MergeError::Conflict {
                entry: Entry::Dropin {
                    unit: "agent.service".into(),
                    name: "10-a.conf".into()
                },
                field: None
            }
        );
        assert_eq!(
            e.to_string(),
            "conflicting definitions of drop-in 10-a.conf of unit agent.service"
        );
        let mut add = Config::new();
        add.add_unit(Unit::new("agent.service").with_mask(true))
            .unwrap();
        assert!(merge(&base(), &add).is_ok());
    }

    #[test]
    fn users_merge_field_by_field() {
        let mut add = Config::new();
        add.add_user(User::new("azureuser").with_ssh_key("ssh-ed25519 AAAA k"))
            .unwrap();
        let m = merge(&base(), &add).unwrap();
        let u = m.user("azureuser").unwrap();
        assert_eq!(u.groups, ["sudo"]);
        assert_eq!(u.ssh_authorized_keys, ["ssh-ed25519 AAAA k"]);

        let mut add = Config::new();
        add.add_user(User::new("azureuser").with_group("wheel"))
            .unwrap();
        assert_eq!(
            merge(&base(), &add).unwrap_err().to_string(),
            "conflicting definitions of user azureuser (groups differs)"
        );
        let mut a = Config::new();
        a.add_user(User::new("u").with_shell("/bin/bash")).unwrap();
        let mut b = Config::new();
        b.add_user(User::new("u").with_shell("/bin/sh")).unwrap();
        assert_eq!(
            merge(&a, &b).unwrap_err(),
            MergeError::Conflict {
                entry: Entry::User("u".into()),
                field: Some("shell")
            }
        );
    }

    #[test]
    fn entries_below_a_link_are_refused() {
        let mut add = Config::new();
        add.add_file(File::new("/etc/l/x")).unwrap();
        assert_eq!(
            merge(&base(), &add).unwrap_err().to_string(),
            "file /etc/l/x is below link /etc/l"
        );
        // A sibling with the link's name as prefix is fine.
        let mut add = Config::new();
        add.add_file(File::new("/etc/lx")).unwrap();
        assert!(merge(&base(), &add).is_ok());
        // The builder refuses a link above existing entries, and keeps the config unchanged.
        let mut c = base();
        let before = c.clone();
        let e = c.add_link(Link::new("/var/lib", "/tmp")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "directory /var/lib/agent is below link /var/lib"
        );
        assert_eq!(c, before);
    }

    #[test]
    fn hard_links_to_directories_are_refused() {
        let mut c = base();
        let e = c
            .add_link(Link::new("/var/lib/h", "/var/lib/agent").with_hard(true))
            .unwrap_err();
        assert_eq!(
            e,
            ConfigError::Merge(MergeError::HardLinkToDirectory {
                entry: Entry::Link("/var/lib/h".into()),
                directory: Entry::Directory("/var/lib/agent".into())
            })
        );
        // Not a hard link: fine. (A relative hard-link target is joined to the link's own
        // path, as Ignition's validator does.)
        c.add_link(Link::new("/var/lib/s", "/var/lib/agent"))
            .unwrap();
        c.add_link(Link::new("/var/lib/h2", "agent").with_hard(true))
            .unwrap();
    }

    #[test]
    fn files_where_ignition_writes_units_are_refused() {
        let mut c = base();
        let e = c
            .add_file(File::new("/etc/systemd/system/agent.service").with_data("x"))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "file /etc/systemd/system/agent.service has the path Ignition writes unit agent.service to"
        );
        let e = c
            .add_file(File::new("/etc/systemd/system/agent.service.d/10-a.conf"))
            .unwrap_err();
        assert!(matches!(
            e,
            ConfigError::Merge(MergeError::SystemdPath {
                unit: Entry::Dropin { .. },
                ..
            })
        ));
        // A unit without contents (mask only) writes nothing there.
        c.add_unit(Unit::new("other.service").with_mask(true))
            .unwrap();
        c.add_file(File::new("/etc/systemd/system/other.service.d/x.conf"))
            .unwrap();
    }

    #[test]
    fn builder_rejects_invalid_entries_naming_them() {
        let mut c = Config::new();
        let e = c.add_file(File::new("etc/x")).unwrap_err();
        assert!(
            matches!(&e, ConfigError::Invalid { entry: Entry::File(p), error } if p == "etc/x" && error.field == "path")
        );
        assert!(
            e.to_string()
                .starts_with("file etc/x: path: path \"etc/x\" is relative")
        );
        let e = c
            .add_directory(Directory::new("/d").with_mode(0o10000))
            .unwrap_err();
        assert!(e.to_string().starts_with("directory /d: mode: "), "{e}");
        let e = c.add_unit(Unit::new("")).unwrap_err();
        assert_eq!(e.to_string(), "unit (unnamed): name: a unit needs a name");
        assert!(c.add_user(User::new("")).is_err());
        assert!(c.add_link(Link::new("/l", "")).is_err());
        assert!(c.is_empty());
    }

    #[test]
    fn builder_adds_the_same_entry_twice_once() {
        let mut c = Config::new();
        let f = File::new("/etc/hostname")
            .with_contents(Contents::data("n\n"))
            .with_user(Owner::Id(0));
        c.add_file(f.clone()).unwrap().add_file(f).unwrap();
        assert_eq!(c.files().len(), 1);
        let mut other = Config::new();
        other.add_file(File::new("/etc/x")).unwrap();
        c.merge_from(&other).unwrap();
        assert_eq!(c.files().len(), 2);
    }
}
