//! A full disk under the SQLite store (issue 10 item 11): before, the run failed with
//! "attempted to call begin_with at non-zero transaction depth" (sqlx believed a transaction
//! was still open after SQLite rolled back the failed commit), and the next `keel resume` said
//! "lease lost to another worker" (a lease write whose commit failed was reported as taken).
//! Now every attempt says the disk is full and names the file, and once space is freed the
//! session resumes with nothing committed lost.
//!
//! The store lives on a 1.5 MiB tmpfs mounted in a private user and mount namespace
//! (`unshare -rm`), so the test needs no privileges and touches no real disk.

use crate::common::Env;

#[test]
fn a_full_disk_is_named_and_the_session_resumes_once_space_is_freed() {
    let env = Env::new();
    let small = env.path("small");
    std::fs::create_dir_all(&small).unwrap();
    env.write(
        "script.jsonl",
        &format!(
            "{}\n{{\"text\":\"done\"}}\n",
            serde_json::json!({"tool_calls": [{"name": "shell", "arguments": {
                "command": format!("head -c 3000000 /dev/zero > {}/filler; true", small.display())
            }}]})
        ),
    );
    let keel = env!("CARGO_BIN_EXE_keel");
    let db = small.join("k.db");
    let script = format!(
        r#"set -u
mount -t tmpfs -o size=1500k none '{small}' || exit 90
k() {{ '{keel}' --store '{db}' "$@"; }}
k run --workspace '{ws}' --model script:script.jsonl --permission-mode bypass --sandbox off go; echo "== run $?"
s=$(k sessions list | tail -n 1 | cut -d' ' -f1)
k resume "$s"; echo "== full resume $?"
rm '{small}/filler'
k resume "$s"; echo "== freed resume $?"
k sessions show "$s"
"#,
        small = small.display(),
        db = db.display(),
        ws = env.ws().display(),
    );
    let out = std::process::Command::new("unshare")
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
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(out.status.code(), Some(90), "cannot mount a tmpfs: {text}");
    let full = format!("the disk is full: cannot write {}", db.display());
    let before_freed = &text[..text.find("== freed resume").unwrap_or(text.len())];
    assert_eq!(before_freed.matches(&full).count(), 2, "{text}");
    assert!(text.contains("== run 1"), "{text}");
    assert!(text.contains("== full resume 1"), "{text}");
    assert!(!text.contains("transaction depth"), "{text}");
    assert!(!text.contains("lease lost"), "{text}");
    // Freed: the shell call ran before the disk filled, so its effect is put to a human
    // (exit 3), not lost and not re-run.
    assert!(text.contains("== freed resume 3"), "{text}");
    assert!(text.contains("outcome unknown: shell"), "{text}");
    assert!(text.contains("requires_action"), "{text}");
}
