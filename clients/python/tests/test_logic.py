"""Daemon-free logic: X-Forwarded-For, the static budget's GCRA, bursts,
answers and fail policies."""

import os
import tempfile
import threading
import time
import unittest

from tollgate_client import (
    BUILTIN_FAIL_POLICIES,
    Busy,
    CallTimeout,
    Client,
    ClientConfig,
    Decision,
    ErrorCode,
    ErrorReply,
    FailPolicy,
    GcraSpec,
    Reason,
    Rejected,
    Subject,
    Unavailable,
    Verdict,
    VerdictAnswer,
    forwarded_tail,
)
from tollgate_client.burst import (
    BURST_GAP_US,
    BUSY_REQUESTERS_MAX,
    BUSY_WINDOW_FACTOR,
    KNOWN_FOR_US,
    KNOWN_PER_ACCOUNT_MAX,
    KNOWN_REQUESTERS_MAX,
    SWEEP_AT,
    Bursts,
    BusyWindows,
    KnownRequesters,
)
from tollgate_client.gcra import decide

SECOND = 1_000_000
SUBJECT = Subject(peer="198.51.100.7", account="alice")


def dead_socket_path():
    return os.path.join(tempfile.mkdtemp(), "nobody-here.sock")


class ForwardedTail(unittest.TestCase):
    def test_a_short_header_is_sent_whole(self):
        for header in ("", "203.0.113.9", "203.0.113.9, 10.0.0.1", "x" * 4096):
            self.assertEqual(forwarded_tail(header), header)

    def test_a_long_header_keeps_the_whole_entries_of_its_last_4096_bytes(self):
        tail = ", ".join(["10.0.0.{}".format(i % 250) for i in range(300)])
        header = "1.2.3.4, " * 1000 + tail
        kept = forwarded_tail(header)
        self.assertLessEqual(len(kept.encode()), 4096)
        self.assertTrue(header.endswith(kept))
        self.assertEqual(header[len(header) - len(kept) - 1], ",")

    def test_a_comma_just_before_the_window_keeps_the_whole_window(self):
        entry = "a" * 4096
        self.assertEqual(forwarded_tail("b," + entry), entry)
        self.assertEqual(forwarded_tail("b" + "," + entry[1:] + "c"), entry[1:] + "c")

    def test_one_entry_longer_than_the_window_sends_nothing(self):
        self.assertEqual(forwarded_tail("x" * 4097), "")
        self.assertEqual(forwarded_tail("1.2.3.4," + "x" * 5000), "")

    def test_lengths_are_in_bytes(self):
        header = "é" * 2047 + ",1.2.3.4"  # 4094 + 8 bytes
        self.assertEqual(forwarded_tail(header), "1.2.3.4")

    def test_the_client_sends_the_tail(self):
        from tollgate_client.client import _bounded

        subject = Subject(forwarded_for="9.9.9.9," * 1000 + "1.1.1.1")
        self.assertEqual(_bounded(subject).forwarded_for, forwarded_tail(subject.forwarded_for))
        self.assertIs(_bounded(SUBJECT), SUBJECT)


class Gcra(unittest.TestCase):
    def test_a_burst_then_one_per_interval(self):
        spec = GcraSpec.new(60, 60 * SECOND, 3)
        tat, now = None, 1000 * SECOND
        for remaining in (2, 1, 0):
            d, tat = decide(spec, tat, now, True)
            self.assertEqual((d.allowed, d.remaining), (True, remaining))
        refused, after = decide(spec, tat, now, True)
        self.assertEqual((refused.allowed, refused.retry_after_us), (False, SECOND))
        self.assertEqual(after, tat, "a refusal spends nothing")
        self.assertTrue(decide(spec, tat, now + SECOND, True)[0].allowed)

    def test_not_spending_reads_only(self):
        spec = GcraSpec.new(1, 60 * SECOND, 1)
        d, tat = decide(spec, None, 5, False)
        self.assertTrue(d.allowed)
        self.assertTrue(decide(spec, tat, 5, True)[0].allowed)

    def test_the_interval_rounds_up(self):
        self.assertEqual(GcraSpec.new(3, 10, 1).interval_us, 4)
        self.assertEqual(GcraSpec.new(10, 1, 1).interval_us, 1)


