//! [`SqlStore`]: the [`Store`] over SQLite (embedded) or PostgreSQL (shared), through sqlx's `Any`
//! driver so both run the same SQL (written with `?` placeholders; numbered `$n` for PostgreSQL).
//!
//! Backend differences live here and only here:
//! - **SQLite**: WAL, `synchronous=FULL`, `busy_timeout` 5 s. One dedicated writer connection takes
//!   every write (`BEGIN IMMEDIATE`); journal appends go through **group commit** ([`group_commit`]):
//!   appends that arrive while a commit is in flight are committed together in the next
//!   transaction with set-wise statements, one fsync for the batch; a refused compare-and-set
//!   does not affect the others. Readers use a small pool. Waiters are woken in-process
//!   and poll every 50 ms (other processes' writes).
//! - **PostgreSQL**: a pool; each append is one transaction; `pg_notify` on the channel
//!   `<schema>_keel_events` carries the session id of an append to `LISTEN`ers (`intent:<session>`
//!   for a posted intent), with a 2 s poll as a fallback while the listener reconnects (30 s for
//!   intent waiters: a reconnect wakes every waiter). `<schema>_keel_work` carries `<tenant>:<session>` of a
//!   session that may have become claimable to `wait_for_work` (the scheduler's wake-up; its
//!   caller's timeout is the fallback). One listener connection serves both channels. An
//!   optional schema isolates a store (tests use one per run).

mod api;
mod extras;
mod group_commit;
mod leases;
mod migrations;
mod reservations;
mod scheduling;
mod waiters;

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::mechanisms::Mechanism;
use keel_core::{
    ApprovalDecision, ApprovalId, ApprovalRecord, ApprovalStatus, Decided, EffectStatus, Event,
    LeaseEpoch, OperationKey, PrincipalId, Release, ReleaseId, SessionId, SessionStatus,
    StateMachine, TenantId, ToolCallId, TurnId, check_transition,
};
use serde_json::Value;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions, AnyRow};
use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, AnyPool, Connection, Executor, Row};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use crate::error::{Result, StoreError};
use crate::store::Store;
use crate::types::{
    ApiKeyRecord, AppendExtras, ApprovalQuery, Artifact, ArtifactInfo, CommitCounts, DueSession,
    EffectInsert, EffectRecord, EffectUpdate, IdempotencyBegin, IdempotencyKey, Intent, KeyScope,
    Lease, LeaseInfo, MemoryEntry, NewApiKey, NewSession, ReleaseRecord, Reservation,
    ReservationRow, SealedKind, SessionQuery, SessionRecord, StoredResponse, TenantRecord,
    TranscriptItem, UsageReservation, UsageRow,
};
use group_commit::{AppendRequest, GroupCommit};
use waiters::Waiters;

/// Poll interval of `wait_for_version` on SQLite (bound on cross-process wake-up latency).
pub const SQLITE_POLL: Duration = Duration::from_millis(50);
/// Fallback poll interval on PostgreSQL (normally LISTEN/NOTIFY wakes waiters at once).
pub const POSTGRES_POLL: Duration = Duration::from_secs(2);

/// Fallback poll interval of `wait_for_intent` on PostgreSQL: intents are notified
/// (`intent:<session>` on the events channel), appends do not wake intent waiters, and a
/// listener that reconnects wakes every waiter, so this only bounds a notification lost some
/// other way.
pub const POSTGRES_INTENT_POLL: Duration = Duration::from_secs(30);

/// Which SQL dialect a store speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite 3.35+ (RETURNING, ON CONFLICT).
    Sqlite,
    /// PostgreSQL 12+.
    Postgres,
}

/// Test builds with `tenant_scope` turned off (`keel_core::mechanisms`): every `…tenant_id = ?`
/// condition of `sql` made `(…tenant_id = ? OR 1 = 1)` (same placeholders, always true), so the
/// store's tenant filter is gone from every query that goes through [`Dialect::sql`].
fn unscoped(sql: &str) -> String {
    const NEEDLE: &str = "tenant_id = ?";
    let mut out = String::with_capacity(sql.len() + 32);
    let mut rest = sql;
    while let Some(at) = rest.find(NEEDLE) {
        // The qualified column starts after the last character that cannot be part of it.
        let start = rest[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .map_or(0, |i| i + 1);
        out.push_str(&rest[..start]);
        out.push('(');
        out.push_str(&rest[start..at + NEEDLE.len()]);
        out.push_str(" OR 1 = 1)");
        rest = &rest[at + NEEDLE.len()..];
    }
    out.push_str(rest);
    out
}

impl Dialect {
    /// Rewrites `?` placeholders for this dialect (`$1, $2, …` for PostgreSQL). The SQL in this
    /// crate has no `?` inside literals.
    pub(crate) fn sql(self, sql: &str) -> Cow<'_, str> {
        let sql: Cow<'_, str> = if keel_core::mechanisms::is_off(Mechanism::TenantScope) {
            Cow::Owned(unscoped(sql))
        } else {
            Cow::Borrowed(sql)
        };
        match self {
            Dialect::Sqlite => sql,
            Dialect::Postgres => {
                let mut out = String::with_capacity(sql.len() + 16);
                let mut n = 0;
                for ch in sql.chars() {
                    if ch == '?' {
                        n += 1;
                        out.push('$');
                        out.push_str(&n.to_string());
                    } else {
                        out.push(ch);
                    }
                }
                Cow::Owned(out)
            }
        }
    }

    fn blob_type(self) -> &'static str {
        match self {
            Dialect::Sqlite => "BLOB",
            Dialect::Postgres => "BYTEA",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
        }
    }
}

/// The store's wall clock (Unix ms): leases, claims and timestamps. Test builds may shift it
/// (`KEEL_CLOCK_SKEW_MS`, `keel_core::mechanisms::clock_skew_ms`; 0 otherwise).
pub(crate) fn now_ms() -> i64 {
    Utc::now().timestamp_millis() + keel_core::mechanisms::clock_skew_ms()
}

fn ms_to_time(ms: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_millis(ms).unwrap_or_default()
}

/// A non-negative integer column, or `CorruptRow`.
fn non_negative(table: &'static str, id: impl ToString, column: &str, v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|_| corrupt(table, id, format!("{column} is {v}")))
}

/// A timestamp column (Unix ms) within range, or `CorruptRow`.
fn time_col(
    table: &'static str,
    id: impl ToString,
    column: &str,
    ms: i64,
) -> Result<DateTime<Utc>> {
    if ms < 0 {
        return Err(corrupt(table, id, format!("{column} is {ms}")));
    }
    DateTime::<Utc>::from_timestamp_millis(ms)
        .ok_or_else(|| corrupt(table, id, format!("{column} is {ms}")))
}

fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 2)
}

/// When something taken at `now` (Unix ms) for `ttl` expires, in Unix ms: saturating at the
/// latest time a `DateTime` holds, so a huge TTL is a far future, never an overflow (a panic,
/// or a wrap into the past that frees a held lease) nor a time read back as 1970.
fn expires_ms(now: i64, ttl: Duration) -> i64 {
    now.saturating_add(ttl_ms(ttl))
        .min(DateTime::<Utc>::MAX_UTC.timestamp_millis())
}

/// The binds of [`ACQUIRE_LEASE`]: `owner` takes the lease for `ttl` from `now` (Unix ms).
fn acquire_binds(
    owner: &str,
    ttl: Duration,
    now: i64,
    tenant: TenantId,
    session: SessionId,
) -> Vec<Bind> {
    vec![
        Bind::Text(owner.to_owned()),
        Bind::Int(expires_ms(now, ttl)),
        Bind::Int(now_ms()),
        Bind::Int(now),
        Bind::Text(tenant.to_string()),
        Bind::Text(session.to_string()),
    ]
}

fn to_i64(v: u64) -> Result<i64> {
    i64::try_from(v)
        .map_err(|_| StoreError::InvalidInput(format!("{v} does not fit a 63-bit integer")))
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
    waiters: Arc<Waiters>,
    /// PostgreSQL only: the LISTEN task.
    listener: Option<JoinHandle<()>>,
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

/// The counters behind [`CommitCounts`].
#[derive(Default)]
struct Counters {
    journal: AtomicU64,
    tables: AtomicU64,
    leases: AtomicU64,
}

/// Which [`CommitCounts`] counter a committed write adds to.
#[derive(Clone, Copy)]
enum Commit {
    Journal,
    Tables,
    Leases,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(l) = &self.listener {
            l.abort();
        }
    }
}

/// A connection to write on: SQLite's writer, or a pooled PostgreSQL connection.
enum WriteConn {
    Writer(tokio::sync::OwnedMutexGuard<AnyConnection>),
    Pooled(PoolConnection<Any>),
}

impl std::ops::Deref for WriteConn {
    type Target = AnyConnection;
    fn deref(&self) -> &AnyConnection {
        match self {
            WriteConn::Writer(g) => g,
            WriteConn::Pooled(c) => c,
        }
    }
}

impl std::ops::DerefMut for WriteConn {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        match self {
            WriteConn::Writer(g) => &mut *g,
            WriteConn::Pooled(c) => &mut *c,
        }
    }
}

const SESSION_COLS: &str = "tenant_id, session_id, release_id, parent_session_id, status, version, \
    wake_at, lease_owner, lease_epoch, lease_expires_at, metadata, created_at, updated_at";
const EFFECT_COLS: &str = "operation_key, session_id, tool_call_id, tool_name, status, request_hash, \
    attempts, outcome, error, created_at, updated_at";
const APPROVAL_COLS: &str = "approval_id, session_id, turn_id, tool_call_id, tool_name, arguments, \
    args_hash, status, decision, created_at, expires_at, decided_at, decided_by";

