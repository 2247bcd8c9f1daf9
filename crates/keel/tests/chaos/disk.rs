//! The disk under the SQLite store fills up mid-run: a tmpfs of a random size (1.2 to 2.4 MB)
//! mounted in a private user and mount namespace (`unshare -rm`: no privileges needed, no real
//! disk touched) holds the store; the session's first call fills a random share of it, later
//! calls produce output the journal must hold, and one writes until the disk is full. Then:
//! every failure says the disk is full and names the store's file; `PRAGMA integrity_check`
//! says `ok`; the session folds (`keel sessions show`) and its events decode (`keel sessions
//! events`). Space is freed, the store copied out of the namespace, and the session resumed to
//! its end, the trial acting as the human on any `outcome_unknown` call: no effect twice.

use std::collections::HashMap;

use serde_json::Value;

use super::Rng;
use super::trial::Tally;
use crate::common::{Env, jsonl_lines, stderr};

/// Runs one disk-full trial; a line saying what happened.
pub(super) fn trial(i: u64, rng: &mut Rng, tally: &mut Tally) -> String {
    let env = Env::new();
    let small = env.path("small");
    let out = env.path("out");
    std::fs::create_dir_all(&small).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    let effects = env.ws().join("effects.txt");
    let size_kb = rng.range(1200, 2400);
    let fill_kb = size_kb * rng.range(30, 90) / 100;
    let mut tokens = Vec::new();
    let mut lines = Vec::new();
    let call = |command: String| {
        serde_json::json!({"tool_calls": [{"name": "shell", "arguments": {"command": command}}]})
            .to_string()
    };
    let token = |k: usize| format!("tok-d{i}-{k}");
    tokens.push(token(0));
    lines.push(call(format!(
        "head -c {}k /dev/zero > {}/filler; echo {} >> {}",
        fill_kb,
        small.display(),
        token(0),
        effects.display()
    )));
    for k in 1..=rng.range(1, 4) as usize {
        tokens.push(token(k));
        lines.push(call(format!(
            "seq 1 {}; echo {} >> {}",
            rng.range(1000, 6000),
            token(k),
            effects.display()
        )));
    }
    let k = tokens.len();
    tokens.push(token(k));
    lines.push(call(format!(
        "head -c 4000k /dev/zero > {}/filler2; echo {} >> {}; true",
        small.display(),
        token(k),
        effects.display()
    )));
    lines.push(format!("{{\"text\":\"disk trial {i} done\"}}"));
    env.write("script.jsonl", &(lines.join("\n") + "\n"));

    let keel = env!("CARGO_BIN_EXE_keel");
    let db = small.join("k.db");
    let script = format!(
        r#"set -u
mount -t tmpfs -o size={size_kb}k none '{small}' || exit 90
k() {{ '{keel}' --store '{db}' "$@"; }}
k run --workspace '{ws}' --model script:script.jsonl --permission-mode bypass --sandbox off go; echo "== run $?"
s=$(k sessions list | tail -n 1 | cut -d' ' -f1)
echo "== session $s"
k resume "$s"; echo "== full resume $?"
echo "== integrity $(sqlite3 '{db}' 'PRAGMA integrity_check' 2>&1)"
k sessions show --json "$s" > /dev/null; echo "== show $?"
k sessions events "$s" > /dev/null; echo "== events $?"
rm -f '{small}/filler' '{small}/filler2'
echo "== freed integrity $(sqlite3 '{db}' 'PRAGMA integrity_check' 2>&1)"
sqlite3 '{db}' ".backup '{out}/k.db'"; echo "== copied $?"
"#,
        small = small.display(),
        db = db.display(),
        out = out.display(),
        ws = env.ws().display(),
    );
    let o = std::process::Command::new("unshare")
        .args(["-rm", "sh", "-c", &script])
        .current_dir(env.dir.path())
        .env("HOME", env.dir.path())
        .env("XDG_CONFIG_HOME", env.path("config"))
        .env("XDG_DATA_HOME", env.path("data"))
        .env_remove("KEEL_LOG")
        .env_remove("RUST_LOG")
        .output()
        .expect("unshare (util-linux) runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    if o.status.code() == Some(90) {
        tally.problem(format!("disk trial {i}: cannot mount a tmpfs: {text}"));
        return "no tmpfs".into();
    }
    let full = format!("the disk is full: cannot write {}", db.display());
    let filled = text.contains(&full);
    if filled {
        tally.disk_full += 1;
    }
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("== {name} ")))
            .unwrap_or("")
            .to_owned()
    };
    for bad in ["transaction depth", "lease lost", "panicked", "malformed"] {
        if text.contains(bad) {
            tally.problem(format!("disk trial {i}: {bad:?} in the output:\n{text}"));
        }
    }
    // Every failure of the run and the resume on the full disk says so.
    for step in ["run", "full resume"] {
        let code = field(step);
        if code != "0" && code != "3" && !filled {
            tally.problem(format!(
                "disk trial {i}: `{step}` failed ({code}) without naming the full disk:\n{text}"
            ));
        }
    }
    for (name, want) in [
        ("integrity", "ok"),
        ("freed integrity", "ok"),
        ("show", "0"),
        ("events", "0"),
        ("copied", "0"),
    ] {
        if field(name) != want {
            tally.problem(format!(
                "disk trial {i}: {name} gave {:?} ({want:?} expected):\n{text}",
                field(name)
            ));
        }
    }
    let session = field("session");
    let mut note = format!(
        "tmpfs {size_kb} KB, {fill_kb} KB filled first: {}; ",
        if filled {
            "the disk filled"
        } else {
            "the disk did not fill"
        }
    );
    if field("copied") == "0" && !session.is_empty() {
        finish(
            &env,
            &out.join("k.db"),
            &session,
            &tokens,
            i,
            tally,
            &mut note,
        );
    }
    tally.sessions += 1;
    tally.effects += tokens.len() as u64;
    let log = text;
    let text = std::fs::read_to_string(&effects).unwrap_or_default();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for l in text.lines() {
        *counts.entry(l).or_default() += 1;
    }
    for t in &tokens {
        match counts.get(t.as_str()).copied().unwrap_or(0) {
            1 => {}
            0 => {
                tally.lost_effects += 1;
                tally.problem(format!("disk trial {i}: effect {t} never happened"));
            }
            n => {
                tally.duplicates += 1;
                tally.problem(format!(
                    "disk trial {i}: effect {t} happened {n} times; {note}; the run on the full disk:\n{log}"
                ));
            }
        }
    }
    note
}

