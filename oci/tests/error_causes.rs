//! Each pull and unpack error prints its cause once (the rule in `flex_host::error`): in its
//! message, so the agent's `error = %e` logs keep it, and never again as a `source()`, so the
//! CLI's `{:#}` does not repeat it. Real causes where cheap: OS errors of real paths, a real
//! client error.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::path::Path;

use flex_oci::{OciError, UnpackError, UnpackOptions, unpack_layer};
use flex_testkit::assert_cause_once;

fn os_error(p: &Path) -> std::io::Error {
    std::fs::read(p).unwrap_err()
}

#[tokio::test]
async fn every_oci_error_prints_its_cause_once() {
    let d = tempfile::tempdir().unwrap();
    let missing = d.path().join("missing");
    let os = os_error(&missing).to_string();
    let root_err =
        unpack_layer(&missing, "sha256:aa", &b""[..], &UnpackOptions::default()).unwrap_err();
    let http_cause = flex_host::http::client()
        .unwrap()
        .get("http://[::1")
        .send()
        .await
        .unwrap_err();
    let io = || OciError::Io {
        reference: "r/i:1".into(),
        op: "read",
        path: missing.clone(),
        cause: os_error(&missing),
    };
    let cases: Vec<(&str, Box<dyn std::error::Error>, String)> = vec![
        ("UnpackError::Root", Box::new(root_err), os.clone()),
        (
            "UnpackError::Entry",
            Box::new(UnpackError::Entry {
                layer: "l".into(),
                entry: "etc/x".into(),
                op: "create",
                cause: os_error(&missing),
            }),
            os.clone(),
        ),
        (
            "UnpackError::Read",
            Box::new(UnpackError::Read {
                layer: "l".into(),
                op: "open blob",
                cause: os_error(&missing),
            }),
            os.clone(),
        ),
        ("OciError::Io", Box::new(io()), os.clone()),
        (
            "OciError::Unpack",
            Box::new(OciError::Unpack {
                reference: "r/i:1".into(),
                cause: UnpackError::Read {
                    layer: "l".into(),
                    op: "open blob",
                    cause: os_error(&missing),
                },
            }),
            os.clone(),
        ),
        (
            "OciError::GaveUp",
            Box::new(OciError::GaveUp {
                reference: "r/i:1".into(),
                attempts: 3,
                cause: Box::new(io()),
            }),
            os.clone(),
        ),
        (
            "OciError::Http",
            Box::new(OciError::Http {
                reference: "r/i:1".into(),
                method: "GET",
                url: "http://[::1".into(),
                cause: http_cause,
            }),
            "invalid IPv6 address".into(),
        ),
    ];
    for (name, e, cause) in &cases {
        eprintln!("{name}: {e}");
        assert_cause_once(e.as_ref(), cause);
    }
}
