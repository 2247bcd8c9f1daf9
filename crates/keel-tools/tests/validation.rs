use std::sync::Arc;

use async_trait::async_trait;
use keel_tools::error::ToolsError;
use keel_tools::registry::ToolRegistry;
use keel_tools::tool::{EffectClass, Tool, ToolContext, ToolOutput, ToolResultStatus};
use serde_json::{Value, json};

use crate::common::Fixture;

#[tokio::test]
async fn unknown_field_is_rejected_naming_the_field() {
    let f = Fixture::new();
    let r = f.call("read_file", json!({"path": "a", "bogus": 1})).await;
    assert_eq!(r.status, ToolResultStatus::Rejected);
    assert!(r.content.contains("bogus"), "{}", r.content);
    assert!(
        r.content.contains("path: string (required)"),
        "{}",
        r.content
    );
}

#[tokio::test]
async fn wrong_type_is_rejected_naming_the_field() {
    let f = Fixture::new();
    let r = f
        .call("read_file", json!({"path": "a", "offset": "ten"}))
        .await;
    assert_eq!(r.status, ToolResultStatus::Rejected);
    assert!(r.content.contains("field `offset`"), "{}", r.content);
    assert!(r.content.contains("integer"), "{}", r.content);
}

#[tokio::test]
async fn missing_field_is_rejected_naming_the_field() {
    let f = Fixture::new();
    let r = f
        .call("edit_file", json!({"path": "a", "old_string": "x"}))
        .await;
    assert_eq!(r.status, ToolResultStatus::Rejected);
    assert!(r.content.contains("new_string"), "{}", r.content);
}

#[tokio::test]
async fn several_problems_are_all_reported() {
    let f = Fixture::new();
    let r = f.call("shell", json!({"timeout_ms": -5, "cwd": "x"})).await;
    assert_eq!(r.status, ToolResultStatus::Rejected);
    for needle in ["command", "cwd", "timeout_ms"] {
        assert!(
            r.content.contains(needle),
            "missing {needle}: {}",
            r.content
        );
    }
}

#[tokio::test]
async fn unknown_tool_is_rejected_listing_the_known_tools() {
    let f = Fixture::new();
    let r = f.call("delete_everything", json!({})).await;
    assert_eq!(r.status, ToolResultStatus::Rejected);
    assert!(
        r.content.contains("Unknown tool `delete_everything`"),
        "{}",
        r.content
    );
    assert!(r.content.contains("read_file"), "{}", r.content);
    assert_eq!(r.call_id, "call_1");
}

#[tokio::test]
async fn arguments_given_as_a_json_string_are_accepted_and_bad_json_is_rejected() {
    let f = Fixture::new();
    f.write("a.txt", "hi\n");
    let ok = f
        .call("read_file", Value::String("{\"path\": \"a.txt\"}".into()))
        .await;
    assert_eq!(ok.status, ToolResultStatus::Succeeded, "{}", ok.content);
    let bad = f
        .call("read_file", Value::String("{\"path\": ".into()))
        .await;
    assert_eq!(bad.status, ToolResultStatus::Rejected);
    assert!(bad.content.contains("not valid JSON"), "{}", bad.content);
}

#[tokio::test]
async fn non_object_arguments_are_rejected() {
    let f = Fixture::new();
    let r = f.call("read_file", json!([1, 2])).await;
    assert_eq!(r.status, ToolResultStatus::Rejected);
    assert!(r.content.contains("object"), "{}", r.content);
}

struct Loose;

#[async_trait]
impl Tool for Loose {
    fn name(&self) -> &str {
        "loose"
    }
    fn description(&self) -> &str {
        "no"
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {}})
    }
    fn effect(&self) -> EffectClass {
        EffectClass::ReadOnly
    }
    async fn call(&self, _args: Value, _ctx: &ToolContext) -> ToolOutput {
        ToolOutput::success("")
    }
}

#[test]
fn registry_refuses_schemas_without_additional_properties_false_and_duplicates() {
    let mut registry = ToolRegistry::new();
    let err = registry.register(Arc::new(Loose)).unwrap_err();
    assert!(matches!(err, ToolsError::InvalidSchema { .. }), "{err}");
    let mut registry = ToolRegistry::with_builtins().unwrap();
    let err = registry
        .register(Arc::new(keel_tools::builtin::ReadFile))
        .unwrap_err();
    assert!(matches!(err, ToolsError::DuplicateTool { .. }), "{err}");
}

#[test]
fn builtin_specs_match_the_contract() {
    let registry = ToolRegistry::with_builtins().unwrap();
    let mut names: Vec<(String, Vec<String>)> = registry
        .specs()
        .into_iter()
        .map(|s| {
            let mut props: Vec<String> = s.input_schema["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            props.sort();
            (s.name, props)
        })
        .collect();
    names.sort();
    let expect = |n: &str, p: &[&str]| {
        (
            n.to_owned(),
            p.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
    };
    assert_eq!(
        names,
        vec![
            expect(
                "edit_file",
                &["new_string", "old_string", "path", "replace_all"]
            ),
            expect("glob", &["path", "pattern"]),
            expect("grep", &["case_insensitive", "glob", "path", "pattern"]),
            expect("list_dir", &["path"]),
            expect("read_file", &["limit", "offset", "path"]),
            expect("shell", &["command", "timeout_ms", "workdir"]),
            expect("write_file", &["content", "path"]),
        ]
    );
}

#[test]
fn builtin_effect_classes_and_parallel_safety() {
    use EffectClass::{IdempotentWrite, ReadOnly, SideEffecting};
    let registry = ToolRegistry::with_builtins().unwrap();
    let got: Vec<(String, EffectClass, bool, bool)> = registry
        .specs()
        .into_iter()
        .map(|s| {
            let can_reconcile = registry.get(&s.name).unwrap().can_reconcile();
            (s.name, s.effect, s.parallel_safe, can_reconcile)
        })
        .collect();
    let row = |n: &str, e, p, r| (n.to_owned(), e, p, r);
    assert_eq!(
        got,
        vec![
            // Re-running an edit after a crash may apply it twice or fail on text it already
            // replaced, so an edit whose outcome was lost is reconciled from the file's hashes
            // (recorded before dispatch), not re-run.
            row("edit_file", SideEffecting, false, true),
            row("glob", ReadOnly, true, false),
            row("grep", ReadOnly, true, false),
            row("list_dir", ReadOnly, true, false),
            row("read_file", ReadOnly, true, false),
            row("shell", SideEffecting, false, false),
            row("write_file", IdempotentWrite, false, true),
        ]
    );
}

/// The built-in tools' validators are compiled at their first use, not at registration: every
/// built-in schema must compile (a registered third-party tool's is compiled at once, and a
/// schema that does not compile is refused there).
#[test]
fn every_builtin_tool_schema_compiles() {
    let registry = ToolRegistry::with_builtins().unwrap();
    let specs = registry.specs();
    assert!(specs.iter().any(|s| s.name == "shell"), "{specs:?}");
    for spec in specs {
        assert!(
            jsonschema::validator_for(&spec.input_schema).is_ok(),
            "{}",
            spec.name
        );
    }
}
