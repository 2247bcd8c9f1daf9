//! The ACP `Agent` of `keel acp`: `initialize`, `authenticate`, `session/new`,
//! `session/load`, `session/set_mode`, `session/prompt` ([`crate::acp::turn`]) and
//! `session/cancel` on Keel sessions in the local store.
//!
//! `session/load` refuses (invalid params, `data.field`) a `cwd` that is not the session's
//! workspace — the session does not follow the editor into another directory — and a session
//! running a `session/prompt` on this connection (its history would be replayed into the
//! running prompt's updates). The end of standard input interrupts the running prompts
//! ([`KeelAgent::disconnected`]).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

use agent_client_protocol::{self as acp, Client as _};
use keel_core::SessionId;
use keel_runtime::input::InputOptions;
use keel_tools::policy::PermissionMode;
use serde_json::{Value, json};

use crate::cli::{GlobalArgs, RunArgs};
use crate::config::{Config, Locations};
use crate::model_spec::{SpecError, build_route};
use crate::run::{Prepared, pinned, pinned_base_url, release_of, session_config_of};
use crate::store::local_tenant;

use super::mcp::{Scope, Unsealing, Withheld, mcp_entry};
use super::updates::{Mapper, update};

/// The ACP auth method Keel advertises: provider keys come from the environment `keel acp`
/// starts with (the editor's agent-server `env`).
pub const AUTH_METHOD: &str = "provider_key_env";

/// A Keel session an editor drives.
pub struct Hosted {
    /// The session, its runtime and tenant.
    pub p: Prepared,
    /// The effective configuration of its workspace.
    pub config: Config,
    /// Input pipeline options (no terminal: `/resume` is not offered).
    pub input: InputOptions,
    /// The workspace (absolute).
    pub workspace: PathBuf,
    /// One prompt at a time.
    pub busy: tokio::sync::Mutex<()>,
    /// What interrupts the running prompt: `session/cancel`, or the client gone.
    pub interrupt: tokio::sync::watch::Sender<Interrupt>,
    /// Whether the running prompt waits on the client's answer to `session/request_permission`.
    pub asking: Cell<bool>,
    /// How many `session/prompt`s this connection accepted for the session (each takes its
    /// number, a ticket, when it arrives — before it waits for the one running).
    pub accepted: Cell<u64>,
    /// The last `session/cancel` covers the prompts with a ticket up to this: one accepted and
    /// not yet running answers `cancelled` when its turn comes, without starting a turn.
    pub cancelled_upto: Cell<u64>,
    /// Standard input ended: a prompt that has not started its turn yet never does.
    pub gone: Cell<bool>,
}

impl Hosted {
    /// A ticket for a `session/prompt` just arrived (call before any await).
    pub fn accept(&self) -> u64 {
        let ticket = self.accepted.get() + 1;
        self.accepted.set(ticket);
        ticket
    }

    /// Whether the prompt with `ticket` was cancelled (or the client went away) since it
    /// arrived.
    pub fn withdrawn(&self, ticket: u64) -> bool {
        self.gone.get() || ticket <= self.cancelled_upto.get()
    }
}

/// What interrupts a running `session/prompt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// Nothing.
    None,
    /// `session/cancel`: the turn is cancelled; an open permission request is not waited on.
    Cancel,
    /// Standard input ended: a running turn is cancelled (every open call gets a result); one
    /// waiting on a permission request leaves its approval pending in the store.
    Disconnected,
}

/// The agent side of one ACP connection.
pub struct KeelAgent {
    global: GlobalArgs,
    args: RunArgs,
    /// The connection, to send updates and requests to the client (set once it exists).
    pub conn: Rc<RefCell<Option<Rc<acp::AgentSideConnection>>>>,
    /// What the client said it can do in `initialize`.
    pub client: RefCell<acp::ClientCapabilities>,
    sessions: RefCell<HashMap<String, Rc<Hosted>>>,
    /// File requests of the tools to the client ([`super::fs::serve`] sends them).
    pub fs: tokio::sync::mpsc::Sender<super::fs::FsCall>,
    /// The editor's MCP `env` and `headers` values, kept out of the store.
    withheld: Arc<Withheld>,
}

/// An internal error carrying `e`'s one-line description.
pub fn internal(e: &anyhow::Error) -> acp::Error {
    let reason = if e.downcast_ref::<crate::config::ConfigError>().is_some() {
        "config"
    } else {
        "internal"
    };
    failure(
        acp::Error::internal_error(),
        reason,
        crate::report::describe(e),
        Value::Null,
    )
}

