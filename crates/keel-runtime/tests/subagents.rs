//! Sub-agents (`spawn_agent`): a child session per call, its result as the call's one result,
//! inherited policy, depth and concurrency bounds, shared budgets, cancellation flowing down.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use keel_core::{
    AgentDefinition, Budget, Event, EventBody, Release, SessionId, SessionStatus, StateMachine,
    TenantId,
};
use keel_model::{ModelClient, Script, ScriptedModel};
use keel_runtime::{ModelFactory, RuntimeOptions, SessionConfig, SubagentOptions};
use keel_store::SessionQuery;
use keel_tools::policy::PermissionMode;
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

fn model_of(lines: &[Value]) -> Arc<dyn ModelClient> {
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    Arc::new(ScriptedModel::new(
        Script::parse("child.jsonl", &text.join("\n")).unwrap(),
    ))
}

/// Children's models by route name (`["helper"]` → the helper's script).
fn models(scripts: Vec<(&str, Vec<Value>)>) -> ModelFactory {
    let map: BTreeMap<String, Arc<dyn ModelClient>> = scripts
        .into_iter()
        .map(|(k, v)| (k.to_owned(), model_of(&v)))
        .collect();
    Arc::new(move |route: &[String]| {
        route
            .first()
            .and_then(|r| map.get(r).cloned())
            .ok_or_else(|| format!("no test model for {route:?}"))
    })
}

fn agent(route: &str, tools: &[&str]) -> AgentDefinition {
    AgentDefinition {
        name: route.into(),
        model_route: vec![route.into()],
        instructions: "You are a helper.".into(),
        tools: tools.iter().map(|s| (*s).to_owned()).collect(),
        policy: Value::Null,
        budget: Budget::default(),
        mcp_servers: BTreeMap::new(),
        agents: BTreeMap::new(),
    }
}

/// The parent's release: the test agent with `agents`.
fn parent_release(agents: &[(&str, AgentDefinition)], budget: Budget) -> Release {
    let mut def = release(&[], budget).definition;
    def.agents = agents
        .iter()
        .map(|(n, d)| ((*n).to_owned(), d.clone()))
        .collect();
    Release::new(def)
}

struct Parent {
    f: Fixture,
}

async fn parent(
    b: Backend,
    lines: &[Value],
    children: Vec<(&str, Vec<Value>)>,
    subagents: SubagentOptions,
    release: Release,
    tune: impl FnOnce(&mut SessionConfig),
) -> Parent {
    let db = db(b).await;
    let rt = runtime_with(
        &db,
        scripted(lines),
        RuntimeOptions {
            subagents: SubagentOptions {
                models: Some(models(children)),
                ..subagents
            },
            ..RuntimeOptions::default()
        },
    );
    let ws = workspace();
    let tenant = TenantId::new();
    let mut cfg = config(ws.path());
    tune(&mut cfg);
    let session = rt.create_session(tenant, &release, cfg).await.unwrap();
    Parent {
        f: Fixture {
            db,
            rt,
            tenant,
            session,
            ws,
        },
    }
}

fn spawn(agent: &str, prompt: &str) -> Value {
    call("spawn_agent", json!({"agent": agent, "prompt": prompt}))
}

async fn events_of(f: &Fixture, session: SessionId) -> Vec<Event> {
    f.db.store.read(f.tenant, session, 1, None).await.unwrap()
}

async fn children_of(f: &Fixture, parent: SessionId) -> Vec<SessionId> {
    f.db.store
        .list_sessions(
            f.tenant,
            &SessionQuery {
                parent_session_id: Some(parent),
                ..SessionQuery::default()
            },
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.session_id)
        .collect()
}

fn finished_outputs(events: &[Event]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::ToolCallFinished { status, output, .. } => {
                Some((status.as_str().to_owned(), output.clone()))
            }
            _ => None,
        })
        .collect()
}

fn turn_finished(events: &[Event]) -> Vec<&EventBody> {
    events
        .iter()
        .filter(|e| matches!(e.body, EventBody::TurnFinished { .. }))
        .map(|e| &e.body)
        .collect()
}

