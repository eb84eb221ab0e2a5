//! Unit tests: resolution tables (URLs, versions, overrides, templates, sources), tar member
//! names, and the skip rules against [`FakeHost`] (recording runner scripting `--version`
//! outputs, real files under a temporary root, no network).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::archive::{MemberNameError, clean_member_name};
use super::download::parse_checksum;
use super::offline::{BundleIndex, bundle_specs};
use super::*;
use crate::config::{Config, OfflineArtifacts};
use crate::machine::seams::ProbeError;
use flex_host::retry::Backoff;
use flex_host::runner::Output;
use flex_host::secret::redact_url;
use flex_testkit::FakeHost;

fn config(k8s: &str) -> Config {
    let mut c = Config::default();
    c.components.kubernetes = k8s.into();
    c
}

fn offline_config(k8s: &str, source: &str) -> Config {
    let mut c = config(k8s);
    c.bootstrap.offline_artifacts = Some(OfflineArtifacts {
        source: source.into(),
    });
    c
}

/// The URLs of the required components (node-problem-detector has its own tests).
fn urls(plan: &ComponentPlan) -> Vec<String> {
    plan.specs()
        .unwrap()
        .iter()
        .filter(|s| s.component != Component::Npd)
        .flat_map(|s| s.payload.locations())
        .map(|l| match l {
            Location::Url(u) => u.clone(),
            Location::File(p) => p.display().to_string(),
        })
        .collect()
}

#[test]
fn default_urls_follow_the_upstream_table() {
    for arch in ["amd64", "arm64"] {
        let plan = ComponentPlan::resolve(&config("v1.35.2"), arch, Downloads::default()).unwrap();
        let k = format!("https://dl.k8s.io/v1.35.2/bin/linux/{arch}");
        assert_eq!(
            urls(&plan),
            vec![
                format!("{k}/kubelet"),
                format!("{k}/kubelet.sha256"),
                format!("{k}/kubectl"),
                format!("{k}/kubectl.sha256"),
                format!("{k}/kube-proxy"),
                format!("{k}/kube-proxy.sha256"),
                format!(
                    "https://github.com/kubernetes-sigs/cri-tools/releases/download/v1.35.0/crictl-v1.35.0-linux-{arch}.tar.gz"
                ),
                format!(
                    "https://github.com/containerd/containerd/releases/download/v2.1.8/containerd-2.1.8-linux-{arch}.tar.gz"
                ),
                format!(
                    "https://github.com/opencontainers/runc/releases/download/v1.5.0/runc.{arch}"
                ),
                format!(
                    "https://github.com/containernetworking/plugins/releases/download/v1.5.1/cni-plugins-linux-{arch}-v1.5.1.tgz"
                ),
            ],
            "{arch}"
        );
    }
}

#[test]
fn destinations_and_skip_rules_follow_the_upstream_table() {
    let plan = ComponentPlan::resolve(&config("1.35.0"), "amd64", Downloads::default()).unwrap();
    let k = plan.spec(Component::Kubernetes).unwrap();
    let Payload::Verified(bins) = &k.payload else {
        panic!("{k:?}")
    };
    let dests: Vec<_> = bins.iter().map(|b| b.dest.clone()).collect();
    assert_eq!(
        dests,
        ["kubelet", "kubectl", "kube-proxy"]
            .map(|b| PathBuf::from("usr/local/bin").join(b))
            .to_vec()
    );
    assert_eq!(
        k.skip,
        SkipRule::Version {
            executables: ["kubelet", "kubectl", "kube-proxy"]
                .map(|b| PathBuf::from("usr/local/bin").join(b))
                .to_vec(),
            probe: "usr/local/bin/kubelet".into(),
            expect: VersionMatch::Kubernetes("1.35.0".into()),
        }
    );
    let c = plan.spec(Component::Crictl).unwrap();
    assert!(
        matches!(&c.payload, Payload::Archive { members: Members::Named(n), dest_dir, .. } if n == "crictl" && dest_dir == Path::new("usr/local/bin"))
    );
    assert!(
        matches!(&c.skip, SkipRule::Version { expect: VersionMatch::ThirdField(v), .. } if v == "v1.35.0")
    );
    let c = plan.spec(Component::Containerd).unwrap();
    assert!(
        matches!(&c.payload, Payload::Archive { members: Members::Under(p), .. } if p == "bin/")
    );
    let SkipRule::Version {
        executables,
        probe,
        expect,
    } = &c.skip
    else {
        panic!()
    };
    assert_eq!(executables.len(), 4);
    assert_eq!(probe, Path::new("usr/local/bin/containerd"));
    assert_eq!(expect, &VersionMatch::Contains("2.1.8".into()));
    let c = plan.spec(Component::Runc).unwrap();
    assert_eq!(
        c.payload,
        Payload::File {
            source: Location::Url(
                "https://github.com/opencontainers/runc/releases/download/v1.5.0/runc.amd64".into()
            ),
            dest: "usr/local/bin/runc".into()
        }
    );
    let c = plan.spec(Component::Cni).unwrap();
    assert!(
        matches!(&c.payload, Payload::Archive { members: Members::AllRegular, dest_dir, .. } if dest_dir == Path::new("opt/cni/bin"))
    );
    let SkipRule::Version {
        executables, probe, ..
    } = &c.skip
    else {
        panic!()
    };
    assert_eq!(
        executables,
        &["bridge", "host-local", "loopback"]
            .map(|p| PathBuf::from("opt/cni/bin").join(p))
            .to_vec()
    );
    assert_eq!(probe, Path::new("opt/cni/bin/loopback"));
}

