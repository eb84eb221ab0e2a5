//! Host routing's scripts (`static-routes.sh`, `check-route-overlap.sh`) as the agent renders
//! them from a config: shellcheck-clean as POSIX sh, and run for real by `/bin/sh` with the
//! real `ip` in a network namespace of the test's own (`unshare -n`; root), with veth pairs
//! (this kernel has no dummy links) and a default route: the routes appear (their gateway and interface taken from the
//! default route where the config leaves them out), `del` removes them, and the overlap check
//! records an expected network that leaves through the default route's interface, failing only
//! in STRICT mode. Nothing is faked; the systemd side is `flows/setup_host`'s fake-host tests.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::path::Path;

use aks_flex_node::config::routing::{RoutingPlan, plan};
use aks_flex_node::config::{HostRouting, RouteOverlap, StaticRoute, StaticRoutes};
use aks_flex_node::flows::setup_host::routing::{render_overlap_check_to, render_static_routes};
use flex_host::hostinfo::{HostInfo, RealHostInfo};
use flex_host::runner::{Cmd, Output, ProcessRunner, Runner};

fn routing(mode: &str) -> RoutingPlan {
    let route = |destination: &str, gateway: &str, dev: &str, metric: Option<u32>| StaticRoute {
        destination: destination.into(),
        gateway: gateway.into(),
        dev: dev.into(),
        metric,
    };
    plan(&HostRouting {
        static_routes: StaticRoutes {
            enabled: true,
            routes: vec![
                // Gateway and interface from the default route.
                route("10.1.0.0/16", "", "", None),
                // Its own gateway, the default route's interface.
                route("10.2.0.0/16", "192.168.5.9", "", Some(50)),
                // Everything given.
                route("10.3.0.0/24", "192.168.7.1", "link1", Some(70)),
            ],
        },
        route_overlap: RouteOverlap {
            // 10.1/16 leaves through link0 (the default route's): an overlap. 10.3.0.0/24 goes
            // through link1: none.
            expected_cidrs: vec!["10.1.0.0/16".into(), "10.3.0.0/24".into()],
            mode: mode.into(),
        },
    })
    .unwrap()
}

async fn sh(script: &str) -> Output {
    ProcessRunner::new()
        .output(&Cmd::new("unshare").args(["-n", "sh", "-c", script]))
        .await
        .unwrap()
}

#[tokio::test]
async fn the_rendered_scripts_are_shellcheck_clean_posix_sh() {
    let r = ProcessRunner::new();
    assert!(
        r.which("shellcheck").is_some(),
        "shellcheck is not installed: apt-get install shellcheck (CI installs it)"
    );
    let dir = tempfile::tempdir().unwrap();
    let p = routing("STRICT");
    for (name, text) in [
        ("static-routes.sh", render_static_routes(&p.routes)),
        (
            "check-route-overlap.sh",
            render_overlap_check_to(&p, "/run/x.detected", "/run/x.ok"),
        ),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, &text).unwrap();
        let out = r
            .output(&Cmd::new("shellcheck").args(["-s", "sh", path.to_str().unwrap()]))
            .await
            .unwrap();
        assert!(
            out.success(),
            "{name}:\n{text}\nshellcheck:\n{}{}",
            out.stdout,
            out.stderr
        );
    }
}

/// The namespace's network: `link0` 192.168.5.2/24 with the default route via 192.168.5.1,
/// `link1` 192.168.7.2/24.
const NETWORK: &str = "set -e
ip link add link0 type veth peer name link0p
ip link add link1 type veth peer name link1p
for l in link0 link0p link1 link1p; do ip link set $l up; done
ip addr add 192.168.5.2/24 dev link0
ip addr add 192.168.7.2/24 dev link1
ip route add default via 192.168.5.1 dev link0
set +e
";

