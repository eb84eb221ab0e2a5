//! The `machines` host group: the active machine runs in `machine.slice`, `aks-flex-node status`
//! says the node is healthy (and, on a damaged daemon state, says so and changes nothing), the
//! machine is reachable from where the agent runs (`systemd-run --machine`, `machinectl shell`),
//! keeps its leader across an agent restart, restarts on a NodeReboot operation and is back
//! after a VM reboot. Its host-mode variant ([`HOST_GROUP`]) runs the same checks with the
//! agent's tools on the host, and first that the agent runs as the host unit from a blue/green
//! slot.
//!
//! Every check runs shell commands in the guest as root over SSH, and the agent's own tools
//! where the agent runs (in its container through `ctr tasks exec`, or on the host), all through
//! the context's runner, and says in its error what it saw.

use std::time::Duration;

use crate::check::{Ctx, Group, HostMode, Needs, check, ensure};
use crate::hostmode::AgentMode;
use crate::kit::agent::{T, agent_command};
use crate::node_status;
use crate::report::{Checked, Outcome};

/// The `machines` group.
pub const GROUP: Group = Group {
    name: "machines",
    description: "the active machine runs in machine.slice, is reachable from the agent's container, keeps running across a container restart and comes back after a reboot",
    needs: Needs::Host,
    checks: &[
        check!("active machine runs in machine.slice", machine_in_slice),
        check!(
            "node-problem-detector from the offline bundle runs in it",
            npd_runs_in_machine
        ),
        check!(
            "aks-flex-node status says the node is healthy",
            status_healthy
        ),
        check!(
            "aks-flex-node status on a damaged daemon state says so and changes nothing",
            status_on_damaged_state
        ),
        check!(
            "systemd-run --machine reaches it from the agent's container",
            systemd_run_from_container
        ),
        check!(
            "machinectl shell reaches it from the agent's container",
            machinectl_shell_from_container
        ),
        check!(
            "it keeps its leader while the agent's container restarts",
            leader_survives_restart
        ),
        check!(
            "operation run NodeReboot restarts it from the agent's container",
            node_reboot_operation
        ),
        check!(
            "a node-local repave carries kubelet's credential and leaves the token out",
            kubelet_credential_carried
        ),
        check!("it is back after a VM reboot", back_after_reboot),
    ],
    in_host_mode: HostMode::Variant(&HOST_GROUP),
};

/// The `machines` group in host mode (`up --mode host`): the same checks, the agent's tools
/// run on the host (where the agent runs), and first, that the agent runs as the host unit from
/// a blue/green slot.
pub const HOST_GROUP: Group = Group {
    name: "machines",
    description: "host mode: the agent runs as the host unit from a blue/green slot; the active machine runs in machine.slice, is reachable from the host, keeps running across an agent restart and comes back after a reboot",
    needs: Needs::Host,
    checks: &[
        check!(
            "the agent runs as the host unit from a blue/green slot",
            agent_runs_from_a_slot
        ),
        check!("active machine runs in machine.slice", machine_in_slice),
        check!(
            "node-problem-detector from the offline bundle runs in it",
            npd_runs_in_machine
        ),
        check!(
            "aks-flex-node status says the node is healthy",
            status_healthy
        ),
        check!(
            "aks-flex-node status on a damaged daemon state says so and changes nothing",
            status_on_damaged_state
        ),
        check!(
            "systemd-run --machine reaches it from the host",
            systemd_run_from_container
        ),
        check!(
            "machinectl shell reaches it from the host",
            machinectl_shell_from_container
        ),
        check!(
            "it keeps its leader while the agent's unit restarts",
            leader_survives_restart
        ),
        check!(
            "operation run NodeReboot restarts it from the host",
            node_reboot_operation
        ),
        check!(
            "a node-local repave carries kubelet's credential and leaves the token out",
            kubelet_credential_carried
        ),
        check!("it is back after a VM reboot", back_after_reboot),
    ],
    in_host_mode: HostMode::Same,
};

