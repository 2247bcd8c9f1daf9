//! Side-table writes that commit with a journal append ([`AppendExtras`]): validated and encoded
//! before the append is queued (so a malformed extra is `InvalidInput` and nothing is written),
//! then written inside the append's transaction, after its compare-and-set succeeded.

use chrono::NaiveDate;
use keel_core::mechanisms::{Mechanism, is_off};
use keel_core::{SessionId, StateMachine};
use serde_json::Value;
use sqlx::{AnyConnection, Row};

use super::batch::{Batch, Bind};
use super::{Dialect, parse_json, to_i64};
use crate::error::{Result, StoreError};
use crate::types::{AppendExtras, SealedKey, TranscriptItem};

/// One effect row to insert or replace.
struct EffectRow {
    key: String,
    call: String,
    tool: String,
    status: &'static str,
    request_hash: String,
    attempts: i64,
    outcome: Option<String>,
    error: Option<String>,
    created_at: i64,
    updated_at: i64,
    /// A first dispatch ([`AppendExtras::claims`]): an existing row must still be `prepared`.
    claim: bool,
}

/// One approval row to insert.
struct ApprovalRow {
    id: String,
    turn: String,
    call: String,
    tool: String,
    arguments: String,
    args_hash: String,
    status: &'static str,
    decision: Option<String>,
    created_at: i64,
    expires_at: i64,
    decided_at: Option<i64>,
}

/// Usage to add to one (day, model) total.
struct UsageAdd {
    day: String,
    model: String,
    input: i64,
    output: i64,
    cache_read: i64,
    cache_write: i64,
    reasoning: i64,
    cost: f64,
    steps: i64,
}

/// Most transcript rows in one `INSERT` (7 parameters each, under SQLite's 32,766 limit).
const TRANSCRIPT_CHUNK: usize = 4000;

/// One transcript row to write.
pub(crate) struct TranscriptRow {
    index: i64,
    turn: Option<String>,
    role: String,
    content: Value,
    text: String,
}

impl TranscriptRow {
    /// Encodes `item`.
    ///
    /// # Errors
    /// `InvalidInput` for an index past 2^63.
    pub(crate) fn of(item: &TranscriptItem) -> Result<Self> {
        Ok(Self {
            index: to_i64(item.index)?,
            turn: item.turn_id.map(|t| t.to_string()),
            role: item.role.clone(),
            content: item.content.clone(),
            text: item.content.to_string(),
        })
    }
}

/// Writes transcript rows of `session` inside the caller's transaction: a new index is
/// inserted; an index that holds the same row is left alone; one that holds a different row is
/// a `Conflict` (the caller must roll back).
///
/// # Errors
/// `Conflict`; `CorruptRow` for a stored row that cannot be read; `Database`.
pub(crate) async fn write_transcript(
    conn: &mut AnyConnection,
    dialect: Dialect,
    tenant: &str,
    session: &str,
    rows: &[TranscriptRow],
    now: i64,
) -> Result<()> {
    let mut batch = Batch::default();
    let inserts = transcript_inserts(&mut batch, tenant, session, rows, now);
    let changed = batch.run(conn, dialect).await?;
    let inserted = inserts.map(|k| changed[k]).sum();
    check_transcript(conn, dialect, tenant, session, rows, inserted).await
}

