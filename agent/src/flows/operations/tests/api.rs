//! A small fake API server behind kube's `tower_test` mock: MachineOperations (GET, list and
//! watch with `spec.machineRef` field selectors as a CRD with `selectableFields` serves them,
//! or refusing them as one without does; status merge patch with the `resourceVersion` precondition, DELETE with
//! preconditions), Nodes and Machines (GET). It logs every request, and hooks let a test act as
//! another writer just before a request.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

const OPS: &str = "/apis/unbounded-cloud.io/v1alpha3/machineoperations";
const MACHINES: &str = "/apis/unbounded-cloud.io/v1alpha3/machines";
const NODES: &str = "/api/v1/nodes";

/// A request as the server saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    /// The query, decoded (`fieldSelector=spec.machineRef=node1&limit=1`).
    pub query: String,
    pub body: Value,
}

impl Seen {
    /// `METHOD path` (for asserting the request sequence).
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

type Hook = Box<dyn FnOnce(&mut State) + Send>;

/// The server's objects and log.
#[derive(Default)]
pub struct State {
    pub ops: BTreeMap<String, Value>,
    pub nodes: BTreeMap<String, Value>,
    pub machines: BTreeMap<String, Value>,
    pub rv: u64,
    pub seen: Vec<Seen>,
    /// Run before the request with this index (0-based) is handled.
    hooks: BTreeMap<usize, Vec<Hook>>,
    /// Watch events (`{"type": …, "object": …}`): each watch request gets those its field
    /// selector matches, the first time a watch with that selector is made (later watches with
    /// it get none, and end).
    pub watch_events: Vec<Value>,
    watched: BTreeSet<String>,
    /// Answer a `spec.machineRef` field selector as a CRD without `selectableFields` does.
    pub refuse_field_selectors: bool,
    /// Operations sent in list answers and watch events: what the watches cost the server.
    pub delivered: usize,
    /// Pods (`GET /api/v1/pods` with a `spec.nodeName` field selector; evictions).
    pub pods: Vec<Value>,
    /// Eviction answers by pod name, in order (then 201 Created, and the pod is gone).
    pub evictions: BTreeMap<String, Vec<(StatusCode, Value)>>,
    /// core/v1 Events created.
    pub events: Vec<Value>,
    /// ConfigMaps by `<namespace>/<name>` (GET; merge PATCH with a resourceVersion
    /// precondition): the disruption budget.
    pub configmaps: BTreeMap<String, Value>,
}

impl State {
    /// Bumps the resourceVersion of operation `name` (another writer changed it).
    pub fn touch(&mut self, name: &str) {
        self.rv += 1;
        let rv = self.rv.to_string();
        if let Some(o) = self.ops.get_mut(name) {
            o["metadata"]["resourceVersion"] = json!(rv);
        }
    }
}

#[derive(Clone, Default)]
pub struct FakeApi(pub Arc<Mutex<State>>);

impl FakeApi {
    pub fn new() -> Self {
        let f = Self::default();
        f.state().rv = 1;
        f
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds an operation (its resourceVersion becomes the server's).
    pub fn put_op(&self, op: &flex_api::machina::MachineOperation) -> &Self {
        let mut v = serde_json::to_value(op).unwrap();
        let mut st = self.state();
        v["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        st.ops.insert(op.metadata.name.clone().unwrap(), v);
        drop(st);
        self
    }

    pub fn put_node(&self, name: &str, labels: &[(&str, &str)]) -> &Self {
        let l: BTreeMap<_, _> = labels.iter().cloned().collect();
        self.state().nodes.insert(
            name.into(),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": l}}),
        );
        self
    }

    pub fn put_machine(&self, name: &str, labels: &[(&str, &str)]) -> &Self {
        let l: BTreeMap<_, _> = labels.iter().cloned().collect();
        self.state().machines.insert(
            name.into(),
            json!({
                "apiVersion": "unbounded-cloud.io/v1alpha3",
                "kind": "Machine",
                "metadata": {"name": name, "labels": l},
                "spec": {},
            }),
        );
        self
    }

    /// Runs `f` on the state just before request number `index` (0-based) is handled.
    pub fn before(&self, index: usize, f: impl FnOnce(&mut State) + Send + 'static) -> &Self {
        self.state()
            .hooks
            .entry(index)
            .or_default()
            .push(Box::new(f));
        self
    }

    /// The request log as `METHOD path` lines.
    pub fn lines(&self) -> Vec<String> {
        self.state().seen.iter().map(Seen::line).collect()
    }

    /// The bodies of the status patches, in order.
    pub fn patches(&self) -> Vec<Value> {
        self.state()
            .seen
            .iter()
            .filter(|s| s.method == Method::PATCH)
            .map(|s| s.body.clone())
            .collect()
    }

    /// The operation as stored.
    pub fn op(&self, name: &str) -> Option<Value> {
        self.state().ops.get(name).cloned()
    }

    /// A client talking to this server (served until every clone of the client is dropped).
    pub fn client(&self) -> Client {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let me = self.clone();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let resp = me.handle(req).await;
                send.send_response(resp);
            }
        });
        Client::new(service, "default")
    }

