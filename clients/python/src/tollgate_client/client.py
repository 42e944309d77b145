"""The client an auth server shares per process: pooled Unix-socket
connections, a per-call deadline, version fallback, and each route's fail
policy applied when the daemon cannot answer in time (`client/src/client.rs`)."""

import dataclasses
import itertools
import os
import selectors
import socket
import threading
import time
import weakref
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple, Union

from . import gcra
from .answers import Answer, FailPolicy, Rejected, Unavailable, VerdictAnswer
from .burst import BurstGuard, Bursts, BusyWindows, KnownRequesters
from .errors import Busy, CallTimeout, ClientError, ConnectError, ConnectionClosed, ConnectionFailed, ProtocolError
from .forwarded import forwarded_tail
from .passwords import PASSWORD_KEY_BYTES
from .protocol import (
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_MIN,
    RESPONSE_PAYLOAD_BYTES_MAX,
    Abandon,
    Check,
    ErrorCode,
    ErrorReply,
    Outcome,
    Report,
    Request,
    Response,
    Subject,
    decode_response,
    encode_request,
    refusal_before_sending,
)

if TYPE_CHECKING:
    from .attempt import Attempt

# Low single-digit milliseconds: a stalled daemon costs a login no more than
# a few ms before the fail policy decides.
CALL_TIMEOUT_DEFAULT = 0.005
BUSY_MAX_DEFAULT = 1.0
POOL_CONNECTIONS_MAX = 64
# Timed-out connections a client keeps open at once to hear a late reply;
# past this, one is closed at once. Each holds a descriptor, and an
# attacker who makes every call late must not run the auth server out of
# them.
LATE_LISTENERS_MAX = 16

# login and reauth protect users (open); the rest protect the system
# (closed). The daemon's built-in routes carry the same policies.
BUILTIN_FAIL_POLICIES: Tuple[Tuple[str, FailPolicy], ...] = (
    ("login", FailPolicy.OPEN),
    ("reauth", FailPolicy.OPEN),
    ("request", FailPolicy.CLOSED),
    ("mfa_verify", FailPolicy.CLOSED),
    ("mfa_resend", FailPolicy.CLOSED),
    ("password_reset", FailPolicy.CLOSED),
    ("registration", FailPolicy.CLOSED),
    ("token", FailPolicy.CLOSED),
)


def _builtin_policies() -> Dict[str, FailPolicy]:
    return dict(BUILTIN_FAIL_POLICIES)


@dataclasses.dataclass
class ClientConfig:
    """Times are in seconds. `password_key` (32 bytes, the auth server's
    secret) lets `Client.attempt` compute password tags and digests itself."""

    socket: str
    timeout: float = CALL_TIMEOUT_DEFAULT
    fail_policies: Dict[str, FailPolicy] = dataclasses.field(default_factory=_builtin_policies)
    # Routes not in fail_policies.
    default_fail_policy: FailPolicy = FailPolicy.OPEN
    # Closed routes: attempts this process lets through per route while the
    # daemon is unreachable. None by default: closed means refuse.
    static_budgets: Dict[str, gcra.GcraSpec] = dataclasses.field(default_factory=dict)
    # Sent on a new connection; a daemon refusing it steps the connection down.
    protocol_version: int = PROTOCOL_VERSION
    # A timeout in a run of timeouts younger than this (or this soon after an
    # answer in time, or after a late answer to a timed-out call), from a
    # daemon that has answered this client in time, is Busy; 0: every
    # timeout is an outage. A timed-out call's connection is kept open for
    # this long to hear that late answer. In a burst on its account that is not
    # its own (the others' checks come from other addresses), a check whose
    # requester (tenant, account, address and X-Forwarded-For) had a
    # success reported through this client is
    # Busy for at most busy_max in a window of 120 x busy_max; any other
    # stays Busy.
    busy_max: float = BUSY_MAX_DEFAULT
    password_key: Optional[bytes] = None

    def __post_init__(self) -> None:
        if not PROTOCOL_VERSION_MIN <= self.protocol_version <= PROTOCOL_VERSION:
            raise ValueError(
                "protocol version {} is not one this client speaks ({} to {})".format(
                    self.protocol_version, PROTOCOL_VERSION_MIN, PROTOCOL_VERSION
                )
            )
        if self.password_key is not None and len(self.password_key) != PASSWORD_KEY_BYTES:
            raise ValueError("password_key must be {} bytes".format(PASSWORD_KEY_BYTES))

    def fail_policy(self, route: str, policy: Union[FailPolicy, str]) -> "ClientConfig":
        self.fail_policies[route] = FailPolicy(policy)
        return self

    def static_budget(self, route: str, limit: int, period: float, burst: int) -> "ClientConfig":
        """Lets a closed route through at `limit` per `period` seconds (burst
        `burst`) in this process while the daemon is unreachable."""
        period_us = max(int(period * 1_000_000), 1)
        self.static_budgets[route] = gcra.GcraSpec.new(max(limit, 1), period_us, max(burst, 1))
        return self