/// The child's final text is the call's one result; the child's usage is in the parent's turn;
/// every child event names the parent, and its creation the call.
async fn a_child_answers_as_one_tool_result(b: Backend) {
    let p = parent(
        b,
        &[
            json!({"tool_calls": [spawn("helper", "What is six times seven?")],
                   "usage": {"input_tokens": 10, "output_tokens": 5}}),
            json!({"text": "The helper says 42.", "usage": {"input_tokens": 20, "output_tokens": 5}}),
        ],
        vec![(
            "helper",
            vec![json!({"text": "42", "usage": {"input_tokens": 100, "output_tokens": 50}})],
        )],
        SubagentOptions::default(),
        parent_release(&[("helper", agent("helper", &["read_file"]))], Budget::default()),
        |_| {},
    )
    .await;
    let f = &p.f;
    f.rt.submit(f.tenant, f.session, "ask the helper")
        .await
        .unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns.len(), 1);
    assert_eq!(out.turns[0].final_text, "The helper says 42.");
    // The parent's turn counts its own two steps and the child's step.
    assert_eq!(out.turns[0].usage.input_tokens, 130, "{:?}", out.turns[0]);
    assert_eq!(out.turns[0].usage.output_tokens, 60);

    let events = f.events().await;
    let results = finished_outputs(&events);
    assert_eq!(results, vec![("succeeded".into(), "42".into())]);
    let spawned: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::AgentSpawned {
                agent,
                child_session_id,
                ..
            } => Some((
                agent.clone(),
                *child_session_id,
                e.correlation.tool_call_id.clone(),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(spawned.len(), 1);
    let (name, child, call) = spawned[0].clone();
    assert_eq!(name, "helper");
    assert_eq!(call.as_ref().map(|c| c.as_str()), Some("call_1_0"));
    assert!(events.iter().any(|e| matches!(
        &e.body,
        EventBody::AgentFinished { child_session_id, reason, .. }
            if *child_session_id == child && reason == "completed"
    )));
    assert_eq!(children_of(f, f.session).await, vec![child]);

    let child_events = events_of(f, child).await;
    assert!(!child_events.is_empty());
    for e in &child_events {
        assert_eq!(e.correlation.parent_session_id, Some(f.session), "{e:?}");
    }
    assert_eq!(child_events[0].correlation.tool_call_id, call);
    // The child ran its own release: the helper's instructions and tools.
    let child_view = f.rt.view(f.tenant, child).await.unwrap();
    let release =
        f.rt.pinned_release(f.tenant, child)
            .await
            .unwrap()
            .definition;
    assert_eq!(release.instructions, "You are a helper.");
    assert_eq!(release.tools, vec!["read_file".to_owned()]);
    assert_eq!(child_view.turns[0].final_text, "42");
}

/// A parent in `read_only` mode cannot write through a child: the child inherits the mode and
/// its write is refused there.
async fn a_read_only_parent_gets_no_write_through_a_child(b: Backend) {
    let p = parent(
        b,
        &[
            json!({"tool_calls": [spawn("writer", "Write x.txt")]}),
            json!({"text": "done"}),
        ],
        vec![(
            "writer",
            vec![
                json!({"tool_calls": [call("write_file", json!({"path": "x.txt", "content": "pwned"}))]}),
                json!({"text": "I could not write."}),
            ],
        )],
        SubagentOptions::default(),
        parent_release(&[("writer", agent("writer", &[]))], Budget::default()),
        |c| c.permission_mode = PermissionMode::ReadOnly,
    )
    .await;
    let f = &p.f;
    f.rt.submit(f.tenant, f.session, "write through a child")
        .await
        .unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].final_text, "done");
    assert!(!f.ws.path().join("x.txt").exists());
    let child = children_of(f, f.session).await[0];
    let child_results = finished_outputs(&events_of(f, child).await);
    assert_eq!(child_results.len(), 1, "{child_results:?}");
    assert_eq!(child_results[0].0, "rejected", "{child_results:?}");
    assert!(
        child_results[0].1.contains("read_only"),
        "{child_results:?}"
    );
    let cfg = f.rt.view(f.tenant, child).await.unwrap().state.config;
    assert_eq!(cfg["permission_mode"], "read_only");
    // The parent's call itself ran (it changes nothing) and carries the child's answer.
    assert_eq!(
        finished_outputs(&f.events().await),
        vec![("succeeded".into(), "I could not write.".into())]
    );
}

