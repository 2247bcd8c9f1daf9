//! Usage accounting that cannot be fooled: responses without usage are estimated (and still
//! priced and budgeted), failed attempts count what they used, absurd reports are capped, and
//! the transcript shows each response only its own calls (issue 10, review items F, G, H, L and
//! the minor items on call ids and abandoned attempts).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use keel_core::{Budget, BudgetLimit, EventBody, TerminalReason, Usage};
use keel_model::{ErrorKind, ModelClient, Wire};
use keel_testkit::{FakeModelServer, FakeResponse, Handler, Pacing, RecordedRequest, Reply};
use serde_json::{Value, json};

use crate::common::*;
use crate::on_both;

on_both!(
    a_response_without_usage_is_estimated_and_cost_and_token_budgets_still_bind,
    usage_of_failed_attempts_counts_in_the_turn_the_budget_and_the_usage_table,
    an_impossible_usage_report_is_capped_and_the_session_goes_on,
    a_spent_tool_call_budget_is_reported_before_a_loop,
    a_tool_call_without_an_id_gets_one_before_it_goes_back_to_the_provider,
    a_read_only_call_of_a_failed_attempt_is_not_shown_as_the_answering_attempt_s,
);

/// A fake server whose n-th request (from 0) is answered by `reply(n)`.
async fn server(reply: impl Fn(usize) -> Reply + Send + Sync + 'static) -> FakeModelServer {
    let n = Arc::new(AtomicUsize::new(0));
    let handler: Handler =
        Arc::new(move |_: &RecordedRequest| reply(n.fetch_add(1, Ordering::SeqCst)));
    FakeModelServer::start(handler, Pacing::default())
        .await
        .unwrap()
}

fn http_model(server: &FakeModelServer, wire: Wire, model: &str) -> Arc<dyn ModelClient> {
    Arc::new(
        keel_model::HttpModel::new(
            wire,
            keel_model::ProviderConfig::new(model)
                .with_base_url(server.base_url(wire))
                .with_api_key("k"),
        )
        .unwrap(),
    )
}

/// `response`'s Chat frames without the usage chunk (servers that ignore `include_usage`).
fn chat_without_usage(response: &FakeResponse) -> Reply {
    let frames: Vec<String> = keel_testkit::encode(Wire::OpenaiChat, response)
        .into_iter()
        .filter(|f| !f.contains("\"usage\""))
        .collect();
    assert!(frames.iter().any(|f| f.contains("[DONE]")));
    Reply::Frames(frames)
}

fn today() -> String {
    chrono::Utc::now().format("%Y-%m-%d").to_string()
}

fn completed_steps(evs: &[keel_core::Event]) -> Vec<(Usage, f64, bool)> {
    evs.iter()
        .filter_map(|e| match &e.body {
            EventBody::StepCompleted {
                usage,
                cost_usd,
                usage_estimated,
                ..
            } => Some((*usage, *cost_usd, *usage_estimated)),
            _ => None,
        })
        .collect()
}

/// Review item F: `openai:gpt-4o` on a server that sends no usage chunk, five tool-call steps
/// and `max_cost_usd = 0.00001`. Before, every step cost $0 and the turn completed all six;
/// now the step's tokens are estimated (context sent, output received), priced at gpt-4o's
/// price and marked `usage_estimated`, so the cost budget ends the turn after the first step.
/// The same for a token budget, and for the tenant's daily budget (its usage rows count the
/// estimate, so the reservation binds).
async fn a_response_without_usage_is_estimated_and_cost_and_token_budgets_still_bind(b: Backend) {
    let srv = server(|n| {
        if n < 5 {
            chat_without_usage(&FakeResponse::text("").with_tool_call(
                &format!("call_{n}"),
                "list_dir",
                r#"{"path": "."}"#,
            ))
        } else {
            chat_without_usage(&FakeResponse::text("all listed"))
        }
    })
    .await;
    let model = http_model(&srv, Wire::OpenaiChat, "gpt-4o");
    let f = fixture_with(
        b,
        model.clone(),
        &[],
        Budget {
            max_cost_usd: Some(0.000_01),
            ..Budget::default()
        },
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "list it").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let t = &out.turns[0];
    assert_eq!(
        (t.terminal_reason, t.limit, t.num_steps),
        (TerminalReason::BudgetExhausted, Some(BudgetLimit::Cost), 1),
        "{t:?}"
    );
    let steps = completed_steps(&f.events().await);
    assert_eq!(steps.len(), 1);
    let (usage, cost, estimated) = steps[0];
    assert!(estimated, "marked as an estimate");
    assert!(usage.input_tokens > 100, "the context sent: {usage:?}");
    assert!(usage.output_tokens > 0, "the call received: {usage:?}");
    let price = keel_model::PriceTable::default()
        .cost_usd(
            "gpt-4o",
            &keel_model::Usage {
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                ..keel_model::Usage::default()
            },
        )
        .unwrap();
    assert!(
        cost > 0.0 && (cost - price).abs() < 1e-12,
        "{cost} vs {price}"
    );
    assert_eq!(t.usage, usage);
    assert!(t.usage_by_model["gpt-4o"].estimated);
    let rows =
        f.db.store
            .usage(f.tenant, &today(), &today())
            .await
            .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].usage, usage, "the usage table counts the estimate");

    // A token budget binds the same way.
    let f = fixture_with(
        b,
        model.clone(),
        &[],
        Budget {
            max_tokens: Some(10),
            ..Budget::default()
        },
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "list it").await.unwrap();
    let t = f.rt.run(f.tenant, f.session).await.unwrap().turns[0].clone();
    assert_eq!(
        (t.terminal_reason, t.limit, t.num_steps),
        (
            TerminalReason::BudgetExhausted,
            Some(BudgetLimit::Tokens),
            1
        ),
        "{t:?}"
    );

    // And the tenant's day: the second session of the tenant finds the day spent.
    let f = fixture_with(b, model, &[], Budget::default(), |c| {
        c.tenant_daily_budget.max_cost_usd = Some(0.000_01);
    })
    .await;
    f.rt.submit(f.tenant, f.session, "list it").await.unwrap();
    let t = f.rt.run(f.tenant, f.session).await.unwrap().turns[0].clone();
    assert_eq!(
        (t.terminal_reason, t.limit),
        (TerminalReason::BudgetExhausted, Some(BudgetLimit::Cost)),
        "{t:?}"
    );
    assert!(t.num_steps <= 2, "{t:?}");
}

