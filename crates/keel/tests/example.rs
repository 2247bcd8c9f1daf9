//! The README's first command runs `examples/demo/run.sh`: the shipped example must keep
//! working — the scripted agent fixes the demo project and its test passes.

use std::path::Path;

use crate::common::{Env, check_stream, jsonl_lines, stderr};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[test]
fn the_shipped_demo_fixes_its_project() {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo");
    let env = Env::new();
    let ws = env.path("demo");
    copy_dir(&demo.join("workspace"), &ws);
    let script = format!("script:{}", demo.join("script.jsonl").display());
    let out = env
        .keel()
        .arg("run")
        .arg("--workspace")
        .arg(&ws)
        .args([
            "--model",
            &script,
            "--permission-mode",
            "bypass",
            "--output",
            "jsonl",
        ])
        .arg("Fix the failing test in this project.")
        .output()
        .unwrap();
    let lines = jsonl_lines(&out.stdout);
    let result = check_stream(&lines);
    assert_eq!(
        result["terminal_reason"],
        "completed",
        "{result} {}",
        stderr(&out)
    );
    assert_eq!(result["num_steps"], 6);
    let test = std::process::Command::new("sh")
        .arg("test.sh")
        .current_dir(&ws)
        .output()
        .unwrap();
    assert!(
        test.status.success(),
        "{}",
        String::from_utf8_lossy(&test.stdout)
    );
    let shells: Vec<_> = lines
        .iter()
        .filter(|l| l["type"] == "tool_call.finished")
        .collect();
    assert_eq!(shells.len(), 5);
    assert_eq!(
        shells[1]["payload"]["is_error"], true,
        "the test failed first"
    );
    assert_eq!(
        shells[4]["payload"]["is_error"], false,
        "and passed after the fix"
    );
}