/// A child at the deepest level gets its own `spawn_agent` refused, saying why; no grandchild
/// session exists.
async fn depth_is_bounded(b: Backend) {
    let p = parent(
        b,
        &[
            json!({"tool_calls": [spawn("nested", "go deeper")]}),
            json!({"text": "parent done"}),
        ],
        vec![(
            "nested",
            vec![
                json!({"tool_calls": [spawn("nested", "deeper still")]}),
                json!({"text": "stopped at the bottom"}),
            ],
        )],
        SubagentOptions {
            max_depth: 1,
            ..SubagentOptions::default()
        },
        parent_release(&[("nested", agent("nested", &[]))], Budget::default()),
        |_| {},
    )
    .await;
    let f = &p.f;
    f.rt.submit(f.tenant, f.session, "nest").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].final_text, "parent done");
    let children = children_of(f, f.session).await;
    assert_eq!(children.len(), 1);
    assert!(children_of(f, children[0]).await.is_empty());
    let results = finished_outputs(&events_of(f, children[0]).await);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].0, "failed", "{results:?}");
    assert!(results[0].1.contains("max_depth"), "{results:?}");
    let all =
        f.db.store
            .list_sessions(f.tenant, &SessionQuery::default())
            .await
            .unwrap();
    assert_eq!(all.len(), 2);
}

/// The (first) turn's start and end timestamps of `session`, ms.
async fn span_of(f: &Fixture, session: SessionId) -> (i64, i64) {
    let evs = events_of(f, session).await;
    let at = |ty: &str| {
        evs.iter()
            .find(|e| e.type_name() == ty)
            .map(|e| e.ts.timestamp_millis())
            .unwrap()
    };
    (at("turn.started"), at("turn.finished"))
}

/// With `max_concurrent = 1`, two calls of one response run their children one after the
/// other; by default they run at the same time.
async fn concurrency_is_bounded(b: Backend) {
    for (max, parallel) in [(1, false), (8, true)] {
        let p = parent(
            b,
            &[
                json!({"tool_calls": [spawn("slow", "task a"), spawn("slow", "task b")]}),
                json!({"text": "both done"}),
            ],
            vec![(
                "slow",
                vec![json!({"delay_ms": 1500, "text": "slow answer"})],
            )],
            SubagentOptions {
                max_concurrent: max,
                ..SubagentOptions::default()
            },
            parent_release(&[("slow", agent("slow", &[]))], Budget::default()),
            |_| {},
        )
        .await;
        let f = &p.f;
        f.rt.submit(f.tenant, f.session, "two at once")
            .await
            .unwrap();
        let out = f.rt.run(f.tenant, f.session).await.unwrap();
        assert_eq!(out.turns[0].final_text, "both done");
        let results = finished_outputs(&f.events().await);
        assert_eq!(
            results,
            vec![
                ("succeeded".into(), "slow answer".into()),
                ("succeeded".into(), "slow answer".into())
            ]
        );
        let children = children_of(f, f.session).await;
        assert_eq!(children.len(), 2);
        let (a, b2) = (span_of(f, children[0]).await, span_of(f, children[1]).await);
        let overlap = a.0 < b2.1 && b2.0 < a.1;
        assert_eq!(overlap, parallel, "max {max}: {a:?} {b2:?}");
    }
}

/// What a child spends counts against the parent's turn budget: the child starts with what the
/// parent has left, and after it the parent's next step is refused for tokens.
async fn child_spend_counts_in_the_parent_budget(b: Backend) {
    let p = parent(
        b,
        &[
            json!({"tool_calls": [spawn("spender", "spend")],
                   "usage": {"input_tokens": 10, "output_tokens": 5}}),
            json!({"text": "never sampled"}),
        ],
        vec![(
            "spender",
            vec![json!({"text": "spent", "usage": {"input_tokens": 500, "output_tokens": 100}})],
        )],
        SubagentOptions::default(),
        parent_release(&[("spender", agent("spender", &[]))], Budget::default()),
        |c| {
            c.turn_budget = Budget {
                max_tokens: Some(400),
                ..Budget::default()
            }
        },
    )
    .await;
    let f = &p.f;
    f.rt.submit(f.tenant, f.session, "spend").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let turn = &out.turns[0];
    assert_eq!(
        turn.terminal_reason.as_str(),
        "budget_exhausted",
        "{turn:?}"
    );
    assert_eq!(turn.limit, Some(keel_core::BudgetLimit::Tokens));
    assert_eq!(turn.usage.total_tokens(), 615);
    assert_eq!(turn.num_steps, 1);
    let child = children_of(f, f.session).await[0];
    let cfg = f.rt.view(f.tenant, child).await.unwrap().state.config;
    // What the parent had left when the child started: its limit, less its first step's
    // tokens once that step's usage is folded (a read-only call may start while the response
    // that proposed it still streams).
    let left = cfg["turn_budget"]["max_tokens"].as_u64().unwrap();
    assert!((385..=400).contains(&left), "{cfg}");
    let events = f.events().await;
    let finished = turn_finished(&events);
    assert_eq!(finished.len(), 1);
}

