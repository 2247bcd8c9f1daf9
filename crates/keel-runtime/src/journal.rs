//! The journal as the runtime sees it: one append function ([`Journal::append`], compare-and-set
//! on the version plus the lease's fencing epoch), the session fold ([`SessionState`]) and the
//! runtime's own projection of it ([`Projection`]: the model-visible transcript, the script
//! position, compaction boundary, turn results).
//!
//! Every journal write of the runtime goes through [`Journal::append`], which names its *site*
//! (`step.started`, `tool.finished`, …). That makes the append sites enumerable for fault
//! injection: with `KEEL_CRASH_AT=<n>` the process kills itself (`kill -9`) right after its n-th
//! append; with `KEEL_CRASH_LOG=<file>` it logs `<n> <site>` per append.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::Utc;
use keel_core::{
    ApprovalDecision, BudgetLimit, Correlation, Event, EventBody, LeaseEpoch, SessionId,
    SessionState, TenantId, TerminalReason, ToolCallId, TurnId, Usage,
};
use keel_model::{Message, ReasoningItem, ToolCall};
use keel_store::{AppendExtras, Store, StoreError};
use serde_json::Value;

use crate::error::{Result, RuntimeError};
use crate::redact::Redactor;
use crate::tokens::estimate_message_tokens;

/// How a finished turn ended, as journaled in `turn.finished`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TurnOutcome {
    /// The turn.
    pub turn_id: TurnId,
    /// Why it ended.
    pub terminal_reason: TerminalReason,
    /// The exhausted limit, for `budget_exhausted`.
    pub limit: Option<BudgetLimit>,
    /// Tokens used by the turn.
    pub usage: Usage,
    /// Cost of the turn, USD.
    pub cost_usd: f64,
    /// Steps sampled.
    pub num_steps: u32,
    /// Wall-clock duration, ms.
    pub duration_ms: u64,
    /// What went wrong, for `failed`.
    pub error: Option<String>,
    /// The model's last visible text in the turn (the answer, for `completed`).
    pub final_text: String,
}

/// The runtime's projection of the journal, folded alongside [`SessionState`].
#[derive(Debug, Clone, Default)]
pub struct Projection {
    /// The model-visible transcript, oldest first: one `user` item per started turn, one
    /// `assistant` item per completed step (text and the calls of its final attempt), one `tool`
    /// item per call result, in the order the model proposed the calls.
    pub items: Vec<Message>,
    /// Estimated tokens of each item, computed once when the item is added.
    pub item_tokens: Vec<u64>,
    /// The provider's count of the last completed step's prompt, when it reported one: the
    /// exact context size at that step. Context estimates count it plus the items added since.
    pub anchor: Option<TokenAnchor>,
    /// Model responses the session consumed (the next request's `response_index`).
    pub position: u64,
    /// The last compaction summary.
    pub summary: Option<String>,
    /// First item after the last compaction boundary.
    pub first_kept: u64,
    /// Attempt in which each call was proposed.
    pub call_attempt: HashMap<ToolCallId, u32>,
    /// Calls of the last assistant item still waiting for their tool item, in proposal order.
    pending: Vec<ToolCallId>,
    /// Sum of finished turns' durations, ms.
    pub finished_turns_ms: u64,
    /// `context_overflow` attempt failures per turn.
    pub overflows: HashMap<TurnId, u32>,
    /// Last assistant text per turn.
    pub last_text: HashMap<TurnId, String>,
    /// Finished turns.
    pub finished: HashMap<TurnId, TurnOutcome>,
    /// Tokens and cost (USD) of the session's completed steps per UTC day (`YYYY-MM-DD` of the
    /// `step.completed` event), for the tenant's daily budget.
    pub usage_by_day: HashMap<String, (u64, f64)>,
    /// The UTC day of the last `step.completed`.
    pub last_step_day: Option<String>,
    /// (tool, arguments) of calls allowed for the rest of the session.
    pub allowed_for_session: Vec<(String, Value)>,
}

/// A provider-reported prompt size and the transcript it covered (see [`Projection::anchor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenAnchor {
    /// Prompt tokens the provider counted for the step (cache reads and writes included).
    pub input_tokens: u64,
    /// Transcript items that existed when the step was sampled (the request showed
    /// `first_kept..items`).
    pub items: usize,
    /// The compaction boundary at that step.
    pub first_kept: u64,
}

impl Projection {
    fn push(&mut self, m: Message) {
        self.item_tokens.push(estimate_message_tokens(&m));
        self.items.push(m);
    }

    fn flush_results(&mut self, state: &SessionState) {
        while let Some(id) = self.pending.first() {
            let Some((content, is_error)) = state.tool_calls.get(id).and_then(|c| c.result.clone())
            else {
                break;
            };
            let id = self.pending.remove(0);
            self.push(Message::Tool {
                call_id: id.to_string(),
                content,
                is_error,
            });
        }
    }

