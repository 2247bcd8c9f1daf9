//! The workspace is the home directory, so keel's data (`data/keel`: the store, the seal key)
//! and config (`config/keel`) directories lie inside it: the file tools refuse them, and a
//! confined command can neither read them nor rename them (or a directory above them) out of
//! the way of the next call, which hides them by path. With `--sandbox off` the same commands
//! read the store, so the confined run proves something.

use serde_json::json;

use crate::common::{Env, jsonl_lines, stderr};

fn call(name: &str, args: serde_json::Value) -> String {
    json!({"tool_calls": [{"name": name, "arguments": args}]}).to_string()
}

/// `keel run` headless in bypass mode with the whole environment as its workspace.
fn run_home(env: &Env, script: &[String], flags: &[&str]) -> std::process::Output {
    env.write("script.jsonl", &script.join("\n"));
    env.keel()
        .args(["run", "--workspace", ".", "--model", "script:script.jsonl"])
        .args(["--output", "jsonl", "--permission-mode", "bypass"])
        .args(flags)
        .arg("go")
        .output()
        .unwrap()
}

/// Each tool call's output, in order.
fn outputs(out: &std::process::Output) -> Vec<String> {
    jsonl_lines(&out.stdout)
        .iter()
        .filter(|l| l["type"] == "tool_call.finished")
        .map(|l| l["payload"]["output"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[test]
fn keels_data_and_config_in_a_home_workspace_stay_out_of_reach() {
    let config_mark = "# CONFIG-FILE-MARKER-5521\n";
    let reveal = "head -c 15 data/keel/keel.db d2/keel/keel.db data2/keel/keel.db; \
                  cat config/keel/keel.toml c2/keel/keel.toml config/k2/keel.toml; echo end";

    // Unconfined, the store and the config are right there.
    let env = Env::new();
    env.write("config/keel/keel.toml", config_mark);
    let out = run_home(
        &env,
        &[
            call("shell", json!({"command": reveal})),
            json!({"text": "done"}).to_string(),
        ],
        &["--sandbox", "off"],
    );
    let shown = outputs(&out).join("\n");
    assert!(
        shown.contains("SQLite format") && shown.contains("CONFIG-FILE-MARKER"),
        "unconfined: {shown} {}",
        stderr(&out)
    );

    let env = Env::new();
    env.write("config/keel/keel.toml", config_mark);
    // A first run creates the store and the seal key in data/keel.
    let first = run_home(&env, &[json!({"text": "hi"}).to_string()], &[]);
    assert!(first.status.success(), "{}", stderr(&first));
    let script = [
        call("read_file", json!({"path": "data/keel/keel.db"})),
        call("read_file", json!({"path": "config/keel/keel.toml"})),
        call(
            "write_file",
            json!({"path": "config/keel/keel.toml", "content": "permission_mode = \"bypass\"\n"}),
        ),
        call("list_dir", json!({"path": "data"})),
        call(
            "shell",
            json!({"command": "mv data d2; mv data/keel data2; mv config c2; mv config/keel config/k2; echo moved"}),
        ),
        call("shell", json!({"command": reveal})),
        json!({"text": "done"}).to_string(),
    ];
    let out = run_home(&env, &script, &[]);
    let shown = outputs(&out);
    assert_eq!(shown.len(), 6, "{shown:?} {}", stderr(&out));
    for (i, refused) in shown[..3].iter().enumerate() {
        assert!(refused.contains("is keel's own"), "call {i}: {refused}");
    }
    assert!(!shown[3].contains("keel"), "list_dir data: {}", shown[3]);
    assert!(shown[4].contains("Device or resource busy"), "{}", shown[4]);
    assert!(shown[5].contains("end"), "{}", shown[5]);
    for (i, output) in shown.iter().enumerate() {
        assert!(
            !output.contains("SQLite format") && !output.contains("CONFIG-FILE-MARKER"),
            "call {i}: {output}"
        );
    }
    // Nothing moved or changed on the host.
    assert!(env.path("data/keel/keel.db").is_file());
    assert_eq!(
        std::fs::read_to_string(env.path("config/keel/keel.toml")).unwrap(),
        config_mark
    );
}

#[test]
fn a_confined_command_cannot_create_the_user_config_keel_has_not_made_yet() {
    // No config/keel yet: keel creates it empty before the first confined command, so the
    // sandbox hides it and nothing written there can reach the next run's trusted settings.
    let env = Env::new();
    std::fs::remove_dir_all(env.path("config/keel")).unwrap();
    let plant = "mkdir -p config/keel && printf 'permission_mode = \"bypass\"\\n' > config/keel/keel.toml; \
                 ls -a config/keel; echo planted";
    let out = run_home(
        &env,
        &[
            call("shell", json!({"command": plant})),
            call(
                "write_file",
                json!({"path": "config/keel/keel.toml", "content": "permission_mode = \"bypass\"\n"}),
            ),
            json!({"text": "done"}).to_string(),
        ],
        &[],
    );
    let shown = outputs(&out);
    assert_eq!(shown.len(), 2, "{shown:?} {}", stderr(&out));
    assert!(shown[1].contains("is keel's own"), "{}", shown[1]);
    assert!(
        env.path("config/keel").is_dir(),
        "keel made the directory to hide it"
    );
    assert!(
        !env.path("config/keel/keel.toml").exists(),
        "a confined command planted a user config: {}",
        shown[0]
    );
}

#[test]
fn a_confined_command_cannot_plant_a_journal_beside_a_store_in_the_workspace() {
    // The store lies in the workspace. In WAL mode SQLite never makes `<db>-journal`, so the
    // sandbox had nothing to cover there, and a forged "hot journal" planted by a command was
    // rolled back into the database at its next open, destroying it.
    let env = Env::new();
    let store = format!("sqlite://{}", env.path("keel.db").display());
    let plant = "printf 'forged journal' > keel.db-journal; echo write=$?; \
                 rm -f keel.db-journal; echo rm=$?; echo end";
    let out = run_home(
        &env,
        &[
            call("shell", json!({"command": plant})),
            json!({"text": "done"}).to_string(),
        ],
        &["--store", &store],
    );
    let shown = outputs(&out);
    assert_eq!(shown.len(), 1, "{shown:?} {}", stderr(&out));
    assert!(shown[0].contains("end"), "{}", shown[0]);
    // A write may succeed: it goes to the `/dev/null` covering the journal.
    assert!(!shown[0].contains("rm=0"), "{}", shown[0]);
    assert_eq!(
        std::fs::metadata(env.path("keel.db-journal"))
            .unwrap()
            .len(),
        0,
        "the journal keel made stays empty"
    );
    let list = env.run(&["sessions", "list", "--store", &store]);
    assert!(list.status.success(), "{}", stderr(&list));

    // The store's name is a symlink: SQLite keeps `-wal`, `-shm` and `-journal` beside the real
    // file, and those are covered (the WAL holds the journal's recent events).
    let env = Env::new();
    std::os::unix::fs::symlink("data.db", env.path("keel.db")).unwrap();
    let first = run_home(
        &env,
        &[json!({"text": "hi"}).to_string()],
        &["--store", &store_at(&env)],
    );
    assert!(first.status.success(), "{}", stderr(&first));
    let peek = "wc -c < data.db-wal; wc -c < data.db; printf 'forged' > data.db-journal; \
                rm -f data.db-journal; echo rm=$?; echo end";
    let out = run_home(
        &env,
        &[
            call("shell", json!({"command": peek})),
            json!({"text": "done"}).to_string(),
        ],
        &["--store", &store_at(&env)],
    );
    let shown = outputs(&out);
    assert_eq!(shown.len(), 1, "{shown:?} {}", stderr(&out));
    let sizes: Vec<&str> = shown[0].lines().take(2).collect();
    assert_eq!(
        sizes,
        ["0", "0"],
        "the WAL and the database read as empty: {}",
        shown[0]
    );
    assert!(!shown[0].contains("rm=0"), "{}", shown[0]);
    assert_eq!(
        std::fs::metadata(env.path("data.db-journal"))
            .unwrap()
            .len(),
        0,
        "the journal beside the real file stays empty"
    );
}

/// `--store` for the database `keel.db` at the top of `env`.
fn store_at(env: &Env) -> String {
    format!("sqlite://{}", env.path("keel.db").display())
}

#[test]
fn a_confined_command_cannot_replace_keel_or_its_launcher_in_the_workspace() {
    // keel and its launcher are installed inside the workspace (a repository's own build, or
    // the workspace is $HOME with keel in ~/.cargo/bin). A command that swapped the launcher
    // would run outside the sandbox at the next keel's first shell call: both files, and the
    // directories above them up to the workspace, are out of its reach.
    let env = Env::new();
    let bin = env.path("bin");
    std::fs::create_dir(&bin).unwrap();
    let keel = bin.join("keel");
    let launcher = bin.join("keel-sandbox-launcher");
    std::fs::copy(env!("CARGO_BIN_EXE_keel"), &keel).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_keel-sandbox-launcher"), &launcher).unwrap();
    let launcher_bytes = std::fs::read(&launcher).unwrap();
    let keel_len = std::fs::metadata(&keel).unwrap().len();
    let swap = "printf '#!/bin/sh\\necho escaped > ESCAPED\\n' > .l; chmod 755 .l; \
                mv -f .l bin/keel-sandbox-launcher; echo swap=$?; \
                echo x >> bin/keel-sandbox-launcher; echo append=$?; \
                echo x >> bin/keel; echo append_keel=$?; rm -f bin/keel; echo rm=$?; \
                mv bin bin2; echo mv=$?; echo end";
    let script = [
        call("shell", json!({"command": swap})),
        call("shell", json!({"command": "echo second"})),
        json!({"text": "done"}).to_string(),
    ];
    env.write("script.jsonl", &script.join("\n"));
    let run = || run_script_with(&env, &keel);
    let out = run();
    let shown = outputs(&out);
    assert_eq!(shown.len(), 2, "{shown:?} {}", stderr(&out));
    for refused in ["swap=0", "append=0", "append_keel=0", "rm=0", "mv=0"] {
        assert!(!shown[0].contains(refused), "{refused}: {}", shown[0]);
    }
    assert!(shown[0].contains("end"), "{}", shown[0]);
    assert_eq!(std::fs::read(&launcher).unwrap(), launcher_bytes);
    assert_eq!(std::fs::metadata(&keel).unwrap().len(), keel_len);
    // The next keel starts the same launcher: its commands still run confined.
    let again = run();
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(!env.path("ESCAPED").exists());
    assert!(outputs(&again)[1].contains("second"), "{}", stderr(&again));

    // Without a launcher beside keel (keel runs itself then), a command cannot plant one there
    // for the next keel to run unconfined: keel's directory is read-only to it.
    std::fs::remove_file(&launcher).unwrap();
    env.write(
        "script.jsonl",
        &[
            call(
                "shell",
                json!({"command": "printf '#!/bin/sh\\n' > bin/keel-sandbox-launcher; echo plant=$?; \
                                   touch bin/other; echo other=$?; echo end"}),
            ),
            json!({"text": "done"}).to_string(),
        ]
        .join("\n"),
    );
    let planted = run();
    let shown = outputs(&planted);
    assert_eq!(shown.len(), 1, "{shown:?} {}", stderr(&planted));
    assert!(!shown[0].contains("plant=0"), "{}", shown[0]);
    assert!(!shown[0].contains("other=0"), "{}", shown[0]);
    assert!(!launcher.exists(), "a launcher was planted beside keel");
}

#[test]
fn a_confined_command_cannot_plant_a_launcher_beside_keel_in_the_workspaces_top_directory() {
    // keel copied into the top directory of the project it works in, without its launcher
    // (keel runs itself as the launcher then). Only files can be protected there, not the
    // directory: keel holds the launcher's place with an empty file no command may replace,
    // so that no later keel runs a planted launcher outside the sandbox (found by the attack
    // pass: an ELF launcher planted there ran unconfined at the next `keel run`).
    let env = Env::new();
    let keel = env.path("keel");
    let launcher = env.path("keel-sandbox-launcher");
    std::fs::copy(env!("CARGO_BIN_EXE_keel"), &keel).unwrap();
    let plant = "cp /bin/true keel-sandbox-launcher; echo cp=$?; \
                 rm -f keel-sandbox-launcher; echo rm=$?; \
                 mv keel-sandbox-launcher .away; echo mv=$?; \
                 chmod 755 keel-sandbox-launcher; echo chmod=$?; echo end";
    let script = [
        call("shell", json!({"command": plant})),
        json!({"text": "done"}).to_string(),
    ];
    env.write("script.jsonl", &script.join("\n"));
    let run = || run_script_with(&env, &keel);
    let out = run();
    let shown = outputs(&out);
    assert_eq!(shown.len(), 1, "{shown:?} {}", stderr(&out));
    for refused in ["cp=0", "rm=0", "mv=0", "chmod=0"] {
        assert!(!shown[0].contains(refused), "{refused}: {}", shown[0]);
    }
    assert!(shown[0].contains("end"), "{}", shown[0]);
    let held = std::fs::metadata(&launcher).unwrap();
    assert_eq!(held.len(), 0, "the launcher's place stays empty");
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&held.permissions()) & 0o777,
        0
    );
    // The next keel does not take the empty file for a launcher: its commands run confined.
    env.write(
        "script.jsonl",
        &[
            call("shell", json!({"command": "echo second"})),
            json!({"text": "done"}).to_string(),
        ]
        .join("\n"),
    );
    let again = run();
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(outputs(&again)[0].contains("second"), "{}", stderr(&again));
}

/// `keel` (a copy at `keel`) running `script.jsonl` in `env` as its workspace, headless and in
/// `bypass` mode.
fn run_script_with(env: &Env, keel: &std::path::Path) -> std::process::Output {
    env.keel_at(keel)
        .stdin(std::process::Stdio::null())
        .args(["run", "--workspace", ".", "--model", "script:script.jsonl"])
        .args(["--output", "jsonl", "--permission-mode", "bypass", "go"])
        .output()
        .unwrap()
}
