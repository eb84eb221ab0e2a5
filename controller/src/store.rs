//! Where machines come from: the [`MachineStore`] trait, the ConfigMap store the controller
//! runs with ([`ConfigMapStore`], `kube-system/aks-flex-machines`, read at most once every
//! [`CACHE_FOR`], whatever the number of callers) and an
//! in-memory store behind the same trait ([`MemoryStore`], for tests and local runs).
//!
//! Both look machines up the same way ([`lookup`]): the data key `<machine>.json`, then
//! `<machine>`; the value trimmed and parsed as ARM machine JSON. Each key names one machine:
//! `x.json` is machine `x`, never a machine called `x.json`, which is not found (else node1's
//! key would also answer for `node1.json`, a name the held-certificate check knows nothing of). A missing ConfigMap, a value
//! that does not parse and an API error make the store unavailable (the server answers 503); a
//! missing key is "not found" (404).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use flex_api::arm::{ArmMachine, parse_arm_machine};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;

/// Why a machine could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// No entry for the machine.
    #[error("machine {0:?} not found")]
    NotFound(String),
    /// The data source is missing, broken or unreachable.
    #[error("{0}")]
    Unavailable(String),
}

/// A source of machines by name.
#[async_trait]
pub trait MachineStore: Send + Sync {
    /// The machine named `name`.
    async fn get(&self, name: &str) -> Result<ArmMachine, StoreError>;

    /// A status report for `name` (the PATCH body). The endpoint is read-only: the default
    /// ignores it, as upstream does.
    async fn record_status(&self, _name: &str, _body: &[u8]) {}
}

/// Looks `machine` up in a ConfigMap's `data` (`None`: the ConfigMap does not exist).
pub fn lookup(
    data: Option<&BTreeMap<String, String>>,
    namespace: &str,
    config_map: &str,
    machine: &str,
) -> Result<ArmMachine, StoreError> {
    let Some(data) = data else {
        return Err(StoreError::Unavailable(format!(
            "machine config map {namespace}/{config_map} not found"
        )));
    };
    // `<m>.json` is machine `m`'s key: a name that ends in `.json` would read another
    // machine's entry through the bare-key fallback.
    if machine.ends_with(".json") {
        return Err(StoreError::NotFound(machine.to_string()));
    }
    let json_key = format!("{machine}.json");
    let (key, value) = match data.get(&json_key) {
        Some(v) => (json_key.as_str(), v),
        None => match data.get(machine) {
            Some(v) => (machine, v),
            None => return Err(StoreError::NotFound(machine.to_string())),
        },
    };
    parse_arm_machine(value.trim().as_bytes()).map_err(|e| {
        StoreError::Unavailable(format!(
            "machine config map key {key:?} is not valid ARM machine JSON: {e}"
        ))
    })
}

/// How long one read of the machine ConfigMap answers every lookup. Machine reads come from
/// every node's daemon through the service proxy and from the CSR approver, under one identity:
/// read once per this period, a flood of requests costs the API server nothing more, and a
/// change to the ConfigMap is seen this much later at most.
pub const CACHE_FOR: Duration = Duration::from_secs(2);

/// One read of the ConfigMap: its `data` (`None`: no ConfigMap), or why it could not be read.
type Read = Result<Option<BTreeMap<String, String>>, StoreError>;

/// The ConfigMap store: GET `<namespace>/<name>`, at most once every [`CACHE_FOR`]. Lookups
/// that come while a read is on its way wait for it (one read for all of them); a failed read
/// is kept as long as a good one, so a failing API server is not asked more often either.
#[derive(Clone)]
pub struct ConfigMapStore {
    api: Api<ConfigMap>,
    namespace: String,
    name: String,
    cache_for: Duration,
    last: Arc<tokio::sync::Mutex<Option<(Instant, Read)>>>,
}

impl ConfigMapStore {
    /// A store over `namespace/name`.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            cache_for: CACHE_FOR,
            last: Arc::new(tokio::sync::Mutex::new(None)),
        }
    }

    /// The same store, each read answering lookups for `cache_for` (zero: a read per lookup).
    #[must_use]
    pub fn with_cache_for(mut self, cache_for: Duration) -> Self {
        self.cache_for = cache_for;
        self
    }

    async fn read(&self) -> Read {
        let mut last = self.last.lock().await;
        if let Some((at, read)) = last.as_ref()
            && at.elapsed() < self.cache_for
        {
            return read.clone();
        }
        let read = match self.api.get_opt(&self.name).await {
            Ok(cm) => Ok(cm.map(|cm| cm.data.unwrap_or_default())),
            Err(e) => Err(StoreError::Unavailable(format!(
                "read machine config map {}/{}: {}",
                self.namespace,
                self.name,
                flex_api::kube_errors::describe(&e)
            ))),
        };
        *last = Some((Instant::now(), read.clone()));
        read
    }
}

