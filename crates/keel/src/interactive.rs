//! The interactive terminal: reading prompts and follow-ups, and asking the human about
//! approvals and effects whose outcome is unknown.
//!
//! Lines are read by one thread for the whole process and handed over a channel, so that
//! waiting for a line can be interrupted by Ctrl-C without losing the next one.

use std::io::{BufRead, Write};

use keel_core::{ApprovalDecision, EffectDecision};
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
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "{prompt}");
        let _ = out.flush();
        drop(out);
        tokio::select! {
            line = self.rx.recv() => line,
            _ = tokio::signal::ctrl_c() => {
                println!();
                None
            }
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
                    "? {tool_name} {} needs approval",
                    one_line(&arguments.to_string(), 160)
                );
                let decision = loop {
                    let Some(answer) = lines
                        .ask("  [y] allow once · [a] allow for this session · [n] deny › ")
                        .await
                    else {
                        return Ok(false);
                    };
                    match answer.trim().to_ascii_lowercase().as_str() {
                        "y" | "yes" => break ApprovalDecision::AllowOnce,
                        "a" | "always" => break ApprovalDecision::AllowForSession,
                        "n" | "no" => {
                            let Some(reason) = lines.ask("  reason (shown to the model) › ").await
                            else {
                                return Ok(false);
                            };
                            let reason = reason.trim();
                            break ApprovalDecision::Deny {
                                reason: if reason.is_empty() {
                                    "denied by the user".into()
                                } else {
                                    reason.to_owned()
                                },
                            };
                        }
                        _ => println!("  answer y, a or n"),
                    }
                };
                p.runtime
                    .decide_approval(p.tenant, *approval_id, decision, args_hash)
                    .await?;
            }
            PendingAction::Effect {
                operation_key,
                tool_name,
                arguments,
                ..
            } => {
                println!(
                    "? the outcome of {tool_name} {} is unknown (the run stopped while it was running)",
                    one_line(&arguments.to_string(), 160)
                );
                let decision = loop {
                    let Some(answer) = lines
                        .ask("  did it happen? [c] committed · [f] failed · [r] retry it › ")
                        .await
                    else {
                        return Ok(false);
                    };
                    match answer.trim().to_ascii_lowercase().as_str() {
                        "c" | "committed" => {
                            break EffectDecision::Committed {
                                outcome: serde_json::Value::Null,
                            };
                        }
                        "f" | "failed" => {
                            break EffectDecision::Failed {
                                error: "the user says it did not happen".into(),
                            };
                        }
                        "r" | "retry" => break EffectDecision::Retry,
                        _ => println!("  answer c, f or r"),
                    }
                };
                p.runtime
                    .resolve_effect(p.tenant, p.session, operation_key, decision)
                    .await?;
            }
        }
    }
    Ok(true)
}
