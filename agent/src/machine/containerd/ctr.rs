//! [`CtrImages`]: the image store through `ctr`, run by the crate's [`Runner`].
//!
//! Commands (namespace [`CTR_NAMESPACE`]; `--address` only when one is set):
//! - pull: `ctr -n aks-flex images pull [--plain-http] [--snapshotter S] <ref>` (fetches,
//!   verifies and unpacks), then `ctr -n aks-flex images ls name==<ref>` for the target digest;
//! - exists: `ctr -n aks-flex images ls -q name==<ref>`;
//! - remove: `ctr -n aks-flex images rm <ref>` (`not found` is success);
//! - check: a stale container of the same name is deleted first (`tasks delete -f`,
//!   `containers delete`, failures ignored), then `ctr -n aks-flex run --rm
//!   --runc-systemd-cgroup --cgroup system-aksflex.slice:aks-flex:upgrade-check-<n> <ref>
//!   aks-flex-upgrade-check-<n> <args…>`; on timeout the container is killed and removed.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{
    AGENT_SLICE, CTR_NAMESPACE, ContainerdError, Images, PullOptions, PulledImage,
    check_container_name,
};
use flex_host::runner::{Cmd, CmdError, Runner, check_status};
use flex_oci::{Digest, ImageRef};

/// Default deadline of a pull.
pub const PULL_TIMEOUT: Duration = Duration::from_secs(600);
/// Deadline of the short `ctr` calls (list, remove, cleanup).
pub const SHORT_TIMEOUT: Duration = Duration::from_secs(60);

/// The image store through `ctr` (see the [module docs](self)).
#[derive(Clone)]
pub struct CtrImages {
    runner: Arc<dyn Runner>,
    namespace: String,
    address: Option<String>,
    snapshotter: Option<String>,
    systemd_cgroup: bool,
    pull_timeout: Duration,
}

impl CtrImages {
    /// The production store: namespace `aks-flex`, ctr's default socket and snapshotter, checks
    /// in systemd scopes.
    pub fn new(runner: Arc<dyn Runner>) -> Self {
        Self {
            runner,
            namespace: CTR_NAMESPACE.to_string(),
            address: None,
            snapshotter: None,
            systemd_cgroup: true,
            pull_timeout: PULL_TIMEOUT,
        }
    }

    /// Talks to containerd at `socket` (`ctr --address`).
    pub fn with_address(mut self, socket: impl Into<String>) -> Self {
        self.address = Some(socket.into());
        self
    }

    /// Uses another containerd namespace.
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Unpacks and runs with snapshotter `name` (`--snapshotter`) instead of containerd's
    /// default.
    pub fn with_snapshotter(mut self, name: impl Into<String>) -> Self {
        self.snapshotter = Some(name.into());
        self
    }

    /// Runs checks without `--runc-systemd-cgroup --cgroup …`: for machines without systemd
    /// (tests). Production checks always run in their scope.
    pub fn without_systemd_cgroup(mut self) -> Self {
        self.systemd_cgroup = false;
        self
    }

    /// Sets the pull's deadline.
    pub fn with_pull_timeout(mut self, timeout: Duration) -> Self {
        self.pull_timeout = timeout;
        self
    }

    /// `ctr [--address A] -n <namespace>`.
    fn ctr(&self) -> Cmd {
        let mut c = Cmd::new("ctr");
        if let Some(a) = &self.address {
            c = c.args(["--address", a.as_str()]);
        }
        c.args(["-n", self.namespace.as_str()])
            .timeout(SHORT_TIMEOUT)
    }

    fn err(image: &str, step: &'static str) -> impl FnOnce(CmdError) -> ContainerdError + use<> {
        let image = image.to_string();
        move |cause| ContainerdError::Ctr { image, step, cause }
    }

    /// The target digest of image `reference` from `ctr images ls name==<ref>`'s table.
    async fn target_digest(&self, reference: &str) -> Result<Option<String>, ContainerdError> {
        let out = self
            .runner
            .run(
                &self
                    .ctr()
                    .args(["images", "ls", &format!("name=={reference}")]),
            )
            .await
            .map_err(Self::err(reference, "list"))?;
        Ok(parse_ls_digest(&out.stdout, reference))
    }

    async fn delete_container(&self, id: &str) {
        // Best effort: an absent task or container is the normal case.
        let _ = self
            .runner
            .output(&self.ctr().args(["tasks", "delete", "-f", id]))
            .await;
        let _ = self
            .runner
            .output(&self.ctr().args(["containers", "delete", id]))
            .await;
    }
}

/// The DIGEST column of the row naming `reference` in `ctr images ls` output (`REF TYPE DIGEST
/// SIZE PLATFORMS LABELS`).
pub fn parse_ls_digest(stdout: &str, reference: &str) -> Option<String> {
    stdout.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next() == Some(reference))
            .then(|| f.nth(1))
            .flatten()
            .filter(|d| Digest::parse(d).is_ok())
            .map(str::to_string)
    })
}