#[async_trait]
impl MachineStore for ConfigMapStore {
    async fn get(&self, machine: &str) -> Result<ArmMachine, StoreError> {
        let data = self.read().await?;
        lookup(data.as_ref(), &self.namespace, &self.name, machine)
    }
}

/// An in-memory store: a ConfigMap's `data` that tests edit, plus the status reports received.
#[derive(Debug)]
pub struct MemoryStore {
    namespace: String,
    name: String,
    data: Mutex<Option<BTreeMap<String, String>>>,
    failure: Mutex<Option<String>>,
    statuses: Mutex<Vec<(String, serde_json::Value)>>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An existing, empty `kube-system/aks-flex-machines`.
    pub fn new() -> Self {
        Self {
            namespace: "kube-system".into(),
            name: "aks-flex-machines".into(),
            data: Mutex::new(Some(BTreeMap::new())),
            failure: Mutex::new(None),
            statuses: Mutex::new(Vec::new()),
        }
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets data key `key` (the ConfigMap is created if missing).
    pub fn insert(&self, key: &str, value: &str) {
        Self::lock(&self.data)
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), value.to_string());
    }

    /// Removes data key `key`.
    pub fn remove(&self, key: &str) {
        if let Some(d) = Self::lock(&self.data).as_mut() {
            d.remove(key);
        }
    }

    /// Deletes the whole ConfigMap.
    pub fn delete_config_map(&self) {
        *Self::lock(&self.data) = None;
    }

    /// Makes every lookup fail as an API error would (`None` heals it).
    pub fn fail_with(&self, message: Option<&str>) {
        *Self::lock(&self.failure) = message.map(str::to_string);
    }

    /// The status reports received, as `(machine, body)`; a body that is not JSON is kept as a
    /// JSON string.
    pub fn statuses(&self) -> Vec<(String, serde_json::Value)> {
        Self::lock(&self.statuses).clone()
    }
}

#[async_trait]
impl MachineStore for MemoryStore {
    async fn get(&self, machine: &str) -> Result<ArmMachine, StoreError> {
        if let Some(f) = Self::lock(&self.failure).clone() {
            return Err(StoreError::Unavailable(f));
        }
        let data = Self::lock(&self.data).clone();
        lookup(data.as_ref(), &self.namespace, &self.name, machine)
    }

