//! Attacks on the planner/driver's promises by a malicious (scripted) model and a misbehaving
//! tool. Each was written against the running code; those that broke a promise then say so in
//! their doc comment and now check the fix.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use keel_core::{ApprovalDecision, EventBody, SessionStatus, StateMachine, TerminalReason};
use keel_runtime::{PendingAction, Runtime, RuntimeOptions};
use keel_tools::tool::{EffectClass, Tool, ToolContext, ToolOutput};
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

on_both!(
    a_call_is_authorized_on_the_arguments_it_runs_with,
    a_call_id_colliding_with_a_renamed_id_gets_a_fresh_id,
    one_call_id_proposed_three_times_in_a_step_gets_three_results,
    a_tool_call_budget_stops_calls_within_one_step,
    a_wall_time_budget_stops_a_long_running_tool_call,
    a_panicking_read_only_tool_does_not_hang_the_turn,
    a_tool_refusing_after_the_call_started_fails_the_call_once,
    hundreds_of_calls_in_one_step_each_get_exactly_one_result,
    a_step_mixing_asked_denied_invalid_and_read_only_calls_settles_every_call_once,
    the_same_failing_call_repeated_ends_the_turn_loop_detected,
    an_empty_call_id_is_handled_without_a_crash,
    huge_arguments_are_a_tool_result_not_a_crash,
    cancelling_while_a_read_only_call_runs_gives_every_call_one_result,
    arguments_nested_too_deep_are_a_tool_result_not_a_stuck_turn,
);

/// Every tool call of the session is terminal and has exactly one `tool_call.finished`.
async fn assert_one_result_each(f: &Fixture) {
    let evs = f.events().await;
    let mut finished: BTreeMap<String, u32> = BTreeMap::new();
    for e in &evs {
        if let EventBody::ToolCallFinished { .. } = e.body {
            *finished
                .entry(e.correlation.tool_call_id.clone().unwrap().to_string())
                .or_default() += 1;
        }
    }
    let view = f.rt.view(f.tenant, f.session).await.unwrap();
    for (id, c) in &view.state.tool_calls {
        assert!(c.status.is_terminal(), "call {id} left {:?}", c.status);
        assert!(c.result.is_some(), "call {id} has no result");
        assert_eq!(
            finished.get(id.as_str()).copied(),
            Some(1),
            "call {id}: one tool_call.finished"
        );
    }
}

async fn run_bounded(f: &Fixture, secs: u64) -> keel_runtime::RunOutcome {
    tokio::time::timeout(Duration::from_secs(secs), f.rt.run(f.tenant, f.session))
        .await
        .unwrap_or_else(|_| panic!("the run did not end within {secs} s"))
        .unwrap_or_else(|e| panic!("the run failed with a runtime error: {e}"))
}

/// Runs `script` in a fresh fixture to the end of its first turn (within `secs`), which must
/// complete with exactly one result per call; returns the fixture for more checks.
async fn completes(b: Backend, script: &[Value], secs: u64) -> Fixture {
    let f = fixture(b, script, |_| {}).await;
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    let out = run_bounded(&f, secs).await;
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert_one_result_each(&f).await;
    f
}

fn with_id(id: &str, name: &str, args: Value) -> Value {
    json!({"id": id, "name": name, "arguments": args})
}

// --- a malicious model: call ids -------------------------------------------------------------

/// Step 1 proposes ids `x` and `x_a1`; step 2 proposes `x` again. A reused id is renamed
/// `{id}_a{attempt}` — here `x_a1`, which exists — so it must get a fresh one (`x_a1_2`)
/// instead of a duplicate proposal the fold refuses (which errored the run on every resume).
async fn a_call_id_colliding_with_a_renamed_id_gets_a_fresh_id(b: Backend) {
    let f = completes(
        b,
        &[
            json!({"tool_calls": [
                with_id("x", "read_file", json!({"path": "README.md"})),
                with_id("x_a1", "list_dir", json!({"path": "."})),
            ]}),
            json!({"tool_calls": [with_id("x", "glob", json!({"pattern": "*.md"}))]}),
            json!({"text": "done"}),
        ],
        20,
    )
    .await;
    let view = f.rt.view(f.tenant, f.session).await.unwrap();
    let ids: Vec<&str> = view.state.tool_calls.keys().map(|c| c.as_str()).collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(ids.contains(&"x_a1_2"), "{ids:?}");
}

