//! Each of the agent's error types prints its cause once (the rule in `flex_host::error`): in
//! its message, so the daemon's `error = %e` log lines keep it, and never again as a
//! `source()`, so the CLI's `{:#}` does not repeat it. Real causes where cheap: OS errors of a
//! missing file, a serde_json error.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::path::{Path, PathBuf};

use aks_flex_node::entrypoint::EntrypointError;
use aks_flex_node::flows::operations::ReconcileError;
use aks_flex_node::machine::components::{Component, ComponentError, Failure, Step};
use aks_flex_node::machine::containerd::ContainerdError;
use aks_flex_node::machine::nspawn::MachineError;
use aks_flex_node::state::StateError;
use aks_flex_node::task::StepError;
use flex_host::fs::FsError;
use flex_host::runner::CmdError;
use flex_oci::OciError;
use flex_testkit::assert_cause_once;

fn missing() -> PathBuf {
    PathBuf::from("/nonexistent/aks-flex-node-error-causes")
}

fn os_error() -> std::io::Error {
    std::fs::read(missing()).unwrap_err()
}

fn fs_error() -> FsError {
    FsError::new("read", Path::new("/etc/x"), os_error())
}

fn spawn_error() -> CmdError {
    CmdError::Spawn {
        argv: "ctr images ls".into(),
        cause: os_error(),
    }
}

fn json_error() -> serde_json::Error {
    serde_json::from_str::<serde_json::Value>("{").unwrap_err()
}

#[test]
fn every_agent_error_prints_its_cause_once() {
    let os = os_error().to_string();
    let json = json_error().to_string();
    let cases: Vec<(&str, Box<dyn std::error::Error>, String)> = vec![
        (
            "ContainerdError::Ctr",
            Box::new(ContainerdError::Ctr {
                image: "mcr/x:1".into(),
                step: "list",
                cause: spawn_error(),
            }),
            os.clone(),
        ),
        (
            "ContainerdError::Registry",
            Box::new(ContainerdError::Registry {
                image: "mcr/x:1".into(),
                step: "resolve",
                cause: OciError::Io {
                    reference: "mcr/x:1".into(),
                    op: "read",
                    path: missing(),
                    cause: os_error(),
                },
            }),
            os.clone(),
        ),
        (
            "MachineError::Inspect",
            Box::new(MachineError::Inspect(spawn_error())),
            os.clone(),
        ),
        (
            "MachineError::Unmount",
            Box::new(MachineError::Unmount {
                machine: "kube1".into(),
                path: "/sys/fs/bpf".into(),
                cause: spawn_error(),
            }),
            os.clone(),
        ),
        (
            "MachineError::Fs",
            Box::new(MachineError::Fs {
                machine: "kube1".into(),
                cause: fs_error(),
            }),
            os.clone(),
        ),
        (
            "EntrypointError::Mount",
            Box::new(EntrypointError::Mount {
                target: "/run/x".into(),
                cause: os_error(),
            }),
            os.clone(),
        ),
        (
            "ReconcileError::Api",
            Box::new(ReconcileError::Api {
                action: "get",
                name: "op".into(),
                cause: kube::Error::SerdeError(json_error()),
            }),
            json.clone(),
        ),
        (
            "ReconcileError::Labels",
            Box::new(ReconcileError::Labels {
                kind: "Node",
                name: "n".into(),
                cause: kube::Error::SerdeError(json_error()),
            }),
            json.clone(),
        ),
        (
            "ReconcileError::Record",
            Box::new(ReconcileError::Record {
                name: "op".into(),
                cause: StateError::Fs(fs_error()),
            }),
            os.clone(),
        ),
        (
            "StepError",
            Box::new(StepError {
                name: "configure-os".into(),
                cause: anyhow::Error::new(fs_error()).context("write sysctl"),
            }),
            os.clone(),
        ),
        (
            "ComponentError (Failure::Fs)",
            Box::new(ComponentError {
                component: Component::Runc,
                step: Step::Install,
                location: "runc".into(),
                failure: Failure::Fs(fs_error()),
            }),
            os.clone(),
        ),
        (
            "ComponentError (Failure::Io)",
            Box::new(ComponentError {
                component: Component::Runc,
                step: Step::Download,
                location: "/bundle/runc".into(),
                failure: Failure::Io(os_error()),
            }),
            os.clone(),
        ),
    ];
    for (name, e, cause) in &cases {
        eprintln!("{name}: {e}");
        assert_cause_once(e.as_ref(), cause);
    }
}
