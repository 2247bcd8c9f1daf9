//! Backend-specific behaviour that the shared conformance suite cannot express.

use keel_core::TenantId;
use keel_store::{SessionQuery, SqlStore, Store, StoreError};
use sqlx::{Connection, Executor};

use crate::conformance::harness::pg_url;

/// SQLite file paths with URL-significant characters name the file they say.
#[tokio::test]
async fn sqlite_paths_with_url_characters_open_the_named_file() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["a?b.db", "a%20b.db", "a b#c.db"] {
        let path = dir.path().join(name);
        let store = SqlStore::open_sqlite(&path).await.unwrap();
        store
            .list_sessions(TenantId::new(), &SessionQuery::default())
            .await
            .unwrap();
        drop(store);
        assert!(path.exists(), "{name} was not created under its own name");
    }
    assert!(
        !dir.path().join("a b.db").exists(),
        "a%20b.db must not open 'a b.db'"
    );
}

/// A SQLite database from a newer build is refused with a typed error that says what to do.
#[tokio::test]
async fn sqlite_store_from_a_newer_build_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    drop(SqlStore::open_sqlite(&path).await.unwrap());
    sqlx::any::install_default_drivers();
    let mut c = sqlx::AnyConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    c.execute("INSERT INTO keel_migrations (version, name, checksum, applied_at) VALUES (50, 'x', 'y', 0)")
        .await
        .unwrap();
    c.close().await.unwrap();
    let err = SqlStore::open_sqlite(&path).await.err().unwrap();
    assert!(
        matches!(err, StoreError::SchemaTooNew { found: 50, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("upgrade keel"), "{err}");
}

/// Several processes opening one fresh PostgreSQL schema at once all succeed (setup is
/// serialized by an advisory lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_concurrent_first_opens_all_succeed() {
    let schema = format!("keel_test_open_{}", uuid::Uuid::now_v7().simple());
    let url = pg_url();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (url, schema) = (url.clone(), schema.clone());
        tasks.push(tokio::spawn(async move {
            SqlStore::connect_postgres(&url, Some(&schema))
                .await
                .map(|_| ())
        }));
    }
    let mut errors = Vec::new();
    for t in tasks {
        if let Err(e) = t.await.unwrap() {
            errors.push(e.to_string());
        }
    }
    sqlx::any::install_default_drivers();
    let mut c = sqlx::AnyConnection::connect(&url).await.unwrap();
    c.execute(format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE").as_str())
        .await
        .unwrap();
    assert!(errors.is_empty(), "{errors:?}");
}