#[test]
fn base_url_overrides_keep_the_layout() {
    let mut d = Downloads::default();
    d.kubernetes.base_url = "https://mirror.example/k8s/".into();
    d.crictl.base_url = "https://mirror.example/crictl".into();
    d.containerd.base_url = "http://10.0.0.5:8080/containerd".into();
    d.runc.base_url = "https://mirror.example/runc".into();
    d.cni.base_url = "https://mirror.example/cni".into();
    let plan = ComponentPlan::resolve(&config("1.34.1"), "arm64", d).unwrap();
    assert_eq!(
        urls(&plan),
        vec![
            "https://mirror.example/k8s/v1.34.1/bin/linux/arm64/kubelet",
            "https://mirror.example/k8s/v1.34.1/bin/linux/arm64/kubelet.sha256",
            "https://mirror.example/k8s/v1.34.1/bin/linux/arm64/kubectl",
            "https://mirror.example/k8s/v1.34.1/bin/linux/arm64/kubectl.sha256",
            "https://mirror.example/k8s/v1.34.1/bin/linux/arm64/kube-proxy",
            "https://mirror.example/k8s/v1.34.1/bin/linux/arm64/kube-proxy.sha256",
            "https://mirror.example/crictl/v1.34.0/crictl-v1.34.0-linux-arm64.tar.gz",
            "http://10.0.0.5:8080/containerd/v2.1.8/containerd-2.1.8-linux-arm64.tar.gz",
            "https://mirror.example/runc/v1.5.0/runc.arm64",
            "https://mirror.example/cni/v1.5.1/cni-plugins-linux-arm64-v1.5.1.tgz",
        ]
    );
}

#[test]
fn url_overrides_get_the_upstream_format_arguments() {
    let mut d = Downloads::default();
    d.kubernetes.url = "https://m/k/%s/%s/%s".into();
    d.crictl.url = "https://m/c/%s/%s-%s-%s".into();
    d.containerd.url = "https://m/d/%s/%s/%s".into();
    d.runc.url = "https://m/r/%s/%s".into();
    d.cni.url = "https://m/n/%s/%s/%s".into();
    d.runc.base_url = "https://ignored".into();
    let plan = ComponentPlan::resolve(&config("1.35.0"), "amd64", d).unwrap();
    assert_eq!(
        urls(&plan),
        vec![
            "https://m/k/1.35.0/amd64/kubelet",
            "https://m/k/1.35.0/amd64/kubelet.sha256",
            "https://m/k/1.35.0/amd64/kubectl",
            "https://m/k/1.35.0/amd64/kubectl.sha256",
            "https://m/k/1.35.0/amd64/kube-proxy",
            "https://m/k/1.35.0/amd64/kube-proxy.sha256",
            "https://m/c/1.35.0/1.35.0-linux-amd64",
            "https://m/d/2.1.8/2.1.8/amd64",
            "https://m/r/1.5.0/amd64",
            "https://m/n/1.5.1/amd64/1.5.1",
        ]
    );
}

#[test]
fn override_errors_name_the_field() {
    let mut d = Downloads::default();
    d.runc.url = "https://m/r/%s/%s/%s".into();
    let e = ComponentPlan::resolve(&config("1.35.0"), "amd64", d).unwrap_err();
    assert!(e.to_string().starts_with("downloads.runc.url: "), "{e}");
    let mut d = Downloads::default();
    d.cni.base_url = "ftp://x".into();
    let e = ComponentPlan::resolve(&config("1.35.0"), "amd64", d).unwrap_err();
    assert!(e.to_string().starts_with("downloads.cni.baseURL: "), "{e}");
    let mut d = Downloads::default();
    d.containerd.version = "../../etc".into();
    let e = ComponentPlan::resolve(&config("1.35.0"), "amd64", d).unwrap_err();
    assert!(
        e.to_string().starts_with("downloads.containerd.version: "),
        "{e}"
    );
}

#[test]
fn go_format_table() {
    let args = ["1.2.3", "amd64", "kubelet"];
    for (t, want) in [
        ("%s/%s/%s", "1.2.3/amd64/kubelet"),
        ("%v-%v", "1.2.3-amd64"),
        ("%[3]s:%[1]s", "kubelet:1.2.3"),
        ("%[2]s/%s", "amd64/kubelet"),
        ("100%%", "100%"),
        ("a%2Fb/%s", "a%2Fb/1.2.3"),
        ("tail%", "tail%"),
    ] {
        assert_eq!(go_format(t, &args).unwrap(), want, "{t}");
    }
    for bad in ["%s%s%s%s", "%[4]s", "%[0]s", "%[x]s", "%[1"] {
        assert!(go_format(bad, &args).is_err(), "{bad}");
    }
    assert_eq!(
        go_format("%[4]s", &args),
        Err(FormatError::IndexOutOfRange { index: 4, given: 3 })
    );
    assert_eq!(
        go_format("%[x]s", &args),
        Err(FormatError::MalformedIndex { offset: 0 })
    );
}

#[test]
fn urls_are_redacted_in_messages() {
    assert_eq!(
        redact_url("https://user:pw@m.example/a/b?sig=abc&se=1"),
        "https://***@m.example/a/b?***"
    );
    assert_eq!(redact_url("https://m.example/a"), "https://m.example/a");
    assert_eq!(redact_url("not a url?token=1"), "not a url?***");
    assert_eq!(
        Location::Url("https://m/x?sas=secret".into()).to_string(),
        "https://m/x?***"
    );
}

#[test]
fn versions_strip_v_apply_defaults_and_overrides() {
    let v = Versions::resolve(&config(" v1.35.0 "), &Downloads::default()).unwrap();
    assert_eq!(
        v,
        Versions {
            kubernetes: "1.35.0".into(),
            containerd: "2.1.8".into(),
            runc: "1.5.0".into(),
            cni: "1.5.1".into(),
            crictl: "1.35.0".into(),
        }
    );
    let mut c = config("1.34.7");
    c.components.containerd = "v2.0.4".into();
    c.components.runc = "1.1.12".into();
    c.networking.cni_version = "1.4.0".into();
    let v = Versions::resolve(&c, &Downloads::default()).unwrap();
    assert_eq!(
        (
            v.containerd.as_str(),
            v.runc.as_str(),
            v.cni.as_str(),
            v.crictl.as_str()
        ),
        ("2.0.4", "1.1.12", "1.4.0", "1.34.0")
    );
    let mut d = Downloads::default();
    d.crictl.version = "v1.33.1".into();
    d.runc.version = "1.2.0".into();
    d.kubernetes.version = "1.36.0".into();
    let v = Versions::resolve(&c, &d).unwrap();
    assert_eq!(
        (v.kubernetes.as_str(), v.crictl.as_str(), v.runc.as_str()),
        ("1.36.0", "1.33.1", "1.2.0")
    );
}

