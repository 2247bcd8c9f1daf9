//! Fresh stores for tests on both backends: SQLite in a temporary directory, or a fresh schema
//! of the PostgreSQL database at `KEEL_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), dropped when the [`TestDb`] is.
//!
//! Panics (with the URL or path at fault) instead of returning errors: these are test fixtures,
//! and a test without its store cannot go on.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use keel_store::{SqlStore, Store};
use sqlx::{AnyConnection, Connection, Executor};

/// The two store backends every store-touching test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// SQLite, one file in a temporary directory.
    Sqlite,
    /// PostgreSQL, a fresh schema of [`pg_url`].
    Postgres,
}

/// The PostgreSQL database tests use: `KEEL_TEST_DATABASE_URL`, default
/// `postgres://postgres@127.0.0.1:5432/test`.
pub fn pg_url() -> String {
    std::env::var("KEEL_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A schema name no other test (or process) uses: `<prefix>_<pid>_<n>_<random>`.
pub fn fresh_schema_name(prefix: &str) -> String {
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        &uuid::Uuid::now_v7().simple().to_string()[20..]
    )
}

/// A fresh, migrated store and where it lives. The PostgreSQL schema is dropped on drop.
pub struct TestDb {
    /// The store (migrated to this build's schema).
    pub store: Arc<dyn Store>,
    /// Which backend.
    pub backend: Backend,
    where_: Location,
    _dir: Option<tempfile::TempDir>,
}

/// Where a test database lives.
enum Location {
    Sqlite(PathBuf),
    Postgres { url: String, schema: String },
}

impl TestDb {
    /// A fresh store on `backend`, migrated by [`SqlStore`]'s embedded migrations.
    ///
    /// # Panics
    /// When the store cannot be created or PostgreSQL is unreachable (naming the URL).
    pub async fn new(backend: Backend) -> Self {
        let db = Self::empty(backend);
        let store = db
            .open()
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", db.url()));
        db.into_db(store)
    }

    /// Where a fresh store would be, nothing created yet (tests that prepare the database's
    /// rows themselves, e.g. an older schema, then open it with [`Unopened::open`]).
    pub fn empty(backend: Backend) -> Unopened {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir()
                    .unwrap_or_else(|e| panic!("a temporary directory for SQLite: {e}"));
                let path = dir.path().join("keel.db");
                Unopened {
                    backend,
                    where_: Some(Location::Sqlite(path)),
                    dir: Some(dir),
                }
            }
            Backend::Postgres => Unopened {
                backend,
                where_: Some(Location::Postgres {
                    url: pg_url(),
                    schema: fresh_schema_name("keel_t"),
                }),
                dir: None,
            },
        }
    }

    /// The store's location as the `keel` command line takes it (`--store`): `sqlite://PATH`
    /// or `postgres://…?keel_schema=SCHEMA`.
    pub fn url(&self) -> String {
        self.where_.url()
    }

    /// The SQLite file, if this is SQLite.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match &self.where_ {
            Location::Sqlite(p) => Some(p),
            Location::Postgres { .. } => None,
        }
    }

    /// Another store handle on the same database, as another process would open it.
    ///
    /// # Panics
    /// When it cannot be opened.
    pub async fn reopen(&self) -> Arc<dyn Store> {
        self.where_
            .open()
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", self.url()))
    }

    /// Opens the database again as [`TestDb::reopen`] does, returning the store's error (e.g.
    /// `SchemaTooNew`) instead of panicking.
    ///
    /// # Errors
    /// What opening (and migrating) the store answers.
    pub async fn reopen_result(&self) -> keel_store::Result<Arc<dyn Store>> {
        self.where_.open().await
    }

    /// Runs `sql` (one or more statements) on the database behind the store's back (rows an
    /// older or newer build would have written), in the test's schema on PostgreSQL.
    ///
    /// # Panics
    /// When the connection or a statement fails.
    pub async fn raw(&self, sql: &str) {
        self.where_.raw(sql).await;
    }

    /// The first column of the first row of `sql` as an integer (`COUNT(*)`, `MAX(version)`;
    /// NULL reads as 0), read behind the store's back.
    ///
    /// # Panics
    /// When the connection or the query fails.
    pub async fn scalar(&self, sql: &str) -> i64 {
        self.where_.scalar(sql).await
    }
}

/// A [`TestDb`] before its store is opened ([`TestDb::empty`]).
pub struct Unopened {
    /// Which backend.
    pub backend: Backend,
    /// Always `Some` until [`Unopened::into_db`] moves it out.
    where_: Option<Location>,
    dir: Option<tempfile::TempDir>,
}

impl Unopened {
    fn location(&self) -> &Location {
        match &self.where_ {
            Some(l) => l,
            None => unreachable!("an Unopened has its location until into_db"),
        }
    }

    /// The location as [`TestDb::url`] gives it.
    pub fn url(&self) -> String {
        self.location().url()
    }

    /// The SQLite file, if this is SQLite (it may not exist yet).
    pub fn sqlite_path(&self) -> Option<&Path> {
        match self.location() {
            Location::Sqlite(p) => Some(p),
            Location::Postgres { .. } => None,
        }
    }

    /// The PostgreSQL schema, if this is PostgreSQL (it may not exist yet).
    pub fn pg_schema(&self) -> Option<&str> {
        match self.location() {
            Location::Sqlite(_) => None,
            Location::Postgres { schema, .. } => Some(schema),
        }
    }

