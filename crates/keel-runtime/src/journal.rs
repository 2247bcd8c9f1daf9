//! The journal as the runtime sees it: one append function ([`Journal::append`], compare-and-set
//! on the version plus the lease's fencing epoch), the session fold ([`SessionState`]) and the
//! runtime's own projection of it ([`Projection`]: the model-visible transcript, the script
//! position, compaction boundary, turn results).
//!
//! Every journal write of the runtime goes through [`Journal::append`], which names its *site*
//! (`step.started`, `tool.finished`, …). That makes the append sites enumerable for fault
//! injection in builds with the `crash-injection` feature (see `crate::crash`).

use std::collections::HashMap;
use std::sync::Arc;

use chrono::Utc;
use keel_core::{
    Correlation, Event, EventBody, LeaseEpoch, SessionId, SessionState, StepId, TenantId,
    ToolCallId,
};
use keel_model::ReasoningItem;
use keel_store::{AppendExtras, Store, StoreError};
use serde_json::Value;

use crate::error::{Result, RuntimeError};
use crate::redact::Redactor;
use crate::seal::SealKey;

pub use crate::projection::{Projection, TokenAnchor, TurnOutcome};

/// A session's journal held under a lease.
///
/// Events are *staged* (`Journal::stage`: redacted, checked against the fold and applied to
/// the in-memory state) and *committed* (`Journal::commit`: every staged event, with the side
/// rows that belong to them, in one store transaction). The driver commits once per phase
/// (see `crate::driver`); everything else appends (stage + commit) at once.
pub struct Journal {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) tenant: TenantId,
    pub(crate) session: SessionId,
    pub(crate) epoch: LeaseEpoch,
    pub(crate) state: SessionState,
    pub(crate) proj: Projection,
    pub(crate) redactor: Arc<Redactor>,
    /// Set when the worker holding it has finished with the session (lease released).
    pub(crate) closed: bool,
    /// The version the store holds (`state.version` minus the staged events).
    pub(crate) durable: u64,
    /// Events applied to the state but not yet in the store, oldest first.
    staged: Vec<Event>,
    /// The redactor every staged event's body went through, when it was one and the same for
    /// all of them (`None` when nothing is staged or when the redactor changed while staging):
    /// handed with the committed events to this process's subscribers, whose own redactor
    /// then need not go over the bodies again (see [`crate::subscribe::CommittedTail`]).
    staged_by: Option<Arc<Redactor>>,
    /// Side rows that commit with the staged events.
    pub(crate) extras: AppendExtras,
    /// When the oldest staged event was staged.
    staged_since: Option<std::time::Instant>,
    /// Notified (one permit) when staging starts after a commit: the checkpoint task sleeps on
    /// it while nothing is staged instead of waking on a timer.
    pub(crate) staging: Arc<tokio::sync::Notify>,
    /// The key sealed rows are encrypted with (set by [`Journal::unseal`]).
    pub(crate) seal_key: Option<SealKey>,
    /// The exact arguments of open calls whose journaled arguments were redacted (`sealed`).
    pub(crate) exact: HashMap<ToolCallId, Value>,
    /// The exact reasoning items of the active turn's completed steps, as the provider sent
    /// them (see [`crate::seal`]).
    pub(crate) reasoning: HashMap<StepId, Vec<ReasoningItem>>,
    /// Secret values to seal in the session's `secrets` row with the next commit (see
    /// `crate::secrets`).
    pub(crate) secrets_to_seal: Option<Vec<String>>,
    /// Set when a commit was refused because the lease's epoch is no longer the session's
    /// (another worker took the session over): the epoch never comes back, so from then on
    /// every stage and commit is refused with [`RuntimeError::LeaseLost`] before anything else
    /// is checked — fencing first. Without it a stage after the refusal was checked against
    /// the state folded again from the store, which lacks what was staged and dropped, and a
    /// zombie's next event could be refused as referring to an unknown entity instead.
    fenced: bool,
    /// The session's channel to this process's subscribers: committed events go to its tail
    /// ([`crate::subscribe::CommittedTail`]) while somebody subscribes.
    subscribers: Option<crate::subscribe::DeltaSender>,
    /// The work mark this journal's last commit wrote (`None` after a load or a reload: the
    /// row's columns are then unknown here). Only appends write the row's work columns and
    /// each append's compare-and-set requires the version this journal holds, so while this is
    /// set the row holds it: a commit whose mark is the same sends none, and the store's
    /// compare-and-set then assigns no column of an index of `sessions` (see
    /// `keel_store`'s `cas_update`).
    written_mark: Option<keel_store::WorkMark>,
}

