//! [`DbusManager`]: the systemd manager over D-Bus (`org.freedesktop.systemd1`), with zbus.
//!
//! Each verb does what `systemctl` does for it:
//!
//! * `enable`, `disable` and `mask` change the unit files (`EnableUnitFiles`, `DisableUnitFiles`,
//!   `MaskUnitFiles`, never at runtime, never forced) and then `Reload` the manager;
//! * `start`, `stop` and `restart` enqueue a job in `replace` mode and wait for its `JobRemoved`
//!   signal, listened for *before* the call so that a job that finishes at once is not missed; the
//!   verb succeeds only when the job's result is `done`;
//! * `is-active` reads the unit's `ActiveState`; a unit that is not loaded is not active;
//! * a transient timer is `StartTransientUnit` of `<name>.timer` with `<name>.service` as its
//!   auxiliary unit, what `systemd-run --on-active=… --timer-property=AccuracySec=…` sends.
//!
//! Errors are [`SystemdError::Call`] whose `call` is the line
//! `flex_testkit::FakeSystemd` records for the same verb (`start foo.service`).

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use tokio::sync::OnceCell;
use zbus::proxy::CacheProperties;
use zbus::{Connection, OwnedObjectPath, Variant};

use super::{SystemdError, SystemdManager, TransientTimer, UnitState};

/// How long a job may take before [`DbusManager`] gives up waiting for it, by default.
const DEFAULT_JOB_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// The job mode of every job: what `systemctl` uses unless told otherwise.
const JOB_MODE: &str = "replace";
/// `GetUnit`'s error for a unit that is not loaded.
const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
/// `Subscribe`'s error when this client has subscribed already (older systemd).
const ALREADY_SUBSCRIBED: &str = "org.freedesktop.systemd1.AlreadySubscribed";

/// The part of `org.freedesktop.systemd1.Manager` the agent uses.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
trait Manager {
    /// `Reload()`: `systemctl daemon-reload`.
    async fn reload(&self) -> zbus::Result<()>;

    /// `EnableUnitFiles(as files, b runtime, b force) -> (b carries_install_info, a(sss) changes)`.
    async fn enable_unit_files(
        &self,
        files: &[&str],
        runtime: bool,
        force: bool,
    ) -> zbus::Result<(bool, Vec<(String, String, String)>)>;

    /// `DisableUnitFiles(as files, b runtime) -> a(sss) changes`.
    async fn disable_unit_files(
        &self,
        files: &[&str],
        runtime: bool,
    ) -> zbus::Result<Vec<(String, String, String)>>;

    /// `MaskUnitFiles(as files, b runtime, b force) -> a(sss) changes`.
    async fn mask_unit_files(
        &self,
        files: &[&str],
        runtime: bool,
        force: bool,
    ) -> zbus::Result<Vec<(String, String, String)>>;

    /// `StartUnit(s name, s mode) -> o job`.
    async fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    /// `StopUnit(s name, s mode) -> o job`.
    async fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    /// `RestartUnit(s name, s mode) -> o job`.
    async fn restart_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    /// `ResetFailedUnit(s name)`.
    async fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;

    /// `GetUnit(s name) -> o unit`; fails with `NoSuchUnit` when the unit is not loaded.
    async fn get_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;

    /// `Subscribe()`: asks the manager to send its signals.
    async fn subscribe(&self) -> zbus::Result<()>;

    /// `StartTransientUnit(s name, s mode, a(sv) properties, a(sa(sv)) aux) -> o job`.
    async fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, Variant<'_>)],
        aux: &[(&str, Vec<(&str, Variant<'_>)>)],
    ) -> zbus::Result<OwnedObjectPath>;

    /// `JobRemoved(u id, o job, s unit, s result)`: a job finished.
    #[zbus(signal)]
    fn job_removed(
        &self,
        id: u32,
        job: OwnedObjectPath,
        unit: String,
        result: String,
    ) -> zbus::Result<()>;
}

/// The part of `org.freedesktop.systemd1.Unit` the agent uses.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Unit",
    default_service = "org.freedesktop.systemd1"
)]
trait Unit {
    /// `ActiveState` (`active`, `inactive`, `failed`, …).
    #[zbus(property)]
    fn active_state(&self) -> zbus::Result<String>;
    /// `SubState` (`running`, `auto-restart`, `dead`, …).
    #[zbus(property)]
    fn sub_state(&self) -> zbus::Result<String>;
}

