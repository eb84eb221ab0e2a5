//! The GitHub workflows (`.github/workflows/*.yml`) parse, keep least privilege and call only
//! commands that exist: every `cargo xtask TASK FLAGS` a `run:` step runs (or a repository
//! script it runs, such as `.ci/run`, runs) is parsed by xtask's own task table
//! (`xtask::tasks::parse`, which its dispatcher uses) and, for the harness's tasks, by the
//! harness's clap definitions (`flex_harness::cli::Cli`, which its binary uses). Real files and
//! real parsers; nothing is faked. The checker itself is shown to refuse a bad task or flag.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::collections::BTreeSet;
use std::path::Path;

use clap::{CommandFactory, Parser};
use flex_tests::workspace_root;
use serde_json::Value;

fn workflows() -> Vec<(String, Value)> {
    let dir = workspace_root().join(".github/workflows");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !(name.ends_with(".yml") || name.ends_with(".yaml")) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let doc: Value = serde_saphyr::from_str(&text)
            .unwrap_or_else(|e| panic!("{name} does not parse as YAML: {e}"));
        out.push((name, doc));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn doc<'a>(all: &'a [(String, Value)], name: &str) -> &'a Value {
    &all.iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no .github/workflows/{name}"))
        .1
}

/// Every step of every job.
fn steps(doc: &Value) -> Vec<&Value> {
    doc["jobs"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|j| j["steps"].as_array().unwrap())
        .collect()
}

/// The shell words of one simple command, up to a redirection or comment.
fn words(segment: &str) -> Vec<String> {
    segment
        .split_whitespace()
        .take_while(|w| !w.starts_with('#') && !w.starts_with('>') && !w.starts_with("2>"))
        .map(|w| w.trim_matches(|c| c == '"' || c == '\'').to_string())
        .collect()
}

/// The simple commands of a shell script: continuation lines joined, split at `&&`, `||`, `;`
/// and `|`, comments dropped.
fn commands(script: &str) -> Vec<Vec<String>> {
    let joined = script.replace("\\\n", " ");
    let mut out = Vec::new();
    for line in joined.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        for seg in line
            .split("&&")
            .flat_map(|s| s.split("||"))
            .flat_map(|s| s.split(';'))
            .flat_map(|s| s.split('|'))
        {
            let w = words(seg);
            if !w.is_empty() {
                out.push(w);
            }
        }
    }
    out
}

/// `cargo xtask …`'s arguments (the task first) in `script`, and in the repository scripts it
/// runs by path (one level deep).
fn xtask_calls(script: &str, root: &Path) -> Vec<Vec<String>> {
    let mut calls = Vec::new();
    for cmd in commands(script) {
        if let Some(i) = cmd
            .windows(2)
            .position(|w| w[0] == "cargo" && w[1] == "xtask")
        {
            calls.push(cmd[i + 2..].to_vec());
        }
        for w in &cmd {
            let p = root.join(w.trim_start_matches("./"));
            if (w.starts_with("./") || w.starts_with(".ci/") || w.starts_with("scripts/"))
                && p.is_file()
            {
                let text = std::fs::read_to_string(&p).unwrap();
                for inner in commands(&text) {
                    if let Some(i) = inner
                        .windows(2)
                        .position(|x| x[0] == "cargo" && x[1] == "xtask")
                    {
                        calls.push(inner[i + 2..].to_vec());
                    }
                }
            }
        }
    }
    calls
}

/// Whether `cargo xtask <args>` is a task and flags the dispatcher and the harness accept.
fn accepted(args: &[String]) -> Result<(), String> {
    let (task, rest) = args.split_first().ok_or("`cargo xtask` without a task")?;
    match xtask::tasks::parse(task, rest).map_err(|e| format!("{e:#}"))? {
        xtask::tasks::Task::Harness(argv) => {
            let mut v = vec!["cargo xtask".to_string()];
            v.extend(argv);
            flex_harness::cli::Cli::try_parse_from(v)
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
        _ => Ok(()),
    }
}

fn all_calls(all: &[(String, Value)]) -> Vec<(String, Vec<String>)> {
    let root = workspace_root();
    let mut out = Vec::new();
    for (name, d) in all {
        for s in steps(d) {
            if let Some(run) = s["run"].as_str() {
                for c in xtask_calls(run, &root) {
                    out.push((name.clone(), c));
                }
            }
        }
    }
    out
}

#[test]
fn workflows_parse_and_call_only_commands_that_exist() {
    let all = workflows();
    let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["ci.yml", "e2e.yml", "release.yml"]);
    let calls = all_calls(&all);
    assert!(calls.len() >= 7, "{calls:?}");
    for (file, args) in &calls {
        if let Err(e) = accepted(args) {
            panic!("{file}: `cargo xtask {}` is refused: {e}", args.join(" "));
        }
    }
    let has = |file: &str, want: &[&str]| {
        calls
            .iter()
            .any(|(f, a)| f == file && want.iter().all(|w| a.iter().any(|x| x == w)))
    };
    // ci.yml: the README's test command, through .ci/run.
    assert!(has("ci.yml", &["ci"]), "{calls:?}");
    // e2e.yml: a kind cluster, then check and down.
    assert!(has("e2e.yml", &["up", "--cluster"]), "{calls:?}");
    assert!(has("e2e.yml", &["check"]) && has("e2e.yml", &["down"]));
    // release.yml: both images, the agent's checked reproducible.
    assert!(has("release.yml", &["image", "--check-reproducible"]));
    assert!(has("release.yml", &["image", "--controller"]));
}

