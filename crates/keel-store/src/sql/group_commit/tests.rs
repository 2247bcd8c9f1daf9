#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use chrono::Utc;
use keel_core::{ApprovalRecord, Correlation, EventBody, ToolCallId, TurnId, Usage};

use super::*;
use crate::store::Store;
use crate::types::{NewSession, UsageDelta};
use crate::{SqlStore, StoreError};

fn queued(session: SessionId, after: u64, n: u64) -> Vec<Event> {
    (1..=n)
        .map(|i| {
            Event::new(
                session,
                after + i,
                Utc::now(),
                Correlation::default(),
                EventBody::TurnQueued {
                    input: format!("{}", after + i),
                    compiled: None,
                },
            )
        })
        .collect()
}

fn approval(session: SessionId) -> ApprovalRecord {
    ApprovalRecord::request(
        session,
        TurnId::new(),
        ToolCallId::from("c"),
        "shell",
        serde_json::json!({}),
        Utc::now(),
        chrono::Duration::hours(1),
    )
}

fn usage(steps: u32) -> UsageDelta {
    UsageDelta {
        day: "2026-05-01".into(),
        model: "m".into(),
        usage: Usage {
            input_tokens: u64::from(steps),
            ..Usage::default()
        },
        cost_usd: 0.5,
        steps,
    }
}

/// A store with `n` leased sessions at version 0.
async fn setup(
    dir: &tempfile::TempDir,
    n: usize,
) -> (SqlStore, TenantId, Vec<(SessionId, LeaseEpoch)>) {
    let store = SqlStore::open_sqlite(&dir.path().join("k.db"))
        .await
        .unwrap();
    let t = TenantId::new();
    let mut sessions = Vec::new();
    for _ in 0..n {
        let s = SessionId::new();
        store
            .create_session(
                t,
                NewSession {
                    session_id: s,
                    release_id: keel_core::ReleaseId::from("r"),
                    parent_session_id: None,
                    metadata: serde_json::json!({}),
                },
            )
            .await
            .unwrap();
        let lease = store
            .acquire_lease(t, s, "w", Duration::from_secs(30))
            .await
            .unwrap();
        sessions.push((s, lease.epoch));
    }
    (store, t, sessions)
}

fn pending(requests: Vec<Result<AppendRequest>>) -> Vec<Pending> {
    requests
        .into_iter()
        .map(|req| Pending {
            req: req.unwrap(),
            reply: oneshot::channel().0,
        })
        .collect()
}

/// Commits `batch` on the store's writer thread, holding the writer lock, as a group commit
/// leader does.
async fn run(store: &SqlStore, batch: Vec<Pending>) -> Vec<Result<Appended, CasFailure>> {
    let writer = store.inner.writer.clone().unwrap();
    let _lock = writer.lock().await;
    let thread = store.inner.thread.as_ref().unwrap();
    thread
        .call(move |conn| super::super::sqlite_writer::run_batch(conn, &batch))
        .await
        .unwrap()
        .unwrap()
}

fn summary(results: &[Result<Appended, CasFailure>]) -> Vec<String> {
    results
        .iter()
        .map(|r| match r {
            Ok(a) => format!("ok {}", a.version),
            Err(CasFailure::Stale { actual }) => format!("stale {actual}"),
            Err(CasFailure::Store(StoreError::Conflict(_))) => "conflict".into(),
            Err(_) => "other".into(),
        })
        .collect()
}

