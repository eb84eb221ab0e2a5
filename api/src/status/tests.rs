//! `assess` table-tested over hand-built facts (no I/O), and both renderings snapshotted.

use super::*;

fn unit(name: &str, active: &str, sub: &str, result: &str) -> UnitView {
    UnitView {
        name: name.into(),
        active_state: active.into(),
        sub_state: sub.into(),
        result: result.into(),
        error: None,
    }
}

fn unreachable(name: &str) -> UnitView {
    UnitView {
        name: name.into(),
        error: Some("systemctl show: connection refused".into()),
        ..Default::default()
    }
}

/// A healthy host node: kube1 active, kubelet active, blue proven, one finished operation.
pub(crate) fn healthy() -> Facts {
    Facts {
        state: Read::Ok {
            value: StateView {
                active_machine: "kube1".into(),
                applied_settings_version: "etag-7".into(),
                applied_kubernetes_version: "1.33.3".into(),
            },
        },
        bootstrap_mark: Read::Ok {
            value: "0.9.0".into(),
        },
        agent: AgentView {
            mode: "binary".into(),
            version: "0.9.0".into(),
            current: Some("blue".into()),
            last_good: Some("blue".into()),
            image_digest: None,
        },
        upgrade: Read::Ok {
            value: UpgradeView {
                stage: "finished".into(),
                previous: "green".into(),
                candidate: "blue".into(),
                started_at: "2026-12-01T10:00:00Z".into(),
                operation: Some("upgrade-1".into()),
                result: Some(ResultView {
                    phase: "Complete".into(),
                    reason: "Succeeded".into(),
                    message: "agent upgraded to blue".into(),
                }),
            },
        },
        operations: vec![OperationView {
            file: "uid-1.json".into(),
            name: "upgrade-1".into(),
            kind: "AgentUpgrade".into(),
            stage: "finished".into(),
            started_at: "2026-12-01T10:00:00Z".into(),
            result: Some(ResultView {
                phase: "Complete".into(),
                reason: "Succeeded".into(),
                message: "agent upgraded to blue".into(),
            }),
            error: None,
        }],
        units: vec![
            unit(AGENT_UNIT, "active", "running", "success"),
            unit(RECOVERY_UNIT, "inactive", "dead", "success"),
            unit(
                "systemd-nspawn@kube1.service",
                "active",
                "running",
                "success",
            ),
            unit(
                "systemd-nspawn@kube2.service",
                "inactive",
                "dead",
                "success",
            ),
        ],
        kubelet: KubeletView::Active {
            machine: "kube1".into(),
        },
        containerd_error: None,
        drain: Read::Ok {
            value: DrainView {
                reason: "Uncordoned".into(),
                note: "uncordoned after MachineOperation reboot-1 (NodeReboot)".into(),
                warning: false,
                at: "2026-12-01T10:05:00Z".into(),
            },
        },
    }
}

/// The drain line: the last step, a warning marked, a missing record `none`; a report of an
/// agent that had no drain field reads as `Missing`.
#[test]
fn drain_line_and_reports_without_it() {
    let mut f = healthy();
    let text = render_text(&assess(f.clone()));
    assert!(
        text.contains("drain:          Uncordoned at 2026-12-01T10:05:00Z: uncordoned after MachineOperation reboot-1 (NodeReboot)\n"),
        "{text}"
    );
    f.drain = Read::Ok {
        value: DrainView {
            reason: "WaitingForDisruptionSlot".into(),
            note: "every slot is held\n(by node-2)".into(),
            warning: true,
            at: "t".into(),
        },
    };
    let r = assess(f.clone());
    assert!(r.healthy, "a drain step is not a problem: {:?}", r.problems);
    assert!(
        render_text(&r)
            .contains("drain:          WaitingForDisruptionSlot (warning) at t: every slot is held | (by node-2)\n"),
        "{}",
        render_text(&r)
    );
    let mut json: serde_json::Value = serde_json::from_str(&render_json(&r)).unwrap();
    json.as_object_mut().unwrap().remove("drain").unwrap();
    let back: Report = serde_json::from_value(json).unwrap();
    assert_eq!(back.facts.drain, Read::Missing);
    f.drain = Read::Missing;
    assert!(render_text(&assess(f)).contains("drain:          none\n"));
}

