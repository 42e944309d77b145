#!/usr/bin/env bash
# Builds tollgate with profile-guided optimisation and prints the binary's
# path (target/pgo/release/tollgate). An instrumented build serves a
# training load of its own `tollgate bench` (logins with failures, plain
# checks, and, when redis-server is installed, shared-mode logins); the
# release build is then made again from that profile, which lays the hot
# paths out together. The request path touches more code than the
# instruction cache holds, so a plain build spends about a fifth of a
# login's time on misses that this build avoids (docs/performance.md has
# the figures). Same source, same behaviour: only the code's layout and
# inlining change.
#
# Needs llvm-profdata matching rustc's LLVM: `rustup component add
# llvm-tools` (run here when missing; network once). Takes two release
# builds and about 20 s of load. PGO_SECONDS sets each load's length.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target=${CARGO_TARGET_DIR:-target}
profdata="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin/llvm-profdata"
if [ ! -x "$profdata" ]; then
    rustup component add llvm-tools >&2
fi

work=$(mktemp -d /tmp/tollgate-pgo.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

RUSTFLAGS="-Cprofile-generate=$work/raw" \
    cargo build --release --locked --bin tollgate --target-dir "$target/pgo-training" >&2
trainer="$target/pgo-training/release/tollgate"

# One load against a fresh daemon: CONFIG is TOML after the socket and
# state lines. The daemon writes its profile as it exits on SIGINT.
train() { # config, bench args...
    local config=$1 dir
    shift
    dir=$(mktemp -d "$work/run.XXXXXX")
    printf 'socket = "%s/s.sock"\nstate = "%s/state.redb"\n%s\n' "$dir" "$dir" "$config" >"$dir/tollgate.toml"
    "$trainer" serve --config "$dir/tollgate.toml" >"$dir/log" 2>&1 &
    local pid=$!
    pids+=("$pid")
    for _ in $(seq 200); do [ -S "$dir/s.sock" ] && break; sleep 0.05; done
    "$trainer" bench --socket "$dir/s.sock" --duration "${PGO_SECONDS:-5}s" --keys 100000 --in-flight 16 "$@" >&2
    kill -INT "$pid"
    wait "$pid" || { cat "$dir/log" >&2; exit 1; }
}

train "" --route login --mix check-report
train "" --route request --mix check
if command -v redis-server >/dev/null; then
    redis-server --port 0 --unixsocket "$work/r.sock" --save "" --appendonly no >/dev/null &
    pids+=("$!")
    for _ in $(seq 100); do [ -S "$work/r.sock" ] && break; sleep 0.05; done
    train "secret = \"$work/secret\"
[shared]
url = \"redis+unix://$work/r.sock\"
timeout_ms = 1000
hosts = 3" --route login --mix check-report
fi

"$profdata" merge -o "$work/merged.profdata" "$work/raw"
RUSTFLAGS="-Cprofile-use=$work/merged.profdata" \
    cargo build --release --locked --bin tollgate --target-dir "$target/pgo" >&2
echo "$target/pgo/release/tollgate"