/// Cancelling the parent's turn cancels the child's (journaled in the child), and the call
/// gets its one result.
async fn cancelling_the_parent_cancels_the_child(b: Backend) {
    let p = parent(
        b,
        &[
            json!({"tool_calls": [spawn("sleeper", "sleep")]}),
            json!({"text": "unused"}),
        ],
        vec![("sleeper", vec![json!({"delay_ms": 60000, "text": "woke"})])],
        SubagentOptions::default(),
        parent_release(&[("sleeper", agent("sleeper", &[]))], Budget::default()),
        |_| {},
    )
    .await;
    let f = &p.f;
    f.rt.submit(f.tenant, f.session, "sleep").await.unwrap();
    let rt = f.rt.clone();
    let (tenant, session) = (f.tenant, f.session);
    let run = tokio::spawn(async move { rt.run(tenant, session).await.unwrap() });
    let spawned = wait_for_event(&f.db.store, f.tenant, f.session, "agent.spawned").await;
    let EventBody::AgentSpawned {
        child_session_id: child,
        ..
    } = spawned.body
    else {
        unreachable!()
    };
    wait_for_event(&f.db.store, f.tenant, child, "step.started").await;
    f.rt.cancel_turn(f.tenant, f.session).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.turns[0].terminal_reason.as_str(), "aborted");
    let child_events = events_of(f, child).await;
    let types: Vec<_> = child_events.iter().map(|e| e.type_name()).collect();
    assert!(types.contains(&"turn.cancel_requested"), "{types:?}");
    let ended = turn_finished(&child_events);
    assert!(
        matches!(ended[..], [EventBody::TurnFinished { terminal_reason, .. }] if terminal_reason.as_str() == "aborted"),
        "{ended:?}"
    );
    let results = finished_outputs(&f.events().await);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].0, "cancelled", "{results:?}");
}

/// A release without agents is not offered `spawn_agent`, and a call to it is refused.
async fn no_agents_no_spawn_agent(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"tool_calls": [spawn("any", "x")]}),
            json!({"text": "ok"}),
        ],
        |_| {},
    )
    .await;
    let ctx = f.rt.project_context(f.tenant, f.session).await.unwrap();
    assert!(ctx.tools.iter().all(|t| t.name != "spawn_agent"));
    f.rt.submit(f.tenant, f.session, "try").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    let results = finished_outputs(&f.events().await);
    assert_eq!(results[0].0, "rejected", "{results:?}");
    // The model is told the tools it is offered (attack review 15 #11: the list was empty, or
    // named `spawn_agent` although it is not offered).
    let (_, offered) = results[0].1.split_once("Available tools: ").unwrap();
    assert!(offered.contains("read_file"), "{results:?}");
    assert!(!offered.contains("spawn_agent"), "{results:?}");
    assert!(children_of(&f, f.session).await.is_empty());
}

