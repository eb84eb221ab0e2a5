//! The check groups, in their usual order, and `--only` selection. Each group starts from a
//! bootstrapped host and leaves one, so any can run alone; groups that need a Kubernetes
//! cluster (`up --cluster`, [`crate::cluster`]) are, without one, reported as skipped with the
//! reason `up` recorded.

/// What a group needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// Only the VM (offline).
    Host,
    /// A cluster the node joins (kind with network access).
    Cluster,
}

/// A check group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    /// Name used with `--only`.
    pub name: &'static str,
    /// What it checks.
    pub description: &'static str,
    /// What it needs.
    pub needs: Needs,
}

/// Every group, in run order. `machines` runs first: it reboots the VM, which also resets the
/// agent unit's start limit for the groups after it. `upgrade` follows it, with that limit to
/// itself (it restarts the agent four times; see `docs/upgrade-checks.md`).
pub const GROUPS: &[Group] = &[
    Group {
        name: "machines",
        description: "the active machine runs in machine.slice, is reachable from the agent's container, keeps running across a container restart and comes back after a reboot",
        needs: Needs::Host,
    },
    Group {
        name: "upgrade",
        description: "AgentUpgrade through operation run: an image named by tag alone is rejected, a good candidate is switched to, a broken one rolls back and is removed, a reboot mid-upgrade settles, and the agent ends on the install's image",
        needs: Needs::Host,
    },
    Group {
        name: "mounts",
        description: "a host bpffs mount is unmounted from the agent's container; removing a machine leaves no mount",
        needs: Needs::Host,
    },
    Group {
        name: "container",
        description: "the agent's container is in aks-flex-agent.scope under system-aksflex.slice, its units wait for containerd, and its SELinux domain",
        needs: Needs::Host,
    },
    Group {
        name: "bootstrap",
        description: "bootstrap.env is data; start runs once and saves state; a second bootstrap with a new config works",
        needs: Needs::Host,
    },
    Group {
        name: "reset",
        description: "reset leaves no unit, link, machine, mount or runtime dir behind, and the host bootstraps again",
        needs: Needs::Host,
    },
    Group {
        name: "node-join",
        description: "the node joins the cluster and is Ready, the daemon's CSR is approved, the active machine runs, a pod runs on it and kubectl logs reaches it",
        needs: Needs::Cluster,
    },
    Group {
        name: "repave",
        description: "a new settings version (eTag) and a deleted Node move the node to the other machine: a new Ready Node, the old machine and its bpffs mount removed, a pod runs",
        needs: Needs::Cluster,
    },
    Group {
        name: "machine-operations",
        description: "NodeReboot and AgentReset MachineOperations through the API finish Complete; the node is Ready after the reboot, and joins again after the reset and a fresh bootstrap",
        needs: Needs::Cluster,
    },
];

/// Why a selection is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown check group {name:?}; groups: {known}")]
pub struct UnknownGroup {
    /// The bad name.
    pub name: String,
    /// The known names.
    pub known: String,
}

/// The groups to run for `--only a,b` (every group when `None`), always in run order.
pub fn select(only: Option<&str>) -> Result<Vec<Group>, UnknownGroup> {
    let Some(only) = only else {
        return Ok(GROUPS.to_vec());
    };
    let wanted: Vec<&str> = only
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    for w in &wanted {
        if !GROUPS.iter().any(|g| g.name == *w) {
            return Err(UnknownGroup {
                name: (*w).to_string(),
                known: GROUPS.iter().map(|g| g.name).collect::<Vec<_>>().join(", "),
            });
        }
    }
    Ok(GROUPS
        .iter()
        .filter(|g| wanted.contains(&g.name))
        .copied()
        .collect())
}

/// The `--list` output.
pub fn render_list() -> String {
    GROUPS
        .iter()
        .map(|g| {
            format!(
                "{:<20} {:<8} {}\n",
                g.name,
                match g.needs {
                    Needs::Host => "offline",
                    Needs::Cluster => "cluster",
                },
                g.description
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_keeps_run_order_and_rejects_unknown() {
        let names = |v: Vec<Group>| v.into_iter().map(|g| g.name).collect::<Vec<_>>();
        assert_eq!(names(select(None).unwrap()).len(), GROUPS.len());
        assert_eq!(
            names(select(Some("reset, machines")).unwrap()),
            vec!["machines", "reset"]
        );
        assert_eq!(
            names(select(Some("mounts,upgrade,machines")).unwrap()),
            vec!["machines", "upgrade", "mounts"]
        );
        assert_eq!(
            names(select(Some("container,,")).unwrap()),
            vec!["container"]
        );
        let e = select(Some("machines,upgrades")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("unknown check group \"upgrades\"; groups: machines, upgrade, mounts"),
            "{e}"
        );
        assert_eq!(
            GROUPS[0].name, "machines",
            "machines must run first (it reboots)"
        );
        assert_eq!(
            GROUPS[1].name, "upgrade",
            "upgrade runs right after machines"
        );
    }

    #[test]
    fn list() {
        insta::assert_snapshot!(render_list());
    }
}
