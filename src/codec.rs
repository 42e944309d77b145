//! Frames: a 4-byte little-endian payload length, then the payload: one
//! version byte, the request id (u64 LE), and the bincode-2 message (fixed-
//! width little-endian integers). See PROTOCOL.md.
//!
//! Pure: no tokio, no I/O. "Need more bytes" (`Ok(None)`) and "malformed"
//! (`Err`) are different results, and a length over the maximum is refused
//! from the 4-byte header, before anything is allocated.

use bincode::config::{self, Configuration, Fixint, LittleEndian, NoLimit};

use crate::protocol::{Request, Response, PROTOCOL_VERSION};

/// Bytes of the length prefix.
pub const FRAME_HEADER_BYTES: usize = 4;
/// Largest request payload the daemon reads. A check is ~100 bytes; this
/// leaves room for a long X-Forwarded-For chain and every identifier at its
/// maximum, while a hostile prefix cannot make the daemon buffer more.
pub const REQUEST_PAYLOAD_BYTES_MAX: usize = 16 * 1024;
/// Largest response payload a client reads (status and lockout listings).
pub const RESPONSE_PAYLOAD_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Version byte plus request id.
pub const ENVELOPE_BYTES: usize = 1 + 8;

const _: () = assert!(REQUEST_PAYLOAD_BYTES_MAX <= RESPONSE_PAYLOAD_BYTES_MAX);

type WireConfig = Configuration<LittleEndian, Fixint, NoLimit>;

/// bincode 2 with fixed-width little-endian integers: every integer has the
/// width of its type, so a client in any language can be written from
/// PROTOCOL.md without a varint decoder.
pub const WIRE: WireConfig = config::standard().with_little_endian().with_fixed_int_encoding();

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame payload of {len} bytes is over the maximum of {max}")]
    TooLarge { len: usize, max: usize },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PayloadError {
    #[error("payload is shorter than its envelope ({0} bytes)")]
    Truncated(usize),
    #[error("protocol version {found} is not supported (this daemon speaks {PROTOCOL_VERSION})")]
    UnsupportedVersion { found: u8 },
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
}

/// A payload that did not decode, with its request id when the envelope
/// was readable, so the error reply can still name the request.
#[derive(Debug, PartialEq, Eq)]
pub struct DecodeFailure {
    pub id: Option<u64>,
    pub error: PayloadError,
}

fn failure(id: Option<u64>, error: PayloadError) -> DecodeFailure {
    DecodeFailure { id, error }
}

/// Finds the first complete frame in `buf`: returns the payload's byte range
/// end (`FRAME_HEADER_BYTES + len`), or `None` if more bytes are needed.
pub fn frame_len(buf: &[u8], payload_max: usize) -> Result<Option<usize>, FrameError> {
    let Some(header) = buf.first_chunk::<FRAME_HEADER_BYTES>() else {
        return Ok(None);
    };
    let len = u32::from_le_bytes(*header) as usize;
    if len > payload_max {
        return Err(FrameError::TooLarge { len, max: payload_max });
    }
    let end = FRAME_HEADER_BYTES + len;
    Ok((buf.len() >= end).then_some(end))
}

/// Splits a payload into (id, message bytes). The id is readable even when
/// the message is not, so a malformed request still gets a matching reply.
pub fn open_envelope(payload: &[u8]) -> Result<(u64, &[u8]), DecodeFailure> {
    if payload.len() < ENVELOPE_BYTES {
        return Err(failure(None, PayloadError::Truncated(payload.len())));
    }
    let id = u64::from_le_bytes(payload[1..9].try_into().expect("8 bytes"));
    if payload[0] != PROTOCOL_VERSION {
        return Err(failure(Some(id), PayloadError::UnsupportedVersion { found: payload[0] }));
    }
    Ok((id, &payload[ENVELOPE_BYTES..]))
}

/// Decodes a request payload; borrows its strings from `payload`.
pub fn decode_request(payload: &[u8]) -> Result<(u64, Request<'_>), DecodeFailure> {
    let (id, body) = open_envelope(payload)?;
    let (request, used) = bincode::borrow_decode_from_slice::<Request<'_>, _>(body, WIRE)
        .map_err(|e| failure(Some(id), PayloadError::Malformed(e.to_string())))?;
    if used != body.len() {
        return Err(failure(Some(id), PayloadError::TrailingBytes(body.len() - used)));
    }
    Ok((id, request))
}

/// Decodes a response payload into owned values (client side).
pub fn decode_response(payload: &[u8]) -> Result<(u64, Response<'static>), DecodeFailure> {
    let (id, body) = open_envelope(payload)?;
    let (response, used) =
        bincode::decode_from_slice::<Response<'static>, _>(body, WIRE.with_limit::<RESPONSE_PAYLOAD_BYTES_MAX>())
            .map_err(|e| failure(Some(id), PayloadError::Malformed(e.to_string())))?;
    if used != body.len() {
        return Err(failure(Some(id), PayloadError::TrailingBytes(body.len() - used)));
    }
    Ok((id, response))
}

