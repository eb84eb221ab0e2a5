//! Upgrader tests. Real: the files under a temporary root (HostFs), a local HTTP server for
//! downloads, the tar.gz reader. Faked at the trait boundary: the runner (the candidate's
//! `version`, journalctl), systemd (FakeSystemd records the transient timer and answers the
//! unit's state) and the image store (FakeImages).

use std::path::Path;
use std::sync::Arc;

use super::*;
use crate::flows::upgrade::DAEMON_FAILED;
use crate::flows::upgrade::layout::{BIN_LINK, CURRENT_EXEC, LAST_GOOD_EXEC};
use crate::machine::containerd::FakeImages;
use flex_api::machina::OperationPhase;
use flex_host::runner::Output;
use flex_host::systemd::{SystemdManager, UnitState};
use flex_testkit::FakeHost;
use flex_testkit::FakeHostInfo;

const ELF_V2: &[u8] = b"\x7fELF-agent-v2";

/// Serves `body` to every GET on 127.0.0.1 (a real socket, HTTP/1.1, one response per
/// connection); returns the base URL.
async fn serve(body: Vec<u8>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&body).await;
            });
        }
    });
    format!("http://{addr}")
}

fn sha(b: &[u8]) -> String {
    crate::state::checksum(b)
}

fn host_fake() -> FakeHost {
    let f = FakeHost::new().unwrap();
    f.host
        .fs
        .write_atomic(Path::new(BIN_LINK), b"\x7fELF-agent-v1", 0o755)
        .unwrap();
    f
}

fn read(f: &FakeHost, p: &str) -> Vec<u8> {
    std::fs::read(f.host.fs.path(Path::new(p))).unwrap()
}

fn timers(f: &FakeHost) -> Vec<String> {
    f.systemd
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("transient-timer"))
        .collect()
}

fn op() -> Option<OperationRef> {
    Some(OperationRef {
        uid: "uid-1".into(),
        name: "upgrade-1".into(),
    })
}

fn clock() -> Clock {
    Arc::new(|| Timestamp::from_second(1_790_000_000).unwrap())
}

async fn start_binary_upgrade(
    f: &FakeHost,
    body: &[u8],
    sha256: &str,
) -> Result<Started, UpgradeError> {
    let url = serve(body.to_vec()).await;
    let green = f
        .host
        .fs
        .path(&Layout::slot_binary(Slot::Green))
        .display()
        .to_string();
    f.runner.on(
        &format!("{green} version"),
        Output::ok("AKS Flex Node Agent\nVersion: v2\nGit Commit: x\n"),
    );
    Upgrader::new(f.host.clone())
        .with_clock(clock())
        .start(
            &UpgradeRequest::Download {
                url: format!("{url}/aks-flex-node"),
                sha256: sha256.into(),
            },
            op(),
        )
        .await
}

#[tokio::test]
async fn binary_upgrade_switches_schedules_a_punctual_restart_and_the_new_agent_proves_itself() {
    let f = host_fake();
    let started = start_binary_upgrade(&f, ELF_V2, &sha(ELF_V2))
        .await
        .unwrap();
    assert_eq!(
        started,
        Started::HandedOff(
            "switched to slot green (version v2); the agent restarts on it in 1s".into()
        )
    );
    assert_eq!(read(&f, CURRENT_EXEC), ELF_V2);
    assert_eq!(
        std::fs::read_link(f.host.fs.path(Path::new(BIN_LINK))).unwrap(),
        Path::new(CURRENT_EXEC)
    );
    assert_eq!(read(&f, LAST_GOOD_EXEC), b"\x7fELF-agent-v1");
    assert_eq!(
        timers(&f),
        vec![
            "transient-timer aks-flex-node-restart-1790000000000 on-active=1000ms accuracy=100ms command=/usr/bin/systemctl restart aks-flex-node-agent.service"
        ]
    );
    let u = Upgrader::new(f.host.clone());
    let rec = u.record().unwrap();
    assert_eq!(rec.stage, Stage::Switched);
    assert_eq!(rec.candidate, "green");
    assert_eq!(rec.previous, "blue");
    assert_eq!(u.resume("uid-1"), Resumed::Pending);

    // The restarted daemon runs from the green slot: not proven at start.
    assert_eq!(u.on_daemon_start(Some("green")), None);
    assert_eq!(
        read(&f, LAST_GOOD_EXEC),
        b"\x7fELF-agent-v1",
        "not last-good before its first reconcile"
    );
    assert_eq!(u.resume("uid-1"), Resumed::Pending);
    // Its first successful reconcile proves it.
    let (r, op) = u.prove(Some("green")).unwrap().unwrap();
    assert_eq!(op.as_deref(), Some("upgrade-1"));
    assert_eq!(r.phase, OperationPhase::Complete);
    assert!(r.message.contains("green (version v2)"), "{}", r.message);
    assert_eq!(
        read(&f, LAST_GOOD_EXEC),
        ELF_V2,
        "the candidate is last-good"
    );
    assert_eq!(u.resume("uid-1"), Resumed::Finished(r));
    assert_eq!(u.prove(Some("green")).unwrap(), None, "only once");
    assert_eq!(u.on_daemon_start(Some("green")), None);
}

