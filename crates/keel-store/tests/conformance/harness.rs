//! Fresh, isolated stores for each test: SQLite in a temp dir, PostgreSQL in a fresh schema of
//! `KEEL_TEST_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`), dropped afterwards.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use chrono::Utc;
use keel_core::*;
use keel_store::{NewSession, SqlStore, Store};
use serde_json::json;
use sqlx::{AnyConnection, Connection, Executor};

pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

pub fn pg_url() -> String {
    std::env::var("KEEL_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_PG_URL.to_owned())
}

#[derive(Clone, Debug)]
pub enum Location {
    Sqlite(PathBuf),
    Postgres { url: String, schema: String },
}

impl Location {
    /// The string `keel_store::open` takes.
    pub fn open_string(&self) -> String {
        match self {
            Location::Sqlite(p) => format!("sqlite://{}", p.display()),
            Location::Postgres { url, schema } => format!("{url}?keel_schema={schema}"),
        }
    }
}

pub struct Harness {
    pub store: Arc<dyn Store>,
    pub location: Location,
    _dir: Option<tempfile::TempDir>,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

pub async fn sqlite() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    let store = SqlStore::open_sqlite(&path).await.unwrap();
    Harness {
        store: Arc::new(store),
        location: Location::Sqlite(path),
        _dir: Some(dir),
    }
}

pub async fn postgres() -> Harness {
    let schema = format!(
        "keel_test_{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        uuid::Uuid::now_v7().simple().to_string()[20..].to_owned()
    );
    let url = pg_url();
    let store = SqlStore::connect_postgres(&url, Some(&schema))
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url} (set KEEL_TEST_DATABASE_URL): {e}"));
    Harness {
        store: Arc::new(store),
        location: Location::Postgres { url, schema },
        _dir: None,
    }
}

impl Harness {
    /// Opens a second, independent store on the same database (as another process would).
    pub async fn reopen(&self) -> Result<Arc<dyn Store>, keel_store::StoreError> {
        keel_store::open(&self.location.open_string()).await
    }

    /// Runs raw SQL on the database behind the store's back (corruption, foreign schema rows).
    pub async fn raw(&self, sql: &str) {
        sqlx::any::install_default_drivers();
        let mut conn = match &self.location {
            Location::Sqlite(p) => AnyConnection::connect(&format!("sqlite://{}", p.display()))
                .await
                .unwrap(),
            Location::Postgres { url, schema } => {
                let mut c = AnyConnection::connect(url).await.unwrap();
                c.execute(format!("SET search_path TO \"{schema}\"").as_str())
                    .await
                    .unwrap();
                c
            }
        };
        conn.execute(sql).await.unwrap();
        conn.close().await.unwrap();
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Location::Postgres { url, schema } = &self.location {
            let (url, schema) = (url.clone(), schema.clone());
            // Drop the schema from a plain thread: Drop cannot await, and the test's runtime may be
            // shutting down.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
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
    }
}

/// A session created, leased and initialized with `session.created`; returns its lease.
pub struct Fixture {
    pub session: SessionId,
    pub lease: keel_store::Lease,
}

pub async fn session(store: &Arc<dyn Store>, tenant: TenantId) -> Fixture {
    let session = SessionId::new();
    store
        .create_session(
            tenant,
            NewSession {
                session_id: session,
                release_id: ReleaseId::from("sha256:test"),
                parent_session_id: None,
                metadata: json!({"workspace": "/tmp/w"}),
            },
        )
        .await
        .unwrap();
    let lease = store
        .acquire_lease(
            tenant,
            session,
            "worker-a",
            std::time::Duration::from_secs(30),
        )
        .await
        .unwrap();
    let created = Event::new(
        session,
        1,
        Utc::now(),
        Correlation::default(),
        EventBody::SessionCreated {
            tenant_id: tenant,
            release_id: ReleaseId::from("sha256:test"),
            config: json!({}),
        },
    );
    store
        .append(tenant, session, 0, lease.epoch, &[created])
        .await
        .unwrap();
    Fixture { session, lease }
}

/// `n` turn.queued events following `version`.
pub fn events(session: SessionId, version: u64, n: usize) -> Vec<Event> {
    (0..n)
        .map(|i| {
            Event::new(
                session,
                version + 1 + i as u64,
                Utc::now(),
                Correlation::turn(TurnId::new()),
                EventBody::TurnQueued {
                    input: format!("input {}", version + 1 + i as u64),
                    compiled: None,
                },
            )
        })
        .collect()
}