/// Resumes `session` on the copied store until its turn completes (≤ 10 resumes), deciding
/// each `outcome_unknown` call from the effect file as the human.
fn finish(
    env: &Env,
    db: &std::path::Path,
    session: &str,
    tokens: &[String],
    i: u64,
    tally: &mut Tally,
    note: &mut String,
) {
    let store = db.display().to_string();
    let journal = env.run(&["--store", &store, "sessions", "events", session]);
    let types: Vec<String> = jsonl_lines(&journal.stdout)
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?").to_owned())
        .collect();
    note.push_str(&format!(
        "journal on the freed store: {}; ",
        types.join(" ")
    ));
    for _ in 0..10 {
        let effects = std::fs::read_to_string(env.ws().join("effects.txt")).unwrap_or_default();
        let o = env.run(&["--store", &store, "resume", session, "--output", "jsonl"]);
        let lines = jsonl_lines(&o.stdout);
        let Some(result) = lines.iter().rev().find(|l| l["type"] == "result").cloned() else {
            tally.problem(format!(
                "disk trial {i}: resume on the freed store gave no result line: {}",
                stderr(&o)
            ));
            return;
        };
        match result["terminal_reason"].as_str() {
            Some("completed") => {
                note.push_str("resumed to completion");
                return;
            }
            Some("requires_action") => {}
            other => {
                tally.bad_turns += 1;
                tally.problem(format!(
                    "disk trial {i}: the resumed turn ended {other:?}: {result}"
                ));
                return;
            }
        }
        let pending: Vec<&Value> = result["pending"].as_array().into_iter().flatten().collect();
        if pending.is_empty() {
            tally.unexplained += 1;
            tally.problem(format!(
                "disk trial {i}: waits on a human with nothing pending: {result}"
            ));
            return;
        }
        let events = env.run(&["--store", &store, "sessions", "events", session]);
        let events = String::from_utf8_lossy(&events.stdout).into_owned();
        for p in pending {
            let Some(key) = p["operation_key"].as_str() else {
                tally.problem(format!("disk trial {i}: an approval was asked for: {p}"));
                return;
            };
            // The call's token: in the events that name the key's call.
            let call = events
                .lines()
                .filter(|l| l.contains(key))
                .find_map(|l| {
                    serde_json::from_str::<Value>(l).ok()?["tool_call_id"]
                        .as_str()
                        .map(str::to_owned)
                })
                .unwrap_or_default();
            let token = events
                .lines()
                .filter(|l| !call.is_empty() && l.contains(&call))
                .find_map(|l| tokens.iter().find(|t| l.contains(&format!("echo {t} "))));
            let happened = token.is_some_and(|t| effects.lines().any(|l| l == t.as_str()));
            let outcome = if happened { "committed" } else { "retry" };
            let o = env.run(&["--store", &store, "resolve", key, "--as", outcome]);
            if !o.status.success() {
                tally.problem(format!(
                    "disk trial {i}: resolve {key} --as {outcome}: {}",
                    stderr(&o)
                ));
                return;
            }
            tally.decisions += 1;
        }
    }
    tally.stuck += 1;
    tally.problem(format!("disk trial {i}: still waiting after 10 resumes"));
}
