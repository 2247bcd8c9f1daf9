//! The commands that act on a session through the runtime: `run`, `resume`, `cancel`, `resolve`,
//! `sessions close`.

use std::io::{IsTerminal, Read};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use anyhow::Context;
use keel_core::{EffectDecision, OperationKey, SessionId, SessionStatus, TerminalReason};
use keel_runtime::Runtime;
use keel_store::Store;

use crate::cli::{GlobalArgs, OutputArg, RunArgs};
use crate::config::{Config, Locations, OutputFormat};
use crate::exit;
use crate::interactive::Lines;
use crate::output::{JsonlPrinter, Printer, ResultLine, TextPrinter};
use crate::run::{
    Driven, Prepared, ResumeChanges, SharedPrinter, drive, prepare_resume, prepare_run, result_of,
};
use crate::store::local_tenant;

/// How a run talks to its user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `--output jsonl`.
    Jsonl,
    /// Text, not on a terminal.
    Text,
    /// Text on a terminal: live output, questions, follow-ups.
    Interactive,
}

/// The mode of `output` here (interactive when both standard streams are a terminal).
pub fn mode_of(output: OutputFormat) -> Mode {
    match output {
        OutputFormat::Jsonl => Mode::Jsonl,
        OutputFormat::Text if std::io::stdout().is_terminal() && std::io::stdin().is_terminal() => {
            Mode::Interactive
        }
        OutputFormat::Text => Mode::Text,
    }
}

/// The printer of a mode.
pub fn printer_for(mode: Mode) -> SharedPrinter {
    match mode {
        Mode::Jsonl => Arc::new(Mutex::new(JsonlPrinter)),
        Mode::Text => Arc::new(Mutex::new(TextPrinter::new(false))),
        Mode::Interactive => Arc::new(Mutex::new(TextPrinter::new(true))),
    }
}

/// Reads the prompt: `-` means standard input.
fn read_prompt(prompt: Option<String>) -> anyhow::Result<Option<String>> {
    match prompt.as_deref() {
        Some("-") => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("cannot read the prompt from standard input")?;
            Ok(Some(text))
        }
        _ => Ok(prompt),
    }
}

/// What `run`/`resume` should do.
#[derive(Debug, Clone)]
pub enum Target {
    /// Start a session.
    New,
    /// Continue one.
    Resume(String),
}

/// `keel run` / `keel resume`: returns the exit code of the terminal reason. Errors before the
/// session runs are reported on one line (and, with `--output jsonl`, as a `failed` result line
/// naming the session when it is known); a [`exit::UsageError`] exits 2 with no result line.
pub fn execute(
    global: &GlobalArgs,
    args: &RunArgs,
    prompt: Option<String>,
    target: Target,
) -> ExitCode {
    let started = Instant::now();
    let flag_jsonl = args.output == Some(OutputArg::Jsonl);
    // The session a resume names, for its result line even when it cannot be resumed.
    let known_session = match &target {
        Target::Resume(s) => crate::sessions::parse_session(s).ok(),
        Target::New => None,
    };
    let fail = |error: anyhow::Error, jsonl: bool| {
        let text = if global.verbose {
            format!("{error:?}")
        } else {
            crate::report::describe(&error)
        };
        eprintln!("keel: {text}");
        if error.is::<exit::UsageError>() {
            return ExitCode::from(exit::USAGE);
        }
        if jsonl {
            let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            let mut line = ResultLine::startup_failure(crate::report::describe(&error), elapsed);
            line.session_id = known_session;
            JsonlPrinter.result(&line);
        }
        ExitCode::from(exit::code(TerminalReason::Failed))
    };
    let rt = match crate::cli::tokio_runtime() {
        Ok(rt) => rt,
        Err(e) => return fail(e, flag_jsonl),
    };
    rt.block_on(async {
        crate::signals::install();
        // One reader of standard input for the whole process, started when first needed.
        let mut lines: Option<Lines> = None;
        let fresh = matches!(target, Target::New);
        let (prepared, mode, config) = match prepare(global, args, prompt, target, &mut lines).await
        {
            Ok(x) => x,
            Err((e, _)) if e.is::<LeftWithoutPrompt>() => return ExitCode::SUCCESS,
            Err((e, jsonl)) => return fail(e, jsonl || flag_jsonl),
        };
        let code = converse(prepared, fresh, mode, &config, &mut lines).await;
        crate::mcp::shutdown_all().await;
        ExitCode::from(code)
    })
}

