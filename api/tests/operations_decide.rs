//! The MachineOperation decision table, parameter validation and selector matching, case by
//! case (pure functions; nothing faked).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, Time,
};

use flex_api::drain::{DrainRequest, OnTimeout};
use flex_api::machina::{MachineOperation, OperationKind};
use flex_api::operations::decide::*;
use flex_api::operations::record::{Record, Stage};
use flex_api::operations::{INTERRUPTED, OperationResult};
use flex_testkit::operations::*;

const ME: &str = "node1";
const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn record(stage: Stage, started_at: &str, result: Option<OperationResult>) -> Record {
    Record {
        version: 1,
        uid: "uid-op".into(),
        name: "op".into(),
        kind: "NodeReboot".into(),
        stage,
        started_at: started_at.into(),
        result,
    }
}

fn run(
    o: &MachineOperation,
    rec: Option<&Record>,
    node_labels: Option<&[(&str, &str)]>,
) -> Decision {
    let l = node_labels.map(labels);
    let facts = Facts {
        machine_name: ME,
        labels: l.as_ref(),
        containerized: false,
        now: at(NOW),
    };
    decide(o, &facts, rec)
}

fn ignored(d: &Decision) -> String {
    match d {
        Decision::Ignore(why) => why.clone(),
        other => panic!("expected Ignore, got {other:?}"),
    }
}