/// One hand-built batch mixing both paths, several rounds of one session, a refused
/// compare-and-set and failing extras: every request gets its own outcome and only the
/// successful ones are written, in one transaction.
#[tokio::test]
async fn a_mixed_batch_commits_exactly_the_requests_that_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, t, sessions) = setup(&dir, 2).await;
    let [(s1, e1), (s2, e2)] = [sessions[0], sessions[1]];
    let taken = approval(s2);
    store.create_approval(t, &taken).await.unwrap();

    let with = |usage_steps: u32, approvals: Vec<ApprovalRecord>| AppendExtras {
        approvals,
        usage: vec![usage(usage_steps)],
        ..AppendExtras::default()
    };
    let requests = vec![
        // Round 1: s1 on the fast path; s2 with extras that conflict (rolled back alone).
        AppendRequest::new(t, s1, 0, e1, &queued(s1, 0, 1), &AppendExtras::default()),
        AppendRequest::new(
            t,
            s2,
            0,
            e2,
            &queued(s2, 0, 1),
            &with(100, vec![approval(s2), taken.clone()]),
        ),
        // Round 2: s1 with extras after the fast-path append; s2 on the fast path at 0
        // (the failed request left the version where it was).
        AppendRequest::new(
            t,
            s1,
            1,
            e1,
            &queued(s1, 1, 2),
            &with(1, vec![approval(s1)]),
        ),
        AppendRequest::new(t, s2, 0, e2, &queued(s2, 0, 1), &AppendExtras::default()),
        // Round 3: s1 with extras, stale (rolled back alone); round 4: s1 with extras again.
        AppendRequest::new(t, s1, 1, e1, &queued(s1, 1, 1), &with(1000, vec![])),
        AppendRequest::new(t, s1, 3, e1, &queued(s1, 3, 1), &with(10, vec![])),
    ];
    let batch = pending(requests);
    let results = run(&store, batch).await;
    assert_eq!(
        summary(&results),
        ["ok 1", "conflict", "ok 3", "ok 1", "stale 3", "ok 4"]
    );
    assert_eq!(store.read(t, s1, 0, None).await.unwrap().len(), 4);
    assert_eq!(store.read(t, s2, 0, None).await.unwrap().len(), 1);
    assert_eq!(store.get_session(t, s1).await.unwrap().version, 4);
    assert_eq!(store.list_approvals(t, s1, None).await.unwrap().len(), 1);
    assert_eq!(
        store.list_approvals(t, s2, None).await.unwrap(),
        vec![store.get_approval(t, taken.approval_id).await.unwrap()],
        "the conflicting request's other approval was rolled back"
    );
    let rows = store.usage(t, "2026-05-01", "2026-05-01").await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].steps, rows[0].cost_usd), (11, 1.0));
}

/// The scheduler's columns of each session in `sessions`: (runnable, runnable_since,
/// queued_turns, priority, schema_version).
async fn marks(
    store: &SqlStore,
    sessions: &[(SessionId, LeaseEpoch)],
) -> Vec<(i64, Option<i64>, i64, i64, i64)> {
    let mut out = Vec::new();
    for (s, _) in sessions {
        let r = sqlx::query(
            "SELECT runnable, runnable_since, queued_turns, priority, schema_version \
             FROM sessions WHERE session_id = ?",
        )
        .bind(s.to_string())
        .fetch_one(&store.inner.pool)
        .await
        .unwrap();
        out.push((
            r.try_get("runnable").unwrap(),
            r.try_get("runnable_since").unwrap(),
            r.try_get("queued_turns").unwrap(),
            r.try_get("priority").unwrap(),
            r.try_get("schema_version").unwrap(),
        ));
    }
    out
}

fn marked(runnable: bool, queued_turns: u32, priority: Option<i32>) -> AppendExtras {
    AppendExtras {
        work: Some(crate::WorkMark {
            runnable,
            queued_turns,
        }),
        priority,
        ..AppendExtras::default()
    }
}

