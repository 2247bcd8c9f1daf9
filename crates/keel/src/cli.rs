//! Command-line shape: one [`Command`] enum, one variant per subcommand group, and [`run`], which
//! wires each to the modules of this crate and the library crates.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use keel_core::{ApprovalDecision, EffectDecision, SessionStatus};

use crate::config::{Config, Locations, Overrides};
use crate::exit;

/// Keel: a durable coding agent in the terminal and headless.
#[derive(Debug, Parser)]
#[command(name = "keel", version, about, after_help = exit::HELP)]
pub struct Cli {
    /// Options every command takes.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes.
#[derive(Debug, Clone, Default, Args)]
pub struct GlobalArgs {
    /// Workspace directory: what the agent works on, and where keel.toml is read (default: the
    /// current directory).
    #[arg(long, global = true, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Store: sqlite://PATH or postgres://… (default: SQLite in the user data directory,
    /// $XDG_DATA_HOME/keel/keel.db).
    #[arg(long, global = true, value_name = "URL", value_parser = parse_store_arg)]
    pub store: Option<String>,
    /// A Keel server (`keel serve`) to run `run`, `resume`, `sessions`, `approve`, `deny`,
    /// `resolve`, `cancel` and `memory` against instead of the local store, e.g. http://127.0.0.1:7878
    /// (default: $KEEL_SERVER). The API key is read from $KEEL_API_KEY. With it, `run` needs
    /// --workspace: a directory on the server, under its workspace_roots.
    #[arg(long, global = true, value_name = "URL")]
    pub server: Option<String>,
    /// A PEM certificate (or bundle) to trust for an https:// --server instead of the system's
    /// roots, e.g. the CA or self-signed certificate of `keel serve --tls-cert` (default:
    /// $KEEL_SERVER_CA).
    #[arg(long, global = true, value_name = "FILE")]
    pub server_ca: Option<PathBuf>,
    /// Show error details (cause chain and backtrace).
    #[arg(short, long, global = true)]
    pub verbose: bool,
    /// Diagnostics on standard error: text or json lines (filter: KEEL_LOG or RUST_LOG,
    /// default warn).
    #[arg(
        long,
        global = true,
        value_enum,
        value_name = "FORMAT",
        default_value_t
    )]
    pub log_format: crate::logging::LogFormat,
}

/// Settings of a run, given on the command line; they override keel.toml.
#[derive(Debug, Clone, Default, Args)]
pub struct RunArgs {
    /// Model: openai:MODEL, openai-responses:MODEL, anthropic:MODEL or script:PATH (replaces the
    /// configured route; given to resume, re-pins the session to a release with this route).
    #[arg(long, value_name = "SPEC", value_parser = parse_model_arg)]
    pub model: Option<String>,
    /// Base URL of an OpenAI-compatible server (for openai: and openai-responses: models),
    /// e.g. http://127.0.0.1:8080/v1.
    #[arg(long, value_name = "URL", value_parser = parse_base_url_arg)]
    pub base_url: Option<String>,
    /// What runs without asking.
    #[arg(long, value_enum, value_name = "MODE")]
    pub permission_mode: Option<PermissionModeArg>,
    /// How `shell` is confined.
    #[arg(long, value_enum, value_name = "MODE")]
    pub sandbox: Option<SandboxArg>,
    /// Give confined shell commands the host's IP network (package installs, test servers),
    /// keeping every other sandbox layer; they then also reach every service on this machine's
    /// loopback. `--sandbox-network=false` turns it off again on resume.
    #[arg(
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    pub sandbox_network: Option<bool>,
    /// Output: text (interactive on a terminal) or jsonl (one event per line, then a result).
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub output: Option<OutputArg>,
    /// Most model samplings per turn (1 or more).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_steps: Option<u32>,
    /// Most cost per turn, USD.
    #[arg(long, value_name = "USD", value_parser = parse_cost_arg)]
    pub max_cost_usd: Option<f64>,
    /// Wall-clock limit per turn: 500ms, 30s, 15m, 2h or plain seconds.
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout_arg)]
    pub timeout: Option<String>,
    /// Limit of every tool call (default 10m): 500ms, 30s, 15m, 2h or plain seconds; a shell
    /// timeout_ms above it is lowered to it.
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout_arg)]
    pub tool_timeout: Option<String>,
    /// Keep the model's reasoning in the session's journal (redacted). By default it is shown
    /// live and kept, sealed, only until its turn ends.
    #[arg(long)]
    pub keep_reasoning: bool,
}

