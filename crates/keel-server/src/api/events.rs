//! Events: a session's journal as JSON pages or as a Server-Sent Events stream, and a tenant-wide
//! stream of session status changes.
//!
//! **SSE** (`Accept: text/event-stream`): each durable event is one SSE event whose `id` is its
//! `seq`, `event` its type (`turn.finished`) and `data` the journal envelope; the stream starts
//! after `Last-Event-ID` (or `after`), so a client that reconnects with the last id it saw gets
//! every later durable event exactly once. Live output comes as `event: delta` (model text,
//! tool progress) and `event: gap` (deltas lost to a slow reader), without an `id` and with
//! `"ephemeral": true` in their data: they are not journaled and not replayed. A comment
//! (`: heartbeat`) every 15 s keeps proxies from closing an idle stream. A key may hold
//! `max_streams_per_key` streams at once (429 beyond). The stream ends after the session's
//! `closed` event, and when the caller's credential no longer authenticates (a revoked or
//! expired key, an inspector session signed out or past its lifetime): checked every
//! [`RECHECK`] (answered by a check of the same key made less than
//! [`crate::auth::StreamChecks::FRESH`] before, so a revocation by another process ends the
//! stream within `RECHECK + FRESH`, 2.9 s) and at once when this process ends a session or
//! revokes a key.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::time::Duration;

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};
use keel_core::{EventBody, SessionId, SessionStatus, StateMachine, TenantId};
use keel_runtime::{Subscription, SubscriptionItem};
use keel_store::{Role, SessionQuery, Store};
use serde_json::{Value, json};
use tokio_util::task::AbortOnDropHandle;

use super::{P, Q, session_id};
use crate::auth::{Caller, Credential, still_valid};
use crate::error::{ApiError, Problem};
use crate::state::{Shared, StreamSlot};
use crate::types::{EventPage, EventsQuery};

/// How the client wants the events.
enum Wants {
    Json,
    Sse,
}

fn wants(headers: &HeaderMap) -> Result<Wants, ApiError> {
    let Some(accept) = headers.get(header::ACCEPT) else {
        return Ok(Wants::Json);
    };
    let accept = accept.to_str().unwrap_or("").to_ascii_lowercase();
    if accept.contains("text/event-stream") {
        return Ok(Wants::Sse);
    }
    if accept.is_empty()
        || accept.contains("application/json")
        || accept.contains("*/*")
        || accept.contains("application/*")
    {
        return Ok(Wants::Json);
    }
    Err(ApiError::not_acceptable(
        "events are served as application/json pages or as text/event-stream",
    ))
}

/// The largest seq a journal can hold (2^63 - 1, the stores' signed 64-bit column): reading or
/// subscribing from past it is clamped here, where nothing ever is.
const LAST_SEQ: u64 = i64::MAX as u64;

/// The `Last-Event-ID` header: a seq, at most [`LAST_SEQ`] (as `after`); 400 naming the header
/// otherwise.
fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    headers
        .get("last-event-id")
        .map(|v| {
            let id = v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::bad_request("last-event-id", "Last-Event-ID must be a seq (a number)")
                })?;
            if id > LAST_SEQ {
                return Err(ApiError::bad_request(
                    "last-event-id",
                    format!("Last-Event-ID {id} is past any seq (at most 2^63 - 1)"),
                ));
            }
            Ok(id)
        })
        .transpose()
}

fn sse_of(item: SubscriptionItem) -> (SseEvent, bool) {
    match item {
        SubscriptionItem::Event { event } => {
            let closed = matches!(
                &event.body,
                EventBody::SessionStatusChanged {
                    status: SessionStatus::Closed,
                    ..
                }
            );
            let data = serde_json::to_string(&event).unwrap_or_default();
            (
                SseEvent::default()
                    .id(event.seq.to_string())
                    .event(event.type_name())
                    .data(data),
                closed,
            )
        }
        SubscriptionItem::Delta { delta } => {
            let mut v = serde_json::to_value(&delta).unwrap_or(Value::Null);
            if let Value::Object(m) = &mut v {
                m.insert("ephemeral".into(), Value::Bool(true));
            }
            (
                SseEvent::default().event("delta").data(v.to_string()),
                false,
            )
        }
        SubscriptionItem::Gap { dropped } => (
            SseEvent::default()
                .event("gap")
                .data(json!({"ephemeral": true, "dropped": dropped}).to_string()),
            false,
        ),
    }
}

