//! Opening a store: the SQLite file (migrated, its readers warmed, its writer thread started)
//! or a PostgreSQL server (schema, migrations under an advisory lock, the pools, the listener).

use super::*;

/// The suffix of the channel of journal and intent waiters (payload: a session id).
pub(super) const EVENTS_CHANNEL: &str = "_keel_events";
/// The suffix of the channel of `wait_for_work` (payload: `<tenant>:<session>`).
pub(super) const WORK_CHANNEL: &str = "_keel_work";

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
}

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
