//! Policy: may this tool call run, must a human be asked, or is it denied? Pure logic, no I/O.
//!
//! A [`Policy`] is a [`PermissionMode`] plus [`Rule`]s (`allow` / `ask` / `deny` with a
//! [`RulePattern`] such as `shell(cargo test *)`, `read_file(./secrets/**)`, `mcp__github__*`).
//! [`Policy::evaluate`] decides:
//!
//! 1. any matching `deny` rule → deny (whatever its source: deny beats ask beats allow);
//! 2. mode `read_only` and a call that is not read-only → deny;
//! 3. any matching `ask` rule → ask;
//! 4. any matching `allow` rule → allow;
//! 5. the mode's default: `bypass` allows everything; `default` and `read_only` allow read-only
//!    tools and ask for the rest; `accept_edits` also allows `write_file`/`edit_file` inside the
//!    workspace. An MCP tool (`mcp__…`) never gets the read-only allow, whatever its effect
//!    class: its `readOnlyHint` is the server's claim, and a server cannot declare itself safe —
//!    it is asked for in `default` and `accept_edits` and denied in `read_only` unless a rule
//!    allows it.
//!
//! A shell command line is parsed with the bash grammar ([`shell::analyze`]) into the commands
//! it runs, wrappers unwrapped, `sh -c` scripts and substitutions included:
//!
//! - a `deny` or `ask` rule matches the line when it matches one of its commands for some value
//!   of the command's unknown parts (an expansion, a glob, what `xargs` appends); a deny/ask
//!   on a name (`shell(git push *)`) also catches the program written as a path; for a
//!   program keel knows nothing about, the commands its arguments could be count too
//!   ([`shell::Command::argument_commands`]: `cgexec -g cpu:x rm v` may run `rm v`, `frob
//!   --hook='make && rm v'` may run `make` and `rm v`);
//! - a line that cannot be analyzed ([`shell::Analysis::unprovable`]: a computed command name,
//!   `eval`, input piped into a shell, a syntax error, …) counts as matching **every** `shell`
//!   deny and ask rule: denied when one exists, else asked when one exists, else what the mode
//!   gives an unmatched `shell` call (ask in `default`/`accept_edits`, deny in `read_only`,
//!   run in `bypass`); [`Decision::unprovable`] and the reason say why;
//! - an `allow` rule with a pattern matches only a line of literal simple commands (no
//!   assignments, expansions, substitutions, or redirections other than to `/dev/null` or a
//!   path that resolves inside the workspace — [`Subject::Command`]'s `resolved` paths, made
//!   when the call is authorized, so that `g/config` with `g -> .git` is `.git/config`; no
//!   write into `.git`) and only when every command that needs allowing
//!   ([`shell::Command::needs_allow`]: all but transparent wrappers like `timeout`) matches
//!   an allow rule for every value of its glob arguments. A bare `allow shell`, or an allow
//!   rule without wildcards written exactly as the whole line (what `allow_for_session`
//!   records for a line that is not literal), allows the line as written.
//!
//! Path rules of file tools apply to their family: rules on `read_file`, `list_dir`, `glob`,
//! `grep` cover all four; rules on `write_file`, `edit_file` cover both. A `deny` on a read-family
//! path also denies writes and edits of it. `deny` and `ask` path rules also reach `shell`: the
//! literal paths a command names (arguments, redirection targets, the workdir;
//! [`shell::path_words`]) are checked like file-tool paths, read-family rules against all of
//! them, write-family rules against those the command writes. That is best effort (a path built
//! from variables or globs is not seen); the sandbox is the boundary. A `deny`/`ask` on a command
//! name (`shell(git push *)`) also catches the program written as a path (`/usr/bin/git push`).

mod matching;
mod pattern;
pub mod shell;
#[cfg(test)]
mod tests;

use std::fmt;

use serde::{Deserialize, Serialize};

use matching::*;
pub use matching::{is_mcp_tool, session_rules_for};
use pattern::ArgPattern;
pub use pattern::{FILE_TOOLS, READ_FAMILY, RulePattern, WRITE_FAMILY};

use crate::error::ToolsError;
use crate::tool::EffectClass;

