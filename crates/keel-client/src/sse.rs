//! [`EventStream`]: a session's events over Server-Sent Events that survives dropped
//! connections. Each durable event's SSE `id` is its `seq`; when the connection ends before the
//! session's `closed` event (a proxy cut it, the server restarted, the network blinked), the
//! stream reconnects with `Last-Event-ID` set to the last seq it handed out and skips anything
//! at or below it, so every durable event is delivered exactly once and in order. Live deltas
//! (`event: delta`, `event: gap`) are not journaled and are not replayed after a reconnect.

use std::pin::Pin;
use std::time::Duration;

use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt};
use serde_json::Value;

use crate::{Client, Error};

/// One item of a session's event stream.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem {
    /// A durable journal event: `seq` (the SSE `id`), its `type` (`turn.finished`) and the
    /// journal envelope (`schema_version`, `session_id`, `seq`, `ts`, `type`, correlation ids,
    /// `payload`).
    Event {
        /// Its position in the journal.
        seq: u64,
        /// Its type.
        kind: String,
        /// The envelope.
        data: Value,
    },
    /// Live output (model text, tool progress), marked `"ephemeral": true`; never replayed.
    Delta(Value),
    /// The server dropped `dropped` deltas for this reader (it was too slow).
    Gap {
        /// How many.
        dropped: u64,
    },
}

/// How an [`EventStream`] reconnects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconnect {
    /// Reconnects tried in a row (with no event in between) before giving up with
    /// [`Error::StreamLost`]; 0 never reconnects.
    pub max_attempts: u32,
    /// Wait before the first reconnect; doubled per failed attempt, at most 5 s.
    pub initial_delay: Duration,
}

impl Default for Reconnect {
    fn default() -> Self {
        Self {
            max_attempts: 10,
            initial_delay: Duration::from_millis(100),
        }
    }
}

type Inner = Pin<
    Box<
        dyn Stream<Item = Result<eventsource_stream::Event, EventStreamError<reqwest::Error>>>
            + Send,
    >,
>;

/// A session's SSE stream with automatic `Last-Event-ID` reconnects; read it with
/// [`EventStream::recv`]. Ends (`None`) after the session's `closed` event.
pub struct EventStream {
    client: Client,
    session: String,
    last_seq: u64,
    inner: Option<Inner>,
    closed: bool,
    reconnects: u32,
    policy: Reconnect,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream")
            .field("session", &self.session)
            .field("last_seq", &self.last_seq)
            .field("reconnects", &self.reconnects)
            .finish_non_exhaustive()
    }
}

fn is_closed(data: &Value) -> bool {
    data.get("type").and_then(Value::as_str) == Some("session.status_changed")
        && data.pointer("/payload/status").and_then(Value::as_str) == Some("closed")
}

/// Whether a failed (re)connect is worth another try: the connection, the server (5xx) or the
/// stream limit (429); not a 4xx that will answer the same again.
fn retryable(e: &Error) -> bool {
    match e.status() {
        Some(s) => s >= 500 || s == 429,
        None => matches!(e, Error::Connect { .. } | Error::Transport { .. }),
    }
}

impl EventStream {
    /// Opens the stream of `session` after seq `after` (0: from the start). The first
    /// connection is made here, so a wrong key or session fails at once.
    ///
    /// # Errors
    /// As [`Client`] requests: [`Error::Api`] (401, 404, 429 …), [`Error::Connect`].
    pub async fn open(
        client: Client,
        session: &str,
        after: u64,
        policy: Reconnect,
    ) -> Result<Self, Error> {
        let mut s = Self {
            client,
            session: session.to_owned(),
            last_seq: after,
            inner: None,
            closed: false,
            reconnects: 0,
            policy,
        };
        s.inner = Some(s.connect().await?);
        Ok(s)
    }

    /// The seq of the last durable event handed out (or the `after` given).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// How many times the stream reconnected.
    pub fn reconnects(&self) -> u32 {
        self.reconnects
    }

    async fn connect(&self) -> Result<Inner, Error> {
        let path = format!("/v1/sessions/{}/events", self.client.segment(&self.session));
        let url = self.client.url(&path);
        let mut req = self
            .client
            .request(reqwest::Method::GET, &path)
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if self.last_seq > 0 {
            req = req.header("Last-Event-ID", self.last_seq.to_string());
        }
        let resp = req
            .send()
            .await
            .map_err(|e| Error::from_reqwest(&url, &e))?;
        let resp = crate::check(&url, resp).await?;
        Ok(Box::pin(resp.bytes_stream().eventsource()))
    }

