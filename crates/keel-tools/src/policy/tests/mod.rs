//! Table-driven policy tests: one row per case, including the tricky ones.

use super::*;

mod cases_literal;
mod cases_modes;
mod cases_paths;
mod cases_unknown;

#[derive(Clone, Copy)]
enum S<'a> {
    Cmd(&'a str),
    Read(&'a str),
    Write(&'a str),
    Json(&'a str),
    /// An MCP tool's arguments, the tool hinted read-only by its server.
    Mcp(&'a str),
}

struct Case<'a> {
    name: &'a str,
    mode: PermissionMode,
    rules: &'a [(&'a str, &'a str)],
    tool: &'a str,
    subject: S<'a>,
    expect: Verdict,
}

use PermissionMode::{AcceptEdits as AE, Bypass as BY, Default as DF, ReadOnly as RO};
use Verdict::{Allow as A, Ask as Q, Deny as D};

/// Every case of the table, the files in order.
fn cases() -> impl Iterator<Item = &'static Case<'static>> {
    [
        cases_modes::CASES,
        cases_paths::CASES,
        cases_literal::CASES,
        cases_unknown::CASES,
    ]
    .into_iter()
    .flatten()
}

fn build(case: &Case<'_>) -> (Policy, Subject, EffectClass) {
    let mut policy = Policy::new(case.mode);
    for (action, pattern) in case.rules {
        let (action, source) = match *action {
            "allow" => (RuleAction::Allow, RuleSource::Settings),
            "allow-session" => (RuleAction::Allow, RuleSource::Session),
            "ask" => (RuleAction::Ask, RuleSource::Agent),
            "deny" => (RuleAction::Deny, RuleSource::Settings),
            other => panic!("bad action {other}"),
        };
        policy
            .rules
            .push(Rule::new(action, pattern, source).unwrap());
    }
    let paths = |s: &str, write: bool| {
        s.split('|')
            .map(|p| {
                let mut a = PathAccess::read(p);
                a.write = write;
                a
            })
            .collect()
    };
    let (subject, effect) = match case.subject {
        S::Cmd(c) => (resolved_command(c), EffectClass::SideEffecting),
        S::Read(p) => (Subject::Paths(paths(p, false)), EffectClass::ReadOnly),
        S::Write(p) => (Subject::Paths(paths(p, true)), EffectClass::IdempotentWrite),
        S::Json(j) => (Subject::Other(j.to_owned()), EffectClass::SideEffecting),
        S::Mcp(j) => (Subject::Other(j.to_owned()), EffectClass::ReadOnly),
    };
    (policy, subject, effect)
}

/// The subject of shell line `line` as authorization sees it: resolved against a workspace (an
/// empty temporary directory).
fn resolved_command(line: &str) -> Subject {
    let dir = tempfile::tempdir().unwrap();
    let ws = crate::workspace::Workspace::new(dir.path()).unwrap();
    crate::registry::resolve_subject(Subject::command(line, "."), &ws)
}

#[test]
fn policy_table() {
    let total = cases().count();
    assert!(total >= 60, "only {total} cases");
    let mut failures = Vec::new();
    for case in cases() {
        let (policy, subject, effect) = build(case);
        let decision = policy.evaluate(&PolicyRequest {
            tool: case.tool,
            effect,
            subject: &subject,
        });
        if decision.verdict != case.expect {
            failures.push(format!(
                "{}: expected {:?}, got {:?} ({})",
                case.name, case.expect, decision.verdict, decision.reason
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        total,
        failures.join("\n")
    );
}

#[test]
fn deny_reason_names_the_rule_and_the_part() {
    let policy = Policy::new(PermissionMode::Default)
        .with_rule(Rule::allow("shell(ls *)").unwrap())
        .with_rule(Rule::deny("shell(rm *)").unwrap());
    let subject = Subject::command("ls && rm -rf x", ".");
    let d = policy.evaluate(&PolicyRequest {
        tool: "shell",
        effect: EffectClass::SideEffecting,
        subject: &subject,
    });
    assert_eq!(d.verdict, Verdict::Deny);
    assert!(d.reason.contains("deny shell(rm *)"), "{}", d.reason);
    assert!(d.reason.contains("rm -rf x"), "{}", d.reason);
    assert_eq!(d.rule.as_deref(), Some("deny shell(rm *)"));
}

#[test]
fn session_rules_allow_the_same_compound_command_again() {
    let subject = Subject::command("cargo fmt && cargo test -p 'a*b'", ".");
    let mut policy = Policy::new(PermissionMode::Default);
    let before = policy.evaluate(&PolicyRequest {
        tool: "shell",
        effect: EffectClass::SideEffecting,
        subject: &subject,
    });
    assert_eq!(before.verdict, Verdict::Ask);
    policy.rules.extend(session_rules_for("shell", &subject));
    let after = policy.evaluate(&PolicyRequest {
        tool: "shell",
        effect: EffectClass::SideEffecting,
        subject: &subject,
    });
    assert_eq!(after.verdict, Verdict::Allow, "{}", after.reason);
    // The star in the approved argument is literal, not a wildcard.
    let other = Subject::command("cargo test -p aXXb", ".");
    let d = policy.evaluate(&PolicyRequest {
        tool: "shell",
        effect: EffectClass::SideEffecting,
        subject: &other,
    });
    assert_eq!(d.verdict, Verdict::Ask);
}

#[test]
fn malformed_rules_are_errors() {
    for bad in ["", "shell(", "shell()", "(x)", "read_file(./[)"] {
        assert!(
            matches!(Rule::allow(bad), Err(ToolsError::InvalidRule { .. })),
            "{bad:?} should not parse"
        );
    }
}

#[test]
fn permission_mode_parses_snake_and_kebab_case() {
    assert_eq!(
        PermissionMode::parse("accept-edits").unwrap(),
        PermissionMode::AcceptEdits
    );
    assert_eq!(
        PermissionMode::parse("read_only").unwrap(),
        PermissionMode::ReadOnly
    );
    assert!(PermissionMode::parse("yolo").is_err());
}

#[test]
fn arbitrary_command_lines_never_panic_and_unprovable_ones_are_never_allowed() {
    const ALPHABET: &[&str] = &[
        "echo",
        " ",
        "'",
        "\"",
        "\\",
        "$(",
        "(",
        ")",
        "`",
        ";",
        "&",
        "|",
        ">",
        "<",
        "\n",
        "#",
        "*",
        "=",
        "-i",
        "bash -c ",
        "find -exec ",
        "xargs ",
        "timeout 5 ",
        "env -S ",
        "é",
        "{",
        "}",
        "/",
        "..",
        "secrets/x",
        "2>&1",
    ];
    let policy = Policy::new(PermissionMode::Default)
        .with_rule(Rule::allow("shell(echo *)").unwrap())
        .with_rule(Rule::deny("read_file(./secrets/**)").unwrap());
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..20_000 {
        let mut line = String::new();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let len = (seed % 12) as usize;
        for _ in 0..len {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            line.push_str(ALPHABET[(seed % ALPHABET.len() as u64) as usize]);
        }
        let subject = Subject::command(&line, "sub");
        let d = policy.evaluate(&PolicyRequest {
            tool: "shell",
            effect: EffectClass::SideEffecting,
            subject: &subject,
        });
        if shell::analyze(&line).unprovable().is_some() {
            assert_ne!(d.verdict, Verdict::Allow, "{line:?}: {}", d.reason);
        }
        let _ = session_rules_for("shell", &subject);
    }
}

#[test]
fn session_rules_for_a_line_that_is_not_literal_allow_exactly_that_line() {
    let subject = Subject::command("RUST_LOG=debug cargo test", ".");
    let mut policy = Policy::new(PermissionMode::Default);
    let decide = |policy: &Policy, line: &str| {
        let subject = Subject::command(line, ".");
        policy
            .evaluate(&PolicyRequest {
                tool: "shell",
                effect: EffectClass::SideEffecting,
                subject: &subject,
            })
            .verdict
    };
    assert_eq!(decide(&policy, "RUST_LOG=debug cargo test"), Verdict::Ask);
    policy.rules.extend(session_rules_for("shell", &subject));
    assert_eq!(decide(&policy, "RUST_LOG=debug cargo test"), Verdict::Allow);
    assert_eq!(
        decide(&policy, "RUST_LOG=debug cargo test -p x"),
        Verdict::Ask
    );
    assert_eq!(
        decide(&policy, "RUST_LOG=debug cargo test; touch m"),
        Verdict::Ask
    );
}

#[test]
fn huge_and_deeply_nested_lines_are_decided_without_overflow() {
    let policy = Policy::new(PermissionMode::Default).with_rule(Rule::deny("shell(rm *)").unwrap());
    let lines = [
        format!("{}rm v{}", "$(".repeat(3000), ")".repeat(3000)),
        format!("{}rm v{}", "(".repeat(5000), ")".repeat(5000)),
        format!("{}rm v{}", "{ ".repeat(3000), "; }".repeat(3000)),
        format!(
            "cat <<EOF\n{}EOF\nrm v",
            format!("{}\n", "x".repeat(80)).repeat(2000)
        ),
        format!("cat <<'EOF'\n{}EOF\nrm v", "$(x) `y`\n".repeat(2000)),
        format!("echo {}; rm v", "a ".repeat(20_000)),
    ];
    for line in &lines {
        let subject = Subject::command(line, ".");
        let d = policy.evaluate(&PolicyRequest {
            tool: "shell",
            effect: EffectClass::SideEffecting,
            subject: &subject,
        });
        assert_eq!(d.verdict, Verdict::Deny, "{}…: {}", &line[..20], d.reason);
    }
}
