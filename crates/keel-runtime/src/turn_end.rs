//! Ending a turn: whatever the reason, every open call gets its one result (a dispatched
//! effect becomes `outcome_unknown` — never faked as failed), open steps fail, the session is
//! `running` again, and `turn.finished` carries the reason, usage and cost (in total and by the
//! model that served each step), steps and duration — all in one commit. A call's approval
//! still pending is journaled `approval.expired` in that commit and withdrawn from the approvals
//! table right after it; one a human already decided in the table (while no process ran the
//! session) is journaled `approval.decided` as made, and its call still ends unrun.

use chrono::Utc;
use keel_core::{
    ApprovalDecision, ApprovalId, ApprovalStatus, BudgetLimit, Correlation, EffectStatus,
    EventBody, PrincipalId, SessionStatus, StateMachine, TerminalReason, ToolCallStatus, TurnId,
};

use crate::background::{finished_item, lock, status_item};
use crate::driver::{Items, Runner};
use crate::error::Result;

impl Runner {
    /// Ends the turn with `reason`: stops everything below it, gives every open call a result
    /// (dispatched effects become `outcome_unknown`), closes open steps, and journals
    /// `turn.finished` (after `session.status_changed(running)` if the session required action).
    pub(crate) async fn finish_turn(
        &self,
        turn: TurnId,
        reason: TerminalReason,
        limit: Option<BudgetLimit>,
        error: Option<String>,
    ) -> Result<()> {
        if reason != TerminalReason::Completed {
            self.turn_token().cancel();
        }
        self.join_inflight().await;
        // Dispatched effects become `outcome_unknown` below: not while a holder this run took
        // the session from may still be running one.
        self.wait_out_previous_holder().await?;
        let call_status = if reason == TerminalReason::Aborted {
            ToolCallStatus::Cancelled
        } else {
            ToolCallStatus::Interrupted
        };
        // What a stopped attempt used is counted in its step's `step.failed`.
        let unsettled = lock(&self.unsettled_usage).take();
        let decided = self.decided_in_table(turn).await;
        let items = self
            .read(|j| {
                let mut items: Items = Vec::new();
                let Some(t) = j.state.turns.get(&turn) else {
                    return items;
                };
                if j.state.status == SessionStatus::RequiresAction
                    && j.state.active_turn == Some(turn)
                {
                    items.push(status_item(SessionStatus::Running, "the turn ended"));
                }
                for s in t.steps.iter().filter_map(|s| j.state.steps.get(s)) {
                    for c in s
                        .tool_calls
                        .iter()
                        .filter_map(|c| j.state.tool_calls.get(c))
                    {
                        if c.status.is_terminal() {
                            continue;
                        }
                        if let Some(key) = &c.operation_key
                            && j.state
                                .effects
                                .get(key)
                                .is_some_and(|e| e.status == EffectStatus::Dispatched)
                        {
                            items.push((
                                Correlation::default().with_operation(key.clone()),
                                EventBody::EffectOutcomeUnknown {},
                            ));
                        }
                        // Its approval, still pending, is withdrawn: nobody may decide it now —
                        // unless a human already decided it in the approvals table (while no
                        // process ran the session): that decision is journaled as made, and the
                        // call still ends unrun with the turn.
                        if let Some(a) = c
                            .approval_id
                            .and_then(|a| j.state.approvals.get(&a))
                            .filter(|a| a.status == ApprovalStatus::Pending)
                        {
                            items.push(match decided.iter().find(|(id, _, _)| *id == a.id) {
                                Some((_, decision, by)) => (
                                    Correlation::default().with_approval(a.id).by(*by),
                                    EventBody::ApprovalDecided {
                                        decision: decision.clone(),
                                        hook: None,
                                    },
                                ),
                                None => (
                                    Correlation::default().with_approval(a.id),
                                    EventBody::ApprovalExpired {},
                                ),
                            });
                        }
                        let text = match reason {
                            TerminalReason::Aborted => {
                                format!("`{}` was cancelled: the turn was cancelled.", c.name)
                            }
                            _ => format!(
                                "`{}` was interrupted: the turn ended ({}).",
                                c.name,
                                reason.as_str()
                            ),
                        };
                        items.push(finished_item(turn, s.id, &c.id, call_status, text, true));
                    }
                    if !s.status.is_terminal() {
                        let used = unsettled.filter(|u| u.step == s.id);
                        items.push((
                            Correlation::step(turn, s.id, s.attempt),
                            EventBody::StepFailed {
                                error_kind: if reason == TerminalReason::Aborted {
                                    "cancelled".into()
                                } else {
                                    reason.as_str().into()
                                },
                                message: error.clone().unwrap_or_else(|| "the turn ended".into()),
                                responses_consumed: 0,
                                usage: used.map(|u| u.usage).unwrap_or_default(),
                                cost_usd: used.map_or(0.0, |u| u.cost_usd),
                                usage_estimated: used.is_some_and(|u| u.estimated),
                            },
                        ));
                    }
                }
                items
            })
            .await;
        // Children of calls the turn ends unfinished (a `spawn_agent` call detached while its
        // child waited on a human, then the parent's turn was cancelled): cancelled with it.
        let orphans: Vec<keel_core::SessionId> = if reason == TerminalReason::Completed {
            Vec::new()
        } else {
            self.read(|j| {
                j.state
                    .children
                    .iter()
                    .filter(|(_, c)| c.finished.is_none())
                    .filter(|(_, c)| {
                        c.tool_call_id
                            .as_ref()
                            .and_then(|id| j.state.tool_calls.get(id))
                            .is_some_and(|call| call.turn_id == turn && !call.status.is_terminal())
                    })
                    .map(|(id, _)| *id)
                    .collect()
            })
            .await
        };
        // The calls' results and the steps' ends are folded first, so the turn's totals
        // include what its stopped attempts used.
        self.stage(items).await?;
        for child in orphans {
            let rt = crate::Runtime {
                inner: self.rt.clone(),
                actor: None,
            };
            // Boxed: cancelling runs the child (a `Runtime::run`, which runs this code again).
            match Box::pin(rt.cancel_turn(self.tenant, child)).await {
                Ok(_) | Err(crate::RuntimeError::NoActiveTurn { .. }) => {}
                Err(e) => {
                    tracing::warn!(session = %self.session, %child, "cancelling a sub-agent with its parent's turn: {e}")
                }
            }
        }
        // Read and committed under one hold of the journal's lock: a cancellation either lands
        // before (and is seen here) or finds the turn ended.
        self.append_built("turn.finished", |j| {
            let mut items: Items = Vec::new();
            let Some(t) = j.state.turns.get(&turn) else {
                return items;
            };
            let duration = t.started_at.map_or(0, |s| {
                u64::try_from((Utc::now() - s).num_milliseconds()).unwrap_or(0)
            });
            // A cancel acknowledged while the turn was completing (journaled after the
            // planner chose to complete, before this) wins: the turn ends `aborted`.
            let reason = if reason == TerminalReason::Completed && t.cancel_requested.is_some() {
                TerminalReason::Aborted
            } else {
                reason
            };
            items.push((
                Correlation::turn(turn),
                EventBody::TurnFinished {
                    terminal_reason: reason,
                    limit,
                    usage: t.usage,
                    cost_usd: t.cost_usd,
                    usage_by_model: t.usage_by_model.clone(),
                    num_steps: u32::try_from(t.steps.len()).unwrap_or(u32::MAX),
                    duration_ms: duration,
                    error: error.clone(),
                },
            ));
            items
        })
        .await?;
        // After the commit, the approvals table follows the journal: the turn's approvals still
        // pending there (journaled `approval.expired` above) leave `pending`, so no list shows
        // them and no late decision lands. A failure here leaves them listed; deciding one is
        // refused all the same (the call is terminal in the fold).
        match self
            .rt
            .store
            .withdraw_turn_approvals(self.tenant, self.session, turn, Utc::now())
            .await
        {
            Ok(ids) if !ids.is_empty() => {
                tracing::info!(session = %self.session, %turn, withdrawn = ids.len(), "the ended turn's pending approvals were withdrawn");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(session = %self.session, %turn, "withdrawing the ended turn's pending approvals: {e}");
            }
        }
        tracing::info!(session = %self.session, %turn, terminal_reason = reason.as_str(), "turn finished");
        Ok(())
    }
}

