#!/usr/bin/env bash
# shared.sh: shared mode's figures, the table in docs/performance.md
# ("Shared mode"). Release daemons beside a private store on this machine:
# one redis-server on a Unix socket, then a 3-master Redis Cluster on
# loopback ports. For each, RUNS times (default 3; medians reported):
#   full: login check + report, 50 connections x 1 in flight, 100,000
#         accounts, as fast as answers come, the store deciding every
#         answer (timeout_ms = 1000): logins/s, p50/p99, and the CPU time
#         the store (all its processes) and the daemon spent a login
#         (/proc, user + system); logins/s per store core = 1 / store CPU;
#   deep: the same with 16 in flight a connection (the local login
#         A/B's shape): logins/s and the daemon's CPU a login;
#   half: the same offered at half the full run's rate (--rate, paced),
#         and a daemon without [shared] at that rate and at the full
#         run's: the latency the store adds (shared minus local p50/p99),
#         and the daemon's CPU a login with and without the store (at
#         the full run's rate too).
# With one Redis, host-rule checks (the request route, 50 x 16 in
# flight, 1M keys) on the shared daemon and on the local one, which must
# be alike. Then the outages, with the shipped default timeout_ms (2): the store
# frozen (SIGSTOP) and then killed, login checks paced at OUTAGE_RATE:
# p50/p99/max of the answers. Prints key=value lines, then the table's
# rows. Needs redis-server and redis-cli.
set -euo pipefail

RUNS=${RUNS:-3}
DURATION=${DURATION:-3s}
OUTAGE_RATE=${OUTAGE_RATE:-2000}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
BIN=$ROOT/target/release/tollgate
# shellcheck source=benches/lib.sh
. "$HERE/lib.sh"

cargo build --release --quiet --manifest-path "$ROOT/Cargo.toml"
with_temp_dir tg-shared-bench

