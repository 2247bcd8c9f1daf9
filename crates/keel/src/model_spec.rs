//! Model specs (`openai:MODEL`, `openai-responses:MODEL`, `anthropic:MODEL`, `script:PATH`) and
//! building the [`ModelRoute`] a session samples from.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use keel_model::{
    HttpModel, ModelClient, ModelError, ModelRoute, ProviderConfig, RetryPolicy, ScriptedModel,
};

use crate::config::{Config, ProviderSettings};

/// One parsed model spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSpec {
    /// OpenAI Chat Completions or an OpenAI-compatible server.
    OpenaiChat(String),
    /// OpenAI Responses.
    OpenaiResponses(String),
    /// Anthropic Messages.
    Anthropic(String),
    /// A scripted model (docs/ARCHITECTURE.md, "Scripted model format").
    Script(PathBuf),
}

/// Why a model could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// Not `provider:model`.
    #[error(
        "invalid model {0:?}: expected openai:MODEL, openai-responses:MODEL, anthropic:MODEL or script:PATH"
    )]
    Invalid(String),
    /// No model configured at all.
    #[error(
        "no model configured: pass --model (e.g. --model openai:gpt-5 or --model script:demo.jsonl) or set `model` in keel.toml"
    )]
    Missing,
    /// No API key where `[providers.NAME] api_key_env` says to read it.
    #[error(
        "no API key for {provider}: set ${var} (named by [providers.{provider}] api_key_env in keel.toml)"
    )]
    MissingConfiguredKey {
        /// The provider section.
        provider: String,
        /// The configured variable.
        var: String,
    },
    /// The adapter refused its configuration (missing API key, bad script line, …).
    #[error(transparent)]
    Model(#[from] ModelError),
}

impl ModelSpec {
    /// Parses `provider:model`.
    ///
    /// # Errors
    /// [`SpecError::Invalid`].
    pub fn parse(text: &str) -> Result<Self, SpecError> {
        let (provider, rest) = text
            .split_once(':')
            .filter(|(_, m)| !m.trim().is_empty())
            .ok_or_else(|| SpecError::Invalid(text.to_owned()))?;
        let rest = rest.trim().to_owned();
        match provider.trim() {
            "openai" | "openai-chat" => Ok(Self::OpenaiChat(rest)),
            "openai-responses" => Ok(Self::OpenaiResponses(rest)),
            "anthropic" => Ok(Self::Anthropic(rest)),
            "script" | "scripted" => Ok(Self::Script(PathBuf::from(rest))),
            _ => Err(SpecError::Invalid(text.to_owned())),
        }
    }

    /// The provider's name in `[providers.NAME]`.
    pub fn provider(&self) -> &'static str {
        match self {
            Self::OpenaiChat(_) => "openai",
            Self::OpenaiResponses(_) => "openai-responses",
            Self::Anthropic(_) => "anthropic",
            Self::Script(_) => "script",
        }
    }
}

/// Splits a pinned base URL off a spec: `openai:MODEL@http://host/v1` → (`openai:MODEL`,
/// `http://host/v1`). Releases of sessions created by earlier builds pinned the base URL of
/// OpenAI-compatible servers this way; sessions now keep it in the config's `host.base_url`.
pub fn split_base_url(spec: &str) -> (&str, Option<&str>) {
    match spec.find("@http://").or_else(|| spec.find("@https://")) {
        Some(i) => (&spec[..i], Some(&spec[i + 1..])),
        None => (spec, None),
    }
}

/// Makes a `script:` spec's relative path absolute against `base`; other specs are returned as
/// they are (also invalid ones: they are reported when the route is built).
pub fn absolutize(spec: &str, base: &Path) -> String {
    match ModelSpec::parse(spec) {
        Ok(ModelSpec::Script(p)) if p.is_relative() => {
            format!("script:{}", base.join(p).display())
        }
        _ => spec.to_owned(),
    }
}

fn provider_config(
    model: &str,
    settings: Option<&ProviderSettings>,
    base_url: Option<&str>,
) -> ProviderConfig {
    let mut c = ProviderConfig::new(model);
    if let Some(s) = settings {
        c.base_url = s.base_url.clone();
        c.api_key = s.api_key.clone().or_else(|| {
            s.api_key_env
                .as_ref()
                .and_then(|v| std::env::var(v).ok())
                .filter(|v| !v.is_empty())
        });
    }
    if let Some(url) = base_url {
        c.base_url = Some(url.to_owned());
    }
    c
}

