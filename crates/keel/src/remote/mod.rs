//! `keel --server URL …` (or `KEEL_SERVER`): the session commands against a remote `keel serve`
//! through `keel-client`, with the key from `KEEL_API_KEY` (and `--server-ca` /
//! `KEEL_SERVER_CA` for a server whose certificate the system does not trust). Each command
//! prints what it prints locally and exits with the same code: the events come from the
//! server's journal (the same envelopes the store holds), are folded with the same
//! [`SessionState`] and rendered by the same printers; only where the data comes from differs.
//!
//! - here — [`Server`], [`connect`], [`dispatch`] (which command goes where), the messages for
//!   the server's refusals ([`explain`]) and the journal helpers.
//! - [`run`] — `run` and `resume`: a release from the CLI's model and settings, a session on
//!   the server's `--workspace`, the turn, then the SSE stream rendered as it arrives.
//! - [`sessions`] — `sessions list|show|events [--follow]|close`.
//! - [`decide`] — `approve`, `deny`, `resolve`, `cancel`.
//! - `memory` goes to [`crate::memory_cmd::remote`].

pub mod decide;
pub mod run;
pub mod sessions;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use keel_client::{Client, ClientOptions, Error as ClientError};
use keel_core::{ApprovalDecision, Event, SessionState, ToolCallStatus};

use crate::cli::{Command, GlobalArgs, SessionsCommand};

/// The environment variable naming the server when `--server` is not given.
pub const SERVER_ENV: &str = "KEEL_SERVER";
/// The environment variable holding the API key sent to the server.
pub const KEY_ENV: &str = "KEEL_API_KEY";
/// The environment variable naming the CA file when `--server-ca` is not given.
pub const CA_ENV: &str = "KEEL_SERVER_CA";

/// The most a `--server-ca` file may hold (a bundle of a few hundred certificates).
const CA_LIMIT: u64 = 1 << 20;

/// Where the session commands go: the server's base URL and the certificate to trust for it.
#[derive(Debug, Clone)]
pub struct Server {
    /// `http(s)://HOST[:PORT]`, as given.
    pub url: String,
    /// `--server-ca` or `$KEEL_SERVER_CA`: a PEM file trusted instead of the system's roots.
    pub ca: Option<PathBuf>,
}

/// The server `keel` talks to: `--server`, else `$KEEL_SERVER` (with `--server-ca`, else
/// `$KEEL_SERVER_CA`); `None` for local commands.
pub fn server_of(global: &GlobalArgs) -> Option<Server> {
    let non_empty = |v: String| (!v.trim().is_empty()).then_some(v);
    let url = global
        .server
        .clone()
        .or_else(|| std::env::var(SERVER_ENV).ok())
        .and_then(non_empty)?;
    let ca = global.server_ca.clone().or_else(|| {
        std::env::var(CA_ENV)
            .ok()
            .and_then(non_empty)
            .map(PathBuf::from)
    });
    Some(Server { url, ca })
}

