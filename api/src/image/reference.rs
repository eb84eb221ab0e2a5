//! Image references: where an image comes from.
//!
//! A registry reference is `[oci://][registry[:port]/]repository[:tag][@sha256:<64 hex>]`, with
//! Docker's defaults: a first component that has no `.` or `:` and is not `localhost` is part of
//! the repository, and the registry is then `docker.io` (reached at `registry-1.docker.io`), where
//! a single-component repository gets the `library/` prefix. Without a digest the tag defaults
//! to `latest`; with a digest and no tag there is no tag (the digest decides what is pulled).
//!
//! A local OCI image layout is `oci-layout:///abs/dir[:tag]` or `oci-layout:///abs/dir@sha256:…`
//! (tag `latest` when neither is given).
//!
//! [`ImageRef`]'s and [`ImageSource`]'s `Display` is the canonical form, and parsing it gives
//! back the same value.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::digest::Digest;

/// The registry used when a reference names none.
pub const DEFAULT_REGISTRY: &str = "docker.io";
/// The host that serves the API for [`DEFAULT_REGISTRY`].
pub const DOCKER_HUB_API_HOST: &str = "registry-1.docker.io";
/// The tag used when a reference names neither a tag nor a digest.
pub const DEFAULT_TAG: &str = "latest";
/// Prefix of local OCI layout sources.
pub const LAYOUT_SCHEME: &str = "oci-layout://";
/// Optional prefix of registry references.
pub const OCI_SCHEME: &str = "oci://";

/// An invalid image reference: names the reference and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid image reference {reference:?}: {reason}")]
pub struct ReferenceError {
    /// The reference as given.
    pub reference: String,
    /// What is wrong.
    pub reason: String,
}

/// An image in a registry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ImageRef {
    /// `host[:port]` as written (`docker.io` for Docker Hub).
    pub registry: String,
    /// The repository path, e.g. `library/debian`.
    pub repository: String,
    /// The tag, if any.
    pub tag: Option<String>,
    /// The pinned manifest digest, if any.
    pub digest: Option<Digest>,
}

/// What a local OCI layout source points at inside the layout's `index.json`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LayoutTarget {
    /// The manifest annotated `org.opencontainers.image.ref.name=<tag>`.
    Tag(String),
    /// The manifest (or index) with this digest.
    Digest(Digest),
}

/// Where an image comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ImageSource {
    /// A registry (`[oci://]registry/repo:tag`).
    Registry(ImageRef),
    /// A local OCI image layout directory (`oci-layout:///dir:tag`).
    Layout {
        /// The layout directory (absolute).
        dir: PathBuf,
        /// Which image in it.
        tag_or_digest: LayoutTarget,
    },
}

