//! A string that never shows in `Debug` output or logs (bootstrap tokens, client secrets), and
//! [`redact_url`] for URLs that may carry a token in their user info or query.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A secret string. `Debug` prints `***REDACTED***`; there is no `Display`; the value is
/// reachable only through [`Secret::expose`], so using it is a visible decision.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(v: impl Into<String>) -> Self {
        Self(v.into())
    }

    /// The secret value. Never pass it to a log macro.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether the value is empty (after trimming).
    pub fn is_blank(&self) -> bool {
        self.0.trim().is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(crate::runner::REDACTED)
    }
}

/// `url` for logs and errors: user info replaced by `***`, query and fragment replaced by
/// `?***`/dropped (a mirror URL may carry a token there). A value that does not parse is shown
/// only up to its first `?`.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            let had_query = u.query().is_some_and(|q| !q.is_empty());
            if !u.username().is_empty() || u.password().is_some() {
                let _ = u.set_username("***");
                let _ = u.set_password(None);
            }
            u.set_query(None);
            u.set_fragment(None);
            let mut s = u.to_string();
            if had_query {
                s.push_str("?***");
            }
            s
        }
        Err(_) => match url.split_once('?') {
            Some((head, _)) => format!("{head}?***"),
            None => url.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_and_serde_keeps() {
        let s = Secret::new("abcdef.0123456789abcdef");
        assert_eq!(format!("{s:?}"), "***REDACTED***");
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            "\"abcdef.0123456789abcdef\""
        );
        let back: Secret = serde_json::from_str("\"x\"").unwrap();
        assert_eq!(back.expose(), "x");
    }
}
