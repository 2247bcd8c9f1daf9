//! Building the effective [`Config`] from defaults, the layers and the overrides, and showing it.

use super::*;

impl Config {
    /// Builds the effective configuration: defaults, the user file, the workspace's `keel.toml`
    /// (admitted as the module docs say: only tightening unless the user config trusts the
    /// workspace), then `overrides`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file or field at fault; [`ConfigError::Untrusted`] for a
    /// workspace file that loosens a setting or sets a key it may not.
    pub fn load(
        workspace: Option<&Path>,
        locations: &Locations,
        overrides: &Overrides,
    ) -> Result<Self, ConfigError> {
        Self::load_layers(workspace, locations, overrides, true)
    }

    /// As [`Config::load`] without the workspace's `keel.toml`: defaults, the user file, then
    /// `overrides`. For commands that only need the store (`sessions`, `approve`, `deny`,
    /// `resolve`, `cancel`) and for finding a session before resuming it: the store never
    /// comes from a workspace file, so a repository whose file keel refuses cannot stop them.
    ///
    /// # Errors
    /// [`ConfigError`] naming the user file or flag at fault.
    pub fn load_user(
        workspace: Option<&Path>,
        locations: &Locations,
        overrides: &Overrides,
    ) -> Result<Self, ConfigError> {
        Self::load_layers(workspace, locations, overrides, false)
    }

