#!/usr/bin/env bash
# targets.sh: the performance targets that compare.sh (the Redis peer) does
# not cover, each measured end to end against real daemons on temp sockets:
#
#   latency  p99 of `check` at half the maximum throughput, against the echo
#            floor's p99 at the same paced load
#   keys     checks/s with 10 million live GCRA keys against 1 thousand
#   trips    reports/s when 10% of reports trip a lockout (each reply waits
#            for its fsync), and the p99 of the tripping replies
#   startup  time to readiness with 100,000 lockouts and 100,000 counters
#            in the state file
#
#   bash benches/targets.sh                  # all four, medians of 3 runs
#   RUNS=5 DURATION=5 bash benches/targets.sh keys trips
#
# Installs nothing; needs python3 (to read the JSON). Builds in release mode.
# The machine is shared and noisy: read ratios from the same run.
set -euo pipefail

RUNS=${RUNS:-3}
DURATION=${DURATION:-3}
CONNS=${CONNS:-50}
PACED_CONNS=${PACED_CONNS:-2}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
SECTIONS=${*:-latency keys trips startup}

cargo build --release --quiet --manifest-path "$ROOT/Cargo.toml"
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/tollgate
TMP=$(mktemp -d /tmp/tollgate-targets.XXXXXX)
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

# start <name> [serve flags...]: a daemon on $TMP/<name>.sock; waits for it.
start() {
  local name=$1
  shift
  "$BIN" serve --socket "$TMP/$name.sock" --state "$TMP/$name.redb" "$@" >"$TMP/$name.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 300); do "$BIN" status --socket "$TMP/$name.sock" >/dev/null 2>&1 && return; sleep 0.02; done
  echo "targets.sh: daemon $name did not start:" >&2
  cat "$TMP/$name.log" >&2
  exit 1
}
stop() { # stop <pid>: SIGTERM and wait (the daemon saves its state)
  kill "$1"
  wait "$1" 2>/dev/null || true
}

# bench <fields> <flags...>: one run, prints the named JSON fields.
bench() {
  local fields=$1
  shift
  "$BIN" bench --json "$@" |
    python3 -c 'import json,sys; r=json.load(sys.stdin); assert r["errors"]==0, r; print(*[round(r[f]) for f in sys.argv[1].split(",")])' "$fields"
}
# trips_config <window_secs> <entries_max>: a route `trips` whose one rule
# locks an account at its 10th failure.
trips_config() {
  printf '[routes.trips]\nfail_policy = "open"\n[routes.trips.rules.account_failures]\n'
  printf 'kind = "failures"\nkey = ["account"]\nthreshold = 10\nwindow_secs = %s\nentries_max = %s\n' "$1" "$2"
}
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }
machine() { echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"; }
echo "machine: $(machine); ${DURATION}s runs, medians of $RUNS"

for section in $SECTIONS; do
  case $section in
  latency)
    # Built-in defaults; the `request` route is one GCRA per source. The
    # paced load generator runs a thread per connection (a sleeping thread
    # wakes within microseconds; tokio's timer ticks in milliseconds), so
    # it uses few connections: every extra thread on two cores is another
    # way for a reply to wait for the scheduler. The maximum is the same
    # threads sending as fast as replies return.
    start latency --config /dev/null
    "$BIN" echo-server --socket "$TMP/echo.sock" >/dev/null 2>&1 &
    PIDS+=($!)
    sleep 0.2
    max="" tg="" echo_p99="" tg_p50="" echo_p50=""
    for _ in $(seq "$RUNS"); do
      max+="$(bench ops_per_s --socket "$TMP/latency.sock" --connections "$PACED_CONNS" --rate 1000000000 --duration "${DURATION}s") "
    done
    half=$(($(echo "$max" | median) / 2))
    for _ in $(seq "$RUNS"); do
      read -r p50 p99 < <(bench p50_us,p99_us --socket "$TMP/latency.sock" --connections "$PACED_CONNS" --rate "$half" --duration "${DURATION}s")
      tg+="$p99 "
      tg_p50+="$p50 "
      read -r p50 p99 < <(bench p50_us,p99_us --socket "$TMP/echo.sock" --raw --connections "$PACED_CONNS" --rate "$half" --duration "${DURATION}s")
      echo_p99+="$p99 "
      echo_p50+="$p50 "
    done
    echo "latency: max $(echo "$max" | median) checks/s at $PACED_CONNS connections x 1 in flight; paced at half ($half/s):"
    echo "  tollgate check p50 $(echo "$tg_p50" | median) us, p99 $(echo "$tg" | median) us; echo floor p50 $(echo "$echo_p50" | median) us, p99 $(echo "$echo_p99" | median) us (runs: tollgate p99 $tg; echo p99 $echo_p99)"
    echo "  p99 over the floor, separate runs: $(($(echo "$tg" | median) - $(echo "$echo_p99" | median))) us (target: at most 20)"
    # The same question with the machine's stalls shared: each connection
    # times the daemon and the echo server turn about (--floor-socket), so
    # a millisecond stall of the VM lands on both instead of on whichever
    # run it happened in. Each operation is two round trips, so this pair's
    # maximum is lower; it is paced at half of that.
    pmax=""
    for _ in $(seq "$RUNS"); do
      pmax+="$(bench ops_per_s --socket "$TMP/latency.sock" --floor-socket "$TMP/echo.sock" --connections "$PACED_CONNS" --rate 1000000000 --duration "${DURATION}s") "
    done
    phalf=$(($(echo "$pmax" | median) / 2))
    diffs="" pairs=""
    for _ in $(seq "$RUNS"); do
      read -r p50 p99 fp50 fp99 < <(bench p50_us,p99_us,floor_p50_us,floor_p99_us --socket "$TMP/latency.sock" --floor-socket "$TMP/echo.sock" --connections "$PACED_CONNS" --rate "$phalf" --duration "${DURATION}s")
      diffs+="$((p99 - fp99)) "
      pairs+="$p50/$p99 vs $fp50/$fp99; "
    done
    echo "latency, timed alongside the echo floor: max $(echo "$pmax" | median) pairs/s; paced at half ($phalf/s):"
    echo "  p99 over the floor: $(echo "$diffs" | median) us (target: at most 20; runs, p50/p99 us tollgate vs echo: $pairs)"
    ;;
  keys)
    # A rule every key stays live under (one request a day; each key's TAT
    # a day ahead after its first check) and in monitor mode, so that every
    # check does the same work whether the table holds 1k or 10M keys: one
    # table step, a would-be refusal counted, no ladder, no log line.
    cat >"$TMP/keys.toml" <<'EOF'
