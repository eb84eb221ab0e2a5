//! The agent's own units: `aks-flex-node-agent.service` as upstream ships it (the host
//! variant) and the recovery unit, and the container variants, which run the agent's image with
//! `ctr run` ([`ContainerUnit`]: the agent, the first-boot bootstrap, reset; the container
//! recovery unit).

/// Unit name.
pub const AGENT_UNIT: &str = "aks-flex-node-agent.service";
/// Where the unit is installed.
pub const AGENT_UNIT_PATH: &str = "/etc/systemd/system/aks-flex-node-agent.service";

/// The recovery unit: started by systemd when the agent's unit fails (`OnFailure=`); runs
/// `aks-flex-node recover` from the last good agent ([`crate::flows::upgrade`]).
pub const RECOVERY_UNIT: &str = "aks-flex-node-recovery.service";
/// Where the recovery unit is installed.
pub const RECOVERY_UNIT_PATH: &str = "/etc/systemd/system/aks-flex-node-recovery.service";

/// The agent units' stop guard: when the service did not succeed (`$SERVICE_RESULT`, which
/// systemd gives `ExecStopPost=`; `$$` is a literal `$` to systemd, so the shell reads it), it
/// starts the recovery unit at once, without waiting for it (`--no-block`: recovery restarts
/// this unit). `OnFailure=` alone fires on systemd < 254 only once the start limit is reached,
/// after every `RestartSec=30` retry (115–127 s for a candidate that exits at once); recovery
/// decides what a failure means ([`flex_api::upgrade::recovery`]: an unproven
/// candidate is rolled back now, a proven agent is left to its own restarts). The `-` keeps a
/// failed guard (e.g. during shutdown) from changing the unit's result.
pub const STOP_GUARD: &str = "ExecStopPost=-/bin/sh -c 'test \"$$SERVICE_RESULT\" = success || exec systemctl start --no-block aks-flex-node-recovery.service'\n";

/// The host variant of the agent's unit: runs the `current` slot of the blue/green layout
/// ([`crate::flows::upgrade::layout`]) as the daemon, and the recovery unit when it fails. It may start
/// 5 times in 5 minutes (`StartLimitIntervalSec=300`, `StartLimitBurst=5`);
/// `Restart=on-failure` every 30 s; a failure starts recovery at once ([`STOP_GUARD`]).
pub fn render_agent_unit() -> String {
    format!("\
[Unit]
Description=AKS Flex Node Agent
After=network-online.target
Wants=network-online.target
StartLimitIntervalSec=300
StartLimitBurst=5
OnFailure=aks-flex-node-recovery.service

[Service]
Type=simple
RemainAfterExit=no
ExecStart=/usr/local/lib/aks-flex-node/current/aks-flex-node agent --config /etc/aks-flex-node/config.json
{STOP_GUARD}\
TimeoutStartSec=300
TimeoutStopSec=60
Restart=on-failure
RestartSec=30
StandardOutput=journal
StandardError=journal

[Install]
WantedBy=multi-user.target
")
}

/// The host variant of the recovery unit: runs `recover` from the `last-good` slot.
pub fn render_recovery_unit() -> String {
    "\
[Unit]
Description=AKS Flex Node Agent recovery
After=network-online.target

[Service]
Type=oneshot
ExecStart=/usr/local/lib/aks-flex-node/last-good/aks-flex-node recover
TimeoutStartSec=600
StandardOutput=journal
StandardError=journal
"
    .to_string()
}

/// The recovery unit for this host (the container variant runs the last good image).
pub fn render_recovery_unit_for(containerized: bool) -> String {
    if containerized {
        render_container_recovery_unit()
    } else {
        render_recovery_unit()
    }
}

/// The host's settings file naming the agent's image (`AKS_FLEX_NODE_IMAGE=`), written by the
/// host's provisioning. It lives outside `/etc/aks-flex-node`, which reset removes.
pub const CONTAINER_SETTINGS: &str = "/etc/sysconfig/aks-flex-node-container";
/// The image an AgentUpgrade selected (`AKS_FLEX_NODE_IMAGE=`), overriding the settings file,
/// and the last image that proved itself (`AKS_FLEX_NODE_LAST_GOOD_IMAGE=`), which recovery runs.
pub const AGENT_IMAGE_ENV: &str = "/etc/aks-flex-node/agent-image.env";
/// containerd namespace of the agent's containers.
pub const CTR_NAMESPACE: &str = "aks-flex";
/// The bootstrap unit (from the host's provisioning).
pub const BOOTSTRAP_UNIT: &str = "aks-flex-node-bootstrap.service";
/// The reset unit (from the host's provisioning).
pub const RESET_UNIT: &str = "aks-flex-node-reset.service";

/// One of the units that run the agent's image under `ctr run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerUnit {
    /// `aks-flex-node-agent.service`: the daemon (installed by `start`, removed by reset).
    Agent,
    /// `aks-flex-node-bootstrap.service`: runs `aks-flex-node-bootstrap` once.
    Bootstrap,
    /// `aks-flex-node-reset.service`: runs `aks-flex-node reset`.
    Reset,
}