/// `--model` (and `/model NAME`'s entries): a spec keel knows (`openai:M`, `anthropic:M`,
/// `script:PATH`, …); the error says why not.
pub(crate) fn parse_model_arg(text: &str) -> Result<String, String> {
    let (bare, _) = crate::model_spec::split_base_url(text);
    crate::model_spec::ModelSpec::parse(bare)
        .map(|_| text.to_owned())
        .map_err(|e| e.to_string())
}

/// `--store`: `sqlite://PATH`, `postgres://…`, `postgresql://…` or a plain path.
fn parse_store_arg(text: &str) -> Result<String, String> {
    crate::config::check_store_url(text)
        .map(|()| text.to_owned())
        .map_err(|e| e.to_string())
}

/// `--base-url`: an `http://` or `https://` URL with a host.
fn parse_base_url_arg(text: &str) -> Result<String, String> {
    crate::config::check_base_url(text)
        .map(|()| text.to_owned())
        .map_err(|e| e.to_string())
}

/// `--max-cost-usd`: a finite number, 0 or more.
fn parse_cost_arg(text: &str) -> Result<f64, String> {
    let usd: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of US dollars"))?;
    crate::config::check_cost(usd).map_err(|_| {
        format!("{text:?}: expected a finite number of US dollars, 0 or more (e.g. 2.5)")
    })
}

/// `--timeout`, `--tool-timeout`: a duration keel understands.
fn parse_timeout_arg(text: &str) -> Result<String, String> {
    crate::config::parse_duration_ms(text)
        .map(|_| text.to_owned())
        .map_err(|_| {
            format!("{text:?}: expected a duration such as 500ms, 30s, 15m, 2h or plain seconds")
        })
}

impl RunArgs {
    /// Why `--base-url` does not apply to `--model`, when it does not (it is for `openai:` and
    /// `openai-responses:` models only).
    pub fn base_url_mismatch(&self) -> Option<String> {
        self.base_url.as_ref()?;
        let model = self.model.as_deref()?;
        (!crate::config::base_url_applies(model)).then(|| format!("--base-url applies to openai: and openai-responses: models only, not --model {model}"))
    }

    /// These flags (and `--store`) as configuration overrides. A relative `script:` path is made
    /// absolute against the current directory, so that `resume` finds it from anywhere.
    pub fn overrides(&self, store: Option<&str>) -> Overrides {
        let cwd = std::env::current_dir().unwrap_or_default();
        Overrides {
            model: self
                .model
                .as_deref()
                .map(|m| crate::model_spec::absolutize(m, &cwd)),
            base_url: self.base_url.clone(),
            permission_mode: self.permission_mode.map(|m| m.snake().to_owned()),
            sandbox: self.sandbox.map(|m| m.snake().to_owned()),
            sandbox_network: self.sandbox_network,
            output: self.output.map(|m| m.snake().to_owned()),
            max_steps: self.max_steps,
            max_cost_usd: self.max_cost_usd,
            timeout: self.timeout.clone(),
            tool_timeout: self.tool_timeout.clone(),
            store: store.map(str::to_owned),
            keep_reasoning: self.keep_reasoning.then_some(true),
        }
    }
}

/// `--permission-mode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PermissionModeArg {
    /// Read-only tools run; everything else asks.
    Default,
    /// As default, and file edits inside the workspace run too.
    #[value(alias = "accept_edits")]
    AcceptEdits,
    /// Nothing that writes runs (denied, not asked).
    #[value(alias = "read_only")]
    ReadOnly,
    /// Everything runs unless a deny rule says otherwise.
    Bypass,
}

