//! `bootstrap-node --dry-run`: what the bootstrap would write, rendered and validated, with
//! nothing on the host changed. Bad `bootstrap.env` files can be tried safely this way.
//!
//! [`plan`] is pure: the inputs (and, with `AKS_FLEX_NODE_CONFIG`, that file's bytes), host
//! facts and the host's `resolv.conf` give the files the bootstrap's first `start` writes: the
//! config, the agent's and recovery units, and the first machine's (`kube1`) host-side and
//! rootfs configuration files. It fails as the real bootstrap would, naming the input, line or
//! field at fault. The daemon state and the machine's rootfs image and components are not
//! rendered (they come from running `start`), and preflight does not run.
//!
//! [`show`] prints the files with every secret of the config replaced; [`write_under`] writes
//! them, secrets included, under a directory given on the command line, never at their host
//! paths.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::config::{Config, DEFAULT_CONFIG_PATH};
use crate::flows::start::BootstrapProgress;
use crate::machine::nodeconfig::{self, Entry};
use crate::machine::nodegoal::{self, HostFacts};
use crate::machine::nspawn;
use crate::systemd::{
    AGENT_UNIT_PATH, RECOVERY_UNIT_PATH, render_agent_unit_for, render_recovery_unit_for,
};

use super::inputs::{CONFIG, Inputs};

/// Shown instead of a secret in [`show`]'s output.
pub const REDACTED: &str = "<redacted>";

/// One file the bootstrap would write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedFile {
    /// Its path on the host.
    pub path: PathBuf,
    /// Its content (may hold secrets: see [`Plan::secrets`]).
    pub content: Vec<u8>,
    /// Its mode.
    pub mode: u32,
    /// A symbolic link to this target (`content` then describes it).
    pub link: Option<PathBuf>,
}

/// What a bootstrap would write.
#[derive(Debug)]
pub struct Plan {
    /// The config, as the agent loads it.
    pub config: Config,
    /// Where the config comes from (`the bootstrap inputs`, or the `AKS_FLEX_NODE_CONFIG` file).
    pub source: String,
    /// The files, in the order the bootstrap writes them.
    pub files: Vec<PlannedFile>,
}

impl Plan {
    /// The config's secret values (non-empty), which [`show`] replaces.
    pub fn secrets(&self) -> Vec<&str> {
        let azure = &self.config.azure;
        [
            azure.bootstrap_token.as_ref().map(|t| t.token.expose()),
            azure
                .service_principal
                .as_ref()
                .map(|s| s.client_secret.expose()),
        ]
        .into_iter()
        .flatten()
        .filter(|s| !s.is_empty())
        .collect()
    }
}

/// Renders what the bootstrap would write. `config_file` is the content of
/// `AKS_FLEX_NODE_CONFIG`'s file when that input is set (the caller reads it).
pub fn plan(
    inputs: &Inputs,
    config_file: Option<&[u8]>,
    facts: &HostFacts,
    containerized: bool,
    resolv_conf: &[u8],
) -> anyhow::Result<Plan> {
    let hostname = || Ok(facts.hostname.clone());
    let (config, bytes, source) = super::flow::choose_config(
        inputs,
        &mut |path| {
            config_file
                .map(<[u8]>::to_vec)
                .ok_or_else(|| anyhow::anyhow!("{CONFIG}: {} was not read", path.display()))
        },
        &hostname,
    )?;
    let mut files = vec![
        PlannedFile {
            path: PathBuf::from(DEFAULT_CONFIG_PATH),
            content: bytes,
            mode: 0o600,
            link: None,
        },
        PlannedFile {
            path: PathBuf::from(RECOVERY_UNIT_PATH),
            content: render_recovery_unit_for(containerized).into_bytes(),
            mode: 0o644,
            link: None,
        },
        PlannedFile {
            path: PathBuf::from(AGENT_UNIT_PATH),
            content: render_agent_unit_for(containerized).into_bytes(),
            mode: 0o644,
            link: None,
        },
    ];
    let goal = nodegoal::resolve(&config, nspawn::KUBE1, facts)?;
    let mut entries = nodeconfig::render_rootfs(&goal, resolv_conf)?;
    entries.extend(nodeconfig::render_host(&goal));
    for e in entries {
        match e {
            Entry::File {
                path,
                content,
                mode,
            } => files.push(PlannedFile {
                path,
                content,
                mode,
                link: None,
            }),
            Entry::Symlink { path, target } => files.push(PlannedFile {
                path,
                content: format!("-> {}\n", target.display()).into_bytes(),
                mode: 0o777,
                link: Some(target),
            }),
            Entry::Dir { .. } => {}
        }
    }
    Ok(Plan {
        config,
        source,
        files,
    })
}

