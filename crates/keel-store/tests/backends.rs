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
