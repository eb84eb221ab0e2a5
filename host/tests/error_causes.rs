//! Each error type of the host crate prints its cause once (the rule in `flex_host::error`):
//! in its message, so `{e}` keeps it, and never again as a `source()`, so anyhow's `{:#}` and
//! `source()` walkers do not repeat it. Real causes: OS errors from real files and processes.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::path::Path;

use flex_host::confine::ResolveError;
use flex_host::fs::HostFs;
use flex_host::hostexec::ExecError;
use flex_host::runner::{Cmd, ProcessRunner, Runner};
use flex_testkit::assert_cause_once;

fn not_a_directory() -> std::io::Error {
    std::fs::read_dir("/proc/self/status").unwrap_err()
}

#[tokio::test]
async fn every_host_error_prints_its_cause_once() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("file"), "x").unwrap();
    let fs = HostFs::new(d.path());
    let fs_err = fs.read(Path::new("/file/child")).unwrap_err();
    let spawn_err = ProcessRunner::new()
        .run(&Cmd::new("/nonexistent/flex-no-such-tool"))
        .await
        .unwrap_err();
    let os = not_a_directory().to_string();
    let body_err = flex_host::http::BodyError::Read(
        flex_host::http::client()
            .unwrap()
            .get("http://[::1")
            .build()
            .unwrap_err(),
    );
    let cases: Vec<(&str, Box<dyn std::error::Error>, String)> = vec![
        ("FsError", Box::new(fs_err), os.clone()),
        (
            "CmdError::Spawn",
            Box::new(spawn_err),
            "No such file or directory".into(),
        ),
        (
            "ExecError::Enter",
            Box::new(ExecError::Enter {
                step: "chdir /",
                cause: not_a_directory(),
            }),
            os.clone(),
        ),
        (
            "ExecError::Exec",
            Box::new(ExecError::Exec {
                program: "/usr/bin/x".into(),
                cause: not_a_directory(),
            }),
            os.clone(),
        ),
        (
            "ResolveError::Io",
            Box::new(ResolveError::Io("open", "/a".into(), not_a_directory())),
            os.clone(),
        ),
        ("BodyError::Read", Box::new(body_err), "invalid".into()),
    ];
    for (name, e, cause) in &cases {
        eprintln!("{name}: {e}");
        assert_cause_once(e.as_ref(), cause);
    }
}
