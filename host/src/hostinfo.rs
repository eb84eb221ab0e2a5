//! Facts about the host the agent reads but does not change: who it runs as, the hostname,
//! whether a path is on a read-only mount, free space, whether it runs in its container, the
//! kernel release, and whether a port can be bound or a TCP address answers (preflight).
//!
//! Behind the [`HostInfo`] trait so flows can be tested with `flex_testkit::FakeHostInfo`.

use std::path::Path;

/// The environment variable the agent's container image sets (`true`) to switch on container
/// mode.
pub const CONTAINERIZED_ENV: &str = "AKS_FLEX_NODE_CONTAINERIZED";

/// Read-only facts about the host.
pub trait HostInfo: Send + Sync {
    /// The effective user id.
    fn euid(&self) -> u32;
    /// The kernel's hostname (not yet lowercased).
    fn hostname(&self) -> std::io::Result<String>;
    /// Whether `path` lies on a read-only mount.
    fn is_read_only(&self, path: &Path) -> std::io::Result<bool>;
    /// Bytes available to unprivileged users under `path`.
    fn free_bytes(&self, path: &Path) -> std::io::Result<u64>;
    /// Whether the agent runs in its container image (`AKS_FLEX_NODE_CONTAINERIZED`).
    fn containerized(&self) -> bool;
    /// The running kernel's release (`uname -r`).
    fn kernel_release(&self) -> String;
    /// Whether a TCP listener could bind `addr` now (the probe listener is closed at once).
    fn port_bindable(&self, addr: std::net::SocketAddr) -> bool;
    /// Opens (and closes) a TCP connection to `host:port` within `timeout`.
    fn tcp_connect(
        &self,
        host: &str,
        port: u16,
        timeout: std::time::Duration,
    ) -> Result<(), ConnectError>;
}

/// Why [`HostInfo::tcp_connect`] did not connect. The messages leave out the host and port:
/// the caller names the endpoint if it may (an API server's may identify the cluster).
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The name did not resolve.
    #[error("cannot resolve the API server host: {cause}")]
    Resolve {
        /// The resolver's error.
        cause: std::io::Error,
    },
    /// The name resolved to no address.
    #[error("no addresses")]
    NoAddress,
    /// No address accepted a connection in time; the last address's error.
    #[error("{cause}")]
    Connect {
        /// The last connection error.
        cause: std::io::Error,
    },
}

/// Parses a boolean as Go's `strconv.ParseBool` does (`1 t T TRUE true True` and the false
/// forms); anything else is `None`.
pub fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The real host, read through syscalls.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealHostInfo;

impl HostInfo for RealHostInfo {
    fn euid(&self) -> u32 {
        rustix::process::geteuid().as_raw()
    }

    fn hostname(&self) -> std::io::Result<String> {
        // In the agent's container the host's /etc/hostname is mounted at its own path; the
        // container's UTS name may be its own.
        if self.containerized()
            && let Ok(h) = std::fs::read_to_string("/etc/hostname")
            && !h.trim().is_empty()
        {
            return Ok(h.trim().to_string());
        }
        let uts = rustix::system::uname();
        Ok(uts.nodename().to_string_lossy().into_owned())
    }

    fn is_read_only(&self, path: &Path) -> std::io::Result<bool> {
        let st = rustix::fs::statvfs(path)?;
        Ok(st.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY))
    }

    fn free_bytes(&self, path: &Path) -> std::io::Result<u64> {
        let st = rustix::fs::statvfs(path)?;
        Ok(st.f_bavail.saturating_mul(st.f_frsize))
    }

    fn kernel_release(&self) -> String {
        rustix::system::uname()
            .release()
            .to_string_lossy()
            .into_owned()
    }

    fn port_bindable(&self, addr: std::net::SocketAddr) -> bool {
        std::net::TcpListener::bind(addr).is_ok()
    }

    fn tcp_connect(
        &self,
        host: &str,
        port: u16,
        timeout: std::time::Duration,
    ) -> Result<(), ConnectError> {
        use std::net::ToSocketAddrs;
        let addrs: Vec<_> = (host, port)
            .to_socket_addrs()
            .map_err(|cause| ConnectError::Resolve { cause })?
            .collect();
        let mut last = ConnectError::NoAddress;
        for a in addrs {
            match std::net::TcpStream::connect_timeout(&a, timeout) {
                Ok(_) => return Ok(()),
                Err(cause) => last = ConnectError::Connect { cause },
            }
        }
        Err(last)
    }

    fn containerized(&self) -> bool {
        std::env::var(CONTAINERIZED_ENV)
            .ok()
            .and_then(|v| parse_go_bool(v.trim()))
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_bool_forms() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(t), Some(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(f), Some(false), "{f}");
        }
        for bad in ["yes", "", "tRUE", "2"] {
            assert_eq!(parse_go_bool(bad), None, "{bad}");
        }
    }

    /// Real syscalls on this machine: `/proc` is read-write... `/` has free space, and we have a
    /// hostname.
    #[test]
    fn real_host_answers() {
        let h = RealHostInfo;
        assert!(!h.hostname().unwrap().is_empty());
        assert!(h.free_bytes(Path::new("/")).unwrap() > 0);
        let dir = tempfile::tempdir().unwrap();
        assert!(!h.is_read_only(dir.path()).unwrap());
    }
}
