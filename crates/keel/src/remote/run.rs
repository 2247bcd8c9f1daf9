//! `keel --server URL run|resume`: the run happens on the server; this process creates the
//! release and session (or finds the session), submits the input, follows the session's SSE
//! stream and renders it with the printers of local runs, answers approvals like a local run
//! (interactive on a terminal, otherwise left pending with exit 3), and ends with the same
//! result line and exit code.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::PoisonError;
use std::time::Instant;

use anyhow::Context;
use keel_client::api::{
    BudgetBody, CreateReleaseRequest, CreateSessionRequest, PermissionModeParam, PolicyBody,
    SandboxParam, SettingsBody, UpdateSessionRequest,
};
use keel_client::{Client, Reconnect, StreamItem};
use keel_core::{
    Event, SessionId, SessionState, SessionStatus, StateMachine, TerminalReason, TurnId, TurnStatus,
};
use keel_runtime::{Delta, DeltaKind, PendingAction, SessionConfig, SubscriptionItem};

use super::{Server, connect, explain, load_state, waiting_approvals};
use crate::cli::{GlobalArgs, OutputArg, RunArgs};
use crate::config::{Config, Locations, OutputFormat};
use crate::exit;
use crate::interactive::Lines;
use crate::output::{JsonlPrinter, Printer, ResultLine};
use crate::run::{CONTINUE_PROMPT, ResumeChanges, SharedPrinter};
use crate::session_cmd::{LeftWithoutPrompt, Mode, no_prompt};

mod bodies;
use bodies::*;

mod outcome;
use outcome::*;

/// A remote session being driven.
struct RemoteRun {
    client: Client,
    session: SessionId,
    /// The turn this invocation submitted.
    turn: Option<TurnId>,
    /// Whether there is anything to run (see `crate::run::Prepared::continues`).
    continues: bool,
    started: Instant,
    /// The journal folded so far.
    state: SessionState,
    /// The input given was a slash command the server carried out (its answer printed): there
    /// is nothing to drive, and nothing "left to continue" either — a headless run ends with
    /// exit 0, a terminal asks for the next input.
    answered: bool,
}

/// How a drive ended.
enum Driven {
    Finished(SessionStatus),
    Error(anyhow::Error),
    Interrupted,
}

/// Applies `body` to session `sid` bound to `version` (its ETag when read); on 412 (the session
/// moved since) reads it again and retries once with the fresh version.
///
/// # Errors
/// 409 while a turn runs or waits on a human, 403 beyond the server's limits or for a viewer's
/// key, a second 412, other server errors — each naming the session.
async fn update_settings(
    client: &Client,
    sid: &str,
    version: u64,
    body: &SettingsBody,
) -> anyhow::Result<()> {
    let request = UpdateSessionRequest {
        settings: body.clone(),
        release_id: None,
    };
    let refused =
        |e| explain(client, e).context(format!("cannot change the settings of session {sid}"));
    match client.update_session(sid, version, &request).await {
        Ok(_) => Ok(()),
        Err(e) if e.status() == Some(412) => {
            let fresh = client
                .get_session(sid)
                .await
                .map_err(|e| explain(client, e))?;
            client
                .update_session(sid, fresh.version, &request)
                .await
                .map(|_| ())
                .map_err(refused)
        }
        Err(e) => Err(refused(e)),
    }
}

