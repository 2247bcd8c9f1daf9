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
mod effects;
mod extras;
mod group_commit;
mod intent_poll;
mod leases;
mod listener;
mod memory;
mod migrations;
mod reservations;
mod rows;
mod scheduling;
mod sessions;
mod sqlite_file;
mod sqlite_writer;
mod usage;
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
    LeaseEpoch, OperationKey, PrincipalId, Release, ReleaseId, SessionId, SessionStatus, TenantId,
    TurnId,
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
    Lease, MemoryEntry, NewApiKey, NewSession, ReleaseRecord, Reservation, ReservationRow,
    SealedKind, SessionQuery, SessionRecord, StoredResponse, TenantRecord, TranscriptItem,
    UsageReservation, UsageRow,
};
use approvals::{APPROVAL_COLS, approval_from_row};
use batch::Bind;
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

/// The binds of [`ACQUIRE_LEASE`]: `owner` takes the lease for `ttl` from `now` (Unix ms).
fn acquire_binds(
    owner: &str,
    ttl: Duration,
    now: i64,
    tenant: TenantId,
    session: SessionId,
) -> Vec<Bind> {
    acquire_binds_of(owner, ttl, now, tenant, &[session])
}

/// The binds of [`ACQUIRE_LEASE`] (one session) or [`ACQUIRE_LEASES`] (the `IN` list's).
fn acquire_binds_of(
    owner: &str,
    ttl: Duration,
    now: i64,
    tenant: TenantId,
    sessions: &[SessionId],
) -> Vec<Bind> {
    let mut binds = vec![
        Bind::Text(owner.to_owned()),
        Bind::Int(expires_ms(now, ttl)),
        Bind::Int(now_ms()),
        Bind::Int(now),
        Bind::Text(tenant.to_string()),
    ];
    binds.extend(sessions.iter().map(|s| Bind::Text(s.to_string())));
    binds
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

/// The counters behind [`CommitCounts`].
#[derive(Default)]
struct Counters {
    journal: AtomicU64,
    journal_row_columns: AtomicU64,
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

/// How many of an SQLite pool's readers [`warm_readers`] opens ahead of the first reads.
const SQLITE_WARM_READERS: usize = 3;

/// Opens [`SQLITE_WARM_READERS`] of `pool`'s readers now, each on a task of its own, and has
/// each parse the schema (SQLite reads it at a connection's first statement: ~1.3 M
/// instructions for 66 objects): a new process's first reads then find them idle instead of
/// opening them on its critical path (a one-step `keel run` opened 3–4 as its reads came;
/// docs/BENCHMARKS.md, "Cold start and take-over"). Each sqlx SQLite connection works on a
/// thread of its own, so on a machine with a second core the opening overlaps the process's
/// set-up. A reader that fails to open here is opened, or reported, by the read that needs it.
fn warm_readers(pool: &AnyPool) {
    for _ in 0..SQLITE_WARM_READERS {
        let pool = pool.clone();
        tokio::spawn(async move {
            match pool.acquire().await {
                Ok(mut conn) => {
                    if let Err(e) = conn.execute("SELECT 1 FROM sessions LIMIT 0").await {
                        tracing::debug!("warming a reader: {e}");
                    }
                }
                Err(e) => tracing::debug!("warming a reader: {e}"),
            }
        });
    }
}

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
        warm_readers(&pool);
        let thread = SqliteWriter::start(path)?;
        let waiters = Arc::new(Waiters::default());
        let listener = Some(intent_poll::spawn(pool.clone(), waiters.clone()));
        Ok(SqlStore {
            inner: Arc::new(Inner {
                pool,
                dialect: Dialect::Sqlite,
                writer: Some(Arc::new(Mutex::new(writer))),
                group: GroupCommit::default(),
                thread: Some(thread),
                waiters,
                listener,
                renewals: None,
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
        let pool = postgres_pool(16, timeout, search_path).connect(url).await?;
        // Lease renewals get a connection of their own, opened at the first renewal: behind
        // the pool's queue (a worker starting hundreds of runs at once) they would wait past
        // the TTL, and the worker would lose the leases of runs it is still running.
        let renewals = postgres_pool(1, timeout, search_path).connect_lazy(url)?;
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
                thread: None,
                waiters,
                listener: Some(listener),
                renewals: Some(renewals),
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
        F: FnMut(Arc<waiters::Watched>) -> Fut,
        Fut: std::future::Future<Output = Result<bool>>,
    {
        let start = tokio::time::Instant::now();
        // A timeout too large to represent waits "forever" (about 34 years).
        let deadline = start
            .checked_add(timeout)
            .unwrap_or(start + Duration::from_secs(1 << 30));
        let reg = notifies.register(session);
        loop {
            let notified = reg.watched.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if ready(reg.watched.clone()).await? {
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
        let query = batch::bind_all(sqlx::query(&q), binds);
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

/// The one acquisition rule of [`Store::acquire_lease`] and [`Store::claim_sessions`]: takes
/// free or expired leases of a tenant's sessions, bumping each epoch (binds: owner, expires_at,
/// updated_at, now, tenant); the statements below add which sessions.
macro_rules! acquire_leases {
    () => {
        "UPDATE sessions SET lease_owner = ?, lease_epoch = lease_epoch + 1, \
         lease_expires_at = ?, updated_at = ? \
         WHERE (lease_owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= ?) \
         AND tenant_id = ?"
    };
}

/// Takes one session's lease ([`acquire_leases`]; binds: those and the session).
const ACQUIRE_LEASE: &str = concat!(
    acquire_leases!(),
    " AND session_id = ? RETURNING lease_epoch, lease_expires_at"
);

/// Takes several sessions' leases in one statement ([`acquire_leases`]): followed by
/// ` AND session_id IN (?, …) RETURNING session_id, lease_epoch, lease_expires_at`.
const ACQUIRE_LEASES: &str = acquire_leases!();

/// A PostgreSQL pool of at most `max` connections, each set to commit durably and to search
/// the store's schema (`search_path`: its `SET` statement) when opened.
fn postgres_pool(max: u32, timeout: Duration, search_path: Option<&'static str>) -> AnyPoolOptions {
    AnyPoolOptions::new()
        .max_connections(max)
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
}

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

/// The suffix of the channel of journal and intent waiters (payload: a session id).
const EVENTS_CHANNEL: &str = "_keel_events";
/// The suffix of the channel of `wait_for_work` (payload: `<tenant>:<session>`).
const WORK_CHANNEL: &str = "_keel_work";

/// The prefix of an intent notification's payload on the events channel: `intent:<session>`
/// wakes that session's `wait_for_intent` callers only (an append's payload, the bare session
/// id, wakes its `wait_for_version` callers only).
const INTENT_PREFIX: &str = "intent:";

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
        validate_batch(tenant, session, expected_version, events)?;
        let req = AppendRequest::new(
            tenant,
            session,
            expected_version,
            lease_epoch,
            events,
            extras,
        )?;
        let row_columns = !req.keeps_row_columns();
        let outcome = match (&self.inner.writer, &self.inner.thread) {
            (Some(writer), Some(thread)) => {
                self.inner
                    .group
                    .submit(
                        req,
                        writer.clone(),
                        &self.inner.pool,
                        thread,
                        self.inner.waiters.clone(),
                    )
                    .await
            }
            _ => {
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
                if row_columns {
                    let c = &self.inner.commits.journal_row_columns;
                    c.fetch_add(1, Ordering::Relaxed);
                }
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
            // The waiters of one session share their reads (`Watched::version`): 1,000 SSE
            // subscribers of a session polling every 50 ms made 20,000 queries a second.
            move |watched| async move {
                let v = watched
                    .version(tenant, self.inner.poll, || {
                        self.current_version(tenant, session)
                    })
                    .await?;
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
        // every waiter when it reconnects); on SQLite intents of this process wake their
        // waiters, and another process's wake them through the store's one intent poll
        // (`intent_poll`). So this waiter's own poll is only a long fallback on both.
        let poll = POSTGRES_INTENT_POLL;
        let waiters = &self.inner.waiters.intents;
        self.wait_until(waiters, poll, session, timeout, |_| async {
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
