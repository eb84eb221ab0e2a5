//! The agent's image store in the host's containerd, for AgentUpgrade in the container.
//!
//! An AgentUpgrade names an image by a fully qualified reference pinned by digest (validated
//! by the caller). [`Images`] pulls it into the containerd namespace of the agent's containers
//! ([`CTR_NAMESPACE`], `aks-flex`), says whether containerd has it, removes it, and runs a
//! command in a short-lived container of it ([`Images::run_check`]): the check that the new
//! image's agent runs before a unit is switched to it.
//!
//! Implementations:
//! - [`CtrImages`] ([`ctr`](mod@ctr)): `ctr -n aks-flex images pull|ls|rm` and `ctr run`
//!   through the crate's [`Runner`]. In the agent's container the runner resolves `ctr` to
//!   `host-exec` (the host's `ctr` under `chroot /host`), so this works there unchanged.
//! - [`GrpcImages`] ([`grpc`]): containerd's API over the host's socket
//!   ([`CONTAINERD_SOCKET`]) with the `containerd-client` crate. containerd 1.6 (what hosts run)
//!   has no server-side pull, so the pull is done client-side as `ctr` does it: the manifest is
//!   resolved with the agent's own registry client ([`flex_oci::RegistryClient`]), each blob
//!   written into the content store under a lease (containerd verifies digest and size on
//!   commit), the garbage-collection labels `ctr` sets are set, the layers are unpacked into the
//!   snapshotter (overlayfs by default) under their chain IDs, and the image record is created
//!   or updated, so that a later `ctr run <ref>` starts without pulling. `run_check` delegates
//!   to `ctr run` (running a container through the API means building the OCI runtime spec,
//!   the container record, the task, its I/O FIFOs and waiting for its exit: much more code
//!   for no gain here).
//! - [`host_images`]: [`GrpcImages`] when the socket answers a `Version` call, else
//!   [`CtrImages`]; when a gRPC call then fails for a transport reason, that call is retried
//!   with `ctr` ([`HostImages`]). Which path is taken is logged at `warn` when it is `ctr`.
//! - `FakeImages` (`fake`, test code only): a recording fake for other modules' tests.
//!
//! Every error ([`ContainerdError`]) names the image and the failing step. Both stores run
//! against a real containerd and registry in `tests/tests/containerd_pull.rs`.

pub mod ctr;
#[cfg(test)]
pub(crate) mod fake;
pub mod grpc;
pub mod tasks;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use flex_host::http::{INSECURE_REGISTRIES_ENV, InsecureRegistries, InsecureRegistryError};
use flex_host::runner::{CmdError, Runner};
use flex_oci::{ImageRef, OciError};

pub use crate::systemd::CTR_NAMESPACE;
pub use ctr::CtrImages;
#[cfg(test)]
pub(crate) use fake::FakeImages;
pub use grpc::GrpcImages;

/// The host's containerd socket (`/run` is bind-mounted into the agent's container).
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";

/// The settings key holding extra `ctr images pull` flags (`--plain-http`).
pub const PULL_ARGS_KEY: &str = "AKS_FLEX_NODE_PULL_ARGS";

/// The slice the agent's containers run in.
pub const AGENT_SLICE: &str = "system-aksflex.slice";

/// The name of check container `n`: `aks-flex-upgrade-check-<n>`; its scope is
/// `aks-flex-upgrade-check-<n>.scope` under [`AGENT_SLICE`].
pub fn check_container_name(n: u32) -> String {
    format!("aks-flex-upgrade-check-{n}")
}

/// How images are pulled: read from the host's settings file
/// ([`crate::systemd::CONTAINER_SETTINGS`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PullOptions {
    /// `--plain-http` among [`PULL_ARGS_KEY`]'s flags (what the boot units pass to `ctr`). For
    /// the agent's own pulls it is honoured only for a registry in
    /// [`PullOptions::insecure_registries`]; for any other it is an error.
    pub plain_http: bool,
    /// [`flex_host::http::INSECURE_REGISTRIES_ENV`]: the registries pulled over plain HTTP (the
    /// explicit opt-in); every other registry is HTTPS.
    pub insecure_registries: InsecureRegistries,
}

