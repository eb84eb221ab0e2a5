//! The fake API server's semantics as a real kube client sees them over loopback HTTP: the
//! optimistic concurrency the budget relies on (a stale `resourceVersion` is a 409), the field
//! selectors the daemon's watch relies on (and their refusal without `selectableFields`),
//! evictions with their UID precondition, and the counts by impersonated identity.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::collections::BTreeMap;

use aks_flex_node::kubeclient::client_from;
use flex_api::machina::{MachineOperation, MachineOperationSpec, OperationKind};
use flex_fleet::apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

fn client(server: &FakeApiServer, user: Option<&str>) -> Client {
    let mut c = kube::Config::new(server.url().parse().unwrap());
    c.auth_info.impersonate = user.map(str::to_string);
    client_from(c).unwrap()
}

fn code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("not an API answer: {other}"),
    }
}

#[tokio::test]
async fn a_write_with_a_stale_resource_version_is_a_conflict() {
    let server = FakeApiServer::start(true).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client(&server, None), "kube-system");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("budget".into());
    cm.data = Some(BTreeMap::from([("maxUnavailable".into(), "1".into())]));
    let created = cms.create(&PostParams::default(), &cm).await.unwrap();
    let rv0 = created.metadata.resource_version.clone().unwrap();
    assert_eq!(
        code(cms.create(&PostParams::default(), &cm).await.unwrap_err()),
        409
    );

    // Two writers read rv0; the first merge patch wins, the second is refused.
    let patch =
        |key: &str, rv: &str| json!({"metadata": {"resourceVersion": rv}, "data": {key: "x"}});
    let pp = PatchParams::default();
    let won = cms
        .patch("budget", &pp, &Patch::Merge(patch("holder.a", &rv0)))
        .await
        .unwrap();
    let lost = cms
        .patch("budget", &pp, &Patch::Merge(patch("holder.b", &rv0)))
        .await
        .unwrap_err();
    assert_eq!(code(lost), 409);
    let rv1 = won.metadata.resource_version.clone().unwrap();
    assert_ne!(rv0, rv1);

    // A replacement under the old version is refused too; under the current one it applies,
    // and `null` in a merge patch removes a key.
    let mut stale = won.clone();
    stale.metadata.resource_version = Some(rv0);
    assert_eq!(
        code(
            cms.replace("budget", &PostParams::default(), &stale)
                .await
                .unwrap_err()
        ),
        409
    );
    cms.replace("budget", &PostParams::default(), &won)
        .await
        .unwrap();
    let now = cms
        .patch(
            "budget",
            &pp,
            &Patch::Merge(json!({"data": {"holder.a": null}})),
        )
        .await
        .unwrap();
    assert_eq!(now.data.unwrap().get("holder.a"), None);
}

#[tokio::test]
async fn operations_are_selected_by_machine_ref_unless_the_field_is_not_selectable() {
    for selectable in [true, false] {
        let server = FakeApiServer::start(selectable).await.unwrap();
        let ops: Api<MachineOperation> = Api::all(client(&server, None));
        for (name, machine) in [("a", "n1"), ("b", "n2"), ("c", "")] {
            let op = MachineOperation::new(
                name,
                MachineOperationSpec {
                    machine_ref: machine.into(),
                    operation_kind: OperationKind::NodeReboot,
                    ..Default::default()
                },
            );
            ops.create(&PostParams::default(), &op).await.unwrap();
        }
        let names = |l: kube::core::ObjectList<MachineOperation>| -> Vec<String> {
            l.items
                .into_iter()
                .filter_map(|o| o.metadata.name)
                .collect()
        };
        let mine = ops
            .list(&ListParams::default().fields("spec.machineRef=n1"))
            .await;
        let by_selector = ops
            .list(&ListParams::default().fields("spec.machineRef="))
            .await;
        if selectable {
            assert_eq!(names(mine.unwrap()), ["a"]);
            assert_eq!(names(by_selector.unwrap()), ["c"]);
        } else {
            let e = mine.unwrap_err();
            assert!(
                matches!(&e, kube::Error::Api(s) if aks_flex_node::flows::operations::reconcile::refuses_field_selector(s)),
                "{e}"
            );
        }
        assert_eq!(
            names(ops.list(&ListParams::default()).await.unwrap()).len(),
            3
        );
    }
}

#[tokio::test]
async fn an_eviction_checks_the_pod_uid_and_requests_are_counted_by_identity() {
    let server = FakeApiServer::start(true).await.unwrap();
    let admin = client(&server, None);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"nodeName": "n1", "containers": [{"name": "web", "image": "pause"}]},
    }))
    .unwrap();
    let uid = pods
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let node = client(&server, Some("system:node:n1"));
    let evict = |uid: String| {
        let node = node.clone();
        async move {
            let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": "web", "namespace": "default"},
                "deleteOptions": {"preconditions": {"uid": uid}}});
            let req = http::Request::post("/api/v1/namespaces/default/pods/web/eviction")
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(serde_json::to_vec(&body).unwrap())
                .unwrap();
            node.request::<kube::core::Status>(req).await
        }
    };
    assert_eq!(code(evict("another".into()).await.unwrap_err()), 409);
    evict(uid.clone()).await.unwrap();
    let left = Api::<Pod>::all(node.clone())
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert!(left.items.is_empty());
    assert_eq!(code(evict(uid).await.unwrap_err()), 404);

    let counts = server.counts();
    assert_eq!(counts.by_identity["system:node:n1"].requests, 4);
    assert_eq!(counts.by_identity["system:node:n1"].listed, 0);
    assert!(counts.unsupported.is_empty(), "{:?}", counts.unsupported);
}