/// A database at migration 4 (sealed arguments in `sealed_arguments`) keeps its sealed rows
/// through migration 6, which moves them into `sealed_items` as kind `arguments`: a call
/// waiting on an approval across the upgrade still runs with its exact arguments.
#[tokio::test]
async fn sealed_arguments_survive_the_move_to_sealed_items() {
    use keel_store::SealedKind;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    sqlx::any::install_default_drivers();
    let mut c = sqlx::AnyConnection::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap();
    c.execute(
        "CREATE TABLE keel_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL, \
         checksum TEXT NOT NULL, applied_at BIGINT NOT NULL)",
    )
    .await
    .unwrap();
    let old = [
        (
            1,
            "journal_and_owned_tables",
            include_str!("../migrations/0001_journal_and_owned_tables.sql"),
        ),
        (2, "intents", include_str!("../migrations/0002_intents.sql")),
        (3, "usage", include_str!("../migrations/0003_usage.sql")),
        (
            4,
            "sealed_arguments",
            include_str!("../migrations/0004_sealed_arguments.sql"),
        ),
    ];
    for (version, name, sql) in old {
        c.execute(sql.replace("{blob}", "BLOB").as_str())
            .await
            .unwrap();
        let sum = keel_core::canonical::content_hash(&serde_json::Value::String(sql.to_owned()));
        c.execute(
            format!("INSERT INTO keel_migrations VALUES ({version}, '{name}', '{sum}', 0)")
                .as_str(),
        )
        .await
        .unwrap();
    }
    let (t, s) = (TenantId::new(), keel_core::SessionId::new());
    c.execute(
        format!("INSERT INTO sealed_arguments VALUES ('{t}', '{s}', 'call_1', x'00ff01', 5)")
            .as_str(),
    )
    .await
    .unwrap();
    c.close().await.unwrap();
    let store = SqlStore::open_sqlite(&path).await.unwrap();
    assert_eq!(
        store
            .sealed_rows(t, s, SealedKind::Arguments)
            .await
            .unwrap(),
        vec![("call_1".to_owned(), vec![0, 255, 1])]
    );
    assert!(
        store
            .sealed_rows(t, s, SealedKind::Reasoning)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A PostgreSQL address that accepts connections and never answers (a hung server, a proxy
/// whose backend is gone) fails the open after the URL's `connect_timeout` (seconds, libpq's
/// parameter; 30 s by default) with an error that says so — it does not wait forever.
#[tokio::test]
async fn a_postgres_server_that_never_answers_fails_the_open_after_connect_timeout() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    // Accepted connections are kept open and never written to.
    let held = std::thread::spawn(move || {
        silent
            .incoming()
            .take(4)
            .filter_map(Result::ok)
            .collect::<Vec<_>>()
    });
    let url = format!("postgres://postgres@127.0.0.1:{port}/test?connect_timeout=1");
    let opened =
        tokio::time::timeout(std::time::Duration::from_secs(20), keel_store::open(&url)).await;
    let Ok(Err(e)) = opened else {
        panic!(
            "the open did not fail within 20 s: {:?}",
            opened.map(|r| r.is_ok())
        );
    };
    let text = e.to_string();
    assert!(text.contains("1 s"), "{text}");
    drop(held);
    let bad = keel_store::open("postgres://postgres@127.0.0.1:1/test?connect_timeout=soon").await;
    assert!(
        matches!(bad, Err(StoreError::InvalidInput(ref m)) if m.contains("connect_timeout")),
        "{:?}",
        bad.err()
    );
}

/// The schema of migrations 1 to 9 (before full-text memory search), with their checksums as
/// a build of that time recorded them.
const BEFORE_MEMORY_SEARCH: [(i64, &str, &str); 9] = [
    (
        1,
        "journal_and_owned_tables",
        include_str!("../migrations/0001_journal_and_owned_tables.sql"),
    ),
    (2, "intents", include_str!("../migrations/0002_intents.sql")),
    (3, "usage", include_str!("../migrations/0003_usage.sql")),
    (
        4,
        "sealed_arguments",
        include_str!("../migrations/0004_sealed_arguments.sql"),
    ),
    (
        5,
        "usage_reservations",
        include_str!("../migrations/0005_usage_reservations.sql"),
    ),
    (
        6,
        "sealed_items",
        include_str!("../migrations/0006_sealed_items.sql"),
    ),
    (
        7,
        "api_access",
        include_str!("../migrations/0007_api_access.sql"),
    ),
    (
        8,
        "workspace_claims",
        include_str!("../migrations/0008_workspace_claims.sql"),
    ),
    (
        9,
        "scheduling",
        include_str!("../migrations/0009_scheduling.sql"),
    ),
];

/// Builds a database at migration 9 on `c` holding two memory entries of `tenant`.
async fn database_at_migration_9(c: &mut sqlx::AnyConnection, blob: &str, tenant: TenantId) {
    c.execute(
        "CREATE TABLE keel_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL, checksum TEXT NOT NULL, applied_at BIGINT NOT NULL)",
    )
    .await
    .unwrap();
    for (version, name, sql) in BEFORE_MEMORY_SEARCH {
        c.execute(sql.replace("{blob}", blob).as_str())
            .await
            .unwrap();
        let sum = keel_core::canonical::content_hash(&serde_json::Value::String(sql.to_owned()));
        c.execute(
            format!("INSERT INTO keel_migrations VALUES ({version}, '{name}', '{sum}', 0)")
                .as_str(),
        )
        .await
        .unwrap();
    }
    c.execute(
        format!(
            "INSERT INTO memory VALUES ('{tenant}', 'agent:keel', 'build', '\"run cargo nextest\"', 1), \
             ('{tenant}', 'agent:keel', 'style', '{{\"indent\":4}}', 2)"
        )
        .as_str(),
    )
    .await
    .unwrap();
}

/// What migration 10 must keep: every memory entry written before it, now found by search.
async fn memory_written_before_migration_10_is_kept_and_searchable(store: &dyn Store, t: TenantId) {
    let e = store
        .memory_get(t, "agent:keel", "build")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(e.value, serde_json::json!("run cargo nextest"));
    let found = store.memory_search(t, None, "nextest", 10).await.unwrap();
    assert_eq!(found.len(), 1);
    let found = store
        .memory_search(t, Some("agent:keel"), "indent", 10)
        .await
        .unwrap();
    assert_eq!(found[0].key, "style");
    // And later writes are indexed as before.
    store
        .memory_put(t, "agent:keel", "build", &serde_json::json!("make"))
        .await
        .unwrap();
    assert!(
        store
            .memory_search(t, None, "nextest", 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A SQLite database of a build before full-text memory search keeps its memory through
/// migration 10 (the table is rebuilt with an id and indexed).
#[tokio::test]
async fn sqlite_memory_survives_migration_10_and_is_indexed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    sqlx::any::install_default_drivers();
    let mut c = sqlx::AnyConnection::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap();
    let t = TenantId::new();
    database_at_migration_9(&mut c, "BLOB", t).await;
    c.close().await.unwrap();
    let store = SqlStore::open_sqlite(&path).await.unwrap();
    memory_written_before_migration_10_is_kept_and_searchable(&store, t).await;
}

/// The same on PostgreSQL (a generated tsvector column is added and indexed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_memory_survives_migration_10_and_is_indexed() {
    let schema = format!("keel_test_m10_{}", uuid::Uuid::now_v7().simple());
    let url = pg_url();
    sqlx::any::install_default_drivers();
    let mut c = sqlx::AnyConnection::connect(&url).await.unwrap();
    c.execute(format!("CREATE SCHEMA \"{schema}\"").as_str())
        .await
        .unwrap();
    c.execute(format!("SET search_path TO \"{schema}\"").as_str())
        .await
        .unwrap();
    let t = TenantId::new();
    database_at_migration_9(&mut c, "BYTEA", t).await;
    let store = SqlStore::connect_postgres(&url, Some(&schema))
        .await
        .unwrap();
    memory_written_before_migration_10_is_kept_and_searchable(&store, t).await;
    drop(store);
    c.execute(format!("DROP SCHEMA \"{schema}\" CASCADE").as_str())
        .await
        .unwrap();
    c.close().await.unwrap();
}