impl Journal {
    /// Reads and folds the whole journal.
    ///
    /// # Errors
    /// Store errors; [`RuntimeError::Rejected`] if the stored journal does not fold.
    pub async fn load(
        store: Arc<dyn Store>,
        tenant: TenantId,
        session: SessionId,
        epoch: LeaseEpoch,
        redactor: Arc<Redactor>,
    ) -> Result<Self> {
        let mut j = Journal {
            store,
            tenant,
            session,
            epoch,
            state: SessionState::default(),
            proj: Projection::default(),
            redactor,
            closed: false,
            durable: 0,
            staged: Vec::new(),
            staged_by: None,
            extras: AppendExtras::default(),
            staged_since: None,
            staging: Arc::default(),
            seal_key: None,
            exact: HashMap::new(),
            reasoning: HashMap::new(),
            secrets_to_seal: None,
            fenced: false,
            subscribers: None,
            written_mark: None,
        };
        j.reload().await?;
        Ok(j)
    }

    /// Hands the events this journal commits to the session's subscribers in this process.
    pub(crate) fn publish_to(&mut self, subscribers: crate::subscribe::DeltaSender) {
        self.subscribers = Some(subscribers);
    }

    /// Folds the stored journal again, dropping whatever was staged.
    async fn reload(&mut self) -> Result<()> {
        let events = self.store.read(self.tenant, self.session, 1, None).await?;
        let mut state = SessionState::default();
        let mut proj = Projection::default();
        for ev in &events {
            state.apply(ev).map_err(|source| RuntimeError::Rejected {
                session: self.session,
                source,
            })?;
            proj.apply(&state, ev);
        }
        // From here on, what the projection adds is new: its transcript rows are staged.
        proj.record_rows = true;
        self.state = state;
        self.proj = proj;
        self.durable = self.state.version;
        self.staged.clear();
        self.extras = AppendExtras::default();
        self.staged_since = None;
        self.written_mark = None;
        Ok(())
    }

    /// The runtime's projection of the journal (the model-visible transcript, the compaction
    /// boundary, finished turns), staged events included.
    pub fn projection(&self) -> &Projection {
        &self.proj
    }

    /// The session's effective config (created + changes, folded).
    ///
    /// # Errors
    /// [`RuntimeError::Config`] when this build cannot read it.
    pub(crate) fn config(&self) -> Result<crate::config::SessionConfig> {
        serde_json::from_value(self.state.config.clone()).map_err(|e| RuntimeError::Config {
            session: self.session,
            reason: e.to_string(),
        })
    }

    /// Whether events are staged and not yet committed.
    pub(crate) fn has_staged(&self) -> bool {
        !self.staged.is_empty()
    }

    /// How long the oldest staged event has waited for its commit.
    pub(crate) fn staged_for(&self) -> Option<std::time::Duration> {
        self.staged_since.map(|t| t.elapsed())
    }

    /// Stages `items`: redacts them, checks them against the fold and applies them to the state
    /// and the projection, without writing. Effect, usage and transcript rows for the store's
    /// side tables are derived here and commit with the events. Returns the version after them.
    ///
    /// # Errors
    /// [`RuntimeError::Rejected`] when the fold refuses an event: nothing of `items` is staged
    /// (what was staged before stays).
    pub(crate) async fn stage(&mut self, items: Vec<(Correlation, EventBody)>) -> Result<u64> {
        self.check_fence()?;
        if items.is_empty() {
            return Ok(self.state.version);
        }
        let base = self.state.version;
        let now = Utc::now();
        let mut items = items;
        let sealed_before = (self.extras.seal.clone(), self.extras.unseal.clone());
        self.seal_items(&mut items);
        let events: Vec<Event> = items
            .into_iter()
            .enumerate()
            .map(|(i, (mut corr, body))| {
                // A child session's events name its parent (`spawn_agent`).
                if corr.parent_session_id.is_none() {
                    corr.parent_session_id = self.state.parent_session_id;
                }
                Event::new(
                    self.session,
                    base + 1 + i as u64,
                    now,
                    corr,
                    self.redactor.redact_typed(body),
                )
            })
            .collect();
        for (i, ev) in events.iter().enumerate() {
            if let Err(source) = self.state.apply(ev) {
                // The fold applied events[..i]: rebuild the state from the store and the events
                // staged before this call (all of which it accepted).
                let _ = i; // events[..i] were applied; the reload below undoes them
                let earlier = std::mem::take(&mut self.staged);
                let extras = std::mem::take(&mut self.extras);
                self.reload().await?;
                for ev in &earlier {
                    if self.state.apply(ev).is_ok() {
                        self.proj.apply(&self.state, ev);
                    }
                }
                // Their transcript rows are in the restored extras already.
                self.proj.new_rows.clear();
                self.staged = earlier;
                self.extras = extras;
                (self.extras.seal, self.extras.unseal) = sealed_before;
                return Err(RuntimeError::Rejected {
                    session: self.session,
                    source,
                });
            }
        }
        for ev in &events {
            self.proj.apply(&self.state, ev);
            crate::effects::side_rows(&self.state, ev, &mut self.extras);
        }
        self.prune_reasoning();
        // The transcript rows these events make commit with them (redacted once more).
        for mut row in self.proj.new_rows.drain(..) {
            self.redactor.redact_value(&mut row.content);
            self.extras.transcript.push(row);
        }
        if self.staged.is_empty() {
            self.staged_since = Some(std::time::Instant::now());
            self.staging.notify_one();
            self.staged_by = Some(self.redactor.clone());
        } else if self
            .staged_by
            .as_ref()
            .is_some_and(|r| !Arc::ptr_eq(r, &self.redactor))
        {
            self.staged_by = None;
        }
        self.staged.extend(events);
        Ok(self.state.version)
    }

