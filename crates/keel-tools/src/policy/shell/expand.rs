//! Words and expansions: quoting, concatenation, parameter and command substitution,
//! arithmetic and subscripts, read as bash reads them, into [`Word`]s.

use super::*;

impl<'s> Walker<'_, 's> {
    /// Decodes a word node (any of the kinds in [`Walker::is_word`], or `command_name`).
    /// `split`: the word is unquoted context (expansions in it are split into words).
    pub(super) fn word(&mut self, node: Node<'_>, split: bool) -> Word {
        let mut raw = Vec::new();
        if self.enter() {
            self.word_into(node, split, true, &mut raw);
        }
        self.nesting -= 1;
        let word = Word::from_raw(&raw, self.text(node));
        if word.expanded {
            // Tilde and brace expansions are found in the decoded text.
            self.not_literal(format!("`{}` is expanded when the line runs", word.src));
        }
        word
    }

    pub(super) fn word_into(
        &mut self,
        node: Node<'_>,
        split: bool,
        at_start: bool,
        raw: &mut Vec<Raw>,
    ) {
        let text = self.text(node).to_owned();
        let result = match node.kind() {
            "word" | "number" => words::unquoted(&text, at_start, raw),
            "command_name" | "concatenation" => {
                self.concatenation(node, at_start, raw);
                Ok(())
            }
            "string" => {
                self.string(node, raw);
                Ok(())
            }
            "raw_string" => match text.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')) {
                Some(body) => {
                    raw.extend(body.chars().map(|c| Raw::Char(c, true)));
                    Ok(())
                }
                None => Err("a single-quoted string the parser did not close".to_owned()),
            },
            "ansi_c_string" => match text.strip_prefix("$'").and_then(|t| t.strip_suffix('\'')) {
                Some(body) => words::ansi_c(body, raw),
                None => Err("a `$'…'` string the parser did not close".to_owned()),
            },
            "translated_string" => {
                self.not_literal("a `$\"…\"` translated string");
                self.scan(node);
                raw.push(Raw::Expansion { split: false });
                Ok(())
            }
            "simple_expansion"
            | "expansion"
            | "command_substitution"
            | "process_substitution"
            | "arithmetic_expansion" => {
                self.expansion_node(node);
                let split = split && node.kind() != "process_substitution";
                raw.push(Raw::Expansion { split });
                Ok(())
            }
            "brace_expression" => {
                self.not_literal("a brace expansion");
                raw.push(Raw::Expansion { split: true });
                Ok(())
            }
            "extglob_pattern" => {
                raw.push(Raw::Expansion { split: true });
                Ok(())
            }
            kind => Err(format!("unsupported bash word syntax `{kind}`")),
        };
        if let Err(why) = result {
            self.unprovable(why);
            raw.push(Raw::Expansion { split: true });
        }
    }

    /// Adjacent parts of one word; text between the grammar's parts is decoded as unquoted.
    pub(super) fn concatenation(&mut self, node: Node<'_>, at_start: bool, raw: &mut Vec<Raw>) {
        let mut cursor = node.start_byte();
        for child in named_children(node) {
            if child.kind() == "comment" {
                self.unprovable("a comment inside a word");
                continue;
            }
            self.gap(cursor, child.start_byte(), at_start && raw.is_empty(), raw);
            let start = at_start && raw.is_empty();
            // An unquoted `$` right before a quote starts `$"…"` / `$'…'` in bash, even where
            // the grammar read the `$` on its own (`rm$"" v`, `"r"$"m" v`).
            if matches!(child.kind(), "string" | "raw_string")
                && raw.last() == Some(&Raw::Char('$', false))
            {
                raw.pop();
                self.dollar_quoted(child, raw);
                cursor = child.end_byte();
                continue;
            }
            if self.enter() {
                self.word_into(child, true, start, raw);
            }
            self.nesting -= 1;
            cursor = child.end_byte();
        }
        self.gap(cursor, node.end_byte(), false, raw);
    }

    /// A quoted string that follows a `$` the grammar did not join to it: `$"…"` is a
    /// translated string (not literal: a message catalog can replace it), `$'…'` is decoded as
    /// ANSI-C.
    pub(super) fn dollar_quoted(&mut self, node: Node<'_>, raw: &mut Vec<Raw>) {
        let text = self.text(node).to_owned();
        if node.kind() == "string" {
            self.not_literal("a `$\"…\"` translated string");
            self.scan(node);
            raw.push(Raw::Expansion { split: false });
            return;
        }
        let decoded = match text.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')) {
            Some(body) => words::ansi_c(body, raw),
            None => Err("a `$'…'` string the parser did not close".to_owned()),
        };
        if let Err(why) = decoded {
            self.unprovable(why);
            raw.push(Raw::Expansion { split: true });
        }
    }

    pub(super) fn gap(&mut self, from: usize, to: usize, at_start: bool, raw: &mut Vec<Raw>) {
        if from >= to {
            return;
        }
        let text = self.src.get(from..to).unwrap_or("").to_owned();
        if let Err(why) = words::unquoted(&text, at_start, raw) {
            self.unprovable(why);
        }
    }

    /// A double-quoted string: literal text between the expansions the grammar found.
    pub(super) fn string(&mut self, node: Node<'_>, raw: &mut Vec<Raw>) {
        let text = self.text(node);
        if !(text.len() >= 2 && text.starts_with('"') && text.ends_with('"')) {
            self.unprovable("a double-quoted string the parser did not close");
            return;
        }
        let (start, end) = (node.start_byte() + 1, node.end_byte() - 1);
        let mut cursor = start;
        for child in named_children(node) {
            if child.kind() == "string_content" {
                continue;
            }
            self.dq_gap(cursor, child.start_byte(), raw);
            match child.kind() {
                "simple_expansion"
                | "expansion"
                | "command_substitution"
                | "arithmetic_expansion" => {
                    self.expansion_node(child);
                    raw.push(Raw::Expansion { split: false });
                }
                kind => {
                    self.unprovable(format!("unsupported syntax `{kind}` inside double quotes"));
                    raw.push(Raw::Expansion { split: false });
                }
            }
            cursor = child.end_byte();
        }
        self.dq_gap(cursor, end, raw);
    }

    pub(super) fn dq_gap(&mut self, from: usize, to: usize, raw: &mut Vec<Raw>) {
        if from >= to {
            return;
        }
        let text = self.src.get(from..to).unwrap_or("").to_owned();
        if let Err(why) = words::double_quoted(&text, raw) {
            self.unprovable(why);
        }
    }

    /// An expansion or substitution inside a word: not literal; the commands inside are
    /// commands of the line; forms that evaluate values as code are unprovable.
    pub(super) fn expansion_node(&mut self, node: Node<'_>) {
        match node.kind() {
            "simple_expansion" => self.not_literal("a parameter expansion"),
            "expansion" => self.expansion(node),
            "command_substitution" | "process_substitution" => self.substitution(node),
            "arithmetic_expansion" => {
                self.not_literal("an arithmetic expansion");
                self.arithmetic(node);
            }
            _ => self.scan(node),
        }
    }

    pub(super) fn substitution(&mut self, node: Node<'_>) {
        let what = if node.kind() == "process_substitution" {
            "a process substitution"
        } else {
            "a command substitution"
        };
        self.not_literal(what);
        let text = self.text(node);
        if text.starts_with('`') && text.contains('\\') {
            self.unprovable(
                "a backquoted substitution with backslashes, which bash reads differently",
            );
        }
        for child in named_children(node) {
            self.statement(child);
        }
    }

    /// `${…}`: indirection, substring offsets and subscripts evaluate values as code.
    pub(super) fn expansion(&mut self, node: Node<'_>) {
        self.not_literal("a parameter expansion");
        let text = self.text(node);
        if text.starts_with("${!") {
            self.unprovable(format!(
                "`{text}` is an indirect expansion, which evaluates a variable's value as a name"
            ));
        }
        if text.ends_with("@P}") {
            self.unprovable(format!(
                "`{text}` expands a value as a prompt string, which runs `$(…)` in it"
            ));
        }
        let mut after_colon = false;
        for child in children(node).into_iter().map(|(_, c)| c) {
            if !child.is_named() {
                let t = self.text(child);
                if t == ":" {
                    after_colon = true;
                } else if t != "}" && after_colon {
                    after_colon = false;
                }
                continue;
            }
            if after_colon && !(child.kind() == "number" && is_digits(self.text(child))) {
                self.unprovable(format!(
                    "`{text}` takes a substring at an offset bash evaluates as arithmetic"
                ));
            }
        }
        // Bash expands the words inside `${…}` (`${x:-word}`, patterns, replacements): a
        // substitution there that the grammar left in plain text (`${x:-`rm v`}`) is unseen.
        let mut stack = named_children(node);
        while let Some(n) = stack.pop() {
            match n.kind() {
                "command_substitution" | "process_substitution" | "arithmetic_expansion" => {}
                _ if n.named_child_count() == 0 => {
                    let leaf = self.text(n);
                    let dollar = leaf
                        .char_indices()
                        .filter(|&(_, c)| c == '$')
                        .any(|(i, _)| leaf[i + 1..].starts_with(['(', '{', '[']));
                    if leaf.contains('`') || dollar {
                        self.unprovable(format!(
                            "`{text}` holds a substitution the parser did not read"
                        ));
                    }
                }
                _ => stack.extend(named_children(n)),
            }
        }
        self.scan(node);
    }

    /// Visits everything under `node` for substitutions, expansions and subscripts.
    pub(super) fn scan(&mut self, node: Node<'_>) {
        if !self.enter() {
            self.nesting -= 1;
            return;
        }
        for child in named_children(node) {
            match child.kind() {
                "command_substitution" | "process_substitution" => self.substitution(child),
                "arithmetic_expansion" => {
                    self.not_literal("an arithmetic expansion");
                    self.arithmetic(child);
                }
                "expansion" => self.expansion(child),
                "simple_expansion" => self.not_literal("a parameter expansion"),
                "subscript" => self.subscript(child),
                "ERROR" => self.unprovable("the command is not valid bash"),
                _ => self.scan(child),
            }
        }
        self.nesting -= 1;
    }

    /// `a[i]`: bash evaluates the index as arithmetic (which can run `$(…)` held in a value).
    pub(super) fn subscript(&mut self, node: Node<'_>) {
        match node.child_by_field_name("index") {
            Some(index) => {
                let t = self.text(index);
                if !(t == "@" || t == "*" || is_digits(t)) {
                    self.unprovable(format!(
                        "`{}` has an array index bash evaluates as arithmetic",
                        self.text(node)
                    ));
                }
            }
            None => self.unprovable("an array subscript the parser did not read"),
        }
    }

    /// Arithmetic (`$((…))`, `((…))`, C-style `for`): provable only over literal numbers.
    pub(super) fn arithmetic(&mut self, node: Node<'_>) {
        let text = self.text(node);
        let inner = text
            .trim_start_matches("$((")
            .trim_start_matches("$[")
            .trim_start_matches("((")
            .trim_end_matches("))")
            .trim_end_matches(']');
        if !is_literal_arithmetic(inner) {
            self.unprovable(format!(
                "`{text}` is arithmetic over variables, which bash evaluates as code"
            ));
        }
    }
}
