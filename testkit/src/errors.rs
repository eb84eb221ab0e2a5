//! Checks of the workspace's error rule (`flex_host::error`): each cause printed once.

/// `e` and each of its `source()`s, every message whole, joined by `: `: what anyhow's `{:#}`
/// prints (the CLI's error line) and what a `source()` walker shows.
pub fn render_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        parts.push(s.to_string());
        cur = s.source();
    }
    parts.join(": ")
}

/// Asserts that `e` shows `cause` (the message of the error it wraps) exactly once, whether it
/// is printed alone (`{e}`, as the daemon logs `error = %e`) or with its sources
/// ([`render_chain`], anyhow's `{:#}`), and that no source's message is printed twice.
///
/// # Panics
///
/// When one of those does not hold (this is a test assertion).
#[track_caller]
pub fn assert_cause_once(e: &(dyn std::error::Error + 'static), cause: &str) {
    assert!(!cause.is_empty(), "an empty cause proves nothing");
    let alone = e.to_string();
    assert!(
        alone.contains(cause),
        "the message loses its cause {cause:?}: {alone}"
    );
    let chain = render_chain(e);
    assert_eq!(
        chain.matches(cause).count(),
        1,
        "the cause {cause:?} is printed more than once: {chain}"
    );
    let mut cur = e.source();
    while let Some(s) = cur {
        let m = s.to_string();
        assert!(
            m.is_empty() || chain.matches(m.as_str()).count() == 1,
            "the source {m:?} is printed more than once: {chain}"
        );
        cur = s.source();
    }
}

#[cfg(test)]
mod tests {
    use super::{assert_cause_once, render_chain};

    #[derive(Debug, thiserror::Error)]
    #[error("read /x: {source}")]
    struct Twice {
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("read /x")]
    struct ContextOnly {
        #[source]
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("read /x: {cause}")]
    struct Once {
        cause: std::io::Error,
    }

    fn io() -> std::io::Error {
        std::io::Error::other("boom")
    }

    #[test]
    fn render_chain_joins_every_message() {
        assert_eq!(render_chain(&Twice { source: io() }), "read /x: boom: boom");
        assert_eq!(render_chain(&Once { cause: io() }), "read /x: boom");
    }

    #[test]
    fn a_cause_in_the_message_and_the_chain_fails() {
        let r = std::panic::catch_unwind(|| assert_cause_once(&Twice { source: io() }, "boom"));
        assert!(r.is_err());
    }

    #[test]
    fn a_cause_only_in_the_chain_fails_as_the_log_line_loses_it() {
        let r =
            std::panic::catch_unwind(|| assert_cause_once(&ContextOnly { source: io() }, "boom"));
        assert!(r.is_err());
    }

    #[test]
    fn a_cause_in_the_message_only_passes() {
        assert_cause_once(&Once { cause: io() }, "boom");
    }
}