#[tokio::test]
async fn binary_upgrade_from_a_release_archive() {
    let f = host_fake();
    let mut tgz = Vec::new();
    {
        let gz = flate2::write::GzEncoder::new(&mut tgz, flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        let mut h = tar::Header::new_gnu();
        h.set_size(ELF_V2.len() as u64);
        h.set_mode(0o755);
        h.set_cksum();
        b.append_data(&mut h, "bin/aks-flex-node", ELF_V2).unwrap();
        b.into_inner().unwrap().finish().unwrap();
    }
    start_binary_upgrade(&f, &tgz, &sha(&tgz)).await.unwrap();
    assert_eq!(read(&f, CURRENT_EXEC), ELF_V2);
}

#[tokio::test]
async fn a_sha256_mismatch_changes_nothing_and_finishes_failed() {
    let f = host_fake();
    let e = start_binary_upgrade(&f, ELF_V2, &"0".repeat(64))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("verify: the SHA-256 of http://"), "{e}");
    assert!(e.contains(&"0".repeat(64)), "{e}");
    assert_eq!(read(&f, CURRENT_EXEC), b"\x7fELF-agent-v1");
    assert!(timers(&f).is_empty());
    let rec = Upgrader::new(f.host.clone()).record().unwrap();
    assert_eq!(rec.stage, Stage::Finished);
    assert_eq!(rec.result.unwrap().reason, EXECUTION_FAILED);
}

#[tokio::test]
async fn a_candidate_that_does_not_run_is_never_switched_to() {
    let f = host_fake();
    let green = f
        .host
        .fs
        .path(&Layout::slot_binary(Slot::Green))
        .display()
        .to_string();
    f.runner.on(
        &format!("{green} version"),
        Output::failed(126, "exec format error"),
    );
    let url = serve(ELF_V2.to_vec()).await;
    let e = Upgrader::new(f.host.clone())
        .start(
            &UpgradeRequest::Download {
                url,
                sha256: sha(ELF_V2),
            },
            None,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("check the candidate:"), "{e}");
    assert!(e.contains("exec format error"), "{e}");
    assert_eq!(read(&f, CURRENT_EXEC), b"\x7fELF-agent-v1");
}

#[tokio::test]
async fn a_second_upgrade_waits_for_the_first() {
    let f = host_fake();
    start_binary_upgrade(&f, ELF_V2, &sha(ELF_V2))
        .await
        .unwrap();
    let e = Upgrader::new(f.host.clone())
        .start(
            &UpgradeRequest::Download {
                url: "http://127.0.0.1:1/x".into(),
                sha256: sha(b"x"),
            },
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, UpgradeError::InFlight { .. }), "{e}");
}

fn failed_unit(result: &str, restarts: u32) -> UnitState {
    UnitState {
        active_state: "failed".into(),
        sub_state: "failed".into(),
        result: result.into(),
        n_restarts: restarts,
        exec_main_status: 1,
    }
}

