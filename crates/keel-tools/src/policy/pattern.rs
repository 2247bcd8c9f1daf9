//! Rule patterns: `tool`, `tool(argument pattern)`, tool-name globs like `mcp__github__*`.
//!
//! The argument pattern is read according to the tool:
//! - `shell(…)`: a command pattern; `*` matches any text, a trailing ` *` (or `:*`) also matches
//!   nothing (`cargo test *` matches `cargo test` and `cargo test -p x`, not `cargo testing`);
//!   `\*` is a literal star.
//! - file tools (`read_file`, `write_file`, `edit_file`, `list_dir`, `glob`, `grep`): a gitignore-like
//!   path glob relative to the workspace. `./x` and any pattern with an inner `/` are anchored at
//!   the root; a pattern without `/` matches at any depth (`*.pem`, `.env`); `/abs/…` matches
//!   absolute paths outside the workspace. A pattern matching a directory covers everything in it.
//! - any other tool: a glob over the compact JSON of the arguments.

use globset::{GlobBuilder, GlobMatcher};

use crate::error::ToolsError;

/// Tools whose argument pattern is a path.
pub const FILE_TOOLS: &[&str] = &[
    "read_file",
    "write_file",
    "edit_file",
    "list_dir",
    "glob",
    "grep",
];
/// File tools that only read.
pub const READ_FAMILY: &[&str] = &["read_file", "list_dir", "glob", "grep"];
/// File tools that write (`accept_edits` lets these run inside the workspace).
pub const WRITE_FAMILY: &[&str] = &["write_file", "edit_file"];

/// A parsed `tool(arg)` pattern.
#[derive(Debug, Clone)]
pub struct RulePattern {
    pub(crate) text: String,
    pub(crate) tool: NameMatcher,
    pub(crate) arg: Option<ArgPattern>,
}

#[derive(Debug, Clone)]
pub(crate) enum NameMatcher {
    Exact(String),
    Glob(Vec<GlobToken>),
}

