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
    Correlation, Event, EventBody, LeaseEpoch, SessionId, SessionState, StateMachine, TenantId,
    ToolCallId,
};
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
    /// Side rows that commit with the staged events.
    pub(crate) extras: AppendExtras,
    /// When the oldest staged event was staged.
    staged_since: Option<std::time::Instant>,
    /// The key sealed arguments are encrypted with (set by [`Journal::unseal`]).
    seal_key: Option<SealKey>,
    /// The exact arguments of open calls whose journaled arguments were redacted (`sealed`).
    exact: HashMap<ToolCallId, Value>,
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
            extras: AppendExtras::default(),
            staged_since: None,
            seal_key: None,
            exact: HashMap::new(),
        };
        j.reload().await?;
        Ok(j)
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

    /// Reads the session's sealed rows and opens them with `key`, which also seals what this
    /// journal stages from now on. A row that does not open (another deployment key, an altered
    /// row) is left out: its call never runs (see [`Journal::exact_arguments`]).
    ///
    /// # Errors
    /// Store errors.
    pub(crate) async fn unseal(&mut self, key: SealKey) -> Result<()> {
        let open: Vec<&ToolCallId> = self
            .state
            .tool_calls
            .values()
            .filter(|c| c.sealed && !c.status.is_terminal())
            .map(|c| &c.id)
            .collect();
        if !open.is_empty() {
            for (call, sealed) in self
                .store
                .sealed_arguments(self.tenant, self.session)
                .await?
            {
                let id = ToolCallId::from(call.as_str());
                let plain = key.open(self.seal_context(&id).as_bytes(), &sealed);
                match plain.and_then(|p| serde_json::from_slice::<Value>(&p).ok()) {
                    Some(args) => {
                        self.exact.insert(id, args);
                    }
                    None => tracing::warn!(
                        session = %self.session, call = %id,
                        "sealed arguments do not open with this deployment's key; the call will not run"
                    ),
                }
            }
        }
        self.seal_key = Some(key);
        Ok(())
    }

    /// What a sealed row of `call` is bound to (it does not open for another call).
    fn seal_context(&self, call: &ToolCallId) -> String {
        format!(
            "keel-sealed-arguments/{}/{}/{call}",
            self.tenant, self.session
        )
    }

    /// The arguments call `call` runs with: exactly what the model proposed. `None` when the
    /// call is unknown, or its journaled arguments were redacted and the exact ones are not
    /// available (a sealed row that did not open): such a call must not run.
    pub(crate) fn exact_arguments(&self, call: &ToolCallId) -> Option<Value> {
        let c = self.state.tool_calls.get(call)?;
        if c.sealed {
            self.exact.get(call).cloned()
        } else {
            Some(c.arguments.clone())
        }
    }

    /// Seals the exact arguments of each proposal whose redaction changes them: marks the
    /// event `sealed`, keeps them in memory, and stages the encrypted row to commit with it.
    /// A call's result deletes its row in the same commit.
    fn seal_items(&mut self, items: &mut [(Correlation, EventBody)]) {
        for (corr, body) in items.iter_mut() {
            let Some(call) = corr.tool_call_id.clone() else {
                continue;
            };
            match body {
                EventBody::ToolCallProposed {
                    arguments, sealed, ..
                } => {
                    let mut shown = arguments.clone();
                    self.redactor.redact_value(&mut shown);
                    if shown == *arguments {
                        continue;
                    }
                    *sealed = true;
                    if let Some(key) = &self.seal_key {
                        let plain = arguments.to_string();
                        let row = key.seal(self.seal_context(&call).as_bytes(), plain.as_bytes());
                        self.extras.unseal.retain(|c| c != call.as_str());
                        self.extras.seal.push((call.to_string(), row));
                        self.exact.insert(call, arguments.clone());
                    }
                }
                EventBody::ToolCallFinished { .. }
                    if self.exact.contains_key(&call)
                        || self.state.tool_calls.get(&call).is_some_and(|c| c.sealed) =>
                {
                    self.exact.remove(&call);
                    self.extras.seal.retain(|(c, _)| c != call.as_str());
                    self.extras.unseal.push(call.to_string());
                }
                _ => {}
            }
        }
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
            .map(|(i, (corr, body))| {
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
        // The transcript rows these events make commit with them (redacted once more).
        for mut row in self.proj.new_rows.drain(..) {
            self.redactor.redact_value(&mut row.content);
            self.extras.transcript.push(row);
        }
        if self.staged.is_empty() {
            self.staged_since = Some(std::time::Instant::now());
        }
        self.staged.extend(events);
        Ok(self.state.version)
    }

    /// Commits everything staged (and the side rows) in one store transaction at the durable
    /// version under the lease's epoch. `site` names the commit for fault injection. Returns
    /// the durable version.
    ///
    /// # Errors
    /// [`RuntimeError::LeaseLost`] when another worker took the session over; store errors. On
    /// error the staged events are dropped and the state is folded again from the store.
    pub(crate) async fn commit(&mut self, site: &'static str) -> Result<u64> {
        if self.staged.is_empty() {
            // Side rows travel with events; without events there is nothing to commit yet.
            return Ok(self.durable);
        }
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
                self.durable = v;
                self.staged.clear();
                self.extras = AppendExtras::default();
                self.staged_since = None;
                crate::crash::after_commit(site);
                Ok(v)
            }
            Err(e) => {
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