/// `keel --server URL run|resume`: the exit code of the terminal reason; failures before the
/// run as locally (one line, a `failed` result line with `--output jsonl`, exit 1; usage errors
/// exit 2).
pub fn execute(
    server: &Server,
    global: &GlobalArgs,
    args: &RunArgs,
    prompt: Option<String>,
    resume: Option<String>,
) -> ExitCode {
    let started = Instant::now();
    let jsonl = args.output == Some(OutputArg::Jsonl);
    let known = resume
        .as_deref()
        .and_then(|s| crate::sessions::parse_session(s).ok());
    let fail = |error: anyhow::Error, session: Option<SessionId>| {
        eprintln!("keel: {}", crate::report::describe(&error));
        if error.is::<exit::UsageError>() {
            return ExitCode::from(exit::USAGE);
        }
        if jsonl {
            let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            let mut line = ResultLine::startup_failure(crate::report::describe(&error), elapsed);
            line.session_id = session;
            JsonlPrinter.result(&line);
        }
        ExitCode::from(exit::code(TerminalReason::Failed))
    };
    if resume.is_none() && global.workspace.is_none() {
        return fail(
            anyhow::Error::new(exit::UsageError(format!(
                "--workspace is required with --server: name the workspace directory on the server (under its workspace_roots), e.g. keel --server {} run --workspace /srv/work/repo \"…\"",
                server.url
            ))),
            None,
        );
    }
    if resume.is_some() && args.model.is_some() {
        return fail(
            anyhow::Error::new(exit::UsageError(
                "--model with --server: re-pinning a session to another model is not available over the API; start a new session with keel run --model …".into(),
            )),
            known,
        );
    }
    if let Some(e) = unsupported_flag(args) {
        return fail(e, known);
    }
    let rt = match crate::cli::tokio_runtime() {
        Ok(rt) => rt,
        Err(e) => return fail(e, known),
    };
    rt.block_on(async {
        crate::signals::install();
        // One reader of standard input for the whole process, started when first needed.
        let mut lines: Option<Lines> = None;
        let (p, output) = match prepare(server, global, args, prompt, resume, &mut lines).await {
            Ok(p) => p,
            Err(e) if e.is::<LeftWithoutPrompt>() => return ExitCode::SUCCESS,
            Err(e) => return fail(e, known),
        };
        ExitCode::from(converse(p, output, &mut lines).await)
    })
}

