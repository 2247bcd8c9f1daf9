//! Input, cancellation, closing and human decisions: the calls that act on a session from any
//! process.
//! When another live worker runs the session they post a durable intent ([`crate::intent`])
//! and wait until that worker has journaled it.

use std::time::Duration;

use chrono::Utc;
use keel_core::{
    ApprovalDecision, ApprovalId, ApprovalRecord, ApprovalStatus, Correlation, EffectDecision,
    EffectStatus, EventBody, OperationKey, SessionId, SessionState, SessionStatus, StateMachine,
    TenantId, ToolCallId, TurnId,
};
use keel_tools::approval::ApprovalService;

use crate::config::{MultitaskStrategy, SessionConfig, SubmitOptions};
use crate::error::{Result, RuntimeError};
use crate::hold::Held;
use crate::intent::{self, CancelToolCallIntent, CancelTurnIntent, InputIntent};
use crate::runtime::Runtime;

/// How a posted intent ended for its poster.
pub(crate) enum Posted {
    /// The holder journaled it (the caller's `done` test holds on the state given).
    Handled,
    /// The holder took it without the expected journal entry (a refusal); the latest state.
    Consumed(Box<SessionState>),
    /// Nobody runs the session any more and the poster took its intent back: it now holds the
    /// session and does the work itself.
    Local(Held),
}

/// How often a poster re-checks its intent while waiting (also bounded by journal wake-ups).
const POLL: Duration = Duration::from_millis(100);

