//! What the upgrade checks read from the host, parsed: the YAML lines of
//! `aks-flex-node operation run` and `operation status`, the upgrade record's JSON
//! (`/etc/aks-flex-node/upgrade/pending.json`), `ctr containers info`, `ctr images ls -q`, and
//! the one-shot [`Probe`] the checks poll with.

use std::collections::BTreeMap;

/// The upgrade record on the host (read over SSH when the agent's container cannot answer).
pub const PENDING_JSON: &str = "/etc/aks-flex-node/upgrade/pending.json";

/// `key: value` lines (YAML scalars: plain, or double-quoted JSON strings as the agent writes
/// them); other lines (logs, blank lines) are ignored. A later key wins.
pub fn yaml_lines(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            continue;
        }
        let v = v.trim();
        let v = if v.starts_with('"') {
            serde_json::from_str::<String>(v).unwrap_or_else(|_| v.trim_matches('"').to_string())
        } else if let Some(inner) = v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
            inner.replace("''", "'")
        } else {
            v.to_string()
        };
        out.insert(k.to_string(), v);
    }
    out
}

/// What `operation run` printed: the result's phase, reason and message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpResult {
    /// `InProgress`, `Complete` or `Failed`.
    pub phase: String,
    /// `RestartScheduled`, `InvalidParameters`, …
    pub reason: String,
    /// The message.
    pub message: String,
}

impl std::fmt::Display for OpResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}: {}", self.phase, self.reason, self.message)
    }
}

/// Parses `operation run`'s output; `None` without a `phase` line.
pub fn parse_op_result(stdout: &str) -> Option<OpResult> {
    let m = yaml_lines(stdout);
    Some(OpResult {
        phase: m.get("phase")?.clone(),
        reason: m.get("reason").cloned().unwrap_or_default(),
        message: m.get("message").cloned().unwrap_or_default(),
    })
}

/// The last AgentUpgrade's record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpgradeRecord {
    /// `staged`, `switched` or `finished`.
    pub stage: String,
    /// `InProgress` until finished, then `Complete` or `Failed`.
    pub phase: String,
    /// The reason (`Succeeded`, `DaemonFailed`, …); empty while in progress.
    pub reason: String,
    /// The message.
    pub message: String,
    /// The image upgraded to.
    pub candidate: String,
    /// The image it replaced.
    pub previous: String,
    /// When the upgrade started (`startedAt`, RFC 3339), if recorded: tells two upgrades to
    /// the same image apart.
    pub started_at: String,
}

impl UpgradeRecord {
    /// Whether the upgrade has finished (the phase is final).
    pub fn finished(&self) -> bool {
        self.stage == "finished"
    }

    /// The image the agent should run, as the record says: the candidate after `Complete`, the
    /// previous image after `Failed`; `None` while unfinished.
    pub fn expected_image(&self) -> Option<&str> {
        match (self.finished(), self.phase.as_str()) {
            (true, "Complete") => Some(&self.candidate),
            (true, "Failed") => Some(&self.previous),
            _ => None,
        }
    }
}

impl std::fmt::Display for UpgradeRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stage {}, {}/{} ({}), candidate {}, previous {}",
            self.stage,
            self.phase,
            self.reason,
            self.message,
            short(&self.candidate),
            short(&self.previous)
        )
    }
}

/// Parses `operation status`'s output.
pub fn parse_status(stdout: &str) -> anyhow::Result<UpgradeRecord> {
    let m = yaml_lines(stdout);
    let get = |k: &str| m.get(k).cloned().unwrap_or_default();
    let r = UpgradeRecord {
        stage: get("stage"),
        phase: get("phase"),
        reason: get("reason"),
        message: get("message"),
        candidate: get("candidate"),
        previous: get("previous"),
        started_at: get("startedAt"),
    };
    if r.stage.is_empty() || r.candidate.is_empty() {
        anyhow::bail!("operation status printed no stage or candidate: {stdout:?}");
    }
    Ok(r)
}