/// How permissive a session is when no rule decides.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionMode {
    /// Read-only tools run; everything else asks.
    #[default]
    Default,
    /// As `default`, and file edits inside the workspace run too.
    AcceptEdits,
    /// Nothing that writes runs (denied, not asked).
    ReadOnly,
    /// Everything runs unless a rule says otherwise.
    Bypass,
}

impl PermissionMode {
    /// How permissive the mode is: `read_only` 0 < `default` 1 < `accept_edits` 2 <
    /// `bypass` 3 (for ceilings: a server's `max_permission_mode`, `keel acp --permission-mode`).
    pub fn permissiveness(self) -> u8 {
        match self {
            Self::ReadOnly => 0,
            Self::Default => 1,
            Self::AcceptEdits => 2,
            Self::Bypass => 3,
        }
    }

    /// Parses `default`, `accept_edits`, `read_only`, `bypass` (kebab-case accepted too).
    ///
    /// Errors: [`ToolsError::InvalidRule`] naming the unknown mode.
    pub fn parse(text: &str) -> Result<Self, ToolsError> {
        match text.replace('-', "_").as_str() {
            "default" => Ok(Self::Default),
            "accept_edits" => Ok(Self::AcceptEdits),
            "read_only" => Ok(Self::ReadOnly),
            "bypass" => Ok(Self::Bypass),
            other => Err(ToolsError::InvalidRule {
                rule: other.to_owned(),
                reason:
                    "unknown permission mode; expected default, accept_edits, read_only or bypass"
                        .into(),
            }),
        }
    }
}

/// What a rule does when it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    /// Run without asking.
    Allow,
    /// Ask a human.
    Ask,
    /// Refuse.
    Deny,
}

/// Where a rule came from (for explanations; precedence does not depend on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleSource {
    /// The agent release's policy.
    Agent,
    /// Operator or user settings.
    Settings,
    /// Added during the session by an `allow_for_session` decision.
    Session,
}

/// One policy rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// What it does.
    pub action: RuleAction,
    /// What it matches.
    pub pattern: RulePattern,
    /// Where it came from.
    pub source: RuleSource,
}

impl Rule {
    /// Parses a pattern such as `shell(cargo test *)` into a rule.
    ///
    /// Errors: [`ToolsError::InvalidRule`] when the pattern is malformed.
    pub fn new(action: RuleAction, pattern: &str, source: RuleSource) -> Result<Self, ToolsError> {
        Ok(Self {
            action,
            pattern: RulePattern::parse(pattern)?,
            source,
        })
    }

    /// An `allow` rule from settings.
    pub fn allow(pattern: &str) -> Result<Self, ToolsError> {
        Self::new(RuleAction::Allow, pattern, RuleSource::Settings)
    }

    /// An `ask` rule from settings.
    pub fn ask(pattern: &str) -> Result<Self, ToolsError> {
        Self::new(RuleAction::Ask, pattern, RuleSource::Settings)
    }

    /// A `deny` rule from settings.
    pub fn deny(pattern: &str) -> Result<Self, ToolsError> {
        Self::new(RuleAction::Deny, pattern, RuleSource::Settings)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let action = match self.action {
            RuleAction::Allow => "allow",
            RuleAction::Ask => "ask",
            RuleAction::Deny => "deny",
        };
        write!(f, "{action} {}", self.pattern.text())
    }
}

/// One path a call touches, as policy sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathAccess {
    /// Workspace-relative `/`-separated path (`.` for the root), or an absolute path when it lies
    /// outside the workspace.
    pub path: String,
    /// Whether the call writes it.
    pub write: bool,
    /// Whether the path lies inside the workspace.
    pub inside: bool,
    /// For a shell command: the path is the literal target of one of its redirections (`> f`,
    /// `< f`), as written or as it resolves. Allow rules with a pattern match a line only
    /// when every such target resolves inside the workspace and no written one into `.git`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub redirect: bool,
}

impl PathAccess {
    /// A read of the workspace-relative `path`.
    pub fn read(path: &str) -> Self {
        Self {
            path: path.to_owned(),
            write: false,
            inside: !path.starts_with('/') && !path.starts_with(".."),
            redirect: false,
        }
    }

