//! The body lives in `tests/fuzz_bodies/source_parse.rs` so that
//! `tests/fuzz_replay.rs` can replay `fuzz/corpus/source_parse/` on stable; see its
//! module doc for what it checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz_bodies/bytes.rs"]
mod bytes;
#[path = "../../tests/fuzz_bodies/source_parse.rs"]
mod body;

fuzz_target!(|data: &[u8]| body::run(data));
