"""The attempt guard: a login attempt from its check to its outcome, which
gives its place back when it ends without one.

An allowed check holds a place on each failure rule until its report, so
parallel guesses cannot all pass before the first failure is counted. A
handler that never reports (an exception, an early return, a client that
hung up) would leave its place held until `attempt_timeout_ms`, and a
stranger who aborts logins on purpose could keep a real user out with
places nobody tried a password for. Leaving the `with` block without a
report sends `abandon` (`client/src/attempt.rs`)."""

import threading
from types import TracebackType
from typing import TYPE_CHECKING, Callable, Optional, Tuple, Type, Union

from .answers import Answer, VerdictAnswer
from .passwords import password_digest, password_tag
from .protocol import Decision, Outcome, Subject

if TYPE_CHECKING:
    from .client import Client


ENDED_MESSAGE = "this attempt has ended (reported, abandoned or left): nothing more is sent"


def _holds_places(answer: Answer) -> bool:
    # Only an allowed check holds places: a delayed one gave them back,
    # though it proceeds; a refused, rejected or unanswered one holds none
    # (a check that timed out may never have reached the daemon, and an
    # abandon would then free another attempt's place).
    return isinstance(answer, VerdictAnswer) and answer.verdict.decision == Decision.ALLOW


def _report_secrets(
    key: Callable[[], bytes],
    attempt_password: Optional[str],
    check_tag: Optional[bytes],
    subject: Subject,
    password: Optional[str],
    digest: Optional[bytes],
    tag: Optional[bytes],
) -> Tuple[Optional[bytes], Optional[bytes]]:
    """A guard's report's digest and tag: a given one wins; else the digest
    is the password's (the report's, else the attempt's), and the tag the
    report's password's, else the check's."""
    if tag is None and password is not None:
        tag = password_tag(key(), password)
    if tag is None:
        tag = check_tag
    password = attempt_password if password is None else password
    if digest is None and password is not None:
        digest = password_digest(key(), subject.account or "", password)
    return digest, tag


class Attempt:
    """Use as a context manager:

        with client.attempt("login", subject, password=pw) as attempt:
            if not attempt.proceeds:
                return refuse(attempt.answer.retry_after_secs)
            ...verify...
            attempt.report(ok)
    """

    def __init__(
        self,
        client: "Client",
        route: str,
        subject: Subject,
        password: Optional[str],
        answer: Answer,
        tag: Optional[bytes] = None,
    ):
        self._client = client
        self.route = route
        self.subject = subject
        self._password = password
        # The check's tag: the report's unless it gives its own (or a
        # password): a failure without one is invisible to spray detection.
        self._tag = tag
        self.answer = answer
        self._lock = threading.Lock()
        self._holds_places = _holds_places(answer)
        # Reported, abandoned or left: the guard sends nothing more. A stray
        # report would count a failure and settle another attempt's place.
        self._ended = False
        # Whether the guard sent an abandon (and the daemon's answer to it).
        self.abandoned = False
        self.abandon_answer: Optional[Answer] = None

    @classmethod
    def begin(
        cls,
        client: "Client",
        route: str,
        subject: Subject,
        password: Optional[str] = None,
        tag: Optional[bytes] = None,
    ) -> "Attempt":
        if tag is None and password is not None:
            tag = password_tag(cls._key(client), password)
        return cls(client, route, subject, password, client.check(route, subject, password_tag=tag), tag)

    @staticmethod
    def _key(client: "Client") -> bytes:
        key = client.config.password_key
        if key is None:
            raise ValueError("a password needs ClientConfig.password_key to compute its tag and digest")
        return key

    def __enter__(self) -> "Attempt":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.abandon()

    @property
    def proceeds(self) -> bool:
        """Whether the attempt may go ahead (after `delay` for a delay verdict)."""
        return self.answer.proceeds

    @property
    def delay(self) -> Optional[float]:
        return self.answer.delay

    @property
    def retry_after_secs(self) -> int:
        return self.answer.retry_after_secs

    def report(
        self,
        outcome: Union[Outcome, bool, str],
        subject: Optional[Subject] = None,
        password: Optional[str] = None,
        digest: Optional[bytes] = None,
        tag: Optional[bytes] = None,
    ) -> Answer:
        """Reports the verified outcome (True: success); the guard is spent.
        RuntimeError once the guard has ended (reported, abandoned, or its
        `with` block left): nothing is sent. `subject`: the subject as it stands after the verify (such as a device
        id issued at a successful sign-in); the route is the check's. The
        password (this one, else the attempt's) gives the digest unless it
        is passed; the tag is `tag`, else this password's, else the
        check's."""
        with self._lock:
            if self._ended:
                raise RuntimeError(ENDED_MESSAGE)
            self._ended = True
            self._holds_places = False
        subject = self.subject if subject is None else subject
        key = lambda: self._key(self._client)  # noqa: E731
        digest, tag = _report_secrets(key, self._password, self._tag, subject, password, digest, tag)
        return self._client.report(self.route, subject, outcome, digest, tag)

    def abandon(self) -> Optional[Answer]:
        """Gives the attempt up now, waiting for the daemon's answer; the
        guard has ended. None when it held no place (refused, unanswered,
        reported, or abandoned already): nothing is sent."""
        with self._lock:
            self._ended = True
            if not self._holds_places:
                return None
            self._holds_places = False
            self.abandoned = True
        self.abandon_answer = self._client.abandon(self.route, self.subject)
        return self.abandon_answer