#[test]
fn a_validated_config_keeps_its_runc_default() {
    let json = br#"{"azure":{"targetCluster":{"resourceId":"/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c"},"bootstrapToken":{"token":"abcdef.0123456789abcdef"}},
        "components":{"kubernetes":"1.35.0"},"node":{"kubelet":{"clusterFQDN":"x.example","caCertData":"Zm9v"}}}"#;
    let loaded = crate::config::parse(json, &|| Ok("node-1".into())).unwrap();
    let v = Versions::resolve(&loaded.config, &Downloads::default()).unwrap();
    assert_eq!(v.runc, "1.1.12");
}

#[test]
fn kubernetes_version_is_required_and_checked() {
    let e = ComponentPlan::resolve(&config(""), "amd64", Downloads::default()).unwrap_err();
    assert_eq!(e.to_string(), "components.kubernetes: is required");
    let e = ComponentPlan::resolve(&config("latest"), "amd64", Downloads::default()).unwrap_err();
    assert!(e.to_string().starts_with("components.kubernetes: "), "{e}");
    assert_eq!(crictl_version_for("v1.35.2").unwrap(), "1.35.0");
    assert_eq!(crictl_version_for("1.9").unwrap(), "1.9.0");
    assert!(crictl_version_for("1").is_err());
}

#[test]
fn architectures() {
    assert_eq!(super::arch_from_rust("x86_64").unwrap(), "amd64");
    assert_eq!(super::arch_from_rust("aarch64").unwrap(), "arm64");
    assert!(super::arch_from_rust("riscv64").is_err());
    assert!(host_arch().is_ok() || !matches!(std::env::consts::ARCH, "x86_64" | "aarch64"));
    let e = ComponentPlan::resolve(&config("1.35.0"), "x86_64", Downloads::default()).unwrap_err();
    assert!(matches!(e, ComponentsError::UnsupportedArch(_)), "{e}");
}

#[test]
fn source_template_expansion() {
    for (t, want) in [
        ("/b/{{ .KubernetesVersion }}", "/b/v1.35.0"),
        ("/b/{{.KubernetesVersion}}", "/b/v1.35.0"),
        ("/b/{{.KubernetesVersionNoV}}.tgz", "/b/1.35.0.tgz"),
        (
            "oci://r/b:{{   .KubernetesVersion   }}-{{ .KubernetesVersionNoV }}",
            "oci://r/b:v1.35.0-1.35.0",
        ),
        ("/plain", "/plain"),
    ] {
        assert_eq!(expand_source_template(t, "1.35.0").unwrap(), want, "{t}");
        assert_eq!(expand_source_template(t, "v1.35.0").unwrap(), want, "{t}");
    }
    for bad in ["/b/{{ .Version }}", "/b/{{ .KubernetesVersion", "/b/{{}}"] {
        let e = expand_source_template(bad, "1.35.0").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("bootstrap.offlineArtifacts.source: "),
            "{e}"
        );
    }
}

#[test]
fn offline_source_kinds() {
    use OfflineSource::*;
    for (s, want) in [
        ("/opt/bundle", Directory("/opt/bundle".into())),
        ("/opt/bundle.tar.gz", Archive("/opt/bundle.tar.gz".into())),
        ("/opt/b.TGZ", Archive("/opt/b.TGZ".into())),
        ("file:///opt/bundle", Directory("/opt/bundle".into())),
        ("file:///opt/b%20c.tgz", Archive("/opt/b c.tgz".into())),
        ("file://localhost/opt/x", Directory("/opt/x".into())),
        (
            "oci://ghcr.io/x/bundle:v1",
            Oci("oci://ghcr.io/x/bundle:v1".into()),
        ),
    ] {
        assert_eq!(OfflineSource::parse(s).unwrap(), want, "{s}");
    }
    for bad in [
        "relative/dir",
        "https://host/bundle.tgz",
        "file://otherhost/x",
        "oci://",
        "",
    ] {
        let e = OfflineSource::parse(bad).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("bootstrap.offlineArtifacts.source: "),
            "{bad}: {e}"
        );
    }
}

#[test]
fn offline_plan_keeps_the_expanded_source_and_given_versions() {
    let plan = ComponentPlan::resolve(
        &offline_config("1.35.0", "file:///b/{{ .KubernetesVersion }}.tgz"),
        "amd64",
        Downloads::default(),
    )
    .unwrap();
    assert!(plan.is_offline());
    let PlanSource::Offline {
        source, versions, ..
    } = &plan.source
    else {
        panic!()
    };
    assert_eq!(source, &OfflineSource::Archive("/b/v1.35.0.tgz".into()));
    assert_eq!(versions.kubernetes, "1.35.0");
    assert_eq!(versions.runc, None);
    assert_eq!(versions.containerd, None);
}

#[test]
fn tar_member_names() {
    for (raw, want) in [
        ("bin/ctr", Some("bin/ctr")),
        ("./bridge", Some("bridge")),
        ("./", None),
        (".", None),
        ("a/./b/", Some("a/b")),
    ] {
        assert_eq!(
            clean_member_name(raw.as_bytes()).unwrap().as_deref(),
            want,
            "{raw}"
        );
    }
    for bad in [
        &b"../x"[..],
        b"a/../b",
        b"/etc/passwd",
        b"a\\b",
        b"a\0b",
        b"\xff",
    ] {
        assert!(clean_member_name(bad).is_err(), "{bad:?}");
    }
    for (bad, want) in [
        (&b"../x"[..], MemberNameError::DotDot("../x".into())),
        (
            b"/etc/passwd",
            MemberNameError::Absolute("/etc/passwd".into()),
        ),
        (b"a\xffb", MemberNameError::NotUtf8("a\u{fffd}b".into())),
    ] {
        assert_eq!(clean_member_name(bad), Err(want));
    }
}

#[test]
fn version_output_matching() {
    let k = VersionMatch::Kubernetes("1.35.0".into());
    assert!(k.matches("Kubernetes v1.35.0\n"));
    assert!(!k.matches("Kubernetes v1.35.1"));
    assert!(!k.matches("Kubernetes v1.35.0 extra"));
    let c = VersionMatch::ThirdField("v1.35.0".into());
    assert!(c.matches("crictl version v1.35.0\n"));
    assert!(!c.matches("crictl version 1.35.0"));
    let s = VersionMatch::Contains("2.1.8".into());
    assert!(s.matches("containerd github.com/containerd/containerd/v2 v2.1.8 abc"));
    assert!(!VersionMatch::Contains(String::new()).matches("anything"));
}

