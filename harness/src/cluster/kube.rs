//! The cluster steps' and checks' hands: [`Kubectl`] (the kind cluster's `kubectl
//! --kubeconfig <path>`), [`Guest`] (a root shell in the VM over the harness's SSH), both over a
//! [`Runner`] so tests drive them with a recording fake; and [`poll`], the wait every cluster
//! check uses: try each `every`, fail after `timeout` naming what it waited for and what it
//! saw last.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use flex_host::runner::{Cmd, Runner};
use flex_host::secret::Secret;

pub use crate::ssh::{GUEST_TIMEOUT, Guest};

/// How long one `kubectl` call may take.
pub const KUBECTL_TIMEOUT: Duration = Duration::from_secs(120);

/// The kind cluster's `kubectl`.
#[derive(Clone, Copy)]
pub struct Kubectl<'a> {
    runner: &'a dyn Runner,
    kubeconfig: &'a std::path::Path,
}

impl<'a> Kubectl<'a> {
    /// `kubectl --kubeconfig <kubeconfig>` through `runner`.
    pub fn new(runner: &'a dyn Runner, kubeconfig: &'a std::path::Path) -> Self {
        Self { runner, kubeconfig }
    }

    /// The same runner with another kubeconfig (another identity).
    pub fn with_kubeconfig<'b>(&self, kubeconfig: &'b std::path::Path) -> Kubectl<'b>
    where
        'a: 'b,
    {
        Kubectl {
            runner: self.runner,
            kubeconfig,
        }
    }

    /// The command for `args`.
    pub fn cmd<I, S>(&self, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Cmd::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.kubeconfig.display().to_string())
            .args(args)
            .timeout(KUBECTL_TIMEOUT)
    }

    /// Runs `args`; its stdout, or the error (argv and stderr).
    pub async fn run<I, S>(&self, args: I) -> anyhow::Result<String>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Ok(self.runner.run(&self.cmd(args)).await?.stdout)
    }

    /// Runs `args` with a longer deadline.
    pub async fn run_t<I, S>(&self, args: I, timeout: Duration) -> anyhow::Result<String>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Ok(self
            .runner
            .run(&self.cmd(args).timeout(timeout))
            .await?
            .stdout)
    }

    /// `kubectl apply -f -` with `doc` on stdin.
    pub async fn apply(&self, doc: &str) -> anyhow::Result<String> {
        Ok(self
            .runner
            .run(
                &self
                    .cmd(["apply", "-f", "-"])
                    .stdin(doc.as_bytes().to_vec()),
            )
            .await?
            .stdout)
    }

    /// `kubectl apply -f -` with a document that holds a secret: on stdin, and the error, should
    /// kubectl echo part of the object, has each of `hide` replaced by `***REDACTED***`.
    pub async fn apply_secret(&self, doc: &Secret, hide: &[&str]) -> anyhow::Result<()> {
        let cmd = self
            .cmd(["apply", "-f", "-"])
            .stdin(doc.expose().as_bytes().to_vec());
        match self.runner.run(&cmd).await {
            Ok(_) => Ok(()),
            Err(e) => {
                let mut text = e.to_string();
                for h in hide.iter().filter(|h| !h.is_empty()) {
                    text = text.replace(h, flex_host::runner::REDACTED);
                }
                Err(anyhow::anyhow!(text))
            }
        }
    }

    /// The kubeconfig with its credentials and CA inline, as JSON (`config view --raw --minify
    /// --flatten`): it holds the credentials.
    pub async fn flattened_config(&self) -> anyhow::Result<String> {
        self.run([
            "config",
            "view",
            "--raw",
            "--minify",
            "--flatten",
            "-o",
            "json",
        ])
        .await
    }

    /// `kubectl get <what> -o json --ignore-not-found` (`what` like `node x`, `-n ns pod y`):
    /// empty when it is not there.
    pub async fn get_json(&self, what: &[&str]) -> anyhow::Result<String> {
        let mut args: Vec<&str> = vec!["get"];
        args.extend_from_slice(what);
        args.extend_from_slice(&["-o", "json", "--ignore-not-found"]);
        self.run(args).await
    }
}

/// One look of a [`poll`].
#[derive(Debug)]
pub enum Seen<T> {
    /// What was waited for.
    Done(T),
    /// Not yet: what was seen instead.
    Not(String),
    /// Never will be: stop waiting (a Failed operation).
    Fail(String),
}

/// How often and how long the cluster checks wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    /// Between looks.
    pub every: Duration,
    /// Scales every timeout (1 in a real run; tests shrink it to 0 so a wait gives up after
    /// its first look).
    pub scale: u32,
}

impl Pace {
    /// A look each second, timeouts as written.
    pub const REAL: Pace = Pace {
        every: Duration::from_secs(1),
        scale: 1,
    };

    /// No pause between looks, and each wait gives up after one look.
    pub const INSTANT: Pace = Pace {
        every: Duration::ZERO,
        scale: 0,
    };

