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

mod subcommands;
pub use subcommands::*;

mod local;
pub use local::*;

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
            format!("{text:?}: expected a duration of at least 1 ms, such as 500ms, 30s, 15m, 2h or plain seconds")
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Cli, Command};

    /// The commands the inspector's sign-in page tells a new user to run (in `<code>`) are
    /// commands this CLI takes, as written.
    #[test]
    fn the_sign_in_pages_key_commands_parse() {
        const APP: &str = include_str!("../../keel-server/src/inspector/assets/app.js");
        let start = APP
            .find("id: 'key-how'")
            .expect("the sign-in page's key hint");
        let hint = &APP[start..start + APP[start..].find("button, error").expect("its end")];
        let commands: Vec<&str> = hint
            .split("K.h('code', {}, '")
            .skip(1)
            .filter_map(|rest| rest.split('\'').next())
            .filter(|c| c.starts_with("keel "))
            .collect();
        assert_eq!(commands.len(), 2, "{hint}");
        for line in &commands {
            let cli = Cli::try_parse_from(line.split_whitespace())
                .unwrap_or_else(|e| panic!("{line}: {e}"));
            assert!(
                matches!(cli.command, Command::Tenants(_) | Command::Keys(_)),
                "{line}"
            );
        }
    }
}
