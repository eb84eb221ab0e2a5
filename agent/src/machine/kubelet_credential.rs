//! kubelet's client credential across provisions, so that a bootstrap token serves the first
//! join only (#29 item 1).
//!
//! With a bootstrap token, kubelet's first start is a TLS bootstrap: it reads the token from
//! `/var/lib/kubelet/bootstrap-kubeconfig`, gets its client certificate (the controller's
//! approver approves it once per token, for the node the token is bound to) and keeps it in
//! `/var/lib/kubelet/pki/kubelet-client-current.pem` (a symlink to the pair file it rotates),
//! with `/var/lib/kubelet/kubeconfig` pointing at it. Every later provision keeps that
//! credential instead of asking again:
//!
//! - a machine whose own credential is usable keeps it;
//! - a new machine (a repave to the other side, a rebuilt rootfs) gets the other machine's,
//!   copied into `pki/kubelet-client-carried.pem` with `kubelet-client-current.pem` linked to it,
//!   as kubelet's own store lays it out (kubelet refuses to rotate over a regular file there);
//! - either way kubelet's kubeconfig points at it and the token's
//!   `bootstrap-kubeconfig` is removed from the machine: kubelet, finding a valid kubeconfig,
//!   never reads it.
//!
//! Usable ([`usable`]): a private key and a certificate, for `system:node:<node>`, valid for
//! at least [`MIN_LEFT`] more. A credential that is not (none yet: the first join; expired: a
//! node off for longer than its lifetime) leaves the token's bootstrap in place, which the
//! approver refuses for a token already used: such a node needs a new token.
//!
//! Reads and writes go through the machine's [`ConfinedFs`]: the files come from a machine,
//! and a link planted in it never leads onto the host.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::machine::nspawn;
use crate::machine::pki::{self, PairError};
use flex_host::fs::{ConfinedFs, FsError, HostFs};

/// kubelet's certificate directory (`--cert-dir`'s default), inside the machine.
pub const PKI_DIR: &str = "/var/lib/kubelet/pki";
/// The link kubelet reads its current pair through.
pub const CURRENT: &str = "/var/lib/kubelet/pki/kubelet-client-current.pem";
/// Where a pair carried from the other machine is written (0600).
pub const CARRIED: &str = "/var/lib/kubelet/pki/kubelet-client-carried.pem";
/// The token's kubeconfig for kubelet's TLS bootstrap.
pub const BOOTSTRAP_KUBECONFIG: &str = "/var/lib/kubelet/bootstrap-kubeconfig";
/// kubelet's kubeconfig.
pub const KUBECONFIG: &str = "/var/lib/kubelet/kubeconfig";
/// A credential with less than this left is not kept: kubelet rotates well before (at 70–90 %
/// of the lifetime), so one this close to its end belongs to a kubelet that could not rotate.
pub const MIN_LEFT: Duration = Duration::from_secs(3600);

/// Why a pair is not usable. Never holds the key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    /// The pair file does not parse, or names another node.
    #[error(transparent)]
    Pair(#[from] PairError),
    /// It expires within [`MIN_LEFT`].
    #[error("the certificate expires within {}s", MIN_LEFT.as_secs())]
    EndingSoon,
    /// Its `notBefore` is still to come (kubelet would not use it either).
    #[error("the certificate is not valid yet")]
    NotYetValid,
}

/// Whether the pair file `text` is `node`'s kubelet credential, its key the certificate's,
/// valid at `now` with at least [`MIN_LEFT`] left (pure). A pair kubelet could not use is never
/// kept: keeping it removes the token's kubeconfig kubelet would fall back to.
pub fn usable(text: &str, node: &str, now: SystemTime) -> Result<pki::Validity, Unusable> {
    let (key, cert) = pki::split_pair(text)?;
    let facts = pki::cert_facts(&cert)?;
    pki::key_matches(&key, &facts.public_key)?;
    if now < facts.validity.not_before {
        return Err(Unusable::NotYetValid);
    }
    let want = format!("system:node:{node}");
    if facts.common_name != want {
        return Err(PairError::WrongNode {
            found: facts.common_name,
            want,
        }
        .into());
    }
    if now >= facts.validity.not_after {
        return Err(PairError::Expired.into());
    }
    if now + MIN_LEFT >= facts.validity.not_after {
        return Err(Unusable::EndingSoon);
    }
    Ok(facts.validity)
}

