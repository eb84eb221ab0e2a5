//! `bootstrap.env`: `AKS_FLEX_NODE_*=value` lines, read as data and never evaluated.
//!
//! The grammar is a small, safe subset of shell assignments, so the same file can be written by
//! hand or by provisioning (Ignition, cloud-init) and read by both `scripts/bootstrap.sh` and
//! the agent without ever running a shell on it:
//!
//! - blank lines and lines whose first non-blank character is `#` are skipped; a `\r` before
//!   the line end is dropped (CRLF files);
//! - an assignment is `[export ]KEY=VALUE`, with optional blanks before it and none around
//!   `=` (a blank right after `=` is an error, as the shell would run the rest as a command); `KEY` is `[A-Za-z_][A-Za-z0-9_]*` and must start with `AKS_FLEX_NODE_`, anything
//!   else is an error naming the line;
//! - `VALUE` is either
//!   - `'...'`: everything up to the next `'`, taken literally;
//!   - `"..."`: everything up to the next unescaped `"`, where `\"` is `"` and `\\` is `\`; any
//!     other backslash is kept as it is;
//!   - unquoted: the rest of the line with trailing blanks removed, taken literally (`#` and
//!     quotes in it are part of the value);
//!
//!   after a closing quote only blanks and an optional `# comment` may follow;
//! - nothing is expanded: `$VAR`, `${VAR}`, `$(...)`, backticks, `~` and globs stay as written;
//! - a key given twice: the last line wins.
//!
//! Errors name the 1-based line and never include a value (a value may be a secret).
//!
//! [`keys`]: the input names ([`keys::ALL`]; [`keys::INSTALL`], the ones only
//! `scripts/bootstrap.sh` reads), which the agent's input table is checked against; [`args`]:
//! bootstrap arguments (`AKS_FLEX_NODE_*=VALUE`) checked and written as a `bootstrap.env` this
//! parser reads back exactly (`aks-flex-node ignition`, the harness).

pub mod args;
pub mod keys;

use std::collections::BTreeMap;

/// The prefix every key must have.
pub const KEY_PREFIX: &str = "AKS_FLEX_NODE_";

/// One assignment.
#[derive(Clone, PartialEq, Eq)]
pub struct Entry {
    /// 1-based line number.
    pub line: usize,
    /// The key (`AKS_FLEX_NODE_NODE_NAME`).
    pub key: String,
    /// The value, unquoted, exactly as written otherwise.
    pub value: String,
}

impl std::fmt::Debug for Entry {
    // Values may be secrets: show their length only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("line", &self.line)
            .field("key", &self.key)
            .field("value_len", &self.value.len())
            .finish()
    }
}

/// A line that is not a valid assignment.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct EnvError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong (never includes the value).
    pub message: String,
}

fn err(line: usize, message: impl Into<String>) -> EnvError {
    EnvError {
        line,
        message: message.into(),
    }
}

fn is_blank(c: char) -> bool {
    c == ' ' || c == '\t'
}

fn valid_key(k: &str) -> bool {
    let mut chars = k.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Parses the file's text into its assignments, in file order (duplicates kept; see
/// [`to_map`]).
pub fn parse(text: &str) -> Result<Vec<Entry>, EnvError> {
    let mut out = Vec::new();
    for (i, raw) in text.split('\n').enumerate() {
        let n = i + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let line = line.trim_start_matches(is_blank);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = match line.strip_prefix("export") {
            Some(rest) if rest.starts_with(is_blank) => rest.trim_start_matches(is_blank),
            _ => line,
        };
        let Some((key, rest)) = line.split_once('=') else {
            return Err(err(n, "expected KEY=VALUE"));
        };
        if !valid_key(key) {
            return Err(err(
                n,
                "expected KEY=VALUE with KEY made of letters, digits and _ (no blanks around =)",
            ));
        }
        if !key.starts_with(KEY_PREFIX) {
            return Err(err(
                n,
                format!("{key} is not an {KEY_PREFIX}* setting; only those are read"),
            ));
        }
        if rest.starts_with(is_blank) {
            return Err(err(
                n,
                "blank after = (quote a value that starts with a blank)",
            ));
        }
        let value = parse_value(n, rest)?;
        out.push(Entry {
            line: n,
            key: key.to_string(),
            value,
        });
    }
    Ok(out)
}

fn parse_value(n: usize, rest: &str) -> Result<String, EnvError> {
    let (value, tail) = if let Some(body) = rest.strip_prefix('\'') {
        let Some(end) = body.find('\'') else {
            return Err(err(n, "unterminated single quote"));
        };
        (body[..end].to_string(), &body[end + 1..])
    } else if let Some(body) = rest.strip_prefix('"') {
        let mut value = String::new();
        let mut chars = body.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    end = Some(i + 1);
                    break;
                }
                '\\' => match body[i + 1..].chars().next() {
                    Some(e @ ('"' | '\\')) => {
                        value.push(e);
                        chars.next();
                    }
                    _ => value.push('\\'),
                },
                c => value.push(c),
            }
        }
        let Some(end) = end else {
            return Err(err(n, "unterminated double quote"));
        };
        (value, &body[end..])
    } else {
        return Ok(rest.trim_end_matches(is_blank).to_string());
    };
    let tail = tail.trim_start_matches(is_blank);
    if !tail.is_empty() && !tail.starts_with('#') {
        return Err(err(
            n,
            "unexpected text after the closing quote (only a # comment may follow)",
        ));
    }
    Ok(value)
}

