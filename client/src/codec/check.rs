//! The hand-written decoder of a `Check` body. Checks are nearly every frame
//! the daemon reads, so they skip bincode's general decoder; anything this
//! reader does not recognise falls through to bincode, which then decides.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::RequestExtras;
use crate::protocol::{Request, Subject, SIGNALS_VERSION};

/// A well-formed `Check` body, read field by field; `None` for any other
/// request and for anything a `Check` should not hold (bincode then decodes
/// it and phrases the error). Checks are nearly every frame the daemon reads,
/// and bincode's decoder spent 420 instructions on one, a sixth of a check's
/// whole cost. Whatever this returns, bincode returns too: a property test
/// and the `frame_decode` fuzz target (`fuzz_request_frames`) hold it to that.
/// In version 3 the subject is followed by the password tag.
pub(super) fn decode_check(version: u8, body: &[u8]) -> Option<(Request<'_>, RequestExtras)> {
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
    let mut extras = RequestExtras::default();
    if version >= SIGNALS_VERSION {
        extras.password_tag = match body.u8()? {
            0 => None,
            1 => Some(body.array::<16>()?),
            _ => return None,
        };
    }
    body.0.is_empty().then_some((Request::Check { route, subject }, extras))
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
