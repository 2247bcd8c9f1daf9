//! **budget_exhaustion.** Invariant: when a turn's tokens, cost (USD), steps, tool calls or
//! wall time run out mid-turn — spent by the turn itself or by a child session it spawned
//! (`spawn_agent`) — the turn ends `budget_exhausted` naming that limit, and what was spent
//! never exceeds the limit by more than one step per session running at the time (children
//! included). Spend is asserted exactly: every scripted step uses 100 input and 20 output
//! tokens (120; $1.00 at the test price of $0.01 per input token) and makes one tool call.
//!
//! Guarded mechanism: the budget check before each step and each tool call
//! (`plan::budget_exhausted`, checked in `new_step`; the wall-time timer cancelling the turn's
//! token), and the shared pool children draw on (`keel_runtime::spend`, `Facts::shared`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use keel_core::{
    AgentDefinition, Budget, BudgetLimit, Release, SessionId, TenantId, TerminalReason,
};
use keel_model::{ModelClient, Price, PriceTable};
use keel_runtime::TurnOutcome;
use keel_runtime::{ModelFactory, Runtime, RuntimeOptions, SubagentOptions};
use keel_store::SessionQuery;
use keel_testkit::db::{Backend, TestDb};
use serde_json::{Value, json};

use super::rig::{Dispatches, call, config, registry, release, runtime, scripted};

per_backend!(
    tokens_run_out_mid_turn,
    cost_runs_out_mid_turn,
    steps_run_out_mid_turn,
    tool_calls_run_out_mid_turn,
    wall_time_runs_out_mid_turn,
    children_side_by_side_overshoot_by_at_most_one_step_each,
);

/// Tokens of every scripted step.
const STEP_TOKENS: u64 = 120;
/// USD of every scripted step at [`prices`].
const STEP_USD: f64 = 1.0;

/// One step: a read of the README (one tool call), 100 + 20 tokens.
fn step_line() -> Value {
    json!({"tool_calls": [call("read_file", json!({"path": "README.md"}))],
           "usage": {"input_tokens": 100, "output_tokens": 20}})
}

/// `n` steps of [`step_line`], then an answer (never reached under the limits below).
fn steps(n: usize) -> Vec<Value> {
    let mut lines = vec![step_line(); n];
    lines.push(json!({"text": "finished without running out", "usage": {"input_tokens": 100, "output_tokens": 20}}));
    lines
}

/// $0.01 per input token for each of `models`.
fn prices(models: &[&Arc<dyn ModelClient>]) -> PriceTable {
    let mut p = PriceTable::default();
    for m in models {
        p.set(
            m.model(),
            Price {
                input: 10_000.0,
                output: 0.0,
                cache_read: 0.0,
                cache_write: 0.0,
            },
        );
    }
    p
}

/// A turn run under `budget`: by itself, or through `children` child sessions that it spawns
/// in its first step (a step of no tokens, so what the children start with does not depend on
/// when the parent's step is folded).
struct Limited {
    db: TestDb,
    rt: Runtime,
    tenant: TenantId,
    session: SessionId,
    _ws: tempfile::TempDir,
}

async fn limited(b: Backend, budget: Budget, children: usize, step_script: Vec<Value>) -> Limited {
    let db = TestDb::new(b).await;
    let child_model = scripted(&step_script);
    let names: Vec<String> = (1..=children).map(|i| format!("worker{i}")).collect();
    let parent_model = if children == 0 {
        scripted(&step_script)
    } else {
        scripted(&[
            json!({"tool_calls": names.iter().map(|n| call("spawn_agent", json!({"agent": n, "prompt": "work"}))).collect::<Vec<_>>(),
                   "usage": {"input_tokens": 0, "output_tokens": 0}}),
            json!({"text": "the parent's answer (never reached under the limits)"}),
        ])
    };
    let factory: ModelFactory = {
        let m = child_model.clone();
        Arc::new(move |_route: &[String]| Ok::<_, String>(m.clone()))
    };
    let opts = RuntimeOptions {
        prices: prices(&[&parent_model, &child_model]),
        subagents: SubagentOptions {
            models: Some(factory),
            ..SubagentOptions::default()
        },
        ..RuntimeOptions::default()
    };
    let rt = runtime(
        db.store.clone(),
        parent_model,
        registry(&Dispatches::default()),
        opts,
    );
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("README.md"), "hello\n").unwrap();
    let mut rel = release(&[], Budget::default()).definition;
    rel.agents = names
        .iter()
        .map(|n| {
            (
                n.clone(),
                AgentDefinition {
                    name: n.clone(),
                    model_route: vec![n.clone()],
                    instructions: "You are a worker.".into(),
                    tools: vec!["read_file".into(), "wait".into()],
                    policy: Value::Null,
                    budget: Budget::default(),
                    mcp_servers: BTreeMap::new(),
                    agents: BTreeMap::new(),
                },
            )
        })
        .collect();
    let tenant = TenantId::new();
    let mut cfg = config(ws.path());
    cfg.turn_budget = budget;
    let session = rt
        .create_session(tenant, &Release::new(rel), cfg)
        .await
        .unwrap();
    rt.submit(tenant, session, "spend").await.unwrap();
    Limited {
        db,
        rt,
        tenant,
        session,
        _ws: ws,
    }
}

