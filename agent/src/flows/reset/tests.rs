//! Reset through the fakes: the commands, systemd calls and file removals of a reset on a node
//! with both machines, network leftovers and runtime directories, and a second reset that
//! changes nothing.

use std::path::Path;

use super::*;
use crate::machine::nspawn::{bpffs_dir, dropin_dir, machine_dir, nspawn_file};
use flex_host::runner::Output;
use flex_testkit::FakeHost;
use flex_testkit::tree_snapshot;

const IPTABLES_SAVE: &str = r#"*nat
:POSTROUTING ACCEPT [0:0]
:CNI-4a1f2e3d5c6b7a8e9f0a1b2c - [0:0]
-A POSTROUTING -s 10.244.0.5/32 -m comment --comment "name: \"bridge\" id: \"abc\"" -j CNI-4a1f2e3d5c6b7a8e9f0a1b2c
-A POSTROUTING -s 10.1.0.0/16 -m comment --comment "name: \"other\" id: \"x\"" -j CNI-keepme
-A CNI-4a1f2e3d5c6b7a8e9f0a1b2c -d 10.244.0.0/24 -m comment --comment "name: \"bridge\" id: \"abc\"" -j ACCEPT
-A CNI-4a1f2e3d5c6b7a8e9f0a1b2c ! -d 224.0.0.0/4 -m comment --comment "name: \"bridge\" id: \"abc\"" -j MASQUERADE
COMMIT
"#;

const POSTROUTING: &str = "Chain POSTROUTING (policy ACCEPT)
num  target     prot opt source               destination
1    KUBE-POSTROUTING  all  --  0.0.0.0/0            0.0.0.0/0
2    CNI-4a1f2e3d5c6b7a8e9f0a1b2c  all  --  10.244.0.5           0.0.0.0/0            /* name: \"bridge\" id: \"abc\" */
3    CNI-keepme  all  --  10.1.0.0/16          0.0.0.0/0
";

const NFT: &str = "table inet cni_plugins_masquerade {
\tchain masq_checks { # handle 2
\t\tip saddr 10.244.0.5 ip daddr != 10.244.0.0/24 masquerade comment \"net: bridge, if: eth0, id: abc\" # handle 5
\t\tip saddr 10.9.0.5 masquerade comment \"net: other, if: eth0, id: x\" # handle 6
\t}
}
";

fn populated() -> FakeHost {
    let f = FakeHost::new().unwrap();
    let fs = &f.host.fs;
    for m in crate::machine::nspawn::MACHINES {
        fs.write_atomic(&machine_dir(m).join("etc/hostname"), b"n\n", 0o644)
            .unwrap();
        fs.write_atomic(&nspawn_file(m), b"[Exec]\n", 0o644)
            .unwrap();
        fs.write_atomic(&dropin_dir(m).join("override.conf"), b"[Service]\n", 0o644)
            .unwrap();
        fs.create_dir_all(&bpffs_dir(m)).unwrap();
    }
    fs.write_atomic(Path::new("/etc/aks-flex-node/config.json"), b"{}", 0o600)
        .unwrap();
    fs.write_atomic(
        Path::new("/var/log/aks-flex-node/aks-flex-node.log"),
        b"log",
        0o600,
    )
    .unwrap();
    fs.write_atomic(Path::new("/etc/wireguard/server.priv"), b"k", 0o600)
        .unwrap();
    fs.write_atomic(Path::new("/etc/wireguard/server.pub"), b"k", 0o644)
        .unwrap();
    fs.write_atomic(Path::new("/etc/hosts"), b"127.0.0.1 localhost\n", 0o644)
        .unwrap();
    f.runner.on_seq(
        "machinectl list",
        vec![
            Output::ok("kube1 container systemd-nspawn debian 12 -\n"),
            Output::ok("kube1 container systemd-nspawn debian 12 -\n"),
            Output::ok(""),
        ],
    );
    f.systemd.set_active("systemd-nspawn@kube1.service");
    f.runner
        .on("mountpoint -q /run/bpffs/kube1", Output::ok(""));
    f.runner
        .on("mountpoint -q /run/bpffs/kube2", Output::failed(32, ""));
    f.runner.on(
        "ip -o link show",
        Output::ok("1: lo: <LOOPBACK,UP> mtu 65536\n2: eth0: <BROADCAST> mtu 1500\n3: wg0: <POINTOPOINT> mtu 1420\n4: vxlan0: <BROADCAST> mtu 1450\n5: veth1@if2: <BROADCAST> mtu 1500\n6: wgx: <X> mtu 1\n"),
    );
    f.runner.on(
        "ip -4 rule show",
        Output::ok("0:\tfrom all lookup local\n100:\tfrom all fwmark 0x1 lookup 51898\n101:\tfrom all lookup 51898\n32766:\tfrom all lookup main\n"),
    );
    f.runner.on_seq(
        "ip rule del table 51898",
        vec![
            Output::ok(""),
            Output::ok(""),
            Output::failed(2, "RTNETLINK answers: No such file or directory"),
        ],
    );
    f.runner.on(
        "ip -4 route show table all",
        Output::ok("10.0.0.0/8 dev wg0 table 51898 scope link\n10.1.0.0/16 dev eth1 table 51830\ndefault via 10.0.0.1 dev eth0\n"),
    );
    f.runner
        .on("ip link show dev cni0", Output::ok("7: cni0: <BROADCAST>"));
    f.runner
        .on("iptables-save -t nat", Output::ok(IPTABLES_SAVE));
    f.runner.on(
        "iptables --wait -t nat -L POSTROUTING",
        Output::ok(POSTROUTING),
    );
    f.runner.on("nft -a list chain", Output::ok(NFT));
    f.runner.without("azcmagent");
    f
}

