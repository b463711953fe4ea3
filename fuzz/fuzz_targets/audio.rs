//! libFuzzer on `pushdown_fuzz_targets::audio` (its property is documented there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pushdown_fuzz_targets::audio(data));