async fn prepare(
    server: &Server,
    global: &GlobalArgs,
    args: &RunArgs,
    prompt: Option<String>,
    resume: Option<String>,
    lines: &mut Option<Lines>,
) -> anyhow::Result<(RemoteRun, OutputFormat)> {
    let started = Instant::now();
    // The user file and flags: the workspace is the server's, its keel.toml is not read here.
    let config = Config::load_user(None, &Locations::from_env(), &args.overrides(None))?;
    let prompt = match prompt.as_deref() {
        Some("-") => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)?;
            Some(text)
        }
        _ => prompt,
    };
    let client = connect(server)?;
    match resume {
        None => {
            // As locally: asked on a terminal, else read from standard input.
            let prompt = match prompt {
                Some(p) => p,
                None if crate::session_cmd::mode_of(config.output) == Mode::Interactive => {
                    match lines.get_or_insert_with(Lines::spawn).ask_prompt().await {
                        Some(p) => p,
                        None => return Err(anyhow::Error::new(LeftWithoutPrompt)),
                    }
                }
                None if !std::io::stdin().is_terminal() => {
                    let mut text = String::new();
                    std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                        .context("cannot read the prompt from standard input")?;
                    text
                }
                None => String::new(),
            };
            if prompt.trim().is_empty() {
                return Err(no_prompt());
            }
            let workspace = global
                .workspace
                .as_ref()
                .map(|w| w.display().to_string())
                .unwrap_or_default();
            // As locally, before anything reaches the server.
            if config.model_route.is_empty() {
                return Err(crate::model_spec::SpecError::Missing.into());
            }
            let release = client
                .create_release(&release_request(&config))
                .await
                .map_err(|e| {
                    if e.status() == Some(403) && e.problem().is_none_or(|p| p.limit.is_none()) {
                        explain(&client, e).context(
                            "keel --server run stores a release (the model route, instructions, tools and policy the session pins), which needs an admin key; use an admin's key in KEEL_API_KEY, or continue an existing session with `keel --server resume SESSION`, which an operator key may do",
                        )
                    } else {
                        explain(&client, e)
                    }
                })?;
            let session = client
                .create_session(&CreateSessionRequest {
                    release_id: release.release_id,
                    workspace,
                    settings: settings_of(&config),
                })
                .await
                .map_err(|e| explain(&client, e))?;
            let id: SessionId = session.session_id.parse()?;
            let jsonl = config.output == OutputFormat::Jsonl;
            let turn = submit(&client, &session.session_id, &prompt, jsonl).await?;
            if turn.is_none() {
                // A command answered instead of a turn: as locally, the new session is not
                // kept when it never got one (`keel --server … run "/help"` left it behind).
                discard_if_turnless(&client, &session.session_id).await;
            }
            Ok((
                RemoteRun {
                    client,
                    session: id,
                    continues: turn.is_some(),
                    answered: turn.is_none(),
                    turn,
                    started,
                    state: SessionState::default(),
                },
                config.output,
            ))
        }
        Some(session) => {
            let id = crate::sessions::parse_session(&session)?;
            if prompt.as_deref().is_some_and(|p| p.trim().is_empty()) {
                return Err(anyhow::Error::new(exit::UsageError(format!(
                    "the prompt is empty: give a follow-up (keel resume {id} \"…\"), or none to continue an unfinished turn"
                ))));
            }
            let sid = id.to_string();
            let record = client
                .get_session(&sid)
                .await
                .map_err(|e| explain(&client, e))?;
            if record.status == "closed" {
                anyhow::bail!("session {id} is closed; start a new one with `keel run`");
            }
            let (mut events, mut state) = load_state(&client, &sid).await?;
            // As locally: the settings flags are journaled first (`session.config_changed`),
            // so they hold for this turn and the later ones.
            let current = serde_json::from_value::<SessionConfig>(state.config.clone())
                .with_context(|| format!("the settings of session {id} do not read"))?;
            let changes = crate::session_cmd::resume_changes(args, &config);
            if let Some(body) = changes_body(&changes, &current) {
                update_settings(&client, &sid, record.version, &body).await?;
                (events, state) = load_state(&client, &sid).await?;
            }
            let mut caught_up = None;
            if prompt.is_none()
                && state.active_turn.is_none()
                && let Some((seq, turn)) = continued_on_server(&events, &state)
            {
                // The server went on as soon as the wait was decided (a local session waits
                // for `keel resume`): show the turn from where it waited, as a local resume does.
                state = SessionState::replay(events.iter().take_while(|e| e.seq <= seq))?;
                caught_up = Some(turn);
            }
            let unfinished = caught_up.is_some()
                || state.active_turn.is_some()
                || !state.queue.is_empty()
                || state.status == SessionStatus::RequiresAction;
            let input = match prompt {
                Some(p) => Some(p),
                None if unfinished => None,
                None => state
                    .turn_order
                    .last()
                    .and_then(|t| state.turns.get(t))
                    .filter(|t| t.status != TurnStatus::Completed)
                    .map(|t| format!("{CONTINUE_PROMPT}\n\n{}", t.input)),
            };
            let mut answered = false;
            let turn = match input.filter(|_| caught_up.is_none()) {
                Some(text) => {
                    let jsonl = config.output == OutputFormat::Jsonl;
                    let turn = submit(&client, &sid, &text, jsonl).await?;
                    answered = turn.is_none();
                    turn
                }
                None => caught_up,
            };
            Ok((
                RemoteRun {
                    client,
                    session: id,
                    continues: turn.is_some() || (unfinished && !answered),
                    answered,
                    turn,
                    started,
                    state,
                },
                config.output,
            ))
        }
    }
}

/// The last time the session waited on a human (its `session.status_changed` to
/// `requires_action`) when the turn that waited has since completed and nothing came after it:
/// that event's seq and the turn. A turn that ended otherwise (cancelled while it waited, failed,
/// over a budget) is not caught up: as locally, a bare resume continues it with a new turn
/// (replaying it instead would end every bare resume the same way, a loop).
fn continued_on_server(events: &[Event], state: &SessionState) -> Option<(u64, TurnId)> {
    let last = *state.turn_order.last()?;
    if state.turns.get(&last)?.status != TurnStatus::Completed {
        return None;
    }
    let waited = events.iter().rev().find(|e| {
        matches!(
            e.body,
            keel_core::EventBody::SessionStatusChanged {
                status: SessionStatus::RequiresAction,
                ..
            }
        )
    })?;
    let finished_after = events.iter().any(|e| {
        e.seq > waited.seq
            && e.correlation.turn_id == Some(last)
            && matches!(e.body, keel_core::EventBody::TurnFinished { .. })
    });
    let started_after = state.turns.get(&last).is_some_and(|t| {
        events.iter().any(|e| {
            e.seq > waited.seq
                && matches!(e.body, keel_core::EventBody::TurnQueued { .. })
                && e.correlation.turn_id == Some(t.id)
        })
    });
    (finished_after && !started_after).then_some((waited.seq, last))
}

