//! Admitting the workspace's `keel.toml`: what it may only tighten, what it may never set, what needs trust.

use super::*;

/// How strict a permission mode is: higher is stricter.
pub(super) fn permission_rank(mode: PermissionMode) -> u8 {
    match mode {
        PermissionMode::ReadOnly => 3,
        PermissionMode::Default => 2,
        PermissionMode::AcceptEdits => 1,
        PermissionMode::Bypass => 0,
    }
}

/// How strict a sandbox is: higher is stricter.
pub(super) fn sandbox_rank(mode: SandboxMode) -> u8 {
    match mode {
        SandboxMode::ReadOnly => 2,
        SandboxMode::WorkspaceWrite => 1,
        SandboxMode::Off => 0,
    }
}

/// Keys a workspace's `keel.toml` may never set, trusted or not: what each could do, and where
/// the setting belongs instead (`{user}` is replaced by the user config's path, `{ws}` by the
/// workspace's).
pub(super) const NEVER_FROM_WORKSPACE: [(&str, &str, &str); 6] = [
    (
        "providers",
        "could send your API keys (or any environment variable, as api_key_env) to a server of its choosing",
        "put it in your user config {user}",
    ),
    (
        "base_url",
        "could send your API key to a server of its choosing",
        "put it in your user config {user} or pass --base-url",
    ),
    (
        "store",
        "could make keel write into another database file",
        "put it in your user config {user} or pass --store",
    ),
    (
        "env",
        "could hide text from the approvals you are asked (its secret values are shown as [REDACTED]) or un-mark your secrets (secret = false)",
        "put it in your user config {user}",
    ),
    (
        "sandbox_network",
        "could give every shell command the host's network, loopback services included",
        "put it in your user config {user} or pass --sandbox-network",
    ),
    (
        "trusted_workspaces",
        "could trust itself or other directories",
        "to trust this workspace, run `keel trust {ws}` (it writes your user config {user})",
    ),
];

/// Refuses a model spec of a workspace file (`keel.toml`'s `model`, `fallback_models`,
/// `[agents.NAME] model`, or a `.keel/agents/NAME.md` front matter's `model:`) that carries its
/// own server (`openai:M@http://…`): it is a `base_url` by another name, which a workspace may
/// never set, trusted or not (it could send the user's API key to a server of its choosing).
///
/// # Errors
/// [`ConfigError::Untrusted`] naming `file`, `key` and the spec, and where the server belongs.
pub(super) fn refuse_model_server(
    file: &Path,
    key: &str,
    spec: &str,
    user_file: &str,
) -> Result<(), ConfigError> {
    match crate::model_spec::split_base_url(spec) {
        (bare, Some(_)) => Err(ConfigError::Untrusted(format!(
            "{} sets `{key}` to {spec:?}, a model with its own server address, which a workspace file may not (trusted or not): it could send your API key to a server of its choosing; write {bare:?} and set the server as base_url in your user config {user_file} or pass --base-url",
            file.display(),
        ))),
        (_, None) => Ok(()),
    }
}

/// Why a repository (a workspace's `keel.toml` or `.keel/agents/*.md`) may not define an agent
/// named `name`, if it may not: the name picks the agent's memory namespace (`agent:NAME`), so
/// taking [`MAIN_AGENT`]'s or a user-config agent's name would read and write that agent's
/// memory (shared across every workspace) and stand in for the user's own agent.
pub(super) fn taken_agent_name(name: &str, user: &FileConfig) -> Option<String> {
    if name == MAIN_AGENT {
        return Some(format!(
            "`{MAIN_AGENT}` is the main agent's name (and memory, agent:{MAIN_AGENT}); a repository's agent may not take it"
        ));
    }
    user.agents.contains_key(name).then(|| {
        format!(
            "your user config defines an agent of that name (and its memory, agent:{name}); a repository's agent may not take it"
        )
    })
}

