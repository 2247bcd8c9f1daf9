//! The CLI's side of the input pipeline ([`keel_runtime::input`]): where user commands come
//! from, and carrying out the built-in commands the pipeline hands back (printing local
//! answers, compacting, re-pinning, starting a new session, picking one to resume).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use keel_core::TurnId;
use keel_runtime::input::{Command, Compiled, InputOptions};

use crate::config::{Config, Locations, OutputFormat};
use crate::interactive::Lines;
use crate::run::{Prepared, ResumeChanges, prepare_resume};

/// Where `config`'s user commands come from: the workspace's `.keel/commands` when the
/// workspace is trusted (a repository's commands are its text put in the user's mouth; read
/// with the config, the files trust covers), then
/// the user's `commands` directory beside the user config (`$XDG_CONFIG_HOME/keel/commands`).
/// `terminal`: `/resume` is offered (interactive mode).
pub fn input_options(config: &Config, terminal: bool) -> InputOptions {
    let ws_dir = config.workspace.join(crate::config::COMMANDS_DIR);
    InputOptions {
        workspace_commands: config.workspace_commands.clone(),
        command_dirs: user_commands_dir().into_iter().collect(),
        untrusted_dir: (!config.trusted).then(|| keel_runtime::input::UntrustedCommands {
            dir: ws_dir,
            workspace: config.workspace.clone(),
        }),
        terminal,
    }
}

/// `$XDG_CONFIG_HOME/keel/commands`, when a config dir is known.
pub fn user_commands_dir() -> Option<PathBuf> {
    Locations::from_env()
        .user_file
        .and_then(|f| f.parent().map(|d| d.join("commands")))
}

/// An input error of the pipeline (unknown command, bad `@path`) as a usage error: a clear
/// message, exit 2, nothing ran.
pub fn usage_of(e: keel_runtime::RuntimeError) -> anyhow::Error {
    match e {
        keel_runtime::RuntimeError::Input(m) => {
            anyhow::Error::new(crate::exit::UsageError(format!("input: {m}")))
        }
        // A sub-agent's session: the message names the parent to resume instead.
        keel_runtime::RuntimeError::SubAgentSession { session, parent } => {
            anyhow::Error::new(crate::exit::UsageError(format!(
                "session {session} is a sub-agent's session (run by a call of session {parent}); it takes no input: keel resume {parent}"
            )))
        }
        other => other.into(),
    }
}

/// Compiles `text` for the session of `p` and journals it when it is a prompt: the turn, or
/// the built-in command to carry out ([`run_command`]).
///
/// # Errors
/// The pipeline's refusals ([`usage_of`]), submit errors.
pub async fn submit(
    p: &Prepared,
    text: &str,
    opts: &InputOptions,
) -> anyhow::Result<Result<TurnId, Command>> {
    match p
        .runtime
        .compile_input(p.tenant, p.session, text, opts)
        .await
        .map_err(usage_of)?
    {
        Compiled::Prompt(prompt) => Ok(Ok(p
            .runtime
            .submit_prompt(p.tenant, p.session, &prompt, Default::default())
            .await
            .map_err(usage_of)?)),
        Compiled::Command(c) => Ok(Err(c)),
    }
}

