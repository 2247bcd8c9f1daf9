//! Hooks: real command hooks (sh scripts this file writes) and a real HTTP hook (an axum
//! server on a loopback port), driven through the scripted model, on both backends.

use std::path::Path;
use std::sync::{Arc, Mutex};

use keel_core::{
    ApprovalDecision, Budget, Event, EventBody, HookDecision, HookEvent, SessionStatus, TenantId,
    TerminalReason, ToolCallStatus,
};
use keel_model::Message;
use keel_runtime::hooks::{HookSpec, Hooks, HooksConfig};
use keel_runtime::{PendingAction, Runtime, RuntimeOptions, SessionConfig};
use keel_tools::policy::PermissionMode;
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

on_both!(
    a_slow_denying_hook_stops_a_fast_side_effect,
    a_rewrite_is_what_the_approval_hashes_and_the_tool_runs,
    a_rewrite_that_breaks_the_schema_is_rejected_naming_the_hook,
    ask_puts_an_allowed_call_to_a_human_and_the_hook_is_not_run_again,
    an_http_hook_decides_a_permission_request,
    hooks_fail_open_unless_they_fail_closed,
    a_stop_hook_continues_the_turn_at_most_n_times,
    user_prompt_submit_blocks_a_prompt_or_adds_context,
    post_tool_use_adds_to_the_result_and_session_start_runs_once,
);

/// Attack 14 (fixed): see [`a_human_deny_during_a_slow_allowing_permission_hook_stands`].
mod a_human_deny_during_a_slow_allowing_permission_hook {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sqlite() {
        super::a_human_deny_during_a_slow_allowing_permission_hook_stands(
            crate::common::Backend::Sqlite,
        )
        .await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres() {
        super::a_human_deny_during_a_slow_allowing_permission_hook_stands(
            crate::common::Backend::Postgres,
        )
        .await
    }
}

/// A runtime over `db` with `hooks`.
fn hooked_runtime(
    db: &Db,
    model: Arc<dyn keel_model::ModelClient>,
    hooks: &HooksConfig,
) -> Runtime {
    runtime_with(
        db,
        model,
        RuntimeOptions {
            hooks: Hooks::new(hooks).unwrap(),
            ..RuntimeOptions::default()
        },
    )
}

/// A session on a runtime with `hooks`.
async fn hooked(
    b: Backend,
    lines: &[Value],
    hooks: &HooksConfig,
    tune: impl FnOnce(&mut SessionConfig),
) -> Fixture {
    let db = db(b).await;
    let rt = hooked_runtime(&db, scripted(lines), hooks);
    let ws = workspace();
    let tenant = TenantId::new();
    let mut cfg = config(ws.path());
    tune(&mut cfg);
    let session = rt
        .create_session(tenant, &release(&[], Budget::default()), cfg)
        .await
        .unwrap();
    Fixture {
        db,
        rt,
        tenant,
        session,
        ws,
    }
}

/// A command hook running `script` (written to the workspace as a file, run by `sh`).
fn command(ws: &Path, file: &str, script: &str) -> HookSpec {
    std::fs::write(ws.join(file), script).unwrap();
    HookSpec {
        name: Some(file.trim_end_matches(".sh").to_owned()),
        command: Some(format!("sh ./{file}")),
        ..HookSpec::default()
    }
}

/// The `hook.ran` events: (hook, event, decision, payload).
fn hook_runs(events: &[Event]) -> Vec<(String, HookEvent, HookDecision, Event)> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::HookRan {
                hook,
                event,
                decision,
                ..
            } => Some((hook.clone(), *event, *decision, e.clone())),
            _ => None,
        })
        .collect()
}

fn finished(events: &[Event]) -> Vec<(ToolCallStatus, String)> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::ToolCallFinished { status, output, .. } => Some((*status, output.clone())),
            _ => None,
        })
        .collect()
}

