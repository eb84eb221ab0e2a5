//! The machine's apt sources, read and never changed: one parser of apt's two source formats
//! (one-line `sources.list` entries and deb822 `.sources` stanzas) and one rule that finds the
//! Debian archive the machine already uses ([`DebianArchive::find`]), so that the sources the
//! project adds — xtask's `<codename>-backports` source, the harness's mmdebstrap mirror lines —
//! take the machine's own mirror (or proxy path) and keyring instead of an address written into
//! the repository. [`FALLBACK_ARCHIVE`] is used only when the machine has no Debian source, and
//! the result says so in its [`DebianArchive::notes`].
//!
//! Pure but for [`read_sources`] and [`host_archive`], which read files under a root the caller
//! names (`/` for the machine itself, a temporary directory in tests).
//!
//! It lives in the host crate because it is host configuration and both of its users already
//! depend on this crate: xtask (which must not link the harness) and the harness.

use std::path::{Path, PathBuf};

/// Debian's archive, when the machine has no Debian source of its own.
pub const FALLBACK_ARCHIVE: &str = "http://deb.debian.org/debian";

/// Debian's security archive, when the machine has no `<codename>-security` source.
pub const FALLBACK_SECURITY: &str = "http://deb.debian.org/debian-security";

/// The keyring of Debian's archive (package `debian-archive-keyring`): what a source without
/// `Signed-By` is checked against on Debian, and what a derived deb822 source names then.
pub const DEFAULT_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// An apt source file apt itself would refuse, or one that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AptError {
    /// A line or stanza apt would refuse.
    #[error("{origin}: {what}")]
    Parse {
        /// `file:line`.
        origin: String,
        /// What is wrong.
        what: String,
    },
    /// A file or directory that exists could not be read.
    #[error("reading {}: {cause}", path.display())]
    Read {
        /// The path.
        path: PathBuf,
        /// The OS error (in the message, not a `source()`: see [`crate::error`]).
        cause: std::io::Error,
    },
}

fn parse_error(file: &str, line: usize, what: impl Into<String>) -> AptError {
    AptError::Parse {
        origin: format!("{file}:{line}"),
        what: what.into(),
    }
}

/// One apt source: a deb822 stanza or a one-line entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// Where it was read: `file:line` (the stanza's first line).
    pub origin: String,
    /// `deb`, `deb-src`.
    pub types: Vec<String>,
    /// The archive URIs, a trailing `/` removed.
    pub uris: Vec<String>,
    /// The suites (`bookworm`, `bookworm-updates`, …).
    pub suites: Vec<String>,
    /// The components (`main`, …).
    pub components: Vec<String>,
    /// `Signed-By` (`signed-by=`): keyring paths or fingerprints, or an embedded key whose
    /// lines are joined by `\n` (an empty line of the key is an empty string between them).
    pub signed_by: Option<String>,
    /// `Enabled: no` makes it `false`; one-line entries are always enabled (a disabled one is a
    /// comment).
    pub enabled: bool,
}

impl Source {
    /// Whether apt fetches binary packages of `suite` from it.
    pub fn serves(&self, suite: &str) -> bool {
        self.enabled
            && self.types.iter().any(|t| t == "deb")
            && self.suites.iter().any(|s| s == suite)
    }
}

fn normalise_uri(uri: &str) -> String {
    uri.trim_end_matches('/').to_string()
}

/// apt's boolean words (`Enabled:`).
fn apt_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "yes" | "true" | "with" | "on" | "enable" => Some(true),
        "no" | "false" | "without" | "off" | "disable" => Some(false),
        _ => None,
    }
}

