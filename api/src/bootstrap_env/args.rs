//! Bootstrap arguments: the `AKS_FLEX_NODE_*=VALUE` assignments given on a command line
//! (`aks-flex-node ignition … -- BOOTSTRAP_ARGS`), checked and written as the `bootstrap.env`
//! the node's first boot reads.
//!
//! Each argument is one assignment of a bootstrap input (`docs/bootstrap.md`). Refused, before
//! anything is written, with an error that names the argument (its position and key, never its
//! value):
//!
//! - a flag of the bootstrap (`--env-file`, `--use-installed-agent`, `--install-dir`,
//!   `--dry-run`, `--output-dir`): the command sets where the inputs are and which agent runs
//!   itself, and a first boot is never a dry run;
//! - any other argument starting with `-`: an unknown flag;
//! - an argument without `=`, or whose key is not a bootstrap input;
//! - an install input of `scripts/bootstrap.sh` ([`keys::INSTALL`]): the agent's image runs its
//!   own agent;
//! - a key given twice;
//! - a value with a control character (a line break would start another line of the file);
//! - a value the bootstrap's own parser ([`parse`]) would read back differently from the
//!   file written (a guard: quoting makes that impossible for the values the checks above let
//!   through).

use std::fmt;

use super::{KEY_PREFIX, double_quote, keys, parse, single_quote};

/// Where the node's first boot reads the bootstrap inputs (`aks-flex-node-bootstrap` in the
/// agent's image).
pub const ENV_FILE: &str = "/etc/aks-flex-node/bootstrap.env";

/// The bootstrap's flags: what each is, and why the arguments may not carry it.
const BOOTSTRAP_FLAGS: &[(&str, &str)] = &[
    (
        "--env-file",
        "the command writes the inputs to /etc/aks-flex-node/bootstrap.env itself",
    ),
    (
        "--use-installed-agent",
        "the agent's image always runs its own agent",
    ),
    (
        "--install-dir",
        "the agent's image always runs its own agent",
    ),
    ("--dry-run", "a node's first boot bootstraps for real"),
    ("--output-dir", "a node's first boot bootstraps for real"),
];

/// Why a bootstrap argument was refused. Messages name the argument by its 1-based position
/// and its key or flag name, never its value (a value may be the bootstrap token).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgError {
    /// A flag of the bootstrap that the command sets itself or that a first boot cannot take.
    #[error("bootstrap argument {index}: {flag} is set by `aks-flex-node ignition` itself: {why}")]
    SetByCommand {
        /// 1-based position.
        index: usize,
        /// The flag, without any `=value`.
        flag: String,
        /// Why.
        why: &'static str,
    },
    /// An argument starting with `-` that is no flag of the bootstrap.
    #[error(
        "bootstrap argument {index}: unknown flag {flag} (bootstrap arguments are AKS_FLEX_NODE_*=VALUE assignments)"
    )]
    UnknownFlag {
        /// 1-based position.
        index: usize,
        /// The flag, without any `=value`.
        flag: String,
    },
    /// An argument without `=`.
    #[error(
        "bootstrap argument {index}: not an assignment (bootstrap arguments are AKS_FLEX_NODE_*=VALUE)"
    )]
    NotAssignment {
        /// 1-based position.
        index: usize,
    },
    /// A key that is not a bootstrap input (often a typo).
    #[error("bootstrap argument {index}: {key} is not a bootstrap input (see docs/bootstrap.md)")]
    UnknownInput {
        /// 1-based position.
        index: usize,
        /// The key (shown only when it is a well-formed `AKS_FLEX_NODE_*` name).
        key: String,
    },
    /// An install input of `scripts/bootstrap.sh`.
    #[error(
        "bootstrap argument {index}: {key} is set by `aks-flex-node ignition` itself: the agent's image always runs its own agent"
    )]
    InstallInput {
        /// 1-based position.
        index: usize,
        /// The key.
        key: &'static str,
    },
    /// The same key twice.
    #[error("bootstrap argument {index}: {key} is given twice (also argument {first})")]
    Duplicate {
        /// 1-based position of the second.
        index: usize,
        /// 1-based position of the first.
        first: usize,
        /// The key.
        key: String,
    },
    /// A control character in a value.
    #[error("bootstrap argument {index}: the value of {key} has a control character ({code})")]
    ControlCharacter {
        /// 1-based position.
        index: usize,
        /// The key.
        key: String,
        /// The character, as `U+000A`.
        code: String,
    },
    /// The bootstrap's parser reads the written file back differently.
    #[error("bootstrap.env would not read back as given: {cause}")]
    RoundTrip {
        /// What differs, or the parser's error (which never shows a value).
        cause: String,
    },
}

/// Checked bootstrap arguments, in the order given. `Debug` shows keys and value lengths only.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct BootstrapArgs {
    entries: Vec<(String, String)>,
}

impl fmt::Debug for BootstrapArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(
                self.entries
                    .iter()
                    .map(|(k, v)| format!("{k}=<{} bytes>", v.len())),
            )
            .finish()
    }
}

