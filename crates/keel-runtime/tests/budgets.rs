//! Budgets (per turn, per session, per tenant day) and loop breaking.

use keel_core::{Budget, BudgetLimit, EventBody, TerminalReason};
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    max_steps_ends_the_turn_with_budget_exhausted_naming_steps,
    a_token_budget_ends_the_turn_naming_tokens,
    a_tool_call_budget_ends_the_turn_naming_tool_calls,
    a_session_budget_counts_every_turn,
    the_same_failing_call_three_times_ends_the_turn_with_loop_detected,
    a_tenant_daily_token_budget_spans_sessions,
);

fn sleepy_lines(n: usize) -> Vec<serde_json::Value> {
    (0..n)
        .map(|i| json!({"tool_calls": [call("sleep", json!({"ms": i}))], "usage": {"input_tokens": 10, "output_tokens": 5}}))
        .collect()
}

/// Checks `turn.finished` carries everything and returns it.
async fn finished(f: &Fixture) -> EventBody {
    let evs = f.events().await;
    let last_turn_event = evs
        .iter()
        .rev()
        .find(|e| e.correlation.turn_id.is_some())
        .unwrap();
    assert_eq!(
        last_turn_event.type_name(),
        "turn.finished",
        "the turn's last event"
    );
    last_turn_event.body.clone()
}

async fn max_steps_ends_the_turn_with_budget_exhausted_naming_steps(b: Backend) {
    let f = fixture_with(
        b,
        scripted(&sleepy_lines(5)),
        &[],
        Budget {
            max_steps: Some(2),
            ..Budget::default()
        },
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "loop").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let t = &out.turns[0];
    assert_eq!(
        (t.terminal_reason, t.limit, t.num_steps),
        (TerminalReason::BudgetExhausted, Some(BudgetLimit::Steps), 2)
    );
    let EventBody::TurnFinished {
        usage,
        num_steps,
        duration_ms,
        cost_usd,
        ..
    } = finished(&f).await
    else {
        panic!()
    };
    assert_eq!(
        (usage.input_tokens, usage.output_tokens, num_steps),
        (20, 10, 2)
    );
    assert!(cost_usd >= 0.0 && duration_ms < 60_000);
}

async fn a_token_budget_ends_the_turn_naming_tokens(b: Backend) {
    let f = fixture(b, &sleepy_lines(5), |c| c.turn_budget.max_tokens = Some(30)).await;
    f.rt.submit(f.tenant, f.session, "loop").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let t = &out.turns[0];
    assert_eq!(
        (t.terminal_reason, t.limit, t.num_steps),
        (
            TerminalReason::BudgetExhausted,
            Some(BudgetLimit::Tokens),
            2
        )
    );
    finished(&f).await;
}

async fn a_tool_call_budget_ends_the_turn_naming_tool_calls(b: Backend) {
    let f = fixture(b, &sleepy_lines(5), |c| {
        c.turn_budget.max_tool_calls = Some(3)
    })
    .await;
    f.rt.submit(f.tenant, f.session, "loop").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let t = &out.turns[0];
    assert_eq!(
        (t.terminal_reason, t.limit, t.num_steps),
        (
            TerminalReason::BudgetExhausted,
            Some(BudgetLimit::ToolCalls),
            3
        )
    );
}

async fn a_session_budget_counts_every_turn(b: Backend) {
    let f = fixture(b, &[json!({"text": "one"}), json!({"text": "two"})], |c| {
        c.session_budget.max_steps = Some(1)
    })
    .await;
    f.rt.submit(f.tenant, f.session, "first").await.unwrap();
    f.rt.submit(f.tenant, f.session, "second").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let got: Vec<_> = out
        .turns
        .iter()
        .map(|t| (t.terminal_reason, t.limit))
        .collect();
    assert_eq!(
        got,
        [
            (TerminalReason::Completed, None),
            (TerminalReason::BudgetExhausted, Some(BudgetLimit::Steps))
        ]
    );
}

async fn the_same_failing_call_three_times_ends_the_turn_with_loop_detected(b: Backend) {
    let missing = json!({"tool_calls": [call("read_file", json!({"path": "missing.txt"}))]});
    let f = fixture(
        b,
        &[
            missing.clone(),
            missing.clone(),
            missing.clone(),
            missing,
            json!({"text": "never"}),
        ],
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "read it").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let t = &out.turns[0];
    assert_eq!(
        (t.terminal_reason, t.num_steps),
        (TerminalReason::LoopDetected, 3),
        "{t:?}"
    );
    finished(&f).await;
}

async fn a_tenant_daily_token_budget_spans_sessions(b: Backend) {
    let f = fixture(
        b,
        &[json!({"text": "one", "usage": {"input_tokens": 50, "output_tokens": 50}})],
        |c| c.tenant_daily_budget.max_tokens = Some(100),
    )
    .await;
    f.rt.submit(f.tenant, f.session, "first").await.unwrap();
    assert_eq!(
        f.rt.run(f.tenant, f.session).await.unwrap().turns[0].terminal_reason,
        TerminalReason::Completed
    );
    // A second session of the same tenant, same day: the tenant's 100 tokens are spent.
    let mut cfg = config(f.ws.path());
    cfg.tenant_daily_budget.max_tokens = Some(100);
    let s2 =
        f.rt.create_session(f.tenant, &release(&[], Budget::default()), cfg)
            .await
            .unwrap();
    f.rt.submit(f.tenant, s2, "second").await.unwrap();
    let out = f.rt.run(f.tenant, s2).await.unwrap();
    assert_eq!(
        (out.turns[0].terminal_reason, out.turns[0].limit),
        (TerminalReason::BudgetExhausted, Some(BudgetLimit::Tokens))
    );
}