/// The assignments as a map: a key given twice keeps its last value and line.
pub fn to_map(entries: &[Entry]) -> BTreeMap<String, Entry> {
    let mut m = BTreeMap::new();
    for e in entries {
        m.insert(e.key.clone(), e.clone());
    }
    m
}

/// Quotes `value` in single quotes so [`parse`] (and a POSIX shell) read it back literally;
/// `None` when it cannot be (it contains `'` or a line break).
pub fn single_quote(value: &str) -> Option<String> {
    (!value.contains(['\'', '\n', '\r'])).then(|| format!("'{value}'"))
}

/// Quotes `value` in double quotes for [`parse`], escaping `"` and `\`; `None` when it
/// contains a line break. (Unlike a shell, [`parse`] does not expand `$` or backticks in it.)
pub fn double_quote(value: &str) -> Option<String> {
    if value.contains(['\n', '\r']) {
        return None;
    }
    let mut s = String::from("\"");
    for c in value.chars() {
        if c == '"' || c == '\\' {
            s.push('\\');
        }
        s.push(c);
    }
    s.push('"');
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn one(text: &str) -> Result<String, EnvError> {
        let e = parse(text)?;
        assert_eq!(e.len(), 1, "{text:?}");
        Ok(e[0].value.clone())
    }

    #[test]
    fn table() {
        let k = "AKS_FLEX_NODE_X";
        let cases: &[(&str, &str)] = &[
            ("AKS_FLEX_NODE_X=plain", "plain"),
            ("AKS_FLEX_NODE_X=", ""),
            ("AKS_FLEX_NODE_X=a b  \t", "a b"),
            ("  export AKS_FLEX_NODE_X=v", "v"),
            ("export\tAKS_FLEX_NODE_X='v'", "v"),
            ("AKS_FLEX_NODE_X='$(touch /tmp/x)'", "$(touch /tmp/x)"),
            ("AKS_FLEX_NODE_X=$(touch /tmp/x)", "$(touch /tmp/x)"),
            ("AKS_FLEX_NODE_X=`id`;rm -rf /", "`id`;rm -rf /"),
            (
                "AKS_FLEX_NODE_X=\"`id` $HOME ${HOME} ~\"",
                "`id` $HOME ${HOME} ~",
            ),
            ("AKS_FLEX_NODE_X=~/x", "~/x"),
            ("AKS_FLEX_NODE_X=\"a\\\"b\\\\c\\n\\$\"", "a\"b\\c\\n\\$"),
            ("AKS_FLEX_NODE_X='a\\b'", "a\\b"),
            ("AKS_FLEX_NODE_X='x' # comment", "x"),
            ("AKS_FLEX_NODE_X=\"x\"\t#c", "x"),
            ("AKS_FLEX_NODE_X=a#b", "a#b"),
            ("AKS_FLEX_NODE_X=it's", "it's"),
            ("AKS_FLEX_NODE_X=a=b=c", "a=b=c"),
            ("AKS_FLEX_NODE_X=v\r", "v"),
            ("AKS_FLEX_NODE_X='v'\r", "v"),
        ];
        for (text, want) in cases {
            let entries = parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(entries.len(), 1, "{text:?}");
            assert_eq!(entries[0].key, k);
            assert_eq!(entries[0].value, *want, "{text:?}");
        }
    }

    #[test]
    fn comments_blanks_lines_and_last_wins() {
        let text = "# header\n\n   \n\t# indented comment\nAKS_FLEX_NODE_A=1\nAKS_FLEX_NODE_B=2\r\nAKS_FLEX_NODE_A=3\n";
        let entries = parse(text).unwrap();
        assert_eq!(
            entries
                .iter()
                .map(|e| (e.line, e.key.as_str(), e.value.as_str()))
                .collect::<Vec<_>>(),
            vec![
                (5, "AKS_FLEX_NODE_A", "1"),
                (6, "AKS_FLEX_NODE_B", "2"),
                (7, "AKS_FLEX_NODE_A", "3"),
            ]
        );
        let m = to_map(&entries);
        assert_eq!(m["AKS_FLEX_NODE_A"].value, "3");
        assert_eq!(m["AKS_FLEX_NODE_A"].line, 7);
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn errors_name_the_line_and_never_the_value() {
        let cases: &[(&str, usize, &str)] = &[
            (
                "# c\nPATH=/evil",
                2,
                "PATH is not an AKS_FLEX_NODE_* setting",
            ),
            ("\n\nnot an assignment", 3, "expected KEY=VALUE"),
            ("AKS_FLEX_NODE_X ='v'", 1, "no blanks around ="),
            ("AKS_FLEX_NODE_X= 'v'", 1, "blank after ="),
            ("1AKS=v", 1, "letters, digits"),
            ("AKS-FLEX=v", 1, "letters, digits"),
            (
                "AKS_FLEX_NODE_X='secretvalue",
                1,
                "unterminated single quote",
            ),
            (
                "AKS_FLEX_NODE_X=\"secretvalue\\\"",
                1,
                "unterminated double quote",
            ),
            (
                "AKS_FLEX_NODE_X='secretvalue'tail",
                1,
                "after the closing quote",
            ),
            ("AKS_FLEX_NODE_X=\"a\"$(id)", 1, "after the closing quote"),
            (
                "exportAKS_FLEX_NODE_X=v",
                1,
                "not an AKS_FLEX_NODE_* setting",
            ),
            ("export AKS_FLEX_NODE_X", 1, "expected KEY=VALUE"),
        ];
        for (text, line, msg) in cases {
            match parse(text) {
                Ok(e) => panic!("{text:?} parsed: {e:?}"),
                Err(e) => {
                    assert_eq!(e.line, *line, "{text:?}");
                    assert!(e.to_string().contains(msg), "{text:?}: {e}");
                    assert!(!e.to_string().contains("secretvalue"), "{e}");
                    assert!(e.to_string().starts_with(&format!("line {line}: ")));
                }
            }
        }
    }

    #[test]
    fn debug_hides_values() {
        let e = parse("AKS_FLEX_NODE_BOOTSTRAP_TOKEN=abcdef.0123456789abcdef").unwrap();
        let dbg = format!("{e:?}");
        assert!(!dbg.contains("abcdef"), "{dbg}");
        assert!(dbg.contains("AKS_FLEX_NODE_BOOTSTRAP_TOKEN"));
    }

    #[test]
    fn quoting_helpers() {
        assert_eq!(single_quote("a'b"), None);
        assert_eq!(single_quote("a\nb"), None);
        assert_eq!(double_quote("a\rb"), None);
        assert_eq!(double_quote("a\"b\\").as_deref(), Some("\"a\\\"b\\\\\""));
    }

    fn no_newlines() -> impl Strategy<Value = String> {
        proptest::string::string_regex("[^\n\r]{0,64}").unwrap()
    }

    fn hostile() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("$(touch /tmp/x)".to_string()),
            Just("`touch /tmp/x`".to_string()),
            Just(";rm -rf /".to_string()),
            Just("| sh".to_string()),
            Just("${HOME}".to_string()),
            Just("$HOME".to_string()),
            Just("~".to_string()),
            Just("&& reboot".to_string()),
            Just("\\".to_string()),
            Just("\"".to_string()),
            proptest::string::string_regex("[a-z0-9 ]{0,4}").unwrap(),
        ];
        proptest::collection::vec(piece, 1..6).prop_map(|v| v.concat())
    }

    proptest! {
        #[test]
        fn double_quoted_values_round_trip(v in no_newlines()) {
            let q = double_quote(&v).unwrap();
            prop_assert_eq!(one(&format!("AKS_FLEX_NODE_X={q}")).unwrap(), v.clone());
            prop_assert_eq!(one(&format!("export AKS_FLEX_NODE_X={q} # c")).unwrap(), v);
        }

        #[test]
        fn single_quoted_values_round_trip(v in no_newlines()) {
            match single_quote(&v) {
                Some(q) => prop_assert_eq!(one(&format!("AKS_FLEX_NODE_X={q}")).unwrap(), v),
                None => prop_assert!(v.contains('\'')),
            }
        }

        #[test]
        fn hostile_strings_stay_literal(v in hostile()) {
            let q = double_quote(&v).unwrap();
            prop_assert_eq!(one(&format!("AKS_FLEX_NODE_X={q}")).unwrap(), v.clone());
            if let Some(q) = single_quote(&v) {
                prop_assert_eq!(one(&format!("AKS_FLEX_NODE_X={q}")).unwrap(), v.clone());
            }
            // Unquoted, a value that does not start with a quote is kept up to the line end.
            let trimmed = v.trim_end_matches([' ', '\t']);
            if !v.starts_with(['\'', '"', ' ', '\t']) {
                prop_assert_eq!(one(&format!("AKS_FLEX_NODE_X={v}")).unwrap(), trimmed);
            }
        }
    }
}
