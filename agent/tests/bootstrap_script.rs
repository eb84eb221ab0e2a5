//! `scripts/bootstrap.sh`, run for real with bash through the runner: shellcheck-clean,
//! `--use-installed-agent` runs the agent in the install directory with `bootstrap-node`, a
//! missing agent fails, a download from a local HTTP server is sha256-verified before anything
//! is installed, and env-file values are never evaluated. The "agent" is a small shell script
//! that records its arguments.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use flex_host::runner::{Cmd, Output, ProcessRunner, Runner};
use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/bootstrap.sh")
}

/// A fake agent: writes its arguments, one per line, to `<its path>.argv`.
const FAKE_AGENT: &str = "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$0.argv\"\n";

fn fake_agent(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("aks-flex-node");
    std::fs::write(&p, FAKE_AGENT).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

fn argv_of(agent: &Path) -> String {
    std::fs::read_to_string(format!("{}.argv", agent.display())).unwrap_or_default()
}

/// The script's install inputs. Cargo exports `AKS_FLEX_NODE_VERSION` (the agent's build
/// script sets it for `env!`) to test processes, so each run blanks them, which the script
/// reads as unset.
const INSTALL_INPUTS: &[&str] = &[
    "AKS_FLEX_NODE_VERSION",
    "AKS_FLEX_NODE_DOWNLOAD_URL",
    "AKS_FLEX_NODE_SHA256",
    "AKS_FLEX_NODE_INSTALL_DIR",
    "AKS_FLEX_NODE_USE_INSTALLED_AGENT",
];

/// Runs the script with `args` and extra environment `env`.
async fn bootstrap(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Cmd::new("bash")
        .arg(script().display().to_string())
        .args(args.iter().copied());
    for k in INSTALL_INPUTS {
        cmd = cmd.env(*k, "");
    }
    for (k, v) in env {
        cmd = cmd.env(*k, *v);
    }
    ProcessRunner::new().output(&cmd).await.unwrap()
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test]
async fn shellcheck_is_clean() {
    let r = ProcessRunner::new();
    assert!(
        r.which("shellcheck").is_some(),
        "shellcheck is not installed: apt-get install shellcheck"
    );
    let out = r
        .output(&Cmd::new("shellcheck").arg(path_str(&script())))
        .await
        .unwrap();
    assert!(out.success(), "shellcheck:\n{}{}", out.stdout, out.stderr);
    let out = r
        .output(&Cmd::new("bash").args(["-n", path_str(&script())]))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
}

#[tokio::test]
async fn help_exits_zero_and_unknown_arguments_two() {
    let out = bootstrap(&["--help"], &[]).await;
    assert!(out.success());
    assert!(
        out.stdout.contains("--use-installed-agent"),
        "{}",
        out.stdout
    );
    let out = bootstrap(&["--bogus"], &[]).await;
    assert_eq!(out.code, Some(2));
    assert!(
        out.stderr.contains("unknown argument --bogus"),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn use_installed_agent_runs_it_with_bootstrap_node() {
    let d = tempfile::tempdir().unwrap();
    let bin = d.path().join("bin");
    let agent = fake_agent(&bin);
    let env_file = d.path().join("bootstrap.env");
    std::fs::write(&env_file, "AKS_FLEX_NODE_NODE_NAME=edge-1\n").unwrap();

    let out = bootstrap(
        &[
            "--use-installed-agent",
            "--install-dir",
            path_str(&bin),
            "--env-file",
            path_str(&env_file),
        ],
        &[],
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    assert_eq!(
        argv_of(&agent),
        format!("bootstrap-node\n--env-file\n{}\n", env_file.display())
    );
    assert!(
        out.stderr.contains("using the installed agent"),
        "{}",
        out.stderr
    );

    // The same through the environment alone, with --install-dir=DIR spelling.
    std::fs::remove_file(format!("{}.argv", agent.display())).unwrap();
    let out = bootstrap(
        &[],
        &[
            ("AKS_FLEX_NODE_USE_INSTALLED_AGENT", "true"),
            ("AKS_FLEX_NODE_INSTALL_DIR", path_str(&bin)),
        ],
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    assert_eq!(argv_of(&agent), "bootstrap-node\n");
}

#[tokio::test]
async fn use_installed_agent_fails_without_an_agent() {
    let d = tempfile::tempdir().unwrap();
    let empty = d.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = bootstrap(
        &["--use-installed-agent", "--install-dir", path_str(&empty)],
        &[],
    )
    .await;
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr.contains(&format!(
            "--use-installed-agent: there is no executable aks-flex-node in {}",
            empty.display()
        )),
        "{}",
        out.stderr
    );
    // Present but not executable is no agent either.
    std::fs::write(empty.join("aks-flex-node"), FAKE_AGENT).unwrap();
    let out = bootstrap(
        &["--install-dir", path_str(&empty)],
        &[("AKS_FLEX_NODE_USE_INSTALLED_AGENT", "1")],
    )
    .await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("there is no executable aks-flex-node"),
        "{}",
        out.stderr
    );

    let out = bootstrap(&[], &[("AKS_FLEX_NODE_USE_INSTALLED_AGENT", "maybe")]).await;
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr
            .contains("AKS_FLEX_NODE_USE_INSTALLED_AGENT: \"maybe\" is not true, false, 1 or 0"),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn env_file_values_are_data_and_never_evaluated() {
    let d = tempfile::tempdir().unwrap();
    let pwned = d.path().join("pwned");
    let p = pwned.display();
    // The install directory's own name is hostile: the script must take it literally to find
    // the agent there.
    let bin = d.path().join(format!("bin $(touch {p}) `touch {p}`;true"));
    let agent = fake_agent(&bin);
    let env_file = d.path().join("bootstrap.env");
    let quoted_bin = bin
        .display()
        .to_string()
        .replace('\\', "\\\\")
        .replace('"', "\\\"");
    std::fs::write(
        &env_file,
        format!(
            "# hostile values stay strings\n\
             AKS_FLEX_NODE_NODE_NAME=$(touch {p})\n\
             AKS_FLEX_NODE_LOCATION=`touch {p}`\n\
             AKS_FLEX_NODE_OCI_IMAGE=x;touch {p} | sh\n\
             AKS_FLEX_NODE_LABELS='$(touch {p})'\n\
             AKS_FLEX_NODE_TAINTS=\"`touch {p}` $(touch {p})\"\n\
             AKS_FLEX_NODE_INSTALL_DIR='/nonexistent'\n\
             export AKS_FLEX_NODE_INSTALL_DIR=\"{quoted_bin}\"  # the last one wins\n\
             AKS_FLEX_NODE_USE_INSTALLED_AGENT=TRUE\n"
        ),
    )
    .unwrap();
    let out = bootstrap(&["--env-file", path_str(&env_file)], &[]).await;
    assert!(out.success(), "{}", out.stderr);
    assert_eq!(
        argv_of(&agent),
        format!("bootstrap-node\n--env-file\n{}\n", env_file.display())
    );
    assert!(!pwned.exists(), "an env-file value was evaluated");
}

#[tokio::test]
async fn env_file_syntax_errors_name_the_line() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("bootstrap.env");
    for (body, want) in [
        (
            "# c\nPATH=/evil\n",
            "line 2: PATH is not an AKS_FLEX_NODE_* setting",
        ),
        (
            "AKS_FLEX_NODE_NODE_NAME='secretvalue\n",
            "line 1: unterminated single quote",
        ),
        (
            "\nAKS_FLEX_NODE_NODE_NAME=\"secretvalue\n",
            "line 2: unterminated double quote",
        ),
        (
            "AKS_FLEX_NODE_NODE_NAME='a'$(id)\n",
            "line 1: unexpected text after the closing quote",
        ),
        ("AKS_FLEX_NODE_NODE_NAME= x\n", "line 1: blank after ="),
        ("just text\n", "line 1: expected KEY=VALUE"),
    ] {
        std::fs::write(&f, body).unwrap();
        let out = bootstrap(&["--env-file", path_str(&f), "--use-installed-agent"], &[]).await;
        assert_eq!(out.code, Some(1), "{body:?}");
        assert!(out.stderr.contains(want), "{body:?}: {}", out.stderr);
        assert!(!out.stderr.contains("secretvalue"), "{}", out.stderr);
    }
    let out = bootstrap(&["--env-file", path_str(&d.path().join("missing"))], &[]).await;
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr.contains("cannot read env file"),
        "{}",
        out.stderr
    );
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("unsupported test architecture {other}"),
    }
}

/// A release archive as upstream publishes it: `aks-flex-node-linux-<arch>` in a tar.gz.
fn release_archive() -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mut h = tar::Header::new_gnu();
    h.set_size(FAKE_AGENT.len() as u64);
    h.set_mode(0o755);
    h.set_cksum();
    tar.append_data(
        &mut h,
        format!("aks-flex-node-linux-{}", arch()),
        FAKE_AGENT.as_bytes(),
    )
    .unwrap();
    let mut gz = tar.into_inner().unwrap();
    gz.flush().unwrap();
    gz.finish().unwrap()
}