    /// `t` scaled.
    pub fn timeout(&self, t: Duration) -> Duration {
        t * self.scale
    }
}

/// Looks with `probe` every `pace.every` until it is [`Seen::Done`]; fails on
/// [`Seen::Fail`], or after `timeout` (scaled), naming `what` and the last thing seen (an
/// error of a look counts as seen, and the wait goes on). The waiting is
/// [`flex_host::retry::wait_until`]'s.
pub async fn poll<T, F, Fut>(
    what: &str,
    timeout: Duration,
    pace: Pace,
    mut probe: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Seen<T>>>,
{
    let timeout = pace.timeout(timeout);
    let looks = AtomicU32::new(0);
    let looks = &looks;
    // A look that says it never will be ends the wait with `Ok(Err(…))`.
    let seen = flex_host::retry::wait_until(what, timeout, pace.every, || {
        looks.fetch_add(1, Ordering::Relaxed);
        let look = probe();
        async move {
            match look.await {
                Ok(Seen::Done(v)) => Ok(Ok(v)),
                Ok(Seen::Not(s)) => Err(s),
                Ok(Seen::Fail(s)) => Ok(Err(s)),
                Err(e) => Err(format!("no answer ({e:#})")),
            }
        }
    })
    .await;
    match seen {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(s)) => anyhow::bail!("{what}: {s}"),
        Err(t) => anyhow::bail!(
            "timed out after {:.0}s ({} looks) waiting for {what}; last seen: {}",
            timeout.as_secs_f64(),
            looks.load(Ordering::Relaxed),
            t.last_seen
        ),
    }
}

/// Where the cluster's files live under the harness's work directory.
pub fn cluster_dir(work: &std::path::Path) -> PathBuf {
    work.join("cluster")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ssh::Ssh;
    use flex_host::runner::Output;
    use flex_testkit::FakeRunner;

    #[tokio::test]
    async fn poll_returns_fails_and_times_out_naming_what() {
        let mut n = 0;
        let v = poll(
            "three looks",
            Duration::from_secs(60),
            Pace::INSTANT.with_scale(1),
            || {
                n += 1;
                let k = n;
                async move {
                    Ok(if k < 3 {
                        Seen::Not(format!("look {k}"))
                    } else {
                        Seen::Done(k)
                    })
                }
            },
        )
        .await
        .unwrap();
        assert_eq!(v, 3);

        let e = poll(
            "the Node Ready",
            Duration::from_secs(600),
            Pace::INSTANT,
            || async { Ok::<_, anyhow::Error>(Seen::<()>::Not("not Ready (Unknown)".into())) },
        )
        .await
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "timed out after 0s (1 looks) waiting for the Node Ready; last seen: not Ready (Unknown)"
        );

        let e = poll(
            "NodeReboot",
            Duration::from_secs(600),
            Pace::INSTANT,
            || async { Ok::<_, anyhow::Error>(Seen::<()>::Fail("phase Failed: boom".into())) },
        )
        .await
        .unwrap_err()
        .to_string();
        assert_eq!(e, "NodeReboot: phase Failed: boom");

        let e = poll("x", Duration::ZERO, Pace::INSTANT, || async {
            Err::<Seen<()>, _>(anyhow::anyhow!("ssh: connection refused"))
        })
        .await
        .unwrap_err()
        .to_string();
        assert!(
            e.ends_with("last seen: no answer (ssh: connection refused)"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn secrets_go_on_stdin_and_are_redacted_from_errors() {
        let r = FakeRunner::new();
        r.on(
            "kubectl --kubeconfig /w/kubeconfig apply",
            Output::failed(1, "Secret \"bootstrap-token-abcdef\" is invalid: token-secret: Invalid value: \"0123456789abcdef\""),
        );
        let kc = std::path::PathBuf::from("/w/kubeconfig");
        let k = Kubectl::new(&r, &kc);
        let e = k
            .apply_secret(
                &Secret::new("{\"token-secret\": \"0123456789abcdef\"}"),
                &["0123456789abcdef"],
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(
            !e.contains("0123456789abcdef") && e.contains("***REDACTED***"),
            "{e}"
        );
        assert_eq!(
            r.calls(),
            vec!["kubectl --kubeconfig /w/kubeconfig apply -f -"]
        );

        let ssh = Ssh {
            port: 2222,
            key: "/w/id".into(),
        };
        r.on(
            "ssh",
            Output::failed(1, "cat: write error: 0123456789abcdef"),
        );
        let g = Guest::new(&r, &ssh);
        let e = g
            .sh_stdin(
                "cat > /x",
                &Secret::new("TOKEN=0123456789abcdef"),
                &["0123456789abcdef"],
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(!e.contains("0123456789abcdef"), "{e}");
        assert!(!r.transcript().contains("0123456789abcdef"));
    }

    impl Pace {
        fn with_scale(mut self, scale: u32) -> Self {
            self.scale = scale;
            self
        }
    }
}