/// The part of `org.freedesktop.systemd1.Service` the agent uses.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Service",
    default_service = "org.freedesktop.systemd1"
)]
trait Service {
    /// `Result` (`success`, `exit-code`, `start-limit-hit`, …).
    #[zbus(property)]
    fn result(&self) -> zbus::Result<String>;
    /// `NRestarts`.
    #[zbus(property, name = "NRestarts")]
    fn n_restarts(&self) -> zbus::Result<u32>;
    /// `ExecMainStatus`.
    #[zbus(property)]
    fn exec_main_status(&self) -> zbus::Result<i32>;
}

/// A job a unit verb enqueues.
#[derive(Clone, Copy, Debug)]
enum JobVerb {
    Start,
    Stop,
    Restart,
}

impl JobVerb {
    fn name(self) -> &'static str {
        match self {
            JobVerb::Start => "start",
            JobVerb::Stop => "stop",
            JobVerb::Restart => "restart",
        }
    }
}

/// [`SystemdManager`] over D-Bus: talks to `org.freedesktop.systemd1` with zbus, as `systemctl`
/// does, with no process spawned.
#[derive(Clone, Debug)]
pub struct DbusManager {
    conn: Connection,
    job_timeout: Duration,
    /// Set once `Subscribe` has succeeded on this connection.
    subscribed: Arc<OnceCell<()>>,
}

impl DbusManager {
    /// A manager on a new connection to the system bus.
    pub async fn system() -> Result<Self, SystemdError> {
        let conn = zbus::connection::Builder::system()
            .build()
            .await
            .map_err(|e| call_error("connect to the system bus", e))?;
        Ok(Self::from_connection(conn))
    }

    /// A manager on `conn`: a bus connection, or a peer-to-peer one to the manager itself.
    pub fn from_connection(conn: Connection) -> Self {
        Self {
            conn,
            job_timeout: DEFAULT_JOB_TIMEOUT,
            subscribed: Arc::new(OnceCell::new()),
        }
    }

    /// Sets how long `start`, `stop`, `restart` and a transient timer wait for their job (five
    /// minutes by default).
    #[must_use]
    pub fn with_job_timeout(mut self, timeout: Duration) -> Self {
        self.job_timeout = timeout;
        self
    }

    /// How long a job is waited for.
    pub fn job_timeout(&self) -> Duration {
        self.job_timeout
    }

    async fn manager(&self) -> zbus::Result<ManagerProxy<'static>> {
        ManagerProxy::builder(&self.conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
    }

    /// The manager proxy and a stream of `JobRemoved` signals, listened for from now on. Also
    /// makes sure the manager sends its signals (`Subscribe`).
    async fn watch_jobs(&self) -> zbus::Result<(ManagerProxy<'static>, JobRemovedStream)> {
        let manager = self.manager().await?;
        let removed = manager.receive_job_removed().await?;
        self.subscribed
            .get_or_try_init(|| async {
                match manager.subscribe().await {
                    Err(e) if error_name(&e) == Some(ALREADY_SUBSCRIBED) => Ok(()),
                    r => r,
                }
            })
            .await?;
        Ok((manager, removed))
    }

    /// Waits for the `JobRemoved` of `job` on `removed`, and fails unless its result is `done`.
    async fn wait_job(
        &self,
        call: &str,
        mut removed: JobRemovedStream,
        job: OwnedObjectPath,
    ) -> Result<(), SystemdError> {
        tracing::debug!(call, job = %job, "waiting for systemd job");
        let wait = async {
            loop {
                let Some(signal) = removed.next().await else {
                    return Err(format!("connection closed before job {job} finished"));
                };
                let args = signal
                    .args()
                    .map_err(|e| format!("malformed JobRemoved signal: {e}"))?;
                if args.job == job {
                    return Ok(args.result);
                }
            }
        };
        let result = match tokio::time::timeout(self.job_timeout, wait).await {
            Ok(Ok(result)) => result,
            Ok(Err(message)) => return Err(call_error(call, message)),
            Err(_) => {
                return Err(call_error(
                    call,
                    format!(
                        "timed out after {:?} waiting for job {job} to finish",
                        self.job_timeout
                    ),
                ));
            }
        };
        tracing::debug!(call, job = %job, result, "systemd job finished");
        // systemctl counts both as success (a skipped job had nothing to do).
        if result == "done" || result == "skipped" {
            Ok(())
        } else {
            Err(call_error(call, format!("job result: {result}")))
        }
    }