/// Serves `body` at `/agent.tar.gz` (404 elsewhere) on 127.0.0.1; returns the base URL.
async fn serve(body: Vec<u8>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let body = body.clone();
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&req);
                let ok = line.starts_with("GET /agent.tar.gz ");
                let (status, body) = if ok {
                    ("200 OK", body)
                } else {
                    ("404 Not Found", b"not found".to_vec())
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: application/gzip\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = sock.write_all(head.as_bytes()).await;
                let _ = sock.write_all(&body).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn download_with_the_right_sha256_installs_the_agent() {
    let archive = release_archive();
    let sum = hex::encode(sha2::Sha256::digest(&archive));
    let base = serve(archive).await;
    let d = tempfile::tempdir().unwrap();
    let bin = d.path().join("bin");
    let url = format!("{base}/agent.tar.gz");
    let tmp = d.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let out = bootstrap(
        &["--install-dir", path_str(&bin)],
        &[
            ("AKS_FLEX_NODE_DOWNLOAD_URL", &url),
            ("AKS_FLEX_NODE_SHA256", &sum.to_uppercase()),
            ("TMPDIR", path_str(&tmp)),
        ],
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    assert_eq!(
        std::fs::read_dir(&tmp).unwrap().count(),
        0,
        "download left behind"
    );
    let agent = bin.join("aks-flex-node");
    assert_eq!(std::fs::read_to_string(&agent).unwrap(), FAKE_AGENT);
    let mode = std::fs::metadata(&agent).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o755);
    // The installed agent then ran the bootstrap.
    assert_eq!(argv_of(&agent), "bootstrap-node\n");
    assert!(
        out.stderr
            .contains(&format!("installed {}", agent.display())),
        "{}",
        out.stderr
    );
    // The URL may carry a token: never printed.
    assert!(
        !out.stderr.contains(&url) && !out.stderr.contains("127.0.0.1"),
        "{}",
        out.stderr
    );
    let mut names: Vec<_> = std::fs::read_dir(&bin)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, vec!["aks-flex-node", "aks-flex-node.argv"]);
}

