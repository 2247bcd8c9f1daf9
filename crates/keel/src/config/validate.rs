//! Reading a layer: TOML parsing, reserved keys and the per-value checks (costs, URLs, stores).

use super::*;

/// Reads one file as a TOML table; a missing file is `None`.
pub(super) fn read_table(path: &Path) -> Result<Option<toml::Table>, ConfigError> {
    read_config_bytes(path)?
        .map(|bytes| parse_table(path, &bytes))
        .transpose()
}

/// The bytes of the config file at `path`, `None` when there is none. Only a regular file is
/// read (a symlink is followed to one), at most [`keel_tools::files::MAX_CONFIG_BYTES`]: a
/// repository's `keel.toml` that is a FIFO, a device or a huge file is refused, never waited on
/// or read without end.
///
/// # Errors
/// [`ConfigError::Read`] naming the file and what is wrong with it.
pub(crate) fn read_config_bytes(path: &Path) -> Result<Option<Vec<u8>>, ConfigError> {
    keel_tools::files::read_regular_file_if_present(path, keel_tools::files::MAX_CONFIG_BYTES)
        .map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })
}

/// Parses the TOML text of the file at `path`.
pub(super) fn parse_table(path: &Path, bytes: &[u8]) -> Result<toml::Table, ConfigError> {
    let text = std::str::from_utf8(bytes).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: format!("not UTF-8 text: {e}"),
    })?;
    text.parse()
        .map_err(|e: toml::de::Error| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim().replace('\n', " "),
        })
}

