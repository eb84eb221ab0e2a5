//! The agent's state as its Node shows it, the way OpenShift's machine-config daemon publishes
//! its own: one Node condition ([`CONDITION_TYPE`]) and a few annotations
//! ([`ANNOTATION_STATE`], [`ANNOTATION_AGENT_VERSION`], [`ANNOTATION_ACTIVE_MACHINE`],
//! [`ANNOTATION_GOAL_VERSION`]), so `kubectl describe node` says what the agent is doing.
//!
//! The state is [`AgentState::Done`] (the last reconcile succeeded), [`AgentState::Working`]
//! (applying a goal, running a MachineOperation, or retrying a failure that may yet mend) or
//! [`AgentState::Degraded`] (a failure retrying cannot mend, or [`DEGRADED_AFTER`] failures in
//! a row). [`Tracker`] is the pure state machine the daemon feeds with what it does; it says
//! what to publish and when something changed ([`Tracker::take_changed`]), so the daemon
//! writes the Node only on a change. A change is one of the state, the reason or an
//! annotation, never the message alone: the daemon's own write is a Node change it watches,
//! and a Node change runs the machine reconcile at once, so a message that changed with every
//! failure (a count, an error naming a port) would retry a failing reconcile as fast as the
//! API server answers instead of after its backoff.

use std::collections::BTreeMap;

/// The Node condition's type.
pub const CONDITION_TYPE: &str = "AKSFlexNodeAgent";
/// The annotations' prefix.
pub const ANNOTATION_PREFIX: &str = "aks-flex-node.azure.com/";
/// `Done`, `Working` or `Degraded`.
pub const ANNOTATION_STATE: &str = "aks-flex-node.azure.com/state";
/// The running agent's version.
pub const ANNOTATION_AGENT_VERSION: &str = "aks-flex-node.azure.com/agent-version";
/// The machine kubelet runs in (`kube1`/`kube2`).
pub const ANNOTATION_ACTIVE_MACHINE: &str = "aks-flex-node.azure.com/active-machine";
/// The goal's settings version the node runs.
pub const ANNOTATION_GOAL_VERSION: &str = "aks-flex-node.azure.com/goal-version";

/// Failures in a row (that retrying may mend) after which the agent counts as degraded.
pub const DEGRADED_AFTER: u32 = 3;

/// What the agent is doing, as the Node shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentState {
    /// The last reconcile succeeded; nothing is in progress.
    Done,
    /// Changing the node, or retrying.
    Working,
    /// Failing in a way that needs attention.
    Degraded,
}

impl AgentState {
    /// `Done`, `Working`, `Degraded`.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentState::Done => "Done",
            AgentState::Working => "Working",
            AgentState::Degraded => "Degraded",
        }
    }

    /// The condition's status: `True` when done, `False` when degraded, `Unknown` while working.
    pub fn condition_status(self) -> &'static str {
        match self {
            AgentState::Done => "True",
            AgentState::Working => "Unknown",
            AgentState::Degraded => "False",
        }
    }
}

/// The condition's reasons (CamelCase, as Kubernetes reasons are).
pub mod reason {
    /// Done: the last reconcile succeeded.
    pub const RECONCILED: &str = "Reconciled";
    /// Working: applying the machine goal (a blue/green repave).
    pub const APPLYING_GOAL: &str = "ApplyingGoal";
    /// Working: running a MachineOperation.
    pub const RUNNING_OPERATION: &str = "RunningOperation";
    /// Working: a failure the daemon retries with backoff.
    pub const RETRYING: &str = "Retrying";
    /// Degraded: failures in a row, still retried.
    pub const RECONCILE_FAILING: &str = "ReconcileFailing";
    /// Degraded: a failure that retrying cannot mend (a wrong goal, a rejected write).
    pub const RECONCILE_FAILED: &str = "ReconcileFailed";
}

/// What the Node should show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAgentStatus {
    /// The state.
    pub state: AgentState,
    /// The condition's reason ([`reason`]).
    pub reason: &'static str,
    /// The condition's message: the state, then what it is about.
    pub message: String,
    /// The running agent's version.
    pub agent_version: String,
    /// The active machine, when the daemon state names one.
    pub active_machine: Option<String>,
    /// The applied goal's settings version, when there is one.
    pub goal_version: Option<String>,
}

impl NodeAgentStatus {
    /// The annotations to set; an absent value is removed (`None`).
    pub fn annotations(&self) -> BTreeMap<&'static str, Option<String>> {
        BTreeMap::from([
            (ANNOTATION_STATE, Some(self.state.as_str().to_string())),
            (ANNOTATION_AGENT_VERSION, Some(self.agent_version.clone())),
            (ANNOTATION_ACTIVE_MACHINE, self.active_machine.clone()),
            (ANNOTATION_GOAL_VERSION, self.goal_version.clone()),
        ])
    }
}