/// A client of `server` with `$KEEL_API_KEY`, trusting its CA file when one is named.
///
/// # Errors
/// A URL that is not `http(s)://HOST`; a key that cannot be sent; a CA file that cannot be
/// read (missing, not a regular file, over 1 MiB) or holds no PEM certificate.
pub fn connect(server: &Server) -> anyhow::Result<Client> {
    let key = std::env::var(KEY_ENV).ok().filter(|k| !k.is_empty());
    let ca_pem = match &server.ca {
        Some(path) => Some(
            keel_tools::files::read_regular_file(path, CA_LIMIT)
                .with_context(|| format!("--server-ca {}: cannot read it", path.display()))?,
        ),
        None => None,
    };
    if let (Some(pem), Some(path)) = (&ca_pem, &server.ca)
        && !String::from_utf8_lossy(pem).contains("-----BEGIN CERTIFICATE-----")
    {
        anyhow::bail!(
            "--server-ca {}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        );
    }
    let options = ClientOptions {
        ca_pem,
        timeout: None,
    };
    Client::with_options(&server.url, key.as_deref(), &options).map_err(|e| {
        let url = &server.url;
        match &server.ca {
            Some(path) if matches!(e, ClientError::Config(ref m) if m.contains("CA")) => {
                anyhow::anyhow!("--server-ca {}: {e}", path.display())
            }
            _ => anyhow::anyhow!("--server {url}: {e}"),
        }
    })
}

/// `keel --server URL …`: the session commands against the server; the others
/// (configuration, trust, serve, tenants, keys, model) are local whatever the server.
///
/// # Errors
/// What the command's function returns; a usage error (exit 2) for what the API cannot do.
pub fn dispatch(
    server: &Server,
    global: &GlobalArgs,
    command: Command,
) -> anyhow::Result<ExitCode> {
    let remote = matches!(
        command,
        Command::Run { .. }
            | Command::Resume { .. }
            | Command::Sessions(_)
            | Command::Approve { .. }
            | Command::Deny { .. }
            | Command::Resolve { .. }
            | Command::Cancel { .. }
            | Command::Memory(_)
    );
    // The server keeps its own store: a --store here would be ignored, silently.
    if remote && let Some(store) = &global.store {
        return Err(anyhow::Error::new(crate::exit::UsageError(format!(
            "--store {} names a local store, but this command goes to the server at {} (--server or ${SERVER_ENV}), which uses its own; drop one of them",
            crate::config::mask_url_password(store),
            server.url
        ))));
    }
    match command {
        Command::Run { prompt, args } => Ok(run::execute(server, global, &args, prompt, None)),
        Command::Resume {
            session,
            prompt,
            args,
        } => Ok(run::execute(server, global, &args, prompt, Some(session))),
        Command::Sessions(SessionsCommand::List {
            status,
            limit,
            all,
            json,
        }) => {
            let status = status
                .as_deref()
                .map(crate::cli::parse_status)
                .transpose()?;
            sessions::list(server, status, (!all).then_some(limit), json)
        }
        Command::Sessions(SessionsCommand::Show { session, json }) => {
            sessions::show(server, &session, json)
        }
        Command::Sessions(SessionsCommand::Events {
            session,
            follow,
            from,
        }) => sessions::events(server, &session, from, follow),
        Command::Sessions(SessionsCommand::Close { session }) => sessions::close(server, &session),
        Command::Approve {
            approval,
            for_session,
        } => decide::decide(server, &approval, crate::cli::approve_decision(for_session)),
        Command::Deny { approval, reason } => {
            decide::decide(server, &approval, ApprovalDecision::Deny { reason })
        }
        Command::Resolve {
            operation_key,
            outcome,
            reason,
        } => decide::resolve(
            server,
            &operation_key,
            crate::cli::effect_decision(outcome, reason),
        ),
        Command::Cancel { session } => decide::cancel(server, &session),
        Command::Memory(cmd) => crate::memory_cmd::remote(server, global, cmd),
        local => crate::cli::run_local(global.clone(), local),
    }
}

/// A server error as one line that says what to do: the key (401), the role or server limit
/// (403), the id (404), the state (409), the version (412), and connection failures.
pub fn explain(client: &Client, e: ClientError) -> anyhow::Error {
    let server = client.base_url();
    let detail = e
        .problem()
        .map_or_else(|| e.to_string(), |p| p.detail.clone());
    let text = match (&e, e.status()) {
        (ClientError::Connect { detail, .. }, _) => {
            let lower = detail.to_lowercase();
            if lower.contains("certificate") || lower.contains("unknownissuer") {
                return anyhow::anyhow!(
                    "cannot reach the Keel server at {server}: its TLS certificate is not trusted ({detail}); name the certificate or its CA with --server-ca FILE (or {CA_ENV})"
                );
            }
            let why = if lower.contains("refused") {
                "connection refused"
            } else {
                detail.as_str()
            };
            format!(
                "cannot reach the Keel server at {server}: {why} (is `keel serve` running there? --server / {SERVER_ENV} name it)"
            )
        }
        (_, Some(401)) => format!(
            "the server at {server} refused the API key (401): {detail}; set {KEY_ENV} to a valid key (`keel keys create` on the server)"
        ),
        (_, Some(403)) => match e.problem().and_then(|p| p.limit.clone()) {
            Some(limit) => format!("the server refused (403, its limit {limit}): {detail}"),
            None => format!("the server refused (403): {detail}"),
        },
        (_, Some(404)) => format!("not found on the server at {server} (404): {detail}"),
        (_, Some(409)) => format!("conflict (409): {detail}"),
        (_, Some(412)) => {
            format!("the session changed meanwhile (412): {detail}; run the command again")
        }
        (_, Some(s)) => format!("the server answered {s}: {detail}"),
        _ => e.to_string(),
    };
    anyhow::anyhow!(text)
}

/// Runs `f` with a client on a fresh async runtime; exit 0 when it succeeds.
fn with_client<F, Fut>(server: &Server, f: F) -> anyhow::Result<ExitCode>
where
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let client = connect(server)?;
    crate::cli::tokio_runtime()?.block_on(f(client))?;
    Ok(ExitCode::SUCCESS)
}

