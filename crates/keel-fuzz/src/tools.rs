//! The keel-tools targets: tool argument validation, policy rules, shell analysis.

use keel_tools::policy::{
    Policy, PolicyRequest, Rule, RuleAction, RuleSource, Subject, Verdict, shell,
};
use keel_tools::{EffectClass, ToolCallRequest, ToolRegistry, builtin::builtin_tools};
use serde_json::Value;
use std::sync::OnceLock;

/// A registry of the built-in tools, built once.
fn registry() -> &'static ToolRegistry {
    static REGISTRY: OnceLock<ToolRegistry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut registry = ToolRegistry::default();
        for tool in builtin_tools() {
            if let Err(e) = registry.register(tool) {
                panic!("a built-in tool's schema does not compile: {e}");
            }
        }
        registry
    })
}

/// Tool argument validation: the first byte picks a built-in tool (or, past their count, a
/// name no tool has), the rest is the arguments as the model sent them (text, and when it parses,
/// the parsed value too). Each accepted call's policy subject is computed and decided.
///
/// Invariants: validation answers (an accepted call or a `rejected` result naming the tool),
/// never panics; an accepted call has object arguments.
pub fn tool_arguments(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let registry = registry();
    let specs = registry.specs();
    let name = specs
        .get(usize::from(pick) % (specs.len() + 1))
        .map_or_else(|| "no_such_tool".to_owned(), |s| s.name.clone());
    let text = String::from_utf8_lossy(rest).into_owned();
    let mut forms = vec![Value::String(text.clone())];
    if let Ok(parsed) = serde_json::from_str::<Value>(&text) {
        forms.push(parsed);
    }
    let policy = sample_policy();
    for arguments in forms {
        let call = ToolCallRequest {
            call_id: "call_fuzz".into(),
            name: name.clone(),
            arguments,
        };
        match registry.validate(&call) {
            Ok(valid) => {
                assert!(
                    valid.arguments.is_object(),
                    "accepted non-object arguments: {call:?}"
                );
                let Some(tool) = registry.get(&valid.name) else {
                    panic!("validated a call to an unknown tool: {call:?}");
                };
                let subject = tool.subject(&valid.arguments);
                let _ = policy.evaluate(&PolicyRequest {
                    tool: &valid.name,
                    effect: valid.effect,
                    subject: &subject,
                });
            }
            Err(result) => assert_eq!(result.tool, call.name, "a rejection names its tool"),
        }
    }
}

/// A policy with a rule of each kind, built once.
fn sample_policy() -> &'static Policy {
    static POLICY: OnceLock<Policy> = OnceLock::new();
    POLICY.get_or_init(build_sample_policy)
}

fn build_sample_policy() -> Policy {
    let mut policy = Policy::default();
    for (action, pattern) in [
        (RuleAction::Deny, "shell(rm *)"),
        (RuleAction::Deny, "read_file(./secrets/**)"),
        (RuleAction::Ask, "shell(git push *)"),
        (RuleAction::Allow, "shell(cargo test *)"),
        (RuleAction::Allow, "write_file(src/**)"),
    ] {
        match Rule::new(action, pattern, RuleSource::Settings) {
            Ok(rule) => policy.rules.push(rule),
            Err(e) => panic!("sample rule {pattern} does not parse: {e}"),
        }
    }
    policy
}

/// The policy rule parser: the first line is a rule pattern (`shell(cargo test *)`,
/// `read_file(./secrets/**)`, `mcp__github__*`), the rest a shell command line or path to decide.
///
/// Invariants: parsing answers, never panics; a parsed pattern's text parses again to the same
/// text; deciding a shell line and a file path with that rule in every action never panics, and
/// a matching `deny` rule is never out-voted (a line it decides is denied).
pub fn policy_rule(data: &[u8]) {
    let (pattern, subject) = crate::first_line(data);
    let Ok(rule) = Rule::new(RuleAction::Deny, &pattern, RuleSource::Settings) else {
        return;
    };
    let text = rule.pattern.text().to_owned();
    match Rule::new(RuleAction::Deny, &text, RuleSource::Settings) {
        Ok(again) => assert_eq!(
            again.pattern.text(),
            text,
            "a pattern's text re-parses to itself"
        ),
        Err(e) => panic!("the text {text:?} of parsed pattern {pattern:?} does not parse: {e}"),
    }
    let command = Subject::command(&subject, ".");
    let paths = Subject::Paths(vec![keel_tools::policy::PathAccess::read(&subject)]);
    for action in [RuleAction::Allow, RuleAction::Ask, RuleAction::Deny] {
        let policy = Policy::default().with_rule(crate::tools::with_action(&rule, action));
        for (tool, effect, subject) in [
            ("shell", EffectClass::SideEffecting, &command),
            ("read_file", EffectClass::ReadOnly, &paths),
            (
                rule.pattern.tool_name().unwrap_or("shell"),
                EffectClass::SideEffecting,
                &command,
            ),
        ] {
            let request = PolicyRequest {
                tool,
                effect,
                subject,
            };
            let decision = policy.evaluate(&request);
            if action == RuleAction::Deny && decision.rule.is_some() {
                assert_eq!(
                    decision.verdict,
                    Verdict::Deny,
                    "a deny rule decided: {decision:?}"
                );
            }
        }
    }
}

fn with_action(rule: &Rule, action: RuleAction) -> Rule {
    Rule {
        action,
        ..rule.clone()
    }
}

/// The shell analysis: the bytes are a command line (`policy::shell::analyze`, the paths it
/// names, its policy subject), decided against a policy with `deny shell(rm *)`.
///
/// Invariants: analysis never panics; a line that cannot be analyzed is denied by a policy with a
/// `shell` deny rule; a line one of whose commands is literally `rm <args>` is denied.
pub fn shell_analysis(data: &[u8]) {
    let line = String::from_utf8_lossy(data);
    let analysis = shell::analyze(&line);
    for command in analysis.commands() {
        let _ = (
            command.text(),
            command.exact_text(),
            command.role(),
            command.needs_allow(),
        );
    }
    let _ = shell::redirect_targets(&analysis);
    let _ = shell::path_words_of(&analysis, &line);
    let subject = Subject::command(&line, "sub/dir");
    let policy = sample_policy();
    let decision = policy.evaluate(&PolicyRequest {
        tool: "shell",
        effect: EffectClass::SideEffecting,
        subject: &subject,
    });
    if let Some(why) = analysis.unprovable() {
        assert_eq!(
            decision.verdict,
            Verdict::Deny,
            "an unprovable line ({why}) must be denied when a shell deny rule exists: {decision:?}"
        );
    }
    let runs_rm = analysis
        .commands()
        .iter()
        .filter_map(|c| c.exact_text())
        .any(|t| t.starts_with("rm "));
    if runs_rm {
        assert_eq!(
            decision.verdict,
            Verdict::Deny,
            "a line running `rm …` must be denied by `deny shell(rm *)`: {decision:?}"
        );
    }
}
