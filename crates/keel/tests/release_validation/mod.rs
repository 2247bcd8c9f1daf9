//! Release validation (issue 18): each failure scenario is a module that states its invariant
//! in its first doc comment and the guarded mechanism its tests rely on; every test runs on
//! SQLite and PostgreSQL, so each test path names the scenario and the backend
//! (`release_validation::<scenario>::<backend>::<test>`). Run them all with
//! `cargo test -p keel --test main release_validation::`.

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

mod rig;

mod budget_exhaustion;
mod replay;
mod schema_migration;