impl SqlStore {
    /// Opens (creating if needed) an SQLite database file and migrates it.
    ///
    /// # Errors
    /// `Database` if the file cannot be opened, `Locked` if another process holds it past the
    /// busy timeout, `SchemaTooNew` / `MigrationMismatch` for a database from another build.
    pub async fn open_sqlite(path: &Path) -> Result<Self> {
        sqlx::any::install_default_drivers();
        prepare_sqlite_file(path)?;
        let url = format!("sqlite://{}?mode=rwc", percent_encode_path(path));
        let options: AnyConnectOptions = url.parse()?;
        let pool = AnyPoolOptions::new()
            .max_connections(4)
            .min_connections(0)
            .after_connect(|conn, _meta| {
                Box::pin(async move {
                    conn.execute(
                        "PRAGMA busy_timeout = 5000; PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;",
                    )
                    .await?;
                    Ok(())
                })
            })
            .connect_with(options)
            .await?;
        let writer = migrations::run(pool.acquire().await?.detach(), Dialect::Sqlite).await?;
        Ok(SqlStore {
            inner: Arc::new(Inner {
                pool,
                dialect: Dialect::Sqlite,
                writer: Some(Arc::new(Mutex::new(writer))),
                group: GroupCommit::default(),
                waiters: Arc::new(Waiters::default()),
                listener: None,
                channel: String::new(),
                work_channel: String::new(),
                poll: SQLITE_POLL,
                commits: Counters::default(),
                location: path.display().to_string(),
            }),
        })
    }

    /// Connects to PostgreSQL at `url` and migrates. With `schema`, the store lives in that schema
    /// (created if missing) and its notification channel is `<schema>_keel_events`; tests use one fresh
    /// schema per run so parallel runs never collide.
    ///
    /// # Errors
    /// `Database` if the server is unreachable; `InvalidInput` for a schema name that is not
    /// `[a-z0-9_]+`; migration errors as for SQLite.
    pub async fn connect_postgres(url: &str, schema: Option<&str>) -> Result<Self> {
        sqlx::any::install_default_drivers();
        if let Some(s) = schema
            && (s.is_empty()
                || !s
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'))
        {
            return Err(StoreError::InvalidInput(format!(
                "schema name {s:?} must match [a-z0-9_]+"
            )));
        }
        // 'static so the per-connection hook's future is Send for every connection lifetime (one
        // small string per opened store).
        let (url, timeout) = split_connect_timeout(url)?;
        let url = url.as_str();
        let search_path: Option<&'static str> =
            schema.map(|s| &*Box::leak(format!("SET search_path TO \"{s}\"").into_boxed_str()));
        {
            // Schema creation and migrations run under one session-level advisory lock, so
            // processes opening the same fresh database at once take turns instead of racing on
            // the catalog.
            let conn = within(timeout, async {
                AnyConnection::connect(url).await.map_err(StoreError::from)
            })
            .await?;
            migrations::setup_postgres(conn, schema, search_path).await?;
        }
        let pool = AnyPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(timeout)
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    // Durable on return, whatever the server's default.
                    conn.execute("SET synchronous_commit = on").await?;
                    if let Some(sp) = search_path {
                        conn.execute(sp).await?;
                    }
                    Ok(())
                })
            })
            .connect(url)
            .await?;
        let waiters = Arc::new(Waiters::default());
        let channel = channel_name(schema, EVENTS_CHANNEL);
        let work_channel = channel_name(schema, WORK_CHANNEL);
        let listener = within(
            timeout,
            start_listener(url, [&channel, &work_channel], waiters.clone()),
        )
        .await?;
        Ok(SqlStore {
            inner: Arc::new(Inner {
                pool,
                dialect: Dialect::Postgres,
                writer: None,
                group: GroupCommit::default(),
                waiters,
                listener: Some(listener),
                channel,
                work_channel,
                poll: POSTGRES_POLL,
                commits: Counters::default(),
                location: "the PostgreSQL server".into(),
            }),
        })
    }

    /// The SQL dialect.
    pub fn dialect(&self) -> Dialect {
        self.inner.dialect
    }

    /// Counts one committed write (called once per write call, after its commit).
    fn committed(&self, kind: Commit) {
        let c = &self.inner.commits;
        let counter = match kind {
            Commit::Journal => &c.journal,
            Commit::Tables => &c.tables,
            Commit::Leases => &c.leases,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn sql<'a>(&self, sql: &'a str) -> Cow<'a, str> {
        self.inner.dialect.sql(sql)
    }

    async fn write_conn(&self) -> Result<WriteConn> {
        match &self.inner.writer {
            Some(w) => {
                let mut guard = w.clone().lock_owned().await;
                group_commit::ensure_no_transaction(&mut guard, &self.inner.pool).await;
                Ok(WriteConn::Writer(guard))
            }
            None => Ok(WriteConn::Pooled(self.inner.pool.acquire().await?)),
        }
    }

    /// `e`, naming this store's file or server when it says the disk is full.
    fn located(&self, e: StoreError) -> StoreError {
        match e {
            StoreError::DiskFull { detail, .. } => StoreError::DiskFull {
                location: self.inner.location.clone(),
                detail,
            },
            other => other,
        }
    }

    async fn begin<'c>(&self, conn: &'c mut AnyConnection) -> Result<sqlx::Transaction<'c, Any>> {
        Ok(match self.inner.dialect {
            Dialect::Sqlite => conn.begin_with("BEGIN IMMEDIATE").await?,
            Dialect::Postgres => conn.begin().await?,
        })
    }

    async fn session_exists<'e, E>(
        &self,
        exec: E,
        tenant: TenantId,
        session: SessionId,
    ) -> Result<bool>
    where
        E: Executor<'e, Database = Any>,
    {
        // PostgreSQL: FOR SHARE holds off a concurrent delete_session until this transaction ends.
        let sql = match self.inner.dialect {
            Dialect::Sqlite => {
                "SELECT 1 AS one FROM sessions WHERE tenant_id = ? AND session_id = ?"
            }
            Dialect::Postgres => {
                "SELECT 1 AS one FROM sessions WHERE tenant_id = $1 AND session_id = $2 FOR SHARE"
            }
        };
        let row = sqlx::query(sql)
            .bind(tenant.to_string())
            .bind(session.to_string())
            .fetch_optional(exec)
            .await?;
        Ok(row.is_some())
    }

    async fn require_session(&self, tenant: TenantId, session: SessionId) -> Result<()> {
        if self
            .session_exists(&self.inner.pool, tenant, session)
            .await?
        {
            Ok(())
        } else {
            Err(not_found("session", session))
        }
    }

    async fn current_version(&self, tenant: TenantId, session: SessionId) -> Result<u64> {
        let row = sqlx::query(
            &self.sql("SELECT version FROM sessions WHERE tenant_id = ? AND session_id = ?"),
        )
        .bind(tenant.to_string())
        .bind(session.to_string())
        .fetch_optional(&self.inner.pool)
        .await?
        .ok_or_else(|| not_found("session", session))?;
        non_negative("sessions", session, "version", row.try_get("version")?)
    }

    /// Re-evaluates `ready` whenever the session's waiters in `notifies` are woken (an append,
    /// or an intent, in this process or by a PostgreSQL notification) and at least every
    /// `poll`, until it holds or `timeout` passes; returns whether it held.
    async fn wait_until<F, Fut>(
        &self,
        notifies: &waiters::SessionNotifies,
        poll: Duration,
        session: SessionId,
        timeout: Duration,
        mut ready: F,
    ) -> Result<bool>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool>>,
    {
        let start = tokio::time::Instant::now();
        // A timeout too large to represent waits "forever" (about 34 years).
        let deadline = start
            .checked_add(timeout)
            .unwrap_or(start + Duration::from_secs(1 << 30));
        let reg = notifies.register(session);
        loop {
            let notified = reg.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if ready().await? {
                return Ok(true);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            let nap = (deadline - now).min(poll);
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep(nap) => {}
            }
        }
    }

    /// Rows of a session-owned table (`select` is `SELECT … FROM table`), optionally in one
    /// status, oldest first then by `id_col`.
    async fn list_of_session<T>(
        &self,
        select: &str,
        id_col: &str,
        tenant: TenantId,
        session: SessionId,
        status: Option<&'static str>,
        map: fn(&AnyRow) -> Result<T>,
    ) -> Result<Vec<T>> {
        let mut sql = format!("{select} WHERE tenant_id = ? AND session_id = ?");
        if status.is_some() {
            sql.push_str(" AND status = ?");
        }
        sql.push_str(&format!(" ORDER BY created_at, {id_col}"));
        let sql = self.inner.dialect.sql(&sql);
        let mut q = sqlx::query(&sql)
            .bind(tenant.to_string())
            .bind(session.to_string());
        if let Some(s) = status {
            q = q.bind(s);
        }
        q.fetch_all(&self.inner.pool)
            .await?
            .iter()
            .map(map)
            .collect()
    }

    /// Runs a lease `UPDATE … RETURNING lease_epoch, lease_expires_at[, …]` with `binds` on
    /// `conn` (in the caller's transaction, or as its own); the row when one matched.
    async fn lease_stmt(
        &self,
        conn: &mut AnyConnection,
        sql: &str,
        binds: Vec<Bind>,
    ) -> Result<Option<AnyRow>> {
        let q = self.sql(sql);
        let mut query = sqlx::query(&q);
        for b in binds {
            query = match b {
                Bind::Int(i) => query.bind(i),
                Bind::OptInt(i) => query.bind(i),
                Bind::Text(t) => query.bind(t),
            };
        }
        // `fetch_all`, not `fetch_optional`: an autocommit statement's own commit (where a full
        // disk fails it) runs after its RETURNING row; stopping at the first row would report a
        // lease the database never kept.
        let rows = query
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| self.located(e.into()))?;
        Ok(rows.into_iter().next())
    }

    /// Runs a lease statement ([`SqlStore::lease_stmt`]) as its own commit on the writer and
    /// counts it; `(lease_epoch, lease_expires_at, row)` when a row matched.
    async fn lease_write(&self, sql: &str, binds: Vec<Bind>) -> Result<Option<(i64, i64, AnyRow)>> {
        let mut conn = self.write_conn().await?;
        match self.lease_stmt(&mut conn, sql, binds).await? {
            Some(r) => {
                self.committed(Commit::Leases);
                Ok(Some((
                    r.try_get("lease_epoch")?,
                    r.try_get("lease_expires_at")?,
                    r,
                )))
            }
            None => Ok(None),
        }
    }

    /// Releases `lease` (fenced by owner and epoch). With `claim = Some((defer_until,
    /// clear_wake_before))` (Unix ms) it also sets `claim_after` and clears a wake-up time at or
    /// before `clear_wake_before` ([`Store::release_claim`]); otherwise both stay
    /// ([`Store::release_lease`]). Either way it wakes the workers when the session still has
    /// work ([`HAS_WORK`]) and is not deferred past now: a turn queued under a lease held for
    /// it (an API call) becomes claimable only here.
    ///
    /// # Errors
    /// `LeaseLost` (nothing written), `NotFound`.
    async fn release_with(
        &self,
        tenant: TenantId,
        lease: &Lease,
        claim: Option<(Option<i64>, Option<i64>)>,
    ) -> Result<()> {
        let now = now_ms();
        let mut binds = vec![Bind::Int(now)];
        let claim_set = match claim {
            Some((defer, clear_before)) => {
                binds.push(Bind::OptInt(defer));
                binds.push(Bind::OptInt(clear_before));
                ", claim_after = ?, wake_at = CASE WHEN wake_at IS NOT NULL AND wake_at <= ? \
                 THEN NULL ELSE wake_at END"
            }
            None => "",
        };
        binds.extend([
            Bind::Text(lease.owner.clone()),
            Bind::Int(i64::try_from(lease.epoch.0).unwrap_or(i64::MAX)),
            Bind::Text(tenant.to_string()),
            Bind::Text(lease.session_id.to_string()),
            Bind::Int(now),
        ]);
        let sql = format!(
            "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL, updated_at = ?{claim_set} \
             WHERE lease_owner = ? AND lease_epoch = ? AND tenant_id = ? AND session_id = ? \
             RETURNING lease_epoch, 0 AS lease_expires_at, CASE WHEN {HAS_WORK} THEN 1 ELSE 0 END AS has_work"
        );
        let Some((_, _, row)) = self.lease_write(&sql, binds).await? else {
            return Err(self.lease_lost(tenant, lease.session_id, lease.epoch).await);
        };
        let deferred = claim.and_then(|(defer, _)| defer).is_some_and(|d| d > now);
        if row.try_get::<i64, _>("has_work")? == 1 && !deferred {
            self.wake_workers(tenant, lease.session_id).await?;
        }
        Ok(())
    }

    /// Wakes `wait_for_work` callers about `session` after a commit: a NOTIFY on PostgreSQL
    /// (every store listening on the schema, this one included), in-process on SQLite.
    async fn wake_workers(&self, tenant: TenantId, session: SessionId) -> Result<()> {
        match self.inner.dialect {
            Dialect::Postgres => {
                let mut conn = self.inner.pool.acquire().await?;
                self.note_work(&mut conn, tenant, session).await
            }
            Dialect::Sqlite => {
                self.inner.waiters.work.signal();
                Ok(())
            }
        }
    }

    /// PostgreSQL: queues the work notification about `session` on `conn` (delivered when its
    /// transaction commits). SQLite: nothing; the caller calls [`SqlStore::woke_locally`] after
    /// its commit.
    async fn note_work(
        &self,
        conn: &mut AnyConnection,
        tenant: TenantId,
        session: SessionId,
    ) -> Result<()> {
        if self.inner.dialect == Dialect::Postgres {
            sqlx::query("SELECT pg_notify($1, $2)::text")
                .bind(self.inner.work_channel.clone())
                .bind(work_payload(tenant, session))
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }

    /// SQLite: wakes this process's `wait_for_work` callers after a commit that
    /// [`SqlStore::note_work`] noted (PostgreSQL's notification arrives through the listener).
    fn woke_locally(&self) {
        if self.inner.dialect == Dialect::Sqlite {
            self.inner.waiters.work.signal();
        }
    }

    async fn lease_lost(
        &self,
        tenant: TenantId,
        session: SessionId,
        held: LeaseEpoch,
    ) -> StoreError {
        match self.get_session(tenant, session).await {
            Ok(rec) => StoreError::LeaseLost {
                session,
                held,
                current: rec.lease_epoch,
                owner: rec.lease.map(|l| l.owner),
            },
            Err(e) => e,
        }
    }
}

