//! The command line (upstream's flags, Go syntax: `--flag=value`, Go durations and booleans)
//! and the run: the HTTP server and, with `--enable-csr-approver`, the CSR approver, stopped
//! together on shutdown or when either ends; their errors are joined.

use std::sync::Arc;
use std::time::Duration;

use clap::{ArgAction, Parser};
use tokio_util::sync::CancellationToken;

use crate::csr::{self, ApproverConfig};
use crate::metrics::{ControllerMetrics, TimedStore};
use crate::server::Server;
use crate::store::{ConfigMapStore, MachineStore};

/// `aks-flex-controller`'s flags.
#[derive(Clone, Debug, PartialEq, Eq, Parser)]
#[command(
    name = "aks-flex-controller",
    about = "Run the AKS Flex in-cluster machine endpoint",
    version
)]
pub struct Args {
    /// Address the HTTP server listens on (`:8080` = every interface).
    #[arg(long, default_value = ":8080")]
    pub listen_address: String,
    /// How long shutdown waits for requests in flight (Go duration).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,
    /// kubeconfig path; empty = the in-cluster config (then the default kubeconfig).
    #[arg(long, default_value = "")]
    pub kubeconfig: String,
    /// Namespace of the machine ConfigMap.
    #[arg(long, default_value = "kube-system")]
    pub machine_configmap_namespace: String,
    /// Name of the machine ConfigMap.
    #[arg(long, default_value = "aks-flex-machines")]
    pub machine_configmap_name: String,
    /// Approve the agent daemon's client-certificate CSRs.
    #[arg(long, default_value = "false", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", action = ArgAction::Set, value_parser = parse_go_bool)]
    pub enable_csr_approver: bool,
    /// The bootstrap token group allowed to request daemon credentials.
    #[arg(long, default_value = "system:bootstrappers:aks-flex-node")]
    pub bootstrap_group: String,
    /// The group daemon certificates carry.
    #[arg(long, default_value = "aks-flex-node-daemons")]
    pub daemon_group: String,
    /// Longest certificate lifetime approved, in seconds (default 30 days; 0 = no limit, which
    /// lets the signer's default of one year apply). A negative value is refused: it would
    /// read as no limit.
    #[arg(long, default_value_t = crate::csr::DEFAULT_MAX_EXPIRATION_SECONDS,
          value_parser = clap::value_parser!(i32).range(0..))]
    pub max_expiration_seconds: i32,
    /// Where `/metrics` is served: IP:PORT, :PORT (every interface), or 0 for none.
    #[arg(long, default_value = DEFAULT_METRICS_BIND_ADDRESS, value_parser = parse_metrics_address)]
    pub metrics_bind_address: String,
}

/// Where `/metrics` is served by default: every interface (Prometheus scrapes the pod), on a
/// port of its own so the machine endpoint and the metrics can be exposed apart.
pub const DEFAULT_METRICS_BIND_ADDRESS: &str = ":9470";

fn parse_metrics_address(s: &str) -> Result<String, flex_metrics::AddressError> {
    flex_metrics::parse_address(s).map(|_| s.to_string())
}

fn parse_duration(s: &str) -> Result<Duration, flex_api::duration::DurationError> {
    flex_api::duration::parse_go_duration(s)
}

/// A flag value Go's `strconv.ParseBool` refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid boolean value {0:?}")]
pub struct InvalidBool(pub String);

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(s: &str) -> Result<bool, InvalidBool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(InvalidBool(s.to_string())),
    }
}

impl Args {
    /// The approver's settings.
    pub fn approver(&self) -> ApproverConfig {
        ApproverConfig {
            bootstrap_group: self.bootstrap_group.clone(),
            daemon_group: self.daemon_group.clone(),
            max_expiration_seconds: self.max_expiration_seconds,
        }
    }
}

