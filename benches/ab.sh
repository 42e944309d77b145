#!/usr/bin/env bash
# Two builds of tollgate against each other: interleaved runs of one
# `tollgate bench` mix, each against a fresh daemon of its own build with
# the same configuration, RUNS times each. What a change costs on the
# request path, when the change has no switch to turn it off (the
# operator's view is always on).
#
#   git worktree add /tmp/base <base commit> && (cd /tmp/base && cargo build --release)
#   cargo build --release
#   A=/tmp/base/target/release/tollgate B=target/release/tollgate RUNS=3 \
#       bash benches/ab.sh --mix check-report --keys 100000 --in-flight 16
#
# CONFIG (optional) is TOML appended to each daemon's configuration.
# Prints one line per run ("A ..." / "B ...") with the daemon's CPU time
# per request; take the medians. Bench
# options after the script's name go to `tollgate bench` as they are; the
# route is `login` unless ROUTE says otherwise.
set -euo pipefail
: "${A:?the base build's binary}" "${B:?the changed build's binary}"
runs=${RUNS:-3}
duration=${DURATION:-3s}
route=${ROUTE:-login}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run() { # binary, name, bench options...
    local bin=$1 dir=$work/$2
    rm -rf "$dir" && mkdir -p "$dir"
    printf 'socket = "%s/s.sock"\nstate = "%s/state.redb"\n%s\n' "$dir" "$dir" "${CONFIG:-}" > "$dir/tollgate.toml"
    "$bin" serve --config "$dir/tollgate.toml" > "$dir/log" 2>&1 &
    local pid=$!
    for _ in $(seq 100); do [ -S "$dir/s.sock" ] && break; sleep 0.05; done
    # Each build's own load generator: it speaks its daemon's newest
    # protocol version (the load generator's code is otherwise the same).
    local line
    line=$("$bin" bench --socket "$dir/s.sock" --route "$route" --duration "$duration" "${@:3}" | sed -n 1p)
    # The daemon's CPU time (all its threads) per request answered: less
    # at the mercy of a busy machine than throughput is.
    local ticks requests
    ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    requests=$(echo "$line" | sed -n 's/.*(\([0-9]*\) requests.*/\1/p')
    echo "$line  daemon CPU $(awk -v t="$ticks" -v r="$requests" -v hz="$(getconf CLK_TCK)" \
        'BEGIN { printf "%.2f", t / hz * 1e6 / r }') us/request"
    kill "$pid" && wait "$pid" 2>/dev/null || true
}

for _ in $(seq "$runs"); do
    echo "A $(run "$A" a "$@")"
    echo "B $(run "$B" b "$@")"
done
