//! [`Upgrader`]: the I/O of an upgrade, driven by the pure decisions in [`flex_api::upgrade`]. Every
//! side effect goes through the host's seams ([`Host`]: runner, files, systemd) and, in the
//! container, the image store ([`Images`]).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::layout::{LIB_DIR, Layout, Slot};
use super::{
    CHECK_TIMEOUT, IMAGE_AGENT_BINARY, RECORD_PATH, RECOVERY_RESTART_DELAY, RESTART_ACCURACY,
    RESTART_DELAY,
};
use crate::flows::operations::tally::TallyStore;
use crate::flows::operations::{EXECUTION_FAILED, OperationResult, UpgradeRequest};
use crate::machine::containerd::{Images, PullOptions};
use crate::state::JsonStore;
use crate::systemd::{AGENT_IMAGE_ENV, AGENT_UNIT, CONTAINER_SETTINGS};
use flex_api::upgrade::{
    Mode, OperationRef, Recorded, RecoveryAction, Resumed, Selection, Stage, UpgradeRecord, Write,
};
use flex_host::context::Host;
use flex_host::runner::Cmd;
use flex_host::systemd::TransientTimer;

/// The environment variable through which the agent's container unit tells the agent which
/// image it runs.
pub const RUNNING_IMAGE_ENV: &str = "AKS_FLEX_NODE_IMAGE";
/// `agent-image.env`'s key for the last image that proved itself.
pub const LAST_GOOD_IMAGE_KEY: &str = "AKS_FLEX_NODE_LAST_GOOD_IMAGE";

/// How [`Upgrader::start`] ended when it did not fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Started {
    /// The candidate is selected and the restart onto it scheduled; the message is for the
    /// status. The operation finishes when the restarted agent proves itself.
    HandedOff(String),
    /// Nothing to do: the requested agent is the one selected.
    AlreadyCurrent(String),
}

/// Why an upgrade step failed (the operation finishes `Failed`/`ExecutionFailed` with it).
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// Another upgrade has not finished.
    #[error("an upgrade to {candidate} is in flight (stage {stage:?}); wait until it finishes")]
    InFlight {
        /// Its candidate.
        candidate: String,
        /// Its stage.
        stage: Stage,
    },
    /// The selected agent has not proven itself (`current` ≠ `last-good`): the candidate would
    /// replace the last good agent.
    #[error(transparent)]
    Unproven(#[from] flex_api::upgrade::Unproven),
    /// A step failed.
    #[error("{step}: {message}")]
    Step {
        /// What was being done.
        step: &'static str,
        /// Why it failed.
        message: String,
    },
}

fn step(step: &'static str) -> impl Fn(String) -> UpgradeError {
    move |message| UpgradeError::Step { step, message }
}

/// The restart timer: `systemctl restart aks-flex-node-agent.service` from a transient timer
/// firing `delay` after it is started, with `AccuracySec=100ms` (the default of a minute fires
/// it up to a minute late). `id` makes its unit name unique.
pub fn restart_timer(delay: Duration, id: u64) -> TransientTimer {
    TransientTimer {
        name: format!("{}{id}", flex_api::status::RESTART_UNIT_PREFIX),
        description: "Restart the AKS Flex Node agent".into(),
        on_active: delay,
        accuracy: RESTART_ACCURACY,
        command: vec![
            "/usr/bin/systemctl".into(),
            "restart".into(),
            AGENT_UNIT.into(),
        ],
    }
}

/// The clock (injectable for tests).
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// Carries out upgrades and recovery on one host.
#[derive(Clone)]
pub struct Upgrader {
    host: Host,
    images: Option<Arc<dyn Images>>,
    http: Option<reqwest::Client>,
    clock: Clock,
}

impl Upgrader {
    /// An upgrader on `host`; give it an image store with [`Self::with_images`] in the
    /// container.
    pub fn new(host: Host) -> Self {
        Self {
            host,
            images: None,
            http: None,
            clock: Arc::new(Timestamp::now),
        }
    }

