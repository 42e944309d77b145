#!/usr/bin/env bash
# compare.sh: tollgate against two Redis peers, back to back on this machine,
# with the same connection counts: the Redis + Lua GCRA script, and
# redis-cell (a Redis module in Rust whose one command, CL.THROTTLE, is a
# GCRA check: the fastest way Redis itself limits a key). Prints each and
# the ratios.
#
#   bash benches/compare.sh            # 3 runs, medians
#   RUNS=5 DURATION=5 bash benches/compare.sh
#
# Needs redis-server and redis-benchmark (Debian: apt-get install redis-server
# redis-tools); installs nothing itself. Builds tollgate in release mode, and
# redis-cell 0.2.2 from crates.io once (under the target directory).
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
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET/release/tollgate

# redis-cell, built from its crates.io source: cargo fetches the crate for
# a throwaway manifest that depends on it, and the module is built from a
# copy of that source (the registry's copy stays untouched).
CELL_DIR=$TARGET/redis-cell
CELL=$CELL_DIR/target/release/libredis_cell.so
if [ ! -f "$CELL" ]; then
  mkdir -p "$CELL_DIR/fetch/src"
  printf '[package]\nname = "fetch-redis-cell"\nversion = "0.0.0"\nedition = "2021"\n[workspace]\n[dependencies]\nredis-cell = "=0.2.2"\n' \
    > "$CELL_DIR/fetch/Cargo.toml"
  : > "$CELL_DIR/fetch/src/lib.rs"
  cargo fetch --quiet --manifest-path "$CELL_DIR/fetch/Cargo.toml"
  cell_src=$(cargo metadata --quiet --format-version 1 --manifest-path "$CELL_DIR/fetch/Cargo.toml" |
    python3 -c 'import json, sys, os; print(os.path.dirname(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "redis-cell")))')
  rm -rf "$CELL_DIR/src" && cp -r "$cell_src" "$CELL_DIR/src"
  # its own workspace: the copy sits under this one's target directory
  printf '\n[workspace]\n' >> "$CELL_DIR/src/Cargo.toml"
  # (its 2018 code compiles with lint warnings; only a failure matters)
  CARGO_TARGET_DIR=$CELL_DIR/target cargo build --release --quiet --manifest-path "$CELL_DIR/src/Cargo.toml" 2>&1 |
    grep -E '^error' -A5 >&2 || true
  [ -f "$CELL" ] || { echo "compare.sh: redis-cell did not build" >&2; exit 1; }
fi
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
# Started afresh before each of its runs, as redis-cell is emptied before
# each of its own: neither contender works on the other run's keys.
# Stopped after its runs, so that its sweeps do not run in the others'.
stop_tollgate() {
  if [ -n "${TOLLGATE_PID:-}" ]; then
    kill "$TOLLGATE_PID" 2>/dev/null || true
    wait "$TOLLGATE_PID" 2>/dev/null || true
  fi
  TOLLGATE_PID=
}
start_tollgate() {
  stop_tollgate
  rm -f "$TMP/tollgate.sock" "$TMP/state.redb"
  "$BIN" serve --socket "$TMP/tollgate.sock" --state "$TMP/state.redb" --config /dev/null >"$TMP/daemon.log" 2>&1 &
  TOLLGATE_PID=$!
  PIDS+=("$TOLLGATE_PID")
  for _ in $(seq 100); do [ -S "$TMP/tollgate.sock" ] && break; sleep 0.05; done
}
"$BIN" echo-server --socket "$TMP/echo.sock" >"$TMP/echo.log" 2>&1 &
PIDS+=($!)
ECHO_PID=$!
# The codec floor: the same loop decoding each check and answering one
# fixed verdict. tollgate's distance from it is the limiter's own work.
"$BIN" echo-server --verdict --socket "$TMP/codec.sock" >"$TMP/codec.log" 2>&1 &
PIDS+=($!)
CODEC_PID=$!
redis-server --port 0 --unixsocket "$TMP/cell.sock" --unixsocketperm 700 --dir "$TMP" --save '' --appendonly no \
  --loadmodule "$CELL" --logfile "$TMP/cell.log" &
PIDS+=($!)
CELL_PID=$!
for _ in $(seq 100); do [ -S "$TMP/echo.sock" ] && [ -S "$TMP/codec.sock" ] && [ -S "$TMP/cell.sock" ] && break; sleep 0.1; done
# The same limit as the Lua peer's: a burst of 15, 30 a minute, 1 a call.
cell_reply=$(redis-cli -s "$TMP/cell.sock" CL.THROTTLE cell:selftest 15 30 60 1 | tr '\n' ' ')
[ "$(echo "$cell_reply" | awk '{print NF}')" = 5 ] || { echo "compare.sh: unexpected CL.THROTTLE reply: $cell_reply" >&2; exit 1; }