/// Adds the `INSERT … ON CONFLICT DO NOTHING` statements of `rows` (all rows in one statement
/// per [`TRANSCRIPT_CHUNK`]) to `batch`; returns their indexes there.
fn transcript_inserts(
    batch: &mut Batch,
    tenant: &str,
    session: &str,
    rows: &[TranscriptRow],
    now: i64,
) -> std::ops::Range<usize> {
    let mut first = None;
    let mut last = 0;
    for chunk in rows.chunks(TRANSCRIPT_CHUNK) {
        let insert = format!(
            "{} ON CONFLICT DO NOTHING",
            super::group_commit::values_insert(
                "INSERT INTO transcript (tenant_id, session_id, idx, turn_id, role, content, created_at) VALUES ",
                "(?, ?, ?, ?, ?, ?, ?)",
                chunk.len(),
            )
        );
        let mut binds = Vec::with_capacity(chunk.len() * 7);
        for row in chunk {
            binds.extend([
                Bind::Text(tenant.to_owned()),
                Bind::Text(session.to_owned()),
                Bind::Int(row.index),
                Bind::OptText(row.turn.clone()),
                Bind::Text(row.role.clone()),
                Bind::Text(row.text.clone()),
                Bind::Int(now),
            ]);
        }
        last = batch.push(insert, binds);
        first.get_or_insert(last);
    }
    match first {
        Some(first) => first..last + 1,
        None => 0..0,
    }
}

/// After `inserted` of `rows` were inserted: when some index was already there (a replayed
/// append), each row must hold the same item as the one written.
///
/// # Errors
/// `Conflict` for an index holding a different item; `CorruptRow`; `Database`.
async fn check_transcript(
    conn: &mut AnyConnection,
    dialect: Dialect,
    tenant: &str,
    session: &str,
    rows: &[TranscriptRow],
    inserted: u64,
) -> Result<()> {
    if inserted == rows.len() as u64 {
        return Ok(());
    }
    let select = dialect.sql(TRANSCRIPT_ITEM);
    for row in rows {
        // Inserted above, or already there: either way it must be this item now.
        let existing = sqlx::query(&select)
            .bind(tenant.to_owned())
            .bind(session.to_owned())
            .bind(row.index)
            .fetch_one(&mut *conn)
            .await?;
        let role: String = existing.try_get("role")?;
        let content: String = existing.try_get("content")?;
        row.is_held(session, &role, &content)?;
    }
    Ok(())
}

