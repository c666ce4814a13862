//! The `assembler` fuzz target: see `ipu_fuzz_support::check_assembler` for the input
//! format and the properties checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ipu_fuzz_support::check_assembler(data);
});
