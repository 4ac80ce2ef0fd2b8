#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| herald::fuzzing::plugin_output(data));
