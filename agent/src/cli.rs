//! The command line: `start` (`bootstrap`), `daemon` (`agent`), `reset` (`unbootstrap`),
//! `preflight`, `status`, `version`, `token kubelogin`, and the node-local `operation` and
//! `repave`, with upstream's messages and exit
//! codes: on failure `Command execution failed: <error>` on stderr and exit code 1; usage errors
//! also exit 1.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::config;
use crate::flows::preflight::{self, OutputFormat};
use flex_host::context::Host;
use flex_host::hostinfo::{HostInfo, RealHostInfo};

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

/// `ignition` flags.
#[derive(Debug, Args)]
pub struct IgnitionArgs {
    /// The base config: Butane (flatcar variant) or Ignition JSON (3.0.0 to 3.4.0)
    #[arg(long, value_name = "FILE")]
    pub base_config: PathBuf,
    /// Where to write the node's Ignition config (created with mode 0600; an existing file is
    /// an error, never replaced: it carries the bootstrap token)
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// The agent image the node runs, pinned by digest
    #[arg(long, value_name = "REF", env = "AKS_FLEX_NODE_IMAGE")]
    pub image: String,
    /// Pull the agent image over plain HTTP (`ctr images pull --plain-http`)
    #[arg(long)]
    pub plain_http: bool,
    /// A registry (host[:port]) the agent may pull from over plain HTTP (repeat, or separate
    /// with commas)
    #[arg(long, value_delimiter = ',', value_name = "HOST[:PORT]")]
    pub insecure_registry: Vec<String>,
    /// The Ignition spec version to write: 3.4.0 or 3.3.0
    #[arg(long, default_value = "3.4.0", value_name = "VERSION")]
    pub spec: String,
    /// The directory the base config's `local` contents are relative to (Butane's --files-dir)
    #[arg(long, value_name = "DIR")]
    pub files_dir: Option<PathBuf>,
    /// Bootstrap arguments from FILE (`-`: standard input), in bootstrap.env's format
    /// (KEY=VALUE lines, `#` comments): keeps a secret such as the bootstrap token out of the
    /// process list and the shell's history. Those after `--` are added to them
    #[arg(long, value_name = "FILE")]
    pub args_file: Option<PathBuf>,
    /// The bootstrap arguments: AKS_FLEX_NODE_*=VALUE assignments (docs/bootstrap.md's inputs)
    #[arg(
        last = true,
        required_unless_present = "args_file",
        value_name = "BOOTSTRAP_ARGS"
    )]
    pub bootstrap_args: Vec<String>,
}

/// `repave` flags.
#[derive(Debug, Args)]
pub struct RepaveArgs {
    /// The settings version to apply: 1 to 64 characters of A-Z a-z 0-9 . _ : - (default
    /// local-<unix seconds>)
    #[arg(long, value_name = "VERSION")]
    pub settings_version: Option<String>,
    /// Path to configuration JSON file
    #[arg(long, value_name = "PATH", default_value = config::DEFAULT_CONFIG_PATH)]
    pub config: PathBuf,
    /// How long to wait for the daemon's current work (seconds)
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    pub wait: u64,
}

/// `wait-task` arguments.
#[derive(Debug, Args)]
pub struct WaitTaskArgs {
    /// containerd's socket
    #[arg(long, default_value = crate::machine::containerd::CONTAINERD_SOCKET, value_name = "PATH")]
    pub address: PathBuf,
    /// The containerd namespace
    #[arg(long, short = 'n', default_value = crate::systemd::CTR_NAMESPACE)]
    pub namespace: String,
    /// The task's container ID
    pub id: String,
}

