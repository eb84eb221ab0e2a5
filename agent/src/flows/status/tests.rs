//! The gatherer on a temporary root (real files through `HostFs`) with a recording systemd and
//! runner (faked): what it finds, and that it writes nothing and asks systemd only `show`.

use std::path::Path;

use flex_host::runner::Output;
use flex_testkit::{FakeHost, FakeHostInfo, tree_snapshot};

use super::*;
use crate::flows::operations::record::Stage as OpStage;
use crate::state::{BootstrapMark, DaemonState};

const READ_ONLY_SYSTEMD: [&str; 4] = [
    "show aks-flex-node-agent.service",
    "show aks-flex-node-recovery.service",
    "show systemd-nspawn@kube1.service",
    "show systemd-nspawn@kube2.service",
];

fn healthy_host(info: FakeHostInfo) -> FakeHost {
    let f = FakeHost::with_info(info).unwrap();
    let fs = &f.host.fs;
    StateStore::new(fs.clone())
        .save(&DaemonState {
            active_machine: "kube1".into(),
            applied_settings_version: "etag-7".into(),
            applied_kubernetes_version: "1.33.3".into(),
            ..Default::default()
        })
        .unwrap();
    BootstrapMarkStore::new(fs.clone())
        .save(&BootstrapMark::now())
        .unwrap();
    let lib = fs.path(Path::new(crate::flows::upgrade::layout::LIB_DIR));
    std::fs::create_dir_all(lib.join("blue")).unwrap();
    std::os::unix::fs::symlink("blue", lib.join("current")).unwrap();
    std::os::unix::fs::symlink("blue", lib.join("last-good")).unwrap();
    let rec: UpgradeRecord = serde_json::from_value(serde_json::json!({
        "version": 1, "mode": "binary", "previous": "green", "candidate": "blue",
        "stage": "finished", "startedAt": "2026-12-01T10:00:00Z",
        "result": {"phase": "Complete", "reason": "Succeeded", "message": "upgraded"}
    }))
    .unwrap();
    JsonStore::at(fs.clone(), RECORD_PATH).save(&rec).unwrap();
    for (uid, at) in [
        ("u-old", "2026-12-01T09:00:00Z"),
        ("u-new", "2026-12-01T10:00:00Z"),
    ] {
        RecordStore::new(fs.clone())
            .save(&Record {
                version: 1,
                uid: uid.into(),
                name: format!("op-{uid}"),
                kind: "AgentUpgrade".into(),
                stage: OpStage::Finished,
                started_at: at.into(),
                result: None,
            })
            .unwrap();
    }
    f.systemd
        .set_active(AGENT_UNIT)
        .set_active("systemd-nspawn@kube1.service");
    f.runner.on(
        "systemctl --machine=kube1 is-active kubelet.service",
        Output::ok("active\n"),
    );
    f
}

/// Gathers on `f` and checks it wrote nothing and made only read-only calls.
async fn gather_read_only(f: &FakeHost) -> Report {
    let before = tree_snapshot(f.root.path());
    let report = status(&f.host).await;
    assert_eq!(
        tree_snapshot(f.root.path()),
        before,
        "status wrote something"
    );
    assert_eq!(f.systemd.calls(), READ_ONLY_SYSTEMD);
    for c in f.runner.calls() {
        assert!(
            c.starts_with("systemctl --machine=") && c.ends_with(" is-active kubelet.service")
                || c.starts_with("ctr -n aks-flex images ls name=="),
            "unexpected command {c}"
        );
    }
    report
}

fn codes(r: &Report) -> Vec<&str> {
    r.problems.iter().map(|p| p.code.as_str()).collect()
}

#[tokio::test]
async fn healthy_host_reads_everything_and_writes_nothing() {
    let f = healthy_host(FakeHostInfo::default());
    let r = gather_read_only(&f).await;
    assert!(r.healthy, "{:?}", r.problems);
    let facts = &r.facts;
    assert_eq!(facts.state.value().unwrap().active_machine, "kube1");
    assert_eq!(
        facts.state.value().unwrap().applied_settings_version,
        "etag-7"
    );
    assert_eq!(facts.agent.current.as_deref(), Some("blue"));
    assert_eq!(facts.agent.last_good.as_deref(), Some("blue"));
    assert_eq!(facts.upgrade.value().unwrap().stage, "finished");
    let names: Vec<&str> = facts.operations.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["op-u-new", "op-u-old"], "newest first");
    assert_eq!(
        facts.kubelet,
        KubeletView::Active {
            machine: "kube1".into()
        }
    );
    assert_eq!(
        f.runner.calls(),
        ["systemctl --machine=kube1 is-active kubelet.service"]
    );
}

