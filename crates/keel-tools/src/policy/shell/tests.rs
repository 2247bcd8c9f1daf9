use super::*;

/// The commands of `line`, which must be provable, as text.
pub(crate) fn texts(line: &str) -> Vec<String> {
    let a = analyze(line);
    assert!(a.unprovable().is_none(), "{line}: {:?}", a.unprovable());
    a.commands().iter().map(Command::text).collect()
}

/// Why `line` is unprovable; panics when it is not.
pub(crate) fn unprovable(line: &str) -> String {
    analyze(line)
        .unprovable()
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("{line:?} should be unprovable"))
}

#[test]
fn lists_pipelines_and_groups_yield_each_command() {
    assert_eq!(
        texts("a && b || c; d | e\nf & g"),
        ["a", "b", "c", "d", "e", "f", "g"]
    );
    assert_eq!(texts("echo 'a;b' \"c && d\""), ["echo 'a;b' \"c && d\""]);
    assert_eq!(texts("(cd x && rm y)"), ["cd x", "rm y"]);
    assert_eq!(texts("{ echo a; rm b; }"), ["echo a", "rm b"]);
    assert_eq!(texts("if true; then rm a; fi"), ["true", "rm a"]);
    assert_eq!(texts("case x in x) rm v;; esac"), ["rm v"]);
}

#[test]
fn substitutions_yield_their_commands_and_are_not_literal() {
    let a = analyze("echo $(rm -rf z)");
    assert!(a.unprovable().is_none());
    assert!(a.not_literal().is_some());
    let t: Vec<String> = a.commands().iter().map(Command::text).collect();
    assert_eq!(t, ["rm -rf z", "echo $(rm -rf z)"]);
    assert_eq!(
        texts("diff <(ls a) <(ls b)"),
        ["ls a", "ls b", "diff <(ls a) <(ls b)"]
    );
}

#[test]
fn wrappers_yield_the_wrapper_and_the_command() {
    assert_eq!(
        texts("timeout -s KILL 10 cargo test"),
        ["timeout -s KILL 10 cargo test", "cargo test"]
    );
    assert_eq!(
        texts("bash -lc 'git push && echo ok'"),
        ["bash -lc 'git push && echo ok'", "git push", "echo ok"]
    );
    let a = analyze("find . -exec rm {} \\;");
    let t: Vec<String> = a.commands().iter().map(Command::text).collect();
    assert_eq!(t, ["find . -exec rm {} \\;", "rm {}"]);
    assert_eq!(a.commands()[1].exact_text(), None);
}

#[test]
fn computed_command_names_are_unprovable() {
    for line in [
        "$(echo rm) v",
        "a=rm; $a v",
        "rm${IFS}v",
        "{rm,v}",
        "/???/r? v",
        "\"$@\"",
        "~/bin/x",
        "`echo rm` v",
    ] {
        unprovable(line);
    }
    let a = analyze("$'\\x72m' v");
    assert!(a.unprovable().is_none());
    assert_eq!(a.commands()[0].exact_text().as_deref(), Some("rm v"));
}

#[test]
fn heredocs_are_provable_only_where_bash_ends_them_as_the_parser_does() {
    assert_eq!(
        texts("cat <<'EOF'\nrm v\nEOF\necho done"),
        ["cat", "echo done"]
    );
    assert_eq!(texts("cat <<-EOF\n\thello\n\tEOF"), ["cat"]);
    assert_eq!(texts("cat <<\\EOF\nhello\nEOF"), ["cat"]);
    assert_eq!(texts("cat <<\"EOF\"\nhello $x\nEOF"), ["cat"]);
    assert_eq!(texts("x=$(cat <<'EOF'\nhi\nEOF\n)"), ["cat"]);
    for line in [
        "grep x <<E''OF\nEOF\ntouch m\nE''OF",
        "cat <<-E\"O\"F\nEOF\nrm v\nE\"O\"F",
        "x=$(cat <<E'O'F\nEOF\nrm v\nE'O'F\n)",
        "cat <<$'EOF'\nEOF",
        "cat <<E'$'F\nE$F\nrm v\nE'$'F",
        "cat <<EOF\nE\\\nOF\nrm v\nEOF",
    ] {
        unprovable(line);
    }
}

