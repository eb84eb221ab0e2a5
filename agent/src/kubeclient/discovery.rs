//! Whether the cluster serves the AKS Flex API (`unbounded-cloud.io/v1alpha3`
//! `machineoperations`), which `deploy/crds` installs with the controller: the daemon's
//! MachineOperation guard asks it at start, and the certificate flow asks it before a CSR that
//! only the controller's approver would approve.

use kube::Resource as _;

use super::describe;
use flex_api::machina::{GROUP, MachineOperation, VERSION};

/// What discovery found for `unbounded-cloud.io/v1alpha3` `machineoperations`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Discovery {
    /// The group version serves it.
    Served,
    /// The group version does not exist (404) or does not serve it.
    Absent,
    /// The API server could not be reached (transport error, credential plugin), with the cause.
    Unreachable(String),
    /// Any other answer (403, 500, ...), with the cause.
    Failed(String),
}

/// Asks the API server whether `unbounded-cloud.io/v1alpha3` serves `machineoperations` (one
/// `GET /apis/unbounded-cloud.io/v1alpha3`).
pub async fn discover(client: &kube::Client) -> Discovery {
    let plural = MachineOperation::plural(&());
    match client
        .list_api_group_resources(&format!("{GROUP}/{VERSION}"))
        .await
    {
        Ok(list) if list.resources.iter().any(|r| r.name == plural) => Discovery::Served,
        Ok(_) => Discovery::Absent,
        Err(kube::Error::Api(s)) if s.code == 404 => Discovery::Absent,
        Err(e @ kube::Error::Api(_)) => Discovery::Failed(describe(&e)),
        Err(e) => Discovery::Unreachable(describe(&e)),
    }
}

/// Whether the API server serves ValidatingAdmissionPolicies
/// ([`flex_api::machina::ADMISSION_POLICY_API`]), which confine a node's daemon to its own
/// operations; `None` when it could not tell (an error other than a 404).
pub async fn admission_policies_served(client: &kube::Client) -> Option<bool> {
    match client
        .list_api_group_resources(flex_api::machina::ADMISSION_POLICY_API)
        .await
    {
        Ok(list) => Some(
            list.resources
                .iter()
                .any(|r| r.name == "validatingadmissionpolicies"),
        ),
        Err(kube::Error::Api(s)) if s.code == 404 => Some(false),
        Err(_) => None,
    }
}

/// The daemon's warning when [`admission_policies_served`] says no.
pub const NO_ADMISSION_POLICIES: &str = "the API server serves no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes 1.30 or later is needed): nothing but RBAC confines node daemons, so any node's daemon could finish, claim or delete this node's MachineOperations (docs/security.md)";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic is a failure

    use serde_json::json;

    use super::*;
    use crate::kubeclient::mock::{
        FLEX_API_PATH, Reply, Seen, flex_api_resources as resources, seen, serve,
    };

    /// Real: discovery. Faked: the API server (kube's `tower_test` mock).
    #[tokio::test]
    async fn discovery_against_a_fake_api_server() {
        type Route = fn(&Seen) -> Reply;
        let answers: Vec<(Route, Discovery)> = vec![
            (
                |_| {
                    Reply::Json(
                        200,
                        resources(&["machines", "machineoperations", "machineoperations/status"]),
                    )
                },
                Discovery::Served,
            ),
            (
                |_| Reply::Json(200, resources(&["machines", "machineoperations/status"])),
                Discovery::Absent,
            ),
            (
                |_| Reply::status(404, "NotFound", "the server could not find the requested resource"),
                Discovery::Absent,
            ),
            // Not a `Status`: the bare 404 of a path nobody serves.
            (|_| Reply::Json(404, json!("404 page not found")), Discovery::Absent),
            (
                |_| Reply::status(500, "InternalError", "etcdserver: leader changed"),
                Discovery::Failed(
                    "API server answered 500 InternalError: etcdserver: leader changed".into(),
                ),
            ),
            (
                |_| Reply::status(403, "Forbidden", "cannot get path /apis/unbounded-cloud.io/v1alpha3"),
                Discovery::Failed(
                    "API server answered 403 Forbidden: cannot get path /apis/unbounded-cloud.io/v1alpha3".into(),
                ),
            ),
        ];
        for (i, (reply, want)) in answers.into_iter().enumerate() {
            let (client, log, _server) = serve(reply);
            assert_eq!(discover(&client).await, want, "case {i}");
            let reqs = seen(&log);
            assert_eq!(reqs.len(), 1);
            assert_eq!(
                (reqs[0].method.as_str(), reqs[0].uri.as_str()),
                ("GET", FLEX_API_PATH)
            );
        }
    }
}