/// The checker can fail: an unknown task, an unknown flag, flags that exclude each other.
#[test]
fn the_command_check_refuses_what_the_dispatcher_would() {
    let a = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
    assert!(accepted(&a("check --rerun-failed")).is_ok());
    assert!(accepted(&a("ssh -- journalctl -b")).is_ok());
    assert!(accepted(&a("ci --no-install")).is_ok());
    assert!(accepted(&a("bogus")).unwrap_err().contains("unknown task"));
    assert!(accepted(&a("up --no-such-flag")).is_err());
    assert!(accepted(&a("ci --cluster")).is_err());
    assert!(accepted(&a("check --rerun-failed --only mounts")).is_err());
    assert!(accepted(&a("image --controller --check-reproducible")).is_err());
    let found = xtask_calls(
        "mkdir -p x && cargo xtask up --cluster \\\n  --tcg || true\necho 'cargo' # cargo xtask down",
        &workspace_root(),
    );
    assert_eq!(found, [a("up --cluster --tcg")]);
}

/// xtask hands the harness exactly the tasks the harness defines.
#[test]
fn xtask_forwards_every_harness_task() {
    let harness: BTreeSet<String> = flex_harness::cli::Cli::command()
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    let forwarded: BTreeSet<String> = xtask::tasks::HARNESS_TASKS
        .iter()
        .map(|t| t.to_string())
        .collect();
    assert_eq!(harness, forwarded);
}

/// Every `uses:` line of a workflow's text, as written (the YAML parser drops comments):
/// (line number, the value, the comment after it).
fn uses_lines(text: &str) -> Vec<(usize, String, Option<String>)> {
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let l = l.trim_start();
            let l = l.strip_prefix("- ").unwrap_or(l).trim_start();
            let rest = l.strip_prefix("uses:")?;
            let (value, comment) = match rest.split_once(" #") {
                Some((v, c)) => (v, Some(c.trim().to_string())),
                None => (rest, None),
            };
            Some((
                i + 1,
                value
                    .trim()
                    .trim_matches(|c| c == '"' || c == '\'')
                    .to_string(),
                comment,
            ))
        })
        .collect()
}

/// Whether one `uses:` is pinned: a local action (`./…`), or `owner/repo[/path]@<40 hex>` with
/// the release it is in a `# vX.Y.Z` comment.
fn pinned(value: &str, comment: Option<&str>) -> Result<(), String> {
    if value.starts_with("./") {
        return Ok(());
    }
    let (action, reference) = value
        .split_once('@')
        .ok_or_else(|| format!("{value}: no @ref"))?;
    if action.split('/').filter(|p| !p.is_empty()).count() < 2 {
        return Err(format!("{value}: not owner/repo@ref"));
    }
    let sha = reference.len() == 40
        && reference
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
    if !sha {
        return Err(format!(
            "{value}: pinned by {reference:?}, not by a full commit SHA"
        ));
    }
    let release = comment
        .and_then(|c| c.split_whitespace().next())
        .and_then(|v| v.strip_prefix('v'))
        .map(|v| v.split('.').collect::<Vec<_>>());
    match release {
        Some(parts)
            if parts.len() == 3
                && parts
                    .iter()
                    .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit())) =>
        {
            Ok(())
        }
        _ => Err(format!(
            "{value}: the release it pins belongs in a `# vX.Y.Z` comment (found {comment:?})"
        )),
    }
}