/// What [`keep`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kept {
    /// The machine's own credential is usable.
    Own,
    /// The other machine's was copied in.
    Carried {
        /// The machine it came from.
        from: String,
    },
    /// Neither machine has a usable one; why, for each looked at.
    Nothing(String),
}

impl Kept {
    /// Whether kubelet has a credential and needs no token.
    pub fn holds(&self) -> bool {
        !matches!(self, Kept::Nothing(_))
    }
}

/// Why [`keep`] failed: reading or writing a machine's files.
#[derive(Debug, thiserror::Error)]
#[error("kubelet's client credential in machine {machine}: {cause}")]
pub struct KeepError {
    /// The machine.
    pub machine: String,
    /// The file error.
    pub cause: FsError,
}

/// The pair file `CURRENT` leads to in `root`, read: the link's target (absolute from the
/// machine's root, or relative to [`PKI_DIR`]) or the file itself. `Ok(None)`: nothing there.
fn read_current(root: &ConfinedFs) -> Result<Option<String>, FsError> {
    let current = Path::new(CURRENT);
    let path = match root.read_link(current)? {
        Some(t) if t.is_absolute() => t,
        Some(t) => Path::new(PKI_DIR).join(t),
        None => current.to_path_buf(),
    };
    Ok(root
        .read(&path)?
        .map(|b| String::from_utf8_lossy(&b).into_owned()))
}

fn rootfs(fs: &HostFs, machine: &str) -> Result<ConfinedFs, FsError> {
    fs.confined(&nspawn::machine_dir(machine))
}

/// Keeps kubelet's client credential for `machine` of `node` (see the module): its own when
/// usable, else the other machine's copied in. A machine whose rootfs is missing counts as
/// having none.
pub fn keep(fs: &HostFs, machine: &str, node: &str, now: SystemTime) -> Result<Kept, KeepError> {
    let err = |m: &str| {
        let m = m.to_string();
        move |cause| KeepError { machine: m, cause }
    };
    let this = rootfs(fs, machine).map_err(err(machine))?;
    let mut why = Vec::new();
    // What cannot be read (a link planted to lead out of the machine) counts as none: kubelet
    // then bootstraps, or gets the other machine's.
    match read_current(&this) {
        Ok(Some(text)) => match usable(&text, node, now) {
            Ok(_) => return Ok(Kept::Own),
            Err(e) => why.push(format!("{machine}: {e}")),
        },
        Ok(None) => why.push(format!("{machine}: none")),
        Err(e) => why.push(format!("{machine}: {e}")),
    }
    for other in nspawn::MACHINES.iter().filter(|m| **m != machine) {
        let Ok(root) = rootfs(fs, other) else {
            why.push(format!("{other}: no root file system"));
            continue;
        };
        // A machine being torn down, or damaged: what cannot be read is not carried.
        let text = match read_current(&root) {
            Ok(Some(t)) => t,
            Ok(None) => {
                why.push(format!("{other}: none"));
                continue;
            }
            Err(e) => {
                why.push(format!("{other}: {e}"));
                continue;
            }
        };
        if let Err(e) = usable(&text, node, now) {
            why.push(format!("{other}: {e}"));
            continue;
        }
        this.create_dir_all_mode(Path::new(PKI_DIR), 0o700)
            .map_err(err(machine))?;
        this.write_atomic(Path::new(CARRIED), text.as_bytes(), 0o600)
            .map_err(err(machine))?;
        this.symlink(Path::new(CURRENT), &PathBuf::from(CARRIED))
            .map_err(err(machine))?;
        return Ok(Kept::Carried {
            from: (*other).to_string(),
        });
    }
    Ok(Kept::Nothing(why.join("; ")))
}

/// Removes the token's [`BOOTSTRAP_KUBECONFIG`] from `machine` when kubelet holds a usable
/// credential there; returns whether it removed one. For after kubelet's first join: the
/// token has done its work and is no longer left in the machine.
pub fn scrub_token(
    fs: &HostFs,
    machine: &str,
    node: &str,
    now: SystemTime,
) -> Result<bool, KeepError> {
    let err = |cause| KeepError {
        machine: machine.to_string(),
        cause,
    };
    let root = rootfs(fs, machine).map_err(err)?;
    let holds = read_current(&root)
        .ok()
        .flatten()
        .is_some_and(|t| usable(&t, node, now).is_ok());
    if !holds {
        return Ok(false);
    }
    root.remove_file(Path::new(BOOTSTRAP_KUBECONFIG))
        .map_err(err)
}

#[cfg(test)]
mod tests;