#[test]
fn checksum_files() {
    let h = "a".repeat(64);
    assert_eq!(parse_checksum(h.as_bytes()).unwrap(), h);
    assert_eq!(
        parse_checksum(format!("{}  kubelet\n", "AB".repeat(32)).as_bytes()).unwrap(),
        "ab".repeat(32)
    );
    assert!(parse_checksum(b"abc").is_err());
    assert!(parse_checksum("g".repeat(64).as_bytes()).is_err());
}

#[test]
fn retry_backoff_doubles_up_to_the_cap() {
    let r = DOWNLOAD_RETRY;
    assert_eq!(r.max_attempts(), 4);
    let d: Vec<_> = (1..=5).map(|n| r.delay(n, None).as_secs()).collect();
    assert_eq!(d, vec![1, 2, 4, 8, 10]);
}

// --- skip rules against FakeHost -------------------------------------------------------------

const ROOTFS: &str = "/var/lib/machines/kube1";

fn exe(fake: &FakeHost, rel: &str, content: &str) {
    let p = fake.host.fs.path(&Path::new(ROOTFS).join(rel));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, content).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn probe_prefix(fake: &FakeHost, rel: &str) -> String {
    format!(
        "{} --version",
        fake.host.fs.path(&Path::new(ROOTFS).join(rel)).display()
    )
}

/// Installs everything a skip rule looks at and scripts the `--version` outputs.
fn installed_everything(fake: &FakeHost) {
    for b in [
        "usr/local/bin/kubelet",
        "usr/local/bin/kubectl",
        "usr/local/bin/kube-proxy",
        "usr/local/bin/crictl",
        "usr/local/bin/ctr",
        "usr/local/bin/containerd",
        "usr/local/bin/containerd-shim-runc-v2",
        "usr/local/bin/containerd-stress",
        "usr/local/bin/runc",
        "opt/cni/bin/bridge",
        "opt/cni/bin/host-local",
        "opt/cni/bin/loopback",
    ] {
        exe(fake, b, "#!/bin/sh\n");
    }
    let r = &fake.runner;
    r.on(
        &probe_prefix(fake, "usr/local/bin/kubelet"),
        Output::ok("Kubernetes v1.35.0\n"),
    );
    r.on(
        &probe_prefix(fake, "usr/local/bin/crictl"),
        Output::ok("crictl version v1.35.0\n"),
    );
    r.on(
        &probe_prefix(fake, "usr/local/bin/containerd"),
        Output::ok("containerd github.com/containerd/containerd/v2 v2.1.8 0123abc\n"),
    );
    r.on(
        &probe_prefix(fake, "usr/local/bin/runc"),
        Output::ok("runc version 1.5.0\ncommit: v1.5.0-0\nspec: 1.2.1\n"),
    );
    r.on(
        &probe_prefix(fake, "opt/cni/bin/loopback"),
        Output::ok("CNI loopback plugin v1.5.1\nCNI protocol versions supported: 1.0.0\n"),
    );
}

/// An online plan whose URLs point at a closed local port: any download fails at once.
fn unreachable_plan() -> ComponentPlan {
    let mut d = Downloads::default();
    for s in [
        &mut d.kubernetes,
        &mut d.crictl,
        &mut d.containerd,
        &mut d.runc,
        &mut d.cni,
    ] {
        s.base_url = "http://127.0.0.1:9/none".into();
    }
    let mut plan = ComponentPlan::resolve(&config("1.35.0"), "amd64", d).unwrap();
    plan.retry = Backoff::none();
    plan
}

struct NoFetcher;

fn no_registry(reference: &str) -> flex_oci::OciError {
    flex_oci::OciError::Layout {
        reference: reference.into(),
        dir: "/nonexistent".into(),
        reason: "no registry in this test".into(),
    }
}

#[async_trait::async_trait]
impl ArtifactFetcher for NoFetcher {
    async fn check(&self, r: &str) -> Result<(), flex_oci::OciError> {
        Err(no_registry(r))
    }

    async fn fetch(&self, r: &str, _: &Path) -> Result<(), flex_oci::OciError> {
        Err(no_registry(r))
    }
}

async fn install(fake: &FakeHost, plan: &ComponentPlan) -> Result<InstallReport, ComponentsError> {
    std::fs::create_dir_all(fake.host.fs.path(Path::new(ROOTFS))).unwrap();
    let http = flex_host::http::client().unwrap();
    install_components_with(&fake.host, &http, &NoFetcher, Path::new(ROOTFS), plan).await
}

#[tokio::test]
async fn fake_runner_matching_versions_skip_every_component_without_network() {
    let fake = FakeHost::new().unwrap();
    installed_everything(&fake);
    let report = install(&fake, &unreachable_plan()).await.unwrap();
    assert!(report.all_already_installed(), "{report:?}");
    assert_eq!(report.components.len(), 5);
    let calls = fake.runner.calls();
    assert_eq!(calls.len(), 5, "{calls:?}");
    assert!(calls.contains(&probe_prefix(&fake, "usr/local/bin/kubelet")));
    assert!(calls.contains(&probe_prefix(&fake, "opt/cni/bin/loopback")));
    // The staging directory is gone.
    let root = fake.host.fs.path(Path::new(ROOTFS));
    assert!(std::fs::read_dir(&root).unwrap().all(|e| {
        !e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(STAGING_PREFIX)
    }));
}

#[tokio::test]
async fn fake_runner_version_mismatches_reinstall_only_those_components() {
    let fake = FakeHost::new().unwrap();
    installed_everything(&fake);
    fake.runner.on(
        &probe_prefix(&fake, "usr/local/bin/kubelet"),
        Output::ok("Kubernetes v1.34.2\n"),
    );
    fake.runner.on(
        &probe_prefix(&fake, "usr/local/bin/runc"),
        Output::failed(1, "boom"),
    );
    let err = install(&fake, &unreachable_plan()).await.unwrap_err();
    let mut failed: Vec<_> = err.failures().iter().map(|f| f.component).collect();
    failed.dedup();
    assert_eq!(
        failed,
        vec![Component::Kubernetes, Component::Runc],
        "{err}"
    );
    assert!(
        err.failures()
            .iter()
            .all(|f| f.step == Step::DownloadChecksum || f.step == Step::Download)
    );
    let msg = err.to_string();
    assert!(msg.contains("kubernetes: download checksum http://127.0.0.1:9/none/v1.35.0/bin/linux/amd64/kubelet.sha256: request failed"), "{msg}");
    assert!(
        msg.contains("runc: download http://127.0.0.1:9/none/v1.5.0/runc.amd64"),
        "{msg}"
    );
}