#[tokio::test]
async fn download_with_a_wrong_sha256_installs_nothing() {
    let archive = release_archive();
    let actual = hex::encode(sha2::Sha256::digest(&archive));
    let base = serve(archive).await;
    let d = tempfile::tempdir().unwrap();
    let wrong = "0".repeat(64);
    let url = format!("{base}/agent.tar.gz");

    // Nothing installed yet: nothing appears, and the download is removed.
    let bin = d.path().join("bin");
    let tmp = d.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let out = bootstrap(
        &["--install-dir", path_str(&bin)],
        &[
            ("AKS_FLEX_NODE_DOWNLOAD_URL", &url),
            ("AKS_FLEX_NODE_SHA256", &wrong),
            ("TMPDIR", path_str(&tmp)),
        ],
    )
    .await;
    assert_eq!(
        std::fs::read_dir(&tmp).unwrap().count(),
        0,
        "download left behind"
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "sha256 mismatch for the downloaded archive: expected {wrong}, got {actual}"
        )),
        "{}",
        out.stderr
    );
    assert!(!bin.exists());

    // An installed agent is left as it was, and not run.
    let old = d.path().join("old");
    std::fs::create_dir(&old).unwrap();
    std::fs::write(old.join("aks-flex-node"), "#!/bin/sh\necho old\n").unwrap();
    let out = bootstrap(
        &["--install-dir", path_str(&old)],
        &[
            ("AKS_FLEX_NODE_DOWNLOAD_URL", &url),
            ("AKS_FLEX_NODE_SHA256", &wrong),
        ],
    )
    .await;
    assert_eq!(out.code, Some(1));
    assert_eq!(
        std::fs::read_to_string(old.join("aks-flex-node")).unwrap(),
        "#!/bin/sh\necho old\n"
    );
    assert_eq!(std::fs::read_dir(&old).unwrap().count(), 1);
}