fn session_stream(
    sub: Subscription,
    slot: StreamSlot,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    futures_util::stream::unfold((sub, slot, false), |(mut sub, slot, done)| async move {
        if done {
            return None;
        }
        match sub.next().await {
            Ok(item) => {
                let (ev, closed) = sse_of(item);
                Some((Ok(ev), (sub, slot, closed)))
            }
            Err(e) => {
                tracing::debug!("event stream ends: {e}");
                None
            }
        }
    })
}

/// How often an open stream checks its caller's credential again, besides at once when a
/// session ends or a key is revoked in this process ([`crate::inspector::signin::SignIns::changed`]).
pub const RECHECK: Duration = Duration::from_secs(2);

/// Items an event stream's producer runs ahead of its client: beyond these it waits for the
/// client to read (a slow client then loses deltas to a gap, never durable events).
const STREAM_AHEAD: usize = 16;

/// `inner` until the credential that opened it no longer authenticates ([`still_valid`]:
/// the key revoked or expired, the inspector session signed out, everywhere or here, or past
/// its lifetime): checked every [`RECHECK`] and at each change of the inspector's sessions. Auth
/// is not only checked when a stream opens. It also ends when the server stops
/// ([`crate::state::AppState::closing`]).
///
/// Three parts, so that nothing a stream holds waits on its client:
/// - `inner` runs as a task of its own ([`detached`]), [`STREAM_AHEAD`] items ahead of the
///   response body, parked only between items. Polled only as the client read, a stream whose
///   client stopped reading (a full socket buffer: hyper stops asking for frames) froze
///   wherever it was, in the middle of a store read included, holding its place in the pool's
///   queue — sqlx's pool is fair: a freed connection goes to the longest waiter even when its
///   task is not polled — and at 1,000 subscribers a few such slow readers stalled every
///   request for 30 s (`cargo bench -p keel --bench fanout`).
/// - The credential is watched by a task of its own ([`watch_credential`]), whether or not the
///   client reads; when it fails, the stream's stop token is cancelled.
/// - The body ends at its next poll once the token is cancelled, before any item still
///   buffered: a client that paused reading gets nothing more after a revocation (the bytes
///   already in the socket's buffers aside).
fn while_valid<S>(
    inner: S,
    state: Shared,
    credential: Credential,
) -> impl Stream<Item = S::Item> + Send + 'static
where
    S: Stream + Send + 'static,
    S::Item: Send + 'static,
{
    let stop = tokio_util::sync::CancellationToken::new();
    let watcher = AbortOnDropHandle::new(tokio::spawn(watch_credential(
        state,
        credential,
        stop.clone(),
    )));
    let items = Box::pin(detached(inner));
    futures_util::stream::unfold(
        (items, stop, watcher),
        |(mut items, stop, watcher)| async move {
            tokio::select! {
                biased;
                () = stop.cancelled() => None,
                item = items.next() => item.map(|i| (i, (items, stop, watcher))),
            }
        },
    )
}

/// `inner` polled by a task of its own, up to [`STREAM_AHEAD`] items ahead of the returned
/// stream's reader; dropping the returned stream aborts the task (and drops `inner`).
fn detached<S>(inner: S) -> impl Stream<Item = S::Item> + Send + 'static
where
    S: Stream + Send + 'static,
    S::Item: Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(STREAM_AHEAD);
    let producer = tokio::spawn(async move {
        let mut items = std::pin::pin!(inner);
        while let Some(item) = items.next().await {
            if tx.send(item).await.is_err() {
                break;
            }
        }
    });
    let guard = AbortOnDropHandle::new(producer);
    futures_util::stream::unfold((rx, guard), |(mut rx, guard)| async move {
        rx.recv().await.map(|item| (item, (rx, guard)))
    })
}

