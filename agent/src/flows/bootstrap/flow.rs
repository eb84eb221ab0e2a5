//! The bootstrap flow: config, preflight, then `start` once.
//!
//! 1. How far the node got ([`crate::flows::start::bootstrap_progress`]):
//!    - marked complete (`/etc/aks-flex-node/bootstrap-complete.json`, written last by
//!      `start`): say so and stop, changing nothing. Preflight would only report the running
//!      node's own ports and services, and `start` must run once.
//!    - a daemon state (`start` saves it only once kubelet is up) without the mark: a `start`
//!      cut short after its machine came up, or a node an agent that wrote no mark
//!      bootstrapped. Finish it ([`StartRunner::finish`]: the agent's units, idempotently, then
//!      the mark), without writing the config, running preflight or provisioning again; on a
//!      node whose units are all there this only writes the mark.
//!    - neither: go on.
//! 2. The config: `AKS_FLEX_NODE_CONFIG`'s file, validated and copied byte for byte, or the
//!    config rendered from the inputs; either way written to `/etc/aks-flex-node/config.json`
//!    (0600, atomically), the path the agent's unit and the machines' lifecycle helper read.
//! 3. Preflight, with `AKS_FLEX_NODE_PREFLIGHT_IGNORE`; the text report is printed, and an
//!    error fails the bootstrap with `preflight checks failed`.
//! 4. `start`, through [`StartRunner`], exactly once.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;

use anyhow::Context;
use async_trait::async_trait;

use crate::config::{self, Config, DEFAULT_CONFIG_PATH};
use crate::flows::preflight::{self, RemoteProbe};
use crate::flows::start::{BootstrapProgress, NodeStarter};
use crate::state::{BOOTSTRAP_MARK_PATH, BOOTSTRAP_STARTED_PATH, STATE_PATH};
use flex_host::context::Host;

use super::inputs::{CONFIG, Inputs};
use super::render::render;

/// Where the agent's image reads the bootstrap inputs (`aks-flex-node-bootstrap`).
pub const BOOTSTRAP_ENV_PATH: &str = "/etc/aks-flex-node/bootstrap.env";

/// Runs `start` once.
#[async_trait]
pub trait StartRunner: Send + Sync {
    /// Runs the `start` flow with `config` (already written to
    /// `/etc/aks-flex-node/config.json`); returns once the daemon state is saved and the
    /// agent's service is started. Must not print `start`'s success message: the flow does.
    async fn start(&self, host: &Host, config: &Config) -> anyhow::Result<()>;
    /// Finishes a `start` cut short after it saved the daemon state
    /// ([`crate::flows::start::finish_bootstrap`]).
    async fn finish(&self, host: &Host) -> anyhow::Result<()>;
}

/// The real [`StartRunner`]: [`crate::flows::start::run_start`] in this process, registering
/// the machine through the machine client of the rendered config
/// ([`crate::flows::start::registry_for`]).
pub struct RunStart<'a> {
    /// The node-machine layer.
    pub node: &'a dyn NodeStarter,
}

#[async_trait]
impl StartRunner for RunStart<'_> {
    async fn start(&self, host: &Host, config: &Config) -> anyhow::Result<()> {
        let registry = crate::flows::start::registry_for(config).await;
        crate::flows::start::run_start(host, config, registry.as_ref(), self.node).await
    }
    async fn finish(&self, host: &Host) -> anyhow::Result<()> {
        crate::flows::start::finish_bootstrap(host)
            .await
            .map_err(|e| anyhow::anyhow!("finish bootstrap: {e}"))
    }
}

/// How a bootstrap ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The config was written, preflight passed and `start` succeeded.
    Started,
    /// The bootstrap was marked complete: nothing was done.
    AlreadyBootstrapped,
    /// A daemon state without the complete mark: the agent's units were installed (where
    /// missing) and the mark written.
    Finished,
}

/// What `aks-flex-node bootstrap-node [--env-file F]` and `aks-flex-node-bootstrap` (with
/// `Some(BOOTSTRAP_ENV_PATH)`) do: read the inputs from `env_file` (as data) and `environ`
/// (normally `std::env::vars_os()`), set up logging on stderr at `AKS_FLEX_NODE_LOG_LEVEL`,
/// and [`run`] the flow, printing to stdout.
pub async fn main_entry(
    env_file: Option<&Path>,
    environ: impl IntoIterator<Item = (OsString, OsString)>,
    host: &Host,
    probe: &dyn RemoteProbe,
    starter: &dyn StartRunner,
) -> anyhow::Result<Outcome> {
    let inputs = Inputs::load(env_file, environ)?;
    let level = if inputs.log_level.trim().is_empty() {
        "info"
    } else {
        inputs.log_level.trim()
    };
    crate::logging::init(level, None);
    tracing::debug!(inputs = ?inputs, "bootstrap inputs");
    run(host, &inputs, probe, starter, &mut PrintOut).await
}