impl PullOptions {
    /// Reads `AKS_FLEX_NODE_PULL_ARGS=…` and `AKS_FLEX_NODE_INSECURE_REGISTRIES=…` from the
    /// settings file's text: `KEY=VALUE` lines, the value optionally in single or double
    /// quotes; blank lines and `#` comments are skipped and a later assignment wins.
    /// `--plain-http` among the (whitespace-separated) flags sets [`PullOptions::plain_http`];
    /// other flags are logged and ignored. The registries are `host[:port]`, comma-separated; a
    /// wrong entry is an error naming the variable.
    pub fn from_settings(env_file_text: &str) -> Result<Self, InsecureRegistryError> {
        let mut args = None;
        let mut insecure = None;
        for line in env_file_text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let line = line.strip_prefix("export ").unwrap_or(line);
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            match key.trim() {
                PULL_ARGS_KEY => args = Some(unquote(value.trim()).to_string()),
                INSECURE_REGISTRIES_ENV => insecure = Some(unquote(value.trim()).to_string()),
                _ => {}
            }
        }
        let mut opts = Self {
            insecure_registries: InsecureRegistries::parse(
                INSECURE_REGISTRIES_ENV,
                insecure.as_deref().unwrap_or(""),
            )?,
            ..Self::default()
        };
        for flag in args.as_deref().unwrap_or("").split_whitespace() {
            match flag {
                "--plain-http" | "--plain-http=true" => opts.plain_http = true,
                "--plain-http=false" => opts.plain_http = false,
                other => tracing::warn!(flag = other, "{PULL_ARGS_KEY}: ignoring unknown flag"),
            }
        }
        Ok(opts)
    }

    /// Whether `image` is pulled over plain HTTP: exactly when its registry is in
    /// [`PullOptions::insecure_registries`], with a warning naming it. `--plain-http` for a
    /// registry that is not listed is refused (the reason is returned; the stores report it as
    /// a [`ContainerdError::Failed`] at step `pull`) rather than silently ignored or obeyed.
    pub fn plain_http_for(&self, image: &ImageRef) -> Result<bool, PlainHttpRefused> {
        let registry = image.api_host();
        if self.insecure_registries.allows(registry) {
            tracing::warn!(
                registry,
                image = %image,
                "pull over plain HTTP: the registry is listed in {INSECURE_REGISTRIES_ENV}; its \
                 content is not protected in transit (digests are still verified)"
            );
            return Ok(true);
        }
        if self.plain_http {
            return Err(PlainHttpRefused(registry.to_string()));
        }
        Ok(false)
    }
}

/// `--plain-http` asked for a registry (named) that the insecure registries do not list.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{PULL_ARGS_KEY} asks for plain HTTP, but {0} is not listed in {INSECURE_REGISTRIES_ENV}")]
pub struct PlainHttpRefused(pub String);

fn unquote(v: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = v.strip_prefix(q).and_then(|s| s.strip_suffix(q)) {
            return inner;
        }
    }
    v
}

/// An image in containerd after a pull.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PulledImage {
    /// The image record's name: the reference as given.
    pub name: String,
    /// The image's target digest (the manifest or index the reference pins).
    pub digest: String,
}