/// The deb822 stanzas of a `.sources` file (`file` names it in errors and origins): `#`
/// comment lines, continuation lines (` .` is an empty one), field names in any case, several
/// URIs and suites per stanza, `Enabled:`. A stanza without `Types`, `URIs` or `Suites`, or
/// without `Components` for a suite that is not a flat path (`dists/` ends in `/`), is refused
/// as apt refuses it.
pub fn parse_deb822(text: &str, file: &str) -> Result<Vec<Source>, AptError> {
    let mut out = Vec::new();
    let mut fields: Vec<(String, Vec<String>)> = Vec::new();
    let mut start = 0;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        if raw.starts_with('#') {
            continue;
        }
        if raw.trim().is_empty() {
            if !fields.is_empty() {
                out.push(stanza(&fields, file, start)?);
                fields.clear();
            }
            continue;
        }
        if raw.starts_with([' ', '\t']) {
            let Some((_, lines)) = fields.last_mut() else {
                return Err(parse_error(file, n, "a continuation line outside a field"));
            };
            let v = raw.trim();
            lines.push(if v == "." {
                String::new()
            } else {
                v.to_string()
            });
            continue;
        }
        let Some((name, value)) = raw.split_once(':') else {
            return Err(parse_error(
                file,
                n,
                format!("not a field (`Name: value`): {raw:?}"),
            ));
        };
        if fields.is_empty() {
            start = n;
        }
        fields.push((
            name.trim().to_ascii_lowercase(),
            vec![value.trim().to_string()],
        ));
    }
    if !fields.is_empty() {
        out.push(stanza(&fields, file, start)?);
    }
    Ok(out)
}

fn stanza(fields: &[(String, Vec<String>)], file: &str, line: usize) -> Result<Source, AptError> {
    let get = |name: &str| {
        fields
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, lines)| lines)
    };
    let words = |name: &str| -> Vec<String> {
        get(name)
            .map(|lines| {
                lines
                    .iter()
                    .flat_map(|l| l.split_whitespace())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let required = |name: &str, field: &str| -> Result<Vec<String>, AptError> {
        let w = words(name);
        if w.is_empty() {
            return Err(parse_error(file, line, format!("a stanza without {field}")));
        }
        Ok(w)
    };
    let types = required("types", "Types")?;
    let uris = required("uris", "URIs")?;
    let suites = required("suites", "Suites")?;
    let components = words("components");
    if components.is_empty() && !suites.iter().all(|s| s.ends_with('/')) {
        return Err(parse_error(file, line, "a stanza without Components"));
    }
    let enabled = match get("enabled").map(|l| l.join(" ")) {
        None => true,
        Some(v) => apt_bool(v.trim())
            .ok_or_else(|| parse_error(file, line, format!("Enabled: {v:?} is not yes or no")))?,
    };
    // An embedded key keeps its lines (the first, on the field's own line, is usually empty).
    let signed_by = get("signed-by")
        .filter(|lines| lines.iter().any(|l| !l.is_empty()))
        .map(|lines| lines.join("\n"));
    Ok(Source {
        origin: format!("{file}:{line}"),
        types,
        uris: uris.iter().map(|u| normalise_uri(u)).collect(),
        suites,
        components,
        signed_by,
        enabled,
    })
}

/// The one-line entries of a `.list` file (`file` names it in errors and origins):
/// `deb [option=value …] URI SUITE [COMPONENT…]`, `deb-src` likewise, anything after `#` a
/// comment. A line apt would refuse (another type, no suite, an unclosed `[`, no component for
/// a suite that is not a flat path) is an error.
pub fn parse_list(text: &str, file: &str) -> Result<Vec<Source>, AptError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let (ty, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        if ty != "deb" && ty != "deb-src" {
            return Err(parse_error(
                file,
                n,
                format!("unknown type {ty:?} (deb or deb-src)"),
            ));
        }
        let rest = rest.trim_start();
        let (options, rest) = match rest.strip_prefix('[') {
            Some(after) => after
                .split_once(']')
                .ok_or_else(|| parse_error(file, n, "an option list `[` without its `]`"))?,
            None => ("", rest),
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        let [uri, suite, components @ ..] = words.as_slice() else {
            return Err(parse_error(file, n, "an entry needs a URI and a suite"));
        };
        if components.is_empty() && !suite.ends_with('/') {
            return Err(parse_error(file, n, "an entry without components"));
        }
        let signed_by = options
            .split_whitespace()
            .filter_map(|o| o.split_once('='))
            .find(|(k, _)| k.eq_ignore_ascii_case("signed-by"))
            .map(|(_, v)| v.to_string());
        out.push(Source {
            origin: format!("{file}:{n}"),
            types: vec![ty.to_string()],
            uris: vec![normalise_uri(uri)],
            suites: vec![suite.to_string()],
            components: components.iter().map(|c| c.to_string()).collect(),
            signed_by,
            enabled: true,
        });
    }
    Ok(out)
}

/// Every source apt reads under the apt directory `etc_apt` (`/etc/apt`): `sources.list`, then
/// `sources.list.d/*.list` and `*.sources` in name order. Like apt, files with another
/// extension (`.save`, `.disabled`, …) or a name outside `[A-Za-z0-9_.-]` are ignored; a
/// missing file or directory is no source.
pub fn read_sources(etc_apt: &Path) -> Result<Vec<Source>, AptError> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|cause| AptError::Read {
            path: path.to_path_buf(),
            cause,
        })
    };
    let mut out = Vec::new();
    let list = etc_apt.join("sources.list");
    if list.is_file() {
        out.extend(parse_list(&read(&list)?, &list.display().to_string())?);
    }
    let dir = etc_apt.join("sources.list.d");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(cause) => return Err(AptError::Read { path: dir, cause }),
    };
    let mut files = Vec::new();
    for e in entries {
        let e = e.map_err(|cause| AptError::Read {
            path: dir.clone(),
            cause,
        })?;
        let name = e.file_name().to_string_lossy().into_owned();
        let valid = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if valid && (name.ends_with(".list") || name.ends_with(".sources")) {
            files.push((name, e.path()));
        }
    }
    files.sort();
    for (name, path) in files {
        let text = read(&path)?;
        let shown = path.display().to_string();
        out.extend(if name.ends_with(".sources") {
            parse_deb822(&text, &shown)?
        } else {
            parse_list(&text, &shown)?
        });
    }
    Ok(out)
}

