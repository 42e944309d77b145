#!/usr/bin/env python3
"""script_framing.py: what the framing of a batch costs the store, apart
from anything an op decides (issue 14). Used by benches/shared-replay.sh
with FRAMING=1.

    script_framing.py CAPTURE [SCRIPT ...]

Replays the captured batches (as shared_replay.py does: Redis pinned to
CPU 0, FLUSHALL and RESETSTAT before each script, ROUNDS rounds
interleaved, Redis's own `usec_per_call` of EVALSHA) through three
minimal scripts that read each op's header and answer it at once, the
way a decision would be framed:

- today: the batch as the daemon sends it (four arguments an op: kind,
  argument count, key count, the packed argument), one packed reply an op;
- one-argument: every op in one argument (kind, key count, argument
  length, the packed argument), one packed reply an op;
- one-reply: the same, and the batch's replies joined in one string.

The captured batches are rewritten for the last two. Any SCRIPT given
(for instance a copy of decide.lua that only reads its arguments) runs on the
batches as captured, for comparison. Nothing is decided, so the replies
are not checked beyond not being errors.
"""
import os
import struct
import sys

from shared_replay import pinned_redis, print_costs, read_capture, time_scripts

PROLOGUE = """local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local formats = {}
local function ints(out)
  local f = formats[#out]
  if not f then f = '<' .. string.rep('i8', #out); formats[#out] = f end
  return struct.pack(f, unpack(out))
end
"""

# Reads a batch of ops in one argument and answers each at once; REPLY
# is how an op's answer joins the replies, RETURN what the batch returns.
ONE_ARGUMENT = PROLOGUE + """local frame, at, k, o = ARGV[1], 1, 1, 0
local replies = {}
while at <= #frame do
  local kind, keys, len
  kind, keys, len, at = struct.unpack('<c1HI4', frame, at)
  local blob = string.sub(frame, at, at + len - 1)
  at, k, o = at + len, k + keys, o + 1
  local reply = ints((kind == 'C') and { 1, now } or { 0, now })
  replies[o] = REPLY
end
return RETURN
"""

MINIMAL = {
    "today": PROLOGUE + """local a, k = 2, 1
local replies = {}
for o = 1, tonumber(ARGV[1]) do
  local kind = ARGV[a]
  local span_args, span_keys = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local blob = ARGV[a + 3]
  replies[o] = ints((kind == 'C') and { 1, now } or { 0, now })
  a, k = a + 3 + span_args, k + span_keys
end
return replies
""",
    "one-argument": ONE_ARGUMENT.replace("REPLY", "reply").replace("RETURN", "replies"),
    "one-reply": ONE_ARGUMENT.replace("REPLY", "struct.pack('<I4', #reply) .. reply").replace(
        "RETURN", "table.concat(replies)"),
}


def one_argument(args):
    """A captured batch's arguments with its ops in one argument: each op's
    kind, key count and argument length, then its argument (an op of
    several arguments, a heartbeat, has them each after its length)."""
    keys = int(args[0])
    rest = args[1 + keys:]
    frame, i = b"", 1
    for _ in range(int(rest[0])):
        kind, count, span_keys = rest[i], int(rest[i + 1]), int(rest[i + 2])
        values = rest[i + 3:i + 3 + count]
        arg = values[0] if count == 1 else b"".join(struct.pack("<I", len(v)) + v for v in values)
        frame += kind + struct.pack("<HI", span_keys, len(arg)) + arg
        i += 3 + count
    return args[:1 + keys] + [frame]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    capture, extra = sys.argv[1], sys.argv[2:]
    rounds = int(os.environ.get("ROUNDS", "5"))
    batches, _, ops = read_capture(capture)
    rewritten = [one_argument(b) for b in batches]
    runs = [(name, text.encode(), batches if name == "today" else rewritten) for name, text in MINIMAL.items()]
    runs += [(path, open(path, "rb").read(), batches) for path in extra]
    with pinned_redis() as redis:
        costs = time_scripts(redis, runs, rounds)
    print_costs([name for name, _, _ in runs], costs, len(batches), ops, rounds)


if __name__ == "__main__":
    main()
