//! What the client checks and trims before a byte is sent: a request the
//! daemon would refuse for its size is refused here, and an
//! X-Forwarded-For header is cut to the part the daemon reads.

use crate::codec::REQUEST_PAYLOAD_BYTES_MAX;
use crate::forwarded_tail;
use crate::protocol::{ErrorCode, ErrorReply, Request, Subject, IDENTIFIER_BYTES_MAX};

/// The subject as sent: of an X-Forwarded-For header, only the part the
/// daemon reads (`forwarded_tail`). Sent whole, a header the end
/// user made huge would overflow the frame and get the attempt refused as
/// malformed.
pub(crate) fn bounded<'a>(subject: &Subject<'a>) -> Subject<'a> {
    Subject { forwarded_for: subject.forwarded_for.map(forwarded_tail), ..subject.clone() }
}

/// A request the daemon would refuse for its size, refused here without
/// a byte sent: an identifier over `IDENTIFIER_BYTES_MAX`, or a payload
/// over `REQUEST_PAYLOAD_BYTES_MAX`. Sent, a frame larger than the socket's
/// buffer is refused and the connection closed while the client still
/// writes it: the write fails, and the route's fail policy would let a
/// padded `client_id` through a lockout on an open route.
pub(crate) fn refused_before_sending(request: &Request<'_>) -> Option<ErrorReply> {
    let (route, subject) = match request {
        Request::Check { route, subject } | Request::Report { route, subject, .. } => (*route, subject),
        Request::Abandon { route, subject } | Request::Inspect { route, subject } => (*route, subject),
        _ => return None,
    };
    let identifiers = [
        ("account", subject.account),
        ("device", subject.device),
        ("tenant", subject.tenant),
        ("client_id", subject.client_id),
    ];
    for (field, value) in identifiers {
        if let Some(len) = value.map(str::len).filter(|&len| len > IDENTIFIER_BYTES_MAX) {
            let message =
                format!("`{field}` is {len} bytes; the maximum is {IDENTIFIER_BYTES_MAX} (refused before sending)");
            return Some(ErrorReply { code: ErrorCode::FieldTooLong, message });
        }
    }
    // The largest a payload with these strings can be: the envelope, the
    // variant, each string with its length and option tag, the peer, the
    // outcome, the digest and the tag.
    let strings =
        [Some(route), subject.forwarded_for, subject.account, subject.device, subject.tenant, subject.client_id];
    let bound = 9 + 4 + 21 + 4 + 17 + 17 + strings.iter().map(|s| 9 + s.map_or(0, str::len)).sum::<usize>();
    (bound > REQUEST_PAYLOAD_BYTES_MAX).then(|| ErrorReply {
        code: ErrorCode::FrameTooLarge,
        message: format!("the request would be up to {bound} bytes; the maximum is {REQUEST_PAYLOAD_BYTES_MAX} (refused before sending)"),
    })
}
