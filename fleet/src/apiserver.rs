//! An in-process fake Kubernetes API server on loopback HTTP: just the subset the daemon's
//! MachineOperation reconcile, drain and disruption budget use, implemented honestly, and a
//! count of what each identity asked and was sent.
//!
//! What it serves (anything else is a 404, or a 405 for a verb it does not serve, and is listed
//! in [`Counts::unsupported`]):
//!
//! | resource | verbs |
//! |---|---|
//! | `machineoperations` (`unbounded-cloud.io`, cluster) | list and watch with field selectors (`spec.machineRef`, `metadata.name`) and label selectors, get, create, delete (UID and resourceVersion preconditions) and delete by selection, merge patch of `/status` |
//! | `machines` (cluster) | get (none exist: 404) |
//! | `nodes` | list and watch (`metadata.name`, labels), get, create, delete, merge patch and merge patch of `/status` |
//! | `pods` | list with `spec.nodeName`, create, delete by selection, `eviction` (UID precondition; the pod is deleted at once) |
//! | `configmaps` | get, create, replace, merge patch |
//! | `events` | create |
//!
//! Every object has a `resourceVersion` from one counter; a write that names a
//! `resourceVersion` (in a merge patch's or a replacement's `metadata`) other than the current
//! one is refused `409 Conflict`, as the real API server's optimistic concurrency does. A watch
//! sends every change after the `resourceVersion` it names, through its selectors (an object
//! that leaves the selection is sent as `DELETED`, one that enters it as `ADDED`).
//!
//! What it does not do: authentication, authorization (RBAC, the Node authorizer) and
//! admission (NodeRestriction, ValidatingAdmissionPolicies) — the identity in the
//! `Impersonate-User` header is only counted; PodDisruptionBudgets (every eviction is
//! accepted); pods' grace periods (an evicted pod is gone at once); set-based label selectors
//! (refused `400`); strategic-merge and JSON patches (refused `415`); watch bookmarks and
//! compaction (`410 Gone` never happens).
//!
//! With `selectable_fields` off it answers a field selector on `spec.machineRef` as a
//! Kubernetes whose CRD has no `selectableFields` does (`400 field label not supported`), so
//! the daemon's own fallback (watching every operation) is what runs.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// The identity a request without an `Impersonate-User` header is counted under (the
/// simulator's own setup and its simulated kubelets).
pub const ADMIN: &str = "admin";

/// The MachineOperation API group and version the CRD serves.
pub const MOP_GROUP_VERSION: &str = "unbounded-cloud.io/v1alpha3";

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// The kinds it stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `unbounded-cloud.io` MachineOperation (cluster-scoped).
    MachineOperation,
    /// `unbounded-cloud.io` Machine (cluster-scoped; read only).
    Machine,
    /// Node.
    Node,
    /// Pod.
    Pod,
    /// ConfigMap.
    ConfigMap,
    /// core/v1 Event.
    Event,
}

impl Kind {
    fn from_route(group_version: &str, plural: &str) -> Option<Self> {
        Some(match (group_version, plural) {
            (MOP_GROUP_VERSION, "machineoperations") => Kind::MachineOperation,
            (MOP_GROUP_VERSION, "machines") => Kind::Machine,
            ("v1", "nodes") => Kind::Node,
            ("v1", "pods") => Kind::Pod,
            ("v1", "configmaps") => Kind::ConfigMap,
            ("v1", "events") => Kind::Event,
            _ => return None,
        })
    }

    fn namespaced(self) -> bool {
        matches!(self, Kind::Pod | Kind::ConfigMap | Kind::Event)
    }

    fn api_version(self) -> &'static str {
        match self {
            Kind::MachineOperation | Kind::Machine => MOP_GROUP_VERSION,
            _ => "v1",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::MachineOperation => "MachineOperation",
            Kind::Machine => "Machine",
            Kind::Node => "Node",
            Kind::Pod => "Pod",
            Kind::ConfigMap => "ConfigMap",
            Kind::Event => "Event",
        }
    }

    /// Whether writes to the main resource leave `status` alone (a status subresource).
    fn has_status(self) -> bool {
        matches!(self, Kind::MachineOperation | Kind::Node | Kind::Pod)
    }

    /// The JSON pointer of a selectable field, `None` when the field is not selectable.
    fn field(self, field: &str, selectable_mop_ref: bool) -> Option<&'static str> {
        Some(match (self, field) {
            (_, "metadata.name") => "/metadata/name",
            (_, "metadata.namespace") => "/metadata/namespace",
            (Kind::MachineOperation, "spec.machineRef") if selectable_mop_ref => "/spec/machineRef",
            (Kind::Pod, "spec.nodeName") => "/spec/nodeName",
            (Kind::Pod, "status.phase") => "/status/phase",
            (Kind::Node, "spec.unschedulable") => "/spec/unschedulable",
            _ => return None,
        })
    }
}

