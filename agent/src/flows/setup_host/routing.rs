//! Host routing, as upstream's `pkg/hostrouting`: `configure-static-routes` (the routes of
//! `hostRouting.staticRoutes`, applied at every boot by `static-routes.service`) and
//! `check-route-overlap` (always installed: `check-route-overlap.service` probes the first
//! usable address of each `hostRouting.routeOverlap.expectedCidrs` network and records whether
//! it leaves through the default route's interface, failing in `STRICT` mode).
//!
//! The machines require both units (a drop-in for `systemd-nspawn@.service`, ordered after
//! them), so a route is in place before kubelet starts, and a STRICT overlap keeps the machines
//! from starting. The scripts are POSIX `sh` rendered from a [`RoutingPlan`], whose values are
//! all parsed (addresses, prefixes, numbers, interface names of `[A-Za-z0-9_.-]`) and are
//! single-quoted all the same. [`remove`] (`reset`) stops, disables and deletes the units, the
//! drop-in, the scripts and the result files; upstream's reset leaves the units enabled.

use std::path::Path;

use crate::config::routing::{OverlapMode, Route, RoutingPlan};
use flex_host::context::Host;

/// The static routes' unit.
pub const STATIC_ROUTES_UNIT: &str = "static-routes.service";
/// Where it is written.
pub const STATIC_ROUTES_UNIT_PATH: &str = "/etc/systemd/system/static-routes.service";
/// Its script.
pub const STATIC_ROUTES_SCRIPT: &str = "/etc/aks-flex-node/static-routes.sh";
/// The overlap check's unit.
pub const OVERLAP_UNIT: &str = "check-route-overlap.service";
/// Where it is written.
pub const OVERLAP_UNIT_PATH: &str = "/etc/systemd/system/check-route-overlap.service";
/// Its script.
pub const OVERLAP_SCRIPT: &str = "/etc/aks-flex-node/check-route-overlap.sh";
/// The drop-in that makes every nspawn machine require and follow the routing units.
pub const NSPAWN_DROPIN: &str =
    "/etc/systemd/system/systemd-nspawn@.service.d/50-aks-flex-node-host-routing.conf";
/// The overlap check's results: one of them exists after it ran.
pub const OVERLAP_DETECTED: &str = "/run/aks-flex-node/route-overlap.detected";
/// See [`OVERLAP_DETECTED`].
pub const OVERLAP_OK: &str = "/run/aks-flex-node/route-overlap.ok";

/// How long the static routes' script waits for a default route when a route takes its
/// gateway or interface from it (upstream: 30 tries a second apart).
pub const DEFAULT_ROUTE_TRIES: u32 = 30;

/// The shell function both scripts use: the IPv4 default route's gateway and interface
/// (`gw dev`, `gw` `-` when it has none), or nothing.
const DEFAULT_ROUTE_FN: &str = r#"default_route() {
  # shellcheck disable=SC2046 # the route's words, split on purpose
  set -- $(ip -4 route show default 2>/dev/null | head -n 1)
  gw=- dev=
  while [ $# -gt 0 ]; do
    case "$1" in
      via) gw=$2; shift ;;
      dev) dev=$2; shift ;;
    esac
    shift
  done
  [ -n "$dev" ] && echo "$gw $dev"
}
"#;