    /// `systemctl start|stop|restart <unit>`.
    async fn unit_job(&self, verb: JobVerb, unit: &str) -> Result<(), SystemdError> {
        let call = format!("{} {unit}", verb.name());
        let (manager, removed) = self.watch_jobs().await.map_err(|e| call_error(&call, e))?;
        let job = match verb {
            JobVerb::Start => manager.start_unit(unit, JOB_MODE).await,
            JobVerb::Stop => manager.stop_unit(unit, JOB_MODE).await,
            JobVerb::Restart => manager.restart_unit(unit, JOB_MODE).await,
        }
        .map_err(|e| call_error(&call, e))?;
        self.wait_job(&call, removed, job).await
    }

    /// `Reload` after a unit file change, as `systemctl enable|disable|mask` does.
    async fn reload_after(
        &self,
        manager: &ManagerProxy<'_>,
        call: &str,
        changes: &[(String, String, String)],
    ) -> Result<(), SystemdError> {
        for (kind, path, source) in changes {
            tracing::debug!(call, kind, path, source, "unit file changed");
        }
        manager.reload().await.map_err(|e| call_error(call, e))
    }
}

#[async_trait]
impl SystemdManager for DbusManager {
    async fn daemon_reload(&self) -> Result<(), SystemdError> {
        let call = "daemon-reload";
        let manager = self.manager().await.map_err(|e| call_error(call, e))?;
        manager.reload().await.map_err(|e| call_error(call, e))
    }

    async fn enable(&self, unit: &str) -> Result<(), SystemdError> {
        let call = format!("enable {unit}");
        let manager = self.manager().await.map_err(|e| call_error(&call, e))?;
        let (carries_install_info, changes) = manager
            .enable_unit_files(&[unit], false, false)
            .await
            .map_err(|e| call_error(&call, e))?;
        if !carries_install_info {
            tracing::warn!(
                unit,
                "the unit has no [Install] section: enabling it links nothing"
            );
        }
        self.reload_after(&manager, &call, &changes).await
    }

    async fn disable(&self, unit: &str) -> Result<(), SystemdError> {
        let call = format!("disable {unit}");
        let manager = self.manager().await.map_err(|e| call_error(&call, e))?;
        let changes = manager
            .disable_unit_files(&[unit], false)
            .await
            .map_err(|e| call_error(&call, e))?;
        self.reload_after(&manager, &call, &changes).await
    }

    async fn mask(&self, units: &[&str]) -> Result<(), SystemdError> {
        let call = format!("mask {}", units.join(" "));
        let manager = self.manager().await.map_err(|e| call_error(&call, e))?;
        let changes = manager
            .mask_unit_files(units, false, false)
            .await
            .map_err(|e| call_error(&call, e))?;
        self.reload_after(&manager, &call, &changes).await
    }

    async fn start(&self, unit: &str) -> Result<(), SystemdError> {
        self.unit_job(JobVerb::Start, unit).await
    }

    async fn stop(&self, unit: &str) -> Result<(), SystemdError> {
        self.unit_job(JobVerb::Stop, unit).await
    }

    async fn restart(&self, unit: &str) -> Result<(), SystemdError> {
        self.unit_job(JobVerb::Restart, unit).await
    }

    async fn reset_failed(&self, unit: &str) -> Result<(), SystemdError> {
        let call = format!("reset-failed {unit}");
        let manager = self.manager().await.map_err(|e| call_error(&call, e))?;
        manager
            .reset_failed_unit(unit)
            .await
            .map_err(|e| call_error(&call, e))
    }

