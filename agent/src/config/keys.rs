//! Case-insensitive key matching and unknown-key reporting, as Go's `encoding/json` matches
//! struct fields: an exact match is preferred, otherwise a case-insensitive one; later keys that
//! land on the same field win; keys the schema does not know are dropped (and reported here).

use serde_json::{Map, Value};

/// The shape of the config schema, enough to canonicalise keys.
pub(crate) enum Shape {
    /// An object with known fields.
    Struct(&'static [(&'static str, Shape)]),
    /// A free-form map: keys kept as written.
    Map,
    /// An array whose elements have this shape.
    Array(&'static Shape),
    /// A scalar (or anything not walked further).
    Leaf,
}

use Shape::{Array, Leaf, Map as FreeMap, Struct};

const VERSION_ONLY: Shape = Struct(&[("version", Leaf)]);

/// The config schema (new shape plus the legacy keys the adapter reads).
pub(crate) const SCHEMA: Shape = Struct(&[
    (
        "azure",
        Struct(&[
            ("subscriptionId", Leaf),
            ("tenantId", Leaf),
            ("cloud", Leaf),
            ("resourceManagerEndpoint", Leaf),
            (
                "servicePrincipal",
                Struct(&[
                    ("tenantId", Leaf),
                    ("clientId", Leaf),
                    ("clientSecret", Leaf),
                ]),
            ),
            ("managedIdentity", Struct(&[("clientId", Leaf)])),
            ("bootstrapToken", Struct(&[("token", Leaf)])),
            (
                "arc",
                Struct(&[
                    ("enabled", Leaf),
                    ("machineName", Leaf),
                    ("tags", FreeMap),
                    ("resourceGroup", Leaf),
                    ("location", Leaf),
                    ("installerUrl", Leaf),
                    ("installerSha256", Leaf),
                ]),
            ),
            (
                "targetCluster",
                Struct(&[("resourceId", Leaf), ("location", Leaf)]),
            ),
            ("targetAgentPoolName", Leaf),
        ]),
    ),
    (
        "agent",
        Struct(&[
            ("logLevel", Leaf),
            ("logDir", Leaf),
            ("nodeName", Leaf),
            (
                "machineClient",
                Struct(&[("mode", Leaf), ("endpointUrl", Leaf)]),
            ),
            ("machineReconcileInterval", Leaf),
            ("requireMachineRegistration", Leaf),
            ("machineOperationMode", Leaf),
            ("metricsAddress", Leaf),
            ("drain", Struct(&[("timeout", Leaf), ("onTimeout", Leaf)])),
        ]),
    ),
    (
        "components",
        Struct(&[
            ("kubernetes", Leaf),
            ("containerd", Leaf),
            ("runc", Leaf),
            ("sandboxImage", Leaf),
        ]),
    ),
    (
        "bootstrap",
        Struct(&[
            ("ociImage", Leaf),
            ("offlineArtifacts", Struct(&[("source", Leaf)])),
            ("additionalHostDevices", Leaf),
            ("insecureRegistries", Leaf),
            (
                "registryAuth",
                Struct(&[("configFile", Leaf), ("acrRegistries", Leaf)]),
            ),
        ]),
    ),
    (
        "networking",
        Struct(&[("dnsServiceIP", Leaf), ("cniVersion", Leaf)]),
    ),
    (
        "node",
        Struct(&[
            ("maxPods", Leaf),
            ("labels", FreeMap),
            ("taints", Leaf),
            ("registryMirrors", FreeMap),
            (
                "kubelet",
                Struct(&[
                    ("verbosity", Leaf),
                    ("imageGCHighThreshold", Leaf),
                    ("imageGCLowThreshold", Leaf),
                    ("clusterFQDN", Leaf),
                    ("caCertData", Leaf),
                    ("nodeIP", Leaf),
                    // legacy
                    ("dnsServiceIP", Leaf),
                    ("serverURL", Leaf),
                ]),
            ),
        ]),
    ),
    (
        "npd",
        Struct(&[("version", Leaf), ("baseURL", Leaf), ("sha256", Leaf)]),
    ),
    (
        "hostRouting",
        Struct(&[
            (
                "staticRoutes",
                Struct(&[
                    ("enabled", Leaf),
                    (
                        "routes",
                        Array(&Struct(&[
                            ("destination", Leaf),
                            ("gateway", Leaf),
                            ("dev", Leaf),
                            ("metric", Leaf),
                        ])),
                    ),
                ]),
            ),
            (
                "routeOverlap",
                Struct(&[("expectedCidrs", Leaf), ("mode", Leaf)]),
            ),
        ]),
    ),
    // legacy top-level sections
    ("kubernetes", VERSION_ONLY),
    ("containerd", VERSION_ONLY),
    ("runc", VERSION_ONLY),
    ("cni", VERSION_ONLY),
]);

