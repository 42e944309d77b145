//! Reads any bytes as a decision log file and as bare records, as
//! `tollgate replay` does, and checks that whatever decodes re-encodes to
//! bytes that decode to it. The body lives in
//! `tollgate::fuzz_decision_log` so `tests/fuzz_replay.rs` can replay the
//! corpus on stable.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tollgate::fuzz_decision_log(data));
