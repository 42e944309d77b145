//! Frames: a 4-byte little-endian payload length, then the payload: one
//! version byte, the request id (u64 LE), and the bincode-2 message (fixed-
//! width little-endian integers). See PROTOCOL.md.
//!
//! Versions 1 and 2 share every request's bytes; a version-2 reply is
//! version 1's message followed by what version 1 has no room for
//! (`ReplyExtras`), so a version-1 client never sees a byte it cannot read.
//! Version 3 adds a trailing password tag to `Check` and `Report`
//! (`RequestExtras`), spray detection's status after version 2's status
//! extras, and four reasons that older versions receive as the nearest
//! reason they know (`Reason::for_version`). Versions 4 to 6 each add
//! requests (and their replies) and nothing else: an older frame of a
//! newer request is malformed, naming the version it needs.
//!
//! Pure: no tokio, no I/O. "Need more bytes" (`Ok(None)`) and "malformed"
//! (`Err`) are different results, and a length over the maximum is refused
//! from the 4-byte header, before anything is allocated.

use bincode::config::{self, Configuration, Fixint, LittleEndian, NoLimit};

use crate::protocol::{
    Request, Response, SharedStatus, SignalsStatus, ABANDON_VERSION, ACTIVITY_VERSION, BAN_VERSION, INSPECT_VERSION,
    PROTOCOL_VERSION, PROTOCOL_VERSION_MIN, SIGNALS_VERSION,
};

mod bad_request;
mod check;
mod fuzz;
mod verdict;

use bad_request::describe_bad_request;
use check::decode_check;
pub use fuzz::fuzz_request_frames;
use verdict::encode_verdict;

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

/// Why a payload did not decode. The texts are sentences for people (sent
/// as a `malformed` reply's message): they name what is wrong, never a
/// decoder's internals.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PayloadError {
    #[error("payload of {0} bytes is shorter than the {ENVELOPE_BYTES}-byte envelope (version byte and request id)")]
    Truncated(usize),
    #[error(
        "protocol version {found} is not supported (this daemon speaks {PROTOCOL_VERSION_MIN} to {PROTOCOL_VERSION})"
    )]
    UnsupportedVersion { found: u8 },
    /// The message does not decode; the text says where and why.
    #[error("{0}")]
    Malformed(String),
    #[error("{0} byte(s) left over after a complete message")]
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

/// What a version-3 `Check` or `Report` carries beyond version 2's message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestExtras {
    /// The client's keyed digest of the attempted password alone, without
    /// the account (`tollgate_client::password_tag`), so the daemon can
    /// count one password failing across many accounts. `None` in versions
    /// 1 and 2, in other requests, and when the client sent none.
    pub password_tag: Option<[u8; 16]>,
}

/// What a reply carries beyond version 1's message (version 2 and later).
#[derive(Clone, Copy, Debug, Default)]
pub struct ReplyExtras<'a> {
    /// At least one global rule of this verdict was decided on this host's degraded share.
    pub degraded: bool,
    /// For a Status reply.
    pub shared: Option<&'a SharedStatus>,
    /// For a Status reply in version 3: spray detection's state.
    pub signals: Option<&'a SignalsStatus>,
}

/// A reply's extras as decoded (owned): what the client reads of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DecodedExtras {
    /// The reply's version byte.
    pub version: u8,
    /// A version-2 verdict's flag bit 0; false for version 1 and other replies.
    pub degraded: bool,
    /// A version-2 status reply's store status; `None` for version 1.
    pub shared: Option<SharedStatus>,
    /// A version-3 status reply's spray-detection status; `None` before version 3.
    pub signals: Option<SignalsStatus>,
}

/// Bit 0 of a version-2 verdict's `flags`; bits 1-7 are reserved: sent as
/// 0 and ignored, so a later version can give them a meaning without
/// breaking version-2 clients.
pub const FLAG_DEGRADED: u8 = 1;

/// The request's version byte (first payload byte), or None for an empty payload.
pub fn request_version(payload: &[u8]) -> Option<u8> {
    payload.first().copied()
}

fn is_spoken(version: u8) -> bool {
    (PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION).contains(&version)
}

/// Splits a payload into (id, message bytes). The id is readable even when
/// the message is not, so a malformed request still gets a matching reply.
/// Accepts every version spoken; `request_version` tells them apart.
pub fn open_envelope(payload: &[u8]) -> Result<(u64, &[u8]), DecodeFailure> {
    if payload.len() < ENVELOPE_BYTES {
        return Err(failure(None, PayloadError::Truncated(payload.len())));
    }
    let id = u64::from_le_bytes(payload[1..9].try_into().expect("8 bytes"));
    if !is_spoken(payload[0]) {
        return Err(failure(Some(id), PayloadError::UnsupportedVersion { found: payload[0] }));
    }
    Ok((id, &payload[ENVELOPE_BYTES..]))
}

/// Decodes a request payload; borrows its strings from `payload`. Drops a
/// version-3 request's password tag (`decode_request_versioned` keeps it).
pub fn decode_request(payload: &[u8]) -> Result<(u64, Request<'_>), DecodeFailure> {
    decode_request_versioned(payload).map(|(id, request, _)| (id, request))
}

/// Decodes a request payload of any version spoken, with what a version-3
/// `Check` or `Report` carries beyond version 2's message.
pub fn decode_request_versioned(payload: &[u8]) -> Result<(u64, Request<'_>, RequestExtras), DecodeFailure> {
    let (id, body) = open_envelope(payload)?;
    let version = payload[0];
    if let Some((check, extras)) = decode_check(version, body) {
        return Ok((id, check, extras));
    }
    decode_request_general(version, id, body)
}

/// Whether a request of `version` is followed by a password tag.
fn carries_password_tag(version: u8, request: &Request<'_>) -> bool {
    version >= SIGNALS_VERSION && matches!(request, Request::Check { .. } | Request::Report { .. })
}

