//! **schema_migration.** Invariant: a store written by the previous release — its schema (store
//! migrations 1–9) and two sessions it left in flight, one waiting on a human's approval and
//! one killed mid-turn with its worker's lease still on the row — is opened by this build,
//! which applies exactly the migrations it lacks (to 10), keeps every event, and resumes both
//! sessions to completion (the approved write happens once; the killed turn's step is sampled
//! again and the turn completes); and a store a newer release migrated past this build's last
//! migration is refused, nothing changed: by the library with `SchemaTooNew` ("store schema
//! version N is newer than this build supports (M); upgrade keel") and by the `keel` command
//! with a failing exit naming the store ("… has schema version N, newer than this keel supports
//! (M); upgrade keel or use another --store").
//!
//! Guarded mechanism: the migration version check at open (`keel_store`'s `migrate`:
//! `SchemaTooNew` for a version above the build's last, checksums of the applied ones, the
//! missing ones applied in order) and recovery of a dead worker's session (an expired lease is
//! taken over).
//!
//! The fixtures (`fixtures/previous_release/`: a SQLite dump, a PostgreSQL dump, the ids of the
//! sessions, the scripts they run) were written by `keel` built at the previous release's
//! commit; their README says how, and `make.sh` rebuilds them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use keel_core::{ApprovalDecision, SessionId, SessionStatus, TenantId};
use keel_model::ScriptedModel;
use keel_runtime::RuntimeOptions;
use keel_store::StoreError;
use keel_testkit::db::{Backend, TestDb, Unopened};
use serde_json::Value;

use super::rig::{Dispatches, registry, runtime};

per_backend!(
    a_previous_release_store_migrates_and_its_in_flight_sessions_finish,
    a_store_from_a_newer_release_is_refused_with_a_clear_message,
);

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/release_validation/fixtures/previous_release")
}

/// The previous release's last store migration.
const PREVIOUS: i64 = 9;

/// A fresh database holding the previous release's dump for `b`, not opened by this build
/// yet; and the fixture's ids.
async fn previous_release_store(b: Backend) -> (Unopened, Value) {
    let u = TestDb::empty(b);
    let (dump, ids) = match b {
        Backend::Sqlite => ("sqlite.sql", "sqlite.json"),
        Backend::Postgres => ("postgres.sql", "postgres.json"),
    };
    let sql = unexpired(&std::fs::read_to_string(fixtures().join(dump)).unwrap());
    let sql = match u.pg_schema() {
        Some(schema) => sql.replace("__KEEL_SCHEMA__", schema),
        None => sql,
    };
    u.raw(&sql).await;
    let ids: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join(ids)).unwrap()).unwrap();
    (u, ids)
}

/// Where the fixture's pending approval is made to expire: far past any run of this test.
const FAR_EXPIRY: &str = "2099-01-01T00:00:00.000Z";

/// `sql` (a dump) with its pending approval's expiry moved to [`FAR_EXPIRY`]. The previous
/// release recorded the approval with the default lifetime (a day), so as recorded it expired
/// a day after the fixture was made, and deciding it would fail on the clock, not on the
/// upgrade this test is about. The expiry is in the `approval.requested` event (an RFC 3339
/// text, exactly once) and, as Unix ms, in the rows that carry it (the approval's `expires_at`
/// and the session's timer): every one is moved.
fn unexpired(sql: &str) -> String {
    const KEY: &str = "\"expires_at\":\"";
    assert_eq!(
        sql.matches(KEY).count(),
        1,
        "one approval.requested in the dump"
    );
    let at = sql.find(KEY).unwrap() + KEY.len();
    let recorded = &sql[at..at + sql[at..].find('"').unwrap()];
    let ms = |t: &str| {
        chrono::DateTime::parse_from_rfc3339(t)
            .unwrap()
            .timestamp_millis()
            .to_string()
    };
    let recorded_ms = ms(recorded);
    assert!(sql.contains(&recorded_ms), "the approval row's expires_at");
    sql.replace(recorded, FAR_EXPIRY)
        .replace(&recorded_ms, &ms(FAR_EXPIRY))
}

fn id(ids: &Value, key: &str) -> String {
    ids[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} in {ids}"))
        .to_owned()
}

