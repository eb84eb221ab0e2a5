//! The one retry/backoff of the workspace: [`Backoff`] says how many attempts and how long to
//! wait between them (doubling from `initial` to `max`, or a server's `Retry-After` when it is
//! shorter), [`retry`] runs an attempt until it succeeds, fails for good, or runs out of
//! attempts, and [`wait_until`] polls a condition until a deadline and names the last value it
//! saw when the deadline passes.
//!
//! Whether a failure is worth another attempt is the caller's typed decision ([`Attempt`]),
//! never a reading of the error's text.
//!
//! Every retry with a growing wait in the workspace takes its waits from [`Backoff`]: through
//! [`retry`] (component downloads, the registry client, the Azure credentials, the harness's ACL
//! download), or a loop of the caller's own over [`Backoff::delay`] where it must also watch
//! something else (the machine clients, the daemon's work queue and its wait for the cluster at
//! start, CSR creation, certificate rotation, the runner's `ETXTBSY` retry). Waits for a
//! state to be reached use [`wait_until`] (the harness's waits for the guest). The machine steps
//! of the agent's `machine::nspawn` (readiness, poweroff, removal) poll and retry at the fixed
//! intervals of their own `Timings`, without backoff.

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

/// Attempts and waits: `initial`, doubling per failed attempt, at most `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Attempts in all (at least 1 is always made).
    pub attempts: u32,
    /// The wait after the first failed attempt.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Default for Backoff {
    /// 5 attempts, 500 ms doubling to 8 s (about 15 s of waiting in all).
    fn default() -> Self {
        Self {
            attempts: 5,
            initial: Duration::from_millis(500),
            max: Duration::from_secs(8),
        }
    }
}

impl Backoff {
    /// `attempts` attempts, waiting `initial` doubling up to `max`.
    pub const fn new(attempts: u32, initial: Duration, max: Duration) -> Self {
        Self {
            attempts,
            initial,
            max,
        }
    }

    /// A single attempt.
    pub const fn none() -> Self {
        Self::new(1, Duration::ZERO, Duration::ZERO)
    }

    /// Attempts in all, at least 1.
    pub fn max_attempts(&self) -> u32 {
        self.attempts.max(1)
    }

    /// The wait after failed attempt `attempt` (1-based): `initial · 2^(attempt-1)`, at most
    /// `max`; a server's `retry_after` wins when given (also capped at `max`).
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(d) = retry_after {
            return d.min(self.max);
        }
        let exp = attempt.saturating_sub(1).min(31);
        self.initial.saturating_mul(1u32 << exp).min(self.max)
    }
}

/// What one attempt's failure means for the next one.
#[derive(Debug)]
pub enum Attempt<E> {
    /// Another attempt may succeed (a transport error, a 503, a busy file); wait at least
    /// `after` when the peer said so.
    Retry {
        /// The failure.
        error: E,
        /// The peer's `Retry-After`, if any.
        after: Option<Duration>,
    },
    /// Asking again gives the same answer.
    Fatal(E),
}

impl<E> Attempt<E> {
    /// A failure worth another attempt.
    pub fn retry(error: E) -> Self {
        Self::Retry { error, after: None }
    }

    /// The failure, whatever its kind.
    pub fn into_error(self) -> E {
        match self {
            Self::Retry { error, .. } | Self::Fatal(error) => error,
        }
    }
}

/// Runs `attempt` (given the 1-based attempt number) until it succeeds, fails with
/// [`Attempt::Fatal`], or `backoff`'s attempts are used up; returns the last error then. Each
/// retry is logged as a warning with the wait.
pub async fn retry<T, E, F, Fut>(what: &str, backoff: Backoff, mut attempt: F) -> Result<T, E>
where
    E: fmt::Display,
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, Attempt<E>>>,
{
    let attempts = backoff.max_attempts();
    let mut n = 1;
    loop {
        match attempt(n).await {
            Ok(v) => return Ok(v),
            Err(Attempt::Retry { error, after }) if n < attempts => {
                let wait = backoff.delay(n, after);
                tracing::warn!(what, attempt = n, of = attempts, wait_ms = wait.as_millis() as u64, error = %error, "failed, retrying");
                tokio::time::sleep(wait).await;
                n += 1;
            }
            Err(e) => return Err(e.into_error()),
        }
    }
}

