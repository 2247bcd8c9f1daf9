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

/// The release a configuration describes.
pub fn release_of(config: &Config) -> Release {
    let route = config.model_route.clone();
    let instructions = if config.instructions.trim().is_empty() {
        DEFAULT_INSTRUCTIONS.to_owned()
    } else {
        config.instructions.clone()
    };
    Release::new(AgentDefinition {
        name: crate::config::MAIN_AGENT.into(),
        model_route: route,
        instructions,
        tools: config.tools.clone(),
        policy: serde_json::json!({
            "allow": config.policy.allow,
            "ask": config.policy.ask,
            "deny": config.policy.deny,
        }),
        budget: config.budget,
        mcp_servers: config
            .merged
            .mcp_servers
            .iter()
            .map(|(name, server)| {
                (
                    name.clone(),
                    serde_json::to_value(server).unwrap_or(serde_json::Value::Null),
                )
            })
            .collect(),
        agents: config.agents.clone(),
    })
}

/// The session settings a configuration describes. Its policy rules are not settings: they are
/// the release's ([`release_of`]), which the runtime enforces.
pub fn session_config_of(config: &Config) -> SessionConfig {
    SessionConfig {
        workspace: config.workspace.clone(),
        permission_mode: config.permission_mode,
        sandbox: config.sandbox,
        sandbox_network: config.sandbox_network,
        turn_budget: config.budget,
        tool_timeout_ms: Some(config.timeouts.tool_ms),
        model_first_token_timeout_ms: config.timeouts.first_token_ms,
        model_total_timeout_ms: config.timeouts.model_total_ms,
        stream_idle_timeout_ms: config.timeouts.stream_idle_ms,
        keep_reasoning: config.keep_reasoning,
        context_window_tokens: config.context_window,
        // Every provider key keel reads is a secret, like the `[env]` values marked secret.
        secret_env: config
            .env
            .iter()
            .filter(|(name, v)| v.is_secret(name))
            .map(|(name, _)| name.clone())
            .chain(provider_key_env(config))
            .collect(),
        host: config
            .base_url
            .iter()
            .map(|url| {
                (
                    HOST_BASE_URL.to_owned(),
                    serde_json::Value::from(url.as_str()),
                )
            })
            .collect(),
        ..SessionConfig::default()
    }
}

/// Settings given to `keel resume` that change the session's config; `None` keeps the session's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResumeChanges {
    /// `--permission-mode`.
    pub permission_mode: Option<keel_tools::policy::PermissionMode>,
    /// `--sandbox`.
    pub sandbox: Option<keel_tools::sandbox::SandboxMode>,
    /// `--sandbox-network[=BOOL]`.
    pub sandbox_network: Option<bool>,
    /// `--max-steps`: per-turn steps.
    pub max_steps: Option<u32>,
    /// `--max-cost-usd`: per-turn cost, USD.
    pub max_cost_usd: Option<f64>,
    /// `--timeout`: per-turn wall-clock limit, ms.
    pub max_wall_time_ms: Option<u64>,
    /// `--tool-timeout`: limit of every tool call, ms.
    pub tool_timeout_ms: Option<u64>,
    /// `--base-url`: the OpenAI-compatible server, kept in `host.base_url`.
    pub base_url: Option<String>,
    /// `--keep-reasoning`: journal the model's reasoning from now on.
    pub keep_reasoning: Option<bool>,
}

impl ResumeChanges {
    /// Whether any setting is to change.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Applies the given settings to `c`.
    pub fn apply(&self, c: &mut SessionConfig) {
        if let Some(m) = self.permission_mode {
            c.permission_mode = m;
        }
        if let Some(m) = self.sandbox {
            c.sandbox = m;
        }
        if let Some(n) = self.sandbox_network {
            c.sandbox_network = n;
        }
        if let Some(n) = self.max_steps {
            c.turn_budget.max_steps = Some(n);
        }
        if let Some(usd) = self.max_cost_usd {
            c.turn_budget.max_cost_usd = Some(usd);
        }
        if let Some(ms) = self.max_wall_time_ms {
            c.turn_budget.max_wall_time_ms = Some(ms);
        }
        if let Some(ms) = self.tool_timeout_ms {
            c.tool_timeout_ms = Some(ms);
        }
        if let Some(keep) = self.keep_reasoning {
            c.keep_reasoning = keep;
        }
        if let Some(url) = &self.base_url {
            c.host.insert(
                HOST_BASE_URL.to_owned(),
                serde_json::Value::from(url.as_str()),
            );
        }
    }
}

