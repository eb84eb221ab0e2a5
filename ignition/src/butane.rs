//! Butane YAML (`variant: flatcar`, `version: 1.0.0` or `1.1.0`) to a [`Config`].
//!
//! The subset a host config needs: `storage.files` (`inline`, `local`, `source`,
//! `compression`, `verification`), `storage.directories`, `storage.links`, `systemd.units`
//! (with `contents_local` and drop-ins) and `passwd.users`. YAML is read like Butane's Go YAML
//! library reads it: `0644` is octal, plain scalars are accepted where a string is expected.
//!
//! Every problem is a [`ButaneError`] carrying the YAML path of the field at fault
//! (`storage.files[2].contnets: unknown field`). Butane fields this crate does not implement
//! (`storage.disks`, `append`, …) are refused as unsupported rather than ignored.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;
use serde_saphyr::Error as YamlError;

use crate::config::{Config, Entry, MergeError};
use crate::model::{
    Compression, Contents, Directory, Dropin, FieldError, File, Link, MAX_MODE, Owner, Unit, User,
};

/// The Butane variant this crate reads.
pub const VARIANT: &str = "flatcar";

/// The Butane `flatcar` versions this crate reads (1.0.0 targets Ignition 3.3.0, 1.1.0 targets
/// 3.4.0; the fields supported here are the same in both).
pub const VERSIONS: [&str; 2] = ["1.0.0", "1.1.0"];

/// Why a Butane document was refused. `path` is the YAML path of the field at fault
/// (`storage.files[2].mode`), empty for the document itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ButaneError {
    /// The text is not valid YAML (or not a single document).
    #[error("invalid YAML{}: {message}", at_line(*line, *column))]
    Syntax {
        /// The parser's message.
        message: String,
        /// 1-based line, when known.
        line: Option<u64>,
        /// 1-based column, when known.
        column: Option<u64>,
    },
    /// A field Butane does not have (often a typo).
    #[error("{path}: unknown field")]
    UnknownField {
        /// YAML path of the field.
        path: String,
    },
    /// A Butane field this crate does not implement.
    #[error(
        "{path}: unsupported field (flex-ignition implements files, directories, links, systemd units and users)"
    )]
    UnsupportedField {
        /// YAML path of the field.
        path: String,
    },
    /// A required field is missing.
    #[error("{path}: missing required field")]
    MissingField {
        /// YAML path of the field.
        path: String,
    },
    /// A field has the wrong type or an invalid value.
    #[error("{}: {message}", show_path(path))]
    Invalid {
        /// YAML path of the field.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A path, unit, drop-in or user is defined twice in the document.
    #[error(
        "{path}: duplicate {} (first defined at {first})",
        duplicate_what(entry)
    )]
    Duplicate {
        /// YAML path of the second definition.
        path: String,
        /// The second definition, e.g. `Entry::File("/etc/hostname")`.
        entry: Entry,
        /// YAML path of the first definition.
        first: String,
    },
    /// Entries do not fit together (an entry below a link, a file where a unit goes …).
    #[error("{path}: {error}")]
    Conflict {
        /// YAML path of the entry at fault.
        path: String,
        /// The problem.
        error: Box<MergeError>,
    },
    /// A `local` or `contents_local` file could not be read.
    #[error("{path}: cannot read local file {} ({}): {cause}", name.display(), file.display())]
    LocalFile {
        /// YAML path of the `local` field.
        path: String,
        /// The name as written in the document.
        name: PathBuf,
        /// The file that was read (files-dir joined with `name`).
        file: PathBuf,
        /// The I/O error (in the message, not a `source()`: a chain printer would repeat it).
        cause: std::io::Error,
    },
}

fn show_path(path: &str) -> &str {
    if path.is_empty() { "document" } else { path }
}

fn duplicate_what(entry: &Entry) -> String {
    match entry {
        Entry::File(p) | Entry::Directory(p) | Entry::Link(p) => format!("path {p}"),
        other => other.to_string(),
    }
}

fn at_line(line: Option<u64>, column: Option<u64>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(" at line {l}, column {c}"),
        (Some(l), None) => format!(" at line {l}"),
        _ => String::new(),
    }
}

impl ButaneError {
    /// The YAML path of the field at fault; empty for syntax errors.
    pub fn path(&self) -> &str {
        match self {
            ButaneError::Syntax { .. } => "",
            ButaneError::UnknownField { path }
            | ButaneError::UnsupportedField { path }
            | ButaneError::MissingField { path }
            | ButaneError::Invalid { path, .. }
            | ButaneError::Duplicate { path, .. }
            | ButaneError::Conflict { path, .. }
            | ButaneError::LocalFile { path, .. } => path,
        }
    }

