//! Running a claimed session and draining it (`Runtime::run_claimed`, issue 13): a drained run
//! stops at the next durable boundary with the turn still active, and another worker (another
//! runtime over the same store, as another process would be) continues the turn exactly where
//! it stopped: every side effect happens once, no turn is aborted or failed, no call becomes
//! `outcome_unknown`. Dropping the run future mid-way is a crash of that run: recovered like one.

use std::sync::Arc;
use std::time::Duration;

use keel_core::{Event, EventBody, SessionStatus, TenantId, TerminalReason, ToolCallStatus};
use keel_runtime::{PendingAction, RunOutcome, Runtime, RuntimeOptions};
use keel_store::{Lease, Store};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::on_both;

on_both!(
    a_drained_run_leaves_the_turn_to_the_next_worker,
    draining_while_tools_run_lets_them_finish_and_commit,
    a_dropped_run_is_recovered_like_a_crash,
);

/// A worker named `name` over its own store handle on `db`, answering from `lines` (the
/// position in the script is the session's, so each worker continues where the last stopped).
async fn worker(db: &Db, name: &str, lines: &[Value]) -> Runtime {
    let mut tools = registry();
    tools.register(Arc::new(MarkerTool)).unwrap();
    Runtime::new(
        second_store(db).await,
        scripted(lines),
        tools,
        RuntimeOptions {
            worker_name: name.into(),
            lease_ttl: Duration::from_secs(5),
            lease_wait: Duration::from_secs(6),
            cancel_grace_ms: 2_000,
            seal_key: deployment_key(),
            ..RuntimeOptions::default()
        },
    )
}

/// A read-only, parallel-safe tool (so it runs as a task of its own) that waits `ms` and then
/// writes `<name>.done` in the workspace — unless it is cancelled first. (A read-only tool with
/// a trace, to see whether a stopped run's tasks kept running.)
struct MarkerTool;

#[async_trait::async_trait]
impl keel_tools::tool::Tool for MarkerTool {
    fn name(&self) -> &str {
        "marker"
    }
    fn description(&self) -> &str {
        "Waits, then leaves a mark."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {"ms": {"type": "integer"}, "name": {"type": "string"}}, "required": ["ms", "name"], "additionalProperties": false})
    }
    fn effect(&self) -> keel_tools::tool::EffectClass {
        keel_tools::tool::EffectClass::ReadOnly
    }
    async fn call(
        &self,
        args: Value,
        ctx: &keel_tools::tool::ToolContext,
    ) -> keel_tools::tool::ToolOutput {
        let ms = args["ms"].as_u64().unwrap_or(0);
        let name = args["name"].as_str().unwrap_or("marker");
        tokio::select! {
            () = ctx.cancel.cancelled() => keel_tools::tool::ToolOutput::cancelled("stopped"),
            () = tokio::time::sleep(Duration::from_millis(ms)) => {
                std::fs::write(ctx.workspace.root().join(format!("{name}.done")), "").unwrap();
                keel_tools::tool::ToolOutput::success("marked")
            }
        }
    }
}

/// The lease a scheduler would hold for `rt` after claiming the session.
async fn claim(rt: &Runtime, tenant: TenantId, f: &Fixture) -> Lease {
    rt.store()
        .acquire_lease(tenant, f.session, rt.owner(), Duration::from_secs(5))
        .await
        .unwrap()
}

/// Runs the session on a worker named `name` (see [`worker`]) the way a scheduler does: claims
/// it, runs it under the claim's lease until it stops (or `drain` stops it), gives it back.
async fn run_on(f: &Fixture, name: &str, lines: &[Value], drain: CancellationToken) -> RunOutcome {
    let rt = worker(&f.db, name, lines).await;
    let lease = claim(&rt, f.tenant, f).await;
    let out = rt
        .run_claimed(f.tenant, f.session, &lease, drain)
        .await
        .unwrap();
    rt.store().release_lease(f.tenant, &lease).await.unwrap();
    out
}

