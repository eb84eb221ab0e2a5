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

fn policy() -> Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/controller/admission.yaml");
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&std::fs::read_to_string(path).unwrap()).unwrap();
    docs.into_iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .unwrap()
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
    let p = policy();
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
        if let Ok(Cel::String(s)) = eval(v["expression"].as_str().unwrap(), &ctx) {
            vars.insert(v["name"].as_str().unwrap().into(), json!(*s));
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
