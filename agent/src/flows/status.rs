//! `aks-flex-node status`: gathers [`Facts`] from the node through the host's seams (files
//! under [`HostFs`], units through the [`flex_host::systemd::SystemdManager`], kubelet and
//! containerd through the runner) and judges them with [`flex_api::status::assess`].
//!
//! It only reads: record files are loaded (never repaired or rewritten), systemd is asked for
//! unit states (`systemctl show`), kubelet is asked with `systemctl --machine=<m> is-active
//! kubelet.service` and containerd with `ctr images ls` (the agent's image, in the container).
//! The tests run it on a temporary root with recording fakes and check that nothing was
//! written and no systemd call but `show` was made.

use std::path::Path;

use flex_host::context::Host;
use flex_host::runner::Cmd;

use crate::flows::operations::record::{RECORDS_DIR, Record, RecordStore};
use crate::flows::upgrade::{RECORD_PATH, Stage, UpgradeRecord, Upgrader};
use crate::state::{BootstrapMarkStore, JsonStore, StateError, StateStore};
use crate::systemd::{AGENT_UNIT, CTR_NAMESPACE, RECOVERY_UNIT};

pub use flex_api::status::{
    AgentView, DrainView, Facts, KubeletView, OperationView, Read, Report, ResultView, StateView,
    UnitView, UpgradeView, assess, machine_unit, render_json, render_text,
};

/// How many operation records status shows (the newest).
pub const LAST_OPERATIONS: usize = 5;

fn read<T, V>(r: Result<Option<T>, StateError>, view: impl Fn(T) -> V) -> Read<V> {
    match r {
        Ok(Some(v)) => Read::Ok { value: view(v) },
        Ok(None) => Read::Missing,
        Err(e) if e.is_unreadable() => Read::Unreadable {
            error: e.to_string(),
        },
        Err(e) => Read::Error {
            error: e.to_string(),
        },
    }
}

fn result_view(r: &crate::flows::operations::OperationResult) -> ResultView {
    ResultView {
        phase: r.phase.to_string(),
        reason: r.reason.clone(),
        message: r.message.clone(),
    }
}

fn upgrade_view(r: UpgradeRecord) -> UpgradeView {
    UpgradeView {
        stage: match r.stage {
            Stage::Staged => "staged",
            Stage::Switched => "switched",
            Stage::Finished => "finished",
        }
        .into(),
        previous: r.previous,
        candidate: r.candidate,
        started_at: r.started_at,
        operation: r.operation.map(|o| o.name),
        result: r.result.as_ref().map(result_view),
    }
}

/// The newest [`LAST_OPERATIONS`] operation records (unreadable ones included, named by file).
fn operations(host: &Host) -> Vec<OperationView> {
    let dir = host.fs.path(Path::new(RECORDS_DIR));
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|f| f.ends_with(".json") && !f.starts_with('.'))
        .collect();
    files.sort();
    let store = RecordStore::new(host.fs.clone());
    let mut out: Vec<OperationView> = files
        .into_iter()
        .map(|file| {
            let s: JsonStore<Record> = JsonStore::at(host.fs.clone(), store.dir().join(&file));
            match s.load() {
                Ok(Some(r)) => OperationView {
                    file,
                    name: r.name,
                    kind: r.kind.to_string(),
                    stage: r.stage.as_str().into(),
                    started_at: r.started_at,
                    result: r.result.as_ref().map(result_view),
                    error: None,
                },
                Ok(None) => OperationView {
                    file,
                    error: Some("vanished while reading".into()),
                    ..Default::default()
                },
                Err(e) => OperationView {
                    file,
                    error: Some(e.to_string()),
                    ..Default::default()
                },
            }
        })
        .collect();
    // Newest first; unreadable records (no start time) last.
    out.sort_by(|a, b| b.started_at.cmp(&a.started_at));
    out.truncate(LAST_OPERATIONS);
    out
}

async fn unit(host: &Host, name: &str) -> UnitView {
    match host.systemd.unit_state(name).await {
        Ok(u) => UnitView {
            name: name.into(),
            active_state: u.active_state,
            sub_state: u.sub_state,
            result: u.result,
            error: None,
        },
        Err(e) => UnitView {
            name: name.into(),
            error: Some(e.to_string()),
            ..Default::default()
        },
    }
}