/// What one identity asked and was sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdentityCounts {
    /// HTTP requests (a watch counts once, when it starts).
    pub requests: u64,
    /// Events sent on its watches (of every kind).
    pub watch_events: u64,
    /// Events about MachineOperations sent on its watches.
    pub operation_watch_events: u64,
    /// Objects its lists returned.
    pub listed: u64,
    /// The MachineOperations it was sent, by lists or watches.
    pub operations_seen: BTreeSet<String>,
    /// MachineOperation watches it has open now.
    pub open_operation_watches: u64,
    /// Conflicts (409) it was answered.
    pub conflicts: u64,
}

/// What the server counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// By identity (`Impersonate-User`, else [`ADMIN`]).
    pub by_identity: BTreeMap<String, IdentityCounts>,
    /// Event reasons created, with how many.
    pub event_reasons: BTreeMap<String, u64>,
    /// Requests it does not implement (`METHOD path`), which were answered 404.
    pub unsupported: Vec<String>,
    /// Changes (creation, each write, deletion) of each MachineOperation, by name: what a
    /// watch of that operation alone is sent.
    pub operation_changes: BTreeMap<String, u64>,
}

/// One change, as a watch sends it.
#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    kind: Kind,
    /// The object before (`None`: created).
    before: Option<Value>,
    /// The object after (`None`: deleted).
    after: Option<Value>,
}

type Key = (Kind, String, String);

struct State {
    rv: u64,
    uid: u64,
    objects: BTreeMap<Key, Value>,
    log: Vec<Change>,
    counts: Counts,
    selectable_fields: bool,
    /// The resourceVersion each open watch has sent up to, by watch.
    cursors: BTreeMap<u64, u64>,
    watches: u64,
}

/// The server; dropping it stops it.
pub struct FakeApiServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: CancellationToken,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while the lock was held leaves counts a test would still read.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl FakeApiServer {
    /// Starts it on 127.0.0.1 (a free port). `selectable_fields`: whether MachineOperations
    /// may be selected by `spec.machineRef` (the CRD's `selectableFields`).
    pub async fn start(selectable_fields: bool) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State {
            rv: 1,
            uid: 0,
            objects: BTreeMap::new(),
            log: Vec::new(),
            counts: Counts::default(),
            selectable_fields,
            cursors: BTreeMap::new(),
            watches: 0,
        }));
        let (changed, _) = watch::channel(1u64);
        let changed = Arc::new(changed);
        let stop = CancellationToken::new();
        let server = Server {
            state: state.clone(),
            changed,
            stop: stop.clone(),
        };
        tokio::spawn(server.accept(listener));
        Ok(Self { addr, state, stop })
    }

    /// Its base URL (`http://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What it counted so far.
    pub fn counts(&self) -> Counts {
        lock(&self.state).counts.clone()
    }

    /// Whether every open watch has been sent every change so far (so the counts include
    /// them).
    pub fn watches_caught_up(&self) -> bool {
        let st = lock(&self.state);
        st.cursors.values().all(|c| *c >= st.rv)
    }
}

#[derive(Clone)]
struct Server {
    state: Arc<Mutex<State>>,
    changed: Arc<watch::Sender<u64>>,
    stop: CancellationToken,
}

/// A request's parts the routes need.
struct Call {
    method: Method,
    identity: String,
    kind: Kind,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
    query: BTreeMap<String, String>,
    content_type: String,
    body: Bytes,
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code.as_u16(),
    });
    respond(code, &body)
}

fn respond(code: StatusCode, body: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())).boxed_unsync());
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

/// RFC 7386 JSON merge patch of `target` with `patch`.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// A selector term: `key=value`, `key!=value`, `key` (exists), `!key` (does not exist).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Term {
    /// `key=value` or `key==value`.
    Eq(String, String),
    /// `key!=value`.
    Ne(String, String),
    /// `key`.
    Exists(String),
    /// `!key`.
    Absent(String),
}

