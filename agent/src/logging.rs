//! Logging with `tracing`: human-readable lines on stderr (without timestamps under systemd,
//! whose journal stamps them) and, when `agent.logDir` is set, appended to
//! `<logDir>/aks-flex-node.log` (0600, directory 0750).
//!
//! Secrets never reach a log line: config secrets are [`flex_host::secret::Secret`] (whose `Debug`
//! is redacted and which has no `Display`), and secret command arguments are redacted by
//! [`flex_host::runner::Cmd`]. A test of `tests/cli.rs`
//! (`daemon_stops_cleanly_on_sigterm_and_logs_no_secrets`) runs the daemon with secrets in the
//! config and checks its log file.

use std::fs::OpenOptions;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Mutex;

use tracing::Level;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::writer::MakeWriterExt;

/// Log file name inside `agent.logDir`.
pub const LOG_FILE: &str = "aks-flex-node.log";

/// Parses `debug|info|warning|error` (trimmed, case-insensitive).
pub fn parse_level(s: &str) -> Option<Level> {
    match s.trim().to_lowercase().as_str() {
        "debug" => Some(Level::DEBUG),
        "info" => Some(Level::INFO),
        "warning" => Some(Level::WARN),
        "error" => Some(Level::ERROR),
        _ => None,
    }
}

/// Whether the process runs under systemd (journald adds timestamps).
fn under_systemd() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some()
        || std::fs::read_to_string("/proc/1/comm").is_ok_and(|c| c.trim() == "systemd")
            && std::env::var_os("INVOCATION_ID").is_some()
}

/// Installs the global subscriber. An invalid level falls back to `info` with a warning on
/// stderr; a log file that cannot be opened leaves stderr only, with a warning.
pub fn init(level: &str, log_dir: Option<&Path>) {
    let lvl = parse_level(level).unwrap_or_else(|| {
        eprintln!(
            "Warning: invalid log level '{level}'. Valid levels are: debug, info, warning, error. Using 'info' level as default."
        );
        Level::INFO
    });
    let filter = EnvFilter::builder()
        .with_default_directive(lvl.into())
        .with_env_var("AKS_FLEX_NODE_LOG")
        .from_env_lossy()
        // zbus is chatty at debug; keep it at warn unless asked for explicitly.
        .add_directive("zbus=warn".parse().unwrap_or_else(|_| lvl.into()));
    let file = log_dir.and_then(|dir| match open_log_file(dir) {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!(
                "Warning: cannot open log file in {}: {e}; logging to stderr only",
                dir.display()
            );
            None
        }
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(false);
    let result = match (file, under_systemd()) {
        (Some(f), true) => builder
            .without_time()
            .with_writer(std::io::stderr.and(Mutex::new(f)))
            .try_init(),
        (Some(f), false) => builder
            .with_writer(std::io::stderr.and(Mutex::new(f)))
            .try_init(),
        (None, true) => builder
            .without_time()
            .with_writer(std::io::stderr)
            .try_init(),
        (None, false) => builder.with_writer(std::io::stderr).try_init(),
    };
    // A second init (tests) keeps the first subscriber.
    let _ = result;
}

fn open_log_file(dir: &Path) -> std::io::Result<std::fs::File> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)?;
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(dir.join(LOG_FILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels() {
        assert_eq!(parse_level(" Warning "), Some(Level::WARN));
        assert_eq!(parse_level("DEBUG"), Some(Level::DEBUG));
        assert_eq!(parse_level("warn"), None);
        assert_eq!(parse_level(""), None);
    }

    #[test]
    fn log_file_is_0600_in_0750_dir() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("logs");
        open_log_file(&dir).unwrap();
        let m = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(m(&dir.join(LOG_FILE)), 0o600);
        assert_eq!(m(&dir), 0o750);
    }
}