/// `systemctl --machine=<m> is-active kubelet.service` (read-only; through the runner, so it
/// reaches the host's systemd from the agent's container too).
pub fn kubelet_probe(machine: &str) -> Cmd {
    Cmd::new("systemctl").args([
        format!("--machine={machine}"),
        "is-active".into(),
        "kubelet.service".into(),
    ])
}

async fn kubelet(host: &Host, active: Option<&str>) -> KubeletView {
    let Some(machine) = active else {
        return KubeletView::Unknown {
            reason: "no active machine".into(),
        };
    };
    match host.runner.output(&kubelet_probe(machine)).await {
        Ok(o) if o.success() && o.stdout.trim() == "active" => KubeletView::Active {
            machine: machine.into(),
        },
        Ok(o) => KubeletView::Inactive {
            machine: machine.into(),
            detail: format!("{} {}", o.stdout.trim(), o.stderr.trim())
                .trim()
                .to_string(),
        },
        Err(e) => KubeletView::Unknown {
            reason: e.to_string(),
        },
    }
}

/// `ctr -n aks-flex images ls name==<reference>`: the image's digest (read-only).
pub fn image_probe(reference: &str) -> Cmd {
    Cmd::new("ctr").args([
        "-n".to_string(),
        CTR_NAMESPACE.into(),
        "images".into(),
        "ls".into(),
        format!("name=={reference}"),
    ])
}

/// The digest column of `ctr images ls` for `reference`; `Err` when containerd cannot be asked.
async fn image_digest(
    host: &Host,
    reference: &str,
) -> Result<Option<String>, flex_host::runner::CmdError> {
    let out = host.runner.run(&image_probe(reference)).await?;
    Ok(out
        .stdout
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut cols = l.split_whitespace();
            (cols.next() == Some(reference)).then(|| cols.nth(1).map(str::to_string))?
        })
        .next())
}

/// Gathers the facts (reads only).
pub async fn gather(host: &Host) -> Facts {
    let state = read(StateStore::new(host.fs.clone()).load(), |s| StateView {
        active_machine: s.active_machine,
        applied_settings_version: s.applied_settings_version,
        applied_kubernetes_version: s.applied_kubernetes_version,
    });
    let bootstrap_mark = read(BootstrapMarkStore::new(host.fs.clone()).load(), |m| {
        m.agent_version
    });
    let upgrade = read(
        JsonStore::<UpgradeRecord>::at(host.fs.clone(), RECORD_PATH).load(),
        upgrade_view,
    );
    let (current, last_good) = Upgrader::new(host.clone()).selection();
    let containerized = host.containerized();
    let mut agent = AgentView {
        mode: if containerized { "image" } else { "binary" }.into(),
        version: crate::version::VERSION.into(),
        current,
        last_good,
        image_digest: None,
    };
    let mut containerd_error = None;
    if containerized && let Some(image) = agent.current.clone() {
        match image_digest(host, &image).await {
            Ok(d) => agent.image_digest = d,
            Err(e) => containerd_error = Some(e.to_string()),
        }
    }
    let mut units = Vec::new();
    for name in [AGENT_UNIT, RECOVERY_UNIT] {
        units.push(unit(host, name).await);
    }
    for m in [crate::state::KUBE1, crate::state::KUBE2] {
        units.push(unit(host, &machine_unit(m)).await);
    }
    let active = state
        .value()
        .map(|s| s.active_machine.as_str())
        .filter(|m| [crate::state::KUBE1, crate::state::KUBE2].contains(m));
    let kubelet = kubelet(host, active).await;
    Facts {
        state,
        bootstrap_mark,
        agent,
        upgrade,
        operations: operations(host),
        units,
        kubelet,
        containerd_error,
        drain: read(
            crate::flows::drain::progress::store(host.fs.clone()).load(),
            |d| d,
        ),
    }
}

/// Gathers and judges.
pub async fn status(host: &Host) -> Report {
    assess(gather(host).await)
}

#[cfg(test)]
mod tests;
