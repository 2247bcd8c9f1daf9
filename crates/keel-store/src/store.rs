//! The `Store` trait: everything Keel keeps durably.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::{
    ApprovalDecision, ApprovalId, ApprovalRecord, ApprovalStatus, Decided, EffectStatus, Event,
    LeaseEpoch, OperationKey, PrincipalId, Release, ReleaseId, SessionId, TenantId, TurnId,
};
use serde_json::Value;

use crate::error::Result;
use crate::types::{
    ApiKeyRecord, AppendExtras, ApprovalQuery, Artifact, ArtifactInfo, CommitCounts, DueSession,
    EffectInsert, EffectRecord, EffectUpdate, IdempotencyBegin, IdempotencyKey, Intent, KeyScope,
    Lease, MemoryEntry, NewApiKey, NewSession, ReleaseRecord, Reservation, ReservationRow,
    SealedKind, SessionQuery, SessionRecord, StoredResponse, TenantRecord, TranscriptItem,
    UsageReservation, UsageRow,
};

/// Most namespaces [`Store::memory_namespaces`] returns.
pub const MAX_MEMORY_NAMESPACES: u32 = 10_000;

/// Most leases one statement of [`Store::renew_leases`] renews (three binds each: within
/// SQLite's and PostgreSQL's bind limits).
pub const RENEW_BATCH: usize = 500;

