//! `cargo xtask codegen [--check]`: writes the generated files that are committed
//! (`image/agent-container.bu`); with `--check`, fails if any is stale instead.

use std::path::Path;

/// Runs the task.
pub fn run(check: bool) -> anyhow::Result<()> {
    let root = crate::project_root();
    let files = [
        (
            root.join("image/agent-container.bu"),
            aks_flex_node::provisioning::render_agent_container_bu(),
        ),
        (
            root.join("deploy/crds/machina.yaml"),
            aks_flex_node::machina::crd_yaml()?,
        ),
    ];
    let mut stale = Vec::new();
    for (path, content) in files {
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        if current == content {
            continue;
        }
        if check {
            stale.push(rel(&root, &path));
        } else {
            std::fs::write(&path, content)?;
            eprintln!("codegen: wrote {}", rel(&root, &path));
        }
    }
    if !stale.is_empty() {
        anyhow::bail!(
            "stale generated files: {} (run `cargo xtask codegen`)",
            stale.join(", ")
        );
    }
    Ok(())
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}