fn set_unit(f: &mut Facts, u: UnitView) {
    for x in &mut f.units {
        if x.name == u.name {
            *x = u.clone();
        }
    }
}

fn codes_of(f: Facts) -> Vec<String> {
    assess(f).problems.into_iter().map(|p| p.code).collect()
}

type Case = (&'static str, fn(&mut Facts), &'static [&'static str]);

#[test]
fn assess_table() {
    let cases: &[Case] = &[
        ("healthy", |_| {}, &[]),
        (
            "never bootstrapped: only that (its units are not there to be inactive)",
            |f| {
                f.state = Read::Missing;
                f.bootstrap_mark = Read::Missing;
                f.upgrade = Read::Missing;
                f.operations.clear();
                set_unit(f, unit(AGENT_UNIT, "inactive", "dead", "success"));
                set_unit(
                    f,
                    unit("systemd-nspawn@kube1.service", "inactive", "dead", ""),
                );
                f.kubelet = KubeletView::Unknown {
                    reason: "no active machine".into(),
                };
            },
            &[codes::NOT_BOOTSTRAPPED],
        ),
        (
            "corrupt daemon state",
            |f| {
                f.state = Read::Unreadable {
                    error: "record checksum mismatch for /etc/aks-flex-node/daemon-state.json"
                        .into(),
                };
                f.kubelet = KubeletView::Unknown {
                    reason: "no active machine".into(),
                };
            },
            &[codes::STATE_UNREADABLE],
        ),
        (
            "state without an active machine",
            |f| {
                f.state = Read::Ok {
                    value: StateView {
                        active_machine: "kube9".into(),
                        ..Default::default()
                    },
                }
            },
            &[codes::STATE_INVALID],
        ),
        (
            "bootstrap unfinished",
            |f| f.bootstrap_mark = Read::Missing,
            &[codes::BOOTSTRAP_UNFINISHED],
        ),
        (
            "agent unit failed",
            |f| set_unit(f, unit(AGENT_UNIT, "failed", "failed", "exit-code")),
            &[codes::AGENT_NOT_ACTIVE],
        ),
        (
            "recovery unit failed",
            |f| set_unit(f, unit(RECOVERY_UNIT, "failed", "failed", "exit-code")),
            &[codes::RECOVERY_FAILED],
        ),
        (
            "machine stopped: kubelet not also blamed",
            |f| {
                set_unit(
                    f,
                    unit("systemd-nspawn@kube1.service", "inactive", "dead", ""),
                );
                f.kubelet = KubeletView::Inactive {
                    machine: "kube1".into(),
                    detail: "Failed to connect to machine".into(),
                };
            },
            &[codes::MACHINE_NOT_RUNNING],
        ),
        (
            "the other machine stopped is fine",
            |f| {
                set_unit(
                    f,
                    unit("systemd-nspawn@kube2.service", "failed", "failed", ""),
                )
            },
            &[],
        ),
        (
            "kubelet inactive",
            |f| {
                f.kubelet = KubeletView::Inactive {
                    machine: "kube1".into(),
                    detail: "activating".into(),
                }
            },
            &[codes::KUBELET_UNHEALTHY],
        ),
        (
            "upgrade in flight",
            |f| {
                if let Read::Ok { value } = &mut f.upgrade {
                    value.stage = "switched".into();
                    value.result = None;
                }
                f.agent.current = Some("green".into());
            },
            &[codes::UPGRADE_UNPROVEN],
        ),
        (
            "unproven without a record (current != last-good)",
            |f| {
                f.upgrade = Read::Missing;
                f.agent.current = Some("green".into());
            },
            &[codes::UPGRADE_UNPROVEN],
        ),
        (
            "upgrade record unreadable",
            |f| {
                f.upgrade = Read::Unreadable {
                    error: "read record: truncated".into(),
                }
            },
            &[codes::RECORD_UNREADABLE],
        ),
        (
            "operation record unreadable",
            |f| {
                f.operations.push(OperationView {
                    file: "uid-2.json".into(),
                    error: Some("record checksum mismatch".into()),
                    ..Default::default()
                })
            },
            &[codes::RECORD_UNREADABLE],
        ),
        (
            "systemd unreachable: said once, unit states not guessed",
            |f| {
                f.units = f.units.iter().map(|u| unreachable(&u.name)).collect();
                f.kubelet = KubeletView::Unknown {
                    reason: "systemctl: connection refused".into(),
                };
            },
            &[codes::SYSTEMD_UNREACHABLE],
        ),
        (
            "containerd unreachable",
            |f| {
                f.agent.mode = "image".into();
                f.containerd_error = Some("ctr: connection refused".into());
            },
            &[codes::CONTAINERD_UNREACHABLE],
        ),
        (
            "never bootstrapped and systemd unreachable: both said",
            |f| {
                f.state = Read::Missing;
                f.bootstrap_mark = Read::Missing;
                f.units = f.units.iter().map(|u| unreachable(&u.name)).collect();
            },
            &[codes::SYSTEMD_UNREACHABLE, codes::NOT_BOOTSTRAPPED],
        ),
    ];
    for (name, change, want) in cases {
        let mut f = healthy();
        change(&mut f);
        let report = assess(f.clone());
        assert_eq!(codes_of(f), *want, "{name}");
        assert_eq!(report.healthy, want.is_empty(), "{name}");
    }
}

#[test]
fn json_healthy() {
    insta::assert_snapshot!(render_json(&assess(healthy())));
}

#[test]
fn json_never_bootstrapped() {
    let mut f = healthy();
    f.state = Read::Missing;
    f.bootstrap_mark = Read::Missing;
    f.upgrade = Read::Missing;
    f.operations.clear();
    f.kubelet = KubeletView::Unknown {
        reason: "no active machine".into(),
    };
    insta::assert_snapshot!(render_json(&assess(f)));
}

#[test]
fn text_healthy() {
    insta::assert_snapshot!(render_text(&assess(healthy())));
}

#[test]
fn text_unhealthy() {
    let mut f = healthy();
    f.state = Read::Unreadable {
        error: "record checksum mismatch for /etc/aks-flex-node/daemon-state.json".into(),
    };
    f.agent.mode = "image".into();
    f.agent.current = Some("registry.example/aks-flex-node:0.9.1".into());
    f.agent.last_good = Some("registry.example/aks-flex-node:0.9.0".into());
    f.containerd_error = Some("ctr: connection refused".into());
    f.units[0] = unreachable(AGENT_UNIT);
    insta::assert_snapshot!(render_text(&assess(f)));
}

#[test]
fn json_round_trips() {
    let r = assess(healthy());
    let back: Report = serde_json::from_str(&render_json(&r)).unwrap();
    assert_eq!(back, r);
}

/// No daemon state: the message says what the bootstrap mark is (pure).
#[test]
fn a_missing_state_is_described_by_the_mark() {
    for (mark, want) in [
        (
            healthy().bootstrap_mark,
            "no daemon state, though the bootstrap is marked complete",
        ),
        (
            Read::Unreadable {
                error: "record checksum mismatch".into(),
            },
            "no daemon state, and the bootstrap mark is unreadable: record checksum mismatch",
        ),
        (
            Read::Error {
                error: "read: Permission denied".into(),
            },
            "no daemon state, and the bootstrap mark is unreadable: read: Permission denied",
        ),
    ] {
        let mut f = healthy();
        f.state = Read::Missing;
        f.bootstrap_mark = mark;
        let r = assess(f);
        let p = r
            .problems
            .iter()
            .find(|p| p.code == codes::STATE_UNREADABLE)
            .unwrap();
        assert_eq!(p.message, want);
    }
}
