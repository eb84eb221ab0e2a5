//! Where the agent runs, for the host groups: the context's shell helpers
//! ([`Ctx::sh`], [`Ctx::in_agent`], the agent's own status report and config, waits), the
//! command line that runs a tool where the agent runs (in its container through
//! `ctr tasks exec`, or on the host in host mode), and the host's bootstrap inputs, reset and
//! re-bootstrap, which several groups share.

use std::time::Duration;

use crate::check::Ctx;
use crate::guest_json::{self, AgentConfig};
use crate::hostmode::AgentMode;
use crate::node_status;

/// The usual timeout of a guest command.
pub const T: Duration = Duration::from_secs(120);

impl Ctx<'_> {
    /// Runs `script` as root in the guest with the usual timeout; its stdout, trimmed, or an
    /// error unless it exits 0.
    pub async fn sh(&self, script: &str) -> anyhow::Result<String> {
        Ok(self.run(script, T).await?.trim().to_string())
    }

    /// [`Ctx::sh`] with the timeout `t`.
    pub async fn sh_t(&self, script: &str, t: Duration) -> anyhow::Result<String> {
        Ok(self.run(script, t).await?.trim().to_string())
    }

    /// Runs a command where the agent runs: in its container, or on the host in host mode.
    pub async fn in_agent(&self, cmd: &str) -> anyhow::Result<String> {
        self.sh(&agent_command(self.state.mode, cmd)).await
    }

    /// The agent's own report, `aks-flex-node status --output json`, where the agent runs.
    pub async fn node_status(&self) -> anyhow::Result<node_status::Report> {
        node_status::parse(&self.sh(&node_status::json_command(self.state.mode)).await?)
    }

    /// The daemon's active machine, as `aks-flex-node status` reports it.
    pub async fn active_machine(&self) -> anyhow::Result<String> {
        node_status::active_machine(&self.node_status().await?)
    }

    /// The agent's config.
    pub async fn agent_config(&self) -> anyhow::Result<AgentConfig> {
        let text = self.sh(&format!("cat {}", guest_json::CONFIG)).await?;
        guest_json::parse(guest_json::CONFIG, &text)
    }

    /// Waits until `script` succeeds in the guest, polling every 2 s; a timeout names the last
    /// exit status and stderr (or the ssh failure) seen.
    pub async fn wait_for(
        &self,
        what: &str,
        script: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        flex_host::retry::wait_until(what, timeout, Duration::from_secs(2), || async {
            match self.output(script, T).await {
                Ok(o) if o.success() => Ok(()),
                Ok(o) => Err(format!("exit {:?}: {}", o.code, o.stderr.trim())),
                Err(e) => Err(format!("{e:#}")),
            }
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e} ({script})"))
    }

    /// Fails unless the daemon's active machine is `running` (`machinectl`).
    pub async fn ensure_active_machine_running(&self) -> anyhow::Result<()> {
        let m = self.active_machine().await?;
        let state = self
            .sh(&format!("machinectl show {m} -p State --value"))
            .await?;
        anyhow::ensure!(state == "running", "machine {m} is {state:?}");
        Ok(())
    }

    /// Reboots the guest (`systemctl reboot`) and waits for a new boot, machine `m` running and
    /// the agent active again.
    pub async fn reboot_and_wait(&self, m: &str) -> anyhow::Result<()> {
        let g = self.guest();
        let boot_id = g.boot_id().await?;
        let _ = self
            .output("systemctl reboot", Duration::from_secs(20))
            .await;
        // The guest takes a while to go down: the first look is after the first pause.
        tokio::time::sleep(Duration::from_secs(5)).await;
        g.wait_new_boot(&boot_id, Duration::from_secs(600))
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "the guest did not come back within 600s:\n{}",
                    crate::vm::tail(&self.state.serial_log(), 20)
                )
            })?;
        self.wait_for(
            &format!("machine {m} running after reboot"),
            &format!("test \"$(machinectl show {m} -p State --value)\" = running"),
            Duration::from_secs(300),
        )
        .await?;
        self.wait_agent_active().await
    }

    /// Waits until the agent's unit is active and its process runs
    /// ([`agent_running_script`]).
    pub async fn wait_agent_active(&self) -> anyhow::Result<()> {
        self.wait_for(
            "aks-flex-node-agent.service active",
            agent_running_script(self.state.mode),
            Duration::from_secs(300),
        )
        .await
    }
}

