//! Agent definitions: `[agents]`, `.keel/agents/*.md` and the workspace's command files.

use super::*;

/// The agent definition of `[agents.NAME]` (or `.keel/agents/NAME.md`): a relative
/// `script:` model path is relative to the workspace; no model means the session's route.
pub(super) fn agent_definition(
    name: &str,
    a: &AgentConfig,
    workspace: &Path,
) -> keel_core::AgentDefinition {
    keel_core::AgentDefinition {
        name: name.to_owned(),
        model_route: a
            .model
            .iter()
            .map(|m| crate::model_spec::absolutize(m, workspace))
            .collect(),
        instructions: a.instructions.clone().unwrap_or_default(),
        tools: a.tools.clone().unwrap_or_default(),
        policy: serde_json::Value::Null,
        budget: Budget::default(),
        mcp_servers: BTreeMap::new(),
        agents: BTreeMap::new(),
    }
}

/// The directory of a workspace's agent files (`.keel/agents/*.md`).
pub const AGENTS_DIR: &str = ".keel/agents";

/// The directory of a workspace's command files (`.keel/commands/*.md`).
pub const COMMANDS_DIR: &str = ".keel/commands";

/// The name of the session's own agent (its memory namespace is `agent:keel`). A repository's
/// agent may not take it, nor the name of an agent of the user config.
pub const MAIN_AGENT: &str = "keel";

/// The command files among `files` (those directly under [`COMMANDS_DIR`]), as the input
/// pipeline takes them; a directory keel does not use (a symlink) gives none.
pub(super) fn workspace_commands(
    files: &[crate::trust::CoveredFile],
) -> Vec<keel_runtime::input::CommandFile> {
    let prefix = format!("{COMMANDS_DIR}/");
    files
        .iter()
        .filter_map(|f| {
            let name = f.rel.strip_prefix(&prefix)?.strip_suffix(".md")?;
            let text = match &f.content {
                Ok(bytes) => {
                    String::from_utf8(bytes.clone()).map_err(|_| "it is not UTF-8 text".to_owned())
                }
                Err(why) => Err(why.clone()),
            };
            Some(keel_runtime::input::CommandFile {
                name: name.to_owned(),
                file: f.path.clone(),
                text,
            })
        })
        .collect()
}

/// Parses the agent files among `files` (those under [`AGENTS_DIR`]; `NAME.md`: optional front
/// matter between `---` lines with `model:`, `tools:` — `[a, b]` or `a, b` — and `name:`, then
/// the instructions). A file keel will not use (a symlink, a FIFO, too large, not UTF-8) is
/// skipped with a notice in `notices`.
///
/// # Errors
/// [`ConfigError::InFile`] naming the file: a front matter without its closing `---`, an
/// unknown key.
pub fn parse_agent_files(
    files: &[crate::trust::CoveredFile],
    notices: &mut Vec<String>,
) -> Result<BTreeMap<String, (PathBuf, AgentConfig)>, ConfigError> {
    let mut out = BTreeMap::new();
    let prefix = format!("{AGENTS_DIR}/");
    for file in files
        .iter()
        .filter(|f| f.rel.starts_with(&prefix) || f.rel == AGENTS_DIR)
    {
        let path = file.path.clone();
        let bad = |message: String| ConfigError::InFile {
            path: path.clone(),
            message,
        };
        let text = match &file.content {
            Ok(bytes) => String::from_utf8(bytes.clone()).map_err(|e| e.to_string()),
            Err(why) => Err(why.clone()),
        };
        let text = match text {
            Ok(text) => text,
            Err(why) => {
                notices.push(format!(
                    "keel: note: {} is not used as an agent definition: {why}",
                    path.display()
                ));
                continue;
            }
        };
        let mut name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut agent = AgentConfig::default();
        let body = match text.strip_prefix("---\n") {
            Some(rest) => {
                let Some((front, body)) = rest.split_once("\n---") else {
                    return Err(bad("the front matter has no closing `---` line".into()));
                };
                for line in front.lines().filter(|l| !l.trim().is_empty()) {
                    let Some((key, value)) = line.split_once(':') else {
                        return Err(bad(format!(
                            "front matter line {line:?} is not `key: value`"
                        )));
                    };
                    let value = value.trim().trim_matches('"');
                    match key.trim() {
                        "name" => value.clone_into(&mut name),
                        "model" => agent.model = Some(value.to_owned()),
                        "tools" => {
                            agent.tools = Some(
                                value
                                    .trim_start_matches('[')
                                    .trim_end_matches(']')
                                    .split(',')
                                    .map(|t| t.trim().trim_matches('"').to_owned())
                                    .filter(|t| !t.is_empty())
                                    .collect(),
                            );
                        }
                        "description" => {}
                        other => {
                            return Err(bad(format!(
                                "unknown front matter key `{other}` (expected name, model, tools, description)"
                            )));
                        }
                    }
                }
                body.split_once('\n').map_or("", |(_, b)| b)
            }
            None => text.as_str(),
        };
        agent.instructions = Some(body.trim().to_owned());
        out.insert(name, (path, agent));
    }
    Ok(out)
}