/// Cancels `drain` as soon as `pick` accepts the session's journal.
fn drain_when(
    store: Arc<dyn Store>,
    f: &Fixture,
    drain: CancellationToken,
    pick: impl Fn(&[Event]) -> bool + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let (tenant, session) = (f.tenant, f.session);
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let evs = store.read(tenant, session, 1, None).await.unwrap();
            if pick(&evs) {
                drain.cancel();
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the awaited event never came"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// The journal shows no crash-like stop and no ended-early turn: no call interrupted or
/// cancelled, no effect `outcome_unknown`, no turn aborted or failed.
fn assert_clean(events: &[Event]) {
    for e in events {
        match &e.body {
            EventBody::EffectOutcomeUnknown {} => panic!("an effect became outcome_unknown: {e:?}"),
            EventBody::ToolCallFinished { status, .. } => assert!(
                !matches!(
                    status,
                    ToolCallStatus::Interrupted | ToolCallStatus::Cancelled
                ),
                "a call was stopped: {e:?}"
            ),
            EventBody::TurnFinished {
                terminal_reason, ..
            } => assert_eq!(*terminal_reason, TerminalReason::Completed, "{e:?}"),
            EventBody::StepFailed { .. } => panic!("a step failed: {e:?}"),
            _ => {}
        }
    }
}

fn count(events: &[Event], ty: &str) -> usize {
    events.iter().filter(|e| e.type_name() == ty).count()
}

/// Drain arrives after step 1 committed, while step 2 samples (its response is delayed 2 s):
/// step 2 completes and commits, its call is not dispatched, and the run returns drained with
/// the turn active. Another worker claims the session and finishes the turn: each effect once.
async fn a_drained_run_leaves_the_turn_to_the_next_worker(backend: Backend) {
    let lines = [
        json!({"tool_calls": [call("counter", json!({"label": "a"}))]}),
        json!({"tool_calls": [call("counter", json!({"label": "b"}))], "delay_ms": 2000}),
        json!({"tool_calls": [call("counter", json!({"label": "c"}))]}),
        json!({"text": "done"}),
    ];
    let f = fixture(backend, &lines, |_| {}).await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();

    let drain = CancellationToken::new();
    // Step 1 and its call's result are committed, and step 2 samples (its start is committed by
    // a checkpoint while the response is delayed): drain.
    let trigger = drain_when(f.db.store.clone(), &f, drain.clone(), |evs| {
        count(evs, "step.started") == 2
    });
    let out = run_on(&f, "first", &lines, drain).await;
    trigger.await.unwrap();
    assert!(out.drained, "{out:?}");
    assert_eq!(out.status, SessionStatus::Running);
    assert!(out.turns.is_empty(), "no turn ended: {out:?}");
    let events = f.events().await;
    assert_eq!(out.version, events.len() as u64, "everything is committed");
    assert_eq!(count(&events, "step.completed"), 2, "step 2 completed");
    assert_eq!(count(&events, "tool_call.proposed"), 2);
    assert_eq!(
        count(&events, "tool_call.started"),
        1,
        "step 2's call was left for the next worker"
    );
    assert_eq!(count(&events, "turn.finished"), 0);
    assert_eq!(f.counter_lines().len(), 1);
    let state = f.rt.view(f.tenant, f.session).await.unwrap().state;
    assert!(state.active_turn.is_some(), "the turn is still active");

    let out = run_on(&f, "second", &lines, CancellationToken::new()).await;
    assert!(!out.drained);
    assert_eq!(out.status, SessionStatus::Idle);
    assert_eq!(out.turns.len(), 1);
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert_eq!(out.turns[0].final_text, "done");
    let events = f.events().await;
    assert_clean(&events);
    assert_eq!(count(&events, "turn.started"), 1, "one turn, started once");
    assert_eq!(count(&events, "step.completed"), 4);
    let labels: Vec<String> = f
        .counter_lines()
        .iter()
        .map(|l| l.split(' ').nth(1).unwrap().to_owned())
        .collect();
    assert_eq!(labels, ["a", "b", "c"], "each effect exactly once");
}

/// Drain arrives while step 1's calls run — a read-only `sleep` (a task of its own) and a
/// side-effecting `slow_effect` (dispatched): both finish, not stopped, and their results
/// commit before `run_claimed` returns drained. The next worker finishes the turn.
async fn draining_while_tools_run_lets_them_finish_and_commit(backend: Backend) {
    let lines = [
        json!({"tool_calls": [call("sleep", json!({"ms": 1500})), call("slow_effect", json!({"ms": 1500}))]}),
        json!({"text": "done"}),
    ];
    let f = fixture(backend, &lines, |_| {}).await;
    f.rt.submit(f.tenant, f.session, "work").await.unwrap();

    let drain = CancellationToken::new();
    // The side effect's intent is committed before it runs: drain while it runs.
    let trigger = drain_when(f.db.store.clone(), &f, drain.clone(), |evs| {
        count(evs, "effect.dispatched") == 1
    });
    let out = run_on(&f, "first", &lines, drain).await;
    trigger.await.unwrap();
    assert!(out.drained, "{out:?}");
    assert_eq!(out.status, SessionStatus::Running);
    let events = f.events().await;
    assert_eq!(out.version, events.len() as u64, "everything is committed");
    let results: Vec<(ToolCallStatus, String)> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::ToolCallFinished { status, output, .. } => Some((*status, output.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        results.len(),
        2,
        "both calls have their results: {results:?}"
    );
    assert!(
        results.iter().all(|(s, _)| *s == ToolCallStatus::Succeeded),
        "{results:?}"
    );
    assert!(results.iter().any(|(_, o)| o == "slept 1500 ms"));
    assert!(results.iter().any(|(_, o)| o == "done"));
    assert_eq!(count(&events, "effect.committed"), 1);
    assert_eq!(count(&events, "step.started"), 1, "no second step started");
    assert_clean(&events);

    let out = run_on(&f, "second", &lines, CancellationToken::new()).await;
    assert_eq!(out.status, SessionStatus::Idle);
    assert_eq!(out.turns.len(), 1);
    assert_eq!(out.turns[0].final_text, "done");
    let events = f.events().await;
    assert_clean(&events);
    assert_eq!(count(&events, "effect.dispatched"), 1, "dispatched once");
}

/// The run future is dropped (a drain deadline) while a read-only call runs as a task of its
/// own, and again — on the worker that took over and re-ran that call — while the
/// side-effecting `shell` command the model proposed after it runs (it waits for the earlier
/// call: calls keep the model's order). Each is stopped with its run (their late writes never
/// happen), the session is no longer the dropped worker's, and the next worker recovers the
/// dispatched effect as after a crash — `outcome_unknown`, put to a human — instead of running
/// it again.
async fn a_dropped_run_is_recovered_like_a_crash(backend: Backend) {
    let lines = [
        json!({"tool_calls": [
            call("marker", json!({"ms": 2000, "name": "reader"})),
            call("shell", json!({"command": "sleep 2 && echo late > late.txt"})),
        ]}),
        json!({"text": "done"}),
    ];
    let f = fixture(backend, &lines, |_| {}).await;
    f.rt.submit(f.tenant, f.session, "work").await.unwrap();

    // Runs the session on worker `name` until `event` is journaled, then drops the run.
    let drop_at = |name: &'static str, event: &'static str| {
        let (f, lines) = (&f, &lines);
        async move {
            let w = worker(&f.db, name, lines).await;
            let lease = claim(&w, f.tenant, f).await;
            let run = {
                let (w, lease, tenant, session) = (w.clone(), lease.clone(), f.tenant, f.session);
                tokio::spawn(async move {
                    w.run_claimed(tenant, session, &lease, CancellationToken::new())
                        .await
                })
            };
            wait_for_event(&f.db.store, f.tenant, f.session, event).await;
            run.abort();
            assert!(run.await.unwrap_err().is_cancelled());
            w.store().release_lease(f.tenant, &lease).await.unwrap();
            w
        }
    };
    let first = drop_at("first", "tool_call.started").await;
    // The reader would have written at 2 s; it was stopped with the run.
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    assert!(
        !f.ws.path().join("reader.done").exists(),
        "the stopped run's read-only call kept running"
    );
    assert!(
        !f.ws.path().join("late.txt").exists(),
        "the write overtook the read"
    );
    // The first worker holds nothing of the session any more: a change goes through the store.
    first
        .update_config(f.tenant, f.session, |c| c.loop_threshold = 5)
        .await
        .unwrap();

    // The next worker re-runs the read, then dispatches the command; its run is dropped too.
    drop_at("second", "effect.dispatched").await;
    assert!(
        f.ws.path().join("reader.done").exists(),
        "the read was re-run"
    );
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    assert!(
        !f.ws.path().join("late.txt").exists(),
        "the stopped run's command kept running"
    );

    let out = run_on(&f, "third", &lines, CancellationToken::new()).await;
    assert_eq!(out.status, SessionStatus::RequiresAction, "{out:?}");
    assert!(
        matches!(out.pending.as_slice(), [PendingAction::Effect { tool_name, .. }] if tool_name == "shell"),
        "{:?}",
        out.pending
    );
    assert_eq!(count(&f.events().await, "effect.outcome_unknown"), 1);
}
