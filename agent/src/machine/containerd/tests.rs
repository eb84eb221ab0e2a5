//! Unit tests: settings parsing, `ctr` argv (recording [`FakeRunner`]), error texts, the fake,
//! and the pure helpers of the gRPC path. The real containerd is exercised in
//! `tests/tests/containerd_pull.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::grpc::{chain_ids, document_media_type, rfc3339};
use super::*;
use flex_host::runner::{CmdError, Output};
use flex_oci::Digest;
use flex_oci::manifest::parse_manifest;
use flex_oci::registry::FetchedManifest;
use flex_testkit::FakeRunner;

const REF: &str = "10.0.2.2:5000/aks-flex-node@sha256:1111111111111111111111111111111111111111111111111111111111111111";
const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

fn ctr_over(fake: &FakeRunner) -> CtrImages {
    CtrImages::new(Arc::new(fake.clone()))
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[test]
fn pull_options_from_settings() {
    let cases = [
        ("", false),
        ("AKS_FLEX_NODE_IMAGE=x\nAKS_FLEX_NODE_PULL_ARGS=\n", false),
        ("AKS_FLEX_NODE_PULL_ARGS=--plain-http\n", true),
        ("AKS_FLEX_NODE_PULL_ARGS=\"--plain-http\"\n", true),
        ("AKS_FLEX_NODE_PULL_ARGS='--plain-http'", true),
        ("  # AKS_FLEX_NODE_PULL_ARGS=--plain-http\n", false),
        (
            "export AKS_FLEX_NODE_PULL_ARGS=\"--other --plain-http\"\n",
            true,
        ),
        (
            "AKS_FLEX_NODE_PULL_ARGS=--plain-http\nAKS_FLEX_NODE_PULL_ARGS=\n",
            false,
        ),
        ("AKS_FLEX_NODE_PULL_ARGS=--plain-http=false\n", false),
        ("OTHER_AKS_FLEX_NODE_PULL_ARGS=--plain-http\n", false),
        (
            "not an assignment\nAKS_FLEX_NODE_PULL_ARGS=--plain-http",
            true,
        ),
    ];
    for (text, plain_http) in cases {
        assert_eq!(
            PullOptions::from_settings(text).unwrap(),
            PullOptions {
                plain_http,
                ..Default::default()
            },
            "{text:?}"
        );
    }
    let o = PullOptions::from_settings(
        "AKS_FLEX_NODE_INSECURE_REGISTRIES=\"10.0.2.2:5000, r.local\"\nAKS_FLEX_NODE_PULL_ARGS=--plain-http\n",
    )
    .unwrap();
    assert!(o.plain_http);
    assert_eq!(o.insecure_registries.to_list(), "10.0.2.2:5000,r.local");
    let e = PullOptions::from_settings("AKS_FLEX_NODE_INSECURE_REGISTRIES=http://10.0.2.2:5000\n")
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "AKS_FLEX_NODE_INSECURE_REGISTRIES: \"http://10.0.2.2:5000\" must be host[:port], without a scheme"
    );
}

fn listed(registries: &str) -> PullOptions {
    PullOptions {
        plain_http: true,
        insecure_registries: flex_host::http::InsecureRegistries::parse("test", registries)
            .unwrap(),
    }
}

