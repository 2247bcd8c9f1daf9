//! Event subscriptions with backpressure.
//!
//! A [`Subscription`] yields durable events from any sequence number — replayed from the
//! journal, then tailed live (`Store::wait_for_version`, so writes of other processes are seen
//! too) — interleaved with ephemeral [`Delta`]s (model text, tool-call arguments, tool progress)
//! of sessions run in this process. Deltas go through a bounded per-session buffer
//! (`tokio::sync::broadcast`): the session never waits for a subscriber; a subscriber that falls
//! further behind than the buffer loses the oldest deltas and receives a
//! [`SubscriptionItem::Gap`] saying how many. Consecutive text deltas are coalesced on the way
//! out. Durable events are never lost: they are re-read from the journal. Everything is redacted
//! before it is handed out.
//!
//! Events this process commits to a session somebody here subscribes to are also kept, the last
//! [`TAIL_EVENTS`] of them, in the session's [`CommittedTail`] (dropped with the last
//! subscription): a subscriber takes them from there instead of re-reading the journal (a store
//! read, event decoding) after every commit, waiting up to [`TAIL_WAIT`] for an append of this
//! process under way.
//! Only committed events enter the tail (pushed after the append returned), in journal order;
//! whatever the tail cannot give — a replay from further back, a gap, another process's
//! writes — is read from the journal as before.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use keel_core::{Event, SessionId, TenantId};
use keel_store::Store;
use keel_tools::tool::ToolProgress;
use serde::Serialize;
use tokio::sync::broadcast;

use crate::error::Result;
use crate::redact::Redactor;

/// An ephemeral, coalescible piece of live output.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DeltaKind {
    /// Model text.
    Text {
        /// The text.
        text: String,
    },
    /// Model reasoning text.
    Reasoning {
        /// The text.
        text: String,
    },
    /// A fragment of a tool call's arguments as the model streams them.
    ToolArguments {
        /// The call.
        call_id: String,
        /// The fragment.
        delta: String,
    },
    /// Progress of a running tool.
    ToolProgress {
        /// The call.
        call_id: String,
        /// The progress.
        progress: ToolProgress,
    },
    /// The next model call waits for the tenant's token rate ([`crate::config::TokenRate`]):
    /// the current minute's window has no room for it.
    TokenRateWait {
        /// Tokens the call reserves (projected context plus maximum output).
        tokens: u64,
        /// The tenant's limit, tokens per minute.
        limit: u64,
        /// Tokens reserved or used in the window now.
        used: u64,
        /// When the next window starts and the call tries again, Unix ms.
        until_ms: i64,
    },
}

/// A delta with the journal version it follows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Delta {
    /// The session.
    pub session_id: SessionId,
    /// The journal version when it was produced (it belongs after event `after_seq`).
    pub after_seq: u64,
    /// What it is.
    #[serde(flatten)]
    pub kind: DeltaKind,
}

/// One item of a subscription.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "item", rename_all = "snake_case")]
pub enum SubscriptionItem {
    /// A durable journal event.
    Event {
        /// The event (boxed: events are large, deltas small).
        event: Box<Event>,
    },
    /// Live output.
    Delta {
        /// The delta.
        delta: Delta,
    },
    /// The subscriber was too slow: `dropped` deltas were lost (durable events never are).
    Gap {
        /// How many deltas.
        dropped: u64,
    },
}

/// Per-session delta channels of this process.
#[derive(Debug)]
pub(crate) struct Hub {
    capacity: usize,
    channels: Mutex<HashMap<SessionId, DeltaSender>>,
}

/// One session's delta channel, created when its first subscriber arrives: a session nobody
/// watches holds no buffer (tokio's broadcast channel allocates all its slots up front, about
/// 100 bytes each, 1,024 by default: most of a waiting session's memory before this). Deltas
/// sent before there is a subscriber are dropped, as a channel without receivers drops them.
#[derive(Debug, Clone)]
pub(crate) struct DeltaSender {
    capacity: usize,
    channel: Arc<OnceLock<broadcast::Sender<Delta>>>,
    /// The session's last committed events, for its subscribers.
    pub(crate) tail: Arc<CommittedTail>,
}

