//! The store's transcript table: the model-visible transcript, written in the same commit as
//! the events that create its items, with compaction boundaries, redacted.
//!
//! Before, the table was never written (only the store's own conformance test used it): a
//! host or operator reading a session's transcript found nothing.

use std::sync::Arc;

use keel_core::{EventBody, LeaseEpoch};
use keel_model::Message;
use keel_runtime::context::SUMMARY_PREFIX;
use keel_runtime::journal::Journal;
use keel_runtime::{REDACTED, Redactor};
use keel_store::TranscriptItem;
use serde_json::json;

use crate::common::*;
use crate::on_both;

on_both!(
    the_transcript_table_holds_the_projection_with_its_boundary_and_no_secret,
    a_session_journaled_without_transcript_rows_gets_them_when_a_worker_starts_it,
);

fn message(row: &TranscriptItem) -> Message {
    serde_json::from_value(row.content.clone())
        .unwrap_or_else(|e| panic!("row {} is not a message ({e}): {}", row.index, row.content))
}

/// After a turn with a tool call and a second turn that compacts, the table holds exactly the
/// projection's items in order (rows numbered from 0 without gaps, each item's role and turn),
/// plus one `summary` row per compaction whose `first_kept` is the row of the first item kept;
/// the model's context rebuilt from the table alone equals the runtime's projected context;
/// and no row holds a secret (a configured pattern, in the user input and in a tool result).
async fn the_transcript_table_holds_the_projection_with_its_boundary_and_no_secret(b: Backend) {
    let secret = "tok_4242";
    let long = "lorem ipsum dolor sit amet ".repeat(24);
    let f = fixture_with(
        b,
        scripted(&[
            json!({"text": "reading it", "tool_calls": [call("read_file", json!({"path": "secret.txt"}))]}),
            json!({"text": long}),
            json!({"text": "short"}),
        ]),
        &["read_file"],
        Default::default(),
        |c| c.secret_patterns = vec!["tok_[0-9]{4}".into()],
    )
    .await;
    std::fs::write(f.ws.path().join("secret.txt"), format!("token={secret}\n")).unwrap();
    f.rt.submit(
        f.tenant,
        f.session,
        &format!("read secret.txt, it has {secret}"),
    )
    .await
    .unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    // A window the context already fills: the next turn's first step compacts.
    let est =
        f.rt.project_context(f.tenant, f.session)
            .await
            .unwrap()
            .estimated_tokens;
    f.rt.update_config(f.tenant, f.session, |c| c.context_window_tokens = Some(est))
        .await
        .unwrap();
    f.rt.submit(f.tenant, f.session, "second").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    let evs = f.events().await;
    let compactions: Vec<&String> = evs
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::ContextCompacted { summary, .. } => Some(summary),
            _ => None,
        })
        .collect();
    assert!(!compactions.is_empty(), "compacted: {:?}", f.types().await);

    let rows =
        f.db.store
            .read_transcript(f.tenant, f.session, 0)
            .await
            .unwrap();
    let journal = Journal::load(
        f.db.store.clone(),
        f.tenant,
        f.session,
        LeaseEpoch(0),
        Arc::new(Redactor::new(&[], &[]).unwrap()),
    )
    .await
    .unwrap();
    let proj = journal.projection();
    assert_eq!(
        rows.iter().map(|r| r.index).collect::<Vec<_>>(),
        (0..rows.len() as u64).collect::<Vec<_>>(),
        "rows numbered from 0 without gaps"
    );
    let items: Vec<&TranscriptItem> = rows.iter().filter(|r| r.role != "summary").collect();
    assert_eq!(
        items.iter().map(|r| message(r)).collect::<Vec<_>>(),
        proj.items.iter().map(|m| (**m).clone()).collect::<Vec<_>>(),
        "exactly the projection's items, in order"
    );
    for r in &items {
        let role = r.content["role"].as_str().unwrap();
        assert_eq!(r.role, role, "row {}", r.index);
        assert!(r.turn_id.is_some(), "row {} names its turn", r.index);
    }
    assert!(
        items.iter().any(|r| matches!(message(r), Message::Assistant { ref tool_calls, .. } if tool_calls.len() == 1))
            && items.iter().any(|r| r.role == "tool"),
        "the call and its result are rows"
    );
    // One summary row per compaction, in order; the last one's boundary is the projection's.
    let summaries: Vec<&TranscriptItem> = rows.iter().filter(|r| r.role == "summary").collect();
    assert_eq!(
        summaries
            .iter()
            .map(|r| r.content["summary"].as_str().unwrap())
            .collect::<Vec<_>>(),
        compactions.iter().map(|s| s.as_str()).collect::<Vec<_>>()
    );
    let last = summaries.last().unwrap();
    let first_kept = last.content["first_kept"].as_u64().unwrap();
    let kept_item = usize::try_from(proj.first_kept).unwrap();
    assert_eq!(first_kept, items[kept_item].index, "the boundary row");
    assert!(
        first_kept < last.index,
        "the boundary is behind the summary row"
    );
    // The model's view, from the table alone: the summary, then every item row from the boundary.
    let mut visible = vec![Message::User {
        content: format!(
            "{SUMMARY_PREFIX}{}",
            last.content["summary"].as_str().unwrap()
        ),
    }];
    visible.extend(
        items
            .iter()
            .filter(|r| r.index >= first_kept)
            .map(|r| message(r)),
    );
    let ctx = f.rt.project_context(f.tenant, f.session).await.unwrap();
    let shown: Vec<Message> = ctx.messages.iter().map(|m| (**m).clone()).collect();
    assert_eq!(visible, shown);
    // Redacted like the journal.
    let text = serde_json::to_string(&rows).unwrap();
    assert!(!text.contains(secret), "{text}");
    assert!(text.contains(REDACTED), "{text}");
}