class _Connection:
    __slots__ = ("sock", "version", "awaiting_reply")

    def __init__(self, sock: socket.socket, version: int) -> None:
        self.sock = sock
        # Lowered once for each newer version its daemon refused, for as
        # long as the connection lives.
        self.version = version
        # The request is all written and its reply not yet read: a timeout
        # now may still be answered late on this connection.
        self.awaiting_reply = False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _set_remaining(sock: socket.socket, deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise CallTimeout("no answer within the deadline")
    sock.settimeout(remaining)


def _send(sock: socket.socket, frame: bytes, deadline: float) -> None:
    view = memoryview(frame)
    while view:
        _set_remaining(sock, deadline)
        sent = sock.send(view)
        view = view[sent:]


# How often a connect to a full accept queue is tried again until the deadline.
CONNECT_RETRY_INTERVAL = 0.0005


def _connect_by(sock: socket.socket, path: str, deadline: float) -> None:
    """Connects within the deadline. A full accept queue (EAGAIN on a Unix
    socket) is a daemon late to accept, not a gone one: each timed-out
    client's connection waits in its queue while it is stalled. It is tried
    again until the deadline, then is a timeout (the busy rule's, as a late
    reply's), never a connect error that would let login fail open."""
    while True:
        _set_remaining(sock, deadline)
        try:
            sock.connect(path)
            return
        except BlockingIOError:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CallTimeout("no connection within the deadline: the daemon's accept queue is full") from None
            time.sleep(min(CONNECT_RETRY_INTERVAL, remaining))


def _unreached(path: str, error: OSError) -> ClientError:
    """Only a missing socket, nobody listening or no permission says the
    daemon is not there (a `connect` error: the fail policy applies). Any
    other error creating or connecting the socket (EMFILE, ENFILE, ENOBUFS,
    ENOMEM, ...) is taken as a late daemon and joins the late run like a
    timeout: an attacker who exhausts the auth server's descriptors must not
    turn a burst on a locked account into login failing open. (Python's
    PermissionError is EACCES or EPERM, as Rust's PermissionDenied.)"""
    if isinstance(error, (FileNotFoundError, ConnectionRefusedError, PermissionError)):
        return ConnectError("cannot reach tollgate at {}: {}".format(path, error))
    return CallTimeout("no connection to tollgate at {}: {}".format(path, error))


def _recv_some(sock: socket.socket, deadline: float, most: int) -> bytes:
    remaining = deadline - time.monotonic()
    if remaining > 0:
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(most)
        except socket.timeout:
            chunk = _recv_now(sock, most)
    else:
        chunk = _recv_now(sock, most)
    if not chunk:
        raise ConnectionClosed("the daemon closed the connection")
    return chunk


def _recv_now(sock: socket.socket, most: int) -> bytes:
    """One read that does not wait, once the deadline has passed. A reply
    already here wins over the timer (as tokio polls a call before its
    timer): a thread held past its deadline (the GIL, a busy CPU) must not
    turn a refusal that arrived in time into a timeout that lets it in."""
    sock.settimeout(0.0)
    try:
        return sock.recv(most)
    except (BlockingIOError, InterruptedError):
        raise CallTimeout("no answer within the deadline") from None


def _read_reply(sock: socket.socket, deadline: float) -> bytes:
    """One reply frame's payload. A single request is in flight per
    connection, so a byte past its reply is a broken connection."""
    data = _recv_some(sock, deadline, 4096)
    while len(data) < 4:
        data += _recv_some(sock, deadline, 4 - len(data))
    length = int.from_bytes(data[:4], "little")
    if length > RESPONSE_PAYLOAD_BYTES_MAX:
        raise ProtocolError("reply of {} bytes is over the maximum".format(length))
    total = 4 + length
    while len(data) < total:
        data += _recv_some(sock, deadline, total - len(data))
    if len(data) > total:
        raise ProtocolError("{} bytes after the reply".format(len(data) - total))
    return data[4:]


def _bounded(subject: Subject) -> Subject:
    if subject.forwarded_for is None:
        return subject
    tail = forwarded_tail(subject.forwarded_for)
    if tail is subject.forwarded_for:
        return subject
    return dataclasses.replace(subject, forwarded_for=tail)


def _outcome(outcome: Union[Outcome, bool, str]) -> Outcome:
    if isinstance(outcome, bool):
        return Outcome.SUCCESS if outcome else Outcome.FAILURE
    if isinstance(outcome, str):
        return Outcome[outcome.upper()]
    return Outcome(outcome)


class _ClientCore:
    """What the synchronous and asyncio clients share: the fail policies,
    static budgets, the busy rule's history and request ids."""

    def __init__(self, config: Union[ClientConfig, str]) -> None:
        self.config = config if isinstance(config, ClientConfig) else ClientConfig(config)
        self._ids = itertools.count(1)
        self._ids_lock = threading.Lock()
        self._budget_tats: Dict[str, int] = {}
        self._budget_lock = threading.Lock()
        self._started = time.monotonic_ns()
        # When the daemon last answered in time (µs since start, plus one;
        # 0: never). A daemon never heard from is not busy.
        self._last_answered_us = 0
        # When a reply last came to a call that had already timed out (same
        # clock; 0: never). A daemon kept just past the deadline on every
        # call is alive, so busy, not down.
        self._last_heard_us = 0
        # The current run of timeouts: when it began and its last one (0:
        # none). A daemon late at a stretch for longer than busy_max, with
        # nothing answered in time within it, is down, not busy: the fail
        # policy applies again.
        self._late_run = [0, 0]
        self._late_lock = threading.Lock()
        self._bursts = Bursts()
        # Per requester, when a burst not her own first refused her as busy.
        self._busy_windows = BusyWindows()
        # Per requester, when a success was last reported through this
        # client: only those may leave busy after their window.
        self._known = KnownRequesters()

    def _refused_before_sending(self, request: Request) -> Optional[Rejected]:
        """A request the daemon would refuse for its size, refused here: it
        touches no connection, burst or static budget."""
        error = refusal_before_sending(self.config.protocol_version, request)
        return None if error is None else Rejected(error)

    def _next_id(self) -> int:
        with self._ids_lock:
            return next(self._ids)

    def _now_us(self) -> int:
        return (time.monotonic_ns() - self._started) // 1000 + 1

    def _report_request(
        self,
        route: str,
        subject: Subject,
        outcome: Union[Outcome, bool, str],
        password_digest: Optional[bytes],
        password_tag: Optional[bytes],
    ) -> Report:
        """The report to send."""
        return Report(route, _bounded(subject), _outcome(outcome), password_digest, password_tag)

    def _enter(self, route: str, request: Request) -> Optional[BurstGuard]:
        """What a request about to be sent (not refused before sending)
        changes here. A success reported makes its requester known,
        whatever the daemon answers or even if the call fails: the password
        was right, so her timeouts in others' bursts may follow the fail
        policy after her busy window. A check enters its bursts: only a
        check can be busy, and the burst it is in decides."""
        if isinstance(request, Report) and request.outcome == Outcome.SUCCESS:
            subject = request.subject
            requester = Bursts.requester(route, subject)
            # A requester that is its burst key (no address) is never asked
            # about: its overlaps are all its own.
            if requester != Bursts.key(route, subject):
                self._known.succeeded(requester, Bursts.account(route, subject), self._now_us())
        return self._bursts.enter(route, request.subject) if isinstance(request, Check) else None

    def _failed(self, route: str, request: Request, error: ClientError, burst: Optional[BurstGuard]) -> Unavailable:
        if isinstance(error, Busy):
            # Busy stops a login only in a burst on its account: a lone
            # user's timeout during a flood on others is an outage. Parallel
            # checks on one account from one requester (one address and
            # X-Forwarded-For, in one tenant) are a guesser's own burst,
            # refused for as long as they last. A user who has
            # logged in from this address (a success reported through this
            # client) is refused as busy in others' bursts on her account
            # for at most busy_max in a window of 120 x busy_max, so nobody
            # can keep her out by checking her account; past that her
            # timeout follows the fail policy. Anyone else in a burst on
            # the account (a guesser's other addresses, a botnet) stays
            # busy: a late guess that failed open would be admitted with no
            # check at all. Only a known requester in a burst not her own
            # opens a window. The message says busy only when the error
            # stays busy.
            if burst is None or not (
                burst.own_burst()
                or (
                    burst.in_burst()
                    and (
                        not self._known.known(burst.requester, self._now_us())
                        or self._busy_windows.excused(
                            burst.requester, self._now_us(), int(self.config.busy_max * 1_000_000)
                        )
                    )
                )
            ):
                error = CallTimeout(str(error))
            else:
                error = Busy("{}, busy: the daemon answered in time lately".format(error))
        # Only a check is an attempt: a report must not spend a second unit
        # of the static budget.
        return self._unavailable(route, error, spend=isinstance(request, Check))

    def _unavailable(self, route: str, error: ClientError, spend: bool) -> Unavailable:
        """The route's fail policy; for a closed route, whether the static
        budget has room (spent from only when `spend`)."""
        policy = self.config.fail_policies.get(route, self.config.default_fail_policy)
        within = False
        spec = self.config.static_budgets.get(route)
        # A busy daemon is not an outage: the budget is not spent on it.
        if policy == FailPolicy.CLOSED and not isinstance(error, Busy) and spec is not None:
            with self._budget_lock:
                decision, after = gcra.decide(spec, self._budget_tats.get(route), self._now_us(), spend)
                self._budget_tats[route] = after
            within = decision.allowed
        return Unavailable(policy, error, within)

    def _timed_out(self) -> ClientError:
        """Records a timeout in the current run: Busy at a daemon that has
        answered this client in time, while the run is younger than busy_max
        or the daemon answered within busy_max, in time or late."""
        with self._late_lock:
            # Read under the lock: read before it, another thread could
            # start the run after this one's instant.
            now = self._now_us()
            run = self._late_run
            if run[1] == 0:
                run[0] = now
            elif self._last_heard_us > run[1]:
                # A late reply came after the run's last timeout: the daemon
                # was alive after that run, so this timeout begins a new
                # one. Otherwise a quiet gap longer than busy_max would
                # leave the old run (which only an answer in time ends)
                # too old, and a burst timing out before its own late
                # replies are heard would fail open. A frozen daemon is
                # heard from never, so its sparse calls still make one
                # run that grows old.
                run[0] = now
            run[1] = max(run[1], now)
            busy_max_us = int(self.config.busy_max * 1_000_000)
            # A daemon that answered in time within busy_max is busy, not
            # down: bursts closer together than busy_max would otherwise
            # age one run past it and fail open.
            answered_lately = now - self._last_answered_us < busy_max_us
            # A daemon that answers every call just after the deadline
            # (loaded by bursts) keeps the run growing with no answer in
            # time, yet is alive: its late answers keep it busy.
            heard_lately = self._last_heard_us != 0 and now - self._last_heard_us < busy_max_us
            run_young = now - run[0] < busy_max_us or answered_lately or heard_lately
            # Only an answer in time counts: a daemon never in time is not busy.
            answered_before = self._last_answered_us > 0
        if answered_before and run_young:
            # The plain timeout message: _failed adds the busy part if it stays busy.
            return Busy("no answer within {} s".format(self.config.timeout))
        return CallTimeout("no answer within {} s".format(self.config.timeout))

    def _answered_in_time(self) -> None:
        with self._late_lock:
            # A timely answer busy_max after the run's last timeout ends the
            # run (quiet gaps alone do not: a frozen daemon's sparse calls
            # are one run that grows old).
            now = self._now_us()
            self._last_answered_us = now
            if self._late_run[1] != 0 and now - self._late_run[1] >= int(self.config.busy_max * 1_000_000):
                self._late_run[1] = 0

    def _heard_late(self) -> None:
        """A reply came to a call that had timed out. It neither ends the
        run of timeouts nor counts as an answer in time: it only shows the
        daemon is alive. No lock: the listener thread never takes the
        client's, so a fork cannot catch it holding it and leave the child
        hung on every later call (one assignment is atomic in CPython)."""
        self._last_heard_us = self._now_us()

    def _frame(self, version: int, request: Request) -> Tuple[int, bytes]:
        request_id = self._next_id()
        return request_id, encode_request(version, request_id, request)


def _check_reply(request_id: int, payload: bytes) -> Tuple[int, int, Response]:
    version, reply_id, response = decode_response(payload)
    # Id 0 is the daemon's reply to a frame it could not read at all.
    if reply_id != request_id and not (reply_id == 0 and isinstance(response, ErrorReply)):
        raise ProtocolError("reply id {} for request {}".format(reply_id, request_id))
    return version, reply_id, response


def _answer_of(version: int, response: Response) -> Answer:
    if isinstance(response, ErrorReply):
        return Rejected(response)
    return VerdictAnswer(response, version)


class _LateListeners:
    """Timed-out connections kept open for up to busy_max each, to hear
    whether the daemon answers late. Closing them at once, the client never
    learns that the reply came, and a daemon kept just past the deadline on
    every call would look down when it is only busy. One daemon thread per
    client watches them all, so handing one over costs the timed-out call
    no wait. Only the daemon writes on its socket: any byte is a reply, and
    nothing needs parsing. A connection is closed once heard from or at the
    end of its window, never reused: its state is unknown."""

    def __init__(self, heard_late: Callable[[], None]) -> None:
        self._heard_late = heard_late
        self._lock = threading.Lock()
        # Handed over and not yet taken by the thread, each with when to stop listening.
        self._handed: List[Tuple[socket.socket, float]] = []
        # Handed over or listened on: at most LATE_LISTENERS_MAX.
        self._held = 0
        # The thread lives until the last window it was given ends, so a
        # daemon late call after call does not start a thread per call.
        self._last_until = 0.0
        # Written to wake the thread for a new connection; None while no
        # thread runs.
        self._wake: Optional[socket.socket] = None
        # The running thread's end of the wake-up pair, its selector and the
        # connections it listens on (only it changes them), kept here so
        # that a forked child, which has no thread, can close them.
        self._woken: Optional[socket.socket] = None
        self._selector: Optional[selectors.BaseSelector] = None
        self._listening: Dict[socket.socket, float] = {}
        # Set by close(): the thread closes what it listens on when it wakes.
        self._drop_listening = False
        _ALL_LATE_LISTENERS.add(self)

    def listen(self, sock: socket.socket, seconds: float) -> bool:
        """Takes the connection to listen on for `seconds`; False (and the
        caller closes it) at the cap. Never waits for the thread."""
        with self._lock:
            if self._held >= LATE_LISTENERS_MAX:
                return False
            woken = None
            if self._wake is None:
                try:
                    selector = selectors.DefaultSelector()
                except OSError:
                    return False
                try:
                    self._wake, woken = socket.socketpair()
                except OSError:
                    selector.close()
                    return False
                # Neither end waits: a full buffer means wake-ups are
                # pending already, and an empty one that all were read.
                self._wake.setblocking(False)
                woken.setblocking(False)
                # A new thread's own: the last one has stopped using its
                # own (it cleared _wake under this lock on its way out).
                self._woken, self._selector, self._listening = woken, selector, {}
                self._drop_listening = False
                listening = self._listening
            until = time.monotonic() + seconds
            sock.setblocking(False)
            self._handed.append((sock, until))
            self._held += 1
            self._last_until = max(self._last_until, until)
            if woken is None:
                self._wake_thread()
        if woken is not None:
            # Started outside the lock: other timed-out calls hand theirs
            # over meanwhile, and the thread takes them all when it starts.
            thread = threading.Thread(
                target=self._run,
                args=(woken, selector, listening),
                name="tollgate-late-listener",
                daemon=True,
            )
            try:
                thread.start()
            except RuntimeError:
                # No thread to be had: what was handed over is closed, as
                # it was before listening, and the next timeout tries again.
                self._drop_all({})
                selector.close()
                woken.close()
        return True

    def close(self) -> None:
        """Closes every connection handed over or listened on. The ones not
        yet taken by the thread are closed here; the thread closes its own
        as soon as it wakes (it alone unregisters them from its selector),
        then ends, as nothing is left to listen on. Returns at once."""
        with self._lock:
            handed, self._handed = self._handed, []
            self._held -= len(handed)
            # No window is left to wait for: the thread ends unless a call
            # times out after this and hands it a new connection.
            self._last_until = 0.0
            if self._wake is not None:
                self._drop_listening = True
                self._wake_thread()
        for sock, _ in handed:
            sock.close()

    def _wake_thread(self) -> None:
        """Wakes the running thread (called under the lock)."""
        if self._wake is None:
            return
        try:
            self._wake.send(b"\0")
        except OSError:
            # Its buffer is full: the thread has wake-ups pending already.
            pass

    def _after_fork_in_child(self) -> None:
        """A forked child has only the thread that forked: no listener
        thread, while _wake still says one runs, so connections handed over
        would never be heard nor closed and the cap would fill for good; and
        _lock may have been held by a thread the child does not have. The
        child starts afresh: a new lock, its copies of the parent's
        connections and wake-up pair closed (the parent's stay open), none
        held."""
        self._lock = threading.Lock()
        socks = [sock for sock, _ in self._handed] + list(self._listening)
        socks += [end for end in (self._wake, self._woken) if end is not None]
        for sock in socks:
            try:
                sock.close()
            except OSError:
                pass
        if self._selector is not None:
            try:
                self._selector.close()
            except OSError:
                pass
        self._handed = []
        self._listening = {}
        self._wake = self._woken = self._selector = None
        self._held = 0
        self._last_until = 0.0
        self._drop_listening = False

    def _run(self, woken: socket.socket, selector: selectors.BaseSelector, listening: Dict[socket.socket, float]) -> None:
        try:
            selector.register(woken, selectors.EVENT_READ)
            while self._take_handed(selector, listening):
                wait = min(listening.values(), default=self._last_until) - time.monotonic()
                for key, _ in selector.select(max(wait, 0.0)):
                    if key.fileobj is woken:
                        _drain(woken)
                        continue
                    sock = key.fileobj
                    try:
                        replied = bool(sock.recv(1))
                    except (BlockingIOError, InterruptedError):
                        # Woken with nothing to read after all: listen on.
                        continue
                    except OSError:
                        replied = False
                    # A byte is a reply; the end of the stream or an error
                    # is none. Either way the connection is done.
                    if replied:
                        self._heard_late()
                    self._stop(selector, listening, [sock])
                now = time.monotonic()
                self._stop(selector, listening, [sock for sock, until in listening.items() if until <= now])
        except BaseException:
            # Not expected: still, nothing held stays open, and the next
            # timed-out call starts a new thread.
            self._drop_all(listening)
            raise
        finally:
            selector.close()
            woken.close()

    def _drop_all(self, listening: Dict[socket.socket, float]) -> None:
        """Closes every connection held, when the thread cannot run or ends
        unexpectedly. The shared state is still that thread's: no other
        starts while _wake is set."""
        with self._lock:
            for sock, _ in self._handed:
                sock.close()
            self._handed.clear()
            self._held = 0
            if self._wake is not None:
                self._wake.close()
                self._wake = None
        for sock in listening:
            sock.close()

    def _take_handed(self, selector: selectors.BaseSelector, listening: Dict[socket.socket, float]) -> bool:
        """Starts listening on the connections handed over; False when there
        is none to listen on and the last window has ended: the thread ends
        (deciding under the lock, so no connection is handed to it then).
        After close(), first closes those it listened on (not the ones
        handed over since, which close() did not see)."""
        while True:
            with self._lock:
                dropping = self._drop_listening
                self._drop_listening = False
                if not dropping:
                    for sock, until in self._handed:
                        selector.register(sock, selectors.EVENT_READ)
                        listening[sock] = until
                    self._handed.clear()
                    if listening or time.monotonic() < self._last_until:
                        return True
                    if self._wake is not None:
                        self._wake.close()
                        self._wake = None
                    return False
            self._stop(selector, listening, list(listening))

    def _stop(self, selector: selectors.BaseSelector, listening: Dict[socket.socket, float], socks: List[socket.socket]) -> None:
        for sock in socks:
            selector.unregister(sock)
            del listening[sock]
            sock.close()
        if socks:
            with self._lock:
                self._held -= len(socks)


# Every client's late listeners, weakly: a client nobody uses any more is
# still collected. A forked child resets them all (see _after_fork_in_child).
_ALL_LATE_LISTENERS: "weakref.WeakSet[_LateListeners]" = weakref.WeakSet()


def _late_listeners_after_fork_in_child() -> None:
    for listeners in list(_ALL_LATE_LISTENERS):
        listeners._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_late_listeners_after_fork_in_child)