    /// The upgrader for the real `host`: in the agent's container, with the host's containerd
    /// as its image store ([`crate::machine::containerd::host_images`]), whose registry client
    /// has `config`'s registry credentials ([`crate::machine::registry_auth`]; without a config,
    /// as for `recover`, which pulls nothing, it is anonymous). Credentials that cannot be set up
    /// are a warning: the daemon keeps running, and a pull that needs them fails naming the
    /// registry.
    pub async fn for_host(host: Host, config: Option<&crate::config::Config>) -> Self {
        let containerized = host.containerized();
        let runner = host.runner.clone();
        let credentials = match (containerized, config, flex_host::http::client()) {
            (true, Some(config), Ok(http)) => {
                let insecure = config.bootstrap.insecure_registries().unwrap_or_default();
                match crate::machine::registry_auth::credential_source(
                    config,
                    &host.fs,
                    &http,
                    &insecure,
                    crate::goalclient::acr::identity_or_warn(config),
                ) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "AgentUpgrade pulls: no registry credentials");
                        None
                    }
                }
            }
            _ => None,
        };
        let u = Self::new(host);
        if containerized {
            u.with_images(crate::machine::containerd::host_images(runner, credentials).await)
        } else {
            u
        }
    }

    /// The image store (the agent's container).
    pub fn with_images(mut self, images: Arc<dyn Images>) -> Self {
        self.images = Some(images);
        self
    }

    /// The HTTP client for downloads (default: [`flex_host::http::client`]).
    pub fn with_http(mut self, http: reqwest::Client) -> Self {
        self.http = Some(http);
        self
    }

    /// Another clock.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    fn mode(&self) -> Mode {
        if self.host.containerized() {
            Mode::Image
        } else {
            Mode::Binary
        }
    }

    fn store(&self) -> JsonStore<UpgradeRecord> {
        JsonStore::at(self.host.fs.clone(), RECORD_PATH)
    }

    fn layout(&self) -> Layout {
        Layout::new(self.host.fs.clone())
    }

    fn now(&self) -> Timestamp {
        let t = (self.clock)();
        Timestamp::from_second(t.as_second()).unwrap_or(t)
    }

    /// The upgrade record, if any (a record that cannot be read is logged and counts as none).
    pub fn record(&self) -> Option<UpgradeRecord> {
        self.loaded().ok().flatten()
    }

    /// The upgrade record as read: `Err` when there is one that cannot be read (logged).
    fn loaded(&self) -> Result<Option<UpgradeRecord>, ()> {
        self.store().load().map_err(|e| {
            tracing::warn!(error = %e, path = RECORD_PATH, "upgrade record unreadable");
        })
    }

    /// What is selected now: `current` and `last-good` (slots on a host, images in the
    /// container); `None` where it cannot be read (logged).
    pub fn selection(&self) -> (Option<String>, Option<String>) {
        match self.mode() {
            Mode::Binary => {
                let layout = self.layout();
                let read = |what: &str, r: Result<Option<Slot>, super::layout::LayoutError>| match r
                {
                    Ok(s) => s.map(|s| s.name().to_string()),
                    Err(e) => {
                        tracing::warn!(link = what, error = %e, "cannot read the binary layout");
                        None
                    }
                };
                (
                    read("current", layout.current()),
                    read("last-good", layout.last_good()),
                )
            }
            Mode::Image => {
                let (install, selected) = self.selected_images();
                let mut env = self.read_env_file(AGENT_IMAGE_ENV);
                let last_good = if env.contains_key(RUNNING_IMAGE_ENV) {
                    env.remove(LAST_GOOD_IMAGE_KEY).filter(|v| !v.is_empty())
                } else {
                    // No upgrade ever selected an image: the install's runs and is the good one.
                    install
                };
                (selected, last_good)
            }
        }
    }

    /// Makes `writes` in order (each atomic by itself; see [`flex_api::upgrade::Write`]).
    fn apply(&self, mode: Mode, writes: &[Write]) -> Result<(), UpgradeError> {
        for w in writes {
            match (w, mode) {
                (Write::Record(r), _) => self.save(r)?,
                (Write::Current(x) | Write::LastGood(x), Mode::Binary) => {
                    let slot = Slot::parse(x)
                        .ok_or_else(|| step("select the agent")(format!("{x:?} is not a slot")))?;
                    let layout = self.layout();
                    let done = if matches!(w, Write::Current(_)) {
                        layout.switch(slot)
                    } else {
                        layout.mark_good(slot)
                    };
                    done.map_err(|e| step("select the agent")(e.to_string()))?;
                }
                (Write::Current(x), Mode::Image) => {
                    let (_, last_good) = self.selection();
                    self.write_image_env(x, last_good.as_deref().unwrap_or(x))?;
                }
                (Write::LastGood(x), Mode::Image) => {
                    let (current, _) = self.selection();
                    self.write_image_env(current.as_deref().unwrap_or(x), x)?;
                }
            }
        }
        Ok(())
    }

    /// Refuses a new upgrade while the selected agent has not proven itself: the candidate
    /// would take the last good agent's place ([`flex_api::upgrade::may_upgrade`]).
    fn check_proven(&self) -> Result<(), UpgradeError> {
        let (current, last_good) = self.selection();
        flex_api::upgrade::may_upgrade(Selection {
            current: current.as_deref(),
            last_good: last_good.as_deref(),
        })?;
        Ok(())
    }

    fn save(&self, r: &UpgradeRecord) -> Result<(), UpgradeError> {
        self.store()
            .save(r)
            .map_err(|e| step("record the upgrade")(e.to_string()))?;
        flex_host::fault::point(&format!("upgrade.phase:{}", stage_name(r.stage)));
        Ok(())
    }

    /// Saves `r` finished with `result`, logging a failure to save (the result is also
    /// returned to the caller).
    fn finish(&self, r: &mut UpgradeRecord, result: OperationResult) {
        r.finish(result);
        if let Err(e) = self.save(r) {
            tracing::error!(error = %e, "could not record the end of the upgrade");
        }
    }

    /// A node-local upgrade (`rec` has no MachineOperation) that finished with `result` after
    /// its handoff is added to the node-local tally ([`crate::flows::operations::tally`]); one
    /// from the cluster is counted when its status is reported.
    fn count_local(&self, rec: &UpgradeRecord, result: &OperationResult) {
        if rec.operation.is_none() {
            TallyStore::new(self.host.fs.clone())
                .count_logged(&flex_api::machina::OperationKind::AgentUpgrade, result);
        }
    }

    /// Starts an upgrade for `request` (for the MachineOperation `op`, or node-locally): fetch,
    /// check, switch, schedule the restart. See [`crate::flows::upgrade`].
    pub async fn start(
        &self,
        request: &UpgradeRequest,
        op: Option<OperationRef>,
    ) -> Result<Started, UpgradeError> {
        if let Some(r) = self.record().filter(|r| r.stage != Stage::Finished) {
            return Err(UpgradeError::InFlight {
                candidate: r.candidate,
                stage: r.stage,
            });
        }
        match (request, self.mode()) {
            (UpgradeRequest::Download { url, sha256 }, Mode::Binary) => {
                self.start_binary(url, sha256, op).await
            }
            (UpgradeRequest::Image(image), Mode::Image) => self.start_image(image, op).await,
            (UpgradeRequest::Image(_), Mode::Binary) => Err(step("validate")(
                "parameter \"image\" needs the agent to run in its container image".into(),
            )),
            (UpgradeRequest::Download { .. }, Mode::Image) => Err(step("validate")(
                "parameter \"downloadURL\" upgrades an agent installed on the host".into(),
            )),
        }
    }

    fn new_record(
        &self,
        op: Option<OperationRef>,
        previous: &str,
        candidate: &str,
    ) -> UpgradeRecord {
        UpgradeRecord {
            version: 1,
            operation: op,
            mode: self.mode(),
            previous: previous.into(),
            candidate: candidate.into(),
            candidate_version: None,
            stage: Stage::Staged,
            started_at: crate::flows::operations::decide::format_time(&self.now()),
            recovery_restarts: 0,
            remove_candidate_on_rollback: false,
            result: None,
        }
    }

    async fn start_binary(
        &self,
        url: &str,
        sha256: &str,
        op: Option<OperationRef>,
    ) -> Result<Started, UpgradeError> {
        let layout = self.layout();
        let running = crate::machine::lifecycle::current_exe().ok();
        layout
            .converge(running.as_deref())
            .map_err(|e| step("converge the binary layout")(e.to_string()))?;
        let current = layout
            .current()
            .map_err(|e| step("read the binary layout")(e.to_string()))?
            .ok_or_else(|| step("read the binary layout")("no current slot".into()))?;
        // The candidate goes into the other slot: never while that one is last-good.
        self.check_proven()?;
        let candidate = current.other();
        let mut rec = self.new_record(op, current.name(), candidate.name());
        self.save(&rec)?;
        match self.stage_binary(url, sha256, candidate).await {
            Ok(version) => rec.candidate_version = version,
            Err(e) => {
                self.finish(
                    &mut rec,
                    OperationResult::failed(EXECUTION_FAILED, e.to_string()),
                );
                return Err(e);
            }
        }
        rec.stage = Stage::Switched;
        self.save(&rec)?;
        let switched = layout
            .switch(candidate)
            .map_err(|e| step("switch current")(e.to_string()));
        let scheduled = match switched {
            Ok(()) => {
                flex_host::fault::point("upgrade.after-switch");
                self.schedule_restart(RESTART_DELAY).await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = scheduled {
            let _ = layout.switch(current);
            self.finish(
                &mut rec,
                OperationResult::failed(EXECUTION_FAILED, e.to_string()),
            );
            return Err(e);
        }
        let msg = format!(
            "switched to slot {}{}; the agent restarts on it in {}s",
            candidate.name(),
            version_note(&rec.candidate_version),
            RESTART_DELAY.as_secs()
        );
        tracing::info!(
            candidate = candidate.name(),
            "AgentUpgrade switched; restart scheduled"
        );
        Ok(Started::HandedOff(msg))
    }

    /// Downloads, verifies and installs the candidate into `slot`, then checks it runs;
    /// returns its version.
    async fn stage_binary(
        &self,
        url: &str,
        sha256: &str,
        slot: Slot,
    ) -> Result<Option<String>, UpgradeError> {
        let staging = Path::new(LIB_DIR).join(".staging");
        self.host
            .fs
            .create_dir_all(&staging)
            .map_err(|e| step("download")(e.to_string()))?;
        let dir = tempfile::Builder::new()
            .prefix("download-")
            .tempdir_in(self.host.fs.path(&staging))
            .map_err(|e| step("download")(e.to_string()))?;
        let file = dir.path().join("artifact");
        let http = match &self.http {
            Some(c) => c.clone(),
            None => flex_host::http::client().map_err(|e| step("download")(e.to_string()))?,
        };
        let redacted = flex_host::secret::redact_url(url);
        let got = crate::machine::components::download_to_file(
            &http,
            url,
            &file,
            &crate::machine::components::DOWNLOAD_RETRY,
            "agent",
        )
        .await
        .map_err(|e| step("download")(format!("{redacted}: {e}")))?;
        if !got.eq_ignore_ascii_case(sha256) {
            return Err(step("verify")(format!(
                "the SHA-256 of {redacted} is {got}, but the operation names {sha256}"
            )));
        }
        {
            let mut reader = open_agent_binary(&file).map_err(|e| step("unpack")(e.to_string()))?;
            self.layout()
                .install(slot, &mut reader)
                .map_err(|e| step("install")(e.to_string()))?;
        }
        let bin = self.host.fs.path(&Layout::slot_binary(slot));
        let out = self
            .host
            .runner
            .run(
                &Cmd::new(bin.display().to_string())
                    .arg("version")
                    .timeout(CHECK_TIMEOUT),
            )
            .await
            .map_err(|e| step("check the candidate")(e.to_string()))?;
        Ok(parse_version(&out.stdout))
    }

    fn read_env_file(&self, path: &str) -> BTreeMap<String, String> {
        match self.host.fs.read_to_string(Path::new(path)) {
            Ok(Some(text)) => match flex_api::bootstrap_env::parse(&text) {
                Ok(entries) => entries.into_iter().map(|e| (e.key, e.value)).collect(),
                Err(e) => {
                    tracing::warn!(path, error = %e, "settings file unreadable; ignoring it");
                    BTreeMap::new()
                }
            },
            Ok(None) => BTreeMap::new(),
            Err(e) => {
                tracing::warn!(path, error = %e, "settings file unreadable; ignoring it");
                BTreeMap::new()
            }
        }
    }

    /// The image the install names, and the one selected now (an upgrade's, or the install's).
    fn selected_images(&self) -> (Option<String>, Option<String>) {
        let install = self
            .read_env_file(CONTAINER_SETTINGS)
            .remove(RUNNING_IMAGE_ENV)
            .filter(|v| !v.is_empty());
        let selected = self
            .read_env_file(AGENT_IMAGE_ENV)
            .remove(RUNNING_IMAGE_ENV)
            .filter(|v| !v.is_empty())
            .or_else(|| install.clone());
        (install, selected)
    }

    fn write_image_env(&self, image: &str, last_good: &str) -> Result<(), UpgradeError> {
        let text = format!(
            "# Written by aks-flex-node (AgentUpgrade): the agent's image, and the last one that proved itself.\n{RUNNING_IMAGE_ENV}={image}\n{LAST_GOOD_IMAGE_KEY}={last_good}\n"
        );
        self.host
            .fs
            .write_atomic(Path::new(AGENT_IMAGE_ENV), text.as_bytes(), 0o644)
            .map_err(|e| step("select the image")(e.to_string()))
    }

    fn images(&self) -> Result<&Arc<dyn Images>, UpgradeError> {
        self.images
            .as_ref()
            .ok_or_else(|| step("pull")("no image store (containerd) configured".into()))
    }

    async fn start_image(
        &self,
        image: &str,
        op: Option<OperationRef>,
    ) -> Result<Started, UpgradeError> {
        let images = self.images()?.clone();
        let (install, selected) = self.selected_images();
        let Some(selected) = selected else {
            return Err(step("read the selected image")(format!(
                "neither {AGENT_IMAGE_ENV} nor {CONTAINER_SETTINGS} names {RUNNING_IMAGE_ENV}"
            )));
        };
        if selected == image {
            return Ok(Started::AlreadyCurrent(format!(
                "the agent already runs {image}"
            )));
        }
        // The switch records the selected image as last-good: never while it is unproven.
        self.check_proven()?;
        let mut rec = self.new_record(op, &selected, image);
        self.save(&rec)?;
        let staged = async {
            let existed = images
                .exists(image)
                .await
                .map_err(|e| step("look up the image")(e.to_string()))?;
            let settings = self
                .host
                .fs
                .read_to_string(Path::new(CONTAINER_SETTINGS))
                .ok()
                .flatten()
                .unwrap_or_default();
            let opts = PullOptions::from_settings(&settings).map_err(|e| {
                step("read the pull settings")(format!("{CONTAINER_SETTINGS}: {e}"))
            })?;
            images
                .pull(image, &opts)
                .await
                .map_err(|e| step("pull")(e.to_string()))?;
            let n = u32::try_from(self.now().as_second().rem_euclid(1_000_000)).unwrap_or(0);
            let out = images
                .run_check(
                    image,
                    n,
                    &[IMAGE_AGENT_BINARY.to_string(), "version".to_string()],
                    CHECK_TIMEOUT,
                )
                .await
                .map_err(|e| step("check the candidate")(e.to_string()))?;
            Ok::<_, UpgradeError>((existed, parse_version(&out)))
        }
        .await;
        match staged {
            Ok((existed, version)) => {
                rec.candidate_version = version;
                rec.remove_candidate_on_rollback = !existed && install.as_deref() != Some(image);
            }
            Err(e) => {
                self.finish(
                    &mut rec,
                    OperationResult::failed(EXECUTION_FAILED, e.to_string()),
                );
                return Err(e);
            }
        }
        rec.stage = Stage::Switched;
        self.save(&rec)?;
        let before = self.host.fs.read(Path::new(AGENT_IMAGE_ENV)).ok().flatten();
        let scheduled = match self.write_image_env(image, &selected) {
            Ok(()) => {
                flex_host::fault::point("upgrade.after-switch");
                self.schedule_restart(RESTART_DELAY).await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = scheduled {
            let restored = match before {
                Some(b) => self
                    .host
                    .fs
                    .write_atomic(Path::new(AGENT_IMAGE_ENV), &b, 0o644)
                    .map(|_| ()),
                None => self
                    .host
                    .fs
                    .remove_file(Path::new(AGENT_IMAGE_ENV))
                    .map(|_| ()),
            };
            if let Err(re) = restored {
                tracing::error!(error = %re, "could not restore {AGENT_IMAGE_ENV}");
            }
            self.finish(
                &mut rec,
                OperationResult::failed(EXECUTION_FAILED, e.to_string()),
            );
            return Err(e);
        }
        tracing::info!(candidate = image, previous = %selected, "AgentUpgrade switched; restart scheduled");
        Ok(Started::HandedOff(format!(
            "switched to {image}{}; the agent restarts on it in {}s",
            version_note(&rec.candidate_version),
            RESTART_DELAY.as_secs()
        )))
    }

    async fn schedule_restart(&self, delay: Duration) -> Result<(), UpgradeError> {
        let id = u64::try_from(self.now().as_millisecond()).unwrap_or(0);
        let timer = restart_timer(delay, id);
        self.host
            .systemd
            .start_transient_timer(&timer)
            .await
            .map_err(|e| step("schedule the restart")(e.to_string()))
    }

    /// What runs now: this process's slot (host) or image (container).
    pub fn running(&self) -> Option<String> {
        match self.mode() {
            Mode::Binary => crate::machine::lifecycle::current_exe()
                .ok()
                .and_then(|p| Layout::slot_of(&p))
                .map(|s| s.name().to_string()),
            Mode::Image => std::env::var(RUNNING_IMAGE_ENV)
                .ok()
                .filter(|v| !v.is_empty()),
        }
    }

    /// Converges the host's binary layout and the agent's and recovery units (skipped in the
    /// container, whose image and units come from the host's provisioning and `start`).
    /// `running` is this binary (a host path), which seeds a layout that does not exist yet.
    pub async fn converge_host(&self, running: Option<&Path>) -> anyhow::Result<()> {
        if self.host.containerized() {
            return Ok(());
        }
        let layout = self.layout().converge(running)?;
        if let super::layout::Converged::Built(how) = &layout {
            tracing::info!(how = %how, "agent binary layout converged");
        }
        let mut changed = false;
        for (path, text) in [
            (
                crate::systemd::AGENT_UNIT_PATH,
                crate::systemd::render_agent_unit(),
            ),
            (
                crate::systemd::RECOVERY_UNIT_PATH,
                crate::systemd::render_recovery_unit(),
            ),
        ] {
            changed |= self
                .host
                .fs
                .write_if_changed(Path::new(path), text.as_bytes(), 0o644)?;
        }
        if changed {
            tracing::info!("agent and recovery units converged");
            self.host.systemd.daemon_reload().await?;
        }
        Ok(())
    }

    /// At daemon start (before anything else): finishes an upgrade the restart cut short.
    /// Returns the record's result when it finished one. A candidate that started is not
    /// proven yet: it is after its first successful reconcile ([`Self::prove`]).
    pub fn on_daemon_start(&self, running: Option<&str>) -> Option<OperationResult> {
        let mut rec = self.record()?;
        match flex_api::upgrade::on_start(Some(&rec), running) {
            flex_api::upgrade::StartAction::Nothing => None,
            flex_api::upgrade::StartAction::AwaitProof => {
                tracing::info!(candidate = %rec.candidate, "the upgraded agent started; it becomes last-good after its first successful reconcile");
                None
            }
            flex_api::upgrade::StartAction::Finish(result) => {
                tracing::warn!(reason = %result.reason, message = %result.message, "AgentUpgrade finished at start");
                self.finish(&mut rec, result.clone());
                self.count_local(&rec, &result);
                Some(result)
            }
        }
    }

    /// Whether the daemon running `running` is an upgrade's candidate that has yet to prove
    /// itself ([`flex_api::upgrade::on_start`] answers [`flex_api::upgrade::StartAction::AwaitProof`]).
    pub fn awaits_proof(&self, running: Option<&str>) -> bool {
        flex_api::upgrade::on_start(self.record().as_ref(), running)
            == flex_api::upgrade::StartAction::AwaitProof
    }

    /// At the candidate's own proof deadline (`after`): why the daemon running `running` gives
    /// up, when the record still waits for its proof ([`flex_api::upgrade::on_prove_deadline`]).
    pub fn proof_overdue(&self, running: Option<&str>, after: Duration) -> Option<String> {
        flex_api::upgrade::on_prove_deadline(self.record().as_ref(), running, after.as_secs())
    }

    /// After the daemon's first successful reconcile: the running agent (`running`) has
    /// proven itself. Makes it last-good and finishes the upgrade that switched to it `Complete`
    /// ([`flex_api::upgrade::on_reconciled`]); idempotent. Returns the upgrade's result and its
    /// MachineOperation's name when it finished one.
    pub fn prove(
        &self,
        running: Option<&str>,
    ) -> Result<Option<(OperationResult, Option<String>)>, UpgradeError> {
        let rec = self.loaded().ok().flatten();
        let (current, last_good) = self.selection();
        let proof = flex_api::upgrade::on_reconciled(
            rec.as_ref(),
            Selection {
                current: current.as_deref(),
                last_good: last_good.as_deref(),
            },
            running,
        );
        if proof.writes.is_empty() {
            return Ok(None);
        }
        self.apply(rec.as_ref().map_or(self.mode(), |r| r.mode), &proof.writes)?;
        match proof.result {
            Some(result) => {
                tracing::info!(running = ?running, "the upgraded agent reconciled: it is last-good, AgentUpgrade complete");
                if let Some(r) = &rec {
                    self.count_local(r, &result);
                }
                let op = rec.and_then(|r| r.operation).map(|o| o.name);
                Ok(Some((result, op)))
            }
            None => {
                tracing::info!(running = ?running, previous_last_good = ?last_good, "the running agent reconciled: it is last-good");
                Ok(None)
            }
        }
    }

    /// How the AgentUpgrade `uid` ended, per the upgrade record.
    pub fn resume(&self, uid: &str) -> Resumed {
        flex_api::upgrade::resume(self.record().as_ref(), uid)
    }

    /// The recovery unit's work (`aks-flex-node recover`): see [`flex_api::upgrade::recovery`]. While the
    /// agent's unit is still stopping (recovery started by its stop guard), it looks again
    /// every [`super::RECOVERY_POLL`], for up to [`super::RECOVERY_STOP_WAIT`].
    pub async fn recover(&self) -> anyhow::Result<RecoveryAction> {
        let deadline = tokio::time::Instant::now() + super::RECOVERY_STOP_WAIT;
        loop {
            let action = self.recover_once().await?;
            if action != RecoveryAction::Wait {
                return Ok(action);
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    waited_s = super::RECOVERY_STOP_WAIT.as_secs(),
                    "the agent's unit is still stopping; leaving it to its restarts and OnFailure="
                );
                return Ok(action);
            }
            tokio::time::sleep(super::RECOVERY_POLL).await;
        }
    }

    /// One look at the record, the selection and the agent's unit, and what follows from it.
    async fn recover_once(&self) -> anyhow::Result<RecoveryAction> {
        let loaded = self.loaded();
        let recorded = match &loaded {
            Ok(Some(r)) => Recorded::Read(r),
            Ok(None) => Recorded::Missing,
            Err(()) => Recorded::Unreadable,
        };
        let (current, last_good) = self.selection();
        let unit = self.host.systemd.unit_state(AGENT_UNIT).await?;
        let action = flex_api::upgrade::recovery(
            recorded,
            Selection {
                current: current.as_deref(),
                last_good: last_good.as_deref(),
            },
            &flex_api::upgrade::AgentUnit {
                active_state: &unit.active_state,
                sub_state: &unit.sub_state,
                result: &unit.result,
                n_restarts: unit.n_restarts,
                exec_main_status: unit.exec_main_status,
            },
        );
        if action == RecoveryAction::Wait {
            tracing::debug!(unit = ?unit, "recovery: the agent's unit is still stopping");
        } else {
            tracing::info!(?action, unit = ?unit, current = ?current, last_good = ?last_good, "recovery");
        }
        let rec = loaded.ok().flatten();
        match (&action, rec) {
            (RecoveryAction::Nothing | RecoveryAction::Wait, _) => {}
            (RecoveryAction::Restart, _) => {
                self.reset_agent_unit().await?;
                self.schedule_restart(RECOVERY_RESTART_DELAY).await?;
            }
            (RecoveryAction::RetryCandidate, Some(r)) => {
                self.apply(r.mode, &flex_api::upgrade::retry_writes(&r))?;
                self.reset_agent_unit().await?;
                self.schedule_restart(RESTART_DELAY).await?;
            }
            (RecoveryAction::RollBack { message }, Some(r)) => {
                let mut message = message.clone();
                if let Some(tail) = self.journal_tail().await {
                    message.push_str(&format!("; its last log lines: {tail}"));
                }
                // Switch back first, then record it: a crash between leaves `previous` selected
                // and the record `switched`, which the next start finishes the same way.
                let writes = flex_api::upgrade::rollback_writes(&r, &message);
                let (switch, record) = writes.split_at(1);
                self.apply(r.mode, switch)?;
                match self.apply(r.mode, record) {
                    Err(e) => {
                        tracing::error!(error = %e, "could not record the end of the upgrade")
                    }
                    Ok(()) => {
                        if let Some(done) = self.record()
                            && let Some(result) = &done.result
                        {
                            self.count_local(&done, result);
                        }
                    }
                }
                if r.mode == Mode::Image && r.remove_candidate_on_rollback {
                    match self.images() {
                        Ok(images) => match images.remove(&r.candidate).await {
                            Ok(()) => {
                                tracing::info!(image = %r.candidate, "removed the broken image")
                            }
                            Err(e) => {
                                tracing::warn!(image = %r.candidate, error = %e, "could not remove the broken image")
                            }
                        },
                        Err(e) => tracing::warn!(error = %e, "could not remove the broken image"),
                    }
                }
                self.reset_agent_unit().await?;
                self.schedule_restart(RESTART_DELAY).await?;
            }
            (
                RecoveryAction::RollBackToLastGood {
                    from, to, message, ..
                },
                _,
            ) => {
                tracing::warn!(from = %from, to = %to, "{message}");
                let at = crate::flows::operations::decide::format_time(&self.now());
                let writes =
                    flex_api::upgrade::rollback_to_last_good_writes(&action, self.mode(), &at);
                let (switch, record) = writes.split_at(1);
                self.apply(self.mode(), switch)?;
                if let Err(e) = self.apply(self.mode(), record) {
                    tracing::error!(error = %e, "could not record the roll-back");
                }
                self.reset_agent_unit().await?;
                self.schedule_restart(RESTART_DELAY).await?;
            }
            (RecoveryAction::RetryCandidate | RecoveryAction::RollBack { .. }, None) => {}
        }
        Ok(action)
    }

    /// `systemctl reset-failed` of the agent's unit (which also resets its start limit), logged
    /// with [`super::START_LIMIT_RESET_LOG`].
    async fn reset_agent_unit(&self) -> Result<(), flex_host::systemd::SystemdError> {
        self.host.systemd.reset_failed(AGENT_UNIT).await?;
        tracing::info!(unit = AGENT_UNIT, "{}", super::START_LIMIT_RESET_LOG);
        Ok(())
    }

    /// The agent unit's last log lines (best effort, for the operation's message).
    async fn journal_tail(&self) -> Option<String> {
        let out = self
            .host
            .runner
            .output(
                &Cmd::new("journalctl")
                    .args(["-u", AGENT_UNIT, "-n", "3", "-o", "cat", "--no-pager"])
                    .timeout(Duration::from_secs(10)),
            )
            .await
            .ok()?;
        let lines: Vec<&str> = out
            .stdout
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        if lines.is_empty() {
            return None;
        }
        let mut s = lines.join(" | ");
        if s.len() > 600 {
            let mut cut = 600;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s.truncate(cut);
            s.push('…');
        }
        Some(s)
    }
}

/// A stage as the record and `operation status` spell it (also the fault points
/// `upgrade.phase:<stage>`, reached right after each save of the record).
fn stage_name(s: Stage) -> &'static str {
    match s {
        Stage::Staged => "staged",
        Stage::Switched => "switched",
        Stage::Finished => "finished",
    }
}

/// The record as `aks-flex-node operation status` prints it: YAML lines `stage`, `phase`,
/// `reason`, `message`, `candidate`, `previous` (and `operation` when it came from the
/// cluster).
pub fn render_record(r: &UpgradeRecord) -> String {
    use flex_api::machina::yaml_scalar;
    let stage = stage_name(r.stage);
    let (phase, reason, message) = match &r.result {
        Some(res) => (
            res.phase.to_string(),
            res.reason.clone(),
            res.message.clone(),
        ),
        None => (
            flex_api::machina::OperationPhase::InProgress.to_string(),
            if r.stage == Stage::Switched {
                super::RESTART_SCHEDULED.to_string()
            } else {
                "Staging".to_string()
            },
            format!("upgrading from {} to {}", r.previous, r.candidate),
        ),
    };
    let mut s = format!(
        "stage: {stage}\nphase: {phase}\nreason: {}\nmessage: {}\ncandidate: {}\nprevious: {}\nstartedAt: {}\n",
        yaml_scalar(&reason),
        yaml_scalar(&message),
        yaml_scalar(&r.candidate),
        yaml_scalar(&r.previous),
        yaml_scalar(&r.started_at),
    );
    if let Some(op) = &r.operation {
        s.push_str(&format!("operation: {}\n", yaml_scalar(&op.name)));
    }
    s
}

/// ` (version X)` when the candidate's version is known, else nothing.
fn version_note(version: &Option<String>) -> String {
    version
        .as_deref()
        .map(|v| format!(" (version {v})"))
        .unwrap_or_default()
}

/// The `Version:` line of `aks-flex-node version` output (upstream's format), else its first
/// line.
pub fn parse_version(out: &str) -> Option<String> {
    out.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Version:")
                .map(|v| v.trim().to_string())
        })
        .or_else(|| out.lines().next().map(|l| l.trim().to_string()))
        .filter(|v| !v.is_empty())
}

