//! The envelope every event travels in: [`Event`], its decoding with classified errors, and the upgrade of older schema versions.

use super::*;

/// One journaled event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Envelope version ([`SCHEMA_VERSION`] when written by this build).
    pub schema_version: u32,
    /// The session whose journal holds it.
    pub session_id: SessionId,
    /// Position in the journal, from 1; the session's version after this event.
    pub seq: u64,
    /// When it was recorded (UTC).
    pub ts: DateTime<Utc>,
    /// Related entity ids.
    #[serde(flatten)]
    pub correlation: Correlation,
    /// Type and payload.
    #[serde(flatten)]
    pub body: EventBody,
}

/// Why a stored or received event could not be read.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("event {} of session {}: {kind}", seq.map(|s| s.to_string()).unwrap_or_else(|| "?".into()), session_id.map(|s| s.to_string()).unwrap_or_else(|| "?".into()))]
pub struct EventDecodeError {
    /// The session, when it could be read.
    pub session_id: Option<SessionId>,
    /// The sequence number, when it could be read.
    pub seq: Option<u64>,
    /// What is wrong.
    pub kind: DecodeErrorKind,
}

/// What is wrong with an event.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DecodeErrorKind {
    /// Not JSON, or the JSON does not have the envelope's shape.
    #[error("malformed: {0}")]
    Malformed(String),
    /// A `type` this build does not know.
    #[error("unknown event type {0:?}")]
    UnknownType(String),
    /// Written by a newer Keel.
    #[error("schema version {found} is newer than this build supports ({supported}); upgrade keel")]
    NewerSchema {
        /// The event's version.
        found: u32,
        /// [`SCHEMA_VERSION`].
        supported: u32,
    },
}

impl Event {
    /// Builds an event at `seq` for `session_id`, stamped `ts`, in the oldest schema version
    /// that can carry `body` ([`EventBody::schema_version`]).
    pub fn new(
        session_id: SessionId,
        seq: u64,
        ts: DateTime<Utc>,
        correlation: Correlation,
        body: EventBody,
    ) -> Self {
        Event {
            schema_version: body.schema_version(),
            session_id,
            seq,
            ts,
            correlation,
            body,
        }
    }

    /// The event type name.
    pub fn type_name(&self) -> &'static str {
        self.body.type_name()
    }

    /// Serializes to the JSON wire shape (see the module docs).
    pub fn encode(&self) -> String {
        // Serializing these types cannot fail: all map keys are strings and no Serialize impl errs.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses, upgrades and checks one event.
    ///
    /// # Errors
    /// [`EventDecodeError`] with the session and sequence number where readable: malformed JSON or
    /// envelope, an unknown `type`, or a `schema_version` above [`SCHEMA_VERSION`].
    pub fn decode(json: &str) -> Result<Event, EventDecodeError> {
        // Fast path: an event of a version that [`upgrade`] leaves as it is parses straight
        // into its type, without a `Value` tree in between (issue 16: the store checks every
        // event it writes this way and reads every row of a load). Anything else (an older or
        // newer version, an unknown type, a malformed row) takes the path below, which
        // upgrades it or classifies the refusal.
        if let Ok(event) = serde_json::from_str::<Event>(json)
            && (UNCHANGED_SINCE..=SCHEMA_VERSION).contains(&event.schema_version)
        {
            return Ok(event);
        }
        let value: Value = serde_json::from_str(json).map_err(|e| EventDecodeError {
            session_id: None,
            seq: None,
            kind: DecodeErrorKind::Malformed(e.to_string()),
        })?;
        Self::decode_value(value)
    }

    /// As [`Event::decode`], from an already parsed value.
    ///
    /// # Errors
    /// See [`Event::decode`].
    pub fn decode_value(mut value: Value) -> Result<Event, EventDecodeError> {
        let session_id = value
            .get("session_id")
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<SessionId>().ok());
        let seq = value.get("seq").and_then(Value::as_u64);
        let err = |kind| EventDecodeError {
            session_id,
            seq,
            kind,
        };
        let version = match value.get("schema_version").and_then(Value::as_u64) {
            Some(v) => u32::try_from(v).unwrap_or(u32::MAX),
            None => {
                return Err(err(DecodeErrorKind::Malformed(
                    "missing schema_version".into(),
                )));
            }
        };
        if version == 0 {
            return Err(err(DecodeErrorKind::Malformed(
                "schema_version 0 does not exist".into(),
            )));
        }
        if version > SCHEMA_VERSION {
            return Err(err(DecodeErrorKind::NewerSchema {
                found: version,
                supported: SCHEMA_VERSION,
            }));
        }
        upgrade(&mut value, version).map_err(|m| err(DecodeErrorKind::Malformed(m)))?;
        match value.get("type").and_then(Value::as_str) {
            None => return Err(err(DecodeErrorKind::Malformed("missing type".into()))),
            Some(t) if !EVENT_TYPES.contains(&t) => {
                return Err(err(DecodeErrorKind::UnknownType(t.to_owned())));
            }
            Some(_) => {}
        }
        serde_json::from_value(value).map_err(|e| err(DecodeErrorKind::Malformed(e.to_string())))
    }
}

/// The oldest schema version whose events [`upgrade`] leaves as they are: from it on, a
/// version added only new event types or new optional fields, so an event of any version in
/// `UNCHANGED_SINCE..=SCHEMA_VERSION` reads by its type alone ([`Event::decode`]'s fast path).
/// An upgrade step that rewrites events of version `v` must raise this to `v + 1`.
pub const UNCHANGED_SINCE: u32 = 2;

/// Upgrades an event object written at `from` to [`SCHEMA_VERSION`], in place.
///
/// # Errors
/// A message when a field the upgrade needs is missing or has the wrong type.
pub fn upgrade(value: &mut Value, from: u32) -> Result<(), String> {
    let Some(obj) = value.as_object_mut() else {
        return Err("event is not a JSON object".into());
    };
    let mut version = from;
    if version < 2 {
        // v1 → v2: `ts_ms` (Unix ms) became `ts` (RFC 3339).
        let ms = obj
            .remove("ts_ms")
            .and_then(|v| v.as_i64())
            .ok_or("schema 1 event without integer ts_ms")?;
        let ts = DateTime::<Utc>::from_timestamp_millis(ms).ok_or("ts_ms out of range")?;
        obj.insert("ts".into(), Value::String(ts.to_rfc3339()));
        version = 2;
    }
    obj.insert("schema_version".into(), Value::from(version));
    Ok(())
}
