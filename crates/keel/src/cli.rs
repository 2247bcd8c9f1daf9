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
    #[arg(long, global = true, value_name = "URL")]
    pub store: Option<String>,
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
    /// Output: text (interactive on a terminal) or jsonl (one event per line, then a result).
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub output: Option<OutputArg>,
    /// Most model samplings per turn.
    #[arg(long, value_name = "N")]
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

/// `--model`: a spec keel knows (`openai:M`, `anthropic:M`, `script:PATH`, …).
fn parse_model_arg(text: &str) -> Result<String, String> {
    let (bare, _) = crate::model_spec::split_base_url(text);
    crate::model_spec::ModelSpec::parse(bare)
        .map(|_| text.to_owned())
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
    fn snake(self) -> &'static str {
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
    /// Model adapters: diagnose provider streams.
    #[command(subcommand)]
    Model(ModelCommand),
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
    /// List sessions, oldest first.
    List {
        /// Only sessions in this status (created, running, idle, requires_action, closed).
        #[arg(long)]
        status: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
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
pub fn tokio_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// The configuration for commands that only need the store (`--store`, `--workspace`).
///
/// # Errors
/// As [`Config::load`].
pub fn store_config(global: &GlobalArgs) -> anyhow::Result<Config> {
    let overrides = Overrides {
        store: global.store.clone(),
        ..Overrides::default()
    };
    Ok(Config::load(
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
    match cli.command {
        Command::Model(ModelCommand::Parse { wire, file }) => model_parse(wire.into(), &file),
        Command::Config(ConfigCommand::Show { json, args }) => {
            let config = Config::load(
                global.workspace.as_deref(),
                &Locations::from_env(),
                &args.overrides(global.store.as_deref()),
            )?;
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
                        json,
                    } => {
                        let status = status
                            .map(|s| {
                                s.replace('-', "_").parse::<SessionStatus>().map_err(|_| {
                                    anyhow::anyhow!(
                                        "unknown status {s:?}: expected created, running, idle, requires_action or closed"
                                    )
                                })
                            })
                            .transpose()?;
                        crate::sessions::list(&store, status, limit, json).await?;
                    }
                    SessionsCommand::Show { session, json } => {
                        let id = crate::sessions::parse_session(&session)?;
                        crate::sessions::show(&store, id, json).await?;
                    }
                    SessionsCommand::Close { session } => {
                        let id = crate::sessions::parse_session(&session)?;
                        crate::session_cmd::close(store, id).await?;
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
        } => {
            let decision = if for_session {
                ApprovalDecision::AllowForSession
            } else {
                ApprovalDecision::AllowOnce
            };
            decide(&global, &approval, decision)
        }
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
        } => {
            let decision = match outcome {
                ResolveArg::Committed => EffectDecision::Committed {
                    outcome: reason.map_or(serde_json::Value::Null, serde_json::Value::String),
                },
                ResolveArg::Failed => EffectDecision::Failed {
                    error: reason.unwrap_or_else(|| "the user says it did not happen".into()),
                },
                ResolveArg::Retry => EffectDecision::Retry,
            };
            crate::session_cmd::resolve(&global, &operation_key, decision)
        }
        Command::Cancel { session } => crate::session_cmd::cancel(&global, &session),
    }
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
        let line = crate::decide::decide(&store, id, decision).await?;
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
    let mut out = std::io::stdout().lock();
    let mut failed = false;
    for event in &events {
        failed |= matches!(event, keel_model::StreamEvent::Error { .. });
        writeln!(out, "{}", serde_json::to_string(event)?)?;
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
