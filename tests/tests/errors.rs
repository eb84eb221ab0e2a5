//! Typed errors at the seams: a function of production code returns a `thiserror` type (or
//! `anyhow` at the edges), not `Result<_, String>`, so its callers can decide on the failure.
//! Checked on the real tree by scanning every function signature (multi-line ones too) of the
//! workspace's production code. What is left is listed in [`LEFT`], each entry a function that
//! still returns a `String` error; the list may only shrink: a new one fails this test, and so
//! does an entry whose function no longer returns a `String` (remove it).

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

/// `(file, function)` still returning `Result<_, String>` (issue #32 item 2 is open on them).
/// The private validators among them build the message a typed error naming the field
/// carries (`ValidationError`, `OciError::Invalid`, …): their `String` is that message.
const LEFT: &[(&str, &str)] = &[
    ("agent/src/config/validate.rs", "check_label_key"),
    ("agent/src/config/validate.rs", "check_label_value"),
    ("agent/src/config/validate.rs", "check_taint"),
    ("agent/src/config/validate.rs", "check_ip"),
    ("agent/src/config/validate.rs", "check_https_endpoint"),
    ("agent/src/config/validate.rs", "check_registry_mirror"),
    ("agent/src/config/validate.rs", "parse"),
    ("agent/src/flows/bootstrap/inputs.rs", "parse_bool"),
    ("agent/src/flows/operations/handlers.rs", "parse_params"),
    ("agent/src/flows/preflight.rs", "parse"),
    ("agent/src/flows/preflight.rs", "verdict"),
    ("agent/src/flows/start.rs", "goal_from_config"),
    ("agent/src/flows/status.rs", "image_digest"),
    ("agent/src/flows/upgrade/flow.rs", "open_agent_binary"),
    ("agent/src/goalclient/arm.rs", "from_config"),
    ("agent/src/goalclient/arm.rs", "parse"),
    ("agent/src/goalclient/azure.rs", "parse_token_response"),
    ("agent/src/goalclient/incluster.rs", "parse"),
    ("agent/src/kubeclient/store.rs", "cert_facts"),
    ("agent/src/kubeclient/store.rs", "check"),
    ("agent/src/kubeclient/store.rs", "parse_key"),
    ("agent/src/kubeclient/store.rs", "split_pair"),
    (
        "agent/src/machine/components/archive.rs",
        "clean_member_name",
    ),
    ("agent/src/machine/components/reachability.rs", "probe"),
    (
        "agent/src/machine/components/reachability.rs",
        "offline_index",
    ),
    ("agent/src/machine/components/sources.rs", "go_format"),
    ("agent/src/machine/containerd/mod.rs", "plain_http_for"),
    ("agent/src/machine/nodeconfig.rs", "decode_base64"),
    ("api/src/image/reference.rs", "validate_registry"),
    ("api/src/image/reference.rs", "validate_tag"),
    ("api/src/image/reference.rs", "check_repository_length"),
    ("api/src/image/reference.rs", "validate_repository"),
    ("controller/src/cli.rs", "parse_duration"),
    ("controller/src/cli.rs", "parse_go_bool"),
    ("controller/src/csr.rs", "parse_request"),
    ("controller/src/csr.rs", "examine"),
    ("controller/src/csr.rs", "authorize_bootstrap_token"),
    ("controller/src/csr.rs", "authorize_token_for_machine"),
    ("harness/src/cli.rs", "parse_mode"),
    ("oci/src/unpack.rs", "split_path"),
];

/// The functions of `text` (before its test module) whose return type is `Result<_, String>`.
fn string_errors(text: &str) -> Vec<String> {
    let text = production(text);
    let sig = regex::Regex::new(
        r"(?m)^[ \t]*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?fn\s+(\w+)[^;{]*?->\s*(Result<[^;{]*?>)\s*(?:where[^{]*)?\{",
    )
    .unwrap();
    let tail = regex::Regex::new(r",\s*String\s*>$").unwrap();
    sig.captures_iter(text)
        .filter(|c| tail.is_match(&c[2]))
        .map(|c| c[1].to_string())
        .collect()
}

#[test]
fn string_errors_only_shrink() {
    let root = workspace_root();
    let files = production_rust_files(SCANNED);
    let mut found = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&root).unwrap().display().to_string();
        for name in string_errors(&std::fs::read_to_string(f).unwrap()) {
            found.push((rel.clone(), name));
        }
    }
    let new: Vec<_> = found
        .iter()
        .filter(|(f, n)| !LEFT.iter().any(|(lf, ln)| lf == f && ln == n))
        .collect();
    assert!(
        new.is_empty(),
        "functions returning Result<_, String> (give them a thiserror type): {new:#?}"
    );
    let gone: Vec<_> = LEFT
        .iter()
        .filter(|(lf, ln)| !found.iter().any(|(f, n)| f == lf && n == ln))
        .collect();
    assert!(gone.is_empty(), "typed now, remove from LEFT: {gone:#?}");
}

/// The scanner finds a multi-line signature, skips typed ones and the test module.
#[test]
fn the_scanner_reads_signatures() {
    let text = "pub fn a(x: u8)\n    -> Result<(), String> {\n}\nfn b() -> Result<u8, MyError> {}\nasync fn c<'a>(\n    y: &'a str,\n) -> Result<Vec<String>, String>\nwhere\n    T: X,\n{\n}\n#[cfg(test)]\nmod tests {\n    fn d() -> Result<(), String> {}\n}\n";
    assert_eq!(string_errors(text), ["a", "c"]);
}