type PrepareError = (anyhow::Error, bool);

/// The person left at the first prompt (empty line, `exit`, Ctrl-D): nothing ran, exit 0.
#[derive(Debug, thiserror::Error)]
#[error("left without a prompt")]
pub(crate) struct LeftWithoutPrompt;

async fn prepare(
    global: &GlobalArgs,
    args: &RunArgs,
    prompt: Option<String>,
    target: Target,
    lines: &mut Option<Lines>,
) -> Result<(Prepared, Mode, Config), PrepareError> {
    let locations = Locations::from_env();
    let overrides = args.overrides(global.store.as_deref());
    let plain = |e: anyhow::Error| (e, false);
    // A resume reads the session's own workspace file below; finding the session needs only
    // the store, which a workspace file never sets.
    let load = if matches!(target, Target::New) {
        Config::load
    } else {
        Config::load_user
    };
    let config =
        load(global.workspace.as_deref(), &locations, &overrides).map_err(|e| plain(e.into()))?;
    if matches!(target, Target::New) {
        print_notices(&config);
    }
    let jsonl = config.output == OutputFormat::Jsonl;
    let with_mode = |e: anyhow::Error| (e, jsonl);
    let mode = mode_of(config.output);
    let prompt = read_prompt(prompt).map_err(with_mode)?;
    match target {
        Target::New => {
            let prompt = match prompt {
                Some(p) => p,
                None if mode == Mode::Interactive => {
                    match lines.get_or_insert_with(Lines::spawn).ask_prompt().await {
                        Some(p) => p,
                        None => return Err(with_mode(anyhow::Error::new(LeftWithoutPrompt))),
                    }
                }
                None if !std::io::stdin().is_terminal() => read_prompt(Some("-".into()))
                    .map_err(with_mode)?
                    .unwrap_or_default(),
                None => String::new(),
            };
            if prompt.trim().is_empty() {
                return Err(with_mode(no_prompt()));
            }
            if let Some(e) = base_url_unused(args, &config.model_route, None) {
                return Err(with_mode(e));
            }
            let input = crate::input::input_options(&config, mode == Mode::Interactive);
            let mut prompt = prompt;
            let p = loop {
                match prepare_run(&config, &prompt, &input).await {
                    Ok(p) => break p,
                    // On a terminal, input the pipeline refused (an unknown command, a bad
                    // @path) is said and the prompt asked again, as for a follow-up.
                    Err(e) if mode == Mode::Interactive && e.is::<exit::UsageError>() => {
                        eprintln!("keel: {}", crate::report::describe(&e));
                        prompt = match lines.get_or_insert_with(Lines::spawn).ask_prompt().await {
                            Some(p) => p,
                            None => {
                                return Err(with_mode(anyhow::Error::new(LeftWithoutPrompt)));
                            }
                        };
                    }
                    Err(e) => return Err(with_mode(e)),
                }
            };
            Ok((p, mode, config))
        }
        Target::Resume(session) => {
            let session = crate::sessions::parse_session(&session).map_err(with_mode)?;
            if prompt.as_deref().is_some_and(|p| p.trim().is_empty()) {
                return Err(with_mode(anyhow::Error::new(exit::UsageError(format!(
                    "the prompt is empty: give a follow-up (keel resume {session} \"…\"), or none to continue an unfinished turn"
                )))));
            }
            let store = crate::store::open(&config.store)
                .await
                .map_err(|e| with_mode(e.into()))?;
            // The session's workspace, unless --workspace was given; its keel.toml supplies
            // provider settings (keys, base URLs).
            let pinned = crate::run::pinned(&store, session)
                .await
                .map_err(with_mode)?;
            let workspace = global
                .workspace
                .clone()
                .unwrap_or_else(|| pinned.config.workspace.clone());
            let config = Config::load(Some(&workspace), &locations, &overrides)
                .map_err(|e| with_mode(e.into()))?;
            print_notices(&config);
            let changes = resume_changes(args, &config);
            // `--model` (keel.toml's `model` never): the route to re-pin the session to.
            let new_route = args
                .model
                .is_some()
                .then_some(config.model_route.as_slice());
            let route = new_route.unwrap_or(&pinned.release.definition.model_route);
            if let Some(e) = base_url_unused(args, route, Some(session)) {
                return Err(with_mode(e));
            }
            let mode = mode_of(config.output);
            let input = crate::input::input_options(&config, mode == Mode::Interactive);
            let p = prepare_resume(
                store,
                &config,
                session,
                prompt.as_deref(),
                new_route,
                &changes,
                &input,
            )
            .await
            .map_err(with_mode)?;
            Ok((p, mode, config))
        }
    }
}

