//! The body lives in `tests/fuzz_bodies/tables_model.rs` so that
//! `tests/fuzz_replay.rs` can replay `fuzz/corpus/tables_model/` on stable; see its
//! module doc for what it checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz_bodies/bytes.rs"]
mod bytes;
#[path = "../../tests/fuzz_bodies/tables_model.rs"]
mod body;

fuzz_target!(|data: &[u8]| body::run(data));