impl PermissionModeArg {
    pub(crate) fn snake(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::AcceptEdits => "accept_edits",
            Self::ReadOnly => "read_only",
            Self::Bypass => "bypass",
        }
    }
}

/// `--sandbox` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SandboxArg {
    /// No confinement.
    Off,
    /// Shell commands write nothing but a private temp dir; no network.
    #[value(alias = "read_only")]
    ReadOnly,
    /// Shell commands write the workspace and a private temp dir; no network.
    #[value(alias = "workspace_write")]
    WorkspaceWrite,
}

impl SandboxArg {
    fn snake(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::ReadOnly => "read_only",
            Self::WorkspaceWrite => "workspace_write",
        }
    }
}

/// `--output` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputArg {
    /// Text for people (interactive on a terminal).
    Text,
    /// One JSON event per line, ending with one `result` line.
    Jsonl,
}

impl OutputArg {
    fn snake(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Jsonl => "jsonl",
        }
    }
}

/// Top-level subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a session in the workspace and run PROMPT (interactive without one on a terminal).
    Run {
        /// The task; read from standard input when `-`.
        prompt: Option<String>,
        /// Run settings.
        #[command(flatten)]
        args: RunArgs,
    },
    /// Continue a session: after Ctrl-C, a crash, a pending approval or a finished turn (with a
    /// new PROMPT). Restores the session's workspace, model route (its pinned release's),
    /// permission mode, sandbox, budgets and
    /// timeouts; settings flags given here change them, and --model
    /// re-pins the session (journaled and printed) for this and later runs.
    Resume {
        /// The session.
        session: String,
        /// A follow-up task (optional: without one, an unfinished turn is continued).
        prompt: Option<String>,
        /// Run settings.
        #[command(flatten)]
        args: RunArgs,
    },
    /// Serve the Agent Client Protocol on standard input and output, for editors (Zed,
    /// JetBrains, Neovim, Emacs): each ACP session is a Keel session in the client's cwd, in the
    /// local store. Run settings given here apply to every session it starts.
    #[command(mut_arg("output", |a| a.hide(true)))]
    Acp {
        /// Run settings.
        #[command(flatten)]
        args: RunArgs,
    },
    /// Inspect sessions in the store.
    #[command(subcommand)]
    Sessions(SessionsCommand),
    /// Allow a pending tool call.
    Approve {
        /// The approval id (from the prompt, the result line or `keel sessions show`).
        approval: String,
        /// Also allow the same call pattern for the rest of the session.
        #[arg(long)]
        for_session: bool,
    },
    /// Deny a pending tool call; the model sees the reason.
    Deny {
        /// The approval id.
        approval: String,
        /// Why (shown to the model).
        #[arg(long, default_value = "denied by the user")]
        reason: String,
    },
    /// Decide what an effect whose outcome is unknown (after a crash) did.
    Resolve {
        /// The effect's operation key (from `keel sessions show`).
        operation_key: String,
        /// It happened (committed), it did not (failed), or dispatch it again (retry).
        #[arg(long = "as", value_enum, value_name = "OUTCOME")]
        outcome: ResolveArg,
        /// A note the model sees with the result.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Cancel a session's running turn (it stays resumable).
    Cancel {
        /// The session.
        session: String,
    },
    /// Configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Trust a workspace: its keel.toml may then loosen your settings (modes, sandbox, budgets,
    /// timeouts, tools) and its allow rules apply. Recorded as `trusted_workspaces` in your user
    /// config (comments kept). Never taken from a workspace, trusted or not: providers,
    /// base_url, store, env, sandbox_network.
    Trust {
        /// The workspace directory (default: --workspace, else the current directory).
        #[arg(value_name = "PATH", conflicts_with_all = ["list", "remove"])]
        path: Option<PathBuf>,
        /// Print the trusted workspaces, one per line.
        #[arg(long, conflicts_with = "remove")]
        list: bool,
        /// Stop trusting PATH.
        #[arg(long, value_name = "PATH")]
        remove: Option<PathBuf>,
    },
    /// Model adapters: diagnose provider streams.
    #[command(subcommand)]
    Model(ModelCommand),
    /// MCP servers (`[mcp_servers.NAME]` in keel.toml): list them, their state and tools.
    #[command(subcommand)]
    Mcp(McpCommand),
    /// Long-term memory: what agents remember between sessions (`[memory]` in keel.toml) —
    /// list, search, show or forget entries.
    #[command(subcommand)]
    Memory(MemoryCommand),
    /// Serve the HTTP API (sessions, turns, events, approvals) on this store.
    Serve(crate::serve::ServeArgs),
    /// Run sessions from a shared store (no API): claims runnable sessions, runs them under
    /// leases, drains on SIGTERM.
    Worker(crate::serve::WorkerArgs),
    /// Tenants of the HTTP API (on the store directly).
    #[command(subcommand)]
    Tenants(crate::serve::TenantsCommand),
    /// API keys of the HTTP API (on the store directly; a new key is shown once).
    #[command(subcommand)]
    Keys(crate::serve::KeysCommand),
}

