//! The `malformed` reply names what is wrong with a request, field by field,
//! and never falls back to bincode's own text (which would mean the walker
//! that describes refused requests and bincode disagree about them). It
//! runs on untrusted bytes: valid requests of every kind, truncated or with
//! a byte changed, must get a field-named description, and never a panic.

use proptest::prelude::*;
use std::net::IpAddr;
use tollgate_client::codec::{
    decode_request, encode_request_with_extras, PayloadError, RequestExtras, FRAME_HEADER_BYTES,
};
use tollgate_client::protocol::PROTOCOL_VERSION;
use tollgate_client::protocol::{Outcome, Request, Subject};

fn opt(s: &Option<String>) -> Option<&str> {
    s.as_deref()
}

/// A request's tag, route, five optional subject fields, a password
/// digest, whether the peer is IPv6, and a number (a limit or a duration).
type RequestParts = (u8, String, [Option<String>; 5], Option<[u8; 16]>, bool, u64);

fn requests() -> impl Strategy<Value = RequestParts> {
    (
        0u8..6,
        "[a-z\u{e9}]{0,6}",
        proptest::array::uniform5(proptest::option::of("[a-z\u{e9}]{0,5}")),
        proptest::option::of(any::<[u8; 16]>()),
        any::<bool>(),
        any::<u64>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]
    #[test]
    fn mutated_requests_are_described_by_field(
        (tag, route, fields, digest, v6, n) in requests(),
        cut in any::<prop::sample::Index>(),
        flip in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        mode in 0u8..3,
    ) {
        let peer: IpAddr = if v6 { "2001:db8::1".parse().unwrap() } else { "198.51.100.7".parse().unwrap() };
        let subject = Subject {
            peer: Some(peer),
            forwarded_for: opt(&fields[0]),
            account: opt(&fields[1]),
            device: opt(&fields[2]),
            tenant: opt(&fields[3]),
            client_id: opt(&fields[4]),
        };
        let request = match tag {
            0 => Request::Check { route: &route, subject },
            1 => Request::Report { route: &route, subject, outcome: Outcome::Failure, password_digest: digest },
            2 => Request::Status,
            3 => Request::Lockouts { limit: n as u32 },
            4 => Request::Unlock { route: &route, account: opt(&fields[1]).unwrap_or(""), source: digest.map(|_| peer) },
            _ => Request::ClockAdvance { by_ms: n },
        };
        let mut frame = Vec::new();
        // A version-3 check or report ends with a password tag (here the
        // digest's bytes inverted, when there is one).
        let extras = RequestExtras { password_tag: digest.map(|d| d.map(|b| !b)) };
        encode_request_with_extras(PROTOCOL_VERSION, 7, &request, &extras, &mut frame);
        let mut payload = frame[FRAME_HEADER_BYTES..].to_vec();
        let body_len = payload.len() - 9;
        match mode {
            0 => { let at = 9 + cut.index(body_len + 1); payload.truncate(at); }
            1 => { let at = 9 + flip.index(body_len.max(1)).min(body_len.saturating_sub(1)); if body_len > 0 { payload[at] = byte; } }
            _ => { let at = 9 + flip.index(body_len.max(1)).min(body_len.saturating_sub(1)); if body_len > 0 { payload[at] = byte; } let c = 9 + cut.index(body_len + 1); payload.truncate(c); }
        }
        if let Err(f) = decode_request(&payload) {
            if let PayloadError::Malformed(why) = &f.error {
                let fallback = why.starts_with("message ends early")
                    || why == "message does not decode"
                    || why.starts_with("a string is not UTF-8")
                    || why.starts_with("boolean byte")
                    || why.starts_with("a length of")
                    || why.contains("::");
                prop_assert!(!fallback, "walker fell back to bincode's text: {why} for {:02x?}", &payload[9..]);
            }
        }
    }
}
