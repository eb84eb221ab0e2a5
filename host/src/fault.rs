//! Fault-injection points for the crash-safety checks (`cargo xtask check --only faults`).
//!
//! A point is a named instant at which a crash would leave interesting state behind: between
//! two writes, after a switch and before its record, in the middle of a save. Code marks one
//! with [`point`]. A point does nothing unless the process was started with
//! `AKS_FLEX_NODE_FAULT` naming it; nothing else (no file, no flag) turns one on, and only the
//! environment of the agent's own unit can set that, which only root can write.
//!
//! `AKS_FLEX_NODE_FAULT` is a comma-separated list of `NAME[#N]:ACTION`: at the `N`th time
//! (default the first) the process reaches point `NAME`, it
//! - `kill`: sends itself `SIGKILL`, exactly as `kill -9` would: no destructor runs and nothing
//!   is flushed that was not already written;
//! - `hang`: stops there for good, so the harness can cut the power (a VM reset without
//!   shutdown) or `kill -9` it from outside at that exact instant.
//!
//! Before either it writes one line `aks-flex-node: fault point reached: NAME:ACTION` to
//! standard error (the unit's journal), which is how the harness knows the moment has come.
//! Entries that do not parse are reported once on standard error and ignored.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

/// The environment variable that arms points.
pub const ENV: &str = "AKS_FLEX_NODE_FAULT";

/// What an armed point does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// `SIGKILL` to itself.
    Kill,
    /// Block forever.
    Hang,
}

/// One armed point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Armed {
    /// The point's name.
    pub name: String,
    /// Fire at this hit (1-based).
    pub nth: u32,
    /// What to do.
    pub action: Action,
}

/// Parses `NAME[#N]:ACTION[,…]`. Returns the armed points and the entries that did not parse.
pub fn parse(spec: &str) -> (Vec<Armed>, Vec<String>) {
    let mut armed = Vec::new();
    let mut bad = Vec::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        match parse_entry(entry) {
            Some(a) => armed.push(a),
            None => bad.push(entry.to_string()),
        }
    }
    (armed, bad)
}

fn parse_entry(entry: &str) -> Option<Armed> {
    let (target, action) = entry.rsplit_once(':')?;
    let action = match action {
        "kill" => Action::Kill,
        "hang" => Action::Hang,
        _ => return None,
    };
    let (name, nth) = match target.split_once('#') {
        Some((name, n)) => (name, n.parse::<u32>().ok().filter(|n| *n >= 1)?),
        None => (target, 1),
    };
    if name.is_empty() || name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return None;
    }
    Some(Armed {
        name: name.to_string(),
        nth,
        action,
    })
}

struct Points {
    armed: Vec<Armed>,
    hits: Mutex<HashMap<String, u32>>,
}

fn points() -> &'static Points {
    static POINTS: OnceLock<Points> = OnceLock::new();
    POINTS.get_or_init(|| {
        let spec = std::env::var(ENV).unwrap_or_default();
        let (armed, bad) = parse(&spec);
        if !bad.is_empty() {
            let _ = writeln!(
                std::io::stderr(),
                "aks-flex-node: {ENV}: ignoring entries that are not NAME[#N]:kill|hang: {bad:?}"
            );
        }
        Points {
            armed,
            hits: Mutex::new(HashMap::new()),
        }
    })
}

/// Decides whether the `hit`th arrival at `name` fires, and how.
fn decide(armed: &[Armed], name: &str, hit: u32) -> Option<Action> {
    armed
        .iter()
        .find(|a| a.name == name && a.nth == hit)
        .map(|a| a.action)
}

/// Marks fault point `name`. A no-op unless `AKS_FLEX_NODE_FAULT` arms it.
pub fn point(name: &str) {
    let p = points();
    if p.armed.is_empty() || !p.armed.iter().any(|a| a.name == name) {
        return;
    }
    let hit = {
        // A poisoned lock only means another thread panicked while counting; the count is
        // still a number.
        let mut hits = p.hits.lock().unwrap_or_else(|e| e.into_inner());
        let n = hits.entry(name.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let Some(action) = decide(&p.armed, name, hit) else {
        return;
    };
    let word = match action {
        Action::Kill => "kill",
        Action::Hang => "hang",
    };
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "aks-flex-node: fault point reached: {name}:{word}");
    let _ = err.flush();
    drop(err);
    match action {
        Action::Kill => {
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::KILL,
            );
            // SIGKILL to oneself is delivered before kill(2) returns; should it not be, stop
            // here rather than go on past the point.
            loop {
                std::thread::park();
            }
        }
        Action::Hang => loop {
            std::thread::park();
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_with_and_without_a_count() {
        let (armed, bad) =
            parse("store.save-midway:daemon-state.json:kill, upgrade.after-switch#2:hang");
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(
            armed,
            vec![
                Armed {
                    name: "store.save-midway:daemon-state.json".into(),
                    nth: 1,
                    action: Action::Kill
                },
                Armed {
                    name: "upgrade.after-switch".into(),
                    nth: 2,
                    action: Action::Hang
                },
            ]
        );
    }

    #[test]
    fn bad_entries_are_reported_not_armed() {
        let (armed, bad) = parse("a:explode,b#0:kill,#1:kill,c d:kill,nocolon,e:hang");
        assert_eq!(armed.len(), 1);
        assert_eq!(armed[0].name, "e");
        assert_eq!(
            bad,
            vec!["a:explode", "b#0:kill", "#1:kill", "c d:kill", "nocolon"]
        );
    }

    #[test]
    fn only_the_named_hit_fires() {
        let (armed, _) = parse("p#2:kill");
        assert_eq!(decide(&armed, "p", 1), None);
        assert_eq!(decide(&armed, "p", 2), Some(Action::Kill));
        assert_eq!(decide(&armed, "p", 3), None);
        assert_eq!(decide(&armed, "q", 2), None);
    }

    /// Real: the process's points (no `AKS_FLEX_NODE_FAULT` names this one). An unarmed point
    /// returns at once, without even counting its hits.
    #[test]
    fn an_unarmed_point_returns_without_counting() {
        point("tests.never-armed");
        point("tests.never-armed");
        let hits = points().hits.lock().unwrap();
        assert_eq!(hits.get("tests.never-armed"), None);
    }
}
