//! The agent's blue/green binary layout on a host (not in its container, where the image is
//! what runs):
//!
//! ```text
//! /usr/local/lib/aks-flex-node/blue/aks-flex-node     slot
//! /usr/local/lib/aks-flex-node/green/aks-flex-node    slot
//! /usr/local/lib/aks-flex-node/current   -> blue      what the agent's unit runs
//! /usr/local/lib/aks-flex-node/last-good -> blue      what recovery runs and rolls back to
//! /usr/local/bin/aks-flex-node -> /usr/local/lib/aks-flex-node/current/aks-flex-node
//! ```
//!
//! Links are replaced atomically (a temporary link renamed over the old one), so every reader
//! sees one slot or the other. [`Layout::converge`] builds the layout from an install that
//! predates it (a plain `/usr/local/bin/aks-flex-node`) or from the running binary.

use std::path::{Path, PathBuf};

use flex_host::fs::{FsError, HostFs};

/// The layout's directory.
pub const LIB_DIR: &str = "/usr/local/lib/aks-flex-node";
/// The command operators run, a link through `current`.
pub const BIN_LINK: &str = "/usr/local/bin/aks-flex-node";
/// The binary's name in a slot.
pub const BINARY: &str = "aks-flex-node";
/// What the agent's unit runs.
pub const CURRENT_EXEC: &str = "/usr/local/lib/aks-flex-node/current/aks-flex-node";
/// What the recovery unit runs.
pub const LAST_GOOD_EXEC: &str = "/usr/local/lib/aks-flex-node/last-good/aks-flex-node";

/// One of the two slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// `blue`.
    Blue,
    /// `green`.
    Green,
}

impl Slot {
    /// Its directory name.
    pub fn name(self) -> &'static str {
        match self {
            Slot::Blue => "blue",
            Slot::Green => "green",
        }
    }

    /// The other slot.
    pub fn other(self) -> Slot {
        match self {
            Slot::Blue => Slot::Green,
            Slot::Green => Slot::Blue,
        }
    }

    /// Parses a slot name.
    pub fn parse(s: &str) -> Option<Slot> {
        match s {
            "blue" => Some(Slot::Blue),
            "green" => Some(Slot::Green),
            _ => None,
        }
    }
}

/// Why the layout could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// A file operation failed.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// A link points somewhere that is not a slot.
    #[error("{link} points to {target:?}, not to a slot (blue or green)")]
    BadLink {
        /// The link.
        link: String,
        /// Where it points.
        target: String,
    },
    /// There is no binary to build the layout from.
    #[error(
        "no agent binary to build the layout from: neither {BIN_LINK} nor the running binary is readable"
    )]
    NoSource,
}

/// What [`Layout::converge`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Converged {
    /// The layout was already there.
    Unchanged,
    /// It was built (from the named binary) or repaired.
    Built(String),
}

/// The layout on a host.
#[derive(Clone, Debug)]
pub struct Layout {
    fs: HostFs,
}

impl Layout {
    /// The layout under `fs`'s root.
    pub fn new(fs: HostFs) -> Self {
        Self { fs }
    }

    /// A slot's binary (host path).
    pub fn slot_binary(slot: Slot) -> PathBuf {
        Path::new(LIB_DIR).join(slot.name()).join(BINARY)
    }

    fn link(name: &str) -> PathBuf {
        Path::new(LIB_DIR).join(name)
    }

