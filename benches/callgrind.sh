#!/usr/bin/env bash
# callgrind.sh: the daemon's instructions per request, repeatable where
# timings are not. Runs the daemon under valgrind's callgrind with
# instrumentation off, prefills KEYS live keys, then counts only while
# OPS operations of `tollgate bench` run (CONNS connections x 16 in
# flight; ROUTE and MIX as its --route and --mix, default `request` and
# `check`), and prints the total per request and the costliest functions.
#
#   bash benches/callgrind.sh                 # 100k keys, 200k checks
#   KEYS=1000 OPS=100000 bash benches/callgrind.sh
#   ROUTE=login MIX=check-report bash benches/callgrind.sh   # logins
#
# BIN: a built binary to measure instead of building this tree's release
# (e.g. the profile-guided one, scripts/build-pgo.sh). CACHE=1 simulates
# the caches too and prints the instruction-cache misses per request.
# CONFIG: a configuration file for the daemon (e.g. `[signals]` off).
#
# Needs valgrind (Debian: apt-get install valgrind); installs nothing.
set -euo pipefail

KEYS=${KEYS:-100000}
OPS=${OPS:-200000}
CONNS=${CONNS:-4}
ROUTE=${ROUTE:-request}
MIX=${MIX:-check}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
for bin in valgrind callgrind_control callgrind_annotate; do
  command -v "$bin" >/dev/null 2>&1 || {
    echo "callgrind.sh: $bin not found; install it with: apt-get install valgrind" >&2
    exit 2
  }
done

if [ -z "${BIN:-}" ]; then
  cargo build --release --quiet --manifest-path "$ROOT/Cargo.toml"
  BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/tollgate
fi
CACHE_SIM=()
[ -n "${CACHE:-}" ] && CACHE_SIM=(--cache-sim=yes)
TMP=$(mktemp -d /tmp/tollgate-callgrind.XXXXXX)
VG=""
cleanup() {
  [ -n "$VG" ] && { kill "$VG" 2>/dev/null || true; wait "$VG" 2>/dev/null || true; }
  [ -n "${KEEP:-}" ] && cp "$TMP/out" "$KEEP"; rm -rf "$TMP"
}
# cleanup runs once, on exit; a signal exits (bash would otherwise run the
# handler and carry on with the next command)
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

valgrind --tool=callgrind "${CACHE_SIM[@]}" --instr-atstart=no --callgrind-out-file="$TMP/out" \
  "$BIN" serve --socket "$TMP/t.sock" --state "$TMP/s.redb" --config "${CONFIG:-/dev/null}" >"$TMP/log" 2>&1 &
VG=$!
for _ in $(seq 300); do "$BIN" status --socket "$TMP/t.sock" >/dev/null 2>&1 && break; sleep 0.1; done
LOAD=(--socket "$TMP/t.sock" --route "$ROUTE" --mix "$MIX" --connections "$CONNS" --in-flight 16 --keys "$KEYS")
"$BIN" bench "${LOAD[@]}" --prefill --operations 0 --json >/dev/null
callgrind_control -i on "$VG" >/dev/null 2>&1
"$BIN" bench "${LOAD[@]}" --operations "$OPS" --json >"$TMP/bench.json"
callgrind_control -i off "$VG" >/dev/null 2>&1
kill "$VG"
wait "$VG" 2>/dev/null || true
VG=""
# The totals line: Ir first; with the cache simulation I1mr fourth.
totals=$(callgrind_annotate "$TMP/out" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", ""); print $1, (NF > 4 ? $7 : "") }')
python3 - "$TMP/bench.json" $totals <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); total = int(sys.argv[2])
print(f"{r['requests']} requests ({r['refused']} refused), {total:,} daemon instructions: {total / r['requests']:,.0f} per request")
if len(sys.argv) > 3:
    print(f"instruction-cache misses: {int(sys.argv[3]) / r['requests']:,.0f} per request")
PY
echo "costliest functions, inclusive:"
callgrind_annotate --inclusive=yes "$TMP/out" 2>/dev/null | grep -E '^ *[0-9,]+ \(' | sed -n 2,25p | cut -c1-160
