//! The pre-RP config shape: `kubernetes.version`, `containerd.version`, `runc.version`,
//! `cni.version`, `node.kubelet.dnsServiceIP` and `node.kubelet.serverURL` fill the new fields
//! only where those are empty; new-shape fields win when both are present.

use serde_json::Value;

use super::Config;

/// Fills empty new-shape fields from legacy keys in the canonicalised raw JSON.
pub(crate) fn apply(cfg: &mut Config, raw: &Value) {
    let (canon, _) = super::keys::canonicalize(raw);
    let get = |path: &[&str]| -> Option<String> {
        let mut v = &canon;
        for p in path {
            v = v.get(*p)?;
        }
        v.as_str().map(str::to_string).filter(|s| !s.is_empty())
    };
    let fill = |dst: &mut String, src: Option<String>| {
        if dst.is_empty()
            && let Some(s) = src
        {
            *dst = s;
        }
    };
    fill(
        &mut cfg.components.kubernetes,
        get(&["kubernetes", "version"]),
    );
    fill(
        &mut cfg.components.containerd,
        get(&["containerd", "version"]),
    );
    fill(&mut cfg.components.runc, get(&["runc", "version"]));
    fill(&mut cfg.networking.cni_version, get(&["cni", "version"]));
    fill(
        &mut cfg.networking.dns_service_ip,
        get(&["node", "kubelet", "dnsServiceIP"]),
    );
    fill(
        &mut cfg.node.kubelet.cluster_fqdn,
        get(&["node", "kubelet", "serverURL"]).map(|s| server_url_host(&s)),
    );
}

/// `serverURL` → `host[:port]` when it parses as a URL with scheme and host, else as written.
fn server_url_host(s: &str) -> String {
    match url::Url::parse(s) {
        Ok(u) if u.has_host() && !u.scheme().is_empty() => {
            let host = u.host_str().unwrap_or_default();
            // Keep an explicit port even when it is the scheme's default, as Go's u.Host does.
            match explicit_port(s) {
                Some(p) => format!("{host}:{p}"),
                None => host.to_string(),
            }
        }
        _ => s.to_string(),
    }
}

fn explicit_port(s: &str) -> Option<&str> {
    let rest = s.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let after_bracket = hostport.rsplit_once(']').map_or(hostport, |(_, p)| p);
    after_bracket
        .rsplit_once(':')
        .map(|(_, p)| p)
        .filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn legacy_fills_only_empty_fields() {
        let raw = json!({
            "kubernetes": {"version": "1.30.0"},
            "containerd": {"version": "1.7.0"},
            "runc": {"version": "1.1.0"},
            "cni": {"version": "1.4.0"},
            "components": {"kubernetes": "1.35.0"},
            "node": {"kubelet": {"dnsServiceIP": "10.1.0.10", "serverURL": "https://api.example:6443/x"}},
        });
        let mut cfg: Config =
            serde_json::from_value(super::super::keys::canonicalize(&raw).0).unwrap();
        apply(&mut cfg, &raw);
        assert_eq!(cfg.components.kubernetes, "1.35.0", "new shape wins");
        assert_eq!(cfg.components.containerd, "1.7.0");
        assert_eq!(cfg.components.runc, "1.1.0");
        assert_eq!(cfg.networking.cni_version, "1.4.0");
        assert_eq!(cfg.networking.dns_service_ip, "10.1.0.10");
        assert_eq!(cfg.node.kubelet.cluster_fqdn, "api.example:6443");
    }

    #[test]
    fn server_url_forms() {
        assert_eq!(server_url_host("https://a.b:443"), "a.b:443");
        assert_eq!(server_url_host("https://a.b"), "a.b");
        assert_eq!(server_url_host("a.b:6443"), "a.b:6443");
        assert_eq!(server_url_host("plain"), "plain");
    }
}