/// Parses an equality-based selector (`a=b,c!=d,e,!f`); `Err` for what this server does not
/// implement (set-based terms: `in`, `notin`, parentheses).
pub fn parse_selector(s: &str) -> Result<Vec<Term>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.contains('(') || part.contains(' ') {
            return Err(format!(
                "selector term {part:?} is set-based: not implemented by the fleet simulator's API server"
            ));
        }
        let term = if let Some((k, v)) = part.split_once("!=") {
            Term::Ne(k.into(), v.into())
        } else if let Some((k, v)) = part.split_once("==") {
            Term::Eq(k.into(), v.into())
        } else if let Some((k, v)) = part.split_once('=') {
            Term::Eq(k.into(), v.into())
        } else if let Some(k) = part.strip_prefix('!') {
            Term::Absent(k.into())
        } else {
            Term::Exists(part.into())
        };
        out.push(term);
    }
    Ok(out)
}

/// Whether `value` (`None`: absent) meets `term`.
fn meets(term: &Term, value: Option<&str>) -> bool {
    match term {
        Term::Eq(_, v) => value == Some(v.as_str()),
        Term::Ne(_, v) => value != Some(v.as_str()),
        Term::Exists(_) => value.is_some(),
        Term::Absent(_) => value.is_none(),
    }
}

fn term_key(term: &Term) -> &str {
    match term {
        Term::Eq(k, _) | Term::Ne(k, _) | Term::Exists(k) | Term::Absent(k) => k,
    }
}

/// A list's or watch's selection.
#[derive(Clone, Debug)]
struct Selection {
    kind: Kind,
    namespace: Option<String>,
    /// `(JSON pointer, term)`.
    fields: Vec<(&'static str, Term)>,
    labels: Vec<Term>,
}

impl Selection {
    fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && obj.pointer("/metadata/namespace").and_then(Value::as_str) != Some(ns.as_str())
        {
            return false;
        }
        let fields = self.fields.iter().all(|(ptr, t)| {
            // A field the object lacks reads as its zero value, as the API server's does.
            let v = match obj.pointer(ptr) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Null) | None if ptr.ends_with("unschedulable") => "false".into(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            meets(t, Some(&v))
        });
        let labels = self.labels.iter().all(|t| {
            let v = obj
                .pointer("/metadata/labels")
                .and_then(|l| l.get(term_key(t)))
                .and_then(Value::as_str);
            meets(t, v)
        });
        fields && labels
    }
}

