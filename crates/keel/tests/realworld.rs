//! Replays of real recorded trajectories: every case under the shared `realworld/` folder (beside
//! the repository) and the copies in `tests/realworld/` runs with
//! `setup.sh DIR`, then `keel run --workspace DIR --model script:script.jsonl --permission-mode
//! bypass --output jsonl "$(cat task.txt)"`, and must end `completed` with every file's git blob
//! as `expect.json` says. New cases are picked up without code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::common::{Env, jsonl_lines};

/// Case folders by name: the repository's copies, then the shared folder's (which win).
pub(crate) fn cases() -> BTreeMap<String, PathBuf> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = BTreeMap::new();
    for root in [
        manifest.join("tests/realworld"),
        manifest.join("../../../shared/realworld"),
    ] {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        for entry in entries.flatten() {
            let dir = entry.path();
            if dir.join("expect.json").is_file() && dir.join("script.jsonl").is_file() {
                found.insert(entry.file_name().to_string_lossy().into_owned(), dir);
            }
        }
    }
    found
}

fn git_blob(path: &Path) -> String {
    let out = Command::new("git")
        .arg("hash-object")
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "git hash-object {}", path.display());
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn run_case(name: &str, dir: &Path) -> Result<(), String> {
    let env = Env::new();
    let ws = env.path("case-ws");
    let setup = Command::new("bash")
        .arg(dir.join("setup.sh"))
        .arg(&ws)
        .current_dir(dir)
        .output()
        .unwrap();
    if !setup.status.success() {
        return Err(format!(
            "{name}: setup.sh failed: {}",
            String::from_utf8_lossy(&setup.stderr)
        ));
    }
    let task = std::fs::read_to_string(dir.join("task.txt")).unwrap();
    let out = env
        .keel()
        .current_dir(dir)
        .arg("run")
        .arg("--workspace")
        .arg(&ws)
        .args([
            "--model",
            "script:script.jsonl",
            "--permission-mode",
            "bypass",
        ])
        .args(["--output", "jsonl"])
        .arg(task.trim_end_matches('\n'))
        .output()
        .unwrap();
    let lines = jsonl_lines(&out.stdout);
    let result = lines.last().cloned().unwrap_or(Value::Null);
    if result["terminal_reason"] != "completed" || out.status.code() != Some(0) {
        return Err(format!(
            "{name}: ended {} (exit {:?}): {}\nstderr: {}",
            result["terminal_reason"],
            out.status.code(),
            result,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let expect: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expect.json")).unwrap()).unwrap();
    let mut problems = Vec::new();
    for (file, blob) in expect["files"].as_object().into_iter().flatten() {
        let path = ws.join(file);
        let got = if path.is_file() {
            git_blob(&path)
        } else {
            "(missing)".into()
        };
        if Some(got.as_str()) != blob.as_str() {
            problems.push(format!("{file}: blob {got}, expected {blob}"));
        }
    }
    let results: Vec<&Value> = lines
        .iter()
        .filter(|l| l["type"] == "tool_call.finished")
        .collect();
    if let Some(n) = expect["tool_calls"].as_u64()
        && results.len() as u64 != n
    {
        problems.push(format!("{} tool calls, expected {n}", results.len()));
    }
    if let Some(n) = expect["failed_tool_calls"].as_u64() {
        let failed = results
            .iter()
            .filter(|r| r["payload"]["is_error"] == true || r["payload"]["status"] != "succeeded")
            .count() as u64;
        if failed != n {
            problems.push(format!("{failed} failed tool calls, expected {n}"));
        }
    }
    for (index, needle) in expect["outputs_contain"].as_object().into_iter().flatten() {
        let i: usize = index.parse().unwrap();
        let output = results
            .get(i)
            .and_then(|r| r["payload"]["output"].as_str())
            .unwrap_or_default();
        if !output.contains(needle.as_str().unwrap_or_default()) {
            problems.push(format!("tool result {i} lacks {needle}: {output:?}"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{name}: {}", problems.join("; ")))
    }
}

#[test]
fn every_recorded_trajectory_replays_to_the_expected_files() {
    let cases = cases();
    assert!(
        cases.contains_key("str-replace-demo"),
        "the repository's copies are always there: {cases:?}"
    );
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(name, dir)| run_case(name, dir).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
