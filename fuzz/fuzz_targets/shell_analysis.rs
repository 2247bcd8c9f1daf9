//! cargo-fuzz target `shell_analysis`: see `keel_fuzz` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_fuzz::shell_analysis(data));