/// A Keel error answer: `base`'s JSON-RPC code, with `message` as the error's `message` (what
/// an editor shows the user) and `data` of the one shape every Keel error has:
/// `{"reason": REASON, "message": MESSAGE, ...fields}` — `reason` a stable snake_case word
/// (`internal`, `config`, `invalid_params`, `unknown_session`, `not_found`, `auth_required`,
/// `turn_ended`), `fields` (an object, or null) what the reason names (`field`, `env_var`,
/// `terminal_reason`, `session_id`). README "Editors (ACP)" documents it.
pub fn failure(base: acp::Error, reason: &str, message: String, fields: Value) -> acp::Error {
    let mut data = json!({"reason": reason, "message": message});
    if let (Some(d), Value::Object(f)) = (data.as_object_mut(), fields) {
        d.extend(f);
    }
    let mut e = base;
    e.message = message;
    e.data(data)
}

/// An invalid-params error ([`failure`] with reason `invalid_params`), naming `field` when
/// one request field is at fault.
pub fn invalid(field: Option<&str>, message: String) -> acp::Error {
    failure(
        acp::Error::invalid_params(),
        "invalid_params",
        message,
        field.map_or(Value::Null, |f| json!({ "field": f })),
    )
}

/// A value of a schema type from its wire form.
pub fn wire<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, acp::Error> {
    serde_json::from_value(v).map_err(|e| internal(&anyhow::anyhow!("keel acp: {e}")))
}

/// The permission modes as ACP session modes, `current` first named.
pub fn modes(current: PermissionMode, ceiling: Option<PermissionMode>) -> Value {
    let all = [
        (
            PermissionMode::Default,
            "Default",
            "Reads run; edits, commands and other side effects ask",
        ),
        (
            PermissionMode::AcceptEdits,
            "Accept edits",
            "File edits in the workspace run without asking",
        ),
        (
            PermissionMode::ReadOnly,
            "Read only",
            "Only read-only tools run; side effects are refused",
        ),
        (
            PermissionMode::Bypass,
            "Bypass",
            "Everything the policy does not deny runs without asking",
        ),
    ];
    let available: Vec<Value> = all
        .iter()
        .filter(|(m, _, _)| within(*m, ceiling))
        .map(|(m, name, description)| json!({"id": mode_id(*m), "name": name, "description": description}))
        .collect();
    json!({"currentModeId": mode_id(current), "availableModes": available})
}

/// Whether `mode` is at most as permissive as `ceiling` (`keel acp --permission-mode`; none:
/// any mode).
fn within(mode: PermissionMode, ceiling: Option<PermissionMode>) -> bool {
    ceiling.is_none_or(|c| mode.permissiveness() <= c.permissiveness())
}

fn mode_id(m: PermissionMode) -> &'static str {
    match m {
        PermissionMode::Default => "default",
        PermissionMode::AcceptEdits => "accept_edits",
        PermissionMode::ReadOnly => "read_only",
        PermissionMode::Bypass => "bypass",
    }
}

/// `auth_required` naming the variable to set, when `e` is a missing provider key.
fn auth_error(e: &SpecError) -> Option<acp::Error> {
    let var = match e {
        SpecError::MissingConfiguredKey { var, .. } => var.clone(),
        SpecError::Model(keel_model::ModelError::MissingApiKey { env_var, .. }) => {
            (*env_var).to_owned()
        }
        _ => return None,
    };
    Some(failure(
        acp::Error::auth_required(),
        "auth_required",
        e.to_string(),
        json!({"env_var": var, "auth_method": AUTH_METHOD}),
    ))
}

impl KeelAgent {
    /// An agent for `keel acp` with these flags.
    pub fn new(
        global: GlobalArgs,
        args: RunArgs,
        fs: tokio::sync::mpsc::Sender<super::fs::FsCall>,
    ) -> Self {
        Self {
            fs,
            global,
            args,
            conn: Rc::new(RefCell::new(None)),
            client: RefCell::new(acp::ClientCapabilities::default()),
            sessions: RefCell::new(HashMap::new()),
            withheld: Arc::new(Withheld::default()),
        }
    }

