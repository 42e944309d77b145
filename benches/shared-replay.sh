#!/usr/bin/env bash
# shared-replay.sh: what decide.lua costs Redis, with nothing else in the
# measurement, and what an edited copy would cost (issue 14).
#
#   bash benches/shared-replay.sh [VARIANT.lua ...]
#
# Captures the EVALSHA batches of `benches/shared.sh`'s login load
# (check + report, 50 connections x 1 in flight, 100,000 accounts) from a
# release daemon through `redis-cli MONITOR`, then replays them against a
# fresh Redis with src/shared/decide.lua and each VARIANT, interleaved,
# ROUNDS times (default 5): benches/shared_replay.py. Each variant is
# loaded as it is, so an edited script is measured without a rebuild.
# Prints microseconds of Redis time a batch (medians), and an op.
# CAPTURE=file reuses a capture; KEEP=file keeps this one; LOAD="bench
# arguments" captures another load (for instance failures on few keys,
# so that entries lock: LOAD="--failure-ratio 0.8 --keys 300").
# FRAMING=1 times, instead, three minimal scripts that only frame the
# batches (today's framing, one argument a batch, one reply a batch) and
# each VARIANT beside them: benches/script_framing.py.
# SAME=1 checks, instead of timing, that each VARIANT answers and stores
# what decide.lua does on the captured batches: only as wide as the
# capture (no device, unlock, merge, release, rate rule, lock-until or
# foreign value is in one); shared_replay.py's header says what else it
# cannot see.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
BIN=$ROOT/target/release/tollgate
# shellcheck source=benches/lib.sh
. "$HERE/lib.sh"
with_temp_dir tg-replay-capture

capture=${CAPTURE:-}
if [ -z "$capture" ]; then
  cargo build --release --quiet --manifest-path "$ROOT/Cargo.toml"
  start_store_and_daemon "$BIN" "$TMP" "$TMP/secret"
  redis-cli -s "$TMP/r.sock" MONITOR > "$TMP/monitor.txt" &
  monitor=$!
  sleep 0.3
  # shellcheck disable=SC2086 # LOAD is a list of arguments
  "$BIN" bench --socket "$TMP/t.sock" --route login --mix check-report --connections 50 --in-flight 1 \
    --duration 2s ${LOAD:---keys 100000} > /dev/null
  kill "$monitor" 2>/dev/null || true
  wait "$monitor" 2>/dev/null || true
  capture=$TMP/monitor.txt
  if [ -n "${KEEP:-}" ]; then cp "$capture" "$KEEP"; fi
fi
if [ -n "${FRAMING:-}" ]; then
  # The framing alone: benches/script_framing.py.
  python3 "$HERE/script_framing.py" "$capture" "$@"
else
  python3 "$HERE/shared_replay.py" "$capture" "$ROOT/src/shared/decide.lua" "$@"
fi