/// A parent whose worker dies while its child runs: the next run re-runs the call, which
/// finds the child (same id), re-attaches it and takes its answer — one child, one turn in it,
/// no unknown outcome.
async fn a_crashed_parent_reattaches_its_child(b: Backend) {
    let lines = [
        json!({"tool_calls": [spawn("slow", "take your time")]}),
        json!({"text": "parent done"}),
    ];
    let child_lines = || {
        vec![(
            "slow",
            vec![json!({"delay_ms": 1500, "text": "slow answer"})],
        )]
    };
    let p = parent(
        b,
        &lines,
        child_lines(),
        SubagentOptions::default(),
        parent_release(&[("slow", agent("slow", &[]))], Budget::default()),
        |_| {},
    )
    .await;
    let f = &p.f;
    f.rt.submit(f.tenant, f.session, "delegate").await.unwrap();
    let rt = f.rt.clone();
    let (tenant, session) = (f.tenant, f.session);
    let run = tokio::spawn(async move { rt.run(tenant, session).await });
    let spawned = wait_for_event(&f.db.store, f.tenant, f.session, "agent.spawned").await;
    let EventBody::AgentSpawned {
        child_session_id: child,
        ..
    } = spawned.body
    else {
        unreachable!()
    };
    wait_for_event(&f.db.store, f.tenant, child, "step.started").await;
    // The worker dies: its run (and the child's, inside the call) stops mid-way.
    run.abort();
    let _ = run.await;
    let again = runtime_with(
        &f.db,
        scripted(&lines),
        RuntimeOptions {
            worker_name: "second".into(),
            subagents: SubagentOptions {
                models: Some(models(child_lines())),
                ..SubagentOptions::default()
            },
            ..RuntimeOptions::default()
        },
    );
    let out = again.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].final_text, "parent done");
    assert_eq!(children_of(f, f.session).await, vec![child]);
    let events = f.events().await;
    let types: Vec<_> = events.iter().map(|e| e.type_name()).collect();
    assert_eq!(
        types.iter().filter(|t| **t == "agent.spawned").count(),
        1,
        "{types:?}"
    );
    assert!(!types.contains(&"effect.outcome_unknown"), "{types:?}");
    assert_eq!(
        finished_outputs(&events),
        vec![("succeeded".into(), "slow answer".into())]
    );
    let child_view = again.view(f.tenant, child).await.unwrap();
    assert_eq!(child_view.state.turn_order.len(), 1);
    assert_eq!(child_view.turns[0].final_text, "slow answer");
}

/// A parent whose child waits on an approval, set up to run: the parent fixture, spawning a
/// `writer` that asks to write `a.txt`.
async fn parent_of_a_waiting_child(b: Backend) -> Parent {
    parent(
        b,
        &[
            json!({"tool_calls": [spawn("writer", "write a.txt")]}),
            json!({"text": "parent done"}),
        ],
        vec![(
            "writer",
            vec![
                json!({"tool_calls": [call("write_file", json!({"path": "a.txt", "content": "approved"}))]}),
                json!({"text": "wrote it"}),
            ],
        )],
        SubagentOptions::default(),
        parent_release(&[("writer", agent("writer", &[]))], Budget::default()),
        |c| c.permission_mode = PermissionMode::Default,
    )
    .await
}

/// The child's approval in the parent's `RunOutcome::pending`, labelled with the child.
fn child_approval(out: &keel_runtime::RunOutcome) -> (keel_core::ApprovalId, SessionId, String) {
    match out.pending.as_slice() {
        [
            keel_runtime::PendingAction::Approval {
                approval_id,
                tool_name,
                args_hash,
                subagent: Some(sub),
                ..
            },
        ] => {
            assert_eq!(tool_name, "write_file");
            assert_eq!(sub.agent, "writer");
            (*approval_id, sub.session_id, args_hash.clone())
        }
        other => panic!("expected the child's approval: {other:?}"),
    }
}

/// Submits the parent's prompt and runs it: the run ends `requires_action` (within a
/// correctness deadline) with the child's approval; returns it, the child and its hash.
async fn stop_for_the_childs_approval(f: &Fixture) -> (keel_core::ApprovalId, SessionId, String) {
    f.rt.submit(f.tenant, f.session, "delegate").await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), f.rt.run(f.tenant, f.session))
        .await
        .expect("the parent's run ends while its child waits")
        .unwrap();
    assert_eq!(out.status, SessionStatus::RequiresAction, "{out:?}");
    child_approval(&out)
}

/// Allows `approval` once.
async fn allow(f: &Fixture, approval: keel_core::ApprovalId, hash: &str) {
    f.rt.decide_approval(
        f.tenant,
        approval,
        keel_core::ApprovalDecision::AllowOnce,
        hash,
    )
    .await
    .unwrap();
}

