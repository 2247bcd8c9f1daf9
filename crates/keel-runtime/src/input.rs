//! The input pipeline: what a person types, compiled before it enters the loop.
//!
//! One pipeline serves every host (the interactive CLI, headless `keel run`, the HTTP API):
//! [`Runtime::compile_input`] turns raw input into a [`Compiled`]:
//!
//! - **Plain text** becomes the turn's user message.
//! - **`@path` mentions** (a word starting with `@`, or `@"a path"` with spaces) attach the file's content, read as the
//!   model's `read_file` would read it — the same workspace confinement and policy (a `deny`
//!   rule on `read_file` refuses it) — and cut to the tool result budget. A missing file, one
//!   outside the workspace or one the policy denies is an [`RuntimeError::Input`] naming the path,
//!   before anything is journaled or any model is asked.
//! - **Slash commands** never reach the model as a user message: `/help`, `/cost`, `/status`
//!   and `/permissions` are answered locally ([`Runtime::answer`]); `/compact [focus]` runs
//!   the compaction now ([`Runtime::compact_now`]); `/model NAME` asks the host to re-pin the
//!   release ([`Runtime::repin`]); `/clear` starts a new session with the same release and
//!   settings ([`Runtime::clear`]); `/resume` (a terminal only: refused when
//!   [`InputOptions::terminal`] is false) asks the host to pick a session to continue.
//! - **User-defined commands**: `/NAME args` where `NAME.md` is one of
//!   [`InputOptions::workspace_commands`] (`.keel/commands/` of a trusted workspace, read by the
//!   host) or in [`InputOptions::command_dirs`] (the user's `commands/` config dir): the file's text (after an optional front matter with a
//!   `description:` line), with `$ARGUMENTS` replaced by `args`, becomes the prompt — its
//!   `@path` mentions attach files too.
//! - Anything else starting with `/NAME` is an unknown command: a clear error, no model call.
//!
//! A [`Prompt`] is journaled with [`Runtime::submit_prompt`]: `turn.queued` carries the message
//! the model sees and, when the pipeline did more than pass text through, how it was compiled
//! ([`keel_core::CompiledInput`]: what was typed, the command expanded, the files attached) —
//! journaled before it takes effect.

use std::path::PathBuf;
use std::sync::Arc;

use keel_core::{
    Attachment, CompiledInput, Correlation, EventBody, SessionId, SessionState, SessionStatus,
    TenantId,
};
use keel_tools::artifact::StoreArtifactSink;
use keel_tools::policy::Verdict;
use keel_tools::tool::{NoProgress, StepSnapshot, ToolLimits};
use keel_tools::workspace::Workspace;
use keel_tools::{ToolCallRequest, ToolContext};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::config::SessionConfig;
use crate::error::{Result, RuntimeError};
use crate::runtime::Runtime;

mod commands;
pub use commands::*;

/// The built-in commands, with what `/help` says of each.
pub const BUILTIN_COMMANDS: &[(&str, &str)] = &[
    ("help", "list the commands"),
    ("cost", "tokens and cost of this session so far"),
    ("status", "the session: id, status, model, turns, context"),
    ("permissions", "permission mode, sandbox and rules in force"),
    (
        "compact",
        "/compact [focus] — summarize the conversation now (focus: what to keep)",
    ),
    (
        "model",
        "/model NAME — re-pin the session to another model route",
    ),
    ("clear", "start a new session with the same settings"),
    ("resume", "pick a session to continue (terminal only)"),
];

/// Where user-defined commands come from, in precedence order: [`InputOptions::workspace_commands`],
/// then the first of [`InputOptions::command_dirs`] that has `NAME.md`. A command named like a
/// built-in is never used (`/help` says so).
#[derive(Debug, Clone, Default)]
pub struct InputOptions {
    /// The command files of a trusted workspace's `.keel/commands`, as the host read them when
    /// it decided the trust (the bytes trust covers are the bytes used; no symlink followed, no
    /// special file opened). Empty when the workspace is not trusted.
    pub workspace_commands: Vec<CommandFile>,
    /// The user's directories of `NAME.md` command files (the user's own: symlinks are
    /// followed; FIFOs, devices and files over 1 MiB are refused without blocking).
    pub command_dirs: Vec<PathBuf>,
    /// The `.keel/commands` of a workspace that is *not* trusted: its files are never used,
    /// but `/NAME` naming one says so (and how to trust the workspace) instead of "unknown".
    pub untrusted_dir: Option<UntrustedCommands>,
    /// The host is a terminal: `/resume` is offered (it picks a session interactively).
    pub terminal: bool,
}

