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
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::writer::MakeWriterExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

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

/// The log filter: `level` for everything, zbus (chatty at debug) at warn, then the directives
/// of `AKS_FLEX_NODE_LOG` (`target=level` or `level`, comma-separated, as `tracing`'s
/// `Targets`) on top. A value that does not parse is ignored with a warning on stderr.
fn filter(level: Level, env: Option<&str>) -> Targets {
    let base = Targets::new()
        .with_default(level)
        .with_target("zbus", Level::WARN);
    match env.map(str::trim).filter(|v| !v.is_empty()) {
        None => base,
        Some(v) => match v.parse::<Targets>() {
            Ok(t) => match t.default_level() {
                Some(d) => base.with_default(d).with_targets(t),
                None => base.with_targets(t),
            },
            Err(e) => {
                eprintln!("Warning: AKS_FLEX_NODE_LOG={v:?} is not a log filter ({e}); ignored");
                base
            }
        },
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
    let filter = filter(lvl, std::env::var("AKS_FLEX_NODE_LOG").ok().as_deref());
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
        .with_max_level(tracing::level_filters::LevelFilter::TRACE)
        .with_target(false)
        .with_ansi(false);
    let result = match (file, under_systemd()) {
        (Some(f), true) => builder
            .without_time()
            .with_writer(std::io::stderr.and(Mutex::new(f)))
            .finish()
            .with(filter)
            .try_init(),
        (Some(f), false) => builder
            .with_writer(std::io::stderr.and(Mutex::new(f)))
            .finish()
            .with(filter)
            .try_init(),
        (None, true) => builder
            .without_time()
            .with_writer(std::io::stderr)
            .finish()
            .with(filter)
            .try_init(),
        (None, false) => builder
            .with_writer(std::io::stderr)
            .finish()
            .with(filter)
            .try_init(),
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
    fn filter_takes_the_level_quiets_zbus_and_lets_the_environment_override() {
        let f = filter(Level::INFO, None);
        assert!(f.would_enable("aks_flex_node::flows", &Level::INFO));
        assert!(!f.would_enable("aks_flex_node::flows", &Level::DEBUG));
        assert!(!f.would_enable("zbus::connection", &Level::INFO));
        assert!(f.would_enable("zbus::connection", &Level::WARN));
        let f = filter(Level::INFO, Some("debug,kube=trace,zbus=debug"));
        assert!(f.would_enable("aks_flex_node::flows", &Level::DEBUG));
        assert!(f.would_enable("kube::client", &Level::TRACE));
        assert!(f.would_enable("zbus::connection", &Level::DEBUG));
        assert!(!f.would_enable("aks_flex_node::flows", &Level::TRACE));
        let f = filter(Level::WARN, Some("not a [filter"));
        assert!(f.would_enable("x", &Level::WARN));
        assert!(!f.would_enable("x", &Level::INFO));
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