/// `status` flags.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Output format: text or json
    #[arg(long, default_value = "text", value_name = "FORMAT")]
    pub output: String,
    /// Read the node's files under this directory instead of `/` (tests)
    #[arg(long, hide = true, value_name = "DIR")]
    pub root: Option<PathBuf>,
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
    /// Print the node's health: active machine, applied goal, agent, upgrade, operations, units,
    /// kubelet (exit code 0 when healthy, 1 with the reasons otherwise; changes nothing)
    Status(StatusArgs),
    /// Print version information
    Version,
    /// Kubernetes exec based authentication provider
    #[command(subcommand)]
    Token(TokenCommand),
    /// Bootstrap this host from AKS_FLEX_NODE_* inputs (what bootstrap.sh runs)
    #[command(
        long_about = "Render the config from AKS_FLEX_NODE_* inputs (an env file read as data, and the environment), run preflight, then run start once. scripts/bootstrap.sh runs this after installing the agent; the agent's image runs it as aks-flex-node-bootstrap."
    )]
    BootstrapNode {
        /// A bootstrap.env file of AKS_FLEX_NODE_* lines (read as data, never evaluated)
        #[arg(long, value_name = "FILE")]
        env_file: Option<PathBuf>,
        /// Render and validate what the bootstrap would write (secrets redacted) and change
        /// nothing on the host: no config written, no preflight, no start
        #[arg(long)]
        dry_run: bool,
        /// With --dry-run: write the files under DIR (at their host paths below it, secrets
        /// included) instead of printing them
        #[arg(long, value_name = "DIR", requires = "dry_run")]
        output_dir: Option<PathBuf>,
    },
    /// Write a node's Ignition config for the agent's image: a base config (Butane or
    /// Ignition), the agent's provisioning and the bootstrap arguments (docs/ignition.md)
    #[command(
        long_about = "Write a node's Ignition config for Azure Container Linux: the base config (Butane, flatcar variant, or Ignition 3.0.0-3.4.0 JSON) merged with the agent's provisioning (image/agent-container.bu, the agent image filled in) and the bootstrap arguments, AKS_FLEX_NODE_*=VALUE assignments after --, which go to /etc/aks-flex-node/bootstrap.env (0600) and are removed by the first-boot unit once the bootstrap succeeded. The arguments are checked with the bootstrap's own parser and renderer; the output is created with mode 0600 and never replaces a file. docs/ignition.md."
    )]
    Ignition(IgnitionArgs),
    /// MachineOperations run on this node, without a cluster
    #[command(subcommand)]
    Operation(OperationCommand),
    /// Repave this node to its other machine side with the goal it has applied, at a new
    /// settings version, without a cluster (root only)
    #[command(
        long_about = "Repave this node blue/green to its other machine side (kube1 <-> kube2) with the goal it has applied (the daemon state's Kubernetes version), at a new settings version (--settings-version, or local-<unix seconds>), without a cluster: the daemon's own repave, journaled in /etc/aks-flex-node/repave-state.json. It holds the node's work lock (/run/aks-flex-node/work.lock) as the daemon does around its work, so the two never run side by side; it waits --wait seconds for the daemon to finish what it is doing. Refused, changing nothing, on a settings version in the wrong format, a node never bootstrapped, the applied settings version, or a repave already in progress (the daemon finishes that at its start). In a cluster the daemon's next reconcile repaves back to the cluster's goal."
    )]
    Repave(RepaveArgs),
    /// Recover the agent after its unit failed (run by aks-flex-node-recovery.service)
    #[command(
        long_about = "Recover the agent after its unit failed: roll back an AgentUpgrade whose new agent did not start (to the last good binary or image), finish the upgrade as Failed/DaemonFailed, reset the unit's failed state and start limit, and restart it. systemd runs this from aks-flex-node-recovery.service (the agent unit's OnFailure=)."
    )]
    Recover,
    /// Diagnostics for the agent's image (name resolution, TLS); not for people
    #[command(hide = true, subcommand)]
    Debug(DebugCommand),
    /// Wait for a detached containerd task and exit with its status, relaying its output from
    /// standard input (run by the agent's container unit; not for people)
    #[command(hide = true)]
    WaitTask(WaitTaskArgs),
    /// Run by host systemd around a machine's start (not for people)
    #[command(hide = true)]
    NspawnLifecycle {
        /// `pre-start` or `post-start`
        #[arg(value_parser = ["pre-start", "post-start"])]
        hook: String,
        /// The machine: kube1 or kube2
        machine: String,
    },
}

/// `token` subcommands.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print a Microsoft Entra ID token for the API server as an ExecCredential (kubelet's exec
    /// credential plugin)
    #[command(
        long_about = "Print a Microsoft Entra ID token for the API server as a Kubernetes ExecCredential on stdout: the exec credential plugin kubelet and the daemon run for a service principal or managed identity. The request comes from KUBERNETES_EXEC_INFO, the credential from AAD_LOGIN_METHOD (spn: AAD_SERVICE_PRINCIPAL_CLIENT_ID, AAD_SERVICE_PRINCIPAL_CLIENT_SECRET or a file named by AAD_SERVICE_PRINCIPAL_CLIENT_SECRET_FILE, AZURE_TENANT_ID; msi: AZURE_CLIENT_ID for a user-assigned identity). AZURE_AUTHORITY_HOST and AKS_FLEX_NODE_IMDS_ENDPOINT override the endpoints."
    )]
    Kubelogin(KubeloginArgs),
    /// Answer kubelet's image credential provider request for Azure Container Registry (the
    /// exec plugin of --image-credential-provider-config)
    #[command(
        long_about = "Read a CredentialProviderRequest (credentialprovider.kubelet.k8s.io/v1 or v1beta1) on stdin and print the CredentialProviderResponse: for an image on *.azurecr.io, *.azurecr.cn, *.azurecr.us or a --registry, ACR's refresh token for the node's Azure identity (exchanged at https://<registry>/oauth2/exchange) as the password of ACR's null user, cached by registry for as long as the token is reused; for any other image, no credentials. The identity comes from the environment token kubelogin reads (AAD_LOGIN_METHOD spn or msi, with their variables)."
    )]
    Acr(AcrArgs),
}