#[tokio::test]
async fn recovery_rolls_a_failed_binary_back_and_restarts_it() {
    let f = host_fake();
    start_binary_upgrade(&f, ELF_V2, &sha(ELF_V2))
        .await
        .unwrap();
    f.systemd
        .set_unit_state(AGENT_UNIT, failed_unit("exit-code", 2));
    f.runner.on(
        "journalctl -u aks-flex-node-agent.service",
        Output::ok("starting\nError: boom\n"),
    );
    let u = Upgrader::new(f.host.clone()).with_clock(clock());
    let action = u.recover().await.unwrap();
    assert!(
        matches!(action, RecoveryAction::RollBack { .. }),
        "{action:?}"
    );
    assert_eq!(read(&f, CURRENT_EXEC), b"\x7fELF-agent-v1");
    let r = u.record().unwrap().result.unwrap();
    assert_eq!(r.reason, DAEMON_FAILED);
    assert!(r.message.contains("exit-code"), "{}", r.message);
    assert!(r.message.contains("Error: boom"), "{}", r.message);
    let calls = f.systemd.calls();
    let tail: Vec<&str> = calls.iter().rev().take(2).map(String::as_str).collect();
    assert!(tail[0].starts_with("transient-timer") && tail[0].contains("accuracy=100ms"));
    assert_eq!(tail[1], "reset-failed aks-flex-node-agent.service");
    // The old agent starts again: nothing more to do.
    assert_eq!(u.on_daemon_start(Some("blue")), None);
}

fn unit_state(active: &str, sub: &str, result: &str) -> UnitState {
    UnitState {
        active_state: active.into(),
        sub_state: sub.into(),
        result: result.into(),
        n_restarts: 0,
        exec_main_status: 1,
    }
}

/// Real: the files of the layout and the record under a temporary root. Faked: systemd, whose
/// agent unit is still stopping (`deactivating/stop-post`: the stop guard started recovery from
/// its `ExecStopPost=`) for two looks, then waits for its automatic restart. Recovery waits it
/// out and rolls the candidate back at its first failure, with no restarts counted.
#[tokio::test]
async fn recovery_started_by_the_stop_guard_waits_for_the_stop_then_rolls_back_at_once() {
    let f = host_fake();
    start_binary_upgrade(&f, ELF_V2, &sha(ELF_V2))
        .await
        .unwrap();
    tokio::time::pause();
    let handoff = timers(&f).len();
    f.systemd.queue_unit_states(
        AGENT_UNIT,
        [
            unit_state("deactivating", "stop-post", "exit-code"),
            unit_state("deactivating", "stop-post", "exit-code"),
        ],
    );
    f.systemd.set_unit_state(
        AGENT_UNIT,
        unit_state("activating", "auto-restart", "exit-code"),
    );
    let u = Upgrader::new(f.host.clone()).with_clock(clock());
    let action = u.recover().await.unwrap();
    assert!(
        matches!(action, RecoveryAction::RollBack { .. }),
        "{action:?}"
    );
    assert_eq!(read(&f, CURRENT_EXEC), b"\x7fELF-agent-v1");
    let shows = f
        .systemd
        .calls()
        .iter()
        .filter(|c| c.starts_with("show "))
        .count();
    assert_eq!(shows, 3, "{:?}", f.systemd.calls());
    let t = timers(&f);
    assert_eq!(t.len(), handoff + 1, "{t:?}");
    assert!(t[handoff].contains("on-active=1000ms"), "{t:?}");
}

