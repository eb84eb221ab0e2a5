//! The `container` host group: the agent's container is in `aks-flex-agent.scope` under
//! `system-aksflex.slice`, its units wait for containerd, and its SELinux domain is the one the
//! labels imply. In host mode there is no container: the group is skipped.

use crate::check::{Ctx, Group, HostMode, IMAGE_MODE_ONLY, Needs, check, ensure};
use crate::kit::agent::T;
use crate::report::Outcome;

/// The `container` group.
pub const GROUP: Group = Group {
    name: "container",
    description: "the agent's container is in aks-flex-agent.scope under system-aksflex.slice, its units wait for containerd, and its SELinux domain",
    needs: Needs::Host,
    checks: &[
        check!(
            "the agent's container is in aks-flex-agent.scope under system-aksflex.slice",
            container_scope
        ),
        check!(
            "the agent's units wait for containerd",
            units_wait_for_containerd
        ),
        check!(
            "the container's SELinux domain is the one its labels imply",
            selinux_domain
        ),
    ],
    in_host_mode: HostMode::Skip(IMAGE_MODE_ONLY),
};

async fn container_scope(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    // The snapshot the group starts from can be saved while the bootstrap unit's last steps
    // still run (up waits for the agent's state, not for that unit to end); the check is about
    // where the running container is, so it first waits for the agent's unit and process, as
    // the machines group's checks do. Seen on 8399593's SELinux pass: the scope not yet there.
    c.wait_agent_active().await?;
    let slice = c
        .sh("systemctl show aks-flex-agent.scope -p Slice --value")
        .await?;
    ensure(slice == "system-aksflex.slice", || {
        format!("aks-flex-agent.scope is in {slice:?}")
    })?;
    let pid = c
        .sh("ctr -n aks-flex tasks ls | awk '$1==\"aks-flex-agent\"{print $2}'")
        .await?;
    let cg = c.sh(&format!("cat /proc/{pid}/cgroup")).await?;
    ensure(
        cg.contains("/system.slice/system-aksflex.slice/aks-flex-agent.scope"),
        || format!("the agent's process {pid} is in {cg}"),
    )?;
    Ok(Outcome::Passed)
}

async fn units_wait_for_containerd(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    for unit in [
        "aks-flex-node-agent.service",
        "aks-flex-node-bootstrap.service",
        "aks-flex-node-reset.service",
    ] {
        let text = c.sh(&format!("systemctl cat {unit}")).await?;
        let first_pre = text
            .lines()
            .find(|l| l.starts_with("ExecStartPre="))
            .unwrap_or_default();
        ensure(first_pre.contains("ctr version"), || {
            format!("{unit}'s first ExecStartPre is {first_pre:?}")
        })?;
        let after = c
            .sh(&format!("systemctl show {unit} -p After --value"))
            .await?;
        ensure(after.contains("containerd.service"), || {
            format!("{unit} is not After=containerd.service")
        })?;
    }
    Ok(Outcome::Passed)
}

/// The SELinux type of a context (`system_u:system_r:spc_t:s0` → `spc_t`; a bare type as it is).
/// Pure.
pub fn context_type(context: &str) -> &str {
    let c = context.trim().trim_end_matches('\0');
    c.split(':').nth(2).unwrap_or(c)
}

/// The domain the agent's container must run in: `spc_t` when containerd's directory carries a
/// container label (refpolicy's container module moves a container engine executing such files
/// to `spc_t`), else containerd's own domain, which nothing moves it out of: `kernel_t` on ACL
/// as it ships (its `/usr` unlabelled, PID 1 `kernel_t`), `init_t` on the SELinux dev host
/// (Debian's policy has no container module, so containerd itself stays `init_t`). Pure.
pub fn expected_agent_domain(containerd_dir_label: &str, containerd_context: &str) -> String {
    if containerd_dir_label.contains(":container_") {
        "spc_t".to_string()
    } else {
        context_type(containerd_context).to_string()
    }
}

async fn selinux_domain(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    let enforce = c.output("cat /sys/fs/selinux/enforce", T).await?;
    if !enforce.success() {
        return Ok(Outcome::Skipped("SELinux is off on this host".into()));
    }
    let label = c
        .sh("ls -dZ /var/lib/containerd | awk '{print $1}'")
        .await?;
    let containerd = c
        .sh("cat /proc/$(systemctl show -p MainPID --value containerd.service)/attr/current")
        .await?;
    let expected = expected_agent_domain(&label, &containerd);
    let pid = c
        .sh("ctr -n aks-flex tasks ls | awk '$1==\"aks-flex-agent\"{print $2}'")
        .await?;
    let ctx = c.sh(&format!("cat /proc/{pid}/attr/current")).await?;
    ensure(context_type(&ctx) == expected, || {
        format!(
            "the agent runs as {ctx}; /var/lib/containerd is {label} and containerd runs as \
             {containerd}, which implies {expected}"
        )
    })?;
    Ok(Outcome::Passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The domain the container must run in, from the labels: spc_t with container labels,
    /// else containerd's own (kernel_t on ACL as it ships, init_t on the SELinux dev host,
    /// whose policy has no container module).
    #[test]
    fn expected_agent_domain_follows_the_labels() {
        let acl_kernel = "system_u:system_r:kernel_t:s0";
        assert_eq!(
            expected_agent_domain("system_u:object_r:container_var_lib_t:s0", acl_kernel),
            "spc_t"
        );
        assert_eq!(
            expected_agent_domain("system_u:object_r:unlabeled_t:s0", acl_kernel),
            "kernel_t"
        );
        assert_eq!(
            expected_agent_domain(
                "system_u:object_r:var_lib_t:s0",
                "system_u:system_r:init_t:s0\0"
            ),
            "init_t"
        );
        assert_eq!(context_type("system_u:system_r:spc_t:s0:c1,c2"), "spc_t");
        assert_eq!(context_type("kernel"), "kernel");
    }
}