/// `token acr` flags.
#[derive(Debug, Args)]
pub struct AcrArgs {
    /// Another registry (host[:port]) served by ACR's exchange, beyond *.azurecr.io, *.azurecr.cn
    /// and *.azurecr.us (repeatable)
    #[arg(long = "registry", value_name = "HOST[:PORT]")]
    pub registries: Vec<String>,
    /// The Resource Manager endpoint whose audience the Entra ID token is for (default: the
    /// public cloud's)
    #[arg(long, value_name = "URL", default_value = "")]
    pub resource_manager_endpoint: String,
}

/// `token acr`: logs (warnings and worse) on stderr, the response on stdout.
async fn run_acr(a: AcrArgs) -> anyhow::Result<()> {
    use crate::flows::credential_provider::{REQUEST_LIMIT, respond};
    use crate::goalclient::azure;
    use std::io::Read as _;
    crate::logging::init("warning", None);
    let mut input = Vec::new();
    std::io::stdin()
        .take(REQUEST_LIMIT as u64 + 1)
        .read_to_end(&mut input)
        .context("read the request from stdin")?;
    if input.len() > REQUEST_LIMIT {
        anyhow::bail!("the request on stdin is larger than {REQUEST_LIMIT} bytes");
    }
    let env = azure::with_secret_file(azure::process_env(), &flex_host::fs::HostFs::host())?;
    let insecure = match env.get(flex_host::http::INSECURE_REGISTRIES_ENV) {
        Some(v) => {
            flex_host::http::InsecureRegistries::parse(flex_host::http::INSECURE_REGISTRIES_ENV, v)?
        }
        None => flex_host::http::InsecureRegistries::none(),
    };
    for (i, r) in a.registries.iter().enumerate() {
        flex_host::http::InsecureRegistries::from_entries(&format!("--registry[{i}]"), [r])?;
    }
    let exchange = std::sync::Arc::new(flex_oci::AcrExchange::new(
        flex_host::http::client()?,
        crate::goalclient::acr::kubelogin_identity(env, &a.resource_manager_endpoint),
        &a.registries,
        insecure,
    ));
    print!("{}", respond(&input, &exchange).await?);
    Ok(())
}

/// `token kubelogin` flags.
#[derive(Debug, Args)]
pub struct KubeloginArgs {
    /// Microsoft Entra ID application id of the API server (the token's audience)
    #[arg(long, value_name = "ID", default_value = crate::flows::token::DEFAULT_SERVER_ID)]
    pub server_id: String,
    /// Ask for a proof-of-possession token (not supported: fails)
    #[arg(long)]
    pub pop_enabled: bool,
    /// Proof-of-possession claims, k=v,... (not supported)
    #[arg(long, value_name = "CLAIMS")]
    pub pop_claims: Option<String>,
}

/// `token kubelogin`: logs (warnings and worse) on stderr, the credential on stdout.
async fn run_kubelogin(a: KubeloginArgs) -> anyhow::Result<()> {
    use crate::flows::token;
    use crate::goalclient::azure;
    crate::logging::init("warning", None);
    let options = token::KubeloginOptions {
        server_id: a.server_id,
        pop_enabled: a.pop_enabled,
        pop_claims: a.pop_claims.unwrap_or_default(),
    };
    token::check_options(&options)?;
    let env = azure::with_secret_file(azure::process_env(), &flex_host::fs::HostFs::host())?;
    let credential = azure::from_kubelogin_env(&env)?;
    print!("{}", token::kubelogin(&options, &env, &credential).await?);
    Ok(())
}

/// `operation` subcommands.
#[derive(Debug, Subcommand)]
pub enum OperationCommand {
    /// Run one MachineOperation (NodeReboot, AgentReset, AgentUpgrade) node-locally through the
    /// daemon's handler, and print the result as the operation's status would record it
    Run {
        /// Operation kind
        kind: String,
        /// Parameter, repeatable (`--param image=...`)
        #[arg(long = "param", value_name = "KEY=VALUE")]
        params: Vec<String>,
        /// Path to configuration JSON file
        #[arg(long, value_name = "PATH", default_value = config::DEFAULT_CONFIG_PATH)]
        config: PathBuf,
    },
    /// Print the last AgentUpgrade's record (it finishes after the agent's restart); `status`
    /// shows it with the rest of the node's health
    Status,
}