/// A command file the host read ([`InputOptions::workspace_commands`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandFile {
    /// The command's name (the file's name without `.md`).
    pub name: String,
    /// The file.
    pub file: PathBuf,
    /// Its text, or why keel does not use it (a symlink, a FIFO, too large, not UTF-8).
    pub text: std::result::Result<String, String>,
}

/// The commands directory of an untrusted workspace ([`InputOptions::untrusted_dir`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UntrustedCommands {
    /// `.keel/commands` of the workspace.
    pub dir: PathBuf,
    /// The workspace, as `keel trust PATH` takes it.
    pub workspace: PathBuf,
}

/// A built-in command the host carries out (the pipeline parsed and checked it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Command {
    /// `/help`: answered by [`Runtime::answer`].
    Help,
    /// `/cost`: answered by [`Runtime::answer`].
    Cost,
    /// `/status`: answered by [`Runtime::answer`].
    Status,
    /// `/permissions`: answered by [`Runtime::answer`].
    Permissions,
    /// `/compact [focus]`: [`Runtime::compact_now`].
    Compact {
        /// What the summary must keep, if given.
        focus: Option<String>,
    },
    /// `/model NAME`: the host re-pins the session to a release with this model route
    /// ([`Runtime::repin`]; the route and provider settings are the host's).
    Model {
        /// The model (route entry) named.
        name: String,
    },
    /// `/clear`: [`Runtime::clear`].
    Clear,
    /// `/resume [SESSION]`: the terminal picks a session to continue.
    Resume {
        /// The session named, if any.
        session: Option<String>,
    },
}

impl Command {
    /// The command's name as typed (without the slash).
    pub fn name(&self) -> &'static str {
        match self {
            Command::Help => "help",
            Command::Cost => "cost",
            Command::Status => "status",
            Command::Permissions => "permissions",
            Command::Compact { .. } => "compact",
            Command::Model { .. } => "model",
            Command::Clear => "clear",
            Command::Resume { .. } => "resume",
        }
    }
}

/// A prompt for the model, compiled: submit it with [`Runtime::submit_prompt`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// The user message the model sees (a command's text, attached files appended).
    pub message: String,
    /// How it was compiled; `None` for plain text passed through.
    pub compiled: Option<CompiledInput>,
}

/// What the pipeline made of an input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compiled {
    /// A turn for the model.
    Prompt(Prompt),
    /// A built-in command; no model sees it as a user message.
    Command(Command),
}

/// A serving model's label as people name it (every host's output uses this): the scripted
/// model's `scripted:PATH` (its journaled label) is written the way `--model` and a release's
/// route take it, `script:PATH`; other labels are the provider's model names, unchanged.
pub fn model_label(label: &str) -> String {
    match label.strip_prefix("scripted:") {
        Some(path) => format!("script:{path}"),
        None => label.to_owned(),
    }
}

/// What [`Runtime::compact_now`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Compacted {
    /// Estimated tokens of the context before: instructions, tools, summary and conversation,
    /// the figure `/status` shows ([`Runtime::project_context`]).
    pub tokens_before: u64,
    /// Estimated tokens of the context after, the same way (instructions, tools, the summary):
    /// what `/status` shows next.
    pub tokens_after: u64,
    /// The journal version with `context.compacted`.
    pub version: u64,
}

