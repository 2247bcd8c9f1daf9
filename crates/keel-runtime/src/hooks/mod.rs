//! Hooks: external commands and HTTP endpoints the host configures per event
//! ([`HookEvent`]: `session_start`, `user_prompt_submit`, `pre_tool_use`,
//! `permission_request`, `post_tool_use`, `pre_compact`, `stop`), with glob matchers on tool
//! names for the tool events.
//!
//! **Configuration** ([`HooksConfig`], the `[hooks]` table of the CLI's `keel.toml`, compiled
//! by [`Hooks::new`] into [`crate::RuntimeOptions::hooks`]): a list of [`HookSpec`] per event,
//! each a `command` (run by `sh -c`) or a `url` (an HTTP POST), with an optional `name`,
//! `matcher` (a glob on the tool name, tool events only), `timeout_ms` (default 60 s) and
//! `fail_closed`. Hooks run code, so they come from the host's configuration only — never from
//! a session's settings, which an API caller writes.
//!
//! **Input.** Each hook gets one JSON object ([`HookInput`]) on standard input, or as the POST
//! body: the event, the hook's name, the session, turn and workspace, and what applies — the
//! prompt, the tool call (name, id, input), its result, the pending approval, the model's last
//! text. A command runs with the workspace as its working directory, in its own process group,
//! with the environment tools get (keel's minus secret-looking and withheld variables, plus
//! the host's tool variables: [`keel_tools::sandbox::Sandbox::tool_env`]), unconfined: it is
//! the user's own program.
//!
//! **Answer.** A command's exit status and optional JSON on standard output; an HTTP hook's
//! status (2xx) and optional JSON body ([`HookAnswer`]): `{"decision": "allow" | "deny" |
//! "ask" | "rewrite" | "block" | "continue" | "none", "reason": "…", "input": {…},
//! "context": "…"}`. Exit status 2 is a blocking answer with standard error as the reason
//! (`deny` for `pre_tool_use`, `permission_request` and `user_prompt_submit`, `continue` for
//! `stop`). Any other failure — another exit status, a timeout, a non-2xx response, an answer
//! that is not that JSON, a decision the event cannot make — is journaled as the hook's
//! `error`, and decides `deny` when the hook is `fail_closed` (on the events that can deny),
//! else nothing.
//!
//! What each event's decisions do, and where they are journaled, is in [`phase`].

pub(crate) mod phase;
mod run;

use std::collections::BTreeMap;
use std::time::Duration;

use globset::{Glob, GlobMatcher};
use keel_core::{HookDecision, HookEvent};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Result, RuntimeError};

pub use run::{HookInput, HookRun};

/// A hook's time limit when its configuration sets none, ms.
pub const DEFAULT_HOOK_TIMEOUT_MS: u64 = 60_000;

/// How many times `stop` hooks may make one turn continue by default; once more ends the turn
/// `loop_detected`.
pub const DEFAULT_MAX_STOP_CONTINUES: u32 = 3;

/// The hooks of each event, as configured (`[hooks]` in `keel.toml`: `[[hooks.pre_tool_use]]`
/// tables, and `max_stop_continues`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HooksConfig {
    /// Before the session's first turn samples.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub session_start: Vec<HookSpec>,
    /// Before each turn's input reaches the model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_prompt_submit: Vec<HookSpec>,
    /// Before each tool call is authorized.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_tool_use: Vec<HookSpec>,
    /// When a call waits on an approval, before a human is asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub permission_request: Vec<HookSpec>,
    /// After each tool call has its result.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub post_tool_use: Vec<HookSpec>,
    /// Before older context is summarized.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_compact: Vec<HookSpec>,
    /// When a turn would complete.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<HookSpec>,
    /// How many times `stop` hooks may make one turn continue (default
    /// [`DEFAULT_MAX_STOP_CONTINUES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_stop_continues: Option<u32>,
}

