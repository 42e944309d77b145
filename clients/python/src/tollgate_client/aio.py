"""The asyncio client: the same policies as `Client` (shared code), on
asyncio's Unix streams, for one event loop.

    client = AsyncClient(ClientConfig(path, password_key=key))
    async with client.attempt("login", subject, password=pw) as attempt:
        if attempt.proceeds:
            await attempt.report(await verify(pw))

A handler can be cancelled at any await, even with its check on the wire:
the check then runs on, and if it was allowed it is abandoned when its
answer comes, so no place is left held by a request nobody reports."""

import asyncio
import socket
from types import TracebackType
from typing import List, Optional, Set, Tuple, Type, Union

from .answers import Answer
from .attempt import ENDED_MESSAGE, _holds_places, _report_secrets
from .client import (
    CONNECT_RETRY_INTERVAL,
    LATE_LISTENERS_MAX,
    POOL_CONNECTIONS_MAX,
    ClientConfig,
    _answer_of,
    _bounded,
    _check_reply,
    _ClientCore,
    _refuses_version,
    _unreached,
)
from .errors import CallTimeout, ClientError, ConnectionClosed, ConnectionFailed, ProtocolError
from .passwords import password_tag
from .protocol import PROTOCOL_VERSION_MIN, RESPONSE_PAYLOAD_BYTES_MAX, Abandon, Check, Outcome, Request, Response, Subject


class _AsyncConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, version: int) -> None:
        self.reader = reader
        self.writer = writer
        self.version = version
        # The request was handed to the transport and its reply not yet read.
        self.awaiting_reply = False

    def request_written(self) -> bool:
        """The request is all on the socket (the transport holds none of
        it) and its reply not yet read: a timeout now may still be answered
        late on this connection."""
        return self.awaiting_reply and self.writer.transport.get_write_buffer_size() == 0

    def close(self) -> None:
        self.writer.close()


class _Deadline:
    """Whether a call's deadline passed before its exchange ended. The call
    sets it before cancelling the exchange, so the exchange can tell its
    timeout (listen for the late reply) from its caller's cancellation
    (close the connection)."""

    __slots__ = ("passed",)

    def __init__(self) -> None:
        self.passed = False