/// A delta from the stream's JSON, for the printers (text and reasoning; tool progress is
/// only drawn by local runs).
fn delta_of(session: SessionId, v: &serde_json::Value) -> Option<Delta> {
    let after_seq = v.get("after_seq")?.as_u64()?;
    let text = v.get("text").and_then(serde_json::Value::as_str);
    let kind = match (v.get("kind")?.as_str()?, text) {
        ("text", Some(t)) => DeltaKind::Text { text: t.to_owned() },
        ("reasoning", Some(t)) => DeltaKind::Reasoning { text: t.to_owned() },
        _ => return None,
    };
    Some(Delta {
        session_id: session,
        after_seq,
        kind,
    })
}

/// The drive ends where a local `Runtime::run` returns: the session idle with nothing active
/// or queued (and this invocation's turn ended), or waiting on a human, or closed.
fn stop_status(p: &RemoteRun) -> Option<SessionStatus> {
    let s = &p.state;
    match s.status {
        SessionStatus::Idle
            if s.active_turn.is_none()
                && s.queue.is_empty()
                && p.turn
                    .is_none_or(|t| s.turns.get(&t).is_some_and(|t| t.status.is_terminal())) =>
        {
            Some(SessionStatus::Idle)
        }
        SessionStatus::RequiresAction => Some(SessionStatus::RequiresAction),
        SessionStatus::Closed => Some(SessionStatus::Closed),
        _ => None,
    }
}

/// Follows the stream from the folded state's version, printing, until [`stop_status`].
async fn drive(p: &mut RemoteRun, printer: &SharedPrinter) -> Driven {
    // Already waiting on a human (a resume of a waiting session): nothing will arrive on the
    // stream until someone decides, so stop here, as a local run returns at once.
    if let Some(status) = stop_status(p)
        && (!p.continues
            || (status == SessionStatus::RequiresAction && !pending(p).await.is_empty()))
    {
        return Driven::Finished(status);
    }
    let sid = p.session.to_string();
    let mut stream = match p
        .client
        .stream_events(&sid, p.state.version, Reconnect::default())
        .await
    {
        Ok(s) => s,
        Err(e) => return Driven::Error(explain(&p.client, e)),
    };
    let mut interrupts = 0u32;
    loop {
        let item = tokio::select! {
            item = stream.recv() => item,
            () = crate::signals::next() => {
                // Waiting on a human, the turn runs nowhere: as locally (where Ctrl-C at the
                // approval question leaves), the session is left waiting and nothing cancelled.
                if p.state.status == SessionStatus::RequiresAction && !pending(p).await.is_empty() {
                    printer.lock().unwrap_or_else(PoisonError::into_inner).note(&format!(
                        "⊘ left waiting on a human, nothing cancelled (keel cancel {sid} cancels the turn)"
                    ));
                    return Driven::Finished(SessionStatus::RequiresAction);
                }
                interrupts += 1;
                if interrupts >= 2 {
                    return Driven::Interrupted;
                }
                printer.lock().unwrap_or_else(PoisonError::into_inner)
                    .note("⊘ cancelling the turn — press Ctrl-C again to exit");
                let client = p.client.clone();
                let sid = sid.clone();
                tokio::spawn(async move { let _ = client.cancel_turn(&sid).await; });
                continue;
            }
        };
        let item = match item {
            None => return Driven::Finished(p.state.status),
            Some(Err(e)) => return Driven::Error(explain(&p.client, e)),
            Some(Ok(i)) => i,
        };
        let sub = match item {
            StreamItem::Event { data, .. } => {
                let event = match Event::decode_value(data) {
                    Ok(e) => e,
                    Err(e) => return Driven::Error(e.into()),
                };
                if let Err(e) = p.state.apply(&event) {
                    return Driven::Error(e.into());
                }
                SubscriptionItem::Event {
                    event: Box::new(event),
                }
            }
            StreamItem::Delta(v) => match delta_of(p.session, &v) {
                Some(delta) => SubscriptionItem::Delta { delta },
                None => continue,
            },
            StreamItem::Gap { dropped } => SubscriptionItem::Gap { dropped },
        };
        printer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .item(&sub);
        if let Some(status) = stop_status(p)
            && (status != SessionStatus::RequiresAction || !pending(p).await.is_empty())
        {
            return Driven::Finished(status);
        }
    }
}