async fn agent_runs_from_a_slot(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let exec = c
        .sh("systemctl show aks-flex-node-agent.service -p ExecStart --value")
        .await?;
    ensure(
        exec.contains("/usr/local/lib/aks-flex-node/current/aks-flex-node")
            && !exec.contains("ctr "),
        || format!("aks-flex-node-agent.service runs {exec:?}, not the current slot"),
    )?;
    c.wait_agent_active().await?;
    let links = c
        .sh(&format!(
            "echo current=$(readlink {lib}/current); echo last-good=$(readlink {lib}/last-good); echo bin=$(readlink {bin}); \
             echo exe=$(readlink /proc/$(systemctl show -p MainPID --value aks-flex-node-agent.service)/exe); \
             echo recovery=$(systemctl show aks-flex-node-recovery.service -p ExecStart --value)",
            lib = crate::hostmode::LIB_DIR,
            bin = crate::hostmode::AGENT
        ))
        .await?;
    let get = |k: &str| {
        links
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let current = get("current");
    ensure(
        matches!(current.as_str(), "blue" | "green") && get("last-good") == current,
        || format!("the slots are not one proven slot: {links}"),
    )?;
    ensure(
        get("exe") == format!("{}/{current}/aks-flex-node", crate::hostmode::LIB_DIR)
            && get("bin") == format!("{}/current/aks-flex-node", crate::hostmode::LIB_DIR),
        || format!("the agent does not run through the current slot: {links}"),
    )?;
    ensure(
        get("recovery").contains("/usr/local/lib/aks-flex-node/last-good/aks-flex-node recover"),
        || format!("the recovery unit does not run the last-good slot: {links}"),
    )?;
    Ok(Checked::passed_with(format!("slot {current}")))
}

async fn machine_in_slice(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    let m = c.active_machine().await?;
    let state = c
        .sh(&format!("machinectl show {m} -p State --value"))
        .await?;
    ensure(state == "running", || format!("machine {m} is {state:?}"))?;
    let cg = c
        .sh(&format!(
            "systemctl show systemd-nspawn@{m}.service -p ControlGroup --value"
        ))
        .await?;
    ensure(cg.starts_with("/machine.slice/"), || {
        format!("machine {m} is in {cg}")
    })?;
    Ok(Outcome::Passed)
}

/// node-problem-detector, from the offline bundle the harness builds (a stand-in script: no
/// build of it can be had here), was verified and installed into the active machine and its
/// unit is active there, started by the agent after kubelet.
async fn npd_runs_in_machine(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let m = c.active_machine().await?;
    let state = c
        .sh(&format!(
            "systemd-run --machine={m} --pipe --wait systemctl is-active node-problem-detector.service || true"
        ))
        .await?;
    ensure(state == "active", || {
        format!("node-problem-detector.service in {m} is {state:?}")
    })?;
    let version = c
        .sh(&format!(
            "/var/lib/machines/{m}/usr/local/bin/node-problem-detector --version"
        ))
        .await?;
    Ok(Checked::passed_with(format!(
        "{m}: active, {version} (the bundle's stand-in)"
    )))
}

/// `aks-flex-node status` where the agent runs: the JSON report says healthy, in the mode the
/// node runs (`image` in the container, `binary` on a host), naming the machine `machinectl`
/// shows running with kubelet active in it; the text report exits 0 and says `healthy` first.
async fn status_healthy(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let r = c.node_status().await?;
    ensure(r.healthy, || {
        format!("status says {}", node_status::summary(&r))
    })?;
    let m = node_status::active_machine(&r)?;
    let want_mode = match c.state.mode {
        AgentMode::Image => "image",
        AgentMode::Host => "binary",
    };
    ensure(r.facts.agent.mode == want_mode, || {
        format!(
            "status says the agent runs in mode {:?}, the node runs it as {want_mode:?}",
            r.facts.agent.mode
        )
    })?;
    let kubelet_active = matches!(&r.facts.kubelet,
        node_status::KubeletView::Active { machine } if *machine == m);
    ensure(kubelet_active, || {
        format!("status says kubelet is {:?}", r.facts.kubelet)
    })?;
    let state = c
        .sh(&format!("machinectl show {m} -p State --value"))
        .await?;
    ensure(state == "running", || {
        format!("status names {m}, which machinectl shows {state:?}")
    })?;
    let text = c
        .output(&node_status::command_with(c.state.mode, "--output text"), T)
        .await?;
    ensure(
        text.success() && text.stdout.starts_with("healthy\n"),
        || {
            format!(
                "status --output text exited {:?} and printed {:?}",
                text.code,
                text.stdout.lines().next().unwrap_or_default()
            )
        },
    )?;
    let goal = r
        .facts
        .state
        .value()
        .map(|s| s.applied_settings_version.clone())
        .unwrap_or_default();
    Ok(Checked::passed_with(format!(
        "{m}, goal {goal}, agent {} ({want_mode}{})",
        r.facts.agent.version,
        r.facts
            .agent
            .image_digest
            .as_deref()
            .map(|d| format!(" {}", d.get(..19).unwrap_or(d)))
            .unwrap_or_default()
    )))
}

/// Where [`status_on_damaged_state`] puts its copy of the node's records: a host directory the
/// agent's container also has (its entrypoint binds `/var/lib/aks-flex-node`).
const STATUS_ROOT: &str = "/var/lib/aks-flex-node/status-check";

/// `aks-flex-node status --root` over a copy of the node's daemon state and bootstrap mark,
/// the state cut short as a crash mid-write would leave a file that is not atomic: it exits
/// non-zero naming `StateUnreadable` in both outputs, and changes no file, neither the copy
/// nor the node's own state.
async fn status_on_damaged_state(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let etc = "/etc/aks-flex-node";
    let root = STATUS_ROOT;
    let sums = format!(
        "sha256sum {etc}/daemon-state.json {root}{etc}/daemon-state.json {root}{etc}/bootstrap-complete.json"
    );
    let before = c
        .sh(&format!(
            "rm -rf {root} && mkdir -p {root}{etc} && chmod 700 {root} && \
             cp -p {etc}/bootstrap-complete.json {root}{etc}/ && \
             head -c 40 {etc}/daemon-state.json > {root}{etc}/daemon-state.json && {sums}"
        ))
        .await?;
    let json = c
        .output(
            &node_status::command_with(c.state.mode, &format!("--output json --root {root}")),
            T,
        )
        .await;
    let text = c
        .output(
            &node_status::command_with(c.state.mode, &format!("--output text --root {root}")),
            T,
        )
        .await;
    let after = c.sh(&sums).await;
    c.sh(&format!("rm -rf {root}")).await?;
    let (json, text, after) = (json?, text?, after?);
    ensure(!json.success() && !text.success(), || {
        format!(
            "status exited {:?} (json) and {:?} (text) on a damaged state",
            json.code, text.code
        )
    })?;
    let r = node_status::parse(&json.stdout)?;
    ensure(
        !r.healthy && node_status::has(&r, node_status::codes::STATE_UNREADABLE),
        || format!("status --output json says {}", node_status::summary(&r)),
    )?;
    ensure(
        text.stdout.contains(node_status::codes::STATE_UNREADABLE),
        || {
            format!(
                "status --output text does not name StateUnreadable:\n{}",
                text.stdout
            )
        },
    )?;
    ensure(before == after, || {
        format!("files changed under status:\nbefore:\n{before}\nafter:\n{after}")
    })?;
    Ok(Checked::passed_with(format!(
        "exit {:?}: {}",
        json.code,
        node_status::summary(&r)
    )))
}

async fn systemd_run_from_container(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    let m = c.active_machine().await?;
    let out = c
        .in_agent(&format!(
            "systemd-run --machine={m} --pipe --wait cat /etc/hostname"
        ))
        .await?;
    ensure(!out.is_empty(), || "no output from the machine".into())?;
    Ok(Outcome::Passed)
}

async fn machinectl_shell_from_container(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let m = c.active_machine().await?;
    // machinectl shell forwards the machine's pty; without a terminal on our side it can end
    // before the last output is forwarded when the command exits at once (seen in CI: nothing
    // printed, three times within 9 s). The command lingers a moment after its output, and a
    // lost line is tried again, 2 s apart, up to six times; every attempt's output is reported
    // if none arrives.
    const ATTEMPTS: usize = 6;
    let mut seen = Vec::new();
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let out = c.sh(&machinectl_shell_command(c.state.mode, &m)).await?;
        if out.contains("machine-shell-ok") {
            return Ok(if attempt == 0 {
                Outcome::Passed.into()
            } else {
                Checked::passed_with(format!("after {attempt} lost outputs"))
            });
        }
        seen.push(out);
    }
    Err(anyhow::anyhow!(
        "machinectl shell printed {seen:?} in {ATTEMPTS} attempts"
    ))
}