#[tokio::test]
async fn reset_of_a_populated_node() {
    let f = populated();
    reset_node(&f.host, Timings::instant()).await.unwrap();
    insta::assert_snapshot!("reset_commands", f.runner.transcript());
    insta::assert_snapshot!("reset_systemd", f.systemd.calls().join("\n"));
    // Only what reset does not own is left.
    insta::assert_snapshot!("reset_files_left", tree_snapshot(f.root.path()));
}

#[tokio::test]
async fn second_reset_succeeds_and_changes_nothing() {
    let f = populated();
    reset_node(&f.host, Timings::instant()).await.unwrap();
    let after_first = tree_snapshot(f.root.path());
    f.runner.clear();
    // A clean host: nothing registered, no links, rules or chains.
    let g = FakeHost::new().unwrap();
    g.runner.without("azcmagent");
    g.runner.on("mountpoint", Output::failed(32, ""));
    g.runner.on(
        "ip link show dev cni0",
        Output::failed(1, "Device \"cni0\" does not exist."),
    );
    reset_node(&g.host, Timings::instant()).await.unwrap();
    reset_node(&g.host, Timings::instant()).await.unwrap();
    let mutating: Vec<_> = g
        .runner
        .calls()
        .into_iter()
        .filter(|c| {
            c.contains(" delete")
                || c.contains(" del ")
                || c.contains("flush")
                || c.contains("remove")
                || c.starts_with("umount")
                || c.contains("terminate")
        })
        .collect();
    assert!(mutating.is_empty(), "a clean reset mutated: {mutating:?}");
    assert_eq!(after_first, tree_snapshot(f.root.path()));
}

#[test]
fn parsers_table() {
    assert_eq!(
        parse_link_names("1: lo: <X>\n5: veth1@if2: <Y>\n"),
        vec!["lo".to_string(), "veth1".to_string()]
    );
    assert!(is_wireguard("wg0") && is_wireguard("wg12"));
    assert!(!is_wireguard("wg") && !is_wireguard("wgx") && !is_wireguard("eth0"));
    assert_eq!(
        tables_in_range("x lookup 51898\ny table 51820 z\nw lookup 51900\nv lookup main"),
        [51820, 51898].into_iter().collect()
    );
    assert_eq!(
        legacy_bridge_chains(IPTABLES_SAVE),
        vec!["CNI-4a1f2e3d5c6b7a8e9f0a1b2c".to_string()]
    );
    assert_eq!(
        postrouting_rules_to_delete(POSTROUTING, &legacy_bridge_chains(IPTABLES_SAVE)),
        vec![2]
    );
    assert_eq!(legacy_nft_handles(NFT), vec![5]);
    // The unescaped comment form (IPTABLES_SAVE above has iptables-save's escaped form).
    let plain = r#"-A POSTROUTING -m comment --comment 'name: "bridge"' -j CNI-aa"#;
    assert_eq!(legacy_bridge_chains(plain), vec!["CNI-aa".to_string()]);
}

