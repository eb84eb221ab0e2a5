//! The agent's own unit, `aks-flex-node-agent.service`, rendered as upstream ships it.

/// Unit name.
pub const AGENT_UNIT: &str = "aks-flex-node-agent.service";
/// Where the unit is installed.
pub const AGENT_UNIT_PATH: &str = "/etc/systemd/system/aks-flex-node-agent.service";

/// The host variant of the agent's unit: runs the installed binary as the daemon. It may start 5
/// times in 5 minutes (`StartLimitIntervalSec=300`, `StartLimitBurst=5`); `Restart=on-failure`
/// every 30 s.
pub fn render_agent_unit() -> String {
    "\
[Unit]
Description=AKS Flex Node Agent
After=network-online.target
Wants=network-online.target
StartLimitIntervalSec=300
StartLimitBurst=5

[Service]
Type=simple
RemainAfterExit=no
ExecStart=/usr/local/bin/aks-flex-node agent --config /etc/aks-flex-node/config.json
TimeoutStartSec=300
TimeoutStopSec=60
Restart=on-failure
RestartSec=30
StandardOutput=journal
StandardError=journal

[Install]
WantedBy=multi-user.target
"
    .to_string()
}

/// The host's settings file naming the agent's image (`AKS_FLEX_NODE_IMAGE=`), written by the
/// host's provisioning. It lives outside `/etc/aks-flex-node`, which reset removes.
pub const CONTAINER_SETTINGS: &str = "/etc/sysconfig/aks-flex-node-container";
/// The image an AgentUpgrade selected (`AKS_FLEX_NODE_IMAGE=`), overriding the settings file.
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

/// The `ctr run` argv of a container unit (before the image and command).
pub fn ctr_run_args(name: &str) -> String {
    format!(
        "/usr/bin/ctr -n {CTR_NAMESPACE} run --rm --privileged --net-host \\\n    --with-ns pid:/proc/1/ns/pid \\\n    --mount type=bind,src=/,dst=/host,options=rbind:rshared \\\n    --runc-systemd-cgroup --cgroup system-aksflex.slice:aks-flex:{name} \\\n    $AKS_FLEX_NODE_CTR_RUN_ARGS"
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
            "StartLimitIntervalSec=300\nStartLimitBurst=5\n",
            "simple",
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
    s.push_str(&format!(
        "ExecStart={} \\\n    ${{AKS_FLEX_NODE_IMAGE}} {id} {command}\n",
        ctr_run_args(name)
    ));
    if unit == ContainerUnit::Agent {
        s.push_str(&format!(
            "ExecStop=/usr/bin/ctr -n {CTR_NAMESPACE} tasks kill -s SIGTERM {id}\n"
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
