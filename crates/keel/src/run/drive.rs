//! Driving a prepared run: the subscription pump, running or following the turn, and the result line.

use super::*;

/// Prints subscription items until told the version to stop after, then through it. Counts
/// what it printed itself: the subscription reads ahead, so its `next_seq` may be past events
/// it has not handed out yet.
pub(super) async fn pump(
    mut sub: keel_runtime::Subscription,
    printer: SharedPrinter,
    mut stop: watch::Receiver<Option<u64>>,
) {
    let mut printed = sub.next_seq().saturating_sub(1);
    loop {
        if stop.borrow().is_some_and(|v| printed >= v) {
            return;
        }
        tokio::select! {
            item = sub.next() => match item {
                Ok(item) => {
                    if let keel_runtime::SubscriptionItem::Event { event } = &item {
                        printed = event.seq;
                    }
                    printer.lock().unwrap_or_else(PoisonError::into_inner).item(&item);
                }
                Err(e) => {
                    tracing_note(&printer, &format!("event subscription: {e}"));
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            changed = stop.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

pub(super) fn tracing_note(printer: &SharedPrinter, text: &str) {
    printer
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .note(text);
}

/// Whether another live process holds the session's lease (it runs the session now).
pub(super) async fn run_elsewhere(p: &Prepared) -> bool {
    let Ok(record) = p.runtime.store().get_session(p.tenant, p.session).await else {
        return false;
    };
    record.lease.is_some_and(|l| {
        l.expires_at > chrono::Utc::now()
            && l.owner != p.runtime.owner()
            && !keel_runtime::lease::owner_is_dead_local_process(&l.owner)
    })
}

/// Runs the session; when another live process already runs it (a prompt given to `resume` was
/// handed to it as a durable input), follows it instead until the turn ends or waits on a
/// human, and takes over if that process goes away with work left. Following is said once on
/// `printer` (a note: text mode only).
pub(super) async fn run_or_follow(
    p: &Prepared,
    printer: &SharedPrinter,
) -> keel_runtime::Result<RunOutcome> {
    let mut said = false;
    loop {
        if !run_elsewhere(p).await {
            return p.runtime.run(p.tenant, p.session).await;
        }
        let view = p.runtime.view(p.tenant, p.session).await?;
        let state = &view.state;
        let done = match p.turn {
            Some(t) => state.turns.get(&t).is_some_and(|t| {
                matches!(
                    t.status,
                    TurnStatus::Completed | TurnStatus::Aborted | TurnStatus::Failed
                )
            }),
            None => state.active_turn.is_none() && state.queue.is_empty(),
        };
        // `requires_action` counts only while something still waits on a human: a session
        // whose approval was just decided says so until its runner journals `running`, and a
        // follower that stopped there would report a wait that no longer exists.
        let pending = if state.status == SessionStatus::RequiresAction {
            pending_approvals(p, state).await
        } else {
            Vec::new()
        };
        let undecided = state
            .effects
            .values()
            .any(|e| e.status == keel_core::EffectStatus::OutcomeUnknown && e.decision.is_none());
        let waiting =
            state.status == SessionStatus::RequiresAction && (!pending.is_empty() || undecided);
        if done || waiting {
            return Ok(RunOutcome {
                session_id: p.session,
                status: if done && !waiting {
                    SessionStatus::Idle
                } else {
                    state.status
                },
                version: state.version,
                turns: view.turns.clone(),
                pending,
                drained: false,
                turn_budget: None,
            });
        }
        if !std::mem::replace(&mut said, true) {
            tracing_note(
                printer,
                &format!(
                    "↻ session {} is running in another keel process: following it here until its turn ends (Ctrl-C cancels the turn)",
                    p.session
                ),
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The approvals a session waits on, as the runtime reports them.
pub(super) async fn pending_approvals(
    p: &Prepared,
    state: &keel_core::SessionState,
) -> Vec<PendingAction> {
    let Ok(rows) = crate::sessions::waiting_approvals(p.runtime.store(), p.session, state).await
    else {
        return Vec::new();
    };
    rows.into_iter()
        .map(|a| PendingAction::Approval {
            approval_id: a.approval_id,
            tool_call_id: a.tool_call_id,
            tool_name: a.tool_name,
            arguments: a.arguments,
            args_hash: a.args_hash,
            expires_at: a.expires_at,
            subagent: None,
        })
        .collect()
}

/// How one drive of the session ended.
#[derive(Debug)]
pub enum Driven {
    /// `Runtime::run` returned.
    Finished(Box<RunOutcome>),
    /// The runtime failed (lease lost, store error, …).
    Error(anyhow::Error),
    /// A second Ctrl-C: the user wants out now.
    Interrupted,
}

/// Runs the session until it is idle or waits on a human, printing its events; the first Ctrl-C
/// cancels the running turn, a second returns [`Driven::Interrupted`] at once.
pub async fn drive(p: &Prepared, printer: &SharedPrinter) -> (Driven, u64) {
    let sub = match p.runtime.subscribe(p.tenant, p.session, p.from_seq).await {
        Ok(s) => s,
        Err(e) => return (Driven::Error(e.into()), p.from_seq),
    };
    let (stop_tx, stop_rx) = watch::channel(None);
    let pump_task = tokio::spawn(pump(sub, printer.clone(), stop_rx));
    let run = run_or_follow(p, printer);
    tokio::pin!(run);
    // SIGTERM (a supervisor stopping keel) counts like Ctrl-C: the turn is cancelled and the run
    // still ends with its result.
    let mut interrupts = 0u32;
    let driven = loop {
        tokio::select! {
            r = &mut run => break match r {
                Ok(o) => Driven::Finished(Box::new(o)),
                Err(e) => Driven::Error(e.into()),
            },
            () = crate::signals::next() => {
                interrupts += 1;
                if interrupts >= 2 {
                    break Driven::Interrupted;
                }
                tracing_note(printer, "⊘ cancelling the turn — press Ctrl-C again to exit");
                let rt = p.runtime.clone();
                let (tenant, session) = (p.tenant, p.session);
                tokio::spawn(async move {
                    let _ = rt.cancel_turn(tenant, session).await;
                });
            }
        }
    };
    let version = match &driven {
        Driven::Finished(o) => o.version,
        _ => match p.runtime.view(p.tenant, p.session).await {
            Ok(v) => v.state.version,
            Err(_) => 0,
        },
    };
    if matches!(driven, Driven::Interrupted) {
        pump_task.abort();
    } else {
        let _ = stop_tx.send(Some(version));
        // The pump reads the rest from the store; bounded only against a store that broke.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(120), pump_task).await;
    }
    let next = version + 1;
    (driven, next)
}

/// The result line for how a drive ended.
pub async fn result_of(p: &Prepared, driven: &Driven) -> ResultLine {
    let elapsed = u64::try_from(p.started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut r = ResultLine::startup_failure(String::new(), elapsed);
    r.session_id = Some(p.session);
    r.error = None;
    // A run that finished on its own answers everything the line says (its turn, the budget it
    // ran under); otherwise the session's journal is read (once).
    let answered = match driven {
        Driven::Finished(o) => {
            p.continues
                && o.status != SessionStatus::RequiresAction
                && o.turn_budget.is_some()
                && finished_turn(p, o).is_some()
        }
        _ => false,
    };
    let view = if answered {
        None
    } else {
        p.runtime.view(p.tenant, p.session).await.ok()
    };
    let turn_stats = |turn: Option<TurnId>, r: &mut ResultLine| {
        if let Some(t) = turn.and_then(|t| view.as_ref().and_then(|v| v.state.turns.get(&t))) {
            r.usage = t.usage;
            r.cost_usd = t.cost_usd;
            r.usage_by_model = t.usage_by_model.clone();
            r.num_steps = u32::try_from(t.steps.len()).unwrap_or(u32::MAX);
        }
    };
    if !p.continues
        && let Driven::Finished(o) = driven
        && o.status != SessionStatus::RequiresAction
    {
        // Nothing ran: say so, with the last turn's reason (the same exit code as when it
        // ended) and this invocation's own zero usage and duration.
        r.continued = Some(false);
        r.terminal_reason = view
            .as_ref()
            .and_then(|v| v.turns.last())
            .map_or(TerminalReason::Completed, |t| t.terminal_reason);
        return r;
    }
    match driven {
        Driven::Interrupted => {
            r.terminal_reason = TerminalReason::Aborted;
            turn_stats(
                view.as_ref().and_then(|v| v.state.active_turn).or(p.turn),
                &mut r,
            );
        }
        Driven::Error(e) => {
            r.terminal_reason = TerminalReason::Failed;
            let mut error = crate::report::describe(e);
            if matches!(
                e.downcast_ref::<keel_runtime::RuntimeError>(),
                Some(keel_runtime::RuntimeError::LeaseLost { .. })
            ) {
                // The turn did not fail: this process stopped running it (its tools killed),
                // and what it committed stands.
                error.push_str(&format!(
                    ". The turn was not ended: `keel resume {}` continues it",
                    p.session
                ));
            }
            r.error = Some(error);
            turn_stats(p.turn, &mut r);
        }
        Driven::Finished(o) if o.status == SessionStatus::RequiresAction => {
            r.terminal_reason = TerminalReason::RequiresAction;
            r.pending = o.pending.clone();
            turn_stats(view.as_ref().and_then(|v| v.state.active_turn), &mut r);
        }
        Driven::Finished(o) => {
            let finished = finished_turn(p, o)
                .cloned()
                .or_else(|| view.as_ref().and_then(|v| v.turns.last().cloned()));
            match finished {
                Some(t) => {
                    r.terminal_reason = t.terminal_reason;
                    r.limit = t.limit;
                    r.usage = t.usage;
                    r.cost_usd = t.cost_usd;
                    r.usage_by_model = t.usage_by_model;
                    r.num_steps = t.num_steps;
                    r.duration_ms = t.duration_ms;
                    r.error = t.error.as_deref().map(crate::report::explain_model_failure);
                    r.final_text = t.final_text;
                }
                None => {
                    r.terminal_reason = TerminalReason::Completed;
                }
            }
        }
    }
    r.over_limits = if let Driven::Finished(o) = driven
        && view.is_none()
        && let Some(budget) = o.turn_budget
    {
        limits_over(budget, None, &r)
    } else {
        over_limits(p, &r, view.as_ref().map(|v| &v.state)).await
    };
    r
}

/// The turn of this invocation among those `o`'s run finished (the one it submitted, else the
/// last one).
fn finished_turn<'a>(p: &Prepared, o: &'a RunOutcome) -> Option<&'a keel_runtime::TurnOutcome> {
    p.turn
        .and_then(|t| o.turns.iter().find(|x| x.turn_id == t))
        .or(o.turns.last())
}

/// The turn limits (`tokens`, `cost`) the result's totals ended above: the session's effective
/// per-turn budget (its settings over its release's). Limits are checked before each step, so
/// the step that crosses one finishes. `state` is the session's folded journal when the caller
/// has read it (its pinned settings and release are taken from there: the journal is not read
/// a second time); without it, [`pinned`] reads them.
pub(super) async fn over_limits(
    p: &Prepared,
    r: &ResultLine,
    state: Option<&keel_core::SessionState>,
) -> Vec<keel_core::BudgetLimit> {
    let from_state = match state {
        Some(s) => match (
            serde_json::from_value::<SessionConfig>(s.config.clone()),
            s.release_id.as_ref(),
        ) {
            (Ok(config), Some(release)) => p
                .runtime
                .store()
                .get_release(p.tenant, release)
                .await
                .ok()
                .map(|release| (config.turn_budget, release.definition.budget)),
            _ => None,
        },
        None => None,
    };
    let (turn, release) = match from_state {
        Some(budgets) => budgets,
        None => {
            let Ok(pinned) = pinned(p.runtime.store(), p.session).await else {
                return Vec::new();
            };
            (pinned.config.turn_budget, pinned.release.definition.budget)
        }
    };
    limits_over(turn, Some(release), r)
}

/// The limits (`tokens`, `cost`) of a per-turn budget — the session's `turn`, falling back to
/// the `release`'s — that `r`'s totals ended above.
pub fn limits_over(
    turn: keel_core::Budget,
    release: Option<keel_core::Budget>,
    r: &ResultLine,
) -> Vec<keel_core::BudgetLimit> {
    let release = release.unwrap_or_default();
    let mut over = Vec::new();
    if turn
        .max_tokens
        .or(release.max_tokens)
        .is_some_and(|m| r.usage.total_tokens() > m)
    {
        over.push(keel_core::BudgetLimit::Tokens);
    }
    if turn
        .max_cost_usd
        .or(release.max_cost_usd)
        .is_some_and(|m| r.cost_usd > m)
    {
        over.push(keel_core::BudgetLimit::Cost);
    }
    over
}
