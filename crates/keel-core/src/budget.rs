//! Budgets, usage and terminal reasons.
//!
//! A [`Budget`] limits steps, tokens, cost (USD), tool calls and wall time (ms). The same type is used
//! per turn, per session and per tenant day; [`Budget::check`] runs before each step against what the
//! scope has [`Consumed`] so far and names the first exhausted [`BudgetLimit`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::machine::TurnStatus;

/// The most tokens one model response is counted for, per [`Usage`] field: 2^32 (about 4.3
/// billion, thousands of times any context window). Reports above it are capped
/// ([`Usage::capped`]); sums of capped reports stay far inside a 63-bit store column.
pub const MAX_RESPONSE_TOKENS: u64 = 1 << 32;

/// Token counts of one model response, or a sum of them. Units: tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens, including cached ones.
    #[serde(default)]
    pub input_tokens: u64,
    /// Completion tokens, including reasoning tokens.
    #[serde(default)]
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Output tokens spent on reasoning.
    #[serde(default)]
    pub reasoning_tokens: u64,
}

impl Usage {
    /// Input plus output tokens: what budgets count.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// Whether every count is zero (nothing used, or nothing reported).
    pub fn is_zero(&self) -> bool {
        *self == Usage::default()
    }

    /// This usage with every count capped at [`MAX_RESPONSE_TOKENS`]: a provider's usage report
    /// is counted at most at that bound per field and response, so no report — a buggy or
    /// hostile one claiming 2^63 tokens — can overflow a sum, a store column or a budget check
    /// (a capped report still exhausts every realistic budget). Returns the capped usage and
    /// whether anything was capped.
    pub fn capped(&self) -> (Usage, bool) {
        let cap = |n: u64| n.min(MAX_RESPONSE_TOKENS);
        let out = Usage {
            input_tokens: cap(self.input_tokens),
            output_tokens: cap(self.output_tokens),
            cache_read_tokens: cap(self.cache_read_tokens),
            cache_write_tokens: cap(self.cache_write_tokens),
            reasoning_tokens: cap(self.reasoning_tokens),
        };
        (out, out != *self)
    }

    /// Adds `other` field by field (saturating).
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(other.cache_read_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(other.reasoning_tokens);
    }
}

/// What one model served within a scope (a turn, a session): the tokens of its responses —
/// completed ones and failed attempts that used tokens (a stream that broke after the provider
/// counted the prompt) — their cost in USD (priced with that model's price) and how many steps it
/// answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelTotals {
    /// Tokens of the model's responses, summed field by field.
    #[serde(default)]
    pub usage: Usage,
    /// Their cost, USD.
    #[serde(default)]
    pub cost_usd: f64,
    /// Completed steps the model answered.
    #[serde(default)]
    pub steps: u32,
    /// Some of `usage` is the runtime's estimate: the provider reported no usage for a response
    /// (see `step.completed`'s `usage_estimated`). Absent (false) otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
}

/// [`ModelTotals`] per model label (`gpt-4o`, `scripted:demo.jsonl`), ordered by label: the
/// `usage_by_model` of `turn.finished` and of the folded turn and session.
pub type UsageByModel = BTreeMap<String, ModelTotals>;

impl ModelTotals {
    /// Adds one completed step of `usage` tokens costing `cost_usd` USD.
    pub fn add_step(&mut self, usage: &Usage, cost_usd: f64) {
        self.add_usage(usage, cost_usd);
        self.steps = self.steps.saturating_add(1);
    }

    /// Adds `usage` tokens costing `cost_usd` USD that no completed step answered (a failed
    /// attempt's).
    pub fn add_usage(&mut self, usage: &Usage, cost_usd: f64) {
        self.usage.add(usage);
        self.cost_usd += finite_cost(cost_usd);
    }
}

/// `cost_usd` when it is a finite, non-negative amount, else 0: what sums of costs add.
pub fn finite_cost(cost_usd: f64) -> f64 {
    if cost_usd.is_finite() && cost_usd > 0.0 {
        cost_usd
    } else {
        0.0
    }
}

/// The limit a budget ran out of; named in `turn.finished` when the reason is `budget_exhausted`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetLimit {
    /// Model samplings.
    Steps,
    /// Input plus output tokens.
    Tokens,
    /// Cost in USD.
    Cost,
    /// Tool calls run.
    ToolCalls,
    /// Wall-clock time in ms.
    WallTime,
}

/// Limits for one scope (turn, session or tenant day). `None` means unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// Most model samplings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    /// Most input plus output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Most cost, USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Most tool calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u32>,
    /// Most wall-clock time, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wall_time_ms: Option<u64>,
}

/// What a scope has used so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Consumed {
    /// Completed or failed model samplings.
    pub steps: u32,
    /// Input plus output tokens.
    pub tokens: u64,
    /// Cost, USD.
    pub cost_usd: f64,
    /// Tool calls that ran (reached `running`).
    pub tool_calls: u32,
    /// Elapsed wall-clock time, ms.
    pub wall_time_ms: u64,
}