/// Standard output through `print!` (so test harnesses capture it).
struct PrintOut;

impl Write for PrintOut {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        print!("{}", String::from_utf8_lossy(buf));
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().flush()
    }
}

/// Runs the flow (see the module doc), printing the report and messages to `out`.
pub async fn run(
    host: &Host,
    inputs: &Inputs,
    probe: &dyn RemoteProbe,
    starter: &dyn StartRunner,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<Outcome> {
    let euid = host.info.euid();
    if euid != 0 {
        anyhow::bail!("aks-flex-node bootstrap must run as root (running as uid {euid})");
    }
    let progress = crate::flows::start::progress_on(host);
    match progress {
        BootstrapProgress::Complete => {
            writeln!(
                out,
                "[bootstrap] this node is already bootstrapped ({BOOTSTRAP_MARK_PATH} exists): \
                 not writing the config, running preflight or start again \
                 (run `aks-flex-node reset` first to bootstrap it anew)"
            )?;
            return Ok(Outcome::AlreadyBootstrapped);
        }
        BootstrapProgress::Unfinished => {
            writeln!(
                out,
                "[bootstrap] {STATE_PATH} exists but the bootstrap is not marked complete: \
                 finishing it (the agent's units, then {BOOTSTRAP_MARK_PATH}), \
                 not writing the config, running preflight or start again"
            )?;
            starter.finish(host).await?;
            write!(out, "{}", crate::flows::start::START_SUCCESS)?;
            return Ok(Outcome::Finished);
        }
        BootstrapProgress::NotStarted | BootstrapProgress::Interrupted => {}
    }

    let (config, bytes, source) = choose_config(
        inputs,
        &mut |path| {
            std::fs::read(path).with_context(|| format!("{CONFIG}: read {}", path.display()))
        },
        &|| host.info.hostname(),
    )?;
    host.fs
        .write_atomic(Path::new(DEFAULT_CONFIG_PATH), &bytes, 0o600)
        .context("write the config")?;
    writeln!(out, "[bootstrap] wrote {DEFAULT_CONFIG_PATH} from {source}")?;

    if progress == BootstrapProgress::Interrupted {
        writeln!(
            out,
            "[bootstrap] an earlier start was cut short before the node's machine came up \
             ({BOOTSTRAP_STARTED_PATH} exists, {STATE_PATH} does not): running start again \
             without preflight, which that run passed and its half-started machine would fail"
        )?;
    } else {
        let results = preflight::run_checks(host, &config, probe).await;
        let report =
            preflight::build_report(results, std::slice::from_ref(&inputs.preflight_ignore));
        write!(out, "{}", preflight::render_text(&report))?;
        preflight::verdict(&report, false)?;
    }

    writeln!(out, "[bootstrap] running start")?;
    starter.start(host, &config).await?;
    write!(out, "{}", crate::flows::start::START_SUCCESS)?;
    Ok(Outcome::Started)
}

/// The config a bootstrap writes, its bytes and where it comes from: `AKS_FLEX_NODE_CONFIG`'s
/// file (read with `read`, validated and kept byte for byte; no render input may be set beside
/// it), or the config rendered from the inputs. The real bootstrap and its dry run both take
/// it from here.
pub(super) fn choose_config(
    inputs: &Inputs,
    read: &mut dyn FnMut(&Path) -> anyhow::Result<Vec<u8>>,
    hostname: &dyn Fn() -> std::io::Result<String>,
) -> anyhow::Result<(Config, Vec<u8>, String)> {
    match &inputs.config {
        Some(path) => {
            let set = inputs.render_inputs_set();
            if !set.is_empty() {
                anyhow::bail!(
                    "{CONFIG} is set, so the config is not rendered and these inputs would be ignored: {}; unset them or {CONFIG}",
                    set.join(", ")
                );
            }
            let bytes = read(path)?;
            let loaded = config::parse(&bytes, hostname)
                .with_context(|| format!("{CONFIG}: {}", path.display()))?;
            for k in &loaded.unknown_keys {
                tracing::warn!(key = %k, "ignoring unknown config key");
            }
            Ok((
                loaded.config,
                bytes,
                format!("{CONFIG} ({})", path.display()),
            ))
        }
        None => {
            let r = render(inputs, hostname).context("render the config")?;
            let bytes = r.bytes().to_vec();
            Ok((r.config, bytes, "the bootstrap inputs".to_string()))
        }
    }
}

#[cfg(test)]
mod tests;