/// The serialized name of a wire enum (`switched`, `Complete`).
fn wire_name<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Parses the record's JSON with the agent's own type ([`flex_api::upgrade::UpgradeRecord`]:
/// `stage`, `result {phase, reason, message}` once finished, `candidate`, `previous`), so a
/// change of the record's format fails here. Without a result the phase is `InProgress`.
pub fn parse_pending_json(text: &str) -> anyhow::Result<UpgradeRecord> {
    // The agent's record envelope (its payload) or, from an older agent, the plain JSON.
    let v: flex_api::upgrade::UpgradeRecord =
        crate::guest_json::parse_record(PENDING_JSON, text)
            .map_err(|e| anyhow::anyhow!("not the upgrade record: {e}: {text:?}"))?;
    let r = UpgradeRecord {
        stage: wire_name(&v.stage),
        phase: v
            .result
            .as_ref()
            .map_or_else(|| "InProgress".to_string(), |r| wire_name(&r.phase)),
        reason: v
            .result
            .as_ref()
            .map(|r| r.reason.clone())
            .unwrap_or_default(),
        message: v.result.map(|r| r.message).unwrap_or_default(),
        candidate: v.candidate,
        previous: v.previous,
        started_at: v.started_at,
    };
    if r.stage.is_empty() || r.candidate.is_empty() {
        anyhow::bail!("{PENDING_JSON} has no stage or candidate: {text:?}");
    }
    Ok(r)
}

/// What `ctr containers info` prints, as far as the checks read it.
#[derive(serde::Deserialize)]
struct ContainerInfo {
    #[serde(rename = "Image", default)]
    image: String,
}

/// The image of a container from `ctr containers info` (JSON, field `Image`).
pub fn parse_container_image(info: &str) -> anyhow::Result<String> {
    let v: ContainerInfo = serde_json::from_str(info)
        .map_err(|e| anyhow::anyhow!("ctr containers info is not a container ({e})"))?;
    if v.image.is_empty() {
        anyhow::bail!("ctr containers info has no Image");
    }
    Ok(v.image)
}

/// Whether `ctr images ls -q` lists an image with the digest of `reference` (or the reference
/// itself).
pub fn images_list_has(list: &str, reference: &str) -> bool {
    let digest = reference.split_once('@').map(|(_, d)| d);
    list.lines().map(str::trim).any(|l| {
        l == reference || digest.is_some_and(|d| l.ends_with(&format!("@{d}")) || l.contains(d))
    })
}

/// `…@sha256:0123456789ab`: a reference shortened for messages.
pub fn short(reference: &str) -> String {
    match reference.split_once("@sha256:") {
        Some((_, hex)) if hex.len() > 12 => format!("…@sha256:{}", &hex[..12]),
        _ => reference.to_string(),
    }
}

/// The shell script behind [`Probe`]: the agent's unit and task, its container's info, the
/// record as `operation status` prints it (when the task runs) and as the host's file holds it.
pub fn probe_script() -> String {
    probe_script_asking(true)
}

/// [`probe_script`] without `operation status`, whose `ctr tasks exec` is most of a probe's
/// time (about half a second of its one under TCG): the record is the host's file. For the
/// waits that look many times; what `operation status` says is checked once they end.
pub fn quick_probe_script() -> String {
    probe_script_asking(false)
}

fn probe_script_asking(status: bool) -> String {
    let status = if status {
        "if printf '%s\\n' \"$tasks\" | grep -q '^aks-flex-agent .*RUNNING'; then \
           timeout 30 ctr -n aks-flex tasks exec --exec-id probe-$$-$(date +%s%N) aks-flex-agent aks-flex-node operation status 2>/dev/null; \
         fi; "
    } else {
        ""
    };
    format!(
        "echo \"active=$(systemctl is-active aks-flex-node-agent.service)\"; \
         echo \"invocation=$(systemctl show -p InvocationID --value aks-flex-node-agent.service)\"; \
         tasks=$(ctr -n aks-flex tasks ls 2>/dev/null); \
         printf '%s\\n' \"$tasks\" | awk '$1==\"aks-flex-agent\"{{print \"pid=\" $2; print \"task=\" $3}}'; \
         echo '---info'; ctr -n aks-flex containers info aks-flex-agent 2>/dev/null; \
         echo '---status'; {status}\
         echo '---pending'; cat {PENDING_JSON} 2>/dev/null; true"
    )
}

/// [`probe_script`] in host mode (`up --mode host`), where the agent runs on the host: its
/// unit's main process stands for the task (`task=RUNNING` while there is one) and the slot its
/// binary runs from (`blue`, `green`) for the image, as the upgrade record names slots; the
/// record as the host's `aks-flex-node operation status` prints it, and the host's file.
pub fn host_probe_script() -> String {
    format!(
        "echo \"active=$(systemctl is-active aks-flex-node-agent.service)\"; \
         echo \"invocation=$(systemctl show -p InvocationID --value aks-flex-node-agent.service)\"; \
         pid=$(systemctl show -p MainPID --value aks-flex-node-agent.service); \
         if [ -n \"$pid\" ] && [ \"$pid\" != 0 ]; then \
           echo \"pid=$pid\"; echo task=RUNNING; \
           exe=$(readlink /proc/$pid/exe); slot=${{exe#{lib}/}}; echo \"image=${{slot%%/*}}\"; \
         fi; \
         echo '---status'; timeout 30 {agent} operation status 2>/dev/null; \
         echo '---pending'; cat {PENDING_JSON} 2>/dev/null; true",
        lib = crate::hostmode::LIB_DIR,
        agent = crate::hostmode::AGENT,
    )
}

/// The probe script for `mode`.
pub fn probe_script_for(mode: crate::hostmode::AgentMode) -> String {
    match mode {
        crate::hostmode::AgentMode::Image => probe_script(),
        crate::hostmode::AgentMode::Host => host_probe_script(),
    }
}

/// The quick probe for `mode`: [`quick_probe_script`] in image mode; in host mode the probe
/// as it is (its `operation status` is a process on the host, not an exec in a container).
pub fn quick_probe_script_for(mode: crate::hostmode::AgentMode) -> String {
    match mode {
        crate::hostmode::AgentMode::Image => quick_probe_script(),
        crate::hostmode::AgentMode::Host => host_probe_script(),
    }
}

/// One look at the agent and its upgrade record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Probe {
    /// `systemctl is-active` of the agent's unit.
    pub active: String,
    /// The unit's InvocationID (a new one each start).
    pub invocation: String,
    /// The agent's task PID, if it has one.
    pub pid: String,
    /// The agent's task status (`RUNNING`, …), if it has one.
    pub task: String,
    /// The agent's container's image, if the container exists.
    pub image: Option<String>,
    /// The record: from `operation status`, else from the host's file; `None` if neither has
    /// one.
    pub record: Option<UpgradeRecord>,
}