/// Decodes a response payload borrowing its strings from `payload` (the
/// load generator: no allocation per reply).
pub fn decode_response_borrowed(payload: &[u8]) -> Result<(u64, Response<'_>), DecodeFailure> {
    let (id, body) = open_envelope(payload)?;
    let (response, used) =
        bincode::borrow_decode_from_slice::<Response<'_>, _>(body, WIRE.with_limit::<RESPONSE_PAYLOAD_BYTES_MAX>())
            .map_err(|e| failure(Some(id), PayloadError::Malformed(e.to_string())))?;
    if used != body.len() {
        return Err(failure(Some(id), PayloadError::TrailingBytes(body.len() - used)));
    }
    Ok((id, response))
}

fn encode_frame<T: bincode::Encode>(id: u64, message: &T, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
    out.push(PROTOCOL_VERSION);
    out.extend_from_slice(&id.to_le_bytes());
    bincode::encode_into_std_write(message, out, WIRE).expect("encoding into a Vec cannot fail");
    let len = (out.len() - start - FRAME_HEADER_BYTES) as u32;
    out[start..start + FRAME_HEADER_BYTES].copy_from_slice(&len.to_le_bytes());
}

/// Appends one request frame to `out`.
pub fn encode_request(id: u64, request: &Request<'_>, out: &mut Vec<u8>) {
    encode_frame(id, request, out)
}

/// Appends one response frame to `out`.
pub fn encode_response(id: u64, response: &Response<'_>, out: &mut Vec<u8>) {
    encode_frame(id, response, out)
}

/// The fuzz target's body, shared with the corpus-replay test: decode every
/// frame in `data` as the server would, re-encode what decodes, and check it
/// round-trips. Must never panic.
pub fn fuzz_request_frames(data: &[u8]) {
    let mut rest = data;
    while let Ok(Some(end)) = frame_len(rest, REQUEST_PAYLOAD_BYTES_MAX) {
        let payload = &rest[FRAME_HEADER_BYTES..end];
        if let Ok((id, request)) = decode_request(payload) {
            let mut again = Vec::new();
            encode_request(id, &request, &mut again);
            assert_eq!(&again[..], &rest[..end], "a decoded request re-encodes to its bytes");
        }
        rest = &rest[end..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Outcome, Subject};

    fn sample() -> Request<'static> {
        Request::Report {
            route: "login",
            subject: Subject {
                peer: Some("198.51.100.7".parse().unwrap()),
                forwarded_for: None,
                account: Some("alice"),
                device: None,
                tenant: None,
                client_id: None,
            },
            outcome: Outcome::Failure,
            password_digest: Some([7; 16]),
        }
    }

    #[test]
    fn request_round_trips_and_partial_frames_need_more() {
        let mut buf = Vec::new();
        encode_request(7, &sample(), &mut buf);
        for cut in 0..buf.len() {
            assert_eq!(frame_len(&buf[..cut], REQUEST_PAYLOAD_BYTES_MAX), Ok(None), "cut {cut}");
        }
        let end = frame_len(&buf, REQUEST_PAYLOAD_BYTES_MAX).unwrap().unwrap();
        assert_eq!(end, buf.len());
        let (id, request) = decode_request(&buf[FRAME_HEADER_BYTES..]).unwrap();
        assert_eq!((id, request), (7, sample()));
    }

    #[test]
    fn oversized_prefix_is_refused_from_the_header_alone() {
        let header = u32::MAX.to_le_bytes();
        assert_eq!(
            frame_len(&header, REQUEST_PAYLOAD_BYTES_MAX),
            Err(FrameError::TooLarge { len: u32::MAX as usize, max: REQUEST_PAYLOAD_BYTES_MAX })
        );
    }

    #[test]
    fn bad_payloads_are_errors_with_the_id_when_readable() {
        assert!(matches!(decode_request(&[1, 2]), Err(DecodeFailure { id: None, error: PayloadError::Truncated(2) })));
        let mut wrong_version = vec![9];
        wrong_version.extend_from_slice(&5u64.to_le_bytes());
        assert!(matches!(
            decode_request(&wrong_version),
            Err(DecodeFailure { id: Some(5), error: PayloadError::UnsupportedVersion { found: 9 } })
        ));
        let mut unknown_op = vec![PROTOCOL_VERSION];
        unknown_op.extend_from_slice(&6u64.to_le_bytes());
        unknown_op.extend_from_slice(&99u32.to_le_bytes());
        assert!(matches!(
            decode_request(&unknown_op),
            Err(DecodeFailure { id: Some(6), error: PayloadError::Malformed(_) })
        ));
        let mut trailing = Vec::new();
        encode_request(8, &Request::Status, &mut trailing);
        trailing.push(0);
        assert!(matches!(
            decode_request(&trailing[FRAME_HEADER_BYTES..]),
            Err(DecodeFailure { id: Some(8), error: PayloadError::TrailingBytes(1) })
        ));
    }
}
