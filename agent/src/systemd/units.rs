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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_unit_snapshot() {
        insta::assert_snapshot!(render_agent_unit());
    }
}
