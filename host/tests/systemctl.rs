//! `SystemctlManager` against the recording fake runner (flex-testkit): the argv it renders
//! and the errors it reports. Real: the manager; faked: the process runner.

use std::sync::Arc;
use std::time::Duration;

use flex_host::runner::Output;
use flex_host::systemd::{SystemctlManager, SystemdManager, TransientTimer};
use flex_testkit::FakeRunner;

const AGENT_UNIT: &str = "aks-flex-node-agent.service";

#[tokio::test]
async fn systemctl_manager_argv() {
    let r = FakeRunner::new();
    r.on(
        "systemctl is-active --quiet b.service",
        Output::failed(3, ""),
    );
    let m = SystemctlManager::new(Arc::new(r.clone()));
    m.daemon_reload().await.unwrap();
    m.enable("a.service").await.unwrap();
    m.start("a.service").await.unwrap();
    m.mask(&["docker.socket", "docker.service"]).await.unwrap();
    assert!(m.is_active("a.service").await.unwrap());
    assert!(!m.is_active("b.service").await.unwrap());
    m.start_transient_timer(&TransientTimer {
        name: "aks-flex-node-restart".into(),
        description: "Restart the agent".into(),
        on_active: Duration::from_secs(1),
        accuracy: Duration::from_millis(100),
        command: vec![
            "/usr/bin/systemctl".into(),
            "restart".into(),
            AGENT_UNIT.into(),
        ],
    })
    .await
    .unwrap();
    insta::assert_snapshot!(r.transcript(), @r#"
    systemctl daemon-reload
    systemctl enable a.service
    systemctl start a.service
    systemctl mask docker.socket docker.service
    systemctl is-active --quiet a.service
    systemctl is-active --quiet b.service
    systemd-run --unit=aks-flex-node-restart "--description=Restart the agent" --on-active=1s --timer-property=AccuracySec=100ms -- /usr/bin/systemctl restart aks-flex-node-agent.service
    "#);
}

#[tokio::test]
async fn systemctl_failure_names_call_and_stderr() {
    let r = FakeRunner::new();
    r.on(
        "systemctl start x.service",
        Output::failed(1, "Unit x.service not found."),
    );
    let m = SystemctlManager::new(Arc::new(r));
    let e = m.start("x.service").await.unwrap_err().to_string();
    assert_eq!(
        e,
        "systemd start x.service: systemctl start x.service failed: exit status 1: Unit x.service not found."
    );
}
