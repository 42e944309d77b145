"""Red-team findings: oversized requests refused before sending, a reply
that arrived by the deadline winning over the timer, and a guard that
sends nothing once it has ended."""

import asyncio
import os
import tempfile
import time
import unittest
from unittest import mock

import tollgate_client.client as client_module
from fake_daemon import FakeDaemon, allow_all, silent, verdict_payload
from test_runner import KEY as RUNNER_KEY
from test_runner import run
from tollgate_client import (
    AsyncClient,
    Check,
    Client,
    ClientConfig,
    Rejected,
    Subject,
    Unavailable,
    VerdictAnswer,
    encode_request,
)

SUBJECT = Subject(peer="198.51.100.7", account="alice")
KEY = bytes([7] * 32)
DENY = 3


def client_for(daemon, **settings):
    settings.setdefault("timeout", 0.5)
    return Client(ClientConfig(daemon.path, password_key=KEY, **settings))


def with_field(name, value):
    fields = {"peer": "198.51.100.7", "account": "alice", name: value}
    return Subject(**fields)


class RefusedBeforeSending(unittest.TestCase):
    def assert_refused(self, answer, code, field=None):
        self.assertIsInstance(answer, Rejected)
        self.assertEqual(answer.error.code.label, code)
        self.assertFalse(answer.proceeds)
        if field is not None:
            self.assertIn("`subject.{}`".format(field), answer.error.message)
            self.assertIn("refused before sending", answer.error.message)

    def test_an_identifier_over_512_bytes_is_refused_for_every_request(self):
        with FakeDaemon() as daemon, client_for(daemon) as client:
            for field in ("account", "device", "tenant", "client_id"):
                for value in ("x" * 513, "é" * 257):  # 513 and 514 UTF-8 bytes
                    subject = with_field(field, value)
                    with self.subTest(field=field, chars=len(value)):
                        self.assert_refused(client.check("login", subject), "field_too_long", field)
                        self.assert_refused(client.report("login", subject, False), "field_too_long", field)
                        self.assert_refused(client.abandon("login", subject), "field_too_long", field)
            self.assertEqual((daemon.connections, daemon.requests), (0, []), "nothing touched the socket")
            for field in ("account", "device", "tenant", "client_id"):
                answer = client.check("login", with_field(field, "é" * 256))  # exactly 512 bytes
                self.assertIsInstance(answer, VerdictAnswer)
            self.assertEqual(len(daemon.requests), 4)

    def test_a_padded_identifier_does_not_fail_open_on_a_dead_socket(self):
        dead = os.path.join(tempfile.mkdtemp(), "none.sock")
        with Client(ClientConfig(dead)) as client:
            self.assertIsInstance(client.check("login", SUBJECT), Unavailable)
            padded = with_field("client_id", "p" * 250_000)
            self.assert_refused(client.check("login", padded), "field_too_long", "client_id")

    def test_a_payload_over_16384_bytes_is_refused_and_16384_is_sent(self):
        fixed = len(encode_request(5, 0, Check("", SUBJECT))) - 4
        with FakeDaemon() as daemon, client_for(daemon) as client:
            self.assert_refused(client.check("r" * (16385 - fixed), SUBJECT), "frame_too_large")
            self.assert_refused(client.report("r" * 100_000, SUBJECT, True), "frame_too_large")
            self.assert_refused(client.abandon("r" * 100_000, SUBJECT), "frame_too_large")
            self.assertEqual(daemon.requests, [])
            self.assertIsInstance(client.check("r" * (16384 - fixed), SUBJECT), VerdictAnswer)
            self.assertEqual(len(daemon.requests[0][4]), 16384)

    def test_a_huge_forwarded_for_is_cut_not_refused(self):
        with FakeDaemon() as daemon, client_for(daemon) as client:
            subject = with_field("forwarded_for", ", ".join(["203.0.113.9"] * 30_000))
            self.assertIsInstance(client.check("login", subject), VerdictAnswer)

    def test_a_refused_check_spends_no_static_budget_and_enters_no_burst(self):
        dead = os.path.join(tempfile.mkdtemp(), "none.sock")
        config = ClientConfig(dead).static_budget("password_reset", 1, 60.0, 1)
        with Client(config) as client:
            padded = with_field("device", "d" * 600)
            for _ in range(3):
                self.assert_refused(client.check("password_reset", padded), "field_too_long", "device")
            self.assertEqual(client._bursts._entries, {})
            answer = client.check("password_reset", SUBJECT)
            self.assertTrue(answer.within_static_budget, "the budget's one unit is still there")

    def test_a_guard_whose_check_was_refused_holds_nothing(self):
        with FakeDaemon() as daemon, client_for(daemon) as client:
            padded = with_field("client_id", "c" * 600)
            with client.attempt("login", padded, password="hunter2") as attempt:
                self.assert_refused(attempt.answer, "field_too_long", "client_id")
                self.assertFalse(attempt.proceeds)
            self.assertFalse(attempt.abandoned)
            self.assertEqual(daemon.requests, [])

    def test_the_asyncio_client_refuses_too(self):
        async def scenario(daemon):
            client = AsyncClient(ClientConfig(daemon.path, timeout=0.5))
            padded = with_field("tenant", "t" * 513)
            answers = [
                await client.check("login", padded),
                await client.report("login", padded, False),
                await client.abandon("login", padded),
                await client.check("r" * 20_000, SUBJECT),
            ]
            async with client.attempt("login", padded) as attempt:
                answers.append(attempt.answer)
            self.assertFalse(attempt.abandoned)
            client.close()
            return answers

        with FakeDaemon() as daemon:
            answers = asyncio.run(scenario(daemon))
            codes = [a.error.code.label for a in answers]
            self.assertEqual(codes, ["field_too_long"] * 3 + ["frame_too_large", "field_too_long"])
            self.assertEqual(daemon.connections, 0)

    def test_the_runner_reports_the_refusal(self):
        dead = os.path.join(tempfile.mkdtemp(), "none.sock")
        replies = run(
            {"op": "open", "socket": dead, "key": RUNNER_KEY},
            {"op": "check", "route": "login", "subject": {"peer": "198.51.100.7", "client_id": "c" * 600}},
        )
        self.assertEqual(
            replies[1], {"answer": "rejected", "proceeds": False, "code": "field_too_long", "retry_after_s": 1}
        )


