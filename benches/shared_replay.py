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
parsing of the command, no reply writing, no daemon. Needs only python3
and redis-server.

SAME=1 checks instead that every VARIANT does what SCRIPT does on these
batches: each script runs once on a pinned clock (the store's TIME
replaced, in a copy, by a value the replay sets before each batch: the
capture's own timestamps, moved by one offset for every script so that
they lie ahead of the store's real clock and no entry's PXAT expires
during the replay), and every reply (its RESP type and bytes) and the
whole keyspace after the last batch (each key's type, value and expiry
instant) must equal SCRIPT's. Prints the first difference and exits 1.
What it cannot see:
- ops and values the capture does not hold: the bench sends no device,
  so there is no device scope, no unlock, merge, release or join, no
  rate (`}:g:`) rule, no lock-until (only a merge sets one), no foreign
  or wrong-type value at tollgate's keys; the success-heavy capture
  locks nothing (capture another with failures on few keys for that);
- expiries set relative to the store's real clock (an account's index,
  a known device, the hosts' set): each is compared as an offset from
  its own run's start, within the longest run's duration (printed), so
  a change of a TTL smaller than that passes. A failure or rate entry's
  expiry comes from the pinned clock and must be equal to the ms;
- the store's real clock read any other way: a script with more than
  one TIME call is refused.
"""
import contextlib
import os
import re
import shutil
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


class Error(bytes):
    """An error reply, kept as a value: raising mid-reply would leave the
    rest of a nested reply unread and every later reply out of step."""


class Redis:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.file = self.sock.makefile("rb")

    def reply(self, typed=False):
        """One whole reply. typed: simple strings and integers come as
        (type, bytes), so that `:1`, `+1` and `$1 1` differ."""
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"-":
            return Error(rest)
        if kind in (b"+", b":"):
            return (kind, rest) if typed else rest
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.file.read(n + 2)[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply(typed) for _ in range(n)]
        raise RuntimeError("unexpected reply %r" % line)

    def call(self, *args):
        self.sock.sendall(command(list(args)))
        got = self.reply()
        if isinstance(got, Error):
            raise RuntimeError("%s: %s" % (args[0], got.decode(errors="replace")))
        return got


def first_error(reply):
    """The first error anywhere in a reply, or None."""
    if isinstance(reply, Error):
        return reply
    if isinstance(reply, list):
        return next((e for e in map(first_error, reply) if e is not None), None)
    return None


# The key a pinned clock is read from: not tollgate's (no hash tag).
CLOCK_KEY = b"shared-replay:now"
CLOCK_LINE = "local now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"


def pinned(script):
    """The script with its clock read from CLOCK_KEY instead of TIME."""
    text = script.decode()
    if text.count("'TIME'") + text.count('"TIME"') != 1:
        sys.exit("shared_replay.py: SAME=1 needs exactly one TIME call in every script")
    if CLOCK_LINE not in text:
        sys.exit("shared_replay.py: SAME=1 needs the line %r in every script" % CLOCK_LINE.strip())
    return text.replace(CLOCK_LINE, CLOCK_LINE + "now = tonumber(redis.call('GET', '%s'))\n" % CLOCK_KEY.decode()).encode()


def keyspace(redis):
    """Every key but the clock's: its type, its value and its expiry instant."""
    out = {}
    for key in sorted(redis.call("KEYS", "*")):
        if key == CLOCK_KEY:
            continue
        kind = redis.call("TYPE", key)
        if kind == b"string":
            value = redis.call("GET", key)
        elif kind == b"set":
            value = sorted(redis.call("SMEMBERS", key))
        elif kind == b"zset":
            value = redis.call("ZRANGE", key, "0", "-1", "WITHSCORES")
        elif kind == b"hash":
            flat = redis.call("HGETALL", key)
            value = sorted(zip(flat[::2], flat[1::2]))
        elif kind == b"list":
            value = redis.call("LRANGE", key, "0", "-1")
        else:
            value = kind
        out[key] = (kind, value, int(redis.call("PEXPIRETIME", key)))
    return out


def pinned_expiry(key):
    return b"}:f:" in key or b"}:g:" in key


def keyspace_difference(base, other, slack_ms):
    """The first key whose state differs, or None. Each state's expiry of
    a key not on the pinned clock is an offset from its run's start."""
    for key in sorted(set(base) | set(other)):
        a, b = base.get(key), other.get(key)
        if a == b:
            continue
        if a and b and a[:2] == b[:2] and not pinned_expiry(key) and a[2] >= 0 and b[2] >= 0:
            if abs(a[2] - b[2]) <= slack_ms:
                continue
        return key
    return None


def classes(keys):
    """How many keys of each kind a keyspace holds: an empty replay shows."""
    counts = {}
    for key in keys:
        kind = re.search(rb"\}:([a-z]+):", key)
        name = kind.group(1).decode() if kind else "other"
        counts[name] = counts.get(name, 0) + 1
    return " ".join("%s=%d" % kv for kv in sorted(counts.items()))


