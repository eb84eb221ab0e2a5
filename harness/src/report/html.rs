//! The check report as one self-contained HTML page (`target/harness/report.html`): a summary,
//! an SVG timeline of the groups with their checks inside (a failed check red, a skipped one
//! grey), a table per group (check, result, duration, note), and for each failure a `<details>`
//! with its whole message (console lines included, when the check put them there) and the
//! journal lines captured when it failed; a rerun says so under the summary, and a group whose
//! journal and console excerpts were kept links them (`<group>/journal.txt`, relative to the
//! page). Inline CSS, no script, no external resource.
//!
//! The markup is also what the Chromium test reads: a check's row is
//! `<tr class="check RESULT"><td class="name">…</td><td class="result">RESULT</td><td
//! class="time"><time datetime="PT…S">…</time></td>…`, and the timeline has one
//! `<rect class="check RESULT">` per check.

use std::fmt::Write as _;
use std::time::Duration;

use super::{CheckReport, Outcome, RunReport};

/// Escapes text for HTML content and quoted attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The result word a check's row and timeline rectangle carry (also their CSS class).
pub fn result_word(o: &Outcome) -> &'static str {
    match o {
        Outcome::Passed => "passed",
        Outcome::Failed(_) => "failed",
        Outcome::Skipped(_) => "skipped",
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// `<time datetime="PT45.000S">45.0s</time>`: the exact seconds as JUnit writes them, shown
/// to a tenth.
fn time(d: Duration) -> String {
    format!(
        "<time datetime=\"PT{:.3}S\">{}</time>",
        d.as_secs_f64(),
        secs(d)
    )
}

const CSS: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1b1b1b;background:#fff}\
h1{font-size:1.4em;margin:0 0 .3em}h2{font-size:1.1em;margin:1.4em 0 .4em}\
h2 .time{font-weight:normal;color:#666;margin-left:.5em}\
.summary{margin:0 0 1em}.summary .failed{color:#b3261e;font-weight:bold}\
.timeline svg{width:100%;height:auto;max-width:1200px;border:1px solid #ddd;background:#fafafa}\
svg text{font:12px system-ui,sans-serif;fill:#333}svg .axis{stroke:#ccc}\
svg rect.group{fill:#e3e8ef}svg rect.check{stroke:#fff;stroke-width:.5}\
svg rect.passed{fill:#2e7d32}svg rect.failed{fill:#c62828}svg rect.skipped{fill:#9e9e9e}\
table{border-collapse:collapse;width:100%;max-width:1200px}\
th,td{border-bottom:1px solid #e0e0e0;padding:.25em .6em;text-align:left;vertical-align:top}\
th{background:#f3f3f3}td.time{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}\
td.result{font-weight:bold}tr.passed td.result{color:#2e7d32}tr.failed td.result{color:#c62828}\
tr.skipped td.result{color:#757575}tr.failed{background:#fdecea}td.note{color:#444}\
details{margin:.2em 0 .6em}summary{cursor:pointer;font-weight:bold}\
pre{background:#1e1e1e;color:#eee;padding:.6em;overflow-x:auto;max-height:32em;font-size:12px;white-space:pre-wrap}";

/// Timeline geometry (SVG user units).
const WIDTH: f64 = 1000.0;
const LABEL: f64 = 170.0;
const LANE: f64 = 24.0;
const BAR: f64 = 16.0;
const MIN_W: f64 = 2.0;

/// The SVG timeline: one lane per group, the group's wall time as a light bar from where it
/// started (the groups run one after another), its checks inside, each ending where the next
/// starts and the last at the group's end (setup such as the snapshot restore comes first).
fn timeline(r: &RunReport) -> String {
    let total: f64 = r.groups.iter().map(|g| g.duration.as_secs_f64()).sum();
    let scale = if total > 0.0 {
        (WIDTH - LABEL - 10.0) / total
    } else {
        0.0
    };
    let height = LANE * r.groups.len() as f64 + 30.0;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} {height}\" role=\"img\" aria-label=\"timeline of the groups and their checks\">"
    );
    // Axis: five ticks over the total.
    let axis_y = LANE * r.groups.len() as f64 + 4.0;
    for i in 0..=4 {
        let t = total * i as f64 / 4.0;
        let x = LABEL + t * scale;
        let _ = write!(
            s,
            "<line class=\"axis\" x1=\"{x:.1}\" y1=\"0\" x2=\"{x:.1}\" y2=\"{axis_y:.1}\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"{}\">{}</text>",
            axis_y + 16.0,
            if i == 0 {
                "start"
            } else if i == 4 {
                "end"
            } else {
                "middle"
            },
            secs(Duration::from_secs_f64(t))
        );
    }
    let mut start = 0.0;
    for (i, g) in r.groups.iter().enumerate() {
        let y = LANE * i as f64 + (LANE - BAR) / 2.0;
        let gd = g.duration.as_secs_f64();
        let _ = write!(
            s,
            "<text x=\"4\" y=\"{:.1}\">{}</text><rect class=\"group\" x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{BAR}\"><title>{} ({})</title></rect>",
            y + BAR - 3.0,
            esc(&g.name),
            LABEL + start * scale,
            (gd * scale).max(MIN_W),
            esc(&g.name),
            secs(g.duration)
        );
        let mut end = start + gd;
        let mut rects = Vec::new();
        for c in g.checks.iter().rev() {
            let d = c.duration.as_secs_f64();
            let x0 = (end - d).max(start);
            rects.push(check_rect(
                &g.name,
                c,
                LABEL + x0 * scale,
                y,
                (d * scale).max(MIN_W),
            ));
            end = x0;
        }
        for rect in rects.iter().rev() {
            s.push_str(rect);
        }
        start += gd;
    }
    s.push_str("</svg>");
    s
}

fn check_rect(group: &str, c: &CheckReport, x: f64, y: f64, w: f64) -> String {
    let word = result_word(&c.outcome);
    format!(
        "<rect class=\"check {word}\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{BAR}\"><title>{} / {}: {word}, {}</title></rect>",
        esc(group),
        esc(&c.name),
        secs(c.duration)
    )
}

/// What the note column says: a failure's first line, why a check was skipped, and the
/// check's detail.
fn note(c: &CheckReport) -> String {
    let mut n = match &c.outcome {
        Outcome::Passed => String::new(),
        Outcome::Failed(e) => e.lines().next().unwrap_or_default().to_string(),
        Outcome::Skipped(why) => why.clone(),
    };
    for d in c
        .detail
        .iter()
        .cloned()
        .chain(Some(super::steps_line(&c.steps)).filter(|l| !l.is_empty()))
    {
        if !n.is_empty() {
            n.push_str("; ");
        }
        n.push_str(&d);
    }
    n
}

/// The report as one self-contained HTML page.
pub fn render_html(r: &RunReport) -> String {
    let (p, f, k) = r.counts();
    let total: Duration = r.groups.iter().map(|g| g.duration).sum();
    let mut s = String::from("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    let _ = writeln!(
        s,
        "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>aks-flex-node check: {p} passed, {f} failed, {k} skipped</title><style>{CSS}</style></head><body>"
    );
    let _ = writeln!(
        s,
        "<h1>aks-flex-node check</h1><p class=\"summary\"><span class=\"passed\">{p} passed</span>, <span class=\"{}\">{f} failed</span>, <span class=\"skipped\">{k} skipped</span> in {}</p>",
        if f > 0 { "failed" } else { "none-failed" },
        time(total)
    );
    if let Some(n) = &r.note {
        let _ = writeln!(s, "<p class=\"run-note\">{}</p>", esc(n));
    }
    let _ = writeln!(s, "<section class=\"timeline\">{}</section>", timeline(r));
    for g in &r.groups {
        let _ = write!(
            s,
            "<section class=\"group\"><h2>{}<span class=\"time\">{}</span></h2>\n<table><thead><tr><th>check</th><th>result</th><th>time</th><th>note</th></tr></thead><tbody>\n",
            esc(&g.name),
            time(g.duration)
        );
        for c in &g.checks {
            let word = result_word(&c.outcome);
            let _ = writeln!(
                s,
                "<tr class=\"check {word}\"><td class=\"name\">{}</td><td class=\"result\">{word}</td><td class=\"time\">{}</td><td class=\"note\">{}</td></tr>",
                esc(&c.name),
                time(c.duration),
                esc(&note(c))
            );
            if let Outcome::Failed(e) = &c.outcome {
                let _ = write!(
                    s,
                    "<tr class=\"explain\"><td colspan=\"4\"><details open><summary>why {} failed</summary><pre class=\"message\">{}</pre>",
                    esc(&c.name),
                    esc(e)
                );
                if let Some(j) = &c.journal {
                    let _ = write!(
                        s,
                        "<p>journal when it failed:</p><pre class=\"journal\">{}</pre>",
                        esc(j)
                    );
                }
                s.push_str("</details></td></tr>\n");
            }
        }
        s.push_str("</tbody></table>");
        if r.artefacts.contains(&g.name) {
            let dir = esc(&g.name);
            let _ = write!(
                s,
                "<p class=\"artefacts\">kept: <a href=\"{dir}/{}\">journal</a>, <a href=\"{dir}/{}\">console</a></p>",
                super::GROUP_JOURNAL,
                super::GROUP_CONSOLE
            );
        }
        s.push_str("</section>\n");
    }
    s.push_str("</body></html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_names_messages_and_journal() {
        let evil = "<script>alert(\"x\")</script> & 'q'";
        let r = RunReport {
            groups: vec![super::super::GroupReport {
                name: format!("g{evil}"),
                duration: Duration::from_secs(2),
                checks: vec![CheckReport {
                    name: evil.into(),
                    outcome: Outcome::Failed(format!("boom {evil}\nline 2 {evil}")),
                    duration: Duration::from_secs(1),
                    detail: Some(evil.into()),
                    steps: Vec::new(),
                    journal: Some(format!("kernel: {evil}")),
                }],
            }],
            ..Default::default()
        };
        let html = render_html(&r);
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("alert(\"x\")"), "{html}");
        let escaped = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;q&#39;";
        assert!(
            html.contains(&format!("<td class=\"name\">{escaped}</td>")),
            "{html}"
        );
        assert!(
            html.contains(&format!(
                "<pre class=\"message\">boom {escaped}\nline 2 {escaped}</pre>"
            )),
            "{html}"
        );
        assert!(
            html.contains(&format!("<pre class=\"journal\">kernel: {escaped}</pre>")),
            "{html}"
        );
        assert!(html.contains(&format!(
            "<title>g{escaped} / {escaped}: failed, 1.0s</title>"
        )));
    }

    #[test]
    fn page() {
        insta::assert_snapshot!(render_html(&super::super::tests::sample()));
    }

    /// A rerun says so under the summary (and in the table's first line); a group whose
    /// excerpts were kept links them, the others do not.
    #[test]
    fn rerun_note_and_kept_excerpts() {
        let mut r = super::super::tests::sample();
        let plain = render_html(&r);
        assert!(!plain.contains("run-note") && !plain.contains("class=\"artefacts\""));
        r.note = Some("rerun of the groups that failed in the last run: machines".into());
        r.artefacts.insert("machines".into());
        let html = render_html(&r);
        assert!(
            html.contains("<p class=\"run-note\">rerun of the groups that failed in the last run: machines</p>"),
            "{html}"
        );
        assert!(
            html.contains("<a href=\"machines/journal.txt\">journal</a>, <a href=\"machines/console.txt\">console</a>"),
            "{html}"
        );
        assert!(!html.contains("node-join/journal.txt"), "{html}");
        let table = crate::report::render_table(&r);
        assert!(
            table.starts_with(
                "rerun of the groups that failed in the last run: machines\ngroup / check"
            ),
            "{table}"
        );
    }

    #[test]
    fn empty_run_has_no_nan() {
        let html = render_html(&RunReport::default());
        assert!(!html.contains("NaN") && !html.contains("inf"), "{html}");
        assert!(html.contains("0 passed"), "{html}");
    }

    /// Checks sit inside their group's bar, end-aligned (setup comes first), in order.
    #[test]
    fn checks_inside_their_group() {
        let ms = Duration::from_millis;
        let r = RunReport {
            groups: vec![
                super::super::GroupReport {
                    name: "a".into(),
                    duration: ms(10_000),
                    checks: vec![],
                },
                super::super::GroupReport {
                    name: "b".into(),
                    duration: ms(10_000),
                    checks: vec![
                        CheckReport {
                            name: "one".into(),
                            outcome: Outcome::Passed,
                            duration: ms(4_000),
                            detail: None,
                            steps: Vec::new(),
                            journal: None,
                        },
                        CheckReport {
                            name: "two".into(),
                            outcome: Outcome::Passed,
                            duration: ms(4_000),
                            detail: None,
                            steps: Vec::new(),
                            journal: None,
                        },
                    ],
                },
            ],
            ..Default::default()
        };
        let svg = timeline(&r);
        // 20 s over 820 units: 41 units a second; b starts at 170 + 410 = 580, setup 2 s.
        assert!(
            svg.contains("<rect class=\"check passed\" x=\"662.0\" y=\"28.0\" width=\"164.0\""),
            "{svg}"
        );
        assert!(
            svg.contains("<rect class=\"check passed\" x=\"826.0\" y=\"28.0\" width=\"164.0\""),
            "{svg}"
        );
        assert!(svg.find(">b / one").unwrap() < svg.find(">b / two").unwrap());
    }
}