/// Real: the layout's files. Faked: systemd, whose agent unit stays `deactivating` (a stop
/// that hangs): recovery gives up after RECOVERY_STOP_WAIT (virtual time) and changes nothing,
/// leaving the unit to systemd's own restarts and `OnFailure=`.
#[tokio::test]
async fn recovery_leaves_a_unit_that_never_finishes_stopping_to_systemd() {
    let f = host_fake();
    start_binary_upgrade(&f, ELF_V2, &sha(ELF_V2))
        .await
        .unwrap();
    tokio::time::pause();
    let handoff = timers(&f).len();
    f.systemd.set_unit_state(
        AGENT_UNIT,
        unit_state("deactivating", "stop-sigterm", "success"),
    );
    let u = Upgrader::new(f.host.clone()).with_clock(clock());
    assert_eq!(u.recover().await.unwrap(), RecoveryAction::Wait);
    assert_eq!(read(&f, CURRENT_EXEC), ELF_V2, "still on the candidate");
    assert_eq!(timers(&f).len(), handoff, "no restart scheduled");
    assert!(
        !f.systemd
            .calls()
            .iter()
            .any(|c| c.starts_with("reset-failed")),
        "{:?}",
        f.systemd.calls()
    );
}

#[tokio::test]
async fn recovery_retries_a_candidate_the_start_limit_refused_once() {
    let f = host_fake();
    start_binary_upgrade(&f, ELF_V2, &sha(ELF_V2))
        .await
        .unwrap();
    f.systemd
        .set_unit_state(AGENT_UNIT, failed_unit("start-limit-hit", 0));
    let u = Upgrader::new(f.host.clone());
    assert_eq!(u.recover().await.unwrap(), RecoveryAction::RetryCandidate);
    assert_eq!(read(&f, CURRENT_EXEC), ELF_V2, "still on the candidate");
    assert!(matches!(
        u.recover().await.unwrap(),
        RecoveryAction::RollBack { .. }
    ));
    assert_eq!(read(&f, CURRENT_EXEC), b"\x7fELF-agent-v1");
}

#[tokio::test]
async fn recovery_without_an_upgrade_resets_a_failed_unit_and_restarts_it_later() {
    let f = host_fake();
    f.systemd
        .set_unit_state(AGENT_UNIT, failed_unit("start-limit-hit", 4));
    let u = Upgrader::new(f.host.clone()).with_clock(clock());
    assert_eq!(u.recover().await.unwrap(), RecoveryAction::Restart);
    assert!(timers(&f)[0].contains("on-active=30000ms accuracy=100ms"));
}

#[tokio::test]
async fn a_restart_while_staged_finishes_interrupted_on_the_old_agent() {
    let f = host_fake();
    let u = Upgrader::new(f.host.clone());
    let mut rec = u.new_record(op(), "blue", "green");
    rec.stage = Stage::Staged;
    u.save(&rec).unwrap();
    let r = u.on_daemon_start(Some("blue")).unwrap();
    assert_eq!(r.reason, crate::flows::operations::INTERRUPTED);
    assert_eq!(u.resume("uid-1"), Resumed::Finished(r));
}

#[tokio::test]
async fn converge_host_builds_the_layout_and_units_once() {
    let f = host_fake();
    let u = Upgrader::new(f.host.clone());
    u.converge_host(None).await.unwrap();
    let unit = String::from_utf8(read(&f, crate::systemd::AGENT_UNIT_PATH)).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/lib/aks-flex-node/current/aks-flex-node agent"));
    assert!(unit.contains("OnFailure=aks-flex-node-recovery.service"));
    let rec = String::from_utf8(read(&f, crate::systemd::RECOVERY_UNIT_PATH)).unwrap();
    assert!(rec.contains("ExecStart=/usr/local/lib/aks-flex-node/last-good/aks-flex-node recover"));
    assert_eq!(f.systemd.calls(), vec!["daemon-reload"]);
    u.converge_host(None).await.unwrap();
    assert_eq!(
        f.systemd.calls(),
        vec!["daemon-reload"],
        "no change, no reload"
    );
}

// --- the container ---------------------------------------------------------------------------

const INSTALL: &str = "10.0.2.2:5000/aks-flex-node@sha256:1111111111111111111111111111111111111111111111111111111111111111";
const CAND: &str = "10.0.2.2:5000/aks-flex-node@sha256:2222222222222222222222222222222222222222222222222222222222222222";

