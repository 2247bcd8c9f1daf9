//! Release validation (issue 18): the failure scenarios, each a module whose first doc comment
//! states its invariant, each test run on SQLite and PostgreSQL, so every test path reads
//! `release_validation::<scenario>::<backend>::<test>`. Each module's header names the guarded
//! mechanism its assertions depend on (they count exactly, so the scenario fails with that
//! mechanism off). Run: `cargo test -p keel --test main release_validation::`.

/// Generates `sqlite::<name>` and `postgres::<name>` tests from `async fn <name>(Backend)`
/// functions of the scenario module it is used in.
macro_rules! per_backend {
    ($($name:ident),+ $(,)?) => {
        /// The scenario on SQLite.
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(keel_testkit::db::Backend::Sqlite).await
                }
            )+
        }
        /// The scenario on PostgreSQL (`KEEL_TEST_DATABASE_URL`, a fresh schema per test).
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(keel_testkit::db::Backend::Postgres).await
                }
            )+
        }
    };
}

mod harness;
#[allow(dead_code)]
// shared by several scenarios; Dispatch keeps each call and its time for failure messages
mod rig;

mod approved_arguments;
mod budget_exhaustion;
mod cancellation_race;
mod crash_after_effect;
mod duplicate_delivery;
mod poisoned_result;
mod provider_fallback;
mod queue_overload;
mod replay;
mod schema_migration;
mod stale_write;
mod tenant_isolation;