#[tokio::test]
async fn arc_is_removed_when_detected() {
    let f = FakeHost::new().unwrap();
    f.host
        .fs
        .write_atomic(Path::new("/opt/azcmagent/bin/azcmagent"), b"", 0o755)
        .unwrap();
    f.host
        .fs
        .write_atomic(Path::new("/var/lib/GuestConfig/x"), b"", 0o644)
        .unwrap();
    uninstall_arc(&f.host).await.unwrap();
    assert!(!f.host.fs.exists(Path::new("/opt/azcmagent")));
    assert!(!f.host.fs.exists(Path::new("/var/lib/GuestConfig")));
    assert!(
        f.runner
            .calls()
            .contains(&"azcmagent disconnect --force-local-only".to_string())
    );
    assert!(
        f.runner
            .calls()
            .contains(&"dpkg --purge azcmagent".to_string())
    );
    assert!(
        f.systemd
            .calls()
            .contains(&"disable himdsd.service".to_string())
    );
}

/// A real tmpfs mount stands in for the container's bind mount of a runtime dir (root only;
/// skipped with a message otherwise): it is emptied, and the host's directory (under /host)
/// is removed.
#[tokio::test]
async fn containerized_runtime_dirs_are_emptied_and_removed_on_the_host() {
    use flex_host::runner::{Cmd, ProcessRunner, Runner};
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let f = FakeHost::with_info(flex_testkit::FakeHostInfo {
        containerized: true,
        ..Default::default()
    })
    .unwrap();
    let fs = &f.host.fs;
    let d = Path::new("/etc/aks-flex-node");
    fs.create_dir_all(d).unwrap();
    fs.create_dir_all(Path::new("/host/etc/aks-flex-node"))
        .unwrap();
    let real = fs.path(d).display().to_string();
    let r = ProcessRunner::new();
    r.run(&Cmd::new("mount").args(["-t", "tmpfs", "tmpfs", &real]))
        .await
        .unwrap();
    fs.write_atomic(&d.join("config.json"), b"{}", 0o600)
        .unwrap();
    let result = remove_runtime_dirs(&f.host).await;
    let emptied = std::fs::read_dir(fs.path(d)).map(|mut e| e.next().is_none());
    r.run(&Cmd::new("umount").arg(&real)).await.unwrap();
    result.unwrap();
    assert!(emptied.unwrap(), "the mount point was not emptied");
    assert!(
        !fs.exists(Path::new("/host/etc/aks-flex-node")),
        "the host's directory remains"
    );
}

/// A reset cut short (here: `machinectl list` fails at its first machine step) has already
/// removed both bootstrap marks, so `bootstrap-node` no longer calls the node bootstrapped.
/// Real: the mark and state files in a temporary root. Faked: the runner (`machinectl` fails).
#[tokio::test]
async fn an_interrupted_reset_has_removed_the_bootstrap_marks() {
    use crate::flows::start::{BootstrapProgress, progress_on};
    use crate::state::{BootstrapMark, BootstrapMarkStore, DaemonState, StateStore};
    let f = FakeHost::new().unwrap();
    let fs = &f.host.fs;
    BootstrapMarkStore::started(fs.clone())
        .save(&BootstrapMark::now())
        .unwrap();
    StateStore::new(fs.clone())
        .save(&DaemonState {
            active_machine: "kube1".into(),
            ..Default::default()
        })
        .unwrap();
    BootstrapMarkStore::new(fs.clone())
        .save(&BootstrapMark::now())
        .unwrap();
    assert_eq!(progress_on(&f.host), BootstrapProgress::Complete);
    f.runner
        .on("machinectl list", Output::failed(1, "Failed to connect"));
    let e = reset_node(&f.host, Timings::instant()).await.unwrap_err();
    assert!(e.to_string().starts_with("stop-node-kube1: "), "{e}");
    for mark in [
        crate::state::BOOTSTRAP_MARK_PATH,
        crate::state::BOOTSTRAP_STARTED_PATH,
    ] {
        assert!(!fs.exists(Path::new(mark)), "{mark} is left");
    }
    assert_ne!(progress_on(&f.host), BootstrapProgress::Complete);
}