[routes.request.rules.source_rate]
limit = 1
period_secs = 86400
burst = 1
monitor = true
entries_max = 20000000
EOF
    # fill <name> <keys>: a fresh daemon holding <keys> live keys, left to
    # settle (the kernel zeroes and collapses the new pages after a fill).
    fill() {
      start "$1" --config "$TMP/keys.toml"
      "$BIN" bench --socket "$TMP/$1.sock" --connections "$CONNS" --keys "$2" --prefill --operations 0 --json >/dev/null
      sleep 2
    }
    for inflight in 1 16; do
      small="" large=""
      for _ in $(seq "$RUNS"); do
        fill keys_small 1000
        small+="$(bench ops_per_s --socket "$TMP/keys_small.sock" --connections "$CONNS" --in-flight $inflight --keys 1000 --duration "${DURATION}s") "
        stop "${PIDS[-1]}"
        fill keys_large 10000000
        large+="$(bench ops_per_s --socket "$TMP/keys_large.sock" --connections "$CONNS" --in-flight $inflight --keys 10000000 --duration "${DURATION}s") "
        live=$("$BIN" status --socket "$TMP/keys_large.sock" --json | python3 -c 'import json,sys; s=json.load(sys.stdin); print(sum(r["entries"] for route in s["routes"] if route["name"]=="request" for r in route["rules"]))')
        stop "${PIDS[-1]}"
        rm -f "$TMP"/keys_*.redb
      done
      echo "keys, $inflight in flight: 1k keys $(echo "$small" | median) checks/s, 10M keys $(echo "$large" | median) checks/s ($live live), ratio $(ratio "$(echo "$large" | median)" "$(echo "$small" | median)") (target: at least 0.80; runs: 1k $small; 10M $large)"
    done
    ;;
  trips)
    # One failure rule that locks an account at its 10th failure; the load
    # generator reports 10 failures per fresh account, so exactly every
    # 10th report trips a lockout and waits for its group commit.
    trips_config 3600 2000000 >"$TMP/trips.toml"
    for inflight in 1 16; do
      ops="" p99="" trip_p99="" trips=""
      for _ in $(seq "$RUNS"); do
        start trips --config "$TMP/trips.toml"
        read -r o p t n < <(bench ops_per_s,p99_us,refused_p99_us,refused --socket "$TMP/trips.sock" --connections "$CONNS" --in-flight $inflight \
          --route trips --mix report --failure-ratio 1 --repeat 10 --distribution sequential --keys 100000000 --duration "${DURATION}s")
        ops+="$o "
        p99+="$p "
        trip_p99+="$t "
        trips+="$n "
        stop "${PIDS[-1]}"
        rm -f "$TMP"/trips.redb
      done
      echo "trips, $inflight in flight: $(echo "$ops" | median) reports/s with every 10th tripping a lockout, p99 $(echo "$p99" | median) us, tripping replies p99 $(echo "$trip_p99" | median) us (target: at least 20,000/s; runs: $ops; lockouts per run: $trips)"
    done
    ;;
  startup)
    # 100,000 accounts locked (10 failures each) and 100,000 more with one
    # failure counted, then a clean stop; time a fresh daemon to readiness
    # (its first answered status request).
    trips_config 86400 1000000 >"$TMP/startup.toml"
    start startup --config "$TMP/startup.toml"
    "$BIN" bench --socket "$TMP/startup.sock" --connections 10 --in-flight 16 --route trips --mix report --failure-ratio 1 --repeat 10 \
      --distribution sequential --keys 100000 --operations 1000000 --json >/dev/null
    "$BIN" bench --socket "$TMP/startup.sock" --connections 10 --in-flight 16 --route trips --mix report --failure-ratio 1 \
      --distribution sequential --keys 100000 --key-offset 100000 --operations 100000 --json >/dev/null
    stop "${PIDS[-1]}"
    times=""
    for _ in $(seq "$RUNS"); do
      t0=$(date +%s%N)
      start startup --config "$TMP/startup.toml"
      t1=$(date +%s%N)
      locked=$("$BIN" lockouts --socket "$TMP/startup.sock" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"])')
      held=$("$BIN" status --socket "$TMP/startup.sock" --json | python3 -c 'import json,sys; s=json.load(sys.stdin); print(sum(r["entries"] for route in s["routes"] if route["name"]=="trips" for r in route["rules"]))')
      stop "${PIDS[-1]}"
      times+="$(((t1 - t0) / 1000000)) "
    done
    echo "startup: $locked lockouts and $((held - locked)) counters restored; ready in $(echo "$times" | median) ms (target: under 1000; runs: $times ms; state file $(du -h "$TMP/startup.redb" | cut -f1))"
    ;;
  *)
    echo "targets.sh: unknown section $section (latency keys trips startup)" >&2
    exit 2
    ;;
  esac
done