#[derive(Debug, Clone)]
pub(crate) enum ArgPattern {
    Command(CommandPattern),
    Path(PathPattern),
    Other(Vec<GlobToken>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GlobToken {
    Literal(char),
    Star,
}

/// A shell command pattern.
#[derive(Debug, Clone)]
pub(crate) struct CommandPattern {
    tokens: Vec<GlobToken>,
    /// With the trailing ` *` removed, when it had one.
    prefix: Option<Vec<GlobToken>>,
}

/// A path glob.
#[derive(Debug, Clone)]
pub(crate) struct PathPattern {
    glob: GlobMatcher,
    /// For `dir/**`: matches `dir` itself.
    dir: Option<GlobMatcher>,
}

impl RulePattern {
    /// Parses `text` (`tool` or `tool(arg)`).
    ///
    /// Errors: [`ToolsError::InvalidRule`] for an empty tool name, unbalanced parentheses or a bad
    /// path glob.
    pub fn parse(text: &str) -> Result<Self, ToolsError> {
        let invalid = |reason: &str| ToolsError::InvalidRule {
            rule: text.to_owned(),
            reason: reason.to_owned(),
        };
        let text = text.trim();
        let (tool, arg) = match text.find('(') {
            Some(open) => {
                if !text.ends_with(')') {
                    return Err(invalid("an argument pattern must end with `)`"));
                }
                (&text[..open], Some(&text[open + 1..text.len() - 1]))
            }
            None => (text, None),
        };
        let tool = tool.trim();
        if tool.is_empty() {
            return Err(invalid("the tool name is empty"));
        }
        if tool.contains(|c: char| c.is_whitespace() || c == ')') {
            return Err(invalid("the tool name must not contain spaces or `)`"));
        }
        let name = if tool.contains('*') {
            NameMatcher::Glob(glob_tokens(tool))
        } else {
            NameMatcher::Exact(tool.to_owned())
        };
        let arg_text = arg.map(str::trim);
        let arg = match arg {
            None => None,
            Some(arg) => {
                let arg = arg.trim();
                if arg.is_empty() {
                    return Err(invalid(
                        "the argument pattern is empty; write `tool` to match every call",
                    ));
                }
                Some(match &name {
                    NameMatcher::Exact(t) if t == "shell" => {
                        ArgPattern::Command(CommandPattern::new(arg))
                    }
                    NameMatcher::Exact(t) if FILE_TOOLS.contains(&t.as_str()) => {
                        ArgPattern::Path(PathPattern::new(arg).map_err(|e| invalid(&e))?)
                    }
                    _ => ArgPattern::Other(glob_tokens(arg)),
                })
            }
        };
        Ok(Self {
            text: format!(
                "{tool}{}",
                arg_text.map(|a| format!("({a})")).unwrap_or_default()
            ),
            tool: name,
            arg,
        })
    }

    /// A pattern matching exactly the shell command `command` (stars in it are literal).
    pub fn exact_command(command: &str) -> Self {
        let escaped = command.replace('\\', "\\\\").replace('*', "\\*");
        Self {
            text: format!("shell({escaped})"),
            tool: NameMatcher::Exact("shell".into()),
            arg: Some(ArgPattern::Command(CommandPattern::new(&escaped))),
        }
    }

    /// A pattern matching exactly the workspace-relative `path` for file tool `tool`.
    pub fn exact_path(tool: &str, path: &str) -> Result<Self, ToolsError> {
        let anchored = if path.starts_with('/') {
            globset::escape(path)
        } else {
            format!("./{}", globset::escape(path))
        };
        Self::parse(&format!("{tool}({anchored})"))
    }

    /// The pattern as written (normalized), e.g. `shell(cargo test *)`.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The tool name this pattern names, when it is not a glob.
    pub fn tool_name(&self) -> Option<&str> {
        match &self.tool {
            NameMatcher::Exact(name) => Some(name),
            NameMatcher::Glob(_) => None,
        }
    }

    pub(crate) fn matches_tool_name(&self, tool: &str) -> bool {
        match &self.tool {
            NameMatcher::Exact(name) => name == tool,
            NameMatcher::Glob(tokens) => glob_match(tokens, tool),
        }
    }
}

impl CommandPattern {
    fn new(pattern: &str) -> Self {
        let tokens = glob_tokens(pattern);
        let prefix = if tokens.ends_with(&[GlobToken::Literal(' '), GlobToken::Star])
            || tokens.ends_with(&[GlobToken::Literal(':'), GlobToken::Star])
        {
            Some(tokens[..tokens.len() - 2].to_vec())
        } else {
            None
        };
        Self { tokens, prefix }
    }

    /// Whether the pattern has no wildcard (it matches one text only).
    pub(crate) fn is_exact(&self) -> bool {
        self.prefix.is_none() && !self.tokens.contains(&GlobToken::Star)
    }

    pub(crate) fn matches(&self, command: &str) -> bool {
        self.alternatives()
            .iter()
            .any(|tokens| glob_match(tokens, command))
    }

    /// The glob alternatives this pattern stands for: the pattern itself and, for a trailing
    /// ` *` / `:*`, the bare prefix and the prefix followed by a space and arguments.
    fn alternatives(&self) -> Vec<Vec<GlobToken>> {
        let mut out = vec![self.tokens.clone()];
        if let Some(prefix) = &self.prefix {
            out.push(prefix.clone());
            let mut with_space = prefix.clone();
            with_space.push(GlobToken::Literal(' '));
            with_space.push(GlobToken::Star);
            out.push(with_space);
        }
        out
    }

    /// Whether some text the command `command` can stand for matches: each
    /// [`CmdTok::Any`] may be any text. Used by `deny` and `ask` rules, which must catch a
    /// command whenever one of its possible values would match. Conservative (true) when the
    /// search grows past its bound.
    pub(crate) fn matches_some(&self, command: &[CmdTok]) -> bool {
        if let Some(text) = literal_text(command) {
            return self.matches(&text);
        }
        self.alternatives()
            .iter()
            .any(|tokens| intersects(tokens, command).unwrap_or(true))
    }

    /// Whether every text the command `command` can stand for matches. Used by `allow` rules for
    /// commands with unknown parts that are not expansions (glob arguments, what `xargs` and
    /// `find -exec` add). Conservative (false) when the search grows past its bound.
    pub(crate) fn matches_all(&self, command: &[CmdTok]) -> bool {
        if let Some(text) = literal_text(command) {
            return self.matches(&text);
        }
        includes(&self.alternatives(), command).unwrap_or(false)
    }
}

/// One character of a command as rules see it, or a part whose text is not known statically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmdTok {
    /// A known character.
    Char(char),
    /// Any text, possibly empty (a glob, an expansion, arguments `xargs` appends).
    Any,
}

fn literal_text(command: &[CmdTok]) -> Option<String> {
    command
        .iter()
        .map(|t| match t {
            CmdTok::Char(c) => Some(*c),
            CmdTok::Any => None,
        })
        .collect()
}

/// Bound on the states the matching searches explore; past it the answer is conservative.
const SEARCH_LIMIT: usize = 50_000;

/// A character that appears in neither the pattern nor the command: stands for all the others.
const OTHER: char = '\u{10FFFD}';

/// The epsilon closure of glob position `p` (a star may match nothing).
fn glob_closure(tokens: &[GlobToken], mut p: usize, out: &mut Vec<usize>) {
    loop {
        if !out.contains(&p) {
            out.push(p);
        }
        if tokens.get(p) == Some(&GlobToken::Star) {
            p += 1;
        } else {
            return;
        }
    }
}

/// Glob positions reached from `p` by reading `c` (before closure).
fn glob_step(tokens: &[GlobToken], p: usize, c: char) -> Option<usize> {
    match tokens.get(p)? {
        GlobToken::Star => Some(p),
        GlobToken::Literal(l) if *l == c => Some(p + 1),
        GlobToken::Literal(_) => None,
    }
}

fn alphabet(patterns: &[&[GlobToken]], command: &[CmdTok]) -> Vec<char> {
    let mut chars: Vec<char> = patterns
        .iter()
        .flat_map(|t| t.iter())
        .filter_map(|t| match t {
            GlobToken::Literal(c) => Some(*c),
            GlobToken::Star => None,
        })
        .chain(command.iter().filter_map(|t| match t {
            CmdTok::Char(c) => Some(*c),
            CmdTok::Any => None,
        }))
        .collect();
    chars.push(OTHER);
    chars.sort_unstable();
    chars.dedup();
    chars
}

/// Command positions reached from `i` without reading (an `Any` may be empty).
fn cmd_closure(command: &[CmdTok], mut i: usize, out: &mut Vec<usize>) {
    loop {
        if !out.contains(&i) {
            out.push(i);
        }
        if command.get(i) == Some(&CmdTok::Any) {
            i += 1;
        } else {
            return;
        }
    }
}

/// Whether some string matches both glob `tokens` and `command`; `None` past the bound.
fn intersects(tokens: &[GlobToken], command: &[CmdTok]) -> Option<bool> {
    let sigma = alphabet(&[tokens], command);
    let start = {
        let (mut is, mut ps) = (Vec::new(), Vec::new());
        cmd_closure(command, 0, &mut is);
        glob_closure(tokens, 0, &mut ps);
        is.iter()
            .flat_map(|i| ps.iter().map(move |p| (*i, *p)))
            .collect::<Vec<_>>()
    };
    let mut seen: std::collections::HashSet<(usize, usize)> = start.iter().copied().collect();
    let mut queue = start;
    while let Some((i, p)) = queue.pop() {
        if i == command.len() && p == tokens.len() {
            return Some(true);
        }
        if seen.len() > SEARCH_LIMIT {
            return None;
        }
        for &c in &sigma {
            let next_i = match command.get(i) {
                Some(CmdTok::Any) => Some(i),
                Some(CmdTok::Char(k)) if *k == c => Some(i + 1),
                _ => None,
            };
            let (Some(ni), Some(np)) = (next_i, glob_step(tokens, p, c)) else {
                continue;
            };
            let (mut is, mut ps) = (Vec::new(), Vec::new());
            cmd_closure(command, ni, &mut is);
            glob_closure(tokens, np, &mut ps);
            for &a in &is {
                for &b in &ps {
                    if seen.insert((a, b)) {
                        queue.push((a, b));
                    }
                }
            }
        }
    }
    Some(false)
}

/// Whether every string `command` stands for matches one of `alternatives`; `None` past the
/// bound. Explores the command's positions against the set of pattern positions reached so far
/// (the subset construction of the patterns' automaton).
fn includes(alternatives: &[Vec<GlobToken>], command: &[CmdTok]) -> Option<bool> {
    type Set = Vec<(usize, usize)>;
    let refs: Vec<&[GlobToken]> = alternatives.iter().map(Vec::as_slice).collect();
    let sigma = alphabet(&refs, command);
    let close = |set: Vec<(usize, usize)>| -> Set {
        let mut out: Set = Vec::new();
        for (alt, p) in set {
            let mut ps = Vec::new();
            glob_closure(&alternatives[alt], p, &mut ps);
            for q in ps {
                if !out.contains(&(alt, q)) {
                    out.push((alt, q));
                }
            }
        }
        out.sort_unstable();
        out
    };
    let step = |set: &Set, c: char| -> Set {
        close(
            set.iter()
                .filter_map(|&(alt, p)| glob_step(&alternatives[alt], p, c).map(|q| (alt, q)))
                .collect(),
        )
    };
    let accepting = |set: &Set| set.iter().any(|&(alt, p)| p == alternatives[alt].len());
    let start = close((0..alternatives.len()).map(|a| (a, 0)).collect());
    let mut seen: std::collections::HashSet<(usize, Set)> = std::collections::HashSet::new();
    let mut queue = vec![(0usize, start)];
    while let Some((i, set)) = queue.pop() {
        if !seen.insert((i, set.clone())) {
            continue;
        }
        if seen.len() > SEARCH_LIMIT {
            return None;
        }
        if set.is_empty() {
            // Dead: every way to finish the command from here fails to match.
            return Some(false);
        }
        match command.get(i) {
            None => {
                if !accepting(&set) {
                    return Some(false);
                }
            }
            Some(CmdTok::Char(c)) => queue.push((i + 1, step(&set, *c))),
            Some(CmdTok::Any) => {
                queue.push((i + 1, set.clone()));
                for &c in &sigma {
                    queue.push((i, step(&set, c)));
                }
            }
        }
    }
    Some(true)
}

impl PathPattern {
    fn new(pattern: &str) -> Result<Self, String> {
        let mut p = pattern.trim().to_owned();
        while p.len() > 1 && p.ends_with('/') {
            p.pop();
        }
        let glob_text = if let Some(rest) = p.strip_prefix("./") {
            rest.to_owned()
        } else if p == "." {
            "**".to_owned()
        } else if p.contains('/') || p.starts_with("**") {
            // Absolute, or anchored by an inner `/` (gitignore rule).
            p.clone()
        } else {
            format!("**/{p}")
        };
        let build = |g: &str| {
            GlobBuilder::new(g)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map(|g| g.compile_matcher())
                .map_err(|e| format!("bad path glob `{g}`: {e}"))
        };
        let glob = build(&glob_text)?;
        let dir = match glob_text.strip_suffix("/**") {
            Some(prefix) if !prefix.is_empty() => Some(build(prefix)?),
            _ => None,
        };
        Ok(Self { glob, dir })
    }