impl Runtime {
    /// Compiles `raw` input for `session` (see the [module docs](crate::input)). Writes nothing.
    ///
    /// # Errors
    /// [`RuntimeError::InvalidInput`] for empty input; [`RuntimeError::Input`] for an unknown
    /// command, `/model` without a name, `/resume` when not [`InputOptions::terminal`], an
    /// `@path` that cannot be attached (missing, outside the workspace, denied, binary); an
    /// unknown session; store errors.
    pub async fn compile_input(
        &self,
        tenant: TenantId,
        session: SessionId,
        raw: &str,
        opts: &InputOptions,
    ) -> Result<Compiled> {
        if raw.trim().is_empty() {
            return Err(RuntimeError::InvalidInput(
                "input is empty; a turn needs a message".into(),
            ));
        }
        let mut compiled = CompiledInput {
            raw: raw.to_owned(),
            ..CompiledInput::default()
        };
        let text = match split_command(raw) {
            None => raw.to_owned(),
            Some((name, args)) => {
                let arg = (!args.is_empty()).then(|| args.to_owned());
                let command = match name {
                    "help" => Command::Help,
                    "cost" => Command::Cost,
                    "status" => Command::Status,
                    "permissions" => Command::Permissions,
                    "compact" => Command::Compact { focus: arg },
                    "model" => match arg {
                        Some(name) => Command::Model { name },
                        None => {
                            return Err(RuntimeError::Input(
                                "/model needs a model name, e.g. /model anthropic:claude-sonnet-4-5"
                                    .into(),
                            ));
                        }
                    },
                    "clear" => Command::Clear,
                    "resume" if opts.terminal => Command::Resume { session: arg },
                    "resume" => {
                        return Err(RuntimeError::Input(
                            "/resume is a terminal-only command (it picks a session interactively); here, send input to the session you want to continue".into(),
                        ));
                    }
                    _ => {
                        let Some(cmd) = find_user_command(opts, name)? else {
                            return Err(RuntimeError::Input(format!(
                                "unknown command /{name}; /help lists the commands (your commands are NAME.md files in a trusted workspace's .keel/commands or in the commands directory beside your user config, e.g. ~/.config/keel/commands)"
                            )));
                        };
                        let text = expand(&cmd.body, args);
                        if text.trim().is_empty() {
                            return Err(RuntimeError::Input(format!(
                                "/{name}: {} has no text",
                                cmd.file.display()
                            )));
                        }
                        compiled.command = Some(cmd.name);
                        compiled.command_file = Some(cmd.file.display().to_string());
                        return self
                            .finish_prompt(tenant, session, text, compiled)
                            .await
                            .map(Compiled::Prompt);
                    }
                };
                return Ok(Compiled::Command(command));
            }
        };
        self.finish_prompt(tenant, session, text, compiled)
            .await
            .map(Compiled::Prompt)
    }

    /// Attaches the `@path` mentions of `text`; `compiled` is kept when anything was compiled.
    async fn finish_prompt(
        &self,
        tenant: TenantId,
        session: SessionId,
        text: String,
        mut compiled: CompiledInput,
    ) -> Result<Prompt> {
        let paths = mentions(&text);
        let mut files = Vec::with_capacity(paths.len());
        if !paths.is_empty() {
            let (state, config) = self.state_and_config(tenant, session).await?;
            for path in paths {
                let (content, truncated) =
                    self.attach(tenant, session, &state, &config, &path).await?;
                compiled.attachments.push(Attachment {
                    path: path.clone(),
                    chars: u64::try_from(content.chars().count()).unwrap_or(u64::MAX),
                    truncated,
                });
                files.push((path, content));
            }
        }
        let message = with_attachments(&text, &files);
        let plain = compiled.command.is_none() && compiled.attachments.is_empty();
        Ok(Prompt {
            message,
            compiled: (!plain).then_some(compiled),
        })
    }

    async fn state_and_config(
        &self,
        tenant: TenantId,
        session: SessionId,
    ) -> Result<(SessionState, SessionConfig)> {
        let state = self.fold(tenant, session).await?;
        let config =
            serde_json::from_value::<SessionConfig>(state.config.clone()).map_err(|e| {
                RuntimeError::Config {
                    session,
                    reason: e.to_string(),
                }
            })?;
        Ok((state, config))
    }