impl Budget {
    /// The tighter of two budgets, limit by limit (a limit set in only one of them is kept).
    #[must_use]
    pub fn tighter(&self, other: &Budget) -> Budget {
        fn min<T: PartialOrd + Copy>(x: Option<T>, y: Option<T>) -> Option<T> {
            match (x, y) {
                (Some(x), Some(y)) => Some(if y < x { y } else { x }),
                (x, None) => x,
                (None, y) => y,
            }
        }
        Budget {
            max_steps: min(self.max_steps, other.max_steps),
            max_tokens: min(self.max_tokens, other.max_tokens),
            max_cost_usd: min(self.max_cost_usd, other.max_cost_usd),
            max_tool_calls: min(self.max_tool_calls, other.max_tool_calls),
            max_wall_time_ms: min(self.max_wall_time_ms, other.max_wall_time_ms),
        }
    }

    /// Checks whether another step may start. A limit is exhausted once consumption reaches it
    /// (`used >= max`), so `max_steps = 3` allows exactly three steps. Limits are checked in the
    /// order steps, tokens, cost, tool calls, wall time; the first exhausted one is returned.
    ///
    /// # Errors
    /// The exhausted [`BudgetLimit`].
    pub fn check(&self, used: &Consumed) -> Result<(), BudgetLimit> {
        if self.max_steps.is_some_and(|m| used.steps >= m) {
            return Err(BudgetLimit::Steps);
        }
        if self.max_tokens.is_some_and(|m| used.tokens >= m) {
            return Err(BudgetLimit::Tokens);
        }
        if self.max_cost_usd.is_some_and(|m| used.cost_usd >= m) {
            return Err(BudgetLimit::Cost);
        }
        if self.max_tool_calls.is_some_and(|m| used.tool_calls >= m) {
            return Err(BudgetLimit::ToolCalls);
        }
        if self
            .max_wall_time_ms
            .is_some_and(|m| used.wall_time_ms >= m)
        {
            return Err(BudgetLimit::WallTime);
        }
        Ok(())
    }
}

/// Why a run of a turn ended — one list everywhere: events, the CLI result line, the API, exit codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminalReason {
    /// The model ended the turn.
    Completed,
    /// Waiting on a human (an approval or an `outcome_unknown` decision); resumable. The turn is not
    /// finished: no `turn.finished` carries this reason.
    RequiresAction,
    /// Cancelled.
    Aborted,
    /// An error the runtime could not recover from.
    Failed,
    /// A budget ran out; `turn.finished` names the [`BudgetLimit`].
    BudgetExhausted,
    /// The same failing call was repeated.
    LoopDetected,
    /// The context stayed over the model's window after compaction.
    PromptTooLong,
}

impl TerminalReason {
    /// Every reason, in the documented order.
    pub const ALL: [TerminalReason; 7] = [
        TerminalReason::Completed,
        TerminalReason::RequiresAction,
        TerminalReason::Aborted,
        TerminalReason::Failed,
        TerminalReason::BudgetExhausted,
        TerminalReason::LoopDetected,
        TerminalReason::PromptTooLong,
    ];

    /// The terminal [`TurnStatus`] a `turn.finished` with this reason writes, or `None` for
    /// `requires_action`, which suspends the turn instead of ending it.
    pub fn turn_status(self) -> Option<TurnStatus> {
        match self {
            TerminalReason::Completed => Some(TurnStatus::Completed),
            TerminalReason::RequiresAction => None,
            TerminalReason::Aborted => Some(TurnStatus::Aborted),
            TerminalReason::Failed
            | TerminalReason::BudgetExhausted
            | TerminalReason::LoopDetected
            | TerminalReason::PromptTooLong => Some(TurnStatus::Failed),
        }
    }

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            TerminalReason::Completed => "completed",
            TerminalReason::RequiresAction => "requires_action",
            TerminalReason::Aborted => "aborted",
            TerminalReason::Failed => "failed",
            TerminalReason::BudgetExhausted => "budget_exhausted",
            TerminalReason::LoopDetected => "loop_detected",
            TerminalReason::PromptTooLong => "prompt_too_long",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_names_the_first_exhausted_limit() {
        let b = Budget {
            max_steps: Some(3),
            max_tokens: Some(100),
            max_cost_usd: Some(0.5),
            max_tool_calls: Some(2),
            max_wall_time_ms: Some(1000),
        };
        let mut used = Consumed::default();
        assert_eq!(b.check(&used), Ok(()));
        used.wall_time_ms = 1000;
        assert_eq!(b.check(&used), Err(BudgetLimit::WallTime));
        used.tool_calls = 2;
        assert_eq!(b.check(&used), Err(BudgetLimit::ToolCalls));
        used.cost_usd = 0.5;
        assert_eq!(b.check(&used), Err(BudgetLimit::Cost));
        used.tokens = 100;
        assert_eq!(b.check(&used), Err(BudgetLimit::Tokens));
        used.steps = 3;
        assert_eq!(b.check(&used), Err(BudgetLimit::Steps));
        assert_eq!(Budget::default().check(&used), Ok(()));
    }

    #[test]
    fn terminal_reasons_map_to_turn_states() {
        for r in TerminalReason::ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
            match r.turn_status() {
                None => assert_eq!(r, TerminalReason::RequiresAction),
                Some(s) => assert!(crate::StateMachine::is_terminal(s)),
            }
        }
    }
}