/// The `machinectl shell` of [`machinectl_shell_from_container`] where the agent runs. On the
/// host its standard input is the SSH session's, which is at its end at once, and machinectl
/// closes the shell at its input's end before the machine's output is forwarded (seen in host
/// mode: nothing printed in six attempts); an input that stays open a few seconds without data
/// (`sleep 5 |`) gives the command its time. In the container `ctr tasks exec` holds the input
/// open.
pub fn machinectl_shell_command(mode: AgentMode, machine: &str) -> String {
    let shell =
        format!("machinectl shell -q root@{machine} /bin/sh -c 'echo machine-shell-ok; sleep 1'");
    match mode {
        AgentMode::Image => agent_command(mode, &shell),
        AgentMode::Host => format!("sleep 5 | {shell}"),
    }
}

async fn leader_survives_restart(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    let m = c.active_machine().await?;
    let before = c
        .sh(&format!("machinectl show {m} -p Leader --value"))
        .await?;
    c.sh_t(
        "systemctl restart aks-flex-node-agent.service",
        Duration::from_secs(300),
    )
    .await?;
    c.wait_agent_active().await?;
    let after = c
        .sh(&format!("machinectl show {m} -p Leader --value"))
        .await?;
    ensure(before == after && !before.is_empty(), || {
        format!("leader changed from {before} to {after}")
    })?;
    Ok(Outcome::Passed)
}

