//! Retries with exponential backoff for the machine clients: which failures can succeed later
//! (transport errors, timeouts, 408, 409, 429, 500, 502, 503, 504), how long to wait (doubling
//! from the backoff's `initial` up to its `max`, or the server's
//! `Retry-After` when it is shorter than the cap), and how many times to try.
//!
//! Everything else — 4xx other than those, a body that does not parse, `410 Gone` — fails at
//! once: asking again gives the same answer.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use flex_host::retry::{Attempt, Backoff, retry};

/// One attempt of an HTTP exchange, as the machine clients see it.
#[derive(Debug)]
pub enum Tried<R> {
    /// The server answered: `reply` with `status` (and its `Retry-After`); `summary` says what
    /// it answered for the log.
    Answer {
        /// The answer's status.
        status: u16,
        /// Its `Retry-After`, if any.
        retry_after: Option<Duration>,
        /// The answer.
        reply: R,
        /// Status and a snippet of the body, for the log.
        summary: String,
    },
    /// An outcome to return at once, without another attempt (a body that cannot be read).
    Final(R),
    /// No answer (connection, timeout): worth another attempt.
    Transport(String),
}

/// How a retried exchange ended without an answer: the last transport failure and the
/// attempts made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoAnswer {
    /// The last failure.
    pub cause: String,
    /// Attempts made.
    pub attempts: u32,
}

/// What a failed attempt carries through [`retry`]: the answer with a retryable status, or
/// the transport failure.
enum Failed<R> {
    Answer(R, String),
    Transport(String, u32),
}

impl<R> fmt::Display for Failed<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Answer(_, summary) => f.write_str(summary),
            Self::Transport(cause, _) => f.write_str(cause),
        }
    }
}

/// Runs `send` (given the 1-based attempt number) under `backoff` with the workspace's one
/// retry ([`flex_host::retry::retry`]): a transport failure and an answer with a
/// [`retryable_status`] are tried again (after the server's `Retry-After` when it gave one);
/// any other answer is returned at once, and so is the last answer when the attempts run out,
/// so the caller decides on its status. `Err` only when the last attempt got no answer.
pub async fn exchange<R, F, Fut>(what: &str, backoff: Backoff, mut send: F) -> Result<R, NoAnswer>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Tried<R>>,
{
    let sent = retry(what, backoff, |n| {
        let attempt = send(n);
        async move {
            match attempt.await {
                Tried::Answer {
                    status,
                    retry_after,
                    reply,
                    summary,
                } if retryable_status(status) => Err(Attempt::Retry {
                    error: Failed::Answer(reply, summary),
                    after: retry_after,
                }),
                Tried::Answer { reply, .. } | Tried::Final(reply) => Ok(reply),
                Tried::Transport(cause) => Err(Attempt::retry(Failed::Transport(cause, n))),
            }
        }
    })
    .await;
    match sent {
        Ok(reply) | Err(Failed::Answer(reply, _)) => Ok(reply),
        Err(Failed::Transport(cause, attempts)) => Err(NoAnswer { cause, attempts }),
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
    use std::sync::Mutex;

    /// [`super::exchange`] with scripted attempts (no network): retryable answers and
    /// transport failures are retried, the server's Retry-After is honoured, the last answer
    /// comes back as an answer, a final transport failure as [`super::NoAnswer`].
    #[tokio::test(start_paused = true)]
    async fn exchange_retries_answers_and_failures_and_returns_the_last_answer() {
        use super::{Backoff, NoAnswer, Tried, exchange};
        let b = Backoff::new(
            3,
            std::time::Duration::from_secs(1),
            std::time::Duration::from_secs(8),
        );
        let script = |steps: Vec<Option<u16>>| {
            let steps = Mutex::new(steps.into_iter());
            move |n: u32| {
                let step = steps.lock().unwrap().next().flatten();
                async move {
                    match step {
                        Some(status) => Tried::Answer {
                            status,
                            retry_after: None,
                            reply: (status, n),
                            summary: format!("status {status}"),
                        },
                        None => Tried::Transport(format!("refused on {n}")),
                    }
                }
            }
        };
        let t = tokio::time::Instant::now();
        assert_eq!(
            exchange("t", b, script(vec![None, Some(503), Some(200)])).await,
            Ok((200, 3))
        );
        assert_eq!(
            t.elapsed(),
            std::time::Duration::from_secs(3),
            "1 s then 2 s"
        );
        assert_eq!(
            exchange("t", b, script(vec![Some(404)])).await,
            Ok((404, 1))
        );
        assert_eq!(
            exchange("t", b, script(vec![Some(503), Some(429), Some(503)])).await,
            Ok((503, 3))
        );
        assert_eq!(
            exchange("t", b, script(vec![Some(503), None, None])).await,
            Err(NoAnswer {
                cause: "refused on 3".into(),
                attempts: 3
            })
        );
    }

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