/// Whether any enabled source serves `suite` (`bookworm-backports` already configured).
pub fn serves(sources: &[Source], suite: &str) -> bool {
    sources.iter().any(|s| s.serves(suite))
}

/// The release codename of a Debian system from its `/etc/os-release` (`VERSION_CODENAME`,
/// when `ID` is `debian`); `None` on any other system.
pub fn debian_codename(os_release: &str) -> Option<String> {
    let value = |key: &str| {
        os_release.lines().find_map(|l| {
            l.trim()
                .strip_prefix(key)
                .and_then(|r| r.strip_prefix('='))
                .map(|v| v.trim().trim_matches(['"', '\'']).to_string())
        })
    };
    (value("ID").as_deref() == Some("debian"))
        .then(|| value("VERSION_CODENAME"))
        .flatten()
        .filter(|c| !c.is_empty())
}

/// One archive of a [`DebianArchive`]: its URIs and keyring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repo {
    /// The URIs (one or more; apt takes them as mirrors of each other).
    pub uris: Vec<String>,
    /// The source's `Signed-By`; `None` when it has none (Debian's keyring, [`DEFAULT_KEYRING`],
    /// is what apt then checks against).
    pub signed_by: Option<String>,
    /// Where it was found (`file:line`); `None` for the fallback.
    pub origin: Option<String>,
}

impl Repo {
    fn fallback(uri: &str) -> Self {
        Self {
            uris: vec![uri.to_string()],
            signed_by: None,
            origin: None,
        }
    }

    fn of(s: &Source) -> Self {
        Self {
            uris: s.uris.clone(),
            signed_by: s.signed_by.clone(),
            origin: Some(s.origin.clone()),
        }
    }

    /// The one-line `[signed-by=…]` option, when the keyring is not Debian's own (mmdebstrap
    /// checks Debian's suites against the host's Debian keys itself) and fits on one line.
    fn one_line_options(&self) -> String {
        match &self.signed_by {
            Some(k) if k != DEFAULT_KEYRING && !k.contains(char::is_whitespace) => {
                format!(" [signed-by={k}]")
            }
            _ => String::new(),
        }
    }
}

/// The Debian archive a machine uses: its main archive (the source of the release's own
/// suite, which also serves `-updates` and `-backports`) and its security archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebianArchive {
    /// The source whose suites include the release codename.
    pub archive: Repo,
    /// The source whose suites include `<codename>-security`.
    pub security: Repo,
    /// What was not found and fell back to Debian's own servers (empty when both came from the
    /// machine's configuration): for the caller to show.
    pub notes: Vec<String>,
}

impl DebianArchive {
    /// Debian's own servers ([`FALLBACK_ARCHIVE`], [`FALLBACK_SECURITY`]), Debian's keyring.
    pub fn fallback() -> Self {
        Self {
            archive: Repo::fallback(FALLBACK_ARCHIVE),
            security: Repo::fallback(FALLBACK_SECURITY),
            notes: Vec::new(),
        }
    }

