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

/// The most of a JSON document (an ARM resource, a token response) read from a response.
pub const DOCUMENT_LIMIT: usize = 4 << 20;
/// The most of an error response's body read (it is only ever quoted in a message).
pub const ERROR_BODY_LIMIT: usize = 64 << 10;

/// Why a bounded body read failed.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Reading failed (with the client error's causes: see [`crate::error`]).
    #[error("read response body: {}", crate::error::Chain(.0))]
    Read(reqwest::Error),
    /// The body is longer than the limit.
    #[error("response body exceeds {0} bytes")]
    TooLarge(usize),
}

/// Reads at most `limit` bytes of `resp`'s body; `true` when there was more (the rest is not
/// read). Every response body the agent reads goes through this or [`read_capped`], so a server
/// (a registry, the token realm a registry names, ARM) cannot make it buffer without bound.
pub async fn read_limited(
    mut resp: reqwest::Response,
    limit: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut buf = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = limit.saturating_sub(buf.len());
        if chunk.len() > room {
            buf.extend_from_slice(&chunk[..room]);
            return Ok((buf, true));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok((buf, false))
}

/// [`read_limited`] for a body that must be whole: more than `limit` bytes is an error.
pub async fn read_capped(resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, BodyError> {
    match read_limited(resp, limit).await.map_err(BodyError::Read)? {
        (_, true) => Err(BodyError::TooLarge(limit)),
        (bytes, false) => Ok(bytes),
    }
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

    /// A real local HTTP server (no fakes) streaming a body far past the limit: the read stops
    /// at the limit instead of buffering it all.
    #[tokio::test]
    async fn reads_stop_at_the_limit() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = sock.read(&mut buf).await;
                    let _ = sock
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n")
                        .await;
                    let chunk = vec![b'x'; 64 << 10];
                    // 100 MB announced; stops when the client hangs up.
                    for _ in 0..1600 {
                        if sock.write_all(&chunk).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let url = format!("http://{addr}/");
        let c = client().unwrap();
        let (bytes, more) = read_limited(c.get(&url).send().await.unwrap(), 100_000)
            .await
            .unwrap();
        assert_eq!(bytes.len(), 100_000);
        assert!(more);
        let e = read_capped(c.get(&url).send().await.unwrap(), 1000)
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), "response body exceeds 1000 bytes");
    }

    #[test]
    fn client_builds() {
        client().unwrap();
    }
}
