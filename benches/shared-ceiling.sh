#!/usr/bin/env bash
# shared-ceiling.sh: how far any rewrite of decide.lua could take shared
# mode's login throughput (issue 14), measured end to end.
#
# Builds three more daemons from this tree, with decide.lua's check and
# report replaced by stand-ins (benches/shared_ceiling.py):
#   floor: each failure entry of a check read and written; a report's
#          read and deleted, or for a failure written and listed in its
#          account's index; nothing decided: the store work of the two
#          global login rules in today's layout (one key an entry);
#   gcra:  the peer's own decision (gcra.lua's GCRA) on one key an op,
#          check or report, and nothing else;
#   null:  the arguments read, no key touched, an answer at once.
# Then, RUNS times (default 3), interleaved: each daemon (decide.lua's,
# floor, gcra, null) on its own fresh redis-server, under shared.sh's login
# load (check + report, 50 connections x 1 in flight, 100,000 accounts,
# timeout_ms = 1000 so the store decides every answer), and the Redis+Lua
# peer (../shared/bench/peer-redis.sh, or $PEER); and decide.lua's daemon
# without [shared] (local: the same load decided in the daemon's memory,
# what the daemon and the load generator cost a request with no store at
# all). A run whose daemon
# counted a store error or a degraded answer fails the script: a
# stand-in the daemon did not take as the store's word measures nothing.
# Prints each run (with the CPU time of Redis, the daemon and the load
# generator a request, and the cores the three kept busy), then medians,
# the ratio of the medians to the peer's, and the median of each run's
# ratio to the peer run beside it (the figure docs/performance.md quotes:
# the machine drifts between runs). The variant builds keep their own
# target dir (target/ceiling): the dependencies are built once, tollgate
# itself once a stand-in. Needs redis-server, redis-cli, redis-benchmark.
# PIN=1 gives the store a core of its own, as a store on a host of its
# own would have: Redis on CPU 0, the daemon and the load generator on
# CPU 1; and the peer the same way (its Redis on CPU 0, redis-benchmark
# on CPU 1, peer-redis.sh's no-pipelining measure with its gcra.lua).
# The local daemon then has one core with its load generator, beside an
# idle Redis. Each run also prints the store's EVALSHA, GET, SET and DEL
# calls a request (INFO commandstats): what each stand-in really ran.
set -euo pipefail

RUNS=${RUNS:-3}
DURATION=${DURATION:-3s}
# The peer takes whole seconds: DURATION must be N followed by s.
[[ $DURATION =~ ^[0-9]+s$ ]] || { echo "${0##*/}: DURATION must be whole seconds, like 3s (not $DURATION)" >&2; exit 2; }
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PEER=${PEER:-$ROOT/../shared/bench/peer-redis.sh}
# shellcheck source=benches/lib.sh
. "$HERE/lib.sh"

with_temp_dir tg-shared-ceiling

cargo build --release --quiet --manifest-path "$ROOT/Cargo.toml"
cp "$ROOT/target/release/tollgate" "$TMP/tollgate-decide"
mkdir "$TMP/tree"
tar -C "$ROOT" --exclude=./target --exclude=./.git --exclude=./fuzz -cf - . | tar -C "$TMP/tree" -xf -
for kind in floor gcra null; do
  python3 "$HERE/shared_ceiling.py" "$ROOT/src/shared/decide.lua" "$kind" > "$TMP/tree/src/shared/decide.lua"
  CARGO_TARGET_DIR=$ROOT/target/ceiling cargo build --release --quiet --manifest-path "$TMP/tree/Cargo.toml"
  cp "$ROOT/target/ceiling/release/tollgate" "$TMP/tollgate-$kind"
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# PIN=1: every thread of a running process onto one CPU; the load
# generators start on CPU 1.
on_cpu1=()
if [ -n "${PIN:-}" ]; then on_cpu1=(taskset -c 1); fi
pin() { # cpu, pid
  if [ -n "${PIN:-}" ]; then taskset -a -pc "$1" "$2" > /dev/null; fi
}

