//! Ignition JSON (spec 3.0.0 to 3.4.0) read into a [`Config`]: the same subset the model has
//! (files, directories, links, systemd units with drop-ins, users). A field outside it (disks,
//! filesystems, `ignition.config` merges, kernel arguments, groups, …) is an error naming it,
//! never dropped: a config read here and rendered again says what it said, or nothing.
//!
//! File contents stay the URLs they are (`data:` URLs included), with their compression and
//! verification, so the rendering carries them unchanged.

use serde::Deserialize;

use crate::config::{Config, ConfigError};
use crate::dataurl;
use crate::model::{Compression, Contents, Directory, Dropin, File, Link, Owner, Unit, User};

/// The spec versions read: every 3.x up to the newest this crate renders.
pub const READ_VERSIONS: &[&str] = &["3.0.0", "3.1.0", "3.2.0", "3.3.0", "3.4.0"];

/// Why an Ignition config was refused. `path` is the JSON path of the field at fault
/// (`storage.files[2].mode`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IgnitionError {
    /// Not JSON, or a field of the wrong type, or a field outside the subset read.
    #[error("{}: {message}", show(path))]
    Invalid {
        /// JSON path of the field (empty for the document).
        path: String,
        /// What is wrong (serde's message, with the line and column).
        message: String,
    },
    /// `ignition.version` is not one this crate reads.
    #[error(
        "ignition.version: {version:?} is not a version this reads ({})",
        READ_VERSIONS.join(", ")
    )]
    Version {
        /// The version given.
        version: String,
    },
    /// An entry is invalid or conflicts with another.
    #[error("{path}: {error}")]
    Entry {
        /// JSON path of the entry.
        path: String,
        /// The problem.
        error: Box<ConfigError>,
    },
}