/// The whole journal of `session` after `after`, decoded.
///
/// # Errors
/// Server errors; an event this build cannot read.
pub async fn journal(client: &Client, session: &str, after: u64) -> anyhow::Result<Vec<Event>> {
    let values = client
        .events(session, after)
        .await
        .map_err(|e| explain(client, e))?;
    values
        .into_iter()
        .map(|v| Event::decode_value(v).map_err(anyhow::Error::from))
        .collect()
}

/// The session folded from its journal on the server, with the events.
///
/// # Errors
/// As [`journal`]; a journal that does not fold.
pub async fn load_state(
    client: &Client,
    session: &str,
) -> anyhow::Result<(Vec<Event>, SessionState)> {
    let events = journal(client, session, 0).await?;
    let state = SessionState::replay(&events)
        .with_context(|| format!("the journal of session {session} does not replay"))?;
    Ok((events, state))
}

/// Checks a session id and that the session exists on the server (the local wording).
async fn known_session(client: &Client, session: &str) -> anyhow::Result<keel_core::SessionId> {
    Ok(find_session(client, session).await?.0)
}

/// As [`known_session`], with the session as the server shows it (its `version` is the ETag).
async fn find_session(
    client: &Client,
    session: &str,
) -> anyhow::Result<(keel_core::SessionId, keel_client::api::SessionBody)> {
    let id = crate::sessions::parse_session(session)?;
    match client.get_session(&id.to_string()).await {
        Ok(record) => Ok((id, record)),
        Err(e) if e.status() == Some(404) => Err(anyhow::anyhow!(
            "no session {id} on the server at {} (see `keel --server {} sessions list`)",
            client.base_url(),
            client.base_url()
        )),
        Err(e) => Err(explain(client, e)),
    }
}

/// The approvals of `session` still waited on, as the API shows them.
async fn waiting_approvals(
    client: &Client,
    session: &str,
    state: &SessionState,
) -> anyhow::Result<Vec<keel_client::api::ApprovalBody>> {
    Ok(client
        .session_approvals(session, Some("pending"))
        .await
        .map_err(|e| explain(client, e))?
        .into_iter()
        .filter(|a| {
            // A sub-agent's approval (listed with the parent's, labelled) waits in its child.
            a.agent.is_some() && a.session_id != session
                || state
                    .tool_calls
                    .get(&keel_core::ToolCallId::from(a.tool_call_id.as_str()))
                    .is_some_and(|c| c.status == ToolCallStatus::AwaitingApproval)
        })
        .collect())
}