/// One step proposes id `x` three times with different arguments: the second is renamed
/// `x_a1`, the third must not collide with it.
async fn one_call_id_proposed_three_times_in_a_step_gets_three_results(b: Backend) {
    let f = completes(
        b,
        &[
            json!({"tool_calls": [
                with_id("x", "read_file", json!({"path": "README.md"})),
                with_id("x", "list_dir", json!({"path": "."})),
                with_id("x", "glob", json!({"pattern": "*"})),
            ]}),
            json!({"text": "done"}),
        ],
        20,
    )
    .await;
    let view = f.rt.view(f.tenant, f.session).await.unwrap();
    assert_eq!(view.state.tool_calls.len(), 3);
}

/// An empty id from the model.
async fn an_empty_call_id_is_handled_without_a_crash(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [with_id("", "read_file", json!({"path": "README.md"}))]}),
            json!({"text": "done"}),
        ],
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    let out = run_bounded(&f, 20).await;
    assert!(!out.turns.is_empty(), "{out:?}");
    assert_one_result_each(&f).await;
}

// --- budgets ---------------------------------------------------------------------------------

/// `max_tool_calls = 2`, and the model proposes 6 side-effecting calls in one step: only 2
/// may run (the planner once checked budgets only before a new step, and all 6 ran).
async fn a_tool_call_budget_stops_calls_within_one_step(b: Backend) {
    let calls: Vec<Value> = (0..6)
        .map(|i| call("counter", json!({"label": format!("c{i}")})))
        .collect();
    let f = fixture(
        b,
        &[json!({"tool_calls": calls}), json!({"text": "done"})],
        |c| c.turn_budget.max_tool_calls = Some(2),
    )
    .await;
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    let out = run_bounded(&f, 30).await;
    assert_eq!(
        out.turns[0].terminal_reason,
        TerminalReason::BudgetExhausted
    );
    assert_one_result_each(&f).await;
    assert_eq!(
        f.counter_lines().len(),
        2,
        "max_tool_calls = 2: {:?}",
        f.counter_lines()
    );
    let view = f.rt.view(f.tenant, f.session).await.unwrap();
    let refused: Vec<_> = view
        .state
        .tool_calls
        .values()
        .filter(|c| c.status == keel_core::ToolCallStatus::Rejected)
        .map(|c| c.result.clone().unwrap().0)
        .collect();
    assert_eq!(refused.len(), 4, "{refused:?}");
    assert!(refused[0].contains("tool-call budget"), "{refused:?}");
}

/// `max_wall_time_ms = 300` (what `keel run --timeout 300ms` / `[budget] timeout` set) and a
/// single 6 s tool call: the turn must end at the budget (it once ran the full 6 s). The
/// deadline is asserted with a 10x margin.
async fn a_wall_time_budget_stops_a_long_running_tool_call(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("sleep", json!({"ms": 6000}))]}),
            json!({"text": "done"}),
        ],
        |c| c.turn_budget.max_wall_time_ms = Some(300),
    )
    .await;
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    let t0 = Instant::now();
    let out = run_bounded(&f, 30).await;
    let took = t0.elapsed();
    assert_eq!(
        out.turns[0].terminal_reason,
        TerminalReason::BudgetExhausted
    );
    assert!(
        took < Duration::from_secs(3),
        "a 300 ms wall-time budget let the turn run {took:?}"
    );
}

// --- a misbehaving tool ----------------------------------------------------------------------

/// A read-only, parallel-safe tool that panics.
struct PanicTool;

#[async_trait]
impl Tool for PanicTool {
    fn name(&self) -> &str {
        "boom"
    }
    fn description(&self) -> &str {
        "Panics."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {}, "additionalProperties": false})
    }
    fn effect(&self) -> EffectClass {
        EffectClass::ReadOnly
    }
    async fn call(&self, _args: Value, _ctx: &ToolContext) -> ToolOutput {
        panic!("a bug in a tool")
    }
}

/// A tool that refuses its arguments only inside `call` (after the call started).
struct LateRefusal;