    /// Runs `sql` as [`TestDb::raw`] does; on PostgreSQL the schema is created first if missing.
    ///
    /// # Panics
    /// When the connection or a statement fails.
    pub async fn raw(&self, sql: &str) {
        let at = self.location();
        if let Location::Postgres { schema, .. } = at {
            at.raw_outside(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
                .await;
        }
        at.raw(sql).await;
    }

    /// As [`TestDb::scalar`].
    ///
    /// # Panics
    /// When the connection or the query fails.
    pub async fn scalar(&self, sql: &str) -> i64 {
        self.location().scalar(sql).await
    }

    /// Opens (and migrates) the store: what a new build does with this database.
    ///
    /// # Errors
    /// The store's error (e.g. `SchemaTooNew` for a database of a newer build).
    pub async fn open(&self) -> keel_store::Result<Arc<dyn Store>> {
        self.location().open().await
    }

    /// The [`TestDb`], once [`Unopened::open`] succeeded with `store`.
    pub fn into_db(mut self, store: Arc<dyn Store>) -> TestDb {
        let where_ = self.where_.take();
        TestDb {
            store,
            backend: self.backend,
            where_: where_.unwrap_or_else(|| unreachable!("taken once")),
            _dir: self.dir.take(),
        }
    }
}

impl Location {
    fn url(&self) -> String {
        match self {
            Location::Sqlite(p) => format!("sqlite://{}", p.display()),
            Location::Postgres { url, schema } => {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}keel_schema={schema}")
            }
        }
    }

    async fn open(&self) -> keel_store::Result<Arc<dyn Store>> {
        Ok(match self {
            Location::Sqlite(p) => Arc::new(SqlStore::open_sqlite(p).await?),
            Location::Postgres { url, schema } => {
                Arc::new(SqlStore::connect_postgres(url, Some(schema)).await?)
            }
        })
    }

    async fn connect(&self) -> AnyConnection {
        sqlx::any::install_default_drivers();
        match self {
            Location::Sqlite(p) => {
                AnyConnection::connect(&format!("sqlite://{}?mode=rwc", p.display()))
                    .await
                    .unwrap_or_else(|e| panic!("SQLite {}: {e}", p.display()))
            }
            Location::Postgres { url, schema } => {
                let mut c = AnyConnection::connect(url).await.unwrap_or_else(|e| {
                    panic!("PostgreSQL at {url} (KEEL_TEST_DATABASE_URL): {e}")
                });
                c.execute(format!("SET search_path TO \"{schema}\"").as_str())
                    .await
                    .unwrap_or_else(|e| panic!("search_path {schema}: {e}"));
                c
            }
        }
    }

    async fn raw(&self, sql: &str) {
        let mut c = self.connect().await;
        c.execute(sql).await.unwrap_or_else(|e| {
            panic!("{e} in SQL: {}", sql.chars().take(300).collect::<String>())
        });
        let _ = c.close().await;
    }

    async fn scalar(&self, sql: &str) -> i64 {
        use sqlx::Row;
        let mut c = self.connect().await;
        let row = sqlx::query(sql)
            .fetch_one(&mut c)
            .await
            .unwrap_or_else(|e| panic!("{e} in SQL: {sql}"));
        let v: Option<i64> = row
            .try_get(0)
            .unwrap_or_else(|e| panic!("{e}: the first column of {sql} is not an integer"));
        let _ = c.close().await;
        v.unwrap_or(0)
    }

    /// `sql` on PostgreSQL without the schema's `search_path` (creating the schema).
    async fn raw_outside(&self, sql: &str) {
        if let Location::Postgres { url, .. } = self {
            sqlx::any::install_default_drivers();
            let mut c = AnyConnection::connect(url)
                .await
                .unwrap_or_else(|e| panic!("PostgreSQL at {url}: {e}"));
            c.execute(sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            let _ = c.close().await;
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        drop_schema(&self.where_);
    }
}

impl Drop for Unopened {
    fn drop(&mut self) {
        if let Some(at) = &self.where_ {
            drop_schema(at);
        }
    }
}

/// Drops a PostgreSQL test schema, on its own thread and runtime (a drop may run inside a
/// test's runtime).
fn drop_schema(where_: &Location) {
    let Location::Postgres { url, schema } = where_ else {
        return;
    };
    let (url, schema) = (url.clone(), schema.clone());
    let _ = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            sqlx::any::install_default_drivers();
            if let Ok(mut c) = AnyConnection::connect(&url).await {
                let _ = c
                    .execute(format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE").as_str())
                    .await;
                let _ = c.close().await;
            }
        });
    })
    .join();
}

/// Writes what a runtime's `create_session` writes, by hand, on `store`: the session row of
/// `session` (tenant `tenant`, release `release`), a lease of `owner` for `ttl`, and
/// `session.created` (with `config`) at version 1 under it. Returns the lease (still held).
///
/// # Panics
/// When the store refuses any of the three.
pub async fn leased_session(
    store: &dyn Store,
    tenant: keel_core::TenantId,
    session: keel_core::SessionId,
    release: &keel_core::ReleaseId,
    config: serde_json::Value,
    owner: &str,
    ttl: std::time::Duration,
) -> keel_store::Lease {
    use keel_core::{Correlation, Event, EventBody};
    store
        .create_session(
            tenant,
            keel_store::NewSession {
                session_id: session,
                release_id: release.clone(),
                parent_session_id: None,
                metadata: serde_json::json!({}),
            },
        )
        .await
        .unwrap_or_else(|e| panic!("creating session {session}: {e}"));
    let lease = store
        .acquire_lease(tenant, session, owner, ttl)
        .await
        .unwrap_or_else(|e| panic!("the lease of session {session}: {e}"));
    let created = Event::new(
        session,
        1,
        chrono::Utc::now(),
        Correlation::default(),
        EventBody::SessionCreated {
            tenant_id: tenant,
            release_id: release.clone(),
            config,
        },
    );
    store
        .append(tenant, session, 0, lease.epoch, &[created])
        .await
        .unwrap_or_else(|e| panic!("session.created of session {session}: {e}"));
    lease
}
