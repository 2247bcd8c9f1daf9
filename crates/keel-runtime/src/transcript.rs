//! The store's transcript table: the model-visible transcript kept apart from the journal
//! (retention, privacy and replay differ), written in the same commit as the events that
//! create its rows.
//!
//! **Rows.** Numbered from 0 in the order the journal makes them, without gaps:
//! - one per transcript item of the [`Projection`] — `role` `user` (a started turn's input),
//!   `assistant` (a completed step: text, tool calls, reasoning) or `tool` (a call's one
//!   result) — whose `content` is the [`keel_model::Message`] as JSON (`{"role": …, …}`);
//! - one `summary` row per compaction (`context.compacted`), `content` `{"summary": text,
//!   "first_kept": row}`: `first_kept` is the row of the first item kept after the boundary;
//!   item rows before it are behind the boundary. Kept items may precede the summary row.
//!
//! So the context a step shows the model is, from the table alone: the last summary (under
//! `crate::context::SUMMARY_PREFIX`), then every item row from its `first_kept` on. Every row
//! names the turn that made it. Rows are made from the redacted journal and redacted once
//! more with the session's redactor before they are stored.
//!
//! **One commit.** The projection makes the rows while it folds a staged event; the journal
//! stages them as [`keel_store::AppendExtras::transcript`], so they commit with the event or
//! not at all. A worker that starts a session writes the rows an older build never wrote
//! (`reconcile`); rewriting a row unchanged is a no-op for the store.

use keel_core::{SessionState, TurnId};
use keel_model::Message;
use keel_store::TranscriptItem;
use serde_json::{Value, json};

use crate::error::{Result, RuntimeError};
use crate::journal::Journal;
use crate::projection::Projection;

/// The row of transcript item `m`, made by `turn`, at `index`.
pub(crate) fn item_row(index: u64, turn: Option<TurnId>, m: &Message) -> TranscriptItem {
    let role = match m {
        Message::User { .. } => "user",
        Message::Assistant { .. } => "assistant",
        Message::Tool { .. } => "tool",
    };
    TranscriptItem {
        index,
        turn_id: turn,
        role: role.to_owned(),
        content: serde_json::to_value(m).unwrap_or(Value::Null),
    }
}

/// The row of a compaction boundary at `index`: its summary and the row of the first item kept.
pub(crate) fn summary_row(
    index: u64,
    turn: Option<TurnId>,
    summary: &str,
    first_kept: u64,
) -> TranscriptItem {
    TranscriptItem {
        index,
        turn_id: turn,
        role: "summary".to_owned(),
        content: json!({"summary": summary, "first_kept": first_kept}),
    }
}

/// Writes the rows of `j`'s folded journal that the table lacks: a session run by a build that
/// did not write the table. Cheap when nothing is missing (one read of the last row). A row
/// that holds something else is logged and left (the journal stays authoritative).
///
/// # Errors
/// Store errors reading the journal or the table; [`RuntimeError::Rejected`] for a journal
/// that does not fold.
pub(crate) async fn reconcile(j: &Journal) -> Result<()> {
    let Some(last) = j.proj.rows.checked_sub(1) else {
        return Ok(());
    };
    let have = j.store.read_transcript(j.tenant, j.session, last).await?;
    if have.iter().any(|r| r.index == last) {
        return Ok(());
    }
    let events = j.store.read(j.tenant, j.session, 1, None).await?;
    let mut state = SessionState::default();
    let mut proj = Projection::default();
    proj.record_rows = true;
    for ev in &events {
        state.apply(ev).map_err(|source| RuntimeError::Rejected {
            session: j.session,
            source,
        })?;
        proj.apply(&state, ev);
    }
    let mut rows = proj.new_rows;
    for r in &mut rows {
        j.redactor.redact_value(&mut r.content);
    }
    if let Err(e) = j.store.append_transcript(j.tenant, j.session, &rows).await {
        tracing::warn!(session = %j.session, "transcript table not repaired: {e}");
    }
    Ok(())
}
