//! The one way this project runs external commands.
//!
//! Every host command the agent issues is a [`Cmd`]: a bare program name (resolved on `PATH`,
//! exactly as the upstream agent runs it, so a containerised agent can shadow the names with
//! `host-exec`), its arguments, optional extra environment and a timeout. A [`Runner`] executes
//! it. [`ProcessRunner`] is the real implementation on `tokio::process`; the recording fake is
//! `flex_testkit::FakeRunner`. [`run_inherited`] runs a command with the caller's terminal (for
//! tooling that streams its output: xtask, the harness's binary).
//!
//! This module is the only place a process starts: `clippy.toml`'s `disallowed-methods` bans
//! `std::process::Command::new` and `tokio::process::Command::new` everywhere else; each
//! exception is an `#[allow]` at its call (the agent's build script, the `exec(2)` of host-exec
//! and of the image's entrypoint, tests that need a child's handle or PID).
//!
//! Guarantees of [`ProcessRunner`]:
//! - each call runs inside a `tracing` span named `cmd` carrying the (redacted) argv;
//! - each call has a deadline ([`Cmd::timeout`], default [`DEFAULT_TIMEOUT`]); on expiry the child
//!   is killed and [`CmdError::Timeout`] is returned;
//! - every error carries the full argv (secrets redacted) and, for a non-zero exit, the captured
//!   stderr;
//! - an `execve` that fails with `ETXTBSY` (a binary this process just wrote) is retried with a
//!   10 ms delay doubling to 100 ms, within a 1 s budget.

use std::fmt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::AsyncWriteExt;
use tracing::Instrument;

/// Timeout applied when a [`Cmd`] does not set one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// What a redacted argument is shown as.
pub const REDACTED: &str = "***REDACTED***";

/// One argument of a command; secret arguments never appear in logs or errors.
#[derive(Clone, PartialEq, Eq)]
pub struct Arg {
    value: String,
    secret: bool,
}

impl Arg {
    /// The real value, for handing to the process.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Whether this argument is a secret.
    pub fn is_secret(&self) -> bool {
        self.secret
    }
}

impl fmt::Debug for Arg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.secret {
            f.write_str(REDACTED)
        } else {
            write!(f, "{:?}", self.value)
        }
    }
}

/// A command to run: program name, arguments, environment additions, stdin and a timeout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cmd {
    program: String,
    args: Vec<Arg>,
    env: Vec<(String, String)>,
    stdin: Option<Vec<u8>>,
    timeout: Duration,
}

impl Cmd {
    /// A command for `program`, a bare name looked up on `PATH` (or an absolute path).
    pub fn new(program: impl Into<String>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            stdin: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(Arg {
            value: arg.into(),
            secret: false,
        });
        self
    }

    /// Appends several arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        for a in args {
            self = self.arg(a);
        }
        self
    }

    /// Appends an argument that is shown as [`REDACTED`] everywhere but in the process itself.
    pub fn secret_arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(Arg {
            value: arg.into(),
            secret: true,
        });
        self
    }

    /// Adds an environment variable for the child (the rest of the environment is inherited).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Feeds `data` to the child's standard input.
    pub fn stdin(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(data.into());
        self
    }

    /// Sets the deadline for this call.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The program name as given.
    pub fn program(&self) -> &str {
        &self.program
    }

    /// The arguments.
    pub fn arg_list(&self) -> &[Arg] {
        &self.args
    }

    /// Extra environment variables.
    pub fn env_list(&self) -> &[(String, String)] {
        &self.env
    }

    /// The configured timeout.
    pub fn timeout_value(&self) -> Duration {
        self.timeout
    }

    /// Standard input data, if any.
    pub fn stdin_data(&self) -> Option<&[u8]> {
        self.stdin.as_deref()
    }

    /// The argv as a single shell-like line with secrets redacted: what logs and errors show.
    pub fn display_argv(&self) -> String {
        let mut out = self.program.clone();
        for a in &self.args {
            out.push(' ');
            if a.secret {
                out.push_str(REDACTED);
            } else if a.value.is_empty() || a.value.contains(char::is_whitespace) {
                out.push_str(&format!("{:?}", a.value));
            } else {
                out.push_str(&a.value);
            }
        }
        out
    }
}

impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display_argv())
    }
}

/// The result of a command that ran to completion (whatever its exit status).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output {
    /// Exit code; `None` when the process was killed by a signal.
    pub code: Option<i32>,
    /// Captured standard output.
    pub stdout: String,
    /// Captured standard error.
    pub stderr: String,
}

impl Output {
    /// An output with exit code 0 and the given stdout.
    pub fn ok(stdout: impl Into<String>) -> Self {
        Self {
            code: Some(0),
            stdout: stdout.into(),
            stderr: String::new(),
        }
    }

    /// An output with the given exit code and stderr.
    pub fn failed(code: i32, stderr: impl Into<String>) -> Self {
        Self {
            code: Some(code),
            stdout: String::new(),
            stderr: stderr.into(),
        }
    }

    /// Whether the exit status was 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// Standard output with trailing newlines removed.
    pub fn stdout_trimmed(&self) -> &str {
        self.stdout.trim_end_matches(['\n', '\r'])
    }
}

/// Why a command failed. Every variant names the full (redacted) argv.
#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    /// The process could not be started.
    #[error("{argv}: cannot start: {cause}")]
    Spawn {
        /// Redacted argv.
        argv: String,
        /// The OS error (in the message, not a `source()`: see [`crate::error`]).
        cause: std::io::Error,
    },
    /// The process did not finish within its timeout and was killed.
    #[error("{argv}: timed out after {after:?}")]
    Timeout {
        /// Redacted argv.
        argv: String,
        /// The timeout that expired.
        after: Duration,
    },
    /// The process exited non-zero (or was killed by a signal).
    #[error("{argv} failed: {status}{}", stderr_suffix(stderr))]
    Failed {
        /// Redacted argv.
        argv: String,
        /// Exit status description (`exit status 1`, `killed by signal`).
        status: String,
        /// Exit code, if any.
        code: Option<i32>,
        /// Captured standard error, trimmed.
        stderr: String,
    },
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!(": {stderr}")
    }
}

impl CmdError {
    /// The exit code for [`CmdError::Failed`].
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            CmdError::Failed { code, .. } => *code,
            _ => None,
        }
    }
}

/// Runs commands. Implementations: [`ProcessRunner`] and the fake in [`crate::testing`].
#[async_trait]
pub trait Runner: Send + Sync {
    /// Runs `cmd` to completion and returns its output whatever the exit status. Errors only when
    /// the command could not be started or timed out.
    async fn output(&self, cmd: &Cmd) -> Result<Output, CmdError>;

    /// Looks `program` up on `PATH`; `None` when it is not there.
    fn which(&self, program: &str) -> Option<PathBuf>;

    /// Runs `cmd` and fails with [`CmdError::Failed`] unless it exits 0.
    async fn run(&self, cmd: &Cmd) -> Result<Output, CmdError> {
        let out = self.output(cmd).await?;
        check_status(cmd, out)
    }
}

/// Turns a non-zero [`Output`] into [`CmdError::Failed`].
pub fn check_status(cmd: &Cmd, out: Output) -> Result<Output, CmdError> {
    if out.success() {
        return Ok(out);
    }
    let status = match out.code {
        Some(c) => format!("exit status {c}"),
        None => "killed by signal".to_string(),
    };
    Err(CmdError::Failed {
        argv: cmd.display_argv(),
        status,
        code: out.code,
        stderr: redact_secrets(cmd, out.stderr.trim()),
    })
}

/// Removes any secret argument's value from `text` (a program may echo its arguments).
fn redact_secrets(cmd: &Cmd, text: &str) -> String {
    let mut text = text.to_string();
    for a in cmd
        .arg_list()
        .iter()
        .filter(|a| a.secret && !a.value.is_empty())
    {
        text = text.replace(&a.value, REDACTED);
    }
    text
}

/// The real runner: `tokio::process`, programs resolved on `PATH`. In the agent's container,
/// host tools resolve to their `host-exec` links ([`crate::hostexec::resolve`]).
#[derive(Clone, Debug, Default)]
pub struct ProcessRunner {
    containerized: bool,
}

impl ProcessRunner {
    /// A runner that resolves program names on the process's `PATH`.
    pub fn new() -> Self {
        Self::default()
    }

