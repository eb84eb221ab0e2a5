//! Where components are downloaded from: the upstream release URLs (unbounded §5.2) and the
//! per-component [`Downloads`] overrides.
//!
//! An override's `url` is a Go format string given the same arguments as upstream's
//! `fmt.Sprintf` (see [`go_format`]): Kubernetes `(version, arch, binary)`, crictl
//! `(version, version, "linux", arch)`, containerd `(version, version, arch)`, runc
//! `(version, arch)`, CNI `(version, arch, version)`. Its `baseURL` replaces the scheme, host and
//! path prefix of the default (`https://dl.k8s.io`,
//! `https://github.com/<org>/<repo>/releases/download`), keeping the `/v<version>/<asset>`
//! layout; a trailing `/` is trimmed. `url` wins over `baseURL`. Its `version` wins over the
//! config's.

use serde::{Deserialize, Serialize};

use super::error::ComponentsError;
use flex_host::secret::redact_url;

/// Default base of the Kubernetes binaries (`<base>/v<ver>/bin/linux/<arch>/<bin>`).
pub const KUBERNETES_BASE_URL: &str = "https://dl.k8s.io";
/// Default base of the cri-tools releases.
pub const CRICTL_BASE_URL: &str = "https://github.com/kubernetes-sigs/cri-tools/releases/download";
/// Default base of the containerd releases.
pub const CONTAINERD_BASE_URL: &str = "https://github.com/containerd/containerd/releases/download";
/// Default base of the runc releases.
pub const RUNC_BASE_URL: &str = "https://github.com/opencontainers/runc/releases/download";
/// Default base of the CNI plugins releases.
pub const CNI_BASE_URL: &str = "https://github.com/containernetworking/plugins/releases/download";

/// The override for one component; empty strings mean "not set".
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DownloadSource {
    /// Replaces scheme, host and path prefix of the default URL.
    #[serde(rename = "baseURL")]
    pub base_url: String,
    /// A whole-URL Go format string (see the module docs for its arguments).
    pub url: String,
    /// The version to install instead of the configured or default one.
    pub version: String,
}

impl DownloadSource {
    fn is_set(&self) -> bool {
        !self.base_url.trim().is_empty() || !self.url.trim().is_empty()
    }
}

/// Per-component download overrides (unbounded's `DownloadOverrides`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Downloads {
    /// kubelet, kubectl, kube-proxy.
    pub kubernetes: DownloadSource,
    /// The containerd release tarball.
    pub containerd: DownloadSource,
    /// The runc binary.
    pub runc: DownloadSource,
    /// The CNI plugins tarball.
    pub cni: DownloadSource,
    /// The crictl tarball.
    pub crictl: DownloadSource,
}

impl Downloads {
    /// Whether any `url` or `baseURL` is set (they do not apply to offline artifacts).
    pub fn has_url_overrides(&self) -> bool {
        [
            &self.kubernetes,
            &self.containerd,
            &self.runc,
            &self.cni,
            &self.crictl,
        ]
        .iter()
        .any(|s| s.is_set())
    }
}

/// Builds one URL: the override's `url` formatted with `args`, else `<base>/<path>` with the
/// override's `baseURL` (trailing `/` trimmed) or `default_base`. The result must be an
/// absolute `http` or `https` URL.
fn build(
    over: &DownloadSource,
    field: &str,
    default_base: &str,
    path: &str,
    args: &[&str],
) -> Result<String, ComponentsError> {
    let (url, which) = if !over.url.trim().is_empty() {
        let url = go_format(over.url.trim(), args).map_err(|m| {
            ComponentsError::config(format!("downloads.{field}.url"), m.to_string())
        })?;
        (url, "url")
    } else if !over.base_url.trim().is_empty() {
        let base = over.base_url.trim().trim_end_matches('/');
        (format!("{base}/{path}"), "baseURL")
    } else {
        (format!("{default_base}/{path}"), "")
    };
    match url::Url::parse(&url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => Ok(url),
        _ => Err(ComponentsError::config(
            format!("downloads.{field}.{which}"),
            format!("{} is not an absolute http(s) URL", redact_url(&url)),
        )),
    }
}

/// `https://dl.k8s.io/v<ver>/bin/linux/<arch>/<bin>`; override args `(ver, arch, bin)`.
pub(crate) fn kubernetes_url(
    over: &DownloadSource,
    version: &str,
    arch: &str,
    bin: &str,
) -> Result<String, ComponentsError> {
    build(
        over,
        "kubernetes",
        KUBERNETES_BASE_URL,
        &format!("v{version}/bin/linux/{arch}/{bin}"),
        &[version, arch, bin],
    )
}

