//! A real Prometheus for the checks: Debian's `prometheus`, started by the harness on
//! `127.0.0.1` with its own config and storage under `<work>/prometheus`, in the background with
//! `start-stop-daemon` (as the registry is), scraping every second the targets it is given: the
//! VM's daemon through an ssh forward of its loopback-only metrics port ([`DaemonForward`]).
//! The checks ask its HTTP API ([`Prometheus::query`]) what it scraped, as an operator's
//! dashboard or alert would. `down` stops it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use flex_host::runner::{Cmd, Runner};

use crate::ssh::Ssh;

/// Where Debian installs it.
pub const BINARY: &str = "/usr/bin/prometheus";

/// The daemon's metrics port in the guest (`agent.metricsAddress`' default, loopback there).
pub const DAEMON_METRICS_PORT: u16 = 9469;

/// How often it scrapes.
pub const SCRAPE_INTERVAL: Duration = Duration::from_secs(1);

/// How long it has to answer `/-/ready` after its start.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// One scrape job.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Target {
    /// The job's name (the `job` label).
    pub job: String,
    /// `host:port`.
    pub address: String,
}

/// A Prometheus the harness started.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Prometheus {
    /// Its loopback port.
    pub port: u16,
    /// Its directory (config, data, log, pid file, this record).
    pub dir: PathBuf,
    /// What it scrapes.
    pub targets: Vec<Target>,
}

/// One sample of a query's answer (an instant vector's element).
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Its labels, `__name__` included.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// `<work>/prometheus`.
pub fn dir(work: &Path) -> PathBuf {
    work.join("prometheus")
}

impl Prometheus {
    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn pidfile(dir: &Path) -> PathBuf {
        dir.join("prometheus.pid")
    }

    fn record(dir: &Path) -> PathBuf {
        dir.join("prometheus.json")
    }

    /// Its log.
    pub fn log(&self) -> PathBuf {
        self.dir.join("prometheus.log")
    }

