//! Merging layers and parsing the values flags and files share (durations, modes, the store's location).

use super::*;

/// Merges the workspace's layer into `base`: as [`merge`], except that its policy rules are
/// added to the ones already there (never replacing them: `deny = []` erases nothing), and an
/// empty `[tools] enabled` (which would mean "every tool") changes nothing.
pub fn merge_workspace(base: &mut toml::Table, mut layer: toml::Table) {
    if let Some(toml::Value::Table(tools)) = layer.get_mut("tools")
        && tools
            .get("enabled")
            .and_then(toml::Value::as_array)
            .is_some_and(Vec::is_empty)
    {
        tools.remove("enabled");
    }
    if let Some(toml::Value::Table(policy)) = layer.remove("policy")
        && let toml::Value::Table(base_policy) = base
            .entry("policy")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
    {
        for (kind, rules) in policy {
            let toml::Value::Array(rules) = rules else {
                continue;
            };
            if let toml::Value::Array(existing) = base_policy
                .entry(kind)
                .or_insert_with(|| toml::Value::Array(Vec::new()))
            {
                for rule in rules {
                    if !existing.contains(&rule) {
                        existing.push(rule);
                    }
                }
            }
        }
    }
    // Its hooks run after the user's (both lists apply).
    if let Some(toml::Value::Table(hooks)) = layer.remove("hooks")
        && let toml::Value::Table(base_hooks) = base
            .entry("hooks")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
    {
        for (key, value) in hooks {
            match (base_hooks.get_mut(&key), value) {
                (Some(toml::Value::Array(existing)), toml::Value::Array(more)) => {
                    existing.extend(more);
                }
                (_, value) => {
                    base_hooks.insert(key, value);
                }
            }
        }
    }
    merge(base, layer);
}

/// Merges `over` into `base`: tables key by key, everything else replaced.
pub fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// Parses a duration: `500ms`, `30s`, `15m`, `2h`, or plain seconds; returns milliseconds.
///
/// # Errors
/// [`ConfigError::Value`] for anything else.
pub fn parse_duration_ms(text: &str) -> Result<u64, ConfigError> {
    parse_duration_field("timeout", text)
}

/// As [`parse_duration_ms`], naming `field` (`timeouts.tool`, …) in the error.
///
/// # Errors
/// [`ConfigError::Value`] naming `field`.
pub fn parse_duration_field(field: &'static str, text: &str) -> Result<u64, ConfigError> {
    let bad = || ConfigError::Value {
        field,
        value: text.to_owned(),
        expected: "a duration of at least 1 ms, such as 500ms, 30s, 15m, 2h or plain seconds",
    };
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: f64 = number.parse().map_err(|_| bad())?;
    let factor = match unit.trim() {
        "ms" => 1.0,
        "" | "s" => 1000.0,
        "m" | "min" => 60_000.0,
        "h" => 3_600_000.0,
        _ => return Err(bad()),
    };
    let ms = n * factor;
    if !ms.is_finite() || !(1.0..=1e15).contains(&ms) {
        return Err(bad());
    }
    // In range by the check above.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(ms.round() as u64)
}

/// A duration in the largest unit that writes it whole (`10m`, `90s`, `1500ms`): how `keel
/// config show` prints a default.
pub fn format_duration_ms(ms: u64) -> String {
    match ms {
        0 => "0ms".to_owned(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

/// Parses a permission mode (snake_case or kebab-case).
///
/// # Errors
/// [`ConfigError::Value`].
pub fn parse_permission_mode(text: &str) -> Result<PermissionMode, ConfigError> {
    PermissionMode::parse(text).map_err(|_| ConfigError::Value {
        field: "permission_mode",
        value: text.to_owned(),
        expected: "default, accept_edits, read_only or bypass",
    })
}

/// Parses a sandbox mode (snake_case or kebab-case).
///
/// # Errors
/// [`ConfigError::Value`].
pub fn parse_sandbox(text: &str) -> Result<SandboxMode, ConfigError> {
    match text.replace('-', "_").as_str() {
        "off" => Ok(SandboxMode::Off),
        "read_only" => Ok(SandboxMode::ReadOnly),
        "workspace_write" => Ok(SandboxMode::WorkspaceWrite),
        _ => Err(ConfigError::Value {
            field: "sandbox",
            value: text.to_owned(),
            expected: "off, read_only or workspace_write",
        }),
    }
}

pub(super) fn parse_output(text: &str) -> Result<OutputFormat, ConfigError> {
    match text {
        "text" => Ok(OutputFormat::Text),
        "jsonl" => Ok(OutputFormat::Jsonl),
        _ => Err(ConfigError::Value {
            field: "output",
            value: text.to_owned(),
            expected: "text or jsonl",
        }),
    }
}

/// The default store: SQLite in the user data directory.
///
/// # Errors
/// [`ConfigError::NoDataDir`].
pub fn default_store(locations: &Locations) -> Result<String, ConfigError> {
    let dir = locations.data_dir.as_ref().ok_or(ConfigError::NoDataDir)?;
    Ok(format!("sqlite://{}", dir.join("keel.db").display()))
}

/// Resolves the workspace directory to an absolute, existing path.
///
/// # Errors
/// [`ConfigError::NoWorkspace`].
pub fn resolve_workspace(workspace: Option<&Path>) -> Result<PathBuf, ConfigError> {
    let given = workspace.map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    match std::fs::canonicalize(&given) {
        Ok(p) if p.is_dir() => Ok(p),
        _ => Err(ConfigError::NoWorkspace(given)),
    }
}