/// `ctr` faked by the runner: a private-address registry gets `--plain-http` only when it is
/// listed; asking for plain HTTP to one that is not listed is refused before `ctr` runs.
#[tokio::test]
async fn ctr_plain_http_only_for_listed_registries() {
    let fake = FakeRunner::new();
    fake.on(
        &format!("ctr -n aks-flex images ls name=={REF}"),
        Output::ok(ls_table(REF, DIGEST)),
    );
    let ctr = ctr_over(&fake);
    // Private address, nothing listed, no flag: HTTPS (no --plain-http).
    ctr.pull(REF, &PullOptions::default()).await.unwrap();
    // Listed: --plain-http, even without the flag.
    let only_list = PullOptions {
        plain_http: false,
        ..listed("10.0.2.2:5000")
    };
    ctr.pull(REF, &only_list).await.unwrap();
    let pulls: Vec<String> = fake
        .calls()
        .into_iter()
        .filter(|c| c.contains("images pull"))
        .collect();
    assert_eq!(
        pulls,
        [
            format!("ctr -n aks-flex images pull {REF}"),
            format!("ctr -n aks-flex images pull --plain-http {REF}"),
        ]
    );
    // The flag for a registry that is not listed (another port): refused, ctr not run.
    let before = fake.calls().len();
    let e = ctr
        .pull(REF, &listed("10.0.2.2:5001"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("10.0.2.2:5000 is not listed in AKS_FLEX_NODE_INSECURE_REGISTRIES"),
        "{e}"
    );
    assert_eq!(fake.calls().len(), before);
}

fn ls_table(reference: &str, digest: &str) -> String {
    format!(
        "REF TYPE DIGEST SIZE PLATFORMS LABELS\n{reference} application/vnd.oci.image.index.v1+json {digest} 1.1 MiB linux/amd64 -\n"
    )
}

#[tokio::test]
async fn ctr_argv_transcript() {
    let fake = FakeRunner::new();
    fake.on(
        &format!("ctr -n aks-flex images ls name=={REF}"),
        Output::ok(ls_table(REF, DIGEST)),
    );
    fake.on(
        &format!("ctr -n aks-flex images ls -q name=={REF}"),
        Output::ok(format!("{REF}\n")),
    );
    fake.on(
        "ctr -n aks-flex run",
        Output::ok("aks-flex-node 1.2.3\n".to_string()),
    );
    let ctr = ctr_over(&fake);
    let pulled = ctr.pull(REF, &listed("10.0.2.2:5000")).await.unwrap();
    assert_eq!(
        pulled,
        PulledImage {
            name: REF.into(),
            digest: DIGEST.into()
        }
    );
    assert!(ctr.exists(REF).await.unwrap());
    let out = ctr
        .run_check(
            REF,
            7,
            &args(&["aks-flex-node", "version"]),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_eq!(out, "aks-flex-node 1.2.3\n");
    ctr.remove(REF).await.unwrap();
    insta::assert_snapshot!("ctr_transcript", fake.transcript());
}

#[tokio::test]
async fn ctr_options_reach_the_argv() {
    let fake = FakeRunner::new();
    fake.on(
        "ctr --address /tmp/c.sock -n flex images ls name==r",
        Output::ok(ls_table("r", DIGEST)),
    );
    let ctr = ctr_over(&fake)
        .with_address("/tmp/c.sock")
        .with_namespace("flex")
        .with_snapshotter("native")
        .without_systemd_cgroup();
    ctr.pull("r", &PullOptions::default()).await.unwrap();
    ctr.run_check("r", 1, &args(&["true"]), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        fake.calls(),
        [
            "ctr --address /tmp/c.sock -n flex images pull --snapshotter native r",
            "ctr --address /tmp/c.sock -n flex images ls name==r",
            "ctr --address /tmp/c.sock -n flex tasks delete -f aks-flex-upgrade-check-1",
            "ctr --address /tmp/c.sock -n flex containers delete aks-flex-upgrade-check-1",
            "ctr --address /tmp/c.sock -n flex run --rm --snapshotter native r aks-flex-upgrade-check-1 true",
            // `true` prints nothing: run once more, in case containerd lost its output.
            "ctr --address /tmp/c.sock -n flex tasks delete -f aks-flex-upgrade-check-1",
            "ctr --address /tmp/c.sock -n flex containers delete aks-flex-upgrade-check-1",
            "ctr --address /tmp/c.sock -n flex run --rm --snapshotter native r aks-flex-upgrade-check-1 true",
        ]
    );
}

/// Fake runner: a first run whose output containerd lost (exit 0, nothing printed) is run once
/// more, and the second run's output is the check's.
#[tokio::test]
async fn a_check_whose_output_was_lost_is_run_once_more() {
    let fake = FakeRunner::new();
    let run = "ctr -n aks-flex run --rm";
    fake.on_seq(
        run,
        vec![
            Output::ok(String::new()),
            Output::ok("aks-flex-node 1.2.3\n".to_string()),
        ],
    );
    let ctr = ctr_over(&fake);
    let out = ctr
        .run_check(
            REF,
            9,
            &args(&["aks-flex-node", "version"]),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(out, "aks-flex-node 1.2.3\n");
    assert_eq!(
        fake.calls().iter().filter(|c| c.starts_with(run)).count(),
        2
    );
}

#[tokio::test]
async fn ctr_exists_is_false_without_a_listed_row() {
    let fake = FakeRunner::new();
    let ctr = ctr_over(&fake);
    assert!(!ctr.exists(REF).await.unwrap());
}

#[tokio::test]
async fn ctr_remove_of_an_absent_image_is_ok_other_failures_are_not() {
    let fake = FakeRunner::new();
    fake.on(
        "ctr -n aks-flex images rm absent",
        Output::failed(1, "ctr: image \"absent\": not found\n"),
    );
    fake.on(
        "ctr -n aks-flex images rm broken",
        Output::failed(1, "ctr: connection refused\n"),
    );
    let ctr = ctr_over(&fake);
    ctr.remove("absent").await.unwrap();
    let e = ctr.remove("broken").await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "image broken: remove: ctr -n aks-flex images rm broken failed: exit status 1: ctr: connection refused"
    );
}

#[tokio::test]
async fn ctr_error_texts_name_image_step_and_command() {
    let fake = FakeRunner::new();
    fake.on(
        "ctr -n aks-flex images pull",
        Output::failed(
            1,
            "ctr: failed to resolve reference \"r@sha256:bad\": not found\n",
        ),
    );
    let ctr = ctr_over(&fake);
    let e = ctr
        .pull("r@sha256:bad", &PullOptions::default())
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "image r@sha256:bad: pull: ctr -n aks-flex images pull r@sha256:bad failed: exit status 1: \
         ctr: failed to resolve reference \"r@sha256:bad\": not found"
    );
    assert!(!e.is_transport());

    // Pulled but not listed.
    let fake = FakeRunner::new();
    let e = ctr_over(&fake)
        .pull("r", &PullOptions::default())
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "image r: list: pulled, but `ctr images ls` does not list it"
    );

    // Listed with another digest than the pinned one.
    let fake = FakeRunner::new();
    let other = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
    fake.on(
        &format!("ctr -n aks-flex images ls name=={REF}"),
        Output::ok(ls_table(REF, other)),
    );
    let e = ctr_over(&fake)
        .pull(REF, &PullOptions::default())
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("image {REF}: verify: containerd's image targets {other}, not {DIGEST}")
    );
}

