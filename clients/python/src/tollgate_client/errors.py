"""Why the daemon could not answer: each carries the `kind` the conformance
runner and logs name (`connect`, `timeout`, `busy`, `io`, `protocol`)."""


class ClientError(Exception):
    kind = "io"


class ConnectError(ClientError):
    """The socket cannot be reached (no such file, nobody listening, no
    permission), and only that. Any other failure to get or connect a
    socket (a full accept queue, EMFILE, ENOBUFS) is a timeout: a late
    daemon, so an exhausted auth server does not make login fail open."""

    kind = "connect"


class ConnectionFailed(ClientError):
    """The connection failed mid-call."""

    kind = "io"


class ConnectionClosed(ConnectionFailed):
    """The daemon closed the connection (an idle pooled one, or a restart)."""


class CallTimeout(ClientError):
    """No reply within the call's deadline."""

    kind = "timeout"


class Busy(ClientError):
    """A timeout taken for a busy daemon, not a lost one: from a daemon that
    has answered this client in time, in a run of timeouts younger than
    busy_max or within busy_max of an answer (in time, or late to a call
    that had timed out), for a check another check on the same account (or
    address) overlapped.
    The attempt never proceeds, whatever the fail policy: a guess let through
    because the limiter was slow is a guess with no limit at all."""

    kind = "busy"


class ProtocolError(ClientError):
    """A reply that is not a valid Verdict or Error for the request."""

    kind = "protocol"
