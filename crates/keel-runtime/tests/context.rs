//! The projected context — what the model sees — as an insta snapshot. A diff here is a
//! reviewable change of model-visible behaviour.

use keel_core::Budget;
use serde_json::json;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_projected_context_after_a_multi_step_turn() {
    let lines = [
        json!({"text": "Reading first.", "tool_calls": [call("read_file", json!({"path": "README.md"})), call("counter", json!({"label": "one"}))]}),
        json!({"text": "Counted.", "tool_calls": [call("read_file", json!({"path": "missing.txt"}))]}),
        json!({"text": "All done: the readme greets you."}),
    ];
    let f = fixture_with(
        Backend::Sqlite,
        scripted(&lines),
        &["read_file", "counter"],
        Budget::default(),
        |_| {},
    )
    .await;
    std::fs::write(
        f.ws.path().join("AGENTS.md"),
        "Run the tests before you finish.\n",
    )
    .unwrap();
    f.rt.submit(f.tenant, f.session, "Read the readme and count once.")
        .await
        .unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    f.rt.submit(f.tenant, f.session, "Thanks!").await.unwrap();
    let ctx = f.rt.project_context(f.tenant, f.session).await.unwrap();
    let tools: Vec<_> = ctx
        .tools
        .iter()
        .map(|t| json!({"name": t.name, "parameters": t.parameters}))
        .collect();
    let view = json!({
        "instructions": ctx.instructions,
        "tools": tools,
        "messages": serde_json::to_value(&ctx).unwrap()["messages"],
        "first_item": ctx.first_item,
        "estimated_tokens": ctx.estimated_tokens,
    });
    insta::assert_json_snapshot!(view);
}