#[tokio::test]
async fn ctr_check_failure_names_image_argv_exit_and_stderr() {
    let fake = FakeRunner::new();
    fake.on(
        "ctr -n aks-flex run",
        Output::failed(3, "error: cannot load config\n"),
    );
    let e = ctr_over(&fake)
        .run_check(
            REF,
            2,
            &args(&["aks-flex-node", "config", "check", "a b"]),
            Duration::from_secs(30),
        )
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "image {REF}: check `aks-flex-node config check \"a b\"` failed: exit status 3: error: cannot load config"
        )
    );
}

/// A runner whose `ctr run` times out; everything else succeeds.
#[derive(Clone, Default)]
struct TimingOut(FakeRunner);

#[async_trait::async_trait]
impl flex_host::runner::Runner for TimingOut {
    async fn output(&self, cmd: &flex_host::runner::Cmd) -> Result<Output, CmdError> {
        let out = self.0.output(cmd).await?;
        if cmd.display_argv().contains(" run --rm ") {
            return Err(CmdError::Timeout {
                argv: cmd.display_argv(),
                after: cmd.timeout_value(),
            });
        }
        Ok(out)
    }
    fn which(&self, program: &str) -> Option<std::path::PathBuf> {
        self.0.which(program)
    }
}

#[tokio::test]
async fn ctr_check_timeout_kills_and_removes_the_container() {
    let runner = TimingOut::default();
    let ctr = CtrImages::new(Arc::new(runner.clone()));
    let e = ctr
        .run_check(REF, 4, &args(&["sleep", "60"]), Duration::from_secs(2))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("image {REF}: check `sleep 60` timed out after 2s")
    );
    let calls = runner.0.calls();
    assert_eq!(
        &calls[calls.len() - 2..],
        [
            "ctr -n aks-flex tasks delete -f aks-flex-upgrade-check-4",
            "ctr -n aks-flex containers delete aks-flex-upgrade-check-4",
        ]
    );
}

#[tokio::test]
async fn host_images_without_a_socket_uses_ctr() {
    let fake = FakeRunner::new();
    let images = host_images_at(
        Arc::new(fake.clone()),
        Path::new("/nonexistent/containerd.sock"),
        None,
    )
    .await;
    assert!(!images.exists("r").await.unwrap());
    assert_eq!(
        fake.calls(),
        ["ctr --address /nonexistent/containerd.sock -n aks-flex images ls -q name==r"]
    );
}

#[tokio::test]
async fn grpc_connect_to_a_missing_socket_is_a_transport_error() {
    let fake = FakeRunner::new();
    let registry = flex_oci::RegistryClient::new(flex_host::http::client().unwrap());
    let e = GrpcImages::connect(
        Path::new("/nonexistent/containerd.sock"),
        registry,
        ctr_over(&fake),
    )
    .await
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "containerd at /nonexistent/containerd.sock: no such socket"
    );
    assert!(e.is_transport());
}