/// An Anthropic `message_start` counting `input_tokens` of prompt, a text delta, then an
/// in-stream `overloaded` error.
fn counted_then_failed(input_tokens: u64) -> Reply {
    let start = json!({"type": "message_start", "message": {"id": "msg_x", "type": "message",
        "role": "assistant", "content": [], "model": "claude-sonnet-4-5",
        "usage": {"input_tokens": input_tokens, "output_tokens": 1}}});
    let block = json!({"type": "content_block_start", "index": 0,
        "content_block": {"type": "text", "text": ""}});
    let delta = json!({"type": "content_block_delta", "index": 0,
        "delta": {"type": "text_delta", "text": "Let me"}});
    let frame = |name: &str, v: &Value| format!("event: {name}\ndata: {v}\n\n");
    Reply::Frames(vec![
        frame("message_start", &start),
        frame("content_block_start", &block),
        frame("content_block_delta", &delta),
        keel_testkit::stream_error_frame(Wire::Anthropic, ErrorKind::Overloaded),
    ])
}

/// Review item G: three Anthropic attempts each count 100,000 prompt tokens and then fail with
/// an `error` event; the fourth answers (10 tokens) with a call. Before, the retries reset the
/// step's usage: the turn, the budget and the usage table saw 10 tokens. Now each failed
/// attempt's usage is journaled (`step.attempt_failed`), counted in the turn's totals under the
/// model that served it, in the tenant's usage rows, and by the cost budget (which ends the
/// turn before a second step).
async fn usage_of_failed_attempts_counts_in_the_turn_the_budget_and_the_usage_table(b: Backend) {
    let srv = server(|n| match n {
        0..=2 => counted_then_failed(100_000),
        3 => {
            let mut r =
                FakeResponse::text("").with_tool_call("toolu_1", "list_dir", r#"{"path": "."}"#);
            r.usage = keel_model::Usage {
                input_tokens: 10,
                output_tokens: 5,
                ..keel_model::Usage::default()
            };
            Reply::Respond(r)
        }
        _ => Reply::Respond(FakeResponse::text("done")),
    })
    .await;
    let route = keel_model::ModelRoute::new(
        vec![http_model(&srv, Wire::Anthropic, "claude-sonnet-4-5")],
        keel_model::RetryPolicy {
            max_attempts: 4,
            base_delay_ms: 1,
            max_delay_ms: 2,
            max_retry_after_ms: 1_000,
        },
    )
    .unwrap();
    let f = fixture_with(
        b,
        Arc::new(route),
        &[],
        Budget {
            max_cost_usd: Some(0.05),
            ..Budget::default()
        },
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "list it").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let t = &out.turns[0];
    assert_eq!(
        (t.terminal_reason, t.limit, t.num_steps),
        (TerminalReason::BudgetExhausted, Some(BudgetLimit::Cost), 1),
        "the failed attempts' $0.90 spent the $0.05 budget: {t:?}"
    );
    let evs = f.events().await;
    let failed: Vec<Usage> = evs
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::StepAttemptFailed { usage, model, .. } => {
                assert_eq!(model, "claude-sonnet-4-5");
                Some(*usage)
            }
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 3);
    assert!(
        failed.iter().all(|u| u.input_tokens == 100_000),
        "{failed:?}"
    );
    assert_eq!(t.usage.input_tokens, 300_010, "{t:?}");
    assert_eq!(t.usage.output_tokens, 3 + 5, "{t:?}");
    // $3/M input, $15/M output.
    let expected = (300_010.0 * 3.0 + 8.0 * 15.0) / 1e6;
    assert!((t.cost_usd - expected).abs() < 1e-9, "{t:?}");
    let by = &t.usage_by_model["claude-sonnet-4-5"];
    assert_eq!((by.usage, by.steps), (t.usage, 1));
    let rows =
        f.db.store
            .usage(f.tenant, &today(), &today())
            .await
            .unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        rows[0].usage, t.usage,
        "the usage table counts every attempt"
    );
    assert!((rows[0].cost_usd - expected).abs() < 1e-9);
    assert_eq!(rows[0].steps, 1);
    // The turn's end says the same.
    let finished = evs
        .iter()
        .find_map(|e| match &e.body {
            EventBody::TurnFinished { usage, .. } => Some(*usage),
            _ => None,
        })
        .unwrap();
    assert_eq!(finished, t.usage);
}

