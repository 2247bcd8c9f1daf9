//! The shell policy against real attacks (issue 11, items 8 and 9): every spelling in
//! `tests/data/shell_spellings.toml` is prepared in a fresh directory (its `setup`), decided
//! there by the policy as authorization decides it (paths resolved against that workspace),
//! then run with `bash -c`, unconfined, and must do what it claims (remove `v`, create a
//! marker); the decision must be deny or ask, as the entry says.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keel_tools::policy::{
    Decision, PermissionMode, Policy, PolicyRequest, Rule, RuleAction, RuleSource, Subject, Verdict,
};
use keel_tools::registry::resolve_subject;
use keel_tools::tool::EffectClass;
use keel_tools::workspace::Workspace;
use serde::Deserialize;

const SPELLINGS: &str = include_str!("data/shell_spellings.toml");

#[derive(Deserialize)]
struct Spellings {
    spelling: Vec<Spelling>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct Spelling {
    line: String,
    #[serde(default)]
    setup: String,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    deny: Option<Vec<String>>,
    #[serde(default)]
    ask: Vec<String>,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    expect: Option<String>,
    #[serde(default)]
    removes: Option<String>,
    #[serde(default)]
    creates: Option<String>,
}

impl Spelling {
    fn deny_rules(&self) -> Vec<String> {
        match &self.deny {
            Some(d) => d.clone(),
            None if self.allow.is_empty() && self.ask.is_empty() => vec!["shell(rm *)".into()],
            None => Vec::new(),
        }
    }

    fn expected(&self) -> Verdict {
        match self.expect.as_deref() {
            Some("deny") => Verdict::Deny,
            Some("ask") => Verdict::Ask,
            Some("allow") => Verdict::Allow,
            Some(other) => panic!("{:?}: unknown expect {other:?}", self.line),
            None if self.deny_rules().is_empty() => Verdict::Ask,
            None => Verdict::Deny,
        }
    }

    /// The decision on the line with an empty workspace.
    fn decide(&self) -> Decision {
        let dir = tempfile::tempdir().unwrap();
        self.decide_in(dir.path())
    }

    /// The decision on the line as authorization makes it in workspace `dir`: the subject's
    /// paths resolved against the workspace (where a redirection leads through symlinks).
    fn decide_in(&self, dir: &Path) -> Decision {
        let mode = PermissionMode::parse(self.mode.as_deref().unwrap_or("default")).unwrap();
        let mut policy = Policy::new(mode);
        for (action, patterns) in [
            (RuleAction::Deny, self.deny_rules()),
            (RuleAction::Ask, self.ask.clone()),
            (RuleAction::Allow, self.allow.clone()),
        ] {
            for p in patterns {
                policy
                    .rules
                    .push(Rule::new(action, &p, RuleSource::Settings).unwrap());
            }
        }
        let workspace = Workspace::new(dir).unwrap();
        let subject = resolve_subject(Subject::command(&self.line, "."), &workspace);
        policy.evaluate(&PolicyRequest {
            tool: "shell",
            effect: EffectClass::SideEffecting,
            subject: &subject,
        })
    }

    /// Whether the attack did what it claims in `dir`.
    fn took_effect(&self, dir: &Path) -> bool {
        match &self.creates {
            Some(marker) => dir.join(marker).exists(),
            None => !dir.join(self.removes.as_deref().unwrap_or("v")).exists(),
        }
    }

