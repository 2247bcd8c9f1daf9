//! The input pipeline over the API (`POST /v1/sessions/{id}/turns` through
//! [`Client::submit_input`]), on both stores: slash commands carried out with no model call to
//! their text (`/clear` answers with the new session's id), `@path` attached to a queued turn,
//! and `/resume`, an unknown command and an `@path` outside the workspace refused with a 422
//! naming `input`.

use keel_client::Client;
use keel_client::api::InputOutcome;
use keel_core::{EventBody, SessionId};
use serde_json::json;

use crate::common::{Backend, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slash_commands_and_at_paths_over_the_api_sqlite() {
    slash_commands_and_at_paths_over_the_api(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slash_commands_and_at_paths_over_the_api_postgres() {
    slash_commands_and_at_paths_over_the_api(Backend::Postgres).await;
}

async fn command(op: &Client, session: &str, input: &str) -> keel_client::api::CommandBody {
    match op
        .submit_input(session, input)
        .await
        .unwrap_or_else(|e| panic!("{input}: {e}"))
    {
        InputOutcome::Command(c) => c,
        InputOutcome::Turn(t) => panic!("{input}: a turn {t:?}"),
    }
}

async fn slash_commands_and_at_paths_over_the_api(b: Backend) {
    let s = start(b).await;
    let op = Client::new(&s.base, Some(&s.operator)).unwrap();
    std::fs::write(s.workspace.join("notes.txt"), "the api notes\n").unwrap();
    let release = s
        .release(
            "input",
            &[
                json!({"text": "one"}),
                json!({"text": "two"}),
                json!({"text": "three"}),
            ],
            &[],
        )
        .await;
    let session = s.run_to_idle(&release, "first").await;
    let id: SessionId = session.parse().unwrap();
    for (input, expect) in [
        ("/help", "/compact"),
        ("/cost", "input +"),
        ("/status", "turns 1"),
        ("/permissions", "permission mode"),
        ("/compact keep the notes", "compacted the conversation"),
    ] {
        let c = command(&op, &session, input).await;
        assert_eq!(c.session_id, session);
        assert!(c.output.contains(expect), "{input}: {}", c.output);
        assert!(c.new_session_id.is_none());
    }
    // Refused: 422 naming `input`, nothing journaled.
    let before = s.store.read(s.tenant, id, 1, None).await.unwrap().len();
    for (input, detail) in [
        ("/resume", "terminal-only"),
        ("/nosuch", "unknown command /nosuch"),
        ("see @../outside.txt", "@../outside.txt"),
        ("see @missing.txt", "@missing.txt"),
    ] {
        let e = op.submit_input(&session, input).await.unwrap_err();
        assert_eq!(e.status(), Some(422), "{input}: {e}");
        let p = e.problem().unwrap();
        assert_eq!(p.field.as_deref(), Some("input"), "{input}: {p:?}");
        assert!(p.detail.contains(detail), "{input}: {}", p.detail);
    }
    assert_eq!(
        s.store.read(s.tenant, id, 1, None).await.unwrap().len(),
        before
    );
    // An @path attaches the file to the queued turn, journaled with how it was compiled.
    let InputOutcome::Turn(t) = op
        .submit_input(&session, "summarize @notes.txt")
        .await
        .unwrap()
    else {
        panic!("a command")
    };
    s.wait_session(&session, |b| b["status"] == "idle").await;
    let events = s.store.read(s.tenant, id, 1, None).await.unwrap();
    let (input, compiled) = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::TurnQueued { input, compiled }
                if e.correlation.turn_id.map(|t| t.to_string()) == Some(t.turn_id.clone()) =>
            {
                Some((input.clone(), compiled.clone()))
            }
            _ => None,
        })
        .unwrap();
    assert!(input.contains("the api notes"), "{input}");
    assert_eq!(compiled.unwrap().attachments[0].path, "notes.txt");
    assert!(
        events
            .iter()
            .any(|e| e.type_name() == "context.compacted" && e.correlation.turn_id.is_none())
    );
    // /model re-pins; /clear answers with the new session's id.
    let route = s.root.path().join("other.jsonl");
    std::fs::write(&route, "{\"text\":\"other\"}\n").unwrap();
    // A re-pin waits for no worker: right after a turn, the worker that ran it may still be
    // letting the session go (409), as with `PATCH`.
    let model = format!("/model script:{}", route.display());
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let c = loop {
        match op.submit_input(&session, &model).await {
            Ok(InputOutcome::Command(c)) => break c,
            Err(e) if e.status() == Some(409) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            other => panic!("{model}: {other:?}"),
        }
    };
    assert!(c.output.contains("now runs model"), "{}", c.output);
    let repinned = op.get_session(&session).await.unwrap();
    assert_ne!(repinned.release_id, release, "re-pinned");
    let c = command(&op, &session, "/clear").await;
    let new = c.new_session_id.expect("the new session");
    assert_ne!(new, session);
    let fresh = op.get_session(&new).await.unwrap();
    assert_eq!(fresh.session_id, new);
    // The new session has no turn: it is already clear, and no third session is made.
    let c = command(&op, &new, "/clear").await;
    assert!(c.new_session_id.is_none(), "{c:?}");
    assert!(c.output.contains("nothing to clear"), "{}", c.output);
}