/// Durable storage for sessions, their journals and everything they own.
///
/// Every method takes the tenant first and filters on it: a session, effect, approval or artifact
/// of another tenant behaves as not found ([`crate::StoreError::NotFound`]).
/// Implementations: [`crate::SqlStore`] over SQLite (embedded default) and PostgreSQL; both pass
/// the same conformance suite (`tests/conformance`).
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Which backend this is (`sqlite`, `postgres`).
    fn backend(&self) -> &'static str;

    /// Durable commits this handle has made so far, by kind ([`CommitCounts`]): an
    /// [`Store::append_with`] counts one journal commit whatever its extras; other writes count
    /// in `tables` or `leases`. For tests and metrics that check how many commits a step costs.
    fn commits(&self) -> CommitCounts;

    // --- sessions ---------------------------------------------------------------------------

    /// Creates a session row at version 0, status `created`, no lease.
    ///
    /// # Errors
    /// `Conflict` if the id exists.
    async fn create_session(&self, tenant: TenantId, new: NewSession) -> Result<SessionRecord>;

    /// Creates a session row as [`Store::create_session`] does, with its lease already taken
    /// by `owner` for `ttl` (epoch 1), in one write: a session created to be worked on at once
    /// does not pay a second durable commit for its lease. The default creates the row, then
    /// takes the lease ([`Store::acquire_lease`]).
    ///
    /// # Errors
    /// `Conflict` if the id exists (nothing written).
    async fn create_session_leased(
        &self,
        tenant: TenantId,
        new: NewSession,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease> {
        let session = new.session_id;
        self.create_session(tenant, new).await?;
        self.acquire_lease(tenant, session, owner, ttl).await
    }

    /// Reads a session's row.
    ///
    /// # Errors
    /// `NotFound`.
    async fn get_session(&self, tenant: TenantId, session: SessionId) -> Result<SessionRecord>;

    /// Lists the tenant's sessions matching `query`: oldest first (page with `query.after`), or
    /// earliest wake-up first when `query.wake_before` is set.
    ///
    /// # Errors
    /// `CorruptRow` for a row that cannot be read; `Database`.
    async fn list_sessions(
        &self,
        tenant: TenantId,
        query: &SessionQuery,
    ) -> Result<Vec<SessionRecord>>;

    /// Sessions of every tenant whose wake-up time is at or before `before`, earliest first, at
    /// most `limit` (≤ 1000). The one query not scoped by tenant: it is the scheduler's scan, run
    /// by workers that serve all tenants; each result names its tenant and every further call is
    /// scoped by it.
    ///
    /// # Errors
    /// `CorruptRow`; `Database`.
    async fn due_sessions(&self, before: DateTime<Utc>, limit: u32) -> Result<Vec<DueSession>>;

    /// Sets (or clears) the session's wake-up time: a durable timer a worker acts on when it is due
    /// (a long retry-after, an approval's expiry, a scheduled resumption).
    ///
    /// # Errors
    /// `NotFound`.
    async fn set_wake_at(
        &self,
        tenant: TenantId,
        session: SessionId,
        at: Option<DateTime<Utc>>,
    ) -> Result<()>;

    /// Deletes the session and everything it owns (journal, transcript, effects, approvals,
    /// artifacts) in one transaction, for retention.
    ///
    /// # Errors
    /// `NotFound`.
    async fn delete_session(&self, tenant: TenantId, session: SessionId) -> Result<()>;

    // --- journal ----------------------------------------------------------------------------

    /// Appends `events` atomically if the journal is at `expected_version` and `lease_epoch` is the
    /// session's current, held lease. `events[i].seq` must be `expected_version + 1 + i` and every
    /// event must name `session`. The session's status projection follows the last
    /// `session.created` / `session.status_changed` in the batch. Returns the new version.
    /// Durable on return (SQLite: `synchronous=FULL`; PostgreSQL: synchronous commit).
    ///
    /// [`Store::append_with`] with no extras.
    ///
    /// # Errors
    /// `StaleVersion` or `LeaseLost` (nothing written), `NotFound`, `InvalidInput`.
    async fn append(
        &self,
        tenant: TenantId,
        session: SessionId,
        expected_version: u64,
        lease_epoch: LeaseEpoch,
        events: &[Event],
    ) -> Result<u64> {
        self.append_with(
            tenant,
            session,
            expected_version,
            lease_epoch,
            events,
            &AppendExtras::default(),
        )
        .await
    }

    /// [`Store::append`] plus side-table writes ([`AppendExtras`]: effect rows, new approvals,
    /// tenant usage, the session's wake-up time, sealed arguments, transcript rows) in the same
    /// transaction: one durable commit.
    /// The extras are written only if the compare-and-set succeeds; if any of them fails, nothing
    /// is written, events included, and its error is returned. With SQLite group commit each
    /// request's extras commit with its own events only, and a request whose extras fail fails
    /// alone. Counts one journal commit ([`Store::commits`]).
    ///
    /// # Errors
    /// As [`Store::append`]; `Conflict` for an approval id that exists, an effect's operation
    /// key held by another session, or a transcript index that holds a different row; `InvalidInput` for an effect or approval of another session,
    /// a usage day that is not `YYYY-MM-DD`, a negative or non-finite cost, a count past 2^63.
    async fn append_with(
        &self,
        tenant: TenantId,
        session: SessionId,
        expected_version: u64,
        lease_epoch: LeaseEpoch,
        events: &[Event],
        extras: &AppendExtras,
    ) -> Result<u64>;

    /// Reads events with `seq >= from_seq`, in order, at most `limit` (all if `None`).
    ///
    /// # Errors
    /// `NotFound`; `CorruptEvent` naming the session and seq of a row that cannot be decoded.
    async fn read(
        &self,
        tenant: TenantId,
        session: SessionId,
        from_seq: u64,
        limit: Option<u32>,
    ) -> Result<Vec<Event>>;

    /// Waits until the session's version exceeds `after_version` or `timeout` passes; returns the
    /// version then. Wake-up: PostgreSQL LISTEN/NOTIFY (channel prefixed by the schema), SQLite
    /// in-process notification plus polling every 50 ms (so at most ~100 ms late, also for writes
    /// from other processes).
    ///
    /// # Errors
    /// `NotFound`.
    async fn wait_for_version(
        &self,
        tenant: TenantId,
        session: SessionId,
        after_version: u64,
        timeout: Duration,
    ) -> Result<u64>;

    // --- leases -----------------------------------------------------------------------------

    /// Takes the session's lease if it is free or expired, for `ttl`. Every acquisition increments
    /// the fencing epoch, also a re-acquisition by the same owner.
    ///
    /// # Errors
    /// `LeaseHeld` (another holder, unexpired), `NotFound`.
    async fn acquire_lease(
        &self,
        tenant: TenantId,
        session: SessionId,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease>;

    /// Takes the lease from `dead_owner` at `dead_epoch` without waiting for it to expire — for a
    /// holder known to be gone (a dead process on this host). Bumps the epoch.
    ///
    /// # Errors
    /// `LeaseLost` if the lease is no longer `dead_owner`'s at that epoch; `NotFound` for an
    /// unknown session.
    async fn take_over_lease(
        &self,
        tenant: TenantId,
        session: SessionId,
        dead_owner: &str,
        dead_epoch: LeaseEpoch,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease>;

    /// Extends a held lease to `now + ttl` (heartbeat). An expired lease that nobody took over can
    /// still be renewed: its epoch is still current.
    ///
    /// Lease times are taken from the caller's clock (Unix ms); the epoch, not the clock, is the
    /// fence, so clock skew between workers costs at most an early or late takeover.
    ///
    /// # Errors
    /// `LeaseLost` if the epoch or owner changed; `NotFound` for an unknown session.
    async fn renew_lease(&self, tenant: TenantId, lease: &Lease, ttl: Duration) -> Result<Lease>;

    /// Renews many of `tenant`'s leases at once (a worker's heartbeat for every session it
    /// runs): each lease of `leases` still held by its owner at its epoch is extended to
    /// `now + ttl`, as [`Store::renew_lease`] extends one — an expired lease nobody took over
    /// included. One statement per [`RENEW_BATCH`] leases, not one per lease. Returns the
    /// renewed leases (new `expires_at`), in no particular order; a lease of `leases` missing
    /// from the result was lost (another holder took it, its epoch moved, it was released, or
    /// the session is gone or another tenant's): its holder must stop writing. Empty for no
    /// leases.
    ///
    /// # Errors
    /// Store errors (a failed statement renews nothing of its batch; batches before it stay
    /// renewed).
    async fn renew_leases(
        &self,
        tenant: TenantId,
        leases: &[Lease],
        ttl: Duration,
    ) -> Result<Vec<Lease>>;

    /// Gives a lease up; the next acquisition need not wait for expiry. When the session has
    /// work (see [`crate::scheduling`]; e.g. a turn queued under a lease taken for it), wakes
    /// [`Store::wait_for_work`]: it becomes claimable only now.
    ///
    /// # Errors
    /// `LeaseLost` if the epoch or owner changed; `NotFound` for an unknown session.
    async fn release_lease(&self, tenant: TenantId, lease: &Lease) -> Result<()>;

    // --- scheduling (workers) ---------------------------------------------------------------

    /// Tenants with sessions claimable at `now` by a worker reading event schemas up to
    /// `max_schema_version` (see [`crate::scheduling`]), each with its claimable count and its
    /// sessions under a live lease (at `now`); at most `limit` tenants, those whose claimable
    /// work has waited longest first (so none is left out for good when there are more).
    ///
    /// # Errors
    /// Store errors.
    async fn runnable_tenants(
        &self,
        now: DateTime<Utc>,
        max_schema_version: u32,
        limit: u32,
    ) -> Result<Vec<crate::TenantBacklog>>;

    /// Claims one of `tenant`'s claimable sessions for `owner` for `ttl`: the highest
    /// priority first, then the longest runnable (then due timers and intents, oldest first).
    /// Takes the lease in the same transaction (epoch bumped); rows locked by another claimer
    /// are skipped (`FOR UPDATE SKIP LOCKED` on PostgreSQL; SQLite's one writer serializes).
    /// `None` when nothing is claimable, or when `max_leased` of the tenant's sessions are
    /// already under a live lease at `now` (any owner: the tenant's running-session limit,
    /// `u64::MAX` for none). That count and the claim are one atomic step across processes:
    /// the tenant's claims take turns on a transaction-scoped advisory lock on PostgreSQL
    /// (SQLite's one writer), so concurrent claimers never take the tenant past the limit.
    /// Leases taken outside claims ([`Store::acquire_lease`]) count but are not limited. A
    /// session whose lease is `owner`'s own is not claimed until that lease has been expired
    /// for a whole `ttl` (its holder renews it, expired or not: [`Store::renew_leases`]); any
    /// other owner's expired lease is. Wakes nobody.
    ///
    /// # Errors
    /// Store errors.
    async fn claim_session(
        &self,
        tenant: TenantId,
        owner: &str,
        ttl: Duration,
        now: DateTime<Utc>,
        max_schema_version: u32,
        max_leased: u64,
    ) -> Result<Option<crate::Claim>> {
        Ok(self
            .claim_sessions(tenant, owner, ttl, now, max_schema_version, max_leased, 1)
            .await?
            .into_iter()
            .next())
    }

    /// Claims up to `limit` of `tenant`'s claimable sessions in one transaction, as
    /// [`Store::claim_session`] claims one: in its order (priority, then the longest runnable,
    /// then due timers and intents), each lease taken by the same rule and fencing (epoch
    /// bumped; the round's leases in one statement per 1,024 sessions), rows locked by another
    /// claimer skipped (`FOR UPDATE SKIP LOCKED … LIMIT limit` on PostgreSQL; SQLite's one
    /// writer serializes), and never taking the tenant past
    /// `max_leased` live leases (the count and the claims are one atomic step, as there). The
    /// claims in claim order; empty when nothing is claimable, the tenant is at its limit, or
    /// `limit` is 0. A worker with `k` free slots claims them in one round trip instead of
    /// `k`. Wakes nobody.
    ///
    /// # Errors
    /// Store errors (nothing is claimed then).
    #[allow(clippy::too_many_arguments)]
    async fn claim_sessions(
        &self,
        tenant: TenantId,
        owner: &str,
        ttl: Duration,
        now: DateTime<Utc>,
        max_schema_version: u32,
        max_leased: u64,
        limit: u32,
    ) -> Result<Vec<crate::Claim>>;

    /// Gives a claimed session back: releases `lease`, sets `claim_after` to `defer_until`
    /// (a backoff: the session is not claimable before then; `None` clears it), clears a
    /// wake-up time at or before `clear_wake_before` (a timer the run has served; a later one
    /// the run set stays), and wakes the workers when the session still has work.
    ///
    /// # Errors
    /// `LeaseLost` if the epoch or owner changed (nothing else is written); `NotFound`.
    async fn release_claim(
        &self,
        tenant: TenantId,
        lease: &Lease,
        defer_until: Option<DateTime<Utc>>,
        clear_wake_before: Option<DateTime<Utc>>,
    ) -> Result<()>;

    /// Waits until a session may have become claimable (an append making it runnable, a
    /// posted intent, a decided approval, a released lease or claim with work left — signalled
    /// through `NOTIFY` on PostgreSQL, in-process on SQLite) or `timeout` passes (the polling
    /// fallback, and SQLite's bound for other processes' writes). Returns whether it was woken.
    ///
    /// A wake-up reaches every caller of this handle waiting at that moment; one that arrives
    /// while none waits is kept, and the next wait returns at once (once: wake-ups do not
    /// accumulate). So a wake-up between two waits is not lost, and a woken worker should claim
    /// until [`Store::claim_session`] answers `None`. A wake-up may find nothing to claim
    /// (another worker was faster; the session is still leased).
    ///
    /// # Errors
    /// Store errors.
    async fn wait_for_work(&self, timeout: Duration) -> Result<bool>;

    /// Turns queued and not yet started: `(tenant's, all tenants')` (admission control).
    ///
    /// # Errors
    /// Store errors.
    async fn queue_depth(&self, tenant: TenantId) -> Result<(u64, u64)>;

    /// Queued turns per tenant, for tenants with any (metrics).
    ///
    /// # Errors
    /// Store errors.
    async fn queue_depths(&self) -> Result<Vec<(TenantId, u64)>>;

    /// Sessions by status over all tenants (metrics).
    ///
    /// # Errors
    /// Store errors.
    async fn session_counts(&self) -> Result<Vec<(keel_core::SessionStatus, u64)>>;

    /// Sessions with work whose journal was written by an event schema newer than
    /// `max_schema_version`: left for newer workers (metrics, a log line).
    ///
    /// # Errors
    /// Store errors.
    async fn newer_schema_sessions(&self, max_schema_version: u32) -> Result<u64>;

    /// Reserves `tokens` in `tenant`'s token window starting at `window_start` (Unix ms of the
    /// minute) against `limit` tokens per window: admitted when the window's total stays within
    /// the limit, or when the window is empty (one request larger than the limit still runs,
    /// alone). Windows older than two minutes are deleted on the way.
    ///
    /// # Errors
    /// Store errors.
    async fn reserve_tokens(
        &self,
        tenant: TenantId,
        window_start: i64,
        tokens: u64,
        limit: u64,
    ) -> Result<crate::TokenWindow>;

    /// Settles a reservation to the real usage: adds `delta` (negative when the step used less
    /// than reserved) to the window, never below zero.
    ///
    /// # Errors
    /// Store errors.
    async fn settle_tokens(&self, tenant: TenantId, window_start: i64, delta: i64) -> Result<()>;

    // --- intents ----------------------------------------------------------------------------

    /// Posts a durable intent for a session (no lease needed) and wakes [`Store::wait_for_intent`]
    /// waiters at once (same process, or PostgreSQL) or within one poll interval (SQLite, other
    /// processes). The intent makes the session claimable, and wakes [`Store::wait_for_work`].
    ///
    /// # Errors
    /// `NotFound` if the session does not exist for the tenant.
    async fn post_intent(
        &self,
        tenant: TenantId,
        session: SessionId,
        kind: &str,
        payload: &Value,
    ) -> Result<Intent>;

    /// Waits until the session has at least one intent or `timeout` passes; returns whether it
    /// has one. Woken by posted intents only (appends do not wake it): in-process, and on
    /// PostgreSQL by NOTIFY (`intent:<session>` on the events channel; a reconnecting listener
    /// wakes every waiter), with a fallback poll of 30 s on PostgreSQL and 50 ms on SQLite
    /// (another process's intents are seen only so there).
    ///
    /// # Errors
    /// `NotFound`.
    async fn wait_for_intent(
        &self,
        tenant: TenantId,
        session: SessionId,
        timeout: Duration,
    ) -> Result<bool>;

    /// The session's intents, oldest first (empty for an unknown session).
    ///
    /// # Errors
    /// `CorruptRow`; `Database`.
    async fn list_intents(&self, tenant: TenantId, session: SessionId) -> Result<Vec<Intent>>;

    /// Deletes an intent once handled; returns whether it existed (so two handlers can tell who
    /// took it).
    ///
    /// # Errors
    /// `Database`.
    async fn delete_intent(
        &self,
        tenant: TenantId,
        session: SessionId,
        intent_id: &str,
    ) -> Result<bool>;

    // --- effects ----------------------------------------------------------------------------

    /// Inserts an effect row if its operation key is new; otherwise returns the existing row
    /// unchanged, so a duplicate dispatch is detected.
    ///
    /// # Errors
    /// `NotFound` if the session does not exist for the tenant.
    async fn insert_effect(&self, tenant: TenantId, effect: &EffectRecord) -> Result<EffectInsert>;

    /// Moves an effect `from → to` (compare-and-set on `from`, checked against the effect table);
    /// a move to `dispatched` counts an attempt.
    ///
    /// # Errors
    /// `Transition`, `Conflict` (not in `from` any more), `NotFound`.
    async fn update_effect(
        &self,
        tenant: TenantId,
        key: &OperationKey,
        update: EffectUpdate,
    ) -> Result<EffectRecord>;

    /// Reads an effect.
    ///
    /// # Errors
    /// `NotFound`.
    async fn get_effect(&self, tenant: TenantId, key: &OperationKey) -> Result<EffectRecord>;

    /// Lists a session's effects, optionally in one status, oldest first (empty for an unknown
    /// session).
    ///
    /// # Errors
    /// `CorruptRow`; `Database`.
    async fn list_effects(
        &self,
        tenant: TenantId,
        session: SessionId,
        status: Option<EffectStatus>,
    ) -> Result<Vec<EffectRecord>>;

    // --- approvals --------------------------------------------------------------------------

    /// Stores a new pending approval.
    ///
    /// # Errors
    /// `Conflict` if the id exists; `NotFound` if the session does not.
    async fn create_approval(&self, tenant: TenantId, approval: &ApprovalRecord) -> Result<()>;

    /// Reads an approval.
    ///
    /// # Errors
    /// `NotFound`.
    async fn get_approval(&self, tenant: TenantId, id: ApprovalId) -> Result<ApprovalRecord>;

    /// Decides an approval by [`ApprovalRecord::decide`]'s rules, atomically: idempotent for the
    /// same decision, refused for other arguments, another decision, or past expiry.
    /// [`Store::decide_approval_as`] without a deciding principal.
    ///
    /// # Errors
    /// `Approval(..)`, `NotFound`.
    async fn decide_approval(
        &self,
        tenant: TenantId,
        id: ApprovalId,
        decision: ApprovalDecision,
        args_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<Decided> {
        self.decide_approval_as(tenant, id, decision, args_hash, now, None)
            .await
    }

    /// As [`Store::decide_approval`], recording `by` (the deciding principal) in the row's
    /// `decided_by` when this call decides it.
    ///
    /// A decision is work for whichever worker claims the session: in the same transaction the
    /// session's wake-up time becomes `now` (or the store's clock, if earlier) unless it is
    /// earlier already, and [`Store::wait_for_work`] is woken.
    ///
    /// # Errors
    /// `Approval(..)`, `NotFound`.
    async fn decide_approval_as(
        &self,
        tenant: TenantId,
        id: ApprovalId,
        decision: ApprovalDecision,
        args_hash: &str,
        now: DateTime<Utc>,
        by: Option<PrincipalId>,
    ) -> Result<Decided>;

    /// Marks a pending approval whose expiry has passed at `now` as `expired`; returns the row.
    ///
    /// # Errors
    /// `Conflict` if it is not pending or not yet due; `NotFound`.
    async fn expire_approval(
        &self,
        tenant: TenantId,
        id: ApprovalId,
        now: DateTime<Utc>,
    ) -> Result<ApprovalRecord>;

    /// Withdraws turn `turn`'s pending approvals (its turn ended: nobody may decide them any
    /// more): each row of session `session` and that turn still `pending` becomes `expired` with
    /// `decided_at = now`, whatever its expiry — [`Store::expire_approval`] without the due-time
    /// condition. Rows already decided or expired are left as they are. Returns the ids withdrawn
    /// (empty for an unknown session or turn, or one with nothing pending).
    ///
    /// # Errors
    /// `Database`.
    async fn withdraw_turn_approvals(
        &self,
        tenant: TenantId,
        session: SessionId,
        turn: TurnId,
        now: DateTime<Utc>,
    ) -> Result<Vec<ApprovalId>>;

    /// Lists a session's approvals, optionally in one status, oldest first (empty for an unknown
    /// session).
    ///
    /// # Errors
    /// `CorruptRow`; `Database`.
    async fn list_approvals(
        &self,
        tenant: TenantId,
        session: SessionId,
        status: Option<ApprovalStatus>,
    ) -> Result<Vec<ApprovalRecord>>;

    // --- transcript -------------------------------------------------------------------------

    /// Writes transcript items outside a journal append (the runtime writes them with the
    /// events that create them, [`AppendExtras::transcript`]; this is for repairs). Writing an
    /// index again with the same item is a no-op (so a recovering worker can repeat a write);
    /// with a different item it is a `Conflict` and nothing is written.
    ///
    /// # Errors
    /// `Conflict`, `NotFound`.
    async fn append_transcript(
        &self,
        tenant: TenantId,
        session: SessionId,
        items: &[TranscriptItem],
    ) -> Result<()>;

    /// Reads transcript items with `index >= from_index`, in order.
    ///
    /// # Errors
    /// `NotFound` for an unknown session; `CorruptRow`; `Database`.
    async fn read_transcript(
        &self,
        tenant: TenantId,
        session: SessionId,
        from_index: u64,
    ) -> Result<Vec<TranscriptItem>>;

    // --- memory -----------------------------------------------------------------------------

    /// Writes (inserts or replaces) a memory entry.
    ///
    /// # Errors
    /// `Database`.
    async fn memory_put(
        &self,
        tenant: TenantId,
        namespace: &str,
        key: &str,
        value: &Value,
    ) -> Result<()>;

    /// Reads a memory entry (`None` if absent).
    ///
    /// # Errors
    /// `CorruptRow`; `Database`.
    async fn memory_get(
        &self,
        tenant: TenantId,
        namespace: &str,
        key: &str,
    ) -> Result<Option<MemoryEntry>>;

    /// Full-text search (SQLite FTS5, PostgreSQL tsvector): the tenant's entries, in one namespace
    /// or all, whose key or value (its JSON text) has, for every word of `query`, a word starting
    /// with it — best match first (BM25 on SQLite, `ts_rank` on PostgreSQL), then most recently
    /// written, at most `limit`. Words are runs of letters and digits, case-folded, without
    /// stemming; a query without any word finds nothing, and at most 32 words are used.
    ///
    /// # Errors
    /// `CorruptRow`; `Database`.
    async fn memory_search(
        &self,
        tenant: TenantId,
        namespace: Option<&str>,
        query: &str,
        limit: u32,
    ) -> Result<Vec<MemoryEntry>>;

    /// Deletes a memory entry; returns whether it existed.
    ///
    /// # Errors
    /// `Database`.
    async fn memory_delete(&self, tenant: TenantId, namespace: &str, key: &str) -> Result<bool>;

    // --- usage ------------------------------------------------------------------------------

    /// The tenant's usage totals (added by [`AppendExtras::usage`]) for the UTC days
    /// `from_day ..= to_day` (`YYYY-MM-DD`), ordered by day, then model. Another tenant's usage
    /// is never included. Usage outlives the sessions that spent it.
    ///
    /// # Errors
    /// `InvalidInput` for a day that is not `YYYY-MM-DD`; `CorruptRow`; `Database`.
    async fn usage(&self, tenant: TenantId, from_day: &str, to_day: &str) -> Result<Vec<UsageRow>>;

    /// Reserves one model step's worst case (`r.tokens`, `r.cost_usd`) against the tenant's
    /// daily limits (`r.max_tokens`, `r.max_cost_usd`) for `r.day`, atomically with respect to
    /// every other reservation of the tenant and day, and replaces the session's previous
    /// reservation. With `used` the day's usage and `reserved` the other sessions' live
    /// reservations, for each limit set: `used ≥ limit` → [`Reservation::Exhausted`];
    /// `used + reserved ≥ limit` → [`Reservation::Busy`]; else [`Reservation::Granted`] with
    /// the amount capped at `limit − used − reserved`. Granted or not, the session's previous
    /// reservation is gone. A reservation is live while the session's lease is held at
    /// `r.lease_epoch` and unexpired; it ends with [`AppendExtras::release_reservation`] (in
    /// the append that commits the step's usage), a lease release, expiry or takeover.
    ///
    /// So used + live reservations never exceed a limit through a grant: concurrent sessions
    /// overshoot the day's budget only by what their steps use beyond what they reserved, at
    /// most one step per running session.
    ///
    /// # Errors
    /// `NotFound` for an unknown session; `LeaseLost` when the session's lease is not held at
    /// `r.lease_epoch`; `InvalidInput` for a malformed day, a negative or non-finite cost or
    /// limit, a count past 2^63.
    async fn reserve_usage(&self, tenant: TenantId, r: &UsageReservation) -> Result<Reservation>;

    /// The tenant's live reservations on UTC day `day` (`YYYY-MM-DD`), ordered by session.
    ///
    /// # Errors
    /// `InvalidInput` for a malformed day; `CorruptRow`; `Database`.
    async fn usage_reservations(&self, tenant: TenantId, day: &str) -> Result<Vec<ReservationRow>>;

    // --- sealed rows --------------------------------------------------------------------------

    /// The session's sealed rows of `kind` (written by [`AppendExtras::seal`], deleted by
    /// [`AppendExtras::unseal`]) as `(id, sealed bytes)`, ordered by id. Another tenant's rows
    /// are never included.
    ///
    /// # Errors
    /// `Database`.
    async fn sealed_rows(
        &self,
        tenant: TenantId,
        session: SessionId,
        kind: SealedKind,
    ) -> Result<Vec<(String, Vec<u8>)>>;

    // --- artifacts --------------------------------------------------------------------------

    /// Stores a blob owned by a session; returns its id.
    ///
    /// # Errors
    /// `NotFound` if the session does not exist.
    async fn put_artifact(
        &self,
        tenant: TenantId,
        session: SessionId,
        name: &str,
        content_type: &str,
        data: &[u8],
    ) -> Result<String>;

    /// Reads a blob.
    ///
    /// # Errors
    /// `NotFound`.
    async fn get_artifact(&self, tenant: TenantId, artifact_id: &str) -> Result<Artifact>;

    // --- releases ---------------------------------------------------------------------------

    /// Stores a release (idempotent: releases are immutable and content-addressed).
    ///
    /// # Errors
    /// `InvalidInput` if its id does not match its definition.
    async fn put_release(&self, tenant: TenantId, release: &Release) -> Result<()>;

    /// Reads a release.
    ///
    /// # Errors
    /// `NotFound`; `CorruptRow` if the stored definition no longer hashes to its id.
    async fn get_release(&self, tenant: TenantId, id: &ReleaseId) -> Result<Release>;

    /// A release with when the tenant first stored it.
    ///
    /// # Errors
    /// `NotFound` when the tenant has no such release; `Corrupt` for a definition that does not
    /// hash to its id.
    async fn get_release_record(&self, tenant: TenantId, id: &ReleaseId) -> Result<ReleaseRecord>;

    // --- API access -----------------------------------------------------------------------------

    /// Whether the store is usable: reachable, and its schema is this build's latest migration.
    ///
    /// # Errors
    /// `Database` when unreachable; `MigrationMismatch` when the schema is behind or ahead.
    async fn ready(&self) -> Result<()>;

    /// Claims the workspace directory `path` (canonical, absolute) for `tenant`, or finds it
    /// already the tenant's: tenants of one server share its workspace roots, never a
    /// workspace. Serialized across processes (SQLite's write lock; a PostgreSQL advisory
    /// transaction lock), so two tenants racing for nested directories cannot both win.
    ///
    /// # Errors
    /// `Conflict` when another tenant holds `path`, a directory above it or one below it (the
    /// message names no tenant); `InvalidInput` for a path that is not absolute.
    async fn claim_workspace(&self, tenant: TenantId, path: &str) -> Result<()>;

    /// Creates a tenant named `name` (unique).
    ///
    /// # Errors
    /// `Conflict` for a name in use; `InvalidInput` for an empty name or one over 200 bytes.
    async fn create_tenant(&self, name: &str) -> Result<TenantRecord>;

    /// Reads a tenant.
    ///
    /// # Errors
    /// `NotFound`.
    async fn get_tenant(&self, tenant: TenantId) -> Result<TenantRecord>;

    /// Tenants in creation order, after `after`, at most `limit` (≤ 1000).
    ///
    /// # Errors
    /// `CorruptRow`; `Database`.
    async fn list_tenants(&self, after: Option<TenantId>, limit: u32) -> Result<Vec<TenantRecord>>;

    /// Stores an API key's hash with its principal (a new one, or `new.principal_id`).
    ///
    /// # Errors
    /// `NotFound` for an unknown tenant or principal (a principal of another tenant is unknown);
    /// `InvalidInput` when `role` is `system` without a tenant… or the reverse, or an empty name;
    /// `Conflict` for a hash stored already.
    async fn create_api_key(&self, new: &NewApiKey) -> Result<ApiKeyRecord>;

    /// The key whose hash is `key_hash`, revoked and expired ones included (the caller checks
    /// [`ApiKeyRecord::is_usable`]); `None` when no key has it. Not scoped by tenant: it is how
    /// a request finds its tenant.
    ///
    /// # Errors
    /// `CorruptRow`; `Database`.
    async fn api_key_by_hash(&self, key_hash: &str) -> Result<Option<ApiKeyRecord>>;

    /// Keys in `scope`, in creation order, after key `after`, at most `limit` (≤ 1000).
    ///
    /// # Errors
    /// `CorruptRow`; `Database`.
    async fn list_api_keys(
        &self,
        scope: KeyScope,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ApiKeyRecord>>;

    /// Revokes key `key_id` in `scope` at `now` (a revoked key stays revoked at its first
    /// time); returns the row.
    ///
    /// # Errors
    /// `NotFound` (also for a key outside `scope`).
    async fn revoke_api_key(
        &self,
        scope: KeyScope,
        key_id: &str,
        now: DateTime<Utc>,
    ) -> Result<ApiKeyRecord>;

    /// Starts a request under an idempotency key, atomically: with no live record for `key`
    /// (none, or one expired at `now`) it writes one in flight, bound to `request_hash`, living
    /// `ttl`, and answers [`IdempotencyBegin::Started`]. Otherwise: another `request_hash` →
    /// `Mismatch`; still in flight → `InFlight` (unless it started more than `stale_after` ago:
    /// its process died, so this request takes it over as `Started`); done → `Done` with the
    /// stored response. Of concurrent callers with one key exactly one gets `Started`.
    ///
    /// # Errors
    /// `Database`.
    async fn idempotency_begin(
        &self,
        key: &IdempotencyKey,
        request_hash: &str,
        now: DateTime<Utc>,
        ttl: std::time::Duration,
        stale_after: std::time::Duration,
    ) -> Result<IdempotencyBegin>;

    /// Stores the response of a request begun with [`Store::idempotency_begin`] (state done).
    ///
    /// # Errors
    /// `NotFound` when the in-flight record is gone (expired and cleaned up meanwhile).
    async fn idempotency_finish(
        &self,
        key: &IdempotencyKey,
        request_hash: &str,
        response: &StoredResponse,
    ) -> Result<()>;

    /// Deletes an in-flight record whose request ended without a response worth replaying (a
    /// server error), so the client may try again with the same key.
    ///
    /// # Errors
    /// `Database`.
    async fn idempotency_abandon(&self, key: &IdempotencyKey, request_hash: &str) -> Result<()>;

    /// Deletes every idempotency record expired at `now`; returns how many.
    ///
    /// # Errors
    /// `Database`.
    async fn idempotency_cleanup(&self, now: DateTime<Utc>) -> Result<u64>;

    /// The tenant's approvals matching `query`, in creation order (a page; see
    /// [`ApprovalQuery`]).
    ///
    /// # Errors
    /// `CorruptRow`; `Database`.
    async fn list_approvals_page(
        &self,
        tenant: TenantId,
        query: &ApprovalQuery,
    ) -> Result<Vec<ApprovalRecord>>;

    /// The session's artifacts without their bytes, in creation order, after artifact `after`,
    /// at most `limit` (≤ 1000).
    ///
    /// # Errors
    /// `NotFound` for an unknown session; `CorruptRow`; `Database`.
    async fn list_artifacts(
        &self,
        tenant: TenantId,
        session: SessionId,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ArtifactInfo>>;

    /// The entries of one memory namespace in key order, after key `after`, at most `limit`
    /// (≤ 1000).
    ///
    /// # Errors
    /// `CorruptRow`; `Database`.
    async fn memory_list(
        &self,
        tenant: TenantId,
        namespace: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<MemoryEntry>>;

    /// The tenant's memory namespaces with their entry counts, in namespace order (byte-wise),
    /// at most [`MAX_MEMORY_NAMESPACES`] — for people browsing what agents remember (`keel
    /// memory list` shows a namespace's sub-namespaces `NS/…`).
    ///
    /// # Errors
    /// `CorruptRow`; `Database`.
    async fn memory_namespaces(&self, tenant: TenantId) -> Result<Vec<(String, u64)>>;

    /// The tenant's releases in the order they were first stored, after release `after`, at
    /// most `limit` (≤ 1000).
    ///
    /// # Errors
    /// `CorruptRow` (also for a definition that no longer hashes to its id); `Database`.
    async fn list_releases(
        &self,
        tenant: TenantId,
        after: Option<&ReleaseId>,
        limit: u32,
    ) -> Result<Vec<ReleaseRecord>>;
}
