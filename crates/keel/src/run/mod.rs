//! `keel run` and `keel resume` on the durable runtime.
//!
//! A run creates a session pinned to a content-hashed [`Release`] built from the configuration
//! (model route, instructions, tools, policy rules, budget) and a [`SessionConfig`] (workspace,
//! permission mode, sandbox, budgets, `[timeouts]`), journals the prompt, then drives [`Runtime::run`] while a
//! subscription prints the session's events. A resume reads the pinned release and the effective
//! config back from the store, so a bare `keel resume SESSION` continues with the same workspace,
//! model route (the pinned release's, never keel.toml's `model`), permission mode, sandbox and
//! budgets; `--permission-mode`, `--sandbox`, `--max-steps`, `--max-cost-usd`, `--timeout`,
//! `--tool-timeout`, `--base-url` and `--keep-reasoning` given to resume change the settings for this and every later turn
//! ([`Runtime::update_config`], journaled as `session.config_changed`). `--model` given to resume
//! re-pins the session to a release with that route and the same instructions, tools, policy and
//! budget ([`Runtime::repin`], journaled as `session.release_pinned` and printed on standard
//! error), so later resumes keep it.
//!
//! The base URL of an OpenAI-compatible server is kept in the config's host slot
//! (`host.base_url`, [`HOST_BASE_URL`]); sessions created before kept it in the release's route
//! as `openai:MODEL@URL`, which is still read.
//!
//! Ctrl-C (SIGINT) cancels the running turn durably (`turn.cancel_requested`); a second one
//! exits at once. Either way the session stays resumable.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use anyhow::Context;
use keel_core::{
    AgentDefinition, EventBody, Release, SessionId, SessionStatus, TenantId, TerminalReason,
    TurnId, TurnStatus,
};
use keel_model::ModelClient;
use keel_runtime::{PendingAction, RunOutcome, Runtime, RuntimeOptions, SessionConfig};
use keel_store::Store;
use keel_tools::ToolRegistry;
use tokio::sync::watch;

use crate::config::Config;
use crate::model_spec::{build_route, split_base_url};
use crate::output::{Printer, ResultLine};
use crate::store::local_tenant;

mod drive;
mod setup;

pub use drive::*;
pub use setup::*;

/// Instructions used when the configuration gives none.
pub const DEFAULT_INSTRUCTIONS: &str = "You are Keel, a careful coding agent working in a \
software repository (the workspace). Use the tools to inspect files before changing them, make \
the smallest change that solves the task, run the project's checks when you can, and finish \
with a short summary of what you changed.";

/// The message a bare `keel resume` sends when the last turn did not complete.
pub const CONTINUE_PROMPT: &str = "The previous turn was interrupted before it finished. \
Continue the task from where it stopped:";

/// The key of [`SessionConfig::host`] that holds the OpenAI-compatible base URL (a string).
pub const HOST_BASE_URL: &str = "base_url";

/// A printer shared by the subscription pump and the code that drives the run.
pub type SharedPrinter = Arc<Mutex<dyn Printer>>;

/// A session ready to be driven.
pub struct Prepared {
    /// The runtime (one per process).
    pub runtime: Runtime,
    /// The local tenant.
    pub tenant: TenantId,
    /// The session.
    pub session: SessionId,
    /// The first journal sequence number to print.
    pub from_seq: u64,
    /// The turn this invocation submitted, if any.
    pub turn: Option<TurnId>,
    /// Whether there is anything to run: false for a `resume` that found nothing unfinished and
    /// was given no prompt (its result line says so, see [`ResultLine::continued`]).
    pub continues: bool,
    /// When the invocation started.
    pub started: Instant,
    /// The input given was a built-in command ([`keel_runtime::input`]) to carry out before
    /// anything is driven ([`crate::input::run_command`]); no turn was submitted for it.
    pub command: Option<keel_runtime::input::Command>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("session", &self.session)
            .field("from_seq", &self.from_seq)
            .finish_non_exhaustive()
    }
}