/// One batch of several sessions' appends, set-wise and in savepoints, over two rounds:
/// each session gets its own work mark and priority, `runnable_since` is set when the
/// session becomes runnable and kept while it stays, the schema version only rises, and
/// exactly the appends that made a session runnable report it (they wake the workers).
#[tokio::test]
async fn a_batch_writes_each_sessions_work_mark() {
    let dir = tempfile::tempdir().unwrap();
    let (store, t, sessions) = setup(&dir, 4).await;
    let [(s1, e1), (s2, e2), (s3, e3), (s4, e4)] =
        [sessions[0], sessions[1], sessions[2], sessions[3]];
    // s3 was written by an older schema, s4 by a newer one (as a newer worker would).
    for (s, v) in [(s3, 1), (s4, 3)] {
        sqlx::query("UPDATE sessions SET schema_version = ? WHERE session_id = ?")
            .bind(v)
            .bind(s.to_string())
            .execute(&store.inner.pool)
            .await
            .unwrap();
    }
    let with_usage = AppendExtras {
        usage: vec![usage(1)],
        ..marked(true, 1, None)
    };
    let batch = pending(vec![
        // Round 1: s1, s2, s3 set-wise; s4 in a savepoint (extras).
        AppendRequest::new(t, s1, 0, e1, &queued(s1, 0, 1), &marked(true, 2, Some(3))),
        AppendRequest::new(t, s2, 0, e2, &queued(s2, 0, 1), &marked(false, 0, None)),
        AppendRequest::new(t, s3, 0, e3, &queued(s3, 0, 1), &AppendExtras::default()),
        AppendRequest::new(t, s4, 0, e4, &queued(s4, 0, 1), &with_usage),
        // Round 2: s1 again, still runnable, one turn started.
        AppendRequest::new(t, s1, 1, e1, &queued(s1, 1, 1), &marked(true, 1, None)),
    ]);
    let before = now_ms();
    let results = run(&store, batch).await;
    let after = now_ms();
    let woke: Vec<Option<bool>> = results
        .iter()
        .map(|r| r.as_ref().ok().map(|a| a.woke))
        .collect();
    // s1's second request is in the commit that made it runnable.
    assert_eq!(
        woke,
        [Some(true), Some(false), Some(false), Some(true), Some(true)]
    );
    let rows = marks(&store, &sessions).await;
    let since = rows[0].1.unwrap();
    assert!(
        (before..=after).contains(&since),
        "{since} not in {before}..={after}"
    );
    assert_eq!(rows[0], (1, Some(since), 1, 3, 2));
    assert_eq!(rows[1], (0, None, 0, 0, 2));
    assert_eq!(rows[2], (0, None, 0, 0, 2), "the schema version rose to 2");
    assert_eq!(
        rows[3],
        (1, rows[3].1, 1, 0, 3),
        "a newer schema version stays"
    );
    assert!(rows[3].1.is_some());

    // Later, alone: s1 stays runnable (its runnable_since stays), then stops being runnable.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let batch = pending(vec![AppendRequest::new(
        t,
        s1,
        2,
        e1,
        &queued(s1, 2, 1),
        &marked(true, 0, Some(-2)),
    )]);
    let results = run(&store, batch).await;
    assert!(!results[0].as_ref().ok().unwrap().woke);
    assert_eq!(
        marks(&store, &sessions).await[0],
        (1, Some(since), 0, -2, 2)
    );
    store
        .append_with(t, s1, 3, e1, &queued(s1, 3, 1), &marked(false, 0, None))
        .await
        .unwrap();
    assert_eq!(marks(&store, &sessions).await[0], (0, None, 0, -2, 2));
}

/// A fast-path statement that fails (an event row already at that seq) fails the set-wise
/// transaction; every request is then retried alone, extras included, and only the faulty
/// one fails.
#[tokio::test]
async fn a_failing_fast_path_retries_requests_with_extras_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (store, t, sessions) = setup(&dir, 2).await;
    let [(s1, e1), (s2, e2)] = [sessions[0], sessions[1]];
    let writer = store.inner.writer.clone().unwrap();
    {
        let mut conn = writer.lock().await;
        let row = queued(s2, 0, 1).remove(0);
        sqlx::query(
            "INSERT INTO events (tenant_id, session_id, seq, type, ts, body) VALUES (?, ?, 1, ?, 0, ?)",
        )
        .bind(t.to_string())
        .bind(s2.to_string())
        .bind(row.type_name())
        .bind(row.encode())
        .execute(&mut *conn)
        .await
        .unwrap();
    }
    let batch = pending(vec![
        AppendRequest::new(
            t,
            s1,
            0,
            e1,
            &queued(s1, 0, 1),
            &AppendExtras {
                approvals: vec![approval(s1)],
                usage: vec![usage(2)],
                ..AppendExtras::default()
            },
        ),
        AppendRequest::new(t, s2, 0, e2, &queued(s2, 0, 1), &AppendExtras::default()),
    ]);
    let results = run(&store, batch).await;
    assert_eq!(summary(&results), ["ok 1", "other"]);
    assert_eq!(store.get_session(t, s1).await.unwrap().version, 1);
    assert_eq!(store.get_session(t, s2).await.unwrap().version, 0);
    assert_eq!(store.list_approvals(t, s1, None).await.unwrap().len(), 1);
    let rows = store.usage(t, "2026-05-01", "2026-05-01").await.unwrap();
    assert_eq!(rows[0].steps, 2, "extras applied once, by the retry");
}