class AsyncClient(_ClientCore):
    def __init__(self, config: Union[ClientConfig, str]) -> None:
        super().__init__(config)
        # One event loop: list operations between awaits need no lock.
        self._pool: List[_AsyncConnection] = []
        # Abandons sent for cancelled checks, kept until they finish.
        self._background: Set["asyncio.Future[Answer]"] = set()
        # Tasks listening on timed-out connections for a late reply, at most
        # LATE_LISTENERS_MAX, kept until they finish.
        self._late_listeners: Set["asyncio.Future[None]"] = set()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the idle connections and those kept open to hear a late
        reply; the client stays usable."""
        idle, self._pool = self._pool, []
        for conn in idle:
            conn.close()
        # Otherwise each listener keeps its connection open until its window
        # of busy_max ends. A cancelled listener's connection is closed by
        # its done callback (see _listen_late), on the loop's next turn.
        for listener in list(self._late_listeners):
            listener.cancel()

    async def check(self, route: str, subject: Subject, password_tag: Optional[bytes] = None) -> Answer:
        return await self._decide(route, Check(route, _bounded(subject), password_tag))

    async def report(
        self,
        route: str,
        subject: Subject,
        outcome: Union[Outcome, bool, str],
        password_digest: Optional[bytes] = None,
        password_tag: Optional[bytes] = None,
    ) -> Answer:
        return await self._decide(route, self._report_request(route, subject, outcome, password_digest, password_tag))

    async def abandon(self, route: str, subject: Subject) -> Answer:
        return await self._decide(route, Abandon(route, _bounded(subject)))

    def attempt(
        self, route: str, subject: Subject, password: Optional[str] = None, password_tag: Optional[bytes] = None
    ) -> "AsyncAttempt":
        """The guard; `async with` sends its check."""
        return AsyncAttempt(self, route, subject, password, password_tag)

    def _in_background(self, future: "asyncio.Future[Answer]") -> None:
        self._background.add(future)
        future.add_done_callback(self._background.discard)

    async def _decide(self, route: str, request: Request) -> Answer:
        refused = self._refused_before_sending(request)
        if refused is not None:
            return refused
        burst = self._enter(route, request)
        try:
            try:
                version, response = await self._call(request)
            except ClientError as error:
                return self._failed(route, request, error, burst)
            return _answer_of(version, response)
        finally:
            if burst is not None:
                burst.leave()

    async def _call(self, request: Request) -> Tuple[int, Response]:
        """The exchange runs as its own task, and the timer only ends the
        wait: a reply that has arrived wins over it. (wait_for since Python
        3.12 runs the call in this task under asyncio.timeout, whose timer
        cancels it before it resumes with a reply that came while the loop
        was held past the deadline: a refusal turned into a timeout.)"""
        deadline = _Deadline()
        exchange = asyncio.ensure_future(self._call_untimed(request, deadline))
        try:
            await asyncio.wait({exchange}, timeout=self.config.timeout)
            if not exchange.done():
                # Once round the loop: the callbacks of I/O already here run
                # and hand the exchange its reply.
                await asyncio.sleep(0)
        except BaseException:
            _cancel(exchange)
            raise
        if not exchange.done():
            # Cancelled, the exchange closes its connection, or hands it to
            # a late listener if its request went out.
            deadline.passed = True
            _cancel(exchange)
            raise self._timed_out()
        try:
            result = exchange.result()
        except CallTimeout:
            raise self._timed_out() from None
        self._answered_in_time()
        return result

    async def _call_untimed(self, request: Request, deadline: _Deadline) -> Tuple[int, Response]:
        if not self._pool:
            return await self._call_on(await self._connect(), request, deadline)
        try:
            return await self._call_on(self._pool.pop(), request, deadline)
        except ConnectionClosed:
            # Closed by the daemon while idle: once more on a fresh one.
            return await self._call_on(await self._connect(), request, deadline)

    async def _connect(self) -> _AsyncConnection:
        """As `client._connect_by`: a full accept queue is tried again until
        the call's timer ends the exchange (a timeout, not a connect error).
        The socket is connected here: asyncio's own connect takes EAGAIN for
        a connect in progress and hands back a socket that never connected."""
        sock = None
        try:
            # Created in here: an error creating it (EMFILE) is an answer too.
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            while True:
                try:
                    sock.connect(self.config.socket)
                    break
                except BlockingIOError:
                    await asyncio.sleep(CONNECT_RETRY_INTERVAL)
            reader, writer = await asyncio.open_unix_connection(sock=sock)
        except OSError as e:
            if sock is not None:
                sock.close()
            raise _unreached(self.config.socket, e) from None
        except BaseException:
            if sock is not None:
                sock.close()
            raise
        return _AsyncConnection(reader, writer, self.config.protocol_version)

    async def _call_on(self, conn: _AsyncConnection, request: Request, deadline: _Deadline) -> Tuple[int, Response]:
        """As `Client._call_on`; a cancelled or timed-out exchange closes it,
        except that one timed out with its request all written is listened
        on for a late reply first."""
        try:
            version, reply_id, request_id, response = await self._exchange(conn, request)
            while conn.version > PROTOCOL_VERSION_MIN and _refuses_version(version, reply_id, request_id, response):
                conn.version -= 1
                version, reply_id, request_id, response = await self._exchange(conn, request)
        except BaseException:
            if deadline.passed and conn.request_written():
                self._listen_late(conn)
            else:
                conn.close()
            raise
        if len(self._pool) < POOL_CONNECTIONS_MAX:
            self._pool.append(conn)
        else:
            conn.close()
        return version, response

    def _listen_late(self, conn: _AsyncConnection) -> None:
        """Hands a timed-out connection whose request went out to a task
        that listens for the late reply (busy_max 0: no busy, so no need);
        past the cap it is closed at once. The timed-out call does not wait
        for it."""
        busy_max = self.config.busy_max
        if busy_max <= 0 or len(self._late_listeners) >= LATE_LISTENERS_MAX:
            conn.close()
            return
        # Timed from the hand-over, not from the task's first step: a loop
        # not driven meanwhile must not stretch the window.
        until = asyncio.get_running_loop().time() + busy_max
        listener = asyncio.ensure_future(self._hear_late_reply(conn, until))
        self._late_listeners.add(listener)
        listener.add_done_callback(self._late_listeners.discard)
        # Closed when the task is done, not in it: a task cancelled before
        # its first step (its loop ending) never runs its body.
        listener.add_done_callback(lambda _: conn.close())

    async def _hear_late_reply(self, conn: _AsyncConnection, until: float) -> None:
        """Waits until the loop's time `until` for any byte on a timed-out
        connection (one read after it does not count).
        Closing it at once, the client never learns that the reply came, and
        a daemon kept just past the deadline on every call would look down
        when it is only busy. Only the daemon writes on its socket: any byte
        is a reply, and nothing needs parsing. The connection is closed
        after (by `_listen_late`), never reused: its state is unknown."""
        loop = asyncio.get_running_loop()
        try:
            replied = bool(await asyncio.wait_for(conn.reader.read(1), max(until - loop.time(), 0.0)))
        except (asyncio.TimeoutError, OSError):
            replied = False
        if replied and loop.time() <= until:
            self._heard_late()

    async def _exchange(self, conn: _AsyncConnection, request: Request) -> Tuple[int, int, int, Response]:
        request_id, frame = self._frame(conn.version, request)
        try:
            conn.awaiting_reply = False
            conn.writer.write(frame)
            await conn.writer.drain()
            conn.awaiting_reply = True
            length = int.from_bytes(await conn.reader.readexactly(4), "little")
            if length > RESPONSE_PAYLOAD_BYTES_MAX:
                raise ProtocolError("reply of {} bytes is over the maximum".format(length))
            payload = await conn.reader.readexactly(length)
            conn.awaiting_reply = False
        except (asyncio.IncompleteReadError, BrokenPipeError, ConnectionResetError) as e:
            raise ConnectionClosed("connection to tollgate closed: {}".format(e)) from None
        except OSError as e:
            raise ConnectionFailed("connection to tollgate failed: {}".format(e)) from None
        version, reply_id, response = _check_reply(request_id, payload)
        return version, reply_id, request_id, response


def _cancel(exchange: "asyncio.Future[Tuple[int, Response]]") -> None:
    """Cancels an exchange nobody awaits any more; what it ends with is
    retrieved, so that nothing is logged as never retrieved."""
    exchange.cancel()
    exchange.add_done_callback(lambda done: done.cancelled() or done.exception())


class AsyncAttempt:
    """`client.attempt(...)` under `async with`: as `Attempt`, awaited."""

    def __init__(
        self, client: AsyncClient, route: str, subject: Subject, password: Optional[str], tag: Optional[bytes]
    ) -> None:
        self._client = client
        self.route = route
        self.subject = subject
        self._password = password
        self._tag = tag
        self.answer: Optional[Answer] = None
        self._holds_places = False
        # As Attempt._ended: after a report, an abandon or the block's end.
        self._ended = False
        self.abandoned = False

    def _key(self) -> bytes:
        key = self._client.config.password_key
        if key is None:
            raise ValueError("a password needs ClientConfig.password_key to compute its tag and digest")
        return key

    async def __aenter__(self) -> "AsyncAttempt":
        if self._tag is None and self._password is not None:
            self._tag = password_tag(self._key(), self._password)
        checking = asyncio.ensure_future(self._client.check(self.route, self.subject, password_tag=self._tag))
        try:
            self.answer = await asyncio.shield(checking)
        except asyncio.CancelledError:
            # The check runs on; an allowed one is abandoned once answered.
            checking.add_done_callback(self._abandon_when_answered)
            raise
        self._holds_places = _holds_places(self.answer)
        return self

    def _abandon_when_answered(self, checking: "asyncio.Future[Answer]") -> None:
        if not checking.cancelled() and checking.exception() is None and _holds_places(checking.result()):
            self._client._in_background(asyncio.ensure_future(self._client.abandon(self.route, self.subject)))

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        await self.abandon()

    @property
    def proceeds(self) -> bool:
        return self.answer is not None and self.answer.proceeds

    @property
    def delay(self) -> Optional[float]:
        return None if self.answer is None else self.answer.delay

    @property
    def retry_after_secs(self) -> int:
        return 1 if self.answer is None else self.answer.retry_after_secs

    async def report(
        self,
        outcome: Union[Outcome, bool, str],
        subject: Optional[Subject] = None,
        password: Optional[str] = None,
        digest: Optional[bytes] = None,
        tag: Optional[bytes] = None,
    ) -> Answer:
        """As `Attempt.report`; the report goes out even if this is cancelled
        (the verify happened: the outcome counts)."""
        if self._ended:
            raise RuntimeError(ENDED_MESSAGE)
        self._ended = True
        self._holds_places = False
        subject = self.subject if subject is None else subject
        digest, tag = _report_secrets(self._key, self._password, self._tag, subject, password, digest, tag)
        reporting = asyncio.ensure_future(self._client.report(self.route, subject, outcome, digest, tag))
        self._client._in_background(reporting)
        return await asyncio.shield(reporting)

    async def abandon(self) -> Optional[Answer]:
        """As `Attempt.abandon`; sent even if this is cancelled."""
        self._ended = True
        if not self._holds_places:
            return None
        self._holds_places = False
        self.abandoned = True
        abandoning = asyncio.ensure_future(self._client.abandon(self.route, self.subject))
        self._client._in_background(abandoning)
        return await asyncio.shield(abandoning)