pub(super) fn decode_request_general(
    version: u8,
    id: u64,
    body: &[u8],
) -> Result<(u64, Request<'_>, RequestExtras), DecodeFailure> {
    let malformed = |e: bincode::error::DecodeError| {
        let why = describe_bad_request(version, body).err().unwrap_or_else(|| plain_decode_error(&e));
        failure(Some(id), PayloadError::Malformed(why))
    };
    let (request, mut used) = bincode::borrow_decode_from_slice::<Request<'_>, _>(body, WIRE).map_err(malformed)?;
    // Versions 1 to 3 have six requests, version 4 eight, version 5 nine,
    // version 6 ten; a later one is as unknown to them as any other
    // discriminant.
    let needs = match request {
        Request::Activity { .. } => Some(("activity", ACTIVITY_VERSION)),
        Request::Samples { .. } => Some(("samples", ACTIVITY_VERSION)),
        Request::Abandon { .. } => Some(("abandon", ABANDON_VERSION)),
        Request::Inspect { .. } => Some(("inspect", INSPECT_VERSION)),
        Request::Ban { .. } => Some(("ban", BAN_VERSION)),
        Request::Unban { .. } => Some(("unban", BAN_VERSION)),
        _ => None,
    };
    if let Some((name, first)) = needs.filter(|&(_, first)| version < first) {
        return Err(failure(
            Some(id),
            PayloadError::Malformed(format!(
                "request `{name}` needs protocol version {first}; this frame is version {version}"
            )),
        ));
    }
    let mut extras = RequestExtras::default();
    if carries_password_tag(version, &request) {
        let (tag, tag_bytes) =
            bincode::decode_from_slice::<Option<[u8; 16]>, _>(&body[used..], WIRE).map_err(malformed)?;
        extras.password_tag = tag;
        used += tag_bytes;
    }
    if used != body.len() {
        return Err(failure(Some(id), PayloadError::TrailingBytes(body.len() - used)));
    }
    Ok((id, request, extras))
}

/// bincode's error in words: its own `Display` is its `Debug` text.
fn plain_decode_error(e: &bincode::error::DecodeError) -> String {
    use bincode::error::{AllowedEnumVariants, DecodeError};
    match e {
        DecodeError::UnexpectedEnd { additional } => {
            format!("message ends early: at least {additional} more bytes needed")
        }
        DecodeError::LimitExceeded => "message is longer than the limit".into(),
        DecodeError::UnexpectedVariant { type_name, allowed: AllowedEnumVariants::Range { min, max }, found } => {
            format!("unknown {type_name} tag {found} (the known tags are {min} to {max})")
        }
        DecodeError::UnexpectedVariant { type_name, found, .. } => format!("unknown {type_name} tag {found}"),
        DecodeError::Utf8 { .. } => "a string is not UTF-8".into(),
        DecodeError::InvalidBooleanValue(byte) => format!("boolean byte {byte} is not 0 (false) or 1 (true)"),
        DecodeError::OutsideUsizeRange(len) => format!("a length of {len} is too large"),
        _ => "message does not decode".into(),
    }
}

/// Decodes a response payload into owned values (client side), dropping a
/// version-2 reply's extras (`decode_response_versioned` keeps them).
pub fn decode_response(payload: &[u8]) -> Result<(u64, Response<'static>), DecodeFailure> {
    decode_response_versioned(payload).map(|(id, response, _)| (id, response))
}

/// Decodes a response payload of either version into owned values, with
/// what a version-2 reply carries beyond version 1's message.
pub fn decode_response_versioned(payload: &[u8]) -> Result<(u64, Response<'static>, DecodedExtras), DecodeFailure> {
    let (id, body) = open_envelope(payload)?;
    let (response, used) =
        bincode::decode_from_slice::<Response<'static>, _>(body, WIRE.with_limit::<RESPONSE_PAYLOAD_BYTES_MAX>())
            .map_err(|e| failure(Some(id), PayloadError::Malformed(plain_decode_error(&e))))?;
    let extras = decode_extras(payload[0], id, &response, &body[used..])?;
    Ok((id, response, extras))
}

/// Decodes a response payload borrowing its strings from `payload` (the
/// load generator: no allocation per reply). A version-2 reply's extras are
/// checked and dropped.
pub fn decode_response_borrowed(payload: &[u8]) -> Result<(u64, Response<'_>), DecodeFailure> {
    let (id, body) = open_envelope(payload)?;
    let (response, used) =
        bincode::borrow_decode_from_slice::<Response<'_>, _>(body, WIRE.with_limit::<RESPONSE_PAYLOAD_BYTES_MAX>())
            .map_err(|e| failure(Some(id), PayloadError::Malformed(plain_decode_error(&e))))?;
    decode_extras(payload[0], id, &response, &body[used..])?;
    Ok((id, response))
}

/// What follows version 1's message in a reply of `version`: nothing for
/// version 1; for version 2 and later a verdict's `flags` byte or a
/// status's `Option<SharedStatus>`, and for version 3 then a status's
/// `Option<SignalsStatus>`. Anything after that is an error, as in version
/// 1: a later version has its own version byte, so there is no reason to skip.
fn decode_extras(version: u8, id: u64, response: &Response<'_>, rest: &[u8]) -> Result<DecodedExtras, DecodeFailure> {
    let mut extras = DecodedExtras { version, ..DecodedExtras::default() };
    let used = match (version, response) {
        (1, _) => 0,
        (_, Response::Verdict(_)) => {
            let Some(&flags) = rest.first() else {
                return Err(failure(
                    Some(id),
                    PayloadError::Malformed("message ends before the verdict's flags".into()),
                ));
            };
            extras.degraded = flags & FLAG_DEGRADED != 0;
            1
        }
        (_, Response::Status(_)) => {
            let (shared, used) = bincode::decode_from_slice::<Option<SharedStatus>, _>(
                rest,
                WIRE.with_limit::<RESPONSE_PAYLOAD_BYTES_MAX>(),
            )
            .map_err(|e| failure(Some(id), PayloadError::Malformed(plain_decode_error(&e))))?;
            extras.shared = shared;
            if version < SIGNALS_VERSION {
                used
            } else {
                let (signals, signals_bytes) = bincode::decode_from_slice::<Option<SignalsStatus>, _>(
                    &rest[used..],
                    WIRE.with_limit::<RESPONSE_PAYLOAD_BYTES_MAX>(),
                )
                .map_err(|e| failure(Some(id), PayloadError::Malformed(plain_decode_error(&e))))?;
                extras.signals = signals;
                used + signals_bytes
            }
        }
        _ => 0,
    };
    if used != rest.len() {
        return Err(failure(Some(id), PayloadError::TrailingBytes(rest.len() - used)));
    }
    Ok(extras)
}