/// Drives the session; in interactive mode asks about pending actions and reads follow-ups.
async fn converse(mut p: RemoteRun, output: OutputFormat, lines: &mut Option<Lines>) -> u8 {
    let mode = crate::session_cmd::mode_of(output);
    let printer = crate::session_cmd::printer_for(mode);
    if mode == Mode::Interactive {
        lines.get_or_insert_with(Lines::spawn);
    }
    printer
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .seed(&p.state);
    loop {
        if std::mem::take(&mut p.answered) {
            // A command the server answered (printed): nothing ran, nothing to report.
            let Some(lines) = lines.as_mut() else {
                return 0;
            };
            match next_input(&mut p, lines).await {
                Ok(()) => continue,
                Err(code) => return code.unwrap_or(0),
            }
        }
        let driven = drive(&mut p, &printer).await;
        let waiting = match &driven {
            Driven::Finished(SessionStatus::RequiresAction) => pending(&p).await,
            _ => Vec::new(),
        };
        if let (Some(lines), false) = (lines.as_mut(), waiting.is_empty()) {
            let decider = Remote {
                client: &p.client,
                session: p.session,
                state: &p.state,
            };
            printer
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pause();
            let decided = crate::interactive::decide_with(&decider, &waiting, lines).await;
            printer
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .unpause();
            match decided {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => printer
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .note(&format!("keel: {}", crate::report::describe(&e))),
            }
        }
        let result = result_of(&p, &driven, waiting).await;
        printer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .result(&result);
        let code = exit::code(result.terminal_reason);
        if matches!(driven, Driven::Interrupted) {
            return code;
        }
        let Some(lines) = lines.as_mut() else {
            return code;
        };
        if let Err(stop) = next_input(&mut p, lines).await {
            return stop.unwrap_or(code);
        }
    }
}

/// Reads follow-ups until one queues a turn (then `p` drives it next). The server's input
/// pipeline compiles each: a slash command is carried out there and its answer printed here;
/// refused input (422) is said and asked again.
///
/// # Errors
/// `Err(None)` at the end of input (exit with the last code), `Err(Some(code))` when the server
/// failed the input.
async fn next_input(p: &mut RemoteRun, lines: &mut Lines) -> Result<(), Option<u8>> {
    let turn = loop {
        let Some(next) = lines.ask_prompt().await else {
            return Err(None);
        };
        match p.client.submit_input(&p.session.to_string(), &next).await {
            Ok(keel_client::api::InputOutcome::Turn(turn)) => break turn,
            Ok(keel_client::api::InputOutcome::Command(c)) => {
                println!("{}", c.output);
                if let Some(new) = c.new_session_id.and_then(|s| s.parse().ok()) {
                    p.session = new;
                    p.state = SessionState::default();
                }
            }
            Err(e) if e.status() == Some(422) => {
                eprintln!("keel: {}", explain(&p.client, e));
            }
            Err(e) => {
                eprintln!("keel: {}", explain(&p.client, e));
                return Err(Some(exit::code(TerminalReason::Failed)));
            }
        }
    };
    p.turn = turn.turn_id.parse().ok();
    p.continues = true;
    p.started = Instant::now();
    Ok(())
}

