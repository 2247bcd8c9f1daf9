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
        deltas: broadcast::Receiver<Delta>,
        redactor: Arc<Redactor>,
    ) -> Self {
        Self {
            store,
            tenant,
            session,
            next_seq: from_seq.max(1),
            buffered: VecDeque::new(),
            deltas,
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

    fn redact_delta(&self, mut d: Delta) -> Delta {
        match &mut d.kind {
            DeltaKind::Text { text } | DeltaKind::Reasoning { text } => {
                *text = self.redactor.redact_str(text);
            }
            DeltaKind::ToolArguments { delta, .. } => *delta = self.redactor.redact_str(delta),
            DeltaKind::ToolProgress { progress, .. } => match progress {
                ToolProgress::Output { text } | ToolProgress::Status { text } => {
                    *text = self.redactor.redact_str(text);
                }
            },
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

    async fn read_durable(&mut self) -> Result<bool> {
        let events = self
            .store
            .read(self.tenant, self.session, self.next_seq, Some(256))
            .await?;
        let got = !events.is_empty();
        for ev in events {
            self.next_seq = ev.seq + 1;
            let ev = self.redact_event(ev);
            self.buffered.push_back(SubscriptionItem::Event {
                event: Box::new(ev),
            });
        }
        Ok(got)
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