# cell <in flight> -> "ops server_us": ops/s of CL.THROTTLE on random keys,
# sized from a short calibration so that it lasts about DURATION seconds,
# and redis-server's CPU time per request.
cell() {
  local cal n
  cell_run() {
    redis-cli -s "$TMP/cell.sock" FLUSHALL SYNC >/dev/null
    redis-benchmark -s "$TMP/cell.sock" -c "$CONNS" -n "$1" -P "$2" -r "$KEYS" --csv \
      CL.THROTTLE 'cell:user:__rand_int__' 15 30 60 1 | tail -n 1 | tr -d '"' | awk -F, '{ printf "%.0f\n", $2 }'
  }
  cal=$(cell_run 20000 "$1")
  n=$(awk -v r="$cal" -v d="$DURATION" 'BEGIN { n = int(r * d); if (n < 20000) n = 20000; print n }')
  local t0 t1 ops
  t0=$(awk '{ print $14 + $15 }' "/proc/$CELL_PID/stat")
  ops=$(cell_run "$n" "$1")
  t1=$(awk '{ print $14 + $15 }' "/proc/$CELL_PID/stat")
  echo "$ops $(awk -v t=$((t1 - t0)) -v n="$n" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", t / hz * 1e6 / n }')"
  # Emptied again after its run: left behind, the keys' TTLs expire over
  # the next seconds and redis-server spends ~12% of a core on that while
  # the next contender is measured (seen as tollgate's 1-in-flight run,
  # which follows, 10% below its figure timed alone).
  redis-cli -s "$TMP/cell.sock" FLUSHALL SYNC >/dev/null
}

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
  read -r ops srv < <(cell 1)
  runs[cell1]+="$ops "; runs[cell1_srv]+="$srv "
  read -r ops srv < <(cell "$PIPELINE")
  runs[cell16]+="$ops "
  start_tollgate
  read -r ops p50 p99 p999 srv gen < <(bench "$TOLLGATE_PID" "$TMP/tollgate.sock" 1)
  runs[tg1]+="$ops "; runs[tg1_p99]+="$p99 "; runs[tg1_srv]+="$srv "
  start_tollgate
  read -r ops p50 p99 p999 srv gen < <(bench "$TOLLGATE_PID" "$TMP/tollgate.sock" "$PIPELINE")
  runs[tg16]+="$ops "; runs[tg16_p99]+="$p99 "; runs[tg16_srv]+="$srv "; runs[tg16_gen]+="$gen "
  stop_tollgate
  read -r ops p50 p99 p999 srv gen < <(bench "$ECHO_PID" "$TMP/echo.sock" 1 --raw)
  runs[echo1]+="$ops "; runs[echo1_p99]+="$p99 "; runs[echo1_srv]+="$srv "
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
printf '%-44s %12s\n' "redis-cell CL.THROTTLE, 1 in flight" "$(m cell1)"
printf '%-44s %12s\n' "tollgate check, 1 in flight" "$(m tg1)"
printf '%-44s %12s\n' "echo floor, 1 in flight" "$(m echo1)"
printf '%-44s %12s\n' "redis+lua GCRA, $PIPELINE in flight" "$(m redis16)"
printf '%-44s %12s\n' "redis-cell CL.THROTTLE, $PIPELINE in flight" "$(m cell16)"
printf '%-44s %12s\n' "tollgate check, $PIPELINE in flight" "$(m tg16)"
printf '%-44s %12s\n' "echo floor, $PIPELINE in flight" "$(m echo16)"
printf '%-44s %12s\n' "codec floor (fixed verdict), $PIPELINE in flight" "$(m codec16)"
echo "ratio tollgate/redis, 1 in flight:        $(ratio "$(m tg1)" "$(m redis1)")"
echo "ratio tollgate/redis, $PIPELINE in flight:       $(ratio "$(m tg16)" "$(m redis16)")"
echo "ratio tollgate/redis-cell, 1 in flight:   $(ratio "$(m tg1)" "$(m cell1)")"
echo "ratio tollgate/redis-cell, $PIPELINE in flight:  $(ratio "$(m tg16)" "$(m cell16)")"
echo "ratio tollgate/echo floor, $PIPELINE in flight:  $(ratio "$(m tg16)" "$(m echo16)")"
echo "ratio codec floor/echo floor, $PIPELINE in flight: $(ratio "$(m codec16)" "$(m echo16)")"
echo "p99 us, 1 in flight: tollgate $(m tg1_p99), echo floor $(m echo1_p99)"
echo "server CPU us per request at 1 in flight: tollgate $(m tg1_srv), redis-cell $(m cell1_srv), echo floor $(m echo1_srv)"
echo "CPU us per request at $PIPELINE in flight (server + load generator):"
echo "  tollgate $(m tg16_srv) + $(m tg16_gen); echo floor $(m echo16_srv) + $(m echo16_gen); codec floor $(m codec16_srv) + $(m codec16_gen)"
