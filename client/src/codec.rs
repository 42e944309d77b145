//! Frames: a 4-byte little-endian payload length, then the payload: one
//! version byte, the request id (u64 LE), and the bincode-2 message (fixed-
//! width little-endian integers). See PROTOCOL.md.
//!
//! Pure: no tokio, no I/O. "Need more bytes" (`Ok(None)`) and "malformed"
//! (`Err`) are different results, and a length over the maximum is refused
//! from the 4-byte header, before anything is allocated.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bincode::config::{self, Configuration, Fixint, LittleEndian, NoLimit};

use crate::protocol::{Request, Response, Subject, Verdict, PROTOCOL_VERSION};

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
    if let Some(check) = decode_check(body) {
        return Ok((id, check));
    }
    decode_request_general(id, body)
}

fn decode_request_general(id: u64, body: &[u8]) -> Result<(u64, Request<'_>), DecodeFailure> {
    let (request, used) = bincode::borrow_decode_from_slice::<Request<'_>, _>(body, WIRE)
        .map_err(|e| failure(Some(id), PayloadError::Malformed(e.to_string())))?;
    if used != body.len() {
        return Err(failure(Some(id), PayloadError::TrailingBytes(body.len() - used)));
    }
    Ok((id, request))
}

/// A well-formed `Check` body, read field by field; `None` for any other
/// request and for anything a `Check` should not hold (bincode then decodes
/// it and phrases the error). Checks are nearly every frame the daemon reads,
/// and bincode's decoder spent 420 instructions on one, a sixth of a check's
/// whole cost. Whatever this returns, bincode returns too: a property test
/// and the `frame_decode` fuzz target (`fuzz_request_frames`) hold it to that.
fn decode_check(body: &[u8]) -> Option<Request<'_>> {
    let mut body = Reader(body);
    if body.u32()? != 0 {
        return None;
    }
    let route = body.str()?;
    let peer = match body.u8()? {
        0 => None,
        1 => Some(match body.u32()? {
            0 => IpAddr::V4(Ipv4Addr::from(body.array::<4>()?)),
            1 => IpAddr::V6(Ipv6Addr::from(body.array::<16>()?)),
            _ => return None,
        }),
        _ => return None,
    };
    let subject = Subject {
        peer,
        forwarded_for: body.optional_str()?,
        account: body.optional_str()?,
        device: body.optional_str()?,
        tenant: body.optional_str()?,
        client_id: body.optional_str()?,
    };
    body.0.is_empty().then_some(Request::Check { route, subject })
}

/// The unread rest of a message, in `WIRE`'s encoding; every read is `None`
/// when the bytes run out or do not fit.
struct Reader<'b>(&'b [u8]);

impl<'b> Reader<'b> {
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|[b]| b)
    }

    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    fn str(&mut self) -> Option<&'b str> {
        let len = usize::try_from(u64::from_le_bytes(self.array()?)).ok()?;
        if len > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(len);
        self.0 = rest;
        std::str::from_utf8(head).ok()
    }

    /// An `Option<&str>`: `Some(None)` is a decoded absent field.
    fn optional_str(&mut self) -> Option<Option<&'b str>> {
        match self.u8()? {
            0 => Some(None),
            1 => self.str().map(Some),
            _ => None,
        }
    }
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
    match response {
        Response::Verdict(verdict) => encode_verdict(id, verdict, out),
        other => encode_frame(id, other, out),
    }
}