#[test]
fn decision_table() {
    let started = "2027-01-15T07:59:00Z";
    let ok = OperationResult::complete("NodeReboot completed");
    let pending = op("op", "NodeReboot", ME);
    let running = with_status(
        op("op", "NodeReboot", ME),
        "InProgress",
        Some(NOW - 60),
        None,
    );
    let claiming = record(Stage::Claiming, started, None);
    let executing = record(Stage::Executing, started, None);
    let finished = record(Stage::Finished, started, Some(ok.clone()));
    let mut deleting = pending.clone();
    deleting.metadata.deletion_timestamp = Some(Time(at(NOW)));

    let cases: Vec<(&str, MachineOperation, Option<&Record>, Decision)> = vec![
        ("pending, no record: claim", pending.clone(), None, Decision::Claim(Action::NodeReboot(Default::default()))),
        (
            "empty phase counts as pending",
            with_status(pending.clone(), "", None, None),
            None,
            Decision::Claim(Action::NodeReboot(Default::default())),
        ),
        (
            "pending with a claim whose patch never landed: claim again",
            pending.clone(),
            Some(&claiming),
            Decision::Claim(Action::NodeReboot(Default::default())),
        ),
        (
            "pending but executed (status reset): never twice",
            pending.clone(),
            Some(&executing),
            Decision::Resume(Resume::Interrupted),
        ),
        (
            "pending but finished (status reset): report again",
            pending.clone(),
            Some(&finished),
            Decision::Resume(Resume::Report(ok.clone())),
        ),
        (
            "being deleted: ignore",
            deleting,
            None,
            Decision::Ignore("it is being deleted".into()),
        ),
        (
            "in progress, claimed here, handler never ran: run",
            running.clone(),
            Some(&claiming),
            Decision::Resume(Resume::Execute(Action::NodeReboot(Default::default()))),
        ),
        (
            "in progress, someone else's claim: forget ours",
            with_status(op("op", "NodeReboot", ME), "InProgress", Some(NOW - 5), None),
            Some(&claiming),
            Decision::Forget(
                "another agent claimed it (started at 2027-01-15T07:59:55Z, this agent's claim was 2027-01-15T07:59:00Z)".into(),
            ),
        ),
        (
            "in progress, interrupted by a restart: never twice",
            running.clone(),
            Some(&executing),
            Decision::Resume(Resume::Interrupted),
        ),
        (
            "in progress, result recorded: report",
            running.clone(),
            Some(&finished),
            Decision::Resume(Resume::Report(ok.clone())),
        ),
        (
            "in progress, no record: another agent's",
            running.clone(),
            None,
            Decision::Ignore("another agent claimed it (it is InProgress)".into()),
        ),
        (
            "complete, no TTL: ignore",
            with_status(pending.clone(), "Complete", Some(NOW - 60), Some(NOW - 30)),
            Some(&finished),
            Decision::Ignore("it is finished".into()),
        ),
        (
            "unknown phase: ignore",
            with_status(pending.clone(), "Paused", None, None),
            None,
            Decision::Ignore("unknown phase \"Paused\"".into()),
        ),
        (
            "unknown kind: fail without running",
            op("op", "Defragment", ME),
            None,
            Decision::Finish(OperationResult::failed(
                "UnknownKind",
                "unknown operation kind \"Defragment\" (the node agent handles NodeReboot, AgentReset and AgentUpgrade)",
            )),
        ),
        (
            "missing kind: fail without running",
            op("op", "", ME),
            None,
            Decision::Finish(OperationResult::failed(
                "UnknownKind",
                "the operation names no operationKind",
            )),
        ),
        (
            "unknown parameter: fail without running",
            with_params(pending.clone(), &[("force", "true")]),
            None,
            Decision::Finish(OperationResult::failed(
                "InvalidParameters",
                "unknown parameter \"force\" for NodeReboot (it takes drainTimeout and onDrainTimeout, both optional)",
            )),
        ),
        (
            "drain parameters: taken",
            with_params(
                pending.clone(),
                &[("drainTimeout", "90s"), ("onDrainTimeout", "Proceed")],
            ),
            None,
            Decision::Claim(Action::NodeReboot(DrainRequest {
                timeout: Some(Duration::from_secs(90)),
                on_timeout: Some(OnTimeout::Proceed),
            })),
        ),
        (
            "a drain timeout that is no duration: fail without running",
            with_params(pending.clone(), &[("drainTimeout", "ten minutes")]),
            None,
            Decision::Finish(OperationResult::failed(
                "InvalidParameters",
                "parameter \"drainTimeout\" must be a duration from 1s to 24h (e.g. \"90s\", \"10m\"), got \"ten minutes\"",
            )),
        ),
        (
            "a drain timeout out of range: fail without running",
            with_params(pending.clone(), &[("drainTimeout", "25h")]),
            None,
            Decision::Finish(OperationResult::failed(
                "InvalidParameters",
                "parameter \"drainTimeout\" must be a duration from 1s to 24h (e.g. \"90s\", \"10m\"), got \"25h\"",
            )),
        ),
        (
            "onDrainTimeout neither Fail nor Proceed: fail without running",
            with_params(pending.clone(), &[("onDrainTimeout", "force")]),
            None,
            Decision::Finish(OperationResult::failed(
                "InvalidParameters",
                "parameter \"onDrainTimeout\" must be \"Fail\" or \"Proceed\", got \"force\"",
            )),
        ),
        (
            "host kinds are machina's controllers'",
            op("op", "HostReboot", ME),
            None,
            Decision::Ignore("operation kind HostReboot is for machina's host controllers".into()),
        ),
        (
            "another machine's",
            op("op", "NodeReboot", "node2"),
            None,
            Decision::Ignore("it targets machine \"node2\", not \"node1\"".into()),
        ),
        (
            "another machine's, recorded by this agent: refused",
            op("op", "NodeReboot", "node2"),
            Some(&executing),
            Decision::Refuse(
                "it no longer targets this machine (it targets machine \"node2\", not \"node1\"), \
                 and this agent recorded it as executing"
                    .into(),
            ),
        ),
        (
            "no target",
            op("op", "NodeReboot", ""),
            None,
            Decision::Ignore("it names no machine (neither machineRef nor machineSelector)".into()),
        ),
        (
            "agent reset",
            op("op", "AgentReset", ME),
            None,
            Decision::Claim(Action::AgentReset(Default::default())),
        ),
    ];
    for (what, o, rec, want) in cases {
        assert_eq!(run(&o, rec, None), want, "{what}");
    }
}

