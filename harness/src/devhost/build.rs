//! Building blocks shared by the cached image builds ([`super`] and the fixtures module):
//! recipe hashing, the machine's Debian archive and apt proxy that the builds' mmdebstrap uses,
//! the root and tool checks, the cache lock, build directories that appear under their final
//! name only when complete, removal that never descends into a mount, and running a build
//! command with its output kept in a log file.

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use flex_host::apt::{DebianArchive, Repo};
use flex_host::runner::{Cmd, Runner};

/// SHA-256 over labelled, length-prefixed parts, so that moving bytes from one part to the
/// next changes the hash.
#[derive(Default)]
pub(crate) struct RecipeHasher(Sha256);

impl RecipeHasher {
    /// Adds one part.
    pub(crate) fn part(&mut self, label: &str, bytes: &[u8]) -> &mut Self {
        for b in [label.as_bytes(), bytes] {
            self.0.update((b.len() as u64).to_le_bytes());
            self.0.update(b);
        }
        self
    }

    /// The hex digest.
    pub(crate) fn finish(self) -> String {
        hex::encode(self.0.finalize())
    }
}

/// This machine's Debian archive ([`flex_host::apt::host_archive`] of `/`): the URIs and
/// keyring of its own Debian source, which the dev host's and the fixtures' mmdebstrap runs
/// fetch from (deb.debian.org only when the machine has no Debian source, with a note).
pub fn host_archive() -> Result<DebianArchive> {
    flex_host::apt::host_archive(Path::new("/")).context("reading this machine's apt sources")
}

/// Where a build's packages come from, for its progress line: each archive's URIs and the
/// source that names them, then what fell back to deb.debian.org.
pub(crate) fn archive_summary(a: &DebianArchive) -> String {
    let repo = |r: &Repo| match &r.origin {
        Some(o) => format!("{} ({o})", r.uris.join(" ")),
        None => r.uris.join(" "),
    };
    let mut line = format!("{} and {}", repo(&a.archive), repo(&a.security));
    for n in &a.notes {
        line.push_str("; ");
        line.push_str(n);
    }
    line
}

/// The proxy variables of the machine's apt configuration (`apt-config dump` output) that
/// mmdebstrap's apt should get, leaving out those `set` says the environment has already
/// (in either case): mmdebstrap runs apt with a configuration of its own, so the host's
/// `Acquire::http::Proxy` would not reach it; as environment variables (not `--aptopt`, which
/// mmdebstrap would also write into the image's apt configuration) they apply to this build
/// only and are no part of the recipe (a proxy does not change the packages).
pub(crate) fn apt_proxy_env(dump: &str, set: &dyn Fn(&str) -> bool) -> Vec<(String, String)> {
    flex_host::apt::proxy_env(dump)
        .into_iter()
        .filter(|(var, _)| !set(var) && !set(&var.to_ascii_uppercase()))
        .collect()
}

/// `cmd` (an mmdebstrap run) with the machine's apt proxy ([`apt_proxy_env`]); unchanged
/// where `apt-config` is missing or fails.
pub(crate) async fn with_apt_proxy(runner: &dyn Runner, cmd: Cmd, progress: &dyn Fn(&str)) -> Cmd {
    if runner.which("apt-config").is_none() {
        return cmd;
    }
    let dump = match runner.output(&Cmd::new("apt-config").arg("dump")).await {
        Ok(out) if out.success() => out.stdout,
        _ => return cmd,
    };
    let mut cmd = cmd;
    for (var, value) in apt_proxy_env(&dump, &|v| std::env::var_os(v).is_some()) {
        progress(&format!(
            "mmdebstrap's apt goes through this machine's apt proxy ({var})"
        ));
        cmd = cmd.env(var, value);
    }
    cmd
}

/// Fails unless this process runs as root (`what` says what needs it).
pub(crate) fn require_root(what: &str) -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!(
            "{what} needs root (mmdebstrap --mode=root, device nodes and file ownership in the \
             image); run it as root, e.g. with sudo"
        );
    }
    Ok(())
}

/// Makes sure `program` is on `PATH`, or fails naming the Debian `package` that provides it
/// (`cargo xtask up` installs it before the harness runs).
pub(crate) async fn ensure_tool(
    runner: &dyn Runner,
    program: &str,
    package: &str,
    _progress: &dyn Fn(&str),
) -> Result<()> {
    if runner.which(program).is_some() {
        return Ok(());
    }
    bail!(
        "{program} is not installed: install the Debian package {package} (`cargo xtask up` does as root)"
    );
}

/// An exclusive lock on `<dir>/.lock`, held until dropped (the file's lock goes with it).
pub(crate) struct CacheLock {
    _file: File,
}