    /// Standard input ended: every running prompt is interrupted — its turn cancelled (every
    /// open call gets a result, as `session/cancel` and SIGTERM do), except one waiting on a
    /// permission request, whose approval stays pending for `keel approve` or a later
    /// `session/load`.
    pub async fn disconnected(&self) {
        let hosted: Vec<Rc<Hosted>> = self.sessions.borrow().values().cloned().collect();
        for h in hosted {
            h.gone.set(true);
            let prompting = h.busy.try_lock().is_err();
            h.interrupt.send_replace(Interrupt::Disconnected);
            if !prompting || h.asking.get() {
                continue;
            }
            match h.p.runtime.cancel_turn(h.p.tenant, h.p.session).await {
                Ok(_) | Err(keel_runtime::RuntimeError::NoActiveTurn { .. }) => {}
                Err(e) => {
                    tracing::warn!("acp: session {}: cancel at end of input: {e}", h.p.session)
                }
            }
        }
    }

    /// The connection to the client.
    pub fn connection(&self) -> Result<Rc<acp::AgentSideConnection>, acp::Error> {
        self.conn
            .borrow()
            .clone()
            .ok_or_else(|| internal(&anyhow::anyhow!("no connection yet")))
    }

    /// Sends one update of `session` to the client.
    pub async fn notify(&self, session: &acp::SessionId, update: acp::SessionUpdate) {
        if let Ok(conn) = self.connection() {
            let _ = conn
                .session_notification(acp::SessionNotification::new(session.clone(), update))
                .await;
        }
    }

    /// The most permissive mode a session may have here: `keel acp --permission-mode`, when
    /// given (the editor's `session/set_mode` and `session/load` stay within it).
    fn ceiling(&self) -> Option<PermissionMode> {
        self.args
            .permission_mode
            .and_then(|m| PermissionMode::parse(m.snake()).ok())
    }

    /// The hosted session `id` (any spelling [`canonical`] accepts).
    pub fn hosted(&self, id: &acp::SessionId) -> Result<Rc<Hosted>, acp::Error> {
        let key = canonical(id).map_or_else(|_| id.0.to_string(), |c| c.0.to_string());
        self.sessions.borrow().get(&key).cloned().ok_or_else(|| {
            failure(
                acp::Error::invalid_params(),
                "unknown_session",
                format!(
                    "unknown session {}: session/new or session/load it first",
                    id.0
                ),
                json!({"field": "sessionId"}),
            )
        })
    }

    fn load_config(&self, workspace: &std::path::Path) -> Result<Config, acp::Error> {
        Config::load(
            Some(workspace),
            &Locations::from_env(),
            &self.args.overrides(self.global.store.as_deref()),
        )
        .map_err(|e| internal(&e.into()))
    }

    /// A runtime for `release` whose file tools go through the client when it offers
    /// `fs/read_text_file` (and `fs/write_text_file` for edits).
    async fn runtime(
        &self,
        config: &Config,
        store: Arc<dyn keel_store::Store>,
        model: Arc<dyn keel_model::ModelClient>,
        release: &keel_core::Release,
        scope: Scope,
    ) -> Result<keel_runtime::Runtime, acp::Error> {
        let fs = self.client.borrow().fs.clone();
        let tools = super::fs::registry(&self.fs, fs.read_text_file, fs.write_text_file)
            .map_err(|e| internal(&e.into()))?;
        let withheld = self.withheld.clone();
        let real = withheld.unseal_release(scope, release);
        let secrets = withheld.values();
        crate::run::runtime_with_tools(config, store, model, &real, tools, secrets, |pool| {
            Arc::new(Unsealing {
                inner: pool,
                withheld,
                scope,
            })
        })
        .await
        .map_err(|e| internal(&e))
    }

    /// Tells the client, after the response that names the session: the slash commands a
    /// prompt may start with (the built-ins that answer over ACP), then the notices of loading
    /// its workspace's configuration (an untrusted `keel.toml`'s ignored sections, say) as one
    /// `agent_message_chunk` — an editor shows no standard error. Once per `session/new` or
    /// `session/load`.
    fn announce(&self, session: SessionId, notices: &[String]) {
        let Ok(conn) = self.connection() else { return };
        let commands: Vec<Value> = keel_runtime::input::BUILTIN_COMMANDS
            .iter()
            .filter(|(name, _)| super::turn::OVER_ACP.contains(name))
            .map(|(name, what)| {
                let mut c = json!({"name": name, "description": what});
                if *name == "compact" {
                    c["input"] = json!({"hint": "what to keep (optional)"});
                }
                c
            })
            .collect();
        let mut updates: Vec<acp::SessionUpdate> = update(json!({
            "sessionUpdate": "available_commands_update",
            "availableCommands": commands,
        }))
        .into_iter()
        .collect();
        if !notices.is_empty() {
            let text: String = notices.iter().map(|n| format!("({n})\n")).collect();
            updates.extend(super::updates::chunk("agent_message_chunk", &text));
        }
        tokio::task::spawn_local(async move {
            // After the response is queued: the client knows the session id by then.
            tokio::task::yield_now().await;
            for u in updates {
                let _ = conn
                    .session_notification(acp::SessionNotification::new(
                        acp::SessionId::new(session.to_string()),
                        u,
                    ))
                    .await;
            }
        });
    }