/// The base URL a session pinned: `host.base_url`, else none (older sessions carry it in their
/// route as `openai:MODEL@URL`, which [`build_route`] reads).
pub fn pinned_base_url(config: &SessionConfig) -> Option<String> {
    config
        .host
        .get(HOST_BASE_URL)
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
}

/// The environment variables this configuration reads provider keys from: the defaults of
/// [`keel_runtime::redact::PROVIDER_KEY_ENV`] and every `[providers.NAME] api_key_env`.
pub fn provider_key_env(config: &Config) -> Vec<String> {
    let mut names: Vec<String> = keel_runtime::redact::PROVIDER_KEY_ENV
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    for s in config.providers.values() {
        if let Some(name) = &s.api_key_env
            && !names.contains(name)
        {
            names.push(name.clone());
        }
    }
    names
}

/// The variables of keel's environment that no program keel starts gets unless the user
/// config passes them (tools, hooks, MCP stdio servers): the provider keys keel reads and the
/// span exporter's headers (credentials for the collector).
pub fn withheld_env(config: &Config) -> Vec<String> {
    let mut names = provider_key_env(config);
    names.extend(crate::telemetry::SECRET_ENV.iter().map(|s| (*s).to_owned()));
    names
}

/// Secrets this configuration holds by value: `[providers.NAME] api_key` and `[env]` values
/// that are secret. The runtime redacts them wherever they appear.
pub fn secret_values(config: &Config) -> Vec<String> {
    config
        .providers
        .values()
        .filter_map(|s| s.api_key.clone())
        .chain(
            config
                .env
                .iter()
                .filter(|(name, v)| v.is_secret(name))
                .filter_map(|(_, v)| v.value().map(str::to_owned)),
        )
        .collect()
}

/// The `[env]` values every tool process gets (entries with a value).
pub fn tool_env(config: &Config) -> Vec<(String, String)> {
    config
        .env
        .iter()
        .filter_map(|(name, v)| v.value().map(|v| (name.clone(), v.to_owned())))
        .collect()
}

/// The `[env]` entries without a value: keel's own value of each is passed to tools, even for a
/// name that looks secret or is a provider key.
pub fn passed_env(config: &Config) -> Vec<String> {
    config
        .env
        .iter()
        .filter(|(_, v)| v.value().is_none())
        .map(|(name, _)| name.clone())
        .collect()
}

/// What a confined command must not see of keel's own files: the user data directory (the
/// default store, the seal key), the user config directory, the seal key file named by
/// `$KEEL_SEAL_KEY_FILE`, and a SQLite store elsewhere (with its `-wal`, `-shm` and `-journal`
/// files).
pub fn hidden_paths(config: &Config) -> Vec<std::path::PathBuf> {
    let locations = crate::config::Locations::from_env();
    // The sandbox hides what exists. A user config directory that does not exist yet would be
    // left open, and with the workspace at (or above) it a confined command could create it
    // with a keel.toml every later run trusts fully: create it (0700, empty) so it is hidden.
    if let Some(dir) = locations
        .user_file
        .as_deref()
        .and_then(std::path::Path::parent)
        .filter(|d| !d.exists())
    {
        use std::os::unix::fs::DirBuilderExt;
        if let Err(e) = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
        {
            tracing::warn!(
                "could not create the user configuration directory {} to hide it from confined commands: {e}",
                dir.display()
            );
        }
    }
    let mut paths: Vec<std::path::PathBuf> = Vec::new();
    paths.extend(locations.data_dir);
    paths.extend(
        locations
            .user_file
            .as_deref()
            .and_then(std::path::Path::parent)
            .map(std::path::Path::to_path_buf),
    );
    // A user config kept elsewhere and linked in (dotfiles): its real file and directory too
    // (it may hold an `api_key` or secret `[env]` values).
    if let Some(real) = locations
        .user_file
        .as_deref()
        .and_then(|f| std::fs::canonicalize(f).ok())
    {
        paths.extend(real.parent().map(std::path::Path::to_path_buf));
        paths.push(real);
    }
    if let Some(file) = std::env::var_os(crate::store::SEAL_KEY_ENV).filter(|p| !p.is_empty()) {
        paths.push(file.into());
    }
    let store = &config.store;
    if !(store.starts_with("postgres://") || store.starts_with("postgresql://")) {
        let db = store.strip_prefix("sqlite://").unwrap_or(store);
        for suffix in ["", "-wal", "-shm", "-journal"] {
            paths.push(format!("{db}{suffix}").into());
        }
    }
    paths
}