    /// The rule: the archive is the first enabled `deb` source whose suites include `codename`
    /// itself (not `-updates`, `-security` or `-backports`), the security archive the first
    /// whose suites include `<codename>-security`. Either one missing falls back to Debian's
    /// own server, with a note.
    pub fn find(sources: &[Source], codename: &str) -> Self {
        let mut found = Self::fallback();
        match sources.iter().find(|s| s.serves(codename)) {
            Some(s) => found.archive = Repo::of(s),
            None => found.notes.push(format!(
                "no enabled apt source of Debian {codename}: using {FALLBACK_ARCHIVE}"
            )),
        }
        let security = format!("{codename}-security");
        match sources.iter().find(|s| s.serves(&security)) {
            Some(s) => found.security = Repo::of(s),
            None => found.notes.push(format!(
                "no enabled apt source of {security}: using {FALLBACK_SECURITY}"
            )),
        }
        found
    }

    /// The deb822 source of `<codename>-backports` (component `main`): the archive's URIs and
    /// keyring ([`DEFAULT_KEYRING`] when the machine's source names none), an embedded key
    /// kept as continuation lines.
    pub fn backports_source(&self, codename: &str) -> String {
        let keyring = self.archive.signed_by.as_deref().unwrap_or(DEFAULT_KEYRING);
        let mut signed_by = String::from("Signed-By:");
        for (i, line) in keyring.split('\n').enumerate() {
            match (i, line.is_empty()) {
                (0, true) => {}
                (0, false) => {
                    signed_by.push(' ');
                    signed_by.push_str(line);
                }
                (_, true) => signed_by.push_str("\n ."),
                (_, false) => {
                    signed_by.push_str("\n ");
                    signed_by.push_str(line);
                }
            }
        }
        format!(
            "Types: deb\nURIs: {}\nSuites: {codename}-backports\nComponents: main\n{signed_by}\n",
            self.archive.uris.join(" ")
        )
    }

    /// mmdebstrap's mirror arguments for a build of `suite` (which need not be the machine's
    /// own release): one-line `deb` entries of component `main` for `suite` and
    /// `<suite>-updates` from the archive and `<suite>-security` from the security archive,
    /// one per URI. A keyring other than Debian's is passed as `[signed-by=…]`; Debian's own
    /// (or none, or an embedded key, which a one-line entry cannot carry) is left to
    /// mmdebstrap, which checks Debian's suites against the host's Debian keys.
    pub fn mmdebstrap_mirrors(&self, suite: &str) -> Vec<String> {
        let mut out = Vec::new();
        for (repo, suites) in [
            (
                &self.archive,
                vec![suite.to_string(), format!("{suite}-updates")],
            ),
            (&self.security, vec![format!("{suite}-security")]),
        ] {
            let opts = repo.one_line_options();
            for s in &suites {
                for uri in &repo.uris {
                    out.push(format!("deb{opts} {uri} {s} main"));
                }
            }
        }
        out
    }
}

