//! Reading and checking rows: column conversions (Unix ms, non-negative counts, ids, JSON),
//! the errors that name a bad row, and the checks of an event row and of an append's batch.

use std::time::Duration;

use chrono::{DateTime, Utc};
use keel_core::{Event, SessionId, TenantId};
use serde_json::Value;
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::error::{Result, StoreError};

pub(super) fn ms_to_time(ms: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_millis(ms).unwrap_or_default()
}

/// A non-negative integer column, or `CorruptRow`.
pub(super) fn non_negative(
    table: &'static str,
    id: impl ToString,
    column: &str,
    v: i64,
) -> Result<u64> {
    u64::try_from(v).map_err(|_| corrupt(table, id, format!("{column} is {v}")))
}

/// A timestamp column (Unix ms) within range, or `CorruptRow`.
pub(super) fn time_col(
    table: &'static str,
    id: impl ToString,
    column: &str,
    ms: i64,
) -> Result<DateTime<Utc>> {
    if ms < 0 {
        return Err(corrupt(table, id, format!("{column} is {ms}")));
    }
    DateTime::<Utc>::from_timestamp_millis(ms)
        .ok_or_else(|| corrupt(table, id, format!("{column} is {ms}")))
}

pub(super) fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 2)
}

/// When something taken at `now` (Unix ms) for `ttl` expires, in Unix ms: saturating at the
/// latest time a `DateTime` holds, so a huge TTL is a far future, never an overflow (a panic,
/// or a wrap into the past that frees a held lease) nor a time read back as 1970.
pub(super) fn expires_ms(now: i64, ttl: Duration) -> i64 {
    now.saturating_add(ttl_ms(ttl))
        .min(DateTime::<Utc>::MAX_UTC.timestamp_millis())
}

pub(super) fn to_i64(v: u64) -> Result<i64> {
    i64::try_from(v)
        .map_err(|_| StoreError::InvalidInput(format!("{v} does not fit a 63-bit integer")))
}

pub(super) fn not_found(entity: &'static str, id: impl ToString) -> StoreError {
    StoreError::NotFound {
        entity,
        id: id.to_string(),
    }
}

pub(super) fn corrupt(table: &'static str, id: impl ToString, reason: impl ToString) -> StoreError {
    StoreError::CorruptRow {
        table,
        id: id.to_string(),
        reason: reason.to_string(),
    }
}

pub(super) fn parse_id<T: std::str::FromStr>(table: &'static str, text: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    text.parse::<T>().map_err(|e| corrupt(table, text, e))
}

pub(super) fn parse_json(table: &'static str, id: impl ToString, text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| corrupt(table, id, e))
}

pub(super) fn event_from_row(session: SessionId, row: &AnyRow) -> Result<Event> {
    let seq: i64 = row.try_get("seq")?;
    let body: String = row.try_get("body")?;
    let row_type: String = row.try_get("type")?;
    let ev = Event::decode(&body).map_err(|mut e| {
        e.session_id = e.session_id.or(Some(session));
        e.seq = e.seq.or(u64::try_from(seq).ok());
        StoreError::CorruptEvent(e)
    })?;
    if ev.type_name() != row_type {
        return Err(corrupt(
            "events",
            format!("{session}/{seq}"),
            format!(
                "type column {row_type:?} but the body is a {}",
                ev.type_name()
            ),
        ));
    }
    if ev.session_id != session || i64::try_from(ev.seq).ok() != Some(seq) {
        return Err(corrupt(
            "events",
            format!("{session}/{seq}"),
            format!("body names session {} seq {}", ev.session_id, ev.seq),
        ));
    }
    Ok(ev)
}

pub(super) fn validate_batch(
    tenant: TenantId,
    session: SessionId,
    expected_version: u64,
    events: &[Event],
) -> Result<()> {
    if events.is_empty() {
        return Err(StoreError::InvalidInput("append of no events".into()));
    }
    for (i, ev) in events.iter().enumerate() {
        let want = expected_version
            .checked_add(1 + i as u64)
            .filter(|v| i64::try_from(*v).is_ok())
            .ok_or_else(|| {
                StoreError::InvalidInput(format!("version {expected_version} is out of range"))
            })?;
        if let keel_core::EventBody::SessionCreated { tenant_id, .. } = &ev.body
            && *tenant_id != tenant
        {
            return Err(StoreError::InvalidInput(format!(
                "session.created names tenant {tenant_id}, appended as tenant {tenant}"
            )));
        }
        if ev.session_id != session {
            return Err(StoreError::InvalidInput(format!(
                "event seq {} names session {}, appended to {session}",
                ev.seq, ev.session_id
            )));
        }
        if ev.seq != want {
            return Err(StoreError::InvalidInput(format!(
                "event {i} of the batch has seq {}, expected {want} (after version {expected_version})",
                ev.seq
            )));
        }
    }
    Ok(())
}
