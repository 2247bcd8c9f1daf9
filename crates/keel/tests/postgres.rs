//! `--store postgres://…`: the same run, resume and session commands on the shared store. Uses
//! `KEEL_TEST_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) with a fresh
//! schema, dropped afterwards.

use crate::common::{Env, check_stream, jsonl_lines, stderr, stdout};

/// A fresh schema, dropped on drop.
pub(crate) struct Schema {
    base: String,
    name: String,
}

impl Schema {
    pub(crate) fn new() -> Self {
        Self::on(
            &std::env::var("KEEL_TEST_DATABASE_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
        )
    }

    /// A fresh schema in the database at `base` (a URL without `keel_schema`).
    pub(crate) fn on(base: &str) -> Self {
        let name = format!("keel_cli_{}", uuid::Uuid::now_v7().simple());
        Schema {
            base: base.to_owned(),
            name,
        }
    }

    pub(crate) fn url(&self) -> String {
        let sep = if self.base.contains('?') { '&' } else { '?' };
        format!("{}{sep}keel_schema={}", self.base, self.name)
    }

    /// A small pool on the database whose connections work in this schema (`search_path`),
    /// for tests that read or change the store's rows directly.
    pub(crate) async fn pool(&self) -> sqlx::PgPool {
        use std::str::FromStr;
        let options = sqlx::postgres::PgConnectOptions::from_str(&self.base)
            .unwrap()
            .options([("search_path", self.name.as_str())]);
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .unwrap()
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let (base, name) = (self.base.clone(), self.name.clone());
        // Its own runtime on its own thread: a drop may run inside a test's runtime.
        let _ = std::thread::spawn(move || {
            use sqlx::{Connection, Executor};
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(mut c) = sqlx::PgConnection::connect(&base).await {
                    let _ = c
                        .execute(format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE").as_str())
                        .await;
                    let _ = c.close().await;
                }
            });
        })
        .join();
    }
}

#[test]
fn run_and_resume_on_postgres() {
    let schema = Schema::new();
    let env = Env::new();
    env.write(
        "script.jsonl",
        "{\"tool_calls\":[{\"name\":\"write_file\",\"arguments\":{\"path\":\"pg.txt\",\"content\":\"pg\"}}]}\n{\"text\":\"stored in postgres\"}\n",
    );
    let url = schema.url();
    let out = env.run(&[
        "run",
        "--store",
        &url,
        "--workspace",
        "ws",
        "--model",
        "script:script.jsonl",
        "--output",
        "jsonl",
        "write it",
    ]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(
        result["terminal_reason"],
        "requires_action",
        "{result} {}",
        stderr(&out)
    );
    let session = result["session_id"].as_str().unwrap().to_owned();
    let approval = result["pending"][0]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = env.run(&["approve", "--store", &url, &approval]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = env.run(&["resume", "--store", &url, &session, "--output", "jsonl"]);
    let result = check_stream(&jsonl_lines(&out.stdout));
    assert_eq!(result["terminal_reason"], "completed", "{result}");
    assert_eq!(
        std::fs::read_to_string(env.ws().join("pg.txt")).unwrap(),
        "pg"
    );
    let list = stdout(&env.run(&["sessions", "list", "--store", &url]));
    assert!(list.contains(&session), "{list}");
    // The default SQLite store knows nothing of it.
    let out = env.run(&["sessions", "show", &session]);
    assert_eq!(out.status.code(), Some(1));
}
