//! Sub-agent trees share one budget while they run.
//!
//! The children a session spawns in one step (`spawn_agent`, several at once) and everything
//! they spawn form a tree that draws on one [`Pool`]: the limits are what the spawning session
//! (the tree's root) had left when its first child of that step started
//! ([`keel_core::plan::budget_left`]: steps, tokens, cost, tool calls; wall time is each
//! child's own turn limit), and the ledger holds every member's *own* spend — its own steps'
//! tokens and cost, its own steps and tool calls, never what its finished children reported
//! (`agent.finished`), which are members with their own entries. Each member publishes its
//! spend whenever its planner is asked and is checked against the pool's total
//! ([`keel_core::plan::Facts::shared`]), so N members running at once overshoot the root's
//! budget by at most one step each. Without the pool each child got the whole remainder and
//! eight children running side by side spent eight times it (attack review of issue 15).
//!
//! The root itself waits in its step while the tree runs; when the children finish, their
//! spend is in the root's journal (`agent.finished`) and its own checks see it. A pool lives
//! while a member runs in this process: a tree resumed after a crash starts a new pool from
//! what the journal then says was left.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use keel_core::plan::SharedBudget;
use keel_core::state::TurnState;
use keel_core::{Budget, Consumed, SessionId, StepId};

/// One tree's budget: its limits and each member's own spend.
#[derive(Debug)]
pub(crate) struct Pool {
    limit: Budget,
    spent: Mutex<HashMap<SessionId, Consumed>>,
}

impl Pool {
    fn total(&self) -> Consumed {
        let spent = self.spent.lock().unwrap_or_else(PoisonError::into_inner);
        spent.values().fold(Consumed::default(), |mut t, c| {
            t.steps = t.steps.saturating_add(c.steps);
            t.tokens = t.tokens.saturating_add(c.tokens);
            t.cost_usd += c.cost_usd;
            t.tool_calls = t.tool_calls.saturating_add(c.tool_calls);
            t
        })
    }
}

/// This process's pools: which pool each running member draws on, and each spawning step's.
#[derive(Debug, Default)]
pub(crate) struct Pools {
    members: Mutex<HashMap<SessionId, Arc<Pool>>>,
    roots: Mutex<HashMap<(SessionId, StepId), Weak<Pool>>>,
}

/// A child's place in its tree's pool, given up when dropped (its entry stays in the ledger
/// for its siblings).
pub(crate) struct Membership<'a> {
    pools: &'a Pools,
    child: SessionId,
}

impl Drop for Membership<'_> {
    fn drop(&mut self) {
        lock(&self.pools.members).remove(&self.child);
    }
}

impl Pools {
    /// Makes `child`, spawned by `parent` in its step `step`, a member of the pool it draws
    /// on: the parent's own when the parent is a member (a grandchild draws on its root's
    /// tree), else the pool of the parent's step, made with `left()` when it is the step's
    /// first child.
    pub(crate) fn join(
        &self,
        parent: SessionId,
        step: StepId,
        child: SessionId,
        left: impl FnOnce() -> Budget,
    ) -> Membership<'_> {
        let inherited = lock(&self.members).get(&parent).cloned();
        let pool = inherited.unwrap_or_else(|| {
            let mut roots = lock(&self.roots);
            roots.retain(|_, w| w.strong_count() > 0);
            if let Some(p) = roots.get(&(parent, step)).and_then(Weak::upgrade) {
                return p;
            }
            let p = Arc::new(Pool {
                limit: Budget {
                    max_wall_time_ms: None,
                    ..left()
                },
                spent: Mutex::new(HashMap::new()),
            });
            roots.insert((parent, step), Arc::downgrade(&p));
            p
        });
        lock(&self.members).insert(child, pool);
        Membership { pools: self, child }
    }

    /// For a member: records `turn`'s own spend (its own steps, tokens, cost and tool calls,
    /// not its finished children's) and gives its pool's limits and total. `None` for a
    /// session that draws on no pool here.
    pub(crate) fn shared(&self, session: SessionId, turn: &TurnState) -> Option<SharedBudget> {
        let pool = lock(&self.members).get(&session).cloned()?;
        let sub = &turn.subagents;
        let own = Consumed {
            steps: u32::try_from(turn.steps.len()).unwrap_or(u32::MAX),
            tokens: turn.usage.total_tokens().saturating_sub(sub.tokens),
            cost_usd: (turn.cost_usd - sub.cost_usd).max(0.0),
            tool_calls: turn.tool_calls_run,
            wall_time_ms: 0,
        };
        lock(&pool.spent).insert(session, own);
        Some(SharedBudget {
            limit: pool.limit,
            used: pool.total(),
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
