//! A small QMP client: QEMU's JSON control protocol over the VM's unix socket.
//!
//! [`Qmp`] is the narrow interface the harness uses (status, powerdown, reset, snapshots,
//! quit); [`QmpClient`] speaks the protocol (greeting, `qmp_capabilities`, one command at a
//! time matched by `id`, asynchronous events collected on the side) and [`FakeQmp`] records
//! calls for tests. An in-house client rather than the `qapi` crate: a handful of commands,
//! and no schema to lag behind the installed QEMU.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

/// A QMP failure.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// Socket I/O.
    #[error("qmp {command}: {cause}")]
    Io {
        /// The command (or `connect`).
        command: String,
        /// The error (in the message, not a `source()`: a chain printer would repeat it).
        cause: std::io::Error,
    },
    /// QEMU answered with an error.
    #[error("qmp {command}: {class}: {desc}")]
    Command {
        /// The command.
        command: String,
        /// QMP error class.
        class: String,
        /// Description.
        desc: String,
    },
    /// No answer in time or the connection closed.
    #[error("qmp {command}: {reason}")]
    Protocol {
        /// The command.
        command: String,
        /// What went wrong.
        reason: String,
    },
}

/// The VM's run state (`query-status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// `running`, `paused`, `shutdown`, …
    pub status: String,
    /// Whether vCPUs run.
    pub running: bool,
}

/// What the harness does to a VM over QMP.
#[async_trait]
pub trait Qmp: Send + Sync {
    /// Runs `command` with `arguments`; returns `return`.
    async fn execute(&self, command: &str, arguments: Value) -> Result<Value, QmpError>;
    /// Events received so far (and clears them).
    fn take_events(&self) -> Vec<Value>;

    /// `query-status`.
    async fn status(&self) -> Result<Status, QmpError> {
        let v = self.execute("query-status", Value::Null).await?;
        Ok(Status {
            status: v["status"].as_str().unwrap_or_default().to_string(),
            running: v["running"].as_bool().unwrap_or(false),
        })
    }
    /// ACPI power button.
    async fn powerdown(&self) -> Result<(), QmpError> {
        self.execute("system_powerdown", Value::Null)
            .await
            .map(|_| ())
    }
    /// Hard reset.
    async fn reset(&self) -> Result<(), QmpError> {
        self.execute("system_reset", Value::Null).await.map(|_| ())
    }
    /// Stops QEMU.
    async fn quit(&self) -> Result<(), QmpError> {
        self.execute("quit", Value::Null).await.map(|_| ())
    }
    /// An HMP command through QMP (for `savevm`/`loadvm`, which have no stable QMP form);
    /// HMP reports failures as text, which is returned as an error.
    async fn hmp(&self, line: &str) -> Result<String, QmpError> {
        let out = self
            .execute("human-monitor-command", json!({"command-line": line}))
            .await?;
        let text = out.as_str().unwrap_or_default().trim().to_string();
        let lower = text.to_lowercase();
        if lower.contains("error") || lower.contains("could not") {
            return Err(QmpError::Command {
                command: line.to_string(),
                class: "HMP".into(),
                desc: text,
            });
        }
        Ok(text)
    }
    /// Saves a VM snapshot into every writable qcow2 disk.
    async fn savevm(&self, name: &str) -> Result<(), QmpError> {
        self.hmp(&format!("savevm {name}")).await.map(|_| ())
    }
    /// Restores a snapshot.
    async fn loadvm(&self, name: &str) -> Result<(), QmpError> {
        self.hmp(&format!("loadvm {name}")).await.map(|_| ())
    }
}

struct Conn {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    next_id: u64,
}

/// The real client over a unix socket.
pub struct QmpClient {
    conn: tokio::sync::Mutex<Conn>,
    events: Arc<Mutex<Vec<Value>>>,
    timeout: Duration,
}

impl QmpClient {
    /// Connects, reads the greeting and negotiates capabilities.
    pub async fn connect(socket: &Path, timeout: Duration) -> Result<Self, QmpError> {
        let io = |cause| QmpError::Io {
            command: "connect".into(),
            cause,
        };
        let stream = UnixStream::connect(socket).await.map_err(io)?;
        let (r, w) = stream.into_split();
        let client = Self {
            conn: tokio::sync::Mutex::new(Conn {
                reader: BufReader::new(r),
                writer: w,
                next_id: 1,
            }),
            events: Arc::new(Mutex::new(Vec::new())),
            timeout,
        };
        {
            let mut c = client.conn.lock().await;
            let greeting = client.read_message(&mut c, "greeting").await?;
            if greeting.get("QMP").is_none() {
                return Err(QmpError::Protocol {
                    command: "greeting".into(),
                    reason: format!("unexpected greeting {greeting}"),
                });
            }
        }
        client.execute("qmp_capabilities", Value::Null).await?;
        Ok(client)
    }

    async fn read_message(&self, c: &mut Conn, command: &str) -> Result<Value, QmpError> {
        let mut line = String::new();
        let n = tokio::time::timeout(self.timeout, c.reader.read_line(&mut line))
            .await
            .map_err(|_| QmpError::Protocol {
                command: command.into(),
                reason: format!("no answer within {:?}", self.timeout),
            })?
            .map_err(|cause| QmpError::Io {
                command: command.into(),
                cause,
            })?;
        if n == 0 {
            return Err(QmpError::Protocol {
                command: command.into(),
                reason: "connection closed".into(),
            });
        }
        serde_json::from_str(&line).map_err(|e| QmpError::Protocol {
            command: command.into(),
            reason: format!("bad JSON {line:?}: {e}"),
        })
    }
}

