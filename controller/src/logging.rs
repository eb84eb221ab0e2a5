//! JSON logs on stdout (upstream uses slog's JSON handler): one object per line with
//! `timestamp`, `level`, `message` and the event's fields at the top level. The level comes
//! from `RUST_LOG` (default `info`).

use tracing_subscriber::EnvFilter;

/// Installs the JSON subscriber (a second call is a no-op).
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_env_filter(filter)
        .with_writer(std::io::stdout)
        .try_init();
}