/// Builds one model from a spec.
///
/// # Errors
/// [`SpecError`] (missing API key names the variable to set; a script names its file and line).
pub fn build_model(spec: &str, config: &Config) -> Result<Arc<dyn ModelClient>, SpecError> {
    let (bare, pinned) = split_base_url(spec);
    let parsed = ModelSpec::parse(bare)?;
    let settings = config.providers.get(parsed.provider());
    let openai_base = pinned.or(config.base_url.as_deref());
    let key_var = settings.and_then(|s| s.api_key_env.clone());
    let provider = parsed.provider();
    let missing_key = |e: ModelError| match (e, key_var.clone()) {
        (ModelError::MissingApiKey { .. }, Some(var)) => SpecError::MissingConfiguredKey {
            provider: provider.to_owned(),
            var,
        },
        (e, _) => SpecError::Model(e),
    };
    Ok(match parsed {
        ModelSpec::OpenaiChat(m) => Arc::new(
            HttpModel::openai_chat(provider_config(&m, settings, openai_base))
                .map_err(missing_key)?,
        ),
        ModelSpec::OpenaiResponses(m) => Arc::new(
            HttpModel::openai_responses(provider_config(&m, settings, openai_base))
                .map_err(missing_key)?,
        ),
        ModelSpec::Anthropic(m) => Arc::new(
            HttpModel::anthropic(provider_config(&m, settings, None)).map_err(missing_key)?,
        ),
        ModelSpec::Script(path) => {
            let path = if path.is_relative() {
                config.workspace.join(path)
            } else {
                path
            };
            // Read like every file keel loads by path (a repository may name the script):
            // a regular file only, capped.
            let shown = path.display().to_string();
            let text =
                keel_tools::files::read_regular_file(&path, keel_tools::files::MAX_SCRIPT_BYTES)
                    .and_then(|bytes| {
                        String::from_utf8(bytes)
                            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
                    })
                    .map_err(|source| ModelError::ScriptIo {
                        path: shown.clone(),
                        source,
                    })?;
            Arc::new(ScriptedModel::new(keel_model::Script::parse(
                &shown, &text,
            )?))
        }
    })
}

/// Builds the session's route (primary plus fallbacks) from the configuration.
///
/// # Errors
/// [`SpecError::Missing`] when no model is configured; as [`build_model`].
pub fn build_route(config: &Config) -> Result<ModelRoute, SpecError> {
    if config.model_route.is_empty() {
        return Err(SpecError::Missing);
    }
    let models = config
        .model_route
        .iter()
        .map(|s| build_model(s, config))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ModelRoute::new(models, RetryPolicy::default())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!(
            ModelSpec::parse("openai:gpt-5").unwrap(),
            ModelSpec::OpenaiChat("gpt-5".into())
        );
        assert_eq!(
            ModelSpec::parse("anthropic:claude-sonnet-4-5").unwrap(),
            ModelSpec::Anthropic("claude-sonnet-4-5".into())
        );
        assert_eq!(
            ModelSpec::parse("script:a/b.jsonl").unwrap(),
            ModelSpec::Script("a/b.jsonl".into())
        );
        assert!(ModelSpec::parse("gpt-5").is_err());
        assert!(ModelSpec::parse("gemini:x").is_err());
        assert!(ModelSpec::parse("openai:").is_err());
        assert_eq!(
            absolutize("script:s.jsonl", Path::new("/tmp/x")),
            "script:/tmp/x/s.jsonl"
        );
        assert_eq!(absolutize("openai:gpt-5", Path::new("/x")), "openai:gpt-5");
        // The form earlier builds pinned into a release's route.
        assert_eq!(
            split_base_url("openai:llama3@http://127.0.0.1:8080/v1"),
            ("openai:llama3", Some("http://127.0.0.1:8080/v1"))
        );
        assert_eq!(split_base_url("anthropic:c"), ("anthropic:c", None));
    }
}