    async fn is_active(&self, unit: &str) -> Result<bool, SystemdError> {
        let call = format!("is-active {unit}");
        let manager = self.manager().await.map_err(|e| call_error(&call, e))?;
        let path = match manager.get_unit(unit).await {
            Ok(path) => path,
            Err(e) if error_name(&e) == Some(NO_SUCH_UNIT) => return Ok(false),
            Err(e) => return Err(call_error(&call, e)),
        };
        let state = UnitProxy::builder(&self.conn)
            .path(path)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| call_error(&call, e))?
            .active_state()
            .await
            .map_err(|e| call_error(&call, e))?;
        // What `systemctl is-active` counts as active.
        Ok(matches!(
            state.as_str(),
            "active" | "reloading" | "refreshing"
        ))
    }

    async fn unit_state(&self, unit: &str) -> Result<UnitState, SystemdError> {
        let call = format!("show {unit}");
        let manager = self.manager().await.map_err(|e| call_error(&call, e))?;
        let path = match manager.get_unit(unit).await {
            Ok(path) => path,
            Err(e) if error_name(&e) == Some(NO_SUCH_UNIT) => {
                return Ok(UnitState {
                    active_state: "inactive".into(),
                    sub_state: "dead".into(),
                    ..UnitState::default()
                });
            }
            Err(e) => return Err(call_error(&call, e)),
        };
        let u = UnitProxy::builder(&self.conn)
            .path(path.clone())
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| call_error(&call, e))?;
        let svc = ServiceProxy::builder(&self.conn)
            .path(path)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| call_error(&call, e))?;
        Ok(UnitState {
            active_state: u.active_state().await.map_err(|e| call_error(&call, e))?,
            sub_state: u.sub_state().await.map_err(|e| call_error(&call, e))?,
            result: svc.result().await.map_err(|e| call_error(&call, e))?,
            n_restarts: svc.n_restarts().await.map_err(|e| call_error(&call, e))?,
            exec_main_status: svc
                .exec_main_status()
                .await
                .map_err(|e| call_error(&call, e))?,
        })
    }

    async fn start_transient_timer(&self, timer: &TransientTimer) -> Result<(), SystemdError> {
        let call = format!(
            "transient-timer {} on-active={}ms accuracy={}ms command={}",
            timer.name,
            timer.on_active.as_millis(),
            timer.accuracy.as_millis(),
            timer.command.join(" ")
        );
        let Some(program) = timer.command.first() else {
            return Err(call_error(&call, "empty command"));
        };
        let timer_unit = format!("{}.timer", timer.name);
        let service_unit = format!("{}.service", timer.name);
        let properties = [
            ("Description", Variant::from(timer.description.as_str())),
            (
                "TimersMonotonic",
                Variant::from(vec![("OnActiveUSec", usec(timer.on_active))]),
            ),
            ("AccuracyUSec", Variant::from(usec(timer.accuracy))),
            ("RemainAfterElapsed", Variant::from(false)),
        ];
        // ExecStart is a(sasb): the program, its whole argv (argv[0] included), and whether a
        // failure is ignored.
        let argv: Vec<&str> = timer.command.iter().map(String::as_str).collect();
        let aux = [(
            service_unit.as_str(),
            vec![
                ("Description", Variant::from(timer.description.as_str())),
                (
                    "ExecStart",
                    Variant::from(vec![(program.as_str(), argv, false)]),
                ),
            ],
        )];
        let (manager, removed) = self.watch_jobs().await.map_err(|e| call_error(&call, e))?;
        let job = manager
            .start_transient_unit(&timer_unit, JOB_MODE, &properties, &aux)
            .await
            .map_err(|e| call_error(&call, e))?;
        self.wait_job(&call, removed, job).await
    }
}

fn call_error(call: &str, message: impl Display) -> SystemdError {
    SystemdError::Call {
        call: call.to_string(),
        message: message.to_string(),
    }
}

/// The D-Bus error name of a method error reply.
fn error_name(e: &zbus::Error) -> Option<&str> {
    match e {
        zbus::Error::MethodError(name, _, _) => Some(name.as_str()),
        _ => None,
    }
}