/// Rewrites every schema key to its canonical spelling and drops unknown keys, returning the new
/// value and the dotted paths of the dropped keys.
pub(crate) fn canonicalize(raw: &Value) -> (Value, Vec<String>) {
    let mut unknown = Vec::new();
    let v = walk(raw, &SCHEMA, "", &mut unknown);
    (v, unknown)
}

fn walk(v: &Value, shape: &Shape, path: &str, unknown: &mut Vec<String>) -> Value {
    match (shape, v) {
        (Struct(fields), Value::Object(obj)) => {
            let mut out = Map::new();
            for (k, sub) in obj {
                let field = fields
                    .iter()
                    .find(|(name, _)| *name == k)
                    .or_else(|| fields.iter().find(|(name, _)| eq_fold(name, k)));
                let child_path = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match field {
                    Some((name, sub_shape)) => {
                        let canon = walk(sub, sub_shape, &child_path, unknown);
                        // A later key for the same field wins, as in Go.
                        out.shift_remove(*name);
                        out.insert((*name).to_string(), canon);
                    }
                    None => unknown.push(child_path),
                }
            }
            Value::Object(out)
        }
        (Array(elem), Value::Array(items)) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| walk(item, elem, &format!("{path}[{i}]"), unknown))
                .collect(),
        ),
        _ => v.clone(),
    }
}