async fn run_operation(cmd: OperationCommand) -> anyhow::Result<()> {
    let (kind, params, config_path) = match cmd {
        OperationCommand::Run {
            kind,
            params,
            config,
        } => (kind, params, config),
        OperationCommand::Status => {
            let host = Host::real().await?;
            let Some(r) = crate::flows::upgrade::Upgrader::new(host).record() else {
                anyhow::bail!(
                    "no AgentUpgrade recorded in {}",
                    crate::flows::upgrade::RECORD_PATH
                );
            };
            print!("{}", crate::flows::upgrade::flow::render_record(&r));
            return Ok(());
        }
    };
    require_root("operation run")?;
    let kind = flex_api::machina::OperationKind::parse(&kind);
    let params = crate::flows::operations::parse_params(&params)?;
    let host = Host::real().await?;
    if let Err(f) = crate::flows::operations::decide::admit(&kind, &params, host.containerized()) {
        let r = f.into_result();
        print!("{}", crate::flows::operations::render_result(&r));
        anyhow::bail!("{}: {}", r.reason, r.message);
    }
    let loaded = load_config(&config_path)?;
    crate::logging::init(&loaded.config.agent.log_level, None);
    let node = std::sync::Arc::new(crate::machine::node::NodeMachines::new(
        host.clone(),
        loaded.config.clone(),
        crate::goalclient::acr::identity_or_warn,
    )?);
    let handlers = crate::flows::operations::HostHandlers::new(host.clone(), node).with_upgrader(
        crate::flows::upgrade::Upgrader::for_host(host.clone(), Some(&loaded.config)).await,
    );
    let executed =
        crate::flows::operations::run_local(&kind, &params, &handlers, host.containerized()).await;
    // The daemon serves the count (an AgentUpgrade's is added by the agent that finishes it).
    if let Some(r) = executed.result() {
        crate::flows::operations::tally::TallyStore::new(host.fs.clone()).count_logged(&kind, r);
    }
    print!("{}", crate::flows::operations::render_executed(&executed));
    match executed.result() {
        Some(r) if !r.succeeded() => anyhow::bail!("{}: {}", r.reason, r.message),
        _ => Ok(()),
    }
}

/// `repave`: [`crate::flows::repave::local`] over the real machines.
async fn run_repave(a: RepaveArgs) -> anyhow::Result<()> {
    use crate::flows::repave::{Stores, local};
    require_root("repave")?;
    if let Some(v) = &a.settings_version {
        local::check_settings_version(v)?;
    }
    let loaded = load_config(&a.config)?;
    crate::logging::init(&loaded.config.agent.log_level, None);
    log_loaded(&loaded);
    let host = Host::real().await?;
    let node = crate::machine::node::NodeMachines::new(
        host.clone(),
        loaded.config.clone(),
        crate::goalclient::acr::identity_or_warn,
    )?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let req = local::Request {
        settings_version: a.settings_version,
        wait: std::time::Duration::from_secs(a.wait),
        poll: std::time::Duration::from_secs(1),
    };
    let done = local::request(&node, &Stores::new(host.fs.clone()), &host.fs, &req, now).await?;
    print!("{}", local::render(&done));
    Ok(())
}

/// Hidden diagnostics, used by the image tests to prove the binary works inside its image.
#[derive(Debug, Subcommand)]
pub enum DebugCommand {
    /// Resolve a host name and print its addresses, one per line
    Resolve {
        /// Host name
        name: String,
    },
    /// Stop and remove one machine (kube1 or kube2): CleanupMachine, as repave does for the
    /// old side
    CleanupMachine {
        /// kube1 or kube2
        machine: String,
    },
    /// The daemon's credential store on a scratch root (the faults group's window 4): `save`
    /// writes a new self-signed pair for --node through the store's save, `load` prints the
    /// fingerprint of the pair it loads (exit 1 when none is usable); never the host's root
    CredentialStore {
        /// `save` or `load`
        #[arg(value_parser = ["save", "load"])]
        action: String,
        /// The scratch root the store's paths are under (not `/`)
        #[arg(long, value_name = "DIR")]
        root: PathBuf,
        /// The node the certificate names
        #[arg(long, value_name = "NAME")]
        node: String,
    },
    /// Ask the host's systemd for its version over D-Bus from this process (as the daemon
    /// talks to systemd), and print it (`cargo xtask selinux repro`)
    DbusSystemd,
    /// Write under a host path as the agent does: in a directory, a temporary file written,
    /// synced, renamed into place, read back and removed; a file is opened for appending and
    /// nothing written (`cargo xtask selinux repro`)
    WriteProbe {
        /// The directory or file
        path: PathBuf,
    },
    /// GET an https URL (system CA store, or --ca) and print the HTTP status
    HttpsGet {
        /// URL
        url: String,
        /// Extra CA certificate (PEM) to trust
        #[arg(long)]
        ca: Option<PathBuf>,
    },
}

/// The name `debug write-probe` writes in a directory (its temporary file adds `.tmp`).
pub const WRITE_PROBE_NAME: &str = ".aks-flex-selinux-probe";

