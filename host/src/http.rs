//! The HTTP client the agent downloads with (registry blobs, release artifacts), and the rule
//! for when plain HTTP is allowed.
//!
//! TLS is rustls with the `ring` provider (installed once per process by [`install_crypto`]) and
//! the platform's CA store. Plain HTTP is used only for registries on `localhost`, loopback or
//! private-range addresses, as upstream does; everything else is HTTPS.

use std::net::IpAddr;
use std::time::Duration;

/// Per-request timeout for large downloads (upstream uses 10 minutes).
pub const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(600);

/// Installs rustls's `ring` provider as the process default (idempotent).
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Builds the agent's HTTP client.
pub fn client() -> Result<reqwest::Client, reqwest::Error> {
    install_crypto();
    reqwest::Client::builder()
        .user_agent(concat!("aks-flex-node/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_secs(30))
        .timeout(DOWNLOAD_TIMEOUT)
        .build()
}

/// Whether a registry `host[:port]` may be reached over plain HTTP: `localhost`, loopback, or a
/// private (RFC 1918 / unique-local / link-local) address.
pub fn allows_plain_http(host_port: &str) -> bool {
    let host = match host_port.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => host_port.rsplit_once(':').map_or(host_port, |(h, p)| {
            if p.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host_port
            }
        }),
    };
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => v4.is_loopback() || v4.is_private() || v4.is_link_local(),
        Ok(IpAddr::V6(v6)) => {
            v6.is_loopback() || v6.is_unique_local() || v6.is_unicast_link_local()
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_table() {
        for h in [
            "localhost",
            "localhost:5000",
            "127.0.0.1:5000",
            "10.0.2.2:5000",
            "192.168.1.4",
            "172.16.0.1:443",
            "[::1]:5000",
            "[fd00::1]",
        ] {
            assert!(allows_plain_http(h), "{h}");
        }
        for h in [
            "ghcr.io",
            "mcr.microsoft.com:443",
            "8.8.8.8",
            "172.32.0.1",
            "[2001:db8::1]:5000",
        ] {
            assert!(!allows_plain_http(h), "{h}");
        }
    }

    #[test]
    fn client_builds() {
        client().unwrap();
    }
}