impl Runner {
    /// The approvals of `turn`'s open calls that are pending in the journal but decided in the
    /// approvals table (`keel approve` / `deny` while no process ran the session) for the
    /// arguments the journal holds, with the decision and who made it. A row that cannot be
    /// read, or whose arguments' hash differs, counts as undecided (the approval is then
    /// journaled expired). A decision that lands after this read and before the turn's end
    /// is committed is in the table only: the journal says expired, and nothing runs.
    async fn decided_in_table(
        &self,
        turn: TurnId,
    ) -> Vec<(ApprovalId, ApprovalDecision, Option<PrincipalId>)> {
        let pending: Vec<(ApprovalId, String)> = self
            .read(|j| {
                j.state
                    .open_tool_calls()
                    .filter(|c| c.turn_id == turn)
                    .filter_map(|c| c.approval_id)
                    .filter_map(|a| j.state.approvals.get(&a))
                    .filter(|a| a.status == ApprovalStatus::Pending)
                    .map(|a| (a.id, a.args_hash.clone()))
                    .collect()
            })
            .await;
        let mut decided = Vec::new();
        for (a, args_hash) in pending {
            // A row whose hash is not the journal's was not decided for this call (the planner
            // denies such a decision: "made for other arguments"); it is journaled expired.
            if let Ok(row) = self.rt.store.get_approval(self.tenant, a).await
                && matches!(row.status, ApprovalStatus::Allowed | ApprovalStatus::Denied)
                && row.args_hash == args_hash
                && let Some(decision) = row.decision
            {
                decided.push((a, decision, row.decided_by));
            }
        }
        decided
    }
}
