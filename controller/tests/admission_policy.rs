//! `deploy/controller/admission.yaml` evaluated case by case: the policy's own CEL expressions
//! (match condition, variables, validations, message) run by a CEL interpreter (the
//! `cel-interpreter` crate, with Kubernetes' `substring` added) over admission requests built
//! here. What is real: the policy text and a CEL evaluator; what is emulated: the API server's
//! admission plumbing (lazy variables: one that fails to evaluate is left unbound, so a
//! validation that uses it fails, as `failurePolicy: Fail` denies). The same policy is shown
//! against a real API server by the harness's `trust` cluster group.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::path::PathBuf;
use std::sync::Arc;

use cel_interpreter::extractors::This;
use cel_interpreter::{Context, Program, Value as Cel};
use serde_json::{Value, json};

fn policy_in(file: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/controller")
        .join(file);
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&std::fs::read_to_string(path).unwrap()).unwrap();
    docs.into_iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .unwrap()
}

fn policy() -> Value {
    policy_in("admission.yaml")
}

/// A variable's value back as JSON, for the next expressions (strings, booleans, integers,
/// and maps of them: what the policies' variables hold).
fn to_json(v: &Cel) -> Option<Value> {
    match v {
        Cel::String(s) => Some(json!(**s)),
        Cel::Bool(b) => Some(json!(b)),
        Cel::Int(i) => Some(json!(i)),
        Cel::Null => Some(Value::Null),
        Cel::Map(m) => {
            let mut out = serde_json::Map::new();
            for (k, v) in m.map.iter() {
                let cel_interpreter::objects::Key::String(k) = k else {
                    return None;
                };
                out.insert(k.to_string(), to_json(v)?);
            }
            Some(Value::Object(out))
        }
        _ => None,
    }
}

fn substring(This(s): This<Arc<String>>, start: i64) -> String {
    s.chars().skip(usize::try_from(start).unwrap()).collect()
}

fn eval(expr: &str, ctx: &Context) -> Result<Cel, String> {
    let p = Program::compile(expr).map_err(|e| format!("{expr}: {e}"))?;
    p.execute(ctx).map_err(|e| format!("{expr}: {e}"))
}

/// The policy's verdict on one request: `Ok` when admitted (or not matched), else the messages
/// of the failed validations.
fn admit(request: Value, object: Value, old: Value) -> Result<(), Vec<String>> {
    admit_by(&policy(), request, object, old)
}

fn admit_by(p: &Value, request: Value, object: Value, old: Value) -> Result<(), Vec<String>> {
    let spec = &p["spec"];
    let mut ctx = Context::default();
    ctx.add_function("substring", substring);
    ctx.add_variable("request", request).unwrap();
    ctx.add_variable("object", object).unwrap();
    ctx.add_variable("oldObject", old).unwrap();
    for m in spec["matchConditions"].as_array().unwrap() {
        if eval(m["expression"].as_str().unwrap(), &ctx) != Ok(Cel::Bool(true)) {
            return Ok(());
        }
    }
    let mut vars = serde_json::Map::new();
    for v in spec["variables"].as_array().unwrap() {
        ctx.add_variable("variables", Value::Object(vars.clone()))
            .unwrap();
        if let Some(value) = eval(v["expression"].as_str().unwrap(), &ctx)
            .ok()
            .as_ref()
            .and_then(to_json)
        {
            vars.insert(v["name"].as_str().unwrap().into(), value);
        }
    }
    ctx.add_variable("variables", Value::Object(vars)).unwrap();
    let mut denied = Vec::new();
    for v in spec["validations"].as_array().unwrap() {
        if eval(v["expression"].as_str().unwrap(), &ctx) != Ok(Cel::Bool(true)) {
            let msg = v["messageExpression"]
                .as_str()
                .and_then(|m| match eval(m, &ctx) {
                    Ok(Cel::String(s)) => Some(s.to_string()),
                    _ => None,
                })
                .unwrap_or_else(|| v["message"].as_str().unwrap().to_string());
            denied.push(msg);
        }
    }
    if denied.is_empty() {
        Ok(())
    } else {
        Err(denied)
    }
}

fn req(op: &str, sub: &str, user: &str, daemon: bool) -> Value {
    let mut groups = vec!["system:authenticated"];
    if daemon {
        groups.extend(["system:nodes", "aks-flex-node-daemons"]);
    }
    json!({
        "operation": op,
        "subResource": sub,
        "userInfo": {"username": user, "groups": groups},
    })
}

fn mop(target: &str, status: Value) -> Value {
    let spec = if target.is_empty() {
        json!({"operationKind": "NodeReboot", "machineSelector": {"matchLabels": {"pool": "a"}}})
    } else {
        json!({"operationKind": "NodeReboot", "machineRef": target})
    };
    json!({"metadata": {"name": "op"}, "spec": spec, "status": status})
}

const N1: &str = "system:node:n1";