    async fn record_status(&self, name: &str, body: &[u8]) {
        let v = serde_json::from_slice(body).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(body).into_owned())
        });
        Self::lock(&self.statuses).push((name.to_string(), v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn lookup_table() {
        let m = r#"  {"name":"n1","properties":{"eTag":"e"}}
"#;
        let d = data(&[("n1.json", m), ("n2", r#"{"name":"n2"}"#), ("bad", "{")]);
        assert_eq!(
            lookup(Some(&d), "ns", "cm", "n1").unwrap().etag(),
            "e",
            "<m>.json, trimmed"
        );
        assert_eq!(
            lookup(Some(&d), "ns", "cm", "n2").unwrap().name.as_deref(),
            Some("n2"),
            "bare key"
        );
        // <m>.json wins over <m>.
        let d2 = data(&[
            ("x.json", r#"{"name":"json"}"#),
            ("x", r#"{"name":"bare"}"#),
        ]);
        assert_eq!(
            lookup(Some(&d2), "ns", "cm", "x").unwrap().name.as_deref(),
            Some("json")
        );
        assert_eq!(
            lookup(Some(&d), "ns", "cm", "n3").unwrap_err(),
            StoreError::NotFound("n3".into())
        );
        // `n1.json` is n1's key, not a machine of that name.
        assert_eq!(
            lookup(Some(&d), "ns", "cm", "n1.json").unwrap_err(),
            StoreError::NotFound("n1.json".into())
        );
        let e = lookup(Some(&d), "ns", "cm", "bad").unwrap_err();
        assert!(
            matches!(&e, StoreError::Unavailable(m) if m.starts_with("machine config map key \"bad\" is not valid ARM machine JSON: invalid ARM machine JSON")),
            "{e}"
        );
        assert_eq!(
            lookup(None, "ns", "cm", "n1").unwrap_err(),
            StoreError::Unavailable("machine config map ns/cm not found".into())
        );
    }

    /// A ConfigMap API answering each GET with the next `(status, body)`.
    fn config_map_store(replies: Vec<(u16, String)>) -> ConfigMapStore {
        use http::{Request, Response};
        use kube::client::Body;
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        tokio::spawn(async move {
            for (status, body) in replies {
                let (req, send) = handle.next_request().await.unwrap();
                assert_eq!(req.method(), http::Method::GET);
                assert_eq!(
                    req.uri().path(),
                    "/api/v1/namespaces/kube-system/configmaps/aks-flex-machines"
                );
                send.send_response(
                    Response::builder()
                        .status(status)
                        .body(Body::from(body.into_bytes()))
                        .unwrap(),
                );
            }
        });
        ConfigMapStore::new(
            kube::Client::new(svc, "default"),
            "kube-system",
            "aks-flex-machines",
        )
        .with_cache_for(Duration::ZERO)
    }

    #[tokio::test]
    async fn config_map_store_reads_on_every_lookup() {
        let cm = |data: serde_json::Value| {
            serde_json::json!({"apiVersion":"v1","kind":"ConfigMap",
                "metadata":{"name":"aks-flex-machines","namespace":"kube-system"},"data":data})
            .to_string()
        };
        let not_found = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#;
        let store = config_map_store(vec![
            (200, cm(serde_json::json!({"n1.json": "{\"name\":\"n1\",\"properties\":{\"eTag\":\"e1\"}}"}))),
            (200, cm(serde_json::json!({"n1": "{\"name\":\"n1\",\"properties\":{\"eTag\":\"e2\"}}"}))),
            (200, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"aks-flex-machines"}}"#.to_string()),
            (404, not_found.to_string()),
            (500, r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"etcd timeout","reason":"InternalError","code":500}"#.to_string()),
        ]);
        assert_eq!(store.get("n1").await.unwrap().etag(), "e1");
        assert_eq!(store.get("n1").await.unwrap().etag(), "e2", "not cached");
        assert_eq!(
            store.get("n1").await.unwrap_err(),
            StoreError::NotFound("n1".into()),
            "no data at all"
        );
        assert_eq!(
            store.get("n1").await.unwrap_err(),
            StoreError::Unavailable(
                "machine config map kube-system/aks-flex-machines not found".into()
            )
        );
        let e = store.get("n1").await.unwrap_err().to_string();
        assert!(
            e.starts_with("read machine config map kube-system/aks-flex-machines: ")
                && e.contains("etcd timeout"),
            "{e}"
        );
    }

    /// Faked: the API server (kube's `tower_test` mock), counting its GETs. 300 concurrent
    /// lookups cost one GET; a lookup after the cache period another; a failed read is kept
    /// for the period too.
    #[tokio::test]
    async fn config_map_store_reads_once_per_period_whatever_the_callers() {
        use http::{Request, Response};
        use kube::client::Body;
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let gets = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = gets.clone();
        tokio::spawn(async move {
            while let Some((_req, send)) = handle.next_request().await {
                let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // A slow API server: every lookup arrives while the first read is on its way.
                tokio::time::sleep(Duration::from_millis(50)).await;
                let (status, body) = if n == 1 {
                    (500, r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"etcd timeout","reason":"InternalError","code":500}"#.to_string())
                } else {
                    (
                        200,
                        serde_json::json!({"apiVersion":"v1","kind":"ConfigMap",
                        "metadata":{"name":"aks-flex-machines","namespace":"kube-system"},
                        "data":{"n1.json": "{\"name\":\"n1\"}"}})
                        .to_string(),
                    )
                };
                send.send_response(
                    Response::builder()
                        .status(status)
                        .body(Body::from(body.into_bytes()))
                        .unwrap(),
                );
            }
        });
        let store = ConfigMapStore::new(
            kube::Client::new(svc, "default"),
            "kube-system",
            "aks-flex-machines",
        )
        .with_cache_for(Duration::from_millis(300));
        let count = || gets.load(std::sync::atomic::Ordering::SeqCst);
        let lookups: Vec<_> = (0..300)
            .map(|_| {
                let s = store.clone();
                tokio::spawn(async move { s.get("n1").await })
            })
            .collect();
        for l in lookups {
            assert_eq!(l.await.unwrap().unwrap().name.as_deref(), Some("n1"));
        }
        assert_eq!(count(), 1, "one GET for 300 lookups");
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(store.get("n1").await.is_err(), "the second read failed");
        assert!(store.get("n1").await.is_err(), "and is kept for the period");
        assert_eq!(count(), 2);
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(store.get("n1").await.is_ok());
        assert_eq!(count(), 3);
        assert_eq!(CACHE_FOR, Duration::from_secs(2));
    }

    #[tokio::test]
    async fn memory_store_edits_and_failures() {
        let s = MemoryStore::new();
        assert_eq!(
            s.get("a").await.unwrap_err(),
            StoreError::NotFound("a".into())
        );
        s.insert("a", r#"{"name":"a"}"#);
        assert!(s.get("a").await.is_ok());
        s.fail_with(Some("API server down"));
        assert_eq!(
            s.get("a").await.unwrap_err(),
            StoreError::Unavailable("API server down".into())
        );
        s.fail_with(None);
        s.remove("a");
        assert!(matches!(s.get("a").await, Err(StoreError::NotFound(_))));
        s.delete_config_map();
        assert!(matches!(s.get("a").await, Err(StoreError::Unavailable(_))));
        s.record_status("a", br#"{"x":1}"#).await;
        s.record_status("a", b"not json").await;
        assert_eq!(
            s.statuses(),
            vec![
                ("a".to_string(), serde_json::json!({"x": 1})),
                ("a".to_string(), serde_json::json!("not json"))
            ]
        );
    }
}