pinned_peer() { # run
  local dir=$TMP/peer.$1 sha cal n
  mkdir -p "$dir"
  start_redis "$dir"
  PIDS+=("$REDIS_PID")
  pin 0 "$REDIS_PID"
  sha=$(redis-cli -s "$dir/r.sock" SCRIPT LOAD "$(cat "$(dirname "$PEER")/gcra.lua")")
  peer_rps() { # requests
    redis-cli -s "$dir/r.sock" FLUSHALL > /dev/null
    "${on_cpu1[@]}" redis-benchmark -s "$dir/r.sock" -c 50 -n "$1" -P 1 -r 1000000 --csv \
      EVALSHA "$sha" 1 'gcra:user:__rand_int__' 15 30 60 1 | tail -n 1 | tr -d '"' | awk -F, '{ printf "%.0f\n", $2 }'
  }
  cal=$(peer_rps 20000)
  n=$((cal * ${DURATION%s}))
  if [ "$n" -lt 20000 ]; then n=20000; fi
  echo "run${1}_peer_requests_per_s=$(peer_rps "$n")"
  kill "$REDIS_PID"
  wait "$REDIS_PID" 2>/dev/null || true
  PIDS=()
}

one_run() { # variant, run
  local name=$1 run=$2 dir=$TMP/$1.$2 bin=$TMP/tollgate-$1
  mkdir -p "$dir"
  if [ "$name" = local ]; then
    # The store is started all the same, idle, so the figures below keep
    # one shape.
    bin=$TMP/tollgate-decide
    start_redis "$dir"
    PIDS+=("$REDIS_PID")
    start_serving "$bin" "$dir" ""
    PIDS+=("$DAEMON_PID")
  else
    start_store_and_daemon "$bin" "$dir" "$TMP/secret"
  fi
  pin 0 "$REDIS_PID"
  pin 1 "$DAEMON_PID"
  sleep 0.3
  local r0 d0 r1 d1 out status generator TIMEFORMAT='%U %S'
  r0=$(cpu_ticks "$REDIS_PID"); d0=$(cpu_ticks "$DAEMON_PID")
  # The load generator's CPU time too (bash's `time`, user and system):
  # the three processes share the two cores.
  { time "${on_cpu1[@]}" "$bin" bench --socket "$dir/t.sock" --json --route login --mix check-report --connections 50 \
    --in-flight 1 --keys 100000 --duration "$DURATION" > "$dir/bench.json" 2> "$dir/bench.log"; } 2> "$dir/generator"
  r1=$(cpu_ticks "$REDIS_PID"); d1=$(cpu_ticks "$DAEMON_PID")
  out=$(cat "$dir/bench.json"); generator=$(awk '{print $1 + $2}' "$dir/generator")
  status=$("$bin" status --socket "$dir/t.sock" --json)
  # What the store ran, by command: a stand-in's work is in the output,
  # not taken on trust.
  redis-cli -s "$dir/r.sock" INFO commandstats > "$dir/commandstats"
  kill "$DAEMON_PID" "$REDIS_PID"
  wait "$DAEMON_PID" "$REDIS_PID" 2>/dev/null || true
  # Reaped: their numbers may be reused before the script ends.
  PIDS=()
  python3 - "$name" "$run" "$out" "$status" $((r1 - r0)) $((d1 - d0)) "$generator" "$dir/commandstats" <<'EOF'
import json, os, re, sys
name, run, out, status, redis, daemon, generator, commandstats = sys.argv[1:]
d, s = json.loads(out), json.loads(status).get("shared")
if name == "local":
    if s or d["errors"]:
        sys.exit(f"shared-ceiling.sh: local run {run}: shared mode on, or {d['errors']} bench errors")
elif s["errors"] or s["degraded_answers"] or d["errors"]:
    sys.exit(f"shared-ceiling.sh: {name} run {run}: {s['errors']} store errors, "
             f"{s['degraded_answers']} degraded answers, {d['errors']} bench errors "
             f"(last error: {s['last_error']}): the daemon did not take every answer as the store's")
tick, n = os.sysconf("SC_CLK_TCK"), max(1, d["requests"])
print(f"run{run}_{name}_requests_per_s={d['requests'] / d['duration_s']:.0f}")
print(f"run{run}_{name}_p99_us={d['p99_us']}")
print(f"run{run}_{name}_redis_cpu_us_per_request={int(redis) / tick * 1e6 / n:.1f}")
print(f"run{run}_{name}_daemon_cpu_us_per_request={int(daemon) / tick * 1e6 / n:.1f}")
print(f"run{run}_{name}_generator_cpu_us_per_request={float(generator) * 1e6 / n:.1f}")
# Of the machine's cores, how many the three kept busy (1 in flight a
# connection: a run can be bound by round trips rather than by CPU).
cpus = (int(redis) / tick + int(daemon) / tick + float(generator)) / d["duration_s"]
print(f"run{run}_{name}_cores_busy={cpus:.2f}")
calls = dict(re.findall(r"^cmdstat_(\w+):calls=(\d+)", open(commandstats).read(), re.M))
for command in ("evalsha", "get", "set", "del"):
    print(f"run{run}_{name}_store_{command}s_per_request={int(calls.get(command, 0)) / n:.2f}")
EOF
}

