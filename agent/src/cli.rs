//! The command line: `start` (`bootstrap`), `daemon` (`agent`), `reset` (`unbootstrap`),
//! `preflight` and `version`, with upstream's messages and exit codes: on failure
//! `Command execution failed: <error>` on stderr and exit code 1; usage errors also exit 1.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::config::{self, Config};
use crate::context::Host;
use crate::hostinfo::{HostInfo, RealHostInfo};
use crate::preflight::{self, OutputFormat};

/// `aks-flex-node`.
#[derive(Debug, Parser)]
#[command(
    name = "aks-flex-node",
    about = "AKS Flex Node Agent",
    long_about = "Azure Kubernetes Service Flex Node Agent for edge computing scenarios",
    disable_version_flag = true
)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// `--config`.
#[derive(Debug, Args)]
pub struct ConfigArg {
    /// Path to configuration JSON file (required)
    #[arg(long, value_name = "PATH")]
    pub config: PathBuf,
}

/// `preflight` flags.
#[derive(Debug, Args)]
pub struct PreflightArgs {
    /// Path to configuration JSON file (required)
    #[arg(long, value_name = "PATH")]
    pub config: PathBuf,
    /// Checks whose errors become warnings (comma-separated; `all` ignores every check)
    #[arg(long, value_delimiter = ',', value_name = "CHECKS")]
    pub ignore_preflight_errors: Vec<String>,
    /// Fail when any check returns a warning
    #[arg(long)]
    pub fail_on_warnings: bool,
    /// Output format: text or json
    #[arg(long, default_value = "text", value_name = "FORMAT")]
    pub output: String,
}

/// Subcommands, in upstream's order.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Bootstrap the node and start the agent service
    #[command(
        visible_alias = "bootstrap",
        long_about = "Install the systemd unit, bootstrap the nspawn-based AKS worker node, then enable and start the agent daemon through systemd."
    )]
    Start(ConfigArg),
    /// Run preflight checks against this host and the configuration
    Preflight(PreflightArgs),
    /// Run the AKS Flex Node daemon
    #[command(
        visible_alias = "agent",
        long_about = "Run the AKS Flex Node daemon, with automatic status tracking and self-recovery. It is launched by systemd after bootstrap."
    )]
    Daemon(ConfigArg),
    /// Remove AKS node configuration and Arc connection
    #[command(visible_alias = "unbootstrap")]
    Reset,
    /// Print version information
    Version,
}

/// Parses `args` and runs the command; returns the process exit code.
pub fn main_with_args(args: Vec<std::ffi::OsString>) -> ExitCode {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let code = match e.kind() {
                clap::error::ErrorKind::DisplayHelp
                | clap::error::ErrorKind::DisplayVersion
                | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => 0,
                _ => 1,
            };
            let _ = e.print();
            return if code == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Command execution failed: start async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Command execution failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn load_config(path: &Path) -> anyhow::Result<config::Loaded> {
    let info = RealHostInfo;
    config::load(path, &|| info.hostname())
        .with_context(|| format!("failed to load config from {}", path.display()))
}

/// Logs what loading noticed; call after logging is set up.
fn log_loaded(loaded: &config::Loaded) {
    for k in &loaded.unknown_keys {
        tracing::warn!(key = %k, "ignoring unknown config key");
    }
    // Secrets in the config are `Secret`s, whose Debug output is redacted.
    tracing::debug!(config = ?loaded.config, "loaded config");
}

fn require_root(command: &str) -> anyhow::Result<()> {
    let euid = RealHostInfo.euid();
    if euid != 0 {
        anyhow::bail!("aks-flex-node {command} must run as root (running as uid {euid})");
    }
    Ok(())
}

/// Runs a parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Version => {
            print!("{}", crate::version::render());
            Ok(())
        }
        Command::Preflight(a) => {
            let format = OutputFormat::parse(&a.output).map_err(|e| anyhow::anyhow!(e))?;
            let loaded = load_config(&a.config)?;
            let cfg = &loaded.config;
            crate::logging::init(&cfg.agent.log_level, None);
            log_loaded(&loaded);
            let host = Host::real().await?;
            let results = preflight::run_checks(&host, cfg).await;
            let report = preflight::build_report(results, &a.ignore_preflight_errors);
            match format {
                OutputFormat::Text => print!("{}", preflight::render_text(&report)),
                OutputFormat::Json => print!("{}", preflight::render_json(&report)),
            }
            preflight::verdict(&report, a.fail_on_warnings).map_err(|e| anyhow::anyhow!(e))
        }
        Command::Start(a) => {
            require_root("start")?;
            let loaded = load_config(&a.config)?;
            let cfg = &loaded.config;
            crate::logging::init(&cfg.agent.log_level, Some(Path::new(&cfg.agent.log_dir)));
            log_loaded(&loaded);
            let host = Host::real().await?;
            let registry = crate::start::NoRegistry(
                "this agent has no machine-goal client yet; machine registration skipped",
            );
            crate::start::run_start(&host, cfg, &registry, &NodeMachinesUnavailable).await?;
            print!("{}", crate::start::START_SUCCESS);
            Ok(())
        }
        Command::Daemon(a) => {
            require_root("daemon")?;
            let loaded = load_config(&a.config)?;
            let cfg = &loaded.config;
            crate::logging::init(&cfg.agent.log_level, Some(Path::new(&cfg.agent.log_dir)));
            log_loaded(&loaded);
            let shutdown = crate::daemon::shutdown_on_signals()?;
            crate::daemon::run(cfg, shutdown).await
        }
        Command::Reset => {
            require_root("reset")?;
            crate::logging::init("info", None);
            let host = Host::real().await?;
            crate::systemd::uninstall_service(&host.fs, host.systemd.as_ref())
                .await
                .context("uninstall-service")?;
            crate::reset::reset_node(&host, crate::machine::Timings::default()).await?;
            Ok(())
        }
    }
}

/// The node-machine layer is not part of this build yet: `start` stops at that step with this
/// error rather than claiming a node it did not start.
struct NodeMachinesUnavailable;

#[async_trait::async_trait]
impl crate::start::NodeStarter for NodeMachinesUnavailable {
    async fn start_node(&self, _h: &Host, _c: &Config, machine: &str) -> anyhow::Result<()> {
        anyhow::bail!(
            "provisioning nspawn machine {machine} is not implemented in this build of the agent"
        )
    }
}
