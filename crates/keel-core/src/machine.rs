//! The vocabulary's state machines as data.
//!
//! One transition table per machine, written as each state's set of legal predecessors (the states in
//! `docs/ARCHITECTURE.md`, "Vocabulary"). [`check_transition`] is the single function every component
//! goes through; it returns a [`TransitionError`] naming the machine and both states. A terminal state
//! has no successors, so it is written exactly once.
//!
//! The `match`es below are exhaustive on purpose (no `_ =>`): adding a state makes the compiler point
//! at every table that must say where it may come from.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Which state machine a state or an error belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Machine {
    /// [`SessionStatus`]
    Session,
    /// [`TurnStatus`]
    Turn,
    /// [`StepStatus`]
    Step,
    /// [`ToolCallStatus`]
    ToolCall,
    /// [`EffectStatus`]
    Effect,
    /// [`ApprovalStatus`]
    Approval,
}

impl fmt::Display for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Machine::Session => "session",
            Machine::Turn => "turn",
            Machine::Step => "step",
            Machine::ToolCall => "tool_call",
            Machine::Effect => "effect",
            Machine::Approval => "approval",
        })
    }
}

/// A state machine whose states are the enum's variants.
pub trait StateMachine: Copy + Eq + fmt::Debug + Send + Sync + 'static {
    /// Which machine this is.
    const MACHINE: Machine;
    /// Every state, in declaration order.
    const ALL: &'static [Self];
    /// The state an entity is created in.
    const INITIAL: Self;
    /// The states this one may be entered from (the transition table, one row per state).
    fn predecessors(self) -> &'static [Self];
    /// Whether no transition may leave this state.
    fn is_terminal(self) -> bool;
    /// The snake_case name used in events, the API and the database.
    fn as_str(self) -> &'static str;

    /// Whether `from → to` is in the table.
    fn can_transition(from: Self, to: Self) -> bool {
        to.predecessors().contains(&from)
    }
}

/// An illegal transition: the machine, the state the entity is in, and the state asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("illegal {machine} transition {from} -> {to}{}", if *.from_terminal { " (terminal state)" } else { "" })]
pub struct TransitionError {
    /// The machine.
    pub machine: Machine,
    /// The current state's name.
    pub from: &'static str,
    /// The requested state's name.
    pub to: &'static str,
    /// `from` is terminal: it is written once and never left.
    pub from_terminal: bool,
}

/// Checks `from → to` against `S`'s table. Returns `to` when legal.
///
/// # Errors
/// [`TransitionError`] naming both states when the table has no such edge (including every edge out
/// of a terminal state).
pub fn check_transition<S: StateMachine>(from: S, to: S) -> Result<S, TransitionError> {
    if !from.is_terminal() && S::can_transition(from, to) {
        Ok(to)
    } else {
        Err(TransitionError {
            machine: S::MACHINE,
            from: from.as_str(),
            to: to.as_str(),
            from_terminal: from.is_terminal(),
        })
    }
}

macro_rules! states {
    (
        $(#[$doc:meta])* $name:ident: $machine:ident, initial $initial:ident {
            $( $(#[$vdoc:meta])* $variant:ident = $text:literal $(terminal $t:tt)? <- [$($pred:ident),*] ),+ $(,)?
        }
    ) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $( $(#[$vdoc])* $variant, )+
        }

        impl StateMachine for $name {
            const MACHINE: Machine = Machine::$machine;
            const ALL: &'static [Self] = &[$($name::$variant),+];
            const INITIAL: Self = $name::$initial;

            fn predecessors(self) -> &'static [Self] {
                match self {
                    $( $name::$variant => &[$($name::$pred),*], )+
                }
            }

            fn is_terminal(self) -> bool {
                match self {
                    $( $name::$variant => states!(@terminal $($t)?), )+
                }
            }

            fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = UnknownState;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $( $text => Ok($name::$variant), )+
                    other => Err(UnknownState { machine: Machine::$machine, name: other.to_owned() }),
                }
            }
        }
    };
    (@terminal) => { false };
    (@terminal $t:tt) => { true };
}

/// A state name that is not in the machine (e.g. read from a corrupt row).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {machine} state {name:?}")]
pub struct UnknownState {
    /// The machine.
    pub machine: Machine,
    /// The name that was read.
    pub name: String,
}

states! {
    /// Session: `created → running ⇄ idle / requires_action → closed`.
    SessionStatus: Session, initial Created {
        /// Created, no turn has started yet.
        Created = "created" <- [],
        /// A turn is active.
        Running = "running" <- [Created, Idle, RequiresAction],
        /// No active turn; waiting for input.
        Idle = "idle" <- [Running, RequiresAction],
        /// Waiting on a human: an approval or an `outcome_unknown` decision.
        RequiresAction = "requires_action" <- [Running],
        /// Closed for good.
        Closed = "closed" terminal! <- [Created, Running, Idle, RequiresAction],
    }
}

