//! Redirections and here-documents.

use super::*;

impl<'s> Walker<'_, 's> {
    /// A redirection: its target as a path word (`None` for a descriptor duplication).
    pub(super) fn redirect(&mut self, node: Node<'_>) -> Vec<Redirect> {
        match node.kind() {
            "file_redirect" => self.file_redirect(node).into_iter().collect(),
            "heredoc_redirect" => self.heredoc(node),
            "herestring_redirect" => {
                for child in named_children(node) {
                    self.word(child, false);
                }
                Vec::new()
            }
            kind => {
                self.unprovable(format!("unsupported redirection `{kind}`"));
                Vec::new()
            }
        }
    }

    pub(super) fn file_redirect(&mut self, node: Node<'_>) -> Option<Redirect> {
        let mut op = String::new();
        let mut dest = None;
        for (field, child) in children(node) {
            match field {
                Some("descriptor") => {
                    if !is_digits(self.text(child)) {
                        self.not_literal("a redirection that assigns a descriptor variable");
                    }
                }
                Some("destination") => {
                    if dest.is_some() {
                        self.unprovable("a redirection with two targets");
                    }
                    dest = Some(child);
                }
                _ if !child.is_named() => op.push_str(self.text(child)),
                _ => self.unprovable(format!("unexpected `{}` in a redirection", child.kind())),
            }
        }
        if op.ends_with('-') {
            // `>&-` / `<&-` close a descriptor and take no target.
            if dest.is_some() {
                self.unprovable(format!(
                    "the parser read a target after `{op}`, which closes a descriptor and takes none"
                ));
            }
            return None;
        }
        let Some(dest) = dest else {
            self.unprovable("a redirection without a target");
            return None;
        };
        let target = self.word(dest, true);
        let text = target.text();
        if matches!(op.as_str(), ">&" | "<&")
            && text.as_deref().is_some_and(|t| is_digits(t) || t == "-")
        {
            return None;
        }
        let write = op.contains('>');
        match text.as_deref() {
            None => self.not_literal(format!("redirects to `{}`, a computed path", target.src)),
            Some("/dev/null") => {}
            Some(path) if !is_workspace_path(path) => {
                self.not_literal(format!("redirects to `{path}`, outside the workspace"));
            }
            Some(path) if write && path.split('/').any(|c| c == ".git") => {
                self.not_literal(format!(
                    "redirects into `{path}`; git runs hooks and config from `.git`"
                ));
            }
            Some(_) => {}
        }
        Some(Redirect { target, write })
    }

    /// A here-document. Its delimiter is computed as bash computes it (quote removal) and the
    /// grammar's reading is checked against it: the body must hold no line bash would take as
    /// the delimiter (with `<<-` tabs and, unquoted, line continuations applied as bash does),
    /// and the grammar's terminator line must be the delimiter. A delimiter this module does
    /// not compute exactly (`$'…'`, `$"…"`, any `$`) is unprovable.
    pub(super) fn heredoc(&mut self, node: Node<'_>) -> Vec<Redirect> {
        let mut quoted = false;
        let mut strip_tabs = false;
        let mut delimiter = None;
        let (mut body, mut end) = (None, None);
        let mut out = Vec::new();
        for child in children(node).into_iter().map(|(_, c)| c) {
            if !child.is_named() {
                strip_tabs |= self.text(child) == "<<-";
                continue;
            }
            match child.kind() {
                "heredoc_start" => match words::heredoc_delimiter(self.text(child)) {
                    Ok((word, q)) => {
                        quoted = q;
                        delimiter = Some(word);
                    }
                    Err(why) => {
                        quoted = true;
                        self.unprovable(why);
                    }
                },
                "heredoc_body" => {
                    body = Some(child);
                    if !quoted {
                        self.heredoc_body(child);
                    }
                }
                "heredoc_end" => end = Some(child),
                "file_redirect" | "heredoc_redirect" | "herestring_redirect" => {
                    out.extend(self.redirect(child));
                }
                _ => self.statement(child),
            }
        }
        if let Some(delimiter) = delimiter {
            self.check_heredoc_ends(&delimiter, quoted, strip_tabs, body, end);
        }
        out
    }

    /// Whether bash ends the here-document where the grammar does (see [`Walker::heredoc`]).
    pub(super) fn check_heredoc_ends(
        &mut self,
        delimiter: &str,
        quoted: bool,
        strip_tabs: bool,
        body: Option<Node<'_>>,
        end: Option<Node<'_>>,
    ) {
        let Some(end) = end else {
            self.unprovable(format!(
                "the here-document `{delimiter}` has no terminator the parser found"
            ));
            return;
        };
        // The terminator line as a whole (the grammar leaves `<<-` tabs out of the node).
        let line_start = self.src[..end.start_byte()]
            .rfind('\n')
            .map_or(0, |i| i + 1);
        let line = &self.src[line_start..end.end_byte()];
        let line = if strip_tabs {
            line.trim_start_matches('\t')
        } else {
            line
        };
        let after = self.src[end.end_byte()..].chars().next();
        if line != delimiter || !matches!(after, None | Some('\n')) {
            self.unprovable(format!(
                "the parser ended the here-document `{delimiter}` at a line bash does not end it at"
            ));
            return;
        }
        let body_text = match body {
            Some(b) => &self.src[b.start_byte()..line_start.max(b.start_byte())],
            None => "",
        };
        if words::heredoc_line_ends(body_text, delimiter, strip_tabs, !quoted) {
            self.unprovable(format!(
                "the here-document body holds a line bash reads as its delimiter `{delimiter}`, which the parser did not"
            ));
        }
    }

    pub(super) fn heredoc_body(&mut self, node: Node<'_>) {
        for child in named_children(node) {
            match child.kind() {
                "heredoc_content" => {
                    let text = self.text(child).to_owned();
                    if let Err(why) = words::double_quoted(&text.replace('"', ""), &mut Vec::new())
                    {
                        self.unprovable(why);
                    }
                }
                "simple_expansion"
                | "expansion"
                | "command_substitution"
                | "arithmetic_expansion" => {
                    self.not_literal("a here-document with expansions");
                    self.expansion_node(child);
                }
                kind => self.unprovable(format!("unsupported `{kind}` in a here-document")),
            }
        }
        if named_children(node).is_empty() {
            let text = self.text(node).to_owned();
            if let Err(why) = words::double_quoted(&text.replace('"', ""), &mut Vec::new()) {
                self.unprovable(why);
            }
        }
    }
}
