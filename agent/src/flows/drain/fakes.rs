//! `FakeNodeDrain`: a recording [`NodeDrainApi`] over an in-memory Node and pods (test code
//! only). An accepted eviction marks the pod terminating; it is gone at the next list (its
//! grace period passed). Answers can be scripted per pod, and failures per call.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use serde_json::json;

use super::{CORDONED_BY, DrainApiError, Eviction, NodeDrainApi, PodRef};

#[derive(Default)]
pub struct State {
    pub node: Option<Node>,
    pub pods: Vec<Pod>,
    /// Scripted eviction answers by pod name (then `Accepted`).
    pub answers: BTreeMap<String, VecDeque<Eviction>>,
    /// Pod names whose evictions are always refused by a budget.
    pub blocked: BTreeMap<String, String>,
    /// Errors the next calls of a kind get (`"node"`, `"pods"`, `"set_cordon"`).
    pub failures: BTreeMap<&'static str, VecDeque<DrainApiError>>,
    pub calls: Vec<String>,
    /// Lists in which an evicted pod still shows, terminating (its grace period), by name.
    pub terminating: BTreeMap<String, u32>,
    /// Lists an evicted pod shows terminating in (default 1).
    pub grace_lists: u32,
    /// Events recorded: `<Kind>/<name> <Normal|Warning> <reason>: <note>`.
    pub events: Vec<String>,
    /// The disruption budget's ConfigMap: its resourceVersion and data (`None`: absent).
    pub budget: Option<(u64, flex_api::budget::Data)>,
    /// The budget's calls: `budget`, `set_budget <key>=<value|->…`.
    pub budget_calls: Vec<String>,
    /// Yield to other tasks after each read of the budget, so racing nodes interleave between
    /// their read and their write.
    pub yield_after_read: bool,
    rv: u64,
}

#[derive(Clone, Default)]
pub struct FakeNodeDrain(pub Arc<Mutex<State>>);

pub fn transient(action: &str) -> DrainApiError {
    DrainApiError {
        action: action.into(),
        cause: "connection refused".into(),
        permanent: false,
        conflict: false,
    }
}

pub fn pod(ns: &str, name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name, "uid": format!("uid-{name}"),
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs", "controller": true}]},
        "status": {"phase": "Running"},
    }))
    .unwrap()
}

pub fn daemonset_pod(ns: &str, name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name, "uid": format!("uid-{name}"),
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "ds", "controller": true}]},
        "status": {"phase": "Running"},
    }))
    .unwrap()
}

pub fn node(name: &str, unschedulable: bool, cordoned_by: Option<&str>) -> Node {
    let mut annotations = BTreeMap::new();
    if let Some(by) = cordoned_by {
        annotations.insert(CORDONED_BY.to_string(), by.to_string());
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "resourceVersion": "1", "annotations": annotations},
        "spec": {"unschedulable": unschedulable},
        "status": {"conditions": [{"type": "Ready", "status": "True",
                                   "lastHeartbeatTime": "2030-01-01T00:00:00Z"}]},
    }))
    .unwrap()
}

/// A budget slot's value for `owner`, acquired and renewed now (live for a whole lease).
pub fn fresh_holder(owner: &str) -> String {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    serde_json::to_string(&flex_api::budget::Holder {
        owner: owner.into(),
        acquired: now.clone(),
        renewed: now,
        stuck: false,
    })
    .unwrap()
}

impl FakeNodeDrain {
    pub fn new(node: Node, pods: Vec<Pod>) -> Self {
        let f = Self::default();
        {
            let mut st = f.state();
            st.node = Some(node);
            st.pods = pods;
            st.rv = 1;
            st.grace_lists = 1;
        }
        f
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn calls(&self) -> Vec<String> {
        self.state().calls.clone()
    }

    pub fn events(&self) -> Vec<String> {
        self.state().events.clone()
    }

    /// A budget ConfigMap with `data` (resourceVersion 1).
    pub fn with_budget(self, data: &[(&str, &str)]) -> Self {
        self.state().budget = Some((
            1,
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ));
        self
    }

    /// The budget's data now (`None`: absent).
    pub fn budget_data(&self) -> Option<flex_api::budget::Data> {
        self.state().budget.as_ref().map(|(_, d)| d.clone())
    }

    /// The budget's holder of `node`, parsed.
    pub fn holder(&self, node: &str) -> Option<flex_api::budget::Holder> {
        let d = self.budget_data()?;
        serde_json::from_str(d.get(&format!("holder.{node}"))?).ok()
    }

    /// `(unschedulable, cordoned-by)` of the Node now.
    pub fn cordon(&self) -> (bool, Option<String>) {
        let st = self.state();
        let n = st.node.as_ref().unwrap();
        flex_api::drain::cordon_state(n)
    }

    fn fail(st: &mut State, kind: &'static str) -> Option<DrainApiError> {
        st.failures.get_mut(kind).and_then(VecDeque::pop_front)
    }
}

#[async_trait]
impl NodeDrainApi for FakeNodeDrain {
    async fn node(&self) -> Result<Option<Node>, DrainApiError> {
        let mut st = self.state();
        st.calls.push("node".into());
        if let Some(e) = Self::fail(&mut st, "node") {
            return Err(e);
        }
        Ok(st.node.clone())
    }

