//! One store commit per phase: the number of durable commits a step costs, counted by the store
//! (`Store::commits`: journal appends and side-table writes, whatever group commit merges; lease
//! operations are the run's bookkeeping and are not counted). Each count is the difference
//! between a turn with the step and the same turn without it, so turn start and end (and the
//! session going idle) cancel out. The checkpoint interval is set far beyond the test so only
//! the phase rules commit.

use std::time::Duration;

use keel_core::{ApprovalDecision, Budget, SessionId, SessionStatus, TenantId};
use keel_runtime::{PendingAction, Runtime, RuntimeOptions};
use keel_store::Store;
use keel_tools::policy::PermissionMode;
use serde_json::{Value, json};

use crate::common::{Backend, Db, call, config, db, registry, release, scripted, workspace};
use crate::on_both;

fn commits(store: &dyn Store) -> u64 {
    let c = store.commits();
    c.journal + c.tables
}

/// A runtime on `db` whose checkpoints never come in a test's time (so only the phase rules
/// commit), and a session of it in `mode` with `ask` rules, its turn `go` submitted. The
/// workspace lives as long as the returned directory.
async fn submitted(
    db: &Db,
    lines: &[Value],
    mode: PermissionMode,
    ask: &[&str],
) -> (Runtime, TenantId, SessionId, tempfile::TempDir) {
    let rt = Runtime::new(
        db.store.clone(),
        scripted(lines),
        registry(),
        RuntimeOptions {
            checkpoint_after: Duration::from_secs(3600),
            ..RuntimeOptions::default()
        },
    );
    let ws = workspace();
    let tenant = TenantId::new();
    let mut cfg = config(ws.path());
    cfg.permission_mode = mode;
    cfg.ask = ask.iter().map(|s| (*s).to_owned()).collect();
    let session = rt
        .create_session(tenant, &release(&[], Budget::default()), cfg)
        .await
        .unwrap();
    rt.submit(tenant, session, "go").await.unwrap();
    (rt, tenant, session, ws)
}

/// Runs one turn of `lines` to its end (deciding every approval with `allow_once`); returns the
/// commits it cost, excluding the humans' own decisions.
async fn turn_commits(b: Backend, lines: &[Value], mode: PermissionMode, ask: &[&str]) -> u64 {
    let db = db(b).await;
    let (rt, tenant, session, _ws) = submitted(&db, lines, mode, ask).await;
    let before = commits(db.store.as_ref());
    let mut human = 0;
    loop {
        let out = rt.run(tenant, session).await.unwrap();
        if out.status != SessionStatus::RequiresAction {
            assert_eq!(out.status, SessionStatus::Idle);
            break;
        }
        for p in out.pending {
            let PendingAction::Approval {
                approval_id,
                args_hash,
                ..
            } = p
            else {
                panic!("only approvals are expected: {p:?}")
            };
            let c = commits(db.store.as_ref());
            rt.decide_approval(tenant, approval_id, ApprovalDecision::AllowOnce, &args_hash)
                .await
                .unwrap();
            human += commits(db.store.as_ref()) - c;
        }
    }
    commits(db.store.as_ref()) - before - human
}

fn done() -> Value {
    json!({"text": "done"})
}

async fn baseline(b: Backend) -> u64 {
    turn_commits(b, &[done()], PermissionMode::Bypass, &[]).await
}

async fn a_read_only_step_is_one_commit(b: Backend) {
    let base = baseline(b).await;
    let lines = [
        json!({"tool_calls": [call("read_file", json!({"path": "README.md"}))]}),
        done(),
    ];
    let n = turn_commits(b, &lines, PermissionMode::Bypass, &[]).await;
    assert!(n - base <= 1, "a read-only step cost {} commits", n - base);
    assert_eq!(n - base, 1);
}

async fn a_side_effecting_step_is_two_commits(b: Backend) {
    let base = baseline(b).await;
    let lines = [
        json!({"tool_calls": [call("counter", json!({"label": "a"}))]}),
        done(),
    ];
    let n = turn_commits(b, &lines, PermissionMode::Bypass, &[]).await;
    assert_eq!(n - base, 2, "intent before, outcome after");
}

async fn three_side_effecting_calls_are_at_most_four_commits(b: Backend) {
    let base = baseline(b).await;
    let lines = [
        json!({"tool_calls": [
            call("counter", json!({"label": "a"})),
            call("counter", json!({"label": "b"})),
            call("counter", json!({"label": "c"})),
        ]}),
        done(),
    ];
    let n = turn_commits(b, &lines, PermissionMode::Bypass, &[]).await;
    assert!(n - base <= 4, "three effects cost {} commits", n - base);
    assert_eq!(n - base, 4);
}