/// The Debian archive of the system under `root` (`/`): [`DebianArchive::find`] over
/// [`read_sources`] of `<root>/etc/apt` for the codename in `<root>/etc/os-release`. A system
/// that is not Debian (or names no codename) gets [`DebianArchive::fallback`], with a note.
pub fn host_archive(root: &Path) -> Result<DebianArchive, AptError> {
    let os = root.join("etc/os-release");
    let codename = match std::fs::read_to_string(&os) {
        Ok(text) => debian_codename(&text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(cause) => return Err(AptError::Read { path: os, cause }),
    };
    let Some(codename) = codename else {
        let mut a = DebianArchive::fallback();
        a.notes.push(format!(
            "{} names no Debian release: using {FALLBACK_ARCHIVE} and {FALLBACK_SECURITY}",
            os.display()
        ));
        return Ok(a);
    };
    Ok(DebianArchive::find(
        &read_sources(&root.join("etc/apt"))?,
        &codename,
    ))
}

/// The proxies of the machine's apt configuration, from `apt-config dump` output, as the
/// environment variables apt's own methods read (`http_proxy`, `https_proxy`): for a program
/// that runs apt with a configuration of its own (mmdebstrap does), so the machine's proxy
/// applies to it too. `DIRECT`, `false` and per-host settings are left out.
pub fn proxy_env(apt_config_dump: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (key, var) in [
        ("Acquire::http::Proxy", "http_proxy"),
        ("Acquire::https::Proxy", "https_proxy"),
    ] {
        let value = apt_config_dump.lines().find_map(|l| {
            let (k, v) = l.trim().split_once(char::is_whitespace)?;
            k.eq_ignore_ascii_case(key)
                .then(|| v.trim().trim_end_matches(';').trim_matches('"').to_string())
        });
        if let Some(v) = value.filter(|v| {
            !v.is_empty() && !v.eq_ignore_ascii_case("DIRECT") && !v.eq_ignore_ascii_case("false")
        }) {
            out.push((var.to_string(), v));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// This machine's file (Debian 12's installer writes the same).
    const DEBIAN_SOURCES: &str = "\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
";

    const TODAY_BACKPORTS: &str = "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n";

    fn today_mirrors(suite: &str) -> Vec<String> {
        vec![
            format!("deb http://deb.debian.org/debian {suite} main"),
            format!("deb http://deb.debian.org/debian {suite}-updates main"),
            format!("deb http://deb.debian.org/debian-security {suite}-security main"),
        ]
    }

    /// (name, files as (path under etc/apt, text), backports source, mmdebstrap lines for
    /// trixie, notes).
    type Case = (
        &'static str,
        &'static [(&'static str, &'static str)],
        &'static str,
        &'static [&'static str],
        usize,
    );

    const CASES: &[Case] = &[
        (
            "Debian 12's deb822 file: what the repository wrote before",
            &[("sources.list.d/debian.sources", DEBIAN_SOURCES)],
            TODAY_BACKPORTS,
            &[
                "deb http://deb.debian.org/debian trixie main",
                "deb http://deb.debian.org/debian trixie-updates main",
                "deb http://deb.debian.org/debian-security trixie-security main",
            ],
            0,
        ),
        (
            "one-line sources.list behind a mirror, signed-by, a comment, deb-src and a third party",
            &[
                (
                    "sources.list",
                    "# the mirror\n\
                     deb [arch=amd64 signed-by=/etc/apt/keyrings/corp.gpg] http://mirror.corp/debian/ bookworm main contrib # why\n\
                     deb-src http://mirror.corp/debian bookworm main\n\
                     deb http://mirror.corp/debian bookworm-updates main\n\
                     deb [ signed-by=/etc/apt/keyrings/corp.gpg ] http://mirror.corp/debian-security bookworm-security main\n",
                ),
                (
                    "sources.list.d/docker.list",
                    "deb [signed-by=/etc/apt/keyrings/docker.gpg] https://download.docker.com/linux/debian bookworm stable\n",
                ),
            ],
            "Types: deb\nURIs: http://mirror.corp/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /etc/apt/keyrings/corp.gpg\n",
            &[
                "deb [signed-by=/etc/apt/keyrings/corp.gpg] http://mirror.corp/debian trixie main",
                "deb [signed-by=/etc/apt/keyrings/corp.gpg] http://mirror.corp/debian trixie-updates main",
                "deb [signed-by=/etc/apt/keyrings/corp.gpg] http://mirror.corp/debian-security trixie-security main",
            ],
            0,
        ),
        (
            "a disabled stanza, a proxy path, two URIs, no Signed-By, field names in any case",
            &[
                (
                    "sources.list.d/a-old.sources",
                    "Types: deb\nURIs: http://old.example/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n",
                ),
                (
                    "sources.list.d/debian.sources",
                    "types: deb deb-src\nuris: http://cacher:3142/deb.debian.org/debian\n http://cacher2:3142/deb.debian.org/debian\nsuites: bookworm bookworm-updates\ncomponents: main\n\n\
                     Types: deb\nURIs: http://cacher:3142/security.debian.org/debian-security\nSuites: bookworm-security\nComponents: main\n",
                ),
                ("sources.list.d/ignored.sources.save", "not a source at all"),
            ],
            "Types: deb\nURIs: http://cacher:3142/deb.debian.org/debian http://cacher2:3142/deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
            &[
                "deb http://cacher:3142/deb.debian.org/debian trixie main",
                "deb http://cacher2:3142/deb.debian.org/debian trixie main",
                "deb http://cacher:3142/deb.debian.org/debian trixie-updates main",
                "deb http://cacher2:3142/deb.debian.org/debian trixie-updates main",
                "deb http://cacher:3142/security.debian.org/debian-security trixie-security main",
            ],
            0,
        ),
        (
            "an embedded key, no security source",
            &[(
                "sources.list.d/debian.sources",
                "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\nComponents: main\nSigned-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n mQINBF\n -----END PGP PUBLIC KEY BLOCK-----\n",
            )],
            "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n mQINBF\n -----END PGP PUBLIC KEY BLOCK-----\n",
            &[
                "deb http://mirror.example/debian trixie main",
                "deb http://mirror.example/debian trixie-updates main",
                "deb http://deb.debian.org/debian-security trixie-security main",
            ],
            1,
        ),
        (
            "only a -updates and a third-party source: nothing of bookworm itself",
            &[(
                "sources.list",
                "deb http://mirror.example/debian bookworm-updates main\ndeb https://packages.example/apt bookworm-backports main\n",
            )],
            TODAY_BACKPORTS,
            &[
                "deb http://deb.debian.org/debian trixie main",
                "deb http://deb.debian.org/debian trixie-updates main",
                "deb http://deb.debian.org/debian-security trixie-security main",
            ],
            2,
        ),
        ("no apt directory at all", &[], TODAY_BACKPORTS, &[], 2),
    ];

    fn root_with(files: &[(&str, &str)], os_release: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("etc")).unwrap();
        std::fs::write(d.path().join("etc/os-release"), os_release).unwrap();
        for (path, text) in files {
            let p = d.path().join("etc/apt").join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        d
    }

    const BOOKWORM: &str =
        "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_CODENAME=bookworm\n";

    #[test]
    fn the_machines_archive_over_sample_apt_directories() {
        for (name, files, backports, trixie, notes) in CASES {
            let root = root_with(files, BOOKWORM);
            let a = host_archive(root.path()).unwrap();
            assert_eq!(a.backports_source("bookworm"), *backports, "{name}");
            let want: Vec<String> = if trixie.is_empty() {
                today_mirrors("trixie")
            } else {
                trixie.iter().map(|s| s.to_string()).collect()
            };
            assert_eq!(a.mmdebstrap_mirrors("trixie"), want, "{name}");
            assert_eq!(a.notes.len(), *notes, "{name}: {:?}", a.notes);
        }
    }

    /// On a machine whose source is deb.debian.org the lines are the ones the repository wrote
    /// before, byte for byte (the dev host's recipe hash covers them), and so is the fallback.
    #[test]
    fn deb_debian_org_gives_the_lines_written_before() {
        let sources = parse_deb822(DEBIAN_SOURCES, "debian.sources").unwrap();
        let a = DebianArchive::find(&sources, "bookworm");
        assert!(a.notes.is_empty());
        assert_eq!(a.archive.origin.as_deref(), Some("debian.sources:1"));
        assert_eq!(a.security.origin.as_deref(), Some("debian.sources:8"));
        for suite in ["bookworm", "trixie"] {
            assert_eq!(a.mmdebstrap_mirrors(suite), today_mirrors(suite));
            assert_eq!(
                DebianArchive::fallback().mmdebstrap_mirrors(suite),
                today_mirrors(suite)
            );
        }
        assert_eq!(a.backports_source("bookworm"), TODAY_BACKPORTS);
        assert_eq!(
            DebianArchive::fallback().backports_source("bookworm"),
            TODAY_BACKPORTS
        );
        // A trailing slash is the same archive.
        let slash = DEBIAN_SOURCES.replace("debian\n", "debian/\n");
        let b = DebianArchive::find(&parse_deb822(&slash, "x").unwrap(), "bookworm");
        assert_eq!(b.mmdebstrap_mirrors("bookworm"), today_mirrors("bookworm"));
    }

    #[test]
    fn a_system_that_is_not_debian_falls_back_and_says_so() {
        let ubuntu = "ID=ubuntu\nID_LIKE=debian\nVERSION_CODENAME=noble\n";
        let root = root_with(
            &[(
                "sources.list",
                "deb http://archive.ubuntu.com/ubuntu noble main\n",
            )],
            ubuntu,
        );
        let a = host_archive(root.path()).unwrap();
        assert_eq!(a.archive, DebianArchive::fallback().archive);
        assert_eq!(a.notes.len(), 1);
        assert!(
            a.notes[0].contains("names no Debian release"),
            "{:?}",
            a.notes
        );
        assert_eq!(debian_codename(BOOKWORM).as_deref(), Some("bookworm"));
        assert_eq!(
            debian_codename("ID='debian'\nVERSION_CODENAME=\"trixie\"").as_deref(),
            Some("trixie")
        );
        assert_eq!(debian_codename("ID=debian\n"), None);
        assert_eq!(debian_codename(ubuntu), None);
    }

    #[test]
    fn what_apt_would_refuse_is_an_error_naming_file_and_line() {
        for (text, line, what) in [
            (
                "Types: deb\nURIs: http://x\nComponents: main\n",
                1,
                "without Suites",
            ),
            (
                "Types: deb\nURIs: http://x\nSuites: bookworm\n",
                1,
                "without Components",
            ),
            ("\n\nTypes: deb\nnot a field\n", 4, "not a field"),
            (" continued\n", 1, "continuation"),
            (
                "Types: deb\nURIs: http://x\nSuites: b\nComponents: main\nEnabled: maybe\n",
                1,
                "Enabled",
            ),
        ] {
            let e = parse_deb822(text, "f.sources").unwrap_err().to_string();
            assert!(e.starts_with(&format!("f.sources:{line}: ")), "{e}");
            assert!(e.contains(what), "{e}");
        }
        for (text, what) in [
            ("deb http://x\n", "a URI and a suite"),
            ("deb http://x bookworm\n", "without components"),
            (
                "deb [signed-by=/k http://x bookworm main\n",
                "without its `]`",
            ),
            ("rpm http://x bookworm main\n", "unknown type"),
        ] {
            let e = parse_list(text, "f.list").unwrap_err().to_string();
            assert!(e.starts_with("f.list:1: "), "{e}");
            assert!(e.contains(what), "{e}");
        }
        // A flat repository needs no component.
        assert_eq!(
            parse_list("deb http://x ./\n", "f").unwrap()[0].suites,
            ["./"]
        );
        assert_eq!(
            parse_deb822("Types: deb\nURIs: http://x\nSuites: ./\n", "f").unwrap()[0].components,
            Vec::<String>::new()
        );
        let root = root_with(&[("sources.list.d/bad.list", "deb http://x\n")], BOOKWORM);
        let e = host_archive(root.path()).unwrap_err().to_string();
        assert!(e.contains("bad.list:1: "), "{e}");
    }

    #[test]
    fn read_errors_name_the_path_once() {
        let root = root_with(&[], BOOKWORM);
        std::fs::create_dir_all(root.path().join("etc/apt/sources.list")).unwrap();
        let e = read_sources(&root.path().join("etc/apt"));
        // A directory named sources.list is not a file: ignored, as apt ignores it.
        assert!(e.unwrap().is_empty());
        let e = AptError::Read {
            path: PathBuf::from("/etc/apt/sources.list"),
            cause: std::io::Error::other("denied"),
        };
        assert_eq!(e.to_string(), "reading /etc/apt/sources.list: denied");
        assert!(std::error::Error::source(&e).is_none());
    }

    #[test]
    fn backports_already_configured_is_seen_in_either_format() {
        let one = parse_list("deb http://m/debian bookworm-backports main\n", "f").unwrap();
        assert!(serves(&one, "bookworm-backports"));
        let off = parse_deb822(
            "Types: deb\nURIs: http://m/debian\nSuites: bookworm-backports\nComponents: main\nEnabled: no\n",
            "f",
        )
        .unwrap();
        assert!(!serves(&off, "bookworm-backports"));
        let src = parse_list("deb-src http://m/debian bookworm-backports main\n", "f").unwrap();
        assert!(!serves(&src, "bookworm-backports"));
    }

    #[test]
    fn the_apt_proxy_from_apt_config_dump() {
        let dump = "APT \"\";\nAcquire::http::Proxy \"http://proxy.corp:3128/\";\nAcquire::http::Proxy::deb.debian.org \"DIRECT\";\nAcquire::https::Proxy \"DIRECT\";\n";
        assert_eq!(
            proxy_env(dump),
            [(
                "http_proxy".to_string(),
                "http://proxy.corp:3128/".to_string()
            )]
        );
        assert!(proxy_env("APT \"\";\nAPT::Architecture \"amd64\";\n").is_empty());
        assert_eq!(
            proxy_env("Acquire::https::Proxy \"http://p:8080\";\n"),
            [("https_proxy".to_string(), "http://p:8080".to_string())]
        );
    }
}