/// Why an image operation failed. Every variant names the image and the failing step.
#[derive(Debug, thiserror::Error)]
pub enum ContainerdError {
    /// A `ctr` command failed (its argv and stderr are in the cause).
    #[error("image {image}: {step}: {cause}")]
    Ctr {
        /// The image reference.
        image: String,
        /// The failing step (`pull`, `list`, `remove`, ...).
        step: &'static str,
        /// The command's failure (in the message, not a `source()`).
        cause: CmdError,
    },
    /// A containerd API call failed.
    #[error("image {image}: {step}: containerd {call}: {code}: {message}")]
    Api {
        /// The image reference.
        image: String,
        /// The failing step (`write layer sha256:…`, `unpack`, ...).
        step: String,
        /// The gRPC method (`content.Write`, ...).
        call: &'static str,
        /// The gRPC status code, as text.
        code: String,
        /// containerd's message (or the transport's).
        message: String,
        /// Whether the call failed in the transport (connection refused, reset, ...), not in
        /// containerd.
        transport: bool,
    },
    /// containerd's socket could not be reached.
    #[error("containerd at {socket}: {reason}")]
    Connect {
        /// The socket path.
        socket: String,
        /// What went wrong.
        reason: String,
    },
    /// The registry failed (the cause names the URL or digest).
    #[error("image {image}: {step}: {cause}")]
    Registry {
        /// The image reference.
        image: String,
        /// The failing step (`resolve`, `download layer`, ...).
        step: &'static str,
        /// The registry client's error (in the message, not a `source()`).
        cause: OciError,
    },
    /// Anything else: an invalid reference or document, an unexpected answer.
    #[error("image {image}: {step}: {reason}")]
    Failed {
        /// The image reference.
        image: String,
        /// The failing step.
        step: String,
        /// What went wrong.
        reason: String,
    },
    /// The check container exited non-zero (or `ctr run` itself failed).
    #[error(
        "image {image}: check `{argv}` failed: {exit}{}",
        stderr_suffix(stderr)
    )]
    CheckFailed {
        /// The image reference.
        image: String,
        /// The command run in the container, shell-like.
        argv: String,
        /// `exit status N` or `killed by signal`.
        exit: String,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// The check container did not finish in time (it was killed and removed).
    #[error("image {image}: check `{argv}` timed out after {after:?}")]
    CheckTimeout {
        /// The image reference.
        image: String,
        /// The command run in the container, shell-like.
        argv: String,
        /// The timeout.
        after: Duration,
    },
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!(": {stderr}")
    }
}

impl ContainerdError {
    /// Whether containerd could not be reached at all (socket missing, connection refused or
    /// broken): what [`HostImages`] falls back to `ctr` for.
    pub fn is_transport(&self) -> bool {
        matches!(
            self,
            ContainerdError::Connect { .. }
                | ContainerdError::Api {
                    transport: true,
                    ..
                }
        )
    }
}

/// The agent's images in containerd (namespace [`CTR_NAMESPACE`]).
#[async_trait]
pub trait Images: Send + Sync {
    /// Pulls `reference` (fetch, verify, unpack) and returns the image record's name and target
    /// digest.
    async fn pull(
        &self,
        reference: &str,
        opts: &PullOptions,
    ) -> Result<PulledImage, ContainerdError>;

    /// Whether containerd has an image record named `reference`.
    async fn exists(&self, reference: &str) -> Result<bool, ContainerdError>;

    /// Removes the image record `reference` (containerd collects its content); an absent image
    /// is not an error.
    async fn remove(&self, reference: &str) -> Result<(), ContainerdError>;

    /// Runs `args` in a short-lived container of `reference` named `aks-flex-upgrade-check-<n>`,
    /// in scope `aks-flex-upgrade-check-<n>.scope` under `system-aksflex.slice` (ctr flags:
    /// `--rm --runc-systemd-cgroup --cgroup system-aksflex.slice:aks-flex:upgrade-check-<n>`),
    /// with a timeout; returns its stdout; a non-zero exit is an error naming the image, argv,
    /// exit and stderr ([`ContainerdError::CheckFailed`]), a timeout kills and removes the
    /// container ([`ContainerdError::CheckTimeout`]). A check that succeeds with no output at
    /// all is run once more: containerd can lose the output of a process that exits right
    /// after printing (containerd/containerd#770, concourse/concourse#6775; seen here under
    /// load), so a check must be idempotent.
    async fn run_check(
        &self,
        reference: &str,
        n: u32,
        args: &[String],
        timeout: Duration,
    ) -> Result<String, ContainerdError>;
}

