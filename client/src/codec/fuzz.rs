//! The body of the `frame_decode` fuzz target, kept in the library so the
//! corpus-replay test and the unit tests can run the same checks without
//! cargo-fuzz.

use super::{
    decode_check, decode_request_general, decode_request_versioned, decode_response_borrowed,
    decode_response_versioned, describe_bad_request, encode_request_with_extras, frame_len, open_envelope,
    request_version, PayloadError, FRAME_HEADER_BYTES, REQUEST_PAYLOAD_BYTES_MAX,
};

/// The fuzz target's body, shared with the corpus-replay test: decode every
/// frame in `data` as the server would, re-encode what decodes, and check it
/// round-trips. Must never panic.
pub fn fuzz_request_frames(data: &[u8]) {
    let mut rest = data;
    while let Ok(Some(end)) = frame_len(rest, REQUEST_PAYLOAD_BYTES_MAX) {
        let payload = &rest[FRAME_HEADER_BYTES..end];
        if let Ok((id, body)) = open_envelope(payload) {
            let version = payload[0];
            // The check fast path agrees with bincode wherever it answers.
            if let Some((check, extras)) = decode_check(version, body) {
                assert_eq!(
                    decode_request_general(version, id, body),
                    Ok((id, check, extras)),
                    "the check fast path is bincode's"
                );
            }
            // Every body bincode refuses is described by field.
            if decode_request_general(version, 0, body).is_err_and(|f| matches!(f.error, PayloadError::Malformed(_))) {
                assert!(describe_bad_request(version, body).is_err(), "a refused body is described");
            }
        }
        // A client reads whatever the other end sends as well: the reply
        // decoders, version 2's extras included, must not panic either.
        let _ = decode_response_versioned(payload);
        let _ = decode_response_borrowed(payload);
        if let Ok((id, request, extras)) = decode_request_versioned(payload) {
            let mut again = Vec::new();
            let version = request_version(payload).expect("a decoded payload has a version byte");
            encode_request_with_extras(version, id, &request, &extras, &mut again);
            assert_eq!(&again[..], &rest[..end], "a decoded request re-encodes to its bytes");
        }
        rest = &rest[end..];
    }
}
