//! A string that never shows in `Debug` output or logs: bootstrap tokens and client secrets.

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
