use std::sync::Arc;

use async_trait::async_trait;
use keel_tools::registry::{Dispatch, ToolCallRequest};
use keel_tools::tool::{EffectClass, Tool, ToolContext, ToolOutput, ToolResultStatus};
use serde_json::{Value, json};

use crate::common::Fixture;

struct Big(usize);

#[async_trait]
impl Tool for Big {
    fn name(&self) -> &str {
        "big"
    }
    fn description(&self) -> &str {
        "returns a lot"
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {}, "additionalProperties": false})
    }
    fn effect(&self) -> EffectClass {
        EffectClass::ReadOnly
    }
    async fn call(&self, _args: Value, _ctx: &ToolContext) -> ToolOutput {
        let lines: Vec<String> = (0..self.0).map(|i| format!("line {i} é")).collect();
        ToolOutput::success(lines.join("\n"))
    }
}

async fn run(f: &Fixture) -> keel_tools::tool::ToolResult {
    let call = ToolCallRequest {
        call_id: "call_big".into(),
        name: "big".into(),
        arguments: json!({}),
    };
    match f.registry.dispatch(&call, &f.ctx).await {
        Dispatch::Finished(r) => r,
        Dispatch::NeedsApproval { .. } => panic!("unexpected ask"),
    }
}

#[tokio::test]
async fn results_over_the_budget_are_truncated_with_a_pointer_to_the_artifact() {
    let mut f = Fixture::new();
    f.registry.register(Arc::new(Big(20_000))).unwrap();
    let r = run(&f).await;
    let full: String = (0..20_000)
        .map(|i| format!("line {i} é"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(r.truncated);
    assert!(
        r.content.chars().count() <= 30_000,
        "{}",
        r.content.chars().count()
    );
    assert!(r.content.starts_with("line 0 é\nline 1 é"));
    assert!(r.content.ends_with("line 19999 é"));
    let artifact = r.artifact.clone().unwrap();
    assert!(
        r.content
            .contains(&format!("read_file {{\"path\": \"{}\"}}", artifact.uri())),
        "{}",
        r.content
    );
    assert!(r.content.contains("over the 30000-character budget"));
    let back = f
        .call(
            "read_file",
            json!({"path": artifact.uri(), "offset": 20_000}),
        )
        .await;
    assert_eq!(back.content, " 20000\tline 19999 é\n");
    assert_eq!(artifact.size_bytes as usize, full.len());
}

#[tokio::test]
async fn the_budget_is_configurable_and_small_results_are_untouched() {
    let mut f = Fixture::new();
    f.ctx.limits.result_budget_chars = 1_000;
    f.registry.register(Arc::new(Big(10))).unwrap();
    let small = run(&f).await;
    assert!(!small.truncated);
    assert!(small.artifact.is_none());
    let mut f = Fixture::new();
    f.ctx.limits.result_budget_chars = 1_000;
    f.registry.register(Arc::new(Big(1_000))).unwrap();
    let big = run(&f).await;
    assert!(big.truncated);
    assert!(
        big.content.chars().count() <= 1_000,
        "{}",
        big.content.chars().count()
    );
}

#[tokio::test]
async fn artifact_paths_cannot_escape_the_artifact_store() {
    let f = Fixture::new();
    // A file next to the artifact directory, and one in the workspace.
    std::fs::write(f._data.path().join("outside.txt"), "outside\n").unwrap();
    f.write("ws.txt", "ws\n");
    for path in [
        "artifact://../outside.txt",
        "artifact://..",
        "artifact:///etc/passwd",
        "artifact://a/../../outside.txt",
        "artifact://.hidden",
        "artifact://",
        "artifact://%2e%2e%2foutside.txt",
    ] {
        let r = f.call("read_file", json!({"path": path})).await;
        assert_eq!(r.status, ToolResultStatus::Failed, "{path}: {}", r.content);
        assert!(
            r.content.contains("use the exact artifact://<id>"),
            "{path}: {}",
            r.content
        );
        assert!(!r.content.contains("outside\n"), "{path}: {}", r.content);
    }
}
