//! The `reset` host group: reset leaves no unit, link, machine, mount or runtime dir behind, and
//! the host bootstraps again with a new config (a label the install's `bootstrap.env` lacks),
//! which the new `config.json` carries. (This was also the `bootstrap` group's second bootstrap,
//! with a reset of its own; the pass now does one reset and one bootstrap for both.)

use crate::check::{Ctx, Group, HostMode, Needs, check, ensure};
use crate::kit::agent::{bootstrap_and_wait, run_reset, write_bootstrap_env};
use crate::report::Outcome;

/// The `reset` group.
pub const GROUP: Group = Group {
    name: "reset",
    description: "reset leaves no unit, link, machine, mount or runtime dir behind, and the host bootstraps again with a new config",
    needs: Needs::Host,
    checks: &[
        check!(
            "reset leaves no unit, link, machine, mount or runtime dir",
            reset_leaves_nothing
        ),
        check!(
            "the host bootstraps again, with a new config",
            bootstraps_again
        ),
    ],
    in_host_mode: HostMode::Same,
};

async fn reset_leaves_nothing(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    run_reset(c).await?;
    let leftovers = c
        .sh(
            "for p in /etc/systemd/system/aks-flex-node-agent.service \
                      /etc/systemd/system/multi-user.target.wants/aks-flex-node-agent.service \
                      /var/lib/machines/kube1 /var/lib/machines/kube2 \
                      /etc/systemd/nspawn/kube1.nspawn /etc/systemd/nspawn/kube2.nspawn \
                      /etc/systemd/system/systemd-nspawn@kube1.service.d /etc/systemd/system/systemd-nspawn@kube2.service.d \
                      /etc/aks-flex-node /var/log/aks-flex-node; do test -e $p && echo $p; done; \
             machinectl list --no-legend | awk '{print \"machine \" $1}'; \
             grep ' /run/bpffs/' /proc/mounts | awk '{print \"mount \" $2}'; \
             systemctl is-active aks-flex-node-agent.service >/dev/null && echo 'agent unit active'; true",
        )
        .await?;
    ensure(leftovers.is_empty(), || {
        format!("left behind:\n{leftovers}")
    })?;
    Ok(Outcome::Passed)
}

/// The label the second bootstrap's config adds.
const NEW_LABEL: &str = "harness/second-bootstrap";

async fn bootstraps_again(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    let env = c.state.bootstrap_env.clone().unwrap_or_default();
    write_bootstrap_env(c, &format!("{env}AKS_FLEX_NODE_LABELS={NEW_LABEL}=true\n")).await?;
    bootstrap_and_wait(c).await?;
    let cfg = c.agent_config().await?;
    ensure(cfg.node.labels.contains_key(NEW_LABEL), || {
        format!(
            "the new config was not used: config.json's labels are {:?}",
            cfg.node.labels
        )
    })?;
    c.ensure_active_machine_running().await?;
    Ok(Outcome::Passed)
}
