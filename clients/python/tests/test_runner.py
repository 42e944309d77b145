"""The conformance runner, driven through conformance.sh as the kit does."""

import json
import os
import subprocess
import tempfile
import unittest

from fake_daemon import FakeDaemon

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "conformance.sh")
KEY = "07" * 32
LOGIN = {"peer": "198.51.100.7", "account": "alice"}


def run(*requests):
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    done = subprocess.run(
        ["bash", SCRIPT], input=lines, capture_output=True, text=True, cwd=tempfile.gettempdir(), timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


class Runner(unittest.TestCase):
    def test_every_op_against_a_dead_socket(self):
        dead = os.path.join(tempfile.mkdtemp(), "none.sock")
        replies = run(
            {"op": "open", "socket": dead, "key": KEY, "static_budgets": {"token": {"limit": 1, "period_ms": 60000, "burst": 1}}},
            {"op": "check", "route": "login", "subject": LOGIN, "password": "hunter2"},
            {"op": "report", "route": "password_reset", "subject": LOGIN, "outcome": "failure", "password": "x"},
            {"op": "check", "route": "token", "subject": LOGIN},
            {"op": "abandon", "route": "login", "subject": LOGIN},
            {"op": "checks", "route": "login", "subjects": [LOGIN, {"peer": "203.0.113.9", "account": None}]},
            {"op": "begin", "attempt": "a", "route": "login", "subject": LOGIN},
            {"op": "end", "attempt": "a"},
            {"op": "digest", "key": KEY, "account": "alice", "password": "hunter2"},
            {"op": "no_such_op"},
            "not an object",
        )
        self.assertEqual(replies[0], {"ok": True})
        self.assertEqual(
            replies[1],
            {"answer": "unavailable", "proceeds": True, "policy": "open", "error": "connect",
             "within_static_budget": False, "retry_after_s": 1},
        )
        self.assertEqual((replies[2]["policy"], replies[2]["proceeds"]), ("closed", False))
        self.assertEqual((replies[3]["within_static_budget"], replies[3]["proceeds"]), (True, True))
        self.assertEqual(replies[4]["answer"], "unavailable")
        self.assertEqual(len(replies[5]["answers"]), 2)
        self.assertEqual(replies[6]["answer"], "unavailable")
        self.assertEqual(replies[7], {"abandoned": False})
        self.assertEqual(replies[8], {"digest": "a781c11aa90192e358dee98ccfef7ac0", "tag": "7a7bd4a52a5835dc81e0f6c0e797d285"})
        self.assertEqual(set(replies[9]), {"error"})
        self.assertEqual(set(replies[10]), {"error"})

    def test_verdicts_guards_and_bench(self):
        with FakeDaemon() as daemon:
            replies = run(
                {"op": "open", "socket": daemon.path, "timeout_ms": 1000, "key": KEY},
                {"op": "begin", "attempt": "a", "route": "login", "subject": LOGIN, "password": "p"},
                {"op": "finish", "attempt": "a", "outcome": "failure", "password": "p"},
                {"op": "end", "attempt": "a"},
                {"op": "begin", "attempt": "b", "route": "login", "subject": LOGIN},
                {"op": "end", "attempt": "b"},
                {"op": "bench", "route": "login", "subject": LOGIN, "threads": 2, "millis": 100},
                {"op": "bench", "route": "login", "subject": LOGIN, "threads": 2, "millis": 100, "raw": True},
            )
        self.assertEqual(
            set(replies[1]),
            {"answer", "proceeds", "decision", "retry_after_ms", "delay_ms", "limit", "remaining", "reset_ms",
             "reason", "rule", "degraded", "retry_after_s", "version"},
        )
        self.assertEqual((replies[1]["decision"], replies[1]["reason"], replies[1]["version"]), ("allow", "allowed", 5))
        self.assertEqual(replies[2]["answer"], "verdict")
        self.assertEqual(replies[3], {"abandoned": False})
        self.assertEqual(replies[5], {"abandoned": True})
        for bench in replies[6:]:
            self.assertGreater(bench["calls"], 0)
            self.assertGreaterEqual(bench["millis"], 100)


if __name__ == "__main__":
    unittest.main()