/// [`wait_until`] ran out of time: how long it waited and what it saw last.
#[derive(Debug, thiserror::Error)]
#[error("{what}: not reached after {waited:?} (last seen: {last_seen})")]
pub struct WaitTimeout {
    /// What was waited for.
    pub what: String,
    /// How long it waited.
    pub waited: Duration,
    /// The last observation, as the probe described it.
    pub last_seen: String,
}

/// Polls `probe` every `poll` until it returns `Ok(value)` or `timeout` passes. A probe returns
/// `Err(description)` while the condition does not hold; the description of the last one is in
/// the error, so a timeout says what was seen rather than only that time ran out. The probe is
/// always asked at least once, and once more at the deadline.
pub async fn wait_until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    poll: Duration,
    mut probe: F,
) -> Result<T, WaitTimeout>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    let deadline = start + timeout;
    loop {
        let last_seen = match probe().await {
            Ok(v) => return Ok(v),
            Err(seen) => seen,
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(WaitTimeout {
                what: what.to_string(),
                waited: now.duration_since(start),
                last_seen,
            });
        }
        tokio::time::sleep(poll.min(deadline - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn delay_doubles_to_the_cap_and_honours_retry_after() {
        let b = Backoff::new(5, Duration::from_millis(500), Duration::from_secs(8));
        let waits: Vec<u128> = (1..=7).map(|n| b.delay(n, None).as_millis()).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 8000, 8000]);
        assert_eq!(
            b.delay(1, Some(Duration::from_secs(3))),
            Duration::from_secs(3)
        );
        assert_eq!(
            b.delay(1, Some(Duration::from_secs(60))),
            Duration::from_secs(8)
        );
        // No overflow for absurd attempt numbers.
        assert_eq!(b.delay(u32::MAX, None), Duration::from_secs(8));
        assert_eq!(Backoff::none().max_attempts(), 1);
        assert_eq!(
            Backoff::new(0, Duration::ZERO, Duration::ZERO).max_attempts(),
            1
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retry_stops_on_success_on_fatal_and_after_the_last_attempt() {
        let b = Backoff::new(3, Duration::from_millis(10), Duration::from_millis(40));
        let calls = AtomicU32::new(0);
        let ok: Result<u32, String> = retry("t", b, |n| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 2 {
                    Err(Attempt::retry(format!("busy {n}")))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(ok, Ok(2));
        assert_eq!(calls.swap(0, Ordering::SeqCst), 2);

        let fatal: Result<(), String> = retry("t", b, |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(Attempt::Fatal("404".to_string())) }
        })
        .await;
        assert_eq!(fatal, Err("404".to_string()));
        assert_eq!(calls.swap(0, Ordering::SeqCst), 1);

        let exhausted: Result<(), String> = retry("t", b, |n| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move { Err(Attempt::retry(format!("busy {n}"))) }
        })
        .await;
        assert_eq!(exhausted, Err("busy 3".to_string()));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_until_returns_the_value_or_names_the_last_observation() {
        let n = AtomicU32::new(0);
        let v = wait_until(
            "three",
            Duration::from_secs(5),
            Duration::from_millis(100),
            || {
                let seen = n.fetch_add(1, Ordering::SeqCst);
                async move {
                    if seen >= 3 {
                        Ok(seen)
                    } else {
                        Err(format!("count {seen}"))
                    }
                }
            },
        )
        .await
        .unwrap();
        assert_eq!(v, 3);

        let e = wait_until(
            "never",
            Duration::from_secs(1),
            Duration::from_millis(300),
            || async { Err::<(), _>("state inactive".to_string()) },
        )
        .await
        .unwrap_err();
        assert_eq!(e.last_seen, "state inactive");
        assert!(e.waited >= Duration::from_secs(1), "{e}");
        assert!(e.to_string().starts_with("never: not reached after"), "{e}");
    }
}
