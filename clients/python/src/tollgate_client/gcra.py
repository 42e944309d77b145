"""GCRA for the static budgets of closed routes: one theoretical arrival
time (TAT) per route, as `client/src/gcra.rs`."""

from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class GcraSpec:
    interval_us: int
    burst: int

    @staticmethod
    def new(limit: int, period_us: int, burst: int) -> "GcraSpec":
        """`limit` requests per `period_us` sustained, `burst` at once."""
        if limit <= 0 or burst <= 0 or period_us <= 0:
            raise ValueError("limit, period and burst must be positive")
        return GcraSpec(interval_us=max(-(-period_us // limit), 1), burst=burst)

    @property
    def tolerance_us(self) -> int:
        return self.interval_us * self.burst


@dataclass(frozen=True)
class GcraDecision:
    allowed: bool
    remaining: int
    retry_after_us: int
    reset_us: int


def decide(spec: GcraSpec, tat_us: Optional[int], now_us: int, spend: bool) -> Tuple[GcraDecision, int]:
    """One request against a TAT: the decision and the new TAT (unchanged
    when refused, or when `spend` is false)."""
    tat = max(now_us if tat_us is None else tat_us, now_us)
    new_tat = tat + spec.interval_us
    allow_at = new_tat - spec.tolerance_us
    if allow_at > now_us:
        return GcraDecision(False, 0, allow_at - now_us, tat - now_us), tat
    after = new_tat if spend else tat
    room = now_us - allow_at
    remaining = min(room // spec.interval_us, 0xFFFFFFFF)
    return GcraDecision(True, remaining, 0, after - now_us), after
