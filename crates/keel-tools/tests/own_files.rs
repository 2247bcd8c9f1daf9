//! keel's own files inside the workspace (the workspace is `$HOME`, so `~/.local/share/keel` and
//! `~/.config/keel` are in it): the file tools refuse them by any spelling and leave them out of
//! every listing and search (`Workspace::protecting`). The same calls on a workspace that
//! protects nothing first show what the tools would otherwise reveal or change.

use keel_tools::tool::ToolResultStatus::{Failed, Succeeded};
use keel_tools::workspace::Workspace;
use serde_json::{Value, json};

use crate::common::Fixture;

const STORE: &str = ".local/share/keel/keel.db";
const SEAL: &str = ".local/share/keel/seal.key";
const CONFIG: &str = ".config/keel/keel.toml";

/// A home directory with keel's data and config in it, a link into the data directory, and an
/// ordinary file that mentions the same word the secrets do.
fn home(protect: bool) -> Fixture {
    let mut f = Fixture::new();
    f.write(STORE, "KEEL-STORE-SECRET row\n");
    f.write(SEAL, "KEEL-SEAL-SECRET\n");
    f.write(CONFIG, "api_key = \"KEEL-CONFIG-SECRET\"\n");
    f.write(".local/bin/tool", "#!/bin/sh\n# KEEL-ordinary file\n");
    std::os::unix::fs::symlink(".local/share/keel", f.path("data")).unwrap();
    if protect {
        let own = [f.path(".local/share/keel"), f.path(".config/keel")];
        f.ctx.workspace = Workspace::new(f.dir.path()).unwrap().protecting(&own);
    }
    f
}

async fn reads(f: &Fixture) -> Vec<(String, keel_tools::ToolResult)> {
    let abs = f.path(SEAL).display().to_string();
    let mut out = Vec::new();
    for path in [
        STORE.to_owned(),
        "data/keel.db".to_owned(),
        "./.local/share/../share/keel/seal.key".to_owned(),
        abs,
        CONFIG.to_owned(),
    ] {
        let r = f.call("read_file", json!({"path": path})).await;
        out.push((path, r));
    }
    out
}

fn changes() -> Vec<(&'static str, Value)> {
    vec![
        (
            "edit_file",
            json!({"path": CONFIG, "old_string": "KEEL-CONFIG-SECRET", "new_string": "x"}),
        ),
        (
            "write_file",
            json!({"path": CONFIG, "content": "permission_mode = \"bypass\"\n"}),
        ),
        (
            "write_file",
            json!({"path": ".local/share/keel/planted", "content": "x"}),
        ),
        (
            "write_file",
            json!({"path": "data/seal.key", "content": "attacker's key"}),
        ),
    ]
}

async fn listings(f: &Fixture) -> String {
    let mut out = String::new();
    for (tool, args) in [
        ("list_dir", json!({"path": ".local/share"})),
        ("list_dir", json!({"path": ".config"})),
        ("glob", json!({"pattern": "**/*"})),
        ("grep", json!({"pattern": "KEEL-"})),
        ("grep", json!({"pattern": "KEEL-", "path": ".local"})),
    ] {
        let r = f.call(tool, args).await;
        out.push_str(&r.content);
        out.push('\n');
    }
    out
}

#[tokio::test]
async fn file_tools_refuse_keels_own_files_inside_the_workspace() {
    // Unprotected, every spelling reads a secret and every change lands.
    let open = home(false);
    for (path, r) in reads(&open).await {
        assert_eq!(r.status, Succeeded, "{path}: {}", r.content);
        assert!(r.content.contains("KEEL-"), "{path}: {}", r.content);
    }
    let listed = listings(&open).await;
    for name in ["keel/", "keel.db", "seal.key", "KEEL-STORE-SECRET"] {
        assert!(listed.contains(name), "unprotected: {name}: {listed}");
    }
    for (tool, args) in changes() {
        let r = open.call(tool, args.clone()).await;
        assert_eq!(r.status, Succeeded, "{tool} {args}: {}", r.content);
    }

    let f = home(true);
    for (path, r) in reads(&f).await {
        assert_eq!(r.status, Failed, "{path}: {}", r.content);
        assert!(!r.content.contains("KEEL-"), "{path}: {}", r.content);
        assert!(
            r.content.contains("is keel's own") && r.content.contains("do not read, write or list"),
            "{path}: {}",
            r.content
        );
    }
    for (tool, args) in changes() {
        let r = f.call(tool, args.clone()).await;
        assert_eq!(r.status, Failed, "{tool} {args}: {}", r.content);
        assert!(r.content.contains("is keel's own"), "{}", r.content);
    }
    assert_eq!(
        std::fs::read_to_string(f.path(CONFIG)).unwrap(),
        "api_key = \"KEEL-CONFIG-SECRET\"\n"
    );
    assert_eq!(
        std::fs::read_to_string(f.path(SEAL)).unwrap(),
        "KEEL-SEAL-SECRET\n"
    );
    assert!(!f.path(".local/share/keel/planted").exists());
    let r = f
        .call("list_dir", json!({"path": ".local/share/keel"}))
        .await;
    assert_eq!(r.status, Failed, "{}", r.content);
    assert!(r.content.contains("is keel's own"), "{}", r.content);

    // Listings and searches leave them out; the rest of the home directory is still there.
    let listed = listings(&f).await;
    for name in [
        "keel/",
        "keel.db",
        "seal.key",
        "keel.toml",
        "KEEL-STORE-SECRET",
        "KEEL-SEAL",
        "KEEL-CONFIG",
    ] {
        assert!(!listed.contains(name), "protected: {name}: {listed}");
    }
    assert!(
        listed.contains(".local/bin/tool") && listed.contains("KEEL-ordinary"),
        "{listed}"
    );
}
