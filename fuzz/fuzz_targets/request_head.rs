#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| herald::fuzzing::request_head(data));
