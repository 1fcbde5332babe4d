//! Feeds arbitrary bytes to every decoder; the checks are in `../oracle.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../oracle.rs"]
mod oracle;

fuzz_target!(|input: &[u8]| oracle::check(input));
