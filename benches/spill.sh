#!/usr/bin/env bash
# What a flood of distinct keys past the failure tables' caps costs, at the
# default caps: LOCKOUTS fresh (account, address) keys (default 1,000,000,
# ten times login.source_failures' cap) fail five times each through
# `tollgate bench`, then the daemon is killed with `kill -9` and started
# again on its state file, on the manual clock (so no window boundary
# passes mid-run and every lockout is still due). Prints the flood's throughput, the daemon's
# resident memory and the state file's size after it, the restart's time
# to listening and peak memory, and the overflow cells it put back. That
# no acknowledged lockout is lost is counted exactly by
# `tests/spill_soak.rs` (ignored by default), which kills floods like this
# one at random moments.
#
#   bash benches/spill.sh
#   LOCKOUTS=200000 bash benches/spill.sh
#
# TOLLGATE_BIN picks the daemon (default: this tree's release build).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$here/target}
LOCKOUTS=${LOCKOUTS:-1000000}
if [ -z "${TOLLGATE_BIN:-}" ]; then
    (cd "$here" && cargo build --release --quiet --bin tollgate)
    TOLLGATE_BIN=$target/release/tollgate
fi
dir=$(mktemp -d /tmp/tg-spill.XXXXXX)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
serve() {
    TOLLGATE_LOG=info "$TOLLGATE_BIN" serve --manual-clock --socket "$dir/s.sock" --state "$dir/state.redb" > "$dir/log" 2>&1 &
    pid=$!
}
kib() { awk -v f="$2:" '$1 == f {print $2}' "/proc/$1/status"; }

serve
for _ in $(seq 200); do [ -S "$dir/s.sock" ] && break; sleep 0.05; done
flood=$("$TOLLGATE_BIN" bench --socket "$dir/s.sock" --route login --mix report --failure-ratio 1 \
    --distribution sequential --keys "$LOCKOUTS" --connections 50 --in-flight 8 --repeat 5 --operations $((LOCKOUTS * 5)))
echo "flood: $(echo "$flood" | sed -n 1p); $(echo "$flood" | sed -n 's/^\(refused [0-9]*\).*/\1/p')"
echo "after the flood: RSS $(kib "$pid" VmRSS) KiB; state file $(stat -c %s "$dir/state.redb") bytes ($(du -k "$dir/state.redb" | cut -f1) KiB on disk)"
kill -9 "$pid"; wait "$pid" 2>/dev/null || true
rm -f "$dir/s.sock"
start=$(date +%s%N)
serve
while ! [ -S "$dir/s.sock" ]; do sleep 0.005; done
echo "restart after kill -9: listening after $(( ($(date +%s%N) - start) / 1000000 )) ms; peak RSS $(kib "$pid" VmHWM) KiB; $(grep -o 'restored=[0-9]* .*overflow_cells=[0-9]*' "$dir/log")"