/// A bound parameter of a lease write.
enum Bind {
    Int(i64),
    OptInt(Option<i64>),
    Text(String),
}

/// Takes a free or expired lease, bumping the epoch (binds: owner, expires_at, updated_at, now,
/// tenant, session): the one acquisition rule of [`Store::acquire_lease`] and
/// [`Store::claim_sessions`].
const ACQUIRE_LEASE: &str = "UPDATE sessions SET lease_owner = ?, lease_epoch = lease_epoch + 1, \
     lease_expires_at = ?, updated_at = ? \
     WHERE (lease_owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= ?) \
     AND tenant_id = ? AND session_id = ? RETURNING lease_epoch, lease_expires_at";

/// How long opening a PostgreSQL store waits for the server to answer a connection, unless the
/// URL's `connect_timeout` (seconds, libpq's parameter) says otherwise.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Splits libpq's `connect_timeout=SECONDS` off a PostgreSQL URL (sqlx does not read it): the
/// URL without it and the timeout ([`DEFAULT_CONNECT_TIMEOUT`] when absent; 0 or a value that
/// is not a whole number is refused).
fn split_connect_timeout(url: &str) -> Result<(String, Duration)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), DEFAULT_CONNECT_TIMEOUT));
    };
    let mut timeout = DEFAULT_CONNECT_TIMEOUT;
    let mut rest = Vec::new();
    for kv in query.split('&') {
        match kv.strip_prefix("connect_timeout=") {
            Some(v) => match v.parse::<u64>() {
                Ok(s) if s > 0 => timeout = Duration::from_secs(s),
                _ => {
                    return Err(StoreError::InvalidInput(format!(
                        "connect_timeout={v}: expected a whole number of seconds, at least 1"
                    )));
                }
            },
            None => rest.push(kv),
        }
    }
    let url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok((url, timeout))
}

/// `connecting`, failed as a connection error when the server has not answered within
/// `timeout`.
async fn within<T>(timeout: Duration, connecting: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(timeout, connecting)
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::Database(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no answer from the PostgreSQL server within {} s (connect_timeout)",
                    timeout.as_secs()
                ),
            ))))
        })
}

/// Attempts of `acquire_lease` at a lease seen free after a refused attempt.
const ACQUIRE_ATTEMPTS: usize = 8;

/// Whether the `sessions` row has work at a time (one bind: Unix ms): marked runnable, a due
/// wake-up time, or a posted intent ([`crate::scheduling`]).
const HAS_WORK: &str = "(sessions.runnable = 1 \
     OR (sessions.wake_at IS NOT NULL AND sessions.wake_at <= ?) \
     OR EXISTS (SELECT 1 FROM intents WHERE intents.tenant_id = sessions.tenant_id \
     AND intents.session_id = sessions.session_id))";

fn not_found(entity: &'static str, id: impl ToString) -> StoreError {
    StoreError::NotFound {
        entity,
        id: id.to_string(),
    }
}

fn corrupt(table: &'static str, id: impl ToString, reason: impl ToString) -> StoreError {
    StoreError::CorruptRow {
        table,
        id: id.to_string(),
        reason: reason.to_string(),
    }
}

fn parse_id<T: std::str::FromStr>(table: &'static str, text: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    text.parse::<T>().map_err(|e| corrupt(table, text, e))
}

fn parse_json(table: &'static str, id: impl ToString, text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| corrupt(table, id, e))
}

/// The suffix of the channel of journal and intent waiters (payload: a session id).
const EVENTS_CHANNEL: &str = "_keel_events";
/// The suffix of the channel of `wait_for_work` (payload: `<tenant>:<session>`).
const WORK_CHANNEL: &str = "_keel_work";

/// A NOTIFY channel of the store in `schema`: prefixed by the schema, as its notifications are
/// about that schema's sessions; at most 63 bytes (PostgreSQL's identifier length). The
/// listener tells the two channels' notifications apart by their payload, so a long schema
/// whose two names truncate alike still works.
fn channel_name(schema: Option<&str>, suffix: &str) -> String {
    let mut c = format!("{}{suffix}", schema.unwrap_or("public"));
    c.truncate(63);
    c
}

/// The payload of a work notification about `session`.
fn work_payload(tenant: TenantId, session: SessionId) -> String {
    format!("{tenant}:{session}")
}

/// The prefix of an intent notification's payload on the events channel: `intent:<session>`
/// wakes that session's `wait_for_intent` callers only (an append's payload, the bare session
/// id, wakes its `wait_for_version` callers only).
const INTENT_PREFIX: &str = "intent:";

