//! The workspace's one rule for error types, and the helper that keeps it.
//!
//! **An error's message names its cause, and the cause is never also its `source()`.**
//! A `thiserror` variant that shows a cause in its `#[error("…: {cause}")]` message keeps it in
//! a field named `cause` (not `source`: thiserror makes a field named `source` the source by
//! itself), with no `#[source]` or `#[from]`. A variant that wraps another error whole uses
//! `#[error(transparent)]`. So every printer shows each cause exactly once: `{e}` (what the
//! daemon logs with `error = %e` and what most `anyhow!("…: {e}")` sites embed), anyhow's
//! `{:#}` (what the CLI prints) and `source()` walkers such as
//! `flex_api::kube_errors::error_chain`. Before, a message with its cause that also reported it
//! as `source()` printed `…: X: msg: X: msg` through every chain printer.
//!
//! `#[from]` goes only with `#[error(transparent)]`; elsewhere a `From` impl, where callers
//! want `?`, is written by hand (`#[from]` would make the field a source). A cause whose own message leaves out its sources (`reqwest::Error`, `kube::Error`,
//! hyper's errors) is shown with [`Chain`], so what it wraps is not lost with its `source()`.
//! The tests check each error type with `flex_testkit::assert_cause_once`.

use std::fmt;

/// Displays an error and its `source()` chain joined by `: `, skipping a source whose message
/// the text already holds: how an error whose `Display` leaves out its causes is shown in the
/// message of the error that wraps it.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = self.0.to_string();
        let mut cur = self.0.source();
        while let Some(s) = cur {
            let m = s.to_string();
            if !text.contains(&m) {
                text.push_str(": ");
                text.push_str(&m);
            }
            cur = s.source();
        }
        f.write_str(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::Chain;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner: {0}")]
    struct Inner(std::io::Error);

    #[test]
    fn chain_shows_each_source_once() {
        let e = Outer(Inner(std::io::Error::other("boom")));
        assert_eq!(Chain(&e).to_string(), "outer: inner: boom");
        let io = std::io::Error::other("boom");
        assert_eq!(Chain(&io).to_string(), "boom");
    }
}
