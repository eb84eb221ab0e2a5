//! `flex-ignition`: Butane-style translation of host configs to Ignition JSON.
//!
//! The harness boots Azure Container Linux (Flatcar-derived) from an Ignition config. This
//! crate reads the part of Butane's `flatcar` variant a host config needs (files, directories,
//! links, systemd units with drop-ins, users), lets code add entries (an SSH key, a hostname
//! file), merges configs, and renders Ignition spec 3.4.0 (or 3.3.0) JSON the way Butane does:
//! embedded contents become `data:` URLs, gzip-compressed when that is shorter, modes are
//! decimal integers, unset fields are left out, and the same config always gives the same
//! bytes.
//!
//! ```
//! use flex_ignition::{merge, parse_butane, to_ignition_json, Config, SpecVersion, User};
//!
//! let base = parse_butane(
//!     "variant: flatcar\nversion: 1.1.0\nstorage:\n  files:\n    - path: /etc/hostname\n      mode: 0644\n      overwrite: true\n      contents:\n        inline: node1\n",
//!     None,
//! )?;
//! let mut harness = Config::new();
//! harness.add_user(User::new("azureuser").with_ssh_key("ssh-ed25519 AAAA harness").with_group("sudo"))?;
//! let config = merge(&base, &harness)?;
//! let json = to_ignition_json(&config, SpecVersion::V3_4_0);
//! assert!(json.contains("\"mode\": 420"));
//! assert!(json.contains("\"source\": \"data:,node1\""));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Modules: [`model`] (entries and their own checks), [`config`] ([`Config`], the builder,
//! [`merge`]), [`butane`] ([`parse_butane`]), [`ignition_json`] ([`parse_ignition`]: Ignition
//! JSON, the same subset), [`render`] ([`to_ignition_json`]), [`dataurl`] (Butane's data URL
//! encoding), [`node`] (a node's config for the agent's image: a base config, the agent's
//! provisioning and the bootstrap inputs; `aks-flex-node ignition` and the harness use it).

pub mod butane;
pub mod config;
pub mod dataurl;
pub mod ignition_json;
pub mod model;
pub mod node;
pub mod render;

pub use butane::{ButaneError, ButaneWarning, parse_butane, parse_butane_with_warnings};
pub use config::{Config, ConfigError, Entry, MergeError, merge};
pub use ignition_json::{IgnitionError, parse_ignition};
pub use model::{
    Compression, Contents, Directory, Dropin, FieldError, File, Link, Owner, Unit, User,
};
pub use render::{SpecVersion, UnsupportedSpecVersion, to_ignition_json};