/// `debug write-probe`: in a directory, writes [`WRITE_PROBE_NAME`]`.tmp`, syncs it, renames
/// it to [`WRITE_PROBE_NAME`], reads it back and removes it (the agent's atomic write); a file
/// is opened for appending with nothing written. Says what it did.
pub fn write_probe(path: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Write;
    let meta = std::fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
    if !meta.is_dir() {
        std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .with_context(|| format!("open {} for appending", path.display()))?;
        return Ok(format!("opened {} for appending", path.display()));
    }
    let tmp = path.join(format!("{WRITE_PROBE_NAME}.tmp"));
    let dest = path.join(WRITE_PROBE_NAME);
    let body = b"aks-flex-node write probe\n";
    {
        let mut f =
            std::fs::File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
        f.write_all(body)
            .with_context(|| format!("write {}", tmp.display()))?;
        f.sync_all()
            .with_context(|| format!("sync {}", tmp.display()))?;
    }
    std::fs::rename(&tmp, &dest)
        .with_context(|| format!("rename {} to {}", tmp.display(), dest.display()))?;
    let back = std::fs::read(&dest).with_context(|| format!("read {}", dest.display()))?;
    std::fs::remove_file(&dest).with_context(|| format!("remove {}", dest.display()))?;
    if back != body {
        anyhow::bail!(
            "{} read back {} bytes, not what was written",
            dest.display(),
            back.len()
        );
    }
    Ok(format!(
        "wrote, renamed, read and removed {}",
        dest.display()
    ))
}

async fn run_debug(cmd: DebugCommand) -> anyhow::Result<()> {
    match cmd {
        DebugCommand::Resolve { name } => {
            let addrs = tokio::net::lookup_host((name.as_str(), 0))
                .await
                .with_context(|| format!("resolve {name}"))?;
            for a in addrs {
                println!("{}", a.ip());
            }
            Ok(())
        }
        DebugCommand::CleanupMachine { machine } => {
            require_root("debug cleanup-machine")?;
            if !crate::machine::nspawn::MACHINES.contains(&machine.as_str()) {
                anyhow::bail!("unknown nspawn machine {machine:?}");
            }
            crate::logging::init("info", None);
            let host = Host::real().await?;
            let t = crate::machine::nspawn::Timings::default();
            crate::machine::nspawn::stop_node(&host, &machine, t).await?;
            crate::machine::nspawn::cleanup_machine(&host, &machine, t).await?;
            host.systemd.daemon_reload().await?;
            Ok(())
        }
        DebugCommand::CredentialStore { action, root, node } => {
            use crate::kubeclient::scratch;
            if action == "save" {
                println!("saved {}", scratch::save(&root, &node)?);
                return Ok(());
            }
            match scratch::load(&root, &node)? {
                Some(fp) => {
                    println!("loaded {fp}");
                    Ok(())
                }
                None => anyhow::bail!(
                    "no usable key and certificate for {node} under {}",
                    root.display()
                ),
            }
        }
        DebugCommand::DbusSystemd => {
            let version = crate::entrypoint::check_dbus().await?;
            println!("systemd {version}");
            Ok(())
        }
        DebugCommand::WriteProbe { path } => {
            println!("{}", write_probe(&path)?);
            Ok(())
        }
        DebugCommand::HttpsGet { url, ca } => {
            flex_host::http::install_crypto();
            let mut b = reqwest::Client::builder();
            if let Some(ca) = ca {
                let pem = std::fs::read(&ca).with_context(|| format!("read {}", ca.display()))?;
                b = b.tls_certs_merge([reqwest::Certificate::from_pem(&pem)?]);
            }
            let resp = b
                .build()?
                .get(&url)
                .send()
                .await
                .with_context(|| format!("GET {url}"))?;
            println!("{}", resp.status().as_u16());
            Ok(())
        }
    }
}

