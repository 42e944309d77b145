//! The body lives in `tests/fuzz_bodies/tat_table.rs` so that
//! `tests/fuzz_replay.rs` can replay `fuzz/corpus/tat_table/` on stable; see its
//! module doc for what it checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz_bodies/bytes.rs"]
mod bytes;
#[path = "../../tests/fuzz_bodies/tat_table.rs"]
mod body;

fuzz_target!(|data: &[u8]| body::run(data));
