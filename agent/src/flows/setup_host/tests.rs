//! setupHost through the fakes: the commands each task runs, the systemd calls and the files it
//! writes (real files under a temporary root), snapshot-tested.

use std::path::Path;

use super::*;
use flex_host::runner::Output;
use flex_testkit::FakeHost;
use flex_testkit::{FakeHostInfo, tree_snapshot};

fn config() -> Config {
    crate::config::parse(
        include_bytes!("../../../tests/fixtures/config-token.json"),
        &|| Ok("h".into()),
    )
    .unwrap()
    .config
}

#[tokio::test]
async fn setup_host_on_apt_host_installs_missing_and_writes_files() {
    let f = FakeHost::new().unwrap();
    f.runner.on(
        "dpkg-query --show --showformat=${db:Status-Status} curl",
        Output::ok("installed"),
    );
    f.runner.on(
        "dpkg-query --show --showformat=${db:Status-Status} util-linux",
        Output::ok("installed"),
    );
    f.runner.on(
        "dpkg-query --show --showformat=${db:Status-Status} nftables",
        Output::failed(1, "dpkg-query: no packages found matching nftables"),
    );
    std::fs::create_dir_all(f.root.path().join("etc")).unwrap();
    std::fs::write(
        f.root.path().join("etc/fstab"),
        "UUID=1 / ext4 defaults 0 1\n/swap.img none swap sw 0 0\n# old swap comment\n",
    )
    .unwrap();
    std::fs::create_dir_all(f.root.path().join("etc/docker")).unwrap();
    std::fs::write(
        f.root.path().join("etc/docker/daemon.json"),
        "{\"log-driver\": \"json-file\"}",
    )
    .unwrap();

    setup_host(&f.host, &config()).await.unwrap();

    insta::assert_snapshot!("setup_host_commands", f.runner.transcript());
    insta::assert_snapshot!("setup_host_systemd", f.systemd.calls().join("\n"));
    insta::assert_snapshot!("setup_host_files", tree_snapshot(f.root.path()));
}

#[tokio::test]
async fn setup_host_is_idempotent_on_files() {
    let f = FakeHost::new().unwrap();
    setup_host(&f.host, &config()).await.unwrap();
    let first = tree_snapshot(f.root.path());
    setup_host(&f.host, &config()).await.unwrap();
    assert_eq!(first, tree_snapshot(f.root.path()));
}

#[tokio::test]
async fn read_only_usr_checks_programs_and_lists_missing() {
    let f = FakeHost::with_info(FakeHostInfo {
        usr_read_only: true,
        ..Default::default()
    })
    .unwrap();
    f.runner.without("nft").without("mountpoint");
    let e = setup_host(&f.host, &config())
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "install-packages: host is missing required programs and packages cannot be installed here (/usr is read-only): nftables (provides nft), util-linux (provides mountpoint)"
    );
    assert!(
        f.runner.calls().is_empty(),
        "nothing run: {:?}",
        f.runner.calls()
    );
}

#[tokio::test]
async fn tdnf_host_uses_rpm_checks() {
    let f = FakeHost::new().unwrap();
    f.runner.without("apt-get");
    f.runner.on("rpm -q --quiet", Output::ok(""));
    f.runner
        .on("rpm -q --quiet nftables", Output::failed(1, ""));
    install_packages(&f.host, &config()).await.unwrap();
    insta::assert_snapshot!(f.runner.transcript(), @r"
    rpm -q --quiet systemd-container
    rpm -q --quiet curl
    rpm -q --quiet nftables
    rpm -q --quiet util-linux
    tdnf makecache
    tdnf install -y nftables
    ");
}

#[tokio::test]
async fn no_package_manager_falls_back_to_capabilities() {
    let f = FakeHost::new().unwrap();
    for pm in ["apt-get", "tdnf", "dnf", "curl"] {
        f.runner.without(pm);
    }
    let e = install_packages(&f.host, &config())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with("(no apt-get, tdnf or dnf on PATH): curl (provides curl)"),
        "{e}"
    );
}

#[tokio::test]
async fn container_mode_skips_install_packages() {
    let f = FakeHost::with_info(FakeHostInfo {
        containerized: true,
        ..Default::default()
    })
    .unwrap();
    setup_host(&f.host, &config()).await.unwrap();
    assert!(
        !f.runner
            .calls()
            .iter()
            .any(|c| c.contains("dpkg-query") || c.contains("apt-get")),
        "{:?}",
        f.runner.calls()
    );
}

#[tokio::test]
async fn failures_name_the_task() {
    let f = FakeHost::new().unwrap();
    f.runner.on(
        "sysctl --system",
        Output::failed(255, "sysctl: permission denied on key"),
    );
    let e = setup_host(&f.host, &config())
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "configure-os: sysctl --system failed: exit status 255: sysctl: permission denied on key"
    );
    let f = FakeHost::new().unwrap();
    f.systemd.fail_on("mask docker.socket docker.service");
    let e = setup_host(&f.host, &config())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("disable-docker: systemd mask docker.socket docker.service"),
        "{e}"
    );
}

#[tokio::test]
async fn docker_daemon_json_already_false_is_untouched() {
    let f = FakeHost::new().unwrap();
    let p = Path::new(DOCKER_DAEMON_JSON);
    f.host
        .fs
        .write_atomic(p, b"{\"iptables\":false}", 0o600)
        .unwrap();
    disable_docker(&f.host).await.unwrap();
    assert_eq!(f.host.fs.read(p).unwrap().unwrap(), b"{\"iptables\":false}");
    f.host.fs.write_atomic(p, b"[1]", 0o644).unwrap();
    assert!(disable_docker(&f.host).await.is_err());
}

#[test]
fn swap_lines_table() {
    let cases: &[(&str, Option<&str>)] = &[
        ("", None),
        ("UUID=1 / ext4 defaults 0 1\n", None),
        (
            "/swapfile none swap sw 0 0\n",
            Some("# /swapfile none swap sw 0 0\n"),
        ),
        ("# /swapfile none swap sw\n\n", None),
        (
            "a\n/dev/sdb2 none swap\nb",
            Some("a\n# /dev/sdb2 none swap\nb"),
        ),
    ];
    for (input, want) in cases {
        assert_eq!(os::comment_out_swap(input).as_deref(), *want, "{input:?}");
    }
}

#[tokio::test]
async fn arc_enabled_is_refused_clearly() {
    let mut c = config();
    c.azure.arc = Some(crate::config::ArcConfig {
        enabled: true,
        ..Default::default()
    });
    let e = install_arc(&c).await.unwrap_err().to_string();
    assert!(e.contains("not implemented"), "{e}");
}