/// `keel mcp ...`
#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Start every configured MCP server and show its state (ready with its protocol
    /// revision, or why not) and its tools as the model sees them, with their effect class.
    List {
        /// One JSON object per server and line.
        #[arg(long)]
        json: bool,
    },
    /// Connect to the MCP server at URL (streamable HTTP) as a run does, call each of its tools
    /// once with sample arguments and print the results (the MCP conformance suite's client).
    TestClient {
        /// The server's URL.
        url: String,
        /// Protocol revision: auto (the default of a configured server), session or sessionless.
        #[arg(long, default_value = "auto")]
        protocol: String,
    },
}

/// `keel memory ...` (see `crate::memory_cmd`). Without --namespace: the namespace the CLI's
/// own sessions use (agent:keel, user:local or shared, after `[memory] namespace`).
#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// A namespace's entries by key (at most 1,000), or with --search those whose key or value
    /// has every word of QUERY, best match first.
    List {
        /// The stored namespace, e.g. agent:keel, agent:keel/people, user:local, shared.
        #[arg(long)]
        namespace: Option<String>,
        /// Full-text search instead of listing.
        #[arg(long, value_name = "QUERY")]
        search: Option<String>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Print one entry's value (a string as it is, other JSON pretty-printed).
    Get {
        /// The key.
        key: String,
        /// The stored namespace.
        #[arg(long)]
        namespace: Option<String>,
        /// The whole entry as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Forget one entry.
    Rm {
        /// The key.
        key: String,
        /// The stored namespace.
        #[arg(long)]
        namespace: Option<String>,
    },
}

/// `keel resolve --as` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ResolveArg {
    /// The side effect happened.
    Committed,
    /// It did not happen.
    Failed,
    /// Dispatch it again.
    Retry,
}

/// `keel sessions ...`
#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// List sessions, newest first (says how many older ones it left out).
    List {
        /// Only sessions in this status (created, running, idle, requires_action, closed).
        #[arg(long)]
        status: Option<String>,
        /// At most this many, the newest.
        #[arg(long, default_value_t = 100, conflicts_with = "all")]
        limit: u32,
        /// Every session.
        #[arg(long)]
        all: bool,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Show a session: turns, pending approvals, unresolved effects, totals.
    Show {
        /// The session.
        session: String,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Close a session for good: it takes no more input (`keel resume` refuses it). Refused
    /// while a turn is running, waiting on a decision or queued (cancel it first).
    Close {
        /// The session.
        session: String,
    },
    /// Print a session's events as JSON lines.
    Events {
        /// The session.
        session: String,
        /// Keep printing new events as they happen (until the session closes or Ctrl-C).
        #[arg(long, short)]
        follow: bool,
        /// Start at this sequence number.
        #[arg(long, default_value_t = 1)]
        from: u64,
    },
}

/// `keel config ...`
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the effective configuration (files merged, flags applied), secrets masked.
    Show {
        /// As JSON instead of TOML.
        #[arg(long)]
        json: bool,
        /// Run settings to apply, as `keel run` would.
        #[command(flatten)]
        args: RunArgs,
    },
}

