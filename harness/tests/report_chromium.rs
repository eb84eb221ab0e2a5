//! The HTML check report in a real browser: a run report (the only made-up part: no VM ran)
//! is written as JUnit and as `report.html`, real headless Chromium (Debian's `chromium`, run
//! through `flex_host::runner`) loads the page, and the DOM it dumps must show every JUnit
//! testcase (parsed back from the JUnit file, not taken from the model) with its result and
//! duration, the failures' messages and journals, and one timeline rectangle per check. A
//! screenshot goes to `target/tmp/report-screenshot.png` for a person to look at.
//!
//! Chromium missing is a failure, not a skip: CI installs it (`.ci/run`, `TEST_PACKAGES`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::path::Path;
use std::time::{Duration, Instant};

use flex_harness::report::{
    CheckReport, GroupReport, Outcome, RunReport, render_html, render_junit,
};
use flex_host::runner::{Cmd, ProcessRunner, Runner};

const EVIL: &str = "<script>alert(\"x\")</script> & 'quoted'";

fn check(name: &str, outcome: Outcome, ms: u64) -> CheckReport {
    CheckReport {
        name: name.into(),
        outcome,
        duration: Duration::from_millis(ms),
        detail: None,
        steps: Vec::new(),
        journal: None,
    }
}

fn report() -> RunReport {
    let mut failed = check(
        &format!("back after reboot {EVIL}"),
        Outcome::Failed(format!(
            "timed out after 120s waiting for the guest; last console lines:\n[   12.345] reboot: Restarting system\n[   13.001] {EVIL}"
        )),
        45_250,
    );
    failed.journal = Some(format!(
        "[ 10.1] systemd[1]: systemd-nspawn@kube1.service: Failed with result 'exit-code'.\n[ 10.2] aks-flex-node-agent[77]: ERROR {EVIL}"
    ));
    let mut with_detail = check("upgrade to a good candidate", Outcome::Passed, 20_400);
    with_detail.detail = Some("new agent running 12.3s after the operation started".into());
    RunReport {
        groups: vec![
            GroupReport {
                name: "machines".into(),
                duration: Duration::from_millis(61_234),
                checks: vec![
                    check("machine in machine.slice", Outcome::Passed, 1_500),
                    failed,
                    check(
                        "machine survives agent restart",
                        Outcome::Skipped("an earlier check of this group failed".into()),
                        0,
                    ),
                ],
            },
            GroupReport {
                name: "upgrade".into(),
                duration: Duration::from_millis(30_010),
                checks: vec![
                    with_detail,
                    check("rollback on a bad candidate", Outcome::Passed, 7_777),
                ],
            },
            GroupReport {
                name: "node-join".into(),
                duration: Duration::ZERO,
                checks: vec![check(
                    "node Ready",
                    Outcome::Skipped("no cluster (no kind binary on PATH)".into()),
                    0,
                )],
            },
        ],
        ..Default::default()
    }
}

/// One `<testcase>` as read back from the JUnit file.
#[derive(Debug)]
struct Case {
    name: String,
    time: String,
    result: &'static str,
    failure: Option<String>,
    system_err: Option<String>,
}

fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

fn attr(tag: &str, name: &str) -> String {
    let key = format!(" {name}=\"");
    let start = tag
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {tag}"))
        + key.len();
    let len = tag[start..].find('"').unwrap();
    xml_unescape(&tag[start..start + len])
}

fn element_text(body: &str, name: &str) -> Option<String> {
    let open = body.find(&format!("<{name}"))?;
    let content = open + body[open..].find('>')? + 1;
    let end = content + body[content..].find(&format!("</{name}>"))?;
    Some(xml_unescape(&body[content..end]))
}

/// The testcases of a JUnit file, in order (the harness's own JUnit layout: attributes in
/// double quotes, `<failure>`/`<skipped>`/`<system-err>` inside the testcase).
fn parse_junit(xml: &str) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find("<testcase ") {
        rest = &rest[i..];
        let tag_end = rest.find('>').unwrap();
        let tag = &rest[..tag_end];
        let (body, next) = if tag.ends_with('/') {
            ("", tag_end + 1)
        } else {
            let end = rest.find("</testcase>").unwrap();
            (&rest[tag_end + 1..end], end)
        };
        let result = if body.contains("<failure") {
            "failed"
        } else if body.contains("<skipped") {
            "skipped"
        } else {
            "passed"
        };
        cases.push(Case {
            name: attr(tag, "name"),
            time: attr(tag, "time"),
            result,
            failure: element_text(body, "failure"),
            system_err: element_text(body, "system-err"),
        });
        rest = &rest[next..];
    }
    cases
}