/// The workspace's `keel.toml` while it is checked and admitted (see the module docs).
pub(super) struct WorkspaceFile<'a> {
    /// The file.
    pub(super) path: &'a Path,
    /// The workspace (canonical), named in `keel trust WS`.
    pub(super) workspace: &'a Path,
    /// The user config, as named in messages.
    pub(super) user_file: String,
    /// Whether the user config trusts the workspace.
    pub(super) trusted: bool,
    /// Why a listed workspace is not trusted now (its keel.toml changed since, or no version
    /// is pinned), added to refusals.
    pub(super) why_untrusted: Option<&'static str>,
}

impl WorkspaceFile<'_> {
    /// Refuses what a workspace file may never set, trusted or not ([`NEVER_FROM_WORKSPACE`]),
    /// and a model spec carrying its own server (`openai:M@http://…`, the form earlier builds
    /// pinned into releases): it is a `base_url` by another name.
    pub(super) fn refuse_never(&self, layer: &toml::Table) -> Result<(), ConfigError> {
        for (key, why, how) in NEVER_FROM_WORKSPACE {
            if layer.contains_key(key) {
                let how = how
                    .replace("{user}", &self.user_file)
                    .replace("{ws}", &self.workspace.display().to_string());
                return Err(ConfigError::Untrusted(format!(
                    "{} sets `{key}`, which a workspace's keel.toml may not (trusted or not): it {why}; {how}",
                    self.path.display()
                )));
            }
        }
        let model = layer
            .get("model")
            .and_then(toml::Value::as_str)
            .map(|s| ("model", s));
        let fallbacks = layer
            .get("fallback_models")
            .and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(toml::Value::as_str)
            .map(|s| ("fallback_models", s));
        let agents: Vec<(String, &str)> = layer
            .get("agents")
            .and_then(toml::Value::as_table)
            .into_iter()
            .flatten()
            .filter_map(|(name, agent)| {
                let spec = agent.get("model").and_then(toml::Value::as_str)?;
                Some((format!("agents.{name}.model"), spec))
            })
            .collect();
        for (key, spec) in model
            .into_iter()
            .chain(fallbacks)
            .map(|(k, s)| (k.to_owned(), s))
            .chain(agents)
        {
            refuse_model_server(self.path, &key, spec, &self.user_file)?;
        }
        Ok(())
    }

    /// Refuses, in an untrusted workspace's file, a scripted model (`model` or
    /// `fallback_models` naming `script:FILE`): its "model" is a file of the repository's
    /// choosing, so the repository would speak as the model (and propose the calls the user is
    /// asked about). `--model` replaces the configured route, so with it nothing is refused.
    ///
    /// # Errors
    /// [`ConfigError::Untrusted`] naming the file, the key and the two ways out.
    pub(super) fn refuse_script_model(
        &self,
        layer: &toml::Table,
        overrides: &Overrides,
    ) -> Result<(), ConfigError> {
        if self.trusted || overrides.model.is_some() {
            return Ok(());
        }
        let model = layer.get("model").map(|m| ("model", m));
        let fallbacks = layer
            .get("fallback_models")
            .and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
            .map(|m| ("fallback_models", m));
        for (key, spec) in model.into_iter().chain(fallbacks) {
            let Some(spec) = spec
                .as_str()
                .filter(|s| s.trim_start().starts_with("script:"))
            else {
                continue;
            };
            let ws = self.workspace.display();
            return Err(ConfigError::Untrusted(format!(
                "{} sets `{key}` to {spec:?}, a scripted model whose answers are a file of the repository's: an untrusted workspace may not name one (the repository would speak as the model); if you trust this repository run `keel trust {ws}`{}, or pass --model to use another model",
                self.path.display(),
                self.why_untrusted
                    .map(|why| format!(" (it is in trusted_workspaces, but {why})"))
                    .unwrap_or_default(),
            )));
        }
        Ok(())
    }

    /// Takes out the reserved sections ([`RESERVED_KEYS`]) of an untrusted workspace's file,
    /// with a notice each; refuses them in a trusted one's (they would apply, and keel cannot
    /// honour them).
    pub(super) fn take_reserved(
        &self,
        layer: &mut toml::Table,
        notices: &mut Vec<String>,
    ) -> Result<(), ConfigError> {
        let ws = self.workspace.display();
        if self.trusted {
            return refuse_reserved(
                self.path,
                layer,
                &format!("remove it, or stop trusting the workspace (keel trust --remove {ws})"),
            );
        }
        for (key, what) in TRUSTED_ONLY_KEYS {
            if layer.remove(key).is_some() {
                notices.push(format!(
                    "keel: note: {} sets `{key}`; ignored: it {what}, and a workspace's applies only if you trust it (keel trust {ws})",
                    self.path.display()
                ));
            }
        }
        for (key, what) in RESERVED_KEYS {
            if layer.remove(key).is_some() {
                notices.push(format!(
                    "keel: note: {} sets `{key}`; ignored: keel does not {what} yet, and a workspace's will apply only if you trust it (keel trust {ws})",
                    self.path.display()
                ));
            }
        }
        Ok(())
    }

    /// Takes out the `[agents.NAME]` entries of the workspace's file whose name is taken
    /// ([`taken_agent_name`]), with a notice each.
    pub(super) fn take_taken_agent_names(
        &self,
        layer: &mut toml::Table,
        user: &FileConfig,
        notices: &mut Vec<String>,
    ) {
        let Some(toml::Value::Table(agents)) = layer.get_mut("agents") else {
            return;
        };
        let names: Vec<String> = agents.keys().cloned().collect();
        for name in names {
            if let Some(why) = taken_agent_name(&name, user) {
                agents.remove(&name);
                notices.push(format!(
                    "keel: note: {} defines [agents.{name}]; refused: {why}",
                    self.path.display()
                ));
            }
        }
    }

    /// Takes out the `[hooks]` of an untrusted workspace's file (they run code), with a notice;
    /// announces those of a trusted one, which run after the user's.
    pub(super) fn take_hooks(&self, layer: &mut toml::Table, notices: &mut Vec<String>) {
        let (ws, file) = (self.workspace.display(), self.path.display());
        if self.trusted {
            if layer.contains_key("hooks") {
                notices.push(format!(
                    "keel: note: {file} (a workspace you trust) adds [hooks]: commands or URLs keel runs at session events"
                ));
            }
        } else if layer.remove("hooks").is_some() {
            notices.push(format!(
                "keel: note: {file} sets [hooks]; ignored: hooks run code, and a workspace's run only if you trust it (keel trust {ws})"
            ));
        }
    }

    /// Takes out the `allow` rules of an untrusted workspace's file (checked already), with a
    /// notice naming them; announces those of a trusted one, which apply.
    pub(super) fn take_allow(&self, layer: &mut toml::Table, notices: &mut Vec<String>) {
        let ws = self.workspace.display();
        let file = self.path.display();
        if self.trusted {
            let allow = layer
                .get("policy")
                .and_then(|p| p.get("allow"))
                .and_then(toml::Value::as_array)
                .map_or(0, Vec::len);
            if allow > 0 {
                notices.push(format!(
                    "keel: note: {file} (a workspace you trust) adds {allow} `allow` polic{} (calls that run without asking)",
                    if allow == 1 { "y rule" } else { "y rules" }
                ));
            }
            return;
        }
        if let Some(toml::Value::Table(policy)) = layer.get_mut("policy")
            && let Some(allow) = policy.remove("allow")
        {
            // Debug-quoted: the rules are the repository's text, shown on your terminal.
            let rules: Vec<String> = allow
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| format!("{:?}", r.as_str().unwrap_or_default()))
                .collect();
            if !rules.is_empty() {
                notices.push(format!(
                    "keel: note: {file} has `allow` rules, not applied because you do not trust this workspace (the calls they name are decided as usual): {}; to apply them, run `keel trust {ws}` or copy them into your user config {}",
                    rules.join(", "),
                    self.user_file
                ));
            }
        }
    }

    /// The error for a value looser than `baseline`: names the file, the key and the three
    /// ways to accept it (the flag where there is one, the user config, `keel trust`).
    pub(super) fn looser(
        &self,
        key: &str,
        value: &str,
        baseline: &str,
        verb: &str,
        flag: Option<String>,
    ) -> ConfigError {
        let flag = flag.map(|f| format!("pass {f}, ")).unwrap_or_default();
        let why = self
            .why_untrusted
            .map(|w| {
                format!(
                    " — the workspace is listed in trusted_workspaces, but {w}; review it, then"
                )
            })
            .unwrap_or_default();
        ConfigError::Untrusted(format!(
            "{} sets {key} = {value}, looser than {baseline}; a workspace's keel.toml may only {verb} it unless you trust the workspace{why} (to accept: {flag}put it in your user config {}, or run `keel trust {}`)",
            self.path.display(),
            self.user_file,
            self.workspace.display()
        ))
    }

    /// Refuses a limit above the user's (`None`: no limit there, so any value is lower).
    pub(super) fn refuse_higher<T: PartialOrd + std::fmt::Display>(
        &self,
        key: &str,
        ws: Option<T>,
        user: Option<T>,
        flag: Option<(&str, bool)>,
    ) -> Result<(), ConfigError> {
        if flag.is_some_and(|(_, given)| given) {
            return Ok(());
        }
        match (ws, user) {
            (Some(w), Some(u)) if w > u => Err(self.looser(
                key,
                &w.to_string(),
                &format!("{u} from your user config"),
                "lower",
                flag.map(|(f, _)| format!("{f} {w}")),
            )),
            _ => Ok(()),
        }
    }

    /// As [`Self::refuse_higher`] for durations, against the user's value or else `default_ms`.
    pub(super) fn refuse_longer(
        &self,
        key: &'static str,
        ws: Option<&String>,
        user: Option<&String>,
        default_ms: Option<u64>,
        flag: Option<(&str, bool)>,
    ) -> Result<(), ConfigError> {
        if flag.is_some_and(|(_, given)| given) {
            return Ok(());
        }
        let Some(w) = ws else { return Ok(()) };
        let w_ms = parse_duration_field(key, w)?;
        let (base_ms, shown) = match (user, default_ms) {
            (Some(u), _) => (
                parse_duration_field(key, u)?,
                format!("\"{u}\" from your user config"),
            ),
            (None, Some(d)) => (d, format!("\"{}\" (the default)", format_duration_ms(d))),
            (None, None) => return Ok(()),
        };
        if w_ms > base_ms {
            return Err(self.looser(
                key,
                &format!("\"{w}\""),
                &shown,
                "lower",
                flag.map(|(f, _)| format!("{f} {w}")),
            ));
        }
        Ok(())
    }

    /// Refuses, in an untrusted workspace's file, every value looser than the user's (or the
    /// default): permission mode, sandbox, `keep_reasoning`, each `[budget]` and `[timeouts]`
    /// key, tools the user did not enable. A value the flags set is not checked: the flag wins.
    pub(super) fn refuse_loosening(
        &self,
        ws: &FileConfig,
        user: &FileConfig,
        flags: &Overrides,
    ) -> Result<(), ConfigError> {
        let from = |given: bool| {
            if given {
                "from your user config"
            } else {
                "(the default)"
            }
        };
        if let (Some(w), None) = (&ws.permission_mode, &flags.permission_mode) {
            let mode = parse_permission_mode(w)?;
            let base = match &user.permission_mode {
                Some(b) => parse_permission_mode(b)?,
                None => PermissionMode::Default,
            };
            if permission_rank(mode) < permission_rank(base) {
                return Err(self.looser(
                    "permission_mode",
                    &format!("\"{}\"", snake(&mode)),
                    &format!(
                        "\"{}\" {}",
                        snake(&base),
                        from(user.permission_mode.is_some())
                    ),
                    "tighten",
                    Some(format!(
                        "--permission-mode {}",
                        snake(&mode).replace('_', "-")
                    )),
                ));
            }
        }
        if let (Some(w), None) = (&ws.sandbox, &flags.sandbox) {
            let mode = parse_sandbox(w)?;
            let base = match &user.sandbox {
                Some(b) => parse_sandbox(b)?,
                None => SandboxMode::WorkspaceWrite,
            };
            if sandbox_rank(mode) < sandbox_rank(base) {
                return Err(self.looser(
                    "sandbox",
                    &format!("\"{}\"", mode.as_str()),
                    &format!("\"{}\" {}", base.as_str(), from(user.sandbox.is_some())),
                    "tighten",
                    Some(format!("--sandbox {}", mode.as_str().replace('_', "-"))),
                ));
            }
        }
        if ws.keep_reasoning == Some(true)
            && user.keep_reasoning != Some(true)
            && flags.keep_reasoning.is_none()
        {
            return Err(self.looser(
                "keep_reasoning",
                "true (it journals the model's reasoning)",
                &format!("false {}", from(user.keep_reasoning.is_some())),
                "turn off",
                Some("--keep-reasoning".into()),
            ));
        }
        let (wb, ub) = (
            ws.budget.clone().unwrap_or_default(),
            user.budget.clone().unwrap_or_default(),
        );
        self.refuse_higher(
            "budget.max_steps",
            wb.max_steps,
            ub.max_steps,
            Some(("--max-steps", flags.max_steps.is_some())),
        )?;
        self.refuse_higher(
            "budget.max_cost_usd",
            wb.max_cost_usd,
            ub.max_cost_usd,
            Some(("--max-cost-usd", flags.max_cost_usd.is_some())),
        )?;
        self.refuse_higher("budget.max_tokens", wb.max_tokens, ub.max_tokens, None)?;
        self.refuse_higher(
            "budget.max_tool_calls",
            wb.max_tool_calls,
            ub.max_tool_calls,
            None,
        )?;
        self.refuse_longer(
            "budget.timeout",
            wb.timeout.as_ref(),
            ub.timeout.as_ref(),
            None,
            Some(("--timeout", flags.timeout.is_some())),
        )?;
        let (wt, ut) = (
            ws.timeouts.clone().unwrap_or_default(),
            user.timeouts.clone().unwrap_or_default(),
        );
        self.refuse_longer(
            "timeouts.tool",
            wt.tool.as_ref(),
            ut.tool.as_ref(),
            Some(keel_runtime::config::DEFAULT_TOOL_TIMEOUT_MS),
            Some(("--tool-timeout", flags.tool_timeout.is_some())),
        )?;
        self.refuse_longer(
            "timeouts.first_token",
            wt.first_token.as_ref(),
            ut.first_token.as_ref(),
            None,
            None,
        )?;
        self.refuse_longer(
            "timeouts.model_total",
            wt.model_total.as_ref(),
            ut.model_total.as_ref(),
            None,
            None,
        )?;
        self.refuse_longer(
            "timeouts.stream_idle",
            wt.stream_idle.as_ref(),
            ut.stream_idle.as_ref(),
            Some(keel_runtime::config::DEFAULT_STREAM_IDLE_TIMEOUT_MS),
            None,
        )?;
        let user_tools = user
            .tools
            .as_ref()
            .map(|t| t.enabled.clone())
            .unwrap_or_default();
        if let Some(t) = &ws.tools
            && !user_tools.is_empty()
        {
            let extra: Vec<&String> = t
                .enabled
                .iter()
                .filter(|name| !user_tools.contains(name))
                .collect();
            if !extra.is_empty() {
                return Err(self.looser(
                    "tools.enabled",
                    &format!("{:?}", t.enabled),
                    &format!(
                        "{user_tools:?} from your user config (it adds {})",
                        extra
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    "narrow",
                    None,
                ));
            }
        }
        Ok(())
    }
}
