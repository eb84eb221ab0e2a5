//! The workspace's layering, enforced on the resolved dependency graph (`cargo tree`), so a
//! dependency that breaks it fails `cargo xtask ci` rather than being found in review:
//!
//! - the test kit (`flex-testkit`) is only ever a dev-dependency;
//! - xtask stays light: none of the agent, the harness, kube, zbus, reqwest, tonic or
//!   containerd's API in its tree, so it compiles before it installs anything;
//! - nothing but `flex-codegen` builds protobuf code (no `prost-build` or
//!   `tonic-prost-build` in any other crate's tree, hence no `protoc` anywhere);
//! - the host crate (`flex-host`) knows nothing of Kubernetes, containerd or the agent;
//! - the API crate (`flex-api`) knows nothing of hosts: no agent, host crate, zbus, containerd,
//!   tonic or reqwest, and tokio's `process` feature is off in its tree;
//! - the controller, the harness, the image builder and the OCI crate (`flex-oci`) do not link
//!   the agent (the harness may use it as a dev-dependency to cross-check with it);
//! - the OCI crate knows nothing of systemd, containerd or the agent (it takes image references
//!   and digests from the API crate);
//! - the Ignition crate (`flex-ignition`) depends on neither the host crate nor the agent: it
//!   renders configs from data (the API crate's bootstrap arguments and image references), so
//!   the agent and the harness both call it (the host crate may be a dev-dependency of its
//!   tests).

use flex_host::runner::{Cmd, Runner};

/// A rule: `package`'s normal and build dependencies must not include any of `forbidden`.
struct Rule {
    package: &'static str,
    forbidden: &'static [&'static str],
    why: &'static str,
}

const RULES: &[Rule] = &[
    Rule {
        package: "xtask",
        forbidden: &[
            "aks-flex-node",
            "flex-harness",
            "flex-image",
            "kube",
            "zbus",
            "reqwest",
            "tonic",
            "containerd-api",
            "clap",
        ],
        why: "xtask must compile in about a minute on a bare machine, before it installs packages",
    },
    Rule {
        package: "flex-api",
        forbidden: &[
            "aks-flex-node",
            "flex-host",
            "zbus",
            "containerd-api",
            "tonic",
            "reqwest",
        ],
        why: "the API crate knows nothing of hosts: data and pure functions only",
    },
    Rule {
        package: "aks-flex-controller",
        forbidden: &["aks-flex-node", "zbus", "containerd-api"],
        why: "the controller reaches the agent's types through the API crate, not the agent",
    },
    Rule {
        package: "flex-harness",
        forbidden: &["aks-flex-node"],
        why: "the harness reaches the runner, the API types and the OCI client through their crates, not the agent",
    },
    Rule {
        package: "flex-image",
        forbidden: &["aks-flex-node"],
        why: "the image builder needs the host and OCI crates, not the agent",
    },
    Rule {
        package: "flex-oci",
        forbidden: &["aks-flex-node", "zbus", "containerd-api", "tonic"],
        why: "the OCI crate pulls and unpacks images; it knows nothing of systemd, containerd or the agent",
    },
    Rule {
        package: "flex-ignition",
        forbidden: &["flex-host", "aks-flex-node"],
        why: "the Ignition crate renders configs from data; the agent and the harness both call it",
    },
    Rule {
        package: "flex-host",
        forbidden: &[
            "aks-flex-node",
            "kube",
            "k8s-openapi",
            "containerd-api",
            "tonic",
        ],
        why: "the host crate knows nothing of Kubernetes, containerd or the agent",
    },
    Rule {
        package: "flex-metrics",
        forbidden: &[
            "aks-flex-node",
            "flex-host",
            "flex-api",
            "kube",
            "k8s-openapi",
            "zbus",
            "containerd-api",
            "tonic",
            "reqwest",
        ],
        why: "the metrics crate serves a registry over HTTP; what is counted is its callers' business",
    },
];

/// Packages whose tree (with every feature of the package itself) must not enable tokio's
/// `process` feature: they never start a process.
const NO_PROCESSES: &[&str] = &["flex-api", "flex-metrics"];

