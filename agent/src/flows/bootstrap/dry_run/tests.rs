//! The dry-run plan, pure: the files a bootstrap writes from the render tests' inputs (real
//! rendering, fake host facts), secrets redacted in what is shown, errors naming the input.

use super::*;
use crate::flows::bootstrap::inputs as names;
use crate::flows::bootstrap::render::render;
use crate::flows::bootstrap::render::tests::{full, minimal};

const TOKEN: &str = "abcdef.0123456789abcdef";

fn facts() -> HostFacts {
    HostFacts {
        hostname: "Flex-Node-1".into(),
        arch: "amd64".into(),
        present_devices: vec![],
        oci_image_env: None,
    }
}

#[test]
fn plan_lists_the_config_units_and_first_machines_files() {
    let plan = plan(&full(), None, &facts(), false, b"nameserver 10.0.0.1\n").unwrap();
    let paths: Vec<String> = plan
        .files
        .iter()
        .map(|f| f.path.display().to_string())
        .collect();
    assert_eq!(paths[0], DEFAULT_CONFIG_PATH);
    assert_eq!(plan.files[0].mode, 0o600);
    assert!(paths.contains(&AGENT_UNIT_PATH.to_string()), "{paths:?}");
    assert!(paths.contains(&RECOVERY_UNIT_PATH.to_string()), "{paths:?}");
    assert!(
        paths
            .iter()
            .any(|p| p.starts_with("/var/lib/machines/kube1/")),
        "{paths:?}"
    );
    assert!(
        paths
            .iter()
            .any(|p| p == "/etc/systemd/nspawn/kube1.nspawn"),
        "{paths:?}"
    );
    // The config written is the one rendering gives, byte for byte.
    let rendered = render(&full(), &|| Ok("Flex-Node-1".into())).unwrap();
    assert_eq!(plan.files[0].content, rendered.bytes());
}

#[test]
fn show_redacts_the_bootstrap_token_everywhere() {
    let plan = plan(&minimal(), None, &facts(), false, b"").unwrap();
    assert!(
        plan.files
            .iter()
            .any(|f| String::from_utf8_lossy(&f.content).contains(TOKEN)),
        "the token is in the files written"
    );
    let shown = show(&plan);
    assert!(!shown.contains(TOKEN), "{shown}");
    assert!(!shown.contains("0123456789abcdef"), "{shown}");
    assert!(shown.contains(REDACTED));
    assert!(shown.contains(&format!("==> {DEFAULT_CONFIG_PATH} (0600) <==")));
}

#[test]
fn a_bad_input_fails_naming_it() {
    let mut inputs = minimal();
    assert!(inputs.set(names::NODE_IP, "10.0.0.300"));
    let e = plan(&inputs, None, &facts(), false, b"").unwrap_err();
    let m = format!("{e:#}");
    assert!(m.contains("AKS_FLEX_NODE_NODE_IP"), "{m}");
    assert!(!m.contains(TOKEN), "{m}");
}

#[test]
fn a_config_file_is_validated_and_kept_byte_for_byte() {
    let rendered = render(&minimal(), &|| Ok("n".into())).unwrap();
    let mut inputs = Inputs::default();
    assert!(inputs.set(names::CONFIG, "/etc/given.json"));
    let plan = plan(&inputs, Some(rendered.bytes()), &facts(), true, b"").unwrap();
    assert_eq!(plan.files[0].content, rendered.bytes());
    assert!(plan.source.contains("/etc/given.json"));
    let e = plan_err(&inputs, b"{\"agent\": 5}");
    assert!(e.contains("AKS_FLEX_NODE_CONFIG: /etc/given.json"), "{e}");
}

fn plan_err(inputs: &Inputs, bytes: &[u8]) -> String {
    format!(
        "{:#}",
        plan(inputs, Some(bytes), &facts(), false, b"").unwrap_err()
    )
}

#[test]
fn write_under_puts_files_below_the_directory_only() {
    let d = tempfile::tempdir().unwrap();
    let plan = plan(&minimal(), None, &facts(), false, b"").unwrap();
    let written = write_under(&plan, d.path()).unwrap();
    assert_eq!(written.len(), plan.files.len());
    assert!(
        written.iter().all(|p| p.starts_with(d.path())),
        "{written:?}"
    );
    let cfg = d.path().join(DEFAULT_CONFIG_PATH.trim_start_matches('/'));
    assert_eq!(std::fs::read(&cfg).unwrap(), plan.files[0].content);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&cfg).unwrap().permissions().mode() & 0o7777,
        0o600
    );
}