#[tokio::test]
async fn download_inputs_are_required_and_checked() {
    let base = serve(b"not an archive".to_vec()).await;
    let d = tempfile::tempdir().unwrap();
    let bin = d.path().join("bin");
    let b = path_str(&bin);
    let sum = hex::encode(sha2::Sha256::digest(b"not an archive"));
    let url = format!("{base}/agent.tar.gz");
    let missing_url = format!("{base}/missing.tar.gz");
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (
            vec![],
            "set AKS_FLEX_NODE_VERSION or AKS_FLEX_NODE_DOWNLOAD_URL",
        ),
        (
            vec![("AKS_FLEX_NODE_VERSION", "v0.1.0")],
            "AKS_FLEX_NODE_SHA256 is required",
        ),
        (
            vec![
                ("AKS_FLEX_NODE_VERSION", "v0.1.0"),
                ("AKS_FLEX_NODE_SHA256", "abc"),
            ],
            "AKS_FLEX_NODE_SHA256 is not a sha256 digest",
        ),
        (
            vec![
                ("AKS_FLEX_NODE_VERSION", "../../x"),
                ("AKS_FLEX_NODE_SHA256", &sum),
            ],
            "is not a release tag",
        ),
        (
            vec![
                ("AKS_FLEX_NODE_DOWNLOAD_URL", &missing_url),
                ("AKS_FLEX_NODE_SHA256", &sum),
            ],
            "download failed",
        ),
        (
            vec![
                ("AKS_FLEX_NODE_DOWNLOAD_URL", &url),
                ("AKS_FLEX_NODE_SHA256", &sum),
            ],
            "the downloaded archive is not a gzip tar archive",
        ),
    ];
    for (env, want) in cases {
        let out = bootstrap(&["--install-dir", b], &env).await;
        assert_eq!(out.code, Some(1), "{env:?}: {}", out.stderr);
        assert!(out.stderr.contains(want), "{env:?}: {}", out.stderr);
        assert!(!bin.exists(), "{env:?}");
    }
}

/// The script's env-file parser and the agent's read the same value from every spelling: the
/// script finds the agent in the install directory the agent's parser reads from the line.
#[tokio::test]
async fn the_script_and_the_agent_parse_env_files_alike() {
    let d = tempfile::tempdir().unwrap();
    let base = d.path().display().to_string();
    let env_file = d.path().join("bootstrap.env");
    let tails = [
        "plain",
        "'single $(x) `y` \\ \"q\"'",
        "\"double \\\"q\\\" \\\\ \\n \\$ $(x) `y` ~ #\"",
        "\"a\\\\\"  # comment",
        "'s'\t# comment",
        "unquoted $(x) `y` ' \" # kept  \t",
        "a=b=c",
    ];
    for (i, tail) in tails.iter().enumerate() {
        // `<base>/<i>-<tail>`: the directory part is plain, the tail carries the spelling.
        let line = if let Some(q) = tail.strip_prefix('\'') {
            format!("AKS_FLEX_NODE_INSTALL_DIR='{base}/{i}-{q}")
        } else if let Some(q) = tail.strip_prefix('"') {
            format!("AKS_FLEX_NODE_INSTALL_DIR=\"{base}/{i}-{q}")
        } else {
            format!("AKS_FLEX_NODE_INSTALL_DIR={base}/{i}-{tail}")
        };
        let text = format!("{line}\r\nAKS_FLEX_NODE_USE_INSTALLED_AGENT=true\n");
        let entries = flex_api::bootstrap_env::parse(&text).unwrap();
        let dir = PathBuf::from(&entries[0].value);
        assert!(dir.starts_with(d.path()), "{line}");
        let agent = fake_agent(&dir);
        std::fs::write(&env_file, &text).unwrap();
        let out = bootstrap(&["--env-file", path_str(&env_file)], &[]).await;
        assert!(
            out.success(),
            "{line:?} (agent reads {dir:?}): {}",
            out.stderr
        );
        assert!(argv_of(&agent).starts_with("bootstrap-node\n"), "{line:?}");
    }
}