impl ImageRef {
    /// Parses a registry reference (an `oci://` prefix is accepted and dropped).
    pub fn parse(reference: &str) -> Result<Self, ReferenceError> {
        let err = |reason: String| ReferenceError {
            reference: reference.to_string(),
            reason,
        };
        let s = reference.strip_prefix(OCI_SCHEME).unwrap_or(reference);
        if s.is_empty() {
            return Err(err("empty reference".into()));
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(err("contains whitespace or control characters".into()));
        }
        let (name, digest) = match s.rsplit_once('@') {
            Some((n, d)) => (
                n,
                Some(Digest::parse(d).map_err(|e| err(format!("digest {d:?}: {}", e.reason)))?),
            ),
            None => (s, None),
        };
        let (registry, rest) = match name.split_once('/') {
            Some((first, rest))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), rest)
            }
            _ => (DEFAULT_REGISTRY.to_string(), name),
        };
        validate_registry(&registry).map_err(err)?;
        let (repo, tag) = match rest.rsplit_once(':') {
            Some((r, t)) if !t.contains('/') => (r, Some(t.to_string())),
            _ => (rest, None),
        };
        if let Some(t) = &tag {
            validate_tag(t).map_err(err)?;
        }
        validate_repository(repo).map_err(err)?;
        let registry = if registry == "index.docker.io" {
            DEFAULT_REGISTRY.to_string()
        } else {
            registry
        };
        let repository = if registry == DEFAULT_REGISTRY && !repo.contains('/') {
            format!("library/{repo}")
        } else {
            repo.to_string()
        };
        // The limit holds for the repository as stored and shown (`library/` included), so
        // the canonical form always parses back.
        check_repository_length(&repository).map_err(err)?;
        let tag = match (tag, &digest) {
            (None, None) => Some(DEFAULT_TAG.to_string()),
            (t, _) => t,
        };
        Ok(Self {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The `host[:port]` the registry API is served at (`registry-1.docker.io` for Docker Hub).
    pub fn api_host(&self) -> &str {
        if self.registry == DEFAULT_REGISTRY {
            DOCKER_HUB_API_HOST
        } else {
            &self.registry
        }
    }

    /// What to ask the registry for: the digest when pinned, else the tag.
    pub fn reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => DEFAULT_TAG.to_string(),
        }
    }

    /// The same repository at another tag (no digest).
    pub fn with_tag(&self, tag: &str) -> Self {
        Self {
            tag: Some(tag.to_string()),
            digest: None,
            ..self.clone()
        }
    }

    /// The same repository pinned to `digest` (no tag).
    pub fn with_digest(&self, digest: Digest) -> Self {
        Self {
            tag: None,
            digest: Some(digest),
            ..self.clone()
        }
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl FromStr for ImageRef {
    type Err = ReferenceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl ImageSource {
    /// Parses a registry reference or an `oci-layout://` source.
    pub fn parse(source: &str) -> Result<Self, ReferenceError> {
        let Some(rest) = source.strip_prefix(LAYOUT_SCHEME) else {
            return ImageRef::parse(source).map(Self::Registry);
        };
        let err = |reason: &str| ReferenceError {
            reference: source.to_string(),
            reason: reason.to_string(),
        };
        if !rest.starts_with('/') {
            return Err(err(
                "an oci-layout source needs an absolute directory (oci-layout:///dir:tag)",
            ));
        }
        let (dir, target) = if let Some((dir, d)) = rest.rsplit_once('@') {
            let digest =
                Digest::parse(d).map_err(|e| err(&format!("digest {d:?}: {}", e.reason)))?;
            (dir, LayoutTarget::Digest(digest))
        } else {
            let last_slash = rest.rfind('/').unwrap_or(0);
            match rest[last_slash..].rfind(':') {
                Some(i) => {
                    let (dir, tag) = (&rest[..last_slash + i], &rest[last_slash + i + 1..]);
                    validate_tag(tag).map_err(|r| err(&r))?;
                    (dir, LayoutTarget::Tag(tag.to_string()))
                }
                None => (rest, LayoutTarget::Tag(DEFAULT_TAG.to_string())),
            }
        };
        let dir = dir.trim_end_matches('/');
        if dir.is_empty() {
            return Err(err("the layout directory cannot be /"));
        }
        if Path::new(dir)
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(err("the layout directory must not contain '..'"));
        }
        if dir.contains(['@', ':']) || dir.chars().any(|c| c.is_control()) {
            return Err(err(
                "the layout directory must not contain ':', '@' or control characters",
            ));
        }
        Ok(Self::Layout {
            dir: PathBuf::from(dir),
            tag_or_digest: target,
        })
    }
}

impl fmt::Display for ImageSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Registry(r) => r.fmt(f),
            Self::Layout { dir, tag_or_digest } => {
                write!(f, "{LAYOUT_SCHEME}{}", dir.display())?;
                match tag_or_digest {
                    LayoutTarget::Tag(t) => write!(f, ":{t}"),
                    LayoutTarget::Digest(d) => write!(f, "@{d}"),
                }
            }
        }
    }
}

impl FromStr for ImageSource {
    type Err = ReferenceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

// The private validators below return the message of the `ReferenceError::Invalid` their
// caller builds (which names the reference); a `String` is that message, nothing to decide on.
fn validate_registry(registry: &str) -> Result<(), String> {
    let (host, port) = if let Some(rest) = registry.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("registry {registry:?}: unclosed '['"))?;
        if h.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("registry {registry:?}: invalid IPv6 address"));
        }
        match after {
            "" => (None, None),
            p => match p.strip_prefix(':') {
                Some(p) => (None, Some(p)),
                None => return Err(format!("registry {registry:?}: junk after ']'")),
            },
        }
    } else {
        match registry.rsplit_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(registry), None),
        }
    };
    if let Some(p) = port
        && (p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!("registry {registry:?}: port must be a number"));
    }
    if let Some(h) = host {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if h.is_empty() || !h.split('.').all(label_ok) {
            return Err(format!("registry {registry:?}: invalid host name"));
        }
    }
    Ok(())
}

fn validate_tag(tag: &str) -> Result<(), String> {
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && tag
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tag {tag:?} must match [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}"
        ))
    }
}

/// One path component: `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
fn component_ok(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        // A separator run: ".", "_", "__" or one or more "-".
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let valid = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !valid {
            return false;
        }
    }
    true
}

/// The longest repository name accepted.
pub const MAX_REPOSITORY_LEN: usize = 255;

fn check_repository_length(repo: &str) -> Result<(), String> {
    if repo.len() > MAX_REPOSITORY_LEN {
        return Err(format!(
            "repository name longer than {MAX_REPOSITORY_LEN} characters"
        ));
    }
    Ok(())
}