/// Most events a [`CommittedTail`] keeps: a subscriber is woken at every commit, so it needs
/// the last commit's events (a step's commit holds a few); a tool result may be tens of KB, so
/// a watched session holds at most this many of them.
pub(crate) const TAIL_EVENTS: usize = 16;

/// Longest a subscriber waits for an append of this process under way to bring the events it
/// needs before it reads the journal instead (and goes on delivering deltas).
const TAIL_WAIT: Duration = Duration::from_millis(50);

/// The events this process committed last to one session, while somebody here subscribes to
/// it (see the module docs), and whether an append of this process to it is under way.
#[derive(Debug, Default)]
pub(crate) struct CommittedTail {
    state: Mutex<TailState>,
    /// Notified when an append ends (committed or not).
    changed: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct TailState {
    /// Consecutive by `seq`, oldest first.
    events: VecDeque<Event>,
    /// The redactor every kept event's body went through when the journal staged it, if one
    /// did for all of them (see [`Appending::committed`]).
    redacted_by: Option<Arc<Redactor>>,
    /// Appends of this process to the session begun and not yet ended.
    in_flight: usize,
    /// Live [`Subscription`]s of the session in this process; the events are dropped when the
    /// last one goes.
    subscribers: usize,
}

/// An append under way to a session with a [`CommittedTail`]; ending it (drop) without
/// [`Appending::committed`] says it committed nothing.
pub(crate) struct Appending(Arc<CommittedTail>);

impl CommittedTail {
    fn state(&self) -> std::sync::MutexGuard<'_, TailState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks an append to the session as under way (subscribers that need its events wait for
    /// it to end rather than read the journal).
    pub(crate) fn begin(self: &Arc<Self>) -> Appending {
        self.state().in_flight += 1;
        Appending(self.clone())
    }

    /// Whether a [`Subscription`] of the session is live in this process (only then are
    /// committed events kept).
    pub(crate) fn watched(&self) -> bool {
        self.state().subscribers > 0
    }

    fn subscribed(&self) {
        self.state().subscribers += 1;
    }

    fn unsubscribed(&self) {
        let mut st = self.state();
        st.subscribers = st.subscribers.saturating_sub(1);
        if st.subscribers == 0 {
            st.events = VecDeque::new();
            st.redacted_by = None;
        }
    }

    /// The kept events from `seq` on, if `seq` is kept, with the redactor their bodies went
    /// through (if one did for all of them).
    fn events_since(&self, seq: u64) -> Option<(Vec<Event>, Option<Arc<Redactor>>)> {
        let st = self.state();
        let first = st.events.front()?.seq;
        let skip = usize::try_from(seq.checked_sub(first)?).ok()?;
        (skip < st.events.len()).then(|| {
            (
                st.events.iter().skip(skip).cloned().collect(),
                st.redacted_by.clone(),
            )
        })
    }

    /// Whether an append that may hold `seq` is under way: one is, and the tail does not
    /// already hold events past `seq`.
    fn may_bring(&self, seq: u64) -> bool {
        let st = self.state();
        st.in_flight > 0 && st.events.back().is_none_or(|e| e.seq < seq)
    }
}

impl Appending {
    /// The append committed `events` (consecutive, in journal order): they are kept, after the
    /// ones before them; events that do not follow the kept ones replace them. `redacted_by`
    /// is the redactor every one of their bodies went through when staged, if one did: the
    /// kept events keep it only while every one of them went through the same one.
    pub(crate) fn committed(self, events: &[Event], redacted_by: Option<Arc<Redactor>>) {
        let Some(first) = events.first() else {
            return;
        };
        let mut st = self.0.state();
        if st
            .events
            .back()
            .is_none_or(|last| last.seq + 1 != first.seq)
        {
            st.events.clear();
        }
        st.redacted_by = match (st.events.is_empty(), &st.redacted_by, redacted_by) {
            (true, _, by) => by,
            (false, Some(kept), Some(by)) if Arc::ptr_eq(kept, &by) => Some(by),
            _ => None,
        };
        st.events.extend(events.iter().cloned());
        let excess = st.events.len().saturating_sub(TAIL_EVENTS);
        st.events.drain(..excess);
    }
}

impl Drop for Appending {
    fn drop(&mut self) {
        let mut st = self.0.state();
        st.in_flight = st.in_flight.saturating_sub(1);
        drop(st);
        self.0.changed.notify_waiters();
    }
}

impl DeltaSender {
    /// Whether anyone ever subscribed (a delta sent now may reach someone).
    pub(crate) fn watched(&self) -> bool {
        self.channel.get().is_some()
    }

