//! [`SqlStore`]: the [`Store`] over SQLite (embedded) or PostgreSQL (shared), through sqlx's `Any`
//! driver so both run the same SQL (written with `?` placeholders; numbered `$n` for PostgreSQL).
//!
//! Backend differences live here and only here:
//! - **SQLite**: WAL, `synchronous=FULL`, `busy_timeout` 5 s. One dedicated writer connection takes
//!   every write (`BEGIN IMMEDIATE`); journal appends go through **group commit** ([`group_commit`]):
//!   appends that arrive while a commit is in flight are committed together in the next
//!   transaction with set-wise statements, one fsync for the batch; a refused compare-and-set
//!   does not affect the others. The batches are committed by a thread of the store's own on a
//!   rusqlite connection ([`sqlite_writer`]) while the group commit holds the writer's lock.
//!   Readers use a small pool. Waiters are woken in-process and poll every 50 ms (other processes' writes; intent waiters every 500 ms).
//! - **PostgreSQL**: a pool; each append is one transaction; `pg_notify` on the channel
//!   `<schema>_keel_events` carries the session id of an append to `LISTEN`ers (`intent:<session>`
//!   for a posted intent), with a 2 s poll as a fallback while the listener reconnects (30 s for
//!   intent waiters: a reconnect wakes every waiter). `<schema>_keel_work` carries `<tenant>:<session>` of a
//!   session that may have become claimable to `wait_for_work` (the scheduler's wake-up; its
//!   caller's timeout is the fallback). One listener connection serves both channels. An
//!   optional schema isolates a store (tests use one per run).

mod api;
mod approvals;
mod artifacts;
mod batch;
mod dialect;
mod effects;
mod extras;
mod group_commit;
mod intent_poll;
mod intents;
mod journal;
mod leases;
mod listener;
mod memory;
mod migrations;
mod open;
mod reservations;
mod rows;
mod scheduling;
mod sessions;
mod sqlite_file;
mod sqlite_writer;
mod usage;
mod waiters;
mod write;

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::{
    ApprovalDecision, ApprovalId, ApprovalRecord, ApprovalStatus, Decided, EffectStatus, Event,
    LeaseEpoch, OperationKey, PrincipalId, Release, ReleaseId, SessionId, SessionStatus, TenantId,
    TurnId,
};
use serde_json::Value;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions, AnyRow};
use sqlx::{AnyConnection, AnyPool, Connection, Executor, Row};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use crate::error::{Result, StoreError};
use crate::store::Store;
use crate::types::{
    ApiKeyRecord, AppendExtras, ApprovalQuery, Artifact, ArtifactInfo, CommitCounts, DueSession,
    EffectInsert, EffectRecord, EffectUpdate, IdempotencyBegin, IdempotencyKey, Intent, KeyScope,
    Lease, MemoryEntry, NewApiKey, NewSession, ReleaseRecord, Reservation, ReservationRow,
    SealedKind, SessionQuery, SessionRecord, StoredResponse, TenantRecord, TranscriptItem,
    UsageReservation, UsageRow,
};
use approvals::{APPROVAL_COLS, approval_from_row};
use batch::Bind;
pub use dialect::Dialect;
use group_commit::{AppendRequest, GroupCommit};
use listener::{channel_name, start_listener, work_payload};
use memory::memory_from_row;
use rows::{
    corrupt, event_from_row, expires_ms, ms_to_time, non_negative, not_found, parse_id, parse_json,
    time_col, to_i64, ttl_ms, validate_batch,
};
use sqlite_file::{percent_encode_path, prepare_sqlite_file};
use sqlite_writer::SqliteWriter;
use waiters::Waiters;
use write::{Commit, Counters, WriteConn};

/// Poll interval of `wait_for_version` on SQLite (bound on cross-process wake-up latency).
pub const SQLITE_POLL: Duration = Duration::from_millis(50);
/// Fallback poll interval on PostgreSQL (normally LISTEN/NOTIFY wakes waiters at once).
pub const POSTGRES_POLL: Duration = Duration::from_secs(2);

/// Fallback poll interval of `wait_for_intent` on PostgreSQL: intents are notified
/// (`intent:<session>` on the events channel), appends do not wake intent waiters, and a
/// listener that reconnects wakes every waiter, so this only bounds a notification lost some
/// other way.
pub const POSTGRES_INTENT_POLL: Duration = Duration::from_secs(30);