impl HooksConfig {
    /// The hooks configured for `event`, in order.
    pub fn specs(&self, event: HookEvent) -> &[HookSpec] {
        match event {
            HookEvent::SessionStart => &self.session_start,
            HookEvent::UserPromptSubmit => &self.user_prompt_submit,
            HookEvent::PreToolUse => &self.pre_tool_use,
            HookEvent::PermissionRequest => &self.permission_request,
            HookEvent::PostToolUse => &self.post_tool_use,
            HookEvent::PreCompact => &self.pre_compact,
            HookEvent::Stop => &self.stop,
        }
    }

    fn specs_mut(&mut self, event: HookEvent) -> &mut Vec<HookSpec> {
        match event {
            HookEvent::SessionStart => &mut self.session_start,
            HookEvent::UserPromptSubmit => &mut self.user_prompt_submit,
            HookEvent::PreToolUse => &mut self.pre_tool_use,
            HookEvent::PermissionRequest => &mut self.permission_request,
            HookEvent::PostToolUse => &mut self.post_tool_use,
            HookEvent::PreCompact => &mut self.pre_compact,
            HookEvent::Stop => &mut self.stop,
        }
    }

    /// Whether no hook is configured.
    pub fn is_empty(&self) -> bool {
        HookEvent::ALL.iter().all(|e| self.specs(*e).is_empty())
    }

    /// Adds `later`'s hooks after these (a trusted workspace's after the user's: both run);
    /// its `max_stop_continues`, when set, replaces this one's.
    pub fn extend(&mut self, later: HooksConfig) {
        for event in HookEvent::ALL {
            let more = later.specs(event).to_vec();
            self.specs_mut(event).extend(more);
        }
        if later.max_stop_continues.is_some() {
            self.max_stop_continues = later.max_stop_continues;
        }
    }
}

/// One configured hook: a `command` or a `url`, exactly one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookSpec {
    /// Its name in events and messages (default `<event>#<n>`, n from 1 in the event's list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A glob on tool names (`shell`, `mcp__github__*`, `{write_file,edit_file}`); tool events
    /// only. Absent: every tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matcher: Option<String>,
    /// A shell command line, run by `sh -c` with the workspace as working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// An `http://` or `https://` URL the input is POSTed to (`application/json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Headers sent with the POST (an HTTP hook only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Its time limit, ms (default [`DEFAULT_HOOK_TIMEOUT_MS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// A failure (timeout, error status, unreadable answer) denies instead of deciding nothing
    /// (`pre_tool_use`, `permission_request`, `user_prompt_submit`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fail_closed: bool,
}

/// What a compiled hook does.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// `sh -c` this.
    Command(String),
    /// POST to this URL with these headers.
    Http {
        url: reqwest::Url,
        headers: reqwest::header::HeaderMap,
    },
}

/// One hook, checked and ready to run.
#[derive(Debug, Clone)]
pub struct Hook {
    pub(crate) name: String,
    pub(crate) event: HookEvent,
    matcher: Option<GlobMatcher>,
    pub(crate) action: Action,
    pub(crate) timeout: Duration,
    pub(crate) fail_closed: bool,
}

impl Hook {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether it runs for a call to `tool` (always, for a hook without a matcher).
    pub fn matches(&self, tool: &str) -> bool {
        self.matcher.as_ref().is_none_or(|m| m.is_match(tool))
    }

    /// The decision a failure makes: `deny` when the hook fails closed on an event that can
    /// deny, else none.
    pub(crate) fn failure_decision(&self) -> HookDecision {
        let can_deny = matches!(
            self.event,
            HookEvent::PreToolUse | HookEvent::PermissionRequest | HookEvent::UserPromptSubmit
        );
        if self.fail_closed && can_deny {
            HookDecision::Deny
        } else {
            HookDecision::None
        }
    }
}

/// The host's hooks, compiled ([`Hooks::new`]); empty by default.
#[derive(Debug, Clone, Default)]
pub struct Hooks {
    hooks: Vec<Hook>,
    max_stop_continues: Option<u32>,
    client: Option<reqwest::Client>,
}

