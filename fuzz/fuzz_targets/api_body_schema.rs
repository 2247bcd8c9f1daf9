//! cargo-fuzz target `api_body_schema`: see `keel_fuzz` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_fuzz::api_body_schema(data));