    /// A write of the workspace-relative `path`.
    pub fn write(path: &str) -> Self {
        Self {
            write: true,
            ..Self::read(path)
        }
    }
}

/// What rules match against for one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum Subject {
    /// A shell command line, with the paths it names literally ([`shell::path_words`]), so that
    /// path rules of file tools (`deny read_file(./secrets/**)`) also catch `cat secrets/x`.
    Command {
        /// The command line as given.
        command: String,
        /// Paths named in it, workspace-relative like [`Subject::Paths`] (best effort).
        paths: Vec<PathAccess>,
        /// Whether `paths` were resolved against the workspace when the call was authorized
        /// ([`crate::ToolRegistry::subject`]): each form a path takes through symlinks is
        /// listed, and a redirection target that cannot be resolved inside the workspace is
        /// marked outside. Until then a redirection to a file is not proven to stay a plain
        /// workspace path, and no allow rule with a pattern matches the line.
        #[serde(default)]
        resolved: bool,
    },
    /// File paths (several entries for one path when it has aliases, e.g. through a symlink).
    Paths(Vec<PathAccess>),
    /// Anything else: compact JSON of the arguments.
    Other(String),
}

impl Subject {
    /// The subject of shell command line `command` run in workspace-relative directory `cwd`
    /// (`.` for the root): the line and the paths it names (`cwd` itself included, as a read),
    /// relative words joined to `cwd`
    /// (lexically; [`crate::ToolRegistry::subject`] then normalizes them against the workspace).
    pub fn command(command: &str, cwd: &str) -> Self {
        let cwd = cwd.trim_end_matches('/');
        let workdir = (!cwd.is_empty() && cwd != ".").then(|| PathAccess::read(cwd));
        let analysis = shell::analyze(command);
        let redirects = shell::redirect_targets(&analysis);
        let named = shell::path_words_of(&analysis, command)
            .into_iter()
            .map(|(word, write)| {
                let redirect = redirects
                    .iter()
                    .any(|(target, w)| *w == write && target.trim() == word);
                let path = if word.starts_with('/') || cwd.is_empty() || cwd == "." {
                    word
                } else {
                    format!("{cwd}/{word}")
                };
                let path = path.strip_prefix("./").map(str::to_owned).unwrap_or(path);
                let access = if write {
                    PathAccess::write(&path)
                } else {
                    PathAccess::read(&path)
                };
                PathAccess { redirect, ..access }
            })
            .collect::<Vec<_>>();
        let paths = workdir.into_iter().chain(named).collect();
        Self::Command {
            command: command.to_owned(),
            paths,
            resolved: false,
        }
    }
}

/// A call to decide on.
#[derive(Debug, Clone)]
pub struct PolicyRequest<'a> {
    /// Tool name.
    pub tool: &'a str,
    /// The tool's effect class.
    pub effect: EffectClass,
    /// What the call touches.
    pub subject: &'a Subject,
}

/// The verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Run it.
    Allow,
    /// Ask a human first.
    Ask,
    /// Do not run it; the model gets a rejected result with the reason.
    Deny,
}

/// A verdict with its explanation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// The verdict.
    pub verdict: Verdict,
    /// Why, phrased for the model and the human (names the rule or the mode).
    pub reason: String,
    /// The deciding rule, e.g. `deny shell(rm *)`, when a rule decided.
    pub rule: Option<String>,
    /// For a shell command line that cannot be analyzed ([`shell::Analysis::unprovable`]): why.
    /// Such a line counted as matching every `shell` deny and ask rule; the reason says so too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unprovable: Option<String>,
}

impl Decision {
    fn new(verdict: Verdict, reason: String, rule: Option<String>) -> Self {
        Self {
            verdict,
            reason,
            rule,
            unprovable: None,
        }
    }
}

/// A permission mode and rules from every source.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// The mode.
    pub mode: PermissionMode,
    /// Rules from every source; order does not matter.
    pub rules: Vec<Rule>,
}

impl Policy {
    /// A policy with `mode` and no rules.
    pub fn new(mode: PermissionMode) -> Self {
        Self {
            mode,
            rules: Vec::new(),
        }
    }

