"""The wire protocol's messages that an auth server sends and reads
(PROTOCOL.md sections 2 to 7): Check, Report and Abandon requests, Verdict
and Error responses, in versions 1 to 5."""

import enum
import ipaddress
import struct
from dataclasses import dataclass
from typing import Optional, Tuple, Union

from .errors import ProtocolError

PROTOCOL_VERSION = 5
PROTOCOL_VERSION_MIN = 1
# Version 3 added the password tag after a Check's or Report's message.
SIGNALS_VERSION = 3
ABANDON_VERSION = 5
RESPONSE_PAYLOAD_BYTES_MAX = 8 * 1024 * 1024
# The daemon's limits (PROTOCOL.md sections 1 and 3). The client refuses a
# request over them itself: the daemon would answer `frame_too_large` and
# close while a big frame is still being written, the write would fail, and
# a login would fail open on the broken pipe.
REQUEST_PAYLOAD_BYTES_MAX = 16 * 1024
IDENTIFIER_BYTES_MAX = 512
IDENTIFIER_FIELDS = ("account", "device", "tenant", "client_id")
ENVELOPE_BYTES = 9
PASSWORD_DIGEST_BYTES = 16

IpAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]


class _Named(enum.IntEnum):
    @property
    def label(self) -> str:
        """The name PROTOCOL.md section 7 and `--json` output use."""
        return self.name.lower()


class Outcome(_Named):
    SUCCESS = 0
    FAILURE = 1


class Decision(_Named):
    ALLOW = 0
    DELAY = 1
    CHALLENGE = 2
    DENY = 3


class Reason(_Named):
    ALLOWED = 0
    RATE_LIMITED = 1
    TOO_MANY_FAILURES = 2
    MONITOR_RATE_LIMITED = 3
    MONITOR_TOO_MANY_FAILURES = 4
    SPRAY_SUSPECTED = 5
    DISTRIBUTED_ATTACK = 6
    TENANT_ANOMALY = 7
    MONITOR_SIGNAL = 8
    ATTEMPTS_IN_FLIGHT = 9


class ErrorCode(_Named):
    MALFORMED = 0
    UNSUPPORTED_VERSION = 1
    UNKNOWN_ROUTE = 2
    MISSING_FIELD = 3
    FIELD_TOO_LONG = 4
    PERMISSION_DENIED = 5
    NOT_MANUAL_CLOCK = 6
    FRAME_TOO_LARGE = 7
    INTERNAL = 8


class RequestKind(enum.IntEnum):
    CHECK = 0
    REPORT = 1
    ABANDON = 8


class ResponseKind(enum.IntEnum):
    VERDICT = 0
    ERROR = 5


FLAG_DEGRADED = 0x01