    /// Sends to the current subscribers, if any (never waits).
    pub(crate) fn send(&self, delta: Delta) {
        if let Some(tx) = self.channel.get() {
            let _ = tx.send(delta);
        }
    }

    /// A receiver of the deltas sent from now on (creates the channel on first use).
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Delta> {
        self.channel
            .get_or_init(|| broadcast::channel(self.capacity).0)
            .subscribe()
    }
}

impl Hub {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            channels: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn sender(&self, session: SessionId) -> DeltaSender {
        let mut map = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        map.entry(session)
            .or_insert_with(|| DeltaSender {
                capacity: self.capacity,
                channel: Arc::new(OnceLock::new()),
                tail: Arc::default(),
            })
            .clone()
    }
}

/// A live view of one session's events. See the module docs.
pub struct Subscription {
    store: Arc<dyn Store>,
    tenant: TenantId,
    session: SessionId,
    next_seq: u64,
    buffered: VecDeque<SubscriptionItem>,
    deltas: broadcast::Receiver<Delta>,
    /// The session's events as this process commits them.
    tail: Arc<CommittedTail>,
    /// Longest wait for an append under way ([`TAIL_WAIT`]).
    tail_wait: Duration,
    redactor: Arc<Redactor>,
    /// Longest wait on the store per poll (the SQLite tail also polls every 50 ms).
    poll: Duration,
    /// The journal's version as last learned (the store's wait answers it; a delta's
    /// `after_seq` says it is at least that); `None` before the first read. The journal is read
    /// only when it holds events past the last one yielded: reading it for every delta made
    /// 1,000 subscribers of a session streaming 50 tokens/s issue 50,000 reads a second.
    known: Option<u64>,
    /// The store wait in progress, kept across deltas: dropping it at every delta cancelled a
    /// store call per delta and subscriber (50,000 a second at 1,000 subscribers and 50 tokens
    /// a second), which starved the store's pool.
    wait: Option<VersionWait>,
}

/// A `Store::wait_for_version` call that outlives one [`Subscription::next`], running as its
/// own task: it finishes whether or not the subscription is polled. Kept as a future inside the
/// subscription, a wait caught in the middle of its version read when a delta won the race
/// stayed there until the subscriber asked for its next item, holding a pooled connection and
/// the session's shared version read (`Watched::version` in keel-store) all that time; a
/// stalled subscriber (one whose client reads nothing) held them for good, and at 1,000
/// subscribers a handful of slow ones took the whole SQLite pool (30 s acquire timeouts in
/// `cargo bench -p keel --bench fanout`). Dropping it aborts the task.
type VersionWait = tokio_util::task::AbortOnDropHandle<Result<u64>>;

impl Drop for Subscription {
    fn drop(&mut self) {
        self.tail.unsubscribed();
    }
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("session", &self.session)
            .field("next_seq", &self.next_seq)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        tenant: TenantId,
        session: SessionId,
        from_seq: u64,
        deltas: (broadcast::Receiver<Delta>, Arc<CommittedTail>),
        redactor: Arc<Redactor>,
    ) -> Self {
        deltas.1.subscribed();
        Self {
            store,
            tenant,
            session,
            next_seq: from_seq.max(1),
            buffered: VecDeque::new(),
            deltas: deltas.0,
            tail: deltas.1,
            tail_wait: TAIL_WAIT,
            redactor,
            poll: Duration::from_millis(500),
            known: None,
            wait: None,
        }
    }