    async fn reconnect(&mut self) -> Result<(), Error> {
        let mut delay = self.policy.initial_delay;
        let mut last = None;
        for _ in 0..self.policy.max_attempts {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
            self.reconnects += 1;
            match self.connect().await {
                Ok(inner) => {
                    self.inner = Some(inner);
                    return Ok(());
                }
                Err(e) if retryable(&e) => {
                    tracing::debug!(session = %self.session, "event stream reconnect failed: {e}");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::StreamLost {
            session: self.session.clone(),
            attempts: self.policy.max_attempts,
            last: Box::new(last.unwrap_or_else(|| {
                Error::Config("reconnects are turned off (max_attempts 0)".into())
            })),
        })
    }

    /// The next item; `None` after the session's `closed` event. A dropped connection is
    /// reconnected transparently (see the module docs).
    ///
    /// # Errors
    /// [`Error::StreamLost`] when the reconnects failed; a 4xx on reconnect (the key was
    /// revoked, the session deleted); [`Error::Decode`] for an event whose data is not JSON.
    pub async fn recv(&mut self) -> Option<Result<StreamItem, Error>> {
        loop {
            let Some(inner) = self.inner.as_mut() else {
                if self.closed {
                    return None;
                }
                if let Err(e) = self.reconnect().await {
                    self.closed = true;
                    return Some(Err(e));
                }
                continue;
            };
            match inner.next().await {
                Some(Ok(ev)) => {
                    if let Some(item) = self.item(ev) {
                        return Some(item);
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!(session = %self.session, last_seq = self.last_seq, "event stream broke: {e}");
                    self.inner = None;
                }
                None => self.inner = None,
            }
        }
    }

    /// Turns one SSE event into an item; `None` for a durable event already handed out.
    fn item(&mut self, ev: eventsource_stream::Event) -> Option<Result<StreamItem, Error>> {
        let data: Value = match serde_json::from_str(&ev.data) {
            Ok(v) => v,
            Err(e) => {
                return Some(Err(Error::Decode {
                    url: self
                        .client
                        .url(&format!("/v1/sessions/{}/events", self.session)),
                    what: "an event's JSON data",
                    detail: e.to_string(),
                }));
            }
        };
        match ev.event.as_str() {
            "delta" => return Some(Ok(StreamItem::Delta(data))),
            "gap" => {
                let dropped = data.get("dropped").and_then(Value::as_u64).unwrap_or(0);
                return Some(Ok(StreamItem::Gap { dropped }));
            }
            _ => {}
        }
        let seq = ev
            .id
            .trim()
            .parse::<u64>()
            .ok()
            .or_else(|| data.get("seq").and_then(Value::as_u64))?;
        if seq <= self.last_seq {
            return None;
        }
        self.last_seq = seq;
        if is_closed(&data) {
            self.closed = true;
        }
        Some(Ok(StreamItem::Event {
            seq,
            kind: ev.event,
            data,
        }))
    }
}

/// One frame of the tenant-wide stream (`GET /v1/events`, `event: session.status`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct SessionStatusFrame {
    /// The session (a UUID).
    pub session_id: String,
    /// Its status now (`idle`, `running`, `requires_action`, `closed`, …).
    pub status: String,
    /// Its version (the seq of its last journaled event).
    pub version: u64,
}

/// The tenant-wide stream of session status changes: first every session's status, then each
/// change. It has no ids to resume from, so it does not reconnect: open it again to read every
/// session's status anew. Read it with [`StatusStream::recv`].
pub struct StatusStream {
    url: String,
    inner: Inner,
}

impl std::fmt::Debug for StatusStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusStream")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl StatusStream {
    /// Opens the caller's tenant's stream.
    ///
    /// # Errors
    /// As [`Client`] requests: [`Error::Api`] (401, 403 for a system key, 429).
    pub async fn open(client: &Client) -> Result<Self, Error> {
        let path = "/v1/events";
        let url = client.url(path);
        let resp = client
            .request(reqwest::Method::GET, path)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|e| Error::from_reqwest(&url, &e))?;
        let resp = crate::check(&url, resp).await?;
        Ok(Self {
            url,
            inner: Box::pin(resp.bytes_stream().eventsource()),
        })
    }

    /// The next status frame; `None` when the connection ended.
    ///
    /// # Errors
    /// [`Error::Decode`] for a frame whose data is not a status; [`Error::Transport`] when the
    /// connection broke.
    pub async fn recv(&mut self) -> Option<Result<SessionStatusFrame, Error>> {
        loop {
            match self.inner.next().await? {
                Ok(ev) if ev.event == "session.status" => {
                    return Some(serde_json::from_str(&ev.data).map_err(|e| Error::Decode {
                        url: self.url.clone(),
                        what: "a session.status frame",
                        detail: e.to_string(),
                    }));
                }
                Ok(_) => {}
                Err(e) => {
                    return Some(Err(Error::Transport {
                        url: self.url.clone(),
                        detail: e.to_string(),
                    }));
                }
            }
        }
    }
}