#[test]
fn api_error_text_and_transport_flag() {
    let e = ContainerdError::Api {
        image: "r".into(),
        step: "write layer sha256:ab".into(),
        call: "content.Write",
        code: "FailedPrecondition".into(),
        message: "unexpected commit digest".into(),
        transport: false,
    };
    assert_eq!(
        e.to_string(),
        "image r: write layer sha256:ab: containerd content.Write: FailedPrecondition: unexpected commit digest"
    );
    assert!(!e.is_transport());
}

#[test]
fn ls_digest_parsing() {
    assert_eq!(
        ctr::parse_ls_digest(&ls_table(REF, DIGEST), REF).as_deref(),
        Some(DIGEST)
    );
    assert_eq!(ctr::parse_ls_digest(&ls_table(REF, DIGEST), "other"), None);
    assert_eq!(ctr::parse_ls_digest("REF TYPE DIGEST\n", "REF"), None);
}

#[test]
fn chain_ids_follow_the_oci_definition() {
    let d = |c: char| Digest::parse(&format!("sha256:{}", c.to_string().repeat(64))).unwrap();
    let (a, b, c) = (d('a'), d('b'), d('c'));
    let chains = chain_ids(&[a.clone(), b.clone(), c.clone()]);
    let ab = Digest::of(format!("{a} {b}").as_bytes());
    let abc = Digest::of(format!("{ab} {c}").as_bytes());
    assert_eq!(chains, [a, ab, abc]);
    assert!(chain_ids(&[]).is_empty());
}

#[test]
fn rfc3339_dates() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(4_107_542_399), "2100-02-28T23:59:59Z");
}

#[test]
fn document_media_types() {
    let fetched = |ct: Option<&str>, bytes: &[u8]| FetchedManifest {
        digest: Digest::of(bytes),
        content_type: ct.map(str::to_string),
        bytes: bytes.to_vec(),
        manifest: parse_manifest(ct, bytes).unwrap(),
    };
    let docker = br#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json","config":{"mediaType":"application/vnd.docker.container.image.v1+json","digest":"sha256:1111111111111111111111111111111111111111111111111111111111111111","size":1},"layers":[]}"#;
    assert_eq!(
        document_media_type(&fetched(None, docker)),
        "application/vnd.docker.distribution.manifest.v2+json"
    );
    let bare_index = br#"{"schemaVersion":2,"manifests":[]}"#;
    assert_eq!(
        document_media_type(&fetched(
            Some("application/vnd.oci.image.index.v1+json; charset=utf-8"),
            bare_index
        )),
        "application/vnd.oci.image.index.v1+json"
    );
    let bare_manifest = br#"{"schemaVersion":2,"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:1111111111111111111111111111111111111111111111111111111111111111","size":1},"layers":[]}"#;
    assert_eq!(
        document_media_type(&fetched(None, bare_manifest)),
        "application/vnd.oci.image.manifest.v1+json"
    );
}

#[tokio::test]
async fn fake_records_and_answers() {
    let fake = FakeImages::new();
    fake.with_image("old")
        .fail_pull("bad", "manifest unknown")
        .check_prints(REF, "v2\n")
        .fail_check("broken", 1, "segfault");
    assert!(fake.exists("old").await.unwrap());
    let p = fake.pull(REF, &listed("10.0.2.2:5000")).await.unwrap();
    assert_eq!(p.digest, DIGEST);
    assert_eq!(
        fake.pull("plain", &PullOptions::default())
            .await
            .unwrap()
            .digest,
        fake::FAKE_DIGEST
    );
    let e = fake.pull("bad", &PullOptions::default()).await.unwrap_err();
    assert_eq!(e.to_string(), "image bad: pull: manifest unknown");
    assert!(!fake.has("bad"));
    let out = fake
        .run_check(
            REF,
            1,
            &args(&["aks-flex-node", "version"]),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(out, "v2\n");
    let e = fake
        .run_check("missing", 2, &args(&["x"]), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "image missing: check `x` failed: exit status 1: ctr: image \"missing\": not found"
    );
    fake.with_image("broken");
    let e = fake
        .run_check("broken", 3, &args(&["x"]), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "image broken: check `x` failed: exit status 1: segfault"
    );
    fake.remove(REF).await.unwrap();
    assert!(!fake.exists(REF).await.unwrap());
    insta::assert_snapshot!("fake_transcript", fake.transcript());
}