/// Interval of SQLite's one intent poll per store (`intent_poll`): an intent posted in this
/// process wakes its waiters at once; this bounds how late an intent posted by another process
/// on the same file is seen. One query per interval per store, only while somebody waits (it
/// was one query per watched session per interval, and at 50 ms 20 queries a second per
/// running session).
pub const SQLITE_INTENT_POLL: Duration = Duration::from_millis(500);

/// The store's wall clock (Unix ms): leases, claims and timestamps. Test builds may shift it
/// (`KEEL_CLOCK_SKEW_MS`, `keel_core::mechanisms::clock_skew_ms`; 0 otherwise).
pub(crate) fn now_ms() -> i64 {
    Utc::now().timestamp_millis() + keel_core::mechanisms::clock_skew_ms()
}

/// A store over SQLite or PostgreSQL. Cheap to clone.
#[derive(Clone)]
pub struct SqlStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: AnyPool,
    dialect: Dialect,
    /// SQLite only: the one writer connection.
    writer: Option<Arc<Mutex<AnyConnection>>>,
    /// SQLite only: appends waiting for the next group commit.
    group: GroupCommit,
    /// SQLite only: the thread that commits the group commit's batches.
    thread: Option<SqliteWriter>,
    waiters: Arc<Waiters>,
    /// The task that wakes waiters for other processes' writes: PostgreSQL's LISTEN task,
    /// SQLite's intent poll (`intent_poll`).
    listener: Option<JoinHandle<()>>,
    /// PostgreSQL only: one connection of its own for [`Store::renew_leases`] (SQLite renews
    /// on the one writer, like every write).
    renewals: Option<AnyPool>,
    /// PostgreSQL only: the NOTIFY channel of journal and intent waiters.
    channel: String,
    /// PostgreSQL only: the NOTIFY channel of `wait_for_work`.
    work_channel: String,
    poll: Duration,
    /// Committed writes, by kind ([`Store::commits`]).
    commits: Counters,
    /// What errors call this store: the SQLite file, or the PostgreSQL server.
    location: String,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(l) = &self.listener {
            l.abort();
        }
    }
}

impl SqlStore {
    /// The SQL dialect.
    pub fn dialect(&self) -> Dialect {
        self.inner.dialect
    }

    fn sql<'a>(&self, sql: &'a str) -> Cow<'a, str> {
        self.inner.dialect.sql(sql)
    }
}

/// The prefix of an intent notification's payload on the events channel: `intent:<session>`
/// wakes that session's `wait_for_intent` callers only (an append's payload, the bare session
/// id, wakes its `wait_for_version` callers only).
const INTENT_PREFIX: &str = "intent:";

