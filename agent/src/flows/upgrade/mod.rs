//! AgentUpgrade and recovery: the agent replaces itself, and a candidate that fails to start
//! is rolled back on its own.
//!
//! - the pure state machines (what a starting daemon does with the upgrade record, what
//!   recovery does given the record and the unit's state), table-tested, are the API crate's
//!   [`flex_api::upgrade`], their types re-exported here;
//! - [`layout`]: the blue/green binary layout on a host (`current` and `last-good` links);
//! - [`flow`]: [`Upgrader`], the I/O: fetch and check the candidate (download + SHA-256, or a
//!   containerd pull), refuse while unproven, switch, schedule the restart, prove after the
//!   daemon's first successful reconcile or finish at daemon start, and recover. See
//!   `docs/upgrade.md`.
//!
//! # The flow
//!
//! 1. The handler ([`Upgrader::start`]) writes the upgrade record
//!    (`/etc/aks-flex-node/upgrade/pending.json`, [`flex_api::upgrade::UpgradeRecord`]) at `staged`, fetches
//!    the candidate (on a host: download `downloadURL`, verify `sha256`, install into the
//!    inactive slot; in the container: pull `image` through containerd, which verifies the
//!    digest), and checks that the candidate's agent runs (`version`: the slot's binary, or a
//!    short-lived container in scope `aks-flex-upgrade-check-<n>`).
//! 2. It records `switched`, selects the candidate (the `current` link, or
//!    `AKS_FLEX_NODE_IMAGE` in `/etc/aks-flex-node/agent-image.env`, which keeps
//!    `AKS_FLEX_NODE_LAST_GOOD_IMAGE`), and schedules the agent unit's restart one second later
//!    from a transient timer with `AccuracySec=100ms` ([`restart_timer`]), so the handler returns
//!    first and the restart is punctual (a timer's default accuracy of a minute made restarts
//!    26–58 s late). The operation stays `InProgress`.
//! 3. The restarted daemon, first thing at start ([`Upgrader::on_daemon_start`]), sees the
//!    record at `switched` and that it is the candidate (its slot, or the image its unit passed
//!    it in `AKS_FLEX_NODE_IMAGE`). It has not proven itself yet: after the daemon's first
//!    successful reconcile ([`Upgrader::prove`], called through the daemon's `Proven` hook) it
//!    becomes last-good and the record is finished `Complete`; the MachineOperation reconciler
//!    reports it (the operation's own record is at `executing`, and [`flex_api::upgrade::resume`] answers
//!    for it). A new upgrade is refused while `current` ≠ `last-good` ([`flex_api::upgrade::may_upgrade`]).
//! 4. If the candidate fails to start, the agent unit's `OnFailure=` starts
//!    `aks-flex-node-recovery.service`, which runs `aks-flex-node recover` from the last good
//!    agent (the `last-good` slot, or a container of the last good image) and
//!    [`Upgrader::recover`] acts on [`flex_api::upgrade::recovery`]: switch back, finish `Failed` with reason
//!    `DaemonFailed` and the unit's failure, remove a broken image this upgrade pulled, reset the
//!    unit's failed state (which also resets its start limit) and restart it with the same
//!    timer. The previous image stays until the candidate has proven itself. With no readable
//!    record (a crash tore its save), `current` ≠ `last-good` still means an unproven agent: a
//!    failed one is rolled back to last-good and a record says so.
//!
//! # Start limit
//!
//! The agent's unit may start 5 times in 5 minutes (`StartLimitIntervalSec=300`,
//! `StartLimitBurst=5`), and an upgrade's restart counts. A start past the limit fails the unit
//! without running anything, which would look like a failed candidate. Recovery tells them
//! apart: `Result=start-limit-hit` with no automatic restart (`NRestarts=0`) means the candidate
//! never ran, so it resets the failed state (and with it the limit) and retries the candidate
//! once; a second refusal rolls back. Without an upgrade in flight, a unit that failed past its
//! limit is reset and restarted after [`RECOVERY_RESTART_DELAY`], so the node is never left
//! without an agent.
//!
//! # Interruptions
//!
//! A kill or reboot while `staged` leaves `previous` selected: the next start finishes the
//! record `Failed`/`Interrupted`. After the switch the selected candidate starts (after a reboot
//! too) and proves itself or is rolled back by recovery. No path leaves no runnable agent: the
//! switch is one atomic rename (link or env file, its directory synced), each later write is
//! made in an order every crash prefix of which recovers (the crash table in
//! `flex_api::upgrade`), and recovery runs the last good agent.

pub mod flow;
pub mod layout;

use std::time::Duration;

pub use flex_api::upgrade::{
    DAEMON_FAILED, Mode, OperationRef, RESTART_SCHEDULED, RecoveryAction, Resumed,
    START_LIMIT_RESET_LOG, Stage, StartAction, UpgradeRecord,
};
pub use flow::{Started, Upgrader, restart_timer};

/// The upgrade record (the signal file).
pub const RECORD_PATH: &str = "/etc/aks-flex-node/upgrade/pending.json";
/// Delay of the restart onto a candidate (and of recovery's restart onto last-good).
pub const RESTART_DELAY: Duration = Duration::from_secs(1);
/// The restart timer's accuracy.
pub const RESTART_ACCURACY: Duration = Duration::from_millis(100);
/// Delay of recovery's restart of a unit that failed with no upgrade in flight.
pub const RECOVERY_RESTART_DELAY: Duration = Duration::from_secs(30);
/// How long a candidate's `version` check may take.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(120);
/// How often recovery looks at the agent's unit again while it is still stopping
/// ([`flex_api::upgrade::RecoveryAction::Wait`]).
pub const RECOVERY_POLL: Duration = Duration::from_millis(250);
/// How long recovery waits for the agent's unit to finish stopping (beyond the unit's
/// `TimeoutStopSec=60`, after which systemd kills it); then it leaves the unit to systemd's
/// own restarts and `OnFailure=`.
pub const RECOVERY_STOP_WAIT: Duration = Duration::from_secs(90);
/// The binary inside the agent's image that the check runs.
pub const IMAGE_AGENT_BINARY: &str = "/opt/aks-flex-node/bin/aks-flex-node";