    async fn handle(&self, req: Request<Body>) -> Response<Body> {
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or_default().to_string();
        let bytes = req.into_body().collect_bytes().await.unwrap();
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        let mut st = self.state();
        let index = st.seen.len();
        st.seen.push(Seen {
            method: method.clone(),
            path: path.clone(),
            query: decode(&query),
            body: body.clone(),
        });
        for hook in st.hooks.remove(&index).unwrap_or_default() {
            hook(&mut st);
        }
        let (code, v) = route(&mut st, &method, &path, &query, &body);
        let bytes = match v {
            Value::String(s) => s.into_bytes(),
            v => serde_json::to_vec(&v).unwrap(),
        };
        Response::builder()
            .status(code)
            .body(Body::from(bytes))
            .unwrap()
    }
}

fn status(code: StatusCode, reason: &str, message: &str) -> (StatusCode, Value) {
    (
        code,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason, "code": code.as_u16(),
        }),
    )
}

/// A request the fake does not serve: a 500 the test sees as an API error (a panic here would
/// leave the client waiting).
fn unexpected(method: &Method, path: &str) -> (StatusCode, Value) {
    status(
        StatusCode::INTERNAL_SERVER_ERROR,
        "InternalError",
        &format!("the fake API server does not serve {method} {path}"),
    )
}

/// What a PATCH changes.
#[derive(Clone, Copy)]
enum Part {
    /// The object, metadata included.
    Whole,
    /// Its `status` subresource: the patch's metadata is ignored, as the API server does.
    Status,
}

/// A merge patch of `obj` as the API server applies it: a `metadata.resourceVersion` in the
/// patch is a precondition (409 Conflict unless it is the object's), and the object gets the
/// next resourceVersion of the server's counter `rv`.
fn patch_if_current(
    obj: &mut Value,
    body: &Value,
    rv: &mut u64,
    part: Part,
) -> (StatusCode, Value) {
    let want = body["metadata"]["resourceVersion"].as_str();
    if want.is_some_and(|w| Some(w) != obj["metadata"]["resourceVersion"].as_str()) {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            "the object has been modified",
        );
    }
    let mut patch = body.clone();
    match part {
        Part::Whole => {
            if let Some(m) = patch["metadata"].as_object_mut() {
                m.remove("resourceVersion");
            }
        }
        Part::Status => {
            if let Some(m) = patch.as_object_mut() {
                m.remove("metadata");
            }
        }
    }
    merge(obj, &patch);
    *rv += 1;
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    (StatusCode::OK, obj.clone())
}

/// RFC 7386 merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

