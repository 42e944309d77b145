"""Which checks of this client are in a burst (`client/src/burst.rs`), and
for how long a burst may refuse one requester.

A timeout from a busy daemon stops a login only when another check on the
same account (or, without one, the same address) waited on this client at
the same time, or started less than BURST_GAP_US before it. A lone user's
timeout during a flood on other accounts is an outage for the fail policy.

Who is in the burst matters too. Parallel checks of one requester on an
account (route, tenant, account, address and X-Forwarded-For: behind a
reverse proxy the address is the proxy's, and the forwarded header tells
its users apart) are a guesser's own burst, refused for as long as they
last. A check in a burst on her account that is not her own (others'
checks, from other addresses) is refused as busy for at most busy_max in a
window of 120 x busy_max (`BusyWindows`), so nobody can keep her out by
checking her account; past that her timeout follows the fail policy. That
way out is only for a requester this client has seen log in
(`KnownRequesters`: a success reported through it within KNOWN_FOR, at
most KNOWN_PER_ACCOUNT_MAX requesters an account): anyone else in a burst
on the account (a guesser's other addresses, a botnet) stays busy, since a
late guess that failed open would be admitted with no check at all."""

import threading
import time
from collections import OrderedDict
from typing import Dict, Hashable, Tuple

from .protocol import Subject

# Far shorter than a person's next try, longer than a loaded host's
# scheduling delay.
BURST_GAP_US = 50_000
# Entries kept before the ended ones are swept.
SWEEP_AT = 1024
# Requesters whose busy window is tracked at once. A flood of distinct
# requesters cannot push out live windows: past the bound, a new one is
# not excused until old windows end.
BUSY_REQUESTERS_MAX = 4096
# A requester's busy window, in busy_max: refused as busy for at most
# busy_max of it.
BUSY_WINDOW_FACTOR = 120
# How long a requester's last reported success keeps her known (µs): 30 days.
KNOWN_FOR_US = 30 * 24 * 3600 * 1_000_000
# Known requesters remembered at once; past it the least recently
# succeeded makes room.
KNOWN_REQUESTERS_MAX = 65536
# Known requesters remembered per account; past it the account's least
# recently succeeded makes room.
KNOWN_PER_ACCOUNT_MAX = 16


def _now_us() -> int:
    # Offset so that 0 is never a start time.
    return time.monotonic_ns() // 1000 + BURST_GAP_US


class _Entry:
    __slots__ = ("waiting", "newest", "started_us")

    def __init__(self) -> None:
        self.waiting = 0
        self.newest = 0
        self.started_us = 0


class Bursts:
    """Per key (a burst key or a requester key): checks waiting on it, the
    newest of them, and when it last started. An entry lives while a check
    on it waits and BURST_GAP_US after the last one started (swept past
    SWEEP_AT entries)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: Dict[Hashable, _Entry] = {}
        self._seq = 0

    @staticmethod
    def key(route: str, subject: Subject) -> Tuple[Hashable, ...]:
        """The burst key: the route and the account, or without one the
        address."""
        if subject.account is not None:
            return (route, 1, subject.account)
        if subject.peer is not None:
            return (route, 2, str(subject.peer))
        return (route, 0)

    @staticmethod
    def requester(route: str, subject: Subject) -> Tuple[Hashable, ...]:
        """The requester key: the route, the tenant, the account, the address
        and the X-Forwarded-For header (as sent, bounded) when the subject
        has an account and an address or a forwarded header (its own tag, so
        it never equals a burst key); otherwise the burst key itself. Behind
        a reverse proxy the address is the proxy's: the forwarded header
        tells its users apart, so an attacker's checks cannot make hers an
        own burst; the same account name in another tenant is another
        requester. A tuple keeps every field apart (None is not "")."""
        if subject.account is not None and (subject.peer is not None or subject.forwarded_for is not None):
            peer = None if subject.peer is None else str(subject.peer)
            return (route, 3, subject.tenant, subject.account, peer, subject.forwarded_for)
        return Bursts.key(route, subject)

    @staticmethod
    def account(route: str, subject: Subject) -> Tuple[Hashable, ...]:
        """The account key of a known requester: the route, the tenant and
        the account (None without one: such a subject's requester is its
        burst key, whose being known never decides anything)."""
        return (route, subject.tenant, subject.account)

    def _enter_key(self, key: Hashable, seq: int, now: int) -> bool:
        """Counts a check waiting on `key` (under the lock); whether it has
        company there."""
        if len(self._entries) >= SWEEP_AT and key not in self._entries:
            self._entries = {
                k: e for k, e in self._entries.items() if e.waiting > 0 or now - e.started_us < BURST_GAP_US
            }
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        company = entry.waiting > 0 or (entry.started_us > 0 and now - entry.started_us < BURST_GAP_US)
        entry.waiting += 1
        entry.newest = seq
        entry.started_us = now
        return company

    def enter(self, route: str, subject: Subject) -> "BurstGuard":
        """Counts a check on the subject's burst key and requester key as
        waiting until `leave` (once when they are the same key)."""
        key = self.key(route, subject)
        requester = self.requester(route, subject)
        with self._lock:
            self._seq += 1
            seq = self._seq
            now = _now_us()
            company = self._enter_key(key, seq, now)
            own_company = company if requester == key else self._enter_key(requester, seq, now)
        return BurstGuard(self, key, requester, seq, company, own_company)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


class BurstGuard:
    def __init__(
        self, bursts: Bursts, key: Hashable, requester: Hashable, seq: int, company: bool, own_company: bool
    ) -> None:
        self._bursts = bursts
        self._key = key
        self.requester = requester
        self._seq = seq
        self._company = company
        self._own_company = own_company
        self._left = False

    def _with_company(self, key: Hashable, company: bool) -> bool:
        with self._bursts._lock:
            entry = self._bursts._entries.get(key)
            return company or (entry is not None and entry.newest > self._seq)

    def in_burst(self) -> bool:
        """Whether another check on its key waited while it did (before or
        after it came), or started within BURST_GAP_US before it."""
        return self._with_company(self._key, self._company)

    def own_burst(self) -> bool:
        """`in_burst` on its requester key: another check on the same account
        from the same address (or, without both, on the same burst key)
        waited while it did, or started within BURST_GAP_US before it."""
        return self._with_company(self.requester, self._own_company)

    def leave(self) -> None:
        with self._bursts._lock:
            if self._left:
                return
            self._left = True
            keys = (self._key,) if self.requester == self._key else (self._key, self.requester)
            for key in keys:
                entry = self._bursts._entries.get(key)
                if entry is not None:
                    entry.waiting -= 1


class BusyWindows:
    """Per requester key, when its busy window's first refusal was (µs on a
    monotonic clock). A burst on an account that is not the requester's own
    may refuse her as busy for at most busy_max per window of
    BUSY_WINDOW_FACTOR x busy_max: others checking her account cannot keep
    her out; past that her timeout follows the fail policy."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._first: Dict[Hashable, int] = {}

    def excused(self, requester: Hashable, now_us: int, busy_max_us: int) -> bool:
        """Whether the requester's timeout in a burst not her own may still be
        refused as busy at `now_us`; the first such refusal opens her window."""
        window = BUSY_WINDOW_FACTOR * busy_max_us
        with self._lock:
            first = self._first.get(requester)
            if first is not None:
                if now_us - first < window:
                    return now_us - first < busy_max_us
                self._first[requester] = now_us
                return busy_max_us > 0
            if len(self._first) >= BUSY_REQUESTERS_MAX:
                self._first = {k: t for k, t in self._first.items() if now_us - t < window}
                if len(self._first) >= BUSY_REQUESTERS_MAX:
                    # A flood of distinct requesters cannot make room.
                    return False
            self._first[requester] = now_us
            return busy_max_us > 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._first)


