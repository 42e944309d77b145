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

# shellcheck source=benches/lib.sh
. "$here/benches/lib.sh"

for _ in $(seq "$runs"); do
    echo "on  $(bench_fresh_daemon "$bin" "$work/on" '' login "$duration" "$@")"
    echo "off $(bench_fresh_daemon "$bin" "$work/off" $'[signals]\nenabled = false' login "$duration" "$@")"
done