#[tokio::test]
async fn fake_runner_missing_or_non_executable_files_are_not_installed() {
    let fake = FakeHost::new().unwrap();
    installed_everything(&fake);
    // kube-proxy not executable, containerd-stress missing, host-local missing.
    let p = fake
        .host
        .fs
        .path(&Path::new(ROOTFS).join("usr/local/bin/kube-proxy"));
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::remove_file(
        fake.host
            .fs
            .path(&Path::new(ROOTFS).join("usr/local/bin/containerd-stress")),
    )
    .unwrap();
    std::fs::remove_file(
        fake.host
            .fs
            .path(&Path::new(ROOTFS).join("opt/cni/bin/host-local")),
    )
    .unwrap();
    let err = install(&fake, &unreachable_plan()).await.unwrap_err();
    let mut failed: Vec<_> = err.failures().iter().map(|f| f.component).collect();
    failed.dedup();
    assert_eq!(
        failed,
        vec![Component::Kubernetes, Component::Containerd, Component::Cni],
        "{err}"
    );
    // Probes ran only where every required file is executable.
    let calls = fake.runner.calls();
    assert!(
        !calls.contains(&probe_prefix(&fake, "usr/local/bin/kubelet")),
        "{calls:?}"
    );
    assert!(
        calls.contains(&probe_prefix(&fake, "usr/local/bin/crictl")),
        "{calls:?}"
    );
}

#[tokio::test]
async fn fake_runner_crictl_needs_the_exact_third_field() {
    let fake = FakeHost::new().unwrap();
    installed_everything(&fake);
    fake.runner.on(
        &probe_prefix(&fake, "usr/local/bin/crictl"),
        Output::ok("crictl version v1.35.0-rc.1\n"),
    );
    let err = install(&fake, &unreachable_plan()).await.unwrap_err();
    assert_eq!(err.failures().len(), 1, "{err}");
    assert_eq!(err.failures()[0].component, Component::Crictl);
}

// --- offline bundles against FakeHost ----------------------------------------------------------

fn write(fake: &FakeHost, host_path: &str, content: &[u8]) {
    let p = fake.host.fs.path(Path::new(host_path));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

fn sha(content: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(content))
}

fn tgz(members: &[(&str, &[u8])]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o755);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

/// A bundle directory at host path `dir` with every component.
fn bundle(fake: &FakeHost, dir: &str) {
    for bin in ["kubelet", "kubectl", "kube-proxy"] {
        let body = format!("#!/bin/sh\necho {bin}\n");
        write(fake, &format!("{dir}/kubernetes/{bin}"), body.as_bytes());
        write(
            fake,
            &format!("{dir}/kubernetes/{bin}.sha256"),
            format!("{}  {bin}\n", sha(body.as_bytes())).as_bytes(),
        );
    }
    write(
        fake,
        &format!("{dir}/crictl-v1.35.0-linux-amd64.tar.gz"),
        &tgz(&[("crictl", b"crictl")]),
    );
    write(
        fake,
        &format!("{dir}/containerd-2.0.5-linux-amd64.tar.gz"),
        &tgz(&[("bin/containerd", b"c"), ("bin/ctr", b"ctr")]),
    );
    write(fake, &format!("{dir}/runc.amd64"), b"runc-binary");
    write(
        fake,
        &format!("{dir}/cni-plugins-linux-amd64-v1.6.0.tgz"),
        &tgz(&[("./loopback", b"lo"), ("./bridge", b"br")]),
    );
}

#[tokio::test]
async fn offline_directory_versions_come_from_file_names() {
    let fake = FakeHost::new().unwrap();
    bundle(&fake, "/srv/bundles/v1.35.0");
    let plan = ComponentPlan::resolve(
        &offline_config("1.35.0", "/srv/bundles/{{ .KubernetesVersion }}"),
        "amd64",
        Downloads::default(),
    )
    .unwrap();
    let report = install(&fake, &plan).await.unwrap();
    let versions: Vec<_> = report
        .components
        .iter()
        .map(|c| (c.component, c.version.clone()))
        .collect();
    assert_eq!(
        versions,
        vec![
            (Component::Kubernetes, Some("1.35.0".into())),
            (Component::Crictl, Some("1.35.0".into())),
            (Component::Containerd, Some("2.0.5".into())),
            (Component::Runc, None),
            (Component::Cni, Some("1.6.0".into())),
        ]
    );
    let fs = &fake.host.fs;
    let r = Path::new(ROOTFS);
    assert_eq!(
        fs.read(&r.join("usr/local/bin/runc")).unwrap().unwrap(),
        b"runc-binary"
    );
    assert_eq!(fs.mode(&r.join("usr/local/bin/runc")), Some(0o755));
    assert_eq!(
        fs.read(&r.join("usr/local/bin/ctr")).unwrap().unwrap(),
        b"ctr"
    );
    assert_eq!(
        fs.read(&r.join("opt/cni/bin/bridge")).unwrap().unwrap(),
        b"br"
    );
    assert_eq!(
        fs.mode(Path::new("/var/lib/machines/kube1/opt/cni/bin")),
        Some(0o755)
    );
    // Nothing was probed for runc: the same bytes are already there.
    let again = install(&fake, &plan).await.unwrap();
    assert_eq!(
        again.get(Component::Runc).unwrap().outcome,
        Outcome::AlreadyInstalled
    );
}