/// Microseconds, as systemd's `*USec` properties take them.
fn usec(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    //! The real zbus client, over the real D-Bus wire protocol (authentication handshake,
    //! marshalling, signal delivery) on a socket pair, against a fake systemd: an object served
    //! with `#[zbus::interface]` that records every call and emits `JobRemoved` like systemd does.

    use std::collections::BTreeMap;
    use std::os::unix::net::UnixStream;
    use std::sync::Mutex;

    use zbus::object_server::SignalEmitter;
    use zbus::{Guid, ObjectPath, OwnedVariant};

    use super::*;

    const MANAGER_PATH: &str = "/org/freedesktop/systemd1";

    /// Errors the fake manager replies with.
    #[derive(Debug, zbus::DBusError)]
    #[zbus(prefix = "org.freedesktop.systemd1")]
    enum FakeError {
        #[zbus(error)]
        ZBus(zbus::Error),
        NoSuchUnit(String),
    }

    /// A fake `org.freedesktop.systemd1.Manager`. Job results: `broken.service` fails,
    /// `hang.service` never finishes, every other job is `done`. `instant.service`'s jobs finish
    /// before the method reply is even sent (a client that starts listening for `JobRemoved`
    /// only after the reply misses it); the others finish shortly after the reply.
    #[derive(Clone, Default)]
    struct FakeManager {
        calls: Arc<Mutex<Vec<String>>>,
        next_job: Arc<Mutex<u32>>,
        /// Loaded units and their `ActiveState`; each is served at its unit path.
        units: BTreeMap<&'static str, &'static str>,
    }

    impl FakeManager {
        fn record(&self, line: String) {
            self.calls.lock().unwrap().push(line);
        }

        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }

        fn take_calls(&self) -> Vec<String> {
            std::mem::take(&mut *self.calls.lock().unwrap())
        }

        async fn job(&self, unit: &str, emitter: &SignalEmitter<'_>) -> OwnedObjectPath {
            let id = {
                let mut next = self.next_job.lock().unwrap();
                *next += 1;
                *next
            };
            let job = OwnedObjectPath::try_from(format!("{MANAGER_PATH}/job/{id}")).unwrap();
            let result = if unit == "broken.service" {
                "failed"
            } else {
                "done"
            };
            match unit {
                "hang.service" => {}
                "instant.service" => {
                    FakeManager::job_removed(emitter, id, job.as_ref(), unit, result)
                        .await
                        .unwrap();
                }
                _ => {
                    let emitter = emitter.to_owned();
                    let (job, unit) = (job.clone(), unit.to_string());
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        FakeManager::job_removed(&emitter, id, job.as_ref(), &unit, result)
                            .await
                            .unwrap();
                    });
                }
            }
            job
        }
    }

    fn unit_path(unit: &str) -> String {
        let escaped: String = unit
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_string()
                } else {
                    format!("_{:02x}", c as u32)
                }
            })
            .collect();
        format!("{MANAGER_PATH}/unit/{escaped}")
    }

    /// One line per property: name, D-Bus signature and value (GVariant text format).
    fn props(properties: &[(String, OwnedVariant)]) -> Vec<String> {
        properties
            .iter()
            .map(|(name, value)| {
                let signature = value.value_signature();
                format!("    {name} {signature} = {}", **value)
            })
            .collect()
    }

    #[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
    impl FakeManager {
        fn reload(&self) {
            self.record("Reload".into());
        }

        fn enable_unit_files(
            &self,
            files: Vec<String>,
            runtime: bool,
            force: bool,
        ) -> (bool, Vec<(String, String, String)>) {
            self.record(format!(
                "EnableUnitFiles {files:?} runtime={runtime} force={force}"
            ));
            let changes = files
                .iter()
                .map(|f| {
                    (
                        "symlink".to_string(),
                        format!("/etc/systemd/system/multi-user.target.wants/{f}"),
                        format!("/etc/systemd/system/{f}"),
                    )
                })
                .collect();
            (true, changes)
        }

        fn disable_unit_files(
            &self,
            files: Vec<String>,
            runtime: bool,
        ) -> Vec<(String, String, String)> {
            self.record(format!("DisableUnitFiles {files:?} runtime={runtime}"));
            Vec::new()
        }

        fn mask_unit_files(
            &self,
            files: Vec<String>,
            runtime: bool,
            force: bool,
        ) -> Vec<(String, String, String)> {
            self.record(format!(
                "MaskUnitFiles {files:?} runtime={runtime} force={force}"
            ));
            Vec::new()
        }

        async fn start_unit(
            &self,
            name: String,
            mode: String,
            #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        ) -> OwnedObjectPath {
            self.record(format!("StartUnit {name} {mode}"));
            self.job(&name, &emitter).await
        }

        async fn stop_unit(
            &self,
            name: String,
            mode: String,
            #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        ) -> OwnedObjectPath {
            self.record(format!("StopUnit {name} {mode}"));
            self.job(&name, &emitter).await
        }

        async fn restart_unit(
            &self,
            name: String,
            mode: String,
            #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        ) -> OwnedObjectPath {
            self.record(format!("RestartUnit {name} {mode}"));
            self.job(&name, &emitter).await
        }

        fn reset_failed_unit(&self, name: String) {
            self.record(format!("ResetFailedUnit {name}"));
        }

        fn get_unit(&self, name: String) -> Result<OwnedObjectPath, FakeError> {
            self.record(format!("GetUnit {name}"));
            if self.units.contains_key(name.as_str()) {
                Ok(OwnedObjectPath::try_from(unit_path(&name)).unwrap())
            } else {
                Err(FakeError::NoSuchUnit(format!("Unit {name} not loaded.")))
            }
        }

        fn subscribe(&self) {
            self.record("Subscribe".into());
        }

        async fn start_transient_unit(
            &self,
            name: String,
            mode: String,
            properties: Vec<(String, OwnedVariant)>,
            aux: Vec<(String, Vec<(String, OwnedVariant)>)>,
            #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        ) -> OwnedObjectPath {
            self.record(format!("StartTransientUnit {name} {mode}"));
            self.record("  properties".into());
            props(&properties)
                .into_iter()
                .for_each(|line| self.record(line));
            for (aux_name, aux_properties) in &aux {
                self.record(format!("  aux {aux_name}"));
                props(aux_properties)
                    .into_iter()
                    .for_each(|line| self.record(line));
            }
            self.job(&name, &emitter).await
        }

        #[zbus(signal)]
        async fn job_removed(
            emitter: &SignalEmitter<'_>,
            id: u32,
            job: ObjectPath<'_>,
            unit: &str,
            result: &str,
        ) -> zbus::Result<()>;
    }

    /// A fake `org.freedesktop.systemd1.Unit`.
    struct FakeUnit {
        active_state: &'static str,
    }

    #[zbus::interface(name = "org.freedesktop.systemd1.Unit")]
    impl FakeUnit {
        #[zbus(property)]
        fn active_state(&self) -> String {
            self.active_state.to_string()
        }
    }

    /// A [`DbusManager`] on one end of a socket pair, the fake systemd served on the other (a
    /// peer-to-peer D-Bus connection: no bus daemon in between). Keep the server connection
    /// alive for as long as the manager is used.
    async fn connect() -> (FakeManager, Connection, DbusManager) {
        let fake = FakeManager {
            units: BTreeMap::from([
                ("active.service", "active"),
                ("inactive.service", "inactive"),
                ("failed.service", "failed"),
            ]),
            ..FakeManager::default()
        };
        let (server_socket, client_socket) = UnixStream::pair().unwrap();
        let mut server = zbus::connection::Builder::unix_stream(server_socket)
            .server(Guid::generate())
            .p2p()
            .serve_at(MANAGER_PATH, fake.clone());
        for (unit, active_state) in &fake.units {
            server = server.serve_at(unit_path(unit), FakeUnit { active_state });
        }
        let client = zbus::connection::Builder::unix_stream(client_socket).p2p();
        let (server, client) = tokio::try_join!(server.build(), client.build()).unwrap();
        let manager = DbusManager::from_connection(client);
        assert_eq!(manager.job_timeout(), DEFAULT_JOB_TIMEOUT);
        // A job whose JobRemoved is missed fails the test in seconds, not minutes.
        let manager = manager.with_job_timeout(Duration::from_secs(10));
        (fake, server, manager)
    }

    fn timer() -> TransientTimer {
        TransientTimer {
            name: "aks-flex-node-restart".into(),
            description: "Restart the agent".into(),
            on_active: Duration::from_secs(1),
            accuracy: Duration::from_millis(100),
            command: vec![
                "/usr/bin/systemctl".into(),
                "restart".into(),
                "aks-flex-node-agent.service".into(),
            ],
        }
    }

    #[tokio::test]
    async fn real_dbus_wire_fake_systemd_unit_file_verbs_reload_like_systemctl() {
        let (fake, _server, m) = connect().await;
        m.daemon_reload().await.unwrap();
        m.enable("a.service").await.unwrap();
        m.disable("a.service").await.unwrap();
        m.mask(&["docker.socket", "docker.service"]).await.unwrap();
        m.reset_failed("a.service").await.unwrap();
        assert_eq!(
            fake.calls(),
            [
                "Reload",
                r#"EnableUnitFiles ["a.service"] runtime=false force=false"#,
                "Reload",
                r#"DisableUnitFiles ["a.service"] runtime=false"#,
                "Reload",
                r#"MaskUnitFiles ["docker.socket", "docker.service"] runtime=false force=false"#,
                "Reload",
                "ResetFailedUnit a.service",
            ]
        );
    }

    #[tokio::test]
    async fn real_dbus_wire_fake_systemd_jobs_wait_for_job_removed() {
        let (fake, _server, m) = connect().await;
        m.start("a.service").await.unwrap();
        m.stop("a.service").await.unwrap();
        m.restart("a.service").await.unwrap();
        // Its JobRemoved arrives before the reply: only seen if listened for before the call.
        m.start("instant.service").await.unwrap();
        assert_eq!(
            fake.take_calls(),
            [
                // Subscribe once per connection, after the JobRemoved match and before the call.
                "Subscribe",
                "StartUnit a.service replace",
                "StopUnit a.service replace",
                "RestartUnit a.service replace",
                "StartUnit instant.service replace",
            ]
        );

        let e = m.start("broken.service").await.unwrap_err();
        assert!(
            matches!(&e, SystemdError::Call { call, message }
                if call == "start broken.service" && message == "job result: failed"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "systemd start broken.service: job result: failed"
        );
        assert_eq!(fake.take_calls(), ["StartUnit broken.service replace"]);
    }

    #[tokio::test]
    async fn real_dbus_wire_fake_systemd_job_timeout() {
        let (_fake, _server, m) = connect().await;
        let m = m.with_job_timeout(Duration::from_millis(200));
        assert_eq!(m.job_timeout(), Duration::from_millis(200));
        let e = m.restart("hang.service").await.unwrap_err().to_string();
        assert!(
            e.starts_with("systemd restart hang.service: timed out after 200ms waiting for job "),
            "{e}"
        );
    }

    #[tokio::test]
    async fn real_dbus_wire_fake_systemd_is_active_reads_active_state() {
        let (fake, _server, m) = connect().await;
        assert!(m.is_active("active.service").await.unwrap());
        assert!(!m.is_active("inactive.service").await.unwrap());
        assert!(!m.is_active("failed.service").await.unwrap());
        // Not loaded: GetUnit fails with NoSuchUnit, which means not active.
        assert!(!m.is_active("missing.service").await.unwrap());
        assert_eq!(
            fake.calls(),
            [
                "GetUnit active.service",
                "GetUnit inactive.service",
                "GetUnit failed.service",
                "GetUnit missing.service",
            ]
        );
    }

    #[tokio::test]
    async fn real_dbus_wire_fake_systemd_error_names_the_call() {
        let (_fake, server, m) = connect().await;
        // A method the fake doesn't serve fails like any D-Bus error reply would.
        server
            .object_server()
            .remove::<FakeManager, _>(MANAGER_PATH)
            .await
            .unwrap();
        let e = m.enable("a.service").await.unwrap_err().to_string();
        assert!(e.starts_with("systemd enable a.service: "), "{e}");
        let e = m.daemon_reload().await.unwrap_err().to_string();
        assert!(e.starts_with("systemd daemon-reload: "), "{e}");
        let e = m.is_active("a.service").await.unwrap_err().to_string();
        assert!(e.starts_with("systemd is-active a.service: "), "{e}");
    }

    #[tokio::test]
    async fn real_dbus_wire_fake_systemd_transient_timer_properties() {
        let (fake, _server, m) = connect().await;
        m.start_transient_timer(&timer()).await.unwrap();
        // Each property as it crossed the wire: name, D-Bus signature, value.
        insta::assert_snapshot!(fake.calls().join("\n"), @r#"
        Subscribe
        StartTransientUnit aks-flex-node-restart.timer replace
          properties
            Description s = "Restart the agent"
            TimersMonotonic a(st) = [("OnActiveUSec", uint64 1000000)]
            AccuracyUSec t = uint64 100000
            RemainAfterElapsed b = false
          aux aks-flex-node-restart.service
            Description s = "Restart the agent"
            ExecStart a(sasb) = [("/usr/bin/systemctl", ["/usr/bin/systemctl", "restart", "aks-flex-node-agent.service"], false)]
        "#);
    }

    #[tokio::test]
    async fn empty_transient_command_is_refused_before_any_call() {
        let (fake, _server, m) = connect().await;
        let e = m
            .start_transient_timer(&TransientTimer {
                command: Vec::new(),
                ..timer()
            })
            .await
            .unwrap_err()
            .to_string();
        assert!(e.ends_with(": empty command"), "{e}");
        assert!(fake.calls().is_empty());
    }
}