    /// A runner for the agent's container: host tools run through `host-exec`.
    pub fn containerized() -> Self {
        Self {
            containerized: true,
        }
    }

    /// The program this runner starts for `cmd`.
    pub fn program_for(&self, cmd: &Cmd) -> String {
        crate::hostexec::resolve(cmd.program(), self.containerized)
    }
}

/// How long a spawn that fails with ETXTBSY is retried in all.
const ETXTBSY_BUDGET: Duration = Duration::from_secs(1);
/// Its waits: 10 ms doubling to 100 ms (the budget, not the attempts, ends it).
const ETXTBSY_BACKOFF: crate::retry::Backoff = crate::retry::Backoff::new(
    u32::MAX,
    Duration::from_millis(10),
    Duration::from_millis(100),
);

#[async_trait]
impl Runner for ProcessRunner {
    async fn output(&self, cmd: &Cmd) -> Result<Output, CmdError> {
        let argv = cmd.display_argv();
        let span = tracing::debug_span!("cmd", argv = %argv);
        async move {
            let started = tokio::time::Instant::now();
            let mut busy = 0u32;
            let program = self.program_for(cmd);
            let mut child = loop {
                let delay = ETXTBSY_BACKOFF.delay(busy + 1, None);
                match spawn(&program, cmd) {
                    Ok(child) => break child,
                    Err(e)
                        if e.raw_os_error() == Some(rustix::io::Errno::TXTBSY.raw_os_error())
                            && started.elapsed() + delay <= ETXTBSY_BUDGET =>
                    {
                        tracing::debug!(delay_ms = delay.as_millis() as u64, "ETXTBSY, retrying");
                        tokio::time::sleep(delay).await;
                        busy += 1;
                    }
                    Err(cause) => {
                        return Err(CmdError::Spawn {
                            argv: argv.clone(),
                            cause,
                        });
                    }
                }
            };
            if let Some(data) = cmd.stdin_data()
                && let Some(mut stdin) = child.stdin.take()
            {
                // A child that exits without reading its input is not an error here; its exit
                // status says what happened.
                let _ = stdin.write_all(data).await;
                drop(stdin);
            }
            match tokio::time::timeout(cmd.timeout_value(), child.wait_with_output()).await {
                Ok(Ok(out)) => {
                    let output = Output {
                        code: out.status.code(),
                        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                    };
                    tracing::debug!(code = ?output.code, "finished");
                    Ok(output)
                }
                Ok(Err(cause)) => Err(CmdError::Spawn { argv, cause }),
                // Dropping the future drops the child, which kill_on_drop kills.
                Err(_) => Err(CmdError::Timeout {
                    argv,
                    after: cmd.timeout_value(),
                }),
            }
        }
        .instrument(span)
        .await
    }

    fn which(&self, program: &str) -> Option<PathBuf> {
        which_on(
            &crate::hostexec::resolve(program, self.containerized),
            std::env::var_os("PATH").as_deref(),
        )
    }
}

/// Runs `cmd` with the caller's stdin, stdout and stderr (for build tooling that streams its
/// output, such as `cargo xtask`), within its timeout; fails unless it exits 0. Errors carry the
/// argv; the stderr was already shown to the user.
pub async fn run_inherited(cmd: &Cmd) -> Result<(), CmdError> {
    let argv = cmd.display_argv();
    let span = tracing::info_span!("cmd", argv = %argv);
    async move {
        #[allow(clippy::disallowed_methods)] // the runner module is where processes start
        let mut c = tokio::process::Command::new(cmd.program());
        c.args(cmd.arg_list().iter().map(Arg::value))
            .envs(cmd.env_list().iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true);
        let mut child = c.spawn().map_err(|cause| CmdError::Spawn {
            argv: argv.clone(),
            cause,
        })?;
        match tokio::time::timeout(cmd.timeout_value(), child.wait()).await {
            Ok(Ok(status)) if status.success() => Ok(()),
            Ok(Ok(status)) => Err(CmdError::Failed {
                argv,
                status: status
                    .code()
                    .map_or("killed by signal".into(), |c| format!("exit status {c}")),
                code: status.code(),
                stderr: String::new(),
            }),
            Ok(Err(cause)) => Err(CmdError::Spawn { argv, cause }),
            Err(_) => Err(CmdError::Timeout {
                argv,
                after: cmd.timeout_value(),
            }),
        }
    }
    .instrument(span)
    .await
}

