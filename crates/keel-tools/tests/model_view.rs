//! What the model sees, as snapshots: a diff here is a reviewable change of model-visible
//! behaviour. The tool specs, and the result of one failing call per error of every built-in
//! tool (each says what failed, why, and what to do instead).

use keel_tools::policy::{PermissionMode, Policy, Rule};
use keel_tools::registry::ToolRegistry;
use keel_tools::sandbox::SandboxMode;
use serde_json::{Value, json};

use crate::common::Fixture;

#[test]
fn tool_specs() {
    let specs = ToolRegistry::with_builtins().unwrap().specs();
    insta::assert_json_snapshot!("tool_specs", specs);
}

#[tokio::test]
async fn error_results() {
    let f = Fixture::with(
        SandboxMode::Off,
        Policy::new(PermissionMode::Bypass).with_rule(Rule::deny("shell(rm *)").unwrap()),
    );
    f.write("a.txt", "x x x\n");
    f.write("dir/b.txt", "b\n");
    std::fs::write(f.path("bin.dat"), [0u8, 159, 146, 150]).unwrap();
    let calls: Vec<(&str, Value)> = vec![
        ("no_such_tool", json!({})),
        ("read_file", json!({"path": 3, "extra": true})),
        ("read_file", json!("{not json")),
        ("read_file", json!({"path": "missing.txt"})),
        ("read_file", json!({"path": "dir"})),
        ("read_file", json!({"path": "bin.dat"})),
        ("read_file", json!({"path": "a.txt", "offset": 9})),
        ("read_file", json!({"path": "../outside"})),
        ("read_file", json!({"path": "artifact://../x"})),
        ("write_file", json!({"path": "dir", "content": "x"})),
        ("write_file", json!({"path": "/etc/x", "content": "x"})),
        (
            "edit_file",
            json!({"path": "a.txt", "old_string": "y", "new_string": "z"}),
        ),
        (
            "edit_file",
            json!({"path": "a.txt", "old_string": "x", "new_string": "z"}),
        ),
        (
            "edit_file",
            json!({"path": "a.txt", "old_string": "", "new_string": "z"}),
        ),
        (
            "edit_file",
            json!({"path": "a.txt", "old_string": "x", "new_string": "x"}),
        ),
        (
            "edit_file",
            json!({"path": "new.txt", "old_string": "x", "new_string": "z"}),
        ),
        (
            "edit_file",
            json!({"path": "dir", "old_string": "x", "new_string": "z"}),
        ),
        (
            "edit_file",
            json!({"path": "bin.dat", "old_string": "x", "new_string": "z"}),
        ),
        ("list_dir", json!({"path": "missing"})),
        ("list_dir", json!({"path": "a.txt"})),
        ("glob", json!({"pattern": "a[", "path": "."})),
        ("glob", json!({"pattern": "*", "path": "a.txt"})),
        ("grep", json!({"pattern": "(unclosed"})),
        ("grep", json!({"pattern": "x", "path": "missing"})),
        ("grep", json!({"pattern": "x", "glob": "{a"})),
        ("shell", json!({"command": "  "})),
        ("shell", json!({"command": "ls", "workdir": "a.txt"})),
        ("shell", json!({"command": "ls", "workdir": "../.."})),
        ("shell", json!({"command": "ls && rm -rf dir"})),
    ];
    let mut out = String::new();
    for (name, args) in calls {
        let r = f.call(name, args.clone()).await;
        assert!(r.is_error(), "{name} {args}: {}", r.content);
        out.push_str(&format!(
            "## {name} {args}\n[{:?}] {}\n\n",
            r.status, r.content
        ));
    }
    insta::assert_snapshot!("error_results", out);
}
