//! Repository tidiness, checked on the real tree: every Rust module opens with a `//!` doc, the
//! README's first commands are the two set-up commands, `.ci/run` calls the README's test
//! command, and ARCHITECTURE.md's Crates section names every workspace crate and the modules of
//! the agent, the host, the API and the OCI crates (that every repository path the docs name
//! exists is `docs_paths.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::path::{Path, PathBuf};

use flex_tests::{workspace_members, workspace_root};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            if name != "target" && !name.starts_with('.') && name != "snapshots" {
                rust_files(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_module_has_a_doc_comment() {
    let root = workspace_root();
    let mut files = Vec::new();
    for d in workspace_members() {
        rust_files(&root.join(d), &mut files);
    }
    // Generated code is included by a module that carries the doc.
    files.retain(|p| !p.components().any(|c| c.as_os_str() == "generated"));
    assert!(files.len() > 10);
    let missing: Vec<_> = files
        .iter()
        .filter(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            !text.trim_start().starts_with("//!")
        })
        .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "files without a //! module doc: {missing:?}"
    );
}

/// The README opens with exactly the two set-up commands in a shell block.
fn readme_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let block = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("README has a ```sh block");
    let head: String = readme.lines().take(12).collect::<Vec<_>>().join("\n");
    assert!(
        head.contains("```sh"),
        "the commands must be in the README's first lines"
    );
    block
        .lines()
        .map(|l| l.split('#').next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn readme_gives_the_two_setup_commands() {
    let cmds = readme_commands();
    assert_eq!(cmds.len(), 2, "{cmds:?}");
    assert!(cmds[0].ends_with("cargo xtask up"), "{cmds:?}");
    assert!(cmds[1].ends_with("cargo xtask ci"), "{cmds:?}");
}

#[test]
fn ci_runs_the_readme_test_command_after_installing_packages() {
    let ci = std::fs::read_to_string(workspace_root().join(".ci/run")).unwrap();
    let test_cmd = readme_commands()[1].clone();
    let test_cmd = test_cmd.rsplit("&& ").next().unwrap().trim().to_string();
    assert!(ci.contains(&test_cmd), ".ci/run does not run {test_cmd:?}");
    let update = ci.find("apt-get update").expect("apt-get update");
    let install = ci.find("apt-get install").expect("apt-get install");
    assert!(update < install && install < ci.find(&test_cmd).unwrap());
}

#[test]
fn architecture_code_map_names_every_crate_and_module() {
    let root = workspace_root();
    let arch = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let members = workspace_members();
    assert!(members.len() >= 10, "{members:?}");
    for c in &members {
        assert!(
            arch.contains(&format!("`{c}/`")),
            "ARCHITECTURE.md's Crates section does not mention the crate {c}/"
        );
    }
    for lib in [
        "agent/src/lib.rs",
        "agent/src/machine/mod.rs",
        "agent/src/flows/mod.rs",
        "host/src/lib.rs",
        "api/src/lib.rs",
        "oci/src/lib.rs",
    ] {
        let text = std::fs::read_to_string(root.join(lib)).unwrap();
        for m in text.lines().filter_map(|l| l.strip_prefix("pub mod ")) {
            let m = m.trim_end_matches(';');
            assert!(
                arch.contains(&format!("`{m}`")),
                "ARCHITECTURE.md's Crates section lacks module `{m}` of {lib}"
            );
        }
    }
}