/// Case-insensitive comparison (Go folds Unicode simply; lowercase comparison is equivalent for
/// the ASCII keys of this schema).
fn eq_fold(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.to_lowercase() == b.to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Keys the schema reads only for the legacy adapter: no serde field carries them.
    const LEGACY: &[&str] = &[
        "kubernetes",
        "kubernetes.version",
        "containerd",
        "containerd.version",
        "runc",
        "runc.version",
        "cni",
        "cni.version",
        "node.kubelet.dnsServiceIP",
        "node.kubelet.serverURL",
    ];

    /// A config in which every optional part is present, so its serialization shows every
    /// serde field (the ones skipped when empty are filled).
    fn filled() -> crate::config::Config {
        use crate::config::*;
        let mut c = Config::default();
        c.azure.service_principal = Some(ServicePrincipal::default());
        c.azure.managed_identity = Some(ManagedIdentity {
            client_id: "x".into(),
        });
        c.azure.bootstrap_token = Some(BootstrapToken::default());
        c.azure.arc = Some(ArcConfig::default());
        c.azure.target_cluster = Some(TargetCluster::default());
        c.bootstrap.offline_artifacts = Some(OfflineArtifacts::default());
        c.bootstrap.additional_host_devices = vec!["x".into()];
        c.bootstrap.insecure_registries = vec!["x".into()];
        c.bootstrap.registry_auth = Some(RegistryAuth {
            config_file: "/x".into(),
            acr_registries: vec!["x".into()],
        });
        c.node.registry_mirrors.insert("x".into(), "y".into());
        c.host_routing.static_routes.routes.push(StaticRoute {
            destination: "x".into(),
            gateway: "x".into(),
            dev: "x".into(),
            metric: Some(1),
        });
        c
    }

    /// Every key path of `v`, not descending into free-form maps of `shape`.
    fn serde_paths(v: &Value, shape: Option<&Shape>, path: &str, out: &mut Vec<String>) {
        let at = |k: &str| {
            if path.is_empty() {
                k.to_string()
            } else {
                format!("{path}.{k}")
            }
        };
        match (v, shape) {
            (_, Some(FreeMap)) => {}
            (Value::Object(o), _) => {
                for (k, sub) in o {
                    let sub_shape = match shape {
                        Some(Struct(fields)) => fields.iter().find(|(n, _)| n == k).map(|(_, s)| s),
                        _ => None,
                    };
                    out.push(at(k));
                    serde_paths(sub, sub_shape, &at(k), out);
                }
            }
            (Value::Array(items), _) => {
                let elem = match shape {
                    Some(Array(e)) => Some(*e),
                    _ => None,
                };
                for item in items {
                    serde_paths(item, elem, path, out);
                }
            }
            _ => {}
        }
    }

    fn schema_paths(shape: &Shape, path: &str, out: &mut Vec<String>) {
        let shape = match shape {
            Array(e) => *e,
            s => s,
        };
        if let Struct(fields) = shape {
            for (k, sub) in *fields {
                let p = if path.is_empty() {
                    (*k).to_string()
                } else {
                    format!("{path}.{k}")
                };
                out.push(p.clone());
                schema_paths(sub, &p, out);
            }
        }
    }

    /// `SCHEMA` is written by hand beside the serde types; this keeps the two the same: every
    /// key a fully filled config serializes to is in the schema (else loading drops it as
    /// unknown), and every schema key but the legacy ones is a serde field.
    #[test]
    fn schema_matches_the_serde_types() {
        let v = serde_json::to_value(filled()).unwrap();
        let mut serde = Vec::new();
        serde_paths(&v, Some(&SCHEMA), "", &mut serde);
        let mut schema = Vec::new();
        schema_paths(&SCHEMA, "", &mut schema);
        let missing: Vec<_> = serde.iter().filter(|p| !schema.contains(p)).collect();
        assert!(
            missing.is_empty(),
            "serde fields missing from SCHEMA: {missing:?}"
        );
        let extra: Vec<_> = schema
            .iter()
            .filter(|p| !serde.contains(p) && !LEGACY.contains(&p.as_str()))
            .collect();
        assert!(
            extra.is_empty(),
            "SCHEMA keys no serde field has: {extra:?}"
        );
        assert!(serde.len() > 60, "{serde:?}");
    }

    #[test]
    fn keys_match_case_insensitively_and_exact_wins() {
        let raw = json!({
            "Agent": {"NODENAME": "a", "logdir": "/x"},
            "node": {"labels": {"Foo/Bar": "1"}},
        });
        let (v, unknown) = canonicalize(&raw);
        assert_eq!(
            v,
            json!({"agent": {"nodeName": "a", "logDir": "/x"}, "node": {"labels": {"Foo/Bar": "1"}}})
        );
        assert!(unknown.is_empty());
    }

    #[test]
    fn later_key_for_the_same_field_wins() {
        let raw: Value =
            serde_json::from_str(r#"{"agent":{"nodeName":"a","NodeName":"b"}}"#).unwrap();
        let (v, _) = canonicalize(&raw);
        assert_eq!(v["agent"]["nodeName"], "b");
    }

    #[test]
    fn unknown_keys_are_dropped_and_reported() {
        let raw = json!({"agnet": {}, "agent": {"nodeNmae": "x"}, "hostRouting": {"staticRoutes": {"routes": [{"dst": "1"}]}}});
        let (v, unknown) = canonicalize(&raw);
        assert_eq!(
            unknown,
            vec![
                "agnet",
                "agent.nodeNmae",
                "hostRouting.staticRoutes.routes[0].dst"
            ]
        );
        assert_eq!(
            v,
            json!({"agent": {}, "hostRouting": {"staticRoutes": {"routes": [{}]}}})
        );
    }
}