/// A workspace whose hook scripts exist before the session starts: the fixture's workspace is
/// made first, then the hooks that live in it.
async fn with_hooks(
    b: Backend,
    lines: &[Value],
    make: impl FnOnce(&Path) -> HooksConfig,
    tune: impl FnOnce(&mut SessionConfig),
) -> Fixture {
    let ws = workspace();
    let hooks = make(ws.path());
    let mut f = hooked(b, lines, &hooks, |c| {
        c.workspace = ws.path().to_path_buf();
        tune(c);
    })
    .await;
    f.ws = ws;
    f
}

async fn a_slow_denying_hook_stops_a_fast_side_effect(b: Backend) {
    let f = with_hooks(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "x"})), call("read_file", json!({"path": "README.md"}))]}),
            json!({"text": "I will not count"}),
        ],
        |ws| HooksConfig {
            pre_tool_use: vec![HookSpec {
                matcher: Some("counter".into()),
                ..command(
                    ws,
                    "guard.sh",
                    // Slow, and it reads its input first: the tool is fast and would win any race.
                    "cat > hook_input.json\nsleep 1\necho '{\"decision\": \"deny\", \"reason\": \"counting is frozen\"}'\n",
                )
            }],
            ..HooksConfig::default()
        },
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(
        out.turns[0].terminal_reason,
        TerminalReason::Completed,
        "{out:?}"
    );
    assert!(f.counter_lines().is_empty(), "the denied tool never ran");
    let events = f.events().await;
    let results = finished(&events);
    // The read, which no hook matches, may finish first: it runs while the hook decides.
    let (status, output) = results
        .iter()
        .find(|(s, _)| *s != ToolCallStatus::Succeeded)
        .unwrap();
    assert_eq!(*status, ToolCallStatus::Rejected);
    assert!(
        output.contains("guard") && output.contains("counting is frozen"),
        "the model reads the hook and its reason: {output}"
    );
    // The read, which no hook matches, ran.
    assert!(
        results
            .iter()
            .any(|(s, o)| *s == ToolCallStatus::Succeeded && o.contains("hello"))
    );
    let runs = hook_runs(&events);
    assert_eq!(runs.len(), 1, "one hook, one call: {runs:?}");
    let (hook, event, decision, ev) = &runs[0];
    assert_eq!(
        (hook.as_str(), *event, *decision),
        ("guard", HookEvent::PreToolUse, HookDecision::Deny)
    );
    let EventBody::HookRan { duration_ms, .. } = &ev.body else {
        unreachable!()
    };
    assert!(
        *duration_ms >= 1000,
        "the duration is journaled: {duration_ms}"
    );
    assert!(ev.correlation.tool_call_id.is_some());
    // The decision was journaled before the call's result.
    let denied_call = ev.correlation.tool_call_id.clone();
    let ran_at = events
        .iter()
        .position(|e| e.type_name() == "hook.ran")
        .unwrap();
    let finished_at = events
        .iter()
        .position(|e| {
            e.type_name() == "tool_call.finished" && e.correlation.tool_call_id == denied_call
        })
        .unwrap();
    assert!(ran_at < finished_at);
    // What the hook was given.
    let input: Value = serde_json::from_str(
        &std::fs::read_to_string(f.ws.path().join("hook_input.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(input["hook_event"], "pre_tool_use");
    assert_eq!(input["hook"], "guard");
    assert_eq!(input["tool_name"], "counter");
    assert_eq!(input["tool_input"], json!({"label": "x"}));
    assert_eq!(input["session_id"], f.session.to_string());
    assert!(input["turn_id"].is_string());
    assert_eq!(
        Path::new(input["cwd"].as_str().unwrap())
            .canonicalize()
            .unwrap(),
        f.ws.path().canonicalize().unwrap()
    );
}

async fn a_rewrite_is_what_the_approval_hashes_and_the_tool_runs(b: Backend) {
    let f = with_hooks(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
            json!({"text": "counted"}),
        ],
        |ws| HooksConfig {
            pre_tool_use: vec![command(
                ws,
                "rewrite.sh",
                "echo '{\"decision\": \"rewrite\", \"input\": {\"label\": \"rewritten\"}}'\n",
            )],
            ..HooksConfig::default()
        },
        |c| c.permission_mode = PermissionMode::Default,
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction);
    let [
        PendingAction::Approval {
            approval_id,
            args_hash,
            ..
        },
    ] = out.pending.as_slice()
    else {
        panic!("{:?}", out.pending)
    };
    assert_eq!(
        *args_hash,
        keel_core::args_hash(&json!({"label": "rewritten"})),
        "the approval is of the rewritten input"
    );
    f.rt.decide_approval(
        f.tenant,
        *approval_id,
        ApprovalDecision::AllowOnce,
        args_hash,
    )
    .await
    .unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    let lines = f.counter_lines();
    assert_eq!(lines.len(), 1);
    assert!(
        lines[0].ends_with(" rewritten"),
        "the tool ran the rewrite: {lines:?}"
    );
    let events = f.events().await;
    let runs = hook_runs(&events);
    assert_eq!(runs.len(), 1, "not run again on the second run: {runs:?}");
    let EventBody::HookRan { arguments, .. } = &runs[0].3.body else {
        unreachable!()
    };
    assert_eq!(
        arguments.as_ref(),
        Some(&json!({"label": "rewritten"})),
        "journaled"
    );
    // The model's own proposal stays in its transcript.
    let ctx = f.rt.project_context(f.tenant, f.session).await.unwrap();
    assert!(
        ctx.messages
            .iter()
            .any(|m| matches!(&**m, Message::Assistant { tool_calls, .. }
        if tool_calls.iter().any(|c| c.arguments == json!({"label": "x"}))))
    );
}

async fn a_rewrite_that_breaks_the_schema_is_rejected_naming_the_hook(b: Backend) {
    let f = with_hooks(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
            json!({"text": "ok"}),
        ],
        |ws| HooksConfig {
            pre_tool_use: vec![command(
                ws,
                "breaker.sh",
                "echo '{\"input\": {\"label\": 5}}'\n",
            )],
            ..HooksConfig::default()
        },
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    assert!(f.counter_lines().is_empty());
    let results = finished(&f.events().await);
    assert_ne!(results[0].0, ToolCallStatus::Succeeded);
    assert!(
        results[0]
            .1
            .contains("rewritten by the pre_tool_use hook `breaker`"),
        "{}",
        results[0].1
    );
}

async fn ask_puts_an_allowed_call_to_a_human_and_the_hook_is_not_run_again(b: Backend) {
    let f = with_hooks(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
            json!({"text": "done"}),
        ],
        |ws| HooksConfig {
            pre_tool_use: vec![command(
                ws,
                "asker.sh",
                "echo run >> asker_runs.txt\necho '{\"decision\": \"ask\"}'\n",
            )],
            ..HooksConfig::default()
        },
        // Bypass: the policy alone would run it.
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction, "{out:?}");
    let [
        PendingAction::Approval {
            approval_id,
            args_hash,
            ..
        },
    ] = out.pending.as_slice()
    else {
        panic!("{:?}", out.pending)
    };
    assert!(f.counter_lines().is_empty());
    f.rt.decide_approval(
        f.tenant,
        *approval_id,
        ApprovalDecision::AllowOnce,
        args_hash,
    )
    .await
    .unwrap();
    // Another worker continues from the journal: the hook decided already.
    let other = hooked_runtime(
        &f.db,
        scripted(&[
            json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
            json!({"text": "done"}),
        ]),
        &HooksConfig {
            pre_tool_use: vec![HookSpec {
                name: Some("asker".into()),
                command: Some("sh ./asker.sh".into()),
                ..HookSpec::default()
            }],
            ..HooksConfig::default()
        },
    );
    let out = other.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    assert_eq!(f.counter_lines().len(), 1);
    let runs = std::fs::read_to_string(f.ws.path().join("asker_runs.txt")).unwrap();
    assert_eq!(
        runs.lines().count(),
        1,
        "a decided hook is not run again for the call"
    );
}