    fn load_layers(
        workspace: Option<&Path>,
        locations: &Locations,
        overrides: &Overrides,
        read_workspace_file: bool,
    ) -> Result<Self, ConfigError> {
        let workspace = resolve_workspace(workspace)?;
        let mut merged = toml::Table::new();
        let mut sources = Vec::new();
        let mut notices = Vec::new();
        let workspace_file = workspace.join(CONFIG_FILE);
        let mut user = FileConfig::default();
        if let Some(user_file) = &locations.user_file
            && let Some(layer) = read_table(user_file)?
        {
            refuse_reserved(user_file, &layer, "remove it")?;
            user = check_layer(user_file, &layer)?;
            merge(&mut merged, layer);
            sources.push(user_file.display().to_string());
        }
        // The user file may name the workspace's own keel.toml (a workspace in the config dir):
        // read it once, as the user's.
        let same_file = locations.user_file.as_ref() == Some(&workspace_file);
        // Read once: the bytes trusted (their hash) are the bytes applied.
        let workspace_bytes = if read_workspace_file && !same_file {
            read_config_bytes(&workspace_file)?
        } else {
            None
        };
        // The agent and command files trust covers, read once too.
        let covered = if read_workspace_file {
            crate::trust::read_covered(&workspace)
        } else {
            Vec::new()
        };
        let user_file_shown = locations.user_file.as_ref().map_or_else(
            || "~/.config/keel/keel.toml".to_owned(),
            |p| p.display().to_string(),
        );
        let trust = match &locations.user_file {
            Some(user_file) if read_workspace_file => crate::trust::is_trusted(
                &workspace,
                &crate::trust::pin_of_workspace(workspace_bytes.as_deref(), &covered),
                user.trusted_workspaces.as_deref().unwrap_or_default(),
                user_file,
            )?,
            _ => crate::trust::Trust::Untrusted,
        };
        let trusted = trust == crate::trust::Trust::Trusted;
        let retrust = || {
            format!(
                "review it, then `keel trust {}` to trust this version",
                workspace.display()
            )
        };
        match trust {
            crate::trust::Trust::Changed => notices.push(format!(
                "keel: {} or its {AGENTS_DIR}/*.md or {COMMANDS_DIR}/*.md files changed since you trusted {} (or appeared, or went away): it is untrusted, may only tighten your settings, and its agents and commands are not used; {}",
                workspace_file.display(),
                workspace.display(),
                retrust()
            )),
            crate::trust::Trust::Unpinned => notices.push(format!(
                "keel: trusted_workspaces lists {} without the keel.toml version you trust (keel_toml): it is untrusted and may only tighten your settings; {}",
                workspace.display(),
                retrust()
            )),
            crate::trust::Trust::Trusted | crate::trust::Trust::Untrusted => {}
        }
        if let Some(bytes) = &workspace_bytes {
            let mut layer = parse_table(&workspace_file, bytes)?;
            let file = WorkspaceFile {
                path: &workspace_file,
                workspace: &workspace,
                user_file: user_file_shown.clone(),
                trusted,
                why_untrusted: match trust {
                    crate::trust::Trust::Changed => Some(
                        "its keel.toml (or an agent or command file under .keel) changed since you trusted it (or appeared, or went away)",
                    ),
                    crate::trust::Trust::Unpinned => {
                        Some("without the keel.toml version you trust (keel_toml)")
                    }
                    crate::trust::Trust::Trusted | crate::trust::Trust::Untrusted => None,
                },
            };
            file.refuse_never(&layer)?;
            file.refuse_script_model(&layer, overrides)?;
            file.take_reserved(&mut layer, &mut notices)?;
            let checked = check_layer(&workspace_file, &layer)?;
            if !trusted {
                file.refuse_loosening(&checked, &user, overrides)?;
            }
            file.take_allow(&mut layer, &mut notices);
            file.take_hooks(&mut layer, &mut notices);
            file.take_taken_agent_names(&mut layer, &user, &mut notices);
            merge_workspace(&mut merged, layer);
            sources.push(format!(
                "{}{}",
                workspace_file.display(),
                if trusted { " (trusted)" } else { "" }
            ));
        }
        let flags = overrides.to_table();
        if let Some(model) = &overrides.model
            && let Some(fallbacks) = merged
                .get("fallback_models")
                .and_then(toml::Value::as_array)
                .filter(|f| !f.is_empty())
        {
            let names: Vec<&str> = fallbacks.iter().filter_map(toml::Value::as_str).collect();
            notices.push(format!(
                "keel: --model {model} replaces the configured model route: fallback_models ({}) are not used",
                names.join(", ")
            ));
        }
        if overrides.base_url.is_some()
            && let Some(model) = &overrides.model
            && !base_url_applies(model)
        {
            return Err(ConfigError::Value {
                field: "--model",
                value: model.clone(),
                expected: "--base-url applies to openai: and openai-responses: models only (drop --base-url, or set [providers.NAME] base_url in keel.toml)",
            });
        }
        if !flags.is_empty() {
            merge(&mut merged, flags);
            sources.push("flags".into());
        }
        let file: FileConfig =
            FileConfig::deserialize(toml::Value::Table(merged)).map_err(|e| {
                ConfigError::Invalid {
                    sources: sources.join(", "),
                    message: e.to_string().trim().replace('\n', " "),
                }
            })?;
        let mut config = Self::from_file_config(workspace, sources, file, locations)?;
        // A repository's agent files count only when the workspace is trusted.
        let agents_dir = config.workspace.join(AGENTS_DIR);
        if trusted || same_file {
            for (name, (path, agent)) in parse_agent_files(&covered, &mut notices)? {
                if !same_file {
                    if let Some(spec) = &agent.model {
                        refuse_model_server(&path, "model", spec, &user_file_shown)?;
                    }
                    if let Some(why) = taken_agent_name(&name, &user) {
                        notices.push(format!(
                            "keel: note: {} defines agent `{name}`; refused: {why}",
                            path.display()
                        ));
                        continue;
                    }
                }
                config
                    .agents
                    .entry(name.clone())
                    .or_insert_with(|| agent_definition(&name, &agent, &config.workspace));
            }
        } else if read_workspace_file && agents_dir.is_dir() {
            config.notices.push(format!(
                "keel: note: {} holds agent definitions; ignored: a workspace's apply only if you trust it (keel trust {})",
                agents_dir.display(),
                config.workspace.display()
            ));
        }
        if trusted || same_file {
            config.workspace_commands = workspace_commands(&covered);
        }
        config.notices.splice(0..0, notices);
        config.trusted = trusted;
        Ok(config)
    }