/// [`GrpcImages`] with [`CtrImages`] as the fallback for calls that fail in the transport.
pub struct HostImages {
    grpc: GrpcImages,
    ctr: CtrImages,
}

impl HostImages {
    /// Both paths; the gRPC one is tried first.
    pub fn new(grpc: GrpcImages, ctr: CtrImages) -> Self {
        Self { grpc, ctr }
    }
}

fn warn_fallback(what: &str, reference: &str, e: &ContainerdError) {
    tracing::warn!(
        image = reference,
        error = %e,
        "{what}: containerd's API failed in the transport; using ctr"
    );
}

#[async_trait]
impl Images for HostImages {
    async fn pull(
        &self,
        reference: &str,
        opts: &PullOptions,
    ) -> Result<PulledImage, ContainerdError> {
        match self.grpc.pull(reference, opts).await {
            Err(e) if e.is_transport() => {
                warn_fallback("pull", reference, &e);
                self.ctr.pull(reference, opts).await
            }
            r => r,
        }
    }

    async fn exists(&self, reference: &str) -> Result<bool, ContainerdError> {
        match self.grpc.exists(reference).await {
            Err(e) if e.is_transport() => {
                warn_fallback("exists", reference, &e);
                self.ctr.exists(reference).await
            }
            r => r,
        }
    }

    async fn remove(&self, reference: &str) -> Result<(), ContainerdError> {
        match self.grpc.remove(reference).await {
            Err(e) if e.is_transport() => {
                warn_fallback("remove", reference, &e);
                self.ctr.remove(reference).await
            }
            r => r,
        }
    }

    async fn run_check(
        &self,
        reference: &str,
        n: u32,
        args: &[String],
        timeout: Duration,
    ) -> Result<String, ContainerdError> {
        self.ctr.run_check(reference, n, args, timeout).await
    }
}

/// The agent's image store on this host: [`GrpcImages`] over [`CONTAINERD_SOCKET`] when it
/// answers, with [`CtrImages`] over `runner` as the fallback (see [`HostImages`]).
pub async fn host_images(
    runner: Arc<dyn Runner>,
    credentials: Option<Arc<dyn flex_oci::CredentialSource>>,
) -> Arc<dyn Images> {
    host_images_at(runner, Path::new(CONTAINERD_SOCKET), credentials).await
}

/// [`host_images`] for another socket (tests); `ctr` uses its default address unless the socket
/// is not [`CONTAINERD_SOCKET`], in which case it is passed with `--address`. The registry
/// client answers registries that ask for credentials from `credentials`
/// ([`crate::machine::registry_auth`]); `ctr`, the fallback, pulls anonymously.
pub async fn host_images_at(
    runner: Arc<dyn Runner>,
    socket: &Path,
    credentials: Option<Arc<dyn flex_oci::CredentialSource>>,
) -> Arc<dyn Images> {
    let mut ctr = CtrImages::new(runner);
    if socket != Path::new(CONTAINERD_SOCKET) {
        ctr = ctr.with_address(socket.to_string_lossy());
    }
    let registry = match flex_host::http::client() {
        Ok(http) => match credentials {
            Some(c) => flex_oci::RegistryClient::new(http).with_credentials(c),
            None => flex_oci::RegistryClient::new(http),
        },
        Err(e) => {
            tracing::warn!(error = %e, "image store: no HTTP client for the registry; using ctr");
            return Arc::new(ctr);
        }
    };
    match GrpcImages::connect(socket, registry, ctr.clone()).await {
        Ok(grpc) => {
            tracing::info!(socket = %socket.display(), "image store: containerd's API");
            Arc::new(HostImages::new(grpc, ctr))
        }
        Err(e) => {
            tracing::warn!(error = %e, "image store: containerd's API is not available; using ctr");
            Arc::new(ctr)
        }
    }
}

#[cfg(test)]
mod tests;
