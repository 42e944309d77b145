"""The conformance runner (docs/clients.md, "The conformance kit"): one JSON
request a line on stdin, one JSON reply a line on stdout, in order."""

import json
import os
import socket
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from tollgate_client import (  # noqa: E402
    PROTOCOL_VERSION,
    Answer,
    Attempt,
    Check,
    Client,
    ClientConfig,
    FailPolicy,
    Rejected,
    Subject,
    Unavailable,
    VerdictAnswer,
    encode_request,
    password_digest,
    password_tag,
)

Json = Dict[str, Any]
SUBJECT_FIELDS = ("peer", "forwarded_for", "account", "device", "tenant", "client_id")


class RunnerError(Exception):
    pass


def answer_json(answer: Answer) -> Json:
    if isinstance(answer, VerdictAnswer):
        v = answer.verdict
        return {
            "answer": "verdict",
            "proceeds": answer.proceeds,
            "decision": v.decision.label,
            "retry_after_ms": v.retry_after_ms,
            "delay_ms": v.delay_ms,
            "limit": v.limit,
            "remaining": v.remaining,
            "reset_ms": v.reset_ms,
            "reason": v.reason.label,
            "rule": v.rule,
            "degraded": v.degraded,
            "retry_after_s": answer.retry_after_secs,
            "version": answer.version,
        }
    if isinstance(answer, Rejected):
        return {
            "answer": "rejected",
            "proceeds": False,
            "code": answer.error.code.label,
            "retry_after_s": answer.retry_after_secs,
        }
    if isinstance(answer, Unavailable):
        return {
            "answer": "unavailable",
            "proceeds": answer.proceeds,
            "policy": answer.policy.value,
            "error": answer.error.kind,
            "within_static_budget": answer.within_static_budget,
            "retry_after_s": answer.retry_after_secs,
        }
    raise RunnerError("unknown answer {!r}".format(answer))


def subject_of(value: Any) -> Subject:
    if value is None:
        return Subject()
    if not isinstance(value, dict):
        raise RunnerError("a subject is an object")
    return Subject(**{name: value.get(name) for name in SUBJECT_FIELDS})


