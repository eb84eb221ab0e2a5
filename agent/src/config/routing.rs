//! `hostRouting`, checked at load and turned into a [`RoutingPlan`] (pure: no host access).
//!
//! Upstream validates host routing only when its tasks run, so a bad route fails a bootstrap
//! half-way; here it is refused when the config loads, with the field named. Every value that
//! reaches a script or a unit has been parsed into an address, a prefix, a number or an
//! interface name of `[A-Za-z0-9_.-]`, so none of them can carry shell or unit syntax.

use std::fmt;
use std::net::Ipv4Addr;

use super::{HostRouting, StaticRoute};

/// Why a routing value does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteValueError {
    /// Not `a.b.c.d/n`.
    #[error("{0:?} is not an IPv4 CIDR (a.b.c.d/n)")]
    NotCidr(String),
    /// A prefix length above 32, or not a number.
    #[error("{0:?} has a prefix length outside 0-32")]
    Prefix(String),
    /// Bits set past the prefix.
    #[error("{given:?} has host bits set; the network is {network}")]
    HostBits {
        /// As given.
        given: String,
        /// The network it lies in.
        network: String,
    },
    /// Not WARN or STRICT.
    #[error("{0:?} is not a mode (WARN or STRICT)")]
    Mode(String),
}

/// An IPv4 network in CIDR notation, with no host bits set (`10.1.0.0/16`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Cidr {
    /// The network address.
    pub network: Ipv4Addr,
    /// The prefix length, 0–32.
    pub prefix: u8,
}

impl Ipv4Cidr {
    /// Parses `a.b.c.d/n`; host bits set are refused (`ip route` refuses them too).
    pub fn parse(s: &str) -> Result<Self, RouteValueError> {
        let (addr, prefix) = s
            .split_once('/')
            .ok_or_else(|| RouteValueError::NotCidr(s.into()))?;
        let network: Ipv4Addr = addr
            .parse()
            .map_err(|_| RouteValueError::NotCidr(s.into()))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= 32)
            .ok_or_else(|| RouteValueError::Prefix(s.into()))?;
        let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
        if u32::from(network) & !mask != 0 {
            let canonical = Ipv4Addr::from(u32::from(network) & mask);
            return Err(RouteValueError::HostBits {
                given: s.into(),
                network: format!("{canonical}/{prefix}"),
            });
        }
        Ok(Self { network, prefix })
    }

    /// The first usable address: the network's first host, or the address itself for /31 and
    /// /32 (which have no network or broadcast address).
    pub fn first_usable(&self) -> Ipv4Addr {
        if self.prefix >= 31 {
            self.network
        } else {
            Ipv4Addr::from(u32::from(self.network) + 1)
        }
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// One route, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// Where it leads.
    pub destination: Ipv4Cidr,
    /// Its gateway; `None`: the default route's, found at boot.
    pub gateway: Option<Ipv4Addr>,
    /// Its interface; `None`: the default route's, found at boot.
    pub dev: Option<String>,
    /// Its metric.
    pub metric: Option<u32>,
}

/// What the overlap check does when an expected network routes through the default route's
/// interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverlapMode {
    /// Record it and warn; the unit succeeds (upstream's default).
    Warn,
    /// Record it and fail the unit, so the machines, which require it, do not start.
    Strict,
}

impl OverlapMode {
    /// `WARN`, `STRICT` (any case) or empty (WARN).
    pub fn parse(s: &str) -> Result<Self, RouteValueError> {
        match s.trim().to_ascii_uppercase().as_str() {
            "" | "WARN" => Ok(Self::Warn),
            "STRICT" => Ok(Self::Strict),
            _ => Err(RouteValueError::Mode(s.into())),
        }
    }

    /// As the script names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Warn => "WARN",
            Self::Strict => "STRICT",
        }
    }
}