/// Least privilege: read-only contents at the top of every workflow; OIDC tokens and
/// attestations only where the release signs; every third-party action pinned by full commit
/// SHA with its release in a comment (`uses: actions/checkout@<sha> # v7.0.1`), every `uses:`
/// the YAML has seen on a line of its own.
#[test]
fn workflows_keep_least_privilege_and_pin_their_actions() {
    let all = workflows();
    let dir = workspace_root().join(".github/workflows");
    let mut unpinned = Vec::new();
    for (name, d) in &all {
        assert_eq!(
            d["permissions"],
            serde_json::json!({"contents": "read"}),
            "{name}: top-level permissions"
        );
        for (job, j) in d["jobs"].as_object().unwrap() {
            let perms = &j["permissions"];
            for scope in ["id-token", "attestations", "packages"] {
                if !perms[scope].is_null() {
                    assert_eq!(
                        name, "release.yml",
                        "{name}/{job} asks for {scope}: only the release signs and pushes"
                    );
                }
            }
            assert!(
                perms.is_null() || perms["contents"] == "read",
                "{name}/{job}: {perms}"
            );
        }
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        let lines = uses_lines(&text);
        let parsed: Vec<&str> = steps(d).iter().filter_map(|s| s["uses"].as_str()).collect();
        let seen: Vec<&str> = lines.iter().map(|(_, v, _)| v.as_str()).collect();
        assert_eq!(seen, parsed, "{name}: a `uses:` the line scan does not see");
        for (line, value, comment) in &lines {
            if let Err(e) = pinned(value, comment.as_deref()) {
                unpinned.push(format!("{name}:{line}: {e}"));
            }
        }
    }
    assert!(
        unpinned.is_empty(),
        "unpinned actions:\n{}",
        unpinned.join("\n")
    );
    let release = doc(&all, "release.yml");
    let perms = &release["jobs"]["images"]["permissions"];
    assert_eq!(perms["id-token"], "write");
    assert_eq!(perms["attestations"], "write");
}

/// The pin check can fail: a tag, a short SHA, a missing or partial release comment.
#[test]
fn the_pin_check_refuses_tags_and_bare_shas() {
    let sha = "3d3c42e5aac5ba805825da76410c181273ba90b1";
    assert!(pinned(&format!("actions/checkout@{sha}"), Some("v7.0.1")).is_ok());
    assert!(pinned("./.github/actions/local", None).is_ok());
    assert!(pinned("actions/checkout@v4", Some("v4.2.2")).is_err());
    assert!(pinned("actions/checkout@3d3c42e", Some("v7.0.1")).is_err());
    assert!(
        pinned(
            &format!("actions/checkout@{}", sha.to_uppercase()),
            Some("v7.0.1")
        )
        .is_err()
    );
    assert!(pinned(&format!("actions/checkout@{sha}"), None).is_err());
    assert!(pinned(&format!("actions/checkout@{sha}"), Some("v7")).is_err());
    assert!(pinned(&format!("checkout@{sha}"), Some("v7.0.1")).is_err());
    assert_eq!(
        uses_lines(&format!(
            "steps:\n  - uses: actions/checkout@{sha} # v7.0.1\n    with:\n      uses: x\n  - name: n\n    uses: \"a/b@v1\"\n"
        )),
        [
            (
                2,
                format!("actions/checkout@{sha}"),
                Some("v7.0.1".to_string())
            ),
            (4, "x".to_string(), None),
            (6, "a/b@v1".to_string(), None),
        ]
    );
}

/// e2e keeps what explains a failure: the JUnit file, the HTML report, each group's journal
/// and console excerpt, whatever happened.
#[test]
fn e2e_uploads_the_reports_and_journals() {
    let all = workflows();
    let upload = steps(doc(&all, "e2e.yml"))
        .into_iter()
        .find(|s| {
            s["uses"]
                .as_str()
                .is_some_and(|u| u.starts_with("actions/upload-artifact@"))
        })
        .expect("an upload step");
    assert_eq!(upload["if"], "always()");
    let paths = upload["with"]["path"].as_str().unwrap();
    for want in [
        "target/harness/check-junit.xml",
        "target/harness/report.html",
        "target/harness/*/journal.txt",
        "target/harness/*/console.txt",
    ] {
        assert!(paths.contains(want), "{want} not uploaded: {paths}");
    }
}

/// CI's end-to-end passes (`cargo xtask ci`) call `up` with arguments the harness accepts, one
/// pass per agent mode, the image mode first (the ACL way, what the README's figures are of).
#[test]
fn ci_end_to_end_passes_call_up_as_the_harness_defines_it() {
    let passes = xtask::ci::E2E_PASSES;
    assert_eq!(
        passes.iter().map(|p| p.name).collect::<Vec<_>>(),
        ["image", "host", "selinux"]
    );
    for p in passes {
        let mut args = vec!["up".to_string()];
        args.extend(p.up.iter().map(|a| a.to_string()));
        accepted(&args).unwrap_or_else(|e| panic!("pass {}: {e}", p.name));
        let mut args = vec!["check".to_string()];
        args.extend(p.check.iter().map(|a| a.to_string()));
        accepted(&args).unwrap_or_else(|e| panic!("pass {} check: {e}", p.name));
        for task in p.then {
            let args: Vec<String> = task.iter().map(|a| a.to_string()).collect();
            accepted(&args).unwrap_or_else(|e| panic!("pass {} {task:?}: {e}", p.name));
        }
    }
    // The SELinux pass boots the SELinux variant and ends with `selinux verify`.
    let se = &passes[2];
    assert!(se.up.contains(&"--selinux"));
    assert_eq!(se.then, [&["selinux", "verify"][..]]);
    let bad = ["up".to_string(), "--mode".into(), "hosted".into()];
    assert!(accepted(&bad).is_err(), "the check would accept anything");
}
