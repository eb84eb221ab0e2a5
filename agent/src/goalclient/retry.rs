//! Retries with exponential backoff for the machine clients: which failures can succeed later
//! (transport errors, timeouts, 408, 409, 429, 500, 502, 503, 504), how long to wait (doubling
//! from the backoff's `initial` up to its `max`, or the server's
//! `Retry-After` when it is shorter than the cap), and how many times to try.
//!
//! Everything else — 4xx other than those, a body that does not parse, `410 Gone` — fails at
//! once: asking again gives the same answer.

use std::time::Duration;

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