#[async_trait]
impl Qmp for QmpClient {
    async fn execute(&self, command: &str, arguments: Value) -> Result<Value, QmpError> {
        let mut c = self.conn.lock().await;
        let id = c.next_id;
        c.next_id += 1;
        let mut msg = json!({"execute": command, "id": id});
        if !arguments.is_null() {
            msg["arguments"] = arguments;
        }
        let mut text = msg.to_string();
        text.push('\n');
        c.writer
            .write_all(text.as_bytes())
            .await
            .map_err(|cause| QmpError::Io {
                command: command.into(),
                cause,
            })?;
        loop {
            let m = self.read_message(&mut c, command).await?;
            if m.get("event").is_some() {
                if let Ok(mut ev) = self.events.lock() {
                    ev.push(m);
                }
                continue;
            }
            if m.get("id") != Some(&json!(id)) {
                continue;
            }
            if let Some(err) = m.get("error") {
                return Err(QmpError::Command {
                    command: command.into(),
                    class: err["class"].as_str().unwrap_or_default().into(),
                    desc: err["desc"].as_str().unwrap_or_default().into(),
                });
            }
            return Ok(m.get("return").cloned().unwrap_or(Value::Null));
        }
    }

    fn take_events(&self) -> Vec<Value> {
        self.events
            .lock()
            .map(|mut e| std::mem::take(&mut *e))
            .unwrap_or_default()
    }
}

/// A recording fake: answers `query-status` with `running` and everything else with `{}`.
#[derive(Clone, Default)]
pub struct FakeQmp {
    calls: Arc<Mutex<Vec<String>>>,
}

impl FakeQmp {
    /// The commands run so far (`command arguments`).
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

#[async_trait]
impl Qmp for FakeQmp {
    async fn execute(&self, command: &str, arguments: Value) -> Result<Value, QmpError> {
        if let Ok(mut c) = self.calls.lock() {
            c.push(if arguments.is_null() {
                command.to_string()
            } else {
                format!("{command} {arguments}")
            });
        }
        Ok(match command {
            "query-status" => json!({"status": "running", "running": true}),
            "human-monitor-command" => json!(""),
            _ => json!({}),
        })
    }
    fn take_events(&self) -> Vec<Value> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::UnixListener;

    /// A socket error is printed once, by `{e}` and by a chain printer alike.
    #[tokio::test]
    async fn a_connect_error_prints_its_cause_once() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("qmp.sock");
        let os = std::fs::read(&missing).unwrap_err().to_string();
        let Err(e) = QmpClient::connect(&missing, Duration::from_secs(1)).await else {
            panic!("connected to a missing socket");
        };
        flex_testkit::assert_cause_once(&e, &os);
    }

    /// The real client against a scripted QMP server on a real unix socket.
    #[tokio::test]
    async fn client_negotiates_matches_ids_and_collects_events() {
        let d = tempfile::tempdir().unwrap();
        let sock = d.path().join("qmp.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let (r, mut w) = s.into_split();
            let mut r = BufReader::new(r);
            w.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n")
                .await
                .unwrap();
            let mut seen = Vec::new();
            let mut line = String::new();
            while r.read_line(&mut line).await.unwrap() > 0 {
                let m: Value = serde_json::from_str(&line).unwrap();
                let id = m["id"].clone();
                let cmd = m["execute"].as_str().unwrap().to_string();
                seen.push(cmd.clone());
                let reply = match cmd.as_str() {
                    "query-status" => {
                        w.write_all(b"{\"event\": \"RESUME\", \"timestamp\": {}}\n")
                            .await
                            .unwrap();
                        json!({"return": {"status": "running", "running": true}, "id": id})
                    }
                    "human-monitor-command" => {
                        json!({"return": "Error: No block device can accept snapshots\r\n", "id": id})
                    }
                    "bogus" => {
                        json!({"error": {"class": "CommandNotFound", "desc": "The command bogus has not been found"}, "id": id})
                    }
                    _ => json!({"return": {}, "id": id}),
                };
                w.write_all(format!("{reply}\n").as_bytes()).await.unwrap();
                line.clear();
            }
            seen
        });
        let c = QmpClient::connect(&sock, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(
            c.status().await.unwrap(),
            Status {
                status: "running".into(),
                running: true
            }
        );
        assert_eq!(c.take_events().len(), 1);
        let e = c.execute("bogus", Value::Null).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "qmp bogus: CommandNotFound: The command bogus has not been found"
        );
        let e = c.savevm("ready").await.unwrap_err();
        assert!(
            e.to_string()
                .contains("No block device can accept snapshots"),
            "{e}"
        );
        c.powerdown().await.unwrap();
        drop(c);
        let seen = server.await.unwrap();
        assert_eq!(
            seen,
            vec![
                "qmp_capabilities",
                "query-status",
                "bogus",
                "human-monitor-command",
                "system_powerdown"
            ]
        );
    }
}