#[allow(clippy::disallowed_methods)] // This is the one place that may create processes.
fn spawn(program: &str, cmd: &Cmd) -> std::io::Result<tokio::process::Child> {
    let mut c = tokio::process::Command::new(program);
    c.args(cmd.arg_list().iter().map(Arg::value))
        .envs(cmd.env_list().iter().map(|(k, v)| (k, v)))
        .stdin(if cmd.stdin_data().is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    c.spawn()
}

pub use crate::lookup::which_on;

#[cfg(test)]
mod tests {
    use super::*;

    /// Real processes through [`ProcessRunner`] (no fakes): `sh` from the machine.
    #[tokio::test]
    async fn real_runner_captures_output_and_exit_status() {
        let r = ProcessRunner::new();
        let out = r
            .output(&Cmd::new("sh").args(["-c", "echo hi; echo oops >&2; exit 3"]))
            .await
            .unwrap();
        assert_eq!(out.code, Some(3));
        assert_eq!(out.stdout, "hi\n");
        assert_eq!(out.stderr, "oops\n");
    }

    #[tokio::test]
    async fn real_runner_error_names_argv_and_stderr() {
        let r = ProcessRunner::new();
        let err = r
            .run(&Cmd::new("sh").args(["-c", "echo broken >&2; exit 2"]))
            .await
            .unwrap_err();
        let text = err.to_string();
        assert_eq!(
            text,
            "sh -c \"echo broken >&2; exit 2\" failed: exit status 2: broken"
        );
        assert_eq!(err.exit_code(), Some(2));
    }

    #[tokio::test]
    async fn real_runner_times_out_and_kills() {
        let r = ProcessRunner::new();
        let err = r
            .run(
                &Cmd::new("sleep")
                    .arg("30")
                    .timeout(Duration::from_millis(200)),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, CmdError::Timeout { .. }), "{err}");
        assert!(err.to_string().starts_with("sleep 30: timed out"));
    }

    #[tokio::test]
    async fn real_runner_missing_program_is_spawn_error() {
        let r = ProcessRunner::new();
        let err = r
            .run(&Cmd::new("definitely-not-a-program-xyz"))
            .await
            .unwrap_err();
        assert!(matches!(err, CmdError::Spawn { .. }));
        assert!(err.to_string().contains("definitely-not-a-program-xyz"));
    }

    #[tokio::test]
    async fn secrets_are_redacted_in_errors_even_when_echoed() {
        let r = ProcessRunner::new();
        let err = r
            .run(
                &Cmd::new("sh")
                    .args(["-c", "echo token=$1 >&2; exit 1", "sh"])
                    .secret_arg("s3cr3t-value"),
            )
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(!text.contains("s3cr3t-value"), "{text}");
        assert!(text.contains(REDACTED));
    }

    #[tokio::test]
    async fn stdin_and_env_reach_the_child() {
        let r = ProcessRunner::new();
        let out = r
            .run(
                &Cmd::new("sh")
                    .args(["-c", "cat; printf %s \"$FOO\""])
                    .env("FOO", "bar")
                    .stdin("in-"),
            )
            .await
            .unwrap();
        assert_eq!(out.stdout, "in-bar");
    }

    #[test]
    fn which_resolves_like_execvp() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("tool");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.path().join("plain"), "").unwrap();
        let path = dir.path().as_os_str();
        assert_eq!(which_on("tool", Some(path)), Some(exe));
        assert_eq!(which_on("plain", Some(path)), None);
        assert_eq!(which_on("missing", Some(path)), None);
    }

    #[test]
    fn display_quotes_and_redacts() {
        let c = Cmd::new("azcmagent")
            .args(["connect", "--tags", "a b"])
            .arg("--access-token")
            .secret_arg("tok");
        assert_eq!(
            c.display_argv(),
            "azcmagent connect --tags \"a b\" --access-token ***REDACTED***"
        );
        assert!(!format!("{c:?}").contains("tok\""));
    }
}