    /// The content of `path` as `read_file` shows it, checked as a `read_file` call of the
    /// session would be (workspace, policy), cut to the result budget; whether it was cut.
    async fn attach(
        &self,
        tenant: TenantId,
        session: SessionId,
        state: &SessionState,
        config: &SessionConfig,
        path: &str,
    ) -> Result<(String, bool)> {
        let refused = |why: String| RuntimeError::Input(format!("@{path}: {why}"));
        let release_id = state.release_id.clone().ok_or(RuntimeError::Config {
            session,
            reason: "the journal has no session.created".into(),
        })?;
        let release = self.inner.store.get_release(tenant, &release_id).await?;
        let policy = crate::pinned::enforced_policy(session, &release, config)?;
        let workspace =
            Workspace::new(&config.workspace)?.protecting(&self.inner.options.hidden_paths);
        // The built-in read_file of the host (a release's MCP tools play no part here).
        let tools = self.inner.tools.base();
        let request = ToolCallRequest {
            call_id: "input".into(),
            name: "read_file".into(),
            arguments: serde_json::json!({ "path": path }),
        };
        let call = tools
            .validate(&request)
            .map_err(|r| refused(r.content.clone()))?;
        let (decision, _) = tools.authorize(&call, &workspace, &policy);
        // The person attaching the file is the one an `ask` rule would ask.
        if decision.verdict == Verdict::Deny {
            return Err(refused(format!("permission denied: {}", decision.reason)));
        }
        let Some(tool) = tools.get("read_file") else {
            return Err(refused("this host has no read_file tool".into()));
        };
        let limits = ToolLimits::default();
        let budget = limits.result_budget_chars;
        let ctx = ToolContext {
            call_id: "input".into(),
            cancel: CancellationToken::new(),
            progress: Arc::new(NoProgress),
            workspace,
            sandbox: keel_tools::sandbox::Sandbox::new(keel_tools::sandbox::SandboxMode::Off)?,
            artifacts: Arc::new(StoreArtifactSink::new(
                self.inner.store.clone(),
                tenant,
                session,
            )),
            snapshot: Arc::new(StepSnapshot {
                step_id: "input".into(),
                policy,
            }),
            limits,
            hash_key: self.inner.options.seal_key.hash_key().clone(),
            scope: None,
            session: None,
        };
        let out = tool.call(call.arguments.clone(), &ctx).await;
        if out.status != keel_tools::ToolResultStatus::Succeeded {
            return Err(refused(out.content));
        }
        let total = out.content.chars().count();
        if total <= budget {
            return Ok((out.content, false));
        }
        let mut cut: String = out.content.chars().take(budget).collect();
        cut.push_str(&format!(
            "\n… [cut at {budget} of {total} characters (the result budget): read the rest with read_file {{\"path\": \"{path}\", \"offset\": …}}]"
        ));
        Ok((cut, true))
    }

    /// The local answer to `/help`, `/cost`, `/status` or `/permissions` (no model is asked,
    /// nothing is journaled).
    ///
    /// # Errors
    /// [`RuntimeError::Input`] for a command that is not answered locally; an unknown session;
    /// store errors.
    pub async fn answer(
        &self,
        tenant: TenantId,
        session: SessionId,
        command: &Command,
        opts: &InputOptions,
    ) -> Result<String> {
        match command {
            Command::Help => {
                let mut out = String::from("Commands:\n");
                for (name, what) in BUILTIN_COMMANDS {
                    if *name == "resume" && !opts.terminal {
                        continue;
                    }
                    out.push_str(&format!("  /{name:<12} {what}\n"));
                }
                let (user, notes) = list_user_commands(opts);
                if !user.is_empty() {
                    out.push_str("Your commands:\n");
                    for c in user {
                        out.push_str(&format!(
                            "  /{:<12} {}\n",
                            c.name,
                            c.description.as_deref().unwrap_or("(no description)")
                        ));
                    }
                }
                for note in notes {
                    out.push_str(&format!("Note: {note}\n"));
                }
                out.push_str("Mention a workspace file as @path to attach it.");
                Ok(out)
            }
            Command::Cost => {
                let s = self.fold(tenant, session).await?;
                let mut out = format!(
                    "session {session}: ${:.4} — {} input + {} output tokens over {} steps",
                    s.cost_usd, s.usage.input_tokens, s.usage.output_tokens, s.num_steps
                );
                for (model, u) in &s.usage_by_model {
                    out.push_str(&format!(
                        "\n  {}: ${:.4}, {} input + {} output tokens, {} steps",
                        model_label(model),
                        u.cost_usd,
                        u.usage.input_tokens,
                        u.usage.output_tokens,
                        u.steps
                    ));
                }
                Ok(out)
            }
            Command::Status => {
                let (s, config) = self.state_and_config(tenant, session).await?;
                let route = match &s.release_id {
                    Some(id) => self
                        .inner
                        .store
                        .get_release(tenant, id)
                        .await
                        .map(|r| r.definition.model_route.join(", "))
                        .unwrap_or_default(),
                    None => String::new(),
                };
                let context = self.project_context(tenant, session).await?;
                Ok(format!(
                    "session {session}: {status}\n  release {release} (model {route})\n  workspace {ws}\n  turns {turns}, queued {queued}\n  context ~{tokens} tokens",
                    status = s.status,
                    release = s.release_id.map(|r| r.to_string()).unwrap_or_default(),
                    ws = config.workspace.display(),
                    turns = s.turns.len(),
                    queued = s.queue.len(),
                    tokens = context.estimated_tokens,
                ))
            }
            Command::Permissions => self.permissions_text(tenant, session).await,
            other => Err(RuntimeError::Input(format!(
                "/{} is not answered locally",
                other.name()
            ))),
        }
    }

