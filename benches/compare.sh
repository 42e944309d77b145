#!/usr/bin/env bash
# compare.sh: tollgate against the Redis + Lua GCRA peer, back to back on this
# machine, with the same connection counts; prints both and their ratios.
#
#   bash benches/compare.sh            # 3 runs, medians
#   RUNS=5 DURATION=5 bash benches/compare.sh
#
# Needs redis-server and redis-benchmark (Debian: apt-get install redis-server
# redis-tools); installs nothing itself. Builds tollgate in release mode.
# Figures are medians of RUNS runs; the machine is shared and noisy, so read
# the ratios, not the absolute numbers.
set -euo pipefail

RUNS=${RUNS:-3}
DURATION=${DURATION:-3}
CONNS=${CONNS:-50}
PIPELINE=${PIPELINE:-16}
KEYS=${KEYS:-1000000}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PEER=${PEER:-$ROOT/../shared/bench/peer-redis.sh}

for bin in redis-server redis-benchmark redis-cli; do
  command -v "$bin" >/dev/null 2>&1 || {
    echo "compare.sh: $bin not found; install it with: apt-get install redis-server redis-tools" >&2
    exit 2
  }
done
[ -r "$PEER" ] || { echo "compare.sh: peer script $PEER not found (set PEER=...)" >&2; exit 2; }

cargo build --release --quiet --manifest-path "$ROOT/Cargo.toml"
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/tollgate
export BIN CONNS DURATION KEYS
TMP=$(mktemp -d /tmp/tollgate-compare.XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$TMP"
}
# cleanup runs once, on exit; a signal exits (bash would otherwise run the
# handler and carry on with the next command)
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# tollgate with built-in defaults on a temp socket; the `request` route's
# GCRA (one per source prefix) is the like-for-like of the Lua script.
"$BIN" serve --socket "$TMP/tollgate.sock" --state "$TMP/state.redb" --config /dev/null >"$TMP/daemon.log" 2>&1 &
PIDS+=($!)
TOLLGATE_PID=$!
"$BIN" echo-server --socket "$TMP/echo.sock" >"$TMP/echo.log" 2>&1 &
PIDS+=($!)
ECHO_PID=$!
# The codec floor: the same loop decoding each check and answering one
# fixed verdict. tollgate's distance from it is the limiter's own work.
"$BIN" echo-server --verdict --socket "$TMP/codec.sock" >"$TMP/codec.log" 2>&1 &
PIDS+=($!)
CODEC_PID=$!
for _ in $(seq 100); do [ -S "$TMP/tollgate.sock" ] && [ -S "$TMP/echo.sock" ] && [ -S "$TMP/codec.sock" ] && break; sleep 0.1; done

# bench <server pid> <socket> <in-flight> [extra flags]
#   -> "ops p50 p99 p999 server_us generator_us"
# The last two are CPU time (user + system) per request of the server and of
# the load generator: on a machine where both share the cores, a server's
# throughput is bounded by their sum.
bench() {
  python3 - "$@" <<'PY'
import json, os, resource, subprocess, sys
pid, socket, in_flight, extra = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
env = os.environ
tick = os.sysconf("SC_CLK_TCK")
def server_s():
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / tick
def children_s():
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime
s0, g0 = server_s(), children_s()
out = subprocess.run([env["BIN"], "bench", "--socket", socket, "--connections", env["CONNS"], "--in-flight", in_flight,
                      "--duration", env["DURATION"] + "s", "--keys", env["KEYS"], "--json", *extra],
                     check=True, capture_output=True, text=True).stdout
s1, g1 = server_s(), children_s()
r = json.loads(out)
assert r["errors"] == 0, r
per = lambda s: f"{s / r['requests'] * 1e6:.2f}"
print(round(r["ops_per_s"]), r["p50_us"], r["p99_us"], r["p999_us"], per(s1 - s0), per(g1 - g0))
PY
}

median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

declare -A runs
for run in $(seq "$RUNS"); do
  peer=$(DURATION=$DURATION CONNS=$CONNS PIPELINE=$PIPELINE KEYSPACE=$KEYS bash "$PEER")
  runs[redis1]+="$(echo "$peer" | sed -n 's/^redis_gcra_ops_per_s=//p') "
  runs[redis16]+="$(echo "$peer" | sed -n 's/^redis_gcra_p16_ops_per_s=//p') "
  read -r ops p50 p99 p999 srv gen < <(bench "$TOLLGATE_PID" "$TMP/tollgate.sock" 1)
  runs[tg1]+="$ops "; runs[tg1_p99]+="$p99 "
  read -r ops p50 p99 p999 srv gen < <(bench "$TOLLGATE_PID" "$TMP/tollgate.sock" "$PIPELINE")
  runs[tg16]+="$ops "; runs[tg16_p99]+="$p99 "; runs[tg16_srv]+="$srv "; runs[tg16_gen]+="$gen "
  read -r ops p50 p99 p999 srv gen < <(bench "$ECHO_PID" "$TMP/echo.sock" 1 --raw)
  runs[echo1]+="$ops "; runs[echo1_p99]+="$p99 "
  read -r ops p50 p99 p999 srv gen < <(bench "$ECHO_PID" "$TMP/echo.sock" "$PIPELINE" --raw)
  runs[echo16]+="$ops "; runs[echo16_srv]+="$srv "; runs[echo16_gen]+="$gen "
  read -r ops p50 p99 p999 srv gen < <(bench "$CODEC_PID" "$TMP/codec.sock" "$PIPELINE")
  runs[codec16]+="$ops "; runs[codec16_srv]+="$srv "; runs[codec16_gen]+="$gen "
  echo "run $run of $RUNS done" >&2
done

m() { echo "${runs[$1]}" | tr ' ' '\n' | grep -v '^$' | median; }
ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; $CONNS connections, $KEYS keys, ${DURATION}s x $RUNS runs (medians)"
printf '%-44s %12s\n' "measure" "ops/s"
printf '%-44s %12s\n' "redis+lua GCRA, 1 in flight" "$(m redis1)"
printf '%-44s %12s\n' "tollgate check, 1 in flight" "$(m tg1)"
printf '%-44s %12s\n' "echo floor, 1 in flight" "$(m echo1)"
printf '%-44s %12s\n' "redis+lua GCRA, $PIPELINE in flight" "$(m redis16)"
printf '%-44s %12s\n' "tollgate check, $PIPELINE in flight" "$(m tg16)"
printf '%-44s %12s\n' "echo floor, $PIPELINE in flight" "$(m echo16)"
printf '%-44s %12s\n' "codec floor (fixed verdict), $PIPELINE in flight" "$(m codec16)"
echo "ratio tollgate/redis, 1 in flight:        $(ratio "$(m tg1)" "$(m redis1)")"
echo "ratio tollgate/redis, $PIPELINE in flight:       $(ratio "$(m tg16)" "$(m redis16)")"
echo "ratio tollgate/echo floor, $PIPELINE in flight:  $(ratio "$(m tg16)" "$(m echo16)")"
echo "ratio codec floor/echo floor, $PIPELINE in flight: $(ratio "$(m codec16)" "$(m echo16)")"
echo "p99 us, 1 in flight: tollgate $(m tg1_p99), echo floor $(m echo1_p99)"
echo "CPU us per request at $PIPELINE in flight (server + load generator):"
echo "  tollgate $(m tg16_srv) + $(m tg16_gen); echo floor $(m echo16_srv) + $(m echo16_gen); codec floor $(m codec16_srv) + $(m codec16_gen)"