/// The Kubernetes client: `--kubeconfig`, else the in-cluster config, else the default
/// kubeconfig.
pub async fn kube_client(kubeconfig: &str) -> anyhow::Result<kube::Client> {
    flex_host::http::install_crypto();
    let config = if kubeconfig.is_empty() {
        match kube::Config::incluster() {
            Ok(c) => c,
            Err(in_cluster) => {
                tracing::warn!(error = %in_cluster, "no in-cluster config; trying the default kubeconfig");
                kube::Config::from_kubeconfig(&Default::default())
                    .await
                    .map_err(|e| {
                        anyhow::anyhow!(
                            "no Kubernetes config: in-cluster: {in_cluster}; kubeconfig: {e}"
                        )
                    })?
            }
        }
    } else {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig)
            .map_err(|e| anyhow::anyhow!("read kubeconfig {kubeconfig}: {e}"))?;
        kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| anyhow::anyhow!("kubeconfig {kubeconfig}: {e}"))?
    };
    let mut config = config;
    // Each machine request reads the ConfigMap once and answers 503 on failure (the agent
    // retries); kube's own retry of 429/503/504 would hold the request up instead.
    config.default_retry = false;
    kube::Client::try_from(config).map_err(|e| anyhow::anyhow!("build Kubernetes client: {e}"))
}

/// Runs the controller against the cluster until `shutdown`.
pub async fn run(args: Args, shutdown: CancellationToken) -> anyhow::Result<()> {
    tracing::info!(
        listen_address = %args.listen_address,
        machine_configmap_namespace = %args.machine_configmap_namespace,
        machine_configmap_name = %args.machine_configmap_name,
        "starting aks-flex-controller"
    );
    let client = kube_client(&args.kubeconfig).await?;
    let store: Arc<dyn MachineStore> = Arc::new(ConfigMapStore::new(
        client.clone(),
        &args.machine_configmap_namespace,
        &args.machine_configmap_name,
    ));
    let metrics = Arc::new(ControllerMetrics::default());
    // Checked when the flags were parsed.
    if let Ok(listen) = flex_metrics::parse_address(&args.metrics_bind_address) {
        flex_metrics::spawn(
            "controller",
            &listen,
            metrics.renderer(),
            flex_metrics::Limits::default(),
            shutdown.clone(),
        )
        .await;
    }
    let server = Server::bind(&args.listen_address).await?;
    run_with(&args, server, store, Some(client), metrics, shutdown).await
}