fn container_fake() -> (FakeHost, FakeImages) {
    let f = FakeHost::with_info(FakeHostInfo {
        containerized: true,
        ..FakeHostInfo::default()
    })
    .unwrap();
    f.host
        .fs
        .write_atomic(
            Path::new(CONTAINER_SETTINGS),
            format!("AKS_FLEX_NODE_IMAGE={INSTALL}\nAKS_FLEX_NODE_PULL_ARGS=--plain-http\n")
                .as_bytes(),
            0o644,
        )
        .unwrap();
    let images = FakeImages::new();
    images.check_prints(CAND, "AKS Flex Node Agent\nVersion: v2\n");
    (f, images)
}

fn image_env(f: &FakeHost) -> String {
    String::from_utf8(read(f, AGENT_IMAGE_ENV)).unwrap()
}

#[tokio::test]
async fn image_upgrade_pulls_checks_selects_and_the_new_container_proves_itself() {
    let (f, images) = container_fake();
    let u = Upgrader::new(f.host.clone())
        .with_images(Arc::new(images.clone()))
        .with_clock(clock());
    let started = u
        .start(&UpgradeRequest::Image(CAND.into()), op())
        .await
        .unwrap();
    assert!(
        matches!(started, Started::HandedOff(ref m) if m.contains("version v2")),
        "{started:?}"
    );
    insta::assert_snapshot!(images.calls().join("\n"));
    let env = image_env(&f);
    assert!(
        env.contains(&format!("\nAKS_FLEX_NODE_IMAGE={CAND}\n")),
        "{env}"
    );
    assert!(
        env.contains(&format!("\nAKS_FLEX_NODE_LAST_GOOD_IMAGE={INSTALL}\n")),
        "{env}"
    );
    assert_eq!(timers(&f).len(), 1);
    assert_eq!(u.on_daemon_start(Some(CAND)), None, "not proven at start");
    assert!(image_env(&f).contains(&format!("AKS_FLEX_NODE_LAST_GOOD_IMAGE={INSTALL}\n")));
    let (r, _) = u.prove(Some(CAND)).unwrap().unwrap();
    assert_eq!(r.phase, OperationPhase::Complete);
    assert!(image_env(&f).contains(&format!("AKS_FLEX_NODE_LAST_GOOD_IMAGE={CAND}\n")));
    insta::assert_snapshot!(render_record(&u.record().unwrap()));
}

#[tokio::test]
async fn image_rollback_switches_back_and_removes_the_broken_image() {
    let (f, images) = container_fake();
    let u = Upgrader::new(f.host.clone())
        .with_images(Arc::new(images.clone()))
        .with_clock(clock());
    u.start(&UpgradeRequest::Image(CAND.into()), None)
        .await
        .unwrap();
    f.systemd.set_unit_state(
        AGENT_UNIT,
        UnitState {
            active_state: "activating".into(),
            sub_state: "auto-restart".into(),
            result: "exit-code".into(),
            n_restarts: 0,
            exec_main_status: 1,
        },
    );
    assert!(matches!(
        u.recover().await.unwrap(),
        RecoveryAction::RollBack { .. }
    ));
    assert!(image_env(&f).contains(&format!("\nAKS_FLEX_NODE_IMAGE={INSTALL}\n")));
    assert!(
        images
            .calls()
            .iter()
            .any(|c| c.contains("remove") && c.contains(CAND)),
        "{:?}",
        images.calls()
    );
    let r = u.record().unwrap().result.unwrap();
    assert_eq!(
        (r.phase, r.reason.as_str()),
        (OperationPhase::Failed, DAEMON_FAILED)
    );
    // The previous agent starts again: nothing to prove.
    assert_eq!(u.on_daemon_start(Some(INSTALL)), None);
    // A node-local upgrade: recovery, which finished it, counted it for the daemon to serve.
    assert_eq!(
        local_tally(&f),
        vec![("AgentUpgrade/Failed/DaemonFailed".to_string(), 1)]
    );
}

