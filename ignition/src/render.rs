//! Rendering a [`Config`] as Ignition JSON.
//!
//! The serde structs below mirror Ignition's Go types (`config/v3_4/types/schema.go`) field for
//! field, in the same (alphabetical) order, so the output reads like Butane's: optional fields
//! that are unset are left out, never `null`. Embedded contents become data URLs with
//! [`crate::dataurl::encode`]; like Butane, such a resource always carries `compression`
//! (`""` or `"gzip"`) so that a config merged over it cannot impose a compression of its own.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::config::Config;
use crate::dataurl;
use crate::model::{Contents, Directory, Dropin, File, Link, Owner, Unit, User};

/// The Ignition spec version a config is rendered for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum SpecVersion {
    /// `3.3.0`: Butane `flatcar` 1.0.0; the newest that Debian bookworm's `ignition-validate`
    /// (2.14) knows.
    V3_3_0,
    /// `3.4.0`: Butane `flatcar` 1.1.0; the default.
    #[default]
    V3_4_0,
}

impl SpecVersion {
    /// Every supported version, oldest first.
    pub const ALL: [SpecVersion; 2] = [SpecVersion::V3_3_0, SpecVersion::V3_4_0];

    /// The `ignition.version` string.
    pub fn as_str(self) -> &'static str {
        match self {
            SpecVersion::V3_3_0 => "3.3.0",
            SpecVersion::V3_4_0 => "3.4.0",
        }
    }
}

impl fmt::Display for SpecVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An Ignition spec version this crate does not render.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported Ignition spec version {0:?} (supported: 3.3.0, 3.4.0)")]
pub struct UnsupportedSpecVersion(pub String);

impl FromStr for SpecVersion {
    type Err = UnsupportedSpecVersion;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SpecVersion::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| UnsupportedSpecVersion(s.to_string()))
    }
}

/// Renders `config` as pretty-printed Ignition JSON (two-space indent, trailing newline) for
/// `version`. Equal configs give equal bytes.
pub fn to_ignition_json(config: &Config, version: SpecVersion) -> String {
    let doc = IgnConfig::new(config, version);
    // Plain structs with string keys and derived `Serialize`: serde_json cannot fail on them.
    let mut json = serde_json::to_string_pretty(&doc)
        .unwrap_or_else(|e| unreachable!("serializing Ignition structs failed: {e}"));
    json.push('\n');
    json
}

#[derive(Serialize)]
struct IgnConfig<'a> {
    ignition: IgnIgnition,
    #[serde(skip_serializing_if = "Option::is_none")]
    passwd: Option<IgnPasswd<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    storage: Option<IgnStorage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    systemd: Option<IgnSystemd<'a>>,
}

#[derive(Serialize)]
struct IgnIgnition {
    version: &'static str,
}

#[derive(Serialize)]
struct IgnPasswd<'a> {
    users: Vec<IgnUser<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct IgnUser<'a> {
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    groups: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    home_dir: Option<&'a str>,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    password_hash: Option<&'a str>,
    #[serde(rename = "sshAuthorizedKeys", skip_serializing_if = "<[_]>::is_empty")]
    ssh_authorized_keys: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    shell: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    uid: Option<u32>,
}

#[derive(Serialize)]
struct IgnStorage<'a> {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    directories: Vec<IgnDirectory<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    files: Vec<IgnFile<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    links: Vec<IgnLink<'a>>,
}

#[derive(Serialize)]
struct IgnOwner<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
}

impl<'a> IgnOwner<'a> {
    fn new(owner: Option<&'a Owner>) -> Option<Self> {
        owner.map(|o| match o {
            Owner::Id(id) => IgnOwner {
                id: Some(*id),
                name: None,
            },
            Owner::Name(n) => IgnOwner {
                id: None,
                name: Some(n),
            },
        })
    }
}

/// Ignition's `Node` fields, flattened into files, directories and links in Go's order.
#[derive(Serialize)]
struct IgnNode<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<IgnOwner<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    overwrite: Option<bool>,
    path: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<IgnOwner<'a>>,
}

impl<'a> IgnNode<'a> {
    fn new(
        path: &'a str,
        overwrite: Option<bool>,
        user: Option<&'a Owner>,
        group: Option<&'a Owner>,
    ) -> Self {
        IgnNode {
            group: IgnOwner::new(group),
            overwrite,
            path,
            user: IgnOwner::new(user),
        }
    }
}

#[derive(Serialize)]
struct IgnFile<'a> {
    #[serde(flatten)]
    node: IgnNode<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    contents: Option<IgnResource<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<u32>,
}

#[derive(Serialize)]
struct IgnResource<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    compression: Option<&'static str>,
    source: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    verification: Option<IgnVerification<'a>>,
}

#[derive(Serialize)]
struct IgnVerification<'a> {
    hash: &'a str,
}

