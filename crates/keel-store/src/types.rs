//! Records the store reads and writes besides events.

use chrono::{DateTime, Utc};
use keel_core::{
    ApprovalId, ApprovalRecord, ApprovalStatus, BudgetLimit, EffectStatus, LeaseEpoch,
    OperationKey, PrincipalId, Release, ReleaseId, SessionId, SessionStatus, TenantId, ToolCallId,
    TurnId, Usage,
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
    /// Only sessions whose row pins this release (the one pinned now: a re-pin moves it).
    pub release_id: Option<ReleaseId>,
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

/// One row of a session's model-visible transcript. The store keeps rows as given (keyed by
/// tenant, session and index); what they hold is the runtime's (keel-runtime writes one row per
/// transcript item — `role` `user`, `assistant` or `tool`, `content` the message — and one
/// `summary` row per compaction boundary).
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
    /// Namespace, as stored (the memory tools use `agent:<name>`, `user:<principal>` or
    /// `shared`, with `/<sub-namespace>` when the model names one).
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

/// Side-table writes that commit in the same transaction as a journal append (one durable
/// commit), given to [`crate::Store::append_with`]. They are written only if the append's
/// compare-and-set succeeds; if any of them fails, nothing of the append is written.
///
/// Effects and approvals must belong to the appended session (`InvalidInput` otherwise), so they
/// are scoped by the tenant the append's compare-and-set already checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppendExtras {
    /// Effect rows to insert or replace (keyed by tenant + operation key): the journal's view of
    /// each effect after the batch (status, attempts, outcome, error, `updated_at` …). Any status
    /// may be written (no transition check: the journal is authoritative). A replaced row keeps
    /// its original `created_at`; an operation key held by another session is a `Conflict`.
    pub effects: Vec<EffectRecord>,
    /// Operation keys this append dispatches for the first time (its `effect.prepared` with
    /// its `effect.dispatched`), each with its row in `effects` (`InvalidInput` otherwise).
    /// The key's row, if the table has one already, must still be `prepared`: a row past
    /// `prepared` records a dispatch the session's journal lacks (written by something else
    /// than this journal), and the whole append is [`crate::StoreError::EffectClaimed`] and
    /// writes nothing, so the effect is not dispatched a second time. Checked in the append's
    /// own transaction, with no read before it (`keel-core`'s `effect_claim` mechanism).
    pub claims: Vec<OperationKey>,
    /// New approval rows (a request); an existing id is a `Conflict` and the whole append writes
    /// nothing.
    pub approvals: Vec<ApprovalRecord>,
    /// Usage added to the tenant's per-day, per-model totals (see [`crate::Store::usage`]).
    pub usage: Vec<UsageDelta>,
    /// `Some(Some(t))` sets the session's wake-up time, `Some(None)` clears it, `None` leaves it.
    pub wake_at: Option<Option<DateTime<Utc>>>,
    /// Sealed rows to insert or replace for the appended session, as `(key, sealed bytes)`
    /// (opaque to the store; see [`crate::Store::sealed_rows`]).
    pub seal: Vec<(SealedKey, Vec<u8>)>,
    /// Keys of the appended session's sealed rows to delete (absent rows are fine). Deletes
    /// run before the inserts of `seal`.
    pub unseal: Vec<SealedKey>,
    /// `Some(id)` points the session row's `release_id` at release `id` (a re-pin: the append
    /// carries `session.release_pinned`). The release must be stored for the tenant
    /// ([`crate::Store::put_release`]); otherwise the append is `NotFound` and writes nothing.
    pub release_id: Option<ReleaseId>,
    /// Deletes the appended session's usage reservation ([`crate::Store::reserve_usage`]): the
    /// step it was for has ended, and its real usage (in `usage`) commits in its place.
    pub release_reservation: bool,
    /// Transcript rows of the appended session, written as [`crate::Store::append_transcript`]
    /// writes them: an index written again with the same row is a no-op, with a different row
    /// a `Conflict` (and the whole append writes nothing).
    pub transcript: Vec<TranscriptItem>,
    /// The scheduler's mark of the session after this append ([`crate::WorkMark`]); `None`
    /// leaves the row's mark as it is. Written by the compare-and-set itself (no side-table
    /// write: [`AppendExtras::is_empty`] does not count it). An append that makes the session
    /// runnable wakes [`crate::Store::wait_for_work`].
    pub work: Option<crate::WorkMark>,
    /// Sets the session's scheduling priority (higher is claimed first within its tenant;
    /// the priority of the latest submitted turn). `None` leaves it. Written like `work`.
    pub priority: Option<i32>,
    /// `Some(id)` consumes intent `id` of the appended session ([`crate::Store::post_intent`])
    /// with the append: its row is deleted in the same transaction, and when no row was
    /// deleted (the poster withdrew it, or another handler took it) the whole append is
    /// [`crate::StoreError::IntentGone`] and writes nothing. So an intent's journal entry and
    /// its poster's withdrawal exclude each other: a poster whose
    /// [`crate::Store::delete_intent`] returned `true` knows the intent was never journaled.
    pub consume_intent: Option<String>,
}