fn show(path: &str) -> &str {
    if path.is_empty() || path == "." {
        "document"
    } else {
        path
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    ignition: RawIgnition,
    storage: Option<RawStorage>,
    systemd: Option<RawSystemd>,
    passwd: Option<RawPasswd>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIgnition {
    version: String,
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
    id: Option<u32>,
    name: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVerification {
    hash: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResource {
    source: Option<String>,
    compression: Option<String>,
    verification: Option<RawVerification>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    path: String,
    overwrite: Option<bool>,
    mode: Option<u32>,
    user: Option<RawOwner>,
    group: Option<RawOwner>,
    contents: Option<RawResource>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDirectory {
    path: String,
    overwrite: Option<bool>,
    mode: Option<u32>,
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
    dropins: Option<Vec<RawDropin>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDropin {
    name: String,
    contents: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPasswd {
    users: Option<Vec<RawUser>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(rename_all = "camelCase")]
struct RawUser {
    name: String,
    uid: Option<u32>,
    password_hash: Option<String>,
    ssh_authorized_keys: Option<Vec<String>>,
    groups: Option<Vec<String>>,
    home_dir: Option<String>,
    shell: Option<String>,
}

fn invalid(path: &str, message: impl Into<String>) -> IgnitionError {
    IgnitionError::Invalid {
        path: path.to_string(),
        message: message.into(),
    }
}

fn owner(path: &str, o: Option<RawOwner>) -> Result<Option<Owner>, IgnitionError> {
    match o {
        None => Ok(None),
        Some(RawOwner {
            id: Some(_),
            name: Some(_),
        }) => Err(invalid(path, "give an id or a name, not both")),
        Some(RawOwner { id: Some(id), .. }) => Ok(Some(Owner::Id(id))),
        Some(RawOwner { name: Some(n), .. }) => Ok(Some(Owner::Name(n))),
        Some(RawOwner { .. }) => Ok(None),
    }
}

fn contents(path: &str, r: Option<RawResource>) -> Result<Option<Contents>, IgnitionError> {
    let Some(r) = r else { return Ok(None) };
    let compression = match r.compression.as_deref() {
        None | Some("") => None,
        Some("gzip") => Some(Compression::Gzip),
        Some(other) => {
            return Err(invalid(
                &format!("{path}.compression"),
                format!("{other:?} is not a compression Ignition undoes (gzip)"),
            ));
        }
    };
    let verification = r.verification.and_then(|v| v.hash);
    match r.source {
        None if compression.is_none() && verification.is_none() => Ok(None),
        None => Err(invalid(
            &format!("{path}.source"),
            "compression or verification without a source",
        )),
        // An embedded payload becomes bytes again, so it renders as Butane would embed it and
        // compares equal with the same bytes from another config.
        Some(source) if source.starts_with("data:") && verification.is_none() => {
            match dataurl::decode(&source) {
                Some(data) => Ok(Some(Contents::Data { data, compression })),
                None => Err(invalid(
                    &format!("{path}.source"),
                    "a data URL whose payload does not decode",
                )),
            }
        }
        Some(source) => Ok(Some(Contents::Remote {
            source,
            compression,
            verification,
        })),
    }
}

/// Parses Ignition JSON (spec [`READ_VERSIONS`]) into a [`Config`].
pub fn parse_ignition(json: &str) -> Result<Config, IgnitionError> {
    let mut de = serde_json::Deserializer::from_str(json);
    let raw: RawConfig = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        invalid(
            &path,
            format!(
                "{} (flex-ignition reads files, directories, links, systemd units and users)",
                e.inner()
            ),
        )
    })?;
    de.end()
        .map_err(|e| invalid("", format!("trailing text: {e}")))?;
    if !READ_VERSIONS.contains(&raw.ignition.version.as_str()) {
        return Err(IgnitionError::Version {
            version: raw.ignition.version,
        });
    }
    let mut config = Config::new();
    let entry = |path: String| {
        move |error: ConfigError| IgnitionError::Entry {
            path,
            error: Box::new(error),
        }
    };
    if let Some(storage) = raw.storage {
        for (i, d) in storage
            .directories
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let p = format!("storage.directories[{i}]");
            let dir = Directory {
                path: d.path,
                overwrite: d.overwrite,
                mode: d.mode,
                user: owner(&format!("{p}.user"), d.user)?,
                group: owner(&format!("{p}.group"), d.group)?,
            };
            config.add_directory(dir).map_err(entry(p))?;
        }
        for (i, f) in storage.files.unwrap_or_default().into_iter().enumerate() {
            let p = format!("storage.files[{i}]");
            let file = File {
                path: f.path,
                overwrite: f.overwrite,
                mode: f.mode,
                user: owner(&format!("{p}.user"), f.user)?,
                group: owner(&format!("{p}.group"), f.group)?,
                contents: contents(&format!("{p}.contents"), f.contents)?,
            };
            config.add_file(file).map_err(entry(p))?;
        }
        for (i, l) in storage.links.unwrap_or_default().into_iter().enumerate() {
            let p = format!("storage.links[{i}]");
            let link = Link {
                path: l.path,
                target: l.target,
                hard: l.hard,
                overwrite: l.overwrite,
                user: owner(&format!("{p}.user"), l.user)?,
                group: owner(&format!("{p}.group"), l.group)?,
            };
            config.add_link(link).map_err(entry(p))?;
        }
    }
    if let Some(systemd) = raw.systemd {
        for (i, u) in systemd.units.unwrap_or_default().into_iter().enumerate() {
            let p = format!("systemd.units[{i}]");
            let unit = Unit {
                name: u.name,
                enabled: u.enabled,
                mask: u.mask,
                contents: u.contents,
                dropins: u
                    .dropins
                    .unwrap_or_default()
                    .into_iter()
                    .map(|d| Dropin {
                        name: d.name,
                        contents: d.contents,
                    })
                    .collect(),
            };
            config.add_unit(unit).map_err(entry(p))?;
        }
    }
    if let Some(passwd) = raw.passwd {
        for (i, u) in passwd.users.unwrap_or_default().into_iter().enumerate() {
            let p = format!("passwd.users[{i}]");
            let user = User {
                name: u.name,
                uid: u.uid,
                password_hash: u.password_hash,
                ssh_authorized_keys: u.ssh_authorized_keys.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                home_dir: u.home_dir,
                shell: u.shell,
            };
            config.add_user(user).map_err(entry(p))?;
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SpecVersion, parse_butane, to_ignition_json};

    /// A config rendered by this crate reads back to the same config, and renders to the same
    /// bytes (data URLs carried as sources).
    #[test]
    fn a_rendered_config_reads_back_and_renders_the_same() {
        let bu = "variant: flatcar\nversion: 1.1.0\npasswd:\n  users:\n    - name: core\n      ssh_authorized_keys: [\"ssh-ed25519 AAAA x\"]\n      groups: [sudo]\nstorage:\n  directories:\n    - path: /etc/d\n      mode: 0750\n  files:\n    - path: /etc/hostname\n      mode: 0644\n      overwrite: true\n      contents:\n        inline: node1\n  links:\n    - path: /etc/l\n      target: /etc/hostname\nsystemd:\n  units:\n    - name: a.service\n      enabled: true\n      contents: \"[Service]\\nExecStart=/bin/true\\n\"\n      dropins:\n        - name: 10-x.conf\n          contents: \"[Service]\\nUser=core\\n\"\n";
        let config = parse_butane(bu, None).unwrap();
        for spec in [SpecVersion::V3_3_0, SpecVersion::V3_4_0] {
            let json = to_ignition_json(&config, spec);
            let back = parse_ignition(&json).unwrap();
            assert_eq!(to_ignition_json(&back, spec), json);
        }
    }

    /// Each refused document and the words its error must contain.
    #[test]
    fn refused_documents_table() {
        let cases: &[(&str, &[&str])] = &[
            ("{", &["EOF"]),
            ("{\"ignition\":{\"version\":\"3.4.0\"}} x", &["trailing"]),
            (
                "{\"ignition\":{\"version\":\"2.3.0\"}}",
                &["ignition.version", "2.3.0"],
            ),
            (
                "{\"ignition\":{\"version\":\"3.5.0\"}}",
                &["3.5.0", "3.4.0"],
            ),
            ("{\"storage\":{}}", &["ignition"]),
            (
                "{\"ignition\":{\"version\":\"3.4.0\"},\"storage\":{\"disks\":[]}}",
                &["storage", "disks", "flex-ignition reads"],
            ),
            (
                "{\"ignition\":{\"version\":\"3.4.0\",\"config\":{}}}",
                &["ignition", "config"],
            ),
            (
                "{\"ignition\":{\"version\":\"3.4.0\"},\"kernelArguments\":{}}",
                &["kernelArguments"],
            ),
            (
                "{\"ignition\":{\"version\":\"3.4.0\"},\"storage\":{\"files\":[{\"path\":\"rel\"}]}}",
                &["storage.files[0]", "relative"],
            ),
            (
                "{\"ignition\":{\"version\":\"3.4.0\"},\"storage\":{\"files\":[{\"path\":\"/a\",\"mode\":\"x\"}]}}",
                &["storage.files[0].mode"],
            ),
            (
                "{\"ignition\":{\"version\":\"3.4.0\"},\"storage\":{\"files\":[{\"path\":\"/a\",\"contents\":{\"source\":\"data:,\",\"compression\":\"xz\"}}]}}",
                &["storage.files[0].contents.compression", "xz"],
            ),
            (
                "{\"ignition\":{\"version\":\"3.4.0\"},\"storage\":{\"files\":[{\"path\":\"/a\",\"user\":{\"id\":0,\"name\":\"root\"}}]}}",
                &["storage.files[0].user", "not both"],
            ),
            (
                "{\"ignition\":{\"version\":\"3.4.0\"},\"storage\":{\"files\":[{\"path\":\"/a\"},{\"path\":\"/a\",\"mode\":420}]}}",
                &["storage.files[1]", "conflicting", "/a"],
            ),
            (
                "{\"ignition\":{\"version\":\"3.4.0\"},\"storage\":{\"files\":[{\"path\":\"/a\",\"contents\":{\"source\":\"data:,%G0\"}}]}}",
                &["storage.files[0].contents.source", "does not decode"],
            ),
        ];
        for (json, words) in cases {
            let msg = match parse_ignition(json) {
                Ok(c) => panic!("accepted {json}: {c:?}"),
                Err(e) => e.to_string(),
            };
            for w in *words {
                assert!(msg.contains(w), "{json}: {msg:?} lacks {w:?}");
            }
        }
    }

    #[test]
    fn data_urls_become_bytes() {
        let json = r#"{"ignition":{"version":"3.3.0"},"storage":{"files":[{"path":"/a","contents":{"source":"data:,a%20b%0A"}},{"path":"/b","contents":{"source":"data:text/plain;base64,aGk=","compression":""}}]}}"#;
        let c = parse_ignition(json).unwrap();
        assert_eq!(
            c.file("/a").unwrap().contents,
            Some(Contents::data("a b\n"))
        );
        assert_eq!(c.file("/b").unwrap().contents, Some(Contents::data("hi")));
    }

    #[test]
    fn owners_and_remote_contents_are_kept() {
        let json = r#"{"ignition":{"version":"3.0.0"},"storage":{"files":[{"path":"/a","user":{"id":0},"group":{"name":"wheel"},"contents":{"source":"https://example.com/a","compression":"gzip","verification":{"hash":"sha256-0000000000000000000000000000000000000000000000000000000000000000"}}}]}}"#;
        let c = parse_ignition(json).unwrap();
        let f = c.file("/a").unwrap();
        assert_eq!(f.user, Some(Owner::Id(0)));
        assert_eq!(f.group, Some(Owner::Name("wheel".into())));
        assert_eq!(
            f.contents,
            Some(Contents::Remote {
                source: "https://example.com/a".into(),
                compression: Some(Compression::Gzip),
                verification: Some(
                    "sha256-0000000000000000000000000000000000000000000000000000000000000000"
                        .into()
                ),
            })
        );
    }
}
