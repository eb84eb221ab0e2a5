//! The HTTP client the agent downloads with (registry blobs, release artifacts), and the rules
//! for when plain HTTP is allowed.
//!
//! TLS is rustls with the `ring` provider (installed once per process by [`install_crypto`]) and
//! the platform's CA store.
//!
//! - **Registries**: plain HTTP only for a registry named in an explicit opt-in list,
//!   [`InsecureRegistries`] (`host[:port]` entries, as containerd's and Docker's "insecure
//!   registries"); every other registry, whatever its address, is HTTPS.
//! - **Other endpoints** (IMDS, a test authority host): [`is_local_address`] tells whether a
//!   host is loopback, private or link-local, for callers that accept `http://` URLs there.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

/// Per-request timeout for large downloads (upstream uses 10 minutes).
pub const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(600);

/// Installs rustls's `ring` provider as the process default (idempotent).
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Builds the agent's HTTP client. It follows redirects as [`redirect_refusal`] allows: never
/// from HTTPS down to plain HTTP.
pub fn client() -> Result<reqwest::Client, reqwest::Error> {
    install_crypto();
    reqwest::Client::builder()
        .user_agent(concat!("aks-flex-node/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_secs(30))
        .timeout(DOWNLOAD_TIMEOUT)
        .redirect(reqwest::redirect::Policy::custom(
            |attempt| match redirect_refusal(attempt.previous(), attempt.url()) {
                Some(why) => attempt.error(why),
                None => attempt.follow(),
            },
        ))
        .build()
}

/// The most redirects one request follows (reqwest's default).
pub const MAX_REDIRECTS: usize = 10;

/// Why a redirect to `next`, after the requests to `previous` (the first one first), is not
/// followed: one from an `https` URL to an `http` one (a downgrade would hand a registry's
/// content or a token to anyone on the path), or one too many. `None`: it is followed.
pub fn redirect_refusal(previous: &[reqwest::Url], next: &reqwest::Url) -> Option<String> {
    if previous.len() > MAX_REDIRECTS {
        return Some(format!("more than {MAX_REDIRECTS} redirects"));
    }
    let from_https = previous.iter().any(|u| u.scheme() == "https");
    (from_https && next.scheme() != "https").then(|| {
        format!(
            "refused a redirect from HTTPS to {}://{}: a downgrade",
            next.scheme(),
            next.host_str().unwrap_or_default()
        )
    })
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

/// Whether `host[:port]` (a bare host, `host:port`, `[v6]` or `[v6]:port`) is `localhost`, a
/// loopback, a private (RFC 1918 / unique-local) or a link-local address. Not a registry rule:
/// registries get plain HTTP only through [`InsecureRegistries`].
pub fn is_local_address(host_port: &str) -> bool {
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

/// The environment/settings variable holding the insecure registries, comma-separated
/// (`bootstrap.env`, the agent container's settings file).
pub const INSECURE_REGISTRIES_ENV: &str = "AKS_FLEX_NODE_INSECURE_REGISTRIES";

/// Why an insecure-registry entry was refused. Names the field (config key or variable) and the
/// entry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {entry:?} {problem}")]
pub struct InsecureRegistryError {
    /// The config key or variable the list came from.
    pub field: String,
    /// The refused entry (cut to 100 characters).
    pub entry: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

/// The registries that may be reached over plain HTTP: an explicit opt-in list of
/// `host[:port]` entries. A registry matches an entry when its `host[:port]` (as the image
/// reference names it, `registry-1.docker.io` for Docker Hub) is the entry, host compared
/// case-insensitively; an entry without a port matches only the registry without a port.
/// Empty by default: every registry is HTTPS.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InsecureRegistries(BTreeSet<String>);

impl InsecureRegistries {
    /// No registry over plain HTTP.
    pub fn none() -> Self {
        Self::default()
    }

    /// Parses a comma-separated list (`10.0.2.2:5000,registry.local`); blanks around entries
    /// and empty entries are skipped. `field` names the source in errors.
    pub fn parse(field: &str, text: &str) -> Result<Self, InsecureRegistryError> {
        Self::from_entries(field, text.split(','))
    }

    /// Validates each entry (`host` or `host:port`; IPv6 in brackets). A scheme, path, user
    /// info, query or blank is an error naming `field` and the entry.
    pub fn from_entries<I, S>(field: &str, entries: I) -> Result<Self, InsecureRegistryError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut set = BTreeSet::new();
        for entry in entries {
            let entry = entry.as_ref().trim();
            if entry.is_empty() {
                continue;
            }
            let bad = |problem: &'static str| InsecureRegistryError {
                field: field.to_string(),
                entry: entry.chars().take(100).collect(),
                problem,
            };
            set.insert(normalize_registry(entry).map_err(bad)?);
        }
        Ok(Self(set))
    }

    /// Whether the registry `host_port` may be reached over plain HTTP.
    pub fn allows(&self, host_port: &str) -> bool {
        !self.0.is_empty() && self.0.contains(&host_port.to_ascii_lowercase())
    }

    /// `http` for a listed registry, `https` otherwise.
    pub fn scheme_for(&self, host_port: &str) -> &'static str {
        if self.allows(host_port) {
            "http"
        } else {
            "https"
        }
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entries, normalized (lowercase), sorted.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }

    /// The list as [`InsecureRegistries::parse`] reads it (comma-separated).
    pub fn to_list(&self) -> String {
        self.iter().collect::<Vec<_>>().join(",")
    }
}

/// `entry` checked as `host[:port]` and lowercased.
fn normalize_registry(entry: &str) -> Result<String, &'static str> {
    if entry.contains("://") {
        return Err("must be host[:port], without a scheme");
    }
    if entry.contains('/') {
        return Err("must be host[:port], without a path");
    }
    if entry.contains(['@', '?', '#']) || entry.contains(char::is_whitespace) {
        return Err("must be host[:port]");
    }
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let (v6, after) = rest.split_once(']').ok_or("has an unclosed '['")?;
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return Err("is not an IPv6 address in brackets");
        }
        match after {
            "" => (entry, None),
            p => (
                &entry[..entry.len() - after.len()],
                Some(p.strip_prefix(':').ok_or("must be [v6] or [v6]:port")?),
            ),
        }
    } else {
        match entry.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (entry, None),
        }
    };
    if let Some(p) = port
        && !(p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok_and(|n| n > 0))
    {
        return Err("has a port that is not 1 to 65535");
    }
    if !host.starts_with('[') {
        let labels_ok = !host.is_empty()
            && host.len() <= 253
            && host.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !labels_ok {
            return Err("is not a host name or IP address");
        }
    }
    Ok(entry.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_never_go_from_https_down_to_http() {
        let u = |s: &str| reqwest::Url::parse(s).unwrap();
        let https = u("https://r.io/v2/a/blobs/sha256:1");
        let http = u("http://10.0.2.2:5000/v2/a/blobs/sha256:1");
        assert_eq!(
            redirect_refusal(std::slice::from_ref(&https), &u("https://cdn.r.io/x")),
            None
        );
        assert_eq!(
            redirect_refusal(std::slice::from_ref(&http), &u("http://10.0.2.2:5000/x")),
            None
        );
        assert_eq!(
            redirect_refusal(std::slice::from_ref(&http), &u("https://cdn.r.io/x")),
            None
        );
        let down = redirect_refusal(std::slice::from_ref(&https), &u("http://cdn.r.io/x")).unwrap();
        assert!(down.contains("from HTTPS to http://cdn.r.io"), "{down}");
        // Once HTTPS anywhere in the chain, no way back down.
        assert!(
            redirect_refusal(&[https.clone(), u("https://b.io/")], &u("http://c.io/")).is_some()
        );
        let many = vec![https; MAX_REDIRECTS + 1];
        assert!(
            redirect_refusal(&many, &u("https://x.io/"))
                .unwrap()
                .contains("more than 10")
        );
    }

    /// Real: reqwest's client from [`client`] against a local server that redirects — within
    /// plain HTTP the redirect is followed (the downgrade needs an HTTPS server, and is the
    /// table above).
    #[tokio::test]
    async fn the_client_follows_a_plain_redirect() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            for answer in [
                format!(
                    "HTTP/1.1 302 Found\r\nLocation: http://{addr}/there\r\nContent-Length: 0\r\n\r\n"
                ),
                "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_string(),
            ] {
                let (mut s, _) = l.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await.unwrap();
                s.write_all(answer.as_bytes()).await.unwrap();
            }
        });
        let body = client()
            .unwrap()
            .get(format!("http://{addr}/here"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(body, "ok");
    }

    #[test]
    fn local_address_table() {
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
            assert!(is_local_address(h), "{h}");
        }
        for h in [
            "ghcr.io",
            "mcr.microsoft.com:443",
            "8.8.8.8",
            "172.32.0.1",
            "[2001:db8::1]:5000",
        ] {
            assert!(!is_local_address(h), "{h}");
        }
    }

    /// Pure parsing, nothing faked: entries are `host[:port]`, matched exactly (host
    /// case-insensitively); a private address is not plain HTTP unless listed.
    #[test]
    fn insecure_registries_are_an_explicit_list() {
        let l = InsecureRegistries::parse("F", " 10.0.2.2:5000, Registry.Local ,,[fd00::1]:5000")
            .unwrap();
        assert_eq!(l.to_list(), "10.0.2.2:5000,[fd00::1]:5000,registry.local");
        assert!(l.allows("10.0.2.2:5000"));
        assert!(l.allows("REGISTRY.local"));
        assert!(l.allows("[fd00::1]:5000"));
        assert_eq!(l.scheme_for("10.0.2.2:5000"), "http");
        // Not listed: HTTPS, private address or not.
        for h in [
            "10.0.2.2:5001",
            "10.0.2.2",
            "registry.local:5000",
            "127.0.0.1:5000",
            "ghcr.io",
        ] {
            assert!(!l.allows(h), "{h}");
            assert_eq!(l.scheme_for(h), "https", "{h}");
        }
        let none = InsecureRegistries::none();
        assert!(none.is_empty());
        for h in ["localhost:5000", "127.0.0.1:5000", "10.1.2.3", "[::1]:5000"] {
            assert_eq!(none.scheme_for(h), "https", "{h}");
        }
        assert_eq!(InsecureRegistries::parse("F", " , ").unwrap(), none);
    }

    #[test]
    fn insecure_registry_errors_name_the_field_and_entry() {
        for (entry, problem) in [
            ("http://10.0.2.2:5000", "without a scheme"),
            ("10.0.2.2:5000/v2", "without a path"),
            ("u@host", "must be host[:port]"),
            ("host:0", "port that is not 1 to 65535"),
            ("host:65536", "port that is not 1 to 65535"),
            ("host:x", "port that is not 1 to 65535"),
            ("-bad-.io", "not a host name"),
            ("a..b", "not a host name"),
            ("[fd00::1", "unclosed"),
            ("[nothex]:1", "IPv6"),
            ("[::1]5000", "[v6]:port"),
        ] {
            let e = InsecureRegistries::parse("AKS_FLEX_NODE_INSECURE_REGISTRIES", entry)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("AKS_FLEX_NODE_INSECURE_REGISTRIES: "), "{e}");
            assert!(e.contains(&format!("{entry:?}")), "{e}");
            assert!(e.contains(problem), "{entry}: {e}");
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