class BurstDetection(unittest.TestCase):
    def test_checks_on_one_account_close_together_are_a_burst_and_others_are_not(self):
        bursts = Bursts()
        alice, erin = Subject(account="alice"), Subject(account="erin")
        first = bursts.enter("login", alice)
        self.assertFalse(first.in_burst())
        lone = bursts.enter("login", erin)
        second = bursts.enter("login", alice)
        self.assertTrue(first.in_burst() and second.in_burst())
        self.assertFalse(lone.in_burst())
        for guard in (first, second, lone):
            guard.leave()
        straggler = bursts.enter("login", alice)
        self.assertTrue(straggler.in_burst(), "started just after the burst")
        straggler.leave()
        time.sleep((BURST_GAP_US + 10_000) / 1e6)
        later = bursts.enter("login", erin)
        self.assertFalse(later.in_burst())

    def test_the_address_keys_a_check_without_account(self):
        bursts = Bursts()
        a = bursts.enter("login", Subject(peer="10.0.0.1"))
        b = bursts.enter("login", Subject(peer="10.0.0.1", device="d"))
        c = bursts.enter("login", Subject(peer="10.0.0.2"))
        self.assertTrue(a.in_burst() and b.in_burst())
        self.assertFalse(c.in_burst())

    def test_ended_entries_are_swept_past_the_bound(self):
        bursts = Bursts()
        for n in range(SWEEP_AT):
            bursts.enter("login", Subject(account=str(n))).leave()
        time.sleep((BURST_GAP_US + 10_000) / 1e6)
        bursts.enter("login", Subject(account="new")).leave()
        self.assertEqual(len(bursts), 1)

    def test_overlapping_checks_on_one_account_and_address_are_each_others_own_burst(self):
        bursts = Bursts()
        first = bursts.enter("login", SUBJECT)
        self.assertFalse(first.own_burst() or first.in_burst())
        second = bursts.enter("login", SUBJECT)
        self.assertTrue(first.own_burst() and second.own_burst())
        self.assertTrue(first.in_burst() and second.in_burst())
        first.leave()
        second.leave()
        self.assertTrue(all(e.waiting == 0 for e in bursts._entries.values()), "both keys left")

    def test_overlapping_checks_on_one_account_from_two_addresses_are_a_burst_neither_owns(self):
        bursts = Bursts()
        victim = bursts.enter("login", Subject(peer="198.51.100.7", account="alice"))
        other = bursts.enter("login", Subject(peer="203.0.113.9", account="alice"))
        self.assertTrue(victim.in_burst() and other.in_burst())
        self.assertFalse(victim.own_burst() or other.own_burst())
        # A third from the victim's address makes hers an own burst.
        again = bursts.enter("login", Subject(peer="198.51.100.7", account="alice"))
        self.assertTrue(victim.own_burst() and again.own_burst())
        self.assertFalse(other.own_burst())

    def test_users_behind_one_proxy_are_told_apart_by_their_forwarded_header(self):
        bursts = Bursts()
        proxy = "10.0.0.1"
        victim = bursts.enter("login", Subject(peer=proxy, forwarded_for="198.51.100.7", account="alice"))
        other = bursts.enter("login", Subject(peer=proxy, forwarded_for="203.0.113.9", account="alice"))
        self.assertTrue(victim.in_burst() and other.in_burst())
        self.assertFalse(victim.own_burst() or other.own_burst(), "one proxy, two requesters")
        victim.leave()
        other.leave()

    def test_a_check_without_account_is_own_with_another_on_its_address(self):
        bursts = Bursts()
        a = bursts.enter("login", Subject(peer="10.0.0.1"))
        b = bursts.enter("login", Subject(peer="10.0.0.1", device="d"))
        self.assertTrue(a.own_burst() and b.own_burst())
        self.assertEqual(len(bursts), 1, "one key, entered once")
        a.leave()
        self.assertEqual(bursts._entries[Bursts.key("login", Subject(peer="10.0.0.1"))].waiting, 1, "not counted twice")
        b.leave()