#[async_trait]
impl Store for SqlStore {
    fn backend(&self) -> &'static str {
        self.inner.dialect.name()
    }

    fn commits(&self) -> CommitCounts {
        let c = &self.inner.commits;
        CommitCounts {
            journal: c.journal.load(Ordering::Relaxed),
            journal_row_columns: c.journal_row_columns.load(Ordering::Relaxed),
            tables: c.tables.load(Ordering::Relaxed),
            leases: c.leases.load(Ordering::Relaxed),
        }
    }

    async fn create_session(&self, tenant: TenantId, new: NewSession) -> Result<SessionRecord> {
        let session = new.session_id;
        self.session_create(tenant, new, None).await?;
        self.session_get(tenant, session).await
    }

    async fn create_session_leased(
        &self,
        tenant: TenantId,
        new: NewSession,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease> {
        let session = new.session_id;
        let expires = self.session_create(tenant, new, Some((owner, ttl))).await?;
        Ok(Lease {
            session_id: session,
            owner: owner.to_owned(),
            epoch: LeaseEpoch(1),
            expires_at: ms_to_time(expires),
        })
    }

    async fn get_session(&self, tenant: TenantId, session: SessionId) -> Result<SessionRecord> {
        self.session_get(tenant, session).await
    }

    async fn list_sessions(
        &self,
        tenant: TenantId,
        query: &SessionQuery,
    ) -> Result<Vec<SessionRecord>> {
        self.sessions_page(tenant, query).await
    }

    async fn due_sessions(&self, before: DateTime<Utc>, limit: u32) -> Result<Vec<DueSession>> {
        self.sessions_due(before, limit).await
    }

    async fn set_wake_at(
        &self,
        tenant: TenantId,
        session: SessionId,
        at: Option<DateTime<Utc>>,
    ) -> Result<()> {
        self.session_set_wake_at(tenant, session, at).await
    }

    async fn delete_session(&self, tenant: TenantId, session: SessionId) -> Result<()> {
        self.session_delete(tenant, session).await
    }

    async fn append_with(
        &self,
        tenant: TenantId,
        session: SessionId,
        expected_version: u64,
        lease_epoch: LeaseEpoch,
        events: &[Event],
        extras: &AppendExtras,
    ) -> Result<u64> {
        self.append_events(
            tenant,
            session,
            expected_version,
            lease_epoch,
            events,
            extras,
        )
        .await
    }

    async fn read(
        &self,
        tenant: TenantId,
        session: SessionId,
        from_seq: u64,
        limit: Option<u32>,
    ) -> Result<Vec<Event>> {
        self.read_events(tenant, session, from_seq, limit).await
    }

    async fn wait_for_version(
        &self,
        tenant: TenantId,
        session: SessionId,
        after_version: u64,
        timeout: Duration,
    ) -> Result<u64> {
        self.wait_version(tenant, session, after_version, timeout)
            .await
    }

    async fn acquire_lease(
        &self,
        tenant: TenantId,
        session: SessionId,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease> {
        self.take_lease(tenant, session, owner, ttl).await
    }

    async fn take_over_lease(
        &self,
        tenant: TenantId,
        session: SessionId,
        dead_owner: &str,
        dead_epoch: LeaseEpoch,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease> {
        self.take_over(tenant, session, dead_owner, dead_epoch, owner, ttl)
            .await
    }

    async fn renew_lease(&self, tenant: TenantId, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.renew_one(tenant, lease, ttl).await
    }

    async fn renew_leases(
        &self,
        tenant: TenantId,
        leases: &[Lease],
        ttl: Duration,
    ) -> Result<Vec<Lease>> {
        self.renew_many(tenant, leases, ttl).await
    }

    async fn release_lease(&self, tenant: TenantId, lease: &Lease) -> Result<()> {
        self.release_with(tenant, lease, None).await
    }

    async fn runnable_tenants(
        &self,
        now: DateTime<Utc>,
        max_schema_version: u32,
        limit: u32,
    ) -> Result<Vec<crate::TenantBacklog>> {
        self.sched_runnable_tenants(now, max_schema_version, limit)
            .await
    }

    async fn claim_sessions(
        &self,
        tenant: TenantId,
        owner: &str,
        ttl: Duration,
        now: DateTime<Utc>,
        max_schema_version: u32,
        max_leased: u64,
        limit: u32,
    ) -> Result<Vec<crate::Claim>> {
        self.sched_claim_sessions(
            tenant,
            owner,
            ttl,
            now,
            max_schema_version,
            max_leased,
            limit,
        )
        .await
    }

    async fn release_claim(
        &self,
        tenant: TenantId,
        lease: &Lease,
        defer_until: Option<DateTime<Utc>>,
        clear_wake_before: Option<DateTime<Utc>>,
    ) -> Result<()> {
        self.sched_release_claim(tenant, lease, defer_until, clear_wake_before)
            .await
    }

    async fn wait_for_work(&self, timeout: Duration) -> Result<bool> {
        self.sched_wait_for_work(timeout).await
    }

    async fn queue_depth(&self, tenant: TenantId) -> Result<(u64, u64)> {
        self.sched_queue_depth(tenant).await
    }

    async fn queue_depths(&self) -> Result<Vec<(TenantId, u64)>> {
        self.sched_queue_depths().await
    }

    async fn session_counts(&self) -> Result<Vec<(SessionStatus, u64)>> {
        self.sched_session_counts().await
    }

    async fn newer_schema_sessions(&self, max_schema_version: u32) -> Result<u64> {
        self.sched_newer_schema_sessions(max_schema_version).await
    }

    async fn reserve_tokens(
        &self,
        tenant: TenantId,
        window_start: i64,
        tokens: u64,
        limit: u64,
    ) -> Result<crate::TokenWindow> {
        self.sched_reserve_tokens(tenant, window_start, tokens, limit)
            .await
    }

    async fn settle_tokens(&self, tenant: TenantId, window_start: i64, delta: i64) -> Result<()> {
        self.sched_settle_tokens(tenant, window_start, delta).await
    }

    async fn post_intent(
        &self,
        tenant: TenantId,
        session: SessionId,
        kind: &str,
        payload: &Value,
    ) -> Result<Intent> {
        self.post(tenant, session, kind, payload).await
    }

    async fn wait_for_intent(
        &self,
        tenant: TenantId,
        session: SessionId,
        timeout: Duration,
    ) -> Result<bool> {
        self.wait_intent(tenant, session, timeout).await
    }

    async fn list_intents(&self, tenant: TenantId, session: SessionId) -> Result<Vec<Intent>> {
        self.intents_of(tenant, session).await
    }

    async fn delete_intent(
        &self,
        tenant: TenantId,
        session: SessionId,
        intent_id: &str,
    ) -> Result<bool> {
        self.remove_intent(tenant, session, intent_id).await
    }

    async fn insert_effect(&self, tenant: TenantId, effect: &EffectRecord) -> Result<EffectInsert> {
        self.effect_insert(tenant, effect).await
    }

    async fn update_effect(
        &self,
        tenant: TenantId,
        key: &OperationKey,
        update: EffectUpdate,
    ) -> Result<EffectRecord> {
        self.effect_update(tenant, key, update).await
    }

    async fn get_effect(&self, tenant: TenantId, key: &OperationKey) -> Result<EffectRecord> {
        self.effect_get(tenant, key).await
    }

    async fn list_effects(
        &self,
        tenant: TenantId,
        session: SessionId,
        status: Option<EffectStatus>,
    ) -> Result<Vec<EffectRecord>> {
        self.effects_of(tenant, session, status).await
    }

    async fn create_approval(&self, tenant: TenantId, a: &ApprovalRecord) -> Result<()> {
        self.approval_create(tenant, a).await
    }

    async fn get_approval(&self, tenant: TenantId, id: ApprovalId) -> Result<ApprovalRecord> {
        self.approval_get(tenant, id).await
    }

    async fn decide_approval_as(
        &self,
        tenant: TenantId,
        id: ApprovalId,
        decision: ApprovalDecision,
        args_hash: &str,
        now: DateTime<Utc>,
        by: Option<PrincipalId>,
    ) -> Result<Decided> {
        self.approval_decide(tenant, id, decision, args_hash, now, by)
            .await
    }

    async fn expire_approval(
        &self,
        tenant: TenantId,
        id: ApprovalId,
        now: DateTime<Utc>,
    ) -> Result<ApprovalRecord> {
        self.approval_expire(tenant, id, now).await
    }

    async fn withdraw_turn_approvals(
        &self,
        tenant: TenantId,
        session: SessionId,
        turn: TurnId,
        now: DateTime<Utc>,
    ) -> Result<Vec<ApprovalId>> {
        self.approvals_withdraw(tenant, session, turn, now).await
    }

    async fn list_approvals(
        &self,
        tenant: TenantId,
        session: SessionId,
        status: Option<ApprovalStatus>,
    ) -> Result<Vec<ApprovalRecord>> {
        self.approvals_of(tenant, session, status).await
    }

    async fn append_transcript(
        &self,
        tenant: TenantId,
        session: SessionId,
        items: &[TranscriptItem],
    ) -> Result<()> {
        self.transcript_append(tenant, session, items).await
    }

    async fn read_transcript(
        &self,
        tenant: TenantId,
        session: SessionId,
        from_index: u64,
    ) -> Result<Vec<TranscriptItem>> {
        self.transcript_read(tenant, session, from_index).await
    }

    async fn memory_put(
        &self,
        tenant: TenantId,
        namespace: &str,
        key: &str,
        value: &Value,
    ) -> Result<()> {
        self.memory_put_row(tenant, namespace, key, value).await
    }

    async fn memory_get(
        &self,
        tenant: TenantId,
        namespace: &str,
        key: &str,
    ) -> Result<Option<MemoryEntry>> {
        self.memory_get_row(tenant, namespace, key).await
    }

    async fn memory_search(
        &self,
        tenant: TenantId,
        namespace: Option<&str>,
        query: &str,
        limit: u32,
    ) -> Result<Vec<MemoryEntry>> {
        self.memory_search_rows(tenant, namespace, query, limit)
            .await
    }

    async fn memory_delete(&self, tenant: TenantId, namespace: &str, key: &str) -> Result<bool> {
        self.memory_delete_row(tenant, namespace, key).await
    }

    async fn usage(&self, tenant: TenantId, from_day: &str, to_day: &str) -> Result<Vec<UsageRow>> {
        self.usage_rows(tenant, from_day, to_day).await
    }

    async fn reserve_usage(&self, tenant: TenantId, r: &UsageReservation) -> Result<Reservation> {
        self.reserve_usage_tx(tenant, r).await
    }

    async fn usage_reservations(&self, tenant: TenantId, day: &str) -> Result<Vec<ReservationRow>> {
        self.live_reservations(tenant, day).await
    }

    async fn sealed_rows(
        &self,
        tenant: TenantId,
        session: SessionId,
        kind: SealedKind,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        self.sealed_rows_of(tenant, session, kind).await
    }

    async fn put_artifact(
        &self,
        tenant: TenantId,
        session: SessionId,
        name: &str,
        content_type: &str,
        data: &[u8],
    ) -> Result<String> {
        self.artifact_put(tenant, session, name, content_type, data)
            .await
    }

    async fn get_artifact(&self, tenant: TenantId, artifact_id: &str) -> Result<Artifact> {
        self.artifact_get(tenant, artifact_id).await
    }

    async fn put_release(&self, tenant: TenantId, release: &Release) -> Result<()> {
        self.release_put(tenant, release).await
    }

    async fn get_release(&self, tenant: TenantId, id: &ReleaseId) -> Result<Release> {
        Ok(self.api_get_release_record(tenant, id).await?.release)
    }

    async fn get_release_record(&self, tenant: TenantId, id: &ReleaseId) -> Result<ReleaseRecord> {
        self.api_get_release_record(tenant, id).await
    }

    async fn ready(&self) -> Result<()> {
        self.api_ready().await
    }

    async fn claim_workspace(&self, tenant: TenantId, path: &str) -> Result<()> {
        self.api_claim_workspace(tenant, path).await
    }

    async fn create_tenant(&self, name: &str) -> Result<TenantRecord> {
        self.api_create_tenant(name).await
    }

    async fn get_tenant(&self, tenant: TenantId) -> Result<TenantRecord> {
        self.api_get_tenant(tenant).await
    }

    async fn list_tenants(&self, after: Option<TenantId>, limit: u32) -> Result<Vec<TenantRecord>> {
        self.api_list_tenants(after, limit).await
    }

    async fn create_api_key(&self, new: &NewApiKey) -> Result<ApiKeyRecord> {
        self.api_create_key(new).await
    }

    async fn api_key_by_hash(&self, key_hash: &str) -> Result<Option<ApiKeyRecord>> {
        self.api_key_by_hash_q(key_hash).await
    }

    async fn list_api_keys(
        &self,
        scope: KeyScope,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ApiKeyRecord>> {
        self.api_list_keys(scope, after, limit).await
    }

    async fn revoke_api_key(
        &self,
        scope: KeyScope,
        key_id: &str,
        now: DateTime<Utc>,
    ) -> Result<ApiKeyRecord> {
        self.api_revoke_key(scope, key_id, now).await
    }

    async fn idempotency_begin(
        &self,
        key: &IdempotencyKey,
        request_hash: &str,
        now: DateTime<Utc>,
        ttl: Duration,
        stale_after: Duration,
    ) -> Result<IdempotencyBegin> {
        self.api_idem_begin(key, request_hash, now, ttl, stale_after)
            .await
    }

    async fn idempotency_finish(
        &self,
        key: &IdempotencyKey,
        request_hash: &str,
        response: &StoredResponse,
    ) -> Result<()> {
        self.api_idem_finish(key, request_hash, response).await
    }

    async fn idempotency_abandon(&self, key: &IdempotencyKey, request_hash: &str) -> Result<()> {
        self.api_idem_abandon(key, request_hash).await
    }

    async fn idempotency_cleanup(&self, now: DateTime<Utc>) -> Result<u64> {
        self.api_idem_cleanup(now).await
    }

    async fn list_approvals_page(
        &self,
        tenant: TenantId,
        query: &ApprovalQuery,
    ) -> Result<Vec<ApprovalRecord>> {
        self.api_list_approvals(tenant, query).await
    }

    async fn list_artifacts(
        &self,
        tenant: TenantId,
        session: SessionId,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ArtifactInfo>> {
        self.api_list_artifacts(tenant, session, after, limit).await
    }

    async fn memory_list(
        &self,
        tenant: TenantId,
        namespace: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<MemoryEntry>> {
        self.api_memory_list(tenant, namespace, after, limit).await
    }

    async fn memory_namespaces(&self, tenant: TenantId) -> Result<Vec<(String, u64)>> {
        self.api_memory_namespaces(tenant).await
    }

    async fn list_releases(
        &self,
        tenant: TenantId,
        after: Option<&ReleaseId>,
        limit: u32,
    ) -> Result<Vec<ReleaseRecord>> {
        self.api_list_releases(tenant, after, limit).await
    }
}

fn uuid_v7_text() -> String {
    // Artifact ids share the time-ordered UUIDv7 scheme of the core ids.
    keel_core::SessionId::new().to_string()
}