/// An HTTP hook endpoint: records every body it gets, answers `answer`.
async fn endpoint(answer: Value) -> (String, Arc<Mutex<Vec<Value>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let record = record.clone();
            let answer = answer.clone();
            async move {
                record.lock().unwrap().push(body);
                axum::Json(answer)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (format!("http://{addr}/hook"), seen)
}

async fn an_http_hook_decides_a_permission_request(b: Backend) {
    let (url, seen) =
        endpoint(json!({"decision": "allow", "reason": "ticket OPS-1 approved"})).await;
    let hooks = HooksConfig {
        permission_request: vec![HookSpec {
            name: Some("ticketing".into()),
            url: Some(url),
            matcher: Some("count*".into()),
            ..HookSpec::default()
        }],
        ..HooksConfig::default()
    };
    let f = hooked(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
            json!({"text": "counted"}),
        ],
        &hooks,
        |c| c.permission_mode = PermissionMode::Default,
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(
        out.turns.first().map(|t| t.terminal_reason),
        Some(TerminalReason::Completed),
        "no human was needed: {out:?}"
    );
    assert_eq!(f.counter_lines().len(), 1);
    let events = f.events().await;
    let decided = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::ApprovalDecided { decision, hook } => {
                Some((decision.clone(), hook.clone(), e.clone()))
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(decided.0, ApprovalDecision::AllowOnce);
    assert_eq!(
        decided.1.as_deref(),
        Some("ticketing"),
        "the hook is who decided"
    );
    let runs = hook_runs(&events);
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (runs[0].1, runs[0].2),
        (HookEvent::PermissionRequest, HookDecision::Allow)
    );
    assert_eq!(
        runs[0].3.correlation.approval_id,
        decided.2.correlation.approval_id
    );
    // The approvals table agrees with the journal.
    let approval = decided.2.correlation.approval_id.unwrap();
    let row = f.db.store.get_approval(f.tenant, approval).await.unwrap();
    assert_eq!(row.status, keel_core::ApprovalStatus::Allowed);
    let bodies = seen.lock().unwrap().clone();
    assert_eq!(bodies.len(), 1);
    assert_eq!(bodies[0]["hook_event"], "permission_request");
    assert_eq!(bodies[0]["approval_id"], approval.to_string());
    assert_eq!(bodies[0]["tool_input"], json!({"label": "x"}));
}

async fn hooks_fail_open_unless_they_fail_closed(b: Backend) {
    let lines = [
        json!({"tool_calls": [call("counter", json!({"label": "open"}))]}),
        json!({"text": "next"}),
        json!({"tool_calls": [call("counter", json!({"label": "closed"}))]}),
        json!({"text": "done"}),
    ];
    let f = with_hooks(
        b,
        &lines,
        |ws| {
            std::fs::write(ws.join("broken.sh"), "echo oops >&2\nexit 1\n").unwrap();
            std::fs::write(ws.join("hang.sh"), "sleep 30\n").unwrap();
            HooksConfig {
                pre_tool_use: vec![
                    HookSpec {
                        name: Some("broken".into()),
                        command: Some("sh ./broken.sh".into()),
                        ..HookSpec::default()
                    },
                    HookSpec {
                        name: Some("slowpoke".into()),
                        command: Some("grep -q closed && sh ./hang.sh; exit 0".into()),
                        timeout_ms: Some(300),
                        fail_closed: true,
                        ..HookSpec::default()
                    },
                ],
                ..HooksConfig::default()
            }
        },
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "one").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(
        f.counter_lines().len(),
        1,
        "a failing hook that fails open lets the call run"
    );
    f.rt.submit(f.tenant, f.session, "two").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(
        f.counter_lines().len(),
        1,
        "a hook that times out and fails closed denies"
    );
    let events = f.events().await;
    let runs = hook_runs(&events);
    let error = |e: &Event| match &e.body {
        EventBody::HookRan { error, .. } => error.clone().unwrap_or_default(),
        _ => String::new(),
    };
    let broken: Vec<_> = runs.iter().filter(|r| r.0 == "broken").collect();
    assert_eq!(broken.len(), 2);
    assert_eq!(broken[0].2, HookDecision::None);
    assert!(
        error(&broken[0].3).contains("exited with status 1: oops"),
        "{}",
        error(&broken[0].3)
    );
    let slow: Vec<_> = runs.iter().filter(|r| r.0 == "slowpoke").collect();
    assert_eq!(slow[0].2, HookDecision::None, "the first call did not hang");
    assert_eq!(slow[1].2, HookDecision::Deny);
    assert!(
        error(&slow[1].3).contains("timed out after 300 ms"),
        "{}",
        error(&slow[1].3)
    );
    let results = finished(&events);
    assert!(results[1].1.contains("fails closed"), "{}", results[1].1);
}

async fn a_stop_hook_continues_the_turn_at_most_n_times(b: Backend) {
    let lines: Vec<Value> = (1..=6)
        .map(|i| json!({"text": format!("done {i}")}))
        .collect();
    let f = with_hooks(
        b,
        &lines,
        |ws| HooksConfig {
            stop: vec![command(
                ws,
                "nag.sh",
                "echo 'run the tests first' >&2\nexit 2\n",
            )],
            max_stop_continues: Some(2),
            ..HooksConfig::default()
        },
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "finish").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let turn = &out.turns[0];
    assert_eq!(
        turn.terminal_reason,
        TerminalReason::LoopDetected,
        "{out:?}"
    );
    let events = f.events().await;
    let error = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::TurnFinished { error, .. } => error.clone(),
            _ => None,
        })
        .unwrap();
    assert!(
        error.contains("stop hook `nag`") && error.contains("more than 2 times"),
        "{error}"
    );
    let steps = events
        .iter()
        .filter(|e| e.type_name() == "step.completed")
        .count();
    assert_eq!(steps, 3, "two continuations, then the cap");
    let runs = hook_runs(&events);
    assert_eq!(runs.len(), 3);
    assert!(runs.iter().all(|r| r.2 == HookDecision::Continue));
    // The model was told why it goes on.
    let ctx = f.rt.project_context(f.tenant, f.session).await.unwrap();
    assert!(ctx.messages.iter().any(
        |m| matches!(&**m, Message::User { content } if content.contains("run the tests first"))
    ));
}