    fn host(&self, p: Prepared, config: Config) -> Rc<Hosted> {
        let hosted = Rc::new(Hosted {
            input: crate::input::input_options(&config, false),
            workspace: config.workspace.clone(),
            config,
            p,
            busy: tokio::sync::Mutex::new(()),
            interrupt: tokio::sync::watch::channel(Interrupt::None).0,
            asking: Cell::new(false),
            accepted: Cell::new(0),
            cancelled_upto: Cell::new(0),
            gone: Cell::new(false),
        });
        self.sessions
            .borrow_mut()
            .insert(hosted.p.session.to_string(), hosted.clone());
        hosted
    }

    async fn new_session(&self, req: acp::NewSessionRequest) -> Result<Value, acp::Error> {
        check_cwd(&req.cwd)?;
        let mut config = self.load_config(&req.cwd)?;
        let scope = self.withheld.scope();
        for (i, server) in req.mcp_servers.into_iter().enumerate() {
            let (name, entry) = mcp_entry(&self.withheld, scope, &BTreeMap::new(), i, server)?;
            config.merged.mcp_servers.insert(name, entry);
        }
        let model = build_route(&config)
            .map_err(|e| auth_error(&e).unwrap_or_else(|| internal(&anyhow::Error::new(e))))?;
        let store = crate::store::open(&config.store)
            .await
            .map_err(|e| internal(&e.into()))?;
        let release = release_of(&config);
        let runtime = self
            .runtime(&config, store, Arc::new(model), &release, scope)
            .await?;
        let tenant = local_tenant();
        let session = runtime
            .create_session(tenant, &release, session_config_of(&config))
            .await
            .map_err(|e| internal(&e.into()))?;
        let mode = config.permission_mode;
        let notices = config.notices.clone();
        let p = prepared(runtime, session);
        self.host(p, config);
        self.announce(session, &notices);
        Ok(json!({"sessionId": session.to_string(), "modes": modes(mode, self.ceiling())}))
    }

