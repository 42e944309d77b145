#!/usr/bin/env bash
# peer-cpu.sh: where the Redis+Lua peer's CPU goes (issue 14), for the
# budget in docs/performance.md ("The ceiling" under "Shared mode").
#
# Runs the peer's no-pipelining measure as ../shared/bench/peer-redis.sh
# does (its gcra.lua by EVALSHA, 50 connections, 1 in flight, random
# keys from 1,000,000) on a private redis-server, RUNS times (default 3),
# N requests each (default 300,000), and prints each run's requests/s
# with the CPU time (user + system) a request of Redis (/proc) and of
# redis-benchmark (bash's `time`), and the cores the two kept busy.
# Needs redis-server, redis-cli, redis-benchmark.
set -euo pipefail

RUNS=${RUNS:-3}
N=${N:-300000}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
LUA=${LUA:-$ROOT/../shared/bench/gcra.lua}
# shellcheck source=benches/lib.sh
. "$HERE/lib.sh"

with_temp_dir tg-peer-cpu
start_redis "$TMP"
PIDS+=("$REDIS_PID")
sha=$(redis-cli -s "$TMP/r.sock" SCRIPT LOAD "$(cat "$LUA")")

TIMEFORMAT='%U %S %R'
for run in $(seq "$RUNS"); do
  redis-cli -s "$TMP/r.sock" FLUSHALL > /dev/null
  r0=$(awk '{print $14 + $15}' "/proc/$REDIS_PID/stat")
  { time redis-benchmark -s "$TMP/r.sock" -c 50 -n "$N" -P 1 -r 1000000 --csv \
    EVALSHA "$sha" 1 'gcra:user:__rand_int__' 15 30 60 1 > "$TMP/out.csv"; } 2> "$TMP/time"
  r1=$(awk '{print $14 + $15}' "/proc/$REDIS_PID/stat")
  python3 - "$run" "$N" $((r1 - r0)) "$(cat "$TMP/time")" "$(tail -n 1 "$TMP/out.csv")" <<'PY'
import os, sys
run, n, redis, t, csv = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(), sys.argv[5]
tick = os.sysconf("SC_CLK_TCK")
user, system, real = map(float, t)
print(f"run{run}_peer_requests_per_s={float(csv.split(',')[1].strip(chr(34))):.0f}")
print(f"run{run}_peer_redis_cpu_us_per_request={redis / tick * 1e6 / n:.1f}")
print(f"run{run}_peer_generator_cpu_us_per_request={(user + system) * 1e6 / n:.1f}")
print(f"run{run}_peer_cores_busy={(redis / tick + user + system) / real:.2f}")
PY
done