    /// [`RuntimeError::LeaseLost`] once a commit of this journal was refused for its lease's
    /// epoch (see `fenced`): checked before anything else.
    fn check_fence(&self) -> Result<()> {
        if self.fenced {
            return Err(RuntimeError::LeaseLost {
                session: self.session,
            });
        }
        Ok(())
    }

    /// Commits everything staged (and the side rows) in one store transaction at the durable
    /// version under the lease's epoch. `site` names the commit for fault injection. Returns
    /// the durable version.
    ///
    /// # Errors
    /// [`RuntimeError::LeaseLost`] when another worker took the session over (then and on every
    /// later stage or commit of this journal); store errors. On error the staged events are
    /// dropped and the state is folded again from the store — but for
    /// [`StoreError::EffectClaimed`] (a first dispatch staged here was dispatched already by
    /// something else), after which everything staged stays staged.
    pub(crate) async fn commit(&mut self, site: &'static str) -> Result<u64> {
        self.check_fence()?;
        if self.staged.is_empty() {
            // Side rows travel with events; without events there is nothing to commit yet.
            return Ok(self.durable);
        }
        self.stage_secrets();
        let mark = work_mark(&self.state);
        self.extras.work = (self.written_mark != Some(mark)).then_some(mark);
        let appending = self
            .subscribers
            .as_ref()
            .filter(|s| s.tail.watched())
            .map(|s| s.tail.begin());
        let r = self
            .store
            .append_with(
                self.tenant,
                self.session,
                self.durable,
                self.epoch,
                &self.staged,
                &self.extras,
            )
            .await;
        match r {
            Ok(v) => {
                if let Some(a) = appending {
                    a.committed(&self.staged, self.staged_by.take());
                }
                self.durable = v;
                self.written_mark = Some(mark);
                self.staged.clear();
                self.extras = AppendExtras::default();
                self.staged_since = None;
                self.secrets_to_seal = None;
                crate::crash::after_commit(site);
                Ok(v)
            }
            Err(e @ StoreError::EffectClaimed { .. }) => {
                // Nothing committed, and nothing staged is wrong: the staged events stay (the
                // caller settles the claimed effect and commits them with it).
                drop(appending);
                Err(RuntimeError::from_append(self.session, e))
            }
            Err(e) => {
                // Nothing committed: subscribers waiting for this append read the journal now.
                drop(appending);
                if matches!(e, StoreError::LeaseLost { .. }) {
                    self.fenced = true;
                }
                let _ = self.reload().await;
                Err(match e {
                    StoreError::StaleVersion { .. } | StoreError::LeaseLost { .. } => {
                        RuntimeError::LeaseLost {
                            session: self.session,
                        }
                    }
                    other => RuntimeError::from_append(self.session, other),
                })
            }
        }
    }

    /// Drops the probe of the staged `effect.prepared` of `key` (in the staged event and in
    /// the state): for an effect the store refused to claim ([`StoreError::EffectClaimed`]),
    /// whose probe was taken after another writer's dispatch — the tool's reconcile would
    /// read "nothing happened" from it and run the effect again. Without a probe the
    /// `outcome_unknown` effect goes to a human.
    pub(crate) fn drop_staged_probe(&mut self, key: &keel_core::OperationKey) {
        for ev in &mut self.staged {
            if ev.correlation.operation_key.as_ref() == Some(key)
                && let EventBody::EffectPrepared { probe, .. } = &mut ev.body
            {
                *probe = None;
            }
        }
        if let Some(effect) = self.state.effects.get_mut(key) {
            effect.probe = None;
        }
    }