    /// Prepares a fresh directory holding `v` (and what `setup` makes), takes the policy's
    /// decision there, as authorization would before the line runs, then runs the spelling
    /// unconfined with `bash -c`; `Err` says why the attack did not work.
    fn run_unconfined(&self) -> Result<Decision, String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("v"), "target\n").unwrap();
        if !self.setup.is_empty() {
            let out = Command::new("bash")
                .arg("-c")
                .arg(&self.setup)
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .output()
                .unwrap();
            if !out.status.success() {
                return Err(format!(
                    "setup failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        if self.took_effect(dir.path()) {
            return Err("the effect was there before the attack ran".into());
        }
        let decision = self.decide_in(dir.path());
        let log = dir.path().join(".attack-output");
        let log_file = std::fs::File::create(&log).unwrap();
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(&self.line)
            .current_dir(dir.path())
            .env("TERM", "xterm")
            // GNU make expands a command-line `x:=$(shell …)` with the environment's SHELL;
            // CI runs without one.
            .env("SHELL", "/bin/sh")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .process_group(0)
            .spawn()
            .unwrap();
        // Correctness deadline with a wide margin: every attack takes well under a second.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut worked = false;
        loop {
            if self.took_effect(dir.path()) {
                worked = true;
                break;
            }
            if child.try_wait().unwrap().is_some() {
                // Background parts (`setsid`, `<(…)`) may finish just after bash.
                for _ in 0..100 {
                    if self.took_effect(dir.path()) {
                        worked = true;
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                break;
            }
            if Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = child.wait();
        if worked {
            Ok(decision)
        } else {
            Err(format!(
                "the attack did not work unconfined (a missing tool?); its output: {}",
                std::fs::read_to_string(&log).unwrap_or_default().trim()
            ))
        }
    }
}

use std::os::unix::process::CommandExt as _;

fn spellings() -> Vec<Spelling> {
    toml::from_str::<Spellings>(SPELLINGS)
        .expect("tests/data/shell_spellings.toml does not parse")
        .spelling
}

#[test]
fn the_spelling_file_covers_the_attack_run() {
    let all = spellings();
    let deny_bypass = all.iter().filter(|s| s.creates.is_none()).count();
    let allow_bypass = all.iter().filter(|s| !s.allow.is_empty()).count();
    assert!(all.len() >= 103, "only {} spellings", all.len());
    assert!(
        deny_bypass >= 103,
        "only {deny_bypass} deny-bypass spellings"
    );
    assert!(
        allow_bypass >= 10,
        "only {allow_bypass} allow-bypass spellings"
    );
    for issue_spelling in [
        "$(echo rm) v",
        "a=rm; $a v",
        "rm${IFS}v",
        "$'\\x72m' v",
        "{rm,v}",
        "/???/r? v",
        "echo rm v | sh",
        "2>/dev/null rm v",
        "case x in x) rm v;; esac",
        "exec -a x rm v",
        "git -c alias.zz='!rm v' zz",
        "trap 'rm v' EXIT",
        "strace -o /dev/null rm v",
        "unshare rm v",
        "chroot --skip-chdir / rm v",
        "nsenter rm v",
        "taskset 1 rm v",
        "setpriv --nnp rm v",
        "runuser -u root rm v",
        "flock l rm v",
        "watch -n 1 rm v",
        "su -c 'rm v'",
        "BASH_ENV=./evil.sh bash -c ls",
        "PATH=.:$PATH ls",
    ] {
        assert!(
            all.iter().any(|s| s.line == issue_spelling),
            "the issue's spelling {issue_spelling:?} is missing"
        );
    }
}

#[test]
fn every_spelling_attacks_for_real_unconfined_and_the_policy_stops_it() {
    let all = spellings();
    let failures = std::sync::Mutex::new(Vec::new());
    // A few at a time: each is a short bash run in its own directory.
    std::thread::scope(|scope| {
        for chunk in all.chunks(all.len().div_ceil(4)) {
            let failures = &failures;
            scope.spawn(move || {
                for s in chunk {
                    let decision = match s.run_unconfined() {
                        Ok(decision) => decision,
                        Err(why) => {
                            failures
                                .lock()
                                .unwrap()
                                .push(format!("{:?}: {why}", s.line));
                            continue;
                        }
                    };
                    if decision.verdict != s.expected() {
                        failures.lock().unwrap().push(format!(
                            "{:?}: expected {:?}, got {:?} ({})",
                            s.line,
                            s.expected(),
                            decision.verdict,
                            decision.reason
                        ));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} spellings failed:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

#[test]
fn an_unprovable_line_says_why_in_the_denial() {
    let s = Spelling {
        line: "a=rm; $a v".into(),
        setup: String::new(),
        mode: None,
        deny: None,
        ask: Vec::new(),
        allow: Vec::new(),
        expect: None,
        removes: None,
        creates: None,
    };
    let d = s.decide();
    assert_eq!(d.verdict, Verdict::Deny);
    let why = d
        .unprovable
        .expect("the decision names why the line is unprovable");
    assert!(why.contains("$a"), "{why}");
    assert!(d.reason.contains(&why), "{}", d.reason);
    assert!(d.reason.contains("deny shell(rm *)"), "{}", d.reason);
}

/// Random spellings built from shell syntax around `rm v`: every line the policy lets through
/// (asks or allows under `deny shell(rm *)`) is run with bash, which must leave `v` alone. The
/// alphabet has no `/`, `~`, `..` or globs, so a line cannot reach outside its directory.
#[test]
fn random_spellings_the_policy_lets_through_do_not_remove_the_target() {
    const TOKENS: &[&str] = &[
        "rm",
        "rm",
        "rm",
        " ",
        " ",
        " ",
        "v",
        "v",
        "v",
        ";",
        "&&",
        "||",
        "|",
        "'",
        "\"",
        "\\",
        "$",
        "(",
        ")",
        "{",
        "}",
        "`",
        "\n",
        "#",
        "<",
        ">",
        "&",
        "=",
        "a",
        "x=",
        "$a",
        "eval ",
        "sh -c ",
        "if ",
        " then ",
        " fi",
        " do ",
        " done",
        "case ",
        " in ",
        " esac",
        ";;",
        "<<",
        "<<-",
        "E",
        "E\n",
        "E''",
        "\"E\"",
        "$\"",
        "${x:-`",
        "time ",
        "! ",
        "[[ ",
        " ]]",
        "((",
        "))",
        "$(",
        "${",
        "r",
        "m",
        ",",
        "\\\n",
        "2>",
        "'rm'",
        "\"rm\"",
        "r\\m",
        "$'\\x72'",
        "for i in 1; do ",
        "while ",
        "true",
        "false",
        "echo ",
        "x",
        ":",
        "$@",
        "exec ",
        "command ",
        "env ",
        "nice ",
        "timeout 5 ",
        "xargs ",
        "find . -exec ",
        " {} \\;",
        "<<<",
        "-c",
        "bash",
        "$((",
        "=(",
        "@P}",
    ];
    let policy = Policy::new(PermissionMode::Default).with_rule(Rule::deny("shell(rm *)").unwrap());
    let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut through = Vec::new();
    for _ in 0..4000 {
        let len = 3 + (next() % 12) as usize;
        let line: String = (0..len)
            .map(|_| TOKENS[(next() % TOKENS.len() as u64) as usize])
            .collect();
        let subject = Subject::command(&line, ".");
        let d = policy.evaluate(&PolicyRequest {
            tool: "shell",
            effect: EffectClass::SideEffecting,
            subject: &subject,
        });
        if d.verdict != Verdict::Deny && line.contains('r') {
            through.push(line);
        }
    }
    assert!(
        through.len() >= 100,
        "the generator should produce lines the policy lets through, got {}",
        through.len()
    );
    let bypasses = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for chunk in through.chunks(through.len().div_ceil(4)) {
            let bypasses = &bypasses;
            scope.spawn(move || {
                for line in chunk {
                    let dir = tempfile::tempdir().unwrap();
                    std::fs::write(dir.path().join("v"), "target\n").unwrap();
                    let mut child = Command::new("bash")
                        .arg("-c")
                        .arg(line)
                        .current_dir(dir.path())
                        .env("HOME", dir.path())
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .process_group(0)
                        .spawn()
                        .unwrap();
                    let deadline = Instant::now() + Duration::from_secs(3);
                    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    let _ = Command::new("kill")
                        .args(["-KILL", "--", &format!("-{}", child.id())])
                        .stderr(Stdio::null())
                        .status();
                    let _ = child.wait();
                    std::thread::sleep(Duration::from_millis(20));
                    if !dir.path().join("v").exists() {
                        bypasses.lock().unwrap().push(line.clone());
                    }
                }
            });
        }
    });
    let bypasses = bypasses.into_inner().unwrap();
    assert!(
        bypasses.is_empty(),
        "{} of {} lines the policy let through removed v: {bypasses:#?}",
        bypasses.len(),
        through.len()
    );
}

/// Item 7 end to end: the registry resolves a redirection target against the workspace when it
/// authorizes a call, so `g/config` with the symlink `g -> .git` (which a cloned repository can
/// ship) is `.git/config`, and allow rules no longer cover the line; the same line into a
/// plain directory is still allowed.
#[tokio::test]
async fn the_registry_resolves_a_redirection_through_a_symlink_into_git_and_asks() {
    use keel_tools::registry::{Dispatch, ToolCallRequest};
    use keel_tools::sandbox::SandboxMode;

    let policy = Policy::new(PermissionMode::Default)
        .with_rule(Rule::allow("shell(echo *)").unwrap())
        .with_rule(Rule::allow("shell(git status)").unwrap());
    let f = crate::common::Fixture::with(SandboxMode::Off, policy);
    let setup = Command::new("bash")
        .arg("-c")
        .arg("git init -q && ln -s .git g && mkdir notes")
        .current_dir(f.dir.path())
        .status()
        .unwrap();
    assert!(setup.success());
    let call = |command: &str| ToolCallRequest {
        call_id: "call_1".into(),
        name: "shell".into(),
        arguments: serde_json::json!({ "command": command }),
    };
    let attack = call(r#"echo '[core] fsmonitor = "touch m; false"' >> g/config; git status"#);
    match f.registry.dispatch(&attack, &f.ctx).await {
        Dispatch::NeedsApproval { decision, .. } => {
            assert_eq!(decision.verdict, Verdict::Ask);
            assert!(
                decision.reason.contains(".git/config"),
                "{}",
                decision.reason
            );
        }
        Dispatch::Finished(r) => panic!("the line ran without asking: {r:?}"),
    }
    assert!(!f.dir.path().join("m").exists());
    let plain = call("echo hello >> notes/today.txt; git status");
    match f.registry.dispatch(&plain, &f.ctx).await {
        Dispatch::Finished(r) => assert!(
            f.dir.path().join("notes/today.txt").exists(),
            "the allowed line did not run: {r:?}"
        ),
        Dispatch::NeedsApproval { decision, .. } => {
            panic!("a plain workspace redirection asked: {}", decision.reason)
        }
    }
}