    /// Adds `rule` (builder style).
    #[must_use]
    pub fn with_rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Decides on `request` (see the module docs for the order of precedence).
    pub fn evaluate(&self, request: &PolicyRequest<'_>) -> Decision {
        match request.subject {
            Subject::Command {
                command,
                paths,
                resolved,
            } => self.evaluate_command(request, command, paths, *resolved),
            _ => self.evaluate_unit(request, None),
        }
    }

    fn evaluate_command(
        &self,
        request: &PolicyRequest<'_>,
        command: &str,
        paths: &[PathAccess],
        resolved: bool,
    ) -> Decision {
        let analysis = shell::analyze(command);
        let redirects = redirect_problem(paths, resolved);
        let decision =
            self.decide_command(request, command, paths, &analysis, redirects.as_deref());
        Decision {
            unprovable: analysis.unprovable().map(str::to_owned),
            ..decision
        }
    }

    /// Deny, then ask, then allow, over the commands of a shell line (see the module docs).
    fn decide_command(
        &self,
        request: &PolicyRequest<'_>,
        command: &str,
        paths: &[PathAccess],
        analysis: &shell::Analysis,
        redirects: Option<&str>,
    ) -> Decision {
        let several = analysis.commands().len() > 1;
        // A deny on the raw command line applies whether or not it parses.
        if let Some(rule) = self.matching(request, Some(command), RuleAction::Deny) {
            return deny_by(rule);
        }
        if let Some(why) = analysis.unprovable()
            && let Some(rule) = self.shell_rule(request, RuleAction::Deny)
        {
            return Decision::new(
                Verdict::Deny,
                format!(
                    "{why}; a command that cannot be analyzed counts as matching every `shell` deny rule, and rule `{rule}` ({}) denies",
                    source_name(rule.source)
                ),
                Some(rule.to_string()),
            );
        }
        for part in analysis.commands() {
            if let Some(rule) = self.command_rule(request, part, RuleAction::Deny) {
                return in_part(deny_by(rule), part, several);
            }
        }
        for part in analysis.commands() {
            if let Some(decision) = self.argument_rule(request, part, RuleAction::Deny) {
                return in_part(decision, part, several);
            }
        }
        // Path rules of file tools cover the paths the command names.
        if let Some(decision) = self.shell_path_decision(paths, RuleAction::Deny) {
            return decision;
        }
        if self.mode == PermissionMode::ReadOnly && request.effect != EffectClass::ReadOnly {
            return read_only_deny(request.tool);
        }
        if let Some(why) = analysis.unprovable()
            && let Some(rule) = self.shell_rule(request, RuleAction::Ask)
        {
            return Decision::new(
                Verdict::Ask,
                format!(
                    "{why}; a command that cannot be analyzed counts as matching every `shell` ask rule, and rule `{rule}` ({}) asks for approval",
                    source_name(rule.source)
                ),
                Some(rule.to_string()),
            );
        }
        for part in analysis.commands() {
            if let Some(rule) = self.command_rule(request, part, RuleAction::Ask) {
                return in_part(ask_by(rule), part, several);
            }
        }
        for part in analysis.commands() {
            if let Some(decision) = self.argument_rule(request, part, RuleAction::Ask) {
                return in_part(decision, part, several);
            }
        }
        let decision = self.allow_command(request, command, analysis, redirects);
        if decision.verdict == Verdict::Allow
            && let Some(ask) = self.shell_path_decision(paths, RuleAction::Ask)
        {
            return ask;
        }
        decision
    }