impl Probe {
    /// Whether the agent's unit is active and its container's task runs.
    pub fn running(&self) -> bool {
        self.active == "active" && self.task == "RUNNING"
    }

    /// Whether the agent runs `image`.
    pub fn runs(&self, image: &str) -> bool {
        self.running() && self.image.as_deref() == Some(image)
    }
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unit {}, task {}, image {}, record: {}",
            if self.active.is_empty() {
                "?"
            } else {
                &self.active
            },
            if self.task.is_empty() {
                "none"
            } else {
                &self.task
            },
            self.image.as_deref().map_or("none".into(), short),
            self.record
                .as_ref()
                .map_or("none".to_string(), |r| r.to_string())
        )
    }
}

/// Parses [`probe_script`]'s output.
pub fn parse_probe(text: &str) -> Probe {
    let mut sections: BTreeMap<&str, String> = BTreeMap::new();
    let mut current = "head";
    for line in text.lines() {
        match line.trim() {
            "---info" => current = "info",
            "---status" => current = "status",
            "---pending" => current = "pending",
            _ => {
                let s = sections.entry(current).or_default();
                s.push_str(line);
                s.push('\n');
            }
        }
    }
    let section = |k: &str| sections.get(k).map(String::as_str).unwrap_or_default();
    let mut p = Probe::default();
    let mut slot = None;
    for line in section("head").lines() {
        match line.split_once('=') {
            Some(("active", v)) => p.active = v.trim().to_string(),
            Some(("invocation", v)) => p.invocation = v.trim().to_string(),
            Some(("pid", v)) => p.pid = v.trim().to_string(),
            Some(("task", v)) => p.task = v.trim().to_string(),
            Some(("image", v)) if !v.trim().is_empty() => slot = Some(v.trim().to_string()),
            _ => {}
        }
    }
    p.image = parse_container_image(section("info")).ok().or(slot);
    p.record = parse_status(section("status"))
        .or_else(|_| parse_pending_json(section("pending")))
        .ok();
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "10.0.2.2:5000/aks-flex/agent@sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const PREV: &str = "10.0.2.2:5000/aks-flex/agent@sha256:2222222222222222222222222222222222222222222222222222222222222222";

    #[test]
    fn operation_run_output() {
        let out = "phase: InProgress\nreason: RestartScheduled\nmessage: \"switched to 10.0.2.2:5000/a@sha256:11; restarting in 1s\"\n";
        assert_eq!(
            parse_op_result(out),
            Some(OpResult {
                phase: "InProgress".into(),
                reason: "RestartScheduled".into(),
                message: "switched to 10.0.2.2:5000/a@sha256:11; restarting in 1s".into(),
            })
        );
        let failed = "2024-01-01T00:00:00Z INFO something: x\nphase: Failed\nreason: InvalidParameters\nmessage: image must be pinned by digest\n";
        let r = parse_op_result(failed).unwrap();
        assert_eq!(
            (r.phase.as_str(), r.reason.as_str()),
            ("Failed", "InvalidParameters")
        );
        assert_eq!(r.message, "image must be pinned by digest");
        assert_eq!(parse_op_result("Command execution failed: boom\n"), None);
        assert_eq!(
            yaml_lines("message: 'it''s'\n")["message"],
            "it's",
            "single-quoted YAML"
        );
    }

    #[test]
    fn operation_status_output() {
        let out = format!(
            "stage: finished\nphase: Failed\nreason: DaemonFailed\nmessage: \"the candidate's daemon failed: exit 1\"\ncandidate: \"{GOOD}\"\nprevious: {PREV}\nstartedAt: \"2026-01-02T03:04:05Z\"\n"
        );
        let r = parse_status(&out).unwrap();
        assert_eq!(
            r,
            UpgradeRecord {
                stage: "finished".into(),
                phase: "Failed".into(),
                reason: "DaemonFailed".into(),
                message: "the candidate's daemon failed: exit 1".into(),
                candidate: GOOD.into(),
                previous: PREV.into(),
                started_at: "2026-01-02T03:04:05Z".into(),
            }
        );
        assert!(r.finished());
        assert_eq!(r.expected_image(), Some(PREV));
        let complete = UpgradeRecord {
            phase: "Complete".into(),
            ..r.clone()
        };
        assert_eq!(complete.expected_image(), Some(GOOD));
        let switched = UpgradeRecord {
            stage: "switched".into(),
            phase: "InProgress".into(),
            ..r
        };
        assert!(!switched.finished());
        assert_eq!(switched.expected_image(), None);
        assert!(parse_status("").is_err());
        assert!(parse_status("no upgrade recorded\n").is_err());
    }

    #[test]
    fn pending_json() {
        // As the agent writes it.
        let record = flex_api::upgrade::UpgradeRecord {
            version: 1,
            operation: None,
            mode: flex_api::upgrade::Mode::Image,
            previous: PREV.into(),
            candidate: GOOD.into(),
            candidate_version: None,
            stage: flex_api::upgrade::Stage::Switched,
            started_at: "2026-01-02T03:04:05Z".into(),
            recovery_restarts: 0,
            remove_candidate_on_rollback: false,
            result: None,
        };
        let unfinished = serde_json::to_string(&record).unwrap();
        let r = parse_pending_json(&unfinished).unwrap();
        assert_eq!(r.stage, "switched");
        assert_eq!(r.phase, "InProgress");
        assert_eq!(r.reason, "");
        let finished = format!(
            r#"{{"version":1,"mode":"image","stage":"finished","result":{{"phase":"Complete","reason":"Succeeded","message":"running"}},"candidate":"{GOOD}","previous":"{PREV}","startedAt":"2026-01-02T03:04:05Z","extra":1}}"#
        );
        let r = parse_pending_json(&finished).unwrap();
        assert_eq!(
            (r.phase.as_str(), r.reason.as_str(), r.message.as_str()),
            ("Complete", "Succeeded", "running")
        );
        assert_eq!(r.expected_image(), Some(GOOD));
        assert_eq!(r.started_at, "2026-01-02T03:04:05Z");
        assert!(parse_pending_json("").is_err());
        assert!(parse_pending_json("{}").is_err());
        // The old format (no version, mode or start time) is not the record.
        assert!(
            parse_pending_json(&format!(
                r#"{{"stage":"switched","candidate":"{GOOD}","previous":"{PREV}"}}"#
            ))
            .is_err()
        );
    }

    #[test]
    fn container_info_and_images() {
        let info = format!(
            r#"{{
    "ID": "aks-flex-agent",
    "Labels": {{"io.containerd.image.config.stop-signal": "SIGTERM"}},
    "Image": "{GOOD}",
    "Runtime": {{"Name": "io.containerd.runc.v2"}},
    "Spec": {{"ociVersion": "1.1.0"}}
}}"#
        );
        assert_eq!(parse_container_image(&info).unwrap(), GOOD);
        assert!(parse_container_image("{}").is_err());
        assert!(parse_container_image("ctr: container \"x\" not found").is_err());

        let list = format!("{PREV}\n10.0.2.2:5000/aks-flex/agent:dev\n");
        assert!(images_list_has(&list, PREV));
        assert!(!images_list_has(&list, GOOD));
        assert!(images_list_has(
            &format!("other/name@{}\n", GOOD.split_once('@').unwrap().1),
            GOOD
        ));
        assert_eq!(short(GOOD), "…@sha256:111111111111");
        assert_eq!(short("a:tag"), "a:tag");
    }

    #[test]
    fn probe_output() {
        let text = format!(
            "active=active\ninvocation=abc123\npid=4242\ntask=RUNNING\n---info\n{{\"ID\":\"aks-flex-agent\",\"Image\":\"{GOOD}\"}}\n---status\nstage: switched\nphase: InProgress\nreason: \"\"\nmessage: restarting\ncandidate: {GOOD}\nprevious: {PREV}\n---pending\n{{\"format\":\"aks-flex-node.record/v1\",\"sha256\":\"00\",\"payload\":{{\"version\":1,\"mode\":\"image\",\"stage\":\"staged\",\"candidate\":\"{GOOD}\",\"previous\":\"{PREV}\",\"startedAt\":\"t\"}}}}\n"
        );
        let p = parse_probe(&text);
        assert!(p.running());
        assert!(p.runs(GOOD));
        assert!(!p.runs(PREV));
        assert_eq!(p.invocation, "abc123");
        assert_eq!(p.pid, "4242");
        let r = p.record.clone().unwrap();
        assert_eq!(r.stage, "switched", "operation status wins over the file");

        // The container restarting: no task, no status; the file stands in.
        let text = format!(
            "active=activating\ninvocation=def\n---info\n---status\n---pending\n{{\"version\":1,\"mode\":\"image\",\"stage\":\"switched\",\"candidate\":\"{GOOD}\",\"previous\":\"{PREV}\",\"startedAt\":\"t\"}}\n"
        );
        let p = parse_probe(&text);
        assert!(!p.running());
        assert_eq!(p.image, None);
        assert_eq!(p.record.as_ref().unwrap().stage, "switched");
        assert!(p.to_string().contains("task none"), "{p}");

        let p = parse_probe("active=inactive\n---info\n---status\n---pending\n");
        assert_eq!(p.record, None);
        assert!(probe_script().contains(PENDING_JSON));
    }

    /// Host mode: the slot the unit's main process runs from stands for the image, as the
    /// binary upgrade record names slots (`candidate: green`, `previous: blue`).
    #[test]
    fn host_probe_output() {
        let text = "active=active\ninvocation=abc\npid=77\ntask=RUNNING\nimage=green\n---status\nstage: finished\nphase: Complete\nreason: Succeeded\nmessage: ok\ncandidate: green\nprevious: blue\n---pending\n";
        let p = parse_probe(text);
        assert!(p.runs("green") && !p.runs("blue"), "{p}");
        assert_eq!(p.record.unwrap().expected_image(), Some("green"));
        // The candidate died: no main process, no slot.
        let p = parse_probe("active=activating\ninvocation=d\n---status\n---pending\n");
        assert!(!p.running());
        assert_eq!(p.image, None);
        let script = probe_script_for(crate::hostmode::AgentMode::Host);
        assert!(script.contains("/usr/local/bin/aks-flex-node operation status"));
        assert!(!script.contains("ctr "), "{script}");
        assert_eq!(
            probe_script_for(crate::hostmode::AgentMode::Image),
            probe_script()
        );
    }

    /// Real: `sh` running the image-mode probes, with `systemctl` and `ctr` faked on `PATH` by
    /// scripts that log their arguments. The full probe asks `operation status` (once, in the
    /// running task); the quick one never execs in the container, and lists tasks once too.
    #[tokio::test]
    async fn image_probes_in_sh_ask_operation_status_or_not() {
        use flex_host::runner::{Cmd, ProcessRunner, Runner};
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let log = dir.path().join("calls");
        let fake = |name: &str, body: &str| {
            let p = bin.join(name);
            std::fs::write(
                &p,
                format!(
                    "#!/bin/sh\necho \"{name} $*\" >> '{}'\n{body}\n",
                    log.display()
                ),
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        fake(
            "systemctl",
            "case \"$1\" in is-active) echo active;; show) echo inv-1;; esac",
        );
        fake(
            "ctr",
            &format!(
                "case \"$3 $4\" in \
                 'tasks ls') printf 'TASK PID STATUS\\naks-flex-agent 4242 RUNNING\\n';; \
                 'containers info') echo '{{\"ID\":\"aks-flex-agent\",\"Image\":\"{GOOD}\"}}';; \
                 'tasks exec') printf 'stage: switched\\nphase: InProgress\\ncandidate: {GOOD}\\nprevious: {PREV}\\n';; \
                 esac"
            ),
        );
        let r = ProcessRunner::new();
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
        for (script, asks) in [(probe_script(), true), (quick_probe_script(), false)] {
            let _ = std::fs::remove_file(&log);
            let out = r
                .run(&Cmd::new("sh").arg("-c").arg(&script).env("PATH", &path))
                .await
                .unwrap();
            let p = parse_probe(&out.stdout);
            assert!(p.runs(GOOD), "{p}: {}", out.stdout);
            assert_eq!((p.pid.as_str(), p.invocation.as_str()), ("4242", "inv-1"));
            let calls = std::fs::read_to_string(&log).unwrap();
            let count = |what: &str| calls.lines().filter(|l| l.contains(what)).count();
            assert_eq!(count("tasks ls"), 1, "{calls}");
            assert_eq!(count("tasks exec"), usize::from(asks), "{calls}");
            // The record: `operation status`'s when it was asked; else the host's file, which
            // a machine without the agent installed does not have.
            if asks || !std::path::Path::new(PENDING_JSON).exists() {
                assert_eq!(
                    p.record.map(|r| r.stage),
                    asks.then(|| "switched".to_string()),
                    "{}",
                    out.stdout
                );
            }
        }
    }

    /// Real: `sh` running the host probe's slot extraction on the paths `/proc/<pid>/exe`
    /// shows (a replaced binary shows ` (deleted)`).
    #[tokio::test]
    async fn host_probe_slot_extraction_in_sh() {
        use flex_host::runner::{Cmd, ProcessRunner, Runner};
        let r = ProcessRunner::new();
        for (exe, want) in [
            (
                "/usr/local/lib/aks-flex-node/green/aks-flex-node",
                "image=green",
            ),
            (
                "/usr/local/lib/aks-flex-node/blue/aks-flex-node (deleted)",
                "image=blue",
            ),
            // A script's process shows its interpreter: no slot.
            ("/usr/bin/dash", "image="),
        ] {
            let out = r
                .run(&Cmd::new("sh").arg("-c").arg(format!(
                    "exe='{exe}'; slot=${{exe#{}/}}; echo \"image=${{slot%%/*}}\"",
                    crate::hostmode::LIB_DIR
                )))
                .await
                .unwrap();
            assert_eq!(out.stdout.trim(), want);
        }
    }
}