/// LISTENs on `channels` on one connection: a session id wakes that session's version waiters,
/// `intent:<session>` its intent waiters, a work payload (`<tenant>:<session>`) wakes
/// `wait_for_work`. A lost connection is re-established
/// (by `PgListener::try_recv`) and wakes every waiter, as notifications sent meanwhile are lost.
async fn start_listener(
    url: &str,
    channels: [&str; 2],
    waiters: Arc<Waiters>,
) -> Result<JoinHandle<()>> {
    let mut listener = sqlx::postgres::PgListener::connect(url).await?;
    listener.listen_all(channels).await?;
    Ok(tokio::spawn(async move {
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) => {
                    let payload = n.payload();
                    if let Some(session) = payload.strip_prefix(INTENT_PREFIX) {
                        if let Ok(session) = session.parse::<SessionId>() {
                            waiters.intents.notify(session);
                        }
                    } else if payload.contains(':') {
                        waiters.work.signal();
                    } else if let Ok(session) = payload.parse::<SessionId>() {
                        waiters.versions.notify(session);
                    }
                }
                Ok(None) => {
                    tracing::warn!("store notification listener reconnected");
                    waiters.notify_all();
                }
                // Reconnected on the next try_recv; the poll fallbacks cover the gap.
                Err(e) => {
                    tracing::warn!(error = %e, "store notification listener error");
                    waiters.notify_all();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }))
}

fn session_from_row(row: &AnyRow) -> Result<SessionRecord> {
    let id: String = row.try_get("session_id")?;
    let status: String = row.try_get("status")?;
    let lease_owner: Option<String> = row.try_get("lease_owner")?;
    let lease_expires_at: Option<i64> = row.try_get("lease_expires_at")?;
    let parent: Option<String> = row.try_get("parent_session_id")?;
    let wake_at: Option<i64> = row.try_get("wake_at")?;
    let metadata: String = row.try_get("metadata")?;
    Ok(SessionRecord {
        tenant_id: parse_id("sessions", &row.try_get::<String, _>("tenant_id")?)?,
        session_id: parse_id("sessions", &id)?,
        release_id: ReleaseId(row.try_get("release_id")?),
        parent_session_id: parent
            .as_deref()
            .map(|p| parse_id("sessions", p))
            .transpose()?,
        status: status
            .parse::<SessionStatus>()
            .map_err(|e| corrupt("sessions", &id, e))?,
        version: non_negative("sessions", &id, "version", row.try_get("version")?)?,
        wake_at: wake_at
            .map(|w| time_col("sessions", &id, "wake_at", w))
            .transpose()?,
        lease: match (lease_owner, lease_expires_at) {
            (Some(owner), Some(exp)) => Some(LeaseInfo {
                owner,
                expires_at: time_col("sessions", &id, "lease_expires_at", exp)?,
            }),
            _ => None,
        },
        lease_epoch: LeaseEpoch(non_negative(
            "sessions",
            &id,
            "lease_epoch",
            row.try_get("lease_epoch")?,
        )?),
        metadata: parse_json("sessions", &id, &metadata)?,
        created_at: time_col("sessions", &id, "created_at", row.try_get("created_at")?)?,
        updated_at: time_col("sessions", &id, "updated_at", row.try_get("updated_at")?)?,
    })
}

fn effect_from_row(row: &AnyRow) -> Result<EffectRecord> {
    let key: String = row.try_get("operation_key")?;
    let status: String = row.try_get("status")?;
    let outcome: Option<String> = row.try_get("outcome")?;
    Ok(EffectRecord {
        session_id: parse_id("effects", &row.try_get::<String, _>("session_id")?)?,
        tool_call_id: ToolCallId(row.try_get("tool_call_id")?),
        tool_name: row.try_get("tool_name")?,
        status: status
            .parse::<EffectStatus>()
            .map_err(|e| corrupt("effects", &key, e))?,
        request_hash: row.try_get("request_hash")?,
        attempts: u32::try_from(row.try_get::<i64, _>("attempts")?)
            .map_err(|_| corrupt("effects", &key, "attempts out of range"))?,
        outcome: outcome
            .as_deref()
            .map(|o| parse_json("effects", &key, o))
            .transpose()?,
        error: row.try_get("error")?,
        created_at: ms_to_time(row.try_get("created_at")?),
        updated_at: ms_to_time(row.try_get("updated_at")?),
        operation_key: OperationKey(key),
    })
}

fn approval_from_row(row: &AnyRow) -> Result<ApprovalRecord> {
    let id: String = row.try_get("approval_id")?;
    let status: String = row.try_get("status")?;
    let decision: Option<String> = row.try_get("decision")?;
    let decided_at: Option<i64> = row.try_get("decided_at")?;
    let decided_by: Option<String> = row.try_get("decided_by")?;
    Ok(ApprovalRecord {
        approval_id: parse_id("approvals", &id)?,
        session_id: parse_id("approvals", &row.try_get::<String, _>("session_id")?)?,
        turn_id: parse_id::<TurnId>("approvals", &row.try_get::<String, _>("turn_id")?)?,
        tool_call_id: ToolCallId(row.try_get("tool_call_id")?),
        tool_name: row.try_get("tool_name")?,
        arguments: parse_json("approvals", &id, &row.try_get::<String, _>("arguments")?)?,
        args_hash: row.try_get("args_hash")?,
        status: status
            .parse::<ApprovalStatus>()
            .map_err(|e| corrupt("approvals", &id, e))?,
        decision: decision
            .as_deref()
            .map(|d| {
                serde_json::from_str::<ApprovalDecision>(d)
                    .map_err(|e| corrupt("approvals", &id, e))
            })
            .transpose()?,
        created_at: ms_to_time(row.try_get("created_at")?),
        expires_at: ms_to_time(row.try_get("expires_at")?),
        decided_at: decided_at.map(ms_to_time),
        decided_by: decided_by
            .as_deref()
            .map(|p| parse_id("approvals", p))
            .transpose()?,
    })
}

fn event_from_row(session: SessionId, row: &AnyRow) -> Result<Event> {
    let seq: i64 = row.try_get("seq")?;
    let body: String = row.try_get("body")?;
    let row_type: String = row.try_get("type")?;
    let ev = Event::decode(&body).map_err(|mut e| {
        e.session_id = e.session_id.or(Some(session));
        e.seq = e.seq.or(u64::try_from(seq).ok());
        StoreError::CorruptEvent(e)
    })?;
    if ev.type_name() != row_type {
        return Err(corrupt(
            "events",
            format!("{session}/{seq}"),
            format!(
                "type column {row_type:?} but the body is a {}",
                ev.type_name()
            ),
        ));
    }
    if ev.session_id != session || i64::try_from(ev.seq).ok() != Some(seq) {
        return Err(corrupt(
            "events",
            format!("{session}/{seq}"),
            format!("body names session {} seq {}", ev.session_id, ev.seq),
        ));
    }
    Ok(ev)
}

fn validate_batch(
    tenant: TenantId,
    session: SessionId,
    expected_version: u64,
    events: &[Event],
) -> Result<()> {
    if events.is_empty() {
        return Err(StoreError::InvalidInput("append of no events".into()));
    }
    for (i, ev) in events.iter().enumerate() {
        let want = expected_version
            .checked_add(1 + i as u64)
            .filter(|v| i64::try_from(*v).is_ok())
            .ok_or_else(|| {
                StoreError::InvalidInput(format!("version {expected_version} is out of range"))
            })?;
        if let keel_core::EventBody::SessionCreated { tenant_id, .. } = &ev.body
            && *tenant_id != tenant
        {
            return Err(StoreError::InvalidInput(format!(
                "session.created names tenant {tenant_id}, appended as tenant {tenant}"
            )));
        }
        if ev.session_id != session {
            return Err(StoreError::InvalidInput(format!(
                "event seq {} names session {}, appended to {session}",
                ev.seq, ev.session_id
            )));
        }
        if ev.seq != want {
            return Err(StoreError::InvalidInput(format!(
                "event {i} of the batch has seq {}, expected {want} (after version {expected_version})",
                ev.seq
            )));
        }
    }
    Ok(())
}

/// The words of a memory search (issue 15): runs of letters and digits, lower-cased, at most
/// [`MAX_SEARCH_WORDS`] — what both backends' full-text indexes are built from (see migration
/// 0010). Everything else separates words, so no query text reaches FTS5's or `to_tsquery`'s
/// syntax.
fn search_words(query: &str) -> Vec<String> {
    query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(MAX_SEARCH_WORDS)
        .map(str::to_lowercase)
        .collect()
}

/// The most words a memory search uses; later ones are ignored.
const MAX_SEARCH_WORDS: usize = 32;

