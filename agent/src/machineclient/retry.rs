//! Retries with exponential backoff for the machine clients: which failures can succeed later
//! (transport errors, timeouts, 408, 409, 429, 500, 502, 503, 504), how long to wait (doubling
//! from [`RetryPolicy::initial_backoff`] up to [`RetryPolicy::max_backoff`], or the server's
//! `Retry-After` when it is shorter than the cap), and how many times to try.
//!
//! Everything else — 4xx other than those, a body that does not parse, `410 Gone` — fails at
//! once: asking again gives the same answer.

use std::time::Duration;

/// How a client retries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all (at least 1).
    pub attempts: u32,
    /// The first wait.
    pub initial_backoff: Duration,
    /// The longest wait.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 5 attempts, 500 ms doubling to 8 s (about 15 s of waiting in all).
    fn default() -> Self {
        Self {
            attempts: 5,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
        }
    }
}

impl RetryPolicy {
    /// A single attempt.
    pub fn none() -> Self {
        Self {
            attempts: 1,
            ..Self::default()
        }
    }

    /// The wait after failed attempt `attempt` (1-based), honouring a server's `Retry-After`
    /// (capped at [`Self::max_backoff`]).
    pub fn backoff(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(d) = retry_after {
            return d.min(self.max_backoff);
        }
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }

    /// Attempts, at least 1.
    pub fn max_attempts(&self) -> u32 {
        self.attempts.max(1)
    }
}

/// Whether an HTTP status can succeed when asked again.
pub fn retryable_status(code: u16) -> bool {
    matches!(code, 408 | 409 | 429 | 500 | 502 | 503 | 504)
}

/// A `Retry-After` header in seconds (the HTTP-date form is ignored).
pub fn parse_retry_after(value: Option<&str>) -> Option<Duration> {
    value
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap() {
        let p = RetryPolicy::default();
        let waits: Vec<_> = (1..=6).map(|a| p.backoff(a, None).as_millis()).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 8000]);
        assert_eq!(p.backoff(100, None), Duration::from_secs(8));
        assert_eq!(
            p.backoff(1, Some(Duration::from_secs(3))),
            Duration::from_secs(3)
        );
        assert_eq!(
            p.backoff(1, Some(Duration::from_secs(300))),
            Duration::from_secs(8)
        );
        assert_eq!(RetryPolicy::none().max_attempts(), 1);
        let zero = RetryPolicy {
            attempts: 0,
            ..RetryPolicy::default()
        };
        assert_eq!(zero.max_attempts(), 1);
    }

    #[test]
    fn which_statuses_are_retried() {
        for c in [408, 409, 429, 500, 502, 503, 504] {
            assert!(retryable_status(c), "{c}");
        }
        for c in [200, 204, 400, 401, 403, 404, 405, 410, 422, 501] {
            assert!(!retryable_status(c), "{c}");
        }
        assert_eq!(parse_retry_after(Some(" 2 ")), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            None
        );
        assert_eq!(parse_retry_after(None), None);
    }
}