/// Takes the build lock of a cache directory (created if missing), waiting for another build
/// to finish first.
pub(crate) async fn lock(dir: &Path, progress: &dyn Fn(&str)) -> Result<CacheLock> {
    use rustix::fs::{FlockOperation, flock};
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(".lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    if flock(&file, FlockOperation::NonBlockingLockExclusive).is_ok() {
        return Ok(CacheLock { _file: file });
    }
    progress(&format!(
        "waiting for another build holding {}",
        path.display()
    ));
    let file = tokio::task::spawn_blocking(move || {
        flock(&file, FlockOperation::LockExclusive).map(|()| file)
    })
    .await
    .context("lock task")?
    .with_context(|| format!("locking {}", path.display()))?;
    Ok(CacheLock { _file: file })
}

/// Mount points at or below `path`, from `/proc/self/mountinfo`.
pub(crate) fn mounts_under(path: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mountinfo(m)))
        .filter(|m| m.starts_with(path))
        .collect()
}

/// Decodes mountinfo's octal escapes (`\040` is a space).
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(
                    d.iter()
                        .fold(0u8, |acc, c| acc.wrapping_mul(8) + (c - b'0')),
                );
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Removes a build directory, unless something is still mounted inside it (a build killed
/// while mmdebstrap had /proc, /sys or /dev mounted in its chroot): removing that would
/// descend into the host's own file systems. Returns whether it was removed.
pub(crate) fn remove_build_dir(dir: &Path) -> Result<bool> {
    let mounts = mounts_under(dir);
    if !mounts.is_empty() {
        tracing::warn!(dir = %dir.display(), ?mounts, "not removing a build directory with mounts inside");
        return Ok(false);
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(e).with_context(|| format!("removing {}", dir.display())),
    }
}

/// Prefix of a build directory's name.
pub(crate) const BUILD_PREFIX: &str = ".build-";

/// Removes the leftovers of earlier, interrupted builds in `dir` (call with the lock held).
pub(crate) fn clean_stale_builds(dir: &Path, progress: &dyn Fn(&str)) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with(BUILD_PREFIX) {
            continue;
        }
        let p = e.path();
        match remove_build_dir(&p) {
            Ok(true) => progress(&format!("removed an interrupted build: {}", p.display())),
            Ok(false) => progress(&format!(
                "left an interrupted build in place (something is mounted inside): {}",
                p.display()
            )),
            Err(e) => progress(&format!("{e:#}")),
        }
    }
}

/// A fresh, empty build directory `<dir>/.build-<name>-<pid>` next to the final one.
pub(crate) fn build_dir(dir: &Path, name: &str) -> Result<PathBuf> {
    let p = dir.join(format!("{BUILD_PREFIX}{name}-{}", std::process::id()));
    if p.exists() && !remove_build_dir(&p)? {
        bail!("{} has mounts inside; unmount them first", p.display());
    }
    std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
    Ok(p)
}

/// Moves a finished build directory to its final name. When another build got there first,
/// its result is kept and this one is dropped.
pub(crate) fn publish(build: &Path, dest: &Path) -> Result<()> {
    match std::fs::rename(build, dest) {
        Ok(()) => Ok(()),
        Err(_) if dest.is_dir() => {
            remove_build_dir(build)?;
            Ok(())
        }
        Err(e) => {
            Err(e).with_context(|| format!("renaming {} to {}", build.display(), dest.display()))
        }
    }
}

/// Copies the directories and regular files of `from` into `to` (created), recursively; links
/// and other kinds of files are left out.
pub(crate) fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for e in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let e = e?;
        let t = e.file_type()?;
        let dest = to.join(e.file_name());
        if t.is_dir() {
            copy_tree(&e.path(), &dest)?;
        } else if t.is_file() {
            std::fs::copy(e.path(), &dest)
                .with_context(|| format!("copying {} to {}", e.path().display(), dest.display()))?;
        }
    }
    Ok(())
}

/// Writes `contents` to `root/rel` with `mode`, creating parent directories with mode 0755.
pub(crate) fn write_file(root: &Path, rel: &str, contents: &[u8], mode: u32) -> Result<()> {
    let path = root.join(rel);
    if let Some(parent) = path.parent() {
        create_dirs_0755(root, parent)?;
    }
    std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", path.display()))?;
    Ok(())
}

/// Creates `dir` and its missing parents below `root`, each with mode 0755 whatever the umask.
fn create_dirs_0755(root: &Path, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let rel = dir.strip_prefix(root).unwrap_or(dir);
    let mut p = root.to_path_buf();
    for c in rel.components() {
        p.push(c);
        if !p.is_dir() {
            std::fs::create_dir(&p).with_context(|| format!("creating {}", p.display()))?;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
                .with_context(|| format!("chmod {}", p.display()))?;
        }
    }
    Ok(())
}