/// What a sealed row holds: the namespace of its id within a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SealedKind {
    /// The exact arguments of a tool call whose journaled form was redacted; the id is the
    /// tool call id.
    Arguments,
    /// A completed step's provider reasoning items; the id is the step id.
    Reasoning,
    /// Every secret value the session's redactor has known (so a later process that lacks one
    /// still redacts it); one row per session, id `values`, deleted with the session.
    Secrets,
}

impl SealedKind {
    /// The value stored in the `kind` column.
    pub fn as_str(self) -> &'static str {
        match self {
            SealedKind::Arguments => "arguments",
            SealedKind::Reasoning => "reasoning",
            SealedKind::Secrets => "secrets",
        }
    }
}

/// A sealed row's key within its session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SealedKey {
    /// What the row holds.
    pub kind: SealedKind,
    /// Whose it is (a tool call id, a step id; see [`SealedKind`]).
    pub id: String,
}

impl SealedKey {
    /// The key of `kind` for `id`.
    pub fn new(kind: SealedKind, id: impl Into<String>) -> Self {
        Self {
            kind,
            id: id.into(),
        }
    }
}

impl AppendExtras {
    /// No side-table writes: the append is a plain [`crate::Store::append`] (the session row's
    /// scheduling columns, `work` and `priority`, aside).
    pub fn is_empty(&self) -> bool {
        self.effects.is_empty()
            && self.approvals.is_empty()
            && self.usage.is_empty()
            && self.wake_at.is_none()
            && self.seal.is_empty()
            && self.unseal.is_empty()
            && self.release_id.is_none()
            && !self.release_reservation
            && self.transcript.is_empty()
            && self.consume_intent.is_none()
    }
}

/// Usage to add to a tenant's totals for one UTC day and one model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageDelta {
    /// The UTC day, `YYYY-MM-DD` (zero-padded; anything else is `InvalidInput`).
    pub day: String,
    /// The model, as the runtime names it (e.g. `openai:gpt-4.1`); any string.
    pub model: String,
    /// Tokens to add, field by field.
    pub usage: Usage,
    /// Cost to add, in US dollars (finite and not negative, else `InvalidInput`).
    pub cost_usd: f64,
    /// Model steps (responses) to add.
    pub steps: u32,
}

/// A tenant's usage on one UTC day for one model: the sum of every [`UsageDelta`] committed for
/// it, from [`crate::Store::usage`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageRow {
    /// The UTC day, `YYYY-MM-DD`.
    pub day: String,
    /// The model.
    pub model: String,
    /// Tokens, summed field by field.
    pub usage: Usage,
    /// Cost in US dollars, summed.
    pub cost_usd: f64,
    /// Model steps, summed.
    pub steps: u64,
}

/// Tokens (input plus output, what budgets count) and cost in US dollars: a tenant's usage or
/// reservations on one UTC day, summed over models and sessions.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UsageAmount {
    /// Input plus output tokens.
    pub tokens: u64,
    /// US dollars.
    pub cost_usd: f64,
}

