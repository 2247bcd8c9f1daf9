//! Commands that run against the local store: sessions, approvals, effects, memory, trust, models.

use super::*;

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
                        // What this process knows to be secret now (the session's sealed
                        // values, the configured secret variables) is redacted from every
                        // event, also those journaled before it was known.
                        let redactor = crate::run::bare_runtime(store.clone(), &config)?
                            .redactor(crate::store::local_tenant(), id)
                            .await?;
                        crate::sessions::events(&store, id, from, follow, &redactor).await?;
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
pub(super) fn trust(
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

pub(super) fn decide(
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
pub(super) fn model_parse(wire: keel_model::Wire, file: &Path) -> anyhow::Result<ExitCode> {
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