/// The node-local operations tally on the fake host's (real, temporary) file system.
fn local_tally(f: &FakeHost) -> Vec<(String, u64)> {
    crate::flows::operations::tally::TallyStore::new(f.host.fs.clone())
        .load()
        .unwrap()
        .counts
        .into_iter()
        .collect()
}

/// Who counts a finished upgrade: the tally takes node-local ones only, once each, when the
/// agent that finishes them (prove, recovery, a start that finds it cut short) does; a
/// MachineOperation's is counted when its status is reported. Real files; faked host commands.
#[tokio::test]
async fn only_node_local_upgrades_are_counted_in_the_tally_once() {
    for (operation, counted) in [(op(), false), (None, true)] {
        let (f, images) = container_fake();
        let u = Upgrader::new(f.host.clone())
            .with_images(Arc::new(images.clone()))
            .with_clock(clock());
        u.start(&UpgradeRequest::Image(CAND.into()), operation.clone())
            .await
            .unwrap();
        assert!(local_tally(&f).is_empty(), "nothing at the handoff");
        assert_eq!(u.on_daemon_start(Some(CAND)), None);
        u.prove(Some(CAND)).unwrap().unwrap();
        assert_eq!(u.prove(Some(CAND)).unwrap(), None, "proven once");
        let want = if counted {
            vec![("AgentUpgrade/Complete/Succeeded".to_string(), 1)]
        } else {
            vec![]
        };
        assert_eq!(local_tally(&f), want, "operation {operation:?}");
    }
    // Cut short before its switch: the start that finds it finishes it Interrupted, counted.
    let f = host_fake();
    let u = Upgrader::new(f.host.clone());
    let mut rec = u.new_record(None, "blue", "green");
    rec.stage = Stage::Staged;
    u.save(&rec).unwrap();
    u.on_daemon_start(Some("blue")).unwrap();
    assert_eq!(u.on_daemon_start(Some("blue")), None);
    assert_eq!(
        local_tally(&f),
        vec![("AgentUpgrade/Failed/Interrupted".to_string(), 1)]
    );
}

#[tokio::test]
async fn an_image_that_fails_its_check_is_not_selected() {
    let (f, images) = container_fake();
    images.fail_check(
        CAND,
        128,
        "exec /opt/aks-flex-node/bin/aks-flex-node: no such file",
    );
    let u = Upgrader::new(f.host.clone()).with_images(Arc::new(images.clone()));
    let e = u
        .start(&UpgradeRequest::Image(CAND.into()), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("check the candidate:"), "{e}");
    assert!(!f.host.fs.exists(Path::new(AGENT_IMAGE_ENV)));
    assert!(timers(&f).is_empty());
}

#[tokio::test]
async fn an_image_that_does_not_exist_fails_the_upgrade_and_selects_nothing() {
    let (f, images) = container_fake();
    images.fail_pull(CAND, "manifest unknown");
    let u = Upgrader::new(f.host.clone()).with_images(Arc::new(images.clone()));
    let e = u
        .start(&UpgradeRequest::Image(CAND.into()), op())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("pull:") && e.contains("manifest unknown"),
        "{e}"
    );
    assert!(!f.host.fs.exists(Path::new(AGENT_IMAGE_ENV)));
    assert!(timers(&f).is_empty());
    let r = u.record().unwrap();
    assert_eq!(r.stage, Stage::Finished);
    assert_eq!(u.resume("uid-1"), Resumed::Finished(r.result.unwrap()));
}

#[tokio::test]
async fn upgrading_to_the_selected_image_does_nothing() {
    let (f, images) = container_fake();
    let u = Upgrader::new(f.host.clone()).with_images(Arc::new(images.clone()));
    let s = u
        .start(&UpgradeRequest::Image(INSTALL.into()), None)
        .await
        .unwrap();
    assert!(matches!(s, Started::AlreadyCurrent(_)));
    assert!(images.calls().is_empty());
    assert!(timers(&f).is_empty());
}