#[test]
fn a_dollar_glued_to_a_quote_and_substitutions_hidden_in_expansions_are_seen() {
    for line in ["rm$\"\" v", "r$\"m\" v", "\"r\"$\"m\" v"] {
        unprovable(line);
    }
    let a = analyze("r$'m' v");
    assert_eq!(a.commands()[0].exact_text().as_deref(), Some("rm v"));
    for line in [
        "echo ${x:-`rm v`}",
        "echo \"${x:=`rm v`}\"",
        "echo ${x:-${y:-`rm v`}}",
        "cat <<EOF\n${x:+`rm v`}\nEOF",
    ] {
        unprovable(line);
    }
    let a = analyze("echo ${x:-default}");
    assert!(a.unprovable().is_none());
}

#[test]
fn perl_switches_are_read_as_perl_reads_them() {
    for line in [
        "perl -le 'unlink 1'",
        "perl -0e 1",
        "perl -00e 1",
        "perl -l0e 1",
        "perl -0x1F -e 1",
        "perl -CSDe 1",
        "perl -I. -le 1",
        "perl '-l -e' 1",
        "perl5.36.0 -e 1",
        "perl5.36-x86_64-linux-gnu -e 1",
        "perl",
        "perl -",
        "ruby -0e 1",
    ] {
        unprovable(line);
    }
    assert_eq!(texts("perl -w -l0 tool.pl x"), ["perl -w -l0 tool.pl x"]);
    assert_eq!(texts("perl -F: -lan tool.pl"), ["perl -F: -lan tool.pl"]);
    assert_eq!(
        texts("perl -i.bak -p fix.pl f"),
        ["perl -i.bak -p fix.pl f"]
    );
}

#[test]
fn an_unknown_programs_arguments_are_offered_as_commands() {
    let a = analyze("cgexec -g cpu:x /bin/rm -f v");
    let offered: Vec<String> = a.commands()[0]
        .argument_commands()
        .into_iter()
        .map(|(text, _)| text)
        .collect();
    assert!(offered.contains(&"/bin/rm -f v".to_owned()), "{offered:?}");
    assert!(offered.contains(&"v".to_owned()), "{offered:?}");
    assert!(
        analyze("echo rm v").commands()[0]
            .argument_commands()
            .is_empty()
    );
    assert!(
        analyze("choom -n 0 ls").commands()[0]
            .argument_commands()
            .is_empty()
    );
}

#[test]
fn a_redirection_in_a_line_that_changes_directory_is_not_literal() {
    let a = analyze("cd src && echo hi > x");
    assert!(a.unprovable().is_none());
    assert!(a.not_literal().is_some());
    assert!(
        analyze("cd src && make 2>/dev/null")
            .not_literal()
            .is_none()
    );
    assert_eq!(
        redirect_targets(&analyze("echo a > x 2>/dev/null < in; { :; } >> y")),
        [
            ("x".to_owned(), true),
            ("in".to_owned(), false),
            ("y".to_owned(), true)
        ]
    );
}

#[test]
fn unbalanced_input_is_unprovable() {
    unprovable("echo 'oops");
    unprovable("(echo hi");
    unprovable("echo $(true");
    unprovable("exec 3>&- rm");
}

#[test]
fn path_words_name_arguments_and_redirections_with_their_access() {
    let w = |s: &str| path_words(s);
    assert_eq!(
        w("cat secrets/x | tee out.txt"),
        [
            ("secrets/x".to_owned(), false),
            ("out.txt".to_owned(), true)
        ]
    );
    assert_eq!(
        w("echo hi >> log.txt 2>&1 &>all.txt"),
        [
            ("hi".to_owned(), false),
            ("log.txt".to_owned(), true),
            ("all.txt".to_owned(), true)
        ]
    );
    assert_eq!(
        w("cp -r a b/c"),
        [("a".to_owned(), false), ("b/c".to_owned(), true)]
    );
    assert_eq!(
        w("sed -i s/a/b/ f.txt"),
        [("s/a/b/".to_owned(), true), ("f.txt".to_owned(), true)]
    );
    assert_eq!(
        w("dd if=a of=b"),
        [("a".to_owned(), false), ("b".to_owned(), true)]
    );
    assert_eq!(w("wc <in.txt"), [("in.txt".to_owned(), false)]);
    assert_eq!(
        w("./run.sh --config=cfg.toml"),
        [
            ("./run.sh".to_owned(), false),
            ("cfg.toml".to_owned(), false)
        ]
    );
    assert_eq!(w("curl https://x.example/a"), []);
    assert_eq!(
        w("head -n 3 secrets/*"),
        [("3".to_owned(), false), ("secrets/*".to_owned(), false)]
    );
}