impl Server {
    async fn accept(self, listener: TcpListener) {
        loop {
            let (stream, _) = tokio::select! {
                _ = self.stop.cancelled() => return,
                a = listener.accept() => match a {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "fake API server: accept failed");
                        continue;
                    }
                },
            };
            let me = self.clone();
            let svc = service_fn(move |req: Request<Incoming>| {
                let me = me.clone();
                async move { Ok::<_, Infallible>(me.handle(req).await) }
            });
            let stop = self.stop.clone();
            tokio::spawn(async move {
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc);
                tokio::select! {
                    _ = stop.cancelled() => {}
                    r = conn => if let Err(e) = r {
                        tracing::debug!(error = %e, "fake API server: connection ended with an error");
                    },
                }
            });
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let identity = req
            .headers()
            .get("impersonate-user")
            .and_then(|v| v.to_str().ok())
            .unwrap_or(ADMIN)
            .to_string();
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let query: BTreeMap<String, String> =
            url::form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes())
                .into_owned()
                .collect();
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        self.state()
            .counts
            .by_identity
            .entry(identity.clone())
            .or_default()
            .requests += 1;
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                return status(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string());
            }
        };
        let Some(call) = route(&method, &path, identity, query, content_type, body) else {
            self.state()
                .counts
                .unsupported
                .push(format!("{method} {path}"));
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("{method} {path}: not implemented by the fleet simulator's API server"),
            );
        };
        self.serve(call).await
    }

    async fn serve(&self, call: Call) -> Response<Body> {
        let collection = call.name.is_none();
        match (&call.method, collection, call.sub.as_deref()) {
            (&Method::GET, true, None) => {
                if matches!(
                    call.query.get("watch").map(String::as_str),
                    Some("true" | "1")
                ) {
                    self.watch(call)
                } else {
                    self.list(&call)
                }
            }
            (&Method::POST, true, None) => self.create(&call),
            (&Method::GET, false, None) => self.get(&call),
            (&Method::PUT, false, None) => self.write(&call, Write::Replace),
            (&Method::PATCH, false, None) => self.write(&call, Write::Patch),
            (&Method::PATCH, false, Some("status")) => self.write(&call, Write::PatchStatus),
            (&Method::DELETE, false, None) => self.delete(&call),
            (&Method::DELETE, true, None) => self.delete_collection(&call),
            (&Method::POST, false, Some("eviction")) if call.kind == Kind::Pod => self.evict(&call),
            _ => {
                let what = format!(
                    "{} {}{}",
                    call.method,
                    call.kind.name(),
                    call.sub.map(|s| format!("/{s}")).unwrap_or_default()
                );
                self.state().counts.unsupported.push(what.clone());
                status(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    &format!("{what}: not implemented by the fleet simulator's API server"),
                )
            }
        }
    }

    /// The call's selection; `Err` is the 400's message.
    fn selection(&self, call: &Call) -> Result<Selection, String> {
        let selectable = self.state().selectable_fields;
        let mut fields = Vec::new();
        if let Some(f) = call.query.get("fieldSelector") {
            for t in parse_selector(f)? {
                let Some(ptr) = call.kind.field(term_key(&t), selectable) else {
                    // The API server's own words for a field it cannot select by.
                    return Err(format!("field label not supported: {}", term_key(&t)));
                };
                if matches!(t, Term::Exists(_) | Term::Absent(_)) {
                    return Err(format!("invalid field selector term {t:?}"));
                }
                fields.push((ptr, t));
            }
        }
        let labels = match call.query.get("labelSelector") {
            Some(l) => parse_selector(l)?,
            None => Vec::new(),
        };
        Ok(Selection {
            kind: call.kind,
            namespace: call.namespace.clone(),
            fields,
            labels,
        })
    }

    fn list(&self, call: &Call) -> Response<Body> {
        let sel = match self.selection(call) {
            Ok(s) => s,
            Err(m) => return status(StatusCode::BAD_REQUEST, "BadRequest", &m),
        };
        let mut st = self.state();
        let mut items: Vec<Value> = st
            .objects
            .iter()
            .filter(|((k, _, _), o)| *k == call.kind && sel.matches(o))
            .map(|(_, o)| o.clone())
            .collect();
        // Pages: `continue` is the offset of the next item.
        let from: usize = call
            .query
            .get("continue")
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let limit: Option<usize> = call
            .query
            .get("limit")
            .and_then(|l| l.parse().ok())
            .filter(|l| *l > 0);
        let total = items.len();
        items = items.into_iter().skip(from).collect();
        let mut meta = json!({"resourceVersion": st.rv.to_string()});
        if let Some(l) = limit
            && items.len() > l
        {
            items.truncate(l);
            meta["continue"] = json!((from + l).to_string());
            meta["remainingItemCount"] = json!(total - from - l);
        }
        let c = st
            .counts
            .by_identity
            .entry(call.identity.clone())
            .or_default();
        c.listed += items.len() as u64;
        if call.kind == Kind::MachineOperation {
            for o in &items {
                if let Some(n) = o.pointer("/metadata/name").and_then(Value::as_str) {
                    c.operations_seen.insert(n.to_string());
                }
            }
        }
        respond(
            StatusCode::OK,
            &json!({
                "apiVersion": call.kind.api_version(),
                "kind": format!("{}List", call.kind.name()),
                "metadata": meta,
                "items": items,
            }),
        )
    }

    fn watch(&self, call: Call) -> Response<Body> {
        let sel = match self.selection(&call) {
            Ok(s) => s,
            Err(m) => return status(StatusCode::BAD_REQUEST, "BadRequest", &m),
        };
        let (tx, rx) = mpsc::channel::<Bytes>(64);
        let from: Option<u64> = call
            .query
            .get("resourceVersion")
            .and_then(|r| r.parse().ok())
            .filter(|r| *r > 0);
        let timeout = call
            .query
            .get("timeoutSeconds")
            .and_then(|t| t.parse().ok())
            .map(Duration::from_secs)
            .unwrap_or(Duration::from_secs(1800));
        let me = self.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            // The watch's own timeout drops the feed; the client starts another.
            let _ = tokio::time::timeout_at(deadline, me.feed(call.identity, sel, from, tx)).await;
        });
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
        });
        let mut r = Response::new(StreamBody::new(stream).boxed_unsync());
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        r
    }

    /// Sends the watch's events to `tx` until the client goes or the server stops.
    async fn feed(
        &self,
        identity: String,
        sel: Selection,
        from: Option<u64>,
        tx: mpsc::Sender<Bytes>,
    ) {
        let mut changed = self.changed.subscribe();
        let ops = sel.kind == Kind::MachineOperation;
        let (id, mut cursor) = {
            let mut st = self.state();
            if ops {
                st.counts
                    .by_identity
                    .entry(identity.clone())
                    .or_default()
                    .open_operation_watches += 1;
            }
            st.watches += 1;
            let (id, rv) = (st.watches, st.rv);
            st.cursors.insert(id, rv);
            (id, rv)
        };
        let _open = Open {
            server: self.clone(),
            id,
            identity: identity.clone(),
            ops,
        };
        // No resourceVersion: the current objects first, as ADDED.
        let mut pending: Vec<(String, Value)> = Vec::new();
        match from {
            None => {
                let st = self.state();
                pending.extend(
                    st.objects
                        .iter()
                        .filter(|((k, _, _), o)| *k == sel.kind && sel.matches(o))
                        .map(|(_, o)| ("ADDED".to_string(), o.clone())),
                );
            }
            Some(rv) => cursor = rv,
        }
        loop {
            {
                let mut st = self.state();
                // The log is in resourceVersion order: start after the cursor.
                let start = st.log.partition_point(|c| c.rv <= cursor);
                for c in st.log[start..].iter().filter(|c| c.kind == sel.kind) {
                    let was = c.before.as_ref().is_some_and(|o| sel.matches(o));
                    let is = c.after.as_ref().is_some_and(|o| sel.matches(o));
                    let ev = match (was, is, &c.after) {
                        (false, true, Some(o)) => Some(("ADDED", o.clone())),
                        (true, true, Some(o)) => Some(("MODIFIED", o.clone())),
                        (true, false, Some(o)) => Some(("DELETED", o.clone())),
                        (true, _, None) => c.before.clone().map(|o| ("DELETED", o)),
                        _ => None,
                    };
                    if let Some((t, o)) = ev {
                        pending.push((t.to_string(), o));
                    }
                }
                cursor = st.rv;
                st.cursors.insert(id, cursor);
                let counts = st.counts.by_identity.entry(identity.clone()).or_default();
                for (_, o) in &pending {
                    counts.watch_events += 1;
                    if ops {
                        counts.operation_watch_events += 1;
                        if let Some(n) = o.pointer("/metadata/name").and_then(Value::as_str) {
                            counts.operations_seen.insert(n.to_string());
                        }
                    }
                }
            }
            for (t, o) in pending.drain(..) {
                let mut line = json!({"type": t, "object": o}).to_string();
                line.push('\n');
                if tx.send(Bytes::from(line)).await.is_err() {
                    return;
                }
            }
            tokio::select! {
                _ = self.stop.cancelled() => break,
                _ = tx.closed() => break,
                r = changed.changed() => if r.is_err() { break },
            }
        }
    }

    fn closed(&self, id: u64, identity: &str, ops: bool) {
        let mut st = self.state();
        st.cursors.remove(&id);
        if ops {
            let c = st
                .counts
                .by_identity
                .entry(identity.to_string())
                .or_default();
            c.open_operation_watches = c.open_operation_watches.saturating_sub(1);
        }
    }

    fn get(&self, call: &Call) -> Response<Body> {
        let key = key(call);
        match self.state().objects.get(&key) {
            Some(o) => respond(StatusCode::OK, o),
            None => not_found(call),
        }
    }

    fn create(&self, call: &Call) -> Response<Body> {
        let mut obj: Value = match serde_json::from_slice(&call.body) {
            Ok(v) => v,
            Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
        };
        let name = match obj.pointer("/metadata/name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "metadata.name: Required value",
                );
            }
        };
        let key = (call.kind, call.namespace.clone().unwrap_or_default(), name);
        if call.kind == Kind::Event {
            let reason = obj
                .get("reason")
                .and_then(Value::as_str)
                .unwrap_or_default();
            *self
                .state()
                .counts
                .event_reasons
                .entry(reason.to_string())
                .or_default() += 1;
        }
        let mut st = self.state();
        if st.objects.contains_key(&key) {
            return status(
                StatusCode::CONFLICT,
                "AlreadyExists",
                &format!("{} {:?} already exists", call.kind.name(), key.2),
            );
        }
        st.uid += 1;
        let uid = format!("fake-uid-{}", st.uid);
        obj["apiVersion"] = json!(call.kind.api_version());
        obj["kind"] = json!(call.kind.name());
        obj["metadata"]["uid"] = json!(uid);
        obj["metadata"]["generation"] = json!(1);
        obj["metadata"]["creationTimestamp"] =
            json!(k8s_openapi::jiff::Timestamp::now().to_string());
        if let Some(ns) = &call.namespace {
            obj["metadata"]["namespace"] = json!(ns);
        }
        if call.kind == Kind::Event {
            // Events are counted, not kept: nothing the daemon does reads them back.
            st.rv += 1;
            obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
            drop(st);
            self.notify();
            return respond(StatusCode::CREATED, &obj);
        }
        let written = commit(&mut st, key, None, Some(obj));
        drop(st);
        self.notify();
        respond(StatusCode::CREATED, &written.unwrap_or(Value::Null))
    }

    fn write(&self, call: &Call, how: Write) -> Response<Body> {
        let body: Value = match serde_json::from_slice(&call.body) {
            Ok(v) => v,
            Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
        };
        if how != Write::Replace
            && !call
                .content_type
                .starts_with("application/merge-patch+json")
        {
            return status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                &format!(
                    "patch type {:?} is not implemented by the fleet simulator's API server (merge patches only)",
                    call.content_type
                ),
            );
        }
        let key = key(call);
        let mut st = self.state();
        let Some(current) = st.objects.get(&key).cloned() else {
            drop(st);
            return not_found(call);
        };
        let have = current
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if let Some(want) = body
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            && want != have
        {
            st.counts
                .by_identity
                .entry(call.identity.clone())
                .or_default()
                .conflicts += 1;
            return status(
                StatusCode::CONFLICT,
                "Conflict",
                &format!(
                    "Operation cannot be fulfilled on {} \"{}\": the object has been modified; please apply your changes to the latest version and try again",
                    call.kind.name(),
                    key.2
                ),
            );
        }
        let mut next = match how {
            Write::Replace => body.clone(),
            Write::Patch | Write::PatchStatus => {
                let mut n = current.clone();
                merge_patch(&mut n, &body);
                n
            }
        };
        // What a write may not change: identity, and (through the main resource) the status
        // or (through /status) anything but the status.
        match how {
            Write::PatchStatus => {
                let status = next.get("status").cloned();
                next = current.clone();
                match status {
                    Some(s) => next["status"] = s,
                    None => {
                        if let Some(o) = next.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
            }
            Write::Replace | Write::Patch if call.kind.has_status() => {
                match current.get("status") {
                    Some(s) => next["status"] = s.clone(),
                    None => {
                        if let Some(o) = next.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
            }
            _ => {}
        }
        for f in [
            "uid",
            "creationTimestamp",
            "namespace",
            "name",
            "generation",
        ] {
            match current["metadata"].get(f) {
                Some(v) => next["metadata"][f] = v.clone(),
                None => {
                    if let Some(m) = next["metadata"].as_object_mut() {
                        m.remove(f);
                    }
                }
            }
        }
        next["apiVersion"] = current["apiVersion"].clone();
        next["kind"] = current["kind"].clone();
        if how != Write::PatchStatus && next.get("spec") != current.get("spec") {
            let g = current
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            next["metadata"]["generation"] = json!(g + 1);
        }
        let written = commit(&mut st, key, Some(current), Some(next));
        drop(st);
        self.notify();
        respond(StatusCode::OK, &written.unwrap_or(Value::Null))
    }

    /// Deletes every object of the selection; answers the list of them.
    fn delete_collection(&self, call: &Call) -> Response<Body> {
        let sel = match self.selection(call) {
            Ok(s) => s,
            Err(m) => return status(StatusCode::BAD_REQUEST, "BadRequest", &m),
        };
        let mut st = self.state();
        let doomed: Vec<(Key, Value)> = st
            .objects
            .iter()
            .filter(|((k, _, _), o)| *k == call.kind && sel.matches(o))
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect();
        let items: Vec<Value> = doomed.iter().map(|(_, o)| o.clone()).collect();
        for (key, o) in doomed {
            commit(&mut st, key, Some(o), None);
        }
        let rv = st.rv;
        drop(st);
        self.notify();
        respond(
            StatusCode::OK,
            &json!({
                "apiVersion": call.kind.api_version(),
                "kind": format!("{}List", call.kind.name()),
                "metadata": {"resourceVersion": rv.to_string()},
                "items": items,
            }),
        )
    }

    fn delete(&self, call: &Call) -> Response<Body> {
        let opts: Value = serde_json::from_slice(&call.body).unwrap_or(Value::Null);
        let key = key(call);
        let mut st = self.state();
        let Some(current) = st.objects.get(&key).cloned() else {
            drop(st);
            return not_found(call);
        };
        for (field, ptr) in [
            ("uid", "/metadata/uid"),
            ("resourceVersion", "/metadata/resourceVersion"),
        ] {
            if let Some(want) = opts
                .pointer(&format!("/preconditions/{field}"))
                .and_then(Value::as_str)
                && current.pointer(ptr).and_then(Value::as_str) != Some(want)
            {
                return status(
                    StatusCode::CONFLICT,
                    "Conflict",
                    &format!("Precondition failed: {field} in precondition: {want}"),
                );
            }
        }
        commit(&mut st, key, Some(current.clone()), None);
        drop(st);
        self.notify();
        respond(StatusCode::OK, &current)
    }

    fn evict(&self, call: &Call) -> Response<Body> {
        let body: Value = serde_json::from_slice(&call.body).unwrap_or(Value::Null);
        let key = key(call);
        let mut st = self.state();
        let Some(current) = st.objects.get(&key).cloned() else {
            drop(st);
            return not_found(call);
        };
        if let Some(want) = body
            .pointer("/deleteOptions/preconditions/uid")
            .and_then(Value::as_str)
            && current.pointer("/metadata/uid").and_then(Value::as_str) != Some(want)
        {
            return status(
                StatusCode::CONFLICT,
                "Conflict",
                &format!("Precondition failed: UID in precondition: {want}"),
            );
        }
        // No PodDisruptionBudgets, no grace period: the pod is gone at once.
        commit(&mut st, key, Some(current), None);
        drop(st);
        self.notify();
        respond(
            StatusCode::CREATED,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        )
    }

    fn notify(&self) {
        let rv = self.state().rv;
        self.changed.send_replace(rv);
    }
}

/// An open watch, counted until dropped (however its feed ends).
struct Open {
    server: Server,
    id: u64,
    identity: String,
    ops: bool,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.server.closed(self.id, &self.identity, self.ops);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Write {
    Replace,
    Patch,
    PatchStatus,
}

fn key(call: &Call) -> Key {
    (
        call.kind,
        call.namespace.clone().unwrap_or_default(),
        call.name.clone().unwrap_or_default(),
    )
}

fn not_found(call: &Call) -> Response<Body> {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!(
            "{} \"{}\" not found",
            call.kind.name(),
            call.name.as_deref().unwrap_or_default()
        ),
    )
}

/// Stores `after` (or deletes) with a new resourceVersion, logs the change; returns the
/// object as stored.
fn commit(st: &mut State, key: Key, before: Option<Value>, after: Option<Value>) -> Option<Value> {
    st.rv += 1;
    let rv = st.rv;
    let after = after.map(|mut o| {
        o["metadata"]["resourceVersion"] = json!(rv.to_string());
        o
    });
    match &after {
        Some(o) => {
            st.objects.insert(key.clone(), o.clone());
        }
        None => {
            st.objects.remove(&key);
        }
    }
    if key.0 == Kind::MachineOperation {
        *st.counts
            .operation_changes
            .entry(key.2.clone())
            .or_default() += 1;
    }
    st.log.push(Change {
        rv,
        kind: key.0,
        before,
        after: after.clone(),
    });
    after
}

/// `METHOD path` to a call, `None` when no route serves it.
fn route(
    method: &Method,
    path: &str,
    identity: String,
    query: BTreeMap<String, String>,
    content_type: String,
    body: Bytes,
) -> Option<Call> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (gv, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("v1".to_string(), rest),
        ["apis", g, v, rest @ ..] => (format!("{g}/{v}"), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        rest => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(s.to_string())),
        _ => return None,
    };
    let kind = Kind::from_route(&gv, plural)?;
    if kind.namespaced() && namespace.is_none() && (name.is_some() || *method != Method::GET) {
        return None;
    }
    if !kind.namespaced() && namespace.is_some() {
        return None;
    }
    Some(Call {
        method: method.clone(),
        identity,
        kind,
        namespace,
        name,
        sub,
        query,
        content_type,
        body,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

    use super::*;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let cases = [
            (
                json!({"a": 1, "b": {"c": 2}}),
                json!({"b": {"c": null, "d": 3}}),
                json!({"a": 1, "b": {"d": 3}}),
            ),
            (json!({"a": [1, 2]}), json!({"a": [3]}), json!({"a": [3]})),
            (json!({"a": 1}), json!({"a": null}), json!({})),
            (json!("x"), json!({"a": 1}), json!({"a": 1})),
        ];
        for (mut target, patch, want) in cases {
            merge_patch(&mut target, &patch);
            assert_eq!(target, want, "{patch}");
        }
    }

    #[test]
    fn selectors_parse_equality_terms_and_refuse_set_based_ones() {
        assert_eq!(
            parse_selector("a=b,c==d,e!=f,g,!h").unwrap(),
            vec![
                Term::Eq("a".into(), "b".into()),
                Term::Eq("c".into(), "d".into()),
                Term::Ne("e".into(), "f".into()),
                Term::Exists("g".into()),
                Term::Absent("h".into()),
            ]
        );
        assert_eq!(
            parse_selector("spec.machineRef=").unwrap(),
            vec![Term::Eq("spec.machineRef".into(), String::new())]
        );
        assert!(parse_selector("env in (a,b)").is_err());
    }

    #[test]
    fn selections_read_absent_fields_as_empty_and_labels_as_absent() {
        let op = json!({"metadata": {"name": "o", "labels": {"tier": "a"}}, "spec": {"machineRef": "n1"}});
        let by_selector = json!({"metadata": {"name": "p"}, "spec": {}});
        let sel = |fields: &str, labels: &str| Selection {
            kind: Kind::MachineOperation,
            namespace: None,
            fields: parse_selector(fields)
                .unwrap()
                .into_iter()
                .map(|t| (Kind::MachineOperation.field(term_key(&t), true).unwrap(), t))
                .collect(),
            labels: parse_selector(labels).unwrap(),
        };
        assert!(sel("spec.machineRef=n1", "").matches(&op));
        assert!(!sel("spec.machineRef=n2", "").matches(&op));
        assert!(sel("spec.machineRef=", "").matches(&by_selector));
        assert!(!sel("spec.machineRef=", "").matches(&op));
        assert!(sel("", "tier=a").matches(&op));
        assert!(!sel("", "tier").matches(&by_selector));
        assert!(sel("", "!tier").matches(&by_selector));
        assert_eq!(Kind::MachineOperation.field("spec.machineRef", false), None);
    }

    #[test]
    fn routes_name_kind_namespace_name_and_subresource() {
        let r = |m: Method, p: &str| {
            route(
                &m,
                p,
                ADMIN.into(),
                BTreeMap::new(),
                String::new(),
                Bytes::new(),
            )
        };
        let c = r(Method::POST, "/api/v1/namespaces/default/pods/web/eviction").unwrap();
        assert_eq!(
            (
                c.kind,
                c.namespace.as_deref(),
                c.name.as_deref(),
                c.sub.as_deref()
            ),
            (Kind::Pod, Some("default"), Some("web"), Some("eviction"))
        );
        let c = r(
            Method::PATCH,
            "/apis/unbounded-cloud.io/v1alpha3/machineoperations/op1/status",
        )
        .unwrap();
        assert_eq!(
            (c.kind, c.name.as_deref(), c.sub.as_deref()),
            (Kind::MachineOperation, Some("op1"), Some("status"))
        );
        assert!(r(Method::GET, "/api/v1/pods").is_some());
        assert!(r(Method::GET, "/api/v1/pods/web").is_none());
        assert!(r(Method::GET, "/apis/apps/v1/deployments").is_none());
    }
}