    /// Whether `path` (workspace-relative `a/b`, `.`, or absolute) or one of its ancestors matches.
    pub(crate) fn matches(&self, path: &str) -> bool {
        if self.dir.as_ref().is_some_and(|d| d.is_match(path)) {
            return true;
        }
        let mut current = path;
        loop {
            if self.glob.is_match(current) {
                return true;
            }
            match current.rfind('/') {
                Some(0) | None => return false,
                Some(idx) => current = &current[..idx],
            }
        }
    }
}

pub(crate) fn glob_tokens(pattern: &str) -> Vec<GlobToken> {
    let mut tokens = Vec::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(next) => tokens.push(GlobToken::Literal(next)),
                None => tokens.push(GlobToken::Literal('\\')),
            },
            '*' => {
                if tokens.last() != Some(&GlobToken::Star) {
                    tokens.push(GlobToken::Star);
                }
            }
            c => tokens.push(GlobToken::Literal(c)),
        }
    }
    tokens
}

/// `*` matches any (possibly empty) sequence of characters, including `/` and spaces.
pub(crate) fn glob_match(tokens: &[GlobToken], text: &str) -> bool {
    let text: Vec<char> = text.chars().collect();
    let (mut t, mut p) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match tokens.get(p) {
            Some(GlobToken::Literal(c)) if *c == text[t] => {
                t += 1;
                p += 1;
            }
            Some(GlobToken::Star) => {
                star = Some((p, t));
                p += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    tokens[p.min(tokens.len())..]
        .iter()
        .all(|tok| *tok == GlobToken::Star)
}