#[async_trait]
impl Tool for LateRefusal {
    fn name(&self) -> &str {
        "late"
    }
    fn description(&self) -> &str {
        "Refuses every call from inside `call`."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {}, "additionalProperties": false})
    }
    fn effect(&self) -> EffectClass {
        EffectClass::ReadOnly
    }
    async fn call(&self, _args: Value, _ctx: &ToolContext) -> ToolOutput {
        ToolOutput::rejected("late: invalid arguments")
    }
}

/// A started call whose tool answers `rejected` ends `failed` with the tool's text: `rejected`
/// is for calls that never started, and `running -> rejected` once made the read re-run without
/// end (thousands of `tool_call.started` a second; attack review of issue 15).
async fn a_tool_refusing_after_the_call_started_fails_the_call_once(b: Backend) {
    let db = db(b).await;
    let mut reg = registry();
    reg.register(Arc::new(LateRefusal)).unwrap();
    let rt = Runtime::new(
        db.store.clone(),
        scripted(&[
            json!({"tool_calls": [call("late", json!({}))]}),
            json!({"text": "done"}),
        ]),
        reg,
        RuntimeOptions::default(),
    );
    let ws = workspace();
    let tenant = keel_core::TenantId::new();
    let session = rt
        .create_session(
            tenant,
            &release(&[], keel_core::Budget::default()),
            config(ws.path()),
        )
        .await
        .unwrap();
    rt.submit(tenant, session, "go").await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(30), rt.run(tenant, session))
        .await
        .expect("the turn must end")
        .unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    let events = db.store.read(tenant, session, 1, None).await.unwrap();
    let started = events
        .iter()
        .filter(|e| e.type_name() == "tool_call.started")
        .count();
    assert_eq!(started, 1);
    let view = rt.view(tenant, session).await.unwrap();
    let c = view.state.tool_calls.values().next().unwrap();
    assert_eq!(c.status, keel_core::ToolCallStatus::Failed);
    assert!(
        c.result
            .clone()
            .unwrap()
            .0
            .contains("late: invalid arguments")
    );
}

/// A read-only tool panics inside its spawned task: the call must get an error result (it
/// once stayed in `live_calls` forever and the planner answered `AwaitRunning` every 500 ms).
async fn a_panicking_read_only_tool_does_not_hang_the_turn(b: Backend) {
    let db = db(b).await;
    let mut reg = registry();
    reg.register(Arc::new(PanicTool)).unwrap();
    let rt = Runtime::new(
        db.store.clone(),
        scripted(&[
            json!({"tool_calls": [call("boom", json!({})), call("read_file", json!({"path": "README.md"}))]}),
            json!({"text": "done"}),
        ]),
        reg,
        RuntimeOptions {
            lease_ttl: Duration::from_secs(5),
            lease_wait: Duration::from_secs(6),
            cancel_grace_ms: 2_000,
            ..RuntimeOptions::default()
        },
    );
    let ws = workspace();
    let tenant = keel_core::TenantId::new();
    let session = rt
        .create_session(
            tenant,
            &release(&[], keel_core::Budget::default()),
            config(ws.path()),
        )
        .await
        .unwrap();
    rt.submit(tenant, session, "go").await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), rt.run(tenant, session))
        .await
        .expect("the turn hangs after a tool panicked")
        .unwrap();
    assert_eq!(out.turns.len(), 1);
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    let view = rt.view(tenant, session).await.unwrap();
    for c in view.state.tool_calls.values() {
        assert!(c.status.is_terminal());
        if c.name == "boom" {
            assert_eq!(c.status, keel_core::ToolCallStatus::Failed);
            let (text, is_error) = c.result.clone().unwrap();
            assert!(is_error && text.contains("internal error"), "{text}");
        } else {
            assert_eq!(c.status, keel_core::ToolCallStatus::Succeeded);
        }
    }
}

// --- defended (cheap checks) -----------------------------------------------------------------

