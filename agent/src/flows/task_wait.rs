//! `aks-flex-node wait-task`: the main process of the agent's container unit in place of an
//! attached `ctr run` client.
//!
//! The unit starts the agent's container as a detached containerd task (`ctr run -d`) whose
//! output goes to a FIFO the unit holds (`--log-uri file://…`), then `exec`s this command from
//! the agent's image with the FIFO as its standard input. It
//! - tells systemd the unit is ready (`READY=1`; the unit is `Type=notify`) once containerd
//!   shows the task running, so `active` means the daemon's task runs and `systemctl start`
//!   returns only then;
//! - waits for the task's exit through containerd's API ([`wait_for_exit`]) and exits with the
//!   task's exit status ([`exit_code`]), so `Restart=on-failure`, `$SERVICE_RESULT` and
//!   `OnFailure=` see the daemon's own result, as they saw `ctr run`'s;
//! - rides out a containerd restart: a call that fails as containerd does while it goes away is
//!   retried on a new connection with [`WAIT_BACKOFF`] (the task and its shim live on); after
//!   a failure the task's state is read first, so an exit while containerd was down is not
//!   missed (containerd keeps a stopped task's status until it is deleted);
//! - forwards SIGTERM and SIGINT to the task ([`wait_forwarding`]) and keeps waiting, as
//!   `ctr run` did, so stopping the unit stops the daemon and the unit ends with its result;
//! - copies the FIFO to its standard output, the unit's journal ([`relay`]), and after the exit
//!   drains what is left. It never stops reading while the task runs (a full FIFO would block
//!   the daemon's logging): when its output fails it discards.
//!
//! A task containerd does not know, or a refusal, ends the wait with an error (exit status 1).

use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flex_host::retry::{Attempt, Backoff, retry};
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot};

use crate::machine::containerd::tasks::{TaskApi, TaskError, TaskState};

/// Retries while containerd is away: without end (the task runs on without containerd, and the
/// unit must stay active while it does), 250 ms doubling to 5 s.
pub const WAIT_BACKOFF: Backoff =
    Backoff::new(u32::MAX, Duration::from_millis(250), Duration::from_secs(5));

/// After the task exited, the relay stops once the FIFO has been quiet this long.
pub const DRAIN_QUIET: Duration = Duration::from_millis(200);

/// The unit's exit status for the task's: the same below 256, else 255.
pub fn exit_code(exit_status: u32) -> u8 {
    u8::try_from(exit_status).unwrap_or(u8::MAX)
}

fn attempt(e: TaskError) -> Attempt<TaskError> {
    if e.is_retryable() {
        Attempt::retry(e)
    } else {
        Attempt::Fatal(e)
    }
}

/// Waits until task `id` exits and returns its exit status. Each attempt reads the task's state
/// first (a stopped task's status is returned at once), then waits; an unavailable containerd
/// is retried with `backoff`, anything else ends the wait. `running` is called once, the first
/// time the task is seen running (the unit's readiness: `READY=1`); a task that has already
/// stopped is never reported running.
pub async fn wait_for_exit(
    api: &dyn TaskApi,
    id: &str,
    backoff: Backoff,
    running: &(dyn Fn() + Sync),
) -> Result<u32, TaskError> {
    let told = AtomicBool::new(false);
    let told = &told;
    retry("wait for the agent's task", backoff, |_| async move {
        match api.state(id).await.map_err(attempt)? {
            TaskState::Stopped { exit_status } => Ok(exit_status),
            TaskState::Running { .. } => {
                if !told.swap(true, Ordering::Relaxed) {
                    running();
                }
                api.wait(id).await.map_err(attempt)
            }
        }
    })
    .await
}

/// [`wait_for_exit`] (`running` as there), sending each signal received on `signals` to the task meanwhile (a
/// failed send is logged; the wait goes on).
pub async fn wait_forwarding(
    api: &dyn TaskApi,
    id: &str,
    backoff: Backoff,
    running: &(dyn Fn() + Sync),
    signals: &mut mpsc::Receiver<u32>,
) -> Result<u32, TaskError> {
    let wait = wait_for_exit(api, id, backoff, running);
    tokio::pin!(wait);
    let mut open = true;
    loop {
        tokio::select! {
            r = &mut wait => return r,
            s = signals.recv(), if open => match s {
                Some(sig) => {
                    tracing::info!(task = id, signal = sig, "forwarding a signal to the task");
                    if let Err(e) = api.kill(id, sig).await {
                        tracing::warn!(task = id, signal = sig, error = %e, "could not forward the signal");
                    }
                }
                None => open = false,
            },
        }
    }
}

/// What the relay did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Relayed {
    /// Bytes read from the input.
    pub read: u64,
    /// Bytes written to the output (less than `read` when the output failed).
    pub written: u64,
}

