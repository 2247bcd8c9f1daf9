//! cargo-fuzz target `policy_rule`: see `keel_fuzz` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_fuzz::policy_rule(data));