/// `aks-flex-node-bootstrap` (in the agent's image): what `bootstrap.sh --use-installed-agent`
/// does, from `/etc/aks-flex-node/bootstrap.env`.
pub fn bootstrap_main(args: Vec<std::ffi::OsString>) -> ExitCode {
    let mut argv = vec![
        std::ffi::OsString::from("aks-flex-node"),
        "bootstrap-node".into(),
    ];
    if args.is_empty() {
        argv.push("--env-file".into());
        argv.push(crate::flows::bootstrap::BOOTSTRAP_ENV_PATH.into());
    }
    argv.extend(args);
    main_with_args(argv)
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
    if let Command::WaitTask(a) = &cli.command {
        return wait_task_main(a);
    }
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

/// `wait-task`: on a single-threaded runtime (it stays resident for the daemon's life), the
/// task's exit status as the exit code ([`crate::flows::task_wait`]).
fn wait_task_main(a: &WaitTaskArgs) -> ExitCode {
    use crate::flows::task_wait;
    crate::logging::init("info", None);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("wait-task: start async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        let api = crate::machine::containerd::tasks::GrpcTasks::new(&a.address, &a.namespace);
        let (sig_tx, mut sig_rx) = tokio::sync::mpsc::channel(4);
        let forward = tokio::spawn(forward_signals(sig_tx));
        let (exit_tx, exit_rx) = tokio::sync::oneshot::channel();
        let relay = stdin_fifo().map(|fd| {
            tokio::spawn(async move {
                let mut out = std::io::stdout();
                task_wait::relay(fd, &mut out, exit_rx).await
            })
        });
        // The unit is `Type=notify`: ready once the task runs (a no-op outside systemd).
        let ready = || {
            if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
                tracing::warn!(error = %e, "sd_notify READY failed");
            }
        };
        let status =
            task_wait::wait_forwarding(&api, &a.id, task_wait::WAIT_BACKOFF, &ready, &mut sig_rx)
                .await;
        let _ = exit_tx.send(());
        if let Some(r) = relay {
            match r.await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "relaying the task's output"),
                Err(e) => tracing::warn!(error = %e, "the output relay stopped"),
            }
        }
        forward.abort();
        status
    });
    match result {
        Ok(status) => {
            if status != 0 {
                tracing::info!(task = %a.id, exit_status = status, "the task exited");
            }
            ExitCode::from(task_wait::exit_code(status))
        }
        Err(e) => {
            eprintln!("wait-task: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Sends SIGTERM (15) and SIGINT (2) as they arrive, until the receiver is gone.
async fn forward_signals(tx: tokio::sync::mpsc::Sender<u32>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot listen for SIGTERM/SIGINT: they will not reach the task");
        return;
    };
    loop {
        let sig = tokio::select! {
            _ = term.recv() => 15,
            _ = int.recv() => 2,
        };
        if tx.send(sig).await.is_err() {
            return;
        }
    }
}

/// Standard input when it is a FIFO or a pipe (the unit's handle on the task's output), to
/// relay; `None` otherwise (nothing to relay).
fn stdin_fifo() -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::AsFd;
    let stdin = std::io::stdin();
    let fd = stdin.as_fd();
    let st = rustix::fs::fstat(fd).ok()?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Fifo {
        return None;
    }
    fd.try_clone_to_owned().ok()
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
        Command::Status(a) => {
            let format = OutputFormat::parse(&a.output)?;
            let mut host = Host::real().await?;
            if let Some(root) = a.root {
                host.fs = flex_host::fs::HostFs::new(root);
            }
            let report = crate::flows::status::status(&host).await;
            match format {
                OutputFormat::Text => print!("{}", crate::flows::status::render_text(&report)),
                OutputFormat::Json => print!("{}", crate::flows::status::render_json(&report)),
            }
            if report.healthy {
                Ok(())
            } else {
                let reasons: Vec<String> = report
                    .problems
                    .iter()
                    .map(|p| format!("{}: {}", p.code, p.message))
                    .collect();
                anyhow::bail!("node not healthy: {}", reasons.join("; "))
            }
        }
        Command::Preflight(a) => {
            let format = OutputFormat::parse(&a.output)?;
            let loaded = load_config(&a.config)?;
            let cfg = &loaded.config;
            crate::logging::init(&cfg.agent.log_level, None);
            log_loaded(&loaded);
            let host = Host::real().await?;
            let machines = crate::machine::node::NodeMachines::new(
                host.clone(),
                cfg.clone(),
                crate::goalclient::acr::identity_or_warn,
            )?;
            let results = preflight::run_checks(&host, cfg, &machines).await;
            let report = preflight::build_report(results, &a.ignore_preflight_errors);
            match format {
                OutputFormat::Text => print!("{}", preflight::render_text(&report)),
                OutputFormat::Json => print!("{}", preflight::render_json(&report)),
            }
            preflight::verdict(&report, a.fail_on_warnings).map_err(anyhow::Error::from)
        }
        Command::Start(a) => {
            require_root("start")?;
            let loaded = load_config(&a.config)?;
            let cfg = &loaded.config;
            crate::logging::init(&cfg.agent.log_level, Some(Path::new(&cfg.agent.log_dir)));
            log_loaded(&loaded);
            let host = Host::real().await?;
            let registry = crate::flows::start::registry_for(cfg).await;
            let machines = crate::machine::node::NodeMachines::new(
                host.clone(),
                cfg.clone(),
                crate::goalclient::acr::identity_or_warn,
            )?;
            crate::flows::start::run_start(&host, cfg, registry.as_ref(), &machines).await?;
            print!("{}", crate::flows::start::START_SUCCESS);
            Ok(())
        }
        Command::Daemon(a) => {
            require_root("daemon")?;
            let loaded = load_config(&a.config)?;
            let cfg = &loaded.config;
            crate::logging::init(&cfg.agent.log_level, Some(Path::new(&cfg.agent.log_dir)));
            log_loaded(&loaded);
            let shutdown = crate::flows::daemon::shutdown_on_signals()?;
            crate::flows::daemon::run(cfg, shutdown).await
        }
        Command::Token(TokenCommand::Kubelogin(a)) => run_kubelogin(a).await,
        Command::Token(TokenCommand::Acr(a)) => run_acr(a).await,
        Command::Debug(d) => run_debug(d).await,
        Command::Operation(o) => run_operation(o).await,
        Command::Repave(a) => run_repave(a).await,
        Command::Ignition(a) => run_ignition(&a),
        Command::Recover => {
            require_root("recover")?;
            crate::logging::init("info", None);
            let host = Host::real().await?;
            let action = crate::flows::upgrade::Upgrader::for_host(host, None)
                .await
                .recover()
                .await?;
            tracing::info!(?action, "recovery done");
            Ok(())
        }
        Command::BootstrapNode {
            env_file,
            dry_run: true,
            output_dir,
        } => bootstrap_dry_run(env_file.as_deref(), output_dir.as_deref()),
        Command::BootstrapNode { env_file, .. } => {
            let host = Host::real().await?;
            let cfg_for_probe = config::Config::default();
            let machines = crate::machine::node::NodeMachines::new(
                host.clone(),
                cfg_for_probe,
                crate::goalclient::acr::identity_or_warn,
            )?;
            let starter = crate::flows::bootstrap::RunStart {
                node: &MachinesForConfig(host.clone()),
            };
            crate::flows::bootstrap::main_entry(
                env_file.as_deref(),
                std::env::vars_os(),
                &host,
                &machines,
                &starter,
            )
            .await
            .map(|_| ())
        }
        // Dispatched before the runtime is built (main_with_args), on a runtime of its own.
        Command::WaitTask(_) => anyhow::bail!("wait-task runs from main_with_args only"),
        Command::NspawnLifecycle { hook, machine } => {
            crate::logging::init("info", None);
            if hook == "pre-start" {
                let host = Host::real().await?;
                crate::machine::lifecycle::pre_start(
                    &host,
                    &machine,
                    Path::new(config::DEFAULT_CONFIG_PATH),
                )
                .await
            } else {
                crate::machine::lifecycle::post_start(&machine).await
            }
        }
        Command::Reset => {
            require_root("reset")?;
            crate::logging::init("info", None);
            let host = Host::real().await?;
            crate::systemd::uninstall_service(&host.fs, host.systemd.as_ref())
                .await
                .context("uninstall-service")?;
            crate::flows::reset::reset_node(&host, crate::machine::nspawn::Timings::default())
                .await?;
            Ok(())
        }
    }
}