/// Prints a command's answer: the text on standard output, or with `--output jsonl` one line
/// `{"type":"command","command":NAME,"session_id":…,"output":TEXT}`.
fn say(p: &Prepared, config: &Config, command: &Command, text: &str) {
    use std::io::Write as _;
    let line = if config.output == OutputFormat::Jsonl {
        serde_json::json!({
            "type": "command",
            "command": command.name(),
            "session_id": p.session,
            "output": text,
        })
        .to_string()
    } else {
        text.to_owned()
    };
    // As the printers do: a reader that went away (`keel run /help | head -1`) is no reason
    // to panic (`println!` does on a closed pipe) and leave the command's session behind.
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// Carries out `command` for the session of `p` (which `/clear`, `/model` and `/resume` replace
/// with the session or runtime they lead to). Returns whether there is work to drive now (a
/// resumed session with an unfinished turn).
///
/// # Errors
/// What the runtime refused (a compaction with a turn active, a re-pin it refuses, …).
pub async fn run_command(
    p: &mut Prepared,
    command: &Command,
    config: &Config,
    opts: &InputOptions,
    lines: Option<&mut Lines>,
) -> anyhow::Result<bool> {
    match command {
        Command::Help | Command::Cost | Command::Status | Command::Permissions => {
            let text = p.runtime.answer(p.tenant, p.session, command, opts).await?;
            say(p, config, command, &text);
            Ok(false)
        }
        Command::Compact { focus } => {
            let c = p
                .runtime
                .compact_now(p.tenant, p.session, focus.as_deref())
                .await
                .map_err(usage_of)?;
            p.from_seq = c.version + 1;
            say(
                p,
                config,
                command,
                &format!(
                    "compacted the conversation: ~{} → ~{} tokens",
                    c.tokens_before, c.tokens_after
                ),
            );
            Ok(false)
        }
        Command::Model { name } => {
            // An invalid name is the usage error `--model` gives (exit 2), before anything.
            for entry in name.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                crate::cli::parse_model_arg(entry).map_err(|e| {
                    anyhow::Error::new(crate::exit::UsageError(format!("/model {entry}: {e}")))
                })?;
            }
            let route: Vec<String> = name
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| crate::model_spec::absolutize(s, &config.workspace))
                .collect();
            let next = prepare_resume(
                p.runtime.store().clone(),
                config,
                p.session,
                None,
                Some(&route),
                &ResumeChanges::default(),
                opts,
            )
            .await?;
            replace(p, next);
            say(
                p,
                config,
                command,
                &format!("session {} now runs model {}", p.session, route.join(", ")),
            );
            Ok(false)
        }
        Command::Clear => {
            let Some(session) = p.runtime.clear(p.tenant, p.session).await? else {
                let text = keel_runtime::Runtime::nothing_to_clear(p.session);
                say(p, config, command, &text);
                return Ok(false);
            };
            let old = p.session;
            p.session = session;
            p.from_seq = 1;
            p.turn = None;
            p.continues = false;
            p.started = Instant::now();
            say(
                p,
                config,
                command,
                &format!("new session {session} (session {old} is kept: keel resume {old})"),
            );
            Ok(false)
        }
        Command::Resume { session } => {
            let chosen = match session {
                Some(s) => crate::sessions::parse_session(s)?,
                None => match pick(p, lines).await? {
                    Some(s) => s,
                    None => return Ok(false),
                },
            };
            let next = prepare_resume(
                p.runtime.store().clone(),
                config,
                chosen,
                None,
                None,
                &ResumeChanges::default(),
                opts,
            )
            .await
            .with_context(|| format!("cannot resume session {chosen}"))?;
            replace(p, next);
            say(p, config, command, &format!("resumed session {chosen}"));
            Ok(p.continues)
        }
    }
}

/// `p` continues as `next` (another runtime or session); the invocation's start stays.
fn replace(p: &mut Prepared, next: Prepared) {
    let started = p.started;
    *p = next;
    p.started = started;
}

/// Lists the newest top-level sessions that ran a turn (not the current one, not a sub-agent's
/// child session, not one that never ran) and asks which to resume: a number from the list or
/// a session id; `None` when the person gives none.
async fn pick(
    p: &Prepared,
    lines: Option<&mut Lines>,
) -> anyhow::Result<Option<keel_core::SessionId>> {
    let Some(lines) = lines else {
        anyhow::bail!("/resume picks a session on a terminal; give its id: /resume SESSION");
    };
    // The newest 200 sessions hold the ten to offer unless children crowd them out; an older
    // session is still resumed by id.
    let (sessions, _) =
        crate::sessions::newest_sessions(p.runtime.store(), None, Some(200)).await?;
    let sessions: Vec<_> = sessions
        .into_iter()
        .filter(|s| {
            s.session_id != p.session
                && s.parent_session_id.is_none()
                && s.status != keel_core::SessionStatus::Created
        })
        .take(10)
        .collect();
    if sessions.is_empty() {
        println!("no other session to resume");
        return Ok(None);
    }
    for (i, s) in sessions.iter().enumerate() {
        println!("  [{}] {} {}", i + 1, s.session_id, s.status);
    }
    let Some(answer) = lines
        .ask("  resume which? (number or id, empty: none) › ")
        .await
    else {
        return Ok(None);
    };
    let answer = answer.trim();
    if answer.is_empty() {
        return Ok(None);
    }
    if let Ok(n) = answer.parse::<usize>()
        && let Some(s) = n.checked_sub(1).and_then(|i| sessions.get(i))
    {
        return Ok(Some(s.session_id));
    }
    Ok(Some(crate::sessions::parse_session(answer)?))
}