class RequesterKey(unittest.TestCase):
    def requester(self, **fields):
        return Bursts.requester("login", Subject(**fields))

    def test_fields_cannot_run_into_each_other(self):
        self.assertNotEqual(
            self.requester(account="bob", peer="192.0.2.5"), self.requester(account="bob1", peer="92.0.2.5")
        )
        self.assertNotEqual(
            self.requester(tenant="a", account="bc", peer="192.0.2.5"),
            self.requester(tenant="ab", account="c", peer="192.0.2.5"),
        )
        self.assertNotEqual(
            self.requester(account="bob", peer="192.0.2.5", forwarded_for="1.2.3.4"),
            self.requester(account="bob|1.2.3.4", peer="192.0.2.5"),
        )
        self.assertNotEqual(
            self.requester(account="a", peer="192.0.2.5", forwarded_for="b"),
            self.requester(account="a", peer="192.0.2.5", tenant="b"),
        )

    def test_the_same_account_in_two_tenants_is_two_requesters(self):
        peer = "192.0.2.5"
        keys = {
            self.requester(tenant="one", account="alice", peer=peer),
            self.requester(tenant="two", account="alice", peer=peer),
            self.requester(account="alice", peer=peer),
            self.requester(tenant="", account="alice", peer=peer),
        }
        self.assertEqual(len(keys), 4, "absent and empty tenants differ too")

    def test_the_forwarded_header_tells_requesters_apart(self):
        peer = "192.0.2.5"
        keys = {
            self.requester(account="alice", peer=peer, forwarded_for="198.51.100.7"),
            self.requester(account="alice", peer=peer, forwarded_for="203.0.113.9"),
            self.requester(account="alice", peer=peer),
            self.requester(account="alice", peer=peer, forwarded_for=""),
        }
        self.assertEqual(len(keys), 4, "none and an empty header differ too")

    def test_the_requester_is_the_burst_key_without_account_or_address(self):
        for subject in (Subject(account="alice"), Subject(peer="192.0.2.5"), Subject(forwarded_for="1.2.3.4")):
            self.assertEqual(Bursts.requester("login", subject), Bursts.key("login", subject))
        with_header = Subject(account="alice", forwarded_for="1.2.3.4")
        self.assertNotEqual(Bursts.requester("login", with_header), Bursts.key("login", with_header))

    def test_a_report_keys_its_requester_on_the_bounded_header_it_sends(self):
        client = Client(ClientConfig(dead_socket_path()))
        header = "1.2.3.4, " * 1000 + "198.51.100.7"
        subject = Subject(peer="10.0.0.1", account="alice", forwarded_for=header)
        client.report("login", subject, True)
        bounded = Subject(peer="10.0.0.1", account="alice", forwarded_for=forwarded_tail(header))
        self.assertTrue(client._known.known(Bursts.requester("login", bounded), client._now_us()))


class BusyWindow(unittest.TestCase):
    BUSY_MAX = 10_000  # µs: 10 ms

    def test_busy_for_busy_max_then_not_until_the_window_ends(self):
        windows = BusyWindows()
        start = 1_000
        self.assertTrue(windows.excused("alice", start, self.BUSY_MAX), "the first refusal")
        self.assertTrue(windows.excused("alice", start + self.BUSY_MAX - 1, self.BUSY_MAX))
        self.assertFalse(windows.excused("alice", start + self.BUSY_MAX, self.BUSY_MAX))
        window_end = start + BUSY_WINDOW_FACTOR * self.BUSY_MAX
        self.assertFalse(windows.excused("alice", window_end - 1, self.BUSY_MAX))
        self.assertTrue(windows.excused("erin", window_end - 1, self.BUSY_MAX), "each requester has her own")
        self.assertTrue(windows.excused("alice", window_end, self.BUSY_MAX), "a new window")
        self.assertTrue(windows.excused("alice", window_end + self.BUSY_MAX - 1, self.BUSY_MAX))
        self.assertFalse(windows.excused("alice", window_end + self.BUSY_MAX, self.BUSY_MAX))

    def test_busy_max_zero_excuses_nothing(self):
        windows = BusyWindows()
        self.assertFalse(windows.excused("alice", 1_000, 0))
        self.assertFalse(windows.excused("alice", 1_000, 0))

    def test_the_map_is_bounded_and_a_flood_cannot_make_room(self):
        windows = BusyWindows()
        for n in range(BUSY_REQUESTERS_MAX):
            self.assertTrue(windows.excused(n, 1_000, self.BUSY_MAX))
        window = BUSY_WINDOW_FACTOR * self.BUSY_MAX
        self.assertFalse(windows.excused("new", 1_000 + window - 1, self.BUSY_MAX), "all windows live")
        self.assertEqual(len(windows), BUSY_REQUESTERS_MAX)
        self.assertTrue(windows.excused("new", 1_000 + window, self.BUSY_MAX), "the ended ones dropped")
        self.assertEqual(len(windows), 1)