/// `keel model ...`
#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Print the normalized events of a recorded SSE stream as JSON lines.
    Parse {
        /// Wire protocol of the recording.
        #[arg(long, value_enum)]
        wire: WireArg,
        /// The recorded SSE body (`-` for standard input).
        file: PathBuf,
    },
}

/// Wire protocol names on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum WireArg {
    /// OpenAI Chat Completions (and compatible servers).
    OpenaiChat,
    /// OpenAI Responses.
    OpenaiResponses,
    /// Anthropic Messages.
    Anthropic,
}

impl From<WireArg> for keel_model::Wire {
    fn from(w: WireArg) -> Self {
        match w {
            WireArg::OpenaiChat => keel_model::Wire::OpenaiChat,
            WireArg::OpenaiResponses => keel_model::Wire::OpenaiResponses,
            WireArg::Anthropic => keel_model::Wire::Anthropic,
        }
    }
}

/// The async runtime of one command: two worker threads (signals and I/O need a driver).
///
/// # Errors
/// When the runtime cannot start.
pub fn tokio_runtime() -> anyhow::Result<BoundedRuntime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map(BoundedRuntime::new)
        .context("cannot start the async runtime")
}

/// How long a command's runtime waits, once the command is done, for blocking tasks still
/// running (a file read that will not end, a hash of a huge file whose call timed out) before
/// the process exits anyway.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// A tokio runtime whose shutdown is bounded: dropping it waits at most [`SHUTDOWN_GRACE`] for
/// blocking tasks (`spawn_blocking`), which a plain runtime waits for forever. The work a
/// command awaited has finished by then (its result is printed); what is left is abandoned,
/// so keel exits after its result line — and a SIGTERM then is never ignored for long.
#[derive(Debug)]
pub struct BoundedRuntime(Option<tokio::runtime::Runtime>);

impl BoundedRuntime {
    /// Wraps `runtime`.
    pub fn new(runtime: tokio::runtime::Runtime) -> Self {
        Self(Some(runtime))
    }
}

impl BoundedRuntime {
    /// Runs `future` to completion on the runtime ([`tokio::runtime::Runtime::block_on`]).
    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        match &self.0 {
            Some(runtime) => runtime.block_on(future),
            None => unreachable!("the runtime is only taken out when dropped"),
        }
    }
}

impl Drop for BoundedRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_timeout(SHUTDOWN_GRACE);
        }
    }
}

/// The configuration for commands that only need the store (`--store`, `--workspace`): the
/// user file and flags, never the workspace's `keel.toml` (see [`Config::load_user`]).
///
/// # Errors
/// As [`Config::load`].
pub fn store_config(global: &GlobalArgs) -> anyhow::Result<Config> {
    let overrides = Overrides {
        store: global.store.clone(),
        ..Overrides::default()
    };
    Ok(Config::load_user(
        global.workspace.as_deref(),
        &Locations::from_env(),
        &overrides,
    )?)
}

/// Runs a parsed command line.
///
/// # Errors
/// Anything that stops the command; `main` prints it on one line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let global = cli.global;
    if let Some(server) = crate::remote::server_of(&global) {
        // Hints printed must reach the same server: name it when it came as a flag.
        if let Some(url) = &global.server {
            let ca = global
                .server_ca
                .as_ref()
                .map(|p| format!(" --server-ca {}", p.display()))
                .unwrap_or_default();
            crate::output::set_hint_command(format!("keel --server {url}{ca}"));
        }
        return crate::remote::dispatch(&server, &global, cli.command);
    }
    run_local(global, cli.command)
}

/// A session status named on the command line (`requires-action` or `requires_action`).
pub(crate) fn parse_status(s: &str) -> anyhow::Result<SessionStatus> {
    s.replace('-', "_").parse::<SessionStatus>().map_err(|_| {
        anyhow::anyhow!(
            "unknown status {s:?}: expected created, running, idle, requires_action or closed"
        )
    })
}

/// The decision `keel approve [--for-session]` names.
pub(crate) fn approve_decision(for_session: bool) -> ApprovalDecision {
    if for_session {
        ApprovalDecision::AllowForSession
    } else {
        ApprovalDecision::AllowOnce
    }
}

