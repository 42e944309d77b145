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
# GEN=$A drives both daemons with the base build's load generator (a newer
# generator's protocol version may be one the base daemon refuses).
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

# shellcheck source=benches/lib.sh
. "$(dirname "$0")/lib.sh"

for _ in $(seq "$runs"); do
    echo "A $(bench_fresh_daemon "$A" "$work/a" "${CONFIG:-}" "$route" "$duration" "$@")"
    echo "B $(bench_fresh_daemon "$B" "$work/b" "${CONFIG:-}" "$route" "$duration" "$@")"
done
