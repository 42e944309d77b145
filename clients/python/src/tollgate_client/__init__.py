"""A Python client for tollgate, the login rate-limiter daemon: ask `check`
before verifying a password and `report` after, over its Unix socket.

    from tollgate_client import Client, ClientConfig, Subject

    client = Client(ClientConfig("/run/tollgate/tollgate.sock", password_key=key))
    subject = Subject(peer="203.0.113.9", account="alice")
    with client.attempt("login", subject, password=password) as attempt:
        if attempt.proceeds:
            attempt.report(verify(password))
"""

from .answers import Answer, FailPolicy, Rejected, Unavailable, VerdictAnswer
from .attempt import Attempt
from .client import (
    BUILTIN_FAIL_POLICIES,
    BUSY_MAX_DEFAULT,
    CALL_TIMEOUT_DEFAULT,
    POOL_CONNECTIONS_MAX,
    Client,
    ClientConfig,
)
from .errors import Busy, CallTimeout, ClientError, ConnectError, ConnectionClosed, ConnectionFailed, ProtocolError
from .forwarded import FORWARDED_FOR_BYTES_MAX, forwarded_tail
from .gcra import GcraDecision, GcraSpec
from .passwords import PASSWORD_TAG_PERSONAL, password_digest, password_tag
from .protocol import (
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_MIN,
    Abandon,
    Check,
    Decision,
    ErrorCode,
    ErrorReply,
    Outcome,
    Reason,
    Report,
    Subject,
    Verdict,
    decode_response,
    encode_request,
)

__all__ = [
    "Abandon",
    "Answer",
    "Attempt",
    "BUILTIN_FAIL_POLICIES",
    "BUSY_MAX_DEFAULT",
    "Busy",
    "CALL_TIMEOUT_DEFAULT",
    "CallTimeout",
    "Check",
    "Client",
    "ClientConfig",
    "ClientError",
    "ConnectError",
    "ConnectionClosed",
    "ConnectionFailed",
    "Decision",
    "ErrorCode",
    "ErrorReply",
    "FORWARDED_FOR_BYTES_MAX",
    "FailPolicy",
    "GcraDecision",
    "GcraSpec",
    "Outcome",
    "PASSWORD_TAG_PERSONAL",
    "POOL_CONNECTIONS_MAX",
    "PROTOCOL_VERSION",
    "PROTOCOL_VERSION_MIN",
    "ProtocolError",
    "Reason",
    "Rejected",
    "Report",
    "Subject",
    "Unavailable",
    "Verdict",
    "VerdictAnswer",
    "decode_response",
    "encode_request",
    "forwarded_tail",
    "password_digest",
    "password_tag",
]

from .aio import AsyncAttempt, AsyncClient  # noqa: E402

__all__ += ["AsyncAttempt", "AsyncClient"]