/// Creates a session for `config` and journals `prompt` as its first turn, keeping the
/// session's lease for the run that follows ([`Runtime::create_session_held`]: one lease from
/// creation to the first run's end); when the input is a command instead, or is refused, the
/// lease is given back at once ([`Runtime::release_held`]).
///
/// # Errors
/// Model set-up (missing key, bad script), store and runtime errors.
pub async fn prepare_run(
    config: &Config,
    prompt: &str,
    input: &keel_runtime::input::InputOptions,
) -> anyhow::Result<Prepared> {
    let started = Instant::now();
    let model = Arc::new(build_route(config)?);
    let store = crate::store::open(&config.store).await?;
    let release = release_of(config);
    let runtime = runtime_with_mcp(config, store, model, &release).await?;
    let tenant = local_tenant();
    let session = runtime
        .create_session_held(tenant, &release, session_config_of(config))
        .await?;
    let mut p = Prepared {
        runtime,
        tenant,
        session,
        from_seq: 1,
        turn: None,
        continues: true,
        started,
        command: None,
    };
    match crate::input::submit(&p, prompt, input).await {
        Ok(Ok(turn)) => p.turn = Some(turn),
        Ok(Err(command)) => {
            // A command runs instead of a turn: nothing will run the session now (a command
            // such as `/model` or `/resume` works through a runtime of its own), so the lease
            // is given back before it runs.
            p.runtime.release_held(tenant, session).await;
            p.continues = false;
            p.command = Some(command);
        }
        Err(e) => {
            // Refused before anything ran: the new session holds nothing but its creation
            // (as a run without a prompt, the refused input leaves no session).
            p.runtime.release_held(tenant, session).await;
            let _ = p.runtime.store().delete_session(tenant, session).await;
            return Err(e);
        }
    }
    Ok(p)
}

/// What a stored session pins: its release and its effective session settings.
#[derive(Debug, Clone)]
pub struct Pinned {
    /// The release it runs now (`session.created`'s, or the last re-pin's).
    pub release: Release,
    /// The settings from `session.created` with every `session.config_changed` applied.
    pub config: SessionConfig,
    /// The journal's version.
    pub version: u64,
    /// The session's status (the journal's).
    pub status: SessionStatus,
}

/// Reads what `session` pinned.
///
/// # Errors
/// Unknown session, unreadable release or config.
pub async fn pinned(store: &Arc<dyn Store>, session: SessionId) -> anyhow::Result<Pinned> {
    let tenant = local_tenant();
    let record = crate::sessions::get_session(store, session).await?;
    let (events, state) = crate::sessions::load_state(store, session).await?;
    if !matches!(
        events.first().map(|e| &e.body),
        Some(EventBody::SessionCreated { .. })
    ) {
        if events.is_empty() {
            anyhow::bail!(
                "session {session} was never completed: the process creating it stopped before \
                 journaling `session.created`, and nothing ran; `keel sessions close {session}` \
                 removes it"
            );
        }
        anyhow::bail!("session {session} has no session.created event");
    }
    let config = serde_json::from_value::<SessionConfig>(state.config)
        .with_context(|| format!("session {session}: its pinned settings cannot be read"))?;
    // The journal is authoritative (the session row follows it).
    let release_id = state.release_id.unwrap_or(record.release_id);
    let release = store
        .get_release(tenant, &release_id)
        .await
        .with_context(|| format!("session {session}: cannot read its release"))?;
    Ok(Pinned {
        release,
        config,
        version: record.version,
        status: state.status,
    })
}