def same(redis, scripts, batches, stamps):
    """Runs each script once on the pinned clock; 0 if all match the first."""
    # One offset for every script: the capture's first instant 10 minutes
    # ahead of the store's real clock, so that no pinned PXAT is past, or
    # passes, while the scripts run.
    lead_us = 600 * 1000000
    offset = int(time.time() * 1000000) + lead_us - stamps[0]
    stamps = [s + offset for s in stamps]
    runs, longest_ms = [], 0
    for script in scripts:
        sha = redis.call("SCRIPT", "LOAD", pinned(open(script, "rb").read()))
        redis.call("FLUSHALL")
        started_ms = int(time.time() * 1000)
        replies = []
        for start in range(0, len(batches), 32):
            chunk = list(zip(batches[start:start + 32], stamps[start:start + 32]))
            redis.sock.sendall(b"".join(
                command([b"SET", CLOCK_KEY, b"%d" % stamp]) + command([b"EVALSHA", sha] + batch)
                for batch, stamp in chunk))
            for _ in chunk:
                redis.reply()
                replies.append(redis.reply(typed=True))
        longest_ms = max(longest_ms, int(time.time() * 1000) - started_ms)
        keys = keyspace(redis)
        # Real-clock expiries as offsets from this run's start.
        keys = {k: (t, v, e if pinned_expiry(k) or e < 0 else e - started_ms) for k, (t, v, e) in keys.items()}
        runs.append((script, replies, keys))
    if time.time() * 1000000 >= stamps[0]:
        sys.exit("shared_replay.py: the replays outlasted the pinned clock's lead; nothing compared")
    base_script, base_replies, base_keys = runs[0]
    errors = sum(1 for r in base_replies if first_error(r) is not None)
    print("%s: %d replies (%d with an error), keys %s; real-clock expiries compared within %d ms" % (
        base_script, len(base_replies), errors, classes(base_keys), longest_ms))
    failed = 0
    for script, replies, keys in runs[1:]:
        diff = next((i for i, (a, b) in enumerate(zip(base_replies, replies)) if a != b), None)
        key = keyspace_difference(base_keys, keys, longest_ms)
        if diff is not None:
            print("%s: reply to batch %d differs from %s's:\n  %r\n  %r" % (
                script, diff, base_script, base_replies[diff], replies[diff]))
            failed = 1
        elif key is not None:
            print("%s: the keyspace differs from %s's at %r:\n  %r\n  %r" % (
                script, base_script, key, base_keys.get(key), keys.get(key)))
            failed = 1
        else:
            print("%s: the same %d replies and %d keys" % (script, len(replies), len(keys)))
    return failed


def read_capture(capture):
    """Every EVALSHA of a MONITOR capture: its arguments (without the
    command and the SHA) and its timestamp (µs), and the ops they hold."""
    batches, stamps, ops = [], [], 0
    with open(capture, encoding="latin-1") as f:
        for line in f:
            if '"EVALSHA"' in line:
                args = monitor_args(line)[2:]  # without EVALSHA and the SHA
                keys = int(args[0])
                ops += int(args[1 + keys])
                # The last argument is the store time after which the
                # batch's checks take no place: replayed at other times,
                # none (0), or every check would be refused unread.
                args[-1] = b"0"
                batches.append(args)
                # MONITOR's timestamp: seconds.microseconds.
                seconds, micros = line.split(" ", 1)[0].split(".")
                stamps.append(int(seconds) * 1000000 + int(micros))
    if not batches:
        sys.exit("%s: no EVALSHA in %s" % (os.path.basename(sys.argv[0]), capture))
    return batches, stamps, ops


@contextlib.contextmanager
def pinned_redis():
    """A fresh redis-server, on CPU 0 when the machine has two (this client
    elsewhere), connected; gone when the block ends."""
    tmp = tempfile.mkdtemp(prefix="tg-replay.")
    path = os.path.join(tmp, "r.sock")
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
        yield Redis(path)
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def time_scripts(redis, runs, rounds):
    """Redis's own µs a batch (`usec_per_call` of EVALSHA) for each run,
    a (name, script, batches) each, on a fresh keyspace each round, the
    runs interleaved: a list of figures a run, one a round."""
    shas = [redis.call("SCRIPT", "LOAD", script) for _, script, _ in runs]
    costs = [[] for _ in runs]
    for _ in range(rounds):
        for i, ((name, _, batches), sha) in enumerate(zip(runs, shas)):
            redis.call("FLUSHALL")
            redis.call("CONFIG", "RESETSTAT")
            for start in range(0, len(batches), 32):
                chunk = batches[start:start + 32]
                redis.sock.sendall(b"".join(command([b"EVALSHA", sha] + b) for b in chunk))
                for _ in chunk:
                    error = first_error(redis.reply())
                    if error is not None:
                        sys.exit("%s: %s answered a batch with %s" % (
                            os.path.basename(sys.argv[0]), name, error.decode(errors="replace")))
            stats = redis.call("INFO", "commandstats").decode()
            calls, usec = re.search(r"cmdstat_evalsha:calls=(\d+),usec=(\d+)", stats).groups()
            costs[i].append(int(usec) / int(calls))
    return costs


def print_costs(names, costs, batches, ops, rounds):
    print("batches=%d ops_per_batch=%.1f rounds=%d" % (batches, ops / batches, rounds))
    for name, xs in zip(names, costs):
        median = sorted(xs)[len(xs) // 2]
        print("%s us_per_batch=%.1f us_per_op=%.2f rounds=%s" % (
            name, median, median * batches / ops, "/".join("%.0f" % x for x in xs)))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    capture, scripts = sys.argv[1], sys.argv[2:]
    rounds = int(os.environ.get("ROUNDS", "5"))
    batches, stamps, ops = read_capture(capture)
    with pinned_redis() as redis:
        if os.environ.get("SAME") == "1":
            sys.exit(same(redis, scripts, batches, stamps))
        runs = [(script, open(script, "rb").read(), batches) for script in scripts]
        costs = time_scripts(redis, runs, rounds)
    print_costs(scripts, costs, len(batches), ops, rounds)


if __name__ == "__main__":
    main()