/// [`check_transcript`] on the SQLite writer thread's connection.
fn check_transcript_sqlite(
    conn: &rusqlite::Connection,
    tenant: &str,
    session: &str,
    rows: &[TranscriptRow],
    inserted: u64,
) -> Result<()> {
    if inserted == rows.len() as u64 {
        return Ok(());
    }
    let mut select = conn.prepare_cached(&Dialect::Sqlite.sql(TRANSCRIPT_ITEM))?;
    for row in rows {
        let (role, content): (String, String) = select
            .query_row(rusqlite::params![tenant, session, row.index], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?;
        row.is_held(session, &role, &content)?;
    }
    Ok(())
}

/// The stored role and content of one transcript index.
const TRANSCRIPT_ITEM: &str =
    "SELECT role, content FROM transcript WHERE tenant_id = ? AND session_id = ? AND idx = ?";

impl TranscriptRow {
    /// Whether the stored `role` and `content` (JSON text) at this row's index are this row.
    ///
    /// # Errors
    /// `Conflict` when they are another item; `CorruptRow` for content that is not JSON.
    fn is_held(&self, session: &str, role: &str, content: &str) -> Result<()> {
        if role != self.role || parse_json("transcript", self.index, content)? != self.content {
            return Err(StoreError::Conflict(format!(
                "transcript item {} of session {session} already holds a different item",
                self.index
            )));
        }
        Ok(())
    }
}

/// The statement of [`UPSERT_EFFECT`], for `concat!`.
macro_rules! upsert_effect {
    () => {
        "INSERT INTO effects (tenant_id, operation_key, session_id, tool_call_id, tool_name, status, \
         request_hash, attempts, outcome, error, created_at, updated_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
         ON CONFLICT (tenant_id, operation_key) DO UPDATE SET tool_call_id = excluded.tool_call_id, \
         tool_name = excluded.tool_name, status = excluded.status, request_hash = excluded.request_hash, \
         attempts = excluded.attempts, outcome = excluded.outcome, error = excluded.error, \
         updated_at = excluded.updated_at WHERE effects.session_id = excluded.session_id"
    };
}

/// Inserts or replaces an append's effect row: the journal is authoritative for a key of its
/// own session (0 rows changed: the key belongs to another session).
const UPSERT_EFFECT: &str = upsert_effect!();

/// [`UPSERT_EFFECT`] for a first dispatch ([`AppendExtras::claims`]): an existing row is
/// replaced only while still `prepared` (0 rows changed: it records a dispatch already).
const UPSERT_CLAIMED_EFFECT: &str = concat!(upsert_effect!(), " AND effects.status = 'prepared'");

/// Deletes one intent (tenant, session, intent id): its poster's withdrawal, a handler's taking
/// it, and an append's `consume_intent`.
pub(crate) const DELETE_INTENT: &str =
    "DELETE FROM intents WHERE tenant_id = ? AND session_id = ? AND intent_id = ?";

/// [`AppendExtras`], checked and encoded for the append of `session`.
pub(crate) struct Extras {
    effects: Vec<EffectRow>,
    approvals: Vec<ApprovalRow>,
    usage: Vec<UsageAdd>,
    /// Unix ms; `Some(None)` clears.
    wake_at: Option<Option<i64>>,
    seal: Vec<(SealedKey, Vec<u8>)>,
    unseal: Vec<SealedKey>,
    /// The release the session row is re-pointed at.
    release_id: Option<String>,
    release_reservation: bool,
    transcript: Vec<TranscriptRow>,
    /// The intent the append consumes, with the appended session (named by `IntentGone`).
    consume_intent: Option<(SessionId, String)>,
}

impl Extras {
    /// Checks and encodes `extras` for an append to `session`; `None` when there is nothing to
    /// write (the append's fast path).
    ///
    /// # Errors
    /// `InvalidInput`: an effect or approval of another session, a bad usage day, a negative or
    /// non-finite cost, a count or transcript index past 2^63.
    pub fn prepare(session: SessionId, extras: &AppendExtras) -> Result<Option<Self>> {
        if extras.is_empty() {
            return Ok(None);
        }
        if let Some(k) = extras
            .claims
            .iter()
            .find(|k| !extras.effects.iter().any(|e| e.operation_key == **k))
        {
            return Err(StoreError::InvalidInput(format!(
                "effect {k} is claimed without its row in the append's effects"
            )));
        }
        let mut effects = Vec::with_capacity(extras.effects.len());
        for e in &extras.effects {
            if e.session_id != session {
                return Err(StoreError::InvalidInput(format!(
                    "effect {} names session {}, appended to {session}",
                    e.operation_key, e.session_id
                )));
            }
            effects.push(EffectRow {
                key: e.operation_key.0.clone(),
                call: e.tool_call_id.0.clone(),
                tool: e.tool_name.clone(),
                status: e.status.as_str(),
                request_hash: e.request_hash.clone(),
                attempts: i64::from(e.attempts),
                outcome: e.outcome.as_ref().map(Value::to_string),
                error: e.error.clone(),
                created_at: e.created_at.timestamp_millis(),
                updated_at: e.updated_at.timestamp_millis(),
                claim: extras.claims.contains(&e.operation_key),
            });
        }
        let mut approvals = Vec::with_capacity(extras.approvals.len());
        for a in &extras.approvals {
            if a.session_id != session {
                return Err(StoreError::InvalidInput(format!(
                    "approval {} names session {}, appended to {session}",
                    a.approval_id, a.session_id
                )));
            }
            let decision = a
                .decision
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| StoreError::InvalidInput(format!("approval decision: {e}")))?;
            approvals.push(ApprovalRow {
                id: a.approval_id.to_string(),
                turn: a.turn_id.to_string(),
                call: a.tool_call_id.0.clone(),
                tool: a.tool_name.clone(),
                arguments: a.arguments.to_string(),
                args_hash: a.args_hash.clone(),
                status: a.status.as_str(),
                decision,
                created_at: a.created_at.timestamp_millis(),
                expires_at: a.expires_at.timestamp_millis(),
                decided_at: a.decided_at.map(|t| t.timestamp_millis()),
            });
        }
        let mut usage = Vec::with_capacity(extras.usage.len());
        for u in &extras.usage {
            check_day(&u.day)?;
            if !u.cost_usd.is_finite() || u.cost_usd < 0.0 {
                return Err(StoreError::InvalidInput(format!(
                    "usage cost {} for {} / {} must be finite and not negative",
                    u.cost_usd, u.day, u.model
                )));
            }
            usage.push(UsageAdd {
                day: u.day.clone(),
                model: u.model.clone(),
                input: to_i64(u.usage.input_tokens)?,
                output: to_i64(u.usage.output_tokens)?,
                cache_read: to_i64(u.usage.cache_read_tokens)?,
                cache_write: to_i64(u.usage.cache_write_tokens)?,
                reasoning: to_i64(u.usage.reasoning_tokens)?,
                cost: u.cost_usd,
                steps: i64::from(u.steps),
            });
        }
        Ok(Some(Extras {
            effects,
            approvals,
            usage,
            wake_at: extras.wake_at.map(|w| w.map(|t| t.timestamp_millis())),
            seal: extras.seal.clone(),
            unseal: extras.unseal.clone(),
            release_id: extras.release_id.as_ref().map(|r| r.0.clone()),
            release_reservation: extras.release_reservation,
            transcript: extras
                .transcript
                .iter()
                .map(TranscriptRow::of)
                .collect::<Result<_>>()?,
            consume_intent: extras.consume_intent.clone().map(|id| (session, id)),
        }))
    }

    /// Writes the extras inside the caller's transaction, after the append's compare-and-set
    /// succeeded (so the session exists for `tenant`), as one [`Batch`] that starts with the
    /// caller's `head` statements (the append's event rows): one round trip to SQLite's worker
    /// thread for the events and every extra (a read-only step's events, transcript rows, usage
    /// and reservation release are one hand-off); the counts each reports are checked
    /// afterwards. On error the caller must roll back (a lost intent, checked first among the
    /// counts, fails the append whatever else was written).
    ///
    /// # Errors
    /// `IntentGone` for a consumed intent whose row is gone; `Conflict` for an approval id
    /// that exists, an operation key held by another session or a transcript index holding a
    /// different row; `NotFound` for a release the tenant has not stored; `Database`.
    pub async fn apply(
        &self,
        conn: &mut AnyConnection,
        dialect: Dialect,
        tenant: &str,
        session: &str,
        head: Batch,
    ) -> Result<()> {
        let (batch, checks) = self.statements(tenant, session, head);
        let changed = batch.run(conn, dialect).await?;
        let inserted = checks.verify(session, &changed)?;
        check_transcript(conn, dialect, tenant, session, &self.transcript, inserted).await
    }

    /// [`Extras::apply`] on the SQLite writer thread's connection (inside its transaction).
    ///
    /// # Errors
    /// As [`Extras::apply`].
    pub fn apply_sqlite(
        &self,
        conn: &rusqlite::Connection,
        tenant: &str,
        session: &str,
        head: Batch,
    ) -> Result<()> {
        let (batch, checks) = self.statements(tenant, session, head);
        let changed = batch.run_sqlite(conn)?;
        let inserted = checks.verify(session, &changed)?;
        check_transcript_sqlite(conn, tenant, session, &self.transcript, inserted)
    }

    /// The statements of these extras after `head`'s, and what their changed-row counts must
    /// show ([`ExtrasChecks::verify`]).
    fn statements<'a>(
        &'a self,
        tenant: &str,
        session: &str,
        head: Batch,
    ) -> (Batch, ExtrasChecks<'a>) {
        use Bind::{Int, OptInt, OptText, Real, Text};
        let mut batch = head;
        let intent = self.consume_intent.as_ref().map(|(session_id, intent)| {
            let k = batch.push(
                DELETE_INTENT,
                vec![
                    Text(tenant.to_owned()),
                    Text(session.to_owned()),
                    Text(intent.clone()),
                ],
            );
            (k, session_id, intent)
        });
        let t = || Text(tenant.to_owned());
        let s = || Text(session.to_owned());
        let mut effects = Vec::with_capacity(self.effects.len());
        for e in &self.effects {
            let k = batch.push(
                if e.claim {
                    UPSERT_CLAIMED_EFFECT
                } else {
                    UPSERT_EFFECT
                },
                vec![
                    t(),
                    Text(e.key.clone()),
                    s(),
                    Text(e.call.clone()),
                    Text(e.tool.clone()),
                    Text(e.status.to_owned()),
                    Text(e.request_hash.clone()),
                    Int(e.attempts),
                    OptText(e.outcome.clone()),
                    OptText(e.error.clone()),
                    Int(e.created_at),
                    Int(e.updated_at),
                ],
            );
            effects.push((k, &e.key, e.claim));
        }
        let mut approvals = Vec::with_capacity(self.approvals.len());
        for a in &self.approvals {
            let k = batch.push(
                "INSERT INTO approvals (tenant_id, approval_id, session_id, turn_id, tool_call_id, tool_name, \
                 arguments, args_hash, status, decision, created_at, expires_at, decided_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                vec![
                    t(),
                    Text(a.id.clone()),
                    s(),
                    Text(a.turn.clone()),
                    Text(a.call.clone()),
                    Text(a.tool.clone()),
                    Text(a.arguments.clone()),
                    Text(a.args_hash.clone()),
                    Text(a.status.to_owned()),
                    OptText(a.decision.clone()),
                    Int(a.created_at),
                    Int(a.expires_at),
                    OptInt(a.decided_at),
                ],
            );
            approvals.push((k, &a.id));
        }
        for u in &self.usage {
            batch.push(
                "INSERT INTO usage (tenant_id, day, model, input_tokens, output_tokens, cache_read_tokens, \
                 cache_write_tokens, reasoning_tokens, cost_usd, steps) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
                 ON CONFLICT (tenant_id, day, model) DO UPDATE SET \
                 input_tokens = usage.input_tokens + excluded.input_tokens, \
                 output_tokens = usage.output_tokens + excluded.output_tokens, \
                 cache_read_tokens = usage.cache_read_tokens + excluded.cache_read_tokens, \
                 cache_write_tokens = usage.cache_write_tokens + excluded.cache_write_tokens, \
                 reasoning_tokens = usage.reasoning_tokens + excluded.reasoning_tokens, \
                 cost_usd = usage.cost_usd + excluded.cost_usd, \
                 steps = usage.steps + excluded.steps",
                vec![
                    t(),
                    Text(u.day.clone()),
                    Text(u.model.clone()),
                    Int(u.input),
                    Int(u.output),
                    Int(u.cache_read),
                    Int(u.cache_write),
                    Int(u.reasoning),
                    Real(u.cost),
                    Int(u.steps),
                ],
            );
        }
        for key in &self.unseal {
            batch.push(
                "DELETE FROM sealed_items WHERE tenant_id = ? AND session_id = ? AND kind = ? AND item_id = ?",
                vec![t(), s(), Text(key.kind.as_str().to_owned()), Text(key.id.clone())],
            );
        }
        for (key, sealed) in &self.seal {
            batch.push(
                "INSERT INTO sealed_items (tenant_id, session_id, kind, item_id, sealed, created_at) \
                 VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant_id, session_id, kind, item_id) \
                 DO UPDATE SET sealed = excluded.sealed",
                vec![
                    t(),
                    s(),
                    Text(key.kind.as_str().to_owned()),
                    Text(key.id.clone()),
                    Bind::Blob(sealed.clone()),
                    Int(super::now_ms()),
                ],
            );
        }
        let release = self.release_id.as_ref().map(|release| {
            let k = batch.push(
                "UPDATE sessions SET release_id = ? WHERE tenant_id = ? AND session_id = ? \
                 AND EXISTS (SELECT 1 FROM releases WHERE releases.tenant_id = ? AND releases.release_id = ?)",
                vec![Text(release.clone()), t(), s(), t(), Text(release.clone())],
            );
            (k, release)
        });
        if self.release_reservation {
            batch.push(
                "DELETE FROM usage_reservations WHERE tenant_id = ? AND session_id = ?",
                vec![t(), s()],
            );
        }
        let transcript = transcript_inserts(
            &mut batch,
            tenant,
            session,
            &self.transcript,
            super::now_ms(),
        );
        if let Some(at) = self.wake_at {
            batch.push(
                "UPDATE sessions SET wake_at = ? WHERE tenant_id = ? AND session_id = ?",
                vec![OptInt(at), t(), s()],
            );
        }
        (
            batch,
            ExtrasChecks {
                intent,
                effects,
                approvals,
                release,
                transcript,
            },
        )
    }
}

