"""The call path against a stand-in daemon: pooling, version fallback,
timeouts, the busy rule, broken replies and the attempt guard."""

import gc
import os
import select
import signal
import struct
import threading
import time
import unittest
import warnings
import weakref

from fake_daemon import FakeDaemon, InTimeThenLate, allow_all, error_payload, silent, verdict_payload, version_1_only
from tollgate_client import Client, ClientConfig, Rejected, Subject, Unavailable, VerdictAnswer
from tollgate_client.client import LATE_LISTENERS_MAX

SUBJECT = Subject(peer="198.51.100.7", account="alice")
KEY = bytes([7] * 32)


def client_for(daemon, **settings):
    settings.setdefault("timeout", 0.5)
    return Client(ClientConfig(daemon.path, password_key=KEY, **settings))


def wait_until(condition, seconds=2.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


class CallPath(unittest.TestCase):
    def test_a_connection_is_reused_and_ids_count_up(self):
        with FakeDaemon() as daemon, client_for(daemon) as client:
            for _ in range(3):
                answer = client.check("login", SUBJECT)
                self.assertIsInstance(answer, VerdictAnswer)
                self.assertEqual(answer.version, 5)
            self.assertEqual(daemon.connections, 1)
            self.assertEqual([r[2] for r in daemon.requests], [1, 2, 3])

    def test_a_pooled_connection_the_daemon_closed_is_replaced(self):
        with FakeDaemon() as daemon, client_for(daemon) as client:
            client.check("login", SUBJECT)
            daemon.drop_connections()
            time.sleep(0.05)
            self.assertIsInstance(client.check("login", SUBJECT), VerdictAnswer)
            self.assertEqual(daemon.connections, 2)

    def test_an_old_daemon_steps_the_connection_down_and_it_stays_down(self):
        with FakeDaemon(version_1_only) as daemon, client_for(daemon) as client:
            answer = client.check("login", SUBJECT, password_tag=bytes(16))
            self.assertEqual((type(answer), answer.version), (VerdictAnswer, 1))
            self.assertEqual(daemon.versions(), [5, 4, 3, 2, 1])
            check_v1 = daemon.requests[-1][4]
            self.assertEqual(len(check_v1), 53, "as check-login-v4: no tag in version 1")
            client.report("login", SUBJECT, False)
            self.assertEqual(daemon.versions()[-1], 1, "the connection keeps its version")
            # An abandon on a connection below version 5 goes out in its
            # version and is refused (malformed), as the Rust client's is.
            abandon = client.abandon("login", SUBJECT)
            self.assertIsInstance(abandon, Rejected)
            self.assertEqual(abandon.error.code.label, "malformed")
            self.assertEqual(daemon.connections, 1)

    def test_the_first_version_is_configurable(self):
        with FakeDaemon() as daemon, client_for(daemon, protocol_version=3) as client:
            self.assertEqual(client.check("login", SUBJECT).version, 3)

    def test_a_daemon_error_is_a_rejection(self):
        def unknown_route(daemon, version, request_id, variant, body):
            return error_payload(version, request_id, 2, "unknown route `logn`")

        with FakeDaemon(unknown_route) as daemon, client_for(daemon) as client:
            answer = client.check("logn", SUBJECT)
            self.assertEqual((answer.error.code.label, answer.proceeds), ("unknown_route", False))

    def broken(self, reply):
        def handler(daemon, version, request_id, variant, body):
            return reply(version, request_id)

        with FakeDaemon(handler) as daemon, client_for(daemon) as client:
            answers = [client.check("login", SUBJECT) for _ in range(2)]
            self.assertEqual(daemon.connections, 2, "a broken connection is never reused")
            return answers[0]

    def test_broken_replies_are_protocol_errors_and_close_the_connection(self):
        cases = {
            "wrong id": lambda v, i: verdict_payload(v, i + 1),
            "trailing byte": lambda v, i: verdict_payload(v, i) + b"\x00",
            "a status reply": lambda v, i: struct.pack("<BQI", v, i, 3) + b"\x02\x00\x00\x00",
        }
        for name, reply in cases.items():
            with self.subTest(name):
                answer = self.broken(reply)
                self.assertEqual((type(answer), answer.error.kind, answer.proceeds), (Unavailable, "protocol", True))

    def test_a_reply_over_8_mib_is_refused_from_its_length(self):
        def liar(daemon, version, request_id, variant, body):
            daemon.open[-1].sendall(struct.pack("<I", 8 * 1024 * 1024 + 1))
            return None

        with FakeDaemon(liar) as daemon, client_for(daemon) as client:
            answer = client.check("login", SUBJECT)
            self.assertEqual(answer.error.kind, "protocol")

    def test_an_id_0_error_answers_the_request(self):
        with FakeDaemon(lambda d, v, i, k, b: error_payload(1, 0, 0, "short")) as daemon, client_for(daemon) as client:
            self.assertEqual(client.check("login", SUBJECT).error.code.label, "malformed")


class Timeouts(unittest.TestCase):
    def test_a_silent_daemon_times_out_and_the_connection_is_closed(self):
        with FakeDaemon(silent) as daemon, client_for(daemon, timeout=0.03) as client:
            started = time.monotonic()
            answer = client.check("login", SUBJECT)
            self.assertLess(time.monotonic() - started, 2.0)  # the deadline ends the wait
            self.assertEqual((answer.error.kind, answer.proceeds), ("timeout", True))
            self.assertFalse(client.check("password_reset", SUBJECT).proceeds)
            self.assertEqual(daemon.connections, 2)

    def answered_then_silent(self):
        state = {"answered": 0}

        def handler(daemon, version, request_id, variant, body):
            if state["answered"] >= 1:
                return None
            state["answered"] += 1
            return verdict_payload(version, request_id)

        return FakeDaemon(handler)

    def overlapping_checks(self, client, subjects):
        answers = [None] * len(subjects)
        start = threading.Barrier(len(subjects))

        def one(i):
            start.wait()
            answers[i] = client.check("login", subjects[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(subjects))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return answers

    def test_a_burst_on_one_account_at_a_daemon_that_answered_is_busy(self):
        with self.answered_then_silent() as daemon, client_for(daemon, timeout=0.05) as client:
            self.assertIsInstance(client.check("login", SUBJECT), VerdictAnswer)
            answers = self.overlapping_checks(client, [SUBJECT] * 4)
            self.assertEqual({a.error.kind for a in answers}, {"busy"})
            self.assertFalse(any(a.proceeds for a in answers), "busy never proceeds, even on an open route")
            self.assertTrue(all("busy" in str(a.error) for a in answers), "a busy error says so")

    def test_a_lone_timeout_is_an_outage(self):
        with self.answered_then_silent() as daemon, client_for(daemon, timeout=0.05) as client:
            client.check("login", SUBJECT)
            time.sleep(0.06)
            answer = client.check("login", Subject(peer="198.51.100.7", account="erin"))
            self.assertEqual((answer.error.kind, answer.proceeds), ("timeout", True))
            # Taken for busy first, then downgraded: the message is a plain timeout's.
            self.assertEqual(str(answer.error), "no answer within 0.05 s")
            self.assertNotIn("busy", str(answer.error))

    def test_a_daemon_never_heard_from_is_not_busy(self):
        with FakeDaemon(silent) as daemon, client_for(daemon, timeout=0.05) as client:
            answers = self.overlapping_checks(client, [SUBJECT] * 3)
            self.assertEqual({a.error.kind for a in answers}, {"timeout"})

    def test_busy_max_zero_makes_every_timeout_an_outage(self):
        with self.answered_then_silent() as daemon, client_for(daemon, timeout=0.05, busy_max=0.0) as client:
            client.check("login", SUBJECT)
            answers = self.overlapping_checks(client, [SUBJECT] * 3)
            self.assertEqual({a.error.kind for a in answers}, {"timeout"})

    def test_a_run_of_timeouts_older_than_busy_max_is_an_outage(self):
        with self.answered_then_silent() as daemon, client_for(daemon, timeout=0.03, busy_max=0.1) as client:
            client.check("login", SUBJECT)
            first = self.overlapping_checks(client, [SUBJECT] * 2)
            self.assertEqual({a.error.kind for a in first}, {"busy"})
            time.sleep(0.12)
            later = self.overlapping_checks(client, [SUBJECT] * 2)
            self.assertEqual({a.error.kind for a in later}, {"timeout"})

    def test_a_daemon_that_answered_in_time_within_busy_max_is_busy_in_an_old_run(self):
        # Bursts closer together than busy_max: the answer between them
        # comes too soon to end the run, which grows older than busy_max;
        # a late burst then must still not proceed.
        answering = {"on": True}

        def handler(daemon, version, request_id, variant, body):
            return verdict_payload(version, request_id) if answering["on"] else None

        with FakeDaemon(handler) as daemon, client_for(daemon, timeout=0.03, busy_max=0.6) as client:
            client.check("login", SUBJECT)
            answering["on"] = False
            first = self.overlapping_checks(client, [SUBJECT] * 2)
            # The run began just before: timed from here, the late burst
            # meets a run older than busy_max however slow the start was.
            started = time.monotonic()
            self.assertEqual({a.error.kind for a in first}, {"busy"})
            answering["on"] = True
            time.sleep(0.2)
            self.assertIsInstance(client.check("login", Subject(account="bob")), VerdictAnswer)
            time.sleep(max(0.0, 0.65 - (time.monotonic() - started)))
            answering["on"] = False
            late = self.overlapping_checks(client, [SUBJECT] * 2)
            self.assertEqual({a.error.kind for a in late}, {"busy"}, "answered in time within busy_max")
            self.assertFalse(any(a.proceeds for a in late))
            time.sleep(0.65)
            gone = self.overlapping_checks(client, [SUBJECT] * 2)
            self.assertEqual({a.error.kind for a in gone}, {"timeout"}, "nothing in time for busy_max")

    def late_for_longer_than(self, client, handler, seconds):
        """Answers every call late for `seconds` while the client bursts on
        one account, as an attacker's load would; returns the bursts."""
        handler.mode = InTimeThenLate.LATE
        started = time.monotonic()
        bursts = []
        while time.monotonic() - started < seconds:
            bursts.append(self.overlapping_checks(client, [SUBJECT] * 2))
            time.sleep(0.03)
        return bursts

    def test_a_daemon_answering_every_call_late_for_longer_than_busy_max_is_busy(self):
        # It answered in time once, then each reply comes 80 ms after a
        # call with a 20 ms deadline: no answer in time for far longer than
        # busy_max, yet it is alive. Its late replies keep it busy.
        handler = InTimeThenLate(delay=0.08)
        with FakeDaemon(handler) as daemon, client_for(daemon, busy_max=0.4) as client:
            self.assertIsInstance(client.check("login", SUBJECT), VerdictAnswer)
            client.config.timeout = 0.02
            bursts = self.late_for_longer_than(client, handler, 0.7)
            # The run and the answer in time are older than busy_max now.
            last = self.overlapping_checks(client, [SUBJECT] * 2)
            self.assertEqual([(a.error.kind, a.proceeds) for a in last], [("busy", False)] * 2)
            self.assertFalse(any(a.proceeds for burst in bursts for a in burst), "no late guess proceeds")

    def test_a_daemon_silent_for_longer_than_busy_max_after_late_answers_is_down(self):
        handler = InTimeThenLate(delay=0.08)
        with FakeDaemon(handler) as daemon, client_for(daemon, busy_max=0.4) as client:
            self.assertIsInstance(client.check("login", SUBJECT), VerdictAnswer)
            client.config.timeout = 0.02
            self.late_for_longer_than(client, handler, 0.6)
            late = self.overlapping_checks(client, [SUBJECT] * 2)
            self.assertEqual([(a.error.kind, a.proceeds) for a in late], [("busy", False)] * 2)
            handler.mode = InTimeThenLate.SILENT
            # The last late replies come up to 80 ms after this, and the
            # next burst's timeouts (up to 50 ms later) begin a new run;
            # then nothing at all for longer than busy_max, while the
            # bursts go on.
            silent_since = time.monotonic()
            while time.monotonic() - silent_since < 0.08 + 0.05 + 0.4 + 0.1:
                self.overlapping_checks(client, [SUBJECT] * 2)
                time.sleep(0.03)
            down = self.overlapping_checks(client, [SUBJECT] * 2)
            self.assertEqual([(a.error.kind, a.proceeds) for a in down], [("timeout", True)] * 2)
            self.assertNotIn("busy", str(down[0].error))

    def test_a_burst_after_a_quiet_gap_longer_than_busy_max_at_a_late_daemon_is_busy(self):
        # The daemon is kept late by load that does not come through this
        # client. One lone late call, its late reply heard, then no call at
        # all for longer than busy_max: the run of timeouts, the answer in
        # time and the late reply are all older than busy_max. A burst then
        # times out before any of its own late replies can be heard; the
        # reply heard after the old run shows the daemon alive, so the burst
        # begins a new run and is busy.
        handler = InTimeThenLate(delay=0.08)
        with FakeDaemon(handler) as daemon, client_for(daemon, busy_max=0.4) as client:
            self.assertIsInstance(client.check("login", SUBJECT), VerdictAnswer)
            client.config.timeout = 0.02
            handler.mode = InTimeThenLate.LATE
            lone = client.check("login", SUBJECT)
            self.assertIn(lone.error.kind, {"timeout", "busy"}, "the lone call times out")
            wait_until(lambda: client._last_heard_us != 0)
            self.assertNotEqual(client._last_heard_us, 0, "the lone call's late reply is heard")
            time.sleep(0.5)
            burst = self.overlapping_checks(client, [SUBJECT] * 2)
            self.assertEqual([(a.error.kind, a.proceeds) for a in burst], [("busy", False)] * 2)

    def test_close_closes_the_connections_kept_for_late_replies(self):
        # busy_max is long: only close() can end these connections soon.
        with FakeDaemon(silent) as daemon, client_for(daemon, timeout=0.03, busy_max=5.0) as client:
            subjects = [Subject(peer="198.51.100.7", account="user{}".format(i)) for i in range(3)]
            self.overlapping_checks(client, subjects)
            wait_until(lambda: daemon.connections == 3)
            self.assertEqual(daemon.connections_open(), 3, "kept open to hear a late reply")
            closed = time.monotonic()
            client.close()
            wait_until(lambda: daemon.connections_open() == 0, 1.0)
            self.assertEqual(daemon.connections_open(), 0, "closed with the client")
            self.assertLess(time.monotonic() - closed, 1.0)
            wait_until(lambda: client._late_listeners._wake is None, 1.0)
            self.assertIsNone(client._late_listeners._wake, "the listener thread ended")
            self.assertEqual(client._late_listeners._held, 0)
            # The client stays usable: a timed-out call is listened on again.
            self.assertEqual(client.check("login", SUBJECT).error.kind, "timeout")
            wait_until(lambda: daemon.connections == 4)
            self.assertEqual((daemon.connections_open(), client._late_listeners._held), (1, 1))

    def test_a_client_that_listened_is_still_collected(self):
        # The fork hook holds the late listeners weakly: a client dropped
        # after its listener thread ended is freed.
        with FakeDaemon(silent) as daemon:
            client = client_for(daemon, timeout=0.03, busy_max=0.1)
            client.check("login", SUBJECT)
            wait_until(lambda: client._late_listeners._wake is None)
            # The thread holds the client until its run returns.
            wait_until(lambda: not any(t.name == "tollgate-late-listener" for t in threading.enumerate()))
            gone = weakref.ref(client)
            del client
            gc.collect()
            self.assertIsNone(gone(), "the client was collected")

    @unittest.skipUnless(hasattr(os, "fork") and hasattr(os, "register_at_fork"), "no fork here")
    def test_a_forked_child_listens_for_late_replies_again(self):
        # Forked while the listener thread holds three connections and
        # another thread holds its lock: the child has neither thread. It
        # must not wait for the lock forever, nor count the parent's
        # connections against its cap, and its own timed-out call is
        # listened on by a thread of its own.
        with FakeDaemon(silent) as daemon, client_for(daemon, timeout=0.03, busy_max=5.0) as client:
            listeners = client._late_listeners
            subjects = [Subject(peer="198.51.100.7", account="user{}".format(i)) for i in range(3)]
            self.overlapping_checks(client, subjects)
            wait_until(lambda: len(listeners._listening) == 3)
            inherited = list(listeners._listening)
            self.assertEqual((len(inherited), listeners._held), (3, 3))
            holding, forked = threading.Event(), threading.Event()

            def hold_the_lock():
                with listeners._lock:
                    holding.set()
                    forked.wait(5)

            holder = threading.Thread(target=hold_the_lock)
            holder.start()
            holding.wait(5)
            read_end, write_end = os.pipe()
            with warnings.catch_warnings():
                # Python 3.12 warns of forking with threads: that is the point.
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                # The child: report on the pipe, and never return into the
                # test runner.
                status = 1
                try:
                    os.close(read_end)
                    held_after_fork = listeners._held
                    closed = sum(sock.fileno() == -1 for sock in inherited)
                    kind = client.check("login", SUBJECT).error.kind
                    thread = any(t.name == "tollgate-late-listener" for t in threading.enumerate())
                    report = [held_after_fork, closed, kind, listeners._held, thread]
                    os.write(write_end, repr(report).encode())
                    status = 0
                finally:
                    os._exit(status)
            forked.set()
            holder.join()
            os.close(write_end)
            try:
                ready, _, _ = select.select([read_end], [], [], 5.0)
                report = os.read(read_end, 4096).decode() if ready else None
            finally:
                os.close(read_end)
                if report is None:
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            self.assertIsNotNone(report, "the child hung")
            self.assertEqual(report, repr([0, 3, "timeout", 1, True]))
            # The parent's connections are its own still.
            wait_until(lambda: daemon.connections == 4 and daemon.connections_open() == 3)
            self.assertEqual((daemon.connections_open(), listeners._held), (3, 3))

    def test_at_most_late_listeners_max_timed_out_connections_stay_open(self):
        # More calls time out at once than the cap: the connections past it
        # are closed at once, the others when their window of busy_max ends.
        calls = LATE_LISTENERS_MAX + 4
        with FakeDaemon(silent) as daemon, client_for(daemon, timeout=0.05, busy_max=1.0) as client:
            subjects = [Subject(peer="198.51.100.7", account="user{}".format(i)) for i in range(calls)]
            answers = self.overlapping_checks(client, subjects)
            self.assertEqual({a.error.kind for a in answers}, {"timeout"})
            # The fake daemon accepts each in its own time on a loaded host.
            wait_until(lambda: daemon.connections == calls)
            self.assertEqual(daemon.connections, calls)
            wait_until(lambda: daemon.connections_open() <= LATE_LISTENERS_MAX, 0.3)
            self.assertEqual(daemon.connections_open(), LATE_LISTENERS_MAX)
            wait_until(lambda: daemon.connections_open() == 0)
            self.assertEqual(daemon.connections_open(), 0, "each is closed when its window ends")

    def overlap_from_two_addresses_twice(self, known):
        # Someone checking her account from another address while the daemon
        # is late: each requester is refused as busy at first; past busy_max
        # since those refusals (the daemon still counts as busy: it answered
        # in time within busy_max) the same overlap again. With `known`, a
        # success was reported first for her account and address.
        answering = {"on": True}

        def handler(daemon, version, request_id, variant, body):
            return verdict_payload(version, request_id) if answering["on"] else None

        victim = Subject(peer="198.51.100.7", account="alice")
        other = Subject(peer="203.0.113.9", account="alice")
        with FakeDaemon(handler) as daemon, client_for(daemon, timeout=0.03, busy_max=0.5) as client:
            self.assertIsInstance(client.check("login", Subject(account="bob")), VerdictAnswer)
            if known:
                self.assertIsInstance(client.report("login", victim, True), VerdictAnswer)
            answering["on"] = False
            first = self.overlapping_checks(client, [victim, other])
            refused = time.monotonic()
            self.assertEqual([a.error.kind for a in first], ["busy", "busy"], "within busy_max of the first refusal")
            self.assertFalse(any(a.proceeds for a in first))
            time.sleep(0.55)
            answering["on"] = True
            self.assertIsInstance(client.check("login", Subject(account="bob")), VerdictAnswer)
            answering["on"] = False
            self.assertGreaterEqual(time.monotonic() - refused, 0.5)
            again = self.overlapping_checks(client, [victim, other])
            # Her own parallel checks (one account, one address) stay busy.
            own = self.overlapping_checks(client, [victim, victim])
            self.assertEqual([(a.error.kind, a.proceeds) for a in own], [("busy", False)] * 2)
            return again

    def test_a_burst_on_one_account_from_other_addresses_is_busy_for_busy_max_only(self):
        # She logged in from her address through this client: past busy_max
        # her timeout follows the fail policy; the other address, never seen
        # succeeding, stays busy.
        again = self.overlap_from_two_addresses_twice(known=True)
        self.assertEqual([(a.error.kind, a.proceeds) for a in again], [("timeout", True), ("busy", False)])
        self.assertNotIn("busy", str(again[0].error))

    def test_a_burst_on_one_account_from_unknown_addresses_stays_busy(self):
        # No success reported for either address (a guesser's two
        # addresses): past busy_max both stay busy, so no late guess fails
        # open.
        again = self.overlap_from_two_addresses_twice(known=False)
        self.assertEqual([(a.error.kind, a.proceeds) for a in again], [("busy", False)] * 2)


def decision_daemon(decision, delay_ms=0):
    def handler(daemon, version, request_id, variant, body):
        if variant == 0:
            return verdict_payload(version, request_id, decision=decision, delay_ms=delay_ms, retry_after_ms=1500)
        return verdict_payload(version, request_id)

    return FakeDaemon(handler)


class Guard(unittest.TestCase):
    def test_leaving_an_allowed_attempt_without_a_report_abandons_it_once(self):
        with FakeDaemon(allow_all) as daemon, client_for(daemon) as client:
            with client.attempt("login", SUBJECT, password="hunter2") as attempt:
                self.assertTrue(attempt.proceeds)
            self.assertTrue(attempt.abandoned)
            self.assertEqual(daemon.variants(), [0, 8])
            self.assertIsNone(attempt.abandon(), "at most once")
            self.assertEqual(daemon.variants(), [0, 8])
            tag = daemon.requests[0][4][-16:]
            self.assertEqual(tag.hex(), "7a7bd4a52a5835dc81e0f6c0e797d285")

    def test_an_exception_abandons_and_goes_on(self):
        with FakeDaemon(allow_all) as daemon, client_for(daemon) as client:
            with self.assertRaises(KeyError):
                with client.attempt("login", SUBJECT):
                    raise KeyError("verify blew up")
            self.assertEqual(daemon.variants(), [0, 8])

    def test_a_reported_attempt_sends_nothing_more(self):
        with FakeDaemon(allow_all) as daemon, client_for(daemon) as client:
            with client.attempt("login", SUBJECT, password="hunter2") as attempt:
                self.assertIsInstance(attempt.report(False), VerdictAnswer)
                self.assertRaises(RuntimeError, attempt.report, True)
            self.assertFalse(attempt.abandoned)
            self.assertEqual(daemon.variants(), [0, 1])
            report = daemon.requests[1][4]
            self.assertEqual(report[-34:].hex(), "01a781c11aa90192e358dee98ccfef7ac0017a7bd4a52a5835dc81e0f6c0e797d285")

    def test_the_report_may_carry_the_subject_after_the_verify(self):
        with FakeDaemon(allow_all) as daemon, client_for(daemon) as client:
            with client.attempt("login", SUBJECT) as attempt:
                attempt.report(True, subject=Subject(peer="198.51.100.7", account="alice", device="d1"))
            self.assertIn(b"d1", daemon.requests[1][4])

    def test_refused_and_delayed_checks_are_never_abandoned(self):
        for decision in (1, 2, 3):
            with self.subTest(decision=decision):
                with decision_daemon(decision, delay_ms=10) as daemon, client_for(daemon) as client:
                    with client.attempt("login", SUBJECT) as attempt:
                        self.assertEqual(attempt.proceeds, decision == 1)
                        self.assertEqual(attempt.retry_after_secs, 2)
                    self.assertFalse(attempt.abandoned)
                    self.assertEqual(daemon.variants(), [0])

    def test_an_unanswered_check_is_never_abandoned(self):
        with FakeDaemon(silent) as daemon, client_for(daemon, timeout=0.03) as client:
            with client.attempt("login", SUBJECT) as attempt:
                self.assertTrue(attempt.proceeds, "login fails open")
            self.assertFalse(attempt.abandoned)
            self.assertEqual(daemon.variants(), [0])

    def test_a_rejected_check_is_never_abandoned(self):
        with FakeDaemon(lambda d, v, i, k, b: error_payload(v, i, 4)) as daemon, client_for(daemon) as client:
            with client.attempt("login", SUBJECT) as attempt:
                self.assertFalse(attempt.proceeds)
            self.assertEqual(daemon.variants(), [0])

    def test_a_password_needs_the_key(self):
        with FakeDaemon() as daemon, Client(daemon.path) as client:
            self.assertRaises(ValueError, client.attempt, "login", SUBJECT, password="x")


if __name__ == "__main__":
    unittest.main()