fn status(user: &str, old: Value, new: Value) -> Result<(), Vec<String>> {
    admit(req("UPDATE", "status", user, true), new, old)
}

#[test]
fn administrators_are_not_matched() {
    let o = mop("n2", json!({}));
    assert_eq!(
        admit(req("UPDATE", "", "admin", false), o.clone(), o.clone()),
        Ok(())
    );
    assert_eq!(
        admit(req("CREATE", "", "admin", false), o, Value::Null),
        Ok(())
    );
}

#[test]
fn daemons_neither_create_nor_edit_specs() {
    let o = mop("n1", json!({}));
    let e = admit(req("CREATE", "", N1, true), o.clone(), Value::Null).unwrap_err();
    assert!(
        e.iter()
            .any(|m| m == "node daemons do not create MachineOperations"),
        "{e:?}"
    );
    let e = admit(req("UPDATE", "", N1, true), o.clone(), o).unwrap_err();
    assert!(
        e.iter()
            .any(|m| m == "node daemons change only a MachineOperation's status"),
        "{e:?}"
    );
}

#[test]
fn a_daemon_writes_only_its_own_machines_status() {
    let mine = mop("n1", json!({"phase": "Pending"}));
    let claimed = mop("n1", json!({"phase": "InProgress", "claimedBy": "n1"}));
    assert_eq!(status(N1, mine.clone(), claimed.clone()), Ok(()));
    let theirs = mop("n2", json!({"phase": "Pending"}));
    let e = status(N1, theirs.clone(), mop("n2", json!({"phase": "Complete"}))).unwrap_err();
    assert_eq!(
        e,
        ["node n1 may not change MachineOperation op: it is aimed at machine n2"]
    );
    // Not a node user at all, though in the group.
    assert!(status("mallory", mine.clone(), claimed.clone()).is_err());
    // Naming another node as the claimer of its own.
    let e = status(N1, mine, mop("n1", json!({"claimedBy": "n2"}))).unwrap_err();
    assert_eq!(
        e,
        ["a node's daemon may set status.claimedBy only to its own node"]
    );
}

#[test]
fn a_selector_operation_is_its_first_claimers() {
    let open = mop("", json!({"phase": "Pending"}));
    let by_n1 = mop("", json!({"phase": "InProgress", "claimedBy": "n1"}));
    assert_eq!(status(N1, open.clone(), by_n1.clone()), Ok(()), "claim");
    assert_eq!(
        status(
            N1,
            by_n1.clone(),
            mop("", json!({"phase": "Complete", "claimedBy": "n1"}))
        ),
        Ok(()),
        "finish its own claim"
    );
    let e = status(N1, open.clone(), mop("", json!({"phase": "Complete"}))).unwrap_err();
    assert!(e[0].contains("nobody claimed it"), "{e:?}");
    let e = status(
        "system:node:n2",
        by_n1,
        mop("", json!({"phase": "Pending", "claimedBy": "n2"})),
    )
    .unwrap_err();
    assert!(e[0].contains("the node that claimed it, n1"), "{e:?}");
}

#[test]
fn a_daemon_deletes_only_its_own_finished_operations() {
    let del = |user: &str, old: Value| admit(req("DELETE", "", user, true), Value::Null, old);
    assert_eq!(del(N1, mop("n1", json!({"phase": "Complete"}))), Ok(()));
    assert_eq!(
        del(N1, mop("", json!({"phase": "Failed", "claimedBy": "n1"}))),
        Ok(())
    );
    let e = del(N1, mop("n1", json!({"phase": "InProgress"}))).unwrap_err();
    assert_eq!(
        e,
        ["a node's daemon deletes only finished MachineOperations (after their TTL)"]
    );
    assert!(del(N1, mop("n2", json!({"phase": "Complete"}))).is_err());
    assert!(del(N1, mop("", json!({"phase": "Complete"}))).is_err());
}

// ---- deploy/controller/disruption.yaml: a node's daemon changes only its own slot.

fn budget_cm(data: &[(&str, &str)]) -> Value {
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({"metadata": {"name": "aks-flex-node-disruption", "namespace": "kube-system"},
           "data": data})
}

fn budget_update(user: &str, old: Value, new: Value) -> Result<(), Vec<String>> {
    admit_by(
        &policy_in("disruption.yaml"),
        req("UPDATE", "", user, true),
        new,
        old,
    )
}