/// Text as Chromium serializes a text node in `--dump-dom`.
fn dom_text(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\u{a0}', "&nbsp;")
}

/// Runs headless Chromium on `page` with a fresh profile; `extra` says what to produce.
async fn chromium(r: &ProcessRunner, profile: &Path, page: &Path, extra: &[String]) -> String {
    let mut args = vec![
        "--headless".to_string(),
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--disable-quic".into(),
        "--no-first-run".into(),
        "--disable-background-networking".into(),
        "--disable-component-update".into(),
        "--disable-sync".into(),
        format!("--user-data-dir={}", profile.display()),
    ];
    args.extend(extra.iter().cloned());
    args.push(format!("file://{}", page.display()));
    let out = r
        .run(
            &Cmd::new("chromium")
                .args(args)
                .timeout(Duration::from_secs(180)),
        )
        .await
        .unwrap_or_else(|e| panic!("chromium failed: {e}"));
    out.stdout
}

#[tokio::test]
async fn chromium_shows_what_the_junit_file_says() {
    let r = ProcessRunner::new();
    assert!(
        r.which("chromium").is_some(),
        "chromium is not installed: apt-get install chromium (it is in .ci/run and xtask's TEST_PACKAGES)"
    );
    let dir = tempfile::tempdir().unwrap();
    let run = report();
    let junit_path = dir.path().join("check-junit.xml");
    let html_path = dir.path().join("report.html");
    std::fs::write(&junit_path, render_junit(&run)).unwrap();
    std::fs::write(&html_path, render_html(&run)).unwrap();

    let cases = parse_junit(&std::fs::read_to_string(&junit_path).unwrap());
    assert_eq!(cases.len(), 6, "{cases:#?}");

    let started = Instant::now();
    let dom = chromium(
        &r,
        &dir.path().join("profile-dom"),
        &html_path,
        &["--dump-dom".to_string()],
    )
    .await;
    eprintln!(
        "chromium --dump-dom took {:.2}s",
        started.elapsed().as_secs_f64()
    );

    assert!(dom.contains("<h1>aks-flex-node check</h1>"), "{dom}");
    // The names are text, not markup.
    assert!(!dom.contains("<script"), "{dom}");
    for c in &cases {
        let seconds: f64 = c.time.parse().unwrap();
        let row = format!(
            "<tr class=\"check {res}\"><td class=\"name\">{name}</td><td class=\"result\">{res}</td><td class=\"time\"><time datetime=\"PT{time}S\">{shown:.1}s</time></td>",
            res = c.result,
            name = dom_text(&c.name),
            time = c.time,
            shown = seconds
        );
        assert!(dom.contains(&row), "no row {row}\nin\n{dom}");
        if let Some(f) = &c.failure {
            let pre = format!("<pre class=\"message\">{}</pre>", dom_text(f));
            assert!(dom.contains(&pre), "no {pre}\nin\n{dom}");
        }
        if let Some(j) = &c.system_err {
            let pre = format!("<pre class=\"journal\">{}</pre>", dom_text(j));
            assert!(dom.contains(&pre), "no {pre}\nin\n{dom}");
        }
    }
    assert!(
        cases
            .iter()
            .any(|c| c.failure.is_some() && c.system_err.is_some())
    );
    // The timeline: one rectangle per check, of its result.
    let rects = dom.matches("<rect class=\"check ").count();
    assert_eq!(rects, cases.len(), "{dom}");
    for res in ["passed", "failed", "skipped"] {
        assert_eq!(
            dom.matches(&format!("<rect class=\"check {res}\"")).count(),
            cases.iter().filter(|c| c.result == res).count(),
            "{res}"
        );
    }
    let (p, f, k) = run.counts();
    assert!(
        dom.contains(&format!("{p} passed</span>, <span class=\"failed\">{f} failed</span>, <span class=\"skipped\">{k} skipped")),
        "{dom}"
    );

    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report-screenshot.png");
    let _ = std::fs::remove_file(&shot);
    let started = Instant::now();
    chromium(
        &r,
        &dir.path().join("profile-shot"),
        &html_path,
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1280,1100".to_string(),
            "--hide-scrollbars".to_string(),
        ],
    )
    .await;
    eprintln!(
        "chromium --screenshot took {:.2}s: {}",
        started.elapsed().as_secs_f64(),
        shot.display()
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(png.len() > 10_000, "{} bytes", png.len());
}