/// The decision `keel resolve --as` names.
pub(crate) fn effect_decision(outcome: ResolveArg, reason: Option<String>) -> EffectDecision {
    match outcome {
        ResolveArg::Committed => EffectDecision::Committed {
            outcome: reason.map_or(serde_json::Value::Null, serde_json::Value::String),
        },
        ResolveArg::Failed => EffectDecision::Failed {
            error: reason.unwrap_or_else(|| "the user says it did not happen".into()),
        },
        ResolveArg::Retry => EffectDecision::Retry,
    }
}

/// The commands on this machine's store (every command without `--server`).
///
/// # Errors
/// Anything that stops the command; `main` prints it on one line.
pub fn run_local(global: GlobalArgs, command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Model(ModelCommand::Parse { wire, file }) => model_parse(wire.into(), &file),
        Command::Config(ConfigCommand::Show { json, args }) => {
            let config = Config::load(
                global.workspace.as_deref(),
                &Locations::from_env(),
                &args.overrides(global.store.as_deref()),
            )?;
            for notice in &config.notices {
                eprintln!("{notice}");
            }
            let table = config.to_masked_table();
            let mut out = std::io::stdout().lock();
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&table)?)?;
            } else {
                let sources = if config.sources.is_empty() {
                    "defaults".to_owned()
                } else {
                    format!("defaults, {}", config.sources.join(", "))
                };
                writeln!(out, "# effective configuration; merged from: {sources}")?;
                write!(out, "{}", toml::to_string(&table)?)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Sessions(cmd) => {
            let config = store_config(&global)?;
            tokio_runtime()?.block_on(async move {
                let store = crate::store::open(&config.store).await?;
                match cmd {
                    SessionsCommand::List {
                        status,
                        limit,
                        all,
                        json,
                    } => {
                        let limit = (!all).then_some(limit);
                        let status = status.as_deref().map(parse_status).transpose()?;
                        crate::sessions::list(&store, status, limit, json).await?;
                    }
                    SessionsCommand::Show { session, json } => {
                        let id = crate::sessions::parse_session(&session)?;
                        crate::sessions::show(&store, id, json).await?;
                    }
                    SessionsCommand::Close { session } => {
                        let id = crate::sessions::parse_session(&session)?;
                        crate::session_cmd::close(store, &config, id).await?;
                    }
                    SessionsCommand::Events {
                        session,
                        follow,
                        from,
                    } => {
                        let id = crate::sessions::parse_session(&session)?;
                        crate::sessions::events(&store, id, from, follow).await?;
                    }
                }
                Ok(ExitCode::SUCCESS)
            })
        }
        Command::Approve {
            approval,
            for_session,
        } => decide(&global, &approval, approve_decision(for_session)),
        Command::Deny { approval, reason } => {
            decide(&global, &approval, ApprovalDecision::Deny { reason })
        }
        Command::Run { prompt, args } => {
            if let Some(message) = args.base_url_mismatch() {
                use clap::CommandFactory;
                Cli::command()
                    .error(clap::error::ErrorKind::ArgumentConflict, message)
                    .exit();
            }
            Ok(crate::session_cmd::execute(
                &global,
                &args,
                prompt,
                crate::session_cmd::Target::New,
            ))
        }
        Command::Resume {
            session,
            prompt,
            args,
        } => Ok(crate::session_cmd::execute(
            &global,
            &args,
            prompt,
            crate::session_cmd::Target::Resume(session),
        )),
        Command::Resolve {
            operation_key,
            outcome,
            reason,
        } => crate::session_cmd::resolve(&global, &operation_key, effect_decision(outcome, reason)),
        Command::Cancel { session } => crate::session_cmd::cancel(&global, &session),
        Command::Acp { args } => crate::acp::serve(&global, &args),
        Command::Memory(cmd) => crate::memory_cmd::local(&global, cmd),
        Command::Mcp(cmd) => {
            let config = Config::load(
                global.workspace.as_deref(),
                &Locations::from_env(),
                &crate::config::Overrides::default(),
            )?;
            for notice in &config.notices {
                eprintln!("{notice}");
            }
            match cmd {
                McpCommand::List { json } => crate::mcp::list(&config, json),
                McpCommand::TestClient { url, protocol } => {
                    crate::mcp::test_client(&config, &url, &protocol)
                }
            }
        }
        Command::Trust { path, list, remove } => trust(&global, path, list, remove),
        Command::Serve(args) => crate::serve::serve(&global, &args),
        Command::Worker(args) => crate::serve::worker(&global, &args),
        Command::Tenants(cmd) => crate::serve::tenants(&global, cmd),
        Command::Keys(cmd) => crate::serve::keys(&global, cmd),
    }
}