    fn from_file_config(
        workspace: PathBuf,
        sources: Vec<String>,
        file: FileConfig,
        locations: &Locations,
    ) -> Result<Self, ConfigError> {
        // A relative `script:` path in a file is relative to the workspace (flags were made
        // absolute against the current directory already).
        let model_route: Vec<String> = file
            .model
            .iter()
            .chain(file.fallback_models.iter().flatten())
            .map(|s| crate::model_spec::absolutize(s, &workspace))
            .collect();
        let permission_mode = match &file.permission_mode {
            Some(m) => parse_permission_mode(m)?,
            None => PermissionMode::Default,
        };
        let sandbox = match &file.sandbox {
            Some(m) => parse_sandbox(m)?,
            None => SandboxMode::WorkspaceWrite,
        };
        let output = match &file.output {
            Some(m) => parse_output(m)?,
            None => OutputFormat::Text,
        };
        let store = match &file.store {
            Some(s) => s.clone(),
            None => default_store(locations)?,
        };
        validate_layer(&file)?;
        let b = file.budget.clone().unwrap_or_default();
        let budget = Budget {
            max_steps: b.max_steps,
            max_tokens: b.max_tokens,
            max_cost_usd: b.max_cost_usd.map(check_cost).transpose()?,
            max_tool_calls: b.max_tool_calls,
            max_wall_time_ms: b
                .timeout
                .as_deref()
                .map(|t| parse_duration_field("budget.timeout", t))
                .transpose()?,
        };
        let timeouts = file.timeouts.clone().unwrap_or_default().parse()?;
        let agents = file
            .agents
            .iter()
            .map(|(n, a)| (n.clone(), agent_definition(n, a, &workspace)))
            .collect();
        Ok(Config {
            workspace,
            sources,
            model_route,
            base_url: file.base_url.clone(),
            instructions: file.instructions.clone().unwrap_or_default(),
            context_window: file.context_window,
            permission_mode,
            sandbox,
            sandbox_network: file.sandbox_network.unwrap_or(false),
            output,
            store,
            keep_reasoning: file.keep_reasoning.unwrap_or(false),
            budget,
            timeouts,
            tools: file
                .tools
                .as_ref()
                .map(|t| t.enabled.clone())
                .unwrap_or_default(),
            policy: file.policy.clone().unwrap_or_default(),
            providers: file.providers.clone(),
            env: file.env.clone(),
            hooks: file.hooks.clone().unwrap_or_default(),
            agents,
            subagents: file.subagents.clone().unwrap_or_default(),
            memory: file
                .memory
                .as_ref()
                .map(MemoryConfig::settings)
                .transpose()?
                .flatten(),
            merged: file,
            trusted: false,
            notices: Vec::new(),
            workspace_commands: Vec::new(),
        })
    }

    /// The effective configuration as TOML values, defaults filled in, secrets masked; what
    /// `keel config show` prints.
    pub fn to_masked_table(&self) -> toml::Table {
        let mut shown = self.merged.clone();
        shown.model = self.model_route.first().cloned();
        shown.permission_mode = Some(snake(&self.permission_mode));
        shown.sandbox = Some(self.sandbox.as_str().to_owned());
        shown.sandbox_network = Some(self.sandbox_network);
        shown.output = Some(snake(&self.output));
        shown.store = Some(self.store.clone());
        // Timeouts with their defaults; the model limits only when set (none by default).
        let mut t = shown.timeouts.clone().unwrap_or_default();
        let fill = |v: &mut Option<String>, ms: u64| {
            v.get_or_insert_with(|| format_duration_ms(ms));
        };
        fill(&mut t.tool, self.timeouts.tool_ms);
        fill(&mut t.stream_idle, self.timeouts.stream_idle_ms);
        shown.timeouts = Some(t);
        shown.keep_reasoning = Some(self.keep_reasoning);
        // Agents from every source (`[agents]`, a trusted workspace's `.keel/agents/*.md`).
        shown.agents = self
            .agents
            .iter()
            .map(|(n, d)| {
                let agent = AgentConfig {
                    instructions: Some(d.instructions.clone()),
                    tools: (!d.tools.is_empty()).then(|| d.tools.clone()),
                    model: d.model_route.first().cloned(),
                };
                (n.clone(), agent)
            })
            .collect();
        let mut table = match toml::Value::try_from(&shown) {
            Ok(toml::Value::Table(t)) => t,
            _ => toml::Table::new(),
        };
        table.insert(
            "workspace".into(),
            toml::Value::String(self.workspace.display().to_string()),
        );
        table.insert(
            "workspace_trusted".into(),
            toml::Value::Boolean(self.trusted),
        );
        // Keys the providers read from the environment, shown as set or not, never their values.
        for (provider, var) in [
            ("openai", "OPENAI_API_KEY"),
            ("anthropic", "ANTHROPIC_API_KEY"),
        ] {
            let settings = self.providers.get(provider);
            let var = settings
                .and_then(|s| s.api_key_env.clone())
                .unwrap_or_else(|| var.to_owned());
            if settings.is_some_and(|s| s.api_key.is_some()) {
                continue;
            }
            if std::env::var_os(&var).is_some_and(|v| !v.is_empty()) {
                let providers = table
                    .entry("providers")
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()));
                if let toml::Value::Table(providers) = providers
                    && let toml::Value::Table(p) = providers
                        .entry(provider)
                        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                {
                    p.insert(
                        "api_key".into(),
                        toml::Value::String(format!("{MASK} (from ${var})")),
                    );
                }
            }
        }
        mask_secrets(&mut table, &self.env);
        table
    }
}