/// Sends `text` to the server's input pipeline: the turn it queued, or `None` for a slash
/// command the server carried out (its answer printed on standard output: with `jsonl`, as
/// the one `{"type":"command","command","session_id","output"}` line a local run prints).
///
/// # Errors
/// The server's refusal (422 naming `input` for an unknown command or a bad `@path`).
async fn submit(
    client: &Client,
    session: &str,
    text: &str,
    jsonl: bool,
) -> anyhow::Result<Option<TurnId>> {
    match client
        .submit_input(session, text)
        .await
        .map_err(|e| explain(client, e))?
    {
        keel_client::api::InputOutcome::Turn(t) => Ok(Some(t.turn_id.parse()?)),
        keel_client::api::InputOutcome::Command(c) => {
            if jsonl {
                let line = serde_json::json!({
                    "type": "command",
                    "command": c.command,
                    "session_id": c.session_id,
                    "output": c.output,
                });
                println!("{line}");
            } else {
                println!("{}", c.output);
            }
            Ok(None)
        }
    }
}

/// Deletes the server's `session` when it is still `created` with no turn (best effort: a
/// refusal, e.g. a key that may not delete, only leaves it listed).
async fn discard_if_turnless(client: &Client, session: &str) {
    if let Ok(s) = client.get_session(session).await
        && s.status == "created"
        && s.active_turn_id.is_none()
        && s.queued_turn_ids.is_empty()
        && let Err(e) = client.delete_session(session, s.version).await
    {
        tracing::debug!(%session, "deleting a session that never had a turn: {e}");
    }
}

/// Decisions asked on a terminal during a remote run, sent to the server.
struct Remote<'a> {
    client: &'a Client,
    session: SessionId,
    state: &'a SessionState,
}

impl crate::interactive::Decider for Remote<'_> {
    async fn approval_decided(&self, id: keel_core::ApprovalId) {
        loop {
            tokio::time::sleep(crate::interactive::POLL).await;
            if let Ok(a) = self.client.get_approval(&id.to_string()).await
                && a.status != "pending"
            {
                return;
            }
        }
    }

    async fn effect_decided(&self, key: &keel_core::OperationKey) {
        loop {
            tokio::time::sleep(crate::interactive::POLL).await;
            if let Ok(effects) = self
                .client
                .list_effects(&self.session.to_string(), None)
                .await
                && effects
                    .iter()
                    .any(|e| e.operation_key == key.as_str() && e.status != "outcome_unknown")
            {
                return;
            }
        }
    }

    async fn decide_approval(
        &self,
        id: keel_core::ApprovalId,
        decision: keel_core::ApprovalDecision,
        args_hash: &str,
    ) -> anyhow::Result<()> {
        use keel_client::api::ApprovalDecisionParam as D;
        let (param, reason) = match &decision {
            keel_core::ApprovalDecision::AllowOnce => (D::AllowOnce, None),
            keel_core::ApprovalDecision::AllowForSession => (D::AllowForSession, None),
            keel_core::ApprovalDecision::Deny { reason } => (D::Deny, Some(reason.as_str())),
        };
        self.client
            .decide_approval(&id.to_string(), param, args_hash, reason)
            .await
            .map(|_| ())
            .map_err(|e| explain(self.client, e))
    }

    async fn resolve_effect(
        &self,
        key: &keel_core::OperationKey,
        decision: keel_core::EffectDecision,
    ) -> anyhow::Result<()> {
        use keel_client::api::EffectDecisionParam as D;
        let (param, reason) = match decision {
            keel_core::EffectDecision::Committed { .. } => (D::Committed, None),
            keel_core::EffectDecision::Failed { error } => (D::Failed, Some(error)),
            keel_core::EffectDecision::Retry => (D::Retry, None),
        };
        self.client
            .decide_effect(
                &self.session.to_string(),
                key.as_str(),
                param,
                reason.as_deref(),
            )
            .await
            .map(|_| ())
            .map_err(|e| explain(self.client, e))
    }

    async fn workspace(&self) -> Option<std::path::PathBuf> {
        serde_json::from_value::<keel_runtime::SessionConfig>(self.state.config.clone())
            .ok()
            .map(|c| c.workspace)
    }
}
