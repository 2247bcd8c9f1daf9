//! Assignments, declarations, `unset`, functions, `case`, `for` and `[[ … ]]` tests.

use super::*;

impl<'s> Walker<'_, 's> {
    /// A variable assignment (standalone or as a command prefix): not literal; a dangerous name
    /// is unprovable. Returns the variable's name.
    pub(super) fn assignment(&mut self, node: Node<'_>) -> Option<String> {
        let name_node = node.child_by_field_name("name");
        let name = match name_node {
            Some(n) if n.kind() == "variable_name" => self.text(n).to_owned(),
            Some(n) if n.kind() == "subscript" => {
                self.subscript(n);
                n.child_by_field_name("name")
                    .map(|v| self.text(v).to_owned())
                    .unwrap_or_default()
            }
            _ => {
                self.unprovable("an assignment to a computed name");
                return None;
            }
        };
        self.not_literal(format!("`{name}=…` assigns a variable"));
        if let Some(why) = programs::dangerous_variable(&name) {
            self.unprovable(why);
        }
        if let Some(value) = node.child_by_field_name("value") {
            if value.kind() == "array" {
                for element in named_children(value) {
                    if self.text(element).starts_with('[') {
                        self.unprovable(
                            "an array element with an index, which bash evaluates as arithmetic",
                        );
                    }
                    self.word(element, false);
                }
            } else {
                self.word(value, false);
            }
        }
        Some(name)
    }

    /// `export`, `declare`, `local`, `readonly`, `typeset`.
    pub(super) fn declaration(&mut self, node: Node<'_>) {
        let keyword = node
            .child(0)
            .map(|c| self.text(c).to_owned())
            .unwrap_or_default();
        self.not_literal(format!("`{keyword}` declares variables"));
        for child in named_children(node) {
            match child.kind() {
                "variable_assignment" => {
                    self.assignment(child);
                }
                "variable_name" => {
                    let name = self.text(child).to_owned();
                    if let Some(why) = programs::dangerous_variable(&name) {
                        self.unprovable(why);
                    }
                }
                "word" if self.text(child).starts_with(['-', '+']) => {
                    self.unprovable(format!(
                        "`{keyword} {}`: declarations with options can evaluate values as code",
                        self.text(child)
                    ));
                }
                _ => self.unprovable(format!(
                    "`{keyword}` with a computed name `{}`",
                    self.text(child)
                )),
            }
        }
    }

    /// `unset NAME…`: a command of the line; computed or subscripted names are unprovable.
    pub(super) fn unset(&mut self, node: Node<'_>) {
        let mut argv = Vec::new();
        let mut prev_end = None;
        for (i, child) in children(node).into_iter().map(|(_, c)| c).enumerate() {
            if i == 0 {
                argv.push(Word::literal(self.text(child)));
                prev_end = Some(child.end_byte());
                continue;
            }
            if !child.is_named() {
                continue;
            }
            if prev_end == Some(child.start_byte()) {
                self.unprovable(format!(
                    "`unset` with a subscripted or computed name `{}`",
                    self.text(child)
                ));
            }
            prev_end = Some(child.end_byte());
            let word = self.word(child, true);
            match word.text() {
                Some(t) if !t.contains('[') => argv.push(word),
                _ => {
                    self.unprovable(format!(
                        "`unset` with a subscripted or computed name `{}`",
                        self.text(child)
                    ));
                    argv.push(word);
                }
            }
        }
        self.out.commands.push(Command {
            words: argv,
            redirects: Vec::new(),
            role: Role::Program,
            args_may_run: false,
        });
    }

    pub(super) fn function(&mut self, node: Node<'_>) {
        match node.child_by_field_name("name") {
            Some(name) if name.kind() == "word" => {
                self.not_literal(format!("defines the function `{}`", self.text(name)));
            }
            _ => self.unprovable("a function with a computed name"),
        }
        match node.child_by_field_name("body") {
            Some(body) => self.statement(body),
            None => self.unprovable("a function without a body"),
        }
        for (field, child) in children(node) {
            if field == Some("redirect") {
                let found = self.redirect(child);
                self.out.loose_redirects.extend(found);
            }
        }
    }

    pub(super) fn case(&mut self, node: Node<'_>) {
        for (field, child) in children(node) {
            match (field, child.kind()) {
                (Some("value"), _) => {
                    self.word(child, false);
                }
                (_, "case_item") => self.case_item(child),
                (_, "comment") => {}
                _ if !child.is_named() => {}
                (_, kind) => self.unprovable(format!("unexpected `{kind}` in a `case`")),
            }
        }
    }

    pub(super) fn case_item(&mut self, node: Node<'_>) {
        for (field, child) in children(node) {
            match field {
                Some("value") => {
                    self.word(child, false);
                }
                _ if !child.is_named() => {}
                _ => self.statement(child),
            }
        }
    }

    pub(super) fn for_loop(&mut self, node: Node<'_>) {
        if node.child(0).is_some_and(|c| c.kind() == "select") {
            self.unprovable("`select` reads its choice from standard input");
        }
        for (field, child) in children(node) {
            match field {
                Some("variable") => {
                    let name = self.text(child).to_owned();
                    self.not_literal(format!("the loop assigns `{name}`"));
                    if let Some(why) = programs::dangerous_variable(&name) {
                        self.unprovable(why);
                    }
                }
                Some("value") => {
                    self.word(child, true);
                }
                Some("body") => self.statement(child),
                _ if !child.is_named() => {}
                _ if child.kind() == "comment" => {}
                _ => self.unprovable(format!("unexpected `{}` in a `for` loop", child.kind())),
            }
        }
    }

    /// `[[ … ]]` and `[ … ]`: arithmetic comparisons and `-v` evaluate operands as code.
    pub(super) fn test_command(&mut self, node: Node<'_>) {
        let text = self.text(node);
        let mut stack = vec![node];
        let mut operators = Vec::new();
        while let Some(n) = stack.pop() {
            if n.kind() == "test_operator" {
                operators.push(self.text(n));
            }
            stack.extend(named_children(n));
        }
        // The operator words as the grammar read them, and as plain words too.
        operators.extend(text.split_whitespace());
        let arithmetic = operators
            .iter()
            .any(|o| matches!(*o, "-eq" | "-ne" | "-lt" | "-le" | "-gt" | "-ge"));
        let names = operators.iter().any(|o| matches!(*o, "-v" | "-R"));
        if arithmetic && !only_number_operands(text) {
            self.unprovable(format!(
                "`{text}` compares as arithmetic, which bash evaluates as code"
            ));
        }
        let inner = text.trim_start_matches("[[").trim_start_matches('[');
        if names && inner.contains(['[', '$', '`']) {
            self.unprovable(format!(
                "`{text}` tests a subscripted or computed name, which bash evaluates as code"
            ));
        }
        for child in named_children(node) {
            self.test_part(child);
        }
    }

    pub(super) fn test_part(&mut self, node: Node<'_>) {
        if self.is_word(node) {
            self.word(node, false);
        } else {
            self.scan(node);
        }
    }
}
