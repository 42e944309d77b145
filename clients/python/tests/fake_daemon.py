"""A stand-in daemon on a temporary Unix socket, for the client's behaviour
on old, silent, slow or broken daemons without the real one."""

import os
import socket
import struct
import tempfile
import threading
import time
from typing import Callable, List, Optional, Tuple

Handler = Callable[["FakeDaemon", int, int, int, bytes], Optional[bytes]]


def verdict_payload(version, request_id, decision=0, retry_after_ms=0, delay_ms=0, reason=0, rule="r", flags=0,
                    limit=5, remaining=4, reset_ms=0):
    raw = rule.encode()
    body = struct.pack("<IIQQIIQI", 0, decision, retry_after_ms, delay_ms, limit, remaining, reset_ms, reason)
    body += struct.pack("<Q", len(raw)) + raw
    if version >= 2:
        body += bytes([flags])
    return struct.pack("<BQ", version, request_id) + body


def error_payload(version, request_id, code, message="no"):
    raw = message.encode()
    return struct.pack("<BQII", version, request_id, 5, code) + struct.pack("<Q", len(raw)) + raw


def allow_all(daemon, version, request_id, variant, body):
    return verdict_payload(version, request_id)


def version_1_only(daemon, version, request_id, variant, body):
    if version != 1:
        return error_payload(1, request_id, 1, "protocol version {} is not supported".format(version))
    if variant == 8:
        return error_payload(1, request_id, 0, "unknown request tag 8")
    return verdict_payload(1, request_id)


def silent(daemon, version, request_id, variant, body):
    return None


class InTimeThenLate:
    """A handler that answers at once, `delay` seconds after the request
    (`late`), or never (`silent`), as `mode` says when a request comes: a
    daemon loaded past the client's deadline, then gone."""

    IN_TIME, LATE, SILENT = "in time", "late", "silent"

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.mode = self.IN_TIME

    def __call__(self, daemon, version, request_id, variant, body):
        mode = self.mode
        if mode == self.SILENT:
            return None
        if mode == self.LATE:
            time.sleep(self.delay)
        return verdict_payload(version, request_id)


class FakeDaemon:
    def __init__(self, handler: Handler = allow_all) -> None:
        self.handler = handler
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "fake.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(64)
        self.lock = threading.Lock()
        # (connection number, version, id, request variant, the frame's payload)
        self.requests: List[Tuple[int, int, int, int, bytes]] = []
        self.connections = 0
        # Connections whose serving ended: the client closed them (or the
        # daemon did).
        self.ended = 0
        self.open: List[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> "FakeDaemon":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        with self.lock:
            for conn in self.open:
                conn.close()
        self.dir.cleanup()

    def drop_connections(self) -> None:
        with self.lock:
            for conn in self.open:
                conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self.open.clear()

    def variants(self) -> List[int]:
        with self.lock:
            return [r[3] for r in self.requests]

    def versions(self) -> List[int]:
        with self.lock:
            return [r[1] for r in self.requests]

    def connections_open(self) -> int:
        """Connections the client has not closed, as far as the daemon has
        seen."""
        with self.lock:
            return self.connections - self.ended

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                number = self.connections
                self.open.append(conn)
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        try:
            while True:
                header = self._read(conn, 4)
                if header is None:
                    return
                payload = self._read(conn, struct.unpack("<I", header)[0])
                if payload is None:
                    return
                version, request_id, variant = struct.unpack_from("<BQI", payload)
                with self.lock:
                    self.requests.append((number, version, request_id, variant, payload))
                reply = self.handler(self, version, request_id, variant, payload)
                if reply is not None:
                    conn.sendall(struct.pack("<I", len(reply)) + reply)
        except OSError:
            return
        finally:
            with self.lock:
                self.ended += 1

    @staticmethod
    def _read(conn: socket.socket, n: int) -> Optional[bytes]:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data