/// Crates whose trees may build protobuf code.
const CODEGEN_ONLY: &[&str] = &["prost-build", "tonic-prost-build", "protox"];

/// The package names in `cargo tree --prefix none` output (deduplicated, sorted).
pub fn names(tree: &str) -> Vec<String> {
    let mut names: Vec<String> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

fn tree(args: &[&str]) -> Cmd {
    Cmd::new("cargo")
        .args([
            "tree",
            "--locked",
            "--prefix",
            "none",
            "--edges",
            "normal,build",
        ])
        .args(args.iter().copied())
        .env("CARGO_TERM_COLOR", "never")
}

/// The workspace crates that depend (normally, or to build) on `package`, itself excluded.
async fn dependents(
    r: &dyn Runner,
    package: &str,
    workspace: &[String],
) -> anyhow::Result<Vec<String>> {
    let out = r
        .output(&tree(&["--workspace", "--invert", package]))
        .await?;
    if !out.success() {
        // Not in any normal or build tree: cargo says the spec matched nothing.
        return Ok(Vec::new());
    }
    Ok(names(&out.stdout)
        .into_iter()
        .filter(|n| n != package && workspace.contains(n))
        .collect())
}

/// The workspace's package names (`cargo tree --depth 0` of every member).
async fn members(r: &dyn Runner) -> anyhow::Result<Vec<String>> {
    let out = r.run(&tree(&["--workspace", "--depth", "0"])).await?;
    Ok(names(&out.stdout))
}

/// Checks every rule; fails naming each broken one.
pub async fn check(r: &dyn Runner) -> anyhow::Result<()> {
    let workspace = members(r).await?;
    let mut broken = Vec::new();
    for rule in RULES {
        let out = r.run(&tree(&["--package", rule.package])).await?;
        let deps = names(&out.stdout);
        let bad: Vec<&str> = rule
            .forbidden
            .iter()
            .copied()
            .filter(|f| deps.iter().any(|d| d == f))
            .collect();
        if !bad.is_empty() {
            broken.push(format!(
                "{} depends on {} ({})",
                rule.package,
                bad.join(", "),
                rule.why
            ));
        }
    }
    for package in NO_PROCESSES {
        let out = r
            .run(&tree(&[
                "--package",
                package,
                "--all-features",
                "--edges",
                "features",
            ]))
            .await?;
        if spawns_processes(&out.stdout) {
            broken.push(format!(
                "{package} enables tokio's process feature (it must never start a process)"
            ));
        }
    }
    let testkit_users = dependents(r, "flex-testkit", &workspace).await?;
    if !testkit_users.is_empty() {
        broken.push(format!(
            "flex-testkit is a normal dependency of {} (it is only ever a dev-dependency)",
            testkit_users.join(", ")
        ));
    }
    for generator in CODEGEN_ONLY {
        let users: Vec<String> = dependents(r, generator, &workspace)
            .await?
            .into_iter()
            .filter(|n| n != "flex-codegen")
            .collect();
        if !users.is_empty() {
            broken.push(format!(
                "{} builds with {generator} (only flex-codegen generates protobuf code; commit it)",
                users.join(", ")
            ));
        }
    }
    if broken.is_empty() {
        return Ok(());
    }
    anyhow::bail!("layering broken:\n  {}", broken.join("\n  "))
}

/// Whether `cargo tree --edges features` output shows tokio's `process` feature enabled.
pub fn spawns_processes(tree: &str) -> bool {
    tree.lines()
        .any(|l| l.trim_start().starts_with("tokio feature \"process\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_reads_cargo_tree_lines() {
        let out = "xtask v0.1.0 (/w/xtask)\nanyhow v1.0.100\nflex-host v0.1.0 (/w/host)\nanyhow v1.0.100\n\n";
        assert_eq!(names(out), ["anyhow", "flex-host", "xtask"]);
    }

    #[test]
    fn spawns_processes_reads_tokio_features() {
        let with = "flex-api v0.1.0\ntokio feature \"default\"\ntokio feature \"process\"\n";
        let without = "flex-api v0.1.0\ntokio feature \"time\"\n";
        assert!(spawns_processes(with));
        assert!(!spawns_processes(without));
    }
}