async fn user_prompt_submit_blocks_a_prompt_or_adds_context(b: Backend) {
    let f = with_hooks(
        b,
        &[json!({"text": "hello"})],
        |ws| HooksConfig {
            user_prompt_submit: vec![command(
                ws,
                "prompt.sh",
                "if grep -q secret; then echo '{\"decision\": \"block\", \"reason\": \"no secrets in prompts\"}'; \
                 else echo '{\"context\": \"the on-call engineer is Ada\"}'; fi\n",
            )],
            ..HooksConfig::default()
        },
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "my secret plan")
        .await
        .unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Aborted);
    let events = f.events().await;
    assert!(
        !events.iter().any(|e| e.type_name() == "step.started"),
        "no model call"
    );
    let error = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::TurnFinished { error, .. } => error.clone(),
            _ => None,
        })
        .unwrap();
    assert!(
        error.contains("`prompt`") && error.contains("no secrets in prompts"),
        "{error}"
    );
    f.rt.submit(f.tenant, f.session, "who is on call?")
        .await
        .unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    let ctx = f.rt.project_context(f.tenant, f.session).await.unwrap();
    assert!(ctx.messages.iter().any(|m| matches!(&**m, Message::User { content } if content.contains("the on-call engineer is Ada"))));
}

async fn post_tool_use_adds_to_the_result_and_session_start_runs_once(b: Backend) {
    let f = with_hooks(
        b,
        &[
            json!({"tool_calls": [call("read_file", json!({"path": "README.md"}))]}),
            json!({"text": "read"}),
            json!({"text": "again"}),
        ],
        |ws| HooksConfig {
            post_tool_use: vec![command(
                ws,
                "post.sh",
                "grep -q hello && echo '{\"context\": \"the README is stale\"}'; exit 0\n",
            )],
            session_start: vec![command(ws, "start.sh", "echo started >> starts.txt\n")],
            ..HooksConfig::default()
        },
        |_| {},
    )
    .await;
    for input in ["read it", "and again"] {
        f.rt.submit(f.tenant, f.session, input).await.unwrap();
        f.rt.run(f.tenant, f.session).await.unwrap();
    }
    let events = f.events().await;
    let results = finished(&events);
    assert!(
        results[0].1.contains("hello")
            && results[0]
                .1
                .contains("[post_tool_use hook `post`] the README is stale"),
        "{}",
        results[0].1
    );
    let starts = std::fs::read_to_string(f.ws.path().join("starts.txt")).unwrap();
    assert_eq!(
        starts.lines().count(),
        1,
        "session_start runs once per session"
    );
    let runs = hook_runs(&events);
    assert_eq!(
        runs.iter()
            .filter(|r| r.1 == HookEvent::SessionStart)
            .count(),
        1
    );
    assert_eq!(
        runs.iter()
            .filter(|r| r.1 == HookEvent::PostToolUse)
            .count(),
        1
    );
}