/// Review item H: a scripted response reporting 2^63 input tokens made the usage row refuse the
/// value ("does not fit a 63-bit integer"): the run failed, the session stayed `running` with
/// its turn started, and every resume failed the same way. Two reports near `i64::MAX` made the
/// SQLite row a REAL. Now a report is capped at `MAX_RESPONSE_TOKENS` per field: the turn
/// completes, sums stay exact integers, and the session takes the next turn.
async fn an_impossible_usage_report_is_capped_and_the_session_goes_on(b: Backend) {
    let cap = keel_core::MAX_RESPONSE_TOKENS;
    let lines: Vec<Value> = vec![
        serde_json::from_str(r#"{"text":"a","usage":{"input_tokens":9223372036854775808}}"#)
            .unwrap(),
        serde_json::from_str(
            r#"{"tool_calls":[{"name":"list_dir","arguments":{"path":"."}}],"usage":{"input_tokens":9223372036854775000,"output_tokens":18446744073709551615}}"#,
        )
        .unwrap(),
        serde_json::from_str(
            r#"{"text":"b","usage":{"input_tokens":9223372036854775000,"output_tokens":9223372036854775000}}"#,
        )
        .unwrap(),
    ];
    let f = fixture(b, &lines, |_| {}).await;
    f.rt.submit(f.tenant, f.session, "one").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let t = &out.turns[0];
    assert_eq!(t.terminal_reason, TerminalReason::Completed, "{t:?}");
    assert_eq!(t.usage.input_tokens, cap);
    // Not stuck: the next turn runs, over two steps near the limit.
    f.rt.submit(f.tenant, f.session, "two").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let t = &out.turns[0];
    assert_eq!(
        (t.terminal_reason, t.num_steps),
        (TerminalReason::Completed, 2),
        "{t:?}"
    );
    assert_eq!(
        (t.usage.input_tokens, t.usage.output_tokens),
        (2 * cap, 2 * cap)
    );
    let view = f.rt.view(f.tenant, f.session).await.unwrap();
    assert_eq!(view.state.usage.input_tokens, 3 * cap);
    let rows =
        f.db.store
            .usage(f.tenant, &today(), &today())
            .await
            .unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (
            rows[0].usage.input_tokens,
            rows[0].usage.output_tokens,
            rows[0].steps
        ),
        (3 * cap, 2 * cap, 3),
        "exact integers in the usage table"
    );
}

/// Review item L: `max_tool_calls = 1` and one step proposing four identical `list_dir`
/// calls: one runs, three are refused by the budget with the same text. Before, those
/// refusals read as a loop (`loop_detected`, exit 6); the spent budget is what ended the turn.
async fn a_spent_tool_call_budget_is_reported_before_a_loop(b: Backend) {
    let ls = call("list_dir", json!({"path": "."}));
    let lines = [
        json!({"tool_calls": [ls.clone(), ls.clone(), ls.clone(), ls]}),
        json!({"text": "done"}),
    ];
    let f = fixture_with(
        b,
        scripted(&lines),
        &[],
        Budget {
            max_tool_calls: Some(1),
            ..Budget::default()
        },
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "list").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    let t = &out.turns[0];
    assert_eq!(
        (t.terminal_reason, t.limit),
        (
            TerminalReason::BudgetExhausted,
            Some(BudgetLimit::ToolCalls)
        ),
        "{t:?}"
    );
}

