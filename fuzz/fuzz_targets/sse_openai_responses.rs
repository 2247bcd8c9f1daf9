//! cargo-fuzz target `sse_openai_responses`: see `keel_fuzz` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_fuzz::sse(keel_model::Wire::OpenaiResponses, data));