/// A fake downloader (`curl` or `wget`): writes its arguments, one per line, to `<its
/// path>.argv` and its standard input to `<its path>.stdin`, then fails as a refused download
/// would (the script stops there).
const FAKE_DOWNLOADER: &str =
    "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$0.argv\"\ncat > \"$0.stdin\"\nexit 22\n";

/// A SAS-style URL with a token, and characters curl's config syntax must have escaped.
const SECRET_URL: &str =
    "https://example.invalid/agent.tar.gz?sv=2024&sig=SECRETSIG%2Bx&q=\"a\\b\"";

/// Runs the script's download with the fake `tool` first on PATH; returns its argv and stdin.
/// With `only_tool`, PATH holds nothing but the fake and the few tools the script needs before
/// downloading (so `curl` is not found and `wget` is used).
async fn fake_download(tool: &str, only_tool: bool) -> (String, String, Output) {
    let d = tempfile::tempdir().unwrap();
    let fake_bin = d.path().join("fakebin");
    std::fs::create_dir(&fake_bin).unwrap();
    let fake = fake_bin.join(tool);
    std::fs::write(&fake, FAKE_DOWNLOADER).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let r = ProcessRunner::new();
    let path = if only_tool {
        for t in ["uname", "mktemp", "rm", "cat"] {
            let real = r.which(t).unwrap_or_else(|| panic!("{t} not found"));
            std::os::unix::fs::symlink(real, fake_bin.join(t)).unwrap();
        }
        path_str(&fake_bin).to_string()
    } else {
        format!("{}:{}", path_str(&fake_bin), std::env::var("PATH").unwrap())
    };
    let bash = r.which("bash").unwrap();
    let bin = d.path().join("bin");
    let mut cmd = Cmd::new(path_str(&bash))
        .arg(path_str(&script()))
        .args(["--install-dir", path_str(&bin)]);
    for k in INSTALL_INPUTS {
        cmd = cmd.env(*k, "");
    }
    cmd = cmd
        .env("PATH", path)
        .env("AKS_FLEX_NODE_DOWNLOAD_URL", SECRET_URL)
        .env("AKS_FLEX_NODE_SHA256", "0".repeat(64));
    let out = r.output(&cmd).await.unwrap();
    let argv = std::fs::read_to_string(format!("{}.argv", fake.display())).unwrap_or_default();
    let stdin = std::fs::read_to_string(format!("{}.stdin", fake.display())).unwrap_or_default();
    (argv, stdin, out)
}

/// Real script, fake `curl` (records argv and stdin): the URL, which may carry a token, is
/// not on curl's command line (readable by anyone in /proc) but in a config on its standard
/// input (`--config -`), quoted by curl's config rules.
#[tokio::test]
async fn curl_gets_the_download_url_on_stdin_not_in_argv() {
    let (argv, stdin, out) = fake_download("curl", false).await;
    assert!(!out.success(), "the fake download fails");
    assert!(out.stderr.contains("download failed"), "{}", out.stderr);
    assert!(
        !argv.is_empty(),
        "the fake curl did not run: {}",
        out.stderr
    );
    assert!(!argv.contains("SECRETSIG"), "URL in curl's argv:\n{argv}");
    assert!(argv.lines().any(|a| a == "--config"), "{argv}");
    assert_eq!(
        stdin,
        "url = \"https://example.invalid/agent.tar.gz?sv=2024&sig=SECRETSIG%2Bx&q=\\\"a\\\\b\\\"\"\n"
    );
    assert!(!out.stderr.contains("SECRETSIG"), "{}", out.stderr);
}

/// Real script, fake `wget` and no `curl` on PATH: the URL goes on wget's standard input
/// (`--input-file -`), not in its argv.
#[tokio::test]
async fn wget_gets_the_download_url_on_stdin_not_in_argv() {
    let (argv, stdin, out) = fake_download("wget", true).await;
    assert!(!out.success());
    assert!(
        !argv.is_empty(),
        "the fake wget did not run: {}",
        out.stderr
    );
    assert!(!argv.contains("SECRETSIG"), "URL in wget's argv:\n{argv}");
    assert!(argv.lines().any(|a| a == "--input-file=-"), "{argv}");
    assert_eq!(stdin, format!("{SECRET_URL}\n"));
    assert!(!out.stderr.contains("SECRETSIG"), "{}", out.stderr);
}