class Runner:
    def __init__(self) -> None:
        self.client: Optional[Client] = None
        self.key: Optional[bytes] = None
        self.attempts: Dict[str, Attempt] = {}

    def need_client(self) -> Client:
        if self.client is None:
            raise RunnerError("no client: send `open` first")
        return self.client

    def need_key(self) -> bytes:
        if self.key is None:
            raise RunnerError("a password needs the `key` given to `open`")
        return self.key

    def tag(self, password: Optional[str]) -> Optional[bytes]:
        return None if password is None else password_tag(self.need_key(), password)

    def op_open(self, req: Json) -> Json:
        if self.client is not None:
            self.client.close()
            self.client = None
        self.attempts.clear()
        self.key = bytes.fromhex(req["key"]) if req.get("key") is not None else None
        settings: Json = {"password_key": self.key}
        if req.get("timeout_ms") is not None:
            settings["timeout"] = req["timeout_ms"] / 1000.0
        if req.get("busy_max_ms") is not None:
            settings["busy_max"] = req["busy_max_ms"] / 1000.0
        if req.get("protocol_version") is not None:
            settings["protocol_version"] = int(req["protocol_version"])
        config = ClientConfig(req["socket"], **settings)
        for route, policy in (req.get("fail_policies") or {}).items():
            config.fail_policy(route, FailPolicy(policy))
        for route, budget in (req.get("static_budgets") or {}).items():
            config.static_budget(route, int(budget["limit"]), budget["period_ms"] / 1000.0, int(budget["burst"]))
        self.client = Client(config)
        return {"ok": True}

    def op_check(self, req: Json) -> Json:
        tag = self.tag(req.get("password"))
        return answer_json(self.need_client().check(req["route"], subject_of(req.get("subject")), password_tag=tag))

    def op_report(self, req: Json) -> Json:
        subject = subject_of(req.get("subject"))
        password = req.get("password")
        digest = None
        if password is not None:
            digest = password_digest(self.need_key(), subject.account or "", password)
        answer = self.need_client().report(
            req["route"], subject, req["outcome"], password_digest=digest, password_tag=self.tag(password)
        )
        return answer_json(answer)

    def op_abandon(self, req: Json) -> Json:
        return answer_json(self.need_client().abandon(req["route"], subject_of(req.get("subject"))))

    def op_checks(self, req: Json) -> Json:
        client = self.need_client()
        subjects = [subject_of(s) for s in req["subjects"]]
        tag = self.tag(req.get("password"))
        answers: List[Optional[Answer]] = [None] * len(subjects)
        errors: List[BaseException] = []
        # Released together, so the checks really overlap on the client.
        start = threading.Barrier(len(subjects)) if subjects else None

        def one(index: int) -> None:
            try:
                if start is not None:
                    start.wait()
                answers[index] = client.check(req["route"], subjects[index], password_tag=tag)
            except BaseException as e:  # reported below, after every thread ended
                errors.append(e)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(subjects))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return {"answers": [answer_json(a) for a in answers if a is not None]}

    def op_begin(self, req: Json) -> Json:
        name = req["attempt"]
        attempt = self.need_client().attempt(req["route"], subject_of(req.get("subject")), password=req.get("password"))
        # The `with` block stays open across lines: `finish` and `end` leave it.
        self.attempts[name] = attempt.__enter__()
        return answer_json(attempt.answer)

    def find_attempt(self, req: Json, take: bool) -> Attempt:
        try:
            return self.attempts.pop(req["attempt"]) if take else self.attempts[req["attempt"]]
        except KeyError:
            raise RunnerError("no open attempt {!r}".format(req["attempt"])) from None

    def op_finish(self, req: Json) -> Json:
        # Kept under its name: a later `end` leaves the block, sending nothing.
        attempt = self.find_attempt(req, take=False)
        subject = subject_of(req["subject"]) if req.get("subject") is not None else None
        return answer_json(attempt.report(req["outcome"], subject=subject, password=req.get("password")))

    def op_end(self, req: Json) -> Json:
        attempt = self.find_attempt(req, take=True)
        # As an exception leaving the block would.
        ended = RuntimeError("the handler ended without an outcome")
        attempt.__exit__(type(ended), ended, None)
        return {"abandoned": attempt.abandoned}

    def op_digest(self, req: Json) -> Json:
        key = bytes.fromhex(req["key"]) if req.get("key") is not None else self.need_key()
        account = req.get("account") or ""
        password = req.get("password") or ""
        return {"digest": password_digest(key, account, password).hex(), "tag": password_tag(key, password).hex()}

    def op_bench(self, req: Json) -> Json:
        client = self.need_client()
        route = req["route"]
        subject = subject_of(req.get("subject"))
        threads_n = max(int(req.get("threads") or 1), 1)
        millis = int(req.get("millis") or 1000)
        raw = bool(req.get("raw"))
        counts = [0] * threads_n
        errors: List[BaseException] = []
        start = threading.Barrier(threads_n + 1)
        stop_at = [0.0]

        def checks(index: int) -> None:
            start.wait()
            n = 0
            while time.monotonic() < stop_at[0]:
                client.check(route, subject)
                n += 1
            counts[index] = n

        def raw_checks(index: int) -> None:
            # The language's raw socket: one pre-encoded frame, no decoding,
            # to measure what the client adds over it.
            frame = encode_request(PROTOCOL_VERSION, index + 1, Check(route, subject))
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(client.config.socket)
            try:
                start.wait()
                n = 0
                while time.monotonic() < stop_at[0]:
                    sock.sendall(frame)
                    header = recv_exact(sock, 4)
                    recv_exact(sock, int.from_bytes(header, "little"))
                    n += 1
                counts[index] = n
            finally:
                sock.close()

        def run(body: Callable[[int], None], index: int) -> None:
            try:
                body(index)
            except BaseException as e:
                errors.append(e)
                start.abort()

        body = raw_checks if raw else checks
        threads = [threading.Thread(target=run, args=(body, i)) for i in range(threads_n)]
        for t in threads:
            t.start()
        began = time.monotonic()
        stop_at[0] = began + millis / 1000.0
        try:
            start.wait()
        except threading.BrokenBarrierError:
            pass
        for t in threads:
            t.join()
        elapsed = time.monotonic() - began
        if errors:
            raise errors[0]
        return {"calls": sum(counts), "millis": int(round(elapsed * 1000))}

    def handle(self, line: str) -> Json:
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise RunnerError("a request is a JSON object")
            op = getattr(self, "op_" + str(req.get("op")), None)
            if op is None:
                raise RunnerError("unknown op {!r}".format(req.get("op")))
            result: Json = op(req)
            return result
        except KeyError as e:
            return {"error": "missing field {}".format(e)}
        except Exception as e:
            return {"error": "{}: {}".format(type(e).__name__, e)}


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the daemon closed the connection")
        data += chunk
    return data


def main() -> int:
    runner = Runner()
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = runner.handle(line)
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    if runner.client is not None:
        runner.client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