/// The usage error of a run without a prompt (none given, or only whitespace).
pub(crate) fn no_prompt() -> anyhow::Error {
    anyhow::Error::new(exit::UsageError(
        "no prompt: give one, e.g. keel run \"fix the failing test\", or pipe it on standard input (`-` reads it from there)".into(),
    ))
}

/// `--base-url` given for a route where no model takes it (only `openai:` and
/// `openai-responses:` models do): a usage error naming the route, or `None`.
fn base_url_unused(
    args: &RunArgs,
    route: &[String],
    session: Option<SessionId>,
) -> Option<anyhow::Error> {
    args.base_url.as_ref()?;
    if route.is_empty() || route.iter().any(|m| crate::config::base_url_applies(m)) {
        return None;
    }
    let whose = match session {
        Some(s) => format!("session {s} runs model route {}", route.join(", ")),
        None => format!("the model route is {}", route.join(", ")),
    };
    Some(anyhow::Error::new(exit::UsageError(format!(
        "--base-url applies to openai: and openai-responses: models only, and {whose}; drop --base-url, or give --model openai:MODEL with it"
    ))))
}

/// Prints what the workspace's keel.toml was not allowed (or was trusted) to do, on standard
/// error, one line each.
fn print_notices(config: &Config) {
    for notice in &config.notices {
        eprintln!("{notice}");
    }
}

/// The settings flags given to `resume`, as parsed into `config` (which also holds keel.toml's
/// values: only the flags given change the session).
pub(crate) fn resume_changes(args: &RunArgs, config: &Config) -> ResumeChanges {
    ResumeChanges {
        permission_mode: args.permission_mode.map(|_| config.permission_mode),
        sandbox: args.sandbox.map(|_| config.sandbox),
        sandbox_network: args.sandbox_network,
        max_steps: args.max_steps,
        max_cost_usd: args.max_cost_usd,
        max_wall_time_ms: args.timeout.as_ref().and(config.budget.max_wall_time_ms),
        tool_timeout_ms: args.tool_timeout.as_ref().map(|_| config.timeouts.tool_ms),
        base_url: args.base_url.clone(),
        keep_reasoning: args.keep_reasoning.then_some(true),
    }
}

/// Drives the session; in interactive mode asks about pending actions and reads follow-ups,
/// each compiled by the input pipeline ([`crate::input`]): a prompt becomes a turn, a built-in
/// command is carried out here without a model call, a refused input is said and the prompt
/// asked again. Headless, a command given as the prompt is carried out and ends the run.
///
/// The session `keel run` started (`fresh`) is deleted at the end when it never got a turn —
/// only commands answered locally ran in it — so `keel run "/help"` leaves no empty session
/// behind in `keel sessions list` and the `/resume` picker. Sessions `/clear` named (the new
/// one, and the old one it says is kept) stay.
async fn converse(
    mut p: Prepared,
    fresh: bool,
    mode: Mode,
    config: &Config,
    lines: &mut Option<Lines>,
) -> u8 {
    let created = p.session;
    let mut started_here = fresh.then_some(p.session);
    let code = converse_in(&mut p, &mut started_here, mode, config, lines).await;
    // The lease `prepare_run` kept, if no run took it (a command ran instead of a turn).
    p.runtime.release_held(p.tenant, created).await;
    if let Some(session) = started_here {
        discard_if_empty(&p, session).await;
    }
    code
}

