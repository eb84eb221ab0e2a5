//! Long-running children the real-component tests start (containerd, dbus-daemon, a registry):
//! started with their output in a log file, killed and reaped on drop, and polled until ready.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A long-running child; killed and reaped on drop.
pub struct Daemon {
    child: std::process::Child,
    log: PathBuf,
}

impl Daemon {
    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `program args…` with its output in `log`; panics (a test failure) when it cannot.
// The agent's runner waits for every child it starts; these daemons must outlive any one call
// and are killed in `Daemon::drop`, so they are started here, the tests' only direct spawn.
#[allow(clippy::disallowed_methods)]
pub fn spawn_daemon(program: &str, args: &[&str], log: &Path) -> Daemon {
    let out =
        std::fs::File::create(log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
    let err = out
        .try_clone()
        .unwrap_or_else(|e| panic!("dup {}: {e}", log.display()));
    let child = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("start {program}: {e}"));
    Daemon {
        child,
        log: log.to_path_buf(),
    }
}

/// Polls `ready` until it holds; on timeout fails (panics) with `daemon`'s log.
pub async fn wait_for(
    what: &str,
    daemon: &Daemon,
    timeout: Duration,
    mut ready: impl AsyncFnMut() -> bool,
) {
    let start = Instant::now();
    while !ready().await {
        assert!(
            start.elapsed() < timeout,
            "{what} not ready after {timeout:?}; its log:\n{}",
            daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
