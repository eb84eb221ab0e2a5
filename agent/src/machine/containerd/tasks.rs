//! One containerd task as the agent's unit sees it: its state, the wait for its exit, a signal
//! to it ([`TaskApi`]). The unit starts the agent's container as a detached task (`ctr run -d`)
//! and waits on it with `aks-flex-node wait-task` ([`crate::flows::task_wait`]) instead of
//! keeping a `ctr run` client attached for the container's life.
//!
//! [`GrpcTasks`] is containerd's `Tasks` service (v1: `Get`, `Wait`, `Kill`) over its socket,
//! every request in one namespace. A call that fails in the transport or with a status that a
//! containerd restart gives (unavailable, unknown, cancelled, aborted, internal, deadline) is
//! [`TaskError::Unavailable`], which the waiter retries on a new connection; a task containerd
//! does not know is [`TaskError::NotFound`]; any other status is [`TaskError::Api`], which
//! asking again would not change ([`classify`]).

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use containerd_api::services::tasks::v1::{
    GetRequest, KillRequest, WaitRequest, tasks_client::TasksClient,
};
use containerd_api::tonic::transport::Channel;
use containerd_api::tonic::{Code, Request, Status};
use containerd_api::v1::types::Status as ProcessStatus;
use tokio::sync::Mutex;

/// What containerd says about a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskState {
    /// Created, running, paused or pausing: its process has not exited.
    Running {
        /// The task's init process, as containerd's PID namespace sees it.
        pid: u32,
    },
    /// Its process exited with `exit_status` (containerd gives 128 + the signal for a process
    /// a signal ended).
    Stopped {
        /// The exit status.
        exit_status: u32,
    },
}

/// Why a task call failed, typed for the caller's retry decision.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// containerd did not answer, or answered as it does while it restarts: another attempt on
    /// a new connection may succeed.
    #[error("containerd at {socket}: {call}: {message}")]
    Unavailable {
        /// The socket.
        socket: PathBuf,
        /// The gRPC method (`tasks.Wait`, ...), or `connect`.
        call: &'static str,
        /// The transport's or containerd's message.
        message: String,
    },
    /// containerd has no such task (never started, or deleted).
    #[error("containerd has no task {id} in namespace {namespace}")]
    NotFound {
        /// The task's container ID.
        id: String,
        /// The containerd namespace.
        namespace: String,
    },
    /// containerd refused the call for a reason asking again would not change.
    #[error("containerd {call} for task {id}: {code}: {message}")]
    Api {
        /// The task's container ID.
        id: String,
        /// The gRPC method.
        call: &'static str,
        /// The gRPC status code, as text.
        code: String,
        /// containerd's message.
        message: String,
    },
}

impl TaskError {
    /// Whether another attempt may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, TaskError::Unavailable { .. })
    }
}

/// What a failed call's status means: the decision table of [`GrpcTasks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// The connection or containerd itself is going away or coming back.
    Unavailable,
    /// No such task.
    NotFound,
    /// A refusal that another attempt would repeat.
    Permanent,
}

/// Classifies a gRPC status code.
pub fn classify(code: Code) -> Class {
    match code {
        Code::Unavailable
        | Code::Unknown
        | Code::Cancelled
        | Code::Aborted
        | Code::Internal
        | Code::DeadlineExceeded
        | Code::ResourceExhausted => Class::Unavailable,
        Code::NotFound => Class::NotFound,
        Code::Ok
        | Code::InvalidArgument
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::DataLoss
        | Code::Unauthenticated => Class::Permanent,
    }
}

/// The calls the waiter makes on one task.
#[async_trait]
pub trait TaskApi: Send + Sync {
    /// The task's state (`Tasks.Get`).
    async fn state(&self, id: &str) -> Result<TaskState, TaskError>;
    /// Waits until the task's process exits; its exit status (`Tasks.Wait`, no deadline).
    async fn wait(&self, id: &str) -> Result<u32, TaskError>;
    /// Sends `signal` to the task's init process (`Tasks.Kill`).
    async fn kill(&self, id: &str, signal: u32) -> Result<(), TaskError>;
}

/// [`TaskApi`] over containerd's socket. The channel is opened at the first call and opened
/// again after a call failed in the transport (containerd restarted).
pub struct GrpcTasks {
    socket: PathBuf,
    namespace: String,
    channel: Mutex<Option<Channel>>,
}

