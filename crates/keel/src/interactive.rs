//! The interactive terminal: reading prompts and follow-ups, and asking the human about
//! approvals and effects whose outcome is unknown.
//!
//! Lines are read by one thread for the whole process and handed over a channel, so that
//! waiting for a line can be interrupted by Ctrl-C without losing the next one.

use std::io::{BufRead, Write};

use keel_core::{ApprovalDecision, ApprovalId, ApprovalStatus, EffectDecision, OperationKey};
use keel_runtime::PendingAction;
use tokio::sync::mpsc;

use crate::output::one_line;
use crate::run::Prepared;

/// Lines typed on standard input.
#[derive(Debug)]
pub struct Lines {
    rx: mpsc::Receiver<String>,
}

impl Lines {
    /// Starts the reader thread.
    pub fn spawn() -> Self {
        let (tx, rx) = mpsc::channel(16);
        std::thread::spawn(move || {
            let stdin = std::io::stdin();
            for line in stdin.lock().lines() {
                let Ok(line) = line else { break };
                if tx.blocking_send(line).is_err() {
                    break;
                }
            }
        });
        Self { rx }
    }

    /// Shows `prompt` and waits for a line; `None` on end of input or Ctrl-C.
    pub async fn ask(&mut self, prompt: &str) -> Option<String> {
        match self.ask_until(prompt, std::future::pending()).await {
            Answer::Line(l) => Some(l),
            Answer::Quit | Answer::Elsewhere => None,
        }
    }

    /// As [`Lines::ask`], but gives up when `elsewhere` resolves (the question was answered
    /// from another terminal).
    pub async fn ask_until(
        &mut self,
        prompt: &str,
        elsewhere: impl std::future::Future<Output = ()>,
    ) -> Answer {
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "{prompt}");
        let _ = out.flush();
        drop(out);
        tokio::select! {
            line = self.rx.recv() => line.map_or(Answer::Quit, Answer::Line),
            () = crate::signals::next() => {
                println!();
                Answer::Quit
            }
            () = elsewhere => {
                println!("(decided from another terminal)");
                Answer::Elsewhere
            }
        }
    }
}

/// What [`Lines::ask_until`] got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A typed line.
    Line(String),
    /// End of input or Ctrl-C.
    Quit,
    /// Answered from another terminal.
    Elsewhere,
}

const POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// Resolves once approval `id` is no longer pending (decided by `keel approve|deny`).
async fn approval_decided(p: &Prepared, id: ApprovalId) {
    loop {
        tokio::time::sleep(POLL).await;
        match p.runtime.store().get_approval(p.tenant, id).await {
            Ok(a) if a.status != ApprovalStatus::Pending => return,
            _ => {}
        }
    }
}

/// Resolves once effect `key` has a decision (by `keel resolve`).
async fn effect_decided(p: &Prepared, key: &OperationKey) {
    loop {
        tokio::time::sleep(POLL).await;
        if let Ok(view) = p.runtime.view(p.tenant, p.session).await
            && view
                .state
                .effects
                .get(key)
                .is_some_and(|e| e.decision.is_some())
        {
            return;
        }
    }
}

/// Asks about every pending action and records the answers; returns whether all were answered
/// (false when the human quit).
///
/// # Errors
/// A decision the runtime refused (expired approval, …).
pub async fn decide_pending(
    p: &Prepared,
    pending: &[PendingAction],
    lines: &mut Lines,
) -> anyhow::Result<bool> {
    for action in pending {
        match action {
            PendingAction::Approval {
                approval_id,
                tool_name,
                arguments,
                args_hash,
                ..
            } => {
                println!(
                    "? {tool_name} {} needs approval (or: keel approve|deny {approval_id})",
                    one_line(&arguments.to_string(), 160)
                );
                let decision = loop {
                    let answer = match lines
                        .ask_until(
                            "  [y] allow once · [a] allow for this session · [n] deny › ",
                            approval_decided(p, *approval_id),
                        )
                        .await
                    {
                        Answer::Line(l) => l,
                        Answer::Elsewhere => break None,
                        Answer::Quit => return Ok(false),
                    };
                    match answer.trim().to_ascii_lowercase().as_str() {
                        "y" | "yes" => break Some(ApprovalDecision::AllowOnce),
                        "a" | "always" => break Some(ApprovalDecision::AllowForSession),
                        "n" | "no" => {
                            let Some(reason) = lines.ask("  reason (shown to the model) › ").await
                            else {
                                return Ok(false);
                            };
                            let reason = reason.trim();
                            break Some(ApprovalDecision::Deny {
                                reason: if reason.is_empty() {
                                    "denied by the user".into()
                                } else {
                                    reason.to_owned()
                                },
                            });
                        }
                        _ => println!("  answer y, a or n"),
                    }
                };
                if let Some(decision) = decision {
                    p.runtime
                        .decide_approval(p.tenant, *approval_id, decision, args_hash)
                        .await?;
                }
            }
            PendingAction::Effect {
                operation_key,
                tool_name,
                arguments,
                ..
            } => {
                println!(
                    "? the outcome of {tool_name} {} is unknown (the run stopped while it was running; or: keel resolve {operation_key})",
                    one_line(&arguments.to_string(), 160)
                );
                let decision = loop {
                    let answer = match lines
                        .ask_until(
                            "  did it happen? [c] committed · [f] failed · [r] retry it › ",
                            effect_decided(p, operation_key),
                        )
                        .await
                    {
                        Answer::Line(l) => l,
                        Answer::Elsewhere => break None,
                        Answer::Quit => return Ok(false),
                    };
                    match answer.trim().to_ascii_lowercase().as_str() {
                        "c" | "committed" => {
                            break Some(EffectDecision::Committed {
                                outcome: serde_json::Value::Null,
                            });
                        }
                        "f" | "failed" => {
                            break Some(EffectDecision::Failed {
                                error: "the user says it did not happen".into(),
                            });
                        }
                        "r" | "retry" => break Some(EffectDecision::Retry),
                        _ => println!("  answer c, f or r"),
                    }
                };
                if let Some(decision) = decision {
                    p.runtime
                        .resolve_effect(p.tenant, p.session, operation_key, decision)
                        .await?;
                }
            }
        }
    }
    Ok(true)
}
