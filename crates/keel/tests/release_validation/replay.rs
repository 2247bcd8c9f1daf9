//! **replay.** Invariant: a finished session's journal, folded again from the store
//! (`SessionState::replay`, by another store handle as another process would), is identical to
//! the live state — the state a subscriber folded event by event while the session ran, the
//! turn outcomes the driver returned from its runs, and the store's own rows (session status
//! and version, effects and approvals) — and a recorded session re-run with the scripted model
//! built from its journal proposes identical tool calls (ids, names, arguments) with identical
//! results and leaves an identical transcript.
//!
//! Guarded mechanism: fold determinism (`SessionState::apply` is a pure function of the state
//! and the event) and the scripted model's journaled position (`responses_consumed`: the k-th
//! response of a session is line k, whatever process samples it).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use keel_core::{Budget, Event, EventBody, SessionState, StateMachine as _, TenantId};
use keel_model::ScriptedModel;
use keel_runtime::{RuntimeOptions, SubscriptionItem};
use keel_testkit::db::{Backend, TestDb};
use keel_tools::policy::PermissionMode;
use serde_json::{Value, json};

use super::rig::{
    Dispatches, allow_the_approval, call, config, journal, registry, release, runtime, scripted,
};

per_backend!(
    a_finished_sessions_journal_folds_to_the_live_state,
    a_recorded_session_reruns_identically,
);

/// Two turns: the first reads a file, then asks to run a side effect (approved by a human,
/// between two runs), and calls a tool that does not exist (rejected); the second answers in
/// text. The state a live subscriber folded, the driver's outcomes and the store's rows all
/// equal the journal folded again by another store handle.
async fn a_finished_sessions_journal_folds_to_the_live_state(b: Backend) {
    let db = TestDb::new(b).await;
    let log = Dispatches::default();
    let model = scripted(&[
        json!({"text": "Reading first.", "tool_calls": [call("read_file", json!({"path": "README.md"}))],
               "usage": {"input_tokens": 120, "output_tokens": 12}}),
        json!({"tool_calls": [call("effect", json!({"ms": 1})), call("no_such_tool", json!({}))],
               "usage": {"input_tokens": 150, "output_tokens": 20}}),
        json!({"text": "Both done.", "usage": {"input_tokens": 190, "output_tokens": 4}}),
        json!({"text": "Second turn.", "usage": {"input_tokens": 200, "output_tokens": 3}}),
    ]);
    let rt = runtime(
        db.store.clone(),
        model,
        registry(&log),
        RuntimeOptions::default(),
    );
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("README.md"), "hello from the readme\n").unwrap();
    let tenant = TenantId::new();
    let mut cfg = config(ws.path());
    cfg.permission_mode = PermissionMode::Default;
    let session = rt
        .create_session(tenant, &release(&[], Budget::default()), cfg)
        .await
        .unwrap();

    // The live state: a subscriber folding every durable event as it arrives (until the
    // runs are over and the stream has been quiet a moment).
    let mut sub = rt.subscribe(tenant, session, 0).await.unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let folding = {
        let done = done.clone();
        tokio::spawn(async move {
            let mut live = SessionState::default();
            let mut seen = 0;
            loop {
                match sub.next_timeout(Duration::from_millis(300)).await.unwrap() {
                    Some(SubscriptionItem::Event { event }) => {
                        live.apply(&event).unwrap();
                        seen += 1;
                    }
                    Some(_) => {}
                    None if done.load(std::sync::atomic::Ordering::SeqCst) => break,
                    None => {}
                }
            }
            (live, seen)
        })
    };

    let mut outcomes = Vec::new();
    rt.submit(tenant, session, "read, then act").await.unwrap();
    let out = rt.run(tenant, session).await.unwrap();
    assert_eq!(out.pending.len(), 1, "the effect asks: {out:?}");
    outcomes.extend(out.turns);
    allow_the_approval(&rt, tenant, session).await;
    outcomes.extend(rt.run(tenant, session).await.unwrap().turns);
    rt.submit(tenant, session, "and again").await.unwrap();
    let last = rt.run(tenant, session).await.unwrap();
    outcomes.extend(last.turns);

    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let other = db.reopen().await;
    let events = other.read(tenant, session, 1, None).await.unwrap();
    let replayed = SessionState::replay(&events).unwrap();
    assert_eq!(
        SessionState::replay(&events).unwrap(),
        replayed,
        "folding the same journal twice"
    );
    let (live, seen) = tokio::time::timeout(Duration::from_secs(30), folding)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        seen,
        events.len(),
        "the subscriber saw every durable event once"
    );
    assert_eq!(live, replayed, "the live fold and the replayed journal");
    let view = rt.view(tenant, session).await.unwrap();
    assert_eq!(
        view.state, replayed,
        "the runtime's view and the replayed journal"
    );
    assert_eq!(
        outcomes, view.turns,
        "the driver's turn outcomes and the replayed ones"
    );
    assert_eq!(
        outcomes
            .iter()
            .map(|t| t.terminal_reason.as_str())
            .collect::<Vec<_>>(),
        ["completed", "completed"]
    );
    assert_eq!(replayed.version, last.version);
    assert_eq!(replayed.num_steps, 4);
    assert_eq!(
        (replayed.usage.input_tokens, replayed.usage.output_tokens),
        (660, 39),
        "the scripted model's usage, exactly"
    );

    // The store's rows say what the fold says.
    let row = other.get_session(tenant, session).await.unwrap();
    assert_eq!(
        (row.status, row.version),
        (replayed.status, replayed.version)
    );
    let effects = other.list_effects(tenant, session, None).await.unwrap();
    assert_eq!(effects.len(), replayed.effects.len());
    for e in &effects {
        let s = &replayed.effects[&e.operation_key];
        assert_eq!(
            (e.status, e.attempts, &e.tool_call_id),
            (s.status, s.attempts, &s.tool_call_id)
        );
    }
    let approvals = other.list_approvals(tenant, session, None).await.unwrap();
    assert_eq!(approvals.len(), replayed.approvals.len());
    for a in &approvals {
        assert_eq!(a.status, replayed.approvals[&a.approval_id].status);
    }
    assert_eq!(log.of(session).len(), 1, "the approved effect ran once");
}