/// Checks one layer on its own, so that an error names the file it is in; returns it typed.
pub(super) fn check_layer(path: &Path, table: &toml::Table) -> Result<FileConfig, ConfigError> {
    let layer = FileConfig::deserialize(toml::Value::Table(table.clone())).map_err(|e| {
        ConfigError::Invalid {
            sources: path.display().to_string(),
            message: e.to_string().trim().replace('\n', " "),
        }
    })?;
    validate_layer(&layer).map_err(|e| ConfigError::InFile {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    Ok(layer)
}

/// Sections reserved for what keel does not have yet, with what each would do. Keel refuses
/// them where they would apply (the user config, a trusted workspace) rather than ignore a
/// setting someone relies on, and drops them with a notice from an untrusted workspace, where
/// they would never apply anyway.
pub const RESERVED_KEYS: [(&str, &str); 0] = [];

/// Sections a workspace's `keel.toml` may set only when the workspace is trusted (they run
/// programs it names), with what each does: dropped with a notice from an untrusted one.
pub const TRUSTED_ONLY_KEYS: [(&str, &str); 4] = [
    (
        "mcp_servers",
        "would start the MCP servers it names (programs run with your environment, or URLs called)",
    ),
    (
        "agents",
        "would define agents your agent may start, with their own instructions and models",
    ),
    (
        "subagents",
        "would change how deep agents nest and how many run at once",
    ),
    (
        "memory",
        "would give the agent long-term memory (facts kept across sessions, and the namespace they are shared in)",
    ),
];

/// Refuses a reserved section in a file whose settings apply (the user config, a trusted
/// workspace's).
pub(super) fn refuse_reserved(
    path: &Path,
    table: &toml::Table,
    how: &str,
) -> Result<(), ConfigError> {
    for (key, what) in RESERVED_KEYS {
        if table.contains_key(key) {
            return Err(ConfigError::InFile {
                path: path.to_owned(),
                message: format!(
                    "`{key}` is reserved: keel does not {what} yet, and will not ignore a setting you may rely on; {how}"
                ),
            });
        }
    }
    Ok(())
}

/// Checks the values of one layer (or of the merged result), so that a mistake is reported
/// with the file it is in, by every command that reads the configuration.
///
/// # Errors
/// The first value out of its domain.
pub fn validate_layer(layer: &FileConfig) -> Result<(), ConfigError> {
    if let Some(m) = &layer.permission_mode {
        parse_permission_mode(m)?;
    }
    if let Some(m) = &layer.sandbox {
        parse_sandbox(m)?;
    }
    if let Some(m) = &layer.output {
        parse_output(m)?;
    }
    if let Some(s) = &layer.store {
        check_store_url(s)?;
    }
    if let Some(u) = &layer.base_url {
        check_base_url(u)?;
    }
    let specs = layer.model.iter().map(|m| ("model", m)).chain(
        layer
            .fallback_models
            .iter()
            .flatten()
            .map(|m| ("fallback_models", m)),
    );
    for (field, spec) in specs {
        crate::model_spec::ModelSpec::parse(crate::model_spec::split_base_url(spec).0).map_err(
            |_| ConfigError::Value {
                field,
                value: spec.clone(),
                expected: "openai:MODEL, openai-responses:MODEL, anthropic:MODEL or script:PATH",
            },
        )?;
    }
    if layer.context_window == Some(0) {
        return Err(ConfigError::Value {
            field: "context_window",
            value: "0".into(),
            expected: "a positive number of tokens, e.g. 128000",
        });
    }
    if let Some(b) = &layer.budget {
        if b.max_steps == Some(0) {
            return Err(ConfigError::Value {
                field: "budget.max_steps",
                value: "0".into(),
                expected: "1 or more (a turn with no step cannot run)",
            });
        }
        if let Some(c) = b.max_cost_usd {
            check_cost(c)?;
        }
        if let Some(t) = &b.timeout {
            parse_duration_field("budget.timeout", t)?;
        }
    }
    if let Some(t) = &layer.timeouts {
        t.parse()?;
    }
    if let Some(m) = &layer.memory {
        m.settings()?;
    }
    if let Some(tools) = &layer.tools {
        let known: Vec<String> = keel_tools::builtin::builtin_tools()
            .iter()
            .map(|t| t.name().to_owned())
            .chain(keel_runtime::memory::TOOL_NAMES.map(str::to_owned))
            .collect();
        if let Some(unknown) = tools.enabled.iter().find(|t| !known.contains(t)) {
            return Err(ConfigError::Unknown {
                field: "tools.enabled",
                value: unknown.clone(),
                known: known.join(", "),
            });
        }
    }
    if let Some(h) = &layer.hooks {
        keel_runtime::hooks::Hooks::new(h).map_err(|e| ConfigError::Rule {
            message: e.to_string(),
        })?;
    }
    keel_mcp::config::validate_servers(&layer.mcp_servers)?;
    if let Some(p) = &layer.policy {
        for rule in p.allow.iter().chain(&p.ask).chain(&p.deny) {
            keel_tools::policy::RulePattern::parse(rule).map_err(|e| ConfigError::Rule {
                message: e.to_string(),
            })?;
        }
    }
    Ok(())
}

/// Checks a budget in USD: finite and not negative.
///
/// # Errors
/// [`ConfigError::Value`].
pub fn check_cost(usd: f64) -> Result<f64, ConfigError> {
    if usd.is_finite() && usd >= 0.0 {
        Ok(usd)
    } else {
        Err(ConfigError::Value {
            field: "budget.max_cost_usd",
            value: usd.to_string(),
            expected: "a finite number of US dollars, 0 or more",
        })
    }
}

/// Checks a store location: `sqlite://PATH`, `postgres://…`, `postgresql://…` or a plain path.
///
/// # Errors
/// [`ConfigError::Value`] for any other scheme.
pub fn check_store_url(store: &str) -> Result<(), ConfigError> {
    match store.split_once("://") {
        None => Ok(()),
        Some(("sqlite" | "postgres" | "postgresql", _)) => Ok(()),
        Some(_) => Err(ConfigError::Value {
            field: "store",
            value: store.to_owned(),
            expected: "sqlite://PATH, postgres://…, postgresql://… or a plain file path",
        }),
    }
}

/// Checks a base URL: `http://` or `https://` with a host.
///
/// # Errors
/// [`ConfigError::Value`].
pub fn check_base_url(text: &str) -> Result<(), ConfigError> {
    let rest = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"));
    let host = rest.map(|r| r.split(['/', '?', '#']).next().unwrap_or_default());
    match host {
        Some(h) if !h.is_empty() && !text.chars().any(char::is_whitespace) => Ok(()),
        _ => Err(ConfigError::Value {
            field: "base_url",
            value: text.to_owned(),
            expected: "an http:// or https:// URL with a host, e.g. http://127.0.0.1:8080/v1",
        }),
    }
}

/// Whether a base URL applies to model `spec` (`openai:` and `openai-responses:` do).
pub fn base_url_applies(spec: &str) -> bool {
    matches!(
        crate::model_spec::ModelSpec::parse(crate::model_spec::split_base_url(spec).0),
        Ok(crate::model_spec::ModelSpec::OpenaiChat(_)
            | crate::model_spec::ModelSpec::OpenaiResponses(_))
    )
}