/// A `Verdict` reply's frame, written field by field. Every check and report
/// gets one, and bincode's writer checked capacity and length at each of
/// its nine fields: 235 instructions a reply against 77 here. The bytes are
/// bincode's own, which a property test holds this to for every verdict.
fn encode_verdict(id: u64, verdict: &Verdict<'_>, out: &mut Vec<u8>) {
    // Length prefix, version, id, then the Response variant (0 = Verdict),
    // decision, retry_after_ms, delay_ms, limit, remaining, reset_ms,
    // reason and the rule's length: fixed offsets, so one stack array and
    // one copy (a copy per field called memcpy for each).
    const FIXED_BYTES: usize = FRAME_HEADER_BYTES + ENVELOPE_BYTES + 4 + 4 + 8 + 8 + 4 + 4 + 8 + 4 + 8;
    let rule = verdict.rule.as_bytes();
    let payload = FIXED_BYTES - FRAME_HEADER_BYTES + rule.len();
    let mut fixed = [0u8; FIXED_BYTES];
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        fixed[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    put(&(payload as u32).to_le_bytes());
    put(&[PROTOCOL_VERSION]);
    put(&id.to_le_bytes());
    put(&0u32.to_le_bytes());
    put(&(verdict.decision as u32).to_le_bytes());
    put(&verdict.retry_after_ms.to_le_bytes());
    put(&verdict.delay_ms.to_le_bytes());
    put(&verdict.limit.to_le_bytes());
    put(&verdict.remaining.to_le_bytes());
    put(&verdict.reset_ms.to_le_bytes());
    put(&(verdict.reason as u32).to_le_bytes());
    put(&(rule.len() as u64).to_le_bytes());
    out.reserve(FIXED_BYTES + rule.len());
    out.extend_from_slice(&fixed);
    out.extend_from_slice(rule);
}

/// The fuzz target's body, shared with the corpus-replay test: decode every
/// frame in `data` as the server would, re-encode what decodes, and check it
/// round-trips. Must never panic.
pub fn fuzz_request_frames(data: &[u8]) {
    let mut rest = data;
    while let Ok(Some(end)) = frame_len(rest, REQUEST_PAYLOAD_BYTES_MAX) {
        let payload = &rest[FRAME_HEADER_BYTES..end];
        if let Ok((id, body)) = open_envelope(payload) {
            // The check fast path agrees with bincode wherever it answers.
            if let Some(check) = decode_check(body) {
                assert_eq!(decode_request_general(id, body), Ok((id, check)), "the check fast path is bincode's");
            }
        }
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
    use crate::protocol::{Decision, Outcome, Reason, Subject};
    use proptest::prelude::*;

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

    fn decision(i: u8) -> Decision {
        [Decision::Allow, Decision::Delay, Decision::Challenge, Decision::Deny][i as usize % 4]
    }

    fn reason(i: u8) -> Reason {
        [
            Reason::Allowed,
            Reason::RateLimited,
            Reason::TooManyFailures,
            Reason::MonitorRateLimited,
            Reason::MonitorTooManyFailures,
        ][i as usize % 5]
    }

    fn check_request() -> impl Strategy<Value = (String, Option<IpAddr>, [Option<String>; 5])> {
        let peer = prop_oneof![
            Just(None),
            any::<[u8; 4]>().prop_map(|a| Some(IpAddr::from(a))),
            any::<[u8; 16]>().prop_map(|a| Some(IpAddr::from(a))),
        ];
        let field = || proptest::option::of(".{0,12}");
        (".{0,12}", peer, [field(), field(), field(), field(), field()])
    }

    /// Both decoders on one body: the fast path answers exactly when bincode
    /// reads a `Check`, and then with bincode's answer.
    fn assert_check_decoders_agree(id: u64, body: &[u8]) -> Result<(), TestCaseError> {
        let general = decode_request_general(id, body);
        match decode_check(body) {
            Some(check) => prop_assert_eq!(general, Ok((id, check))),
            None => prop_assert!(!matches!(general, Ok((_, Request::Check { .. }))), "{:?}", general),
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn check_fast_path_reads_every_check_as_bincode_does(
            id: u64, (route, peer, fields) in check_request(), at: usize, byte: u8, cut: usize,
        ) {
            let [forwarded_for, account, device, tenant, client_id] = fields.each_ref().map(|f| f.as_deref());
            let subject = Subject { peer, forwarded_for, account, device, tenant, client_id };
            let request = Request::Check { route: &route, subject };
            let mut frame = Vec::new();
            encode_request(id, &request, &mut frame);
            let body = &frame[FRAME_HEADER_BYTES + ENVELOPE_BYTES..];
            prop_assert_eq!(decode_check(body), Some(request.clone()));
            // Damaged copies: a byte changed, the end cut off, a byte too many.
            let mut changed = body.to_vec();
            changed[at % body.len()] = byte;
            assert_check_decoders_agree(id, &changed)?;
            assert_check_decoders_agree(id, &body[..cut % body.len()])?;
            let mut longer = body.to_vec();
            longer.push(byte);
            assert_check_decoders_agree(id, &longer)?;
        }

        #[test]
        fn check_fast_path_agrees_with_bincode_on_any_bytes(
            id: u64, body in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            assert_check_decoders_agree(id, &body)?;
        }

        /// The hand-written verdict frame is bincode's, byte for byte.
        #[test]
        fn verdict_frames_are_bincode_frames(
            id: u64, d: u8, retry_after_ms: u64, delay_ms: u64, limit: u32, remaining: u32, reset_ms: u64, r: u8,
            rule in ".{0,40}", before in proptest::collection::vec(any::<u8>(), 0..8),
        ) {
            let verdict = Verdict {
                decision: decision(d), retry_after_ms, delay_ms, limit, remaining, reset_ms, reason: reason(r),
                rule: rule.into(),
            };
            let response = Response::Verdict(verdict);
            let at = before.len();
            let (mut fast, mut general) = (before.clone(), before);
            encode_response(id, &response, &mut fast);
            encode_frame(id, &response, &mut general);
            prop_assert_eq!(&fast, &general);
            prop_assert_eq!(decode_response(&fast[at + FRAME_HEADER_BYTES..]), Ok((id, response.into_owned())));
        }
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