/// `hostRouting`, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutingPlan {
    /// The static routes (empty: no static-routes unit).
    pub routes: Vec<Route>,
    /// The networks the overlap check probes (the check is installed even with none, as
    /// upstream does).
    pub expected: Vec<Ipv4Cidr>,
    /// The overlap check's mode.
    pub mode: OverlapMode,
}

/// A bad `hostRouting` value: the field (`hostRouting.…`) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RoutingError {
    /// The dotted path of the field.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn bad(field: String, message: String) -> RoutingError {
    RoutingError { field, message }
}

/// Whether `dev` can be a Linux interface name here: 1–15 characters of `[A-Za-z0-9_.-]`, not
/// `.` or `..`.
pub fn valid_dev(dev: &str) -> bool {
    (1..=15).contains(&dev.len())
        && dev != "."
        && dev != ".."
        && dev
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn route(i: usize, r: &StaticRoute) -> Result<Route, RoutingError> {
    let at = |f: &str| format!("hostRouting.staticRoutes.routes[{i}].{f}");
    let destination =
        Ipv4Cidr::parse(r.destination.trim()).map_err(|e| bad(at("destination"), e.to_string()))?;
    let gateway = match r.gateway.trim() {
        "" => None,
        g => Some(
            g.parse::<Ipv4Addr>()
                .map_err(|_| bad(at("gateway"), format!("{g:?} is not an IPv4 address")))?,
        ),
    };
    let dev = match r.dev.trim() {
        "" => None,
        d if valid_dev(d) => Some(d.to_string()),
        d => {
            return Err(bad(
                at("dev"),
                format!(
                    "{:?} is not an interface name (1-15 characters [A-Za-z0-9_.-])",
                    d.chars().take(32).collect::<String>()
                ),
            ));
        }
    };
    Ok(Route {
        destination,
        gateway,
        dev,
        metric: r.metric,
    })
}

/// Checks `hostRouting` and parses it. Routes configured while `staticRoutes.enabled` is
/// false are refused (upstream refuses them when its task runs).
pub fn plan(h: &HostRouting) -> Result<RoutingPlan, RoutingError> {
    let s = &h.static_routes;
    if !s.enabled && !s.routes.is_empty() {
        return Err(bad(
            "hostRouting.staticRoutes.enabled".into(),
            format!(
                "is false, but {} route(s) are configured; set it to true or remove the routes",
                s.routes.len()
            ),
        ));
    }
    let routes = s
        .routes
        .iter()
        .enumerate()
        .map(|(i, r)| route(i, r))
        .collect::<Result<Vec<_>, _>>()?;
    let o = &h.route_overlap;
    let expected = o
        .expected_cidrs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            Ipv4Cidr::parse(c.trim()).map_err(|e| {
                bad(
                    format!("hostRouting.routeOverlap.expectedCidrs[{i}]"),
                    e.to_string(),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mode = OverlapMode::parse(&o.mode)
        .map_err(|e| bad("hostRouting.routeOverlap.mode".into(), e.to_string()))?;
    Ok(RoutingPlan {
        routes,
        expected,
        mode,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{RouteOverlap, StaticRoutes};
    use super::*;

    fn routing(routes: Vec<StaticRoute>, enabled: bool, cidrs: &[&str], mode: &str) -> HostRouting {
        HostRouting {
            static_routes: StaticRoutes { enabled, routes },
            route_overlap: RouteOverlap {
                expected_cidrs: cidrs.iter().map(|c| c.to_string()).collect(),
                mode: mode.into(),
            },
        }
    }

    fn r(destination: &str, gateway: &str, dev: &str) -> StaticRoute {
        StaticRoute {
            destination: destination.into(),
            gateway: gateway.into(),
            dev: dev.into(),
            metric: None,
        }
    }

    #[test]
    fn cidrs_parse_strictly() {
        for (s, want) in [
            ("10.1.0.0/16", Ok("10.1.0.0/16")),
            ("0.0.0.0/0", Ok("0.0.0.0/0")),
            ("192.168.1.7/32", Ok("192.168.1.7/32")),
            (
                "10.1.2.0/16",
                Err("has host bits set; the network is 10.1.0.0/16"),
            ),
            ("10.1.0.0/33", Err("prefix length outside 0-32")),
            ("10.1.0.0", Err("is not an IPv4 CIDR")),
            ("fd00::/8", Err("is not an IPv4 CIDR")),
            ("10.1.0.0/16; reboot", Err("prefix length outside 0-32")),
            ("$(reboot)/8", Err("is not an IPv4 CIDR")),
        ] {
            match (Ipv4Cidr::parse(s), want) {
                (Ok(c), Ok(w)) => assert_eq!(c.to_string(), w, "{s}"),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{s}: {e}"),
                (got, w) => panic!("{s}: got {got:?}, want {w:?}"),
            }
        }
        let first = |s: &str| Ipv4Cidr::parse(s).unwrap().first_usable().to_string();
        assert_eq!(first("10.1.0.0/16"), "10.1.0.1");
        assert_eq!(first("10.1.0.4/31"), "10.1.0.4");
        assert_eq!(first("10.1.0.9/32"), "10.1.0.9");
    }

    /// Table: a config's `hostRouting` and the field the load names, or the plan.
    #[test]
    fn bad_routing_names_the_field_and_a_good_one_plans() {
        let cases: Vec<(HostRouting, Result<(), &str>)> = vec![
            (HostRouting::default(), Ok(())),
            (
                routing(vec![r("10.1.0.0/16", "", "")], false, &[], ""),
                Err("hostRouting.staticRoutes.enabled"),
            ),
            (
                routing(vec![r("10.1.0.0/16", "10.0.0.1", "eth0")], true, &[], ""),
                Ok(()),
            ),
            (
                routing(
                    vec![r("10.1.0.0/16", "", ""), r("bad", "", "")],
                    true,
                    &[],
                    "",
                ),
                Err("hostRouting.staticRoutes.routes[1].destination"),
            ),
            (
                routing(vec![r("10.1.0.0/16", "10.0.0.300", "")], true, &[], ""),
                Err("hostRouting.staticRoutes.routes[0].gateway"),
            ),
            (
                routing(vec![r("10.1.0.0/16", "", "eth0;reboot")], true, &[], ""),
                Err("hostRouting.staticRoutes.routes[0].dev"),
            ),
            (
                routing(
                    vec![r("10.1.0.0/16", "", "averyveryverylongname")],
                    true,
                    &[],
                    "",
                ),
                Err("hostRouting.staticRoutes.routes[0].dev"),
            ),
            (
                routing(vec![], false, &["10.2.0.0/16", "10.3.0.0/15"], "strict"),
                Err("hostRouting.routeOverlap.expectedCidrs[1]"),
            ),
            (
                routing(vec![], false, &["10.2.0.0/16"], "loud"),
                Err("hostRouting.routeOverlap.mode"),
            ),
        ];
        for (h, want) in cases {
            match (plan(&h), want) {
                (Ok(_), Ok(())) => {}
                (Err(e), Err(field)) => assert_eq!(e.field, field, "{e}"),
                (got, w) => panic!("{h:?}: got {got:?}, want {w:?}"),
            }
        }
        let p = plan(&routing(
            vec![StaticRoute {
                metric: Some(50),
                ..r(" 10.1.0.0/16 ", "", "eth1")
            }],
            true,
            &["10.2.0.0/16"],
            "Strict",
        ))
        .unwrap();
        assert_eq!(
            p,
            RoutingPlan {
                routes: vec![Route {
                    destination: Ipv4Cidr::parse("10.1.0.0/16").unwrap(),
                    gateway: None,
                    dev: Some("eth1".into()),
                    metric: Some(50),
                }],
                expected: vec![Ipv4Cidr::parse("10.2.0.0/16").unwrap()],
                mode: OverlapMode::Strict,
            }
        );
    }
}