impl<'a> IgnResource<'a> {
    fn new(contents: &'a Contents) -> Self {
        match contents {
            Contents::Data {
                data,
                compression: None,
            } => {
                let url = dataurl::encode(data, true);
                IgnResource {
                    compression: Some(if url.gzipped { "gzip" } else { "" }),
                    source: url.url,
                    verification: None,
                }
            }
            Contents::Data {
                data,
                compression: Some(c),
            } => IgnResource {
                compression: Some(c.as_str()),
                source: dataurl::encode(data, false).url,
                verification: None,
            },
            Contents::Remote {
                source,
                compression,
                verification,
            } => IgnResource {
                compression: compression.map(|c| c.as_str()),
                source: source.clone(),
                verification: verification.as_deref().map(|hash| IgnVerification { hash }),
            },
        }
    }
}

#[derive(Serialize)]
struct IgnDirectory<'a> {
    #[serde(flatten)]
    node: IgnNode<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<u32>,
}

#[derive(Serialize)]
struct IgnLink<'a> {
    #[serde(flatten)]
    node: IgnNode<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hard: Option<bool>,
    target: &'a str,
}

#[derive(Serialize)]
struct IgnSystemd<'a> {
    units: Vec<IgnUnit<'a>>,
}

#[derive(Serialize)]
struct IgnUnit<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    contents: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    dropins: Vec<IgnDropin<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mask: Option<bool>,
    name: &'a str,
}

#[derive(Serialize)]
struct IgnDropin<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    contents: Option<&'a str>,
    name: &'a str,
}

impl<'a> IgnConfig<'a> {
    fn new(config: &'a Config, version: SpecVersion) -> Self {
        let storage = IgnStorage {
            directories: config.directories().iter().map(directory).collect(),
            files: config.files().iter().map(file).collect(),
            links: config.links().iter().map(link).collect(),
        };
        let has_storage = !(storage.directories.is_empty()
            && storage.files.is_empty()
            && storage.links.is_empty());
        IgnConfig {
            ignition: IgnIgnition {
                version: version.as_str(),
            },
            passwd: (!config.users().is_empty()).then(|| IgnPasswd {
                users: config.users().iter().map(user).collect(),
            }),
            storage: has_storage.then_some(storage),
            systemd: (!config.units().is_empty()).then(|| IgnSystemd {
                units: config.units().iter().map(unit).collect(),
            }),
        }
    }
}

fn file(f: &File) -> IgnFile<'_> {
    IgnFile {
        node: IgnNode::new(&f.path, f.overwrite, f.user.as_ref(), f.group.as_ref()),
        contents: f.contents.as_ref().map(IgnResource::new),
        mode: f.mode,
    }
}

fn directory(d: &Directory) -> IgnDirectory<'_> {
    IgnDirectory {
        node: IgnNode::new(&d.path, d.overwrite, d.user.as_ref(), d.group.as_ref()),
        mode: d.mode,
    }
}

fn link(l: &Link) -> IgnLink<'_> {
    IgnLink {
        node: IgnNode::new(&l.path, l.overwrite, l.user.as_ref(), l.group.as_ref()),
        hard: l.hard,
        target: &l.target,
    }
}

fn unit(u: &Unit) -> IgnUnit<'_> {
    IgnUnit {
        contents: u.contents.as_deref(),
        dropins: u.dropins.iter().map(dropin).collect(),
        enabled: u.enabled,
        mask: u.mask,
        name: &u.name,
    }
}

fn dropin(d: &Dropin) -> IgnDropin<'_> {
    IgnDropin {
        contents: d.contents.as_deref(),
        name: &d.name,
    }
}