impl Hooks {
    /// Checks and compiles `config`.
    ///
    /// # Errors
    /// [`RuntimeError::HookConfig`] naming the hook (`hooks.pre_tool_use[0]`) and what is wrong:
    /// neither or both of `command` and `url`, an empty command, a URL that is not `http(s)`, a
    /// header that is not valid HTTP, a matcher that is not a glob or on an event without tools,
    /// a zero timeout, two hooks of one event with the same name.
    pub fn new(config: &HooksConfig) -> Result<Self> {
        let mut hooks = Vec::new();
        for event in HookEvent::ALL {
            let mut names: Vec<String> = Vec::new();
            for (i, spec) in config.specs(event).iter().enumerate() {
                let at = format!("hooks.{}[{i}]", event.as_str());
                let bad = |reason: String| RuntimeError::HookConfig {
                    hook: at.clone(),
                    reason,
                };
                let action = match (&spec.command, &spec.url) {
                    (Some(c), None) if c.trim().is_empty() => {
                        return Err(bad("`command` is empty".into()));
                    }
                    (Some(c), None) => {
                        if !spec.headers.is_empty() {
                            return Err(bad("`headers` apply to a `url` hook only".into()));
                        }
                        Action::Command(c.clone())
                    }
                    (None, Some(u)) => {
                        let url = reqwest::Url::parse(u)
                            .map_err(|e| bad(format!("`url` {u:?} is not a URL: {e}")))?;
                        if !matches!(url.scheme(), "http" | "https") {
                            return Err(bad(format!("`url` {u:?} is not http:// or https://")));
                        }
                        let mut headers = reqwest::header::HeaderMap::new();
                        for (k, v) in &spec.headers {
                            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                                .map_err(|_| bad(format!("header name {k:?} is not valid HTTP")))?;
                            let mut value =
                                reqwest::header::HeaderValue::from_str(v).map_err(|_| {
                                    bad(format!("the value of header {k:?} is not valid HTTP"))
                                })?;
                            value.set_sensitive(true);
                            headers.insert(name, value);
                        }
                        Action::Http { url, headers }
                    }
                    (None, None) => return Err(bad("set `command` or `url`".into())),
                    (Some(_), Some(_)) => {
                        return Err(bad("set `command` or `url`, not both".into()));
                    }
                };
                let matcher = match &spec.matcher {
                    None => None,
                    Some(_) if !event.is_tool_event() => {
                        return Err(bad(format!(
                            "`matcher` applies to tool events only (pre_tool_use, permission_request, post_tool_use), not {}",
                            event.as_str()
                        )));
                    }
                    Some(m) => Some(
                        Glob::new(m)
                            .map_err(|e| bad(format!("`matcher` {m:?} is not a glob: {e}")))?
                            .compile_matcher(),
                    ),
                };
                if spec.timeout_ms == Some(0) {
                    return Err(bad("`timeout_ms` must be at least 1".into()));
                }
                let name = match &spec.name {
                    Some(n) if n.trim().is_empty() => return Err(bad("`name` is empty".into())),
                    Some(n) => n.clone(),
                    None => format!("{}#{}", event.as_str(), i + 1),
                };
                if names.contains(&name) {
                    return Err(bad(format!(
                        "two {} hooks are named {name:?}",
                        event.as_str()
                    )));
                }
                names.push(name.clone());
                hooks.push(Hook {
                    name,
                    event,
                    matcher,
                    action,
                    timeout: Duration::from_millis(
                        spec.timeout_ms.unwrap_or(DEFAULT_HOOK_TIMEOUT_MS),
                    ),
                    fail_closed: spec.fail_closed,
                });
            }
        }
        let client = if hooks
            .iter()
            .any(|h| matches!(h.action, Action::Http { .. }))
        {
            // reqwest's rustls backend takes the process-wide provider: ring, as in keel-model.
            let _ = rustls::crypto::ring::default_provider().install_default();
            Some(
                reqwest::Client::builder()
                    .tls_backend_rustls()
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .map_err(|e| RuntimeError::HookConfig {
                        hook: "hooks".into(),
                        reason: format!("the HTTP client for url hooks: {e}"),
                    })?,
            )
        } else {
            None
        };
        Ok(Self {
            hooks,
            max_stop_continues: config.max_stop_continues,
            client,
        })
    }