#[tokio::test]
async fn never_bootstrapped_says_so_and_creates_nothing() {
    let f = FakeHost::new().unwrap();
    let r = gather_read_only(&f).await;
    assert_eq!(codes(&r), ["NotBootstrapped"]);
    assert!(f.runner.calls().is_empty(), "no machine to ask kubelet in");
    assert_eq!(tree_snapshot(f.root.path()), "\n", "not even a directory");
}

#[tokio::test]
async fn corrupt_state_file_is_reported_and_left_as_it_is() {
    let f = healthy_host(FakeHostInfo::default());
    let p = f.host.fs.path(Path::new(crate::state::STATE_PATH));
    std::fs::write(&p, b"{\"format\": \"aks-flex-node.record/v1\", \"sha").unwrap();
    let r = gather_read_only(&f).await;
    assert_eq!(codes(&r), ["StateUnreadable"]);
    assert!(matches!(r.facts.state, Read::Unreadable { .. }));
    assert!(render_text(&r).contains("daemon state unreadable"));
    assert!(render_json(&r).contains("\"StateUnreadable\""));
}

#[tokio::test]
async fn systemd_unreachable_is_reported() {
    let f = healthy_host(FakeHostInfo::default());
    for c in READ_ONLY_SYSTEMD {
        f.systemd.fail_on(c);
    }
    let r = gather_read_only(&f).await;
    assert_eq!(codes(&r), ["SystemdUnreachable"]);
}

#[tokio::test]
async fn failed_agent_and_inactive_kubelet_are_reported() {
    let f = healthy_host(FakeHostInfo::default());
    f.systemd.set_unit_state(
        AGENT_UNIT,
        flex_host::systemd::UnitState {
            active_state: "failed".into(),
            sub_state: "failed".into(),
            result: "exit-code".into(),
            ..Default::default()
        },
    );
    f.runner.on(
        "systemctl --machine=kube1",
        Output {
            stdout: "activating\n".into(),
            ..Output::failed(3, "")
        },
    );
    let r = gather_read_only(&f).await;
    assert_eq!(codes(&r), ["AgentNotActive", "KubeletUnhealthy"]);
}

fn containerized() -> FakeHost {
    let f = healthy_host(FakeHostInfo {
        containerized: true,
        ..Default::default()
    });
    f.host
        .fs
        .write_atomic(
            Path::new(crate::systemd::AGENT_IMAGE_ENV),
            b"AKS_FLEX_NODE_IMAGE=reg.example/agent:2\nAKS_FLEX_NODE_LAST_GOOD_IMAGE=reg.example/agent:2\n",
            0o644,
        )
        .unwrap();
    f
}

#[tokio::test]
async fn container_reports_the_image_digest() {
    let f = containerized();
    f.runner.on(
        "ctr -n aks-flex images ls",
        Output::ok(
            "REF TYPE DIGEST SIZE PLATFORMS LABELS\nreg.example/agent:2 application/vnd.oci.image.index.v1+json sha256:abc 7.0 MiB linux/amd64 -\n",
        ),
    );
    let r = gather_read_only(&f).await;
    assert!(r.healthy, "{:?}", r.problems);
    assert_eq!(r.facts.agent.mode, "image");
    assert_eq!(
        r.facts.agent.current.as_deref(),
        Some("reg.example/agent:2")
    );
    assert_eq!(r.facts.agent.image_digest.as_deref(), Some("sha256:abc"));
}

#[tokio::test]
async fn container_with_containerd_unreachable_says_so() {
    let f = containerized();
    f.runner.on(
        "ctr -n aks-flex images ls",
        Output::failed(1, "ctr: failed to dial \"/run/containerd/containerd.sock\""),
    );
    let r = gather_read_only(&f).await;
    assert_eq!(codes(&r), ["ContainerdUnreachable"]);
    assert!(render_text(&r).contains("containerd unreachable"));
}
