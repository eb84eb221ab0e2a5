//! The `mounts` host group: a host bpffs mount is unmounted from where the agent runs, and
//! removing a machine leaves no mount behind.

use crate::check::{Ctx, Group, HostMode, Needs, check, ensure};
use crate::kit::agent::T;
use crate::report::Outcome;

/// The `mounts` group.
pub const GROUP: Group = Group {
    name: "mounts",
    description: "a host bpffs mount is unmounted from the agent's container; removing a machine leaves no mount",
    needs: Needs::Host,
    checks: &[
        check!(
            "a host bpffs mount is unmounted from the agent's container",
            bpffs_unmount
        ),
        check!(
            "removing a machine leaves no mount behind",
            cleanup_leaves_no_mount
        ),
    ],
    in_host_mode: HostMode::Same,
};

async fn bpffs_unmount(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    let p = "/run/bpffs/harness-check";
    c.sh(&format!(
        "mkdir -p {p} && (mountpoint -q {p} || mount -t bpf bpf {p}) && mountpoint -q {p}"
    ))
    .await?;
    c.in_agent(&format!("umount {p}")).await?;
    let still = c.output(&format!("mountpoint -q {p}"), T).await?;
    ensure(!still.success(), || {
        format!("the host still has {p} mounted")
    })?;
    c.sh(&format!("rmdir {p}")).await?;
    Ok(Outcome::Passed)
}

async fn cleanup_leaves_no_mount(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    let active = c.active_machine().await?;
    let other = if active == "kube1" { "kube2" } else { "kube1" };
    let p = format!("/run/bpffs/{other}");
    c.sh(&format!(
        "mkdir -p {p} /var/lib/machines/{other}/etc && mount -t bpf bpf {p} && echo stale > /var/lib/machines/{other}/etc/hostname"
    ))
    .await?;
    c.in_agent(&format!("aks-flex-node debug cleanup-machine {other}"))
        .await?;
    let mounted = c
        .output(&format!("grep -qs ' {p} ' /proc/mounts"), T)
        .await?;
    ensure(!mounted.success(), || {
        format!("{p} is still mounted on the host")
    })?;
    let left = c
        .output(
            &format!("test -e /var/lib/machines/{other} || test -e {p}"),
            T,
        )
        .await?;
    ensure(!left.success(), || {
        format!("{other}'s directory or mount point is still there")
    })?;
    Ok(Outcome::Passed)
}
