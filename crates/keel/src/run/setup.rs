//! What a run is built from: the release and session config of a [`Config`], the tools' environment, and the runtime.

use super::*;

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
        let given = store.strip_prefix("sqlite://").unwrap_or(store);
        // SQLite keeps `-wal`, `-shm` and `-journal` beside the file a symlinked name points
        // to: hide those of the real file (and the names as given).
        let real = std::fs::canonicalize(given)
            .ok()
            .and_then(|p| p.to_str().map(str::to_owned));
        let db = real.as_deref().unwrap_or(given);
        for suffix in ["", "-wal", "-shm", "-journal"] {
            paths.push(format!("{db}{suffix}").into());
            if db != given {
                paths.push(format!("{given}{suffix}").into());
            }
        }
        // The sandbox covers what exists, and in WAL mode SQLite never makes `-journal`: with
        // the store in a writable workspace a confined command could create one, and a forged
        // "hot journal" there is rolled back into the database at its next open, destroying
        // it. An empty journal is never hot (SQLite reads its first byte as zero), so keel
        // makes one to be covered like the others.
        let journal = std::path::PathBuf::from(format!("{db}-journal"));
        if journal.parent().is_some_and(std::path::Path::is_dir) {
            use std::os::unix::fs::OpenOptionsExt;
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&journal)
            {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => tracing::warn!(
                    "could not create {} to hide it from confined commands: {e}",
                    journal.display()
                ),
            }
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
pub(super) fn subagent_options(config: &Config) -> keel_runtime::SubagentOptions {
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

pub(super) fn runtime_for(
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