/// `…/cri-tools/releases/download/v<cv>/crictl-v<cv>-linux-<arch>.tar.gz`; override args
/// `(cv, cv, "linux", arch)`.
pub(crate) fn crictl_url(
    over: &DownloadSource,
    version: &str,
    arch: &str,
) -> Result<String, ComponentsError> {
    build(
        over,
        "crictl",
        CRICTL_BASE_URL,
        &format!("v{version}/crictl-v{version}-linux-{arch}.tar.gz"),
        &[version, version, "linux", arch],
    )
}

/// `…/containerd/releases/download/v<v>/containerd-<v>-linux-<arch>.tar.gz`; override args
/// `(v, v, arch)`.
pub(crate) fn containerd_url(
    over: &DownloadSource,
    version: &str,
    arch: &str,
) -> Result<String, ComponentsError> {
    build(
        over,
        "containerd",
        CONTAINERD_BASE_URL,
        &format!("v{version}/containerd-{version}-linux-{arch}.tar.gz"),
        &[version, version, arch],
    )
}

/// `…/runc/releases/download/v<v>/runc.<arch>`; override args `(v, arch)`.
pub(crate) fn runc_url(
    over: &DownloadSource,
    version: &str,
    arch: &str,
) -> Result<String, ComponentsError> {
    build(
        over,
        "runc",
        RUNC_BASE_URL,
        &format!("v{version}/runc.{arch}"),
        &[version, arch],
    )
}

/// `…/plugins/releases/download/v<v>/cni-plugins-linux-<arch>-v<v>.tgz`; override args
/// `(v, arch, v)`.
pub(crate) fn cni_url(
    over: &DownloadSource,
    version: &str,
    arch: &str,
) -> Result<String, ComponentsError> {
    build(
        over,
        "cni",
        CNI_BASE_URL,
        &format!("v{version}/cni-plugins-linux-{arch}-v{version}.tgz"),
        &[version, arch, version],
    )
}

/// Why a download URL template does not format.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// A `%s`/`%v` after the arguments ran out.
    #[error("format verb at offset {offset} has no argument (only {given} are given)")]
    MissingArgument {
        /// Character offset of the verb.
        offset: usize,
        /// How many arguments there are.
        given: usize,
    },
    /// `%[` not followed by digits, `]` and a verb.
    #[error("malformed argument index at offset {offset} (expected %[n]s)")]
    MalformedIndex {
        /// Character offset of the `%`.
        offset: usize,
    },
    /// `%[n]` with `n` not in `1..=given`.
    #[error("argument index %[{index}] out of range (1..={given})")]
    IndexOutOfRange {
        /// The index written.
        index: usize,
        /// How many arguments there are.
        given: usize,
    },
}

/// Formats `template` as Go's `fmt.Sprintf` does for string arguments: `%s` and `%v` take the
/// next argument, `%[n]s`/`%[n]v` the n-th (1-based; later verbs continue after it), `%%` is a
/// `%`. Unlike Go, any other `%` sequence is kept as written, so a percent-encoded URL
/// (`%2F`) survives. A verb without an argument is an error (Go would print `%!s(MISSING)`);
/// arguments left over are ignored.
pub fn go_format(template: &str, args: &[&str]) -> Result<String, FormatError> {
    let chars: Vec<char> = template.chars().collect();
    let mut out = String::with_capacity(template.len() + 32);
    let mut next = 0usize;
    let mut i = 0usize;
    while i < chars.len() {
        let c = chars[i];
        if c != '%' {
            out.push(c);
            i += 1;
            continue;
        }
        match chars.get(i + 1) {
            Some('%') => {
                out.push('%');
                i += 2;
            }
            Some('s' | 'v') => {
                let arg = args.get(next).ok_or(FormatError::MissingArgument {
                    offset: i,
                    given: args.len(),
                })?;
                out.push_str(arg);
                next += 1;
                i += 2;
            }
            Some('[') => {
                let close = chars[i + 2..]
                    .iter()
                    .position(|&c| c == ']')
                    .map(|p| i + 2 + p);
                let parsed = close.and_then(|close| {
                    let digits: String = chars[i + 2..close].iter().collect();
                    let n: usize = digits.parse().ok()?;
                    matches!(chars.get(close + 1), Some('s' | 'v')).then_some((n, close))
                });
                let Some((n, close)) = parsed else {
                    return Err(FormatError::MalformedIndex { offset: i });
                };
                let arg = n.checked_sub(1).and_then(|k| args.get(k)).ok_or(
                    FormatError::IndexOutOfRange {
                        index: n,
                        given: args.len(),
                    },
                )?;
                out.push_str(arg);
                next = n;
                i = close + 2;
            }
            _ => {
                out.push('%');
                i += 1;
            }
        }
    }
    Ok(out)
}