/// Why a downloaded artifact does not give the agent binary. The I/O error is in the message,
/// not a `source()`, so a `{:#}` chain names it once (see `flex_host::error`).
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// The downloaded file cannot be read.
    #[error("{0}")]
    Open(std::io::Error),
    /// The `.tar.gz` does not read (corrupt or truncated).
    #[error("read the archive: {0}")]
    Archive(std::io::Error),
    /// The binary's member does not read.
    #[error("read {}: {error}", .path.display())]
    Member {
        /// The member.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A `.tar.gz` without the binary.
    #[error("the archive has no {} file", super::layout::BINARY)]
    NoBinary,
    /// Neither an ELF binary nor a gzip stream.
    #[error("the download is neither an ELF binary nor a .tar.gz release archive")]
    UnknownFormat,
}

/// Opens the agent binary in a downloaded artifact: the file itself when it is an ELF binary,
/// else the `aks-flex-node` member of a `.tar.gz` (a release archive). Anything else is an
/// error naming what was expected.
pub fn open_agent_binary(file: &Path) -> Result<Box<dyn Read + Send>, ArtifactError> {
    let mut magic = [0u8; 4];
    let mut f = std::fs::File::open(file).map_err(ArtifactError::Open)?;
    let n = f.read(&mut magic).map_err(ArtifactError::Open)?;
    let f = std::fs::File::open(file).map_err(ArtifactError::Open)?;
    if n == 4 && magic == *b"\x7fELF" {
        return Ok(Box::new(f));
    }
    if n >= 2 && magic[..2] == [0x1f, 0x8b] {
        let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(f));
        let entries = ar.entries().map_err(ArtifactError::Archive)?;
        for entry in entries {
            let mut entry = entry.map_err(ArtifactError::Archive)?;
            let path: PathBuf = entry.path().map_err(ArtifactError::Archive)?.into_owned();
            if entry.header().entry_type().is_file()
                && path.file_name().is_some_and(|n| n == super::layout::BINARY)
            {
                let mut bytes = Vec::new();
                (&mut entry)
                    .take(flex_host::fs::MAX_INSTALL_BYTES + 1)
                    .read_to_end(&mut bytes)
                    .map_err(|error| ArtifactError::Member { path, error })?;
                return Ok(Box::new(std::io::Cursor::new(bytes)));
            }
        }
        return Err(ArtifactError::NoBinary);
    }
    Err(ArtifactError::UnknownFormat)
}

#[cfg(test)]
mod tests;