fn route(
    st: &mut State,
    method: &Method,
    path: &str,
    query: &str,
    body: &Value,
) -> (StatusCode, Value) {
    let not_found = |what: &str| {
        status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("{what} not found"),
        )
    };
    if let Some(name) = path.strip_prefix(&format!("{NODES}/")) {
        return match st.nodes.get_mut(name) {
            Some(n) if *method == Method::GET => (StatusCode::OK, n.clone()),
            // A merge patch; a resourceVersion in it is a precondition, as the API server has it.
            Some(n) if *method == Method::PATCH => {
                patch_if_current(n, body, &mut st.rv, Part::Whole)
            }
            _ => not_found(name),
        };
    }
    if let Some(rest) = path.strip_prefix("/api/v1/namespaces/")
        && let Some((ns, name)) = rest.split_once("/configmaps/")
    {
        let key = format!("{ns}/{name}");
        return match st.configmaps.get_mut(&key) {
            Some(c) if *method == Method::GET => (StatusCode::OK, c.clone()),
            Some(c) if *method == Method::PATCH => {
                patch_if_current(c, body, &mut st.rv, Part::Whole)
            }
            _ => not_found(name),
        };
    }
    if let Some(rest) = path.strip_prefix("/api/v1/namespaces/")
        && rest.ends_with("/events")
        && *method == Method::POST
    {
        st.events.push(body.clone());
        return (StatusCode::CREATED, body.clone());
    }
    if path == "/api/v1/pods" && *method == Method::GET {
        let query = decode(query);
        let node = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("fieldSelector=spec.nodeName="));
        let Some(node) = node else {
            return status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                "a node may list only its own pods",
            );
        };
        let items: Vec<Value> = st
            .pods
            .iter()
            .filter(|p| p["spec"]["nodeName"] == node)
            .cloned()
            .collect();
        return (
            StatusCode::OK,
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items}),
        );
    }
    if let Some(rest) = path.strip_prefix("/api/v1/namespaces/")
        && let Some((ns, rest)) = rest.split_once("/pods/")
        && let Some(name) = rest.strip_suffix("/eviction")
        && *method == Method::POST
    {
        if let Some(answers) = st.evictions.get_mut(name)
            && !answers.is_empty()
        {
            return answers.remove(0);
        }
        let uid = body["deleteOptions"]["preconditions"]["uid"].as_str();
        let at = st
            .pods
            .iter()
            .position(|p| p["metadata"]["namespace"] == ns && p["metadata"]["name"] == name);
        return match at {
            None => not_found(name),
            Some(i) if uid.is_some_and(|u| st.pods[i]["metadata"]["uid"] != u) => status(
                StatusCode::CONFLICT,
                "Conflict",
                "Precondition failed: UID in precondition",
            ),
            Some(i) => {
                st.pods.remove(i);
                (
                    StatusCode::CREATED,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
                )
            }
        };
    }
    if let Some(name) = path.strip_prefix(&format!("{MACHINES}/")) {
        return match st.machines.get(name) {
            Some(m) if *method == Method::GET => (StatusCode::OK, m.clone()),
            _ => not_found(name),
        };
    }
    if path == OPS && *method == Method::GET {
        let query = decode(query);
        let selector = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("fieldSelector="))
            .unwrap_or_default()
            .to_string();
        let wanted = match field_matcher(&selector, st.refuse_field_selectors) {
            Ok(m) => m,
            Err(field) => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    &format!("field label not supported: {field}"),
                );
            }
        };
        if query.split('&').any(|kv| kv == "watch=true") {
            let first = st.watched.insert(selector);
            let events: Vec<&Value> = st
                .watch_events
                .iter()
                .filter(|e| first && wanted(&e["object"]))
                .collect();
            let body: String = events.iter().map(|e| e.to_string() + "\n").collect();
            st.delivered += events.len();
            return (StatusCode::OK, Value::String(body));
        }
        let limit = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("limit="))
            .and_then(|l| l.parse().ok())
            .unwrap_or(usize::MAX);
        let items: Vec<Value> = st
            .ops
            .values()
            .filter(|o| wanted(o))
            .take(limit)
            .cloned()
            .collect();
        st.delivered += items.len();
        return (
            StatusCode::OK,
            json!({
                "apiVersion": "unbounded-cloud.io/v1alpha3",
                "kind": "MachineOperationList",
                "metadata": {"resourceVersion": st.rv.to_string()},
                "items": items,
            }),
        );
    }
    let Some(rest) = path.strip_prefix(&format!("{OPS}/")) else {
        return unexpected(method, path);
    };
    let (name, sub) = match rest.split_once('/') {
        Some((n, s)) => (n.to_string(), Some(s)),
        None => (rest.to_string(), None),
    };
    let Some(obj) = st.ops.get_mut(&name) else {
        return not_found(&name);
    };
    let current_rv = obj["metadata"]["resourceVersion"].clone();
    match (method.clone(), sub) {
        (Method::GET, None) => (StatusCode::OK, obj.clone()),
        (Method::PATCH, Some("status")) => patch_if_current(obj, body, &mut st.rv, Part::Status),
        (Method::DELETE, None) => {
            let pre = &body["preconditions"];
            let uid_ok = pre["uid"].is_null() || pre["uid"] == obj["metadata"]["uid"];
            let rv_ok = pre["resourceVersion"].is_null() || pre["resourceVersion"] == current_rv;
            if !(uid_ok && rv_ok) {
                return status(StatusCode::CONFLICT, "Conflict", "precondition failed");
            }
            let out = obj.clone();
            st.ops.remove(&name);
            (StatusCode::OK, out)
        }
        (m, _) => unexpected(&m, path),
    }
}

/// `%XX` and `+` decoded (the query as kube encodes it).
fn decode(q: &str) -> String {
    let b = q.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

type Matcher = Box<dyn Fn(&Value) -> bool>;

/// The objects a field selector matches: none, or `spec.machineRef=<v>` (an absent field reads
/// as ""). Any other field, or this one when `refuse` is set, is the field the API server
/// does not support.
fn field_matcher(selector: &str, refuse: bool) -> Result<Matcher, String> {
    if selector.is_empty() {
        return Ok(Box::new(|_| true));
    }
    let (field, value) = selector.split_once('=').unwrap_or((selector, ""));
    if field != "spec.machineRef" || refuse {
        return Err(field.to_string());
    }
    let value = value.to_string();
    Ok(Box::new(move |o: &Value| {
        o["spec"]["machineRef"].as_str().unwrap_or_default() == value
    }))
}
