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
# STORE=1 runs both in shared mode: each run's daemon on a fresh
# redis-server of its own (needs redis-server), with shared.sh's patient
# [shared] lines (timeout_ms = 1000: the store decides every answer).
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

one_run() { # bin, dir, bench args...
    local bin=$1 dir=$2
    shift 2
    if [ -z "${STORE:-}" ]; then
        bench_fresh_daemon "$bin" "$dir" "${CONFIG:-}" "$route" "$duration" "$@"
        return
    fi
    rm -rf "$work/store" && mkdir -p "$work/store"
    start_redis "$work/store"
    bench_fresh_daemon "$bin" "$dir" "secret = \"$work/secret\"
${CONFIG:-}
[shared]
url = \"redis+unix://$work/store/r.sock\"
timeout_ms = 1000
hosts = 3" "$route" "$duration" "$@"
    kill "$REDIS_PID" && wait "$REDIS_PID" 2>/dev/null || true
}

for _ in $(seq "$runs"); do
    echo "A $(one_run "$A" "$work/a" "$@")"
    echo "B $(one_run "$B" "$work/b" "$@")"
done