/// `static-routes.sh`: with no argument, `ip -4 route replace` for each route, a missing
/// gateway or interface taken from the default route (waited for up to
/// [`DEFAULT_ROUTE_TRIES`] seconds); every route is tried and the script fails if one failed.
/// With `del` (the unit's `ExecStop=`), `ip -4 route del` for each route, failures ignored: so
/// stopping the unit, as `reset` does, takes its routes away.
pub fn render_static_routes(routes: &[Route]) -> String {
    let mut s = String::from(
        "#!/bin/sh\n# Written by aks-flex-node from hostRouting.staticRoutes; run by static-routes.service.\nset -u\naction=${1:-add}\n",
    );
    s.push_str(DEFAULT_ROUTE_FN);
    s.push_str(&format!(
        r#"# route DESTINATION GATEWAY DEV METRIC (empty: from the default route; no metric)
route() {{
  dest=$1 gw=$2 dev=$3 metric=$4
  if [ "$action" = del ]; then
    set -- ip -4 route del "$dest"
    [ -z "$metric" ] || set -- "$@" metric "$metric"
    echo "static route removed: $*"
    "$@" 2>/dev/null
    return 0
  fi
  if [ -z "$gw" ] || [ -z "$dev" ]; then
    i=0 found=
    while [ $i -lt {DEFAULT_ROUTE_TRIES} ]; do
      found=$(default_route) && [ -n "$found" ] && break
      i=$((i + 1))
      sleep 1
    done
    if [ -z "$found" ]; then
      echo "static route $dest: no IPv4 default route to take its gateway or interface from" >&2
      return 1
    fi
    [ -n "$gw" ] || gw=${{found% *}}
    [ -n "$dev" ] || dev=${{found#* }}
  fi
  set -- ip -4 route replace "$dest"
  [ "$gw" = - ] || set -- "$@" via "$gw"
  set -- "$@" dev "$dev"
  [ -z "$metric" ] || set -- "$@" metric "$metric"
  echo "static route: $*"
  "$@"
}}
rc=0
"#
    ));
    for r in routes {
        let gw = r.gateway.map(|g| g.to_string()).unwrap_or_default();
        let dev = r.dev.clone().unwrap_or_default();
        let metric = r.metric.map(|m| m.to_string()).unwrap_or_default();
        s.push_str(&format!(
            "route '{}' '{gw}' '{dev}' '{metric}' || rc=1\n",
            r.destination
        ));
    }
    s.push_str("exit $rc\n");
    s
}

/// `check-route-overlap.sh`: for each expected network, `ip -4 route get` of its first usable
/// address; one that leaves through the default route's interface is an overlap. Writes
/// [`OVERLAP_DETECTED`] (the overlaps, one per line) or [`OVERLAP_OK`], and fails only in
/// `STRICT` mode with an overlap.
pub fn render_overlap_check(plan: &RoutingPlan) -> String {
    render_overlap_check_to(plan, OVERLAP_DETECTED, OVERLAP_OK)
}

/// [`render_overlap_check`] with its result files elsewhere (the tests run it in a network
/// namespace of their own, without the host's `/run`). The paths are written single-quoted.
pub fn render_overlap_check_to(plan: &RoutingPlan, detected: &str, ok: &str) -> String {
    let mut s = format!(
        "#!/bin/sh\n# Written by aks-flex-node from hostRouting.routeOverlap; run by check-route-overlap.service.\nset -u\nmode='{}'\n",
        plan.mode.as_str()
    );
    s.push_str(DEFAULT_ROUTE_FN);
    s.push_str(&format!(
        r#"detected='{detected}'
ok='{ok}'
mkdir -p "${{detected%/*}}"
rm -f "$detected" "$ok"
found=$(default_route)
default_dev=${{found#* }}
overlaps=
# check CIDR PROBE
check() {{
  [ -n "$default_dev" ] || return 0
  # shellcheck disable=SC2046 # the route's words, split on purpose
  set -- "$1" "$2" $(ip -4 route get "$2" 2>/dev/null | head -n 1)
  cidr=$1 probe=$2
  shift 2
  dev=
  while [ $# -gt 0 ]; do
    [ "$1" = dev ] && [ $# -gt 1 ] && dev=$2
    shift
  done
  if [ "$dev" = "$default_dev" ]; then
    overlaps="$overlaps$cidr: $probe routes through $dev, the default route's interface
"
  fi
}}
"#
    ));
    for c in &plan.expected {
        s.push_str(&format!("check '{c}' '{}'\n", c.first_usable()));
    }
    s.push_str(
        r#"if [ -z "$default_dev" ]; then
  echo "no IPv4 default route: nothing to compare the expected networks with" > "$ok"
  exit 0
fi
if [ -z "$overlaps" ]; then
  echo "no expected network routes through $default_dev, the default route's interface" > "$ok"
  exit 0
fi
printf '%s' "$overlaps" > "$detected"
printf 'route overlap (%s): %s' "$mode" "$overlaps" >&2
[ "$mode" = STRICT ] && exit 1
exit 0
"#,
    );
    s
}

fn service_unit(description: &str, after: &str, exec: &str) -> String {
    format!(
        "[Unit]\nDescription={description}\nWants=network-online.target\nAfter={after}\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\n{exec}\n[Install]\nWantedBy=multi-user.target\n"
    )
}

/// `static-routes.service`: adds the routes when started, removes them when stopped.
pub fn render_static_routes_unit() -> String {
    service_unit(
        "AKS Flex Node static routes (hostRouting.staticRoutes)",
        "network-online.target",
        &format!(
            "ExecStart=/bin/sh {STATIC_ROUTES_SCRIPT}\nExecStop=/bin/sh {STATIC_ROUTES_SCRIPT} del\n"
        ),
    )
}

/// `check-route-overlap.service`.
pub fn render_overlap_unit() -> String {
    service_unit(
        "AKS Flex Node route overlap check (hostRouting.routeOverlap)",
        "network-online.target static-routes.service",
        &format!("ExecStart=/bin/sh {OVERLAP_SCRIPT}\n"),
    )
}

/// The units the machines require and follow: the overlap check, and the static routes when
/// there are any.
pub fn required_units(plan: &RoutingPlan) -> Vec<&'static str> {
    let mut u = Vec::new();
    if !plan.routes.is_empty() {
        u.push(STATIC_ROUTES_UNIT);
    }
    u.push(OVERLAP_UNIT);
    u
}

/// The drop-in for `systemd-nspawn@.service`.
pub fn render_nspawn_dropin(plan: &RoutingPlan) -> String {
    let units = required_units(plan).join(" ");
    format!(
        "# Written by aks-flex-node: the machines start after the host's routes are set and checked.\n[Unit]\nRequires={units}\nAfter={units}\n"
    )
}

/// `configure-static-routes`: when there are routes, stops the unit an earlier config installed
/// (its script removes the earlier routes), writes the script and unit, and starts it; with
/// none, says so and removes an earlier unit and its routes.
pub async fn configure_static_routes(host: &Host, plan: &RoutingPlan) -> anyhow::Result<()> {
    if plan.routes.is_empty() {
        tracing::info!("no static routes configured; skipping");
        remove_unit(host, STATIC_ROUTES_UNIT, STATIC_ROUTES_UNIT_PATH).await?;
        host.fs.remove_file(Path::new(STATIC_ROUTES_SCRIPT))?;
        return Ok(());
    }
    if host.fs.exists(Path::new(STATIC_ROUTES_UNIT_PATH))
        && let Err(e) = host.systemd.stop(STATIC_ROUTES_UNIT).await
    {
        tracing::debug!(unit = STATIC_ROUTES_UNIT, error = %e, "stop failed (ignored)");
    }
    host.fs.write_atomic(
        Path::new(STATIC_ROUTES_SCRIPT),
        render_static_routes(&plan.routes).as_bytes(),
        0o755,
    )?;
    host.fs.write_atomic(
        Path::new(STATIC_ROUTES_UNIT_PATH),
        render_static_routes_unit().as_bytes(),
        0o644,
    )?;
    host.systemd.enable(STATIC_ROUTES_UNIT).await?;
    host.systemd.start(STATIC_ROUTES_UNIT).await?;
    tracing::info!(routes = plan.routes.len(), "static routes applied");
    Ok(())
}

/// `check-route-overlap`: writes the script, the unit and the machines' drop-in, and (re)runs
/// the check. In `STRICT` mode an overlap fails the task.
pub async fn check_route_overlap(host: &Host, plan: &RoutingPlan) -> anyhow::Result<()> {
    host.fs.write_atomic(
        Path::new(OVERLAP_SCRIPT),
        render_overlap_check(plan).as_bytes(),
        0o755,
    )?;
    host.fs.write_atomic(
        Path::new(OVERLAP_UNIT_PATH),
        render_overlap_unit().as_bytes(),
        0o644,
    )?;
    host.fs.write_atomic(
        Path::new(NSPAWN_DROPIN),
        render_nspawn_dropin(plan).as_bytes(),
        0o644,
    )?;
    host.systemd.enable(OVERLAP_UNIT).await?;
    if let Err(e) = host.systemd.restart(OVERLAP_UNIT).await {
        let why = host
            .fs
            .read(Path::new(OVERLAP_DETECTED))
            .ok()
            .flatten()
            .map(|b| String::from_utf8_lossy(&b).trim().to_string())
            .unwrap_or_default();
        anyhow::bail!(
            "{OVERLAP_UNIT} failed (hostRouting.routeOverlap.mode {}): {why} ({e})",
            plan.mode.as_str()
        );
    }
    if plan.mode == OverlapMode::Warn
        && let Ok(Some(b)) = host.fs.read(Path::new(OVERLAP_DETECTED))
    {
        tracing::warn!(
            overlaps = %String::from_utf8_lossy(&b).trim(),
            "expected networks route through the default route's interface (hostRouting.routeOverlap.mode WARN)"
        );
    }
    Ok(())
}

async fn remove_unit(host: &Host, unit: &str, path: &str) -> anyhow::Result<()> {
    if !host.fs.exists(Path::new(path)) {
        return Ok(());
    }
    if let Err(e) = host.systemd.stop(unit).await {
        tracing::debug!(unit, error = %e, "stop failed (ignored)");
    }
    if let Err(e) = host.systemd.disable(unit).await {
        tracing::debug!(unit, error = %e, "disable failed (ignored)");
    }
    host.fs.remove_file(Path::new(path))?;
    Ok(())
}

/// `reset`'s part: stops, disables and removes both units, the machines' drop-in, the scripts
/// and the result files (the caller reloads systemd afterwards). Absent ones are no error.
pub async fn remove(host: &Host) -> anyhow::Result<()> {
    remove_unit(host, STATIC_ROUTES_UNIT, STATIC_ROUTES_UNIT_PATH).await?;
    remove_unit(host, OVERLAP_UNIT, OVERLAP_UNIT_PATH).await?;
    for f in [
        NSPAWN_DROPIN,
        STATIC_ROUTES_SCRIPT,
        OVERLAP_SCRIPT,
        OVERLAP_DETECTED,
        OVERLAP_OK,
    ] {
        host.fs.remove_file(Path::new(f))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::routing::{Ipv4Cidr, plan};
    use crate::config::{HostRouting, RouteOverlap, StaticRoute, StaticRoutes};
    use flex_testkit::FakeHost;

    fn with(routes: &[&str], expected: &[&str], mode: &str) -> RoutingPlan {
        plan(&HostRouting {
            static_routes: StaticRoutes {
                enabled: !routes.is_empty(),
                routes: routes
                    .iter()
                    .map(|d| StaticRoute {
                        destination: d.to_string(),
                        ..StaticRoute::default()
                    })
                    .collect(),
            },
            route_overlap: RouteOverlap {
                expected_cidrs: expected.iter().map(|c| c.to_string()).collect(),
                mode: mode.into(),
            },
        })
        .unwrap()
    }

    #[test]
    fn scripts_and_units_snapshot() {
        let p = plan(&HostRouting {
            static_routes: StaticRoutes {
                enabled: true,
                routes: vec![
                    StaticRoute {
                        destination: "10.1.0.0/16".into(),
                        ..StaticRoute::default()
                    },
                    StaticRoute {
                        destination: "10.3.0.0/24".into(),
                        gateway: "192.168.7.1".into(),
                        dev: "eth1".into(),
                        metric: Some(70),
                    },
                ],
            },
            route_overlap: RouteOverlap {
                expected_cidrs: vec!["10.1.0.0/16".into()],
                mode: "strict".into(),
            },
        })
        .unwrap();
        insta::assert_snapshot!("static_routes_sh", render_static_routes(&p.routes));
        insta::assert_snapshot!("check_route_overlap_sh", render_overlap_check(&p));
        insta::assert_snapshot!(
            "units",
            format!(
                "{}---\n{}---\n{}",
                render_static_routes_unit(),
                render_overlap_unit(),
                render_nspawn_dropin(&p)
            )
        );
        assert_eq!(
            Ipv4Cidr::parse("10.1.0.0/16")
                .unwrap()
                .first_usable()
                .to_string(),
            "10.1.0.1"
        );
    }

    /// Fake host (recording systemd, files under a temporary root): what the two tasks and
    /// `reset`'s removal do, on a first bootstrap, a second one, one without routes, and a
    /// STRICT overlap.
    #[tokio::test]
    async fn the_tasks_install_rerun_and_remove_the_units() {
        let f = FakeHost::new().unwrap();
        let p = with(&["10.1.0.0/16"], &["10.2.0.0/16"], "");
        configure_static_routes(&f.host, &p).await.unwrap();
        check_route_overlap(&f.host, &p).await.unwrap();
        assert_eq!(
            f.systemd.calls(),
            [
                "enable static-routes.service",
                "start static-routes.service",
                "enable check-route-overlap.service",
                "restart check-route-overlap.service",
            ]
        );
        let file = |p: &str| std::fs::read_to_string(f.root.path().join(&p[1..])).ok();
        assert!(
            file(STATIC_ROUTES_SCRIPT)
                .unwrap()
                .contains("route '10.1.0.0/16' '' '' ''")
        );
        assert!(
            file(OVERLAP_SCRIPT)
                .unwrap()
                .contains("check '10.2.0.0/16' '10.2.0.1'")
        );
        assert_eq!(file(NSPAWN_DROPIN).unwrap().lines().nth(1), Some("[Unit]"));
        assert!(
            file(NSPAWN_DROPIN)
                .unwrap()
                .contains("Requires=static-routes.service check-route-overlap.service")
        );

        // A second bootstrap: the earlier unit is stopped first (its script takes its routes).
        let before = f.systemd.calls().len();
        configure_static_routes(&f.host, &p).await.unwrap();
        assert_eq!(
            f.systemd.calls()[before..],
            [
                "stop static-routes.service",
                "enable static-routes.service",
                "start static-routes.service",
            ]
        );

        // No routes any more: the unit, with its routes, goes; the machines require only the
        // overlap check.
        let none = with(&[], &[], "");
        let before = f.systemd.calls().len();
        configure_static_routes(&f.host, &none).await.unwrap();
        check_route_overlap(&f.host, &none).await.unwrap();
        assert_eq!(
            f.systemd.calls()[before..],
            [
                "stop static-routes.service",
                "disable static-routes.service",
                "enable check-route-overlap.service",
                "restart check-route-overlap.service",
            ]
        );
        assert!(file(STATIC_ROUTES_UNIT_PATH).is_none());
        assert!(file(STATIC_ROUTES_SCRIPT).is_none());
        assert!(
            file(NSPAWN_DROPIN)
                .unwrap()
                .contains("Requires=check-route-overlap.service\n")
        );

        // reset: both units stopped, disabled and removed with the drop-in, scripts, results.
        configure_static_routes(&f.host, &p).await.unwrap();
        std::fs::create_dir_all(f.root.path().join("run/aks-flex-node")).unwrap();
        std::fs::write(f.root.path().join(&OVERLAP_OK[1..]), "ok").unwrap();
        let before = f.systemd.calls().len();
        remove(&f.host).await.unwrap();
        assert_eq!(
            f.systemd.calls()[before..],
            [
                "stop static-routes.service",
                "disable static-routes.service",
                "stop check-route-overlap.service",
                "disable check-route-overlap.service",
            ]
        );
        for p in [
            STATIC_ROUTES_UNIT_PATH,
            OVERLAP_UNIT_PATH,
            NSPAWN_DROPIN,
            STATIC_ROUTES_SCRIPT,
            OVERLAP_SCRIPT,
            OVERLAP_OK,
        ] {
            assert!(file(p).is_none(), "{p} left");
        }
        // Again, with nothing there: no call, no error.
        let before = f.systemd.calls().len();
        remove(&f.host).await.unwrap();
        assert_eq!(f.systemd.calls().len(), before);
    }

    #[tokio::test]
    async fn a_strict_overlap_fails_the_task_with_what_was_found() {
        let f = FakeHost::new().unwrap();
        f.systemd.fail_on("restart check-route-overlap.service");
        std::fs::create_dir_all(f.root.path().join("run/aks-flex-node")).unwrap();
        std::fs::write(
            f.root.path().join(&OVERLAP_DETECTED[1..]),
            "10.2.0.0/16: 10.2.0.1 routes through eth0, the default route's interface\n",
        )
        .unwrap();
        let e = check_route_overlap(&f.host, &with(&[], &["10.2.0.0/16"], "STRICT"))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("check-route-overlap.service failed (hostRouting.routeOverlap.mode STRICT): 10.2.0.0/16: 10.2.0.1 routes through eth0"),
            "{e}"
        );
    }
}