    async fn set_cordon(
        &self,
        resource_version: &str,
        unschedulable: bool,
        cordoned_by: Option<&str>,
    ) -> Result<(), DrainApiError> {
        let mut st = self.state();
        st.calls.push(format!(
            "set_cordon {unschedulable} {}",
            cordoned_by.unwrap_or("-")
        ));
        if let Some(e) = Self::fail(&mut st, "set_cordon") {
            return Err(e);
        }
        let rv = st.rv.to_string();
        if resource_version != rv {
            return Err(DrainApiError {
                action: "set_cordon".into(),
                cause: "409 Conflict".into(),
                permanent: false,
                conflict: true,
            });
        }
        st.rv += 1;
        let new_rv = st.rv.to_string();
        let n = st.node.as_mut().unwrap();
        n.metadata.resource_version = Some(new_rv);
        n.spec.get_or_insert_with(Default::default).unschedulable = Some(unschedulable);
        let a = n.metadata.annotations.get_or_insert_with(Default::default);
        match cordoned_by {
            Some(by) => a.insert(CORDONED_BY.into(), by.into()),
            None => a.remove(CORDONED_BY),
        };
        Ok(())
    }

    async fn pods(&self) -> Result<Vec<Pod>, DrainApiError> {
        let mut st = self.state();
        st.calls.push("pods".into());
        if let Some(e) = Self::fail(&mut st, "pods") {
            return Err(e);
        }
        // An evicted pod shows terminating for `grace_lists` lists, then it is gone.
        let st = &mut *st;
        let terminating = &mut st.terminating;
        st.pods.retain(|p| {
            let name = p.metadata.name.clone().unwrap_or_default();
            match terminating.get_mut(&name) {
                Some(0) => false,
                Some(n) => {
                    *n -= 1;
                    true
                }
                None => true,
            }
        });
        Ok(st.pods.clone())
    }

    async fn evict(&self, pod: &PodRef) -> Eviction {
        let mut st = self.state();
        st.calls.push(format!("evict {pod}"));
        let answer = match st.blocked.get(&pod.name) {
            Some(why) => Eviction::Blocked(why.clone()),
            None => st
                .answers
                .get_mut(&pod.name)
                .and_then(VecDeque::pop_front)
                .unwrap_or(Eviction::Accepted),
        };
        if answer == Eviction::Accepted
            && let Some(p) = st
                .pods
                .iter_mut()
                .find(|p| p.metadata.name.as_deref() == Some(&pod.name))
        {
            let name = pod.name.clone();
            p.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
            let lists = st.grace_lists;
            st.terminating.insert(name, lists);
        }
        answer
    }

    async fn budget(&self) -> Result<Option<(String, flex_api::budget::Data)>, DrainApiError> {
        let (read, yield_now) = {
            let mut st = self.state();
            st.budget_calls.push("budget".into());
            if let Some(e) = Self::fail(&mut st, "budget") {
                return Err(e);
            }
            (
                st.budget
                    .as_ref()
                    .map(|(rv, d)| (rv.to_string(), d.clone())),
                st.yield_after_read,
            )
        };
        if yield_now {
            tokio::task::yield_now().await;
        }
        Ok(read)
    }

    async fn set_budget(
        &self,
        resource_version: &str,
        changes: &flex_api::budget::Changes,
    ) -> Result<(), DrainApiError> {
        let mut st = self.state();
        let keys: Vec<String> = changes
            .iter()
            .map(|(k, v)| format!("{k}={}", if v.is_some() { "set" } else { "-" }))
            .collect();
        st.budget_calls
            .push(format!("set_budget {}", keys.join(" ")));
        if let Some(e) = Self::fail(&mut st, "set_budget") {
            return Err(e);
        }
        let Some((rv, data)) = st.budget.as_mut() else {
            return Err(DrainApiError {
                action: "set_budget".into(),
                cause: "404 Not Found".into(),
                permanent: true,
                conflict: false,
            });
        };
        if resource_version != rv.to_string() {
            return Err(DrainApiError {
                action: "set_budget".into(),
                cause: "409 Conflict".into(),
                permanent: false,
                conflict: true,
            });
        }
        *rv += 1;
        for (k, v) in changes {
            match v {
                Some(v) => data.insert(k.clone(), v.clone()),
                None => data.remove(k),
            };
        }
        Ok(())
    }

    async fn event(&self, regarding: &ObjectReference, warning: bool, reason: &str, note: &str) {
        self.state().events.push(format!(
            "{}/{} {} {reason}: {note}",
            regarding.kind.as_deref().unwrap_or("?"),
            regarding.name.as_deref().unwrap_or("?"),
            if warning { "Warning" } else { "Normal" }
        ));
    }
}

impl FakeNodeDrain {
    /// A schedulable, Ready node `name` with no pods.
    pub fn quiet(name: &str) -> Self {
        Self::new(node(name, false, None), Vec::new())
    }

    /// A factory that hands this fake to a reconciler, whatever its client.
    pub fn factory(&self) -> crate::flows::operations::DrainApiFactory {
        let f = self.clone();
        std::sync::Arc::new(move |_, _| std::sync::Arc::new(f.clone()))
    }
}
