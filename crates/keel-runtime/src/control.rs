//! Input, cancellation, closing and human decisions: the calls that act on a session from any
//! process.
//! When another live worker runs the session they post a durable intent ([`crate::intent`])
//! and wait until that worker has journaled it.

use std::time::Duration;

use chrono::Utc;
use keel_core::{
    ApprovalDecision, ApprovalId, ApprovalRecord, Correlation, EffectDecision, EffectStatus,
    EventBody, OperationKey, SessionId, SessionState, SessionStatus, StateMachine, TenantId,
    ToolCallId, TurnId,
};
use keel_tools::approval::ApprovalService;

use crate::config::{MultitaskStrategy, SessionConfig};
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
        if input.trim().is_empty() {
            return Err(RuntimeError::InvalidInput(
                "input is empty; a turn needs a message".into(),
            ));
        }
        if let Ok(held) = self.inner.hold_now(tenant, session).await? {
            return self
                .submit_on(tenant, held, input, strategy, TurnId::new())
                .await;
        }
        // Another live worker runs the session: ask it through a durable intent.
        let state = self.fold(tenant, session).await?;
        let busy = |s: &SessionState| s.active_turn.or_else(|| s.queue.front().copied());
        if state.status == SessionStatus::Closed {
            return Err(RuntimeError::Closed { session });
        }
        let pinned = serde_json::from_value::<SessionConfig>(state.config.clone())
            .map(|c| c.multitask)
            .unwrap_or_default();
        if strategy.unwrap_or(pinned) == MultitaskStrategy::Reject
            && let Some(t) = busy(&state)
        {
            return Err(RuntimeError::TurnInProgress { session, turn: t });
        }
        let turn = TurnId::new();
        let payload = serde_json::to_value(InputIntent {
            turn_id: turn,
            input: input.to_owned(),
            strategy,
        })
        .map_err(|e| RuntimeError::InvalidInput(format!("input: {e}")))?;
        match self
            .post_and_wait(tenant, session, intent::INPUT, &payload, |s| {
                s.turns.contains_key(&turn)
            })
            .await?
        {
            Posted::Handled => Ok(turn),
            Posted::Local(held) => self.submit_on(tenant, held, input, strategy, turn).await,
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
        strategy: Option<MultitaskStrategy>,
        turn: TurnId,
    ) -> Result<TurnId> {
        let r = crate::intent::queue_input(held.journal(), input, strategy, turn).await;
        if r.is_ok()
            && crate::intent::strategy_of(held.journal(), strategy) == MultitaskStrategy::Interrupt
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
    /// nobody runs (e.g. waiting in `requires_action`) is aborted at once (this call runs it).
    /// Returns the cancelled turn; cancelling a turn already being cancelled is a no-op.
    ///
    /// # Errors
    /// [`RuntimeError::NoActiveTurn`]; [`RuntimeError::SessionBusy`] when the worker running the
    /// session neither handles the intent nor gives the lease up within `lease_wait`; store
    /// errors.
    pub async fn cancel_turn(&self, tenant: TenantId, session: SessionId) -> Result<TurnId> {
        if let Ok(held) = self.inner.hold_now(tenant, session).await? {
            return self.cancel_on(tenant, session, held).await;
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
        })
        .map_err(|e| RuntimeError::InvalidInput(format!("cancel: {e}")))?;
        match self
            .post_and_wait(tenant, session, intent::CANCEL_TURN, &payload, requested)
            .await?
        {
            Posted::Handled | Posted::Consumed(_) => Ok(turn),
            Posted::Local(held) => self.cancel_on(tenant, session, held).await,
        }
    }
    async fn cancel_on(
        &self,
        tenant: TenantId,
        session: SessionId,
        mut held: Held,
    ) -> Result<TurnId> {
        let j = held.journal();
        let Some(turn) = j
            .state
            .active_turn
            .or_else(|| j.state.queue.front().copied())
        else {
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
                    Correlation::turn(turn),
                    EventBody::TurnCancelRequested {
                        reason: "cancelled by user".into(),
                    },
                )],
            )
            .await
        };
        let local = matches!(held, Held::Local(_));
        if local && let Some(a) = self.inner.active(session) {
            a.cancel_turn();
        }
        self.inner.unhold(tenant, held).await;
        r?;
        if !local {
            // Nobody runs the session here: finish the cancellation now.
            self.run(tenant, session).await?;
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
        if let Some(t) = self
            .inner
            .active(session)
            .and_then(|a| a.call_token(call.as_str()))
        {
            t.cancel();
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
    /// once. Closing a closed session is a quiet success that writes nothing.
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
        let r = if j.state.status == SessionStatus::Closed {
            Ok(())
        } else if let Some(turn) = j
            .state
            .active_turn
            .or_else(|| j.state.queue.front().copied())
        {
            Err(RuntimeError::TurnOpen { session, turn })
        } else {
            Self::close_held(j).await
        };
        self.inner.unhold(tenant, held).await;
        r
    }
    async fn close_held(j: &mut crate::journal::Journal) -> Result<()> {
        j.stage(vec![crate::driver::status_item(
            SessionStatus::Closed,
            "closed by user",
        )])
        .await?;
        // Nothing waits on a timer in a closed session.
        j.extras.wake_at = Some(None);
        j.commit("session.closed").await?;
        Ok(())
    }
    /// Records a human's decision on an approval (durably, in the approvals table; idempotent for
    /// the same decision). The session continues on the next [`Runtime::run`], on any worker.
    ///
    /// # Errors
    /// [`RuntimeError::Tools`] when the hash does not match, the approval is decided otherwise
    /// or expired, or does not exist.
    pub async fn decide_approval(
        &self,
        tenant: TenantId,
        approval: ApprovalId,
        decision: ApprovalDecision,
        args_hash: &str,
    ) -> Result<ApprovalRecord> {
        // A deny reason is stored and shown to the model: redacted like everything stored.
        let decision = match decision {
            ApprovalDecision::Deny { reason } => {
                let session = self
                    .inner
                    .store
                    .get_approval(tenant, approval)
                    .await?
                    .session_id;
                let redactor = self.session_redactor(tenant, session).await?;
                ApprovalDecision::Deny {
                    reason: redactor.redact_str(&reason),
                }
            }
            other => other,
        };
        let svc = ApprovalService::new(self.inner.store.clone(), tenant);
        Ok(svc
            .decide(approval, decision, args_hash, Utc::now())
            .await?)
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
            j.append(
                "effect.decided",
                vec![(
                    Correlation::default().with_operation(key.clone()),
                    EventBody::EffectDecided { decision },
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
        self.session_redactor(tenant, session)
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
                // Handlers journal before they delete: this read is final.
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