async fn an_approved_call_is_at_most_three_commits(b: Backend) {
    let base = baseline(b).await;
    // A side-effecting call that asks: ask (1), approval applied + intent (1), outcome (1).
    let lines = [
        json!({"tool_calls": [call("counter", json!({"label": "a"}))]}),
        done(),
    ];
    let n = turn_commits(b, &lines, PermissionMode::Default, &[]).await;
    assert!(
        n - base <= 3,
        "an approved effect cost {} commits",
        n - base
    );
    // A read-only call an ask rule catches: ask (1), approval applied + run + result (1); with
    // the human's own decision that is 3.
    let lines = [
        json!({"tool_calls": [call("read_file", json!({"path": "README.md"}))]}),
        done(),
    ];
    let n = turn_commits(b, &lines, PermissionMode::Default, &["read_file(*)"]).await;
    assert!(n - base < 3, "an approved read cost {} commits", n - base);
}

/// A step's end (its calls' results, `turn.sampling`) commits while the next step's request is
/// out, never after its answer: with step 2's answer held for 3 s and no checkpoint in the
/// test's time, the store holds step 1's outcome and step 2's start while the run still waits
/// on the model.
async fn a_steps_end_is_durable_while_the_next_request_is_out(b: Backend) {
    let db = db(b).await;
    let lines = [
        json!({"tool_calls": [call("counter", json!({"label": "a"}))]}),
        json!({"text": "done", "delay_ms": 3000}),
    ];
    let (rt, tenant, session, _ws) = submitted(&db, &lines, PermissionMode::Bypass, &[]).await;
    let run = tokio::spawn(async move { rt.run(tenant, session).await.unwrap() });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let types = loop {
        let evs = db.store.read(tenant, session, 1, None).await.unwrap();
        let types: Vec<&str> = evs.iter().map(keel_core::Event::type_name).collect();
        if types.iter().filter(|t| **t == "step.started").count() == 2 {
            break types;
        }
        assert!(tokio::time::Instant::now() < deadline, "{types:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(!run.is_finished(), "step 2's answer is still held");
    for t in [
        "effect.committed",
        "tool_call.finished",
        "turn.phase_changed",
    ] {
        assert!(types.contains(&t), "{t} is durable: {types:?}");
    }
    let out = run.await.unwrap();
    assert_eq!(out.turns[0].final_text, "done");
}

/// A turn of `steps` read-only steps, run to its end: the journal commits it cost and, of those,
/// the ones that set the session row's status or scheduler columns.
async fn row_column_commits(b: Backend, steps: usize) -> (u64, u64) {
    let db = db(b).await;
    let mut lines: Vec<Value> = (0..steps)
        .map(|_| json!({"tool_calls": [call("read_file", json!({"path": "README.md"}))]}))
        .collect();
    lines.push(done());
    let (rt, tenant, session, _ws) = submitted(&db, &lines, PermissionMode::Bypass, &[]).await;
    let before = db.store.commits();
    let out = rt.run(tenant, session).await.unwrap();
    assert_eq!(out.status, SessionStatus::Idle);
    let after = db.store.commits();
    (
        after.journal - before.journal,
        after.journal_row_columns - before.journal_row_columns,
    )
}

/// The runtime sends its work mark (and so rewrites the session row's indexed columns) only
/// when the mark changed: a turn of five steps sets them as often as a turn of one, though it
/// commits four more times.
async fn the_session_row_s_indexed_columns_are_set_as_often_however_many_steps(b: Backend) {
    let (one, one_marked) = row_column_commits(b, 1).await;
    let (five, five_marked) = row_column_commits(b, 5).await;
    assert_eq!(five - one, 4, "a read-only step is one commit");
    assert_eq!(
        five_marked, one_marked,
        "{one_marked} of {one} vs {five_marked} of {five}"
    );
    assert!(one_marked < one, "{one_marked} of {one}");
}

on_both!(
    the_session_row_s_indexed_columns_are_set_as_often_however_many_steps,
    a_steps_end_is_durable_while_the_next_request_is_out,
    a_read_only_step_is_one_commit,
    a_side_effecting_step_is_two_commits,
    three_side_effecting_calls_are_at_most_four_commits,
    an_approved_call_is_at_most_three_commits,
);
