//! How one rule meets one request (tool names, families, shell parts, MCP tools), the
//! decisions rules make, and the rules an `allow_for_session` decision adds.

use super::*;

/// Rules an `allow_for_session` decision adds so that the same call runs without asking again:
/// one exact `shell(<part>)` rule per command of a literal line (the exact line otherwise), one
/// exact path rule per written or read path,
/// or the whole tool for anything else.
pub fn session_rules_for(tool: &str, subject: &Subject) -> Vec<Rule> {
    let rule = |pattern: RulePattern| Rule {
        action: RuleAction::Allow,
        pattern,
        source: RuleSource::Session,
    };
    match subject {
        Subject::Command {
            command,
            paths,
            resolved,
        } => {
            // A literal line: one exact rule per command that needs allowing. Anything else
            // (assignments, expansions, unprovable lines, redirections not proven to stay in
            // the workspace): the exact line, which allow rules match as written.
            let analysis = shell::analyze(command);
            let redirects = redirect_problem(paths, *resolved);
            let parts: Option<Vec<String>> = analysis
                .commands()
                .iter()
                .filter(|c| c.needs_allow())
                .map(shell::Command::exact_text)
                .collect();
            match parts {
                Some(parts)
                    if analysis.not_literal().is_none()
                        && redirects.is_none()
                        && !parts.is_empty() =>
                {
                    parts
                        .iter()
                        .map(|p| rule(RulePattern::exact_command(p)))
                        .collect()
                }
                _ => vec![rule(RulePattern::exact_command(command.trim()))],
            }
        }
        Subject::Paths(paths) if FILE_TOOLS.contains(&tool) => paths
            .iter()
            .filter_map(|p| RulePattern::exact_path(tool, &p.path).ok())
            .map(rule)
            .collect(),
        _ => match RulePattern::parse(tool) {
            Ok(p) => vec![rule(p)],
            Err(_) => Vec::new(),
        },
    }
}

/// Why the redirections of a shell command keep it from being literal, if they do: a target
/// that resolves outside the workspace (or could not be resolved), a written one that resolves
/// into `.git` (whose hooks and config git runs), or any redirection to a file when the paths
/// were not resolved against the workspace (`resolved` false).
pub(super) fn redirect_problem(paths: &[PathAccess], resolved: bool) -> Option<String> {
    let target = paths
        .iter()
        .filter(|p| p.redirect)
        .find(|p| !resolved || !p.inside || (p.write && p.path.split('/').any(|c| c == ".git")))?;
    Some(if !resolved {
        format!(
            "it redirects to `{}`, which was not resolved against the workspace",
            target.path
        )
    } else if !target.inside {
        format!(
            "it redirects to `{}`, which is outside the workspace or cannot be resolved inside it",
            target.path
        )
    } else {
        format!(
            "it writes `{}`, inside `.git`, whose hooks and config git runs",
            target.path
        )
    })
}

/// Whether `rule` names `tool`: by name or glob, or through its file-tool family (a `deny` on a
/// read-family tool also names the write family).
pub(super) fn rule_names_tool(rule: &Rule, tool: &str) -> bool {
    if rule.pattern.matches_tool_name(tool) {
        true
    } else if let Some(rule_tool) = rule.pattern.tool_name() {
        same_family(rule_tool, tool)
            || (rule.action == RuleAction::Deny
                && READ_FAMILY.contains(&rule_tool)
                && WRITE_FAMILY.contains(&tool))
    } else {
        false
    }
}

pub(super) fn rule_matches(
    rule: &Rule,
    request: &PolicyRequest<'_>,
    command: Option<&str>,
) -> bool {
    if !rule_names_tool(rule, request.tool) {
        return false;
    }
    let Some(arg) = &rule.pattern.arg else {
        return true;
    };
    match (arg, request.subject) {
        (ArgPattern::Command(p), Subject::Command { command: whole, .. }) => {
            let part = command.unwrap_or(whole);
            // A deny or ask on `git push *` also catches `/usr/bin/git push`; an allow on the
            // bare name does not allow `./git` (a program found by path, not by name).
            p.matches(part)
                || (rule.action != RuleAction::Allow
                    && program_by_name(part).is_some_and(|named| p.matches(&named)))
        }
        (ArgPattern::Path(p), Subject::Paths(paths)) => {
            if paths.is_empty() {
                return false;
            }
            if rule.action == RuleAction::Allow {
                paths.iter().all(|a| p.matches(&a.path))
            } else {
                paths.iter().any(|a| p.matches(&a.path))
            }
        }
        (ArgPattern::Other(tokens), Subject::Other(json)) => pattern::glob_match(tokens, json),
        _ => false,
    }
}