/// Copies `input` (a FIFO or pipe, read or read-write; made non-blocking here) to `out` until
/// `exited` fires, then until the input has been quiet for [`DRAIN_QUIET`] or reaches its end.
/// A failed write makes the rest be read and discarded, so the writer never blocks on a full
/// FIFO. Input that is not a pipe is refused (`InvalidInput`).
pub async fn relay<W: Write>(
    input: OwnedFd,
    out: &mut W,
    mut exited: oneshot::Receiver<()>,
) -> std::io::Result<Relayed> {
    let mut rx = pipe::Receiver::from_owned_fd(input)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut done = false;
    let mut broken = false;
    let mut r = Relayed::default();
    loop {
        let read = if done {
            match tokio::time::timeout(DRAIN_QUIET, rx.read(&mut buf)).await {
                Ok(n) => n,
                Err(_quiet) => return Ok(r),
            }
        } else {
            tokio::select! {
                n = rx.read(&mut buf) => n,
                _ = &mut exited => { done = true; continue; }
            }
        };
        let n = match read {
            Ok(0) => return Ok(r),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        r.read += n as u64;
        if !broken {
            match out.write_all(&buf[..n]).and_then(|()| out.flush()) {
                Ok(()) => r.written += n as u64,
                Err(e) => {
                    broken = true;
                    tracing::warn!(error = %e, "the task's output cannot be written; discarding it from now on");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;

    use async_trait::async_trait;

    use super::*;

    /// A scripted [`TaskApi`]: each call takes the next answer of its kind and is recorded.
    #[derive(Default)]
    struct Scripted {
        states: Mutex<VecDeque<Result<TaskState, TaskError>>>,
        waits: Mutex<VecDeque<Result<u32, TaskError>>>,
        /// A wait with no scripted answer waits for one (a task that runs on).
        calls: Mutex<Vec<String>>,
    }

    fn down() -> TaskError {
        TaskError::Unavailable {
            socket: "/run/containerd/containerd.sock".into(),
            call: "tasks.Wait",
            message: "Unavailable: connection reset".into(),
        }
    }

    impl Scripted {
        fn new(
            states: Vec<Result<TaskState, TaskError>>,
            waits: Vec<Result<u32, TaskError>>,
        ) -> Self {
            Self {
                states: Mutex::new(states.into()),
                waits: Mutex::new(waits.into()),
                calls: Mutex::default(),
            }
        }
        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
    }

    #[async_trait]
    impl TaskApi for Scripted {
        async fn state(&self, id: &str) -> Result<TaskState, TaskError> {
            self.calls.lock().unwrap().push(format!("state {id}"));
            self.states
                .lock()
                .unwrap()
                .pop_front()
                .expect("an unscripted state call")
        }
        async fn wait(&self, id: &str) -> Result<u32, TaskError> {
            self.calls.lock().unwrap().push(format!("wait {id}"));
            loop {
                let next = self.waits.lock().unwrap().pop_front();
                if let Some(r) = next {
                    return r;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        async fn kill(&self, id: &str, signal: u32) -> Result<(), TaskError> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("kill {id} {signal}"));
            // The task ends on the signal: the next wait answers 0.
            self.waits.lock().unwrap().push_back(Ok(0));
            Ok(())
        }
    }

    const FAST: Backoff = Backoff::new(20, Duration::from_millis(1), Duration::from_millis(2));
    const RUNNING: TaskState = TaskState::Running { pid: 42 };

    /// Table: the scripted answers containerd gives, and what the waiter returns. Fake at the
    /// [`TaskApi`] seam; the real containerd is `tests/tests/containerd_image.rs`'s.
    #[tokio::test]
    async fn the_wait_returns_the_tasks_exit_status_through_containerd_restarts() {
        /// (name, containerd's answers, result, calls, readiness told)
        type Case = (
            &'static str,
            Scripted,
            Result<u32, &'static str>,
            usize,
            usize,
        );
        let cases: Vec<Case> = vec![
            (
                "runs, then exits 3",
                Scripted::new(vec![Ok(RUNNING)], vec![Ok(3)]),
                Ok(3),
                2,
                1,
            ),
            (
                "already stopped when the waiter starts: no wait, never ready",
                Scripted::new(vec![Ok(TaskState::Stopped { exit_status: 7 })], vec![]),
                Ok(7),
                1,
                0,
            ),
            (
                "containerd restarts during the wait; the task exited meanwhile",
                Scripted::new(
                    vec![
                        Ok(RUNNING),
                        Err(down()),
                        Ok(TaskState::Stopped { exit_status: 137 }),
                    ],
                    vec![Err(down())],
                ),
                Ok(137),
                4,
                1,
            ),
            (
                "containerd restarts during the wait; the task runs on, then exits 0",
                Scripted::new(vec![Ok(RUNNING), Ok(RUNNING)], vec![Err(down()), Ok(0)]),
                Ok(0),
                4,
                1,
            ),
            (
                "the task was deleted: no retry",
                Scripted::new(
                    vec![Err(TaskError::NotFound {
                        id: "aks-flex-agent".into(),
                        namespace: "aks-flex".into(),
                    })],
                    vec![],
                ),
                Err("containerd has no task aks-flex-agent in namespace aks-flex"),
                1,
                0,
            ),
            (
                "a refusal: no retry",
                Scripted::new(
                    vec![Ok(RUNNING)],
                    vec![Err(TaskError::Api {
                        id: "aks-flex-agent".into(),
                        call: "tasks.Wait",
                        code: "PermissionDenied".into(),
                        message: "no".into(),
                    })],
                ),
                Err("containerd tasks.Wait for task aks-flex-agent: PermissionDenied: no"),
                2,
                1,
            ),
        ];
        for (name, api, want, ncalls, nready) in cases {
            let ready = AtomicUsize::new(0);
            let got = wait_for_exit(&api, "aks-flex-agent", FAST, &|| {
                ready.fetch_add(1, Ordering::Relaxed);
            })
            .await
            .map_err(|e| e.to_string());
            assert_eq!(got, want.map_err(str::to_string), "{name}");
            assert_eq!(api.calls().len(), ncalls, "{name}: {:?}", api.calls());
            assert_eq!(ready.into_inner(), nready, "{name}: readiness told");
        }
    }

    #[tokio::test]
    async fn an_unavailable_containerd_is_retried_only_as_long_as_the_backoff_allows() {
        let api = Scripted::new(vec![Err(down()), Err(down()), Err(down())], vec![]);
        let e = wait_for_exit(
            &api,
            "aks-flex-agent",
            Backoff::new(3, Duration::ZERO, Duration::ZERO),
            &|| {},
        )
        .await
        .unwrap_err();
        assert!(e.is_retryable(), "{e}");
        assert_eq!(api.calls().len(), 3);
    }

    /// A SIGTERM to the waiter is sent to the task, and the wait goes on to the task's exit.
    #[tokio::test]
    async fn a_signal_is_forwarded_and_the_wait_goes_on() {
        let api = Scripted::new(vec![Ok(RUNNING)], vec![]);
        let (tx, mut rx) = mpsc::channel(4);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            tx.send(15).await.unwrap();
        });
        let code = wait_forwarding(&api, "aks-flex-agent", FAST, &|| {}, &mut rx)
            .await
            .unwrap();
        assert_eq!(code, 0);
        assert_eq!(
            api.calls(),
            [
                "state aks-flex-agent",
                "wait aks-flex-agent",
                "kill aks-flex-agent 15"
            ]
        );
    }

    #[test]
    fn exit_statuses_map_to_the_units_exit_code() {
        for (status, code) in [
            (0, 0),
            (3, 3),
            (137, 137),
            (255, 255),
            (256, 255),
            (u32::MAX, 255),
        ] {
            assert_eq!(exit_code(status), code, "{status}");
        }
    }

    /// Real pipe: what is written before and right after the exit is relayed, the relay ends
    /// once the pipe is quiet although a writer is still open (as the unit's own O_RDWR handle
    /// on the FIFO is), and a failing output is discarded without stopping the reading.
    #[tokio::test]
    async fn the_relay_copies_until_the_exit_then_drains_and_ends_with_a_writer_still_open() {
        let (r, mut w) = std::io::pipe().unwrap();
        let r = OwnedFd::from(r);
        w.write_all(b"line one\n").unwrap();
        let (tx, rx) = oneshot::channel();
        let mut out = Vec::new();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            w.write_all(b"line two\n").unwrap();
            tx.send(()).unwrap();
            w.write_all(b"after exit\n").unwrap();
            // Keep the writer open past the relay's end.
            std::thread::sleep(Duration::from_millis(800));
            drop(w);
        });
        let got = relay(r, &mut out, rx).await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out),
            "line one\nline two\nafter exit\n"
        );
        assert_eq!(got.read, got.written);
        writer.join().unwrap();

        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (r, mut w) = std::io::pipe().unwrap();
        let r = OwnedFd::from(r);
        let (tx, rx) = oneshot::channel();
        w.write_all(&[b'x'; 60_000]).unwrap();
        let writer = std::thread::spawn(move || {
            // More than a pipe holds: it only completes because the relay keeps reading.
            w.write_all(&[b'y'; 200_000]).unwrap();
            tx.send(()).unwrap();
        });
        let got = relay(r, &mut Broken, rx).await.unwrap();
        writer.join().unwrap();
        assert_eq!(got.read, 260_000);
        assert_eq!(got.written, 0);
    }
}
