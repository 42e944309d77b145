"""The asyncio client against the stand-in daemon."""

import asyncio
import threading
import time
import unittest

from fake_daemon import FakeDaemon, InTimeThenLate, allow_all, silent, verdict_payload, version_1_only
from tollgate_client import AsyncClient, ClientConfig, Rejected, Subject, VerdictAnswer
from tollgate_client.client import LATE_LISTENERS_MAX

SUBJECT = Subject(peer="198.51.100.7", account="alice")
KEY = bytes([7] * 32)


def client_for(daemon, **settings):
    settings.setdefault("timeout", 0.5)
    return AsyncClient(ClientConfig(daemon.path, password_key=KEY, **settings))


def slow(delay):
    def handler(daemon, version, request_id, variant, body):
        if variant == 0:
            time.sleep(delay)
        return verdict_payload(version, request_id)

    return handler


async def until(condition, seconds=2.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


class AsyncCalls(unittest.IsolatedAsyncioTestCase):
    async def test_check_report_and_one_pooled_connection(self):
        with FakeDaemon(allow_all) as daemon:
            client = client_for(daemon)
            self.assertIsInstance(await client.check("login", SUBJECT), VerdictAnswer)
            self.assertEqual((await client.report("login", SUBJECT, False)).version, 5)
            self.assertEqual((daemon.connections, daemon.variants()), (1, [0, 1]))
            client.close()

    async def test_an_old_daemon_steps_down(self):
        with FakeDaemon(version_1_only) as daemon:
            client = client_for(daemon)
            self.assertEqual((await client.check("login", SUBJECT)).version, 1)
            self.assertIsInstance(await client.abandon("login", SUBJECT), Rejected)
            self.assertEqual(daemon.versions(), [5, 4, 3, 2, 1, 1])
            client.close()

    async def test_a_silent_daemon_times_out_and_a_burst_is_busy(self):
        answered = threading.Event()

        def first_only(daemon, version, request_id, variant, body):
            if answered.is_set():
                return None
            answered.set()
            return verdict_payload(version, request_id)

        with FakeDaemon(first_only) as daemon:
            client = client_for(daemon, timeout=0.05)
            await client.check("login", SUBJECT)
            burst = await asyncio.gather(*[client.check("login", SUBJECT) for _ in range(3)])
            self.assertEqual({a.error.kind for a in burst}, {"busy"})
            await asyncio.sleep(0.06)
            lone = await client.check("login", Subject(peer="198.51.100.7", account="erin"))
            self.assertEqual((lone.error.kind, lone.proceeds), ("timeout", True))
            client.close()

    async def overlap_from_two_addresses_twice(self, known):
        answering = threading.Event()
        answering.set()

        def handler(daemon, version, request_id, variant, body):
            return verdict_payload(version, request_id) if answering.is_set() else None

        victim = Subject(peer="198.51.100.7", account="alice")
        other = Subject(peer="203.0.113.9", account="alice")
        with FakeDaemon(handler) as daemon:
            client = client_for(daemon, timeout=0.03, busy_max=0.5)
            self.assertIsInstance(await client.check("login", Subject(account="bob")), VerdictAnswer)
            if known:
                self.assertIsInstance(await client.report("login", victim, True), VerdictAnswer)
            answering.clear()
            first = await asyncio.gather(client.check("login", victim), client.check("login", other))
            refused = time.monotonic()
            self.assertEqual([(a.error.kind, a.proceeds) for a in first], [("busy", False)] * 2)
            await asyncio.sleep(0.55)
            answering.set()
            self.assertIsInstance(await client.check("login", Subject(account="bob")), VerdictAnswer)
            answering.clear()
            self.assertGreaterEqual(time.monotonic() - refused, 0.5)
            again = await asyncio.gather(client.check("login", victim), client.check("login", other))
            own = await asyncio.gather(client.check("login", victim), client.check("login", victim))
            self.assertEqual([(a.error.kind, a.proceeds) for a in own], [("busy", False)] * 2)
            client.close()
            return again

    async def test_a_burst_on_one_account_from_other_addresses_is_busy_for_busy_max_only(self):
        # Only the address a success was reported for leaves busy.
        again = await self.overlap_from_two_addresses_twice(known=True)
        self.assertEqual([(a.error.kind, a.proceeds) for a in again], [("timeout", True), ("busy", False)])

    async def test_a_burst_on_one_account_from_unknown_addresses_stays_busy(self):
        again = await self.overlap_from_two_addresses_twice(known=False)
        self.assertEqual([(a.error.kind, a.proceeds) for a in again], [("busy", False)] * 2)

    async def late_for_longer_than(self, client, handler, seconds):
        """Answers every call late for `seconds` while the client bursts on
        one account; returns the bursts."""
        handler.mode = InTimeThenLate.LATE
        started = time.monotonic()
        bursts = []
        while time.monotonic() - started < seconds:
            bursts.append(await asyncio.gather(client.check("login", SUBJECT), client.check("login", SUBJECT)))
            await asyncio.sleep(0.03)
        return bursts

    async def test_a_daemon_answering_every_call_late_for_longer_than_busy_max_is_busy(self):
        # As the synchronous client's test: 80 ms late on a 20 ms deadline
        # for far longer than busy_max, and its late replies keep it busy.
        handler = InTimeThenLate(delay=0.08)
        with FakeDaemon(handler) as daemon:
            client = client_for(daemon, busy_max=0.4)
            self.assertIsInstance(await client.check("login", SUBJECT), VerdictAnswer)
            client.config.timeout = 0.02
            bursts = await self.late_for_longer_than(client, handler, 0.7)
            last = await asyncio.gather(client.check("login", SUBJECT), client.check("login", SUBJECT))
            self.assertEqual([(a.error.kind, a.proceeds) for a in last], [("busy", False)] * 2)
            self.assertFalse(any(a.proceeds for burst in bursts for a in burst), "no late guess proceeds")
            client.close()

    async def test_a_daemon_silent_for_longer_than_busy_max_after_late_answers_is_down(self):
        handler = InTimeThenLate(delay=0.08)
        with FakeDaemon(handler) as daemon:
            client = client_for(daemon, busy_max=0.4)
            self.assertIsInstance(await client.check("login", SUBJECT), VerdictAnswer)
            client.config.timeout = 0.02
            await self.late_for_longer_than(client, handler, 0.6)
            late = await asyncio.gather(client.check("login", SUBJECT), client.check("login", SUBJECT))
            self.assertEqual([(a.error.kind, a.proceeds) for a in late], [("busy", False)] * 2)
            handler.mode = InTimeThenLate.SILENT
            # As the synchronous client's test: the last late reply, then
            # the next burst's timeouts begin a new run, then busy_max.
            silent_since = time.monotonic()
            while time.monotonic() - silent_since < 0.08 + 0.05 + 0.4 + 0.1:
                await asyncio.gather(client.check("login", SUBJECT), client.check("login", SUBJECT))
                await asyncio.sleep(0.03)
            down = await asyncio.gather(client.check("login", SUBJECT), client.check("login", SUBJECT))
            self.assertEqual([(a.error.kind, a.proceeds) for a in down], [("timeout", True)] * 2)
            self.assertNotIn("busy", str(down[0].error))
            client.close()

    async def test_a_burst_after_a_quiet_gap_longer_than_busy_max_at_a_late_daemon_is_busy(self):
        # As the synchronous client's test: a late reply heard after the
        # old run, then a quiet gap longer than busy_max; the burst begins
        # a new run and is busy.
        handler = InTimeThenLate(delay=0.08)
        with FakeDaemon(handler) as daemon:
            client = client_for(daemon, busy_max=0.4)
            self.assertIsInstance(await client.check("login", SUBJECT), VerdictAnswer)
            client.config.timeout = 0.02
            handler.mode = InTimeThenLate.LATE
            lone = await client.check("login", SUBJECT)
            self.assertIn(lone.error.kind, {"timeout", "busy"}, "the lone call times out")
            await until(lambda: client._last_heard_us != 0)
            self.assertNotEqual(client._last_heard_us, 0, "the lone call's late reply is heard")
            await asyncio.sleep(0.5)
            burst = await asyncio.gather(client.check("login", SUBJECT), client.check("login", SUBJECT))
            self.assertEqual([(a.error.kind, a.proceeds) for a in burst], [("busy", False)] * 2)
            client.close()

    async def test_close_closes_the_connections_kept_for_late_replies(self):
        # busy_max is long: only close() can end these connections soon.
        with FakeDaemon(silent) as daemon:
            client = client_for(daemon, timeout=0.03, busy_max=5.0)
            subjects = [Subject(peer="198.51.100.7", account="user{}".format(i)) for i in range(3)]
            await asyncio.gather(*[client.check("login", subject) for subject in subjects])
            await until(lambda: daemon.connections == 3)
            self.assertEqual(daemon.connections_open(), 3, "kept open to hear a late reply")
            self.assertEqual(len(client._late_listeners), 3)
            closed = time.monotonic()
            client.close()
            await until(lambda: daemon.connections_open() == 0, 1.0)
            self.assertEqual(daemon.connections_open(), 0, "closed with the client")
            self.assertLess(time.monotonic() - closed, 1.0)
            self.assertEqual(len(client._late_listeners), 0, "the listeners ended")
            # The client stays usable: a timed-out call is listened on again.
            self.assertEqual((await client.check("login", SUBJECT)).error.kind, "timeout")
            # Handed over once its cancelled exchange runs, after the call.
            await until(lambda: daemon.connections == 4 and len(client._late_listeners) == 1)
            self.assertEqual((daemon.connections_open(), len(client._late_listeners)), (1, 1))
            client.close()

    async def test_at_most_late_listeners_max_timed_out_connections_stay_open(self):
        calls = LATE_LISTENERS_MAX + 4
        with FakeDaemon(silent) as daemon:
            client = client_for(daemon, timeout=0.05, busy_max=1.0)
            subjects = [Subject(peer="198.51.100.7", account="user{}".format(i)) for i in range(calls)]
            answers = await asyncio.gather(*[client.check("login", subject) for subject in subjects])
            self.assertEqual({a.error.kind for a in answers}, {"timeout"})
            # The fake daemon accepts each in its own time on a loaded host.
            await until(lambda: daemon.connections == calls)
            self.assertEqual(daemon.connections, calls)
            await until(lambda: daemon.connections_open() <= LATE_LISTENERS_MAX, 0.3)
            self.assertEqual(daemon.connections_open(), LATE_LISTENERS_MAX)
            await until(lambda: daemon.connections_open() == 0)
            self.assertEqual(daemon.connections_open(), 0, "each is closed when its window ends")

    async def test_a_dead_socket_gets_the_fail_policy(self):
        client = AsyncClient("/nonexistent/t.sock")
        self.assertTrue((await client.check("login", SUBJECT)).proceeds)
        self.assertFalse((await client.check("token", SUBJECT)).proceeds)


class AsyncGuard(unittest.IsolatedAsyncioTestCase):
    async def test_leaving_without_a_report_abandons(self):
        with FakeDaemon(allow_all) as daemon:
            client = client_for(daemon)
            with self.assertRaises(KeyError):
                async with client.attempt("login", SUBJECT, password="hunter2") as attempt:
                    self.assertTrue(attempt.proceeds)
                    raise KeyError("verify failed")
            self.assertTrue(attempt.abandoned)
            self.assertEqual(daemon.variants(), [0, 8])
            async with client.attempt("login", SUBJECT, password="hunter2") as attempt:
                await attempt.report(True)
            self.assertEqual(daemon.variants(), [0, 8, 0, 1])
            client.close()

    async def test_an_unanswered_check_is_not_abandoned(self):
        with FakeDaemon(silent) as daemon:
            client = client_for(daemon, timeout=0.03)
            async with client.attempt("login", SUBJECT) as attempt:
                self.assertTrue(attempt.proceeds)
            self.assertFalse(attempt.abandoned)
            self.assertEqual(daemon.variants(), [0])

    async def test_a_handler_cancelled_during_its_check_abandons_once_allowed(self):
        with FakeDaemon(slow(0.1)) as daemon:
            client = client_for(daemon)

            async def handler():
                async with client.attempt("login", SUBJECT):
                    raise AssertionError("never reached")

            task = asyncio.ensure_future(handler())
            await asyncio.sleep(0.03)
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            await until(lambda: daemon.variants() == [0, 8])
            self.assertEqual(daemon.variants(), [0, 8])
            client.close()

    async def test_a_handler_cancelled_during_its_report_still_reports(self):
        def slow_report(daemon, version, request_id, variant, body):
            if variant == 1:
                time.sleep(0.1)
            return verdict_payload(version, request_id)

        with FakeDaemon(slow_report) as daemon:
            client = client_for(daemon)

            async def handler():
                async with client.attempt("login", SUBJECT) as attempt:
                    await attempt.report(False)

            task = asyncio.ensure_future(handler())
            await asyncio.sleep(0.03)
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            await until(lambda: len(client._background) == 0)
            self.assertEqual(daemon.variants(), [0, 1], "reported, never abandoned")
            client.close()


if __name__ == "__main__":
    unittest.main()