def deny(daemon, version, request_id, variant, body):
    return verdict_payload(version, request_id, decision=DENY, retry_after_ms=60_000)


class ReplyBeatsTheTimer(unittest.TestCase):
    def held_past_the_deadline(self, daemon, after=None):
        """The client's thread is held (as by the GIL) after its write until
        the reply is buffered and the deadline has passed."""
        send = client_module._send

        def send_then_stall(sock, frame, deadline):
            send(sock, frame, deadline)
            sent = len(daemon.requests)
            until = time.monotonic() + 2.0
            while len(daemon.requests) == sent and time.monotonic() < until:
                time.sleep(0.005)
            time.sleep(0.05)
            if after is not None:
                after()
            self.assertLess(deadline, time.monotonic())

        return mock.patch.object(client_module, "_send", send_then_stall)

    def test_a_reply_there_by_the_deadline_is_the_answer(self):
        with FakeDaemon(deny) as daemon, client_for(daemon) as client:
            client.check("login", SUBJECT)  # a pooled connection: no connect in the short deadline
            client.config.timeout = 0.02
            with self.held_past_the_deadline(daemon):
                answer = client.check("login", SUBJECT)
            client.config.timeout = 0.5
            self.assertIsInstance(answer, VerdictAnswer, "a refusal that arrived must not fail open")
            self.assertFalse(answer.proceeds)
            self.assertIsInstance(client.check("login", SUBJECT), VerdictAnswer)
            self.assertEqual(daemon.connections, 1, "the connection was clean and reused")

    def test_a_clock_past_the_deadline_still_reads_the_buffered_reply(self):
        with FakeDaemon(deny) as daemon, client_for(daemon, timeout=0.2) as client:
            client.check("login", SUBJECT)  # a pooled connection
            real = time.monotonic
            jumped = []

            def clock():
                return real() + (3600.0 if jumped else 0.0)

            with self.held_past_the_deadline(daemon, after=lambda: jumped.append(True)):
                with mock.patch.object(client_module.time, "monotonic", clock):
                    answer = client.check("login", SUBJECT)
            self.assertIsInstance(answer, VerdictAnswer)
            self.assertFalse(answer.proceeds)

    def test_a_silent_daemon_still_times_out(self):
        with FakeDaemon(silent) as daemon, client_for(daemon, timeout=0.02) as client:
            started = time.monotonic()
            answer = client.check("login", SUBJECT)
            self.assertLess(time.monotonic() - started, 1.0)
            self.assertIsInstance(answer, Unavailable)
            self.assertEqual(answer.error.kind, "timeout")
            with self.held_past_the_deadline(daemon):
                answer = client.check("login", SUBJECT)
            self.assertEqual((type(answer), answer.error.kind), (Unavailable, "timeout"))
            self.assertEqual(daemon.connections, 2, "a timed-out connection is closed")


class EndedGuard(unittest.TestCase):
    def test_nothing_is_reported_after_an_abandon_or_the_end(self):
        with FakeDaemon(allow_all) as daemon, client_for(daemon) as client:
            with client.attempt("login", SUBJECT) as attempt:
                attempt.abandon()
                self.assertRaises(RuntimeError, attempt.report, False)
            self.assertRaises(RuntimeError, attempt.report, False)
            with client.attempt("login", SUBJECT) as left:
                pass
            self.assertRaises(RuntimeError, left.report, False)
            self.assertEqual(daemon.variants(), [0, 8, 0, 8])

    def test_a_guard_holding_no_place_ends_too(self):
        with FakeDaemon(deny) as daemon, client_for(daemon) as client:
            with client.attempt("login", SUBJECT) as attempt:
                self.assertFalse(attempt.proceeds)
            self.assertRaises(RuntimeError, attempt.report, False)
            with client.attempt("login", SUBJECT) as abandoned:
                self.assertIsNone(abandoned.abandon())
                self.assertRaises(RuntimeError, abandoned.report, False)
            self.assertEqual(daemon.variants(), [0, 0])

    def test_the_asyncio_guard_ends_the_same_way(self):
        async def scenario(client):
            async with client.attempt("login", SUBJECT) as attempt:
                await attempt.abandon()
                with self.assertRaises(RuntimeError):
                    await attempt.report(False)
            with self.assertRaises(RuntimeError):
                await attempt.report(False)
            async with client.attempt("login", SUBJECT) as left:
                pass
            with self.assertRaises(RuntimeError):
                await left.report(False)
            async with client.attempt("login", SUBJECT) as reported:
                await reported.report(False)
                with self.assertRaises(RuntimeError):
                    await reported.report(True)
            client.close()

        with FakeDaemon(allow_all) as daemon:
            asyncio.run(scenario(AsyncClient(ClientConfig(daemon.path, timeout=0.5))))
            self.assertEqual(daemon.variants(), [0, 8, 0, 8, 0, 1])


if __name__ == "__main__":
    unittest.main()