/// A session's request to reserve one model step's worst case against its tenant's daily
/// budget ([`crate::Store::reserve_usage`]).
#[derive(Debug, Clone, PartialEq)]
pub struct UsageReservation {
    /// The session that will sample the step (at most one reservation per session: a new one
    /// replaces the session's previous one).
    pub session_id: SessionId,
    /// The epoch of the lease the session is run under: the reservation counts only while the
    /// session's lease is held at this epoch and unexpired.
    pub lease_epoch: LeaseEpoch,
    /// The UTC day the budget is for, `YYYY-MM-DD`.
    pub day: String,
    /// Tokens (input plus output) the step may use at most.
    pub tokens: u64,
    /// Cost the step may reach at most, US dollars (finite, not negative).
    pub cost_usd: f64,
    /// The tenant's daily token limit; `None` for none.
    pub max_tokens: Option<u64>,
    /// The tenant's daily cost limit, US dollars (finite); `None` for none.
    pub max_cost_usd: Option<f64>,
}

/// What [`crate::Store::reserve_usage`] decided. `used` is the day's committed usage; `reserved`
/// what other sessions' live reservations hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reservation {
    /// Reserved: the asked amounts, each capped at what its limit leaves (`limit − used −
    /// reserved`), so at the grant `used + reserved + granted ≤ limit` for every limit set.
    Granted {
        /// Tokens reserved.
        tokens: u64,
        /// US dollars reserved.
        cost_usd: f64,
        /// The day's usage.
        used: UsageAmount,
        /// Other sessions' live reservations.
        reserved: UsageAmount,
    },
    /// The day's usage alone reached `limit` (`used ≥ limit`): nothing is reserved.
    Exhausted {
        /// The limit reached (`tokens` is checked before `cost`).
        limit: BudgetLimit,
        /// The day's usage.
        used: UsageAmount,
    },
    /// Usage is under every limit, but other sessions' live reservations hold the rest of
    /// `limit` (`used + reserved ≥ limit`): nothing is reserved; ask again once one of them
    /// settles or lapses.
    Busy {
        /// The limit fully held.
        limit: BudgetLimit,
        /// The day's usage.
        used: UsageAmount,
        /// Other sessions' live reservations.
        reserved: UsageAmount,
    },
}

/// One live reservation, from [`crate::Store::usage_reservations`].
#[derive(Debug, Clone, PartialEq)]
pub struct ReservationRow {
    /// The session holding it.
    pub session_id: SessionId,
    /// Its UTC day.
    pub day: String,
    /// The lease epoch it counts under.
    pub lease_epoch: LeaseEpoch,
    /// Reserved amounts.
    pub amount: UsageAmount,
}

/// Durable commits this store handle (and its clones) has made, by kind: monotonic counters,
/// from [`crate::Store::commits`]. A write call counts once when its write commits, also if it
/// found nothing to change (an existing effect, a delete of nothing); a write that fails counts
/// nothing, and reads never count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitCounts {
    /// `append` / `append_with` calls that committed: one per call, whatever group commit merges
    /// (its extras included).
    pub journal: u64,
    /// Of `journal`, the appends that set the session row's status or the scheduler's columns
    /// (`runnable`, `queued_turns`, `priority`): the rest took the slim compare-and-set that
    /// assigns no indexed column of `sessions` (only the version, `updated_at` and
    /// `schema_version`). A runtime sends its work mark only when it changed, so inside a turn
    /// this stays flat however many steps the turn takes.
    pub journal_row_columns: u64,
    /// Every other committed write: sessions, effects, approvals, memory, usage, artifacts,
    /// releases, intents, wake-ups, transcript, deletes. (`decide_approval` answering
    /// `Decided::Already` writes nothing and counts nothing.)
    pub tables: u64,
    /// Lease writes that succeeded: `acquire_lease`, `take_over_lease`, `renew_lease`,
    /// `release_lease`, and each statement of `renew_leases` that renewed any.
    pub leases: u64,
}

// --- API access: tenants, principals, keys, idempotency, pages ------------------------------------

/// A tenant, from [`crate::Store::create_tenant`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantRecord {
    /// Its id (UUIDv7).
    pub tenant_id: TenantId,
    /// Its name, unique across the store.
    pub name: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
}

/// What a principal (and so each of its API keys) may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Belongs to no tenant; manages tenants and system keys.
    System,
    /// A tenant's keys and releases, and everything an operator may do.
    Admin,
    /// Sessions, turns, approvals, effects, cancellation, memory; and everything a viewer may.
    Operator,
    /// Reads only.
    Viewer,
}