#[test]
fn ttl_after_finish() {
    let mut done = with_status(
        op("op", "NodeReboot", ME),
        "Complete",
        Some(NOW - 100),
        Some(NOW - 90),
    );
    done.spec.ttl_seconds_after_finished = Some(60);
    assert_eq!(run(&done, None, None), Decision::Delete, "expired");
    done.spec.ttl_seconds_after_finished = Some(90);
    assert_eq!(run(&done, None, None), Decision::Delete, "expires now");
    done.spec.ttl_seconds_after_finished = Some(120);
    assert_eq!(
        run(&done, None, None),
        Decision::Wait(Duration::from_secs(30)),
        "pending"
    );
    let mut failed = with_status(op("op", "NodeReboot", ME), "Failed", None, Some(NOW - 10));
    failed.spec.ttl_seconds_after_finished = Some(0);
    assert_eq!(run(&failed, None, None), Decision::Delete, "failed, TTL 0");
    let mut no_completed = with_status(op("op", "NodeReboot", ME), "Failed", None, None);
    no_completed.spec.ttl_seconds_after_finished = Some(0);
    assert!(ignored(&run(&no_completed, None, None)).contains("without completedAt"));
    let mut other = done.clone();
    other.spec.machine_ref = "node2".into();
    other.spec.ttl_seconds_after_finished = Some(0);
    assert!(
        ignored(&run(&other, None, None)).contains("node2"),
        "another machine's TTL"
    );
}

#[test]
fn selector_targets_by_node_labels() {
    let o = with_selector(
        op("op", "NodeReboot", ""),
        &[("node-restriction.kubernetes.io/pool", "flex")],
    );
    assert!(needs_labels(&o));
    assert_eq!(
        run(
            &o,
            None,
            Some(&[
                ("node-restriction.kubernetes.io/pool", "flex"),
                ("node-restriction.kubernetes.io/zone", "a")
            ])
        ),
        Decision::Claim(Action::NodeReboot(Default::default()))
    );
    assert_eq!(
        ignored(&run(
            &o,
            None,
            Some(&[("node-restriction.kubernetes.io/pool", "gpu")])
        )),
        "its machineSelector does not match the labels of \"node1\""
    );
    assert_eq!(
        ignored(&run(&o, None, None)),
        "its machineSelector needs labels, and neither Node nor Machine \"node1\" exists"
    );
    // machineRef decides when it is set, whatever the selector says.
    let mut both = o.clone();
    both.spec.machine_ref = "node2".into();
    assert!(!needs_labels(&both));
    assert!(
        ignored(&run(
            &both,
            None,
            Some(&[("node-restriction.kubernetes.io/pool", "flex")])
        ))
        .contains("node2")
    );
}