/// The options of every runtime a `keel` host builds — `run`, `resume`, the commands that act
/// on a session (`approve`, `deny`, `cancel`, `resolve`, `sessions close`) and `keel serve` —
/// one place, so no host forgets a secret to redact, a provider key to withhold, an `[env]`
/// value to pass or one of keel's own files to hide from confined commands: the seal key, the
/// provider keys keel reads (withheld from tools, and secrets: the runtime redacts their
/// values and seals them with each session it loads), the configuration's secret values, the
/// `[env]` values and passed names, and the paths a confined shell must not see. The secret
/// values also reach the log redactor ([`crate::logging::add_secrets`]).
///
/// # Errors
/// A seal key file that cannot be read or created (see [`crate::store::seal_key`]).
pub fn host_options(config: &Config, worker_name: &str) -> anyhow::Result<RuntimeOptions> {
    let withheld_env = withheld_env(config);
    let mut secret_values = secret_values(config);
    secret_values.extend(crate::telemetry::secret_values());
    let names: Vec<&str> = withheld_env.iter().map(String::as_str).collect();
    crate::logging::add_secrets(
        &keel_runtime::redact::env_values(&names)
            .into_iter()
            .chain(secret_values.iter().cloned())
            .collect::<Vec<_>>(),
    );
    Ok(RuntimeOptions {
        worker_name: worker_name.into(),
        seal_key: crate::store::seal_key()?,
        // Provider keys never reach a tool process (they stay redacted in any case), unless
        // the user config's `[env]` passes one explicitly.
        withheld_env,
        secret_values,
        tool_env: tool_env(config),
        passed_env: passed_env(config),
        hidden_paths: hidden_paths(config),
        hooks: keel_runtime::hooks::Hooks::new(&config.hooks)
            .context("the [hooks] configuration")?,
        subagents: subagent_options(config),
        memory: config.memory.unwrap_or_default(),
        ..RuntimeOptions::default()
    })
}

/// `[subagents]` and the models of child sessions: a child's route is built like the
/// session's (same providers, keys and base URL).
fn subagent_options(config: &Config) -> keel_runtime::SubagentOptions {
    let defaults = keel_runtime::SubagentOptions::default();
    let base = config.clone();
    keel_runtime::SubagentOptions {
        max_depth: config.subagents.max_depth.unwrap_or(defaults.max_depth),
        max_concurrent: config
            .subagents
            .max_concurrent
            .unwrap_or(defaults.max_concurrent),
        max_descendants: config
            .subagents
            .max_descendants
            .unwrap_or(defaults.max_descendants),
        models: Some(Arc::new(move |route: &[String]| {
            let mut c = base.clone();
            c.model_route = route.to_vec();
            build_route(&c)
                .map(|m| Arc::new(m) as Arc<dyn ModelClient>)
                .map_err(|e| e.to_string())
        })),
    }
}

/// A runtime that offers the tools of `release`'s MCP servers (started now in the workspace,
/// a notice on standard error for each that did not start; see [`crate::mcp::provider`]).
pub(crate) async fn runtime_with_mcp(
    config: &Config,
    store: Arc<dyn Store>,
    model: Arc<dyn ModelClient>,
    release: &Release,
) -> anyhow::Result<Runtime> {
    runtime_with_tools(
        config,
        store,
        model,
        release,
        ToolRegistry::with_builtins().context("cannot set up the built-in tools")?,
        Vec::new(),
        |pool| pool,
    )
    .await
}

/// As [`runtime_with_mcp`] over `tools` instead of the built-in tools (`keel acp`'s file
/// tools through the editor), the release's MCP pool given to the runtime as `wrap` makes it
/// (`keel acp` puts the editor's withheld values back, [`crate::acp::mcp::Unsealing`]; the
/// pool is started with `release` as given), and `secrets` redacted from every event as the
/// configuration's secret values are (sealed in the session's `secrets` row); the memory tools
/// are added as for every runtime.
pub(crate) async fn runtime_with_tools(
    config: &Config,
    store: Arc<dyn Store>,
    model: Arc<dyn ModelClient>,
    release: &Release,
    mut tools: ToolRegistry,
    secrets: Vec<String>,
    wrap: impl FnOnce(
        Arc<dyn keel_tools::tool::ToolProvider>,
    ) -> Arc<dyn keel_tools::tool::ToolProvider>,
) -> anyhow::Result<Runtime> {
    add_memory_tools(&mut tools, config, &store)?;
    let mut options = host_options(config, "keel-cli")?;
    crate::logging::add_secrets(&secrets);
    options.secret_values.extend(secrets);
    let runtime = Runtime::new(store, model, tools, options);
    if let Some(provider) = crate::mcp::provider(config, release).await? {
        runtime.set_tool_provider(wrap(provider));
    }
    Ok(runtime)
}