async fn node_reboot_operation(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    let m = c.active_machine().await?;
    let before = c
        .sh(&format!("machinectl show {m} -p Leader --value"))
        .await?;
    let out = c
        .run(
            &agent_command(c.state.mode, "aks-flex-node operation run NodeReboot"),
            Duration::from_secs(600),
        )
        .await?;
    ensure(out.contains("phase: Complete"), || {
        format!("NodeReboot printed {out:?}")
    })?;
    let state = c
        .sh(&format!("machinectl show {m} -p State --value"))
        .await?;
    let after = c
        .sh(&format!("machinectl show {m} -p Leader --value"))
        .await?;
    ensure(state == "running" && after != before, || {
        format!("after NodeReboot {m} is {state:?} with leader {after} (was {before})")
    })?;
    Ok(Outcome::Passed)
}

/// kubelet's client pair as its certificate store keeps it, for `node`: the key, then a
/// certificate for `system:node:<node>` valid from a day ago for a year (self-signed: the agent
/// checks the node and the validity of what it carries, not who signed it; offline there is no
/// cluster CA to sign with).
fn kubelet_pair(node: &str) -> anyhow::Result<String> {
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
    let key = KeyPair::generate()?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("system:node:{node}"));
    dn.push(DnType::OrganizationName, "system:nodes");
    let mut params = CertificateParams::default();
    params.distinguished_name = dn;
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let day = Duration::from_secs(24 * 3600);
    params.not_before = epoch + (now - day);
    params.not_after = epoch + (now + 365 * day);
    let cert = params.self_signed(&key)?.pem();
    Ok(format!("{}{cert}", key.serialize_pem()))
}