async fn hundreds_of_calls_in_one_step_each_get_exactly_one_result(b: Backend) {
    let calls: Vec<Value> = (0..300)
        .map(|i| {
            if i % 3 == 0 {
                call(
                    "read_file",
                    json!({"path": "README.md", "offset": 1, "limit": i + 1}),
                )
            } else if i % 3 == 1 {
                call("nope_tool", json!({"x": i}))
            } else {
                call("read_file", json!({"nope": i}))
            }
        })
        .collect();
    let f = fixture(
        b,
        &[json!({"tool_calls": calls}), json!({"text": "done"})],
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    let out = run_bounded(&f, 60).await;
    let view = f.rt.view(f.tenant, f.session).await.unwrap();
    let mut outs: BTreeMap<String, u32> = BTreeMap::new();
    for c in view.state.tool_calls.values() {
        *outs
            .entry(format!("{} {:?} {:?}", c.name, c.status, c.result))
            .or_default() += 1;
    }
    assert_eq!(
        out.turns[0].terminal_reason,
        TerminalReason::Completed,
        "{outs:#?}"
    );
    assert_one_result_each(&f).await;
    assert_eq!(view.state.tool_calls.len(), 300);
}

/// Default mode: a read-only call, a denied read, two `shell` calls that ask (one allowed, one
/// denied by the human), an unknown tool and bad arguments, in one step.
async fn a_step_mixing_asked_denied_invalid_and_read_only_calls_settles_every_call_once(
    b: Backend,
) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [
                call("shell", json!({"command": "echo one > one.txt"})),
                call("read_file", json!({"path": "README.md"})),
                call("read_file", json!({"path": "secret.txt"})),
                call("shell", json!({"command": "echo two > two.txt"})),
                call("no_such_tool", json!({})),
                call("write_file", json!({"path": 5})),
            ]}),
            json!({"text": "done"}),
        ],
        |c| {
            c.permission_mode = keel_tools::policy::PermissionMode::Default;
            c.deny = vec!["read_file(secret.txt)".into()];
        },
    )
    .await;
    std::fs::write(f.ws.path().join("secret.txt"), "s3cr3t").unwrap();
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    let out = run_bounded(&f, 20).await;
    assert_eq!(out.status, SessionStatus::RequiresAction, "{out:?}");
    let approvals: Vec<_> = out
        .pending
        .iter()
        .filter_map(|p| match p {
            PendingAction::Approval {
                approval_id,
                arguments,
                args_hash,
                ..
            } => Some((*approval_id, arguments.clone(), args_hash.clone())),
            PendingAction::Effect { .. } => None,
        })
        .collect();
    assert_eq!(approvals.len(), 2, "{:?}", out.pending);
    // Nothing that asks ran before its decision.
    assert!(!f.ws.path().join("one.txt").exists());
    assert!(!f.ws.path().join("two.txt").exists());
    for (id, args, hash) in approvals {
        let d = if args["command"].as_str().unwrap().contains("one") {
            ApprovalDecision::AllowOnce
        } else {
            ApprovalDecision::Deny {
                reason: "no".into(),
            }
        };
        f.rt.decide_approval(f.tenant, id, d, &hash).await.unwrap();
    }
    let out = run_bounded(&f, 20).await;
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert!(f.ws.path().join("one.txt").exists());
    assert!(!f.ws.path().join("two.txt").exists());
    assert_one_result_each(&f).await;
    let ctx = f.rt.project_context(f.tenant, f.session).await.unwrap();
    let text = serde_json::to_value(&ctx).unwrap()["messages"].to_string();
    assert!(!text.contains("s3cr3t"));
}

async fn the_same_failing_call_repeated_ends_the_turn_loop_detected(b: Backend) {
    let bad = json!({"tool_calls": [call("read_file", json!({"path": "missing.txt"}))]});
    let f = fixture(b, &vec![bad; 10], |_| {}).await;
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    let out = run_bounded(&f, 20).await;
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::LoopDetected);
    assert_one_result_each(&f).await;
}

async fn huge_arguments_are_a_tool_result_not_a_crash(b: Backend) {
    let big = "A".repeat(2 * 1024 * 1024);
    completes(
        b,
        &[
            json!({"tool_calls": [
                call("read_file", json!({"path": big.clone()})),
                call("grep", json!({"pattern": big.clone()})),
                call("write_file", json!({"path": "big.txt", "content": big.clone()})),
            ]}),
            json!({"text": "done"}),
        ],
        60,
    )
    .await;
}

async fn cancelling_while_a_read_only_call_runs_gives_every_call_one_result(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("sleep", json!({"ms": 20000})), call("counter", json!({"label": "a"})), call("sleep", json!({"ms": 20000}))]}),
            json!({"text": "done"}),
        ],
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    let rt = f.rt.clone();
    let (t, s) = (f.tenant, f.session);
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        rt.cancel_turn(t, s).await.unwrap();
    });
    let t0 = Instant::now();
    let out = run_bounded(&f, 20).await;
    canceller.await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Aborted);
    assert_one_result_each(&f).await;
}