/// Continues `session`: with `prompt`, a new turn; without one, whatever is unfinished (an
/// active or queued turn, a decided approval) or, when the last turn was aborted or failed, a
/// turn that asks the model to continue it.
///
/// `config` supplies provider settings (keys, base URLs); the model route is the pinned
/// release's. `new_route` (`--model`) re-pins the session first to a release with that route and
/// the pinned one's instructions, tools, policy and budget — journaled, and printed on standard
/// error in text output — so it holds for later resumes too; a route equal to the pinned one
/// changes nothing. `changes` (flags given to resume) are journaled next as a config change, so
/// they hold for later turns too.
///
/// # Errors
/// Unknown session; model set-up (nothing is journaled then); a re-pin the runtime refuses (a
/// turn active or waiting on a human, the session run by another process); a change it refuses
/// (a bad value); store and runtime errors.
pub async fn prepare_resume(
    store: Arc<dyn Store>,
    config: &Config,
    session: SessionId,
    prompt: Option<&str>,
    new_route: Option<&[String]>,
    changes: &ResumeChanges,
    input: &keel_runtime::input::InputOptions,
) -> anyhow::Result<Prepared> {
    let started = Instant::now();
    let pinned = pinned(&store, session).await?;
    // Before anything is journaled: a closed session takes no re-pin, change or input.
    if pinned.status == SessionStatus::Closed {
        anyhow::bail!("session {session} is closed; start a new one with `keel run`");
    }
    let old_route = &pinned.release.definition.model_route;
    let release = match new_route {
        Some(route) if route != old_route.as_slice() => Release::new(AgentDefinition {
            model_route: route.to_vec(),
            ..pinned.release.definition.clone()
        }),
        _ => pinned.release.clone(),
    };
    let mut route_config = config.clone();
    route_config.model_route = release.definition.model_route.clone();
    // The base URL: --base-url, else the session's, else a legacy `@URL` in the route, else
    // keel.toml's.
    if let Some(url) = changes.base_url.clone() {
        route_config.base_url = Some(url);
        route_config.model_route = route_config
            .model_route
            .iter()
            .map(|s| split_base_url(s).0.to_owned())
            .collect();
    } else if let Some(url) = pinned_base_url(&pinned.config) {
        route_config.base_url = Some(url);
    }
    let model = Arc::new(build_route(&route_config)?);
    let runtime = runtime_with_mcp(config, store, model, &release).await?;
    let tenant = local_tenant();
    if release.id != pinned.release.id {
        let repin = runtime
            .repin(tenant, session, &release)
            .await
            .with_context(|| {
                format!(
                    "cannot re-pin session {session} to model route {}",
                    release.definition.model_route.join(", ")
                )
            })?;
        if let Some(r) = repin
            && config.output == crate::config::OutputFormat::Text
        {
            eprintln!(
                "keel: re-pinned session {session} from release {} to {} (model route {} -> {})",
                r.from_release_id,
                r.to_release_id,
                old_route.join(", "),
                release.definition.model_route.join(", ")
            );
        }
    }
    if !changes.is_empty() {
        runtime
            .update_config(tenant, session, |c| changes.apply(c))
            .await
            .with_context(|| format!("cannot change the settings of session {session}"))?;
    }
    let view = runtime.view(tenant, session).await?;
    let state = &view.state;
    let unfinished = state.active_turn.is_some()
        || !state.queue.is_empty()
        || state.status == SessionStatus::RequiresAction;
    let mut prepared = Prepared {
        runtime,
        tenant,
        session,
        from_seq: pinned.version + 1,
        continues: false,
        turn: None,
        started,
        command: None,
    };
    let turn = match prompt {
        Some(p) => match crate::input::submit(&prepared, p, input).await? {
            Ok(turn) => Some(turn),
            Err(command) => {
                prepared.command = Some(command);
                None
            }
        },
        None if unfinished => None,
        None => {
            let last = state.turn_order.last().and_then(|t| state.turns.get(t));
            match last {
                Some(t) if t.status != TurnStatus::Completed => {
                    let input = format!("{CONTINUE_PROMPT}\n\n{}", t.input);
                    Some(prepared.runtime.submit(tenant, session, &input).await?)
                }
                _ => None,
            }
        }
    };
    prepared.continues = turn.is_some() || (unfinished && prepared.command.is_none());
    prepared.turn = turn;
    Ok(prepared)
}
