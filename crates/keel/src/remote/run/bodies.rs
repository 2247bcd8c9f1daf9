//! A local configuration as API request bodies: settings, budgets, modes, the release, and the flags a server run cannot honour.

use super::*;

pub(super) fn budget_body(b: keel_core::Budget) -> BudgetBody {
    BudgetBody {
        max_steps: b.max_steps,
        max_tokens: b.max_tokens,
        max_cost_usd: b.max_cost_usd,
        max_tool_calls: b.max_tool_calls,
        max_wall_time_ms: b.max_wall_time_ms,
    }
}

pub(super) fn permission_param(m: keel_tools::policy::PermissionMode) -> PermissionModeParam {
    use keel_tools::policy::PermissionMode as M;
    match m {
        M::Default => PermissionModeParam::Default,
        M::AcceptEdits => PermissionModeParam::AcceptEdits,
        M::ReadOnly => PermissionModeParam::ReadOnly,
        M::Bypass => PermissionModeParam::Bypass,
    }
}

pub(super) fn sandbox_param(m: keel_tools::sandbox::SandboxMode) -> SandboxParam {
    use keel_tools::sandbox::SandboxMode as S;
    match m {
        S::Off => SandboxParam::Off,
        S::ReadOnly => SandboxParam::ReadOnly,
        S::WorkspaceWrite => SandboxParam::WorkspaceWrite,
    }
}

pub(super) fn settings_of(config: &Config) -> SettingsBody {
    SettingsBody {
        permission_mode: Some(permission_param(config.permission_mode)),
        sandbox: Some(sandbox_param(config.sandbox)),
        turn_budget: Some(budget_body(config.budget)),
        tool_timeout_ms: Some(config.timeouts.tool_ms),
        context_window_tokens: config.context_window,
        keep_reasoning: Some(config.keep_reasoning),
        ..SettingsBody::default()
    }
}

pub(super) fn release_request(config: &Config) -> CreateReleaseRequest {
    let d = crate::run::release_of(config).definition;
    let b = d.budget;
    CreateReleaseRequest {
        name: d.name,
        model_route: d.model_route,
        instructions: d.instructions,
        tools: d.tools,
        policy: Some(PolicyBody {
            allow: config.policy.allow.clone(),
            ask: config.policy.ask.clone(),
            deny: config.policy.deny.clone(),
        }),
        budget: budget_body(b),
        // The server runs them (a stdio one only where its `[server] release_mcp_stdio`
        // allows; otherwise the release is refused naming `mcp_servers`).
        mcp_servers: d.mcp_servers,
        // `[agents]` (and a trusted workspace's `.keel/agents/*.md`): the server runs them as
        // child sessions under its own `[subagents]` bounds.
        agents: d
            .agents
            .into_iter()
            .map(|(name, a)| {
                (
                    name,
                    keel_client::api::AgentBody {
                        instructions: a.instructions,
                        tools: a.tools,
                        model_route: a.model_route,
                    },
                )
            })
            .collect(),
    }
}

/// The settings flags given to `resume` as the API's settings: only those given, the per-turn
/// budget whole (the API replaces it) with the session's other limits kept. `None` when no
/// flag changes anything.
pub(super) fn changes_body(
    changes: &ResumeChanges,
    current: &SessionConfig,
) -> Option<SettingsBody> {
    if changes.is_empty() {
        return None;
    }
    let mut next = current.clone();
    changes.apply(&mut next);
    let budget_changed = changes.max_steps.is_some()
        || changes.max_cost_usd.is_some()
        || changes.max_wall_time_ms.is_some();
    Some(SettingsBody {
        permission_mode: changes.permission_mode.map(permission_param),
        sandbox: changes.sandbox.map(sandbox_param),
        turn_budget: budget_changed.then_some(budget_body(next.turn_budget)),
        tool_timeout_ms: changes.tool_timeout_ms,
        keep_reasoning: changes.keep_reasoning,
        ..SettingsBody::default()
    })
}

/// The flags `keel --server` cannot pass on (the API has no field for them): a usage error
/// naming the first, or `None`.
pub(super) fn unsupported_flag(args: &RunArgs) -> Option<anyhow::Error> {
    let (flag, why) = if args.base_url.is_some() {
        (
            "--base-url",
            "the server reaches the models itself; give the model route with --model (run) and configure its endpoint on the server",
        )
    } else if args.sandbox_network.is_some() {
        (
            "--sandbox-network",
            "the API sets no network access for shell; the server's configuration decides it",
        )
    } else {
        return None;
    };
    Some(anyhow::Error::new(exit::UsageError(format!(
        "{flag} is not available with --server: {why}; drop {flag}"
    ))))
}
