//! The interactive terminal: reading prompts and follow-ups, and asking the human about
//! approvals and effects whose outcome is unknown.
//!
//! Lines are read by one thread for the whole process and handed over a channel, so that
//! waiting for a line can be interrupted by Ctrl-C without losing the next one.

use std::io::{BufRead, Write};

use keel_core::{ApprovalDecision, ApprovalId, ApprovalStatus, EffectDecision, OperationKey};
use keel_runtime::PendingAction;
use tokio::sync::mpsc;

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

    /// Asks for the next prompt at `› `: the line typed, or `None` when the user leaves — an
    /// empty line, `exit`, `quit` or `/exit`, end of input or Ctrl-C (the README's promise).
    pub async fn ask_prompt(&mut self) -> Option<String> {
        self.ask("› ")
            .await
            .filter(|l| !l.trim().is_empty() && !matches!(l.trim(), "exit" | "quit" | "/exit"))
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

/// How often a question polls whether it was decided elsewhere.
pub const POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// Where a run's pending actions are decided: the local runtime, or a server
/// ([`crate::remote`]). The questions and answers are the same either way.
pub trait Decider {
    /// Returns once approval `id` is no longer pending (decided from another terminal).
    fn approval_decided(&self, id: ApprovalId) -> impl std::future::Future<Output = ()>;
    /// Returns once effect `key` has a decision.
    fn effect_decided(&self, key: &OperationKey) -> impl std::future::Future<Output = ()>;
    /// Decides an approval, bound to `args_hash`.
    fn decide_approval(
        &self,
        id: ApprovalId,
        decision: ApprovalDecision,
        args_hash: &str,
    ) -> impl std::future::Future<Output = anyhow::Result<()>>;
    /// Says what an `outcome_unknown` effect did.
    fn resolve_effect(
        &self,
        key: &OperationKey,
        decision: EffectDecision,
    ) -> impl std::future::Future<Output = anyhow::Result<()>>;
    /// The session's workspace, for what an allow-for-session grants.
    fn workspace(&self) -> impl std::future::Future<Output = Option<std::path::PathBuf>>;
}

/// The session an operation key belongs to (`<session>/<step>/<call>`): a sub-agent's effect
/// is decided on its child session; `or` when the key names none.
fn key_session(key: &OperationKey, or: keel_core::SessionId) -> keel_core::SessionId {
    key.as_str()
        .split('/')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(or)
}

impl Decider for Prepared {
    async fn approval_decided(&self, id: ApprovalId) {
        loop {
            tokio::time::sleep(POLL).await;
            match self.runtime.store().get_approval(self.tenant, id).await {
                Ok(a) if a.status != ApprovalStatus::Pending => return,
                _ => {}
            }
        }
    }

    async fn effect_decided(&self, key: &OperationKey) {
        loop {
            tokio::time::sleep(POLL).await;
            if let Ok(view) = self
                .runtime
                .view(self.tenant, key_session(key, self.session))
                .await
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

    async fn decide_approval(
        &self,
        id: ApprovalId,
        decision: ApprovalDecision,
        args_hash: &str,
    ) -> anyhow::Result<()> {
        self.runtime
            .decide_approval(self.tenant, id, decision, args_hash)
            .await?;
        Ok(())
    }

    async fn resolve_effect(
        &self,
        key: &OperationKey,
        decision: EffectDecision,
    ) -> anyhow::Result<()> {
        self.runtime
            .resolve_effect(self.tenant, key_session(key, self.session), key, decision)
            .await?;
        Ok(())
    }

    async fn workspace(&self) -> Option<std::path::PathBuf> {
        self.runtime
            .view(self.tenant, self.session)
            .await
            .ok()
            .and_then(|v| {
                serde_json::from_value::<keel_runtime::SessionConfig>(v.state.config).ok()
            })
            .map(|c| c.workspace)
    }
}

/// Asks about each pending action of a local run; see [`decide_with`].
///
/// # Errors
/// As [`decide_with`].
pub async fn decide_pending(
    p: &Prepared,
    pending: &[PendingAction],
    lines: &mut Lines,
) -> anyhow::Result<bool> {
    decide_with(p, pending, lines).await
}

/// Asks about every pending action and records the answers; returns whether all were answered
/// (false when the human quit).
///
/// # Errors
/// A decision the runtime refused (expired approval, …).
pub async fn decide_with<D: Decider>(
    p: &D,
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
                    "? {tool_name}{} needs approval (or: keel approve|deny {approval_id}):\n{}",
                    crate::output::subagent_label(action),
                    crate::output::approval_text(tool_name, arguments)
                );
                let decision = loop {
                    let answer = match lines
                        .ask_until(
                            "  [y] allow once · [a] allow for this session · [n] deny › ",
                            p.approval_decided(*approval_id),
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
                    let for_session = decision == ApprovalDecision::AllowForSession;
                    p.decide_approval(*approval_id, decision, args_hash).await?;
                    if for_session {
                        let workspace = p.workspace().await;
                        println!(
                            "  {}",
                            crate::decide::grant_of(tool_name, arguments, workspace.as_deref())
                        );
                    }
                }
            }
            PendingAction::Effect {
                operation_key,
                tool_name,
                arguments,
                ..
            } => {
                println!(
                    "? the outcome of {tool_name}{} is unknown (the run stopped while it was running; or: keel resolve {operation_key}):\n{}",
                    crate::output::subagent_label(action),
                    crate::output::approval_text(tool_name, arguments)
                );
                let decision = loop {
                    let answer = match lines
                        .ask_until(
                            "  did it happen? [c] committed · [f] failed · [r] retry it › ",
                            p.effect_decided(operation_key),
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
                    p.resolve_effect(operation_key, decision).await?;
                }
            }
        }
    }
    Ok(true)
}