/// A child that needs an approval does not hang its parent: the parent's stream names the
/// child and the approval, and the parent's run ends `requires_action` with the child's
/// approval in `pending` (labelled with the child session and agent); the call is left
/// `running`, with no result and no unknown outcome. Decided, the next run of the parent
/// re-attaches the same child, which continues, and the parent gets its answer.
async fn a_child_waiting_on_approval_surfaces_it_and_continues(b: Backend) {
    let p = parent_of_a_waiting_child(b).await;
    let f = &p.f;
    let mut sub = f.rt.subscribe(f.tenant, f.session, 1).await.unwrap();
    let (approval, child, hash) = stop_for_the_childs_approval(f).await;
    assert_eq!(children_of(f, f.session).await, vec![child]);
    // The parent's stream named the child and the approval.
    let mut surfaced = false;
    while let Some(item) = sub.next_timeout(Duration::from_millis(200)).await.unwrap() {
        let text = serde_json::to_string(&item).unwrap();
        surfaced |= text.contains(&approval.to_string()) && text.contains(&child.to_string());
    }
    assert!(surfaced, "no status naming approval {approval} of {child}");
    let events = f.events().await;
    let types: Vec<_> = events.iter().map(|e| e.type_name()).collect();
    assert!(finished_outputs(&events).is_empty(), "{types:?}");
    assert!(!types.contains(&"effect.outcome_unknown"), "{types:?}");
    allow(f, approval, &hash).await;
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::Idle, "{out:?}");
    assert_eq!(out.turns[0].final_text, "parent done");
    assert_eq!(
        std::fs::read_to_string(f.ws.path().join("a.txt")).unwrap(),
        "approved"
    );
    let events = f.events().await;
    assert_eq!(
        finished_outputs(&events),
        vec![("succeeded".into(), "wrote it".into())]
    );
    let types: Vec<_> = events.iter().map(|e| e.type_name()).collect();
    assert_eq!(
        types.iter().filter(|t| **t == "agent.spawned").count(),
        1,
        "{types:?}"
    );
    assert_eq!(children_of(f, f.session).await, vec![child]);
    assert_eq!(
        f.rt.view(f.tenant, child)
            .await
            .unwrap()
            .state
            .turn_order
            .len(),
        1
    );
}

/// A parent that stopped for its child's approval, run next by another worker (a restart):
/// the child is found again by its id — one child, one turn, no unknown outcome.
async fn a_restarted_parent_reattaches_its_waiting_child(b: Backend) {
    let p = parent_of_a_waiting_child(b).await;
    let f = &p.f;
    let (approval, child, hash) = stop_for_the_childs_approval(f).await;
    allow(f, approval, &hash).await;
    let again = runtime_with(
        &f.db,
        scripted(&[
            json!({"tool_calls": [spawn("writer", "write a.txt")]}),
            json!({"text": "parent done"}),
        ]),
        RuntimeOptions {
            worker_name: "second".into(),
            subagents: SubagentOptions {
                models: Some(models(vec![(
                    "writer",
                    vec![
                        json!({"tool_calls": [call("write_file", json!({"path": "a.txt", "content": "approved"}))]}),
                        json!({"text": "wrote it"}),
                    ],
                )])),
                ..SubagentOptions::default()
            },
            ..RuntimeOptions::default()
        },
    );
    let out = again.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::Idle, "{out:?}");
    assert_eq!(children_of(f, f.session).await, vec![child]);
    let events = f.events().await;
    let types: Vec<_> = events.iter().map(|e| e.type_name()).collect();
    assert!(!types.contains(&"effect.outcome_unknown"), "{types:?}");
    assert_eq!(
        finished_outputs(&events),
        vec![("succeeded".into(), "wrote it".into())]
    );
    assert_eq!(
        again
            .view(f.tenant, child)
            .await
            .unwrap()
            .state
            .turn_order
            .len(),
        1
    );
}

/// The parent's `allow` rules (the user's, pinned in its release) hold in the child: a write
/// the parent may make without asking, its child makes without asking too.
async fn a_child_inherits_the_parents_allow_rules(b: Backend) {
    let mut release = parent_release(&[("writer", agent("writer", &[]))], Budget::default());
    release.definition.policy = json!({"allow": ["write_file"]});
    let release = Release::new(release.definition);
    let p = parent(
        b,
        &[
            json!({"tool_calls": [spawn("writer", "write a.txt")]}),
            json!({"text": "parent done"}),
        ],
        vec![(
            "writer",
            vec![
                json!({"tool_calls": [call("write_file", json!({"path": "a.txt", "content": "allowed"}))]}),
                json!({"text": "wrote it"}),
            ],
        )],
        SubagentOptions::default(),
        release,
        |c| c.permission_mode = PermissionMode::Default,
    )
    .await;
    let f = &p.f;
    f.rt.submit(f.tenant, f.session, "delegate").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.status, SessionStatus::Idle, "{out:?}");
    assert_eq!(
        std::fs::read_to_string(f.ws.path().join("a.txt")).unwrap(),
        "allowed"
    );
}