impl ContainerUnit {
    /// The container's name, also its scope: `aks-flex-<name>.scope` in `system-aksflex.slice`.
    pub fn container_name(self) -> &'static str {
        match self {
            ContainerUnit::Agent => "agent",
            ContainerUnit::Bootstrap => "bootstrap",
            ContainerUnit::Reset => "reset",
        }
    }

    /// The unit's file name.
    pub fn unit_name(self) -> &'static str {
        match self {
            ContainerUnit::Agent => AGENT_UNIT,
            ContainerUnit::Bootstrap => BOOTSTRAP_UNIT,
            ContainerUnit::Reset => RESET_UNIT,
        }
    }
}

/// The `ctr run` argv of a container unit (before the image and command). The container learns
/// which image it runs from `AKS_FLEX_NODE_IMAGE` (how an upgraded agent knows it is the
/// candidate); `image` is how the unit spells that image (a systemd `${VAR}`, or a shell
/// variable in the recovery unit's script).
pub fn ctr_run_args(name: &str) -> String {
    ctr_run_args_with(
        name,
        "--rm",
        "${AKS_FLEX_NODE_IMAGE}",
        "$AKS_FLEX_NODE_CTR_RUN_ARGS",
    )
}

/// `mode` is `--rm` (attached: `ctr run` stays until the task exits, then removes it) or the
/// detached run's flags.
fn ctr_run_args_with(name: &str, mode: &str, image: &str, extra: &str) -> String {
    format!(
        "/usr/bin/ctr -n {CTR_NAMESPACE} run {mode} --privileged --net-host \\\n    --with-ns pid:/proc/1/ns/pid \\\n    --mount type=bind,src=/,dst=/host,options=rbind:rshared \\\n    --runc-systemd-cgroup --cgroup system-aksflex.slice:aks-flex:{name} \\\n    --env AKS_FLEX_NODE_IMAGE={image} \\\n    {extra}"
    )
}

/// The FIFO the agent's detached task writes its output to (`ctr run -d --log-uri file://…`),
/// which the unit holds open and its waiter relays to the journal.
pub const AGENT_OUTPUT_FIFO: &str = "/run/aks-flex-node/agent.out";