fn user(u: &User) -> IgnUser<'_> {
    IgnUser {
        groups: &u.groups,
        home_dir: u.home_dir.as_deref(),
        name: &u.name,
        password_hash: u.password_hash.as_deref(),
        ssh_authorized_keys: &u.ssh_authorized_keys,
        shell: u.shell.as_deref(),
        uid: u.uid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Compression;

    #[test]
    fn empty_config_is_just_the_version() {
        let c = Config::new();
        assert_eq!(
            to_ignition_json(&c, SpecVersion::V3_4_0),
            "{\n  \"ignition\": {\n    \"version\": \"3.4.0\"\n  }\n}\n"
        );
        assert!(to_ignition_json(&c, SpecVersion::V3_3_0).contains("\"3.3.0\""));
    }

    #[test]
    fn spec_version_parses_and_defaults_to_3_4() {
        assert_eq!(SpecVersion::default(), SpecVersion::V3_4_0);
        assert_eq!("3.3.0".parse::<SpecVersion>().unwrap(), SpecVersion::V3_3_0);
        assert_eq!(SpecVersion::V3_4_0.to_string(), "3.4.0");
        assert_eq!(
            "3.5.0".parse::<SpecVersion>().unwrap_err().to_string(),
            "unsupported Ignition spec version \"3.5.0\" (supported: 3.3.0, 3.4.0)"
        );
    }

    fn json(c: &Config) -> serde_json::Value {
        serde_json::from_str(&to_ignition_json(c, SpecVersion::V3_4_0)).unwrap()
    }

    #[test]
    fn file_fields_in_go_order_without_nulls() {
        let mut c = Config::new();
        c.add_file(
            File::new("/etc/hostname")
                .with_data("node1\n")
                .with_mode(0o644)
                .with_overwrite(true)
                .with_user(Owner::Id(0))
                .with_group(Owner::Name("root".into())),
        )
        .unwrap()
        .add_file(File::new("/etc/empty"))
        .unwrap();
        let out = to_ignition_json(&c, SpecVersion::V3_4_0);
        assert!(!out.contains("null"));
        let want = r#"{
  "ignition": {
    "version": "3.4.0"
  },
  "storage": {
    "files": [
      {
        "group": {
          "name": "root"
        },
        "overwrite": true,
        "path": "/etc/hostname",
        "user": {
          "id": 0
        },
        "contents": {
          "compression": "",
          "source": "data:,node1%0A"
        },
        "mode": 420
      },
      {
        "path": "/etc/empty"
      }
    ]
  }
}
"#;
        assert_eq!(out, want);
    }

    #[test]
    fn mode_is_a_decimal_integer() {
        let mut c = Config::new();
        c.add_directory(Directory::new("/var/lib/agent").with_mode(0o700))
            .unwrap()
            .add_file(File::new("/usr/local/bin/x").with_mode(0o755))
            .unwrap();
        let v = json(&c);
        assert_eq!(v["storage"]["directories"][0]["mode"], 448);
        assert_eq!(v["storage"]["files"][0]["mode"], 493);
    }

    #[test]
    fn overwrite_false_is_kept_as_written() {
        let mut c = Config::new();
        c.add_file(File::new("/a").with_overwrite(false)).unwrap();
        assert_eq!(json(&c)["storage"]["files"][0]["overwrite"], false);
    }

    #[test]
    fn precompressed_and_remote_contents() {
        let gz = dataurl::gzip(b"hello\n");
        let mut c = Config::new();
        c.add_file(File::new("/a").with_contents(Contents::Data {
            data: gz.clone(),
            compression: Some(Compression::Gzip),
        }))
        .unwrap()
        .add_file(File::new("/b").with_contents(Contents::Remote {
            source: "https://example.com/b".into(),
            compression: None,
            verification: Some(format!("sha512-{}", "0".repeat(128))),
        }))
        .unwrap();
        let v = json(&c);
        let a = &v["storage"]["files"][0]["contents"];
        assert_eq!(a["compression"], "gzip");
        assert_eq!(a["source"], dataurl::encode(&gz, false).url);
        let b = &v["storage"]["files"][1]["contents"];
        assert_eq!(
            *b,
            serde_json::json!({
                "source": "https://example.com/b",
                "verification": {"hash": format!("sha512-{}", "0".repeat(128))}
            })
        );
    }

    #[test]
    fn units_links_users() {
        let mut c = Config::new();
        c.add_link(Link::new("/etc/l", "/etc/a").with_hard(false))
            .unwrap()
            .add_unit(
                Unit::new("a.service")
                    .with_enabled(true)
                    .with_contents("[Install]\nWantedBy=multi-user.target\n")
                    .with_dropin(Dropin::new("10-a.conf", "[Service]\n")),
            )
            .unwrap()
            .add_unit(Unit::new("b.service").with_mask(true))
            .unwrap()
            .add_user(
                User::new("azureuser")
                    .with_ssh_key("ssh-ed25519 AAAA k")
                    .with_group("sudo")
                    .with_uid(1000)
                    .with_shell("/bin/bash")
                    .with_home_dir("/home/azureuser")
                    .with_password_hash("$6$x"),
            )
            .unwrap();
        let v = json(&c);
        assert_eq!(
            v["storage"]["links"][0],
            serde_json::json!({"path": "/etc/l", "hard": false, "target": "/etc/a"})
        );
        assert_eq!(
            v["systemd"]["units"],
            serde_json::json!([
                {"contents": "[Install]\nWantedBy=multi-user.target\n",
                 "dropins": [{"contents": "[Service]\n", "name": "10-a.conf"}],
                 "enabled": true, "name": "a.service"},
                {"mask": true, "name": "b.service"}
            ])
        );
        assert_eq!(
            v["passwd"]["users"][0],
            serde_json::json!({
                "groups": ["sudo"], "homeDir": "/home/azureuser", "name": "azureuser",
                "passwordHash": "$6$x", "sshAuthorizedKeys": ["ssh-ed25519 AAAA k"],
                "shell": "/bin/bash", "uid": 1000
            })
        );
        assert!(v.get("storage").unwrap().get("files").is_none());
    }

    #[test]
    fn rendering_is_deterministic() {
        let mut c = Config::new();
        c.add_file(File::new("/big").with_data("compress me please\n".repeat(200)))
            .unwrap();
        let a = to_ignition_json(&c, SpecVersion::V3_4_0);
        let b = to_ignition_json(&c.clone(), SpecVersion::V3_4_0);
        assert_eq!(a, b);
        assert!(a.contains("\"compression\": \"gzip\""));
    }
}
