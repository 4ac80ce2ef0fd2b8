#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| herald::fuzzing::client_op(data));
