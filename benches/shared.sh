#!/usr/bin/env bash
# shared.sh: shared mode (issue 14) measured, beside the Redis+Lua peer.
#
# Starts a private redis-server on a Unix socket and a release daemon with
# `[shared] url` pointing at it, then, RUNS times each (default 3; the
# medians are what docs/performance.md reports):
#   1. login check+report, 50 connections, 1 in flight, 100,000 accounts
#      (`tollgate bench --route login --mix check-report`): every request
#      goes to the store (login's rules are global); on a daemon with the
#      default-like timeout (TIMEOUT_MS, 2) and on a patient one (1000 ms),
#      with the share of answers given degraded: a saturated store makes
#      the first answer most requests on its degraded share; and the CPU
#      time Redis and the daemon spent a request (/proc, user + system);
#   2. the Redis+Lua peer (../shared/bench/peer-redis.sh, or $PEER) at the
#      same 50 connections, same session;
#   3. `request` route checks (host rules only) with shared mode on, then
#      on a daemon without [shared]: the host-scope overhead;
#   4. the store frozen (SIGSTOP): login checks at a fixed rate, p99 against
#      the configured timeout (`[shared] timeout_ms`, default 2 here).
# Prints key=value lines. Needs redis-server, redis-cli, redis-benchmark.
set -euo pipefail

RUNS=${RUNS:-3}
DURATION=${DURATION:-3s}
# The peer takes whole seconds: DURATION must be N followed by s.
[[ $DURATION =~ ^[0-9]+s$ ]] || { echo "${0##*/}: DURATION must be whole seconds, like 3s (not $DURATION)" >&2; exit 2; }
TIMEOUT_MS=${TIMEOUT_MS:-2}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PEER=${PEER:-$ROOT/../shared/bench/peer-redis.sh}
BIN=$ROOT/target/release/tollgate
# shellcheck source=benches/lib.sh
. "$HERE/lib.sh"

cargo build --release --quiet --manifest-path "$ROOT/Cargo.toml"

with_temp_dir tg-shared-bench

start_redis "$TMP"
REDIS=$REDIS_PID
PIDS+=("$REDIS")

start_daemon() { # name, extra config
  start_serving "$BIN" "$TMP/$1" "$2"
  PIDS+=("$DAEMON_PID")
  echo "$DAEMON_PID" > "$TMP/$1/pid"
}

# One secret for both shared daemons: a host with another key may not join.
start_daemon shared "secret = \"$TMP/secret\"
[shared]
url = \"redis+unix://$TMP/r.sock\"
timeout_ms = $TIMEOUT_MS
hosts = 3"
start_daemon patient "secret = \"$TMP/secret\"
[shared]
url = \"redis+unix://$TMP/r.sock\"
timeout_ms = 1000
hosts = 3"
start_daemon alone ""

# The share of a run's answers given degraded (timed out or breaker open):
# with a short timeout and the store saturated, most are, and the run then
# measures the fallback, not the store.
degraded_share() { # socket, answers before (degraded, calls)
  "$BIN" status --socket "$1" --json | python3 -c "import json,sys; s=json.load(sys.stdin)['shared']; print(s['degraded_answers'], s['calls'])"
}

bench() { # socket, args...
  local socket=$1; shift
  "$BIN" bench --socket "$socket" --json "$@"
}
# utime + stime of a process, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
per_request() { # ticks, bench json
  python3 -c "import json,sys,os; d=json.loads(sys.argv[2]); print(round($1 / os.sysconf('SC_CLK_TCK') * 1e6 / max(1, d['requests']), 1))" "$1" "$2"
}
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print(d$1)"; }

for run in $(seq "$RUNS"); do
  for d in shared patient; do
    read -r deg0 _ <<<"$(degraded_share "$TMP/$d/t.sock")"
    redis0=$(cpu_ticks "$REDIS"); daemon0=$(cpu_ticks "$(cat "$TMP/$d/pid")")
    out=$(bench "$TMP/$d/t.sock" --route login --mix check-report --connections 50 --in-flight 1 --keys 100000 --duration "$DURATION")
    redis1=$(cpu_ticks "$REDIS"); daemon1=$(cpu_ticks "$(cat "$TMP/$d/pid")")
    read -r deg1 _ <<<"$(degraded_share "$TMP/$d/t.sock")"
    # CPU time a request (user + system, from /proc): where the time goes.
    echo "run${run}_login_${d}_redis_cpu_us_per_request=$(per_request $((redis1 - redis0)) "$out")"
    echo "run${run}_login_${d}_daemon_cpu_us_per_request=$(per_request $((daemon1 - daemon0)) "$out")"
    echo "run${run}_login_${d}_requests_per_s=$(field "['requests']/d['duration_s']" <<<"$out")"
    echo "run${run}_login_${d}_p50_us=$(field "['p50_us']" <<<"$out")"
    echo "run${run}_login_${d}_p99_us=$(field "['p99_us']" <<<"$out")"
    echo "run${run}_login_${d}_degraded_share=$(python3 -c "print(round(($deg1 - $deg0) / max(1, $(field "['requests']" <<<"$out")), 3))")"
  done
  DURATION=${DURATION%s} bash "$PEER" | sed "s/^/run${run}_peer_/"
  on=$(bench "$TMP/shared/t.sock" --route request --mix check --connections 50 --in-flight 16 --keys 1000000 --duration "$DURATION")
  off=$(bench "$TMP/alone/t.sock" --route request --mix check --connections 50 --in-flight 16 --keys 1000000 --duration "$DURATION")
  echo "run${run}_request_shared_on_per_s=$(field "['requests']/d['duration_s']" <<<"$on")"
  echo "run${run}_request_shared_off_per_s=$(field "['requests']/d['duration_s']" <<<"$off")"
done

# The store frozen: every answer must come within the timeout (plus the
# timer's millisecond) or, once the breaker is open, at once.
kill -STOP "$REDIS"
out=$(bench "$TMP/shared/t.sock" --route login --mix check --connections 50 --in-flight 1 --keys 100000 --duration "$DURATION" --rate 20000)
kill -CONT "$REDIS"
echo "frozen_store_timeout_ms=$TIMEOUT_MS"
echo "frozen_store_requests=$(field "['requests']" <<<"$out")"
echo "frozen_store_p50_us=$(field "['p50_us']" <<<"$out")"
echo "frozen_store_p99_us=$(field "['p99_us']" <<<"$out")"
echo "frozen_store_max_us=$(field "['max_us']" <<<"$out")"
redis-cli -s "$TMP/r.sock" INFO commandstats | grep -E "evalsha" | sed 's/^/redis_/' || true