fn validate_repository(repo: &str) -> Result<(), String> {
    if repo.is_empty() {
        return Err("missing repository name".into());
    }
    check_repository_length(repo)?;
    if repo.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(format!("repository {repo:?} must be lowercase"));
    }
    if let Some(bad) = repo.split('/').find(|c| !component_ok(c)) {
        return Err(format!(
            "repository component {bad:?} must match [a-z0-9]+((.|_|__|-+)[a-z0-9]+)*"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn r(reg: &str, repo: &str, tag: Option<&str>, digest: Option<&str>) -> ImageRef {
        ImageRef {
            registry: reg.into(),
            repository: repo.into(),
            tag: tag.map(Into::into),
            digest: digest.map(|d| Digest::parse(d).unwrap()),
        }
    }

    #[test]
    fn registry_reference_table() {
        let cases: Vec<(String, ImageRef)> = vec![
            (
                "debian".into(),
                r("docker.io", "library/debian", Some("latest"), None),
            ),
            (
                "debian:bookworm".into(),
                r("docker.io", "library/debian", Some("bookworm"), None),
            ),
            (
                "oci://debian:12".into(),
                r("docker.io", "library/debian", Some("12"), None),
            ),
            (
                "user/app".into(),
                r("docker.io", "user/app", Some("latest"), None),
            ),
            (
                "index.docker.io/library/x:1".into(),
                r("docker.io", "library/x", Some("1"), None),
            ),
            (
                "mcr.microsoft.com/azurelinux/base/core:3.0".into(),
                r(
                    "mcr.microsoft.com",
                    "azurelinux/base/core",
                    Some("3.0"),
                    None,
                ),
            ),
            (
                "localhost:5000/kube/node".into(),
                r("localhost:5000", "kube/node", Some("latest"), None),
            ),
            (
                "localhost/node:v1".into(),
                r("localhost", "node", Some("v1"), None),
            ),
            (
                "127.0.0.1:5000/a_b/c-d:t".into(),
                r("127.0.0.1:5000", "a_b/c-d", Some("t"), None),
            ),
            (
                "[::1]:5000/x:y".into(),
                r("[::1]:5000", "x", Some("y"), None),
            ),
            (
                format!("ghcr.io/o/i@{D}"),
                r("ghcr.io", "o/i", None, Some(D)),
            ),
            (
                format!("ghcr.io/o/i:v1@{D}"),
                r("ghcr.io", "o/i", Some("v1"), Some(D)),
            ),
            (
                format!("alpine@{D}"),
                r("docker.io", "library/alpine", None, Some(D)),
            ),
        ];
        for (input, want) in cases {
            let got = ImageRef::parse(&input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(got, want, "{input}");
            assert_eq!(ImageRef::parse(&got.to_string()).unwrap(), got, "{input}");
        }
    }

    /// Found by the `image_ref` fuzz target: a single-component Docker Hub name of 248..=255
    /// characters was accepted, but its canonical form (`docker.io/library/<name>`) was
    /// refused as too long. The limit now counts `library/`, so every accepted reference's
    /// `Display` parses back.
    #[test]
    fn repository_length_limit_counts_the_library_prefix() {
        let longest = "a".repeat(MAX_REPOSITORY_LEN - "library/".len());
        let r = ImageRef::parse(&longest).unwrap();
        assert_eq!(r.repository.len(), MAX_REPOSITORY_LEN);
        assert_eq!(ImageRef::parse(&r.to_string()).unwrap(), r);
        let over = format!("{longest}a");
        let e = ImageRef::parse(&over).unwrap_err();
        assert!(e.reason.contains("longer than 255"), "{e}");
        // Elsewhere the name is stored as written: 255 characters are fine.
        let other = format!("ghcr.io/{}", "b".repeat(MAX_REPOSITORY_LEN));
        assert_eq!(
            ImageRef::parse(&other).unwrap().to_string(),
            format!("{other}:latest")
        );
    }

    #[test]
    fn api_host_and_reference() {
        let a = ImageRef::parse("debian").unwrap();
        assert_eq!(a.api_host(), "registry-1.docker.io");
        assert_eq!(a.reference(), "latest");
        let b = ImageRef::parse(&format!("localhost:5000/x:t@{D}")).unwrap();
        assert_eq!(b.api_host(), "localhost:5000");
        assert_eq!(b.reference(), D);
        assert_eq!(b.to_string(), format!("localhost:5000/x:t@{D}"));
    }

    #[test]
    fn bad_references_name_the_reference_and_the_problem() {
        for (input, what) in [
            ("", "empty"),
            ("Debian", "lowercase"),
            ("ghcr.io/", "missing repository"),
            ("ghcr.io/a//b", "component"),
            ("ghcr.io/a/b:", "tag"),
            ("ghcr.io/a/b:-x", "tag"),
            ("ghcr.io/a/b@sha256:abc", "digest"),
            ("ghcr.io/a/b@md5:abc", "digest"),
            ("ghcr.io:port/a", "port"),
            ("a b", "whitespace"),
            ("ghcr.io/a/b_-c", "component"),
            ("ghcr.io/-a", "component"),
            ("my_host.io/a", "host"),
            ("[zz]:5000/a", "IPv6"),
        ] {
            let e = ImageRef::parse(input).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(&format!("{input:?}")), "{msg}");
            assert!(msg.contains(what), "{input}: {msg}");
        }
    }

    #[test]
    fn layout_sources() {
        let cases = [
            (
                "oci-layout:///var/lib/img:v1".to_string(),
                ImageSource::Layout {
                    dir: "/var/lib/img".into(),
                    tag_or_digest: LayoutTarget::Tag("v1".into()),
                },
            ),
            (
                "oci-layout:///var/lib/img".to_string(),
                ImageSource::Layout {
                    dir: "/var/lib/img".into(),
                    tag_or_digest: LayoutTarget::Tag("latest".into()),
                },
            ),
            (
                format!("oci-layout:///x/y.d/@{D}"),
                ImageSource::Layout {
                    dir: "/x/y.d".into(),
                    tag_or_digest: LayoutTarget::Digest(Digest::parse(D).unwrap()),
                },
            ),
            (
                "oci://localhost:5000/a:b".to_string(),
                ImageSource::Registry(r("localhost:5000", "a", Some("b"), None)),
            ),
        ];
        for (input, want) in cases {
            let got = ImageSource::parse(&input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(got, want, "{input}");
            assert_eq!(ImageSource::parse(&got.to_string()).unwrap(), got);
        }
        for bad in [
            "oci-layout://relative/dir:tag",
            "oci-layout:///:tag",
            "oci-layout:///a/../b:tag",
            "oci-layout:///a@sha256:zz",
            "oci-layout:///a:b:c",
        ] {
            let e = ImageSource::parse(bad).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    fn component() -> impl Strategy<Value = String> {
        "[a-z0-9]{1,4}((\\.|_|__|-{1,2})[a-z0-9]{1,4}){0,2}"
    }

    fn image_ref() -> impl Strategy<Value = ImageRef> {
        let registry = prop_oneof![
            Just("docker.io".to_string()),
            Just("localhost".to_string()),
            "[a-z][a-z0-9-]{0,6}[a-z0-9]\\.[a-z]{2,3}(:[0-9]{1,5})?",
            "localhost:[0-9]{1,5}",
            "127\\.0\\.0\\.[0-9]{1,3}:[0-9]{2,5}",
        ];
        let repo = prop::collection::vec(component(), 1..4);
        let tag = prop::option::of("[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}");
        let digest = prop::option::of("[0-9a-f]{64}");
        (registry, repo, tag, digest).prop_map(|(registry, mut repo, tag, digest)| {
            if registry == "docker.io" && repo.len() == 1 {
                repo.insert(0, "library".into());
            }
            let digest = digest.map(|h| Digest::parse(&format!("sha256:{h}")).unwrap());
            let tag = if tag.is_none() && digest.is_none() {
                Some("latest".into())
            } else {
                tag
            };
            ImageRef {
                registry,
                repository: repo.join("/"),
                tag,
                digest,
            }
        })
    }

    proptest! {
        #[test]
        fn parse_display_roundtrip(x in image_ref()) {
            let shown = x.to_string();
            prop_assert_eq!(ImageRef::parse(&shown).unwrap(), x.clone());
            let src = ImageSource::Registry(x);
            prop_assert_eq!(ImageSource::parse(&src.to_string()).unwrap(), src);
        }

        #[test]
        fn layout_roundtrip(
            dir in prop::collection::vec("[A-Za-z0-9_.-]{1,8}", 1..4),
            tag in "[A-Za-z0-9_][A-Za-z0-9_.-]{0,10}",
            hexd in prop::option::of("[0-9a-f]{64}"),
        ) {
            prop_assume!(dir.iter().all(|c| c != "." && c != ".."));
            let target = match hexd {
                Some(h) => LayoutTarget::Digest(Digest::parse(&format!("sha256:{h}")).unwrap()),
                None => LayoutTarget::Tag(tag),
            };
            let src = ImageSource::Layout { dir: PathBuf::from(format!("/{}", dir.join("/"))), tag_or_digest: target };
            prop_assert_eq!(ImageSource::parse(&src.to_string()).unwrap(), src);
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,40}") {
            let _ = ImageSource::parse(&s);
        }
    }
}