/// The shell command that runs `cmd` (a command line starting with `aks-flex-node` or a host
/// tool) where the agent runs: through `ctr tasks exec` in its container (image mode), or as
/// it is on the host, where `aks-flex-node` is the link through the `current` slot (host mode).
pub fn agent_command(mode: AgentMode, cmd: &str) -> String {
    match mode {
        AgentMode::Image => format!(
            "ctr -n aks-flex tasks exec --exec-id check-$$-$(date +%s%N) aks-flex-agent {cmd}"
        ),
        AgentMode::Host => match cmd.strip_prefix("aks-flex-node ") {
            Some(rest) => format!("{} {rest}", crate::hostmode::AGENT),
            None => cmd.to_string(),
        },
    }
}

/// A guest script that succeeds when the agent's unit is active and its process runs: the
/// container's task (image mode), or the unit's main process running a slot's binary (host
/// mode).
pub fn agent_running_script(mode: AgentMode) -> &'static str {
    match mode {
        AgentMode::Image => {
            "systemctl is-active --quiet aks-flex-node-agent.service && ctr -n aks-flex tasks ls | grep -q '^aks-flex-agent .*RUNNING'"
        }
        AgentMode::Host => {
            "systemctl is-active --quiet aks-flex-node-agent.service && pid=$(systemctl show -p MainPID --value aks-flex-node-agent.service) && test \"$pid\" != 0 && readlink /proc/$pid/exe | grep -Eq '^/usr/local/lib/aks-flex-node/(blue|green)/aks-flex-node$'"
        }
    }
}

/// Resets the host: the container's reset unit (image mode), or `aks-flex-node reset` on the
/// host as an operator runs it (host mode, which has no reset unit).
pub async fn run_reset(c: &Ctx<'_>) -> anyhow::Result<()> {
    let script = match c.state.mode {
        AgentMode::Image => "systemctl start aks-flex-node-reset.service".to_string(),
        AgentMode::Host => format!("{} reset", crate::hostmode::AGENT),
    };
    c.sh_t(&script, Duration::from_secs(900)).await?;
    Ok(())
}

/// Writes bootstrap.env in the guest, and the password-protected registry's credentials file
/// ([`write_registry_credentials`]). The content goes on stdin, not in an argument: with a
/// cluster it holds a real bootstrap token, which an error would otherwise show.
pub async fn write_bootstrap_env(c: &Ctx<'_>, env: &str) -> anyhow::Result<()> {
    c.guest()
        .sh_stdin(
            "mkdir -p /etc/aks-flex-node && umask 077 && cat > /etc/aks-flex-node/bootstrap.env",
            &flex_host::secret::Secret::new(env),
            &[],
        )
        .await?;
    write_registry_credentials(&c.guest(), c.state.registry.as_ref()).await
}

/// Writes the credentials file of `registry`'s password-protected instance where the bootstrap
/// inputs name it ([`crate::registry::GUEST_AUTH_FILE`], mode 0600, on stdin): as the Ignition
/// config did at first boot; `reset` removes it with `/etc/aks-flex-node`, so every bootstrap
/// after one needs it again, as it needs `bootstrap.env`. Nothing without such an instance.
pub async fn write_registry_credentials(
    guest: &crate::ssh::Guest<'_>,
    registry: Option<&crate::registry::Registry>,
) -> anyhow::Result<()> {
    let Some(creds) = registry.and_then(crate::registry::Registry::guest_credentials) else {
        return Ok(());
    };
    guest
        .sh_stdin(
            &format!(
                "mkdir -p /etc/aks-flex-node && umask 077 && cat > {}",
                crate::registry::GUEST_AUTH_FILE
            ),
            &flex_host::secret::Secret::new(creds),
            &[],
        )
        .await?;
    Ok(())
}

/// Restarts the bootstrap unit, its and the agent's failures reset first; returns when the
/// bootstrap has ended (oneshot).
pub const RESTART_BOOTSTRAP: &str = "systemctl reset-failed aks-flex-node-agent.service aks-flex-node-bootstrap.service 2>/dev/null; systemctl restart aks-flex-node-bootstrap.service";

/// How long a bootstrap may take.
pub const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(1500);

/// [`RESTART_BOOTSTRAP`], then waits for the agent to run.
pub async fn bootstrap_and_wait(c: &Ctx<'_>) -> anyhow::Result<()> {
    c.sh_t(RESTART_BOOTSTRAP, BOOTSTRAP_TIMEOUT).await?;
    c.wait_agent_active().await
}