/// Real files under the fake host's temporary root; the runner is the recording fake (no
/// `--version` output is scripted, so every probe says "not installed"), the bundle is a real
/// offline directory. The image made `usr/local/bin` an absolute symlink to a host directory
/// and `opt/cni` a relative one that climbs out of the machine: the binaries land in the
/// machine (the absolute link resolved as in a chroot), the CNI plugins are refused, and
/// nothing is written, or taken as already installed, outside the machine.
#[tokio::test]
async fn image_symlinks_never_lead_installs_outside_the_rootfs() {
    let fake = FakeHost::new().unwrap();
    bundle(&fake, "/b");
    let machine = fake.host.fs.path(Path::new(ROOTFS));
    let outside = fake.root.path().join("outside");
    std::fs::create_dir_all(machine.join("usr/local")).unwrap();
    std::fs::create_dir_all(machine.join("opt")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    // Already "installed" on the host side: the same bytes as the bundle's runc.
    std::fs::write(outside.join("runc"), b"runc-binary").unwrap();
    std::fs::set_permissions(outside.join("runc"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(&outside, machine.join("usr/local/bin")).unwrap();
    // From <root>/var/lib/machines/kube1/opt: up five levels is <root>.
    std::os::unix::fs::symlink("../../../../../outside", machine.join("opt/cni")).unwrap();
    assert!(machine.join("opt/cni").is_dir(), "the link leads out");
    let plan = ComponentPlan::resolve(
        &offline_config("1.35.0", "/b"),
        "amd64",
        Downloads::default(),
    )
    .unwrap();
    let e = install(&fake, &plan).await.unwrap_err().to_string();
    assert!(e.contains("cni"), "{e}");
    assert!(!e.contains("kubernetes:"), "{e}");
    let mut names: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["runc"], "wrote onto the host");
    let inside = machine.join(outside.strip_prefix("/").unwrap());
    assert_eq!(std::fs::read(inside.join("runc")).unwrap(), b"runc-binary");
    assert!(inside.join("kubelet").is_file());
    assert!(inside.join("containerd").is_file());
}

#[tokio::test]
async fn a_missing_rootfs_is_an_error_and_is_not_created() {
    let fake = FakeHost::new().unwrap();
    let http = flex_host::http::client().unwrap();
    let e = install_components_with(
        &fake.host,
        &http,
        &NoFetcher,
        Path::new(ROOTFS),
        &unreachable_plan(),
    )
    .await
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "machine root file system /var/lib/machines/kube1 does not exist"
    );
    assert!(!fake.host.fs.exists(Path::new(ROOTFS)));
}

#[tokio::test]
async fn offline_missing_files_are_named() {
    let fake = FakeHost::new().unwrap();
    bundle(&fake, "/b");
    std::fs::remove_file(fake.host.fs.path(Path::new("/b/runc.amd64"))).unwrap();
    std::fs::remove_file(fake.host.fs.path(Path::new("/b/kubernetes/kubectl.sha256"))).unwrap();
    let mut c = offline_config("1.35.0", "/b");
    c.components.containerd = "2.1.8".into();
    let plan = ComponentPlan::resolve(&c, "amd64", Downloads::default()).unwrap();
    let e = install(&fake, &plan).await.unwrap_err().to_string();
    for needle in [
        "kubernetes: required file kubernetes/kubectl.sha256 is missing",
        "containerd: required file containerd-2.1.8-linux-amd64.tar.gz is missing",
        "runc: required file runc.amd64 is missing",
    ] {
        assert!(e.contains(needle), "{needle}: {e}");
    }
    // Nothing was installed.
    assert!(
        !fake
            .host
            .fs
            .exists(Path::new("/var/lib/machines/kube1/usr"))
    );
}

#[test]
fn offline_patterns_and_ambiguity() {
    let idx = BundleIndex::from_archive_names(vec![
        "top/kubernetes/kubelet".into(),
        "top/cni-plugins-linux-amd64-v1.5.1.tgz".into(),
        "top/cni-plugins-linux-amd64-v1.6.0.tgz".into(),
    ]);
    let req = RequestedVersions {
        kubernetes: "1.35.0".into(),
        containerd: None,
        runc: None,
        cni: None,
        crictl: None,
    };
    let e = bundle_specs(&idx, Path::new("/x"), &req, "amd64")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("kubernetes: required file kubernetes/kubelet.sha256 is missing"),
        "{e}"
    );
    assert!(
        e.contains("crictl: required file crictl-v*-linux-amd64.tar.gz is missing"),
        "{e}"
    );
    assert!(e.contains("containerd-*-linux-amd64.tar.gz"), "{e}");
    assert!(
        e.contains("cni-plugins: several versions in the bundle (1.5.1, 1.6.0)"),
        "{e}"
    );
}

#[test]
fn offline_unbounded_builder_layout_is_accepted() {
    // The layout of unbounded's agent-artifacts-builder: `<component>/v<version>/<asset>`.
    let mut names: Vec<String> = ["kubelet", "kubectl", "kube-proxy"]
        .iter()
        .flat_map(|b| {
            let p = format!("kubernetes/v1.35.0/bin/linux/amd64/{b}");
            [format!("{p}.sha256"), p]
        })
        .collect();
    names.extend(
        [
            "manifest.json",
            "crictl/v1.35.0/crictl-v1.35.0-linux-amd64.tar.gz",
            "containerd/v2.1.8/containerd-2.1.8-linux-amd64.tar.gz",
            "runc/v1.5.0/runc.amd64",
            "cni/v1.5.1/cni-plugins-linux-amd64-v1.5.1.tgz",
            "cni/v1.5.1/cni-plugins-linux-arm64-v1.5.1.tgz",
        ]
        .map(String::from),
    );
    let idx = BundleIndex::from_archive_names(names);
    let req = RequestedVersions {
        kubernetes: "1.35.0".into(),
        containerd: None,
        runc: None,
        cni: Some("1.5.1".into()),
        crictl: None,
    };
    let specs = bundle_specs(&idx, Path::new("/x"), &req, "amd64").unwrap();
    let got: Vec<_> = specs
        .iter()
        .map(|s| {
            (
                s.component,
                s.version.clone(),
                s.payload.locations()[0].to_string(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                Component::Kubernetes,
                Some("1.35.0".into()),
                "/x/kubernetes/v1.35.0/bin/linux/amd64/kubelet".into()
            ),
            (
                Component::Crictl,
                Some("1.35.0".into()),
                "/x/crictl/v1.35.0/crictl-v1.35.0-linux-amd64.tar.gz".into()
            ),
            (
                Component::Containerd,
                Some("2.1.8".into()),
                "/x/containerd/v2.1.8/containerd-2.1.8-linux-amd64.tar.gz".into()
            ),
            (
                Component::Runc,
                Some("1.5.0".into()),
                "/x/runc/v1.5.0/runc.amd64".into()
            ),
            (
                Component::Cni,
                Some("1.5.1".into()),
                "/x/cni/v1.5.1/cni-plugins-linux-amd64-v1.5.1.tgz".into()
            ),
        ]
    );
    // A version nobody has is a missing file named as the flat layout names it.
    let req = RequestedVersions {
        runc: Some("1.4.0".into()),
        ..req
    };
    let e = bundle_specs(&idx, Path::new("/x"), &req, "amd64")
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "offline artifact bundle: runc: required file runc.amd64 is missing"
    );
}