impl Limited {
    /// Runs the turn to its end; its outcome.
    async fn run(&self) -> TurnOutcome {
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            self.rt.run(self.tenant, self.session),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(out.turns.len(), 1, "{out:?}");
        out.turns[0].clone()
    }

    /// Each child's finished turn.
    async fn children(&self) -> Vec<TurnOutcome> {
        let rows = self
            .db
            .store
            .list_sessions(
                self.tenant,
                &SessionQuery {
                    parent_session_id: Some(self.session),
                    ..SessionQuery::default()
                },
            )
            .await
            .unwrap();
        let mut turns = Vec::new();
        for r in rows {
            // A child the parent's end cancelled finishes its turn on its own (a correctness
            // deadline with a wide margin).
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                let view = self.rt.view(self.tenant, r.session_id).await.unwrap();
                if let Some(t) = view.turns.first() {
                    assert_eq!(
                        view.turns.len(),
                        1,
                        "child {}: {:?}",
                        r.session_id,
                        view.turns
                    );
                    turns.push(t.clone());
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "child {}: its turn did not end within 20 s: {:?}",
                    r.session_id,
                    view.state.status
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        turns
    }
}

/// Asserts `t` ended `budget_exhausted` naming `limit`.
fn exhausted(t: &TurnOutcome, limit: BudgetLimit) {
    assert_eq!(
        (t.terminal_reason, t.limit),
        (TerminalReason::BudgetExhausted, Some(limit)),
        "{t:?}"
    );
}

/// Asserts the child ran `n` scripted steps, exactly their tokens and cost, and ended naming
/// `limit`.
fn child_spent(c: &TurnOutcome, n: u32, limit: BudgetLimit) {
    exhausted(c, limit);
    assert_eq!(c.num_steps, n, "{c:?}");
    assert_eq!(c.usage.total_tokens(), u64::from(n) * STEP_TOKENS, "{c:?}");
    assert!((c.cost_usd - f64::from(n) * STEP_USD).abs() < 1e-9, "{c:?}");
}

/// 300 tokens: steps of 120 reach 240, then 360 — the third step crosses the limit (by 60,
/// less than one step) and no fourth starts. Through a child: the child starts with the 300
/// and does the same; the parent's next step is refused for the child's 360.
async fn tokens_run_out_mid_turn(b: Backend) {
    let budget = Budget {
        max_tokens: Some(300),
        ..Budget::default()
    };
    let t = limited(b, budget, 0, steps(10)).await.run().await;
    exhausted(&t, BudgetLimit::Tokens);
    assert_eq!(
        (t.num_steps, t.usage.total_tokens()),
        (3, 3 * STEP_TOKENS),
        "{t:?}"
    );

    let l = limited(b, budget, 1, steps(10)).await;
    let t = l.run().await;
    exhausted(&t, BudgetLimit::Tokens);
    let children = l.children().await;
    assert_eq!(children.len(), 1);
    child_spent(&children[0], 3, BudgetLimit::Tokens);
    assert_eq!(
        (t.num_steps, t.usage.total_tokens()),
        (1, 3 * STEP_TOKENS),
        "the parent's own step and the child's usage: {t:?}"
    );
}

/// $2.50: steps of $1.00 reach $3.00 on the third, and no fourth starts; the same through a
/// child.
async fn cost_runs_out_mid_turn(b: Backend) {
    let budget = Budget {
        max_cost_usd: Some(2.5),
        ..Budget::default()
    };
    let t = limited(b, budget, 0, steps(10)).await.run().await;
    exhausted(&t, BudgetLimit::Cost);
    assert_eq!(t.num_steps, 3, "{t:?}");
    assert!((t.cost_usd - 3.0 * STEP_USD).abs() < 1e-9, "{t:?}");

    let l = limited(b, budget, 1, steps(10)).await;
    let t = l.run().await;
    exhausted(&t, BudgetLimit::Cost);
    let children = l.children().await;
    child_spent(&children[0], 3, BudgetLimit::Cost);
    assert!((t.cost_usd - 3.0 * STEP_USD).abs() < 1e-9, "{t:?}");
}

/// 3 steps: exactly three run. Through a child: the parent's spawning step is one, so the child
/// has two left — or three when it started before that step was folded (the one step of the
/// running parent the bound allows); the turn counts them all.
async fn steps_run_out_mid_turn(b: Backend) {
    let budget = Budget {
        max_steps: Some(3),
        ..Budget::default()
    };
    let t = limited(b, budget, 0, steps(10)).await.run().await;
    exhausted(&t, BudgetLimit::Steps);
    assert_eq!(
        (t.num_steps, t.usage.total_tokens()),
        (3, 3 * STEP_TOKENS),
        "{t:?}"
    );

    let l = limited(b, budget, 1, steps(10)).await;
    let t = l.run().await;
    exhausted(&t, BudgetLimit::Steps);
    let c = &l.children().await[0];
    assert!(
        (2..=3).contains(&c.num_steps),
        "the child ran {} steps of 2 left: {c:?}",
        c.num_steps
    );
    child_spent(c, c.num_steps, BudgetLimit::Steps);
    let by_model: u32 = t.usage_by_model.values().map(|m| m.steps).sum();
    assert_eq!(by_model, 1 + c.num_steps, "{t:?}");
    assert_eq!(
        t.usage.total_tokens(),
        u64::from(c.num_steps) * STEP_TOKENS,
        "{t:?}"
    );
}

/// 3 tool calls, one per step: three steps run their calls and the fourth is not started.
/// Through a child: the `spawn_agent` call is the first (started before the child exists), so
/// the child makes two.
async fn tool_calls_run_out_mid_turn(b: Backend) {
    let budget = Budget {
        max_tool_calls: Some(3),
        ..Budget::default()
    };
    let t = limited(b, budget, 0, steps(10)).await.run().await;
    exhausted(&t, BudgetLimit::ToolCalls);
    assert_eq!(
        (t.num_steps, t.usage.total_tokens()),
        (3, 3 * STEP_TOKENS),
        "{t:?}"
    );

    let l = limited(b, budget, 1, steps(10)).await;
    let t = l.run().await;
    exhausted(&t, BudgetLimit::ToolCalls);
    let c = &l.children().await[0];
    child_spent(c, 2, BudgetLimit::ToolCalls);
    let view = l.rt.view(l.tenant, l.session).await.unwrap();
    let turn = view.state.turns.values().next().unwrap();
    assert_eq!(
        turn.tool_calls_run + turn.subagents.tool_calls,
        3,
        "{turn:?}"
    );
}

/// 500 ms of wall time, steps whose call waits 200 ms: the turn is stopped while a step runs
/// (by the third on an idle machine; its call gets its one result) and ends naming wall time.
/// Through a child (2 s, so the child exists before the clock runs out on a loaded machine):
/// the child's clock is what the parent had left; the parent's turn ends naming wall time too,
/// and holds exactly the child's steps' usage.
async fn wall_time_runs_out_mid_turn(b: Backend) {
    let waiting: Vec<Value> = (0..10)
        .map(|_| json!({"tool_calls": [call("wait", json!({"ms": 200}))], "usage": {"input_tokens": 100, "output_tokens": 20}}))
        .collect();
    let budget = Budget {
        max_wall_time_ms: Some(500),
        ..Budget::default()
    };
    let t = limited(b, budget, 0, waiting.clone()).await.run().await;
    exhausted(&t, BudgetLimit::WallTime);
    assert!(t.num_steps <= 3, "{t:?}");
    assert_eq!(
        t.usage.total_tokens(),
        u64::from(t.num_steps) * STEP_TOKENS,
        "{t:?}"
    );
    assert!((500..5_000).contains(&t.duration_ms), "{t:?}");

    let budget = Budget {
        max_wall_time_ms: Some(2_000),
        ..Budget::default()
    };
    let l = limited(b, budget, 1, waiting).await;
    let t = l.run().await;
    exhausted(&t, BudgetLimit::WallTime);
    let children = l.children().await;
    assert_eq!(
        children.len(),
        1,
        "the child was spawned before the clock ran out"
    );
    let c = &children[0];
    assert!(
        matches!(
            c.terminal_reason,
            TerminalReason::BudgetExhausted | TerminalReason::Aborted
        ),
        "the child is stopped by its clock or the parent's: {c:?}"
    );
    assert!(c.num_steps <= 10, "{c:?}");
    assert_eq!(
        t.usage.total_tokens(),
        u64::from(c.num_steps) * STEP_TOKENS,
        "{t:?}"
    );
    assert!((2_000..20_000).contains(&t.duration_ms), "{t:?}");
}

/// Four children spawned in one step run side by side under the parent's 1,000 tokens: they
/// draw on one pool, so together they spend at least the limit (the pool stopped them, not
/// their scripts) and at most one step each beyond it; the parent's turn holds exactly what
/// the children's steps used.
async fn children_side_by_side_overshoot_by_at_most_one_step_each(b: Backend) {
    let budget = Budget {
        max_tokens: Some(1_000),
        ..Budget::default()
    };
    let l = limited(b, budget, 4, steps(10)).await;
    let t = l.run().await;
    exhausted(&t, BudgetLimit::Tokens);
    let children = l.children().await;
    assert_eq!(children.len(), 4);
    let mut spent = 0;
    for c in &children {
        assert_eq!(
            c.usage.total_tokens(),
            u64::from(c.num_steps) * STEP_TOKENS,
            "{c:?}"
        );
        spent += c.usage.total_tokens();
    }
    assert!(
        (1_000..=1_000 + 4 * STEP_TOKENS).contains(&spent),
        "the children spent {spent} tokens of 1,000: {children:?}"
    );
    assert_eq!(t.usage.total_tokens(), spent, "{t:?}");
}