    /// The sequence number of the next durable event this subscription will yield.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    fn redact_event(&self, ev: Event) -> Event {
        self.redactor.redact_typed(ev)
    }

    /// [`Subscription::redact_event`] for an event whose body this very redactor already
    /// redacted when the journal staged it (redacting is idempotent: a second pass over the
    /// body finds nothing): only the envelope's free-text ids — the tool call id (the model's
    /// string, which staging does not redact) and the operation key made from it — are looked
    /// at, each on its own as the full redaction looks at every string, and the event goes
    /// through the full redaction when one holds a secret. (The other ids are UUIDs.)
    fn redact_envelope(&self, ev: Event) -> Event {
        // Every field named: a new one must be placed here (a free-text one checked).
        let keel_core::Correlation {
            turn_id: _,
            step_id: _,
            attempt: _,
            tool_call_id,
            operation_key,
            parent_session_id: _,
            approval_id: _,
            principal_id: _,
        } = &ev.correlation;
        let clean = tool_call_id
            .iter()
            .map(|id| id.0.as_str())
            .chain(operation_key.iter().map(|k| k.0.as_str()))
            .all(|text| !self.redactor.holds_secret(text));
        if clean { ev } else { self.redact_event(ev) }
    }

    fn redact_delta(&self, mut d: Delta) -> Delta {
        match &mut d.kind {
            DeltaKind::Text { text } | DeltaKind::Reasoning { text } => {
                *text = self.redactor.redact_str(text);
            }
            // The call id is the model's string, as in the journal's events.
            DeltaKind::ToolArguments { call_id, delta } => {
                *call_id = self.redactor.redact_str(call_id);
                *delta = self.redactor.redact_str(delta);
            }
            DeltaKind::ToolProgress { call_id, progress } => {
                *call_id = self.redactor.redact_str(call_id);
                match progress {
                    ToolProgress::Output { text } | ToolProgress::Status { text } => {
                        *text = self.redactor.redact_str(text);
                    }
                }
            }
            // Numbers only.
            DeltaKind::TokenRateWait { .. } => {}
        }
        d
    }

    /// Takes whatever deltas are waiting, coalescing consecutive text; `None` when none are.
    fn drain_deltas(&mut self) -> Option<SubscriptionItem> {
        let mut out: Option<Delta> = None;
        loop {
            match self.deltas.try_recv() {
                Ok(d) => {
                    if d.after_seq >= self.next_seq {
                        self.known = Some(self.known.unwrap_or(0).max(d.after_seq));
                    }
                    let d = self.redact_delta(d);
                    match (&mut out, d) {
                        (None, d) => out = Some(d),
                        (
                            Some(Delta {
                                kind: DeltaKind::Text { text: acc },
                                after_seq,
                                ..
                            }),
                            Delta {
                                kind: DeltaKind::Text { text },
                                after_seq: s,
                                ..
                            },
                        ) if *after_seq == s => acc.push_str(&text),
                        (Some(_), d) => {
                            self.buffered
                                .push_back(SubscriptionItem::Delta { delta: d });
                            break;
                        }
                    }
                }
                Err(broadcast::error::TryRecvError::Lagged(n)) => {
                    if let Some(d) = out.take() {
                        self.buffered
                            .push_back(SubscriptionItem::Gap { dropped: n });
                        return Some(SubscriptionItem::Delta { delta: d });
                    }
                    return Some(SubscriptionItem::Gap { dropped: n });
                }
                Err(_) => break,
            }
        }
        out.map(|delta| SubscriptionItem::Delta { delta })
    }

    /// Buffers the committed events from `next_seq` on, if any: from the session's
    /// [`CommittedTail`] when it holds them (waiting for an append of this process that may
    /// bring them to end), otherwise from the journal (at most 256).
    async fn read_durable(&mut self) -> Result<bool> {
        let (events, redacted_by) = match self.take_from_tail().await {
            Some(kept) => kept,
            None => (
                self.store
                    .read(self.tenant, self.session, self.next_seq, Some(256))
                    .await?,
                None,
            ),
        };
        let bodies_redacted = redacted_by.is_some_and(|r| Arc::ptr_eq(&r, &self.redactor));
        let got = !events.is_empty();
        for ev in events {
            self.next_seq = ev.seq + 1;
            let ev = if bodies_redacted {
                self.redact_envelope(ev)
            } else {
                self.redact_event(ev)
            };
            self.buffered.push_back(SubscriptionItem::Event {
                event: Box::new(ev),
            });
        }
        Ok(got)
    }

    /// The committed events from `next_seq` on, if this process's tail of the session holds
    /// them, or gets them when an append of this process under way ends within
    /// [`TAIL_WAIT`].
    async fn take_from_tail(&self) -> Option<(Vec<Event>, Option<Arc<Redactor>>)> {
        let deadline = tokio::time::Instant::now() + self.tail_wait;
        loop {
            let ended = self.tail.changed.notified();
            let mut ended = std::pin::pin!(ended);
            ended.as_mut().enable();
            if let Some(events) = self.tail.events_since(self.next_seq) {
                return Some(events);
            }
            if !self.tail.may_bring(self.next_seq) {
                return None;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return None;
            }
        }
    }

    /// The next item, waiting for one.
    ///
    /// # Errors
    /// Store errors (the subscription stays usable: call again).
    pub async fn next(&mut self) -> Result<SubscriptionItem> {
        loop {
            if let Some(item) = self.buffered.pop_front() {
                return Ok(item);
            }
            if self.known.is_none_or(|v| v >= self.next_seq) {
                if self.read_durable().await? {
                    continue;
                }
                self.known = Some(self.next_seq - 1);
            }
            if let Some(item) = self.drain_deltas() {
                return Ok(item);
            }
            let after = self.next_seq - 1;
            let wait = self.wait.get_or_insert_with(|| {
                let (store, tenant, session, poll) =
                    (self.store.clone(), self.tenant, self.session, self.poll);
                VersionWait::new(tokio::spawn(async move {
                    Ok(store
                        .wait_for_version(tenant, session, after, poll)
                        .await?
                        .max(after))
                }))
            });
            tokio::select! {
                r = wait => {
                    self.wait = None;
                    // On a timeout too: the version it saw (a read finds nothing new if none).
                    // A wait that panicked counts as one that learned nothing: the journal is
                    // read again, which finds what there is.
                    self.known = Some(match r {
                        Ok(v) => v?,
                        Err(_) => after + 1,
                    });
                }
                r = self.deltas.recv() => match r {
                    Ok(d) => {
                        if d.after_seq >= self.next_seq {
                            // Events it follows are committed and not yet yielded: they go first.
                            self.known = Some(self.known.unwrap_or(0).max(d.after_seq));
                            self.read_durable().await?;
                        }
                        let d = self.redact_delta(d);
                        self.buffered.push_back(SubscriptionItem::Delta { delta: d });
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        self.buffered.push_back(SubscriptionItem::Gap { dropped: n });
                    }
                    Err(broadcast::error::RecvError::Closed) => {
                        tokio::time::sleep(self.poll).await;
                    }
                },
            }
        }
    }

    /// Like [`Subscription::next`] but gives up after `timeout` with `Ok(None)`.
    ///
    /// # Errors
    /// Store errors.
    pub async fn next_timeout(&mut self, timeout: Duration) -> Result<Option<SubscriptionItem>> {
        match tokio::time::timeout(timeout, self.next()).await {
            Ok(r) => r.map(Some),
            Err(_) => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests;