# Each run in this shell, not in a pipeline's subshell: the servers it
# starts must be in PIDS for cleanup to stop them.
for run in $(seq "$RUNS"); do
  for name in decide floor gcra null local; do
    one_run "$name" "$run" > "$TMP/run"
    cat "$TMP/run" >> "$TMP/runs" && cat "$TMP/run"
  done
  if [ -n "${PIN:-}" ]; then
    pinned_peer "$run" > "$TMP/run"
  else
    DURATION=${DURATION%s} bash "$PEER" > "$TMP/run"
  fi
  # peer-redis.sh's figure renamed, or pinned_peer's as it is: once.
  sed -n "s/^redis_gcra_ops_per_s=/run${run}_peer_requests_per_s=/; /^run[0-9]*_peer_requests_per_s=/p" "$TMP/run" | tee -a "$TMP/runs"
done

python3 - "$TMP/runs" "$RUNS" <<'EOF'
import re, statistics, sys
runs, by_run = {}, {}
for line in open(sys.argv[1]):
    m = re.match(r"run(\d+)_(\w+?)_(requests_per_s|p99_us|redis_cpu_us_per_request|daemon_cpu_us_per_request"
                 r"|generator_cpu_us_per_request|cores_busy)=(\S+)", line)
    if m:
        runs.setdefault((m[2], m[3]), []).append(float(m[4]))
        if m[3] == "requests_per_s":
            by_run.setdefault((m[2], int(m[1])), []).append(float(m[4]))
# Each run's figures are paired by run number, one of each: a figure
# printed twice must not shift every later ratio onto the wrong peer run.
numbers = range(1, int(sys.argv[2]) + 1)
for name in ("peer", "decide", "floor", "gcra", "null", "local"):
    for run in numbers:
        if len(by_run.get((name, run), [])) != 1:
            sys.exit(f"shared-ceiling.sh: run {run} has {len(by_run.get((name, run), []))} {name} figures, not 1")
peers = [by_run[("peer", run)][0] for run in numbers]
peer = statistics.median(peers)
print(f"median_peer_requests_per_s={peer:.0f}")
for name in ("decide", "floor", "gcra", "null", "local"):
    rps = statistics.median(runs[(name, "requests_per_s")])
    # The machine drifts between runs: each run's ratio to the peer run
    # beside it, and their median, say more than a ratio of medians.
    ratios = [by_run[(name, run)][0] / by_run[("peer", run)][0] for run in numbers]
    print(f"median_{name}_requests_per_s={rps:.0f} ratio_to_peer={rps / peer:.2f} "
          f"ratios_by_run={'/'.join(f'{r:.2f}' for r in ratios)} median_ratio={statistics.median(ratios):.2f}")
    for what in ("p99_us", "redis_cpu_us_per_request", "daemon_cpu_us_per_request",
                 "generator_cpu_us_per_request", "cores_busy"):
        print(f"median_{name}_{what}={statistics.median(runs[(name, what)]):g}")
EOF
