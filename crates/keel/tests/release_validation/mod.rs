//! Release validation (issue 18): the failure scenarios, each a module whose first doc comment
//! states its invariant, each test run on SQLite and PostgreSQL, so every test path reads
//! `release_validation::<scenario>::<backend>::<test>`. Each module's header names the guarded
//! mechanism its assertions depend on (they count exactly, so the scenario fails with that
//! mechanism off). Run: `cargo test -p keel --test main release_validation::`.

mod harness;

mod crash_after_effect;
mod duplicate_delivery;
mod poisoned_result;
mod provider_fallback;
mod stale_write;
mod tenant_isolation;