struct DirFetcher(PathBuf);

#[async_trait::async_trait]
impl ArtifactFetcher for DirFetcher {
    async fn check(&self, _: &str) -> Result<(), flex_oci::OciError> {
        Ok(())
    }

    async fn fetch(&self, reference: &str, dest: &Path) -> Result<(), flex_oci::OciError> {
        assert_eq!(reference, "oci://registry.local/bundle:v1.35.0");
        // Copies a prepared bundle, as the registry client would unpack it.
        let mut stack = vec![self.0.clone()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap() {
                let p = e.unwrap().path();
                let rel = p.strip_prefix(&self.0).unwrap();
                if p.is_dir() {
                    std::fs::create_dir_all(dest.join(rel)).unwrap();
                    stack.push(p);
                } else {
                    std::fs::copy(&p, dest.join(rel)).unwrap();
                }
            }
        }
        Ok(())
    }
}

#[tokio::test]
async fn offline_oci_goes_through_the_fetcher_and_its_errors_name_the_field() {
    let fake = FakeHost::new().unwrap();
    bundle(&fake, "/prepared");
    let plan = ComponentPlan::resolve(
        &offline_config(
            "1.35.0",
            "oci://registry.local/bundle:{{ .KubernetesVersion }}",
        ),
        "amd64",
        Downloads::default(),
    )
    .unwrap();
    let http = flex_host::http::client().unwrap();
    let fetcher = DirFetcher(fake.host.fs.path(Path::new("/prepared")));
    std::fs::create_dir_all(fake.host.fs.path(Path::new(ROOTFS))).unwrap();
    let report = install_components_with(&fake.host, &http, &fetcher, Path::new(ROOTFS), &plan)
        .await
        .unwrap();
    assert_eq!(report.components.len(), 5);
    let e = install(&fake, &plan).await.unwrap_err().to_string();
    assert_eq!(
        e,
        "bootstrap.offlineArtifacts.source: fetch oci://registry.local/bundle:v1.35.0: oci://registry.local/bundle:v1.35.0: OCI layout /nonexistent: no registry in this test"
    );
}

#[tokio::test]
async fn preflight_offline_bundle_checks_name_missing_files_without_paths() {
    let fake = FakeHost::new().unwrap();
    bundle(&fake, "/b");
    std::fs::remove_file(
        fake.host
            .fs
            .path(Path::new("/b/cni-plugins-linux-amd64-v1.6.0.tgz")),
    )
    .unwrap();
    let plan = ComponentPlan::resolve(
        &offline_config("1.35.0", "/b"),
        "amd64",
        Downloads::default(),
    )
    .unwrap();
    let http = flex_host::http::client().unwrap();
    let results = check_reachable_with(&fake.host.fs, &NoFetcher, &http, &plan).await;
    assert_eq!(results[0], ("kubernetes-artifacts".to_string(), Ok(())));
    assert_eq!(results[1], ("cri-artifacts".to_string(), Ok(())));
    assert_eq!(
        results[2],
        (
            "cni-artifacts".to_string(),
            Err(ProbeError::Unreachable("offline artifact bundle: cni-plugins: required file cni-plugins-linux-amd64-v*.tgz is missing".to_string()))
        )
    );
    let plan = ComponentPlan::resolve(
        &offline_config("1.35.0", "/nope"),
        "amd64",
        Downloads::default(),
    )
    .unwrap();
    let results = check_reachable_with(&fake.host.fs, &NoFetcher, &http, &plan).await;
    for (_, r) in results {
        let m = r.unwrap_err().to_string();
        assert!(
            m.starts_with("offline artifact bundle cannot be read"),
            "{m}"
        );
        assert!(!m.contains("/nope"), "{m}");
    }
}

/// `npd`'s defaults, as loading a config sets them.
fn npd_defaults(c: &mut Config) {
    c.npd.version = crate::config::DEFAULT_NPD_VERSION.into();
    c.npd.base_url = crate::config::DEFAULT_NPD_BASE_URL.into();
}

/// node-problem-detector's archive as upstream's release has it (with other members).
fn npd_archive() -> Vec<u8> {
    tgz(&[
        ("bin/node-problem-detector", b"#!/bin/sh\necho v1.35.1\n"),
        ("bin/health-checker", b"hc"),
        ("config/kernel-monitor.json", b"{\"plugin\":\"kmsg\"}"),
        ("config/docker-monitor.json", b"{}"),
    ])
}

#[test]
fn npd_url_is_upstreams_and_moves_with_base_url_and_its_checksum_is_the_sidecar_or_pinned() {
    let mut c = config("1.35.0");
    npd_defaults(&mut c);
    let plan = ComponentPlan::resolve(&c, "arm64", Downloads::default()).unwrap();
    let npd = plan.spec(Component::Npd).unwrap();
    let url = "https://github.com/kubernetes/node-problem-detector/releases/download/v1.35.1/node-problem-detector-v1.35.1-linux_arm64.tar.gz";
    let Payload::Archive {
        source, checksum, ..
    } = &npd.payload
    else {
        panic!("{npd:?}")
    };
    assert_eq!(source, &Location::Url(url.into()));
    assert_eq!(
        checksum,
        &Some(Checksum::File(Location::Url(format!("{url}.sha256"))))
    );
    c.npd.base_url = "http://10.0.2.2:8080/npd/".into();
    c.npd.sha256 = "AB".repeat(32);
    let plan = ComponentPlan::resolve(&c, "amd64", Downloads::default()).unwrap();
    let Payload::Archive {
        source, checksum, ..
    } = &plan.spec(Component::Npd).unwrap().payload
    else {
        panic!()
    };
    assert_eq!(
        source,
        &Location::Url(
            "http://10.0.2.2:8080/npd/v1.35.1/node-problem-detector-v1.35.1-linux_amd64.tar.gz"
                .into()
        )
    );
    assert_eq!(checksum, &Some(Checksum::Pinned("AB".repeat(32))));
}