    /// `/permissions`: the mode, the sandbox, and the rules that decide calls — the pinned
    /// release's policy (the user's and a trusted workspace's `[policy]`), the settings' `ask`
    /// and `deny` rules, and those added in the session by `allow_for_session` decisions — each
    /// with where it came from.
    async fn permissions_text(&self, tenant: TenantId, session: SessionId) -> Result<String> {
        use keel_tools::policy::{RuleAction, RuleSource};
        let events = self.inner.store.read(tenant, session, 1, None).await?;
        let mut state = SessionState::default();
        let mut proj = crate::projection::Projection::default();
        for ev in &events {
            state
                .apply(ev)
                .map_err(|source| RuntimeError::Rejected { session, source })?;
            proj.apply(&state, ev);
        }
        let config =
            serde_json::from_value::<SessionConfig>(state.config.clone()).map_err(|e| {
                RuntimeError::Config {
                    session,
                    reason: e.to_string(),
                }
            })?;
        let release_id = state.release_id.clone().ok_or(RuntimeError::Config {
            session,
            reason: "the journal has no session.created".into(),
        })?;
        let release = self.inner.store.get_release(tenant, &release_id).await?;
        let mut rules = crate::pinned::enforced_policy(session, &release, &config)?.rules;
        if let Ok(ws) = Workspace::new(&config.workspace) {
            let tools = self.inner.tools.base();
            for (name, arguments) in &proj.allowed_for_session {
                let call = keel_tools::ValidatedCall {
                    call_id: String::new(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                    effect: keel_core::EffectClass::SideEffecting,
                    parallel_safe: false,
                };
                let subject = tools.subject(&call, &ws);
                rules.extend(keel_tools::policy::session_rules_for(name, &subject));
            }
        }
        let list = |action: RuleAction| {
            let shown: Vec<String> = rules
                .iter()
                .filter(|r| r.action == action)
                .map(|r| {
                    let from = match r.source {
                        RuleSource::Agent => "release",
                        RuleSource::Settings => "settings",
                        RuleSource::Session => "this session",
                    };
                    format!("{} ({from})", r.pattern.text())
                })
                .collect();
            if shown.is_empty() {
                "(none)".to_owned()
            } else {
                shown.join(", ")
            }
        };
        let snake = |v: serde_json::Value| v.as_str().map(str::to_owned).unwrap_or_default();
        Ok(format!(
            "permission mode {mode}\n  sandbox {sandbox} (network {net})\n  allow: {allow}\n  ask: {ask}\n  deny: {deny}",
            mode = serde_json::to_value(config.permission_mode)
                .map(snake)
                .unwrap_or_default(),
            sandbox = serde_json::to_value(config.sandbox)
                .map(snake)
                .unwrap_or_default(),
            net = config.sandbox_network,
            allow = list(RuleAction::Allow),
            ask = list(RuleAction::Ask),
            deny = list(RuleAction::Deny),
        ))
    }

    /// `/compact [focus]`: summarizes the whole model-visible transcript now, between turns,
    /// with `focus` (what the summary must keep) — a model call of its own
    /// (`RequestPurpose::Compaction`, which takes no scripted position) — and journals
    /// `context.compacted` without a turn: the next turn sees only the summary.
    ///
    /// # Errors
    /// [`RuntimeError::Input`] when there is nothing to compact or the model call failed;
    /// [`RuntimeError::TurnInProgress`] while a turn is active or queued;
    /// [`RuntimeError::SessionBusy`] when another process runs the session (after waiting
    /// `lease_wait` for it to let go);
    /// [`RuntimeError::Closed`]; store errors.
    pub async fn compact_now(
        &self,
        tenant: TenantId,
        session: SessionId,
        focus: Option<&str>,
    ) -> Result<Compacted> {
        // Waits out a worker that is just letting the session go (at most `lease_wait`).
        let mut held = self.inner.hold(tenant, session).await?;
        let r = self.compact_held(held.journal(), focus).await;
        self.inner.unhold(tenant, held).await;
        r
    }

    async fn compact_held(
        &self,
        j: &mut crate::journal::Journal,
        focus: Option<&str>,
    ) -> Result<Compacted> {
        let session = j.session;
        if j.state.status == SessionStatus::Closed {
            return Err(RuntimeError::Closed { session });
        }
        if let Some(turn) = j
            .state
            .active_turn
            .or_else(|| j.state.queue.front().copied())
        {
            return Err(RuntimeError::TurnInProgress { session, turn });
        }
        let from = usize::try_from(j.proj.first_kept).unwrap_or(usize::MAX);
        let items = j.proj.items.get(from..).unwrap_or_default().to_vec();
        if items.is_empty() {
            return Err(RuntimeError::Input(
                "/compact: nothing to compact (no conversation since the last summary)".into(),
            ));
        }
        // The same figure `/status` shows (instructions, tools, summary and conversation).
        let tokens_before = self.project_journal(j.tenant, j).await?.estimated_tokens;
        let request = crate::compaction::summary_request(
            j.proj.summary.as_deref(),
            &items,
            focus,
            j.proj.position,
        );
        let resp = keel_model::collect(
            self.inner.model.stream(request),
            self.inner.model.model(),
            &self.inner.options.prices,
        )
        .await;
        let summary = match resp.outcome {
            keel_model::Outcome::Completed { .. } => resp.text,
            keel_model::Outcome::Cancelled => {
                return Err(RuntimeError::Input("/compact: cancelled".into()));
            }
            keel_model::Outcome::Failed { error } => {
                return Err(RuntimeError::Input(format!(
                    "/compact: the summary request failed: {}",
                    error.message
                )));
            }
        };
        let tokens_after = crate::tokens::estimate_tokens(&summary);
        let first_kept_item = u64::try_from(j.proj.items.len()).unwrap_or(u64::MAX);
        let version = j
            .append(
                "context.compacted",
                vec![(
                    Correlation::default().by(self.actor),
                    EventBody::ContextCompacted {
                        summary,
                        first_kept_item,
                        tokens_before,
                        tokens_after,
                        requested: true,
                        focus: focus
                            .map(str::trim)
                            .filter(|f| !f.is_empty())
                            .map(str::to_owned),
                    },
                )],
            )
            .await?;
        // What `/status` shows from now on.
        let tokens_after = self
            .project_journal(j.tenant, j)
            .await
            .map_or(tokens_after, |c| c.estimated_tokens);
        Ok(Compacted {
            tokens_before,
            tokens_after,
            version,
        })
    }

    /// `/clear`: a new session with `session`'s release and effective settings (the old one
    /// stays as it is, resumable). Returns the new session's id, or `None` when `session` has
    /// no turn yet: it is already clear, and another empty session would only be left behind
    /// (`keel run "/clear"` stored two).
    ///
    /// # Errors
    /// An unknown session; store errors.
    pub async fn clear(&self, tenant: TenantId, session: SessionId) -> Result<Option<SessionId>> {
        let (state, config) = self.state_and_config(tenant, session).await?;
        if state.turn_order.is_empty() {
            return Ok(None);
        }
        let release_id = state.release_id.ok_or(RuntimeError::Config {
            session,
            reason: "the journal has no session.created".into(),
        })?;
        let release = self.inner.store.get_release(tenant, &release_id).await?;
        self.create_session(tenant, &release, config)
            .await
            .map(Some)
    }

    /// What `/clear` answers for `session` when [`Runtime::clear`] made nothing.
    pub fn nothing_to_clear(session: SessionId) -> String {
        format!("nothing to clear: session {session} has no turn yet")
    }
}

#[cfg(test)]
mod tests;