/// Runs a bound server over `store` (and the approver over `client` when enabled) until
/// `shutdown` or until either stops.
pub async fn run_with(
    args: &Args,
    server: Server,
    store: Arc<dyn MachineStore>,
    client: Option<kube::Client>,
    metrics: Arc<ControllerMetrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    tracing::info!(address = %server.local_addr()?, "machine endpoint listening");
    let store: Arc<dyn MachineStore> = Arc::new(TimedStore::new(store, metrics.clone()));
    let stop = shutdown.child_token();
    // With a cluster, unready until the daemons' admission policies are seen enforced; without
    // one (a local run over a memory store) there is nothing to check.
    let ready = Arc::new(match &client {
        Some(_) => crate::policy::Readiness::not_ready(
            "the daemons' admission policies are not checked yet",
        ),
        None => crate::policy::Readiness::default(),
    });
    // Whether kube-controller-manager would approve the flex tokens' kubelet certificates is
    // checked with the approver off too: then the cluster's own approval is all there is.
    let approver_group = Some(args.bootstrap_group.clone());
    let policy_task = {
        let stop = stop.clone();
        let ready = ready.clone();
        let client = client.clone();
        async move {
            if let Some(c) = client {
                let group = approver_group.as_deref();
                crate::policy::watch(&crate::policy::KubePolicyApi(c), &ready, group, stop).await;
            }
        }
    };
    let server_task = {
        let stop = stop.clone();
        let store = store.clone();
        let metrics = metrics.clone();
        let timeout = args.shutdown_timeout;
        async move {
            let r = server
                .run(store, metrics, ready, stop.clone(), timeout)
                .await;
            stop.cancel();
            r
        }
    };
    let approver_task = {
        let stop = stop.clone();
        let enabled = args.enable_csr_approver;
        let cfg = args.approver();
        async move {
            if !enabled {
                return Ok(());
            }
            let r = match client {
                Some(c) => csr::run(c, store, cfg, metrics, stop.clone()).await,
                None => Err(anyhow::anyhow!(
                    "the CSR approver needs a Kubernetes client"
                )),
            };
            stop.cancel();
            r
        }
    };
    let (served, approved, ()) = tokio::join!(server_task, approver_task, policy_task);
    let errors: Vec<String> = [served.err(), approved.err()]
        .into_iter()
        .flatten()
        .map(|e| format!("{e:#}"))
        .collect();
    if errors.is_empty() {
        tracing::info!("aks-flex-controller stopped");
        Ok(())
    } else {
        Err(anyhow::anyhow!(errors.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_upstreams_with_a_30_day_lifetime_cap() {
        let a = Args::try_parse_from(["aks-flex-controller"]).unwrap();
        assert_eq!(
            a,
            Args {
                listen_address: ":8080".into(),
                shutdown_timeout: Duration::from_secs(15),
                kubeconfig: String::new(),
                machine_configmap_namespace: "kube-system".into(),
                machine_configmap_name: "aks-flex-machines".into(),
                enable_csr_approver: false,
                bootstrap_group: "system:bootstrappers:aks-flex-node".into(),
                daemon_group: "aks-flex-node-daemons".into(),
                max_expiration_seconds: 30 * 24 * 3600,
                metrics_bind_address: ":9470".into(),
            }
        );
    }

    #[test]
    fn go_style_flags_parse() {
        let a = Args::try_parse_from([
            "aks-flex-controller",
            "--listen-address=127.0.0.1:9090",
            "--shutdown-timeout=1m30s",
            "--enable-csr-approver=false",
            "--max-expiration-seconds=3600",
        ])
        .unwrap();
        assert_eq!(a.listen_address, "127.0.0.1:9090");
        assert_eq!(a.shutdown_timeout, Duration::from_secs(90));
        assert!(!a.enable_csr_approver);
        assert_eq!(a.approver().max_expiration_seconds, 3600);
        for on in [
            vec!["x", "--enable-csr-approver"],
            vec!["x", "--enable-csr-approver=true"],
            vec!["x", "--enable-csr-approver=1"],
        ] {
            assert!(Args::try_parse_from(on).unwrap().enable_csr_approver);
        }
        assert!(Args::try_parse_from(["x", "--enable-csr-approver=yes"]).is_err());
        // A negative lifetime cap would lift the cap: refused, naming the flag.
        let e = Args::try_parse_from(["x", "--max-expiration-seconds=-1"]).unwrap_err();
        assert!(e.to_string().contains("--max-expiration-seconds"), "{e}");
        assert_eq!(
            Args::try_parse_from(["x", "--max-expiration-seconds=0"])
                .unwrap()
                .max_expiration_seconds,
            0
        );
        assert!(Args::try_parse_from(["x", "--shutdown-timeout=15"]).is_err());
    }

    #[test]
    fn a_metrics_address_that_does_not_parse_is_refused_naming_the_flag() {
        for ok in ["0", ":9470", "127.0.0.1:9470", "[::1]:9470"] {
            let a = Args::try_parse_from(["x", &format!("--metrics-bind-address={ok}")]).unwrap();
            assert_eq!(a.metrics_bind_address, ok);
        }
        let e = Args::try_parse_from(["x", "--metrics-bind-address=metrics.local:9470"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--metrics-bind-address"), "{e}");
        assert!(e.contains("names are not resolved"), "{e}");
    }
}