impl Role {
    /// The value stored and shown (`system`, `admin`, `operator`, `viewer`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Admin => "admin",
            Role::Operator => "operator",
            Role::Viewer => "viewer",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "system" => Ok(Role::System),
            "admin" => Ok(Role::Admin),
            "operator" => Ok(Role::Operator),
            "viewer" => Ok(Role::Viewer),
            other => Err(format!(
                "unknown role {other:?}: expected system, admin, operator or viewer"
            )),
        }
    }
}

/// An API key to store ([`crate::Store::create_api_key`]): only its hash.
#[derive(Debug, Clone, PartialEq)]
pub struct NewApiKey {
    /// The tenant; `None` for a system key (then `role` must be [`Role::System`], and only
    /// then).
    pub tenant_id: Option<TenantId>,
    /// An existing principal of that tenant to add the key to; `None` creates a principal
    /// named `principal_name` with `role`.
    pub principal_id: Option<PrincipalId>,
    /// The new principal's name (ignored with `principal_id`).
    pub principal_name: String,
    /// The new principal's role (ignored with `principal_id`).
    pub role: Role,
    /// `sha256:<hex>` of the key text.
    pub key_hash: String,
    /// The key's first characters, shown in lists.
    pub prefix: String,
    /// When it stops working, if ever.
    pub expires_at: Option<DateTime<Utc>>,
}

/// A stored API key with its principal (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    /// Its id (UUIDv7 text).
    pub key_id: String,
    /// Whose key it is.
    pub principal_id: PrincipalId,
    /// The principal's name.
    pub principal_name: String,
    /// The principal's tenant; `None` for a system key.
    pub tenant_id: Option<TenantId>,
    /// The principal's role.
    pub role: Role,
    /// The key's first characters.
    pub prefix: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Expiry, if any.
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was revoked, if it was.
    pub revoked_at: Option<DateTime<Utc>>,
}

impl ApiKeyRecord {
    /// Whether the key authenticates at `now`: not revoked, not expired.
    pub fn is_usable(&self, now: DateTime<Utc>) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|e| now < e)
    }
}

/// Which keys a key call sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyScope {
    /// Every key (the command line on the store itself).
    All,
    /// System keys only.
    System,
    /// One tenant's keys only.
    Tenant(TenantId),
}

/// Where an idempotency record lives: one key of one principal on one route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    /// The tenant id, or `system` for a system key.
    pub scope: String,
    /// The principal that sent the request.
    pub principal_id: PrincipalId,
    /// The route (`POST /v1/sessions/{session_id}/turns`, with the path's ids filled in).
    pub route: String,
    /// The client's `Idempotency-Key`.
    pub key: String,
}

/// A response kept for replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// Headers worth replaying (`content-type`, `etag`, `location`) as `(name, value)`.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: String,
}

/// What [`crate::Store::idempotency_begin`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotencyBegin {
    /// No live record: one was written (in flight); run the request, then finish or abandon.
    Started,
    /// The first request with this key is still running.
    InFlight,
    /// The key was used with another request body.
    Mismatch,
    /// The first request finished: replay its response.
    Done(StoredResponse),
}

/// Filter for [`crate::Store::list_approvals_page`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApprovalQuery {
    /// Only this session's.
    pub session_id: Option<SessionId>,
    /// Only in this status.
    pub status: Option<ApprovalStatus>,
    /// Page after this approval (creation order).
    pub after: Option<ApprovalId>,
    /// At most this many (default 100, at most 1000).
    pub limit: Option<u32>,
}

/// An artifact without its bytes, from [`crate::Store::list_artifacts`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactInfo {
    /// Its id.
    pub artifact_id: String,
    /// The session that owns it.
    pub session_id: SessionId,
    /// A name for people.
    pub name: String,
    /// MIME type.
    pub content_type: String,
    /// Size in bytes.
    pub size: u64,
    /// Creation time.
    pub created_at: DateTime<Utc>,
}

/// A stored release with the time it was first stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ReleaseRecord {
    /// The release.
    pub release: Release,
    /// When the tenant first stored it.
    pub created_at: DateTime<Utc>,
}
