"""What the auth server should do with an attempt: the daemon's verdict,
its refusal of the request itself, or the fail policy when it could not
answer in time (never a made-up verdict)."""

import enum
from dataclasses import dataclass, field
from typing import Optional

from .errors import Busy, ClientError
from .protocol import Decision, ErrorReply, Verdict


class FailPolicy(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


class Answer:
    @property
    def proceeds(self) -> bool:
        """Whether the attempt may go ahead (after `delay` for a delay)."""
        raise NotImplementedError

    # The daemon's verdict, on a VerdictAnswer only (None on the others).
    verdict: Optional[Verdict]

    @property
    def delay(self) -> Optional[float]:
        """Seconds to hold the attempt before it proceeds (a `delay` verdict)."""
        verdict = self.verdict
        if verdict is not None and verdict.decision == Decision.DELAY and verdict.delay_ms > 0:
            return verdict.delay_ms / 1000.0
        return None

    @property
    def retry_after_secs(self) -> int:
        """The `Retry-After` for a refusal: whole seconds, rounded up, at
        least 1; 1 when the refusal did not come from a verdict."""
        verdict = self.verdict
        if verdict is None:
            return 1
        return max(-(-verdict.retry_after_ms // 1000), 1)


@dataclass(frozen=True)
class VerdictAnswer(Answer):
    """The daemon's verdict, and the protocol version it came in."""

    verdict: Verdict
    version: int

    @property
    def proceeds(self) -> bool:
        return self.verdict.proceeds

    @property
    def degraded(self) -> bool:
        return self.verdict.degraded


@dataclass(frozen=True)
class Rejected(Answer):
    """The daemon refused the request itself (an identifier too long, an
    unknown route): the attempt is refused; fix the caller."""

    error: ErrorReply
    verdict: None = field(default=None, init=False, repr=False, compare=False)

    @property
    def proceeds(self) -> bool:
        return False


@dataclass(frozen=True)
class Unavailable(Answer):
    """The daemon could not answer in time: the route's fail policy decides,
    and a closed route may still let the attempt through within its static
    budget. A busy daemon never lets it through."""

    policy: FailPolicy
    error: ClientError
    within_static_budget: bool
    verdict: None = field(default=None, init=False, repr=False, compare=False)

    @property
    def proceeds(self) -> bool:
        if isinstance(self.error, Busy):
            return False
        return self.policy == FailPolicy.OPEN or self.within_static_budget