/// A frame of `message` followed by `extra` (a status's extras, a
/// version-3 check's or report's password tag), if any.
fn encode_frame<T: bincode::Encode, E: bincode::Encode>(
    version: u8,
    id: u64,
    message: &T,
    extra: Option<&E>,
    out: &mut Vec<u8>,
) {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
    out.push(version);
    out.extend_from_slice(&id.to_le_bytes());
    bincode::encode_into_std_write(message, out, WIRE).expect("encoding into a Vec cannot fail");
    if let Some(extra) = extra {
        bincode::encode_into_std_write(extra, out, WIRE).expect("encoding into a Vec cannot fail");
    }
    let len = (out.len() - start - FRAME_HEADER_BYTES) as u32;
    out[start..start + FRAME_HEADER_BYTES].copy_from_slice(&len.to_le_bytes());
}

/// No extra value after the message.
const NO_EXTRA: Option<&()> = None;

/// Appends one request frame to `out`, in `PROTOCOL_VERSION`.
pub fn encode_request(id: u64, request: &Request<'_>, out: &mut Vec<u8>) {
    encode_request_versioned(PROTOCOL_VERSION, id, request, out)
}

/// Appends one request frame in `version`, without a password tag (a
/// version-3 check or report says `None`): a client falling back for an
/// old daemon, and the vectors.
pub fn encode_request_versioned(version: u8, id: u64, request: &Request<'_>, out: &mut Vec<u8>) {
    encode_request_with_extras(version, id, request, &RequestExtras::default(), out)
}

/// Appends one request frame in `version`. Versions 1 and 2 are the same
/// bytes but for the version byte, and have no room for `extras` (dropped);
/// in version 3 a `Check` or `Report` is followed by its
/// `Option<[u8; 16]>` password tag, and every other request is version 1's.
pub fn encode_request_with_extras(
    version: u8,
    id: u64,
    request: &Request<'_>,
    extras: &RequestExtras,
    out: &mut Vec<u8>,
) {
    if carries_password_tag(version, request) {
        encode_frame(version, id, request, Some(&extras.password_tag), out)
    } else {
        encode_frame(version, id, request, NO_EXTRA, out)
    }
}

/// Appends one version-1 response frame to `out`.
pub fn encode_response(id: u64, response: &Response<'_>, out: &mut Vec<u8>) {
    encode_response_versioned(1, id, response, &ReplyExtras::default(), out)
}