/// A tool call as a re-run must repeat it: id, name, arguments, and the result's status and
/// text.
fn tool_calls(events: &[Event]) -> Vec<Value> {
    let mut calls = Vec::new();
    for e in events {
        let id = e.correlation.tool_call_id.as_ref().map(ToString::to_string);
        match &e.body {
            EventBody::ToolCallProposed {
                name, arguments, ..
            } => {
                calls.push(json!({"id": id, "name": name, "arguments": arguments}));
            }
            EventBody::ToolCallFinished { status, output, .. } => {
                let c = calls.iter_mut().find(|c| c["id"] == json!(id)).unwrap();
                c["status"] = json!(status.as_str());
                c["output"] = json!(output);
            }
            _ => {}
        }
    }
    calls
}

/// The scripted model that replays a recorded journal: one line per `step.completed`, in
/// order, with its text, its calls (ids, names, arguments) and its usage.
fn script_of(events: &[Event]) -> String {
    let mut lines = Vec::new();
    for e in events {
        if let EventBody::StepCompleted { text, usage, .. } = &e.body {
            let step = e.correlation.step_id;
            let calls: Vec<Value> = events
                .iter()
                .filter(|p| p.correlation.step_id == step)
                .filter_map(|p| match &p.body {
                    EventBody::ToolCallProposed {
                        name, arguments, ..
                    } => Some(json!({
                        "id": p.correlation.tool_call_id.as_ref().map(ToString::to_string),
                        "name": name,
                        "arguments": arguments,
                    })),
                    _ => None,
                })
                .collect();
            let mut line = json!({"usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}});
            if !text.is_empty() {
                line["text"] = json!(text);
            }
            if !calls.is_empty() {
                line["tool_calls"] = json!(calls);
            }
            lines.push(line.to_string());
        }
    }
    lines.join("\n") + "\n"
}

/// What a run left: the journal, the transcript rows (role and content) and the final text.
struct Run {
    events: Vec<Event>,
    transcript: Vec<(String, Value)>,
    final_text: String,
}

/// Builds the case's workspace with its `setup.sh` in a fresh directory, then runs its task on
/// a fresh store of backend `b` with `script` (a path), built-in tools, bypass mode.
async fn run_case(b: Backend, case: &Path, script: &Path, ws_root: &Path) -> Run {
    let ws = ws_root.join("ws");
    let setup = std::process::Command::new("bash")
        .arg(case.join("setup.sh"))
        .arg(&ws)
        .current_dir(case)
        .output()
        .unwrap();
    assert!(
        setup.status.success(),
        "{}: setup.sh: {}",
        case.display(),
        String::from_utf8_lossy(&setup.stderr)
    );
    let db = TestDb::new(b).await;
    let model = Arc::new(ScriptedModel::from_file(script).unwrap());
    let rt = runtime(
        db.store.clone(),
        model,
        registry(&Dispatches::default()),
        RuntimeOptions::default(),
    );
    let tenant = TenantId::new();
    let session = rt
        .create_session(tenant, &release(&[], Budget::default()), config(&ws))
        .await
        .unwrap();
    let task = std::fs::read_to_string(case.join("task.txt")).unwrap();
    rt.submit(tenant, session, task.trim_end_matches('\n'))
        .await
        .unwrap();
    let out = rt.run(tenant, session).await.unwrap();
    assert_eq!(out.turns.len(), 1, "{}: {out:?}", case.display());
    assert_eq!(
        out.turns[0].terminal_reason.as_str(),
        "completed",
        "{}: {out:?}",
        case.display()
    );
    let transcript = db
        .store
        .read_transcript(tenant, session, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|i| (i.role, i.content))
        .collect();
    Run {
        events: journal(&db, tenant, session).await,
        transcript,
        final_text: out.turns[0].final_text.clone(),
    }
}

/// Each recorded real-world trajectory (`tests/realworld`, `../shared/realworld`) runs once as
/// recorded; its journal becomes a script, which runs again in a fresh workspace on a fresh
/// store: the same tool calls with the same results, the same transcript, the same answer —
/// and the calls are the recording's own.
async fn a_recorded_session_reruns_identically(b: Backend) {
    let cases = crate::realworld::cases();
    assert!(!cases.is_empty());
    for (name, dir) in &cases {
        let first_dir = tempfile::tempdir().unwrap();
        let first = run_case(b, dir, &dir.join("script.jsonl"), first_dir.path()).await;
        let recorded: Vec<Value> = std::fs::read_to_string(dir.join("script.jsonl"))
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .flat_map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                v["tool_calls"].as_array().cloned().unwrap_or_default()
            })
            .map(|c| json!([c["name"], c["arguments"]]))
            .collect();
        let ran: Vec<Value> = tool_calls(&first.events)
            .iter()
            .map(|c| json!([c["name"], c["arguments"]]))
            .collect();
        assert_eq!(ran, recorded, "{name}: the recording's calls");

        let second_dir = tempfile::tempdir().unwrap();
        let script = second_dir.path().join("from-journal.jsonl");
        std::fs::write(&script, script_of(&first.events)).unwrap();
        let second = run_case(b, dir, &script, second_dir.path()).await;
        assert_eq!(
            tool_calls(&second.events),
            tool_calls(&first.events),
            "{name}: tool calls"
        );
        assert_eq!(second.transcript, first.transcript, "{name}: transcript");
        assert_eq!(second.final_text, first.final_text, "{name}: answer");
        assert!(
            first.transcript.len() >= 2 * ran.len() + 2,
            "{name}: a transcript of user, calls, results and answer: {:?}",
            first.transcript
        );
    }
}
