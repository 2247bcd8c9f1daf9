//! The fold of step events: a part of [`SessionState::apply`], which has checked the
//! event's order and session and sets the version once this accepts it.

use super::*;

impl SessionState {
    /// Folds one of the step events (`StepStarted`, `StepStreaming`, `StepAttemptFailed`,
    /// `StepCompleted`, `StepFailed`); any other event is a routing bug in `apply`.
    pub(super) fn fold_step(&mut self, ev: &Event, cx: Cx) -> Result<(), ApplyError> {
        let c = &ev.correlation;
        match &ev.body {
            EventBody::StepStarted { model } => {
                let turn_id = c.turn_id.ok_or_else(|| cx.missing("turn_id"))?;
                let step_id = c.step_id.ok_or_else(|| cx.missing("step_id"))?;
                let attempt = c.attempt.ok_or_else(|| cx.missing("attempt"))?;
                let turn = self
                    .turns
                    .get(&turn_id)
                    .ok_or_else(|| cx.unknown("turn", turn_id.to_string()))?;
                if turn.status != TurnStatus::Sampling {
                    return Err(cx.rule("a step starts only while its turn is sampling"));
                }
                match self.steps.get(&step_id) {
                    None => {
                        if attempt != 1 {
                            return Err(cx.rule("a new step starts at attempt 1"));
                        }
                        self.steps.insert(
                            step_id,
                            StepState {
                                id: step_id,
                                turn_id,
                                status: StepStatus::INITIAL,
                                attempt,
                                model: model.clone(),
                                stop_reason: None,
                                tool_calls: Vec::new(),
                                abandoned: Vec::new(),
                                overflowed: false,
                                failure: None,
                            },
                        );
                        if let Some(turn) = self.turns.get_mut(&turn_id) {
                            turn.steps.push(step_id);
                        }
                    }
                    Some(step) => {
                        if step.turn_id != turn_id {
                            return Err(cx.rule("a step belongs to one turn"));
                        }
                        if attempt <= step.attempt {
                            return Err(cx.rule("a retried step's attempt number must grow"));
                        }
                        // A retry: a streaming attempt goes back to `started`; one that failed before
                        // its first token is already there.
                        let to = if step.status == StepStatus::Started {
                            StepStatus::Started
                        } else {
                            check_transition(step.status, StepStatus::Started)
                                .map_err(|e| cx.trans(e))?
                        };
                        if let Some(step) = self.steps.get_mut(&step_id) {
                            step.status = to;
                            step.attempt = attempt;
                            step.model = model.clone();
                        }
                    }
                }
            }
            EventBody::StepStreaming {} => {
                self.step_transition(ev, StepStatus::Streaming)?;
            }
            EventBody::StepAttemptFailed {
                error_kind,
                model,
                usage,
                cost_usd,
                usage_estimated,
                ..
            } => {
                let step_id = c.step_id.ok_or_else(|| cx.missing("step_id"))?;
                let step = self
                    .steps
                    .get(&step_id)
                    .ok_or_else(|| cx.unknown("step", step_id.to_string()))?;
                if step.status.is_terminal() {
                    return Err(cx.rule("a finished step has no further attempts"));
                }
                // What the failed attempt used counts like a completed step's usage.
                let turn_id = step.turn_id;
                self.count_usage(turn_id, model, usage, *cost_usd, *usage_estimated, false);
                if error_kind == "context_overflow" {
                    if let Some(step) = self.steps.get_mut(&step_id) {
                        step.overflowed = true;
                    }
                    if let Some(turn) = self.turns.get_mut(&turn_id) {
                        turn.overflows += 1;
                    }
                }
            }
            EventBody::StepCompleted {
                model,
                stop_reason,
                usage,
                cost_usd,
                usage_estimated,
                abandoned_calls,
                ..
            } => {
                let (step_id, turn_id) = self.step_transition(ev, StepStatus::Completed)?;
                if let Some(step) = self.steps.get_mut(&step_id) {
                    step.stop_reason = Some(stop_reason.clone());
                    step.abandoned = abandoned_calls
                        .iter()
                        .filter(|c| step.tool_calls.contains(c))
                        .cloned()
                        .collect();
                }
                self.count_usage(turn_id, model, usage, *cost_usd, *usage_estimated, true);
                self.num_steps = self.num_steps.saturating_add(1);
            }
            EventBody::StepFailed {
                error_kind,
                message,
                usage,
                cost_usd,
                usage_estimated,
                ..
            } => {
                let (step_id, turn_id) = self.step_transition(ev, StepStatus::Failed)?;
                let mut model = String::new();
                if let Some(step) = self.steps.get_mut(&step_id) {
                    step.failure = Some((error_kind.clone(), message.clone()));
                    model.clone_from(&step.model);
                }
                if !usage.is_zero() || *cost_usd != 0.0 {
                    self.count_usage(turn_id, &model, usage, *cost_usd, *usage_estimated, false);
                }
            }
            _ => unreachable!("apply routes only step events to fold_step"),
        }
        Ok(())
    }
}