#[test]
fn npd_config_errors_name_the_field() {
    let base = include_str!("../../../tests/fixtures/config-token.json");
    for (key, value, field) in [
        ("version", "v1.2/../x", "npd.version"),
        ("version", "latest", "npd.version"),
        ("baseURL", "ftp://mirror/npd", "npd.baseURL"),
        ("baseURL", "https://user:pw@", "npd.baseURL"),
        ("sha256", "abc", "npd.sha256"),
    ] {
        let mut v: serde_json::Value = serde_json::from_str(base).unwrap();
        v["npd"] = serde_json::json!({ key: value });
        let e = crate::config::parse(v.to_string().as_bytes(), &|| Ok("h".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains(field), "{key}={value}: {e}");
        assert!(!e.contains(":pw@"), "{e}");
    }
}

/// [`unreachable_plan`] (every required component already installed in the tests that use
/// it) with node-problem-detector from `base_url`, pinned to `sha256` when it is not empty.
fn npd_plan(base_url: String, sha256: &str) -> ComponentPlan {
    let mut c = config("1.35.0");
    npd_defaults(&mut c);
    c.npd.base_url = base_url;
    c.npd.sha256 = sha256.into();
    let npd = ComponentPlan::resolve(&c, "amd64", Downloads::default())
        .unwrap()
        .spec(Component::Npd)
        .unwrap()
        .clone();
    let mut plan = unreachable_plan();
    let PlanSource::Online { specs, .. } = &mut plan.source else {
        panic!()
    };
    specs.retain(|s| s.component != Component::Npd);
    specs.push(npd);
    plan
}

/// A 200 with `body`.
fn ok(body: Vec<u8>) -> flex_testkit::http::Reply {
    flex_testkit::http::Reply {
        status: 200,
        headers: vec![],
        body,
    }
}

/// A real local HTTP server serves the archive and its `.sha256`; the other components are
/// already installed (recording runner, real files). node-problem-detector's two files land in
/// the rootfs with their modes; nothing else of the archive does.
#[tokio::test]
async fn npd_from_a_local_http_server_is_verified_then_installed() {
    let archive = npd_archive();
    let server = flex_testkit::http::ScriptedServer::start(vec![
        ok(format!("{}  node-problem-detector.tar.gz\n", sha(&archive)).into_bytes()),
        ok(archive),
    ])
    .unwrap();
    let fake = FakeHost::new().unwrap();
    installed_everything(&fake);
    let plan = npd_plan(server.url("/npd"), "");
    let report = install(&fake, &plan).await.unwrap();
    assert!(matches!(
        report.get(Component::Npd).unwrap().outcome,
        Outcome::Installed { .. }
    ));
    let paths: Vec<String> = server
        .requests()
        .iter()
        .map(|r| r.path().to_string())
        .collect();
    assert_eq!(
        paths,
        [
            "/npd/v1.35.1/node-problem-detector-v1.35.1-linux_amd64.tar.gz.sha256",
            "/npd/v1.35.1/node-problem-detector-v1.35.1-linux_amd64.tar.gz"
        ]
    );
    let fs = &fake.host.fs;
    let r = Path::new(ROOTFS);
    assert_eq!(fs.mode(&r.join(NPD_BIN)), Some(0o755));
    assert_eq!(fs.mode(&r.join(NPD_KERNEL_MONITOR)), Some(0o644));
    assert_eq!(
        fs.read(&r.join(NPD_KERNEL_MONITOR)).unwrap().unwrap(),
        b"{\"plugin\":\"kmsg\"}"
    );
    assert!(!fs.exists(&r.join("usr/local/bin/health-checker")));
    assert!(!fs.exists(&r.join("etc/node-problem-detector/docker-monitor.json")));
}

/// The pinned checksum does not match the served archive: the install still succeeds for the
/// node (node-problem-detector is optional), reports nothing for it, and writes none of its
/// files. A bundle without it turns it off; one with it and its `.sha256` installs it.
#[tokio::test]
async fn npd_checksum_mismatch_installs_nothing_and_bundles_carry_it_or_turn_it_off() {
    let server = flex_testkit::http::ScriptedServer::start(vec![ok(npd_archive())]).unwrap();
    let fake = FakeHost::new().unwrap();
    installed_everything(&fake);
    let plan = npd_plan(server.url("/npd"), &"0".repeat(64));
    let report = install(&fake, &plan).await.unwrap();
    assert!(report.get(Component::Npd).is_none(), "{report:?}");
    assert_eq!(server.requests().len(), 1);
    assert!(!fake.host.fs.exists(&Path::new(ROOTFS).join(NPD_BIN)));

    // Offline: the bundle of the other tests has no node-problem-detector.
    let fake = FakeHost::new().unwrap();
    bundle(&fake, "/srv/b");
    let mut c = offline_config("1.35.0", "/srv/b");
    npd_defaults(&mut c);
    let plan = ComponentPlan::resolve(&c, "amd64", Downloads::default()).unwrap();
    let report = install(&fake, &plan).await.unwrap();
    assert!(report.get(Component::Npd).is_none());
    // With it under `npd/<version>/` and its checksum beside it.
    let archive = npd_archive();
    let asset = "/srv/b/npd/v1.35.1/node-problem-detector-v1.35.1-linux_amd64.tar.gz";
    write(&fake, asset, &archive);
    write(
        &fake,
        &format!("{asset}.sha256"),
        format!("{}\n", sha(&archive)).as_bytes(),
    );
    let report = install(&fake, &plan).await.unwrap();
    assert_eq!(
        report.get(Component::Npd).unwrap().version.as_deref(),
        Some("v1.35.1")
    );
    assert_eq!(
        fake.host
            .fs
            .mode(&Path::new(ROOTFS).join(NPD_KERNEL_MONITOR)),
        Some(0o644)
    );
}