    async fn load_session(&self, req: acp::LoadSessionRequest) -> Result<Value, acp::Error> {
        let session: SessionId = crate::sessions::parse_session(&req.session_id.0)
            .map_err(|e| invalid(Some("sessionId"), e.to_string()))?;
        // Loading it again would replay its history into the running prompt's updates (the
        // map is keyed by the canonical spelling, as every id that reaches it).
        if let Some(h) = self.sessions.borrow().get(&session.to_string())
            && h.busy.try_lock().is_err()
        {
            return Err(invalid(
                Some("sessionId"),
                format!(
                    "session {session} is running a session/prompt on this connection: it is already loaded; wait for the prompt to end (or session/cancel it)"
                ),
            ));
        }
        check_cwd(&req.cwd)?;
        let user = Config::load_user(
            None,
            &Locations::from_env(),
            &self.args.overrides(self.global.store.as_deref()),
        )
        .map_err(|e| internal(&e.into()))?;
        let store = crate::store::open(&user.store)
            .await
            .map_err(|e| internal(&e.into()))?;
        let pinned = pinned(&store, session).await.map_err(|e| {
            failure(
                acp::Error::resource_not_found(None),
                "not_found",
                crate::report::describe(&e),
                json!({"field": "sessionId", "uri": req.session_id.0.to_string()}),
            )
        })?;
        if !same_dir(&req.cwd, &pinned.config.workspace) {
            return Err(invalid(
                Some("cwd"),
                format!(
                    "cwd {} is not the session's workspace {}: open the session from its workspace",
                    req.cwd.display(),
                    pinned.config.workspace.display()
                ),
            ));
        }
        let mut config = self.load_config(&pinned.config.workspace)?;
        config.model_route = pinned.release.definition.model_route.clone();
        if let Some(url) = pinned_base_url(&pinned.config) {
            config.base_url = Some(url);
        }
        let model = build_route(&config)
            .map_err(|e| auth_error(&e).unwrap_or_else(|| internal(&anyhow::Error::new(e))))?;
        // The client's MCP servers join the session's own: the session is re-pinned (journaled
        // `session.release_pinned`, as `keel resume --model` does) to the same definition with
        // them added; the same servers again change nothing. A session with a turn waiting
        // cannot be re-pinned: it keeps its own servers (said on standard error).
        let mut release = pinned.release.clone();
        let scope = self.withheld.scope();
        for (i, server) in req.mcp_servers.into_iter().enumerate() {
            let (name, entry) = mcp_entry(
                &self.withheld,
                scope,
                &pinned.release.definition.mcp_servers,
                i,
                server,
            )?;
            release
                .definition
                .mcp_servers
                .insert(name, serde_json::to_value(entry).unwrap_or(Value::Null));
        }
        let mut release = keel_core::Release::new(release.definition);
        let mut runtime = self
            .runtime(
                &config,
                store.clone(),
                Arc::new(model.clone()),
                &release,
                scope,
            )
            .await?;
        if release.id != pinned.release.id
            && let Err(e) = runtime.repin(local_tenant(), session, &release).await
        {
            tracing::warn!(
                "acp: session {session} keeps its own MCP servers (the client's need a re-pin: {e})"
            );
            release = pinned.release.clone();
            runtime = self
                .runtime(&config, store.clone(), Arc::new(model), &release, scope)
                .await?;
        }
        let (events, _) = crate::sessions::load_state(&store, session)
            .await
            .map_err(|e| internal(&e))?;
        // `keel acp --permission-mode M` holds for loaded sessions too (as `keel resume
        // --permission-mode` does): a session saved in a looser mode is brought down to M.
        let mut mode = pinned.config.permission_mode;
        if let Some(ceiling) = self.ceiling()
            && !within(mode, Some(ceiling))
        {
            runtime
                .update_config(local_tenant(), session, |c| c.permission_mode = ceiling)
                .await
                .map_err(|e| internal(&e.into()))?;
            mode = ceiling;
        }
        let mut mapper = Mapper::new(pinned.config.workspace.clone(), true);
        for event in &events {
            for u in mapper.event(event) {
                self.notify(&req.session_id, u).await;
            }
        }
        let notices = config.notices.clone();
        let p = prepared(runtime, session);
        self.host(p, config);
        self.announce(session, &notices);
        Ok(json!({"modes": modes(mode, self.ceiling())}))
    }
}

/// The one spelling of a session id the connection uses (lowercase, hyphenated): an editor's
/// other spellings of the same UUID (uppercase, braces, `urn:uuid:`, no hyphens, spaces) name
/// the same session, and are made this one where they enter, so that the guards keyed by it
/// (a prompt running, the interrupt of the running prompt) hold whatever the spelling.
///
/// # Errors
/// Invalid params: not a session id.
pub fn canonical(id: &acp::SessionId) -> Result<acp::SessionId, acp::Error> {
    let session = crate::sessions::parse_session(&id.0)
        .map_err(|e| invalid(Some("sessionId"), e.to_string()))?;
    Ok(acp::SessionId::new(session.to_string()))
}

/// A `cwd` a session may work in: an absolute path to a directory.
///
/// # Errors
/// Invalid params naming `cwd`.
fn check_cwd(cwd: &std::path::Path) -> Result<(), acp::Error> {
    let problem = if !cwd.is_absolute() {
        "must be an absolute path"
    } else if !cwd.is_dir() {
        "is not a directory"
    } else {
        return Ok(());
    };
    Err(invalid(
        Some("cwd"),
        format!("cwd {} {problem}", cwd.display()),
    ))
}