/// Adds the long-term memory tools over `store` to `tools` when `[memory]` enables them
/// (`keel_runtime::memory`).
///
/// # Errors
/// A memory tool's name already taken (an MCP tool cannot take it: theirs are prefixed).
pub fn add_memory_tools(
    tools: &mut ToolRegistry,
    config: &Config,
    store: &Arc<dyn Store>,
) -> anyhow::Result<()> {
    if let Some(settings) = config.memory {
        for tool in keel_runtime::memory::memory_tools(store.clone(), settings) {
            tools
                .register(tool)
                .context("cannot set up the memory tools")?;
        }
    }
    Ok(())
}

fn runtime_for(
    config: &Config,
    store: Arc<dyn Store>,
    model: Arc<dyn ModelClient>,
) -> anyhow::Result<Runtime> {
    let mut tools = ToolRegistry::with_builtins().context("cannot set up the built-in tools")?;
    add_memory_tools(&mut tools, config, &store)?;
    Ok(Runtime::new(
        store,
        model,
        tools,
        host_options(config, "keel-cli")?,
    ))
}

/// A runtime for commands that act on a session without sampling a model themselves (its
/// model is an empty script), with the same options as every other ([`host_options`]).
///
/// # Errors
/// As [`host_options`]; the built-in tools failing to set up.
pub fn bare_runtime(store: Arc<dyn Store>, config: &Config) -> anyhow::Result<Runtime> {
    let model = Arc::new(keel_model::ScriptedModel::new(keel_model::Script::parse(
        "(no model)",
        "",
    )?));
    runtime_for(config, store, model)
}

/// Creates a session for `config` and journals `prompt` as its first turn.
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
        .create_session(tenant, &release, session_config_of(config))
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
            p.continues = false;
            p.command = Some(command);
        }
        Err(e) => {
            // Refused before anything ran: the new session holds nothing but its creation
            // (as a run without a prompt, the refused input leaves no session).
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

/// Prints subscription items until told the version to stop after, then through it. Counts
/// what it printed itself: the subscription reads ahead, so its `next_seq` may be past events
/// it has not handed out yet.
async fn pump(
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

fn tracing_note(printer: &SharedPrinter, text: &str) {
    printer
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .note(text);
}

/// Whether another live process holds the session's lease (it runs the session now).
async fn run_elsewhere(p: &Prepared) -> bool {
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
/// human, and takes over if that process goes away with work left.
async fn run_or_follow(p: &Prepared) -> keel_runtime::Result<RunOutcome> {
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
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The approvals a session waits on, as the runtime reports them.
async fn pending_approvals(p: &Prepared, state: &keel_core::SessionState) -> Vec<PendingAction> {
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
    let run = run_or_follow(p);
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
    let view = p.runtime.view(p.tenant, p.session).await.ok();
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
            r.error = Some(crate::report::describe(e));
            turn_stats(p.turn, &mut r);
        }
        Driven::Finished(o) if o.status == SessionStatus::RequiresAction => {
            r.terminal_reason = TerminalReason::RequiresAction;
            r.pending = o.pending.clone();
            turn_stats(view.as_ref().and_then(|v| v.state.active_turn), &mut r);
        }
        Driven::Finished(o) => {
            let finished = p
                .turn
                .and_then(|t| o.turns.iter().find(|x| x.turn_id == t))
                .or(o.turns.last())
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
    r.over_limits = over_limits(p, &r).await;
    r
}

/// The turn limits (`tokens`, `cost`) the result's totals ended above: the session's effective
/// per-turn budget (its settings over its release's). Limits are checked before each step, so
/// the step that crosses one finishes.
async fn over_limits(p: &Prepared, r: &ResultLine) -> Vec<keel_core::BudgetLimit> {
    let Ok(pinned) = pinned(p.runtime.store(), p.session).await else {
        return Vec::new();
    };
    limits_over(
        pinned.config.turn_budget,
        Some(pinned.release.definition.budget),
        r,
    )
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
