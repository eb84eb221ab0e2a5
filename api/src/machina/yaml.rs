//! A small, deterministic YAML rendering of JSON values, for generated files that are committed
//! (the CRDs) and for printing an operation's status.
//!
//! Block style throughout, two-space indents, keys in the order the value has them (serde_json
//! keeps insertion order here). A string is written plain only when YAML 1.1 and 1.2 both read
//! it back as that same string; otherwise it is written as a JSON string, which is a valid YAML
//! double-quoted scalar.

use serde_json::Value;

/// Renders `v` as a YAML document (ending in a newline).
pub fn to_yaml(v: &Value) -> String {
    let mut out = String::new();
    match v {
        Value::Object(m) if !m.is_empty() => write_map(&mut out, m, 0, false),
        Value::Array(a) if !a.is_empty() => write_seq(&mut out, a, 0, false),
        other => {
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
    out
}

/// A string as a YAML scalar: plain when that reads back as the same string, else quoted.
pub fn yaml_scalar(s: &str) -> String {
    if is_plain_safe(s) {
        s.to_string()
    } else {
        Value::String(s.to_string()).to_string()
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => yaml_scalar(s),
        Value::Array(_) => "[]".into(),
        Value::Object(_) => "{}".into(),
    }
}

fn is_block(v: &Value) -> bool {
    match v {
        Value::Object(m) => !m.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => false,
    }
}

/// Writes a map's entries at `indent`; with `inline`, the first entry follows a `- ` already
/// written.
fn write_map(out: &mut String, m: &serde_json::Map<String, Value>, indent: usize, inline: bool) {
    for (i, (k, v)) in m.iter().enumerate() {
        if i > 0 || !inline {
            out.push_str(&" ".repeat(indent));
        }
        out.push_str(&yaml_scalar(k));
        out.push(':');
        write_value(out, v, indent);
    }
}

/// Writes a sequence's items at `indent`; with `inline`, the first item follows a `- ` already
/// written.
fn write_seq(out: &mut String, a: &[Value], indent: usize, inline: bool) {
    for (i, v) in a.iter().enumerate() {
        if i > 0 || !inline {
            out.push_str(&" ".repeat(indent));
        }
        out.push_str("- ");
        match v {
            Value::Object(m) if !m.is_empty() => write_map(out, m, indent + 2, true),
            Value::Array(inner) if !inner.is_empty() => write_seq(out, inner, indent + 2, true),
            other => {
                out.push_str(&scalar(other));
                out.push('\n');
            }
        }
    }
}

/// Writes what follows `key:` (a space and a scalar, or a newline and an indented block).
fn write_value(out: &mut String, v: &Value, indent: usize) {
    if !is_block(v) {
        out.push(' ');
        out.push_str(&scalar(v));
        out.push('\n');
        return;
    }
    out.push('\n');
    match v {
        Value::Object(m) => write_map(out, m, indent + 2, false),
        Value::Array(a) => write_seq(out, a, indent + 2, false),
        _ => {}
    }
}

/// Words YAML 1.1 or 1.2 reads as something other than a string.
const RESERVED: &[&str] = &[
    "null", "~", "true", "false", "yes", "no", "on", "off", "y", "n", ".inf", "-.inf", "+.inf",
    ".nan", "<<", "=",
];

fn is_plain_safe(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    if s.trim() != s || RESERVED.contains(&s.to_ascii_lowercase().as_str()) {
        return false;
    }
    // Anything that starts like a number, a date, a sign or an indicator is quoted.
    if !(first.is_ascii_alphabetic() || matches!(first, '_' | '/')) {
        return false;
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || " ._/()=+-,@".contains(c);
    s.chars().all(allowed) && !s.contains(" #") && !s.ends_with(':')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scalars_are_plain_only_when_unambiguous() {
        for (s, want) in [
            ("NodeReboot", "NodeReboot"),
            (
                "restarting active nspawn node",
                "restarting active nspawn node",
            ),
            ("unbounded-cloud.io", "unbounded-cloud.io"),
            ("x-kubernetes-map-type", "x-kubernetes-map-type"),
            (".spec.machineRef", "\".spec.machineRef\""),
            ("", "\"\""),
            ("true", "\"true\""),
            ("No", "\"No\""),
            ("null", "\"null\""),
            ("1.35.3", "\"1.35.3\""),
            ("2026-01-02T03:04:05Z", "\"2026-01-02T03:04:05Z\""),
            ("-x", "\"-x\""),
            ("a: b", "\"a: b\""),
            ("a #b", "\"a #b\""),
            ("line\nbreak", "\"line\\nbreak\""),
            ("say \"hi\"", "\"say \\\"hi\\\"\""),
            ("^[a-z]$", "\"^[a-z]$\""),
            (" padded", "\" padded\""),
        ] {
            assert_eq!(yaml_scalar(s), want, "{s:?}");
        }
    }

    #[test]
    fn nested_maps_and_sequences() {
        let v = json!({
            "apiVersion": "v1",
            "items": [
                {"name": "a", "values": ["x", "y"]},
                "plain",
                [1, 2],
                {},
            ],
            "empty": {},
            "none": [],
            "nested": {"deep": {"n": 1, "b": false, "z": null}},
        });
        assert_eq!(
            to_yaml(&v),
            r#"apiVersion: v1
items:
  - name: a
    values:
      - x
      - "y"
  - plain
  - - 1
    - 2
  - {}
empty: {}
none: []
nested:
  deep:
    "n": 1
    b: false
    z: null
"#
        );
    }
}
