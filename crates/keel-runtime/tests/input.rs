//! The input pipeline (`keel_runtime::input`) on both stores: plain text passes through, an
//! `@path` attaches a file (journaled in `turn.queued`'s `compiled`), a denied, missing or
//! outside path is refused before anything is written, slash commands come back as commands,
//! user commands expand, `/compact` compacts between turns with its focus, `/clear` makes a new
//! session with the same release and settings.

use keel_core::{EventBody, SessionStatus};
use keel_model::Message;
use keel_runtime::RuntimeError;
use keel_runtime::input::{Command, Compiled, InputOptions};
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    text_passes_through_and_an_at_path_is_attached_and_journaled,
    a_denied_missing_or_outside_path_is_refused_and_nothing_is_written,
    slash_commands_come_back_as_commands_and_user_commands_expand,
    compact_now_summarizes_between_turns_with_the_focus,
    clear_makes_a_new_session_with_the_same_release_and_settings,
);

fn prompt(c: Compiled) -> keel_runtime::input::Prompt {
    match c {
        Compiled::Prompt(p) => p,
        Compiled::Command(c) => panic!("a command: {c:?}"),
    }
}

async fn text_passes_through_and_an_at_path_is_attached_and_journaled(b: Backend) {
    let f = fixture(b, &[json!({"text": "done"})], |_| {}).await;
    std::fs::write(f.ws.path().join("notes.txt"), "alpha\nbeta\n").unwrap();
    let opts = InputOptions::default();
    let plain = prompt(
        f.rt.compile_input(f.tenant, f.session, "just text, me@example.org", &opts)
            .await
            .unwrap(),
    );
    assert_eq!(plain.message, "just text, me@example.org");
    assert_eq!(plain.compiled, None, "plain text journals no compiled form");
    let p = prompt(
        f.rt.compile_input(f.tenant, f.session, "look at @notes.txt.", &opts)
            .await
            .unwrap(),
    );
    assert!(
        p.message.starts_with("look at @notes.txt."),
        "{}",
        p.message
    );
    assert!(p.message.contains("alpha") && p.message.contains("beta"));
    let compiled = p.compiled.clone().unwrap();
    assert_eq!(compiled.raw, "look at @notes.txt.");
    assert_eq!(compiled.attachments.len(), 1);
    assert_eq!(compiled.attachments[0].path, "notes.txt");
    assert!(!compiled.attachments[0].truncated);
    // Compiling wrote nothing; submitting journals the compiled form with the turn.
    assert_eq!(f.types().await, ["session.created"]);
    f.rt.submit_prompt(f.tenant, f.session, &p, Default::default())
        .await
        .unwrap();
    let evs = f.events().await;
    let EventBody::TurnQueued { input, compiled: c } = &evs.last().unwrap().body else {
        panic!("{:?}", evs.last())
    };
    assert_eq!(input, &p.message);
    assert_eq!(c.as_ref(), Some(&compiled));
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].final_text, "done");
    // The model saw the attachment in the user message.
    let ctx = f.rt.project_context(f.tenant, f.session).await.unwrap();
    assert!(
        ctx.messages
            .iter()
            .any(|m| matches!(&**m, Message::User { content } if content.contains("alpha"))),
        "{:?}",
        ctx.messages
    );
}

async fn a_denied_missing_or_outside_path_is_refused_and_nothing_is_written(b: Backend) {
    let f = fixture(b, &[], |c| c.deny = vec!["read_file(secret.txt)".into()]).await;
    std::fs::write(f.ws.path().join("secret.txt"), "hunter2\n").unwrap();
    let outside = f.ws.path().parent().unwrap().join("outside-input-test.txt");
    std::fs::write(&outside, "not yours\n").unwrap();
    let opts = InputOptions::default();
    for (text, what) in [
        ("read @secret.txt", "@secret.txt: permission denied"),
        ("read @missing.txt", "@missing.txt"),
        (
            "read @../outside-input-test.txt",
            "@../outside-input-test.txt",
        ),
        (
            &*format!("read @{}", outside.display()),
            "outside-input-test.txt",
        ),
    ] {
        let err =
            f.rt.compile_input(f.tenant, f.session, text, &opts)
                .await
                .unwrap_err();
        assert!(matches!(err, RuntimeError::Input(_)), "{text}: {err:?}");
        let msg = err.to_string();
        assert!(msg.contains(what), "{text}: {msg}");
        assert!(
            !msg.contains("not yours") && !msg.contains("hunter2"),
            "{msg}"
        );
    }
    let _ = std::fs::remove_file(&outside);
    assert_eq!(f.types().await, ["session.created"]);
}