/// A selector may match only labels a node cannot set on itself (NodeRestriction's
/// `node-restriction.kubernetes.io/` domain): on any other label a node could put itself in
/// (or out of) an operation aimed at other nodes, and claim it so that they never run it.
#[test]
fn a_selector_on_labels_a_node_sets_itself_targets_no_machine() {
    for (key, restricted) in [
        ("node-restriction.kubernetes.io/pool", true),
        ("example.node-restriction.kubernetes.io/pool", true),
        ("a.b.node-restriction.kubernetes.io/x", true),
        ("node-restriction.kubernetes.io/", false),
        ("evilnode-restriction.kubernetes.io/pool", false),
        (".node-restriction.kubernetes.io/pool", false),
        ("node-restriction.kubernetes.io.evil/pool", false),
        ("kubernetes.io/hostname", false),
        ("kubernetes.io/os", false),
        ("node.kubernetes.io/instance-type", false),
        ("pool", false),
    ] {
        assert_eq!(node_cannot_set(key), restricted, "{key}");
    }
    let node_labels = [("kubernetes.io/hostname", "victim"), ("pool", "flex")];
    for (what, o) in [
        (
            "matchLabels",
            with_selector(
                op("op", "NodeReboot", ""),
                &[("kubernetes.io/hostname", "victim")],
            ),
        ),
        ("a second key", {
            let mut o = with_selector(
                op("op", "NodeReboot", ""),
                &[("node-restriction.kubernetes.io/pool", "flex")],
            );
            o.spec.machine_selector.as_mut().unwrap().match_expressions =
                Some(vec![req("pool", "Exists", None)]);
            o
        }),
    ] {
        let why = ignored(&run(&o, None, Some(&node_labels)));
        assert!(
            why.contains("matches label") && why.contains("which a node may set on itself"),
            "{what}: {why}"
        );
    }
    // Requirements a label's absence meets narrow a selector; alone they aim at nothing (a
    // node that re-registers its Node loses its node-restriction labels and would meet them).
    let mut negative = with_selector(op("op", "NodeReboot", ""), &[]);
    negative.spec.machine_selector = Some(LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![
            req(
                "node-restriction.kubernetes.io/pool",
                "NotIn",
                Some(&["gpu"]),
            ),
            req(
                "node-restriction.kubernetes.io/drained",
                "DoesNotExist",
                None,
            ),
        ]),
    });
    let why = ignored(&run(&negative, None, Some(&[])));
    assert!(
        why.contains("only NotIn or DoesNotExist requirements"),
        "{why}"
    );
    let sel = negative.spec.machine_selector.as_mut().unwrap();
    sel.match_expressions.as_mut().unwrap().push(req(
        "node-restriction.kubernetes.io/flex",
        "Exists",
        None,
    ));
    assert!(has_positive_requirement(sel));
    assert_eq!(
        run(
            &negative,
            None,
            Some(&[("node-restriction.kubernetes.io/flex", "")])
        ),
        Decision::Claim(Action::NodeReboot(Default::default()))
    );
}

/// An empty selector matches no machine (Kubernetes' would match all): an operation edited to
/// `machineSelector: {}` reaches no node, and one this agent claimed earlier is refused.
#[test]
fn an_empty_selector_matches_no_machine() {
    let mut all = op("op", "NodeReboot", "");
    all.spec.machine_selector = Some(LabelSelector::default());
    assert!(selector_is_empty(
        all.spec.machine_selector.as_ref().unwrap()
    ));
    assert!(!needs_labels(&all));
    assert!(!may_target(&all, ME));
    assert!(
        ignored(&run(
            &all,
            None,
            Some(&[("node-restriction.kubernetes.io/pool", "flex")])
        ))
        .contains("empty")
    );
    let mut empty_lists = all.clone();
    empty_lists.spec.machine_selector = Some(LabelSelector {
        match_labels: Some(Default::default()),
        match_expressions: Some(vec![]),
    });
    assert!(!may_target(&empty_lists, ME));
    // A claim recorded before the target changed is refused, not run.
    let claimed = with_status(all.clone(), "InProgress", Some(NOW), None);
    let rec = record(Stage::Claiming, "2027-01-15T08:00:00Z", None);
    assert!(matches!(
        run(&claimed, Some(&rec), Some(&[])),
        Decision::Refuse(why) if why.contains("empty") && why.contains("claiming")
    ));
}

/// `status.claimedBy` names the node that claimed an operation: another node's claim is not
/// this agent's, whatever the selector matches; this node's own claim resumes.
#[test]
fn another_nodes_claim_is_not_ours() {
    let o = with_selector(
        op("op", "NodeReboot", ""),
        &[("node-restriction.kubernetes.io/pool", "flex")],
    );
    let mut theirs = with_status(o.clone(), "InProgress", Some(NOW), None);
    theirs.status.as_mut().unwrap().claimed_by = "node2".into();
    assert!(!may_target(&theirs, ME));
    assert_eq!(claimed_by_other(&theirs, ME), Some("node2"));
    assert!(
        ignored(&run(
            &theirs,
            None,
            Some(&[("node-restriction.kubernetes.io/pool", "flex")])
        ))
        .contains("node2")
    );
    let rec = record(Stage::Executing, "2027-01-15T08:00:00Z", None);
    assert!(matches!(
        run(&theirs, Some(&rec), Some(&[("node-restriction.kubernetes.io/pool", "flex")])),
        Decision::Refuse(why) if why.contains("node2")
    ));
    let mut mine = theirs.clone();
    mine.status.as_mut().unwrap().claimed_by = ME.into();
    assert_eq!(claimed_by_other(&mine, ME), None);
    assert_eq!(
        run(
            &mine,
            Some(&rec),
            Some(&[("node-restriction.kubernetes.io/pool", "flex")])
        ),
        Decision::Resume(Resume::Interrupted)
    );
    // A machineRef aimed at another machine with a record of ours: refused.
    let moved = with_status(
        op("op", "NodeReboot", "node2"),
        "InProgress",
        Some(NOW),
        None,
    );
    assert!(matches!(
        run(&moved, Some(&record(Stage::Claiming, "2027-01-15T08:00:00Z", None)), None),
        Decision::Refuse(why) if why.contains("node2")
    ));
}