/// The flag part of `arg` (`--env-file=/x` → `--env-file`), safe to show.
fn flag_name(arg: &str) -> String {
    let name = arg.split_once('=').map_or(arg, |(n, _)| n);
    if name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        name.to_string()
    } else {
        "(a flag with unusual characters)".to_string()
    }
}

fn well_formed_key(k: &str) -> bool {
    k.starts_with(KEY_PREFIX)
        && k.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

impl BootstrapArgs {
    /// Checks `args` (see the module documentation) and keeps them.
    pub fn parse<S: AsRef<str>>(args: impl IntoIterator<Item = S>) -> Result<Self, ArgError> {
        let mut entries: Vec<(String, String)> = Vec::new();
        for (i, arg) in args.into_iter().enumerate() {
            let index = i + 1;
            let arg = arg.as_ref();
            if arg.starts_with('-') {
                let flag = flag_name(arg);
                return Err(match BOOTSTRAP_FLAGS.iter().find(|(f, _)| *f == flag) {
                    Some((_, why)) => ArgError::SetByCommand { index, flag, why },
                    None => ArgError::UnknownFlag { index, flag },
                });
            }
            let Some((key, value)) = arg.split_once('=') else {
                return Err(ArgError::NotAssignment { index });
            };
            let Some(known) = keys::ALL.iter().find(|k| **k == key) else {
                return Err(ArgError::UnknownInput {
                    index,
                    key: if well_formed_key(key) {
                        key.to_string()
                    } else {
                        "the key".to_string()
                    },
                });
            };
            if let Some(key) = keys::INSTALL.iter().find(|k| *k == known) {
                return Err(ArgError::InstallInput { index, key });
            }
            if let Some(first) = entries.iter().position(|(k, _)| k == key) {
                return Err(ArgError::Duplicate {
                    index,
                    first: first + 1,
                    key: key.to_string(),
                });
            }
            if let Some(c) = value.chars().find(|c| c.is_control()) {
                return Err(ArgError::ControlCharacter {
                    index,
                    key: key.to_string(),
                    code: format!("U+{:04X}", u32::from(c)),
                });
            }
            entries.push((key.to_string(), value.to_string()));
        }
        let args = BootstrapArgs { entries };
        args.check_round_trip()?;
        Ok(args)
    }

    /// Reads the file [`Self::env_file`] writes back with the bootstrap's own parser and
    /// compares it with the arguments.
    fn check_round_trip(&self) -> Result<(), ArgError> {
        let text = self.env_file();
        let read = parse(&text).map_err(|e| ArgError::RoundTrip {
            cause: e.to_string(),
        })?;
        if read.len() != self.entries.len() {
            return Err(ArgError::RoundTrip {
                cause: format!(
                    "{} assignments read, {} given",
                    read.len(),
                    self.entries.len()
                ),
            });
        }
        for (e, (k, v)) in read.iter().zip(&self.entries) {
            if &e.key != k || &e.value != v {
                return Err(ArgError::RoundTrip {
                    cause: format!("the value of {k} differs"),
                });
            }
        }
        Ok(())
    }

    /// No arguments: the node boots without a bootstrap.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    /// The value of `key`, if given.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The assignments as `(key, value)` pairs.
    pub fn entries(&self) -> &[(String, String)] {
        &self.entries
    }

    /// The text of `bootstrap.env`: one `KEY='VALUE'` line per argument (double quotes when the
    /// value has a `'`), which [`parse`] reads back exactly. It holds the values, the token
    /// among them: write it only where the token may be, never log it.
    pub fn env_file(&self) -> String {
        let mut s = String::from(
            "# Written by aks-flex-node ignition: the bootstrap inputs (docs/bootstrap.md).\n",
        );
        for (k, v) in &self.entries {
            let quoted = single_quote(v)
                .or_else(|| double_quote(v))
                .unwrap_or_default();
            s.push_str(&format!("{k}={quoted}\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "abcdef.0123456789abcdef";

    fn err(args: &[&str]) -> ArgError {
        match BootstrapArgs::parse(args) {
            Ok(a) => panic!("accepted {args:?}: {a:?}"),
            Err(e) => e,
        }
    }

    /// Each refused argument list and the words its error must contain.
    #[test]
    fn refused_arguments_table() {
        let token = format!("AKS_FLEX_NODE_BOOTSTRAP_TOKEN={TOKEN}");
        let cases: &[(&[&str], &[&str])] = &[
            (
                &["--env-file", "/x"],
                &["argument 1", "--env-file", "itself"],
            ),
            (&["--env-file=/x"], &["--env-file", "itself"]),
            (
                &["--use-installed-agent"],
                &["--use-installed-agent", "itself"],
            ),
            (&["--install-dir=/opt"], &["--install-dir", "itself"]),
            (&["--dry-run"], &["--dry-run", "itself"]),
            (&["--output-dir", "/o"], &["--output-dir", "itself"]),
            (&["--frobnicate"], &["unknown flag --frobnicate"]),
            (&["-x"], &["unknown flag -x"]),
            (
                &[&token, "--token=s3cret"],
                &["argument 2", "unknown flag --token"],
            ),
            (
                &["AKS_FLEX_NODE_NODE_NAME"],
                &["argument 1", "not an assignment"],
            ),
            (
                &["AKS_FLEX_NODE_NODENAME=a"],
                &["AKS_FLEX_NODE_NODENAME is not a bootstrap input"],
            ),
            (&["HOME=/root"], &["not a bootstrap input"]),
            (
                &["AKS_FLEX_NODE_VERSION=v1"],
                &["AKS_FLEX_NODE_VERSION", "own agent"],
            ),
            (
                &["AKS_FLEX_NODE_USE_INSTALLED_AGENT=true"],
                &["AKS_FLEX_NODE_USE_INSTALLED_AGENT", "itself"],
            ),
            (
                &["AKS_FLEX_NODE_LABELS=a=b", "AKS_FLEX_NODE_LABELS=c=d"],
                &["argument 2", "AKS_FLEX_NODE_LABELS", "twice", "argument 1"],
            ),
            (
                &["AKS_FLEX_NODE_NODE_NAME=a\nAKS_FLEX_NODE_CONFIG=/evil"],
                &["AKS_FLEX_NODE_NODE_NAME", "control character", "U+000A"],
            ),
            (
                &["AKS_FLEX_NODE_LOCATION=a\rb"],
                &["control character", "U+000D"],
            ),
            (&["AKS_FLEX_NODE_LOCATION=a\tb"], &["U+0009"]),
            (&["AKS_FLEX_NODE_LOCATION=a\u{7f}"], &["U+007F"]),
            (&["AKS_FLEX_NODE_LOCATION=\u{85}"], &["U+0085"]),
        ];
        for (args, words) in cases {
            let msg = err(args).to_string();
            for w in *words {
                assert!(msg.contains(w), "{args:?}: {msg:?} lacks {w:?}");
            }
        }
    }

    /// No error shows a value: not the token, not the value of a flag.
    #[test]
    fn errors_never_show_a_value() {
        let cases: &[&[&str]] = &[
            &["--token=abcdef.0123456789abcdef"],
            &["AKS_FLEX_NODE_BOOTSTRAP_TOKEN=abcdef.0123456789abcdef\n"],
            &[
                "AKS_FLEX_NODE_BOOTSTRAP_TOKEN=abcdef.0123456789abcdef",
                "AKS_FLEX_NODE_BOOTSTRAP_TOKEN=abcdef.0123456789abcdef",
            ],
            &["X_abcdef.0123456789abcdef=1"],
        ];
        for args in cases {
            let e = err(args);
            assert!(!e.to_string().contains("0123456789abcdef"), "{e}");
            assert!(!format!("{e:?}").contains("0123456789abcdef"), "{e:?}");
        }
        let ok = BootstrapArgs::parse([format!("AKS_FLEX_NODE_BOOTSTRAP_TOKEN={TOKEN}")]).unwrap();
        assert!(!format!("{ok:?}").contains(TOKEN), "{ok:?}");
    }

    /// Hostile and awkward values are written so the bootstrap's own parser reads back exactly
    /// what was given: quotes of both kinds, backslashes, `$(…)`, backticks, `#`, blanks.
    #[test]
    fn values_read_back_exactly_through_the_bootstrap_parser() {
        let values = [
            "",
            "plain",
            "$(touch /tmp/x)`touch /tmp/x`",
            "it's",
            "say \"hi\" \\ back\\slash",
            "both ' and \" and \\",
            "a # not a comment",
            "  blanks  ",
            "ünïcödé",
        ];
        for v in values {
            let a = BootstrapArgs::parse([format!("AKS_FLEX_NODE_LOCATION={v}")]).unwrap();
            let read = parse(&a.env_file()).unwrap();
            assert_eq!(read.len(), 1);
            assert_eq!(read[0].key, "AKS_FLEX_NODE_LOCATION");
            assert_eq!(read[0].value, v, "{}", a.env_file());
        }
    }

    #[test]
    fn accepted_arguments_keep_their_order() {
        let a = BootstrapArgs::parse([
            "AKS_FLEX_NODE_NODE_NAME=n1",
            "AKS_FLEX_NODE_CONFIG=/etc/x.json",
            "AKS_FLEX_NODE_LABELS=a=b,c=d",
        ])
        .unwrap();
        assert_eq!(
            a.keys().collect::<Vec<_>>(),
            [
                "AKS_FLEX_NODE_NODE_NAME",
                "AKS_FLEX_NODE_CONFIG",
                "AKS_FLEX_NODE_LABELS"
            ]
        );
        assert_eq!(a.get("AKS_FLEX_NODE_LABELS"), Some("a=b,c=d"));
        assert!(
            BootstrapArgs::parse(Vec::<String>::new())
                .unwrap()
                .is_empty()
        );
    }
}