    /// Appends `items` now: stages them and commits (with anything staged before) in one store
    /// transaction. Returns the new version.
    ///
    /// # Errors
    /// [`RuntimeError::Rejected`] (nothing written) when the fold refuses an event;
    /// [`RuntimeError::LeaseLost`] when another worker took the session over; store errors.
    pub async fn append(
        &mut self,
        site: &'static str,
        items: Vec<(Correlation, EventBody)>,
    ) -> Result<u64> {
        self.stage(items).await?;
        self.commit(site).await
    }
}

/// The scheduler's mark of a session in `state` ([`keel_store::WorkMark`]), written with every
/// commit ([`keel_store::AppendExtras::work`]), by what the planner
/// ([`keel_core::plan::next`]) would do with it:
/// - `closed`: nothing, ever.
/// - `requires_action`: waits on a human — a decision wakes it through the store (a decided
///   approval, `effect.decided`'s wake-up time), not through the mark — unless its active turn's
///   cancellation was requested: the planner ends that turn first (rule 2), with no human.
/// - `running`: a worker owes it something — its active turn, its queue, or going idle after
///   its turn ended (a worker that stopped in between leaves it so; the next one tidies up).
/// - `created` / `idle`: runnable when a turn is active or queued (a queued turn cancelled
///   before it started too: the planner finishes it `aborted`).
pub fn work_mark(state: &keel_core::SessionState) -> keel_store::WorkMark {
    use keel_core::SessionStatus as S;
    let cancel_due = state
        .active_turn
        .and_then(|t| state.turns.get(&t))
        .is_some_and(|t| t.cancel_requested.is_some());
    let runnable = match state.status {
        S::Closed => false,
        S::RequiresAction => cancel_due,
        S::Running => true,
        S::Created | S::Idle => state.active_turn.is_some() || !state.queue.is_empty(),
    };
    keel_store::WorkMark {
        runnable,
        queued_turns: u32::try_from(state.queue.len()).unwrap_or(u32::MAX),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;
    use std::time::Duration;

    use keel_core::{Correlation, EventBody, ReleaseId, SessionId, TenantId, TurnId};
    use keel_store::Store;
    use serde_json::json;

    use super::Journal;
    use crate::error::RuntimeError;
    use crate::redact::Redactor;

    /// The stale_write flake (`zombie_after_takeover`, once under load): a zombie's checkpoint
    /// commit was refused for its epoch, which dropped its staged events (a proposed call);
    /// its next stage, referring to that call, was then refused by the fold as naming an
    /// unknown entity instead of as `LeaseLost`. Once refused for its epoch, a journal refuses
    /// everything with `LeaseLost` first.
    #[tokio::test]
    async fn after_a_takeover_every_stage_is_lease_lost_before_the_fold_judges_it() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(
            keel_store::SqlStore::open_sqlite(&dir.path().join("keel.db"))
                .await
                .unwrap(),
        );
        let (tenant, session) = (TenantId::new(), SessionId::new());
        let release = ReleaseId::from("sha256:fence");
        let lease = keel_testkit::db::leased_session(
            store.as_ref(),
            tenant,
            session,
            &release,
            json!({}),
            "zombie",
            Duration::from_secs(60),
        )
        .await;
        let redactor = Arc::new(Redactor::with_values(&[], &[]).unwrap());
        let mut j = Journal::load(store.clone(), tenant, session, lease.epoch, redactor)
            .await
            .unwrap();

        // The zombie stages a turn; the session is taken over before it commits.
        let turn = TurnId::new();
        let queued = EventBody::TurnQueued {
            input: "go".into(),
            compiled: None,
        };
        j.stage(vec![(Correlation::turn(turn), queued)])
            .await
            .unwrap();
        store
            .take_over_lease(
                tenant,
                session,
                "zombie",
                lease.epoch,
                "successor",
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        let lost = |r: &crate::error::Result<u64>| matches!(r, Err(RuntimeError::LeaseLost { .. }));
        let r = j.commit("checkpoint").await;
        assert!(lost(&r), "{r:?}");
        // The turn was dropped with the refused commit: the fold alone would call it unknown.
        let cancel = EventBody::TurnCancelRequested {
            reason: "stop".into(),
        };
        let r = j.stage(vec![(Correlation::turn(turn), cancel)]).await;
        assert!(lost(&r), "fencing first: {r:?}");
        let r = j.commit("again").await;
        assert!(lost(&r), "{r:?}");
    }
}
