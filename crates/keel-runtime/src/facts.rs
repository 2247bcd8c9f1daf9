//! The planner's inputs: the plain facts [`keel_core::plan::next`] needs beside the folded
//! state — the step's frozen verdict on each open call, the approvals table's decisions, the
//! context estimate and the tenant's usage (only when a new step is about to be planned: the
//! step's reservation against the tenant's day answers it, see [`crate::budgets`]), the calls
//! running in this process, and the session's limits.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use chrono::Utc;
use keel_core::plan::{ApprovalFacts, Facts, Limits, Next};
use keel_core::{ApprovalStatus, StateMachine, StepStatus, ToolCallStatus, TurnStatus};

use crate::background::lock;
use crate::config::merge_budget;
use crate::driver::Runner;
use crate::error::Result;

/// Compaction failures and provider overflows tolerated per turn.
const MAX_COMPACTION_FAILURES: u32 = 3;

impl Runner {
    /// Gathers the facts and asks the planner.
    pub(crate) async fn plan(&self) -> Result<Next> {
        // What the facts must cover: the open calls of the active turn's last step, the
        // approvals they wait on, and whether a new step is about to be planned.
        let (turn, pending_approvals, new_step) = self
            .read(|j| {
                let s = &j.state;
                let Some(turn) = s.active_turn.and_then(|t| s.turns.get(&t)) else {
                    return (None, Vec::new(), false);
                };
                let last = turn.steps.last().and_then(|st| s.steps.get(st));
                let pending = last
                    .map(|st| {
                        st.tool_calls
                            .iter()
                            .filter_map(|c| s.tool_calls.get(c))
                            .filter(|c| c.status == ToolCallStatus::AwaitingApproval)
                            .filter_map(|c| c.approval_id)
                            .filter(|a| {
                                s.approvals
                                    .get(a)
                                    .is_some_and(|a| a.status == ApprovalStatus::Pending)
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let new_step = turn.status == TurnStatus::Sampling
                    && last.is_none_or(|st| {
                        st.status == StepStatus::Completed
                            && st
                                .tool_calls
                                .iter()
                                .all(|c| s.tool_calls.get(c).is_none_or(|c| c.status.is_terminal()))
                            && (!st.tool_calls.is_empty()
                                // A stop hook asked the turn to continue after this step.
                                || turn.stop_continue.as_ref().is_some_and(|(s, _)| *s == st.id))
                    });
                (Some(turn.id), pending, new_step)
            })
            .await;
        let mut approvals = BTreeMap::new();
        for a in pending_approvals {
            match self.approvals.get(a).await {
                Ok(rec) => {
                    approvals.insert(
                        a,
                        ApprovalFacts {
                            status: rec.status,
                            decision: rec.decision,
                            args_hash: rec.args_hash,
                            expires_at: rec.expires_at,
                        },
                    );
                }
                // A call waits on an approval the driver has not requested yet: the planner
                // asks for it next (`approval.requested` commits with its row).
                Err(keel_tools::ToolsError::ApprovalNotFound { .. }) => {}
                Err(e) => {
                    tracing::warn!(session = %self.session, approval = %a, "reading an approval: {e}")
                }
            }
        }
        let (tenant_usage, context_tokens) = if new_step {
            // The step's reservation needs the size of what it will send: project first.
            let tokens = self.step_estimate().await?;
            (self.reserve_step(tokens).await?, tokens)
        } else {
            (None, 0)
        };
        let j = self.active.journal.lock().await;
        let context_tokens = if new_step {
            self.step_estimate_at(&j)?.unwrap_or(context_tokens)
        } else {
            0
        };
        let calls = self.call_facts_for(&j);
        let facts = Facts {
            now: Utc::now(),
            limits: self.limits(),
            calls,
            approvals,
            running_here: self.active.live().into_iter().collect(),
            waiting_in_child: self.active.waiting().into_iter().collect(),
            context_tokens,
            compaction_failures: turn
                .and_then(|t| lock(&self.compaction_failures).get(&t).copied())
                .unwrap_or(0),
            skip_compaction: self.skip_compaction.load(Ordering::SeqCst),
            unreconciled: lock(&self.unreconciled).clone(),
            tenant_usage,
            shared: j
                .state
                .active_turn
                .and_then(|t| j.state.turns.get(&t))
                .and_then(|t| self.rt.spend.shared(self.session, t)),
            hooks: self.hook_facts(&j.state),
        };
        Ok(keel_core::plan::next(&j.state, &facts))
    }

    /// The estimated tokens of the next step's context, projecting (and keeping) its snapshot.
    async fn step_estimate(&self) -> Result<u64> {
        let j = self.active.journal.lock().await;
        let snapshot = self.project(&j)?;
        let tokens = snapshot.estimated_tokens;
        *lock(&self.snapshot) = Some((j.state.version, snapshot));
        Ok(tokens)
    }

    /// The estimate again when the journal moved since [`Runner::step_estimate`] (intents
    /// handled meanwhile): `None` when the kept snapshot is still current.
    fn step_estimate_at(&self, j: &crate::journal::Journal) -> Result<Option<u64>> {
        if lock(&self.snapshot)
            .as_ref()
            .is_some_and(|(v, _)| *v == j.state.version)
        {
            return Ok(None);
        }
        let snapshot = self.project(j)?;
        let tokens = snapshot.estimated_tokens;
        *lock(&self.snapshot) = Some((j.state.version, snapshot));
        Ok(Some(tokens))
    }

    /// The session's limits as plain values for the planner.
    pub(crate) fn limits(&self) -> Limits {
        Limits {
            turn_budget: merge_budget(self.release.definition.budget, self.config.turn_budget),
            session_budget: self.config.session_budget,
            tenant_daily_budget: self.config.tenant_daily_budget,
            loop_threshold: self.config.loop_threshold,
            turn_timeout_ms: self.config.turn_timeout_ms,
            context_window_tokens: self.config.context_window(self.model.as_ref()),
            compact_at_fraction: self.config.compact_at_fraction,
            max_compaction_failures: MAX_COMPACTION_FAILURES,
        }
    }
}