#[test]
fn a_daemon_takes_renews_and_frees_only_its_own_slot() {
    let base = budget_cm(&[("maxUnavailable", "1"), ("holder.n2", "{\"owner\":\"x\"}")]);
    let taken = budget_cm(&[
        ("maxUnavailable", "1"),
        ("holder.n2", "{\"owner\":\"x\"}"),
        ("holder.n1", "{\"owner\":\"op\"}"),
    ]);
    let renewed = budget_cm(&[
        ("maxUnavailable", "1"),
        ("holder.n2", "{\"owner\":\"x\"}"),
        ("holder.n1", "{\"owner\":\"op\",\"renewed\":\"later\"}"),
    ]);
    assert_eq!(
        budget_update(N1, base.clone(), taken.clone()),
        Ok(()),
        "take"
    );
    assert_eq!(
        budget_update(N1, taken.clone(), renewed.clone()),
        Ok(()),
        "renew"
    );
    assert_eq!(budget_update(N1, renewed, base.clone()), Ok(()), "free");
    // The budget on an empty ConfigMap (no data at all).
    assert_eq!(
        budget_update(
            N1,
            json!({"metadata": {"name": "aks-flex-node-disruption"}}),
            budget_cm(&[("holder.n1", "{}")])
        ),
        Ok(())
    );
    let own = ["node n1 may change only its own slot of the disruption budget (data.holder.n1)"];
    // Another node's slot: neither freed (even expired), nor written, nor taken in its name.
    assert_eq!(
        budget_update(N1, base.clone(), budget_cm(&[("maxUnavailable", "1")])).unwrap_err(),
        own
    );
    assert_eq!(
        budget_update(
            N1,
            base.clone(),
            budget_cm(&[("maxUnavailable", "1"), ("holder.n2", "{}")])
        )
        .unwrap_err(),
        own
    );
    assert_eq!(
        budget_update(
            N1,
            base.clone(),
            budget_cm(&[
                ("maxUnavailable", "1"),
                ("holder.n2", "{\"owner\":\"x\"}"),
                ("holder.n3", "{}")
            ])
        )
        .unwrap_err(),
        own
    );
    // K and the lease are the administrator's.
    assert_eq!(
        budget_update(
            N1,
            base.clone(),
            budget_cm(&[("maxUnavailable", "9"), ("holder.n2", "{\"owner\":\"x\"}")])
        )
        .unwrap_err(),
        own
    );
    // Not a node user at all, though in the group.
    let e = budget_update("mallory", base.clone(), taken).unwrap_err();
    assert!(
        e.iter()
            .any(|m| m == "only a node's identity takes a disruption slot"),
        "{e:?}"
    );
    // Neither created nor deleted by a daemon; administrators are not matched.
    let p = policy_in("disruption.yaml");
    let e = admit_by(&p, req("DELETE", "", N1, true), Value::Null, base.clone()).unwrap_err();
    assert!(
        e.iter()
            .any(|m| m == "node daemons neither create nor delete the disruption budget"),
        "{e:?}"
    );
    let e = admit_by(&p, req("CREATE", "", N1, true), base.clone(), Value::Null).unwrap_err();
    assert!(
        e.iter()
            .any(|m| m == "node daemons neither create nor delete the disruption budget"),
        "{e:?}"
    );
    assert_eq!(
        admit_by(&p, req("UPDATE", "", "admin", false), budget_cm(&[]), base),
        Ok(())
    );
}

#[test]
fn a_daemon_changes_nothing_of_the_budget_but_its_slot() {
    let base = budget_cm(&[("maxUnavailable", "1")]);
    let with = |path: &str, v: Value| {
        let mut o = budget_cm(&[("maxUnavailable", "1"), ("holder.n1", "{}")]);
        let (first, rest) = path.split_once('.').unwrap_or((path, ""));
        if rest.is_empty() {
            o[first] = v;
        } else {
            o[first][rest] = v;
        }
        o
    };
    let meta = [
        "a node's daemon changes only its slot in data, not the budget's metadata, binaryData or immutable",
    ];
    // An owner reference would let the garbage collector delete the budget.
    let owned = with(
        "metadata.ownerReferences",
        json!([{"apiVersion": "v1", "kind": "Pod", "name": "gone", "uid": "0000"}]),
    );
    assert_eq!(budget_update(N1, base.clone(), owned).unwrap_err(), meta);
    for (path, v) in [
        ("metadata.finalizers", json!(["x/y"])),
        ("metadata.labels", json!({"a": "b"})),
        ("metadata.annotations", json!({"a": "b"})),
        ("binaryData", json!({"k": "AAAA"})),
        ("immutable", json!(true)),
    ] {
        assert_eq!(
            budget_update(N1, base.clone(), with(path, v)).unwrap_err(),
            meta,
            "{path}"
        );
    }
    // Unchanged metadata passes (labels the administrator set stay as they are).
    let mut labelled = base.clone();
    labelled["metadata"]["labels"] = json!({"app.kubernetes.io/name": "aks-flex-controller"});
    let mut taken = with(
        "metadata.labels",
        json!({"app.kubernetes.io/name": "aks-flex-controller"}),
    );
    taken["data"]["holder.n1"] = json!("{\"owner\":\"op\"}");
    assert_eq!(budget_update(N1, labelled, taken), Ok(()));
    // A slot's value is short.
    let big = budget_cm(&[("maxUnavailable", "1"), ("holder.n1", &"x".repeat(513))]);
    assert_eq!(
        budget_update(N1, base, big).unwrap_err(),
        ["a disruption slot's value is at most 512 bytes"]
    );
}
