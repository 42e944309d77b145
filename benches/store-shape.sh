#!/usr/bin/env bash
# store-shape.sh: what a store call costs Redis before any decision
# (issue 14; docs/performance.md, "The store's CPU a request").
#
# On a private redis-server pinned to CPU 0, redis-benchmark on CPU 1,
# ROUNDS times (default 2), prints Redis's CPU time (user + system, /proc)
# per call of:
#   empty:        EVALSHA of `return 1`, no keys, one argument;
#   keys_blob:    the same script with a batch's 40 keys and one packed
#                 argument (720 bytes);
#   keys_args:    40 keys and 49 arguments: a 12-op batch as the daemon
#                 lays it out (the op count, then each op's kind, argument
#                 count, key count and one packed argument);
#   walk:         the same batch, on a script that walks its 12 ops (their
#                 counts read with tonumber, a 16-byte reply packed each):
#                 the least a batch's script can do with its ops;
# each from 4 connections, no pipelining, N calls (default 100,000); then
# native commands without a script, pipelined 24 deep from 4 connections
# on random keys from 1,000,000, N2 commands each (default 2,000,000):
# INCR, SET, GET (of the keys SET wrote), and SET ... PX of an
# entry-sized value (38 bytes); and the commands a design keeping an
# account's counters in one hash would send: HINCRBY of one field,
# HMGET of four (the hashes hold only the one HINCRBY wrote), PEXPIRE
# of the hash. Any error reply fails the script.
# Needs redis-server, redis-cli, redis-benchmark.
set -euo pipefail

ROUNDS=${ROUNDS:-2}
N=${N:-100000}
N2=${N2:-2000000}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=benches/lib.sh
. "$HERE/lib.sh"

with_temp_dir tg-store-shape
start_redis "$TMP"
PIDS+=("$REDIS_PID")
# Every thread of it (bio_*, jemalloc's too), not only the main one.
taskset -a -p -c 0 "$REDIS_PID" > /dev/null
sock=$TMP/r.sock

empty=$(redis-cli -s "$sock" SCRIPT LOAD "return 1")
walk=$(redis-cli -s "$sock" SCRIPT LOAD "$(cat <<'LUA'
local n = tonumber(ARGV[1]); local a = 2
local out = {}
for i = 1, n do
  local kind = ARGV[a]; local na = tonumber(ARGV[a + 1]); local nk = tonumber(ARGV[a + 2])
  a = a + 3 + na
  out[i] = struct.pack('<i8i8', 0, 1)
end
return out
LUA
)")
keys=()
for i in $(seq 40); do keys+=("tg:{a$i}:lf:0123456789abcdef0123456789abcdef"); done
ops=(12)
for _ in $(seq 12); do ops+=(C 1 3 "$(printf 'x%.0s' $(seq 60))"); done
blob=$(printf 'x%.0s' $(seq 720))

ticks() { awk '{print $14 + $15}' "/proc/$REDIS_PID/stat"; }
per_call() { # name, calls, redis-benchmark args...
  local name=$1 calls=$2 before after
  shift 2
  before=$(ticks)
  taskset -c 1 redis-benchmark -s "$sock" -q "$@" > /dev/null
  after=$(ticks)
  # redis-benchmark -q shows no errors: a call that failed is not timed.
  local errors
  errors=$(redis-cli -s "$sock" INFO stats | tr -d '\r' | sed -n 's/^total_error_replies://p')
  [ "${errors:-0}" = 0 ] || { echo "${0##*/}: $name: the store answered $errors errors" >&2; exit 1; }
  echo "${name}_redis_cpu_us=$(awk -v t=$((after - before)) -v n="$calls" -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "%.1f", t / hz * 1e6 / n }')"
}

for round in $(seq "$ROUNDS"); do
  per_call "round${round}_empty" "$N" -c 4 -n "$N" EVALSHA "$empty" 0 x
  per_call "round${round}_keys_blob" "$N" -c 4 -n "$N" EVALSHA "$empty" 40 "${keys[@]}" "$blob"
  per_call "round${round}_keys_args" "$N" -c 4 -n "$N" EVALSHA "$empty" 40 "${keys[@]}" "${ops[@]}"
  per_call "round${round}_walk" "$N" -c 4 -n "$N" EVALSHA "$walk" 40 "${keys[@]}" "${ops[@]}"
  # SET before GET, so that the GETs find their keys.
  for t in incr set get; do
    per_call "round${round}_native_$t" "$N2" -c 4 -P 24 -r 1000000 -n "$N2" -t "$t"
  done
  per_call "round${round}_native_set_px" "$N2" -c 4 -P 24 -r 1000000 -n "$N2" \
    SET 'k:{__rand_int__}:f' 12345678901234567890123456789012345678 PX 120000
  # HINCRBY first, so that HMGET and PEXPIRE find most hashes.
  per_call "round${round}_native_hincrby" "$N2" -c 4 -P 24 -r 1000000 -n "$N2" HINCRBY 'h:{__rand_int__}' p 1
  per_call "round${round}_native_hmget4" "$N2" -c 4 -P 24 -r 1000000 -n "$N2" HMGET 'h:{__rand_int__}' p q r s
  per_call "round${round}_native_pexpire" "$N2" -c 4 -P 24 -r 1000000 -n "$N2" PEXPIRE 'h:{__rand_int__}' 120000
done