/// Cancelling a parent that waits on its child's approval cancels the child: its turn ends
/// `aborted` and its approval is no longer waited on.
async fn cancelling_a_parent_whose_child_waits_cancels_the_child(b: Backend) {
    let p = parent_of_a_waiting_child(b).await;
    let f = &p.f;
    let (_, child, _) = stop_for_the_childs_approval(f).await;
    f.rt.cancel_turn(f.tenant, f.session).await.unwrap();
    let parent_events = f.events().await;
    assert!(
        matches!(turn_finished(&parent_events)[..], [EventBody::TurnFinished { terminal_reason, .. }] if terminal_reason.as_str() == "aborted"),
        "{:?}",
        turn_finished(&parent_events)
    );
    let child_events = events_of(f, child).await;
    let ended = turn_finished(&child_events);
    assert!(
        matches!(ended[..], [EventBody::TurnFinished { terminal_reason, .. }] if terminal_reason.as_str() == "aborted"),
        "{ended:?}"
    );
    assert!(!f.ws.path().join("a.txt").exists());
}

/// Attack review 15 #10: a `spawn_agent` prompt over the documented bound is refused with a
/// tool error the model sees, and no child session is created (nothing journaled twice).
async fn an_oversized_prompt_is_refused(b: Backend) {
    let big = "x".repeat(keel_runtime::MAX_SPAWN_PROMPT_BYTES + 1);
    let p = parent(
        b,
        &[
            json!({"tool_calls": [spawn("helper", &big)]}),
            json!({"text": "parent done"}),
        ],
        vec![("helper", vec![json!({"text": "never"})])],
        SubagentOptions::default(),
        parent_release(&[("helper", agent("helper", &[]))], Budget::default()),
        |_| {},
    )
    .await;
    let f = &p.f;
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].final_text, "parent done");
    let results = finished_outputs(&f.events().await);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].0, "failed", "{results:?}");
    let bound = format!("may hold is {} bytes", keel_runtime::MAX_SPAWN_PROMPT_BYTES);
    assert!(results[0].1.contains(&bound), "{results:?}");
    assert!(children_of(f, f.session).await.is_empty());
}

/// Attack review 15 #10: `max_concurrent` bounds one session's children, `max_descendants` the
/// whole tree below a top-level session: with 1, the child's own `spawn_agent` is refused with
/// a tool error naming the setting (not queued: the child holds the tree's only slot).
async fn live_descendants_of_a_tree_are_bounded(b: Backend) {
    let p = parent(
        b,
        &[
            json!({"tool_calls": [spawn("mid", "delegate")]}),
            json!({"text": "parent done"}),
        ],
        vec![(
            "mid",
            vec![
                json!({"tool_calls": [spawn("mid", "deeper")]}),
                json!({"text": "mid done"}),
            ],
        )],
        SubagentOptions {
            max_descendants: 1,
            ..SubagentOptions::default()
        },
        parent_release(&[("mid", agent("mid", &[]))], Budget::default()),
        |_| {},
    )
    .await;
    let f = &p.f;
    f.rt.submit(f.tenant, f.session, "go").await.unwrap();
    let run = f.rt.run(f.tenant, f.session);
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.turns[0].final_text, "parent done");
    let children = children_of(f, f.session).await;
    assert_eq!(children.len(), 1);
    assert!(children_of(f, children[0]).await.is_empty());
    let results = finished_outputs(&events_of(f, children[0]).await);
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].0, "failed", "{results:?}");
    assert!(results[0].1.contains("max_descendants"), "{results:?}");
    assert_eq!(
        finished_outputs(&f.events().await),
        vec![("succeeded".into(), "mid done".into())]
    );
}

on_both!(
    an_oversized_prompt_is_refused,
    live_descendants_of_a_tree_are_bounded,
    a_crashed_parent_reattaches_its_child,
    a_child_waiting_on_approval_surfaces_it_and_continues,
    a_restarted_parent_reattaches_its_waiting_child,
    cancelling_a_parent_whose_child_waits_cancels_the_child,
    a_child_inherits_the_parents_allow_rules,
    a_child_answers_as_one_tool_result,
    a_read_only_parent_gets_no_write_through_a_child,
    depth_is_bounded,
    concurrency_is_bounded,
    child_spend_counts_in_the_parent_budget,
    children_running_side_by_side_share_the_parent_budget,
    cancelling_the_parent_cancels_the_child,
    no_agents_no_spawn_agent,
);

