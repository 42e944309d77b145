#!/usr/bin/env bash
# The decision log's cost on the request path: interleaved A/B of one
# `tollgate bench` mix against a fresh daemon with `[decision_log]` on
# (its defaults) and off (the default), RUNS times each.
#
#   cargo build --release
#   RUNS=3 bash benches/decision_log.sh --mix check-report --failure-ratio 0.1 --keys 100000 --in-flight 16
#   ROUTE=request RUNS=3 bash benches/decision_log.sh --mix check --keys 100000 --in-flight 16
#
# Prints one line per run ("on ..." / "off ..."); take the medians. After
# each "on" run it also prints how many records reached the files
# (counted by `tollgate replay`) against the requests answered: the
# difference is what the bounded queue dropped.
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
    echo "on  $(bench_fresh_daemon "$bin" "$work/on" "$(printf '[decision_log]\npath = "%s/on/decisions"' "$work")" "${ROUTE:-login}" "$duration" "$@")"
    records=$("$bin" replay "$work/on/decisions" --config "$work/on/tollgate.toml" --json 2>/dev/null \
        | sed -n 's/^  "records": \([0-9]*\),$/\1/p')
    echo "    records written: $records ($(du -sh "$work/on/decisions" | cut -f1) in $(ls "$work/on/decisions" | wc -l) files)"
    echo "off $(bench_fresh_daemon "$bin" "$work/off" '' "${ROUTE:-login}" "$duration" "$@")"
done