/// Encodes a reply in `version` (1 to 3). Version 1 is byte-for-byte what
/// `encode_response` writes today (extras ignored). Version 2: envelope
/// version byte 2; a Verdict's message is v1's followed by one `flags: u8`
/// (bit 0 = degraded; bits 1-7 reserved, sent 0, ignored by clients); a
/// Status's message is v1's followed by a bincode `Option<SharedStatus>`;
/// every other response is v1's message unchanged. Version 3: version 2's
/// bytes, a Status's followed by an `Option<SignalsStatus>`. A verdict's
/// reason goes out as `version` can read it (`Reason::for_version`).
pub fn encode_response_versioned(
    version: u8,
    id: u64,
    response: &Response<'_>,
    extras: &ReplyExtras<'_>,
    out: &mut Vec<u8>,
) {
    debug_assert!(is_spoken(version), "replies go out in the request's version, which was checked");
    let v2 = version >= 2;
    match response {
        Response::Verdict(verdict) => {
            let flags = v2.then_some(if extras.degraded { FLAG_DEGRADED } else { 0 });
            encode_verdict(version, id, verdict, flags, out)
        }
        Response::Status(_) if version >= SIGNALS_VERSION => {
            encode_frame(version, id, response, Some(&(extras.shared, extras.signals)), out)
        }
        Response::Status(_) if v2 => encode_frame(version, id, response, Some(&extras.shared), out),
        // The operator's view lists refusals with their reasons: a version-4
        // client reads the reasons version 5 added as the nearest it knows.
        Response::Activity(activity)
            if activity.recent_refusals.iter().any(|r| r.reason.for_version(version) != r.reason) =>
        {
            let mut older = activity.clone();
            for refusal in &mut older.recent_refusals {
                refusal.reason = refusal.reason.for_version(version);
            }
            encode_frame(version, id, &Response::Activity(older), NO_EXTRA, out)
        }
        other => encode_frame(version, id, other, NO_EXTRA, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Decision, Outcome, Reason, Subject, Verdict};
    use proptest::prelude::*;
    use std::net::IpAddr;

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

    #[test]
    fn every_reason_is_listed_in_wire_order() {
        for (i, reason) in Reason::ALL.iter().enumerate() {
            assert_eq!(*reason as usize, i);
        }
        let past = (Reason::ALL.len() as u32).to_le_bytes();
        assert!(bincode::decode_from_slice::<Reason, _>(&past, WIRE).is_err(), "a reason ALL leaves out");
    }

    fn reason(i: u8) -> Reason {
        Reason::ALL[i as usize % Reason::ALL.len()]
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
    fn assert_check_decoders_agree(version: u8, id: u64, body: &[u8]) -> Result<(), TestCaseError> {
        let general = decode_request_general(version, id, body);
        match decode_check(version, body) {
            Some((check, extras)) => prop_assert_eq!(general, Ok((id, check, extras))),
            None => prop_assert!(!matches!(general, Ok((_, Request::Check { .. }, _))), "{:?}", general),
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn check_fast_path_reads_every_check_as_bincode_does(
            id: u64, (route, peer, fields) in check_request(), at: usize, byte: u8, cut: usize,
            version in PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION, password_tag: Option<[u8; 16]>,
        ) {
            let [forwarded_for, account, device, tenant, client_id] = fields.each_ref().map(|f| f.as_deref());
            let subject = Subject { peer, forwarded_for, account, device, tenant, client_id };
            let request = Request::Check { route: &route, subject };
            let mut frame = Vec::new();
            encode_request_with_extras(version, id, &request, &RequestExtras { password_tag }, &mut frame);
            let body = &frame[FRAME_HEADER_BYTES + ENVELOPE_BYTES..];
            // The tag goes only where there is room for it: version 3.
            let password_tag = password_tag.filter(|_| version >= SIGNALS_VERSION);
            prop_assert_eq!(decode_check(version, body), Some((request.clone(), RequestExtras { password_tag })));
            // Damaged copies: a byte changed, the end cut off, a byte too many.
            let mut changed = body.to_vec();
            changed[at % body.len()] = byte;
            assert_check_decoders_agree(version, id, &changed)?;
            assert_check_decoders_agree(version, id, &body[..cut % body.len()])?;
            let mut longer = body.to_vec();
            longer.push(byte);
            assert_check_decoders_agree(version, id, &longer)?;
        }

        #[test]
        fn check_fast_path_agrees_with_bincode_on_any_bytes(
            id: u64, body in proptest::collection::vec(any::<u8>(), 0..64),
            version in PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION,
        ) {
            assert_check_decoders_agree(version, id, &body)?;
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
            // Version 1 has no room for the newer reasons: bincode's frame
            // of the reason version 1 is sent.
            let read_in_v1 = Verdict { reason: verdict.reason.for_version(1), ..verdict.clone() };
            let response = Response::Verdict(verdict);
            let at = before.len();
            let (mut fast, mut general) = (before.clone(), before);
            encode_response(id, &response, &mut fast);
            encode_frame(1, id, &Response::Verdict(read_in_v1.clone()), NO_EXTRA, &mut general);
            prop_assert_eq!(&fast, &general);
            prop_assert_eq!(
                decode_response(&fast[at + FRAME_HEADER_BYTES..]),
                Ok((id, Response::Verdict(read_in_v1.into_owned())))
            );
            // The newest version sends every reason as it is, then the flags byte.
            let (mut fast, mut general) = (Vec::new(), Vec::new());
            encode_response_versioned(PROTOCOL_VERSION, id, &response, &ReplyExtras::default(), &mut fast);
            encode_frame(PROTOCOL_VERSION, id, &response, Some(&0u8), &mut general);
            prop_assert_eq!(&fast, &general);
            prop_assert_eq!(decode_response(&fast[FRAME_HEADER_BYTES..]), Ok((id, response.into_owned())));
        }
    }

    /// The `malformed` text for a request body (after the envelope).
    fn why(body: &[u8]) -> String {
        let mut payload = vec![PROTOCOL_VERSION];
        payload.extend_from_slice(&3u64.to_le_bytes());
        payload.extend_from_slice(body);
        match decode_request(&payload) {
            Err(DecodeFailure { id: Some(3), error: PayloadError::Malformed(why) }) => why,
            other => panic!("not malformed: {other:?}"),
        }
    }

    /// A body from pieces: u32s, u64 lengths and raw bytes, in order.
    fn body(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn malformed_requests_are_described_in_plain_words_by_field() {
        let s = |text: &str| {
            let mut out = (text.len() as u64).to_le_bytes().to_vec();
            out.extend_from_slice(text.as_bytes());
            out
        };
        let login = s("login");
        let v4 = [&[1u8][..], &0u32.to_le_bytes(), &[198, 51, 100, 7]].concat();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "message ends inside the request tag: 4 bytes needed, 0 left"),
            (42u32.to_le_bytes().to_vec(), "unknown request tag 42 (the known tags are 0 to 11)"),
            (body(&[&10u32.to_le_bytes(), &v4[1..]]), "message ends inside field `prefix_len`: 1 bytes needed, 0 left"),
            (body(&[&6u32.to_le_bytes(), &[1, 0]]), "message ends inside field `limit`: 4 bytes needed, 2 left"),
            (
                body(&[&0u32.to_le_bytes(), &2u64.to_le_bytes(), &[0xff, 0xfe]]),
                "string not UTF-8 in field `route` (at byte 0 of it)",
            ),
            (
                body(&[&0u32.to_le_bytes(), &login, &v4, &[0, 1], &2u64.to_le_bytes(), b"a\xc3"]),
                "string not UTF-8 in field `subject.account` (at byte 1 of it)",
            ),
            (
                body(&[&0u32.to_le_bytes(), &login, &v4, &[0, 1], &5u64.to_le_bytes(), b"al"]),
                "field `subject.account` claims 5 bytes, but only 2 are left",
            ),
            (
                body(&[&0u32.to_le_bytes(), &login, &v4, &[0, 0, 7]]),
                "option tag 7 in field `subject.device` is not 0 (none) or 1 (some)",
            ),
            (
                body(&[&0u32.to_le_bytes(), &login, &[1], &9u32.to_le_bytes()]),
                "address family 9 in field `subject.peer` is not 0 (IPv4) or 1 (IPv6)",
            ),
            (
                body(&[&0u32.to_le_bytes(), &login, &v4[..3]]),
                "message ends inside the address family of field `subject.peer`: 4 bytes needed, 2 left",
            ),
            (
                body(&[&1u32.to_le_bytes(), &login, &v4, &[0, 0, 0, 0, 0], &2u32.to_le_bytes(), &[0]]),
                "outcome 2 is not 0 (success) or 1 (failure)",
            ),
            (
                body(&[&1u32.to_le_bytes(), &login, &v4, &[0, 0, 0, 0, 0], &1u32.to_le_bytes(), &[1, 0, 0]]),
                "message ends inside field `password_digest`: 16 bytes needed, 2 left",
            ),
            (body(&[&5u32.to_le_bytes(), &[1, 2, 3]]), "message ends inside field `by_ms`: 8 bytes needed, 3 left"),
        ];
        for (body, expected) in cases {
            assert_eq!(why(&body), expected, "body {body:02x?}");
        }
        let mut trailing = Vec::new();
        encode_request(8, &Request::Status, &mut trailing);
        trailing.extend_from_slice(&[0, 0]);
        let failure = decode_request(&trailing[FRAME_HEADER_BYTES..]).unwrap_err();
        assert_eq!(failure.error.to_string(), "2 byte(s) left over after a complete message");
        let failure = decode_request(&[1, 2, 3]).unwrap_err();
        assert_eq!(
            failure.error.to_string(),
            "payload of 3 bytes is shorter than the 9-byte envelope (version byte and request id)"
        );
    }

    proptest! {
        /// Whatever the bytes, a refused request is described by field, in
        /// words: no decoder's Debug text (braces, quotes, `::`).
        #[test]
        fn every_malformed_request_is_described_by_field_in_words(
            tag in 0u32..7, rest in proptest::collection::vec(any::<u8>(), 0..48),
            version in PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION,
        ) {
            let mut body = tag.to_le_bytes().to_vec();
            body.extend_from_slice(&rest);
            if decode_request_general(version, 0, &body)
                .is_err_and(|f| matches!(f.error, PayloadError::Malformed(_)))
            {
                let described = describe_bad_request(version, &body);
                prop_assert!(described.is_err(), "not described: {:02x?}", body);
                let text = described.unwrap_err();
                prop_assert!(!text.contains(['{', '}', '"']) && !text.contains("::"), "{}", text);
            }
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

    fn signals_sample() -> SignalsStatus {
        use crate::protocol::{DetectorStatus, FlaggedSubject, SignalFamilyStatus};
        SignalsStatus {
            window_ms: 3_600_000,
            sub_windows: 12,
            events_total: 40,
            families: vec![SignalFamilyStatus { name: "passwords".into(), entries: 3, ..Default::default() }],
            detectors: vec![DetectorStatus {
                name: "password_spray".into(),
                mode: "monitor".into(),
                ..Default::default()
            }],
            flagged: vec![FlaggedSubject {
                detector: "password_spray".into(),
                subject: "pw:0123456789abcdef".into(),
                ..Default::default()
            }],
            ..SignalsStatus::default()
        }
    }

    fn shared_sample() -> SharedStatus {
        SharedStatus {
            url: "redis://10.0.0.5:6379/0".into(),
            state: "open".into(),
            degraded: true,
            degraded_for_ms: 1_500,
            hosts_in_force: 3,
            hosts_source: "configured".into(),
            clock_offset_us: -42,
            last_error: Some("timed out".into()),
            global_rules: vec!["login/source_failures".into()],
            ..SharedStatus::default()
        }
    }

    fn verdict_sample() -> Response<'static> {
        Response::Verdict(Verdict {
            decision: Decision::Deny,
            retry_after_ms: 1_000,
            delay_ms: 0,
            limit: 5,
            remaining: 0,
            reset_ms: 2_000,
            reason: Reason::TooManyFailures,
            rule: "source_failures".into(),
        })
    }

    /// One of every response kind.
    fn every_response() -> Vec<Response<'static>> {
        use crate::protocol::{ErrorCode, Status};
        let status: Status = bincode::decode_from_slice(&[0u8; 512], WIRE).expect("zeroes decode to a Status").0;
        vec![
            verdict_sample(),
            Response::Status(Box::new(status)),
            Response::Lockouts { lockouts: vec![], total: 3 },
            Response::Unlocked { cleared: 2 },
            Response::ClockAdvanced { now_ms: 9 },
            Response::error(ErrorCode::UnknownRoute, "unknown route `x`"),
        ]
    }

    fn payload(frame: &[u8]) -> &[u8] {
        &frame[FRAME_HEADER_BYTES..]
    }

    #[test]
    fn version_1_replies_are_the_old_bytes_whatever_the_extras() {
        let shared = shared_sample();
        for response in every_response() {
            let mut plain = Vec::new();
            encode_frame(1, 5, &response, NO_EXTRA, &mut plain);
            let signals = signals_sample();
            let full = ReplyExtras { degraded: true, shared: Some(&shared), signals: Some(&signals) };
            for extras in [ReplyExtras::default(), full] {
                let mut v1 = Vec::new();
                encode_response_versioned(1, 5, &response, &extras, &mut v1);
                assert_eq!(v1, plain, "{response:?}");
                let mut old = Vec::new();
                encode_response(5, &response, &mut old);
                assert_eq!(old, plain);
            }
            let extras = DecodedExtras { version: 1, ..DecodedExtras::default() };
            assert_eq!(decode_response_versioned(payload(&plain)), Ok((5, response.clone(), extras)));
        }
    }

    #[test]
    fn version_2_replies_round_trip_with_their_extras() {
        let shared = shared_sample();
        for response in every_response() {
            for (degraded, shared) in [(false, None), (true, None), (false, Some(&shared)), (true, Some(&shared))] {
                let mut v2 = Vec::new();
                let signals = signals_sample();
                let extras = ReplyExtras { degraded, shared, signals: Some(&signals) };
                encode_response_versioned(2, 6, &response, &extras, &mut v2);
                assert_eq!(v2[FRAME_HEADER_BYTES], 2);
                let mut v1 = Vec::new();
                encode_response(6, &response, &mut v1);
                // Version 1's message, then the extras, if this kind has any.
                let extra = match response {
                    Response::Verdict(_) => vec![u8::from(degraded)],
                    Response::Status(_) => bincode::encode_to_vec(shared, WIRE).unwrap(),
                    _ => vec![],
                };
                assert_eq!(v2[FRAME_HEADER_BYTES + 1..], [&v1[FRAME_HEADER_BYTES + 1..], &extra[..]].concat());
                let expected = DecodedExtras {
                    version: 2,
                    degraded: degraded && matches!(response, Response::Verdict(_)),
                    shared: shared.filter(|_| matches!(response, Response::Status(_))).cloned(),
                    // Version 2 has no room for it: never sent.
                    signals: None,
                };
                assert_eq!(decode_response_versioned(payload(&v2)), Ok((6, response.clone(), expected)));
                assert_eq!(decode_response_borrowed(payload(&v2)), Ok((6, response.clone())));
            }
        }
    }

    #[test]
    fn version_2_extras_that_are_short_or_followed_by_bytes_are_refused() {
        let shared = shared_sample();
        for response in every_response() {
            let mut frame = Vec::new();
            encode_response_versioned(
                2,
                7,
                &response,
                &ReplyExtras { degraded: true, shared: Some(&shared), signals: None },
                &mut frame,
            );
            let mut longer = payload(&frame).to_vec();
            longer.push(0);
            let trailing = decode_response_versioned(&longer).unwrap_err();
            assert_eq!(trailing, DecodeFailure { id: Some(7), error: PayloadError::TrailingBytes(1) }, "{response:?}");
            assert!(decode_response_borrowed(&longer).is_err());
            if matches!(response, Response::Verdict(_) | Response::Status(_)) {
                let short = &payload(&frame)[..payload(&frame).len() - 1];
                let failure = decode_response_versioned(short).unwrap_err();
                assert!(matches!(failure.error, PayloadError::Malformed(_)), "{response:?}: {failure:?}");
            }
        }
        // A version-1 verdict read as version 2 lacks its flags.
        let mut v1 = Vec::new();
        encode_response(8, &verdict_sample(), &mut v1);
        let mut relabelled = payload(&v1).to_vec();
        relabelled[0] = 2;
        assert_eq!(
            decode_response_versioned(&relabelled).unwrap_err().error.to_string(),
            "message ends before the verdict's flags"
        );
    }

    #[test]
    fn reserved_flag_bits_are_ignored() {
        let mut frame = Vec::new();
        encode_response_versioned(2, 9, &verdict_sample(), &ReplyExtras::default(), &mut frame);
        let last = frame.len() - 1;
        for (flags, degraded) in [(0xfe, false), (0xff, true), (0x02, false), (0x81, true)] {
            frame[last] = flags;
            let (_, response, extras) = decode_response_versioned(payload(&frame)).unwrap();
            assert_eq!((response, extras.degraded), (verdict_sample(), degraded), "flags {flags:#04x}");
        }
    }

    #[test]
    fn requests_decode_in_both_versions_and_the_version_is_readable() {
        for version in [1, 2] {
            let mut frame = Vec::new();
            encode_request_versioned(version, 11, &sample(), &mut frame);
            assert_eq!(request_version(payload(&frame)), Some(version));
            assert_eq!(decode_request(payload(&frame)), Ok((11, sample())));
            let check =
                Request::Check { route: "login", subject: Subject { account: Some("a"), ..Subject::default() } };
            frame.clear();
            encode_request_versioned(version, 12, &check, &mut frame);
            let (_, body) = open_envelope(payload(&frame)).unwrap();
            let untagged = Some((check.clone(), RequestExtras::default()));
            assert_eq!(decode_check(version, body), untagged, "the fast path reads version {version}");
            assert_eq!(decode_request(payload(&frame)), Ok((12, check)));
        }
        let mut frame = Vec::new();
        encode_request(13, &Request::Status, &mut frame);
        assert_eq!(request_version(payload(&frame)), Some(PROTOCOL_VERSION));
        assert_eq!(request_version(&[]), None);
        // The first version past the newest spoken, whichever that is.
        for found in [0, PROTOCOL_VERSION + 1, 255] {
            frame[FRAME_HEADER_BYTES] = found;
            let failure = decode_request(payload(&frame)).unwrap_err();
            assert_eq!(failure, DecodeFailure { id: Some(13), error: PayloadError::UnsupportedVersion { found } });
            assert_eq!(
                failure.error.to_string(),
                format!("protocol version {found} is not supported (this daemon speaks 1 to {PROTOCOL_VERSION})")
            );
        }
    }

    /// The fuzz body on version-2 traffic: requests of both versions
    /// re-encode to their own bytes, and replies go through the reply decoders.
    #[test]
    fn the_fuzz_body_takes_version_2_frames() {
        let shared = shared_sample();
        let mut data = Vec::new();
        encode_request_versioned(2, 1, &sample(), &mut data);
        encode_request_versioned(1, 2, &sample(), &mut data);
        encode_response_versioned(
            2,
            3,
            &verdict_sample(),
            &ReplyExtras { degraded: true, ..ReplyExtras::default() },
            &mut data,
        );
        let status = every_response().swap_remove(1);
        encode_response_versioned(
            2,
            4,
            &status,
            &ReplyExtras { shared: Some(&shared), ..ReplyExtras::default() },
            &mut data,
        );
        fuzz_request_frames(&data);
    }

    /// A version-3 check or report: version 2's bytes, then the tag.
    #[test]
    fn version_3_checks_and_reports_carry_a_password_tag() {
        let check = Request::Check { route: "login", subject: Subject { account: Some("a"), ..Subject::default() } };
        for request in [check, sample()] {
            for password_tag in [None, Some([9u8; 16])] {
                let extras = RequestExtras { password_tag };
                let mut v3 = Vec::new();
                encode_request_with_extras(3, 14, &request, &extras, &mut v3);
                let mut v2 = Vec::new();
                encode_request_with_extras(2, 14, &request, &extras, &mut v2);
                let tag = bincode::encode_to_vec(password_tag, WIRE).unwrap();
                assert_eq!(v3[FRAME_HEADER_BYTES + 1..], [&v2[FRAME_HEADER_BYTES + 1..], &tag[..]].concat());
                assert_eq!(decode_request_versioned(payload(&v3)), Ok((14, request.clone(), extras)));
                // Versions 1 and 2 have no room for it: dropped.
                assert_eq!(decode_request_versioned(payload(&v2)), Ok((14, request.clone(), RequestExtras::default())));
                // Without its tag, a version-3 body is short; with a byte more, long.
                let mut relabelled = payload(&v2).to_vec();
                relabelled[0] = 3;
                let failure = decode_request_versioned(&relabelled).unwrap_err();
                assert_eq!(
                    failure.error.to_string(),
                    "message ends inside the option tag of field `password_tag`: 1 bytes needed, 0 left"
                );
                let mut longer = payload(&v3).to_vec();
                longer.push(0);
                assert_eq!(decode_request_versioned(&longer).unwrap_err().error, PayloadError::TrailingBytes(1));
            }
        }
        // Every other request is version 1's bytes, tag or not.
        for request in [Request::Status, Request::Lockouts { limit: 3 }, Request::ClockAdvance { by_ms: 5 }] {
            let (mut v3, mut v1) = (Vec::new(), Vec::new());
            encode_request_with_extras(3, 15, &request, &RequestExtras { password_tag: Some([1; 16]) }, &mut v3);
            encode_request_versioned(1, 15, &request, &mut v1);
            assert_eq!(v3[FRAME_HEADER_BYTES + 1..], v1[FRAME_HEADER_BYTES + 1..]);
            assert_eq!(decode_request_versioned(payload(&v3)), Ok((15, request, RequestExtras::default())));
        }
    }

    #[test]
    fn a_bad_password_tag_is_described_by_field() {
        let mut frame = Vec::new();
        let check = Request::Check { route: "login", subject: Subject::default() };
        encode_request_with_extras(3, 3, &check, &RequestExtras { password_tag: Some([5; 16]) }, &mut frame);
        let body = &payload(&frame)[ENVELOPE_BYTES..];
        let mut bad_tag = body.to_vec();
        bad_tag[body.len() - 17] = 2;
        assert_eq!(why(&bad_tag), "option tag 2 in field `password_tag` is not 0 (none) or 1 (some)");
        assert_eq!(why(&body[..body.len() - 4]), "message ends inside field `password_tag`: 16 bytes needed, 12 left");
        let mut report = Vec::new();
        encode_request_with_extras(3, 3, &sample(), &RequestExtras { password_tag: Some([5; 16]) }, &mut report);
        let body = &payload(&report)[ENVELOPE_BYTES..];
        assert_eq!(why(&body[..body.len() - 1]), "message ends inside field `password_tag`: 16 bytes needed, 15 left");
    }

    /// Versions 1 and 2 never carry a reason their clients cannot decode.
    #[test]
    fn newer_reasons_go_to_older_versions_as_the_nearest_they_know() {
        let cases = [
            (Reason::SpraySuspected, Reason::TooManyFailures),
            (Reason::DistributedAttack, Reason::TooManyFailures),
            (Reason::TenantAnomaly, Reason::TooManyFailures),
            (Reason::MonitorSignal, Reason::MonitorTooManyFailures),
        ];
        for (reason, older) in cases {
            let Response::Verdict(deny) = verdict_sample() else { unreachable!() };
            let verdict = Response::Verdict(Verdict { reason, ..deny.clone() });
            for version in PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION {
                let sent = reason.for_version(version);
                assert_eq!(sent, if version >= 3 { reason } else { older }, "version {version}");
                let mut frame = Vec::new();
                encode_response_versioned(version, 2, &verdict, &ReplyExtras::default(), &mut frame);
                let (_, decoded, _) = decode_response_versioned(payload(&frame)).unwrap();
                assert_eq!(decoded, Response::Verdict(Verdict { reason: sent, ..deny.clone() }));
                assert!((sent as u32) < 5 || version >= 3, "version {version} got discriminant {}", sent as u32);
            }
            assert_eq!(reason.is_monitored(), older.is_monitored());
        }
        for reason in (0..5).map(reason) {
            assert_eq!(reason.for_version(1), reason);
        }
    }

    /// `attempts_in_flight` (version 5) reaches versions 1 to 4 as
    /// `too_many_failures`, in a verdict and in the operator's view alike.
    #[test]
    fn the_version_5_reason_goes_to_older_versions_as_too_many_failures() {
        let Response::Verdict(deny) = verdict_sample() else { unreachable!() };
        let refusal = crate::protocol::RecentRefusal {
            at_ms: 1,
            route: "login".into(),
            rule: "source_failures".into(),
            decision: Decision::Deny,
            reason: Reason::AttemptsInFlight,
            prefix: "198.51.100.0/24".into(),
            class: String::new(),
        };
        let activity = Response::Activity(Box::new(crate::protocol::Activity {
            recent_refusals: vec![refusal],
            ..Default::default()
        }));
        for version in PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION {
            let sent = if version >= ABANDON_VERSION { Reason::AttemptsInFlight } else { Reason::TooManyFailures };
            let verdict = Response::Verdict(Verdict { reason: Reason::AttemptsInFlight, ..deny.clone() });
            let mut frame = Vec::new();
            encode_response_versioned(version, 2, &verdict, &ReplyExtras::default(), &mut frame);
            let (_, decoded, _) = decode_response_versioned(payload(&frame)).unwrap();
            assert_eq!(decoded, Response::Verdict(Verdict { reason: sent, ..deny.clone() }), "version {version}");
            if version >= ACTIVITY_VERSION {
                let mut frame = Vec::new();
                encode_response_versioned(version, 2, &activity, &ReplyExtras::default(), &mut frame);
                let (_, decoded, _) = decode_response_versioned(payload(&frame)).unwrap();
                let Response::Activity(decoded) = decoded else { panic!("{decoded:?}") };
                assert_eq!(decoded.recent_refusals[0].reason, sent, "version {version}");
            }
        }
    }

    /// `inspect` (version 6): an older frame of it is malformed, naming
    /// version 6, in words by field when its body is bad as well; in
    /// version 6 it and its reply round-trip.
    #[test]
    fn an_inspect_needs_version_6_and_round_trips_in_it() {
        let inspect =
            Request::Inspect { route: "login", subject: Subject { account: Some("alice"), ..Subject::default() } };
        for version in PROTOCOL_VERSION_MIN..INSPECT_VERSION {
            let mut frame = Vec::new();
            encode_request_versioned(version, 4, &inspect, &mut frame);
            let failure = decode_request_versioned(payload(&frame)).unwrap_err();
            let expected = format!("request `inspect` needs protocol version 6; this frame is version {version}");
            assert_eq!((failure.id, failure.error), (Some(4), PayloadError::Malformed(expected)));
            let body = &payload(&frame)[ENVELOPE_BYTES..];
            assert!(describe_bad_request(version, body).unwrap_err().contains("unknown request tag 9"));
        }
        let mut frame = Vec::new();
        encode_request_versioned(INSPECT_VERSION, 4, &inspect, &mut frame);
        assert_eq!(decode_request_versioned(payload(&frame)), Ok((4, inspect, RequestExtras::default())));
        let body = &payload(&frame)[ENVELOPE_BYTES..];
        assert_eq!(
            why(&body[..body.len() - 2]),
            "message ends inside the option tag of field `subject.tenant`: 1 bytes needed, 0 left"
        );
        let reply = Response::Inspection(Box::new(crate::protocol::Inspection {
            now_ms: 7,
            route: "login".into(),
            rules: vec![crate::protocol::InspectedRule {
                name: "source_failures".into(),
                locked: true,
                ..Default::default()
            }],
            ..Default::default()
        }));
        let mut frame = Vec::new();
        encode_response_versioned(INSPECT_VERSION, 4, &reply, &ReplyExtras::default(), &mut frame);
        let extras = DecodedExtras { version: INSPECT_VERSION, ..DecodedExtras::default() };
        assert_eq!(decode_response_versioned(payload(&frame)), Ok((4, reply, extras)));
        fuzz_request_frames(&frame);
    }

    #[test]
    fn version_3_status_replies_carry_the_signals_after_the_shared_status() {
        let (shared, signals) = (shared_sample(), signals_sample());
        for response in every_response() {
            for (shared, signals) in
                [(None, None), (Some(&shared), None), (None, Some(&signals)), (Some(&shared), Some(&signals))]
            {
                let extras = ReplyExtras { degraded: true, shared, signals };
                let (mut v3, mut v2) = (Vec::new(), Vec::new());
                encode_response_versioned(3, 6, &response, &extras, &mut v3);
                encode_response_versioned(2, 6, &response, &extras, &mut v2);
                let extra = match response {
                    Response::Status(_) => bincode::encode_to_vec(signals, WIRE).unwrap(),
                    _ => vec![],
                };
                assert_eq!(v3[FRAME_HEADER_BYTES + 1..], [&v2[FRAME_HEADER_BYTES + 1..], &extra[..]].concat());
                let is_status = matches!(response, Response::Status(_));
                let expected = DecodedExtras {
                    version: 3,
                    degraded: matches!(response, Response::Verdict(_)),
                    shared: shared.filter(|_| is_status).cloned(),
                    signals: signals.filter(|_| is_status).cloned(),
                };
                assert_eq!(decode_response_versioned(payload(&v3)), Ok((6, response.clone(), expected)));
                assert_eq!(decode_response_borrowed(payload(&v3)), Ok((6, response.clone())));
                let mut longer = payload(&v3).to_vec();
                longer.push(0);
                assert_eq!(decode_response_versioned(&longer).unwrap_err().error, PayloadError::TrailingBytes(1));
                if is_status {
                    let short = &payload(&v3)[..payload(&v3).len() - 1];
                    assert!(matches!(decode_response_versioned(short).unwrap_err().error, PayloadError::Malformed(_)));
                }
            }
        }
    }

    /// The fuzz body on version-3 traffic: tagged and untagged checks and
    /// reports re-encode to their own bytes; replies with signals decode.
    #[test]
    fn the_fuzz_body_takes_version_3_frames() {
        let (shared, signals) = (shared_sample(), signals_sample());
        let check = Request::Check { route: "login", subject: Subject { account: Some("a"), ..Subject::default() } };
        let mut data = Vec::new();
        encode_request_with_extras(3, 1, &sample(), &RequestExtras { password_tag: Some([3; 16]) }, &mut data);
        encode_request_with_extras(3, 2, &check, &RequestExtras { password_tag: Some([4; 16]) }, &mut data);
        encode_request_versioned(3, 3, &check, &mut data);
        encode_request_versioned(3, 4, &Request::Status, &mut data);
        let spray = Response::Verdict(Verdict {
            reason: Reason::SpraySuspected,
            ..Verdict::clone(match &verdict_sample() {
                Response::Verdict(v) => v,
                _ => unreachable!(),
            })
        });
        encode_response_versioned(3, 5, &spray, &ReplyExtras::default(), &mut data);
        let status = every_response().swap_remove(1);
        let extras = ReplyExtras { degraded: false, shared: Some(&shared), signals: Some(&signals) };
        encode_response_versioned(3, 6, &status, &extras, &mut data);
        fuzz_request_frames(&data);
    }
}