    fn invalid(path: impl Into<String>, message: impl Into<String>) -> Self {
        ButaneError::Invalid {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// Something Butane would accept but warn about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ButaneWarning {
    /// YAML path of the field.
    pub path: String,
    /// What looks wrong.
    pub message: String,
}

impl std::fmt::Display for ButaneWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Parses a Butane document into a [`Config`]. `files_dir` is the directory `local` and
/// `contents_local` paths are relative to (Butane's `--files-dir`); without it such fields are
/// an error. Warnings (see [`parse_butane_with_warnings`]) are dropped.
pub fn parse_butane(yaml: &str, files_dir: Option<&Path>) -> Result<Config, ButaneError> {
    parse_butane_with_warnings(yaml, files_dir).map(|(config, _)| config)
}

/// [`parse_butane`], also returning what Butane would warn about: a mode that looks written in
/// decimal (`mode: 644` is `0o1204`; write `0644`).
pub fn parse_butane_with_warnings(
    yaml: &str,
    files_dir: Option<&Path>,
) -> Result<(Config, Vec<ButaneWarning>), ButaneError> {
    let raw = deserialize(yaml)?;
    let mut t = Translator {
        files_dir,
        config: Config::new(),
        warnings: Vec::new(),
        nodes: HashMap::new(),
        units: HashMap::new(),
        users: HashMap::new(),
    };
    t.document(raw)?;
    Ok((t.config, t.warnings))
}

// ---------------------------------------------------------------------------------------------
// The Butane schema subset, as serde structs.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    variant: String,
    version: String,
    storage: Option<RawStorage>,
    systemd: Option<RawSystemd>,
    passwd: Option<RawPasswd>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStorage {
    files: Option<Vec<RawFile>>,
    directories: Option<Vec<RawDirectory>>,
    links: Option<Vec<RawLink>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOwner {
    id: Option<i64>,
    name: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    path: String,
    overwrite: Option<bool>,
    mode: Option<i64>,
    user: Option<RawOwner>,
    group: Option<RawOwner>,
    contents: Option<RawResource>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResource {
    inline: Option<String>,
    local: Option<String>,
    source: Option<String>,
    compression: Option<String>,
    verification: Option<RawVerification>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVerification {
    hash: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDirectory {
    path: String,
    overwrite: Option<bool>,
    mode: Option<i64>,
    user: Option<RawOwner>,
    group: Option<RawOwner>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLink {
    path: String,
    target: String,
    hard: Option<bool>,
    overwrite: Option<bool>,
    user: Option<RawOwner>,
    group: Option<RawOwner>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSystemd {
    units: Option<Vec<RawUnit>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUnit {
    name: String,
    enabled: Option<bool>,
    mask: Option<bool>,
    contents: Option<String>,
    contents_local: Option<String>,
    dropins: Option<Vec<RawDropin>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDropin {
    name: String,
    contents: Option<String>,
    contents_local: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPasswd {
    users: Option<Vec<RawUser>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUser {
    name: String,
    uid: Option<i64>,
    password_hash: Option<String>,
    ssh_authorized_keys: Option<Vec<String>>,
    groups: Option<Vec<String>>,
    home_dir: Option<String>,
    shell: Option<String>,
}

/// Butane fields, by the (index-free) path of the object holding them, that this crate does not
/// implement: refused as unsupported instead of unknown.
const UNSUPPORTED: &[(&str, &[&str])] = &[
    ("", &["ignition", "kernel_arguments", "boot_device", "grub"]),
    (
        "storage",
        &["disks", "raid", "filesystems", "luks", "trees"],
    ),
    ("storage.files[]", &["append"]),
    ("storage.files[].contents", &["http_headers"]),
    ("passwd", &["groups"]),
    (
        "passwd.users[]",
        &[
            "gecos",
            "no_create_home",
            "primary_group",
            "no_user_group",
            "no_log_init",
            "system",
            "should_exist",
            "ssh_authorized_keys_local",
        ],
    ),
];

// ---------------------------------------------------------------------------------------------
// YAML to raw structs, with paths in errors.

fn deserialize(yaml: &str) -> Result<RawConfig, ButaneError> {
    let mut options = serde_saphyr::Options::default();
    // Go's YAML library (Butane's) reads `0644` as octal, as file modes are written.
    options.legacy_octal_numbers = true;
    options.with_snippet = false;
    // The closure must hand serde-saphyr its own error (so it stops reading rather than
    // complaining about the rest of the document); the path goes out on the side.
    let mut failed_at = String::new();
    serde_saphyr::with_deserializer_from_str_with_options(yaml, options, |de| {
        serde_path_to_error::deserialize::<_, RawConfig>(de).map_err(|e| {
            failed_at = yaml_path(e.path());
            e.into_inner()
        })
    })
    .map_err(|e| from_yaml_error(&failed_at, &e))
}

fn yaml_path(path: &serde_path_to_error::Path) -> String {
    let mut out = String::new();
    for seg in path.iter() {
        match seg {
            serde_path_to_error::Segment::Seq { index } => {
                let _ = write!(out, "[{index}]");
            }
            serde_path_to_error::Segment::Map { key } => push_key(&mut out, key),
            serde_path_to_error::Segment::Enum { variant } => push_key(&mut out, variant),
            serde_path_to_error::Segment::Unknown => push_key(&mut out, "?"),
        }
    }
    out
}

fn push_key(path: &mut String, key: &str) {
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(key);
}

fn join(path: &str, key: &str) -> String {
    let mut p = path.to_string();
    push_key(&mut p, key);
    p
}

/// `storage.files[2].contents` → `storage.files[].contents`.
fn without_indices(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut in_index = false;
    for c in path.chars() {
        match c {
            '[' => {
                in_index = true;
                out.push_str("[]");
            }
            ']' => in_index = false,
            c if !in_index => out.push(c),
            _ => {}
        }
    }
    out
}

/// `path` + `.key`, unless serde_path_to_error already put `key` (or an unknown `?`) last.
fn with_key(path: &str, key: &str) -> String {
    let (parent, last) = match path.rsplit_once('.') {
        Some((parent, last)) => (parent, last),
        None => ("", path),
    };
    if last == key {
        path.to_string()
    } else if last == "?" {
        join(parent, key)
    } else {
        join(path, key)
    }
}

fn from_yaml_error(path: &str, err: &YamlError) -> ButaneError {
    let location = err.location().filter(|l| l.line() > 0);
    match err.without_snippet() {
        YamlError::SerdeUnknownField { field, .. } => {
            let path = with_key(path, field);
            let parent = path
                .strip_suffix(field.as_str())
                .unwrap_or_default()
                .trim_end_matches('.');
            let parent = without_indices(parent);
            let unsupported = UNSUPPORTED
                .iter()
                .any(|(p, fields)| *p == parent && fields.contains(&field.as_str()));
            if unsupported {
                ButaneError::UnsupportedField { path }
            } else {
                ButaneError::UnknownField { path }
            }
        }
        YamlError::SerdeMissingField { field, .. } => ButaneError::MissingField {
            path: with_key(path, field),
        },
        YamlError::DuplicateMappingKey { key, .. } => match key {
            Some(k) => ButaneError::invalid(with_key(path, k), "duplicate key"),
            None => ButaneError::invalid(path.trim_end_matches(".?"), "duplicate key"),
        },
        YamlError::SerdeInvalidType {
            unexpected,
            expected,
            ..
        }
        | YamlError::SerdeInvalidValue {
            unexpected,
            expected,
            ..
        } => ButaneError::invalid(path, format!("expected {expected}, found {unexpected}")),
        YamlError::InvalidScalar { ty, .. } => {
            ButaneError::invalid(path, format!("expected {}", friendly_type(ty)))
        }
        YamlError::Unexpected { expected, .. } => {
            ButaneError::invalid(path, format!("expected {}", friendly_type(expected)))
        }
        YamlError::MultipleDocuments { .. } => ButaneError::Syntax {
            message: "a Butane config is a single YAML document".to_string(),
            line: location.map(|l| l.line()),
            column: location.map(|l| l.column()),
        },
        other if !path.is_empty() && is_value_error(other) => {
            ButaneError::invalid(path, strip_location(&other.to_string()))
        }
        other => ButaneError::Syntax {
            message: strip_location(&other.to_string()),
            line: location.map(|l| l.line()),
            column: location.map(|l| l.column()),
        },
    }
}

/// serde-saphyr's names for what it expected, in the words of a config's author.
fn friendly_type(ty: &str) -> String {
    match ty {
        "i8" | "i16" | "i32" | "i64" | "u8" | "u16" | "u32" | "u64" => {
            "an integer (octal modes start with 0, e.g. 0644)".to_string()
        }
        "boolean" | "bool" => "true or false".to_string(),
        "sequence start" => "a list".to_string(),
        "mapping start" => "a mapping".to_string(),
        other => other.to_string(),
    }
}

/// Errors about one scalar's value, as opposed to the document's structure.
fn is_value_error(err: &YamlError) -> bool {
    matches!(
        err,
        YamlError::Message { .. }
            | YamlError::SerdeInvalidLength { .. }
            | YamlError::SerdeUnknownVariant { .. }
            | YamlError::NullIntoString { .. }
            | YamlError::InvalidBooleanStrict { .. }
            | YamlError::TaggedScalarCannotDeserializeIntoString { .. }
            | YamlError::BytesNotSupportedMissingBinaryTag { .. }
    )
}

/// serde-saphyr appends ` at line L, column C`; the path says where.
fn strip_location(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Raw structs to the model, with semantic checks.

struct Translator<'a> {
    files_dir: Option<&'a Path>,
    config: Config,
    warnings: Vec<ButaneWarning>,
    /// YAML path of the entry defining each node path.
    nodes: HashMap<String, String>,
    /// YAML path of each unit.
    units: HashMap<String, String>,
    /// YAML path of each user.
    users: HashMap<String, String>,
}

impl Translator<'_> {
    fn document(&mut self, raw: RawConfig) -> Result<(), ButaneError> {
        if raw.variant != VARIANT {
            return Err(ButaneError::invalid(
                "variant",
                format!(
                    "unsupported variant {:?} (flex-ignition reads {VARIANT:?})",
                    raw.variant
                ),
            ));
        }
        if !VERSIONS.contains(&raw.version.as_str()) {
            return Err(ButaneError::invalid(
                "version",
                format!(
                    "unsupported version {:?} of variant {VARIANT} (supported: {})",
                    raw.version,
                    VERSIONS.join(", ")
                ),
            ));
        }
        if let Some(storage) = raw.storage {
            for (i, f) in storage.files.unwrap_or_default().into_iter().enumerate() {
                self.file(&format!("storage.files[{i}]"), f)?;
            }
            for (i, d) in storage
                .directories
                .unwrap_or_default()
                .into_iter()
                .enumerate()
            {
                self.directory(&format!("storage.directories[{i}]"), d)?;
            }
            for (i, l) in storage.links.unwrap_or_default().into_iter().enumerate() {
                self.link(&format!("storage.links[{i}]"), l)?;
            }
        }
        if let Some(systemd) = raw.systemd {
            for (i, u) in systemd.units.unwrap_or_default().into_iter().enumerate() {
                self.unit(&format!("systemd.units[{i}]"), u)?;
            }
        }
        if let Some(passwd) = raw.passwd {
            for (i, u) in passwd.users.unwrap_or_default().into_iter().enumerate() {
                self.user(&format!("passwd.users[{i}]"), u)?;
            }
        }
        self.config
            .check_tree()
            .map_err(|error| ButaneError::Conflict {
                path: self.path_of(error.entry()),
                error: Box::new(error),
            })
    }

    /// The YAML path of an entry already translated.
    fn path_of(&self, entry: &Entry) -> String {
        match entry {
            Entry::File(p) | Entry::Directory(p) | Entry::Link(p) => self.nodes.get(p).cloned(),
            Entry::Unit(n) | Entry::Dropin { unit: n, .. } => self.units.get(n).cloned(),
            Entry::User(n) => self.users.get(n).cloned(),
        }
        .unwrap_or_default()
    }

    fn file(&mut self, at: &str, raw: RawFile) -> Result<(), ButaneError> {
        let mode = self.mode(at, raw.mode, false)?;
        let file = File {
            path: raw.path,
            overwrite: raw.overwrite,
            mode,
            user: owner(&join(at, "user"), raw.user)?,
            group: owner(&join(at, "group"), raw.group)?,
            contents: match raw.contents {
                Some(c) => self.contents(&join(at, "contents"), c)?,
                None => None,
            },
        };
        file.check().map_err(|e| field_error(at, e))?;
        self.claim_path(at, Entry::File(file.path.clone()))?;
        self.config
            .insert_file(file)
            .map_err(|e| ButaneError::Conflict {
                path: join(at, "path"),
                error: Box::new(e),
            })
    }

    fn directory(&mut self, at: &str, raw: RawDirectory) -> Result<(), ButaneError> {
        let dir = Directory {
            path: raw.path,
            overwrite: raw.overwrite,
            mode: self.mode(at, raw.mode, true)?,
            user: owner(&join(at, "user"), raw.user)?,
            group: owner(&join(at, "group"), raw.group)?,
        };
        dir.check().map_err(|e| field_error(at, e))?;
        self.claim_path(at, Entry::Directory(dir.path.clone()))?;
        self.config
            .insert_directory(dir)
            .map_err(|e| ButaneError::Conflict {
                path: join(at, "path"),
                error: Box::new(e),
            })
    }

    fn link(&mut self, at: &str, raw: RawLink) -> Result<(), ButaneError> {
        let link = Link {
            path: raw.path,
            target: raw.target,
            hard: raw.hard,
            overwrite: raw.overwrite,
            user: owner(&join(at, "user"), raw.user)?,
            group: owner(&join(at, "group"), raw.group)?,
        };
        link.check().map_err(|e| field_error(at, e))?;
        self.claim_path(at, Entry::Link(link.path.clone()))?;
        self.config
            .insert_link(link)
            .map_err(|e| ButaneError::Conflict {
                path: join(at, "path"),
                error: Box::new(e),
            })
    }

    /// Records that the entry at YAML path `at` defines `entry`'s path; a second definition of
    /// the same path (of any kind) is an error.
    fn claim_path(&mut self, at: &str, entry: Entry) -> Result<(), ButaneError> {
        let (Entry::File(path) | Entry::Directory(path) | Entry::Link(path)) = &entry else {
            return Ok(());
        };
        let here = join(at, "path");
        if let Some(first) = self.nodes.get(path) {
            return Err(ButaneError::Duplicate {
                path: here,
                entry,
                first: join(first, "path"),
            });
        }
        self.nodes.insert(path.clone(), at.to_string());
        Ok(())
    }

    fn unit(&mut self, at: &str, raw: RawUnit) -> Result<(), ButaneError> {
        let contents = self.text(at, raw.contents, raw.contents_local)?;
        let mut dropins = Vec::new();
        for (i, d) in raw.dropins.unwrap_or_default().into_iter().enumerate() {
            let dat = format!("{at}.dropins[{i}]");
            dropins.push(Dropin {
                name: d.name,
                contents: self.text(&dat, d.contents, d.contents_local)?,
            });
        }
        let unit = Unit {
            name: raw.name,
            enabled: raw.enabled,
            mask: raw.mask,
            contents,
            dropins,
        };
        unit.check().map_err(|e| field_error(at, e))?;
        if let Some(first) = self.units.get(&unit.name) {
            return Err(ButaneError::Duplicate {
                path: join(at, "name"),
                entry: Entry::Unit(unit.name.clone()),
                first: join(first, "name"),
            });
        }
        self.units.insert(unit.name.clone(), at.to_string());
        self.config
            .insert_unit(unit)
            .map_err(|e| ButaneError::Conflict {
                path: at.to_string(),
                error: Box::new(e),
            })
    }

    fn user(&mut self, at: &str, raw: RawUser) -> Result<(), ButaneError> {
        let uid = match raw.uid {
            None => None,
            Some(id) => Some(u32::try_from(id).map_err(|_| {
                ButaneError::invalid(join(at, "uid"), format!("uid {id} is out of range"))
            })?),
        };
        let user = User {
            name: raw.name,
            uid,
            password_hash: raw.password_hash,
            ssh_authorized_keys: raw.ssh_authorized_keys.unwrap_or_default(),
            groups: raw.groups.unwrap_or_default(),
            home_dir: raw.home_dir,
            shell: raw.shell,
        };
        user.check().map_err(|e| field_error(at, e))?;
        if let Some(first) = self.users.get(&user.name) {
            return Err(ButaneError::Duplicate {
                path: join(at, "name"),
                entry: Entry::User(user.name.clone()),
                first: join(first, "name"),
            });
        }
        self.users.insert(user.name.clone(), at.to_string());
        self.config
            .insert_user(user)
            .map_err(|e| ButaneError::Conflict {
                path: at.to_string(),
                error: Box::new(e),
            })
    }

    fn mode(
        &mut self,
        at: &str,
        mode: Option<i64>,
        directory: bool,
    ) -> Result<Option<u32>, ButaneError> {
        let Some(m) = mode else { return Ok(None) };
        let path = join(at, "mode");
        let m = u32::try_from(m)
            .ok()
            .filter(|m| *m <= MAX_MODE)
            .ok_or_else(|| {
                let shown = if m < 0 {
                    format!("-{:#o}", m.unsigned_abs())
                } else {
                    format!("{m:#o}")
                };
                ButaneError::invalid(&path, format!("mode {shown} is out of range (0 to 0o7777)"))
            })?;
        if looks_decimal(m, directory) {
            self.warnings.push(ButaneWarning {
                path,
                message: format!(
                    "mode {m:#o} ({m} in decimal) looks like it was meant as octal 0{m}; \
                     write octal modes with a leading 0"
                ),
            });
        }
        Ok(Some(m))
    }

    /// A file's `contents`: exactly one of `inline`, `local` and `source`.
    fn contents(&self, at: &str, raw: RawResource) -> Result<Option<Contents>, ButaneError> {
        let set: Vec<&str> = [
            ("inline", raw.inline.is_some()),
            ("local", raw.local.is_some()),
            ("source", raw.source.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, is_set)| is_set.then_some(name))
        .collect();
        if set.len() > 1 {
            return Err(ButaneError::invalid(
                join(at, set[1]),
                format!("only one of {} can be set", set.join(", ")),
            ));
        }
        let compression = match raw.compression.as_deref() {
            None | Some("") => None,
            Some("gzip") => Some(Compression::Gzip),
            Some(other) => {
                return Err(ButaneError::invalid(
                    join(at, "compression"),
                    format!("unsupported compression {other:?} (only gzip)"),
                ));
            }
        };
        let hash = raw.verification.and_then(|v| v.hash);
        if hash.is_some() && raw.source.is_none() {
            return Err(ButaneError::invalid(
                join(at, "verification.hash"),
                "verification needs a source URL",
            ));
        }
        let data = if let Some(inline) = raw.inline {
            inline.into_bytes()
        } else if let Some(local) = raw.local {
            self.read_local(&join(at, "local"), &local)?
        } else if let Some(source) = raw.source {
            return Ok(Some(Contents::Remote {
                source,
                compression,
                verification: hash,
            }));
        } else {
            if compression.is_some() {
                return Err(ButaneError::invalid(
                    join(at, "compression"),
                    "compression needs inline, local or source",
                ));
            }
            return Ok(None);
        };
        Ok(Some(Contents::Data { data, compression }))
    }

    /// A unit's or drop-in's `contents` or `contents_local`.
    fn text(
        &self,
        at: &str,
        contents: Option<String>,
        local: Option<String>,
    ) -> Result<Option<String>, ButaneError> {
        match (contents, local) {
            (Some(_), Some(_)) => Err(ButaneError::invalid(
                join(at, "contents_local"),
                "only one of contents, contents_local can be set",
            )),
            (Some(c), None) => Ok(Some(c)),
            (None, Some(name)) => {
                let path = join(at, "contents_local");
                let bytes = self.read_local(&path, &name)?;
                String::from_utf8(bytes).map(Some).map_err(|_| {
                    ButaneError::invalid(path, format!("local file {name:?} is not UTF-8 text"))
                })
            }
            (None, None) => Ok(None),
        }
    }

    /// Reads `name`, relative to the files directory and not escaping it.
    fn read_local(&self, at: &str, name: &str) -> Result<Vec<u8>, ButaneError> {
        let Some(dir) = self.files_dir else {
            return Err(ButaneError::invalid(
                at,
                format!(
                    "local file {name:?} needs a files directory (Butane's --files-dir) to be \
                     relative to"
                ),
            ));
        };
        let rel = Path::new(name);
        let mut depth = 0usize;
        for c in rel.components() {
            match c {
                Component::Normal(_) => depth += 1,
                Component::CurDir => {}
                Component::ParentDir if depth > 0 => depth -= 1,
                Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                    return Err(ButaneError::invalid(
                        at,
                        format!(
                            "local file {name:?} must be a relative path inside the files \
                             directory"
                        ),
                    ));
                }
            }
        }
        let file = dir.join(rel);
        std::fs::read(&file).map_err(|cause| ButaneError::LocalFile {
            path: at.to_string(),
            name: rel.to_path_buf(),
            file,
            cause,
        })
    }
}

fn field_error(at: &str, e: FieldError) -> ButaneError {
    ButaneError::invalid(join(at, &e.field), e.message)
}

fn owner(at: &str, raw: Option<RawOwner>) -> Result<Option<Owner>, ButaneError> {
    let Some(raw) = raw else { return Ok(None) };
    match (raw.id, raw.name) {
        (Some(_), Some(_)) => Err(ButaneError::invalid(at, "set id or name, not both")),
        (Some(id), None) => u32::try_from(id)
            .map(|id| Some(Owner::Id(id)))
            .map_err(|_| ButaneError::invalid(join(at, "id"), format!("id {id} is out of range"))),
        (None, Some(name)) => Ok(Some(Owner::Name(name))),
        (None, None) => Ok(None),
    }
}

/// Butane's `CheckForDecimalMode`: `mode` is odd as written but its decimal digits, read as
/// octal, make a typical mode (`644` → `0o644`).
fn looks_decimal(mode: u32, directory: bool) -> bool {
    if mode > 7777 {
        return false;
    }
    let mut corrected = 0;
    let mut divisor = 1000;
    while divisor > 0 {
        let digit = (mode / divisor) % 10;
        if digit > 7 {
            return false;
        }
        corrected = (corrected << 3) | digit;
        divisor /= 10;
    }
    !is_typical_mode(mode, directory) && is_typical_mode(corrected, directory)
}

/// Butane's `isTypicalMode`.
fn is_typical_mode(mode: u32, directory: bool) -> bool {
    if mode == 0 {
        return true;
    }
    let (mut had_r, mut had_w, mut had_x) = (false, false, false);
    for perm in [mode & 0o7, (mode >> 3) & 0o7, (mode >> 6) & 0o7] {
        let (r, w, x) = (perm & 4 != 0, perm & 2 != 0, perm & 1 != 0);
        if (!r && had_r) || (!w && had_w) || (!x && had_x) {
            return false;
        }
        if x && had_r && !had_x {
            return false;
        }
        if (w || x) && !r {
            return false;
        }
        had_r |= r;
        had_w |= w;
        had_x |= x;
    }
    if !had_r {
        return false;
    }
    if directory {
        had_x && mode & 0o4000 == 0 && (mode & 0o3000 == 0 || had_w)
    } else {
        if mode & 0o6000 != 0 && (!had_x || mode & 0o2 != 0) {
            return false;
        }
        mode & 0o1000 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "variant: flatcar\nversion: 1.1.0\n";

    fn parse(body: &str) -> Result<Config, ButaneError> {
        parse_butane(&format!("{HEAD}{body}"), None)
    }

    fn err(body: &str) -> String {
        parse(body).unwrap_err().to_string()
    }

    fn files_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("motd"), "hello from a local file\n").unwrap();
        std::fs::create_dir(dir.path().join("units")).unwrap();
        std::fs::write(
            dir.path().join("units/agent.service"),
            "[Service]\nExecStart=/bin/true\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("blob.gz"), crate::dataurl::gzip(b"zipped")).unwrap();
        dir
    }

    #[test]
    fn minimal_documents_of_both_versions() {
        for v in ["1.0.0", "1.1.0"] {
            let c = parse_butane(&format!("variant: flatcar\nversion: {v}\n"), None).unwrap();
            assert!(c.is_empty());
        }
    }

    #[test]
    fn variant_and_version_are_checked() {
        let e = parse_butane("variant: fcos\nversion: 1.5.0\n", None).unwrap_err();
        assert_eq!(e.path(), "variant");
        assert!(
            e.to_string().contains("unsupported variant \"fcos\""),
            "{e}"
        );
        let e = parse_butane("variant: flatcar\nversion: 1.2.0-experimental\n", None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "version: unsupported version \"1.2.0-experimental\" of variant flatcar \
             (supported: 1.0.0, 1.1.0)"
        );
        let e = parse_butane("version: 1.1.0\n", None).unwrap_err();
        assert_eq!(e.to_string(), "variant: missing required field");
    }

    #[test]
    fn files_with_inline_contents_mode_owner_overwrite() {
        let c = parse(
            "storage:\n  files:\n    - path: /etc/hostname\n      mode: 0644\n      overwrite: true\n      user:\n        id: 0\n      group:\n        name: root\n      contents:\n        inline: node1\n",
        )
        .unwrap();
        let f = &c.files()[0];
        assert_eq!(f.path, "/etc/hostname");
        assert_eq!(f.mode, Some(0o644));
        assert_eq!(f.overwrite, Some(true));
        assert_eq!(f.user, Some(Owner::Id(0)));
        assert_eq!(f.group, Some(Owner::Name("root".into())));
        assert_eq!(f.contents, Some(Contents::data("node1")));
    }

    #[test]
    fn modes_are_read_like_go_yaml() {
        for (written, want) in [
            ("0644", 0o644),
            ("0o750", 0o750),
            ("0x1ed", 0o755),
            ("420", 420),
        ] {
            let c = parse(&format!(
                "storage:\n  files:\n    - path: /a\n      mode: {written}\n"
            ))
            .unwrap();
            assert_eq!(c.files()[0].mode, Some(want), "{written}");
        }
    }

    #[test]
    fn file_without_contents_and_empty_inline() {
        let c = parse(
            "storage:\n  files:\n    - path: /a\n    - path: /b\n      contents:\n        inline: \"\"\n",
        )
        .unwrap();
        assert_eq!(c.files()[0].contents, None);
        assert_eq!(c.files()[1].contents, Some(Contents::data("")));
    }

    #[test]
    fn plain_scalars_are_strings_where_strings_are_expected() {
        let c =
            parse("storage:\n  files:\n    - path: /a\n      contents:\n        inline: 0644\n")
                .unwrap();
        assert_eq!(c.files()[0].contents, Some(Contents::data("0644")));
    }

    #[test]
    fn local_contents_come_from_the_files_dir() {
        let dir = files_dir();
        let c = parse_butane(
            &format!(
                "{HEAD}storage:\n  files:\n    - path: /etc/motd\n      contents:\n        local: ./motd\n    - path: /opt/blob\n      contents:\n        local: blob.gz\n        compression: gzip\n"
            ),
            Some(dir.path()),
        )
        .unwrap();
        assert_eq!(
            c.files()[0].contents,
            Some(Contents::data("hello from a local file\n"))
        );
        assert_eq!(
            c.files()[1].contents,
            Some(Contents::Data {
                data: crate::dataurl::gzip(b"zipped"),
                compression: Some(Compression::Gzip)
            })
        );
    }

    #[test]
    fn a_missing_local_file_is_named() {
        let dir = files_dir();
        let e = parse_butane(
            &format!("{HEAD}storage:\n  files:\n    - path: /a\n      contents:\n        local: nothere.txt\n"),
            Some(dir.path()),
        )
        .unwrap_err();
        assert_eq!(e.path(), "storage.files[0].contents.local");
        let msg = e.to_string();
        assert!(
            msg.starts_with(
                "storage.files[0].contents.local: cannot read local file nothere.txt ("
            ),
            "{msg}"
        );
        assert!(
            msg.contains(&dir.path().join("nothere.txt").display().to_string()),
            "{msg}"
        );
        assert!(
            matches!(e, ButaneError::LocalFile { ref cause, .. } if cause.kind() == std::io::ErrorKind::NotFound)
        );
        // The OS error is in the message and not a `source()` too, or a chain printer (anyhow's
        // `{:#}`) would print it twice.
        let os = std::fs::read(dir.path().join("nothere.txt"))
            .unwrap_err()
            .to_string();
        assert_eq!(msg.matches(&os).count(), 1, "{msg}");
        assert!(std::error::Error::source(&e).is_none(), "{msg}");
    }

    #[test]
    fn local_needs_a_files_dir_and_stays_inside_it() {
        let body = "storage:\n  files:\n    - path: /a\n      contents:\n        local: motd\n";
        let e = parse(body).unwrap_err();
        assert_eq!(e.path(), "storage.files[0].contents.local");
        assert!(e.to_string().contains("needs a files directory"), "{e}");
        let dir = files_dir();
        for name in ["../motd", "/etc/passwd", "units/../../motd"] {
            let e = parse_butane(
                &format!("{HEAD}storage:\n  files:\n    - path: /a\n      contents:\n        local: {name}\n"),
                Some(dir.path()),
            )
            .unwrap_err();
            assert!(
                e.to_string().contains("inside the files directory"),
                "{name}: {e}"
            );
        }
        // `..` that stays inside is fine.
        parse_butane(
            &format!("{HEAD}storage:\n  files:\n    - path: /a\n      contents:\n        local: units/../motd\n"),
            Some(dir.path()),
        )
        .unwrap();
    }

    #[test]
    fn remote_source_with_compression_and_verification() {
        let hash = format!("sha512-{}", "a".repeat(128));
        let c = parse(&format!(
            "storage:\n  files:\n    - path: /opt/bin/tool\n      mode: 0755\n      contents:\n        source: https://example.com/tool.gz\n        compression: gzip\n        verification:\n          hash: {hash}\n"
        ))
        .unwrap();
        assert_eq!(
            c.files()[0].contents,
            Some(Contents::Remote {
                source: "https://example.com/tool.gz".into(),
                compression: Some(Compression::Gzip),
                verification: Some(hash),
            })
        );
    }

    #[test]
    fn contents_errors() {
        assert_eq!(
            err(
                "storage:\n  files:\n    - path: /a\n      contents:\n        inline: x\n        local: y\n"
            ),
            "storage.files[0].contents.local: only one of inline, local can be set"
        );
        assert_eq!(
            err(
                "storage:\n  files:\n    - path: /a\n      contents:\n        inline: x\n        source: https://x/y\n"
            ),
            "storage.files[0].contents.source: only one of inline, source can be set"
        );
        assert_eq!(
            err(
                "storage:\n  files:\n    - path: /a\n      contents:\n        inline: x\n        compression: xz\n"
            ),
            "storage.files[0].contents.compression: unsupported compression \"xz\" (only gzip)"
        );
        assert_eq!(
            err(
                "storage:\n  files:\n    - path: /a\n      contents:\n        inline: x\n        verification:\n          hash: sha512-00\n"
            ),
            "storage.files[0].contents.verification.hash: verification needs a source URL"
        );
        assert!(
            err("storage:\n  files:\n    - path: /a\n      contents:\n        source: https://x/y\n        verification:\n          hash: sha512-00\n")
                .starts_with("storage.files[0].contents.verification.hash: hash \"sha512-00\" is not")
        );
        assert!(
            err("storage:\n  files:\n    - path: /a\n      contents:\n        source: file:///etc/passwd\n")
                .starts_with("storage.files[0].contents.source: unsupported URL")
        );
    }

    #[test]
    fn unknown_fields_are_errors_with_their_path() {
        let e = parse(
            "storage:\n  files:\n    - path: /a\n    - path: /b\n    - path: /c\n      contnets:\n        inline: x\n",
        )
        .unwrap_err();
        assert!(matches!(e, ButaneError::UnknownField { .. }));
        assert_eq!(e.path(), "storage.files[2].contnets");
        assert_eq!(e.to_string(), "storage.files[2].contnets: unknown field");
        assert_eq!(err("extra: 1\n"), "extra: unknown field");
        assert_eq!(err("storage:\n  file: []\n"), "storage.file: unknown field");
        assert_eq!(
            err("storage:\n  files:\n    - path: /a\n      contents:\n        inlined: x\n"),
            "storage.files[0].contents.inlined: unknown field"
        );
        assert_eq!(
            err(
                "systemd:\n  units:\n    - name: a.service\n      dropins:\n        - name: a.conf\n          content: x\n"
            ),
            "systemd.units[0].dropins[0].content: unknown field"
        );
        assert_eq!(
            err("passwd:\n  users:\n    - name: u\n      ssh_keys: []\n"),
            "passwd.users[0].ssh_keys: unknown field"
        );
        assert_eq!(
            err("storage:\n  links:\n    - path: /a\n      target: b\n      user: {uid: 0}\n"),
            "storage.links[0].user.uid: unknown field"
        );
    }

    #[test]
    fn butane_fields_not_implemented_are_unsupported_not_ignored() {
        for (body, path) in [
            ("storage:\n  disks: []\n", "storage.disks"),
            (
                "storage:\n  files:\n    - path: /a\n      append: []\n",
                "storage.files[0].append",
            ),
            ("ignition:\n  config: {}\n", "ignition"),
            (
                "passwd:\n  users:\n    - name: u\n      primary_group: g\n",
                "passwd.users[0].primary_group",
            ),
        ] {
            let e = parse(body).unwrap_err();
            assert!(matches!(e, ButaneError::UnsupportedField { .. }), "{e}");
            assert_eq!(e.path(), path);
        }
    }

    #[test]
    fn type_errors_name_the_field() {
        assert_eq!(
            err("storage:\n  files:\n    - path: /a\n      mode: rw-r--r--\n"),
            "storage.files[0].mode: expected an integer (octal modes start with 0, e.g. 0644)"
        );
        assert_eq!(
            err("storage:\n  files:\n    - path: /a\n      overwrite: maybe\n"),
            "storage.files[0].overwrite: expected true or false"
        );
        assert_eq!(
            err("storage:\n  files: {}\n"),
            "storage.files: expected a list"
        );
        assert_eq!(err("storage: [1]\n"), "storage: expected a mapping");
        assert_eq!(
            parse_butane("- a\n", None).unwrap_err().to_string(),
            "document: expected a mapping"
        );
    }

    #[test]
    fn yaml_syntax_errors_carry_a_line() {
        let e = parse("storage:\n  files:\n    - path: /a\n     mode: 0644\n").unwrap_err();
        assert!(
            matches!(e, ButaneError::Syntax { line: Some(6), .. }),
            "{e:?}"
        );
        assert!(e.to_string().starts_with("invalid YAML at line 6"), "{e}");
        let e = parse("---\nvariant: flatcar\n").unwrap_err();
        assert!(e.to_string().contains("single YAML document"), "{e}");
        assert!(matches!(
            parse_butane("", None).unwrap_err(),
            ButaneError::Syntax { .. }
        ));
    }

    #[test]
    fn duplicate_yaml_keys_are_errors() {
        assert_eq!(
            err("storage:\n  files:\n    - path: /a\n      mode: 0644\n      mode: 0600\n"),
            "storage.files[0].mode: duplicate key"
        );
    }

    #[test]
    fn missing_required_fields() {
        assert_eq!(
            err("storage:\n  files:\n    - mode: 0644\n"),
            "storage.files[0].path: missing required field"
        );
        assert_eq!(
            err("storage:\n  links:\n    - path: /a\n"),
            "storage.links[0].target: missing required field"
        );
        assert_eq!(
            err("systemd:\n  units:\n    - enabled: true\n"),
            "systemd.units[0].name: missing required field"
        );
        assert_eq!(
            err("systemd:\n  units:\n    - name: \"\"\n"),
            "systemd.units[0].name: a unit needs a name"
        );
        assert_eq!(
            err("passwd:\n  users:\n    - groups: [sudo]\n"),
            "passwd.users[0].name: missing required field"
        );
    }

    #[test]
    fn modes_out_of_range() {
        assert_eq!(
            err("storage:\n  files:\n    - path: /a\n      mode: 010000\n"),
            "storage.files[0].mode: mode 0o10000 is out of range (0 to 0o7777)"
        );
        assert_eq!(
            err("storage:\n  directories:\n    - path: /a\n      mode: -1\n"),
            "storage.directories[0].mode: mode -0o1 is out of range (0 to 0o7777)"
        );
        parse("storage:\n  files:\n    - path: /a\n      mode: 07777\n").unwrap();
    }

    #[test]
    fn relative_and_unclean_paths() {
        assert_eq!(
            err("storage:\n  files:\n    - path: etc/hostname\n"),
            "storage.files[0].path: path \"etc/hostname\" is relative; it must be absolute"
        );
        assert_eq!(
            err("storage:\n  directories:\n    - path: /var/lib/\n"),
            "storage.directories[0].path: path \"/var/lib/\" is not clean; write it as \"/var/lib\""
        );
        assert_eq!(
            err("storage:\n  links:\n    - path: ./l\n      target: /x\n"),
            "storage.links[0].path: path \"./l\" is relative; it must be absolute"
        );
    }

    #[test]
    fn duplicate_paths_across_files_directories_links() {
        assert_eq!(
            err("storage:\n  files:\n    - path: /a\n    - path: /a\n"),
            "storage.files[1].path: duplicate path /a (first defined at storage.files[0].path)"
        );
        let e = parse("storage:\n  files:\n    - path: /a\n  directories:\n    - path: /a\n")
            .unwrap_err();
        assert!(matches!(
            &e,
            ButaneError::Duplicate { entry: Entry::Directory(p), first, .. }
                if p == "/a" && first == "storage.files[0].path"
        ));
        assert_eq!(
            err(
                "storage:\n  directories:\n    - path: /d\n  links:\n    - path: /d\n      target: /x\n"
            ),
            "storage.links[0].path: duplicate path /d (first defined at storage.directories[0].path)"
        );
    }

    #[test]
    fn owners() {
        assert_eq!(
            err(
                "storage:\n  files:\n    - path: /a\n      user:\n        id: 0\n        name: root\n"
            ),
            "storage.files[0].user: set id or name, not both"
        );
        assert_eq!(
            err("storage:\n  files:\n    - path: /a\n      group:\n        id: -5\n"),
            "storage.files[0].group.id: id -5 is out of range"
        );
        let c = parse("storage:\n  directories:\n    - path: /d\n      user: {name: core}\n      group: {id: 500}\n").unwrap();
        assert_eq!(c.directories()[0].user, Some(Owner::Name("core".into())));
        assert_eq!(c.directories()[0].group, Some(Owner::Id(500)));
    }

    #[test]
    fn directories_and_links() {
        let c = parse(
            "storage:\n  directories:\n    - path: /var/lib/agent\n      mode: 0700\n      overwrite: true\n  links:\n    - path: /etc/localtime\n      target: ../usr/share/zoneinfo/UTC\n      overwrite: true\n    - path: /opt/h\n      target: /etc/hostname\n      hard: true\n",
        )
        .unwrap();
        assert_eq!(
            c.directories()[0],
            Directory::new("/var/lib/agent")
                .with_mode(0o700)
                .with_overwrite(true)
        );
        assert_eq!(
            c.links()[0],
            Link::new("/etc/localtime", "../usr/share/zoneinfo/UTC").with_overwrite(true)
        );
        assert!(c.links()[1].is_hard());
    }

    #[test]
    fn tree_conflicts_have_yaml_paths() {
        let e = parse(
            "storage:\n  files:\n    - path: /etc/l/x\n  links:\n    - path: /etc/l\n      target: /tmp\n",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "storage.files[0]: file /etc/l/x is below link /etc/l"
        );
        let e = parse(
            "storage:\n  files:\n    - path: /etc/systemd/system/a.service\nsystemd:\n  units:\n    - name: a.service\n      contents: \"[Service]\\n\"\n",
        )
        .unwrap_err();
        assert_eq!(e.path(), "storage.files[0]");
        assert!(
            e.to_string().contains("Ignition writes unit a.service to"),
            "{e}"
        );
        assert_eq!(
            err("storage:\n  files:\n    - path: /a\n      overwrite: true\n"),
            "storage.files[0].overwrite: overwrite needs contents (Ignition refuses overwrite without a source)"
        );
    }

    #[test]
    fn units_with_dropins_enabled_masked() {
        let c = parse(
            "systemd:\n  units:\n    - name: agent.service\n      enabled: true\n      contents: |\n        [Service]\n        ExecStart=/bin/true\n        [Install]\n        WantedBy=multi-user.target\n      dropins:\n        - name: 10-env.conf\n          contents: |\n            [Service]\n            Environment=A=1\n    - name: docker.service\n      mask: true\n    - name: sshd.socket\n      enabled: false\n",
        )
        .unwrap();
        let u = &c.units()[0];
        assert_eq!(u.enabled, Some(true));
        assert!(
            u.contents
                .as_deref()
                .unwrap()
                .contains("ExecStart=/bin/true\n[Install]")
        );
        assert_eq!(
            u.dropins,
            [Dropin::new("10-env.conf", "[Service]\nEnvironment=A=1\n")]
        );
        assert_eq!(c.units()[1], Unit::new("docker.service").with_mask(true));
        assert_eq!(c.units()[2], Unit::new("sshd.socket").with_enabled(false));
    }

    #[test]
    fn unit_contents_local() {
        let dir = files_dir();
        let c = parse_butane(
            &format!("{HEAD}systemd:\n  units:\n    - name: agent.service\n      contents_local: units/agent.service\n      dropins:\n        - name: 10-a.conf\n          contents_local: units/agent.service\n"),
            Some(dir.path()),
        )
        .unwrap();
        assert_eq!(
            c.units()[0].contents.as_deref(),
            Some("[Service]\nExecStart=/bin/true\n")
        );
        assert_eq!(
            c.units()[0].dropins[0].contents.as_deref(),
            Some("[Service]\nExecStart=/bin/true\n")
        );
        let e = parse_butane(
            &format!("{HEAD}systemd:\n  units:\n    - name: a.service\n      contents: x\n      contents_local: units/agent.service\n"),
            Some(dir.path()),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "systemd.units[0].contents_local: only one of contents, contents_local can be set"
        );
        let e = parse_butane(
            &format!(
                "{HEAD}systemd:\n  units:\n    - name: a.service\n      contents_local: blob.gz\n"
            ),
            Some(dir.path()),
        )
        .unwrap_err();
        assert!(e.to_string().contains("is not UTF-8 text"), "{e}");
    }

    #[test]
    fn unit_errors() {
        assert_eq!(
            err("systemd:\n  units:\n    - name: agent\n"),
            "systemd.units[0].name: unit name \"agent\" must end in one of .service, .socket, .device, .mount, .automount, .swap, .target, .path, .timer, .snapshot, .slice, .scope"
        );
        assert_eq!(
            err("systemd:\n  units:\n    - name: a.service\n    - name: a.service\n"),
            "systemd.units[1].name: duplicate unit a.service (first defined at systemd.units[0].name)"
        );
        assert_eq!(
            err("systemd:\n  units:\n    - name: a.service\n      dropins:\n        - name: x\n"),
            "systemd.units[0].dropins[0].name: drop-in name \"x\" must end in .conf"
        );
        assert_eq!(
            err(
                "systemd:\n  units:\n    - name: a.service\n      dropins:\n        - name: x.conf\n        - name: x.conf\n"
            ),
            "systemd.units[0].dropins[1].name: duplicate drop-in \"x.conf\" (also dropins[0])"
        );
    }

    #[test]
    fn users() {
        let c = parse(
            "passwd:\n  users:\n    - name: azureuser\n      uid: 1000\n      ssh_authorized_keys:\n        - ssh-ed25519 AAAAC3Nza harness\n      groups: [sudo, docker]\n      password_hash: \"$6$rounds=4096$x$y\"\n      home_dir: /home/azureuser\n      shell: /bin/bash\n",
        )
        .unwrap();
        assert_eq!(
            c.users()[0],
            User::new("azureuser")
                .with_uid(1000)
                .with_ssh_key("ssh-ed25519 AAAAC3Nza harness")
                .with_group("sudo")
                .with_group("docker")
                .with_password_hash("$6$rounds=4096$x$y")
                .with_home_dir("/home/azureuser")
                .with_shell("/bin/bash")
        );
        assert_eq!(
            err("passwd:\n  users:\n    - name: u\n    - name: u\n"),
            "passwd.users[1].name: duplicate user u (first defined at passwd.users[0].name)"
        );
        assert_eq!(
            err("passwd:\n  users:\n    - name: u\n      uid: -1\n"),
            "passwd.users[0].uid: uid -1 is out of range"
        );
    }

    #[test]
    fn decimal_looking_modes_warn_like_butane() {
        let (_, w) = parse_butane_with_warnings(
            &format!("{HEAD}storage:\n  files:\n    - path: /a\n      mode: 644\n    - path: /b\n      mode: 0644\n    - path: /c\n      mode: 420\n  directories:\n    - path: /d\n      mode: 755\n"),
            None,
        )
        .unwrap();
        let paths: Vec<_> = w.iter().map(|w| w.path.as_str()).collect();
        assert_eq!(
            paths,
            ["storage.files[0].mode", "storage.directories[0].mode"]
        );
        assert!(w[0].to_string().contains("meant as octal 0644"), "{}", w[0]);
    }

    #[test]
    fn typical_modes() {
        for m in [0, 0o644, 0o600, 0o755, 0o700, 0o444, 0o640, 0o4755] {
            assert!(is_typical_mode(m, false), "{m:o}");
        }
        for m in [0o1204, 0o1363, 0o046, 0o200, 0o1644] {
            assert!(!is_typical_mode(m, false), "{m:o}");
        }
        assert!(is_typical_mode(0o1777, true));
        assert!(!is_typical_mode(0o644, true));
    }
}