fn req(key: &str, operator: &str, values: Option<&[&str]>) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.into(),
        operator: operator.into(),
        values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
    }
}

#[test]
fn selector_expressions() {
    let node = labels(&[
        ("node-restriction.kubernetes.io/pool", "flex"),
        ("node-restriction.kubernetes.io/zone", "a"),
    ]);
    let sel = |exprs: Vec<LabelSelectorRequirement>| LabelSelector {
        match_labels: None,
        match_expressions: Some(exprs),
    };
    for (what, s, want) in [
        (
            "In",
            sel(vec![req(
                "node-restriction.kubernetes.io/zone",
                "In",
                Some(&["a", "b"]),
            )]),
            Ok(true),
        ),
        (
            "In, absent value",
            sel(vec![req(
                "node-restriction.kubernetes.io/zone",
                "In",
                Some(&["c"]),
            )]),
            Ok(false),
        ),
        (
            "NotIn",
            sel(vec![req(
                "node-restriction.kubernetes.io/zone",
                "NotIn",
                Some(&["c"]),
            )]),
            Ok(true),
        ),
        (
            "NotIn, missing key",
            sel(vec![req("rack", "NotIn", Some(&["c"]))]),
            Ok(true),
        ),
        (
            "Exists",
            sel(vec![req(
                "node-restriction.kubernetes.io/pool",
                "Exists",
                None,
            )]),
            Ok(true),
        ),
        (
            "DoesNotExist",
            sel(vec![req(
                "node-restriction.kubernetes.io/pool",
                "DoesNotExist",
                None,
            )]),
            Ok(false),
        ),
        (
            "ANDed",
            sel(vec![
                req("node-restriction.kubernetes.io/pool", "Exists", None),
                req("node-restriction.kubernetes.io/zone", "In", Some(&["b"])),
            ]),
            Ok(false),
        ),
        (
            "In without values",
            sel(vec![req("node-restriction.kubernetes.io/zone", "In", None)]),
            Err(SelectorError {
                key: "node-restriction.kubernetes.io/zone".into(),
                problem: "operator In needs values".into(),
            }),
        ),
        (
            "Exists with values",
            sel(vec![req(
                "node-restriction.kubernetes.io/zone",
                "Exists",
                Some(&["a"]),
            )]),
            Err(SelectorError {
                key: "node-restriction.kubernetes.io/zone".into(),
                problem: "operator Exists takes no values".into(),
            }),
        ),
        (
            "unknown operator",
            sel(vec![req(
                "node-restriction.kubernetes.io/zone",
                "Gt",
                Some(&["1"]),
            )]),
            Err(SelectorError {
                key: "node-restriction.kubernetes.io/zone".into(),
                problem: "unknown operator \"Gt\"".into(),
            }),
        ),
    ] {
        assert_eq!(selector_matches(&s, &node), want, "{what}");
    }
    let bad = with_selector(op("op", "NodeReboot", ""), &[]);
    let mut bad = bad;
    bad.spec.machine_selector = Some(sel(vec![req(
        "node-restriction.kubernetes.io/zone",
        "Gt",
        Some(&["1"]),
    )]));
    assert_eq!(
        ignored(&run(
            &bad,
            None,
            Some(&[("node-restriction.kubernetes.io/zone", "a")])
        )),
        "its machineSelector is invalid: requirement on \"node-restriction.kubernetes.io/zone\": unknown operator \"Gt\""
    );
}