    /// Allow rules over a shell line nothing denied or asked: every command that needs one is
    /// matched by an allow rule and the line is literal; otherwise the mode decides.
    fn allow_command(
        &self,
        request: &PolicyRequest<'_>,
        command: &str,
        analysis: &shell::Analysis,
        redirects: Option<&str>,
    ) -> Decision {
        // A bare `shell` allow rule, or one written exactly as the whole line, allows the line
        // as written (what was approved is exactly what runs).
        let whole = self
            .rules
            .iter()
            .filter(|r| r.action == RuleAction::Allow && rule_names_tool(r, request.tool))
            .find(|r| match &r.pattern.arg {
                None => true,
                Some(ArgPattern::Command(p)) => p.is_exact() && p.matches(command.trim()),
                Some(_) => false,
            });
        if let Some(rule) = whole {
            return allow_by(rule);
        }
        let note = if let Some(why) = analysis.unprovable() {
            format!("{why}, so no allow rule can match it")
        } else if let Some(why) = analysis.not_literal().or(redirects) {
            format!(
                "the command is not made only of literal simple commands ({why}), so no allow rule with a pattern can match it"
            )
        } else {
            let mut first = None;
            let mut missing = None;
            for part in analysis.commands().iter().filter(|c| c.needs_allow()) {
                match self.command_rule(request, part, RuleAction::Allow) {
                    Some(rule) => {
                        first.get_or_insert(rule);
                    }
                    None => {
                        missing = Some(part);
                        break;
                    }
                }
            }
            match (missing, first) {
                (None, Some(rule)) => return allow_by(rule),
                (Some(part), Some(_)) => format!("no allow rule matches `{}`", part.text()),
                _ => String::new(),
            }
        };
        self.fallback(request, &note)
    }

    /// The first rule with `action` on the tool of `request`, whatever its argument pattern.
    fn shell_rule(&self, request: &PolicyRequest<'_>, action: RuleAction) -> Option<&Rule> {
        self.rules
            .iter()
            .find(|r| r.action == action && rule_names_tool(r, request.tool))
    }

    /// The first rule with `action` matching one command of a shell line: deny and ask rules
    /// match when some value of the command's unknown parts would match (and also catch the
    /// program written as a path), allow rules only when every value would.
    fn command_rule(
        &self,
        request: &PolicyRequest<'_>,
        part: &shell::Command,
        action: RuleAction,
    ) -> Option<&Rule> {
        let tokens = part.tokens();
        let by_name = part.tokens_by_name();
        self.rules
            .iter()
            .filter(|r| r.action == action && rule_names_tool(r, request.tool))
            .find(|r| match &r.pattern.arg {
                None => true,
                Some(ArgPattern::Command(p)) if action == RuleAction::Allow => {
                    p.matches_all(&tokens)
                }
                Some(ArgPattern::Command(p)) => {
                    p.matches_some(&tokens) || by_name.as_ref().is_some_and(|t| p.matches_some(t))
                }
                Some(_) => false,
            })
    }

    /// A deny or ask rule matching a command that the arguments of a program keel has no rule
    /// for could be ([`shell::Command::argument_commands`]: `choom -n 0 rm v` may run `rm v`),
    /// as the decision it gives.
    fn argument_rule(
        &self,
        request: &PolicyRequest<'_>,
        part: &shell::Command,
        action: RuleAction,
    ) -> Option<Decision> {
        for (text, tokens) in part.argument_commands() {
            let rule = self
                .rules
                .iter()
                .filter(|r| r.action == action && rule_names_tool(r, request.tool))
                .find(|r| match &r.pattern.arg {
                    Some(ArgPattern::Command(p)) => p.matches_some(&tokens),
                    _ => false,
                });
            if let Some(rule) = rule {
                let program = part.text();
                let program = program.split(' ').next().unwrap_or_default();
                let base = match action {
                    RuleAction::Deny => deny_by(rule),
                    _ => ask_by(rule),
                };
                return Some(Decision {
                    reason: format!(
                        "`{program}` is not a program keel knows, so its arguments `{text}` may be a command it runs; {}",
                        base.reason
                    ),
                    ..base
                });
            }
        }
        None
    }

    /// The decision of the first path rule with `action` (`deny` or `ask`) covering one of the
    /// paths a shell command names, explained with that path.
    fn shell_path_decision(&self, paths: &[PathAccess], action: RuleAction) -> Option<Decision> {
        let (rule, path) = self.shell_path_rule(paths, action)?;
        let (verdict, what) = match action {
            RuleAction::Deny => (Verdict::Deny, "is denied by"),
            RuleAction::Ask | RuleAction::Allow => (Verdict::Ask, "needs approval by"),
        };
        Some(Decision::new(
            verdict,
            format!(
                "the command names `{path}`, which {what} rule `{rule}` ({})",
                source_name(rule.source)
            ),
            Some(rule.to_string()),
        ))
    }