def _drain(sock: socket.socket) -> None:
    """Reads the wake-ups written so far, so the socket is not readable again until the next."""
    try:
        while sock.recv(4096):
            pass
    except (BlockingIOError, InterruptedError):
        pass


class Client(_ClientCore):
    """A client for one daemon, safe to share between threads: each call
    takes an idle pooled connection or opens one, and gives it back only
    after a clean exchange."""

    def __init__(self, config: Union[ClientConfig, str]) -> None:
        super().__init__(config)
        self._pool: List[_Connection] = []
        self._pool_lock = threading.Lock()
        self._late_listeners = _LateListeners(self._heard_late)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the idle connections and those kept open to hear a late
        reply (their thread then ends); the client stays usable."""
        with self._pool_lock:
            idle, self._pool = self._pool, []
        for conn in idle:
            conn.close()
        # Otherwise each stays open until its window of busy_max ends, and a
        # closed client would still hold descriptors and a thread.
        self._late_listeners.close()

    def check(self, route: str, subject: Subject, password_tag: Optional[bytes] = None) -> Answer:
        """May this attempt proceed? Ask before verifying the credential. A
        daemon older than version 3 never sees the tag."""
        return self._decide(route, Check(route, _bounded(subject), password_tag))

    def report(
        self,
        route: str,
        subject: Subject,
        outcome: Union[Outcome, bool, str],
        password_digest: Optional[bytes] = None,
        password_tag: Optional[bytes] = None,
    ) -> Answer:
        """How the credential check ended (True or Outcome.SUCCESS: it
        succeeded), with the same subject as the check."""
        return self._decide(route, self._report_request(route, subject, outcome, password_digest, password_tag))

    def abandon(self, route: str, subject: Subject) -> Answer:
        """The attempt an allowed check admitted ended without an outcome.
        Prefer `attempt`, whose guard sends this by itself. A daemon older
        than version 5 answers it `malformed` (a Rejected answer), and the
        place lapses."""
        return self._decide(route, Abandon(route, _bounded(subject)))

    def attempt(
        self,
        route: str,
        subject: Subject,
        password: Optional[str] = None,
        password_tag: Optional[bytes] = None,
    ) -> "Attempt":
        """Checks an attempt and returns its guard, a context manager: report
        the outcome with `attempt.report(ok)`; leaving the block without a
        report abandons an allowed attempt. With `password` (and the
        config's password_key) the tag and digest are computed here."""
        from .attempt import Attempt

        return Attempt.begin(self, route, subject, password, password_tag)

    def _decide(self, route: str, request: Request) -> Answer:
        refused = self._refused_before_sending(request)
        if refused is not None:
            return refused
        burst = self._enter(route, request)
        try:
            try:
                version, response = self._call(request)
            except ClientError as error:
                return self._failed(route, request, error, burst)
            return _answer_of(version, response)
        finally:
            if burst is not None:
                burst.leave()

    def _call(self, request: Request) -> Tuple[int, Response]:
        """One request and its reply within the deadline."""
        deadline = time.monotonic() + self.config.timeout
        try:
            result = self._call_untimed(request, deadline)
        except CallTimeout:
            raise self._timed_out() from None
        self._answered_in_time()
        return result

    def _call_untimed(self, request: Request, deadline: float) -> Tuple[int, Response]:
        with self._pool_lock:
            pooled = self._pool.pop() if self._pool else None
        if pooled is None:
            return self._call_on(self._connect(deadline), request, deadline)
        try:
            return self._call_on(pooled, request, deadline)
        except ConnectionClosed:
            # A pooled connection the daemon closed while it sat idle (or a
            # restarted daemon): ask once more on a fresh connection.
            return self._call_on(self._connect(deadline), request, deadline)

    def _connect(self, deadline: float) -> _Connection:
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as e:
            raise _unreached(self.config.socket, e) from None
        try:
            _connect_by(sock, self.config.socket, deadline)
        except socket.timeout:
            sock.close()
            raise CallTimeout("no connection within the deadline") from None
        except CallTimeout:
            sock.close()
            raise
        except OSError as e:
            sock.close()
            raise _unreached(self.config.socket, e) from None
        return _Connection(sock, self.config.protocol_version)

    def _call_on(self, conn: _Connection, request: Request, deadline: float) -> Tuple[int, Response]:
        """One exchange (with its version steps); the connection goes back to
        the pool only if it ended cleanly: after an error or a timeout its
        state is unknown. After a timeout with the request all written, it
        is listened on for a late reply instead of closed at once."""
        try:
            version, reply_id, request_id, response = self._exchange(conn, request, deadline)
            # A daemon older than the connection's version refuses it in
            # version 1's bytes: ask again one version lower, each step once
            # per connection.
            while conn.version > PROTOCOL_VERSION_MIN and _refuses_version(version, reply_id, request_id, response):
                conn.version -= 1
                version, reply_id, request_id, response = self._exchange(conn, request, deadline)
        except CallTimeout:
            self._closed_or_listened_on(conn)
            raise
        except BaseException:
            conn.close()
            raise
        with self._pool_lock:
            kept = len(self._pool) < POOL_CONNECTIONS_MAX
            if kept:
                self._pool.append(conn)
        if not kept:
            conn.close()
        return version, response

    def _closed_or_listened_on(self, conn: _Connection) -> None:
        """A timed-out connection whose request went out may still bring the
        reply: it is handed to a late listener (busy_max 0: no busy, so no
        need). One with a request cut off mid-write, or past the cap, is
        closed at once."""
        busy_max = self.config.busy_max
        if not (conn.awaiting_reply and busy_max > 0 and self._late_listeners.listen(conn.sock, busy_max)):
            conn.close()

    def _exchange(self, conn: _Connection, request: Request, deadline: float) -> Tuple[int, int, int, Response]:
        request_id, frame = self._frame(conn.version, request)
        try:
            conn.awaiting_reply = False
            _send(conn.sock, frame, deadline)
            conn.awaiting_reply = True
            payload = _read_reply(conn.sock, deadline)
            conn.awaiting_reply = False
        except socket.timeout:
            raise CallTimeout("no answer within the deadline") from None
        except (BrokenPipeError, ConnectionResetError) as e:
            raise ConnectionClosed("connection to tollgate closed: {}".format(e)) from None
        except OSError as e:
            raise ConnectionFailed("connection to tollgate failed: {}".format(e)) from None
        version, reply_id, response = _check_reply(request_id, payload)
        return version, reply_id, request_id, response


def _refuses_version(version: int, reply_id: int, request_id: int, response: Response) -> bool:
    """A version-1 `unsupported_version` for this request: an old daemon's
    answer to a newer version (a daemon never refuses one it speaks)."""
    return (
        version == 1
        and reply_id == request_id
        and isinstance(response, ErrorReply)
        and response.code == ErrorCode.UNSUPPORTED_VERSION
    )