/// #29 item 1 on real machines: kubelet's pair, laid out in the active machine as kubelet's
/// store does (a dated file and the `current` link to it), goes with a node-local repave
/// (`aks-flex-node repave`, where the agent runs) to the new machine: copied whole (0600,
/// behind the `current` link kubelet rotates through), kubelet's kubeconfig naming it, and no
/// bootstrap token's kubeconfig written there.
async fn kubelet_credential_carried(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    use base64::Engine as _;
    use sha2::Digest as _;
    if c.cluster {
        // kubelet holds a real pair there, which a planted one would replace; the cluster's
        // repave group moves the node with it.
        return Ok(Checked {
            outcome: Outcome::Skipped(
                "a cluster run: kubelet holds the cluster's credential, which this check would replace with a planted one".into(),
            ),
            detail: None,
            steps: Vec::new(),
        });
    }
    let from = c.active_machine().await?;
    let node = c.agent_config().await?.agent.node_name;
    ensure(!node.is_empty(), || {
        "the agent's config names no node".into()
    })?;
    let pair = kubelet_pair(&node)?;
    let digest = hex::encode(sha2::Sha256::digest(pair.as_bytes()));
    let b64 = base64::engine::general_purpose::STANDARD.encode(pair.as_bytes());
    let pki = format!("/var/lib/machines/{from}/var/lib/kubelet/pki");
    let dated = "kubelet-client-2026-01-01-00-00-00.pem";
    c.sh(&format!(
        "set -e; install -d -m 0700 {pki}; echo {b64} | base64 -d > {pki}/{dated}; chmod 0600 {pki}/{dated}; ln -sfn /var/lib/kubelet/pki/{dated} {pki}/kubelet-client-current.pem"
    ))
    .await?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let t = std::time::Instant::now();
    c.run(
        &agent_command(
            c.state.mode,
            &format!("aks-flex-node repave --settings-version harness-carry-{stamp}"),
        ),
        Duration::from_secs(900),
    )
    .await?;
    let took = t.elapsed();
    let to = c.active_machine().await?;
    ensure(to != from, || format!("the repave left the node on {from}"))?;
    let root = format!("/var/lib/machines/{to}/var/lib/kubelet");
    let seen = c
        .sh(&format!(
            "readlink {root}/pki/kubelet-client-current.pem; sha256sum < {root}/pki/kubelet-client-carried.pem | cut -d' ' -f1; stat -c %a {root}/pki/kubelet-client-carried.pem; grep -c 'client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem' {root}/kubeconfig; test -e {root}/bootstrap-kubeconfig && echo token-kubeconfig || echo no-token-kubeconfig"
        ))
        .await?;
    let want = format!(
        "/var/lib/kubelet/pki/kubelet-client-carried.pem\n{digest}\n600\n1\nno-token-kubeconfig"
    );
    ensure(seen == want, || {
        format!("in {to} after the repave from {from}: {seen:?}, want {want:?}")
    })?;
    Ok(Checked::passed_with(format!(
        "{from} → {to} in {:.1} s: the pair carried whole (0600, behind kubelet's link), the kubeconfig naming it, no token's kubeconfig",
        took.as_secs_f64()
    )))
}

