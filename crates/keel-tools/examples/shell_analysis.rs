//! Development tool: shows how the shell policy reads command lines — the bash syntax tree
//! (tree-sitter-bash) and the analysis policy decides on (commands, roles, unprovable and
//! not-literal reasons).
//!
//! `cargo run -p keel-tools --example shell_analysis -- 'a=rm; $a v' 'timeout 5 git status'`

use keel_tools::policy::shell;

fn dump(node: tree_sitter::Node<'_>, src: &str, field: Option<&str>, depth: usize) {
    let text = src.get(node.byte_range()).unwrap_or("?");
    let leaf = node.child_count() == 0 || node.kind() == "word";
    println!(
        "{}{}{} {}{}",
        "  ".repeat(depth),
        field.map(|f| format!("{f}: ")).unwrap_or_default(),
        node.kind(),
        if leaf {
            format!("{text:?}")
        } else {
            String::new()
        },
        if node.is_error() || node.is_missing() {
            "  <-- error"
        } else {
            ""
        },
    );
    for i in 0..node.child_count() {
        if let Some(child) = node.child(i) {
            dump(child, src, node.field_name_for_child(i), depth + 1);
        }
    }
}

fn main() {
    let mut parser = tree_sitter::Parser::new();
    if let Err(e) = parser.set_language(&tree_sitter_bash::LANGUAGE.into()) {
        eprintln!("cannot load the bash grammar: {e}");
        std::process::exit(1);
    }
    for line in std::env::args().skip(1) {
        println!("==== {line:?}");
        if let Some(tree) = parser.parse(&line, None) {
            dump(tree.root_node(), &line, None, 0);
        }
        let analysis = shell::analyze(&line);
        for command in analysis.commands() {
            println!("command {:?} ({:?})", command.text(), command.role());
        }
        println!("unprovable: {:?}", analysis.unprovable());
        println!("not literal: {:?}", analysis.not_literal());
    }
}