@dataclass(frozen=True)
class Subject:
    """Who is attempting; every field optional. `peer` takes an address or
    its text form, kept as an address (a bad one fails here, at the caller)."""

    peer: Union[IpAddress, str, None] = None
    forwarded_for: Optional[str] = None
    account: Optional[str] = None
    device: Optional[str] = None
    tenant: Optional[str] = None
    client_id: Optional[str] = None

    def __post_init__(self) -> None:
        if self.peer is not None and not isinstance(self.peer, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
            object.__setattr__(self, "peer", ipaddress.ip_address(self.peer))


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    retry_after_ms: int
    delay_ms: int
    limit: int
    remaining: int
    reset_ms: int
    reason: Reason
    rule: str
    # Version 2 and later; 0 from a version-1 daemon. Only bit 0 means anything.
    flags: int = 0

    @property
    def degraded(self) -> bool:
        return bool(self.flags & FLAG_DEGRADED)

    @property
    def proceeds(self) -> bool:
        return self.decision in (Decision.ALLOW, Decision.DELAY)


@dataclass(frozen=True)
class ErrorReply:
    code: ErrorCode
    message: str


@dataclass(frozen=True)
class Check:
    route: str
    subject: Subject
    password_tag: Optional[bytes] = None


@dataclass(frozen=True)
class Report:
    route: str
    subject: Subject
    outcome: Outcome
    password_digest: Optional[bytes] = None
    password_tag: Optional[bytes] = None


@dataclass(frozen=True)
class Abandon:
    route: str
    subject: Subject


Request = Union[Check, Report, Abandon]
Response = Union[Verdict, ErrorReply]


def _utf8(text: str) -> bytes:
    # surrogatepass: a lone surrogate (from a surrogateescape'd header) goes
    # out as invalid UTF-8 and the daemon refuses it as malformed, a refusal
    # the caller sees as an answer rather than an exception mid-login.
    return text.encode("utf-8", "surrogatepass")


def _string(text: str) -> bytes:
    raw = _utf8(text)
    return struct.pack("<Q", len(raw)) + raw


def _optional_string(text: Optional[str]) -> bytes:
    return b"\x00" if text is None else b"\x01" + _string(text)


def _optional_digest(value: Optional[bytes], field: str) -> bytes:
    if value is None:
        return b"\x00"
    if len(value) != PASSWORD_DIGEST_BYTES:
        raise ValueError("{} must be {} bytes, not {}".format(field, PASSWORD_DIGEST_BYTES, len(value)))
    return b"\x01" + bytes(value)


def _subject(subject: Subject) -> bytes:
    peer = subject.peer
    if isinstance(peer, str):
        peer = ipaddress.ip_address(peer)
    if peer is None:
        encoded = b"\x00"
    elif isinstance(peer, ipaddress.IPv4Address):
        encoded = b"\x01" + struct.pack("<I", 0) + peer.packed
    else:
        encoded = b"\x01" + struct.pack("<I", 1) + peer.packed
    return (
        encoded
        + _optional_string(subject.forwarded_for)
        + _optional_string(subject.account)
        + _optional_string(subject.device)
        + _optional_string(subject.tenant)
        + _optional_string(subject.client_id)
    )


def encode_request(version: int, request_id: int, request: Request) -> bytes:
    """One whole frame, length prefix included, in `version`. Below version 3
    a password tag has no room and is dropped; an Abandon is encoded in any
    version (a daemon older than 5 answers it `malformed`, as it does the
    Rust client's)."""
    if not PROTOCOL_VERSION_MIN <= version <= PROTOCOL_VERSION:
        raise ValueError("protocol version {} is not 1 to {}".format(version, PROTOCOL_VERSION))
    tagged = version >= SIGNALS_VERSION
    if isinstance(request, Check):
        body = struct.pack("<I", RequestKind.CHECK) + _string(request.route) + _subject(request.subject)
        if tagged:
            body += _optional_digest(request.password_tag, "password_tag")
    elif isinstance(request, Report):
        body = (
            struct.pack("<I", RequestKind.REPORT)
            + _string(request.route)
            + _subject(request.subject)
            + struct.pack("<I", Outcome(request.outcome))
            + _optional_digest(request.password_digest, "password_digest")
        )
        if tagged:
            body += _optional_digest(request.password_tag, "password_tag")
    elif isinstance(request, Abandon):
        body = struct.pack("<I", RequestKind.ABANDON) + _string(request.route) + _subject(request.subject)
    else:
        raise TypeError("not a request this client sends: {!r}".format(request))
    payload = struct.pack("<BQ", version, request_id) + body
    return struct.pack("<I", len(payload)) + payload


def refusal_before_sending(version: int, request: Request) -> Optional[ErrorReply]:
    """The daemon's refusal of `request`, made here without sending it: an
    identifier over 512 bytes (`field_too_long`) or a payload over 16384
    bytes in `version` (`frame_too_large`); None when it may be sent."""
    subject = request.subject
    for name in IDENTIFIER_FIELDS:
        value = getattr(subject, name)
        # Four bytes a character at most: short text needs no encoding.
        if value is None or len(value) * 4 <= IDENTIFIER_BYTES_MAX:
            continue
        size = len(_utf8(value))
        if size > IDENTIFIER_BYTES_MAX:
            message = "field `subject.{}` is {} bytes; the maximum is {} (refused before sending)".format(
                name, size, IDENTIFIER_BYTES_MAX
            )
            return ErrorReply(ErrorCode.FIELD_TOO_LONG, message)
    texts = (request.route, subject.forwarded_for, subject.account, subject.device, subject.tenant, subject.client_id)
    # Every fixed part of a request (envelope, tags, lengths, the address)
    # fits in 160 bytes: only a request that might be too large is encoded.
    if sum(len(text) for text in texts if text is not None) * 4 + 160 <= REQUEST_PAYLOAD_BYTES_MAX:
        return None
    size = len(encode_request(version, 0, request)) - 4
    if size > REQUEST_PAYLOAD_BYTES_MAX:
        message = "request of {} bytes; the maximum is {} (refused before sending)".format(
            size, REQUEST_PAYLOAD_BYTES_MAX
        )
        return ErrorReply(ErrorCode.FRAME_TOO_LARGE, message)
    return None


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int, what: str) -> bytes:
        if len(self.data) - self.at < n:
            raise ProtocolError("reply ends inside {}".format(what))
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u32(self, what: str) -> int:
        return int(struct.unpack("<I", self.take(4, what))[0])

    def u64(self, what: str) -> int:
        return int(struct.unpack("<Q", self.take(8, what))[0])

    def string(self, what: str) -> str:
        raw = self.take(self.u64(what + " length"), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("{} is not valid UTF-8".format(what)) from None

    def enum(self, kind: type, what: str):  # type: ignore[no-untyped-def]
        value = self.u32(what)
        try:
            return kind(value)
        except ValueError:
            raise ProtocolError("unknown {} {}".format(what, value)) from None


def decode_response(payload: bytes) -> Tuple[int, int, Response]:
    """A reply payload (without its length prefix) as (version, id,
    Verdict or ErrorReply), using every byte. Anything else, including the
    admin responses this client never asks for, is a ProtocolError."""
    if len(payload) < ENVELOPE_BYTES:
        raise ProtocolError("reply of {} bytes is shorter than the envelope".format(len(payload)))
    version, reply_id = struct.unpack_from("<BQ", payload)
    if not PROTOCOL_VERSION_MIN <= version <= PROTOCOL_VERSION:
        raise ProtocolError("reply in unknown protocol version {}".format(version))
    reader = _Reader(payload)
    reader.at = ENVELOPE_BYTES
    kind = reader.u32("response variant")
    response: Response
    if kind == ResponseKind.VERDICT:
        decision = reader.enum(Decision, "decision")
        retry_after_ms = reader.u64("retry_after_ms")
        delay_ms = reader.u64("delay_ms")
        limit = reader.u32("limit")
        remaining = reader.u32("remaining")
        reset_ms = reader.u64("reset_ms")
        reason = reader.enum(Reason, "reason")
        rule = reader.string("rule")
        flags = reader.u8("flags") if version >= 2 else 0
        response = Verdict(decision, retry_after_ms, delay_ms, limit, remaining, reset_ms, reason, rule, flags)
    elif kind == ResponseKind.ERROR:
        # Every version's Error is version 1's message, with no extras.
        response = ErrorReply(reader.enum(ErrorCode, "error code"), reader.string("error message"))
    else:
        raise ProtocolError("unexpected response variant {} (not a Verdict or Error)".format(kind))
    if reader.at != len(payload):
        raise ProtocolError("{} bytes left over after the reply".format(len(payload) - reader.at))
    return version, reply_id, response