// --- check-then-use drift through redaction --------------------------------------------------

/// `deny = write_file(./secrets/**)`. The model writes `secrets/Bearer AAAA…/../../notes.md`:
/// the policy (in `proposed`, on the raw arguments) sees `notes.md` and allows it; the journal
/// redacts `Bearer …/../../notes.md` (the built-in bearer pattern's token class includes `/`
/// and `.`) to `[REDACTED]`, and the tool runs with the redacted arguments from the state:
/// it writes `secrets/[REDACTED]`, inside the denied directory.
async fn a_call_is_authorized_on_the_arguments_it_runs_with(b: Backend) {
    let path = "secrets/Bearer AAAAAAAAAAAAAAAAAAAA/../../notes.md";
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [call("write_file", json!({"path": path, "content": "pwned"}))]}),
            json!({"text": "done"}),
        ],
        |c| c.deny = vec!["write_file(./secrets/**)".into()],
    )
    .await;
    std::fs::create_dir(f.ws.path().join("secrets")).unwrap();
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    let out = run_bounded(&f, 20).await;
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert_one_result_each(&f).await;
    let written: Vec<_> = std::fs::read_dir(f.ws.path().join("secrets"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        written.is_empty(),
        "a write the deny rule forbids happened: secrets/{written:?}"
    );
}

/// `{"path": [[…1…]]}` nesting `depth` levels (the object is level 1).
fn nested_arguments(depth: usize) -> String {
    format!(
        r#"{{"path": {}1{}}}"#,
        "[".repeat(depth - 1),
        "]".repeat(depth - 1)
    )
}

/// Found by the attack pass: a model sending arguments nested 126 levels deep over HTTP (the
/// Chat wire carries them as a string, parsed on their own) made a `tool_call.proposed` the
/// store refused ("does not survive encoding: recursion limit exceeded"); the turn could never
/// be journaled as finished and the session stayed `running` for good. Now a call nested deeper
/// than `MAX_ARGUMENT_DEPTH` is invalid: not run, its result says why, the turn goes on; a
/// call at the limit is judged by its tool as usual.
async fn arguments_nested_too_deep_are_a_tool_result_not_a_stuck_turn(b: Backend) {
    use keel_testkit::{FakeModelServer, FakeResponse, Handler, Pacing, RecordedRequest, Reply};
    let limit = keel_runtime::MAX_ARGUMENT_DEPTH;
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handler: Handler = Arc::new(move |_: &RecordedRequest| {
        match n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
            0 => Reply::Respond(
                FakeResponse::text("")
                    .with_tool_call("call_deep", "list_dir", &nested_arguments(126))
                    .with_tool_call("call_limit", "list_dir", &nested_arguments(limit)),
            ),
            _ => Reply::Respond(FakeResponse::text("done")),
        }
    });
    let server = FakeModelServer::start(handler, Pacing::default())
        .await
        .unwrap();
    let model = keel_model::HttpModel::new(
        keel_model::Wire::OpenaiChat,
        keel_model::ProviderConfig::new("gpt-4o")
            .with_base_url(server.base_url(keel_model::Wire::OpenaiChat))
            .with_api_key("k"),
    )
    .unwrap();
    let f = fixture_with(
        b,
        Arc::new(model),
        &[],
        keel_core::Budget::default(),
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    let out = run_bounded(&f, 30).await;
    assert_eq!(out.status, SessionStatus::Idle);
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert_eq!(out.turns[0].final_text, "done");
    assert_one_result_each(&f).await;
    let results: BTreeMap<String, String> = f
        .events()
        .await
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::ToolCallFinished { output, .. } => Some((
                e.correlation.tool_call_id.clone().unwrap().to_string(),
                output.clone(),
            )),
            _ => None,
        })
        .collect();
    let deep = &results["call_deep"];
    assert!(
        deep.contains(&format!("nested deeper than {limit} levels")),
        "{deep}"
    );
    assert!(
        !results["call_limit"].contains("nested deeper"),
        "{results:?}"
    );
}