impl Runtime {
    /// Accepts user input into the journal (`turn.queued`) before anything else happens, by the
    /// session's multitask strategy: `enqueue` queues it; `reject` refuses it while a turn is
    /// active or queued; `interrupt` queues it and journals `turn.cancel_requested` for the
    /// active turn. If this process is running the session, the running loop picks the turn up;
    /// otherwise call [`Runtime::run`].
    ///
    /// # Errors
    /// [`RuntimeError::InvalidInput`] for empty input; [`RuntimeError::TurnInProgress`] under
    /// `reject`; [`RuntimeError::SessionBusy`] when another process runs the session;
    /// [`RuntimeError::Closed`]; store errors. Nothing is written on error.
    pub async fn submit(
        &self,
        tenant: TenantId,
        session: SessionId,
        input: &str,
    ) -> Result<TurnId> {
        self.submit_with(tenant, session, input, None).await
    }
    /// As [`Runtime::submit`] with an explicit multitask strategy instead of the session's.
    ///
    /// # Errors
    /// See [`Runtime::submit`].
    pub async fn submit_with(
        &self,
        tenant: TenantId,
        session: SessionId,
        input: &str,
        strategy: Option<MultitaskStrategy>,
    ) -> Result<TurnId> {
        self.submit_opts(
            tenant,
            session,
            input,
            SubmitOptions {
                strategy,
                ..SubmitOptions::default()
            },
        )
        .await
    }
    /// As [`Runtime::submit`] with options: an explicit multitask strategy and the turn's
    /// scheduling priority ([`SubmitOptions::priority`], written to the session's row with the
    /// `turn.queued` commit, also when the input travels as an intent to the worker running the
    /// session).
    ///
    /// # Errors
    /// [`RuntimeError::InvalidInput`] for a priority outside
    /// [`crate::MIN_PRIORITY`]..=[`crate::MAX_PRIORITY`] (nothing written); see
    /// [`Runtime::submit`].
    pub async fn submit_opts(
        &self,
        tenant: TenantId,
        session: SessionId,
        input: &str,
        opts: SubmitOptions,
    ) -> Result<TurnId> {
        self.submit_turn(tenant, session, input, None, opts, false)
            .await
    }
    /// A sub-agent's prompt into its child session (the runtime's own spawn path); hosts'
    /// input to a child session is refused ([`RuntimeError::SubAgentSession`]).
    pub(crate) async fn submit_child(
        &self,
        tenant: TenantId,
        session: SessionId,
        input: &str,
    ) -> Result<TurnId> {
        self.submit_turn(tenant, session, input, None, SubmitOptions::default(), true)
            .await
    }
    /// Journals a prompt the input pipeline compiled ([`crate::input`]) as a turn, as
    /// [`Runtime::submit_opts`] does, with how it was compiled in `turn.queued`'s `compiled`.
    ///
    /// # Errors
    /// See [`Runtime::submit_opts`].
    pub async fn submit_prompt(
        &self,
        tenant: TenantId,
        session: SessionId,
        prompt: &crate::input::Prompt,
        opts: SubmitOptions,
    ) -> Result<TurnId> {
        self.submit_turn(
            tenant,
            session,
            &prompt.message,
            prompt.compiled.clone(),
            opts,
            false,
        )
        .await
    }
    async fn submit_turn(
        &self,
        tenant: TenantId,
        session: SessionId,
        input: &str,
        compiled: Option<keel_core::CompiledInput>,
        opts: SubmitOptions,
        from_parent: bool,
    ) -> Result<TurnId> {
        opts.validate()?;
        if input.trim().is_empty() {
            return Err(RuntimeError::InvalidInput(
                "input is empty; a turn needs a message".into(),
            ));
        }
        let child_of = |s: &SessionState| match s.parent_session_id {
            Some(parent) if !from_parent => Err(RuntimeError::SubAgentSession { session, parent }),
            _ => Ok(()),
        };
        if let Ok(mut held) = self.inner.hold_now(tenant, session).await? {
            if let Err(e) = child_of(&held.journal().state) {
                self.inner.unhold(tenant, held).await;
                return Err(e);
            }
            return self
                .submit_on(tenant, held, input, compiled, opts, TurnId::new())
                .await;
        }
        // Another live worker runs the session: ask it through a durable intent.
        let state = self.fold(tenant, session).await?;
        child_of(&state)?;
        let busy = |s: &SessionState| s.active_turn.or_else(|| s.queue.front().copied());
        if state.status == SessionStatus::Closed {
            return Err(RuntimeError::Closed { session });
        }
        let pinned = serde_json::from_value::<SessionConfig>(state.config.clone())
            .map(|c| c.multitask)
            .unwrap_or_default();
        if opts.strategy.unwrap_or(pinned) == MultitaskStrategy::Reject
            && let Some(t) = busy(&state)
        {
            return Err(RuntimeError::TurnInProgress { session, turn: t });
        }
        let turn = TurnId::new();
        let payload = serde_json::to_value(InputIntent {
            turn_id: turn,
            input: input.to_owned(),
            strategy: opts.strategy,
            principal_id: self.actor,
            priority: opts.priority,
            compiled: compiled.clone(),
        })
        .map_err(|e| RuntimeError::InvalidInput(format!("input: {e}")))?;
        match self
            .post_and_wait(tenant, session, intent::INPUT, &payload, |s| {
                s.turns.contains_key(&turn)
            })
            .await?
        {
            Posted::Handled => Ok(turn),
            Posted::Local(held) => {
                self.submit_on(tenant, held, input, compiled, opts, turn)
                    .await
            }
            Posted::Consumed(s) if s.status == SessionStatus::Closed => {
                Err(RuntimeError::Closed { session })
            }
            Posted::Consumed(s) => Err(match busy(&s) {
                Some(t) => RuntimeError::TurnInProgress { session, turn: t },
                None => RuntimeError::InvalidInput(format!(
                    "session {session}: the worker running it did not accept the input"
                )),
            }),
        }
    }
    async fn submit_on(
        &self,
        tenant: TenantId,
        mut held: Held,
        input: &str,
        compiled: Option<keel_core::CompiledInput>,
        opts: SubmitOptions,
        turn: TurnId,
    ) -> Result<TurnId> {
        let queued = crate::intent::Queued {
            turn,
            by: self.actor,
            priority: opts.priority,
            compiled,
            intent: None,
        };
        let r = crate::intent::queue_input(held.journal(), input, opts.strategy, queued).await;
        if r.is_ok()
            && crate::intent::strategy_of(held.journal(), opts.strategy)
                == MultitaskStrategy::Interrupt
            && let Held::Local(j) = &held
            && let Some(a) = self.inner.active(j.session)
        {
            a.cancel_turn();
        }
        self.inner.unhold(tenant, held).await;
        r
    }
    /// Cancels the session's active turn (or, with none active, its oldest queued turn): journals
    /// `turn.cancel_requested` — a durable intent — and stops the stream and every running tool.
    /// Works from any process: when another live worker runs the session, a `cancel_turn` intent
    /// is posted (see [`crate::intent`]) and this returns once that worker has journaled it (it
    /// then stops the turn). The turn ends `aborted`, every open call gets a result. A session
    /// nobody runs (e.g. waiting in `requires_action`, or left by a crashed worker) has the
    /// turn ended at once, by this call, under the lease it took — and nothing more: no queued
    /// turn is started and no model is asked (a queued follow-up waits for the next
    /// [`Runtime::run`]). Returns the cancelled turn; cancelling a turn already being cancelled
    /// is a no-op, and so is one that ended while the cancellation was on its way (a race with
    /// the worker running it is no error).
    ///
    /// # Errors
    /// [`RuntimeError::NoActiveTurn`]; [`RuntimeError::SessionBusy`] when the worker running the
    /// session neither handles the intent nor gives the lease up within `lease_wait`; store
    /// errors.
    pub async fn cancel_turn(&self, tenant: TenantId, session: SessionId) -> Result<TurnId> {
        if let Ok(held) = self.inner.hold_now(tenant, session).await? {
            return self.cancel_on(tenant, session, held, None).await;
        }
        let state = self.fold(tenant, session).await?;
        let Some(turn) = state.active_turn.or_else(|| state.queue.front().copied()) else {
            return Err(RuntimeError::NoActiveTurn { session });
        };
        let requested = |s: &SessionState| {
            s.turns
                .get(&turn)
                .is_some_and(|t| t.cancel_requested.is_some() || t.status.is_terminal())
        };
        if requested(&state) {
            return Ok(turn);
        }
        let payload = serde_json::to_value(CancelTurnIntent {
            turn_id: turn,
            reason: "cancelled by user".into(),
            principal_id: self.actor,
        })
        .map_err(|e| RuntimeError::InvalidInput(format!("cancel: {e}")))?;
        match self
            .post_and_wait(tenant, session, intent::CANCEL_TURN, &payload, requested)
            .await?
        {
            Posted::Handled | Posted::Consumed(_) => Ok(turn),
            // The worker let the session go before taking the intent back: cancel that turn
            // here (or find it already ended or cancelled: the race is no error).
            Posted::Local(held) => self.cancel_on(tenant, session, held, Some(turn)).await,
        }
    }
    /// Cancels `target` (or the active, else the oldest queued turn) of a session held here.
    /// Journals `turn.cancel_requested`; when the hold is a lease of its own (nobody runs the
    /// session), ends the turn under that same lease (`finish_only`: the turn's calls get their
    /// results and `turn.finished` is journaled) and stops there — a queued turn is never started
    /// by a cancellation: it waits for the next run with the session's model. A target that has
    /// already ended returns at once.
    async fn cancel_on(
        &self,
        tenant: TenantId,
        session: SessionId,
        mut held: Held,
        target: Option<TurnId>,
    ) -> Result<TurnId> {
        let j = held.journal();
        let turn = match target {
            Some(t) if j.state.turns.get(&t).is_none_or(|t| t.status.is_terminal()) => {
                self.inner.unhold(tenant, held).await;
                return Ok(t);
            }
            Some(t) => Some(t),
            None => j
                .state
                .active_turn
                .or_else(|| j.state.queue.front().copied()),
        };
        let Some(turn) = turn else {
            self.inner.unhold(tenant, held).await;
            return Err(RuntimeError::NoActiveTurn { session });
        };
        let already = j
            .state
            .turns
            .get(&turn)
            .is_some_and(|t| t.cancel_requested.is_some());
        let r = if already {
            Ok(0)
        } else {
            j.append(
                "turn.cancel_requested",
                vec![(
                    Correlation::turn(turn).by(self.actor),
                    EventBody::TurnCancelRequested {
                        reason: "cancelled by user".into(),
                    },
                )],
            )
            .await
        };
        let parked = matches!(held, Held::Parked(..));
        match held {
            Held::Local(g) => {
                if let Some(a) = self.inner.active(session) {
                    a.cancel_turn();
                }
                drop(g);
                r?;
            }
            Held::Leased(j, lease, _gate) | Held::Parked(j, lease, _gate) => {
                // Nobody runs the session: end the turn now, under the lease already held (no
                // other worker can slip in between), and nothing more.
                drop(j);
                let finished = match r {
                    Ok(_) => self
                        .run_leased(
                            tenant,
                            session,
                            &lease,
                            true,
                            tokio_util::sync::CancellationToken::new(),
                        )
                        .await
                        .map(|_| ()),
                    Err(e) => Err(e),
                };
                // A parked lease stays this process's (kept for its next operation).
                if !parked && let Err(e) = self.inner.store.release_lease(tenant, &lease).await {
                    tracing::debug!(%session, "lease release: {e}");
                }
                finished?;
            }
        }
        Ok(turn)
    }
    /// Cancels one running tool call: it gets a `cancelled` result and the turn continues. Works
    /// from any process: when another worker runs the session, a `cancel_tool_call` intent is
    /// posted and this returns once that worker has taken it (the result follows).
    ///
    /// # Errors
    /// [`RuntimeError::NoSuchToolCall`] when the call is not open in the session (or, for a
    /// session nobody runs, not running anywhere); [`RuntimeError::SessionBusy`]; store errors.
    pub async fn cancel_tool_call(
        &self,
        tenant: TenantId,
        session: SessionId,
        call: &ToolCallId,
    ) -> Result<()> {
        let no_such = || RuntimeError::NoSuchToolCall {
            session,
            call: call.clone(),
        };
        if self
            .inner
            .active(session)
            .is_some_and(|a| a.cancel_call(call.as_str(), self.actor))
        {
            return Ok(());
        }
        if let Ok(held) = self.inner.hold_now(tenant, session).await? {
            // Nobody runs the session, so nothing runs the call.
            self.inner.unhold(tenant, held).await;
            return Err(no_such());
        }
        let finished = |s: &SessionState| {
            s.tool_calls
                .get(call)
                .is_none_or(|c| c.status.is_terminal())
        };
        if finished(&self.fold(tenant, session).await?) {
            return Err(no_such());
        }
        let payload = serde_json::to_value(CancelToolCallIntent {
            call_id: call.clone(),
            principal_id: self.actor,
        })
        .map_err(|e| RuntimeError::InvalidInput(format!("cancel: {e}")))?;
        match self
            .post_and_wait(
                tenant,
                session,
                intent::CANCEL_TOOL_CALL,
                &payload,
                finished,
            )
            .await?
        {
            Posted::Handled | Posted::Consumed(_) => Ok(()),
            Posted::Local(held) => {
                self.inner.unhold(tenant, held).await;
                Err(no_such())
            }
        }
    }
    /// Closes the session for good: journals `session.status_changed(closed)` (checked by the
    /// core's transition table; the store's status follows) and clears its wake-up time. A
    /// closed session refuses input ([`RuntimeError::Closed`]) and [`Runtime::run`] returns at
    /// once. Closing a closed session is a quiet success that writes nothing. A session whose
    /// creation never completed (its row without any event: the creating process stopped
    /// between the two commits) is removed instead ([`Store::delete_session`]): there is no
    /// journal to close.
    ///
    /// [`Store::delete_session`]: keel_store::Store::delete_session
    ///
    /// # Errors
    /// [`RuntimeError::TurnOpen`] while a turn is active (running or waiting on a human) or
    /// queued — cancel it or let it finish first; [`RuntimeError::SessionBusy`] while a worker
    /// (this process or another) runs the session; store errors (`NotFound` for an unknown
    /// session). Nothing is written on error.
    pub async fn close_session(&self, tenant: TenantId, session: SessionId) -> Result<()> {
        let mut held = match self.inner.hold_now(tenant, session).await? {
            Ok(Held::Local(g)) => {
                let closed = g.state.status == SessionStatus::Closed;
                drop(g);
                return if closed {
                    Ok(())
                } else {
                    Err(RuntimeError::SessionBusy {
                        session,
                        owner: self.inner.owner.clone(),
                    })
                };
            }
            Ok(held) => held,
            Err(owner) => {
                // Somebody holds a short lease on a closed session (e.g. a refused submit).
                if self.fold(tenant, session).await?.status == SessionStatus::Closed {
                    return Ok(());
                }
                return Err(RuntimeError::SessionBusy { session, owner });
            }
        };
        let j = held.journal();
        let r = if j.durable == 0 {
            // No event at all: the process creating the session stopped between its row and
            // `session.created` (two commits). Nothing ran and nothing else was written; the
            // row, with the lease just taken on it, is all there is, and goes.
            tracing::info!(%session, "closing a session whose creation never completed: removed");
            self.inner
                .store
                .delete_session(tenant, session)
                .await
                .map_err(RuntimeError::from)
        } else if j.state.status == SessionStatus::Closed {
            Ok(())
        } else if let Some(turn) = j
            .state
            .active_turn
            .or_else(|| j.state.queue.front().copied())
        {
            Err(RuntimeError::TurnOpen { session, turn })
        } else {
            Self::close_held(j, self.actor).await
        };
        self.inner.unhold(tenant, held).await;
        r
    }
    async fn close_held(
        j: &mut crate::journal::Journal,
        by: Option<keel_core::PrincipalId>,
    ) -> Result<()> {
        let (corr, body) = crate::background::status_item(SessionStatus::Closed, "closed by user");
        j.stage(vec![(corr.by(by), body)]).await?;
        // Nothing waits on a timer in a closed session.
        j.extras.wake_at = Some(None);
        j.commit("session.closed").await?;
        Ok(())
    }
    /// Records a human's decision on an approval (durably, in the approvals table; idempotent for
    /// the same decision). The session continues on the next [`Runtime::run`], on any worker.
    ///
    /// # Errors
    /// [`RuntimeError::ApprovalWithdrawn`] when the approval is undecided and its turn has ended;
    /// [`RuntimeError::Tools`] when the hash does not match, the approval is decided otherwise
    /// or expired, or does not exist.
    pub async fn decide_approval(
        &self,
        tenant: TenantId,
        approval: ApprovalId,
        decision: ApprovalDecision,
        args_hash: &str,
    ) -> Result<ApprovalRecord> {
        let rec = self.inner.store.get_approval(tenant, approval).await?;
        // Not decided yet, and its turn is over or its cancel acknowledged: the approval went
        // with it (withdrawn, or about to be), and nothing would run. Refused, so nobody reads
        // "decided" for a dead call.
        if matches!(
            rec.status,
            ApprovalStatus::Pending | ApprovalStatus::Expired
        ) && let Some(turn) = self
            .fold(tenant, rec.session_id)
            .await?
            .turns
            .get(&rec.turn_id)
            .filter(|t| t.status.is_terminal() || t.cancel_requested.is_some())
        {
            let outcome = if turn.status.is_terminal() {
                // Its end is journaled: a row still pending (the worker died between the
                // turn's end and the withdrawal) is withdrawn now, so it is no longer listed.
                if rec.status == ApprovalStatus::Pending {
                    self.inner
                        .store
                        .withdraw_turn_approvals(tenant, rec.session_id, rec.turn_id, Utc::now())
                        .await?;
                }
                turn.status.as_str().to_owned()
            } else {
                "being cancelled".to_owned()
            };
            return Err(RuntimeError::ApprovalWithdrawn {
                session: rec.session_id,
                approval,
                outcome,
            });
        }
        // A deny reason is stored and shown to the model: redacted like everything stored.
        let decision = match decision {
            ApprovalDecision::Deny { reason } => {
                let session = rec.session_id;
                let redactor = self.redactor(tenant, session).await?;
                ApprovalDecision::Deny {
                    reason: redactor.redact_str(&reason),
                }
            }
            other => other,
        };
        let now = Utc::now();
        if let Some(by) = self.actor {
            // Record who decides; the service below then finds the decision made (idempotent)
            // or refuses it the same way, with its own errors (and persists an expiry).
            let _ = self
                .inner
                .store
                .decide_approval_as(tenant, approval, decision.clone(), args_hash, now, Some(by))
                .await;
        }
        let svc = ApprovalService::new(self.inner.store.clone(), tenant);
        let decided = svc.decide(approval, decision, args_hash, now).await?;
        // The turn may have ended between the check above and this decision (a `keel cancel`
        // racing it, with no process running the session): its end journaled the approval
        // expired, the call unrun. The decision came too late; say so rather than "decided".
        let f = self.fold(tenant, rec.session_id).await?;
        if let Some(turn) = f.turns.get(&rec.turn_id).filter(|t| t.status.is_terminal())
            && f.approvals
                .get(&approval)
                .is_some_and(|a| a.status == ApprovalStatus::Expired)
        {
            return Err(RuntimeError::ApprovalWithdrawn {
                session: rec.session_id,
                approval,
                outcome: turn.status.as_str().to_owned(),
            });
        }
        Ok(decided)
    }
    /// Records a human's decision on an `outcome_unknown` effect (`effect.decided`): `committed`
    /// (it happened; the outcome is the call's result), `failed` (it did not; the model sees a
    /// failure) or `retry` (dispatch again as a new attempt). Applied by the next
    /// [`Runtime::run`].
    ///
    /// # Errors
    /// [`RuntimeError::EffectNotUnknown`]; [`RuntimeError::SessionBusy`]; store errors.
    pub async fn resolve_effect(
        &self,
        tenant: TenantId,
        session: SessionId,
        key: &OperationKey,
        decision: EffectDecision,
    ) -> Result<()> {
        let mut held = self.inner.hold(tenant, session).await?;
        let j = held.journal();
        let ok = j
            .state
            .effects
            .get(key)
            .is_some_and(|e| e.status == EffectStatus::OutcomeUnknown && e.decision.is_none());
        let r = if ok {
            // The decision is acted on by the next run, on whichever worker claims the session.
            j.extras.wake_at = Some(Some(Utc::now()));
            j.append(
                "effect.decided",
                vec![(
                    Correlation::default()
                        .with_operation(key.clone())
                        .by(self.actor),
                    EventBody::EffectDecided {
                        decision,
                        reconciled: false,
                    },
                )],
            )
            .await
            .map(|_| ())
        } else {
            Err(RuntimeError::EffectNotUnknown {
                session,
                key: key.clone(),
            })
        };
        self.inner.unhold(tenant, held).await;
        r
    }

