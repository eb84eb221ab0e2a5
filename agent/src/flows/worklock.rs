//! The node's work lock: one host-wide lock that serialises the agent's host work between
//! processes.
//!
//! Inside the daemon every piece of host work already runs one at a time on its work queue; a
//! node-local request made from another process ([`crate::flows::repave::local`], `aks-flex-node
//! repave`) must not run beside it. Both take this lock: the daemon around each queue item and
//! around resuming an interrupted repave at its start, the request for its whole run. It is an
//! advisory `flock(2)` on [`WORK_LOCK_PATH`] (`/run` is the host's in the agent's container, so the
//! daemon in its container and a command on the host see the same lock). The kernel releases it
//! when the holder dies (`kill -9`, a power cut), so a crash never leaves the node locked.

use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use flex_host::fs::HostFs;

/// Where the lock lives (a tmpfs: nothing of it survives a boot).
pub const WORK_LOCK_PATH: &str = "/run/aks-flex-node/work.lock";

/// The lock could not be taken for a reason other than its holder.
#[derive(Debug, thiserror::Error)]
#[error("take the work lock {path}: {cause}")]
pub struct LockError {
    /// The lock file.
    pub path: PathBuf,
    /// Why (in the message, not a `source()`).
    pub cause: std::io::Error,
}

/// The held lock; dropping it releases it.
#[derive(Debug)]
pub struct WorkLock {
    _file: File,
}

impl WorkLock {
    /// Takes the lock if nobody holds it: `Ok(None)` when another holder has it.
    pub fn try_acquire(fs: &HostFs) -> Result<Option<WorkLock>, LockError> {
        let path = fs.path(Path::new(WORK_LOCK_PATH));
        let err = |cause| LockError {
            path: path.clone(),
            cause,
        };
        // Root's alone (0700 directory, 0600 file): `flock` needs only an open file, so a lock
        // others could open would let any user hold the node's work back.
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(err)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(WorkLock { _file: file })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(err(e)),
        }
    }

    /// Takes the lock, waiting up to `wait` (checking every `poll`) while another holder has
    /// it: `Ok(None)` when it is still held after `wait`.
    pub async fn acquire(
        fs: &HostFs,
        wait: Duration,
        poll: Duration,
    ) -> Result<Option<WorkLock>, LockError> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut said = false;
        loop {
            if let Some(l) = Self::try_acquire(fs)? {
                return Ok(Some(l));
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            if !said {
                tracing::info!(
                    path = WORK_LOCK_PATH,
                    "another process of the agent holds the work lock; waiting"
                );
                said = true;
            }
            tokio::time::sleep(poll).await;
        }
    }
}

#[cfg(test)]
mod tests {
    //! Real `flock(2)` locks on a real file in a temporary root (two opens of the same file
    //! conflict even in one process, as two processes do).

    use super::*;

    #[test]
    fn a_held_lock_is_not_taken_again_until_dropped() {
        let d = tempfile::tempdir().unwrap();
        let fs = HostFs::new(d.path());
        let held = WorkLock::try_acquire(&fs).unwrap().expect("free at first");
        let mode = |p: &str| {
            std::fs::metadata(d.path().join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("run/aks-flex-node"), 0o700, "root's alone");
        assert_eq!(mode("run/aks-flex-node/work.lock"), 0o600, "root's alone");
        assert!(WorkLock::try_acquire(&fs).unwrap().is_none(), "held");
        drop(held);
        assert!(WorkLock::try_acquire(&fs).unwrap().is_some(), "released");
    }

    #[tokio::test]
    async fn acquire_waits_for_the_holder_and_gives_up_after_its_wait() {
        let d = tempfile::tempdir().unwrap();
        let fs = HostFs::new(d.path());
        let held = WorkLock::try_acquire(&fs).unwrap().unwrap();
        let ms = Duration::from_millis;
        assert!(
            WorkLock::acquire(&fs, ms(50), ms(10))
                .await
                .unwrap()
                .is_none()
        );
        let release = tokio::spawn(async move {
            tokio::time::sleep(ms(50)).await;
            drop(held);
        });
        assert!(
            WorkLock::acquire(&fs, ms(5000), ms(10))
                .await
                .unwrap()
                .is_some()
        );
        release.await.unwrap();
    }

    #[test]
    fn a_lock_that_cannot_be_created_names_its_path() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("run"), b"a file, not a directory").unwrap();
        let e = WorkLock::try_acquire(&HostFs::new(d.path())).unwrap_err();
        assert!(e.to_string().contains("run/aks-flex-node/work.lock"), "{e}");
    }
}
