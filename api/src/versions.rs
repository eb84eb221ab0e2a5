//! Component version rules the agent and the harness share: the default versions, the
//! spelling of a version, and which cri-tools release goes with a Kubernetes version.

/// Default containerd version (unbounded [N]).
pub const DEFAULT_CONTAINERD_VERSION: &str = "2.1.8";
/// Default runc version when the config gives none (unbounded [N]).
pub const DEFAULT_RUNC_VERSION: &str = "1.5.0";
/// Default CNI plugins version.
pub const DEFAULT_CNI_VERSION: &str = "1.5.1";
/// node-problem-detector's default version (upstream's `npd.version` default).
pub const DEFAULT_NPD_VERSION: &str = "v1.35.1";
/// Default pause (sandbox) image of the machines' containerd (`components.sandboxImage`).
pub const DEFAULT_SANDBOX_IMAGE: &str = "mcr.microsoft.com/oss/v2/kubernetes/pause:3.9";

/// A Kubernetes version that does not start `<major>.<minor>`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{given:?} is not a Kubernetes version (<major>.<minor>.<patch>)")]
pub struct NotAKubernetesVersion {
    /// The version as given.
    pub given: String,
}

/// `s` trimmed, without one leading `v`.
pub fn strip_v(s: &str) -> &str {
    let s = s.trim();
    s.strip_prefix('v').unwrap_or(s)
}

/// A version as it may appear in a URL or file name: starts with a digit, then only ASCII
/// letters, digits, `.`, `-`, `+`, `_` (nothing that changes a path).
pub fn is_version(v: &str) -> bool {
    v.starts_with(|c: char| c.is_ascii_digit())
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+' | '_'))
}

/// The cri-tools release for a Kubernetes version: `<major>.<minor>.0` (cri-tools follows the
/// Kubernetes minor releases).
pub fn crictl_version_for(kubernetes: &str) -> Result<String, NotAKubernetesVersion> {
    let v = strip_v(kubernetes);
    let mut parts = v.splitn(3, '.');
    let major = parts.next().unwrap_or_default();
    let minor = parts.next().unwrap_or_default();
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !numeric(major) || !numeric(minor) {
        return Err(NotAKubernetesVersion {
            given: kubernetes.to_string(),
        });
    }
    Ok(format!("{major}.{minor}.0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crictl_follows_the_kubernetes_minor() {
        assert_eq!(crictl_version_for("v1.35.2").as_deref(), Ok("1.35.0"));
        assert_eq!(crictl_version_for(" 1.9 ").as_deref(), Ok("1.9.0"));
        for bad in ["1", "", "v", "1.x.2", "a.1"] {
            let e = crictl_version_for(bad).unwrap_err();
            assert_eq!(e.given, bad);
            assert!(e.to_string().contains("is not a Kubernetes version"), "{e}");
        }
    }

    #[test]
    fn version_spelling() {
        assert_eq!(strip_v(" v1.2.3 "), "1.2.3");
        assert_eq!(strip_v("vv1"), "v1");
        assert!(is_version("1.2.3-rc.1+build_2"));
        for bad in ["", "v1.2", "1.2/../x", "1 2", "-1"] {
            assert!(!is_version(bad), "{bad}");
        }
    }
}