#[test]
fn artifacts_that_are_neither_elf_nor_tgz_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("a");
    std::fs::write(&p, b"<html>not found</html>").unwrap();
    let e = open_agent_binary(&p).err().unwrap();
    assert!(matches!(e, ArtifactError::UnknownFormat), "{e}");
    // An I/O cause is named once in a `{:#}` chain: in the message, not as a source.
    let gone = open_agent_binary(&d.path().join("absent")).err().unwrap();
    assert!(std::error::Error::source(&gone).is_none(), "{gone:?}");
    assert!(
        e.to_string()
            .contains("neither an ELF binary nor a .tar.gz"),
        "{e}"
    );
}

#[test]
fn the_restart_timer_is_rendered_with_100ms_accuracy() {
    // Asserted on the rendered transient unit (systemd-run's argv), not by timing.
    let r = flex_testkit::FakeRunner::new();
    let m = flex_host::systemd::SystemctlManager::new(Arc::new(r.clone()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(m.start_transient_timer(&restart_timer(RESTART_DELAY, 7)))
        .unwrap();
    insta::assert_snapshot!(r.transcript(), @"systemd-run --unit=aks-flex-node-restart-7 \"--description=Restart the AKS Flex Node agent\" --on-active=1s --timer-property=AccuracySec=100ms -- /usr/bin/systemctl restart aks-flex-node-agent.service");
}

// --- unproven agents ---------------------------------------------------------------------------

/// A host whose layout has `current` = green (v2, unproven) and `last-good` = blue (v1).
/// The env file as an upgrade leaves it before its candidate is proven: the candidate image
/// selected, the install image last-good.
fn select_unproven_candidate_image(f: &FakeHost) {
    f.host
        .fs
        .write_atomic(
            Path::new(AGENT_IMAGE_ENV),
            format!("AKS_FLEX_NODE_IMAGE={CAND}\nAKS_FLEX_NODE_LAST_GOOD_IMAGE={INSTALL}\n")
                .as_bytes(),
            0o644,
        )
        .unwrap();
}

fn unproven_host() -> FakeHost {
    let f = host_fake();
    let l = Layout::new(f.host.fs.clone());
    l.converge(None).unwrap();
    l.install(Slot::Green, &mut &ELF_V2[..]).unwrap();
    l.switch(Slot::Green).unwrap();
    f
}

/// Real: the layout and record files on a temporary root. A new upgrade while `current` ≠
/// `last-good` is refused with a typed error naming both, before anything is downloaded or
/// installed: the last good binary in blue is not overwritten.
#[tokio::test]
async fn a_new_binary_upgrade_is_refused_while_the_running_agent_is_unproven() {
    let f = unproven_host();
    let e = Upgrader::new(f.host.clone())
        .start(
            &UpgradeRequest::Download {
                url: "http://127.0.0.1:1/never-fetched".into(),
                sha256: sha(b"x"),
            },
            op(),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, UpgradeError::Unproven(_)), "{e:?}");
    assert!(
        e.to_string().starts_with(
            "the running agent has not proven itself yet: current=green, last-good=blue"
        ),
        "{e}"
    );
    assert_eq!(
        read(&f, LAST_GOOD_EXEC),
        b"\x7fELF-agent-v1",
        "blue untouched"
    );
    assert_eq!(read(&f, CURRENT_EXEC), ELF_V2);
    assert!(f.runner.calls().is_empty(), "{:?}", f.runner.calls());
    assert_eq!(
        Upgrader::new(f.host.clone()).record(),
        None,
        "nothing recorded"
    );
}

/// Real: the env file on a temporary root. Faked: the image store. In the container an
/// upgrade while the selected image is not last-good is refused before any pull: the switch
/// would record the unproven image as last-good and drop the real one.
#[tokio::test]
async fn a_new_image_upgrade_is_refused_while_the_selected_image_is_unproven() {
    let (f, images) = container_fake();
    select_unproven_candidate_image(&f);
    let u = Upgrader::new(f.host.clone()).with_images(Arc::new(images.clone()));
    let e = u
        .start(
            &UpgradeRequest::Image("10.0.2.2:5000/aks-flex-node:v3".into()),
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, UpgradeError::Unproven(_)), "{e:?}");
    assert!(
        e.to_string().contains(&format!("last-good={INSTALL}")),
        "{e}"
    );
    assert!(images.calls().is_empty(), "{:?}", images.calls());
    assert!(image_env(&f).contains(&format!("AKS_FLEX_NODE_LAST_GOOD_IMAGE={INSTALL}\n")));
}