/// [`while_valid`]'s watch: checks `credential` every [`RECHECK`] and at each change of the
/// inspector's sessions, and cancels `stop` when it no longer authenticates or the server
/// stops.
async fn watch_credential(
    state: Shared,
    credential: Credential,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut changes = state.inspector.changes();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + RECHECK, RECHECK);
    loop {
        tokio::select! {
            () = state.closing.cancelled() => {
                tracing::debug!("an event stream ends: the server stops");
                break;
            }
            _ = tick.tick() => {}
            Ok(()) = changes.changed() => {}
        }
        if !still_valid(&state, &credential).await {
            tracing::debug!("an event stream ends: its credential is no longer valid");
            break;
        }
    }
    stop.cancel();
}

/// A session's events: JSON pages (`?after=SEQ&limit=N`), or SSE with `Accept:
/// text/event-stream` (resumable with `Last-Event-ID`).
#[utoipa::path(get, path = "/v1/sessions/{session_id}/events", tag = "sessions", operation_id = "session_events",
    params(("session_id" = String, Path, description = "The session"), EventsQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "SSE: resume after this seq")),
    responses(
        (status = 200, description = "A page of events, or the live stream", content(
            (EventPage = "application/json"),
            (crate::types::SseEvent = "text/event-stream")
        )),
        (status = 400, description = "Bad query or Last-Event-ID", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 406, description = "Neither JSON nor SSE accepted", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many streams for this key", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn session_events(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Extension(credential): Extension<Credential>,
    P(id): P<String>,
    Q(q): Q<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    let session = session_id(&id)?;
    let after = q.after.unwrap_or(0);
    if i64::try_from(after).is_err() {
        return Err(ApiError::bad_request(
            "after",
            format!("after {after} is past any seq (at most 2^63 - 1)"),
        ));
    }
    match wants(&headers)? {
        Wants::Json => {
            let limit = match q.limit {
                None => 100,
                Some(n) if (1..=1000).contains(&n) => n,
                Some(n) => {
                    return Err(ApiError::bad_request(
                        "limit",
                        format!("limit {n} is out of range: 1 to 1000"),
                    ));
                }
            };
            // No seq is past 2^63 - 1: `after` at that bound reads nothing (not an error).
            let from = after.saturating_add(1).min(LAST_SEQ);
            let mut events = state
                .store
                .read(tenant, session, from, Some(limit.saturating_add(1)))
                .await?;
            let has_more = events.len() > usize::try_from(limit).unwrap_or(usize::MAX);
            events.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
            let next_after = events.last().map_or(after, |e| e.seq);
            let items = events
                .iter()
                .map(|e| serde_json::to_value(e).unwrap_or(Value::Null))
                .collect();
            Ok(Json(EventPage {
                items,
                next_after,
                has_more,
            })
            .into_response())
        }
        Wants::Sse => {
            let from = last_event_id(&headers)?
                .unwrap_or(0)
                .max(after)
                .saturating_add(1)
                .min(LAST_SEQ);
            let rt = state.runtimes.for_session(tenant, session).await?;
            let slot = state.open_stream(&caller.key_id)?;
            let sub = rt.subscribe(tenant, session, from).await?;
            Ok(Sse::new(while_valid(
                session_stream(sub, slot),
                state.clone(),
                credential,
            ))
            .keep_alive(
                KeepAlive::new()
                    .interval(Duration::from_millis(state.config.heartbeat_ms))
                    .text("heartbeat"),
            )
            .into_response())
        }
    }
}

/// State of the tenant-wide stream: what was last seen of each session.
struct Watch {
    store: std::sync::Arc<dyn Store>,
    tenant: TenantId,
    seen: HashMap<SessionId, SessionStatus>,
    out: VecDeque<SseEvent>,
    /// Sessions per store read (`[server] tenant_stream_page`).
    page: u32,
    _slot: StreamSlot,
}

/// How often the tenant-wide stream looks at the sessions.
const WATCH_POLL: Duration = Duration::from_millis(500);

fn tenant_stream(w: Watch) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    futures_util::stream::unfold(w, |mut w| async move {
        loop {
            if let Some(ev) = w.out.pop_front() {
                return Some((Ok(ev), w));
            }
            if let Err(e) = w.look().await {
                tracing::warn!("tenant event stream: {e}");
            }
            if w.out.is_empty() {
                tokio::time::sleep(WATCH_POLL).await;
            }
        }
    })
}

