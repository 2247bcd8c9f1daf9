//! cargo-fuzz target `sse_openai_chat`: see `keel_fuzz` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_fuzz::sse(keel_model::Wire::OpenaiChat, data));