    /// Folds `ev`, already applied to `state`.
    pub fn apply(&mut self, state: &SessionState, ev: &Event) {
        let c = &ev.correlation;
        match &ev.body {
            EventBody::TurnStarted {} => {
                if let Some(t) = c.turn_id.and_then(|t| state.turns.get(&t)) {
                    self.push(Message::User {
                        content: t.input.clone(),
                    });
                }
            }
            EventBody::ToolCallProposed { .. } => {
                if let Some(id) = &c.tool_call_id {
                    self.call_attempt.insert(id.clone(), c.attempt.unwrap_or(1));
                }
            }
            EventBody::StepCompleted {
                text,
                reasoning,
                responses_consumed,
                usage,
                cost_usd,
                ..
            } => {
                self.position += responses_consumed;
                let day = ev.ts.format("%Y-%m-%d").to_string();
                let d = self.usage_by_day.entry(day.clone()).or_default();
                d.0 = d.0.saturating_add(usage.total_tokens());
                d.1 += cost_usd;
                self.last_step_day = Some(day);
                let Some(step) = c.step_id.and_then(|s| state.steps.get(&s)) else {
                    return;
                };
                // The step's request showed the items up to here (results are added after the
                // assistant item), from `first_kept` on.
                self.anchor = (usage.input_tokens > 0).then_some(TokenAnchor {
                    input_tokens: usage.input_tokens,
                    items: self.items.len(),
                    first_kept: self.first_kept,
                });
                // Every call of the step (a call of an abandoned attempt has its own result).
                let calls: Vec<ToolCallId> = step.tool_calls.clone();
                let tool_calls = calls
                    .iter()
                    .filter_map(|id| state.tool_calls.get(id))
                    .map(|tc| {
                        ToolCall::new(tc.id.to_string(), tc.name.clone(), tc.arguments.clone())
                    })
                    .collect();
                let reasoning = reasoning
                    .iter()
                    .filter_map(|v| serde_json::from_value::<ReasoningItem>(v.clone()).ok())
                    .collect();
                if let Some(t) = c.turn_id {
                    self.last_text.insert(t, text.clone());
                }
                self.push(Message::Assistant {
                    text: text.clone(),
                    tool_calls,
                    reasoning,
                });
                self.pending = calls;
                self.flush_results(state);
            }
            EventBody::StepAttemptFailed {
                responses_consumed,
                error_kind,
                ..
            } => {
                self.position += responses_consumed;
                if error_kind == "context_overflow"
                    && let Some(t) = c.turn_id
                {
                    *self.overflows.entry(t).or_default() += 1;
                }
            }
            EventBody::StepFailed {
                responses_consumed, ..
            } => {
                self.position += responses_consumed;
            }
            EventBody::ToolCallFinished { .. } => self.flush_results(state),
            EventBody::ContextCompacted {
                summary,
                first_kept_item,
                ..
            } => {
                self.summary = Some(summary.clone());
                self.first_kept = *first_kept_item;
                self.anchor = None;
            }
            EventBody::ApprovalDecided {
                decision: ApprovalDecision::AllowForSession,
            } => {
                if let Some(call) = c
                    .approval_id
                    .and_then(|a| state.approvals.get(&a))
                    .and_then(|a| state.tool_calls.get(&a.tool_call_id))
                {
                    self.allowed_for_session
                        .push((call.name.clone(), call.arguments.clone()));
                }
            }
            EventBody::TurnFinished {
                terminal_reason,
                limit,
                usage,
                cost_usd,
                num_steps,
                duration_ms,
                error,
            } => {
                self.finished_turns_ms += duration_ms;
                if let Some(t) = c.turn_id {
                    self.finished.insert(
                        t,
                        TurnOutcome {
                            turn_id: t,
                            terminal_reason: *terminal_reason,
                            limit: *limit,
                            usage: *usage,
                            cost_usd: *cost_usd,
                            num_steps: *num_steps,
                            duration_ms: *duration_ms,
                            error: error.clone(),
                            final_text: self.last_text.get(&t).cloned().unwrap_or_default(),
                        },
                    );
                }
            }
            _ => {}
        }
    }
}

static APPENDS: AtomicU64 = AtomicU64::new(0);

struct CrashConfig {
    at: Option<u64>,
    log: Option<String>,
}

fn crash_config() -> &'static CrashConfig {
    static CONFIG: OnceLock<CrashConfig> = OnceLock::new();
    CONFIG.get_or_init(|| CrashConfig {
        at: std::env::var("KEEL_CRASH_AT")
            .ok()
            .and_then(|v| v.parse().ok()),
        log: std::env::var("KEEL_CRASH_LOG")
            .ok()
            .filter(|v| !v.is_empty()),
    })
}

/// Fault injection after each committed append (see the module docs).
fn after_append(site: &'static str) {
    let cfg = crash_config();
    if cfg.at.is_none() && cfg.log.is_none() {
        return;
    }
    let n = APPENDS.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(path) = &cfg.log
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let _ = writeln!(f, "{n} {site}");
        let _ = f.sync_all();
    }
    if cfg.at == Some(n) {
        // A real kill -9 of this process: no destructors, no flushing, no lease release.
        let pid = std::process::id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid])
            .status();
        std::process::abort();
    }
}

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
        self.state = state;
        self.proj = proj;
        self.durable = self.state.version;
        self.staged.clear();
        self.extras = AppendExtras::default();
        self.staged_since = None;
        Ok(())
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
    /// and the projection, without writing. Effect and usage rows for the store's side tables
    /// are derived here and commit with the events. Returns the version after them.
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
                self.staged = earlier;
                self.extras = extras;
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
                after_append(site);
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
