//! [`FakeImages`]: a recording [`Images`] for tests of the modules that use the image store.
//!
//! Calls are recorded as lines:
//! - `pull <ref>` (with ` --plain-http` when asked),
//! - `exists <ref>`,
//! - `remove <ref>`,
//! - `run_check <ref> aks-flex-upgrade-check-<n> <args…> (timeout <secs>s)`.
//!
//! A pull makes the image exist (unless told to fail); a check of an image that does not exist
//! fails as `ctr run` would; a check prints what it was told to, or nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use super::ctr::display_args;
use super::{ContainerdError, Images, PullOptions, PulledImage, check_container_name};

/// The digest a fake pull reports for a reference without `@sha256:…`.
pub const FAKE_DIGEST: &str =
    "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// A recording fake image store (see the [module docs](self)). Clones share their state.
#[derive(Clone, Default)]
pub struct FakeImages {
    inner: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    calls: Vec<String>,
    present: BTreeSet<String>,
    failing_pulls: BTreeMap<String, String>,
    failing_checks: BTreeMap<String, (i32, String)>,
    check_outputs: BTreeMap<String, String>,
}

impl FakeImages {
    /// A store without images, on which every call succeeds.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `reference` exist.
    pub fn with_image(&self, reference: &str) -> &Self {
        self.lock().present.insert(reference.to_string());
        self
    }

    /// Makes pulls of `reference` fail with `reason`.
    pub fn fail_pull(&self, reference: &str, reason: &str) -> &Self {
        self.lock()
            .failing_pulls
            .insert(reference.to_string(), reason.to_string());
        self
    }

    /// Makes checks of `reference` exit with `code` and `stderr`.
    pub fn fail_check(&self, reference: &str, code: i32, stderr: &str) -> &Self {
        self.lock()
            .failing_checks
            .insert(reference.to_string(), (code, stderr.to_string()));
        self
    }

    /// Makes checks of `reference` print `stdout`.
    pub fn check_prints(&self, reference: &str, stdout: &str) -> &Self {
        self.lock()
            .check_outputs
            .insert(reference.to_string(), stdout.to_string());
        self
    }

    /// Whether `reference` exists now.
    pub fn has(&self, reference: &str) -> bool {
        self.lock().present.contains(reference)
    }

    /// The calls so far.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    /// The calls joined by newlines, with a trailing newline (for snapshots).
    pub fn transcript(&self) -> String {
        let mut s = self.calls().join("\n");
        s.push('\n');
        s
    }
}

#[async_trait]
impl Images for FakeImages {
    async fn pull(
        &self,
        reference: &str,
        opts: &PullOptions,
    ) -> Result<PulledImage, ContainerdError> {
        let mut st = self.lock();
        st.calls.push(format!(
            "pull {reference}{}",
            if opts.plain_http { " --plain-http" } else { "" }
        ));
        if let Some(reason) = st.failing_pulls.get(reference) {
            return Err(ContainerdError::Failed {
                image: reference.to_string(),
                step: "pull".into(),
                reason: reason.clone(),
            });
        }
        st.present.insert(reference.to_string());
        let digest = reference
            .rsplit_once('@')
            .map_or(FAKE_DIGEST, |(_, d)| d)
            .to_string();
        Ok(PulledImage {
            name: reference.to_string(),
            digest,
        })
    }

    async fn exists(&self, reference: &str) -> Result<bool, ContainerdError> {
        let mut st = self.lock();
        st.calls.push(format!("exists {reference}"));
        Ok(st.present.contains(reference))
    }

    async fn remove(&self, reference: &str) -> Result<(), ContainerdError> {
        let mut st = self.lock();
        st.calls.push(format!("remove {reference}"));
        st.present.remove(reference);
        Ok(())
    }

    async fn run_check(
        &self,
        reference: &str,
        n: u32,
        args: &[String],
        timeout: Duration,
    ) -> Result<String, ContainerdError> {
        let mut st = self.lock();
        let argv = display_args(args);
        st.calls.push(format!(
            "run_check {reference} {} {argv} (timeout {}s)",
            check_container_name(n),
            timeout.as_secs()
        ));
        if !st.present.contains(reference) {
            return Err(ContainerdError::CheckFailed {
                image: reference.to_string(),
                argv,
                exit: "exit status 1".into(),
                stderr: format!("ctr: image \"{reference}\": not found"),
            });
        }
        if let Some((code, stderr)) = st.failing_checks.get(reference) {
            return Err(ContainerdError::CheckFailed {
                image: reference.to_string(),
                argv,
                exit: format!("exit status {code}"),
                stderr: stderr.clone(),
            });
        }
        Ok(st.check_outputs.get(reference).cloned().unwrap_or_default())
    }
}