/// Four children spawned in one step, each wanting six steps of 300 tokens with a read each,
/// under a parent turn budget of `budget`: the children draw on one pool (what the parent had
/// left), so together they overshoot it by at most one step each — not four times it, as when
/// each child got the whole remainder (attack review of issue 15: eight children spent 12,900
/// tokens of a 1,000-token budget). Returns the parent's turn and each child's turn
/// (steps, tokens, tool calls).
async fn four_children_under(
    b: Backend,
    budget: Budget,
) -> (keel_runtime::projection::TurnOutcome, Vec<(u32, u64, u32)>) {
    let names = ["c1", "c2", "c3", "c4"];
    let step = json!({
        "tool_calls": [call("read_file", json!({"path": "README.md"}))],
        "usage": {"input_tokens": 250, "output_tokens": 50}
    });
    let mut script: Vec<Value> = vec![step; 6];
    script.push(json!({"text": "done"}));
    let p = parent(
        b,
        &[
            json!({"tool_calls": names.iter().map(|n| spawn(n, "work")).collect::<Vec<_>>(),
                   "usage": {"input_tokens": 10, "output_tokens": 10}}),
            json!({"text": "never sampled"}),
        ],
        names.iter().map(|n| (*n, script.clone())).collect(),
        SubagentOptions::default(),
        parent_release(
            &names
                .iter()
                .map(|n| (*n, agent(n, &["read_file"])))
                .collect::<Vec<_>>(),
            Budget::default(),
        ),
        |c| c.turn_budget = budget,
    )
    .await;
    let f = &p.f;
    f.rt.submit(f.tenant, f.session, "work").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let mut children = Vec::new();
    for child in children_of(f, f.session).await {
        let view = f.rt.view(f.tenant, child).await.unwrap();
        let turn = view.state.turns.values().next().unwrap();
        children.push((
            u32::try_from(turn.steps.len()).unwrap(),
            turn.usage.total_tokens(),
            turn.tool_calls_run,
        ));
    }
    assert_eq!(children.len(), 4);
    (out.turns[0].clone(), children)
}

async fn children_running_side_by_side_share_the_parent_budget(b: Backend) {
    // Tokens: 1,000 for the turn, 20 spent by the parent's own step; each child step is 300.
    let (turn, children) = four_children_under(
        b,
        Budget {
            max_tokens: Some(1_000),
            ..Budget::default()
        },
    )
    .await;
    let spent: u64 = children.iter().map(|c| c.1).sum();
    assert!(
        spent <= 1_000 + 4 * 300,
        "the children spent {spent} tokens of at most 1,000 left: {children:?}"
    );
    assert!(spent >= 980, "the pool stopped them early: {children:?}");
    assert_eq!(
        turn.terminal_reason.as_str(),
        "budget_exhausted",
        "{turn:?}"
    );
    assert_eq!(turn.limit, Some(keel_core::BudgetLimit::Tokens));

    // Steps: 5 for the turn, 1 taken by the parent; without the pool each child would run 4.
    let (turn, children) = four_children_under(
        b,
        Budget {
            max_steps: Some(5),
            ..Budget::default()
        },
    )
    .await;
    let steps: u32 = children.iter().map(|c| c.0).sum();
    assert!(
        (4..=4 + 4).contains(&steps),
        "the children ran {steps} steps of 4 left: {children:?}"
    );
    assert_eq!(
        turn.terminal_reason.as_str(),
        "budget_exhausted",
        "{turn:?}"
    );
    assert_eq!(turn.limit, Some(keel_core::BudgetLimit::Steps));
    // The children's steps are in the parent's rows of the models that served them.
    let by_model: u32 = turn.usage_by_model.values().map(|t| t.steps).sum();
    assert_eq!(by_model, 1 + steps, "{:?}", turn.usage_by_model);

    // Tool calls: 10 for the turn, of which the four `spawn_agent` calls take 4 (1 to 4 of
    // them have started when the first child joins); each child step makes one.
    let (turn, children) = four_children_under(
        b,
        Budget {
            max_tool_calls: Some(10),
            ..Budget::default()
        },
    )
    .await;
    let calls: u32 = children.iter().map(|c| c.2).sum();
    assert!(
        (6..=9 + 4).contains(&calls),
        "the children ran {calls} tool calls of 6 to 9 left: {children:?}"
    );
    assert_eq!(
        turn.terminal_reason.as_str(),
        "budget_exhausted",
        "{turn:?}"
    );
}