/// `s` quoted for `sh`.
pub(crate) fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Runs `cmd`, appending its argv, stdout and stderr to `log`; on failure the error names the
/// log and quotes the last lines of stderr.
pub(crate) async fn run_logged(runner: &dyn Runner, cmd: &Cmd, log: &Path) -> Result<()> {
    use std::io::Write;
    let out = runner.output(cmd).await?;
    let mut f = File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    writeln!(
        f,
        "$ {}\n{}{}[exit {:?}]\n",
        cmd.display_argv(),
        out.stdout,
        out.stderr,
        out.code
    )
    .with_context(|| format!("writing {}", log.display()))?;
    if out.success() {
        return Ok(());
    }
    let lines: Vec<&str> = out.stderr.lines().collect();
    let tail = lines[lines.len().saturating_sub(25)..].join("\n");
    bail!(
        "{} failed (exit {:?}); full output in {}:\n{tail}",
        cmd.display_argv(),
        out.code,
        log.display()
    )
}

/// Bytes allocated on disk for `path` (a sparse file's real size).
pub(crate) fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0)
}

/// The one entry of `dir` whose name starts with `prefix` (`vmlinuz-`); zero or several are
/// errors.
pub(crate) fn single_entry(dir: &Path, prefix: &str) -> Result<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => bail!("no {prefix}* in {}", dir.display()),
        _ => bail!("several {prefix}* in {}: {found:?}", dir.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hasher_separates_parts() {
        let h = |parts: &[(&str, &str)]| {
            let mut r = RecipeHasher::default();
            for (l, b) in parts {
                r.part(l, b.as_bytes());
            }
            r.finish()
        };
        assert_eq!(h(&[("a", "bc")]), h(&[("a", "bc")]));
        assert_ne!(h(&[("a", "bc")]), h(&[("a", "b"), ("", "c")]));
        assert_ne!(h(&[("a", "bc")]), h(&[("ab", "c")]));
        assert_eq!(h(&[]).len(), 64);
    }

    /// The machine's apt proxy reaches mmdebstrap's apt as environment variables, unless the
    /// environment names one of its own (in either case).
    #[test]
    fn apt_proxy_goes_to_mmdebstrap_unless_the_environment_has_one() {
        let dump = "Acquire::http::Proxy \"http://proxy:3128/\";\nAcquire::https::Proxy \"http://proxy:3128/\";\n";
        let none = |_: &str| false;
        assert_eq!(
            apt_proxy_env(dump, &none),
            [
                ("http_proxy".to_string(), "http://proxy:3128/".to_string()),
                ("https_proxy".to_string(), "http://proxy:3128/".to_string())
            ]
        );
        let upper = |v: &str| v == "HTTPS_PROXY";
        assert_eq!(
            apt_proxy_env(dump, &upper),
            [("http_proxy".to_string(), "http://proxy:3128/".to_string())]
        );
        assert!(apt_proxy_env("APT::Architecture \"amd64\";\n", &none).is_empty());
    }

    #[test]
    fn the_progress_line_names_the_archives_and_the_fallback() {
        let fallback = DebianArchive::fallback();
        assert_eq!(
            archive_summary(&fallback),
            "http://deb.debian.org/debian and http://deb.debian.org/debian-security"
        );
        let sources = flex_host::apt::parse_list(
            "deb http://mirror.corp/debian bookworm main\n",
            "/etc/apt/sources.list",
        )
        .unwrap();
        let a = DebianArchive::find(&sources, "bookworm");
        let line = archive_summary(&a);
        assert!(
            line.starts_with("http://mirror.corp/debian (/etc/apt/sources.list:1) and http://deb.debian.org/debian-security; no enabled apt source of bookworm-security"),
            "{line}"
        );
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo(r"/a\040b/c"), "/a b/c");
        assert_eq!(unescape_mountinfo(r"/x\134y"), r"/x\y");
        assert_eq!(unescape_mountinfo(r"/tail\04"), r"/tail\04");
    }

    #[test]
    fn quoting() {
        assert_eq!(sh_quote("/a b"), "'/a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn publish_keeps_the_first_result() {
        let d = tempfile::tempdir().unwrap();
        let a = build_dir(d.path(), "x").unwrap();
        write_file(&a.join("new"), "f/g", b"0", 0o644).unwrap();
        write_file(&a, "f/g", b"1", 0o644).unwrap();
        let dest = d.path().join("final");
        publish(&a, &dest).unwrap();
        assert_eq!(std::fs::read(dest.join("f/g")).unwrap(), b"1");
        let b = build_dir(d.path(), "x").unwrap();
        write_file(&b, "f/g", b"2", 0o644).unwrap();
        publish(&b, &dest).unwrap();
        assert_eq!(std::fs::read(dest.join("f/g")).unwrap(), b"1");
        assert!(!b.exists());
        let mode = std::fs::metadata(dest.join("f"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
    }
}