class KnownRequester(unittest.TestCase):
    def test_known_after_a_success_until_known_for_ends(self):
        known = KnownRequesters()
        self.assertFalse(known.known("alice", 1_000), "never succeeded")
        known.succeeded("alice", "acct", 1_000)
        self.assertTrue(known.known("alice", 1_000))
        self.assertTrue(known.known("alice", 1_000 + KNOWN_FOR_US - 1))
        self.assertFalse(known.known("alice", 1_000 + KNOWN_FOR_US))
        self.assertFalse(known.known("erin", 1_000), "each requester her own")
        known.succeeded("alice", "acct", 1_000 + KNOWN_FOR_US)
        self.assertTrue(known.known("alice", 1_000 + KNOWN_FOR_US), "a new success renews it")

    def test_the_map_is_bounded_and_a_new_success_evicts_the_least_recent(self):
        known = KnownRequesters()
        for n in range(KNOWN_REQUESTERS_MAX):
            known.succeeded(n, n, 1_000 + n)
        known.succeeded(0, 0, 10_000_000)
        self.assertEqual(len(known), KNOWN_REQUESTERS_MAX, "an update needs no room")
        self.assertTrue(known.known(1, 10_000_000), "nothing evicted by an update")
        known.succeeded("new", "new", 10_000_000)
        self.assertEqual(len(known), KNOWN_REQUESTERS_MAX)
        self.assertFalse(known.known(1, 10_000_000), "the least recently succeeded made room")
        self.assertTrue(known.known(0, 10_000_000), "an update made the oldest recent again")
        self.assertTrue(known.known(2, 10_000_000) and known.known("new", 10_000_000))
        self.assertEqual(sum(len(r) for r in known._accounts.values()), KNOWN_REQUESTERS_MAX, "accounts kept in step")
        self.assertNotIn(1, known._accounts, "an account left empty is dropped")

    def test_at_most_sixteen_requesters_an_account(self):
        known = KnownRequesters()
        known.succeeded("bob@192.0.2.1", "bob", 500)
        for n in range(KNOWN_PER_ACCOUNT_MAX + 1):
            known.succeeded("mallory@10.0.0.{}".format(n), "mallory", 1_000 + n)
        now = 2_000
        self.assertFalse(known.known("mallory@10.0.0.0", now), "the account's first is forgotten")
        self.assertTrue(all(known.known("mallory@10.0.0.{}".format(n), now) for n in range(1, KNOWN_PER_ACCOUNT_MAX + 1)))
        self.assertTrue(known.known("bob@192.0.2.1", now), "another account's entry is not")
        self.assertEqual(len(known), KNOWN_PER_ACCOUNT_MAX + 1)
        # An update within the account makes its entry the most recent there.
        known.succeeded("mallory@10.0.0.1", "mallory", 3_000)
        known.succeeded("mallory@10.0.0.99", "mallory", 3_001)
        self.assertTrue(known.known("mallory@10.0.0.1", 3_001))
        self.assertFalse(known.known("mallory@10.0.0.2", 3_001), "the account's least recent went")

    def test_logins_to_ones_own_account_cannot_push_others_out(self):
        known = KnownRequesters()
        known.succeeded("alice", "alice", 1_000)
        for n in range(KNOWN_REQUESTERS_MAX):
            known.succeeded(("mallory", n), "mallory", 2_000 + n)
        self.assertTrue(known.known("alice", 10_000_000))
        self.assertEqual(len(known), KNOWN_PER_ACCOUNT_MAX + 1)


class KnownRequesterOfReports(unittest.TestCase):
    def test_a_success_reported_makes_its_requester_known_even_if_the_call_fails(self):
        client = Client(ClientConfig("/nonexistent/t.sock"))
        victim = Subject(peer="198.51.100.7", account="alice")
        requester = Bursts.requester("login", victim)
        client.report("login", victim, False)
        self.assertFalse(client._known.known(requester, client._now_us()), "a failure is not a login")
        client.report("login", victim, True)
        self.assertTrue(client._known.known(requester, client._now_us()))
        self.assertFalse(client._known.known(Bursts.requester("login", Subject(peer="203.0.113.9", account="alice")), client._now_us()))
        client.report("login", Subject(account="bob"), "success")
        self.assertFalse(
            client._known.known(Bursts.key("login", Subject(account="bob")), client._now_us()),
            "without an address the requester is its burst key, never asked about: not recorded",
        )

    def test_a_report_refused_before_sending_makes_nobody_known(self):
        client = Client(ClientConfig("/nonexistent/t.sock"))
        subject = Subject(peer="198.51.100.7", account="alice", device="d" * 4096)
        answer = client.report("login", subject, True)
        self.assertIsInstance(answer, Rejected)
        self.assertEqual(len(client._known), 0, "never sent")


def verdict(decision, retry_after_ms=0, delay_ms=0):
    return VerdictAnswer(Verdict(Decision(decision), retry_after_ms, delay_ms, 5, 0, 0, Reason.ALLOWED, "r", 0), 5)