/// A call the model proposed with the id `""` is given an id before it is journaled, so the
/// transcript (and the next request) never carries an empty or duplicated call id.
async fn a_tool_call_without_an_id_gets_one_before_it_goes_back_to_the_provider(b: Backend) {
    let ls = |path: &str| {
        FakeResponse::text("").with_tool_call("", "list_dir", &format!(r#"{{"path": "{path}"}}"#))
    };
    let srv = server(move |n| match n {
        0 => {
            let mut r = ls(".");
            r.tool_calls.push(keel_testkit::FakeToolCall {
                id: String::new(),
                name: "list_dir".into(),
                arguments: r#"{"path": "sub"}"#.into(),
            });
            Reply::Respond(r)
        }
        _ => Reply::Respond(FakeResponse::text("listed")),
    })
    .await;
    let f = fixture_with(
        b,
        http_model(&srv, Wire::OpenaiChat, "gpt-4o"),
        &[],
        Budget::default(),
        |_| {},
    )
    .await;
    std::fs::create_dir(f.ws.path().join("sub")).unwrap();
    f.rt.submit(f.tenant, f.session, "list").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    let ids: Vec<String> = f
        .events()
        .await
        .iter()
        .filter(|e| e.type_name() == "tool_call.proposed")
        .map(|e| e.correlation.tool_call_id.clone().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids.iter().all(|id| !id.is_empty()), "{ids:?}");
    assert_ne!(ids[0], ids[1]);
    // The second request sends both calls and both results, under those ids.
    let reqs = srv.requests();
    let messages = reqs[1].body["messages"].as_array().unwrap();
    let sent: Vec<&str> = messages
        .iter()
        .filter_map(|m| m["tool_calls"].as_array())
        .flatten()
        .filter_map(|c| c["id"].as_str())
        .chain(messages.iter().filter_map(|m| m["tool_call_id"].as_str()))
        .collect();
    assert_eq!(sent.len(), 4, "{messages:#?}");
    assert!(
        sent.iter().all(|id| ids.iter().any(|i| i == id)),
        "{sent:?}"
    );
}

/// Minor item: on the Anthropic wire a read-only call starts as soon as its block ends, while
/// the response streams. When that attempt then fails and a retry answers differently, the call
/// the failed attempt made is not the answer's: the next request's assistant message holds only
/// the answering attempt's calls, and no result of the abandoned one.
async fn a_read_only_call_of_a_failed_attempt_is_not_shown_as_the_answering_attempt_s(b: Backend) {
    let srv = server(|n| match n {
        0 => {
            // A complete `list_dir` block, then an in-stream error.
            let mut frames = keel_testkit::encode(
                Wire::Anthropic,
                &FakeResponse::text("").with_tool_call("toolu_old", "list_dir", r#"{"path": "."}"#),
            );
            let stop = frames
                .iter()
                .position(|f| f.contains("content_block_stop"))
                .unwrap();
            frames.truncate(stop + 1);
            frames.push(keel_testkit::stream_error_frame(
                Wire::Anthropic,
                ErrorKind::Overloaded,
            ));
            Reply::Frames(frames)
        }
        1 => Reply::Respond(FakeResponse::text("").with_tool_call(
            "toolu_new",
            "read_file",
            r#"{"path": "README.md"}"#,
        )),
        _ => Reply::Respond(FakeResponse::text("done")),
    })
    .await;
    let route = keel_model::ModelRoute::new(
        vec![http_model(&srv, Wire::Anthropic, "claude-sonnet-4-5")],
        keel_model::RetryPolicy {
            max_attempts: 2,
            base_delay_ms: 50,
            max_delay_ms: 50,
            max_retry_after_ms: 1_000,
        },
    )
    .unwrap();
    let f = fixture_with(b, Arc::new(route), &[], Budget::default(), |_| {}).await;
    f.rt.submit(f.tenant, f.session, "look").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].terminal_reason, TerminalReason::Completed);
    let evs = f.events().await;
    // The abandoned call was journaled (it ran or was stopped), and the step says it was
    // abandoned.
    assert!(
        evs.iter().any(|e| e.type_name() == "tool_call.proposed"
            && e.correlation
                .tool_call_id
                .as_ref()
                .is_some_and(|c| c.as_str() == "toolu_old")),
        "the failed attempt proposed toolu_old"
    );
    let abandoned: Vec<String> = evs
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::StepCompleted {
                abandoned_calls, ..
            } if !abandoned_calls.is_empty() => Some(
                abandoned_calls
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>(),
            ),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(abandoned, ["toolu_old"]);
    // What the model saw next: only its own call and result.
    let reqs = srv.requests();
    assert_eq!(reqs.len(), 3);
    let body = reqs[2].body.to_string();
    assert!(body.contains("toolu_new"), "{body}");
    assert!(!body.contains("toolu_old"), "{body}");
    assert!(reqs[2].unanswered_tool_calls().is_empty());
}
