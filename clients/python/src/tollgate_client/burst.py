"""Which checks of this client are in a burst (`client/src/burst.rs`), and
for how long a burst may refuse one requester.

A timeout from a busy daemon stops a login only when another check on the
same account (or, without one, the same address) waited on this client at
the same time, or started less than BURST_GAP_US before it. A lone user's
timeout during a flood on other accounts is an outage for the fail policy.

Who is in the burst matters too. Parallel checks on one account from one
address (the requester: route, account and address) are a guesser's own
burst, refused for as long as they last. A check in a burst on her account
that is not her own (others' checks, from other addresses) is refused as
busy for at most busy_max in a window of 120 x busy_max (`BusyWindows`),
so nobody can keep her out by checking her account; past that her timeout
follows the fail policy. That way out is only for a requester this client
has seen log in (`KnownRequesters`: a success reported through it within
KNOWN_FOR): anyone else in a burst on the account (a guesser's other
addresses, a botnet) stays busy, since a late guess that failed open would
be admitted with no check at all."""

import threading
import time
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
# Known requesters remembered at once; past it the stale, else the oldest,
# make room.
KNOWN_REQUESTERS_MAX = 65536


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
        """The requester key: the route, the account and the address when the
        subject has both (its own tag, so it never equals a burst key);
        otherwise the burst key itself."""
        if subject.account is not None and subject.peer is not None:
            return (route, 3, subject.account, str(subject.peer))
        return Bursts.key(route, subject)

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
    open would be admitted with no check at all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: Dict[Hashable, int] = {}

    def succeeded(self, requester: Hashable, now_us: int) -> None:
        """Records a success reported for the requester at `now_us`. A new
        requester in a full map first drops the entries older than
        KNOWN_FOR_US, else the oldest one; an update needs no room."""
        with self._lock:
            if requester not in self._last and len(self._last) >= KNOWN_REQUESTERS_MAX:
                self._last = {k: t for k, t in self._last.items() if now_us - t < KNOWN_FOR_US}
                if len(self._last) >= KNOWN_REQUESTERS_MAX:
                    # Rare: one scan for the oldest is enough.
                    del self._last[min(self._last, key=self._last.__getitem__)]
            self._last[requester] = now_us

    def known(self, requester: Hashable, now_us: int) -> bool:
        """Whether a success was reported for the requester less than
        KNOWN_FOR_US before `now_us`."""
        with self._lock:
            last = self._last.get(requester)
            return last is not None and now_us - last < KNOWN_FOR_US

    def __len__(self) -> int:
        with self._lock:
            return len(self._last)
