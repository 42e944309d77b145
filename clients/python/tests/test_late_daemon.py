"""A second red team's findings: a full accept queue is a late daemon, not
a down one; the asyncio client's reply wins over its timer whatever
wait_for does; a guard's report carries the check's tag."""

import asyncio
import errno
import os
import socket
import struct
import tempfile
import threading
import time
import types
import unittest
from unittest import mock

from fake_daemon import FakeDaemon, allow_all, verdict_payload
from tollgate_client import AsyncClient, Client, ClientConfig, Subject, Unavailable, VerdictAnswer
from tollgate_client import aio as aio_module
from tollgate_client import client as client_module

SUBJECT = Subject(peer="198.51.100.7", account="alice")
KEY = bytes([7] * 32)
TAG = bytes(range(16))
DENY = 3


class StalledDaemon:
    """A listener with the smallest backlog that answers the first request
    on its first connection, then accepts nothing: `fill` queues
    connections until connecting fails with EAGAIN, as at a daemon stalled
    in a burst whose queue holds the timed-out clients' connections."""

    def __init__(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "stalled.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(0)
        self.queued = []
        self.served = []

    def serve_one(self) -> threading.Thread:
        def serve():
            conn, _ = self.listener.accept()
            self.served.append(conn)
            length = struct.unpack("<I", conn.recv(4, socket.MSG_WAITALL))[0]
            payload = conn.recv(length, socket.MSG_WAITALL)
            version, request_id = struct.unpack_from("<BQ", payload)
            reply = verdict_payload(version, request_id)
            conn.sendall(struct.pack("<I", len(reply)) + reply)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        return thread

    def fill(self) -> None:
        for _ in range(64):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(self.path)
            except BlockingIOError:
                sock.close()
                return
            self.queued.append(sock)
        raise AssertionError("the accept queue never filled")

    def __enter__(self) -> "StalledDaemon":
        return self

    def __exit__(self, *exc: object) -> None:
        for sock in self.queued + self.served:
            sock.close()
        self.listener.close()
        self.dir.cleanup()


def overlapped(call, n):
    answers = [None] * n
    start = threading.Barrier(n)

    def one(i):
        start.wait()
        answers[i] = call()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


class FullAcceptQueue(unittest.TestCase):
    def test_a_full_queue_is_a_timeout_not_a_connect_error(self):
        with StalledDaemon() as daemon, Client(ClientConfig(daemon.path, timeout=0.03)) as client:
            daemon.fill()
            started = time.monotonic()
            answer = client.check("login", SUBJECT)
            self.assertEqual((type(answer), answer.error.kind), (Unavailable, "timeout"))
            self.assertGreaterEqual(time.monotonic() - started, 0.02, "the queue is waited on until the deadline")
            self.assertEqual(client.check("token", SUBJECT).error.kind, "timeout")

    def test_an_overlapped_pair_at_a_full_queue_never_proceeds(self):
        with StalledDaemon() as daemon, Client(ClientConfig(daemon.path, timeout=0.03)) as client:
            daemon.serve_one()
            self.assertIsInstance(client.check("login", SUBJECT), VerdictAnswer)
            client.close()  # no pooled connection: each check connects
            daemon.fill()
            answers = overlapped(lambda: client.check("login", SUBJECT), 2)
            self.assertEqual([a.error.kind for a in answers], ["busy", "busy"])
            self.assertFalse(any(a.proceeds for a in answers), "a stalled daemon's queue lets no guess through")

    def test_a_missing_socket_is_still_a_connect_error(self):
        with tempfile.TemporaryDirectory() as empty:
            answer = Client(os.path.join(empty, "none.sock")).check("login", SUBJECT)
        self.assertEqual((answer.error.kind, answer.proceeds), ("connect", True))

    def test_the_asyncio_client_waits_on_a_full_queue_too(self):
        async def scenario(daemon):
            client = AsyncClient(ClientConfig(daemon.path, timeout=0.03))
            self.assertIsInstance(await client.check("login", SUBJECT), VerdictAnswer)
            client.close()
            daemon.fill()
            answers = await asyncio.gather(*[client.check("login", SUBJECT) for _ in range(2)])
            self.assertEqual([a.error.kind for a in answers], ["busy", "busy"])
            self.assertFalse(any(a.proceeds for a in answers))
            await asyncio.sleep(0.06)
            lone = await client.check("login", Subject(peer="198.51.100.7", account="erin"))
            self.assertEqual((type(lone), lone.error.kind), (Unavailable, "timeout"))
            missing = AsyncClient(daemon.path + ".none")
            self.assertEqual((await missing.check("login", SUBJECT)).error.kind, "connect")

        with StalledDaemon() as daemon:
            served = daemon.serve_one()
            asyncio.run(scenario(daemon))
            served.join()


def sockets_failing_with(code, on_connect=False):
    """The socket module as a client module sees it, with every new socket
    failing as at a process out of descriptors (EMFILE), or every connect
    failing (ENOBUFS)."""

    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    class ConnectFails(socket.socket):
        connect = refuse

    return types.SimpleNamespace(**{**vars(socket), "socket": ConnectFails if on_connect else refuse})


class OutOfDescriptors(unittest.TestCase):
    """Only a missing socket, nobody listening or no permission is a
    connect error; any other failure to get a socket (EMFILE: an attacker
    exhausting the auth server's descriptors) is a late daemon, so a burst
    on an account is busy and never proceeds."""

    def test_emfile_is_late_not_a_connect_error(self):
        for sockets in (sockets_failing_with(errno.EMFILE), sockets_failing_with(errno.ENOBUFS, on_connect=True)):
            with self.subTest(sockets=sockets.socket), FakeDaemon(allow_all) as daemon:
                with Client(ClientConfig(daemon.path, timeout=0.2)) as client:
                    self.assertIsInstance(client.check("login", Subject(account="bob")), VerdictAnswer)
                    client.close()
                    with mock.patch.object(client_module, "socket", sockets):
                        lone = client.check("login", Subject(peer="198.51.100.7", account="erin"))
                        first = client.check("login", SUBJECT)
                        second = client.check("login", SUBJECT)
                self.assertEqual((lone.error.kind, lone.proceeds), ("timeout", True))
                self.assertNotEqual(first.error.kind, "connect")
                self.assertEqual((second.error.kind, second.proceeds), ("busy", False))

    def test_the_asyncio_client_answers_emfile_too(self):
        async def scenario(daemon):
            client = AsyncClient(ClientConfig(daemon.path, timeout=0.2))
            self.assertIsInstance(await client.check("login", Subject(account="bob")), VerdictAnswer)
            client.close()
            with mock.patch.object(aio_module, "socket", sockets_failing_with(errno.EMFILE)):
                lone = await client.check("login", Subject(peer="198.51.100.7", account="erin"))
                burst = await asyncio.gather(*[client.check("login", SUBJECT) for _ in range(2)])
            self.assertEqual((lone.error.kind, lone.proceeds), ("timeout", True))
            self.assertEqual([(a.error.kind, a.proceeds) for a in burst], [("busy", False)] * 2)

        with FakeDaemon(allow_all) as daemon:
            asyncio.run(scenario(daemon))


def deny_late(daemon, version, request_id, variant, body):
    """A refusal sent 10 ms after the request: after the loop last looked
    at the socket, so the reply and the timer are seen in one go."""
    time.sleep(0.01)
    return verdict_payload(version, request_id, decision=DENY, retry_after_ms=60_000)


async def wait_for_as_in_3_12(fut, timeout):
    """Python 3.12's wait_for: the call runs in the caller's task under
    asyncio.timeout, whose timer cancels that task."""
    async with asyncio.timeout(timeout):
        return await fut


class AsyncReplyBeatsTheTimer(unittest.TestCase):
    def held_after_the_write(self, client, daemon):
        """The loop is held right after the pooled connection's next write
        until the reply is buffered and the deadline has passed."""
        conn = client._pool[0]
        write = conn.writer.write

        def hold(sent):
            until = time.monotonic() + 2.0
            while len(daemon.requests) == sent and time.monotonic() < until:
                time.sleep(0.005)
            time.sleep(0.06)

        def write_then_hold(data):
            sent = len(daemon.requests)
            write(data)
            asyncio.get_running_loop().call_soon(hold, sent)

        conn.writer.write = write_then_hold

    def run_held(self, handler, wait_for):
        async def scenario(daemon):
            client = AsyncClient(ClientConfig(daemon.path, timeout=0.5))
            await client.check("login", SUBJECT)  # a pooled connection
            await asyncio.sleep(0.06)  # no burst: a lone check
            client.config.timeout = 0.02
            self.held_after_the_write(client, daemon)
            with mock.patch.object(aio_module.asyncio, "wait_for", wait_for):
                answer = await client.check("login", SUBJECT)
            client.config.timeout = 0.5
            after = await client.check("login", SUBJECT)
            client.close()
            return answer, after

        with FakeDaemon(handler) as daemon:
            answer, after = asyncio.run(scenario(daemon))
            return answer, after, daemon.connections

    def wait_fors(self):
        yield "this Python's", asyncio.wait_for
        if hasattr(asyncio, "timeout"):
            yield "3.12's", wait_for_as_in_3_12

    def test_a_reply_there_by_the_deadline_is_the_answer(self):
        for name, wait_for in self.wait_fors():
            with self.subTest(wait_for=name):
                answer, after, connections = self.run_held(deny_late, wait_for)
                self.assertIsInstance(answer, VerdictAnswer, "a refusal that arrived must not fail open")
                self.assertFalse(answer.proceeds)
                self.assertIsInstance(after, VerdictAnswer)
                self.assertEqual(connections, 1, "the connection was clean and reused")

    def test_a_silent_daemon_still_times_out_and_its_connection_is_closed(self):
        answered = threading.Event()

        def first_only(daemon, version, request_id, variant, body):
            if answered.is_set():
                return None
            answered.set()
            return verdict_payload(version, request_id)

        answer, after, connections = self.run_held(first_only, asyncio.wait_for)
        self.assertEqual((type(answer), answer.error.kind, answer.proceeds), (Unavailable, "timeout", True))
        self.assertEqual(connections, 2, "a timed-out connection is closed")


class GuardTag(unittest.TestCase):
    """A guard's report without a tag (or password) carries its check's."""

    @staticmethod
    def report_tag(daemon):
        report = [r for r in daemon.requests if r[3] == 1][-1][4]
        return report[-17:-16], report[-16:]

    def test_a_report_carries_the_checks_tag_and_a_given_tag_wins(self):
        with FakeDaemon(allow_all) as daemon, Client(ClientConfig(daemon.path, password_key=KEY)) as client:
            with client.attempt("login", SUBJECT, password_tag=TAG) as attempt:
                attempt.report(False)
            self.assertEqual(self.report_tag(daemon), (b"\x01", TAG))
            with client.attempt("login", SUBJECT, password_tag=TAG) as attempt:
                attempt.report(False, tag=bytes(16))
            self.assertEqual(self.report_tag(daemon), (b"\x01", bytes(16)))
            with client.attempt("login", SUBJECT, password="hunter2", password_tag=TAG) as attempt:
                attempt.report(False)
            self.assertEqual(self.report_tag(daemon), (b"\x01", TAG))

    def test_the_asyncio_guard_too(self):
        async def scenario(client):
            async with client.attempt("login", SUBJECT, password_tag=TAG) as attempt:
                await attempt.report(False)
            client.close()

        with FakeDaemon(allow_all) as daemon:
            asyncio.run(scenario(AsyncClient(ClientConfig(daemon.path, password_key=KEY))))
            self.assertEqual(self.report_tag(daemon), (b"\x01", TAG))


if __name__ == "__main__":
    unittest.main()
