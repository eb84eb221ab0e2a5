//! Typed errors at the seams: a function of production code returns a `thiserror` type (or
//! `anyhow` at the edges), not `Result<_, String>`, so its callers can decide on the failure.
//! Checked on the real tree by scanning every function signature (multi-line ones too) of the
//! workspace's production code. No public function (`pub` or `pub(crate)`) returns one; the
//! private ones left are listed in [`PRIVATE_MESSAGES`], each with its reason. A new one fails
//! this test, and so does an entry whose function no longer returns a `String` (remove it).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use flex_tests::{production, production_rust_files, workspace_root};

const SCANNED: &[&str] = &[
    "agent/src",
    "api/src",
    "controller/src",
    "host/src",
    "image/src",
    "ignition/src",
    "oci/src",
    "codegen/src",
    "harness/src",
    "xtask/src",
    "testkit/src",
];

/// `(file, function, why)`: the private functions that still return `Result<_, String>`, each
/// with its reason. Every one is private (not `pub`, not `pub(crate)`): its `String` is a
/// message a typed error of its caller carries, or what clap prints for a bad flag value.
const PRIVATE_MESSAGES: &[(&str, &str, &str)] = &[
    (
        "agent/src/machine/components/reachability.rs",
        "probe",
        "the reason (no URL) becomes the message of a ProbeError::Unreachable",
    ),
    (
        "agent/src/machine/components/reachability.rs",
        "offline_index",
        "the reason (no path) becomes the message of a ProbeError::Unreachable",
    ),
    (
        "api/src/image/reference.rs",
        "validate_registry",
        "the message of ReferenceError::Invalid, which names the reference",
    ),
    (
        "api/src/image/reference.rs",
        "validate_tag",
        "the message of ReferenceError::Invalid, which names the reference",
    ),
    (
        "api/src/image/reference.rs",
        "check_repository_length",
        "the message of ReferenceError::Invalid, which names the reference",
    ),
    (
        "api/src/image/reference.rs",
        "validate_repository",
        "the message of ReferenceError::Invalid, which names the reference",
    ),
    (
        "harness/src/cli.rs",
        "parse_mode",
        "a clap value parser: clap prints the String as the flag's error",
    ),
    (
        "oci/src/unpack.rs",
        "split_path",
        "the reason of the layer's unsafe-entry OciError, which names the entry",
    ),
];

/// The functions of `text` (before its test module) whose return type is `Result<_, String>`,
/// with whether each is visible outside its module (`pub`, `pub(crate)`, `pub(super)`).
fn string_errors(text: &str) -> Vec<(String, bool)> {
    let text = production(text);
    let sig = regex::Regex::new(
        r"(?m)^[ \t]*(pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?fn\s+(\w+)[^;{]*?->\s*(Result<[^;{]*?>)\s*(?:where[^{]*)?\{",
    )
    .unwrap();
    let tail = regex::Regex::new(r",\s*String\s*>$").unwrap();
    sig.captures_iter(text)
        .filter(|c| tail.is_match(&c[3]))
        .map(|c| (c[2].to_string(), c.get(1).is_some()))
        .collect()
}

#[test]
fn no_public_string_errors_and_each_private_one_has_a_reason() {
    let root = workspace_root();
    let files = production_rust_files(SCANNED);
    let mut found = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&root).unwrap().display().to_string();
        for (name, public) in string_errors(&std::fs::read_to_string(f).unwrap()) {
            found.push((rel.clone(), name, public));
        }
    }
    let public: Vec<_> = found.iter().filter(|(_, _, p)| *p).collect();
    assert!(
        public.is_empty(),
        "public functions returning Result<_, String> (give them a thiserror type): {public:#?}"
    );
    let new: Vec<_> = found
        .iter()
        .filter(|(f, n, _)| {
            !PRIVATE_MESSAGES
                .iter()
                .any(|(lf, ln, _)| lf == f && ln == n)
        })
        .collect();
    assert!(
        new.is_empty(),
        "functions returning Result<_, String> (give them a thiserror type, or list a private \
         one in PRIVATE_MESSAGES with its reason): {new:#?}"
    );
    let gone: Vec<_> = PRIVATE_MESSAGES
        .iter()
        .filter(|(lf, ln, _)| !found.iter().any(|(f, n, _)| f == lf && n == ln))
        .collect();
    assert!(
        gone.is_empty(),
        "typed now, remove from PRIVATE_MESSAGES: {gone:#?}"
    );
    assert!(
        PRIVATE_MESSAGES.iter().all(|(_, _, why)| why.len() > 20),
        "each entry says why its String stays"
    );
}

/// The scanner finds a multi-line signature, skips typed ones and the test module.
#[test]
fn the_scanner_reads_signatures() {
    let text = "pub fn a(x: u8)\n    -> Result<(), String> {\n}\nfn b() -> Result<u8, MyError> {}\nasync fn c<'a>(\n    y: &'a str,\n) -> Result<Vec<String>, String>\nwhere\n    T: X,\n{\n}\npub(crate) async fn e() -> Result<(), String> {}\n#[cfg(test)]\nmod tests {\n    fn d() -> Result<(), String> {}\n}\n";
    assert_eq!(
        string_errors(text),
        [("a".into(), true), ("c".into(), false), ("e".into(), true)]
    );
}

/// A classified seam error has no blanket conversion from `anyhow::Error`: such an impl makes
/// every `?` pick one class (issue #32: `SeamError` turned any failure into a transient one).
#[test]
fn no_blanket_conversion_from_anyhow() {
    let files = production_rust_files(SCANNED);
    let hits: Vec<_> = files
        .iter()
        .filter(|f| {
            production(&std::fs::read_to_string(f).unwrap())
                .contains("impl From<anyhow::Error> for")
        })
        .collect();
    assert!(
        hits.is_empty(),
        "classify at the call site instead: {hits:#?}"
    );
}