async fn a_previous_release_store_migrates_and_its_in_flight_sessions_finish(b: Backend) {
    let (u, ids) = previous_release_store(b).await;
    assert_eq!(
        u.scalar("SELECT MAX(version) FROM keel_migrations").await,
        PREVIOUS
    );
    let events_before = u.scalar("SELECT COUNT(*) FROM events").await;
    assert!(
        events_before > 10,
        "the fixture holds the sessions' journals"
    );

    let store = u
        .open()
        .await
        .unwrap_or_else(|e| panic!("this build opens the previous release's store: {e}"));
    let latest = u.scalar("SELECT MAX(version) FROM keel_migrations").await;
    assert!(latest > PREVIOUS);
    assert_eq!(
        u.scalar("SELECT COUNT(*) FROM keel_migrations").await,
        latest,
        "every migration recorded once, none skipped"
    );
    assert_eq!(
        u.scalar("SELECT COUNT(*) FROM events").await,
        events_before,
        "no event lost"
    );
    let db = u.into_db(store);

    let tenant: TenantId = id(&ids, "tenant").parse().unwrap();
    let waiting: SessionId = id(&ids, "waiting_on_approval").parse().unwrap();
    let mid: SessionId = id(&ids, "mid_turn").parse().unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("README.md"), "hello from the readme\n").unwrap();
    let log = Dispatches::default();

    // 1. The session waiting on approval: decided, resumed, the write happens once.
    let rt = runtime(
        db.store.clone(),
        Arc::new(ScriptedModel::from_file(fixtures().join("approval.jsonl")).unwrap()),
        registry(&log),
        RuntimeOptions::default(),
    );
    let view = rt.view(tenant, waiting).await.unwrap();
    assert_eq!(view.state.status, SessionStatus::RequiresAction);
    rt.update_config(tenant, waiting, |c| c.workspace = ws.path().to_path_buf())
        .await
        .unwrap();
    let approval = view.state.approvals.values().next().cloned().unwrap();
    rt.decide_approval(
        tenant,
        approval.id,
        ApprovalDecision::AllowOnce,
        &approval.args_hash,
    )
    .await
    .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), rt.run(tenant, waiting))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status, SessionStatus::Idle, "{out:?}");
    assert_eq!(
        (
            out.turns.len(),
            out.turns[0].terminal_reason.as_str(),
            out.turns[0].final_text.as_str()
        ),
        (1, "completed", "Wrote approved.txt.")
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("approved.txt")).unwrap(),
        "written after the upgrade\n"
    );

    // 2. The turn whose worker was killed: its expired lease is taken over, its second step
    //    sampled again (the script's second line), and it completes.
    let rt = runtime(
        db.store.clone(),
        Arc::new(ScriptedModel::from_file(fixtures().join("mid_turn.jsonl")).unwrap()),
        registry(&log),
        RuntimeOptions::default(),
    );
    let view = rt.view(tenant, mid).await.unwrap();
    assert!(
        view.state.active_turn.is_some(),
        "the fixture's turn is in flight: {:?}",
        view.state.status
    );
    rt.update_config(tenant, mid, |c| c.workspace = ws.path().to_path_buf())
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), rt.run(tenant, mid))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status, SessionStatus::Idle, "{out:?}");
    assert_eq!(
        (
            out.turns.len(),
            out.turns[0].terminal_reason.as_str(),
            out.turns[0].final_text.as_str()
        ),
        (1, "completed", "Finished after the upgrade.")
    );
    for s in [waiting, mid] {
        let events = super::rig::journal(&db, tenant, s).await;
        let problems = super::rig::not_ended_exactly_once(&events);
        assert!(problems.is_empty(), "{s}: {problems:?}");
    }
}

/// A store this build migrated, then marked by a newer release's migration (the version after
/// this build's last): the library refuses to open it with `SchemaTooNew` and the message, the
/// `keel` command refuses it with the same message and a failing exit, and the store's
/// migrations are left as they were.
async fn a_store_from_a_newer_release_is_refused_with_a_clear_message(b: Backend) {
    let db = TestDb::new(b).await;
    let latest = db.scalar("SELECT MAX(version) FROM keel_migrations").await;
    let newer = latest + 1;
    db.raw(&format!(
        "INSERT INTO keel_migrations (version, name, checksum, applied_at) VALUES ({newer}, 'from_a_newer_release', 'x', 0)"
    ))
    .await;
    let expected = format!(
        "store schema version {newer} is newer than this build supports ({latest}); upgrade keel"
    );
    let err = match db.reopen_result().await {
        Ok(_) => panic!("a store of a newer release was opened"),
        Err(e) => e,
    };
    assert!(
        matches!(err, StoreError::SchemaTooNew { found, supported } if found == newer && supported == latest),
        "{err:?}"
    );
    assert_eq!(err.to_string(), expected);

    let env = crate::common::Env::new();
    let out = env.run(&["sessions", "list", "--store", &db.url()]);
    let stderr = crate::common::stderr(&out);
    assert!(!out.status.success(), "keel opened it: {stderr}");
    let cli = format!(
        "has schema version {newer}, newer than this keel supports ({latest}); upgrade keel or use another --store"
    );
    assert!(stderr.contains(&cli), "{stderr}");
    assert_eq!(
        db.scalar("SELECT MAX(version) FROM keel_migrations").await,
        newer
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM keel_migrations").await,
        newer
    );
}