#[test]
#[allow(clippy::type_complexity)] // a table of (name, params, containerized, expected)
fn agent_upgrade_parameters() {
    let image = format!("registry.example.com/aks/agent@{DIGEST}");
    let tagged_and_pinned = format!("registry.example.com/aks/agent:v2@{DIGEST}");
    let sha = "ab".repeat(32);
    let cases: Vec<(
        &str,
        Vec<(&str, String)>,
        bool,
        Result<UpgradeRequest, &str>,
    )> = vec![
        (
            "image pinned by digest, in the container",
            vec![("image", image.clone())],
            true,
            Ok(UpgradeRequest::Image(image.clone())),
        ),
        (
            "tag and digest",
            vec![("image", tagged_and_pinned.clone())],
            true,
            Ok(UpgradeRequest::Image(tagged_and_pinned.clone())),
        ),
        (
            "a tag alone",
            vec![("image", "registry.example.com/aks/agent:v2".into())],
            true,
            Err(
                "parameter \"image\" must be pinned by digest (registry/repository@sha256:<digest>), and \"registry.example.com/aks/agent:v2\" names only a tag",
            ),
        ),
        (
            "no registry",
            vec![("image", format!("aks/agent@{DIGEST}"))],
            true,
            Err("must be fully qualified, naming its registry (as \"docker.io/aks/agent@sha256:"),
        ),
        (
            "not canonical",
            vec![("image", format!("docker.io/debian@{DIGEST}"))],
            true,
            Err("must be fully qualified in canonical form: \"docker.io/library/debian@sha256:"),
        ),
        (
            "bad reference",
            vec![("image", "registry.example.com/Agent@sha256:xyz".into())],
            true,
            Err("parameter \"image\": invalid image reference"),
        ),
        (
            "image on a host",
            vec![("image", image.clone())],
            false,
            Err(
                "parameter \"image\" needs the agent to run in its container image, and this agent runs from a binary on the host: upgrade it with \"downloadURL\" and \"sha256\"",
            ),
        ),
        (
            "image and downloadURL",
            vec![
                ("image", image.clone()),
                ("downloadURL", "https://example.com/a.tar.gz".into()),
            ],
            true,
            Err("parameters \"image\" and \"downloadURL\" are mutually exclusive: name one"),
        ),
        (
            "image with sha256",
            vec![("image", image.clone()), ("sha256", sha.clone())],
            true,
            Err("parameter \"sha256\" goes with \"downloadURL\"; an image is pinned by its digest"),
        ),
        (
            "downloadURL and sha256 on a host",
            vec![
                ("downloadURL", "https://example.com/a.tar.gz".into()),
                ("sha256", sha.to_uppercase()),
            ],
            false,
            Ok(UpgradeRequest::Download {
                url: "https://example.com/a.tar.gz".into(),
                sha256: sha.clone(),
            }),
        ),
        (
            "downloadURL without sha256",
            vec![("downloadURL", "https://example.com/a.tar.gz".into())],
            false,
            Err(
                "missing required parameter \"sha256\" (the SHA-256 of the archive at \"downloadURL\")",
            ),
        ),
        (
            "bad sha256",
            vec![
                ("downloadURL", "https://example.com/a.tar.gz".into()),
                ("sha256", "abc".into()),
            ],
            false,
            Err("parameter \"sha256\" must be 64 hexadecimal digits, got \"abc\""),
        ),
        (
            "not http",
            vec![
                ("downloadURL", "ftp://example.com/a.tar.gz".into()),
                ("sha256", sha.clone()),
            ],
            false,
            Err(
                "parameter \"downloadURL\" must be an http(s) URL, got \"ftp://example.com/a.tar.gz\"",
            ),
        ),
        (
            "downloadURL in the container",
            vec![
                ("downloadURL", "https://example.com/a.tar.gz".into()),
                ("sha256", sha.clone()),
            ],
            true,
            Err("parameter \"downloadURL\" upgrades an agent installed on the host"),
        ),
        (
            "nothing, on a host",
            vec![],
            false,
            Err("missing required parameter \"downloadURL\""),
        ),
        (
            "nothing, in the container",
            vec![("image", "  ".into())],
            true,
            Err("missing required parameter \"image\" (the agent's image, pinned by digest)"),
        ),
        (
            "unknown parameter",
            vec![("imageRef", image.clone())],
            true,
            Err(
                "unknown parameter \"imageRef\" for AgentUpgrade (it takes image, or downloadURL and sha256)",
            ),
        ),
        (
            "image with surrounding whitespace (upstream: InvalidParameters)",
            vec![("image", format!(" {image}\n"))],
            true,
            Err("parameter \"image\" has leading or trailing whitespace"),
        ),
        (
            "downloadURL with a trailing blank",
            vec![
                ("downloadURL", "https://example.com/a.tar.gz ".to_string()),
                ("sha256", sha.clone()),
            ],
            false,
            Err("parameter \"downloadURL\" has leading or trailing whitespace"),
        ),
        (
            "sha256 with a leading tab",
            vec![
                ("downloadURL", "https://example.com/a.tar.gz".to_string()),
                ("sha256", format!("\t{sha}")),
            ],
            false,
            Err("parameter \"sha256\" has leading or trailing whitespace"),
        ),
    ];
    for (what, params, containerized, want) in cases {
        let params = params
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let got = validate(&OperationKind::AgentUpgrade, &params, containerized);
        match (got, want) {
            (Ok(Action::AgentUpgrade(r)), Ok(w)) => assert_eq!(r, w, "{what}"),
            (Err(f), Err(w)) => {
                assert_eq!(f.reason, "InvalidParameters", "{what}");
                assert!(f.message.contains(w), "{what}: {}", f.message);
            }
            (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn a_valid_agent_upgrade_is_claimed() {
    let image = format!("registry.example.com/aks/agent@{DIGEST}");
    let params = labels(&[("image", &image)]);
    let action = admit(&OperationKind::AgentUpgrade, &params, true).unwrap();
    assert_eq!(
        action,
        Action::AgentUpgrade(flex_api::operations::UpgradeRequest::Image(image.clone()))
    );
    let o = with_params(op("op", "AgentUpgrade", ME), &[("image", &image)]);
    let facts = Facts {
        machine_name: ME,
        labels: None,
        containerized: true,
        now: at(NOW),
    };
    assert_eq!(decide(&o, &facts, None), Decision::Claim(action));
}

#[test]
fn watch_filter() {
    let mine = op("a", "NodeReboot", ME);
    assert!(may_concern(&mine, ME));
    assert!(!may_concern(&op("b", "NodeReboot", "node2"), ME));
    assert!(!may_concern(&op("c", "HostReboot", ME), ME));
    assert!(may_concern(
        &with_selector(op("d", "NodeReboot", ""), &[("a", "b")]),
        ME
    ));
    assert!(!may_concern(&op("e", "NodeReboot", ""), ME));
    assert!(may_concern(
        &with_status(mine.clone(), "InProgress", Some(NOW), None),
        ME
    ));
    let done = with_status(mine.clone(), "Complete", Some(NOW), Some(NOW));
    assert!(!may_concern(&done, ME));
    let mut ttl = done.clone();
    ttl.spec.ttl_seconds_after_finished = Some(10);
    assert!(may_concern(&ttl, ME));
    assert!(may_target(&done, ME));
}

#[test]
fn interrupted_names_the_kind() {
    let r = interrupted(&OperationKind::NodeReboot);
    assert_eq!(r.reason, INTERRUPTED);
    assert_eq!(
        r.message,
        "the agent restarted while NodeReboot was running; it is not run again, and its effect is unknown"
    );
}