/// What the statements of [`Extras::statements`] must have changed, by their index in the batch.
struct ExtrasChecks<'a> {
    /// The consumed intent's `DELETE` (with the appended session and the intent id).
    intent: Option<(usize, &'a SessionId, &'a String)>,
    /// Each effect's upsert and whether it is a claim (0 rows: the key belongs to another
    /// session; for a claim also: its row is past `prepared`).
    effects: Vec<(usize, &'a String, bool)>,
    /// Each approval's insert (0 rows: the id exists).
    approvals: Vec<(usize, &'a String)>,
    /// The release re-point (0 rows: no such release).
    release: Option<(usize, &'a String)>,
    /// The transcript inserts.
    transcript: std::ops::Range<usize>,
}

impl ExtrasChecks<'_> {
    /// Checks the batch's counts (`changed`, by statement index); returns the transcript rows
    /// inserted, for [`check_transcript`].
    ///
    /// # Errors
    /// `IntentGone`, `Conflict` (an effect of another session, an existing approval), `NotFound`
    /// (the release).
    fn verify(self, session: &str, changed: &[u64]) -> Result<u64> {
        if let Some((k, session_id, intent)) = self.intent
            && changed[k] == 0
            && !is_off(Mechanism::IntentConsume)
        {
            return Err(StoreError::IntentGone {
                session: *session_id,
                intent_id: intent.clone(),
            });
        }
        if let Some((_, key, claim)) = self.effects.iter().find(|(k, ..)| changed[*k] == 0) {
            if *claim {
                return Err(StoreError::EffectClaimed {
                    key: (*key).clone(),
                });
            }
            return Err(StoreError::Conflict(format!(
                "effect {key} belongs to another session than {session}"
            )));
        }
        if let Some((_, id)) = self.approvals.iter().find(|(k, _)| changed[*k] == 0) {
            return Err(StoreError::Conflict(format!(
                "approval {id} already exists"
            )));
        }
        if let Some((k, release)) = self.release
            && changed[k] == 0
        {
            return Err(StoreError::NotFound {
                entity: "release",
                id: release.clone(),
            });
        }
        Ok(self.transcript.map(|k| changed[k]).sum())
    }
}

/// A UTC day as `YYYY-MM-DD` (a real date, zero-padded), or `InvalidInput`.
pub(crate) fn check_day(day: &str) -> Result<()> {
    let ok = day.len() == 10
        && NaiveDate::parse_from_str(day, "%Y-%m-%d")
            .is_ok_and(|d| d.format("%Y-%m-%d").to_string() == day);
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidInput(format!(
            "day {day:?} is not a UTC date YYYY-MM-DD"
        )))
    }
}