/// `ignition`: reads the base config, renders (every check first), then creates the output
/// (0600, never replacing a file). A failure writes nothing. Nothing is logged: the output and
/// the arguments carry the bootstrap token.
fn run_ignition(a: &IgnitionArgs) -> anyhow::Result<()> {
    let spec: flex_ignition::SpecVersion =
        a.spec.parse().map_err(|e| anyhow::anyhow!("--spec: {e}"))?;
    if a.output.symlink_metadata().is_ok() {
        anyhow::bail!(
            "output {}: it exists; remove it or choose another path (it is never replaced)",
            a.output.display()
        );
    }
    let base = std::fs::read_to_string(&a.base_config)
        .map_err(|e| anyhow::anyhow!("read the base config {}: {e}", a.base_config.display()))?;
    let mut bootstrap_args = match &a.args_file {
        Some(f) => ignition_args_file(f)?,
        None => Vec::new(),
    };
    for secret in crate::flows::bootstrap::INPUTS.iter().filter(|i| i.secret) {
        if a.bootstrap_args
            .iter()
            .any(|arg| arg.split_once('=').is_some_and(|(k, _)| k == secret.name))
        {
            eprintln!(
                "warning: {} on the command line is visible to every user of this machine (the process list) and stays in the shell's history; give it in a file with --args-file FILE, or on standard input with --args-file -",
                secret.name
            );
        }
    }
    bootstrap_args.extend(a.bootstrap_args.iter().cloned());
    let json = crate::flows::ignition::render(&crate::flows::ignition::Request {
        base_config: &base,
        files_dir: a.files_dir.as_deref(),
        image: flex_ignition::node::AgentImage {
            reference: a.image.clone(),
            plain_http: a.plain_http,
            insecure_registries: a.insecure_registry.clone(),
        },
        bootstrap_args: &bootstrap_args,
        spec,
    })
    .map_err(|e| match e {
        crate::flows::ignition::IgnitionCmdError::Base(_) => {
            anyhow::anyhow!("{}: {e}", a.base_config.display())
        }
        e => anyhow::anyhow!(e),
    })?;
    flex_host::fs::write_new(&a.output, json.as_bytes(), 0o600)?;
    println!(
        "wrote {} (mode 0600; it carries the bootstrap inputs)",
        a.output.display()
    );
    Ok(())
}

