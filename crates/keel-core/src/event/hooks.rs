//! What a hook ran for ([`HookEvent`]) and what it decided ([`HookDecision`]).

use super::*;

/// The points in a session where hooks run (`[[hooks.<event>]]` in `keel.toml`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookEvent {
    /// Before the session's first turn samples.
    SessionStart,
    /// Before a turn's input reaches the model: may block it or add context.
    UserPromptSubmit,
    /// Before a tool call is authorized: may allow, deny, ask or rewrite its input.
    PreToolUse,
    /// When a call waits on an approval: may decide it.
    PermissionRequest,
    /// After a tool call has its result: may add context to it.
    PostToolUse,
    /// Before older context is summarized.
    PreCompact,
    /// When the turn would complete: may ask it to continue.
    Stop,
}

impl HookEvent {
    /// Every hook event, in the order above.
    pub const ALL: [HookEvent; 7] = [
        HookEvent::SessionStart,
        HookEvent::UserPromptSubmit,
        HookEvent::PreToolUse,
        HookEvent::PermissionRequest,
        HookEvent::PostToolUse,
        HookEvent::PreCompact,
        HookEvent::Stop,
    ];

    /// The snake_case name (`pre_tool_use`).
    pub fn as_str(self) -> &'static str {
        match self {
            HookEvent::SessionStart => "session_start",
            HookEvent::UserPromptSubmit => "user_prompt_submit",
            HookEvent::PreToolUse => "pre_tool_use",
            HookEvent::PermissionRequest => "permission_request",
            HookEvent::PostToolUse => "post_tool_use",
            HookEvent::PreCompact => "pre_compact",
            HookEvent::Stop => "stop",
        }
    }

    /// Whether its hooks match tool names (`pre_tool_use`, `permission_request`,
    /// `post_tool_use`).
    pub fn is_tool_event(self) -> bool {
        matches!(
            self,
            HookEvent::PreToolUse | HookEvent::PermissionRequest | HookEvent::PostToolUse
        )
    }
}

/// What a hook decided, as journaled in `hook.ran`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookDecision {
    /// No decision: the runtime goes on as without the hook (a hook that only observes, a
    /// `permission_request` hook leaving the approval to a human, a failure that fails open).
    None,
    /// `pre_tool_use`: no objection, and no need to ask (a policy `deny` still refuses);
    /// `permission_request`: the approval is allowed.
    Allow,
    /// `pre_tool_use`: run the call with `arguments` instead (as if allowed).
    Rewrite,
    /// `pre_tool_use`: ask a human even where the policy allows.
    Ask,
    /// `pre_tool_use`: the call is not run, the model sees `reason`; `permission_request`: the
    /// approval is denied; `user_prompt_submit`: the prompt is blocked (the turn ends
    /// `aborted`).
    Deny,
    /// `stop`: the turn goes on with another step, the model seeing `reason`.
    Continue,
}

impl HookDecision {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            HookDecision::None => "none",
            HookDecision::Allow => "allow",
            HookDecision::Rewrite => "rewrite",
            HookDecision::Ask => "ask",
            HookDecision::Deny => "deny",
            HookDecision::Continue => "continue",
        }
    }
}