states! {
    /// Turn: `queued → preparing → sampling ⇄ executing_tools, sampling ⇄ compacting →
    /// completed / aborted / failed`.
    TurnStatus: Turn, initial Queued {
        /// Accepted into the journal, waiting for the session's active turn to end.
        Queued = "queued" <- [],
        /// Loading the release, workspace instructions and budgets.
        Preparing = "preparing" <- [Queued],
        /// A step is sampling the model.
        Sampling = "sampling" <- [Preparing, ExecutingTools, Compacting],
        /// The step's tool calls are being validated, approved and run.
        ExecutingTools = "executing_tools" <- [Sampling],
        /// Older transcript is being summarized behind a compaction boundary.
        Compacting = "compacting" <- [Preparing, Sampling, ExecutingTools],
        /// The model ended the turn.
        Completed = "completed" terminal! <- [Sampling],
        /// Cancelled.
        Aborted = "aborted" terminal! <- [Queued, Preparing, Sampling, ExecutingTools, Compacting],
        /// Ended by an error, a budget, a loop or a prompt that stays too long (see
        /// [`crate::TerminalReason`]).
        Failed = "failed" terminal! <- [Preparing, Sampling, ExecutingTools, Compacting],
    }
}

states! {
    /// Step: `started → streaming → completed / failed`. Retries are attempts of the same step: a
    /// new attempt moves a streaming step back to `started`.
    StepStatus: Step, initial Started {
        /// The request is on its way (attempt n).
        Started = "started" <- [Streaming],
        /// The first event of the response arrived.
        Streaming = "streaming" <- [Started],
        /// The response ended normally.
        Completed = "completed" terminal! <- [Streaming],
        /// Every attempt failed, or the step was abandoned.
        Failed = "failed" terminal! <- [Started, Streaming],
    }
}

states! {
    /// ToolCall: `proposed → validating → awaiting_approval → running → succeeded / failed /
    /// cancelled / rejected / interrupted`.
    ToolCallStatus: ToolCall, initial Proposed {
        /// Proposed by the model.
        Proposed = "proposed" <- [],
        /// Arguments are being checked against the tool's schema and the policy.
        Validating = "validating" <- [Proposed],
        /// Waiting on an [`ApprovalStatus`] decision.
        AwaitingApproval = "awaiting_approval" <- [Validating],
        /// The tool is executing.
        Running = "running" <- [Validating, AwaitingApproval],
        /// The tool returned a result.
        Succeeded = "succeeded" terminal! <- [Running],
        /// Invalid arguments, an unknown tool, or the tool reported an error.
        Failed = "failed" terminal! <- [Validating, Running],
        /// Cancelled by the user or by the turn.
        Cancelled = "cancelled" terminal! <- [Proposed, Validating, AwaitingApproval, Running],
        /// Denied by policy or by a human, or its approval expired.
        Rejected = "rejected" terminal! <- [Validating, AwaitingApproval],
        /// The run ended under it (crash recovery, turn failure) before it produced a result.
        Interrupted = "interrupted" terminal! <- [Proposed, Validating, AwaitingApproval, Running],
    }
}

states! {
    /// Effect: `prepared → dispatched → committed / failed`, or `dispatched → outcome_unknown →
    /// committed / failed`; a human's `retry` decision dispatches an `outcome_unknown` effect again.
    EffectStatus: Effect, initial Prepared {
        /// Intent journaled; the side effect has not started.
        Prepared = "prepared" <- [],
        /// The side effect may have started.
        Dispatched = "dispatched" <- [Prepared, OutcomeUnknown],
        /// The run ended while dispatched; reconcile or a human decides.
        OutcomeUnknown = "outcome_unknown" <- [Dispatched],
        /// It happened.
        Committed = "committed" terminal! <- [Dispatched, OutcomeUnknown],
        /// It did not happen.
        Failed = "failed" terminal! <- [Prepared, Dispatched, OutcomeUnknown],
    }
}

