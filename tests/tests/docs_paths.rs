//! Every repository path the docs name exists: ARCHITECTURE.md, README.md, DESIGN.md, TODO.md
//! and `docs/*.md`, checked on the real tree, so a file that moves or goes takes its mentions
//! with it.
//!
//! A path is an inline code span (outside fenced blocks) without blanks whose first component
//! is a top-level directory of the repository (`harness/src/kit/`, `.ci/run`); a trailing
//! `:LINE` is dropped. Spans with template or pattern characters (`<name>`, `*`, `{a,b}`, `$X`,
//! `=`) are not paths and are skipped, as are spans without a `/` (a bare file name may be
//! relative to anything).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::collections::BTreeSet;
use std::path::Path;

use flex_tests::workspace_root;

/// The inline code spans of a Markdown text, fenced blocks left out.
fn code_spans(text: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            prose.push_str(line);
        }
        prose.push('\n');
    }
    prose
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|s| s.trim().to_string())
        .collect()
}

/// The repository path `span` names, if it names one: its first component is one of `top`.
fn repo_path(span: &str, top: &BTreeSet<String>) -> Option<String> {
    const NOT_A_PATH: &[char] = &['<', '>', '*', '{', '}', '$', '=', '|', '(', ')'];
    if span.is_empty() || span.contains(char::is_whitespace) || span.contains(NOT_A_PATH) {
        return None;
    }
    let path = match span.rsplit_once(':') {
        Some((p, line)) if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => p,
        _ => span,
    };
    let (first, _) = path.split_once('/')?;
    top.contains(first).then(|| path.to_string())
}

/// The repository's top-level directories (`.git` and `target` excepted).
fn top_level_dirs(root: &Path) -> BTreeSet<String> {
    std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n != ".git" && n != "target")
        .collect()
}

/// The Markdown files checked: the top-level docs and `docs/*.md`.
fn docs(root: &Path) -> Vec<String> {
    let mut out: Vec<String> = ["ARCHITECTURE.md", "README.md", "DESIGN.md", "TODO.md"]
        .into_iter()
        .map(String::from)
        .collect();
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().to_string();
        if name.ends_with(".md") {
            out.push(format!("docs/{name}"));
        }
    }
    out.sort();
    out
}

#[test]
fn every_path_the_docs_name_exists() {
    let root = workspace_root();
    let top = top_level_dirs(&root);
    assert!(top.contains("harness") && top.contains("docs"), "{top:?}");
    let mut checked = 0;
    let mut missing = Vec::new();
    for doc in docs(&root) {
        let text = std::fs::read_to_string(root.join(&doc)).unwrap();
        for path in code_spans(&text).iter().filter_map(|s| repo_path(s, &top)) {
            checked += 1;
            if !root.join(&path).exists() {
                missing.push(format!("{doc}: `{path}`"));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} paths found: is the span parser broken?"
    );
    assert!(
        missing.is_empty(),
        "paths named in the docs that do not exist:\n{}",
        missing.join("\n")
    );
}

/// The checker itself: spans outside fences only, one across a line break included; paths
/// need a known first component and lose a `:LINE` suffix; templates, labels and commands are
/// not paths.
#[test]
fn the_checker_reads_spans_and_recognises_paths() {
    let text = "a `harness/src/kit/agent.rs:40` and `x`\n```sh\n`docs/in-a-fence.md`\n```\n\
                `docs/split\nacross.md` `harness/src/groups/<name>.rs` `harness/label=true`\n";
    let spans = code_spans(text);
    assert_eq!(
        spans,
        [
            "harness/src/kit/agent.rs:40",
            "x",
            "docs/split\nacross.md",
            "harness/src/groups/<name>.rs",
            "harness/label=true"
        ]
    );
    let top: BTreeSet<String> = ["harness", "docs", ".ci"].map(String::from).into();
    let paths: Vec<String> = spans.iter().filter_map(|s| repo_path(s, &top)).collect();
    assert_eq!(paths, ["harness/src/kit/agent.rs"]);
    assert_eq!(repo_path(".ci/run", &top).as_deref(), Some(".ci/run"));
    assert_eq!(repo_path("/etc/aks-flex-node/config.json", &top), None);
    assert_eq!(repo_path("kube1/kube2", &top), None);
    assert_eq!(repo_path("cargo xtask up", &top), None);
    assert_eq!(repo_path("harness/", &top).as_deref(), Some("harness/"));
}