async fn back_after_reboot(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    let m = c.active_machine().await?;
    c.reboot_and_wait(&m).await?;
    Ok(Outcome::Passed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Checked;
    use crate::ssh::Ssh;
    use crate::state::State;
    use flex_host::runner::Output;
    use flex_testkit::FakeRunner;

    fn state(ssh: &Ssh) -> State {
        State {
            work: "/w".into(),
            qemu_pid: None,
            registry: None,
            ssh: ssh.clone(),
            accel: "tcg".into(),
            accel_reason: String::new(),
            agent_image: String::new(),
            machine_image: None,
            bundle: None,
            bootstrap_env: None,
            snapshot: None,
            timings: Vec::new(),
            cluster: None,
            mode: crate::hostmode::AgentMode::Image,
            served: None,
        }
    }

    fn fake_ssh() -> Ssh {
        Ssh {
            port: 2222,
            key: "/w/id".into(),
        }
    }

    /// A check context over the faked runner `r`, no cluster.
    fn fake_ctx<'a>(st: &'a State, ssh: &'a Ssh, r: &'a FakeRunner) -> Ctx<'a> {
        Ctx {
            state: st,
            ssh,
            cluster: false,
            runner: r,
        }
    }

    /// The argv prefix of a guest script starting with `start`.
    fn guest(ssh: &Ssh, start: &str) -> String {
        let base = ssh.cmd("x", Duration::ZERO).display_argv();
        let base = base.strip_suffix(" 'x'").unwrap();
        format!("{base} \"'{start}")
    }

    /// The first check of `machines`, as its group runs it, against a faked runner: the
    /// scripted guest answers decide whether it passes or fails, and what it ran is recorded.
    #[tokio::test]
    async fn machine_in_slice_passes_and_fails_on_a_faked_runner() {
        let ssh = fake_ssh();
        let st = state(&ssh);
        let r = FakeRunner::new();
        let ctx = fake_ctx(&st, &ssh, &r);
        let check = GROUP.checks[0];
        assert_eq!(check.name, "active machine runs in machine.slice");
        // The agent's report, as `status --output json` prints it (the agent's own snapshot).
        let status = "timeout 30 ctr -n aks-flex tasks exec --exec-id status-";
        r.on(
            &guest(&ssh, status),
            Output::ok(crate::node_status::agent_snapshots::healthy()),
        );
        r.on(
            &guest(&ssh, "machinectl show kube1 -p State"),
            Output::ok("running\n"),
        );
        r.on(
            &guest(&ssh, "systemctl show systemd-nspawn@kube1.service"),
            Output::ok("/machine.slice/systemd-nspawn@kube1.service\n"),
        );
        assert_eq!(
            (check.run)(&ctx).await.unwrap(),
            Checked::from(Outcome::Passed)
        );
        let calls = r.calls();
        assert_eq!(calls.len(), 3, "{calls:?}");
        assert!(calls.iter().all(|c| c.starts_with("ssh ")), "{calls:?}");

        r.on(
            &guest(&ssh, "systemctl show systemd-nspawn@kube1.service"),
            Output::ok("/system.slice/systemd-nspawn@kube1.service\n"),
        );
        let e = (check.run)(&ctx).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "machine kube1 is in /system.slice/systemd-nspawn@kube1.service"
        );

        r.on(
            &guest(&ssh, status),
            Output::ok(crate::node_status::agent_snapshots::never_bootstrapped()),
        );
        let e = (check.run)(&ctx).await.unwrap_err().to_string();
        assert!(e.starts_with("no active machine: NotBootstrapped: "), "{e}");
        r.on(&guest(&ssh, status), Output::ok(""));
        let e = (check.run)(&ctx).await.unwrap_err().to_string();
        assert_eq!(e, "aks-flex-node status printed nothing");
    }

    /// `status_on_damaged_state` against a faked runner (the guest's answers scripted, the
    /// agent's report built from its own healthy snapshot): it passes only when status exits
    /// non-zero naming StateUnreadable in both outputs and the files' sums are the same after,
    /// and it removes its copy either way.
    #[tokio::test]
    async fn status_on_a_damaged_state_is_judged_by_exit_report_and_sums() {
        let ssh = fake_ssh();
        let st = state(&ssh);
        let r = FakeRunner::new();
        let ctx = fake_ctx(&st, &ssh, &r);
        let mut report = node_status::parse(node_status::agent_snapshots::healthy()).unwrap();
        report.healthy = false;
        report.problems = vec![node_status::Problem {
            code: node_status::codes::STATE_UNREADABLE.into(),
            message: "daemon state: truncated".into(),
        }];
        let json = serde_json::to_string(&report).unwrap();
        let exec = "timeout 30 ctr -n aks-flex tasks exec --exec-id status-$$-$(date +%s%N) aks-flex-agent aks-flex-node status";
        let unhealthy = |stdout: &str| Output {
            code: Some(1),
            stdout: stdout.into(),
            stderr: String::new(),
        };
        r.on(&guest(&ssh, "rm -rf "), Output::ok("sums-1\n"));
        r.on(&guest(&ssh, "sha256sum "), Output::ok("sums-1\n"));
        r.on(
            &guest(&ssh, &format!("{exec} --output json")),
            unhealthy(&json),
        );
        r.on(
            &guest(&ssh, &format!("{exec} --output text")),
            unhealthy("NOT HEALTHY\n  - StateUnreadable: daemon state: truncated\n"),
        );
        let run = || async { status_on_damaged_state(&ctx).await };
        let passed = run().await.unwrap();
        assert!(
            format!("{passed:?}").contains("StateUnreadable"),
            "{passed:?}"
        );
        let cleanup = format!("rm -rf {STATUS_ROOT}");
        let calls = r.calls();
        assert!(
            calls
                .iter()
                .any(|c| c.contains(&cleanup) && !c.contains("mkdir")),
            "{calls:?}"
        );

        // The files changed under status.
        r.on(&guest(&ssh, "sha256sum "), Output::ok("sums-2\n"));
        let e = run().await.unwrap_err().to_string();
        assert!(e.starts_with("files changed under status"), "{e}");
        r.on(&guest(&ssh, "sha256sum "), Output::ok("sums-1\n"));

        // Exit 0 on a damaged state.
        r.on(
            &guest(&ssh, &format!("{exec} --output json")),
            Output::ok(json.clone()),
        );
        let e = run().await.unwrap_err().to_string();
        assert!(e.contains("exited Some(0) (json)"), "{e}");
        r.on(
            &guest(&ssh, &format!("{exec} --output json")),
            unhealthy(&json),
        );

        // A report without StateUnreadable.
        r.on(
            &guest(&ssh, &format!("{exec} --output json")),
            unhealthy(node_status::agent_snapshots::never_bootstrapped()),
        );
        let e = run().await.unwrap_err().to_string();
        assert!(e.contains("NotBootstrapped"), "{e}");
    }
}
