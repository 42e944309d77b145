"""Against the real daemon, when its binary is at hand ($TOLLGATE_DAEMON,
else /tmp/tollgate-daemon); skipped otherwise."""

import os
import shutil
import subprocess
import tempfile
import time
import unittest

from tollgate_client import Client, ClientConfig, Rejected, Subject, VerdictAnswer

DAEMON = os.environ.get("TOLLGATE_DAEMON", "/tmp/tollgate-daemon")
KEY = bytes([7] * 32)


@unittest.skipUnless(os.access(DAEMON, os.X_OK), "no tollgate daemon binary at " + DAEMON)
class RealDaemon(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        cls.socket = os.path.join(cls.dir, "t.sock")
        cls.log = open(os.path.join(cls.dir, "daemon.log"), "wb")
        cls.process = subprocess.Popen(
            [DAEMON, "serve", "--socket", cls.socket, "--state", os.path.join(cls.dir, "state.redb"), "--manual-clock"],
            stdout=cls.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while not os.path.exists(cls.socket):
            if time.monotonic() > deadline or cls.process.poll() is not None:
                raise RuntimeError("the daemon did not start; see " + cls.log.name)
            time.sleep(0.02)
        # A debug build on a shared machine: generous, so no test sees a timeout.
        cls.client = Client(ClientConfig(cls.socket, timeout=2.0, password_key=KEY))

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.process.terminate()
        cls.process.wait(10)
        cls.log.close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def subject(self, account):
        return Subject(peer="198.51.100.7", account=account)

    def test_five_failures_lock_the_account_out(self):
        subject = self.subject("lockme")
        for _ in range(5):
            with self.client.attempt("login", subject, password="wrong") as attempt:
                self.assertTrue(attempt.proceeds)
                attempt.report(False, password="wrong{}".format(time.monotonic_ns()))
        answer = self.client.check("login", subject)
        self.assertIsInstance(answer, VerdictAnswer)
        self.assertEqual((answer.verdict.decision.label, answer.verdict.reason.label), ("deny", "too_many_failures"))
        self.assertFalse(answer.proceeds)
        self.assertGreater(answer.retry_after_secs, 1)

    def test_a_repeated_wrong_password_counts_once(self):
        subject = self.subject("stale-phone")
        for _ in range(8):
            with self.client.attempt("login", subject, password="old") as attempt:
                self.assertTrue(attempt.proceeds)
                attempt.report(False)
        self.assertTrue(self.client.check("login", subject).proceeds)

    def test_places_in_flight_refuse_and_the_guard_gives_them_back(self):
        subject = self.subject("inflight")
        held = [self.client.check("login", subject) for _ in range(5)]
        self.assertTrue(all(a.proceeds for a in held))
        sixth = self.client.check("login", subject)
        self.assertEqual(sixth.verdict.reason.label, "attempts_in_flight")
        for _ in range(5):
            self.assertEqual(self.client.abandon("login", subject).verdict.decision.label, "allow")
        for _ in range(6):
            with self.client.attempt("login", subject) as attempt:
                self.assertTrue(attempt.proceeds, "each abandoned by the guard")
            self.assertTrue(attempt.abandoned)

    def test_older_versions_get_the_nearest_reason(self):
        client = Client(ClientConfig(self.socket, timeout=2.0, protocol_version=4))
        subject = self.subject("inflight-v4")
        for _ in range(5):
            client.check("login", subject)
        answer = client.check("login", subject)
        self.assertEqual((answer.version, answer.verdict.reason.label), (4, "too_many_failures"))
        # An abandon below version 5 is refused as malformed, as for the Rust client.
        self.assertEqual(client.abandon("login", subject).error.code.label, "malformed")
        client.close()

    def test_an_identifier_over_512_bytes_is_rejected_not_truncated(self):
        answer = self.client.check("login", self.subject("a" * 513))
        self.assertIsInstance(answer, Rejected)
        self.assertEqual(answer.error.code.label, "field_too_long")
        self.assertFalse(answer.proceeds)
        self.assertTrue(self.client.check("login", self.subject("b" * 512)).proceeds)

    def test_a_padded_client_id_is_refused_and_a_long_forwarded_for_is_cut(self):
        # Sent, the daemon would close mid-write and login would fail open.
        padded = Subject(peer="198.51.100.7", account="padded", client_id="p" * 250_000)
        answer = self.client.check("login", padded)
        self.assertEqual((type(answer), answer.error.code.label), (Rejected, "field_too_long"))
        forwarded = Subject(peer="198.51.100.7", account="padded", forwarded_for=", ".join(["203.0.113.9"] * 30_000))
        answer = self.client.check("login", forwarded)
        self.assertIsInstance(answer, VerdictAnswer)
        self.client.abandon("login", forwarded)

    def test_missing_field_and_unknown_route(self):
        self.assertEqual(self.client.check("login", Subject(account="x")).error.code.label, "missing_field")
        self.assertEqual(self.client.check("no_such_route", self.subject("x")).error.code.label, "unknown_route")


if __name__ == "__main__":
    unittest.main()