impl Watch {
    /// Reads every session of the tenant, `page` at a time in creation order, and queues a
    /// `session.status` frame for each one whose status differs from the last one seen.
    ///
    /// # Errors
    /// The store's; the frames of the pages read before it stay queued.
    async fn look(&mut self) -> Result<(), keel_store::StoreError> {
        let mut after = None;
        loop {
            let rows = self
                .store
                .list_sessions(
                    self.tenant,
                    &SessionQuery {
                        after,
                        limit: Some(self.page),
                        ..SessionQuery::default()
                    },
                )
                .await?;
            let full = rows.len() >= usize::try_from(self.page).unwrap_or(usize::MAX);
            after = rows.last().map(|r| r.session_id);
            for r in rows {
                if self.seen.get(&r.session_id) != Some(&r.status) {
                    self.seen.insert(r.session_id, r.status);
                    self.out.push_back(
                        SseEvent::default().event("session.status").data(
                            json!({
                                "session_id": r.session_id.to_string(),
                                "status": r.status.as_str(),
                                "version": r.version,
                            })
                            .to_string(),
                        ),
                    );
                }
            }
            if !full || after.is_none() {
                return Ok(());
            }
        }
    }
}

/// The tenant's live stream of session status changes (SSE: `event: session.status`, data
/// `{session_id, status, version}`; first the status of every session, then each change).
#[utoipa::path(get, path = "/v1/events", tag = "sessions", operation_id = "tenant_events",
    responses(
        (status = 200, description = "The live stream", content((crate::types::SseEvent = "text/event-stream"))),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A system key", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many streams for this key", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn tenant_events(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Extension(credential): Extension<Credential>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_as(Role::Viewer)?;
    let slot = state.open_stream(&caller.key_id)?;
    let w = Watch {
        store: state.store.clone(),
        tenant,
        seen: HashMap::new(),
        out: VecDeque::new(),
        page: state.config.tenant_stream_page.clamp(1, 1000),
        _slot: slot,
    };
    Ok(
        Sse::new(while_valid(tenant_stream(w), state.clone(), credential))
            .keep_alive(
                KeepAlive::new()
                    .interval(Duration::from_millis(state.config.heartbeat_ms))
                    .text("heartbeat"),
            )
            .into_response(),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A stream item that takes a shared lock across an await (as a store read and the key's
    /// credential check do), read by a client that gives up on an item half-way and then reads
    /// nothing (a full socket: hyper stops polling the body): the lock is free again at once,
    /// and the stream keeps running [`STREAM_AHEAD`] items ahead of its reader; dropping the
    /// stream stops it. Polled only by its reader, the item stayed frozen holding the lock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_detached_stream_frees_what_it_holds_without_its_reader_and_stops_when_dropped() {
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        let produced = Arc::new(AtomicUsize::new(0));
        let (l, p) = (lock.clone(), produced.clone());
        let inner = futures_util::stream::unfold(0usize, move |n| {
            let (l, p) = (l.clone(), p.clone());
            async move {
                let held = l.lock().await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                drop(held);
                p.fetch_add(1, Ordering::SeqCst);
                Some((n, n + 1))
            }
        });
        let mut out = Box::pin(detached(inner));
        assert_eq!(out.next().await, Some(0));
        // Gives up while the next item holds the lock.
        assert!(
            tokio::time::timeout(Duration::from_millis(5), out.next())
                .await
                .is_err()
        );
        let free = tokio::time::timeout(Duration::from_secs(5), lock.lock()).await;
        assert!(free.is_ok(), "the lock stayed held with nobody reading");
        drop(free);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while produced.load(Ordering::SeqCst) < STREAM_AHEAD + 1 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the stream did not run ahead"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let ahead = produced.load(Ordering::SeqCst);
        assert!(ahead <= STREAM_AHEAD + 3, "bounded: {ahead} produced");
        assert_eq!(out.next().await, Some(1), "nothing is lost");
        drop(out);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stopped = produced.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            produced.load(Ordering::SeqCst),
            stopped,
            "dropped: it stops"
        );
    }
}
