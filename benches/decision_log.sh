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

run() { # name, extra config, bench args...
    local dir=$work/$1
    rm -rf "$dir" && mkdir -p "$dir"
    printf 'socket = "%s/s.sock"\nstate = "%s/state.redb"\n%s' "$dir" "$dir" "$2" > "$dir/tollgate.toml"
    "$bin" serve --config "$dir/tollgate.toml" > "$dir/log" 2>&1 &
    local pid=$!
    for _ in $(seq 100); do [ -S "$dir/s.sock" ] && break; sleep 0.05; done
    # (2>/dev/null: `head` closing the pipe makes bench complain on exit.)
    "$bin" bench --socket "$dir/s.sock" --route "${ROUTE:-login}" --duration "$duration" "${@:3}" 2>/dev/null | head -1
    kill "$pid" && wait "$pid" 2>/dev/null || true
}

for _ in $(seq "$runs"); do
    echo "on  $(run on "$(printf '[decision_log]\npath = "%s/on/decisions"\n' "$work")" "$@")"
    records=$("$bin" replay "$work/on/decisions" --config "$work/on/tollgate.toml" --json 2>/dev/null \
        | sed -n 's/^  "records": \([0-9]*\),$/\1/p')
    echo "    records written: $records ($(du -sh "$work/on/decisions" | cut -f1) in $(ls "$work/on/decisions" | wc -l) files)"
    echo "off $(run off '' "$@")"
done