/// Whether `a` and `b` name the same directory (symlinks resolved).
fn same_dir(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

fn prepared(runtime: keel_runtime::Runtime, session: SessionId) -> Prepared {
    Prepared {
        runtime,
        tenant: local_tenant(),
        session,
        from_seq: 1,
        turn: None,
        continues: true,
        started: std::time::Instant::now(),
        command: None,
    }
}

#[async_trait::async_trait(?Send)]
impl acp::Agent for KeelAgent {
    async fn initialize(
        &self,
        args: acp::InitializeRequest,
    ) -> Result<acp::InitializeResponse, acp::Error> {
        *self.client.borrow_mut() = args.client_capabilities.clone();
        // Keel speaks protocol version 1 (the one current editors speak); an older client
        // is answered with 1 too, as the spec says, and may disconnect.
        wire(json!({
            "protocolVersion": 1,
            "agentCapabilities": {
                "loadSession": true,
                "promptCapabilities": {"image": false, "audio": false, "embeddedContext": true},
                "mcpCapabilities": {"http": true, "sse": false},
            },
            "authMethods": [{
                "id": AUTH_METHOD,
                "name": "Provider API key",
                "description": "Keel reads the model provider's key from its environment (OPENAI_API_KEY, ANTHROPIC_API_KEY, or the variable [providers.NAME] api_key_env names): set it in the editor's agent server env and restart the agent",
            }],
            "agentInfo": {"name": "keel", "title": "Keel", "version": env!("CARGO_PKG_VERSION")},
        }))
    }

    async fn authenticate(
        &self,
        args: acp::AuthenticateRequest,
    ) -> Result<acp::AuthenticateResponse, acp::Error> {
        if &*args.method_id.0 != AUTH_METHOD {
            return Err(invalid(
                Some("methodId"),
                format!("unknown auth method {}", args.method_id.0),
            ));
        }
        // The key is read from the environment when a session starts: said now if it is missing
        // for the configuration of the directory `keel acp` started in (the user's, and its
        // workspace's keel.toml), the protocol's `auth_required` naming the variable.
        let cwd = std::env::current_dir().map_err(|e| internal(&e.into()))?;
        let config = self.load_config(&cwd)?;
        if let Err(e) = build_route(&config)
            && let Some(auth) = auth_error(&e)
        {
            return Err(auth);
        }
        wire(json!({}))
    }

    async fn new_session(
        &self,
        args: acp::NewSessionRequest,
    ) -> Result<acp::NewSessionResponse, acp::Error> {
        wire(KeelAgent::new_session(self, args).await?)
    }

    async fn load_session(
        &self,
        mut args: acp::LoadSessionRequest,
    ) -> Result<acp::LoadSessionResponse, acp::Error> {
        args.session_id = canonical(&args.session_id)?;
        wire(KeelAgent::load_session(self, args).await?)
    }

    async fn set_session_mode(
        &self,
        mut args: acp::SetSessionModeRequest,
    ) -> Result<acp::SetSessionModeResponse, acp::Error> {
        args.session_id = canonical(&args.session_id)?;
        let hosted = self.hosted(&args.session_id)?;
        let mode = PermissionMode::parse(&args.mode_id.0).map_err(|_| {
            invalid(
                Some("modeId"),
                format!(
                    "unknown mode {:?}: use default, accept_edits, read_only or bypass",
                    args.mode_id.0
                ),
            )
        })?;
        if let Some(ceiling) = self.ceiling()
            && !within(mode, Some(ceiling))
        {
            return Err(invalid(
                Some("modeId"),
                format!(
                    "mode {} is looser than keel acp's --permission-mode {}",
                    mode_id(mode),
                    mode_id(ceiling)
                ),
            ));
        }
        hosted
            .p
            .runtime
            .update_config(hosted.p.tenant, hosted.p.session, |c| {
                c.permission_mode = mode;
            })
            .await
            .map_err(|e| internal(&e.into()))?;
        if let Some(u) =
            update(json!({"sessionUpdate": "current_mode_update", "currentModeId": mode_id(mode)}))
        {
            self.notify(&args.session_id, u).await;
        }
        wire(json!({}))
    }

    async fn prompt(
        &self,
        mut args: acp::PromptRequest,
    ) -> Result<acp::PromptResponse, acp::Error> {
        args.session_id = canonical(&args.session_id)?;
        let hosted = self.hosted(&args.session_id)?;
        super::turn::prompt(self, &hosted, args).await
    }

    async fn cancel(&self, args: acp::CancelNotification) -> Result<(), acp::Error> {
        let hosted = self.hosted(&args.session_id)?;
        // A permission request is not waited on (the client answers it `cancelled`); a prompt
        // accepted and not yet running is cancelled too (it answers `cancelled` when its turn
        // comes).
        hosted.cancelled_upto.set(hosted.accepted.get());
        hosted.interrupt.send_replace(Interrupt::Cancel);
        match hosted
            .p
            .runtime
            .cancel_turn(hosted.p.tenant, hosted.p.session)
            .await
        {
            Ok(_) | Err(keel_runtime::RuntimeError::NoActiveTurn { .. }) => Ok(()),
            Err(e) => Err(internal(&e.into())),
        }
    }
}
