//! Decodes a stream of request frames as the server does and checks that
//! whatever decodes re-encodes to the same bytes. The body lives in
//! `tollgate::codec::fuzz_request_frames` so `tests/fuzz_replay.rs` can replay
//! the corpus on stable.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tollgate::codec::fuzz_request_frames(data));