/// Real: the layout and record files. Faked: systemd (the unit failed), journalctl. A crash
/// tore the record's save while an unproven green was selected: recovery rolls back to the
/// last good blue (the old behaviour restarted green for ever), and records that.
#[tokio::test]
async fn recovery_with_an_unreadable_record_rolls_an_unproven_agent_back_to_last_good() {
    let f = unproven_host();
    f.host
        .fs
        .write_atomic(Path::new(RECORD_PATH), b"{\"version\":1,\"mo", 0o600)
        .unwrap();
    f.systemd
        .set_unit_state(AGENT_UNIT, failed_unit("exit-code", 3));
    let u = Upgrader::new(f.host.clone()).with_clock(clock());
    let action = u.recover().await.unwrap();
    assert!(
        matches!(&action, RecoveryAction::RollBackToLastGood { from, to, record: true, .. } if from == "green" && to == "blue"),
        "{action:?}"
    );
    assert_eq!(read(&f, CURRENT_EXEC), b"\x7fELF-agent-v1");
    let rec = u.record().unwrap();
    assert_eq!(
        (rec.stage, rec.candidate.as_str()),
        (Stage::Finished, "green")
    );
    let r = rec.result.unwrap();
    assert_eq!(r.reason, DAEMON_FAILED);
    assert!(
        r.message.contains("the upgrade record is unreadable"),
        "{}",
        r.message
    );
    let calls = f.systemd.calls();
    assert!(calls.contains(&"reset-failed aks-flex-node-agent.service".to_string()));
    assert!(
        timers(&f)[0].contains("on-active=1000ms"),
        "{:?}",
        timers(&f)
    );
    // Blue starts again and reconciles: nothing more to prove, nothing to finish.
    assert_eq!(u.on_daemon_start(Some("blue")), None);
    assert_eq!(u.prove(Some("blue")).unwrap(), None);
}

/// As above in the container with no record at all: the env file's unproven image is
/// replaced by its last good one (no image is removed: nothing says this agent pulled it).
#[tokio::test]
async fn recovery_without_a_record_rolls_an_unproven_image_back_to_last_good() {
    let (f, images) = container_fake();
    select_unproven_candidate_image(&f);
    f.systemd
        .set_unit_state(AGENT_UNIT, failed_unit("exit-code", 3));
    let u = Upgrader::new(f.host.clone()).with_images(Arc::new(images.clone()));
    assert!(matches!(
        u.recover().await.unwrap(),
        RecoveryAction::RollBackToLastGood { record: true, .. }
    ));
    let env = image_env(&f);
    assert!(
        env.contains(&format!("\nAKS_FLEX_NODE_IMAGE={INSTALL}\n")),
        "{env}"
    );
    assert!(
        env.contains(&format!("\nAKS_FLEX_NODE_LAST_GOOD_IMAGE={INSTALL}\n")),
        "{env}"
    );
    assert!(images.calls().is_empty(), "{:?}", images.calls());
}

/// Real: the layout. With no record, an unproven agent that reconciles becomes last-good (a
/// record lost to a crash does not leave it unproven for ever); one that is not `current` does
/// not.
#[test]
fn an_unproven_agent_without_a_record_becomes_last_good_when_it_reconciles() {
    let f = unproven_host();
    let u = Upgrader::new(f.host.clone());
    assert_eq!(u.prove(Some("blue")).unwrap(), None);
    assert_eq!(
        read(&f, LAST_GOOD_EXEC),
        b"\x7fELF-agent-v1",
        "blue is not current"
    );
    assert_eq!(
        u.prove(Some("green")).unwrap(),
        None,
        "no upgrade to finish"
    );
    assert_eq!(read(&f, LAST_GOOD_EXEC), ELF_V2);
}
