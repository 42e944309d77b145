#!/usr/bin/env bash
# Spray detection's cost: interleaved A/B of one `tollgate bench` mix against
# a fresh daemon with `[signals]` on (the default) and off, RUNS times each.
#
#   cargo build --release
#   RUNS=3 bash benches/spray.sh --mix report --failure-ratio 0.1 --keys 100000 --in-flight 16
#
# Prints one line per run ("on ..." / "off ..."); take the medians.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${TOLLGATE_BIN:-$here/target/release/tollgate}
runs=${RUNS:-3}
duration=${DURATION:-3s}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run() { # name, extra config
    local dir=$work/$1
    rm -rf "$dir" && mkdir -p "$dir"
    printf 'socket = "%s/s.sock"\nstate = "%s/state.redb"\n%s' "$dir" "$dir" "$2" > "$dir/tollgate.toml"
    "$bin" serve --config "$dir/tollgate.toml" > "$dir/log" 2>&1 &
    local pid=$!
    for _ in $(seq 100); do [ -S "$dir/s.sock" ] && break; sleep 0.05; done
    "$bin" bench --socket "$dir/s.sock" --route login --duration "$duration" "${@:3}" | head -1
    kill "$pid" && wait "$pid" 2>/dev/null || true
}

for _ in $(seq "$runs"); do
    echo "on  $(run on '' "$@")"
    echo "off $(run off $'[signals]\nenabled = false\n' "$@")"
done
