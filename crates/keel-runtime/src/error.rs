//! The runtime's one error type.

use keel_core::{ApplyError, ApprovalId, OperationKey, ReleaseId, SessionId, ToolCallId, TurnId};
use keel_store::StoreError;
use keel_tools::ToolsError;

/// Everything a [`crate::Runtime`] call can fail with. Variants name the input at fault; none of
/// them loses a committed event (the journal is only ever appended with compare-and-set).
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The store failed (connection, corrupt row, …) or refused a write.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// Tools or approvals failed in a way that is the caller's concern.
    #[error("tools: {0}")]
    Tools(#[from] ToolsError),
    /// The caller passed something unusable (empty input, an unknown permission mode, a bad rule
    /// or secret pattern, an unknown workspace). Nothing was written.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The input pipeline ([`crate::input`]) refused the input before anything was journaled
    /// or any model was asked: an unknown command, a command this host does not offer (`/resume`
    /// outside a terminal), an `@path` that is missing, outside the workspace or denied by the
    /// policy. The message names the command or path.
    #[error("input: {0}")]
    Input(String),
    /// A hook's configuration is wrong (see [`crate::hooks::Hooks::new`]).
    #[error("{hook}: {reason}")]
    HookConfig {
        /// Which hook (`hooks.pre_tool_use[0]`).
        hook: String,
        /// What is wrong.
        reason: String,
    },
    /// The session's `config` (pinned in `session.created`) cannot be read by this build.
    #[error("session {session}: its pinned config cannot be read: {reason}")]
    Config {
        /// The session.
        session: SessionId,
        /// What is wrong.
        reason: String,
    },
    /// The session's pinned release cannot be used by this build (its policy does not parse).
    #[error("session {session}: its pinned release {release} cannot be used: {reason}")]
    Release {
        /// The session.
        session: SessionId,
        /// The release.
        release: ReleaseId,
        /// What is wrong.
        reason: String,
    },
    /// An event the runtime built was refused by the session fold: a bug in the runtime, or a
    /// request that does not fit the session's state (e.g. deciding an effect that is not
    /// `outcome_unknown`). Nothing was written.
    #[error("session {session}: {source}")]
    Rejected {
        /// The session.
        session: SessionId,
        /// The fold's reason, naming the event.
        source: ApplyError,
    },
    /// Another worker holds the session's lease and did not give it up in time.
    #[error(
        "session {session} is being run by {owner}; wait for it to finish or for its lease to expire"
    )]
    SessionBusy {
        /// The session.
        session: SessionId,
        /// The lease holder.
        owner: String,
    },
    /// This worker lost the session's lease: it expired and another worker took over, or it
    /// lapsed — the store did not answer its renewals within the TTL, and the run stopped (its
    /// tools killed) before another worker could take the session (`lease::LeaseKeeper`, "The
    /// fence"). The session continues elsewhere, or with the next run here; nothing this worker
    /// did after losing it was written.
    #[error(
        "session {session}: lease lost: another worker took the session over, or the lease lapsed because the store did not answer its renewals in time"
    )]
    LeaseLost {
        /// The session.
        session: SessionId,
    },
    /// Multitask strategy `reject`: the session already has an active or queued turn.
    #[error(
        "session {session} already has turn {turn} in progress (multitask strategy reject); wait for it or use enqueue/interrupt"
    )]
    TurnInProgress {
        /// The session.
        session: SessionId,
        /// The active or queued turn.
        turn: TurnId,
    },
    /// [`crate::Runtime::repin`] while the session has an active turn (running, or waiting on a
    /// human): a turn runs one release from start to end. Nothing was written.
    #[error(
        "session {session}: turn {turn} is active; its release can change only between turns (let the turn finish, decide what it waits on, or cancel it)"
    )]
    TurnActive {
        /// The session.
        session: SessionId,
        /// The active turn.
        turn: TurnId,
    },
    /// No turn to cancel.
    #[error("session {session} has no active or queued turn to cancel")]
    NoActiveTurn {
        /// The session.
        session: SessionId,
    },
    /// The tool call is not open in the session.
    #[error("session {session}: tool call {call} is not running or waiting")]
    NoSuchToolCall {
        /// The session.
        session: SessionId,
        /// The call.
        call: ToolCallId,
    },
    /// A decision on an approval whose turn has ended (cancelled, failed, out of budget) or is
    /// being cancelled (`turn.cancel_requested` journaled): the approval was withdrawn with it
    /// and its call will never run. Nothing was decided (a row the turn's end left pending is
    /// withdrawn then).
    #[error(
        "approval {approval} can no longer be decided: its turn ended ({outcome}), so its call will not run; send a new message to start a new turn, where the model may propose the call again"
    )]
    ApprovalWithdrawn {
        /// The session.
        session: SessionId,
        /// The approval.
        approval: ApprovalId,
        /// How the turn ended (its status: `aborted`, `failed`, `budget_exhausted`, …), or
        /// `being cancelled`.
        outcome: String,
    },
    /// The effect does not exist or is not waiting for a decision.
    #[error("session {session}: effect {key} is not outcome_unknown")]
    EffectNotUnknown {
        /// The session.
        session: SessionId,
        /// The operation key.
        key: OperationKey,
    },
    /// [`crate::Runtime::close_session`] while the session has an open turn (running, waiting
    /// on a human, or queued). Nothing was written.
    #[error(
        "session {session} cannot close while turn {turn} is active or queued; cancel it (or let it finish) first"
    )]
    TurnOpen {
        /// The session.
        session: SessionId,
        /// The active or oldest queued turn.
        turn: TurnId,
    },
    /// The session is closed: it takes no more input.
    #[error("session {session} is closed; it takes no more input (start a new session)")]
    Closed {
        /// The session.
        session: SessionId,
    },
    /// Input from a host (a person, an API caller) to a sub-agent's session: the child takes
    /// only the prompt its parent's `spawn_agent` call gives it, and its answer is that call's
    /// result. Nothing was written.
    #[error(
        "session {session} is a sub-agent's session, run by a call of session {parent}; it takes no input: continue session {parent} instead"
    )]
    SubAgentSession {
        /// The child session.
        session: SessionId,
        /// The parent session whose call runs it.
        parent: SessionId,
    },
    /// The async runtime shut down while the session's run was in progress (its task was
    /// cancelled). Nothing committed is lost: the next run resumes the session from its journal.
    #[error(
        "session {session}: the run was stopped by the runtime shutting down; run the session again to resume it"
    )]
    ShuttingDown {
        /// The session.
        session: SessionId,
    },
}

impl RuntimeError {
    /// Maps store lease errors to [`RuntimeError::LeaseLost`].
    pub(crate) fn from_append(session: SessionId, e: StoreError) -> Self {
        match e {
            StoreError::LeaseLost { .. } => RuntimeError::LeaseLost { session },
            other => RuntimeError::Store(other),
        }
    }
}

/// Shorthand.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
