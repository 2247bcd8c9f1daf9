//! The subcommands' own arguments: `keel mcp`, `memory`, `sessions`, `config`, `model`, and the wire names.

use super::*;

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