    /// Posts an intent for a session another live worker runs and waits until it is handled:
    /// `done` holds on the journal ([`Posted::Handled`]), the row disappears without it
    /// ([`Posted::Consumed`]), or the lease frees up and the intent is taken back
    /// ([`Posted::Local`]). After `lease_wait` without any of these the intent is taken back and
    /// the call fails with [`RuntimeError::SessionBusy`].
    pub(crate) async fn post_and_wait(
        &self,
        tenant: TenantId,
        session: SessionId,
        kind: &str,
        payload: &serde_json::Value,
        done: impl Fn(&SessionState) -> bool,
    ) -> Result<Posted> {
        let store = self.inner.store.clone();
        // Intent rows are stored like everything else: redacted (what they journal is too).
        let mut payload = payload.clone();
        self.redactor(tenant, session)
            .await?
            .redact_value(&mut payload);
        let intent = store.post_intent(tenant, session, kind, &payload).await?;
        let deadline = tokio::time::Instant::now() + self.inner.options.lease_wait;
        let mut version = 0;
        let mut state = self.fold(tenant, session).await?;
        loop {
            if state.version != version {
                version = state.version;
                if done(&state) {
                    return Ok(Posted::Handled);
                }
            }
            let pending = store
                .list_intents(tenant, session)
                .await?
                .iter()
                .any(|i| i.intent_id == intent.intent_id);
            if !pending {
                // Handlers journal with the delete (or delete before acting): this read is final.
                let state = self.fold(tenant, session).await?;
                return Ok(if done(&state) {
                    Posted::Handled
                } else {
                    Posted::Consumed(Box::new(state))
                });
            }
            let owner = match self.inner.hold_now(tenant, session).await? {
                Ok(held) => {
                    if store
                        .delete_intent(tenant, session, &intent.intent_id)
                        .await?
                    {
                        return Ok(Posted::Local(held));
                    }
                    self.inner.unhold(tenant, held).await;
                    continue; // handled meanwhile: the next pass sees it
                }
                Err(holder) => holder,
            };
            if tokio::time::Instant::now() >= deadline
                && store
                    .delete_intent(tenant, session, &intent.intent_id)
                    .await?
            {
                return Err(RuntimeError::SessionBusy { session, owner });
            }
            let v = store
                .wait_for_version(tenant, session, version, POLL)
                .await?;
            if v != version {
                state = self.fold(tenant, session).await?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;

    use keel_core::TenantId;

    use crate::{RuntimeOptions, SessionConfig};

    /// The race of `keel cancel` with a live worker (review, minor item): the canceller saw turn
    /// T active and posted its intent; the worker let the session go with the intent still
    /// posted and T already ended (finished, or cancelled by the intent it journaled). The
    /// canceller then holds the session itself: cancelling T is done, not an error. Before, it
    /// looked for "the active turn" again, found none and failed with `NoActiveTurn` (exit 1).
    #[tokio::test]
    async fn a_cancel_whose_turn_ended_meanwhile_is_no_error() {
        let dir = tempfile::tempdir().unwrap();
        let store = keel_store::SqlStore::open_sqlite(&dir.path().join("keel.db"))
            .await
            .unwrap();
        let rt = crate::test_support::scripted_runtime(
            Arc::new(store),
            &RuntimeOptions::default().worker_name,
            RuntimeOptions::default().lease_wait,
        );
        let release = crate::test_support::scripted_release();
        let tenant = TenantId::new();
        let config = SessionConfig {
            workspace: dir.path().to_path_buf(),
            ..SessionConfig::default()
        };
        let session = rt.create_session(tenant, &release, config).await.unwrap();
        let turn = rt.submit(tenant, session, "go").await.unwrap();
        // The worker ends the turn while the canceller waits on its intent.
        rt.run(tenant, session).await.unwrap();
        let version = rt.view(tenant, session).await.unwrap().state.version;
        let held = rt.inner.hold_now(tenant, session).await.unwrap().unwrap();
        assert_eq!(
            rt.cancel_on(tenant, session, held, Some(turn))
                .await
                .unwrap(),
            turn
        );
        assert_eq!(
            rt.view(tenant, session).await.unwrap().state.version,
            version,
            "nothing to journal"
        );
    }
}
