//! Named steps, as upstream's task model: every host mutation runs as a step that logs
//! `started`, then `completed` (with its duration) or `failed`, and whose error is wrapped with
//! the step's name (`"<name>: <error>"`), so a failure says where it happened.

use std::future::Future;
use std::time::Instant;

/// An error from a named step: the step's name and the underlying error.
#[derive(Debug, thiserror::Error)]
#[error("{name}: {cause:#}")]
pub struct StepError {
    /// The step's name (`configure-os`).
    pub name: String,
    /// What failed, with its context chain (in the message, not a `source()`: see
    /// `flex_host::error`).
    pub cause: anyhow::Error,
}

/// Runs `fut` as the step `name`.
pub async fn step<T, E, F>(name: &str, fut: F) -> Result<T, StepError>
where
    F: Future<Output = Result<T, E>>,
    E: Into<anyhow::Error>,
{
    let started = Instant::now();
    tracing::info!(task = name, "started");
    match fut.await {
        Ok(v) => {
            tracing::info!(
                task = name,
                status = "ok",
                duration_ms = started.elapsed().as_millis() as u64,
                "completed"
            );
            Ok(v)
        }
        Err(e) => {
            let cause: anyhow::Error = e.into();
            tracing::error!(task = name, status = "failed", error = %format!("{cause:#}"), "failed");
            Err(StepError {
                name: name.to_string(),
                cause,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn step_wraps_errors_with_its_name() {
        let ok: Result<u8, StepError> = step("a", async { Ok::<_, std::io::Error>(1) }).await;
        assert_eq!(ok.unwrap(), 1);
        let e = step("configure-os", async {
            Err::<(), _>(anyhow::anyhow!("sysctl --system failed"))
        })
        .await
        .unwrap_err();
        assert_eq!(e.to_string(), "configure-os: sysctl --system failed");
    }
}