async fn slash_commands_come_back_as_commands_and_user_commands_expand(b: Backend) {
    let f = fixture(b, &[], |_| {}).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("fix.md"),
        "---\ndescription: fix an issue\n---\nFix issue $ARGUMENTS and add a test.\n",
    )
    .unwrap();
    let terminal = InputOptions {
        command_dirs: vec![dir.path().to_path_buf()],
        terminal: true,
        ..InputOptions::default()
    };
    let api = InputOptions {
        terminal: false,
        ..terminal.clone()
    };
    let compile = |text: &'static str, opts: &InputOptions| {
        let (rt, t, s, o) = (f.rt.clone(), f.tenant, f.session, opts.clone());
        async move { rt.compile_input(t, s, text, &o).await }
    };
    for (text, command) in [
        ("/help", Command::Help),
        ("/cost", Command::Cost),
        ("/status", Command::Status),
        ("/permissions", Command::Permissions),
        ("/compact", Command::Compact { focus: None }),
        (
            "/compact the API",
            Command::Compact {
                focus: Some("the API".into()),
            },
        ),
        (
            "/model scripted",
            Command::Model {
                name: "scripted".into(),
            },
        ),
        ("/clear", Command::Clear),
        ("/resume", Command::Resume { session: None }),
    ] {
        assert_eq!(
            compile(text, &terminal).await.unwrap(),
            Compiled::Command(command),
            "{text}"
        );
    }
    let err = compile("/resume", &api).await.unwrap_err();
    assert!(err.to_string().contains("terminal-only"), "{err}");
    let err = compile("/model", &terminal).await.unwrap_err();
    assert!(
        err.to_string().contains("/model needs a model name"),
        "{err}"
    );
    let err = compile("/nosuch x", &terminal).await.unwrap_err();
    assert!(err.to_string().contains("unknown command /nosuch"), "{err}");
    let p = prompt(compile("/fix 42", &terminal).await.unwrap());
    assert_eq!(p.message, "Fix issue 42 and add a test.");
    let c = p.compiled.unwrap();
    assert_eq!(c.command.as_deref(), Some("fix"));
    assert_eq!(c.raw, "/fix 42");
    // A path is text, not a command.
    let p = prompt(compile("/usr/bin/env is missing", &terminal).await.unwrap());
    assert_eq!(p.message, "/usr/bin/env is missing");
    // Help lists the user commands; the local answers need no model.
    let help =
        f.rt.answer(f.tenant, f.session, &Command::Help, &terminal)
            .await
            .unwrap();
    assert!(
        help.contains("/fix") && help.contains("fix an issue"),
        "{help}"
    );
    let cost =
        f.rt.answer(f.tenant, f.session, &Command::Cost, &terminal)
            .await
            .unwrap();
    assert!(cost.contains("$0.0000"), "{cost}");
    assert_eq!(f.types().await, ["session.created"]);
}

async fn compact_now_summarizes_between_turns_with_the_focus(b: Backend) {
    let f = fixture(b, &[json!({"text": "one"}), json!({"text": "two"})], |_| {}).await;
    let err =
        f.rt.compact_now(f.tenant, f.session, None)
            .await
            .unwrap_err();
    assert!(err.to_string().contains("nothing to compact"), "{err}");
    f.rt.submit(f.tenant, f.session, "first").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    // `/cost` names the scripted model as `--model` does (`script:`), like every other output.
    let cost =
        f.rt.answer(
            f.tenant,
            f.session,
            &Command::Cost,
            &InputOptions::default(),
        )
        .await
        .unwrap();
    assert!(
        cost.contains("script:") && !cost.contains("scripted:"),
        "{cost}"
    );
    // `/status` and `/compact` report one context size, from one projection.
    let status = f.rt.project_context(f.tenant, f.session).await.unwrap();
    let c =
        f.rt.compact_now(f.tenant, f.session, Some("the numbers"))
            .await
            .unwrap();
    assert!(c.tokens_after > 0);
    assert_eq!(c.tokens_before, status.estimated_tokens);
    assert_eq!(
        c.tokens_after,
        f.rt.project_context(f.tenant, f.session)
            .await
            .unwrap()
            .estimated_tokens
    );
    let evs = f.events().await;
    let last = evs.last().unwrap();
    assert_eq!(last.type_name(), "context.compacted");
    assert_eq!(last.correlation.turn_id, None, "between turns");
    assert_eq!(last.seq, c.version);
    assert_eq!(last.schema_version, 3, "older builds cannot fold it");
    let EventBody::ContextCompacted {
        requested, focus, ..
    } = &last.body
    else {
        panic!("{last:?}")
    };
    assert!(*requested);
    assert_eq!(focus.as_deref(), Some("the numbers"));
    // The next turn sees the summary and its own input only, and takes the next script line.
    f.rt.submit(f.tenant, f.session, "second").await.unwrap();
    let out = f.rt.run(f.tenant, f.session).await.unwrap();
    assert_eq!(out.turns[0].final_text, "two");
    let ctx = f.rt.project_context(f.tenant, f.session).await.unwrap();
    let Message::User { content } = &*ctx.messages[0] else {
        panic!("{:?}", ctx.messages)
    };
    assert!(
        content.starts_with(keel_runtime::context::SUMMARY_PREFIX),
        "{content}"
    );
    assert!(
        !ctx.messages
            .iter()
            .any(|m| matches!(&**m, Message::User { content } if content == "first")),
        "the first turn is behind the boundary"
    );
}

async fn clear_makes_a_new_session_with_the_same_release_and_settings(b: Backend) {
    let f = fixture(b, &[json!({"text": "one"})], |c| {
        c.deny = vec!["shell".into()]
    })
    .await;
    // A session without a turn is already clear: nothing is made.
    assert_eq!(f.rt.clear(f.tenant, f.session).await.unwrap(), None);
    f.rt.submit(f.tenant, f.session, "first").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    let new = f.rt.clear(f.tenant, f.session).await.unwrap().unwrap();
    assert_ne!(new, f.session);
    let old = f.rt.view(f.tenant, f.session).await.unwrap().state;
    let fresh = f.rt.view(f.tenant, new).await.unwrap().state;
    assert_eq!(fresh.release_id, old.release_id);
    assert_eq!(fresh.config, old.config);
    assert!(fresh.turns.is_empty());
    assert_eq!(old.status, SessionStatus::Idle, "the old session is kept");
}