/// Deletes `session` when it never had a turn (see [`converse`]); a failure is only logged.
/// The session's row answers first: a session whose status moved on from `created` had a turn,
/// and its journal (every event of the run) is not read again to say so.
async fn discard_if_empty(p: &Prepared, session: keel_core::SessionId) {
    if p.runtime
        .store()
        .get_session(p.tenant, session)
        .await
        .is_ok_and(|r| r.status != SessionStatus::Created)
    {
        return;
    }
    let empty = match p.runtime.view(p.tenant, session).await {
        Ok(view) => view.state.turn_order.is_empty() && view.state.status == SessionStatus::Created,
        Err(_) => false,
    };
    if empty && let Err(e) = p.runtime.store().delete_session(p.tenant, session).await {
        tracing::debug!(%session, "deleting a session that never had a turn: {e}");
    }
}

/// [`converse`]'s loop; a `/clear` keeps the session started here (`started_here` = `None`).
async fn converse_in(
    p: &mut Prepared,
    started_here: &mut Option<keel_core::SessionId>,
    mode: Mode,
    config: &Config,
    lines: &mut Option<Lines>,
) -> u8 {
    let printer = printer_for(mode);
    let mut lines = if mode == Mode::Interactive {
        Some(lines.get_or_insert_with(Lines::spawn))
    } else {
        None
    };
    let input = crate::input::input_options(config, lines.is_some());
    if let Ok(view) = p.runtime.view(p.tenant, p.session).await {
        printer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .seed(&view.state);
    }
    let mut code = 0;
    let mut drive_now = true;
    loop {
        if let Some(command) = p.command.take() {
            let reborrowed = lines.as_deref_mut();
            let before = p.session;
            let result = crate::input::run_command(p, &command, config, &input, reborrowed).await;
            if matches!(command, keel_runtime::input::Command::Clear)
                && p.session != before
                && *started_here == Some(before)
            {
                // `/clear` made a new session of the one started here: both it and the one it
                // keeps stay. (Cleared elsewhere, after a `/resume`, the one started here is
                // still discarded if it never had a turn.)
                *started_here = None;
            }
            match result {
                Ok(work) => {
                    code = 0;
                    drive_now = work;
                }
                Err(e) => {
                    eprintln!("keel: {}", crate::report::describe(&e));
                    // Interactive, a refused command ran nothing: the exit code stays that of
                    // the last thing that ran (like a refused prompt's).
                    if lines.is_none() {
                        code = if e.is::<exit::UsageError>() {
                            exit::USAGE
                        } else {
                            exit::code(TerminalReason::Failed)
                        };
                    }
                    drive_now = false;
                }
            }
            if lines.is_none() {
                return code;
            }
        }
        if drive_now {
            let (driven, next_seq) = drive(p, &printer).await;
            p.from_seq = next_seq;
            if let (Driven::Finished(o), Some(lines)) = (&driven, lines.as_mut())
                && o.status == SessionStatus::RequiresAction
                && !o.pending.is_empty()
            {
                printer
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .pause();
                let decided = crate::interactive::decide_pending(p, &o.pending, lines).await;
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
            let result = result_of(p, &driven).await;
            printer
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .result(&result);
            code = exit::code(result.terminal_reason);
            if matches!(driven, Driven::Interrupted) {
                return code;
            }
        }
        let Some(lines) = lines.as_mut() else {
            return code;
        };
        let Some(next) = lines.ask_prompt().await else {
            return code;
        };
        match crate::input::submit(p, &next, &input).await {
            Ok(Ok(turn)) => {
                p.turn = Some(turn);
                p.continues = true;
                p.started = Instant::now();
                drive_now = true;
            }
            Ok(Err(command)) => {
                p.command = Some(command);
                drive_now = false;
            }
            Err(e) if e.is::<exit::UsageError>() => {
                // Refused by the pipeline (unknown command, a bad @path): nothing ran.
                eprintln!("keel: {}", crate::report::describe(&e));
                drive_now = false;
            }
            Err(e) => {
                eprintln!("keel: {e}");
                return exit::code(TerminalReason::Failed);
            }
        }
    }
}

/// A runtime for commands that do not sample a model themselves (see
/// [`crate::run::bare_runtime`]).
fn bare_runtime(store: Arc<dyn Store>, config: &crate::config::Config) -> anyhow::Result<Runtime> {
    crate::run::bare_runtime(store, config)
}

/// `keel resolve KEY --as committed|failed|retry`.
///
/// # Errors
/// Unknown effect, an effect not waiting for a decision, store errors.
pub fn resolve(
    global: &GlobalArgs,
    key: &str,
    decision: EffectDecision,
) -> anyhow::Result<ExitCode> {
    let config = crate::cli::store_config(global)?;
    crate::cli::tokio_runtime()?.block_on(async move {
        let store = crate::store::open(&config.store).await?;
        let key = OperationKey(key.trim().to_owned());
        // An operation key is `<session>/<step>/<call>`.
        let session = key
            .as_str()
            .split('/')
            .next()
            .and_then(|s| s.parse::<SessionId>().ok())
            .with_context(|| {
                format!(
                    "{:?} is not an operation key (`keel sessions show SESSION` lists them)",
                    key.as_str()
                )
            })?;
        let (_, state) = crate::sessions::load_state(&store, session).await?;
        let tool = state
            .effects
            .get(&key)
            .and_then(|e| state.tool_calls.get(&e.tool_call_id))
            .map(|c| c.name.clone())
            .with_context(|| format!("session {session} has no effect {key}"))?;
        let verb = match decision {
            EffectDecision::Committed { .. } => "committed",
            EffectDecision::Failed { .. } => "failed",
            EffectDecision::Retry => "to be retried",
        };
        // The same decision again (a repeated command) succeeds quietly, as `keel approve` does.
        if state.effects.get(&key).is_some_and(|e| {
            e.decision
                .as_ref()
                .is_some_and(|d| std::mem::discriminant(d) == std::mem::discriminant(&decision))
        }) {
            println!(
                "effect {key} ({tool}) marked {verb} (it already was); `keel resume {session}` continues the session"
            );
            return Ok(ExitCode::SUCCESS);
        }
        let rt = bare_runtime(store, &config)?;
        rt.resolve_effect(local_tenant(), session, &key, decision.clone())
            .await
            .with_context(|| format!("cannot resolve effect {key}"))?;
        println!(
            "effect {key} ({tool}) marked {verb}; `keel resume {session}` continues the session"
        );
        Ok(ExitCode::SUCCESS)
    })
}

/// `keel cancel SESSION`: journals the cancellation of the session's running (or oldest queued)
/// turn. When another process runs the session, a durable `cancel_turn` intent asks it to, and
/// this returns once that process has recorded it (keel-runtime's `Runtime::cancel_turn`).
///
/// # Errors
/// Unknown session, no turn to cancel, a runner that did not answer, store errors.
pub fn cancel(global: &GlobalArgs, session: &str) -> anyhow::Result<ExitCode> {
    let config = crate::cli::store_config(global)?;
    let session = crate::sessions::parse_session(session)?;
    crate::cli::tokio_runtime()?.block_on(async move {
        let store = crate::store::open(&config.store).await?;
        crate::sessions::get_session(&store, session).await?;
        let rt = bare_runtime(store, &config)?;
        let turn = rt
            .cancel_turn(local_tenant(), session)
            .await
            .with_context(|| format!("cannot cancel session {session}"))?;
        println!(
            "cancelled turn {turn} of session {session}; `keel resume {session}` continues it"
        );
        Ok(ExitCode::SUCCESS)
    })
}

/// `keel sessions close SESSION`: closes the session for good (keel-runtime's
/// `Runtime::close_session`); closing a closed session succeeds and says so.
///
/// # Errors
/// Unknown session, an open turn (running, waiting on a decision, queued), another process
/// running the session, store errors.
pub async fn close(
    store: Arc<dyn Store>,
    config: &crate::config::Config,
    session: SessionId,
) -> anyhow::Result<()> {
    let record = crate::sessions::get_session(&store, session).await?;
    if record.status == SessionStatus::Closed {
        println!("session {session} is already closed");
        return Ok(());
    }
    let rt = bare_runtime(store.clone(), config)?;
    rt.close_session(local_tenant(), session)
        .await
        .with_context(|| format!("cannot close session {session}"))?;
    let removed = matches!(
        store.get_session(local_tenant(), session).await,
        Err(keel_store::StoreError::NotFound { .. })
    );
    if removed {
        println!(
            "removed session {session}: its creation never completed (no `session.created`), \
             nothing ran"
        );
    } else {
        println!("closed session {session}; it takes no more input");
    }
    Ok(())
}