LOGIN=(--route login --mix check-report --connections 50 --keys 100000)
ticks() { local t=0 pid; for pid in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$pid/stat"))); done; echo "$t"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
us_per() { # ticks, count
  python3 -c "import os; print(round($1 / os.sysconf('SC_CLK_TCK') * 1e6 / max(1, $2), 1))"
}
# Each result line, also kept for the summary at the end.
say() { echo "$1" | tee -a "$TMP/results"; }

# One measured bench run against SOCKET: prints "logins/s p50 p99 requests
# store_ticks daemon_ticks". STORE_PIDS and the daemon pid given.
measure() { # socket, daemon pid, bench args...
  local socket=$1 daemon=$2; shift 2
  local s0 d0 out
  s0=$(ticks "${STORE_PIDS[@]}"); d0=$(ticks "$daemon")
  out=$("$BIN" bench --socket "$socket" --json --duration "$DURATION" "$@")
  echo "$(json "round(d['requests'] / 2 / d['duration_s'])" <<<"$out") $(json "d['p50_us']" <<<"$out") \
$(json "d['p99_us']" <<<"$out") $(json "d['requests']" <<<"$out") $(($(ticks "${STORE_PIDS[@]}") - s0)) $(($(ticks "$daemon") - d0))"
}

daemon_at() { # name, config
  start_serving "$BIN" "$TMP/$1" "$2"
  PIDS+=("$DAEMON_PID")
  echo "$DAEMON_PID" > "$TMP/$1/pid"
}

start_cluster() { # dir: three masters; their pids in STORE_PIDS, URLs in NODES
  local dir=$1 port i
  STORE_PIDS=(); NODES=()
  for i in 0 1 2; do
    port=$((23000 + RANDOM % 20000))
    mkdir -p "$dir/n$i"
    redis-server --port "$port" --cluster-port $((port + 1)) --bind 127.0.0.1 --cluster-enabled yes \
      --cluster-config-file "$dir/n$i/nodes.conf" --cluster-require-full-coverage no --save '' --appendonly no \
      --dir "$dir/n$i" --logfile "$dir/n$i/log" > /dev/null &
    STORE_PIDS+=($!); PIDS+=($!); NODES+=("127.0.0.1:$port")
  done
  for n in "${NODES[@]}"; do
    for _ in $(seq 100); do redis-cli -h "${n%:*}" -p "${n#*:}" PING > /dev/null 2>&1 && break; sleep 0.05; done
  done
  redis-cli --cluster create "${NODES[@]}" --cluster-replicas 0 --cluster-yes > "$dir/create.log"
  for _ in $(seq 200); do
    redis-cli -h "${NODES[0]%:*}" -p "${NODES[0]#*:}" CLUSTER INFO | grep -q cluster_state:ok && break
    sleep 0.05
  done
}

daemon_at local ""
LOCAL=$(cat "$TMP/local/pid")

for store in single cluster; do
  mkdir -p "$TMP/$store"
  if [ "$store" = single ]; then
    start_redis "$TMP/$store"
    STORE_PIDS=("$REDIS_PID"); PIDS+=("$REDIS_PID")
    where="url = \"redis+unix://$TMP/$store/r.sock\""
  else
    start_cluster "$TMP/$store"
    where="nodes = [$(printf '"redis://%s",' "${NODES[@]}" | sed 's/,$//')]"
  fi
  daemon_at "$store-d" "secret = \"$TMP/secret\"
[shared]
$where
timeout_ms = 1000
hosts = 3"
  SHARED=$(cat "$TMP/$store-d/pid")
  sock=$TMP/$store-d/t.sock
  "$BIN" bench --socket "$sock" "${LOGIN[@]}" --in-flight 1 --duration 1s > /dev/null # warm up: script loaded, slots known
  for run in $(seq "$RUNS"); do
    read -r full p50 p99 n st dt <<<"$(measure "$sock" "$SHARED" "${LOGIN[@]}" --in-flight 1)"
    p="${store}_run${run}"
    say "${p}_full_logins_per_s=$full"
    say "${p}_full_p50_us=$p50"
    say "${p}_full_p99_us=$p99"
    say "${p}_store_cpu_us_per_login=$(us_per "$st" $((n / 2)))"
    say "${p}_daemon_cpu_us_per_login=$(us_per "$dt" $((n / 2)))"
    read -r _ lp50 lp99 ln _ ldt <<<"$(measure "$TMP/local/t.sock" "$LOCAL" "${LOGIN[@]}" --in-flight 1 --rate "$full")"
    say "${p}_local_at_full_p50_us=$lp50"
    say "${p}_local_at_full_p99_us=$lp99"
    say "${p}_local_at_full_daemon_cpu_us_per_login=$(us_per "$ldt" $((ln / 2)))"
    half=$((full / 2))
    read -r _ hp50 hp99 hn _ hdt <<<"$(measure "$sock" "$SHARED" "${LOGIN[@]}" --in-flight 1 --rate "$half")"
    read -r _ lp50 lp99 ln _ ldt <<<"$(measure "$TMP/local/t.sock" "$LOCAL" "${LOGIN[@]}" --in-flight 1 --rate "$half")"
    say "${p}_half_logins_per_s=$half"
    say "${p}_half_p50_us=$hp50"
    say "${p}_half_p99_us=$hp99"
    say "${p}_local_at_half_p50_us=$lp50"
    say "${p}_local_at_half_p99_us=$lp99"
    say "${p}_half_daemon_cpu_us_per_login=$(us_per "$hdt" $((hn / 2)))"
    say "${p}_local_at_half_daemon_cpu_us_per_login=$(us_per "$ldt" $((ln / 2)))"
    # 16 in flight a connection, the local login A/B's shape: the store's
    # batches fill, and the daemon's CPU a login is what remains.
    read -r deep _ _ dn _ ddt <<<"$(measure "$sock" "$SHARED" "${LOGIN[@]}" --in-flight 16)"
    say "${p}_deep_logins_per_s=$deep"
    say "${p}_deep_daemon_cpu_us_per_login=$(us_per "$ddt" $((dn / 2)))"
  done
  if [ "$store" = single ]; then
    # Host rules only (the request route): shared mode must cost them
    # nothing; the same checks on the local daemon, interleaved.
    for run in $(seq "$RUNS"); do
      for d in "$store-d" local; do
        out=$("$BIN" bench --socket "$TMP/$d/t.sock" --json --route request --mix check --connections 50 \
          --in-flight 16 --keys 1000000 --duration "$DURATION")
        say "${store}_run${run}_request_checks_per_s_$d=$(json "round(d['requests'] / d['duration_s'])" <<<"$out")"
      done
    done
  fi
  kill "$SHARED" "${STORE_PIDS[@]}" 2>/dev/null || true
done

# The outages, with the shipped default timeout (2 ms).
mkdir -p "$TMP/outage"
start_redis "$TMP/outage"
PIDS+=("$REDIS_PID")
daemon_at outage-d "secret = \"$TMP/secret\"
[shared]
url = \"redis+unix://$TMP/outage/r.sock\"
hosts = 3"
sock=$TMP/outage-d/t.sock
"$BIN" bench --socket "$sock" --route login --mix login-check --duration 1s --rate "$OUTAGE_RATE" > /dev/null
for what in frozen killed; do
  if [ "$what" = frozen ]; then kill -STOP "$REDIS_PID"; else kill -CONT "$REDIS_PID"; kill -9 "$REDIS_PID"; fi
  out=$("$BIN" bench --socket "$sock" --json --route login --mix login-check --connections 50 --keys 100000 \
    --duration "$DURATION" --rate "$OUTAGE_RATE")
  for f in p50 p99 max; do say "store_${what}_${f}_us=$(json "d['${f}_us']" <<<"$out")"; done
done

# The summary: each figure's median over the runs, the runs in brackets.
echo
python3 - "$TMP/results" <<'PY'
import collections, re, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, value = line.strip().split("=")
    runs[re.sub(r"_run\d+", "", name)].append(float(value))
for name, values in runs.items():
    shown = " / ".join("%g" % v for v in values)
    print("%s: %g (%s)" % (name, statistics.median(values), shown))
PY