/// `ignition --args-file`: the assignments of `f` (`-`: standard input), read as bootstrap.env
/// is (at most [`crate::config::MAX_CONFIG_BYTES`]), as `KEY=VALUE` arguments in file order. No
/// error shows a value.
fn ignition_args_file(f: &Path) -> anyhow::Result<Vec<String>> {
    use std::io::Read as _;
    let shown = if f == Path::new("-") {
        "standard input".to_string()
    } else {
        f.display().to_string()
    };
    let limit = crate::config::MAX_CONFIG_BYTES;
    let mut bytes = Vec::new();
    let read = if f == Path::new("-") {
        std::io::stdin()
            .lock()
            .take(limit + 1)
            .read_to_end(&mut bytes)
    } else {
        std::fs::File::open(f).and_then(|file| file.take(limit + 1).read_to_end(&mut bytes))
    };
    read.map_err(|e| anyhow::anyhow!("--args-file: read {shown}: {e}"))?;
    anyhow::ensure!(
        bytes.len() as u64 <= limit,
        "--args-file: {shown} is larger than {limit} bytes"
    );
    let text = String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("--args-file: {shown} is not UTF-8 text"))?;
    let entries = flex_api::bootstrap_env::parse(&text)
        .map_err(|e| anyhow::anyhow!("--args-file {shown}: {e}"))?;
    Ok(entries
        .into_iter()
        .map(|e| format!("{}={}", e.key, e.value))
        .collect())
}

/// `bootstrap-node --dry-run`: reads the inputs, renders and validates what the bootstrap would
/// write, and prints it (or writes it under `output_dir`). Only reads the host: the env file,
/// `AKS_FLEX_NODE_CONFIG`'s file, the hostname, `/etc/resolv.conf`, which optional devices
/// exist and whether the node is bootstrapped.
fn bootstrap_dry_run(env_file: Option<&Path>, output_dir: Option<&Path>) -> anyhow::Result<()> {
    use crate::flows::bootstrap::{Inputs, dry_run};
    let inputs = Inputs::load(env_file, std::env::vars_os())?;
    let level = match inputs.log_level.trim() {
        "" => "info",
        l => l,
    };
    crate::logging::init(level, None);
    let config_file = match &inputs.config {
        Some(p) => Some(std::fs::read(p).with_context(|| {
            format!(
                "{}: read {}",
                crate::flows::bootstrap::inputs::CONFIG,
                p.display()
            )
        })?),
        None => None,
    };
    let fs = flex_host::fs::HostFs::host();
    let info = RealHostInfo;
    let facts = crate::machine::lifecycle::host_facts_from(&info, &fs)?;
    let resolv = fs
        .read(Path::new("/etc/resolv.conf"))
        .ok()
        .flatten()
        .unwrap_or_default();
    let plan = dry_run::plan(
        &inputs,
        config_file.as_deref(),
        &facts,
        info.containerized(),
        &resolv,
    )?;
    if let Some(note) = dry_run::progress_note(crate::flows::start::progress_in(&fs)) {
        print!("{note}");
    }
    match output_dir {
        None => print!("{}", dry_run::show(&plan)),
        Some(dir) => {
            let written = dry_run::write_under(&plan, dir)?;
            println!(
                "[dry-run] the config from {}: valid; wrote {} files under {} (nothing on this host was changed; preflight and start did not run)",
                plan.source,
                written.len(),
                dir.display()
            );
            for p in written {
                println!("{}", p.display());
            }
        }
    }
    Ok(())
}

/// Builds the machine layer for the config `start` is given (the bootstrap renders the config
/// first).
struct MachinesForConfig(Host);

#[async_trait::async_trait]
impl crate::flows::start::NodeStarter for MachinesForConfig {
    async fn start_node(
        &self,
        host: &Host,
        cfg: &config::Config,
        machine: &str,
    ) -> Result<(), crate::machine::seams::SeamError> {
        // The machines are built from the configuration (its insecure registries) and the
        // running binary: the same inputs fail the same way.
        crate::machine::node::NodeMachines::new(
            self.0.clone(),
            cfg.clone(),
            crate::goalclient::acr::identity_or_warn,
        )
        .map_err(crate::machine::seams::SeamError::permanent)?
        .start_node(host, cfg, machine)
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real files in a temporary directory: the probe leaves nothing behind in a directory,
    /// leaves a file's bytes unchanged, and fails on a path that is not there.
    #[test]
    fn write_probe_on_real_files() {
        let dir = tempfile::tempdir().unwrap();
        let said = write_probe(dir.path()).unwrap();
        assert!(said.contains(WRITE_PROBE_NAME), "{said}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let file = dir.path().join("fstab");
        std::fs::write(&file, "x\n").unwrap();
        assert!(write_probe(&file).unwrap().contains("appending"));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "x\n");
        let err = write_probe(&dir.path().join("absent")).unwrap_err();
        assert!(format!("{err:#}").contains("stat"), "{err:#}");
    }

    /// A read-only directory (not as root, which ignores modes): the probe fails naming the
    /// file it could not create.
    #[test]
    fn write_probe_fails_where_it_cannot_write() {
        if rustix::process::geteuid().is_root() {
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
        let err = write_probe(dir.path()).unwrap_err();
        assert!(format!("{err:#}").contains("create"), "{err:#}");
    }
}