/// A config given through `AKS_FLEX_NODE_CONFIG` may spell a secret with any JSON escape, and
/// a client secret may hold `"` or `\` (escaped in the JSON and YAML files rendered from it):
/// neither reaches the output. Pure: real rendering, fake host facts.
#[test]
fn show_redacts_secrets_however_the_files_escape_them() {
    let fixture = include_str!("../../../../tests/fixtures/config-token.json");
    // The token with every `a` as `\u0061` and its `.` as `\u002e`.
    let escaped_token = fixture.replace(
        TOKEN,
        &TOKEN.replace('a', "\\u0061").replace('.', "\\u002e"),
    );
    const SECRET: &str = "s3cr\"t\\v/lue";
    let sp = fixture.replace(
        &format!("\"bootstrapToken\": {{ \"token\": \"{TOKEN}\" }}"),
        // `/` escaped as `\/`, `l` as `\u006c`.
        "\"servicePrincipal\": { \"tenantId\": \"t\", \"clientId\": \"c\", \"clientSecret\": \"s3cr\\\"t\\\\v\\/\\u006cue\" }",
    );
    let mut inputs = Inputs::default();
    assert!(inputs.set(names::CONFIG, "/etc/given.json"));
    for (name, file, secret) in [
        ("escaped token", escaped_token, TOKEN),
        ("client secret", sp, SECRET),
    ] {
        let plan = plan(&inputs, Some(file.as_bytes()), &facts(), false, b"").unwrap();
        assert_eq!(plan.secrets(), vec![secret], "{name}");
        let shown = show(&plan);
        let json = serde_json::to_string(secret).unwrap();
        for form in [
            secret,
            &json[1..json.len() - 1],
            "0123456789",
            "3cr",
            "lue\"",
        ] {
            assert!(!shown.contains(form), "{name}: {form} in\n{shown}");
        }
        assert!(shown.contains(REDACTED), "{name}");
        // The config shown is still the config (re-serialized), with the secret replaced.
        let cfg = shown
            .split("==> ")
            .find(|s| s.starts_with(DEFAULT_CONFIG_PATH))
            .unwrap();
        let body = cfg.split_once("<==\n").unwrap().1;
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["agent"]["nodeName"], "flex-node-1", "{name}");
    }
}

/// What the dry run says the real bootstrap would do, stage by stage (pure).
#[test]
fn progress_note_table() {
    use crate::flows::start::BootstrapProgress::*;
    for (progress, want) in [
        (NotStarted, None),
        (Complete, Some("already bootstrapped")),
        (Unfinished, Some("would only finish it")),
        (Interrupted, Some("run start again without preflight")),
    ] {
        let note = progress_note(progress);
        match want {
            None => assert_eq!(note, None),
            Some(w) => assert!(note.as_deref().is_some_and(|n| n.contains(w)), "{note:?}"),
        }
    }
}

/// Links among the planned files are written as links (not as 0777 regular files) and shown
/// as links. Real files under a temporary directory.
#[test]
fn links_are_written_and_shown_as_links() {
    let d = tempfile::tempdir().unwrap();
    let mut plan = plan(&minimal(), None, &facts(), false, b"").unwrap();
    plan.files.push(PlannedFile {
        path: PathBuf::from("/var/lib/machines/kube1/etc/localtime"),
        content: b"-> /usr/share/zoneinfo/UTC\n".to_vec(),
        mode: 0o777,
        link: Some(PathBuf::from("/usr/share/zoneinfo/UTC")),
    });
    let links: Vec<_> = plan.files.iter().filter(|f| f.link.is_some()).collect();
    write_under(&plan, d.path()).unwrap();
    for f in &links {
        let real = d.path().join(f.path.strip_prefix("/").unwrap());
        assert_eq!(
            std::fs::read_link(&real).unwrap(),
            *f.link.as_ref().unwrap(),
            "{}",
            f.path.display()
        );
    }
    let shown = show(&plan);
    assert!(
        shown.contains(
            "==> /var/lib/machines/kube1/etc/localtime (symlink to /usr/share/zoneinfo/UTC) <=="
        ),
        "{shown}"
    );
}