/// What the daemon tells the tracker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A repave is about to change the node to the goal with this settings version.
    ApplyingGoal {
        /// The goal's settings version.
        settings_version: String,
    },
    /// A MachineOperation is about to be reconciled.
    Operation {
        /// Its name.
        name: String,
    },
    /// An item succeeded.
    Succeeded,
    /// An item failed.
    Failed {
        /// Whether retrying cannot mend it.
        permanent: bool,
        /// The error, one line (secrets already redacted by the caller's error types).
        message: String,
    },
}

/// The longest message put on the Node (the API server takes more; a condition is read by
/// people).
pub const MAX_MESSAGE: usize = 512;

/// The daemon's state as its Node shows it: fed [`Event`]s and the facts behind the
/// annotations, it says what to publish.
#[derive(Clone, Debug)]
pub struct Tracker {
    agent_version: String,
    current: Option<NodeAgentStatus>,
    published: Option<NodeAgentStatus>,
    failures: u32,
}

impl Tracker {
    /// A tracker for the agent `agent_version`; nothing to publish until the first event.
    pub fn new(agent_version: &str) -> Self {
        Self {
            agent_version: agent_version.to_string(),
            current: None,
            published: None,
            failures: 0,
        }
    }

    /// Takes `event` with the facts as they stand (the active machine and goal version from
    /// the daemon state).
    pub fn observe(
        &mut self,
        event: &Event,
        active_machine: Option<&str>,
        goal_version: Option<&str>,
    ) {
        let (state, reason, message) = match event {
            Event::ApplyingGoal { settings_version } => (
                AgentState::Working,
                reason::APPLYING_GOAL,
                format!("applying machine goal settings version {settings_version}"),
            ),
            Event::Operation { name } => (
                AgentState::Working,
                reason::RUNNING_OPERATION,
                format!("running MachineOperation {name}"),
            ),
            Event::Succeeded => {
                self.failures = 0;
                (
                    AgentState::Done,
                    reason::RECONCILED,
                    match goal_version {
                        Some(v) => format!("machine goal settings version {v} applied"),
                        None => "reconciled".to_string(),
                    },
                )
            }
            Event::Failed { permanent, message } => {
                self.failures = self.failures.saturating_add(1);
                if *permanent {
                    (
                        AgentState::Degraded,
                        reason::RECONCILE_FAILED,
                        format!("not retried until its input changes: {message}"),
                    )
                } else if self.failures >= DEGRADED_AFTER {
                    (
                        AgentState::Degraded,
                        reason::RECONCILE_FAILING,
                        format!(
                            "failed {DEGRADED_AFTER} or more times in a row, retrying: {message}"
                        ),
                    )
                } else {
                    (
                        AgentState::Working,
                        reason::RETRYING,
                        format!("failed, retrying: {message}"),
                    )
                }
            }
        };
        self.current = Some(NodeAgentStatus {
            state,
            reason,
            message: clip(&format!("{}: {message}", state.as_str())),
            agent_version: self.agent_version.clone(),
            active_machine: active_machine.map(str::to_string),
            goal_version: goal_version.map(str::to_string),
        });
    }

    /// The status to publish when its state, reason or annotations differ from the last one
    /// published (not its message alone: see the module's doc), marking it published; `None`
    /// when nothing changed.
    pub fn take_changed(&mut self) -> Option<NodeAgentStatus> {
        let same = |a: &NodeAgentStatus, b: &NodeAgentStatus| {
            (a.state, a.reason, a.annotations()) == (b.state, b.reason, b.annotations())
        };
        match &self.current {
            Some(c) if !self.published.as_ref().is_some_and(|p| same(p, c)) => {
                self.published = Some(c.clone());
                Some(c.clone())
            }
            _ => None,
        }
    }

    /// Publish the current status again at the next chance: the last write failed, or the
    /// Node is a new object (a repave registers a new Node) that has not seen it.
    pub fn republish(&mut self) {
        self.published = None;
    }

    /// The current status.
    pub fn current(&self) -> Option<&NodeAgentStatus> {
        self.current.as_ref()
    }
}