/// `keel trust [PATH]`, `--list`, `--remove PATH`.
fn trust(
    global: &GlobalArgs,
    path: Option<PathBuf>,
    list: bool,
    remove: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    use crate::trust::{self, Trusted};
    let file = trust::user_file(&Locations::from_env())?;
    let mut out = std::io::stdout().lock();
    if list {
        for entry in trust::list(&file)? {
            match entry {
                trust::TrustEntry::Pinned(e) => {
                    writeln!(out, "{}\tkeel.toml {}", e.path, e.keel_toml)?
                }
                trust::TrustEntry::Path(p) => {
                    writeln!(
                        out,
                        "{p}\t(no keel.toml pinned: not trusted; keel trust {p} pins it)"
                    )?;
                }
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(path) = remove {
        let removed = trust::remove(&file, &path)?;
        if removed.is_empty() {
            anyhow::bail!(
                "{} is not in trusted_workspaces of {} (see keel trust --list)",
                path.display(),
                file.display()
            );
        }
        for entry in removed {
            writeln!(
                out,
                "no longer trusted: {entry} (removed from {})",
                file.display()
            )?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let path = path
        .or_else(|| global.workspace.clone())
        .unwrap_or_else(|| PathBuf::from("."));
    match trust::trust(&file, &path)? {
        Trusted::Added(ws) => writeln!(
            out,
            "trusted {}: its keel.toml, as it is now, may loosen your settings and add allow rules (recorded in {} with the file's hash: if the file changes, the workspace is untrusted until you run keel trust again; undo with keel trust --remove {})",
            ws.display(),
            file.display(),
            ws.display()
        )?,
        Trusted::Repinned(ws) => writeln!(
            out,
            "trusted {} with its keel.toml as it is now (the pin in {} now names this version)",
            ws.display(),
            file.display()
        )?,
        Trusted::Already(ws, entry) => writeln!(
            out,
            "{} is already trusted ({entry:?} in {})",
            ws.display(),
            file.display()
        )?,
    }
    Ok(ExitCode::SUCCESS)
}

fn decide(
    global: &GlobalArgs,
    approval: &str,
    decision: ApprovalDecision,
) -> anyhow::Result<ExitCode> {
    let config = store_config(global)?;
    let id = crate::decide::parse_approval(approval)?;
    tokio_runtime()?.block_on(async move {
        let store = crate::store::open(&config.store).await?;
        let line = crate::decide::decide(&store, &config, id, decision).await?;
        println!("{line}");
        Ok(ExitCode::SUCCESS)
    })
}

/// `keel model parse`: exit status 0 when the stream completed, 1 when it ended in an error.
fn model_parse(wire: keel_model::Wire, file: &Path) -> anyhow::Result<ExitCode> {
    let body = if file.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)
            .context("cannot read standard input")?;
        buf
    } else {
        std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let events = runtime.block_on(keel_model::parse_recorded(wire, &body));
    // Printed like everything else keel prints: key formats and the provider keys of this
    // environment redacted.
    let keys: Vec<String> = keel_runtime::redact::PROVIDER_KEY_ENV
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let redactor = keel_runtime::redact::Redactor::new(&[], &keys)?;
    let mut out = std::io::stdout().lock();
    let mut failed = false;
    for event in &events {
        failed |= matches!(event, keel_model::StreamEvent::Error { .. });
        let mut value = serde_json::to_value(event)?;
        redactor.redact_value(&mut value);
        writeln!(out, "{value}")?;
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