impl GrpcTasks {
    /// The tasks of `namespace` at the socket `socket`; nothing is dialled yet.
    pub fn new(socket: impl Into<PathBuf>, namespace: impl Into<String>) -> Self {
        Self {
            socket: socket.into(),
            namespace: namespace.into(),
            channel: Mutex::new(None),
        }
    }

    /// The socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn client(&self) -> Result<TasksClient<Channel>, TaskError> {
        let mut slot = self.channel.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(TasksClient::new(c.clone()));
        }
        let channel = containerd_api::connect(self.socket.clone())
            .await
            .map_err(|e| TaskError::Unavailable {
                socket: self.socket.clone(),
                call: "connect",
                message: e.to_string(),
            })?;
        *slot = Some(channel.clone());
        Ok(TasksClient::new(channel))
    }

    fn request<T>(&self, msg: T) -> Request<T> {
        containerd_api::namespaced(msg, &self.namespace)
    }

    /// Maps a failed call's status, and forgets the channel when containerd may be restarting.
    async fn error(&self, id: &str, call: &'static str, status: Status) -> TaskError {
        match classify(status.code()) {
            Class::Unavailable => {
                *self.channel.lock().await = None;
                TaskError::Unavailable {
                    socket: self.socket.clone(),
                    call,
                    message: format!("{:?}: {}", status.code(), status.message()),
                }
            }
            Class::NotFound => TaskError::NotFound {
                id: id.to_string(),
                namespace: self.namespace.clone(),
            },
            Class::Permanent => TaskError::Api {
                id: id.to_string(),
                call,
                code: format!("{:?}", status.code()),
                message: status.message().to_string(),
            },
        }
    }
}

#[async_trait]
impl TaskApi for GrpcTasks {
    async fn state(&self, id: &str) -> Result<TaskState, TaskError> {
        let req = self.request(GetRequest {
            container_id: id.to_string(),
            exec_id: String::new(),
        });
        let resp = match self.client().await?.get(req).await {
            Ok(r) => r.into_inner(),
            Err(s) => return Err(self.error(id, "tasks.Get", s).await),
        };
        let Some(p) = resp.process else {
            return Err(TaskError::Api {
                id: id.to_string(),
                call: "tasks.Get",
                code: "Ok".into(),
                message: "the answer has no process".into(),
            });
        };
        Ok(match ProcessStatus::try_from(p.status) {
            Ok(ProcessStatus::Stopped) => TaskState::Stopped {
                exit_status: p.exit_status,
            },
            _ => TaskState::Running { pid: p.pid },
        })
    }

    async fn wait(&self, id: &str) -> Result<u32, TaskError> {
        let req = self.request(WaitRequest {
            container_id: id.to_string(),
            exec_id: String::new(),
        });
        match self.client().await?.wait(req).await {
            Ok(r) => Ok(r.into_inner().exit_status),
            Err(s) => Err(self.error(id, "tasks.Wait", s).await),
        }
    }

    async fn kill(&self, id: &str, signal: u32) -> Result<(), TaskError> {
        let req = self.request(KillRequest {
            container_id: id.to_string(),
            exec_id: String::new(),
            signal,
            all: false,
        });
        match self.client().await?.kill(req).await {
            Ok(_) => Ok(()),
            Err(s) => Err(self.error(id, "tasks.Kill", s).await),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The decision table: what containerd answers while it restarts is retried, a missing
    /// task and refusals are not.
    #[test]
    fn status_codes_are_classified_for_the_retry_decision() {
        let table = [
            (Code::Unavailable, Class::Unavailable),
            (Code::Unknown, Class::Unavailable),
            (Code::Cancelled, Class::Unavailable),
            (Code::Internal, Class::Unavailable),
            (Code::DeadlineExceeded, Class::Unavailable),
            (Code::NotFound, Class::NotFound),
            (Code::InvalidArgument, Class::Permanent),
            (Code::FailedPrecondition, Class::Permanent),
            (Code::PermissionDenied, Class::Permanent),
            (Code::Unimplemented, Class::Permanent),
        ];
        for (code, want) in table {
            assert_eq!(classify(code), want, "{code:?}");
        }
    }

    /// A socket nobody listens on is `Unavailable` (retryable), naming the socket: the real
    /// client against a path with no containerd.
    #[tokio::test]
    async fn a_missing_socket_is_unavailable_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("containerd.sock");
        let tasks = GrpcTasks::new(&sock, "aks-flex");
        let e = tasks.state("aks-flex-agent").await.unwrap_err();
        assert!(e.is_retryable(), "{e}");
        assert!(e.to_string().contains(&*sock.to_string_lossy()), "{e}");
    }
}