    /// The first path rule of a file tool with `action` that covers one of `paths`, and that path:
    /// rules on the read family (`read_file`, `list_dir`, `glob`, `grep`) cover every named path,
    /// rules on the write family (`write_file`, `edit_file`) only written ones.
    fn shell_path_rule<'p>(
        &self,
        paths: &'p [PathAccess],
        action: RuleAction,
    ) -> Option<(&Rule, &'p str)> {
        self.rules
            .iter()
            .filter(|r| r.action == action)
            .find_map(|rule| {
                let Some(ArgPattern::Path(pattern)) = &rule.pattern.arg else {
                    return None;
                };
                let tool = rule.pattern.tool_name()?;
                let writes_only = WRITE_FAMILY.contains(&tool);
                paths
                    .iter()
                    .filter(|a| a.write || !writes_only)
                    .find(|a| pattern.matches(&a.path))
                    .map(|a| (rule, a.path.as_str()))
            })
    }

    /// Decides a call that is not a shell command line.
    fn evaluate_unit(&self, request: &PolicyRequest<'_>, command: Option<&str>) -> Decision {
        if let Some(rule) = self.matching(request, command, RuleAction::Deny) {
            return deny_by(rule);
        }
        if self.mode == PermissionMode::ReadOnly && request.effect != EffectClass::ReadOnly {
            return read_only_deny(request.tool);
        }
        if let Some(rule) = self.matching(request, command, RuleAction::Ask) {
            return ask_by(rule);
        }
        if let Some(rule) = self.matching(request, command, RuleAction::Allow) {
            return allow_by(rule);
        }
        self.fallback(request, "")
    }

    /// What the mode gives a call no rule decided; `note` (when not empty) says why no allow
    /// rule matched.
    fn fallback(&self, request: &PolicyRequest<'_>, note: &str) -> Decision {
        if is_mcp_tool(request.tool) && self.mode != PermissionMode::Bypass {
            return mcp_fallback(self.mode, request.tool);
        }
        let read_only = request.effect == EffectClass::ReadOnly;
        let with_note = |reason: String| {
            if note.is_empty() {
                reason
            } else {
                format!("{reason}; {note}")
            }
        };
        match self.mode {
            PermissionMode::Bypass => Decision::new(
                Verdict::Allow,
                with_note("permission mode bypass".into()),
                None,
            ),
            PermissionMode::Default | PermissionMode::ReadOnly if read_only => Decision::new(
                Verdict::Allow,
                "read-only tools run without asking".into(),
                None,
            ),
            PermissionMode::AcceptEdits if read_only => Decision::new(
                Verdict::Allow,
                "read-only tools run without asking".into(),
                None,
            ),
            PermissionMode::AcceptEdits if is_workspace_edit(request) => Decision::new(
                Verdict::Allow,
                "permission mode accept_edits: file edits inside the workspace run".into(),
                None,
            ),
            PermissionMode::ReadOnly => read_only_deny(request.tool),
            PermissionMode::Default | PermissionMode::AcceptEdits => Decision::new(
                Verdict::Ask,
                with_note(format!(
                    "permission mode {}: `{}` is not read-only and no rule allows it",
                    mode_name(self.mode),
                    request.tool
                )),
                None,
            ),
        }
    }

    /// The first rule with `action` matching the unit.
    fn matching(
        &self,
        request: &PolicyRequest<'_>,
        command: Option<&str>,
        action: RuleAction,
    ) -> Option<&Rule> {
        self.rules
            .iter()
            .filter(|r| r.action == action)
            .find(|r| rule_matches(r, request, command))
    }

    /// Whether a read of workspace-relative `path` is denied by a path rule (used by `grep`,
    /// `glob` and `list_dir` to skip denied files inside a directory they walk).
    pub fn is_path_denied(&self, tool: &str, path: &str) -> bool {
        let subject = Subject::Paths(vec![PathAccess::read(path)]);
        let request = PolicyRequest {
            tool,
            effect: EffectClass::ReadOnly,
            subject: &subject,
        };
        self.matching(&request, None, RuleAction::Deny).is_some()
    }
}