/// A job of the writer thread that panics half-way through a transaction costs its callers an
/// answer, not the thread: the next job finds the connection rolled back and appends commit.
#[tokio::test]
async fn a_panicking_writer_job_leaves_the_thread_serving_outside_a_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let (store, t, sessions) = setup(&dir, 1).await;
    let (s, e) = sessions[0];
    let thread = store.inner.thread.as_ref().unwrap();
    let panicked = thread
        .call(|conn| -> () {
            conn.connection()
                .execute_batch("BEGIN IMMEDIATE; DELETE FROM events;")
                .unwrap();
            panic!("a bug in a job");
        })
        .await;
    assert!(
        panicked.is_err(),
        "the caller of a panicking job gets an error"
    );
    let autocommit = thread
        .call(|conn| conn.connection().is_autocommit())
        .await
        .unwrap();
    assert!(autocommit, "the half-done transaction was rolled back");
    assert_eq!(store.append(t, s, 0, e, &queued(s, 0, 2)).await.unwrap(), 2);
    assert_eq!(store.read(t, s, 0, None).await.unwrap().len(), 2);
}

/// The disk filling up under the writer thread (here its connection's page limit) is
/// `DiskFull` naming the store's file, commits nothing of the append, and the next append
/// commits once there is room again.
#[tokio::test]
async fn a_full_disk_under_the_writer_thread_is_disk_full_and_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (store, t, sessions) = setup(&dir, 1).await;
    let (s, e) = sessions[0];
    let thread = store.inner.thread.as_ref().unwrap();
    let pages: i64 = thread
        .call(|conn| {
            let c = conn.connection();
            let n: i64 = c.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
            c.execute_batch(&format!("PRAGMA max_page_count = {n}"))
                .unwrap();
            n
        })
        .await
        .unwrap();
    let big = |after: u64| {
        vec![Event::new(
            s,
            after + 1,
            Utc::now(),
            Correlation::default(),
            EventBody::TurnQueued {
                input: "x".repeat(64 * 1024),
                compiled: None,
            },
        )]
    };
    let err = store.append(t, s, 0, e, &big(0)).await.unwrap_err();
    match &err {
        StoreError::DiskFull { location, .. } => {
            assert!(location.ends_with("k.db"), "names the file: {err}");
        }
        other => panic!("expected DiskFull, got {other:?}"),
    }
    assert_eq!(store.get_session(t, s).await.unwrap().version, 0);
    assert!(store.read(t, s, 0, None).await.unwrap().is_empty());
    thread
        .call(move |conn| {
            conn.connection()
                .execute_batch(&format!("PRAGMA max_page_count = {}", pages * 100))
                .unwrap();
        })
        .await
        .unwrap();
    assert_eq!(store.append(t, s, 0, e, &big(0)).await.unwrap(), 1);
}

/// The columns a compare-and-set's `SET` assigns (the left side of each top-level `=`).
fn assigned_columns(sql: &str) -> Vec<String> {
    let set = sql.split_once(" SET ").unwrap().1;
    let set = set.split(" FROM v ").next().unwrap();
    let set = set.split(" WHERE tenant_id").next().unwrap();
    let (mut depth, mut start, mut cols) = (0i32, 0usize, Vec::new());
    for (i, c) in set.char_indices().chain([(set.len(), ',')]) {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                let lhs = set[start..i].split('=').next().unwrap().trim();
                cols.push(lhs.to_owned());
                start = i + 1;
            }
            _ => {}
        }
    }
    cols
}

/// The names every index of `sessions` reads (its columns and its partial `WHERE`'s), from
/// the store's own schema.
async fn indexed_session_words(store: &SqlStore) -> Vec<(String, Vec<String>)> {
    let rows = sqlx::query(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'sessions' \
         AND sql IS NOT NULL",
    )
    .fetch_all(&store.inner.pool)
    .await
    .unwrap();
    rows.iter()
        .map(|r| {
            let sql: String = r.try_get("sql").unwrap();
            let on = sql.split_once(" ON sessions").unwrap().1;
            let words = on
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| !w.is_empty())
                .map(str::to_owned)
                .collect();
            (r.try_get("name").unwrap(), words)
        })
        .collect()
}

