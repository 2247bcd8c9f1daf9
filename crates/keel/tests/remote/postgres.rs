//! `keel --server` against a `keel serve` on PostgreSQL (a fresh schema of
//! `KEEL_TEST_DATABASE_URL`, dropped afterwards): the same commands, the same output and exit
//! codes as local runs on SQLite.

use super::basics::run_approve_resume_and_sessions_match_local_runs;
use super::decisions::deny_matches_local;
use crate::postgres::Schema;

#[test]
fn run_approve_resume_and_sessions_over_a_server_on_postgres_match_local_runs() {
    let schema = Schema::new();
    run_approve_resume_and_sessions_match_local_runs(Some(&schema.url()));
}

#[test]
fn deny_over_a_server_on_postgres_matches_local_deny() {
    let schema = Schema::new();
    deny_matches_local(Some(&schema.url()));
}