/// What the real bootstrap would do on a node at `progress` (read-only: the same decision
/// [`crate::flows::start::progress_on`] gives the real bootstrap), or `None` when it would write
/// the files the plan lists, run preflight and then `start`.
pub fn progress_note(progress: BootstrapProgress) -> Option<String> {
    use crate::state::{BOOTSTRAP_MARK_PATH, BOOTSTRAP_STARTED_PATH, STATE_PATH};
    match progress {
        BootstrapProgress::NotStarted => None,
        BootstrapProgress::Complete => Some(format!(
            "[dry-run] note: this node is already bootstrapped ({BOOTSTRAP_MARK_PATH} exists): \
             the bootstrap would change nothing (no config written, neither preflight nor start run)\n"
        )),
        BootstrapProgress::Unfinished => Some(format!(
            "[dry-run] note: {STATE_PATH} exists but the bootstrap is not marked complete: the \
             bootstrap would only finish it (the agent's units, then {BOOTSTRAP_MARK_PATH}), \
             writing no config and running neither preflight nor start; the files below are what \
             a bootstrap from the beginning writes\n"
        )),
        BootstrapProgress::Interrupted => Some(format!(
            "[dry-run] note: an earlier start was cut short before the node's machine came up \
             ({BOOTSTRAP_STARTED_PATH} exists, {STATE_PATH} does not): the bootstrap would write \
             the config and run start again without preflight\n"
        )),
    }
}

/// `text` with each secret replaced by [`REDACTED`], as it stands and as JSON (and YAML's
/// double-quoted strings) escape it.
fn redact_text(mut text: String, secrets: &[&str]) -> String {
    for s in secrets {
        text = text.replace(s, REDACTED);
        if let Ok(quoted) = serde_json::to_string(s) {
            let escaped = &quoted[1..quoted.len() - 1];
            if escaped != *s {
                text = text.replace(escaped, REDACTED);
            }
        }
    }
    text
}

/// Replaces the secrets in every string of a JSON value (compared decoded, so any escaping of
/// the file is seen through); returns whether it replaced any.
fn redact_value(v: &mut serde_json::Value, secrets: &[&str]) -> bool {
    match v {
        serde_json::Value::String(s) => {
            let r = redact_text(s.clone(), secrets);
            let changed = r != *s;
            *s = r;
            changed
        }
        serde_json::Value::Array(a) => a
            .iter_mut()
            .fold(false, |c, v| redact_value(v, secrets) | c),
        serde_json::Value::Object(o) => o
            .values_mut()
            .fold(false, |c, v| redact_value(v, secrets) | c),
        _ => false,
    }
}

/// The config file as shown: as written when it holds no secret; else parsed and shown
/// re-serialized with the secrets replaced (the file may escape them any way JSON allows, so
/// matching its text cannot be trusted).
fn redact_config(content: &[u8], secrets: &[&str]) -> String {
    let text = String::from_utf8_lossy(content).into_owned();
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(content) else {
        return redact_text(text, secrets);
    };
    if !redact_value(&mut v, secrets) {
        return redact_text(text, secrets);
    }
    match serde_json::to_string_pretty(&v) {
        Ok(s) => format!("{s}\n"),
        Err(_) => redact_text(text, secrets),
    }
}

/// The plan as text: each file's path and mode, then its content with the config's secrets
/// replaced by [`REDACTED`] (the config itself re-serialized when it holds one).
pub fn show(plan: &Plan) -> String {
    let secrets = plan.secrets();
    let mut out = format!(
        "[dry-run] the config from {}: valid; the bootstrap would write {} files (nothing on this host was changed; preflight and start did not run)\n",
        plan.source,
        plan.files.len()
    );
    for f in &plan.files {
        let text = if f.path == Path::new(DEFAULT_CONFIG_PATH) {
            redact_config(&f.content, &secrets)
        } else {
            redact_text(String::from_utf8_lossy(&f.content).into_owned(), &secrets)
        };
        let kind = match &f.link {
            Some(target) => format!("symlink to {}", target.display()),
            None => format!("{:04o}", f.mode),
        };
        out.push_str(&format!("\n==> {} ({kind}) <==\n{text}", f.path.display()));
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// Writes the plan's files under `dir` (their host paths below it, with their modes, secrets
/// included; a link as a link to its target, as given); returns the paths written.
pub fn write_under(plan: &Plan, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let fs = flex_host::fs::HostFs::new(dir);
    let mut written = Vec::new();
    for f in &plan.files {
        match &f.link {
            Some(target) => fs.symlink(&f.path, target).map(drop),
            None => fs.write_atomic(&f.path, &f.content, f.mode),
        }
        .with_context(|| format!("write {} under {}", f.path.display(), dir.display()))?;
        written.push(fs.path(&f.path));
    }
    Ok(written)
}

#[cfg(test)]
mod tests;