/// An append inside a turn (no status-changing event, no work mark, no priority) takes the
/// slim compare-and-set: it assigns no column any index of `sessions` reads — assigning a
/// column its own value would still rewrite the index's entry, two of the ~14 pages of a
/// step's commit — and leaves the status and the scheduler's columns as they were, alone and
/// in a set-wise batch, while the version and the schema version move as before.
#[tokio::test]
async fn an_append_that_keeps_the_row_columns_assigns_no_indexed_column() {
    let dir = tempfile::tempdir().unwrap();
    let (store, t, sessions) = setup(&dir, 3).await;
    let indexes = indexed_session_words(&store).await;
    assert!(indexes.len() >= 5, "{indexes:?}");
    for sql in [cas_update(true), set_wise_update(2, true)] {
        let cols = assigned_columns(&sql);
        assert_eq!(cols.len(), 3, "{cols:?} in {sql}");
        for (name, words) in &indexes {
            for col in &cols {
                assert!(
                    !words.contains(col),
                    "{name} reads {col}, assigned by {sql}"
                );
            }
        }
    }
    // The full statements do assign indexed columns (the check above can see one).
    for sql in [cas_update(false), set_wise_update(2, false)] {
        let cols = assigned_columns(&sql);
        assert!(cols.iter().any(|c| c == "status"), "{cols:?}");
        assert!(
            indexes
                .iter()
                .any(|(_, w)| w.contains(&"status".to_owned()))
        );
    }

    let [(s1, e1), (s2, e2), (s3, e3)] = [sessions[0], sessions[1], sessions[2]];
    // Each session gets a mark and a priority first (the full statement).
    for (i, (s, e)) in sessions.iter().enumerate() {
        let mark = marked(i != 1, 2, Some(7));
        let req = AppendRequest::new(t, *s, 0, *e, &queued(*s, 0, 1), &mark).unwrap();
        assert!(!req.keeps_row_columns());
        store
            .append_with(t, *s, 0, *e, &queued(*s, 0, 1), &mark)
            .await
            .unwrap();
    }
    let before = marks(&store, &sessions).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    // Alone, then s2 and s3 set-wise in one batch: slim.
    let plain = AppendExtras::default();
    let req = AppendRequest::new(t, s1, 1, e1, &queued(s1, 1, 2), &plain).unwrap();
    assert!(req.keeps_row_columns());
    assert_eq!(
        store
            .append_with(t, s1, 1, e1, &queued(s1, 1, 2), &plain)
            .await
            .unwrap(),
        3
    );
    let results = run(
        &store,
        pending(vec![
            AppendRequest::new(t, s2, 1, e2, &queued(s2, 1, 1), &plain),
            AppendRequest::new(t, s3, 1, e3, &queued(s3, 1, 1), &plain),
        ]),
    )
    .await;
    assert_eq!(summary(&results), ["ok 2", "ok 2"]);
    assert!(results.iter().all(|r| !r.as_ref().ok().unwrap().woke));
    assert_eq!(
        marks(&store, &sessions).await,
        before,
        "the scheduler's columns stay"
    );
    // A batch mixing a slim append with a full one takes the full statement; the slim one's
    // columns still stay (its values are NULL: COALESCE keeps the row's).
    let results = run(
        &store,
        pending(vec![
            AppendRequest::new(t, s2, 2, e2, &queued(s2, 2, 1), &plain),
            AppendRequest::new(t, s3, 2, e3, &queued(s3, 2, 1), &marked(false, 0, None)),
        ]),
    )
    .await;
    assert_eq!(summary(&results), ["ok 3", "ok 3"]);
    let after = marks(&store, &sessions).await;
    assert_eq!(after[..2], before[..2]);
    assert_eq!(after[2], (0, None, 0, 7, before[2].4));
    let versions: Vec<i64> = {
        let mut v = Vec::new();
        for s in [s1, s2, s3] {
            v.push(
                sqlx::query("SELECT version FROM sessions WHERE session_id = ?")
                    .bind(s.to_string())
                    .fetch_one(&store.inner.pool)
                    .await
                    .unwrap()
                    .try_get("version")
                    .unwrap(),
            );
        }
        v
    };
    assert_eq!(versions, [3, 3, 3]);
}