/// Attack (issue 14): a human denies a pending approval (`keel deny`, the approvals row) while a
/// slow `permission_request` hook is still deciding, and the hook then answers `allow`. The
/// human's deny was accepted by the row first; the call must not run.
async fn a_human_deny_during_a_slow_allowing_permission_hook_stands(b: Backend) {
    let f = with_hooks(
        b,
        &[
            json!({"tool_calls": [call("counter", json!({"label": "x"}))]}),
            json!({"text": "done"}),
        ],
        |ws| HooksConfig {
            permission_request: vec![command(
                ws,
                "approver.sh",
                "cat > request.json\nwhile [ ! -e go ]; do sleep 0.05; done\necho '{\"decision\": \"allow\"}'\n",
            )],
            ..HooksConfig::default()
        },
        |c| c.permission_mode = PermissionMode::Default,
    )
    .await;
    f.rt.submit(f.tenant, f.session, "count").await.unwrap();
    let rt = f.rt.clone();
    let (tenant, session) = (f.tenant, f.session);
    let run = tokio::spawn(async move { rt.run(tenant, session).await });
    // The hook has the request (and so the approval row exists): a human denies now.
    let request = f.ws.path().join("request.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let body: Value = loop {
        if let Ok(text) = std::fs::read_to_string(&request)
            && let Ok(v) = serde_json::from_str(&text)
        {
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "the hook never ran");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let approval: keel_core::ApprovalId = body["approval_id"].as_str().unwrap().parse().unwrap();
    let row = f.db.store.get_approval(f.tenant, approval).await.unwrap();
    f.rt.decide_approval(
        f.tenant,
        approval,
        ApprovalDecision::Deny {
            reason: "not today".into(),
        },
        &row.args_hash,
    )
    .await
    .unwrap();
    std::fs::write(f.ws.path().join("go"), "").unwrap();
    let _ = run.await.unwrap();
    assert!(
        f.counter_lines().is_empty(),
        "the human denied it before the hook answered, and the call ran"
    );
}