class KnownRequesters:
    """Per requester key, when a success was last reported through this
    client for it (µs on the client's monotonic clock). Only a user who has
    logged in from this address may leave busy in others' bursts on her
    account after her busy window; a requester never seen succeeding (a
    guesser's other addresses) stays busy, since a late guess that failed
    open would be admitted with no check at all.

    At most KNOWN_PER_ACCOUNT_MAX requesters an account and
    KNOWN_REQUESTERS_MAX in all, each bound evicting the least recently
    succeeded, in constant time. Evicted oldest-first over the whole map,
    an attacker logging in to his own account from fresh addresses could
    push every user out with 65,536 logins (and each eviction scanned the
    whole map under the lock); capped per account he needs 4,096 accounts
    of his own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # requester -> (last success, account key); least recent first.
        self._last: "OrderedDict[Hashable, Tuple[int, Hashable]]" = OrderedDict()
        # account key -> its requesters (at most KNOWN_PER_ACCOUNT_MAX),
        # least recent first.
        self._accounts: "Dict[Hashable, OrderedDict[Hashable, None]]" = {}

    def succeeded(self, requester: Hashable, account: Hashable, now_us: int) -> None:
        """Records a success reported for the requester (of account key
        `account`) at `now_us`, as the most recent. A new requester first
        makes room in its account, then in the whole map; an update needs
        no room."""
        with self._lock:
            entry = self._last.get(requester)
            if entry is not None:
                # Its account key stays the one it was recorded with (a
                # requester keyed without its tenant, having no account or
                # no address, may come with another).
                self._last[requester] = (now_us, entry[1])
                self._last.move_to_end(requester)
                self._accounts[entry[1]].move_to_end(requester)
                return
            requesters = self._accounts.get(account)
            if requesters is not None and len(requesters) >= KNOWN_PER_ACCOUNT_MAX:
                oldest, _ = requesters.popitem(last=False)
                del self._last[oldest]
            if len(self._last) >= KNOWN_REQUESTERS_MAX:
                oldest, (_, oldest_account) = self._last.popitem(last=False)
                self._forget(oldest, oldest_account)
            if requesters is None or account not in self._accounts:
                requesters = self._accounts[account] = OrderedDict()
            self._last[requester] = (now_us, account)
            requesters[requester] = None

    def _forget(self, requester: Hashable, account: Hashable) -> None:
        requesters = self._accounts[account]
        del requesters[requester]
        if not requesters:
            del self._accounts[account]

    def known(self, requester: Hashable, now_us: int) -> bool:
        """Whether a success was reported for the requester less than
        KNOWN_FOR_US before `now_us` (an expired entry may stay until
        evicted)."""
        with self._lock:
            entry = self._last.get(requester)
            return entry is not None and now_us - entry[0] < KNOWN_FOR_US

    def __len__(self) -> int:
        with self._lock:
            return len(self._last)