    /// Whether no hook is configured.
    pub fn is_empty(&self) -> bool {
        self.hooks.is_empty()
    }

    /// The hooks of `event` (for a call to `tool`, those whose matcher takes it), in order.
    pub fn matching(&self, event: HookEvent, tool: Option<&str>) -> Vec<&Hook> {
        self.hooks
            .iter()
            .filter(|h| h.event == event && tool.is_none_or(|t| h.matches(t)))
            .collect()
    }

    /// Whether `event` has hooks.
    pub fn has(&self, event: HookEvent) -> bool {
        self.hooks.iter().any(|h| h.event == event)
    }

    /// How many times `stop` hooks may make one turn continue.
    pub fn max_stop_continues(&self) -> u32 {
        self.max_stop_continues
            .unwrap_or(DEFAULT_MAX_STOP_CONTINUES)
    }

    pub(crate) fn client(&self) -> Option<&reqwest::Client> {
        self.client.as_ref()
    }
}

/// A hook's answer: the optional JSON of its standard output or response body.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct HookAnswer {
    /// `allow`, `deny`, `ask`, `rewrite`, `block` (the same as `deny`), `continue` or `none`.
    #[serde(default)]
    pub decision: Option<String>,
    /// Why: shown to the model for a `deny` of a tool call and a `continue`, to the user for a
    /// blocked prompt, as the reason of a denied approval.
    #[serde(default)]
    pub reason: Option<String>,
    /// `rewrite`: the tool call's new input (an object).
    #[serde(default)]
    pub input: Option<Value>,
    /// Context for the model (`session_start`, `user_prompt_submit`, `post_tool_use`).
    #[serde(default)]
    pub context: Option<String>,
}

