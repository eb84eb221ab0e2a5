//! `aks-flex-node status --output json` as the checks read it: the guest commands that run it
//! (on a host, and in the agent's container through `ctr tasks exec`) and a parser into the
//! agent's own report type ([`flex_api::status::Report`], schema
//! [`flex_api::status::SCHEMA`]; see `docs/status.md`). [`json_command`] ends in `; true`: an
//! unhealthy node exits 1, and those checks judge the report; [`command_with`] keeps the exit
//! code for the checks that judge it too.
//!
//! The parser is tested against the agent's own JSON snapshots, so a schema change that breaks
//! the harness fails here first.

pub use flex_api::status::{KubeletView, Problem, Report, SCHEMA, codes};

use crate::hostmode::AgentMode;

/// `aks-flex-node status` with `args` where the agent of `mode` runs (in its container, or
/// the host's current slot binary, [`crate::hostmode::AGENT`]), its exit code kept: for the
/// checks that judge the exit code too.
pub fn command_with(mode: AgentMode, args: &str) -> String {
    match mode {
        AgentMode::Image => format!(
            "timeout 30 ctr -n aks-flex tasks exec --exec-id status-$$-$(date +%s%N) aks-flex-agent aks-flex-node status {args}"
        ),
        AgentMode::Host => format!("{} status {args}", crate::hostmode::AGENT),
    }
}

/// The JSON report's command for `mode`, tolerant of an unhealthy exit (stderr dropped).
pub fn json_command(mode: AgentMode) -> String {
    format!("{} 2>/dev/null; true", command_with(mode, "--output json"))
}

/// Parses `status --output json`'s stdout: an error when it is empty, not the report, or of
/// another schema.
pub fn parse(stdout: &str) -> anyhow::Result<Report> {
    let text = stdout.trim();
    if text.is_empty() {
        anyhow::bail!("aks-flex-node status printed nothing");
    }
    let r: Report = serde_json::from_str(text)
        .map_err(|e| anyhow::anyhow!("aks-flex-node status output is not its report: {e}"))?;
    if r.schema != SCHEMA {
        anyhow::bail!(
            "aks-flex-node status schema {:?}, the harness reads {SCHEMA:?}",
            r.schema
        );
    }
    Ok(r)
}

/// The report's active machine (`kube1`/`kube2`), or why there is none.
pub fn active_machine(r: &Report) -> anyhow::Result<String> {
    match r.facts.state.value().map(|s| s.active_machine.as_str()) {
        Some(m @ ("kube1" | "kube2")) => Ok(m.to_string()),
        _ => anyhow::bail!("no active machine: {}", summary(r)),
    }
}

/// `healthy`, or the problems' codes and messages on one line (for check failures).
pub fn summary(r: &Report) -> String {
    if r.healthy {
        return "healthy".into();
    }
    r.problems
        .iter()
        .map(|p| format!("{}: {}", p.code, p.message))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Whether the report has a problem with `code` (one of [`codes`]).
pub fn has(r: &Report, code: &str) -> bool {
    r.problems.iter().any(|p| p.code == code)
}

/// The agent's own `status --output json` snapshots (its insta files), for the harness's tests.
#[cfg(test)]
pub(crate) mod agent_snapshots {
    /// The body of an insta snapshot file (after its `---` header).
    fn body(file: &'static str) -> &'static str {
        file.splitn(3, "---\n").nth(2).unwrap()
    }

    /// A healthy host's report.
    pub fn healthy() -> &'static str {
        body(include_str!(
            "../../api/src/status/snapshots/flex_api__status__tests__json_healthy.snap"
        ))
    }

    /// A never-bootstrapped host's report.
    pub fn never_bootstrapped() -> &'static str {
        body(include_str!(
            "../../api/src/status/snapshots/flex_api__status__tests__json_never_bootstrapped.snap"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::agent_snapshots::{healthy, never_bootstrapped};
    use super::*;

    #[test]
    fn parses_the_agents_healthy_report() {
        let r = parse(healthy()).unwrap();
        assert!(r.healthy);
        assert_eq!(summary(&r), "healthy");
        assert_eq!(active_machine(&r).unwrap(), "kube1");
        assert_eq!(
            r.facts.state.value().unwrap().applied_settings_version,
            "etag-7"
        );
        assert_eq!(r.facts.agent.current.as_deref(), Some("blue"));
    }

    #[test]
    fn parses_the_agents_never_bootstrapped_report() {
        let r = parse(never_bootstrapped()).unwrap();
        assert!(!r.healthy);
        assert!(has(&r, codes::NOT_BOOTSTRAPPED));
        let e = active_machine(&r).unwrap_err().to_string();
        assert!(e.contains("NotBootstrapped"), "{e}");
    }

    #[test]
    fn rejects_empty_garbage_and_other_schemas() {
        assert!(parse("").is_err());
        assert!(parse("Command execution failed: x").is_err());
        let other = healthy().replace(SCHEMA, "aks-flex-node.status/v9");
        let e = parse(&other).unwrap_err().to_string();
        assert!(e.contains("v9"), "{e}");
    }

    #[test]
    fn commands_tolerate_an_unhealthy_exit() {
        assert!(
            json_command(AgentMode::Image)
                .contains("aks-flex-agent aks-flex-node status --output json")
        );
        for mode in [AgentMode::Image, AgentMode::Host] {
            assert!(json_command(mode).ends_with(" status --output json 2>/dev/null; true"));
            assert!(!command_with(mode, "--output text").contains("true"));
        }
        assert!(command_with(AgentMode::Host, "").starts_with(crate::hostmode::AGENT));
        assert!(command_with(AgentMode::Image, "").contains("tasks exec"));
    }
}