#[async_trait]
impl Store for SqlStore {
    fn backend(&self) -> &'static str {
        self.inner.dialect.name()
    }

    fn commits(&self) -> CommitCounts {
        let c = &self.inner.commits;
        CommitCounts {
            journal: c.journal.load(Ordering::Relaxed),
            tables: c.tables.load(Ordering::Relaxed),
            leases: c.leases.load(Ordering::Relaxed),
        }
    }

    async fn create_session(&self, tenant: TenantId, new: NewSession) -> Result<SessionRecord> {
        let now = now_ms();
        let mut conn = self.write_conn().await?;
        let done = sqlx::query(&self.sql(
            "INSERT INTO sessions (tenant_id, session_id, release_id, parent_session_id, status, version, \
             lease_epoch, metadata, created_at, updated_at) VALUES (?, ?, ?, ?, ?, 0, 0, ?, ?, ?) \
             ON CONFLICT DO NOTHING",
        ))
        .bind(tenant.to_string())
        .bind(new.session_id.to_string())
        .bind(new.release_id.0.clone())
        .bind(new.parent_session_id.map(|p| p.to_string()))
        .bind(SessionStatus::Created.as_str())
        .bind(new.metadata.to_string())
        .bind(now)
        .bind(now)
        .execute(&mut *conn)
        .await?;
        drop(conn);
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!(
                "session {} already exists",
                new.session_id
            )));
        }
        self.committed(Commit::Tables);
        self.get_session(tenant, new.session_id).await
    }

    async fn get_session(&self, tenant: TenantId, session: SessionId) -> Result<SessionRecord> {
        let sql =
            format!("SELECT {SESSION_COLS} FROM sessions WHERE tenant_id = ? AND session_id = ?");
        let row = sqlx::query(&self.inner.dialect.sql(&sql))
            .bind(tenant.to_string())
            .bind(session.to_string())
            .fetch_optional(&self.inner.pool)
            .await?
            .ok_or_else(|| not_found("session", session))?;
        session_from_row(&row)
    }

    async fn list_sessions(
        &self,
        tenant: TenantId,
        query: &SessionQuery,
    ) -> Result<Vec<SessionRecord>> {
        let mut sql = format!("SELECT {SESSION_COLS} FROM sessions WHERE tenant_id = ?");
        if query.status.is_some() {
            sql.push_str(" AND status = ?");
        }
        if query.wake_before.is_some() {
            sql.push_str(" AND wake_at IS NOT NULL AND wake_at <= ?");
        }
        if query.parent_session_id.is_some() {
            sql.push_str(" AND parent_session_id = ?");
        }
        if query.release_id.is_some() {
            sql.push_str(" AND release_id = ?");
        }
        if query.wake_before.is_some() {
            // Due timers: earliest first.
            sql.push_str(" ORDER BY wake_at, session_id LIMIT ?");
        } else {
            if query.after.is_some() {
                sql.push_str(
                    " AND (created_at, session_id) > \
                     (SELECT created_at, session_id FROM sessions WHERE tenant_id = ? AND session_id = ?)",
                );
            }
            sql.push_str(" ORDER BY created_at, session_id LIMIT ?");
        }
        let sql = self.inner.dialect.sql(&sql);
        let mut q = sqlx::query(&sql).bind(tenant.to_string());
        if let Some(s) = query.status {
            q = q.bind(s.as_str());
        }
        if let Some(w) = query.wake_before {
            q = q.bind(w.timestamp_millis());
        }
        if let Some(p) = query.parent_session_id {
            q = q.bind(p.to_string());
        }
        if let Some(r) = &query.release_id {
            q = q.bind(r.0.clone());
        }
        if let (Some(after), None) = (query.after, query.wake_before) {
            q = q.bind(tenant.to_string()).bind(after.to_string());
        }
        q = q.bind(i64::from(query.limit.unwrap_or(100).min(1000)));
        let rows = q.fetch_all(&self.inner.pool).await?;
        rows.iter().map(session_from_row).collect()
    }

    async fn due_sessions(&self, before: DateTime<Utc>, limit: u32) -> Result<Vec<DueSession>> {
        let rows = sqlx::query(&self.sql(
            "SELECT tenant_id, session_id, wake_at FROM sessions \
             WHERE wake_at IS NOT NULL AND wake_at <= ? ORDER BY wake_at, session_id LIMIT ?",
        ))
        .bind(before.timestamp_millis())
        .bind(i64::from(limit.min(1000)))
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let id: String = r.try_get("session_id")?;
                Ok(DueSession {
                    tenant_id: parse_id("sessions", &r.try_get::<String, _>("tenant_id")?)?,
                    session_id: parse_id("sessions", &id)?,
                    wake_at: time_col("sessions", &id, "wake_at", r.try_get("wake_at")?)?,
                })
            })
            .collect()
    }

    async fn set_wake_at(
        &self,
        tenant: TenantId,
        session: SessionId,
        at: Option<DateTime<Utc>>,
    ) -> Result<()> {
        let mut conn = self.write_conn().await?;
        let done = sqlx::query(&self.sql(
            "UPDATE sessions SET wake_at = ?, updated_at = ? WHERE tenant_id = ? AND session_id = ?",
        ))
        .bind(at.map(|t| t.timestamp_millis()))
        .bind(now_ms())
        .bind(tenant.to_string())
        .bind(session.to_string())
        .execute(&mut *conn)
        .await?;
        if done.rows_affected() == 0 {
            return Err(not_found("session", session));
        }
        self.committed(Commit::Tables);
        Ok(())
    }

    async fn delete_session(&self, tenant: TenantId, session: SessionId) -> Result<()> {
        let mut conn = self.write_conn().await?;
        let mut tx = self.begin(&mut conn).await?;
        // The session row goes first: its row lock makes concurrent appends and inserts of owned
        // rows wait for this transaction and then find no session (no orphans).
        let done =
            sqlx::query(&self.sql("DELETE FROM sessions WHERE tenant_id = ? AND session_id = ?"))
                .bind(tenant.to_string())
                .bind(session.to_string())
                .execute(&mut *tx)
                .await?;
        if done.rows_affected() == 0 {
            return Err(not_found("session", session));
        }
        for table in [
            "events",
            "transcript",
            "effects",
            "approvals",
            "artifacts",
            "intents",
            "sealed_items",
            "usage_reservations",
        ] {
            let sql = format!("DELETE FROM {table} WHERE tenant_id = ? AND session_id = ?");
            sqlx::query(&self.inner.dialect.sql(&sql))
                .bind(tenant.to_string())
                .bind(session.to_string())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        self.committed(Commit::Tables);
        Ok(())
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
        validate_batch(tenant, session, expected_version, events)?;
        let req = AppendRequest::new(
            tenant,
            session,
            expected_version,
            lease_epoch,
            events,
            extras,
        )?;
        let outcome = match &self.inner.writer {
            Some(writer) => {
                self.inner
                    .group
                    .submit(
                        req,
                        writer.clone(),
                        &self.inner.pool,
                        self.inner.waiters.clone(),
                    )
                    .await
            }
            None => {
                group_commit::append_postgres(
                    &self.inner.pool,
                    &self.inner.channel,
                    &self.inner.work_channel,
                    &req,
                )
                .await?
            }
        };
        match outcome {
            Ok(v) => {
                self.committed(Commit::Journal);
                Ok(v)
            }
            Err(group_commit::CasFailure::Missing) => Err(not_found("session", session)),
            Err(group_commit::CasFailure::Stale { actual }) => Err(StoreError::StaleVersion {
                session,
                expected: expected_version,
                actual,
            }),
            Err(group_commit::CasFailure::Lease { current, owner }) => Err(StoreError::LeaseLost {
                session,
                held: lease_epoch,
                current,
                owner,
            }),
            Err(group_commit::CasFailure::Store(e)) => Err(self.located(e)),
        }
    }

    async fn read(
        &self,
        tenant: TenantId,
        session: SessionId,
        from_seq: u64,
        limit: Option<u32>,
    ) -> Result<Vec<Event>> {
        let rows = sqlx::query(&self.sql(
            "SELECT seq, type, body FROM events WHERE tenant_id = ? AND session_id = ? AND seq >= ? ORDER BY seq LIMIT ?",
        ))
        .bind(tenant.to_string())
        .bind(session.to_string())
        .bind(to_i64(from_seq)?)
        .bind(limit.map(i64::from).unwrap_or(i64::MAX))
        .fetch_all(&self.inner.pool)
        .await?;
        if rows.is_empty() {
            self.require_session(tenant, session).await?;
        }
        rows.iter().map(|r| event_from_row(session, r)).collect()
    }

    async fn wait_for_version(
        &self,
        tenant: TenantId,
        session: SessionId,
        after_version: u64,
        timeout: Duration,
    ) -> Result<u64> {
        let version = std::sync::atomic::AtomicU64::new(0);
        let seen = &version;
        let waiters = &self.inner.waiters.versions;
        self.wait_until(
            waiters,
            self.inner.poll,
            session,
            timeout,
            move || async move {
                let v = self.current_version(tenant, session).await?;
                seen.store(v, std::sync::atomic::Ordering::Relaxed);
                Ok(v > after_version)
            },
        )
        .await?;
        Ok(version.into_inner())
    }

    async fn acquire_lease(
        &self,
        tenant: TenantId,
        session: SessionId,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease> {
        // The lease may be given back between a refused attempt and the look at its holder
        // (callers contending for one session's short lease: concurrent submits): then it is
        // free, and the attempt is made again rather than failing the caller.
        for _ in 0..ACQUIRE_ATTEMPTS {
            let now = now_ms();
            let row = self
                .lease_write(
                    ACQUIRE_LEASE,
                    acquire_binds(owner, ttl, now, tenant, session),
                )
                .await?;
            if let Some((epoch, exp, _)) = row {
                return Ok(Lease {
                    session_id: session,
                    owner: owner.to_owned(),
                    epoch: LeaseEpoch(u64::try_from(epoch).unwrap_or(0)),
                    expires_at: ms_to_time(exp),
                });
            }
            let rec = self.get_session(tenant, session).await?;
            if let Some(l) = rec.lease
                && l.expires_at.timestamp_millis() > now_ms()
            {
                return Err(StoreError::LeaseHeld {
                    session,
                    owner: l.owner,
                    expires_at: l.expires_at,
                });
            }
        }
        Err(StoreError::Conflict(format!(
            "lease of session {session} changed hands {ACQUIRE_ATTEMPTS} times during acquisition"
        )))
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
        let now = now_ms();
        let row = self
            .lease_write(
                "UPDATE sessions SET lease_owner = ?, lease_epoch = lease_epoch + 1, lease_expires_at = ?, updated_at = ? \
                 WHERE lease_owner = ? AND lease_epoch = ? AND tenant_id = ? AND session_id = ? \
                 RETURNING lease_epoch, lease_expires_at",
                vec![
                    Bind::Text(owner.to_owned()),
                    Bind::Int(expires_ms(now, ttl)),
                    Bind::Int(now),
                    Bind::Text(dead_owner.to_owned()),
                    Bind::Int(i64::try_from(dead_epoch.0).unwrap_or(i64::MAX)),
                    Bind::Text(tenant.to_string()),
                    Bind::Text(session.to_string()),
                ],
            )
            .await?;
        match row {
            Some((epoch, exp, _)) => Ok(Lease {
                session_id: session,
                owner: owner.to_owned(),
                epoch: LeaseEpoch(u64::try_from(epoch).unwrap_or(0)),
                expires_at: ms_to_time(exp),
            }),
            None => Err(self.lease_lost(tenant, session, dead_epoch).await),
        }
    }

    async fn renew_lease(&self, tenant: TenantId, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let now = now_ms();
        let row = self
            .lease_write(
                "UPDATE sessions SET lease_expires_at = ?, updated_at = ? \
                 WHERE lease_owner = ? AND lease_epoch = ? AND tenant_id = ? AND session_id = ? \
                 RETURNING lease_epoch, lease_expires_at",
                vec![
                    Bind::Int(expires_ms(now, ttl)),
                    Bind::Int(now),
                    Bind::Text(lease.owner.clone()),
                    Bind::Int(i64::try_from(lease.epoch.0).unwrap_or(i64::MAX)),
                    Bind::Text(tenant.to_string()),
                    Bind::Text(lease.session_id.to_string()),
                ],
            )
            .await?;
        match row {
            Some((_, exp, _)) => Ok(Lease {
                expires_at: ms_to_time(exp),
                ..lease.clone()
            }),
            None => Err(self.lease_lost(tenant, lease.session_id, lease.epoch).await),
        }
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
        let intent = Intent {
            intent_id: uuid_v7_text(),
            session_id: session,
            kind: kind.to_owned(),
            payload: payload.clone(),
            created_at: ms_to_time(now_ms()),
        };
        let mut conn = self.write_conn().await?;
        let mut tx = self.begin(&mut conn).await?;
        if !self.session_exists(&mut *tx, tenant, session).await? {
            return Err(not_found("session", session));
        }
        sqlx::query(&self.sql(
            "INSERT INTO intents (tenant_id, session_id, intent_id, kind, payload, created_at) VALUES (?, ?, ?, ?, ?, ?)",
        ))
        .bind(tenant.to_string())
        .bind(session.to_string())
        .bind(intent.intent_id.clone())
        .bind(intent.kind.clone())
        .bind(intent.payload.to_string())
        .bind(intent.created_at.timestamp_millis())
        .execute(&mut *tx)
        .await?;
        if self.inner.dialect == Dialect::Postgres {
            sqlx::query("SELECT pg_notify($1, $2)::text")
                .bind(self.inner.channel.clone())
                .bind(format!("{INTENT_PREFIX}{session}"))
                .execute(&mut *tx)
                .await?;
        }
        // An intent is work for whichever worker claims the session.
        self.note_work(&mut tx, tenant, session).await?;
        tx.commit().await?;
        self.committed(Commit::Tables);
        self.inner.waiters.intents.notify(session);
        self.woke_locally();
        Ok(intent)
    }

    async fn wait_for_intent(
        &self,
        tenant: TenantId,
        session: SessionId,
        timeout: Duration,
    ) -> Result<bool> {
        // PostgreSQL notifies intents (a lost notification is covered by the listener waking
        // every waiter when it reconnects), so its fallback poll is long; SQLite polls as for
        // versions (another process's intents are seen only so).
        let poll = match self.inner.dialect {
            Dialect::Postgres => POSTGRES_INTENT_POLL,
            Dialect::Sqlite => self.inner.poll,
        };
        let waiters = &self.inner.waiters.intents;
        self.wait_until(waiters, poll, session, timeout, || async {
            let row = sqlx::query(&self.sql(
                "SELECT (SELECT count(*) FROM intents WHERE tenant_id = ? AND session_id = ?) AS n, \
                 (SELECT count(*) FROM sessions WHERE tenant_id = ? AND session_id = ?) AS s",
            ))
            .bind(tenant.to_string())
            .bind(session.to_string())
            .bind(tenant.to_string())
            .bind(session.to_string())
            .fetch_one(&self.inner.pool)
            .await?;
            if row.try_get::<i64, _>("s")? == 0 {
                return Err(not_found("session", session));
            }
            Ok(row.try_get::<i64, _>("n")? > 0)
        })
        .await
    }

    async fn list_intents(&self, tenant: TenantId, session: SessionId) -> Result<Vec<Intent>> {
        let rows = sqlx::query(&self.sql(
            "SELECT intent_id, kind, payload, created_at FROM intents \
             WHERE tenant_id = ? AND session_id = ? ORDER BY created_at, intent_id",
        ))
        .bind(tenant.to_string())
        .bind(session.to_string())
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let id: String = r.try_get("intent_id")?;
                Ok(Intent {
                    payload: parse_json("intents", &id, &r.try_get::<String, _>("payload")?)?,
                    intent_id: id,
                    session_id: session,
                    kind: r.try_get("kind")?,
                    created_at: ms_to_time(r.try_get("created_at")?),
                })
            })
            .collect()
    }

    async fn delete_intent(
        &self,
        tenant: TenantId,
        session: SessionId,
        intent_id: &str,
    ) -> Result<bool> {
        let mut conn = self.write_conn().await?;
        let done = sqlx::query(&self.sql(extras::DELETE_INTENT))
            .bind(tenant.to_string())
            .bind(session.to_string())
            .bind(intent_id.to_owned())
            .execute(&mut *conn)
            .await?;
        self.committed(Commit::Tables);
        Ok(done.rows_affected() > 0)
    }

    async fn insert_effect(&self, tenant: TenantId, effect: &EffectRecord) -> Result<EffectInsert> {
        if effect.status != EffectStatus::Prepared {
            return Err(StoreError::InvalidInput(format!(
                "effect {} must be inserted as prepared, not {}",
                effect.operation_key, effect.status
            )));
        }
        let now = now_ms();
        let mut conn = self.write_conn().await?;
        let mut tx = self.begin(&mut conn).await?;
        if !self
            .session_exists(&mut *tx, tenant, effect.session_id)
            .await?
        {
            return Err(not_found("session", effect.session_id));
        }
        let done = sqlx::query(&self.sql(
            "INSERT INTO effects (tenant_id, operation_key, session_id, tool_call_id, tool_name, status, \
             request_hash, attempts, outcome, error, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        ))
        .bind(tenant.to_string())
        .bind(effect.operation_key.0.clone())
        .bind(effect.session_id.to_string())
        .bind(effect.tool_call_id.0.clone())
        .bind(effect.tool_name.clone())
        .bind(effect.status.as_str())
        .bind(effect.request_hash.clone())
        .bind(i64::from(effect.attempts))
        .bind(effect.outcome.as_ref().map(Value::to_string))
        .bind(effect.error.clone())
        .bind(now)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 1 {
            tx.commit().await?;
            self.committed(Commit::Tables);
            return Ok(EffectInsert::Inserted);
        }
        let sql =
            format!("SELECT {EFFECT_COLS} FROM effects WHERE tenant_id = ? AND operation_key = ?");
        let row = sqlx::query(&self.inner.dialect.sql(&sql))
            .bind(tenant.to_string())
            .bind(effect.operation_key.0.clone())
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        self.committed(Commit::Tables);
        Ok(EffectInsert::Existing(effect_from_row(&row)?))
    }

    async fn update_effect(
        &self,
        tenant: TenantId,
        key: &OperationKey,
        update: EffectUpdate,
    ) -> Result<EffectRecord> {
        check_transition(update.from, update.to)?;
        let attempts_inc = i64::from(update.to == EffectStatus::Dispatched);
        let mut conn = self.write_conn().await?;
        let done = sqlx::query(&self.sql(
            "UPDATE effects SET status = ?, attempts = attempts + ?, outcome = COALESCE(?, outcome), \
             error = COALESCE(?, error), updated_at = ? WHERE tenant_id = ? AND operation_key = ? AND status = ?",
        ))
        .bind(update.to.as_str())
        .bind(attempts_inc)
        .bind(update.outcome.as_ref().map(Value::to_string))
        .bind(update.error.clone())
        .bind(now_ms())
        .bind(tenant.to_string())
        .bind(key.0.clone())
        .bind(update.from.as_str())
        .execute(&mut *conn)
        .await?;
        drop(conn);
        if done.rows_affected() > 0 {
            self.committed(Commit::Tables);
        }
        let current = self.get_effect(tenant, key).await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!(
                "effect {key} is {}, not {}",
                current.status, update.from
            )));
        }
        Ok(current)
    }

    async fn get_effect(&self, tenant: TenantId, key: &OperationKey) -> Result<EffectRecord> {
        let sql =
            format!("SELECT {EFFECT_COLS} FROM effects WHERE tenant_id = ? AND operation_key = ?");
        let row = sqlx::query(&self.inner.dialect.sql(&sql))
            .bind(tenant.to_string())
            .bind(key.0.clone())
            .fetch_optional(&self.inner.pool)
            .await?
            .ok_or_else(|| not_found("effect", key))?;
        effect_from_row(&row)
    }

    async fn list_effects(
        &self,
        tenant: TenantId,
        session: SessionId,
        status: Option<EffectStatus>,
    ) -> Result<Vec<EffectRecord>> {
        let sql = format!("SELECT {EFFECT_COLS} FROM effects");
        self.list_of_session(
            &sql,
            "operation_key",
            tenant,
            session,
            status.map(|s| s.as_str()),
            effect_from_row,
        )
        .await
    }

    async fn create_approval(&self, tenant: TenantId, a: &ApprovalRecord) -> Result<()> {
        let mut conn = self.write_conn().await?;
        let mut tx = self.begin(&mut conn).await?;
        if !self.session_exists(&mut *tx, tenant, a.session_id).await? {
            return Err(not_found("session", a.session_id));
        }
        let done = sqlx::query(&self.sql(
            "INSERT INTO approvals (tenant_id, approval_id, session_id, turn_id, tool_call_id, tool_name, \
             arguments, args_hash, status, decision, created_at, expires_at, decided_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        ))
        .bind(tenant.to_string())
        .bind(a.approval_id.to_string())
        .bind(a.session_id.to_string())
        .bind(a.turn_id.to_string())
        .bind(a.tool_call_id.0.clone())
        .bind(a.tool_name.clone())
        .bind(a.arguments.to_string())
        .bind(a.args_hash.clone())
        .bind(a.status.as_str())
        .bind(a.decision.as_ref().map(|d| serde_json::to_string(d).unwrap_or_default()))
        .bind(a.created_at.timestamp_millis())
        .bind(a.expires_at.timestamp_millis())
        .bind(a.decided_at.map(|t| t.timestamp_millis()))
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!(
                "approval {} already exists",
                a.approval_id
            )));
        }
        tx.commit().await?;
        self.committed(Commit::Tables);
        Ok(())
    }

    async fn get_approval(&self, tenant: TenantId, id: ApprovalId) -> Result<ApprovalRecord> {
        let sql = format!(
            "SELECT {APPROVAL_COLS} FROM approvals WHERE tenant_id = ? AND approval_id = ?"
        );
        let row = sqlx::query(&self.inner.dialect.sql(&sql))
            .bind(tenant.to_string())
            .bind(id.to_string())
            .fetch_optional(&self.inner.pool)
            .await?
            .ok_or_else(|| not_found("approval", id))?;
        approval_from_row(&row)
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
        // Decide against the current row, then write only if it is still pending (compare-and-set);
        // a racing decision makes the second round see the winner and answer idempotently or refuse.
        for _ in 0..3 {
            let current = self.get_approval(tenant, id).await?;
            let next = match current.decide(decision.clone(), args_hash, now)? {
                Decided::Already(rec) => return Ok(Decided::Already(rec)),
                Decided::Now(next) => next,
            };
            let mut conn = self.write_conn().await?;
            let mut tx = self.begin(&mut conn).await?;
            // The decision is work for whichever worker claims the session: it is due now (an
            // earlier wake-up time stays), and the workers are woken. The session row is
            // written first, as appends and deletions lock it before the approval rows (no
            // deadlock on PostgreSQL); a refused decision rolls it back.
            let due = now.timestamp_millis().min(now_ms());
            sqlx::query(&self.sql(
                "UPDATE sessions SET wake_at = ? WHERE tenant_id = ? AND session_id = ? \
                 AND (wake_at IS NULL OR wake_at > ?)",
            ))
            .bind(due)
            .bind(tenant.to_string())
            .bind(current.session_id.to_string())
            .bind(due)
            .execute(&mut *tx)
            .await?;
            let done = sqlx::query(&self.sql(&format!(
                "UPDATE approvals SET status = ?, decision = ?, decided_at = ?, decided_by = ? \
                 WHERE tenant_id = ? AND approval_id = ? AND {}",
                keel_core::mechanisms::sql_guard(Mechanism::DecisionOnce, "status = 'pending'")
            )))
            .bind(next.status.as_str())
            .bind(
                next.decision
                    .as_ref()
                    .map(|d| serde_json::to_string(d).unwrap_or_default()),
            )
            .bind(now.timestamp_millis())
            .bind(by.map(|p| p.to_string()))
            .bind(tenant.to_string())
            .bind(id.to_string())
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() == 1 {
                self.note_work(&mut tx, tenant, current.session_id).await?;
                tx.commit().await?;
                self.committed(Commit::Tables);
                self.woke_locally();
                // Return the row as stored (timestamps at the store's millisecond precision).
                drop(conn);
                return Ok(Decided::Now(self.get_approval(tenant, id).await?));
            }
            tx.rollback().await?;
        }
        Err(StoreError::Conflict(format!(
            "approval {id} kept changing while being decided"
        )))
    }

    async fn expire_approval(
        &self,
        tenant: TenantId,
        id: ApprovalId,
        now: DateTime<Utc>,
    ) -> Result<ApprovalRecord> {
        let mut conn = self.write_conn().await?;
        let done = sqlx::query(&self.sql(
            "UPDATE approvals SET status = 'expired', decided_at = ? \
             WHERE tenant_id = ? AND approval_id = ? AND status = 'pending' AND expires_at <= ?",
        ))
        .bind(now.timestamp_millis())
        .bind(tenant.to_string())
        .bind(id.to_string())
        .bind(now.timestamp_millis())
        .execute(&mut *conn)
        .await?;
        drop(conn);
        if done.rows_affected() > 0 {
            self.committed(Commit::Tables);
        }
        let rec = self.get_approval(tenant, id).await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!(
                "approval {id} is {} and expires at {}; not expired at {now}",
                rec.status, rec.expires_at
            )));
        }
        Ok(rec)
    }

    async fn withdraw_turn_approvals(
        &self,
        tenant: TenantId,
        session: SessionId,
        turn: TurnId,
        now: DateTime<Utc>,
    ) -> Result<Vec<ApprovalId>> {
        let mut conn = self.write_conn().await?;
        let rows = sqlx::query(&self.sql(
            "UPDATE approvals SET status = 'expired', decided_at = ? \
             WHERE tenant_id = ? AND session_id = ? AND turn_id = ? AND status = 'pending' \
             RETURNING approval_id",
        ))
        .bind(now.timestamp_millis())
        .bind(tenant.to_string())
        .bind(session.to_string())
        .bind(turn.to_string())
        .fetch_all(&mut *conn)
        .await?;
        drop(conn);
        if !rows.is_empty() {
            self.committed(Commit::Tables);
        }
        rows.iter()
            .map(|r| parse_id("approvals", &r.try_get::<String, _>("approval_id")?))
            .collect()
    }

    async fn list_approvals(
        &self,
        tenant: TenantId,
        session: SessionId,
        status: Option<ApprovalStatus>,
    ) -> Result<Vec<ApprovalRecord>> {
        let sql = format!("SELECT {APPROVAL_COLS} FROM approvals");
        self.list_of_session(
            &sql,
            "approval_id",
            tenant,
            session,
            status.map(|s| s.as_str()),
            approval_from_row,
        )
        .await
    }

    async fn append_transcript(
        &self,
        tenant: TenantId,
        session: SessionId,
        items: &[TranscriptItem],
    ) -> Result<()> {
        let mut conn = self.write_conn().await?;
        let mut tx = self.begin(&mut conn).await?;
        if !self.session_exists(&mut *tx, tenant, session).await? {
            return Err(not_found("session", session));
        }
        let rows = items
            .iter()
            .map(extras::TranscriptRow::of)
            .collect::<Result<Vec<_>>>()?;
        extras::write_transcript(
            &mut tx,
            self.dialect(),
            &tenant.to_string(),
            &session.to_string(),
            &rows,
            now_ms(),
        )
        .await?;
        tx.commit().await?;
        self.committed(Commit::Tables);
        Ok(())
    }

    async fn read_transcript(
        &self,
        tenant: TenantId,
        session: SessionId,
        from_index: u64,
    ) -> Result<Vec<TranscriptItem>> {
        let rows = sqlx::query(&self.sql(
            "SELECT idx, turn_id, role, content FROM transcript \
             WHERE tenant_id = ? AND session_id = ? AND idx >= ? ORDER BY idx",
        ))
        .bind(tenant.to_string())
        .bind(session.to_string())
        .bind(to_i64(from_index)?)
        .fetch_all(&self.inner.pool)
        .await?;
        if rows.is_empty() {
            self.require_session(tenant, session).await?;
        }
        rows.iter()
            .map(|r| {
                let idx: i64 = r.try_get("idx")?;
                let turn: Option<String> = r.try_get("turn_id")?;
                Ok(TranscriptItem {
                    index: non_negative("transcript", idx, "idx", idx)?,
                    turn_id: turn
                        .as_deref()
                        .map(|t| parse_id("transcript", t))
                        .transpose()?,
                    role: r.try_get("role")?,
                    content: parse_json("transcript", idx, &r.try_get::<String, _>("content")?)?,
                })
            })
            .collect()
    }

    async fn memory_put(
        &self,
        tenant: TenantId,
        namespace: &str,
        key: &str,
        value: &Value,
    ) -> Result<()> {
        let mut conn = self.write_conn().await?;
        sqlx::query(&self.sql(
            "INSERT INTO memory (tenant_id, namespace, key, value, updated_at) VALUES (?, ?, ?, ?, ?) \
             ON CONFLICT (tenant_id, namespace, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
        ))
        .bind(tenant.to_string())
        .bind(namespace.to_owned())
        .bind(key.to_owned())
        .bind(value.to_string())
        .bind(now_ms())
        .execute(&mut *conn)
        .await?;
        self.committed(Commit::Tables);
        Ok(())
    }

    async fn memory_get(
        &self,
        tenant: TenantId,
        namespace: &str,
        key: &str,
    ) -> Result<Option<MemoryEntry>> {
        let row = sqlx::query(&self.sql(
            "SELECT namespace, key, value, updated_at FROM memory WHERE tenant_id = ? AND namespace = ? AND key = ?",
        ))
        .bind(tenant.to_string())
        .bind(namespace.to_owned())
        .bind(key.to_owned())
        .fetch_optional(&self.inner.pool)
        .await?;
        row.as_ref().map(memory_from_row).transpose()
    }

    async fn memory_search(
        &self,
        tenant: TenantId,
        namespace: Option<&str>,
        query: &str,
        limit: u32,
    ) -> Result<Vec<MemoryEntry>> {
        let words = search_words(query);
        if words.is_empty() {
            return Ok(Vec::new());
        }
        let ns_filter = if namespace.is_some() {
            " AND m.namespace = ?"
        } else {
            ""
        };
        let (sql, expr) = match self.inner.dialect {
            // BM25 is lower for better matches; `rank` is the FTS5 table's BM25 by default.
            Dialect::Sqlite => (
                format!(
                    "SELECT m.namespace, m.key, m.value, m.updated_at FROM memory_fts \
                     JOIN memory m ON m.id = memory_fts.rowid \
                     WHERE memory_fts MATCH ? AND m.tenant_id = ?{ns_filter} \
                     ORDER BY memory_fts.rank, m.updated_at DESC, m.key LIMIT ?"
                ),
                words
                    .iter()
                    .map(|w| format!("\"{w}\"*"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            Dialect::Postgres => (
                format!(
                    "SELECT m.namespace, m.key, m.value, m.updated_at \
                     FROM memory m, to_tsquery('simple', ?) q \
                     WHERE m.search @@ q AND m.tenant_id = ?{ns_filter} \
                     ORDER BY ts_rank(m.search, q) DESC, m.updated_at DESC, m.key LIMIT ?"
                ),
                words
                    .iter()
                    .map(|w| format!("{w}:*"))
                    .collect::<Vec<_>>()
                    .join(" & "),
            ),
        };
        let sql = self.sql(&sql);
        let mut q = sqlx::query(&sql).bind(expr).bind(tenant.to_string());
        if let Some(ns) = namespace {
            q = q.bind(ns.to_owned());
        }
        let rows = q.bind(i64::from(limit)).fetch_all(&self.inner.pool).await?;
        rows.iter().map(memory_from_row).collect()
    }

    async fn memory_delete(&self, tenant: TenantId, namespace: &str, key: &str) -> Result<bool> {
        let mut conn = self.write_conn().await?;
        let done = sqlx::query(
            &self.sql("DELETE FROM memory WHERE tenant_id = ? AND namespace = ? AND key = ?"),
        )
        .bind(tenant.to_string())
        .bind(namespace.to_owned())
        .bind(key.to_owned())
        .execute(&mut *conn)
        .await?;
        self.committed(Commit::Tables);
        Ok(done.rows_affected() > 0)
    }

    async fn usage(&self, tenant: TenantId, from_day: &str, to_day: &str) -> Result<Vec<UsageRow>> {
        extras::check_day(from_day)?;
        extras::check_day(to_day)?;
        let rows = sqlx::query(&self.sql(
            "SELECT day, model, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, \
             reasoning_tokens, cost_usd, steps FROM usage \
             WHERE tenant_id = ? AND day >= ? AND day <= ? ORDER BY day, model",
        ))
        .bind(tenant.to_string())
        .bind(from_day.to_owned())
        .bind(to_day.to_owned())
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter().map(usage_from_row).collect()
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
        let rows = sqlx::query(&self.sql(
            "SELECT item_id, sealed FROM sealed_items \
             WHERE tenant_id = ? AND session_id = ? AND kind = ? ORDER BY item_id",
        ))
        .bind(tenant.to_string())
        .bind(session.to_string())
        .bind(kind.as_str())
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("item_id")?, r.try_get("sealed")?)))
            .collect()
    }

    async fn put_artifact(
        &self,
        tenant: TenantId,
        session: SessionId,
        name: &str,
        content_type: &str,
        data: &[u8],
    ) -> Result<String> {
        let id = uuid_v7_text();
        let mut conn = self.write_conn().await?;
        let mut tx = self.begin(&mut conn).await?;
        if !self.session_exists(&mut *tx, tenant, session).await? {
            return Err(not_found("session", session));
        }
        sqlx::query(&self.sql(
            "INSERT INTO artifacts (tenant_id, artifact_id, session_id, name, content_type, size, data, created_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        ))
        .bind(tenant.to_string())
        .bind(id.clone())
        .bind(session.to_string())
        .bind(name.to_owned())
        .bind(content_type.to_owned())
        .bind(i64::try_from(data.len()).unwrap_or(i64::MAX))
        .bind(data.to_vec())
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.committed(Commit::Tables);
        Ok(id)
    }

    async fn get_artifact(&self, tenant: TenantId, artifact_id: &str) -> Result<Artifact> {
        let row = sqlx::query(&self.sql(
            "SELECT artifact_id, session_id, name, content_type, data, created_at FROM artifacts \
             WHERE tenant_id = ? AND artifact_id = ?",
        ))
        .bind(tenant.to_string())
        .bind(artifact_id.to_owned())
        .fetch_optional(&self.inner.pool)
        .await?
        .ok_or_else(|| not_found("artifact", artifact_id))?;
        Ok(Artifact {
            artifact_id: row.try_get("artifact_id")?,
            session_id: parse_id("artifacts", &row.try_get::<String, _>("session_id")?)?,
            name: row.try_get("name")?,
            content_type: row.try_get("content_type")?,
            data: row.try_get("data")?,
            created_at: ms_to_time(row.try_get("created_at")?),
        })
    }

    async fn put_release(&self, tenant: TenantId, release: &Release) -> Result<()> {
        if !release.verify() {
            return Err(StoreError::InvalidInput(format!(
                "release {} does not match the hash of its definition",
                release.id
            )));
        }
        let definition = serde_json::to_string(&release.definition)
            .map_err(|e| StoreError::InvalidInput(e.to_string()))?;
        let mut conn = self.write_conn().await?;
        sqlx::query(&self.sql(
            "INSERT INTO releases (tenant_id, release_id, definition, created_at) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
        ))
        .bind(tenant.to_string())
        .bind(release.id.0.clone())
        .bind(definition)
        .bind(now_ms())
        .execute(&mut *conn)
        .await?;
        self.committed(Commit::Tables);
        Ok(())
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

fn usage_from_row(row: &AnyRow) -> Result<UsageRow> {
    let day: String = row.try_get("day")?;
    let model: String = row.try_get("model")?;
    let id = format!("{day}/{model}");
    let count =
        |column: &str| -> Result<u64> { non_negative("usage", &id, column, row.try_get(column)?) };
    Ok(UsageRow {
        usage: keel_core::Usage {
            input_tokens: count("input_tokens")?,
            output_tokens: count("output_tokens")?,
            cache_read_tokens: count("cache_read_tokens")?,
            cache_write_tokens: count("cache_write_tokens")?,
            reasoning_tokens: count("reasoning_tokens")?,
        },
        cost_usd: row.try_get("cost_usd")?,
        steps: count("steps")?,
        day,
        model,
    })
}

fn memory_from_row(row: &AnyRow) -> Result<MemoryEntry> {
    let key: String = row.try_get("key")?;
    let value: String = row.try_get("value")?;
    Ok(MemoryEntry {
        namespace: row.try_get("namespace")?,
        value: parse_json("memory", &key, &value)?,
        key,
        updated_at: ms_to_time(row.try_get("updated_at")?),
    })
}

fn uuid_v7_text() -> String {
    // Artifact ids share the time-ordered UUIDv7 scheme of the core ids.
    keel_core::SessionId::new().to_string()
}

/// Percent-encodes a file path for a `sqlite://` URL (everything but `[A-Za-z0-9/._-]`), so `?`,
/// `%`, `#` and spaces in paths name the file they say.
/// The first 16 bytes of every SQLite 3 database file (<https://www.sqlite.org/fileformat.html>).
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// Makes `path` ready to be a private store: its missing directories are created 0700, the
/// file itself 0600 (an existing one is narrowed to 0600; SQLite gives its `-wal` and `-shm`
/// files the database file's mode). A file that exists, is not empty and does not start with
/// the SQLite header is refused at once, instead of a pool time-out later.
fn prepare_sqlite_file(path: &Path) -> Result<()> {
    let invalid = |what: String| StoreError::InvalidInput(format!("{}: {what}", path.display()));
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b.create(dir).map_err(|e| {
            StoreError::InvalidInput(format!("cannot create {}: {e}", dir.display()))
        })?;
    }
    match std::fs::File::open(path) {
        Ok(mut f) => {
            use std::io::Read;
            let meta = f.metadata().map_err(|e| invalid(e.to_string()))?;
            if meta.is_dir() {
                return Err(invalid("is a directory, not a SQLite database file".into()));
            }
            let mut head = [0u8; 16];
            let mut got = 0;
            while got < head.len() {
                match f.read(&mut head[got..]) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(invalid(format!("cannot read it: {e}"))),
                }
            }
            if got > 0 && (got < head.len() || &head != SQLITE_MAGIC) {
                return Err(invalid(
                    "is not a SQLite database (its first bytes are not the SQLite header); \
                     name another store file"
                        .into(),
                ));
            }
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                if meta.permissions().mode() & 0o077 != 0 {
                    // Best effort: a file we may read but not chmod stays as it is.
                    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
                }
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut o = std::fs::OpenOptions::new();
            o.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
            match o.open(path) {
                Ok(_) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => Err(invalid(format!("cannot create it: {e}"))),
            }
        }
        Err(e) => Err(invalid(format!("cannot open it: {e}"))),
    }
}

fn percent_encode_path(path: &Path) -> String {
    let mut out = String::new();
    for b in path.to_string_lossy().bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_' | b'-') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