impl HookAnswer {
    /// The decision this answer makes for `event`, or why it cannot.
    pub(crate) fn decision(&self, event: HookEvent) -> std::result::Result<HookDecision, String> {
        let named = match self.decision.as_deref().map(str::trim) {
            None | Some("") => None,
            Some("none") => Some(HookDecision::None),
            Some("allow") => Some(HookDecision::Allow),
            Some("deny" | "block") => Some(HookDecision::Deny),
            Some("ask") => Some(HookDecision::Ask),
            Some("rewrite") => Some(HookDecision::Rewrite),
            Some("continue") => Some(HookDecision::Continue),
            Some(other) => {
                return Err(format!(
                    "answered decision {other:?}; expected allow, deny, ask, rewrite, block, continue or none"
                ));
            }
        };
        let decision = match (named, &self.input) {
            (None | Some(HookDecision::Rewrite), Some(input)) => {
                if !input.is_object() {
                    return Err("answered an `input` that is not a JSON object".into());
                }
                HookDecision::Rewrite
            }
            (Some(HookDecision::Rewrite), None) => {
                return Err("answered `rewrite` without an `input`".into());
            }
            (Some(_), Some(_)) => {
                return Err("answered an `input` with a decision other than `rewrite`".into());
            }
            (Some(d), None) => d,
            (None, None) => HookDecision::None,
        };
        let fits = match event {
            HookEvent::PreToolUse => decision != HookDecision::Continue,
            HookEvent::PermissionRequest => matches!(
                decision,
                HookDecision::None | HookDecision::Allow | HookDecision::Deny
            ),
            HookEvent::UserPromptSubmit => {
                matches!(
                    decision,
                    HookDecision::None | HookDecision::Allow | HookDecision::Deny
                )
            }
            HookEvent::Stop => matches!(
                decision,
                HookDecision::None | HookDecision::Allow | HookDecision::Continue
            ),
            HookEvent::SessionStart | HookEvent::PostToolUse | HookEvent::PreCompact => {
                matches!(decision, HookDecision::None | HookDecision::Allow)
            }
        };
        if !fits {
            return Err(format!(
                "answered `{}`, which a {} hook cannot decide",
                decision.as_str(),
                event.as_str()
            ));
        }
        // What only lets things go on is journaled as no decision where `allow` means nothing.
        Ok(match (event, decision) {
            (HookEvent::PreToolUse | HookEvent::PermissionRequest, d) => d,
            (_, HookDecision::Allow) => HookDecision::None,
            (_, d) => d,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn answer(v: Value) -> HookAnswer {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn answers_decide_per_event() {
        let e = HookEvent::PreToolUse;
        assert_eq!(answer(json!({})).decision(e), Ok(HookDecision::None));
        assert_eq!(
            answer(json!({"decision": "deny", "reason": "no"})).decision(e),
            Ok(HookDecision::Deny)
        );
        assert_eq!(
            answer(json!({"input": {"command": "ls"}})).decision(e),
            Ok(HookDecision::Rewrite)
        );
        assert!(answer(json!({"decision": "rewrite"})).decision(e).is_err());
        assert!(answer(json!({"input": "ls"})).decision(e).is_err());
        assert!(answer(json!({"decision": "continue"})).decision(e).is_err());
        assert!(answer(json!({"decision": "maybe"})).decision(e).is_err());
        assert_eq!(
            answer(json!({"decision": "block"})).decision(HookEvent::UserPromptSubmit),
            Ok(HookDecision::Deny)
        );
        assert_eq!(
            answer(json!({"decision": "continue"})).decision(HookEvent::Stop),
            Ok(HookDecision::Continue)
        );
        assert!(
            answer(json!({"decision": "ask"}))
                .decision(HookEvent::PermissionRequest)
                .is_err()
        );
    }

    #[test]
    fn bad_configuration_names_the_hook() {
        let cases = [
            (
                HookSpec::default(),
                "hooks.pre_tool_use[0]: set `command` or `url`",
            ),
            (
                HookSpec {
                    command: Some("true".into()),
                    url: Some("http://x".into()),
                    ..HookSpec::default()
                },
                "not both",
            ),
            (
                HookSpec {
                    url: Some("ftp://x".into()),
                    ..HookSpec::default()
                },
                "is not http:// or https://",
            ),
            (
                HookSpec {
                    command: Some("true".into()),
                    matcher: Some("[".into()),
                    ..HookSpec::default()
                },
                "is not a glob",
            ),
            (
                HookSpec {
                    command: Some("true".into()),
                    timeout_ms: Some(0),
                    ..HookSpec::default()
                },
                "at least 1",
            ),
        ];
        for (spec, want) in cases {
            let config = HooksConfig {
                pre_tool_use: vec![spec],
                ..HooksConfig::default()
            };
            let e = Hooks::new(&config).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let stop_matcher = HooksConfig {
            stop: vec![HookSpec {
                command: Some("true".into()),
                matcher: Some("shell".into()),
                ..HookSpec::default()
            }],
            ..HooksConfig::default()
        };
        let e = Hooks::new(&stop_matcher).unwrap_err().to_string();
        assert!(
            e.contains("hooks.stop[0]") && e.contains("tool events only"),
            "{e}"
        );
    }

    #[test]
    fn matchers_are_globs_on_tool_names() {
        let config = HooksConfig {
            pre_tool_use: vec![
                HookSpec {
                    command: Some("true".into()),
                    matcher: Some("{write_file,edit_file}".into()),
                    ..HookSpec::default()
                },
                HookSpec {
                    name: Some("all".into()),
                    command: Some("true".into()),
                    ..HookSpec::default()
                },
            ],
            ..HooksConfig::default()
        };
        let hooks = Hooks::new(&config).unwrap();
        let names = |tool| {
            hooks
                .matching(HookEvent::PreToolUse, Some(tool))
                .iter()
                .map(|h| h.name().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(names("edit_file"), ["pre_tool_use#1", "all"]);
        assert_eq!(names("shell"), ["all"]);
        assert!(hooks.matching(HookEvent::Stop, None).is_empty());
    }
}
