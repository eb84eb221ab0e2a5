//! The host seams every other crate of the workspace reaches the host through, and nothing
//! more: the one process [`runner`] (timeouts, redacted argv and stderr in errors, a span per
//! command), [`hostexec`] resolution of host tools from inside the agent's container, atomic
//! host files ([`fs::HostFs`]) and files confined to a directory tree such as a machine's root
//! ([`confine`], [`fs::ConfinedFs`]), [`hostinfo`], [`secret::Secret`], the [`systemd`] manager
//! (over `systemctl`, or D-Bus with the `dbus` feature), the [`http`] client (feature `http`)
//! the one retry/backoff ([`retry`]), the crash-safety checks' [`fault`] injection points, and
//! the machine's apt sources ([`apt`]: the Debian archive it already uses, read, never changed).
//!
//! It knows nothing of Kubernetes, machines or the agent's flows; its recording fakes live in
//! the `flex-testkit` crate, which is only ever a dev-dependency.
//!
//! Errors, in every crate of the workspace, follow one rule ([`error`]): a message names its
//! cause, and the cause is never also its `source()`, so no printer shows a cause twice.
//!
//! Features: `dbus` (the D-Bus manager, zbus) and `http` (the download client, rustls) are on by
//! default. xtask, the image builder and the test kit use the crate without either; the OCI
//! crate and the controller take `http` alone.

pub mod apt;
pub mod confine;
pub mod context;
pub mod error;
pub mod fault;
pub mod fs;
pub mod hostexec;
pub mod hostinfo;
#[cfg(feature = "http")]
pub mod http;
pub mod lookup;
pub mod retry;
pub mod runner;
pub mod secret;
pub mod systemd;