class Answers(unittest.TestCase):
    def test_allow_and_delay_proceed_challenge_and_deny_do_not(self):
        self.assertEqual([verdict(d).proceeds for d in range(4)], [True, True, False, False])
        self.assertEqual(verdict(1, delay_ms=250).delay, 0.25)
        self.assertIsNone(verdict(0).delay)
        self.assertIsNone(verdict(1, delay_ms=0).delay)

    def test_retry_after_rounds_up_to_whole_seconds(self):
        self.assertEqual(verdict(3, retry_after_ms=899250).retry_after_secs, 900)
        self.assertEqual(verdict(3, retry_after_ms=1000).retry_after_secs, 1)
        self.assertEqual(verdict(3, retry_after_ms=0).retry_after_secs, 1)
        self.assertEqual(Rejected(ErrorReply(ErrorCode.FIELD_TOO_LONG, "x")).retry_after_secs, 1)

    def test_rejected_and_busy_never_proceed(self):
        self.assertFalse(Rejected(ErrorReply(ErrorCode.FIELD_TOO_LONG, "x")).proceeds)
        self.assertFalse(Unavailable(FailPolicy.OPEN, Busy("b"), False).proceeds)
        self.assertTrue(Unavailable(FailPolicy.OPEN, CallTimeout("t"), False).proceeds)
        self.assertFalse(Unavailable(FailPolicy.CLOSED, CallTimeout("t"), False).proceeds)
        self.assertTrue(Unavailable(FailPolicy.CLOSED, CallTimeout("t"), True).proceeds)


class FailPolicies(unittest.TestCase):
    def test_the_builtin_table(self):
        self.assertEqual(
            dict(BUILTIN_FAIL_POLICIES),
            {
                "login": FailPolicy.OPEN,
                "reauth": FailPolicy.OPEN,
                "request": FailPolicy.CLOSED,
                "mfa_verify": FailPolicy.CLOSED,
                "mfa_resend": FailPolicy.CLOSED,
                "password_reset": FailPolicy.CLOSED,
                "registration": FailPolicy.CLOSED,
                "token": FailPolicy.CLOSED,
            },
        )
        config = ClientConfig("/x")
        self.assertEqual((config.timeout, config.busy_max, config.protocol_version), (0.005, 1.0, 5))

    def test_a_dead_socket_lets_login_through_and_not_password_reset(self):
        client = Client(dead_socket_path())
        login = client.check("login", SUBJECT)
        self.assertIsInstance(login, Unavailable)
        self.assertEqual((login.policy, login.error.kind, login.proceeds), (FailPolicy.OPEN, "connect", True))
        reset = client.check("password_reset", SUBJECT)
        self.assertEqual((reset.policy, reset.proceeds, reset.within_static_budget), (FailPolicy.CLOSED, False, False))
        self.assertTrue(client.check("some_route_of_ours", SUBJECT).proceeds, "unknown routes fail open")

    def test_policies_are_overridable_per_route(self):
        client = Client(ClientConfig(dead_socket_path()).fail_policy("login", "closed").fail_policy("token", "open"))
        self.assertFalse(client.check("login", SUBJECT).proceeds)
        self.assertTrue(client.check("token", SUBJECT).proceeds)

    def test_a_static_budget_lets_a_closed_route_through_and_only_checks_spend(self):
        config = ClientConfig(dead_socket_path()).static_budget("password_reset", 1, 3600.0, 2)
        client = Client(config)
        for _ in range(3):
            report = client.report("password_reset", SUBJECT, False)
            self.assertTrue(report.within_static_budget, "a report reads the budget without spending")
        self.assertEqual([client.check("password_reset", SUBJECT).proceeds for _ in range(3)], [True, True, False])
        self.assertFalse(client.report("password_reset", SUBJECT, True).within_static_budget)
        self.assertFalse(client.check("request", SUBJECT).within_static_budget, "per route")

    def test_config_checks_its_values(self):
        self.assertRaises(ValueError, ClientConfig, "/x", protocol_version=6)
        self.assertRaises(ValueError, ClientConfig, "/x", protocol_version=0)
        self.assertRaises(ValueError, ClientConfig, "/x", password_key=b"short")
        self.assertRaises(ValueError, Subject, peer="not an address")

    def test_concurrent_calls_on_a_dead_socket(self):
        # A timeout long enough that a loaded machine still reaches connect().
        client = Client(ClientConfig(dead_socket_path(), timeout=2.0))
        results = []
        threads = [threading.Thread(target=lambda: results.append(client.check("login", SUBJECT))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(len(results), 8)
        self.assertTrue(all(r.proceeds and r.error.kind == "connect" for r in results))


if __name__ == "__main__":
    unittest.main()
