#!/usr/bin/env python3
"""shared_replay.py: what the shared store's script costs Redis, apart
from everything else (issue 14). Used by benches/shared-replay.sh.

    shared_replay.py CAPTURE SCRIPT [VARIANT ...]

CAPTURE is `redis-cli MONITOR` output taken while daemons ran a load;
every EVALSHA in it is one batch. Each round, for SCRIPT and then each
VARIANT (a decide.lua edited to try something), a fresh keyspace
(FLUSHALL) gets every captured batch once, in order, run by that script,
and Redis's own figure for it (`usec_per_call` of EVALSHA in INFO
commandstats) is kept. Prints the median microseconds a batch per script
over ROUNDS rounds (default 5), the rounds in order, and the ops a batch.

The figure is Redis's time inside the script only: no socket, no
parsing of the command, no reply writing, no daemon. A variant that
answers differently is still timed: compare what the variants do, not
only what they cost. Needs only python3 and redis-server.
"""
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

# redis-cli MONITOR quotes each argument and escapes bytes as C does.
ESCAPES = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b", '"': b'"', "\\": b"\\"}


def monitor_args(line):
    """The arguments of one MONITOR line, as bytes."""
    text = line[line.index('"'):]
    args, j = [], 0
    while j < len(text):
        if text[j] != '"':
            j += 1
            continue
        j += 1
        arg = bytearray()
        while text[j] != '"':
            if text[j] == "\\":
                if text[j + 1] == "x":
                    arg.append(int(text[j + 2:j + 4], 16))
                    j += 4
                else:
                    arg += ESCAPES[text[j + 1]]
                    j += 2
            else:
                arg += text[j].encode("latin-1")
                j += 1
        args.append(bytes(arg))
        j += 1
    return args


def command(args):
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(parts)


class Redis:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.file = self.sock.makefile("rb")

    def reply(self):
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"-":
            raise RuntimeError(rest.decode(errors="replace"))
        if kind in (b"+", b":"):
            return rest
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.file.read(n + 2)[:-2]
        if kind == b"*":
            return [self.reply() for _ in range(max(int(rest), 0))]
        raise RuntimeError("unexpected reply %r" % line)

    def call(self, *args):
        self.sock.sendall(command(list(args)))
        return self.reply()


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    capture, scripts = sys.argv[1], sys.argv[2:]
    rounds = int(os.environ.get("ROUNDS", "5"))
    batches, ops = [], 0
    with open(capture, encoding="latin-1") as f:
        for line in f:
            if '"EVALSHA"' in line:
                args = monitor_args(line)[2:]  # without EVALSHA and the SHA
                keys = int(args[0])
                ops += int(args[1 + keys])
                batches.append(args)
    if not batches:
        sys.exit("shared_replay.py: no EVALSHA in %s" % capture)
    tmp = tempfile.mkdtemp(prefix="tg-replay.")
    path = os.path.join(tmp, "r.sock")
    # Redis on CPU 0 and this client elsewhere when the machine has two.
    pin = ["taskset", "-c", "0"] if os.cpu_count() and os.cpu_count() > 1 else []
    server = subprocess.Popen(
        pin + ["redis-server", "--port", "0", "--unixsocket", path, "--save", "", "--appendonly", "no", "--dir", tmp],
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            if os.path.exists(path):
                break
            time.sleep(0.05)
        redis = Redis(path)
        shas = [redis.call("SCRIPT", "LOAD", open(s, "rb").read()) for s in scripts]
        costs = [[] for _ in scripts]
        for _ in range(rounds):
            for i, sha in enumerate(shas):
                redis.call("FLUSHALL")
                redis.call("CONFIG", "RESETSTAT")
                for start in range(0, len(batches), 32):
                    chunk = batches[start:start + 32]
                    redis.sock.sendall(b"".join(command([b"EVALSHA", sha] + b) for b in chunk))
                    for _ in chunk:
                        redis.reply()
                stats = redis.call("INFO", "commandstats").decode()
                calls, usec = re.search(r"cmdstat_evalsha:calls=(\d+),usec=(\d+)", stats).groups()
                costs[i].append(int(usec) / int(calls))
        print("batches=%d ops_per_batch=%.1f rounds=%d" % (len(batches), ops / len(batches), rounds))
        for script, xs in zip(scripts, costs):
            median = sorted(xs)[len(xs) // 2]
            print("%s us_per_batch=%.1f us_per_op=%.2f rounds=%s" % (
                script, median, median * len(batches) / ops, "/".join("%.0f" % x for x in xs)))
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