/// `s` cut to [`MAX_MESSAGE`] bytes on a character boundary, with `…` when cut.
fn clip(s: &str) -> String {
    if s.len() <= MAX_MESSAGE {
        return s.to_string();
    }
    let mut end = MAX_MESSAGE - '…'.len_utf8();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(permanent: bool) -> Event {
        Event::Failed {
            permanent,
            message: "get machine: connection refused".into(),
        }
    }

    /// Each sequence of events, and the state and reason published after the last one (pure).
    #[test]
    fn states_after_event_sequences() {
        let cases: Vec<(&str, Vec<Event>, AgentState, &str)> = vec![
            (
                "first success",
                vec![Event::Succeeded],
                AgentState::Done,
                reason::RECONCILED,
            ),
            (
                "applying",
                vec![
                    Event::Succeeded,
                    Event::ApplyingGoal {
                        settings_version: "3".into(),
                    },
                ],
                AgentState::Working,
                reason::APPLYING_GOAL,
            ),
            (
                "operation",
                vec![Event::Operation {
                    name: "op-1".into(),
                }],
                AgentState::Working,
                reason::RUNNING_OPERATION,
            ),
            (
                "one transient failure retries",
                vec![Event::Succeeded, failed(false)],
                AgentState::Working,
                reason::RETRYING,
            ),
            (
                "two in a row still working",
                vec![failed(false), failed(false)],
                AgentState::Working,
                reason::RETRYING,
            ),
            (
                "three in a row degrade",
                vec![failed(false), failed(false), failed(false)],
                AgentState::Degraded,
                reason::RECONCILE_FAILING,
            ),
            (
                "a success resets the count",
                vec![
                    failed(false),
                    failed(false),
                    Event::Succeeded,
                    failed(false),
                ],
                AgentState::Working,
                reason::RETRYING,
            ),
            (
                "an operation between failures does not reset the count",
                vec![
                    failed(false),
                    failed(false),
                    Event::Operation {
                        name: "op-2".into(),
                    },
                    failed(false),
                ],
                AgentState::Degraded,
                reason::RECONCILE_FAILING,
            ),
            (
                "permanent failure degrades at once",
                vec![Event::Succeeded, failed(true)],
                AgentState::Degraded,
                reason::RECONCILE_FAILED,
            ),
            (
                "recovery from degraded",
                vec![failed(true), Event::Succeeded],
                AgentState::Done,
                reason::RECONCILED,
            ),
        ];
        for (name, events, state, why) in cases {
            let mut t = Tracker::new("0.3.0");
            for e in &events {
                t.observe(e, Some("kube1"), Some("2"));
            }
            let c = t.current().unwrap();
            assert_eq!((c.state, c.reason), (state, why), "{name}");
            assert!(
                c.message.starts_with(&format!("{}: ", state.as_str())),
                "{name}: {}",
                c.message
            );
        }
    }

    /// Only a change is published; a failed publish is published again.
    #[test]
    fn publishes_only_changes() {
        let mut t = Tracker::new("0.3.0");
        assert_eq!(t.take_changed(), None, "nothing before the first event");
        t.observe(&Event::Succeeded, Some("kube1"), Some("2"));
        let first = t.take_changed().unwrap();
        assert_eq!(first.state, AgentState::Done);
        t.observe(&Event::Succeeded, Some("kube1"), Some("2"));
        assert_eq!(t.take_changed(), None, "same state, not written again");
        t.observe(&failed(false), Some("kube1"), Some("2"));
        assert_eq!(t.take_changed().unwrap().reason, reason::RETRYING);
        t.observe(
            &Event::Failed {
                permanent: false,
                message: "get machine: timed out after 10.0.2.2:41234".into(),
            },
            Some("kube1"),
            Some("2"),
        );
        assert_eq!(
            t.take_changed(),
            None,
            "a second failure with another message is not written: the write would run the \
             failing reconcile again at once (the Node watch), bypassing its backoff"
        );
        t.observe(&Event::Succeeded, Some("kube1"), Some("2"));
        assert_eq!(t.take_changed().unwrap().state, AgentState::Done);
        t.observe(&Event::Succeeded, Some("kube2"), Some("3"));
        let moved = t.take_changed().unwrap();
        assert_eq!(
            moved.annotations()[ANNOTATION_ACTIVE_MACHINE].as_deref(),
            Some("kube2")
        );
        t.republish();
        assert_eq!(
            t.take_changed(),
            Some(moved),
            "published again after a failure"
        );
        assert_eq!(t.take_changed(), None);
    }

    #[test]
    fn annotations_name_the_agent_and_remove_what_is_unknown() {
        let mut t = Tracker::new("0.3.0");
        t.observe(&failed(true), None, None);
        let a = t.current().unwrap().annotations();
        assert_eq!(a[ANNOTATION_STATE].as_deref(), Some("Degraded"));
        assert_eq!(a[ANNOTATION_AGENT_VERSION].as_deref(), Some("0.3.0"));
        assert_eq!(a[ANNOTATION_ACTIVE_MACHINE], None);
        assert_eq!(a[ANNOTATION_GOAL_VERSION], None);
        assert!(a.keys().all(|k| k.starts_with(ANNOTATION_PREFIX)));
    }

    #[test]
    fn condition_status_per_state() {
        assert_eq!(AgentState::Done.condition_status(), "True");
        assert_eq!(AgentState::Working.condition_status(), "Unknown");
        assert_eq!(AgentState::Degraded.condition_status(), "False");
    }

    #[test]
    fn long_messages_are_clipped_on_a_character_boundary() {
        let mut t = Tracker::new("0.3.0");
        t.observe(
            &Event::Failed {
                permanent: true,
                message: "é".repeat(600),
            },
            None,
            None,
        );
        let m = &t.current().unwrap().message;
        assert!(m.len() <= MAX_MESSAGE, "{}", m.len());
        assert!(m.ends_with('…'));
    }
}