/// `part` with its program written by name when it was given as a path (`/usr/bin/git push` →
/// `git push`); `None` when it already is.
pub(super) fn program_by_name(part: &str) -> Option<String> {
    let (program, rest) = part.split_once(' ').unwrap_or((part, ""));
    let name = program.rsplit('/').next()?;
    if name == program || name.is_empty() {
        return None;
    }
    Some(if rest.is_empty() {
        name.to_owned()
    } else {
        format!("{name} {rest}")
    })
}

pub(super) fn same_family(a: &str, b: &str) -> bool {
    (READ_FAMILY.contains(&a) && READ_FAMILY.contains(&b))
        || (WRITE_FAMILY.contains(&a) && WRITE_FAMILY.contains(&b))
}

pub(super) fn is_workspace_edit(request: &PolicyRequest<'_>) -> bool {
    WRITE_FAMILY.contains(&request.tool)
        && matches!(request.subject, Subject::Paths(paths) if !paths.is_empty() && paths.iter().all(|p| p.inside))
}

pub(super) fn deny_by(rule: &Rule) -> Decision {
    Decision::new(
        Verdict::Deny,
        format!("denied by rule `{rule}` ({})", source_name(rule.source)),
        Some(rule.to_string()),
    )
}

pub(super) fn ask_by(rule: &Rule) -> Decision {
    Decision::new(
        Verdict::Ask,
        format!(
            "rule `{rule}` ({}) asks for approval",
            source_name(rule.source)
        ),
        Some(rule.to_string()),
    )
}

pub(super) fn allow_by(rule: &Rule) -> Decision {
    Decision::new(
        Verdict::Allow,
        format!("allowed by rule `{rule}` ({})", source_name(rule.source)),
        Some(rule.to_string()),
    )
}

/// Whether `tool` is an MCP server's (`mcp__<server>__<tool>`).
pub fn is_mcp_tool(tool: &str) -> bool {
    tool.starts_with("mcp__")
}

/// What the mode gives an MCP tool no rule decided: never the read-only allow (see the module
/// docs), whatever its hints say.
pub(super) fn mcp_fallback(mode: PermissionMode, tool: &str) -> Decision {
    let unproven = "MCP tools never run without asking: a server's readOnlyHint is its own claim";
    match mode {
        PermissionMode::ReadOnly => Decision::new(
            Verdict::Deny,
            format!(
                "permission mode read_only: `{tool}` is an MCP tool and nothing shows it cannot write ({unproven}); a rule `allow {tool}` lets it run"
            ),
            None,
        ),
        PermissionMode::Default | PermissionMode::AcceptEdits | PermissionMode::Bypass => {
            Decision::new(
                Verdict::Ask,
                format!(
                    "permission mode {}: `{tool}` is an MCP tool and no rule allows it ({unproven})",
                    mode_name(mode)
                ),
                None,
            )
        }
    }
}

pub(super) fn read_only_deny(tool: &str) -> Decision {
    Decision::new(
        Verdict::Deny,
        format!(
            "permission mode read_only: `{tool}` can write, and nothing that writes runs in this mode"
        ),
        None,
    )
}

/// `decision` about one command of a line with several, naming that command.
pub(super) fn in_part(decision: Decision, part: &shell::Command, several: bool) -> Decision {
    if !several {
        return decision;
    }
    Decision {
        reason: format!("part `{}` of the command: {}", part.text(), decision.reason),
        ..decision
    }
}

pub(super) fn source_name(source: RuleSource) -> &'static str {
    match source {
        RuleSource::Agent => "agent policy",
        RuleSource::Settings => "settings",
        RuleSource::Session => "allowed for this session",
    }
}

pub(super) fn mode_name(mode: PermissionMode) -> &'static str {
    match mode {
        PermissionMode::Default => "default",
        PermissionMode::AcceptEdits => "accept_edits",
        PermissionMode::ReadOnly => "read_only",
        PermissionMode::Bypass => "bypass",
    }
}
