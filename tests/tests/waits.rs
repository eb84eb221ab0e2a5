//! One retry and one wait: production code of the agent and the library crates retries through
//! `flex_host::retry::retry` and polls through `flex_host::retry::wait_until` (both in
//! `host/src/retry.rs`), never with a loop of its own around `tokio::time::sleep`. Checked on
//! the real tree: every `time::sleep(` outside test code must be one of the timers listed here,
//! each with the reason it is not a retry or a poll. A new hand-written loop fails this test;
//! write it with `retry`/`wait_until`, or, if it is a timer, add it here with its reason.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use flex_tests::{production, production_rust_files, workspace_root};

/// The crates whose production code this rule covers (the harness and xtask are test tools,
/// with their own waits on a VM; `flex_host::retry` itself is the one place with the sleep).
const COVERED: &[&str] = &[
    "agent/src",
    "api/src",
    "controller/src",
    "host/src",
    "image/src",
    "ignition/src",
    "oci/src",
    "fleet/src",
];

/// `(file, sleeps in it, why they are timers rather than retries or polls)`.
const TIMERS: &[(&str, usize, &str)] = &[
    (
        "host/src/retry.rs",
        2,
        "the one retry and the one poll of the workspace",
    ),
    (
        "agent/src/kubeclient/credentials.rs",
        1,
        "the certificate renewal schedule: one arm of a select! with shutdown",
    ),
    (
        "agent/src/flows/daemon/mod.rs",
        2,
        "the daemon's resync period and its unreachable-proof timer: arms of a select! with the watches and shutdown",
    ),
    (
        "agent/src/flows/upgrade/flow.rs",
        1,
        "recovery waits for a stopping unit: each look (recover_once) is a decision with side effects, returned as soon as it is not Wait",
    ),
    (
        "agent/src/flows/worklock.rs",
        1,
        "flock(2) has no timed wait: a non-blocking try every poll, which logs once that it waits",
    ),
    (
        "host/src/runner.rs",
        1,
        "a spawn that raced a writer of the binary (ETXTBSY), retried within a time budget inside the runner; its waits are Backoff's",
    ),
    (
        "agent/src/goalclient/arm.rs",
        1,
        "ARM's long-running PUT: its first look is the PUT's own answer, then a GET every poll interval (Azure's provisioning protocol)",
    ),
    (
        "agent/src/flows/drain/budget.rs",
        1,
        "the disruption slot's renewal schedule (every third of its lease while the work runs): a timer, aborted when the work ends",
    ),
    (
        "fleet/src/sim.rs",
        1,
        "the simulated host's reboot downtime before its kubelet reports Ready: a timer, not a wait for a condition",
    ),
    (
        "controller/src/server.rs",
        1,
        "the graceful shutdown's drain pause, not a wait for a condition",
    ),
    (
        "controller/src/policy.rs",
        1,
        "the admission policies' recheck period (a check every minute for as long as the controller runs, not a wait for a condition): an arm of a select! with shutdown",
    ),
];

fn sleeps(text: &str) -> usize {
    production(text)
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .filter(|l| l.contains("time::sleep("))
        .count()
}

#[test]
fn every_sleep_outside_retry_is_a_listed_timer() {
    let root = workspace_root();
    let files = production_rust_files(COVERED);
    assert!(files.len() > 50, "{} files", files.len());
    let mut wrong = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&root).unwrap().display().to_string();
        let n = sleeps(&std::fs::read_to_string(f).unwrap());
        let allowed = TIMERS
            .iter()
            .find(|(p, _, _)| *p == rel)
            .map_or(0, |(_, n, _)| *n);
        if n != allowed {
            wrong.push(format!("{rel}: {n} sleeps, {allowed} listed"));
        }
    }
    assert!(
        wrong.is_empty(),
        "hand-written waits (use flex_host::retry::retry or wait_until, or list a timer with its reason): {wrong:#?}"
    );
}

/// The rule's own scanner: it finds a sleep, skips comments and the test module.
#[test]
fn the_scanner_counts_production_sleeps_only() {
    let text = "fn a() { tokio::time::sleep(d).await; }\n// tokio::time::sleep(x)\n#[cfg(test)]\nmod tests {\n    fn b() { tokio::time::sleep(d); }\n}\n";
    assert_eq!(sleeps(text), 1);
    assert_eq!(sleeps("fn a() {}"), 0);
}
