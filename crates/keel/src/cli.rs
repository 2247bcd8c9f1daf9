//! Command-line shape: one [`Command`] enum, one variant per subcommand group. Logic lives in the
//! library crates; each arm only wires arguments to them.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

/// Keel: a durable agent runtime.
#[derive(Debug, Parser)]
#[command(name = "keel", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Model adapters: diagnose provider streams.
    #[command(subcommand)]
    Model(ModelCommand),
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

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Model(ModelCommand::Parse { wire, file }) => model_parse(wire.into(), &file),
    }
}

/// `keel model parse`: exit status 0 when the stream completed, 1 when it ended in an error.
fn model_parse(wire: keel_model::Wire, file: &std::path::Path) -> anyhow::Result<ExitCode> {
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