states! {
    /// Approval: `pending → allowed / denied / expired`.
    ApprovalStatus: Approval, initial Pending {
        /// Waiting for a decision.
        Pending = "pending" <- [],
        /// Allowed once or for the session.
        Allowed = "allowed" terminal! <- [Pending],
        /// Denied, with a reason the model sees.
        Denied = "denied" terminal! <- [Pending],
        /// Not decided before its expiry.
        Expired = "expired" terminal! <- [Pending],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every legal edge of every table, spelled out once more by hand: the tables above must agree
    /// with this list exactly, and every pair not listed must be refused with the typed error.
    fn legal_edges() -> Vec<(Machine, &'static str, &'static str)> {
        use Machine::*;
        let mut v = Vec::new();
        let mut add = |m, list: &[(&'static str, &'static str)]| {
            for (a, b) in list {
                v.push((m, *a, *b));
            }
        };
        add(
            Session,
            &[
                ("created", "running"),
                ("idle", "running"),
                ("requires_action", "running"),
                ("running", "idle"),
                ("requires_action", "idle"),
                ("running", "requires_action"),
                ("created", "closed"),
                ("running", "closed"),
                ("idle", "closed"),
                ("requires_action", "closed"),
            ],
        );
        add(
            Turn,
            &[
                ("queued", "preparing"),
                ("preparing", "sampling"),
                ("executing_tools", "sampling"),
                ("compacting", "sampling"),
                ("sampling", "executing_tools"),
                ("preparing", "compacting"),
                ("sampling", "compacting"),
                ("executing_tools", "compacting"),
                ("sampling", "completed"),
                ("queued", "aborted"),
                ("preparing", "aborted"),
                ("sampling", "aborted"),
                ("executing_tools", "aborted"),
                ("compacting", "aborted"),
                ("preparing", "failed"),
                ("sampling", "failed"),
                ("executing_tools", "failed"),
                ("compacting", "failed"),
            ],
        );
        add(
            Step,
            &[
                ("streaming", "started"),
                ("started", "streaming"),
                ("streaming", "completed"),
                ("started", "failed"),
                ("streaming", "failed"),
            ],
        );
        add(
            ToolCall,
            &[
                ("proposed", "validating"),
                ("validating", "awaiting_approval"),
                ("validating", "running"),
                ("awaiting_approval", "running"),
                ("running", "succeeded"),
                ("validating", "failed"),
                ("running", "failed"),
                ("proposed", "cancelled"),
                ("validating", "cancelled"),
                ("awaiting_approval", "cancelled"),
                ("running", "cancelled"),
                ("validating", "rejected"),
                ("awaiting_approval", "rejected"),
                ("proposed", "interrupted"),
                ("validating", "interrupted"),
                ("awaiting_approval", "interrupted"),
                ("running", "interrupted"),
            ],
        );
        add(
            Effect,
            &[
                ("prepared", "dispatched"),
                ("outcome_unknown", "dispatched"),
                ("dispatched", "outcome_unknown"),
                ("dispatched", "committed"),
                ("outcome_unknown", "committed"),
                ("prepared", "failed"),
                ("dispatched", "failed"),
                ("outcome_unknown", "failed"),
            ],
        );
        add(
            Approval,
            &[
                ("pending", "allowed"),
                ("pending", "denied"),
                ("pending", "expired"),
            ],
        );
        v
    }

    /// Checks all |S|² pairs of one machine against the hand-written edge list; returns how many
    /// illegal pairs were checked to produce the typed error.
    fn exhaust<S: StateMachine>() -> usize {
        let edges = legal_edges();
        let mut illegal = 0;
        for &from in S::ALL {
            for &to in S::ALL {
                let expected = edges.contains(&(S::MACHINE, from.as_str(), to.as_str()));
                match check_transition(from, to) {
                    Ok(s) => {
                        assert!(
                            expected,
                            "{} {from:?} -> {to:?} must be illegal",
                            S::MACHINE
                        );
                        assert_eq!(s, to);
                    }
                    Err(e) => {
                        assert!(!expected, "{} {from:?} -> {to:?} must be legal", S::MACHINE);
                        assert_eq!(e.machine, S::MACHINE);
                        assert_eq!(e.from, from.as_str());
                        assert_eq!(e.to, to.as_str());
                        assert_eq!(e.from_terminal, from.is_terminal());
                        let msg = e.to_string();
                        assert!(
                            msg.contains(from.as_str()) && msg.contains(to.as_str()),
                            "{msg}"
                        );
                        illegal += 1;
                    }
                }
            }
            if from.is_terminal() {
                assert!(
                    S::ALL.iter().all(|&to| check_transition(from, to).is_err()),
                    "terminal {from:?} must have no successor"
                );
            }
        }
        let legal = edges.iter().filter(|e| e.0 == S::MACHINE).count();
        assert_eq!(illegal + legal, S::ALL.len() * S::ALL.len());
        illegal
    }

    #[test]
    fn every_illegal_session_transition_is_a_typed_error() {
        assert_eq!(exhaust::<SessionStatus>(), 25 - 10);
    }

    #[test]
    fn every_illegal_turn_transition_is_a_typed_error() {
        assert_eq!(exhaust::<TurnStatus>(), 64 - 18);
    }

    #[test]
    fn every_illegal_step_transition_is_a_typed_error() {
        assert_eq!(exhaust::<StepStatus>(), 16 - 5);
    }

    #[test]
    fn every_illegal_tool_call_transition_is_a_typed_error() {
        assert_eq!(exhaust::<ToolCallStatus>(), 81 - 17);
    }

    #[test]
    fn every_illegal_effect_transition_is_a_typed_error() {
        assert_eq!(exhaust::<EffectStatus>(), 25 - 8);
    }

    #[test]
    fn every_illegal_approval_transition_is_a_typed_error() {
        assert_eq!(exhaust::<ApprovalStatus>(), 16 - 3);
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_typed_errors() {
        for &s in TurnStatus::ALL {
            assert_eq!(s.as_str().parse::<TurnStatus>().unwrap(), s);
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        let err = "sleeping".parse::<SessionStatus>().unwrap_err();
        assert_eq!(err.machine, Machine::Session);
        assert_eq!(err.to_string(), "unknown session state \"sleeping\"");
    }

    #[test]
    fn terminal_error_says_so() {
        let e = check_transition(TurnStatus::Completed, TurnStatus::Sampling).unwrap_err();
        assert_eq!(
            e.to_string(),
            "illegal turn transition completed -> sampling (terminal state)"
        );
    }
}