#[tokio::test]
async fn real_ip_in_a_network_namespace_adds_removes_and_checks_the_routes() {
    if RealHostInfo.euid() != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "needs root (unshare -n, ip link add): CI runs as root"
        );
        println!("skipped: needs root");
        return;
    }
    let r = ProcessRunner::new();
    assert!(
        r.which("ip").is_some() && r.which("unshare").is_some(),
        "needs ip and unshare: apt-get install iproute2 util-linux (CI installs them)"
    );
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let write = |name: &str, text: &str| {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    for mode in ["WARN", "STRICT"] {
        let p = routing(mode);
        let routes = write("static-routes.sh", &render_static_routes(&p.routes));
        let detected = d.join(format!("{mode}.detected"));
        let ok = d.join(format!("{mode}.ok"));
        let check = write(
            "check.sh",
            &render_overlap_check_to(&p, detected.to_str().unwrap(), ok.to_str().unwrap()),
        );
        let out = sh(&format!(
            "{NETWORK}
sh {routes}; echo \"add=$?\"
echo ---added; ip -4 route show
sh {check}; echo \"check=$?\"
sh {routes} del; echo \"del=$?\"
echo ---deleted; ip -4 route show
"
        ))
        .await;
        let text = format!("{}{}", out.stdout, out.stderr);
        assert!(out.success(), "{text}");
        let (added, deleted) = out
            .stdout
            .split_once("---added")
            .and_then(|(_, rest)| rest.split_once("---deleted"))
            .unwrap_or_else(|| panic!("{text}"));
        for want in [
            "10.1.0.0/16 via 192.168.5.1 dev link0",
            "10.2.0.0/16 via 192.168.5.9 dev link0 metric 50",
            "10.3.0.0/24 via 192.168.7.1 dev link1 metric 70",
        ] {
            assert!(added.contains(want), "{mode}: no route {want:?} in\n{text}");
        }
        assert!(text.contains("add=0"), "{text}");
        assert!(text.contains("del=0"), "{text}");
        for gone in ["10.1.0.0/16", "10.2.0.0/16", "10.3.0.0/24"] {
            assert!(
                !deleted.contains(gone),
                "{mode}: {gone} left after del:\n{text}"
            );
        }
        assert!(
            deleted.contains("default via 192.168.5.1 dev link0"),
            "del took more than its routes:\n{text}"
        );
        // The overlap: 10.1.0.1 leaves through link0, the default route's interface.
        let found = std::fs::read_to_string(&detected)
            .unwrap_or_else(|e| panic!("{mode}: no {}: {e}\n{text}", detected.display()));
        assert!(
            found.contains("10.1.0.0/16: 10.1.0.1 routes through link0"),
            "{found}"
        );
        assert!(!found.contains("10.3.0.0/24"), "{found}");
        assert!(!Path::new(&ok).exists());
        let want = if mode == "STRICT" {
            "check=1"
        } else {
            "check=0"
        };
        assert!(text.contains(want), "{mode}: want {want}:\n{text}");
    }

    // No expected network routes through the default interface, or no default route: ok.
    let p = plan(&HostRouting {
        route_overlap: RouteOverlap {
            expected_cidrs: vec!["10.9.0.0/16".into()],
            mode: "STRICT".into(),
        },
        ..HostRouting::default()
    })
    .unwrap();
    for (setup, why) in [
        (
            format!("{NETWORK}ip route add 10.9.0.0/16 dev link1\n"),
            "no expected network routes through link0",
        ),
        (String::new(), "no IPv4 default route"),
    ] {
        let detected = d.join("n.detected");
        let ok = d.join("n.ok");
        let check = write(
            "check-none.sh",
            &render_overlap_check_to(&p, detected.to_str().unwrap(), ok.to_str().unwrap()),
        );
        let out = sh(&format!("{setup}sh {check}")).await;
        assert!(out.success(), "{out:?}");
        assert!(!detected.exists());
        let said = std::fs::read_to_string(&ok).unwrap();
        assert!(said.contains(why), "{said}");
    }
}