/// A journal written by a build that kept no transcript (the same events appended with no
/// extras, to a second session) gets its rows, the same ones, when a worker starts the session.
async fn a_session_journaled_without_transcript_rows_gets_them_when_a_worker_starts_it(b: Backend) {
    let f = fixture(
        b,
        &[
            json!({"text": "listing", "tool_calls": [call("list_dir", json!({"path": "."}))]}),
            json!({"text": "done"}),
        ],
        |_| {},
    )
    .await;
    f.rt.submit(f.tenant, f.session, "list").await.unwrap();
    f.rt.run(f.tenant, f.session).await.unwrap();
    let rows =
        f.db.store
            .read_transcript(f.tenant, f.session, 0)
            .await
            .unwrap();
    assert_eq!(
        rows.len(),
        4,
        "user, assistant with the call, its result, answer"
    );
    // The same journal under another session id, as an older build wrote it.
    let rec = f.db.store.get_session(f.tenant, f.session).await.unwrap();
    let old = keel_core::SessionId::new();
    f.db.store
        .create_session(
            f.tenant,
            keel_store::NewSession {
                session_id: old,
                release_id: rec.release_id,
                parent_session_id: None,
                metadata: rec.metadata,
            },
        )
        .await
        .unwrap();
    let events: Vec<keel_core::Event> = f
        .events()
        .await
        .into_iter()
        .map(|mut e| {
            e.session_id = old;
            e
        })
        .collect();
    let lease =
        f.db.store
            .acquire_lease(
                f.tenant,
                old,
                "old-build",
                std::time::Duration::from_secs(5),
            )
            .await
            .unwrap();
    f.db.store
        .append(f.tenant, old, 0, lease.epoch, &events)
        .await
        .unwrap();
    f.db.store.release_lease(f.tenant, &lease).await.unwrap();
    assert!(
        f.db.store
            .read_transcript(f.tenant, old, 0)
            .await
            .unwrap()
            .is_empty()
    );
    f.rt.run(f.tenant, old).await.unwrap();
    assert_eq!(
        f.db.store.read_transcript(f.tenant, old, 0).await.unwrap(),
        rows
    );
}