/// `args` as one shell-like line (for errors).
pub fn display_args(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            if a.is_empty() || a.contains(char::is_whitespace) || a.contains('"') {
                format!("{a:?}")
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[async_trait]
impl Images for CtrImages {
    async fn pull(
        &self,
        reference: &str,
        opts: &PullOptions,
    ) -> Result<PulledImage, ContainerdError> {
        // A reference the agent cannot parse is left to ctr to judge (and refuse), unless plain
        // HTTP was asked for: then the registry must be known to be listed.
        let plain_http = match ImageRef::parse(reference) {
            Ok(image) => opts
                .plain_http_for(&image)
                .map_err(|reason| ContainerdError::Failed {
                    image: reference.to_string(),
                    step: "pull".into(),
                    reason: reason.to_string(),
                })?,
            Err(_) if !opts.plain_http => false,
            Err(e) => {
                return Err(ContainerdError::Failed {
                    image: reference.to_string(),
                    step: "parse reference".into(),
                    reason: e.to_string(),
                });
            }
        };
        let mut cmd = self.ctr().args(["images", "pull"]);
        if plain_http {
            cmd = cmd.arg("--plain-http");
        }
        if let Some(s) = &self.snapshotter {
            cmd = cmd.args(["--snapshotter", s.as_str()]);
        }
        let cmd = cmd.arg(reference).timeout(self.pull_timeout);
        tracing::info!(image = reference, "pulling with ctr");
        self.runner
            .run(&cmd)
            .await
            .map_err(Self::err(reference, "pull"))?;
        let digest =
            self.target_digest(reference)
                .await?
                .ok_or_else(|| ContainerdError::Failed {
                    image: reference.to_string(),
                    step: "list".into(),
                    reason: "pulled, but `ctr images ls` does not list it".into(),
                })?;
        if let Some((_, pinned)) = reference.rsplit_once('@')
            && pinned != digest
        {
            return Err(ContainerdError::Failed {
                image: reference.to_string(),
                step: "verify".into(),
                reason: format!("containerd's image targets {digest}, not {pinned}"),
            });
        }
        Ok(PulledImage {
            name: reference.to_string(),
            digest,
        })
    }

    async fn exists(&self, reference: &str) -> Result<bool, ContainerdError> {
        let out = self
            .runner
            .run(
                &self
                    .ctr()
                    .args(["images", "ls", "-q", &format!("name=={reference}")]),
            )
            .await
            .map_err(Self::err(reference, "list"))?;
        Ok(out.stdout.lines().any(|l| l.trim() == reference))
    }

    async fn remove(&self, reference: &str) -> Result<(), ContainerdError> {
        let cmd = self.ctr().args(["images", "rm", reference]);
        let out = self
            .runner
            .output(&cmd)
            .await
            .map_err(Self::err(reference, "remove"))?;
        if !out.success() && out.stderr.contains("not found") {
            return Ok(());
        }
        check_status(&cmd, out).map_err(Self::err(reference, "remove"))?;
        Ok(())
    }

    async fn run_check(
        &self,
        reference: &str,
        n: u32,
        args: &[String],
        timeout: Duration,
    ) -> Result<String, ContainerdError> {
        let id = check_container_name(n);
        self.delete_container(&id).await;
        let mut cmd = self.ctr().args(["run", "--rm"]);
        if let Some(s) = &self.snapshotter {
            cmd = cmd.args(["--snapshotter", s.as_str()]);
        }
        if self.systemd_cgroup {
            cmd = cmd.args([
                "--runc-systemd-cgroup".to_string(),
                "--cgroup".to_string(),
                format!("{AGENT_SLICE}:aks-flex:upgrade-check-{n}"),
            ]);
        }
        let cmd = cmd
            .args([reference, id.as_str()])
            .args(args.iter().cloned())
            .timeout(timeout);
        let argv = display_args(args);
        tracing::info!(image = reference, container = %id, argv = %argv, "running check");
        let mut ran = self.runner.output(&cmd).await;
        if matches!(&ran, Ok(out) if out.success() && out.stdout.is_empty()) {
            // containerd can drop the output of a process that exits right after printing
            // (see `Images::run_check`): one more run tells a lost output from a silent check.
            tracing::info!(image = reference, container = %id, "the check printed nothing; running it once more");
            self.delete_container(&id).await;
            ran = self.runner.output(&cmd).await;
        }
        match ran {
            Ok(out) if out.success() => Ok(out.stdout),
            Ok(out) => Err(ContainerdError::CheckFailed {
                image: reference.to_string(),
                argv,
                exit: out
                    .code
                    .map_or("killed by signal".into(), |c| format!("exit status {c}")),
                stderr: out.stderr.trim().to_string(),
            }),
            Err(CmdError::Timeout { after, .. }) => {
                self.delete_container(&id).await;
                Err(ContainerdError::CheckTimeout {
                    image: reference.to_string(),
                    argv,
                    after,
                })
            }
            Err(e) => Err(Self::err(reference, "run check")(e)),
        }
    }
}