    fn read_slot_link(&self, name: &str) -> Result<Option<Slot>, LayoutError> {
        let p = Self::link(name);
        match std::fs::read_link(self.fs.path(&p)) {
            Ok(t) => {
                let t = t.to_string_lossy().into_owned();
                Slot::parse(t.trim_end_matches('/'))
                    .map(Some)
                    .ok_or(LayoutError::BadLink {
                        link: p.display().to_string(),
                        target: t,
                    })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(FsError::new("readlink", &p, e).into()),
        }
    }

    /// The slot `current` names.
    pub fn current(&self) -> Result<Option<Slot>, LayoutError> {
        self.read_slot_link("current")
    }

    /// The slot `last-good` names.
    pub fn last_good(&self) -> Result<Option<Slot>, LayoutError> {
        self.read_slot_link("last-good")
    }

    /// Points `current` at `slot`.
    pub fn switch(&self, slot: Slot) -> Result<(), LayoutError> {
        self.fs
            .symlink(&Self::link("current"), Path::new(slot.name()))?;
        Ok(())
    }

    /// Points `last-good` at `slot`.
    pub fn mark_good(&self, slot: Slot) -> Result<(), LayoutError> {
        self.fs
            .symlink(&Self::link("last-good"), Path::new(slot.name()))?;
        Ok(())
    }

    /// Installs `reader`'s bytes as `slot`'s binary (mode 0755, atomically).
    pub fn install(&self, slot: Slot, reader: &mut dyn std::io::Read) -> Result<(), LayoutError> {
        self.fs.install(&Self::slot_binary(slot), reader, 0o755)?;
        Ok(())
    }

    /// The slot a binary path is in (the running binary's `/proc/self/exe`), if any.
    pub fn slot_of(path: &Path) -> Option<Slot> {
        let rel = path.strip_prefix(LIB_DIR).ok()?;
        let mut parts = rel.components();
        let slot = Slot::parse(parts.next()?.as_os_str().to_str()?)?;
        (parts.next()?.as_os_str() == BINARY && parts.next().is_none()).then_some(slot)
    }

    /// Makes sure the layout exists: both links name a slot holding a binary, and
    /// [`BIN_LINK`] links through `current`. A plain file at [`BIN_LINK`] (an install that
    /// predates the layout, or a new one `bootstrap.sh` just put there) is installed into the
    /// `current` slot (`blue` when there is none); with nothing at all, `running` (the running
    /// binary, a host path) seeds `blue`. Never changes which slot runs when the layout is there.
    pub fn converge(&self, running: Option<&Path>) -> Result<Converged, LayoutError> {
        let has_binary = |s: Slot| {
            std::fs::metadata(self.fs.path(&Self::slot_binary(s))).is_ok_and(|m| m.is_file())
        };
        let current = self.current()?.filter(|s| has_binary(*s));
        let legacy = self.fs.path(Path::new(BIN_LINK));
        let legacy_is_file =
            std::fs::symlink_metadata(&legacy).is_ok_and(|m| m.file_type().is_file());
        let mut changed = None;
        let current = match (current, legacy_is_file) {
            (Some(s), false) => s,
            (current, _) => {
                let source = if legacy_is_file {
                    legacy
                } else {
                    match running {
                        Some(r)
                            if std::fs::metadata(self.fs.path(r)).is_ok_and(|m| m.is_file()) =>
                        {
                            self.fs.path(r)
                        }
                        _ => return Err(LayoutError::NoSource),
                    }
                };
                let slot = current.unwrap_or(Slot::Blue);
                let mut f =
                    std::fs::File::open(&source).map_err(|e| FsError::new("open", &source, e))?;
                self.install(slot, &mut f)?;
                self.switch(slot)?;
                changed = Some(format!(
                    "installed {} into slot {}",
                    source.display(),
                    slot.name()
                ));
                slot
            }
        };
        match self.last_good()? {
            Some(s) if has_binary(s) => {}
            _ => {
                self.mark_good(current)?;
                changed.get_or_insert_with(|| "last-good repaired".into());
            }
        }
        if self
            .fs
            .symlink(Path::new(BIN_LINK), Path::new(CURRENT_EXEC))?
        {
            changed.get_or_insert_with(|| format!("{BIN_LINK} linked through current"));
        }
        Ok(match changed {
            Some(c) => Converged::Built(c),
            None => Converged::Unchanged,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flex_testkit::tree_snapshot;

    fn write(fs: &HostFs, p: &str, body: &str) {
        fs.write_atomic(Path::new(p), body.as_bytes(), 0o755)
            .unwrap();
    }

    fn read(fs: &HostFs, p: &str) -> String {
        std::fs::read_to_string(fs.path(Path::new(p))).unwrap()
    }

    #[test]
    fn converge_moves_a_legacy_install_into_blue_and_is_idempotent() {
        let d = tempfile::tempdir().unwrap();
        let fs = HostFs::new(d.path());
        write(&fs, BIN_LINK, "v1");
        let l = Layout::new(fs.clone());
        assert!(matches!(l.converge(None).unwrap(), Converged::Built(_)));
        assert_eq!(l.current().unwrap(), Some(Slot::Blue));
        assert_eq!(l.last_good().unwrap(), Some(Slot::Blue));
        assert_eq!(
            std::fs::read_link(fs.path(Path::new(BIN_LINK))).unwrap(),
            Path::new(CURRENT_EXEC),
            "the command runs through current"
        );
        assert_eq!(read(&fs, CURRENT_EXEC), "v1");
        assert_eq!(read(&fs, LAST_GOOD_EXEC), "v1");
        insta::assert_snapshot!(tree_snapshot(d.path()));
        assert_eq!(l.converge(None).unwrap(), Converged::Unchanged);
    }

    #[test]
    fn converge_seeds_from_the_running_binary_when_nothing_is_installed() {
        let d = tempfile::tempdir().unwrap();
        let fs = HostFs::new(d.path());
        write(&fs, "/opt/x/aks-flex-node", "running");
        let l = Layout::new(fs.clone());
        l.converge(Some(Path::new("/opt/x/aks-flex-node"))).unwrap();
        assert_eq!(read(&fs, CURRENT_EXEC), "running");
    }

    #[test]
    fn converge_without_any_binary_names_both_sources() {
        let d = tempfile::tempdir().unwrap();
        let l = Layout::new(HostFs::new(d.path()));
        let e = l.converge(None).unwrap_err().to_string();
        assert!(e.contains(BIN_LINK), "{e}");
        assert!(
            d.path().read_dir().unwrap().next().is_none(),
            "nothing half-written"
        );
    }

    #[test]
    fn converge_keeps_the_running_slot_and_repairs_last_good() {
        let d = tempfile::tempdir().unwrap();
        let fs = HostFs::new(d.path());
        let l = Layout::new(fs.clone());
        write(
            &fs,
            "/usr/local/lib/aks-flex-node/green/aks-flex-node",
            "v2",
        );
        l.switch(Slot::Green).unwrap();
        assert!(matches!(l.converge(None).unwrap(), Converged::Built(_)));
        assert_eq!(l.current().unwrap(), Some(Slot::Green));
        assert_eq!(l.last_good().unwrap(), Some(Slot::Green));
        assert_eq!(
            std::fs::read_link(fs.path(Path::new(BIN_LINK))).unwrap(),
            Path::new(CURRENT_EXEC)
        );
    }

    #[test]
    fn converge_installs_a_new_bootstrap_binary_into_the_current_slot() {
        let d = tempfile::tempdir().unwrap();
        let fs = HostFs::new(d.path());
        write(&fs, BIN_LINK, "v1");
        let l = Layout::new(fs.clone());
        l.converge(None).unwrap();
        l.install(Slot::Green, &mut "v2".as_bytes()).unwrap();
        l.switch(Slot::Green).unwrap();
        // bootstrap.sh replaces the link with a plain file (install + mv -f).
        fs.remove_file(Path::new(BIN_LINK)).unwrap();
        write(&fs, BIN_LINK, "v3");
        assert!(matches!(l.converge(None).unwrap(), Converged::Built(_)));
        assert_eq!(l.current().unwrap(), Some(Slot::Green));
        assert_eq!(read(&fs, CURRENT_EXEC), "v3");
        assert_eq!(
            std::fs::read_link(fs.path(Path::new(BIN_LINK))).unwrap(),
            Path::new(CURRENT_EXEC)
        );
        assert_eq!(read(&fs, LAST_GOOD_EXEC), "v1", "last-good is left alone");
    }

    #[test]
    fn switch_and_mark_good_are_independent() {
        let d = tempfile::tempdir().unwrap();
        let fs = HostFs::new(d.path());
        write(&fs, BIN_LINK, "v1");
        let l = Layout::new(fs.clone());
        l.converge(None).unwrap();
        l.install(Slot::Green, &mut "v2".as_bytes()).unwrap();
        l.switch(Slot::Green).unwrap();
        assert_eq!(read(&fs, CURRENT_EXEC), "v2");
        assert_eq!(read(&fs, LAST_GOOD_EXEC), "v1");
        l.switch(Slot::Blue).unwrap();
        assert_eq!(read(&fs, CURRENT_EXEC), "v1");
    }

    #[test]
    fn a_link_to_elsewhere_is_an_error_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let fs = HostFs::new(d.path());
        fs.symlink(
            Path::new("/usr/local/lib/aks-flex-node/current"),
            Path::new("/tmp/evil"),
        )
        .unwrap();
        let e = Layout::new(fs).current().unwrap_err().to_string();
        assert!(e.contains("/tmp/evil") && e.contains("current"), "{e}");
    }

    #[test]
    fn slot_of_paths() {
        assert_eq!(
            Layout::slot_of(Path::new(
                "/usr/local/lib/aks-flex-node/green/aks-flex-node"
            )),
            Some(Slot::Green)
        );
        assert_eq!(
            Layout::slot_of(Path::new("/usr/local/bin/aks-flex-node")),
            None
        );
        assert_eq!(
            Layout::slot_of(Path::new("/usr/local/lib/aks-flex-node/red/aks-flex-node")),
            None
        );
    }
}