/// The agent's unit's `ExecStart=` script: the daemon's container as a detached containerd
/// task, and `aks-flex-node wait-task` from that container's own image as the unit's main
/// process ([`crate::flows::task_wait`]), in place of an attached `ctr run` client.
///
/// 1. The FIFO is made anew and opened read-write on fd 3 (so the shim's open for writing never
///    waits, and the unit holds the only reader).
/// 2. `ctr run -d --log-uri file://<fifo>` starts the task; `ctr` exits once it runs.
/// 3. The task's PID (the host's PID namespace, which the container shares) gives the image's
///    binary as `/proc/<pid>/root/opt/aks-flex-node/bin/aks-flex-node`; the script `exec`s it as
///    `wait-task` with the FIFO as its stdin: it relays the output to the journal, forwards
///    SIGTERM, rides out containerd restarts, and exits with the task's status.
///
/// The unit is `Type=notify` with `NotifyAccess=main`: the waiter (the main process, the same
/// PID as the script it replaced) says `READY=1` once containerd shows the task running, so
/// `active` means the daemon runs and `systemctl start` returns then, not when the script began.
///
/// A task that is gone before its PID is read (the daemon died at once) has its output copied
/// for a second and the unit fails (status 1, not the task's own). `$$` is a literal `$` to
/// systemd, so the shell expands every variable.
fn agent_exec_start(command: &str) -> String {
    let id = "aks-flex-agent";
    let bin = flex_host::hostexec::IMAGE_BIN_DIR;
    let run = ctr_run_args_with(
        "agent",
        "-d --log-uri \"file://$$fifo\"",
        "\"$$AKS_FLEX_NODE_IMAGE\"",
        "$$AKS_FLEX_NODE_CTR_RUN_ARGS",
    );
    format!(
        "ExecStart=/bin/sh -c 'fifo={AGENT_OUTPUT_FIFO}; \\\n    mkdir -p \"$${{fifo%/*}}\" && rm -f \"$$fifo\" && mkfifo -m 0600 \"$$fifo\" && exec 3<>\"$$fifo\" || exit 1; \\\n    {run} \\\n    \"$$AKS_FLEX_NODE_IMAGE\" {id} {command} || exit 1; \\\n    pid=$$(/usr/bin/ctr -n {CTR_NAMESPACE} tasks ls | while read -r t p s; do test \"$$t\" = {id} && echo \"$$p\"; done); \\\n    test -n \"$$pid\" && test -e \"/proc/$$pid/root{bin}/aks-flex-node\" || {{ echo \"the agent task {id} ended at once\" >&2; timeout 1 cat <&3; exit 1; }}; \\\n    exec \"/proc/$$pid/root{bin}/aks-flex-node\" wait-task -n {CTR_NAMESPACE} {id} <&3 3<&-'\n"
    )
}

/// The container variant of the recovery unit (`aks-flex-recovery` in scope
/// `aks-flex-recovery.scope`): runs `aks-flex-node recover` in a container of the last image
/// that proved itself (`AKS_FLEX_NODE_LAST_GOOD_IMAGE` from `agent-image.env`; the settings
/// file's image when no upgrade ever ran), never the candidate that may have failed. Its script
/// is shell because the image variable has a fallback (`$$` is a literal `$` to systemd).
pub fn render_container_recovery_unit() -> String {
    let id = "aks-flex-recovery";
    let run = ctr_run_args_with(
        "recovery",
        "--rm",
        "\"$$image\"",
        "$$AKS_FLEX_NODE_CTR_RUN_ARGS",
    );
    format!(
        "[Unit]\nDescription=AKS Flex Node Agent recovery (container)\nAfter=containerd.service usr-local-overlay.service\nWants=usr-local-overlay.service\nRequires=containerd.service\n\n[Service]\nType=oneshot\n\
Environment=AKS_FLEX_NODE_IMAGE= AKS_FLEX_NODE_LAST_GOOD_IMAGE= AKS_FLEX_NODE_PULL_ARGS= AKS_FLEX_NODE_CTR_RUN_ARGS=\n\
EnvironmentFile=-{CONTAINER_SETTINGS}\nEnvironmentFile=-{AGENT_IMAGE_ENV}\n\
ExecStartPre=/bin/sh -c 'until /usr/bin/ctr version >/dev/null 2>&1; do sleep 1; done'\n\
ExecStartPre=-/bin/sh -c '/usr/bin/ctr -n {CTR_NAMESPACE} tasks delete -f {id} >/dev/null 2>&1; /usr/bin/ctr -n {CTR_NAMESPACE} containers delete {id} >/dev/null 2>&1; true'\n\
ExecStart=/bin/sh -c 'image=\"$${{AKS_FLEX_NODE_LAST_GOOD_IMAGE:-$$AKS_FLEX_NODE_IMAGE}}\"; \\\n    test -n \"$$image\" || {{ echo \"no agent image in {CONTAINER_SETTINGS} or {AGENT_IMAGE_ENV}\" >&2; exit 1; }}; \\\n    /usr/bin/ctr -n {CTR_NAMESPACE} images ls -q \"name==$$image\" | grep -q . || /usr/bin/ctr -n {CTR_NAMESPACE} images pull $$AKS_FLEX_NODE_PULL_ARGS \"$$image\" || exit 1; \\\n    exec {run} \\\n    \"$$image\" {id} /opt/aks-flex-node/bin/entrypoint aks-flex-node recover'\n\
TimeoutStartSec=600\n"
    )
}