    /// The one [`start`] recorded in `dir`, if any.
    pub fn load(dir: &Path) -> anyhow::Result<Option<Self>> {
        match std::fs::read(Self::record(dir)) {
            Ok(b) => Ok(Some(serde_json::from_slice(&b).map_err(|e| {
                anyhow::anyhow!("{}: {e}", Self::record(dir).display())
            })?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(anyhow::anyhow!("{}: {e}", Self::record(dir).display())),
        }
    }

    /// Runs the PromQL `query` now; the samples of its instant vector.
    pub async fn query(&self, query: &str) -> anyhow::Result<Vec<Sample>> {
        flex_host::http::install_crypto();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?;
        let url = url::Url::parse_with_params(
            &format!("{}/api/v1/query", self.url()),
            &[("query", query)],
        )?;
        let body = http
            .get(url)
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("Prometheus query {query:?}: {e}"))?
            .text()
            .await
            .map_err(|e| anyhow::anyhow!("Prometheus query {query:?}: {e}"))?;
        parse_query(&body).map_err(|e| anyhow::anyhow!("Prometheus query {query:?}: {e}"))
    }

    /// Polls `query` every second until `done` holds for its samples; returns them. A timeout
    /// names what was waited for and the last answer.
    pub async fn wait_for(
        &self,
        what: &str,
        query: &str,
        timeout: Duration,
        done: impl Fn(&[Sample]) -> bool,
    ) -> anyhow::Result<Vec<Sample>> {
        let done = &done;
        flex_host::retry::wait_until(what, timeout, Duration::from_secs(1), || async move {
            match self.query(query).await {
                Ok(s) if done(&s) => Ok(s),
                Ok(s) => Err(format!("{query} answers {}", render_samples(&s))),
                Err(e) => Err(format!("{e:#}")),
            }
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
    }
}

/// The samples as `{labels} value`, `[]` for none (for messages).
pub fn render_samples(s: &[Sample]) -> String {
    if s.is_empty() {
        return "[]".into();
    }
    s.iter()
        .map(|s| {
            let labels: Vec<String> = s
                .labels
                .iter()
                .filter(|(k, _)| k.as_str() != "__name__")
                .map(|(k, v)| format!("{k}={v:?}"))
                .collect();
            format!("{{{}}} {}", labels.join(","), s.value)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Prometheus' config: every target scraped each [`SCRAPE_INTERVAL`], over plain HTTP.
pub fn render_config(targets: &[Target]) -> String {
    let secs = SCRAPE_INTERVAL.as_secs();
    let mut c = format!(
        "global:\n  scrape_interval: {secs}s\n  scrape_timeout: {secs}s\nscrape_configs:\n"
    );
    for t in targets {
        c.push_str(&format!(
            "  - job_name: {:?}\n    static_configs:\n      - targets: [{:?}]\n",
            t.job, t.address
        ));
    }
    c
}

/// The samples of a `/api/v1/query` answer whose result is an instant vector; an error answer
/// is an error with Prometheus' own words.
pub fn parse_query(body: &str) -> anyhow::Result<Vec<Sample>> {
    #[derive(serde::Deserialize)]
    struct Answer {
        status: String,
        #[serde(default)]
        error: String,
        #[serde(default)]
        data: Option<Data>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Data {
        result_type: String,
        result: Vec<Element>,
    }
    #[derive(serde::Deserialize)]
    struct Element {
        metric: BTreeMap<String, String>,
        value: (f64, String),
    }
    let a: Answer = serde_json::from_str(body)
        .map_err(|e| anyhow::anyhow!("not an API answer ({e}): {body:.200}"))?;
    if a.status != "success" {
        anyhow::bail!("status {}: {}", a.status, a.error);
    }
    let data = a
        .data
        .ok_or_else(|| anyhow::anyhow!("no data in {body:.200}"))?;
    if data.result_type != "vector" {
        anyhow::bail!("result type {}, not vector", data.result_type);
    }
    data.result
        .into_iter()
        .map(|e| {
            let value = e
                .value
                .1
                .parse::<f64>()
                .map_err(|err| anyhow::anyhow!("value {:?}: {err}", e.value.1))?;
            Ok(Sample {
                labels: e.metric,
                value,
            })
        })
        .collect()
}

/// Starts Prometheus in `dir` (storage starts empty) scraping `targets`, and waits until it is
/// ready. Any Prometheus recorded there is stopped first.
pub async fn start(r: &dyn Runner, dir: &Path, targets: Vec<Target>) -> anyhow::Result<Prometheus> {
    if r.which("prometheus").is_none() {
        anyhow::bail!("prometheus is not installed: apt-get install prometheus");
    }
    stop_dir(r, dir).await?;
    let _ = std::fs::remove_dir_all(dir.join("data"));
    std::fs::create_dir_all(dir.join("data"))?;
    let p = Prometheus {
        port: crate::registry::free_port()?,
        dir: dir.to_path_buf(),
        targets,
    };
    let config = dir.join("prometheus.yml");
    std::fs::write(&config, render_config(&p.targets))?;
    std::fs::write(Prometheus::record(dir), serde_json::to_vec_pretty(&p)?)?;
    r.run(
        &Cmd::new("start-stop-daemon")
            .args(["--start", "--background", "--make-pidfile", "--pidfile"])
            .arg(Prometheus::pidfile(dir).display().to_string())
            .arg("--output")
            .arg(p.log().display().to_string())
            .args(["--exec", BINARY, "--"])
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{}", p.port))
            .arg("--storage.tsdb.retention.time=1d"),
    )
    .await?;
    flex_host::http::install_crypto();
    let ready_url = format!("{}/-/ready", p.url());
    let ready = flex_host::retry::wait_until(
        "Prometheus to be ready",
        READY_TIMEOUT,
        Duration::from_millis(200),
        || async {
            match reqwest::get(&ready_url).await {
                Ok(a) if a.status().is_success() => Ok(()),
                Ok(a) => Err(format!("{ready_url}: {}", a.status())),
                Err(e) => Err(format!("{ready_url}: {e}")),
            }
        },
    )
    .await;
    if let Err(e) = ready {
        let log = crate::vm::tail(&p.log(), 20);
        let _ = stop_dir(r, dir).await;
        anyhow::bail!("{e}; its log:\n{log}");
    }
    Ok(p)
}

/// Stops the Prometheus running from `dir`, if any (TERM, then KILL), and forgets it.
pub async fn stop_dir(r: &dyn Runner, dir: &Path) -> anyhow::Result<()> {
    let pidfile = Prometheus::pidfile(dir);
    if pidfile.exists() {
        let out = r
            .output(&crate::registry::stop_daemon_cmd(&pidfile))
            .await?;
        // Exit 1: nothing was running.
        if !(out.success() || out.code == Some(1)) {
            anyhow::bail!("stop prometheus: {}", out.stderr.trim());
        }
    }
    let _ = std::fs::remove_file(Prometheus::record(dir));
    Ok(())
}

/// The ssh forward from a loopback port of this host to the daemon's metrics port in the
/// guest, which listens on the guest's loopback only (a snapshot restore or a VM reboot drops
/// it; [`DaemonForward::ensure`] starts it again).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonForward {
    /// The forwarding ssh's control socket.
    pub socket: PathBuf,
    /// The loopback port.
    pub port: u16,
}

impl DaemonForward {
    /// The forward for the Prometheus in `dir` on `port`.
    pub fn new(dir: &Path, port: u16) -> Self {
        Self {
            socket: dir.join("daemon-forward.sock"),
            port,
        }
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts it unless it runs; returns whether it started it.
    pub async fn ensure(&self, r: &dyn Runner, ssh: &Ssh) -> anyhow::Result<bool> {
        ssh.ensure_forward(r, &self.socket, "127.0.0.1", self.port, DAEMON_METRICS_PORT)
            .await
            .map_err(|e| anyhow::anyhow!("the daemon metrics forward ({}): {e}", self.address()))
    }

    /// Ends it (nothing when it does not run).
    pub async fn stop(&self, r: &dyn Runner) {
        let _ = r.output(&Ssh::control_cmd(&self.socket, "exit")).await;
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// `down`'s part: stops the Prometheus and the forward the checks may have left in `work`.
pub async fn down(r: &dyn Runner, work: &Path) -> anyhow::Result<()> {
    let d = dir(work);
    if !d.exists() {
        return Ok(());
    }
    DaemonForward::new(&d, 0).stop(r).await;
    stop_dir(r, &d).await?;
    let _ = std::fs::remove_dir_all(&d);
    Ok(())
}

#[cfg(test)]
mod tests;
