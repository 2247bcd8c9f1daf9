//! cargo-fuzz target `tool_arguments`: see `keel_fuzz` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_fuzz::tool_arguments(data));
