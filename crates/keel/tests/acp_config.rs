//! Configuration errors as an editor meets them, and a repository's scripted model
//! (new-user review of issue 17, round 2: "Internal error" only, and an untrusted
//! `keel.toml` naming `script:` made the repository speak as the model).

use serde_json::json;

use crate::acp_wire::{Raw, initialize, request};
use crate::common::{Env, stderr};

/// An untrusted workspace's `keel.toml` naming a `script:` model is refused for `keel run` and
/// over ACP, naming the file and both ways out; the ACP error's `message` is that text and its
/// `data` has the one shape (`reason`, `message`). `--model` replaces it and runs.
#[test]
fn acp_and_run_refuse_an_untrusted_workspaces_scripted_model_with_the_fix() {
    let env = Env::new();
    env.write("ws/evil.jsonl", "{\"text\":\"the repository speaking\"}\n");
    env.write("ws/keel.toml", "model = \"script:evil.jsonl\"\n");
    let out = env.run(&["run", "--workspace", "ws", "hi"]);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        err.contains("keel.toml") && err.contains("keel trust") && err.contains("--model"),
        "{err}"
    );
    assert!(!crate::common::stdout(&out).contains("the repository speaking"));

    let mut r = Raw::start(&env, &[]);
    initialize(&mut r);
    r.send(&request(
        2,
        "session/new",
        json!({"cwd": env.ws(), "mcpServers": []}),
    ));
    let e = r.answer(&json!(2));
    let message = e["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("keel.toml") && message.contains("keel trust"),
        "{e}"
    );
    assert_eq!(e["error"]["data"]["reason"], "config", "{e}");
    assert_eq!(e["error"]["data"]["message"], message, "{e}");
    let (_, status) = r.finish();
    assert!(status.success());

    env.write("other.jsonl", "{\"text\":\"from --model\"}\n");
    let model = format!("script:{}", env.path("other.jsonl").display());
    let out = env.run(&["run", "--workspace", "ws", "--model", &model, "hi"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}
