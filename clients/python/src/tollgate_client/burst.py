"""Which checks of this client are in a burst (`client/src/burst.rs`): a
timeout from a busy daemon stops a login only when another check on the
same account (or, without one, the same address) waited on this client at
the same time, or started less than BURST_GAP_US before it. A lone user's
timeout during a flood on other accounts is an outage for the fail policy."""

import threading
import time
from typing import Dict, Hashable, Tuple

from .protocol import Subject

# Far shorter than a person's next try, longer than a loaded host's
# scheduling delay.
BURST_GAP_US = 50_000
# Entries kept before the ended ones are swept.
SWEEP_AT = 1024


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
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: Dict[Hashable, _Entry] = {}
        self._seq = 0

    @staticmethod
    def key(route: str, subject: Subject) -> Tuple[Hashable, ...]:
        if subject.account is not None:
            return (route, 1, subject.account)
        if subject.peer is not None:
            return (route, 2, str(subject.peer))
        return (route, 0)

    def enter(self, route: str, subject: Subject) -> "BurstGuard":
        """Counts a check on the subject's key as waiting until `leave`."""
        key = self.key(route, subject)
        with self._lock:
            self._seq += 1
            seq = self._seq
            now = _now_us()
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
        return BurstGuard(self, key, seq, company)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


class BurstGuard:
    def __init__(self, bursts: Bursts, key: Hashable, seq: int, company: bool) -> None:
        self._bursts = bursts
        self._key = key
        self._seq = seq
        self._company = company
        self._left = False

    def in_burst(self) -> bool:
        """Whether another check on its key waited while it did (before or
        after it came), or started within BURST_GAP_US before it."""
        with self._bursts._lock:
            entry = self._bursts._entries.get(self._key)
            return self._company or (entry is not None and entry.newest > self._seq)

    def leave(self) -> None:
        with self._bursts._lock:
            if self._left:
                return
            self._left = True
            entry = self._bursts._entries.get(self._key)
            if entry is not None:
                entry.waiting -= 1
