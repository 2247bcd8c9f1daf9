//! Records the store reads and writes besides events.

use chrono::{DateTime, Utc};
use keel_core::{
    EffectStatus, LeaseEpoch, OperationKey, ReleaseId, SessionId, SessionStatus, TenantId,
    ToolCallId, TurnId,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A session to create.
#[derive(Clone, Debug, PartialEq)]
pub struct NewSession {
    /// Its id (UUIDv7).
    pub session_id: SessionId,
    /// The release it pins.
    pub release_id: ReleaseId,
    /// The session that spawned it, for child agents.
    pub parent_session_id: Option<SessionId>,
    /// Host metadata (workspace, labels); not interpreted by the store.
    pub metadata: Value,
}

/// A session's row: the journal's version, the status projection, the lease and the wake-up time.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionRecord {
    /// Owner.
    pub tenant_id: TenantId,
    /// Id.
    pub session_id: SessionId,
    /// Pinned release.
    pub release_id: ReleaseId,
    /// Parent, if spawned.
    pub parent_session_id: Option<SessionId>,
    /// Status as of the last `session.created` / `session.status_changed` event appended.
    pub status: SessionStatus,
    /// Seq of the last event; 0 for an empty journal.
    pub version: u64,
    /// When a worker should next look at it (durable timer), if set.
    pub wake_at: Option<DateTime<Utc>>,
    /// The current lease, if one is held (possibly expired).
    pub lease: Option<LeaseInfo>,
    /// The fencing epoch (incremented by every acquisition; 0 before the first).
    pub lease_epoch: LeaseEpoch,
    /// Host metadata.
    pub metadata: Value,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last write to the row.
    pub updated_at: DateTime<Utc>,
}

/// Who holds a session's lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseInfo {
    /// Holder, e.g. `worker-3@host:pid`.
    pub owner: String,
    /// Expiry unless renewed.
    pub expires_at: DateTime<Utc>,
}

/// A lease held by the caller. Present `epoch` with every append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The session.
    pub session_id: SessionId,
    /// Holder.
    pub owner: String,
    /// Fencing epoch of this acquisition.
    pub epoch: LeaseEpoch,
    /// Expiry unless renewed.
    pub expires_at: DateTime<Utc>,
}

/// Filter for [`crate::Store::list_sessions`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SessionQuery {
    /// Only sessions in this status.
    pub status: Option<SessionStatus>,
    /// Only sessions with a wake-up time at or before this instant (due timers).
    pub wake_before: Option<DateTime<Utc>>,
    /// Only children of this session.
    pub parent_session_id: Option<SessionId>,
    /// Page after this session (creation order); ignored with `wake_before`.
    pub after: Option<SessionId>,
    /// At most this many (default 100, at most 1000): oldest first, or earliest wake-up first
    /// with `wake_before`.
    pub limit: Option<u32>,
}

/// A session whose wake-up time has come, from [`crate::Store::due_sessions`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DueSession {
    /// Its tenant.
    pub tenant_id: TenantId,
    /// The session.
    pub session_id: SessionId,
    /// When it asked to be woken.
    pub wake_at: DateTime<Utc>,
}

/// One side effect's row, keyed by its operation key.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectRecord {
    /// The key (`<session>/<step>/<call>`).
    pub operation_key: OperationKey,
    /// The session.
    pub session_id: SessionId,
    /// The call.
    pub tool_call_id: ToolCallId,
    /// The tool's name.
    pub tool_name: String,
    /// Current status.
    pub status: EffectStatus,
    /// Hash of the exact request.
    pub request_hash: String,
    /// Dispatch attempts.
    pub attempts: u32,
    /// The recorded outcome, once committed.
    pub outcome: Option<Value>,
    /// The error, once failed.
    pub error: Option<String>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// What [`crate::Store::insert_effect`] found.
#[derive(Clone, Debug, PartialEq)]
pub enum EffectInsert {
    /// The key was new; the row was written.
    Inserted,
    /// The key already existed (a duplicate dispatch); here is the existing row, unchanged.
    Existing(EffectRecord),
}

/// A change of an effect's status.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectUpdate {
    /// The status the caller read; the write happens only if the row is still in it.
    pub from: EffectStatus,
    /// The new status (checked against the effect table).
    pub to: EffectStatus,
    /// The outcome, for `committed`.
    pub outcome: Option<Value>,
    /// The error, for `failed`.
    pub error: Option<String>,
}

/// One item of the model-visible transcript.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TranscriptItem {
    /// Position in the session's transcript, from 0.
    pub index: u64,
    /// The turn that wrote it.
    pub turn_id: Option<TurnId>,
    /// `user`, `assistant`, `tool`, `summary` (a compaction boundary).
    pub role: String,
    /// The item, as the runtime's context projection reads it.
    pub content: Value,
}

/// A tenant-scoped memory entry.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryEntry {
    /// Namespace (`default` when the caller gives none).
    pub namespace: String,
    /// Key, unique within the namespace.
    pub key: String,
    /// Value.
    pub value: Value,
    /// Last write.
    pub updated_at: DateTime<Utc>,
}

/// A stored blob (e.g. a tool's full output).
#[derive(Clone, Debug, PartialEq)]
pub struct Artifact {
    /// Its id (UUIDv7 text).
    pub artifact_id: String,
    /// The session that owns it.
    pub session_id: SessionId,
    /// A name for people (`shell-output-call_1.txt`).
    pub name: String,
    /// MIME type.
    pub content_type: String,
    /// The bytes.
    pub data: Vec<u8>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
}

/// A durable request for a session, posted by anyone while a worker may hold its lease (new
/// input, a cancellation). The lease holder journals it, then deletes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Intent {
    /// Its id (UUIDv7 text; ordering within one millisecond follows it).
    pub intent_id: String,
    /// The session.
    pub session_id: SessionId,
    /// What is asked, e.g. `input`, `cancel_turn`, `cancel_tool_call` (the runtime's vocabulary).
    pub kind: String,
    /// Its arguments.
    pub payload: Value,
    /// When it was posted.
    pub created_at: DateTime<Utc>,
}