/// The agent's unit for this host: the host variant runs the installed binary; in the agent's
/// container the unit runs the daemon in a container of the image the host's provisioning names.
pub fn render_agent_unit_for(containerized: bool) -> String {
    if containerized {
        render_container_unit(ContainerUnit::Agent)
    } else {
        render_agent_unit()
    }
}

/// Renders a unit that runs the agent's image with `ctr run` (naming the image's entrypoint
/// explicitly: `ctr run` replaces the image's entrypoint when given a command): privileged, in the host's network
/// and PID namespaces, the host's root at `/host`, in scope `aks-flex-<name>.scope` under
/// `system-aksflex.slice`. It first waits (within its start timeout) until containerd answers
/// `ctr version`, pulls the image if containerd does not have it, and clears a stale container
/// of the same name; stopping the unit ends the task.
pub fn render_container_unit(unit: ContainerUnit) -> String {
    let name = unit.container_name();
    let id = format!("aks-flex-{name}");
    let (description, unit_extra, service_type, command, service_extra, install) = match unit {
        ContainerUnit::Agent => (
            "AKS Flex Node Agent (container)",
            "StartLimitIntervalSec=300\nStartLimitBurst=5\nOnFailure=aks-flex-node-recovery.service\n",
            // `wait-task`, the main process, says READY=1 once the daemon's task runs.
            "notify\nNotifyAccess=main",
            "/opt/aks-flex-node/bin/entrypoint aks-flex-node agent --config /etc/aks-flex-node/config.json",
            "TimeoutStartSec=300\nTimeoutStopSec=60\nRestart=on-failure\nRestartSec=30\n",
            "[Install]\nWantedBy=multi-user.target\n",
        ),
        ContainerUnit::Bootstrap => (
            "AKS Flex Node bootstrap (container)",
            "ConditionPathExists=/etc/aks-flex-node/bootstrap.env\n",
            "oneshot",
            "/opt/aks-flex-node/bin/entrypoint aks-flex-node-bootstrap",
            "RemainAfterExit=yes\nTimeoutStartSec=1800\n",
            "[Install]\nWantedBy=multi-user.target\n",
        ),
        ContainerUnit::Reset => (
            "AKS Flex Node reset (container)",
            "",
            "oneshot",
            "/opt/aks-flex-node/bin/entrypoint aks-flex-node reset",
            "TimeoutStartSec=900\n",
            "",
        ),
    };
    let mut s = format!(
        "[Unit]\nDescription={description}\nAfter=network-online.target containerd.service usr-local-overlay.service\nWants=network-online.target usr-local-overlay.service\nRequires=containerd.service\n{unit_extra}\n[Service]\nType={service_type}\n"
    );
    s.push_str(&format!(
        "Environment=AKS_FLEX_NODE_IMAGE= AKS_FLEX_NODE_PULL_ARGS= AKS_FLEX_NODE_CTR_RUN_ARGS=\nEnvironmentFile=-{CONTAINER_SETTINGS}\nEnvironmentFile=-{AGENT_IMAGE_ENV}\n"
    ));
    s.push_str(
        "ExecStartPre=/bin/sh -c 'until /usr/bin/ctr version >/dev/null 2>&1; do sleep 1; done'\n",
    );
    s.push_str(&format!(
        "ExecStartPre=/bin/sh -c 'test -n \"$AKS_FLEX_NODE_IMAGE\" || {{ echo \"AKS_FLEX_NODE_IMAGE is not set in {CONTAINER_SETTINGS}\" >&2; exit 1; }}'\n"
    ));
    s.push_str(&format!(
        "ExecStartPre=/bin/sh -c '/usr/bin/ctr -n {CTR_NAMESPACE} images ls -q \"name==$AKS_FLEX_NODE_IMAGE\" | grep -q . || /usr/bin/ctr -n {CTR_NAMESPACE} images pull $AKS_FLEX_NODE_PULL_ARGS \"$AKS_FLEX_NODE_IMAGE\"'\n"
    ));
    s.push_str(&format!(
        "ExecStartPre=-/bin/sh -c '/usr/bin/ctr -n {CTR_NAMESPACE} tasks delete -f {id} >/dev/null 2>&1; /usr/bin/ctr -n {CTR_NAMESPACE} containers delete {id} >/dev/null 2>&1; true'\n"
    ));
    if unit == ContainerUnit::Agent {
        s.push_str(&agent_exec_start(command));
        s.push_str(&format!(
            "ExecStop=/usr/bin/ctr -n {CTR_NAMESPACE} tasks kill -s SIGTERM {id}\n"
        ));
        // The detached task outlives its start: removed once the unit stopped, whatever ended
        // it (the attached units' `ctr run --rm` does that itself).
        s.push_str(&format!(
            "ExecStopPost=-/bin/sh -c '/usr/bin/ctr -n {CTR_NAMESPACE} tasks delete -f {id} >/dev/null 2>&1; /usr/bin/ctr -n {CTR_NAMESPACE} containers delete {id} >/dev/null 2>&1; rm -f {AGENT_OUTPUT_FIFO}; true'\n"
        ));
        s.push_str(STOP_GUARD);
    } else {
        s.push_str(&format!(
            "ExecStart={} \\\n    ${{AKS_FLEX_NODE_IMAGE}} {id} {command}\n",
            ctr_run_args(name)
        ));
    }
    s.push_str(service_extra);
    if !install.is_empty() {
        s.push('\n');
        s.push_str(install);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_unit_snapshot() {
        insta::assert_snapshot!(render_agent_unit());
    }

    #[test]
    fn container_units_snapshot() {
        for u in [
            ContainerUnit::Agent,
            ContainerUnit::Bootstrap,
            ContainerUnit::Reset,
        ] {
            insta::assert_snapshot!(u.container_name(), render_container_unit(u));
        }
    }

    #[test]
    fn recovery_units_snapshot() {
        insta::assert_snapshot!("recovery_host", render_recovery_unit());
        insta::assert_snapshot!("recovery_container", render_container_recovery_unit());
    }

    #[test]
    fn the_agent_units_start_recovery_on_failure_and_recovery_runs_the_last_good_agent() {
        for agent in [
            render_agent_unit(),
            render_container_unit(ContainerUnit::Agent),
        ] {
            assert!(agent.contains("\nOnFailure=aks-flex-node-recovery.service\n"));
        }
        assert!(render_recovery_unit().contains("/last-good/aks-flex-node recover"));
        let c = render_container_recovery_unit();
        // systemd turns $$ into $, so the shell sees the fallback from last-good to the
        // install's image; the candidate that may have failed is never what recovery runs.
        assert!(c.contains("image=\"$${AKS_FLEX_NODE_LAST_GOOD_IMAGE:-$$AKS_FLEX_NODE_IMAGE}\""));
        assert!(c.contains("--cgroup system-aksflex.slice:aks-flex:recovery"));
        assert!(
            c.contains("aks-flex-recovery /opt/aks-flex-node/bin/entrypoint aks-flex-node recover")
        );
        assert!(
            c.lines()
                .find(|l| l.starts_with("ExecStartPre="))
                .unwrap()
                .contains("until /usr/bin/ctr version")
        );
        // No systemd ${VAR}/$VAR expansion is left in the script (only $$).
        let script = c
            .lines()
            .skip_while(|l| !l.starts_with("ExecStart="))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(!script.replace("$$", "").contains('$'), "{script}");
    }

    /// Both agent units (host and container) start recovery from `ExecStopPost=` when the
    /// service did not succeed, without blocking, and the shell (not systemd) reads
    /// `SERVICE_RESULT`. Rendering only: systemd's behaviour is covered by the upgrade group.
    #[test]
    fn the_agent_units_start_recovery_at_once_when_the_service_did_not_succeed() {
        for agent in [
            render_agent_unit(),
            render_container_unit(ContainerUnit::Agent),
        ] {
            let guards: Vec<&str> = agent
                .lines()
                .filter(|l| l.starts_with("ExecStopPost=") && l.contains("SERVICE_RESULT"))
                .collect();
            assert_eq!(guards.len(), 1, "{agent}");
            let g = guards[0];
            assert!(g.starts_with("ExecStopPost=-/bin/sh -c '"), "{g}");
            assert!(g.contains("test \"$$SERVICE_RESULT\" = success ||"), "{g}");
            assert!(
                g.contains("systemctl start --no-block aks-flex-node-recovery.service'"),
                "{g}"
            );
            // A restart loop stays systemd's: the guard only adds the early start.
            assert!(agent.contains("\nRestart=on-failure\n"));
        }
        for other in [
            render_recovery_unit(),
            render_container_recovery_unit(),
            render_container_unit(ContainerUnit::Bootstrap),
            render_container_unit(ContainerUnit::Reset),
        ] {
            assert!(!other.contains("ExecStopPost="), "{other}");
        }
    }

    #[test]
    fn the_agent_container_learns_its_image() {
        assert!(
            render_container_unit(ContainerUnit::Agent)
                .contains("--env AKS_FLEX_NODE_IMAGE=\"$$AKS_FLEX_NODE_IMAGE\"")
        );
        for u in [ContainerUnit::Bootstrap, ContainerUnit::Reset] {
            assert!(
                render_container_unit(u)
                    .contains("--env AKS_FLEX_NODE_IMAGE=${AKS_FLEX_NODE_IMAGE}")
            );
        }
    }

    /// The agent's unit keeps no `ctr` client: a detached task with its output on a FIFO the
    /// unit holds, `wait-task` from the task's own image as the main process, and the task
    /// removed once the unit stopped. The short-lived units stay attached (`ctr run --rm`).
    /// Rendering only: systemd and containerd run it in the VM (container, upgrade and faults
    /// groups), the waiter against a real containerd in `tests/tests/containerd_image.rs`.
    #[test]
    fn the_agent_unit_runs_a_detached_task_and_waits_with_wait_task() {
        let agent = render_container_unit(ContainerUnit::Agent);
        let start: Vec<&str> = agent
            .lines()
            .skip_while(|l| !l.starts_with("ExecStart="))
            .take_while(|l| !l.starts_with("ExecStop="))
            .collect();
        let script = start.join("\n");
        assert!(script.starts_with("ExecStart=/bin/sh -c 'fifo=/run/aks-flex-node/agent.out;"));
        assert!(script.contains("mkfifo -m 0600 \"$$fifo\" && exec 3<>\"$$fifo\" || exit 1;"));
        assert!(script.contains("run -d --log-uri \"file://$$fifo\" --privileged"));
        assert!(!script.contains("--rm"));
        assert!(script.ends_with(
            "exec \"/proc/$$pid/root/opt/aks-flex-node/bin/aks-flex-node\" wait-task -n aks-flex aks-flex-agent <&3 3<&-'"
        ));
        // Only `$$`: the shell, not systemd, expands the script's variables.
        assert!(!script.replace("$$", "").contains('$'), "{script}");
        let posts: Vec<&str> = agent
            .lines()
            .filter(|l| l.starts_with("ExecStopPost="))
            .collect();
        assert_eq!(posts.len(), 2, "{agent}");
        assert!(posts[0].contains("tasks delete -f aks-flex-agent"));
        assert!(posts[0].contains("containers delete aks-flex-agent"));
        assert!(posts[0].starts_with("ExecStopPost=-"));
        for u in [ContainerUnit::Bootstrap, ContainerUnit::Reset] {
            let text = render_container_unit(u);
            assert!(text.contains(" run --rm --privileged"), "{text}");
            assert!(!text.contains("wait-task"), "{text}");
        }
        assert!(render_container_recovery_unit().contains(" run --rm --privileged"));
    }

    #[test]
    fn container_units_wait_for_containerd_first_and_use_their_scope() {
        for u in [
            ContainerUnit::Agent,
            ContainerUnit::Bootstrap,
            ContainerUnit::Reset,
        ] {
            let text = render_container_unit(u);
            let first_pre = text
                .lines()
                .find(|l| l.starts_with("ExecStartPre="))
                .unwrap();
            assert!(
                first_pre.contains("until /usr/bin/ctr version"),
                "{first_pre}"
            );
            assert!(text.contains("Requires=containerd.service"));
            assert!(text.contains(&format!(
                "--runc-systemd-cgroup --cgroup system-aksflex.slice:aks-flex:{}",
                u.container_name()
            )));
            assert!(text.contains("--with-ns pid:/proc/1/ns/pid"));
            assert!(text.contains("src=/,dst=/host,options=rbind:rshared"));
            assert!(text.contains("Environment=AKS_FLEX_NODE_IMAGE= AKS_FLEX_NODE_PULL_ARGS= AKS_FLEX_NODE_CTR_RUN_ARGS="));
        }
    }
}
