#!/usr/bin/env python3
"""shared_ceiling.py: stand-ins for decide.lua that bound what any
rewrite of its logic could give (issue 14). Used by
benches/shared-ceiling.sh.

    shared_ceiling.py DECIDE_LUA KIND > OUT.lua

KIND is one of:
- null: a check and a report read their arguments and answer at once,
  touching no key: what the daemon, the batching, the socket and
  EVALSHA's plumbing cost with a store that does no work;
- floor: the same answers, after each failure entry of a check is read
  (GET) and written (SET ... PXAT) and each of a report's is read and
  deleted (DEL) or, a failure, written and listed in its account's
  index (TYPE, SADD, PEXPIRE): the store work of the two global login rules in
  decide.lua's layout (one key an entry), with no decision;
- gcra: each check and each report runs the peer's own decision
  (../shared/bench/gcra.lua's GCRA: GET, arithmetic, SET ... PX when
  allowed) on one key, its first failure entry's, and nothing else: a
  store as lean a request as the peer's a call, one key an op, with no
  places in flight, no failure window, no second rule. About the least
  a design that writes on every check and every report can ask of it.

Two more, for `benches/shared-replay.sh` only (the daemon refuses their
answers, so `shared-ceiling.sh` does not build them):
- bare: null without its answers' standing: each rule's numbers decoded,
  the op answered with its code and the store's time alone;
- skeleton: each op answers at once, its rules not read: the batch's
  arguments, the loop over its ops and their replies.

null, floor and gcra answer what decide.lua answers an admitted check and an unlocked
report, in its packed layout, so the daemon takes them as the store's
word; the bench script fails a run whose daemon counted an error or a
degraded answer. They are wrong on purpose (nothing is counted), so they
only ever run here. Release, merge, unlock, heartbeat and join are
decide.lua's own.
"""
import re
import sys

# Replaces check() and report(): everything from the first marker up to
# the second.
FROM, TO = "local function check()", "-- RELEASE:"

STAND_INS = r"""local function check()
  local n
  n, at = struct.unpack('<B', blob, at)
  local out = { 1, now }
  local first = true
  for i = 1, n do
    local kind, scope, W, T, timeout, mon, interval, tolerance
    kind, at = struct.unpack('c1', blob, at)
    local kn = key()
    if kind == 'f' then
      scope, W, T, timeout, mon, at = struct.unpack('<Bi8I4i8B', blob, at)
      --CHECK_TOUCH
      --STANDING
      -- not refused; standing: w, p, c, one place, its lapse, no lock, W
      out[#out + 1] = 0
      out[#out + 1] = widx(W, now); out[#out + 1] = 0; out[#out + 1] = 0; out[#out + 1] = 1
      out[#out + 1] = timeout; out[#out + 1] = 0; out[#out + 1] = W
      --END
    elseif kind == 'g' then
      scope, interval, tolerance, mon, at = struct.unpack('<Bi8i8B', blob, at)
      out[#out + 1] = 0; out[#out + 1] = now
    end
  end
  return out
end

local function report()
  local n
  n, at = struct.unpack('<B', blob, at)
  local out = { 0, now }
  local first = true
  for i = 1, n do
    local kind, scope, W, T, release, count, clear
    kind, at = struct.unpack('c1', blob, at)
    local kn = key()
    if kind == 'f' or kind == 'F' then
      scope, W, T, release, count, clear, at = struct.unpack('<Bi8I4BBB', blob, at)
      local ix = nil
      if kind == 'F' then ix = key() end
      --REPORT_TOUCH
      --STANDING
      -- not locked before or after; standing: w, nothing counted, W
      out[#out + 1] = 0; out[#out + 1] = 0
      out[#out + 1] = widx(W, now); out[#out + 1] = 0; out[#out + 1] = 0; out[#out + 1] = 0
      out[#out + 1] = 0; out[#out + 1] = 0; out[#out + 1] = W
      --END
    elseif kind == 'g' then
      scope, at = struct.unpack('<B', blob, at)
      out[#out + 1] = 0; out[#out + 1] = 0; out[#out + 1] = now
    elseif kind == 'D' then
      local ttl, max
      ttl, max, at = struct.unpack('<i8H', blob, at)
      key()
    end
  end
  return out
end

"""

# gcra.lua's decision with its arguments (burst 15, 30 a minute, a
# quantity of 1), on the op's first failure entry's key: times in
# microseconds, as there.
GCRA = (
    "if first then first = false; local interval, tolerance = 60 * 1000000 / 30, 60 * 1000000 / 30 * 15; "
    "local tat = tonumber(redis.call('GET', kn)); if not tat or tat < now then tat = now end; "
    "local new_tat = tat + interval; "
    "if new_tat - tolerance <= now then redis.call('SET', kn, string.format('%d', math.ceil(new_tat)), "
    "'PX', math.ceil((new_tat - now) / 1000)) end end"
)

# The floor's store work: decide.lua's entry is 39 bytes of header and
# 8 a place, and it expires two windows on.
TOUCH = {
    "null": ("", ""),
    "floor": (
        "redis.call('GET', kn); redis.call('SET', kn, string.rep('x', 47), 'PXAT', "
        "string.format('%d', math.ceil((now + 2 * W) / 1000)))",
        "redis.call('GET', kn); "
        # a failure is kept (counted), a success's entry goes
        "if count == 1 then redis.call('SET', kn, string.rep('x', 39), 'PXAT', "
        "string.format('%d', math.ceil((now + 2 * W) / 1000))) else redis.call('DEL', kn) end; "
        # a failure on an account-and-something rule also lists its entry
        # in the account's index, as decide.lua does
        "if ix and count == 1 then redis.call('TYPE', ix); redis.call('SADD', ix, kn); "
        "redis.call('PEXPIRE', ix, math.ceil(2 * W / 1000)) end",
    ),
    "gcra": (GCRA, GCRA),
    "bare": ("", ""),
    "skeleton": ("", ""),
}


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in TOUCH:
        sys.exit("usage: shared_ceiling.py DECIDE_LUA null|floor|gcra|bare|skeleton")
    source = open(sys.argv[1]).read()
    start, end = source.find(FROM), source.find(TO)
    if start < 0 or end < start:
        sys.exit(f"shared_ceiling.py: {sys.argv[1]} has no '{FROM}' ... '{TO}': decide.lua changed shape")
    check_touch, report_touch = TOUCH[sys.argv[2]]
    body = STAND_INS.replace("--CHECK_TOUCH", check_touch).replace("--REPORT_TOUCH", report_touch)
    if sys.argv[2] == "bare":
        body = re.sub(r"\n *--STANDING\n.*?--END\n", "\n", body, flags=re.S)
    if sys.argv[2] == "skeleton":
        for op, code in (("check", 1), ("report", 0)):
            head = "local function %s()\n" % op
            body = body.replace(head, head + "  do return { %d, now } end\n" % code)
    sys.stdout.write(source[:start] + body + source[end:])


if __name__ == "__main__":
    main()
